"""The grammars of tool calls and thinking (rapidmoe_gguf.tool_grammar): what the models' real
templates write (llama.cpp's copies, models/templates) is what the grammars accept, in a
vocabulary where the markers are text, user-defined tokens or control tokens; malformed calls are
refused; and a model made to reply under them gives calls that parse and match their schemas, in
every format, forced and under tool_choice auto, after thinking, and gpt-oss's JSON replies."""

from __future__ import annotations

import json
import re

import pytest

import rapidmoe_gguf as rm
from rapidmoe_gguf import chat, grammar, tool_calls as tc, tool_grammar as tg
from rapidmoe_gguf.bundled import bundled_model_path
from rapidmoe_gguf.tokenizer import Tokenizer

from test_tool_calls import CALLS, TEMPLATES, TOOLS, _model_side, _templates

ll = pytest.importorskip("llguidance")
jsonschema = pytest.importorskip("jsonschema")

# The formats' fixed strings: each made one token of the vocabulary (in place of its last tokens)
MARKERS = ["<tool_call>", "</tool_call>", "<think>", "</think>", "<minimax:tool_call>", "</minimax:tool_call>",
           "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>",
           "<｜tool▁sep｜>", "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>",
           "<|tool_call_argument_begin|>", "<|tool_call_end|>", "<|tool_call>", "<tool_call|>", '<|"|>',
           "<｜DSML｜function_calls>", "</｜DSML｜function_calls>", "<｜DSML｜tool_calls>", "</｜DSML｜tool_calls>"]
HARMONY = ["<|channel|>", "<|message|>", "<|end|>", "<|start|>", "<|constrain|>", "<|call|>", "<|return|>"]
USER_DEFINED, CONTROL = 4, 3
VOCABS = ("text", "user-defined", "control")


def _bundled_kv() -> dict:
    import gguf

    r = gguf.GGUFReader(bundled_model_path())
    return {k: f.contents() for k, f in r.fields.items() if k.startswith("tokenizer.")}


def _marker_kv(kind: str, markers=MARKERS + HARMONY) -> dict:
    """The bundled model's tokenizer keys with ``markers`` as tokens of ``kind`` (their last
    tokens replaced, and the merges that made those dropped); "text": unchanged. (A vocabulary
    with HARMONY's tokens is read as gpt-oss's: chat.is_harmony.)"""
    kv = _bundled_kv()
    if kind == "text":
        return kv
    tokens, types = list(kv["tokenizer.ggml.tokens"]), list(kv["tokenizer.ggml.token_type"])
    gone = set()
    for j, marker in enumerate(markers):
        i = len(tokens) - 1 - j
        gone.add(tokens[i])
        tokens[i], types[i] = marker, CONTROL if kind == "control" else USER_DEFINED
    merges = [m for m in kv["tokenizer.ggml.merges"] if m.replace(" ", "") not in gone]
    return {**kv, "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types,
            "tokenizer.ggml.merges": merges}


_TOKENIZERS: dict[str, Tokenizer] = {}


def _tokenizer(kind: str) -> Tokenizer:
    if kind not in _TOKENIZERS:
        _TOKENIZERS[kind] = Tokenizer.from_gguf_metadata(_marker_kv(kind))
    return _TOKENIZERS[kind]


def _accepts(tokenizer, lark: str, text: str) -> bool:
    """Whether the grammar takes ``text`` (tokenized as the model would write it) as a whole reply."""
    g = grammar.Grammar(tokenizer, where="test", lark=lark)
    m = ll.LLMatcher(g.tokenizer, g.grammar, log_level=0)
    for t in tokenizer.encode(text, add_special=False, parse_special=True):
        if not m.consume_token(t):
            return False
    return m.is_accepting()


def _written(fmt: str, name: str, calls) -> tuple[tc.ToolUse, str]:
    """The request's tools, and the calls as the template writes them in an assistant turn."""
    template = (_templates() / name).read_text(encoding="utf-8")
    messages = [{"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": f"call_{i}", "type": "function", "function": {"name": n, "arguments": json.dumps(a)}}
                    for i, (n, a) in enumerate(calls)]}]
    use = tc.tool_use(template, TOOLS)
    return use, _model_side(fmt, chat.render_chat(template, messages, tools=use, bos_token="<s>", eos_token="</s>"))


CASES = [(fmt, names[0]) for fmt, names in TEMPLATES.items()] + \
        [("glm-4.5", "GLM-4.7-Flash.jinja"), ("qwen3-coder", "Qwen3.5-4B.jinja")]


@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("fmt, name", CASES)
def test_tool_grammar_accepts_what_the_template_writes(fmt, name, vocab):
    """The calls a real template writes (two, one for gpt-oss, whose template writes a turn's
    first call only) are a reply the grammar takes: forced, and under auto after some text; a
    single call also with parallel_tool_calls false, and two calls not then (but for a marker
    of text under auto: the text after the call is free, and the reader gives calls beyond the
    first back as text)."""
    tok = _tokenizer(vocab)
    calls = CALLS[:1] if fmt == "harmony" else CALLS
    use, text = _written(fmt, name, calls)
    _, one = _written(fmt, name, CALLS[:1])
    pieces = tg.Pieces(tok)
    for choice in ("required", "auto"):
        for parallel in (True, False):
            lark = tg.tool_call_lark(tc.ToolUse(use.tools, choice, parallel, use.format), pieces, grammar.JSON_FORM)
            if lark is None:          # free under auto: the generic and harmony formats
                assert choice == "auto" and fmt in ("generic", "harmony")
                continue
            lead = "" if choice == "required" else "Let me look that up. "
            assert _accepts(tok, lark, lead + one), (choice, parallel, lark)
            if len(calls) > 1:     # under auto, text after a call is free; where the marker is text, it may hold one
                as_text = choice == "auto" and pieces.token(use.format.starts[0]) is None and \
                    fmt in ("hermes", "qwen3-coder", "glm-4.5", "gemma4")    # a block a call (not one for all)
                assert _accepts(tok, lark, lead + text) == (parallel or as_text), (choice, parallel)
            if choice == "required":
                assert not _accepts(tok, lark, "It is sunny."), "a forced call is not optional"
                assert not _accepts(tok, lark, ""), "a forced call is not optional"
            else:
                assert _accepts(tok, lark, "It is sunny.")


# A call of each kind of fault, per format (the calls of get_weather, whose city is a required string)
BAD = {
    "hermes": ['<tool_call>\n{"name": "get_wether", "arguments": {"city": "Paris"}}\n</tool_call>',
               '<tool_call>\n{"name": "get_weather", "arguments": {"days": 2}}\n</tool_call>',
               '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": "two"}}\n</tool_call>'],
    "qwen3-coder": ["<tool_call>\n<function=get_wether>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>",
                    "<tool_call>\n<function=get_weather>\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>",
                    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n"
                    "two\n</parameter>\n</function>\n</tool_call>"],
    "glm-4.5": ["<tool_call>get_wether<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>",
                "<tool_call>get_weather<arg_key>days</arg_key><arg_value>2</arg_value></tool_call>",
                "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value><arg_key>days</arg_key>"
                "<arg_value>two</arg_value></tool_call>"],
    "deepseek-v3.2": ['<｜DSML｜function_calls>\n<｜DSML｜invoke name="get_wether">\n<｜DSML｜parameter name="city" '
                      'string="true">Paris</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>',
                      '<｜DSML｜function_calls>\n<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="days" '
                      'string="false">2</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>',
                      '<｜DSML｜function_calls>\n<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" '
                      'string="true">Paris</｜DSML｜parameter>\n<｜DSML｜parameter name="days" string="false">two'
                      "</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>"],
    "deepseek-v4": ['<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" '
                    'string="false">"Paris"</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>',
                    '<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" '
                    'string="true">Paris</｜DSML｜parameter>\n<｜DSML｜parameter name="days" string="true">2'
                    "</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>"],
    "deepseek": ['<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_wether<｜tool▁sep｜>{"city": "Paris"}'
                 "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
                 '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"days": 2}'
                 "<｜tool▁call▁end｜><｜tool▁calls▁end｜>"],
    "kimi-k2": ["<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
                '{"city": 3}<|tool_call_end|><|tool_calls_section_end|>'],
    "harmony": ['<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"town": "Paris"}<|call|>'],
}


@pytest.mark.parametrize("vocab", ("text", "control"))
@pytest.mark.parametrize("fmt", BAD)
def test_tool_grammar_refuses_malformed_calls(fmt, vocab):
    """A call of a tool not offered, without a required argument or with one of the wrong type
    is no reply the grammar takes, forced or under auto (after text)."""
    tok = _tokenizer(vocab)
    use = tc.ToolUse(tc.check_tools(TOOLS), "required", True, tc.FORMATS[fmt])
    for choice in ("required", "auto"):
        lark = tg.tool_call_lark(dataclass_replace(use, choice=choice), tg.Pieces(tok), grammar.JSON_FORM)
        if lark is None:
            continue
        for text in BAD[fmt]:
            assert not _accepts(tok, lark, ("" if choice == "required" else "Sure. ") + text), (choice, text)


def dataclass_replace(use, **kw):
    import dataclasses

    return dataclasses.replace(use, **kw)


@pytest.mark.parametrize("vocab", VOCABS)
def test_tool_grammar_thinking_comes_first(vocab):
    """A forced call may follow a <think> block (or the rest of one the prompt opened), and a JSON
    reply likewise; without thinking in the template, no <think> is taken."""
    tok = _tokenizer(vocab)
    pieces = tg.Pieces(tok)
    use = tc.ToolUse(tc.check_tools(TOOLS), "required", False, tc.HERMES)
    call = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    reply = '{"a": 1}'
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    for thinking, texts in ((False, ["<think>\nAdd them.\n</think>\n\n", ""]), (True, ["Add them.\n</think>\n\n"]),
                            (None, [""])):
        lark = tg.tool_call_lark(use, pieces, grammar.JSON_FORM, thinking)
        json_lark = tg.json_reply_lark(schema, pieces, grammar.JSON_FORM, thinking, False)
        for text in texts:
            assert _accepts(tok, lark, text + call), (thinking, text)
            assert _accepts(tok, json_lark, text + reply), (thinking, text)
        if thinking is None:
            assert not _accepts(tok, lark, "<think>\nAdd them.\n</think>\n\n" + call)
        if thinking:
            assert not _accepts(tok, lark, call), "the opened block is closed first"
        assert not _accepts(tok, json_lark, ("<think>x</think>" if thinking is False else "") + "x" + reply)


def test_tool_grammar_harmony_json_reply():
    tok = _tokenizer("control")
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    lark = tg.json_reply_lark(schema, tg.Pieces(tok), grammar.JSON_FORM, None, True)
    assert _accepts(tok, lark, '<|channel|>final<|message|>{"a": 1}')
    assert _accepts(tok, lark, '<|channel|>analysis<|message|>Think.<|end|><|start|>assistant'
                               '<|channel|>final<|message|>{"a": 1}')
    assert not _accepts(tok, lark, '<|channel|>final<|message|>{"b": 1}')
    assert not _accepts(tok, lark, '{"a": 1}')


# ---------------------------------------------------------------------------------------------
# A model replying under them: the bundled model's weights, a template of each format, the
# markers as tokens of its vocabulary
# ---------------------------------------------------------------------------------------------

def _model(tmp_path, name: str, vocab: str = "control") -> rm.Model:
    from conftest import write_gguf_like

    markers = MARKERS + HARMONY if name == TEMPLATES["harmony"][0] else MARKERS
    kv = {**_marker_kv(vocab, markers), "tokenizer.chat_template": (_templates() / name).read_text(encoding="utf-8")}
    path = tmp_path / f"{name}.gguf"
    write_gguf_like(bundled_model_path(), path, kv=kv)
    return rm.Model(str(path), n_ctx=1024, n_threads=2)


# Every value bounded, so that a tiny model's call ends within max_tokens
BOUNDED = [
    {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
                                      "parameters": {"type": "object", "properties": {
                                          "city": {"type": "string", "maxLength": 12},
                                          "unit": {"enum": ["C", "F"]},
                                          "days": {"type": "integer", "minimum": 0, "maximum": 9}},
                                          "required": ["city"]}}},
    {"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {
        "a": {"type": "integer", "minimum": 0, "maximum": 99}, "b": {"type": "integer", "minimum": 0, "maximum": 99}},
        "required": ["a", "b"]}}},
]
PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in BOUNDED}


def _check_calls(message: dict, names: set[str], most: int | None = None) -> list[dict]:
    calls = message.get("tool_calls") or []
    assert calls and (most is None or len(calls) <= most), message
    for c in calls:
        assert c["function"]["name"] in names
        jsonschema.validate(json.loads(c["function"]["arguments"]), {**PARAMS[c["function"]["name"]]})
    return calls


@pytest.mark.parametrize("fmt, name", [(f, n[0]) for f, n in TEMPLATES.items()] + [("qwen3-coder", "Qwen3.5-4B.jinja")])
def test_tool_grammar_model_forced_calls_parse(tmp_path, fmt, name):
    """tool_choice required and named: the reply holds calls of the offered tools that parse and
    match their schemas (one with parallel_tool_calls false), greedy and sampled, streamed alike."""
    with _model(tmp_path, name) as m:
        assert tc.detect(m.tokenizer.chat_template).name == fmt
        ask = [{"role": "user", "content": "Weather in Paris?"}]
        # this model would think on to max_tokens where the template lets it think: its close pushed
        push = {str(tg.Pieces(m.tokenizer).token("</think>")): 100}
        for choice, names in (("required", {"get_weather", "add"}),
                              ({"type": "function", "function": {"name": "add"}}, {"add"})):
            for sampling in ({"temperature": 0}, {"temperature": 1.0, "seed": 3}):
                kw = dict(max_tokens=160, tools=BOUNDED, tool_choice=choice, parallel_tool_calls=False,
                          logit_bias=push, **sampling)
                r = m.create_chat_completion(ask, **kw)["choices"][0]
                assert r["finish_reason"] == "tool_calls", r
                calls = _check_calls(r["message"], names, most=1)
                chunks = list(m.create_chat_completion(ask, stream=True, **kw))
                streamed = [d for c in chunks for d in c["choices"][0]["delta"].get("tool_calls") or []]
                assert [d["function"]["name"] for d in streamed if d.get("id")] == [c["function"]["name"] for c in calls]
                assert "".join(d["function"].get("arguments") or "" for d in streamed) == calls[0]["function"]["arguments"]


@pytest.mark.parametrize("fmt, name", [(f, n[0]) for f, n in TEMPLATES.items() if f not in ("generic", "harmony")])
def test_tool_grammar_model_auto_calls_stay_well_formed(tmp_path, fmt, name):
    """tool_choice auto, with the format's opening marker pushed (logit_bias +100 on its token):
    the model opens a call at once and the grammar keeps it well formed: one call (parallel
    calls off, so the marker cannot open a second) that parses and matches its schema. Without
    the grammar (tool_choice none, the same bias) the reply is the marker over and over. (This
    model writes no end-of-turn after a call, as a trained one does: its reply goes on as text to
    max_tokens.)"""
    with _model(tmp_path, name) as m:
        start = tc.FORMATS[fmt].starts[0]
        tid = tg.Pieces(m.tokenizer).token(start)
        ask = [{"role": "user", "content": "Weather in Paris?"}]
        # reasoning_format none: MiniMax-M2's template opens a <think> block, which this model never closes
        kw = dict(max_tokens=200, tools=BOUNDED, logit_bias={str(tid): 100}, temperature=0, reasoning_format="none")
        r = m.create_chat_completion(ask, tool_choice="auto", parallel_tool_calls=False, **kw)["choices"][0]
        _check_calls(r["message"], {"get_weather", "add"}, most=1)     # then text (the marker no longer allowed)
        assert start not in (r["message"]["content"] or "")
        free = m.create_chat_completion(ask, tool_choice="none", **kw)["choices"][0]
        assert free["message"]["content"].count(start) > 1 and not free["message"].get("tool_calls")


def test_tool_grammar_model_thinks_then_calls(tmp_path):
    """Qwen3.5's template opens a <think> block for the reply: a forced call comes after the
    reply closes it, and the thinking is not the message's content."""
    with _model(tmp_path, "Qwen3.5-4B.jinja", "user-defined") as m:
        ask = [{"role": "user", "content": "Weather in Paris?"}]
        prompt = chat.chat_prompt(m, ask, tools=tc.tool_use(m.tokenizer.chat_template, BOUNDED))
        assert chat.thinking_mode(m.tokenizer, prompt) is True
        # this model would think on to max_tokens: the close of thinking pushed
        r = m.create_chat_completion(ask, max_tokens=200, tools=BOUNDED, tool_choice="required", temperature=0,
                                     parallel_tool_calls=False,
                                     logit_bias={str(tg.Pieces(m.tokenizer).token("</think>")): 100})["choices"][0]
        assert r["finish_reason"] == "tool_calls", r
        _check_calls(r["message"], {"get_weather", "add"})
        assert "</think>" not in (r["message"]["content"] or "")


def test_tool_grammar_model_harmony_json_and_calls(tmp_path):
    """gpt-oss's format: response_format gives the final channel's JSON as the content, and a
    forced call comes as tool_calls."""
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                               "days": {"type": "integer", "minimum": 0, "maximum": 9}},
              "required": ["city", "days"], "additionalProperties": False}
    with _model(tmp_path, TEMPLATES["harmony"][0]) as m:
        assert chat.is_harmony(m.tokenizer)
        ask = [{"role": "user", "content": "Weather in Paris?"}]
        # this model's analysis would go on to max_tokens: the other channels' names pushed
        push = {str(m.tokenizer.encode(w, add_special=False)[0]): 100 for w in ("final", "commentary")}
        for sampling in ({"temperature": 0}, {"temperature": 1.0, "seed": 5}):
            r = m.create_chat_completion(ask, max_tokens=200, logit_bias=push, response_format={
                "type": "json_schema", "json_schema": {"name": "w", "schema": schema}}, **sampling)["choices"][0]
            jsonschema.validate(json.loads(r["message"]["content"]), schema)
            r = m.create_chat_completion(ask, max_tokens=200, tools=BOUNDED, tool_choice="required",
                                         logit_bias=push, **sampling)["choices"][0]
            assert r["finish_reason"] == "tool_calls", r
            _check_calls(r["message"], {"get_weather", "add"}, most=1)


# ---------------------------------------------------------------------------------------------
# GBNF grammars, json_schema, and completions under a grammar
# ---------------------------------------------------------------------------------------------

ANSWER = r'root ::= ("yes" | "no") ", " [0-9] [0-9]? " items"'


def test_tool_grammar_gbnf_and_completions(tmp_path):
    from test_server import running

    openai = pytest.importorskip("openai")
    rule = re.compile(r"(yes|no), [0-9][0-9]? items")
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}},
              "required": ["n"], "additionalProperties": False}
    with rm.Model(bundled_model_path(), n_ctx=512, n_threads=2) as m:
        for sampling in ({"temperature": 0}, {"temperature": 1.0, "seed": 2}):
            text = m.create_completion("Answer:", max_tokens=16, grammar=ANSWER, **sampling)["choices"][0]["text"]
            assert rule.fullmatch(text), text
            text = m.create_chat_completion([{"role": "user", "content": "Well?"}], max_tokens=16, grammar=ANSWER,
                                            **sampling)["choices"][0]["message"]["content"]
            assert rule.fullmatch(text), text
            text = m.create_completion("JSON:", max_tokens=16, response_format={"type": "json_object", "schema": schema},
                                       **sampling)["choices"][0]["text"]
            jsonschema.validate(json.loads(text), schema)
        with pytest.raises(rm.InvalidArgumentError, match="grammar"):
            m.create_completion("x", grammar='root ::= foo')
        with running(m, parallel=2, queue=4) as (url, _):
            client = openai.OpenAI(base_url=url + "/v1", api_key="none")
            r = client.completions.create(model="tiny-moe", prompt="Answer:", max_tokens=16, extra_body={"grammar": ANSWER})
            assert rule.fullmatch(r.choices[0].text)
            r = client.chat.completions.create(model="tiny-moe", messages=[{"role": "user", "content": "Well?"}],
                                               max_tokens=16, extra_body={"grammar": ANSWER}, stream=True)
            assert rule.fullmatch("".join(c.choices[0].delta.content or "" for c in r if c.choices))
            for body in ({"json_schema": schema}, {"response_format": {"type": "json_schema",
                                                                      "json_schema": {"name": "n", "schema": schema}}}):
                r = client.completions.create(model="tiny-moe", prompt="JSON:", max_tokens=16, extra_body=body)
                jsonschema.validate(json.loads(r.choices[0].text), schema)
            for body, param in (({"grammar": "root ::= foo"}, "grammar"), ({"json_schema": {"type": "strin"}}, "json_schema"),
                                ({"grammar": ANSWER, "json_schema": schema}, "grammar")):
                with pytest.raises(openai.BadRequestError) as e:
                    client.completions.create(model="tiny-moe", prompt="x", max_tokens=4, extra_body=body)
                assert e.value.body["param"] == param, e.value.body

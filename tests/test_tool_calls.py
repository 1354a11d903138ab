"""Tool calls (rapidmoe_gguf.tool_calls): each format detected from the published templates (the
copies llama.cpp ships, read where its source is at hand), a conversation with calls rendered by
the real template and its calls read back, streamed replies that join to the whole reply's result
however they are split, malformed calls returned as text, and the server end to end with the
official openai client."""

from __future__ import annotations

import json
import random
from pathlib import Path

import httpx
import pytest

import llamacpp_oracle as llamacpp
import rapidmoe_gguf as rm
from conftest import CHAT_TEMPLATE
from rapidmoe_gguf import chat, cli, server as srv, tool_calls as tc
from rapidmoe_gguf.bundled import bundled_model_path
from test_server import running

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
                                      "parameters": {"type": "object", "properties": {
                                          "city": {"type": "string"}, "days": {"type": "integer"}},
                                          "required": ["city"]}}},
    {"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {
        "a": {"type": "number"}, "b": {"type": "number"}}}}},
]
CALLS = [("get_weather", {"city": "Paris", "days": 2}), ("add", {"a": 1.5, "b": 2})]

# format -> llama.cpp's copies of templates that show it (models/templates)
TEMPLATES = {
    "hermes": ["Qwen-Qwen3-0.6B.jinja", "Qwen-Qwen2.5-7B-Instruct.jinja",
               "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja"],
    "qwen3-coder": ["Qwen3-Coder.jinja", "Qwen3.5-4B.jinja", "StepFun3.5-Flash.jinja"],
    "glm-4.5": ["GLM-4.6.jinja", "GLM-4.7-Flash.jinja"],
    "minimax-m2": ["MiniMax-M2.jinja"],
    "deepseek-v3.2": ["deepseek-ai-DeepSeek-V3.2.jinja"],
    "deepseek-v4": ["deepseek-ai-DeepSeek-V4.jinja", "deepseek-ai-DeepSeek-V4-Flash-0731.jinja"],
    "deepseek": ["deepseek-ai-DeepSeek-V3.1.jinja", "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja"],
    "kimi-k2": ["moonshotai-Kimi-K2.jinja"],
    "harmony": ["openai-gpt-oss-120b.jinja"],
    "gemma4": ["google-gemma-4-31B-it.jinja", "google-gemma-4-31B-it-interleaved.jinja"],
    "generic": ["meta-llama-Llama-3.1-8B-Instruct.jinja", "mistralai-Mistral-Nemo-Instruct-2407.jinja"],
}
CASES = [(fmt, name) for fmt, names in TEMPLATES.items() for name in names]

# A reply in each format: some text, then the two calls of CALLS.
REPLIES = {
    "hermes": 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n'
              '</tool_call>\n<tool_call>\n{"name": "add", "arguments": "{\\"a\\": 1.5, \\"b\\": 2}"}\n</tool_call>',
    "qwen3-coder": "Let me check.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
                   "<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=add>\n"
                   "<parameter=a>\n1.5\n</parameter>\n<parameter=b>\n2\n</parameter>\n</function>\n</tool_call>",
    "glm-4.5": "Let me check.<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
               "<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n</tool_call><tool_call>add<arg_key>a</arg_key>"
               "<arg_value>1.5</arg_value><arg_key>b</arg_key><arg_value>2</arg_value></tool_call>",
    "minimax-m2": 'Let me check.\n<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">Paris'
                  '</parameter>\n<parameter name="days">2</parameter>\n</invoke>\n<invoke name="add">\n'
                  '<parameter name="a">1.5</parameter>\n<parameter name="b">2</parameter>\n</invoke>\n'
                  "</minimax:tool_call>",
    "deepseek-v3.2": 'Let me check.\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name="get_weather">\n'
                     '<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n'
                     '<｜DSML｜parameter name="days" string="false">2</｜DSML｜parameter>\n</｜DSML｜invoke>\n'
                     '<｜DSML｜invoke name="add">\n<｜DSML｜parameter name="a" string="false">1.5</｜DSML｜parameter>\n'
                     '<｜DSML｜parameter name="b" string="false">2</｜DSML｜parameter>\n</｜DSML｜invoke>\n'
                     "</｜DSML｜function_calls>",
    "deepseek-v4": 'Let me check.<｜DSML｜tool_calls><｜DSML｜invoke name="get_weather">'
                   '<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter> '
                   '<｜DSML｜parameter name="days" string="false"> 2 </｜DSML｜parameter></｜DSML｜invoke>\n'
                   '<｜DSML｜invoke name="add">\n<｜DSML｜parameter name="a" string="false">1.5</｜DSML｜parameter>\n'
                   '<｜DSML｜parameter name="b" string="false">2</｜DSML｜parameter>\n\n</｜DSML｜invoke>\n'
                   "</｜DSML｜tool_calls>\n",
    "deepseek": "Let me check.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>"
                '{"city": "Paris", "days": 2}<｜tool▁call▁end｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>add\n'
                '```json\n{"a": 1.5, "b": 2}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
    "kimi-k2": "Let me check.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
               '<|tool_call_argument_begin|>{"city": "Paris", "days": 2}<|tool_call_end|><|tool_call_begin|>'
               'functions.add:1<|tool_call_argument_begin|>{"a": 1.5, "b": 2}<|tool_call_end|>'
               "<|tool_calls_section_end|>",
    "harmony": "<|channel|>analysis<|message|>Two calls.<|end|><|start|>assistant<|channel|>final<|message|>"
               "Let me check.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather "
               '<|constrain|>json<|message|>{"city": "Paris", "days": 2}<|call|><|start|>assistant to=functions.add'
               '<|channel|>commentary json<|message|>{"a": 1.5, "b": 2}<|call|>',
    "gemma4": 'Let me check.<|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:2}<tool_call|>'
              '<|tool_call>call:add{a:1.5,b:2}<tool_call|>',
    "generic": ' ```json\n{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}, '
               '{"name": "add", "arguments": {"a": 1.5, "b": 2}}]}\n```\n',
}
CONTENT = {fmt: None if fmt == "generic" else "Let me check." for fmt in REPLIES}

# Replies that look like calls but are not well formed (or call a tool not offered): all text.
MALFORMED = {
    "hermes": ['<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"\n</tool_call>',
               '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>',
               'I will use <tool_call> now: {"name": "add"'],
    "qwen3-coder": ["<tool_call>\n<function=add>\n<parameter=a>\n1\n</function>\n</tool_call>",
                    "<tool_call>\n<function=add>\nstray text<parameter=a>\n1\n</parameter>\n</function>\n</tool_call>"],
    "glm-4.5": ["<tool_call>add<arg_key>a</arg_key>1</tool_call>", "<tool_call>two words<arg_key>a</arg_key>"
                "<arg_value>1</arg_value></tool_call>"],
    "minimax-m2": ['<minimax:tool_call>\n<invoke name="add">\n<parameter name="a">1</invoke>\n</minimax:tool_call>'],
    "deepseek-v3.2": [
        '<｜DSML｜function_calls>\n<｜DSML｜invoke name="add">\n<｜DSML｜parameter name="a" string="false">1.5'
        "</｜DSML｜invoke>\n</｜DSML｜function_calls>",                                    # a parameter not closed
        '<｜DSML｜function_calls>\n<｜DSML｜invoke name="add">\n<｜DSML｜parameter name="a" string="false">one'
        "</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>",                # string="false", not JSON
        '<｜DSML｜function_calls>\n<｜DSML｜invoke name="add">\n<｜DSML｜parameter name="a" string="false">NaN'
        "</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>",
        '<｜DSML｜function_calls>\n<｜DSML｜invoke name="add">\n<｜DSML｜parameter name="a">1.5</｜DSML｜parameter>\n'
        "</｜DSML｜invoke>\n</｜DSML｜function_calls>",                                    # no string attribute
        '<｜DSML｜function_calls>\n<｜DSML｜invoke name="add">\n<｜DSML｜parameter name="a" string="yes">1.5'
        "</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>",
        '<｜DSML｜function_calls>\n<｜DSML｜invoke name="add">\nstray text<｜DSML｜parameter name="a" string="false">'
        "1.5</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>",
        '<｜DSML｜function_calls>\n<｜DSML｜invoke name="add">\n</｜DSML｜invoke>\nstray text\n</｜DSML｜function_calls>',
        '<｜DSML｜function_calls>\n<｜DSML｜invoke name="rm_rf">\n</｜DSML｜invoke>\n</｜DSML｜function_calls>',
        "<｜DSML｜function_calls>\n</｜DSML｜function_calls>",                               # no call in the block
        '<｜DSML｜function_calls>\n<｜DSML｜invoke name="add">\n<｜DSML｜parameter name="a" string="false">1.5'
        "</｜DSML｜parameter>\n",                                                          # the reply ended in the invoke
    ],
    "deepseek-v4": [
        '<｜DSML｜tool_calls>\n<｜DSML｜invoke name="add">\n<｜DSML｜parameter name="a" string="false">[1, 2'
        "</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>",
        '<｜DSML｜tool_calls>\n<｜DSML｜invoke name=add>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>',
        '<｜DSML｜tool_calls>\n<｜DSML｜invoke name="add">\n<｜DSML｜parameter name="a" string="false">1'
        "</｜DSML｜parameter>\n</｜DSML｜tool_calls>",                                      # the invoke not closed
    ],
    "deepseek": ["<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>add<｜tool▁sep｜>{1: 2}<｜tool▁call▁end｜><｜tool▁calls▁end｜>"],
    "kimi-k2": ["<|tool_calls_section_begin|><|tool_call_begin|>functions.add:0<|tool_call_argument_begin|>[1]"
                "<|tool_call_end|><|tool_calls_section_end|>"],
    "harmony": ["<|channel|>commentary to=functions.add <|constrain|>json<|message|>{\"a\": NaN}<|call|>"],
    "gemma4": ['<|tool_call>call:add{a:1.5,b}<tool_call|>', '<|tool_call>call:rm_rf{}<tool_call|>',
               '<|tool_call>call:add{a:<|"|>1.5}<tool_call|>', "<|tool_call>add{a:1}<tool_call|>"],
    "generic": ['{"tool_calls": [{"name": "add", "arguments": [1, 2]}]}', '{"answer": 42}', "```python\nx = 1\n```"],
}


def _templates() -> Path:
    if llamacpp.src() is None:
        pytest.skip("llama.cpp's source, which ships the templates, is not at hand (LLAMA_CPP_SRC)")
    return Path(llamacpp.src()) / "models" / "templates"


def _use(fmt: str, **kw) -> tc.ToolUse:
    return tc.ToolUse(tc.check_tools(TOOLS), kw.get("choice", "auto"), kw.get("parallel", True), tc.FORMATS[fmt])


def _ids():
    n = iter(range(1000))
    return lambda: f"call_{next(n)}"


def _read(use: tc.ToolUse, pieces: list[str]) -> tuple[list[dict], dict]:
    """The deltas of a reply given in pieces, and the message they fold into."""
    reply = chat.Reply(None, False, use)
    reply.calls.calls.new_id = _ids()
    deltas = [d for p in pieces for d in reply.feed(p)] + reply.flush()
    return deltas, chat.fold_message(deltas)


def _calls(message: dict) -> list[tuple[str, dict]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message.get("tool_calls", [])]


def _splits(text: str, seed: int) -> list[str]:
    r = random.Random(seed)
    cuts = sorted(r.sample(range(1, len(text)), min(len(text) - 1, r.randint(1, 12))))
    return [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])]


# ---------------------------------------------------------------------------------------------
# Formats, from the templates

@pytest.mark.parametrize("fmt, name", CASES)
def test_tool_calls_format_detected_from_template(fmt, name):
    template = (_templates() / name).read_text(encoding="utf-8")
    assert tc.detect(template).name == fmt
    assert tc.detect(CHAT_TEMPLATE) is tc.GENERIC and tc.detect(None) is tc.GENERIC


def _model_side(fmt: str, text: str) -> str:
    """The assistant turn's calls as the model writes them, cut from a rendered conversation: from
    the first call marker after the user's message to the last closing one."""
    after = text.index("Weather in Paris?")
    if fmt == "harmony":      # the generation prompt <|start|>assistant, then the call's header
        start = text.index("<|start|>assistant to=", after) + len("<|start|>assistant")
        return text[start:text.index("<|call|>", start) + len("<|call|>")]
    if fmt == "generic":
        start = text.index('{"tool_calls"', after)
        return text[start:start + json.JSONDecoder().raw_decode(text[start:])[1]]
    f = tc.FORMATS[fmt]
    start = text.index(f.starts[0], after)
    return text[start:text.rindex(f.end) + len(f.end)]


@pytest.mark.parametrize("fmt, name", CASES)
def test_tool_calls_round_trip_through_the_template(fmt, name):
    """A conversation with calls (OpenAI's shape: arguments as JSON strings) and their results,
    rendered by the model's own template with the tools; the calls it writes read back the same."""
    template = (_templates() / name).read_text(encoding="utf-8")
    calls = CALLS[:1] if fmt == "harmony" else CALLS      # gpt-oss's template writes a turn's first call only
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": f"call_{i}", "type": "function", "function": {"name": n, "arguments": json.dumps(a)}}
            for i, (n, a) in enumerate(calls)]},
        *[{"role": "tool", "tool_call_id": f"call_{i}", "content": f"result {i}: 21 degrees"}
          for i in range(len(calls))],
    ]
    use = tc.tool_use(template, TOOLS)
    text = chat.render_chat(template, messages, tools=use, bos_token="<s>", eos_token="</s>")
    assert "The weather in a city." in text                                   # the tools are offered
    assert all(f"result {i}: 21 degrees" in text for i in range(len(calls)))
    deltas, message = _read(use, [_model_side(fmt, text)])
    assert _calls(message) == calls and message["content"] is None


# ---------------------------------------------------------------------------------------------
# Reading replies

@pytest.mark.parametrize("fmt", REPLIES)
def test_tool_calls_read_and_stream_alike(fmt):
    """The whole reply, and the same reply in random pieces: the same message; each call's deltas
    are its index, id and name first, then its arguments."""
    deltas, whole = _read(_use(fmt), [REPLIES[fmt]])
    assert _calls(whole) == CALLS and whole["content"] == CONTENT[fmt]
    assert whole["tool_calls"][0]["id"] == "call_0" and whole["tool_calls"][1]["type"] == "function"
    for seed in range(25):
        deltas, streamed = _read(_use(fmt), _splits(REPLIES[fmt], seed))
        assert streamed == whole, seed
        calls = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
        assert [set(c) for c in calls] == [{"index", "id", "type", "function"}, {"index", "function"}] * 2
        assert [c["index"] for c in calls] == [0, 0, 1, 1] and calls[0]["function"]["arguments"] == ""


@pytest.mark.parametrize("fmt, text", [(f, t) for f, ts in MALFORMED.items() for t in ts])
def test_tool_calls_malformed_come_back_as_text(fmt, text):
    for pieces in [[text]] + [_splits(text, seed) for seed in range(10)]:
        deltas, message = _read(_use(fmt), pieces)
        want = text if fmt != "harmony" else '{"a": NaN}'     # harmony: the message's text
        assert message == {"role": "assistant", "content": want}, pieces


@pytest.mark.parametrize("fmt", ["hermes", "qwen3-coder", "glm-4.5", "minimax-m2", "deepseek-v3.2", "deepseek-v4",
                                 "deepseek", "kimi-k2", "gemma4"])
def test_tool_calls_text_like_a_marker_is_held_then_given(fmt):
    """Text that begins like a call marker but is not one comes out whole, in order."""
    marker = tc.FORMATS[fmt].starts[0]
    text = f"a {marker[:-1]} b {marker[:3]}"
    for seed in range(10):
        deltas, message = _read(_use(fmt), _splits(text, seed))
        assert message == {"role": "assistant", "content": text}


def test_tool_calls_dsml_only_in_deepseek_v32_and_v4_templates():
    """Of all the templates llama.cpp ships, DeepSeek-V3.2's and V4's alone are read as DSML, each
    with its block's name."""
    found = {p.name: tc.detect(p.read_text(encoding="utf-8")).name for p in _templates().glob("*.jinja")}
    dsml = {name: fmt for name, fmt in found.items() if fmt in ("deepseek-v3.2", "deepseek-v4")}
    assert dsml == {"deepseek-ai-DeepSeek-V3.2.jinja": "deepseek-v3.2", "deepseek-ai-DeepSeek-V4.jinja": "deepseek-v4",
                    "deepseek-ai-DeepSeek-V4-Flash-0731.jinja": "deepseek-v4"}
    assert tc.detect("{{ '<｜DSML｜function_calls>' }}") is tc.DEEPSEEK_V32
    assert tc.detect("{{ '<｜DSML｜tool_calls>' }}") is tc.DEEPSEEK_V4
    assert tc.detect("{{ '｜DSML｜' }}") is tc.GENERIC          # the piece alone names no block


@pytest.mark.parametrize("fmt", ["deepseek-v3.2", "deepseek-v4"])
def test_tool_calls_dsml_split_anywhere(fmt):
    """The reply cut in two at every place (inside each marker too), and given a character at a
    time: the same message as the whole reply."""
    reply = REPLIES[fmt]
    _, whole = _read(_use(fmt), [reply])
    assert _calls(whole) == CALLS and whole["content"] == "Let me check."
    for cut in range(1, len(reply)):
        assert _read(_use(fmt), [reply[:cut], reply[cut:]])[1] == whole, cut
    assert _read(_use(fmt), list(reply))[1] == whole


def test_tool_calls_dsml_values_follow_the_string_attribute():
    """string="true": the text as it is, whatever it looks like; string="false": the JSON it holds,
    nested values and null included. Several invokes in one block are several calls."""
    def param(key, string, value):
        return f'<｜DSML｜parameter name="{key}" string="{string}">{value}</｜DSML｜parameter>\n'

    reply = ("<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"get_weather\">\n" + param("city", "true", "42") +
             param("days", "false", "3") + param("extra", "false", '{"k": [1, null, {"s": "a</b"}], "t": true}') +
             param("note", "true", ' {"a": 1} < x & y\n') + param("none", "false", "null") +
             param("quoted", "false", '"Zürich"') + param("empty", "true", "") +
             '</｜DSML｜invoke>\n<｜DSML｜invoke name="add">\n</｜DSML｜invoke>\n</｜DSML｜function_calls>')
    want = {"city": "42", "days": 3, "extra": {"k": [1, None, {"s": "a</b"}], "t": True},
            "note": ' {"a": 1} < x & y\n', "none": None, "quoted": "Zürich", "empty": ""}
    _, message = _read(_use("deepseek-v3.2"), [reply])
    assert _calls(message) == [("get_weather", want), ("add", {})] and message["content"] is None
    _, v4 = _read(_use("deepseek-v4"), [reply.replace("function_calls>", "tool_calls>")])
    assert _calls(v4) == _calls(message)
    _, other = _read(_use("deepseek-v4"), [reply])       # V3.2's block is no V4 call
    assert other == {"role": "assistant", "content": reply}


def test_tool_calls_dsml_after_thinking():
    """A DeepSeek reply in thinking mode: the thinking, then a call block; without parallel calls a
    block of two is text."""
    reply = "The user wants the weather.</think>\n\n" + REPLIES["deepseek-v3.2"][len("Let me check.\n\n"):]
    r = chat.Reply(None, False, _use("deepseek-v3.2"), thinking=True)
    message = chat.fold_message(r.feed(reply) + r.flush())
    assert message["reasoning_content"] == "The user wants the weather."
    assert message["content"] is None and _calls(message) == CALLS
    _, single = _read(_use("deepseek-v3.2", parallel=False), [REPLIES["deepseek-v3.2"]])
    assert single == {"role": "assistant", "content": REPLIES["deepseek-v3.2"]}


def test_tool_calls_dsml_block_ends_the_thinking_it_opens_in():
    """As llama.cpp's DeepSeek parsers read it: a call block that opens before </think> ends the
    thinking there (the block is read as calls, never left in reasoning_content), at every split
    of a streamed reply, in both DSML formats; other formats' markers stay in the reasoning, and
    without tools the block is reasoning."""
    block = REPLIES["deepseek-v3.2"][len("Let me check.\n\n"):]
    reply = "The user wants the weather.\n\n" + block
    for fmt, text in (("deepseek-v3.2", reply), ("deepseek-v4", reply.replace("function_calls>", "tool_calls>"))):
        for seed in range(12):
            r = chat.Reply(None, False, _use(fmt), thinking=True)
            message = chat.fold_message([d for piece in _splits(text, seed) for d in r.feed(piece)] + r.flush())
            assert message["reasoning_content"] == "The user wants the weather.", (fmt, seed)
            assert message["content"] is None and _calls(message) == CALLS, (fmt, seed)
    hermes = "I could write <tool_call> here.</think>Done."
    r = chat.Reply(None, False, _use("hermes"), thinking=True)
    message = chat.fold_message(r.feed(hermes) + r.flush())
    assert message["reasoning_content"] == "I could write <tool_call> here." and message["content"] == "Done."
    r = chat.Reply(None, False, None, thinking=True)
    assert chat.fold_message(r.feed(reply) + r.flush())["reasoning_content"] == reply.rstrip()


def test_tool_calls_marker_in_prose_does_not_hide_a_call():
    prose = "<think>I will write <tool_call> tags.</think>\n"
    call = '<tool_call>\n{"name": "add", "arguments": {"a": 1.5, "b": 2}}\n</tool_call>'
    for seed in range(10):
        _, message = _read(_use("hermes"), _splits(prose + call, seed))
        assert message["content"] == prose.rstrip() and _calls(message) == [CALLS[1]]


def test_tool_calls_xml_values_follow_the_schema():
    """A string parameter's value stays text, whatever it looks like; others are the JSON they spell."""
    reply = ("<tool_call>\n<function=get_weather>\n<parameter=city>\n42\n</parameter>\n<parameter=days>\n3\n"
             "</parameter>\n<parameter=extra>\n{\"k\": [1, null]}\n</parameter>\n<parameter=note>\nnot json\n"
             "</parameter>\n</function>\n</tool_call>")
    _, message = _read(_use("qwen3-coder"), [reply])
    want = {"city": "42", "days": 3, "extra": {"k": [1, None]}, "note": "not json"}
    assert _calls(message) == [("get_weather", want)]


def test_tool_calls_choice_and_parallel():
    """A named tool_choice offers that tool alone; without parallel calls the second is text;
    tool_choice none reads no calls."""
    reply = REPLIES["hermes"]
    _, named = _read(_use("hermes", choice="add"), [reply])
    assert _calls(named) == [CALLS[1]] and "get_weather" in named["content"]
    _, single = _read(_use("hermes", parallel=False), [reply])
    assert _calls(single) == [CALLS[0]] and single["content"].endswith("</tool_call>") and '"add"' in single["content"]
    assert _use("hermes", choice="none").parser() is None
    reply_ = chat.Reply(None, False, _use("hermes", choice="none"))
    assert chat.fold_message(reply_.feed(reply) + reply_.flush()) == {"role": "assistant", "content": reply}
    assert reply_.finish_reason("stop") == "stop"


def test_tool_calls_whitespace_next_to_calls_goes():
    _, message = _read(_use("hermes"), ["\n\n", REPLIES["hermes"][len("Let me check."):], "\n \n"])
    assert message["content"] is None and _calls(message) == CALLS
    _, plain = _read(_use("hermes"), ["Just text.\n\n"])
    assert plain["content"] == "Just text.\n\n"


# ---------------------------------------------------------------------------------------------
# The prompt

def test_tool_calls_request_checks():
    assert tc.tool_use(CHAT_TEMPLATE, None) is None and tc.tool_use(CHAT_TEMPLATE, []) is None
    use = tc.tool_use(CHAT_TEMPLATE, [{"type": "function", "function": {"name": "f"}}], "required", False)
    assert use.format is tc.GENERIC and use.choice == "required" and not use.parallel
    assert use.tools[0]["function"] == {"name": "f", "description": "",
                                        "parameters": {"type": "object", "properties": {}}}
    bad = [
        ([{"type": "function"}], None, None, "tools"),
        ([{"type": "retrieval"}], None, None, "tools"),
        ({"type": "function"}, None, None, "tools"),
        ([{"type": "function", "function": {"name": "a b"}}], None, None, "tools"),
        ([{"type": "function", "function": {"name": "f", "parameters": []}}], None, None, "tools"),
        (TOOLS + TOOLS[:1], None, None, "tools"),
        (TOOLS, "sometimes", None, "tool_choice"),
        (TOOLS, {"type": "function", "function": {"name": "nope"}}, None, "tool_choice"),
        (None, "required", None, "tool_choice"),
        (TOOLS, None, "yes", "parallel_tool_calls"),
    ]
    for tools, choice, parallel, field in bad:
        with pytest.raises(rm.InvalidArgumentError) as e:
            tc.tool_use(CHAT_TEMPLATE, tools, choice, parallel)
        assert str(e.value).startswith(field), e.value


def test_tool_calls_generic_prompt_rewrites_history():
    """A template without a tool format gets no tools: a system message lists them and asks for
    the generic JSON; earlier calls and results are text in that shape."""
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "content": "21C"},
                {"role": "tool", "tool_call_id": "c1", "content": "dry"}]
    text = chat.render_chat(CHAT_TEMPLATE, messages, tools=tc.tool_use(CHAT_TEMPLATE, TOOLS, "required"))
    system = text.split("<|im_end|>")[0]
    assert system.startswith("<|im_start|>system\nBe brief.\n\n") and '"name": "get_weather"' in system
    assert "You must call one or more of the tools" in system and '{"tool_calls": [{"name": "NAME"' in system
    assert ('<|im_start|>assistant\n{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}'
            "<|im_end|>") in text
    assert ('<|im_start|>user\n{"tool_response": {"name": "get_weather", "content": "21C"}}\n'
            '{"tool_response": {"name": "get_weather", "content": "dry"}}<|im_end|>') in text
    none = chat.render_chat(CHAT_TEMPLATE, messages[:2], tools=tc.tool_use(CHAT_TEMPLATE, TOOLS, "none"))
    assert none == chat.render(CHAT_TEMPLATE, messages[:2])


def test_tool_calls_arguments_in_the_form_the_template_takes():
    """A template that concatenates the arguments gets OpenAI's string; one that iterates them an object."""
    calls = "{% for m in messages %}{% for c in m.tool_calls or [] %}{{ WRITE }}{% endfor %}{% endfor %}"
    concat = calls.replace("WRITE", "c.function.name + ' ' + c.function.arguments")
    items = calls.replace("WRITE", "c.function.arguments | items | list")
    turn = [{"role": "user", "content": "x"}, {"role": "assistant", "content": None,
                                                "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1}}}]}]
    assert chat.render_chat(concat, turn, False) == 'f {"a": 1}'
    turn[1]["tool_calls"][0]["function"]["arguments"] = '{"a": 1}'
    assert chat.render_chat(items, turn, False) == "[('a', 1)]"


def test_tool_calls_inspect_names_the_format(capsys):
    assert cli.main(["inspect", bundled_model_path()]) == 0
    assert "tool calls:   generic format" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------
# Chat completions, the Python API and the server

def _completion(text: str, step: int = 7):
    for i in range(0, len(text), step):
        yield {"id": "x", "created": 0, "model": "m", "choices": [{"text": text[i:i + step], "finish_reason": None}]}
    yield {"id": "x", "created": 0, "model": "m", "choices": [{"text": "", "finish_reason": "stop"}]}


@pytest.mark.parametrize("fmt", ["hermes", "harmony"])
def test_tool_calls_chat_chunks_fold_and_parse_as_openai(fmt):
    """Chat chunks with tool calls, and the server's response folded from them, as the openai
    client's own types read them; finish_reason "tool_calls"."""
    pytest.importorskip("openai")
    from openai.types.chat import ChatCompletion, ChatCompletionChunk

    chunks = list(chat.as_chat_chunks(_completion(REPLIES[fmt]), tools=_use(fmt)))
    for c in chunks:
        ChatCompletionChunk.model_validate(c)
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    whole = ChatCompletion.model_validate(srv._fold("chat", chunks, {"prompt_tokens": 1, "completion_tokens": 1,
                                                                       "total_tokens": 2}))
    message = whole.choices[0].message
    assert message.content == "Let me check." and whole.choices[0].finish_reason == "tool_calls"
    assert [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls] == CALLS


@pytest.fixture(scope="module")
def bundled():
    with rm.Model(bundled_model_path(), n_ctx=512, n_threads=2) as m:
        yield m


def _without_ids(message: dict) -> dict:
    return dict(message, tool_calls=[dict(c, id=None) for c in message.get("tool_calls", [])])


def _check_reply(message: dict, finish: str) -> None:
    """Either text, or calls of the tools offered with JSON-object arguments."""
    calls = message.get("tool_calls")
    if calls:
        assert finish in ("tool_calls", "length")
        for c in calls:
            assert c["id"].startswith("call_") and c["type"] == "function"
            assert c["function"]["name"] in {"get_weather", "add"}
            assert isinstance(json.loads(c["function"]["arguments"]), dict)
    else:
        assert isinstance(message["content"], str) and finish in ("stop", "length")


def test_tool_calls_python_api(bundled):
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    kw = dict(max_tokens=24, temperature=0.8, seed=5, tools=TOOLS)
    whole = bundled.create_chat_completion(messages, **kw)
    _check_reply(whole["choices"][0]["message"], whole["choices"][0]["finish_reason"])
    chunks = list(bundled.create_chat_completion(messages, stream=True, **kw))
    streamed = chat.fold_message([c["choices"][0]["delta"] for c in chunks])
    assert _without_ids(streamed) == _without_ids(whole["choices"][0]["message"])   # ids are new each time
    assert chunks[-1]["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"]
    with pytest.raises(rm.InvalidArgumentError, match="tools"):
        bundled.create_chat_completion(messages, tools=[{"type": "function"}])


@pytest.fixture(scope="module")
def client():
    openai = pytest.importorskip("openai")
    with running(rm.Model(bundled_model_path(), n_ctx=512, n_threads=2), parallel=2, queue=8) as (url, _):
        yield openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0), url


def test_tool_calls_server_with_openai_client(client):
    import openai

    c, url = client
    name = c.models.list().data[0].id
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    for choice in ("auto", "required", {"type": "function", "function": {"name": "add"}}, "none"):
        r = c.chat.completions.create(model=name, messages=messages, tools=TOOLS, tool_choice=choice,
                                      max_tokens=24, temperature=0.8, seed=3)
        _check_reply(r.choices[0].message.model_dump(), r.choices[0].finish_reason)
        stream = c.chat.completions.create(model=name, messages=messages, tools=TOOLS, tool_choice=choice,
                                           max_tokens=24, temperature=0.8, seed=3, stream=True)
        chunks = [chunk.model_dump(exclude_unset=True) for chunk in stream]
        message = chat.fold_message([ch["choices"][0]["delta"] for ch in chunks if ch["choices"]])
        _check_reply(message, chunks[-1]["choices"][0]["finish_reason"])
        assert message["content"] == r.choices[0].message.content
    follow_up = messages + [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "21 degrees"}]
    r = c.chat.completions.create(model=name, messages=follow_up, tools=TOOLS, max_tokens=8)
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
    for bad in ([{"type": "function"}], [{"type": "function", "function": {"name": "a b"}}]):
        with pytest.raises(openai.BadRequestError) as e:
            c.chat.completions.create(model=name, messages=messages, tools=bad, max_tokens=4)
        assert e.value.body["param"] == "tools"
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model=name, messages=messages, tools=TOOLS, tool_choice="sometimes", max_tokens=4)
    assert e.value.body["param"] == "tool_choice"
    r = httpx.post(url + "/v1/completions", json={"prompt": "x", "tools": TOOLS})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools"


def test_tool_calls_results_in_call_order():
    """Each run of results after a turn with calls follows those calls' order; a result no call
    names goes first; user turns in the run and other runs stay where they are; a turn whose calls
    have no ids orders nothing."""
    def call(i):
        return {"id": i, "type": "function", "function": {"name": "f", "arguments": "{}"}}

    def res(i):
        return {"role": "tool", "tool_call_id": i, "content": i}

    msgs = [{"role": "user", "content": "u"}, {"role": "assistant", "tool_calls": [call("a"), call("b"), call("c")]},
            res("c"), {"role": "user", "content": "v"}, res("x"), res("a"), res("b"),
            {"role": "assistant", "content": "ok"}, res("b"), res("a"),
            {"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "f"}}]}, res("b"), res("a")]
    got = tc.results_in_call_order(msgs)
    assert [m.get("tool_call_id") or m.get("content") for m in got] == \
        ["u", None, "x", "v", "a", "b", "c", "ok", "a", "b", None, "b", "a"]
    assert [m.get("tool_call_id") for m in msgs[2:7]] == ["c", None, "x", "a", "b"]   # not changed in place
    odd = [msgs[1], {"role": "tool", "tool_call_id": ["b"], "content": "?"}, res("b"), res("a")]   # an id no string
    assert [m["content"] for m in tc.results_in_call_order(odd)[1:]] == ["?", "a", "b"]

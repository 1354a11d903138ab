"""Chat: templates rendered as transformers renders them, and chat completions in
llama-cpp-python's shapes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import rapidmoe_gguf as rm
from rapidmoe_gguf import chat

MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "hello experts"},
    {"role": "assistant", "content": "The quick brown fox."},
    {"role": "user", "content": "Ünïcödé ✓ 漢字, again"},
]

# Block tags on their own lines (trim_blocks / lstrip_blocks matter), a namespace, loop controls,
# tojson, bos/eos tokens and raise_exception: the features real templates use.
RICH_TEMPLATE = """{{ bos_token }}
{% set ns = namespace(system='') %}
{% for m in messages %}
    {% if m['role'] == 'system' %}
        {% set ns.system = m['content'] %}
        {% continue %}
    {% endif %}
    {% if (m['role'] == 'user') != (loop.index0 % 2 == (1 if ns.system else 0)) %}
        {{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}
    {% endif %}
    {% if m['role'] == 'user' %}
[INST] {% if loop.index0 == 1 and ns.system %}<<SYS>>{{ ns.system | tojson }}<</SYS>> {% endif %}{{ m['content'] | trim }} [/INST]
    {% else %}
 {{ m['content'] }}{{ eos_token }}
    {% endif %}
{% endfor %}
{% if add_generation_prompt %}
ASSISTANT:
{% endif %}"""


@pytest.fixture(scope="module")
def hf_dir(tiny_hf):
    return tiny_hf("qwen3_moe")


@pytest.fixture(scope="module")
def model(hf_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("chat") / "m.gguf"
    rm.convert(hf_dir, out, recipe="q4k-q8", progress=False)
    with rm.Model(out, n_ctx=256, n_threads=2) as m:
        yield m


@pytest.fixture(scope="module")
def hf_tokenizer(hf_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(hf_dir)


def _ours(model, template, messages, add_generation_prompt=True):
    tok = model.tokenizer
    return chat.render(template, messages, add_generation_prompt,
                       bos_token=tok.token_to_piece(tok.bos_id).decode(),
                       eos_token=tok.token_to_piece(tok.eos_id).decode())


@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_template_matches_transformers(model, hf_tokenizer, add_generation_prompt):
    want = hf_tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=add_generation_prompt)
    assert _ours(model, model.tokenizer.chat_template, MESSAGES, add_generation_prompt) == want
    want_ids = hf_tokenizer.apply_chat_template(MESSAGES, tokenize=True, add_generation_prompt=add_generation_prompt,
                                                return_dict=False)
    assert chat.chat_prompt(model, MESSAGES, add_generation_prompt) == list(want_ids)


def test_chat_rich_template_matches_transformers(model, hf_tokenizer):
    want = hf_tokenizer.apply_chat_template(MESSAGES, chat_template=RICH_TEMPLATE, tokenize=False,
                                            add_generation_prompt=True)
    got = _ours(model, RICH_TEMPLATE, MESSAGES)
    assert got == want
    assert "<<SYS>>\"You are terse.\"<</SYS>>" in got and "漢字" in got


def test_chat_template_raise_exception_is_invalid_argument(model, hf_tokenizer):
    bad = [MESSAGES[1], MESSAGES[1]]
    with pytest.raises(Exception, match="must alternate"):
        hf_tokenizer.apply_chat_template(bad, chat_template=RICH_TEMPLATE, tokenize=False)
    with pytest.raises(rm.InvalidArgumentError, match="must alternate"):
        _ours(model, RICH_TEMPLATE, bad)


def test_chat_template_sandbox_refuses_internals(model):
    with pytest.raises(rm.InvalidArgumentError, match="chat template"):
        chat.render("{{ messages.__class__.__mro__[1].__subclasses__() }}", MESSAGES)
    with pytest.raises(rm.InvalidArgumentError):
        chat.render("{% set x = messages.append(1) %}", MESSAGES)     # immutable: no mutation


def test_chat_without_template_is_a_clear_error(model, monkeypatch):
    monkeypatch.setattr(model.tokenizer, "chat_template", None)
    with pytest.raises(rm.UnsupportedError, match="no chat template"):
        model.create_chat_completion(MESSAGES, max_tokens=4)


@pytest.mark.parametrize("messages, match", [
    ("hello", "list"),
    ([], "empty"),
    ([{"content": "x"}], "role"),
    ([{"role": "user", "content": 3}], "content must be a string"),
    ([{"role": "user", "content": [{"type": "image_url"}]}], "text parts"),
])
def test_chat_bad_messages_are_invalid_arguments(model, messages, match):
    with pytest.raises(rm.InvalidArgumentError, match=match):
        model.create_chat_completion(messages, max_tokens=4)


def test_chat_text_parts_join(model):
    parts = [{"role": "user", "content": [{"type": "text", "text": "hello "}, {"type": "text", "text": "experts"}]}]
    assert chat.chat_prompt(model, parts) == chat.chat_prompt(model, [MESSAGES[1]])


def test_chat_completion_shapes(model):
    r = model.create_chat_completion(MESSAGES, max_tokens=8, temperature=0.9, seed=7)
    assert r["object"] == "chat.completion" and r["id"].startswith("chatcmpl-")
    assert set(r) == {"id", "object", "created", "model", "choices", "usage"}
    (choice,) = r["choices"]
    assert choice["message"]["role"] == "assistant" and isinstance(choice["message"]["content"], str)
    assert choice["finish_reason"] in ("stop", "length") and choice["index"] == 0
    u = r["usage"]
    assert u["prompt_tokens"] == len(chat.chat_prompt(model, MESSAGES))
    assert 0 < u["completion_tokens"] <= 8 and u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]

    chunks = list(model.create_chat_completion(MESSAGES, max_tokens=8, temperature=0.9, seed=7, stream=True))
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant"}
    assert all(set(c["choices"][0]["delta"]) == {"content"} for c in chunks[1:-1])
    last = chunks[-1]["choices"][0]
    assert last["delta"] == {} and last["finish_reason"] == choice["finish_reason"]
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])


@pytest.mark.parametrize("seed", [1, 2])
def test_chat_stream_joins_to_the_whole_reply(model, seed):
    kw = dict(max_tokens=24, temperature=1.0, seed=seed)
    whole = model.create_chat_completion(MESSAGES, **kw)["choices"][0]["message"]["content"]
    pieces = [c["choices"][0]["delta"].get("content", "")
              for c in model.create_chat_completion(MESSAGES, stream=True, **kw)]
    assert "".join(pieces) == whole and whole


def test_chat_stop_string_ends_the_reply(model):
    whole = model.create_chat_completion(MESSAGES, max_tokens=24, temperature=1.0, seed=3)["choices"][0]
    text = whole["message"]["content"]
    if len(text) < 4:
        pytest.skip("the random model ended its reply at once")
    stop = text[2:4]
    r = model.create_chat_completion(MESSAGES, max_tokens=24, temperature=1.0, seed=3, stop=stop)["choices"][0]
    assert r["message"]["content"] == text[:text.index(stop)] and r["finish_reason"] == "stop"


def test_chat_fork_session_shares_weights_and_matches(model):
    kw = dict(max_tokens=12, temperature=0.9, seed=5)
    with model.fork_session() as fork:
        assert fork._model == model._model and fork._session != model._session
        want = model.create_chat_completion(MESSAGES, **kw)["choices"]
        assert fork.create_chat_completion(MESSAGES, **kw)["choices"] == want
    assert fork._session is None and model._session is not None     # closing a fork leaves the model


def test_chat_cli_keeps_history_resets_and_leaves_on_eof(model, monkeypatch, capsys):
    from rapidmoe_gguf import cli

    lines = iter(["hello", "again", "/reset", "third"])

    def fake_input(prompt=""):
        try:
            return next(lines)
        except StopIteration:
            raise EOFError from None

    seen = []
    real = rm.Model.create_chat_completion

    def spy(self, messages, **kw):
        seen.append([(m["role"], m["content"]) for m in messages])
        return real(self, messages, **kw)

    monkeypatch.setattr("builtins.input", fake_input)
    monkeypatch.setattr(rm.Model, "create_chat_completion", spy)
    assert cli.main(["chat", model.path, "--ctx", "256", "-t", "2", "-n", "6", "--seed", "1",
                     "--system", "be brief"]) == 0
    assert [[r for r, _ in call] for call in seen] == [
        ["system", "user"], ["system", "user", "assistant", "user"], ["system", "user"]]
    assert seen[1][1] == ("user", "hello") and seen[2][1] == ("user", "third")
    assert "/reset" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["LFM2.5-8B-A1B.jinja", "LFM2.5-Instruct.jinja", "poolside-Laguna-XS.2.jinja",
                                  "poolside-Laguna-XS-2.1.jinja", "poolside-Laguna-S-2.1.jinja",
                                  "google-gemma-4-31B-it.jinja", "google-gemma-4-31B-it-interleaved.jinja",
                                  "StepFun3.5-Flash.jinja"])
def test_chat_generation_blocks_render_as_transformers(name):
    """Templates with transformers' {% generation %} blocks (LFM2.5, Laguna), Gemma 4's and
    Step-3.5-Flash's parse and render a conversation with a tool call, its result and tools
    offered as transformers renders it."""
    from transformers.utils.chat_template_utils import render_jinja_template

    import llamacpp_oracle as llamacpp

    if llamacpp.src() is None:
        pytest.skip("llama.cpp's source, which ships the templates, is not at hand (LLAMA_CPP_SRC)")
    path = Path(llamacpp.src()) / "models" / "templates" / name
    assert path.is_file(), f"{path}: llama.cpp ships no such template"
    template = path.read_text(encoding="utf-8")
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
                                                "parameters": {"type": "object",
                                                               "properties": {"city": {"type": "string"}}}}}]
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": "Checking.", "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "21 degrees"},
                {"role": "assistant", "content": "It is 21 degrees."}, {"role": "user", "content": "Thanks"}]
    for kw in ({}, {"tools": tools}):
        want = render_jinja_template([messages], chat_template=template, add_generation_prompt=True,
                                     bos_token="<s>", eos_token="</s>", **kw)
        want = want[0][0] if isinstance(want, tuple) else want[0] if isinstance(want, list) else want
        got = chat.render(template, messages, True, bos_token="<s>", eos_token="</s>", **kw)
        assert got == want


# DeepSeek-V3.2's and V4's templates, as their text writes a conversation with tools: the tools
# as JSON lines in the system prompt, the assistant's call as a DSML block, the tool's result.
DSML_TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
                                                 "parameters": {"type": "object", "properties": {
                                                     "city": {"type": "string"}, "days": {"type": "integer"}}}}}]
DSML_CALL = ('<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" string="true">Zürich'
             '</｜DSML｜parameter>\n<｜DSML｜parameter name="days" string="false">2</｜DSML｜parameter>\n'
             "</｜DSML｜invoke>\n")
DSML_TEMPLATES = {
    # V3.2: the block is function_calls; results follow the assistant's turn, then the next
    # assistant turn opens with a closed think block
    "deepseek-ai-DeepSeek-V3.2.jinja": (
        "\n\nHere are the functions available in JSONSchema format:\n<functions>\n{tools}</functions>\n",
        "<｜User｜>Weather in Zürich?<｜Assistant｜></think>Checking.\n\n<｜DSML｜function_calls>\n" + DSML_CALL +
        "</｜DSML｜function_calls><｜end▁of▁sentence｜>\n\n<function_results>\n<result>21 degrees</result>\n"
        "</function_results>\n\n</think>It is 21 degrees.<｜end▁of▁sentence｜><｜User｜>Thanks",
        ("<｜Assistant｜><think></think>", "<｜Assistant｜><think>"), False),
    # V4: the block is tool_calls; results are a user turn of <tool_result>s; thinking with tools
    # keeps the earlier turns' think blocks
    "deepseek-ai-DeepSeek-V4.jinja": (
        "### Available Tool Schemas\n\n{tools}\nYou MUST strictly follow the above defined tool name and parameter "
        "schemas to invoke tool calls.\n",
        "<｜User｜>Weather in Zürich?<｜Assistant｜></think>Checking.\n\n<｜DSML｜tool_calls>\n" + DSML_CALL +
        "</｜DSML｜tool_calls><｜end▁of▁sentence｜><｜User｜><tool_result>21 degrees</tool_result>"
        "<｜Assistant｜></think>It is 21 degrees.<｜end▁of▁sentence｜><｜User｜>Thanks",
        ("<｜Assistant｜></think>", "<｜Assistant｜><think>"), True),
}
DSML_TEMPLATES["deepseek-ai-DeepSeek-V4-Flash-0731.jinja"] = DSML_TEMPLATES["deepseek-ai-DeepSeek-V4.jinja"]


@pytest.mark.parametrize("name", DSML_TEMPLATES)
def test_chat_deepseek_dsml_templates_render_tools_calls_and_results(name):
    """The templates render (their from_json filter given) a conversation with tools offered, an
    assistant turn with a call (its arguments a JSON string or an object, alike) and the call's
    result, as the templates' text says; thinking opens the generation prompt's think block."""
    import llamacpp_oracle as llamacpp

    if llamacpp.src() is None:
        pytest.skip("llama.cpp's source, which ships the templates, is not at hand (LLAMA_CPP_SRC)")
    path = Path(llamacpp.src()) / "models" / "templates" / name
    assert path.is_file(), f"{path}: llama.cpp ships no such template"
    template = path.read_text(encoding="utf-8")
    tools_part, turns, (prompt, thinking_prompt), keeps_thinking = DSML_TEMPLATES[name]
    thinking_turns = turns.replace("<｜Assistant｜></think>", "<｜Assistant｜><think></think>") if keeps_thinking else turns
    listing = tools_part.format(tools=json.dumps(DSML_TOOLS[0]["function"], ensure_ascii=False) + "\n")

    def messages(arguments):
        call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}
        return [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Zürich?"},
                {"role": "assistant", "content": "Checking.", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "content": "21 degrees"},
                {"role": "assistant", "content": "It is 21 degrees."}, {"role": "user", "content": "Thanks"}]

    for arguments in ('{"city": "Zürich", "days": 2}', {"city": "Zürich", "days": 2}):
        got = chat.render(template, messages(arguments), True, bos_token="<s>", tools=DSML_TOOLS)
        assert got.startswith("<s>Be brief.\n\n## Tools\n\n")
        assert got.endswith(listing + turns + prompt), got[-1200:]
        thinking = chat.render(template, messages(arguments), True, bos_token="<s>", tools=DSML_TOOLS, thinking=True)
        assert thinking.endswith(thinking_turns + thinking_prompt), thinking[-800:]
    with pytest.raises(rm.InvalidArgumentError, match="chat template"):
        chat.render(template, messages('{"city": '), True, tools=DSML_TOOLS)    # arguments that are no JSON


@pytest.mark.parametrize("name", ["deepseek-ai-DeepSeek-V4.jinja", "deepseek-ai-DeepSeek-V4-Flash-0731.jinja"])
def test_chat_reasoning_effort_reaches_the_template_as_llama_server_gives_it(name):
    """A request's reasoning_effort becomes the template's variable (V4's templates write their
    "max" text when thinking), over one in chat_template_kwargs, which stays where the field is
    absent; "none" turns thinking off; a level no API names is refused by name."""
    import llamacpp_oracle as llamacpp

    if llamacpp.src() is None:
        pytest.skip("llama.cpp's source, which ships the templates, is not at hand (LLAMA_CPP_SRC)")
    template = (Path(llamacpp.src()) / "models" / "templates" / name).read_text(encoding="utf-8")
    messages = [{"role": "user", "content": "Hi"}]
    marker = "Reasoning Effort: "

    def rendered(effort, kwargs):
        return chat.render(template, messages, True, bos_token="<s>", **chat.effort_variables(effort, kwargs))

    plain = rendered(None, {"thinking": True})
    assert marker not in plain and plain.endswith("<｜Assistant｜><think>")
    assert marker in rendered("max", {"thinking": True})
    assert marker in rendered(None, {"thinking": True, "reasoning_effort": "max"})
    assert marker not in rendered("medium", {"thinking": True, "reasoning_effort": "max"})
    assert marker not in rendered("max", {})          # the template writes it only when thinking
    off = chat.effort_variables("none", {"reasoning_effort": "max", "thinking": True})
    assert off == {"thinking": False, "enable_thinking": False}
    assert rendered("none", {"thinking": True}).endswith("<｜Assistant｜></think>")
    for bad in ("extreme", "", 3):
        with pytest.raises(rm.InvalidArgumentError, match="reasoning_effort must be one of"):
            chat.effort_variables(bad, {})


@pytest.mark.parametrize("name", list(DSML_TEMPLATES))
def test_chat_deepseek_v4_writes_tool_results_in_call_order(name):
    """Two calls answered in the other order: V4's templates get the results in the calls' order
    (its reference encoding's, as llama.cpp renders them); V3.2's, as the conversation has them."""
    import llamacpp_oracle as llamacpp

    if llamacpp.src() is None:
        pytest.skip("llama.cpp's source, which ships the templates, is not at hand (LLAMA_CPP_SRC)")
    template = (Path(llamacpp.src()) / "models" / "templates" / name).read_text(encoding="utf-8")
    calls = [{"id": f"c{k}", "type": "function", "function": {"name": "get_weather", "arguments": {"city": city}}}
             for k, city in ((1, "Bern"), (2, "Genf"))]
    messages = [{"role": "user", "content": "Weather in Bern and Genf?"},
                {"role": "assistant", "content": "", "tool_calls": calls},
                {"role": "tool", "tool_call_id": "c2", "content": "Genf: 19"},
                {"role": "tool", "tool_call_id": "c1", "content": "Bern: 17"}]
    got = chat.render_chat(template, messages, True, bos_token="<s>")
    first, second = ("Bern: 17", "Genf: 19") if "V4" in name else ("Genf: 19", "Bern: 17")
    assert 0 <= got.index(first) < got.index(second), got[-400:]
    assert [m["tool_call_id"] for m in messages[2:]] == ["c2", "c1"]   # the request's messages as they were


@pytest.mark.parametrize("name", list(DSML_TEMPLATES))
def test_chat_deepseek_v4_template_gets_the_response_format(name):
    """A request's JSON schema reaches V4's templates, which write it into the system prompt (as
    llama.cpp gives it them); V3.2's, which read none, get nothing; plain text adds nothing; a
    response_format of no known kind is refused by name. The server's request does the same."""
    import llamacpp_oracle as llamacpp

    from rapidmoe_gguf import server as srv
    from rapidmoe_gguf.bundled import bundled_model_path

    if llamacpp.src() is None:
        pytest.skip("llama.cpp's source, which ships the templates, is not at hand (LLAMA_CPP_SRC)")
    template = (Path(llamacpp.src()) / "models" / "templates" / name).read_text(encoding="utf-8")
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "reply", "schema": schema}}
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
    v4 = "V4" in name
    variables = chat.format_variables(template, fmt, {"thinking": False})
    assert variables == ({"thinking": False, "response_format": schema} if v4 else {"thinking": False})
    got = chat.render(template, messages, True, bos_token="<s>", **variables)
    assert ("## Response Format:" in got and json.dumps(schema) in got) == v4
    assert chat.format_variables(template, {"type": "text"}, {}) == {}
    if v4:
        with pytest.raises(rm.InvalidArgumentError, match="response_format"):
            chat.format_variables(template, {"type": "yaml"}, {})
    with rm.Model(bundled_model_path(), n_ctx=512, n_threads=1) as m:
        m.tokenizer.chat_template = template
        req = srv.parse_request("chat", {"messages": messages, "max_tokens": 4, "response_format": fmt}, m, {"m"})
        assert ("## Response Format:" in m.tokenizer.decode(req.prompt_ids)) == v4


def test_chat_template_that_is_no_text_is_refused_by_name_with_tools_and_formats():
    """A template that is no string (a hostile file's metadata) is refused as such, not with a
    TypeError, where the messages carry tool calls or the request a response_format."""
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "content": "x"}]
    for template in (5, None, ["{{ 1 }}"]):
        with pytest.raises(rm.UnsupportedError, match="not a string"):
            chat.render_chat(template, messages)
        assert chat.format_variables(template, {"type": "json_object"}, {}) == {}

"""Structured outputs (rapidmoe_gguf.grammar, llguidance): replies constrained to a JSON schema
through the Python API and the server, forced tool calls in the generic format, and the schema
errors; each reply checked by the jsonschema library, the official clients' own types where they
parse it."""

from __future__ import annotations

import json

import numpy as np
import pytest

import rapidmoe_gguf as rm
from rapidmoe_gguf import grammar
from rapidmoe_gguf.bundled import bundled_model_path
from rapidmoe_gguf.errors import InvalidArgumentError
from test_server import running

jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("llguidance")

# Every field bounded, so that a tiny model's reply always completes within max_tokens.
PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age", "ok", "tags"],
          "properties": {"name": {"type": "string", "maxLength": 20},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120},
                         "ok": {"type": "boolean"},
                         "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3}}}
FORMAT = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
ASK = [{"role": "user", "content": "Describe a person as JSON."}]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16}},
                   "required": ["city"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}},
                                       "required": ["zone"]}}}


@pytest.fixture(scope="module")
def model():
    with rm.Model(bundled_model_path(), n_ctx=512, n_threads=2) as m:
        yield m


def _valid(text: str, schema: dict) -> dict:
    value = json.loads(text)
    jsonschema.validate(value, schema)
    return value


@pytest.mark.parametrize("sampling", [{"temperature": 0}, {"temperature": 0.9, "seed": 5}, {"temperature": 1.5, "seed": 9}])
def test_grammar_chat_reply_matches_the_schema(model, sampling):
    """Greedy and sampled replies are JSON of the schema, end by themselves (finish "stop"), and
    come streamed as they come whole; the same request without the format is free text."""
    r = model.create_chat_completion(ASK, max_tokens=120, response_format=FORMAT, **sampling)
    text = r["choices"][0]["message"]["content"]
    _valid(text, PERSON)
    assert r["choices"][0]["finish_reason"] == "stop"
    chunks = model.create_chat_completion(ASK, max_tokens=120, response_format=FORMAT, stream=True, **sampling)
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == text
    free = model.create_chat_completion(ASK, max_tokens=40, **sampling)["choices"][0]["message"]["content"]
    assert free != text


def test_grammar_json_object_and_llama_cpp_python_schema_form(model):
    """json_object: any JSON object; llama-cpp-python's {"type": "json_object", "schema"} form."""
    r = model.create_chat_completion(ASK, max_tokens=200, temperature=0.7, seed=2,
                                     response_format={"type": "json_object", "schema": PERSON})
    _valid(r["choices"][0]["message"]["content"], PERSON)
    small = {"type": "object", "properties": {"x": {"type": "boolean"}}, "required": ["x"], "additionalProperties": False}
    r = model.create_chat_completion(ASK, max_tokens=200, temperature=0, response_format={"type": "json_object",
                                                                                            "schema": small})
    assert _valid(r["choices"][0]["message"]["content"], small) in ({"x": True}, {"x": False})


def test_grammar_masks_only_what_the_grammar_forbids(model):
    """A constraint's mask leaves the allowed tokens' logits as they are and sets the others to
    -inf; at the start of a JSON object only tokens that begin with '{' are allowed."""
    g = grammar.Grammar(model.tokenizer, {"type": "object"})
    c = g.constraint()
    logits = np.random.default_rng(0).standard_normal(model.n_vocab).astype(np.float32)
    masked = c.mask(logits)
    allowed = np.isfinite(masked)
    assert 0 < allowed.sum() < model.n_vocab and np.array_equal(masked[allowed], logits[allowed])
    for t in np.flatnonzero(allowed)[:50]:
        assert model.tokenizer.token_to_piece(int(t)).lstrip().startswith(b"{")
    assert not c.done


@pytest.mark.parametrize("response_format, message", [
    ({"type": "json_schema", "json_schema": {"schema": {"type": "strin"}}}, "strin"),
    ({"type": "json_schema", "json_schema": {"schema": {"type": "string", "format": "no-such-format"}}},
     "no-such-format"),
    ({"type": "json_schema", "json_schema": {"schema": [1]}}, "must be a JSON object"),
    ({"type": "json_schema"}, "json_schema must be an object"),
    ({"type": "xml"}, "must be text, json_object or json_schema"),
])
def test_grammar_bad_schema_is_refused_naming_it(model, response_format, message):
    with pytest.raises(InvalidArgumentError, match="response_format") as e:
        model.create_chat_completion(ASK, max_tokens=4, response_format=response_format)
    assert message in str(e.value)


def test_grammar_forced_tool_call_in_the_generic_format(model):
    """tool_choice required / named with the bundled model (the generic JSON format): the reply is
    a call of an offered tool with arguments of its schema (only the properties it names), one
    with parallel_tool_calls false, streamed as delta.tool_calls too."""
    for choice, names in (("required", {"get_weather", "get_time"}),
                          ({"type": "function", "function": {"name": "get_time"}}, {"get_time"})):
        for sampling in ({"temperature": 0}, {"temperature": 1.0, "seed": 4}):
            r = model.create_chat_completion([{"role": "user", "content": "Weather in Paris?"}], max_tokens=120,
                                             tools=[WEATHER, TIME], tool_choice=choice, parallel_tool_calls=False,
                                             **sampling)
            choice0 = r["choices"][0]
            assert choice0["finish_reason"] == "tool_calls" and not choice0["message"].get("content")
            (call,) = choice0["message"]["tool_calls"]
            assert call["function"]["name"] in names
            tool = {"get_weather": WEATHER, "get_time": TIME}[call["function"]["name"]]
            args = _valid(call["function"]["arguments"], tool["function"]["parameters"])
            assert set(args) <= set(tool["function"]["parameters"]["properties"])
            chunks = list(model.create_chat_completion([{"role": "user", "content": "Weather in Paris?"}],
                                                       max_tokens=120, tools=[WEATHER, TIME], tool_choice=choice,
                                                       parallel_tool_calls=False, stream=True, **sampling))
            streamed = [tc for c in chunks for tc in c["choices"][0]["delta"].get("tool_calls") or []]
            assert streamed[0]["function"]["name"] == call["function"]["name"]
            assert "".join(tc["function"].get("arguments") or "" for tc in streamed) == call["function"]["arguments"]
            assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_grammar_forced_call_and_json_reply_together_are_refused(model):
    with pytest.raises(InvalidArgumentError, match="response_format"):
        model.create_chat_completion(ASK, max_tokens=4, tools=[WEATHER], tool_choice="required", response_format=FORMAT)


# ---------------------------------------------------------------------------------------------
# The server, with the official clients
# ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def served():
    with running(rm.Model(bundled_model_path(), n_ctx=512, n_threads=2), parallel=2, queue=8) as (url, _):
        yield url


def test_grammar_server_openai_client_json_schema_and_forced_calls(served, model):
    """Chat completions with response_format (streamed and not, equal to the Python API's), the
    Responses API's text.format, and required tool calls, through the openai client; a bad
    schema is a 400 naming response_format."""
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=served + "/v1", api_key="none", max_retries=0)
    r = client.chat.completions.create(model="tiny-moe", messages=ASK, max_tokens=120, temperature=0,
                                       response_format=FORMAT)
    text = r.choices[0].message.content
    _valid(text, PERSON)
    assert text == model.create_chat_completion(ASK, max_tokens=120, temperature=0,
                                                response_format=FORMAT)["choices"][0]["message"]["content"]
    stream = client.chat.completions.create(model="tiny-moe", messages=ASK, max_tokens=120, temperature=0,
                                            response_format=FORMAT, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == text

    resp = client.responses.create(model="tiny-moe", input="Describe a person as JSON.", max_output_tokens=120,
                                   temperature=0, text={"format": {"type": "json_schema", "name": "person",
                                                                   "schema": PERSON, "strict": True}})
    _valid(resp.output_text, PERSON)
    assert resp.text.format.type == "json_schema"

    for stream in (False, True):
        r = client.chat.completions.create(model="tiny-moe", messages=[{"role": "user", "content": "Time?"}],
                                           max_tokens=120, temperature=0.8, seed=1, tools=[WEATHER, TIME],
                                           tool_choice="required", parallel_tool_calls=False, stream=stream)
        if stream:
            chunks = list(r)
            calls = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
            name, arguments = calls[0].function.name, "".join(tc.function.arguments or "" for tc in calls)
            assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
        else:
            assert r.choices[0].finish_reason == "tool_calls"
            name, arguments = r.choices[0].message.tool_calls[0].function.name, \
                r.choices[0].message.tool_calls[0].function.arguments
        tool = {"get_weather": WEATHER, "get_time": TIME}[name]
        _valid(arguments, tool["function"]["parameters"])

    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny-moe", messages=ASK, max_tokens=4, response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}})
    assert e.value.body["param"] == "response_format" and "strin" in e.value.body["message"]


def test_grammar_server_anthropic_client_gets_a_tool_use_block(served):
    """tool_choice any / tool through the Messages API: a tool_use block whose input validates."""
    anthropic = pytest.importorskip("anthropic")
    claude = anthropic.Anthropic(base_url=served, api_key="none", max_retries=0)
    tools = [{"name": t["function"]["name"], "input_schema": t["function"]["parameters"]} for t in (WEATHER, TIME)]
    for choice in ({"type": "any", "disable_parallel_tool_use": True}, {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True}):
        r = claude.messages.create(model="tiny-moe", max_tokens=120, tools=tools, tool_choice=choice,
                                   messages=[{"role": "user", "content": "Weather in Paris?"}],
                                   extra_body={"temperature": 0})
        assert r.stop_reason == "tool_use"
        (block,) = [b for b in r.content if b.type == "tool_use"]
        if choice["type"] == "tool":
            assert block.name == "get_weather"
        jsonschema.validate(block.input, {"get_weather": WEATHER, "get_time": TIME}[block.name]["function"]["parameters"])


def test_grammar_requests_share_steps_with_free_ones(model):
    """Constrained and free requests sent at once run in the same steps (a batch of the two
    kinds) and answer what each answers alone."""
    import asyncio

    import httpx

    bodies = [{"messages": ASK, "max_tokens": 60, "temperature": 0, "response_format": FORMAT},
              {"messages": ASK, "max_tokens": 60, "temperature": 0},
              {"messages": ASK, "max_tokens": 60, "temperature": 0.9, "seed": 3, "response_format": FORMAT},
              {"messages": ASK, "max_tokens": 60, "temperature": 0.9, "seed": 3}]
    alone = [model.create_chat_completion(**b)["choices"][0]["message"]["content"] for b in bodies]
    with running(rm.Model(bundled_model_path(), n_ctx=512, n_threads=2), parallel=4, queue=8) as (url, state):
        grammar.ll_tokenizer(state.slots[0].tokenizer)   # made once per tokenizer: not while the others run

        async def main():
            async with httpx.AsyncClient(base_url=url, timeout=60) as client:
                rs = await asyncio.gather(*(client.post("/v1/chat/completions", json=b) for b in bodies))
                return [r.json()["choices"][0]["message"]["content"] for r in rs]

        got = asyncio.run(main())
        assert state.peak_batch >= 2
    assert got == alone
    _valid(got[0], PERSON)
    _valid(got[2], PERSON)


# ChatML with Hermes' tool calls (Qwen2.5's and Qwen3's form), so the tools' format is hermes
HERMES_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n# Tools\n<tools>\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}</tools>\n"
    "For each call return <tool_call>\n{\"name\": ..., \"arguments\": ...}\n</tool_call><|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def test_grammar_forced_tool_call_in_the_hermes_format(tmp_path):
    """tool_choice required / named with a Hermes-format template: the reply is one <tool_call>
    block of an offered tool whose arguments match its schema, read back as tool_calls."""
    from conftest import write_gguf_like
    from rapidmoe_gguf import tool_calls

    path = tmp_path / "tiny-hermes.gguf"
    write_gguf_like(bundled_model_path(), path, kv={"tokenizer.chat_template": HERMES_TEMPLATE})
    with rm.Model(str(path), n_ctx=512, n_threads=2) as m:
        assert tool_calls.detect(m.tokenizer.chat_template) is tool_calls.HERMES
        for choice, names in (("required", {"get_weather", "get_time"}),
                              ({"type": "function", "function": {"name": "get_weather"}}, {"get_weather"})):
            for sampling in ({"temperature": 0}, {"temperature": 1.0, "seed": 6}):
                r = m.create_chat_completion([{"role": "user", "content": "Weather in Paris?"}], max_tokens=120,
                                             tools=[WEATHER, TIME], tool_choice=choice, parallel_tool_calls=False,
                                             **sampling)["choices"][0]
                assert r["finish_reason"] == "tool_calls", r
                (call,) = r["message"]["tool_calls"]
                assert call["function"]["name"] in names
                tool = {"get_weather": WEATHER, "get_time": TIME}[call["function"]["name"]]
                _valid(call["function"]["arguments"], tool["function"]["parameters"])

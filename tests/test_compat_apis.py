"""Anthropic's Messages API and OpenAI's Responses API (rapidmoe_gguf.compat_apis): the translation
both ways without a server, checked by the official clients' own types, then the server on the
bundled model with the official `anthropic` and `openai` clients."""

from __future__ import annotations

import json

import httpx
import pytest

import rapidmoe_gguf as rm
from rapidmoe_gguf import chat, compat_apis as compat
from rapidmoe_gguf.bundled import bundled_model_path
from rapidmoe_gguf.scheduler import End
from rapidmoe_gguf.server import ApiError
from test_server import running

anthropic = pytest.importorskip("anthropic")
openai = pytest.importorskip("openai")

WEATHER = {"name": "get_weather", "description": "The weather in a city.",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
FUNCTION = {"type": "function", "name": "get_weather", "description": "The weather in a city.",
            "parameters": WEATHER["input_schema"]}
QUESTION = "What is the weather in Paris?"
GREEDY = {"temperature": 0}     # sampling fields this anthropic client does not take as arguments
USAGE = {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12}


def _chunks(deltas: list[dict], finish: str) -> list[dict]:
    """Chat chunks as the scheduler sends them: the role, the deltas, the finish reason."""
    head = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 0, "model": "m"}
    return [dict(head, choices=[{"index": 0, "delta": d, "logprobs": None, "finish_reason": f}])
            for d, f in [({"role": "assistant"}, None)] + [(d, None) for d in deltas] + [({}, finish)]]


CALL_DELTAS = [{"content": "Let me check."},
               {"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                "function": {"name": "get_weather", "arguments": ""}}]},
               {"tool_calls": [{"index": 0, "function": {"arguments": '{"city": "Paris"}'}}]}]


class _Req:
    """What the answers read of a GenRequest."""
    prompt_ids = [1] * 7
    sampling = rm.SamplingParams(temperature=0.0)


def _sse_data(events: list[str]) -> list[tuple[str, dict]]:
    out = []
    for e in events:
        name, data = e.split("\n")[:2]
        assert name.startswith("event: ") and data.startswith("data: ") and e.endswith("\n\n")
        out.append((name[len("event: "):], json.loads(data[len("data: "):])))
    return out


# ---------------------------------------------------------------------------------------------
# Translation, without a server
# ---------------------------------------------------------------------------------------------

def test_compat_messages_request_becomes_chat():
    body = {"model": "m", "max_tokens": 20, "system": [{"type": "text", "text": "Be brief."}],
            "stop_sequences": ["\n\n"], "temperature": 0, "top_k": 4, "metadata": {"user_id": "u"},
            "thinking": {"type": "disabled"}, "tools": [WEATHER],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
            "messages": [{"role": "user", "content": QUESTION},
                         {"role": "assistant", "content": [
                             {"type": "thinking", "thinking": "...", "signature": "s"},
                             {"type": "text", "text": "Checking."},
                             {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
                         {"role": "user", "content": [
                             {"type": "tool_result", "tool_use_id": "toolu_1",
                              "content": [{"type": "text", "text": "21 degrees"}]},
                             {"type": "text", "text": "And tomorrow?"}]}]}
    assert compat.messages_body(body) == {
        "model": "m", "max_tokens": 20, "temperature": 0, "top_k": 4, "stop": ["\n\n"],
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": QUESTION},
                     {"role": "assistant", "content": "Checking.", "tool_calls": [
                         {"id": "toolu_1", "type": "function",
                          "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
                     {"role": "tool", "tool_call_id": "toolu_1", "content": "21 degrees"},
                     {"role": "user", "content": "And tomorrow?"}],
        "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER["input_schema"],
                                                    "description": "The weather in a city."}}],
        "tool_choice": "required", "parallel_tool_calls": False,
        "chat_template_kwargs": {"enable_thinking": False}}
    assert compat.messages_body({"messages": [], "tool_choice": {"type": "tool", "name": "f"}},
                                counting=True)["tool_choice"] == {"type": "function", "function": {"name": "f"}}


@pytest.mark.parametrize("body, param", [
    ({"messages": []}, "max_tokens"),
    ({"max_tokens": 0, "messages": []}, "max_tokens"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": ""}}]}]},
     "messages[0].content[0]"),
    ({"max_tokens": 5, "messages": [{"role": "system", "content": "x"}]}, "messages[0].role"),
    ({"max_tokens": 5, "messages": [], "tools": [{"type": "web_search_20250305", "name": "web_search"}]},
     "tools[0].type"),
    ({"max_tokens": 5, "messages": [], "tools": [{"name": "f"}]}, "tools[0].input_schema"),
    ({"max_tokens": 5, "messages": [], "tool_choice": {"type": "sometimes"}}, "tool_choice.type"),
])
def test_compat_messages_request_errors_name_the_field(body, param):
    with pytest.raises(ApiError) as e:
        compat.messages_body(body)
    assert e.value.status == 400 and e.value.param == param and e.value.message


def test_compat_responses_request_becomes_chat():
    body = {"model": "m", "instructions": "Be brief.", "max_output_tokens": 30, "store": True,
            "tools": [FUNCTION], "tool_choice": {"type": "function", "name": "get_weather"},
            "parallel_tool_calls": False, "reasoning": {"effort": "low"},
            "input": [{"role": "user", "content": [{"type": "input_text", "text": QUESTION}]},
                      {"type": "function_call", "call_id": "call_1", "name": "get_weather",
                       "arguments": '{"city": "Paris"}'},
                      {"type": "function_call_output", "call_id": "call_1", "output": "21 degrees"},
                      {"type": "message", "role": "assistant",
                       "content": [{"type": "output_text", "text": "It is 21 degrees."}]},
                      {"role": "developer", "content": "Answer in French."}]}
    assert compat.responses_body(body) == {
        "model": "m", "max_tokens": 30, "parallel_tool_calls": False, "reasoning_effort": "low",
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": QUESTION},
                     {"role": "assistant", "content": "", "tool_calls": [
                         {"id": "call_1", "type": "function",
                          "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
                     {"role": "tool", "tool_call_id": "call_1", "content": "21 degrees"},
                     {"role": "assistant", "content": "It is 21 degrees."},
                     {"role": "developer", "content": "Answer in French."}],
        "tools": [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
                                                    "parameters": WEATHER["input_schema"]}}],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}
    assert compat.responses_body({"input": "hi"})["messages"] == [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("body, param", [
    ({"input": "hi", "previous_response_id": "resp_1"}, "previous_response_id"),
    ({}, "input"),
    ({"input": "hi", "tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input[0].content[0]"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type"),
    ({"input": "hi", "text": {"format": {"type": "grammar"}}}, "text.format"),
])
def test_compat_responses_request_errors_name_the_field(body, param):
    with pytest.raises(ApiError) as e:
        compat.responses_body(body)
    assert e.value.status == 400 and e.value.param == param and e.value.message


def test_compat_messages_answer_validates_as_anthropic_types():
    from anthropic.types import Message, RawMessageStreamEvent
    from pydantic import TypeAdapter

    chunks = _chunks(CALL_DELTAS, "tool_calls")
    whole = Message.model_validate(compat.MessagesAnswer(_Req()).whole(chunks, End(usage=USAGE)))
    assert whole.id.startswith("msg_") and whole.stop_reason == "tool_use" and whole.stop_sequence is None
    assert whole.content[0].text == "Let me check."
    assert (whole.content[1].id, whole.content[1].name, whole.content[1].input) == \
        ("call_1", "get_weather", {"city": "Paris"})
    assert (whole.usage.input_tokens, whole.usage.output_tokens) == (7, 5)

    answer = compat.MessagesAnswer(_Req())
    events = _sse_data([e for c in chunks + [End(usage=USAGE)] for e in answer.events(c)])
    adapter = TypeAdapter(RawMessageStreamEvent)
    for name, data in events:
        assert adapter.validate_python(data).type == name
    assert [n for n, _ in events] == ["message_start", "content_block_start", "content_block_delta",
                                      "content_block_stop", "content_block_start", "content_block_delta",
                                      "content_block_stop", "message_delta", "message_stop"]
    assert events[-2][1]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert events[5][1]["delta"] == {"type": "input_json_delta", "partial_json": '{"city": "Paris"}'}

    text = _chunks([{"content": "Hi"}], "stop")
    assert compat.MessagesAnswer(_Req()).whole(text, End(usage=USAGE, stop="\n\n"))["stop_reason"] == "stop_sequence"
    assert compat.MessagesAnswer(_Req()).whole(text, End(usage=USAGE))["stop_reason"] == "end_turn"
    length = _chunks([{"content": "Hi"}], "length")
    assert compat.MessagesAnswer(_Req()).whole(length, End(usage=USAGE))["stop_reason"] == "max_tokens"
    error = compat.MessagesAnswer(_Req()).events(End(error=ApiError(400, "bad")))
    assert _sse_data(error) == [("error", {"type": "error", "error": {"type": "invalid_request_error",
                                                                      "message": "bad"}})]


def test_compat_responses_answer_validates_as_openai_types():
    from openai.types.responses import Response, ResponseStreamEvent
    from pydantic import TypeAdapter

    body = {"input": QUESTION, "tools": [FUNCTION], "max_output_tokens": 10}
    chunks = _chunks(CALL_DELTAS, "tool_calls")
    whole = Response.model_validate(compat.ResponsesAnswer(_Req(), body).whole(chunks, End(usage=USAGE)))
    assert whole.id.startswith("resp_") and whole.status == "completed" and whole.output_text == "Let me check."
    call = whole.output[1]
    assert (call.type, call.call_id, call.name, json.loads(call.arguments)) == \
        ("function_call", "call_1", "get_weather", {"city": "Paris"})
    assert (whole.usage.input_tokens, whole.usage.output_tokens, whole.usage.total_tokens) == (7, 5, 12)

    answer = compat.ResponsesAnswer(_Req(), body)
    events = _sse_data([e for c in chunks + [End(usage=USAGE)] for e in answer.events(c)])
    adapter = TypeAdapter(ResponseStreamEvent)
    for n, (name, data) in enumerate(events):
        assert adapter.validate_python(data).type == name and data["sequence_number"] == n
    assert [n for n, _ in events] == [
        "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.done", "response.content_part.done",
        "response.output_item.done", "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    streamed = [dict(item, id=None) for item in events[-1][1]["response"]["output"]]     # ids are new each time
    assert streamed == [dict(item, id=None) for item in whole.model_dump(mode="json", exclude_unset=True)["output"]]

    short = Response.model_validate(compat.ResponsesAnswer(_Req(), body).whole(
        _chunks([{"content": "Hi"}], "length"), End(usage=USAGE)))
    assert short.status == "incomplete" and short.incomplete_details.reason == "max_output_tokens"


# ---------------------------------------------------------------------------------------------
# The server, with the official clients
# ---------------------------------------------------------------------------------------------

KEY = "sk-test"


@pytest.fixture(scope="module")
def served():
    with running(rm.Model(bundled_model_path(), n_ctx=512, n_threads=2), parallel=2, queue=8,
                 api_key=KEY) as (url, _):
        yield url


@pytest.fixture(scope="module")
def claude(served):
    return anthropic.Anthropic(base_url=served, api_key=KEY, max_retries=0)


@pytest.fixture(scope="module")
def oai(served):
    return openai.OpenAI(base_url=served + "/v1", api_key=KEY, max_retries=0)


@pytest.fixture(scope="module")
def local():
    with rm.Model(bundled_model_path(), n_ctx=512, n_threads=2) as m:
        yield m


def test_compat_messages_text_reply(claude, local):
    messages = [{"role": "user", "content": QUESTION}]
    r = claude.messages.create(model="tiny-moe", max_tokens=24, messages=messages, extra_body=GREEDY,
                               system="You answer briefly.")
    chat_messages = [{"role": "system", "content": "You answer briefly."}] + messages
    want = local.create_chat_completion(chat_messages, max_tokens=24, temperature=0)
    assert r.type == "message" and r.role == "assistant" and r.id.startswith("msg_")
    assert r.content[0].type == "text" and r.content[0].text == want["choices"][0]["message"]["content"] != ""
    assert r.stop_reason == {"stop": "end_turn", "length": "max_tokens"}[want["choices"][0]["finish_reason"]]
    assert r.usage.input_tokens == want["usage"]["prompt_tokens"]
    assert r.usage.output_tokens == want["usage"]["completion_tokens"]
    counted = claude.messages.count_tokens(model="tiny-moe", messages=messages, system="You answer briefly.")
    assert counted.input_tokens == r.usage.input_tokens

    with claude.messages.stream(model="tiny-moe", max_tokens=24, messages=messages, extra_body=GREEDY,
                                system="You answer briefly.") as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == r.content[0].text
    assert (final.stop_reason, final.usage.output_tokens) == (r.stop_reason, r.usage.output_tokens)

    short = claude.messages.create(model="tiny-moe", max_tokens=2, messages=messages, extra_body=GREEDY)
    assert short.stop_reason == "max_tokens" and short.usage.output_tokens == 2
    first = want["choices"][0]["message"]["content"]
    stop = first[len(first) // 2:][:3]         # text the greedy reply holds: generation stops before it
    cut = claude.messages.create(model="tiny-moe", max_tokens=24, messages=messages, extra_body=GREEDY,
                                 system="You answer briefly.", stop_sequences=[stop])
    assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == stop
    assert cut.content[0].text == first[:first.index(stop)]


def test_compat_messages_tools_and_history(claude):
    messages = [{"role": "user", "content": QUESTION}]
    for choice in ({"type": "auto"}, {"type": "any"}, {"type": "tool", "name": "get_weather"}, {"type": "none"}):
        r = claude.messages.create(model="tiny-moe", max_tokens=24, messages=messages, extra_body={"temperature": 0.8},
                                   tools=[WEATHER], tool_choice=choice)
        for block in r.content:
            assert block.type == "text" or (block.type == "tool_use" and block.name == "get_weather")
        assert r.stop_reason in ("end_turn", "max_tokens", "tool_use")
    history = messages + [
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                           "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "21 degrees"}]}]
    r = claude.messages.create(model="tiny-moe", max_tokens=8, messages=history, tools=[WEATHER])
    assert r.content and r.usage.output_tokens > 0


def test_compat_messages_errors(claude, served):
    messages = [{"role": "user", "content": QUESTION}]
    with pytest.raises(anthropic.BadRequestError) as e:
        claude.messages.create(model="tiny-moe", messages=messages, max_tokens=None, timeout=30)  # type: ignore
    assert e.value.body == {"type": "error", "error": {"type": "invalid_request_error",
                                                       "message": "'max_tokens' is required"}}
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    with pytest.raises(anthropic.BadRequestError, match=r"messages\[0\]\.content\[0\]"):
        claude.messages.create(model="tiny-moe", max_tokens=4, messages=[{"role": "user", "content": [image]}])
    with pytest.raises(anthropic.BadRequestError, match=r"tools\[0\]\.name"):
        claude.messages.create(model="tiny-moe", max_tokens=4, messages=messages,
                               tools=[dict(WEATHER, name="a b")])
    with pytest.raises(anthropic.NotFoundError) as e:
        claude.messages.create(model="no-such-model", max_tokens=4, messages=messages)
    assert e.value.body["error"]["type"] == "not_found_error"
    bad = anthropic.Anthropic(base_url=served, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as e:
        bad.messages.create(model="tiny-moe", max_tokens=4, messages=messages)
    assert e.value.status_code == 401 and e.value.body["type"] == "error"
    assert e.value.body["error"]["type"] == "authentication_error"
    r = httpx.post(served + "/v1/messages", content=b"{}", headers={"x-api-key": KEY, "content-type": "text/plain"})
    assert r.status_code == 415 and r.json()["type"] == "error"


def test_compat_responses_text_reply(oai, local):
    r = oai.responses.create(model="tiny-moe", input=QUESTION, instructions="You answer briefly.",
                             max_output_tokens=24, temperature=0, store=True)
    want = local.create_chat_completion([{"role": "system", "content": "You answer briefly."},
                                         {"role": "user", "content": QUESTION}], max_tokens=24, temperature=0)
    assert r.object == "response" and r.id.startswith("resp_") and r.output[0].type == "message"
    assert r.output_text == want["choices"][0]["message"]["content"] != ""
    assert r.status == {"stop": "completed", "length": "incomplete"}[want["choices"][0]["finish_reason"]]
    assert (r.usage.input_tokens, r.usage.output_tokens) == (want["usage"]["prompt_tokens"],
                                                             want["usage"]["completion_tokens"])
    events = list(oai.responses.create(model="tiny-moe", input=QUESTION, instructions="You answer briefly.",
                                       max_output_tokens=24, temperature=0, stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].type == "response.created" and events[-1].type in ("response.completed", "response.incomplete")
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == r.output_text
    assert events[-1].response.output_text == r.output_text

    short = oai.responses.create(model="tiny-moe", input=QUESTION, max_output_tokens=2, temperature=0)
    assert short.status == "incomplete" and short.incomplete_details.reason == "max_output_tokens"
    assert short.usage.output_tokens == 2


def test_compat_responses_tools_and_history(oai):
    for choice in ("auto", "required", {"type": "function", "name": "get_weather"}, "none"):
        r = oai.responses.create(model="tiny-moe", input=QUESTION, tools=[FUNCTION], tool_choice=choice,
                                 max_output_tokens=24, temperature=0.8)
        for item in r.output:
            assert item.type == "message" or (item.type == "function_call" and item.name == "get_weather"
                                              and isinstance(json.loads(item.arguments), dict))
    history = [{"role": "user", "content": QUESTION},
               {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
               {"type": "function_call_output", "call_id": "call_1", "output": "21 degrees"}]
    r = oai.responses.create(model="tiny-moe", input=history, tools=[FUNCTION], max_output_tokens=8)
    assert r.output and r.usage.output_tokens > 0


def test_compat_responses_errors(oai):
    with pytest.raises(openai.BadRequestError) as e:
        oai.responses.create(model="tiny-moe", input="hi", previous_response_id="resp_1")
    assert e.value.body["param"] == "previous_response_id"
    with pytest.raises(openai.BadRequestError) as e:
        oai.responses.create(model="tiny-moe", input="hi", tools=[{"type": "web_search"}])
    assert e.value.body["param"] == "tools[0].type"
    with pytest.raises(openai.BadRequestError) as e:
        oai.responses.create(model="tiny-moe", input="hi", max_output_tokens=-1)
    assert e.value.body["param"] == "max_output_tokens"
    bad = openai.OpenAI(base_url=oai.base_url, api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.responses.create(model="tiny-moe", input="hi")


THINK_DELTAS = [{"reasoning_content": "The user wants "}, {"reasoning_content": "the weather."},
                {"content": "Let me check."}]


def test_compat_reasoning_as_thinking_blocks_and_reasoning_items():
    """A reply's reasoning_content comes first: as a thinking block (Messages) and a reasoning
    item (Responses), whole and streamed, each valid for the official clients' types; a
    reasoning item sent back as input is dropped, as templates drop earlier reasoning."""
    from anthropic.types import Message, RawMessageStreamEvent
    from openai.types.responses import Response, ResponseStreamEvent
    from pydantic import TypeAdapter

    chunks = _chunks(THINK_DELTAS, "stop")
    whole = Message.model_validate(compat.MessagesAnswer(_Req()).whole(chunks, End(usage=USAGE)))
    assert [b.type for b in whole.content] == ["thinking", "text"]
    assert whole.content[0].thinking == "The user wants the weather." and whole.content[1].text == "Let me check."
    answer = compat.MessagesAnswer(_Req())
    events = _sse_data([e for c in chunks + [End(usage=USAGE)] for e in answer.events(c)])
    adapter = TypeAdapter(RawMessageStreamEvent)
    for name, data in events:
        assert adapter.validate_python(data).type == name
    thinking = [d["delta"]["thinking"] for n, d in events if n == "content_block_delta"
                and d["delta"]["type"] == "thinking_delta"]
    assert "".join(thinking) == "The user wants the weather."

    body = {"input": QUESTION}
    resp = Response.model_validate(compat.ResponsesAnswer(_Req(), body).whole(chunks, End(usage=USAGE)))
    assert [o.type for o in resp.output] == ["reasoning", "message"]
    assert resp.output[0].content[0].text == "The user wants the weather." and resp.output_text == "Let me check."
    answer = compat.ResponsesAnswer(_Req(), body)
    events = _sse_data([e for c in chunks + [End(usage=USAGE)] for e in answer.events(c)])
    adapter = TypeAdapter(ResponseStreamEvent)
    for n, (name, data) in enumerate(events):
        assert adapter.validate_python(data).type == name and data["sequence_number"] == n
    assert "".join(d["delta"] for n, d in events if n == "response.reasoning_text.delta") == \
        "The user wants the weather."
    again = compat.responses_body({"input": [{"role": "user", "content": QUESTION},
                                             resp.output[0].model_dump(mode="json", exclude_none=True),
                                             {"role": "user", "content": "And?"}]})
    assert again["messages"] == [{"role": "user", "content": QUESTION}, {"role": "user", "content": "And?"}]


def test_compat_lone_surrogates_name_this_apis_field(served):
    """A lone surrogate escape is a 400 naming the field as this API spells it, in its error shape."""
    headers = {"x-api-key": KEY, "content-type": "application/json"}
    body = b'{"model": "tiny-moe", "max_tokens": 4, "messages": [{"role": "user", "content": "a\\ud800b"}]}'
    r = httpx.post(served + "/v1/messages", content=body, headers=headers)
    assert r.status_code == 400 and r.json()["type"] == "error"
    assert "'messages[0].content' holds a lone surrogate" in r.json()["error"]["message"]
    body = b'{"model": "tiny-moe", "input": [{"role": "user", "content": "a\\udfffb"}]}'
    r = httpx.post(served + "/v1/responses", content=body, headers=headers)
    assert r.status_code == 400 and r.json()["error"]["param"] == "input[0].content"

"""Two more APIs on the server's chat path: Anthropic's Messages API and OpenAI's Responses API.

Each request is translated into a chat completions body and checked, rendered and scheduled as one
(server.parse_request, the scheduler); the reply's chat chunks are translated back. So the limits,
the sampling fields and the tool-call formats are the chat endpoint's, and a field's error names
this API's field where the translation knows it.

    POST /v1/messages               Anthropic's Messages API: system, messages with text, tool_use and
                                    tool_result blocks, tools, tool_choice, stop_sequences, thinking
                                    (its type sets the template variable enable_thinking); streamed as
                                    Anthropic's events. Errors as Anthropic's {"type": "error", ...}.
    POST /v1/messages/count_tokens  {"input_tokens": N}: the request's prompt as it would be generated.
    POST /v1/responses              OpenAI's Responses API, stateless: input as a string or items
                                    (messages, function_call, function_call_output), instructions,
                                    function tools; streamed as its response.* events. ``store`` is
                                    accepted but nothing is kept, so previous_response_id, conversation
                                    and item references are refused.

Images, documents, audio and hosted tools are refused with 400 naming the field: the server reads
text only, and calls only the client's own functions.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
import uuid
from typing import Any, Callable

from starlette.responses import JSONResponse, Response

from .scheduler import End
from .api_base import Answer, ApiError, GenRequest, _check_text, api_error

Parse = Callable[[dict], GenRequest]     # a chat completions body -> its GenRequest (server.parse_request)


def _id(prefix: str) -> str:
    return prefix + uuid.uuid4().hex[:24]


def _sse(event: str, data: dict) -> str:
    """A server-sent event with its name, as both APIs send them."""
    return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


def _object(value: Any, where: str) -> dict:
    if not isinstance(value, dict):
        raise ApiError(400, f"'{where}' must be an object", param=where, code="invalid_type")
    return value


def _list(value: Any, where: str) -> list:
    if not isinstance(value, list):
        raise ApiError(400, f"'{where}' must be an array", param=where, code="invalid_type")
    return value


def _string(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise ApiError(400, f"'{where}' must be a string", param=where, code="invalid_type")
    return value


def _unsupported(where: str, what: str) -> ApiError:
    return ApiError(400, f"'{where}': {what}", param=where, code="unsupported_parameter")


def _copy(body: dict, names: dict[str, str]) -> dict:
    """The fields of body that are given (not null), renamed: this API's name -> chat's."""
    return {chat: body[name] for name, chat in names.items() if body.get(name) is not None}


@dataclasses.dataclass(frozen=True)
class Api:
    """An API translated to and from the chat path: ``body`` turns its request into a chat
    completions body, ``params`` renames chat's fields to its own in errors, and ``answer`` makes
    the server.Answer that shapes the reply from the request and its body (None: the API
    generates nothing)."""

    body: Callable[[Any], dict]
    params: dict[str, str]
    answer: Callable[[GenRequest, dict], Answer] | None

    def request(self, body: Any, parse: Parse) -> GenRequest:
        """The GenRequest of an API request body, through ``parse`` (server.parse_request for chat).
        Chat's errors are put in this API's terms: its field names, and a tool's fields at the
        tool's top level, where both APIs have them."""
        _check_text(body)        # a lone surrogate is named by this API's field, before translation
        try:
            return parse(self.body(body))
        except ApiError as exc:
            exc.param = self.params.get(exc.param, exc.param)
            exc.message = re.sub(r"(tools\[\d+\])\.function\b", r"\1", exc.message)
            raise


def _call(call_id: str, name: str, arguments: str) -> dict:
    """An assistant turn's tool call, in chat's shape."""
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


# ---------------------------------------------------------------------------------------------
# A reply as blocks
# ---------------------------------------------------------------------------------------------

class Blocks:
    """A reply's chat deltas as the blocks both APIs answer with, in order: its reasoning, text,
    and tool calls ({"type": "reasoning", "text"}, {"type": "text", "text"} or {"type": "call", "id",
    "name", "arguments"}). ``feed`` gives what
    happened: ("start", i), ("delta", i, text) and ("stop", i) for block i; the last block stays
    open until the next starts or ``close``."""

    def __init__(self):
        self.blocks: list[dict] = []
        self.finish: str | None = None       # the chat finish_reason, once a chunk has given it
        self._open = False

    def chunk(self, chunk: dict) -> list[tuple]:
        """``feed`` of a chat chunk's delta; a chunk with a finish reason also closes the last block."""
        if not chunk["choices"]:
            return []
        out = self.feed(chunk["choices"][0]["delta"])
        if chunk["choices"][0]["finish_reason"] is not None:
            self.finish = chunk["choices"][0]["finish_reason"]
            out += self.close()
        return out

    def feed(self, delta: dict) -> list[tuple]:
        out: list[tuple] = []
        for key, kind in (("reasoning_content", "reasoning"), ("content", "text")):
            if delta.get(key):
                if not self._open or self.blocks[-1]["type"] != kind:
                    out += self._start({"type": kind, "text": ""})
                self.blocks[-1]["text"] += delta[key]
                out.append(("delta", len(self.blocks) - 1, delta[key]))
        for tc in delta.get("tool_calls", ()):
            if "id" in tc:                         # a call's first delta: its id and name
                out += self._start({"type": "call", "id": tc["id"], "name": tc["function"]["name"],
                                    "arguments": ""})
            arguments = tc["function"].get("arguments")
            if arguments:
                self.blocks[-1]["arguments"] += arguments
                out.append(("delta", len(self.blocks) - 1, arguments))
        return out

    def close(self) -> list[tuple]:
        if not self._open:
            return []
        self._open = False
        return [("stop", len(self.blocks) - 1)]

    def _start(self, block: dict) -> list[tuple]:
        out = self.close()
        self.blocks.append(block)
        self._open = True
        return out + [("start", len(self.blocks) - 1)]


# ---------------------------------------------------------------------------------------------
# Anthropic's Messages API
# ---------------------------------------------------------------------------------------------

# HTTP status -> Anthropic's error type
_ANTHROPIC_ERRORS = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                     404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
                     500: "api_error", 503: "overloaded_error"}


def anthropic_error_body(err: ApiError) -> dict:
    kind = _ANTHROPIC_ERRORS.get(err.status, "api_error" if err.status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": err.message}}


def anthropic_error(err: ApiError) -> Response:
    """An error as Anthropic's API answers it."""
    return JSONResponse(anthropic_error_body(err), status_code=err.status, headers=err.headers)


def _text_blocks(blocks: Any, where: str) -> str:
    """The text of a string, or of a list of text blocks."""
    if isinstance(blocks, str):
        return blocks
    texts = []
    for j, block in enumerate(_list(blocks, where)):
        block = _object(block, f"{where}[{j}]")
        if block.get("type") != "text":
            raise _unsupported(f"{where}[{j}]", f"{_shown_type(block)} blocks are not supported here "
                               "(this server reads text only)")
        texts.append(_string(block.get("text"), f"{where}[{j}].text"))
    return "".join(texts)


def _shown_type(block: dict) -> str:
    return json.dumps(block.get("type"))[:40]


def _anthropic_message(i: int, message: Any) -> list[dict]:
    """One Messages API message as chat messages: a user turn's tool_result blocks become tool
    messages (in their place among its text), an assistant turn's tool_use blocks its tool_calls.
    Thinking blocks are the model's earlier reasoning, which templates drop: so are they here."""
    where = f"messages[{i}]"
    message = _object(message, where)
    role = message.get("role")
    if role not in ("user", "assistant"):
        raise ApiError(400, f"'{where}.role' must be \"user\" or \"assistant\", got {json.dumps(role)[:40]}",
                       param=f"{where}.role")
    content = message.get("content")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    out: list[dict] = []
    text: list[str] = []                     # the text blocks since the last tool result
    calls: list[dict] = []
    for j, block in enumerate(_list(content, f"{where}.content")):
        at = f"{where}.content[{j}]"
        block = _object(block, at)
        kind = block.get("type")
        if kind == "text":
            text.append(_string(block.get("text"), f"{at}.text"))
        elif kind == "tool_use" and role == "assistant":
            name = _string(block.get("name"), f"{at}.name")
            arguments = json.dumps(_object(block.get("input", {}), f"{at}.input"), ensure_ascii=False)
            calls.append(_call(_string(block.get("id"), f"{at}.id"), name, arguments))
        elif kind == "tool_result" and role == "user":
            if text:
                out.append({"role": "user", "content": "".join(text)})
                text = []
            result = block.get("content", "")
            out.append({"role": "tool", "tool_call_id": _string(block.get("tool_use_id"), f"{at}.tool_use_id"),
                        "content": _text_blocks(result, f"{at}.content")})
        elif kind in ("thinking", "redacted_thinking") and role == "assistant":
            continue
        else:
            raise _unsupported(at, f"{_shown_type(block)} blocks are not supported in a {role} message "
                               "(this server reads text, tool_use and tool_result blocks)")
    if role == "assistant":
        turn = {"role": "assistant", "content": "".join(text)}
        return [dict(turn, tool_calls=calls) if calls else turn]
    if text or not out:
        out.append({"role": "user", "content": "".join(text)})
    return out


def _anthropic_tools(tools: Any) -> list[dict]:
    out = []
    for i, tool in enumerate(_list(tools, "tools")):
        where = f"tools[{i}]"
        tool = _object(tool, where)
        if tool.get("type") not in (None, "custom"):
            raise _unsupported(f"{where}.type", f"{_shown_type(tool)} tools are server tools, which this server "
                               "does not have; give custom tools ({name, description, input_schema})")
        function = {"name": tool.get("name"), "parameters": _object(tool.get("input_schema"), f"{where}.input_schema")}
        if tool.get("description") is not None:
            function["description"] = tool["description"]
        out.append({"type": "function", "function": function})
    return out


def _anthropic_tool_choice(choice: Any) -> tuple[Any, bool | None]:
    """tool_choice as chat's, and its disable_parallel_tool_use as parallel_tool_calls."""
    choice = _object(choice, "tool_choice")
    kind = choice.get("type")
    parallel = None if choice.get("disable_parallel_tool_use") is None else not choice["disable_parallel_tool_use"]
    if kind == "tool":
        return {"type": "function", "function": {"name": _string(choice.get("name"), "tool_choice.name")}}, parallel
    chat_choice = {"auto": "auto", "any": "required", "none": "none"}.get(kind)
    if chat_choice is None:
        raise ApiError(400, f"'tool_choice.type' must be auto, any, tool or none, got {json.dumps(kind)[:40]}",
                       param="tool_choice.type")
    return chat_choice, parallel


def messages_body(body: Any, counting: bool = False) -> dict:
    """A Messages API request body as a chat completions body (``counting``: count_tokens', which
    has no max_tokens and generates nothing). Raises ApiError."""
    body = _object(body, "body")
    chat = _copy(body, {"model": "model", "temperature": "temperature", "top_p": "top_p", "top_k": "top_k",
                        "stream": "stream", "stop_sequences": "stop"})
    if counting:
        chat["max_tokens"] = 0
    else:
        n = body.get("max_tokens")
        if n is None:
            raise ApiError(400, "'max_tokens' is required", param="max_tokens", code="missing_required_parameter")
        if isinstance(n, int) and not isinstance(n, bool) and n < 1:   # its type: parse_request checks it
            raise ApiError(400, f"'max_tokens' must be >= 1, got {n}", param="max_tokens")
        chat["max_tokens"] = n
    messages = [] if body.get("system") is None else [{"role": "system",
                                                       "content": _text_blocks(body["system"], "system")}]
    for i, message in enumerate(_list(body.get("messages"), "messages")):
        messages += _anthropic_message(i, message)
    chat["messages"] = messages
    if body.get("tools") is not None:
        chat["tools"] = _anthropic_tools(body["tools"])
    if body.get("tool_choice") is not None:
        chat["tool_choice"], parallel = _anthropic_tool_choice(body["tool_choice"])
        if parallel is not None:
            chat["parallel_tool_calls"] = parallel
    if body.get("thinking") is not None:
        thinking = _object(body["thinking"], "thinking").get("type")
        if thinking in ("enabled", "disabled"):       # adaptive: the template's own default
            chat["chat_template_kwargs"] = {"enable_thinking": thinking == "enabled"}
    return chat


# chat's field -> the Messages API's, for errors
_MESSAGES_PARAMS = {"stop": "stop_sequences"}


class MessagesAnswer:
    """A reply as a Messages API message, or its stream of events."""

    def __init__(self, req: GenRequest):
        self.req = req
        self.id = _id("msg_")
        self.blocks = Blocks()
        self._model = ""
        self._started = False                # message_start sent

    def _head(self, chunk: dict) -> dict:
        self._model = chunk["model"]
        return {"id": self.id, "type": "message", "role": "assistant", "model": self._model, "content": [],
                "stop_reason": None, "stop_sequence": None,
                "usage": {"input_tokens": len(self.req.prompt_ids), "output_tokens": 0}}

    def _stop(self, end: End) -> tuple[str, str | None]:
        """stop_reason and stop_sequence."""
        if self.blocks.finish == "tool_calls":
            return "tool_use", None
        if self.blocks.finish == "length":
            return "max_tokens", None
        return ("stop_sequence", end.stop) if end.stop is not None else ("end_turn", None)

    def whole(self, chunks: list[dict], end: End) -> dict:
        message = self._head(chunks[0])
        for c in chunks:
            self.blocks.chunk(c)
        content = [_anthropic_block(b) for b in self.blocks.blocks]
        stop_reason, stop_sequence = self._stop(end)
        return {**message, "content": content, "stop_reason": stop_reason, "stop_sequence": stop_sequence,
                "usage": {"input_tokens": end.usage["prompt_tokens"], "output_tokens": end.usage["completion_tokens"]}}

    def events(self, item: dict | End) -> list[str]:
        if isinstance(item, End):
            if item.error is not None:
                return [_sse("error", anthropic_error_body(api_error(item.error)))]
            if item.cancelled:
                return []
            stop_reason, stop_sequence = self._stop(item)
            return [_sse("message_delta", {"type": "message_delta",
                                           "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                                           "usage": {"output_tokens": item.usage["completion_tokens"]}}),
                    _sse("message_stop", {"type": "message_stop"})]
        out = []
        if not self._started:
            self._started = True
            out.append(_sse("message_start", {"type": "message_start", "message": self._head(item)}))
        for what, i, *text in self.blocks.chunk(item):
            block = self.blocks.blocks[i]
            if what == "start":
                start = {"text": {"type": "text", "text": ""}, "reasoning": _thinking("")}.get(block["type"]) or \
                    {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
                out.append(_sse("content_block_start", {"type": "content_block_start", "index": i,
                                                        "content_block": start}))
            elif what == "delta":
                delta = {"text": {"type": "text_delta", "text": text[0]},
                         "reasoning": {"type": "thinking_delta", "thinking": text[0]}}.get(block["type"]) or \
                    {"type": "input_json_delta", "partial_json": text[0]}
                out.append(_sse("content_block_delta", {"type": "content_block_delta", "index": i, "delta": delta}))
            else:
                if block["type"] == "reasoning":     # a thinking block ends with its signature (none here)
                    out.append(_sse("content_block_delta", {"type": "content_block_delta", "index": i,
                                                            "delta": {"type": "signature_delta", "signature": ""}}))
                out.append(_sse("content_block_stop", {"type": "content_block_stop", "index": i}))
        return out


def _thinking(text: str) -> dict:
    """A thinking block: the model's reasoning, unsigned (this server signs nothing, so a client
    sending it back gets it dropped from the prompt, as templates drop earlier reasoning anyway)."""
    return {"type": "thinking", "thinking": text, "signature": ""}


def _anthropic_block(block: dict) -> dict:
    if block["type"] == "text":
        return {"type": "text", "text": block["text"]}
    if block["type"] == "reasoning":
        return _thinking(block["text"])
    return {"type": "tool_use", "id": block["id"], "name": block["name"], "input": json.loads(block["arguments"])}


MESSAGES = Api(messages_body, _MESSAGES_PARAMS, lambda req, body: MessagesAnswer(req))
MESSAGES_COUNT = Api(lambda body: messages_body(body, counting=True), _MESSAGES_PARAMS, None)


# ---------------------------------------------------------------------------------------------
# OpenAI's Responses API
# ---------------------------------------------------------------------------------------------

# Fields that need state this server does not keep: field -> what it would need.
_STATEFUL = {"previous_response_id": "a stored response", "conversation": "a stored conversation"}


def _parts_text(content: Any, where: str, kinds: tuple[str, ...]) -> str:
    """A message's content: a string, or a list of text parts of ``kinds``."""
    if isinstance(content, str):
        return content
    texts = []
    for j, part in enumerate(_list(content, where)):
        part = _object(part, f"{where}[{j}]")
        if part.get("type") not in kinds:
            raise _unsupported(f"{where}[{j}]", f"{_shown_type(part)} parts are not supported (this server reads "
                               f"{' and '.join(kinds)} parts only)")
        texts.append(_string(part.get("text"), f"{where}[{j}].text"))
    return "".join(texts)


def _responses_input(items: Any) -> list[dict]:
    """Responses input items as chat messages: function_call items become the tool_calls of an
    assistant turn (the one just before them, if any), function_call_output items tool messages."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    out: list[dict] = []
    for i, item in enumerate(_list(items, "input")):
        where = f"input[{i}]"
        item = _object(item, where)
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise ApiError(400, f"'{where}.role' must be user, assistant, system or developer, got "
                               f"{json.dumps(role)[:40]}", param=f"{where}.role")
            out.append({"role": role, "content": _parts_text(item.get("content"), f"{where}.content",
                                                             ("input_text", "output_text"))})
        elif kind == "function_call":
            call = _call(_string(item.get("call_id"), f"{where}.call_id"), _string(item.get("name"), f"{where}.name"),
                         _string(item.get("arguments"), f"{where}.arguments"))
            if out and out[-1]["role"] == "assistant":
                out[-1].setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "reasoning":      # the model's earlier reasoning, which templates drop: so is it here
            continue
        elif kind == "function_call_output":
            out.append({"role": "tool", "tool_call_id": _string(item.get("call_id"), f"{where}.call_id"),
                        "content": _parts_text(item.get("output"), f"{where}.output", ("input_text",))})
        else:
            raise _unsupported(f"{where}.type", f"{json.dumps(kind)[:40]} items are not supported (this server "
                               "is stateless and reads messages, function_call, function_call_output and "
                               "reasoning items)")
    return out


def _responses_tools(tools: Any) -> list[dict]:
    out = []
    for i, tool in enumerate(_list(tools, "tools")):
        tool = _object(tool, f"tools[{i}]")
        if tool.get("type") != "function":
            raise _unsupported(f"tools[{i}].type", f"{_shown_type(tool)} tools are not supported: this server "
                               "calls function tools only")
        out.append({"type": "function", "function": {k: tool[k] for k in ("name", "description", "parameters")
                                                     if tool.get(k) is not None}})
    return out


def responses_body(body: Any) -> dict:
    """A Responses API request body as a chat completions body. Raises ApiError."""
    body = _object(body, "body")
    for name, needs in _STATEFUL.items():
        if body.get(name) is not None:
            raise _unsupported(name, f"this server keeps no state, so it has no {needs} to continue from; "
                               "send the whole conversation in 'input'")
    chat = _copy(body, {"model": "model", "temperature": "temperature", "top_p": "top_p", "stream": "stream",
                        "max_output_tokens": "max_tokens", "parallel_tool_calls": "parallel_tool_calls"})
    if body.get("input") is None:
        raise ApiError(400, "'input' is required", param="input", code="missing_required_parameter")
    messages = _responses_input(body["input"])
    if body.get("instructions") is not None:
        messages.insert(0, {"role": "system", "content": _string(body["instructions"], "instructions")})
    chat["messages"] = messages
    if body.get("tools") is not None:
        chat["tools"] = _responses_tools(body["tools"])
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        if choice.get("type") != "function":
            raise _unsupported("tool_choice", f"{_shown_type(choice)} is not supported: give auto, none, required "
                               "or {\"type\": \"function\", \"name\": ...}")
        choice = {"type": "function", "function": {"name": choice.get("name")}}
    if choice is not None:
        chat["tool_choice"] = choice
    text_format = body.get("text", {}).get("format") if isinstance(body.get("text"), dict) else None
    if isinstance(text_format, dict) and text_format.get("type") == "json_schema":
        chat["response_format"] = {"type": "json_schema", "json_schema": {
            k: text_format[k] for k in ("name", "schema", "strict") if k in text_format}}
    elif isinstance(text_format, dict) and text_format.get("type") == "json_object":
        chat["response_format"] = {"type": "json_object"}
    elif isinstance(text_format, dict) and text_format.get("type") not in (None, "text"):
        raise _unsupported("text.format", f"{_shown_type(text_format)} is not supported: give text, json_object "
                           "or json_schema")
    effort = body.get("reasoning", {}).get("effort") if isinstance(body.get("reasoning"), dict) else None
    if effort is not None:   # checked with the chat request's
        chat["reasoning_effort"] = effort
    return chat


class ResponsesAnswer:
    """A reply as a Responses API response, or its stream of events."""

    def __init__(self, req: GenRequest, body: dict):
        self.req, self.body = req, body
        self.id = _id("resp_")
        self.created = int(time.time())
        self.blocks = Blocks()
        self.item_ids: list[str] = []      # of each block's output item
        self._model = ""
        self._started = False                # response.created sent
        self._seq = 0                        # the next event's sequence_number

    @property
    def _status(self) -> str:
        return "incomplete" if self.blocks.finish == "length" else "completed"

    def response(self, end: End | None) -> dict:
        """The response object: in progress (``end`` None), or finished."""
        tools = self.body.get("tools") or []
        usage = None
        if end is not None:
            n_in, n_out = end.usage["prompt_tokens"], end.usage["completion_tokens"]
            usage = {"input_tokens": n_in, "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                     "output_tokens": n_out, "output_tokens_details": {"reasoning_tokens": 0},
                     "total_tokens": n_in + n_out}
        return {"id": self.id, "object": "response", "created_at": self.created,
                "status": "in_progress" if end is None else self._status,
                "incomplete_details": {"reason": "max_output_tokens"}
                if end is not None and self.blocks.finish == "length" else None,
                "error": None, "model": self._model,
                "output": [] if end is None else [self._item(i) for i in range(len(self.blocks.blocks))],
                "instructions": self.body.get("instructions"), "max_output_tokens": self.body.get("max_output_tokens"),
                "parallel_tool_calls": self.body.get("parallel_tool_calls") is not False,
                "temperature": self.req.sampling.temperature, "top_p": self.req.sampling.top_p,
                "tool_choice": self.body.get("tool_choice") or "auto", "tools": tools,
                "text": {"format": self._format()}, "truncation": "disabled", "store": False,
                "previous_response_id": None, "metadata": self.body.get("metadata") or {}, "usage": usage}

    def _format(self) -> dict:
        """The text format the request asked for (text.format), as the response repeats it."""
        fmt = self.body.get("text", {}).get("format") if isinstance(self.body.get("text"), dict) else None
        return fmt if isinstance(fmt, dict) and fmt.get("type") in ("json_schema", "json_object") else {"type": "text"}

    def _item(self, i: int, status: str | None = None) -> dict:
        block, status = self.blocks.blocks[i], status or self._status
        if block["type"] == "reasoning":
            return {"type": "reasoning", "id": self.item_ids[i], "summary": [], "status": status,
                    "content": [] if status == "in_progress" else [_reasoning_text(block["text"])]}
        if block["type"] == "text":
            return {"type": "message", "id": self.item_ids[i], "status": status, "role": "assistant",
                    "content": [] if status == "in_progress" else [_output_text(block["text"])]}
        return {"type": "function_call", "id": self.item_ids[i], "call_id": block["id"], "name": block["name"],
                "arguments": "" if status == "in_progress" else block["arguments"], "status": status}

    def _feed(self, chunk: dict) -> list[tuple]:
        self._model = chunk["model"]
        out = self.blocks.chunk(chunk)
        for what, i, *_ in out:
            if what == "start":
                self.item_ids.append(_id({"text": "msg_", "reasoning": "rs_"}.get(self.blocks.blocks[i]["type"], "fc_")))
        return out

    def whole(self, chunks: list[dict], end: End) -> dict:
        for c in chunks:
            self._feed(c)
        return self.response(end)

    def _event(self, kind: str, **data) -> str:
        event = {"type": kind, "sequence_number": self._seq, **data}
        self._seq += 1
        return _sse(kind, event)

    def events(self, item: dict | End) -> list[str]:
        if isinstance(item, End):
            if item.error is not None:
                err = api_error(item.error)
                return [self._event("error", code=err.code, message=err.message, param=err.param)]
            if item.cancelled:
                return []
            return [self._event("response.incomplete" if self._status == "incomplete" else "response.completed",
                                response=self.response(item))]
        out = []
        if not self._started:
            self._started, self._model = True, item["model"]
            out += [self._event("response.created", response=self.response(None)),
                    self._event("response.in_progress", response=self.response(None))]
        for what, i, *text in self._feed(item):
            block, at = self.blocks.blocks[i], {"item_id": self.item_ids[i], "output_index": i}
            text_block = block["type"] == "text"
            if what == "start":
                out.append(self._event("response.output_item.added", output_index=i,
                                       item=self._item(i, "in_progress")))
                if text_block:
                    out.append(self._event("response.content_part.added", **at, content_index=0,
                                           part=_output_text("")))
            elif what == "delta" and block["type"] == "reasoning":
                out.append(self._event("response.reasoning_text.delta", **at, content_index=0, delta=text[0]))
            elif what == "delta" and text_block:
                out.append(self._event("response.output_text.delta", **at, content_index=0, delta=text[0],
                                       logprobs=[]))
            elif what == "delta":
                out.append(self._event("response.function_call_arguments.delta", **at, delta=text[0]))
            else:
                if block["type"] == "reasoning":
                    out.append(self._event("response.reasoning_text.done", **at, content_index=0, text=block["text"]))
                elif text_block:
                    out += [self._event("response.output_text.done", **at, content_index=0, text=block["text"],
                                        logprobs=[]),
                            self._event("response.content_part.done", **at, content_index=0,
                                        part=_output_text(block["text"]))]
                else:
                    out.append(self._event("response.function_call_arguments.done", **at, name=block["name"],
                                           arguments=block["arguments"]))
                out.append(self._event("response.output_item.done", output_index=i, item=self._item(i)))
        return out


def _reasoning_text(text: str) -> dict:
    return {"type": "reasoning_text", "text": text}


def _output_text(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


RESPONSES = Api(responses_body, {"messages": "input", "max_tokens": "max_output_tokens", "response_format": "text.format"},
                ResponsesAnswer)

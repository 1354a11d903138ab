"""What every API route of the server shares: the error it answers (``ApiError``, and
``api_error`` for an exception), a checked generation request (``GenRequest``), how a generated
request is answered (``Answer``), and the check that a body's text is Unicode. rapidmoe_gguf.server
(OpenAI's routes) and rapidmoe_gguf.compat_apis (Anthropic's Messages API, OpenAI's Responses API)
both build on them."""

from __future__ import annotations

import dataclasses
import logging
import re
from typing import Any, Iterator, Protocol

from starlette.responses import JSONResponse

from . import chat, tool_calls
from .errors import (ContextFullError, DeviceError, InternalError, NoBudgetError, NoResidualError, OutOfMemoryError,
                     RapidMoEError, StateError, UnavailableError)
from .model import Model, SamplingParams
from .sampling import LogitBias
from .scheduler import End

log = logging.getLogger("rapidmoe.server")


def _printable(text: str) -> str:
    """``text`` as it can be encoded in UTF-8: a lone surrogate (which a JSON escape such as
    \\ud800 gives) written as that escape. An error message that echoes a request's string must
    not fail while the answer is encoded."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


class ApiError(Exception):
    """An error answered as OpenAI's error object (with ``headers`` besides, e.g. Connection: close)."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 type: str | None = None, headers: dict[str, str] | None = None):
        message, param = _printable(message), param and _printable(param)
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.headers = status, message, param, code, headers
        self.type = type or ("server_error" if status >= 500 else "invalid_request_error")

    def content(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.content(), status_code=self.status, headers=self.headers)


def api_error(exc: BaseException) -> ApiError:
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, ContextFullError):
        return ApiError(400, str(exc), code="context_length_exceeded")
    if isinstance(exc, NoResidualError):      # the request asked for residuals this model lacks
        return ApiError(400, str(exc), param="residual_policy", code="residual_unavailable")
    if isinstance(exc, NoBudgetError):
        return ApiError(400, str(exc), param="residual_budget")
    if isinstance(exc, UnavailableError):
        return ApiError(503, str(exc))
    if isinstance(exc, (StateError, InternalError, DeviceError, OutOfMemoryError)):
        # the server's own state (e.g. calibration on a GPU), a fault of its own, its device or
        # its memory: not the request's
        log.error("server error", exc_info=exc)
        return ApiError(500, str(exc))
    if isinstance(exc, RapidMoEError):        # InvalidArgumentError, UnsupportedError, ...
        return ApiError(400, str(exc))
    log.error("internal error", exc_info=exc)
    return ApiError(500, "internal server error; the server's log has the cause")


_SURROGATE = re.compile("[\ud800-\udfff]")


def _lone_surrogate(body: Any) -> tuple[str, str] | None:
    """The first string or key of a decoded JSON body that holds a lone surrogate, as (its path
    in OpenAI's param style, e.g. ``messages[0].content``, the surrogate); None if there is none.

    JSON may escape one (``"\\ud800"``) and json.loads keeps it, but it is not Unicode text: the
    tokenizer, the chat template and the UTF-8 encoding of an answer all fail on it. Every string
    is checked, the fields this server ignores too, so none reaches any of them. A stack, not
    recursion: the body may be nested as deeply as json.loads allows."""
    stack = [(body, "")]
    while stack:
        value, path = stack.pop()
        if isinstance(value, str):
            found = _SURROGATE.search(value)
            if found:
                return path, found.group()
        elif isinstance(value, dict):
            for key, item in reversed(value.items()):        # reversed: popped in document order
                sub = f"{path}.{key}" if path else key
                stack.append((item, sub))
                stack.append((key, sub))
        elif isinstance(value, list):
            stack.extend((item, f"{path}[{i}]") for i, item in reversed(list(enumerate(value)))
                         if isinstance(item, (str, list, dict)))
    return None


def _check_text(body: dict) -> None:
    bad = _lone_surrogate(body)
    if bad is not None:
        path, char = bad
        raise ApiError(400, f"'{path}' holds a lone surrogate (U+{ord(char):04X}), which is not Unicode "
                       "text: JSON's \\ud800-\\udfff escapes must come in pairs (send text as UTF-8)",
                       param=path, code="invalid_unicode")


@dataclasses.dataclass
class GenRequest:
    """A checked request: what the scheduler needs to generate it (``chunks``: the same through
    the Python API, on one Model)."""

    kind: str                        # "completion" or "chat"
    prompt_ids: list[int]
    max_tokens: int
    sampling: SamplingParams
    stop: list[str]
    stream: bool
    include_usage: bool
    policy: str | None
    budget: float | None
    harmony: bool = False            # a harmony model (gpt-oss): the reply is the final channel
    show_reasoning: bool = False     # and the analysis channel comes as reasoning_content
    logprobs: int | None = None      # top tokens reported with each generated token's logprob; None: no logprobs
    logit_bias: LogitBias | None = None
    text_offset: int = 0             # the legacy logprobs' offset of the completion's text (the prompt's length)
    tools: tool_calls.ToolUse | None = None   # chat: the request's tools, whose calls the reply is read for
    grammar: Any = None              # the grammar.Grammar the reply is constrained to; None: free text
    thinking: bool | None = None     # chat: how the reply's <think> block is read (chat.thinking_mode)

    def chunks(self, slot: Model, name: str) -> Iterator[dict]:
        it = slot._completion(self.prompt_ids, self.max_tokens, self.sampling, self.stop, True, name,
                              self.logprobs, self.logit_bias, self.kind, self.text_offset, self.grammar)
        if self.kind != "chat":
            return it
        return chat.as_chat_chunks(it, chat.HarmonyChannels() if self.harmony else None, self.show_reasoning,
                                   self.tools, self.thinking)


class Answer(Protocol):
    """How a generated request is answered: ``whole`` the response body from all its chat (or
    completion) chunks and its End; ``events`` the server-sent events one chunk, or the End, gives
    (an End with an error gives an error event). OpenAIAnswer here; compat_apis has the others."""

    def whole(self, chunks: list[dict], end: End) -> dict: ...

    def events(self, item: dict | End) -> list[str]: ...

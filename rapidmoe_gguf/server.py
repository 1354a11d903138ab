"""An OpenAI-compatible HTTP server: ``rapidmoe serve MODEL``.

Endpoints (request and response shapes as OpenAI's and llama-cpp-python's):

    GET  /                      a small web chat page (no data in it; it calls the API)
    GET  /health                {"status": "ok" (or "draining", with 503), slots and queue}; never needs
                                the API key
    GET  /v1/models             the one loaded model
    POST /v1/completions        prompt -> text; "stream": true sends server-sent events
    POST /v1/chat/completions   messages -> reply, rendered with the model's chat template
    POST /v1/messages           Anthropic's Messages API (and /v1/messages/count_tokens), errors in
                                Anthropic's shape; the key may come as ``x-api-key``
    POST /v1/responses          OpenAI's Responses API, stateless (previous_response_id: 400)
                                (both translated to and from a chat request: rapidmoe_gguf.compat_apis)
    GET  /v1/rapidmoe/stats     expert activations and residual decisions per layer, summed over
                                the requests served so far, and the realised residual rate
    GET  /metrics               Prometheus metrics (rapidmoe_gguf.metrics): requests by status, queue,
                                tokens, latency histograms, KV cache use, residual rate

Lifecycle: SIGTERM drains the server (``serve``): new requests get 503 and /health answers 503
"draining" while the running and waiting requests finish; then it exits. Model names: requests
may name the model by its name, its file name or an alias (``aliases``); ``any_model`` accepts
any name, for clients configured with a fixed one.

Beyond OpenAI's fields a request may carry ``top_k``, ``min_p``, ``repeat_penalty`` and
``residual_policy`` / ``residual_budget``, which apply to that request only. OpenAI fields this
server does not implement (``n`` > 1, ``echo``, ``functions``, ...; see UNSUPPORTED) are refused with
400 rather than ignored; fields it does not know at all are ignored.

Tool calls: a chat request's ``tools``, ``tool_choice`` and ``parallel_tool_calls`` as OpenAI's
(rapidmoe_gguf.tool_calls: the model's own call format, read from its chat template); the reply's
calls come as ``message.tool_calls`` (``content`` null when there is no other text) with
``finish_reason`` "tool_calls", and streamed as ``delta.tool_calls``.

Structured outputs: ``response_format`` (json_object, json_schema) constrains the reply to JSON
of the schema (in chat, after the model's thinking), and llama.cpp's server's ``json_schema`` (a
schema) and ``grammar`` (GBNF) are taken on both endpoints, by rapidmoe_gguf.grammar; a bad
schema or grammar is a 400 naming it. A forced tool call (tool_choice) is constrained to the
model's call format, and under tool_choice auto a call the model starts is kept well formed
(rapidmoe_gguf.tool_grammar). Requests with and without a grammar share the scheduler's steps:
each sequence's sampler masks its own logits.

Log-probabilities: chat's ``logprobs: true`` with ``top_logprobs`` (0 to 20), the legacy
completions' ``logprobs: N`` (0 to 20), in OpenAI's shapes; a stream's chunk carries those of the
tokens whose text it carries. They are the model's own distribution (log-softmax of the logits,
float64) with the request's ``logit_bias`` added, before repeat_penalty, temperature and the
truncations: see sampling.token_logprob. ``logit_bias``: token id (a string key) -> a bias in
[-100, 100] added to that logit before sampling.

Concurrency. The weights are loaded once; ``parallel`` slots are sessions on them
(``Model.fork_session``), each with its own KV cache. One thread, the scheduler
(rapidmoe_gguf.scheduler), owns them and runs one evaluation per step: the next token of every
running request and at most ``prefill_chunk`` tokens of the prompts being read (fewer where
``step_latency`` needs: scheduler.StepBudget), so the weights are read once per step for all of
them and a prompt does not stall the others. A
request takes the free slot whose cache holds the longest prefix of its prompt (which it then does
not evaluate again, see Model.generate); up to ``queue`` further requests wait for a slot, in order
of arrival; beyond that the answer is 503. A client that goes away, while waiting, while its prompt
is read or while streaming, cancels its request at the next step, and its slot is handed on.

Admission comes before work: a request the slots and the queue cannot take gets 503 before its
prompt is rendered or tokenized, and what one request may cost before it holds a slot is bounded
(``max_prompt_chars``; the chat template's render limits, see chat.render).

A local server is reachable from any web page the user opens, so: API POSTs must say
``Content-Type: application/json`` (a page can send other types without asking the user's
browser for permission); the ``Host`` header must be ``localhost``, an IP address, the address the
server listens on or one of ``allowed_hosts`` (against DNS rebinding, which gives an attacker's name
this server's address); and no cross-origin answer is shared unless ``cors_origins`` names the
origin.

Errors are OpenAI's object, ``{"error": {"message", "type", "param", "code"}}``: 400 for a bad
request (malformed or too deeply nested JSON, a string with a lone surrogate escape such as
``\\ud800``, a wrong type, a value out of range or beyond its C type, a prompt longer than the
context or ``max_prompt_chars``, a chat template that fails or goes over its limits), 401 for a
missing or wrong API key, 404 for an unknown model or path, 408 for a body that does not arrive
within ``body_timeout`` seconds, 413 for a body over ``max_body`` bytes, 415 for a POST body that
is not JSON, 421 for a Host not served, 503 when the queue is full. A 500 says only that something
failed inside; the cause goes to the log. Every error but the 408 (whose body is still coming)
leaves the connection open for the client's next request.

Slow clients: ``rapidmoe serve`` runs uvicorn with the protocol of ``timed_protocol``, which
closes a connection whose request head does not arrive within ``header_timeout`` seconds (a
slowloris client), or whose body is still coming ``BODY_GRACE`` after ``body_timeout`` (a body
the app does not read; it answers 408 to one it reads).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hmac
import ipaddress
import json
import logging
import math
import os
import re
import signal
import threading
import time
from importlib import resources
from typing import Any, Callable

import numpy as np
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from . import chat, compat_apis, grammar, tool_calls, umia
from .errors import FormatError, InvalidArgumentError, RapidMoEError, StateError
from .model import Model, SamplingParams
from . import metrics
from .metrics import ServerMetrics
from .api_base import Answer, ApiError, GenRequest, _check_text, api_error
from .scheduler import DEFAULT_PREFILL_CHUNK, DEFAULT_STEP_LATENCY, End, Observer, Scheduler
from .sampling import SAMPLING_DEFAULTS, LogitBias, chat_top_logprobs, check_top_logprobs, merge_logprobs

log = logging.getLogger("rapidmoe.server")


@dataclasses.dataclass
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8080
    api_key: str | None = None       # None: no authentication
    parallel: int = 1                # slots: sequences generated at once
    prefill_chunk: int = DEFAULT_PREFILL_CHUNK   # prompt tokens per step while others decode, at most
    step_latency: float | None = DEFAULT_STEP_LATENCY   # and at most as many as keep a step within this
                                                        # multiple of the decoding tokens' own; None: off
    queue: int = 16                  # requests that may wait for a slot
    max_body: int = 1 << 20          # bytes
    model_name: str | None = None    # default: the file name without .gguf
    aliases: list[str] = dataclasses.field(default_factory=list)   # more names requests may give the model
    any_model: bool = False          # accept any model name in requests (one model is served)
    max_prompt_chars: int | None = None              # a prompt, or the messages; None: 16 per context token
    template_timeout: float = chat.TEMPLATE_TIMEOUT  # seconds one chat template render may take
    allowed_hosts: list[str] = dataclasses.field(default_factory=list)   # Host names served besides localhost
    cors_origins: list[str] = dataclasses.field(default_factory=list)    # origins whose pages may read answers
    header_timeout: float | None = 10.0   # seconds for a request's line and headers (uvicorn_config's protocol)
    body_timeout: float | None = 30.0     # seconds from the head to the body's last byte (None: no limit, both)
    reasoning_format: str = "auto"   # a reply's <think> block: reasoning_content ("auto", "deepseek") or content ("none")
    slot_save_path: str | None = None   # the folder of /slots/{id}?action=save|restore's files; None: those refused


def _plain_file_name(name: Any) -> bool:
    """A name that stays inside its folder: no separators, not hidden (nor . or ..), no NUL."""
    return (isinstance(name, str) and 0 < len(name) <= 255 and not name.startswith(".") and "/" not in name
            and "\\" not in name and "\0" not in name)


def check_api_key(key: str | None) -> None:
    """Refuses a key that cannot be sent as given: empty, or not visible ASCII (spaces included)."""
    if key is not None and not re.fullmatch(r"[\x21-\x7e]+", key):
        what = "empty" if not key else "not visible ASCII characters without spaces"
        raise InvalidArgumentError(f"the API key (--api-key or $RAPIDMOE_API_KEY) is {what}; give a key of "
                                   "visible ASCII characters, or none to serve without one")


# ---------------------------------------------------------------------------------------------
# Requests
# ---------------------------------------------------------------------------------------------

NUMBER = (int, float)
REQUIRED = object()

# field: (accepted JSON types, default). null means the default.
COMMON_FIELDS: dict[str, tuple[tuple[type, ...], Any]] = {
    "model": ((str,), None),
    "max_tokens": ((int,), None),
    "temperature": (NUMBER, SAMPLING_DEFAULTS["temperature"]),
    "top_p": (NUMBER, SAMPLING_DEFAULTS["top_p"]),
    "top_k": ((int,), SAMPLING_DEFAULTS["top_k"]),
    "min_p": (NUMBER, SAMPLING_DEFAULTS["min_p"]),
    "repeat_penalty": (NUMBER, SAMPLING_DEFAULTS["repeat_penalty"]),
    "presence_penalty": (NUMBER, 0.0),
    "frequency_penalty": (NUMBER, 0.0),
    "seed": ((int,), SAMPLING_DEFAULTS["seed"]),
    "stop": ((str, list), None),
    "stream": ((bool,), False),
    "stream_options": ((dict,), None),
    "n": ((int,), 1),
    "residual_policy": ((str,), None),
    "residual_budget": (NUMBER, None),
    "logit_bias": ((dict,), None),
    # llama.cpp's server's: a GBNF grammar, or a JSON schema, the whole reply is constrained to
    "grammar": ((str,), None),
    "json_schema": ((dict,), None),
    "response_format": ((dict,), None),
}
# logprobs: chat's is a boolean with top_logprobs beside it; the legacy completions' the number of
# top tokens (false, as before, asks for none).
COMPLETION_FIELDS = {**COMMON_FIELDS, "prompt": ((str, list), REQUIRED), "logprobs": ((int, bool), None)}
CHAT_FIELDS = {**COMMON_FIELDS, "messages": ((list,), REQUIRED), "max_completion_tokens": ((int,), None),
               "reasoning_effort": ((str,), None), "show_reasoning": ((bool,), False),
               "chat_template_kwargs": ((dict,), None), "reasoning_format": ((str,), None),
               "logprobs": ((bool,), False), "top_logprobs": ((int,), None),
               "tools": ((list,), None), "tool_choice": ((str, dict), None), "parallel_tool_calls": ((bool,), None)}
MAX_STOP = 16
# OpenAI fields this server does not implement: a request that asks for them gets 400, not a
# quiet answer without them. field -> the values (besides null) that ask for nothing. echo would
# need the prompt's logprobs, which the scheduler does not keep (it reads prompts in chunks).
UNSUPPORTED: dict[str, tuple] = {
    "echo": (False,), "suffix": ("",), "best_of": (1,),
    "functions": ([],),
}
# Fields of the other endpoint: refused unless they ask for nothing, saying what to send instead.
OTHER_ENDPOINT: dict[str, dict[str, tuple[tuple, str]]] = {
    "completion": {"top_logprobs": ((0,), "/v1/completions takes 'logprobs': N (the number of top tokens)"),
                   "tools": (([],), "tools are for /v1/chat/completions"),
                   "reasoning_format": (("none",), "a completion's text is returned as the model writes it")},
    "chat": {},
}


def _check_fields(body: dict, fields: dict) -> dict:
    out = {}
    for name, (types, default) in fields.items():
        value = body.get(name)
        if value is None:
            if default is REQUIRED:
                raise ApiError(400, f"'{name}' is required", param=name, code="missing_required_parameter")
            out[name] = default
            continue
        if isinstance(value, bool) and bool not in types or not isinstance(value, types):
            want = " or ".join({"str": "string", "int": "integer", "float": "number", "bool": "boolean",
                                "list": "array", "dict": "object"}[t.__name__] for t in types)
            got = {list: "an array", dict: "an object"}.get(type(value)) or json.dumps(value)[:80]  # not deep
            raise ApiError(400, f"'{name}' must be {want}, got {got}", param=name, code="invalid_type")
        out[name] = value
    return out


def parse_request(kind: str, body: Any, model: Model, names: set[str] | None,
                  max_chars: int = chat.MAX_TEMPLATE_CHARS,
                  template_timeout: float = chat.TEMPLATE_TIMEOUT, reasoning_format: str = "auto") -> GenRequest:
    """Checks a decoded JSON body and renders/tokenizes its prompt, refusing a prompt (or messages,
    or rendered template) over ``max_chars`` characters before tokenizing it; raises ApiError.
    ``names``: the model names a request may give (None: any)."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object", code="invalid_json")
    _check_text(body)
    f = _check_fields(body, CHAT_FIELDS if kind == "chat" else COMPLETION_FIELDS)
    if f["model"] is not None and names is not None and f["model"] not in names:
        raise ApiError(404, f"the model '{f['model']}' does not exist; this server has {sorted(names)[0]!r}",
                       param="model", code="model_not_found")
    for name, nothing in UNSUPPORTED.items():
        value = body.get(name)
        if value is not None and not any(value == v and type(value) is type(v) for v in nothing):
            raise ApiError(400, f"'{name}' is not supported by this server", param=name, code="unsupported_parameter")
    for name, (nothing, instead) in OTHER_ENDPOINT[kind].items():
        value = body.get(name)
        if value is not None and not any(value == v and type(value) is type(v) for v in nothing):
            raise ApiError(400, f"'{name}' is not a field of this endpoint: {instead}", param=name,
                           code="unsupported_parameter")
    if f["n"] != 1:
        raise ApiError(400, f"n = {f['n']}: only n = 1 is supported (one choice per request)", param="n")
    for name in ("presence_penalty", "frequency_penalty"):
        if f[name] != 0:
            raise ApiError(400, f"'{name}' is not supported (use repeat_penalty)", param=name)
    stop = [f["stop"]] if isinstance(f["stop"], str) else list(f["stop"] or [])
    if len(stop) > MAX_STOP or not all(isinstance(s, str) and s for s in stop):
        raise ApiError(400, f"'stop' must be a string or a list of at most {MAX_STOP} non-empty strings",
                       param="stop")
    if f["seed"] is not None and not -(2**63) <= f["seed"] < 2**64:
        raise ApiError(400, "'seed' must fit in 64 bits", param="seed")
    sampling = SamplingParams(temperature=float(f["temperature"]), top_k=f["top_k"], top_p=float(f["top_p"]),
                              min_p=float(f["min_p"]), repeat_penalty=float(f["repeat_penalty"]), seed=f["seed"])
    try:
        sampling.validate()
    except RapidMoEError as exc:
        raise ApiError(400, str(exc), param=str(exc).split()[0]) from exc
    policy, budget = f["residual_policy"], f["residual_budget"]
    if policy is not None and policy not in umia.POLICIES:
        raise ApiError(400, f"residual_policy must be one of {', '.join(umia.POLICIES)}, got {policy!r}",
                       param="residual_policy")
    if policy not in (None, "none") and model.residual_path is None:
        raise ApiError(400, f"residual_policy {policy!r} needs a residual sidecar; this server runs the base "
                       "model only", param="residual_policy")
    if budget is not None:
        try:
            budget = umia.check_budget(budget, allow_auto=False)
        except InvalidArgumentError as exc:
            raise ApiError(400, str(exc), param="residual_budget") from exc
    options = f["stream_options"] or {}
    n_top = _logprobs_request(kind, f)
    try:
        bias = LogitBias.check(f["logit_bias"], model.n_vocab)
    except InvalidArgumentError as exc:
        raise ApiError(400, str(exc), param="logit_bias") from exc

    response_format = f["response_format"]
    if f["json_schema"] is not None:
        if response_format is not None:
            raise ApiError(400, "json_schema and response_format cannot both be given", param="json_schema")
        response_format = {"type": "json_object", "schema": f["json_schema"]}
    tools = None
    if kind == "chat":
        param = "messages"
        max_tokens = f["max_completion_tokens"] if f["max_tokens"] is None else f["max_tokens"]
        try:
            tools = tool_calls.tool_use(model.tokenizer.chat_template, f["tools"], f["tool_choice"],
                                        f["parallel_tool_calls"])
        except InvalidArgumentError as exc:     # its message starts with the field at fault
            raise ApiError(400, str(exc), param=re.match(r"\w+", str(exc)).group()) from exc
        try:
            try:
                variables = chat.template_kwargs(f["chat_template_kwargs"])
            except InvalidArgumentError as exc:
                raise ApiError(400, str(exc), param="chat_template_kwargs") from exc
            try:
                variables = chat.effort_variables(f["reasoning_effort"], variables)
            except InvalidArgumentError as exc:
                raise ApiError(400, str(exc), param="reasoning_effort") from exc
            try:
                variables = chat.format_variables(model.tokenizer.chat_template, response_format, variables)
            except InvalidArgumentError as exc:
                raise ApiError(400, str(exc), param="json_schema" if f["json_schema"] is not None
                               else "response_format") from exc
            ids = chat.chat_prompt(model, f["messages"], max_chars=max_chars, timeout=template_timeout, tools=tools,
                                   **variables)
        except RapidMoEError as exc:
            raise ApiError(400, str(exc), param="messages") from exc
    else:
        param = "prompt"
        max_tokens = 16 if f["max_tokens"] is None else f["max_tokens"]
        ids = _completion_prompt(model, f["prompt"], max_chars)
    if max_tokens is not None and max_tokens < 0:
        raise ApiError(400, f"max_tokens must be >= 0, got {max_tokens}", param="max_tokens")
    if not ids:
        raise ApiError(400, f"'{param}' is empty", param=param)
    room = model.n_ctx - len(ids)
    if max_tokens is None:
        max_tokens = max(room, 0)
    if len(ids) + max(max_tokens, 1) > model.n_ctx:
        raise ApiError(400, f"the {param} has {len(ids)} tokens and max_tokens is {max_tokens}, but the context "
                       f"holds {model.n_ctx} tokens", param=param, code="context_length_exceeded")
    harmony = kind == "chat" and chat.is_harmony(model.tokenizer)
    try:
        thinking = chat.thinking_mode(model.tokenizer, ids, f["reasoning_format"] or reasoning_format) \
            if kind == "chat" else None
    except InvalidArgumentError as exc:
        raise ApiError(400, str(exc), param="reasoning_format") from exc
    try:
        if kind == "chat":
            constrained = chat.response_grammar(model.tokenizer, response_format, harmony, tools,
                                                chat.thinking_mode(model.tokenizer, ids), f["grammar"])
        else:
            constrained = grammar.completion_grammar(model.tokenizer, response_format, f["grammar"])
    except InvalidArgumentError as exc:     # its message starts with the field at fault
        field = re.match(r"\w+", str(exc)).group()
        raise ApiError(400, str(exc), param="json_schema" if f["json_schema"] is not None and
                       field == "response_format" else field) from exc
    offset = 0      # legacy logprobs' text_offset counts from the prompt's start: its text, or its tokens'
    if kind == "completion" and n_top is not None:
        prompt = f["prompt"][0] if isinstance(f["prompt"], list) and len(f["prompt"]) == 1 else f["prompt"]
        offset = len(prompt) if isinstance(prompt, str) else len(model.detokenize(ids))
    return GenRequest(kind, ids, max_tokens, sampling, stop, f["stream"], bool(options.get("include_usage")),
                      policy, budget, harmony, bool(kind == "chat" and f["show_reasoning"]), n_top, bias, offset,
                      tools, constrained, thinking)


def _logprobs_request(kind: str, f: dict) -> int | None:
    """The number of top tokens whose logprobs each generated token reports (None: no logprobs),
    from chat's logprobs and top_logprobs, or the legacy completions' logprobs N."""
    if kind == "chat":
        try:
            return chat_top_logprobs(f["logprobs"], f["top_logprobs"])
        except InvalidArgumentError as exc:
            param = "logprobs" if str(exc).startswith("logprobs") else "top_logprobs"
            raise ApiError(400, str(exc), param=param) from exc
    n = f["logprobs"]
    if n is None or n is False:
        return None
    try:
        return check_top_logprobs(n, "logprobs")
    except InvalidArgumentError as exc:
        raise ApiError(400, str(exc), param="logprobs") from exc


def _completion_prompt(model: Model, prompt, max_chars: int) -> list[int]:
    """A string, a list of token ids, or a list of one string."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, str):
        if len(prompt) > max_chars:
            raise ApiError(400, f"the prompt has {len(prompt)} characters, over this server's limit of {max_chars}",
                           param="prompt", code="context_length_exceeded")
        return model.tokenize(prompt)
    if len(prompt) > model.n_ctx:
        raise ApiError(400, f"the prompt has {len(prompt)} tokens, but the context holds {model.n_ctx}",
                       param="prompt", code="context_length_exceeded")
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        raise ApiError(400, "'prompt' must be a string, a list of token ids, or a list of one string",
                       param="prompt")
    bad = [t for t in prompt if not 0 <= t < model.n_vocab]
    if bad:
        raise ApiError(400, f"token id {bad[0]} in 'prompt' is outside the vocabulary [0, {model.n_vocab})",
                       param="prompt")
    return list(prompt)


# ---------------------------------------------------------------------------------------------
# Jobs
# ---------------------------------------------------------------------------------------------

_End = End


class _Job:
    def __init__(self, req: GenRequest):
        self.req = req
        self.events: asyncio.Queue = asyncio.Queue()   # chunk dicts, then one _End
        self.cancel = threading.Event()                # set: the scheduler drops it at its next step
        self.slot: int | None = None


class Server(Observer):
    """The state behind the app: the slots, the scheduler that runs them, the statistics."""

    def __init__(self, model: Model, config: ServerConfig):
        if config.parallel < 1 or config.queue < 0:
            raise RapidMoEError(f"parallel must be >= 1 and queue >= 0, got {config.parallel} and {config.queue}")
        if config.max_prompt_chars is not None and config.max_prompt_chars < 1 or not config.template_timeout > 0:
            raise InvalidArgumentError(f"max_prompt_chars must be >= 1 and template_timeout > 0, got "
                                       f"{config.max_prompt_chars} and {config.template_timeout}")
        if config.prefill_chunk < 1 or config.step_latency is not None and not config.step_latency > 1:
            raise InvalidArgumentError(f"prefill_chunk must be >= 1 and step_latency > 1 (or None), got "
                                       f"{config.prefill_chunk} and {config.step_latency}")
        for name in ("header_timeout", "body_timeout"):
            seconds = getattr(config, name)
            if seconds is not None and not (seconds > 0 and math.isfinite(seconds)):
                raise InvalidArgumentError(f"{name} must be a number of seconds > 0, or None for no limit; "
                                           f"got {seconds}")
        check_api_key(config.api_key)
        self.model, self.config = model, config
        self.max_prompt_chars = config.max_prompt_chars or 16 * model.n_ctx
        stem = os.path.basename(model.path)
        self.name = config.model_name or (stem[:-5] if stem.endswith(".gguf") else stem)
        self.names = {self.name, os.path.basename(model.path), *config.aliases}
        self.accepted_names = None if config.any_model else self.names   # parse_request's names (None: any)
        self.slots = [model] + [model.fork_session() for _ in range(config.parallel - 1)]
        self.policy, self.budget = model.residual_policy, model.residual_budget
        self._admitted = 0                             # requests holding or waiting for a slot
        self._jobs: set[_Job] = set()
        shape = (model.info["n_layer"], model.info["n_expert"])
        self._lock = threading.Lock()
        self._active = np.zeros(shape, dtype=np.uint64)
        self._residual = np.zeros(shape, dtype=np.uint64)
        self._counts = {"requests": 0, "cancelled": 0, "errors": 0, "prompt_tokens": 0, "completion_tokens": 0}
        self.started = int(time.time())
        self.peak_batch = 0                            # the most sequences one step has evaluated
        self.draining = False                          # after SIGTERM: new requests get 503
        self.metrics = ServerMetrics(sum(m.n_ctx for m in self.slots), sum(m.kv_cache_bytes for m in self.slots),
                                     (model.cache_type_k, model.cache_type_v),
                                     expert_cache=lambda: model.expert_cache) if metrics.prom is not None else None
        self.scheduler = Scheduler(self.slots, self.name, config.prefill_chunk, observer=self,
                                   step_latency=config.step_latency)

    @property
    def _free(self):
        return self.scheduler.free

    def _pick_slot(self, prompt_ids: list[int], first: int) -> int:
        return self.scheduler.pick_slot(prompt_ids, first)

    def close(self) -> None:
        for job in list(self._jobs):
            job.cancel.set()
        self.scheduler.close()
        for slot in self.slots[1:]:
            slot.close()

    # -- the life of a request ------------------------------------------------------------------

    def admit(self) -> None:
        """Takes a place among the requests running or waiting, or raises 503. The place is given
        back when the request's last event arrives, or by ``release`` when it fails before."""
        if self.draining:
            raise ApiError(503, "the server is shutting down; retry on another", code="server_shutting_down")
        if self._admitted >= self.config.parallel + self.config.queue:
            raise ApiError(503, f"the server is busy: {self.config.parallel} requests running and "
                           f"{self.config.queue} waiting; retry later", code="server_busy")
        self._admitted += 1

    def release(self) -> None:
        self._admitted -= 1

    def refused(self, exc: BaseException) -> None:
        """Counts a generation request answered with an error before it reached the scheduler."""
        if self.metrics is None:
            return
        status = exc.status if isinstance(exc, ApiError) else 500
        kind = ("draining" if self.draining else "busy") if status == 503 else "invalid" if status < 500 else "error"
        self.metrics.requests.labels(kind).inc()

    def drain(self, then: Callable[[], None]) -> None:
        """Refuses new requests from now on (503), and calls ``then`` (from a thread of its own)
        once the requests running or waiting have finished."""
        self.draining = True
        if self.metrics is not None:
            self.metrics.draining.set(1)

        def wait() -> None:
            while self._admitted > 0:
                time.sleep(0.05)
            then()

        threading.Thread(target=wait, name="rapidmoe-drain", daemon=True).start()

    async def generate(self, request: Request, req: GenRequest, answer: "Answer | None" = None) -> Response:
        """Generates an admitted request; ``answer`` shapes the result (default: OpenAI's, for req.kind)."""
        answer = answer or OpenAIAnswer(req)
        job = _Job(req)
        self._jobs.add(job)
        loop = asyncio.get_running_loop()

        def arrived(item) -> None:                 # on the event loop
            if isinstance(item, _End):
                self._jobs.discard(job)
                self._admitted -= 1
            job.events.put_nowait(item)

        self.scheduler.submit(job, lambda item: loop.call_soon_threadsafe(arrived, item))
        watch = asyncio.create_task(self._watch(request, job))
        try:
            first = await job.events.get()
        except BaseException:
            job.cancel.set()
            watch.cancel()
            raise
        if isinstance(first, _End):
            watch.cancel()
            if first.error is not None:
                raise api_error(first.error)
            if first.cancelled:
                return Response(status_code=499)
        if req.stream:
            return StreamingResponse(self._sse(job, first, watch, answer), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        chunks = [first]
        try:
            while not isinstance(chunks[-1], _End):
                chunks.append(await job.events.get())
        finally:
            job.cancel.set()
            watch.cancel()
        end = chunks.pop()
        if end.error is not None:
            raise api_error(end.error)
        return JSONResponse(answer.whole(chunks, end))

    async def _watch(self, request: Request, job: _Job) -> None:
        """Cancels the job when its client disconnects."""
        while not job.cancel.is_set():
            if await request.is_disconnected():
                job.cancel.set()
                self.scheduler.wake()
                return
            await asyncio.sleep(0.1)

    # -- the scheduler's observations (its thread) ----------------------------------------------

    def queued(self, n_waiting: int, n_running: int) -> None:
        if self.metrics is not None:
            self.metrics.queued(n_waiting, n_running)

    def first_token(self, seconds: float) -> None:
        if self.metrics is not None:
            self.metrics.first_token(seconds)

    def token_gap(self, seconds: float) -> None:
        if self.metrics is not None:
            self.metrics.token_gap(seconds)

    def step(self, n_tokens: int, n_seqs: int, kv_tokens: int) -> None:
        self.peak_batch = max(self.peak_batch, n_seqs)
        if self.metrics is not None:
            self.metrics.step(n_tokens, n_seqs, kv_tokens)

    def left_waiting(self) -> None:
        if self.metrics is not None:
            self.metrics.requests.labels("cancelled").inc()

    def finished(self, status: str, prompt_tokens: int, evaluated: int, completion_tokens: int,
                 stats: dict | None) -> None:
        if self.metrics is not None:
            self.metrics.finished(status, prompt_tokens, evaluated, completion_tokens, stats)
        with self._lock:
            if stats is not None:
                self._active += stats["active"]
                self._residual += stats["residual"]
            c = self._counts
            c["requests"] += 1
            c["cancelled"] += status == "cancelled"
            c["errors"] += status == "error"
            if status != "error":
                c["prompt_tokens"] += prompt_tokens
                c["completion_tokens"] += completion_tokens

    async def _sse(self, job: _Job, first, watch: asyncio.Task, answer: "Answer") -> Any:
        item = first
        try:
            while True:
                for event in answer.events(item):
                    yield event
                if isinstance(item, _End):
                    return
                item = await job.events.get()
        finally:
            job.cancel.set()                        # the client left (or the stream ended)
            watch.cancel()

    # -- introspection ----------------------------------------------------------------------------

    def health(self) -> dict:
        busy = self.scheduler.n_running
        return {"status": "draining" if self.draining else "ok", "slots_idle": len(self.slots) - busy,
                "slots_processing": busy,
                "requests_waiting": max(self._admitted - busy, 0), "queue_limit": self.config.queue}

    def stats(self) -> dict:
        with self._lock:
            act, res, counts = self._active.copy(), self._residual.copy(), dict(self._counts)
        total = int(act.sum())
        layers = [{"layer": i, "activations": act[i].tolist(), "residual": res[i].tolist(),
                   "residual_rate": float(res[i].sum()) / float(act[i].sum()) if act[i].sum() else 0.0}
                  for i in range(act.shape[0])]
        sidecar = self.model.residual_path
        return {"model": self.name, "residual_sidecar": sidecar and os.path.basename(sidecar),
                "policy": self.policy, "budget": self.budget,
                "residual_rate": float(res.sum()) / total if total else 0.0,
                "bytes_per_token": self.model.bytes_per_token(float(res.sum()) / total if total else 0.0),
                **counts, "n_layer": act.shape[0], "n_expert": act.shape[1], "layers": layers}


class OpenAIAnswer:
    """The answer of /v1/completions and /v1/chat/completions: the folded response, or the chunks
    as data events, then the usage chunk (when stream_options asks for it) and [DONE]."""

    def __init__(self, req: GenRequest):
        self.req = req
        self._head: dict = {}

    def whole(self, chunks: list[dict], end: End) -> dict:
        return _fold(self.req.kind, chunks, end.usage, self.req.logprobs is not None)

    def events(self, item: dict | End) -> list[str]:
        if not isinstance(item, End):
            self._head = {k: item[k] for k in ("id", "object", "created", "model")}
            return [_event(item)]
        if item.error is not None:
            err = api_error(item.error)
            return [_event({"error": {"message": err.message, "type": err.type, "param": err.param,
                                      "code": err.code}})]
        usage = [_event({**self._head, "choices": [], "usage": item.usage})] if self.req.include_usage and item.usage \
            else []
        return usage + ["data: [DONE]\n\n"]


_OBJECT = {"completion": "text_completion", "chat": "chat.completion"}


def _event(obj: dict) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def _fold(kind: str, chunks: list[dict], usage: dict | None, logprobs: bool = False) -> dict:
    """A stream's chunks as the one non-streaming response (``logprobs``: the request asked for them)."""
    head = chunks[0]
    finish = chunks[-1]["choices"][0]["finish_reason"]
    out = {"id": head["id"], "object": _OBJECT[kind], "created": head["created"], "model": head["model"]}
    lp = merge_logprobs(kind, [c["choices"][0]["logprobs"] for c in chunks]) if logprobs else None
    if kind == "chat":
        message = chat.fold_message([c["choices"][0]["delta"] for c in chunks])
        choice = {"index": 0, "message": message, "logprobs": lp, "finish_reason": finish}
    else:
        text = "".join(c["choices"][0]["text"] for c in chunks)
        choice = {"text": text, "index": 0, "logprobs": lp, "finish_reason": finish}
    return {**out, "choices": [choice], "usage": usage}


# ---------------------------------------------------------------------------------------------
# The app
# ---------------------------------------------------------------------------------------------

def create_app(model: Model, config: ServerConfig | None = None) -> Starlette:
    """The ASGI app serving ``model`` (which stays the caller's: close it after the app stops)."""
    config = config or ServerConfig()
    server = Server(model, config)

    served_names = {"localhost", config.host.lower(), *(h.lower() for h in config.allowed_hosts)}

    def check_host(request: Request) -> None:
        """The Host must name this server: localhost, an IP address (which DNS rebinding cannot
        forge), the address it listens on, or an allowed name. No Host (HTTP/1.0) passes."""
        host = request.headers.get("host")
        if host is None:
            return
        name = host.lower()
        if name.startswith("["):                           # [IPv6]:port
            name = name[1:name.find("]")]
        elif name.count(":") == 1:                         # name:port
            name = name.split(":")[0]
        if name in served_names:
            return
        with contextlib.suppress(ValueError):
            ipaddress.ip_address(name)
            return
        raise ApiError(421, f"this server does not serve the host {host[:100]!r}; start it with --allowed-host NAME "
                       "to serve a name other than localhost", code="invalid_host")

    def authorize(request: Request) -> None:
        if config.api_key is None:
            return
        scheme, _, key = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer":
            key = request.headers.get("x-api-key", "")        # as Anthropic's clients send it
        if not hmac.compare_digest(key.strip().encode(), config.api_key.encode()):
            raise ApiError(401, "a valid API key is required: send 'Authorization: Bearer KEY' or 'x-api-key: KEY'",
                           code="invalid_api_key")

    def require_json(request: Request) -> None:
        # A page may POST text/plain or a form to any address without the browser asking first;
        # JSON needs the browser's permission (CORS), which this server gives no page by default.
        media = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if media != "application/json":
            raise ApiError(415, f"the request body must be JSON, sent with 'Content-Type: application/json' "
                           f"(got {media[:60]!r})", code="unsupported_media_type")

    def guarded(handler, api: bool = True, post: bool = False,
                error_response: Callable[[ApiError], Response] = ApiError.response):
        """The checks every request passes, and every error as OpenAI's object (a 500 with no
        detail; ``error_response``: another API's shape), answered rather than raised, so the
        connection stays open."""
        async def handle(request: Request) -> Response:
            try:
                check_host(request)
                if api:
                    authorize(request)
                if post:
                    require_json(request)
                return await handler(request)
            except Exception as exc:
                return error_response(api_error(exc))
        return handle

    async def read_body(request: Request) -> bytes:
        chunks, n = [], 0
        async for chunk in request.stream():
            n += len(chunk)
            if n > config.max_body:
                raise ApiError(413, f"the request body is over {config.max_body} bytes", code="request_too_large")
            chunks.append(chunk)
        return b"".join(chunks)

    async def read_json(request: Request) -> Any:
        size = request.headers.get("content-length")
        if size is not None and (not size.isdigit() or int(size) > config.max_body):
            raise ApiError(413, f"the request body is over {config.max_body} bytes", code="request_too_large")
        try:
            # The head has just arrived (the app is called on it), so this bounds the time from the
            # head to the body's last byte: a client sending a byte now and then holds no connection.
            body = await asyncio.wait_for(read_body(request), config.body_timeout)
        except ClientDisconnect:
            raise ApiError(400, "the client disconnected while sending the request") from None
        except asyncio.TimeoutError:
            # The rest of the body is still to come, so the connection cannot carry another request.
            raise ApiError(408, f"the request body did not arrive within {config.body_timeout:g} s "
                           "(the server's --body-timeout)", code="request_timeout",
                           headers={"Connection": "close"}) from None

        def reject_constant(name):
            raise ValueError(f"{name} is not valid JSON")

        try:
            return json.loads(body, parse_constant=reject_constant)
        except RecursionError:
            raise ApiError(400, "the request body is nested too deeply", code="invalid_json") from None
        except (ValueError, UnicodeDecodeError) as exc:
            raise ApiError(400, f"the request body is not valid JSON: {exc}", code="invalid_json") from None

    def parse_chat(body: Any) -> GenRequest:
        return parse_request("chat", body, model, server.accepted_names, server.max_prompt_chars,
                             config.template_timeout, config.reasoning_format)

    async def admitted(request: Request, kind: str, api) -> tuple[Any, GenRequest]:
        """The request's body and its GenRequest (``api``: a compat_apis translator, whose body becomes
        a chat request), holding a place that the caller must release (or hand to generate)."""
        try:
            body = await read_json(request)
            server.admit()                     # before any work on the prompt
        except Exception as exc:
            server.refused(exc)
            raise
        try:
            if api is not None:
                return body, await asyncio.to_thread(api.request, body, parse_chat)
            return body, await asyncio.to_thread(parse_request, kind, body, model, server.accepted_names,
                                                 server.max_prompt_chars, config.template_timeout,
                                                 config.reasoning_format)
        except BaseException as exc:
            server.release()
            server.refused(exc)
            raise

    def endpoint(kind: str, api=None):
        async def handle(request: Request) -> Response:
            body, req = await admitted(request, kind, api)
            return await server.generate(request, req, api.answer(req, body) if api is not None else None)
        return handle

    async def count_tokens(request: Request) -> Response:
        _, req = await admitted(request, "chat", compat_apis.MESSAGES_COUNT)
        server.release()
        return JSONResponse({"input_tokens": len(req.prompt_ids)})

    async def models(request: Request) -> Response:
        names = [server.name] + [a for a in config.aliases if a != server.name]
        return JSONResponse({"object": "list", "data": [_model_card(server, n) for n in names]})

    async def one_model(request: Request) -> Response:
        name = request.path_params["name"]
        if server.accepted_names is not None and name not in server.names:
            raise ApiError(404, f"the model '{name}' does not exist", param="model", code="model_not_found")
        return JSONResponse(_model_card(server, name if name in config.aliases or config.any_model else server.name))

    async def health(request: Request) -> Response:
        return JSONResponse(server.health(), status_code=503 if server.draining else 200)

    async def prometheus(request: Request) -> Response:
        if server.metrics is None:
            raise ApiError(501, "metrics need the prometheus_client package (pip install prometheus_client)",
                           code="not_implemented")
        return Response(server.metrics.render(), media_type=metrics.CONTENT_TYPE)

    async def stats(request: Request) -> Response:
        return JSONResponse(server.stats())

    async def slot_action(request: Request) -> Response:
        """llama-server's slot actions: save a slot's sequence to a file in --slot-save-path, restore
        it from one (an agent's long context survives a restart: the next request that repeats it
        evaluates only what follows), or erase it. Each waits until the slot is free."""
        action = request.query_params.get("action", "")
        try:
            slot = int(request.path_params["id"])
        except ValueError:
            raise ApiError(400, f"the slot id must be an integer, got {request.path_params['id'][:40]!r}",
                           param="id_slot") from None
        if not 0 <= slot < len(server.slots):
            raise ApiError(400, f"no slot {slot}: the slots are 0 to {len(server.slots) - 1}", param="id_slot")
        body = await read_json(request)
        if action not in ("save", "restore", "erase"):
            raise ApiError(400, f"unknown slot action {action[:40]!r}: save, restore or erase", param="action")
        path = name = None
        if action != "erase":
            if config.slot_save_path is None:
                raise ApiError(501, "slot save and restore need the server started with --slot-save-path DIR",
                               code="not_implemented")
            name = body.get("filename") if isinstance(body, dict) else None
            if not _plain_file_name(name):
                raise ApiError(400, "filename must be a plain file name (no folders, not hidden, at most 255 "
                               "characters)", param="filename")
            path = os.path.join(config.slot_save_path, name)

        def run(m: Model) -> dict:
            t0 = time.perf_counter()
            if action == "erase":
                n = m.n_past
                m.reset()
                return {"id_slot": slot, "n_erased": n}
            if action == "save":
                n_written = m.save_state(path)
                return {"id_slot": slot, "filename": name, "n_saved": m.n_past, "n_written": n_written,
                        "timings": {"save_ms": (time.perf_counter() - t0) * 1e3}}
            try:
                n = m.load_state(path)
            except FileNotFoundError:
                raise ApiError(404, f"no saved slot file named {name!r}", param="filename") from None
            except (StateError, FormatError) as exc:   # the file's fault, not the server's
                msg = str(exc).replace(path, name).replace(os.fspath(m.path), "this server's model")
                raise ApiError(400, msg, param="filename") from None
            return {"id_slot": slot, "filename": name, "n_restored": n, "n_read": os.path.getsize(path),
                    "timings": {"restore_ms": (time.perf_counter() - t0) * 1e3}}

        return JSONResponse(await asyncio.wrap_future(server.scheduler.slot_task(slot, run)))

    async def page(request: Request) -> Response:
        return HTMLResponse(resources.files(__package__).joinpath("web_chat.html").read_text(encoding="utf-8"))

    async def on_api_error(request: Request, exc: Exception) -> Response:
        return api_error(exc).response()

    async def on_http_error(request: Request, exc: HTTPException) -> Response:
        return ApiError(exc.status_code, exc.detail or "error", code="not_found" if exc.status_code == 404 else None,
                        type="invalid_request_error").response()

    async def on_error(request: Request, exc: Exception) -> Response:
        return api_error(exc).response()

    routes = [
        Route("/", guarded(page, api=False), methods=["GET"]),
        Route("/health", guarded(health, api=False), methods=["GET"]),
        Route("/v1/models", guarded(models), methods=["GET"]),
        Route("/v1/models/{name:path}", guarded(one_model), methods=["GET"]),
        Route("/v1/completions", guarded(endpoint("completion"), post=True), methods=["POST"]),
        Route("/v1/chat/completions", guarded(endpoint("chat"), post=True), methods=["POST"]),
        Route("/v1/messages", guarded(endpoint("chat", compat_apis.MESSAGES), post=True,
                                      error_response=compat_apis.anthropic_error), methods=["POST"]),
        Route("/v1/messages/count_tokens", guarded(count_tokens, post=True, error_response=compat_apis.anthropic_error),
              methods=["POST"]),
        Route("/v1/responses", guarded(endpoint("chat", compat_apis.RESPONSES), post=True), methods=["POST"]),
        Route("/v1/rapidmoe/stats", guarded(stats), methods=["GET"]),
        Route("/slots/{id}", guarded(slot_action, post=True), methods=["POST"]),
        Route("/metrics", guarded(prometheus), methods=["GET"]),
    ]
    middleware = [Middleware(CORSMiddleware, allow_origins=list(config.cors_origins), allow_methods=["GET", "POST"],
                             allow_headers=["Authorization", "X-Api-Key", "Content-Type"])
                  ] if config.cors_origins else []

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        await asyncio.to_thread(server.close)

    app = Starlette(routes=routes, lifespan=lifespan, middleware=middleware,
                    exception_handlers={ApiError: on_api_error, RapidMoEError: on_api_error,
                                        HTTPException: on_http_error, Exception: on_error})
    app.state.server = server
    return app


def _model_card(server: Server, name: str) -> dict:
    m = server.model
    return {"id": name, "object": "model", "created": server.started, "owned_by": "rapidmoe",
            "meta": {"arch": m.info["arch"], "n_ctx": m.n_ctx, "n_vocab": m.n_vocab, "n_layer": m.info["n_layer"],
                     "n_expert": m.info["n_expert"], "n_expert_used": m.info["n_expert_used"],
                     "residual_sidecar": m.residual_path is not None, "parallel": len(server.slots)}}


# ---------------------------------------------------------------------------------------------
# Slow clients
# ---------------------------------------------------------------------------------------------

# Seconds a connection outlives an unfinished body past body_timeout: the app answers 408 to a
# body it reads at body_timeout; this cuts off one that nothing reads (the answer went without it).
BODY_GRACE = 1.0


def timed_protocol(header_timeout: float | None, body_timeout: float | None) -> type:
    """uvicorn's h11 protocol with time limits on a request's head and body; None: no limit.

    uvicorn closes a connection idle between requests (``timeout_keep_alive``) but waits for ever
    for a head that trickles in, or for the rest of a body, so a few clients sending a byte a
    second (slowloris) would hold their connections as long as they like. The head must arrive
    within ``header_timeout`` of the connection being made, or of its first byte on a kept-alive
    connection; otherwise the connection is closed, after a 408 when part of a head came. A body
    the app reads times out there (read_json: 408); one still coming ``BODY_GRACE`` after that
    closes the connection. h11, not httptools (uvicorn's choice when it is installed): one
    implementation whose state (``conn.their_state``) says where the request is, and the parser's
    cost is nothing beside a token's."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class TimedH11Protocol(H11Protocol):
        _head_timer: asyncio.TimerHandle | None = None
        _body_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._arm_head()                   # a connection that never sends a head is closed too

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            self._follow()

        def on_response_complete(self) -> None:
            super().on_response_complete()     # may start on a pipelined request already received
            self._follow()

        def connection_lost(self, exc: Exception | None) -> None:
            self._stop_head()
            self._stop_body()
            super().connection_lost(exc)

        def _follow(self) -> None:
            """Arms or stops the timers for where the request now is."""
            state = self.conn.their_state
            if state is h11.IDLE:              # between requests: a head starts with its first byte
                self._stop_body()
                if self.conn.trailing_data[0]:
                    if self._head_timer is None:
                        self._arm_head()
                elif self._head_timer is None and self.timeout_keep_alive_task is None:
                    # The body of a request answered before it ended has now ended: the connection
                    # is idle, but uvicorn arms its keep-alive limit only when an answer completes.
                    self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive,
                                                                        self.timeout_keep_alive_handler)
            elif state is h11.SEND_BODY:
                self._stop_head()
                if self._body_timer is None and body_timeout is not None:
                    self._body_timer = self.loop.call_later(body_timeout + BODY_GRACE, self._body_timed_out)
            else:                              # the request is in, or the connection is ending
                self._stop_head()
                self._stop_body()

        def _arm_head(self) -> None:
            if header_timeout is not None:
                self._head_timer = self.loop.call_later(header_timeout, self._head_timed_out)

        def _stop_head(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _stop_body(self) -> None:
            if self._body_timer is not None:
                self._body_timer.cancel()
                self._body_timer = None

        def _head_timed_out(self) -> None:
            self._head_timer = None
            if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
                return
            if self.conn.trailing_data[0]:     # part of a request came: say why it gets no answer
                self.transport.write(_timeout_response(f"the request line and headers did not arrive within "
                                                       f"{header_timeout:g} s (the server's --header-timeout)"))
            log.info("closed a connection from %s: no request head within %g s", self.client, header_timeout)
            self.transport.close()

        def _body_timed_out(self) -> None:
            self._body_timer = None
            if not self.transport.is_closing() and self.conn.their_state is h11.SEND_BODY:
                log.info("closed a connection from %s: the request body did not end within %g s",
                         self.client, body_timeout + BODY_GRACE)
                self.transport.close()

    return TimedH11Protocol


def _timeout_response(message: str) -> bytes:
    """A whole 408 answer with OpenAI's error object, written by the protocol (no app saw the request)."""
    body = json.dumps(ApiError(408, message, code="request_timeout").content()).encode()
    return (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\nconnection: close\r\n\r\n" % len(body)) + body


def uvicorn_config(app, config: ServerConfig, log_level: str = "info"):
    """uvicorn's configuration for ``app``: the address, and the protocol with the time limits."""
    import uvicorn

    return uvicorn.Config(app, host=config.host, port=config.port, log_level=log_level, timeout_graceful_shutdown=5,
                          http=timed_protocol(config.header_timeout, config.body_timeout))


def serve(model: Model, config: ServerConfig, log_level: str = "info") -> None:
    """Runs the server until interrupted. Ctrl-C (SIGINT) stops it, cancelling what runs; SIGTERM
    drains it: new requests get 503 while the running and waiting ones finish, then it returns
    (a second SIGTERM stops it at once)."""
    import uvicorn

    app = create_app(model, config)
    state: Server = app.state.server

    class DrainingServer(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:
            if sig == signal.SIGTERM and not state.draining:
                log.warning("SIGTERM: finishing the running requests, refusing new ones, then exiting")
                state.drain(lambda: setattr(self, "should_exit", True))
                return
            super().handle_exit(sig, frame)

    server = DrainingServer(uvicorn_config(app, config, log_level))
    try:
        server.run()
    except KeyboardInterrupt:   # uvicorn raises Ctrl-C's signal again once it has shut down (as uvicorn.run)
        pass
    if not server.started:
        raise RapidMoEError(f"the server could not start on {config.host}:{config.port} (see the log above)")

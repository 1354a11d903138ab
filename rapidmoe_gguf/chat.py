"""Chat: a conversation rendered with the model's own chat template, and chat completions in
llama-cpp-python's dict shapes.

The template (``tokenizer.chat_template`` in the GGUF, copied from the checkpoint's
tokenizer_config.json) is rendered the way transformers' ``apply_chat_template`` renders it: a
sandboxed, immutable Jinja environment with ``trim_blocks`` and ``lstrip_blocks``, the
``loopcontrols`` extension, a ``tojson`` that leaves non-ASCII and HTML characters alone, and the
globals ``raise_exception`` and ``strftime_now``; beyond transformers, a ``from_json`` filter (the
value a JSON string holds, ``json.loads``), which DeepSeek-V3.2's and V4's templates apply to a tool
call's arguments when they come as a JSON string (``render_chat`` gives these templates objects,
but ``render`` passes the messages as they are). Templates come from model files, so they are
untrusted code: the sandbox refuses attribute access to Python internals, and a render has limits
(``render``'s ``max_chars`` and ``timeout``): no string or list the template builds, and not its
output, may be longer than ``max_chars``; ``range`` gives at most 100,000 numbers; no argument of
a call or filter may be an integer over ``max_chars``; the render stops after ``timeout`` seconds,
checked at every line of template code. A template over a limit is an InvalidArgumentError, as is
one that fails in any other way.

Template variables beyond the messages go through as transformers passes its keyword arguments:
gpt-oss's template reads ``reasoning_effort`` ("low", "medium", "high").

gpt-oss answers in the harmony format: its reply is a sequence of messages on channels
(``<|channel|>analysis<|message|>...<|end|><|start|>assistant<|channel|>final<|message|>...``).
For a model whose vocabulary has the harmony tokens, a chat completion's content is the final
channel's text alone; the analysis channel (the model's reasoning) is left out, or given as
``reasoning_content`` when asked for (``show_reasoning``), as llama.cpp's server does.

Tools (a request's ``tools``, see rapidmoe_gguf.tool_calls): ``render_chat`` gives the template
the tools as it is to get them, and each earlier tool call's arguments in the form the template
takes (an object or a JSON string, found by rendering it: ``template_tools``); ``Reply`` reads the
calls back out of the reply's text, or out of a harmony reply's messages to ``functions.NAME``.

A model without a template cannot chat: there is no fallback format, because guessing one (ChatML,
say) for a model trained on another gives fluent-looking nonsense. Such a model raises
UnsupportedError; use ``create_completion`` with a prompt written in the model's own format.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import sys
import threading
import time
from datetime import datetime
from typing import Any, Iterator, Mapping, NamedTuple, Sequence

import jinja2
import jinja2.ext
from jinja2.compiler import CodeGenerator
from jinja2.sandbox import MAX_RANGE, ImmutableSandboxedEnvironment

from . import tool_calls
from .errors import InvalidArgumentError, RapidMoEError, UnsupportedError
from .sampling import SAMPLING_DEFAULTS as _SD, LogitBias, SamplingParams, chat_top_logprobs

ROLES = ("system", "user", "assistant", "tool", "developer")

# A render's limits unless the caller gives others: characters (of the output, and of any string
# or list the template builds), and seconds.
MAX_TEMPLATE_CHARS = 1 << 20
TEMPLATE_TIMEOUT = 2.0


class TemplateLimitError(jinja2.exceptions.SecurityError):
    """A template went over a render limit."""


_render_limits = threading.local()          # .max_chars of the render running on this thread


def _check_length(n: int) -> None:
    limit = getattr(_render_limits, "max_chars", MAX_TEMPLATE_CHARS)
    if n > limit:
        raise TemplateLimitError(f"a string or list of {n} items is over the limit of {limit}")


def _check_size(value: Any) -> Any:
    if isinstance(value, (str, list, tuple, dict)):
        _check_length(len(value))
    return value


def _check_ints(values) -> None:
    limit = getattr(_render_limits, "max_chars", MAX_TEMPLATE_CHARS)
    for v in values:
        if isinstance(v, int) and abs(v) > limit:
            raise TemplateLimitError(f"the argument {v} is over the limit of {limit}")


def _check_format(fmt: str) -> None:
    """A printf or str.format string: its widths and precisions too are bounded."""
    _check_ints(int(d) for d in re.findall(r"\d{1,32}", fmt))


def _amplifier_bound(name: str, value: Any, args: tuple, kwargs: dict) -> int:
    """An upper bound on the length of what the str method or filter ``name`` returns for the
    string ``value`` and these arguments, for the few whose result can be far longer than their
    arguments (join is bounded by its callers); 0 for the others."""
    def arg(i, key, default):
        return args[i] if len(args) > i else kwargs.get(key, default)

    if name in ("center", "ljust", "rjust", "zfill"):
        return int(arg(0, "width", 80))
    text = value if isinstance(value, str) else str(value)
    if name == "indent":
        width = arg(0, "width", 4)
        return len(text) + (len(width) if isinstance(width, str) else int(width)) * (text.count("\n") + 1)
    if name == "expandtabs":
        return len(text) + int(arg(0, "tabsize", 8)) * text.count("\t")
    if name == "replace":
        old, new = str(arg(0, "old", "")), str(arg(1, "new", ""))
        return len(text) + (text.count(old) if old else len(text) + 1) * len(new)
    if name in ("format", "format_map"):
        _check_format(text)
    return 0


class _BoundedCodeGenerator(CodeGenerator):
    def visit_Concat(self, node, frame) -> None:
        # ``a ~ b`` joins through the environment, so its result is bounded like ``a + b``.
        self.write("environment.bounded_concat((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


class _BoundedSandbox(ImmutableSandboxedEnvironment):
    """transformers' sandbox, with every way a template can grow a string or list bounded (see
    the module's docstring). Constant folding is off, so nothing runs at compile time."""

    intercepted_binops = frozenset({"*", "+", "%", "**"})
    code_generator_class = _BoundedCodeGenerator

    def __init__(self, **options):
        super().__init__(optimized=False, **options)
        self.globals.pop("lipsum", None)
        self.globals["range"] = self.bounded_range
        self.filters = {name: self._bounded_filter(name, f) for name, f in self.filters.items()}

    @staticmethod
    def bounded_range(*args):
        r = range(*args)
        if len(r) > MAX_RANGE:
            raise TemplateLimitError(f"range of {len(r)} numbers is over the limit of {MAX_RANGE}")
        return r

    @staticmethod
    def bounded_concat(parts) -> str:
        parts = [str(p) for p in parts]
        _check_length(sum(map(len, parts)))
        return "".join(parts)

    def call_binop(self, context, operator, left, right):
        if operator == "*":
            seq, n = (left, right) if isinstance(right, int) else (right, left)
            if isinstance(seq, (str, list, tuple)) and isinstance(n, int):
                _check_length(len(seq) * max(n, 0))
        elif operator == "+" and isinstance(left, (str, list, tuple)) and isinstance(right, (str, list, tuple)):
            _check_length(len(left) + len(right))
        elif operator == "%" and isinstance(left, str):
            _check_format(left)
            if "*" in left:                                       # widths taken from the arguments
                _check_ints(right if isinstance(right, tuple) else (right,))
        elif operator == "**" and isinstance(left, int) and isinstance(right, int) and abs(left) > 1:
            if right * left.bit_length() > 1 << 16:
                raise TemplateLimitError(f"{left} ** {right} is over the limit of 65536 bits")
        return _check_size(super().call_binop(context, operator, left, right))

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (the sandbox's own convention)
        _check_ints(args)
        _check_ints(kwargs.values())
        method = getattr(__obj, "__wrapped__", __obj)          # str.format comes wrapped
        owner, name = getattr(method, "__self__", None), getattr(method, "__name__", "")
        if isinstance(owner, str):
            if name == "join" and args:
                args = (list(args[0]),) + args[1:]
                _check_length(len(owner) * len(args[0]) + sum(len(str(x)) for x in args[0]))
            elif name in ("translate", "maketrans"):
                raise TemplateLimitError(f"str.{name} is not available to chat templates")
            _check_length(_amplifier_bound(name, owner, args, kwargs))
        return _check_size(super().call(__context, __obj, *args, **kwargs))

    @staticmethod
    def _bounded_filter(name, f):
        passes = getattr(f, "jinja_pass_arg", None) is not None

        @functools.wraps(f)
        def bounded(*args, **kwargs):
            lead, (value, *rest) = args[:passes], args[passes:]
            _check_ints(rest)
            _check_ints(kwargs.values())
            if name == "join":
                value = list(value)
                sep = rest[0] if rest else kwargs.get("d", "")
                _check_length(len(str(sep)) * len(value) + sum(len(str(x)) for x in value))
            else:
                _check_length(_amplifier_bound(name, value, tuple(rest), kwargs))
            return _check_size(f(*lead, value, *rest, **kwargs))
        return bounded


class _Generation(jinja2.ext.Extension):
    """transformers' {% generation %} ... {% endgeneration %} block (it marks the assistant's tokens
    for training masks; LFM2.5's and Laguna's templates use it): its body, rendered as it is."""

    tags = {"generation"}

    def parse(self, parser):
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


@functools.lru_cache(maxsize=8)
def _compile(template: str):
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        if isinstance(indent, int) and indent > 16 or isinstance(indent, str) and len(indent) > 16:
            raise TemplateLimitError(f"tojson indent {indent!r} is over the limit of 16")
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    def from_json(text):
        return json.loads(text)

    env = _BoundedSandbox(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols, _Generation])
    env.filters["tojson"] = env._bounded_filter("tojson", tojson)
    env.filters["from_json"] = env._bounded_filter("from_json", from_json)
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    try:
        return env.from_string(template)
    except jinja2.exceptions.TemplateSyntaxError as exc:
        raise UnsupportedError(f"the model's chat template does not parse (line {exc.lineno}): {exc.message}") from exc


@contextlib.contextmanager
def _deadline(seconds: float):
    """Stops template code (frames compiled from a template) that runs past ``seconds``, checking
    at every line it executes, on this thread only."""
    stop = time.monotonic() + seconds

    def line(frame, event, arg):
        if time.monotonic() > stop:
            raise TemplateLimitError(f"the render ran over the limit of {seconds:g} s")
        return line

    def call(frame, event, arg):
        return line if frame.f_code.co_filename == "<template>" else None

    previous = sys.gettrace()
    sys.settrace(call)
    try:
        yield
    finally:
        sys.settrace(previous)


def _plain_messages(messages: Sequence[dict]) -> list[dict]:
    """Checked copies of the messages: a role from ROLES, content a string (a list of OpenAI text
    parts is joined; an assistant message with tool calls may have no content)."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise InvalidArgumentError("messages must be a list of {'role': ..., 'content': ...} objects")
    if not messages:
        raise InvalidArgumentError("messages is empty: give at least one message")
    out = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise InvalidArgumentError(
                f"messages[{i}] must be an object with 'role' and 'content', got {type(msg).__name__}")
        role, content = msg.get("role"), msg.get("content")
        if role not in ROLES:
            raise InvalidArgumentError(f"messages[{i}].role must be one of {', '.join(ROLES)}, got {role!r}")
        if isinstance(content, list):
            texts = []
            for j, part in enumerate(content):
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise InvalidArgumentError(
                        f"messages[{i}].content[{j}]: only text parts ({{'type': 'text', 'text': ...}}) are supported")
                texts.append(part["text"])
            content = "".join(texts)
        elif content is None and role == "assistant" and msg.get("tool_calls"):
            content = ""
        elif not isinstance(content, str):
            raise InvalidArgumentError(f"messages[{i}].content must be a string, got {type(content).__name__}")
        if msg.get("tool_calls") is not None:
            _check_tool_calls(msg["tool_calls"], f"messages[{i}].tool_calls")
        out.append(dict(msg, role=role, content=content))
    return out


def _check_tool_calls(calls: Any, where: str) -> None:
    """An assistant turn's tool calls, as OpenAI's API sends them: each {"function": {"name", "arguments"}}."""
    if not isinstance(calls, list):
        raise InvalidArgumentError(f"{where} must be a list of tool calls")
    for j, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise InvalidArgumentError(f"{where}[{j}] must be an object with a function object that has a name")
        if not isinstance(fn.get("arguments", ""), (str, dict)):
            raise InvalidArgumentError(f"{where}[{j}].function.arguments must be a JSON string or an object")


def render(template: str, messages: Sequence[dict], add_generation_prompt: bool = True,
           bos_token: str = "", eos_token: str = "", *, max_chars: int = MAX_TEMPLATE_CHARS,
           timeout: float = TEMPLATE_TIMEOUT, **variables) -> str:
    """The conversation as the template writes it (what transformers' apply_chat_template returns
    with tokenize=False), within the limits ``max_chars`` and ``timeout`` (seconds). ``variables``
    are further template variables (e.g. tools)."""
    if not isinstance(template, str):
        raise UnsupportedError(f"the model's chat template is not a string but {type(template).__name__}")
    compiled = _compile(template)
    variables.setdefault("tools", None)
    variables.setdefault("documents", None)
    messages = _plain_messages(messages)
    size = sum(len(m["content"]) for m in messages)
    if size > max_chars:
        raise InvalidArgumentError(f"the messages have {size} characters, over the limit of {max_chars}")
    _render_limits.max_chars = max_chars
    out, n = [], 0
    try:
        with _deadline(timeout):
            for piece in compiled.generate(messages=messages, add_generation_prompt=add_generation_prompt,
                                           bos_token=bos_token, eos_token=eos_token, **variables):
                n += len(piece)
                if n > max_chars:
                    raise TemplateLimitError(f"the output is over the limit of {max_chars} characters")
                out.append(piece)
    except TemplateLimitError as exc:
        raise InvalidArgumentError(f"the chat template went over a limit: {exc}") from None
    except jinja2.exceptions.TemplateError as exc:   # raise_exception, and the sandbox's refusals
        raise InvalidArgumentError(f"the chat template rejected the messages: {exc}") from exc
    except Exception as exc:                        # a template is code: it can fail in any way
        raise InvalidArgumentError(f"the chat template failed: {type(exc).__name__}: {exc}") from None
    finally:
        del _render_limits.max_chars
    return "".join(out)


# ---------------------------------------------------------------------------------------------
# What a template does with tools
# ---------------------------------------------------------------------------------------------

_PROBE_TOOL = {"type": "function", "function": {"name": "rapidmoe_probe_tool", "description": "A probe.",
                                                "parameters": {"type": "object", "properties": {}}}}


class TemplateTools(NamedTuple):
    renders_tools: bool      # it writes the tools given as ``tools`` into the prompt
    object_arguments: bool   # it takes a tool call's arguments as an object (else as a JSON string)


@functools.lru_cache(maxsize=8)
def template_tools(template: str) -> TemplateTools:
    """What ``template`` does with tools, found by rendering it, as llama.cpp finds a template's
    capabilities: whether a tool given to it appears in its output, and whether a call's
    arguments given as an object do (those given as a string otherwise)."""
    def output(messages, **variables) -> str:
        try:
            return render(template, messages, **variables)
        except RapidMoEError:
            return ""

    user = {"role": "user", "content": "Hello."}
    renders_tools = "rapidmoe_probe_tool" in output([user], tools=[_PROBE_TOOL])

    def called(arguments) -> list[dict]:
        call = {"id": "call_probe", "type": "function",
                "function": {"name": "rapidmoe_probe_tool", "arguments": arguments}}
        return [user, {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_probe", "content": "done"}]

    as_object = "rapidmoe_probe_arg" in output(called({"rapidmoe_probe_arg": "x"}))
    as_string = "rapidmoe_probe_arg" in output(called('{"rapidmoe_probe_arg": "x"}'))
    return TemplateTools(renders_tools, as_object or not as_string)


def render_chat(template: str, messages: Sequence[dict], add_generation_prompt: bool = True, *,
                tools: tool_calls.ToolUse | None = None, **options) -> str:
    """``render``, with a request's tools given to the template as it is to get them (see
    tool_calls.ToolUse.prompt), and the arguments of the messages' tool calls in the form the
    template takes (tool_calls.template_arguments); DeepSeek-V4's tool results in the order of
    their calls (tool_calls.results_in_call_order). ``options``: render's."""
    messages = _plain_messages(messages)
    if isinstance(template, str) and (tools is not None or any(m.get("tool_calls") for m in messages)):
        caps = template_tools(template)
        if tools is not None:
            messages, options["tools"] = tools.prompt(messages, caps.renders_tools)
        messages = tool_calls.template_arguments(messages, caps.object_arguments)
        if tool_calls.detect(template) is tool_calls.DEEPSEEK_V4:
            messages = tool_calls.results_in_call_order(messages)
    return render(template, messages, add_generation_prompt, **options)


# ---------------------------------------------------------------------------------------------
# The harmony format's channels (gpt-oss)
# ---------------------------------------------------------------------------------------------

_HARMONY_TOKENS = ("<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>", "<|call|>", "<|constrain|>")
_HARMONY_TAG = re.compile("|".join(re.escape(t) for t in _HARMONY_TOKENS))


def is_harmony(tokenizer) -> bool:
    """Whether the vocabulary has the harmony format's tokens (gpt-oss's o200k_harmony)."""
    return all(tokenizer.backend.token_to_id(t) is not None for t in ("<|channel|>", "<|message|>", "<|end|>"))


class HarmonyPiece(NamedTuple):
    """A piece of a harmony message's text: its channel, the header's recipient (``to=...``, e.g.
    "functions.get_weather"; None without one), and which message it is in (counting the
    <|message|> tags; 0 for text before any)."""

    channel: str
    text: str
    recipient: str | None
    message: int


class HarmonyChannels:
    """Splits a streamed harmony reply into channels: ``feed(text)`` returns the (channel, text)
    pieces that text completes, in order, and ``read(text)`` the same as HarmonyPieces; a tag split
    between two pieces is held back until it is whole. Text before any channel header (a reply
    that does not use the format) is channel "final", unless it starts with ``to=``: then the reply
    goes on with the header the generation prompt began (``<|start|>assistant``), as the templates
    write a call (`` to=functions.NAME<|channel|>commentary json<|message|>``)."""

    def __init__(self):
        self.channel = "final"
        self.recipient: str | None = None
        self._message = 0
        self._state = "reply"        # "reply": nothing read yet; "header": from <|start|> or <|channel|> (or a
                                     # leading to=) to <|message|>; "message": content; "between": neither
        self._header = ""
        self._channel_at: int | None = None   # where in the header the channel's name follows <|channel|>
        self._held = ""

    def feed(self, text: str) -> list[tuple[str, str]]:
        return [(p.channel, p.text) for p in self.read(text)]

    def flush(self) -> list[tuple[str, str]]:
        return [(p.channel, p.text) for p in self.read_rest()]

    def read(self, text: str) -> list[HarmonyPiece]:
        text = self._held + text
        self._held = ""
        if self._state == "reply":
            lead = text.lstrip()[:3]
            if len(lead) < 3 and "to=".startswith(lead):   # no text yet, or maybe the start of to=
                self._held = text
                return []
            self._state = "header" if lead == "to=" else "message"
        cut = text.rfind("<|") if not text.endswith("<") else len(text) - 1
        if cut >= 0 and _HARMONY_TAG.match(text, cut) is None and "|>" not in text[cut:]:
            text, self._held = text[:cut], text[cut:]   # maybe the start of a tag
        out: list[HarmonyPiece] = []
        pos = 0
        for m in _HARMONY_TAG.finditer(text):
            self._take(text[pos:m.start()], out)
            tag = m.group()
            if tag == "<|start|>":
                self._state, self._header, self._channel_at = "header", "", None
            elif tag == "<|channel|>":            # after <|start|>ROLE, or opening a header itself
                if self._state != "header":
                    self._state, self._header = "header", ""
                self._header += " "
                self._channel_at = len(self._header)
            elif tag == "<|message|>":
                self._open_message()
            elif tag == "<|constrain|>":
                self._header += " "
            else:                               # <|end|>, <|return|>, <|call|>: the message is over
                self._state, self._header = "between", ""
            pos = m.end()
        self._take(text[pos:], out)
        return out

    def read_rest(self) -> list[HarmonyPiece]:
        out: list[HarmonyPiece] = []
        if self._state == "reply":
            self._state = "message"
        self._take(self._held, out)
        self._held = ""
        return out

    def _open_message(self) -> None:
        """A header is over: its channel is the first word after <|channel|> (without one, the first
        after the role), its recipient the word after ``to=`` anywhere in it."""
        words = self._header.split()
        self.recipient = next((w[len("to="):] for w in words if w.startswith("to=")), None)
        if self._channel_at is not None:
            names = self._header[self._channel_at:].split()
        else:
            names = words[1:] if words[:1] == ["assistant"] else words
        names = [w for w in names if not w.startswith("to=")]
        self.channel = names[0] if names else "final"
        self._message += 1
        self._state = "message"

    def _take(self, text: str, out: list) -> None:
        if not text:
            return
        if self._state == "header":
            self._header += text
        elif self._state == "message":
            out.append(HarmonyPiece(self.channel, text, self.recipient, self._message))


def split_channels(text: str) -> dict[str, str]:
    """A whole harmony reply's text per channel ({"analysis": ..., "final": ...})."""
    h = HarmonyChannels()
    out: dict[str, str] = {}
    for channel, piece in h.feed(text) + h.flush():
        out[channel] = out.get(channel, "") + piece
    return out


def _token_text(tokenizer, token_id: int | None) -> str:
    if token_id is None or not 0 <= token_id < tokenizer.n_vocab:
        return ""
    return tokenizer.token_to_piece(token_id).decode("utf-8", "replace")


# The variables chat_prompt itself gives every template; chat_template_kwargs may not replace them.
_OWN_VARIABLES = frozenset({"messages", "add_generation_prompt", "bos_token", "eos_token", "tools", "documents"})


def template_kwargs(kwargs: Mapping | None) -> dict:
    """A request's ``chat_template_kwargs`` (e.g. ``{"enable_thinking": false}``, which Qwen3's and
    GLM's templates read) as template variables: names that are identifiers and not the ones the
    renderer gives itself; values as JSON gave them (the sandbox runs the template)."""
    if kwargs is None:
        return {}
    if not isinstance(kwargs, Mapping):
        raise InvalidArgumentError(f"chat_template_kwargs must be an object, got {type(kwargs).__name__}")
    for name in kwargs:
        if not isinstance(name, str) or not name.isidentifier():
            raise InvalidArgumentError(f"chat_template_kwargs: {str(name)[:40]!r} is not a template variable name")
        if name in _OWN_VARIABLES:
            raise InvalidArgumentError(f"chat_template_kwargs: {name!r} is given by the renderer itself")
    return dict(kwargs)


# The reasoning efforts a request may name: OpenAI's, and DeepSeek-V4's template's "max".
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")


def effort_variables(reasoning_effort: str | None, variables: Mapping) -> dict:
    """Template variables with a request's ``reasoning_effort``, as llama-server gives them: a
    level of REASONING_EFFORTS becomes the template's ``reasoning_effort`` (over one given in
    ``chat_template_kwargs``); "none" turns thinking off (``enable_thinking``, which Qwen3's and
    GLM's templates read, and ``thinking``, DeepSeek-V3.1's and V4's, false) and gives the template
    no effort; no field leaves the variables as they are. Templates read the levels they
    know (gpt-oss's low to high, DeepSeek-V4's "max") and ignore the rest."""
    out = dict(variables)
    if reasoning_effort is None:
        return out
    if not isinstance(reasoning_effort, str) or reasoning_effort not in REASONING_EFFORTS:
        raise InvalidArgumentError(f"reasoning_effort must be one of {', '.join(REASONING_EFFORTS)}, "
                                   f"got {str(reasoning_effort)[:40]!r}")
    if reasoning_effort == "none":
        out.pop("reasoning_effort", None)
        out["enable_thinking"] = out["thinking"] = False
    else:
        out["reasoning_effort"] = reasoning_effort
    return out


def format_variables(template: str | None, response_format: Any, variables: Mapping) -> dict:
    """Template variables with a request's ``response_format`` for DeepSeek-V4's template, which
    writes the schema into its system prompt as ``response_format`` (llama.cpp gives it the
    schema so); other templates' variables as they are. Raises InvalidArgumentError for a
    response_format that asks for no schema it knows."""
    out = dict(variables)
    if tool_calls.detect(template) is tool_calls.DEEPSEEK_V4:
        from . import grammar

        schema = grammar.schema_of(response_format)
        if schema is not None:
            out["response_format"] = schema
    return out


def chat_prompt(model, messages: Sequence[dict], add_generation_prompt: bool = True, *,
                max_chars: int = MAX_TEMPLATE_CHARS, timeout: float = TEMPLATE_TIMEOUT,
                tools: tool_calls.ToolUse | None = None, **variables) -> list[int]:
    """Token ids of the conversation rendered with ``model``'s template (render_chat, within
    ``render``'s limits; ``tools``: the request's; ``variables``: further template variables, e.g.
    reasoning_effort). BOS is added when the model wants one and the template did not write it
    already."""
    tok = model.tokenizer
    if not tok.chat_template:
        raise UnsupportedError(
            f"{os.path.basename(model.path)}: the model has no chat template (tokenizer.chat_template is not "
            "in its GGUF metadata); use create_completion with a prompt in the model's own format")
    bos, eos = _token_text(tok, tok.bos_id), _token_text(tok, tok.eos_id)
    text = render_chat(tok.chat_template, messages, add_generation_prompt, tools=tools, bos_token=bos, eos_token=eos,
                       max_chars=max_chars, timeout=timeout, **{k: v for k, v in variables.items() if v is not None})
    ids = tok.encode(text, add_special=False)
    if tok.add_bos and tok.bos_id is not None and (not ids or ids[0] != tok.bos_id):
        ids.insert(0, tok.bos_id)
    return ids


def create_chat_completion(llm, messages: Sequence[dict], max_tokens: int | None = None,
                           temperature: float = _SD["temperature"], top_p: float = _SD["top_p"],
                           top_k: int = _SD["top_k"], min_p: float = _SD["min_p"],
                           repeat_penalty: float = _SD["repeat_penalty"], seed: int | None = _SD["seed"],
                           stop: str | Sequence[str] | None = None, stream: bool = False,
                           model: str | None = None, reasoning_effort: str | None = None,
                           show_reasoning: bool = False, logprobs: bool = False, top_logprobs: int | None = None,
                           logit_bias: Mapping | None = None, chat_template_kwargs: Mapping | None = None,
                           tools: Sequence[dict] | None = None, tool_choice: str | Mapping | None = None,
                           parallel_tool_calls: bool | None = None, response_format: Mapping | None = None,
                           reasoning_format: str = "auto", grammar: str | None = None):
    """``llm.create_chat_completion`` (see Model): ``llm`` is the Model, ``model`` the name the
    result reports (default: the file's name). For a harmony model (gpt-oss) the content is the
    final channel's, with the analysis channel as ``reasoning_content`` when ``show_reasoning``;
    its ``logprobs`` cover every generated token, the channels' headers and a hidden analysis
    included (they go with the next chunk shown). With ``tools`` the reply's calls come as the
    message's ``tool_calls`` (see rapidmoe_gguf.tool_calls)."""
    variables = effort_variables(reasoning_effort, template_kwargs(chat_template_kwargs))
    variables = format_variables(llm.tokenizer.chat_template, response_format, variables)
    n_top = chat_top_logprobs(logprobs, top_logprobs)
    bias = LogitBias.check(logit_bias, llm.n_vocab)
    use = tool_calls.tool_use(llm.tokenizer.chat_template, tools, tool_choice, parallel_tool_calls)
    prompt = chat_prompt(llm, messages, tools=use, **variables)
    harmony = is_harmony(llm.tokenizer)
    constrained = response_grammar(llm.tokenizer, response_format, harmony, use,
                                   thinking_mode(llm.tokenizer, prompt), grammar)
    thinking = thinking_mode(llm.tokenizer, prompt, reasoning_format)
    if max_tokens is None:
        max_tokens = max(llm.n_ctx - len(prompt), 0)
    sampling = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                              repeat_penalty=repeat_penalty, seed=seed)
    completion = llm._completion(prompt, max_tokens, sampling, stop, stream, model, n_top, bias, "chat",
                                 grammar=constrained)
    if stream:
        return as_chat_chunks(completion, HarmonyChannels() if harmony else None, show_reasoning, use, thinking)
    choice = completion["choices"][0]
    reply = Reply(HarmonyChannels() if harmony else None, show_reasoning, use, thinking)
    message = fold_message(reply.feed(choice["text"]) + reply.flush())
    return {"id": "chat" + completion["id"], "object": "chat.completion", "created": completion["created"],
            "model": completion["model"],
            "choices": [{"index": 0, "message": message, "logprobs": choice["logprobs"],
                         "finish_reason": reply.finish_reason(choice["finish_reason"])}],
            "usage": completion["usage"]}


def response_grammar(tokenizer, response_format, harmony: bool, tools: tool_calls.ToolUse | None = None,
                     thinking: bool | None = None, gbnf: str | None = None):
    """The grammar.Grammar a chat request asks for, or None (free text): ``gbnf`` (llama.cpp's
    grammar text, the whole reply), else ``response_format``'s JSON (after the model's thinking),
    else its tools' (see rapidmoe_gguf.tool_grammar: a forced call, or well-formed calls under
    tool_choice auto). ``thinking``: ``thinking_mode(tokenizer, prompt)`` of the prompt. Raises
    InvalidArgumentError whose message starts with the field at fault."""
    from . import grammar, tool_grammar

    schema = grammar.schema_of(response_format)
    forced = tools is not None and tools.choice not in ("auto", "none")
    if forced and (schema is not None or gbnf is not None):
        field = "grammar" if gbnf is not None else "response_format"
        raise InvalidArgumentError(f"{field}: a reply of its own and a forced tool call (tool_choice) "
                                   "cannot both be asked for")
    if gbnf is not None:
        if schema is not None:
            raise InvalidArgumentError("grammar: a grammar and a response_format cannot both be given")
        return grammar.Grammar(tokenizer, gbnf=gbnf)
    pieces = tool_grammar.Pieces(tokenizer)
    if schema is not None:
        if not harmony and thinking is None:
            return grammar.Grammar(tokenizer, schema)
        return grammar.Grammar(tokenizer, where="response_format", schema=schema,
                               lark=tool_grammar.json_reply_lark(schema, pieces, grammar.JSON_FORM, thinking,
                                                                 harmony, think_tags(tokenizer.chat_template)))
    lark = tool_grammar.tool_call_lark(tools, pieces, grammar.JSON_FORM, thinking,
                                       think_tags(tokenizer.chat_template)) if tools is not None else None
    return None if lark is None else grammar.Grammar(tokenizer, where="tools", lark=lark)


def as_chat_chunks(completion: Iterator[dict], channels: HarmonyChannels | None = None,
                   show_reasoning: bool = False, tools: tool_calls.ToolUse | None = None,
                   thinking: bool | None = None) -> Iterator[dict]:
    """Text-completion chunks (a generator) as chat chunks (see ChatChunks). Closing this closes
    ``completion``, stopping generation."""
    chunks = ChatChunks(channels, show_reasoning, tools, thinking)
    with contextlib.closing(completion):
        for c in completion:
            yield from chunks.feed(c)


REASONING_FORMATS = ("auto", "deepseek", "none")
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
# The thinking blocks the templates write: <think> ... </think>, and Gemma 4's thought channel
THINK_TAGS = ((THINK_OPEN, THINK_CLOSE), ("<|channel>thought", "<channel|>"))


def think_tags(template: str | None) -> tuple[str, str]:
    """The thinking block's tags a chat template writes (<think>'s where it writes none)."""
    return next((t for t in THINK_TAGS[1:] if t[0] in (template or "")), THINK_TAGS[0])


def thinking_mode(tokenizer, prompt_ids: Sequence[int], reasoning_format: str = "auto") -> bool | None:
    """How a reply to this prompt is read for its thinking (``Thinking``): None when it is not
    (``reasoning_format`` "none", or a template that writes no <think> tags: harmony's channels
    are read elsewhere); True when the prompt ends inside a <think> block (DeepSeek-R1's and
    Qwen3.5's templates open it for the reply); False when a <think> block may open the reply."""
    if reasoning_format not in REASONING_FORMATS:
        raise InvalidArgumentError(f"reasoning_format must be one of {', '.join(REASONING_FORMATS)}, "
                                   f"got {str(reasoning_format)[:40]!r}")
    template = tokenizer.chat_template or ""
    if reasoning_format == "none" or not any(o in template for o, _ in THINK_TAGS) or is_harmony(tokenizer):
        return None
    tail = tokenizer.decode(list(prompt_ids[-8:])).rstrip()
    return tail.endswith(think_tags(template)[0])


class Thinking:
    """A reply's text split into its thinking and its content: a <think> ... </think> block at
    the reply's start (or Gemma 4's <|channel>thought ... <channel|>; with ``inside``, the text up
    to </think>) is reasoning, the rest content, as llama.cpp's server splits them
    (reasoning_format "auto"/"deepseek"). Whitespace just inside the tags and just after the block
    is dropped. Text that may be the start of a tag is held back until it is known not to be one;
    a reply that ends while thinking leaves all of it as reasoning. ``ends``: texts that also end
    the thinking where they open, and begin the content (a tool-call block, for the formats of
    tool_calls.ENDS_THINKING)."""

    def __init__(self, inside: bool, ends: Sequence[str] = ()):
        self.state = "thinking" if inside else "start"
        self.close = THINK_CLOSE  # the opened block's closing tag
        self.ends = tuple(ends)
        self._held = ""
        self._lead = True         # skipping the whitespace that opens the reasoning or the content

    def read(self, text: str) -> list[tuple[str, str]]:
        """("reasoning" | "content", text) pieces of the next text."""
        self._held += text
        out: list[tuple[str, str]] = []
        while self._held:
            if self.state == "start":
                head = self._held.lstrip()
                opened = next(((o, c) for o, c in THINK_TAGS if head.startswith(o)), None)
                if opened:
                    self._held, self.state, self._lead = head[len(opened[0]):], "thinking", True
                    self.close = opened[1]
                elif any(o.startswith(head) for o, _ in THINK_TAGS):   # still maybe a tag (or only whitespace)
                    break
                else:                                    # no thinking: the text as it is
                    self.state, self._lead = "content", False
            elif self.state == "thinking":
                if self._lead:
                    self._held = self._held.lstrip()
                    if not self._held:
                        break
                    self._lead = False
                at = self._held.find(self.close)
                cut = min((i for i in map(self._held.find, self.ends) if i >= 0), default=-1)
                if cut >= 0 and (at < 0 or cut < at):      # a block that ends the thinking and stays
                    if self._held[:cut].rstrip():
                        out.append(("reasoning", self._held[:cut].rstrip()))
                    self._held, self.state, self._lead = self._held[cut:], "content", False
                    continue
                if at >= 0:
                    if self._held[:at].rstrip():
                        out.append(("reasoning", self._held[:at].rstrip()))
                    self._held, self.state, self._lead = self._held[at + len(self.close):], "content", True
                    continue
                # a tag's start, and whitespace before it
                keep = max(_partial_suffix(self._held, tag) for tag in (self.close, *self.ends))
                keep = len(self._held) - len(self._held[:len(self._held) - keep].rstrip())
                if keep < len(self._held):
                    out.append(("reasoning", self._held[:len(self._held) - keep]))
                    self._held = self._held[len(self._held) - keep:]
                break
            else:
                if self._lead:
                    self._held = self._held.lstrip()
                    if not self._held:
                        break
                    self._lead = False
                out.append(("content", self._held))
                self._held = ""
        return out

    def read_rest(self) -> list[tuple[str, str]]:
        """What is held at the reply's end: reasoning while thinking, else content."""
        rest, self._held = self._held, ""
        if self.state == "thinking":
            return [("reasoning", rest.rstrip())] if rest.strip() else []
        if self.state == "start":                        # a reply that is (the start of) the tag or blank
            return [("content", rest)] if rest else []
        rest = rest.lstrip() if self._lead else rest
        return [("content", rest)] if rest else []


def _partial_suffix(text: str, tag: str) -> int:
    """The length of the longest end of text that is a proper start of tag."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


class Reply:
    """A reply's text, given in pieces (``feed``, then ``flush`` at its end), as chat deltas:
    {"content"}, {"reasoning_content"} and {"tool_calls"}. With ``channels`` (a harmony model)
    only the final channel is content; the analysis channel goes into ``reasoning_content`` when
    ``show_reasoning``, else nowhere. ``thinking`` (thinking_mode's): the reply's <think> block
    goes into ``reasoning_content`` (Thinking). With ``tools`` the reply's calls become
    ``tool_calls`` deltas (tool_calls.CallParser; a harmony model's calls are its messages to
    functions.NAME), read from its content."""

    def __init__(self, channels: HarmonyChannels | None = None, show_reasoning: bool = False,
                 tools: tool_calls.ToolUse | None = None, thinking: bool | None = None):
        calls = tools.parser() if tools is not None else None
        if isinstance(calls, tool_calls.HarmonyCalls) and channels is None:
            channels = HarmonyChannels()       # the template's format is harmony's: its calls are messages
        self.channels, self.show_reasoning, self.calls = channels, show_reasoning, calls
        ends = tools.format.starts if calls is not None and tools.format.name in tool_calls.ENDS_THINKING else ()
        self.thinking = Thinking(thinking, ends) if thinking is not None and channels is None else None

    @property
    def n_calls(self) -> int:
        return self.calls.n_calls if self.calls is not None else 0

    def feed(self, text: str) -> list[dict]:
        if self.thinking is not None:
            return self._thought(self.thinking.read(text))
        if self.channels is None:
            return self._content(text)
        return self._pieces(self.channels.read(text))

    def flush(self) -> list[dict]:
        if self.thinking is not None:
            out = self._thought(self.thinking.read_rest())
        else:
            out = self._pieces(self.channels.read_rest()) if self.channels is not None else []
        return out + (self.calls.flush() if self.calls is not None else [])

    def _thought(self, pieces: list[tuple[str, str]]) -> list[dict]:
        out: list[dict] = []
        for kind, text in pieces:
            out += [{"reasoning_content": text}] if kind == "reasoning" else self._content(text)
        return out

    def finish_reason(self, reason: str) -> str:
        """A reply that stopped by itself after calling tools finishes with "tool_calls", as OpenAI's do."""
        return "tool_calls" if reason == "stop" and self.n_calls else reason

    def _content(self, text: str) -> list[dict]:
        """The deltas of text that is the reply's content unless it holds calls (in a text format)."""
        if self.calls is None or isinstance(self.calls, tool_calls.HarmonyCalls):
            return [{"content": text}]
        return self.calls.feed(text)

    def _pieces(self, pieces: list[HarmonyPiece]) -> list[dict]:
        out: list[dict] = []
        harmony_calls = self.calls if isinstance(self.calls, tool_calls.HarmonyCalls) else None
        for p in pieces:
            if harmony_calls is not None:
                out += harmony_calls.piece(p)          # a call that this piece's message ends, if any
                if harmony_calls.is_call(p):
                    continue
            if p.channel == "final":
                out += self._content(p.text)
            elif p.channel == "analysis" and self.show_reasoning:
                out.append({"reasoning_content": p.text})
        return out


def fold_message(deltas: Sequence[dict]) -> dict:
    """A reply's deltas as the one assistant message: content (null when there are tool calls and
    no content), reasoning_content when there is any, and tool_calls when there are any."""
    content = "".join(d.get("content", "") for d in deltas)
    reasoning = "".join(d.get("reasoning_content", "") for d in deltas)
    calls: dict[int, dict] = {}
    for d in deltas:
        for tc in d.get("tool_calls", ()):
            call = calls.setdefault(tc["index"], {"id": None, "type": "function",
                                                  "function": {"name": "", "arguments": ""}})
            call["id"] = tc.get("id", call["id"])
            call["function"]["name"] += tc["function"].get("name", "")
            call["function"]["arguments"] += tc["function"].get("arguments", "")
    message: dict[str, Any] = {"role": "assistant", "content": content or (None if calls else "")}
    if reasoning:
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return message


class ChatChunks:
    """Text-completion chunks as chat chunks, one at a time: the role first, then the reply's
    deltas (see Reply), then an empty delta with the finish reason ("tool_calls" for a reply that
    called tools and stopped by itself)."""

    def __init__(self, channels: HarmonyChannels | None = None, show_reasoning: bool = False,
                 tools: tool_calls.ToolUse | None = None, thinking: bool | None = None):
        self.reply = Reply(channels, show_reasoning, tools, thinking)
        self._head: dict | None = None
        self._tokens: list[dict] = []      # logprobs of tokens whose text no chat chunk has carried yet

    def feed(self, c: dict) -> list[dict]:
        """The chat chunks that the completion chunk c gives. The completion chunk's logprobs (chat
        shape: {"content": [...]}) go with the first chunk that carries text, or with the last
        (where the finish reason is) when none does; text that is not shown yet (held back, or an
        analysis channel not asked for) passes its logprobs on to the next."""
        out = []
        if self._head is None:
            self._head = {"id": "chat" + c["id"], "object": "chat.completion.chunk", "created": c["created"],
                          "model": c["model"]}
            out.append(self._chunk({"role": "assistant"}))
        choice = c["choices"][0]
        if choice.get("logprobs"):
            self._tokens += choice["logprobs"]["content"]
        if choice["finish_reason"] is not None:
            out += [self._chunk(d) for d in self.reply.flush()]
            out.append(self._chunk({}, self.reply.finish_reason(choice["finish_reason"])))
        elif choice["text"]:
            out += [self._chunk(d) for d in self.reply.feed(choice["text"])]
        return out

    def _chunk(self, delta: dict, finish_reason: str | None = None) -> dict:
        logprobs = None
        if self._tokens and ("role" not in delta or finish_reason is not None):
            logprobs, self._tokens = {"content": self._tokens}, []
        return dict(self._head, choices=[{"index": 0, "delta": delta, "logprobs": logprobs,
                                          "finish_reason": finish_reason}])

"""Tool calls: a chat request's ``tools``, offered to the model in its own format, and the calls
in its reply read back as OpenAI's ``tool_calls``.

A model calls tools in the syntax it was trained on, which its chat template shows (the tools
listing it writes, the way it writes an assistant turn's calls). ``detect`` names the format from
the template's text, as llama.cpp's common/chat.cpp does:

    harmony       gpt-oss: a message <|channel|>commentary to=functions.NAME ... <|message|>{json}
                  <|call|>
    kimi-k2       <|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:0
                  <|tool_call_argument_begin|>{json}<|tool_call_end|>...<|tool_calls_section_end|>
    deepseek      DeepSeek-V3.1: <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{json}
                  <｜tool▁call▁end｜>...<｜tool▁calls▁end｜> (R1's older function<｜tool▁sep｜>NAME\\n```json
                  ...``` too)
    minimax-m2    <minimax:tool_call><invoke name="NAME"><parameter name="K">V</parameter>...</invoke>
                  ...</minimax:tool_call>
    deepseek-v3.2 DeepSeek-V3.2's DSML: <｜DSML｜function_calls><｜DSML｜invoke name="NAME">
                  <｜DSML｜parameter name="K" string="true|false">V</｜DSML｜parameter>...</｜DSML｜invoke>
                  ...</｜DSML｜function_calls>
    deepseek-v4   DeepSeek-V4's DSML: the same, in a <｜DSML｜tool_calls> ... </｜DSML｜tool_calls> block
    glm-4.5       GLM-4.5 to 4.7: <tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>...</tool_call>
    qwen3-coder   Qwen3-Coder, Qwen3.5: <tool_call><function=NAME><parameter=K>V</parameter>...</function>
                  </tool_call>
    hermes        Qwen2.5, Qwen3, Hermes: <tool_call>{"name": NAME, "arguments": {...}}</tool_call>
    gemma4        Gemma 4: <|tool_call>call:NAME{K:V,...}<tool_call|>, its own notation: keys bare, strings
                  between <|"|> tokens, numbers, true/false/null, {...} and [...] as in JSON
    generic       any other template: the tools are described in a system message, which asks for a
                  reply that is only {"tool_calls": [{"name": NAME, "arguments": {...}}]}

The XML formats' values are text: a value is the string itself when the tool's parameter schema
says "string", else the JSON value it spells (a number, an object), else the string. DSML's values
say what they are: string="true", the text itself; string="false", JSON (a value that is not JSON
makes the call malformed).

Prompt side (``ToolUse.prompt``): a known format's template gets ``tools=`` as transformers'
apply_chat_template passes it, and writes the listing itself; where it does not (DeepSeek-V3.1's
template lists no tools), a system message lists them with the format's syntax. The generic format
gives the template no tools: its history too is rewritten as text (an assistant turn's calls as the
JSON the model is asked for, tool results as user turns), so a template that cannot write tools is
never asked to. ``tool_choice``: "auto" (the default), "none" (the template still sees the tools,
as llama.cpp's server does, but the reply is not read for calls), "required" or a named function.
"required" and a named function are enforced by constrained decoding in every format
(rapidmoe_gguf.tool_grammar): the reply is one call or more (one with ``parallel_tool_calls``
false) of the offered tools, with arguments of their schemas, after the model's thinking if it
thinks; they are said in the system message too. Under "auto" a call the model starts is kept
well formed where the format has an opening marker (all but the generic and harmony formats).

Reply side (``CallParser``; ``HarmonyCalls`` for gpt-oss): the reply's text becomes content and calls, each call
``{"id", "type": "function", "function": {"name", "arguments": a JSON string}}``. A call block that
does not parse, or names a tool not offered, is returned as content, never dropped; whitespace next
to a call block is formatting and goes. Streaming, text that may be the start of a call marker is
held back until it is known not to be, and a call block until it is whole: then its deltas follow
(OpenAI's ``delta.tool_calls``: index, id and name first, then the arguments), so the chunks of a
stream join to exactly the whole reply's result, however the text was split.
"""

from __future__ import annotations

import dataclasses
import json
import re
import uuid
from typing import Any, Callable, Iterable, Mapping, Sequence

from .errors import InvalidArgumentError

Call = tuple[str, dict]                      # (tool name, arguments)
Params = Mapping[str, Mapping[str, Any]]     # tool name -> its parameters' schemas ("properties")

# OpenAI's rule for a function's name; it also keeps a name from breaking the markup it goes into.
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


def _shown(value: Any) -> str:
    """A value of a request, for an error message: as JSON, cut at 80 characters."""
    return json.dumps(value, default=repr)[:80]


# ---------------------------------------------------------------------------------------------
# Reading a call block
# ---------------------------------------------------------------------------------------------

def _json(text: str) -> Any:
    """The JSON value text holds, or None (also for NaN and Infinity, which are not JSON)."""
    def refuse(name):
        raise ValueError(name)

    try:
        return json.loads(text, parse_constant=refuse)
    except (ValueError, RecursionError):
        return None


def _object(text: str) -> dict | None:
    """The JSON object text holds, or None."""
    value = _json(text)
    return value if isinstance(value, dict) else None


def _arguments(value: Any) -> dict | None:
    """A call's "arguments" member: an object, or a string holding one (absent: none); None if
    it is anything else."""
    if value is None:
        return {}
    return _object(value) if isinstance(value, str) else value if isinstance(value, dict) else None


def _named_call(obj: Any) -> Call | None:
    """{"name": ..., "arguments": {...}} as a call."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = _arguments(obj.get("arguments"))
    return None if args is None else (obj["name"], args)


def _inner(block: str, start: str, end: str) -> str:
    """The block without its opening marker and its closing one (absent when the reply ended first)."""
    inner = block[len(start):]
    return inner[:-len(end)] if end and inner.endswith(end) else inner


def _xml_value(raw: str, schema: Any) -> Any:
    """An XML format's value: the text without the newline the templates put at each end; as is
    for a string parameter, else the JSON it spells, if any."""
    text = raw[1:] if raw.startswith("\n") else raw
    text = text[:-1] if text.endswith("\n") else text
    kind = schema.get("type") if isinstance(schema, Mapping) else None
    kinds = {k for k in (kind if isinstance(kind, list) else [kind]) if isinstance(k, str)}
    if "string" in kinds and kinds <= {"string", "null"} and not ("null" in kinds and text == "null"):
        return text
    value = _json(text)
    return text if value is None and text != "null" else value


def _xml_arguments(body: str, pair: re.Pattern, schemas: Mapping[str, Any]) -> dict | None:
    """The (key, value) pairs that ``pair`` matches one after another, making up all of body but
    whitespace; None if anything else is there."""
    args, pos = {}, 0
    while m := pair.match(body, pos):
        key = m.group(1).strip()
        args[key] = _xml_value(m.group(2), schemas.get(key))
        pos = m.end()
    return args if not body[pos:].strip() else None


def _sequence(body: str, item: re.Pattern, read: Callable[[re.Match], Call | None]) -> list[Call] | None:
    """The calls that ``item`` matches one after another, making up all of body but whitespace."""
    calls, pos = [], 0
    while m := item.match(body, pos):
        call = read(m)
        if call is None:
            return None
        calls.append(call)
        pos = m.end()
    return calls if calls and not body[pos:].strip() else None


def _read_hermes(block: str, params: Params) -> list[Call] | None:
    call = _named_call(_json(_inner(block, "<tool_call>", "</tool_call>").strip()))
    return None if call is None else [call]


_QWEN_FUNCTION = re.compile(r"\s*<function=([^>\n]+)>(.*)</function>\s*", re.S)
_QWEN_PARAMETER = re.compile(r"\s*<parameter=([^>\n]+)>(.*?)</parameter>", re.S)


def _read_qwen3_coder(block: str, params: Params) -> list[Call] | None:
    m = _QWEN_FUNCTION.fullmatch(_inner(block, "<tool_call>", "</tool_call>"))
    if m is None:
        return None
    name = m.group(1).strip()
    args = _xml_arguments(m.group(2), _QWEN_PARAMETER, params.get(name, {}))
    return None if args is None else [(name, args)]


_GLM_PAIR = re.compile(r"\s*<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.S)


def _read_glm(block: str, params: Params) -> list[Call] | None:
    body = _inner(block, "<tool_call>", "</tool_call>")
    cut = body.find("<arg_key>")
    name = (body if cut < 0 else body[:cut]).strip()
    if not name or any(c.isspace() for c in name):
        return None
    args = _xml_arguments(body[len(body) if cut < 0 else cut:], _GLM_PAIR, params.get(name, {}))
    return None if args is None else [(name, args)]


_MINIMAX_INVOKE = re.compile(r'\s*<invoke name="([^"]+)">(.*?)</invoke>', re.S)
_MINIMAX_PARAMETER = re.compile(r'\s*<parameter name="([^"]+)">(.*?)</parameter>', re.S)


def _read_minimax(block: str, params: Params) -> list[Call] | None:
    def read(m: re.Match) -> Call | None:
        name = m.group(1).strip()
        args = _xml_arguments(m.group(2), _MINIMAX_PARAMETER, params.get(name, {}))
        return None if args is None else (name, args)

    return _sequence(_inner(block, "<minimax:tool_call>", "</minimax:tool_call>"), _MINIMAX_INVOKE, read)


_DSML_INVOKE = re.compile(r'\s*<｜DSML｜invoke name="([^"]+)">(.*?)</｜DSML｜invoke>', re.S)
_DSML_PARAMETER = re.compile(r'\s*<｜DSML｜parameter name="([^"]+)" string="(true|false)">(.*?)</｜DSML｜parameter>',
                             re.S)


def _dsml_arguments(body: str) -> dict | None:
    """An invoke's parameters, making up all of body but whitespace: a string="true" value is its
    text as it is, a string="false" one the JSON it holds; None if anything else is there, or a
    string="false" value is not JSON."""
    args, pos = {}, 0
    while m := _DSML_PARAMETER.match(body, pos):
        raw = m.group(3)
        value = raw if m.group(2) == "true" else _json(raw)
        if value is None and raw.strip() != "null":
            return None
        args[m.group(1).strip()] = value
        pos = m.end()
    return args if not body[pos:].strip() else None


def _dsml_reader(section: str) -> Callable[[str, Params], list[Call] | None]:
    """The reader of DSML blocks named ``section`` (V3.2's function_calls, V4's tool_calls): the
    invokes one after another, each a call."""
    start, end = f"<｜DSML｜{section}>", f"</｜DSML｜{section}>"

    def read_dsml(block: str, params: Params) -> list[Call] | None:
        def read(m: re.Match) -> Call | None:
            args = _dsml_arguments(m.group(2))
            return None if args is None else (m.group(1).strip(), args)

        return _sequence(_inner(block, start, end), _DSML_INVOKE, read)

    return read_dsml


_DEEPSEEK_CALL = re.compile(r"\s*<｜tool▁call▁begin｜>(.*?)<｜tool▁sep｜>(.*?)<｜tool▁call▁end｜>", re.S)
_DEEPSEEK_R1_ARGS = re.compile(r"([^\n]+)\n```(?:json)?\n(.*)\n```\s*", re.S)


def _read_deepseek(block: str, params: Params) -> list[Call] | None:
    def read(m: re.Match) -> Call | None:
        head, rest = m.group(1).strip(), m.group(2)
        r1 = _DEEPSEEK_R1_ARGS.fullmatch(rest) if head == "function" else None
        name, text = (r1.group(1).strip(), r1.group(2)) if r1 else (head, rest)
        args = _object(text.strip())
        return None if args is None else (name, args)

    return _sequence(_inner(block, "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"), _DEEPSEEK_CALL, read)


_KIMI_CALL = re.compile(r"\s*<\|tool_call_begin\|>(.*?)<\|tool_call_argument_begin\|>(.*?)<\|tool_call_end\|>", re.S)
_KIMI_ID = re.compile(r"\s*(?:functions\.)?([^\s:]+)(?::\d+)?\s*")     # functions.NAME:INDEX


def _read_kimi(block: str, params: Params) -> list[Call] | None:
    def read(m: re.Match) -> Call | None:
        head, args = _KIMI_ID.fullmatch(m.group(1)), _object(m.group(2).strip())
        return None if head is None or args is None else (head.group(1), args)

    return _sequence(_inner(block, "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"), _KIMI_CALL, read)


_G4_QUOTE = '<|"|>'
_G4_CALL = re.compile(r"\s*call:([A-Za-z0-9_.-]+)(\{.*\})\s*", re.S)
_G4_KEY = re.compile(r"\s*([A-Za-z0-9_.$-]+)\s*:")
_G4_LITERAL = re.compile(r"\s*(-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?|true|false|null)")


def _g4_value(text: str, i: int) -> tuple[Any, int]:
    """Gemma 4's notation: the value at text[i:] and where it ends; ValueError where there is none."""
    while i < len(text) and text[i] in " \t\n":
        i += 1
    if text.startswith(_G4_QUOTE, i):
        j = text.find(_G4_QUOTE, i + len(_G4_QUOTE))
        if j < 0:
            raise ValueError("an unclosed string")
        return text[i + len(_G4_QUOTE):j], j + len(_G4_QUOTE)
    if text.startswith(("{", "["), i):
        close, obj = ("}", {}) if text[i] == "{" else ("]", [])
        i += 1
        while True:
            while i < len(text) and text[i] in " \t\n":
                i += 1
            if text.startswith(close, i) and not obj:
                return obj, i + 1
            if isinstance(obj, dict):
                if text.startswith(_G4_QUOTE, i):      # a key may be quoted, as the template writes them in listings
                    key, i = _g4_value(text, i)
                    m = re.compile(r"\s*:").match(text, i)
                else:
                    m = _G4_KEY.match(text, i)
                    key = m.group(1) if m else None
                if m is None:
                    raise ValueError("a key without its value")
                obj[key], i = _g4_value(text, m.end())
            else:
                item, i = _g4_value(text, i)
                obj.append(item)
            while i < len(text) and text[i] in " \t\n":
                i += 1
            if text.startswith(",", i):
                i += 1
            elif text.startswith(close, i):
                return obj, i + 1
            else:
                raise ValueError("a missing separator")
    m = _G4_LITERAL.match(text, i)
    if m is None:
        raise ValueError("no value")
    return json.loads(m.group(1)), m.end()


def _read_gemma4(block: str, params: Params) -> list[Call] | None:
    m = _G4_CALL.fullmatch(_inner(block, "<|tool_call>", "<tool_call|>"))
    if m is None:
        return None
    try:
        args, end = _g4_value(m.group(2), 0)
    except ValueError:
        return None
    return [(m.group(1), args)] if isinstance(args, dict) and end == len(m.group(2)) else None


_FENCE = re.compile(r"```(?:json)?\s*(.*?)\s*```", re.S)


def _read_generic(block: str, params: Params) -> list[Call] | None:
    text = block.strip()
    fenced = _FENCE.fullmatch(text)
    obj = _json(fenced.group(1) if fenced else text)
    if not isinstance(obj, dict):
        return None
    if "tool_calls" in obj:
        items = obj["tool_calls"]
    elif "tool_call" in obj:
        items = [obj["tool_call"]]
    else:
        items = [obj]                              # a bare {"name": ..., "arguments": ...}
    if not isinstance(items, list) or not items:
        return None
    calls = [_named_call(item) for item in items]
    return None if None in calls else calls


# ---------------------------------------------------------------------------------------------
# Formats
# ---------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Format:
    """A tool-call syntax. A call block opens with one of ``starts`` and closes with ``end`` (""
    for a block that is the rest of the reply: the generic format's, which only a reply's start
    may open); ``read`` gives a block's calls, or None when it does not parse. ``example``: a call
    of the tool NAME in this syntax, for the instructions. The harmony format's calls are messages
    (see HarmonyCalls), not blocks in the text."""

    name: str
    starts: tuple[str, ...]
    end: str
    read: Callable[[str, Params], list[Call] | None] | None
    example: str

    def call_example(self, name: str) -> str:
        return self.example.replace("NAME", name)


HERMES = Format("hermes", ("<tool_call>",), "</tool_call>", _read_hermes,
                '<tool_call>\n{"name": "NAME", "arguments": {"PARAMETER": VALUE}}\n</tool_call>')
QWEN3_CODER = Format("qwen3-coder", ("<tool_call>",), "</tool_call>", _read_qwen3_coder,
                     "<tool_call>\n<function=NAME>\n<parameter=PARAMETER>\nVALUE\n</parameter>\n</function>\n"
                     "</tool_call>")
GLM = Format("glm-4.5", ("<tool_call>",), "</tool_call>", _read_glm,
             "<tool_call>NAME\n<arg_key>PARAMETER</arg_key>\n<arg_value>VALUE</arg_value>\n</tool_call>")
MINIMAX_M2 = Format("minimax-m2", ("<minimax:tool_call>",), "</minimax:tool_call>", _read_minimax,
                    '<minimax:tool_call>\n<invoke name="NAME">\n<parameter name="PARAMETER">VALUE</parameter>\n'
                    "</invoke>\n</minimax:tool_call>")
DEEPSEEK_V32 = Format("deepseek-v3.2", ("<｜DSML｜function_calls>",), "</｜DSML｜function_calls>",
                      _dsml_reader("function_calls"),
                      '<｜DSML｜function_calls>\n<｜DSML｜invoke name="NAME">\n<｜DSML｜parameter name="PARAMETER" '
                      'string="true|false">VALUE</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>')
DEEPSEEK_V4 = Format("deepseek-v4", ("<｜DSML｜tool_calls>",), "</｜DSML｜tool_calls>", _dsml_reader("tool_calls"),
                     '<｜DSML｜tool_calls>\n<｜DSML｜invoke name="NAME">\n<｜DSML｜parameter name="PARAMETER" '
                     'string="true|false">VALUE</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>')
DEEPSEEK = Format("deepseek", ("<｜tool▁calls▁begin｜>",), "<｜tool▁calls▁end｜>", _read_deepseek,
                  '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{"PARAMETER": VALUE}'
                  "<｜tool▁call▁end｜><｜tool▁calls▁end｜>")
KIMI_K2 = Format("kimi-k2", ("<|tool_calls_section_begin|>",), "<|tool_calls_section_end|>", _read_kimi,
                 "<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:0<|tool_call_argument_begin|>"
                 '{"PARAMETER": VALUE}<|tool_call_end|><|tool_calls_section_end|>')
HARMONY = Format("harmony", (), "", None,
                 '<|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>'
                 '{"PARAMETER": VALUE}<|call|>')
GEMMA4 = Format("gemma4", ("<|tool_call>",), "<tool_call|>", _read_gemma4,
                '<|tool_call>call:NAME{PARAMETER:VALUE}<tool_call|> (strings as <|"|>TEXT<|"|>)')
GENERIC = Format("generic", ("{", "```"), "", _read_generic,
                 '{"tool_calls": [{"name": "NAME", "arguments": {"PARAMETER": VALUE}}]}')

# The formats whose call block also ends a thinking block it opens in (llama.cpp's DeepSeek-V3.2
# and V4 parsers end the reasoning at </think> or at the block, whichever comes first)
ENDS_THINKING = ("deepseek-v3.2", "deepseek-v4")

FORMATS = {f.name: f for f in (HARMONY, KIMI_K2, DEEPSEEK_V32, DEEPSEEK_V4, DEEPSEEK, MINIMAX_M2, GLM, QWEN3_CODER,
                               HERMES, GEMMA4, GENERIC)}


def detect(template: str | None) -> Format:
    """The tool-call format a chat template's text shows (GENERIC when it shows none we read).
    The order matters: GLM's and Qwen3-Coder's templates have Hermes' <tool_call> too. A template
    that is no text shows none (rendering it says why)."""
    t = template if isinstance(template, str) else ""
    if "<|channel|>" in t:
        return HARMONY
    if "<|tool_calls_section_begin|>" in t:
        return KIMI_K2
    if "<|tool_call>call:" in t:
        return GEMMA4
    if "｜DSML｜" in t:                 # the templates build the markers from this piece: '<' + dsml_token + ...
        if "function_calls>" in t:
            return DEEPSEEK_V32
        if "tool_calls>" in t:
            return DEEPSEEK_V4
    if "<｜tool▁calls▁begin｜>" in t and "<｜tool▁sep｜>" in t:
        return DEEPSEEK
    if "<minimax:tool_call>" in t:
        return MINIMAX_M2
    if "<tool_call>" in t and "<arg_key>" in t:
        return GLM
    if "<tool_call>" in t and "<function=" in t and "<parameter=" in t:
        return QWEN3_CODER
    if "<tool_call>" in t and "]<]minimax[>[" not in t:    # MiniMax-M3 writes <tool_call> in its own markup
        return HERMES
    return GENERIC


# ---------------------------------------------------------------------------------------------
# A request's tools
# ---------------------------------------------------------------------------------------------

def check_tools(tools: Any) -> tuple[dict, ...]:
    """A request's ``tools`` as the template gets them: each {"type": "function", "function":
    {"name", "description"?, "parameters"?}} (the description defaults to "" and the parameters to
    an empty object schema, which templates that list tools read). None or [] is no tools. Raises
    InvalidArgumentError, its message starting with "tools"."""
    if tools is None:
        return ()
    if not isinstance(tools, (list, tuple)):
        raise InvalidArgumentError(f"tools must be a list of function tools, got {type(tools).__name__}")
    out, names = [], set()
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, Mapping) or tool.get("type") != "function":
            raise InvalidArgumentError(f"{where} must be an object with \"type\": \"function\" (the only tool type)")
        fn = tool.get("function")
        if not isinstance(fn, Mapping):
            raise InvalidArgumentError(f"{where}.function must be an object with the function's name")
        name = fn.get("name")
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise InvalidArgumentError(f"{where}.function.name must be 1 to 64 letters, digits, '_' or '-', "
                                       f"got {_shown(name)}")
        if name in names:
            raise InvalidArgumentError(f"{where}.function.name: {name!r} is given twice")
        names.add(name)
        description = fn.get("description")
        if description is not None and not isinstance(description, str):
            raise InvalidArgumentError(f"{where}.function.description must be a string")
        parameters = fn.get("parameters")
        if parameters is None:
            parameters = {"type": "object", "properties": {}}
        elif not isinstance(parameters, Mapping):
            raise InvalidArgumentError(f"{where}.function.parameters must be a JSON Schema object")
        out.append({"type": "function",
                    "function": {**fn, "description": description or "", "parameters": parameters}})
    return tuple(out)


def check_tool_choice(choice: Any, tools: Sequence[dict]) -> str:
    """``tool_choice`` as "auto", "none", "required" or the name of the function it names. Default:
    "auto". Raises InvalidArgumentError, its message starting with "tool_choice"."""
    names = [t["function"]["name"] for t in tools]
    if choice is None:
        return "auto"
    if choice in ("auto", "none"):
        return choice
    if choice == "required" or isinstance(choice, Mapping):
        if not tools:
            raise InvalidArgumentError(f"tool_choice {_shown(choice)} needs tools, and none are given")
        if choice == "required":
            return choice
        fn = choice.get("function")
        name = fn.get("name") if isinstance(fn, Mapping) else None
        if choice.get("type") != "function" or not isinstance(name, str):
            raise InvalidArgumentError("tool_choice must be \"auto\", \"none\", \"required\" or "
                                       "{\"type\": \"function\", \"function\": {\"name\": ...}}")
        if name not in names:
            raise InvalidArgumentError(f"tool_choice names the function {name[:80]!r}, which is not in tools")
        return name
    raise InvalidArgumentError(f"tool_choice must be \"auto\", \"none\", \"required\" or a named function, "
                               f"got {_shown(choice)}")


def tool_use(template: str | None, tools: Any, tool_choice: Any = None,
             parallel_tool_calls: Any = None) -> "ToolUse | None":
    """A request's tools, checked, with the format ``template`` shows; None without tools. Raises
    InvalidArgumentError whose message starts with the field at fault (tools, tool_choice,
    parallel_tool_calls)."""
    checked = check_tools(tools)
    choice = check_tool_choice(tool_choice, checked)
    if parallel_tool_calls is not None and not isinstance(parallel_tool_calls, bool):
        raise InvalidArgumentError(f"parallel_tool_calls must be true or false, got {_shown(parallel_tool_calls)}")
    if not checked:
        return None
    return ToolUse(checked, choice, parallel_tool_calls is not False, detect(template))


@dataclasses.dataclass(frozen=True)
class ToolUse:
    """A request's tools (check_tools' shape), its tool_choice ("auto", "none", "required" or a
    function's name), whether it allows several calls, and the model's format."""

    tools: tuple[dict, ...]
    choice: str
    parallel: bool
    format: Format

    @property
    def offered(self) -> tuple[dict, ...]:
        """The tools a reply may call: all, or the one tool_choice names."""
        if self.choice in ("auto", "none", "required"):
            return self.tools
        return tuple(t for t in self.tools if t["function"]["name"] == self.choice)

    def _call_schemas(self) -> list[dict]:
        """Per offered tool, the JSON of one call of it: {"name": its name, "arguments": of its schema}."""
        return [{"type": "object", "properties": {"name": {"const": t["function"]["name"]},
                                                  "arguments": _closed(t["function"].get("parameters"))},
                 "required": ["name", "arguments"], "additionalProperties": False} for t in self.offered]

    def forced_schema(self) -> dict:
        """The JSON schema of the generic format's reply when tool_choice forces a call:
        {"tool_calls": [one call or more, of the offered tools, each with arguments of its
        schema]}."""
        calls = self._call_schemas()
        items = {"type": "array", "items": calls[0] if len(calls) == 1 else {"anyOf": calls}, "minItems": 1}
        if not self.parallel:
            items["maxItems"] = 1
        return {"type": "object", "properties": {"tool_calls": items}, "required": ["tool_calls"],
                "additionalProperties": False}

    def parser(self) -> "CallParser | HarmonyCalls | None":
        """A fresh reader of one reply's calls; None for tool_choice "none"."""
        if self.choice == "none":
            return None
        return HarmonyCalls(self) if self.format is HARMONY else CallParser(self)

    def prompt(self, messages: list[dict], renders_tools: bool) -> tuple[list[dict], list[dict] | None]:
        """The messages to render (checked ones, chat._plain_messages') and the template's
        ``tools`` variable. ``renders_tools``: whether the template writes the tools it is given."""
        if self.format is GENERIC:
            messages = as_text_history(messages)
            tools = None
        else:
            tools = list(self.tools)
        instruction = self._instruction(listed=tools is not None and renders_tools)
        return (with_system(messages, instruction) if instruction else messages), tools

    def _instruction(self, listed: bool) -> str:
        """What the system message adds: the tools and the syntax where the template does not
        list them, and what tool_choice and parallel_tool_calls ask."""
        if self.choice == "none":
            return ""
        parts = []
        if not listed:
            listing = "\n".join(json.dumps(t["function"], ensure_ascii=False) for t in self.offered)
            parts.append(f"You can call these tools (their parameters as JSON Schema):\n{listing}")
        if self.choice == "required":
            parts.append("You must call one or more of the tools in this reply.")
        elif self.choice != "auto":
            parts.append(f"You must call the tool {self.choice} in this reply.")
        if not self.parallel:
            parts.append("Call at most one tool in this reply.")
        if not listed:
            example = self.format.call_example("NAME" if self.choice in ("auto", "required") else self.choice)
            if self.format is GENERIC:
                parts.append(f"To call tools, reply with only this JSON object, nothing before or after it:\n"
                             f"{example}\nOtherwise reply in plain text.")
            else:
                parts.append(f"Write a tool call in this format:\n{example}")
        return "\n\n".join(parts)


def _closed(parameters: dict | None) -> dict:
    """A tool's parameter schema for a forced call: an object, whose properties are the ones it
    names where it names some and says nothing of others (as OpenAI's strict mode has them)."""
    schema = dict(parameters or {"type": "object"})
    if "properties" in schema and "additionalProperties" not in schema:
        schema["additionalProperties"] = False
    return schema


def with_system(messages: list[dict], text: str) -> list[dict]:
    """The messages with text added to the system message (put first when there is none)."""
    if messages and messages[0]["role"] == "system":
        first = messages[0]
        joined = f"{first['content']}\n\n{text}" if first["content"] else text
        return [dict(first, content=joined)] + messages[1:]
    return [{"role": "system", "content": text}] + messages


def as_text_history(messages: list[dict]) -> list[dict]:
    """The conversation without tool calls and tool turns, for the generic format: an assistant
    turn's calls become the JSON the generic format asks for (after its content), and each run of
    tool results one user turn of {"tool_response": {"name", "content"}} lines."""
    names = {c.get("id"): c["function"]["name"] for m in messages for c in m.get("tool_calls") or ()}
    out: list[dict] = []
    results: list[str] = []                   # the run of tool results not written yet
    for m in messages:
        if m["role"] == "tool":
            name = m.get("name") or names.get(m.get("tool_call_id"))
            results.append(json.dumps({"tool_response": {"name": name, "content": m["content"]}}, ensure_ascii=False))
            continue
        if results:
            out.append({"role": "user", "content": "\n".join(results)})
            results = []
        if m["role"] == "assistant" and m.get("tool_calls"):
            calls = []
            for c in m["tool_calls"]:
                raw = c["function"].get("arguments")
                args = _arguments(raw)
                calls.append({"name": c["function"]["name"], "arguments": raw if args is None else args})
            text = json.dumps({"tool_calls": calls}, ensure_ascii=False)
            m = {"role": "assistant", "content": f"{m['content']}\n{text}" if m["content"] else text}
        out.append(m)
    if results:
        out.append({"role": "user", "content": "\n".join(results)})
    return out


def template_arguments(messages: list[dict], as_objects: bool) -> list[dict]:
    """The messages with each tool call's arguments in the form the template takes: an object
    (transformers' shape, which most templates iterate or pass to tojson) or a JSON string
    (OpenAI's shape, which some templates concatenate). Arguments that are neither a JSON object
    nor a string holding one are left as they are."""
    out = []
    for m in messages:
        if m.get("tool_calls"):
            calls = []
            for c in m["tool_calls"]:
                args = _arguments(c["function"]["arguments"]) if "arguments" in c["function"] else None
                if args is not None:
                    value = args if as_objects else json.dumps(args, ensure_ascii=False)
                    c = dict(c, function=dict(c["function"], arguments=value))
                calls.append(c)
            m = dict(m, tool_calls=calls)
        out.append(m)
    return out


def results_in_call_order(messages: list[dict]) -> list[dict]:
    """The messages with each run of tool results (the tool and user turns between two others;
    the user turns stay where they are) in the order of the calls of the last assistant turn with
    calls, matched by tool_call_id: DeepSeek-V4's template writes the run as one user turn, and its
    reference encoding orders the results so (as llama.cpp renders it). A result whose id no call
    has goes first; results of the same place keep their order."""
    out = list(messages)
    order: dict[str, int] = {}
    i = 0
    while i < len(out):
        m = out[i]
        if m.get("role") == "assistant":
            if m.get("tool_calls"):
                order = {c["id"]: k for k, c in enumerate(m["tool_calls"]) if isinstance(c.get("id"), str)}
            i += 1
            continue
        if m.get("role") not in ("user", "tool"):
            i += 1
            continue
        end = i
        while end < len(out) and out[end].get("role") in ("user", "tool"):
            end += 1
        places = [k for k in range(i, end) if out[k].get("role") == "tool"]
        if len(places) > 1 and order:
            def rank(r: dict) -> int:
                key = r.get("tool_call_id")
                return order.get(key, 0) if isinstance(key, str) else 0

            ranked = sorted((out[k] for k in places), key=rank)
            for k, r in zip(places, ranked):
                out[k] = r
        i = end
    return out


# ---------------------------------------------------------------------------------------------
# Reading a reply
# ---------------------------------------------------------------------------------------------

def _properties(parameters: Mapping) -> Mapping[str, Any]:
    properties = parameters.get("properties")
    return properties if isinstance(properties, Mapping) else {}


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


class _Calls:
    """The calls a reply has made so far, and their deltas."""

    def __init__(self, use: ToolUse, new_id: Callable[[], str]):
        self.allowed = {t["function"]["name"] for t in use.offered}
        self.params: Params = {t["function"]["name"]: _properties(t["function"]["parameters"]) for t in use.offered}
        self.parallel = use.parallel
        self.new_id = new_id
        self.n = 0

    def accept(self, calls: list[Call] | None) -> bool:
        """Whether calls (a block's) are well formed and may be made: tools offered, and no more
        than one in all without parallel calls."""
        return (bool(calls) and all(name in self.allowed for name, _ in calls)
                and (self.parallel or self.n + len(calls) <= 1))

    def deltas(self, calls: Iterable[Call]) -> list[dict]:
        out = []
        for name, args in calls:
            out.append({"tool_calls": [{"index": self.n, "id": self.new_id(), "type": "function",
                                        "function": {"name": name, "arguments": ""}}]})
            out.append({"tool_calls": [{"index": self.n,
                                        "function": {"arguments": json.dumps(args, ensure_ascii=False)}}]})
            self.n += 1
        return out


class CallParser:
    """Reads one reply's text, given in pieces (``feed``, then ``flush`` at its end), as chat
    deltas: {"content": ...} and {"tool_calls": [...]} (see the module's docstring)."""

    def __init__(self, use: ToolUse, new_id: Callable[[], str] = new_call_id):
        self.format = use.format
        self.calls = _Calls(use, new_id)
        self._buf = ""          # text not given out yet: what may open a call block, or a block being read
        self._in_block = False
        self._searched = 0      # of the block being read, the characters known not to start its closing marker
        self._blank = ""        # whitespace held back: dropped before a call block, else given with what follows
        self._said = False      # some content other than whitespace has been given out
        self._plain = False     # generic format: the reply did not open with a call; it is all content

    @property
    def n_calls(self) -> int:
        return self.calls.n

    def feed(self, text: str) -> list[dict]:
        self._buf += text
        return self._scan(final=False)

    def flush(self) -> list[dict]:
        out = self._scan(final=True)
        if self._blank and not self.calls.n:
            out.append({"content": self._blank})
        self._blank = ""
        return out

    def _scan(self, final: bool) -> list[dict]:
        out: list[dict] = []
        while self._buf:
            if self._in_block:
                end = self._block_end(final)
                if end is None:
                    break                                     # the block's close has not come yet
                out += self._block(end)
                self._in_block = False
                continue
            start, hold = self._find_start()
            if start is None:
                cut = len(self._buf) if final else len(self._buf) - hold
                out += self._text(self._buf[:cut])
                self._buf = self._buf[cut:]
                break
            out += self._text(self._buf[:start])
            self._buf = self._buf[start:]
            self._in_block = True
        return out

    def _find_start(self) -> tuple[int | None, int]:
        """Where the first call block opens in the buffer (None: nowhere yet), and how many of its
        last characters to hold back because they may begin a marker."""
        starts = self.format.starts
        if not self.format.end:                              # the generic format: only at the reply's start
            if self._plain or self._said or self.calls.n:
                return None, 0
            rest = self._buf.lstrip()
            at = len(self._buf) - len(rest)
            if not rest:
                return None, 0
            if rest.startswith(starts):
                return at, 0
            if any(s.startswith(rest) for s in starts):
                return None, len(rest)
            self._plain = True
            return None, 0
        found = [i for i in (self._buf.find(s) for s in starts) if i >= 0]
        if found:
            return min(found), 0
        hold = max((k for s in starts for k in range(1, len(s)) if self._buf.endswith(s[:k])), default=0)
        return None, hold

    def _block_end(self, final: bool) -> int | None:
        """The end of the call block at the buffer's start: after its closing marker, or the
        buffer's end when the reply is over; None while it may still come."""
        end = self.format.end
        i = self._buf.find(end, self._searched) if end else -1
        if i < 0 and not final:
            self._searched = max(len(self._buf) - len(end) + 1, 0) if end else 0
            return None
        self._searched = 0
        return i + len(end) if i >= 0 else len(self._buf)

    def _text(self, text: str) -> list[dict]:
        text = self._blank + text
        body = text.rstrip()
        self._blank = text[len(body):]
        if not body:
            return []
        self._said = True
        return [{"content": body}]

    def _block(self, end: int) -> list[dict]:
        """The deltas of the call block that ends at ``end`` in the buffer, taken out of it. A block
        that is no call is text up to the next marker in it, where the search for a call goes on
        (a marker written in prose before a real call does not hide the call)."""
        block = self._buf[:end]
        calls = self.format.read(block, self.calls.params)
        if self.calls.accept(calls):
            self._buf, self._blank = self._buf[end:], ""
            return self.calls.deltas(calls)
        again = [i for i in (block.find(s, 1) for s in self.format.starts) if i > 0] if self.format.end else []
        cut = min(again, default=end)
        text, self._buf = self._buf[:cut], self._buf[cut:]
        return self._text(text)


class HarmonyCalls:
    """Reads the calls in one harmony reply (gpt-oss) from chat.HarmonyChannels' pieces: a
    message to ``functions.NAME`` is a call of NAME with the message's JSON as its arguments. A
    call is given out when its message ends (another message begins, or the reply ends); one
    whose JSON does not parse, or whose tool is not offered, comes back as content."""

    def __init__(self, use: ToolUse, new_id: Callable[[], str] = new_call_id):
        self.calls = _Calls(use, new_id)
        self._message: int | None = None     # the message being read as a call
        self._name = ""
        self._text = ""

    @property
    def n_calls(self) -> int:
        return self.calls.n

    @staticmethod
    def is_call(piece) -> bool:
        return bool(piece.recipient) and piece.recipient.startswith("functions.")

    def piece(self, piece) -> list[dict]:
        """The deltas a piece gives: none while a call's message is read, a call when one ends."""
        out = self.end_unless(piece.message)
        if self.is_call(piece):
            if self._message is None:
                self._message, self._name = piece.message, piece.recipient[len("functions."):]
            self._text += piece.text
        return out

    def end_unless(self, message: int | None) -> list[dict]:
        """Ends the call being read unless ``message`` is its message (None: the reply is over)."""
        if self._message is None or message == self._message:
            return []
        name, text = self._name, self._text
        self._message, self._name, self._text = None, "", ""
        args = _object(text.strip()) if text.strip() else {}
        if args is None or not self.calls.accept([(name, args)]):
            return [{"content": text}] if text else []
        return self.calls.deltas([(name, args)])

    def flush(self) -> list[dict]:
        return self.end_unless(None)

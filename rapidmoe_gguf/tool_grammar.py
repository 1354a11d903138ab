"""The grammars (llguidance's Lark) that keep a reply well formed: a tool call in the model's own
format, a JSON reply after the model's thinking, and gpt-oss's channels around either.

A format's fixed strings go into a grammar through ``Pieces``: a string that is one token of the
model's vocabulary (the markers are, in the models' own files: ``<tool_call>`` in Qwen's,
``<｜tool▁calls▁begin｜>`` in DeepSeek's, ``<|channel|>`` in gpt-oss's) is written as that token,
``<[id]>``, so the reply holds the token the model was trained to write, and a control token
(which no text spells) can be asked for at all; any other string as its text.

``tool_call_lark`` gives a request's grammar by its tool_choice:

- "required" or a named function: the reply is the format's calls (one, or more with
  ``parallel_tool_calls``) of the offered tools, each with arguments of its schema; thinking may
  come first (a ``<think>`` block, or the rest of one the prompt opened; gpt-oss's analysis
  message);
- "auto": the reply is free until the format's opening marker, and from there each call block
  must be well formed (a lazy grammar, as llama.cpp's are: the text before a marker is never
  masked where the marker is one token; where it is text, the free part is text). Formats
  without such a marker (the generic JSON one, gpt-oss's) stay free under "auto";
- "none": no grammar.

The XML formats' values follow ``tool_calls._xml_value``: a string parameter's value is text up
to the closing tag, any other is JSON of its schema (in DSML, DeepSeek-V3.2's and V4's, with the
string attribute that says which: "true" for text, "false" for JSON). Every generated form is one the readers in
rapidmoe_gguf.tool_calls read back (``tests/test_tool_grammar.py`` feeds the formats' round-trip
texts, written by the models' real templates, through these grammars).
"""

from __future__ import annotations

import json
from typing import Any, Callable, Mapping

from . import tool_calls as tc

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
# Any text: a terminal, so that the lexer, not the parser, runs over it.
ANY = "ANY: /(.|\\n)*/\n"


def _q(text: str) -> str:
    """A Lark string literal."""
    return json.dumps(text, ensure_ascii=False)


class Pieces:
    """The Lark expression of a format's fixed string for one tokenizer: ``<[id]>`` where the
    string is exactly one token of the vocabulary, else the quoted text."""

    def __init__(self, tokenizer):
        self._tokenizer = tokenizer
        self._seen: dict[str, int | None] = {}

    def token(self, text: str) -> int | None:
        """The id of the one token that is ``text``, or None."""
        if text not in self._seen:
            ids = self._tokenizer.encode(text, add_special=False, parse_special=True)
            one = len(ids) == 1 and self._tokenizer.token_to_piece(ids[0]) == text.encode("utf-8")
            self._seen[text] = ids[0] if one else None
        return self._seen[text]

    def __call__(self, text: str) -> str:
        tid = self.token(text)
        return f"<[{tid}]>" if tid is not None else _q(text)

    def is_special(self, tid: int) -> bool:
        """Whether token tid is a control token, which no text spells."""
        return self._tokenizer.is_special(tid)

    def text_then(self, name: str, text: str) -> str:
        """A rule ``name``: any text, then ``text``. Where ``text`` is a control token, which no
        text holds, the text is the greedy ANY; else a lazy terminal, which ends where ``text``
        first shows (were the token of a text written as a token after a greedy ANY, the ANY
        could take the token's text as well, and the rule would never end)."""
        tid = self.token(text)
        if tid is not None and self.is_special(tid):
            return f"{name}: ANY <[{tid}]>\n"
        return f"{name}[lazy]: ANY {_q(text)}\n"


def json_rule(schema: Any, json_form: Mapping, lenient: bool) -> str:
    """``%json`` of a schema, in the JSON form the replies use (grammar.JSON_FORM)."""
    body = dict(schema) if isinstance(schema, Mapping) else {}
    body["x-guidance"] = {**json_form, "lenient": lenient}
    return "%json " + json.dumps(body, ensure_ascii=False)


def thinking_rules(pieces: Pieces, thinking: bool | None,
                   tags: tuple[str, str] = (THINK_OPEN, THINK_CLOSE)) -> tuple[str, str]:
    """(the rules, the expression that goes first in ``start``) for the thinking a reply may hold
    before its constrained part: ``thinking`` True: the prompt opened a <think> block, which the
    reply closes; False: the reply may open one; None: none. ``tags``: the block's (Gemma 4's
    thought channel, chat.think_tags)."""
    if thinking is None:
        return "", ""
    # the blank after the block bounded: a weak model would write blanks without end
    rules = ANY + pieces.text_then("think_body", tags[1]) + "think: think_body /[ \\t\\n]{0,4}/\n"
    return rules, ("think" if thinking else f"({pieces(tags[0])} think)?")


def _string_only(schema: Any) -> bool:
    kind = schema.get("type") if isinstance(schema, Mapping) else None
    kinds = {k for k in (kind if isinstance(kind, list) else [kind]) if isinstance(k, str)}
    return "string" in kinds and kinds <= {"string", "null"}


def _string_choices(schema: Any) -> list[str] | None:
    """The strings a parameter's ``enum`` or ``const`` allows, where it allows strings only."""
    if not isinstance(schema, Mapping):
        return None
    values = [schema["const"]] if "const" in schema else schema.get("enum")
    if isinstance(values, list) and values and all(isinstance(v, str) for v in values):
        return values
    return None


def _parameters(tool: dict) -> tuple[list[tuple[str, Any]], set[str]]:
    """A tool's parameters in the schema's order, and the required ones."""
    params = tool["function"].get("parameters") or {}
    props = params.get("properties") if isinstance(params, Mapping) else None
    required = params.get("required") if isinstance(params, Mapping) else None
    items = list(props.items()) if isinstance(props, Mapping) else []
    return items, {r for r in (required or []) if isinstance(r, str)}


class _Builder:
    """The rules of one format's call blocks for a ToolUse."""

    def __init__(self, use: tc.ToolUse, pieces: Pieces, json_form: Mapping):
        self.use, self.p, self.form = use, pieces, json_form
        self.rules: list[str] = []
        self.needs_any = False

    def rule(self, text: str) -> None:
        self.rules.append(text)

    def args(self, i: int, tool: dict) -> str:
        name = f"args_{i}"
        self.rule(f"{name}: {json_rule(tc._closed(tool['function'].get('parameters')), self.form, True)}")
        return name

    def xml_params(self, i: int, tool: dict, head: str, sep: str, end: str, tail: str, newlines: bool = False) -> str:
        """A rule for the parameters of tool i in an XML format: each ``head`` KEY ``sep`` VALUE
        ``end``, then ``tail`` (KEY in head: "KEY"; STRING in head: "true" where VALUE is text,
        "false" where it is JSON, as DSML's string attribute says), in the schema's order, the
        optional ones optional. A string's VALUE is any text up to ``end`` (a lazy terminal; at
        most its maxLength characters, or one of its enum), any other JSON.
        ``newlines``: a newline may come before each pair and between KEY and VALUE (GLM-4.5 and
        4.6 write them, 4.7 does not)."""
        items, required = _parameters(tool)
        parts = []
        for k, (key, schema) in enumerate(items):
            name = f"p_{i}_{k}"
            nl = ['"\\n"?'] if newlines else []
            choices = _string_choices(schema)
            text = "true" if choices is not None or _string_only(schema) else "false"
            opening = " ".join(nl + [_q(head.replace("STRING", text).replace("KEY", key))] + nl +
                               ([_q(sep)] if sep else []))
            if choices is not None:
                self.rule(f"{name}: {opening} ({' | '.join(map(_q, choices))}) {_q(end + tail)}")
            elif _string_only(schema):
                most = schema.get("maxLength")
                if isinstance(most, int) and not isinstance(most, bool) and most >= 0:
                    text = f"/(.|\\n){{0,{most}}}/"     # at most maxLength characters, as in JSON
                else:
                    text, self.needs_any = "ANY", True
                self.rule(f"{name}_v[lazy]: {text} {_q(end + tail)}")
                self.rule(f"{name}: {opening} {name}_v")
            else:
                self.rule(f"{name}_v: {json_rule(schema, self.form, True)}")
                self.rule(f"{name}: {opening} {name}_v {_q(end + tail)}")
            parts.append(name if key in required else f"{name}?")
        name = f"params_{i}"
        self.rule(f"{name}: {' '.join(parts)}" if parts else f'{name}: ""')
        return name

    def g4_any(self) -> str:
        """Rules ``g4_any`` (any value of Gemma 4's notation) and ``g4_str`` (a string), once."""
        if not any(r.startswith("g4_any:") for r in self.rules):
            q = self.p(tc._G4_QUOTE)
            self.needs_any = True
            self.rule(self.p.text_then("g4_text", tc._G4_QUOTE).rstrip("\n"))
            self.rule(f"g4_str: {q} g4_text")
            self.rule('g4_num: /-?(0|[1-9][0-9]*)(\\.[0-9]+)?([eE][+-]?[0-9]+)?/')
            self.rule('g4_any: g4_str | g4_num | "true" | "false" | "null" | g4_obj | g4_arr')
            self.rule('g4_obj: "{" (g4_pair ("," g4_pair)*)? "}"')
            self.rule('g4_pair: (/[A-Za-z0-9_.$-]+/ | g4_str) ":" g4_any')
            self.rule('g4_arr: "[" (g4_any ("," g4_any)*)? "]"')
        return "g4_any"

    def g4_params(self, i: int, tool: dict) -> str:
        """A rule for tool i's arguments in Gemma 4's notation: KEY:VALUE pairs in the keys' sorted
        order (as its template writes calls), the required ones present, separated by commas; a
        string is <|"|>TEXT<|"|> (at most its maxLength characters), an enum one of its strings, an
        integer, number or boolean the JSON of its schema (the notation's literals are JSON's),
        anything else a value of the notation."""
        items, required = _parameters(tool)
        items = sorted(items)
        pairs = []
        for k, (key, schema) in enumerate(items):
            name = f"g4p_{i}_{k}"
            kind = schema.get("type") if isinstance(schema, Mapping) else None
            choices = _string_choices(schema)
            q = self.p(tc._G4_QUOTE)
            if choices is not None:
                value = "(" + " | ".join(f"{q} {_q(c)} {q}" for c in choices) + ")"
            elif _string_only(schema):
                most = schema.get("maxLength")
                if isinstance(most, int) and not isinstance(most, bool) and most >= 0:
                    # at most maxLength characters, as in JSON, then the quote (see Pieces.text_then)
                    tid = self.p.token(tc._G4_QUOTE)
                    if tid is not None and self.p.is_special(tid):
                        self.rule(f"{name}_s: /(.|\\n){{0,{most}}}/ <[{tid}]>")
                    else:
                        self.rule(f"{name}_s[lazy]: /(.|\\n){{0,{most}}}/ {_q(tc._G4_QUOTE)}")
                    value = f"{q} {name}_s"
                else:
                    self.g4_any()
                    value = "g4_str"
            elif kind in ("integer", "number", "boolean"):   # the notation's literals are JSON's
                self.rule(f"{name}_v: {json_rule(schema, self.form, True)}")
                value = f"{name}_v"
            else:
                value = self.g4_any()
            self.rule(f"{name}: {_q(key + ':')} {value}")
            pairs.append((name, key in required))
        # head_k: the pairs from k on, the first without a comma; tail_k: each with one
        n = len(pairs)
        self.rule(f'g4h_{i}_{n}: ""')
        self.rule(f'g4t_{i}_{n}: ""')
        for k in range(n - 1, -1, -1):
            name, req = pairs[k]
            self.rule(f'g4t_{i}_{k}: "," {name} g4t_{i}_{k + 1}' + ("" if req else f" | g4t_{i}_{k + 1}"))
            self.rule(f"g4h_{i}_{k}: {name} g4t_{i}_{k + 1}" + ("" if req else f" | g4h_{i}_{k + 1}"))
        return f"g4h_{i}_0"

    def either(self, name: str, options: list[str]) -> str:
        self.rule(f"{name}: {' | '.join(options)}")
        return name

    def calls(self, body: Callable[[int, dict], str]) -> str:
        """Rule ``fn``: one call of any offered tool, tool i's being ``body(i, tool)``."""
        for i, t in enumerate(self.use.offered):
            self.rule(f"fn_{i}: {body(i, t)}")
        return self.either("fn", [f"fn_{i}" for i in range(len(self.use.offered))])

    def block(self) -> tuple[str, str | None, bool]:
        """The rule of one call block after its opening marker, the marker (None: the generic
        format's, which has none), and whether a block holds every call (the formats whose
        calls go in one section)."""
        f, p = self.use.format, self.p
        if f is tc.HERMES:
            calls = self.use._call_schemas()
            body = calls[0] if len(calls) == 1 else {"anyOf": calls}
            self.rule(f"hermes_body: {json_rule(body, self.form, True)}")
            self.rule(f'after: "\\n" hermes_body "\\n" {p("</tool_call>")}')
            return "after", "<tool_call>", False
        more = "+" if self.use.parallel else ""
        if f is tc.QWEN3_CODER:
            self.calls(lambda i, t: f'{_q("<function=" + t["function"]["name"] + ">" + chr(10))} '
                                    f'{self.xml_params(i, t, "<parameter=KEY>", chr(10), chr(10) + "</parameter>", chr(10))} '
                                    '"</function>"')
            self.rule(f'after: "\\n" fn "\\n" {p("</tool_call>")}')
            return "after", "<tool_call>", False
        if f is tc.GLM:
            self.calls(lambda i, t: f'{_q(t["function"]["name"])} '
                                    f'{self.xml_params(i, t, "<arg_key>KEY</arg_key>", "<arg_value>", "</arg_value>", "", True)}')
            self.rule(f'after: fn "\\n"? {p("</tool_call>")}')
            return "after", "<tool_call>", False
        if f is tc.MINIMAX_M2:
            self.calls(lambda i, t: f'{_q("<invoke name=" + chr(34) + t["function"]["name"] + chr(34) + ">" + chr(10))} '
                                    f'{self.xml_params(i, t, "<parameter name=" + chr(34) + "KEY" + chr(34) + ">", "", "</parameter>", chr(10))} '
                                    '"</invoke>\\n"')
            self.rule(f'after: "\\n" fn{more} {p("</minimax:tool_call>")}')
            return "after", "<minimax:tool_call>", True
        if f in (tc.DEEPSEEK_V32, tc.DEEPSEEK_V4):
            invoke = lambda t: '<｜DSML｜invoke name="' + t["function"]["name"] + '">\n'  # noqa: E731
            parameter = '<｜DSML｜parameter name="KEY" string="STRING">'
            # a blank line may close an invoke: V4's template writes one in a call without arguments
            self.calls(lambda i, t: f'{_q(invoke(t))} '
                                    f'{self.xml_params(i, t, parameter, "", "</｜DSML｜parameter>", chr(10))} '
                                    '"\\n"? "</｜DSML｜invoke>\\n"')
            self.rule(f'after: "\\n" fn{more} {p(f.end)}')
            return "after", f.starts[0], True
        if f is tc.DEEPSEEK:
            self.calls(lambda i, t: f'{p("<｜tool▁call▁begin｜>")} {_q(t["function"]["name"])} {p("<｜tool▁sep｜>")} '
                                    f'{self.args(i, t)} {p("<｜tool▁call▁end｜>")}')
            self.rule(f'after: fn{more} {p("<｜tool▁calls▁end｜>")}')
            return "after", "<｜tool▁calls▁begin｜>", True
        if f is tc.KIMI_K2:
            self.calls(lambda i, t: f'{p("<|tool_call_begin|>")} {_q("functions." + t["function"]["name"] + ":")} '
                                    f'/[0-9]{{1,4}}/ {p("<|tool_call_argument_begin|>")} {self.args(i, t)} '
                                    f'{p("<|tool_call_end|>")}')
            self.rule(f'after: fn{more} {p("<|tool_calls_section_end|>")}')
            return "after", "<|tool_calls_section_begin|>", True
        if f is tc.GEMMA4:
            self.calls(lambda i, t: f'{_q("call:" + t["function"]["name"] + "{")} {self.g4_params(i, t)} "}}"')
            self.rule(f'after: fn {p("<tool_call|>")}')
            return "after", "<|tool_call>", False
        if f is tc.HARMONY:     # the call's header as the model writes it, or as the template does
            name = lambda t: t["function"]["name"]  # noqa: E731
            self.calls(lambda i, t: f'({p("<|channel|>")} {_q("commentary to=functions." + name(t) + " ")} '
                                    f'{p("<|constrain|>")} "json" | {_q(" to=functions." + name(t))} {p("<|channel|>")} '
                                    f'"commentary json") {p("<|message|>")} {self.args(i, t)} {p("<|call|>")}')
            self.rule("after: fn")
            return "after", None, True
        schema = self.use.forced_schema()            # the generic format: {"tool_calls": [...]}
        self.rule(f"after: {json_rule(schema, self.form, True)}")
        return "after", None, True


def harmony_analysis(pieces: Pieces) -> tuple[str, str]:
    """(rules, expression) of gpt-oss's analysis message that may open a reply (the prompt ends
    with <|start|>assistant): <|channel|>analysis<|message|>TEXT<|end|><|start|>assistant."""
    rules = ANY + pieces.text_then("analysis_text", "<|end|>") + (
        f'analysis: {pieces("<|channel|>")} "analysis" {pieces("<|message|>")} analysis_text {pieces("<|start|>")} '
        '"assistant"\n')
    return rules, "analysis?"


def tool_call_lark(use: tc.ToolUse, pieces: Pieces, json_form: Mapping, thinking: bool | None = None,
                   think_tags: tuple[str, str] = (THINK_OPEN, THINK_CLOSE)) -> str | None:
    """The grammar of a reply under ``use`` (see the module's text); None where the reply is free.
    ``thinking``: as chat.thinking_mode says of the prompt (True: it opened a <think> block);
    ``think_tags``: the thinking block's tags (chat.think_tags)."""
    if use.choice == "none":
        return None
    forced = use.choice != "auto"
    b = _Builder(use, pieces, json_form)
    after, marker, whole = b.block()
    if marker is None and not forced:
        return None
    if use.format is tc.HARMONY and not forced:
        return None
    head = ""
    lead = ""
    if use.format is tc.HARMONY:
        head, lead = harmony_analysis(pieces)
    elif forced:
        head, lead = thinking_rules(pieces, thinking, think_tags)
    if b.needs_any and ANY not in head:
        head += ANY
    if forced:
        block = f"{pieces(marker)} {after}" if marker is not None else after
        calls = "block" if whole or not use.parallel else 'block ("\\n"? block)*'
        start = f"start: {lead} calls\ncalls: {calls}\nblock: {block}\n"
    elif pieces.token(marker) is not None:     # any token but the marker's, then a call block
        tid = pieces.token(marker)
        start = (f"start: free (<[{tid}]> {after} free){'*' if use.parallel else '?'}\n"
                 f"free: <[^{tid}]>*\n")
    else:                                      # any text up to the marker (a lazy terminal), then the block's rest
        head += ANY if ANY not in head else ""
        start = (f"start: (trigger {after}){'*' if use.parallel else '?'} ANY\n"
                 f"{pieces.text_then('trigger', marker)}")
    return head + start + "\n".join(b.rules) + "\n"


def json_reply_lark(schema: dict, pieces: Pieces, json_form: Mapping, thinking: bool | None,
                    harmony: bool, think_tags: tuple[str, str] = (THINK_OPEN, THINK_CLOSE)) -> str:
    """The grammar of a JSON reply of ``schema`` that may come after the model's thinking (a
    <think> block; gpt-oss's analysis message, its JSON then the final channel's message)."""
    body = json_rule(schema, json_form, False)
    if harmony:
        head, lead = harmony_analysis(pieces)
        return (head + f'start: {lead} {pieces("<|channel|>")} "final" {pieces("<|message|>")} reply\n'
                f"reply: {body}\n")
    head, lead = thinking_rules(pieces, thinking, think_tags)
    return head + f"start: {lead} reply\nreply: {body}\n"

"""Structured outputs: replies constrained to a JSON schema (OpenAI's ``response_format``), to a
tool call (rapidmoe_gguf.tool_grammar) or to a GBNF grammar (llama.cpp's ``grammar``), by
llguidance, the grammar engine llama.cpp links.

A ``Grammar`` is compiled once per request from its ``response_format`` and checked against the
model's vocabulary (an invalid or unsupported schema raises InvalidArgumentError naming the
problem). Each generation takes a ``Constraint`` from it: before a token is sampled, the tokens the
grammar does not allow get -inf logits; after it, the token is consumed and the next step's mask is
computed in a worker thread while the forward pass of that token runs (llguidance releases the
GIL), so a step waits for the mask only when computing it takes longer than the forward pass.
Once the grammar is complete only the end-of-generation tokens are allowed, so the reply ends
there. ``tools/bench_grammar.py`` measures what a constraint costs per decoded token.

The vocabulary is given to llguidance as the bytes each token stands for (control tokens marked
with a leading 0xff byte, so that text never matches them, as llguidance's own llama.cpp
adapter does), once per tokenizer.
"""

from __future__ import annotations

import concurrent.futures
import json
import threading
import weakref
from typing import Any

import numpy as np

from .errors import InvalidArgumentError

_TOKENIZERS: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()
_TOKENIZERS_LOCK = threading.Lock()
# One thread computes every constraint's next mask: llguidance drops the GIL while it works.
_MASKS = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="rapidmoe-grammar")


# The JSON's form: json.dumps's separators and no other whitespace, so that no token is spent on
# layout (a schema's "x-guidance" options cannot loosen it).
JSON_FORM = {"item_separator": ", ", "key_separator": ": ", "whitespace_flexible": False}


def _llguidance():
    try:
        import llguidance
        import llguidance.numpy  # noqa: F401
    except ImportError as exc:   # a dependency: only a broken install lacks it
        raise InvalidArgumentError(f"response_format needs the llguidance package ({exc})") from None
    return llguidance


class _Vocabulary:
    """What llguidance's TokenizerWrapper reads of a tokenizer."""

    def __init__(self, tokenizer):
        self._tokenizer = tokenizer
        self.eos_token_id = tokenizer.eos_id if tokenizer.eos_id is not None else min(tokenizer.eog_ids, default=0)
        self.bos_token_id = tokenizer.bos_id
        self.special_token_ids = [i for i in range(tokenizer.n_vocab) if tokenizer.is_special(i)]
        special = set(self.special_token_ids)
        self.tokens = [b"\xff" + tokenizer.token_to_piece(i) if i in special else tokenizer.token_to_piece(i)
                       for i in range(tokenizer.n_vocab)]

    def __call__(self, text):
        if isinstance(text, bytes):   # TokenizerWrapper asks once; it then passes str
            raise TypeError("str only")
        return self._tokenizer.encode(text, add_special=False, parse_special=False)


def ll_tokenizer(tokenizer):
    """llguidance's LLTokenizer for one of our tokenizers (made once: a pass over the vocabulary)."""
    ll = _llguidance()
    with _TOKENIZERS_LOCK:
        got = _TOKENIZERS.get(tokenizer)
        if got is None:
            vocab = _Vocabulary(tokenizer)
            got = ll.LLTokenizer(ll.TokenizerWrapper(vocab), n_vocab=tokenizer.n_vocab,
                                 eos_token=sorted(tokenizer.eog_ids) or [vocab.eos_token_id])
            _TOKENIZERS[tokenizer] = got
        return got


def schema_of(response_format: Any, where: str = "response_format") -> dict | None:
    """The JSON schema a ``response_format`` asks for (None: plain text), in OpenAI's forms
    ({"type": "text"}, {"type": "json_object"}, {"type": "json_schema", "json_schema": {"name",
    "schema", "strict"}}) and llama-cpp-python's ({"type": "json_object", "schema": {...}}).
    Raises InvalidArgumentError naming the field."""
    if response_format is None:
        return None
    if not isinstance(response_format, dict):
        raise InvalidArgumentError(f"{where} must be an object such as {{\"type\": \"json_object\"}}")
    kind = response_format.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        schema = response_format.get("schema", {"type": "object"})
    elif kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, dict):
            raise InvalidArgumentError(f"{where}.json_schema must be an object with a 'schema'")
        schema = spec.get("schema", {})
    else:
        raise InvalidArgumentError(f"{where}.type must be text, json_object or json_schema, got "
                                   f"{json.dumps(kind)[:40]}")
    if not isinstance(schema, dict):
        raise InvalidArgumentError(f"{where}: the schema must be a JSON object, got {type(schema).__name__}")
    return schema


def completion_grammar(tokenizer, response_format: Any = None, gbnf: str | None = None) -> "Grammar | None":
    """The Grammar a text completion asks for: ``response_format``'s JSON or ``gbnf``'s grammar
    (not both), over the whole text; None: free text."""
    schema = schema_of(response_format)
    if schema is not None and gbnf is not None:
        raise InvalidArgumentError("grammar: a grammar and a response_format cannot both be given")
    if gbnf is not None:
        return Grammar(tokenizer, gbnf=gbnf)
    return None if schema is None else Grammar(tokenizer, schema)


class Grammar:
    """A compiled grammar for one tokenizer, from a JSON schema (its JSON in JSON_FORM; ``lenient``:
    keywords the engine lacks are skipped), from llguidance's Lark text (``lark``; ``schema``, if
    given too, is only what ``where`` names in errors), or from llama.cpp's GBNF (``gbnf``,
    converted to Lark by llguidance); ``constraint()`` starts a generation under it."""

    def __init__(self, tokenizer, schema: dict | None = None, where: str = "response_format", lenient: bool = False,
                 lark: str | None = None, gbnf: str | None = None):
        ll = _llguidance()
        self._ll = ll
        self.tokenizer = ll_tokenizer(tokenizer)
        what = "the schema"
        try:
            if gbnf is not None:
                where, what = "grammar", "the grammar"
                if not isinstance(gbnf, str) or not gbnf.strip():
                    raise ValueError("it must be a non-empty string of GBNF rules")
                from llguidance.gbnf_to_lark import any_to_lark
                try:
                    lark = any_to_lark(gbnf)
                except Exception as exc:   # the converter raises its own error types
                    raise ValueError(f"not GBNF: {exc}") from None
            self.grammar = ll.LLMatcher.grammar_from_lark(lark) if lark is not None else \
                ll.LLMatcher.grammar_from_json_schema(schema, overrides={**JSON_FORM, "lenient": lenient})
        except (ValueError, TypeError) as exc:
            raise InvalidArgumentError(f"{where}: {what} is not valid: {exc}"[:1000]) from None
        is_error, messages = ll.LLMatcher.validate_grammar_with_warnings(self.grammar, self.tokenizer)
        if is_error:
            raise InvalidArgumentError(f"{where}: {what} cannot be used: {messages[0]}"[:1000])

    def constraint(self) -> Constraint:
        return Constraint(self)


class Constraint:
    """One generation under a Grammar: ``mask`` the logits before a token is sampled, ``accept``
    the token sampled. The next mask is computed in the background from ``accept`` on."""

    def __init__(self, grammar: Grammar):
        ll = grammar._ll
        self._np = ll.numpy
        self._matcher = ll.LLMatcher(grammar.tokenizer, grammar.grammar, log_level=0)
        self._n_vocab = grammar.tokenizer.vocab_size
        self._bits = ll.numpy.allocate_token_bitmask(1, self._n_vocab)
        self._pending = _MASKS.submit(self._fill)

    def _fill(self) -> None:
        self._np.fill_next_token_bitmask(self._matcher, self._bits, 0)

    def mask(self, logits: np.ndarray) -> np.ndarray:
        """logits (a copy) with -inf wherever the grammar allows no token."""
        self._pending.result()
        if self._matcher.is_error():
            raise InvalidArgumentError(f"the reply left its grammar: {self._matcher.get_error()}"[:1000])
        allowed = np.unpackbits(self._bits[0].view(np.uint8), bitorder="little")[:logits.size].astype(bool)
        out = np.array(logits, dtype=np.float32, copy=True)
        out[~allowed[:out.size]] = -np.inf
        return out

    def accept(self, token: int) -> None:
        """Consumes the sampled token and starts computing the next step's mask."""
        self._pending.result()
        self._matcher.consume_token(int(token))
        self._pending = _MASKS.submit(self._fill)

    @property
    def done(self) -> bool:
        """The grammar is complete: only an end-of-generation token may follow."""
        return self._matcher.is_stopped()

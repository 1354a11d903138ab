"""Typed reads of GGUF metadata: every key the Python side reads goes through one of these.

A GGUF value carries its own type, so a file may hold a string where an id belongs, or an array of
strings where llama.cpp writes int32. Each getter takes the metadata (anything with ``get``: the
dict of ``GGUFFile.metadata`` or gguf-py's ``field.contents()``, or a ``GGUFHeader``), returns the
value in the Python type asked for, the default when the key is absent, and otherwise raises
``FormatError`` naming the key, the type expected and the type found:

    tokenizer.ggml.eos_token_id: expected an integer, found a string ('2')
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .errors import FormatError

_ABSENT = object()


def describe(value: Any) -> str:
    """The type of a metadata value in words: "a string", "an array of int32", ..."""
    if isinstance(value, (bool, np.bool_)):
        return "a bool"
    if isinstance(value, (int, np.integer)):
        return "an integer"
    if isinstance(value, (float, np.floating)):
        return "a float"
    if isinstance(value, (str, bytes)):
        return "a string"
    if isinstance(value, np.ndarray):
        return f"an array of {value.dtype.name}" if value.dtype.kind in "biuf" else "an array"
    if isinstance(value, (list, tuple)):
        kinds = {describe(v) for v in value}
        if len(kinds) == 1:
            return "an array of " + {"a bool": "bools", "an integer": "integers", "a float": "floats",
                                     "a string": "strings"}.get(kinds.pop(), "arrays")
        return "an array" if kinds else "an empty array"
    return f"a {type(value).__name__}"


def _fail(key: str, expected: str, value: Any, where: str) -> FormatError:
    shown = f" ({value!r})" if isinstance(value, (str, bytes, int, float)) and len(repr(value)) <= 40 else ""
    return FormatError(f"{where}{key}: expected {expected}, found {describe(value)}{shown}")


def _lookup(md: Any, key: str) -> Any:
    return md.get(key, _ABSENT)


def get_int(md: Any, key: str, default: Any = None, *, where: str = "") -> Any:
    v = _lookup(md, key)
    if v is _ABSENT:
        return default
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        raise _fail(key, "an integer", v, where)
    return int(v)


def get_bool(md: Any, key: str, default: Any = None, *, where: str = "") -> Any:
    v = _lookup(md, key)
    if v is _ABSENT:
        return default
    if not isinstance(v, (bool, np.bool_)):
        raise _fail(key, "a bool", v, where)
    return bool(v)


def get_str(md: Any, key: str, default: Any = None, *, where: str = "") -> Any:
    v = _lookup(md, key)
    if v is _ABSENT:
        return default
    if not isinstance(v, str):
        raise _fail(key, "a string", v, where)
    return v


def get_float(md: Any, key: str, default: Any = None, *, where: str = "") -> Any:
    """A number (integers are taken too); NaN and infinities are refused."""
    v = _lookup(md, key)
    if v is _ABSENT:
        return default
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise _fail(key, "a number", v, where)
    if not math.isfinite(float(v)):
        raise FormatError(f"{where}{key}: {float(v)} is not a finite number")
    return float(v)


def _array(md: Any, key: str, default: Any, expected: str, kinds: str, where: str) -> Any:
    v = _lookup(md, key)
    if v is _ABSENT:
        return default
    if isinstance(v, np.ndarray):
        if v.ndim == 1 and (v.size == 0 or v.dtype.kind in kinds):
            return v.tolist()
        raise _fail(key, expected, v, where)
    if not isinstance(v, (list, tuple)):
        raise _fail(key, expected, v, where)
    ok = {"i": lambda x: isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_)),
          "f": lambda x: isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, (bool, np.bool_)),
          "U": lambda x: isinstance(x, (str, bytes))}[kinds[0]]
    if not all(ok(x) for x in v):
        raise _fail(key, expected, v, where)
    return list(v)


def get_int_list(md: Any, key: str, default: Any = None, *, where: str = "") -> Any:
    return _array(md, key, default, "an array of integers", "iu", where)


def get_float_list(md: Any, key: str, default: Any = None, *, finite: bool = False, where: str = "") -> Any:
    """An array of numbers, returned as floats; with ``finite``, NaN and infinities are refused."""
    v = _array(md, key, default, "an array of numbers", "fiu", where)
    if v is default:
        return v
    out = [float(x) for x in v]
    if finite and not all(math.isfinite(x) for x in out):
        raise FormatError(f"{where}{key}: the array holds a NaN or an infinity")
    return out


def get_str_list(md: Any, key: str, default: Any = None, *, where: str = "") -> Any:
    v = _array(md, key, default, "an array of strings", "U", where)
    if v is default:
        return v
    try:
        return [x.decode("utf-8") if isinstance(x, bytes) else x for x in v]
    except UnicodeDecodeError:
        raise FormatError(f"{where}{key}: an entry is not valid UTF-8") from None


def require(value: Any, key: str, where: str = "") -> Any:
    """``value`` unless it is None (the key was absent): then a FormatError naming the key."""
    if value is None:
        raise FormatError(f"{where}required key '{key}' is missing")
    return value

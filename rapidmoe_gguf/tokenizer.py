"""Tokenizers in GGUF files, both ways.

Writing: `tokenizer_kv_from_hf` turns a Hugging Face checkpoint's tokenizer.json (and its config
files) into llama.cpp's `tokenizer.*` keys; `add_tokenizer_to_writer` stores them with the GGUF types
llama.cpp reads.

Reading: `Tokenizer.from_gguf_metadata` rebuilds a `tokenizers.Tokenizer` from those keys.

A GGUF stores the vocabulary, the merges and the special ids, but only the *name* of the
pre-tokenizer (`tokenizer.ggml.pre`). The split regexes behind each name are hard-coded in llama.cpp
(`llama-vocab.cpp`); `PRE_TOKENIZERS` is our table of the ones we support. An unknown name is
refused, never guessed: a wrong split silently changes every prompt.
"""

from __future__ import annotations

import codecs
import json
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as _Backend

from .errors import FormatError, UnsupportedError
from .metadata import get_bool, get_float_list, get_int, get_int_list, get_str, get_str_list

# tokenizer.ggml.token_type values (llama.cpp's llama_token_type).
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

SPIECE_SPACE = "\u2581"  # '▁': SentencePiece's visible space


@dataclass(frozen=True)
class PreTokenizer:
    """How one `tokenizer.ggml.pre` name splits text before byte-level BPE."""

    regexes: tuple[str, ...]  # applied in turn, each match kept as its own piece ("isolated")
    nfc: bool = False  # the Hugging Face family normalizes text to NFC first
    ignore_merges: bool = False  # a piece that is itself a token is taken whole (llama.cpp: ignore_merges)
    add_bos: bool = False  # llama.cpp's add_bos_token default for this name


_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
           r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN35 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
           r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_UPPER, _LOWER = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]", r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"
_CONTRACTION = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
_GPT4O = (rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+{_CONTRACTION}"
          rf"|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*{_CONTRACTION}"
          r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_TEKKEN = (rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*"
           r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_DEEPSEEK3 = (
    r"\p{N}{1,3}",
    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",  # CJK ideographs, hiragana, katakana
    r"[!" '"' r"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
    r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
)
# Kimi-K2 (tiktoken): Han runs apart from other letters; class intersections (&&) as Oniguruma spells them.
_NOT_HAN_UPPER, _NOT_HAN_LOWER = (r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]",
                                  r"[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]")
_KIMI_K2 = (rf"[\p{{Han}}]+|[^\r\n\p{{L}}\p{{N}}]?{_NOT_HAN_UPPER}*{_NOT_HAN_LOWER}+{_CONTRACTION}"
            rf"|[^\r\n\p{{L}}\p{{N}}]?{_NOT_HAN_UPPER}+{_NOT_HAN_LOWER}*{_CONTRACTION}"
            r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# What llama.cpp falls back to for a byte-level vocabulary without a pre name.
_LLAMACPP_DEFAULT = (r"[\p{P}\$\+<=>\^~\|]+",
                     r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)",
                     r"\p{N}+", r"[0-9][0-9][0-9]")

# Ordered: when several names share a regex, the writer picks the first whose flags fit.
PRE_TOKENIZERS: dict[str, PreTokenizer] = {
    "gpt-2": PreTokenizer((_GPT2,)),
    "olmo": PreTokenizer((_GPT2,), nfc=True),  # GPT-NeoX style (OLMo, OLMoE)
    "llama-bpe": PreTokenizer((_LLAMA3,), ignore_merges=True, add_bos=True),
    "dbrx": PreTokenizer((_LLAMA3,)),
    "qwen2": PreTokenizer((_QWEN2,), nfc=True),
    "qwen35": PreTokenizer((_QWEN35,), nfc=True),
    "gpt-4o": PreTokenizer((_GPT4O,)),
    "tekken": PreTokenizer((_TEKKEN,), ignore_merges=True, add_bos=True),
    "deepseek-v3": PreTokenizer(_DEEPSEEK3),
    "glm4": PreTokenizer((_LLAMA3,), ignore_merges=True),   # GLM-4.5/4.6/4.7: llama3's split, no BOS
    "kimi-k2": PreTokenizer((_KIMI_K2,)),
    "default": PreTokenizer(_LLAMACPP_DEFAULT),
}
# Other names llama.cpp gives the same splitting (read only; the writer uses the names above).
PRE_ALIASES = {
    "llama3": "llama-bpe", "llama-v3": "llama-bpe", "falcon3": "llama-bpe", "pixtral": "llama-bpe",
    "smaug-bpe": "dbrx", "deepseek-r1-qwen": "qwen2", "megrez": "qwen2",
    "llama4": "gpt-4o", "minimax-m2": "gpt-4o", "glm5": "glm4",
}

# llama.cpp's end-of-generation rule (llama-vocab.cpp, llama_vocab::impl::load): the eos/eot/eom
# ids, the FIM pad/repo/file-separator tokens, and every token spelled like one of these.
_EOG_TEXTS = frozenset({
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<｜end▁of▁sentence｜>", "[e~[",
})
_FIM_TEXTS = {  # found by text when the file does not give the id
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
}
_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _byte_alphabet() -> list[str]:
    """GPT-2's byte-to-character table: printable Latin-1 bytes stand for themselves, the other 68
    get U+0100 upwards in byte order, so every byte is one visible character ('Ġ' is a space)."""
    printable = {*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)}
    table, shifted = [], 0
    for b in range(256):
        table.append(chr(b) if b in printable else chr(0x100 + shifted))
        shifted += b not in printable
    return table


_BYTE_OF_CHAR = {c: b for b, c in enumerate(_byte_alphabet())}


# --------------------------------------------------------------------------------------------
# Writing: Hugging Face checkpoint -> tokenizer.* keys
# --------------------------------------------------------------------------------------------

def _read_json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def _canonical_regex(regex: str) -> str:
    """One spelling per regex: llama.cpp writes the contractions case-expanded and may hold raw CR/LF."""
    expanded = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
    return regex.replace(expanded, r"(?i:'s|'t|'re|'ve|'m|'ll|'d)").replace("\r", r"\r").replace("\n", r"\n")


def _steps(component: dict | None, list_key: str) -> list[dict]:
    if not component:
        return []
    if component["type"] == "Sequence":
        return [s for c in component[list_key] for s in _steps(c, list_key)]
    return [component]


def _byte_level_pre_name(tj: dict, prefer: tuple[str, ...] = ()) -> str:
    """The `tokenizer.ggml.pre` name that splits text as this tokenizer.json does; among names that
    split alike, one of `prefer` (the model family's own name, e.g. glm4 over llama-bpe)."""
    regexes = []
    for step in _steps(tj.get("pre_tokenizer"), "pretokenizers"):
        if step["type"] == "Split" and "Regex" in step["pattern"] and step.get("behavior") == "Isolated" \
                and not step.get("invert"):
            regexes.append(_canonical_regex(step["pattern"]["Regex"]))
        elif step["type"] == "ByteLevel" and not step.get("add_prefix_space"):
            if step.get("use_regex", True):
                regexes.append(_GPT2)
        else:
            raise UnsupportedError(f"tokenizer.json: pre-tokenizer step {json.dumps(step)} is not supported")
    norms = [n["type"] for n in _steps(tj.get("normalizer"), "normalizers")]
    if norms not in ([], ["NFC"]):
        raise UnsupportedError(f"tokenizer.json: normalizer {norms} is not supported for byte-level BPE")
    nfc = norms == ["NFC"]
    names = [n for n, p in PRE_TOKENIZERS.items()
             if tuple(map(_canonical_regex, p.regexes)) == tuple(regexes) and p.nfc == nfc]
    if not names:
        raise UnsupportedError(
            f"tokenizer.json: pre-tokenizer regex {regexes!r} (NFC={nfc}) matches no known llama.cpp "
            f"pre-tokenizer (known: {', '.join(PRE_TOKENIZERS)})")
    for name in prefer:
        if name in names:
            return name
    # ignore_merges rarely changes a result (tiktoken-made vocabularies): prefer, do not require, a match.
    ignore = bool(tj["model"].get("ignore_merges"))
    return next((n for n in names if PRE_TOKENIZERS[n].ignore_merges == ignore), names[0])


def _spm_add_space_prefix(tj: dict) -> bool:
    for n in _steps(tj.get("normalizer"), "normalizers"):
        if n["type"] == "Prepend" and n.get("prepend") == SPIECE_SPACE:
            return True
    for p in _steps(tj.get("pre_tokenizer"), "pretokenizers"):
        if p["type"] == "Metaspace" and p.get("prepend_scheme", "always") != "never":
            return True
    return False


def _special_in_template(tj: dict, text: str | None, first: bool) -> bool | None:
    """Whether the post-processor puts `text` first (or last) in a single sequence; None: no template."""
    for proc in _steps(tj.get("post_processor"), "processors"):
        if proc["type"] == "TemplateProcessing" and proc.get("single"):
            piece = proc["single"][0 if first else -1]
            return "SpecialToken" in piece and piece["SpecialToken"]["id"] == text
    return None


def _first(*values):
    return next((v for v in values if v is not None), None)


def _first_id(value: Any) -> int | None:
    value = value[0] if isinstance(value, list) and value else value
    return value if isinstance(value, int) else None


def tokenizer_kv_from_hf(hf_dir: str | Path, prefer_pre: tuple[str, ...] = ()) -> dict[str, Any]:
    """The llama.cpp `tokenizer.*` keys for a Hugging Face checkpoint (needs tokenizer.json);
    `prefer_pre`: pre-tokenizer names to give when they split as the tokenizer does."""
    hf_dir = Path(hf_dir)
    tj = _read_json(hf_dir / "tokenizer.json")
    if not tj:
        raise UnsupportedError(f"{hf_dir}: no tokenizer.json (a tokenizer.model alone is not supported)")
    tc = _read_json(hf_dir / "tokenizer_config.json")
    config = _read_json(hf_dir / "config.json")
    if isinstance(config.get("text_config"), dict):   # a multimodal config: the text model's ids beneath the top level's
        config = {**config["text_config"], **{k: v for k, v in config.items() if v is not None}}
    gen_config = _read_json(hf_dir / "generation_config.json")
    model = tj["model"]
    if model.get("type", "BPE") != "BPE":
        raise UnsupportedError(f"tokenizer.json: model type {model.get('type')!r} is not supported (only BPE)")

    byte_level = any(s["type"] == "ByteLevel" for s in _steps(tj.get("pre_tokenizer"), "pretokenizers")) \
        or (tj.get("decoder") or {}).get("type") == "ByteLevel"
    if byte_level:
        kind, pre = "gpt2", _byte_level_pre_name(tj, prefer_pre)
    elif model.get("byte_fallback"):
        kind, pre = "llama", "default"
    else:
        raise UnsupportedError("tokenizer.json: BPE with neither a byte-level alphabet nor byte fallback")

    added = {t["id"]: t for t in tj.get("added_tokens", [])}
    by_id = {i: t for t, i in model["vocab"].items()} | {i: t["content"] for i, t in added.items()}
    n_vocab = max(max(by_id) + 1, config.get("vocab_size") or 0)
    tokens = [by_id.get(i, f"[PAD{i}]") for i in range(n_vocab)]
    index = {t: i for i, t in enumerate(tokens)}
    if len(index) != n_vocab:
        raise FormatError(f"{hf_dir}: tokenizer.json spells two ids the same")
    unk = tc.get("unk_token") or model.get("unk_token")
    unk = unk["content"] if isinstance(unk, dict) else unk

    types = []
    for i, tok in enumerate(tokens):
        if i in added:
            special = added[i].get("special", False)
            types.append(UNKNOWN if kind == "llama" and tok == unk else CONTROL if special else USER_DEFINED)
        elif i not in by_id:
            types.append(UNUSED)
        elif kind == "llama" and _BYTE_TOKEN.fullmatch(tok):
            types.append(BYTE)
        else:
            types.append(NORMAL)

    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    kv: dict[str, Any] = {
        "tokenizer.ggml.model": kind,
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": merges,
    }
    if kind == "llama":
        # llama.cpp's SPM merges the best-scoring pair first: score a piece by its merge rank.
        # A longer piece no merge makes ranks after all of them; single characters never get merged.
        rank = {}
        for r, m in enumerate(merges):
            rank.setdefault(m.replace(" ", "", 1), r)
        multi_char = [types[i] == NORMAL and len(t) > 1 for i, t in enumerate(tokens)]
        kv["tokenizer.ggml.scores"] = [-float(rank.get(t, len(merges) + i)) if multi_char[i] else 0.0
                                       for i, t in enumerate(tokens)]
        kv["tokenizer.ggml.add_space_prefix"] = _spm_add_space_prefix(tj)

    def text_id(name: str) -> int | None:  # tokenizer_config.json spells special tokens by text
        value = tc.get(name)
        return index.get(value["content"] if isinstance(value, dict) else value)

    # Text from tokenizer_config.json first, then the ids in config.json / generation_config.json.
    ids = {
        "bos": _first(text_id("bos_token"), _first_id(config.get("bos_token_id"))),
        "eos": _first(text_id("eos_token"), _first_id(config.get("eos_token_id")),
                      _first_id(gen_config.get("eos_token_id"))),
        "unknown": index.get(unk),
        "padding": _first(text_id("pad_token"), _first_id(config.get("pad_token_id"))),
    }
    ids = {name: i for name, i in ids.items() if i is not None and 0 <= i < n_vocab}
    kv |= {f"tokenizer.ggml.{name}_token_id": i for name, i in ids.items()}
    bos_text, eos_text = (tokens[ids[n]] if n in ids else None for n in ("bos", "eos"))
    kv["tokenizer.ggml.add_bos_token"] = bool(_first(
        tc.get("add_bos_token"), _special_in_template(tj, bos_text, first=True), kind == "llama"))
    kv["tokenizer.ggml.add_eos_token"] = bool(_first(
        tc.get("add_eos_token"), _special_in_template(tj, eos_text, first=False)))

    template = tc.get("chat_template")
    if template is None and (hf_dir / "chat_template.jinja").is_file():
        template = (hf_dir / "chat_template.jinja").read_text(encoding="utf-8")
    if isinstance(template, list):  # named templates: [{"name": ..., "template": ...}]
        for t in template:
            key = "tokenizer.chat_template" + ("" if t["name"] == "default" else f".{t['name']}")
            kv[key] = t["template"]
    elif isinstance(template, str):
        kv["tokenizer.chat_template"] = template
    return kv


def add_tokenizer_to_writer(writer, kv: dict[str, Any]) -> None:
    """Write `tokenizer_kv_from_hf`'s keys to a `gguf.GGUFWriter` with the types llama.cpp expects:
    ids uint32, token_type int32 array, scores float32 array, flags bool, names strings."""
    for key, value in kv.items():
        if key == "tokenizer.ggml.token_type":
            writer.add_token_types([int(v) for v in value])
        elif key == "tokenizer.ggml.scores":
            writer.add_token_scores([float(v) for v in value])
        elif isinstance(value, bool):
            writer.add_bool(key, value)
        elif isinstance(value, int):
            writer.add_uint32(key, value)
        elif isinstance(value, str):
            writer.add_string(key, value)
        elif isinstance(value, (list, tuple)):
            writer.add_array(key, list(value))
        else:
            raise UnsupportedError(f"tokenizer key {key!r}: value of type {type(value).__name__}")


# --------------------------------------------------------------------------------------------
# Reading: tokenizer.* keys -> tokenizers.Tokenizer
# --------------------------------------------------------------------------------------------

def _merges_from_scores(tokens: list[str], scores: list[float], types: list[int]) -> list[tuple[str, str]]:
    """SentencePiece files carry no merges. Every split of a normal piece into two vocabulary pieces
    is one, ranked by the score of the piece it makes (llama.cpp joins the best-scoring pair first)."""
    index = {t: i for i, t in enumerate(tokens)}
    found = [(-scores[i], i, cut, tok[:cut], tok[cut:])
             for i, tok in enumerate(tokens) if types[i] == NORMAL
             for cut in range(1, len(tok)) if tok[:cut] in index and tok[cut:] in index]
    return [(left, right) for *_, left, right in sorted(found)]


def _pre_tokenizer(name: str) -> PreTokenizer | None:
    return PRE_TOKENIZERS.get(PRE_ALIASES.get(name, name))


def _bpe(vocab: dict[str, int], merges: list[tuple[str, str]], **options):
    try:
        return models.BPE(vocab, merges, **options)
    except Exception as exc:  # tokenizers raises a bare Exception naming the bad merge
        raise FormatError(f"tokenizer.ggml.merges: {exc}") from exc


def _eog_ids(tokens: list[str], md: dict, eos_id: int | None) -> frozenset[int]:
    index: dict[str, int] = {}
    for i, t in enumerate(tokens):
        index.setdefault(t, i)
    eog = {index[t] for t in _EOG_TEXTS if t in index}
    for name, texts in _FIM_TEXTS.items():
        fim = get_int(md, f"tokenizer.ggml.{name}_token_id")
        eog.add(fim if fim is not None else min((index[t] for t in texts if t in index), default=None))
    for token_id in (eos_id, get_int(md, "tokenizer.ggml.eot_token_id"), get_int(md, "tokenizer.ggml.eom_token_id")):
        eog.add(token_id)
    eog = {int(i) for i in eog if i is not None and 0 <= i < len(tokens)}
    texts = {tokens[i] for i in eog}
    # gpt-oss (and solar-open) end a message with <|end|> but keep generating after it.
    if "<|end|>" in texts and ({"<|return|>", "<|call|>"} <= texts or {"<|calls|>", "<|flush|>"} <= texts):
        eog.discard(index["<|end|>"])
    if "</s>" in texts and "<|tool_response>" in texts:  # gemma4
        eog.discard(index["</s>"])
    return frozenset(eog)


class Tokenizer:
    """A GGUF file's tokenizer: `encode`, `decode`, pieces, and the ids a generate loop needs.
    `backend` is the `tokenizers.Tokenizer` doing the work."""

    def __init__(self, backend, metadata: dict, tokens: list[str], token_types: list[int]):
        self.backend = backend
        self.model = get_str(metadata, "tokenizer.ggml.model")
        self._tokens, self._types = tokens, token_types
        default_bos, default_eos = (1, 2) if self.model == "llama" else (None, None)  # llama.cpp's SPM defaults
        self.bos_id: int | None = get_int(metadata, "tokenizer.ggml.bos_token_id", default_bos)
        self.eos_id: int | None = get_int(metadata, "tokenizer.ggml.eos_token_id", default_eos)
        pre = _pre_tokenizer(get_str(metadata, "tokenizer.ggml.pre", "default"))
        default_add_bos = self.model == "llama" or (pre is not None and pre.add_bos)
        self.add_bos = get_bool(metadata, "tokenizer.ggml.add_bos_token", default_add_bos)
        self.add_eos = get_bool(metadata, "tokenizer.ggml.add_eos_token", False)
        for flag, token_id, what in ((self.add_bos, self.bos_id, "bos"), (self.add_eos, self.eos_id, "eos")):
            if flag and (token_id is None or not 0 <= token_id < len(tokens)):
                raise FormatError(f"tokenizer.ggml.add_{what}_token is true, but {what}_token_id is {token_id}")
        self.eog_ids = _eog_ids(tokens, metadata, self.eos_id)
        self.chat_template: str | None = get_str(metadata, "tokenizer.chat_template")
        self._strip_first_space = self.model == "llama" and get_bool(
            metadata, "tokenizer.ggml.add_space_prefix", True)

    @classmethod
    def from_gguf_metadata(cls, metadata: dict) -> Tokenizer:
        """Build from GGUF metadata (key -> value; arrays as lists or numpy arrays). A key of the
        wrong type is a FormatError naming it."""
        kind = get_str(metadata, "tokenizer.ggml.model")
        if kind not in ("gpt2", "llama"):
            raise UnsupportedError(f"tokenizer.ggml.model {kind!r} is not supported (supported: gpt2, llama)")
        tokens = get_str_list(metadata, "tokenizer.ggml.tokens")
        if tokens is None:
            raise FormatError("GGUF metadata has no tokenizer.ggml.tokens")
        tokens = [t or f"[EMPTY_{i}]" for i, t in enumerate(tokens)]  # as llama.cpp does
        types = get_int_list(metadata, "tokenizer.ggml.token_type", [NORMAL] * len(tokens))
        if len(types) < len(tokens):
            raise FormatError(f"tokenizer.ggml.token_type has {len(types)} entries for {len(tokens)} tokens")
        vocab = {t: i for i, t in enumerate(tokens)}
        if len(vocab) != len(tokens):
            raise FormatError("tokenizer.ggml.tokens spells two ids the same")
        merges = [(m[:cut], m[cut + 1:]) for m in get_str_list(metadata, "tokenizer.ggml.merges", [])
                  if (cut := m.find(" ", 1)) > 0]

        if kind == "gpt2":
            pre_name = get_str(metadata, "tokenizer.ggml.pre")
            if pre_name is None:  # llama.cpp does the same, and warns that quality suffers
                warnings.warn("GGUF has no tokenizer.ggml.pre; splitting text with llama.cpp's 'default'")
                pre_name = "default"
            pre = _pre_tokenizer(pre_name)
            if pre is None:
                raise UnsupportedError(
                    f"tokenizer.ggml.pre {pre_name!r} is not a supported pre-tokenizer "
                    f"(supported: {', '.join([*PRE_TOKENIZERS, *PRE_ALIASES])})")
            if not merges:
                raise FormatError("tokenizer.ggml.merges is missing; a gpt2 tokenizer needs it")
            backend = _Backend(_bpe(vocab, merges, ignore_merges=pre.ignore_merges))
            if pre.nfc:
                backend.normalizer = normalizers.NFC()
            backend.pre_tokenizer = pre_tokenizers.Sequence(
                [pre_tokenizers.Split(Regex(r), "isolated") for r in pre.regexes]
                + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
            backend.decoder = decoders.ByteLevel()
        else:
            if not merges:
                scores = get_float_list(metadata, "tokenizer.ggml.scores", [0.0] * len(tokens))
                if len(scores) < len(tokens):
                    raise FormatError(f"tokenizer.ggml.scores has {len(scores)} entries for {len(tokens)} tokens")
                merges = _merges_from_scores(tokens, scores, types)
            unk_id = get_int(metadata, "tokenizer.ggml.unknown_token_id", 0)
            unk = tokens[unk_id] if unk_id is not None and 0 <= unk_id < len(tokens) else None
            backend = _Backend(_bpe(vocab, merges, unk_token=unk, fuse_unk=True, byte_fallback=True))
            prefix = get_bool(metadata, "tokenizer.ggml.add_space_prefix", True)
            # Like sentencepiece (and llama.cpp): every run of text between added tokens gets the
            # dummy-prefix space, and a leading space is kept, not merged into it.
            backend.normalizer = normalizers.Sequence(
                ([normalizers.Prepend(SPIECE_SPACE)] if prefix else [])
                + [normalizers.Replace(" ", SPIECE_SPACE)])
            backend.decoder = decoders.Sequence(
                [decoders.Replace(SPIECE_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
                + ([decoders.Strip(content=" ", left=1)] if prefix else []))

        backend.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                    for t, k in zip(tokens, types) if k in (CONTROL, UNKNOWN)])
        backend.add_tokens([AddedToken(t, special=False, normalized=False)
                            for t, k in zip(tokens, types) if k == USER_DEFINED])
        return cls(backend, metadata, tokens, types[:len(tokens)])

    @property
    def n_vocab(self) -> int:
        return len(self._tokens)

    def is_special(self, token_id: int) -> bool:
        """Control (and unknown) tokens: rendered as their text, dropped by `skip_special`."""
        return self._types[token_id] in (CONTROL, UNKNOWN)

    def encode(self, text: str, add_special: bool = True) -> list[int]:
        """Token ids for `text`; special tokens written in the text become their ids. With
        `add_special`, BOS/EOS are added when the file's add_bos_token/add_eos_token say so."""
        ids = self.backend.encode(text, add_special_tokens=False).ids
        if add_special and self.add_bos:
            ids.insert(0, self.bos_id)
        if add_special and self.add_eos:
            ids.append(self.eos_id)
        return ids

    def decode(self, ids, skip_special: bool = False) -> str:
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special)

    def token_to_piece(self, token_id: int) -> bytes:
        """The bytes one token stands for (a special token: its text). Several pieces may be needed
        to complete one character."""
        text, kind = self._tokens[token_id], self._types[token_id]
        if kind in (CONTROL, UNKNOWN, USER_DEFINED):
            return text.encode("utf-8")
        if self.model == "llama":
            byte = _BYTE_TOKEN.fullmatch(text)
            return bytes([int(byte.group(1), 16)]) if byte else text.replace(SPIECE_SPACE, " ").encode("utf-8")
        if all(c in _BYTE_OF_CHAR for c in text):
            return bytes(_BYTE_OF_CHAR[c] for c in text)
        return text.encode("utf-8")


class IncrementalDecoder:
    """Streaming detokenizer: `feed(id)` returns the text completed by that token, holding back the
    bytes of a character split across tokens (an emoji is often several byte tokens). The pieces
    joined, plus `flush()`, equal `tokenizer.decode(ids, skip_special)`."""

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = False):
        self._tokenizer, self._skip_special = tokenizer, skip_special
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._strip_pending = tokenizer._strip_first_space  # SPM: the dummy-prefix space of the text

    def feed(self, token_id: int) -> str:
        if self._skip_special and self._tokenizer.is_special(token_id):
            return ""
        return self._emit(self._utf8.decode(self._tokenizer.token_to_piece(token_id)))

    def flush(self) -> str:
        """Whatever is held back at the end of the stream (an incomplete character becomes U+FFFD)."""
        return self._emit(self._utf8.decode(b"", final=True))

    def _emit(self, text: str) -> str:
        if self._strip_pending and text:
            self._strip_pending = False
            text = text[1:] if text[0] == " " else text
        return text

"""Tokenizers in GGUF files, both ways.

Writing: `tokenizer_kv_from_hf` turns a Hugging Face checkpoint's tokenizer.json (and its config
files) into llama.cpp's `tokenizer.*` keys; `add_tokenizer_to_writer` stores them with the GGUF types
llama.cpp reads.

Reading: `Tokenizer.from_gguf_metadata` tokenizes as llama.cpp (llama-vocab.cpp) does for the file's
`tokenizer.ggml.model`: "gpt2" (byte-level BPE), "llama" (SentencePiece BPE), "gemma4" (BPE on
SentencePiece pieces), "t5" (unigram), "rwkv" (greedy trie) and "plamo2". The BPE models run on a
`tokenizers.Tokenizer` (regex splits, byte-level alphabet, merges); llama.cpp's special-token
splitting, its unigram, RWKV and PLaMo-2 searches and its detokenizer are our own code, since the
`tokenizers` library cannot express them exactly.

A GGUF stores the vocabulary, the merges and the special ids, but only the *name* of the
pre-tokenizer (`tokenizer.ggml.pre`). The split regexes behind each name are hard-coded in llama.cpp
(`llama-vocab.cpp`); `PRE_TOKENIZERS` (names the writer gives), `PRE_ALIASES` and
`LLAMACPP_PRE_TOKENIZERS` (names only read) are our copy of that table. An unknown name is refused,
never guessed: a wrong split silently changes every prompt.
"""

from __future__ import annotations

import codecs
import json
import re
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Regex, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as _Backend

from .errors import FormatError, UnsupportedError
from .metadata import get_bool, get_float_list, get_int, get_int_list, get_str, get_str_list

# tokenizer.ggml.token_type values (llama.cpp's llama_token_type).
UNDEFINED, NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 0, 1, 2, 3, 4, 5, 6

SPIECE_SPACE = "\u2581"  # '▁': SentencePiece's visible space


@dataclass(frozen=True)
class PreTokenizer:
    """How llama.cpp splits text before BPE for one `tokenizer.ggml.pre` name, and its flags."""

    regexes: tuple[str, ...]  # llama.cpp's, applied in turn, each match kept as its own piece ("isolated")
    hf_regexes: tuple[str, ...] = ()  # tokenizer.json's spelling when it differs (the writer matches on it)
    nfc: bool = False  # tokenizer.json normalizes to NFC first (the writer matches on it; llama.cpp never does)
    ignore_merges: bool = False  # a piece that is itself a token is taken whole (llama.cpp: ignore_merges)
    add_bos: bool = False  # llama.cpp's add_bos_token default for this name
    clean_spaces: bool = True  # llama.cpp's detokenizer drops the space in " ," " 's"... (clean_up_tokenization_spaces)
    spm_style: bool = False  # pieces are raw UTF-8 with '▁' for ' ' and <0xXX> byte tokens, not byte-level (gemma4)
    force_bos: bool = False  # llama.cpp adds BOS even where the file says not to (Gemma 4)


def _llamacpp_regex(regex: str) -> str:
    r"""llama.cpp's regex as it behaves there, in Oniguruma's syntax. llama.cpp runs a regex with a
    \p{..} class on text where every non-ASCII character is collapsed to one stand-in per category,
    so \p{Lu}, \p{Ll}, \p{Lt}, \p{Lm} and \p{Lo} all mean \p{L}; and its \d (std::regex) is ASCII."""
    if re.search(r"\\p\{[LNPMS]", regex):
        regex = re.sub(r"\\p\{L[ultmo]\}", r"\\p{L}", regex)
    return regex.replace(r"\d", "[0-9]")


_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"  # llama.cpp's (?i:'s|'t|...)
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_GPT2_HF = _GPT2 + r"|\s+"  # tokenizers' ByteLevel regex; the same splits (a lone space run is a piece anyway)
_LLAMA3 = (rf"{_CONTRACTIONS}|[^\r\n\p{{L}}\p{{N}}]?\p{{L}}+|\p{{N}}{{1,3}}"
           r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (rf"{_CONTRACTIONS}|[^\r\n\p{{L}}\p{{N}}]?\p{{L}}+|\p{{N}}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN35 = (rf"{_CONTRACTIONS}|[^\r\n\p{{L}}\p{{N}}]?[\p{{L}}\p{{M}}]+|\p{{N}}"
           r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# GPT-4o and Tekken: tokenizer.json's case-aware letter runs, and llama.cpp's rewrite of them, which
# treats every non-ASCII letter as both cases and leaves combining marks out (they split off).
_UPPER, _LOWER = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]", r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"
_CONTRACTION = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
_GPT4O_HF = (rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+{_CONTRACTION}"
             rf"|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*{_CONTRACTION}"
             r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_TEKKEN_HF = (rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*"
              r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_NOT_LOWER, _NOT_UPPER = r"((?=[\p{L}])([^a-z]))", r"((?=[\p{L}])([^A-Z]))"


def _cased_words(contraction: str) -> str:
    return (rf"[^\r\n\p{{L}}\p{{N}}]?{_NOT_LOWER}*{_NOT_UPPER}+{contraction}"
            rf"|[^\r\n\p{{L}}\p{{N}}]?{_NOT_LOWER}+{_NOT_UPPER}*{contraction}")


_GPT4O = _cased_words(_CONTRACTIONS + "?") + r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_TEKKEN = _cased_words("") + r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_GRANITE_EMB = _GPT4O.replace(r"(?=[\p{L}])", r"(?=[\p{L}\p{M}])")  # marks stay with their letters
_TINY_AYA_WORDS = _llamacpp_regex(rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+{_CONTRACTIONS}?"
                   rf"|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*{_CONTRACTIONS}?"
                   r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_ASCII_PUNCT = r"""[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~]"""
_DEEPSEEK3 = (
    r"\p{N}{1,3}",
    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",  # CJK ideographs, hiragana, katakana
    rf"{_ASCII_PUNCT}[A-Za-z]+|[^\r\n\p{{L}}\p{{P}}\p{{S}}]?[\p{{L}}\p{{M}}]+"
    r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
)
_SPARK2_5 = (
    _DEEPSEEK3[0], _DEEPSEEK3[1],
    rf"{_ASCII_PUNCT}[A-Za-z]+|[^\r\n\p{{L}}\p{{P}}\p{{S}}]?[\p{{L}}\p{{M}}]+| ?[\p{{P}}\p{{S}}]+|[\r\n]|\s+(?!\S)|\s+",
    r"\p{N}",
)
# DeepSeek LLM (V1/V2): letters of the Latin, Greek, Cyrillic... scripts spelled out as ranges.
_DEEPSEEK_LLM_LETTERS = (
    "A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af\u0370-\u0373"
    "\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481"
    "\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf"
    "\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d"
    "\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4"
    "\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107"
    "\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f"
    "\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d"
    "\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17"
    "\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb"
    "\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943"
)
# llama.cpp hands its std::regex patterns every non-ASCII space as "\v" (unicode.cpp), so a class listing
# one (U+3000, or the range U+0800-U+4E00 as llama.cpp spells it) never matches it: "&&\S" takes them out.
_CJK_HANGUL = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff&&\\S]+"
_DEEPSEEK_LLM = (
    r"[\r\n]", rf"\s?[{_DEEPSEEK_LLM_LETTERS}]+",
    "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002&&\\S]+", r"\s+$", _CJK_HANGUL, r"\p{N}+",
)
_DEEPSEEK_CODER = (r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK_HANGUL, r"\p{N}")
_YOUTU = (  # its case-aware letter runs as llama.cpp runs them: plain letter runs
    "[\uac00-\ud7a3\u3131-\u318e]+|[\uff01\u2026\u201c\u201d\u2018\u2019\u2014\uff1a\uff1b\uff0c\u3001-\u303f"
    "\ufe30-\ufe4f]+|[\u3105-\u312f]+|[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    _llamacpp_regex(rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+{_CONTRACTIONS}?"
                    rf"|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*{_CONTRACTIONS}?"
                    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"),
)
# llama.cpp's AFMoE digit rule (unicode.cpp, also Tiny Aya's): a digit run splits into groups of
# three from the right, and the text before the run goes with its first group.
_DIGITS_BY_THREE = r"\P{N}*\p{N}{1,3}(?=(?:\p{N}{3})*(?!\p{N}))|\P{N}+"
_AFMOE = (  # U+8C48-U+FAFF as llama.cpp's source has it (U+F900 meant, probably)
    _DIGITS_BY_THREE,
    "[\u4e00-\u9fff\u3400-\u4dbf\u8c48-\ufaff\u3040-\u309f\u30a0-\u30ff\uff65-\uff9f\u2f00-\u2fdf\u0e40-\u0e7f"
    "\u0e80-\u0eff\u1780-\u17ff\u1000-\u109f\uaa60-\uaa7f\ua9e0-\ua9ff\uac00-\ud7af\u1100-\u11ff]+",
    _DEEPSEEK3[2],
)
_STARCODER = (r"\p{N}", _GPT2)
_BLOOM = " ?[^(\\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+"
_CHAMELEON = (r"<sentinel:[0-9]+>", r"(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z", r"([\t\n]|    |  )", r"\p{N}",
              r"[\p{P}!-/:-@\[-`{-~]", _GPT2)
_JAIS2 = _LLAMA3.replace(r"\s+(?!\S)|\s+", "".join(rf"\s{{{n}}}(?!\S)|" for n in (512, 256, 128, 64, 32, 16, 8, 4))
                         + r"\s{1,2}(?!\S)|\s{1}")
_EXAONE_MOE = (rf"{_CONTRACTIONS}|[^\r\n\p{{L}}\p{{N}}]?(?:\p{{L}}\p{{M}}*(?: \p{{L}}\p{{M}}*)*)+|\p{{N}}"
               r"| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+")
_BAILINGMOE = (r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
               r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+")
_SEED_CODER = (rf"{_CONTRACTIONS}|[^\r\n\p{{L}}\p{{N}}]?\p{{L}}+|\p{{N}}{{1}}"
               r"| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+")
_UFAKZEKA = r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_MINICPM5 = (r"\p{N}{1,3}", _QWEN2.replace(r"|\p{N}|", r"|\p{N}+|"))
_NEWLINE_RUNS = r"[^\n]+|[\n]+"
# Kimi-K2 (tiktoken): Han runs apart from other letters; class intersections (&&) as Oniguruma spells them.
_NOT_HAN_UPPER, _NOT_HAN_LOWER = (r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]",
                                  r"[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]")
_KIMI_K2_HF = (rf"[\p{{Han}}]+|[^\r\n\p{{L}}\p{{N}}]?{_NOT_HAN_UPPER}*{_NOT_HAN_LOWER}+{_CONTRACTION}"
               rf"|[^\r\n\p{{L}}\p{{N}}]?{_NOT_HAN_UPPER}+{_NOT_HAN_LOWER}*{_CONTRACTION}"
               r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# llama.cpp runs it as code (unicode.cpp, unicode_regex_split_custom_kimi_k2), which differs: its Han
# is a list of CJK blocks, and its words are letter runs of either case without combining marks.
_HAN = ("\u4e00-\u9fff\u3400-\u4dbf\U00020000-\U0002a6df\U0002a700-\U0002b73f\U0002b740-\U0002b81f"
        "\U0002b820-\U0002ceaf\U0002ceb0-\U0002ebef\uf900-\ufaff\U0002f800-\U0002fa1f")
_KIMI_K2 = (f"[{_HAN}]+|[^\\r\\n\\p{{L}}\\p{{N}}]?[\\p{{L}}&&[^{_HAN}]]+{_CONTRACTIONS}?"
            r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# What llama.cpp falls back to for a byte-level vocabulary without a pre name.
_LLAMACPP_DEFAULT = (r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]")

# The names the writer gives, ordered: when several share a regex, it picks the first whose flags fit.
PRE_TOKENIZERS: dict[str, PreTokenizer] = {
    "gpt-2": PreTokenizer((_GPT2,), (_GPT2_HF,)),
    "olmo": PreTokenizer((_GPT2,), (_GPT2_HF,), nfc=True),  # GPT-NeoX style (OLMo, OLMoE)
    "llama-bpe": PreTokenizer((_LLAMA3,), ignore_merges=True, add_bos=True),
    "dbrx": PreTokenizer((_LLAMA3,)),
    "qwen2": PreTokenizer((_QWEN2,), nfc=True, clean_spaces=False),
    "qwen35": PreTokenizer((_QWEN35,), nfc=True, clean_spaces=False),
    "gpt-4o": PreTokenizer((_GPT4O,), (_GPT4O_HF,), clean_spaces=False),
    "tekken": PreTokenizer((_TEKKEN,), (_TEKKEN_HF,), ignore_merges=True, add_bos=True, clean_spaces=False),
    "deepseek-v3": PreTokenizer(_DEEPSEEK3, clean_spaces=False),
    "glm4": PreTokenizer((_LLAMA3,), ignore_merges=True),   # GLM-4.5/4.6/4.7: llama3's split, no BOS
    "kimi-k2": PreTokenizer((_KIMI_K2,), (_KIMI_K2_HF,), clean_spaces=False),
    "default": PreTokenizer(_LLAMACPP_DEFAULT),
}
# Other names llama.cpp treats exactly as one of those (read only; the writer uses the names above).
PRE_ALIASES = {
    **dict.fromkeys(("mpt", "phi-2", "jais", "exaone4", "gigachat", "a.x-4.0", "mellum", "modern-bert",
                     "jina-es", "jina-de", "jina-v2-es", "jina-v2-de", "jina-v1-en", "jina-v2-code",
                     "roberta-bpe"), "gpt-2"),
    **dict.fromkeys(("llama3", "llama-v3", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
                     "jina-v5-nano"), "llama-bpe"),
    "smaug-bpe": "dbrx", "chatglm-bpe": "dbrx",
    **dict.fromkeys(("deepseek-r1-qwen", "kormo", "f2llmv2", "hunyuan", "solar-open", "grok-2"), "qwen2"),
    **dict.fromkeys(("llama4", "kanana2", "talkie", "minimax-m2"), "gpt-4o"),
    **dict.fromkeys(("hunyuan-dense", "hy_v4", "joyai-llm"), "deepseek-v3"),
    "glm5": "glm4",
}
_STARCODER_PRE = PreTokenizer(_STARCODER)
_GEMMA4_PRE = PreTokenizer((_NEWLINE_RUNS,), spm_style=True, add_bos=True, force_bos=True)
# The other names llama.cpp 0.3.36 knows (read only: the writer cannot tell them from a tokenizer.json).
LLAMACPP_PRE_TOKENIZERS: dict[str, PreTokenizer] = {
    "deepseek-llm": PreTokenizer(_DEEPSEEK_LLM, clean_spaces=False),  # DeepSeek LLM, V2, V2-Lite
    "deepseek-coder": PreTokenizer(_DEEPSEEK_CODER, clean_spaces=False),
    "falcon": PreTokenizer((r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, r"[0-9][0-9][0-9]")),
    **dict.fromkeys(("starcoder", "refact", "codeshell", "exaone", "minerva-7b", "mellum2"), _STARCODER_PRE),
    **dict.fromkeys(("command-r", "smollm"), PreTokenizer(_STARCODER, clean_spaces=False)),
    **dict.fromkeys(("trillion", "granite-docling"), PreTokenizer((_GPT2,), clean_spaces=False)),
    **dict.fromkeys(("stablelm2", "megrez"), PreTokenizer((_QWEN2,))),
    "jais-2": PreTokenizer((_JAIS2,)),
    "poro-chat": PreTokenizer((_BLOOM,), clean_spaces=False),
    **dict.fromkeys(("bloom", "gpt3-finnish"), PreTokenizer((_BLOOM,))),
    "viking": PreTokenizer((_BLOOM, r"\p{N}"), clean_spaces=False),
    "chameleon": PreTokenizer(_CHAMELEON, add_bos=True, clean_spaces=False),
    "spark2_5": PreTokenizer(_SPARK2_5, clean_spaces=False),
    "youtu": PreTokenizer(_YOUTU, ignore_merges=True, clean_spaces=False),
    "minicpm5": PreTokenizer(_MINICPM5, ignore_merges=True),
    "exaone-moe": PreTokenizer((_EXAONE_MOE,)),
    "granite-embed-multi-97m": PreTokenizer((_GRANITE_EMB,), ignore_merges=True, clean_spaces=False),
    **dict.fromkeys(("tiny_aya", "cohere2moe"), PreTokenizer((_DIGITS_BY_THREE, _TINY_AYA_WORDS),
                                                             clean_spaces=False)),
    "superbpe": PreTokenizer((r"\p{N}+", _llamacpp_regex(r"(?=(\d{3})+(?!\d))")), clean_spaces=False),
    **dict.fromkeys(("bailingmoe", "bailingmoe2", "llada-moe"), PreTokenizer((_BAILINGMOE,), clean_spaces=False)),
    "seed-coder": PreTokenizer((_SEED_CODER,), clean_spaces=False),
    "ufakzeka": PreTokenizer((_UFAKZEKA,), clean_spaces=False),
    "afmoe": PreTokenizer(_AFMOE, clean_spaces=False),
    "laguna": PreTokenizer((_NEWLINE_RUNS, _QWEN2), clean_spaces=False),
    **dict.fromkeys(("gemma4", "granite-embed-multi-311m"), _GEMMA4_PRE),
    "sarvam-moe": PreTokenizer((_NEWLINE_RUNS,), spm_style=True, clean_spaces=False),
}
# Names llama.cpp knows that are not read here, and why.
PRE_OUT_OF_SCOPE = {
    "whitespace": "an embedding model's pre-tokenizer (jina-embeddings-v2-base-zh)",
}

# llama.cpp's end-of-generation rule (llama-vocab.cpp, llama_vocab::impl::load): the eos/eot/eom
# ids, the FIM pad/repo/file-separator tokens, and every token spelled like one of these.
_EOG_TEXTS = frozenset({
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<｜end▁of▁sentence｜>", "[e~[",
})
_FIM_TEXTS = {  # found by text when the file does not give the id; pad, repo and file-separator end generation
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
    "fim_pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
                "<|code_prefix|>", "<|prefix|>"),
    "fim_suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>",
                "<|code_suffix|>", "<|suffix|>"),
    "fim_mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>",
                "<|code_middle|>", "<|middle|>"),
}
_FIM_OLD_KEYS = {"fim_pre": "prefix", "fim_suf": "suffix", "fim_mid": "middle"}  # deprecated key names
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
                regexes.append(_GPT2_HF)
        else:
            raise UnsupportedError(f"tokenizer.json: pre-tokenizer step {json.dumps(step)} is not supported")
    norms = [n["type"] for n in _steps(tj.get("normalizer"), "normalizers")]
    if norms not in ([], ["NFC"]):
        raise UnsupportedError(f"tokenizer.json: normalizer {norms} is not supported for byte-level BPE")
    nfc = norms == ["NFC"]
    names = [n for n, p in PRE_TOKENIZERS.items()
             if tuple(map(_canonical_regex, p.hf_regexes or p.regexes)) == tuple(regexes) and p.nfc == nfc]
    if not names:
        raise UnsupportedError(
            f"tokenizer.json: pre-tokenizer regex {regexes!r} (NFC={nfc}) matches no known llama.cpp "
            f"pre-tokenizer (known: {', '.join(PRE_TOKENIZERS)}); one that splits alike by design can be "
            "named (pre_tokenizer_name)")
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


def _forced_pre_name(tj: dict, name: str) -> str:
    """`name`, which the caller says splits as this tokenizer does: an unknown name is refused,
    naming the known ones; a name the tokenizer.json does not fingerprint to is taken with a warning."""
    pre = pre_tokenizer(name)
    if pre.spm_style:
        raise UnsupportedError(f"pre-tokenizer {name!r} is for SentencePiece-style vocabularies, "
                               "and this tokenizer is byte-level BPE")
    try:
        found = _byte_level_pre_name(tj, (name,))
    except UnsupportedError as exc:
        found, why = None, str(exc)
    else:
        why = f"it splits as {found!r}"
    if found is None or pre_tokenizer(found).regexes != pre.regexes:
        warnings.warn(f"writing tokenizer.ggml.pre {name!r} as asked, though tokenizer.json does not match "
                      f"it ({why}); a wrong pre-tokenizer changes every prompt's tokens")
    return name


def tokenizer_kv_from_hf(hf_dir: str | Path, prefer_pre: tuple[str, ...] = (),
                         pre_tokenizer_name: str | None = None, spm_model: str = "llama") -> dict[str, Any]:
    """The llama.cpp `tokenizer.*` keys for a Hugging Face checkpoint (needs tokenizer.json);
    `prefer_pre`: pre-tokenizer names to give when they split as the tokenizer does;
    `pre_tokenizer_name`: the name to give a byte-level tokenizer whatever its fingerprint (warned
    about when it does not match); `spm_model`: the tokenizer model a SentencePiece-style BPE (byte
    fallback) is written as: "llama", or "gemma4" (llama.cpp's BPE over the pieces, for Gemma 4)."""
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
        kind, pre = "gpt2", (_forced_pre_name(tj, pre_tokenizer_name) if pre_tokenizer_name
                             else _byte_level_pre_name(tj, prefer_pre))
    elif pre_tokenizer_name:
        raise UnsupportedError(f"pre-tokenizer {pre_tokenizer_name!r} was asked for, but this tokenizer is "
                               "SentencePiece BPE, which has none")
    elif model.get("byte_fallback"):
        kind, pre = spm_model, "default"
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

    spm = kind in ("llama", "gemma4")   # SentencePiece pieces with byte tokens
    types = []
    for i, tok in enumerate(tokens):
        if i in added:
            special = added[i].get("special", False)
            types.append(UNKNOWN if spm and tok == unk else CONTROL if special else USER_DEFINED)
        elif i not in by_id:
            types.append(UNUSED)
        elif spm and _BYTE_TOKEN.fullmatch(tok):
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
    if kind == "gemma4":   # as llama.cpp's converter writes it: no pre-tokenizer name, no space prefix
        del kv["tokenizer.ggml.pre"]
        kv["tokenizer.ggml.add_space_prefix"] = False
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
        tc.get("add_bos_token"), _special_in_template(tj, bos_text, first=True), spm))
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
    """Write `tokenizer_kv_from_hf`'s keys (or a GGUF's tokenizer.* keys) to a `gguf.GGUFWriter` with
    the types llama.cpp expects: ids uint32, token_type int32 array, scores float32 array, the
    charsmap uint8 array, flags bool, names strings."""
    for key, value in kv.items():
        if key == "tokenizer.ggml.token_type":
            writer.add_token_types([int(v) for v in value])
        elif key == "tokenizer.ggml.scores":
            writer.add_token_scores([float(v) for v in value])
        elif key == "tokenizer.ggml.precompiled_charsmap":   # uint8, as llama.cpp requires
            writer.add_precompiled_charsmap(bytes(int(b) & 0xFF for b in value))
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
# Reading: tokenizer.* keys -> Tokenizer
# --------------------------------------------------------------------------------------------

_C_SPACES = " \t\n\v\f\r"  # C's isspace(), which llama.cpp's lstrip/rstrip of special tokens uses
_MODELS = ("gpt2", "llama", "gemma4", "t5", "rwkv", "plamo2")
_MODELS_OUT_OF_SCOPE = {
    "bert": "WordPiece, for embedding models",
    "whitespace": "for embedding models",
    "hybriddna": "BPE with DNA k-mers, not supported yet",
    "none": "the file has no vocabulary", "no_vocab": "the file has no vocabulary",
    "test": "llama.cpp's test vocabulary",
}


def _merges_from_scores(tokens: list[str], scores: list[float], types: list[int]) -> list[tuple[str, str]]:
    """SentencePiece files carry no merges. Every split of a normal piece into two vocabulary pieces
    is one, ranked by the score of the piece it makes (llama.cpp joins the best-scoring pair first)."""
    index = {t: i for i, t in enumerate(tokens)}
    found = [(-scores[i], i, cut, tok[:cut], tok[cut:])
             for i, tok in enumerate(tokens) if types[i] == NORMAL
             for cut in range(1, len(tok)) if tok[:cut] in index and tok[cut:] in index]
    return [(left, right) for *_, left, right in sorted(found)]


def pre_tokenizer(name: str) -> PreTokenizer:
    """The `PreTokenizer` llama.cpp uses for a `tokenizer.ggml.pre` name; an unknown name is an
    UnsupportedError that lists the known ones."""
    pre = PRE_TOKENIZERS.get(PRE_ALIASES.get(name, name)) or LLAMACPP_PRE_TOKENIZERS.get(name)
    if pre is not None:
        return pre
    why = f" ({PRE_OUT_OF_SCOPE[name]})" if name in PRE_OUT_OF_SCOPE else ""
    known = sorted({*PRE_TOKENIZERS, *PRE_ALIASES, *LLAMACPP_PRE_TOKENIZERS})
    raise UnsupportedError(f"tokenizer.ggml.pre {name!r} is not a supported pre-tokenizer{why} "
                           f"(supported: {', '.join(known)})")


def _bpe(vocab: dict[str, int], merges: list[tuple[str, str]], **options):
    try:
        return models.BPE(vocab, merges, **options)
    except Exception as exc:  # tokenizers raises a bare Exception naming the bad merge
        raise FormatError(f"tokenizer.ggml.merges: {exc}") from exc


def _first_ids(tokens: list[str]) -> dict[str, int]:
    index: dict[str, int] = {}
    for i, t in enumerate(tokens):
        index.setdefault(t, i)
    return index


def _fim_id(md: dict, name: str) -> int | None:
    old = _FIM_OLD_KEYS.get(name)
    return _first(get_int(md, f"tokenizer.ggml.{name}_token_id"),
                  get_int(md, f"tokenizer.ggml.{old}_token_id") if old else None)


def _eog_candidates(tokens: list[str], md: dict, eos_id: int | None) -> set[int]:
    """llama.cpp's end-of-generation ids before it takes any back (`_eog_demoted`)."""
    index = _first_ids(tokens)
    eog = {index[t] for t in _EOG_TEXTS if t in index}
    for name in ("fim_pad", "fim_rep", "fim_sep"):
        fim = _fim_id(md, name)
        eog.add(fim if fim is not None else min((index[t] for t in _FIM_TEXTS[name] if t in index), default=None))
    for token_id in (eos_id, get_int(md, "tokenizer.ggml.eot_token_id"), get_int(md, "tokenizer.ggml.eom_token_id")):
        eog.add(token_id)
    return {int(i) for i in eog if i is not None and 0 <= i < len(tokens)}


def _eog_ids(tokens: list[str], md: dict, eos_id: int | None) -> frozenset[int]:
    eog = _eog_candidates(tokens, md, eos_id)
    return frozenset(eog - set(_eog_demoted(tokens, eog)))


def _eog_demoted(tokens: list[str], eog: set[int]) -> dict[int, int]:
    """End-of-generation tokens llama.cpp takes back, with the type it gives them: gpt-oss (and
    solar-open) end a message with <|end|> but keep generating after it; Gemma 4's (and PLaMo's)
    </s> is a normal token."""
    texts = {tokens[i]: i for i in eog}
    out = {}
    harmony_ends = ({"<|return|>", "<|call|>"}, {"<|calls|>", "<|flush|>"})
    if "<|end|>" in texts and any(ends <= texts.keys() for ends in harmony_ends):
        out[texts["<|end|>"]] = USER_DEFINED
    if "</s>" in texts and ("<|tool_response>" in texts or "<|plamo:eos|>" in texts):
        out[texts["</s>"]] = NORMAL
    return out


def _llamacpp_types(tokens: list[str], types: list[int], md: dict, eos_id: int | None) -> list[int]:
    """The token types llama.cpp tokenizes with: the file's, corrected by text as llama_vocab::load
    does. End-of-generation and FIM tokens (those the file gives no id for) become control tokens,
    gpt-oss's harmony tags user-defined, and the end-of-generation tokens it takes back (see
    `_eog_demoted`) get their type."""
    types = list(types)
    index = _first_ids(tokens)
    control = [t for t in _EOG_TEXTS if t in index]
    for name, texts in _FIM_TEXTS.items():
        if _fim_id(md, name) is None:  # llama.cpp takes one of these by text; all of them here
            control += [t for t in texts if t in index]
    for t in control:
        types[index[t]] = CONTROL
    for t in ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"):
        if t in index:
            types[index[t]] = USER_DEFINED
    for token_id, kind in _eog_demoted(tokens, _eog_candidates(tokens, md, eos_id)).items():
        types[token_id] = kind
    return types


def _strip_sets(tokens: list[str], types: list[int], md: dict) -> tuple[set[int], set[int]]:
    """Special tokens whose neighbouring whitespace llama.cpp swallows: (lstrip, rstrip) ids. It
    sets these by model name: Phi-3's special tokens rstrip, some embedders' mask token lstrips."""
    index = _first_ids(tokens)
    name = (get_str(md, "general.name") or "").lower()
    arch = get_str(md, "general.architecture") or ""
    pre = get_str(md, "tokenizer.ggml.pre") or ""
    lstrip, rstrip = set(), set()
    if any(p in pre for p in ("jina-v2-de", "jina-v2-es", "jina-v2-code")) \
            or arch in ("nomic-bert-moe", "jina-bert-v3"):
        lstrip |= {index["<mask>"]} if "<mask>" in index else set()
    elif "phi-3" in name or "phi3" in name:
        rstrip = {i for i, k in enumerate(types) if k in (CONTROL, USER_DEFINED, UNKNOWN)}
        rstrip |= {index["</s>"]} if "</s>" in index else set()
        rstrip -= {index[t] for t in ("<unk>", "<s>", "<|endoftext|>") if t in index}
    elif "modern-bert" in name and "[MASK]" in index:
        lstrip.add(index["[MASK]"])
    return lstrip, rstrip


def _clean_spaces(text: bytearray) -> bytearray:
    """llama.cpp's detokenizer clean-up (clean_up_tokenization_spaces), pass for pass, in place as
    it does it: drop the space before ? ! . , and around a lone ', and before 's 'm 're 've."""
    t, n = text, len(text)
    total = 1 if n else 0
    for i in range(1, n):
        if t[i - 1] == 0x20 and t[i] in b"?!.,":
            total -= 1
        t[total] = t[i]
        total += 1
    n, total, i = total, 1 if total else 0, 1
    while i < n:
        x = t[i]
        if x == 0x27 and i + 1 < n and t[i - 1] == 0x20 and t[i + 1] == 0x20:  # " ' "
            total -= 1
            i += 1
            t[i] = 0
        t[total] = x
        total += 1
        i += 1
    n, total = total, 1 if total else 0
    for i in range(1, n):
        x = t[i]
        if t[i - 1] == 0x20 and x == 0x27 and i + 1 < n:
            x1 = t[i + 1]
            if x1 in b"sm" or (i + 2 < n and bytes(t[i + 1:i + 3]) in (b"re", b"ve")):
                total -= 1
        t[total] = x
        total += 1
    del t[total:]
    return t


class Tokenizer:
    """A GGUF file's tokenizer, as llama.cpp tokenizes and detokenizes: `encode`, `decode`,
    `detokenize`, pieces, and the ids a generate loop needs. `backend` is the `tokenizers.Tokenizer`
    holding the vocabulary (and, for the BPE models, doing the splitting and merging)."""

    def __init__(self, metadata: dict, tokens: list[str], token_types: list[int]):
        """From `from_gguf_metadata`'s checked tokens and types."""
        self.model = get_str(metadata, "tokenizer.ggml.model")
        self._tokens = tokens
        defaults = {"llama": (1, 2, 0), "t5": (None, 1, 2), "plamo2": (1, 2, 0)}.get(self.model, (None, None, None))
        self.bos_id: int | None = get_int(metadata, "tokenizer.ggml.bos_token_id", defaults[0])
        self.eos_id: int | None = get_int(metadata, "tokenizer.ggml.eos_token_id", defaults[1])
        self.unk_id: int | None = get_int(metadata, "tokenizer.ggml.unknown_token_id", defaults[2])
        self._types = _llamacpp_types(tokens, token_types, metadata, self.eos_id)
        self.pre = self._pre_tokenizer(metadata)
        by_pre = self.pre is not None and self.pre.add_bos
        self.add_bos = get_bool(metadata, "tokenizer.ggml.add_bos_token", self.model == "llama" or by_pre) \
            or (self.pre is not None and self.pre.force_bos)
        self.add_eos = get_bool(metadata, "tokenizer.ggml.add_eos_token", self.model == "t5")
        for flag, token_id, what in ((self.add_bos, self.bos_id, "bos"), (self.add_eos, self.eos_id, "eos")):
            if flag and (token_id is None or not 0 <= token_id < len(tokens)):
                raise FormatError(f"tokenizer.ggml.add_{what}_token is true, but {what}_token_id is {token_id}")
        self.eog_ids = _eog_ids(tokens, metadata, self.eos_id)
        self.chat_template: str | None = get_str(metadata, "tokenizer.chat_template")
        self._add_space_prefix = get_bool(metadata, "tokenizer.ggml.add_space_prefix", self.model == "llama")
        self._strip_first_space = self.model in ("llama", "t5") and self._add_space_prefix
        self._clean = self.pre is not None and self.pre.clean_spaces
        lstrip, rstrip = _strip_sets(tokens, self._types, metadata)
        # llama.cpp splits special tokens out of the text longest first.
        self._specials = sorted(((tokens[i], i, i in lstrip, i in rstrip) for i, k in enumerate(self._types)
                                 if k in (CONTROL, USER_DEFINED, UNKNOWN) and tokens[i]),
                                key=lambda s: -len(s[0].encode("utf-8")))
        self.backend, self._text_encoder = self._text_model(metadata)

    def _pre_tokenizer(self, md: dict) -> PreTokenizer | None:
        if self.model == "gemma4":
            return _GEMMA4_PRE
        if self.model != "gpt2":
            return None
        name = get_str(md, "tokenizer.ggml.pre")
        if name is None:  # llama.cpp does the same, and warns that quality suffers
            warnings.warn("GGUF has no tokenizer.ggml.pre; splitting text with llama.cpp's 'default'")
            name = "default"
        return pre_tokenizer(name)

    def _text_model(self, md: dict):
        """The `tokenizers.Tokenizer` holding the vocabulary, and the function that turns text
        between special tokens into ids: the backend's BPE, or our own search for the rest."""
        tokens = self._tokens
        vocab = {t: i for i, t in enumerate(tokens)}
        if self.model in ("gpt2", "gemma4"):
            backend = _bpe_backend(self.pre, vocab, md, self.model)
            return backend, _gemma4_encoder(backend, vocab) if self.pre.spm_style else _backend_encoder(backend)
        if self.model == "llama":
            backend = _spm_backend(tokens, self._types, vocab, md, self._add_space_prefix, self.unk_id)
            return backend, _backend_encoder(backend)
        scores = _scores(md, len(tokens)) if self.model != "rwkv" else []
        search = {"t5": _Unigram, "rwkv": _Rwkv, "plamo2": _Plamo2}[self.model](
            tokens, self._types, scores, self.unk_id, md)
        return _Backend(models.WordLevel(vocab, unk_token=None)), search.encode

    @classmethod
    def from_gguf_metadata(cls, metadata: dict) -> Tokenizer:
        """Build from GGUF metadata (key -> value; arrays as lists or numpy arrays). A key of the
        wrong type is a FormatError naming it."""
        kind = get_str(metadata, "tokenizer.ggml.model")
        if kind not in _MODELS:
            why = f" ({_MODELS_OUT_OF_SCOPE[kind]})" if kind in _MODELS_OUT_OF_SCOPE else ""
            raise UnsupportedError(f"tokenizer.ggml.model {kind!r} is not supported{why} "
                                   f"(supported: {', '.join(_MODELS)})")
        tokens = get_str_list(metadata, "tokenizer.ggml.tokens")
        if tokens is None:
            raise FormatError("GGUF metadata has no tokenizer.ggml.tokens")
        # as llama.cpp reads them: C strings (cut at a NUL), an empty one named by its id
        tokens = [t.split("\0", 1)[0] or f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
        types = get_int_list(metadata, "tokenizer.ggml.token_type", [NORMAL] * len(tokens))
        if len(types) < len(tokens):
            raise FormatError(f"tokenizer.ggml.token_type has {len(types)} entries for {len(tokens)} tokens")
        if len(set(tokens)) != len(tokens):
            raise FormatError("tokenizer.ggml.tokens spells two ids the same")
        return cls(metadata, tokens, types[:len(tokens)])

    @property
    def n_vocab(self) -> int:
        return len(self._tokens)

    def is_special(self, token_id: int) -> bool:
        """Control (and unknown) tokens: rendered as their text, dropped by `skip_special`."""
        return self._types[token_id] in (CONTROL, UNKNOWN)

    def encode(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """Token ids for `text`, as llama.cpp's llama_tokenize. With `parse_special`, control tokens
        written in the text become their ids (user-defined ones always do). With `add_special`,
        BOS/EOS are added when the file's add_bos_token/add_eos_token say so."""
        adds = add_special and self.model not in ("rwkv", "plamo2")  # llama.cpp adds none for these
        ids = [self.bos_id] if adds and self.add_bos else []
        for part in self._partition(text, parse_special):
            if isinstance(part, int):
                ids.append(part)
            else:
                ids += self._text_encoder(part)
        if adds and self.add_eos:
            ids.append(self.eos_id)
        return ids

    def _partition(self, text: str, parse_special: bool) -> list[str | int]:
        """llama.cpp's tokenizer_st_partition: each special token in turn, longest first, is cut out
        of the text still unsplit; lstrip/rstrip tokens take the whitespace next to them along."""
        parts: list[str | int] = [text] if text else []
        for piece, token_id, lstrip, rstrip in self._specials:
            if not parse_special and self._types[token_id] != USER_DEFINED:
                continue
            if not any(isinstance(p, str) and piece in p for p in parts):
                continue
            out: list[str | int] = []
            for part in parts:
                if isinstance(part, int) or piece not in part:
                    out.append(part)
                    continue
                start = 0
                while (at := part.find(piece, start)) >= 0:
                    left = part[start:at].rstrip(_C_SPACES) if lstrip else part[start:at]
                    out += [left, token_id] if left else [token_id]
                    start = at + len(piece)
                    while rstrip and start < len(part) and part[start] in _C_SPACES:
                        start += 1
                if start < len(part):
                    out.append(part[start:])
            parts = out
        return parts

    def _piece(self, token_id: int, special: bool) -> bytes:
        """llama.cpp's token_to_piece: the bytes one token stands for; control and unknown tokens
        only with `special`; unused ones none."""
        text, kind = self._tokens[token_id], self._types[token_id]
        if kind in (CONTROL, UNKNOWN) and not special:
            return b""
        if self.model == "rwkv":
            return _rwkv_unescape(text)
        if kind in (CONTROL, UNKNOWN, USER_DEFINED):
            return text.encode("utf-8")
        if kind == BYTE:
            byte = _BYTE_TOKEN.fullmatch(text)
            return bytes([int(byte.group(1), 16)]) if byte else text.encode("utf-8")
        if kind != NORMAL and self.model != "plamo2":  # unused and undefined tokens: nothing
            return b""
        if self.model in ("llama", "t5") or (self.pre is not None and self.pre.spm_style):
            return text.replace(SPIECE_SPACE, " ").encode("utf-8")
        if self.model == "gpt2" and all(c in _BYTE_OF_CHAR for c in text):
            return bytes(_BYTE_OF_CHAR[c] for c in text)
        return text.encode("utf-8")  # PLaMo-2's pieces, and a byte-level token outside the alphabet

    def token_to_piece(self, token_id: int) -> bytes:
        """The bytes one token stands for (a special token: its text). Several pieces may be needed
        to complete one character."""
        return self._piece(token_id, special=True)

    def decode(self, ids, skip_special: bool = False) -> str:
        """The text of `ids`: their pieces joined (as streamed by `IncrementalDecoder`); a
        SentencePiece text loses the space its first piece starts with."""
        stream = IncrementalDecoder(self, skip_special)
        return "".join([stream.feed(int(i)) for i in ids] + [stream.flush()])

    def detokenize(self, ids, remove_special: bool = False, unparse_special: bool = True) -> str:
        """llama.cpp's llama_detokenize: the pieces joined, the first one's leading space dropped
        where the model adds one, BOS/EOS dropped with `remove_special`, control tokens rendered
        with `unparse_special`, and the model's clean-up of spaces before punctuation."""
        ids = [int(i) for i in ids]
        remove_space = self._add_space_prefix
        if remove_special and self.add_bos and ids and ids[0] == self.bos_id:
            remove_space, ids = False, ids[1:]
        if remove_special and self.add_eos and ids and ids[-1] == self.eos_id:
            ids = ids[:-1]
        out = bytearray()
        for token_id in ids:
            piece = self._piece(token_id, unparse_special)
            out += piece[1:] if remove_space and piece[:1] == b" " and self.model != "rwkv" else piece
            remove_space = False
        return (_clean_spaces(out) if self._clean else out).decode("utf-8", "replace")


def _scores(md: dict, n: int) -> list[float]:
    scores = get_float_list(md, "tokenizer.ggml.scores", [0.0] * n)
    if len(scores) < n:
        raise FormatError(f"tokenizer.ggml.scores has {len(scores)} entries for {n} tokens")
    return scores


def _merges(md: dict) -> list[tuple[str, str]]:
    # as llama.cpp: split at the first space after the first character
    return [(m[:cut], m[cut + 1:]) for m in get_str_list(md, "tokenizer.ggml.merges", [])
            if (cut := m.find(" ", 1)) > 0]


def _bpe_backend(pre: PreTokenizer, vocab: dict[str, int], md: dict, kind: str):
    """Byte-level BPE (gpt2) or BPE on SentencePiece pieces (gemma4): the pre-tokenizer's regex
    splits, then llama.cpp's merges."""
    merges = _merges(md)
    if not merges and get_str(md, "tokenizer.ggml.pre") != "kimi-k2":  # llama.cpp reads Kimi-K2 without
        raise FormatError(f"tokenizer.ggml.merges is missing; a {kind} tokenizer needs it")
    splits = [pre_tokenizers.Split(Regex(r), "isolated") for r in pre.regexes]
    if pre.spm_style:
        backend = _Backend(_bpe(vocab, merges, byte_fallback=True, ignore_merges=pre.ignore_merges))
        backend.normalizer = normalizers.Replace(" ", SPIECE_SPACE)
        backend.pre_tokenizer = pre_tokenizers.Sequence(splits)
    else:
        backend = _Backend(_bpe(vocab, merges, ignore_merges=pre.ignore_merges))
        backend.pre_tokenizer = pre_tokenizers.Sequence(
            splits + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    return backend


def _spm_backend(tokens, types, vocab, md, add_space_prefix: bool, unk_id: int | None):
    """llama.cpp's SentencePiece BPE ("llama"): merges by score, bytes of unknown characters as
    <0xXX> tokens, and the dummy-prefix space before every run of text between special tokens."""
    merges = _merges(md) or _merges_from_scores(tokens, _scores(md, len(tokens)), types)
    unk = tokens[unk_id] if unk_id is not None and 0 <= unk_id < len(tokens) else None
    backend = _Backend(_bpe(vocab, merges, unk_token=unk, fuse_unk=True, byte_fallback=True))
    # A leading space is kept, not merged into the dummy prefix.
    backend.normalizer = normalizers.Sequence(
        ([normalizers.Prepend(SPIECE_SPACE)] if add_space_prefix else []) + [normalizers.Replace(" ", SPIECE_SPACE)])
    return backend


def _backend_encoder(backend):
    return lambda text: backend.encode(text, add_special_tokens=False).ids


def _gemma4_encoder(backend, vocab: dict[str, int]):
    """Gemma 4 (llama.cpp's fix for it): a run of newlines that is itself a token is taken whole;
    other runs and lines go through the merges."""
    def encode(text: str) -> list[int]:
        ids: list[int] = []
        for run in re.findall(r"\n+|[^\n]+", text):
            whole = vocab.get(run) if run[0] == "\n" else None
            ids += [whole] if whole is not None else backend.encode(run, add_special_tokens=False).ids
        return ids
    return encode


class _Unigram:
    """llama.cpp's UGM tokenizer (T5's SentencePiece unigram): its normalizer (the file's precompiled
    character map, whitespace escaped as '▁', the dummy prefix) and its Viterbi search, in which a
    character no piece covers becomes the unknown token (runs of them one)."""

    def __init__(self, tokens, types, scores, unk_id, md):
        self.unk_id = unk_id
        self.pieces = {t: i for i, t in enumerate(tokens) if types[i] in (NORMAL, USER_DEFINED, UNUSED)}
        self.max_len = max(map(len, self.pieces), default=1)
        # double sums of float32 scores; user-defined pieces score 0 (llama.cpp), the unknown token
        # (the lowest normal score - 10) in float32, as llama.cpp computes it
        self.score = [0.0 if k == USER_DEFINED else s for k, s in zip(types, scores)]
        normal = [np.float32(s) for s, k in zip(scores, types) if k == NORMAL]
        self.unk_score = float(min(normal, default=np.float32(np.finfo(np.float32).max)) - np.float32(10.0))
        self.user_defined: dict[int, list[bytes]] = {}
        for t, k in zip(tokens, types):
            if k == USER_DEFINED:
                b = t.encode("utf-8")
                self.user_defined.setdefault(b[0], []).append(b)
        self.charsmap = _Charsmap(bytes(b & 0xFF for b in get_int_list(md, "tokenizer.ggml.precompiled_charsmap", [])))
        self.add_space_prefix = get_bool(md, "tokenizer.ggml.add_space_prefix", False)
        self.merge_spaces = get_bool(md, "tokenizer.ggml.remove_extra_whitespaces", False)

    def normalize(self, text: str) -> str:
        data, out = text.encode("utf-8"), bytearray()
        space = SPIECE_SPACE.encode("utf-8")
        prepended = in_word = False
        pos = 0
        while pos < len(data):
            piece, used = self._normalize_prefix(data, pos)
            for c in piece:
                if c != 0x20:
                    if not in_word:
                        in_word = True
                        if (self.add_space_prefix and not prepended) or self.merge_spaces:
                            out += space
                            prepended = True
                    out.append(c)
                else:
                    in_word = False
                    if not self.merge_spaces:
                        out += space
            pos += used
        return out.decode("utf-8", "replace")

    def _normalize_prefix(self, data: bytes, pos: int) -> tuple[bytes, int]:
        # a user-defined token's bytes pass unchanged; llama.cpp takes the longest run of bytes its
        # trie of them walks, whether or not a whole token ends there
        walk = max((_common_prefix(data, pos, t) for t in self.user_defined.get(data[pos], ())), default=0)
        if walk:
            return data[pos:pos + walk], walk
        mapped = self.charsmap.longest_prefix(data, pos)
        if mapped is not None:
            return mapped
        n = _utf8_len(data[pos])
        try:
            return data[pos:pos + n].decode("utf-8").encode("utf-8"), n
        except UnicodeDecodeError:
            return "\ufffd".encode("utf-8"), 1

    def encode(self, text: str) -> list[int]:
        text = self.normalize(text)
        n, lowest = len(text), -sys.float_info.max
        best = [(self.unk_id, 0, lowest)] * (n + 1)  # per end position: token, start, score
        best[0] = (self.unk_id, 0, 0.0)
        for pos in range(n):
            here, single = best[pos][2], False
            for end in range(pos + 1, min(n, pos + self.max_len) + 1):
                token_id = self.pieces.get(text[pos:end])
                if token_id is None:
                    continue
                single |= end == pos + 1
                if here + self.score[token_id] > best[end][2]:
                    best[end] = (token_id, pos, here + self.score[token_id])
            if not single and here + self.unk_score > best[pos + 1][2]:
                best[pos + 1] = (self.unk_id, pos, here + self.unk_score)
        ids, end, prev_unknown = [], n, False
        while end > 0:
            token_id, end, _ = best[end]
            if token_id is None:
                raise FormatError(f"no piece covers {text[end]!r} and the vocabulary has no unknown token")
            if not (prev_unknown and token_id == self.unk_id):
                ids.append(token_id)
            prev_unknown = token_id == self.unk_id
        return ids[::-1]


def _common_prefix(data: bytes, pos: int, token: bytes) -> int:
    n = 0
    while n < len(token) and pos + n < len(data) and data[pos + n] == token[n]:
        n += 1
    return n


def _utf8_len(lead: int) -> int:
    return (1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4)[lead >> 4]  # llama.cpp's unicode_len_utf8


class _Charsmap:
    """SentencePiece's precompiled character map (llama.cpp's reading of it): a XOR-compressed
    double array of byte strings to replace, then their NUL-terminated replacements."""

    def __init__(self, blob: bytes):
        self.array: np.ndarray | None = None
        if not blob:
            return
        size = int.from_bytes(blob[:4], "little")
        if size + 4 >= len(blob):
            raise FormatError("tokenizer.ggml.precompiled_charsmap: its index runs past its end")
        self.array = np.frombuffer(blob[4:4 + size - size % 4], dtype="<u4").astype(np.int64)
        self.replacements = blob[4 + size:]

    def _node(self, i: int) -> int:
        if not 0 <= i < len(self.array):
            raise FormatError("tokenizer.ggml.precompiled_charsmap: an index points outside it")
        return int(self.array[i])

    def _base(self, i: int) -> int:
        node = self._node(i)
        return (node >> 10) << ((node & (1 << 9)) >> 6)

    def longest_prefix(self, data: bytes, pos: int) -> tuple[bytes, int] | None:
        """The replacement of the longest mapped byte string at `pos`, and its length; None if none."""
        if self.array is None:
            return None
        longest = value = 0
        node = self._base(0)
        for p in range(pos, len(data)):
            c = data[p]
            if c == 0:
                break
            node ^= c
            if self._node(node) & ((1 << 31) | 0xFF) != c:
                break
            leaf = (self._node(node) >> 8) & 1
            node ^= self._base(node)
            if leaf:
                longest, value = p - pos + 1, self._node(node) & ((1 << 31) - 1)
        if not longest:
            return None
        end = self.replacements.find(b"\0", value)
        if value >= len(self.replacements) or end < 0:
            raise FormatError("tokenizer.ggml.precompiled_charsmap: a replacement runs past its end")
        return self.replacements[value:end], longest


def _rwkv_unescape(text: str) -> bytes:
    """An RWKV token's bytes: its text with \\t \\n \\r and \\xHH escapes read (llama.cpp's
    llama_unescape_rwkv_token)."""
    out, escaping, hex_left, acc = bytearray(), False, 0, 0
    for c in text.encode("utf-8"):
        if hex_left:
            acc = (acc << 4) + (c - 87 if c >= 0x61 else c - 0x30)
            hex_left -= 1
            if not hex_left:
                out.append(acc & 0xFF)
                acc = 0
        elif escaping:
            escaping = False
            if c == 0x78:  # x
                hex_left = 2
            else:
                out.append({0x74: 9, 0x6E: 10, 0x72: 13}.get(c, c))
        elif c == 0x5C:  # backslash
            escaping = True
        else:
            out.append(c)
    return bytes(out)


class _Rwkv:
    """llama.cpp's RWKV tokenizer: at each byte, the longest token whose bytes follow."""

    def __init__(self, tokens, types, scores, unk_id, md):
        self.ids = {_rwkv_unescape(t): i for i, t in enumerate(tokens)}  # a later spelling wins, as in its trie
        self.max_len = max(map(len, self.ids), default=1)
        self.unk_id = unk_id

    def encode(self, text: str) -> list[int]:
        data, ids, pos = text.encode("utf-8"), [], 0
        while pos < len(data):
            end = next((e for e in range(min(len(data), pos + self.max_len), pos, -1) if data[pos:e] in self.ids), None)
            if end is None:
                if self.unk_id is None:
                    raise FormatError(f"RWKV vocabulary has no token for byte 0x{data[pos]:02X} and no unknown token")
                ids.append(self.unk_id)
                pos += 1
            else:
                ids.append(self.ids[data[pos:end]])
                pos = end
        return ids


def _round_half_away(x: float) -> int:
    """C's round(): halves away from zero (Python's round() takes them to even)."""
    return int(np.copysign(np.floor(abs(x) + 0.5), x))


class _Plamo2:
    """llama.cpp's PLaMo-2 tokenizer: a Viterbi search from the end over the pieces (scores times
    1e4, rounded), longest piece first on ties; a character no piece covers goes as its UTF-8 bytes."""

    INVALID, UNKNOWN_SCORE = -20000000, -10000000

    def __init__(self, tokens, types, scores, unk_id, md):
        self.pieces: dict[str, tuple[int, int]] = {}
        self.bytes = [None] * 256
        for i, (t, k, s) in enumerate(zip(tokens, types, scores)):
            byte = _BYTE_TOKEN.fullmatch(t) if k == BYTE else None
            if k == BYTE:
                if byte:
                    self.bytes[int(byte.group(1), 16)] = i
                continue
            self.pieces[t] = (i, _round_half_away(s * 1e4) if np.isfinite(s) else self.INVALID)
        missing = [b for b in range(256) if self.bytes[b] is None]
        if missing:
            raise FormatError(f"PLaMo-2 vocabulary has no byte token <0x{missing[0]:02X}>")
        self.max_len = max(map(len, self.pieces), default=1)

    def encode(self, text: str) -> list[int]:
        text = text[1:] if text[:1] == "\ufeff" else text  # a byte order mark is dropped
        n = len(text)
        cost, path = [1 << 60] * n + [0], [(1, -1)] * (n + 1)  # path: length, token (-1: bytes)
        for i in range(n - 1, -1, -1):
            for length in range(min(self.max_len, n - i), 0, -1):
                token_id, score = self.pieces.get(text[i:i + length], (None, self.INVALID))
                if score > self.INVALID and cost[i + length] - score < cost[i]:
                    cost[i], path[i] = cost[i + length] - score, (length, token_id)
            if cost[i + 1] - self.UNKNOWN_SCORE < cost[i]:
                cost[i], path[i] = cost[i + 1] - self.UNKNOWN_SCORE, (1, -1)
        ids, pos = [], 0
        while pos < n:
            length, token_id = path[pos]
            ids += [token_id] if token_id >= 0 else [self.bytes[b] for b in text[pos].encode("utf-8")]
            pos += length
        return ids


class IncrementalDecoder:
    """Streaming detokenizer: `feed(id)` returns the text completed by that token, holding back the
    bytes of a character split across tokens (an emoji is often several byte tokens). The pieces
    joined, plus `flush()`, equal `tokenizer.decode(ids, skip_special)`."""

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = False):
        self._tokenizer, self._skip_special = tokenizer, skip_special
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._strip_pending = tokenizer._strip_first_space  # SPM: the dummy-prefix space of the text

    def feed(self, token_id: int) -> str:
        return self._emit(self._utf8.decode(self._tokenizer._piece(token_id, special=not self._skip_special)))

    def flush(self) -> str:
        """Whatever is held back at the end of the stream (an incomplete character becomes U+FFFD)."""
        return self._emit(self._utf8.decode(b"", final=True))

    def _emit(self, text: str) -> str:
        if self._strip_pending and text:
            self._strip_pending = False
            text = text[1:] if text[0] == " " else text
        return text

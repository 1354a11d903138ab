"""Our tokenizer against llama.cpp's on real vocabularies.

llama.cpp's source (found as tests/llamacpp_oracle.py finds it) holds vocabulary-only GGUFs,
models/ggml-vocab-*.gguf, most with .inp/.out files: the texts and ids of llama.cpp's own tokenizer
test (test-tokenizer-0). Every case must come out equal. Then llama.cpp itself (llama-cpp-python, in a
subprocess with its own interpreter) tokenizes generated text -- mixed scripts, emoji, combining marks,
whitespace runs, the vocabulary's special tokens and look-alikes of them -- and detokenizes; ids,
detokenized text and every token's piece must be equal. Small vocabularies built here cover what
models/ lacks: every pre-tokenizer name llama.cpp knows (slow), RWKV and PLaMo-2. Without llama.cpp's
source or llama-cpp-python the tests skip, saying which is missing.
"""

from __future__ import annotations

import json
import random
import re
import subprocess
import warnings
import zlib
from pathlib import Path

import gguf
import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

import llamacpp_oracle as oracle
from rapidmoe_gguf import open_gguf
from rapidmoe_gguf.errors import UnsupportedError
from rapidmoe_gguf.tokenizer import (CONTROL, LLAMACPP_PRE_TOKENIZERS, PRE_ALIASES, PRE_OUT_OF_SCOPE, PRE_TOKENIZERS,
                                     USER_DEFINED, Tokenizer, _clean_spaces, _llamacpp_regex, pre_tokenizer,
                                     add_tokenizer_to_writer, tokenizer_kv_from_hf)

SRC = Path(oracle.src()) if oracle.src() else None
MODELS = SRC / "models" if SRC else None
VOCABS = sorted(p.name[len("ggml-vocab-"):-len(".gguf")] for p in MODELS.glob("ggml-vocab-*.gguf")) if MODELS else []
# Vocabularies in models/ that are not ours to read, and why (the test checks they are refused, saying so).
OUT_OF_SCOPE = {"bert-bge": "embedding"}
SEP = "\n__ggml_vocab_test__\n"  # test-tokenizer-0's case separator

needs_src = pytest.mark.skipif(SRC is None, reason="llama.cpp's source is not at hand: run "
                               "tools/make_llamacpp_files.py --src-only, or set LLAMA_CPP_SRC")
needs_llamacpp = oracle.needs

# llama.cpp's tokenizer over JSON jobs on stdin: per text the ids for (add_special, parse_special) =
# 00, 01, 11 and their llama_detokenize text for (remove_special, unparse_special) = FF, FT, TF, TT
# (hex); the same detokenizations of given id lists; every token's piece with and without special.
_ORACLE = r"""
import ctypes, json, sys
import llama_cpp as L

_quiet = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)(lambda *a: None)
L.llama_log_set(_quiet, None)

def grow(call, size):
    n = call(size)
    return call(-n) if n < 0 else n

def run(job):
    params = L.llama_model_default_params()
    params.vocab_only = True
    model = L.llama_model_load_from_file(job["path"].encode(), params)
    if not model:
        return {"error": "llama.cpp could not load " + job["path"]}
    vocab = L.llama_model_get_vocab(model)
    def tokenize(b, add, parse):
        out = {}
        def call(size):
            out["buf"] = (L.llama_token * size)()
            return L.llama_tokenize(vocab, b, len(b), out["buf"], size, add, parse)
        n = grow(call, len(b) + 16)
        return list(out["buf"][:n])
    def detokenize(ids):
        arr, texts = (L.llama_token * max(1, len(ids)))(*ids), []
        for remove, unparse in ((False, False), (False, True), (True, False), (True, True)):
            out = {}
            def call(size):
                out["buf"] = ctypes.create_string_buffer(size)
                return L.llama_detokenize(vocab, arr, len(ids), out["buf"], size, remove, unparse)
            n = grow(call, 64 + 32 * len(ids))
            texts.append(out["buf"].raw[:n].hex())
        return texts
    def piece(i, special):
        out = {}
        def call(size):
            out["buf"] = ctypes.create_string_buffer(size)
            return L.llama_token_to_piece(vocab, i, out["buf"], size, 0, special)
        n = grow(call, 256)
        return out["buf"].raw[:n].hex()
    res = {"cases": [], "detok": [detokenize(ids) for ids in job.get("id_seqs", [])]}
    for text in job["texts"]:
        case = {}
        for add, parse in ((0, 0), (0, 1), (1, 1)):
            ids = tokenize(text.encode("utf-8"), bool(add), bool(parse))
            case[f"{add}{parse}"] = ids
            case[f"{add}{parse}:detok"] = detokenize(ids)
        res["cases"].append(case)
    if job.get("pieces"):
        res["pieces"] = [[piece(i, True), piece(i, False)] for i in range(L.llama_vocab_n_tokens(vocab))]
    L.llama_model_free(model)
    return res

print(json.dumps([run(job) for job in json.load(sys.stdin)]))
"""


def llamacpp(jobs: list[dict]) -> list[dict]:
    r = subprocess.run([oracle.python(), "-c", _ORACLE], input=json.dumps(jobs), capture_output=True, text=True)
    assert r.returncode == 0, f"llama.cpp's tokenizer failed (exit {r.returncode}):\n{r.stderr[-3000:]}"
    results = json.loads(r.stdout)
    for job, res in zip(jobs, results):
        assert "error" not in res, res.get("error")
    return results


# --------------------------------------------------------------------------------------------
# Generated text
# --------------------------------------------------------------------------------------------

_POOLS = [
    ["Hello world", "naïve café", "ÀÉÎÕÜ ß ĳ ǅ", "Ελληνικά κείμενα", "Русский текст", "עברית", "العربية ٣٤٥",
     "हिन्दी भाषा", "ภาษาไทย", "中文分词测试", "日本語のテキスト", "カタカナ", "한국어 문장", "ქართული", "Ꭰ Ꮳ",
     "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "ﬁ ﬂ ﬀ", "camelCaseWord", "HTTPServer", "iPhone", "ÉCOLE Ñandú", "McDonald's",
     "XMLHttpRequest", "ΣΊΣΥΦΟΣ", "〆々⺀", "𠀀𪜀", "\x1c\x1b[0m\x7f", "\U000e0080\u0378", "ſ'S K'LL",
     "Ｆｕｌｌｗｉｄｔｈ１２３", "x² y³ ½ ⅓ Ⅻ", "µ Ω K Å", "ǂǃ ʼn"],
    ["e\u0301", "a\u0308\u0304", "n\u0303", "c\u0327", "\u0301", "o\u0302\u0323", "Z\u0351\u0362\u035b",
     "\u0915\u094d\u0937", "\u05e9\u05c1", "\u0627\u064b"],  # combining marks
    ["🙂", "🚀", "👍🏽", "👨‍👩‍👧‍👦", "🇫🇷", "❤️", "1️⃣", "🤖🤖", "☕", "𓀀"],
    [" ", "  ", "   ", "\t", "\t\t", "\n", "\n\n", "\n\n\n", "\r\n", " \n ", "\u00a0", "\u3000", "\u2009",
     "\u200b", "\v", "\f", " \t \n", "    ", "\u2028", "\u0085"],  # whitespace runs
    ["...", "!?", "—", "–", "«»", "“quoted”", "‘x’", "(a)", "[b]", "{c}", "<d>", "a/b", "a|b", "a\\b", "@user",
     "#tag", "$19.99", "100%", "3.14159", "1,000,000", "2024-06-01", "x+y=z", "a^b", "~tilde", "`code`",
     "it's", "IT'S", "we'll", "they're", "I've", "you'd", "don't", "'quoted'", " ' ", " 's", " ,", " .", "''"],
    ["0", "7", "12", "123", "1234", "12345", "1234567", "٣٤٥٦", "１２３４", "00042", "3.0e-10"],
    ["def f(x):\n    return x*2\n", "if (a && b) { c(); }", "for i in range(10):\n\tpass", "<html><body>",
     "SELECT * FROM t;", "x = [1, 2, 3]", "// comment", "a->b", "a::b", "i++", "#include <stdio.h>"],
    ["<|im_", "<|endoftext", "</s", "<s >", "[INST]", "<|im_end|", "<|", "|>", "<unk", "<pad>x", "<<s>>",
     "<|eot_id|>", "<|begin_of_text|>", "<｜end▁of▁sentence｜>", "<start_of_turn>", "<0x41>", "▁", "▁▁x", "Ġ",
     "<mask>", "[CLS]", "<bos>", "<eos>", "<|tool>", "<|\"|>", "<think>", "</think>"],  # special-token look-alikes
]


def generated_texts(seed: int, n: int, specials: list[str] = ()) -> list[str]:
    """`n` deterministic texts mixing the pools above with the vocabulary's own special tokens and
    near misses of them (a character dropped, a space inside)."""
    rng = random.Random(seed)
    near = [s[:-1] for s in specials] + [s[:1] + " " + s[1:] for s in specials]
    pools = _POOLS + [list(specials) + near] * bool(specials)
    out = ["", " ", "\n", "  leading and trailing  ", "A", "e\u0301", "\u0301x", "\ufeffBOM"]
    while len(out) < n:
        parts = []
        for _ in range(rng.randint(1, 12)):
            parts.append(rng.choice(rng.choice(pools)))
            if rng.random() < 0.5:
                parts.append(rng.choice([" ", "", "", "\n", "  "]))
        out.append("".join(parts))
    return out


def random_id_seqs(seed: int, n_vocab: int, specials: list[int], n: int = 40) -> list[list[int]]:
    """Id lists no text gives: BOS-like specials anywhere, lone pieces of characters, any token."""
    rng = random.Random(seed)
    pool = list(range(min(n_vocab, 600))) + specials
    return [[rng.choice(pool) if rng.random() < 0.6 else rng.randrange(n_vocab) for _ in range(rng.randint(1, 12))]
            for _ in range(n)]


# --------------------------------------------------------------------------------------------
# Comparing with llama.cpp
# --------------------------------------------------------------------------------------------

def _byte_level_outsider(tok: Tokenizer, token_id: int) -> bool:
    """A gpt2 token spelled outside the byte-level alphabet (command-r has 1400): llama.cpp writes
    "[UNK_BYTE_0x...]" for it; we write its UTF-8, the text the model meant."""
    from rapidmoe_gguf.tokenizer import _BYTE_OF_CHAR, NORMAL
    return (tok.model == "gpt2" and tok._types[token_id] == NORMAL
            and not all(c in _BYTE_OF_CHAR for c in tok._tokens[token_id]))


def _text(hex_bytes: str) -> str:
    """llama.cpp's bytes as our str-returning API gives them: invalid UTF-8 as U+FFFD."""
    return bytes.fromhex(hex_bytes).decode("utf-8", "replace")


def _detokenized(tok: Tokenizer, ids: list[int]) -> list[str]:
    return [tok.detokenize(ids, rs, us) for rs in (False, True) for us in (False, True)]


def assert_like_llamacpp(tok: Tokenizer, texts: list[str], res: dict, id_seqs: list[list[int]] = ()) -> None:
    """Ids for every text and flag combination, their detokenization, and (when asked for) every
    token's piece and `decode` of the ids, all equal to llama.cpp's."""
    bad = []
    for text, case in zip(texts, res["cases"]):
        for key in ("00", "01", "11"):
            ids = tok.encode(text, add_special=key[0] == "1", parse_special=key[1] == "1")
            if ids != case[key]:
                bad.append(f"encode{key} {text!r}: llama.cpp {case[key][:20]}, ours {ids[:20]}")
            if _detokenized(tok, case[key]) != [_text(t) for t in case[key + ":detok"]]:
                bad.append(f"detokenize {case[key][:20]} of {text!r}")
    for ids, theirs in zip(id_seqs, res["detok"]):
        if any(_byte_level_outsider(tok, i) for i in ids):
            continue
        if _detokenized(tok, ids) != [_text(t) for t in theirs]:
            bad.append(f"detokenize {ids}: llama.cpp {[_text(t) for t in theirs]}, ours {_detokenized(tok, ids)}")
    if "pieces" in res:
        assert len(res["pieces"]) == tok.n_vocab
        for i, (with_special, without) in enumerate(res["pieces"]):
            ours = [tok._piece(i, True).hex(), tok._piece(i, False).hex()]
            if ours != [with_special, without] and not _byte_level_outsider(tok, i):
                bad.append(f"piece {i} {tok._tokens[i]!r}: llama.cpp {with_special}, ours {ours[0]}")
        for text, case in zip(texts, res["cases"]):
            for skip in (False, True):  # decode: the pieces joined (a SentencePiece text's first space dropped)
                joined = _text("".join(res["pieces"][i][skip] for i in case["11"]))
                joined = joined[1:] if tok._strip_first_space and joined[:1] == " " else joined
                if tok.decode(case["11"], skip_special=skip) != joined:
                    bad.append(f"decode(skip_special={skip}) of {text!r}")
    assert not bad, f"{len(bad)} differences from llama.cpp:\n" + "\n".join(bad[:15])


# --------------------------------------------------------------------------------------------
# models/ggml-vocab-*.gguf
# --------------------------------------------------------------------------------------------

@pytest.fixture(scope="module", params=VOCABS or [pytest.param(None, marks=needs_src)])
def vocab(request):
    """(name, path, metadata, Tokenizer or None when out of scope), one vocabulary at a time."""
    name = request.param
    path = MODELS / f"ggml-vocab-{name}.gguf"
    with open_gguf(path) as g:
        md = dict(g.metadata)
    if name in OUT_OF_SCOPE:
        return name, path, md, None
    with pytest.warns(UserWarning, match="no tokenizer.ggml.pre") if _lacks_pre(md) else _nothing():
        return name, path, md, Tokenizer.from_gguf_metadata(md)


def _lacks_pre(md: dict) -> bool:
    return md.get("tokenizer.ggml.model") == "gpt2" and "tokenizer.ggml.pre" not in md


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def read_cases(path: Path) -> list[tuple[str, list[int]]]:
    """test-tokenizer-0's cases: texts split at its separator, one line of ids for each."""
    texts = path.with_suffix(".gguf.inp").read_text(encoding="utf-8").split(SEP)
    lines = path.with_suffix(".gguf.out").read_text(encoding="utf-8").split("\n")
    assert len(lines) >= len(texts)
    return [(text, [int(t) for t in line.split()]) for text, line in zip(texts, lines)]


@needs_src
def test_vocab_file_cases_equal(vocab):
    """Every .inp/.out case of the file: llama.cpp's test tokenizes without BOS and without parsing
    special tokens."""
    name, path, md, tok = vocab
    if tok is None:
        with pytest.raises(UnsupportedError, match=OUT_OF_SCOPE[name]):
            Tokenizer.from_gguf_metadata(md)
        return
    if not path.with_suffix(".gguf.inp").is_file():
        pytest.skip(f"{path.name} has no .inp/.out cases (test_vocab_file_matches_llamacpp covers it)")
    cases = read_cases(path)
    bad = [(text, want, got) for text, want in cases
           if (got := tok.encode(text, add_special=False, parse_special=False)) != want]
    assert not bad, f"{name}: {len(cases) - len(bad)}/{len(cases)} cases equal; first differences:\n" + \
        "\n".join(f"{t!r}: want {w[:16]} got {g[:16]}" for t, w, g in bad[:8])


@needs_llamacpp
def test_vocab_file_matches_llamacpp(vocab):
    """Generated text through llama.cpp and through us: ids, detokenization, every piece."""
    name, path, md, tok = vocab
    if tok is None:
        pytest.skip(f"{name} is out of scope ({OUT_OF_SCOPE[name]}); test_vocab_file_cases_equal checks it is refused")
    specials = [t for t, _, _, _ in tok._specials][:40]
    texts = generated_texts(zlib.crc32(name.encode()), 60, specials)
    special_ids = [i for _, i, _, _ in tok._specials][:20] + [tok.bos_id or 0, tok.eos_id or 0]
    id_seqs = random_id_seqs(zlib.crc32(name.encode()), tok.n_vocab, special_ids)
    res = llamacpp([{"path": str(path), "texts": texts, "id_seqs": id_seqs, "pieces": True}])[0]
    assert_like_llamacpp(tok, texts, res, id_seqs)


# --------------------------------------------------------------------------------------------
# llama.cpp's table of names and models
# --------------------------------------------------------------------------------------------

def _llamacpp_vocab_source() -> str:
    return (SRC / "src" / "llama-vocab.cpp").read_text(encoding="utf-8")


def _llamacpp_pre_names(src: str) -> dict[str, str]:
    """tokenizer_pre name -> llama.cpp's pre type, from llama_vocab::impl::load."""
    chain = src[src.index('tokenizer_pre == "default"'):src.index("unknown pre-tokenizer type")]
    names = {}
    for m in re.finditer(r"if \(((?:\s*(?:\|\|)?\s*tokenizer_pre == \"[^\"]+\"\s*)+)\)\s*\{\s*"
                         r"pre_type = LLAMA_VOCAB_PRE_TYPE_(\w+);", chain):
        names |= dict.fromkeys(re.findall(r'"([^"]+)"', m.group(1)), m.group(2))
    return {"default": "DEFAULT", **names}


def _c_string(literal: str) -> str:
    """A C string literal's text (its escapes read, its UTF-8 bytes decoded)."""
    return literal.encode("utf-8").decode("unicode_escape").encode("latin-1").decode("utf-8")


def _llamacpp_regexes(src: str) -> dict[str, list[str]]:
    """pre type -> its regex_exprs, from llm_tokenizer_bpe's constructor."""
    body = src[src.index("struct llm_tokenizer_bpe : llm_tokenizer {"):src.index("struct llm_tokenizer_bpe_session {")]
    out = {}
    for m in re.finditer(r"((?:\s*case LLAMA_VOCAB_PRE_TYPE_\w+:)+|\s*default:)(.*?)break;", body, re.S):
        block = re.sub(r"//[^\n]*", "", m.group(2))
        exprs = re.search(r"regex_exprs = \{(.*?)\};", block, re.S).group(1)
        regexes = [_c_string(s) for s in re.findall(r'"((?:[^"\\]|\\.)*)"', exprs)]
        for pre_type in re.findall(r"LLAMA_VOCAB_PRE_TYPE_(\w+)", m.group(1)) or ["DEFAULT"]:
            out[pre_type] = regexes
    return out


# Regexes we run differently from how llama.cpp spells them, because llama.cpp runs them differently
# from how they read: as code (unicode.cpp), or with non-ASCII spaces hidden from std::regex.
_REWRITTEN = {
    ("KIMI_K2", 0): "llama.cpp runs Kimi-K2's split as code",
    ("AFMOE", 0): "llama.cpp runs AFMoE's digit grouping as code",
    ("TINY_AYA", 0): "llama.cpp runs Tiny Aya's digit grouping as AFMoE's code",
    ("DEEPSEEK_LLM", 2): "U+3000 is a space llama.cpp's std::regex never sees",
    ("DEEPSEEK_LLM", 4): "U+0800-U+4E00 holds spaces llama.cpp's std::regex never sees",
    ("DEEPSEEK_CODER", 3): "U+0800-U+4E00 holds spaces llama.cpp's std::regex never sees",
}


def _same_regex(ours: str, theirs: str) -> bool:
    spell = lambda r: r.replace("\r", r"\r").replace("\n", r"\n")  # noqa: E731  raw CR/LF or escapes: the same
    return spell(ours) == spell(_llamacpp_regex(theirs))


@needs_src
def test_every_llamacpp_pre_name_is_known_with_its_regexes():
    """Each tokenizer.ggml.pre name llama.cpp accepts is read here (or listed out of scope with a
    reason), with llama.cpp's regexes as it runs them."""
    src = _llamacpp_vocab_source()
    names, regexes = _llamacpp_pre_names(src), _llamacpp_regexes(src)
    assert len(names) > 80
    missing = sorted(n for n in names if n not in PRE_OUT_OF_SCOPE and n not in
                     {*PRE_TOKENIZERS, *PRE_ALIASES, *LLAMACPP_PRE_TOKENIZERS})
    assert not missing, f"llama.cpp knows pre-tokenizers we do not: {missing}"
    differ = []
    for name, pre_type in names.items():
        if name in PRE_OUT_OF_SCOPE:
            continue
        ours, theirs = pre_tokenizer(name).regexes, regexes[pre_type]
        assert len(ours) == len(theirs), name
        differ += [(name, pre_type, k) for k, (o, t) in enumerate(zip(ours, theirs))
                   if not _same_regex(o, t) and (pre_type, k) not in _REWRITTEN]
    assert not differ, f"regexes that differ from llama.cpp's: {differ}"


@needs_src
def test_every_llamacpp_tokenizer_model_is_known():
    from rapidmoe_gguf.tokenizer import _MODELS, _MODELS_OUT_OF_SCOPE
    load = _llamacpp_vocab_source()
    load = load[load.index("void llama_vocab::impl::load("):load.index("unknown tokenizer: '%s'")]
    found = set(re.findall(r'tokenizer_model == "([^"]+)"', load))
    assert {"gpt2", "llama", "t5", "rwkv", "gemma4"} <= found
    assert found <= {*_MODELS, *_MODELS_OUT_OF_SCOPE}, found - {*_MODELS, *_MODELS_OUT_OF_SCOPE}


# --------------------------------------------------------------------------------------------
# Vocabularies built here: every pre-tokenizer name, RWKV, PLaMo-2, the unigram's flags
# --------------------------------------------------------------------------------------------

def trained_bpe(corpus: list[str], size: int = 6000) -> tuple[list[str], list[str]]:
    """A byte-level BPE trained on the texts with no pre-split: its merges cross every boundary a
    pre-tokenizer may draw, so the ids show where the text was cut."""
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=size, show_progress=False,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    model = json.loads(tok.to_str())["model"]
    return sorted(model["vocab"], key=model["vocab"].get), [
        m if isinstance(m, str) else " ".join(m) for m in model["merges"]]


def write_vocab(path: Path, kv: dict) -> Path:
    """A vocabulary-only GGUF llama.cpp loads: a minimal gpt2 header (llama.cpp picks the tokenizer by
    tokenizer.ggml.model, whatever the architecture), then the tokenizer keys."""
    w = gguf.GGUFWriter(str(path), "gpt2")
    for key in ("block_count", "context_length", "embedding_length", "feed_forward_length", "attention.head_count"):
        w.add_uint32(f"gpt2.{key}", 8)
    w.add_float32("gpt2.attention.layer_norm_epsilon", 1e-5)
    add_tokenizer_to_writer(w, kv)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _metadata(path: Path) -> dict:
    with open_gguf(path) as g:
        return dict(g.metadata)


@pytest.fixture(scope="module")
def corpus_and_bpe():
    corpus = generated_texts(1234, 150)
    return corpus, trained_bpe(corpus)


@pytest.mark.slow
@needs_llamacpp
def test_every_pre_name_splits_like_llamacpp(corpus_and_bpe, tmp_path):
    """Every pre-tokenizer name llama.cpp knows, on a vocabulary whose merges show the splits (the
    SentencePiece-style names on Gemma 4's vocabulary, read as "gpt2" with that name)."""
    corpus, (tokens, merges) = corpus_and_bpe
    names = sorted({*PRE_TOKENIZERS, *PRE_ALIASES, *LLAMACPP_PRE_TOKENIZERS})
    gemma = MODELS / "ggml-vocab-gemma-4.gguf"
    gemma_md = _metadata(gemma) if gemma.is_file() else None
    jobs, built = [], []
    for name in names:
        if pre_tokenizer(name).spm_style:
            if gemma_md is None:
                continue
            md = gemma_md | {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": name}
            kv = {k: v for k, v in md.items() if k.startswith("tokenizer.") and k != "tokenizer.chat_template"}
            kv = kv | {"tokenizer.ggml.tokens": list(md["tokenizer.ggml.tokens"]),
                       "tokenizer.ggml.token_type": [int(t) for t in md["tokenizer.ggml.token_type"]],
                       "tokenizer.ggml.scores": [float(s) for s in md["tokenizer.ggml.scores"]],
                       "tokenizer.ggml.merges": list(md["tokenizer.ggml.merges"])}
        else:
            kv = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": name, "tokenizer.ggml.tokens": tokens,
                  "tokenizer.ggml.token_type": [1] * len(tokens), "tokenizer.ggml.merges": merges,
                  "tokenizer.ggml.bos_token_id": 0, "tokenizer.ggml.eos_token_id": 0}
        path = write_vocab(tmp_path / f"{name}.gguf", kv)
        jobs.append({"path": str(path), "texts": corpus})
        built.append((name, path))
    bad = []
    for (name, path), res in zip(built, llamacpp(jobs)):
        try:
            assert_like_llamacpp(Tokenizer.from_gguf_metadata(_metadata(path)), corpus, res)
        except AssertionError as exc:
            bad.append(f"{name}: {str(exc)[:600]}")
    assert not bad, "\n".join(bad)


def _byte_pieces(bpe_tokens: list[str]) -> list[bytes]:
    from rapidmoe_gguf.tokenizer import _BYTE_OF_CHAR
    return [bytes(_BYTE_OF_CHAR[c] for c in t) for t in bpe_tokens if all(c in _BYTE_OF_CHAR for c in t)]


@needs_llamacpp
def test_rwkv_and_plamo2_vocabularies_match_llamacpp(corpus_and_bpe, tmp_path):
    """RWKV's greedy byte trie (tokens escaped as llama.cpp's converter writes them) and PLaMo-2's
    Viterbi with byte fallback, on vocabularies made of the trained pieces."""
    corpus, (tokens, _) = corpus_and_bpe
    pieces = [p for p in dict.fromkeys([bytes([b]) for b in range(256)] + _byte_pieces(tokens))]
    rwkv = ["<s>"] + [repr(p)[2:-1] for p in pieces] + ["[PAD0]"]
    specials = ["<|plamo:unk|>", "<|plamo:bos|>", "<|plamo:eos|>", "<|plamo:pad|>"]
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    texts = [t for t in dict.fromkeys(p.decode("utf-8", "ignore") for p in pieces)
             if t and "\0" not in t and t not in {*specials, *byte_tokens}]
    rng = random.Random(7)
    paths = [
        write_vocab(tmp_path / "rwkv.gguf", {
            "tokenizer.ggml.model": "rwkv", "tokenizer.ggml.tokens": rwkv,
            "tokenizer.ggml.token_type": [CONTROL] + [1] * len(pieces) + [5],
            "tokenizer.ggml.bos_token_id": 0, "tokenizer.ggml.eos_token_id": 0}),
        write_vocab(tmp_path / "plamo2.gguf", {
            "tokenizer.ggml.model": "plamo2", "tokenizer.ggml.tokens": specials + byte_tokens + texts,
            "tokenizer.ggml.token_type": [CONTROL] * 4 + [6] * 256 + [1] * len(texts),
            "tokenizer.ggml.scores": [0.0] * 260 + [-rng.uniform(1, 12) for _ in texts],
            "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2}),
    ]
    texts = corpus[:80]
    results = llamacpp([{"path": str(p), "texts": texts, "pieces": True} for p in paths])
    for path, res in zip(paths, results):
        assert_like_llamacpp(Tokenizer.from_gguf_metadata(_metadata(path)), texts, res)


@pytest.mark.slow
@needs_llamacpp
@pytest.mark.parametrize("add_space_prefix, remove_extra_whitespaces", [(True, False), (False, True), (False, False)])
def test_unigram_whitespace_flags_match_llamacpp(add_space_prefix, remove_extra_whitespaces, tmp_path):
    """The unigram (t5) file of models/ with its whitespace flags turned the other ways."""
    src = MODELS / "ggml-vocab-nomic-bert-moe.gguf"
    if not src.is_file():
        pytest.skip(f"{src.name} is not in llama.cpp's models/")
    md = _metadata(src)
    kv = {k: v for k, v in md.items() if k.startswith("tokenizer.")}
    kv |= {"tokenizer.ggml.add_space_prefix": add_space_prefix,
           "tokenizer.ggml.remove_extra_whitespaces": remove_extra_whitespaces,
           "tokenizer.ggml.tokens": list(md["tokenizer.ggml.tokens"]),
           "tokenizer.ggml.token_type": [int(t) for t in md["tokenizer.ggml.token_type"]],
           "tokenizer.ggml.scores": [float(s) for s in md["tokenizer.ggml.scores"]],
           "tokenizer.ggml.precompiled_charsmap": [int(b) for b in md["tokenizer.ggml.precompiled_charsmap"]]}
    path = write_vocab(tmp_path / "ugm.gguf", kv)
    texts = generated_texts(5, 80, ["<mask>", "<s>", "</s>"]) + ["  a  b  ", " lead", "trail ", "ｆｕｌｌ ①②"]
    res = llamacpp([{"path": str(path), "texts": texts}])[0]
    assert_like_llamacpp(Tokenizer.from_gguf_metadata(_metadata(path)), texts, res)


# --------------------------------------------------------------------------------------------
# Without llama.cpp: rules pinned by example
# --------------------------------------------------------------------------------------------

def test_unknown_pre_name_lists_the_known_ones():
    with pytest.raises(UnsupportedError, match=r"'mystery'.*supported: .*deepseek-llm.*gpt-2"):
        pre_tokenizer("mystery")
    with pytest.raises(UnsupportedError, match="embedding"):
        pre_tokenizer("whitespace")


def test_embedding_tokenizer_models_are_refused_saying_why():
    md = {"tokenizer.ggml.model": "bert", "tokenizer.ggml.tokens": ["a"]}
    with pytest.raises(UnsupportedError, match=r"'bert' is not supported \(WordPiece, for embedding models\)"):
        Tokenizer.from_gguf_metadata(md)


@pytest.mark.parametrize("text, cleaned", [
    ("Hello , world . Really ? Yes !", "Hello, world. Really? Yes!"),
    ("it 's , they 're , we 've , I 'm", "it's, they're, we've, I'm"),
    ("I 'll , you 'd , don 't", "I 'll, you 'd, don 't"),   # llama.cpp leaves these
    ("a ' b", "a'b"),
    ("", ""),
])
def test_detokenizer_clean_up_is_llamacpps(text, cleaned):
    assert _clean_spaces(bytearray(text.encode())).decode() == cleaned


def _byte_level_tokenizer(pre: str, extra: tuple[str, ...] = (), types: tuple[int, ...] = ()) -> Tokenizer:
    tokens = list(pre_tokenizers.ByteLevel.alphabet()) + ["Ġt", *extra]
    return Tokenizer.from_gguf_metadata({
        "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre, "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": [1] * (len(tokens) - len(types)) + list(types),
        "tokenizer.ggml.merges": ["Ġ t"], "tokenizer.ggml.add_bos_token": False})


def _pieces(tok: Tokenizer, text: str) -> list[str]:
    """The pre-tokenizer's pieces of text, back from the byte-level alphabet."""
    from rapidmoe_gguf.tokenizer import _BYTE_OF_CHAR
    return [bytes(_BYTE_OF_CHAR[c] for c in p).decode() for p, _ in tok.backend.pre_tokenizer.pre_tokenize_str(text)]


def test_kimi_k2_splits_as_llamacpps_code_not_as_its_regex():
    """llama.cpp's Kimi-K2 words ignore case and leave combining marks out."""
    pieces = _pieces(_byte_level_tokenizer("kimi-k2"), "camelCase e\u0301 中文")
    assert pieces == ["camelCase", " e", "\u0301", " ", "中文"]


def test_deepseek_llm_leaves_ideographic_space_to_the_whitespace_rule():
    """llama.cpp's regexes never see U+3000 (std::regex gets "\\v"): it is not punctuation there."""
    assert _pieces(_byte_level_tokenizer("deepseek-llm"), "  \u3000  ") == ["  \u3000  "]


def test_parse_special_and_user_defined_tokens():
    """Control tokens are cut out of the text only with parse_special; user-defined ones always;
    detokenize renders control tokens only with unparse_special."""
    tok = _byte_level_tokenizer("gpt-2", ("<ctl>", "<usr>"), (CONTROL, USER_DEFINED))
    ctl, usr = tok.n_vocab - 2, tok.n_vocab - 1
    assert ctl in tok.encode("a<ctl>b") and ctl not in tok.encode("a<ctl>b", parse_special=False)
    assert usr in tok.encode("a<usr>b", parse_special=False)
    ids = tok.encode("a<ctl>b<usr>")
    assert tok.detokenize(ids) == "a<ctl>b<usr>" and tok.detokenize(ids, unparse_special=False) == "ab<usr>"
    assert tok.decode(ids, skip_special=True) == "ab<usr>"


def _hf_byte_level_dir(path: Path, pre) -> Path:
    """A small byte-level BPE checkpoint directory with the given pre-tokenizer."""
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer, tok.decoder = pre, decoders.ByteLevel()
    tok.train_from_iterator(generated_texts(3, 60), trainers.BpeTrainer(
        vocab_size=500, show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    path.mkdir()
    tok.save(str(path / "tokenizer.json"))
    return path


def test_converter_takes_a_named_pre_tokenizer_the_fingerprint_misses(tmp_path):
    """StarCoder's tokenizer.json (digits one by one, then GPT-2's split) fingerprints to no name:
    asked for "starcoder", the converter writes it, warning; the file then splits digits one by one."""
    starcoder = _hf_byte_level_dir(tmp_path / "sc", pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]))
    with pytest.raises(UnsupportedError, match="Digits"):
        tokenizer_kv_from_hf(starcoder)
    with pytest.warns(UserWarning, match=r"'starcoder' as asked, though tokenizer.json does not match"):
        kv = tokenizer_kv_from_hf(starcoder, pre_tokenizer_name="starcoder")
    assert kv["tokenizer.ggml.pre"] == "starcoder"
    tok = Tokenizer.from_gguf_metadata(kv)
    assert _pieces(tok, "x 1234") == ["x", " ", "1", "2", "3", "4"] and tok.decode(tok.encode("x 1234")) == "x 1234"


def test_converter_named_pre_tokenizer_that_matches_is_quiet_and_unknown_ones_are_refused(tmp_path):
    gpt2 = _hf_byte_level_dir(tmp_path / "gpt2", pre_tokenizers.ByteLevel(add_prefix_space=False))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert tokenizer_kv_from_hf(gpt2, pre_tokenizer_name="mpt")["tokenizer.ggml.pre"] == "mpt"
    with pytest.raises(UnsupportedError, match=r"'mystery' is not a supported pre-tokenizer.*starcoder"):
        tokenizer_kv_from_hf(gpt2, pre_tokenizer_name="mystery")
    with pytest.raises(UnsupportedError, match="SentencePiece-style"):
        tokenizer_kv_from_hf(gpt2, pre_tokenizer_name="gemma4")

"""Tokenizer round trips: a small tokenizer trained here -> HF dir -> GGUF keys -> GGUF file ->
gguf-py reader -> Tokenizer; its ids must equal the original tokenizer.json's ids."""

import json
import re
import os
import subprocess
import sys

import gguf
import pytest
from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers, processors, trainers
from tokenizers import Tokenizer as HFTokenizer

from rapidmoe_gguf.errors import FormatError, UnsupportedError
from rapidmoe_gguf.tokenizer import (PRE_ALIASES, PRE_TOKENIZERS, IncrementalDecoder, Tokenizer,
                                     add_tokenizer_to_writer, tokenizer_kv_from_hf)

LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
               r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

CORPUS = [
    "The quick brown fox jumps over the lazy dog. It's a dog's life, isn't it? We're sure they'll see.",
    "Mixture-of-experts models route every token to a few experts; the router picks the top-k.",
    "Numbers: 0 1 2 3 4 5 6 7 8 9, 10, 100, 1000, 2024-06-01, 3.14159, 42%, $19.99.",
    "Café, naïve, résumé, Ångström, Zürich, São Paulo, señor, façade, über, crème brûlée.",
    "你好，世界。我们今天学习分词器。日本語のテキストも少しあります。한국어 문장도 있습니다.",
    "def main():\n    print('hello world')\n    return 0\n\nif __name__ == '__main__':\n\tmain()\n",
    "Tabs\tand  double  spaces   and\nnewlines\n\nare whitespace too. DON'T SHOUT, I'M TIRED.",
    "Emoji appear online: 🙂 🚀 👍 and punctuation too: (a) [b] {c} <d> a/b a|b a\\b @user #tag.",
] * 3

TEXT = ("Héllo wörld! naïve café… Ångström “quotes” ¿qué? 你好，世界。日本語 🙂🚀👍🏽 \t\tTabs  and   spaces\n\n\n"
        "new lines\r\n 1234567890 3.14159 +42 -7 it's we're I'm they'll you'd DON'T can't "
        "(){}[]<>;:/\\|@#$%^&*_=+~` end  ")
BYTE_LEVEL_SPECIALS = "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n<think>hmm</think> ok<|endoftext|>"


def _train_byte_level(pre_tokenizer, normalizer=None, specials=()):
    tok = HFTokenizer(models.BPE())
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=700, special_tokens=list(specials), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    return tok


def _save_hf_dir(path, tok, tokenizer_config, config=None):
    path.mkdir()
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    if config is not None:
        (path / "config.json").write_text(json.dumps(config))
    return path


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory):
    """Qwen2-style: NFC, the qwen2 split regex, specials added after the vocabulary, one plain added token."""
    tok = _train_byte_level(pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_REGEX), "isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]), normalizers.NFC())
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")])
    tok.add_tokens([AddedToken("<think>", special=False, normalized=False),
                    AddedToken("</think>", special=False, normalized=False)])
    config = {"vocab_size": tok.get_vocab_size() + 3, "bos_token_id": tok.token_to_id("<|endoftext|>")}
    return _save_hf_dir(tmp_path_factory.mktemp("qwen") / "hf", tok, {
        "bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
        "chat_template": CHAT_TEMPLATE}, config)


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
    """GPT-2-style: ByteLevel's own regex, <|endoftext|> inside the trained vocabulary."""
    tok = _train_byte_level(pre_tokenizers.ByteLevel(add_prefix_space=False), specials=["<|endoftext|>"])
    return _save_hf_dir(tmp_path_factory.mktemp("gpt2") / "hf", tok, {
        "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "chat_template": CHAT_TEMPLATE})


@pytest.fixture(scope="module")
def llama3_dir(tmp_path_factory):
    """Llama-3-style: its split regex, whole-word vocabulary lookups (ignore_merges), BOS from the post-processor."""
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"]
    tok = _train_byte_level(pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_REGEX), "isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                      special_tokens=[("<|begin_of_text|>", tok.token_to_id(specials[0]))])])
    tj = json.loads(tok.to_str())
    tj["model"]["ignore_merges"] = True
    return _save_hf_dir(tmp_path_factory.mktemp("llama3") / "hf", HFTokenizer.from_str(json.dumps(tj)), {
        "bos_token": specials[0], "eos_token": specials[1], "chat_template": CHAT_TEMPLATE})


@pytest.fixture(scope="module")
def spm_dir(tmp_path_factory):
    """Mixtral/Llama-style SentencePiece-as-BPE: byte fallback with <0xXX> tokens, '▁' for spaces, BOS added."""
    specials = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    trainer_tok = HFTokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    trainer_tok.pre_tokenizer = pre_tokenizers.Metaspace()
    trainer_tok.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=900, special_tokens=specials, show_progress=False, limit_alphabet=120))
    trained = json.loads(trainer_tok.to_str())["model"]
    merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in trained["merges"]]
    # Rebuild as Mixtral's tokenizer.json has it: byte tokens only in the vocabulary, three specials.
    tok = HFTokenizer(models.BPE(trained["vocab"], merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(content=" ", left=1)])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials[:3]])
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B:1", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    return _save_hf_dir(tmp_path_factory.mktemp("spm") / "hf", tok, {
        "add_bos_token": True, "add_eos_token": False, "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>",
        "chat_template": "{{ bos_token }}{% for m in messages %}[INST] {{ m['content'] }} [/INST]{% endfor %}"})


def _gguf_metadata(kv, path):
    """Write the keys to a real GGUF, read them back with gguf-py as key -> python value."""
    writer = gguf.GGUFWriter(str(path), "llama")
    add_tokenizer_to_writer(writer, kv)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    reader = gguf.GGUFReader(str(path))
    return {name: field.contents() for name, field in reader.fields.items()}, reader


def _rebuild(hf_dir):
    kv = tokenizer_kv_from_hf(hf_dir)
    metadata, _ = _gguf_metadata(kv, hf_dir.parent / "tok.gguf")
    return HFTokenizer.from_file(str(hf_dir / "tokenizer.json")), Tokenizer.from_gguf_metadata(metadata), metadata


def test_tokenizer_qwen2_ids_match_tokenizer_json(qwen_dir):
    original, ours, metadata = _rebuild(qwen_dir)
    assert metadata["tokenizer.ggml.model"] == "gpt2" and metadata["tokenizer.ggml.pre"] == "qwen2"
    for text in (TEXT, TEXT + BYTE_LEVEL_SPECIALS, BYTE_LEVEL_SPECIALS + TEXT, ""):
        ids = ours.encode(text)
        assert ids == original.encode(text).ids
        assert ours.decode(ids) == original.decode(ids, skip_special_tokens=False)
    # tokenizer.json composes a decomposed accent (NFC); llama.cpp, which reads the GGUF file we
    # write, applies no normalizer and keeps it (tests/test_tokenizer_vocab.py holds us to llama.cpp)
    assert ours.decode(ours.encode("cafe\u0301 e\u0301")) == "cafe\u0301 e\u0301"
    assert ours.decode(ours.encode(TEXT + BYTE_LEVEL_SPECIALS)) == TEXT + BYTE_LEVEL_SPECIALS
    assert "<|im_end|>" not in ours.decode(ours.encode(BYTE_LEVEL_SPECIALS), skip_special=True)
    assert "<think>" in ours.decode(ours.encode(BYTE_LEVEL_SPECIALS), skip_special=True)


def test_tokenizer_qwen2_keys_and_ids(qwen_dir):
    original = HFTokenizer.from_file(str(qwen_dir / "tokenizer.json"))
    kv = tokenizer_kv_from_hf(qwen_dir)
    n = original.get_vocab_size()
    im_end, eot, think = (original.token_to_id(t) for t in ("<|im_end|>", "<|endoftext|>", "<think>"))
    assert len(kv["tokenizer.ggml.tokens"]) == n + 3  # padded to config.json's vocab_size
    assert kv["tokenizer.ggml.tokens"][n:] == [f"[PAD{i}]" for i in range(n, n + 3)]
    types = kv["tokenizer.ggml.token_type"]
    assert (types[im_end], types[think], types[0], types[n]) == (3, 4, 1, 5)
    assert kv["tokenizer.ggml.eos_token_id"] == im_end and kv["tokenizer.ggml.padding_token_id"] == eot
    assert kv["tokenizer.ggml.bos_token_id"] == eot and kv["tokenizer.ggml.add_bos_token"] is False
    assert kv["tokenizer.chat_template"] == CHAT_TEMPLATE and "tokenizer.ggml.scores" not in kv
    assert all(isinstance(m, str) and m.count(" ") == 1 for m in kv["tokenizer.ggml.merges"])

    metadata, reader = _gguf_metadata(kv, qwen_dir.parent / "types.gguf")
    types_of = {name: reader.fields[name].types for name in reader.fields}
    assert types_of["tokenizer.ggml.token_type"] == [gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.INT32]
    assert types_of["tokenizer.ggml.eos_token_id"] == [gguf.GGUFValueType.UINT32]
    assert types_of["tokenizer.ggml.add_bos_token"] == [gguf.GGUFValueType.BOOL]

    ours = Tokenizer.from_gguf_metadata(metadata)
    assert ours.n_vocab == n + 3 and ours.eos_id == im_end and ours.chat_template == CHAT_TEMPLATE
    assert {im_end, eot} <= ours.eog_ids and think not in ours.eog_ids
    assert ours.token_to_piece(original.token_to_id("Ġthe")) == b" the"
    assert ours.token_to_piece(im_end) == b"<|im_end|>"


def test_tokenizer_merges_as_strings_or_pairs(gpt2_dir, tmp_path):
    """tokenizer.json keeps merges as "a b" strings (older files) or as pairs; both give "a b"."""
    tj = json.loads((gpt2_dir / "tokenizer.json").read_text())
    pairs = tj["model"]["merges"]
    tj["model"]["merges"] = [" ".join(p) for p in pairs]
    (tmp_path / "tokenizer.json").write_text(json.dumps(tj))
    assert tokenizer_kv_from_hf(tmp_path)["tokenizer.ggml.merges"] == tokenizer_kv_from_hf(gpt2_dir)[
        "tokenizer.ggml.merges"] == [f"{a} {b}" for a, b in pairs]


def test_tokenizer_gpt2_ids_match_tokenizer_json(gpt2_dir):
    original, ours, metadata = _rebuild(gpt2_dir)
    assert (metadata["tokenizer.ggml.model"], metadata["tokenizer.ggml.pre"]) == ("gpt2", "gpt-2")
    for text in (TEXT, TEXT + "<|endoftext|>" + TEXT, "  leading spaces and trailing   "):
        ids = ours.encode(text)
        assert ids == original.encode(text).ids
        assert ours.decode(ids) == text
    assert ours.eog_ids == {original.token_to_id("<|endoftext|>")}


def test_tokenizer_llama3_ids_match_tokenizer_json(llama3_dir):
    original, ours, metadata = _rebuild(llama3_dir)
    assert (metadata["tokenizer.ggml.pre"], metadata["tokenizer.ggml.add_bos_token"]) == ("llama-bpe", True)
    for text in (TEXT, "hi<|eot_id|>" + TEXT + "<|end_of_text|>"):
        ids = ours.encode(text)
        assert ids == original.encode(text).ids and ids[0] == ours.bos_id
        assert ours.decode(ids, skip_special=True) == text.replace("<|eot_id|>", "").replace("<|end_of_text|>", "")
    assert ours.eog_ids == {original.token_to_id(t) for t in ("<|end_of_text|>", "<|eot_id|>")}


def test_tokenizer_spm_ids_match_tokenizer_json(spm_dir):
    original, ours, metadata = _rebuild(spm_dir)
    assert metadata["tokenizer.ggml.model"] == "llama" and metadata["tokenizer.ggml.add_bos_token"] is True
    types = metadata["tokenizer.ggml.token_type"]
    assert [types[i] for i in (0, 1, 2, 3 + 0x41)] == [2, 3, 3, 6]  # <unk> <s> </s> <0x41>
    for text in (TEXT, "foo</s>bar <s> baz", " leading space", "emoji only 🚀", ""):
        ids = ours.encode(text)
        assert ids == original.encode(text).ids
        assert ids[0] == ours.bos_id == 1
        assert ours.decode(ids) == original.decode(ids, skip_special_tokens=False)
        assert ours.decode(ids, skip_special=True) == original.decode(ids)
    assert ours.decode(ours.encode(TEXT), skip_special=True) == TEXT
    assert ours.token_to_piece(3 + 0xF0) == b"\xf0" and ours.eog_ids == {2}


def test_tokenizer_spm_merges_from_scores(spm_dir):
    """A SentencePiece GGUF has scores but no merges; they are recovered from the scores."""
    _, ours, metadata = _rebuild(spm_dir)
    no_merges = {k: v for k, v in metadata.items() if k != "tokenizer.ggml.merges"}
    rebuilt = Tokenizer.from_gguf_metadata(no_merges)
    for text in (TEXT, "The quick brown fox, naïve café 12345"):
        assert rebuilt.encode(text) == ours.encode(text)


def test_tokenizer_incremental_decoder_holds_partial_utf8(qwen_dir, spm_dir):
    text = "🙂🚀 你好，世界 👍🏽 Ångström"
    for hf_dir in (qwen_dir, spm_dir):
        _, ours, _ = _rebuild(hf_dir)
        ids = ours.encode(text)
        pieces = [ours.token_to_piece(i) for i in ids]
        assert any(_is_partial_utf8(p) for p in pieces)  # the test would be vacuous otherwise
        stream = IncrementalDecoder(ours, skip_special=True)
        chunks = [stream.feed(i) for i in ids] + [stream.flush()]
        assert "".join(chunks) == text == ours.decode(ids, skip_special=True)
        assert not any("\ufffd" in c for c in chunks)
        special = ours.encode("🙂</s>你<|im_end|>") + [ours.eos_id]
        stream = IncrementalDecoder(ours)
        assert "".join([stream.feed(i) for i in special] + [stream.flush()]) == ours.decode(special)


def _is_partial_utf8(piece: bytes) -> bool:
    try:
        piece.decode("utf-8")
        return False
    except UnicodeDecodeError:
        return True


@pytest.mark.parametrize("pre", [*PRE_TOKENIZERS, *PRE_ALIASES])
def test_tokenizer_every_pre_name_builds(pre):
    """Each table regex compiles and splits as its family does; byte-level BPE loses nothing."""
    alphabet = [chr(c) for c in range(0x21, 0x7F)] + ["Ġ", "Ċ", "ĉ", "č", "Ġt"]
    tokens = alphabet + [t for t in pre_tokenizers.ByteLevel.alphabet() if t not in alphabet]
    ours = Tokenizer.from_gguf_metadata({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre,
                                         "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.merges": ["Ġ t"],
                                         "tokenizer.ggml.add_bos_token": False})
    assert ours.decode(ours.encode(TEXT)) == TEXT
    pieces = [p.lstrip("Ġ") for p, _ in ours.backend.pre_tokenizer.pre_tokenize_str("x 1234567")]
    digits = [p for p in pieces if p.isdigit()]
    one_by_one = list("1234567")
    expected = {"gpt-2": ["1234567"], "olmo": ["1234567"], "default": ["123", "456", "7"],
                "qwen2": one_by_one, "qwen35": one_by_one, "tekken": one_by_one}
    assert digits == expected.get(PRE_ALIASES.get(pre, pre), ["123", "456", "7"])


def test_tokenizer_unknown_pre_is_refused(qwen_dir):
    _, _, metadata = _rebuild(qwen_dir)
    with pytest.raises(UnsupportedError, match="mystery-pre"):
        Tokenizer.from_gguf_metadata(metadata | {"tokenizer.ggml.pre": "mystery-pre"})


def test_tokenizer_unknown_model_is_refused(qwen_dir):
    _, _, metadata = _rebuild(qwen_dir)
    with pytest.raises(UnsupportedError, match="'bert'"):
        Tokenizer.from_gguf_metadata(metadata | {"tokenizer.ggml.model": "bert"})


def test_tokenizer_unknown_split_regex_is_refused(qwen_dir, tmp_path):
    tj = json.loads((qwen_dir / "tokenizer.json").read_text())
    tj["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = r"\p{L}+|\p{N}{1,7}"
    hf_dir = tmp_path / "odd"
    hf_dir.mkdir()
    (hf_dir / "tokenizer.json").write_text(json.dumps(tj))
    with pytest.raises(UnsupportedError, match=r"p\{N\}\{1,7\}"):
        tokenizer_kv_from_hf(hf_dir)


def test_tokenizer_eog_follows_llama_cpp_rules():
    tokens = ["a", "<|end|>", "<|return|>", "<|call|>", "<|im_end|>", "<|file_sep|>", "b", "ab"]
    metadata = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "qwen2", "tokenizer.ggml.tokens": tokens,
                "tokenizer.ggml.token_type": [1, 3, 3, 3, 3, 3, 1, 1], "tokenizer.ggml.merges": ["a b"],
                "tokenizer.ggml.eos_token_id": 6}
    # <|end|> is not an end of generation when <|return|> and <|call|> exist (gpt-oss).
    assert Tokenizer.from_gguf_metadata(metadata).eog_ids == {2, 3, 4, 5, 6}


def test_tokenizer_matches_transformers_gguf_path(qwen_dir):
    """Cross-check against transformers' own GGUF tokenizer builder (no torch needed for it)."""
    mapping = pytest.importorskip("transformers.integrations.gguf.gguf_tokenizer_mapping")
    _, ours, metadata = _rebuild(qwen_dir)
    renames = {**mapping.GGUF_TOKENIZER_MAPPING["tokenizer"], **mapping.GGUF_TOKENIZER_MAPPING["tokenizer_config"]}
    tokenizer_dict = {name: metadata[f"tokenizer.{key}"] for key, name in renames.items()
                      if f"tokenizer.{key}" in metadata}
    theirs, _ = mapping.convert_gguf_tokenizer("qwen2", tokenizer_dict)
    text = TEXT + BYTE_LEVEL_SPECIALS  # already NFC: transformers' builder adds no normalizer
    assert theirs.encode(text, add_special_tokens=False).ids == ours.encode(text)


def test_tokenizer_imports_neither_torch_nor_transformers(tmp_path):
    # the same module search path as this process, from a folder where no source tree shadows it
    path = [os.path.abspath(p) for p in sys.path if p]
    code = (f"import sys; sys.path[:0] = {path!r}; import rapidmoe_gguf.tokenizer; "
            "sys.exit(sorted({'torch', 'transformers'} & set(sys.modules)) or 0)")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=tmp_path)


_SMALL = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "qwen2", "tokenizer.ggml.tokens": ["a", "b", "ab"],
          "tokenizer.ggml.token_type": [1, 1, 1], "tokenizer.ggml.merges": ["a b"],
          "tokenizer.ggml.eos_token_id": 2}


@pytest.mark.parametrize("key, value, expected, found", [
    ("tokenizer.ggml.eos_token_id", "2", "an integer", "a string"),
    ("tokenizer.ggml.bos_token_id", 1.5, "an integer", "a float"),
    ("tokenizer.ggml.eot_token_id", [2], "an integer", "an array"),
    ("tokenizer.ggml.token_type", ["1", "1", "1"], "an array of integers", "an array of strings"),
    ("tokenizer.ggml.token_type", 1, "an array of integers", "an integer"),
    ("tokenizer.ggml.tokens", [1, 2, 3], "an array of strings", "an array of integers"),
    ("tokenizer.ggml.merges", "a b", "an array of strings", "a string"),
    ("tokenizer.ggml.model", 2, "a string", "an integer"),
    ("tokenizer.ggml.pre", ["qwen2"], "a string", "an array"),
    ("tokenizer.ggml.add_bos_token", "yes", "a bool", "a string"),
    ("tokenizer.chat_template", 7, "a string", "an integer"),
])
def test_tokenizer_mistyped_key_is_a_format_error_naming_key_and_types(key, value, expected, found):
    with pytest.raises(FormatError, match=rf"{re.escape(key)}: expected {expected}, found {found}"):
        Tokenizer.from_gguf_metadata(_SMALL | {key: value})


def test_tokenizer_mistyped_llama_scores_are_a_format_error():
    md = _SMALL | {"tokenizer.ggml.model": "llama", "tokenizer.ggml.merges": [],
                   "tokenizer.ggml.scores": ["0", "0", "0"]}
    with pytest.raises(FormatError, match=r"tokenizer.ggml.scores: expected an array of numbers, found an array of strings"):
        Tokenizer.from_gguf_metadata(md)


def test_tokenizer_typed_keys_from_a_real_file(tmp_path):
    """The same through the native reader, whose arrays are numpy arrays."""
    from rapidmoe_gguf import open_gguf

    w = gguf.GGUFWriter(str(tmp_path / "t.gguf"), "llama")
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_string("tokenizer.ggml.pre", "qwen2")
    w.add_array("tokenizer.ggml.tokens", ["a", "b", "ab"])
    w.add_array("tokenizer.ggml.merges", ["a b"])
    w.add_array("tokenizer.ggml.token_type", [1.0, 1.0, 1.0])     # float32, not int32
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with open_gguf(tmp_path / "t.gguf") as g:
        md = dict(g.metadata)
    with pytest.raises(FormatError, match=r"tokenizer.ggml.token_type: expected an array of integers, "
                                          r"found an array of float32"):
        Tokenizer.from_gguf_metadata(md)

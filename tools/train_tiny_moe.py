#!/usr/bin/env python3
"""Train a tiny MoE language model (Qwen3-MoE on the GNU Collaborative International
Dictionary of English (GCIDE) by default; Mixtral on the Python documentation with
``--arch mixtral --corpus-kind python-doc``), on CPU, as a small test model for the runtime.

The result is an ordinary Hugging Face checkpoint (``OUT/hf``) that the GGUF
converter can consume: ``config.json``, ``model.safetensors``,
``tokenizer.json`` and ``tokenizer_config.json``.

Usage
-----
    apt-get install dict-gcide          # provides /usr/share/dictd/gcide.dict.dz
    python tools/train_tiny_moe.py --out runs/tiny-moe --threads 2 --max-minutes 65
    python tools/train_tiny_moe.py --out runs/tiny-moe --resume      # continue after an interruption
    python tools/train_tiny_moe.py --out runs/tiny-moe --resume --steps 1100   # ... ending at another step

The second model (Mixtral, 8 experts, top-2, on the reStructuredText sources of the Python 3.11
documentation, PSF-2.0 per /usr/share/doc/python3.11-doc/copyright):

    apt-get install python3.11-doc      # provides /usr/share/doc/python3.11/html/_sources
    python tools/train_tiny_moe.py --out runs/pydoc-mixtral --arch mixtral --corpus-kind python-doc \\
        --vocab-size 4096 --heldout-every 100 --steps 290 --threads 2

(docs/QUALITY.md, "The second model": the rest of the command sequence and its numbers.)

Smoke test (a couple of minutes):
    python tools/train_tiny_moe.py --out /tmp/tm-smoke --steps 20 --layers 1 \\
        --vocab-size 1024 --corpus-max-entries 4000 --eval-windows 4

Pipeline
--------
1. Corpus.  The dictd file (gzip compatible) is sliced into entries using the
   byte offsets in the neighbouring ``.index`` file (duplicate headwords that
   share an entry are read once; the ``00-database-*`` metadata entries are
   skipped).  Each entry is turned into plain text: the ``\\pro*nun"ci*a`\\tion\\``
   spellings and any pronunciation in parentheses after them are dropped,
   ``{cross references}`` lose their braces, accent codes such as ``[=a]`` or
   ``['e]`` become plain ASCII letters, source tags such as ``[1913 Webster]``
   are removed, and all whitespace is collapsed, so that each entry is a
   single line.  Entries are separated by a blank line.
   With ``--corpus-kind python-doc`` the corpus is the directory of ``*.rst.txt``
   sources; an entry is a paragraph (lines up to a blank line) of the files in
   sorted path order.  Section underlines (a line of one repeated punctuation
   character) are dropped, trailing spaces are stripped and each paragraph is
   dedented, keeping the relative indentation of code and the line breaks.
2. Split.  Entries are numbered in file order (0, 1, 2, ...).  Entry i is a
   held-out candidate when ``i % --heldout-every == 0``; every other entry is
   training text.  ``heldout.txt`` holds the candidates, in order, until
   adding the next one would exceed ``--heldout-max-bytes``; the remaining
   candidates are used for neither training nor evaluation.
3. Tokenizer.  A byte-level BPE (vocabulary ``--vocab-size``) with Qwen2's
   normalizer, pre-tokenizer and decoder, trained on the training split.
   Special tokens ``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>`` get ids
   0, 1, 2.  No BOS token is added.
4. Data.  The training text is tokenized once and cached as
   ``OUT/train_ids.npy`` (uint16).  Entries are joined exactly as in the text
   file (by ``"\\n\\n"``), so the token stream equals the tokenization of the
   whole training text.  Each epoch cuts the stream into non-overlapping
   windows of ``--seq-len`` tokens, starting at a random shift, and visits them
   in a random order; both come from ``numpy.random.default_rng(seed + epoch)``,
   so the data order is fully determined by (seed, epoch, position).
5. Model.  ``Qwen3MoeForCausalLM`` (``--arch qwen3moe``) or ``MixtralForCausalLM``
   (``--arch mixtral``: no QK norm, untied output, the experts ``--moe-intermediate-size``
   wide) trained with AdamW, linear warmup and
   cosine decay to ``--min-lr-ratio`` of the peak, gradient clipping, plus the
   router load-balancing loss (``--router-aux-coef``).
6. Evaluation.  Held-out perplexity: the whole of ``heldout.txt`` is
   tokenized as one string, cut into consecutive non-overlapping windows of
   ``--seq-len`` tokens (the last window may be shorter), and each window is
   scored on its own, starting from an empty context (no BOS), so the first
   token of each window is not predicted.  Perplexity is
   exp(total negative log-likelihood / number of predicted tokens).  During
   training only the first ``--eval-windows`` windows are used; the full set
   is scored at the end.  For comparison the same predicted tokens are scored
   with a unigram model fitted to the training token counts with add-one
   smoothing over the whole vocabulary.

Budget.  With ``--steps 0`` (the default) the step count is derived from
``--max-minutes``, measured from the start of the script: the first
``--timing-steps`` optimizer steps after the first ten (all inside the warmup, so the
learning-rate schedule is not yet affected by the total) are timed, together
with one evaluation, and the number of steps that fit in the remaining time is
fixed and recorded in the checkpoint and in ``train_info.json``.

Outputs in OUT: ``train.txt``, ``heldout.txt``, ``tokenizer.json``,
``tokenizer_config.json``, ``train_ids.npy``, ``ckpt.pt`` (saved atomically every
``--ckpt-minutes``), ``curve.json``, ``train_info.json`` and ``hf/``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import random
import re
import sys
import time
from pathlib import Path

import numpy as np
import torch

DEFAULT_CORPUS = "/usr/share/dictd/gcide.dict.dz"
CORPUS_NAME = "GNU Collaborative International Dictionary of English (GCIDE) 0.48, Debian package dict-gcide"
CORPUS_LICENSE = "GPL-3.0-or-later"
# The second corpus: the documentation sources of the Debian package python3.11-doc, under the
# Python Software Foundation License Version 2 (/usr/share/doc/python3.11-doc/copyright).
PYDOC_CORPUS = "/usr/share/doc/python3.11/html/_sources"
PYDOC_NAME = "Python 3.11 documentation sources (*.rst.txt), Debian package python3.11-doc"
PYDOC_LICENSE = "PSF-2.0"
CORPORA = {"gcide": (DEFAULT_CORPUS, CORPUS_NAME, CORPUS_LICENSE), "python-doc": (PYDOC_CORPUS, PYDOC_NAME, PYDOC_LICENSE)}

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
EOS_TOKEN = "<|endoftext|>"
QWEN2_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
ENTRY_SEPARATOR = "\n\n"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def atomic_write_json(path: Path, obj) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2) + "\n")


# ---------------------------------------------------------------------------
# Corpus
# ---------------------------------------------------------------------------

_B64 = {c: i for i, c in enumerate("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")}


def dictd_number(s: str) -> int:
    """Decode a dictd index offset/length (base-64 digits, most significant first)."""
    value = 0
    for ch in s:
        value = value * 64 + _B64[ch]
    return value


# Tags that name the source of a definition: [1913 Webster], [WordNet 1.5 +PJC], and on a
# line of their own also editors' initials such as [AS] or [RDH].
_SOURCE_TAG = re.compile(r"\[[^\]\n]*(?:Webster|WordNet|PJC|Century|Suppl)[^\]\n]*\]")
_SOURCE_TAG_LINE = re.compile(r"^\s*\[[A-Z]{2,4}(?:\s*\+\s*[A-Z]{2,4})*\]\s*$", re.MULTILINE)
# Syllabified spellings such as \A*ban"don\, each with the pronunciation that may follow it.
_SPELLING = re.compile(r"\s*\\[^\\\n]*\\(?:,?\s*\((?=[^()]{0,200}[\[*\"?`#])[^()]{0,200}\))?")


def _drop_spelling(m: re.Match) -> str:
    return " " if m.string[m.end() : m.end() + 1].isalnum() else ""
# Named character codes used by GCIDE, mapped to plain text.
_NAMED_CODES = {
    "ae": "ae", "AE": "Ae", "oe": "oe", "OE": "Oe", "eth": "th", "ETH": "Th", "thorn": "th",
    "THORN": "Th", "imac": "i", "ng": "ng", "th": "th", "deg": " degrees", "sect": "section",
    "root": "", "yogh": "gh", "add": "", "udd": "", "asl": "", "ll": "ll", "hand": "",
    "pound": "pounds", "cent": "cents", "frac12": "1/2", "frac14": "1/4", "frac34": "3/4",
}
# Accented letters: ['e] [=a] [a^] [.a] ["o] [`e] [~n] [,c] [aum] [oo^] [=oo] ...
_ACCENT_CODE = re.compile(r"\[(?:[=\-.^~'\"`,*]{1,2}([A-Za-z]{1,2})|([A-Za-z]{1,2})(?:\^|um|uml))\]")
_NAMED_CODE = re.compile(r"\[(" + "|".join(sorted(map(re.escape, _NAMED_CODES), key=len, reverse=True)) + r")\]")
_WHITESPACE = re.compile(r"\s+")


def clean_entry(raw: str) -> str:
    """Turn one dictd entry into a single line of plain English text."""
    text = _SOURCE_TAG_LINE.sub("", _SOURCE_TAG.sub("", raw))
    text = _SPELLING.sub(_drop_spelling, text)
    text = text.replace("{", "").replace("}", "")
    text = _ACCENT_CODE.sub(lambda m: m.group(1) or m.group(2), text)
    text = _NAMED_CODE.sub(lambda m: _NAMED_CODES[m.group(1)], text)
    text = text.replace("\\", "")
    return _WHITESPACE.sub(" ", text).strip()


def read_gcide(corpus: Path, max_entries: int = 0) -> list[str]:
    """Return the cleaned dictionary entries in file order."""
    index_path = corpus.with_name(corpus.name.replace(".dict.dz", ".index").replace(".dict", ".index"))
    if not corpus.exists():
        sys.exit(
            f"error: corpus {corpus} not found.\n"
            "Install it with:  apt-get update && apt-get install -y dict-gcide\n"
            "or point --corpus at a gcide .dict.dz file."
        )
    if not index_path.exists():
        sys.exit(f"error: dictd index {index_path} not found next to {corpus}")
    spans = set()
    with open(index_path, encoding="utf-8", errors="replace") as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            if len(parts) < 3 or parts[0].startswith("00-"):
                continue
            spans.add((dictd_number(parts[1]), dictd_number(parts[2])))
    with gzip.open(corpus, "rb") as f:
        data = f.read()
    entries = []
    for offset, length in sorted(spans):
        text = clean_entry(data[offset : offset + length].decode("utf-8", errors="replace"))
        if text:
            entries.append(text)
            if max_entries and len(entries) >= max_entries:
                break
    return entries


_UNDERLINE = re.compile(r"^([=\-~^\"'`#*+.:_])\1{2,}$")


def read_python_doc(corpus: Path, max_entries: int = 0) -> list[str]:
    """Return the paragraphs of the documentation sources under corpus, in sorted path order."""
    import textwrap

    if not corpus.is_dir():
        sys.exit(
            f"error: corpus directory {corpus} not found.\n"
            "Install it with:  apt-get update && apt-get install -y python3.11-doc\n"
            "or point --corpus at a directory of .rst.txt files."
        )
    files = sorted(p for p in corpus.rglob("*.rst.txt") if p.is_file())
    if not files:
        sys.exit(f"error: no .rst.txt files under {corpus}")
    entries: list[str] = []
    for path in files:
        lines = [ln.rstrip() for ln in path.read_text(encoding="utf-8", errors="replace").splitlines()]
        lines = ["" if _UNDERLINE.match(ln.strip()) else ln.replace("\t", "    ") for ln in lines]
        para: list[str] = []
        for ln in lines + [""]:
            if ln.strip():
                para.append(ln)
            elif para:
                entries.append(textwrap.dedent("\n".join(para)).strip("\n"))
                para = []
                if max_entries and len(entries) >= max_entries:
                    return entries
    return entries


def read_corpus(kind: str, corpus: Path, max_entries: int = 0) -> list[str]:
    return read_gcide(corpus, max_entries) if kind == "gcide" else read_python_doc(corpus, max_entries)


def split_entries(entries: list[str], every: int, max_bytes: int) -> tuple[list[str], list[str]]:
    train, heldout, heldout_bytes, full = [], [], 0, False
    for i, entry in enumerate(entries):
        if i % every != 0:
            train.append(entry)
            continue
        size = len(entry.encode("utf-8")) + len(ENTRY_SEPARATOR)
        if not full and heldout_bytes + size <= max_bytes:
            heldout.append(entry)
            heldout_bytes += size
        else:
            full = True  # later candidates are used for neither split
    return train, heldout


def prepare_corpus(args, out: Path) -> tuple[str, str]:
    train_path, heldout_path = out / "train.txt", out / "heldout.txt"
    if train_path.exists() and heldout_path.exists():
        log(f"reusing {train_path} and {heldout_path}")
    else:
        log(f"reading {args.corpus}")
        entries = read_corpus(args.corpus_kind, Path(args.corpus), args.corpus_max_entries)
        train, heldout = split_entries(entries, args.heldout_every, args.heldout_max_bytes)
        atomic_write_text(train_path, ENTRY_SEPARATOR.join(train) + "\n")
        atomic_write_text(heldout_path, ENTRY_SEPARATOR.join(heldout) + "\n")
        log(f"{len(entries)} entries -> {len(train)} train, {len(heldout)} held-out")
    train_text = train_path.read_text(encoding="utf-8")
    heldout_text = heldout_path.read_text(encoding="utf-8")
    log(f"train text {len(train_text.encode()) / 1e6:.1f} MB, held-out text {len(heldout_text.encode()) / 1e3:.0f} KB")
    return train_text, heldout_text


# ---------------------------------------------------------------------------
# Tokenizer
# ---------------------------------------------------------------------------


def train_tokenizer(train_text: str, vocab_size: int, out: Path):
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    entries = train_text.rstrip("\n").split(ENTRY_SEPARATOR)
    tokenizer.train_from_iterator(entries, trainer=trainer, length=len(entries))
    tokenizer.save(str(out / "tokenizer.json"))
    return tokenizer


def write_tokenizer_config(out: Path, max_len: int) -> None:
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": EOS_TOKEN,
        "pad_token": EOS_TOKEN,
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "additional_special_tokens": SPECIAL_TOKENS[1:],
        "clean_up_tokenization_spaces": False,
        "model_max_length": max_len,
        "split_special_tokens": False,
        "chat_template": CHAT_TEMPLATE,
    }
    atomic_write_json(out / "tokenizer_config.json", config)


def check_tokenizer(out: Path, tokenizer, sample: str) -> None:
    """transformers must load the saved tokenizer and agree with the tokenizers library."""
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(out))
    texts = [sample, "Hello, world! It's 1913 -- don't  panic.\n\nNew line\t tab", "caf\u00e9 \u00fcber \u4e2d\u6587 \U0001F600"]
    for text in texts:
        a = tokenizer.encode(text).ids
        b = hf(text, add_special_tokens=False)["input_ids"]
        if a != b:
            raise RuntimeError(f"tokenizer mismatch between tokenizers and transformers on {text[:60]!r}")
        if hf.decode(b) != text and tokenizer.decode(a) != text:
            log(f"warning: tokenizer does not round-trip {text[:60]!r}")
    chat = hf.apply_chat_template([{"role": "user", "content": "Define apple."}], tokenize=False, add_generation_prompt=True)
    assert chat == "<|im_start|>user\nDefine apple.<|im_end|>\n<|im_start|>assistant\n", chat
    if hf.eos_token != EOS_TOKEN or hf.bos_token is not None:
        raise RuntimeError("unexpected special tokens in tokenizer_config.json")
    log(f"tokenizer check passed ({type(hf).__name__}, {len(hf)} tokens)")


def load_or_train_tokenizer(args, out: Path, train_text: str, heldout_text: str):
    from tokenizers import Tokenizer

    path = out / "tokenizer.json"
    if path.exists():
        log(f"reusing {path}")
        tokenizer = Tokenizer.from_file(str(path))
    else:
        log(f"training byte-level BPE tokenizer, vocab {args.vocab_size}")
        t0 = time.time()
        tokenizer = train_tokenizer(train_text, args.vocab_size, out)
        log(f"tokenizer trained in {time.time() - t0:.0f}s, {tokenizer.get_vocab_size()} tokens")
    write_tokenizer_config(out, args.max_position_embeddings)
    check_tokenizer(out, tokenizer, heldout_text[:2000])
    if tokenizer.get_vocab_size() > args.vocab_size:
        sys.exit(f"error: tokenizer has {tokenizer.get_vocab_size()} tokens, more than --vocab-size {args.vocab_size}")
    return tokenizer


def encode_entries(tokenizer, text: str) -> np.ndarray:
    """Tokenize text whose entries are separated by ENTRY_SEPARATOR, one entry at a time.

    The pre-tokenizer always splits at the separator, so the result equals the
    tokenization of the whole string (checked on the held-out text)."""
    sep = tokenizer.encode(ENTRY_SEPARATOR).ids
    entries = text.rstrip("\n").split(ENTRY_SEPARATOR)
    ids: list[int] = []
    for start in range(0, len(entries), 4096):
        for i, enc in enumerate(tokenizer.encode_batch(entries[start : start + 4096])):
            if start + i:
                ids.extend(sep)
            ids.extend(enc.ids)
    ids.extend(tokenizer.encode("\n").ids)
    return np.asarray(ids, dtype=np.uint16)


def encode_text(tokenizer, text: str, corpus_kind: str) -> np.ndarray:
    """The training token stream: entry by entry for GCIDE (equal to the whole-text tokenization,
    checked on the held-out text); the whole text in one call for the documentation, whose entries
    hold line breaks, so that the BPE may merge the separator with an entry's last character."""
    if corpus_kind == "gcide":
        return encode_entries(tokenizer, text)
    return np.asarray(tokenizer.encode(text).ids, dtype=np.uint16)


def load_or_encode_train(tokenizer, out: Path, train_text: str, corpus_kind: str = "gcide") -> np.ndarray:
    path = out / "train_ids.npy"
    if path.exists():
        ids = np.load(path)
        log(f"reusing {path}: {len(ids):,} tokens")
        return ids
    t0 = time.time()
    ids = encode_text(tokenizer, train_text, corpus_kind)
    tmp = out / "train_ids.tmp.npy"
    np.save(tmp, ids)
    os.replace(tmp, path)
    log(f"tokenized train split in {time.time() - t0:.0f}s: {len(ids):,} tokens, "
        f"{len(train_text.encode()) / len(ids):.2f} bytes/token")
    return ids


# ---------------------------------------------------------------------------
# Data order
# ---------------------------------------------------------------------------


class WindowSampler:
    """Deterministic, resumable order of non-overlapping training windows."""

    def __init__(self, ids: np.ndarray, seq_len: int, seed: int, epoch: int = 0, pos: int = 0):
        self.ids, self.seq_len, self.seed = ids, seq_len, seed
        self.epoch, self.pos = epoch, pos
        self._make_epoch()

    def _make_epoch(self) -> None:
        rng = np.random.default_rng(self.seed + self.epoch)
        self.shift = int(rng.integers(self.seq_len))
        n = (len(self.ids) - self.shift) // self.seq_len
        self.order = rng.permutation(n)

    def next_batch(self, batch_size: int) -> torch.Tensor:
        rows = []
        while len(rows) < batch_size:
            if self.pos >= len(self.order):
                self.epoch, self.pos = self.epoch + 1, 0
                self._make_epoch()
            start = self.shift + int(self.order[self.pos]) * self.seq_len
            rows.append(self.ids[start : start + self.seq_len])
            self.pos += 1
        return torch.from_numpy(np.stack(rows).astype(np.int64))


# ---------------------------------------------------------------------------
# Model, evaluation
# ---------------------------------------------------------------------------


def build_config(args, eos_id: int):
    from transformers import MixtralConfig, Qwen3MoeConfig

    for name in ("hidden_size", "moe_intermediate_size", "intermediate_size"):
        if getattr(args, name) % 256:
            sys.exit(f"error: --{name.replace('_', '-')} must be a multiple of 256 (K-quant block width)")
    # what both architectures take alike; the bundled Qwen3-MoE ties its embeddings, the Mixtral not
    common = dict(
        vocab_size=args.vocab_size,
        hidden_size=args.hidden_size,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        head_dim=args.head_dim,
        num_experts_per_tok=args.top_k,
        max_position_embeddings=args.max_position_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": args.rope_theta},
        rms_norm_eps=1e-6,
        output_router_logits=True,
        router_aux_loss_coef=args.router_aux_coef,
        initializer_range=0.02,
        use_cache=False,
        bos_token_id=None,
        eos_token_id=eos_id,
        pad_token_id=eos_id,
    )
    if args.arch == "mixtral":
        return MixtralConfig(**common, intermediate_size=args.moe_intermediate_size, num_local_experts=args.experts,
                             tie_word_embeddings=False)
    return Qwen3MoeConfig(**common, intermediate_size=args.intermediate_size,
                          moe_intermediate_size=args.moe_intermediate_size, num_experts=args.experts,
                          norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], tie_word_embeddings=True)


def build_model(config, experts_impl: str):
    from transformers import MixtralForCausalLM, Qwen3MoeForCausalLM

    cls = MixtralForCausalLM if config.model_type == "mixtral" else Qwen3MoeForCausalLM
    return cls._from_config(config, attn_implementation="sdpa", experts_implementation=experts_impl)


def count_params(model, config) -> dict:
    total = sum(p.numel() for p in model.parameters())
    experts = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    embed = model.get_input_embeddings().weight.numel()
    active = total - experts + experts * config.num_experts_per_tok // config.num_experts
    return {"total": total, "active_per_token": active, "experts": experts, "embedding": embed,
            "total_non_embedding": total - embed, "active_non_embedding": active - embed}


def heldout_windows(ids: np.ndarray, seq_len: int) -> list[np.ndarray]:
    windows = [ids[i : i + seq_len] for i in range(0, len(ids), seq_len)]
    return [w for w in windows if len(w) >= 2]


@torch.no_grad()
def evaluate(model, windows: list[np.ndarray], batch_size: int) -> tuple[float, int]:
    """Return (perplexity, predicted tokens) over independently scored windows."""
    model.eval()
    nll, count = 0.0, 0
    full = [w for w in windows if len(w) == len(windows[0])]
    rest = [w for w in windows if len(w) != len(windows[0])]
    batches = [full[i : i + batch_size] for i in range(0, len(full), batch_size)] + [[w] for w in rest]
    for batch in batches:
        x = torch.from_numpy(np.stack(batch).astype(np.int64))
        logits = model(input_ids=x, output_router_logits=False).logits.float()
        loss = torch.nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, logits.size(-1)), x[:, 1:].reshape(-1), reduction="sum"
        )
        nll += loss.item()
        count += x[:, 1:].numel()
    model.train()
    return math.exp(nll / count), count


def unigram_perplexity(train_ids: np.ndarray, windows: list[np.ndarray], vocab_size: int) -> float:
    counts = np.bincount(train_ids, minlength=vocab_size).astype(np.float64)
    logp = np.log((counts + 1.0) / (counts.sum() + vocab_size))
    targets = np.concatenate([w[1:] for w in windows]).astype(np.int64)
    return float(np.exp(-logp[targets].mean()))


def lr_factor(step: int, warmup: int, total: int, min_ratio: float) -> float:
    """Linear warmup to 1, then cosine decay to min_ratio at step `total`."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def make_optimizer(model, args):
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr, betas=(0.9, 0.95), eps=1e-8,
    )


# ---------------------------------------------------------------------------
# Checkpoints
# ---------------------------------------------------------------------------


def save_checkpoint(path: Path, model, optimizer, state: dict, sampler: WindowSampler) -> None:
    ckpt = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "state": dict(state, epoch=sampler.epoch, pos=sampler.pos),
        "rng": {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()},
    }
    tmp = path.with_name(path.name + ".tmp")
    torch.save(ckpt, tmp)
    os.replace(tmp, path)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


# ---------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------


MODEL_ARGS = ("vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size", "layers", "heads",
              "kv_heads", "head_dim", "experts", "top_k", "max_position_embeddings", "rope_theta",
              "router_aux_coef", "seq_len", "batch_size", "lr", "min_lr_ratio", "warmup_steps",
              "weight_decay", "grad_clip", "seed", "heldout_every", "heldout_max_bytes", "corpus_max_entries")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--corpus-kind", default="gcide", choices=sorted(CORPORA),
                   help="gcide: the dictd dictionary; python-doc: a directory of .rst.txt documentation sources")
    p.add_argument("--corpus", default=None, help="GCIDE dictd file (.dict.dz, with its .index alongside) or the "
                   f"python-doc directory (defaults: {DEFAULT_CORPUS}, {PYDOC_CORPUS})")
    p.add_argument("--arch", default="qwen3moe", choices=["qwen3moe", "mixtral"], help="model architecture")
    p.add_argument("--corpus-max-entries", type=int, default=0, help="use only the first N entries (0 = all; for tests)")
    p.add_argument("--heldout-every", type=int, default=200, help="entry i is a held-out candidate when i %% N == 0")
    p.add_argument("--heldout-max-bytes", type=int, default=200_000, help="cap on the size of heldout.txt")
    p.add_argument("--vocab-size", type=int, default=8192)
    g = p.add_argument_group("model")
    g.add_argument("--layers", type=int, default=4)
    g.add_argument("--hidden-size", type=int, default=256)
    g.add_argument("--intermediate-size", type=int, default=512, help="dense MLP width (unused while every layer is MoE)")
    g.add_argument("--moe-intermediate-size", type=int, default=512)
    g.add_argument("--experts", type=int, default=8)
    g.add_argument("--top-k", type=int, default=2)
    g.add_argument("--heads", type=int, default=4)
    g.add_argument("--kv-heads", type=int, default=2)
    g.add_argument("--head-dim", type=int, default=64)
    g.add_argument("--max-position-embeddings", type=int, default=1024)
    g.add_argument("--rope-theta", type=float, default=10000.0)
    g.add_argument("--router-aux-coef", type=float, default=0.01)
    g.add_argument("--experts-impl", default="grouped_mm", choices=["eager", "batched_mm", "grouped_mm"],
                   help="transformers experts kernel used during training (does not affect the saved model)")
    g = p.add_argument_group("training")
    g.add_argument("--seed", type=int, default=1234)
    g.add_argument("--seq-len", type=int, default=256)
    g.add_argument("--batch-size", type=int, default=16)
    g.add_argument("--lr", type=float, default=2e-3, help="peak learning rate")
    g.add_argument("--min-lr-ratio", type=float, default=0.1)
    g.add_argument("--warmup-steps", type=int, default=100)
    g.add_argument("--weight-decay", type=float, default=0.1)
    g.add_argument("--grad-clip", type=float, default=1.0)
    g.add_argument("--steps", type=int, default=0, help="optimizer steps (0 = derive from --max-minutes)")
    g.add_argument("--max-minutes", type=float, default=65.0, help="wall-time budget for the whole script")
    g.add_argument("--timing-steps", type=int, default=30, help="steps timed before fixing the step count")
    g.add_argument("--threads", type=int, default=2)
    g.add_argument("--resume", action="store_true", help="continue from OUT/ckpt.pt")
    g = p.add_argument_group("logging")
    g.add_argument("--log-every", type=int, default=20)
    g.add_argument("--eval-every", type=int, default=0, help="steps between evaluations (0 = about 20 per run)")
    g.add_argument("--eval-windows", type=int, default=32, help="held-out windows scored during training")
    g.add_argument("--ckpt-minutes", type=float, default=5.0)
    args = p.parse_args(argv)
    args.corpus_given = args.corpus is not None
    if args.corpus is None:
        args.corpus = CORPORA[args.corpus_kind][0]
    return args


def main(argv=None) -> None:
    t_start = time.time()
    args = parse_args(argv)
    os.environ.setdefault("RAYON_NUM_THREADS", str(args.threads))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ckpt_path = out / "ckpt.pt"
    if not args.steps and not args.resume and args.warmup_steps < 10 + args.timing_steps:
        sys.exit("error: --warmup-steps must cover the timed steps (10 + --timing-steps) when --steps is 0")

    ckpt = None
    if args.resume:
        if not ckpt_path.exists():
            sys.exit(f"error: --resume given but {ckpt_path} does not exist")
        ckpt = torch.load(ckpt_path, map_location="cpu", weights_only=False)
        saved = ckpt["state"]["args"]
        for name in MODEL_ARGS:
            setattr(args, name, saved[name])
        for name, default in (("arch", "qwen3moe"), ("corpus_kind", "gcide")):
            setattr(args, name, saved.get(name, default))
        if not args.corpus_given:           # the run's own corpus, not the default kind's
            args.corpus = saved.get("corpus", CORPORA[args.corpus_kind][0])
        log(f"resuming from step {ckpt['state']['step']} of {ckpt['state']['total_steps']}")
        t_start -= ckpt["state"]["elapsed"]
    seed_everything(args.seed)

    import transformers

    train_text, heldout_text = prepare_corpus(args, out)
    tokenizer = load_or_train_tokenizer(args, out, train_text, heldout_text)
    eos_id = tokenizer.token_to_id(EOS_TOKEN)
    train_ids = load_or_encode_train(tokenizer, out, train_text, args.corpus_kind)
    del train_text

    heldout_ids = np.asarray(tokenizer.encode(heldout_text).ids, dtype=np.uint16)
    if not np.array_equal(heldout_ids, encode_text(tokenizer, heldout_text, args.corpus_kind)):
        raise RuntimeError("entry-wise tokenization differs from whole-text tokenization")
    windows = heldout_windows(heldout_ids, args.seq_len)
    eval_slice = windows[: args.eval_windows]
    unigram_full = unigram_perplexity(train_ids, windows, args.vocab_size)
    unigram_slice = unigram_perplexity(train_ids, eval_slice, args.vocab_size)
    log(f"held-out: {len(heldout_ids):,} tokens in {len(windows)} windows; "
        f"unigram ppl {unigram_full:.2f} (eval slice: {unigram_slice:.2f})")

    config = build_config(args, eos_id)
    model = build_model(config, args.experts_impl)
    params = count_params(model, config)
    log(f"{type(model).__name__}: {params['total']:,} parameters, {params['active_per_token']:,} active per token "
        f"(experts {params['experts']:,}, embedding {params['embedding']:,})")
    optimizer = make_optimizer(model, args)

    curve_path = out / "curve.json"
    if ckpt is not None:
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        torch.set_rng_state(ckpt["rng"]["torch"])
        np.random.set_state(ckpt["rng"]["numpy"])
        random.setstate(ckpt["rng"]["python"])
        state = ckpt["state"]
        if args.steps and args.steps != state["total_steps"]:
            # a new length for the run: the cosine schedule is re-drawn to end at the new step count
            log(f"total steps changed from {state['total_steps']} to {args.steps} on resume")
            state["total_steps"] = max(args.steps, state["step"] + 1)
        sampler = WindowSampler(train_ids, args.seq_len, args.seed, state["epoch"], state["pos"])
        curve = json.loads(curve_path.read_text()) if curve_path.exists() else {"train": [], "eval": []}
        del ckpt
    else:
        eval_every = args.eval_every or (max(1, args.steps // 20) if args.steps else None)
        state = {"step": 0, "tokens": 0, "total_steps": args.steps or None, "eval_every": eval_every}
        sampler = WindowSampler(train_ids, args.seq_len, args.seed)
        curve = {"unigram_ppl": unigram_full, "unigram_ppl_eval_slice": unigram_slice, "train": [], "eval": []}
    state["args"] = {name: getattr(args, name) for name in MODEL_ARGS}
    if args.arch != "qwen3moe" or args.corpus_kind != "gcide":
        state["args"].update(arch=args.arch, corpus_kind=args.corpus_kind, corpus=str(args.corpus))
    model.train()

    def run_eval(step: int) -> float:
        t0 = time.time()
        ppl, n = evaluate(model, eval_slice, args.batch_size)
        seconds = time.time() - t0
        curve["eval"].append({"step": step, "tokens": state["tokens"], "heldout_slice_ppl": ppl,
                              "elapsed_s": round(time.time() - t_start, 1)})
        atomic_write_json(curve_path, curve)
        log(f"eval step {step}: held-out slice ppl {ppl:.2f} over {n:,} tokens "
            f"(unigram {unigram_slice:.2f}) [{seconds:.1f}s]")
        return seconds

    # A fresh run (or one interrupted before the step count was fixed) times an evaluation first.
    eval_seconds = run_eval(state["step"]) if state["total_steps"] is None or state["step"] == 0 else 0.0
    timing_start = state["step"] + 10  # the first steps are slower
    budget_s = args.max_minutes * 60.0
    tokens_per_step = args.batch_size * args.seq_len
    last_ckpt = time.time()
    window_loss, window_ce, window_n, window_t0, window_tokens = 0.0, 0.0, 0, time.time(), 0
    timing_t0 = time.time()

    while state["total_steps"] is None or state["step"] < state["total_steps"]:
        step = state["step"]
        if state["total_steps"] is None and step == timing_start:
            timing_t0 = time.time()
        if state["total_steps"] is None and step == timing_start + args.timing_steps:
            sec_per_step = (time.time() - timing_t0) / args.timing_steps
            # Scoring a token is assumed to cost no more than training on it.
            eval_seconds = max(eval_seconds, sum(map(len, eval_slice)) * sec_per_step / tokens_per_step)
            full_eval_s = eval_seconds * len(windows) / max(1, len(eval_slice))
            # Leave time for ~20 slice evaluations, the full evaluation, checkpoints and the final save.
            remaining = budget_s - (time.time() - t_start) - 21 * eval_seconds - full_eval_s - 60.0
            remaining -= 3.0 * budget_s / (60.0 * args.ckpt_minutes)
            total = max(step + 1, step + int(0.97 * remaining / sec_per_step))
            state["total_steps"] = total
            state["eval_every"] = state["eval_every"] or max(1, total // 20)
            log(f"timing: {sec_per_step:.2f}s/step = {tokens_per_step / sec_per_step:.0f} tokens/s; "
                f"total steps fixed at {total} ({total * tokens_per_step:,} tokens)")
        total_steps = state["total_steps"] or 10**9
        for group in optimizer.param_groups:
            group["lr"] = args.lr * lr_factor(step, args.warmup_steps, total_steps, args.min_lr_ratio)

        x = sampler.next_batch(args.batch_size)
        out_fw = model(input_ids=x, labels=x, output_router_logits=True)
        loss = out_fw.loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        optimizer.step()

        state["step"] = step = step + 1
        state["tokens"] += tokens_per_step
        window_loss += loss.item()
        window_ce += loss.item() - config.router_aux_loss_coef * out_fw.aux_loss.item()
        window_n += 1
        window_tokens += tokens_per_step

        if step % args.log_every == 0 or step == state["total_steps"]:
            now = time.time()
            tps = window_tokens / (now - window_t0)
            elapsed = now - t_start
            eta = (state["total_steps"] - step) * (now - window_t0) / window_n if state["total_steps"] else float("nan")
            ce = window_ce / window_n
            log(f"step {step}/{state['total_steps'] or '?'} tokens {state['tokens']:,} loss {ce:.4f} "
                f"(ppl {math.exp(ce):.1f}, +aux {window_loss / window_n - ce:.4f}) lr {optimizer.param_groups[0]['lr']:.2e} "
                f"{tps:.0f} tok/s elapsed {elapsed / 60:.1f}m eta {eta / 60:.1f}m")
            curve["train"].append({"step": step, "tokens": state["tokens"], "loss": ce, "tokens_per_s": round(tps),
                                   "elapsed_s": round(elapsed, 1)})
            window_loss, window_ce, window_n, window_t0, window_tokens = 0.0, 0.0, 0, time.time(), 0
        if state["eval_every"] and step % state["eval_every"] == 0 and step != state["total_steps"]:
            eval_seconds = run_eval(step)
            window_t0 += eval_seconds
        if time.time() - last_ckpt > args.ckpt_minutes * 60:
            t0 = time.time()
            state["elapsed"] = time.time() - t_start
            save_checkpoint(ckpt_path, model, optimizer, state, sampler)
            log(f"checkpoint saved at step {step} [{time.time() - t0:.1f}s]")
            window_t0 += time.time() - t0
            last_ckpt = time.time()

    state["elapsed"] = time.time() - t_start
    save_checkpoint(ckpt_path, model, optimizer, state, sampler)
    log("final evaluation on the full held-out text")
    run_eval(state["step"])
    final_ppl, final_n = evaluate(model, windows, args.batch_size)
    log(f"final held-out ppl {final_ppl:.3f} over {final_n:,} predicted tokens (unigram {unigram_full:.2f})")

    hf_dir = out / "hf"
    hf_dir.mkdir(exist_ok=True)
    model.config.use_cache = True
    model.config.output_router_logits = False  # only needed for the training loss
    model.save_pretrained(str(hf_dir), safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (hf_dir / name).write_bytes((out / name).read_bytes())
    check_saved_model(hf_dir, windows[:2], model)

    wall = time.time() - t_start
    info = {
        "corpus": CORPORA[args.corpus_kind][1],
        "corpus_license": CORPORA[args.corpus_kind][2],
        "corpus_file": str(args.corpus),
        "heldout_rule": f"entry index % {args.heldout_every} == 0, first {args.heldout_max_bytes} bytes",
        "seed": args.seed,
        "steps": state["step"],
        "tokens_seen": state["tokens"],
        "epochs": state["tokens"] / len(train_ids),
        "sequence_length": args.seq_len,
        "batch_size": args.batch_size,
        "train_tokens": int(len(train_ids)),
        "heldout_tokens": int(len(heldout_ids)),
        "parameters": params,
        "model": {name: getattr(args, name) for name in MODEL_ARGS},
        **({"architecture": type(model).__name__} if args.arch != "qwen3moe" else {}),
        "heldout_ppl": final_ppl,
        "heldout_predicted_tokens": final_n,
        "heldout_ppl_method": (
            f"heldout.txt tokenized as one string without special tokens, cut into consecutive non-overlapping "
            f"windows of {args.seq_len} tokens (last one shorter), each scored independently from an empty "
            f"context with transformers (float32); ppl = exp(sum NLL / predicted tokens), the first token of "
            f"each window is not predicted"
        ),
        "unigram_ppl": unigram_full,
        "unigram_ppl_method": "unigram over training token counts with add-one smoothing, same predicted tokens",
        "wall_time_s": round(wall, 1),
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "threads": args.threads,
    }
    atomic_write_json(out / "train_info.json", info)
    curve["final"] = {"step": state["step"], "heldout_ppl": final_ppl, "unigram_ppl": unigram_full}
    atomic_write_json(curve_path, curve)
    log(f"done in {wall / 60:.1f} min; model in {hf_dir}")


def check_saved_model(hf_dir: Path, windows: list[np.ndarray], model) -> None:
    """Reload the saved checkpoint and make sure it reproduces the in-memory model."""
    from transformers import AutoModelForCausalLM

    reloaded = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32)
    x = torch.from_numpy(np.stack([w for w in windows if len(w) == len(windows[0])]).astype(np.int64))
    with torch.no_grad():
        model.eval()
        a = model(input_ids=x, output_router_logits=False).logits
        b = reloaded(input_ids=x, output_router_logits=False).logits
    diff = (a - b).abs().max().item()
    if diff > 1e-3:
        raise RuntimeError(f"reloaded model differs from the trained one (max |dlogit| {diff:.2e})")
    log(f"reloaded {hf_dir} (max |dlogit| {diff:.1e})")


if __name__ == "__main__":
    main()

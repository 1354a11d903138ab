"""tools/train_tiny_moe.py beyond GCIDE: the documentation corpus (--corpus-kind python-doc), its
held-out split, and the Mixtral architecture (--arch mixtral), end to end on a small corpus."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

TOOL = Path(__file__).resolve().parent.parent / "tools" / "train_tiny_moe.py"


@pytest.fixture(scope="module")
def tool():
    spec = importlib.util.spec_from_file_location("train_tiny_moe", TOOL)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _write_docs(root: Path, n_extra: int = 0) -> None:
    (root / "lib").mkdir(parents=True)
    (root / "intro.rst.txt").write_text(
        "Introduction\n============\n\nThe first paragraph\nspans two lines.   \n\n"
        "An example::\n\n   >>> print(1)\n   1\n\tdone\n", encoding="utf-8")
    (root / "lib" / "os.rst.txt").write_text(
        ":mod:`os` --- interfaces\n------------------------\n\n.. module:: os\n\n"
        + "".join(f"Paragraph {i} about files and paths, number {i}.\n\n" for i in range(n_extra)),
        encoding="utf-8")
    (root / "ignored.txt").write_text("not a source\n", encoding="utf-8")


def test_python_doc_paragraphs(tool, tmp_path):
    _write_docs(tmp_path, 2)
    entries = tool.read_python_doc(tmp_path)
    assert entries == [
        "Introduction",                                   # its underline is dropped
        "The first paragraph\nspans two lines.",          # line breaks kept, trailing spaces gone
        "An example::",
        ">>> print(1)\n1\n done",                         # dedented, relative indentation kept (tab = 4)
        ":mod:`os` --- interfaces",
        ".. module:: os",
        "Paragraph 0 about files and paths, number 0.",
        "Paragraph 1 about files and paths, number 1.",
    ]
    assert all("\n\n" not in e for e in entries)
    assert tool.read_python_doc(tmp_path, max_entries=3) == entries[:3]
    with pytest.raises(SystemExit, match="python3.11-doc"):
        tool.read_python_doc(tmp_path / "missing")
    with pytest.raises(SystemExit, match="no .rst.txt"):
        tool.read_python_doc(_empty(tmp_path))


def _empty(tmp_path: Path) -> Path:
    d = tmp_path / "empty"
    d.mkdir()
    return d


def test_split_keeps_heldout_out_of_training(tool):
    entries = [f"entry {i}" for i in range(20)]
    train, held = tool.split_entries(entries, 5, 30)
    assert held == ["entry 0", "entry 5", "entry 10"]    # 9 + 9 + 10 bytes; the 4th would pass 30
    assert "entry 15" not in train                       # later candidates: neither split
    assert set(train) == {e for i, e in enumerate(entries) if i % 5}


def test_mixtral_config_and_model(tool):
    args = tool.parse_args(["--out", "x", "--arch", "mixtral", "--corpus-kind", "python-doc", "--layers", "1"])
    assert args.corpus == tool.PYDOC_CORPUS
    assert tool.parse_args(["--out", "x"]).corpus == tool.DEFAULT_CORPUS    # GCIDE stays the default
    config = tool.build_config(args, eos_id=0)
    assert config.model_type == "mixtral"
    assert (config.num_local_experts, config.num_experts_per_tok, config.intermediate_size) == (8, 2, 512)
    assert config.tie_word_embeddings is False
    model = tool.build_model(config, "eager")
    assert type(model).__name__ == "MixtralForCausalLM"
    with pytest.raises(SystemExit, match="multiple of 256"):
        tool.build_config(tool.parse_args(["--out", "x", "--arch", "mixtral", "--hidden-size", "200"]), 0)


def test_train_mixtral_on_docs_end_to_end(tmp_path):
    """Two steps on a small documentation corpus: the held-out paragraphs are not in the training
    text, the checkpoint is a Mixtral the converter takes, and the record names the licence."""
    import rapidmoe_gguf as rm

    docs, out = tmp_path / "docs", tmp_path / "run"
    docs.mkdir()
    _write_docs(docs, 400)
    r = subprocess.run([sys.executable, str(TOOL), "--out", str(out), "--arch", "mixtral", "--corpus-kind",
                        "python-doc", "--corpus", str(docs), "--steps", "2", "--warmup-steps", "1", "--layers", "1",
                        "--vocab-size", "512", "--seq-len", "64", "--batch-size", "2", "--eval-windows", "2",
                        "--heldout-every", "10", "--threads", "1", "--experts-impl", "eager"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    held = (out / "heldout.txt").read_text().rstrip("\n").split("\n\n")
    train = set((out / "train.txt").read_text().rstrip("\n").split("\n\n"))
    assert held and not set(held) & train
    info = json.loads((out / "train_info.json").read_text())
    assert info["corpus_license"] == "PSF-2.0" and info["architecture"] == "MixtralForCausalLM"
    assert json.loads((out / "hf" / "config.json").read_text())["model_type"] == "mixtral"
    # a resumed run keeps its architecture and corpus without being told them again
    r = subprocess.run([sys.executable, str(TOOL), "--out", str(out), "--resume", "--steps", "3", "--threads", "1"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    info = json.loads((out / "train_info.json").read_text())
    assert (info["steps"], info["corpus_file"], info["architecture"]) == (3, str(docs), "MixtralForCausalLM")
    gguf = tmp_path / "m.gguf"
    rm.convert(out / "hf", gguf, recipe="q2k-q4", progress=False)
    with rm.Model(str(gguf), n_ctx=64, n_threads=1) as m:
        assert (m.info["arch"], m.info["n_expert"], m.info["n_expert_used"]) == ("llama", 8, 2)

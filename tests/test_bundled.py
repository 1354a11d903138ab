"""The model trained by the project and shipped in the package (tools/train_tiny_moe.py,
tools/ship_tiny_moe.py).

Golden test: greedy decoding of a fixed prompt gives the token ids stored in
tests/golden/tiny_moe_greedy.json. The slow tests compare against the original transformers
checkpoint, which is not shipped: set RAPIDMOE_TINY_MOE_RUN to the training run's folder (it
holds hf/ and heldout.txt) and run `pytest -m slow`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

import rapidmoe_gguf as rm
from rapidmoe_gguf.bundled import bundled_heldout_path, bundled_model_path
from rapidmoe_gguf.evaluate import _log_softmax, perplexity

GOLDEN = Path(__file__).parent / "golden" / "tiny_moe_greedy.json"


def test_bundled_greedy_decode_matches_golden_ids():
    golden = json.loads(GOLDEN.read_text())
    with rm.Model(bundled_model_path(), n_ctx=256, n_threads=2, residual_policy=golden["policy"],
                  residual_budget=golden["budget"]) as m:
        prompt = m.tokenize(golden["prompt"])
        assert prompt == golden["prompt_ids"]
        ids = list(m.generate_tokens(prompt, golden["n"], rm.SamplingParams(temperature=0.0)))
    assert ids == golden["ids"], f"got {ids}"


def test_bundled_model_metadata_and_sidecar():
    with rm.open_gguf(bundled_model_path()) as g:
        md = g.metadata
        assert md["general.architecture"] == "qwen3moe"
        assert "GNU Collaborative International Dictionary of English" in md["rapidmoe.training.corpus"]
        assert md["rapidmoe.training.steps"] > 0 and md["rapidmoe.training.heldout_ppl"] > 1
    with rm.Model(bundled_model_path(), n_ctx=64, n_threads=1) as m:
        assert m.residual_path is not None and m.umia_tables is not None
        assert m.residual_policy == "umia"
    with rm.open_gguf(rm.resplit.residual_path(bundled_model_path())) as g:   # bound to the base's data
        assert len(g.metadata[rm.resplit.KEY_BASE_FINGERPRINTS]) == len(g.tensors)


def test_bundled_residuals_close_most_of_the_gap():
    """On held-out text, every residual applied is far closer to itself than base only is, and
    UMIA at a quarter of the slots recovers a good part of the difference."""
    with open(bundled_heldout_path(), encoding="utf-8") as f:
        text = f.read()
    path = bundled_model_path()
    with rm.Model(path, n_ctx=256, n_threads=2) as m, \
            rm.Model(path, n_ctx=256, n_threads=2, residual_policy="all") as ref:
        ids = m.tokenize(text, add_special=False)
        m.set_residual("none")
        base = perplexity(m, ids, 256, reference=ref, max_chunks=4)
        m.set_residual("umia", 0.25)
        umia = perplexity(m, ids, 256, reference=ref, max_chunks=4)
    assert umia.kld_mean < 0.7 * base.kld_mean, (umia.kld_mean, base.kld_mean)
    assert abs(umia.residual_rate - 0.25) <= 0.02


def _run_dir() -> Path:
    run = os.environ.get("RAPIDMOE_TINY_MOE_RUN")
    if not run:
        pytest.skip("set RAPIDMOE_TINY_MOE_RUN to the training run folder (tools/train_tiny_moe.py --out)")
    return Path(run)


@pytest.mark.slow
def test_bundled_perplexity_matches_transformers_within_2_percent():
    import torch
    import transformers

    run = _run_dir()
    text = (run / "heldout.txt").read_text(encoding="utf-8")
    n_ctx, chunks = 256, 16
    with rm.Model(bundled_model_path(), n_ctx=n_ctx, n_threads=2, residual_policy="all") as m:
        ids = m.tokenize(text, add_special=False)
        ours = perplexity(m, ids, n_ctx, max_chunks=chunks).ppl
    hf = transformers.AutoModelForCausalLM.from_pretrained(run / "hf", dtype=torch.float32).eval()
    nll = []
    with torch.no_grad():
        for c in range(chunks):
            chunk = ids[c * n_ctx:(c + 1) * n_ctx]
            lp = _log_softmax(hf(torch.tensor([chunk])).logits[0].double().numpy())
            first = n_ctx // 2
            nll.append(-lp[np.arange(first - 1, n_ctx - 1), chunk[first:]])
    theirs = float(np.exp(np.concatenate(nll).mean()))
    assert abs(ours / theirs - 1) <= 0.02, f"ours {ours:.3f} vs transformers {theirs:.3f}"


@pytest.mark.slow
def test_bundled_checkpoint_q8_0_agrees_with_f32(tmp_path):
    """On the trained checkpoint, recipe q8_0 against recipe f32: mean KL <= 1e-3, top-1 >= 99%."""
    run = _run_dir()
    for recipe in ("f32", "q8_0"):
        rm.convert(run / "hf", tmp_path / f"{recipe}.gguf", recipe=recipe, progress=False)
    text = (run / "heldout.txt").read_text(encoding="utf-8")
    with rm.Model(tmp_path / "q8_0.gguf", n_ctx=256, n_threads=2) as m, \
            rm.Model(tmp_path / "f32.gguf", n_ctx=256, n_threads=2) as ref:
        r = perplexity(m, m.tokenize(text, add_special=False), 256, reference=ref, max_chunks=8)
    assert r.kld_mean <= 1e-3 and r.top1 >= 0.99, r


def test_bundled_stream_yields_the_generated_text_in_pieces():
    """Model.stream, the public streaming method: its pieces join to what generate returns, a
    stop string ends the text before it, and finish_reason says why generation ended."""
    with rm.Model(bundled_model_path(), n_ctx=128, n_threads=2) as m:
        text = m.generate("Once upon a time", 24, temperature=0)
        pieces = list(m.stream("Once upon a time", 24, temperature=0))
        assert "".join(pieces) == text and len(pieces) > 1 and m.finish_reason == "length"
        cut = text[len(text) // 2:][:3]
        stopped = "".join(m.stream("Once upon a time", 24, stop=[cut], sampling=rm.SamplingParams(temperature=0)))
        assert stopped == text[:text.index(cut)] and m.finish_reason == "stop"
        with pytest.raises(rm.InvalidArgumentError, match="not both"):
            list(m.stream("x", 2, sampling=rm.SamplingParams(), temperature=0))

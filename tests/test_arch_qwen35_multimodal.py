"""Qwen3.5-MoE as published: ``Qwen3_5MoeForConditionalGeneration`` checkpoints.

Their config.json holds the text model's settings under text_config; the text model's tensors are
under model.language_model.*, beside a vision tower (model.visual.*, not converted, logged) and an
MTP block (mtp.*, likewise); the routed experts may be stored stacked, one gate_up_proj and one
down_proj per layer, as transformers' fused expert classes hold them.

The tiny checkpoint: the random text model of test_arch_qwen35 (both layer kinds, grouped value
heads, a decay that matters) inside transformers' ConditionalGeneration class with the smallest
vision tower it accepts (one block), saved by transformers. Oracle: transformers' text model (f32);
our logits within 1e-4 relative (max |diff| / max |logit| per position) over a 100-token prefill
and 12 decode steps. The stacked-expert form is checked twice: transformers loads it to the same
logits (so it is the layout transformers reads), and it converts to the same file bytes as the
per-expert form. llama.cpp (skipped where absent): its converter's file of the same checkpoint
runs here within 1e-5 of ours (measured 9e-7), and llama.cpp's engine on our file gives our logits
within 1e-4 with the same argmax at every position.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from gguf import GGUFReader

import rapidmoe_gguf as rm
from rapidmoe_gguf.errors import FormatError
from test_arch_qwen35 import N_DECODE, N_PROMPT, _rel, llama_cpp_convert, llama_cpp_logits, make_tiny_hybrid
from conftest import VOCAB, make_tiny_tokenizer

VISION = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=64, patch_size=4,
              temporal_patch_size=1, spatial_merge_size=1, num_position_embeddings=16)


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    """(checkpoint dir, the ConditionalGeneration model, token ids, the text model's logits)."""
    import torch
    import transformers

    d = tmp_path_factory.mktemp("qwen35-multimodal")
    text = make_tiny_hybrid(d / "text", "qwen3_5_moe")
    cfg = transformers.Qwen3_5MoeConfig(text_config=text.config.to_dict(), vision_config=VISION,
                                        tie_word_embeddings=False)
    model = transformers.Qwen3_5MoeForConditionalGeneration(cfg).eval()
    state = {"model.language_model." + k[len("model."):] if k.startswith("model.") else k: v
             for k, v in text.state_dict().items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and all(k.startswith("model.visual.") for k in missing)
    model.save_pretrained(d / "hf")
    make_tiny_tokenizer(d / "hf")
    ids = np.random.default_rng(7).integers(3, VOCAB, N_PROMPT + N_DECODE).tolist()
    with torch.no_grad():
        ref = text(torch.tensor([ids])).logits[0].float().numpy()
    return d / "hf", model, ids, ref


def _logits(path, ids):
    with rm.Model(path, n_ctx=128, n_threads=2, n_batch=128) as m:
        assert m.info["arch"] == "qwen35moe"
        return m.eval_logits(ids[:N_PROMPT]), np.stack([m.eval([t]) for t in ids[N_PROMPT:]])


def test_published_layout_matches_transformers(published, tmp_path, caplog):
    import torch

    hf, model, ids, ref = published
    cfg = json.loads((hf / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3_5MoeForConditionalGeneration"] and "text_config" in cfg
    with torch.no_grad():    # the multimodal class on text alone is the text model
        assert _rel(model(torch.tensor([ids])).logits[0].float().numpy(), ref) < 1e-6
    with caplog.at_level("INFO", logger="rapidmoe_gguf.convert"):
        rm.convert(hf, tmp_path / "m.gguf", recipe="f32", progress=False)
    assert "of the vision tower (model.visual." in caplog.text
    with rm.open_gguf(tmp_path / "m.gguf") as g:
        assert g.metadata["general.architecture"] == "qwen35moe"
        assert not any("visual" in n or "language_model" in n for n in g.tensors)
    first, rest = _logits(tmp_path / "m.gguf", ids)
    assert _rel(first, ref[:N_PROMPT]) < 1e-4
    assert _rel(rest, ref[N_PROMPT:]) < 1e-4


def _stack_experts(src, dst, mtp: bool = False):
    """The checkpoint with each layer's experts stacked as transformers' fused classes hold them:
    gate_up_proj (n_expert, 2 * n_ff_exp, n_embd), gate rows first; down_proj (n_expert, n_embd,
    n_ff_exp). mtp: with an MTP tensor as the published checkpoints have."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    w = load_file(str(dst / "model.safetensors"))
    out = {k: v for k, v in w.items() if ".mlp.experts." not in k}
    layers = sorted({k.split(".mlp.experts.")[0] for k in w if ".mlp.experts." in k})
    for p in layers:
        n = sum(1 for k in w if k.startswith(p + ".mlp.experts.") and k.endswith(".down_proj.weight"))
        e = [p + f".mlp.experts.{x}." for x in range(n)]
        out[p + ".mlp.experts.gate_up_proj"] = torch.stack(
            [torch.cat([w[x + "gate_proj.weight"], w[x + "up_proj.weight"]]) for x in e]).contiguous()
        out[p + ".mlp.experts.down_proj"] = torch.stack([w[x + "down_proj.weight"] for x in e]).contiguous()
    if mtp:
        out["mtp.fc.weight"] = torch.zeros(64, 128)
    save_file(out, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return len(layers)


def test_stacked_experts_are_transformers_layout_and_convert_alike(published, tmp_path, caplog):
    import torch
    import transformers

    hf, _, ids, ref = published
    assert _stack_experts(hf, tmp_path / "stacked", mtp=True) == 4
    with torch.no_grad():    # transformers reads the stacked form as the same model
        back = transformers.Qwen3_5MoeForConditionalGeneration.from_pretrained(tmp_path / "stacked").eval()
        assert _rel(back(torch.tensor([ids])).logits[0].float().numpy(), ref) < 1e-6
    rm.convert(hf, tmp_path / "a.gguf", recipe="f32", progress=False)
    with caplog.at_level("INFO", logger="rapidmoe_gguf.convert"):
        rm.convert(tmp_path / "stacked", tmp_path / "b.gguf", recipe="f32", progress=False)
    assert "multi-token-prediction block" in caplog.text
    a, b = ({t.name: t for t in GGUFReader(tmp_path / f).tensors} for f in ("a.gguf", "b.gguf"))
    assert sorted(a) == sorted(b) and "blk.0.ffn_gate_exps.weight" in a
    for name, t in a.items():
        assert t.tensor_type == b[name].tensor_type, name
        np.testing.assert_array_equal(t.data, b[name].data, err_msg=name)


def test_stacked_experts_of_the_wrong_shape_are_refused(published, tmp_path):
    from safetensors.torch import load_file, save_file

    hf, *_ = published
    _stack_experts(hf, tmp_path / "bad")
    w = load_file(str(tmp_path / "bad" / "model.safetensors"))
    name = "model.language_model.layers.1.mlp.experts.gate_up_proj"
    w[name] = w[name][:, :-2].contiguous()
    save_file(w, str(tmp_path / "bad" / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(FormatError, match=r"'model.layers.1.mlp.experts.gate_up_proj' has shape \[4, 62, 64\] but "
                                          r"config.json implies \[4, 64, 64\]"):
        rm.convert(tmp_path / "bad", tmp_path / "m.gguf", recipe="f32", progress=False)


def test_published_layout_as_llama_cpp_converts_it(published, tmp_path):
    hf, _, ids, ref = published
    ours = tmp_path / "ours.gguf"
    rm.convert(hf, ours, recipe="f32", progress=False)
    theirs = llama_cpp_convert(hf, tmp_path / "llamacpp.gguf")
    a, _ = _logits(theirs, ids[:N_PROMPT + 1])
    b, _ = _logits(ours, ids[:N_PROMPT + 1])
    assert _rel(a, b) < 1e-5
    assert _rel(a, ref[:N_PROMPT]) < 1e-4
    lc = llama_cpp_logits(ours, ids[:N_PROMPT], tmp_path)
    assert _rel(b, lc) < 1e-4
    assert (b.argmax(-1) == lc.argmax(-1)).all()

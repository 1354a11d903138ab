"""FP8 checkpoints (quantization_config.quant_method "fp8"): 8-bit float weights with per-block
scales (``<name>_scale_inv``), as MiMo-V2-Flash, MiniMax-M2 and DeepSeek-V3 are released. The
converter reads them dequantized block by block, weight times its block's scale in float32.

Oracles: torch's float8_e4m3fn / float8_e5m2 for the 256 values of each format; transformers
loading the same FP8 checkpoint (on a machine without a GPU it dequantizes it: Fp8Dequantize) for
the logits, within 1e-4 relative, of tiny MiMo-V2-Flash, MiniMax-M2, DeepSeek-V3, GLM-5 and
DeepSeek-V3.2 checkpoints made FP8 here (every projection but the router's, blocks of 8 x 16 or
4 x 4, scales from each block's largest value).
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

import rapidmoe_gguf as rm
from conftest import VOCAB
from conftest import logit_rel as _rel
from rapidmoe_gguf.convert import safetensors_io as st
from test_arch_deepseek import make_checkpoint
from test_arch_glm_dsa import make_checkpoint as make_glm5
from test_arch_minimax_m2 import make_tiny_minimax
from test_arch_mimo2 import make_tiny_mimo

BLOCK = (8, 16)


def make_fp8(hf_dir, out_dir, block=BLOCK, fmt: str = "e4m3"):
    """hf_dir's checkpoint with each 2-D projection weight (*_proj, Mixtral-style w1/w2/w3, GLM-5's
    indexer's wq_b and wk) as FP8 of per-block scales, the rest as it is; config.json with
    transformers' quantization_config."""
    import torch
    from safetensors.torch import load_file, save_file

    dtype = torch.float8_e4m3fn if fmt == "e4m3" else torch.float8_e5m2
    top = 448.0 if fmt == "e4m3" else 57344.0
    out = {}
    for k, t in load_file(str(hf_dir / "model.safetensors")).items():
        if t.ndim == 2 and k.endswith(("_proj.weight", ".w1.weight", ".w2.weight", ".w3.weight", ".wq_b.weight",
                                       ".wk.weight")):
            r, c = t.shape
            blocks = t.float().reshape(r // block[0], block[0], c // block[1], block[1])
            s = blocks.abs().amax(dim=(1, 3)) / top
            out[k] = (blocks / s[:, None, :, None]).reshape(r, c).to(dtype)
            out[k + "_scale_inv"] = s
        else:
            out[k] = t
    out_dir.mkdir()
    for f in hf_dir.iterdir():
        if f.name != "model.safetensors":
            shutil.copy(f, out_dir / f.name)
    save_file(out, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((out_dir / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "fp8", "fmt": fmt, "activation_scheme": "dynamic",
                                  "weight_block_size": list(block)}
    (out_dir / "config.json").write_text(json.dumps(cfg))
    return out_dir


def test_fp8_values_are_torchs():
    import torch

    b = torch.arange(256, dtype=torch.uint8)
    for name, dtype in (("F8_E4M3", torch.float8_e4m3fn), ("F8_E5M2", torch.float8_e5m2)):
        ref = b.view(dtype).float().numpy()
        np.testing.assert_array_equal(st._FP8[name], ref)   # NaNs compare equal here


def test_blocks_that_overhang_the_weight():
    """A weight that is no whole number of blocks (DeepSeek-V3's 576 rows of kv_a_proj in blocks of
    128): its last blocks' scales cover what is left."""
    rng = np.random.default_rng(0)
    w, s = rng.standard_normal((2, 20, 37)).astype(np.float32), rng.random((2, 3, 3)).astype(np.float32) + 0.5
    got = st.dequantize_blocks(w, s, (8, 16), "t")
    ref = np.empty_like(w)
    for e in range(2):
        for i in range(20):
            for j in range(37):
                ref[e, i, j] = w[e, i, j] * s[e, i // 8, j // 16]
    np.testing.assert_array_equal(got, ref)
    with pytest.raises(rm.errors.FormatError, match=r"blocks of 8 x 8 over a weight of shape \[2, 20, 37\] need \[2, 3, 5\]"):
        st.dequantize_blocks(w, s, (8, 8), "t")
    with pytest.raises(rm.errors.FormatError, match="no whole number of blocks"):
        st.dequantize_blocks(w, s, None, "t")


@pytest.mark.parametrize("family, block", [("mimo2", BLOCK), ("minimax-m2", BLOCK), ("deepseek_v3", (4, 4)),
                                           ("glm5", (4, 4)), ("deepseek_v32", (4, 4))])
def test_fp8_checkpoint_matches_transformers(tmp_path, family, block):
    import torch
    import transformers

    if family == "deepseek_v3":   # its MLA projections, a leading dense layer, shared experts
        make_checkpoint(tmp_path / "hf", family)
    elif family in ("glm5", "deepseek_v32"):   # and the sparse attention indexer's projections, 40 tokens past top_k 8
        make_glm5(tmp_path / "hf", family)
    else:
        (make_tiny_mimo if family == "mimo2" else make_tiny_minimax)(tmp_path / "hf")
    fp8 = make_fp8(tmp_path / "hf", tmp_path / "fp8", block)
    ids = np.random.default_rng(5).integers(3, VOCAB, 40).tolist()
    logits = {}
    for name, src in (("exact", tmp_path / "hf"), ("fp8", fp8)):
        model = transformers.AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
        with torch.no_grad():
            logits[name] = model(torch.tensor([ids])).logits[0].float().numpy()
    assert _rel(logits["fp8"], logits["exact"]) > 1e-2   # the FP8 weights are not the bf16 ones: the scales matter
    rm.convert(fp8, tmp_path / "m.gguf", recipe="f32", progress=False)
    with rm.Model(tmp_path / "m.gguf", n_ctx=64, n_threads=2, n_batch=16) as m:
        got = m.eval_logits(ids)
    assert _rel(got, logits["fp8"]) < 1e-4


def test_fp8_refusals(tmp_path):
    make_tiny_mimo(tmp_path / "hf")
    fp8 = make_fp8(tmp_path / "hf", tmp_path / "fp8")
    cases = []
    # a weight without its scales
    no_scale = tmp_path / "no-scale"
    shutil.copytree(fp8, no_scale)
    from safetensors.torch import load_file, save_file

    w = load_file(str(no_scale / "model.safetensors"))
    del w["model.layers.1.self_attn.q_proj.weight_scale_inv"]
    save_file(w, str(no_scale / "model.safetensors"), metadata={"format": "pt"})
    cases.append((no_scale, rm.errors.UnsupportedError, "q_proj.weight' is F8_E4M3 without"))
    # scales of another block size than the config's
    bad_block = tmp_path / "bad-block"
    shutil.copytree(fp8, bad_block)
    cfg = json.loads((bad_block / "config.json").read_text())
    cfg["quantization_config"]["weight_block_size"] = [16, 16]
    (bad_block / "config.json").write_text(json.dumps(cfg))
    cases.append((bad_block, rm.errors.FormatError, "blocks of 16 x 16"))
    # another quantization method
    awq = tmp_path / "awq"
    shutil.copytree(fp8, awq)
    cfg = json.loads((awq / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "awq", "bits": 4}
    (awq / "config.json").write_text(json.dumps(cfg))
    cases.append((awq, rm.errors.UnsupportedError, "quant_method 'awq' is not supported"))
    for src, exc, msg in cases:
        out = tmp_path / f"{src.name}.gguf"
        with pytest.raises(exc, match=msg):
            rm.convert(src, out, recipe="f32", progress=False)
        assert not out.exists()

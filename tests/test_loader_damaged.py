"""Files the loader must refuse or run, never crash on: every tensor of a layer dropped or renamed
in turn, on a tiny model of each architecture, and the optional tensors the forward pass uses
together (q/k norms, q/k/v biases) given alone.

Oracle: the loader's promise (native/src/model/model.c) that a model it accepts runs: each damaged file
either loads and evaluates a prompt and a decoded token, or is refused with a FormatError (or
another RapidMoEError) whose message names a tensor. A crash fails the run."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

import rapidmoe_gguf as rm
from rapidmoe_gguf.errors import FormatError, RapidMoEError
from conftest import write_gguf_like


def _hf(tmp_path, tiny_hf, kind):
    from test_determinism import _hf as make

    return make(tmp_path, tiny_hf, kind)


KINDS = ["qwen3_moe", "qwen2_moe", "mixtral", "olmoe", "deepseek_v2", "deepseek_v3", "glm4_moe", "glm4_moe_lite",
         "qwen3_next", "qwen3_5_moe", "gpt_oss"]


@pytest.fixture(scope="module")
def files(tmp_path_factory, tiny_hf):
    cache = {}

    def get(kind):
        if kind not in cache:
            d = tmp_path_factory.mktemp(f"dmg-{kind}")
            out = d / "m.gguf"
            rm.convert(_hf(d, tiny_hf, kind), out, recipe="f32", progress=False)
            cache[kind] = out
        return cache[kind]

    return get


def runs_or_refused(path) -> str:
    """'runs' when the file loads and evaluates, 'refused' when the loader says why."""
    try:
        m = rm.Model(path, n_ctx=16, n_threads=1, residual=None)
    except RapidMoEError as exc:
        assert str(exc).strip(), "a refusal without a message"
        return "refused"
    with m:
        m.eval([1, 2, 3])
        m.eval([4])
    return "runs"


@pytest.mark.parametrize("kind", KINDS)
def test_loader_every_layer_tensor_dropped_or_renamed(files, kind, tmp_path):
    """Each of layer 1's tensors dropped, then renamed (a damaged name): refused or run."""
    src = files(kind)
    names = [t.name for t in gguf.GGUFReader(str(src)).tensors if t.name.startswith("blk.1.")]
    assert names
    seen = set()
    for i, name in enumerate(names):
        dst = tmp_path / f"d{i}.gguf"
        write_gguf_like(src, dst, drop={name})
        seen.add(runs_or_refused(dst))
        write_gguf_like(src, dst, rename={name: name.replace("blk.1.", "blk.1.x")})
        seen.add(runs_or_refused(dst))
    assert "refused" in seen   # the required tensors at least


def test_loader_refuses_a_q_norm_without_its_k_norm(files, tmp_path):
    """GLM-4.5's q/k norms are optional, but together: one alone was accepted, then the forward
    pass read the other's missing data."""
    src = files("glm4_moe")
    names = {t.name for t in gguf.GGUFReader(str(src)).tensors}
    assert "blk.1.attn_q_norm.weight" in names and "blk.1.attn_k_norm.weight" in names
    for drop in ("blk.1.attn_k_norm.weight", "blk.1.attn_q_norm.weight"):
        dst = tmp_path / "g.gguf"
        write_gguf_like(src, dst, drop={drop})
        kept = ({"blk.1.attn_q_norm.weight", "blk.1.attn_k_norm.weight"} - {drop}).pop()
        with pytest.raises(FormatError, match=f"'{kept}' is present but '{drop}' is missing"):
            rm.Model(dst, n_ctx=16, n_threads=1)
    both = tmp_path / "both.gguf"
    write_gguf_like(src, both, drop={"blk.1.attn_q_norm.weight", "blk.1.attn_k_norm.weight"})
    assert runs_or_refused(both) == "runs"   # neither: the layer runs without q/k norms


def test_loader_refuses_a_q_bias_without_k_and_v(files, tmp_path):
    """Biases on an architecture that may have them: all three of q, k and v, or none."""
    src = files("qwen3_moe")
    info = {t.name: t for t in gguf.GGUFReader(str(src)).tensors}
    q_rows = int(info["blk.0.attn_q.weight"].shape[1])
    dst = tmp_path / "b.gguf"
    write_gguf_like(src, dst, add={"blk.0.attn_q.bias": np.full(q_rows, 0.01, np.float32)})
    with pytest.raises(FormatError, match="'blk.0.attn_q.bias' is present but 'blk.0.attn_[kv].bias' is missing"):
        rm.Model(dst, n_ctx=16, n_threads=1)

"""The planner on a hybrid (qwen35moe): rm_session_sizes_get's recurrent state, the states of the
Gated DeltaNet layers that stand in for their KV cache (on the device with the layers), reaches
ModelSizes, the plan and ``rapidmoe plan``; the KV cache counts the full-attention layers only.

The tiny checkpoint of test_arch_qwen35 (4 layers: 3 linear, 1 full; 2 key and 4 value heads of 16
in the linear layers, a 4-tap conv over 2 * 2 * 16 + 4 * 16 = 128 channels; 2 KV heads of 32 in
the full one). Expected bytes are counted here from those shapes, not read back from the library.
"""

from __future__ import annotations

import json

import pytest

import rapidmoe_gguf as rm
from rapidmoe_gguf import cli
from rapidmoe_gguf.planner import Hardware, ModelSizes, plan, session_device_bytes
from test_arch_qwen35 import make_tiny_hybrid

F32 = 4


@pytest.fixture(scope="module")
def hybrid_file(tmp_path_factory):
    d = tmp_path_factory.mktemp("planner-hybrid")
    make_tiny_hybrid(d / "hf", "qwen3_5_moe")
    rm.convert(d / "hf", d / "m.gguf", recipe="f32", progress=False)
    return d / "m.gguf"


def test_model_sizes_read_the_linear_layers(hybrid_file):
    s = ModelSizes.from_files(hybrid_file)
    assert (s.n_layer, s.n_layer_linear) == (4, 3)
    assert (s.ssm_d_conv, s.ssm_conv_dim, s.ssm_n_v, s.ssm_d_state, s.ssm_head_v) == (4, 128, 4, 16, 16)
    # K and V of the one full-attention layer: 2 KV heads of 32 floats each
    assert s.kv_bytes_per_pos == 2 * F32 * 1 * 2 * 32
    assert session_device_bytes(s, 100, 16, False)["kv_cache"] == 100 * s.kv_bytes_per_pos


def test_recurrent_state_is_counted(hybrid_file):
    s = ModelSizes.from_files(hybrid_file)
    dev = session_device_bytes(s, 64, 16, False)
    # per linear layer: the conv's last 3 inputs of 128 channels, a 16 x 16 state per value head
    states = F32 * 3 * (3 * 128 + 4 * 16 * 16)
    assert states < dev["recurrent_state"] < states + (1 << 20)   # plus a step's scratch and the checkpoints
    assert session_device_bytes(s, 64, 32, False)["recurrent_state"] > dev["recurrent_state"]   # scratch grows with n_batch
    assert session_device_bytes(s, 128, 16, False)["recurrent_state"] == dev["recurrent_state"]   # and not with the context
    p = plan(s, "1GiB", n_ctx=64, n_batch=16, hardware=Hardware(host_bw_gbps=40), n_sessions=2)
    assert p.gpu_parts["recurrent_state"] == 2 * dev["recurrent_state"]
    assert any("3 of 4 layers have linear attention" in m and "on the GPU" in m for m in p.messages)
    assert "recurrent_state" in p.summary()


def test_recurrent_state_is_what_the_device_holds(hybrid_file):
    """A stand-in session allocates what the plan counts: its device bytes for a session (after
    the weights), once its states' checkpoints are taken, are the plan's session parts, the
    recurrent state included."""
    p = plan(ModelSizes.from_files(hybrid_file), "1GiB", n_ctx=64, n_batch=16, hardware=Hardware(host_bw_gbps=40))
    session = sum(v for k, v in p.gpu_parts.items() if k in ("kv_cache", "activations", "split_scratch",
                                                              "recurrent_state"))
    with rm.Model(str(hybrid_file), n_ctx=64, n_batch=16, gpu_memory="1GiB", gpu_backend="standin",
                  hardware=Hardware(host_bw_gbps=40)) as m:
        for n in (3, 5, 7, 9):   # each prompt's end checkpointed: all four copies made
            m.create_completion(list(range(5, 5 + n)), max_tokens=2, temperature=0)
        held = m.gpu_info["used_bytes"] - m.gpu_info["weight_bytes"]
    assert session <= held <= session + p.gpu_parts["expert_tables"] + (1 << 16)


def test_rapidmoe_plan_reports_the_state(hybrid_file, capsys):
    args = ["plan", str(hybrid_file), "--gpu-mem", "1GiB", "--ctx", "64", "--batch", "16", "--host-bw", "40"]
    assert cli.main(args + ["--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    want = session_device_bytes(ModelSizes.from_files(hybrid_file), 64, 16, False)["recurrent_state"]
    assert got["gpu_parts"]["recurrent_state"] == want
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    assert "recurrent_state" in out and "linear attention (Gated DeltaNet)" in out


def test_other_archs_have_no_recurrent_state(tmp_path):
    """A model without linear layers: no recurrent state, every layer in the KV cache."""
    from test_planner import _sizes

    s = _sizes()
    assert s.n_layer_linear == 0 and "recurrent_state" not in session_device_bytes(s, 64, 16, False)
    p = plan(s, "64GiB", n_ctx=64, hardware=Hardware(host_bw_gbps=40))
    assert "recurrent_state" not in p.gpu_parts
    assert not any("linear attention" in m for m in p.messages)

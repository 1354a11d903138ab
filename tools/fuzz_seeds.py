"""Seeds for the fuzz targets written with the gguf Python package (tools/fuzz.sh runs this).

    python tools/fuzz_seeds.py GGUF_DIR MODEL_DIR [BUNDLED_MODEL]

GGUF_DIR (the reader's target) gets:
  every-type.gguf       every KV value type, arrays of each (strings too), a
                        custom alignment, and tensors of plain, integer, block and K-quant types;
  bundled-trimmed.gguf  the bundled model's keys, its arrays cut to 64 entries, and its small
                        tensors (norms), in the bundled model's own order;
  bundled-head.gguf     the first 64 KiB of the bundled model as it is: a full header cut inside
                        the tokenizer's arrays.
MODEL_DIR (the loader's target) gets olmoe.base: a tiny qwen3moe seed of make_seeds rewritten as
OLMoE (q/k norms over the full width), the one architecture tiny_gguf.h does not write; and, for
each base + sidecar pair of make_seeds, TAG.bound: the pair bound as the converter binds it (the
base's rapidmoe.uuid, the sidecar's rapidmoe.base.uuid and rapidmoe.base.expert_fingerprints),
so that the loader's check of a sidecar against its base's data is reached. The fingerprints come
from rapidmoe_gguf.resplit; without an importable rapidmoe_gguf those seeds are skipped.
"""

from __future__ import annotations

import os
import struct
import sys

import numpy as np

import gguf
from gguf import GGMLQuantizationType as Q, GGUFValueType as V


def write(path: str, arch: str, fill) -> None:
    w = gguf.GGUFWriter(path, arch)
    fill(w)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def every_type(w: gguf.GGUFWriter) -> None:
    rng = np.random.default_rng(7)
    w.add_custom_alignment(64)
    for name, vt, val in [("u8", V.UINT8, 200), ("i8", V.INT8, -100), ("u16", V.UINT16, 60000),
                          ("i16", V.INT16, -30000), ("u32", V.UINT32, 4_000_000_000), ("i32", V.INT32, -7),
                          ("f32", V.FLOAT32, 1.5), ("bool", V.BOOL, True), ("u64", V.UINT64, 2**63 + 5),
                          ("i64", V.INT64, -(2**40)), ("f64", V.FLOAT64, 2.25)]:
        w.add_key_value(f"fuzz.{name}", val, vt)
        w.add_key_value(f"fuzz.arr.{name}", [val, val], V.ARRAY, sub_type=vt)
    w.add_string("fuzz.str", "h\u00e9llo \u4e16\u754c")
    w.add_key_value("fuzz.arr.str", ["a", "", "\u00e9\u00e9", "tokens"], V.ARRAY, sub_type=V.STRING)
    w.add_tensor("f32", rng.standard_normal((3, 5)).astype(np.float32))
    w.add_tensor("f16", rng.standard_normal((2, 8)).astype(np.float16))
    w.add_tensor("f64", rng.standard_normal(4))
    w.add_tensor("i8", rng.integers(-9, 9, 6).astype(np.int8))
    w.add_tensor("i32", rng.integers(-9, 9, (2, 2, 2)).astype(np.int32))
    w.add_tensor("bf16", rng.integers(0, 255, (2, 16), dtype=np.uint8), raw_dtype=Q.BF16)
    for q in (Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q8_0, Q.Q2_K, Q.Q4_K, Q.Q6_K, Q.IQ4_NL):
        block, size = gguf.GGML_QUANT_SIZES[q]
        w.add_tensor(q.name.lower(), rng.integers(0, 255, (2, size * (256 // block)), dtype=np.uint8), raw_dtype=q)


def field_value(f):
    """A reader field as the writer takes it: (value, type, element type)."""
    t = f.types[0]
    if t == V.ARRAY:
        sub = f.types[-1]
        items = [f.parts[i] for i in f.data[:64]]
        vals = [bytes(p).decode("utf-8") for p in items] if sub == V.STRING else [p.tolist()[0] for p in items]
        return vals, t, sub
    part = f.parts[f.data[0]]
    return (bytes(part).decode("utf-8") if t == V.STRING else part.tolist()[0]), t, None


def copy(reader: gguf.GGUFReader, w: gguf.GGUFWriter, rename=lambda k: k, keep=lambda t: True,
         swap=lambda t: (t.data, t.tensor_type)) -> None:
    for key, f in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        val, t, sub = field_value(f)
        w.add_key_value(rename(key), val, t, sub_type=sub)
    for t in reader.tensors:
        if keep(t):
            data, qt = swap(t)
            w.add_tensor(t.name, data, raw_dtype=qt)


def bundled_trimmed(bundled: str):
    r = gguf.GGUFReader(bundled)
    arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
    return arch, lambda w: copy(r, w, keep=lambda t: t.n_bytes <= 8192)


def olmoe(qwen3_seed: str):
    """qwen3moe -> olmoe: keys renamed, per-head q/k norms widened to the full projection width."""
    r = gguf.GGUFReader(qwen3_seed)
    head_dim = int(r.fields["qwen3moe.attention.key_length"].parts[-1][0])
    n_head = int(r.fields["qwen3moe.attention.head_count"].parts[-1][0])
    n_kv = int(r.fields["qwen3moe.attention.head_count_kv"].parts[-1][0])

    def rename(k: str) -> str:
        k = k.replace("qwen3moe.", "olmoe.", 1)
        return "olmoe.feed_forward_length" if k == "olmoe.expert_feed_forward_length" else k

    def swap(t):
        if t.name.endswith("attn_q_norm.weight") or t.name.endswith("attn_k_norm.weight"):
            heads = n_head if "attn_q_norm" in t.name else n_kv
            return np.tile(np.asarray(t.data, dtype=np.float32), heads)[: heads * head_dim], Q.F32
        return t.data, t.tensor_type

    return lambda w: copy(r, w, rename=rename, swap=swap)


def bound_pair(base_in: str, res_in: str, base_out: str, res_out: str, uuid: str, resplit) -> None:
    rb, rr = gguf.GGUFReader(base_in), gguf.GGUFReader(res_in)
    arch = bytes(rb.fields["general.architecture"].parts[-1]).decode()

    def base(w):
        copy(rb, w)
        w.add_string(resplit.KEY_UUID, uuid)

    write(base_out, arch, base)
    fps = resplit.base_fingerprints(base_out, [t.name for t in rr.tensors])

    def sidecar(w):
        copy(rr, w)
        w.add_uint32(resplit.KEY_FORMAT_VERSION, resplit.FORMAT_VERSION)
        w.add_string(resplit.KEY_BASE_UUID, uuid)
        w.add_key_value(resplit.KEY_BASE_FINGERPRINTS, [int(f) for f in fps], V.ARRAY, sub_type=V.UINT64)

    write(res_out, arch, sidecar)


def bound_pairs(gguf_dir: str, model_dir: str) -> None:
    try:
        from rapidmoe_gguf import resplit
        resplit.base_fingerprints, resplit.KEY_BASE_FINGERPRINTS, resplit.KEY_UUID   # noqa: B018
    except Exception as exc:           # absent, or a library that does not load: the other seeds still do
        print(f"fuzz_seeds: no bound pairs: rapidmoe_gguf.resplit is not usable here ({exc})", file=sys.stderr)
        return
    for name in sorted(os.listdir(gguf_dir)):
        if not name.endswith(".residual.gguf") or name.startswith("bound-"):
            continue
        tag = name[: -len(".residual.gguf")]
        base_out = os.path.join(gguf_dir, f"bound-{tag}.gguf")
        res_out = os.path.join(gguf_dir, f"bound-{tag}.residual.gguf")
        bound_pair(os.path.join(gguf_dir, f"{tag}.gguf"), os.path.join(gguf_dir, name), base_out, res_out,
                   f"fuzz-{tag}", resplit)
        with open(base_out, "rb") as b, open(res_out, "rb") as r, open(os.path.join(model_dir, f"{tag}.bound"), "wb") as out:
            base = b.read()
            out.write(struct.pack("<I", len(base)) + base + r.read())


def main(argv: list[str]) -> int:
    if len(argv) not in (3, 4):
        print(__doc__, file=sys.stderr)
        return 2
    gguf_dir, model_dir = argv[1], argv[2]
    write(os.path.join(gguf_dir, "every-type.gguf"), "fuzz", every_type)
    if len(argv) == 4:
        arch, fill = bundled_trimmed(argv[3])
        write(os.path.join(gguf_dir, "bundled-trimmed.gguf"), arch, fill)
        with open(argv[3], "rb") as f, open(os.path.join(gguf_dir, "bundled-head.gguf"), "wb") as out:
            out.write(f.read(64 << 10))
    qwen3 = os.path.join(gguf_dir, "qwen3moe-1.gguf")
    if os.path.exists(qwen3):
        path = os.path.join(gguf_dir, "olmoe.gguf")
        write(path, "olmoe", olmoe(qwen3))
        with open(path, "rb") as f, open(os.path.join(model_dir, "olmoe.base"), "wb") as out:
            out.write(struct.pack("<I", 0xFFFFFFFF) + f.read())
    bound_pairs(gguf_dir, model_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

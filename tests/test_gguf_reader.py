"""The GGUF reader: valid files read back as gguf-py reads them, every malformed file is refused
with its own message, and no mutation of a valid file can crash the process."""

from __future__ import annotations

import gc
import itertools
import struct

import gguf
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rapidmoe_gguf import (
    FormatError,
    GGUFFile,
    InvalidArgumentError,
    RapidMoEError,
    UnsupportedError,
    open_gguf,
)
from rapidmoe_gguf._native import ffi, lib

GT = gguf.GGUFValueType
QT = gguf.GGMLQuantizationType

# ------------------------------------------------------------------------------------------------
# A byte-level GGUF writer, so each malformed file has exactly one precise defect
# ------------------------------------------------------------------------------------------------


def pstr(s: str | bytes) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def kv(key: str | bytes, vtype: int, payload: bytes) -> bytes:
    return pstr(key) + struct.pack("<I", vtype) + payload


def kv_u32(key: str, v: int) -> bytes:
    return kv(key, GT.UINT32, struct.pack("<I", v))


def kv_str(key: str, v: str | bytes) -> bytes:
    return kv(key, GT.STRING, pstr(v))


def kv_arr(key: str, etype: int, n: int, elems: bytes) -> bytes:
    return kv(key, GT.ARRAY, struct.pack("<IQ", etype, n) + elems)


def info(name: str | bytes, ne: list[int], type_id: int = 0, offset: int = 0) -> bytes:
    dims = b"".join(struct.pack("<Q", d & (2**64 - 1)) for d in ne)
    return pstr(name) + struct.pack("<I", len(ne)) + dims + struct.pack("<IQ", type_id, offset)


def gguf_bytes(kvs=(), infos=(), data=b"", *, n_kv=None, n_tensors=None, version=3,
               magic=b"GGUF", alignment=32, pad=True) -> bytes:
    n_kv = len(kvs) if n_kv is None else n_kv
    n_tensors = len(infos) if n_tensors is None else n_tensors
    out = magic + struct.pack("<I", version)
    out += struct.pack("<QQ", n_tensors & (2**64 - 1), n_kv & (2**64 - 1))
    out += b"".join(kvs) + b"".join(infos)
    if infos and pad:
        out += b"\0" * (-len(out) % alignment)
    return out + data


ARCH = kv_str("general.architecture", "test")
DATA64 = np.arange(16, dtype=np.float32).tobytes()  # 'a' (8 x f32) then 'b' (4x2 f32)
INFO_A = info("a", [8], 0, 0)
INFO_B = info("b", [4, 2], 0, 32)


def base_file(**kw) -> bytes:
    """A valid file: one KV, tensors 'a' (ne {8}) and 'b' (ne {4, 2}), both F32."""
    args = dict(kvs=[ARCH], infos=[INFO_A, INFO_B], data=DATA64)
    args.update(kw)
    return gguf_bytes(**args)


# ------------------------------------------------------------------------------------------------
# Valid files, compared with gguf-py
# ------------------------------------------------------------------------------------------------


def write_with_gguf_py(path, build) -> None:
    w = gguf.GGUFWriter(str(path), "test")
    build(w)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def assert_same_as_gguf_py(path) -> GGUFFile:
    ref = gguf.GGUFReader(str(path))
    f = open_gguf(path)
    assert f.version == 3
    if ref.tensors:  # without tensors gguf-py still pads the data offset; ggml does not
        assert f.data_offset == ref.data_offset
    ref_kv = {k: v for k, v in ref.fields.items() if not k.startswith("GGUF.")}
    assert list(f.metadata) == list(ref_kv)
    for key, field in ref_kv.items():
        ours, theirs = f.metadata[key], field.contents()
        if isinstance(ours, np.ndarray):
            assert not ours.flags.writeable
            np.testing.assert_array_equal(ours, np.asarray(theirs), err_msg=key)
        else:
            assert ours == theirs, key
            assert isinstance(ours, bool) == isinstance(theirs, bool), key
    assert list(f.tensors) == [t.name for t in ref.tensors]
    for t in ref.tensors:
        ours = f.tensors[t.name]
        assert ours.ne == tuple(int(d) for d in t.shape)
        assert ours.shape == ours.ne[::-1]
        assert ours.type_id == int(t.tensor_type)
        assert ours.type_name == t.tensor_type.name
        assert ours.nbytes == t.n_bytes
        assert f.data_offset + ours.offset == t.data_offset
        assert ours.data.dtype == np.uint8 and not ours.data.flags.writeable
        assert ours.data.tobytes() == np.asarray(t.data).tobytes()
    return f


def test_gguf_reads_every_kv_type_like_gguf_py(tmp_path):
    path = tmp_path / "kv.gguf"

    def build(w):
        w.add_uint8("t.u8", 250)
        w.add_int8("t.i8", -120)
        w.add_uint16("t.u16", 65000)
        w.add_int16("t.i16", -32000)
        w.add_uint32("t.u32", 4_000_000_000)
        w.add_int32("t.i32", -2_000_000_000)
        w.add_float32("t.f32", 0.1)
        w.add_bool("t.bool", True)
        w.add_bool("t.bool_false", False)
        w.add_string("t.str", "héllo wörld ✓")
        w.add_string("t.empty_str", "")
        w.add_uint64("t.u64", 2**64 - 1)
        w.add_int64("t.i64", -(2**63))
        w.add_float64("t.f64", -1.0e300)
        w.add_array("t.arr_str", ["a", "", "ĠHello", "<|im_end|>", "日本"])
        w.add_array("t.arr_i32", [1, -2, 3])
        w.add_array("t.arr_f32", [0.5, -1.25, 3.0e10])
        w.add_array("t.arr_bool", [True, False, True])
        for name, sub in [("u8", GT.UINT8), ("i8", GT.INT8), ("u16", GT.UINT16),
                          ("i16", GT.INT16), ("u32", GT.UINT32), ("u64", GT.UINT64),
                          ("i64", GT.INT64), ("f64", GT.FLOAT64)]:
            w.add_key_value(f"t.arr_{name}", [0, 1, 7, 100], GT.ARRAY, sub_type=sub)

    write_with_gguf_py(path, build)
    f = assert_same_as_gguf_py(path)
    md = f.metadata
    assert md["t.u64"] == 2**64 - 1 and md["t.i64"] == -(2**63)
    assert md["t.bool"] is True and md["t.bool_false"] is False
    assert md["t.f32"] == float(np.float32(0.1))
    assert md["t.arr_str"] == ["a", "", "ĠHello", "<|im_end|>", "日本"]
    assert md["t.arr_f64"].dtype == np.float64 and md["t.arr_i8"].dtype == np.int8
    assert md["t.arr_bool"].dtype == np.bool_
    f.close()


def test_gguf_reads_tensors_like_gguf_py_with_custom_alignment(tmp_path):
    path = tmp_path / "tensors.gguf"
    rng = np.random.default_rng(0)

    def build(w):
        w.add_custom_alignment(64)
        w.add_tensor("f32_1d", rng.standard_normal(5).astype(np.float32))
        w.add_tensor("f16_2d", rng.standard_normal((3, 7)).astype(np.float16))
        w.add_tensor("i8_3d", rng.integers(-128, 127, (2, 3, 4)).astype(np.int8))
        w.add_tensor("i32_4d", rng.integers(0, 99, (2, 1, 3, 2)).astype(np.int32))
        w.add_tensor("f64", rng.standard_normal(3))
        for qt in (QT.Q8_0, QT.Q4_K, QT.Q6_K, QT.MXFP4, QT.BF16):
            blck, size = gguf.GGML_QUANT_SIZES[qt]
            raw = rng.integers(0, 256, (4, 2, 3 * size), dtype=np.uint8)
            w.add_tensor(f"blk.0.{qt.name.lower()}", raw, raw_dtype=qt)

    write_with_gguf_py(path, build)
    f = assert_same_as_gguf_py(path)
    assert f.alignment == 64
    q4k = f.tensors["blk.0.q4_k"]
    assert q4k.ne == (3 * 256, 2, 4) and q4k.shape == (4, 2, 768) and q4k.type_name == "Q4_K"
    assert all(t.offset % 64 == 0 for t in f.tensors.values())
    f32 = f.tensors["f32_1d"].data.view(np.float32)
    assert f32.shape == (5,)


def test_gguf_block_sizes_match_gguf_py_for_every_type(tmp_path):
    """Every type gguf-py can write gets the same byte size; Q8_1 is the one exception (below)."""
    path = tmp_path / "types.gguf"
    types = [qt for qt in gguf.GGML_QUANT_SIZES if qt != QT.Q8_1]

    def build(w):
        for qt in types:
            blck, size = gguf.GGML_QUANT_SIZES[qt]
            w.add_tensor(f"t{int(qt)}", np.full((3, 2 * size), 7, np.uint8), raw_dtype=qt)

    write_with_gguf_py(path, build)
    f = assert_same_as_gguf_py(path)
    for qt in types:
        blck, size = gguf.GGML_QUANT_SIZES[qt]
        t = f.tensors[f"t{int(qt)}"]
        assert (t.ne, t.nbytes) == ((2 * blck, 3), 6 * size), qt.name


@pytest.mark.parametrize("type_id, blck, size", [(9, 32, 36), (42, 64, 18), (41, 128, 18)])
def test_gguf_block_sizes_follow_ggml_where_gguf_py_differs_or_lags(tmp_path, type_id, blck, size):
    # Q8_1: ggml's block_q8_1 is 36 bytes (gguf-py 0.19.0 still says 40); Q2_0: newer than gguf-py.
    data = bytes(range(2 * size)) + b"\0" * (-2 * size % 32)
    path = tmp_path / "t.gguf"
    path.write_bytes(gguf_bytes(infos=[info("w", [2 * blck], type_id, 0)], data=data))
    t = open_gguf(path).tensors["w"]
    assert (t.nbytes, t.type_id) == (2 * size, type_id)
    assert t.data.tobytes() == bytes(range(2 * size))


def test_gguf_zero_tensors_zero_kvs_and_empty_arrays(tmp_path):
    path = tmp_path / "empty.gguf"
    path.write_bytes(gguf_bytes())
    with open_gguf(path) as f:
        assert (f.metadata, f.tensors, f.data_offset, f.alignment) == ({}, {}, 24, 32)
    body = gguf_bytes(kvs=[kv_arr("e.f32", GT.FLOAT32, 0, b""), kv_arr("e.s", GT.STRING, 0, b"")])
    path.write_bytes(body)
    with open_gguf(path) as f:
        assert f.metadata["e.s"] == [] and f.metadata["e.f32"].shape == (0,)
        assert f.data_offset == len(body)  # no padding without tensors


def test_gguf_accepts_version_2_and_63_byte_names_and_empty_tensors(tmp_path):
    path = tmp_path / "v2.gguf"
    name = "n" * 63
    path.write_bytes(gguf_bytes(kvs=[ARCH], infos=[info(name, [8]), info("z", [0, 4], 0, 32)],
                                data=DATA64[:32], version=2))
    f = open_gguf(path)
    assert f.version == 2
    assert f.tensors[name].nbytes == 32 and f.tensors["z"].nbytes == 0
    assert f.tensors["z"].data.shape == (0,)


def test_gguf_large_string_array_is_indexed(tmp_path):
    tokens = [f"tok{i}" for i in range(100_000)]
    path = tmp_path / "vocab.gguf"
    write_with_gguf_py(path, lambda w: w.add_token_list(tokens))
    f = open_gguf(path)
    assert f.metadata["tokenizer.ggml.tokens"] == tokens


def test_gguf_views_keep_the_mapping_alive_after_close(tmp_path):
    path = tmp_path / "a.gguf"
    path.write_bytes(base_file())
    with open_gguf(path) as f:
        view = f.tensors["b"].data
    assert f.closed
    del f
    gc.collect()
    np.testing.assert_array_equal(view.view(np.float32), np.arange(8, 16, dtype=np.float32))


def test_gguf_views_are_read_only(tmp_path):
    path = tmp_path / "a.gguf"
    path.write_bytes(base_file(kvs=[kv_arr("x", GT.UINT32, 2, struct.pack("<II", 1, 2))]))
    f = open_gguf(path)
    for arr in (f.tensors["a"].data, f.metadata["x"]):
        with pytest.raises(ValueError):
            arr[0] = 1
        with pytest.raises(ValueError):
            arr.flags.writeable = True


def test_gguf_closed_file_refuses_access(tmp_path):
    path = tmp_path / "a.gguf"
    path.write_bytes(base_file())
    f = open_gguf(path)
    f.close()
    f.close()
    with pytest.raises(InvalidArgumentError, match="closed"):
        f.tensors  # noqa: B018


def test_gguf_tensor_info_index_out_of_range_is_an_error(tmp_path):
    path = tmp_path / "a.gguf"
    path.write_bytes(base_file())
    f = open_gguf(path)
    out = ffi.new("rm_tensor_info *")
    assert lib.rm_gguf_tensor_info(f._g, 2, out) == lib.RM_E_INVALID_ARG
    assert "out of range" in ffi.string(lib.rm_last_error()).decode()
    assert lib.rm_gguf_find_tensor(f._g, b"b") == 1 and lib.rm_gguf_find_tensor(f._g, b"c") == -1
    assert lib.rm_gguf_find_kv(f._g, b"general.architecture") == 0
    assert lib.rm_gguf_kv_arr_str(f._g, 0, 0).ptr == ffi.NULL
    assert lib.rm_gguf_kv_type(f._g, 5) == -1


# ------------------------------------------------------------------------------------------------
# Malformed files: each refused, with a message naming the defect
# ------------------------------------------------------------------------------------------------

HEAD = 24  # magic, version, two counts
KEY_A = len(ARCH)


def _cut(blob: bytes, n: int) -> bytes:
    return blob[:n]


def _u64_last_kv(cut: int) -> bytes:
    return gguf_bytes(kvs=[kv("x.u64", GT.UINT64, struct.pack("<Q", 5))])[:-cut]


def _one(ne, type_id=0, name="w", data=b"\0" * 64, offset=0, kvs=(ARCH,)):
    return gguf_bytes(kvs=list(kvs), infos=[info(name, ne, type_id, offset)], data=data)


def _infos_end() -> int:
    return len(gguf_bytes(kvs=[ARCH], infos=[INFO_A, INFO_B], pad=False))


MALFORMED = {
    "truncated-header": (base_file()[:12], FormatError, "the header's tensor count needs 8 bytes"),
    "truncated-header-magic": (b"GG", FormatError, "the header needs 24 bytes"),
    "bad-magic": (b"GGML" + base_file()[4:], FormatError, "bad magic 47 47 4d 4c"),
    "version-0": (base_file(version=0), FormatError, "bad GGUF version 0"),
    "version-1": (base_file(version=1), FormatError, "version 1 is no longer supported"),
    "version-4": (base_file(version=4), FormatError, "version 4 is newer than"),
    "byte-swapped": (base_file(version=0x03000000), FormatError, "looks byte-swapped"),
    "negative-tensor-count": (base_file(n_tensors=-1), FormatError, "tensor count -1 is negative"),
    "negative-kv-count": (base_file(n_kv=-5), FormatError, "KV count -5 is negative"),
    "absurd-tensor-count": (base_file(n_tensors=2**40), FormatError,
                            "tensor count 1099511627776 cannot fit"),
    "absurd-kv-count": (base_file(n_kv=2**62), FormatError,
                        "KV count 4611686018427387904 cannot fit"),
    "tensor-count-past-kvs": (base_file(n_tensors=5), FormatError,
                              "bytes after the KV pairs hold at most"),
    "truncated-kv-key-length": (base_file(kvs=[ARCH, kv_u32("x", 1)])[:HEAD + KEY_A + 4],
                                FormatError, "the key length of KV 1 needs 8 bytes"),
    "truncated-kv-key": (base_file()[:HEAD + 8 + 10], FormatError,
                         "the key of KV 0 needs 20 bytes at offset 32"),
    "truncated-kv-type": (base_file()[:HEAD + 8 + 20 + 2], FormatError,
                          "the value type of KV 'general.architecture'"),
    "truncated-kv-value": (_u64_last_kv(3), FormatError, "the u64 value of KV 'x.u64' needs 8"),
    "string-length-past-eof": (gguf_bytes(kvs=[kv("s", GT.STRING, struct.pack("<Q", 2**40))]),
                               FormatError, "the string value of KV 's' needs 1099511627776"),
    "array-count-past-eof": (gguf_bytes(kvs=[kv_arr("a", GT.UINT32, 2**40, b"\0" * 16)]),
                             FormatError, "KV 'a' claims 1099511627776 elements of type u32"),
    "string-array-count-past-eof": (gguf_bytes(kvs=[kv_arr("a", GT.STRING, 2**40, pstr("x"))]),
                                    FormatError, "KV 'a' claims 1099511627776 strings"),
    "string-array-element-past-eof": (
        gguf_bytes(kvs=[kv_arr("a", GT.STRING, 2, pstr("x") + struct.pack("<Q", 99) + b"y")]),
        FormatError, "string 1 of array KV 'a' needs 99 bytes"),
    "truncated-array-header": (gguf_bytes(kvs=[kv("a", GT.ARRAY, struct.pack("<I", 4) + b"\1\0")]),
                               FormatError, "the element count of array KV 'a'"),
    "nested-array": (gguf_bytes(kvs=[kv_arr("a", GT.ARRAY, 1, struct.pack("<IQ", 4, 0))]),
                     FormatError, "KV 'a' is an array of arrays"),
    "unknown-array-element-type": (gguf_bytes(kvs=[kv_arr("a", 13, 1, b"\0" * 8)]), FormatError,
                                   "KV 'a' is an array of unknown element type 13"),
    "unknown-kv-type": (gguf_bytes(kvs=[kv("k", 13, b"\0" * 8)]), FormatError,
                        "KV 'k' has unknown value type 13"),
    "huge-kv-type": (gguf_bytes(kvs=[kv("k", 2**32 - 1, b"\0" * 8)]), FormatError,
                     "KV 'k' has unknown value type 4294967295"),
    "duplicate-key": (gguf_bytes(kvs=[kv_u32("dup", 1), ARCH, kv_u32("dup", 2)]), FormatError,
                      "duplicate key 'dup' (KV 0 and KV 2)"),
    "empty-key": (gguf_bytes(kvs=[ARCH, kv_u32("", 1)]), FormatError, "KV 1 has an empty key"),
    "key-not-utf8": (gguf_bytes(kvs=[kv_u32(b"bad\xff", 1)]), FormatError,
                     "the key of KV 0 ('bad\\xff') is not valid UTF-8"),
    "alignment-not-u32": (base_file(kvs=[kv("general.alignment", GT.UINT64,
                                            struct.pack("<Q", 32))]),
                          FormatError, "general.alignment has type u64; it must be u32"),
    "alignment-not-power-of-two": (base_file(kvs=[kv_u32("general.alignment", 48)]), FormatError,
                                   "general.alignment 48 is not a power of two"),
    "alignment-zero": (base_file(kvs=[kv_u32("general.alignment", 0)]), FormatError,
                       "general.alignment is 0"),
    "truncated-tensor-info": (base_file()[:_infos_end() - 3], FormatError,
                              "the offset of tensor 'b' needs 8 bytes"),
    "tensor-name-64-bytes": (_one([8], name="n" * 64), FormatError,
                             "is 64 bytes long; names must be shorter than 64"),
    "tensor-name-not-utf8": (_one([8], name=b"w\x00x"), FormatError,
                             "the name of tensor 0 ('w\\x00x') is not valid UTF-8"),
    "duplicate-tensor-name": (base_file(infos=[INFO_A, info("a", [4, 2], 0, 32)]), FormatError,
                              "duplicate tensor name 'a' (tensors 0 and 1)"),
    "n-dims-0": (_one([]), FormatError, "tensor 'w' has n_dims 0; it must be 1 to 4"),
    "n-dims-5": (_one([1, 1, 1, 1, 8]), FormatError, "tensor 'w' has n_dims 5"),
    "negative-dim": (_one([8, -2]), FormatError, "tensor 'w' has ne[1] = -2"),
    "dims-overflow": (_one([2**32, 2**32]), FormatError, "whose element count overflows int64"),
    "bytes-overflow": (_one([2**62]), FormatError, "its size in bytes overflows 64 bits"),
    "type-43": (_one([32], type_id=43), FormatError, "tensor 'w' has invalid ggml type 43"),
    "type-99": (_one([32], type_id=99), FormatError, "tensor 'w' has invalid ggml type 99"),
    "type-removed-4": (_one([32], type_id=4), UnsupportedError,
                       "ggml type 4 (Q4_2), which ggml has removed"),
    "type-removed-36": (_one([32], type_id=36), UnsupportedError,
                        "ggml type 36 (IQ4_NL_4_4), which ggml has removed"),
    "ne0-not-multiple-of-block": (_one([16], type_id=QT.Q4_0), FormatError,
                                  "of type Q4_0 has ne[0] = 16, not a multiple of the block "
                                  "size 32"),
    "offset-past-eof": (base_file(infos=[INFO_A, info("b", [4, 2], 0, 10**9)]), FormatError,
                        "tensor 'b' has offset 1000000000, which points past the end"),
    "overlapping-offsets": (base_file(infos=[INFO_A, info("b", [4, 2], 0, 16)]), FormatError,
                            "tensor 'b' has offset 16, expected 32 (tensors must be dense and "
                            "in order; it overlaps"),
    "out-of-order-offsets": (base_file(infos=[info("a", [8], 0, 32), info("b", [4, 2], 0, 0)]),
                             FormatError, "out of order: tensor 'b', listed later"),
    "gap-between-tensors": (base_file(infos=[INFO_A, info("b", [4, 2], 0, 64)],
                                      data=DATA64 + bytes(32)),
                            FormatError, "it leaves a gap of 32 bytes"),
    "misaligned-first-offset": (base_file(infos=[info("a", [8], 0, 4), info("b", [4, 2], 0, 36)],
                                          data=bytes(4) + DATA64),
                                FormatError, "tensor 'a' has offset 4, expected 0"),
    "data-section-past-eof": (base_file()[:_infos_end()], FormatError,
                              "the data section would start at byte"),
    "truncated-tensor-data": (base_file()[:-10], FormatError,
                              "the data of tensor 'b' (32 bytes at file offset"),
    "empty-file": (b"", FormatError, "the file is empty (0 bytes)"),
}


@pytest.mark.parametrize("case", list(MALFORMED), ids=list(MALFORMED))
def test_gguf_malformed_file_is_refused_with_its_message(tmp_path, case):
    blob, cls, needle = MALFORMED[case]
    path = tmp_path / "bad.gguf"
    path.write_bytes(blob)
    with pytest.raises(cls) as err:
        open_gguf(path)
    msg = str(err.value)
    assert msg.startswith(f"rm_gguf_open: {path}: "), msg
    assert needle in msg, msg


def test_gguf_malformed_messages_are_distinct():
    needles = [needle for _, _, needle in MALFORMED.values()]
    assert len(set(needles)) == len(needles)


def test_gguf_missing_path_and_directory_are_io_errors(tmp_path):
    with pytest.raises(RapidMoEError, match="cannot open: No such file or directory") as err:
        open_gguf(tmp_path / "nope.gguf")
    assert err.value.status == "RM_E_IO"
    with pytest.raises(RapidMoEError, match="is a directory, not a GGUF file"):
        open_gguf(tmp_path)


# ------------------------------------------------------------------------------------------------
# Mutation fuzzing: any corruption either opens cleanly or raises RapidMoEError, never crashes
# ------------------------------------------------------------------------------------------------


def _fuzz_seed() -> bytes:
    kvs = [
        ARCH,
        kv_u32("general.alignment", 16),
        kv("t.f64", GT.FLOAT64, struct.pack("<d", 1.5)),
        kv_arr("t.tokens", GT.STRING, 3, pstr("a") + pstr("bc") + pstr("")),
        kv_arr("t.scores", GT.FLOAT32, 3, struct.pack("<3f", 1, 2, 3)),
        kv_arr("t.flags", GT.BOOL, 2, b"\1\0"),
    ]
    infos = [info("a", [8], 0, 0), info("q", [32, 2], QT.Q8_0, 32), info("c", [2, 1, 1, 2], 1, 112)]
    data = bytes(range(32)) + bytes(range(68)) + bytes(12) + bytes(8)
    return gguf_bytes(kvs=kvs, infos=infos, data=data, alignment=16)


FUZZ_SEED = _fuzz_seed()
EXTREMES = [0, 1, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**63 - 1, 2**63, 2**64 - 1, 64, 4096]

positions = st.integers(0, len(FUZZ_SEED) + 8)
mutation = st.one_of(
    st.tuples(st.just("flip"), positions, st.integers(0, 7)),
    st.tuples(st.just("set"), positions, st.integers(0, 255)),
    st.tuples(st.just("insert"), positions, st.binary(min_size=1, max_size=9)),
    st.tuples(st.just("delete"), positions, st.integers(1, 16)),
    st.tuples(st.just("truncate"), positions, st.just(0)),
    st.tuples(st.just("u64"), positions, st.sampled_from(EXTREMES)),
    st.tuples(st.just("u32"), positions, st.sampled_from(EXTREMES[:6])),
)


def _mutate(blob: bytes, ops) -> bytes:
    b = bytearray(blob)
    for op, pos, arg in ops:
        pos = min(pos, len(b))
        if op == "flip" and pos < len(b):
            b[pos] ^= 1 << arg
        elif op == "set" and pos < len(b):
            b[pos] = arg
        elif op == "insert":
            b[pos:pos] = arg
        elif op == "delete":
            del b[pos:pos + arg]
        elif op == "truncate":
            del b[pos:]
        elif op in ("u64", "u32"):
            width = 8 if op == "u64" else 4
            b[pos:pos + width] = (arg % 2 ** (8 * width)).to_bytes(width, "little")
    return bytes(b)


def _exercise(f: GGUFFile) -> None:
    """Touch everything an opened file exposes, every byte of every view included."""
    for value in f.metadata.values():
        if isinstance(value, np.ndarray):
            value.sum()
    total = 0
    for t in f.tensors.values():
        assert t.data.nbytes == t.nbytes
        assert f.data_offset + t.offset + t.nbytes <= f.file_size
        total += int(t.data.sum())
    g = f._g
    for i in range(lib.rm_gguf_n_kv(g)):
        lib.rm_gguf_kv_arr_str(g, i, lib.rm_gguf_kv_arr_n(g, i))  # one past the end: empty
        lib.rm_gguf_kv_data(g, i)
    assert lib.rm_gguf_tensor_info(g, -1, ffi.new("rm_tensor_info *")) == lib.RM_E_INVALID_ARG


_counter = itertools.count()


@pytest.fixture(scope="module")
def fuzz_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz")


def test_gguf_fuzz_seed_is_valid(fuzz_dir):
    path = fuzz_dir / "seed.gguf"
    path.write_bytes(FUZZ_SEED)
    with open_gguf(path) as f:
        assert f.metadata["t.tokens"] == ["a", "bc", ""] and len(f.tensors) == 3
        _exercise(f)


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(mutation, min_size=1, max_size=4))
def test_gguf_fuzz_mutations_never_crash(fuzz_dir, ops):
    path = fuzz_dir / f"m{next(_counter)}.gguf"  # a fresh file: no old mapping sees it change
    path.write_bytes(_mutate(FUZZ_SEED, ops))
    try:
        f = open_gguf(path)
    except RapidMoEError as err:
        assert str(err).startswith("rm_gguf_open: ")
        return
    with f:
        _exercise(f)

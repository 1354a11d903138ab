"""TEMPORARY stand-ins for modules other branches are adding (rapidmoe_gguf.quants,
rapidmoe_gguf.tokenizer); installed by conftest only while the real module is missing."""

import sys
import types

import gguf
import gguf.quants
import numpy as np


def _quants_module():
    m = types.ModuleType("rapidmoe_gguf.quants")
    m.SHIM = True

    def row_bytes(type_name, n):
        block, nbytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[type_name]]
        return n // block * nbytes

    def quantize(type_name, x, n_threads=0):
        x = np.ascontiguousarray(x, dtype=np.float32)
        if type_name == "F32":
            return x.tobytes()
        if type_name == "F16":
            return x.astype(np.float16).tobytes()
        return gguf.quants.quantize(x, gguf.GGMLQuantizationType[type_name]).tobytes()

    def dequantize(type_name, data, shape):
        t = gguf.GGMLQuantizationType[type_name]
        raw = np.frombuffer(data, dtype=np.uint8).reshape(-1, row_bytes(type_name, shape[-1]))
        return gguf.quants.dequantize(raw, t).astype(np.float32).reshape(shape)

    m.row_bytes, m.quantize, m.dequantize = row_bytes, quantize, dequantize
    return m


def _tokenizer_module():
    m = types.ModuleType("rapidmoe_gguf.tokenizer")
    m.SHIM = True
    m.tokenizer_kv_from_hf = lambda hf_dir: {}
    m.add_tokenizer_to_writer = lambda writer, kv: None
    return m


def install():
    import rapidmoe_gguf

    for name, make in (("quants", _quants_module), ("tokenizer", _tokenizer_module)):
        full = "rapidmoe_gguf." + name
        try:
            __import__(full)
        except ImportError:
            sys.modules[full] = mod = make()
            setattr(rapidmoe_gguf, name, mod)

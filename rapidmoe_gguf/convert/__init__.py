"""The converter: a Hugging Face checkpoint or a GGUF file to a RESplit pair.

    pipeline.py        the conversion: plan every tensor's type, write both headers, then stream,
                       quantize and write the tensors (``convert``, ``ConvertReport``)
    sources.py         what it reads: a checkpoint directory or a GGUF file, as GGUF-named tensors
    safetensors_io.py  the streaming safetensors reader the checkpoint source uses
    recipes.py         which ggml type each kind of tensor gets, and the fallbacks
    imatrix.py         importance matrices: llama.cpp's imatrix files, read and computed

The pair's format and its identity check (``resplit``), the GGUF header reader (``gguf_header``)
and the type table (``quants``) are the runtime's too and live beside this package. Public names:
``rapidmoe_gguf.convert(...)`` and ``rapidmoe convert``.
"""

from .pipeline import ConvertReport, convert

__all__ = ["ConvertReport", "convert"]

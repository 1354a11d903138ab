"""Generates the cffi (API mode) binding from the one public header.

Run by CMake at build time: ``python _ffi_build.py rapidmoe.h OUT.c``. The declarations between
``RM_CDEF_BEGIN`` and ``RM_CDEF_END`` in the header are the cdef, so the Python side can never
drift from the C side, and the generated C is compiled against the real header, so the compiler
checks that both agree.
"""

import re
import sys

import cffi


def read_cdef(header_path: str) -> str:
    with open(header_path, encoding="utf-8") as f:
        text = f.read()
    m = re.search(r"/\* RM_CDEF_BEGIN \*/(.*)/\* RM_CDEF_END \*/", text, re.S)
    if m is None:
        raise SystemExit(f"{header_path}: RM_CDEF_BEGIN/RM_CDEF_END markers not found")
    body = re.sub(r"/\*.*?\*/", "", m.group(1), flags=re.S)
    lines = []
    for line in body.splitlines():
        stripped = line.strip()
        # cffi understands integer #defines; every other preprocessor line is dropped.
        if stripped.startswith("#") and not re.match(r"#define\s+\w+\s+-?\d+\s*$", stripped):
            continue
        lines.append(line)
    return "\n".join(lines)


def make_ffi(header_path: str) -> cffi.FFI:
    ffi = cffi.FFI()
    ffi.cdef(read_cdef(header_path))
    ffi.set_source("rapidmoe_gguf._rm_cffi", '#include "rapidmoe.h"')
    return ffi


if __name__ == "__main__":
    header, out_c = sys.argv[1], sys.argv[2]
    make_ffi(header).emit_c_code(out_c)

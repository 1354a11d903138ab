"""The raw binding: loads the cffi extension, checks it matches this Python layer, and turns C
status codes into exceptions carrying the C message."""

from __future__ import annotations

from .errors import (
    ContextFullError,
    DeviceError,
    FormatError,
    InternalError,
    InvalidArgumentError,
    NeedsCPUError,
    NoBudgetError,
    NoResidualError,
    NotCalibratingError,
    OutOfMemoryError,
    RapidMoEError,
    StateError,
    UnsupportedError,
)

# The C declarations this Python layer was written against (RM_ABI_VERSION in rapidmoe.h).
EXPECTED_ABI = 10

try:
    from ._rm_cffi import ffi, lib  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError(
        "rapidmoe_gguf: the native library is not built or cannot be loaded "
        f"({exc}); reinstall with `pip install .` from the source tree"
    ) from exc

if lib.rm_abi_version() != EXPECTED_ABI or lib.RM_ABI_VERSION != EXPECTED_ABI:
    raise ImportError(
        f"rapidmoe_gguf: native library ABI {lib.rm_abi_version()} (binding built for "
        f"{lib.RM_ABI_VERSION}) does not match the Python layer's ABI {EXPECTED_ABI}; "
        "rebuild the package so that both come from the same source"
    )

_BY_STATUS = {
    lib.RM_E_IO: RapidMoEError,
    lib.RM_E_FORMAT: FormatError,
    lib.RM_E_UNSUPPORTED_TYPE: UnsupportedError,
    lib.RM_E_UNSUPPORTED_ARCH: UnsupportedError,
    lib.RM_E_SHAPE: FormatError,
    lib.RM_E_OOM: OutOfMemoryError,
    lib.RM_E_INVALID_ARG: InvalidArgumentError,
    lib.RM_E_CUDA: DeviceError,
    lib.RM_E_INTERNAL: InternalError,
    lib.RM_E_STATE: StateError,
    lib.RM_E_CONTEXT_FULL: ContextFullError,
    lib.RM_E_NO_RESIDUAL: NoResidualError,
    lib.RM_E_NEEDS_CPU: NeedsCPUError,
    lib.RM_E_NOT_CALIBRATING: NotCalibratingError,
    lib.RM_E_NO_BUDGET: NoBudgetError,
}


def last_error() -> str:
    return ffi.string(lib.rm_last_error()).decode("utf-8", "replace")


def check(status: int) -> None:
    """Raise the exception for a non-zero rm_status, with the thread's last-error message."""
    if status == lib.RM_OK:
        return
    name = ffi.string(lib.rm_status_str(status)).decode()
    msg = last_error() or name
    raise _BY_STATUS.get(status, RapidMoEError)(msg, status=name)


def to_str(s) -> str:
    """An rm_str (pointer + length into a mapping) as a Python str."""
    if s.ptr == ffi.NULL:
        return ""
    return ffi.unpack(s.ptr, s.len).decode("utf-8", "replace")


def to_bytes(s) -> bytes:
    if s.ptr == ffi.NULL:
        return b""
    return ffi.unpack(s.ptr, s.len)


def build_info() -> str:
    return ffi.string(lib.rm_build_info()).decode()

"""Exceptions raised by rapidmoe_gguf; every one is a RapidMoEError."""


class RapidMoEError(Exception):
    """Base class. ``status`` is the C status name (e.g. ``"RM_E_FORMAT"``) when the error came
    from the native library, else None."""

    def __init__(self, message: str, status: str | None = None):
        super().__init__(message)
        self.status = status


class FormatError(RapidMoEError):
    """A malformed file or inconsistent data (a corrupt GGUF, a truncated safetensors, ...)."""


class UnsupportedError(RapidMoEError):
    """A type, architecture or feature this build does not handle."""


class InvalidArgumentError(RapidMoEError, ValueError):
    """A bad argument from the caller."""


class InternalError(RapidMoEError):
    """A fault of this library or server itself, not of the caller's input: the native library's
    RM_E_INTERNAL, a step of the server's scheduler that failed."""


class DeviceError(RapidMoEError):
    """A GPU's error (the native library's RM_E_CUDA), or no usable GPU where one was needed."""


class OutOfMemoryError(RapidMoEError, MemoryError):
    """An allocation that failed (the native library's RM_E_OOM; a device budget exceeded). A
    MemoryError too."""


class UnavailableError(RapidMoEError):
    """The server cannot take the request now (it is shutting down)."""


class StateError(RapidMoEError):
    """A call that the object's state does not allow; the subclasses say which state."""


class ContextFullError(StateError):
    """The session's context (KV cache) cannot hold the tokens asked for."""


class NoResidualError(StateError):
    """A residual policy or calibration asked of a model loaded without its residual sidecar."""


class NeedsCPUError(StateError):
    """A call that runs on the CPU backend only (calibration) made on a session on a device."""


class NotCalibratingError(StateError):
    """A read of what is recorded only while calibrating (the route log), with calibration off."""


class NoBudgetError(StateError):
    """A budget adjustment (residual_budget="auto") asked of a policy without a budget (none, all)."""

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


class ContextFullError(RapidMoEError):
    """The session's context (KV cache) cannot hold the tokens asked for."""

"""rapidmoe_gguf: run Mixture-of-Experts LLMs from GGUF files with RESplit experts."""

from .convert import ConvertReport, convert
from .errors import (
    ContextFullError,
    FormatError,
    InvalidArgumentError,
    RapidMoEError,
    UnsupportedError,
)

__version__ = "0.1.0"

__all__ = [
    "ConvertReport",
    "ContextFullError",
    "FormatError",
    "InvalidArgumentError",
    "RapidMoEError",
    "UnsupportedError",
    "__version__",
    "convert",
]

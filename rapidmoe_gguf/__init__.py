"""rapidmoe_gguf: run Mixture-of-Experts LLMs from GGUF files with RESplit experts."""

from .errors import (
    ContextFullError,
    FormatError,
    InvalidArgumentError,
    RapidMoEError,
    UnsupportedError,
)
from .tokenizer import IncrementalDecoder, Tokenizer

__version__ = "0.1.0"

__all__ = [
    "ContextFullError",
    "FormatError",
    "IncrementalDecoder",
    "InvalidArgumentError",
    "RapidMoEError",
    "Tokenizer",
    "UnsupportedError",
    "__version__",
]

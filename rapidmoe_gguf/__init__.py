"""rapidmoe_gguf: run Mixture-of-Experts LLMs from GGUF files with RESplit experts."""

from .convert import ConvertReport, convert
from .convert.imatrix import compute_imatrix, read_imatrix
from .errors import (
    ContextFullError,
    FormatError,
    InvalidArgumentError,
    NeedsCPUError,
    NoBudgetError,
    NoResidualError,
    NotCalibratingError,
    RapidMoEError,
    StateError,
    UnsupportedError,
)
from .gguf_file import GGUFFile, open_gguf
from .kernels import cpu_isa, cpu_isa_reason
from .model import Model, SamplingParams, eval_batch
from .planner import Hardware, Plan, PlanError
from .tokenizer import IncrementalDecoder, Tokenizer

__version__ = "0.1.0"

__all__ = [
    "ConvertReport",
    "ContextFullError",
    "FormatError",
    "GGUFFile",
    "Hardware",
    "IncrementalDecoder",
    "InvalidArgumentError",
    "Model",
    "NeedsCPUError",
    "NoBudgetError",
    "NoResidualError",
    "NotCalibratingError",
    "Plan",
    "PlanError",
    "RapidMoEError",
    "SamplingParams",
    "StateError",
    "Tokenizer",
    "UnsupportedError",
    "__version__",
    "compute_imatrix",
    "convert",
    "cpu_isa",
    "cpu_isa_reason",
    "eval_batch",
    "open_gguf",
    "read_imatrix",
]

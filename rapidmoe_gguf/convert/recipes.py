"""Conversion recipes: which ggml type each kind of tensor gets.

A recipe names the expert base type, the expert residual type (or none) and the type of the other
matrices. Whatever the recipe, 1-D tensors (norms, biases, the shared-expert gate) and the router
``ffn_gate_inp`` stay F32, as llama.cpp keeps them. A type whose block does not divide a tensor's
row length (``ne[0]``) falls back along ``FALLBACK`` until one fits: K-quants and the IQ types
(256-element blocks) to a 32-block type of similar precision, 32-block types to F16.
"""

from __future__ import annotations

import dataclasses

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, LlamaFileType

from ..errors import InvalidArgumentError

# Types the converter writes (rapidmoe_gguf.quants quantizes all of them).
TYPES = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
         "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "MXFP4", "IQ2_XXS", "IQ3_XXS")

FALLBACK = {
    "Q2_K": "Q4_0", "Q3_K": "Q4_0", "Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0",
    "Q4_0": "F16", "Q4_1": "F16", "Q5_0": "F16", "Q5_1": "F16", "Q8_0": "F16", "MXFP4": "F16",
    "IQ2_XXS": "Q4_0", "IQ3_XXS": "Q4_0",
}

# general.file_type describes the bulk of the weights, which in an MoE are the experts.
FILE_TYPE = {
    "F32": LlamaFileType.ALL_F32, "F16": LlamaFileType.MOSTLY_F16, "BF16": LlamaFileType.MOSTLY_BF16,
    "Q4_0": LlamaFileType.MOSTLY_Q4_0, "Q4_1": LlamaFileType.MOSTLY_Q4_1,
    "Q5_0": LlamaFileType.MOSTLY_Q5_0, "Q5_1": LlamaFileType.MOSTLY_Q5_1,
    "Q8_0": LlamaFileType.MOSTLY_Q8_0, "Q2_K": LlamaFileType.MOSTLY_Q2_K,
    "Q3_K": LlamaFileType.MOSTLY_Q3_K_S, "Q4_K": LlamaFileType.MOSTLY_Q4_K_S,
    "Q5_K": LlamaFileType.MOSTLY_Q5_K_S, "Q6_K": LlamaFileType.MOSTLY_Q6_K,
    "MXFP4": LlamaFileType.MOSTLY_MXFP4_MOE,
    "IQ2_XXS": LlamaFileType.MOSTLY_IQ2_XXS, "IQ3_XXS": LlamaFileType.MOSTLY_IQ3_XXS,
}


def block_size(type_name: str) -> int:
    return GGML_QUANT_SIZES[GGMLQuantizationType[type_name]][0]


def bits_per_weight(type_name: str) -> float:
    block, nbytes = GGML_QUANT_SIZES[GGMLQuantizationType[type_name]]
    return 8.0 * nbytes / block


def is_quantized(type_name: str) -> bool:
    return type_name not in ("F32", "F16", "BF16")


def type_name(name: str, what: str = "type") -> str:
    """Normalise a user-given type name ("q4_k" -> "Q4_K") and check that we can write it."""
    t = name.strip().upper()
    if t not in TYPES:
        raise InvalidArgumentError(f"{what} '{name}' is not supported; choose one of {', '.join(TYPES)}")
    return t


def fit_type(wanted: str, row_len: int) -> str:
    """The first type along the fallback chain whose block divides ``row_len``."""
    t = wanted
    while row_len % block_size(t):
        t = FALLBACK[t]
    return t


@dataclasses.dataclass(frozen=True)
class Recipe:
    name: str
    base_type: str                 # expert tensors (the whole weight when there is no residual)
    residual_type: str | None      # expert residuals; None writes no sidecar
    other_type: str                # other matrices: attention, embeddings, output, shared experts
    description: str = ""

    @property
    def bits_base(self) -> float:
        return bits_per_weight(self.base_type)

    @property
    def bits_total(self) -> float:
        return self.bits_base + (bits_per_weight(self.residual_type) if self.residual_type else 0.0)


RECIPES: dict[str, Recipe] = {r.name: r for r in (
    Recipe("q4k-q8", "Q4_K", "Q8_0", "Q8_0", "4.5-bit base, 8.5-bit residual: near-lossless pair"),
    Recipe("q3k-q8", "Q3_K", "Q8_0", "Q8_0", "3.4-bit base, 8.5-bit residual"),
    Recipe("q2k-q4", "Q2_K", "Q4_0", "Q8_0", "2.6-bit base, 4.5-bit residual: smallest base"),
    Recipe("q4_0-q4_0", "Q4_0", "Q4_0", "Q8_0", "32-block types only (any width a multiple of 32)"),
    Recipe("f32", "F32", None, "F32", "exact, no residual (testing and reference)"),
    Recipe("f16", "F16", None, "F16", "half precision, no residual"),
    Recipe("q8_0", "Q8_0", None, "Q8_0", "8.5-bit, no residual"),
    # MXFP4 (gpt-oss's released experts). From an MXFP4 source the reference is MXFP4 itself:
    # "mxfp4" copies its experts unchanged (llama.cpp's MXFP4_MOE layout), "q3k-q8" and "q2k-q8"
    # split them into a small base and a residual that restores them within Q8_0 error.
    Recipe("mxfp4", "MXFP4", None, "Q8_0", "4.25-bit MXFP4 experts, no residual (an MXFP4 source is copied)"),
    Recipe("mxfp4-q8", "MXFP4", "Q8_0", "Q8_0", "4.25-bit MXFP4 base, 8.5-bit residual"),
    Recipe("q2k-q8", "Q2_K", "Q8_0", "Q8_0", "2.6-bit base, 8.5-bit residual (for MXFP4 sources)"),
    # Codebook bases (rows a multiple of 256); their quantizer weighs its error by an importance
    # matrix when the conversion is given one (--imatrix).
    Recipe("iq2xxs-q4", "IQ2_XXS", "Q4_K", "Q8_0", "2.06-bit codebook base, 4.5-bit residual"),
    Recipe("iq3xxs-q8", "IQ3_XXS", "Q8_0", "Q8_0", "3.06-bit codebook base, 8.5-bit residual"),
)}


def resolve_recipe(name: str = "q4k-q8", *, base_type: str | None = None,
                   residual_type: str | None = None, other_type: str | None = None) -> Recipe:
    """A recipe from the table with optional overrides; ``residual_type="none"`` drops the residual."""
    r = RECIPES.get(name)
    if r is None:
        raise InvalidArgumentError(f"unknown recipe '{name}'; choose one of {', '.join(RECIPES)}")
    changes: dict[str, object] = {}
    if base_type is not None:
        changes["base_type"] = type_name(base_type, "base type")
    if residual_type is not None:
        changes["residual_type"] = (None if residual_type.strip().lower() == "none"
                                    else type_name(residual_type, "residual type"))
    if other_type is not None:
        changes["other_type"] = type_name(other_type, "other type")
    new = dataclasses.replace(r, **changes)
    if new != r:  # the label written to rapidmoe.recipe says what was overridden
        label = f"{r.name}[base={new.base_type},residual={new.residual_type or 'none'},other={new.other_type}]"
        new = dataclasses.replace(new, name=label)
    return new

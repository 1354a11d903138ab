"""The small MoE trained by the project and shipped inside the package (see tools/train_tiny_moe.py)."""

from __future__ import annotations

import os

from .errors import RapidMoEError

MODEL_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "models")
BUNDLED_NAME = "tiny-moe.gguf"


def bundled_model_path() -> str:
    path = os.path.join(MODEL_DIR, BUNDLED_NAME)
    if not os.path.isfile(path):
        raise RapidMoEError(f"the bundled model is missing ({path}); give a model path")
    return path


def bundled_heldout_path() -> str:
    return os.path.join(MODEL_DIR, "tiny-moe.heldout.txt")

"""A stand-in for gpuwatch.instrument._facts (written on another branch), for the scripts.

Records what it was asked to describe, in a shape the tests can check.
"""

from __future__ import annotations

import sys
import types
from typing import Any


def install() -> None:
    """Put the stand-in where gpuwatch looks for the facts module."""
    fake = types.ModuleType("gpuwatch.instrument._facts")

    def collect_facts(model: Any, optimizer: Any = None, *, amp_dtype=None, **_: Any):
        return {
            "model": type(model).__name__,
            "params": sum(p.numel() for p in model.parameters()),
            "optimizer": type(optimizer).__name__ if optimizer is not None else None,
            "amp_dtype": str(amp_dtype) if amp_dtype is not None else None,
        }

    def batch_facts(args: tuple, kwargs: dict) -> dict:
        shapes = [list(v.shape) for v in (*args, *kwargs.values()) if hasattr(v, "shape")]
        return {"shape": shapes[0]} if shapes else {}

    fake.collect_facts = collect_facts  # type: ignore[attr-defined]
    fake.batch_facts = batch_facts  # type: ignore[attr-defined]
    sys.modules[fake.__name__] = fake

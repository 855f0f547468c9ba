"""Hugging Face Accelerate: describe what an ``Accelerator`` prepared.

Example:
    >>> model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    >>> gpuwatch.integrations.accelerate.watch(accelerator)

Calls :func:`gpuwatch.watch` with the prepared model (the one the loop calls), the
optimizer inside Accelerate's wrapper and the mixed-precision dtype. Under
``accelerator.accumulate`` the wrapper steps and zeroes the optimizer only on the last
micro-batch, so optimizer.step and zero_grad phases, and gpuwatch's step count, follow
real optimizer steps.
"""

from __future__ import annotations

from typing import Any

from .. import instrument
from ._common import amp_dtype, missing


def watch(accelerator: Any, model: Any = None, optimizer: Any = None) -> Any:
    """Describe the accelerator's (first) prepared model and optimizer to gpuwatch.

    Args:
        accelerator: An ``accelerate.Accelerator`` that has prepared the model.
        model: The prepared model to describe, if not the first one prepared.
        optimizer: Its optimizer (prepared or not), if not the first one prepared.

    Returns:
        The model described.

    Raises:
        ImportError: accelerate is not installed.
        TypeError: ``accelerator`` is not an Accelerator.
        ValueError: No model was given or prepared.
    """
    try:
        import accelerate
    except ImportError:
        raise missing("accelerate", "gpuwatch.integrations.accelerate.watch")
    if not isinstance(accelerator, accelerate.Accelerator):
        raise TypeError(f"expected an accelerate.Accelerator, got {type(accelerator).__name__}")
    if model is None:
        prepared = list(getattr(accelerator, "_models", []))
        if not prepared:
            raise ValueError("prepare the model with accelerator.prepare() first, or pass it")
        model = prepared[0]
    if optimizer is None:
        prepared = list(getattr(accelerator, "_optimizers", []))
        optimizer = prepared[0] if prepared else None
    inner = getattr(optimizer, "optimizer", optimizer)  # AcceleratedOptimizer wraps the real one
    return instrument.watch(model, inner, amp_dtype=amp_dtype(accelerator.mixed_precision))


__all__ = ["watch"]

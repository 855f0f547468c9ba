"""Hugging Face transformers: a ``TrainerCallback``.

Example:
    >>> from gpuwatch.integrations.transformers import GpuwatchCallback
    >>> trainer = Trainer(model=model, args=args, callbacks=[GpuwatchCallback()], ...)

At the start of training it calls :func:`gpuwatch.watch` with the Trainer's model and
optimizer (facts, automatic phases: forward, backward, optimizer.step, zero_grad, eval,
data), keeps gpuwatch's step equal to ``state.global_step``, and marks evaluations and
checkpoints.
"""

from __future__ import annotations

from typing import Any

from .. import instrument
from ._common import amp_dtype, mark_metrics, missing

try:
    from transformers import TrainerCallback as _Base
except ImportError:  # optional: the error comes when the callback is made
    _Base = object  # type: ignore[assignment,misc]


class GpuwatchCallback(_Base):
    """Reports a transformers ``Trainer`` run to gpuwatch.

    Raises:
        ImportError: transformers is not installed.
    """

    def __init__(self) -> None:
        if _Base is object:
            raise missing("transformers", "GpuwatchCallback")
        super().__init__()

    def on_train_begin(
        self,
        args: Any,
        state: Any,
        control: Any,
        model: Any = None,
        optimizer: Any = None,
        **kw: Any,
    ) -> None:
        if model is not None:
            precision = "bf16" if getattr(args, "bf16", False) else "fp16" if args.fp16 else ""
            instrument.watch(
                model,
                optimizer,
                amp_dtype=amp_dtype(precision),
                checkpointing=_checkpointing(args),
            )
        instrument.step(state.global_step)

    def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        instrument.step(state.global_step)

    def on_evaluate(
        self, args: Any, state: Any, control: Any, metrics: dict[str, Any] | None = None, **kw: Any
    ) -> None:
        mark_metrics(f"evaluation at step {state.global_step}", metrics)

    def on_save(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        instrument.mark(f"checkpoint saved at step {state.global_step}")

    def on_train_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        instrument.mark(f"training ended at step {state.global_step}")


def _checkpointing(args: Any) -> bool:
    """The Trainer's checkpointing flag (transformers 5 renamed it; the old name goes in 6)."""
    for name in ("activation_checkpointing", "gradient_checkpointing"):
        flag = getattr(args, name, None)
        if flag is not None:
            return bool(flag)
    return False


__all__ = ["GpuwatchCallback"]

"""PyTorch Lightning: a ``Callback`` for ``lightning.pytorch`` (or ``pytorch_lightning``).

Example:
    >>> from gpuwatch.integrations.lightning import GpuwatchCallback
    >>> trainer = L.Trainer(callbacks=[GpuwatchCallback()])

At fit start it calls :func:`gpuwatch.watch` with the LightningModule, its optimizer and
precision, and installs the automatic phases with module discovery (``training_step``
often calls submodules, not the LightningModule itself). Lightning steps its optimizers
with a closure that runs the forward and backward; the automatic optimizer.step phase
begins when that closure returns, so forward, backward and optimizer.step stay apart. The
callback keeps gpuwatch's step equal to ``trainer.global_step``, takes the batch shape from
the first training batch, marks validation results and checkpoints, and reports an OOM
that Lightning caught.

Use :class:`PytorchLightningCallback` with the older ``pytorch_lightning`` package.
"""

from __future__ import annotations

from typing import Any

from .. import instrument
from ._common import amp_dtype, mark_metrics, missing, report_exception

try:
    from lightning.pytorch import Callback as _Base
except ImportError:  # optional: the error comes when the callback is made
    _Base = object  # type: ignore[assignment,misc]
try:
    from pytorch_lightning import Callback as _PLBase
except ImportError:
    _PLBase = object  # type: ignore[assignment,misc]


class _Hooks:
    """The callback's behaviour, shared by both packages' Callback base classes."""

    _package = "lightning"
    _batch_seen = False

    def _check(self, base: type) -> None:
        if base is object:
            raise missing(self._package, type(self).__name__)

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        optimizers = list(getattr(trainer, "optimizers", None) or [])
        instrument.watch(
            pl_module,
            optimizers[0] if len(optimizers) == 1 else None,
            amp_dtype=amp_dtype(getattr(trainer, "precision", "")),
        )
        instrument.auto_phases(discover=True)
        instrument.step(trainer.global_step)

    def on_train_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int
    ) -> None:
        instrument.step(trainer.global_step)
        if not self._batch_seen:
            self._batch_seen = True
            if isinstance(batch, dict):
                instrument.describe_batch((), batch)
            else:
                instrument.describe_batch(
                    tuple(batch) if isinstance(batch, (list, tuple)) else (batch,), {}
                )

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        if not getattr(trainer, "sanity_checking", False):
            mark_metrics(f"validation at step {trainer.global_step}", trainer.callback_metrics)

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: Any) -> None:
        instrument.mark(f"checkpoint saved at step {trainer.global_step}")

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        report_exception(exception)


class GpuwatchCallback(_Hooks, _Base):
    """Reports a ``lightning.pytorch`` Trainer run to gpuwatch.

    Raises:
        ImportError: lightning is not installed.
    """

    def __init__(self) -> None:
        self._check(_Base)
        super().__init__()


class PytorchLightningCallback(_Hooks, _PLBase):
    """The same for the ``pytorch_lightning`` package (its Trainer wants its own Callback).

    Raises:
        ImportError: pytorch_lightning is not installed.
    """

    _package = "pytorch_lightning"

    def __init__(self) -> None:
        self._check(_PLBase)
        super().__init__()


__all__ = ["GpuwatchCallback", "PytorchLightningCallback"]

"""``gpuwatch.plan(...)`` in a cell: ``gpuwatch estimate``'s answer as a rich display."""

from __future__ import annotations

import html
from typing import Any

from ..predict import EstimateError, Result, estimate, options_from_keywords, table


class PlanResult:
    """An estimate: shown as ``gpuwatch estimate`` prints it; its figures in ``result``.

    Attributes:
        result: What ``gpuwatch estimate --json`` prints (peak, phases, fit, changes, ...).
        text: The printed table.
    """

    def __init__(self, result: Result, text: str) -> None:
        self.result = result
        self.text = text

    @property
    def peak_bytes(self) -> int:
        """The highest phase peak per rank."""
        return int(self.result["peak_bytes"])

    @property
    def fits(self) -> bool | None:
        """Whether it fits the GPUs given (None when none were given, or when the
        activations are unknown and the rest fits)."""
        fit = self.result.get("fit")
        return None if fit is None or fit["fits"] is None else bool(fit["fits"])

    def __repr__(self) -> str:
        return self.text

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(self.text)

    def _repr_html_(self) -> str:
        return f'<pre class="gpuwatch-plan">{html.escape(self.text)}</pre>'


def plan(**options: Any) -> PlanResult:
    """Predict memory per phase before running: ``gpuwatch estimate`` with keywords.

    Each keyword is an option of ``gpuwatch estimate`` (``--`` dropped, ``-`` as ``_``);
    ``True`` gives a switch, anything else its value.

    Example:
        >>> gpuwatch.plan(config="falcon-40b.json", gpus="4xA100-80GB", layout="fsdp",
        ...               lora_rank=16, batch=4, seq=2048)

    Raises:
        ValueError: An option is wrong or the model cannot be read (one line, as the CLI).
    """
    try:
        result = estimate(options_from_keywords(options))
    except EstimateError as exc:
        raise ValueError(f"gpuwatch.plan: {exc}") from None
    return PlanResult(result, table(result))

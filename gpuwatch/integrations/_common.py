"""What the integrations share: precision names, marks, OOM reports."""

from __future__ import annotations

import sys
from typing import Any

from .. import instrument


def amp_dtype(precision: Any) -> Any:
    """torch's dtype for a framework's mixed-precision name (``bf16-mixed``, ``fp16``), or None."""
    torch = sys.modules.get("torch")
    text = str(precision).lower()
    if torch is None or "true" in text:  # Lightning's "bf16-true": no autocast, bf16 weights
        return None
    if "bf16" in text:
        return torch.bfloat16
    if "16" in text:
        return torch.float16
    return None


def mark_metrics(title: str, metrics: dict[str, Any] | None) -> None:
    """A mark with a few numeric metrics, e.g. ``evaluation: eval_loss 1.234``."""
    parts = []
    for key, value in (metrics or {}).items():
        try:
            parts.append(f"{key} {float(value):.4g}")
        except (TypeError, ValueError):
            continue
    instrument.mark(f"{title}: {', '.join(parts[:6])}" if parts else title)


def report_exception(exc: BaseException) -> None:
    """Hand an out-of-memory error the framework caught to the OOM forensics (once)."""
    instrument.report_oom(exc)


def missing(package: str, what: str) -> ImportError:
    return ImportError(f"{what} needs the {package!r} package: pip install {package}")

"""An estimate as ``gpuwatch estimate`` and ``gpuwatch.plan`` print it."""

from __future__ import annotations

from ..fmt import fmt_bytes
from ._estimate import Fit, Result
from ._graph import CATEGORIES
from ._predict import PHASES

_WIDTH = 16
"""Each phase's column."""

_WITH_ACTIVATIONS = ("forward", "backward", "eval")
"""The phases whose total holds the activations (a lower bound where they are unknown)."""


def table(result: Result) -> str:
    """The bytes per category at each phase's peak, what was assumed, and the fit."""
    phases = result["phases"]
    width = max(len(c) for c in CATEGORIES) + 2
    ranks = (
        f" on each of {result['world_size']} ranks ({result['parallel']}),"
        if result["world_size"] > 1
        else ""
    )
    lines = [
        f"{result['parameters']:,} parameters ({result['trainable_parameters']:,} trainable);"
        + ranks
        + " bytes at each phase's peak, steps after the first:",
        "",
        "".ljust(width) + "".join(ph.rjust(_WIDTH) for ph in PHASES),
    ]
    for cat in CATEGORIES:
        if cat not in CATEGORIES[:6] and not any(phases[ph].get(cat) for ph in PHASES):
            continue  # a parallel layout's buffers: none on one GPU
        if cat == "activations" and not result["activations_known"]:
            cells = "".join("unknown".rjust(_WIDTH) for _ in PHASES)
        else:
            cells = "".join(fmt_bytes(phases[ph].get(cat, 0)).rjust(_WIDTH) for ph in PHASES)
        lines.append(cat.replace("_", " ").ljust(width) + cells)
    known = result["activations_known"]
    totals = "".join(
        (
            ("" if known or ph not in _WITH_ACTIVATIONS else ">= ")
            + fmt_bytes(sum(phases[ph].values()))
        ).rjust(_WIDTH)
        for ph in PHASES
    )
    lines.append("total".ljust(width) + totals)
    lines.append("")
    least = "" if known else "at least "
    unknown = "" if known else " (activations unknown: give a shape, --config or --trace)"
    lines.append(
        f"peak: {least}{fmt_bytes(result['peak_bytes'])} in {result['peak_phase']}{unknown}"
    )
    lines.extend(f"assumed: {a}" for a in result["assumed"])
    lines.extend(f"note: {n}" for n in result["notes"])
    if "fit" in result:
        lines += ["", *fit_lines(result["fit"], result["parallel"])]
    return "\n".join(lines)


def fit_lines(fit: Fit, parallel: str) -> list[str]:
    """The answer, in a few lines: fits or not, why, and what would make it fit."""
    where = f"{fit['gpus']} x {fit['gpu']}" + (
        f" x {fit['nodes']} nodes" if fit["nodes"] > 1 else ""
    )
    layout = parallel if parallel != "none" else "one GPU"
    phase = fit["deciding_phase"] + (" (first step)" if fit["deciding_first_step"] else "")
    if fit["fits"] is None:
        verdict = (
            f"CANNOT SAY: the rest needs {fmt_bytes(fit['peak_bytes'])} per rank and fits;"
            " the activations are unknown (give a shape, --config or --trace)"
        )
    elif fit["fits"]:
        verdict = f"FITS: {fmt_bytes(fit['headroom_bytes'])} to spare per rank"
    else:
        verdict = f"DOES NOT FIT: {fmt_bytes(-fit['headroom_bytes'])} short per rank"
    lines = [
        f"on {where} ({layout}): peak {fmt_bytes(fit['peak_bytes'])} per rank of"
        f" {fmt_bytes(fit['usable_bytes'])}, in {phase}",
        verdict,
    ]
    if fit["max_batch"] is not None:
        most = fit["max_batch"]
        lines.append(
            f"largest micro-batch that fits: {most}" if most else "no micro-batch fits as planned"
        )
    return lines + _change_lines(fit)


def _change_lines(fit: Fit) -> list[str]:
    if not fit["changes"]:
        return []
    fitting = any(c["fits"] for c in fit["changes"])
    lines = [
        "what would make it fit, cheapest first:" if fitting else "closest changes (none fits):"
    ]
    for i, c in enumerate(fit["changes"][:8], 1):
        lines.append(
            f"{i:>2}. {c['change']}: peak {fmt_bytes(c['peak_bytes'])} per rank"
            f" ({fmt_bytes(abs(c['headroom_bytes']))} {'spare' if c['fits'] else 'short'},"
            f" {c['deciding_phase']})  [{c['flags']}]"
        )
        lines.append(f"    cost: {c['cost']}")
    return lines

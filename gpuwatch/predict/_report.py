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

_STEP = "optimizer.step"
"""The phase whose temporaries a parameter count alone may not give."""


def _unknown(result: Result) -> dict[str, set[str]]:
    """The phases each unknown category leaves a lower bound (none where all is known)."""
    out: dict[str, set[str]] = {}
    if not result["activations_known"]:
        out["activations"] = set(PHASES)
    if not result.get("step_temporaries_known", True):
        out["temporaries"] = {_STEP}
    return out


def _cell(result: Result, cat: str, ph: str, unknown: dict[str, set[str]]) -> str:
    """One cell of the table: its bytes, or "unknown"."""
    if ph in unknown.get(cat, ()):
        return "unknown"
    return fmt_bytes(result["phases"][ph].get(cat, 0))


def table(result: Result) -> str:
    """The bytes per category at each phase's peak, what was assumed, and the fit."""
    phases = result["phases"]
    unknown = _unknown(result)
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
        cells = "".join(_cell(result, cat, ph, unknown).rjust(_WIDTH) for ph in PHASES)
        lines.append(cat.replace("_", " ").ljust(width) + cells)
    # A total is a lower bound where it holds an unknown part (the activations are none
    # of the step's or zero_grad's, though shown unknown there too).
    bounded = set(unknown.get("temporaries", ()))
    if "activations" in unknown:
        bounded.update(_WITH_ACTIVATIONS)
    totals = "".join(
        (("" if ph not in bounded else ">= ") + fmt_bytes(sum(phases[ph].values()))).rjust(_WIDTH)
        for ph in PHASES
    )
    lines.append("total".ljust(width) + totals)
    lines.append("")
    least = "at least " if unknown else ""
    why = " and ".join(
        {"activations": "activations", "temporaries": "the step's temporaries"}[c] for c in unknown
    )
    why = f" ({why} unknown: give a shape, --config or --trace)" if why else ""
    lines.append(f"peak: {least}{fmt_bytes(result['peak_bytes'])} in {result['peak_phase']}{why}")
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

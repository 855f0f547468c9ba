"""Predicted memory: model facts in, bytes per category and per phase out.

Pure Python (no torch, no numpy): it runs in the dashboard from the facts a training
script sent (``docs/facts.md``), so a replayed recording is predicted anew from its facts.

    >>> p = predict(facts)
    >>> breakdown(p, "backward", first_step=False)      # the breakdown bar at a phase peak
    >>> times, values = predicted_curve(p, spans)       # the predicted line on the timeline
"""

from ._curve import (
    Span,
    SpanPeak,
    breakdown_at,
    curve_points,
    predicted_curve,
    span_peaks,
    spans_from_columns,
)
from ._fit import Answer, Change, answer, max_batch
from ._gpus import GPUS, Gpus, parse_gpus, parse_size
from ._graph import CATEGORIES
from ._plan import LAYOUTS, Plan, RankEstimate, parse_layout, plan_from_facts, rank_estimate
from ._predict import CLIP, PHASES, PhaseMemory, Prediction, breakdown, predict, total
from ._shape import (
    ARCHS,
    IMPLS,
    OPTIMIZERS,
    PRECISIONS,
    ModelShape,
    facts_from_shape,
    parse_lora_targets,
    shape_from_config,
)

__all__ = [
    "ARCHS",
    "CATEGORIES",
    "CLIP",
    "GPUS",
    "IMPLS",
    "LAYOUTS",
    "OPTIMIZERS",
    "PHASES",
    "PRECISIONS",
    "Answer",
    "Change",
    "Gpus",
    "ModelShape",
    "PhaseMemory",
    "Plan",
    "Prediction",
    "RankEstimate",
    "Span",
    "SpanPeak",
    "answer",
    "breakdown",
    "breakdown_at",
    "curve_points",
    "facts_from_shape",
    "max_batch",
    "parse_gpus",
    "parse_layout",
    "parse_lora_targets",
    "parse_size",
    "plan_from_facts",
    "predict",
    "predicted_curve",
    "rank_estimate",
    "shape_from_config",
    "span_peaks",
    "spans_from_columns",
    "total",
]

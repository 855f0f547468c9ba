"""Predicted memory: model facts in, bytes per category and per phase out.

Pure Python (no torch, no numpy; a config's fake-tensor trace imports them when it runs):
it runs in the dashboard from the facts a training script sent (``docs/facts.md``), so a
replayed recording is predicted anew from its facts. ``gpuwatch estimate`` and
``gpuwatch.plan`` ask :func:`estimate` with :class:`Options`.

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
from ._estimate import (
    ChangeRow,
    Fit,
    Result,
    Target,
    changes_from_options,
    estimate,
    fit_of,
    gpus_of,
    plan_result,
    reserve_of,
)
from ._fit import Answer, Change, answer, max_batch
from ._gpus import GPUS, Gpus, parse_gpu_size, parse_gpus
from ._graph import CATEGORIES
from ._options import (
    EstimateError,
    Options,
    options_from_keywords,
    parse_count,
    parse_positive,
    parse_probability,
)
from ._plan import LAYOUTS, Plan, RankEstimate, parse_layout, plan_from_facts, rank_estimate
from ._predict import CLIP, PHASES, PhaseMemory, Prediction, breakdown, predict, total
from ._report import table
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
    "ChangeRow",
    "EstimateError",
    "Fit",
    "Gpus",
    "ModelShape",
    "Options",
    "PhaseMemory",
    "Plan",
    "Prediction",
    "RankEstimate",
    "Result",
    "Span",
    "SpanPeak",
    "Target",
    "answer",
    "breakdown",
    "breakdown_at",
    "changes_from_options",
    "curve_points",
    "estimate",
    "facts_from_shape",
    "fit_of",
    "gpus_of",
    "max_batch",
    "options_from_keywords",
    "parse_count",
    "parse_gpu_size",
    "parse_gpus",
    "parse_layout",
    "parse_lora_targets",
    "parse_positive",
    "parse_probability",
    "plan_from_facts",
    "plan_result",
    "predict",
    "predicted_curve",
    "rank_estimate",
    "reserve_of",
    "shape_from_config",
    "span_peaks",
    "spans_from_columns",
    "table",
    "total",
]

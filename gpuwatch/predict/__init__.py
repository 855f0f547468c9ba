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
from ._graph import (
    ACTIVATIONS,
    AMP_COPIES,
    CATEGORIES,
    GRADIENTS,
    OPTIMIZER_STATE,
    TEMPORARIES,
    WEIGHTS,
)
from ._predict import CLIP, PHASES, PhaseMemory, Prediction, breakdown, predict, total
from ._shape import (
    ARCHS,
    IMPLS,
    OPTIMIZERS,
    PRECISIONS,
    ModelShape,
    facts_from_shape,
    shape_from_config,
)

__all__ = [
    "ACTIVATIONS",
    "AMP_COPIES",
    "ARCHS",
    "CATEGORIES",
    "CLIP",
    "GRADIENTS",
    "IMPLS",
    "OPTIMIZERS",
    "OPTIMIZER_STATE",
    "PHASES",
    "PRECISIONS",
    "TEMPORARIES",
    "WEIGHTS",
    "ModelShape",
    "PhaseMemory",
    "Prediction",
    "Span",
    "SpanPeak",
    "breakdown",
    "breakdown_at",
    "curve_points",
    "facts_from_shape",
    "predict",
    "predicted_curve",
    "shape_from_config",
    "span_peaks",
    "spans_from_columns",
    "total",
]

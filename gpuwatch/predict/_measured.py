"""Activations from measurement: the ``activations`` facts turned into the moments of a step.

The training side counted what autograd saved during the first training forward, module
by module in the order backward will meet them (``gpuwatch/instrument/_activations.py``,
``docs/facts.md``). That is exact for what forward leaves alive; the rest is estimated
from the same figures:

- forward peak: measured too where the training side could (``forward_peak``: the
  running peak of every storage the model's forward made, temporaries that nothing saves
  included, as in a frozen backbone); else, and for a loss computed after the model
  returned, everything saved plus the largest module output, alive at once (in a
  language model the logits, at the loss);
- backward, walking the modules in reverse: each frees what it saved after its backward,
  when its parameters' gradients have appeared; while it runs, the gradient of its output
  and one the size of its largest saved tensor are alive too (at the loss: the gradient of
  the log-probabilities and of the logits), and, under non-reentrant checkpointing, what
  its recomputation recreates (``recompute_bytes``: what the checkpoint's pack hook got);
  a module none of whose outputs required grad (``no_backward``: a frozen layer before any
  trained one) is never reached by backward and adds nothing;
- eval: no saves; its peak is the two largest consecutive module outputs.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ._graph import Moment, Simulation


def _n(v: Any) -> int:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 else 0


def measured_bytes(act: dict[str, Any] | None) -> tuple[int, int] | None:
    """``(saved, amp copies)`` bytes from the ``activations`` facts; None when not measured."""
    if not isinstance(act, dict) or act.get("source") != "measured" or act.get("skipped"):
        return None
    if not isinstance(act.get("bytes"), int):
        return None
    return _n(act.get("bytes")), _n(act.get("amp_copy_bytes"))


def simulate_measured(act: dict[str, Any]) -> Simulation | None:
    """The :class:`Simulation` of a step from measured activations (None: not measured)."""
    got = measured_bytes(act)
    if got is None:
        return None
    saved, amp = got
    modules = [m for m in act.get("modules") or [] if isinstance(m, dict)][:1024]
    grads = sum(_n(m.get("grad_bytes")) for m in modules)
    outs = [_n(m.get("out_bytes")) for m in modules]
    forward_end = Moment(saved=saved, amp=amp)
    # Forward: after each module, what was saved so far and its largest transient.
    forward_peak, done, done_amp, fwd_i = forward_end, 0, 0, len(modules)
    for i, m in enumerate(modules):
        done += _n(m.get("bytes"))
        done_amp += _n(m.get("amp_copy_bytes"))
        temp = max(_n(m.get("out_bytes")), _n(m.get("max_tensor_bytes")))
        now = Moment(saved=min(done, saved), amp=min(done_amp, amp), temp=temp)
        if now.total() > forward_peak.total():
            forward_peak, fwd_i = now, i
    # Backward meets the modules in reverse; each frees its saves once its backward ran.
    alive, alive_amp, made = saved, amp, 0
    peak, peak_i = Moment(saved=alive, amp=alive_amp), 0
    accumulating = Moment(saved=alive, amp=alive_amp)
    for i, m in enumerate(reversed(modules)):
        big = _n(m.get("max_tensor_bytes"))
        g = _n(m.get("grad_bytes"))
        out = _n(m.get("out_bytes"))
        # The gradient of its output and one of its largest save; at the loss (no module
        # output: the model's body, or outside it) the log-probabilities' and the logits'.
        temp = 0 if m.get("no_backward") is True else (out or big) + big
        again = _n(m.get("recompute_bytes"))
        now = Moment(saved=alive + again, amp=alive_amp, temp=temp, grads=made + g)
        if now.total() > peak.total():
            peak, peak_i = now, i
        # Accumulating into existing gradients: only this module's new ones are extra.
        acc = Moment(saved=alive + again, amp=alive_amp, temp=temp, grads=g)
        if acc.total() > accumulating.total():
            accumulating = acc
        alive = max(0, alive - _n(m.get("bytes")))
        alive_amp = max(0, alive_amp - _n(m.get("amp_copy_bytes")))
        made += g
    pairs = [a + b for a, b in zip(outs, [0, *outs][: len(outs)], strict=True)]
    return Simulation(
        forward_peak=forward_peak,
        forward_end=forward_end,
        backward_peak=peak,
        backward_end=Moment(grads=grads),
        eval_peak=Moment(temp=max(pairs, default=0)),
        grad_bytes=grads,
        forward_peak_at=min(1.0, (fwd_i + 1) / max(1, len(modules))),
        backward_peak_at=peak_i / max(1, len(modules)),
        accumulating_peak=accumulating,
    )


def _measured_peak(act: dict[str, Any], key: str) -> tuple[Moment, dict[str, Any]] | None:
    """The running peak ``act[key]`` (``bytes``, ``saved_bytes``, ``amp_copy_bytes``) as a
    :class:`Moment`, with its dict; None when it was not measured."""
    if measured_bytes(act) is None:
        return None
    peak = act.get(key)
    if not isinstance(peak, dict) or _n(peak.get("bytes")) == 0:
        return None
    total = _n(peak.get("bytes"))
    saved = min(_n(peak.get("saved_bytes")), total)
    amp = min(_n(peak.get("amp_copy_bytes")), total - saved)
    return Moment(saved=saved, amp=amp, temp=total - saved - amp), peak


def measured_forward_peak(act: dict[str, Any]) -> tuple[Moment, float] | None:
    """The forward's measured peak (``forward_peak``) as a :class:`Moment` and where in the
    forward it fell (0 to 1); None when it was not measured."""
    got = _measured_peak(act, "forward_peak")
    if got is None:
        return None
    moment, peak = got
    at = peak.get("at")
    where = float(at) if isinstance(at, (int, float)) and 0 <= at <= 1 else 1.0
    return moment, where


def with_forward_peak(sim: Simulation, act: dict[str, Any]) -> Simulation:
    """``sim`` with the forward's measured peak where it is the higher one.

    The measured figure is real memory alive at one moment of the model's forward, so a
    lower estimate is wrong; a higher one stands: a loss computed after the model returned
    (the log-probabilities beside the logits) is outside the measured span, unless that
    span was measured too (``loss_peak``): then the measured figure is the model's own, and
    a higher estimate would count the loss's saved tensors in it (and, where the loop
    keeps its outputs, the old ones beside them: one logits too many).
    """
    got = measured_forward_peak(act)
    if got is None:
        return sim
    if got[0].total() <= sim.forward_peak.total() and measured_loss_peak(act) is None:
        return sim
    return replace(sim, forward_peak=got[0], forward_peak_at=got[1])


def measured_loss_peak(act: dict[str, Any]) -> Moment | None:
    """The running peak from the model's return to backward (``loss_peak``: a loss computed
    outside the model, with what the model made still alive), or None."""
    got = _measured_peak(act, "loss_peak")
    return None if got is None else got[0]

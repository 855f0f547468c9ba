"""What a parallel layout adds to one rank's memory, from the ``parallel`` facts.

The model states are already this rank's (``docs/facts.md``: parameters and optimizer
groups count local shards), so ZeRO's division of the states by the data-parallel degree
(Rajbhandari et al. 2020, section 5) comes from the facts; what is added here are the
buffers each layout makes, each its own category. Sources, per rule:

- DDP (``torch/csrc/distributed/c10d/reducer.cpp``, ``Reducer::initialize_buckets``):
  one flat tensor per bucket, allocated when the wrapper is built and alive as long as
  it is; together they hold every trainable parameter's gradient (``ddp_buckets``, the
  second copy of the gradients the DDP paper describes: Li et al. 2020, "PyTorch
  Distributed", section 3.2.3). With ``gradient_as_bucket_view=True`` each ``.grad`` is a
  view into its bucket (``torch/nn/parallel/distributed.py``, the option's docstring): the
  gradients are the buckets, never a separate copy, and ``zero_grad`` frees nothing.
- FSDP2 (``torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py`` and
  ``_fsdp_param_group.py``), per unit ``i`` of unsharded size ``u_i`` (in the policy's
  param dtype), in forward order:

  - forward: the unit's all-gather output (one flat ``u_i``, ``foreach_all_gather``) is
    copied out into its unsharded parameters (``u_i``, ``foreach_all_gather_copy_out``)
    and kept until the next unit's all-gather is waited on (``all_gather_state``): at
    unit ``i``, ``u_{i-1} + 2 u_i`` (``fsdp_unsharded``). With
    ``reshard_after_forward=False`` the unsharded parameters of every unit run so far
    stay too, until each unit's backward.
  - backward, in reverse: the unit's unsharded parameters (all-gathered again after a
    reshard) and the next unit's prefetched all-gather output (backward prefetch, on by
    default) are ``fsdp_unsharded``; the unit's unsharded gradients and the previous
    unit's reduce-scatter input (the gradients flattened, ``foreach_reduce``, kept in
    ``reduce_scatter_state`` until this unit's reduce-scatter waits) are ``fsdp_reduce``,
    in the reduce dtype.

Layouts not modelled (FSDP1, tensor parallel, a device map) are named in one note; their
states are still this rank's, their buffers are not predicted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..facts import MAX_UNITS

DDP_BUCKETS = "ddp_buckets"
FSDP_UNSHARDED = "fsdp_unsharded"
FSDP_REDUCE = "fsdp_reduce"
LAYOUT_CATEGORIES = (DDP_BUCKETS, FSDP_UNSHARDED, FSDP_REDUCE)

_ELT = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2}


@dataclass
class LayoutMemory:
    """What the layout adds, by category.

    Attributes:
        strategy: ``ddp``, ``fsdp2``, ... or ``none``.
        persistent: Alive in every phase (DDP's buckets).
        forward: Added at the forward peak.
        held: Alive from the end of forward to the backward peak (unsharded parameters
            kept when ``reshard_after_forward=False``).
        backward: Added at the backward peak.
        grads_in_buckets: The gradients are views of DDP's buckets (counted there).
        backward_grads: When set, the backward peak is the layout's (FSDP: at one unit),
            with these gradient bytes (the units done), on what backward began with.
        modelled: False for a layout whose buffers are not predicted.
        notes: One line each.
    """

    strategy: str = "none"
    persistent: dict[str, int] = field(default_factory=dict)
    forward: dict[str, int] = field(default_factory=dict)
    held: dict[str, int] = field(default_factory=dict)
    backward: dict[str, int] = field(default_factory=dict)
    grads_in_buckets: bool = False
    backward_grads: int | None = None
    modelled: bool = True
    notes: list[str] = field(default_factory=list)


def _n(v: Any) -> int:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 else 0


def _fsdp2(fsdp: dict[str, Any], out: LayoutMemory) -> None:
    listed = fsdp.get("unit_list")
    # A recording's facts are hostile: at most MAX_UNITS units (the walk is quadratic).
    units = [
        u for u in (listed if isinstance(listed, list) else [])[:MAX_UNITS] if isinstance(u, dict)
    ]
    sizes = [_n(u.get("unsharded_bytes")) for u in units]
    if not sizes or _n(fsdp.get("units")) > len(sizes):
        out.modelled = False
        out.notes.append("FSDP2 with more units than the facts list: its buffers not predicted")
        return
    reshard = [u.get("reshard_after_forward") is not False for u in units]
    pd, rd = str(fsdp.get("param_dtype")), str(fsdp.get("reduce_dtype"))
    scale = _ELT[rd] / _ELT[pd] if pd in _ELT and rd in _ELT else 1.0
    grads = [round(s * scale) for s in sizes]
    n = len(sizes)
    # Forward, unit by unit: the previous all-gather output, this one, and the unsharded
    # parameters of this unit and of every earlier unit that does not reshard.
    fwd = 0
    kept = 0
    for i, u in enumerate(sizes):
        prev = sizes[i - 1] if i else 0
        fwd = max(fwd, kept + prev + 2 * u)
        if not reshard[i]:
            kept += u
    out.forward[FSDP_UNSHARDED] = fwd
    if kept:
        out.held[FSDP_UNSHARDED] = kept
    # Backward, in reverse: this unit's unsharded parameters (and those still kept), the
    # next one's prefetched all-gather, this unit's unsharded gradients, the previous
    # unit's reduce-scatter input.
    # The sharded gradients of the units already done are alive too.
    shards = [_n(u.get("sharded_bytes")) for u in units]
    best, best_total, done = (0, 0, 0), -1, 0
    for i in range(n - 1, -1, -1):
        unsharded = sizes[i] + sum(sizes[j] for j in range(i) if not reshard[j])
        prefetch = sizes[i - 1] if i and reshard[i - 1] else 0
        reduce = grads[i] + (grads[i + 1] if i + 1 < n else 0)
        if unsharded + prefetch + reduce + done > best_total:
            best, best_total = (
                (unsharded + prefetch, reduce, done),
                unsharded + prefetch + reduce + done,
            )
        done += shards[i]
    out.backward[FSDP_UNSHARDED], out.backward[FSDP_REDUCE], out.backward_grads = best
    if fsdp.get("cpu_offload"):
        out.notes.append("FSDP2 CPU offload: states on the host; all-gathers predicted as usual")


def layout_memory(facts: dict[str, Any]) -> LayoutMemory:
    """The layout's buffers for the facts' ``parallel`` part (none when absent)."""
    par = facts.get("parallel")
    if not isinstance(par, dict):
        return LayoutMemory()
    strategy = str(par.get("strategy") or "none")[:16]
    out = LayoutMemory(strategy=strategy)
    params = facts.get("params")
    params = params if isinstance(params, dict) else {}
    if strategy == "ddp":
        ddp = par.get("ddp") if isinstance(par.get("ddp"), dict) else {}
        out.persistent[DDP_BUCKETS] = _n(params.get("trainable_bytes"))
        out.grads_in_buckets = bool(ddp.get("gradient_as_bucket_view"))
    elif strategy == "fsdp2" and isinstance(par.get("fsdp"), dict):
        _fsdp2(par["fsdp"], out)
    elif strategy in ("fsdp1", "tp", "device_map", "fsdp2"):
        out.modelled = False
        out.notes.append(
            f"parallel layout {strategy} not modelled: states are this rank's, its"
            " communication buffers are not predicted (the measured line is the truth)"
        )
    return out

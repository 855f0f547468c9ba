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
  - the root's unit (``_fsdp_state.py``: the root's pre-forward and post-backward) is
    gathered first and stays unsharded while the root's forward runs, so through every
    other unit and through a loss the model computes itself (a Hugging Face model given
    labels); ``fully_shard``'s own policy never reshards it after forward (the root's
    lazy init), so it stays into backward, where it is reduced last.

  Each unit's moment is set on the phase's own figures with the share of the
  activations alive at that unit (saved by the units before it in forward, not yet
  freed in backward, counted evenly per unit), and the phase's peak is the highest of
  those moments and of the model's own peak (the loss; an LM head's logits gradient)
  with what is unsharded there.

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
        backward: Added at the backward peak of the model's own walk (its start, for
            FSDP: an LM head's logits gradient).
        grads_in_buckets: The gradients are views of DDP's buckets (counted there).
        forward_units: FSDP's moments in forward, one per unit's all-gather: the share
            of forward's activations saved by then, and the unsharded bytes alive.
        backward_units: FSDP's moments in backward, one per unit: the share of the
            activations not yet freed, the gradient shards done, the unsharded
            parameters and the gradients being reduced.
        modelled: False for a layout whose buffers are not predicted.
        notes: One line each.
    """

    strategy: str = "none"
    persistent: dict[str, int] = field(default_factory=dict)
    forward: dict[str, int] = field(default_factory=dict)
    held: dict[str, int] = field(default_factory=dict)
    backward: dict[str, int] = field(default_factory=dict)
    grads_in_buckets: bool = False
    forward_units: list[tuple[float, int]] = field(default_factory=list)
    backward_gathered: list[int] = field(default_factory=list)
    backward_units: list[tuple[float, int, int, int]] = field(default_factory=list)
    modelled: bool = True
    notes: list[str] = field(default_factory=list)


def _n(v: Any) -> int:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 else 0


ROOT = "(root)"
"""The name ``_layout`` gives the unit of the model's root module."""


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
    shards = [_n(u.get("sharded_bytes")) for u in units]
    n = len(sizes)
    # The root's unit is unsharded by the root's pre-forward and stays so while its
    # forward runs: through every other unit, and through the loss where the model
    # computes it (Hugging Face models given labels); in backward it is gathered first
    # and reduced last (``_fsdp_state.py``, the root's pre-forward and post-backward).
    has_root = units[0].get("name") == ROOT
    root = sizes[0] if has_root else 0
    inner = list(range(1 if has_root else 0, n))
    m = len(inner)
    kept = [0] * (n + 1)  # kept[i]: unsharded parameters kept by the inner units before i
    for i in range(n):
        kept[i + 1] = kept[i] + (sizes[i] if i in inner and not reshard[i] else 0)
    # Forward, unit by unit: the share of activations saved so far, the root, the units
    # kept, the previous all-gather output and this unit's (output and parameters).
    moments = [(0.0, 2 * root)] if has_root else []
    for k, i in enumerate(inner):
        prev = sizes[i - 1] if i else 0
        moments.append((k / m, root + kept[i] + prev + 2 * sizes[i]))
    out.forward_units = moments
    # At the forward's own peak (the loss, at its end): the root and the units kept.
    if root + kept[n]:
        out.forward[FSDP_UNSHARDED] = root + kept[n]
    held = (0 if reshard[0] else root) if has_root else 0
    if held + kept[n]:
        out.held[FSDP_UNSHARDED] = held + kept[n]
    # Backward, unit by unit in reverse: the activations not yet freed, the sharded
    # gradients of the units done; this unit's parameters (with the root and the units
    # kept) and the next one's prefetched all-gather; this unit's unsharded gradients
    # and the previous unit's reduce-scatter input (``fsdp_reduce``).
    done = 0
    walk: list[tuple[float, int, int, int]] = []
    for k in range(m - 1, -1, -1):
        i = inner[k]
        prefetch = sizes[i - 1] if k and reshard[i - 1] else 0
        unsharded = root + kept[i] + sizes[i] + prefetch
        reduce = grads[i] + (grads[inner[k + 1]] if k + 1 < m else 0)
        walk.append(((k + 1) / m, done, unsharded, reduce))
        done += shards[i]
    if has_root:  # the root's own gradients, reduced last
        walk.append((0.0, done, root, grads[0] + (grads[inner[0]] if inner else 0)))
    out.backward_units = walk
    # The model's own backward peak (an LM head's logits gradient early, the gradients
    # late) falls inside one unit's computation: what is unsharded there, by position.
    out.backward_gathered = [w[2] for w in walk[:m]] or [root]
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

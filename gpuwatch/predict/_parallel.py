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
    default; over gloo, whose work allocates a flat output of its own as the prefetch is
    issued, two of it: the facts' ``backend``) are ``fsdp_unsharded``; the unit's
    unsharded gradients (of its trainable parameters alone: a LoRA unit's frozen base is
    gathered, never reduced) and the previous unit's reduce-scatter input (the gradients
    flattened, ``foreach_reduce``, kept in ``reduce_scatter_state`` until this unit's
    reduce-scatter waits) are ``fsdp_reduce``, in the reduce dtype.
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

- DeepSpeed ZeRO (``deepspeed/runtime/zero/``; Rajbhandari et al. 2020, section 5): the
  weights and the optimizer states in the facts are already this rank's (the optimizer
  steps the partitions, stage 3's parameters are their ``ds_tensor`` partitions), so
  what is added is:

  - ``zero_master``: the fp32 master copy of this rank's partition, alive from
    ``deepspeed.initialize`` on (``stage_1_and_2.py``: ``single_partition_of_fp32_groups``,
    cloned even in fp32; ``stage3.py``: ``_create_fp32_partitions``, a copy unless the
    partition is fp32 already), read from the live tensors (``master_bytes``).
  - ``zero_buckets``: the contiguous gradient buckets of ``reduce_bucket_size`` elements
    in the gradients' dtype while backward runs, two with ``overlap_comm`` (stage 1/2:
    ``setup_buckets`` at the first gradient, released by ``_release_ipg_buffers`` in the
    backward's epilogue; stage 3: one per dtype, made at construction and kept).
  - gradients: stage 1/2 end each backward with this rank's flat partition
    (``independent_gradient_partition_epilogue``: ``averaged_gradients``, the model's own
    ``.grad`` cleared) until the step frees it; stage 1 holds the model's whole gradients
    through backward, stage 2 reduces them bucket by bucket into ``grads_in_partition``
    (``copy_grads_in_partition``). Stage 3 reduces into ``grad_partitions_flat_buffer``,
    made at construction and kept. So from the backward's end, and under stage 3 always,
    the gradients are the partition (``partition_numel`` elements, or the buffer's
    bytes). Stage 1 (without ``overlap_comm``) reduces after autograd
    (``reduce_gradients``), walking the parameters in order: each gradient moves into
    the bucket, and the reduction that holds this rank's first parameter makes the
    partition's copy (``grads_in_partition``) while the gradients after it are still
    whole: rank 0's backward ends nearly a partition above the whole gradients
    (``_zero1_copy``), the later ranks' do not.
  - ``zero_gathered`` (stage 3): the parameters all-gathered at the forward's end and the
    backward's start: the coordinator (``partitioned_param_coordinator.py``) releases a
    module's parameters after it runs unless the trace reuses them within
    ``stage3_max_reuse_distance`` elements, which a module's own backward is under the
    default for any model below 2e9 parameters; at least what
    ``stage3_max_live_parameters`` and the prefetch bucket let it fetch ahead, never more
    than the whole model less its persistent parameters (already in the weights)
    (``_zero3_gathered``).
  - stage 3's step flattens the gradient partition into a new fp32 tensor
    (``_prepare_fp32_grad_for_sub_group``) beside the flat buffer: ``gradients`` twice
    over through the inner optimizer's step.

  A coalesced all-gather's flat buffer (``_all_gather_dtype``) lives only until its
  handle's ``wait`` has copied the parameters out (``torch.cat``), and the parameters
  gathered at construction (``_zero_init_param``'s broadcast) are freed by the
  partitioning: neither stays. (On the CPU, gloo's worker thread, when it lets go of a
  collective after the caller, made those frees where torch.profiler did not see them:
  a truth that read a few such buffers above every phase, at random, until
  ``tests/support/profmem.py`` waited for the worker: ``settle_collectives``.)
  Offload (``offload_optimizer``, ``offload_param``) is not modelled: one note says so.

- FSDP1 (``FullyShardedDataParallel``), FULL_SHARD and SHARD_GRAD_OP: each flat parameter
  a unit, walked as FSDP2's (``_fsdp1``); its other strategies are named in one note.

Layouts not modelled (tensor parallel, a device map) are named in one note; their
states are still this rank's, their buffers are not predicted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..facts import MAX_UNITS, fact_int

DDP_BUCKETS = "ddp_buckets"
FSDP_UNSHARDED = "fsdp_unsharded"
FSDP_REDUCE = "fsdp_reduce"
ZERO_MASTER = "zero_master"
ZERO_BUCKETS = "zero_buckets"
ZERO_GATHERED = "zero_gathered"
LAYOUT_CATEGORIES = (
    DDP_BUCKETS,
    FSDP_UNSHARDED,
    FSDP_REDUCE,
    ZERO_MASTER,
    ZERO_BUCKETS,
    ZERO_GATHERED,
)

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
        grad_bytes: The gradients this rank keeps from the end of backward to the step's
            end, where the layout partitions them (ZeRO); None: the model's own.
        grads_from_start: ``grad_bytes`` is a buffer made with the layout and kept
            (ZeRO-3); else the step frees it.
        grads_reduced_early: Backward reduces the gradients into ``grad_bytes`` as it
            goes (ZeRO-2/3), so they never exceed it there.
        grads_copy: ZeRO-1 at the backward's end: the gradients the rank's partition
            copy adds over the model's own (whole) gradients where it is made.
        step_grads: ZeRO-3: the fp32 gradient copy alive through the optimizer's step.
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
    grad_bytes: int | None = None
    grads_from_start: bool = False
    grads_reduced_early: bool = False
    grads_copy: int = 0
    step_grads: int = 0
    forward_units: list[tuple[float, int]] = field(default_factory=list)
    backward_gathered: list[int] = field(default_factory=list)
    backward_units: list[tuple[float, int, int, int]] = field(default_factory=list)
    modelled: bool = True
    notes: list[str] = field(default_factory=list)


def _n(v: Any) -> int:
    return max(fact_int(v), 0)


ROOT = "(root)"
"""The name ``_layout`` gives the unit of the model's root module."""


def _trainable(unit: dict[str, Any], key: str) -> int:
    """A unit's ``key`` bytes that get gradients: its ``trainable_`` figure (a LoRA unit's
    frozen base is gathered but never reduced), or all of them in facts without it."""
    own = unit.get(f"trainable_{key}")
    return min(_n(own), _n(unit.get(key))) if own is not None else _n(unit.get(key))


FSDP1_MODELLED = ("FULL_SHARD", "SHARD_GRAD_OP")
"""FSDP1's sharding strategies whose buffers are predicted (as FSDP2's units)."""


def _fsdp1(fsdp: dict[str, Any], out: LayoutMemory) -> None:
    """FSDP1 (``FullyShardedDataParallel``): each flat parameter a unit, walked as FSDP2's.

    ``_runtime_utils.py``: a unit's flat parameter is all-gathered in its pre-forward and,
    under FULL_SHARD, freed in its post-forward, except the root's
    (``_post_forward_reshard``); SHARD_GRAD_OP keeps every unit from forward to its
    backward. There is no all-gather output apart from the parameters
    (``_all_gather_flat_param`` gathers into ``_full_param_padded``) and no forward
    prefetch by default; what a unit holds at its all-gather is two of its size, as
    measured with gloo on the CPU. Backward is FSDP2's: the unit, the next one
    prefetched (``BACKWARD_PRE``), its unsharded gradient and the previous reduce-scatter.
    """
    strategy = str(fsdp.get("strategy"))[:32]
    listed = fsdp.get("unit_list")
    if strategy not in FSDP1_MODELLED or not isinstance(listed, list):
        out.modelled = False
        what = "no unit list in the facts" if strategy in FSDP1_MODELLED else strategy
        out.notes.append(
            f"FSDP1 ({what}) not modelled: its all-gathered flat parameters and gradient"
            " reduce-scatter buffers are not predicted, only this rank's shards"
        )
        return
    units = [
        dict(u, reshard_after_forward=strategy == "FULL_SHARD")
        for u in listed
        if isinstance(u, dict)
    ]
    if units and units[0].get("name") == ROOT:
        units[0]["reshard_after_forward"] = False  # the root is never resharded after forward
    _fsdp2(dict(fsdp, unit_list=units), out, copy_out=False)


def _fsdp2(
    fsdp: dict[str, Any], out: LayoutMemory, copy_out: bool = True, loss_inside: bool = False
) -> None:
    """FSDP2's units (see the module's docstring); ``copy_out`` False: FSDP1, whose
    all-gather output is the parameters themselves; ``loss_inside``: the model computes
    its loss (given labels), before the root's forward ends."""
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
    grads = [round(_trainable(u, "unsharded_bytes") * scale) for u in units]
    shards = [_trainable(u, "sharded_bytes") for u in units]
    n = len(sizes)
    # A prefetched all-gather over gloo holds two of its unit: its output and the flat
    # output gloo's work allocates as it is issued (``ProcessGroupGloo``'s
    # ``_allgather_base``), given back only when the work is done; NCCL gathers in place.
    extra = 2 if copy_out and fsdp.get("backend") == "gloo" else 1
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
        prev = sizes[i - 1] if i and copy_out else 0
        moments.append((k / m, root + kept[i] + prev + 2 * sizes[i]))
    out.forward_units = moments
    # At the forward's own peak (the loss, at its end): the root and the units kept, and
    # where the model computes the loss, the last unit's all-gather output, which the
    # root's post-forward frees (``_fsdp_state.py``: ``all_gather_state = None``).
    last = sizes[inner[-1]] if inner and copy_out and loss_inside else 0
    if root + kept[n] + last:
        out.forward[FSDP_UNSHARDED] = root + kept[n] + last
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
        prefetch = extra * sizes[i - 1] if k and reshard[i - 1] else 0
        unsharded = root + kept[i] + sizes[i] + prefetch
        reduce = grads[i] + (grads[inner[k + 1]] if k + 1 < m else 0)
        walk.append(((k + 1) / m, done, unsharded, reduce))
        done += shards[i]
    if has_root:  # the root's own gradients, reduced last
        walk.append((0.0, done, root, grads[0] + (grads[inner[0]] if inner else 0)))
    out.backward_units = walk
    # The model's own backward peak (an LM head's logits gradient early, the gradients
    # late) falls inside one unit's computation: what is unsharded there, by position.
    # The loss's backward comes before the last unit's pre-backward: the root and the
    # units kept are unsharded there, and the last unit's all-gather output where the
    # root's own pre-backward prefetched it: a root with parameters, whose output is the
    # loss (a loss computed outside reaches the root's output only after it).
    first = inner[-1] if m else 0
    ahead = sizes[first] if m and root and reshard[first] and loss_inside else 0
    out.backward_gathered = [root + kept[n] + ahead] + [w[2] for w in walk[1:m]] if m else [root]
    if fsdp.get("cpu_offload"):
        out.notes.append("FSDP2 CPU offload: states on the host; all-gathers predicted as usual")


def _zero(zero: dict[str, Any], params: dict[str, Any], rank: int, out: LayoutMemory) -> None:
    stage = _n(zero.get("stage"))
    if stage not in (1, 2, 3):
        out.modelled = False
        out.notes.append(f"DeepSpeed ZeRO stage {str(zero.get('stage'))[:8]!r} not modelled")
        return
    elt = _ELT.get(str(zero.get("dtype")), 4)
    if zero.get("offload_optimizer") or zero.get("offload_param"):
        out.modelled = False
        out.notes.append(
            "DeepSpeed ZeRO offload not modelled: the states and buffers it moves to the host"
            " are predicted on the device (the measured line is the truth)"
        )
    out.persistent[ZERO_MASTER] = _n(zero.get("master_bytes"))
    buckets = 0
    if zero.get("contiguous_gradients") is not False:
        copies = 2 if zero.get("overlap_comm") and stage < 3 else 1
        buckets = min(_n(zero.get("reduce_bucket_size")), 1 << 40) * elt * copies
    # The gradients' partition: the buffer's own bytes where read (stage 3), else the
    # partition's elements in the dtype (fp32 master gradients without fp16/bf16).
    out.grad_bytes = _n(zero.get("grad_partition_bytes")) or min(
        _n(zero.get("partition_numel")) * elt, _n(params.get("trainable_bytes"))
    )
    out.grads_from_start = stage == 3
    out.grads_reduced_early = stage >= 2
    if stage == 3:
        out.persistent[ZERO_BUCKETS] = buckets
        out.forward[ZERO_GATHERED] = out.backward[ZERO_GATHERED] = _zero3_gathered(zero, elt)
        # The step's fp32 gradient: the partition's gradients flattened into a new
        # tensor (``_prepare_fp32_grad_for_sub_group``) beside the flat buffer they
        # are reduced into, alive through the inner optimizer's step.
        if not zero.get("offload_optimizer"):
            out.step_grads = _n(zero.get("partition_numel")) * 4
    else:
        out.backward[ZERO_BUCKETS] = buckets
        if stage == 1 and buckets and not zero.get("overlap_comm"):
            out.grads_copy = _zero1_copy(zero, params, rank, elt)


REUSE_DISTANCE = 10**9
"""DeepSpeed's default ``stage3_max_reuse_distance`` (elements), for facts without it."""


def _zero3_gathered(zero: dict[str, Any], elt: int) -> int:
    """The parameters ZeRO-3 holds gathered at the forward's end and the backward's start.

    The coordinator (``partitioned_param_coordinator.py``, ``__params_to_release``)
    releases a module's parameters after it runs unless the trace uses them again within
    ``stage3_max_reuse_distance`` elements; a module's backward comes after twice the
    elements of the modules after it, so the forward keeps the model's last half-distance
    gathered (all of a model under the default 1e9) and the module running; what is
    fetched ahead counts against ``stage3_max_live_parameters`` (with the prefetch bucket)
    together with what is kept, so the larger of the two is held. The backward releases
    each module after its own backward: its peak, at the start, holds as much.
    """
    whole = max(_n(zero.get("unsharded_bytes")) - _n(zero.get("persistent_bytes")), 0)
    live = min(_n(zero.get("stage3_max_live_parameters")), 1 << 40) + min(
        _n(zero.get("stage3_prefetch_bucket_size")), 1 << 40
    )
    got = zero.get("stage3_max_reuse_distance")
    reuse = min(_n(got) if type(got) is int else REUSE_DISTANCE, 1 << 40)
    kept = reuse // 2 * elt + _n(zero.get("largest_param_bytes"))
    return min(max(kept, live * elt), whole)


def _zero1_copy(zero: dict[str, Any], params: dict[str, Any], rank: int, elt: int) -> int:
    """What ZeRO-1's gradient copy adds at the backward's end, over the whole gradients.

    ``reduce_gradients`` walks the parameters in order, moving each gradient into the
    bucket (its own tensor freed) and reducing the bucket when the next one does not fit;
    the reduction that holds this rank's first parameter makes ``grads_in_partition``
    (``copy_grads_in_partition``). By then the gradients before this rank's partition and
    that bucket's (at most ``reduce_bucket_size`` elements) are gone, the others not yet:
    on rank 0, nearly the whole partition more than the gradients (to within one
    parameter), on the later ranks nothing.
    """
    whole = _n(params.get("trainable_bytes")) // elt
    copy = _n(zero.get("grads_in_partition_numel")) or _n(zero.get("partition_numel"))
    # Facts without it: the partitions are equal and the first group holds nearly all.
    got = zero.get("grads_before_partition")
    before = _n(got) if type(got) is int else rank * _n(zero.get("partition_numel"))
    freed = min(before + min(_n(zero.get("reduce_bucket_size")), 1 << 40), whole)
    return max(copy - freed, 0) * elt


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
        raw = par.get("ddp")
        ddp = raw if isinstance(raw, dict) else {}
        out.persistent[DDP_BUCKETS] = _n(params.get("trainable_bytes"))
        out.grads_in_buckets = bool(ddp.get("gradient_as_bucket_view"))
    elif strategy == "zero" and isinstance(par.get("zero"), dict):
        _zero(par["zero"], params, _n(par.get("rank")), out)
    elif strategy == "fsdp2" and isinstance(par.get("fsdp"), dict):
        tf, act = facts.get("transformer"), facts.get("activations")
        outside = isinstance(act, dict) and act.get("loss_outside") is True
        inside = isinstance(tf, dict) and str(tf.get("loss") or "inside") == "inside"
        inside = inside and not outside
        _fsdp2(par["fsdp"], out, loss_inside=inside)
    elif strategy == "fsdp1" and isinstance(par.get("fsdp"), dict):
        _fsdp1(par["fsdp"], out)
    elif strategy in ("fsdp1", "tp", "device_map", "fsdp2", "zero"):
        out.modelled = False
        out.notes.append(
            f"parallel layout {strategy} not modelled: states are this rank's, its"
            " communication buffers are not predicted (the measured line is the truth)"
        )
    return out

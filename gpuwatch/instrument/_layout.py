"""Facts of the parallel layout: how DDP, FSDP, DeepSpeed ZeRO or a device map divides the
model on a rank.

Read once, with the model facts (``docs/facts.md``, ``parallel``), from the live objects:
the wrapper the user built (``DistributedDataParallel``, FSDP1's
``FullyShardedDataParallel``), the modules ``fully_shard`` (FSDP2) turned into
``FSDPModule`` subclasses, DeepSpeed's engine and ZeRO optimizer, and the parameters
themselves (DTensor shards, ZeRO-3 partitions, devices). Every size is what *this rank*
holds (a DTensor's local shard, a ZeRO-3 parameter's ``ds_tensor``, never the global
``numel()``), except the ``unsharded`` figures, which are what an all-gather makes.

Classes are recognised by name, so nothing here imports ``torch.distributed`` or
``deepspeed``: a run that does not use them never loads them. It never raises into
training (the caller, ``_facts.collect_facts``, names what failed under ``errors``).
"""

from __future__ import annotations

import sys
from typing import Any

from ..facts import MAX_UNITS


def local(t: Any) -> Any:
    """The tensor this rank holds: a DTensor's local shard, a released ZeRO-3 parameter's
    partition (``ds_tensor``; its ``data`` is then empty), else ``t``."""
    inner = getattr(t, "_local_tensor", None)
    if inner is not None:
        return inner
    part = getattr(t, "ds_tensor", None)
    if part is not None and _numel(t) == 0:
        return part
    return t


def on_meta(t: Any) -> bool:
    """Whether ``t`` lives on the ``meta`` device: a shape without storage (a model built
    under ``torch.device("meta")`` and not yet materialised), no memory anywhere."""
    return bool(getattr(t, "is_meta", False))


def _numel(t: Any) -> int:
    try:
        return int(t.numel())
    except Exception:
        return 0


def local_bytes(t: Any) -> int:
    """Bytes this rank holds for ``t`` (its local shard for a DTensor; for a ZeRO-3
    parameter its partition, plus the whole parameter while it is gathered: persistent
    parameters stay so, ``stage3_param_persistence_threshold``)."""
    base = local(t)
    n = int(base.numel()) * int(base.element_size())
    part = getattr(base, "ds_tensor", None)
    if part is not None:
        n += int(part.numel()) * int(part.element_size())
    return n


def _fsdp_groups(mod: Any) -> list[Any]:
    """The parameter groups of one FSDP2 unit (one group, or several in newer torch)."""
    state = mod._get_fsdp_state()
    groups = list(getattr(state, "_fsdp_param_groups", None) or [])
    if not groups and getattr(state, "_fsdp_param_group", None) is not None:
        groups = [state._fsdp_param_group]
    return groups


def _fsdp2_params(model: Any) -> list[Any]:
    """FSDP2's parameter objects (``FSDPParam``) of every unit in ``model``."""
    out: list[Any] = []
    for mod in model.modules():
        if "FSDPModule" not in _classes(mod):
            continue
        groups = _fsdp_groups(mod)
        for group in groups:
            out.extend(getattr(group, "fsdp_params", None) or [])
    return out


def sharded_parameters(model: Any) -> list[Any]:
    """``model.parameters()`` as this rank holds them between steps.

    FSDP2 registers a unit's unsharded parameters on its modules while it is unsharded
    (all the time from the first forward on with ``reshard_after_forward=False``): each
    is replaced by its sharded DTensor.
    """
    params = list(model.parameters())
    if not any("FSDPModule" in _classes(m) for m in model.modules()):
        return params
    swap = {}
    for fp in _fsdp2_params(model):
        unsharded = getattr(fp, "_unsharded_param", None)
        if unsharded is not None:
            swap[id(unsharded)] = fp.sharded_param
    return [swap.get(id(p), p) for p in params]


def param_owner(model: Any, wrapper: Any) -> Any:
    """Whose ``parameters()`` are this rank's: FSDP1's wrapper (its flat parameters, this
    rank's shards; the model inside keeps only views of them), else the model."""
    wrapped = wrapper is not None and wrapper is not model
    return wrapper if wrapped and "FullyShardedDataParallel" in _classes(wrapper) else model


ROOT = "(root)"
"""The name of the unit of the model's root module (FSDP2's root, FSDP1's outermost
wrapper)."""


def _dtype(d: Any) -> str | None:
    return None if d is None else str(d).replace("torch.", "")


def _classes(obj: Any) -> set[str]:
    return {c.__name__ for c in type(obj).__mro__}


def _world() -> tuple[int | None, int | None]:
    """``(rank, world size)`` of the default process group, or Nones."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return int(dist.get_rank()), int(dist.get_world_size())
    except Exception:
        pass
    return None, None


def _backend() -> str | None:
    """The default process group's backend (``gloo``, ``nccl``, ...), or None."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return str(dist.get_backend())[:16]
    except Exception:
        pass
    return None


def _ddp(ddp: Any) -> dict[str, Any]:
    """DDP's options (``torch/nn/parallel/distributed.py``)."""
    # torch 2.13 keeps both caps in ``_bucket_config``; earlier ones on the module.
    cfg = getattr(ddp, "_bucket_config", None) or ddp
    out: dict[str, Any] = {
        "bucket_cap_bytes": int(getattr(cfg, "bucket_bytes_cap", 0) or 0),
        "first_bucket_bytes": int(getattr(cfg, "first_bucket_bytes_cap", 0) or 0),
        "gradient_as_bucket_view": bool(getattr(ddp, "gradient_as_bucket_view", False)),
        "static_graph": bool(getattr(ddp, "static_graph", False)),
        "find_unused_parameters": bool(getattr(ddp, "find_unused_parameters", False)),
        "broadcast_buffers": bool(getattr(ddp, "broadcast_buffers", False)),
    }
    try:
        out["world_size"] = int(ddp.process_group.size())
    except Exception:
        pass
    return out


def _fsdp2_group_unit(group: Any, name: str) -> dict[str, Any]:
    """One FSDP2 unit (an ``FSDPParamGroup``): its sizes and policies."""
    params = list(getattr(group, "fsdp_params", []) or [])
    policy = getattr(group, "mp_policy", None)
    unsharded = sharded = 0
    # Only trainable parameters get an unsharded gradient and a reduce-scatter input
    # (``FSDPParamGroup.post_backward``: those whose ``grad`` is set); a LoRA unit's
    # frozen base has neither.
    trainable_unsharded = trainable_sharded = 0
    for fp in params:
        sp = fp.sharded_param
        elt = int(local(sp).element_size())
        n = 1
        for d in fp._orig_size:
            n *= int(d)
        # The all-gather makes it in the policy's param dtype (FSDPParam learns it at
        # the first forward; the group's policy knows it from the start).
        pd = getattr(fp, "param_dtype", None) or getattr(policy, "param_dtype", None)
        if pd is not None:
            elt = int(getattr(pd, "itemsize", elt))
        unsharded += n * elt
        sharded += local_bytes(sp)
        if getattr(sp, "requires_grad", True):
            trainable_unsharded += n * elt
            trainable_sharded += local_bytes(sp)
    post = getattr(group, "post_forward_mesh_info", None)
    return {
        "name": name[:128],
        "params": len(params),
        "sharded_bytes": sharded,
        "unsharded_bytes": unsharded,
        "trainable_sharded_bytes": trainable_sharded,
        "trainable_unsharded_bytes": trainable_unsharded,
        "reshard_after_forward": post is not None,
    }


def _auto_reshard(mod: Any) -> bool:
    """Whether ``fully_shard`` chose the root's ``reshard_after_forward`` (not the user)."""
    try:
        return bool(mod._get_fsdp_state()._auto_reshard_after_forward)
    except Exception:
        return False


def _fsdp2(model: Any) -> dict[str, Any] | None:
    """FSDP2 (``fully_shard``): the units, the mesh, the policies."""
    units: list[dict[str, Any]] = []
    mesh = replicate = None
    mp: Any = None
    offload = False
    count = 0
    seen: set[int] = set()
    for name, mod in model.named_modules():
        if "FSDPModule" not in _classes(mod):
            continue
        groups = _fsdp_groups(mod)
        for group in groups:
            # ``fully_shard([norm, output])`` makes one unit of several modules: each
            # module is an ``FSDPModule`` sharing the one state and parameter group.
            if id(group) in seen:
                continue
            seen.add(id(group))
            count += 1
            if len(units) < MAX_UNITS:
                unit = _fsdp2_group_unit(group, name or ROOT)
                if not name and _auto_reshard(mod):
                    # The root of an automatic policy never reshards after forward: its
                    # lazy init clears the flag at the first forward, after watch().
                    unit["reshard_after_forward"] = False
                units.append(unit)
            info = getattr(group, "mesh_info", None)
            if mesh is None and info is not None:
                mesh = int(getattr(info, "shard_mesh_size", 0) or 0) or None
                replicate = getattr(info, "replicate_mesh_size", None)
            mp = mp or getattr(group, "mp_policy", None)
            offload = offload or "CPUOffloadPolicy" in _classes(
                getattr(group, "offload_policy", None)
            )
    if not count:
        return None
    out: dict[str, Any] = {
        "version": 2,
        "mesh_size": mesh,
        "units": count,
        "unit_list": units,
        "largest_unit_bytes": max((u["unsharded_bytes"] for u in units), default=0),
        "reshard_after_forward": all(u["reshard_after_forward"] for u in units),
        "param_dtype": _dtype(getattr(mp, "param_dtype", None)),
        "reduce_dtype": _dtype(getattr(mp, "reduce_dtype", None)),
        "cpu_offload": offload,
        "backend": _backend(),
    }
    if mesh is not None and replicate:
        out["replicate_size"] = int(replicate)
    return out


def is_flat_param(t: Any) -> bool:
    """Whether ``t`` is FSDP1's flat parameter: its class is ``FlatParameter`` in older
    torch, plain ``Parameter`` marked ``_is_flat_param`` in newer (2.13)."""
    return getattr(t, "_is_flat_param", False) is True or type(t).__name__ == "FlatParameter"


def _fsdp1(wrappers: list[Any], names: dict[int, str]) -> dict[str, Any]:
    """FSDP1 (``FullyShardedDataParallel``): strategy and flat parameters, one unit per
    wrapper that holds one, outermost (the root) first, then in module order."""
    first = wrappers[0]
    strategy = getattr(first, "sharding_strategy", None)
    mp = getattr(first, "mixed_precision", None)
    offload = getattr(first, "cpu_offload", None)
    flats: list[dict[str, Any]] = []
    for w in wrappers:
        handle = getattr(w, "_handle", None)
        flat = getattr(handle, "flat_param", None) if handle is not None else None
        if flat is None or not is_flat_param(flat):
            continue
        # The all-gather makes the padded size (``_full_param_padded``), in the policy's
        # param dtype where there is one.
        size = getattr(flat, "_padded_unsharded_size", None) or getattr(
            flat, "_unpadded_unsharded_size", None
        )
        n = int(size.numel()) if size is not None else int(flat.numel())
        pd = getattr(mp, "param_dtype", None)
        elt = int(getattr(pd, "itemsize", 0) or flat.element_size())
        sharded = local_bytes(flat)
        trainable = bool(getattr(flat, "requires_grad", True))
        flats.append(
            {
                "name": names.get(id(w), "?")[:128],
                "sharded_bytes": sharded,
                "unsharded_bytes": n * elt,
                "trainable_sharded_bytes": sharded if trainable else 0,
                "trainable_unsharded_bytes": n * elt if trainable else 0,
            }
        )
    world = getattr(first, "world_size", None)
    return {
        "version": 1,
        "strategy": getattr(strategy, "name", None),
        "mesh_size": int(world) if isinstance(world, int) else None,
        "units": len(flats),
        "unit_list": flats[:MAX_UNITS],
        "largest_unit_bytes": max((f["unsharded_bytes"] for f in flats), default=0),
        "flat_bytes": sum(f["sharded_bytes"] for f in flats),
        "param_dtype": _dtype(getattr(mp, "param_dtype", None)),
        "reduce_dtype": _dtype(getattr(mp, "reduce_dtype", None)),
        "cpu_offload": bool(getattr(offload, "offload_params", False)),
    }


def _tensor_parallel(model: Any, fsdp_mesh: int | None) -> dict[str, Any] | None:
    """DTensor parameters sharded on a mesh that is not FSDP's alone: tensor parallel."""
    dtensors = 0
    local_total = global_total = 0
    meshes: set[int] = set()
    for p in sharded_parameters(model):
        if getattr(p, "_local_tensor", None) is None:
            continue
        dtensors += 1
        local_total += local_bytes(p)
        global_total += int(p.numel()) * int(p.element_size())
        try:
            if p.device_mesh.ndim > 1 or fsdp_mesh is None:
                meshes.add(int(p.device_mesh.size()))
        except Exception:
            pass
    if not dtensors:
        return None
    return {
        "dtensor_params": dtensors,
        "local_bytes": local_total,
        "global_bytes": global_total,
        "mesh_sizes": sorted(meshes)[:8],
    }


ZERO_OPTIMIZERS = ("DeepSpeedZeroOptimizer", "DeepSpeedZeroOptimizer_Stage3")
"""DeepSpeed's ZeRO optimizer wrappers (``runtime/zero/stage_1_and_2.py``, ``stage3.py``)."""


def _int(v: Any) -> int | None:
    try:
        return int(v) if v is not None and not isinstance(v, bool) else None
    except Exception:
        return None


def _sum_bytes(tensors: Any) -> int:
    total = 0
    for t in tensors or []:
        try:
            total += int(t.numel()) * int(t.element_size())
        except Exception:
            continue
    return total


def _zero_options(cfg: Any, opt: Any) -> dict[str, Any]:
    """ZeRO's options: the engine's ``DeepSpeedZeroConfig`` (``runtime/zero/config.py``)
    where there is one, else what the optimizer wrapper keeps of them."""
    off = getattr(opt, "parameter_offload", None)  # stage 3's parameter coordinator
    if cfg is not None:
        found = {
            "reduce_bucket_size": getattr(cfg, "reduce_bucket_size", None),
            "allgather_bucket_size": getattr(cfg, "allgather_bucket_size", None),
            "stage3_prefetch_bucket_size": getattr(cfg, "prefetch_bucket_size", None),
            "stage3_max_live_parameters": getattr(cfg, "max_live_parameters", None),
            "stage3_max_reuse_distance": getattr(cfg, "max_reuse_distance", None),
            "stage3_param_persistence_threshold": getattr(cfg, "param_persistence_threshold", None),
            "contiguous_gradients": getattr(cfg, "contiguous_gradients", None),
            "overlap_comm": getattr(cfg, "overlap_comm", None),
        }
    else:
        found = {
            "reduce_bucket_size": getattr(opt, "reduce_bucket_size", None),
            "allgather_bucket_size": getattr(opt, "allgather_bucket_size", None),
            "stage3_prefetch_bucket_size": getattr(off, "_prefetch_bucket_sz", None),
            "stage3_max_live_parameters": getattr(off, "_max_available_parameters_in_numel", None),
            "stage3_max_reuse_distance": getattr(off, "_max_reuse_distance_in_numel", None),
            "stage3_param_persistence_threshold": getattr(
                off, "param_numel_persistence_threshold", None
            ),
            "contiguous_gradients": getattr(opt, "contiguous_gradients", None),
            "overlap_comm": getattr(opt, "overlap_comm", None),
        }
    # What the optimizer does wins over the configuration (stage 1/2 turns contiguous
    # gradients on under CPU offload, ``stage_1_and_2.py`` __init__).
    for key in ("contiguous_gradients", "overlap_comm"):
        if isinstance(getattr(opt, key, None), bool):
            found[key] = getattr(opt, key)
    out: dict[str, Any] = {}
    for key, value in found.items():
        if key in ("contiguous_gradients", "overlap_comm"):
            if value is not None:
                out[key] = bool(value)
        elif _int(value) is not None:
            out[key] = _int(value)
    return out


def _offload(cfg: Any, opt: Any, stage: int) -> tuple[str | None, str | None]:
    """Where ZeRO offloads the optimizer states and the parameters (``cpu``, ``nvme``)."""

    def device(conf: Any) -> str | None:
        dev = getattr(conf, "device", None) if conf is not None else None
        name = str(getattr(dev, "value", dev) or "").lower()
        return name if name in ("cpu", "nvme") else None

    opt_dev = device(getattr(cfg, "offload_optimizer", None))
    par_dev = device(getattr(cfg, "offload_param", None))
    if opt_dev is None and (
        getattr(opt, "cpu_offload", False) is True
        or getattr(opt, "offload_optimizer", False) is True
    ):
        opt_dev = "cpu"
    if par_dev is None and stage == 3 and getattr(opt, "offload_param", False) is True:
        par_dev = "cpu"
    return opt_dev, par_dev


def _grads_in_partition(opt: Any) -> dict[str, int]:
    """Stage 1/2's gradient copy (``copy_grads_in_partition``: ``grads_in_partition``, the
    whole numel of every parameter in this rank's partition) and the gradients the
    reduction walks before this rank's first parameter (``reduce_gradients`` walks each
    group's parameters in order and moves each gradient into a bucket, freeing it): under
    stage 1 the copy is made there, while the gradients after it are still whole."""
    try:
        groups = getattr(opt, "bit16_groups", None) or []
        mine = getattr(opt, "params_in_partition", None) or []
        copy = sum(_numel(p) for group in mine for p in group)
        first = next((group[0] for group in mine if group), None)
        before = 0
        for group in groups:
            for p in group:
                if p is first:
                    return {"grads_in_partition_numel": copy, "grads_before_partition": before}
                before += _numel(p)
        return {"grads_in_partition_numel": copy} if copy else {}
    except Exception:
        return {}  # DeepSpeed's internals moved: the facts go without


def _zero_stage(engine: Any, cfg: Any, opt: Any, partitioned: list[Any]) -> int | None:
    """The ZeRO stage: the engine's, else its config's, else what the optimizer wrapper's
    class says, else 3 where parameters are partitioned."""
    if engine is not None:
        try:
            return int(engine.zero_optimization_stage())
        except Exception:
            stage = _int(getattr(cfg, "stage", None))
            if stage is not None:
                return stage
    names = _classes(opt) if opt is not None else set()
    if "DeepSpeedZeroOptimizer_Stage3" in names:
        return 3
    if "DeepSpeedZeroOptimizer" in names:
        return 2 if getattr(opt, "partition_gradients", False) else 1
    return 3 if partitioned else None


def _partition_count(opt: Any, partitioned: list[Any]) -> int | None:
    """How many ranks share the partitions: the wrapper's count, else the process group
    of a partitioned parameter."""
    count = getattr(opt, "partition_count", None)
    count = count[0] if isinstance(count, (list, tuple)) and count else count
    if _int(count) is None and partitioned:
        try:
            count = partitioned[0].ds_process_group.size()
        except Exception:
            count = None
    return _int(count)


def _zero_dtype(engine: Any, opt: Any) -> Any:
    """The dtype ZeRO trains in: the wrapper's, else what the engine has enabled."""
    dtype = getattr(opt, "dtype", None)
    if dtype is None and engine is not None:
        try:
            if engine.bfloat16_enabled():
                return "bfloat16"
            return "float16" if engine.fp16_enabled() else "float32"
        except Exception:
            return None
    return dtype


def _zero_copies(opt: Any, stage: int) -> dict[str, Any]:
    """The optimizer wrapper's own copies: the fp32 master, and stage 1/2's partition and
    gradient copy or stage 3's flat gradient partitions."""
    if stage < 3:
        # The fp32 master copy of this rank's partition (``single_partition_of_fp32_groups``,
        # a clone even in fp32) and the partition's size in elements (``partition_size``).
        sizes = getattr(opt, "partition_size", None) or []
        return {
            "master_bytes": _sum_bytes(getattr(opt, "single_partition_of_fp32_groups", None)),
            "partition_numel": sum(_int(n) or 0 for n in sizes),
            **_grads_in_partition(opt),
        }
    # Stage 3's fp32 partitions are the bit16 ones themselves where the dtypes agree
    # (``_create_fp32_partitions``): only a separate copy counts.
    same = {t.data_ptr() for t in getattr(opt, "fp16_partitioned_groups_flat", None) or []}
    grads = getattr(opt, "grad_partitions_flat_buffer", None)
    return {
        "master_bytes": _sum_bytes(
            t
            for t in getattr(opt, "fp32_partitioned_groups_flat", None) or []
            if t.data_ptr() not in same
        ),
        "grad_partition_bytes": _sum_bytes([grads] if grads is not None else []),
    }


def _stage3_sizes(partitioned: list[Any]) -> dict[str, int]:
    """Stage 3: what an all-gather makes (``ds_numel``), this rank's partitions, and the
    persistent parameters that stay gathered (``ds_persist``)."""

    def whole(p: Any) -> int:
        return (_int(getattr(p, "ds_numel", 0)) or 0) * int(p.element_size())

    return {
        "unsharded_bytes": sum(whole(p) for p in partitioned),
        "partition_bytes": _sum_bytes(p.ds_tensor for p in partitioned),
        "partition_numel": sum(_numel(p.ds_tensor) for p in partitioned),
        "persistent_bytes": sum(
            whole(p) for p in partitioned if getattr(p, "ds_persist", False) is True
        ),
        "largest_param_bytes": max(whole(p) for p in partitioned),
    }


def _zero(engine: Any, opt: Any, model: Any) -> dict[str, Any] | None:
    """DeepSpeed ZeRO: the stage, the partition count, the buckets, offload and this rank's
    partitions (``docs/facts.md``, ``parallel.zero``), from the engine, its optimizer
    wrapper, or (stage 3 alone) the partitioned parameters."""
    cfg = getattr(getattr(engine, "_config", None), "zero_config", None)
    params = list(model.parameters())
    partitioned = [p for p in params if getattr(p, "ds_tensor", None) is not None]
    stage = _zero_stage(engine, cfg, opt, partitioned)
    if not stage:
        return None
    out: dict[str, Any] = {"stage": stage}
    count = _partition_count(opt, partitioned)
    if count is not None:
        out["partition_count"] = count
    options = _zero_options(cfg, opt)
    if stage < 3:  # stage 3's own options mean nothing below it
        options = {k: v for k, v in options.items() if not k.startswith("stage3_")}
    out.update(options)
    out["offload_optimizer"], out["offload_param"] = _offload(cfg, opt, stage)
    out["dtype"] = _dtype(_zero_dtype(engine, opt))
    if opt is not None:
        out.update(_zero_copies(opt, stage))
    if partitioned:
        out.update(_stage3_sizes(partitioned))
    return out


def _devices(model: Any) -> dict[str, int]:
    """Bytes of parameters and buffers on each device (this rank's shards)."""
    out: dict[str, int] = {}
    for t in (*sharded_parameters(model), *model.buffers()):
        if on_meta(local(t)):
            continue  # no memory: a model half materialised is not a device map
        dev = str(local(t).device)
        out[dev] = out.get(dev, 0) + local_bytes(t)
    return out


def _wrappers(outer: Any) -> list[Any]:
    """The wrappers around the model, outermost first (eight at most)."""
    chain = []
    for _ in range(8):
        chain.append(outer)
        inner = None
        for attr in ("module", "_fsdp_wrapped_module", "_orig_mod"):
            inner = getattr(outer, "_modules", {}).get(attr)
            if inner is not None:
                break
        if inner is None:
            break
        outer = inner
    return chain


def _zero_of(chain: list[Any], model: Any, optimizer: Any) -> dict[str, Any] | None:
    """The ZeRO facts from DeepSpeed's engine in ``chain`` and its optimizer wrapper (the
    user's, else the engine's), or from the partitioned parameters alone (None: no ZeRO)."""
    engine = next((w for w in chain if "DeepSpeedEngine" in _classes(w)), None)
    zopt = optimizer if _classes(optimizer) & set(ZERO_OPTIMIZERS) else None
    if zopt is None and engine is not None:
        inner = getattr(engine, "optimizer", None)
        zopt = inner if _classes(inner) & set(ZERO_OPTIMIZERS) else None
    zero = _zero(engine, zopt, model) if engine is not None or zopt is not None else None
    if zero is None and any(getattr(p, "ds_tensor", None) is not None for p in model.parameters()):
        zero = _zero(None, None, model)  # watch(engine.module) alone, stage 3
    return zero


def parallel_facts(model: Any, wrapper: Any = None, optimizer: Any = None) -> dict[str, Any] | None:
    """The ``parallel`` facts of ``model`` (``docs/facts.md``), or None for one device and
    no process group.

    Args:
        model: The model (wrappers removed).
        wrapper: What the user passed to ``watch()`` (DDP, FSDP1, DeepSpeed's engine, the
            model itself).
        optimizer: The optimizer as the user passed it (DeepSpeed's ZeRO wrapper, not the
            torch optimizer inside it).
    """
    rank, world = _world()
    out: dict[str, Any] = {"strategy": "none"}
    if rank is not None:
        out["rank"], out["world_size"] = rank, world
    chain = _wrappers(wrapper if wrapper is not None else model)
    ddp = next((w for w in chain if "DistributedDataParallel" in _classes(w)), None)
    fsdp1: list[Any] = []
    names: dict[int, str] = {}
    for m in chain:
        names.setdefault(id(m), ROOT)
    for name, m in model.named_modules():
        names.setdefault(id(m), name or ROOT)
    for m in (*chain, *model.modules()):
        if "FullyShardedDataParallel" in _classes(m) and all(m is not w for w in fsdp1):
            fsdp1.append(m)
    fsdp2 = _fsdp2(model)
    zero = _zero_of(chain, model, optimizer)
    if zero is not None:
        out["strategy"] = "zero"
        out["zero"] = zero
    elif ddp is not None:
        out["strategy"] = "ddp"
        out["ddp"] = _ddp(ddp)
    elif fsdp2 is not None:
        out["strategy"] = "fsdp2"
        out["fsdp"] = fsdp2
    elif fsdp1:
        out["strategy"] = "fsdp1"
        out["fsdp"] = _fsdp1(fsdp1, names)
    tp = _tensor_parallel(model, (fsdp2 or {}).get("mesh_size"))
    if tp is not None:
        out["dtensor"] = tp
        if out["strategy"] == "none":
            out["strategy"] = "tp"
    devices = _devices(model)
    hf_map = getattr(model, "hf_device_map", None)
    if len(devices) > 1 or isinstance(hf_map, dict):
        out["devices"] = dict(list(devices.items())[:16])
        if out["strategy"] == "none":
            out["strategy"] = "device_map"
    if out["strategy"] == "none" and rank is None:
        return None
    return out

"""Model facts for the predictor, read once inside the training process (``docs/facts.md``).

:func:`collect_facts` walks the model and optimizer once (never per step) and returns a
small JSON-able dict: aggregates by (dtype, device, trainable), never one entry per tensor.
It never raises: a part that cannot be read is left out and named under ``errors``.
torch is imported only when a function runs (the instrument package must stay light).
"""

from __future__ import annotations

import math
import os
import re
from typing import Any, cast

from ..facts import (
    ATTN_ATTRS,
    ATTN_PARTS,
    ATTN_VALUES,
    CONFIG_NAMES,
    DROPOUT_NAMES,
    FACTS_VERSION,
    LORA_PARTS,
    MAX_BUCKETS,
    MLP_PARTS,
    ROLE_NAMES,
    SMALL_TENSOR,
    BatchFacts,
    Facts,
)
from ._layout import (
    ZERO_OPTIMIZERS,
    local,
    local_bytes,
    on_meta,
    parallel_facts,
    param_owner,
    sharded_parameters,
)


def _dtype(t: Any) -> str:
    return str(t.dtype).replace("torch.", "")


def _device(t: Any) -> str:
    return str(t.device)


def _scalar(v: Any) -> Any:
    """A JSON scalar (or list of numbers) for an optimizer option, else None."""
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, (tuple, list)) and all(isinstance(x, (int, float)) for x in v):
        return [float(x) for x in v]
    try:  # a 0-d tensor (lr as a Tensor)
        return float(v.item()) if getattr(v, "numel", lambda: 0)() == 1 else None
    except Exception:
        return None


def _nbytes(t: Any) -> int:
    return local_bytes(t)


def _groups(tensors: Any, trainable: bool = True) -> dict[str, Any]:
    """Count and bytes of tensors by (dtype, device[, trainable])."""
    out: dict[tuple[str, str, bool], list[int]] = {}
    count = size = t_count = t_size = meta_count = meta_tensors = 0
    for t in tensors:
        rg = bool(getattr(t, "requires_grad", False)) if trainable else False
        t = local(t)  # this rank's shard of a DTensor (FSDP2, tensor parallel)
        n, b = int(t.numel()), _nbytes(t)
        if on_meta(t):  # no storage: not a weight (a model not yet materialised)
            meta_count += n
            meta_tensors += 1
            continue
        key = (_dtype(t), _device(t), rg)
        acc = out.setdefault(key, [0, 0, 0])
        acc[0] += n
        acc[1] += b
        acc[2] += 1
        count += n
        size += b
        if rg:
            t_count += n
            t_size += b
    groups = [
        {"dtype": d, "device": dev, "trainable": rg, "count": c, "bytes": b, "tensors": k}
        for (d, dev, rg), (c, b, k) in out.items()
    ]
    meta = {"meta_count": meta_count, "meta_tensors": meta_tensors} if meta_tensors else {}
    if not trainable:
        for g in groups:
            del g["trainable"]
        return {"count": count, "bytes": size, "groups": groups, **meta}
    return {
        "count": count,
        "bytes": size,
        "trainable_count": t_count,
        "trainable_bytes": t_size,
        "frozen_count": count - t_count,
        "frozen_bytes": size - t_size,
        "groups": groups,
        **meta,
    }


def _blas(model: Any) -> dict[str, Any] | None:
    """The cuBLAS workspace size of a model on CUDA (each thread that runs a matmul gets
    one from the caching allocator), or None off CUDA.

    torch's own figure where it tells it; else ``CUBLAS_WORKSPACE_CONFIG`` (``:KiB:count``
    pairs); else torch's default for the device (Hopper and later: 32 MiB).
    """
    import torch

    p = next(iter(model.parameters()), None)
    if p is None or p.device.type != "cuda":
        return None
    size = getattr(torch.backends.cuda, "cublas_workspace_size", None)
    if size is not None:
        return {"workspace_bytes": int(size()), "source": "torch"}
    config = os.environ.get("CUBLAS_WORKSPACE_CONFIG", "")
    pairs = re.findall(r":(\d+):(\d+)", config)
    if pairs:
        size_bytes = sum(int(k) * 1024 * int(n) for k, n in pairs)
        return {"workspace_bytes": size_bytes, "source": "config"}
    major = torch.cuda.get_device_capability(p.device)[0]
    default = 4096 * 8 * 1024 if major >= 9 else 4096 * 1024 * 2 + 16 * 1024 * 8
    return {"workspace_bytes": default, "source": "default"}


def _params(model: Any) -> dict[str, Any]:
    import torch

    facts = _groups(sharded_parameters(model))
    # What autocast casts: the weights of matmul-like modules (its lower-precision list).
    cast_types = (torch.nn.Linear, torch.nn.modules.conv._ConvNd, torch.nn.Bilinear)
    seen: set[int] = set()
    cast = 0
    for mod in model.modules():
        if isinstance(mod, cast_types):
            for p in mod.parameters(recurse=False):
                if id(p) not in seen and not on_meta(local(p)):
                    seen.add(id(p))
                    cast += int(local(p).numel())
    facts["autocast_count"] = cast
    return facts


def _impl(optimizer: Any, stepped: list[Any] | None = None) -> tuple[str | None, bool]:
    """The implementation ``step()`` will run (foreach / fused / for-loop), and whether
    the user chose it; ``stepped``: the tensors it steps where its groups do not list
    them yet (ZeRO-3's, :func:`_zero_flat`: torch picks foreach for no parameters).

    Mirrors ``torch.optim`` (``adam()``, ``_default_to_fused_or_foreach``): explicit
    ``fused``/``foreach`` win; else foreach when every parameter is on a device with
    foreach kernels (CUDA, XPU, MTIA, a PrivateUse1 backend) and the optimizer is not
    differentiable, and not for a Tensor ``lr`` without ``capturable``; else (e.g. on the
    CPU) the for-loop.
    """
    defaults = getattr(optimizer, "defaults", {}) or {}
    groups = getattr(optimizer, "param_groups", []) or []
    first = groups[0] if groups else defaults
    fused, foreach = first.get("fused", defaults.get("fused")), first.get("foreach")
    if fused:
        return "fused", True
    if foreach:
        return "foreach", True
    if "foreach" not in defaults and "fused" not in defaults:
        return None, False  # not a torch.optim optimizer with these paths
    if foreach is False:
        return "for-loop", True
    try:
        from torch.optim.optimizer import _default_to_fused_or_foreach

        params = stepped if stepped is not None else [p for g in groups for p in g["params"]]
        _, auto = _default_to_fused_or_foreach(params, bool(first.get("differentiable")), False)
        lr = first.get("lr")
        if auto and hasattr(lr, "numel") and not first.get("capturable"):
            auto = False
    except Exception:
        auto = False
    return ("foreach" if auto else "for-loop"), False


def _zero_flat(wrapper: Any) -> dict[int, list[Any]] | None:
    """DeepSpeed ZeRO's fp32 partitions by the inner optimizer's group, or None for
    another optimizer. They are what it steps, though stage 3 lists them in its groups only
    during its step (``stage3.py``, ``_optimizer_step``) and none requires grad (the
    wrapper sets their ``.grad``)."""
    names = {c.__name__ for c in type(wrapper).__mro__}
    if not names & set(ZERO_OPTIMIZERS):
        return None
    if "DeepSpeedZeroOptimizer_Stage3" not in names:
        flats = getattr(wrapper, "single_partition_of_fp32_groups", None) or []
        return {i: [t] for i, t in enumerate(flats)}
    out: dict[int, list[Any]] = {}
    to_group = getattr(wrapper, "sub_group_to_group_id", None) or {}
    for i, t in enumerate(getattr(wrapper, "fp32_partitioned_groups_flat", None) or []):
        out.setdefault(int(to_group.get(i, 0)), []).append(t)
    return out


def _bucket(key: tuple[int, str, str], per_group: dict[str, Any]) -> dict[str, Any]:
    """An empty bucket of the optimizer's facts: one group's tensors of one device and
    dtype, with the group's options."""
    return {
        "group": key[0],
        "device": key[1],
        "dtype": key[2],
        "tensors": 0,
        "count": 0,
        "bytes": 0,
        "max_tensor_bytes": 0,
        "second_tensor_bytes": 0,
        "loop_peak_bytes": 0,
        "small_count": 0,
        "factored_count": 0,
        "vector_count": 0,
        **per_group,
    }


def _add_tensor(b: dict[str, Any], p: Any, previous: int) -> int:
    """Count the trainable tensor ``p`` into its bucket ``b`` (``previous``: the bytes of
    the tensor before it in the group); return its bytes."""
    n, nb = int(p.numel()), _nbytes(p)
    b["tensors"] += 1
    b["count"] += n
    b["bytes"] += nb
    if nb > b["max_tensor_bytes"]:
        b["second_tensor_bytes"], b["max_tensor_bytes"] = b["max_tensor_bytes"], nb
    elif nb > b["second_tensor_bytes"]:
        b["second_tensor_bytes"] = nb
    # A for-loop step's working set at this tensor: two of it (sqrt, denom) while
    # the previous tensor's denom is still bound (torch/optim/adam.py).
    b["loop_peak_bytes"] = max(b["loop_peak_bytes"], 2 * nb + previous)
    if n < SMALL_TENSOR:
        b["small_count"] += n
    if p.dim() >= 2 and n:
        # Adafactor's row and column variances: shape[:-1] and shape[:-2]+shape[-1:].
        b["factored_count"] += n // int(p.shape[-1]) + n // int(p.shape[-2])
    else:
        b["vector_count"] += n
    return nb


def _state_size(optimizer: Any) -> tuple[int, int]:
    """The bytes and tensors of the optimizer's state, each storage counted once."""
    state_bytes = state_tensors = 0
    seen: set[int] = set()
    for st in getattr(optimizer, "state", {}).values():
        if not isinstance(st, dict):
            continue
        for v in st.values():
            if hasattr(v, "untyped_storage"):
                try:
                    storage = v.untyped_storage()
                    ptr = storage.data_ptr()
                    if ptr in seen and ptr:
                        continue
                    seen.add(ptr)
                    state_bytes += int(storage.nbytes())
                    state_tensors += 1
                except Exception:
                    continue
    return state_bytes, state_tensors


def _optimizer(optimizer: Any, flat: dict[int, list[Any]] | None = None) -> dict[str, Any]:
    """The optimizer's facts.

    Args:
        optimizer: A ``torch.optim.Optimizer``-like object.
        flat: The parameters of each group where a framework steps its own flat
            partitions (:func:`_zero_flat`): every one counts as trainable.
    """
    cls = type(optimizer)
    defaults = getattr(optimizer, "defaults", {}) or {}
    options = {k: _scalar(v) for k, v in defaults.items() if k != "params"}
    options = {k: v for k, v in options.items() if v is not None or k in ("foreach", "fused")}
    impl, explicit = _impl(
        optimizer, None if flat is None else [t for f in flat.values() for t in f]
    )
    buckets: dict[tuple[int, str, str], dict[str, Any]] = {}
    truncated = False
    for gi, group in enumerate(getattr(optimizer, "param_groups", []) or []):
        frozen = previous = 0
        per_group = {
            k: _scalar(group.get(k))
            for k in ("weight_decay", "momentum", "nesterov", "amsgrad", "lr")
            if k in group and _scalar(group.get(k)) is not None
        }
        for p in group.get("params", []) if flat is None else flat.get(gi, []):
            if flat is None and not getattr(p, "requires_grad", False):
                frozen += 1  # no gradient: step() skips it and makes no state for it
                continue
            if on_meta(local(p)):
                continue  # its state and step temporaries would be on meta too: no memory
            key = (gi, _device(p), _dtype(p))
            b = buckets.get(key)
            if b is None:
                if len(buckets) >= MAX_BUCKETS:
                    truncated = True
                    continue
                b = buckets[key] = _bucket(key, per_group)
            previous = _add_tensor(b, local(p), previous)  # sizes are this rank's shard
        if frozen:
            for b in buckets.values():
                if b["group"] == gi:
                    b["frozen_tensors"] = frozen
                    break
    state_bytes, state_tensors = _state_size(optimizer)
    facts = {
        "class": cls.__name__,
        "module": cls.__module__,
        "impl": impl,
        "impl_explicit": explicit,
        "options": options,
        "groups": list(buckets.values()),
        "param_groups": len(getattr(optimizer, "param_groups", []) or []),
        "state_bytes": state_bytes,
        "state_tensors": state_tensors,
    }
    if truncated:
        facts["groups_truncated"] = True
    return facts


def _checkpointing(model: Any, checkpointing: bool | None) -> dict[str, Any]:
    if checkpointing is not None:
        return {"enabled": bool(checkpointing), "source": "argument"}
    # Transformers 5 renamed the flag and warns on the old name: asking for the old one
    # first would print a FutureWarning into the run being watched.
    for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):
        hf = getattr(model, name, None)
        if isinstance(hf, bool):
            return {"enabled": hf, "source": "hf"}
    for mod in model.modules():
        flag = getattr(mod, "gradient_checkpointing", None)
        if flag is True:
            return {"enabled": True, "source": "module"}
        if type(mod).__name__ == "CheckpointWrapper":  # torch.distributed's wrapper
            return {"enabled": True, "source": "wrapper"}
    return {"enabled": False, "source": "none"}


def _config(model: Any) -> Any:
    for obj in (model, getattr(model, "model", None), getattr(model, "base_model", None)):
        cfg = getattr(obj, "config", None) if obj is not None else None
        if cfg is not None:
            return cfg
    return None


def _first(obj: Any, names: tuple[str, ...]) -> Any:
    for name in names:
        v = getattr(obj, name, None)
        if v is not None and not callable(v):
            return v
    return None


def _layers(model: Any) -> tuple[str, Any] | None:
    """The longest ModuleList of same-class modules: the transformer's layers."""
    import torch

    best = None
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.ModuleList) and len(mod) > 0:
            kinds = {type(m) for m in mod}
            if len(kinds) == 1 and (best is None or len(mod) > len(best[1])):
                best = (name, mod)
    return best


def _role(path: str) -> str | None:
    parts = [p for p in path.split(".") if p not in LORA_PARTS and p != "default"]
    if not parts:
        return None
    leaf = parts[-1].lower()
    in_attn = any(any(a in p.lower() for a in ATTN_PARTS) for p in parts[:-1])
    in_mlp = any(any(m in p.lower() for m in MLP_PARTS) for p in parts[:-1])
    if leaf == "c_proj":  # GPT-2 names both output projections c_proj
        return "down" if in_mlp else "o"
    for role, names in ROLE_NAMES.items():
        if leaf in names:
            if role == "o" and in_mlp:
                return "down"
            return role
    if in_attn and leaf in ("out", "o"):
        return "o"
    if in_mlp and leaf in ("out", "c_out"):
        return "down"
    return None


def _module_shape(model: Any, found: tuple[str, Any]) -> dict[str, Any]:
    """Transformer shape from the module tree (no config)."""
    import torch

    _, layers = found
    layer = layers[0]
    shape: dict[str, Any] = {"layers": len(layers)}
    embeds = [m for m in model.modules() if isinstance(m, torch.nn.Embedding)]
    if embeds:
        tok = max(embeds, key=lambda e: e.num_embeddings)
        shape["vocab"], shape["hidden"] = tok.num_embeddings, tok.embedding_dim
        positions = [e for e in embeds if e is not tok]
        shape["learned_positions"] = bool(positions)
        if positions:
            shape["max_positions"] = positions[0].num_embeddings
    for mod in layer.modules():
        heads = _first(mod, ("num_heads", "n_head", "num_attention_heads", "n_heads", "heads"))
        if isinstance(heads, int) and "heads" not in shape:
            shape["heads"] = heads
        kv = _first(mod, ("num_key_value_heads", "num_kv_heads", "n_kv_heads", "kv_heads"))
        if isinstance(kv, int) and "kv_heads" not in shape:
            shape["kv_heads"] = kv
        for attr in (*ATTN_ATTRS, "attention"):
            v = getattr(mod, attr, None)
            if isinstance(v, str) and v in ATTN_VALUES and "attention" not in shape:
                shape["attention"] = v
        if getattr(mod, "flash", None) is True and "attention" not in shape:  # nanoGPT
            shape["attention"] = "sdpa"
    for name, mod in layer.named_modules():
        if isinstance(mod, torch.nn.Linear):
            role = _role(name)
            if role in ("up", "gate") and "intermediate" not in shape:
                shape["intermediate"] = mod.out_features
            if role == "q" and mod.out_features == 3 * shape.get("hidden", -1):
                shape["fused_qkv"] = True
    return shape


def _config_shape(cfg: Any) -> dict[str, Any]:
    """What a HF-style config says of the transformer's shape (``source``: config)."""
    shape: dict[str, Any] = {}
    for key, names in CONFIG_NAMES.items():
        v = _first(cfg, names)
        if isinstance(v, int) and not isinstance(v, bool):
            shape[key] = v
    if getattr(cfg, "multi_query", False) and "kv_heads" not in shape:
        shape["kv_heads"] = 1
    named = {
        "attention": ATTN_ATTRS,
        "activation": ("hidden_act", "activation_function", "hidden_activation"),
        "model_type": ("model_type",),
    }
    for key, names in named.items():
        v = _first(cfg, names)
        if isinstance(v, str):
            shape[key] = v
    drop = {}
    for key, names in DROPOUT_NAMES.items():
        v = _first(cfg, names)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            drop[key] = float(v)
    if drop:
        shape["dropout"] = drop
    shape["source"] = "config"
    return shape


def _norm(layer: Any) -> dict[str, Any]:
    """A layer's norm: rmsnorm (its class, whether it upcasts) or layernorm, if any."""
    import torch

    rms = [m for m in layer.modules() if "rmsnorm" in type(m).__name__.lower()]
    if rms:
        # torch's own RMSNorm does not upcast; the LLaMA-family copies do (LlamaRMSNorm).
        upcast = not isinstance(rms[0], getattr(torch.nn, "RMSNorm", ()))
        return {"norm": "rmsnorm", "norm_class": type(rms[0]).__name__, "norm_upcast": upcast}
    if any(isinstance(m, torch.nn.LayerNorm) for m in layer.modules()):
        return {"norm": "layernorm"}
    return {}


def _linears(layer: Any) -> tuple[dict[str, bool], int, set[str], bool]:
    """A layer's linear projections: whether each role trains, the LoRA rank and the
    roles LoRA targets, whether any has a bias."""
    import torch

    roles: dict[str, bool] = {}
    lora_rank = 0
    lora_targets: set[str] = set()
    has_bias = False
    for name, mod in layer.named_modules():
        if not isinstance(mod, torch.nn.Linear):
            continue
        parts = name.split(".")
        role = _role(name)
        if "lora_A" in parts or "lora_B" in parts:
            if "lora_A" in parts:
                lora_rank = max(lora_rank, mod.out_features)
                if role:
                    lora_targets.add(role)
            continue
        has_bias = has_bias or mod.bias is not None
        if role:
            roles[role] = roles.get(role, False) or bool(mod.weight.requires_grad)
    return roles, lora_rank, lora_targets, has_bias


def _embeddings(model: Any) -> tuple[Any, Any]:
    """The model's token embedding and output head (None where it has none)."""
    import torch

    inp = getattr(model, "get_input_embeddings", lambda: None)()
    out = getattr(model, "get_output_embeddings", lambda: None)()
    embeds = [m for m in model.modules() if isinstance(m, torch.nn.Embedding)]
    tok = (
        inp
        if isinstance(inp, torch.nn.Embedding)
        else (max(embeds, key=lambda e: e.num_embeddings) if embeds else None)
    )
    if out is None:
        heads = [
            m
            for n, m in model.named_modules()
            if isinstance(m, torch.nn.Linear) and n.split(".")[-1] in ("lm_head", "head", "output")
        ]
        out = heads[0] if heads else None
    return tok, out


def _module_dropout(model: Any, layer: Any, prefix: str) -> dict[str, float]:
    """Dropout probabilities from the modules where the config says none: attention and
    residual from a layer's, embedding from those outside the layers (``prefix``)."""
    import torch

    drop = {"attn": 0.0, "resid": 0.0, "embd": 0.0}
    for name, mod in layer.named_modules():
        if isinstance(mod, torch.nn.Dropout) and mod.p > 0:
            key = "attn" if "attn_drop" in name or "attention_drop" in name else "resid"
            drop[key] = max(drop[key], float(mod.p))
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Dropout) and mod.p > 0 and prefix not in name:
            drop["embd"] = max(drop["embd"], float(mod.p))
    return drop


def _transformer(model: Any) -> dict[str, Any] | None:
    cfg = _config(model)
    found = _layers(model)
    shape: dict[str, Any] = {} if cfg is None else _config_shape(cfg)
    if found is not None:
        for k, v in _module_shape(model, found).items():
            shape.setdefault(k, v)
        shape.setdefault("source", "modules")
    if not all(k in shape for k in ("layers", "hidden", "heads")):
        return None
    if found is None:
        return shape
    layer = found[1][0]
    module_classes = [type(m).__name__ for m in layer.modules()]
    shape.update(_norm(layer))
    roles, lora_rank, lora_targets, has_bias = _linears(layer)
    gated = "gate" in roles or any("gate" in n.lower() for n, _ in layer.named_modules())
    shape["mlp"] = "gated" if gated else "gelu"
    shape["fused_qkv"] = bool(shape.get("fused_qkv")) or ("q" in roles and "k" not in roles)
    shape["bias"] = has_bias
    norm_w = [
        p
        for m in layer.modules()
        if "norm" in type(m).__name__.lower()
        for p in m.parameters(recurse=False)
    ]
    roles["norm"] = any(p.requires_grad for p in norm_w) if norm_w else True
    tok, out = _embeddings(model)
    if tok is not None:
        roles["embed"] = bool(tok.weight.requires_grad)
    if out is not None and getattr(out, "weight", None) is not None:
        roles["head"] = bool(out.weight.requires_grad)
        shape["tied_embeddings"] = tok is not None and out.weight is tok.weight
    shape["trainable"] = roles
    if lora_rank:
        shape["lora"] = {"rank": lora_rank, "targets": sorted(lora_targets)}
    shape["rope"] = not shape.get("learned_positions", False) and (
        gated
        or any("rotary" in n.lower() for n in module_classes)
        or bool(_first(cfg, ("rope_theta",)))
    )
    shape["learned_positions"] = bool(shape.get("learned_positions", False))
    if "dropout" not in shape:
        shape["dropout"] = _module_dropout(model, layer, found[0])
    return shape


def collect_facts(
    model: Any,
    optimizer: Any = None,
    *,
    amp_dtype: Any = None,
    checkpointing: bool | None = None,
    wrapper: Any = None,
    optimizer_wrapper: Any = None,
) -> Facts:
    """Read the facts the predictor needs from a model and its optimizer, once.

    Args:
        model: A ``torch.nn.Module``.
        optimizer: Its optimizer (any ``torch.optim.Optimizer``-like object), or None.
        amp_dtype: The autocast dtype the training uses (``torch.bfloat16``, ``"float16"``),
            or None when it does not use autocast (or it is detected later by
            :func:`batch_facts`).
        checkpointing: Whether the layers run under activation checkpointing; None reads
            it from the model where it can (HF ``is_gradient_checkpointing``).
        wrapper: The object the user gave ``watch()`` when it wraps ``model``
            (``DistributedDataParallel``, FSDP1, DeepSpeed's engine): the parallel layout
            is read from it.
        optimizer_wrapper: The optimizer as the user gave it when ``optimizer`` is the
            torch optimizer inside it (DeepSpeed's ZeRO optimizer): ZeRO's facts.

    Returns:
        The facts dict (schema ``docs/facts.md``); parts that failed are listed in
        ``errors`` instead of raising.
    """
    facts: dict[str, Any] = {"version": FACTS_VERSION}
    errors: list[str] = []

    def part(key: str, fn: Any, *args: Any) -> None:
        try:
            value = fn(*args)
            if value is not None:
                facts[key] = value
        except Exception as exc:  # never into training: say what failed
            errors.append(f"{key}: {type(exc).__name__}: {str(exc)[:120]}")

    try:
        import torch

        facts["torch"] = str(torch.__version__)
    except Exception as exc:
        return {"version": FACTS_VERSION, "errors": [f"torch: {type(exc).__name__}"]}
    part("params", _params, param_owner(model, wrapper))
    part("buffers", lambda m: _groups(m.buffers(), trainable=False), model)
    if optimizer is not None:
        part("optimizer", lambda o: _optimizer(o, _zero_flat(optimizer_wrapper)), optimizer)
    amp = None if amp_dtype is None else str(amp_dtype).replace("torch.", "")
    facts["amp"] = {"dtype": amp, "source": "argument" if amp else None}
    part("checkpointing", _checkpointing, model, checkpointing)
    part("transformer", _transformer, model)
    part("parallel", parallel_facts, model, wrapper, optimizer_wrapper)
    part("blas", _blas, model)
    if errors:
        facts["errors"] = errors
    # Assembled from the readers' plain dicts; tests/instrument/test_facts_typed.py checks
    # that what they produce uses only the fields Facts declares.
    return cast(Facts, facts)


def batch_facts(args: Any, kwargs: Any) -> BatchFacts:
    """The batch shape of a forward call, from its arguments (call it on the first forward).

    Takes ``input_ids`` (or the first tensor argument): an integer ``(batch, seq)`` tensor
    of token ids, or a float ``(batch, seq, hidden)`` tensor of embeddings; any other
    tensor (an image batch) gives a batch and no sequence. Also records whether autocast
    is on at that moment, and in which dtype.

    Returns:
        ``{"shape", "dtype", "device", "batch", "seq", "autocast"}`` (``seq`` only for a
        sequence); ``{}`` when no tensor argument is found. Never raises.
    """
    try:
        import torch

        candidates = []
        if isinstance(kwargs, dict):
            for key in ("input_ids", "idx", "inputs_embeds", "x", "input"):
                if isinstance(kwargs.get(key), torch.Tensor):
                    candidates.append(kwargs[key])
        for a in args or ():
            if isinstance(a, torch.Tensor):
                candidates.append(a)
            elif isinstance(a, dict) and isinstance(a.get("input_ids"), torch.Tensor):
                candidates.append(a["input_ids"])
        if not candidates:
            return {}
        t = candidates[0]
        out: BatchFacts = {
            "shape": [int(d) for d in t.shape],
            "dtype": _dtype(t),
            "device": _device(t),
        }
        # A sequence is token ids (batch, seq) or embeddings (batch, seq, hidden); an
        # image batch (N, C, H, W) or a table (batch, features) has a batch and no seq.
        ids = not (t.is_floating_point() or t.is_complex())
        if (ids and t.dim() == 2) or (not ids and t.dim() == 3):
            out["batch"], out["seq"] = int(t.shape[0]), int(t.shape[1])
        elif ids and t.dim() == 1:
            out["batch"], out["seq"] = 1, int(t.shape[0])
        elif t.dim() >= 2:
            out["batch"] = int(t.shape[0])
        out["autocast"] = None
        dev = t.device.type
        try:
            if torch.is_autocast_enabled(dev):
                out["autocast"] = str(torch.get_autocast_dtype(dev)).replace("torch.", "")
        except Exception:
            pass
        return out
    except Exception:
        return {}

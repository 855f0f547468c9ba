"""``gpuwatch estimate --trace MODULE:FUNCTION``: the user's own model, planned as it runs.

``FUNCTION`` builds the model (any ``nn.Module``) under ``FakeTensorMode``: every tensor
has a shape and a dtype but no memory, so a model far larger than this machine is fine.
It may take ``batch`` and ``seq`` keywords (``--batch``, ``--seq`` are passed to it) and
returns the model, ``(model, batch)`` or ``(model, loss_fn, batch)``; the older
``(model, optimizer, batch)`` is read as the optimizer's kind. gpuwatch then does what the
run would do, on torch's fake process group (one rank of ``--gpus`` in this process):

- the layout (``--layout``): ``DistributedDataParallel`` with its buckets, FSDP2's
  ``fully_shard`` on each layer (the children of the model's largest ``ModuleList``) and
  the root, FSDP1 with those layers as units, tensor parallel (``tp=N``, N the GPUs:
  :func:`tp_plan`'s pairs of ``nn.Linear`` in each layer split by columns then rows with
  ``parallelize_module``, said in assumed); the weights' dtype and autocast
  (``--precision``); the layers checkpointed (``--checkpointing``, ``--checkpoint-every``);
- one real training step: forward (counted by the meter a live run uses,
  :class:`~gpuwatch.instrument.ActivationMeter`), the loss, backward,
  ``optimizer.step()`` and ``zero_grad()`` with the optimizer ``--optimizer`` names;
- the facts the live run would send (:func:`~gpuwatch.instrument.collect_facts`: the
  shards, the wrapper's buckets and units), predicted by the dashboard's predictor, and
  walked through the steps' phases (``--accumulation`` micro-batches each) as the
  dashboard's predicted line walks them.

What it cannot honour (``--lora-rank``, ZeRO without DeepSpeed, a shape or a config) is
refused in one line, as is a builder that fails (with its own error).
torch is imported only when a trace runs; the predictor stays pure (``predict/``): this
is a front end running the user's code, as ``predict/_hf_trace.py`` runs transformers'.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import inspect
import os
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

from ..fmt import fmt_bytes
from ._common import CliError

LAYOUTS = ("none", "ddp", "fsdp", "fsdp-no-reshard", "fsdp1", "fsdp1-grad-op")
"""The layouts ``--trace`` applies itself."""

OPTIMIZER_CLASSES = {
    "adamw": ("AdamW", {}),
    "adam": ("Adam", {}),
    "sgd": ("SGD", {"momentum": 0.0}),
    "sgd-momentum": ("SGD", {"momentum": 0.9}),
    "adafactor": ("Adafactor", {}),
}
"""``--optimizer`` -> the ``torch.optim`` class the trace steps, and its options."""

KIND_OF_CLASS = {"AdamW": "adamw", "Adam": "adam", "SGD": "sgd", "Adafactor": "adafactor"}

MP_DTYPES = ("bf16", "fp16", "fp32")
"""``--mp-policy``'s dtypes."""

STEPS = 2
"""Optimizer steps walked: the first (its state made) and a later one."""

REFUSED = {
    "lora_rank": "--lora-rank: with --trace the builder freezes the base and adds the adapters",
    "qlora": "--qlora: with --trace the builder quantises the model itself",
    "offload": "--offload is not traced: planned only by the config route",
    "config": "--config: --trace builds the model itself; give one of them",
    "params": "--params: --trace counts the model's own parameters; drop it",
    "recording": "--from: --trace plans a model, not a recording; give one of them",
}
"""Options ``--trace`` cannot honour, and the one line that says so."""

SHAPE = ("arch", "layers", "hidden", "heads", "kv_heads", "head_dim", "intermediate", "vocab")


@dataclass
class Setting:
    """What one trace runs: the options as the trace takes them."""

    spec: str
    batch: int | None
    seq: int | None
    precision: str
    optimizer: str
    impl: str
    checkpoint_every: int  # 0: no checkpointing
    accumulation: int
    layout: str
    world: int
    device: str
    mp_policy: tuple[str, str] | None = None  # FSDP's (param, reduce) dtypes
    backend: str = "nccl"  # the run's process group: gloo, nccl, or fake (torch's)
    assumed: list[str] = field(default_factory=list)


@dataclass
class Traced:
    """One traced step: the facts the run would send, and what the full model holds."""

    facts: dict[str, Any]
    parameters: int
    trainable: int
    batch: int | None
    seq: int | None
    amp_cached: int = 0


# --------------------------------------------------------------------------- options


def _refuse_unhonoured(args: argparse.Namespace) -> None:
    for name, line in REFUSED.items():
        if getattr(args, name, None):
            raise CliError(line)
    if any(getattr(args, n, None) for n in SHAPE):
        raise CliError("--trace builds the model itself: drop the shape options")
    units = getattr(args, "fsdp_units", None)
    if units and units.replace(" ", "") != "layers":
        raise CliError(
            f"--fsdp-units {units}: with --trace the units are the model's layers and the root"
        )
    for name, default in (("attention", "sdpa"), ("dropout", None), ("loss", "inside")):
        if getattr(args, name, default) not in (default, None):
            flag = "--" + name
            raise CliError(f"{flag}: with --trace the model's own code decides it")


def _layout(args: argparse.Namespace, world: int) -> str:
    """``--layout`` as the trace applies it (refused in one line where it cannot)."""
    from ..predict import parse_layout

    text = getattr(args, "layout", None)
    if not text:
        return "ddp" if world > 1 else "none"
    if text.strip().lower() == "fsdp1":
        layout = "fsdp1"
    else:
        try:
            layout = parse_layout(text)
        except ValueError as exc:
            raise CliError(str(exc))
    if layout.startswith("zero"):
        if importlib.util.find_spec("deepspeed") is None:
            raise CliError(f"--layout {layout} with --trace needs deepspeed installed")
        raise CliError(f"--layout {layout} with --trace: DeepSpeed's engine is not traced")
    if layout.startswith("tp=") and int(layout[3:]) != world:
        raise CliError(
            f"--layout {layout} with --trace: tensor parallel over all {world} GPU(s) only"
            " (give --gpus as many)"
        )
    if layout not in LAYOUTS and not layout.startswith("tp="):
        raise CliError(f"--layout {layout} with --trace: one of {', '.join(LAYOUTS)}")
    if layout != "none" and world < 2:
        raise CliError(f"--layout {layout} needs --gpus (how many, and which)")
    return layout


def setting(args: argparse.Namespace) -> Setting:
    """The trace's settings from ``estimate``'s options.

    Raises:
        CliError: An option the trace cannot honour (one line).
    """
    _refuse_unhonoured(args)
    gpus = _gpus(args)
    world = (gpus.count if gpus else 1) * int(getattr(args, "nodes", 1) or 1)
    every = int(getattr(args, "checkpoint_every", 1) or 1)
    ckpt = bool(getattr(args, "checkpointing", False)) or every > 1
    optimizer = getattr(args, "optimizer", None) or "adamw"
    if optimizer not in OPTIMIZER_CLASSES:
        choices = ", ".join(OPTIMIZER_CLASSES)
        raise CliError(f"--optimizer {optimizer} with --trace: one of {choices}")
    s = Setting(
        spec=args.trace,
        batch=getattr(args, "batch", None),
        seq=getattr(args, "seq", None),
        precision=getattr(args, "precision", None)
        or ("fp32" if getattr(args, "mp_policy", None) else "bf16-mixed"),
        optimizer=optimizer,
        impl=getattr(args, "optimizer_impl", None) or "foreach",
        checkpoint_every=every if ckpt else 0,
        accumulation=int(getattr(args, "accumulation", 1) or 1),
        layout=_layout(args, world),
        world=world,
        device=getattr(args, "device", None) or "cuda",
    )
    # The trace runs on torch's fake process group; the facts say the run's own.
    s.backend = getattr(args, "backend", None) or ("gloo" if s.device == "cpu" else "nccl")
    if s.layout != "none" and not getattr(args, "layout", None):
        s.assumed.append("layout ddp (--layout)")
    s.mp_policy = _mp_policy(getattr(args, "mp_policy", None), s.layout)
    if s.mp_policy:
        s.assumed.append(
            f"MixedPrecisionPolicy: units gathered and computed in {s.mp_policy[0]}, gradients"
            f" reduced in {s.mp_policy[1]} (--mp-policy)"
        )
    return s


def _mp_policy(text: str | None, layout: str) -> tuple[str, str] | None:
    if not text:
        return None
    if not layout.startswith("fsdp"):
        raise CliError("--mp-policy needs --layout fsdp, fsdp-no-reshard, fsdp1 or fsdp1-grad-op")
    param, _, reduce = text.replace(" ", "").partition(",")
    reduce = reduce or "fp32"
    if param not in MP_DTYPES or reduce not in MP_DTYPES:
        raise CliError(f"--mp-policy {text!r}: PARAM[,REDUCE], each one of {', '.join(MP_DTYPES)}")
    return param, reduce


def _gpus(args: argparse.Namespace) -> Any:
    from ..predict import parse_gpus

    if not getattr(args, "gpus", None):
        return None
    try:
        return parse_gpus(args.gpus)
    except ValueError as exc:
        raise CliError(str(exc))


def _reserve(args: argparse.Namespace) -> int:
    from .. import predict

    # (predict's size parser, by the name it has before and after estimate's move there)
    parse: Any = (
        getattr(predict, "parse_gpu_size", None) or getattr(predict, "parse_size")  # noqa: B009
    )
    text = str(getattr(args, "reserve", "1GiB") or "0")
    reserve = parse(text) if text.strip() not in ("0", "") else 0
    if reserve is None:
        raise CliError(f"--reserve {text!r}: a size such as 1GiB or 500MiB")
    return reserve


# --------------------------------------------------------------------------- the builder


def load_builder(spec: str) -> Any:
    """``MODULE:FUNCTION`` (a module name or a ``.py`` path), loaded.

    Raises:
        CliError: Not of that form, or the module or function cannot be loaded.
    """
    module_name, _, func_name = spec.partition(":")
    if not module_name or not func_name:
        raise CliError(f"--trace wants MODULE:FUNCTION, not {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        if module_name.endswith(".py") or os.sep in module_name:
            found = importlib.util.spec_from_file_location("_gpuwatch_trace", module_name)
            if found is None or found.loader is None:
                raise ImportError(module_name)
            module = importlib.util.module_from_spec(found)
            found.loader.exec_module(module)
        else:
            module = importlib.import_module(module_name)
        return getattr(module, func_name)
    except Exception as exc:  # the user's module: whatever it raises, in one line
        raise CliError(f"cannot load {spec}: {_one_line(exc)}")


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200]}" if text else type(exc).__name__


def _keywords(func: Any, s: Setting) -> dict[str, int]:
    """``batch``/``seq`` for the builder where given, refused where it cannot take them."""
    try:
        params = inspect.signature(func).parameters
    except (TypeError, ValueError):
        params = {}  # type: ignore[assignment]
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    out = {}
    for name, value in (("batch", s.batch), ("seq", s.seq)):
        if value is None:
            continue
        if name not in params and not takes_any:
            raise CliError(f"--{name}: {s.spec} takes no {name} argument (give it one)")
        out[name] = value
    return out


@dataclass
class Built:
    """What the builder returned, sorted out."""

    model: Any
    loss_fn: Any
    batch: Any
    optimizer_kind: str | None = None


def _built(value: Any, spec: str, torch: Any) -> Built:
    """The model, the loss function and the batch from what the builder returned."""
    items = list(value) if isinstance(value, (tuple, list)) else [value]
    if not items or not isinstance(items[0], torch.nn.Module):
        raise CliError(f"{spec} must return the model (an nn.Module), optionally with a batch")
    model, rest = items[0], items[1:]
    kind = None
    if rest and isinstance(rest[0], torch.optim.Optimizer):
        kind = KIND_OF_CLASS.get(type(rest[0]).__name__, "adamw")
        rest = rest[1:]
    loss_fn = rest[0] if len(rest) == 2 else None
    if len(rest) > 2 or (loss_fn is not None and not callable(loss_fn)):
        raise CliError(f"{spec} must return model, (model, batch) or (model, loss_fn, batch)")
    if not rest:
        raise CliError(f"{spec} returned no batch: return (model, batch) to run a step")
    return Built(model, loss_fn, rest[-1], kind)


# --------------------------------------------------------------------------- the run


def layers_of(model: Any) -> list[Any]:
    """The model's layers: the children of its largest ``ModuleList`` or ``Sequential``
    (by parameters), as FSDP's per-layer units and activation checkpointing take them."""
    import torch

    best: list[Any] = []
    size = -1
    for mod in model.modules():
        if isinstance(mod, (torch.nn.ModuleList, torch.nn.Sequential)) and len(mod) > 1:
            n = sum(p.numel() for p in mod.parameters())
            if n > size:
                best, size = list(mod), n
    return best


def _checkpoint(model: Any, layers: list[Any], every: int) -> None:
    """Wrap every ``every``-th layer in non-reentrant activation checkpointing (the
    k-th, 2k-th, ...: torchtitan's count), in the container that holds it."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    wanted = {id(m) for i, m in enumerate(layers) if (i + 1) % every == 0}
    # Found first, wrapped after: a wrapper holds its layer, which a walk would find again.
    found = [
        (holder, name, child)
        for holder in model.modules()
        for name, child in holder.named_children()
        if id(child) in wanted
    ]
    for holder, name, child in found:
        holder._modules[name] = checkpoint_wrapper(child)


def _apply_layout(model: Any, layers: list[Any], s: Setting, mesh: Any) -> Any:
    """The layout applied on the fake process group; returns the wrapper (or the model)."""
    import torch

    if s.layout.startswith("tp="):
        return _tensor_parallel(model, layers, s, mesh)
    if s.layout == "ddp":
        from torch.distributed.algorithms.ddp_comm_hooks.debugging_hooks import noop_hook
        from torch.nn.parallel import DistributedDataParallel

        ddp = DistributedDataParallel(model, init_sync=False)
        # The fake group's all-reduce returns nothing; the bucket, reduced in place on a
        # GPU, is what the hook hands back.
        ddp.register_comm_hook(None, noop_hook)
        return ddp
    mp = s.mp_policy and tuple(getattr(torch, _DTYPES.get(d, "float32")) for d in s.mp_policy)
    if s.layout.startswith("fsdp1"):
        from torch.distributed.fsdp import (
            FullyShardedDataParallel,
            MixedPrecision,
            ShardingStrategy,
        )
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        kinds = {type(m) for m in layers} or {type(model)}
        grad_op = s.layout == "fsdp1-grad-op"
        return FullyShardedDataParallel(
            model,
            auto_wrap_policy=ModuleWrapPolicy(kinds),
            sharding_strategy=ShardingStrategy.SHARD_GRAD_OP if grad_op else None,
            mixed_precision=MixedPrecision(param_dtype=mp[0], reduce_dtype=mp[1]) if mp else None,
            device_id=torch.device("cpu"),
        )
    if s.layout in ("fsdp", "fsdp-no-reshard"):
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        kw: dict[str, Any] = {"mesh": mesh, "reshard_after_forward": s.layout == "fsdp"}
        if mp:
            kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=mp[0], reduce_dtype=mp[1])
        for layer in layers:
            fully_shard(layer, **kw)
        fully_shard(model, **kw)
    return model


def tp_plan(layers: list[Any]) -> dict[str, str]:
    """gpuwatch's default tensor-parallel plan: in each layer, consecutive pairs of
    ``nn.Linear`` where the first's output feeds the second, the first split by columns
    and the second by rows (Megatron's MLP split: one all-reduce per pair); anything it
    cannot pair stays replicated. ``{"<layer index>.<name>": "colwise" | "rowwise"}``."""
    import torch

    plan: dict[str, str] = {}
    for i, layer in enumerate(layers):
        linears = [(n, m) for n, m in layer.named_modules() if isinstance(m, torch.nn.Linear)]
        j = 0
        while j + 1 < len(linears):
            (a, first), (b, second) = linears[j], linears[j + 1]
            if first.out_features == second.in_features:
                plan[f"{i}.{a}"], plan[f"{i}.{b}"] = "colwise", "rowwise"
                j += 2
            else:
                j += 1
    return plan


def _tensor_parallel(model: Any, layers: list[Any], s: Setting, mesh: Any) -> Any:
    """:func:`tp_plan` applied with ``parallelize_module`` on the fake group's mesh."""
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    plan = tp_plan(layers)
    if not plan:
        raise CliError(
            f"--layout {s.layout} with --trace: no pair of Linear layers in the model's"
            " layers to split; apply parallelize_module in the builder"
        )
    styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
    for i, layer in enumerate(layers):
        mine = {
            k.partition(".")[2]: styles[v]() for k, v in plan.items() if k.split(".")[0] == str(i)
        }
        if mine:
            # src_data_rank=None: each rank cuts its shard from its own copy, as seeded runs do.
            parallelize_module(layer, mesh, mine, src_data_rank=None)
    names = list(dict.fromkeys(k.partition(".")[2] + f" ({v})" for k, v in plan.items()))
    s.assumed.append(
        f"tensor parallel over {s.world}: in each of {len(layers)} layers {', '.join(names)}"
        " split (Megatron's pairs of Linear), the rest replicated (--layout)"
    )
    return model


def _optimizer(model: Any, s: Setting, torch: Any) -> Any:
    name, options = OPTIMIZER_CLASSES[s.optimizer]
    cls = getattr(torch.optim, name)
    impl = {"foreach": {"foreach": True}, "fused": {"fused": True}}.get(s.impl, {"foreach": False})
    if name == "Adafactor" or (name == "SGD" and s.impl == "fused"):
        impl = {"foreach": s.impl == "foreach"}
    params = [p for p in model.parameters() if p.requires_grad]
    return cls(params, lr=1e-3, **options, **impl)


@contextmanager
def _process_group(s: Setting) -> Iterator[Any]:
    """Rank 0 of ``s.world`` on torch's fake process group (and a CPU mesh for FSDP2, TP)."""
    if s.layout == "none":
        yield None
        return
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise CliError("--trace: a process group is already up in this process")
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=s.world)
    try:
        mesh = None
        if s.layout in ("fsdp", "fsdp-no-reshard") or s.layout.startswith("tp="):
            from torch.distributed.device_mesh import init_device_mesh

            # Made before the fake mode: a mesh reads its ranks' values.
            mesh = init_device_mesh("cpu", (s.world,))
        yield mesh
    finally:
        dist.destroy_process_group()


_DTYPES = {"bf16": "bfloat16", "fp16": "float16"}
_AMP = {"bf16-mixed": "bfloat16", "fp16-mixed": "float16"}


def _call(run: Any, batch: Any) -> Any:
    if isinstance(batch, dict):
        return run(**batch)
    if isinstance(batch, (tuple, list)):
        return run(*batch)
    return run(batch)


def _loss(out: Any, built: Built, torch: Any, spec: str) -> Any:
    if built.loss_fn is not None:
        try:
            wants = len(inspect.signature(built.loss_fn).parameters) >= 2
        except (TypeError, ValueError):
            wants = False
        return built.loss_fn(out, built.batch) if wants else built.loss_fn(out)
    loss = out.get("loss") if isinstance(out, dict) else getattr(out, "loss", out)
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise CliError(f"{spec}: the model returned no loss; return (model, loss_fn, batch)")
    return loss


def _amp_cache(torch: Any, amp: str | None) -> Any:
    """A dispatch mode that adds up the copies autocast keeps in its cache while the
    forward runs: a weight that requires grad, cast to ``amp``, once each (torch's
    ``cached_cast`` keeps exactly those until autocast exits)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    dtype = getattr(torch, amp) if amp else None

    class AmpCache(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.seen: set[int] = set()
            self.bytes = 0

        def __torch_dispatch__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            out = func(*args, **(kwargs or {}))
            src = args[0] if args else None
            if (
                dtype is not None
                and func is torch.ops.aten._to_copy.default
                and isinstance(src, torch.nn.Parameter)
                and src.requires_grad
                and getattr(out, "dtype", None) == dtype
                and id(src) not in self.seen
            ):
                self.seen.add(id(src))
                self.bytes += out.numel() * out.element_size()
            return out

    return AmpCache()


HELD = ("weights", "gradients", "optimizer_state", "activations", "amp_copies")
"""Categories a forward's measured peak does not stand for (the predictor adds them)."""


def _with_cached_copies(facts: dict[str, Any], cached: int) -> dict[str, Any]:
    """The facts with autocast's cached weight copies at the forward's end, where the
    meter saw fewer of them among the saved tensors: inside a checkpointed layer nothing
    is saved, yet the cache holds every copy until autocast exits. They go into the
    forward's measured peak, with what else the forward holds then (the layout's gathered
    units, temporaries: as predicted without them)."""
    from ..predict import predict

    act = facts.get("activations") or {}
    if cached <= int(act.get("amp_copy_bytes") or 0) or act.get("forward_peak"):
        return facts
    before = predict(facts).phases["forward", True].peak  # type: ignore[arg-type]
    extra = sum(v for k, v in before.items() if k not in HELD)
    saved = int(act.get("bytes") or 0)
    peak = {"bytes": saved + cached + extra, "saved_bytes": saved, "amp_copy_bytes": cached}
    return dict(facts, activations=dict(act, forward_peak=dict(peak, at=1.0)))


def _step(built: Built, s: Setting, mesh: Any, torch: Any) -> Traced:
    """The layout applied and one training step run; the facts read as a run reads them."""
    from ..instrument import ActivationMeter, batch_facts, collect_facts

    model = built.model
    model.train()
    parameters = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    layers = layers_of(model)
    if s.checkpoint_every:
        if not layers:
            raise CliError("--checkpointing: the model has no ModuleList of layers to checkpoint")
        _checkpoint(model, layers, s.checkpoint_every)
    wrapper = _apply_layout(model, layers, s, mesh)
    if built.optimizer_kind and s.optimizer == "adamw" and built.optimizer_kind != "adamw":
        s.optimizer = built.optimizer_kind
        s.assumed.append(f"optimizer {s.optimizer}: the builder's (--optimizer)")
    opt = _optimizer(model, s, torch)
    amp = _AMP.get(s.precision)
    # Read before the first step, as watch() reads them: no optimizer state yet.
    facts: dict[str, Any] = dict(
        collect_facts(
            model,
            opt,
            amp_dtype=amp,
            checkpointing=bool(s.checkpoint_every),
            **({"wrapper": wrapper} if wrapper is not model else {}),
        )
    )
    meter = ActivationMeter(torch, model, loss_span=True)
    if not meter.start():
        raise CliError(f"--trace: the activations meter did not start: {meter.error}")
    cache = _amp_cache(torch, amp)
    try:
        with torch.autocast("cpu", dtype=getattr(torch, amp or "bfloat16"), enabled=bool(amp)):
            with cache:
                out = _call(wrapper, built.batch)
                meter.model_returned(out)
                loss = _loss(out, built, torch, s.spec)
            del out
        meter.stop("backward")
        loss.backward()
    finally:
        meter.stop("backward")
    opt.step()
    opt.zero_grad(set_to_none=True)
    args = built.batch if isinstance(built.batch, (tuple, list)) else (built.batch,)
    kwargs = built.batch if isinstance(built.batch, dict) else {}
    facts["batch"] = dict(batch_facts(() if kwargs else args, kwargs))
    facts["activations"] = meter.facts()
    if facts["activations"].get("error"):
        raise CliError(f"--trace: the activations meter failed: {facts['activations']['error']}")
    bf = facts["batch"]
    return Traced(facts, parameters, trainable, bf.get("batch"), bf.get("seq"), cache.bytes)


def trace_step(func: Any, s: Setting) -> Traced:
    """Build the model with ``func`` on fake tensors and trace one step of it under ``s``.

    Raises:
        CliError: The builder failed (its own error, one line), or the step cannot run.
    """
    try:
        import torch
        import torch.testing._internal.distributed.fake_pg  # the "fake" backend
        from torch._subclasses.fake_tensor import FakeTensorMode
    except ImportError as exc:
        raise CliError(f"--trace needs torch: {exc}", 1)
    keywords = _keywords(func, s)
    dtype = getattr(torch, _DTYPES.get(s.precision, "float32"))
    with warnings.catch_warnings(), _process_group(s) as mesh:
        warnings.simplefilter("ignore")
        with FakeTensorMode(allow_non_fake_inputs=True):
            default = torch.get_default_dtype()
            # Built in the weights' dtype: a cast of fake parameters cannot swap them.
            torch.set_default_dtype(dtype)
            try:
                built = _built(func(**keywords), s.spec, torch)
            except CliError:
                raise
            except Exception as exc:  # the user's builder: its own error, one line
                raise CliError(f"{s.spec} failed: {_one_line(exc)}")
            finally:
                torch.set_default_dtype(default)
            try:
                return _step(built, s, mesh, torch)
            except CliError:
                raise
            except Exception as exc:  # the user's model or loss, in one line
                raise CliError(f"{s.spec}: the training step failed: {_one_line(exc)}")


# --------------------------------------------------------------------------- the answer


def _on_target(facts: dict[str, Any], device: str) -> dict[str, Any]:
    """The traced facts (made on the CPU) as the target device's run sends them."""
    if device == "cpu":
        return facts
    out = dict(facts)
    for key in ("params", "buffers", "optimizer"):
        part = dict(out.get(key) or {})
        part["groups"] = [dict(g, device="cuda:0") for g in part.get("groups") or []]
        out[key] = part
    if isinstance(out.get("batch"), dict):
        out["batch"] = dict(out["batch"], device="cuda:0")
    return out


def phase_peaks(facts: dict[str, Any], accumulation: int) -> tuple[Any, dict[bool, dict]]:
    """Each phase's peak by category, for the first step and a later one, walked as the
    dashboard's line walks ``accumulation`` forward/backward pairs per step."""
    from ..predict import Span, predict, span_peaks, total

    pred = predict(facts)  # type: ignore[arg-type]
    spans, t = [], 0
    for step in range(1, STEPS + 1):
        names = ["forward", "backward"] * accumulation + ["optimizer.step", "zero_grad"]
        for name in names:
            spans.append(Span(name, t, t + 10, step))
            t += 10
    out: dict[bool, dict[str, dict[str, int]]] = {True: {}, False: {}}
    for sp in span_peaks(pred, spans):
        first = sp.span.step == 1
        now = out[first].get(sp.span.name)
        if now is None or total(sp.peak) > total(now):
            out[first][sp.span.name] = dict(sp.peak)
    for (name, first), pm in pred.phases.items():
        out[first].setdefault(name, dict(pm.peak))
    return pred, out


def _peak_of(phases: dict[bool, dict]) -> tuple[int, str, bool]:
    from ..predict import total

    best = max(
        ((total(b), name, first) for first, d in phases.items() for name, b in d.items()),
        default=(0, "forward", True),
    )
    return best


def _with_backend(facts: dict[str, Any], backend: str) -> dict[str, Any]:
    """The facts with FSDP2's ``backend`` the run's (the trace's own group is fake)."""
    par = facts.get("parallel")
    if not isinstance(par, dict) or not isinstance(par.get("fsdp"), dict):
        return facts
    return dict(facts, parallel=dict(par, fsdp=dict(par["fsdp"], backend=backend)))


def result_of(traced: Traced, s: Setting) -> dict[str, Any]:
    """The estimate of a traced step, in the config route's form (``--json``'s keys)."""
    from ..predict import PHASES

    facts = _with_backend(_on_target(traced.facts, s.device), s.backend)
    if s.checkpoint_every:
        facts = _with_cached_copies(facts, traced.amp_cached)
    pred, phases = phase_peaks(facts, s.accumulation)
    peak, phase, _ = _peak_of(phases)
    par = facts.get("parallel") or {}
    notes = list(pred.notes)
    empty = dict.fromkeys(("weights",), 0)
    return {
        "peak_bytes": peak,
        "peak_phase": phase,
        "phases": {ph: phases[False].get(ph, empty) for ph in PHASES},
        "first_step": {ph: phases[True].get(ph, empty) for ph in PHASES},
        "parameters": traced.parameters,
        "trainable_parameters": traced.trainable,
        "rank_parameters": int((facts.get("params") or {}).get("count") or 0),
        "activations_known": pred.activations_known,
        "layout": None,
        "parallel": s.layout,
        "world_size": s.world if s.layout != "none" else 1,
        "head": None,
        "seq": traced.seq,
        "batch": traced.batch,
        "host_bytes": 0,
        "traffic_bytes": 0,
        "assumed": s.assumed,
        "notes": notes,
        "traced": {"strategy": par.get("strategy"), "device": s.device},
    }


def _said(s: Setting, traced: Traced) -> None:
    """What the trace assumed, in the config route's words."""
    s.assumed.insert(
        0,
        f"{s.spec}: {traced.parameters:,} parameters, one training step traced on fake"
        " tensors (the facts a run sends, read from the model, its layout and its step)",
    )
    if traced.batch is not None:
        said = " (--batch)" if s.batch else " (the builder's)"
        s.assumed.append(f"batch {traced.batch}{said}")
    ckpt = f", every {s.checkpoint_every} layer(s) checkpointed" if s.checkpoint_every else ""
    s.assumed.append(f"{s.precision}, {s.optimizer} {s.impl}{ckpt}")
    if s.accumulation > 1:
        s.assumed.append(f"{s.accumulation} micro-batches per step (--accumulation)")
    if s.device == "cuda":
        s.assumed.append("a CUDA run (the trace's facts moved to cuda:0)")


def trace_estimate(args: argparse.Namespace) -> dict[str, Any]:
    """``estimate --trace``: the per-phase answer of rank 0, and the fit where GPUs are named.

    Raises:
        CliError: An option the trace cannot honour, or a builder or step that failed.
    """
    s = setting(args)
    func = load_builder(s.spec)
    traced = trace_step(func, s)
    _said(s, traced)
    result = result_of(traced, s)
    gpus = _gpus(args)
    if gpus is not None:
        reserve = _reserve(args)
        nodes = int(getattr(args, "nodes", 1) or 1)
        s.assumed.append(
            f"{gpus.count} x {gpus.name}: {fmt_bytes(gpus.usable(reserve))} each for torch"
            f" ({fmt_bytes(reserve)} reserved: --reserve)"
        )
        result["fit"] = fit(func, s, result, gpus, reserve, nodes)
    return result


# --------------------------------------------------------------------------- the fit


def _candidates(s: Setting, gpus: Any) -> list[tuple[str, str, Setting, str, int]]:
    """``(what, flags, setting, cost, order)`` of each change worth tracing."""
    out = []
    if not s.checkpoint_every:
        out.append(
            (
                "gradient checkpointing",
                "--checkpointing",
                replace(s, checkpoint_every=1, assumed=[]),
                "about a third more compute (each layer's forward runs again in backward)",
                1,
            )
        )
    if s.batch and s.batch > 1:
        half = s.batch // 2
        steps = s.accumulation * (s.batch // half)
        out.append(
            (
                f"micro-batch {half}, {steps} accumulation steps",
                f"--batch {half} --accumulation {steps}",
                replace(s, batch=half, accumulation=steps, assumed=[]),
                "the same samples per step in more, smaller micro-batches",
                2,
            )
        )
    if s.world > 1 and s.layout in ("ddp", "none"):
        out.append(
            (
                "FSDP2 (fully_shard each layer and the root)",
                "--layout fsdp",
                replace(s, layout="fsdp", assumed=[]),
                "an all-gather of each layer in forward and backward, a reduce-scatter",
                3,
            )
        )
    if s.precision in ("fp32", "bf16-mixed", "fp16-mixed"):
        out.append(
            (
                "bf16 weights (no fp32 master copy)",
                "--precision bf16",
                replace(s, precision="bf16", assumed=[]),
                "bf16 weights and optimizer state: less precise updates",
                4,
            )
        )
    return out


def fit(
    func: Any, s: Setting, result: dict[str, Any], gpus: Any, reserve: int, nodes: int
) -> dict[str, Any]:
    """Fits or not, the deciding phase, and (where it does not) each change traced anew."""
    usable = gpus.usable(reserve)
    peak, phase, first = _peak_of({False: result["phases"], True: result["first_step"]})
    changes = []
    if peak > usable:
        for what, flags, changed, cost, order in _candidates(s, gpus):
            try:
                got = result_of(trace_step(func, changed), changed)
            except CliError:
                continue
            changes.append(
                {
                    "change": what,
                    "flags": flags,
                    "peak_bytes": got["peak_bytes"],
                    "fits": got["peak_bytes"] <= usable,
                    "headroom_bytes": usable - got["peak_bytes"],
                    "deciding_phase": got["peak_phase"],
                    "cost": cost,
                    "host_bytes": 0,
                    "traffic_bytes": 0,
                    "order": order,
                }
            )
        changes.sort(key=lambda c: (not c["fits"], c["order"], c["peak_bytes"]))
        for c in changes:
            c.pop("order")
    return {
        "gpus": gpus.count,
        "nodes": nodes,
        "gpu": gpus.name,
        "gpu_bytes": gpus.total,
        "usable_bytes": usable,
        "fits": peak <= usable,
        "peak_bytes": peak,
        "headroom_bytes": usable - peak,
        "deciding_phase": phase,
        "deciding_first_step": first,
        "max_batch": _max_batch(func, s, result, usable),
        "changes": changes,
    }


def _max_batch(func: Any, s: Setting, result: dict[str, Any], usable: int) -> int | None:
    """The largest micro-batch that fits, where the builder takes ``batch``: each phase's
    peak is linear in it, so a second trace at twice the batch gives each line (None
    where the builder takes no batch, or a batch of 1 does not fit)."""
    from ..predict import total

    b = result.get("batch")
    try:
        takes = "batch" in inspect.signature(func).parameters
    except (TypeError, ValueError):
        takes = False
    if not takes or not isinstance(b, int) or b < 1:
        return None
    try:
        twice = result_of(trace_step(func, replace(s, batch=2 * b, assumed=[])), s)
    except CliError:
        return None
    most: int | None = None
    for key in ("phases", "first_step"):
        for ph, now in result[key].items():
            at, at2 = total(now), total(twice[key].get(ph) or now)
            per = (at2 - at) / b
            fixed = at - per * b
            if per <= 0:
                continue
            fits = int((usable - fixed) // per)
            most = fits if most is None else min(most, fits)
    return most if most is None or most >= 1 else 0

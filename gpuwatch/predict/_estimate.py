"""``gpuwatch estimate``'s answer from its options: the plan, its prediction and the fit.

From ``--params``, shape options or a Hugging Face ``config.json`` it builds the
:class:`~._plan.Plan` a training script would run and predicts it with the predictor the
dashboard runs (:func:`~._plan.rank_estimate`); a family without a closed form is counted
and traced on fake tensors (``_hf_trace.py``). The command line and ``gpuwatch.plan``
print :func:`~._report.table` of the :class:`Result`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from typing import Any, NotRequired, TypedDict

from ..fmt import fmt_bytes
from ._fit import answer
from ._gpus import Gpus, parse_gpu_size, parse_gpus
from ._options import EstimateError, Options
from ._plan import FSDP_LAYOUTS, LOSSES, Plan, parse_fsdp_units, parse_layout, rank_estimate
from ._predict import PHASES
from ._shape import ARCHS, IMPLS, OPTIMIZERS, PRECISIONS, ModelShape, parse_lora_targets

PARAMS_TOLERANCE = 0.01
"""``--params`` and a shape agreeing within this (relative) are the same model."""

DEFAULT_PRECISION = "bf16-mixed"
"""``--precision`` not given: fp32 weights under bf16 autocast."""

ATTENTIONS = ("eager", "sdpa", "flash_attention_2")
"""``--attention`` choices."""

DEVICES = ("cuda", "cpu")
"""``--device``: a GPU, or this machine's CPU (a plan checked against a run here)."""

_LOW = {"bfloat16": "bf16", "float16": "fp16"}
"""A config's ``torch_dtype`` that LoRA recipes load the frozen base in."""

Phases = dict[str, dict[str, int]]
"""Bytes per category at each phase's peak."""


class ChangeRow(TypedDict):
    """One ranked change of :class:`Fit`."""

    change: str
    flags: str
    peak_bytes: int
    fits: bool
    headroom_bytes: int
    deciding_phase: str
    cost: str
    host_bytes: int
    traffic_bytes: int


class Fit(TypedDict):
    """Whether the plan fits the GPUs named, and what would make it fit.

    ``fits`` is None where the activations or the optimizer step's temporaries are unknown
    and the rest fits: the plan cannot back a verdict (``peak_bytes`` is then what the rest
    needs, a lower bound).
    """

    gpus: int
    nodes: int
    gpu: str
    gpu_bytes: int
    usable_bytes: int
    fits: bool | None
    peak_bytes: int
    headroom_bytes: int
    deciding_phase: str
    deciding_first_step: bool
    max_batch: int | None
    changes: list[ChangeRow]


class Recorded(TypedDict):
    """``--from``: the recorded run's process, its out-of-memory error and its prediction."""

    pid: int
    oom: dict[str, object] | None
    predicted_peak_bytes: int


class Result(TypedDict):
    """What ``gpuwatch estimate --json`` prints."""

    peak_bytes: int
    peak_phase: str
    phases: Phases
    first_step: Phases
    parameters: int
    trainable_parameters: int
    rank_parameters: int
    activations_known: bool
    step_temporaries_known: NotRequired[bool]
    layout: str | None
    parallel: str
    world_size: int
    head: str | None
    seq: int | None
    batch: int
    host_bytes: int
    traffic_bytes: int
    assumed: list[str]
    notes: list[str]
    fit: NotRequired[Fit]
    recorded: NotRequired[Recorded]


@dataclass
class Target:
    """The GPUs a plan is answered for.

    Attributes:
        gpus: The GPUs per node (None: no fit answer).
        reserve: Bytes of each GPU torch cannot have.
        nodes: Nodes.
    """

    gpus: Gpus | None
    reserve: int
    nodes: int = 1


@dataclass
class _Work:
    """One estimate in the making: the options as completed, and what was assumed."""

    options: Options
    assumed: list[str] = field(default_factory=list)
    dropout_config: dict[str, float] = field(default_factory=dict)
    activation: str | None = None
    meta_config: dict[str, Any] | None = None
    meta_tensors: tuple[tuple[int, ...], ...] = ()
    target: Target = field(default_factory=lambda: Target(None, 0))


def gpus_of(text: str) -> Gpus:
    """``--gpus``, parsed.

    Raises:
        EstimateError: Not GPUs.
    """
    try:
        return parse_gpus(text)
    except ValueError as exc:
        raise EstimateError(str(exc)) from None


def reserve_of(text: str) -> int:
    """``--reserve``'s bytes.

    Raises:
        EstimateError: Not a size.
    """
    reserve = parse_gpu_size(text) if text.strip() not in ("0", "") else 0
    if reserve is None:
        raise EstimateError(f"--reserve {text!r}: a size such as 1GiB or 500MiB")
    return reserve


def _check_choices(o: Options) -> None:
    """What argparse checks on the command line, for options given as keywords."""
    for flag, value, choices in (
        ("--arch", o.arch, ARCHS),
        ("--precision", o.precision, PRECISIONS),
        ("--optimizer", o.optimizer, OPTIMIZERS),
        ("--optimizer-impl", o.optimizer_impl, IMPLS),
        ("--attention", o.attention, ATTENTIONS),
        ("--loss", o.loss, LOSSES),
        ("--device", o.device, DEVICES),
    ):
        if value is not None and value not in choices:
            raise EstimateError(f"{flag} {value!r}: one of {', '.join(choices)}")


def estimate(options: Options) -> Result:
    """The estimate the options ask for (with the fit answer where GPUs are named).

    Raises:
        EstimateError: Options that contradict each other, or a model that cannot be read.
    """
    _check_choices(options)
    work = _Work(replace(options))
    o = work.options
    if o.mp_policy and o.precision is None:
        # FSDP2's policy casts fp32 weights itself: no autocast on top.
        o.precision = "fp32"
    o.checkpointing = o.checkpointing or o.checkpoint_every > 1
    o.batch = o.batch or 1
    shape = _shape(work)
    o.precision = o.precision or DEFAULT_PRECISION
    if shape is None and o.params is None:
        raise EstimateError(
            "give --params, a shape (--layers --hidden --heads --vocab) or --config"
        )
    if o.lora_rank and shape is None:
        raise EstimateError("--lora-rank needs a shape or --config")
    _check_params(work, shape)
    dropout = _dropout(work, shape)
    if shape is not None:
        work.assumed.append(f"batch {o.batch} (--batch)")
    work.assumed.append(
        f"{o.precision}, {o.optimizer} {o.optimizer_impl}"
        + (f", {o.attention} attention" if shape is not None else "")
        + (f", {_checkpointed(o.checkpoint_every)} checkpointed" if o.checkpointing else "")
    )
    plan = _plan(work, shape, dropout)
    if work.meta_config is not None:
        plan = _traced(work, plan)
    return plan_result(plan, work.assumed, work.target)


def _dropout(work: _Work, shape: ModelShape | None) -> dict[str, float]:
    o = work.options
    if o.dropout is not None:
        work.assumed.append(f"dropout {o.dropout} everywhere (--dropout)")
        return {"attn": o.dropout, "resid": o.dropout, "embd": o.dropout}
    dropout = dict(work.dropout_config)
    if dropout:
        shown = ", ".join(f"{k} {v}" for k, v in dropout.items())
        work.assumed.append(f"dropout from the config: {shown} (--dropout to change)")
    elif shape is not None:
        work.assumed.append("no dropout (--dropout)")
    return dropout


def _read_config(path: str) -> dict[str, Any]:
    try:
        with open(path) as f:
            config = json.load(f)
    except (OSError, ValueError) as exc:
        raise EstimateError(f"cannot read {path}: {exc}") from None
    if not isinstance(config, dict):
        raise EstimateError(f"{path} is not a JSON object")
    return config


def _shape(work: _Work) -> ModelShape | None:
    """The model's shape from ``--config`` or the size options (None: neither given, or
    a family without a closed form, counted on the meta device)."""
    from ._shape import shape_from_config

    o = work.options
    if not o.config:
        return _sized_shape(work)
    config = _read_config(o.config)
    try:
        got = shape_from_config(config, o.arch)
    except ValueError as exc:
        _meta_model(work, config, exc)
        return None
    work.assumed += got.assumed
    if o.seq is None:
        o.seq = got.seq
    elif got.shape.arch == "vit" and o.seq != got.seq:
        raise EstimateError(f"--seq {o.seq}: this ViT sees {got.seq} tokens per image")
    else:  # --seq given: the config's length was not assumed
        work.assumed[:] = [a for a in work.assumed if not a.startswith("sequence length ")]
        work.assumed.append(f"sequence length {o.seq} (--seq)")
    if o.dropout is None:
        work.dropout_config = got.dropout
    work.activation = got.activation
    _frozen_dtype(work, config)
    return got.shape


def _frozen_dtype(work: _Work, config: dict[str, Any]) -> None:
    """LoRA or QLoRA without ``--precision``: the frozen base in the config's
    ``torch_dtype`` where it is a 16-bit one, as LoRA recipes load it."""
    o = work.options
    dtype = _LOW.get(str(config.get("torch_dtype") or config.get("dtype")))
    if o.precision is not None or not o.lora_rank or dtype is None:
        return
    o.precision = dtype
    work.assumed.append(
        f"{dtype} weights: the config's torch_dtype, in which LoRA recipes load the"
        " frozen base (--precision to change)"
    )


def _meta_model(work: _Work, config: dict[str, Any], exc: ValueError) -> None:
    """A family without a closed form: counted on the meta device, traced later."""
    from ._hf_trace import meta_count

    o = work.options
    counted = None if o.arch else meta_count(config)
    if counted is None:
        raise EstimateError(f"{o.config}: {exc}") from None
    if o.params is not None and o.params != counted[0]:
        raise EstimateError(f"--params {o.params:,} but {counted[1]} has {counted[0]:,}")
    o.params = counted[0]
    work.meta_config, work.meta_tensors = config, counted[2]
    work.assumed.append(
        f"{counted[0]:,} parameters: {counted[1]} built on the meta device (no closed"
        " form for this family)"
    )
    _meta_seq(work, config)


def _meta_seq(work: _Work, config: dict[str, Any]) -> None:
    """The sequence a family without a closed form is traced at."""
    from ._hf_trace import image_input, image_tokens

    o = work.options
    tokens = image_tokens(config)
    if tokens is not None:
        if o.seq is not None and o.seq != tokens:
            raise EstimateError(f"--seq {o.seq}: this model sees {tokens} tokens per image")
        o.seq = tokens
        c, hgt, wid = image_input(config) or (0, 0, 0)
        work.assumed.append(
            f"sequence {tokens}: the patches and special tokens of a {c}×{hgt}×{wid}"
            " image (the config's)"
        )
    elif o.seq is None:
        keys = ("max_position_embeddings", "n_positions")
        seq = next(
            (config[k] for k in keys if isinstance(config.get(k), int) and config[k] > 0), None
        )
        if seq is not None:
            o.seq = seq
            work.assumed.append(f"sequence length {seq}, the config's positions (--seq)")
    else:
        work.assumed.append(f"sequence length {o.seq} (--seq)")


def _sized_shape(work: _Work) -> ModelShape | None:
    """The shape the size options give (None: none given)."""
    o = work.options
    arch = o.arch or ("llama" if o.kv_heads else "gpt")
    given = [o.layers, o.hidden, o.heads] + ([] if arch == "vit" else [o.vocab])
    if not any(given) and o.arch is None:
        return None
    if not all(given):
        need = "--layers, --hidden, --heads" + ("" if arch == "vit" else " and --vocab")
        raise EstimateError(f"a shape needs {need}")
    if o.arch is None:
        work.assumed.append(f"layout {arch} (--arch)")
    try:
        shape = ModelShape(
            layers=o.layers or 0,
            hidden=o.hidden or 0,
            heads=o.heads or 0,
            vocab=o.vocab or 0,
            arch=arch,
            kv_heads=o.kv_heads,
            head_dim=o.head_dim,
            intermediate=o.intermediate,
            max_positions=o.seq,
            image_size=o.image_size or 224,
            patch_size=o.patch_size or 16,
        )
    except ValueError as exc:
        raise EstimateError(str(exc)) from None
    if arch == "vit":
        o.seq = shape.patches
        work.assumed.append(f"sequence {shape.patches}: patches of the image and CLS")
    return shape


def _check_params(work: _Work, shape: ModelShape | None) -> None:
    """``--params`` with a shape: the same model, or refused (never silently replaced)."""
    o = work.options
    if o.params is None or shape is None:
        return
    counted = shape.count(o.seq or shape.max_positions or 1024)
    if abs(counted - o.params) > PARAMS_TOLERANCE * o.params:
        raise EstimateError(
            f"--params {o.params:,} but the shape has {counted:,} parameters:"
            " give one of them (or fix --intermediate, --kv-heads, --vocab, --arch)"
        )
    work.assumed.append(f"the shape's {counted:,} parameters (--params {o.params:,} agrees)")


def _checkpointed(every: int) -> str:
    """Which layers ``--checkpoint-every`` checkpoints, in words."""
    if every == 1:
        return "every layer"
    return f"every {every}{'nd' if every == 2 else 'rd' if every == 3 else 'th'} layer"


def _target(work: _Work, layout: str | None) -> tuple[str, int]:
    """The GPUs named, and the layout and world they imply."""
    o = work.options
    gpus = gpus_of(o.gpus) if o.gpus else None
    work.target = Target(gpus, reserve_of(o.reserve), o.nodes)
    world = (gpus.count if gpus else 1) * o.nodes
    if layout is None:
        layout = "ddp" if world > 1 else "none"
        if world > 1:
            work.assumed.append("layout ddp (--layout)")
    elif gpus is None and layout != "none":
        raise EstimateError(f"--layout {layout} needs --gpus (how many, and which)")
    if gpus is not None:
        nodes = f" on each of {o.nodes} nodes" if o.nodes > 1 else ""
        usable, reserve = fmt_bytes(gpus.usable(work.target.reserve)), work.target.reserve
        work.assumed.append(
            f"{gpus.count} x {gpus.name}{nodes}: {usable} each for torch"
            f" ({fmt_bytes(reserve)} reserved: --reserve)"
        )
    return layout, world


def _plan(work: _Work, shape: ModelShape | None, dropout: dict[str, float]) -> Plan:
    """The :class:`Plan` the options describe (GPUs, layout and tricks included)."""
    o = work.options
    try:
        targets = parse_lora_targets(o.lora_targets)
        layout = parse_layout(o.layout) if o.layout else None
    except ValueError as exc:
        raise EstimateError(str(exc)) from None
    layout, world = _target(work, layout)
    if o.accumulation > 1:
        work.assumed.append(f"{o.accumulation} micro-batches per step (--accumulation)")
    fsdp = _fsdp_options(work, layout, shape)
    if o.loss != "inside":
        if shape is None or not shape.vocab:
            raise EstimateError(f"--loss {o.loss}: needs a language model's shape or --config")
        shift = "shifted by one (a copy)" if o.loss == "outside" else "unshifted"
        work.assumed.append(f"the loss computed after the model returned, its logits {shift}")
    if o.device != "cuda":
        work.assumed.append(
            "planned against a run on this machine's CPU (--device cpu): no allocator"
            " rounding, SDPA's math path"
        )
    return Plan(
        **fsdp,
        loss=o.loss,
        device=o.device,
        shape=shape,
        params=o.params if shape is None else None,
        batch=o.batch or 1,
        seq=o.seq,
        precision=o.precision or DEFAULT_PRECISION,
        optimizer=o.optimizer,
        impl=o.optimizer_impl,
        attention=o.attention,
        checkpointing=o.checkpointing,
        checkpoint_every=o.checkpoint_every,
        lora_rank=o.lora_rank,
        lora_targets=targets,
        dropout=dropout,
        activation=work.activation,
        layout=layout,
        world=world,
        offload=o.offload,
        accumulation=o.accumulation,
        quant="nf4" if o.qlora else "",
    )


_MP_DTYPES = ("bf16", "fp16", "fp32")


def _fsdp_options(work: _Work, layout: str, shape: ModelShape | None) -> dict[str, Any]:
    """``--fsdp-units`` and ``--mp-policy`` as :class:`Plan` fields (FSDP layouts only)."""
    o = work.options
    out: dict[str, Any] = {}
    if (o.fsdp_units or o.mp_policy) and layout not in FSDP_LAYOUTS:
        flag = "--fsdp-units" if o.fsdp_units else "--mp-policy"
        raise EstimateError(f"{flag} needs --layout {', '.join(FSDP_LAYOUTS)}")
    if o.fsdp_units:
        try:
            out["fsdp_units"] = parse_fsdp_units(o.fsdp_units)
        except ValueError as exc:
            raise EstimateError(str(exc)) from None
        if shape is None:
            raise EstimateError("--fsdp-units needs a shape or a config with a closed form")
        work.assumed.append(f"FSDP units: {o.fsdp_units} around the root (--fsdp-units)")
    if o.mp_policy:
        param, _, reduce = o.mp_policy.replace(" ", "").partition(",")
        reduce = reduce or "fp32"
        if param not in _MP_DTYPES or reduce not in _MP_DTYPES:
            raise EstimateError(
                f"--mp-policy {o.mp_policy!r}: PARAM[,REDUCE], each one of {', '.join(_MP_DTYPES)}"
            )
        out.update(param_dtype=param, reduce_dtype=reduce)
        work.assumed.append(
            f"MixedPrecisionPolicy: units gathered and computed in {param}, gradients reduced"
            f" in {reduce} (--mp-policy), weights {o.precision}"
        )
    return out


def _traced(work: _Work, plan: Plan) -> Plan:
    """A family built by transformers: its activations from one step on fake tensors."""
    if not plan.seq:
        work.assumed.append("activations unknown: the config names no length; give --seq")
        return plan
    if plan.checkpoint_every > 1:
        raise EstimateError(
            "--checkpoint-every: transformers checkpoints every layer of this family;"
            " give --checkpointing alone"
        )
    try:
        act, notes = _trace(work, plan, plan.checkpointing)
    except RuntimeError as exc:
        work.assumed.append(f"activations unknown: the fake-tensor step failed: {exc}")
        return plan
    work.assumed.append(
        "activations traced: one training step of the model on fake tensors (CPU kernels),"
        " what autograd saved counted as a live run counts it" + "".join(f"; {n}" for n in notes)
    )
    plan = replace(plan, activations=act, activations_batch=plan.batch, tensors=work.meta_tensors)
    return _checkpointed_trace(work, plan)


def _trace(work: _Work, plan: Plan, checkpointing: bool) -> tuple[dict[str, Any], list[str]]:
    """One training step of the config's model on fake tensors, as ``plan`` runs it."""
    from ._hf_trace import traced_activations

    assert work.meta_config is not None and plan.seq
    return traced_activations(
        work.meta_config,
        batch=plan.batch,
        seq=plan.seq,
        precision=plan.precision,
        attention=plan.attention,
        checkpointing=checkpointing,
    )


def _checkpointed_trace(work: _Work, plan: Plan) -> Plan:
    """A traced plan that does not fit the GPUs named: the step traced once more with
    every layer checkpointed, for the ranked changes (none where it fits or is already
    checkpointed: the trace costs as much as the first)."""
    gpus = work.target.gpus
    if plan.checkpointing or gpus is None:
        return plan
    try:
        if rank_estimate(plan).peak_bytes <= gpus.usable(work.target.reserve):
            return plan
    except ValueError:
        return plan  # the layout refuses the plan: plan_result() says so
    try:
        act, _ = _trace(work, plan, True)
    except RuntimeError as exc:
        work.assumed.append(
            f"gradient checkpointing not planned: the fake-tensor step failed: {exc}"
        )
        return plan
    work.assumed.append("gradient checkpointing planned from the step traced with it")
    return replace(plan, activations_checkpointed=act)


def _adapters(shape: ModelShape | None, plan: Plan) -> int:
    if not plan.lora_rank or shape is None:
        return 0
    return sum(math.prod(s) for s in shape.lora_tensors(plan.lora_rank, plan.lora_targets))


def plan_result(plan: Plan, assumed: list[str], target: Target) -> Result:
    """The estimate of ``plan`` as the command prints it (with the fit answer where
    ``target`` names GPUs).

    Raises:
        EstimateError: A plan the layout cannot take.
    """
    shape = plan.shape
    try:
        est = rank_estimate(plan)
    except ValueError as exc:
        raise EstimateError(str(exc)) from None
    pred, facts = est.prediction, est.facts
    if shape is not None and not plan.seq:
        pred.notes.append("activations unknown: give --seq")
    if not plan.step_temporaries_known:
        pred.notes.append(
            f"optimizer.step's temporaries unknown: {plan.impl} {plan.optimizer} makes them per"
            " tensor, from the largest ones, and a parameter count alone has no tensor sizes"
            " (counted as 0: a lower bound); give a shape, --config or --trace"
        )
    everything = (
        shape.count(plan.seq or shape.max_positions or 1024) + _adapters(shape, plan)
        if shape is not None
        else facts["params"]["count"]
    )
    out = Result(
        peak_bytes=pred.peak_bytes,
        peak_phase=pred.peak_phase[0],
        phases={ph: dict(pred.phases[ph, False].peak) for ph in PHASES},
        first_step={ph: dict(pred.phases[ph, True].peak) for ph in PHASES},
        parameters=everything,
        trainable_parameters=_adapters(shape, plan) if plan.lora_rank else everything,
        rank_parameters=facts["params"]["count"],
        activations_known=pred.activations_known,
        step_temporaries_known=plan.step_temporaries_known,
        layout=shape.arch if shape is not None else None,
        parallel=plan.layout,
        world_size=plan.world,
        head=shape.head if shape is not None else None,
        seq=plan.seq,
        batch=plan.batch,
        host_bytes=est.host_bytes,
        traffic_bytes=est.traffic_bytes,
        assumed=assumed,
        notes=est.notes + pred.notes,
    )
    if target.gpus is not None:
        out["fit"] = fit_of(plan, target.gpus, target.reserve, target.nodes)
    return out


def fit_of(plan: Plan, gpus: Gpus, reserve: int, nodes: int = 1) -> Fit:
    """Fits or not, the deciding phase, the largest micro-batch and the ranked changes.

    Raises:
        EstimateError: A plan the layout cannot take.
    """
    try:
        ans = answer(plan, gpus.usable(reserve), gpus.name)
    except ValueError as exc:
        raise EstimateError(str(exc)) from None
    fits: bool | None = ans.fits
    known = ans.estimate.prediction.activations_known and plan.step_temporaries_known
    if ans.fits and not known:
        # Only what the unknown parts leave: a lower bound fits, which says nothing.
        fits = None
    changes = [
        ChangeRow(
            change=c.what,
            flags=c.flags,
            peak_bytes=c.peak_bytes,
            fits=c.peak_bytes <= ans.usable,
            headroom_bytes=ans.usable - c.peak_bytes,
            deciding_phase=c.estimate.prediction.peak_phase[0],
            cost=c.cost,
            host_bytes=c.estimate.host_bytes,
            traffic_bytes=c.estimate.traffic_bytes,
        )
        for c in ans.changes
    ]
    return Fit(
        gpus=gpus.count,
        nodes=nodes,
        gpu=gpus.name,
        gpu_bytes=gpus.total,
        usable_bytes=ans.usable,
        fits=fits,
        peak_bytes=ans.estimate.peak_bytes,
        headroom_bytes=ans.headroom,
        deciding_phase=ans.phase[0],
        deciding_first_step=ans.phase[1],
        max_batch=ans.max_batch,
        changes=changes if fits is not None else [],
    )


def changes_from_options(options: Options) -> dict[str, object]:
    """The fields of a recorded run's :class:`Plan` the options change (``--from``).

    Raises:
        EstimateError: A LoRA target or a layout that is not one.
    """
    o = options
    change: dict[str, object] = {}
    if o.batch is not None:
        change["batch"] = o.batch
    if o.seq is not None:
        change["seq"] = o.seq
    if o.checkpointing or o.checkpoint_every > 1:
        change["checkpointing"] = True
        change["checkpoint_every"] = o.checkpoint_every
    try:
        if o.lora_rank:
            change["lora_rank"] = o.lora_rank
            change["lora_targets"] = parse_lora_targets(o.lora_targets)
        if o.accumulation > 1:
            change["accumulation"] = o.accumulation
        if o.qlora:
            change["quant"] = "nf4"
        if o.offload:
            change["offload"] = True
        if o.layout:
            change["layout"] = parse_layout(o.layout)
    except ValueError as exc:
        raise EstimateError(str(exc)) from None
    return change

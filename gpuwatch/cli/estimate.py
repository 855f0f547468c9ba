"""``gpuwatch estimate``: predicted memory per phase before any run.

From ``--params``, shape options or a Hugging Face ``config.json`` it builds the facts a
training script would send and runs the same predictor the dashboard runs. ``--trace``
instead builds the user's own model on fake tensors and counts one real training step
with PyTorch's MemTracker.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import math
import os
import sys
import warnings
from typing import Any

from ..fmt import fmt_bytes
from ._common import EXIT_OK, CliError
from ._hf_trace import image_input, image_tokens, meta_count, traced_activations

TRACE_STEPS = 2
"""Steps ``--trace`` runs: the first creates optimizer state, the second is the steady one."""


def _positive(text: str) -> int:
    try:
        value = int(float(text))
    except (ValueError, OverflowError):  # OverflowError: inf
        raise argparse.ArgumentTypeError(f"not a number: {text!r}")
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text!r}")
    return value


SCALE = {"k": 10**3, "m": 10**6, "b": 10**9, "t": 10**12}
"""``--params 7B``: the suffixes model cards use (thousand, million, billion, trillion)."""


def _count(text: str) -> int:
    """``--params``: ``124M``, ``7B``, ``1.3b``, ``175e9`` or a plain count."""
    scale = SCALE.get(text.strip()[-1:].lower(), 1)
    number = text.strip()[:-1] if scale != 1 else text
    try:
        value = round(float(number) * scale)
    except (ValueError, OverflowError):
        raise argparse.ArgumentTypeError(f"not a count (e.g. 124M, 7B, 1.3e9): {text!r}")
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text!r}")
    return value


def _probability(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}")
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1): {text!r}")
    return value


PARAMS_TOLERANCE = 0.01
"""``--params`` and a shape agreeing within this (relative) are the same model."""


def register(sub: Any) -> None:
    """Add ``estimate`` to the subcommand parsers."""
    from ..predict import ARCHS, IMPLS, OPTIMIZERS, PRECISIONS

    p = sub.add_parser(
        "estimate",
        help="predict GPU memory per training phase before running",
        description="Predict memory per phase (weights, gradients, optimizer state, "
        "activations, temporaries) for a transformer, before any run: decoders (GPT-2, "
        "LLaMA, GPT-NeoX), encoders (BERT, RoBERTa) and ViT. It prints what it assumed.",
    )
    src = p.add_argument_group("model")
    src.add_argument(
        "--params",
        type=_count,
        metavar="N",
        help="parameter count (124M, 7B, 1.3e9; K/M/B/T suffixes): alone, weights, "
        "gradients and optimizer state (activations unknown); with a shape or config, it "
        "must agree with it",
    )
    src.add_argument(
        "--config",
        metavar="FILE",
        help="a Hugging Face config.json (gpt2, llama, mistral, qwen2, falcon, bert, roberta,"
        " gpt_neox, vit)",
    )
    src.add_argument(
        "--arch",
        choices=ARCHS,
        default=None,
        help="layer layout of a shape given by options, or of a config without a known "
        "model_type (default: gpt, llama with --kv-heads)",
    )
    sizes = {
        "layers": "number of layers",
        "hidden": "hidden size",
        "heads": "attention heads",
        "kv-heads": "key/value heads (grouped-query attention)",
        "head-dim": "each head's width, where heads do not divide hidden (GPT-3 XL: 128)",
        "intermediate": "MLP inner size (default 4 x hidden; 8/3 x hidden for llama)",
        "vocab": "vocabulary size (not for vit)",
    }
    for name, what in sizes.items():
        src.add_argument(f"--{name}", type=_positive, help=what)
    src.add_argument("--image-size", type=_positive, help="vit: image side in pixels (224)")
    src.add_argument("--patch-size", type=_positive, help="vit: patch side in pixels (16)")
    p.add_argument(
        "--seq", type=_positive, help="sequence length (default: the config's positions)"
    )
    p.add_argument("--batch", type=_positive, default=None, help="micro-batch size (default 1)")
    p.add_argument(
        "--precision",
        choices=PRECISIONS,
        default="bf16-mixed",
        help="weights' dtype and autocast (default bf16-mixed: fp32 weights, bf16 autocast)",
    )
    p.add_argument("--optimizer", choices=OPTIMIZERS, default="adamw", help="default adamw")
    p.add_argument("--optimizer-impl", choices=IMPLS, default="foreach", help="default foreach")
    p.add_argument(
        "--attention",
        choices=("eager", "sdpa", "flash_attention_2"),
        default="sdpa",
        help="default sdpa",
    )
    p.add_argument(
        "--dropout",
        type=_probability,
        metavar="P",
        help="dropout probability everywhere (default: the config's, else 0); dropout "
        "keeps a mask per dropped tensor",
    )
    p.add_argument("--checkpointing", action="store_true", help="checkpoint every layer")
    p.add_argument(
        "--checkpoint-every",
        type=_positive,
        default=1,
        metavar="K",
        help="with --checkpointing (implied): checkpoint every K-th layer only (layers K, "
        "2K, ... as torchtitan's ac_freq); the others keep all they save",
    )
    p.add_argument(
        "--lora-rank", type=_positive, default=0, metavar="R", help="train LoRA adapters of rank R"
    )
    p.add_argument(
        "--lora-targets",
        default="q,v",
        metavar="ROLES",
        help="roles LoRA adapts: q,k,v,o,gate,up,down; attn, mlp, all-linear (default q,v)",
    )
    p.add_argument(
        "--qlora",
        action="store_true",
        help="QLoRA: the layers' weights in 4-bit NF4 (double-quantised constants), bf16"
        " compute; with --lora-rank",
    )
    p.add_argument(
        "--accumulation",
        type=_positive,
        default=1,
        metavar="K",
        help="micro-batches per optimizer step (gradient accumulation; default 1)",
    )
    run = p.add_argument_group("GPUs and layout (per rank)")
    run.add_argument(
        "--gpus",
        metavar="NxGPU",
        help="GPUs per node: 4xA100-80GB, 8xH100-80GB, 2x24GiB; answers whether it fits",
    )
    run.add_argument("--nodes", type=_positive, default=1, help="nodes (default 1)")
    run.add_argument(
        "--layout",
        default=None,
        metavar="LAYOUT",
        help="ddp, fsdp, fsdp-no-reshard, zero1, zero2, zero3, tp=N or device-map"
        " (default: ddp on several GPUs)",
    )
    run.add_argument(
        "--offload",
        action="store_true",
        help="optimizer states on the host (ZeRO-Offload; FSDP's CPUOffloadPolicy)",
    )
    run.add_argument(
        "--reserve",
        default="1GiB",
        metavar="SIZE",
        help="memory of each GPU torch cannot have: CUDA context, NCCL (default 1GiB)",
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument(
        "--from",
        dest="recording",
        metavar="FILE",
        help="re-plan a recorded run (its facts, its GPU, its out-of-memory error) under"
        " the options given: --batch, --checkpointing, --layout, --gpus, --lora-rank, ...",
    )
    p.add_argument(
        "--trace",
        metavar="MODULE:FUNCTION",
        help="build your model with FUNCTION() on fake tensors and count real steps",
    )
    p.set_defaults(func=cmd_estimate)


def _shape(args: argparse.Namespace, assumed: list[str]) -> Any:
    """The model's shape from ``--config`` or the size options (None: neither given)."""
    from ..predict import ModelShape, shape_from_config

    if args.config:
        try:
            with open(args.config) as f:
                config = json.load(f)
        except (OSError, ValueError) as exc:
            raise CliError(f"cannot read {args.config}: {exc}")
        if not isinstance(config, dict):
            raise CliError(f"{args.config} is not a JSON object")
        try:
            got = shape_from_config(config, args.arch)
        except ValueError as exc:
            counted = None if args.arch else meta_count(config)
            if counted is None:
                raise CliError(f"{args.config}: {exc}")
            if args.params is not None and args.params != counted[0]:
                raise CliError(f"--params {args.params:,} but {counted[1]} has {counted[0]:,}")
            args.params = counted[0]
            args.meta_config, args.meta_tensors = config, counted[2]
            assumed.append(
                f"{counted[0]:,} parameters: {counted[1]} built on the meta device (no closed"
                " form for this family)"
            )
            tokens = image_tokens(config)
            if tokens is not None:
                if args.seq is not None and args.seq != tokens:
                    raise CliError(f"--seq {args.seq}: this model sees {tokens} tokens per image")
                args.seq = tokens
                c, hgt, wid = image_input(config) or (0, 0, 0)
                assumed.append(
                    f"sequence {tokens}: the patches and special tokens of a {c}×{hgt}×{wid}"
                    " image (the config's)"
                )
            elif args.seq is None:
                seq = next(
                    (
                        config[k]
                        for k in ("max_position_embeddings", "n_positions")
                        if isinstance(config.get(k), int) and config[k] > 0
                    ),
                    None,
                )
                if seq is not None:
                    args.seq = seq
                    assumed.append(f"sequence length {seq}, the config's positions (--seq)")
            else:
                assumed.append(f"sequence length {args.seq} (--seq)")
            return None
        assumed += got.assumed
        if args.seq is None:
            args.seq = got.seq
        elif got.shape.arch == "vit" and args.seq != got.seq:
            raise CliError(f"--seq {args.seq}: this ViT sees {got.seq} tokens per image")
        else:  # --seq given: the config's length was not assumed
            assumed[:] = [a for a in assumed if not a.startswith("sequence length ")]
            assumed.append(f"sequence length {args.seq} (--seq)")
        if args.dropout is None:
            args.dropout_config = got.dropout
        args.activation = got.activation
        return got.shape
    arch = args.arch or ("llama" if args.kv_heads else "gpt")
    given = [args.layers, args.hidden, args.heads] + ([] if arch == "vit" else [args.vocab])
    if not any(given) and args.arch is None:
        return None
    if not all(given):
        need = "--layers, --hidden, --heads" + ("" if arch == "vit" else " and --vocab")
        raise CliError(f"a shape needs {need}")
    if args.arch is None:
        assumed.append(f"layout {arch} (--arch)")
    try:
        shape = ModelShape(
            layers=args.layers,
            hidden=args.hidden,
            heads=args.heads,
            vocab=args.vocab or 0,
            arch=arch,
            kv_heads=args.kv_heads,
            head_dim=args.head_dim,
            intermediate=args.intermediate,
            max_positions=args.seq,
            image_size=args.image_size or 224,
            patch_size=args.patch_size or 16,
        )
    except ValueError as exc:
        raise CliError(str(exc))
    if arch == "vit":
        args.seq = shape.patches
        assumed.append(f"sequence {shape.patches}: patches of the image and CLS")
    return shape


def _check_params(args: argparse.Namespace, shape: Any, assumed: list[str]) -> None:
    """``--params`` with a shape: the same model, or refused (never silently replaced)."""
    if args.params is None or shape is None:
        return
    counted = shape.count(args.seq or shape.max_positions or 1024)
    if abs(counted - args.params) > PARAMS_TOLERANCE * args.params:
        raise CliError(
            f"--params {args.params:,} but the shape has {counted:,} parameters:"
            " give one of them (or fix --intermediate, --kv-heads, --vocab, --arch)"
        )
    assumed.append(f"the shape's {counted:,} parameters (--params {args.params:,} agrees)")


def _checkpointed(every: int) -> str:
    """Which layers ``--checkpoint-every`` checkpoints, in words."""
    if every == 1:
        return "every layer"
    return f"every {every}{'nd' if every == 2 else 'rd' if every == 3 else 'th'} layer"


def estimate(args: argparse.Namespace) -> dict[str, Any]:
    """The estimate as ``{"peak_bytes", "phases", "first_step", "assumed", "notes", ...}``."""

    assumed: list[str] = []
    args.dropout_config, args.activation, args.meta_config = {}, None, None
    args.checkpointing = args.checkpointing or args.checkpoint_every > 1
    if args.recording:
        return _from_recording(args, assumed)
    if args.batch is None:
        args.batch = 1
    shape = _shape(args, assumed)
    if shape is None and args.params is None:
        raise CliError("give --params, a shape (--layers --hidden --heads --vocab) or --config")
    if args.lora_rank and shape is None:
        raise CliError("--lora-rank needs a shape or --config")
    _check_params(args, shape, assumed)
    if args.dropout is not None:
        dropout = {"attn": args.dropout, "resid": args.dropout, "embd": args.dropout}
        assumed.append(f"dropout {args.dropout} everywhere (--dropout)")
    else:
        dropout = dict(args.dropout_config)
        if dropout:
            shown = ", ".join(f"{k} {v}" for k, v in dropout.items())
            assumed.append(f"dropout from the config: {shown} (--dropout to change)")
        elif shape is not None:
            assumed.append("no dropout (--dropout)")
    if shape is not None:
        assumed.append(f"batch {args.batch} (--batch)")
    assumed.append(
        f"{args.precision}, {args.optimizer} {args.optimizer_impl}"
        + (f", {args.attention} attention" if shape is not None else "")
        + (f", {_checkpointed(args.checkpoint_every)} checkpointed" if args.checkpointing else "")
    )
    plan = _plan(args, shape, dropout, assumed)
    if args.meta_config is not None:
        plan = _traced(args, plan, assumed)
    return _result(args, plan, assumed)


def _traced(args: argparse.Namespace, plan: Any, assumed: list[str]) -> Any:
    """A family built by transformers: its activations from one step on fake tensors."""
    from dataclasses import replace

    if not plan.seq:
        assumed.append("activations unknown: the config names no length; give --seq")
        return plan
    if plan.checkpoint_every > 1:
        raise CliError(
            "--checkpoint-every: transformers checkpoints every layer of this family;"
            " give --checkpointing alone"
        )
    try:
        act, notes = _trace(args, plan, plan.checkpointing)
    except RuntimeError as exc:
        assumed.append(f"activations unknown: the fake-tensor step failed: {exc}")
        return plan
    assumed.append(
        "activations traced: one training step of the model on fake tensors (CPU kernels),"
        " what autograd saved counted as a live run counts it" + "".join(f"; {n}" for n in notes)
    )
    plan = replace(plan, activations=act, activations_batch=plan.batch, tensors=args.meta_tensors)
    return _checkpointed_trace(args, plan, assumed)


def _trace(
    args: argparse.Namespace, plan: Any, checkpointing: bool
) -> tuple[dict[str, Any], list[str]]:
    """One training step of the config's model on fake tensors, as ``plan`` runs it."""
    return traced_activations(
        args.meta_config,
        batch=plan.batch,
        seq=plan.seq,
        precision=plan.precision,
        attention=plan.attention,
        checkpointing=checkpointing,
    )


def _checkpointed_trace(args: argparse.Namespace, plan: Any, assumed: list[str]) -> Any:
    """A traced plan that does not fit the GPUs named: the step traced once more with
    every layer checkpointed, for the ranked changes (none where it fits or is already
    checkpointed: the trace costs as much as the first)."""
    from dataclasses import replace

    from ..predict import rank_estimate

    if plan.checkpointing or args.gpus_parsed is None:
        return plan
    try:
        if rank_estimate(plan).peak_bytes <= args.gpus_parsed.usable(args.reserve_bytes):
            return plan
    except ValueError:
        return plan  # the layout refuses the plan: _result says so
    try:
        act, _ = _trace(args, plan, True)
    except RuntimeError as exc:
        assumed.append(f"gradient checkpointing not planned: the fake-tensor step failed: {exc}")
        return plan
    assumed.append("gradient checkpointing planned from the step traced with it")
    return replace(plan, activations_checkpointed=act)


def _result(args: argparse.Namespace, plan: Any, assumed: list[str]) -> dict[str, Any]:
    """The estimate of ``plan`` as the command prints it (with the answer where GPUs are
    named)."""
    from ..predict import PHASES, rank_estimate

    shape = plan.shape
    try:
        est = rank_estimate(plan)
    except ValueError as exc:
        raise CliError(str(exc))
    pred, facts = est.prediction, est.facts
    if shape is not None and not plan.seq:
        pred.notes.append("activations unknown: give --seq")
    later = {ph: dict(pred.phases[ph, False].peak) for ph in PHASES}
    first = {ph: dict(pred.phases[ph, True].peak) for ph in PHASES}
    everything = (
        shape.count(plan.seq or shape.max_positions or 1024) + _adapters(shape, plan)
        if shape is not None
        else facts["params"]["count"]
    )
    result: dict[str, Any] = {
        "peak_bytes": pred.peak_bytes,
        "peak_phase": pred.peak_phase[0],
        "phases": later,
        "first_step": first,
        "parameters": everything,
        "trainable_parameters": _adapters(shape, plan) if plan.lora_rank else everything,
        "rank_parameters": facts["params"]["count"],
        "activations_known": pred.activations_known,
        "layout": shape.arch if shape is not None else None,
        "parallel": plan.layout,
        "world_size": plan.world,
        "head": shape.head if shape is not None else None,
        "seq": plan.seq,
        "batch": plan.batch,
        "host_bytes": est.host_bytes,
        "traffic_bytes": est.traffic_bytes,
        "assumed": assumed,
        "notes": est.notes + pred.notes,
    }
    if args.gpus_parsed is not None:
        result["fit"] = _answer(plan, args)
    return result


def _from_recording(args: argparse.Namespace, assumed: list[str]) -> dict[str, Any]:
    """``--from FILE``: the recorded run's plan, its GPU and its out-of-memory error, with
    the options given as changes."""
    from dataclasses import replace

    from ..analysis.oom_answer import recorded_plan
    from ..predict import Gpus, parse_layout, parse_lora_targets, rank_estimate
    from ..store.loader import load

    try:
        session = load(args.recording)
    except Exception as exc:  # a file that is not a recording, in any way
        raise CliError(f"cannot read {args.recording}: {str(exc)[:200]}")
    try:
        rec = recorded_plan(session)
    except ValueError as exc:
        raise CliError(f"{args.recording}: {exc}")
    pid, plan, recorded = rec.pid, rec.plan, rec.recorded
    assumed.append(f"the plan of pid {pid} in {os.path.basename(args.recording)}, from its facts")
    assumed += rec.assumed
    gpu_total, names = rec.gpu_total, [rec.gpu] if rec.gpu else []
    oom, phase, demand = rec.oom, rec.phase, rec.demand
    # The options given are the change.
    change: dict[str, Any] = {}
    if args.batch is not None:
        change["batch"] = args.batch
    if args.seq is not None:
        change["seq"] = args.seq
    if args.checkpointing:
        change["checkpointing"] = True
        change["checkpoint_every"] = args.checkpoint_every
    if args.lora_rank:
        change["lora_rank"] = args.lora_rank
        try:
            change["lora_targets"] = parse_lora_targets(args.lora_targets)
        except ValueError as exc:
            raise CliError(str(exc))
    if args.accumulation > 1:
        change["accumulation"] = args.accumulation
    if args.qlora:
        change["quant"] = "nf4"
    if args.offload:
        change["offload"] = True
    if args.layout:
        try:
            change["layout"] = parse_layout(args.layout)
        except ValueError as exc:
            raise CliError(str(exc))
    if args.gpus:
        gpus = _gpus_arg(args.gpus)
        change["world"] = gpus.count * args.nodes
    else:
        body = oom.body if oom is not None and isinstance(oom.body, dict) else {}
        total = gpu_total or int(body.get("total") or 0)
        if not total:
            raise CliError(f"{args.recording}: no GPU's memory recorded; give --gpus")
        count = max(plan.world // args.nodes, 1)
        gpus = Gpus(count, names[0] if names else "recorded GPU", total)
    if change.get("layout", plan.layout) != "none" and change.get("world", plan.world) < 2:
        change.setdefault("world", gpus.count * args.nodes)
    plan = replace(plan, **change)
    if change:
        shown = ", ".join(f"{k} {v}" for k, v in change.items())
        assumed.append(f"changed: {shown}")
    reserve = _reserve(args)
    args.gpus_parsed, args.reserve_bytes = gpus, reserve
    assumed.append(
        f"{gpus.count} x {gpus.name}: {fmt_bytes(gpus.usable(reserve))} each for torch"
        f" ({fmt_bytes(reserve)} reserved: --reserve)"
    )
    result = _result(args, plan, assumed)
    result["recorded"] = {
        "pid": pid,
        "oom": {"phase": phase, "demand_bytes": demand} if oom is not None else None,
        "predicted_peak_bytes": rank_estimate(recorded).peak_bytes,
    }
    return result


def _gpus_arg(text: str) -> Any:
    from ..predict import parse_gpus

    try:
        return parse_gpus(text)
    except ValueError as exc:
        raise CliError(str(exc))


def _reserve(args: argparse.Namespace) -> int:
    from ..predict import parse_size

    reserve = parse_size(args.reserve) if args.reserve.strip() not in ("0", "") else 0
    if reserve is None:
        raise CliError(f"--reserve {args.reserve!r}: a size such as 1GiB or 500MiB")
    return reserve


def _adapters(shape: Any, plan: Any) -> int:
    if not plan.lora_rank:
        return 0
    return sum(math.prod(s) for s in shape.lora_tensors(plan.lora_rank, plan.lora_targets))


def _plan(
    args: argparse.Namespace, shape: Any, dropout: dict[str, float], assumed: list[str]
) -> Any:
    """The :class:`Plan` the options describe (GPUs, layout and tricks included)."""
    from ..predict import Plan, parse_gpus, parse_layout, parse_lora_targets

    try:
        targets = parse_lora_targets(args.lora_targets)
        gpus = parse_gpus(args.gpus) if args.gpus else None
        layout = parse_layout(args.layout) if args.layout else None
    except ValueError as exc:
        raise CliError(str(exc))
    reserve = _reserve(args)
    args.gpus_parsed, args.reserve_bytes = gpus, reserve
    world = (gpus.count if gpus else 1) * args.nodes
    if layout is None:
        layout = "ddp" if world > 1 else "none"
        if world > 1:
            assumed.append("layout ddp (--layout)")
    elif gpus is None and layout != "none":
        raise CliError(f"--layout {layout} needs --gpus (how many, and which)")
    if gpus is not None:
        nodes = f" on each of {args.nodes} nodes" if args.nodes > 1 else ""
        assumed.append(
            f"{gpus.count} x {gpus.name}{nodes}: {fmt_bytes(gpus.usable(reserve))} each for"
            f" torch ({fmt_bytes(reserve)} reserved: --reserve)"
        )
    if args.accumulation > 1:
        assumed.append(f"{args.accumulation} micro-batches per step (--accumulation)")
    return Plan(
        shape=shape,
        params=args.params if shape is None else None,
        batch=args.batch,
        seq=args.seq,
        precision=args.precision,
        optimizer=args.optimizer,
        impl=args.optimizer_impl,
        attention=args.attention,
        checkpointing=args.checkpointing,
        checkpoint_every=args.checkpoint_every,
        lora_rank=args.lora_rank,
        lora_targets=targets,
        dropout=dropout,
        activation=args.activation,
        layout=layout,
        world=world,
        offload=args.offload,
        accumulation=args.accumulation,
        quant="nf4" if args.qlora else "",
    )


def _answer(plan: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Fits or not, the deciding phase, the largest micro-batch and the ranked changes."""
    from ..predict import answer

    gpus = args.gpus_parsed
    try:
        ans = answer(plan, gpus.usable(args.reserve_bytes), gpus.name)
    except ValueError as exc:
        raise CliError(str(exc))
    return {
        "gpus": gpus.count,
        "nodes": args.nodes,
        "gpu": gpus.name,
        "gpu_bytes": gpus.total,
        "usable_bytes": ans.usable,
        "fits": ans.fits,
        "peak_bytes": ans.estimate.peak_bytes,
        "headroom_bytes": ans.headroom,
        "deciding_phase": ans.phase[0],
        "deciding_first_step": ans.phase[1],
        "max_batch": ans.max_batch,
        "changes": [
            {
                "change": c.what,
                "flags": c.flags,
                "peak_bytes": c.peak_bytes,
                "fits": c.peak_bytes <= ans.usable,
                "headroom_bytes": ans.usable - c.peak_bytes,
                "deciding_phase": c.estimate.prediction.peak_phase[0],
                "cost": c.cost,
                "host_bytes": c.estimate.host_bytes,
                "traffic_bytes": c.estimate.traffic_bytes,
            }
            for c in ans.changes
        ],
    }


def _table(result: dict[str, Any]) -> str:
    from ..predict import CATEGORIES, PHASES

    phases = result["phases"]
    width = max(len(c) for c in CATEGORIES) + 2
    head = "".ljust(width) + "".join(ph.rjust(16) for ph in PHASES)
    lines = [
        f"{result['parameters']:,} parameters ({result['trainable_parameters']:,} trainable);"
        + (
            f" on each of {result['world_size']} ranks ({result['parallel']}),"
            if result["world_size"] > 1
            else ""
        )
        + " bytes at each phase's peak, steps after the first:",
        "",
        head,
    ]
    for cat in CATEGORIES:
        if cat not in CATEGORIES[:6] and not any(phases[ph][cat] for ph in PHASES):
            continue  # a parallel layout's buffers: none on one GPU
        if cat == "activations" and not result["activations_known"]:
            cells = "".join("unknown".rjust(16) for _ in PHASES)
        else:
            cells = "".join(fmt_bytes(phases[ph][cat]).rjust(16) for ph in PHASES)
        lines.append(cat.replace("_", " ").ljust(width) + cells)
    totals = "".join(fmt_bytes(sum(phases[ph].values())).rjust(16) for ph in PHASES)
    lines.append("total".ljust(width) + totals)
    lines.append("")
    lines.append(f"peak: {fmt_bytes(result['peak_bytes'])} in {result['peak_phase']}")
    lines.extend(f"assumed: {a}" for a in result["assumed"])
    lines.extend(f"note: {n}" for n in result["notes"])
    if "fit" in result:
        lines += ["", *_fit_lines(result)]
    return "\n".join(lines)


def _fit_lines(result: dict[str, Any]) -> list[str]:
    """The answer, in a few lines: fits or not, why, and what would make it fit."""
    fit = result["fit"]
    where = f"{fit['gpus']} x {fit['gpu']}" + (
        f" x {fit['nodes']} nodes" if fit["nodes"] > 1 else ""
    )
    layout = result["parallel"] if result["parallel"] != "none" else "one GPU"
    phase = fit["deciding_phase"] + (" (first step)" if fit["deciding_first_step"] else "")
    usable = fmt_bytes(fit["usable_bytes"])
    if fit["fits"]:
        verdict = f"FITS: {fmt_bytes(fit['headroom_bytes'])} to spare per rank"
    else:
        verdict = f"DOES NOT FIT: {fmt_bytes(-fit['headroom_bytes'])} short per rank"
    lines = [
        f"on {where} ({layout}): peak {fmt_bytes(fit['peak_bytes'])} per rank of {usable},"
        f" in {phase}",
        verdict,
    ]
    if fit["max_batch"] is not None:
        most = fit["max_batch"]
        lines.append(
            f"largest micro-batch that fits: {most}" if most else "no micro-batch fits as planned"
        )
    if fit["changes"]:
        fitting = any(c["fits"] for c in fit["changes"])
        lines.append(
            "what would make it fit, cheapest first:" if fitting else "closest changes (none fits):"
        )
        for i, c in enumerate(fit["changes"][:8], 1):
            lines.append(
                f"{i:>2}. {c['change']}: peak {fmt_bytes(c['peak_bytes'])} per rank"
                f" ({fmt_bytes(abs(c['headroom_bytes']))} {'spare' if c['fits'] else 'short'},"
                f" {c['deciding_phase']})  [{c['flags']}]"
            )
            lines.append(f"    cost: {c['cost']}")
    return lines


def trace(spec: str) -> dict[str, Any]:
    """Run ``MODULE:FUNCTION``'s model for :data:`TRACE_STEPS` steps on fake tensors.

    ``FUNCTION()`` (no arguments) is called under ``FakeTensorMode`` and returns
    ``(model, optimizer, batch)``: ``model(*batch)`` (or ``model(**batch)`` for a dict)
    returns the loss tensor, or an object with a ``.loss``. Every tensor it makes is fake:
    shapes and dtypes only, no memory, so a model far larger than this machine works.
    PyTorch's MemTracker counts each step (forward, backward, ``optimizer.step()``,
    ``zero_grad(set_to_none=True)``) by category.
    """
    module_name, _, func_name = spec.partition(":")
    if not module_name or not func_name:
        raise CliError(f"--trace wants MODULE:FUNCTION, not {spec!r}")
    try:
        import torch
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.distributed._tools.mem_tracker import MemTracker
    except ImportError as exc:
        raise CliError(f"--trace needs torch with MemTracker: {exc}", 1)
    sys.path.insert(0, os.getcwd())
    try:
        if module_name.endswith(".py") or os.sep in module_name:
            spec_ = importlib.util.spec_from_file_location("_gpuwatch_trace", module_name)
            if spec_ is None or spec_.loader is None:
                raise ImportError(module_name)
            module = importlib.util.module_from_spec(spec_)
            spec_.loader.exec_module(module)
        else:
            module = importlib.import_module(module_name)
        func = getattr(module, func_name)
    except (ImportError, AttributeError, OSError) as exc:
        raise CliError(f"cannot load {spec}: {exc}")
    steps = []
    with warnings.catch_warnings(), FakeTensorMode(allow_non_fake_inputs=True):
        # MemTracker's own chatter about a module gone before its backward (one built
        # inside forward) is about its bookkeeping, not the user's model.
        warnings.filterwarnings("ignore", message="Module is None", category=UserWarning)
        built = func()
        if not (isinstance(built, tuple) and len(built) == 3):
            raise CliError(f"{spec} must return (model, optimizer, batch)")
        model, opt, batch = built
        tracker = MemTracker()
        tracker.track_external(model, opt)
        with tracker:
            for _ in range(TRACE_STEPS):
                out = model(**batch) if isinstance(batch, dict) else model(*batch)
                loss = getattr(out, "loss", out)
                if not isinstance(loss, torch.Tensor):
                    raise CliError(f"{spec}: the model returned no loss tensor")
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                del out, loss
                snap = tracker.get_tracker_snapshot("peak")
                steps.append(
                    {
                        str(dev): {getattr(k, "value", str(k)): int(v) for k, v in cats.items()}
                        for dev, cats in snap.items()
                    }
                )
                tracker.reset_mod_stats()
    peak = max((d.get("Total", 0) for s in steps for d in s.values()), default=0)
    return {"peak_bytes": peak, "steps": steps}


def cmd_estimate(args: argparse.Namespace) -> int:
    """``gpuwatch estimate``."""
    if args.trace:
        result = trace(args.trace)
        if args.json:
            print(json.dumps(result, indent=2))
        else:
            for i, step in enumerate(result["steps"], 1):
                for dev, cats in step.items():
                    parts = ", ".join(
                        f"{k.lower()} {fmt_bytes(v)}" for k, v in cats.items() if v and k != "Total"
                    )
                    print(f"peak up to step {i} on {dev}: {fmt_bytes(cats.get('Total'))} ({parts})")
            print(f"peak: {fmt_bytes(result['peak_bytes'])} (MemTracker, fake tensors)")
        return EXIT_OK
    result = estimate(args)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(_table(result))
    return EXIT_OK


class _Refusing(argparse.ArgumentParser):
    """A parser that raises :class:`CliError` instead of exiting (``gpuwatch.plan``)."""

    def error(self, message: str) -> Any:
        raise CliError(message)

    def exit(self, status: int = 0, message: str | None = None) -> Any:
        raise CliError((message or "").strip() or "no estimate")


def plan_from_options(argv: list[str]) -> tuple[dict[str, Any], str]:
    """What ``gpuwatch estimate ARGV`` answers: the result (``--json``'s) and its text.

    Raises:
        CliError: The options are wrong or the model cannot be read (one line).
    """
    parser = _Refusing(prog="gpuwatch", add_help=False)
    register(parser.add_subparsers(dest="command", parser_class=_Refusing))
    args = parser.parse_args(["estimate", *argv])
    if args.trace:
        raise CliError("--trace is not available here; run gpuwatch estimate --trace")
    result = estimate(args)
    return result, _table(result)


def oom_answer(path: str) -> dict[str, Any] | None:
    """What ``estimate --from PATH`` answers, for ``info`` of a recording with an
    out-of-memory error: ``{"command", "fits", "changes"}``, or None where the recording
    cannot be planned (no facts, no GPU's memory)."""
    parser = argparse.ArgumentParser(add_help=False)
    register(parser.add_subparsers())
    args = parser.parse_args(["estimate", "--from", path])
    try:
        result = estimate(args)
    except CliError:
        return None
    fit = result["fit"]
    return {
        "command": f"gpuwatch estimate --from {path}",
        "fits": fit["fits"],
        "peak_bytes": fit["peak_bytes"],
        "max_batch": fit["max_batch"],
        "changes": fit["changes"][:3],
    }


def oom_answer_lines(answer: dict[str, Any]) -> list[str]:
    """``info``'s lines for :func:`oom_answer`."""
    lines = [f"what would have fitted ({answer['command']}):"]
    if answer["max_batch"]:
        lines.append(f"  largest micro-batch that fits: {answer['max_batch']}")
    for c in answer["changes"]:
        state = "fits" if c["fits"] else "short"
        lines.append(
            f"  {c['flags']}: peak {fmt_bytes(c['peak_bytes'])} per rank ({state}); {c['cost']}"
        )
    return lines

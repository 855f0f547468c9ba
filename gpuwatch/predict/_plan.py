"""One rank of a run that does not exist yet, under a parallel layout.

``gpuwatch estimate --gpus 4xA100-80GB --layout zero3`` builds the facts rank 0 of such a
run would send (``docs/facts.md``): the parameters and optimizer buckets this rank holds
(local shards under FSDP, partitions under ZeRO, column/row shards under tensor
parallelism) and the ``parallel`` part :mod:`._layout <gpuwatch.instrument._layout>` reads
from the live wrapper, with the library's defaults where a user would leave them. The
same :func:`~gpuwatch.predict.predict` the dashboard runs then predicts it, layout rules
included (``_parallel.py``): there is no second set of formulas here, only facts.

What each layout's facts hold, and the library default each takes:

- ``ddp``: every state whole; ``DistributedDataParallel``'s 25 MiB buckets, no
  ``gradient_as_bucket_view``.
- ``fsdp`` / ``fsdp-no-reshard``: ``fully_shard`` on every layer and the root, no
  ``MixedPrecisionPolicy`` (the parameters' own dtype, autocast as ``--precision``
  says); each rank holds ``1/N`` of every parameter, gradient and optimizer state.
- ``zero1``/``zero2``/``zero3``: DeepSpeed with ``bf16``/``fp16`` enabled for a mixed
  ``--precision`` (16-bit weights and gradients, no autocast) and its
  ``DeepSpeedZeroConfig`` defaults (``reduce_bucket_size`` 5e8, ``overlap_comm`` only at
  stage 3, ``stage3_max_live_parameters`` 1e9, prefetch 5e7, persistence threshold 1e5);
  the inner optimizer steps one flat fp32 partition beside the fp32 master partition.
- ``tp=N``: Megatron's split (Shoeybi et al. 2019): q/k/v and the MLP's first matrix by
  columns, the output projections by rows, the embedding and the logits by vocabulary;
  norms and row-parallel biases replicated. The activations are the model's with
  ``heads``, ``kv_heads``, ``intermediate`` and ``vocab`` divided by ``N`` (head size
  kept): what a layer keeps becomes ``s·b·h·(10 + 24/t + 5·a·s/(h·t))``
  (Korthikanti et al. 2022, equation 2).
- ``device-map``: Accelerate's ``device_map="auto"`` cuts the layers into ``N``
  consecutive stages; one GPU is planned with its share of the layers and, as an upper
  bound, the embeddings and the head (on the first and last GPU of a real map).

``offload`` moves what ZeRO-Offload (``offload_optimizer: cpu``) or FSDP2's
``CPUOffloadPolicy`` keep on the host out of the device's facts, and counts it as host
memory.
"""

from __future__ import annotations

import inspect
import math
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any

from ..facts import MAX_UNITS, Facts
from ._optim import ESTIMATE_OPTIMIZERS, KINDS, optimizer_memory
from ._parallel import ROOT
from ._predict import Prediction, _dict, predict
from ._shape import ModelShape, _numel, facts_from_shape

LAYOUTS = (
    "none",
    "ddp",
    "fsdp",
    "fsdp-no-reshard",
    "fsdp1",
    "fsdp1-grad-op",
    "zero1",
    "zero2",
    "zero3",
    "tp=N",
    "device-map",
)
"""``--layout`` choices (``tp=N``: tensor parallel of degree N)."""

SHARDING = {
    "fsdp": 3,
    "fsdp-no-reshard": 3,
    "fsdp1": 3,
    "fsdp1-grad-op": 3,
    "zero1": 1,
    "zero2": 2,
    "zero3": 3,
}
"""How much of the model states a data-parallel layout divides: ZeRO's stage numbers
(1: optimizer states, 2: and gradients, 3: and parameters), FSDP full sharding as 3."""

DDP_BUCKET_BYTES = 25 << 20
"""``DistributedDataParallel(bucket_cap_mb=25)``."""

ZERO_DEFAULTS: dict[str, int] = {
    "reduce_bucket_size": 500_000_000,
    "allgather_bucket_size": 500_000_000,
    "stage3_prefetch_bucket_size": 50_000_000,
    "stage3_max_live_parameters": 1_000_000_000,
    "stage3_param_persistence_threshold": 100_000,
}
"""``deepspeed.runtime.zero.config.DeepSpeedZeroConfig``'s defaults (elements)."""

FSDP_LAYOUTS = ("fsdp", "fsdp-no-reshard", "fsdp1", "fsdp1-grad-op")
"""The layouts whose units :func:`_fsdp` builds (FSDP2's ``fully_shard``, FSDP1)."""

FSDP_PARTS = ("embed", "layers", "norm", "head")
"""What ``--fsdp-units`` names: the embeddings, each layer, the final norm, the head."""

LOSSES = ("inside", "outside", "outside-unshifted")
"""``--loss``: computed by the model (given labels), or after it returned, with the usual
shift (``logits[:, :-1]`` made contiguous: a copy of the logits) or without."""

_ZERO_PRECISION = {"bf16-mixed": "bf16", "fp16-mixed": "fp16"}
_ELT = {"fp32": 4, "bf16": 2, "fp16": 2, "bf16-mixed": 4, "fp16-mixed": 4}
_DTYPE = {4: "float32", 2: "bfloat16"}
_DTYPE_NAME = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def parse_fsdp_units(text: str) -> tuple[str, ...]:
    """``--fsdp-units``: the units around the root, in forward order: ``layers`` (the
    default: each layer), ``embed,layers,[norm,head]`` (a bracketed group is one unit,
    ``fully_shard([norm, head])``, kept as ``norm+head``). What no unit names stays in
    the root's.

    Raises:
        ValueError: One line naming the parts.
    """
    units: list[str] = []
    seen: set[str] = set()
    for item in text.replace(" ", "").replace("],", "];").replace(",[", ";[").split(";"):
        group = item.strip("[]").split(",") if item.startswith("[") else item.split(",")
        names = [g for g in group if g]
        bad = [g for i, g in enumerate(names) if g not in FSDP_PARTS or g in {*seen, *names[:i]}]
        if bad or not names:
            raise ValueError(
                f"--fsdp-units {text!r}: parts {', '.join(FSDP_PARTS)}, each once;"
                " [a,b] is one unit of two"
            )
        seen.update(names)
        units += ["+".join(names)] if item.startswith("[") else names
    if any("layers" in u.split("+") and u != "layers" for u in units):
        raise ValueError(f"--fsdp-units {text!r}: layers are units of their own")
    return tuple(units)


def parse_layout(text: str) -> str:
    """A ``--layout`` value, normalised (``tp=4``, ``zero3``, ...).

    Raises:
        ValueError: One line naming the choices.
    """
    t = text.strip().lower().replace("_", "-")
    t = {"zero-1": "zero1", "zero-2": "zero2", "zero-3": "zero3", "fsdp2": "fsdp"}.get(t, t)
    if t.startswith("tp="):
        degree = t[3:]
        if degree.isdigit() and 1 < int(degree) <= 4096:
            return f"tp={int(degree)}"
        raise ValueError(f"--layout {text!r}: tp=N with N a degree of 2 or more")
    if t not in LAYOUTS or t == "tp=N":
        raise ValueError(f"--layout {text!r}: one of {', '.join(LAYOUTS)}")
    return t


@dataclass(frozen=True)
class Plan:
    """Everything ``estimate`` varies: the model, the settings and the layout.

    Attributes:
        shape: The model's shape, or None when only ``params`` is known.
        params: Parameter count without a shape.
        batch, seq: The micro-batch and sequence length.
        precision, optimizer, impl, attention: As :func:`facts_from_shape` takes them.
        checkpointing: Checkpoint layers; ``checkpoint_every``: every k-th (1: all).
        lora_rank, lora_targets: LoRA adapters (rank 0: none).
        dropout: Dropout probabilities; ``activation``: the MLP's activation.
        layout: One of :data:`LAYOUTS` (``tp=N`` with its degree).
        world: Ranks in all (GPUs per node times nodes).
        offload: Optimizer states (and, under FSDP, parameters and gradients) on the host.
        accumulation: Micro-batches per optimizer step (gradient accumulation).
        device: ``cuda``, or ``cpu`` to set a plan against a run on the CPU (the
            predictor's CPU rules: no allocator rounding, SDPA's math path).
        quant: ``nf4`` for QLoRA (Dettmers et al. 2023): the layers' linear weights in
            4-bit NormalFloat with double-quantised constants, computing in bf16.
        fsdp_units: FSDP's units around the root, in forward order
            (:func:`parse_fsdp_units`): ``layers`` each layer, ``embed``, ``norm``,
            ``head``, ``norm+head`` one unit of two; the rest is the root's.
        param_dtype, reduce_dtype: FSDP2's ``MixedPrecisionPolicy`` (``bf16``, ``fp32``;
            empty: none): units gathered and computed in ``param_dtype``, gradients
            reduced in ``reduce_dtype``, the sharded states in the weights' own dtype.
        loss: One of :data:`LOSSES`.
        excess, excess_phase, excess_per: What a recorded run needed beyond its
            prediction (an out-of-memory error's allocated plus requested bytes, less
            the predicted peak), in the phase it failed in, and the activations predicted
            there for the recorded run: under a change it scales as that phase's
            predicted activations do (a measured residual carried over, never a formula).
        activations, activations_batch: For a model without a shape (a family built by
            ``transformers``), the ``activations`` facts of one step traced on fake tensors
            at micro-batch ``activations_batch`` (``gpuwatch/predict/_hf_trace.py``); another
            micro-batch scales what is saved per sample.
        activations_checkpointed: The same step traced with every layer checkpointed
            (transformers' ``gradient_checkpointing_enable``), at the same micro-batch:
            what the ranked change "gradient checkpointing" plans with; None where it was
            not traced.
        tensors: Without a shape, the parameters' shapes where known (the model built on
            the meta device): the optimizer's buckets and step temporaries follow them.
    """

    shape: ModelShape | None
    params: int | None = None
    batch: int = 1
    seq: int | None = None
    precision: str = "bf16-mixed"
    optimizer: str = "adamw"
    impl: str = "foreach"
    attention: str = "sdpa"
    checkpointing: bool = False
    checkpoint_every: int = 1
    lora_rank: int = 0
    lora_targets: tuple[str, ...] = ("q", "v")
    dropout: dict[str, float] = field(default_factory=dict)
    activation: str | None = None
    layout: str = "none"
    world: int = 1
    offload: bool = False
    accumulation: int = 1
    device: str = "cuda"
    quant: str = ""
    fsdp_units: tuple[str, ...] = ("layers",)
    param_dtype: str = ""
    reduce_dtype: str = ""
    loss: str = "inside"
    excess: int = 0
    excess_phase: str = "forward"
    excess_per: int = 0
    activations: dict[str, Any] | None = None
    activations_batch: int = 1
    activations_checkpointed: dict[str, Any] | None = None
    tensors: tuple[tuple[int, ...], ...] = ()

    @property
    def tp(self) -> int:
        """The tensor-parallel degree (1: none)."""
        return int(self.layout[3:]) if self.layout.startswith("tp=") else 1

    @property
    def tensor_sizes_known(self) -> bool:
        """Whether the parameters' sizes are known (a shape, or the tensors of a model built
        on the meta device), not only their count."""
        if self.shape is not None:
            return True
        return bool(self.tensors) and sum(map(_numel, self.tensors)) == self.params

    @property
    def step_temporaries_known(self) -> bool:
        """Whether ``optimizer.step``'s temporary can be planned: a for-loop step's is the
        largest tensors' (unknown from a count alone); foreach's is its bucket's, which the
        count gives (one group, one dtype); fused and 8-bit steps update in place, and
        ZeRO's inner optimizer steps one flat partition."""
        if self.tensor_sizes_known or self.impl != "for-loop" or self.layout.startswith("zero"):
            return True
        kind = ESTIMATE_OPTIMIZERS.get(self.optimizer, ("", {}))[0]
        return kind not in KINDS or "for-loop" not in KINDS[kind].temps


@dataclass
class RankEstimate:
    """One rank's prediction and what the layout costs besides memory.

    Attributes:
        facts: The facts rank 0 would send.
        prediction: :func:`predict`'s answer for them.
        host_bytes: States offloaded to the host, per rank.
        traffic_bytes: Bytes each rank sends per optimizer step for the layout's
            collectives (ring algorithms: ``(N-1)/N`` of the tensor per pass).
        notes: What the plan assumed about the layout, one line each.
    """

    facts: Facts
    prediction: Prediction
    host_bytes: int = 0
    traffic_bytes: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def peak_bytes(self) -> int:
        return self.prediction.peak_bytes


def _ceil(n: int, d: int) -> int:
    return -(-n // d)


SETTINGS = tuple(
    n for n in inspect.signature(facts_from_shape).parameters if n not in ("shape", "params")
)
""":func:`facts_from_shape`'s training settings (batch, seq, precision, ...): each is a
field of :class:`Plan` by the same name, so a plan passes them through as they are."""


def _build(plan: Plan, shape: ModelShape | None, precision: str) -> dict[str, Any]:
    settings = {name: getattr(plan, name) for name in SETTINGS} | {"precision": precision}
    params = plan.params if shape is None else None
    facts: dict[str, Any] = dict(facts_from_shape(shape, params=params, **settings))
    if plan.device != "cuda":
        for g in (*facts["params"]["groups"], *facts["optimizer"]["groups"]):
            g["device"] = plan.device
    if shape is None and plan.activations is not None:
        facts["activations"] = per_batch(plan.activations, plan.batch, plan.activations_batch)
    if plan.loss != "inside" and isinstance(facts.get("transformer"), dict):
        facts["transformer"]["loss"] = plan.loss
    if not plan.step_temporaries_known:
        # A count alone is one tensor of the whole model to facts_from_shape: its largest
        # tensors are unknown, so a for-loop step's temporary is counted as none (a lower
        # bound, said by step_temporaries_known), never as the model's size.
        for b in facts["optimizer"]["groups"]:
            b.update(max_tensor_bytes=0, second_tensor_bytes=0)
    return facts


_PER_SAMPLE = ("bytes", "saved_bytes", "out_bytes", "max_tensor_bytes", "recompute_bytes")
"""Fields of traced ``activations`` facts that grow with the micro-batch (the autocast
copies of the weights and the gradients do not)."""


def per_batch(act: dict[str, Any], batch: int, traced: int) -> dict[str, Any]:
    """Traced ``activations`` facts at micro-batch ``traced``, scaled to ``batch``: every
    tensor a transformer saves or makes in its forward holds one row per sample."""
    if batch == traced or traced <= 0:
        return act

    def scaled(d: dict[str, Any], peak: bool = False) -> dict[str, Any]:
        out = dict(d)
        for k in _PER_SAMPLE:
            if isinstance(d.get(k), int):
                # A peak's bytes hold the weights' autocast copies too, which stay.
                fixed = int(d.get("amp_copy_bytes") or 0) if k == "bytes" and peak else 0
                out[k] = fixed + (d[k] - fixed) * batch // traced
        return out

    out = scaled(act)
    out["held_output_bytes"] = int(act.get("held_output_bytes") or 0) * batch // traced
    if act.get("held_step_bytes") is not None:
        out["held_step_bytes"] = int(act.get("held_step_bytes") or 0) * batch // traced
    out["modules"] = [scaled(m) for m in act.get("modules") or [] if isinstance(m, dict)]
    for peak in ("forward_peak", "loss_peak"):
        if isinstance(act.get(peak), dict):
            out[peak] = scaled(act[peak], peak=True)
    return out


NF4_BLOCK = 64
"""bitsandbytes' 4-bit block: one absmax constant per 64 weights."""

NF4_BLOCK2 = 256
"""Double quantisation: the 8-bit absmax constants in blocks of 256, one fp32 each."""


def nf4_bytes(numel: int, tensors: int) -> int:
    """A 4-bit NF4 weight with double-quantised constants (``bitsandbytes.functional.
    quantize_4bit``, ``compress_statistics=True``): two weights a byte, one 8-bit absmax a
    block, one fp32 absmax and the 256-entry fp32 code per tensor for the second level,
    the 16-entry NF4 code."""
    blocks = _ceil(numel, NF4_BLOCK)
    return _ceil(numel, 2) + blocks + 4 * _ceil(blocks, NF4_BLOCK2) + tensors * (256 + 16) * 4


def _quantise(plan: Plan, facts: dict[str, Any], notes: list[str]) -> None:
    """QLoRA: the layers' linear weights (not embeddings, norms or the head, which
    bitsandbytes skips) as 4-bit NF4, in a group of their own."""
    shape = plan.shape
    if shape is None or not plan.lora_rank:
        raise ValueError("--qlora needs a shape or --config and LoRA (--lora-rank)")
    seq = plan.seq or shape.max_positions or 1024
    one = Counter(replace(shape, layers=2).tensors(seq)) - Counter(
        replace(shape, layers=1).tensors(seq)
    )
    mats = [t for t, k in one.items() for _ in range(k) if len(t) == 2]
    numel = shape.layers * sum(_numel(t) for t in mats)
    tensors = shape.layers * len(mats)
    quant = shape.layers * sum(nf4_bytes(_numel(t), 1) for t in mats)
    p = facts["params"]
    base = p["groups"][0]
    elt = base["bytes"] // max(base["count"], 1)
    base["count"] -= numel
    base["bytes"] -= numel * elt
    base["tensors"] -= tensors
    p["groups"].insert(
        1,
        {
            "dtype": "uint8",
            "device": base["device"],
            "trainable": False,
            "count": numel,
            "bytes": quant,
            "tensors": tensors,
        },
    )
    p["bytes"] = sum(g["bytes"] for g in p["groups"])
    p["frozen_bytes"] = p["bytes"] - p["trainable_bytes"]
    notes.append(
        f"QLoRA: {numel:,} layer weights in 4-bit NF4 ({quant / max(numel, 1):.3f} bytes"
        " each with their constants), dequantised to bf16 on each use"
    )


def _divide(d: dict[str, Any], n: int, keys: tuple[str, ...]) -> None:
    for k in keys:
        if isinstance(d.get(k), int):
            d[k] = _ceil(d[k], n)


_PARAM_KEYS = (
    "count",
    "bytes",
    "trainable_count",
    "trainable_bytes",
    "frozen_count",
    "frozen_bytes",
)
_BUCKET_KEYS = (
    "count",
    "bytes",
    "max_tensor_bytes",
    "second_tensor_bytes",
    "small_count",
    "factored_count",
    "vector_count",
)


def _shard_states(facts: dict[str, Any], n: int, params: bool = True) -> None:
    """Each rank holds ``1/n`` of the optimizer's buckets (and of the parameters)."""
    if params:
        _divide(facts["params"], n, _PARAM_KEYS)
        for g in facts["params"]["groups"]:
            _divide(g, n, ("count", "bytes"))
    for b in facts["optimizer"]["groups"]:
        _divide(b, n, _BUCKET_KEYS)


def _layer_sizes(plan: Plan, shape: ModelShape, seq: int) -> tuple[int, int]:
    """(parameters of one layer with its adapters, parameters outside the layers)."""
    one = replace(shape, layers=1)
    layer = replace(shape, layers=2).count(seq) - one.count(seq)
    adapters = (
        sum(_numel(s) for s in one.lora_tensors(plan.lora_rank, plan.lora_targets))
        if plan.lora_rank
        else 0
    )
    return layer + adapters, one.count(seq) - layer


def _traced_layers(act: dict[str, Any] | None, elt: int) -> list[int]:
    """Parameters of each layer a trace listed (``model.layers.3``: numbered modules),
    from the bytes of their gradients."""
    modules = (act or {}).get("modules") or []
    return [
        int(m.get("grad_bytes") or 0) // elt
        for m in modules
        if isinstance(m, dict) and str(m.get("name", "")).rpartition(".")[2].isdigit()
    ]


def _unit_sizes(plan: Plan, facts: dict[str, Any], notes: list[str]) -> list[tuple[str, int, int]]:
    """FSDP's units, the root's first then in forward order: ``(name, parameters,
    trainable parameters)``."""
    total = facts["params"]["count"]
    trainable = facts["params"]["trainable_count"]
    shape = plan.shape
    if shape is None:
        layers = _traced_layers(plan.activations, _ELT[plan.precision])
        if not layers:
            # Where the units fall is not known: their gathered copies are not counted
            # (a lower bound), never guessed as one unit of the whole model.
            notes.append(
                "FSDP units unknown without a shape: their all-gathered parameters and"
                " reduce-scatter buffers are not counted (add at least the largest unit's"
                " size twice)"
            )
            return [(ROOT, 0, 0)]
        # A family built by transformers: its layers' sizes from the trace's gradients.
        group = _ceil(len(layers), MAX_UNITS - 1)
        grouped = [sum(layers[i : i + group]) for i in range(0, len(layers), group)]
        notes.append(f"FSDP units: the {len(layers)} layers the trace saw, and the root")
        sizes = [max(total - sum(layers), 0), *grouped]
        # LoRA or a frozen part: each unit reduces its share of the trainable parameters.
        return [
            (ROOT if i == 0 else f"layers.{i - 1}", s, round(s * trainable / max(total, 1)))
            for i, s in enumerate(sizes)
        ]
    seq = plan.seq or shape.max_positions or 1024
    per_layer, _ = _layer_sizes(plan, shape, seq)
    adapters = per_layer - _layer_sizes(replace(plan, lora_rank=0), shape, seq)[0]
    parts = shape.part_counts(seq)
    units = plan.fsdp_units or ("layers",)
    claimed = {p for u in units for p in u.split("+")}
    root = sum(parts[p] for p in ("embed", "norm", "head") if p not in claimed)
    out = [(ROOT, root, 0 if plan.lora_rank else root)]
    for unit in units:
        if unit != "layers":
            count = sum(parts[p] for p in unit.split("+"))
            out.append((unit, count, 0 if plan.lora_rank else count))
            continue
        group = _ceil(shape.layers, MAX_UNITS - len(units))
        if group > 1:
            notes.append(f"FSDP units of {group} layers each: the facts list at most {MAX_UNITS}")
        for i in range(0, shape.layers, group):
            k = min(group, shape.layers - i)
            out.append(
                (f"layers.{i}", per_layer * k, (adapters if plan.lora_rank else per_layer) * k)
            )
    if "layers" not in claimed:
        name, count, mine = out[0]
        out[0] = (
            name,
            count + per_layer * shape.layers,
            mine + (adapters if plan.lora_rank else per_layer) * shape.layers,
        )
    return out


def _fsdp_units(plan: Plan, facts: dict[str, Any], notes: list[str]) -> list[dict[str, Any]]:
    """The ``unit_list`` of the facts: each unit's bytes, gathered in the policy's
    ``param_dtype`` (the weights' own without one), held sharded in the weights' dtype."""
    n, elt = plan.world, _ELT[plan.precision]
    gathered = _ELT[plan.param_dtype] if plan.param_dtype else elt
    reshard = plan.layout in ("fsdp", "fsdp1")
    return [
        {
            "name": name,
            "unsharded_bytes": count * gathered,
            "sharded_bytes": _ceil(count, n) * elt,
            "trainable_unsharded_bytes": mine * gathered,
            "trainable_sharded_bytes": _ceil(mine, n) * elt,
            "reshard_after_forward": reshard and name != ROOT,
        }
        for name, count, mine in _unit_sizes(plan, facts, notes)
    ]


def _fsdp(plan: Plan, facts: dict[str, Any], notes: list[str]) -> tuple[int, int]:
    """FSDP2's (or FSDP1's) facts; returns (host bytes, bytes sent per step)."""
    n = plan.world
    elt = _ELT[plan.precision]
    total = facts["params"]["count"]
    trainable = facts["params"]["trainable_count"]
    units = _fsdp_units(plan, facts, notes)
    reshard = plan.layout in ("fsdp", "fsdp1")
    _shard_states(facts, n)
    version = 1 if plan.layout.startswith("fsdp1") else 2
    fsdp: dict[str, Any] = {
        "version": version,
        "mesh_size": n,
        "units": len(units),
        "unit_list": units,
        "largest_unit_bytes": max(u["unsharded_bytes"] for u in units),
        "reshard_after_forward": reshard,
        "param_dtype": _DTYPE_NAME.get(plan.param_dtype),
        "reduce_dtype": _DTYPE_NAME.get(plan.reduce_dtype),
        "cpu_offload": plan.offload,
    }
    if version == 1:
        fsdp["strategy"] = "FULL_SHARD" if reshard else "SHARD_GRAD_OP"
    strategy = "fsdp1" if version == 1 else "fsdp2"
    facts["parallel"] = {"strategy": strategy, "rank": 0, "world_size": n, "fsdp": fsdp}
    host = _fsdp_offload(plan, facts, notes) if plan.offload else 0
    # All-gather in forward and (after a reshard) again in backward, reduce-scatter of the
    # gradients: ring passes of (N-1)/N of the model each.
    passes = total * (2 if reshard else 1) + trainable
    return host, round(passes * elt * (n - 1) / n)


def _fsdp_offload(plan: Plan, facts: dict[str, Any], notes: list[str]) -> int:
    """``CPUOffloadPolicy``: the states leave the device's facts; returns the host bytes."""
    p, opt = facts["params"], facts["optimizer"]
    host = p["bytes"] + p["trainable_bytes"] + optimizer_memory(opt).state
    for k in ("bytes", "trainable_bytes", "frozen_bytes"):
        p[k] = 0
    for g in p["groups"]:
        g["bytes"] = 0
    opt["groups"] = []
    notes.append(
        "CPUOffloadPolicy: sharded parameters, gradients and optimizer state on the host;"
        " the optimizer steps there"
    )
    return int(host)


def _zero(plan: Plan, facts: dict[str, Any], stage: int, notes: list[str]) -> tuple[int, int]:
    """DeepSpeed ZeRO's facts; returns (host bytes, bytes sent per step)."""
    n = plan.world
    elt = 2 if plan.precision in _ZERO_PRECISION or plan.precision in ("bf16", "fp16") else 4
    dtype = "float16" if "fp16" in plan.precision else _DTYPE[elt]
    p = facts["params"]
    trainable, total = p["trainable_count"], p["count"]
    part = _ceil(trainable, n)
    opt = facts["optimizer"]
    if plan.optimizer in ("adam", "adamw") and plan.device == "cuda":
        # DeepSpeed's own inner Adam(W): FusedAdam, one multi-tensor kernel, no temporary.
        # (On the CPU, DeepSpeedCPUAdam needs a C++ build; a plan against a CPU run is of
        # torch's optimizer, "torch_adam": true, in the plan's own implementation.)
        opt["impl"] = "fused"
        opt["options"].update(fused=True, foreach=False)
        notes.append("ZeRO's inner optimizer: DeepSpeed's FusedAdam (no step temporary)")
    # The inner optimizer steps one flat fp32 partition per param group.
    opt["groups"] = [
        {
            "group": 0,
            "device": "cuda:0" if plan.device == "cuda" else plan.device,
            "dtype": "float32",
            "tensors": 1,
            "count": part,
            "bytes": part * 4,
            "max_tensor_bytes": part * 4,
            "second_tensor_bytes": 0,
            "small_count": 0,
            "factored_count": 0,
            "vector_count": part,
        }
    ]
    zero: dict[str, Any] = {
        "stage": stage,
        "partition_count": n,
        "reduce_bucket_size": ZERO_DEFAULTS["reduce_bucket_size"],
        "allgather_bucket_size": ZERO_DEFAULTS["allgather_bucket_size"],
        "contiguous_gradients": True,
        "overlap_comm": stage == 3,
        "offload_optimizer": None,
        "offload_param": None,
        "dtype": dtype,
        "master_bytes": part * 4,
        "partition_numel": part,
    }
    if stage == 3:
        _zero3(plan, p, zero, elt)
    host = 0
    if plan.offload:
        host = optimizer_memory(opt).state + zero["master_bytes"]
        opt["groups"] = []
        zero["master_bytes"] = 0
        notes.append(
            "ZeRO-Offload (offload_optimizer: cpu): the fp32 master partition and the"
            " optimizer state on the host, stepped there by DeepSpeedCPUAdam"
        )
    facts["parallel"] = {"strategy": "zero", "rank": 0, "world_size": n, "zero": zero}
    # Stage 1/2: reduce-scatter of the gradients and all-gather of the updated
    # parameters, as DDP's all-reduce; stage 3 gathers the parameters in forward and
    # again in backward (Rajbhandari et al. 2020, section 7: 1.5x DDP's volume).
    passes = 2 * trainable if stage < 3 else 2 * total + trainable
    return host, round(passes * elt * (n - 1) / n)


def _zero3(plan: Plan, p: dict[str, Any], zero: dict[str, Any], elt: int) -> None:
    """Stage 3: the parameters partitioned too, the small ones kept whole (persistent)."""
    n, total, part = plan.world, p["count"], zero["partition_numel"]
    threshold = ZERO_DEFAULTS["stage3_param_persistence_threshold"]
    shapes: list[tuple[int, ...]] = []
    if plan.shape is not None:
        seq = plan.seq or plan.shape.max_positions or 1024
        shapes = plan.shape.tensors(seq)
        if plan.lora_rank:
            shapes += plan.shape.lora_tensors(plan.lora_rank, plan.lora_targets)
    persistent = sum(_numel(s) for s in shapes if _numel(s) < threshold)
    for k in (
        "stage3_prefetch_bucket_size",
        "stage3_max_live_parameters",
        "stage3_param_persistence_threshold",
    ):
        zero[k] = ZERO_DEFAULTS[k]
    zero.update(
        {
            "grad_partition_bytes": part * elt,
            "unsharded_bytes": total * elt,
            "partition_bytes": _ceil(total, n) * elt,
            "persistent_bytes": persistent * elt,
            "largest_param_bytes": max((_numel(s) for s in shapes), default=total) * elt,
        }
    )
    # Each rank holds its partitions, plus the small parameters kept whole.
    _divide(p, n, _PARAM_KEYS)
    for g in p["groups"]:
        _divide(g, n, ("count", "bytes"))
    p["bytes"] += persistent * elt


def _tp(plan: Plan, facts: dict[str, Any], notes: list[str]) -> int:
    """Tensor parallel's facts; returns bytes sent per step."""
    t, shape = plan.tp, plan.shape
    if shape is None:
        raise ValueError("--layout tp=N needs a shape or --config (which tensors split)")
    kv = shape.kv_heads or shape.heads
    for name, value in (("heads", shape.heads), ("kv heads", kv), ("vocab", shape.vocab)):
        if value % t and not (name == "vocab" and shape.arch == "vit"):
            raise ValueError(f"--layout tp={t}: {name} {value} is not a multiple of {t}")
    seq = plan.seq or shape.max_positions or 1024
    tensors = shape.tensors(seq)
    if plan.lora_rank:
        tensors += shape.lora_tensors(plan.lora_rank, plan.lora_targets)
    split = sum(_numel(s) for s in tensors if len(s) >= 2)
    kept = sum(_numel(s) for s in tensors if len(s) < 2)
    share = (_ceil(split, t) + kept) / max(split + kept, 1)
    p = facts["params"]
    for d in (p, *p["groups"]):
        for k in ("count", "bytes", "trainable_count", "trainable_bytes"):
            if isinstance(d.get(k), int):
                d[k] = math.ceil(d[k] * share)
    p["frozen_count"] = p["count"] - p["trainable_count"]
    p["frozen_bytes"] = p["bytes"] - p["trainable_bytes"]
    for b in facts["optimizer"]["groups"]:
        for k in _BUCKET_KEYS:
            if isinstance(b.get(k), int):
                b[k] = math.ceil(b[k] * share)
    tf = facts.get("transformer")
    if isinstance(tf, dict):
        tf.update(
            head_dim=shape.hidden // shape.heads,
            heads=shape.heads // t,
            kv_heads=kv // t,
            intermediate=_ceil(shape.intermediate or 0, t),
            vocab=_ceil(tf.get("vocab") or 0, t),
            loss_parallel=bool(tf.get("vocab")),
        )
    facts["parallel"] = {
        "strategy": "tp",
        "rank": 0,
        "world_size": plan.world,
        "dtensor": {"mesh_sizes": [t]},
    }
    if plan.world > t:
        notes.append(
            f"tp={t} on {plan.world} GPUs: the other {plan.world // t}-way data parallel's"
            " gradient buckets are not counted"
        )
    # Megatron: two all-reduces of the layer's output in forward, two in backward.
    elt = 2 if plan.precision != "fp32" else 4
    act = plan.batch * seq * shape.hidden * elt
    return round(4 * shape.layers * 2 * act * (t - 1) / t)


EXCESS = "recorded_excess"
"""The category of what a recorded run needed beyond its prediction."""


def _add_excess(plan: Plan, pred: Prediction) -> None:
    """Carry a recorded run's unexplained demand into its phase, scaled by activations."""
    from ._predict import total

    for first in (True, False):
        pm = pred.phases.get((plan.excess_phase, first))
        if pm is None:
            continue
        act = pm.peak.get("activations", 0)
        share = act / plan.excess_per if plan.excess_per else 1.0
        pm.peak[EXCESS] = round(plan.excess * share)
    key = max(pred.phases, key=lambda k: total(pred.phases[k].peak))
    pred.peak_phase, pred.peak_bytes = key, total(pred.phases[key].peak)


def rank_estimate(plan: Plan) -> RankEstimate:
    """Rank 0's facts under ``plan.layout``, predicted by the live predictor.

    Raises:
        ValueError: A plan the layout cannot take; the message is one line for the user.
    """
    notes: list[str] = []
    layout, n = plan.layout, plan.world
    if layout != "none" and n < 2 and not layout.startswith("tp="):
        notes.append(f"--layout {layout} on one GPU: nothing is divided")
    if plan.offload and layout not in (*FSDP_LAYOUTS, "zero1", "zero2", "zero3"):
        raise ValueError("--offload needs --layout fsdp, fsdp-no-reshard or zero1/2/3")
    if layout.startswith("tp=") and plan.tp > n:
        raise ValueError(f"--layout {layout} needs at least {plan.tp} GPUs (--gpus)")
    host = traffic = 0
    if plan.quant:
        if layout not in ("none", "ddp"):
            raise ValueError("--qlora is planned on one GPU or under --layout ddp")
        plan = replace(plan, precision="bf16")  # bnb's compute dtype; adapters in bf16
    if layout in ("zero1", "zero2", "zero3"):
        precision = _ZERO_PRECISION.get(plan.precision, plan.precision)
        facts = _build(plan, plan.shape, precision)
        host, traffic = _zero(plan, facts, SHARDING[layout], notes)
    elif layout == "device-map":
        if plan.shape is None:
            raise ValueError("--layout device-map needs a shape or --config (layers to cut)")
        per = _ceil(plan.shape.layers, n)
        facts = _build(plan, replace(plan.shape, layers=per), plan.precision)
        notes.append(
            f"device map: {per} of {plan.shape.layers} layers on the GPU planned, with the"
            " embeddings and the head (an upper bound: a real map puts them at the ends)"
        )
    else:
        facts = _build(plan, plan.shape, plan.precision)
        if plan.quant:
            _quantise(plan, facts, notes)
        if layout in FSDP_LAYOUTS:
            host, traffic = _fsdp(plan, facts, notes)
        elif layout == "ddp":
            facts["parallel"] = {
                "strategy": "ddp",
                "rank": 0,
                "world_size": n,
                "ddp": {
                    "bucket_cap_bytes": DDP_BUCKET_BYTES,
                    "gradient_as_bucket_view": False,
                    "world_size": n,
                },
            }
            grads = facts["params"]["trainable_bytes"]
            traffic = round(2 * grads * (n - 1) / n)
        elif layout.startswith("tp="):
            traffic = _tp(plan, facts, notes)
    pred = predict(facts)  # type: ignore[arg-type]
    if plan.excess > 0:
        _add_excess(plan, pred)
    traffic *= plan.accumulation if layout in (*FSDP_LAYOUTS, "zero3") else 1
    return RankEstimate(facts, pred, host, traffic, notes)  # type: ignore[arg-type]


_PRECISION_OF = {
    ("float32", "bfloat16"): "bf16-mixed",
    ("float32", "float16"): "fp16-mixed",
    ("float32", None): "fp32",
    ("bfloat16", None): "bf16",
    ("float16", None): "fp16",
}
_STRATEGY_LAYOUT = {"ddp": "ddp", "fsdp2": "fsdp", "tp": "tp", "device_map": "device-map"}


def _precision_of(facts: dict[str, Any], params: dict[str, Any]) -> str:
    """``--precision`` from the bulk of the weights' dtype and the autocast dtype."""
    from ..facts import fact_int

    groups = [g for g in params.get("groups") or [] if isinstance(g, dict)]
    big = max(groups, key=lambda g: fact_int(g.get("bytes")), default={})
    amp = _dict(facts.get("amp"))
    autocast = amp.get("dtype") or _dict(facts.get("batch")).get("autocast")
    dtype = str(big.get("dtype") or "float32")
    return _PRECISION_OF.get((dtype, str(autocast) if autocast else None), "bf16-mixed")


def _optimizer_of(opt: dict[str, Any], lost: list[str]) -> tuple[str, str]:
    """``--optimizer`` and ``--optimizer-impl`` from the optimizer's facts."""
    from ._optim import ESTIMATE_OPTIMIZERS, kind_of

    kind = kind_of(opt) if opt else "adamw"
    optimizer = kind if kind in ESTIMATE_OPTIMIZERS else "adamw"
    if kind == "sgd":
        momentum = (opt.get("options") or {}).get("momentum")
        optimizer = "sgd-momentum" if momentum else "sgd"
    if opt and optimizer != kind and kind != "sgd":
        lost.append(f"optimizer {str(opt.get('class'))[:40]} planned as {optimizer}")
    impl = str(opt.get("impl") or "foreach")
    return optimizer, impl if impl in ("foreach", "fused", "for-loop") else "foreach"


def _shape_of(tf: dict[str, Any]) -> ModelShape | None:
    """A decoder's :class:`ModelShape` from the ``transformer`` facts (None: none)."""
    from ..facts import fact_int

    dims = {k: fact_int(tf.get(k)) for k in ("layers", "hidden", "heads", "vocab")}
    if not all(v > 0 for v in dims.values()) or tf.get("head", "lm") != "lm":
        return None
    if tf.get("mlp") in ("gated", "swiglu", "geglu"):
        arch = "llama"
    elif tf.get("parallel_residual"):
        arch = "neox"
    elif tf.get("fused_qkv", True):
        arch = "gpt"
    else:
        return None
    return ModelShape(
        arch=arch,
        kv_heads=fact_int(tf.get("kv_heads")) or None,
        head_dim=fact_int(tf.get("head_dim")) or None,
        intermediate=fact_int(tf.get("intermediate")) or None,
        tied=bool(tf.get("tied_embeddings", arch == "gpt")),
        max_positions=fact_int(tf.get("max_positions")) or None,
        layers=dims["layers"],
        hidden=dims["hidden"],
        heads=dims["heads"],
        vocab=dims["vocab"],
    )


def _layout_of(par: dict[str, Any], lost: list[str]) -> tuple[str, int]:
    """``--layout`` and the world size from the ``parallel`` facts."""
    from ..facts import fact_int

    strategy = str(par.get("strategy") or "none")
    world = max(fact_int(par.get("world_size")), 1)
    layout = _STRATEGY_LAYOUT.get(strategy, "none")
    if strategy == "zero":
        stage = fact_int(_dict(par.get("zero")).get("stage"))
        layout = f"zero{stage}" if stage else "none"
    if layout == "tp":
        layout, world = "none", 1
        lost.append("tensor parallel's degree is not in the facts: planned as one GPU")
    if layout == "fsdp":
        fsdp = _dict(par.get("fsdp"))
        layout = "fsdp" if fsdp.get("reshard_after_forward") is not False else "fsdp-no-reshard"
    return (layout if world > 1 or layout == "device-map" else "none"), world


def plan_from_facts(facts: dict[str, Any]) -> tuple[Plan, list[str]]:
    """The :class:`Plan` of a recorded run, from the facts it sent (a recording's facts are
    hostile: every field is checked), and what could not be carried over.

    Raises:
        ValueError: Facts with neither a decoder's shape nor a parameter count.
    """
    from ..facts import fact_int

    lost: list[str] = []
    tf = _dict(facts.get("transformer"))
    batch = _dict(facts.get("batch"))
    params = _dict(facts.get("params"))
    optimizer, impl = _optimizer_of(_dict(facts.get("optimizer")), lost)
    shape = _shape_of(tf)
    count = fact_int(params.get("count"))
    if shape is None:
        if count <= 0:
            raise ValueError("the recording's facts have neither a shape nor a parameter count")
        lost.append("no decoder shape in the facts: parameters only, activations unknown")
    lora = _dict(tf.get("lora"))
    targets = tuple(str(t)[:8] for t in (lora.get("targets") or ("q", "v")))[:8]
    layout, world = _layout_of(_dict(facts.get("parallel")), lost)
    ckpt = _dict(facts.get("checkpointing"))
    drop = _dict(tf.get("dropout"))
    plan = Plan(
        shape=shape,
        params=count if shape is None else None,
        batch=max(fact_int(batch.get("batch")), 1),
        seq=fact_int(batch.get("seq")) or None,
        precision=_precision_of(facts, params),
        optimizer=optimizer,
        impl=impl,
        attention=str(tf.get("attention") or "sdpa")[:24],
        checkpointing=bool(ckpt.get("enabled")),
        checkpoint_every=min(max(fact_int(ckpt.get("every")), 1), 1024),
        lora_rank=fact_int(lora.get("rank")),
        lora_targets=targets,
        dropout={k: float(v) for k, v in drop.items() if isinstance(v, (int, float))},
        layout=layout,
        world=world,
    )
    return plan, lost

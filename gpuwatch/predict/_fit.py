"""Will it fit, and what would make it fit.

Each answer is :func:`~._plan.rank_estimate` run again on a changed :class:`~._plan.Plan`:
the largest micro-batch is found by bisection on the predicted peak (it grows with the
batch), and each change (checkpointing, a smaller micro-batch with accumulation, 8-bit
Adam, LoRA, QLoRA, a sharding layout, offload, more GPUs) is predicted as a whole run of
its own, never scaled from the first answer. Changes that fit are ranked by what they
cost: nothing, numerics, compute, communication, host memory, what is trained, hardware.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ._plan import SHARDING, Plan, RankEstimate, rank_estimate

MAX_BATCH = 1 << 16
"""The largest micro-batch the bisection tries."""

MAX_GPUS = 4096
"""The most GPUs "more GPUs" proposes."""

LORA_RANK = 16
"""The rank a proposed LoRA uses (PEFT's examples: 8 to 64)."""

_GIB = 1 << 30


def _gib(n: float) -> str:
    return f"{n / _GIB:.1f} GiB"


@dataclass
class Change:
    """One way to make the run fit.

    Attributes:
        what: The change in words.
        flags: The ``estimate`` options that ask for it.
        plan: The plan with the change.
        estimate: Rank 0 under it.
        cost: What it costs, in words.
        order: Cheaper first (the ranking's key, then the peak).
    """

    what: str
    flags: str
    plan: Plan
    estimate: RankEstimate
    cost: str
    order: int

    @property
    def peak_bytes(self) -> int:
        return self.estimate.peak_bytes


@dataclass
class Answer:
    """Fits or not on the GPUs given, and the changes that would make it fit.

    Attributes:
        estimate: Rank 0 as planned.
        usable: Bytes each GPU's allocator can have.
        fits: The per-rank peak is within ``usable``.
        headroom: ``usable`` less the peak (negative: short by).
        phase: The phase whose peak decides (``first_step`` too).
        max_batch: The largest micro-batch that fits (0: not even 1; None: activations
            unknown, so the batch does not change the peak).
        changes: Ranked, fitting first; pairs of changes when no single one fits.
    """

    estimate: RankEstimate
    usable: int
    fits: bool
    headroom: int
    phase: tuple[str, bool]
    max_batch: int | None
    changes: list[Change] = field(default_factory=list)


def _fits(plan: Plan, usable: int) -> bool:
    return rank_estimate(plan).peak_bytes <= usable


def _batch_grows(plan: Plan) -> bool:
    """Whether the plan knows what a sample adds: a shape, or activations traced."""
    return bool(plan.seq) and (plan.shape is not None or plan.activations is not None)


def max_batch(plan: Plan, usable: int) -> int | None:
    """The largest micro-batch whose per-rank peak fits (0: none; None: the activations,
    and so the batch's share, are unknown)."""
    if not _batch_grows(plan):
        return None
    if not _fits(replace(plan, batch=1), usable):
        return 0
    lo, hi = 1, 2
    while hi <= MAX_BATCH and _fits(replace(plan, batch=hi), usable):
        lo, hi = hi, hi * 2
    if hi > MAX_BATCH:
        return MAX_BATCH
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if _fits(replace(plan, batch=mid), usable) else (lo, mid)
    return lo


def _traffic_cost(now: RankEstimate, new: RankEstimate) -> str:
    more = new.traffic_bytes - now.traffic_bytes
    sent = f"sends {_gib(new.traffic_bytes)} per rank per step"
    return sent + (f" ({_gib(more)} more)" if more > 0 else "")


Candidate = tuple[str, str, Plan, int]
"""(what, flags, changed plan, cost order) of one change."""


def _candidates(plan: Plan, usable: int, gpu: str) -> list[Candidate]:
    """Each change that applies, cheapest kinds first."""
    level = SHARDING.get(plan.layout, 0)
    return [
        *_numeric_changes(plan),
        *_checkpoint_changes(plan),
        *_batch_change(plan, usable),
        *_layout_changes(plan, level),
        *_adapter_changes(plan),
        *_more_gpus(plan, usable, gpu, level),
    ]


def _numeric_changes(plan: Plan) -> list[Candidate]:
    """Kernels and numerics: SDPA, a fused step, 16-bit weights, 8-bit AdamW."""
    out: list[Candidate] = []
    if plan.attention == "eager" and plan.shape is not None:
        out.append(("SDPA attention", "--attention sdpa", replace(plan, attention="sdpa"), 0))
    if plan.impl == "foreach":
        out.append(
            ("fused optimizer step", "--optimizer-impl fused", replace(plan, impl="fused"), 0)
        )
    if plan.precision in ("bf16-mixed", "fp16-mixed"):
        # Weights held in 16 bits: no fp32 copy, and no autocast copy saved by each layer.
        low = plan.precision.split("-")[0]
        what = f"{low} weights (torch_dtype, or FSDP's MixedPrecisionPolicy)"
        out.append((what, f"--precision {low}", replace(plan, precision=low), 1))
    if plan.optimizer in ("adam", "adamw"):
        changed = replace(plan, optimizer="adamw-8bit")
        out.append(("8-bit AdamW (bitsandbytes)", "--optimizer adamw-8bit", changed, 1))
    return out


def _checkpoint_changes(plan: Plan) -> list[Candidate]:
    """Gradient checkpointing of every layer, or of every 2nd."""
    out: list[Candidate] = []
    if not plan.checkpointing and plan.shape is None and plan.activations_checkpointed:
        # A traced family: the step traced again with every layer checkpointed.
        changed = replace(
            plan,
            checkpointing=True,
            activations=plan.activations_checkpointed,
            activations_checkpointed=None,
        )
        out.append(("gradient checkpointing, every layer", "--checkpointing", changed, 2))
    if not plan.checkpointing and plan.shape is not None and plan.seq:
        changed = replace(plan, checkpointing=True)
        out.append(("gradient checkpointing, every layer", "--checkpointing", changed, 2))
        if plan.shape.layers >= 4:
            # Half the layers: half the recomputation, and what the others keep stays.
            changed = replace(plan, checkpointing=True, checkpoint_every=2)
            flags = "--checkpointing --checkpoint-every 2"
            out.append(("gradient checkpointing, every 2nd layer", flags, changed, 2))
    return out


def _batch_change(plan: Plan, usable: int) -> list[Candidate]:
    """The largest micro-batch that fits, with accumulation making up the rest."""
    if not (_batch_grows(plan) and plan.batch > 1):
        return []
    fit = max_batch(plan, usable) or 0
    if not 0 < fit < plan.batch:
        return []
    steps = -(-plan.batch // fit)
    changed = replace(plan, batch=fit, accumulation=plan.accumulation * steps)
    what = f"micro-batch {fit}, {steps} accumulation steps"
    return [(what, f"--batch {fit} --accumulation {steps}", changed, 2)]


def _layout_changes(plan: Plan, level: int) -> list[Candidate]:
    """More sharding, and offload."""
    out: list[Candidate] = []
    if plan.world > 1 and not plan.layout.startswith("tp="):
        for layout in ("zero2", "fsdp", "zero3"):
            if SHARDING[layout] > level:
                out.append(
                    (f"layout {layout}", f"--layout {layout}", replace(plan, layout=layout), 3)
                )
    if not plan.offload:
        # Offload in the sharded layout chosen; else ZeRO-3's (ZeRO-Offload's stage 2 on
        # one GPU).
        layout = plan.layout if level else ("zero3" if plan.world > 1 else "zero2")
        changed = replace(plan, layout=layout, offload=True)
        out.append((f"{layout} with CPU offload", f"--layout {layout} --offload", changed, 4))
    return out


def _adapter_changes(plan: Plan) -> list[Candidate]:
    """Train less: QLoRA, LoRA."""
    out: list[Candidate] = []
    if not plan.quant and plan.shape is not None and plan.layout in ("none", "ddp"):
        rank = plan.lora_rank or LORA_RANK
        targets = plan.lora_targets if plan.lora_rank else ("q", "k", "v", "o")
        changed = replace(plan, quant="nf4", lora_rank=rank, lora_targets=targets)
        flags = "--qlora" + (
            "" if plan.lora_rank else f" --lora-rank {rank} --lora-targets q,k,v,o"
        )
        out.append(("QLoRA, 4-bit NF4 base weights", flags, changed, 5))
    if not plan.lora_rank and plan.shape is not None:
        changed = replace(plan, lora_rank=LORA_RANK, lora_targets=("q", "k", "v", "o"))
        flags = f"--lora-rank {LORA_RANK} --lora-targets q,k,v,o"
        out.append((f"LoRA rank {LORA_RANK} on q, k, v, o", flags, changed, 5))
    return out


def _more_gpus(plan: Plan, usable: int, gpu: str, level: int) -> list[Candidate]:
    """The fewest GPUs (doubling) on which the sharded plan fits."""
    if not (level == 3 or plan.layout == "ddp" or plan.layout == "none"):
        return []
    sharded = plan if level == 3 else replace(plan, layout="zero3")
    n = plan.world * 2
    while n <= MAX_GPUS and not _fits(replace(sharded, world=n), usable):
        n *= 2
    if n > MAX_GPUS:
        return []
    what = f"{n} GPUs" + ("" if level == 3 else " under zero3")
    flags = f"--gpus {n}x{gpu}" + ("" if level == 3 else " --layout zero3")
    return [(what, flags, replace(sharded, world=n), 6)]


def _cost(what: str, plan: Plan, now: RankEstimate, new: RankEstimate) -> str:
    if what.startswith("gradient checkpointing, every 2nd"):
        return "about half a forward more per step (a sixth more compute)"
    if what.startswith("gradient checkpointing"):
        return "about one more forward per step (a third more compute)"
    if what.startswith("micro-batch"):
        return "same samples per step, in smaller kernels (lower GPU utilisation)"
    if " weights (" in what:
        if plan.lora_rank:
            return "none for a frozen base (LoRA): the adapters still train in 16 bits"
        return "no fp32 master weights: updates rounded to 16 bits (or keep a master copy)"
    if what.startswith("8-bit"):
        return "8-bit block-wise optimizer states; needs bitsandbytes"
    if what.startswith("SDPA") or what.startswith("fused"):
        return "none"
    if "offload" in what:
        return (
            f"{_gib(new.host_bytes)} of host memory per rank; the optimizer steps on the CPU; "
            + _traffic_cost(now, new)
        )
    if what.startswith("layout"):
        return _traffic_cost(now, new)
    if what.startswith("QLoRA"):
        return (
            "base weights dequantised on every use (slower steps); needs bitsandbytes;"
            f" trains {new.facts['params'].get('trainable_count', 0):,} adapter parameters"
        )
    if what.startswith("LoRA"):
        trained = new.facts["params"].get("trainable_count", 0)
        return f"trains {trained:,} adapter parameters per rank, not the model"
    return f"{plan.world} GPUs; " + _traffic_cost(now, new)


def answer(plan: Plan, usable: int, gpu: str = "GPU") -> Answer:
    """The answer for ``plan`` on GPUs of ``usable`` bytes each (``gpu``: their name, for
    the flags of "more GPUs").

    Raises:
        ValueError: A plan the layout cannot take (one line).
    """
    now = rank_estimate(plan)
    headroom = usable - now.peak_bytes
    fits = headroom >= 0
    result = Answer(now, usable, fits, headroom, now.prediction.peak_phase, max_batch(plan, usable))
    if fits:
        return result
    singles: list[Change] = []
    for what, flags, changed, order in _candidates(plan, usable, gpu):
        try:
            est = rank_estimate(changed)
        except ValueError:
            continue
        singles.append(Change(what, flags, changed, est, _cost(what, changed, now, est), order))
    fitting = [c for c in singles if c.peak_bytes <= usable]
    if not fitting:
        # No single change is enough: each pair, from the best singles.
        best = sorted(singles, key=lambda c: c.peak_bytes)
        for i, a in enumerate(best):
            for b in best[i + 1 :]:
                if a.order == b.order and a.order >= 3:
                    continue  # two layouts, or a layout and its own offload
                changed = _merge(plan, a.plan, b.plan)
                try:
                    est = rank_estimate(changed)
                except ValueError:
                    continue
                if est.peak_bytes <= usable:
                    cost = f"{a.cost}; {b.cost}"
                    what, flags = f"{a.what} + {b.what}", f"{a.flags} {b.flags}"
                    fitting.append(Change(what, flags, changed, est, cost, a.order + b.order))
    fitting.sort(key=lambda c: (c.order, c.peak_bytes))
    result.changes = fitting or sorted(singles, key=lambda c: c.peak_bytes)[:3]
    return result


def _merge(base: Plan, a: Plan, b: Plan) -> Plan:
    """``base`` with what ``a`` and ``b`` each changed."""
    merged = {}
    for other in (a, b):
        for name in Plan.__dataclass_fields__:
            if getattr(other, name) != getattr(base, name):
                merged[name] = getattr(other, name)
    return replace(base, **merged)

"""Facts in, predicted bytes per category and per phase out (see ``docs/facts.md``).

The phase model (``docs/architecture.md``, "Predicted memory, and the gap"), with W weights
and buffers, S optimizer state, G gradients, A what forward keeps for backward:

- forward: from W (+S after the first step) up to +A; its peak is at the loss, where the
  fp32 logits and their log-softmax are alive together;
- backward: gradients appear while activations are freed; its peak is early, at the LM
  head's logits gradient, or late, when G outgrows A;
- optimizer.step: the first step creates S lazily (``_init_group``), then the update's
  temporaries come and go;
- zero_grad(set_to_none=True): G goes (the default since PyTorch 2.0);
- eval: a forward without grad keeps nothing; its peak is its largest working set.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from ..facts import Facts, fact_int
from ._graph import (
    ACTIVATIONS,
    AMP_COPIES,
    BLAS_WORKSPACES,
    CATEGORIES,
    GRADIENTS,
    OPTIMIZER_STATE,
    TEMPORARIES,
    WEIGHTS,
    Moment,
    Simulation,
    simulate,
)
from ._measured import measured_bytes, measured_loss_peak, simulate_measured, with_forward_peak
from ._optim import OptimizerMemory, optimizer_memory
from ._parallel import FSDP_REDUCE, FSDP_UNSHARDED, LayoutMemory, layout_memory
from ._transformer import ROLES, Arch, record

PHASES = ("forward", "backward", "optimizer.step", "zero_grad", "eval")
"""Phases the predictor knows, by the names the training side reports."""

CLIP = "clip"
"""Also predicted, where a script names it: gradient clipping between backward and
the optimizer step (``with gpuwatch.phase("clip"): clip_grad_norm_(...)``)."""

QUANTISED_DTYPES = ("uint8", "int8")
"""Parameter dtypes that hold quantised weights (bitsandbytes' 4-bit and 8-bit layers)."""

DTYPE_BYTES = {
    "float64": 8,
    "float32": 4,
    "float": 4,
    "bfloat16": 2,
    "float16": 2,
    "half": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "int8": 1,
    "uint8": 1,
}

Breakdown = dict[str, int]

MAX_LAYERS = 1024
"""Deeper models are not simulated (the walk is linear in layers; facts may be hostile)."""


@dataclass
class PhaseMemory:
    """Predicted allocated bytes by category at a phase's start, peak and end."""

    start: Breakdown
    peak: Breakdown
    end: Breakdown


@dataclass
class Prediction:
    """The predictor's answer for one set of facts.

    Attributes:
        phases: ``(phase, first_step)`` -> :class:`PhaseMemory`.
        peak_bytes: The highest predicted total over all phases and steps.
        peak_phase: ``(phase, first_step)`` where that peak is.
        activations_known: False when the facts hold neither a transformer shape with a
            batch shape nor measured activations: activations and the temporaries around
            them are then left out, not guessed.
        activations_source: ``"formula"`` (the transformer's shape), ``"measured"`` (what
            autograd saved in the first training forward) or None (unknown).
        activations_formula, activations_measured: Bytes saved by a training forward (amp
            copies included) by each source, None where that source has none.
        findings: Disagreements worth the user's attention, one line each (the formula
            against the measurement).
        notes: Assumptions and gaps, one line each.
        optimizer: The optimizer rules' result.
        peak_at: Phase -> where in it the peak falls (0 to 1), for the curve.
        layout: What the parallel layout adds (``_parallel.py``); its ``modelled`` is
            False for a layout whose buffers are not predicted.
    """

    phases: dict[tuple[str, bool], PhaseMemory]
    peak_bytes: int
    peak_phase: tuple[str, bool]
    activations_known: bool
    notes: list[str] = field(default_factory=list)
    activations_source: str | None = None
    activations_formula: int | None = None
    activations_measured: int | None = None
    findings: list[str] = field(default_factory=list)
    optimizer: OptimizerMemory = field(default_factory=OptimizerMemory)
    peak_at: dict[str, float] = field(default_factory=dict)
    accumulating: dict[bool, Breakdown] = field(default_factory=dict)
    layout: LayoutMemory = field(default_factory=LayoutMemory)


def total(b: Breakdown) -> int:
    """Sum of a breakdown."""
    return sum(b.values())


def _dict(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


def _device_type(facts: dict[str, Any]) -> str:
    groups = _dict(facts.get("params")).get("groups") or []
    best, size = "cuda", -1
    for g in groups:
        if isinstance(g, dict) and fact_int(g.get("bytes")) > size:
            best, size = str(g.get("device", "cuda")).split(":")[0], fact_int(g.get("bytes"))
    return best


CUDA_BLOCK = 512
"""The CUDA caching allocator's smallest block (``kMinBlockSize``, CUDACachingAllocator.cpp)."""


def _clip_norms(facts: dict[str, Any]) -> int:
    """``clip_grad_norm_``'s temporaries: one 0-d norm per gradient (``_foreach_norm``),
    their ``torch.stack`` and the total norm and clip coefficient
    (``torch/nn/utils/clip_grad.py``, ``_get_total_norm`` and ``_clip_grads_with_norm_``,
    which then scales the gradients in place), each rounded to the allocator's block on
    CUDA."""
    groups = _dict(facts.get("params")).get("groups") or []
    count = sum(
        min(fact_int(g.get("tensors")), 1 << 20)
        for g in groups
        if isinstance(g, dict) and g.get("trainable")
    )
    if not count:
        return 0
    elt = 4  # the norms are in the gradients' dtype; fp32 bounds them
    block = CUDA_BLOCK if _device_type(facts) == "cuda" else 1

    def alloc(n: int) -> int:
        return -(-n // block) * block

    return count * alloc(elt) + alloc(count * elt) + 2 * alloc(elt)


def _param_elt(facts: dict[str, Any]) -> int:
    """Bytes per element of the bulk of the floating-point weights (quantised ones,
    packed in integers and dequantised on use, compute in the others' dtype)."""
    by: dict[int, int] = {}
    for g in _dict(facts.get("params")).get("groups") or []:
        if isinstance(g, dict):
            name = str(g.get("dtype", "")).replace("torch.", "")
            if name in QUANTISED_DTYPES:
                continue
            elt = DTYPE_BYTES.get(name, 4)
            by[elt] = by.get(elt, 0) + fact_int(g.get("bytes"))
    return max(by, key=lambda k: by[k]) if by else 4


def _policy_elt(facts: dict[str, Any], param_elt: int) -> int:
    """FSDP's ``MixedPrecisionPolicy`` computes in its param dtype: the activations are
    in it, whatever the sharded weights' own."""
    fsdp = _dict(_dict(facts.get("parallel")).get("fsdp"))
    elt = DTYPE_BYTES.get(str(fsdp.get("param_dtype")).replace("torch.", ""))
    return min(param_elt, elt) if elt else param_elt


def _rate(value: Any) -> float:
    return float(value or 0) if isinstance(value, (int, float)) else 0.0


def _layer_flags(tf: dict[str, Any], loss_outside: bool = False) -> dict[str, Any]:
    """The :class:`Arch` switches the ``transformer`` facts carry as they are;
    ``loss_outside``: measured (the model returned no loss), planned with the shift."""
    return {
        "head_transform": bool(tf.get("head_transform")),
        "loss_parallel": bool(tf.get("loss_parallel")),
        "loss": str(tf.get("loss") or ("outside" if loss_outside else "inside"))[:24],
        "parallel_residual": bool(tf.get("parallel_residual")),
        "expand_kv": bool(tf.get("expand_kv")),
        "causal_mask": bool(tf.get("causal_mask")),
        "shared_norm": bool(tf.get("shared_norm")),
        "broadcast_kv": bool(tf.get("broadcast_kv")),
        "rope_cat": bool(tf.get("rope_cat")),
    }


def arch_from_facts(facts: dict[str, Any]) -> tuple[Arch | None, list[str]]:
    """The :class:`Arch` the recorder needs, or None with the reason in the notes."""
    notes: list[str] = []
    tf = _dict(facts.get("transformer"))
    batch = _dict(facts.get("batch"))
    image = _dict(tf.get("image"))
    # A vision transformer has no vocabulary (its input is an image cut into patches), nor
    # an encoder with a pooler or a classifier: no LM head, no logits.
    no_lm = bool(image) or tf.get("head") in ("pooler", "classifier", "none")
    need = ("layers", "hidden", "heads") + (() if no_lm else ("vocab",))
    if not tf or any(fact_int(tf.get(k)) <= 0 for k in need):
        return None, ["activations unknown: no transformer shape in the facts"]
    if fact_int(tf.get("layers")) > MAX_LAYERS:
        return None, [f"activations unknown: more than {MAX_LAYERS} layers"]
    b, s = fact_int(batch.get("batch")), fact_int(batch.get("seq"))
    if b <= 0 or s <= 0:
        return None, ["activations unknown: no batch shape yet (sent with the first forward)"]
    param_elt = _policy_elt(facts, _param_elt(facts))
    # The autocast dtype given to watch(), else the one seen at the first forward.
    amp = _dict(facts.get("amp")).get("dtype") or batch.get("autocast")
    autocast_elt = DTYPE_BYTES.get(str(amp).replace("torch.", "")) if amp else None
    if autocast_elt is not None and autocast_elt >= param_elt:
        autocast_elt = None  # autocast to a dtype no narrower than the weights: no casts
    attention = str(tf.get("attention") or "sdpa")
    if attention not in ("eager", "sdpa", "flash_attention_2"):
        notes.append(f"attention {attention!r} modelled as sdpa")
        attention = "sdpa" if "flash" not in attention else "flash_attention_2"
    mlp = "gated" if tf.get("mlp") in ("gated", "swiglu", "geglu") else "gelu"
    act = tf.get("activation")
    fused_acts = ("gelu", "gelu_pytorch_tanh", "silu", "swish", "relu", "gelu_new")
    if act and act not in fused_acts:
        notes.append(f"activation {act!r} modelled as one fused op (it may keep more)")
    drop = _dict(tf.get("dropout"))
    lora = _dict(tf.get("lora"))
    trainable = {r: bool(v) for r, v in _dict(tf.get("trainable")).items() if r in ROLES}
    ckpt_facts = _dict(facts.get("checkpointing"))
    ckpt = bool(ckpt_facts.get("enabled"))
    every = min(max(fact_int(ckpt_facts.get("every")), 1), MAX_LAYERS)
    arch = Arch(
        layers=fact_int(tf["layers"]),
        hidden=fact_int(tf["hidden"]),
        heads=fact_int(tf["heads"]),
        vocab=fact_int(tf["vocab"]),
        batch=b,
        seq=s,
        kv_heads=fact_int(tf.get("kv_heads")) or None,
        head_dim=fact_int(tf.get("head_dim")) or None,
        intermediate=fact_int(tf.get("intermediate")) or None,
        param_elt=param_elt,
        autocast_elt=autocast_elt,
        device="cpu" if _device_type(facts) == "cpu" else "cuda",
        attention=attention,
        norm="rmsnorm" if tf.get("norm") == "rmsnorm" else "layernorm",
        norm_upcast=bool(tf.get("norm_upcast", tf.get("norm") == "rmsnorm")),
        mlp=mlp,
        activation="gelu_new" if act == "gelu_new" else "gelu",
        fused_qkv=bool(tf.get("fused_qkv", mlp != "gated")),
        rope=bool(tf.get("rope", mlp == "gated")),
        softmax_fp32=bool(tf.get("softmax_fp32", mlp == "gated")),
        attn_dropout=_rate(drop.get("attn")),
        resid_dropout=_rate(drop.get("resid")),
        embd_dropout=_rate(drop.get("embd")),
        learned_positions=bool(tf.get("learned_positions", mlp != "gated")),
        tied=bool(tf.get("tied_embeddings", False)),
        bias=bool(tf.get("bias", mlp != "gated")),
        trainable=trainable,
        lora_rank=fact_int(lora.get("rank")),
        lora_targets=tuple(str(t) for t in lora.get("targets") or ()),
        checkpointing=ckpt,
        checkpoint_every=every,
        **_layer_flags(tf, _dict(facts.get("activations")).get("loss_outside") is True),
        image_elements=(
            fact_int(image.get("channels")) * fact_int(image.get("size")) ** 2 if image else 0
        ),
        classes=fact_int(image.get("labels")) or 1000 if image else 1000,
    )
    if arch.device == "cpu" and arch.attn_dropout > 0 and arch.attention != "eager":
        notes.append("SDPA with dropout on the CPU takes the math path: modelled as eager")
    return arch, notes


def _moment(m: Moment, grad_scale: float) -> Breakdown:
    return {
        ACTIVATIONS: m.saved,
        AMP_COPIES: m.amp,
        TEMPORARIES: m.temp,
        GRADIENTS: round(m.grads * grad_scale),
    }


def _with(base: Breakdown, extra: Breakdown) -> Breakdown:
    out = {c: base.get(c, 0) + extra.get(c, 0) for c in CATEGORIES}
    return out


@dataclass
class _Activations:
    """What :func:`predict` knows of the activations: the simulation, and where from."""

    sim: Simulation | None = None
    source: str | None = None
    formula: int | None = None
    measured: tuple[int, int] | None = None
    findings: list[str] = field(default_factory=list)


def _activations(raw: dict[str, Any], notes: list[str]) -> _Activations:
    """The model's simulated forward and backward: the formula's from the shape, set to
    what autograd saved where that was measured."""
    out = _Activations()
    arch, arch_notes = arch_from_facts(raw)
    notes.extend(arch_notes)
    if arch is not None:
        try:
            ops, loss = record(arch)
            out.sim = simulate(ops, [loss])
        except (ValueError, ZeroDivisionError, OverflowError) as exc:  # odd shapes
            notes.append(f"activations unknown: {exc}")
    act = _dict(raw.get("activations"))
    out.measured = measured = measured_bytes(act)
    if out.sim is not None:
        out.source = "formula"
        out.formula = out.sim.forward_end.saved + out.sim.forward_end.amp
    # What autograd saved is the activations figure whenever it was measured; the formula
    # serves `estimate` and the time before the first training forward. Where the two
    # agree the formula's moments (its transients walk every op) are kept, set to the
    # measured bytes; where they disagree the formula does not know this model (an
    # encoder-decoder, a frozen backbone) and only the finding names it.
    if measured is not None:
        notes[:] = [n for n in notes if not n.startswith("activations unknown")]
        off = _disagreement(out.formula, sum(measured)) if out.formula is not None else []
        out.findings.extend(off)
        how = "transients estimated from module outputs"
        if out.sim is not None and not off:
            out.sim = _set_saved(out.sim, *measured)
            how = "transients from the model's shape, which agrees with it"
        else:
            out.sim = simulate_measured(act)
        notes.append(
            f"activations measured (what autograd saved in the first training forward); {how}"
        )
        if out.sim is not None:
            out.sim = with_forward_peak(out.sim, act)
        out.source = "measured"
    notes.extend(_measurement_notes(act))
    return out


def predict(facts: Facts) -> Prediction:
    """Predict memory per phase from a facts dict (never raises on odd facts)."""
    # Read as a plain dict: the facts came from a socket or a file, each field is checked.
    raw: dict[str, Any] = dict(facts) if isinstance(facts, dict) else {}
    params = _dict(raw.get("params"))
    buffers = _dict(raw.get("buffers"))
    weights = fact_int(params.get("bytes")) + fact_int(buffers.get("bytes"))
    grads = fact_int(params.get("trainable_bytes"))
    opt = optimizer_memory(_dict(raw.get("optimizer")) or None)
    notes = list(opt.notes)
    acts = _activations(raw, notes)
    sim, act = acts.sim, _dict(raw.get("activations"))
    phases, accumulating, at_loss = _phases(raw, sim, opt, weights, grads)
    if acts.measured is not None:
        _held_outputs(phases, accumulating, act, notes)
    for first, b in at_loss.items():
        pm = phases["forward", first]
        if total(b) > total(pm.peak):
            phases["forward", first] = PhaseMemory(pm.start, b, pm.end)
    _workspaces(phases, accumulating, fact_int(_dict(raw.get("blas")).get("workspace_bytes")))
    layout = layout_memory(raw)
    notes.extend(layout.notes)
    _add_layout(phases, accumulating, layout, sim.backward_peak_at if sim else 1.0)
    peak_key = max(phases, key=lambda k: total(phases[k].peak))
    return Prediction(
        phases=phases,
        peak_bytes=total(phases[peak_key].peak),
        peak_phase=peak_key,
        activations_known=sim is not None,
        notes=notes,
        activations_source=acts.source,
        activations_formula=acts.formula,
        activations_measured=sum(acts.measured) if acts.measured is not None else None,
        findings=acts.findings,
        optimizer=opt,
        accumulating=accumulating,
        layout=layout,
        peak_at={
            "forward": sim.forward_peak_at if sim else 1.0,
            "backward": sim.backward_peak_at if sim else 1.0,
        },
    )


def _phases(
    raw: dict[str, Any],
    sim: Simulation | None,
    opt: OptimizerMemory,
    weights: int,
    grads: int,
) -> tuple[dict[tuple[str, bool], PhaseMemory], dict[bool, Breakdown], dict[bool, Breakdown]]:
    """Each phase's start, peak and end, first step and later ones, before the layout's
    buffers; the peak of a backward that accumulates; the moment of a loss computed
    after the model returned (measured)."""
    act = _dict(raw.get("activations"))
    # The recorder counts the gradients of the weights it models; the facts know them all.
    grad_scale = grads / sim.grad_bytes if sim and sim.grad_bytes else 1.0
    phases: dict[tuple[str, bool], PhaseMemory] = {}
    accumulating: dict[bool, Breakdown] = {}
    # A loss computed after the model returned (nanoGPT's label shift copies the logits
    # once more), measured: the outputs the loop held from the step before are gone there.
    loss_moment = measured_loss_peak(act) if sim is not None else None
    at_loss: dict[bool, Breakdown] = {}
    for first in (True, False):
        state_now = opt.state if (opt.present or not first) else 0
        base = {c: 0 for c in CATEGORIES}
        base[WEIGHTS] = weights
        base[OPTIMIZER_STATE] = state_now
        after = dict(base, **{OPTIMIZER_STATE: opt.state})
        with_grads = dict(base, **{GRADIENTS: grads})
        eval_base = after if not first else base
        if sim is not None:
            _model_phases(phases, accumulating, first, base, eval_base, sim, grad_scale, grads)
        else:
            phases["forward", first] = PhaseMemory(base, base, base)
            phases["backward", first] = PhaseMemory(base, with_grads, with_grads)
            phases["eval", first] = PhaseMemory(eval_base, eval_base, eval_base)
        if loss_moment is not None:
            at_loss[first] = _with(base, _moment(loss_moment, grad_scale))
        _step_phases(phases, first, raw, opt, with_grads)
    return phases, accumulating, at_loss


def _model_phases(
    phases: dict[tuple[str, bool], PhaseMemory],
    accumulating: dict[bool, Breakdown],
    first: bool,
    base: Breakdown,
    eval_base: Breakdown,
    sim: Simulation,
    grad_scale: float,
    grads: int,
) -> None:
    """Forward, backward and eval from the simulated model."""
    fwd_end = _with(base, _moment(sim.forward_end, grad_scale))
    phases["forward", first] = PhaseMemory(
        base, _with(base, _moment(sim.forward_peak, grad_scale)), fwd_end
    )
    bwd_end = _with(base, _moment(sim.backward_end, grad_scale))
    bwd_end[GRADIENTS] = grads
    phases["backward", first] = PhaseMemory(
        fwd_end, _with(base, _moment(sim.backward_peak, grad_scale)), bwd_end
    )
    if sim.accumulating_peak is not None:
        acc = _with(base, _moment(sim.accumulating_peak, grad_scale))
        acc[GRADIENTS] += grads
        accumulating[first] = acc
    phases["eval", first] = PhaseMemory(
        eval_base, _with(eval_base, _moment(sim.eval_peak, grad_scale)), eval_base
    )


def _step_phases(
    phases: dict[tuple[str, bool], PhaseMemory],
    first: bool,
    raw: dict[str, Any],
    opt: OptimizerMemory,
    with_grads: Breakdown,
) -> None:
    """Clipping, the optimizer's step and ``zero_grad``."""
    phases[CLIP, first] = PhaseMemory(
        with_grads, dict(with_grads, **{TEMPORARIES: _clip_norms(raw)}), with_grads
    )
    step_end = dict(with_grads, **{OPTIMIZER_STATE: opt.state})
    step_peak = dict(step_end, **{TEMPORARIES: opt.temp})
    phases["optimizer.step", first] = PhaseMemory(with_grads, step_peak, step_end)
    zg_start = dict(step_end)
    zg_end = dict(zg_start, **{GRADIENTS: 0})
    phases["zero_grad", first] = PhaseMemory(zg_start, zg_start, zg_end)


def _held_outputs(
    phases: dict[tuple[str, bool], PhaseMemory],
    accumulating: dict[bool, Breakdown],
    act: dict[str, Any],
    notes: list[str],
) -> None:
    """Outputs the training loop still referenced when backward began (measured)."""
    held = fact_int(act.get("held_output_bytes"))
    if not held:
        return
    kept = act.get("held_step_bytes")
    through = held if kept is None else min(held, fact_int(kept))
    _hold(phases, accumulating, held, through)
    if through == held:
        notes.append(
            f"the model's outputs ({_gib(held)}) were still referenced when backward"
            " began: counted as activations through the step, until the next forward"
            " replaces them"
        )
    else:
        notes.append(
            f"the model's outputs ({_gib(held)}) were still referenced when backward"
            f" began and {_gib(through)} of them when the step began: counted as"
            " activations through backward, and what was left through the step"
        )


def _hold(
    phases: dict[tuple[str, bool], PhaseMemory],
    accumulating: dict[bool, Breakdown],
    held: int,
    through: int,
) -> None:
    """Add outputs the training loop keeps (``logits = model(x)``) where they are alive:
    ``held`` from the end of a forward through its backward, and of them ``through``
    (what the loop still holds when the step begins) on through the step and the next
    forward (the old ones are replaced only when it returns); not in eval."""

    def add(b: Breakdown, n: int) -> Breakdown:
        # A copy (_with): one breakdown may stand for several moments (a phase's end, the
        # next one's start).
        return _with(b, {ACTIVATIONS: n})

    for (name, first), pm in list(phases.items()):
        if name == "eval":
            continue
        if name == "forward":
            before = 0 if first else through
            phases[name, first] = PhaseMemory(
                add(pm.start, before), add(pm.peak, before), add(pm.end, held)
            )
        elif name == "backward":
            phases[name, first] = PhaseMemory(
                add(pm.start, held), add(pm.peak, held), add(pm.end, held)
            )
        else:
            phases[name, first] = PhaseMemory(
                add(pm.start, through), add(pm.peak, through), add(pm.end, through)
            )
    for first, b in list(accumulating.items()):
        accumulating[first] = add(b, through)


def _workspaces(
    phases: dict[tuple[str, bool], PhaseMemory], accumulating: dict[bool, Breakdown], each: int
) -> None:
    """Add cuBLAS's workspaces (``each`` bytes a thread): the training thread's from the
    first forward on, autograd's device thread's too from the first backward on. They stay
    allocated for the process's life."""
    if each <= 0:
        return
    for (name, first), pm in list(phases.items()):
        extra = {BLAS_WORKSPACES: each if (name == "forward" and first) else 2 * each}
        phases[name, first] = PhaseMemory(
            _with(pm.start, extra), _with(pm.peak, extra), _with(pm.end, extra)
        )
    for first, b in list(accumulating.items()):
        accumulating[first] = _with(b, {BLAS_WORKSPACES: 2 * each})


def _with_layout(b: Breakdown, extra: dict[str, int], lay: LayoutMemory, where: str) -> Breakdown:
    """``b`` with the layout's buffers; ``where`` (ZeRO's gradients): ``held`` from the
    backward's end to the step's peak, ``after`` the step, else ``""``."""
    out = dict(b)  # a copy: one breakdown may stand for several moments
    for part in (lay.persistent, extra):
        for k, v in part.items():
            out[k] = out.get(k, 0) + v
    if lay.grads_in_buckets:
        out[GRADIENTS] = 0  # views of the buckets, counted there
    if lay.grad_bytes is not None:
        # ZeRO: this rank's gradient partition replaces the model's gradients.
        own = out.get(GRADIENTS, 0)
        if where == "held" or lay.grads_from_start:
            out[GRADIENTS] = lay.grad_bytes
        elif where == "after":
            out[GRADIENTS] = 0  # the step freed the partition
        elif lay.grads_reduced_early:
            out[GRADIENTS] = min(own, lay.grad_bytes)
    return out


def _add_layout(
    phases: dict[tuple[str, bool], PhaseMemory],
    accumulating: dict[bool, Breakdown],
    lay: LayoutMemory,
    peak_at: float = 0.0,
) -> None:
    """Add the parallel layout's buffers where they are alive (``_parallel.py``).

    Args:
        peak_at: Where in backward the model's own peak falls (0 to 1).
    """
    if not (
        lay.persistent or lay.forward or lay.held or lay.backward or lay.grads_in_buckets
    ) and not (lay.forward_units or lay.backward_units or lay.grad_bytes is not None):
        return
    backward = dict(lay.backward)
    if lay.backward_gathered:
        # The unit whose computation the model's own backward peak falls in.
        at = min(int(peak_at * len(lay.backward_gathered)), len(lay.backward_gathered) - 1)
        backward[FSDP_UNSHARDED] = lay.backward_gathered[at]
    for (name, first), pm in list(phases.items()):
        phases[name, first] = _layout_phase(name, pm, lay, backward)
    for first, b in list(accumulating.items()):
        accumulating[first] = _with_layout(b, backward, lay, "")


def _layout_phase(
    name: str, pm: PhaseMemory, lay: LayoutMemory, backward: dict[str, int]
) -> PhaseMemory:
    """One phase with the layout's buffers at its start, peak and end."""
    none: dict[str, int] = {}
    start, peak, end = none, none, none
    if name == "forward":
        peak, end = lay.forward, lay.held
    elif name == "backward":
        start, peak = lay.held, backward
    # Where ZeRO's gradient partition is alive (see ``_with_layout``), by moment.
    before = "held" if name in (CLIP, "optimizer.step") else ""
    before = "after" if name == "zero_grad" else before
    after = "after" if name in ("optimizer.step", "zero_grad") else ""
    at_peak = _with_layout(pm.peak, peak, lay, before)
    if name == "optimizer.step" and lay.step_grads:
        at_peak[GRADIENTS] = at_peak.get(GRADIENTS, 0) + lay.step_grads
    if name == "backward" and lay.grads_copy:
        # ZeRO-1: the partition's gradient copy, made at the backward's end while
        # most of the model's gradients are still whole.
        moment = _with_layout(pm.end, backward, lay, "")
        moment[GRADIENTS] = moment.get(GRADIENTS, 0) + lay.grads_copy
        if total(moment) > total(at_peak):
            at_peak = moment
    # FSDP: the peak may instead be at one unit's collectives, mid-phase.
    for moment in _unit_moments(name, pm, lay):
        if total(moment) > total(at_peak):
            at_peak = _with_layout(moment, none, lay, "")
    return PhaseMemory(
        _with_layout(pm.start, start, lay, before),
        at_peak,
        _with_layout(pm.end, end, lay, "held" if name in ("backward", CLIP) else after),
    )


def _unit_moments(name: str, pm: PhaseMemory, lay: LayoutMemory) -> list[Breakdown]:
    """The moments of a phase at each FSDP unit, on the phase's own figures: the share
    of forward's activations saved (or in backward, not yet freed) by then."""
    out = []
    if name == "forward":
        saved = pm.end.get(ACTIVATIONS, 0) - pm.start.get(ACTIVATIONS, 0)
        for share, unsharded in lay.forward_units:
            b = dict(pm.start)
            b[ACTIVATIONS] = b.get(ACTIVATIONS, 0) + round(saved * share)
            b[FSDP_UNSHARDED] = unsharded
            out.append(b)
    elif name == "backward":
        saved = pm.start.get(ACTIVATIONS, 0) - pm.end.get(ACTIVATIONS, 0)
        for share, grads, unsharded, reduce in lay.backward_units:
            b = dict(pm.start)
            b[ACTIVATIONS] = pm.end.get(ACTIVATIONS, 0) + round(saved * share)
            b[GRADIENTS] = grads
            b[FSDP_UNSHARDED] = unsharded
            b[FSDP_REDUCE] = reduce
            out.append(b)
    return out


FINDING = 0.10
"""Formula and measurement disagreeing by more than this (relative) is a finding."""


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def _disagreement(formula: int, measured: int) -> list[str]:
    """A finding when the shape formula and the measurement disagree."""
    if measured <= 0 or abs(formula - measured) <= FINDING * measured:
        return []
    off = (formula - measured) / measured
    return [
        f"activations: the formula for this model's shape gives {_gib(formula)}, autograd"
        f" saved {_gib(measured)} in the first training forward ({off:+.0%}): the formula"
        " does not know something this model does, and the measurement is used"
    ]


def _set_saved(sim: Simulation, saved: int, amp: int) -> Simulation:
    """The formula's moments with its saved bytes set to the measured ones (each moment's
    saved and AMP-copy bytes scaled alike, so the shape of the step is kept)."""
    fs, fa = sim.forward_end.saved, sim.forward_end.amp
    rs, ra = (saved / fs if fs else 1.0), (amp / fa if fa else 1.0)

    def scaled(m: Moment) -> Moment:
        return Moment(min(round(m.saved * rs), saved), min(round(m.amp * ra), amp), m.temp, m.grads)

    return replace(
        sim,
        forward_peak=scaled(sim.forward_peak),
        forward_end=Moment(saved, amp, sim.forward_end.temp, sim.forward_end.grads),
        backward_peak=scaled(sim.backward_peak),
        backward_end=scaled(sim.backward_end),
        eval_peak=scaled(sim.eval_peak),
        accumulating_peak=(
            scaled(sim.accumulating_peak) if sim.accumulating_peak is not None else None
        ),
    )


def _measurement_notes(act: dict[str, Any]) -> list[str]:
    """What the activations measurement could not see."""
    out = []
    if act.get("skipped"):
        out.append(f"activations not measured: {str(act['skipped'])[:80]}")
    for key, what in (
        ("offloaded_bytes", "moved off the device by your saved-tensor hooks"),
        ("opaque_bytes", "packed by your saved-tensor hooks (checkpointing, a custom store)"),
    ):
        n = fact_int(act.get(key))
        if n:
            out.append(f"activations: {_gib(n)} saved and {what}, not counted on the device")
    unseen = [
        m
        for m in act.get("modules") or []
        if isinstance(m, dict) and m.get("recomputed") and not m.get("recompute_bytes")
    ]
    if unseen:
        out.append(
            f"activations: {len(unseen)} modules ran under reentrant activation checkpointing;"
            " what backward's recomputation keeps was not measured (the backward peak"
            " can be higher)"
        )
    if act.get("error"):
        out.append(f"activations measurement: {str(act['error'])[:100]}")
    return out


def breakdown(prediction: Prediction, phase_name: str, first_step: bool = False) -> Breakdown:
    """Bytes by category at the peak of ``phase_name`` (all zeros for an unknown phase)."""
    pm = prediction.phases.get((phase_name, bool(first_step)))
    if pm is None:
        return {c: 0 for c in CATEGORIES}
    return dict(pm.peak)

"""Optimizer state and the temporaries of ``optimizer.step()``, from the optimizer facts.

Sources, per rule:

- Adam/AdamW state: ``exp_avg`` and ``exp_avg_sq`` (``zeros_like`` the parameter) and, with
  ``amsgrad``, ``max_exp_avg_sq``, created lazily by ``_init_group`` on the first step
  (``torch/optim/adam.py``); a scalar ``step`` per parameter that lives on the parameter's
  device only for ``fused``/``capturable`` (else on the CPU). Kingma & Ba 2015 for the
  algorithm; 2 states × 4 bytes + fp32 weights + gradients is ZeRO's 16 bytes per
  parameter with mixed precision (Rajbhandari et al. 2020, section 3.1).
- foreach Adam(W) (``_multi_tensor_adam``): per (device, dtype) bucket one parameter-sized
  ``exp_avg_sq_sqrt`` list; the previous bucket's list is still referenced while the next
  one is made, and each param group is a separate call. Fused (``_fused_adam_``) works in
  place. The for-loop path (``_single_tensor_adam``) makes ``sqrt`` and then ``denom`` per
  tensor while the previous tensor's ``denom`` is alive: its peak is the largest
  ``2 * size[i] + size[i - 1]`` over the group's order (``loop_peak_bytes``; older facts
  only know the two largest, taken as neighbours); Adam (not W) with weight decay adds
  ``grad.add(param)``.
- SGD (``torch/optim/sgd.py``): ``momentum_buffer`` cloned from the gradient on the first
  step when ``momentum != 0``; foreach makes a bucket-sized gradient copy for weight decay
  or Nesterov, the for-loop one tensor.
- Adafactor (``torch/optim/_adafactor.py``; Shazeer & Stern 2018): row and column variances
  for matrices (``shape[:-1]`` and ``shape[:-2] + shape[-1:]``), a full variance for
  vectors; the update makes one parameter-sized ``var_estimate`` per tensor (a bucket's
  worth with foreach).
- 8-bit Adam (bitsandbytes ``Optimizer2State``; Dettmers et al. 2022, "8-bit Optimizers
  via Block-wise Quantization"): two uint8 states plus one fp32 absmax per 256-element
  block for tensors of at least ``min_8bit_size`` (4096) elements; smaller tensors keep
  32-bit states. Its kernels update in place.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..facts import fact_int

BNB_BLOCK = 256
"""bitsandbytes' block size for block-wise 8-bit states (``Optimizer2State.init_state``)."""


@dataclass
class OptimizerMemory:
    """What an optimizer adds to device memory.

    Attributes:
        state: Optimizer state bytes after the first step.
        temp: Peak temporary bytes inside ``step()``.
        present: True when the state already existed when facts were read (a resumed run):
            then there is no first-step jump.
        kind: The optimizer kind the rules used.
        notes: What could not be predicted exactly.
        state_name: What its state is called in an explanation (``"AdamW state"``).
        temp_name: What its step's temporary is (``"AdamW foreach temporary"``).
    """

    state: int = 0
    temp: int = 0
    present: bool = False
    kind: str = "none"
    notes: list[str] = field(default_factory=list)
    state_name: str = "optimizer state"
    temp_name: str = "step temporaries"


def _pairs_peak(sizes: list[int]) -> int:
    """Peak of a loop whose per-bucket temporary outlives the next bucket's creation."""
    if not sizes:
        return 0
    peak = sizes[0]
    for a, b in itertools.pairwise(sizes):
        peak = max(peak, a + b)
    return peak


@dataclass
class _Group:
    """One param group's buckets, as a rule reads them."""

    buckets: list[dict[str, Any]]
    options: dict[str, Any]
    impl: str
    kind: str
    sizes: list[int]  # bytes of each bucket
    big: int  # the largest tensor's bytes
    second: int  # the second largest's
    steps: int  # bytes of per-parameter ``step`` scalars on the device

    def option(self, name: str, default: Any = None) -> Any:
        """The group's own setting, else the optimizer's default."""
        return self.buckets[0].get(name, self.options.get(name, default))


def _adam(g: _Group) -> tuple[int, int | None]:
    n_states = 3 if g.option("amsgrad", False) else 2
    state = n_states * sum(g.sizes) + g.steps
    coupled_wd = g.kind == "adam" and float(g.option("weight_decay", 0) or 0) != 0
    if g.impl == "foreach":
        return state, _pairs_peak(g.sizes)
    if g.impl == "for-loop":
        loop = max((fact_int(b.get("loop_peak_bytes")) for b in g.buckets), default=0)
        return state, (loop or 2 * g.big + g.second) + (g.big if coupled_wd else 0)
    return state, None


def _sgd(g: _Group) -> tuple[int, int | None]:
    state = sum(g.sizes) if float(g.option("momentum", 0) or 0) else 0
    needs_copy = float(g.option("weight_decay", 0) or 0) != 0 or bool(g.option("nesterov", False))
    if needs_copy and g.impl == "foreach":
        return state, _pairs_peak(g.sizes)
    if needs_copy and g.impl == "for-loop":
        return state, g.big
    return state, None


def _adafactor(g: _Group) -> tuple[int, int | None]:
    state = 0
    for b in g.buckets:
        elt = fact_int(b.get("bytes")) // max(1, fact_int(b.get("count"))) or 4
        state += (fact_int(b.get("factored_count")) + fact_int(b.get("vector_count"))) * elt
    return state + g.steps, _pairs_peak(g.sizes) if g.impl == "foreach" else g.big + g.second


def _adam_8bit(g: _Group) -> tuple[int, int | None]:
    state = 0
    for b in g.buckets:
        count, small = fact_int(b.get("count")), fact_int(b.get("small_count"))
        big_count = max(0, count - small)
        blocks = -(-big_count // BNB_BLOCK)
        state += 2 * big_count + 2 * 4 * blocks + 2 * 4 * small
    return state, None


@dataclass(frozen=True)
class OptimizerKind:
    """An optimizer the predictor has rules for, described in this one place.

    Attributes:
        cls: Its class name, as facts and ``gpuwatch estimate`` name it.
        module: Its module.
        temps: What the temporary inside ``step()`` is called, by implementation
            (``{}`` stands for the class name).
        rule: ``(state bytes, step temporary or None)`` of one param group.
        note: Said with every prediction for it.
    """

    cls: str
    module: str
    temps: dict[str, str]
    rule: Callable[[_Group], tuple[int, int | None]]
    note: str = ""


_ADAM_TEMPS = {"foreach": "{} foreach temporary", "for-loop": "{} for-loop temporaries"}

KINDS: dict[str, OptimizerKind] = {
    "adamw": OptimizerKind("AdamW", "torch.optim.adamw", _ADAM_TEMPS, _adam),
    "adam": OptimizerKind("Adam", "torch.optim.adam", _ADAM_TEMPS, _adam),
    "sgd": OptimizerKind(
        "SGD",
        "torch.optim.sgd",
        {"foreach": "{} foreach gradient copy", "for-loop": "{} gradient copy"},
        _sgd,
    ),
    "adafactor": OptimizerKind(
        "Adafactor",
        "torch.optim._adafactor",
        {"foreach": "{} foreach variance estimate", "for-loop": "{} variance estimate"},
        _adafactor,
    ),
    "adamw-8bit": OptimizerKind(
        "AdamW8bit",
        "bitsandbytes.optim.adamw",
        {},
        _adam_8bit,
        "8-bit Adam: bitsandbytes' block-wise states (256-element blocks)",
    ),
}
"""Optimizer kinds by name; a class is matched to the first whose name starts it (see
:func:`kind_of`: ``adamw`` before ``adam``)."""

ESTIMATE_OPTIMIZERS: dict[str, tuple[str, dict[str, Any]]] = {
    "adamw": ("adamw", {}),
    "adam": ("adam", {}),
    "sgd": ("sgd", {"momentum": 0.0}),
    "sgd-momentum": ("sgd", {"momentum": 0.9}),
    "adafactor": ("adafactor", {}),
    "adamw-8bit": ("adamw-8bit", {}),
}
"""``gpuwatch estimate --optimizer`` choices: a kind and the options it is made with."""


def kind_of(opt: dict[str, Any]) -> str:
    """Normalised optimizer kind from its class and module names."""
    name = str(opt.get("class", "")).lower()
    module = str(opt.get("module", "")).lower()
    if "8bit" in name or ("bitsandbytes" in module and "adam" in name):
        return "adamw-8bit"
    for kind in KINDS:
        if name.startswith(kind) or name == kind:
            return kind
    return "other"


def optimizer_memory(opt: dict[str, Any] | None, device: str | None = None) -> OptimizerMemory:
    """State and temporaries of the optimizer described by ``opt`` (facts' ``optimizer``).

    Args:
        opt: The optimizer facts, or None for no optimizer.
        device: Only count buckets on this device (None: all).
    """
    if not opt:
        return OptimizerMemory()
    kind = opt.get("kind") or kind_of(opt)
    options = opt.get("options") or {}
    impl = opt.get("impl") or "for-loop"
    groups = [
        g
        for g in opt.get("groups") or []
        if isinstance(g, dict) and (device is None or g.get("device") == device)
    ]
    mem = OptimizerMemory(kind=kind, present=fact_int(opt.get("state_bytes")) > 0)
    cls = str(opt.get("class") or kind)[:40]
    mem.state_name = f"{cls} state"
    spec = KINDS.get(kind)
    temp = spec.temps.get(impl) if spec else None
    mem.temp_name = (temp or f"{cls} step temporaries").format(cls)
    by_group: dict[int, list[dict[str, Any]]] = {}
    for g in groups:
        by_group.setdefault(fact_int(g.get("group")), []).append(g)

    temps: list[int] = []
    for buckets in by_group.values():
        if spec is None:
            mem.state += fact_int(opt.get("state_bytes"))
            continue
        on_device_step = bool(options.get("fused") or options.get("capturable")) or any(
            str(b.get("device", "")).startswith("cpu") for b in buckets
        )
        group = _Group(
            buckets,
            options,
            impl,
            kind,
            sizes=[fact_int(b.get("bytes")) for b in buckets],
            big=max((fact_int(b.get("max_tensor_bytes")) for b in buckets), default=0),
            second=max((fact_int(b.get("second_tensor_bytes")) for b in buckets), default=0),
            steps=sum(fact_int(b.get("tensors")) for b in buckets) * 4 if on_device_step else 0,
        )
        state, step_temp = spec.rule(group)
        mem.state += state
        if step_temp is not None:
            temps.append(step_temp)
    if kind == "other":
        mem.notes.append(
            f"optimizer {opt.get('class')!r} has no rules: state taken as measured when facts"
            " were read, temporaries unknown"
        )
    elif spec is not None and spec.note:
        mem.notes.append(spec.note)
    mem.temp = max(temps, default=0)
    return mem

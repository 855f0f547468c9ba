"""``gpuwatch.watch(model, optimizer)``: model facts for the predictor, automatic phases.

Facts are sent once at :func:`watch` and again, completed, when the first training forward
shows the batch (and the autocast dtype) and when the first optimizer step shows the
optimizer, if :func:`watch` was not given one. Without a call to :func:`watch` (the start-up
hook of ``gpuwatch run``), the first model to run a training forward is the one described.

The facts come from ``gpuwatch.instrument._facts`` (``collect_facts`` / ``batch_facts``);
while that module is absent no facts are sent and the phases work all the same. The first
training forward of the described model is also measured (``_activations``): what autograd
saves, sent as the ``activations`` facts when its backward begins. ``GPUWATCH_ACTIVATIONS=0``
turns that measurement off.
"""

from __future__ import annotations

import os
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from . import _api, _auto

M = TypeVar("M")

_WRAPPERS = {
    "DistributedDataParallel": "module",
    "DataParallel": "module",
    "OptimizedModule": "_orig_mod",
    "FullyShardedDataParallel": "_fsdp_wrapped_module",
    "DeepSpeedEngine": "module",
}
"""Wrapper classes and the submodule through which each reaches the model."""


class _Watched:
    """What we know of the described model."""

    def __init__(self, model: Any, optimizer: Any, amp_dtype: Any, checkpointing: Any) -> None:
        global _epochs
        # Each model described in this process starts an epoch of facts (docs/facts.md):
        # the dashboard predicts earlier phases from the facts of the model they ran.
        self.epoch = _epochs
        _epochs += 1
        self.model = weakref.ref(model)
        self.optimizer = optimizer
        # The optimizer as given, where a framework wraps the torch one (DeepSpeed's ZeRO
        # optimizer holds the layout's facts).
        self.optimizer_wrapper: Any = None
        self.amp_dtype = amp_dtype
        self.checkpointing = checkpointing
        self.batch: dict[str, Any] | None = None
        self.activations: dict[str, Any] | None = None


_lock = threading.Lock()
_primary: _Watched | None = None
_meter: Any = None  # the running activations measurement (_activations.Meter)
_held_meter: Any = None  # an ended one whose held outputs are looked at once more
_measured = False  # one measurement per process: the first training forward
_quiet: list[Any] = []  # watch(phases=False): the measurement's own hooks on the model
_epochs = 0  # models described so far in this process


def watch(
    model: M,
    optimizer: Any = None,
    *,
    amp_dtype: Any = None,
    checkpointing: bool | None = None,
    phases: bool = True,
) -> M:
    """Describe ``model`` to gpuwatch and infer its training phases automatically.

    Sends the model facts (parameters, buffers, optimizer, precision, batch shape) that the
    dashboard's predictor needs, and installs the automatic phases: forward / eval for the
    outermost calls of ``model``, backward, optimizer.step, zero_grad and data. Calling it
    again with the same model only adds what is new (an optimizer, say). Never raises.

    Args:
        model: The ``torch.nn.Module`` being trained (before or after wrapping it in DDP
            or ``torch.compile``).
        optimizer: Its optimizer; when omitted, the first optimizer that steps this model's
            parameters is used.
        amp_dtype: The autocast dtype, if known; otherwise read at the first forward.
        checkpointing: Whether activation checkpointing is on, if known.
        phases: Install the automatic phases (``False``: facts only, for scripts that
            draw their own; the first training forward is measured all the same).

    Returns:
        ``model``, unchanged.

    Example:
        >>> model = gpuwatch.watch(MyModel().cuda(), optimizer)
    """
    global _primary
    try:
        if optimizer is None and type(model).__name__ == "DeepSpeedEngine":
            optimizer = getattr(model, "optimizer", None)  # built by deepspeed.initialize
        given = optimizer
        optimizer = _unwrap_optimizer(optimizer)
        with _lock:
            current = _primary
            if current is not None and current.model() is model:
                changed = False
                for name, value in (
                    ("optimizer", optimizer),
                    ("amp_dtype", amp_dtype),
                    ("checkpointing", checkpointing),
                ):
                    if value is not None and getattr(current, name) is not value:
                        setattr(current, name, value)
                        changed = True
                watched, fresh = current, changed
            else:
                watched = _primary = _Watched(model, optimizer, amp_dtype, checkpointing)
                fresh = True
                _reset_activations()  # a new model: its first training forward is measured
            if given is not optimizer:
                watched.optimizer_wrapper = given
        if phases and _auto.install():
            _auto.hook_module(model, compiled_later=not _compiled(model))
            _arm_activations()
        elif not phases:
            _measure_quietly(model)
        _api._state.memory.check_active()  # CUDA already in use: OOM observer, history
        if fresh:
            _send(watched)
        _await(watched)
    except Exception:
        pass
    return model


def autowatch() -> bool:
    """Zero-code mode (the start-up hook): discover the model, describe the first that trains.

    Installs the automatic phases with module discovery (see :func:`_auto.install`); the
    first module whose outermost call runs a training forward is described as if
    :func:`watch` had been called on it. torch must be imported.

    Returns:
        True when the automatic phases are installed.
    """
    try:
        if not _auto.install(discover=True):
            return False
        if _primary is None:
            _auto.facts_hook = _discovered
            _reset_activations()
        _arm_activations()
        return True
    except Exception:
        return False


def _discovered(module: Any, args: tuple, kwargs: dict) -> None:
    global _primary, _rediscovering
    with _lock:
        current, again = _primary, _rediscovering
        _rediscovering = False
        if current is not None:
            model = current.model()
            if model is not None and _unwrap(model) is _unwrap(module):
                _await(current)
                return
            if not again:
                return
        # The outermost module as called (DDP, FSDP1): the parallel facts read it.
        _primary = watched = _Watched(module, None, None, None)
    if current is not None:  # a notebook's new model: measured at its next forward
        _reset_activations()
        _arm_activations()
    _on_forward(module, args, kwargs)
    _await(watched)


_rediscovering = False  # a notebook cell looks for a newly built model (rediscover)


def rediscover() -> None:
    """A notebook cell may train a model built after the described one (a re-run model
    cell): the first model whose training forward runs next is described instead, as a
    new epoch of facts. Only where :func:`autowatch` discovers the model (no ``watch``)."""
    global _rediscovering
    if _auto.facts_hook is None and _auto.covers_all():
        _rediscovering = True
        _auto.facts_hook = _discovered


def describe_batch(args: tuple, kwargs: dict) -> None:
    """The batch of the described model, from a framework that knows it (Lightning)."""
    watched = _primary
    if watched is None or watched.batch is not None:
        return
    facts = _facts_module()
    try:
        watched.batch = facts.batch_facts(args, kwargs) if facts is not None else {}
    except Exception:
        watched.batch = {}
    _await(watched)
    _send(watched)


def _await(watched: _Watched) -> None:
    """Ask the automatic phases for what only a forward or a step can tell."""
    _auto.facts_hook = _on_forward if watched.batch is None else None
    _auto.step_hook = _on_step if watched.optimizer is None else None


def _on_forward(module: Any, args: tuple, kwargs: dict) -> None:
    """After a training forward: the batch and autocast dtype of the described model."""
    watched = _primary
    if watched is None:
        return
    model = watched.model()
    if model is None or _unwrap(module) is not _unwrap(model):
        return
    _auto.facts_hook = None
    try:
        facts = _facts_module()
        watched.batch = facts.batch_facts(args, kwargs) if facts is not None else {}
    except Exception:
        watched.batch = {}
    if watched.amp_dtype is None:
        watched.amp_dtype = _autocast_dtype()
    _send(watched)


def _on_step(optimizer: Any) -> None:
    """Before an optimizer step: adopt it if it steps the described model's parameters."""
    watched = _primary
    if watched is None or watched.optimizer is not None:
        _auto.step_hook = None
        return
    model = watched.model()
    if model is None:
        return
    try:
        ours = {id(p) for p in model.parameters()}
        if not any(id(p) in ours for g in optimizer.param_groups for p in g["params"]):
            return
    except Exception:
        return
    _auto.step_hook = None
    watched.optimizer = _unwrap_optimizer(optimizer)
    _send(watched)


def _reset_activations() -> None:
    """Forget an earlier measurement (a different model is described now)."""
    global _meter, _measured, _held_meter
    meter, _meter, _measured = _meter, None, False
    if meter is not None:
        meter.stop("another model")
    _held_meter = None
    if _auto.activations_hook in (_on_activations, _on_held):
        _auto.activations_hook = None
    _drop_quiet_hooks()


def _measure_quietly(model: Any) -> None:
    """``watch(phases=False)``: measure the first training forward without phases.

    The automatic phases are what usually tell the measurement that a training forward
    began and returned, and when to end it; without them two hooks on the model and
    torch's global optimizer-step pre-hook do (the measurement's count itself ends at its
    first unpack: backward began). All three go once the measurement ends, so later steps
    run no gpuwatch code.
    """
    if _measured or _meter is not None or _quiet:
        return
    if _activations_off():
        return
    torch = sys.modules.get("torch")
    if torch is None:
        return

    def pre(module: Any, args: Any) -> None:
        if _auto_measures(module):
            return  # the automatic phases (zero-code hook) already tell the measurement
        _on_activations("forward", module if torch.is_grad_enabled() else None)
        if _measured and _meter is None:
            _drop_quiet_hooks()  # skipped (compiled) or ended: nothing left to see

    def post(module: Any, args: Any, output: Any) -> None:
        if not _auto_measures(module):
            _on_activations("returned", module, output)

    def step(optimizer: Any, args: Any, kwargs: Any) -> None:
        if _meter is not None and _auto.activations_hook is None:
            _on_activations("step", None)

    from torch.optim.optimizer import register_optimizer_step_pre_hook

    _quiet[:] = [
        model.register_forward_pre_hook(pre),
        model.register_forward_hook(post, always_call=True),
        register_optimizer_step_pre_hook(step),
    ]


def _auto_measures(module: Any) -> bool:
    """Whether the automatic phases tell the measurement about ``module``'s calls: they
    see them (hooked, or discovering under the zero-code hook of ``gpuwatch record``) and
    were asked to. ``watch(phases=False)`` after the zero-code hook took the request back
    (a new model), so its own hooks must tell it."""
    return _auto.covers(module) and _auto.activations_hook is _on_activations


def _drop_quiet_hooks() -> None:
    handles, _quiet[:] = list(_quiet), []
    for handle in handles:
        try:
            handle.remove()
        except Exception:
            pass


def _activations_off() -> bool:
    """``GPUWATCH_ACTIVATIONS=0`` (or off, false, no) turns the measurement off."""
    return os.environ.get("GPUWATCH_ACTIVATIONS", "").strip().lower() in ("0", "off", "false", "no")


def _arm_activations() -> None:
    """Ask the automatic phases to tell us when the first training forward begins."""
    if _measured or _meter is not None or _auto.activations_hook is not None:
        return
    if _activations_off():
        return
    _auto.activations_hook = _on_activations


def _on_activations(event: str, module: Any, output: Any = None) -> None:
    """Start, end or move on the activations measurement (see ``_auto.activations_hook``)."""
    global _meter, _measured
    try:
        meter = _meter
        if meter is not None:
            if event == "returned":
                if _unwrap(module) is meter.model_ref():
                    meter.model_returned(output)
                return
            _finish(meter, "next forward" if event == "forward" else event)
            return
        if event != "forward" or module is None or _measured:
            return
        model = _unwrap(module)
        watched = _primary
        if watched is not None and watched.model() is not None:
            if _unwrap(watched.model()) is not model:
                return  # another module's forward: wait for the described model's
        elif _auto.facts_hook is not _discovered:
            return
        _measured = True
        torch = sys.modules.get("torch")
        from . import _activations

        reason = _activations.skip_reason(torch, module) or _activations.skip_reason(torch, model)
        if reason is not None:
            _auto.activations_hook = None
            _store({"source": "measured", "skipped": reason}, model)
            return
        # The automatic phases say when backward begins, before it runs: the forward's
        # peak may go on through the loss until then (watch(phases=False) cannot).
        meter = _activations.Meter(
            torch, model, loss_span=_auto.activations_hook is _on_activations
        )
        if meter.start():
            _meter = meter
        else:
            _auto.activations_hook = None
            _store({"source": "measured", "skipped": meter.error or "could not start"}, model)
    except Exception:
        _auto.activations_hook = None


def _finish(meter: Any, why: str) -> None:
    """End the measurement; send its facts (only on the thread that began it)."""
    global _meter, _held_meter
    if not meter.stop(why):
        return  # another thread: the begin thread's next event ends it
    _meter = None
    _auto.activations_hook = None
    _drop_quiet_hooks()
    model = meter.model_ref()
    if model is None:
        return
    facts = meter.facts()
    if meter.held:
        if why == "backward":
            # Sent before backward runs; whether the loop still holds its outputs when
            # the step begins (or dropped them: ``del logits``) the next event tells.
            _held_meter = meter
            _auto.activations_hook = _on_held
        else:
            facts["held_step_bytes"] = meter.held_now()
    _store(facts, model)


def _on_held(event: str, module: Any, output: Any = None) -> None:
    """After the measurement ended at backward: at the step, zero_grad or next forward
    (whichever comes first), send ``held_step_bytes`` if the loop dropped its outputs."""
    global _held_meter
    if event in ("returned", "backward"):
        return
    try:
        meter, _held_meter = _held_meter, None
        _auto.activations_hook = None
        if meter is None:
            return
        now = meter.held_now()
        meter.held_refs = []
        watched, model = _primary, meter.model_ref()
        if now == meter.held or model is None or watched is None or not watched.activations:
            return
        _store(dict(watched.activations, held_step_bytes=now), model)
    except Exception:
        _auto.activations_hook = None


def _store(facts: dict[str, Any], model: Any) -> None:
    """Keep the activations facts with the described model and send the facts again."""
    watched = _primary
    if watched is None or watched.model() is None or _unwrap(watched.model()) is not model:
        return
    watched.activations = facts
    _send(watched)


def _send(watched: _Watched) -> None:
    """Collect the facts and send them (replacing earlier ones); quiet without ``_facts``."""
    model = watched.model()
    facts_module = _facts_module()
    if model is None or facts_module is None:
        return
    try:
        inner = _unwrap(model)
        # The wrapper (DDP, FSDP1) holds the parallel layout's options.
        wrapped = {"wrapper": model} if inner is not model else {}
        facts = facts_module.collect_facts(
            inner,
            watched.optimizer,
            amp_dtype=watched.amp_dtype,
            checkpointing=watched.checkpointing,
            optimizer_wrapper=watched.optimizer_wrapper,
            **wrapped,
        )
        if watched.batch:
            facts["batch"] = watched.batch  # docs/facts.md: batch_facts() goes under "batch"
        if watched.activations:
            facts["activations"] = watched.activations
        facts["epoch"] = watched.epoch
        _api.set_facts(facts)
    except Exception:
        return
    for listener in list(facts_listeners):
        try:
            listener(facts)
        except Exception:
            pass


facts_listeners: list[Callable[[dict[str, Any]], None]] = []
"""Called with each set of facts sent, on the thread that sent them: each must return at
once (``gpuwatch.watch(..., warn=True)`` forecasts on a thread of its own)."""


def _compiled(model: Any) -> bool:
    return type(model).__name__ == "OptimizedModule"


def _facts_module() -> Any:
    try:
        from . import _facts
    except ImportError:
        return None
    return _facts


def _unwrap(module: Any) -> Any:
    """The model inside DDP / DataParallel / torch.compile / FSDP wrappers."""
    for _ in range(8):
        attr = _WRAPPERS.get(type(module).__name__)
        inner = getattr(module, "_modules", {}).get(attr) if attr else None
        if inner is None:
            return module
        module = inner
    return module


def _unwrap_optimizer(optimizer: Any) -> Any:
    """The torch optimizer inside a framework's wrapper (Accelerate's, Lightning's)."""
    for _ in range(4):
        inner = getattr(optimizer, "optimizer", None)
        if inner is None or inner is optimizer or not hasattr(inner, "param_groups"):
            return optimizer
        optimizer = inner
    return optimizer


def _autocast_dtype() -> Any:
    """The autocast dtype in force (CUDA first), or None."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    for device in ("cuda", "cpu"):
        try:
            if torch.is_autocast_enabled(device):
                return torch.get_autocast_dtype(device)
        except Exception:
            continue
    return None

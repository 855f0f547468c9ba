"""Automatic phases inferred from torch's own hooks, for scripts that annotate nothing.

Installed by :func:`gpuwatch.watch` (forward hooks on the watched model) and by the start-up
hook of ``gpuwatch run`` (global module hooks, so a script that never imports gpuwatch gets
phases). torch is imported only inside :func:`install`, which runs once torch is imported.

The rules:

forward / eval
    The outermost call of a module that has parameters. Calls of its inner modules, module
    calls made while it runs (from any thread: DataParallel replicas) and module calls made
    during a backward (recomputation under activation checkpointing) are part of it. Named
    ``eval`` when grad is disabled (``no_grad`` / ``inference_mode``), else ``forward``.
    Parameterless modules (loss functions, augmentations) are never phases themselves.
backward
    From the call of ``torch.autograd.backward`` (what ``loss.backward()`` runs) until it
    returns: after the last gradient has been accumulated and the engine's final callbacks
    (DDP's all-reduce) have run. Nested calls (reentrant checkpointing) belong to it.
optimizer.step
    torch's global optimizer step pre/post hooks. When ``step`` gets a closure (LBFGS,
    Lightning) the phase begins when the closure returns, so the forward and backward the
    closure runs stay phases of their own. The step counter advances at the end of a step
    that followed a forward or backward: optimizers stepped back to back count once.
zero_grad
    ``Optimizer.zero_grad`` and ``Module.zero_grad``.
data
    The gap before the first forward / eval after an optimizer.step or a backward (the next
    batch, or the next micro-batch under gradient accumulation), from the end of that phase
    to the start of the forward. A zero_grad inside the gap nests in it. Sent only when the
    forward is sent and no other phase was sent inside the gap.
manual and automatic phases
    An automatic phase is not sent while a phase of the same kind is open on the same
    thread (forward and eval are one kind), so ``with gpuwatch.phase("forward"): model(x)``
    gives one forward. Otherwise automatic phases nest under whatever manual phase is open.

Where torch has a hook we use it. Two things have none and are wrapped, once and
reversibly (:func:`uninstall` puts the originals back): the start of a backward pass
(autograd's node and tensor hooks fire only when the gradient reaches a tensor we know,
after the loss's own backward, whose logits-sized gradient is often the step's largest
allocation) and ``zero_grad``.
"""

from __future__ import annotations

import atexit
import functools
import os
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any

from . import _api
from ._api import close_span, open_span

_st = _api._state

_OFF = ("0", "off", "false", "no")
"""Values of ``GPUWATCH_AUTO`` that turn the automatic phases off."""

_KIND = {
    "forward": "forward",
    "eval": "forward",
    "backward": "backward",
    "optimizer.step": "optimizer.step",
    "zero_grad": "zero_grad",
}
"""Phase name -> kind, for the rule that one kind never nests in itself."""


class _Auto:
    """Process-wide state of the automatic phases (plain attributes: hooks read them often)."""

    __slots__ = (
        "bw_active",
        "data_last_t",
        "data_sid",
        "fwd_exc0",
        "fwd_name",
        "fwd_sid",
        "gap_id",
        "gap_t",
        "in_closure",
        "root",
        "root_depth",
        "step_depth",
        "step_opt",
        "step_pending",
        "step_sid",
        "trained",
        "work",
        "zg_active",
    )

    def __init__(self) -> None:
        self.root: Any = None  # the module whose outermost call is running
        self.root_depth = 0  # re-entrant calls of the root module inside itself
        self.fwd_sid: int | None = None
        self.fwd_name = "forward"
        self.fwd_exc0: BaseException | None = None
        self.bw_active = False
        self.step_opt: Any = None  # the optimizer whose step is running
        self.step_sid: int | None = None
        self.step_depth = 0  # steps nested in it (super().step(), inner optimizers)
        self.step_pending = False  # step began with a closure: phase starts when it returns
        self.in_closure = 0
        self.zg_active = False
        self.gap_t: int | None = None  # a data gap began here (end of a step or backward)
        self.gap_id = -1  # the id counter's value then: another phase since spoils the gap
        self.data_sid: int | None = None
        self.data_last_t = 0
        self.work = False  # a forward or backward since the step counter last advanced
        self.trained = False  # a training forward has been seen


_A = _Auto()


def _not_compiling() -> bool:
    return False


# torch.compiler.is_compiling once installed. Every hook asks it first: under torch.compile
# dynamo traces the hooks of the modules and optimizers it compiles, folds this to True and
# so traces a hook that does nothing (anything else would break or fail the graph).
_compiling: Callable[[], bool] = _not_compiling

# Set by gpuwatch.instrument._watch while it waits for facts that only a forward or a step
# can tell: called as facts_hook(module, args, kwargs) after a training forward and as
# step_hook(optimizer) before a step. None (one attribute read) once it has them.
facts_hook: Callable[[Any, tuple, dict], None] | None = None
step_hook: Callable[[Any], None] | None = None

# Set by gpuwatch.instrument._watch while it measures activations (the first training
# forward only): called as activations_hook(event, module, output) with event "forward"
# (a root forward begins; module None when grad is disabled), "returned" (it returned
# output), "backward", "step" or "zero_grad" (module None). None once it is over.
activations_hook: Callable[[str, Any, Any], None] | None = None


class _Installed:
    """What :func:`install` changed, so that :func:`uninstall` can undo exactly that."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.torch: Any = None
        self.handles: list[Any] = []  # the optimizer step hooks
        self.global_module: list[Any] = []  # the module hooks of discovery
        self.discovering = False
        self.roots: weakref.WeakSet[Any] = weakref.WeakSet()
        self.hooked: weakref.WeakKeyDictionary[Any, tuple[Any, Any]] = weakref.WeakKeyDictionary()
        self.params: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()
        self.wrapped: list[tuple[Any, str, Any]] = []  # (owner, attribute, original)
        self.atexit = False
        self.registration: Any = None  # the parameter registration hook (notebooks)
        self.built = False  # a parameter was registered since the last cell began


_I = _Installed()


# --------------------------------------------------------------------------- install


def install(*, discover: bool = False) -> bool:
    """Install the process-wide hooks (idempotent); torch must already be imported.

    Args:
        discover: Also watch every module call (global module hooks) to find the models
            by their outermost calls. Used when nobody told us the model (the start-up hook,
            integrations). Once the first optimizer step after a training forward ends, the
            models found so far get hooks of their own and the global hooks are removed, so
            inner module calls cost nothing from then on.

    Returns:
        True when the hooks are in place.
    """
    torch = sys.modules.get("torch")
    if torch is None or os.environ.get("GPUWATCH_AUTO", "").strip().lower() in _OFF:
        return False
    with _I.lock:
        try:
            if _I.torch is None:
                _install_process_hooks(torch)
            if discover and not _I.discovering and not _I.global_module:
                _start_discovery(torch)
        except Exception:
            return False
    return True


def _install_process_hooks(torch: Any) -> None:
    global _compiling
    from torch.optim import optimizer as optim

    try:
        _I.handles.append(optim.register_optimizer_step_pre_hook(_step_pre))
        _I.handles.append(optim.register_optimizer_step_post_hook(_step_post))
        _wrap(torch.autograd, "backward", _wrap_backward)
        _wrap(torch.optim.Optimizer, "zero_grad", _wrap_zero_grad)
        _wrap(torch.nn.Module, "zero_grad", _wrap_zero_grad)
    except Exception:
        _undo()  # all or nothing
        raise
    _I.torch = torch
    _compiling = torch.compiler.is_compiling


def _start_discovery(torch: Any) -> None:
    module = torch.nn.modules.module
    _I.global_module = [
        module.register_module_forward_pre_hook(_fwd_pre),
        module.register_module_forward_hook(_fwd_post, with_kwargs=True, always_call=True),
    ]
    _I.discovering = True


def _end_discovery() -> None:
    """Give each model found its own hooks and drop the global ones (see :func:`install`)."""
    with _I.lock:
        if not _I.discovering:
            return
        _I.discovering = False
        for module in list(_I.roots):
            hook_module(module)
        for handle in _I.global_module:
            handle.remove()
        _I.global_module = []


def hook_module(module: Any, *, compiled_later: bool = False) -> None:
    """Make the outermost calls of ``module`` forward / eval phases (idempotent).

    Args:
        module: The model.
        compiled_later: The module may be wrapped by ``torch.compile`` after this, so that
            its calls run inside compiled code: the hooks are then excluded from tracing
            (one graph break at each end of the forward, instead of no phase at all). This
            imports ``torch._dynamo``, about a second, once.
    """
    if module in _I.hooked:
        return
    pre, post = _fwd_pre, _fwd_post
    if compiled_later:
        try:
            import torch._dynamo

            pre, post = torch._dynamo.disable(pre), torch._dynamo.disable(post)
        except Exception:
            pass
    pre_handle = module.register_forward_pre_hook(pre)
    post_handle = module.register_forward_hook(post, with_kwargs=True, always_call=True)
    _I.hooked[module] = (pre_handle, post_handle)


def covers_all() -> bool:
    """True while discovery watches every module's calls (the zero-code hooks)."""
    return _I.discovering


def covers(module: Any) -> bool:
    """True when the automatic phases see ``module``'s calls (hooked, or discovering)."""
    return _I.discovering or module in _I.hooked


def uninstall() -> None:
    """Remove every hook and put back every wrapped function; forget all state."""
    global _A, _compiling, facts_hook, step_hook, activations_hook
    with _I.lock:
        _undo()
    _A = _Auto()
    facts_hook = step_hook = activations_hook = None
    _compiling = _not_compiling


def _undo() -> None:
    for handle in _I.handles + _I.global_module:
        handle.remove()
    _I.handles, _I.global_module = [], []
    if _I.registration is not None:
        _I.registration.remove()
        _I.registration, _I.built = None, False
    for pre, post in list(_I.hooked.values()):
        pre.remove()
        post.remove()
    _I.hooked = weakref.WeakKeyDictionary()
    for owner, attr, original in reversed(_I.wrapped):
        # Only undo our own wrapper: someone may have wrapped it again since.
        if getattr(owner.__dict__.get(attr), "__gpuwatch_original__", None) is original:
            setattr(owner, attr, original)
    _I.wrapped = []
    _I.discovering = False
    _I.roots = weakref.WeakSet()
    _I.torch = None


def _wrap(owner: Any, attr: str, factory: Callable[[Any], Any]) -> None:
    original = owner.__dict__[attr]
    if getattr(original, "__gpuwatch_original__", None) is not None:
        return  # already ours (a second copy of gpuwatch in the process)
    wrapper = factory(original)
    wrapper.__gpuwatch_original__ = original
    setattr(owner, attr, wrapper)
    _I.wrapped.append((owner, attr, original))


def _after_fork() -> None:
    # A forked child starts between phases whatever the parent was doing.
    global _A
    _A = _Auto()


os.register_at_fork(after_in_child=_after_fork)


# --------------------------------------------------------------------------- helpers


def _suppressed(kind: str) -> bool:
    """True when a phase of this kind is already open on this thread (manual or ours)."""
    return any(_KIND.get(name) == kind for _, name in _st.stack())


def _has_params(module: Any) -> bool:
    known = _I.params.get(module)
    if known is None:
        known = next(module.parameters(), None) is not None
        _I.params[module] = known
    return known


def _arm(end: tuple[int, Any] | None) -> None:
    """A data gap may begin at the end just sent (after a step or a backward)."""
    if end is not None:
        _A.gap_t = end[0]
        _A.gap_id = next(_st.ids)


def _gap_clean() -> int | None:
    """Take an id for a data span; None when another phase was sent inside the gap."""
    probe = next(_st.ids)
    return probe if probe == _A.gap_id + 1 else None


def _end_gap(forward: bool) -> tuple[int | None, Any]:
    """Close the data gap as another phase begins; returns ``(t, figures)`` for that begin.

    Before a forward / eval, a clean gap becomes a data span ending now (begun late unless
    a zero_grad began it) and the forward begins at the same instant with the same figures,
    peaks spent. Otherwise an open data span ends where its zero_grad ended, an armed gap is
    dropped, and the phase reads its own time and figures.
    """
    A = _A
    own = (None, _api._READ)
    sid, A.data_sid = A.data_sid, None
    gap_t, A.gap_t = A.gap_t, None
    if sid is not None:  # begun around a zero_grad; off the stack since that ended
        if not (forward and _gap_clean() is not None):
            close_span(sid, "data", t=A.data_last_t, fig=None)
            return own
    elif gap_t is not None and forward:
        sid = _gap_clean()
        if sid is None:
            return own
        # Begun late, so it carries no figures: it must not count as a boundary.
        open_span("data", t=gap_t, fig=None, sid=sid)
    else:
        return own
    end = close_span(sid, "data")
    if end is None:
        return own
    t, fig = end
    return t, None if fig is None else (*fig[:3], None, None, *fig[5:])


def _reap() -> None:
    """End an optimizer.step whose step raised (torch's post hook runs only on success).

    Called where no step can be running: as a forward, backward or zero_grad begins outside
    a step's closure.
    """
    A = _A
    if A.step_opt is None or A.in_closure:
        return
    sid = A.step_sid
    A.step_opt, A.step_sid, A.step_pending, A.step_depth = None, None, False, 0
    if sid is not None:
        _close_unfinished(sid, "optimizer.step", sys.exc_info()[1])


def _close_unfinished(sid: int, name: str, exc: BaseException | None) -> None:
    if exc is not None:
        close_span(sid, name, exc=exc)
    else:
        close_span(sid, name, error="unfinished")


def _at_exit() -> None:
    """Close what is still open at exit, blaming an uncaught exception if there was one."""
    A = _A
    exc = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
    try:
        if A.step_sid is not None:
            _close_unfinished(A.step_sid, "optimizer.step", exc)
            A.step_sid = A.step_opt = None
        if A.fwd_sid is not None:  # a BaseException skipped the always-called hook
            _close_unfinished(A.fwd_sid, A.fwd_name, exc)
            A.fwd_sid = A.root = None
        if A.data_sid is not None:
            close_span(A.data_sid, "data", t=A.data_last_t, fig=None)
            A.data_sid = None
    except Exception:
        pass


def _opened(sid: int | None) -> int | None:
    # The client registers its own atexit handler on its first event; ours, registered
    # after it, runs before it (atexit is last in, first out) while it can still send.
    if sid is not None and not _I.atexit:
        _I.atexit = True
        atexit.register(_at_exit)
    return sid


# --------------------------------------------------------------------------- forward


def _fwd_pre(module: Any, args: Any) -> None:
    if _compiling():
        return
    A = _A
    if A.root is not None:
        if module is A.root:
            A.root_depth += 1
        return
    if A.bw_active or not _st.enabled:
        return
    try:
        if _has_params(module):
            _forward_begin(module)
    except Exception:
        pass


def _fwd_post(module: Any, args: Any, *rest: Any) -> None:
    # (module, args, kwargs, output) normally; torch calls a global always-call hook
    # without kwargs when forward raised.
    if _compiling():
        return
    A = _A
    if module is not A.root:
        return
    if A.root_depth:
        A.root_depth -= 1
        return
    try:
        _forward_end(module, args, rest[0] if len(rest) == 2 else {}, rest[-1] if rest else None)
    except Exception:
        A.root = None
        A.fwd_sid = None


def _forward_begin(module: Any) -> None:
    A = _A
    A.root = module
    A.root_depth = 0
    A.fwd_sid = None
    if _I.discovering:
        _I.roots.add(module)
    grad = _I.torch.is_grad_enabled()
    name = "forward" if grad else "eval"
    A.fwd_name = name
    A.fwd_exc0 = sys.exc_info()[1]
    _reap()
    if grad:
        A.work = A.trained = True
    meter = activations_hook
    if meter is not None:
        meter("forward", module if grad else None, None)
    if _suppressed("forward"):
        _end_gap(False)
        return
    t, fig = _end_gap(True)
    A.fwd_sid = _opened(open_span(name, t=t, fig=fig))


def _forward_end(module: Any, args: Any, kwargs: Any, output: Any = None) -> None:
    A = _A
    A.root = None
    sid, A.fwd_sid = A.fwd_sid, None
    exc0, A.fwd_exc0 = A.fwd_exc0, None  # hold no traceback (and its tensors) past here
    if sid is not None:
        exc = sys.exc_info()[1]
        close_span(sid, A.fwd_name, exc=None if exc is exc0 else exc)
    meter = activations_hook
    if meter is not None:
        meter("returned", module, output)
    hook = facts_hook
    if hook is not None and A.fwd_name == "forward":
        hook(module, args, kwargs)


# --------------------------------------------------------------------------- backward


def _backward_begin() -> int | None:
    _reap()
    if _suppressed("backward"):
        _end_gap(False)
        return None
    _end_gap(False)
    return _opened(open_span("backward"))


def _wrap_backward(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def backward(*args: Any, **kwargs: Any) -> Any:
        A = _A
        if A.bw_active or not _st.enabled or _compiling():
            return original(*args, **kwargs)
        A.bw_active = True
        sid = None
        meter = activations_hook
        try:
            if meter is not None:
                meter("backward", None, None)
            sid = _backward_begin()
        except Exception:
            pass
        try:
            result = original(*args, **kwargs)
        except BaseException as exc:
            A.bw_active = False
            if sid is not None:
                close_span(sid, "backward", exc=exc)
            raise
        A.bw_active = False
        A.work = True
        if sid is not None:
            _arm(close_span(sid, "backward"))
        return result

    return backward


# --------------------------------------------------------------------------- optimizer


def _step_pre(optimizer: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
    if _compiling():
        return None
    A = _A
    if A.step_opt is not None:
        # A step inside a step: a subclass's step calling super().step(), or a wrapping
        # optimizer stepping its inner one. Part of the outer step.
        A.step_depth += 1
        return None
    try:
        meter = activations_hook
        if meter is not None:
            meter("step", None, None)
        hook = step_hook
        if hook is not None:
            hook(optimizer)
        A.step_opt = optimizer
        A.step_sid = None
        if not _st.enabled or _suppressed("optimizer.step"):
            _end_gap(False)
            return None
        closure = kwargs["closure"] if "closure" in kwargs else (args[1] if len(args) > 1 else None)
        if closure is None:
            _step_begin()
            return None
        A.step_pending = True
        wrapped = _closure_then_step(closure)
        if "closure" in kwargs:
            return args, {**kwargs, "closure": wrapped}
        return (args[0], wrapped, *args[2:]), kwargs
    except Exception:
        return None


def _step_begin() -> None:
    _end_gap(False)
    _A.step_sid = _opened(open_span("optimizer.step"))


def _closure_then_step(closure: Callable[..., Any]) -> Callable[..., Any]:
    """The closure, then the optimizer.step phase begins (the first time it returns)."""

    @functools.wraps(closure)
    def closure_then_step(*args: Any, **kwargs: Any) -> Any:
        A = _A
        A.in_closure += 1
        try:
            result = closure(*args, **kwargs)
        finally:
            A.in_closure -= 1
        if A.step_pending and not A.in_closure:
            A.step_pending = False
            try:
                _step_begin()
            except Exception:
                pass
        return result

    return closure_then_step


def _step_post(optimizer: Any, args: tuple, kwargs: dict) -> None:
    if _compiling():
        return
    A = _A
    if A.step_opt is None:
        return
    if A.step_depth:
        A.step_depth -= 1
        return
    try:
        sid = A.step_sid
        A.step_opt, A.step_sid, A.step_pending = None, None, False
        if _I.discovering and A.trained:
            _end_discovery()
        if sid is None:
            return
        end = close_span(sid, "optimizer.step")
        if A.work:
            _st.step += 1
            A.work = False
        _arm(end)
    except Exception:
        pass


# --------------------------------------------------------------------------- cells


def cell_begins() -> bool:
    """A notebook cell begins: models built since discovery ended are looked for again.

    Under the zero-code hooks, discovery ends at the first optimizer step; a notebook's
    re-run model cell builds a new model after that, whose first training forward must be
    found again (see :func:`watch_new_models`).

    Returns:
        True when discovery starts again for this cell.
    """
    try:
        built, _I.built = _I.built, False  # models built while discovering are found
        if built and not _I.discovering and _I.torch is not None:
            with _I.lock:
                if not _I.global_module:
                    _start_discovery(_I.torch)
                    return True
    except Exception:
        pass
    return False


def cell_ends() -> None:
    """A notebook cell ended: nothing gpuwatch opened stays open past it.

    The time a person spends between cells is idle, never a ``data`` phase; a forward left
    open ends unfinished; the activations measurement (its saved-tensor hooks and dispatch
    mode) ends now, so no other cell runs under it or is charged to the forward.
    """
    A = _A
    try:
        _reap()
        if A.fwd_sid is not None:
            _close_unfinished(A.fwd_sid, A.fwd_name, None)
            A.fwd_sid = A.root = None
            A.root_depth = 0
        if A.data_sid is not None:
            close_span(A.data_sid, "data", t=A.data_last_t, fig=None)
            A.data_sid = None
        A.gap_t = None
        meter = activations_hook
        if meter is not None:
            meter("cell", None, None)
    except Exception:
        pass


def watch_new_models() -> bool:
    """Notice models built from now on (a parameter registered on a module), so that
    :func:`cell_begins` looks for them. True when the hook is in place."""
    torch = _I.torch
    if torch is None:
        return False
    if _I.registration is not None:
        return True

    def built(module: Any, name: str, param: Any) -> None:
        _I.built = True

    try:
        hook = torch.nn.modules.module.register_module_parameter_registration_hook
        _I.registration = hook(built)
    except Exception:
        return False
    return True


# --------------------------------------------------------------------------- zero_grad


def _zero_grad_begin() -> int | None:
    A = _A
    _reap()
    if _suppressed("zero_grad"):
        _end_gap(False)
        return None
    if A.gap_t is not None or A.data_sid is not None:
        # zero_grad between steps: the data gap holds it. The data span sits on the stack
        # only while a zero_grad runs, so nothing else ever nests in it.
        sid = _gap_clean()
        if sid is None:
            _end_gap(False)
        elif A.data_sid is None:
            A.data_sid = open_span("data", t=A.gap_t, fig=None, sid=sid)
            A.gap_t = None
        else:
            _st.stack().append((A.data_sid, "data"))
    return _opened(open_span("zero_grad"))


def _zero_grad_end(sid: int, exc: BaseException | None) -> None:
    A = _A
    end = close_span(sid, "zero_grad", exc=exc)
    if A.data_sid is not None:
        stack = _st.stack()
        if stack and stack[-1][0] == A.data_sid:
            stack.pop()
        if end is not None:
            A.data_last_t = end[0]
        A.gap_id = next(_st.ids)


def _wrap_zero_grad(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def zero_grad(self: Any, *args: Any, **kwargs: Any) -> Any:
        A = _A
        if A.zg_active or not _st.enabled or _compiling():
            return original(self, *args, **kwargs)
        A.zg_active = True
        sid = None
        try:
            meter = activations_hook
            if meter is not None:
                meter("zero_grad", None, None)
            sid = _zero_grad_begin()
        except Exception:
            pass
        try:
            result = original(self, *args, **kwargs)
        except BaseException as exc:
            A.zg_active = False
            if sid is not None:
                _zero_grad_end(sid, exc)
            raise
        A.zg_active = False
        if sid is not None:
            _zero_grad_end(sid, None)
        return result

    return zero_grad

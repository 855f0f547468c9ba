"""Activations measured: what autograd saves during the first training forward, once.

While the first training forward of the described model runs (and until its backward
begins, so that a loss computed outside the model counts too), a saved-tensor pack hook
(``torch.autograd.graph.saved_tensors_hooks``) sees every tensor autograd keeps for
backward. It counts unique storages, leaving out parameters and buffers (they are
weights), and attributes each to the module running when it was saved: the model's
top-level children, with containers (``ModuleList``, ``ModuleDict``) opened, so a
transformer's layers are counted one by one. The pack hook returns ``tensor.detach()``,
which autograd stores in place of the tensor (the documented way: same storage, no
reference cycle), so the model computes exactly what it computes without us. While the
model's own ``forward`` runs, a dispatch mode (``_peak``) keeps the running peak of the
storages its ops make, temporaries nothing saves included. Once the measurement ends
every hook and the mode are removed: later steps run no gpuwatch code at all.

Other users of saved-tensor hooks: torch applies only the innermost pair.

- Hooks already active when the measurement would start (``save_on_cpu`` around the
  training step, the user's own): ours chain to them: each tensor is counted, then handed
  to their pack hook, and their unpack hook gets it back. What their pack hook returns
  decides where the tensor is counted: the same storage stays on the device (``bytes``),
  a tensor elsewhere is ``offloaded_bytes``, anything else (a handle) ``opaque_bytes``.
- Hooks pushed inside the forward (non-reentrant activation checkpointing, offloading of
  one block) are innermost there, so ours do not see what they pack: the tensors they
  drop or move are not counted, which is right for device memory. What the checkpoint
  keeps (its inputs) is saved outside its hooks and counted.
- Reentrant checkpointing runs its region without grad and saves its inputs: counted.
- ``torch.compile``: a compiled model is not measured (``skipped``), and neither is a
  forward while dynamo traces.

torch is imported by the caller (``_auto``); this module imports nothing heavy.
"""

from __future__ import annotations

import os
import sys
import threading
import weakref
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from types import FrameType

MAX_MODULES = 256
"""Module entries kept in the facts; later ones are folded into ``(other)``."""

MAX_INNER = 32
"""Direct children of a counted module watched for a checkpoint of its ``forward``."""

_CONTAINERS = ("ModuleList", "ModuleDict", "Sequential")
"""Module classes whose children are counted one by one (``Sequential`` only chains them)."""

_VIEWS = frozenset(
    ("TBackward0", "TransposeBackward0", "PermuteBackward0", "ViewBackward0", "AliasBackward0")
)
"""Autograd nodes of views: a saved view of a weight's autocast copy is that copy."""

MODEL = "(model)"
"""Saved by the model's own ``forward`` body, outside any child module."""

OUTSIDE = "(outside)"
"""Saved after the model returned and before backward began (the loss, usually)."""


def _local(t: Any) -> Any:
    """A DTensor's local shard (what this rank holds; a DTensor has no storage), else ``t``."""
    inner = getattr(t, "_local_tensor", None)
    return t if inner is None else inner


def _nbytes(t: Any) -> int:
    t = _local(t)
    return int(t.numel()) * int(t.element_size())


def _is_param(torch: Any, t: Any) -> bool:
    """A parameter, or a view of one (``linear`` saves ``weight.t()``): FSDP's unsharded
    parameters and FSDP1's flat parameter views appear only during forward, after the
    measurement listed the model's parameters; they are weights, not activations."""
    param = torch.nn.Parameter
    return isinstance(t, param) or isinstance(t._base, param)


def _tensors(obj: Any, depth: int = 0) -> list[Any]:
    """Tensors in a module's output (a tensor, a tuple or list, a dict / ModelOutput)."""
    import torch

    if isinstance(obj, torch.Tensor):
        return [obj]
    if depth > 2:
        return []
    if isinstance(obj, (tuple, list)):
        return [t for o in obj[:64] for t in _tensors(o, depth + 1)]
    if isinstance(obj, dict):
        return [t for o in list(obj.values())[:64] for t in _tensors(o, depth + 1)]
    return []


def _held_tensors(obj: Any, budget: int = 512, depth: int = 6) -> list[Any]:
    """Tensors the model's returned object keeps alive: :func:`_tensors`, and also inside
    plain objects' attributes (a ``ModelOutput``'s cache object holds its layers' keys and
    values, an encoder-decoder's the encoder's too). Reads ``__dict__`` only (no property
    runs), skips modules, and stops after ``budget`` objects."""
    import torch

    out: list[Any] = []
    seen: set[int] = set()
    todo: list[tuple[Any, int]] = [(obj, 0)]
    while todo and budget > 0:
        o, d = todo.pop()
        if id(o) in seen:
            continue
        seen.add(id(o))
        budget -= 1
        if isinstance(o, torch.Tensor):
            out.append(o)
            continue
        if d >= depth or isinstance(o, (str, bytes, int, float, type, torch.nn.Module)):
            continue
        if isinstance(o, (tuple, list)):
            items = list(o[:64])
        elif isinstance(o, dict):
            items = list(o.values())[:64]
        else:
            attrs = getattr(o, "__dict__", None)
            items = list(attrs.values())[:64] if isinstance(attrs, dict) else []
        todo.extend((i, d + 1) for i in items)
    return out


class _Entry:
    """What one module saved."""

    __slots__ = (
        "amp",
        "bytes",
        "calls",
        "grad_out",
        "last",
        "max_tensor",
        "out_bytes",
        "recompute",
        "recomputed",
        "tensors",
    )

    def __init__(self, order: int) -> None:
        self.bytes = self.tensors = self.max_tensor = self.out_bytes = self.calls = 0
        self.amp = 0
        self.recomputed = False  # ran under activation checkpointing
        self.recompute = 0  # what its checkpoint's pack hook got: recreated in backward
        # Whether an output tensor required grad (backward reaches the module); None
        # while no output tensor was seen (an object _tensors does not open).
        self.grad_out: bool | None = None
        self.last = order  # when it last saved (or appeared): backward frees in reverse


_DYNAMO = os.sep + os.path.join("torch", "_dynamo") + os.sep
_OUR_HOOKS = os.path.join("gpuwatch", "instrument", "_auto.py")


def _under_dynamo(limit: int = 64) -> bool:
    """True when torch.compile's frame evaluation is among our callers: the model was
    compiled after :func:`gpuwatch.watch` (or a compiled function calls it), and our hook
    runs from inside that compiled call. The one dynamo frame that only disables dynamo
    for the phases' own hooks (``_auto.hook_module(compiled_later=True)``) does not count:
    it is the dynamo frame that calls straight into ``_auto``. Walked once, at the start
    of the measurement.

    Only code objects are read, never ``frame.f_locals``: on Python 3.11 and older that
    stores a snapshot of the frame's locals on the frame, and the training loop's frame
    would keep its first batch alive until the loop returned.
    """
    caller = sys._getframe(1)
    inner = caller.f_code.co_filename
    frame: FrameType | None = caller
    for _ in range(limit):
        if frame is None:
            return False
        filename = frame.f_code.co_filename
        if _DYNAMO in filename and not inner.endswith(_OUR_HOOKS):
            return True
        inner = filename
        frame = frame.f_back
    return False


def skip_reason(torch: Any, model: Any) -> str | None:
    """Why the forward of ``model`` cannot be measured now, or None when it can.

    Compiled models are not measured: our module hooks would run inside the compiled
    code, where tracing them breaks the graph and changes what is compiled.
    """
    if type(model).__name__ == "OptimizedModule" or getattr(model, "_compiled_call_impl", None):
        return "torch.compile"
    try:
        if torch.compiler.is_compiling() or _under_dynamo():
            return "torch.compile"
        if not torch._C._autograd._saved_tensors_hooks_is_enabled():
            return "saved-tensor hooks disabled"
    except Exception:
        return "saved-tensor hooks unavailable"
    return None


class Meter:
    """Counts what autograd saves from :meth:`start` to :meth:`stop`, on one thread.

    Args:
        torch: The torch module.
        model: The model whose forward is measured (wrappers already removed).
    """

    def __init__(self, torch: Any, model: Any, loss_span: bool = False) -> None:
        self.torch = torch
        self.model_ref = weakref.ref(model)
        # Count the forward's peak through a loss computed after the model returned, too:
        # only where the automatic phases tell us backward begins before it runs (the
        # mode is popped then), never into backward's engine.
        self.loss_span = loss_span
        self.thread = threading.get_ident()
        self.active = False
        self.done = False
        self.pushed = False
        self.user_pack: Any = None
        self.user_unpack: Any = None
        self.outside = False  # the model's forward has returned
        self.stack: list[str] = []
        self.entries: dict[str, _Entry] = {}
        self.order = 0  # a counter of saves, to order the modules as backward meets them
        self.seen: dict[tuple[int, str], Any] = {}  # storage -> weak reference
        self.exclude: set[tuple[int, str]] = set()  # parameter and buffer storages
        self.param_shapes: set[tuple[int, ...]] = set()
        self.handles: list[Any] = []
        self.totals = {"bytes": 0, "tensors": 0, "amp": 0, "offloaded": 0, "opaque": 0}
        self.stopped_by = ""
        self.error: str | None = None
        self.outputs: list[tuple[Any, int, tuple[int, str]]] = []  # (weak storage, bytes, key)
        self.held = 0
        self.loss_outside = False  # the model returned logits and no loss
        self.held_refs: list[tuple[Any, int]] = []  # the outputs counted in ``held``
        self.chains: list[tuple[int, Any]] = []  # counting packs pushed over a checkpoint's
        self.peak: Any = None  # the forward's running peak (_peak.Peak) while it runs
        self.peak_hook: Any = None
        self.forward_peak: dict[str, Any] | None = None
        self.loss_counting = False  # the peak counts the loss after the model returned
        self.loss_peak: dict[str, Any] | None = None

    # ------------------------------------------------------------------ control

    def start(self) -> bool:
        """Install the pack hook and the module hooks; False (nothing installed) on failure."""
        torch = self.torch
        model = self.model_ref()
        if model is None:
            return False
        try:
            for t in (*model.parameters(), *model.buffers()):
                self.exclude.add(self._key(_local(t)))
                self.param_shapes.add(tuple(t.shape))
            top = torch._C._autograd._top_saved_tensors_default_hooks(False)
            if top is not None:
                self.user_pack, self.user_unpack = top
            for name, child in self._children(model):
                pre = child.register_forward_pre_hook(self._pre(name))
                post = child.register_forward_hook(self._post(name), always_call=True)
                self.handles += [pre, post]
                for inner in list(child.children())[:MAX_INNER]:
                    self.handles += [
                        inner.register_forward_pre_hook(self._inner_pre(name)),
                        inner.register_forward_hook(self._inner_post, always_call=True),
                    ]
            torch._C._autograd._push_saved_tensors_default_hooks(self._pack, self._unpack)
            self.pushed = True
            self.active = True
        except Exception as exc:
            self.error = f"{type(exc).__name__}: {str(exc)[:80]}"
            self._remove_module_hooks()
            return False
        self._start_peak(model)
        return True

    def _start_peak(self, model: Any) -> None:
        """Watch the forward's working set too (``_peak``), where it can be watched."""
        from . import _peak

        try:
            if _peak.usable(self.torch, model) is not None:
                return
            first = next(iter(model.parameters()), None)
            device = first.device.type if first is not None else "cpu"
            totals = self.totals
            peak = _peak.Peak(self.torch, device, lambda: (totals["bytes"], totals["amp"]))
            if peak.start():
                self.peak = peak
                # Popped by the model's first forward hook: inside any pair of the user's
                # hooks that push a mode before the forward and pop it after (a pop pops
                # whatever is on top), whichever registered first.
                self.peak_hook = model.register_forward_hook(
                    self._peak_returned, prepend=True, always_call=True
                )
            elif peak.error:
                self.error = peak.error
        except Exception as exc:
            self.error = f"{type(exc).__name__}: {str(exc)[:80]}"

    def model_returned(self, output: Any = None) -> None:
        """The model's outermost forward returned ``output``: what is saved next is outside
        it, and whether the caller still holds the output when backward begins is seen.

        With :attr:`loss_span` the forward's peak goes on counting through the loss
        computed outside the model (nanoGPT's shift ``logits[:, :-1].flatten(0, 1)``
        copies the logits once more) until backward begins."""
        self.outside = True
        peak = self.peak
        resumed = (
            self.loss_span
            and peak is not None
            and peak.on
            and peak.mode is None
            and threading.get_ident() == self.thread
            and peak.resume()
        )
        if not resumed:
            # Nothing counts the loss (a user's mode is on top): no loss peak to report.
            self.loss_counting = False
            self._stop_peak()
        try:
            # A Hugging Face output with logits and no loss: the loop computes it outside.
            logits = getattr(output, "logits", None)
            self.loss_outside = logits is not None and getattr(output, "loss", 0) is None
            for t in _held_tensors(output):
                st = t.untyped_storage()
                key = (int(st._cdata), str(t.device))
                self.outputs.append((weakref.ref(st), int(st.nbytes()), key))
        except Exception:
            self.outputs = []
        self.stack.clear()
        self._remove_module_hooks()

    def stop(self, why: str) -> bool:
        """End the measurement (idempotent). Must run on the thread that started it.

        Returns:
            False when called from another thread: the hooks stay (counting nothing)
            until :meth:`stop` runs on the right thread.
        """
        if self.done:
            return True
        self._end_count(why)
        if threading.get_ident() != self.thread:
            return False
        self._stop_peak(final=True)
        self.done = True
        if self.pushed:
            self.pushed = False
            try:
                top = self.torch._C._autograd._top_saved_tensors_default_hooks(False)
                if top is not None and top[0] == self._pack:
                    self.torch._C._autograd._pop_saved_tensors_default_hooks()
                else:
                    # Someone pushed hooks after ours and has not popped them: popping
                    # now would remove theirs. Ours stay below, passing tensors through.
                    self.error = "saved-tensor hooks pushed over ours were left in place"
            except Exception as exc:
                self.error = f"{type(exc).__name__}: {str(exc)[:80]}"
        self.seen.clear()
        return True

    def _end_count(self, why: str) -> None:
        """Stop counting (idempotent): say why, and measure the outputs still held."""
        self.active = False
        if self.stopped_by:
            return
        self.stopped_by = why
        self._remove_module_hooks()
        self._close_peak()  # its mode is popped on the begin thread (stop)
        # The model's outputs still referenced now (the loop holds ``logits``) and not
        # kept by autograd: alive through backward and the step, until the next forward.
        seen: set[tuple[int, str]] = set()
        for ref, n, key in self.outputs:
            # A key counted as saved belongs to this storage only while that one lives:
            # a freed storage's address is reused (checkpointing frees what it saved).
            saved = self.seen.get(key)
            if ref() is not None and key not in seen and (saved is None or saved() is None):
                seen.add(key)
                self.held += n
                self.held_refs.append((ref, n))
        self.outputs = []

    def held_now(self) -> int:
        """Of the outputs counted in ``held``, the bytes still referenced now: a loop that
        drops them after backward (``del logits``) does not hold them through the step."""
        return sum(n for ref, n in self.held_refs if ref() is not None)

    def _close_peak(self) -> Any:
        """Stop the forward's peak counting and keep its figures (idempotent)."""
        peak = self.peak
        if peak is not None:
            if self.forward_peak is None and peak.on and peak.error is None:
                self.forward_peak = peak.facts()
            elif self.loss_counting and peak.on and peak.error is None:
                self.loss_peak = {k: v for k, v in peak.facts().items() if k != "at"}
            self.loss_counting = False
            peak.on = False
        return peak

    def _peak_returned(self, module: Any, args: Any, output: Any) -> None:
        try:
            peak = self.peak
            if self.loss_span and peak is not None and peak.on and peak.pause():
                # Popped, still counting: the model's own peak is kept, and the loss
                # (model_returned resumes it) gets a peak of its own, from here.
                if self.forward_peak is None and peak.error is None:
                    self.forward_peak = peak.facts()
                peak.restart_max()
                self.loss_counting = True
                return
            self._stop_peak()
        except Exception as exc:
            self.error = f"{type(exc).__name__}: {str(exc)[:80]}"

    def _stop_peak(self, final: bool = False) -> None:
        """End the forward's peak (the model returned, or the measurement ended) and pop
        its mode (on the begin thread), unless a mode pushed over it is still there: then
        the final call (:meth:`stop`) tries again, and if it is still covered leaves it,
        passing ops on."""
        peak = self._close_peak()
        if threading.get_ident() != self.thread:
            return
        if final:
            # Only here, never from a hook: a forward that raised runs its always-called
            # hooks straight from the module's dict, which a removal would mutate.
            hook, self.peak_hook = self.peak_hook, None
            if hook is not None:
                hook.remove()
        if peak is None:
            return
        if peak.error:
            self.error = peak.error
        try:
            popped = peak.stop()
        except Exception as exc:
            popped = False
            self.error = f"{type(exc).__name__}: {str(exc)[:80]}"
        if popped or final:
            self.peak = None
        if not popped and final:
            self.error = "a dispatch mode pushed over ours was left in place"

    def _remove_module_hooks(self) -> None:
        handles, self.handles = self.handles, []
        for h in handles:
            try:
                h.remove()
            except Exception:
                pass

    # ------------------------------------------------------------------ hooks

    def _children(self, model: Any) -> list[tuple[str, Any]]:
        """The modules to count by: top-level children with containers opened
        (``layers.0``, ``layers.1``, ...), and the elements of the longest list of
        same-class modules wherever it is (``bert.encoder.layer.0``, ...): the layers.
        Saves go to the innermost of them running."""
        out: list[tuple[str, Any]] = []
        todo = list(model.named_children())
        while todo and len(out) < MAX_MODULES:
            name, mod = todo.pop(0)
            if type(mod).__name__ in _CONTAINERS:
                todo[:0] = [(f"{name}.{n}", m) for n, m in mod.named_children()]
            else:
                out.append((name, mod))
        best: tuple[str, Any] | None = None
        for name, mod in model.named_modules():
            if type(mod).__name__ in _CONTAINERS and len(mod) > 1:
                kinds = {type(m) for m in mod.children()}
                if len(kinds) == 1 and (best is None or len(mod) > len(best[1])):
                    best = (name, mod)
        if best is not None:
            have = {id(m) for _, m in out}
            for n, m in best[1].named_children():
                if id(m) not in have and len(out) < MAX_MODULES:
                    out.append((f"{best[0]}.{n}", m))
        return out

    def _pre(self, name: str) -> Any:
        def pre(module: Any, args: Any) -> None:
            if not self.active:
                return
            self.stack.append(name)
            try:
                # Under activation checkpointing a module runs without grad (reentrant) or
                # under the checkpoint's own saved-tensor hooks (non-reentrant): backward
                # will recompute it.
                autograd = self.torch._C._autograd
                top = autograd._top_saved_tensors_default_hooks(False)
                if not self.torch.is_grad_enabled() or (top is not None and top[0] != self._pack):
                    self._entry(name).recomputed = True
                    if top is not None and not getattr(top[0], "_gpuwatch_chain", False):
                        self._chain(name, module, *top)
            except Exception:
                pass

        return pre

    def _inner_pre(self, name: str) -> Any:
        """On a counted module's direct children: a checkpoint of the module's ``forward``
        (transformers 5 checkpoints ``forward``, not ``__call__``, so the module's own
        hooks run outside it) is on top when they run."""

        def pre(module: Any, args: Any) -> None:
            if not self.active:
                return
            try:
                top = self.torch._C._autograd._top_saved_tensors_default_hooks(False)
                if top is None or top[0] == self._pack or getattr(top[0], "_gpuwatch_chain", 0):
                    return
                if self.torch.is_grad_enabled():
                    self._entry(name).recomputed = True
                    self._chain(name, module, *top)
            except Exception:
                pass

        return pre

    def _inner_post(self, module: Any, args: Any, output: Any) -> None:
        try:
            self._unchain(module)
        except Exception as exc:
            self.error = f"{type(exc).__name__}: {str(exc)[:80]}"

    def _chain(self, name: str, module: Any, their_pack: Any, their_unpack: Any) -> None:
        """Count what a non-reentrant checkpoint's pack hook gets while ``name`` runs:
        exactly the tensors its recomputation recreates in backward. Each tensor goes on
        to their pack unchanged, and their unpack is the one autograd keeps."""

        def pack(t: Any) -> Any:
            if self.active:
                try:
                    self._count_recompute(name, t)
                except Exception:
                    pass
            return their_pack(t)

        # A mark on the function object (functions declare no attributes to mypy).
        pack._gpuwatch_chain = True  # type: ignore[attr-defined]
        self.torch._C._autograd._push_saved_tensors_default_hooks(pack, their_unpack)
        self.chains.append((id(module), pack))

    def _unchain(self, module: Any) -> None:
        """Pop the counting pack ``module``'s call pushed (its post hook: always runs)."""
        if not self.chains or self.chains[-1][0] != id(module):
            return
        _, pack = self.chains.pop()
        autograd = self.torch._C._autograd
        top = autograd._top_saved_tensors_default_hooks(False)
        if top is not None and top[0] is pack:
            autograd._pop_saved_tensors_default_hooks()
        else:  # someone pushed over it and left theirs: popping would remove theirs
            self.error = "saved-tensor hooks pushed over ours were left in place"

    def _count_recompute(self, name: str, t: Any) -> None:
        st = t.untyped_storage()
        key = (int(st._cdata), str(t.device))
        if key in self.exclude:
            return
        ref = self.seen.get(key)
        if ref is not None and ref() is not None:
            return  # kept anyway (the checkpoint's inputs), or already counted
        self.seen[key] = weakref.ref(st)
        self._entry(name).recompute += int(st.nbytes())

    def _post(self, name: str) -> Any:
        def post(module: Any, args: Any, output: Any) -> None:
            try:
                self._unchain(module)
            except Exception as exc:
                self.error = f"{type(exc).__name__}: {str(exc)[:80]}"
            if not self.active:
                return
            if self.stack and self.stack[-1] == name:
                self.stack.pop()
            try:
                entry = self._entry(name)
                entry.calls += 1
                outs = _tensors(output)
                size = sum(_nbytes(t) for t in outs)
                entry.out_bytes = max(entry.out_bytes, size)
                if outs:
                    entry.grad_out = bool(entry.grad_out) or any(t.requires_grad for t in outs)
            except Exception:
                pass

        return post

    def _entry(self, name: str) -> _Entry:
        entry = self.entries.get(name)
        if entry is None:
            if len(self.entries) >= MAX_MODULES:
                name = "(other)"
                entry = self.entries.get(name)
            if entry is None:
                entry = self.entries[name] = _Entry(self.order)
        return entry

    @staticmethod
    def _key(t: Any) -> tuple[int, str]:
        st = t.untyped_storage()
        return (int(st._cdata), str(t.device))

    def _pack(self, t: Any) -> Any:
        packed = t.detach() if self.user_pack is None else self.user_pack(t)
        if self.active:
            try:
                self._count(t, packed)
            except Exception as exc:  # never into training: stop counting, say why
                self.error = f"{type(exc).__name__}: {str(exc)[:80]}"
                self.active = False
        return packed

    def _unpack(self, packed: Any) -> Any:
        if self.active:
            # A backward began, whoever called it (``torch.autograd.grad`` too): the count
            # ends here. The hooks cannot be popped from inside backward (the engine runs
            # on a copy of the forward's thread-local state): the next event outside it
            # (an optimizer step, the next forward) calls stop().
            self._end_count("backward")
        if self.user_unpack is not None:
            return self.user_unpack(packed)
        return packed

    def _count(self, t: Any, packed: Any) -> None:
        if _is_param(self.torch, t):
            return
        t = _local(t)
        st = t.untyped_storage()
        n = int(st.nbytes())
        if n == 0:
            return
        key = (int(st._cdata), str(t.device))
        if key in self.exclude:
            return
        ref = self.seen.get(key)
        if ref is not None and ref() is not None:
            return  # a storage already counted (a view of it, or saved twice)
        self.seen[key] = weakref.ref(st)
        name = OUTSIDE if self.outside else (self.stack[-1] if self.stack else MODEL)
        entry = self._entry(name)
        if self.user_pack is not None:
            where = _where(self.torch, t, packed)
            if where != "kept":
                self.totals[where] += n
                return
        if self._amp_copy(t):
            entry.amp += n
            self.totals["amp"] += n
            return
        self.order += 1
        entry.last = self.order
        entry.bytes += n
        entry.tensors += 1
        entry.max_tensor = max(entry.max_tensor, n)
        self.totals["bytes"] += n
        self.totals["tensors"] += 1

    def _amp_copy(self, t: Any) -> bool:
        """An autocast copy of a weight: a cast of a leaf parameter (maybe seen through a
        transpose: ``linear`` keeps ``weight.t()``), or (frozen weights) a leaf in the
        autocast dtype with a parameter's shape."""
        fn = t.grad_fn
        for _ in range(4):
            if fn is None or type(fn).__name__ not in _VIEWS:
                break
            nxt = fn.next_functions
            fn = nxt[0][0] if nxt else None
            if fn is None:
                return False
        if fn is not None:
            if type(fn).__name__ != "ToCopyBackward0":
                return False
            nxt = fn.next_functions
            leaf = nxt[0][0] if nxt else None
            return leaf is not None and type(leaf).__name__ == "AccumulateGrad"
        leaf = t if t._base is None else t._base  # linear keeps weight.t(): a view
        if leaf.requires_grad or tuple(leaf.shape) not in self.param_shapes:
            return False
        torch = self.torch
        dev = t.device.type
        try:
            return torch.is_autocast_enabled(dev) and t.dtype == torch.get_autocast_dtype(dev)
        except Exception:
            return False

    # ------------------------------------------------------------------ result

    def facts(self) -> dict[str, Any]:
        """The ``activations`` facts (``docs/facts.md``)."""
        model = self.model_ref()
        grads = _grad_bytes(model, self.entries) if model is not None else {}
        modules = []
        for name, e in sorted(self.entries.items(), key=lambda kv: kv[1].last):
            if not (e.bytes or e.amp or e.out_bytes or grads.get(name)):
                continue
            modules.append(
                {
                    "name": name[:128],
                    "bytes": e.bytes,
                    "tensors": e.tensors,
                    "max_tensor_bytes": e.max_tensor,
                    "amp_copy_bytes": e.amp,
                    "out_bytes": e.out_bytes,
                    "grad_bytes": grads.get(name, 0),
                    **({"recomputed": True} if e.recomputed else {}),
                    # Under checkpointing its outputs may need no grad in forward and
                    # still be recomputed in backward.
                    **({"no_backward": True} if e.grad_out is False and not e.recomputed else {}),
                    **({"recompute_bytes": e.recompute} if e.recompute else {}),
                }
            )
        out: dict[str, Any] = {
            "source": "measured",
            "bytes": self.totals["bytes"],
            "tensors": self.totals["tensors"],
            "amp_copy_bytes": self.totals["amp"],
            "offloaded_bytes": self.totals["offloaded"],
            "opaque_bytes": self.totals["opaque"],
            "user_hooks": self.user_pack is not None,
            "until": self.stopped_by or "running",
            "held_output_bytes": self.held,
            **({"loss_outside": True} if self.loss_outside else {}),
            "modules": modules,
        }
        if self.forward_peak is not None:
            out["forward_peak"] = self.forward_peak
        if self.loss_peak is not None:
            out["loss_peak"] = self.loss_peak
        if self.error:
            out["error"] = self.error
        return out


def _where(torch: Any, t: Any, packed: Any) -> str:
    """Where the user's pack hook put ``t``: ``kept`` on its device, ``offloaded`` to
    another device, or ``opaque`` (a handle: checkpointing, a custom store)."""
    if not isinstance(packed, torch.Tensor):
        return "opaque"
    if packed.device != t.device:
        return "offloaded"
    return "kept"


def _grad_bytes(model: Any, entries: dict[str, _Entry]) -> dict[str, int]:
    """Gradient bytes of each measured module's trainable parameters (shared ones once),
    each parameter with the innermost measured module that holds it: a model's layers
    (``bert.encoder.layer.0``) are measured inside a top-level child (``bert``), and their
    gradients appear during their own backward, not all at once at the child's."""
    out: dict[str, int] = {}
    seen: set[int] = set()
    modules = dict(model.named_modules())
    for name in sorted(entries, key=lambda n: -n.count(".")):
        mod = modules.get(name)
        if mod is None:
            continue
        total = 0
        for p in mod.parameters():
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                total += _nbytes(p)
        out[name] = total
    rest = sum(_nbytes(p) for p in model.parameters() if p.requires_grad and id(p) not in seen)
    if rest:
        out[MODEL] = out.get(MODEL, 0) + rest
    return out

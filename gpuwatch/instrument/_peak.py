"""The forward's working set, measured: a running peak of the storages its ops make.

What autograd saves is what a training forward leaves alive, not its peak: every op's
output that nothing saves (a frozen layer's ``gelu_new`` makes five temporaries and saves
none; a ``no_grad`` region saves nothing at all) comes and goes unseen by the pack hook.
While the model's outermost ``forward`` runs, once, a ``TorchDispatchMode`` sees every
aten op's outputs: each storage an op makes (not a view or an in-place result, per the
op's schema) on the model's device is counted until it is freed, through a weak
reference, and the highest total is kept, with what had been saved by then. The mode holds
no tensor and changes nothing the ops compute; it is popped when the forward returns.

Where it does not run (``Peak.usable``): torch without the mode hooks that let
higher-order ops and ``torch.compile`` through untouched, a model whose parameters are
sharded (DTensor, FSDP's flat parameters: their all-gathered storages are resized in
place, which no op output shows; ZeRO-3's, gathered into buffers that outlive the ops)
or spread over several devices (a device map).

torch is imported by the caller; this module imports nothing heavy.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ._layout import is_flat_param

if TYPE_CHECKING:
    from torch.utils._python_dispatch import TorchDispatchMode

_MODE_CLASS: dict[str, Any] = {}
"""The ``TorchDispatchMode`` subclass, made once torch is loaded."""


def _mode_class(torch: Any) -> Callable[[Peak], TorchDispatchMode]:
    cls = _MODE_CLASS.get("cls")
    if cls is not None:
        return cls
    from torch.utils._python_dispatch import TorchDispatchMode

    class _PeakMode(TorchDispatchMode):
        # Higher-order ops (flex_attention, cond) come through __torch_dispatch__ and run
        # unchanged below it; without this they raise under a mode that does not say so.
        supports_higher_order_operators = True

        def __init__(self, peak: Peak) -> None:
            super().__init__()
            self.peak = peak

        @classmethod
        def ignore_compile_internals(cls) -> bool:
            # A compiled region inside the forward compiles as it would without us (dynamo
            # skips frames under other user modes); its fused ops are not seen.
            return True

        def __torch_dispatch__(
            self,
            func: Any,
            types: Any,
            args: tuple[Any, ...] = (),
            kwargs: dict[str, Any] | None = None,
        ) -> Any:
            out = func(*args, **(kwargs or {}))
            peak = self.peak
            if peak.on:
                try:
                    peak.made(func, out)
                except Exception as exc:  # never into training: stop counting, say why
                    peak.on = False
                    peak.error = f"{type(exc).__name__}: {str(exc)[:80]}"
            return out

    _MODE_CLASS["cls"] = _PeakMode
    return _PeakMode


def usable(torch: Any, model: Any) -> str | None:
    """Why the forward's peak cannot be measured for ``model``, or None when it can."""
    from torch.utils import _python_dispatch as pd

    mode = pd.TorchDispatchMode
    if not hasattr(mode, "supports_higher_order_operators") or not hasattr(
        mode, "ignore_compile_internals"
    ):
        return "this torch's dispatch modes stop higher-order ops or torch.compile"
    devices = set()
    for p in model.parameters():
        # ZeRO-3's partitioned parameters (``ds_tensor``) are gathered into flat buffers
        # that outlive the ops: their bytes would read as the forward's temporaries.
        if is_flat_param(p) or hasattr(p, "_local_tensor") or hasattr(p, "ds_tensor"):
            return "sharded parameters"
        devices.add(str(p.device))
        if len(devices) > 1:
            return "parameters on several devices"
    return None


class Peak:
    """A running peak of the bytes of storages made on one device type, with the saved
    bytes at that moment read from ``saved()``.

    Args:
        torch: The torch module.
        device_type: Count storages on this device type only (``cuda``, ``cpu``).
        saved: Returns ``(saved, amp copies)`` bytes counted so far by the pack hook.
    """

    def __init__(self, torch: Any, device_type: str, saved: Any) -> None:
        self.torch = torch
        self.device_type = device_type
        # t.is_cuda is cheaper than t.device.type (no device object made per op)
        self.flag = {"cuda": "is_cuda", "cpu": "is_cpu", "xpu": "is_xpu"}.get(device_type)
        self.saved = saved
        self.on = False
        self.mode: TorchDispatchMode | None = None
        self.error: str | None = None
        self.now = 0
        self.bytes = 0  # the peak
        self.saved_bytes = self.amp_bytes = 0  # saved by autograd at the peak
        self.ops = 0
        self.peak_op = 0
        self.live: dict[int, Any] = {}  # storage id -> weak reference
        self.fresh: dict[Any, tuple[bool, ...]] = {}  # op -> which returns are new storages

    def start(self) -> bool:
        """Push the mode (on this thread); False when it could not be."""
        if not self._push():
            return False
        self.on = True
        return True

    def _push(self) -> bool:
        """Push a new mode on this thread; False, with the error kept, where it failed."""
        try:
            self.mode = mode = _mode_class(self.torch)(self)
            mode.__enter__()
        except Exception as exc:
            self.error = f"{type(exc).__name__}: {str(exc)[:80]}"
            self.mode = None
            return False
        return True

    def pause(self) -> bool:
        """Pop the mode if it is on top, still counting what is alive (see :meth:`resume`).

        Returns:
            False when another mode is on top: ours stays where it is.
        """
        return self._pop()

    def restart_max(self) -> None:
        """Start a new running peak from what is alive now (the storages stay counted)."""
        self.bytes = self.now
        self.saved_bytes, self.amp_bytes = self.saved()
        self.peak_op = self.ops

    def resume(self) -> bool:
        """Push a mode again after :meth:`pause` (on this thread), only onto an empty mode
        stack: a user's mode still there (``with mode: model(x)``) would pop ours with its
        own exit. False when it was not pushed (counting stops where it could not be)."""
        if self.mode is not None or not self.on:
            return False
        from torch.utils._python_dispatch import _get_current_dispatch_mode

        if _get_current_dispatch_mode() is not None:
            return False
        self.on = self._push()
        return self.on

    def stop(self) -> bool:
        """Stop counting, forget every storage, and pop the mode if it is on top (idempotent).

        Returns:
            False when another mode pushed over ours is still there: ours stays below it,
            counting nothing, and a later call pops it.
        """
        self.on = False
        self.live.clear()  # the weak references go: their callbacks never run
        return self._pop()

    def _pop(self) -> bool:
        """Pop our mode if it is on top of the stack; False while another one is."""
        mode = self.mode
        if mode is None:
            return True
        from torch.utils._python_dispatch import _get_current_dispatch_mode

        top = _get_current_dispatch_mode()
        if top is None or top is not mode:
            return False
        self.mode = None
        top.__exit__(None, None, None)
        return True

    def made(self, func: Any, out: Any) -> None:
        """Count the new storages among an op's outputs (once per op: kept lean)."""
        self.ops += 1
        fresh = self.fresh.get(func)
        if fresh is None:
            fresh = self.fresh[func] = _fresh_returns(func)
        if not fresh:  # views, in-place results, higher-order ops
            return
        tensor = self.torch.Tensor
        if isinstance(out, tensor):
            if fresh[0]:
                self._track(out)
        elif isinstance(out, (tuple, list)):
            for i, t in enumerate(out[: len(fresh)]):
                if not fresh[i]:
                    continue
                if isinstance(t, tensor):
                    self._track(t)
                elif isinstance(t, (tuple, list)):  # Tensor[] (split_with_sizes_copy, ...)
                    for u in t[:256]:
                        if isinstance(u, tensor):
                            self._track(u)
        if self.now > self.bytes:
            self.bytes = self.now
            self.saved_bytes, self.amp_bytes = self.saved()
            self.peak_op = self.ops

    def _track(self, t: Any) -> None:
        if type(t) is not self.torch.Tensor:
            inner = getattr(t, "_local_tensor", None)  # a DTensor's shard
            t = t if inner is None else inner
        if self.flag is not None:
            if not getattr(t, self.flag):
                return
        elif t.device.type != self.device_type:
            return
        try:
            st = t.untyped_storage()
        except Exception:  # no storage of its own (sparse, nested): not counted
            return
        key = st._cdata
        if key in self.live:
            return
        n = st.nbytes()
        if n == 0:
            return

        # A closure, not a partial of the bound method (which costs more to make): this
        # runs for every new storage the forward makes.
        def gone(ref: weakref.ref[Any], key: int = key, n: int = n) -> None:
            self._gone(ref, key, n)

        self.live[key] = weakref.ref(st, gone)
        self.now += n

    def _gone(self, ref: Any, key: int, n: int) -> None:
        """A counted storage was freed (the callback of its weak reference)."""
        if self.live.get(key) is ref:
            del self.live[key]
            self.now -= n

    def facts(self) -> dict[str, Any]:
        """The ``forward_peak`` facts (``docs/facts.md``)."""
        return {
            "bytes": self.bytes,
            "saved_bytes": min(self.saved_bytes, self.bytes),
            "amp_copy_bytes": min(self.amp_bytes, max(0, self.bytes - self.saved_bytes)),
            "at": round(self.peak_op / self.ops, 4) if self.ops else 1.0,
        }


def _fresh_returns(func: Any) -> tuple[bool, ...]:
    """For each return of an aten op, whether it is a new storage: views, in-place and
    ``out=`` results alias an argument (their schema says so). Empty when none is (and for
    higher-order ops and ops without a schema: nothing counted)."""
    try:
        fresh = tuple(r.alias_info is None for r in func._schema.returns)
    except Exception:
        return ()
    return fresh if any(fresh) else ()

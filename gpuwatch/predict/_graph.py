"""A small model of what autograd keeps in memory: tensors, ops, saved tensors, liveness.

A training step's activation memory is the set of tensors that forward ops *save* for their
backward (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
Models", section 4.1, count them per layer for Megatron's GPT). Which inputs an op saves
is fixed by its derivative formula in PyTorch's ``tools/autograd/derivatives.yaml``, and
autograd saves an input only when the formula for some *other* input that requires grad
needs it (``mul(a, b)`` keeps ``b`` only if ``a`` requires grad). A builder records the ops
of one forward pass with those rules (see ``_transformer.py``); :func:`simulate` then walks
them forward and backward the way PyTorch's engine frees memory:

- forward: an op's outputs are allocated; a tensor that no later op reads and no op saved
  is freed after its last reader;
- backward, in reverse order: an op's backward allocates the gradients of its inputs and
  parameters, then frees its output gradients and any saved tensor whose earliest saver it
  is (``retain_graph=False`` releases saved variables once their node has run);
- checkpoint regions (``torch.utils.checkpoint``): forward keeps only the region's inputs;
  backward recomputes the region's forward before its backward (Chen et al. 2016,
  "Training Deep Nets with Sublinear Memory Cost"; PyTorch's non-reentrant checkpoint).

All sizes are bytes. Nothing here imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ._parallel import LAYOUT_CATEGORIES

# Memory categories of the predictor (also the keys of every breakdown).
WEIGHTS = "weights"
AMP_COPIES = "amp_copies"
GRADIENTS = "gradients"
OPTIMIZER_STATE = "optimizer_state"
ACTIVATIONS = "activations"
TEMPORARIES = "temporaries"
# cuBLAS's workspaces: allocated through the caching allocator, one per thread that ran a
# matmul (the training thread, and autograd's device thread from the first backward on).
BLAS_WORKSPACES = "blas_workspaces"
# The buffers a parallel layout adds (DDP's buckets, FSDP's all-gathers and reduce-scatters)
# are categories of their own, after these (``_parallel.py``).
CATEGORIES = (
    WEIGHTS,
    AMP_COPIES,
    GRADIENTS,
    OPTIMIZER_STATE,
    ACTIVATIONS,
    TEMPORARIES,
    BLAS_WORKSPACES,
    *LAYOUT_CATEGORIES,
)


@dataclass(eq=False)
class Tensor:
    """A tensor in the recorded program.

    Attributes:
        nbytes: Its storage size.
        rg: Whether it requires grad.
        amp: True for a low-precision copy of a weight made by autocast.
        elt: Bytes per element (its dtype's size).
    """

    nbytes: int
    rg: bool
    elt: int = 4
    amp: bool = False


@dataclass(eq=False)
class Op:
    """One forward op: what it reads, makes and saves, and the parameters it uses.

    Attributes:
        inputs: Tensors it reads (their last reader frees them in forward).
        outputs: Tensors it makes.
        saved: Tensors it saves for backward.
        params: ``(key, grad bytes)`` of trainable parameters it uses; a key seen twice
            (tied weights) gets one gradient and a transient for the second.
        region: Checkpoint region id, or None.
    """

    inputs: list[Tensor]
    outputs: list[Tensor]
    saved: list[Tensor] = field(default_factory=list)
    params: list[tuple[str, int]] = field(default_factory=list)
    region: int | None = None


@dataclass
class Moment:
    """Bytes alive at one moment, by kind."""

    saved: int = 0  # activations saved for backward (AMP copies excluded)
    amp: int = 0  # saved AMP weight copies
    temp: int = 0  # not saved: forward intermediates, activation gradients
    grads: int = 0  # parameter gradients

    def total(self) -> int:
        return self.saved + self.amp + self.temp + self.grads

    def copy(self) -> Moment:
        return Moment(self.saved, self.amp, self.temp, self.grads)


@dataclass
class Simulation:
    """What :func:`simulate` found, all relative to the memory before forward.

    Attributes:
        forward_peak: The moment of highest memory during forward.
        forward_end: What forward leaves alive (saved tensors, AMP copies).
        backward_peak: The moment of highest memory during backward.
        backward_end: What backward leaves (parameter gradients).
        eval_peak: Peak of the same forward without grad (nothing saved).
        grad_bytes: Parameter gradient bytes the program allocates.
        forward_peak_at, backward_peak_at: Where in its pass each peak falls (0 to 1, by
            op count), so a curve can place it.
        accumulating_peak: The peak of a backward that accumulates into gradients that
            already exist (the second micro-batch of a step onwards): each new parameter
            gradient lives only until it is added in place (a tied weight's until its last
            use), so ``grads`` here are those transients, on top of the existing ones.
    """

    forward_peak: Moment
    forward_end: Moment
    backward_peak: Moment
    backward_end: Moment
    eval_peak: Moment
    grad_bytes: int
    forward_peak_at: float = 1.0
    backward_peak_at: float = 0.0
    accumulating_peak: Moment | None = None


class _Live:
    """Running totals of alive tensors, with the peak moment."""

    def __init__(self) -> None:
        self.alive: dict[int, tuple[Tensor, str]] = {}
        self.now = Moment()
        self.peak = Moment()
        self.step = 0  # the op being walked, to say where the peak fell
        self.peak_step = 0

    def add(self, t: Tensor, kind: str) -> None:
        key = id(t)
        if key in self.alive:
            return
        self.alive[key] = (t, kind)
        setattr(self.now, kind, getattr(self.now, kind) + t.nbytes)

    def drop(self, t: Tensor) -> None:
        entry = self.alive.pop(id(t), None)
        if entry is not None:
            setattr(self.now, entry[1], getattr(self.now, entry[1]) - t.nbytes)

    def bump(self, extra: int = 0) -> None:
        """Record the current moment (plus ``extra`` transient bytes) if it is the peak."""
        if self.now.total() + extra > self.peak.total():
            self.peak = self.now.copy()
            self.peak.temp += extra
            self.peak_step = self.step


def _kind(t: Tensor) -> str:
    return "amp" if t.amp else "saved"


def simulate(ops: list[Op], keep: list[Tensor]) -> Simulation:
    """Walk a recorded forward and its backward.

    Args:
        ops: The forward program, in order.
        keep: Tensors the caller holds after forward (the loss).
    """
    forward_peak, forward_end, live, saved_by, last_read = _forward(ops, keep, grad=True)
    forward_at = live.peak_step / max(1, len(ops) - 1)
    eval_peak = _forward(ops, keep, grad=False)[0]
    backward_peak, backward_end, grad_bytes = _backward(ops, live, saved_by, last_read)
    backward_at = 1.0 - live.peak_step / max(1, len(ops) - 1)
    _, _, again, saved_by, last_read = _forward(ops, keep, grad=True)
    accumulating = _backward(ops, again, saved_by, last_read, accumulate=True)[0]
    return Simulation(
        accumulating_peak=accumulating,
        forward_peak_at=forward_at,
        backward_peak_at=backward_at,
        forward_peak=forward_peak,
        forward_end=forward_end,
        backward_peak=backward_peak,
        backward_end=backward_end,
        eval_peak=eval_peak,
        grad_bytes=grad_bytes,
    )


def _region_inputs(ops: list[Op]) -> dict[int, list[Tensor]]:
    """Tensors a checkpoint region reads but does not make: what the checkpoint keeps."""
    made: dict[int, set[int]] = {}
    inputs: dict[int, list[Tensor]] = {}
    for op in ops:
        if op.region is None:
            continue
        mine = made.setdefault(op.region, set())
        seen = inputs.setdefault(op.region, [])
        for t in op.inputs:
            if id(t) not in mine and all(t is not s for s in seen):
                seen.append(t)
        mine.update(id(t) for t in op.outputs)
    return inputs


def _forward(
    ops: list[Op], keep: list[Tensor], *, grad: bool
) -> tuple[Moment, Moment, _Live, dict[int, int], dict[int, int]]:
    last_read: dict[int, int] = {}
    for i, op in enumerate(ops):
        for t in op.inputs:
            last_read[id(t)] = i
    # saved_by[id] = index of the earliest op that saves it: backward frees it there.
    saved_by: dict[int, int] = {}
    if grad:
        for i, op in enumerate(ops):
            if op.region is not None:
                continue  # a checkpointed op's saves are dropped (recomputed in backward)
            for t in op.saved:
                saved_by.setdefault(id(t), i)
        for region, tensors in _region_inputs(ops).items():
            first = min(i for i, op in enumerate(ops) if op.region == region)
            for t in tensors:
                saved_by[id(t)] = min(saved_by.get(id(t), first), first)
    kept = {id(t) for t in keep}
    live = _Live()
    for i, op in enumerate(ops):
        live.step = i
        for t in op.outputs:
            live.add(t, _kind(t) if id(t) in saved_by else "temp")
        live.bump()
        for t in op.inputs:
            if last_read.get(id(t)) == i and id(t) not in saved_by and id(t) not in kept:
                live.drop(t)
        for t in op.outputs:  # made and never read (nor saved, nor kept): freed at once
            if id(t) not in last_read and id(t) not in saved_by and id(t) not in kept:
                live.drop(t)
    return live.peak, live.now.copy(), live, saved_by, last_read


def _backward(
    ops: list[Op],
    live: _Live,
    saved_by: dict[int, int],
    last_read: dict[int, int],
    accumulate: bool = False,
) -> tuple[Moment, Moment, int]:
    # Uses of each parameter still to come in backward: AccumulateGrad runs after the last.
    uses = _param_uses(ops) if accumulate else {}
    live.peak = live.now.copy()
    live.peak_step = len(ops) - 1
    grads: dict[int, Tensor] = {}  # activation gradients alive, by tensor id
    param_grads: set[str] = set()
    grad_bytes = 0
    region_first: dict[int, int] = {}
    for i, op in enumerate(ops):
        if op.region is not None:
            region_first.setdefault(op.region, i)
    recomputed: set[int] = set()
    # Where a recomputed region's saved tensors are freed: their earliest saver inside it.
    region_saver: dict[int, int] = {}
    for i in range(len(ops) - 1, -1, -1):
        op = ops[i]
        live.step = i
        if not any(t.rg for t in op.outputs):
            continue  # not part of the autograd graph: no backward, nothing saved
        if op.region is not None and op.region not in recomputed:
            recomputed.add(op.region)
            start = region_first[op.region]
            _recompute(ops, start, i, live, last_read, region_saver)
        grad_bytes += _op_gradients(op, live, grads, param_grads)
        live.bump()
        if accumulate:
            for key, nbytes in op.params:
                uses[key] -= 1
                if not uses[key]:  # added into the existing .grad in place, then freed
                    live.now.grads -= nbytes
        for t in op.outputs:
            done = grads.pop(id(t), None)
            if done is not None:
                live.drop(done)
        start = op.region is not None and i == region_first[op.region]
        _free_saved(op, i, live, saved_by, region_saver, start)
    for g in grads.values():  # gradients of the graph's inputs that nothing consumes
        live.drop(g)
    for alive_id in list(live.alive):
        t, kind = live.alive[alive_id]
        if kind != "temp":
            live.drop(t)
    return live.peak, live.now.copy(), grad_bytes


def _param_uses(ops: list[Op]) -> dict[str, int]:
    """How many ops of the graph use each parameter."""
    uses: dict[str, int] = {}
    for op in ops:
        if any(t.rg for t in op.outputs):
            for key, _ in op.params:
                uses[key] = uses.get(key, 0) + 1
    return uses


def _op_gradients(op: Op, live: _Live, grads: dict[int, Tensor], param_grads: set[str]) -> int:
    """The gradients an op's backward makes, its inputs' and its parameters'; returns
    the bytes of the parameter gradients it makes first."""
    made = 0
    for t in op.inputs:
        if t.rg and id(t) not in grads:
            g = Tensor(t.nbytes, False, t.elt)
            grads[id(t)] = g
            live.add(g, "temp")
        elif t.rg:
            live.bump(t.nbytes)  # a second gradient, summed into the first
    for key, nbytes in op.params:
        if key in param_grads:
            live.bump(nbytes)  # tied weight: computed, then accumulated in place
        else:
            param_grads.add(key)
            made += nbytes
            live.now.grads += nbytes
    return made


def _free_saved(
    op: Op,
    i: int,
    live: _Live,
    saved_by: dict[int, int],
    region_saver: dict[int, int],
    region_start: bool,
) -> None:
    """What op ``i``'s backward lets go of: what it saved, and at a checkpointed region's
    first op, the region's inputs it kept."""
    for t in op.saved:
        if saved_by.get(id(t)) == i or region_saver.get(id(t)) == i:
            live.drop(t)
    if op.region is not None and region_start:
        for t in list(op.inputs):
            if saved_by.get(id(t)) == i:
                live.drop(t)


def _recompute(
    ops: list[Op],
    start: int,
    end: int,
    live: _Live,
    last_read: dict[int, int],
    region_saver: dict[int, int],
) -> None:
    """Re-run a checkpoint region's forward, keeping what its ops save."""
    saves: dict[int, int] = {}
    reads: dict[int, int] = {}
    made: set[int] = set()
    for j in range(start, end + 1):
        for t in ops[j].saved:
            saves.setdefault(id(t), j)
        for t in ops[j].inputs:
            reads[id(t)] = j
        made.update(id(t) for t in ops[j].outputs)
    region_saver.update(saves)
    for j in range(start, end + 1):
        op = ops[j]
        for t in op.outputs:
            live.add(t, _kind(t) if id(t) in saves else "temp")
        live.bump()
        # Free what the recomputation made and no longer needs (the region's own output
        # included: backward already has the gradient it needs for it).
        for t in [*op.inputs, *op.outputs]:
            if id(t) in made and id(t) not in saves and reads.get(id(t), -1) <= j:
                live.drop(t)

"""Automatic phases in this process: torch's hooks, a real socket, a real receiver."""

from __future__ import annotations

import itertools
import os
import sys
import types
from collections.abc import Iterator

import pytest

torch = pytest.importorskip("torch")

from conftest import wait_for  # noqa: E402
from phasecheck import phases, receiver, rows, step_rows, wait_rows  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.checkpoint import checkpoint  # noqa: E402

import gpuwatch  # noqa: E402
from gpuwatch.instrument import _api, _auto, _watch  # noqa: E402
from gpuwatch.session import Session  # noqa: E402

PID = os.getpid()


@pytest.fixture
def live(sock_path: str) -> Iterator[Session]:
    """A receiver, the process-wide client pointed at it, a fresh step counter."""
    gen = receiver(sock_path)
    session = next(gen)
    gpuwatch.configure(socket=sock_path, enabled=True)
    _api._state.set_step(0)
    _api._state.stack().clear()
    _api._state.client.facts = None  # facts of an earlier test ride along with the hello
    yield session
    gpuwatch.flush()
    gen.close()


@pytest.fixture
def auto(live: Session) -> Iterator[Session]:
    """Automatic phases with discovery, as the start-up hook installs them."""
    assert _auto.install(discover=True)
    yield live
    _auto.uninstall()
    _watch._primary = None


def _facts(live: Session) -> dict:
    """This process's facts as the receiver has them so far ({} before its first datagram)."""
    proc = live.processes.get(PID)
    return (proc.facts if proc is not None else None) or {}


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Sequential(nn.Linear(16, 4)))


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(4, 8), torch.randint(0, 4, (4,))


def _train(
    model: nn.Module,
    opt: torch.optim.Optimizer,
    steps: int,
    *,
    accum: int = 1,
    zero_grad: str = "end",
    eval_every: int = 0,
) -> None:
    """The loop of tests/scripts/plain_train.py, in this process."""
    loss_fn = nn.CrossEntropyLoss()
    for s in range(steps):
        if zero_grad == "start":
            opt.zero_grad()
        for _ in range(accum):
            x, y = _batch()
            (loss_fn(model(x), y) / accum).backward()
        opt.step()
        if zero_grad == "end":
            opt.zero_grad()
        elif zero_grad == "model":
            model.zero_grad()
        if eval_every and (s + 1) % eval_every == 0:
            with torch.no_grad():
                model(_batch()[0])


def _settle(session: Session, n: int) -> list[tuple[str, int, int]]:
    gpuwatch.flush()
    return wait_rows(session, PID, n)


@pytest.mark.parametrize("zero_grad", ["end", "start", "model"])
def test_plain_steps(auto: Session, zero_grad: str) -> None:
    model = _model()
    _train(model, torch.optim.SGD(model.parameters(), lr=0.1), 3, zero_grad=zero_grad)
    expected = step_rows(3, zero_grad=zero_grad)
    assert _settle(auto, len(expected)) == expected
    # Inner modules (Linear, GELU, the nested Sequential) and the loss never made phases.
    assert {r[0] for r in rows(auto, PID)} <= {
        "forward",
        "backward",
        "optimizer.step",
        "zero_grad",
        "data",
    }
    if zero_grad != "start":
        # The data span begun around the last zero_grad waits for the next forward.
        assert [s.name for s in auto.processes[PID].open.values()] == ["data"]


def test_phases_tile_the_step(auto: Session) -> None:
    model = _model()
    _train(model, torch.optim.SGD(model.parameters(), lr=0.1), 3)
    expected = step_rows(3)
    _settle(auto, len(expected))
    top = [r for r in phases(auto, PID) if r[1] == 0]
    for a, b in itertools.pairwise(top):
        assert a[4] <= b[3], f"{a[0]} overlaps {b[0]}"
    # data runs from the end of optimizer.step to the start of the next forward.
    names = [r[0] for r in top]
    i = names.index("data")
    assert top[i - 1][0] == "optimizer.step" and top[i + 1][0] == "forward"
    assert top[i][3] == top[i - 1][4] and top[i][4] == top[i + 1][3]
    # zero_grad lies inside it.
    zg = next(r for r in phases(auto, PID) if r[0] == "zero_grad")
    assert top[i][3] <= zg[3] <= zg[4] <= top[i][4]


def test_gradient_accumulation(auto: Session) -> None:
    model = _model()
    _train(model, torch.optim.AdamW(model.parameters()), 2, accum=3)
    expected = step_rows(2, accum=3)
    assert _settle(auto, len(expected)) == expected
    assert gpuwatch.step() == 2


def test_eval_forward_between_steps(auto: Session) -> None:
    model = _model()
    _train(model, torch.optim.SGD(model.parameters(), lr=0.1), 4, eval_every=2)
    expected = step_rows(4, eval_every=2)
    assert _settle(auto, len(expected)) == expected
    with torch.inference_mode():
        model(_batch()[0])
    # An eval does not start a data gap: nothing between the two.
    assert _settle(auto, len(expected) + 1)[-2:] == [("eval", 0, 4), ("eval", 0, 4)]


def test_model_called_twice_per_step_and_parameterless_modules(auto: Session) -> None:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = nn.CrossEntropyLoss()  # no parameters: never a phase, never blocks one
    for _ in range(2):
        x, y = _batch()
        x2, y2 = _batch()
        loss = loss_fn(model(x), y) + loss_fn(model(x2), y2)
        loss.backward()
        opt.step()
    assert _settle(auto, 9) == [
        ("forward", 0, 0),
        ("forward", 0, 0),
        ("backward", 0, 0),
        ("optimizer.step", 0, 0),
        ("data", 0, 1),
        ("forward", 0, 1),
        ("forward", 0, 1),
        ("backward", 0, 1),
        ("optimizer.step", 0, 1),
    ]


def test_manual_phases_win_and_auto_nests_under_others(auto: Session) -> None:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = nn.CrossEntropyLoss()
    # The sample's style: every phase manual. The automatic ones must step aside.
    x, y = _batch()
    with gpuwatch.phase("forward"):
        loss = loss_fn(model(x), y)
    with gpuwatch.phase("backward"):
        loss.backward()
    with gpuwatch.phase("optimizer.step"):
        opt.step()
    with gpuwatch.phase("zero_grad"):
        opt.zero_grad()
    with gpuwatch.phase("eval"), torch.no_grad():
        model(x)
    # A manual phase of another kind: the automatic ones nest in it.
    with gpuwatch.phase("train_step"):
        loss_fn(model(x), y).backward()
        opt.step()
    assert _settle(auto, 9) == [
        ("forward", 0, 0),
        ("backward", 0, 0),
        ("optimizer.step", 0, 0),
        ("zero_grad", 0, 0),  # after the optimizer step, still its step (issue 25)
        ("eval", 0, 0),
        ("train_step", 0, 1),
        ("forward", 1, 1),
        ("backward", 1, 1),
        ("optimizer.step", 1, 1),
    ]
    assert gpuwatch.step() == 2


def test_closure_optimizer_steps_after_its_closure(auto: Session) -> None:
    model = _model()
    opt = torch.optim.LBFGS(model.parameters(), max_iter=1)
    loss_fn = nn.CrossEntropyLoss()
    x, y = _batch()

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        return loss

    opt.step(closure)
    assert _settle(auto, 4) == [
        ("zero_grad", 0, 0),
        ("forward", 0, 0),
        ("backward", 0, 0),
        ("optimizer.step", 0, 0),
    ]


@pytest.mark.parametrize("reentrant", [True, False])
def test_checkpoint_recompute_belongs_to_backward(auto: Session, reentrant: bool) -> None:
    inner = _model()

    class Outer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return checkpoint(self.inner, x, use_reentrant=reentrant)

    model = Outer()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = _batch()
    x.requires_grad_(reentrant)  # the reentrant variant needs an input that requires grad
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    assert _settle(auto, 3) == [("forward", 0, 0), ("backward", 0, 0), ("optimizer.step", 0, 0)]


def test_errors_end_phases_and_propagate(auto: Session) -> None:
    class Boom(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(2, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise ValueError("bad batch")

    class FailingSGD(torch.optim.SGD):
        fail = True

        def step(self, closure=None):  # type: ignore[override]
            if FailingSGD.fail:
                FailingSGD.fail = False
                raise RuntimeError("step failed")
            return super().step(closure)

    boom = Boom()
    with pytest.raises(ValueError, match="bad batch"):
        boom(torch.zeros(1, 2))
    model = _model()
    opt = FailingSGD(model.parameters(), lr=0.1)
    x, y = _batch()
    nn.functional.cross_entropy(model(x), y).backward()
    with pytest.raises(RuntimeError, match="step failed"):
        opt.step()
    # The failed step's phase ends (as unfinished) when training goes on.
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    got = [(r[0], r[5]) for r in (_settle(auto, 7) and phases(auto, PID))]
    assert got == [
        ("forward", True),  # Boom
        ("forward", False),
        ("backward", False),
        ("optimizer.step", True),
        ("forward", False),
        ("backward", False),
        ("optimizer.step", False),
    ]


def test_several_optimizers_count_one_step(auto: Session) -> None:
    model = _model()
    first = torch.optim.SGD(list(model.parameters())[:2], lr=0.1)
    second = torch.optim.Adam(list(model.parameters())[2:])
    for _ in range(2):
        x, y = _batch()
        nn.functional.cross_entropy(model(x), y).backward()
        first.step()
        second.step()
    assert gpuwatch.step() == 2
    assert [r[0] for r in _settle(auto, 9)] == [
        "forward",
        "backward",
        "optimizer.step",
        "optimizer.step",
        "data",
        "forward",
        "backward",
        "optimizer.step",
        "optimizer.step",
    ]


def test_discovery_hands_over_and_uninstall_restores(live: Session) -> None:
    module_mod = sys.modules["torch.nn.modules.module"]
    backward, opt_zg, mod_zg = (
        torch.autograd.backward,
        torch.optim.Optimizer.zero_grad,
        nn.Module.zero_grad,
    )
    globals_before = dict(module_mod._global_forward_pre_hooks)
    assert _auto.install(discover=True)
    try:
        assert torch.autograd.backward is not backward
        assert len(module_mod._global_forward_pre_hooks) == len(globals_before) + 1
        model = _model()
        _train(model, torch.optim.SGD(model.parameters(), lr=0.1), 1)
        # After the first step the model has hooks of its own; the global ones are gone.
        assert dict(module_mod._global_forward_pre_hooks) == globals_before
        assert len(model._forward_pre_hooks) == 1
        assert all(len(m._forward_pre_hooks) == 0 for m in list(model.modules())[1:])
        _train(model, torch.optim.SGD(model.parameters(), lr=0.1), 1)
        assert _settle(live, 9) == step_rows(2)
    finally:
        _auto.uninstall()
        _watch._primary = None
    assert torch.autograd.backward is backward
    assert torch.optim.Optimizer.zero_grad is opt_zg and nn.Module.zero_grad is mod_zg
    assert dict(module_mod._global_forward_pre_hooks) == globals_before
    assert len(model._forward_pre_hooks) == 0 and len(model._forward_hooks) == 0


def test_training_results_are_unchanged_and_never_raise(auto: Session, monkeypatch) -> None:
    def train() -> list[torch.Tensor]:
        model = _model()
        torch.manual_seed(1)
        _train(model, torch.optim.AdamW(model.parameters()), 3, accum=2)
        return [p.detach().clone() for p in model.parameters()]

    hooked = train()

    def broken(item: object) -> None:
        raise RuntimeError("sender exploded")

    monkeypatch.setattr(_api._state.client, "emit", broken)
    broken_result = train()
    _auto.uninstall()
    plain = train()
    assert all(torch.equal(a, b) for a, b in zip(hooked, plain, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(broken_result, plain, strict=True))


@pytest.mark.filterwarnings("ignore:Using `torch.compile:UserWarning")
@pytest.mark.parametrize("how", ["discovered", "watched before compile"])
def test_compiled_model(live: Session, how: str) -> None:
    # dynamo does not guard on hooks: start without graphs compiled by earlier tests.
    torch._dynamo.reset()
    model = _model()
    try:
        if how == "discovered":
            assert _auto.install(discover=True)
        else:
            gpuwatch.watch(model)
        compiled = torch.compile(model, backend="eager")
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(2):
            x, y = _batch()
            nn.functional.cross_entropy(compiled(x), y).backward()
            opt.step()
        assert [r[0] for r in _settle(live, 7)] == [
            "forward",
            "backward",
            "optimizer.step",
            "data",
            "forward",
            "backward",
            "optimizer.step",
        ]
    finally:
        _auto.uninstall()
        _watch._primary = None


# --------------------------------------------------------------------------- watch()


@pytest.fixture
def fake_facts(monkeypatch) -> list[tuple]:
    """Stand in for gpuwatch.instrument._facts (another branch writes it): records calls."""
    calls: list[tuple] = []
    fake = types.ModuleType("gpuwatch.instrument._facts")

    def collect_facts(model, optimizer=None, *, amp_dtype=None, checkpointing=None, **_):
        calls.append(("collect", model, optimizer, amp_dtype, checkpointing))
        return {
            "params": sum(p.numel() for p in model.parameters()),
            "optimizer": type(optimizer).__name__ if optimizer is not None else None,
        }

    def batch_facts(args, kwargs):
        calls.append(("batch", args, kwargs))
        tensors = [*args, *kwargs.values()]
        shapes = [list(t.shape) for t in tensors if isinstance(t, torch.Tensor)]
        return {"shape": shapes[0]} if shapes else {}

    fake.collect_facts = collect_facts  # type: ignore[attr-defined]
    fake.batch_facts = batch_facts  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "gpuwatch.instrument._facts", fake)
    monkeypatch.setattr(sys.modules["gpuwatch.instrument"], "_facts", fake, raising=False)
    return calls


class _KwModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = _model()

    def forward(self, *, input_ids: torch.Tensor) -> torch.Tensor:
        return self.net(input_ids)


def test_watch_sends_facts_then_batch_then_optimizer(live: Session, fake_facts: list) -> None:
    model = _KwModel()
    try:
        assert gpuwatch.watch(model) is model
        assert gpuwatch.watch(model) is model  # idempotent: one set of hooks
        assert len(model._forward_pre_hooks) == 1 and len(model._forward_hooks) == 1
        gpuwatch.flush()
        assert wait_for(lambda: live.processes.get(PID) and live.processes[PID].facts)
        params = sum(p.numel() for p in model.parameters())
        first = dict(live.processes[PID].facts)
        epoch = first.pop("epoch")  # this process's count of models described (docs/facts.md)
        assert first == {"params": params, "optimizer": None}
        opt = torch.optim.AdamW(model.parameters())
        x, y = _batch()
        nn.functional.cross_entropy(model(input_ids=x), y).backward()
        gpuwatch.flush()
        assert wait_for(lambda: "batch" in _facts(live))
        assert live.processes[PID].facts["batch"] == {"shape": [4, 8]}  # from the kwargs
        opt.step()
        gpuwatch.flush()
        assert wait_for(lambda: live.processes[PID].facts.get("optimizer") == "AdamW")
        facts = dict(live.processes[PID].facts)
        # What the first forward saved, measured as its backward began (test_activations).
        assert facts.pop("activations")["bytes"] > 0
        assert facts.pop("epoch") == epoch  # the same model: facts completed, same epoch
        assert facts == {"params": params, "optimizer": "AdamW", "batch": {"shape": [4, 8]}}
        # The inner Sequential is never described: the watched model is.
        assert all(c[1] is model for c in fake_facts if c[0] == "collect")
        assert [r[0] for r in _settle(live, 3)] == ["forward", "backward", "optimizer.step"]
    finally:
        _auto.uninstall()
        _watch._primary = None


def test_watch_without_facts_module_still_phases(live: Session, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "gpuwatch.instrument._facts", None)  # import fails
    # ... even where an earlier test imported it (``from . import`` reads the attribute).
    monkeypatch.delattr(sys.modules["gpuwatch.instrument"], "_facts", raising=False)
    model = _model()
    try:
        gpuwatch.watch(model, torch.optim.SGD(model.parameters(), lr=0.1))
        x, y = _batch()
        nn.functional.cross_entropy(model(x), y).backward()
        assert _settle(live, 2) == [("forward", 0, 0), ("backward", 0, 0)]
        assert live.processes[PID].facts is None
    finally:
        _auto.uninstall()
        _watch._primary = None


def test_autowatch_describes_the_first_model_that_trains(live: Session, fake_facts: list) -> None:
    teacher, student = _model(), _model()
    try:
        assert _watch.autowatch()
        opt = torch.optim.SGD(student.parameters(), lr=0.1)
        x, y = _batch()
        with torch.no_grad():
            teacher(x)  # an eval forward describes nothing
        nn.functional.cross_entropy(student(x), y).backward()
        opt.step()
        gpuwatch.flush()
        # The receiver is another thread: the process may not be known the instant flush returns.
        assert wait_for(lambda: _facts(live).get("optimizer") == "SGD")
        assert {c[1] for c in fake_facts if c[0] == "collect"} == {student}
        assert live.processes[PID].facts["batch"] == {"shape": [4, 8]}
    finally:
        _auto.uninstall()
        _watch._primary = None

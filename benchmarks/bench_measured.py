"""Predictions from measured activations against a live-storage truth, on the CPU.

Each case trains a model for two steps under ``gpuwatch.watch`` while ``tests/livebytes.py``
counts every live storage, peaked inside each phase; the prediction is made from the facts
``watch()`` sent. Cases: the models a shape formula misreads (``tests/test_measured_wins.py``:
T5, T5 with its output object kept, a frozen GPT-2 backbone under a trained head) and the
hand-written models no formula knows (``tests/test_activations.py``). Printed: case x step x
phase x (truth, predicted, ratio), and as the anchor the same facts without what the
training side measures beyond the saves (``forward_peak``, the forward's working set, and
the modules' ``no_backward``): the facts gpuwatch sent before, predicted by this code.
PASS when every phase of every case is within 10%.

Run: python benchmarks/bench_measured.py [case ...]
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import test_activations as A  # noqa: E402
import test_measured_wins as W  # noqa: E402
import torch  # noqa: E402

import gpuwatch  # noqa: E402
from gpuwatch.instrument import _api, _auto, _watch  # noqa: E402
from gpuwatch.predict import breakdown, predict, total  # noqa: E402

TOLERANCE = 0.10
PHASES = ("forward", "backward", "optimizer.step", "zero_grad")


def _wins(name: str) -> Callable[[], list[dict[str, int]]]:
    make = W.FrozenBackbone if name == "frozen-backbone" else W._t5
    data = W._data("frozen" if name == "frozen-backbone" else "t5")
    return lambda: W._run(make().train(), data, hold=name == "t5-output-kept")


def _handwritten(name: str) -> Callable[[], list[dict[str, int]]]:
    make, data = A.HANDWRITTEN[name]
    return lambda: A._train(make().train(), data(), 2, watch=True)[0]


CASES: dict[str, Callable[[], list[dict[str, int]]]] = {
    **{n: _wins(n) for n in ("t5", "t5-output-kept", "frozen-backbone")},
    **{n: _handwritten(n) for n in A.HANDWRITTEN},
}


def run(name: str) -> tuple[list[dict[str, int]], dict[str, Any]]:
    """The truth per step and phase, and the last facts ``watch()`` sent."""
    sent: list[dict[str, Any]] = []
    _api.set_facts = sent.append
    torch.manual_seed(0)
    try:
        truth = CASES[name]()
    finally:
        _auto.uninstall()
        _watch._primary = None
        _watch._reset_activations()
        _api._state.client.queue.clear()
    return truth, sent[-1]


def main(names: list[str]) -> int:
    gpuwatch.configure(socket=str(Path(tempfile.mkdtemp()) / "gw.sock"), enabled=True)
    torch.set_num_threads(1)
    worst = anchor_worst = 0.0
    print(f"{'case':16} step {'phase':15} {'truth':>9} {'pred':>9} ratio  {'anchor':>9} ratio")
    for name in names:
        truth, facts = run(name)
        act = facts.get("activations", {})
        mods = [{k: v for k, v in m.items() if k != "no_backward"} for m in act["modules"]]
        bare = dict(facts, activations=dict(act, modules=mods))
        del bare["activations"]["forward_peak"]
        p, old = predict(facts), predict(bare)
        for step, got in enumerate(truth):
            for phase in PHASES:
                pred = total(breakdown(p, phase, first_step=step == 0))
                was = total(breakdown(old, phase, first_step=step == 0))
                r, r0 = pred / got[phase], was / got[phase]
                worst, anchor_worst = max(worst, abs(r - 1)), max(anchor_worst, abs(r0 - 1))
                print(
                    f"{name:16} {step + 1:4} {phase:15} {got[phase] / 2**20:9.2f}"
                    f" {pred / 2**20:9.2f} {r:5.2f}  {was / 2**20:9.2f} {r0:5.2f}"
                )
    verdict = "PASS" if worst <= TOLERANCE else "FAIL"
    print(
        f"worst phase {worst:.1%} off (target <= {TOLERANCE:.0%}); anchor, from the saves"
        f" alone: {anchor_worst:.1%}  {verdict}"
    )
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or list(CASES)))

"""The notebook's line after a backward cell says what the step cell will need (a real
kernel run by nbclient, on the CPU): the next optimizer.step's forecast peak against what
the device can give, the figure the step cell's own line then shows."""

from __future__ import annotations

import re

# env: the fixture; pytestmark: torch, and skipped without a kernel
from test_notebook import MODEL, env, lines, pytestmark, run  # noqa: F401


def test_after_the_backward_cell_the_line_says_what_the_step_will_need(
    env: dict[str, str],  # noqa: F811
) -> None:
    nb = run(
        [
            "%load_ext gpuwatch",
            MODEL,
            "model(x).pow(2).mean().backward()",  # 3: its optimizer is not known yet
            MODEL + "\nimport gpuwatch; gpuwatch.watch(model, opt)",  # a new model, described
            "loss = model(x).pow(2).mean()",
            "loss.backward()",  # 6
            "opt.step()",  # 7
            "opt.zero_grad()\nmodel(x).pow(2).mean().backward()",  # 8: a later step's
        ],
        env,
    )
    c = nb.cells
    (unknown,) = lines(c[2])
    assert unknown.endswith(
        "next optimizer.step (first step): not forecast, it rests on the optimizer, not known"
        " until its first step (gpuwatch.watch(model, opt))"
    )
    assert not [ln for ln in lines(c[4]) if "next optimizer.step" in ln]  # a forward only
    (bwd,) = lines(c[5])
    ahead = re.search(
        r"next optimizer\.step \(first step\) will need ([\d.]+ [KMG]iB) of [\d.]+ [KMG]iB"
        r" the host can give",
        bwd,
    )
    assert ahead, bwd
    (step,) = lines(c[6])
    # What the backward cell said the step would need is what the step cell's line shows.
    assert f"predicted peak {ahead.group(1)} in optimizer.step" in step, (bwd, step)
    assert "next optimizer.step" not in step
    (later,) = lines(c[7])
    assert re.search(r"next optimizer\.step will need [\d.]+ [KMG]iB of", later), later


def test_the_line_says_a_step_that_will_not_fit() -> None:
    from gpuwatch import predict as pr
    from gpuwatch.analysis.forecast import Capacity
    from gpuwatch.notebook._line import step_ahead
    from gpuwatch.notebook._tap import Ended
    from gpuwatch.predict._shape import ModelShape, facts_from_shape

    prediction = pr.predict(facts_from_shape(ModelShape(2, 64, 4, 512), batch=2, seq=32))
    need = pr.total(prediction.phases["optimizer.step", True].peak)
    backward = Ended("backward", 1, 2, 3, 0, 1)
    tight = Capacity(need - (1 << 20), 1 << 30, 0, 0, "this GPU")
    text = step_ahead([backward], prediction, None, tight)
    assert text is not None and text.startswith("! next optimizer.step (first step) will need")
    assert "1.0 MiB short" in text
    roomy = step_ahead([backward], prediction, None, Capacity(need, 1 << 30, 0, 0, "x"))
    assert roomy is not None and not roomy.startswith("!")

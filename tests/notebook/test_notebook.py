"""gpuwatch in a notebook: real notebooks run by nbclient in a real kernel, on the CPU.

The seed's workflow, one step a cell: the model in one, the forward in the next, then
``loss.backward()``, ``optimizer.step()``, ``zero_grad()``; with cells between them that
allocate, sleep as a reader would, fail and get interrupted. What is checked: the line
under each cell (text and HTML), and what a real receiver (the dashboard's) got from the
kernel: cells as phases with the automatic phases inside them, no ``data`` phase between
cells, a measurement that ends with its cell, a new model as a new epoch of facts, the
kernel named by its notebook.
"""

from __future__ import annotations

import importlib.util
import os
import re
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import no_gpu_env, wait_for
from support.phasecheck import phases, receiver

NEEDS = ("nbformat", "nbclient", "ipykernel", "torch")
MISSING = [m for m in NEEDS if importlib.util.find_spec(m) is None]

# Imported where a notebook runs, not here: every worker collects this module, and
# nbformat's import alone takes seconds (jsonschema's format grammars).
pytestmark = [
    pytest.mark.torch,
    pytest.mark.skipif(bool(MISSING), reason=f"needs {', '.join(MISSING)}"),
]

MODEL = """\
import torch, torch.nn as nn
torch.manual_seed(0)
torch.set_num_threads(1)
model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 256))
opt = torch.optim.AdamW(model.parameters())
x = torch.randn(64, 256)"""


def run(cells: list[str], env: dict[str, str], timeout: int = 60, **kw: Any) -> Any:
    """Execute ``cells`` in a fresh kernel (errors allowed); the executed notebook."""
    import nbclient
    import nbformat

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    client = nbclient.NotebookClient(
        nb, timeout=timeout, kernel_name="python3", allow_errors=True, **kw
    )
    client.execute(env=env)
    return nb


def lines(cell: Any) -> list[str]:
    """The gpuwatch lines under a cell (text/plain)."""
    return [
        o["data"]["text/plain"]
        for o in cell.outputs
        if o.get("output_type") == "display_data"
        and str(o.get("data", {}).get("text/plain", "")).startswith("gpuwatch ")
    ]


def html_of(cell: Any) -> str:
    return "".join(
        str(o["data"].get("text/html", ""))
        for o in cell.outputs
        if o.get("output_type") == "display_data"
    )


def kernel_pid(nb: Any) -> int:
    for o in nb.cells[-1].outputs:
        if o.get("output_type") == "stream" and "pid" in o["text"]:
            return int(o["text"].split()[-1])
    raise AssertionError("the last cell prints the kernel's pid")


@pytest.fixture
def session(sock_path: str) -> Iterator[Any]:
    yield from receiver(sock_path)


@pytest.fixture
def env(sub_env: dict[str, str]) -> dict[str, str]:
    out = no_gpu_env(sub_env)
    out["JPY_SESSION_NAME"] = "/home/user/work/seed.ipynb"
    out["OMP_NUM_THREADS"] = "1"
    return out


def test_the_seeds_cells_each_a_phase_with_its_line(session: Any, env: dict[str, str]) -> None:
    nb = run(
        [
            "%load_ext gpuwatch",  # 1
            MODEL,  # 2
            "out = model(x)\nloss = out.pow(2).mean()",  # 3
            "big = torch.zeros(64 * 2**20 // 4) + 1",  # 4: 64 MiB between forward and backward
            "import time; time.sleep(0.4)  # a person reading",  # 5
            "loss.backward()",  # 6
            "opt.step()",  # 7
            "opt.zero_grad()",  # 8
            "1 / 0",  # 9
            "import os; print('pid', os.getpid())",  # 10
        ],
        env,
    )
    c = nb.cells
    assert lines(c[0]) == lines(c[1]) == []  # no phase ran: nothing to say
    (fwd,) = lines(c[2])
    assert re.match(r"gpuwatch \[3\] predicted peak [\d.]+ [KMG]iB in forward · largest: ", fwd)
    assert "host peak RSS" in fwd
    assert lines(c[3]) == lines(c[4]) == []  # no torch phase: no line, and no data phase
    (bwd,) = lines(c[5])
    assert bwd.startswith("gpuwatch [6] predicted peak") and " in backward" in bwd
    (step,) = lines(c[6])
    # AdamW's state: two fp32 copies of the 0.5M parameters, the cell's largest part.
    assert re.search(r"in optimizer\.step · largest: AdamW state 4\.0 MiB", step), step
    assert '<div class="gpuwatch-cell"' in html_of(c[6]) and "AdamW state" in html_of(c[6])
    assert lines(c[8]) == []
    pid = kernel_pid(nb)

    wait_for(lambda: len(phases(session, pid)) >= 12)
    got = phases(session, pid)
    names = [(n, d) for n, d, *_ in got]
    assert ("[3] out = model(x)", 0) in names
    i = names.index(("[3] out = model(x)", 0))
    assert names[i + 1] == ("forward", 1)  # the automatic phases nest in the cell
    for cell, inner in (("[6] loss.backward()", "backward"), ("[7] opt.step()", "optimizer.step")):
        j = names.index((cell, 0))
        assert names[j + 1] == (inner, 1)
    assert ("[8] opt.zero_grad()", 0) in names and ("zero_grad", 1) in names
    assert not [n for n, _ in names if n == "data"], names  # time between cells is idle
    failed = [r for r in got if r[0] == "[9] 1 / 0"]
    assert failed and failed[0][5]  # the failing cell's phase ended, marked failed
    proc = session.processes[pid]
    assert proc.hello.get("notebook") == "/home/user/work/seed.ipynb"
    act = proc.facts["activations"]
    assert act["until"] == "cell"  # the measurement ended with the forward's cell
    # The 64 MiB tensor of the next cell is no part of the forward or of its loss.
    assert act.get("loss_peak", {}).get("bytes", 0) < 8 * 2**20
    assert act.get("forward_peak", {}).get("bytes", 0) < 8 * 2**20


def test_off_chart_reload_interrupt_and_a_new_model(session: Any, env: dict[str, str]) -> None:
    nb = run(
        [
            "%load_ext gpuwatch",  # 1
            "%reload_ext gpuwatch",  # 2: still one line a cell
            MODEL,  # 3
            "loss = model(x).pow(2).mean(); loss.backward(); opt.step(); opt.zero_grad()",  # 4
            "%gpuwatch off",  # 5
            "loss = model(x).pow(2).mean(); loss.backward()",  # 6: no line
            "%gpuwatch chart",  # 7
            "opt.step(); opt.zero_grad()",  # 8: a line with its chart
            # 9: interrupted as the Interrupt button does it, SIGINT to the kernel mid-cell
            # (no timeout's seconds waited out first)
            "import time, os, signal\nos.kill(os.getpid(), signal.SIGINT)\n"
            "while True: time.sleep(0.05)",
            "model = nn.Sequential(nn.Linear(256, 4096), nn.Linear(4096, 256))  # re-run\n"
            "opt = torch.optim.AdamW(model.parameters())",  # 10
            "loss = model(x).pow(2).mean(); loss.backward(); opt.step(); opt.zero_grad()",  # 11
            "%unload_ext gpuwatch",  # 12
            "loss = model(x).pow(2).mean(); loss.backward()",  # 13: no line, no cell phase
            "import os; print('pid', os.getpid())",  # 14
        ],
        env,
    )
    c = nb.cells
    (first,) = lines(c[3])
    assert first.startswith("gpuwatch [4] predicted peak") and "optimizer.step" in first
    assert lines(c[5]) == []
    (charted,) = lines(c[7])
    assert charted.startswith("gpuwatch [8]")
    assert "<svg" in html_of(c[7]) and "optimizer.step" in html_of(c[7])
    assert any(o.get("ename") == "KeyboardInterrupt" for o in c[8].outputs)
    (again,) = lines(c[10])
    assert again.startswith("gpuwatch [11]")
    assert lines(c[12]) == []
    pid = kernel_pid(nb)

    def cells() -> list[tuple[str, bool]]:
        return [(n, e) for n, d, _s, _a, _b, e in phases(session, pid) if d == 0]

    wait_for(lambda: any(n.startswith("[11]") for n, _ in cells()))
    top = cells()
    assert len([n for n, _ in top if n.startswith("[4] loss = model(x)")]) == 1  # one, reloaded
    assert ("[9] import time, os, signal", True) in top  # interrupted: ended, marked failed
    assert not [n for n, _ in top if n.startswith("[13]")]  # unloaded: no cell phase
    proc = session.processes[pid]
    # The re-run model cell's model is a new epoch of facts, with its own parameters.
    assert proc.facts["epoch"] == 1
    assert proc.facts["params"]["count"] == 256 * 4096 + 4096 + 4096 * 256 + 256


def test_no_listener_still_shows_the_line(env: dict[str, str], tmp_path: Any) -> None:
    env = {**env, "GPUWATCH_SOCKET": os.path.join(str(tmp_path), "nobody.sock")}
    nb = run(["%load_ext gpuwatch", MODEL, "out = model(x)"], env)
    (line,) = lines(nb.cells[2])
    assert line.startswith("gpuwatch [3] predicted peak")
    assert not os.path.exists(env["GPUWATCH_SOCKET"])  # nothing made where none listens


def test_a_kernel_under_gpuwatch_run_has_cells_without_load_ext(
    session: Any, env: dict[str, str]
) -> None:
    from gpuwatch.launch import BOOT_DIR

    # What `gpuwatch run -- jupyter lab` hands each kernel: the start-up hook first.
    env = {**env, "PYTHONPATH": os.pathsep.join([BOOT_DIR, env["PYTHONPATH"]])}
    nb = run(
        [
            MODEL,  # 1: torch imported here: the hook loads the extension in this kernel
            "out = model(x)",  # 2
            "import os; print('pid', os.getpid())",  # 3
        ],
        env,
    )
    (line,) = lines(nb.cells[1])
    assert line.startswith("gpuwatch [2] predicted peak") and "in forward" in line
    pid = kernel_pid(nb)
    wait_for(lambda: any(n == "[2] out = model(x)" for n, *_ in phases(session, pid)))
    names = [(n, d) for n, d, *_ in phases(session, pid)]
    i = names.index(("[2] out = model(x)", 0))
    assert names[i + 1] == ("forward", 1)

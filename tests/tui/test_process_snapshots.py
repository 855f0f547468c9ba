"""SVG snapshots of the Processes tab in every theme, and of a process's own timelines.

A session of the synthetic training run plus processes of other users on its GPU, with
NVML's per-process samples and the host's figures, and a launcher above the trainer.
Regenerate after an intended change with ``python -m pytest
tests/tui/test_process_snapshots.py --snapshot-update`` and look at the report.
"""

from __future__ import annotations

import pytest
import synthetic

from gpuwatch.session import gpu_key
from gpuwatch.tui.app import GpuwatchApp

SIZE = (140, 45)
GIB = synthetic.GIB


def session():
    s = synthetic.build()
    key = gpu_key(synthetic.UUID)
    end = synthetic.end_time()
    wall = (end + s.wall_offset) / 1e9
    launcher = 4000
    s.set_proc_info(
        launcher,
        {
            "name": "torchrun",
            "user": "alice",
            "cmdline": ["torchrun", "--nproc-per-node", "1", "train.py"],
            "visible": True,
            "uid": 1000,
            "ppid": 1,
            "started": wall - 3725.0,
        },
    )
    s.set_proc_info(
        synthetic.PID,
        {
            "name": "python",
            "user": "alice",
            "cmdline": ["python", "train.py", "--bf16"],
            "visible": True,
            "uid": 1000,
            "ppid": launcher,
            "started": wall - 3723.0,
        },
    )
    s.set_proc_info(
        5100,
        {
            "name": "python",
            "user": "bob",
            "cmdline": ["python", "-m", "vllm.entrypoints.api_server"],
            "visible": True,
            "uid": 1001,
            "ppid": 1,
            "started": wall - 86400.0 * 2,
        },
    )
    s.set_proc_info(5200, {"name": None, "user": None, "cmdline": None, "visible": False})
    for i in range(6):
        t = (
            synthetic.T0 + (i + 1) * 10**9
            if hasattr(synthetic, "T0")
            else s.t_origin + (i + 1) * 10**9
        )
        s.add_gpu_processes(
            key,
            t,
            [
                (synthetic.PID, 40 * GIB, 0, 60.0 + 5 * i, 30.0, 104.0 - i, 6 * GIB),
                (5100, 9 * GIB, 0, 12.0, 4.0, 3.5, 2 * GIB),
                (5200, 2 * GIB, 0, None, None, None, None),
            ],
        )
    return s


def app(theme: str) -> GpuwatchApp:
    return GpuwatchApp(session(), theme_name=theme, clock=lambda: synthetic.end_time())


@pytest.mark.parametrize("theme", ["gpuwatch-dark", "gpuwatch-light", "gpuwatch-contrast"])
def test_processes_tab(snap_compare, theme: str) -> None:
    assert snap_compare(app(theme), press=("3",), terminal_size=SIZE)


def test_processes_tree_at_80x24(snap_compare) -> None:
    assert snap_compare(app("gpuwatch-dark"), press=("3", "t"), terminal_size=(80, 24))


def test_process_screen(snap_compare) -> None:
    assert snap_compare(
        app("gpuwatch-dark"), press=("3", "o", "o", "O", "enter"), terminal_size=SIZE
    )

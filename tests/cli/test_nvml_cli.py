"""The real CLI and live sources in child processes, NVML served by the fake via the env."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import uuid

import pytest
from conftest import FAKE_NVML, fake_nvml_env, wait_for


def test_live_sources_sample_the_fake_in_a_child(sub_env: dict[str, str]) -> None:
    code = (
        "import time\n"
        "from gpuwatch.live_sources import LiveSources\n"
        "ls = LiveSources(interval=0.02); ls.start(); time.sleep(1.0)\n"
        "s = ls.session\n"
        "print(sorted((d.index, d.name, d.state, len(s.gpu[k]) > 10, s.sampler_rate.get(k, 0) > 5)"
        " for k, d in s.devices.items() if d.kind == 'gpu'))\n"
        "print(s.notes)\n"
        "ls.stop()\n"
    )
    env = fake_nvml_env(sub_env, {"gpus": 2, "trace": "flat"})
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    name = "NVIDIA Fake A100-SXM4-80GB"
    assert out.stdout.splitlines() == [
        f"[(0, '{name}', 'ok', True, True), (1, '{name}', 'ok', True, True)]",
        str(["NVML from tests.fake_nvml ($GPUWATCH_NVML_BACKEND), not this machine's driver"]),
    ]


def test_no_driver_in_a_child_is_one_note(sub_env: dict[str, str]) -> None:
    code = (
        "from gpuwatch.live_sources import LiveSources\n"
        "import json\n"
        "ls = LiveSources(); ls.start(); print(json.dumps(ls.session.notes)); ls.stop()\n"
    )
    env = fake_nvml_env(sub_env, {"init_error": "DRIVER_NOT_LOADED"})
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    notes = json.loads(out.stdout)
    assert len(notes) == 1 and notes[0].startswith("no NVIDIA driver found")


def _tmux(server: str, *args: str) -> str:
    # A private server (-L) with no config: other tmux users on this machine cannot change
    # the window size or options under the test.
    return subprocess.run(
        ["tmux", "-L", server, "-f", "/dev/null", *args],
        capture_output=True,
        text=True,
        check=False,
    ).stdout


@pytest.mark.tmux
def test_dashboard_shows_a_gpu_lost_while_the_other_samples(sub_env: dict[str, str]) -> None:
    env = fake_nvml_env(sub_env, {"gpus": 2, "lose": [1, 1.5]})
    name = "gw-nvml-" + uuid.uuid4().hex[:8]
    exports = " ".join(
        f"{k}={shlex.quote(env[k])}"
        for k in ("PYTHONPATH", "GPUWATCH_SOCKET", "GPUWATCH_NVML_BACKEND", "GPUWATCH_FAKE_NVML")
    )
    cmd = (
        # COLUMNS/LINES (pytest sets them) would pin the app's size below the window's.
        f"env -u COLUMNS -u LINES {exports} {shlex.quote(sys.executable)} -m gpuwatch "
        "--no-record --interval 50; "
        "echo EXIT=$?; sleep 30"
    )
    _tmux(name, "new-session", "-d", "-s", name, "-x", "200", "-y", "60", cmd)
    try:
        screen = lambda: _tmux(name, "capture-pane", "-p", "-t", name)  # noqa: E731

        def shown() -> bool:
            text = screen()
            lines = text.splitlines()
            gpu0 = [i for i, line in enumerate(lines) if "GPU 0 · NVIDIA Fake" in line]
            # 50 ms asked: the header shows the achieved rate, about 20 Hz.
            rate = re.search(r"· (\d+) Hz", lines[gpu0[0] + 1]) if gpu0 else None
            return (
                "GPU 1 · NVIDIA Fake A100-SXM4-80GB · LOST" in text
                and "fell off the bus" in text
                and rate is not None
                and 10 <= int(rate.group(1)) <= 22
            )

        assert wait_for(shown, timeout=30), screen()
        _tmux(name, "send-keys", "-t", name, "q")
        assert wait_for(lambda: "EXIT=0" in screen(), timeout=15), screen()
    finally:
        _tmux(name, "kill-server")


# What pip writes as the ``gpuwatch`` console script (pyproject's [project.scripts]).
CONSOLE_SCRIPT = """\
import sys
from gpuwatch.cli import main
if __name__ == '__main__':
    sys.argv[0] = sys.argv[0].removesuffix('.exe')
    sys.exit(main())
"""


@pytest.fixture
def installed(tmp_path):
    """gpuwatch as an installed package: a copy in a site directory and the console script.

    Run as a script from ``bin/``, Python puts ``bin/`` first on ``sys.path``, not the
    current directory: the repository's ``tests`` package is not importable, as for a user
    who ran ``pip install .``.
    """
    import shutil

    from conftest import ROOT

    site = tmp_path / "site"
    shutil.copytree(
        ROOT / "gpuwatch", site / "gpuwatch", ignore=shutil.ignore_patterns("__pycache__")
    )
    (tmp_path / "bin").mkdir()
    script = tmp_path / "bin" / "gpuwatch"
    script.write_text(CONSOLE_SCRIPT)
    return script, site


def record_and_read(script, env: dict, cwd, out, sock_path: str) -> dict:
    """``gpuwatch record`` for a second through ``script``, then its ``info --json``."""

    def run(*args: str, where) -> subprocess.CompletedProcess:
        done = subprocess.run(
            [sys.executable, str(script), *args],
            env=env, cwd=where, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done

    run("record", "--out", str(out), "--duration", "1", "--socket", sock_path, where=cwd)
    return json.loads(run("info", "--json", str(out), where=out.parent).stdout)


@pytest.mark.parametrize("where", ["dotted name, repository root", "file path, elsewhere"])
def test_fake_backend_through_the_installed_entry_point(installed, tmp_path, sock_path, where):
    from conftest import ROOT

    script, site = installed
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "PYTHONPATH": str(site),
        "GPUWATCH_FAKE_NVML": json.dumps({"gpus": 2, "trace": "flat"}),
    }
    if where.startswith("dotted"):
        env["GPUWATCH_NVML_BACKEND"], cwd = FAKE_NVML, ROOT
    else:
        env["GPUWATCH_NVML_BACKEND"], cwd = str(ROOT / "tests" / "fake_nvml.py"), tmp_path
    data = record_and_read(script, env, cwd, tmp_path / "fake.gpuwatch", sock_path)
    gpus = [d for d in data["devices"] if d["kind"] == "gpu"]
    assert [g["name"] for g in gpus] == ["NVIDIA Fake A100-SXM4-80GB"] * 2
    assert all(g["samples"] > 3 for g in gpus)
    # The recording says where its GPUs came from: a fake never passes for real ones.
    assert any("GPUWATCH_NVML_BACKEND" in n and "not this machine's" in n for n in data["notes"])


def test_an_unknown_backend_is_a_note_not_a_crash(installed, tmp_path, sock_path) -> None:
    script, site = installed
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "PYTHONPATH": str(site),
        "GPUWATCH_NVML_BACKEND": "tests.fake_nvml",  # not importable from here
    }
    notes = record_and_read(script, env, tmp_path, tmp_path / "none.gpuwatch", sock_path)["notes"]
    assert any("cannot import tests.fake_nvml" in n for n in notes), notes

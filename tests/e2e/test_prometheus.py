"""The Prometheus exporter: the collector over a real session, its HTTP server, the CLI.

Sessions are filled through the public entry points the live sources use (``add_device``,
``add_gpu_sample``, ``ingest``, ``count_reject``); metrics are read back by parsing the
text exposition prometheus_client serves, so names, labels and ``_total`` suffixes are
checked as a scraper sees them.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import urllib.request
from itertools import count
from pathlib import Path

import pytest
import synthetic
from conftest import ROOT, run_gpuwatch
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpuwatch import predict
from gpuwatch.analysis.forecast import foresight
from gpuwatch.analysis.predicted import PredictedLine
from gpuwatch.prometheus import JOB, MAX_PHASE_NAMES, METRICS, MetricsServer, SessionCollector
from gpuwatch.protocol import Message
from gpuwatch.session import Device, Session, gpu_key

GIB = synthetic.GIB
MS = synthetic.MS
PID = synthetic.PID
STEPS = 3
END = synthetic.end_time(STEPS)

Sample = tuple[str, dict[str, str], float]
# A process that named no scheduler (on the collector host "h"): compared within its host.
NO_JOB = {**dict.fromkeys(JOB, ""), "job_id": "host:h"}


def scrape(collector: SessionCollector) -> list[Sample]:
    """What a scraper reads: the text exposition, parsed."""
    registry = CollectorRegistry()
    registry.register(collector)
    text = generate_latest(registry).decode()
    samples = [
        (s.name, s.labels, s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]
    series = [(name, tuple(sorted(labels.items()))) for name, labels, _ in samples]
    assert len(set(series)) == len(series), "a series twice: Prometheus rejects the scrape"
    return samples


def find(samples: list[Sample], metric: str, /, **labels: str) -> list[Sample]:
    return [s for s in samples if s[0] == metric and labels.items() <= s[1].items()]


def value(samples: list[Sample], metric: str, /, **labels: str) -> float:
    """The value of the one sample of ``metric`` whose labels include ``labels``."""
    hits = find(samples, metric, **labels)
    assert len(hits) == 1, (metric, labels, hits)
    return hits[0][2]


class Sender:
    """Protocol messages from one process, with consecutive sequence numbers."""

    def __init__(self, session: Session, pid: int, seq: int = 10**6) -> None:
        self.session, self.pid, self.seq = session, pid, count(seq)

    def __call__(self, kind: str, t: int, dropped: int = 0, **body: object) -> None:
        msg = Message(kind=kind, pid=self.pid, seq=next(self.seq), t=t, dropped=dropped, body=body)
        self.session.ingest(msg)


@pytest.fixture
def session() -> Session:
    """The synthetic GPU session (3 steps, one process with facts, one OOM)."""
    return synthetic.build(STEPS)


def test_gpu_metrics_are_the_newest_sample(session: Session) -> None:
    key = gpu_key(synthetic.UUID)
    session.add_gpu_sample(
        key,
        {"t": END + MS, "used": 12 * GIB, "total": 80 * GIB, "util_gpu": 42.0, "power": 250.5},
    )
    samples = scrape(SessionCollector(session, host="node1"))
    labels = {"gpu": "0", "uuid": synthetic.UUID, "name": "NVIDIA H100 80GB HBM3", "host": "node1"}
    assert value(samples, "gpuwatch_gpu_up", **labels) == 1
    assert value(samples, "gpuwatch_gpu_memory_used_bytes", **labels) == 12 * GIB
    assert value(samples, "gpuwatch_gpu_memory_total_bytes", **labels) == 80 * GIB
    assert value(samples, "gpuwatch_gpu_utilization_ratio", **labels) == pytest.approx(0.42)
    assert value(samples, "gpuwatch_gpu_power_watts", **labels) == 250.5
    # Not in the newest sample (n/a): no series, rather than a stale or made-up value.
    assert find(samples, "gpuwatch_gpu_temperature_celsius") == []
    assert value(samples, "gpuwatch_build_info", host="node1") == 1


def test_a_lost_gpu_is_down_and_shows_no_stale_values(session: Session) -> None:
    key = gpu_key(synthetic.UUID)
    session.set_device_state(key, "lost", "fell off the bus")
    samples = scrape(SessionCollector(session, host="h"))
    assert value(samples, "gpuwatch_gpu_up", gpu="0") == 0
    assert value(samples, "gpuwatch_gpu_memory_total_bytes", gpu="0") == 80 * GIB
    assert find(samples, "gpuwatch_gpu_memory_used_bytes") == []
    assert find(samples, "gpuwatch_gpu_power_watts") == []


def test_process_torch_figures_peaks_and_phase_counters(session: Session) -> None:
    send = Sender(session, PID)
    frag = {"inactive_split": GIB // 2, "alloc_retries": 3, "alloc_ooms": 1}
    send("memory", END + 2 * MS, allocated=7 * GIB, reserved=9 * GIB, dev=0, **frag)
    samples = scrape(SessionCollector(session, host="h"))
    proc = {"pid": str(PID), "rank": "0", "gpu": "0", "host": "h"}
    assert value(samples, "gpuwatch_process_torch_allocated_bytes", **proc) == 7 * GIB
    assert value(samples, "gpuwatch_process_torch_reserved_bytes", **proc) == 9 * GIB
    assert value(samples, "gpuwatch_process_torch_inactive_split_bytes", **proc) == GIB // 2
    assert value(samples, "gpuwatch_process_allocator_retries_total", **proc) == 3
    assert value(samples, "gpuwatch_process_allocator_ooms_total", **proc) == 1
    # The 10 ms spike inside optimizer.step that NVML's polls miss: weights, optimizer
    # state, gradients and the foreach temporaries (tests/support/synthetic.py).
    spike = (synthetic.WEIGHTS + synthetic.OPT_STATE + synthetic.GRADS + synthetic.TEMP) * GIB
    peak = "gpuwatch_process_phase_peak_allocated_bytes"
    assert value(samples, peak, phase="optimizer.step", **proc) == spike
    assert value(samples, peak, phase="forward", **proc) < spike
    assert value(samples, "gpuwatch_process_phase_peak_reserved_bytes", phase="zero_grad") > 0
    for name, start, stop in synthetic.PHASES:
        got = value(samples, "gpuwatch_process_phases_total", phase=name, **proc)
        assert got == STEPS
        seconds = value(samples, "gpuwatch_process_phase_seconds_total", phase=name, **proc)
        assert seconds == pytest.approx(STEPS * (stop - start) / 1000)
    assert value(samples, "gpuwatch_process_step", **proc) == STEPS - 1
    assert value(samples, "gpuwatch_process_rss_bytes", pid=str(PID)) == 3 * GIB
    assert value(samples, "gpuwatch_process_ooms_total", pid=str(PID)) == 1
    # Every phase ended: no current phase.
    assert find(samples, "gpuwatch_process_phase_info") == []


def test_predicted_figures_come_from_the_facts(session: Session) -> None:
    proc = session.processes[PID]
    samples = scrape(SessionCollector(session, host="h"))
    expected_peak = predict.predict(proc.facts).peak_bytes
    assert expected_peak > 40 * GIB  # the synthetic 2.7B model: a real prediction
    assert value(samples, "gpuwatch_process_predicted_peak_bytes", gpu="0") == expected_peak
    line = PredictedLine(session, proc)
    line.update()
    now = value(samples, "gpuwatch_process_predicted_bytes", gpu="0")
    assert now == pytest.approx(line.value_at(session.now()))
    assert 0 < now <= expected_peak


def test_current_phase_is_the_innermost_open_one_and_counters_only_grow(session: Session) -> None:
    collector = SessionCollector(session, host="h")
    send = Sender(session, PID)
    t = END + 10 * MS
    send("phase", t, event="begin", name="forward", id=900, depth=0, step=STEPS, dev=0)
    samples = scrape(collector)
    assert find(samples, "gpuwatch_process_phase_info") == [
        (
            "gpuwatch_process_phase_info",
            {"pid": str(PID), "rank": "0", "gpu": "0", "host": "h", "phase": "forward", **NO_JOB},
            1.0,
        )
    ]
    assert value(samples, "gpuwatch_process_step") == STEPS
    before = value(samples, "gpuwatch_process_phases_total", phase="forward")

    send("phase", t + MS, event="begin", name="attention", id=901, depth=1, parent=900, step=STEPS)
    samples = scrape(collector)
    (info,) = find(samples, "gpuwatch_process_phase_info")
    assert info[1]["phase"] == "attention"

    send("phase", t + 2 * MS, event="end", name="attention", id=901, step=STEPS)
    send("phase", t + 5 * MS, event="end", name="forward", id=900, step=STEPS)
    samples = scrape(collector)
    assert find(samples, "gpuwatch_process_phase_info") == []
    assert value(samples, "gpuwatch_process_phases_total", phase="forward") == before + 1
    assert value(samples, "gpuwatch_process_phases_total", phase="attention") == 1
    assert value(
        samples, "gpuwatch_process_phase_seconds_total", phase="attention"
    ) == pytest.approx(0.001)


def test_rejects_drops_and_gaps_are_counters(session: Session) -> None:
    session.count_reject("json")
    session.count_reject("json")
    session.count_reject("version")
    send = Sender(session, 77, seq=0)
    send("hello", END, dropped=0, argv=["x.py"])
    send("mark", END + MS, dropped=5, text="after five drops")
    send.seq = count(10)  # seq 2..9 never arrive
    send("mark", END + 2 * MS, dropped=5, text="after a gap")
    samples = scrape(SessionCollector(session, host="h"))
    rejected = "gpuwatch_receiver_rejected_datagrams_total"
    assert value(samples, rejected, reason="json", host="h") == 2
    assert value(samples, rejected, reason="version") == 1
    assert value(samples, "gpuwatch_process_dropped_events_total", pid="77", rank="") == 5
    assert value(samples, "gpuwatch_process_lost_events_total", pid="77") == 8
    assert value(samples, "gpuwatch_process_dropped_events_total", pid=str(PID)) == 0


def test_processes_that_ended_are_not_exported(session: Session) -> None:
    gone: set[int] = set()
    collector = SessionCollector(session, host="h", gone=gone.__contains__)
    other = Sender(session, 55)
    other("hello", END, argv=["other.py"])
    pids = lambda: {s[1]["pid"] for s in scrape(collector) if "pid" in s[1]}  # noqa: E731
    assert pids() == {str(PID), "55"}
    other("bye", END + MS, exit_code=0)
    assert pids() == {str(PID)}
    gone.add(PID)  # exited without a bye; the host sampler noticed
    assert pids() == set()


def test_phase_names_beyond_the_cap_share_one_label() -> None:
    s = Session(t_origin=0)
    send = Sender(s, 1, seq=0)
    collector = SessionCollector(s, host="h")
    for i in range(MAX_PHASE_NAMES + 40):  # a script that puts the step into the name
        figures = {"allocated": i, "reserved": i, "peak_allocated": i, "peak_reserved": i}
        send("phase", 2 * i * MS, event="begin", name=f"step {i}", id=i + 1, depth=0)
        send("phase", (2 * i + 1) * MS, event="end", name=f"step {i}", id=i + 1, **figures)
        if i in (MAX_PHASE_NAMES - 2, MAX_PHASE_NAMES + 10):
            scrape(collector)  # folding in several batches must agree with one
    send("phase", 999 * MS, event="begin", name="step 999", id=10**6, depth=0)
    samples = scrape(collector)  # every series once (scrape() checks)
    for metric in ("gpuwatch_process_phases_total", "gpuwatch_process_phase_peak_allocated_bytes"):
        phases = {s[1]["phase"] for s in find(samples, metric)}
        assert len(phases) == MAX_PHASE_NAMES + 1 and "other" in phases
    assert value(samples, "gpuwatch_process_phases_total", phase="other") == 40
    last = MAX_PHASE_NAMES + 39  # the newest of the names labelled "other"
    assert value(samples, "gpuwatch_process_phase_peak_allocated_bytes", phase="other") == last
    (info,) = find(samples, "gpuwatch_process_phase_info")
    assert info[1]["phase"] == "other"


def test_every_process_on_a_gpu_is_exported_instrumented_or_not(session: Session) -> None:
    key = gpu_key(synthetic.UUID)
    session.set_proc_info(PID, {"name": "python", "user": "alice", "cmdline": ["python"]})
    session.set_proc_info(
        5151, {"name": "ollama", "user": "bob", "cmdline": ["ollama", "-k=s3cr3t"]}
    )
    session.set_proc_info(77, {"name": None, "user": None, "cmdline": None, "visible": False})
    session.add_gpu_processes(key, END, [(PID, 20 * GIB, 0), (5151, 3 * GIB, 0), (77, GIB, 0)])
    session.add_gpu_processes(key, END + MS, [(PID, 21 * GIB, 0), (5151, 4 * GIB, 0), (77, GIB, 0)])
    session.add_gpu_sample(key, {"t": END + MS, "used": 30 * GIB, "total": 80 * GIB})
    samples = scrape(SessionCollector(session, host="h"))
    got = {
        (x[1]["pid"], x[1]["user"], x[1]["command"], x[1]["instrumented"]): x[2]
        for x in find(samples, "gpuwatch_gpu_process_memory_bytes", gpu="0", host="h")
    }
    assert got == {  # the newest list only; arguments never exported
        (str(PID), "alice", "python", "1"): 21 * GIB,
        ("5151", "bob", "ollama", "0"): 4 * GIB,
        ("77", "", "", "0"): GIB,
    }
    session.add_gpu_processes(key, END + 2 * MS, [])  # the GPU emptied
    assert (
        find(scrape(SessionCollector(session, host="h")), "gpuwatch_gpu_process_memory_bytes") == []
    )


def test_every_label_value_is_printable_and_names_stay_apart() -> None:
    # Phase names are the script's word, the GPU's name the driver's: an ESC]0;..BEL would
    # set the terminal title of whoever reads the label (curl, promtool, the cluster view).
    s = Session(t_origin=0)
    hostile_gpu = "H100\x1b]0;pwned\x07\u202e"
    s.add_device(Device("gpu-x", "gpu", index=0, name=hostile_gpu, uuid="GPU-\x1b[2J", total=GIB))
    s.add_gpu_sample("gpu-x", {"t": MS, "used": GIB // 2, "total": GIB})
    send = Sender(s, 1, seq=0)
    names = ["fwd\x1b[2J", "fwd\x07", "fwd\\x07", "bwd\u0085\u200f", "opt\n# HELP x"]
    for i, name in enumerate(names):
        figures = {"allocated": i, "reserved": i, "peak_allocated": i, "peak_reserved": i}
        send("phase", (2 * i + 2) * MS, event="begin", name=name, id=i + 1, depth=0, dev=0)
        send("phase", (2 * i + 3) * MS, event="end", name=name, id=i + 1, **figures)
    send("phase", 50 * MS, event="begin", name="open\x1b[31m", id=99, depth=0)
    samples = scrape(SessionCollector(s, host="h"))  # every series once (scrape() checks)
    values = [v for _, labels, _ in samples for v in labels.values()]
    assert values and [v for v in values if not v.isprintable()] == []
    phases = {x[1]["phase"] for x in find(samples, "gpuwatch_process_phases_total")}
    assert len(phases) == len(names)  # ESC and BEL, or BEL and a written \x07, stay apart
    assert {"fwd\\x1b[2J", "fwd\\x07", "fwd\\\\x07"} <= phases
    (info,) = find(samples, "gpuwatch_process_phase_info")
    assert info[1]["phase"] == "open\\x1b[31m"
    (gpu,) = find(samples, "gpuwatch_gpu_up")
    assert gpu[1]["name"] == "H100\\x1b]0;pwned\\x07\\u202e"


def test_every_exported_name_is_declared_and_follows_the_conventions(session: Session) -> None:
    frag = {"allocated": GIB, "reserved": GIB, "inactive_split": 0, "alloc_retries": 0}
    frag["alloc_ooms"] = 0
    Sender(session, PID)(
        "phase", END + MS, event="begin", name="eval", id=999, depth=0, dev=0, **frag
    )
    session.count_reject("size")
    # Every process on the GPU, with NVML's per-process samples and the host's figures.
    session.add_gpu_processes(
        gpu_key(synthetic.UUID), END + MS, [(PID, GIB, 0, 50.0, 9.0, 99.0, GIB)]
    )
    session.add_rss(PID, END + MS, GIB, 99.0)
    foresight(session).update()  # the forecasts, as the live sources' foresight keeps them
    declared = {m.name for m in METRICS}
    exported = {s[0] for s in scrape(SessionCollector(session, host="h"))}
    assert exported == declared  # this session has every metric
    units = ("_bytes", "_watts", "_ratio", "_celsius", "_total", "_info", "_up", "_step")
    for m in METRICS:
        assert re.fullmatch(r"gpuwatch_[a-z0-9_]+", m.name), m.name
        assert m.name.endswith("_total") == (m.kind == "counter"), m.name
        assert m.name.endswith(units), f"{m.name}: no unit suffix"
        assert not {"step", "t", "seq"} & set(m.labels), "per-step labels grow without end"


def test_a_scrape_does_not_wait_for_the_session_lock(session: Session) -> None:
    # Ingest holds Session._lock while it applies a message; a scrape must not need it.
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with session._lock:
            held.set()
            release.wait()

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    assert held.wait(30)
    done: list[list[Sample]] = []
    scraper = threading.Thread(
        target=lambda: done.append(scrape(SessionCollector(session))), daemon=True
    )
    scraper.start()
    scraper.join(60)
    release.set()
    assert done and find(done[0], "gpuwatch_gpu_memory_used_bytes")


# --------------------------------------------------------------------------- HTTP server


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as r:
        return r.read().decode()


def test_server_serves_metrics_and_releases_its_port(session: Session) -> None:
    server = MetricsServer(session, "127.0.0.1", 0)
    server.start()
    try:
        assert server.port > 0
        assert server.url == f"http://127.0.0.1:{server.port}/metrics"
        text = get(server.url)
        assert "gpuwatch_gpu_memory_used_bytes{" in text
        assert "gpuwatch_process_phases_total{" in text
        assert server.collector.scrapes == 1 and server.collector.cpu_seconds > 0
        second = MetricsServer(session, "127.0.0.1", server.port)
        with pytest.raises(OSError):
            second.start()
    finally:
        server.stop()
    server.stop()  # a second stop is harmless
    again = MetricsServer(session, "127.0.0.1", server.port)
    again.start()  # the port was released: a restarted gpuwatch gets it back
    again.stop()


@pytest.mark.skipif(not socket.has_ipv6, reason="no IPv6 on this machine")
def test_server_binds_ipv6_loopback(session: Session) -> None:
    server = MetricsServer(session, "::1", 0)
    try:
        server.start()
    except OSError as exc:
        pytest.skip(f"cannot bind ::1 here: {exc}")
    try:
        assert server.url == f"http://[::1]:{server.port}/metrics"
        assert "gpuwatch_build_info" in get(server.url)
    finally:
        server.stop()


# --------------------------------------------------------------------------- CLI


def gpuwatch(*args: str, sock: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env["GPUWATCH_NVML_BACKEND"] = "tests.fake_nvml"
    env["GPUWATCH_FAKE_NVML"] = json.dumps({"gpus": 1, "trace": "flat"})
    env["GPUWATCH_SOCKET"] = sock
    return run_gpuwatch(*args, env=env, timeout=timeout)


@pytest.mark.parametrize(
    ("address", "says"),
    [
        ("http", "not a port"),
        ("70000", "not a port"),
        ("::1:9400", "brackets"),
        ("[::1]", "[IPv6 ADDRESS]:PORT"),
        ("[nonsense]:9400", "not an IPv6 address"),
        (":9400", "no host"),
    ],
)
@pytest.mark.parametrize("command", ["record", "live", "run"])
def test_bad_addresses_are_usage_errors(
    tmp_path: Path, sock_path: str, address: str, says: str, command: str
) -> None:
    args = {"record": ["record", "--out", str(tmp_path / "r.gw")], "live": [], "run": ["run"]}
    out = gpuwatch(*args[command], "--prometheus", address, sock=sock_path)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "--prometheus" in lines[0] and says in lines[0], out.stderr
    assert not (tmp_path / "r.gw").exists()


def test_a_port_in_use_is_one_line_and_leaves_no_recording(tmp_path: Path, sock_path: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = gpuwatch(
            "record",
            "--out",
            str(tmp_path / "r.gw"),
            "--duration",
            "5",
            "--prometheus",
            f"127.0.0.1:{port}",
            sock=sock_path,
        )
    assert out.returncode != 0
    lines = out.stderr.strip().splitlines()
    assert lines == [f"gpuwatch: cannot serve metrics on 127.0.0.1:{port}: Address already in use"]
    assert not (tmp_path / "r.gw").exists()
    assert not Path(sock_path).exists()  # the socket was released too


def test_record_reports_the_port_it_was_given(tmp_path: Path, sock_path: str) -> None:
    out = gpuwatch(
        "record",
        "--out",
        str(tmp_path / "r.gw"),
        "--duration",
        "0.5",
        "--prometheus",
        "0",
        sock=sock_path,
    )
    assert out.returncode == 0, out.stderr
    urls = re.findall(r"gpuwatch: metrics on http://127\.0\.0\.1:(\d+)/metrics", out.stderr)
    assert len(urls) == 1 and int(urls[0]) > 0, out.stderr


def test_the_cli_loads_prometheus_client_only_when_serving() -> None:
    code = (
        "import sys\n"
        "from gpuwatch.cli import build_parser\n"
        "args = build_parser().parse_args(['record', '--out', 'x', '--prometheus', '9400'])\n"
        "assert args.prometheus == ('127.0.0.1', 9400), args.prometheus\n"
        "print('prometheus_client' in sys.modules, 'gpuwatch.prometheus' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False"]


def test_docs_describe_every_metric() -> None:
    doc = (ROOT / "docs" / "prometheus.md").read_text()
    missing = [m.name for m in METRICS if f"`{m.name}`" not in doc]
    assert missing == []


@pytest.mark.tmux
def test_live_dashboard_serves_metrics_and_shows_where(sock_path: str) -> None:
    from tmuxhelp import Tmux

    env = {
        "PYTHONPATH": str(ROOT),
        "GPUWATCH_SOCKET": sock_path,
        "GPUWATCH_NVML_BACKEND": "tests.fake_nvml",
        "GPUWATCH_FAKE_NVML": json.dumps({"gpus": 2, "trace": "flat"}),
        "TERM": "xterm-256color",
        "PATH": os.environ.get("PATH", ""),
        "HOME": os.environ.get("HOME", "/tmp"),
    }
    cmd = f"{sys.executable} -m gpuwatch --no-record --prometheus 0"
    tmux = Tmux(cmd, env, width=220)
    try:
        shown = r"metrics http://127\.0\.0\.1:(\d+)/metrics"
        assert tmux.wait_for_text("metrics http://"), tmux.screen()
        match = re.search(shown, tmux.screen())
        assert match, tmux.screen()
        url = f"http://127.0.0.1:{match.group(1)}/metrics"
        text = get(url)
        for gpu in ("0", "1"):
            assert re.search(rf'gpuwatch_gpu_memory_used_bytes\{{gpu="{gpu}"', text), text
        tmux.keys("q")
        assert tmux.wait_for_text("EXIT=0"), tmux.screen()
        with pytest.raises(OSError):  # stopped with the dashboard
            get(url)
    finally:
        tmux.close()


def test_every_gpu_process_is_exported_with_its_utilisation_and_host_figures(
    session: Session,
) -> None:
    key = gpu_key(synthetic.UUID)
    session.set_proc_info(4321, {"name": "python", "user": "alice", "visible": True})
    session.add_gpu_processes(
        key,
        END + MS,
        [(4321, 3 * GIB, 0, 87.0, 30.0, 150.0, 2 * GIB), (4322, GIB, 0, None, None, None, None)],
    )
    session.add_rss(PID, END + MS, 5 * GIB, 42.0)
    samples = scrape(SessionCollector(session, host="h"))
    labels = {"pid": "4321", "gpu": "0", "user": "alice", "host": "h"}
    assert value(samples, "gpuwatch_gpu_process_memory_bytes", **labels) == 3 * GIB
    assert value(samples, "gpuwatch_gpu_process_sm_utilization_ratio", **labels) == 0.87
    assert value(samples, "gpuwatch_gpu_process_cpu_ratio", **labels) == 1.5
    assert value(samples, "gpuwatch_gpu_process_host_rss_bytes", **labels) == 2 * GIB
    # Unknown figures (another PID namespace, no NVML samples): no series, not a 0.
    assert value(samples, "gpuwatch_gpu_process_memory_bytes", pid="4322") == GIB
    assert find(samples, "gpuwatch_gpu_process_sm_utilization_ratio", pid="4322") == []
    assert find(samples, "gpuwatch_gpu_process_cpu_ratio", pid="4322") == []
    assert value(samples, "gpuwatch_process_cpu_ratio", pid=str(PID)) == pytest.approx(0.42)

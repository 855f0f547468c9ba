"""Who a process is, as the exporter says it: ``gpuwatch_rank_info``, the job labels and
the predicted categories (docs/prometheus.md, "Metrics" and "Slurm and Kubernetes").

The scheduler's identity is read by the training side from its environment
(``gpuwatch/instrument/_sched.py``), sent in a real hello over a real Unix socket and
exported; hostile values (long, newlines, quotes, braces, non-ASCII) must come out as
bounded label values, whichever side they reach first.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
import synthetic
from conftest import ROOT, wait_for
from test_prometheus import NO_JOB, Sender, find, scrape, value

from gpuwatch import predict, protocol
from gpuwatch.instrument._sched import SOURCES, scheduler_identity
from gpuwatch.prometheus import JOB, RANK_INFO, STRATEGIES, SessionCollector
from gpuwatch.protocol import MAX_LABEL, Message, ProtocolError, label_text
from gpuwatch.session import Session
from gpuwatch.sources.annotations import AnnotationReceiver

PID = synthetic.PID
END = synthetic.end_time(2)
MS = synthetic.MS
HOSTILE = 'job"}\n# HELP x\r\n\\ été 🙂 {a="b"} ' * 20  # 680 characters
LABEL_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-:/@+,=[]")


def clean(text: str) -> bool:
    return len(text) <= MAX_LABEL and set(text) <= LABEL_CHARS


# --------------------------------------------------------------------------- training side


def test_slurm_variables_become_the_scheduler_identity() -> None:
    env = {
        "SLURM_JOB_ID": "912345",
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": "3",
        "SLURM_JOB_NODELIST": "gpu[001-004,017]",
        "TORCHELASTIC_RUN_ID": "llama-pretrain",
        "GPUWATCH_JOB_NAME": "llama-70b",
        "PATH": "/usr/bin",
    }
    assert scheduler_identity(env, namespace_file="/nonexistent") == {
        "slurm_job": "912345",
        "slurm_step": "0",
        "slurm_procid": "3",
        "slurm_nodelist": "gpu[001-004,017]",
        "job_name": "llama-70b",
        "torch_run": "llama-pretrain",
    }
    # Older Slurm spells some without the underscore; the first set one wins.
    old = {"SLURM_JOBID": "7", "SLURM_STEPID": "1", "SLURM_NODELIST": "n1"}
    assert scheduler_identity(old, "/nonexistent") == {
        "slurm_job": "7",
        "slurm_step": "1",
        "slurm_nodelist": "n1",
    }
    assert scheduler_identity({"PATH": "/usr/bin"}, "/nonexistent") == {}
    assert {*SOURCES, "torch_master"} == set(protocol.SCHEDULER_KEYS)


def test_kubernetes_downward_api_else_the_pod_itself(tmp_path: Path) -> None:
    ns_file = tmp_path / "namespace"
    ns_file.write_text("team-llm\n")
    downward = {"POD_NAME": "trainer-0", "POD_NAMESPACE": "research"}
    assert scheduler_identity(downward, str(ns_file)) == {
        "k8s_pod": "trainer-0",
        "k8s_namespace": "research",
    }
    docs_example = {"MY_POD_NAME": "p", "MY_POD_NAMESPACE": "n"}
    assert scheduler_identity(docs_example, str(ns_file)) == {"k8s_pod": "p", "k8s_namespace": "n"}
    # In a pod without the downward API: its host name and its service account's namespace.
    in_pod = {"KUBERNETES_SERVICE_HOST": "10.96.0.1"}
    assert scheduler_identity(in_pod, str(ns_file)) == {
        "k8s_pod": label_text(socket.gethostname()),
        "k8s_namespace": "team-llm",
    }
    assert scheduler_identity(in_pod, str(tmp_path / "missing")) == {
        "k8s_pod": label_text(socket.gethostname())
    }
    # Outside Kubernetes the namespace file is never read.
    assert scheduler_identity({}, str(ns_file)) == {}


def test_a_plain_torchrun_is_named_by_its_rendezvous() -> None:
    # torchrun without --rdzv-id says "none"; its master address and port name the run.
    env = {"TORCHELASTIC_RUN_ID": "none", "MASTER_ADDR": "10.1.2.3", "MASTER_PORT": "29500"}
    got = scheduler_identity(env, "/nonexistent")
    assert got == {"torch_run": "none", "torch_master": "10.1.2.3:29500"}
    assert protocol.job_id(got, "n1") == "torchrun:10.1.2.3:29500"
    # A loopback rendezvous is this host's alone: two hosts' 127.0.0.1:29500 are two jobs.
    for addr in ("127.0.0.1", "localhost", "::1"):
        local = scheduler_identity({"MASTER_ADDR": addr, "MASTER_PORT": "29500"}, "/nonexistent")
        assert local == {"torch_master": f"{label_text(socket.gethostname())}:29500"}
    # A run id of its own wins over the rendezvous.
    named = scheduler_identity({**env, "TORCHELASTIC_RUN_ID": "exp-7"}, "/nonexistent")
    assert protocol.job_id(named, "n1") == "torchrun:exp-7"
    assert scheduler_identity({"MASTER_ADDR": "10.1.2.3"}, "/nonexistent") == {}  # no port
    hostile = scheduler_identity({"MASTER_ADDR": HOSTILE, "MASTER_PORT": "1"}, "/nonexistent")
    assert clean(hostile["torch_master"]) and clean(protocol.job_id(hostile, "n1"))


def test_an_indexed_jobs_pod_names_its_job() -> None:
    pod = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "POD_NAMESPACE": "ml"}
    indexed = {**pod, "POD_NAME": "bert-ft-3-x7k2p", "JOB_COMPLETION_INDEX": "3"}
    assert scheduler_identity(indexed, "/nonexistent")["k8s_job"] == "bert-ft"
    # Its host name is JOB-INDEX.
    host_named = {**pod, "POD_NAME": "bert-ft-12", "JOB_COMPLETION_INDEX": "12"}
    assert scheduler_identity(host_named, "/nonexistent")["k8s_job"] == "bert-ft"
    assert protocol.job_id(scheduler_identity(indexed, "/nonexistent"), "n1") == "k8s:ml/bert-ft"
    # The downward API's label wins; a pod of no Indexed Job names none.
    named = {**indexed, "K8S_JOB_NAME": "bert-ft-v2"}
    assert scheduler_identity(named, "/nonexistent")["k8s_job"] == "bert-ft-v2"
    plain = {**pod, "POD_NAME": "trainer-0"}
    assert "k8s_job" not in scheduler_identity(plain, "/nonexistent")
    odd = {**pod, "POD_NAME": "trainer-0", "JOB_COMPLETION_INDEX": "3"}
    assert "k8s_job" not in scheduler_identity(odd, "/nonexistent")


@pytest.mark.parametrize(
    ("scheduler", "expected"),
    [
        ({"slurm_job": "912", "slurm_step": "0", "torch_master": "n1:29500"}, "slurm:912.0"),
        ({"slurm_job": "912"}, "slurm:912"),
        ({"k8s_namespace": "ml", "k8s_job": "bert", "k8s_pod": "bert-0-abcde"}, "k8s:ml/bert"),
        ({"k8s_pod": "trainer-0", "job_name": "llama"}, "name:llama"),
        ({"torch_run": "none", "torch_master": "n1:29500"}, "torchrun:n1:29500"),
        ({"torch_run": "none"}, "host:node-7"),
        ({"k8s_pod": "trainer-0"}, "host:node-7"),  # a pod alone is one process, not a job
        ({}, "host:node-7"),
        ({"slurm_job": 5, "job_name": ["x"]}, "host:node-7"),  # not strings: not said
        ({"slurm_job": HOSTILE}, label_text("slurm:" + HOSTILE)),
    ],
)
def test_job_id_is_the_first_identity_named(scheduler: dict, expected: str) -> None:
    got = protocol.job_id(scheduler, "node-7")
    assert got == expected and clean(got)


def test_hostile_environment_values_are_cut_and_cleaned() -> None:
    got = scheduler_identity({"SLURM_JOB_ID": HOSTILE, "POD_NAME": "\n\n"}, "/nonexistent")
    assert set(got) == {"slurm_job", "k8s_pod"}
    assert all(clean(v) for v in got.values()), got
    assert len(got["slurm_job"]) == MAX_LABEL and got["slurm_job"].startswith("job__")
    assert got["k8s_pod"] == "__"

    class Broken(dict):
        def get(self, *_):  # an environment that fails on every read
            raise RuntimeError("no")

    assert scheduler_identity(Broken(), "/nonexistent") == {}  # never raises


def test_a_real_hello_carries_the_cleaned_identity(sock_path: str, sub_env) -> None:
    session = Session()
    rx = AnnotationReceiver(session, sock_path)
    rx.start()
    env = {**sub_env, "SLURM_JOB_ID": HOSTILE, "SLURM_STEP_ID": "2", "POD_NAME": "a'b\"c"}
    env["GPUWATCH_AUTO"] = "0"
    # It waits on its stdin, so that it is still running (exported) when scraped.
    code = (
        "import gpuwatch, os, sys\ngpuwatch.mark('hi')\ngpuwatch.flush()\n"
        "print(os.getpid(), flush=True)\nsys.stdin.read()\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code], env=env, cwd=ROOT, text=True,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert child.stdout is not None
        pid = int(child.stdout.readline())
        assert wait_for(lambda: pid in session.processes, timeout=10)
        samples = scrape(SessionCollector(session, host="h"))
    finally:
        child.communicate(timeout=60)
        rx.stop()
    assert child.returncode == 0
    assert dict(session.rejects) == {}  # the client sends only what the receiver accepts
    (info,) = find(samples, "gpuwatch_rank_info", pid=str(pid))
    labels = info[1]
    assert labels["slurm_job"] == label_text(HOSTILE) and clean(labels["slurm_job"])
    assert (labels["slurm_step"], labels["k8s_pod"]) == ("2", "a_b_c")
    assert labels["strategy"] == "unknown"  # no facts sent
    rss = find(samples, "gpuwatch_process_dropped_events_total", pid=str(pid))
    assert rss and rss[0][1]["slurm_job"] == labels["slurm_job"]


# --------------------------------------------------------------------------- receiving side


def hello(scheduler: object) -> bytes:
    return protocol.encode("hello", 77, 0, 1, 0, {"scheduler": scheduler})


@pytest.mark.parametrize(
    "scheduler",
    [
        {"slurm_job": "1\n# HELP"},
        {"slurm_job": 'a"b'},
        {"slurm_job": "x" * (MAX_LABEL + 1)},
        {"slurm_job": 5},
        {"Slurm-Job": "1"},
        {f"k{i}": "1" for i in range(17)},
        ["slurm_job", "1"],
    ],
)
def test_a_hello_with_unclean_scheduler_values_is_rejected(scheduler: object) -> None:
    with pytest.raises(ProtocolError) as exc:
        protocol.decode(hello(scheduler))
    assert exc.value.reason == "field"


def test_unknown_scheduler_keys_are_kept_off_the_labels(session_with_proc: Session) -> None:
    msg = protocol.decode(hello({"slurm_job": "42", "future_key": "x"}))
    assert msg.body["scheduler"] == {"slurm_job": "42", "future_key": "x"}
    session_with_proc.ingest(msg)
    samples = scrape(SessionCollector(session_with_proc, host="h"))
    (info,) = find(samples, "gpuwatch_rank_info", pid="77")
    assert info[1]["slurm_job"] == "42" and "future_key" not in info[1]
    assert set(info[1]) == set(RANK_INFO)


def test_the_exporter_cleans_what_reached_the_session_uncleaned() -> None:
    # A hello body that no receiver validated (a recording's, a bug's): cleaned again.
    s = Session(t_origin=0)
    hostile = {k: HOSTILE for k in protocol.SCHEDULER_KEYS}
    s.ingest(Message("hello", 9, 0, MS, body={"scheduler": hostile, "rank": 2**40}))
    s.ingest(Message("mark", 9, 1, 2 * MS, body={"text": "x", "level": "info"}))
    samples = scrape(SessionCollector(s, host="h"))
    assert samples
    for _, labels, _ in samples:
        assert all(clean(v) for k, v in labels.items() if k in (*JOB, "slurm_nodelist")), labels
    (info,) = find(samples, "gpuwatch_rank_info")
    assert info[1]["rank"] == ""  # out of range: no label value
    assert info[1]["slurm_nodelist"] == label_text(HOSTILE)


# --------------------------------------------------------------------------- rank_info


@pytest.fixture
def session_with_proc() -> Session:
    return synthetic.build(2)


def facts_with(parallel: object) -> dict:
    facts = dict(synthetic.build(1).processes[PID].facts or {})
    facts["parallel"] = parallel
    return facts


def info_of(session: Session, pid: int = PID) -> dict[str, str]:
    (info,) = find(scrape(SessionCollector(session, host="h")), "gpuwatch_rank_info", pid=str(pid))
    assert info[2] == 1
    return info[1]


def test_rank_info_of_a_ddp_rank(session_with_proc: Session) -> None:
    send = Sender(session_with_proc, PID)
    send("hello", END, rank=3, local_rank=1, world_size=8, scheduler={"slurm_job": "77"})
    send("facts", END + MS, facts=facts_with({"strategy": "ddp", "rank": 3, "world_size": 8}))
    assert info_of(session_with_proc) == {
        **dict.fromkeys(RANK_INFO, ""),
        "pid": str(PID),
        "rank": "3",
        "local_rank": "1",
        "world_size": "8",
        "host": "h",
        "strategy": "ddp",
        "slurm_job": "77",
        "job_id": "slurm:77",
    }


def test_rank_info_of_zero_shows_its_partition_count(session_with_proc: Session) -> None:
    send = Sender(session_with_proc, PID)
    send("hello", END, rank=None, world_size=None)
    layout = {"strategy": "zero", "rank": 1, "world_size": 4, "zero": {"partition_count": 4}}
    send("facts", END + MS, facts=facts_with(layout))
    got = info_of(session_with_proc)
    assert (got["strategy"], got["shard_size"], got["replicate_size"]) == ("zero", "4", "")


def test_rank_info_of_hsdp_and_the_process_groups_rank(session_with_proc: Session) -> None:
    # mp.spawn sets no RANK: the rank and the world come from the process group.
    send = Sender(session_with_proc, PID)
    send("hello", END, rank=None, world_size=None)
    fsdp = {"version": 2, "mesh_size": 4, "replicate_size": 2, "units": 1}
    layout = {"strategy": "fsdp2", "rank": 5, "world_size": 8, "fsdp": fsdp}
    send("facts", END + MS, facts=facts_with(layout))
    got = info_of(session_with_proc)
    assert (got["strategy"], got["rank"], got["world_size"]) == ("fsdp2", "5", "8")
    assert (got["shard_size"], got["replicate_size"]) == ("4", "2")
    # The rank label of its other series is the same one, so joins on it work too.
    samples = scrape(SessionCollector(session_with_proc, host="h"))
    assert value(samples, "gpuwatch_process_ooms_total", pid=str(PID)) >= 0
    assert {s[1]["rank"] for s in samples if s[1].get("pid") == str(PID)} == {"5"}


@pytest.mark.parametrize(
    ("parallel", "strategy"),
    [
        *[({"strategy": name}, name) for name in STRATEGIES],
        ({"strategy": "ddp\n# HELP evil"}, "other"),
        ({"strategy": 3}, "other"),
        ("not a dict", "none"),
        (None, "none"),
    ],
)
def test_strategy_is_one_of_a_bounded_set(
    session_with_proc: Session, parallel: object, strategy: str
) -> None:
    facts = facts_with(parallel)
    if parallel is None:
        del facts["parallel"]
    Sender(session_with_proc, PID)("facts", END + MS, facts=facts)
    assert info_of(session_with_proc)["strategy"] == strategy


def test_before_its_facts_a_process_is_unknown_and_hostile_sizes_are_dropped() -> None:
    s = Session(t_origin=0)
    send = Sender(s, 12, seq=0)
    send("hello", MS, rank=0)
    assert info_of(s, 12)["strategy"] == "unknown"
    layout = {"strategy": "fsdp2", "world_size": -1, "fsdp": {"mesh_size": 2**60}}
    send("facts", 2 * MS, facts={"parallel": layout})
    got = info_of(s, 12)
    assert (got["strategy"], got["world_size"], got["shard_size"]) == ("fsdp2", "", "")


def test_every_per_process_series_carries_the_job_labels(session_with_proc: Session) -> None:
    job = {"slurm_job": "5", "slurm_step": "1", "k8s_namespace": "ns", "k8s_pod": "p-0"}
    job |= {"job_name": "j", "torch_run": "r", "job_id": "slurm:5.1"}
    assert set(job) == set(JOB)
    Sender(session_with_proc, PID)("hello", END, scheduler={**job, "job_id": "spoofed"})
    Sender(session_with_proc, 99, seq=0)("hello", END, argv=["other.py"])
    samples = scrape(SessionCollector(session_with_proc, host="h"))
    per_process = [s for s in samples if "pid" in s[1]]
    mine = [s for s in per_process if s[1]["pid"] == str(PID)]
    assert len({s[0] for s in mine}) >= 15  # torch, phases, prediction, counters, info
    for name, labels, _ in mine:
        assert job.items() <= labels.items(), name
    for name, labels, _ in per_process:
        if labels["pid"] == "99":
            assert NO_JOB.items() <= labels.items(), name
    for name, labels, _ in samples:  # per GPU and per host: no job labels
        if "pid" not in labels:
            assert not set(JOB) & set(labels), name


# --------------------------------------------------------------------------- categories


def test_predicted_categories_split_the_prediction(session_with_proc: Session) -> None:
    facts = facts_with({"strategy": "ddp", "rank": 0, "world_size": 2, "ddp": {}})
    Sender(session_with_proc, PID)("facts", END + MS, facts=facts)
    samples = scrape(SessionCollector(session_with_proc, host="h"))
    expected = predict.predict(facts)
    peak_parts = expected.phases[expected.peak_phase].peak
    got = {
        s[1]["category"]: s[2]
        for s in find(samples, "gpuwatch_process_predicted_peak_category_bytes")
    }
    assert set(got) == set(predict.CATEGORIES) and len(got) == 13
    assert got == {c: peak_parts.get(c, 0) for c in predict.CATEGORIES}
    assert got["ddp_buckets"] > 0 and got["fsdp_unsharded"] == 0
    assert sum(got.values()) == value(samples, "gpuwatch_process_predicted_peak_bytes")
    now = {
        s[1]["category"]: s[2] for s in find(samples, "gpuwatch_process_predicted_category_bytes")
    }
    assert set(now) == set(predict.CATEGORIES)
    assert sum(now.values()) == pytest.approx(value(samples, "gpuwatch_process_predicted_bytes"))
    assert now["ddp_buckets"] > 0  # alive from the wrapper's construction on


def test_without_facts_there_are_no_category_series() -> None:
    s = synthetic.build(2, with_facts=False)
    samples = scrape(SessionCollector(s, host="h"))
    assert find(samples, "gpuwatch_process_predicted_category_bytes") == []
    assert find(samples, "gpuwatch_process_predicted_peak_category_bytes") == []
    assert info_of(s)["strategy"] == "unknown"  # the process is still named

"""gpuwatch cluster's Prometheus client: credentials, TLS, timeouts, hostile answers, bad input.

A scripted server on a real socket (tests/support/promstub.py) plays Prometheus where a test needs
it to check a token, echo it back or answer badly; the real CLI runs as a subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import ROOT, wait_for
from promstub import GiB, PromStub, Stub, gpu_series, merge, rank_series, self_signed

from gpuwatch.cluster import Auth, Cluster, PromClient, PromError, fetch, parse_matchers
from gpuwatch.cluster import client as client_mod
from gpuwatch.cluster.model import FAMILIES, MAX_NEAR, QUERY_THREADS, ROW_FAMILIES, Worst
from gpuwatch.cluster.text import ranks_lines

TOKEN = "s3cr3t-t0ken-4f9a2c"


@pytest.fixture
def stub() -> Iterator[tuple[Stub, PromStub]]:
    s = Stub(families=merge(gpu_series("node-a", 2), gpu_series("node-b", 1)))
    server = PromStub(s)
    yield s, server
    server.close()


def cluster_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k != "GPUWATCH_PROMETHEUS_TOKEN"}
    full.update({"PYTHONPATH": str(ROOT), **(env or {})})
    return subprocess.run(
        [sys.executable, "-m", "gpuwatch", "cluster", *args],
        capture_output=True,
        text=True,
        env=full,
        cwd=ROOT,
        timeout=60,
    )


# ---------------------------------------------------------------------- credentials


def test_a_token_from_a_file_is_sent_and_never_shown(stub, tmp_path: Path) -> None:
    s, server = stub
    s.token = TOKEN
    (tmp_path / "token").write_text(TOKEN + "\n")
    done = cluster_cli(
        "--prometheus", server.url, "--once", "--token-file", str(tmp_path / "token")
    )
    assert done.returncode == 0, done.stderr
    assert "node-a" in done.stdout and "3 GPUs" in done.stdout
    assert s.requests and all(
        r.headers.get("Authorization") == f"Bearer {TOKEN}" for r in s.requests
    )
    assert TOKEN not in done.stdout + done.stderr


def test_a_token_from_the_environment_is_sent(stub) -> None:
    s, server = stub
    s.token = TOKEN
    done = cluster_cli(
        "--prometheus", server.url, "--once", env={"GPUWATCH_PROMETHEUS_TOKEN": TOKEN}
    )
    assert done.returncode == 0, done.stderr
    assert s.requests[-1].headers.get("Authorization") == f"Bearer {TOKEN}"


def test_a_refused_token_is_one_line_without_the_token(stub, tmp_path: Path) -> None:
    s, server = stub
    s.token = "another-token"
    (tmp_path / "token").write_text(TOKEN)
    done = cluster_cli(
        "--prometheus", server.url, "--once", "--token-file", str(tmp_path / "token")
    )
    assert done.returncode == 1
    assert "HTTP 401: credentials refused" in done.stdout
    assert "Traceback" not in done.stderr and TOKEN not in done.stdout + done.stderr


def test_a_server_that_echoes_the_credentials_has_them_redacted(stub, tmp_path: Path) -> None:
    s, server = stub

    def echo(path: str, params: dict[str, str]) -> tuple[int, bytes]:
        header = s.requests[-1].headers.get("Authorization", "")
        answer = {"status": "error", "errorType": "bad_data", "error": f"rejected {header}"}
        return 400, json.dumps(answer).encode()

    s.raw = echo
    (tmp_path / "basic").write_text("alice:pa55word-xyz\n")
    done = cluster_cli(
        "--prometheus", server.url, "--once", "--basic-auth-file", str(tmp_path / "basic")
    )
    assert s.requests[-1].headers["Authorization"].startswith("Basic ")
    encoded = s.requests[-1].headers["Authorization"].split()[1]
    assert "bad_data: rejected ***" in done.stdout
    for secret in ("pa55word-xyz", encoded):
        assert secret not in done.stdout + done.stderr
    assert repr(Auth(token=TOKEN)).count(TOKEN) == 0


# ---------------------------------------------------------------------- TLS


@pytest.fixture
def https(tmp_path: Path) -> Iterator[tuple[Stub, PromStub, Path]]:
    made = self_signed(tmp_path)
    if made is None:
        pytest.skip("needs openssl to make a self-signed certificate")
    cert, key = made
    s = Stub(families=gpu_series("node-a", 1))
    server = PromStub(s, cert, key)
    yield s, server, cert
    server.close()


def test_a_bad_certificate_is_refused_unless_insecure(https, tmp_path: Path) -> None:
    s, server, cert = https
    s.token = TOKEN
    (tmp_path / "token").write_text(TOKEN)
    refused = cluster_cli(
        "--prometheus", server.url, "--once", "--token-file", str(tmp_path / "token")
    )
    assert refused.returncode == 1
    assert "TLS certificate not trusted" in refused.stdout and "--insecure" in refused.stdout
    assert s.requests == []  # the token never left: the handshake failed first
    insecure = cluster_cli(
        "--prometheus", server.url, "--once", "--insecure", "--token-file", str(tmp_path / "token")
    )
    assert insecure.returncode == 0, insecure.stdout + insecure.stderr
    assert "1 GPUs" in insecure.stdout
    trusted = cluster_cli(
        "--prometheus", server.url, "--once", "--ca-file", str(cert),
        "--token-file", str(tmp_path / "token"),
    )  # fmt: skip
    assert trusted.returncode == 0, trusted.stdout


# ---------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--prometheus", "ftp://x"], "not an http:// or https:// URL"),
        (["--prometheus", "http://u:p@x:9090"], "not in the URL"),
        (["--prometheus", "http://x", "--token-file", "/no/such/file"], "cannot read the token"),
        (["--prometheus", "http://x", "--match", 'job="x"'], "--match: expected"),
        (["--prometheus", "http://x", "--match", '{job="x" env="y"}'], "--match: expected ','"),
        (["--prometheus", "http://x", "--match", "{job=x}"], "--match: not a label matcher"),
        (["--prometheus", "http://x", "--timeout", "0"], "between 0.1 and 300"),
        (["--prometheus", "http://x", "--sort", "size"], "invalid choice"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: list[str], said: str) -> None:
    done = cluster_cli(*args, "--once")
    assert done.returncode == 2, done.stderr
    assert said in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr


def test_basic_auth_file_without_a_colon_is_refused(tmp_path: Path) -> None:
    (tmp_path / "basic").write_text("just-a-token\n")
    done = cluster_cli(
        "--prometheus", "http://x", "--once", "--basic-auth-file", str(tmp_path / "basic")
    )
    assert done.returncode == 2 and "USER:PASSWORD" in done.stderr
    assert "just-a-token" not in done.stderr


def test_the_cli_s_sorts_are_the_model_s() -> None:
    from gpuwatch.cli.cluster import SORTS as CLI_SORTS
    from gpuwatch.cluster.model import SORTS

    assert CLI_SORTS == SORTS


def test_matchers_go_into_every_query(stub) -> None:
    s, server = stub
    matchers = [*parse_matchers('{cluster="a", env=~"prod.*"}'), ("job", "=", 'gpu\\"s')]
    fetch(PromClient(server.url), matchers)
    queries = [r.params["query"] for r in s.requests if r.path == "/api/v1/query"]
    # Every family in one query (no job label matched): selected by name.
    (query,) = queries
    names = "|".join(f for f in FAMILIES if f not in ("gpuwatch_gpu_up", "up"))
    m = 'cluster="a",env=~"prod.*",job="gpu\\"s"'
    # gpuwatch_gpu_up and up, 1 but for a GPU NVML lost or a target down: only the others
    # are asked.
    assert query == (
        f'{{__name__=~"{names}",{m}}} or on(__name__) (gpuwatch_gpu_up{{{m}}} != 1)'
        f" or on(__name__) (up{{{m}}} != 1)"
    )


def test_row_figures_are_asked_of_the_targets_near_the_view_only(stub) -> None:
    s, server = stub
    other = {"gpu": "0", "host": "node.c", "instance": "node.c:9400", "pid": "77"}
    s.families = merge(
        gpu_series("node-a", 2),
        gpu_series("node.c", 2),
        gpu_series("nodeXc", 2),  # what node.c's regex would match unescaped
        {"gpuwatch_gpu_process_memory_bytes": [({**other, "user": "bob"}, 4 * GiB)]},
    )
    client = PromClient(server.url)
    c = Cluster()
    c.apply(fetch(client))
    assert all(g.util is not None for g in c.gpus.values())
    s.requests.clear()
    answers = fetch(client, near={"node.c:9400"})
    assert answers.near == {"node.c:9400"}
    queries = [r.params["query"] for r in s.requests if r.path == "/api/v1/query"]
    rows = [q for q in queries if "gpuwatch_gpu_utilization_ratio" in q]
    assert len(queries) == 2 and len(rows) == 1, queries
    (row,) = rows
    assert row.endswith(',instance=~"node\\\\.c:9400"}'), row  # a literal dot, PromQL-quoted
    for family in ROW_FAMILIES:
        assert family in row and all(family not in q for q in queries if q != row)
    c.apply(answers)
    # The targets near the view take their figures; the others' are cleared, never kept
    # from a refresh long ago; every GPU's memory is read as always.
    assert [(g.key, g.util is not None) for g in c.gpus.values()] == [
        ("node-a:0", False), ("node-a:1", False), ("node.c:0", True), ("node.c:1", True),
        ("nodeXc:0", False), ("nodeXc:1", False),
    ]  # fmt: skip
    assert [o.user for o in c.gpus["node.c:0"].others] == ["bob"]
    assert all(g.used is not None and g.temp is None for g in c.gpus.values() if g.host != "node.c")
    # A target with a quote, a backslash and regex syntax in its name is matched as typed.
    odd = 'q"[b]\\s*'
    s.families = merge(s.families, gpu_series(odd, 1))
    c.apply(fetch(client, near={f"{odd}:9400"}))
    assert [k for k, g in c.gpus.items() if g.util is not None] == [f"{odd}:0"]
    # No target near the view: no query of the row figures at all.
    s.requests.clear()
    c.apply(fetch(client, near=()))
    queries = [r.params["query"] for r in s.requests if r.path == "/api/v1/query"]
    assert len(queries) == 1 and "gpuwatch_gpu_power_watts" not in queries[0]
    assert all(g.power is None and not g.others for g in c.gpus.values())
    # Too many targets, or one a regex would have to escape beyond plain ASCII: all asked.
    for near in ({f"h{i}:1" for i in range(MAX_NEAR + 1)}, {"node-a:9400", "a b"}, {"né:1"}):
        s.requests.clear()
        answers = fetch(client, near=near)
        assert answers.near is None
        queries = [r.params["query"] for r in s.requests if r.path == "/api/v1/query"]
        assert len(queries) == 1 and "instance" not in queries[0]
        c.apply(answers)
        assert all(g.util is not None for g in c.gpus.values())


def test_a_job_label_matcher_splits_the_query_in_two(stub) -> None:
    s, server = stub
    s.families = merge(
        gpu_series("node-a", 2),
        rank_series("node-a", 0, 0, 11, {"forward": 5 * GiB}, slurm_job="42"),
    )
    answers = fetch(PromClient(server.url), parse_matchers('{slurm_job="42"}'))
    queries = [r.params["query"] for r in s.requests if r.path == "/api/v1/query"]
    gpu, proc = sorted(queries, key=lambda q: "slurm_job" in q)
    # A GPU series has no job labels: its families are asked without the job's matcher.
    assert "gpuwatch_gpu_memory_used_bytes" in gpu and "slurm_job" not in gpu
    assert gpu.split('"')[1].endswith("|gpuwatch_gpu_process_memory_bytes")
    assert gpu.endswith(" or on(__name__) (gpuwatch_gpu_up != 1) or on(__name__) (up != 1)")
    assert proc.endswith(',slurm_job="42"}') and "gpuwatch_process_step" in proc
    assert "gpuwatch_gpu_memory_used_bytes" not in proc
    # Each family gets its own series back, and only its own.
    assert not answers.errors and set(answers.series) == set(FAMILIES)
    assert len(answers.series["gpuwatch_gpu_memory_used_bytes"]) == 2
    assert [x.labels["rank"] for x in answers.series["gpuwatch_process_step"]] == ["0"]
    assert answers.series["gpuwatch_rank_info"] == []
    assert all(
        x.labels["__name__"] == family for family, got in answers.series.items() for x in got
    )


# ---------------------------------------------------------------------- hostile answers


def _raw(status: int, body: bytes):
    return lambda path, params: (status, body)


@pytest.mark.parametrize(
    ("status", "body", "said"),
    [
        (200, b"<html>proxy login</html>", "not Prometheus' JSON"),
        (502, b"bad gateway", "HTTP 502"),
        (200, b"[" * 100_000 + b"]" * 100_000, "not Prometheus' JSON"),
        (200, b'{"status": "success", "data": 5}', "has no data"),
        # JSON of another API (a proxy's, a service's) said as such, never "HTTP 200".
        (200, b'{"message": "ok", "items": []}', "JSON of another shape"),
        (200, b'{"status": "ok"}', "JSON of another shape"),
        (200, b'{"status": {"a": 1}, "data": {}}', "JSON of another shape"),
        (500, b'{"detail": "boom"}', "HTTP 500, JSON of another shape"),
        (200, b'{"status": "error"}', "HTTP 200"),  # Prometheus' error without a reason
        (
            200,
            b'{"status": "success", "data": {"resultType": "vector", "result": 3}}',
            "unexpected",
        ),
        (
            400,
            b'{"status":"error","errorType":"bad_data","error":"parse error\\n\\u001b[31m"}',
            "bad_data: parse error",
        ),
    ],
)
def test_hostile_answers_are_one_line(stub, status: int, body: bytes, said: str) -> None:
    s, server = stub
    s.raw = _raw(status, body)
    with pytest.raises(PromError) as caught:
        PromClient(server.url).query("up")
    text = str(caught.value)
    assert said in text and "\n" not in text and "\x1b" not in text
    if "shape" in said:
        assert "HTTP 200" not in text


def test_an_answer_over_the_size_cap_is_refused(stub, monkeypatch) -> None:
    s, server = stub
    monkeypatch.setattr(client_mod, "MAX_BYTES", 1000)
    s.raw = _raw(
        200, b'{"status":"success","data":{"resultType":"vector","result":[' + b" " * 5000 + b"]}}"
    )
    with pytest.raises(PromError, match="larger than"):
        PromClient(server.url).query("up")


def test_odd_series_are_dropped_not_fatal(stub) -> None:
    s, server = stub
    result = [
        {"metric": {"gpu": "0", "host": "ok"}, "value": [1.0, "5"]},
        {"metric": {"gpu": 0, "host": "x"}, "value": [1.0, "5"]},  # a label not a string
        {"metric": {"bad name": "1"}, "value": [1.0, "5"]},
        {"metric": {"gpu": "1"}, "value": [1.0, 5]},  # a value not a string
        {"metric": {"gpu": "2"}, "value": ["t", "5"]},
        {"metric": {"gpu": "3", "host": "y" * 5000}, "value": [1.0, "5"]},
        {"metric": {"gpu": "4"}, "value": [1.0, "NaN"]},
        "junk",
    ]
    body = json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}})
    s.raw = _raw(200, body.encode())
    got = PromClient(server.url).query("x")
    assert [dict(x.labels) for x in got] == [{"gpu": "0", "host": "ok"}, {"gpu": "4"}]
    cluster = Cluster()
    s.raw = None
    s.families["gpuwatch_gpu_memory_used_bytes"] = [({"gpu": "9", "host": "h"}, float("nan"))]
    cluster.apply(fetch(PromClient(server.url)))
    assert cluster.gpus["h:9"].used is None  # NaN is no byte count


def test_a_slow_server_times_out_in_one_line(stub) -> None:
    s, server = stub
    s.delay = 1.5
    client = PromClient(server.url, timeout=0.3)
    answers = fetch(client)
    assert set(answers.errors) == set(FAMILIES)
    # It gave up after the first queries in flight, not 9 x 0.3 s.
    assert sum(r.path == "/api/v1/query" for r in s.requests) <= QUERY_THREADS
    assert answers.seconds < 1.0
    assert "no answer within 0.3 s" in next(iter(answers.errors.values()))


def test_redirects_are_not_followed(stub) -> None:
    s, server = stub

    def moved(path: str, params: dict[str, str]) -> tuple[int, bytes]:
        return 302, b""

    s.raw = moved
    with pytest.raises(PromError, match="HTTP 302"):
        PromClient(server.url, Auth(token=TOKEN)).query("up")
    assert len(s.requests) == 1


# ---------------------------------------------------------------------- keep-alive


@pytest.fixture
def kept() -> Iterator[tuple[Stub, PromStub]]:
    """A server that keeps connections open between requests, as Prometheus does."""
    s = Stub(families=merge(gpu_series("node-a", 2), gpu_series("node-b", 1)))
    server = PromStub(s, keep_alive=True, idle_timeout=0.5)
    yield s, server
    server.close()


def test_refreshes_reuse_their_connections(kept) -> None:
    s, server = kept
    client = PromClient(server.url, Auth(token=TOKEN))
    for _ in range(3):
        answers = fetch(client)
        assert not answers.errors and answers.series["gpuwatch_gpu_memory_used_bytes"]
    asked = [r for r in s.requests if r.path == "/api/v1/query"]
    # Three refreshes over the connection of the first: no handshake per query.
    assert len(asked) == 3 and len({r.peer for r in asked}) == 1
    assert client.connections == 1
    # The token on every request, reused connection or not.
    assert all(r.headers.get("Authorization") == f"Bearer {TOKEN}" for r in asked)
    client.close()


def test_a_connection_the_server_closed_while_idle_is_replaced(kept) -> None:
    s, server = kept
    client = PromClient(server.url)
    assert client.query("gpuwatch_gpu_up")
    # Past the server's idle timeout: it closed the kept connection.
    assert wait_for(lambda: not server._open)
    assert len(client.query("gpuwatch_gpu_up")) == 3
    assert client.connections == 2
    assert len({r.peer for r in s.requests}) == 2


def test_an_answer_over_the_size_cap_drops_its_connection(kept, monkeypatch) -> None:
    s, server = kept
    monkeypatch.setattr(client_mod, "MAX_BYTES", 1000)
    s.raw = _raw(
        200, b'{"status":"success","data":{"resultType":"vector","result":[' + b" " * 5000 + b"]}}"
    )
    client = PromClient(server.url)
    with pytest.raises(PromError, match="larger than"):
        client.query("up")
    s.raw = None
    assert len(client.query("gpuwatch_gpu_up")) == 3  # a new connection, not the unread rest
    assert client.connections == 2


def test_a_redirect_on_a_kept_connection_is_not_followed(kept) -> None:
    s, server = kept
    s.raw = lambda path, params: (302, b"")
    client = PromClient(server.url, Auth(token=TOKEN))
    for _ in range(2):
        with pytest.raises(PromError, match="HTTP 302"):
            client.query("up")
    assert len(s.requests) == 2


def test_a_timeout_is_not_retried(kept) -> None:
    s, server = kept
    client = PromClient(server.url, timeout=0.3)
    assert client.query("gpuwatch_gpu_up")
    s.delay = 1.0
    with pytest.raises(PromError, match=r"no answer within 0\.3 s"):
        client.query("gpuwatch_gpu_up")
    assert len(s.requests) == 2


def test_the_refresh_interval_follows_the_scrape_interval(stub) -> None:
    from gpuwatch.tui.cluster import refresh_interval

    s, server = stub
    client = PromClient(server.url)
    s.scrape_interval = "15s"
    assert client.scrape_interval() == 15
    s.scrape_interval = "1m30s"
    assert client.scrape_interval() == 90
    s.scrape_interval = "200ms"
    assert client.scrape_interval() == 0.2
    assert refresh_interval(0.2) == 1.0 and refresh_interval(15) == 15
    assert refresh_interval(None) == 5.0


def test_ranks_come_from_the_ranks_model(stub) -> None:
    s, server = stub
    s.families = merge(
        gpu_series("node-a", 2),
        rank_series("node-a", 0, 0, 101, {"forward": 2 * GiB, "backward": 3 * GiB}),
        rank_series("node-a", 1, 1, 102, {"forward": 2 * GiB, "backward": 6 * GiB}),
        rank_series("node-a", 1, 2, 103, {"forward": 2 * GiB, "backward": 3 * GiB}),
    )
    cluster = Cluster()
    cluster.apply(fetch(PromClient(server.url)))
    # No job labels (an exporter older than job_id): the host's ranks are one job.
    assert list(cluster.jobs) == ["host:node-a"]
    ranks = cluster.jobs["host:node-a"]
    assert [r.rank for r in ranks.rows] == [0, 1, 2]
    back = ranks.spread("backward")
    assert back is not None and back.max_rank == 1 and back.max_bytes == 6 * GiB
    assert [f.rank for f in ranks.flags] == [1]
    assert cluster.gpus["node-a:1"].ranks == (1, 2)
    assert cluster.worst_rank() == Worst("host:node-a", 1, "node-a", ranks.flags[0].text)
    assert "3 ranks" in cluster.summary()
    assert "worst rank 1 on node-a (host:node-a)" in cluster.summary()


def test_ranks_are_compared_within_their_job(stub) -> None:
    # Job A (Slurm, on two hosts) has a real outlier, rank 2; job B (a plain torchrun) is
    # balanced at a higher peak. Folded into one table, B's ranks were flagged, not A's.
    s, server = stub
    a = {"job_id": "slurm:4242.0", "slurm_job": "4242", "slurm_step": "0"}
    b = {"job_id": "torchrun:node-b:29500", "torch_run": "none"}
    s.families = merge(
        gpu_series("node-a", 2),
        gpu_series("node-b", 3),
        rank_series("node-a", 0, 0, 101, {"backward": 1 * GiB}, **a),
        rank_series("node-a", 1, 1, 102, {"backward": 1 * GiB}, **a),
        rank_series("node-b", 0, 2, 201, {"backward": 1.6 * GiB}, **a),
        rank_series("node-b", 1, 0, 202, {"backward": 2.6 * GiB}, **b),
        rank_series("node-b", 2, 1, 203, {"backward": 2.6 * GiB}, **b),
        # A 128-character phase name is cut, so the table keeps its width.
        rank_series("node-b", 2, 1, 203, {"p" * 128: 1 * GiB}, **b),
    )
    cluster = Cluster()
    cluster.apply(fetch(PromClient(server.url)))
    assert list(cluster.jobs) == ["slurm:4242.0", "torchrun:node-b:29500"]
    job_a, job_b = cluster.jobs.values()
    assert [(r.rank, r.host) for r in job_a.rows] == [(0, "node-a"), (1, "node-a"), (2, "node-b")]
    assert [f.rank for f in job_a.flags if f.kind == "above_median"] == [2]
    assert [r.rank for r in job_b.rows] == [0, 1] and job_b.flags == ()
    worst = cluster.worst_rank()
    assert worst is not None and (worst.job, worst.rank, worst.host) == (
        "slurm:4242.0",
        2,
        "node-b",
    )
    assert "5 ranks" in cluster.summary()
    assert "worst rank 2 on node-b (slurm:4242.0)" in cluster.summary()
    lines = ranks_lines(cluster)
    assert lines[0] == "job slurm:4242.0" and "job torchrun:node-b:29500" in lines
    b_table = lines[lines.index("job torchrun:node-b:29500") :]
    assert not [line for line in b_table if line.lstrip().startswith("!")], b_table
    assert max(len(line) for line in lines) < 120, lines


def test_last_figures_are_asked_only_for_down_targets_never_read_live(stub) -> None:
    s, server = stub
    s.families = merge(gpu_series("node-a", 1), gpu_series("node-b", 1))
    s.families["up"] = [
        ({"instance": "node-a:9400", "job": "gpuwatch"}, 1),
        ({"instance": "node-b:9400", "job": "gpuwatch"}, 0),
    ]
    client = PromClient(server.url)

    def last_queries() -> list[str]:
        return [r.params["query"] for r in s.requests if "last_over_time" in r.params["query"]]

    fetch(client)  # node-b is down: its last figures are asked, for it alone
    asked = last_queries()
    assert len(asked) == 3 and all("b:9400" in q and "node-a" not in q for q in asked), asked
    s.requests.clear()
    fetch(client, live={"node-b:9400"})  # the view had it live: its own figures stand
    assert last_queries() == []
    s.families["up"][1] = ({"instance": "node-b:9400", "job": "gpuwatch"}, 1)
    fetch(client)
    assert last_queries() == []  # nothing down, nothing more asked

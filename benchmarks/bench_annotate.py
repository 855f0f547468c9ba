"""Cost of gpuwatch's annotations on the training thread.

1. One ``with gpuwatch.phase(...)`` enter+exit. Cases: a dashboard listening (a real
   receiver in another process), none listening, and a stalled one (socket bound, never
   read). Anchor, measured in the same run: ``torch.profiler.record_function`` enter+exit.
   Target (issue 2): at most 4 us per pair on the CPU path in every case, i.e. at least 2.5x
   cheaper than the anchor. Pairs are timed in bursts of 200 with a 5 ms pause between
   bursts, as in training, where phases are separated by real work and the sender thread
   drains the queue in between.
   The same on the CUDA path where CUDA is present (issue 16): every boundary reads the
   caching allocator, one raw stats read per boundary *instant*. Cases: an isolated pair
   (target <= 14 us) and a back-to-back chain data -> forward -> backward -> optimizer.step
   -> zero_grad (target <= 8 us per phase); anchor: ``record_function`` on the same box.
   On the CPU the chain is printed too (a phase's cost there: <= 2 us).
2. The step-time overhead of the automatic phases (as ``gpuwatch run`` installs them: with
   module discovery) on the tiny-GPT sample's model, sized for a ~20 ms CPU step, with a
   dashboard listening. Blocks of steps with and without the hooks alternate (the order
   flips every round, so drift cancels); the figure is the median over rounds of the ratio
   of the two blocks' median step times (the CPU time the training process spends per step,
   all its threads, is shown beside it: it does not depend on what else the machine runs).
   Target (issue 7): at most 2%.

Run: python benchmarks/bench_annotate.py [--bursts N] [--rounds N] [--only pairs|auto]
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import gpuwatch  # noqa: E402
from gpuwatch.instrument import _api, _auto  # noqa: E402

BURST = 200
SAMPLE = ROOT / "samples" / "train_tiny_gpt.py"


def time_pairs(enter_exit, bursts: int) -> float:
    """Median microseconds per pair over ``bursts`` bursts."""
    per_burst = []
    for _ in range(bursts):
        start = time.perf_counter_ns()
        for _ in range(BURST):
            enter_exit()
        per_burst.append((time.perf_counter_ns() - start) / BURST / 1000)
        time.sleep(0.005)
    per_burst.sort()
    return per_burst[len(per_burst) // 2]


def gpuwatch_pair():
    p = gpuwatch.phase("forward")

    def run() -> None:
        with p:
            pass

    return run


CHAIN = ("data", "forward", "backward", "optimizer.step", "zero_grad")


def gpuwatch_chain():
    phases = [gpuwatch.phase(name) for name in CHAIN]

    def run() -> None:
        for p in phases:
            with p:
                pass

    return run


def record_function_chain():
    import torch

    def run() -> None:
        for name in CHAIN:
            with torch.profiler.record_function(name):
                pass

    return run


def record_function_pair():
    import torch

    def run() -> None:
        with torch.profiler.record_function("forward"):
            pass

    return run


def start_receiver(path: str) -> subprocess.Popen:
    code = (
        "import sys, time\n"
        "from gpuwatch.session import Session\n"
        "from gpuwatch.sources.annotations import AnnotationReceiver\n"
        f"rx = AnnotationReceiver(Session(), {path!r}); rx.start()\n"
        "print('ready', flush=True)\n"
        "sys.stdin.read()\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def auto_overhead(path: str, rounds: int, block: int, size: dict[str, int]) -> bool:
    """Step time of the sample's loop with and without the automatic phases, interleaved."""
    import importlib.util
    import statistics

    import torch

    torch.set_num_threads(1)  # a shared 2-core machine: one compute thread, less noise
    spec = importlib.util.spec_from_file_location("train_tiny_gpt", SAMPLE)
    assert spec is not None and spec.loader is not None
    sample = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sample)
    torch.manual_seed(0)
    model = sample.TinyGPT(
        size["vocab"], size["seq"], size["layers"], size["hidden"], size["heads"]
    )
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)

    def step() -> int:
        # The sample's loop without its manual phases: what a plain script does.
        start = time.perf_counter_ns()
        tokens = torch.randint(0, size["vocab"], (size["batch"], size["seq"] + 1))
        loss = model(tokens[:, :-1], tokens[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return time.perf_counter_ns() - start

    def run_block(hooked: bool) -> tuple[float, float]:
        """(median wall ns, mean process CPU ns) per step, the block's first step left out."""
        if hooked:
            _auto.install(discover=True)
        try:
            step()  # the first step of a block settles caches (and ends discovery)
            cpu0 = time.process_time_ns()
            times = [step() for _ in range(block)]
            cpu = (time.process_time_ns() - cpu0) / block
        finally:
            if hooked:
                _auto.uninstall()
        return statistics.median(times), cpu

    rx = start_receiver(path)
    client = _api._state.client
    try:
        gpuwatch.configure(socket=path)
        for _ in range(3):
            run_block(False)
            run_block(True)
        sent0 = client.sent
        plain, hooked, ratios, cpu_ratios = [], [], [], []
        for r in range(rounds):
            first = r % 2 == 0
            a = run_block(first)
            b = run_block(not first)
            with_, without = (a, b) if first else (b, a)
            plain.append(without[0])
            hooked.append(with_[0])
            ratios.append(with_[0] / without[0])
            cpu_ratios.append(with_[1] / without[1])
        time.sleep(0.1)
        delivered = client.sent - sent0
    finally:
        rx.stdin.close()  # type: ignore[union-attr]
        rx.wait(timeout=10)
    overhead = statistics.median(ratios) - 1
    ok = overhead <= 0.02
    print(
        f"automatic phases, tiny-GPT sample on the CPU ({size['layers']} layers, hidden "
        f"{size['hidden']}, batch {size['batch']}x{size['seq']}), {rounds} rounds of "
        f"{block} steps each way:"
    )
    print(f"  step without gpuwatch: {statistics.median(plain) / 1e6:7.2f} ms (median)")
    print(f"  step with auto phases: {statistics.median(hooked) / 1e6:7.2f} ms (median)")
    q = statistics.quantiles(ratios, n=4)
    print(
        f"  overhead: {overhead * 100:+.2f}% (median of per-round ratios; quartiles "
        f"{(q[0] - 1) * 100:+.2f}% .. {(q[2] - 1) * 100:+.2f}%), events delivered {delivered}"
    )
    cpu_overhead = statistics.median(cpu_ratios) - 1
    print(
        f"  CPU time of the training process (all its threads, the sender's included): "
        f"{cpu_overhead * 100:+.2f}% per step"
    )
    print(f"target <= 2% step-time overhead: {'PASS' if ok else 'FAIL'} ({overhead * 100:+.2f}%)")
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bursts", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=30, help="interleaved rounds (auto phases)")
    ap.add_argument("--block", type=int, default=12, help="steps per block (auto phases)")
    ap.add_argument("--only", choices=("pairs", "auto"), help="run one of the two benchmarks")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--batch", type=int, default=7)
    ap.add_argument("--vocab", type=int, default=512)
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="gw-bench-")
    os.chmod(tmp, 0o700)
    path = os.path.join(tmp, "gw.sock")
    if args.only != "auto":
        pairs(args, path)
    if args.only != "pairs":
        size = {k: getattr(args, k) for k in ("layers", "hidden", "heads", "seq", "batch", "vocab")}
        auto_overhead(path, args.rounds, args.block, size)
    return 0


def pairs(args: argparse.Namespace, path: str) -> None:
    """Benchmark 1: one phase enter+exit (see the module docstring)."""
    client = _api._state.client
    results: dict[str, float] = {}

    anchor = time_pairs(record_function_pair(), args.bursts)

    gpuwatch.configure(socket=path)
    results["absent"] = time_pairs(gpuwatch_pair(), args.bursts)

    rx = start_receiver(path)
    try:
        gpuwatch.configure(socket=path)
        sent0 = client.sent
        results["listening"] = time_pairs(gpuwatch_pair(), args.bursts)
        time.sleep(0.1)
        delivered = client.sent - sent0
    finally:
        rx.stdin.close()  # type: ignore[union-attr]
        rx.wait(timeout=10)

    stalled = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    if os.path.exists(path):
        os.unlink(path)
    stalled.bind(path)
    gpuwatch.configure(socket=path)
    results["stalled"] = time_pairs(gpuwatch_pair(), args.bursts)
    stalled.close()

    print(f"gpuwatch.phase enter+exit, CPU path, median of {args.bursts} bursts of {BURST}:")
    print(f"  anchor torch.profiler.record_function: {anchor:6.2f} us/pair")
    worst = 0.0
    for case, us in results.items():
        worst = max(worst, us)
        print(
            f"  gpuwatch, dashboard {case:<9}:         {us:6.2f} us/pair "
            f"({anchor / us:4.1f}x cheaper than the anchor)"
        )
    print(f"  events delivered while listening: {delivered}, dropped in all: {client.dropped}")
    ok = worst <= 4.0 and anchor / worst >= 2.5
    print(
        f"target <= 4 us and >= 2.5x the anchor in every case: {'PASS' if ok else 'FAIL'} "
        f"(worst {worst:.2f} us, ratio {anchor / worst:.1f}x)"
    )
    chain = time_pairs(gpuwatch_chain(), args.bursts) / len(CHAIN)
    chain_anchor = time_pairs(record_function_chain(), args.bursts) / len(CHAIN)
    print(
        f"  chain {' -> '.join(CHAIN)}: {chain:.2f} us per phase "
        f"(record_function {chain_anchor:.2f} us, {chain_anchor / chain:.1f}x cheaper); "
        f"target <= 2 us: {'PASS' if chain <= 2.0 else 'FAIL'}"
    )
    if os.path.exists(path):
        os.unlink(path)
    cuda_rows(args)


def cuda_rows(args: argparse.Namespace) -> None:
    """The CUDA path: pairs and a chain on a device, against record_function there."""
    import torch

    if not torch.cuda.is_available():
        print("CUDA path: not measured here (no CUDA device)")
        return
    torch.zeros(1, device="cuda")  # CUDA initialised: every boundary reads the allocator
    gpuwatch.configure(socket=os.path.join(tempfile.mkdtemp(), "none.sock"))
    _api._state.memory.check_active()
    pair = time_pairs(gpuwatch_pair(), args.bursts)
    anchor = time_pairs(record_function_pair(), args.bursts)
    chain = time_pairs(gpuwatch_chain(), args.bursts) / len(CHAIN)
    chain_anchor = time_pairs(record_function_chain(), args.bursts) / len(CHAIN)
    name = torch.cuda.get_device_name()
    print(f"CUDA path on {name} (torch {torch.__version__}):")
    print(
        f"  isolated pair: {pair:6.2f} us (record_function {anchor:.2f} us, ratio "
        f"{pair / anchor:.2f}x); target <= 14 us: {'PASS' if pair <= 14 else 'FAIL'}"
    )
    print(
        f"  chain: {chain:6.2f} us per phase (record_function {chain_anchor:.2f} us, ratio "
        f"{chain / chain_anchor:.2f}x); target <= 8 us: {'PASS' if chain <= 8 else 'FAIL'}"
    )


if __name__ == "__main__":
    sys.exit(main())

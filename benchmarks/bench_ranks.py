"""Each rank's predicted peak per phase against its truth, under DDP, FSDP2 and ZeRO
(issue 26).

The cases of ``tests/support/ranks_cases.py``: a 12-block MLP (25.2 M parameters) and a
Llama-style HF causal LM trained with AdamW for three steps as two real ranks (gloo on the
CPU, spawned processes) under DDP, DDP with ``gradient_as_bucket_view=True``, FSDP2 and
FSDP2 without
``reshard_after_forward``, FSDP2 with LoRA adapters on frozen blocks, FSDP2 with one unit of
two modules (``fully_shard([norm, output])``), FSDP1 FULL_SHARD and SHARD_GRAD_OP,
DeepSpeed ZeRO stages 1-3 (where ``deepspeed`` is installed; skipped otherwise), and as
rank 0 of an 8-rank FSDP2 job, plain or LoRA (torch's fake process group).
The truth is torch.profiler's allocator events (``tests/support/profmem.py``), peaked inside
each phase; under ZeRO and FSDP1 each collective waits for gloo's worker to let go of its
tensors (``settle_collectives``), so that their frees are seen. Printed: rank x step x
phase x (truth, predicted, ratio), and as the anchor, the same run predicted without the
layout's buffers (the facts' ``parallel`` part left out: what gpuwatch showed before).
PASS when every phase is within 10%.

Run: python benchmarks/bench_ranks.py [case ...]
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "support"))

from ranks_cases import CASES, run_case, table  # noqa: E402

from gpuwatch.predict import predict, total  # noqa: E402

TOLERANCE = 0.10


def _mib(n: float) -> str:
    return f"{n / 2**20:8.1f}"


def main(names: list[str]) -> int:
    failed = 0
    print(f"{'case':16} rank step {'phase':15} {'truth':>8} {'pred':>8} ratio  {'anchor':>8} ratio")
    for name in names:
        worst = 0.0
        anchor_worst = 0.0
        for r in run_case(name):
            facts = dict(r["facts"])
            facts.pop("parallel", None)
            bare = predict(facts)
            for step, phase, truth, pred in table(r):
                old = total(bare.phases[phase, step == 1].peak)
                ratio, old_ratio = pred / truth, old / truth
                worst = max(worst, abs(ratio - 1))
                anchor_worst = max(anchor_worst, abs(old_ratio - 1))
                print(
                    f"{name:16} {r['rank']:4} {step:4} {phase:15} {_mib(truth)} {_mib(pred)}"
                    f" {ratio:5.2f}  {_mib(old)} {old_ratio:5.2f}"
                )
        verdict = "PASS" if worst <= TOLERANCE else "FAIL"
        failed += verdict == "FAIL"
        print(
            f"{name}: worst phase {worst:.1%} off (anchor, without the layout:"
            f" {anchor_worst:.1%}) {verdict}"
        )
    return 1 if failed else 0


def _default_cases() -> list[str]:
    """Every case, less the ZeRO ones where DeepSpeed is not installed (said so)."""
    import importlib.util

    if importlib.util.find_spec("deepspeed") is not None:
        return list(CASES)
    print("deepspeed not installed: the ZeRO cases are skipped")
    return [n for n in CASES if CASES[n]["layout"] != "zero"]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or _default_cases()))

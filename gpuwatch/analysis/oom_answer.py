"""What would have fitted: an out-of-memory error's run, re-planned from its facts.

The plan of the process that failed (``predict.plan_from_facts``: its model, batch and
settings as its facts say them), with what it asked for beyond the prediction carried
into the phase it failed in (an out-of-memory error's allocated plus requested bytes,
scaled under a change as that phase's predicted activations are), on the GPU it ran on.
``gpuwatch estimate --from`` starts from it, ``info`` and the dashboard's ✖ answer with it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from ..fmt import fmt_bytes
from ..predict import Answer, Plan, answer, plan_from_facts, rank_estimate
from ..session import Session
from ..session.model import Device, Oom

PHASES = ("forward", "backward", "optimizer.step", "eval")
"""Phases whose recorded demand can be carried into the plan (they have activations)."""

RESERVE = 1 << 30
"""What of each GPU torch cannot have (the CUDA context, NCCL), as ``--reserve``."""


@dataclass
class Recorded:
    """A recorded run's plan, its error and its GPU.

    Attributes:
        pid: The process planned (the one that failed, where one did).
        plan: Its plan, the recorded excess carried.
        recorded: Its plan as the facts say, nothing carried.
        oom: The out-of-memory error, if any.
        phase, demand: The error's phase and its allocated plus requested bytes.
        gpu, gpu_total: The GPU's name and memory ("" and 0: none recorded).
        assumed: What the plan assumed, one line each.
    """

    pid: int
    plan: Plan
    recorded: Plan
    oom: Oom | None
    phase: str
    demand: int
    gpu: str
    gpu_total: int
    assumed: list[str] = field(default_factory=list)


def recorded_plan(session: Session, oom: Oom | None = None) -> Recorded:
    """The plan of ``oom``'s process (default: the first error's, else the first process
    that sent facts).

    Raises:
        ValueError: No facts to plan from (the message is one line for the user).
    """
    pid, facts, oom, gpu = session.read(lambda: _recorded_inputs(session, oom))
    plan, assumed = plan_from_facts(facts)
    recorded = plan
    body = oom.body if oom is not None and isinstance(oom.body, dict) else {}
    phase = str(body.get("phase") or "")
    allocated, requested = body.get("allocated"), body.get("requested")
    demand = sum(max(v, 0) for v in (allocated, requested) if isinstance(v, int))
    if oom is not None and phase in PHASES:
        steady = rank_estimate(plan).prediction.phases[phase, False].peak
        excess = demand - sum(steady.values())
        if excess > 0:
            plan = replace(
                plan, excess=excess, excess_phase=phase, excess_per=steady.get("activations", 0)
            )
            assumed.append(
                f"its out-of-memory error in {phase}: {fmt_bytes(demand)} asked for (allocated"
                f" + requested), {fmt_bytes(excess)} beyond the prediction: carried as"
                " recorded_excess, scaled as the phase's activations"
            )
    return Recorded(
        pid=pid,
        plan=plan,
        recorded=recorded,
        oom=oom,
        phase=phase,
        demand=demand,
        gpu=(gpu.name or "recorded GPU") if gpu is not None else "",
        gpu_total=int(gpu.total or 0) if gpu is not None else 0,
        assumed=assumed,
    )


def _recorded_inputs(
    session: Session, oom: Oom | None
) -> tuple[int, dict[str, Any], Oom | None, Device | None]:
    """What :func:`recorded_plan` plans from, read of the session at once (the plan itself
    is made without its lock): the pid, its facts, the error, the first GPU with a total."""
    ooms = list(session.ooms)
    procs = [(pid, p) for pid, p in session.processes.items() if isinstance(p.facts, dict)]
    if not procs:
        raise ValueError("no process sent facts (gpuwatch.watch)")
    if oom is None:
        oom_pids = {o.pid for o in ooms}
        pid, proc = next(((pid, p) for pid, p in procs if pid in oom_pids), procs[0])
        oom = next((o for o in ooms if o.pid == pid), None)
    else:
        found = next(((pid, p) for pid, p in procs if pid == oom.pid), None)
        if found is None:
            raise ValueError(f"pid {oom.pid} sent no facts (gpuwatch.watch)")
        pid, proc = found
    # The model that ran out of memory, not one a notebook built after it.
    facts = proc.facts_at(oom.t) if oom is not None else proc.facts
    if not isinstance(facts, dict):
        raise ValueError(f"pid {pid}: the facts of the model that failed were not kept")
    gpu = next((d for d in session.devices.values() if d.kind == "gpu" and d.total), None)
    return pid, facts, oom, replace(gpu) if gpu is not None else None


def oom_answer(session: Session, oom: Oom) -> Answer | None:
    """What would have made ``oom``'s run fit on its GPU, or None where it cannot be
    planned (no facts, no GPU's memory recorded, a plan the layout cannot take)."""
    try:
        rec = recorded_plan(session, oom)
        if not rec.gpu_total:
            return None
        return answer(rec.plan, max(rec.gpu_total - RESERVE, 0), rec.gpu)
    except ValueError:
        return None


def answer_line(ans: Answer, short: bool = False) -> str:
    """One line: the cheapest change that fits (or the closest), with its peak (``short``:
    the change's flags only, for a status line's few cells)."""
    fitting = [c for c in ans.changes if c.peak_bytes <= ans.usable]
    if ans.fits:
        return f"planned, it fits ({fmt_bytes(ans.headroom)} to spare): no change needed"
    if not ans.changes:
        return "no change found that fits"
    best = fitting[0] if fitting else ans.changes[0]
    if short:
        return f"{best.flags} {'fits' if fitting else 'is closest'}"
    state = "fits" if fitting else "closest, does not fit"
    more = f" (+{len(fitting) - 1} more)" if len(fitting) > 1 else ""
    return (
        f"would have fitted: {best.flags}, peak {fmt_bytes(best.peak_bytes)} of"
        f" {fmt_bytes(ans.usable)} ({state}){more}"
    )

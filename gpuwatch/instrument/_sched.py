"""The scheduler's identity of this process: Slurm's job and step, Kubernetes' pod and
job, torchrun's run.

Read once from the environment (and, in a Kubernetes pod without the downward API's
variables, from the service account's namespace file) and sent in every ``hello`` under
``scheduler`` (``docs/protocol.md``); the exporter makes labels of it
(``docs/prometheus.md``). Every value is cut and cleaned to a label's characters here
(:func:`gpuwatch.protocol.label_text`), so a hostile variable cannot make the hello
invalid; the receiver checks it again. Nothing here raises.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

from ..protocol import label_text

SOURCES: dict[str, tuple[str, ...]] = {
    "slurm_job": ("SLURM_JOB_ID", "SLURM_JOBID"),
    "slurm_step": ("SLURM_STEP_ID", "SLURM_STEPID"),
    "slurm_procid": ("SLURM_PROCID",),
    "slurm_nodelist": ("SLURM_JOB_NODELIST", "SLURM_NODELIST"),
    # The downward API's variables, as a pod spec names them (``docs/prometheus.md``):
    # POD_NAME is the common name, MY_POD_NAME the Kubernetes documentation's example.
    "k8s_namespace": ("POD_NAMESPACE", "MY_POD_NAMESPACE"),
    "k8s_pod": ("POD_NAME", "MY_POD_NAME"),
    # The Job that owns the pod: the downward API's ``metadata.labels['job-name']`` as the
    # pod spec names it (docs/prometheus.md); else derived from an Indexed Job's pod name.
    "k8s_job": ("K8S_JOB_NAME",),
    "job_name": ("GPUWATCH_JOB_NAME",),
    "torch_run": ("TORCHELASTIC_RUN_ID",),
}
"""Scheduler key -> the environment variables it is read from, the first set one wins."""

NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
"""Where a pod with a service account finds its namespace without the downward API."""


def scheduler_identity(
    env: Mapping[str, str] | None = None, namespace_file: str = NAMESPACE_FILE
) -> dict[str, str]:
    """The ``scheduler`` body of a hello: keys of :data:`SOURCES` that have a value.

    In a Kubernetes pod (``KUBERNETES_SERVICE_HOST`` is set) without ``POD_NAME``, the pod
    is the host name (a pod's host name is its name unless the spec sets another), and the
    namespace the service account's, when its file can be read. In an Indexed Job's pod
    (``JOB_COMPLETION_INDEX`` is set) without ``K8S_JOB_NAME``, the Job is the pod's name
    less its ``-INDEX-SUFFIX``. ``torch_master`` is the rendezvous ``MASTER_ADDR:MASTER_PORT``
    (a loopback address named by this host's name: another host's loopback rendezvous is
    another job), the identity of a torchrun run that sets no run id.
    """
    try:
        env = os.environ if env is None else env
        out: dict[str, str] = {}
        for key, names in SOURCES.items():
            value = next((env[n] for n in names if env.get(n)), "")
            if value:
                out[key] = label_text(value)
        if env.get("KUBERNETES_SERVICE_HOST"):
            if "k8s_pod" not in out:
                out["k8s_pod"] = label_text(socket.gethostname())
            if "k8s_namespace" not in out:
                namespace = _read_small(namespace_file)
                if namespace:
                    out["k8s_namespace"] = label_text(namespace)
            if "k8s_job" not in out and out.get("k8s_pod"):
                out["k8s_job"] = label_text(_indexed_job(out["k8s_pod"], env))
        master = _master(env)
        if master:
            out["torch_master"] = label_text(master)
        return {k: v for k, v in out.items() if v}
    except Exception:  # a broken environment costs the labels, never the run
        return {}


LOOPBACK = ("localhost", "127.0.0.1", "::1", "0.0.0.0", "::")


def _master(env: Mapping[str, str]) -> str:
    """``MASTER_ADDR:MASTER_PORT``, a loopback address as this host's name; "" if unset."""
    addr, port = env.get("MASTER_ADDR", "").strip(), env.get("MASTER_PORT", "").strip()
    if not addr or not port:
        return ""
    if addr.lower() in LOOPBACK or addr.startswith("127."):
        addr = socket.gethostname()
    return f"{addr}:{port}"


def _indexed_job(pod: str, env: Mapping[str, str]) -> str:
    """The Job of an Indexed Job's pod ``JOB-INDEX-SUFFIX`` (its host name ``JOB-INDEX``);
    "" when the pod is not one or its name does not have that form."""
    index = env.get("JOB_COMPLETION_INDEX", "")
    if not index.isdigit():
        return ""
    for tail in (f"-{index}-", f"-{index}"):
        head, found, rest = pod.rpartition(tail)
        if found and head and ("-" not in rest if tail.endswith("-") else not rest):
            return head
    return ""


def _read_small(path: str) -> str:
    """The first line of a small file, or "" when it cannot be read."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read(256).strip().splitlines()[0]
    except (OSError, IndexError):
        return ""

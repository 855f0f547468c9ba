"""The host as a device: RAM, and the RSS of every instrumented process.

This is what a machine without a GPU shows, and the only memory figure a CPU-only training
script gets (the script itself sends none on the CPU).
"""

from __future__ import annotations

import os
import socket
import threading
import time

import psutil

from ..session import Session
from .children import ChildWatch
from .gpu import describe_pid
from .procstat import CpuMeter, Reader

CPU_EVERY = 1.0
"""Seconds a process's CPU % is taken over (and held between): over 0.1 s a CPU time in
10 ms ticks would jump by 10 points."""

LOAD_INTERVAL = 1.0
"""Seconds between reads of the CPU, load and swap figures of the host's samples."""


class HostSampler:
    """Samples host memory and instrumented processes' RSS on a background thread.

    A tick that fails is counted (:attr:`failed`) and said in a note: the first when it
    happens, the total at stop if more followed. The next tick tries again.

    Args:
        session: Where samples go.
        interval: Seconds between samples.
    """

    def __init__(self, session: Session, interval: float = 0.1) -> None:
        self.session = session
        self.interval = interval
        self._stat = Reader()  # the running processes' /proc files, kept open
        self._described: set[int] = set()  # pids given a description here
        self._denied: set[int] = set()  # pids whose RSS cannot be read (another user's)
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._load_row: dict[str, float | int | None] | None = None
        self._load_at = 0.0
        self._cpu = CpuMeter(every=CPU_EVERY)
        # A DataLoader's workers, for the Processes tab's tree.
        self._children = ChildWatch(describe_pid, session.set_proc_info)
        self.failed = 0  # ticks that raised

    def start(self) -> None:
        """Register the host device and start sampling."""
        vm = psutil.virtual_memory()
        self.session.ensure_host(socket.gethostname(), int(vm.total))
        self._thread = threading.Thread(target=self._run, name="gpuwatch-host", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop sampling."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        if self.failed > 1:
            self.session.note(f"{self.failed} host samples failed in all")
        if self._thread is None or not self._thread.is_alive():
            self._stat.close()

    def gone(self, pid: int) -> bool:
        """True once instrumented process ``pid`` was found to have exited (or its RSS
        cannot be read: it is not sampled again)."""
        proc = self.session.processes.get(pid)
        return pid in self._denied or (proc is not None and proc.gone is not None)

    def _run(self) -> None:
        next_t = time.monotonic()
        while not self._stop.is_set():
            try:
                self.sample_once()
            except Exception as exc:  # one bad tick: the next one tries again
                self.failed += 1
                if self.failed == 1:
                    self.session.note(
                        f"a host sample failed ({type(exc).__name__}: {str(exc)[:200]}); "
                        "later failures are counted, the total said at stop"
                    )
            next_t += self.interval
            delay = next_t - time.monotonic()
            if delay < 0:  # fell behind: do not try to catch up in a burst
                next_t = time.monotonic()
                delay = 0
            self._stop.wait(delay)

    def _load(self) -> dict[str, float | int | None]:
        """CPU busy, the load average and swap (None: unknown here), read anew once a
        second (:data:`LOAD_INTERVAL`) and held in between: they move slowly, and reading
        them costs more than the memory figure the tick is for."""
        now = time.monotonic()
        if self._load_row is not None and now - self._load_at < LOAD_INTERVAL:
            return self._load_row
        # The first call only starts psutil's count: busy since then is known a second on.
        first = self._load_row is None
        self._load_at = now
        cpu = psutil.cpu_percent(None)
        out: dict[str, float | int | None] = {"cpu": None if first else cpu}
        try:
            out["load1"] = os.getloadavg()[0]
        except OSError:  # no load average on this system
            out["load1"] = None
        try:
            swap = psutil.swap_memory()
            out["swap_used"], out["swap_total"] = int(swap.used), int(swap.total)
        except (OSError, RuntimeError):  # psutil raises these where /proc hides swap
            pass
        self._load_row = out
        return out

    def sample_once(self) -> None:
        """Take one host sample and one RSS sample per live instrumented process."""
        t = time.monotonic_ns()
        vm = psutil.virtual_memory()
        self.session.add_host_sample(
            {
                "t": t,
                "total": int(vm.total),
                "used": int(vm.total - vm.available),
                "available": int(vm.available),
                # The session's row type says int; a figure unknown here is None.
                **self._load(),  # type: ignore[dict-item]
            }
        )
        # Only the processes that may still run: a sweep of thousands of short scripts
        # leaves thousands that ended, and a look at each would cost every tick.
        running = self.session.running()
        if self._denied:  # those that ended are forgotten here too
            self._denied &= {p.pid for p in running}
        looked = set()
        now = time.monotonic()
        for proc in running:
            pid = proc.pid
            if pid in self._denied:
                continue
            looked.add(pid)
            if pid not in self._described:
                self._described.add(pid)
                if pid not in self.session.proc_info:
                    # Its user and command line for the Processes tab: NVML lists only
                    # processes on a GPU (not the command on a CPU, nor one not yet on
                    # its device).
                    self.session.set_proc_info(pid, describe_pid(pid))
            try:
                # One read gives the RSS and the CPU time (psutil: a file each, opened anew).
                st = self._stat.read(pid)
            except PermissionError:
                self._denied.add(pid)
                continue
            if st is None:
                # Ended without a bye (killed, or its bye lost): the session settles it.
                self.session.process_gone(pid, time.monotonic_ns())
                continue
            cpu = self._cpu.update(pid, st.cpu, now)
            self.session.add_rss(pid, time.monotonic_ns(), st.rss, cpu)
        self._children.update(looked, self.session.proc_info.get)
        if len(self._described) > len(looked):  # those that said bye or ended
            self._described &= looked
            self._stat.keep(looked)
            self._cpu.keep(looked)

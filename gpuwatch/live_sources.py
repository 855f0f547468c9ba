"""The live sources of one gpuwatch process, started and stopped together.

Used by the dashboard, ``gpuwatch record`` and ``gpuwatch run``: the annotation receiver,
the host sampler and the NVML sampler all fill one :class:`~gpuwatch.session.Session`;
the recorder and the Prometheus exporter (``--prometheus``) read it.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .session import Session
from .sources.annotations import AnnotationReceiver, SocketError, SocketInUse, lock_owner
from .sources.host import HostSampler
from .sources.views import ViewError, ViewFeed, ViewHub

if TYPE_CHECKING:  # imported when started: the dashboard's first frame does not wait on them
    from .analysis.forecast import Foresight
    from .prometheus import MetricsServer
    from .sources.gpu_process import GpuProcess
    from .store.recorder import Recorder

TAKEOVER_LIMIT = 15.0
"""Seconds a view tries to take a quitting owner's socket over (the owner first records
what its senders sent, for up to relay.DRAIN_LIMIT), or to attach to whoever took it."""

RANKS_EVERY = 1.0
"""Seconds between two looks at the ranks for faults to mark (see :class:`RankMarks`)."""


class SourcesError(RuntimeError):
    """The live sources cannot start; ``str()`` is one line that says why and what to do."""


class LiveSources:
    """Everything that feeds a live session.

    The first gpuwatch on a socket owns it; a later one (``view=True``) attaches to the
    owner as a view (:mod:`gpuwatch.sources.views`) and takes over when the owner quits.

    Args:
        socket: Annotation socket path (None: the default per-user path).
        interval: NVML sampling interval in seconds.
        view: Where another gpuwatch owns the socket, attach to it (else refuse).
    """

    def __init__(
        self, socket: str | None = None, interval: float = 0.1, *, view: bool = True
    ) -> None:
        self.session = Session()
        self.session.bound()  # memory stays flat: the recording is the archive
        self.receiver = AnnotationReceiver(self.session, socket)
        self.host = HostSampler(self.session, interval=max(interval, 0.1))
        self.gpu: GpuProcess | None = None
        self.interval = interval
        self.recorder: Recorder | None = None  # while recording
        self.record_path: Path | None = None
        self._record: dict[str, Any] | None = None
        self.metrics: MetricsServer | None = None  # while serving
        self._metrics_at: tuple[str, int] | None = None
        self._ranks_stop = threading.Event()
        self._ranks: threading.Thread | None = None
        self.rank_check_failures = 0  # looks at the ranks that raised (the first is noted)
        self.foresight: Foresight | None = None  # once started
        self.may_view = view
        self.hub: ViewHub | None = None  # while the owner
        self.feed: ViewFeed | None = None  # while a view
        self.took_over_from: int | None = None  # the owner this one took over from
        self.view_ended: str | None = None  # a view that could not go on: one line
        self._mode = threading.Lock()  # stop() and a takeover, one at a time
        self._stopping = False

    def record_to(
        self,
        path: str | os.PathLike[str],
        *,
        label: str = "",
        overwrite: bool = False,
        optional: bool = False,
    ) -> None:
        """Record the session to ``path`` once started.

        Args:
            path: The recording to create.
            label: Its ``meta.label``.
            overwrite: Replace an existing file.
            optional: A file that cannot be created is a note in the session, not an error.
        """
        self.record_path = Path(path)
        self._record = {"label": label, "overwrite": overwrite, "optional": optional}

    def serve_metrics(self, host: str, port: int) -> None:
        """Serve Prometheus metrics on ``host:port`` once started (port 0: any free one)."""
        self._metrics_at = (host, port)

    @property
    def socket_path(self) -> str:
        return self.receiver.path

    def start(self) -> None:
        """Bind the socket and start sampling; or, another gpuwatch owning it, view it.

        Raises:
            SourcesError: The socket is taken by another program (or by a gpuwatch that
                serves no views, or ``view=False``) or its directory is unsafe.
        """
        taken = self._bind()
        if taken is not None:
            feed = ViewFeed(self.session, self.socket_path)
            try:
                if not self.may_view:
                    raise ViewError("views not asked for")
                feed.connect()
            except ViewError:
                raise SourcesError(f"{taken}. {self._advice_when_taken()}")
            self.feed = feed
            try:
                # After connect: the view's clock, the recording's too, is the owner's.
                self._start_metrics()
                if self._record is not None and not self._record["optional"]:
                    self._start_recorder()  # asked for by name: recorded through the view
            except SourcesError:
                feed.stop()
                raise
            feed.start(self._owner_gone)
            self._start_foresight(marks=False)  # the owner marks; the view shows its own
            return
        # After the socket (a second gpuwatch fails there), before the recorder (a port in
        # use leaves no file behind) and the samplers (nothing is missed).
        self._start_metrics()
        self._run_as_owner()

    def _bind(self) -> str | None:
        """Take the annotation socket; the refusal's text where another gpuwatch has it.

        Raises:
            SourcesError: Another program has it, or the path or directory is unsafe.
        """
        try:
            # Read at once: a sender may find the socket before the recorder and the
            # views are up, and must not find its queue full meanwhile.
            self.receiver.listen()
        except SocketInUse as exc:
            if str(exc).startswith("another gpuwatch"):
                return str(exc)
            raise SourcesError(str(exc))
        except SocketError as exc:
            raise SourcesError(str(exc))
        except OSError as exc:
            raise SourcesError(f"cannot listen on {self.receiver.path}: {exc.strerror or exc}")
        return None

    def _run_as_owner(self) -> None:
        """With the socket bound: record, serve views, receive and sample."""
        if self.recorder is None:
            self._start_recorder()
        self._publish_recording()
        self._serve_views()
        self.receiver.start()
        self.host.start()
        from .sources.gpu_process import GpuProcess

        self.gpu = GpuProcess(self.session, interval=self.interval)
        self.gpu.start()
        self._ranks = threading.Thread(target=self._mark_ranks, name="gpuwatch-ranks", daemon=True)
        self._ranks.start()
        # Shortfalls forecast before a phase runs are marked (recorded) by the owner only:
        # a view gets the owner's marks, a replay shows the marks its recording holds.
        self._start_foresight(marks=True)

    def _start_foresight(self, marks: bool) -> None:
        """Forecast on a thread of its own (once: a view that takes over starts marking)."""
        from .analysis.forecast import foresight

        self.foresight = foresight(self.session)
        self.foresight.marks = marks
        self.foresight.start()

    def _mark_ranks(self) -> None:
        """Mark a stray context or diverging step counters of a job's ranks once, when seen."""
        from .analysis.rank_feed import RankMarks

        marks = RankMarks()
        stopping = False
        while not stopping:
            # A last look when asked to stop: a fault the screen showed in the last second
            # is in the recording too.
            stopping = self._ranks_stop.wait(RANKS_EVERY)
            try:
                marks.check(self.session)
            except Exception as exc:  # tried again next time; the sources go on
                self.rank_check_failures += 1
                if self.rank_check_failures == 1:  # said once, not each second
                    self.session.note(
                        f"cannot look at the ranks for faults ({type(exc).__name__}): "
                        "their marks may be missing"
                    )

    def _start_metrics(self) -> None:
        if self._metrics_at is None:
            return
        from .prometheus import MetricsServer, host_port  # prometheus_client only if asked

        host, port = self._metrics_at
        server = MetricsServer(self.session, host, port, gone=self.host.gone)
        try:
            server.start()
        except OSError as exc:
            self.receiver.stop()
            reason = exc.strerror or str(exc)
            raise SourcesError(f"cannot serve metrics on {host_port(host, port)}: {reason}")
        self.metrics = server

    def _start_recorder(self) -> None:
        if self._record is None or self.record_path is None:
            return
        import sqlite3

        from .store import Recorder

        options = dict(self._record)
        optional = options.pop("optional")
        try:
            self.recorder = Recorder(self.session, self.record_path, **options)
        except (OSError, sqlite3.Error) as exc:
            message = (
                f"cannot record to {self.record_path}: {getattr(exc, 'strerror', None) or exc}"
            )
            if not optional:
                self.receiver.stop()
                if self.metrics is not None:
                    self.metrics.stop()
                raise SourcesError(message)
            self.session.note(f"not recording: {message}")
            self.record_path = None
            return
        self.recorder.start()

    # ------------------------------------------------------------------ a second gpuwatch

    def _recording_name(self) -> str | None:
        path = self.record_path if self.recorder is not None else None
        return str(path.resolve()) if path is not None else None

    def _serve_views(self) -> None:
        from .analysis.once import document

        hub = ViewHub(
            self.session,
            self.socket_path,
            recording=self._recording_name,
            once=lambda: document(self.session, f"gpuwatch pid {os.getpid()}"),
        )
        try:
            hub.start()
        except OSError as exc:
            self.session.note(
                f"cannot serve views on {hub.path} ({exc.strerror or exc}): a second "
                "gpuwatch on this socket will not attach"
            )
            return
        self.hub = hub

    def _owner_gone(self, feed: ViewFeed) -> None:
        """The owner viewed quit (or its stream ended): take the socket over, or view
        whoever took it; else the view ends, said in one line (:attr:`view_ended`)."""
        pid = feed.owner_pid
        deadline = time.monotonic() + TAKEOVER_LIMIT
        while time.monotonic() < deadline:
            with self._mode:
                if self._stopping:
                    return
                try:
                    taken = self._bind()
                except SourcesError as exc:
                    self._end_view(pid, feed.recording, str(exc))
                    return
                if taken is None:
                    self.feed, self.took_over_from = None, pid
                    self.session.note(f"the gpuwatch viewed (pid {pid}) quit: this one took over")
                    self._run_as_owner()
                    return
                if self._view_again(pid):
                    return
            time.sleep(0.05)
        self._end_view(pid, feed.recording, f"no gpuwatch took over in {TAKEOVER_LIMIT:.0f} s")

    def _view_again(self, pid: int | None) -> bool:
        """Another gpuwatch took the socket over first: view it instead."""
        feed = ViewFeed(self.session, self.socket_path)
        t_origin, wall = self.session.t_origin, self.session.wall_offset
        try:
            feed.connect()
        except ViewError:
            return False
        # One clock for every process of a machine: the new owner's origin may differ,
        # but the times it sends are on the same clock; the axis stays where it was.
        self.session.t_origin, self.session.wall_offset = t_origin, wall
        self.feed = feed
        self.session.note(
            f"the gpuwatch viewed (pid {pid}) quit: now a view of gpuwatch pid {feed.owner_pid}"
        )
        feed.start(self._owner_gone)
        return True

    def _end_view(self, pid: int | None, recording: str | None, why: str) -> None:
        where = f"; its recording: {recording}" if recording else ""
        self.view_ended = f"the gpuwatch viewed (pid {pid}) quit and {why}{where}"
        self.session.note(self.view_ended)

    def _publish_recording(self) -> None:
        path = self.record_path if self.recorder is not None else None
        self.receiver.announce(str(path.resolve()) if path is not None else None)

    def _advice_when_taken(self) -> str:
        """What to do instead of a second dashboard on a taken socket."""
        other = os.path.join(os.path.dirname(self.socket_path) or ".", "other.sock")
        separate = (
            f"for a separate dashboard, give this one its own socket: gpuwatch --socket {other} "
            f"(and GPUWATCH_SOCKET={other} for the scripts it should watch)"
        )
        _, path = lock_owner(self.socket_path)
        path = path or ""
        # The first gpuwatch wrote it, in a lock file of this user's; still, print only a
        # plain absolute path.
        if path.startswith("/") and len(path) <= 4096 and path.isprintable():
            import shlex

            return (
                "To watch its session, replay its recording as it grows: "
                f"gpuwatch replay {shlex.quote(path)}; {separate}"
            )
        return f"It records to no file; {separate}"

    def stop(self) -> None:
        """Stop every source and release the socket; finish the recording.

        The receiver first records what senders have sent (a few seconds at most, see
        :meth:`AnnotationReceiver.stop`): a second Ctrl-C meanwhile still finishes the file.
        Then the views are told the owner goes (one of them takes over).
        """
        with self._mode:
            self._stopping = True
        if self.feed is not None:
            self.feed.stop()
        self._ranks_stop.set()
        if self._ranks is not None:
            self._ranks.join(timeout=2)
        if self.foresight is not None:
            self.foresight.stop()
        if self.gpu is not None:
            self.gpu.stop()
        self.host.stop()
        try:
            self.receiver.stop()
        finally:
            if self.hub is not None:
                self.hub.stop()
            if self.metrics is not None:
                self.metrics.stop()
            if self.recorder is not None:
                self.recorder.close()

    def warning(self) -> str | None:
        """What the status bar must always show: a recording that stopped, else None."""
        if self.recorder is not None and self.recorder.error is not None:
            return f"NOT RECORDING ({self.recorder.cause})"
        if self.view_ended is not None:
            return "VIEW ENDED: " + self.view_ended
        return None

    def describe(self, *, warning: bool = True) -> str:
        """One line for the status bar: the recording first (a narrow terminal cuts the end,
        and scripts find the socket without reading it). ``warning=False``: a recording
        that stopped is left to :meth:`warning` (the dashboard shows it among its
        warnings, which never give way). A view says so first."""
        feed = self.feed
        if feed is not None:
            text = f"view of gpuwatch pid {feed.owner_pid}"
            if self.recorder is not None and self.recorder.error is None:
                text += f" · recording {self._home(str(self.record_path))}"
            elif feed.recording:
                text += f" · its recording {self._home(feed.recording)}"
            return text + f" · socket {self.socket_path}"
        if self.took_over_from is not None:
            return (
                f"took over from gpuwatch pid {self.took_over_from} · "
                + self._describe_owner(warning)
            )
        return self._describe_owner(warning)

    @staticmethod
    def _home(path: str) -> str:
        home = os.path.expanduser("~")
        return "~" + path[len(home) :] if path.startswith(home + os.sep) else path

    def _describe_owner(self, warning: bool) -> str:
        if self.recorder is not None and self.recorder.error is None:
            text = f"recording {self._home(str(self.record_path))}"
        elif self.recorder is not None:
            text = f"NOT RECORDING ({self.recorder.cause})" if warning else "not recording"
        else:
            text = "not recording"
        if self.metrics is not None:
            text += f" · metrics {self.metrics.url}"
        return text + f" · socket {self.socket_path}"


ONCE_WAIT = 3.0
"""Seconds ``gpuwatch --once`` samples NVML at most, without an owner to ask."""
CPU_WAIT = 0.7
"""Seconds ``--once`` waits past the first process lists for a second (CPU % between)."""


def read_once(socket: str | None = None, interval: float = 0.1) -> dict[str, Any]:
    """What ``gpuwatch --once`` prints: the owner's document (its session's figures,
    torch's included), or, where no gpuwatch owns the socket, one of NVML alone.

    The owner's answer is hostile: it is checked (:func:`~gpuwatch.analysis.once.clean`).
    """
    from . import protocol
    from .analysis.once import clean, document
    from .sources.gpu import GpuSampler
    from .sources.views import ask_once

    asked = ask_once(socket or protocol.socket_path())
    if asked is not None:
        return clean(asked)
    session = Session()
    sampler = GpuSampler(session, interval=max(interval, 0.05), process_interval=0.3)
    if sampler.start():
        deadline = time.monotonic() + ONCE_WAIT
        while time.monotonic() < deadline and not _listed(session, 1):
            time.sleep(0.05)
        # A second list (it is added when it changes) has CPU % over the time between.
        deadline = min(deadline, time.monotonic() + CPU_WAIT)
        while time.monotonic() < deadline and not _listed(session, 2):
            time.sleep(0.05)
    sampler.stop()
    return clean(document(session, "NVML"))


def _listed(session: Session, lists: int) -> bool:
    """Every GPU has a sample and ``lists`` process lists (one where it lists none)."""
    if not session.gpu:
        return False
    for key, table in session.gpu.items():
        procs = session.gpu_procs.get(key)
        if not len(table) or procs is None or not len(procs):
            return False
        snap = procs.snapshot()
        if snap["pid"].any() and len(set(snap["t"].tolist())) < lists:
            return False
    return True

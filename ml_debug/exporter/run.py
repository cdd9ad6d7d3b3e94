"""`mldebug exporter` running: two sampling threads and an HTTP server that serves their last values.

- The ranks thread samples this node every ``--interval`` with `mldebug top`'s node sampler and feeds
  `mldebug watch`'s Tracker, which decides stalls and stragglers exactly as watch does.
- The health thread runs `mldebug health --level 1` every ``--health-interval`` in a worker thread; a
  run that outlasts ``--health-timeout`` is reported hung, and no second run starts beside it (a hung
  NVML call would otherwise pile up threads).
- The HTTP server (prometheus_client's) answers each scrape from the last snapshot: it never waits
  for either thread.
"""

from __future__ import annotations

import errno
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ml_debug import __version__
from ml_debug.core import output
from ml_debug.core.errors import ExitCode, UsageError, first_line
from ml_debug.exporter import sources
from ml_debug.exporter.options import LISTEN_HINT, ExporterOptions
from ml_debug.exporter.result import (
    HEALTH,
    RANKS,
    RankValues,
    Snapshot,
    SourceHealth,
    health_values,
    progress_file_counts,
    rank_values,
    split_by_job,
)

SCHEMA = "mldebug.exporter"
SCHEMA_VERSION = 1

EXITED_KEEP_S = 120.0
"""How long a rank that exited stays in the Tracker (its peers' stall is judged sooner once one exits);
its series are dropped at once."""


class Exporter:
    """The state of one exporter: the last snapshot, and the threads that replace it."""

    def __init__(self, opts: ExporterOptions) -> None:
        self.opts = opts
        self.snapshot = Snapshot(node=socket.gethostname(), version=__version__)
        self.lock = threading.Lock()  # only between the two writers; a scrape reads self.snapshot unlocked
        self.stop = threading.Event()
        self.sampler: Any = None
        self.trackers: dict[str, Any] = {}  # job id -> watch's Tracker for that job's ranks
        self.threads: list[threading.Thread] = []

    def current(self) -> Snapshot:
        return self.snapshot

    def _source(self, name: str, **changes: Any) -> SourceHealth:
        with self.lock:
            health = replace(self.snapshot.sources[name], **changes)
            self.snapshot = self.snapshot.with_source(name, health)
        return health

    # -- ranks ------------------------------------------------------------------------------------------
    def sample_ranks(self) -> None:
        """One sample of this node's ranks, each job judged by its own Tracker, into the snapshot."""
        t0 = time.perf_counter()
        before = self.snapshot.sources[RANKS]
        try:
            if self.sampler is None:
                self.sampler = sources.make_sampler(self.opts)
            sample = self.sampler.sample()
            now = time.time()
            jobs = split_by_job(sample, list(self.sampler.processes), self.opts.job)
            for job_id in self.trackers.keys() - jobs.keys():  # no rank of it left: its ranks exit
                jobs[job_id] = replace(sample, ranks=[])
            ranks: list[RankValues] = []
            for job_id, job_sample in sorted(jobs.items()):
                tracker = self.trackers.get(job_id)
                if tracker is None:
                    tracker = self.trackers[job_id] = sources.make_tracker(self.opts)
                tracker.add_node(sources.NODE_LABEL, job_sample, now)
                tracker.evaluate(now)
                for line in tracker.take_events():
                    output.log(f"mldebug exporter: {line}" + (f" [job {job_id}]" if len(jobs) > 1 else ""))
                ranks += rank_values(tracker, job_sample, now, job_id=job_id, grace=self.opts.grace,
                                     is_exited=sources.is_exited)
            self._forget_exited(now)
            self.sampler.maintain()
        except Exception as e:  # one failed sample is an error counted and said, not a dead exporter
            self._source(RANKS, errors=before.errors + 1, last_error=first_line(e))
            output.log(f"mldebug exporter: sampling the ranks failed: {type(e).__name__}: {first_line(e)}")
            return
        with self.lock:
            health = replace(self.snapshot.sources[RANKS], samples=before.samples + 1, last_time=time.time(),
                             last_duration_s=round(time.perf_counter() - t0, 4), last_error=None)
            self.snapshot = replace(self.snapshot, ranks=tuple(ranks), progress_files=progress_file_counts(sample)
                                    ).with_source(RANKS, health)

    def _forget_exited(self, now: float) -> None:
        """Ranks that exited long ago leave their Tracker, and a Tracker with no rank left goes, so a node
        that runs job after job keeps a bounded memory (their series went when they exited)."""
        for job_id, tracker in list(self.trackers.items()):
            for key, r in list(tracker.ranks.items()):
                if sources.is_exited(r.status) and now - r.last_seen > max(EXITED_KEEP_S, self.opts.stall):
                    del tracker.ranks[key]
            if not tracker.ranks:
                del self.trackers[job_id]

    def _ranks_loop(self) -> None:
        tick = time.monotonic()
        while not self.stop.is_set():
            self.sample_ranks()
            tick = max(tick + self.opts.interval, time.monotonic())  # a slow sample skips ticks, never piles up
            self.stop.wait(max(0.0, tick - time.monotonic()))

    # -- health -----------------------------------------------------------------------------------------
    def run_health(self, timeout: float) -> bool:
        """One health run in a worker thread, waited for ``timeout`` seconds; False when it is still going
        (hung: reported so, and waited for until it returns or the exporter stops)."""
        result: dict[str, Any] = {}

        def work() -> None:
            try:
                result["report"] = sources.run_health(self.opts)
            except BaseException as e:  # noqa: BLE001 - reported as the run's error, whatever it is
                result["error"] = e

        started, t0 = time.time(), time.perf_counter()
        before = self._source(HEALTH, running_since=started)
        worker = threading.Thread(target=work, name="mldebug-exporter-health-run", daemon=True)
        worker.start()
        worker.join(timeout)
        if worker.is_alive():
            self._source(HEALTH, hung=True, last_error=f"a health run has not returned for {timeout:g} s")
            output.log(f"mldebug exporter: the health checks have not returned for {timeout:g} s: reported hung")
            while worker.is_alive() and not self.stop.is_set():
                worker.join(1.0)
            if worker.is_alive():
                return False
        duration = round(time.perf_counter() - t0, 4)
        if "report" in result:
            checks, gpus, summary = health_values(result["report"])
            with self.lock:
                health = replace(self.snapshot.sources[HEALTH], samples=before.samples + 1, last_time=time.time(),
                                 last_duration_s=duration, last_error=None, running_since=None, hung=False)
                self.snapshot = replace(self.snapshot, checks=checks, gpus=gpus, health_summary=summary
                                        ).with_source(HEALTH, health)
            return True
        e = result.get("error")
        self._source(HEALTH, errors=before.errors + 1, last_duration_s=duration, running_since=None, hung=False,
                     last_error=first_line(e) if e is not None else "no result")
        output.log(f"mldebug exporter: the health checks failed: {type(e).__name__}: {first_line(e) if e else ''}")
        return True

    def _health_loop(self) -> None:
        while not self.stop.is_set():
            start = time.monotonic()
            if not self.run_health(self.opts.health_timeout):
                return
            self.stop.wait(max(0.0, start + self.opts.health_interval - time.monotonic()))

    # -- running ----------------------------------------------------------------------------------------
    def start_threads(self) -> None:
        for name, target in (("ranks", self._ranks_loop), ("health", self._health_loop)):
            t = threading.Thread(target=target, name=f"mldebug-exporter-{name}", daemon=True)
            t.start()
            self.threads.append(t)

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=2.0)
        if self.sampler is not None:
            try:
                self.sampler.close()
            except Exception:  # noqa: BLE001 - closing NVML on the way out must not hide the exit code
                pass

    def result(self, status: str) -> dict[str, Any]:
        snap, now = self.snapshot, time.time()
        stalled = [r for r in snap.ranks if r.stalled]
        stragglers = [r for r in snap.ranks if r.straggler]
        fails = [c for c in snap.checks if c.status == "fail"]
        hung = snap.sources[HEALTH].hung
        parts = [f"{len(snap.ranks)} rank(s) of {len({r.job_id for r in snap.ranks})} job(s) on {snap.node}"]
        if stalled:
            parts.append("stalled: " + ", ".join(f"rank {r.rank} of {r.job_id}" for r in stalled))
        if stragglers:
            parts.append("straggler: " + ", ".join(f"rank {r.rank} of {r.job_id}" for r in stragglers))
        if hung:
            parts.append("the health checks are hung")
        elif fails:
            parts.append("failing checks: " + ", ".join(f"{c.target} {c.check}" for c in fails[:4]))
        elif snap.sources[HEALTH].samples:
            parts.append(f"{len(snap.checks)} health checks, none failing")
        if snap.health_summary and "FAKE NVML" in snap.health_summary:  # test data never reads as hardware
            parts.append("GPU values from FAKE NVML (a test hook)")
        code = ExitCode.PARTIAL if hung else ExitCode.PROBLEM if (stalled or stragglers or fails) else ExitCode.OK
        return {"ok": code == ExitCode.OK, "summary": "; ".join(parts), "exit_code": int(code), "status": status,
                "listen": self.opts.listen, **snap.as_dict(now)}


def _bind(opts: ExporterOptions, registry: Any) -> Any:
    """The HTTP server (ml_debug.exporter.http) on --listen; a port in use or an address not of this host is a usage
    error (exit 2) with a hint."""
    from ml_debug.exporter import http

    host, port = opts.address
    try:
        server = http.start(host, port, registry)
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            raise UsageError(f"--listen {opts.listen}: port {port} is already in use",
                             f"another exporter or service listens there (ss -ltnp 'sport = :{port}'): stop it, or "
                             f"give another port, e.g. --listen {host if ':' not in host else f'[{host}]'}:"
                             f"{port + 1}") from None
        if e.errno in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT):
            raise UsageError(f"--listen {opts.listen}: {host} is not an address of this host ({e.strerror})",
                             LISTEN_HINT) from None
        if e.errno == errno.EACCES:
            raise UsageError(f"--listen {opts.listen}: not allowed to listen on port {port} ({e.strerror})",
                             "ports below 1024 need root: use a port above 1024, e.g. 9477") from None
        raise UsageError(f"--listen {opts.listen}: cannot listen there: {e.strerror or e}", LISTEN_HINT) from None
    return server


STOP_POLL_S = 0.2
"""How often the serving loop looks whether SIGTERM came (the latency of a stop)."""


def _on_sigterm() -> tuple[Callable[[int, Any], None], list[int]]:
    """SIGTERM's handler while serving, and the list in which it notes the signal. It raises nothing: an
    exception raised by a signal lands wherever the main thread is (starting, or already handling a Ctrl-C,
    or a second SIGTERM while stopping), which made the exit code a matter of timing (0, 130, once
    `internal error: _Stop`). The serving loop looks at the list instead."""
    came: list[int] = []

    def terminated(signum: int, _frame: Any) -> None:
        came.append(signum)

    return terminated, came


def serve(opts: ExporterOptions) -> int:
    """Serve /metrics until SIGTERM (exit 0) or Ctrl-C (exit 130).

    The SIGTERM handler is in place before the port is bound: a SIGTERM from anyone who has seen the port
    answer means exit 0, whenever it comes."""
    opts.validate()
    exporter = Exporter(opts)
    terminated, came = _on_sigterm()
    previous = signal.signal(signal.SIGTERM, terminated)
    try:  # the handler stays until the document is out: a SIGTERM until then is the same stop
        code, status = _serve_until_stopped(opts, exporter, came)
        result = exporter.result(status)
        result.update(exit_code=int(code), ok=code == ExitCode.OK)
        output.emit(SCHEMA, SCHEMA_VERSION, result, lambda console: console.print(result["summary"], soft_wrap=True))
    finally:
        signal.signal(signal.SIGTERM, previous)
    return int(code)


def _serve_until_stopped(opts: ExporterOptions, exporter: Exporter, came: list[int]) -> tuple[ExitCode, str]:
    """Bind, serve, and stop on SIGTERM (noted in ``came``) or Ctrl-C: (exit code, status)."""
    from prometheus_client import CollectorRegistry
    from prometheus_client.process_collector import ProcessCollector

    from ml_debug.exporter.render import SnapshotCollector

    server = None
    try:
        registry = CollectorRegistry()
        registry.register(SnapshotCollector(exporter.current))
        ProcessCollector(namespace="mldebug_exporter", registry=registry)  # its own CPU and memory, for the benchmark
        server = _bind(opts, registry)
        host, port = server.server_address[:2]
        shown = f"[{host}]" if ":" in str(host) else host
        output.log(f"mldebug exporter: serving http://{shown}:{port}/metrics (ranks every {opts.interval:g} s, "
                   f"health checks every {opts.health_interval:g} s)")
        if host not in ("127.0.0.1", "::1"):
            output.log("mldebug exporter: listening beyond this node: whoever reaches the port reads job ids, "
                       "ranks and the node's health (put it behind a firewall or the cluster network)")
        exporter.start_threads()
        while not came and not exporter.stop.wait(STOP_POLL_S):
            pass
        output.log("mldebug exporter: stopped (SIGTERM)")
        return ExitCode.OK, "stopped"
    except KeyboardInterrupt:
        output.log("mldebug exporter: interrupted")
        return ExitCode.INTERRUPTED, "interrupted"
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()
        exporter.close()


def once(opts: ExporterOptions) -> int:
    """``--once``: the ranks sampled over one --interval and the health checks run once; the metrics printed.
    Exit 1 when a rank is stalled or a straggler or a check fails, 4 when the checks did not return in time."""
    from ml_debug.exporter.render import exposition

    opts.validate()
    exporter = Exporter(opts)
    try:
        exporter.sampler = sources.make_sampler(opts)
        health = threading.Thread(target=exporter.run_health, args=(opts.health_timeout,), daemon=True)
        health.start()
        time.sleep(opts.interval)  # the sampler primed its readings: one interval gives CPU % and rates
        exporter.sample_ranks()
        health.join(opts.health_timeout + 1.0)
        exporter.stop.set()
    finally:
        exporter.close()
    result = exporter.result("once")
    text = exposition(exporter.snapshot)
    output.emit(SCHEMA, SCHEMA_VERSION, result, lambda console: _print_text(text))
    if not output.MODE.json:
        output.log(f"mldebug exporter: {result['summary']}")
    return int(result["exit_code"])


def _print_text(text: str) -> None:
    import sys

    sys.stdout.write(text)

"""The watch loop: samples in, decisions out, a bundle per incident.

Samples come from the sampling service (:mod:`ml_debug.sampling`): in this process for ``--local`` (with ``--pid``), or
one streaming agent per node (``mldebug top --agent``, one ssh session or ``srun --overlap`` step
each) for ``--hosts``/``--slurm-job``. Stack rounds are dump-stacks' own py-spy dumps, taken by a
background thread every ``--stack-every`` seconds. The decisions are :class:`ml_debug.watch.verdict.Tracker`'s;
the bundle is :class:`ml_debug.compose.incident.IncidentCollector`'s.
"""

from __future__ import annotations

import dataclasses
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any

from ml_debug.core import lifecycle, output
from ml_debug.core.errors import ExitCode
from ml_debug.core.visible import visible
from ml_debug.remote.targets import TargetSpec
from ml_debug.sampling.options import SamplerOptions
from ml_debug.sampling.sample import NodeSample
from ml_debug.watch.bundle import SCHEMA, SCHEMA_VERSION, default_dir
from ml_debug.watch.options import WatchOptions
from ml_debug.watch.verdict import Incident, Tracker, seconds

NO_TARGETS_HINT = ("name the job: --pid PID (a launcher's pid means its ranks), --pattern REGEX or --env KEY=VALUE; "
                   "or watch the nodes it runs on (--hosts / --slurm-job)")
STATUS_EVERY_S = 60.0

Reading = tuple[str, NodeSample | None, float | None, str | None]
"""(node label, its last sample, when it arrived (wall time), why there is none)."""


def _sampler_options(opts: WatchOptions) -> SamplerOptions:
    return SamplerOptions(interval=opts.interval, progress_files=list(opts.progress_files), pattern=opts.pattern,
                          user=opts.user, env=list(opts.env))


class LocalSource:
    """This node, sampled in this process on every call (``--pid`` included)."""

    def __init__(self, opts: WatchOptions, spec: TargetSpec) -> None:
        from ml_debug.sampling.sampler import NodeSampler

        self.label = spec.targets[0].label
        self.sampler = NodeSampler(_sampler_options(opts), pids=opts.pids)

    def poll(self) -> list[Reading]:
        out: list[Reading] = [
            (self.label, self.sampler.sample(), time.time(), None)]
        self.sampler.maintain()  # between samples: look for the job's ranks again when it is time
        return out

    def close(self) -> None:
        self.sampler.close()


class StreamSource:
    """One streaming ``mldebug top --agent`` per node; each poll reads what every node said last."""

    def __init__(self, opts: WatchOptions, spec: TargetSpec) -> None:
        from ml_debug.sampling.streams import Client

        self.client = Client(spec, _sampler_options(opts), retry=True)
        self.client.start()
        try:
            self.client.wait(self.client.all_first, time.monotonic() + opts.interval + opts.node_timeout)
        except BaseException:  # Ctrl-C while the agents start: none of them is left behind
            self.client.close()
            raise

    def poll(self) -> list[Reading]:
        now_wall, now_mono = time.time(), time.monotonic()
        out: list[Reading] = []
        with self.client.lock:
            for f in self.client.feeds:
                received = None if f.received is None else now_wall - (now_mono - f.received)
                out.append((f.label, f.sample, received, f.error))
        return out

    def close(self) -> None:
        self.client.close()


def stack_observations(result: dict[str, Any]) -> list[dict[str, Any]]:
    """One observation per dumped rank of a dump-stacks result: its stack key, where it is, and
    whether it waits in a collective."""
    groups = {g["id"]: g for g in result.get("groups") or []}
    out = []
    for p in result.get("processes") or []:
        g = groups.get(p.get("group"))
        if g is None:
            continue
        coll, loc = g.get("collective"), g.get("location")
        out.append({"host": p["host"], "pid": p["pid"], "rank": p.get("rank"),
                    "key": "|".join(str(f.get("where")) for f in g.get("frames") or []),
                    "where": (loc or coll or {}).get("where"), "in_collective": coll is not None,
                    "collective": coll.get("name") if coll else None})
    return out


class StackRounds:
    """py-spy stack rounds in a background thread, every ``--stack-every`` seconds; paused during a bundle."""

    def __init__(self, opts: WatchOptions, spec: TargetSpec, tracker: Tracker, lock: threading.Lock) -> None:
        self.opts, self.spec, self.tracker, self.lock = opts, spec, tracker, lock
        self.stop = threading.Event()
        self.paused = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="mldebug-watch-stacks", daemon=True)

    def start(self) -> None:
        if self.opts.stack_every > 0:
            self.thread.start()

    def _loop(self) -> None:
        while not self.stop.wait(self.opts.stack_every):
            if self.paused.is_set():
                continue
            taken = time.time()
            try:
                obs = self.round()
            except Exception as e:  # a failed round is a missing signal, not a failed watch
                output.log(f"watch: stack sample failed: {type(e).__name__}: {e}")
                continue
            with self.lock:
                self.tracker.add_stacks(obs, taken)

    def round(self) -> list[dict[str, Any]]:
        from ml_debug.compose.incident import dump_request

        req = dump_request(self.opts, self.spec, samples=1, flight_recorder=False)
        req = dataclasses.replace(req, dumper="py-spy")
        if self.spec.kind == "local":
            from ml_debug.stacks.run import dump_stacks_report

            return stack_observations(dump_stacks_report(self.spec, req))
        from ml_debug.remote.runner import on_every_node

        obs: list[dict[str, Any]] = []
        for r in on_every_node("dump-stacks", req, self.spec, timeout_s=req.node_budget()):
            body = (r.document or {}).get("result")
            if isinstance(body, dict):
                obs += stack_observations(body)
        return obs

    def close(self) -> None:
        self.stop.set()


def _terminated(signum: int, frame: Any) -> None:
    lifecycle.note(signum)  # said as what it was: "terminated", "interrupted by SIGTERM", not a Ctrl-C
    raise KeyboardInterrupt


def _job_name(spec: TargetSpec, opts: WatchOptions) -> str:
    if spec.kind == "slurm" and spec.slurm_job:
        return f"slurm{spec.slurm_job}"
    if opts.pids:
        return f"pid{opts.pids[0]}"
    return spec.targets[0].host if spec.targets else socket.gethostname()


class Watch:
    """One run of `mldebug watch`."""

    def __init__(self, spec: TargetSpec, opts: WatchOptions) -> None:
        self.spec, self.opts = spec, opts
        self.lock = threading.Lock()
        self.tracker = Tracker(stall=opts.stall, grace=opts.grace, straggler_factor=opts.straggler_factor,
                               interval=opts.interval, node_timeout=opts.node_timeout)
        self.job = _job_name(spec, opts)
        self.incidents = 0
        self.last: dict[str, Any] | None = None  # the last incident's result
        self.collector: Any = None

    def base_result(self) -> dict[str, Any]:
        now = time.time()
        snap = self.tracker.snapshot(now)
        return {"ok": True, "summary": "", "exit_code": 0, "job": self.job,
                "target": {"kind": self.spec.kind, "nodes": self.spec.labels, "slurm_job": self.spec.slurm_job},
                "status": "watching", "incident": None, "incidents": self.incidents, "bundle": None, "next": [],
                "culprit": None, "parts": [], "on_incident": None, "notes": [],
                "options": {"stall": self.opts.stall, "grace": self.opts.grace, "interval": self.opts.interval,
                            "stack_every": self.opts.stack_every, "straggler_factor": self.opts.straggler_factor,
                            "progress_files": list(self.opts.progress_files)},
                **snap}

    def _log(self) -> None:
        for line in self.tracker.take_events():
            output.log(f"watch: {line}")

    def _bundle_dir(self, when: float) -> Path:
        if self.opts.out_dir is None:
            return default_dir(self.job, when)
        return self.opts.out_dir / f"incident-{self.incidents}" if self.opts.keep_watching else self.opts.out_dir

    def incident(self, inc: Incident, stacks: StackRounds) -> dict[str, Any]:
        from ml_debug.compose.incident import IncidentCollector

        self.incidents += 1
        path = self._bundle_dir(inc.time)
        output.log(f"watch: INCIDENT ({inc.kind}): {inc.detail}")
        output.log(f"watch: collecting the bundle in {path}")
        stacks.paused.set()  # its dump-stacks agents would show up as processes of the job
        try:
            self.collector = IncidentCollector(self.spec, self.opts, self.tracker, inc, path, self.job, self.base_result)
            result = self.collector.collect()
            self.collector.run_on_incident()
            result = self.collector.result()
        finally:
            stacks.paused.clear()
        self.collector = None
        output.log(f"watch: {visible(result['summary'])}")
        output.log(f"watch: bundle complete: {path}/summary.md")
        _record_in_history(inc, result, path)
        self.last = result
        return result

    def run(self) -> int:
        opts = self.opts
        source: Any = None
        stacks = StackRounds(opts, self.spec, self.tracker, self.lock)
        started = time.monotonic()
        code = ExitCode.OK
        final: dict[str, Any] | None = None
        output.log(f"watch: watching {', '.join(self.spec.labels)} every {opts.interval:g} s (stall after "
                   f"{seconds(opts.stall)}, grace {seconds(opts.grace)}"
                   + (f", stacks every {seconds(opts.stack_every)}" if opts.stack_every else ", no stack samples")
                   + ")")
        previous = signal.signal(signal.SIGTERM, _terminated)  # scancel, kill: stop like Ctrl-C, agents included
        try:
            source = LocalSource(opts, self.spec) if self.spec.kind == "local" else StreamSource(opts, self.spec)
            stacks.start()
            next_status = started + STATUS_EVERY_S
            tick = started
            while True:
                now = time.time()
                with self.lock:
                    for label, sample, received, error in source.poll():
                        self.tracker.add_node(label, sample, received, error)
                    inc = self.tracker.requested(now) if opts.now and self.tracker.ranks else \
                        None if opts.now else self.tracker.evaluate(now)
                self._log()
                mono = time.monotonic()
                if opts.now and inc is None and mono - started > opts.interval + opts.node_timeout:
                    return self._finish(self._nothing("no rank process found to collect"), ExitCode.ENVIRONMENT)
                if inc is not None:
                    final = self.incident(inc, stacks)
                    if opts.now:
                        code = ExitCode.PROBLEM if final.get("culprit") else ExitCode.OK
                        final.update(exit_code=int(code), ok=code == ExitCode.OK)
                        return self._finish(final, code)
                    code = ExitCode.PROBLEM
                    final.update(exit_code=int(code))
                    if not opts.keep_watching:
                        return self._finish(final, code)
                if self.tracker.job_ended():
                    output.log("watch: every rank has exited: the job ended")
                    if final is None:
                        final = self._nothing(f"the job ended: all {len(self.tracker.ranks)} rank(s) exited, no "
                                              "incident while they ran")
                    return self._finish(final, code)
                if not self.tracker.ranks and mono - started > max(opts.grace, opts.interval + opts.node_timeout):
                    return self._finish(self._nothing("no rank process found to watch"), ExitCode.ENVIRONMENT)
                if opts.duration and mono - started >= opts.duration:
                    if not self.tracker.ranks and final is None:
                        return self._finish(self._nothing("no rank process found to watch"), ExitCode.ENVIRONMENT)
                    if final is None:
                        final = self._quiet(now)
                    return self._finish(final, code)
                if mono >= next_status:
                    output.log(f"watch: {self.tracker.status_line(now)}")
                    next_status = mono + STATUS_EVERY_S
                tick = max(tick + opts.interval, time.monotonic())  # a long bundle skips ticks, never piles up
                wake = min(tick, started + opts.duration) if opts.duration else tick  # --duration is kept to
                time.sleep(max(0.0, wake - time.monotonic()))
        except KeyboardInterrupt:
            sig = lifecycle.interrupting_signal()
            output.log("watch: interrupted" if sig == "SIGINT" else f"watch: terminated ({sig})")
            if self.collector is not None:  # the bundle so far is kept, and says it was cut short
                final = self.collector.interrupt()
            elif final is None:
                final = self._nothing("interrupted before any incident")
            final.update(exit_code=int(ExitCode.INTERRUPTED), status="interrupted")
            return self._finish(final, ExitCode.INTERRUPTED)
        finally:
            signal.signal(signal.SIGTERM, previous)
            stacks.close()
            if source is not None:
                source.close()

    def _quiet(self, now: float) -> dict[str, Any]:
        silent = [n for n in self.tracker.nodes.values() if not n.answering]
        live = [r for r in self.tracker.ranks.values() if r.status != "exited"]
        watched, where = now - self.tracker.started, f"{len(live)} rank(s) on {len({r.node for r in live})} node(s)"
        idle = [r for r in live if r.last_progress <= r.first_seen]  # nothing seen move since it was found
        if watched < self.tracker.grace:  # nobody was judged: say so, do not vouch for progress
            text = (f"no verdict: {where} watched for {seconds(watched)}, inside the first {seconds(self.tracker.grace)} "
                    "(--grace), when no rank is judged")
        elif idle:
            text = (f"no incident in {seconds(watched)} of watching {where}, but {len(idle)} showed no progress yet "
                    f"({', '.join(r.label for r in idle[:8])}{', ...' if len(idle) > 8 else ''}), for less than "
                    f"--stall {seconds(self.tracker.stall)}")
        else:
            text = f"no incident: {where} made progress during {seconds(watched)} of watching"
        if silent:
            text = (f"no incident, but {len(silent)} node(s) did not answer: "
                    + ", ".join(f"{n.label} ({n.error or 'silent'})" for n in silent))
        return self._nothing(text)

    def _nothing(self, summary: str) -> dict[str, Any]:
        res = self.base_result()
        res.update(summary=summary, status="no-incident")
        return res

    def _finish(self, result: dict[str, Any], code: int) -> int:
        if code == ExitCode.OK and any(not n.answering for n in self.tracker.nodes.values()) and not result["bundle"]:
            code = ExitCode.PARTIAL
        if code == ExitCode.ENVIRONMENT:
            result["hint"] = NO_TARGETS_HINT
        result.update(exit_code=int(code), ok=code == ExitCode.OK)
        output.emit(SCHEMA, SCHEMA_VERSION, result, lambda console: render(console, result))
        if code == ExitCode.ENVIRONMENT:
            output.log(f"hint: {NO_TARGETS_HINT}")
        return int(code)


def render(console: Any, result: dict[str, Any]) -> None:
    """The human view: the sentence, the next commands, the bundle."""
    from rich.text import Text

    style = "bold green" if result["ok"] else "bold red"
    console.print(Text(visible(result["summary"]), style=style), soft_wrap=True)
    for cmd in result.get("next") or []:
        console.print(f"  next: {visible(cmd)}", soft_wrap=True)
    if result.get("bundle"):
        console.print(f"  bundle: {result['bundle']} ({result['status']})", soft_wrap=True)


def _record_in_history(inc: Incident, result: dict[str, Any], bundle: Path) -> None:
    """The incident's nodes into the node history (only where MLDEBUG_HISTORY names one)."""
    from ml_debug.history.store import record_incident

    nodes = [*inc.nodes, *(str(r.get("host") or r.get("node")) for r in inc.ranks if r.get("host") or r.get("node"))]
    culprit = (result.get("culprit") or {}).get("host")
    note = record_incident("watch", str(bundle), nodes, culprit, str(result.get("summary", "")))
    if note:
        output.warn(f"watch: {note}")


def run_watch(spec: TargetSpec, opts: WatchOptions) -> int:
    """Watch the job on `spec` until an incident (or the job's end, --duration, Ctrl-C); the exit code."""
    return Watch(spec, opts).run()

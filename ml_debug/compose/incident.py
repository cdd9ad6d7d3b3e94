"""The incident bundle of `mldebug watch`: evidence from other features' libraries, gathered part by part.

Detection lives in :mod:`ml_debug.watch`; gathering calls dump-stacks' ``dump_stacks_report``,
health's ``run_local`` (or ``health --local`` on the suspect's node) and ``env``, which only this
layer may import together. Every part runs under its own time limit and is written the moment it
is done; ``summary.json``/``summary.md`` are rewritten after each part, so an interrupted bundle
still says what it holds.
"""

from __future__ import annotations

import dataclasses
import io
import os
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ml_debug.core import bounded, output
from ml_debug.remote.targets import TargetSpec
from ml_debug.watch.bundle import (
    SCHEMA,
    SCHEMA_VERSION,
    Bundle,
    Part,
    markdown,
    run_part,
    safe_name,
    tail_lines,
)
from ml_debug.watch.options import WatchOptions, incident_argv
from ml_debug.watch.summary import compose
from ml_debug.watch.verdict import Incident, Tracker

ON_INCIDENT_TIMEOUT_S = 120.0
PART_TIMEOUT_S = 90.0  # health and env of one node; dump-stacks gets its own budget


def dump_request(opts: WatchOptions, spec: TargetSpec, *, samples: int, flight_recorder: bool,
                 interval: float = 1.0) -> Any:
    """dump-stacks' request for the watched job (the same selectors as the watcher's)."""
    from ml_debug.stacks.request import DumpRequest

    env = list(opts.env)
    if spec.kind == "slurm" and spec.slurm_job and "SLURM_JOB_ID" not in opts.env_filter:
        env.append(("SLURM_JOB_ID", spec.slurm_job))
    return DumpRequest(pids=list(opts.pids), pattern=opts.pattern, user=opts.user, env=env, samples=samples,
                       interval=interval, flight_recorder=flight_recorder, timeout=5.0, gdb_timeout=30.0)


def one_node(spec: TargetSpec, label: str | None) -> TargetSpec:
    """`spec` narrowed to the node named `label` (the first node when it is not one of them)."""
    chosen = [t for t in spec.targets if t.label == label] or spec.targets[:1]
    return dataclasses.replace(spec, targets=chosen)


def target_words(spec: TargetSpec) -> list[str]:
    """How a person reaches the job again from the command line."""
    if spec.kind == "slurm" and spec.slurm_job:
        return ["--slurm-job", spec.slurm_job]
    if spec.kind == "ssh":
        return ["--hosts", ",".join(spec.labels)]
    return []


class IncidentCollector:
    """Writes one incident's bundle."""

    def __init__(self, spec: TargetSpec, opts: WatchOptions, tracker: Tracker, incident: Incident, path: Path,
                 job: str, base_result: Callable[[], dict[str, Any]]) -> None:
        self.spec, self.opts, self.tracker, self.incident = spec, opts, tracker, incident
        self.job = job
        self.bundle = Bundle(path)
        self.base_result = base_result
        self.stacks: dict[str, Any] | None = None
        self.stacks_result: Any = None  # the DumpStacksResult itself, for incident.html
        self.snapshot: dict[str, Any] | None = None
        self.health: dict[str, Any] | None = None
        self.status = "collecting"
        self.on_incident: dict[str, Any] | None = None
        self._lock = threading.RLock()
        self._stop = threading.Event()  # Ctrl-C: the parts still running end with what they have
        self._stacks_done = threading.Event()

    # -- the summary, rewritten after every part --------------------------------------------------
    def result(self) -> dict[str, Any]:
        inc = self.incident.as_dict()
        sentence, nexts, culprit = compose(inc, self.stacks, target_words(self.spec), self.health)
        res = self.base_result()
        res.update(ok=False, summary=sentence, next=nexts, culprit=culprit, incident=inc, bundle=str(self.bundle.path),
                   status=self.status, parts=[p.as_dict() for p in self.bundle.parts],
                   notes=[*res.get("notes", []), *self.bundle.notes], on_incident=self.on_incident)
        return res

    def write_summary(self) -> dict[str, Any]:
        with self._lock:  # parts finish in several threads
            res = self.result()
            doc = output.document(SCHEMA, SCHEMA_VERSION, res)
            self.bundle.write("summary.json", output.dumps(doc) + "\n")
            self.bundle.write("summary.md", markdown(res))
            return res

    def interrupt(self, wait_s: float = 15.0) -> dict[str, Any]:
        """Ctrl-C during the bundle: the stack samples taken so far are kept (dump-stacks stops
        after its current round, waited for up to `wait_s`); the summary says `interrupted`."""
        self._stop.set()
        if any(p.name == "dump-stacks" for p in self.bundle.parts):
            self._stacks_done.wait(wait_s)  # a second SIGINT at once is the same Ctrl-C (cli.app.main)
        for p in self.bundle.parts:
            if p.status == "pending":
                p.status, p.error = "interrupted", p.error or f"{_signal_word()} before it finished"
        self.status = "interrupted"
        return self.write_page(self.write_summary())

    def write_page(self, res: dict[str, Any]) -> dict[str, Any]:
        """incident.html (and --html FILE): the summary's sentence over the parts gathered; never fails the bundle."""
        from ml_debug.page.build import incident_page, write

        try:
            page = incident_page(res, self.stacks_result, self.snapshot, self.health, created=self.incident.time)
            self.bundle.write("incident.html", page)
            if self.opts.html is not None:
                write("--html", self.opts.html, page)
        except Exception as e:  # the JSON parts are the evidence; the page is a view of them
            output.warn(f"watch: incident.html not written: {type(e).__name__}: {e}")
        return res

    # -- the parts --------------------------------------------------------------------------------
    def collect(self) -> dict[str, Any]:
        """Every part, in order of value; the final result (status complete)."""
        now = time.time()
        self.snapshot = self.tracker.snapshot(now)
        self.bundle.write_json("watch.json", {"incident": self.incident.as_dict(), **self.snapshot})
        self.write_summary()
        req = dump_request(self.opts, self.spec, samples=self.opts.samples, flight_recorder=True)
        self._run("dump-stacks", f"stacks of every rank ({self.opts.samples} samples) and the Flight Recorder",
                  self._dump_stacks, req.node_budget() + 30.0)
        # the rest does not depend on each other: side by side, each under its own limit
        rest = [threading.Thread(target=self._run, args=args, daemon=True) for args in (
            ("health", "health --level 1 of the suspect's node", self._health, PART_TIMEOUT_S),
            ("progress", "the last lines of each progress file", self._progress, 15.0),
            ("env", "mldebug env of one node", self._env, PART_TIMEOUT_S))]
        for t in rest:
            t.start()
        for t in rest:
            t.join(PART_TIMEOUT_S + 5)
        self.status = "complete"
        return self.write_page(self.write_summary())

    def _run(self, name: str, what: str, fn: Callable[[Part], None], timeout: float) -> None:
        part = self.bundle.part(name, what)
        output.log(f"watch: collecting {name} ...")
        run_part(part, fn, timeout)
        output.log(f"watch: {name}: {part.status}" + (f" ({part.error})" if part.error else ""))
        self.write_summary()

    def _suspect_node(self) -> str | None:
        culprit = compose(self.incident.as_dict(), self.stacks, target_words(self.spec), None)[2]
        if culprit is not None:
            for r in self.tracker.ranks.values():
                if r.host == culprit.get("host") and r.pid == culprit.get("pid"):
                    return r.node
        return self.incident.nodes[0] if self.incident.nodes else None

    def _dump_stacks(self, part: Part) -> None:
        try:
            self._write_stacks(part)
        finally:
            self._stacks_done.set()

    def _write_stacks(self, part: Part) -> None:
        from ml_debug.stacks.render import render
        from ml_debug.stacks.run import dump_stacks_result
        from ml_debug.stacks.verdict import SCHEMA as STACKS_SCHEMA
        from ml_debug.stacks.verdict import SCHEMA_VERSION as STACKS_VERSION

        req = dump_request(self.opts, self.spec, samples=self.opts.samples, flight_recorder=True)
        result = dump_stacks_result(self.spec, req, stop=self._stop)
        if result.interrupted:
            part.status, part.error = "interrupted", f"{_signal_word()}: the samples taken before it are kept"
        data = output.to_jsonable(result)
        self.stacks, self.stacks_result = data, result
        part.files.append(self.bundle.write("dump-stacks.json",
                                            output.dumps(output.document(STACKS_SCHEMA, STACKS_VERSION, data)) + "\n"))
        if data.get("flight_recorder"):
            part.files.append(self.bundle.write_json("flight-recorder.json", data["flight_recorder"]))
        text = io.StringIO()
        try:  # control characters of the job's strings made visible in the file, as on a terminal
            render(result, output.text_console(text, width=160, highlight=False, soft_wrap=False))
        except Exception as e:  # the JSON above is the evidence; the text view is a convenience
            part.error = f"dump-stacks.txt not drawn: {type(e).__name__}: {e}"
            return
        part.files.append(self.bundle.write("dump-stacks.txt", text.getvalue()))

    def _health(self, part: Part) -> None:
        from ml_debug.health.options import HealthOptions

        label = self._suspect_node()
        opts = HealthOptions(level=1)
        if self.spec.kind == "local":
            from ml_debug.health.cluster import local_result
            from ml_debug.health.run import run_local

            doc: Any = output.document("mldebug.health", 1, local_result(run_local(opts)))
            host = self.spec.targets[0].label
        else:
            from ml_debug.remote.runner import on_every_node

            answers = on_every_node("health", opts, one_node(self.spec, label), timeout_s=PART_TIMEOUT_S - 10)
            agent = answers[0] if answers else None
            if agent is None or agent.document is None:
                raise RuntimeError(agent.error if agent is not None else f"{label}: no answer")
            doc, host = agent.document, agent.node.host
        self.health = doc.get("result") if isinstance(doc, dict) else None
        part.files.append(self.bundle.write(f"health-{safe_name(str(host))}.json", output.dumps(doc) + "\n"))

    def _progress(self, part: Part) -> None:
        paths = sorted({r.file.path for r in self.tracker.ranks.values() if r.file and r.file.path}
                       | {f.path for n in self.tracker.nodes.values() for f in n.progress if f.path})
        if not paths:
            part.status = "skipped"
            part.error = "no progress file (--progress-file)"
            return
        missing = []
        for path in paths:
            if not os.path.exists(path):
                missing.append(path)  # on another node's own disk: not readable from here
                continue
            try:
                text = tail_lines(path)
            except Exception as e:  # a refused link, a file that vanished: said, the others still read
                text = f"(not read: {e})\n"
            part.files.append(self.bundle.write(f"progress-{safe_name(path)}.tail", text))
        if missing:
            part.error = "not on this node's disk: " + ", ".join(missing[:5])

    def _env(self, part: Part) -> None:
        if self.spec.kind == "local":
            from ml_debug.core.environment import collect, summary

            doc: Any = output.document("mldebug.env", 1, collect(include_torch=True), summary())
        else:
            from ml_debug.remote.runner import run_mldebug_everywhere

            node = one_node(self.spec, self._suspect_node())
            results = run_mldebug_everywhere(node, ["env"], timeout_s=PART_TIMEOUT_S - 10, add_local=False)
            if not results or results[0].document is None:
                raise RuntimeError(results[0].error if results else "no answer")
            doc = results[0].document
        part.files.append(self.bundle.write("env.json", output.dumps(doc) + "\n"))

    # -- after the bundle ---------------------------------------------------------------------------
    def run_on_incident(self) -> None:
        """``--on-incident CMD`` with MLDEBUG_INCIDENT=<bundle>: argv, no shell, bounded in time."""
        if not self.opts.on_incident:
            return
        argv = incident_argv(self.opts.on_incident)
        env = {**os.environ, "MLDEBUG_INCIDENT": str(self.bundle.path.resolve())}
        t0 = time.monotonic()
        try:
            proc = bounded.run(argv, timeout=ON_INCIDENT_TIMEOUT_S, env=env)
            self.on_incident = {"argv": argv, "exit_code": proc.returncode, "error": None,
                                "output": (proc.stdout + proc.stderr)[-2000:]}
        except (OSError, subprocess.TimeoutExpired) as e:
            self.on_incident = {"argv": argv, "exit_code": None, "output": "",
                                "error": f"stopped after {ON_INCIDENT_TIMEOUT_S:g} s"
                                if isinstance(e, subprocess.TimeoutExpired) else f"{type(e).__name__}: {e}"}
        self.on_incident["seconds"] = round(time.monotonic() - t0, 2)
        output.log(f"watch: --on-incident {' '.join(argv)}: "
                   + (f"exit {self.on_incident['exit_code']}" if self.on_incident["error"] is None
                      else self.on_incident["error"]))
        self.write_summary()


def _signal_word() -> str:
    """What cut the bundle short, as a person says it: Ctrl-C, or the signal (SIGTERM: scancel, kill)."""
    from ml_debug.core import lifecycle

    sig = lifecycle.interrupting_signal()
    return "Ctrl-C" if sig == "SIGINT" else sig

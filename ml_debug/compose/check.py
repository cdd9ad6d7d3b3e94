"""`mldebug check`: the whole-node checkup. Each step is another mldebug command run as a subprocess
with ``--json`` and a timeout (the agent pattern): its document's ``result.ok``/``result.summary`` and
exit code become one row of the verdict.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ml_debug.core import lifecycle, output
from ml_debug.core.enums import Word
from ml_debug.core.errors import ExitCode
from ml_debug.core.extras import PARTS, is_present


class StepStatus(Word):
    """How one step of the checkup ended."""

    PASS = "pass"
    FAIL = "fail"
    TIMEOUT = "timeout"
    PARTIAL = "partial"
    SKIPPED = "skipped"
    MISSING = "missing"  # the step needs an optional part that is not installed (exit 3 from check)
    ERROR = "error"
    INTERRUPTED = "interrupted"


PASS, FAIL, TIMEOUT, PARTIAL, SKIPPED, MISSING, ERROR, INTERRUPTED = StepStatus


@dataclass(frozen=True)
class Step:
    name: str
    argv: tuple[str, ...]  # mldebug arguments, without --json
    timeout_s: float
    why: str
    # parts (core.extras.PARTS) without which the step does not apply to this install: skipped, with the
    # command that adds them (torch: a torch-free install on a node is deliberate, see docs/install.md)
    skip_without: tuple[str, ...] = ()


NOT_INSTALLED = "skipped: no "  # a step's summary when its skip_without part is not installed here

DEFAULT_STEPS = (
    Step("env", ("env",), 60, "versions, GPUs, launcher variables, tools, ptrace permission"),
    Step("gpu-test", ("gpu-test", "--stage-timeout", "20"), 240,
         "every local device (2 CPU ranks without a GPU) can init, all_reduce, gather, broadcast, p2p",
         skip_without=("torch",)),
    Step("health", ("health", "--level", "1"), 180, "hardware health, quick level"),
    Step("allreduce-bench", ("allreduce-bench", "--quick"), 240, "collective bandwidth, quick mode",
         skip_without=("torch",)),
)


@dataclass
class StepResult:
    name: str
    command: str
    status: StepStatus
    exit_code: int | None
    seconds: float
    summary: str
    schema: str | None = None


@dataclass
class CheckResult:
    ok: bool
    summary: str
    exit_code: int
    host: str
    steps: list[StepResult] = field(default_factory=list)


def _kill_tree(proc: subprocess.Popen[str]) -> None:
    """Stop a step and every process it started (ranks live in their own sessions: kill by pid)."""
    try:
        import psutil

        kids = psutil.Process(proc.pid).children(recursive=True)
    except Exception:
        kids = []
    try:
        proc.send_signal(signal.SIGTERM)  # lets a launcher stop its ranks cleanly
        proc.wait(5)
    except Exception:
        pass
    for p in [proc, *kids]:
        try:
            os.kill(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        pass


def _printed(proc: subprocess.Popen[str]) -> tuple[str, str]:
    """What a stopped step printed until it was stopped (its stderr says where it was stuck)."""
    try:
        return proc.communicate(timeout=5)
    except subprocess.TimeoutExpired as e:  # a process that escaped the kill holds the pipes open
        out, err = (b.decode(errors="replace") if isinstance(b, bytes) else b or "" for b in (e.stdout, e.stderr))
        return out, err


def _keep(out_dir: Path | None, step: Step, stdout: str, stderr: str) -> None:
    """Write a step's stdout (its JSON document) and stderr to --out-dir as the step ends."""
    if out_dir is None:
        return
    from ml_debug.core.output import warn
    from ml_debug.core.safefs import write_out

    for name, text in ((f"check.{step.name}.json", stdout), (f"check.{step.name}.stderr", stderr)):
        note = write_out(out_dir, name, text)
        if note:
            warn(f"--out-dir: {note}")


def run_step(step: Step, timeout_s: float | None = None, out_dir: Path | None = None) -> StepResult:
    """Run ``mldebug <step> --json`` with a timeout and read its verdict."""
    argv = [sys.executable, "-m", "ml_debug", *step.argv, "--json"]
    shown = "mldebug " + " ".join([*step.argv, "--json"])
    limit = timeout_s or step.timeout_s
    env = {**os.environ, "MLDEBUG_JSON": "0", **lifecycle.child_env()}  # the step dies with check, even SIGKILLed
    env.setdefault("OMP_NUM_THREADS", "1")
    t0 = time.monotonic()
    with lifecycle.held_signals() as held:  # a Ctrl-C while it starts is raised in the try, which stops it
        proc = held.popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                          stdin=subprocess.DEVNULL)
        try:
            held.release()
            stdout, stderr = proc.communicate(timeout=limit)
        except subprocess.TimeoutExpired:
            _kill_tree(proc)
            _keep(out_dir, step, *_printed(proc))
            return StepResult(step.name, shown, TIMEOUT, None, round(time.monotonic() - t0, 2),
                              f"no answer within {limit:g} s; stopped it")
        except KeyboardInterrupt:  # Ctrl-C: the step and its ranks go; what it printed is kept
            _kill_tree(proc)
            _keep(out_dir, step, *_printed(proc))
            return StepResult(step.name, shown, INTERRUPTED, None, round(time.monotonic() - t0, 2),
                              "interrupted (Ctrl-C); stopped it")
    seconds = round(time.monotonic() - t0, 2)
    rc = proc.returncode
    _keep(out_dir, step, stdout, stderr)
    doc = None
    try:
        doc = json.loads(stdout) if stdout.strip() else None
    except json.JSONDecodeError:
        doc = None
    result = doc.get("result", {}) if isinstance(doc, dict) else {}
    missing = (result.get("details") or {}).get("missing") if isinstance(result, dict) else None
    if rc == ExitCode.ENVIRONMENT and isinstance(missing, dict):  # the step's error names the part
        return StepResult(step.name, shown, MISSING, rc, seconds, f"missing {missing.get('name')}: "
                          f"{missing.get('install')}", doc.get("schema") if isinstance(doc, dict) else None)
    summary = str(result.get("summary") or "").strip()
    if not summary:
        tail = [ln for ln in stderr.strip().splitlines() if ln.strip()]
        summary = tail[-1][:200] if tail else f"exit code {rc}, no JSON document"
    ok = bool(result.get("ok")) if result else rc == 0
    if rc == ExitCode.OK and ok:
        status = PASS
    elif rc == ExitCode.ENVIRONMENT:
        status = SKIPPED  # the node lacks what this step needs (e.g. no GPU for a GPU-only check)
    elif rc == ExitCode.PARTIAL:
        status = PARTIAL
    elif rc == ExitCode.USAGE or (rc not in (0, 1) and not result):
        status = ERROR
    else:
        status = FAIL
    return StepResult(step.name, shown, status, rc, seconds, summary,
                      doc.get("schema") if isinstance(doc, dict) else None)


def run_check(steps: Sequence[Step] = DEFAULT_STEPS, skip: Sequence[str] = (), timeout_s: float | None = None,
              out_dir: Path | None = None) -> CheckResult:
    """Run every step in turn (2 CPU ranks and a bandwidth test should not share the cores) and judge."""
    import socket

    results: list[StepResult] = []
    with output.progress(len(steps), "check") as bar:
        for step in steps:
            command = step.argv[0]
            absent = [PARTS[p] for p in step.skip_without if not is_present(PARTS[p])]
            if step.name in skip:
                results.append(StepResult(step.name, f"mldebug {command}", SKIPPED, None, 0.0, "skipped (--skip)"))
            elif absent:
                results.append(StepResult(step.name, f"mldebug {command}", SKIPPED, None, 0.0,
                                          f"{NOT_INSTALLED}{absent[0].name} here; {absent[0].install} adds it"))
            else:
                bar.advance(0, description=f"check: {step.name}")
                results.append(run_step(step, timeout_s, out_dir))
                if results[-1].status == INTERRUPTED:  # the steps done are reported, the rest not run
                    break
            bar.advance(1)
    return judge(results, socket.gethostname())


def judge(results: list[StepResult], host: str) -> CheckResult:
    """0 all ran steps passed; 1 a step found a problem; 3 a step lacks an optional part (named, with its
    install command); 4 a step timed out or was partial; 130 Ctrl-C (the steps done are reported)."""
    bad = [r for r in results if r.status in (FAIL, ERROR)]
    missing = [r for r in results if r.status == MISSING]
    late = [r for r in results if r.status in (TIMEOUT, PARTIAL, INTERRUPTED)]
    ran = [r for r in results if r.status != SKIPPED]
    passed = [r for r in ran if r.status == PASS]
    if any(r.status == INTERRUPTED for r in results):
        code = ExitCode.INTERRUPTED
    elif bad:
        code = ExitCode.PROBLEM
    elif missing:
        code = ExitCode.ENVIRONMENT
    elif late:
        code = ExitCode.PARTIAL
    else:
        code = ExitCode.OK
    summary = f"{len(passed)}/{len(ran)} steps passed on {host}"
    if code != ExitCode.OK:
        summary += "; " + "; ".join(f"{r.name} {r.status}: {r.summary}" for r in [*bad, *missing, *late])
    # what a torch-free install left out, and the one command that adds it
    for why in dict.fromkeys(r.summary for r in results if r.status == SKIPPED and r.summary.startswith(NOT_INSTALLED)):
        names = ", ".join(r.name for r in results if r.summary == why)
        summary += f"; skipped {names}: {why.removeprefix('skipped: ')}"
    return CheckResult(code == ExitCode.OK, summary, int(code), host, results)


def render(result: CheckResult, console: object) -> None:
    from rich.markup import escape
    from rich.table import Table

    style = {PASS: "green", FAIL: "bold red", ERROR: "bold red", TIMEOUT: "bold red", PARTIAL: "yellow",
             SKIPPED: "dim", MISSING: "bold yellow", INTERRUPTED: "yellow"}
    table = Table(show_edge=False, pad_edge=False, header_style="bold")
    for col in ("step", "status", "time", "summary"):
        table.add_column(col, no_wrap=col != "summary")
    for r in result.steps:
        table.add_row(r.name, f"[{style.get(r.status, '')}]{r.status}[/]",
                      f"{r.seconds:.1f}s" if r.seconds else "-", escape(r.summary))
    console.print(table)  # type: ignore[attr-defined]
    mark = ("[bold green]OK[/]" if result.ok else "[bold yellow]MISSING[/]" if result.exit_code == ExitCode.ENVIRONMENT
            else "[bold red]PROBLEM[/]")
    console.print(f"{mark} {escape(result.summary)}", soft_wrap=True)  # type: ignore[attr-defined]
    for r in result.steps:
        if r.status in (FAIL, ERROR, TIMEOUT, PARTIAL):
            console.print(f"  next: {r.command.replace(' --json', '')}  (details)",  # type: ignore[attr-defined]
                          soft_wrap=True)

"""How the job ended, where its logs say more than its failures: `mldebug launch`'s exit code (interrupted, or a failure
survived), torchrun's restarts (--max-restarts: the attempts that failed, a job that recovered or may have)."""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Collection, Iterable, Sequence

from ml_debug.core.errors import ExitCode
from ml_debug.core.output import times
from ml_debug.logs.catalogue import FINISHED, INTERRUPTED, RESTARTS
from ml_debug.logs.labels import clock
from ml_debug.logs.result import PRIMARY, SECONDARY, Event, SourceInfo, Verdict


def launched(v: Verdict, code: int, failed_attempts: list[int], last_attempt: int | None,
             signal: str | None = None) -> Verdict:
    """The verdict in the light of how `mldebug launch` ended (its manifests' ``exit_code`` and ``signal``). 130:
    it was interrupted. By Ctrl-C (``SIGINT``; no ``signal``: a launch.json of before 2026-11-29): the ranks'
    KeyboardInterrupt and SIGINT lines are that, not a failure of the job's own. By another signal (SIGTERM: kill,
    timeout, a scheduler's time limit or scancel): a stop from outside, which torchrun's agent's own line
    names as a failure; with no failure in the logs, the job was stopped from outside, not by a failure of its
    own. 0: the job succeeded, so a failure in the logs was survived: torchrun restarted the ranks
    (--max-restarts) and a later attempt finished."""
    if code == ExitCode.INTERRUPTED and signal not in (None, "SIGINT"):
        if v.status == "failure":  # torchrun's agent's "Received 15 death signal", or a failure before it
            return v
        return _stopped(v, f"from outside ({signal}: mldebug launch exited with code 130; kill, timeout, a "
                           "scheduler's time limit or scancel)", "")
    if code == ExitCode.INTERRUPTED:
        return _stopped(v, "by the user (Ctrl-C: mldebug launch exited with code 130)",
                        "the job was stopped by the user (Ctrl-C)")
    if code == 0 and v.failed:
        if failed_attempts and last_attempt is not None and last_attempt > max(failed_attempts):
            return _recovered(v, f"the job recovered: the failure of attempt {', '.join(map(str, failed_attempts))} "
                                 f"was followed by a successful attempt {last_attempt} (mldebug launch exited with code 0)")
        return _recovered(v, "the job succeeded (mldebug launch exited with code 0): the failure in its logs did not stop it")
    return v


def restarted(v: Verdict, events: Iterable[Event]) -> Verdict:
    """The verdict of a torchrun console whose agent said its workers finished after every failure (its
    --max-restarts restarts, printed at LOGLEVEL=INFO): the failures were survived. A failure is before the
    agent's line when it is above that line in the same file, or, in a file of no agent (a rank's own), when its
    time is no later."""
    events = list(events)
    finished = [e for e in events if e.label == FINISHED]
    if not v.failed or not finished:
        return v

    agents = {e.source for e in events if e.detail.get("via") == "torchrun" or e.label in (RESTARTS, FINISHED)}

    def before(failure: Event, done: Event) -> bool:
        if failure.source == done.source:
            return failure.line < done.line
        # another agent's console speaks for itself (its node may have failed while this one finished)
        return failure.source not in agents and failure.time is not None and done.time is not None \
            and failure.time <= done.time

    if not all(any(before(e, done) for done in finished) for e in events if e.cls in (PRIMARY, SECONDARY)):
        return v
    restarts = sum(e.label == RESTARTS for e in events)
    how = f"restarted the workers {times(restarts)} and " if restarts else ""
    return _recovered(v, f"the job recovered: torchrun {how}says they finished successfully after the failure")


def interrupted(v: Verdict, events: Iterable[Event]) -> Verdict:
    """The verdict of a torchrun console whose agent received SIGINT (Ctrl-C): the ranks' KeyboardInterrupt and SIGINT
    lines are that, not a failure of the job's own; a failure of its own before it stays the answer."""
    stop = next((e for e in events if e.label == INTERRUPTED), None)
    if stop is None:
        return v
    at = f" at {clock(stop.time)}" if stop.time is not None else ""
    return _stopped(v, f"by the user (torchrun received SIGINT{at}: Ctrl-C)", "torchrun was interrupted (SIGINT, Ctrl-C)")


def _stopped(v: Verdict, how: str, then: str) -> Verdict:
    """The job was stopped (``how``: by whom, and what says so): the verdict says so, unless a failure of its own
    came first (``then``: what followed it)."""
    if v.status == "failure":
        return dataclasses.replace(v, summary=f"{v.summary}; then {then}")
    return dataclasses.replace(
        v, status="interrupted", hint=None, basis=None,
        summary=f"the job was stopped {how}, not by a failure of its own"
                + (f"; the ranks' lines: {v.summary}" if v.status != "none" else ""))


def attempts(events: Iterable[Event]) -> list[str]:
    """torchrun's agent reports one failed worker per failed attempt (elastic/multiprocessing/api.py): an agent that
    reported several restarted its workers between them (--max-restarts). A finding per such agent: how many attempts
    failed, and what the later ones failed with (a restart can fail otherwise than the first attempt)."""
    events = list(events)
    reports: dict[tuple[int, int], list[Event]] = defaultdict(list)
    for e in events:
        if e.detail.get("via") == "torchrun" and "agent_pid" in e.detail:
            reports[(e.source_index, e.detail["agent_pid"])].append(e)
    out = []
    for (source, agent), mine in reports.items():
        if len(mine) < 2:
            continue
        first = min(e.line for e in mine)
        later = dict.fromkeys(e.label for e in events if e.source_index == source and e.line > first
                              and e.cls in (PRIMARY, SECONDARY) and e.kind not in ("exit", "signal", "launcher"))
        out.append(f"torchrun's agent (pid {agent}) restarted its workers {times(len(mine) - 1)} (--max-restarts) and "
                   f"all {len(mine)} attempts failed; the first failure named is the first attempt's"
                   + ("; the later ones failed with: " + ", ".join(f'"{label}"' for label in later) if later else ""))
    return out


def went_on(v: Verdict, events: Iterable[Event], infos: Sequence[SourceInfo], reported: Collection[int]) -> Verdict:
    """torchrun prints its traceback and failure summary (ChildFailedError) when the job fails; at its default log
    level it says nothing of a restart (--max-restarts), nor of the workers that finished after one. A console whose
    agent reported a failure and that goes on past it, with no report of torchrun's (``reported``: those sources) and
    no failure after it: the job may have recovered (a finding; the first line says it, since the job's status cannot
    be told from these lines)."""
    by_source: dict[int, list[Event]] = defaultdict(list)  # one pass: a job of 16k files has as many sources
    for e in events:
        by_source[e.source_index].append(e)
    said = []
    for source, info in enumerate(infos):
        mine = by_source.get(source, [])
        if source in reported or any(e.label in (RESTARTS, FINISHED) for e in mine):
            continue
        failed = [e for e in mine if e.detail.get("via") == "torchrun" and e.kind in ("exit", "signal")]
        last = max(failed, key=lambda e: e.line, default=None)
        if last is not None and info.lines - last.line >= 2 and not any(
                e.line > last.line and e.cls in (PRIMARY, SECONDARY) for e in mine):
            said.append(f"torchrun's agent reported {last.who.label()}'s failure at line {last.line} of {info.path}, yet "
                        f"{info.lines - last.line} lines follow it and no failure summary (ChildFailedError), which "
                        "torchrun prints when the job fails: it restarted the workers (--max-restarts) and, if this "
                        "console is whole, the job went on; LOGLEVEL=INFO makes torchrun say whether they finished")
    if not said or not v.failed:
        return v
    return dataclasses.replace(v, summary=v.summary + "; but torchrun went on after it (below): the job may have "
                               "recovered", findings=v.findings + said)


def stopped(v: Verdict, infos: Sequence[SourceInfo]) -> list[str]:
    """Where only consequences were found: the files of a text that hold no failure at all, whose writers stopped
    without a word while their peers failed (a node lost at once, a kill -9, a hang), with their last line. Files of
    one rank are not: a rank's silence is said of the rank (``silent_ranks``), its file may repeat a console."""
    if v.status != "secondary-only":
        return []
    quiet = [s for s in infos if s.events == 0 and s.lines and s.who.rank is None and s.who.local_rank is None
             and s.shape not in ("error-file", "train-metrics")]
    return [f"{s.path} holds no failure: its writers stopped without a word while the others failed (a node lost, a "
            f"kill -9, a hang){'; ' + s.note if s.note else ''}" for s in quiet[:3]]


def _recovered(v: Verdict, what: str) -> Verdict:
    return dataclasses.replace(v, status="recovered", hint=None, summary=f"{what}; {v.summary}")

"""The incident bundle on disk: a directory whose parts are written as they arrive.

Layout (every file optional but ``summary.json``/``summary.md``, which are written first, with the
watcher's own observation, and rewritten after each part)::

    summary.md  summary.json      the one sentence, the next commands, what each part holds
    watch.json                    every rank and node as the watcher saw them at the incident
    dump-stacks.json / .txt       merged stacks with the suspect verdict (and the Flight Recorder
                                  section with its cross-rank analysis, also in flight-recorder.json)
    health-<node>.json            ``health --level 1`` of the suspect's node
    progress-<file>.tail          the last lines of each progress file
    env.json                      ``mldebug env`` of one node

Each part runs in its own thread under its own time limit (:func:`run_part`): a part that hangs is
recorded as timed out and the bundle goes on without it. Files go through
:func:`ml_debug.core.safefs.write_out` (a link planted in the directory is replaced, never
followed); progress files are read with :func:`ml_debug.core.safefs.open_found`.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ml_debug.core.visible import visible

SCHEMA = "mldebug.watch"
SCHEMA_VERSION = 1
TAIL_LINES = 20
TAIL_BYTES = 64 * 1024

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def safe_name(text: str) -> str:
    """A file name made of `text` (path separators and odd characters become '_')."""
    return _UNSAFE.sub("_", text).strip("._") or "x"


def default_dir(job: str, when: float, base: Path | None = None) -> Path:
    """``mldebug-incident-<job>-<YYYYmmdd-HHMMSS>`` (in the current directory unless `base`)."""
    name = f"mldebug-incident-{safe_name(job)}-{time.strftime('%Y%m%d-%H%M%S', time.localtime(when))}"
    return (base or Path(".")) / name


def tail_lines(path: str, lines: int = TAIL_LINES, max_bytes: int = TAIL_BYTES) -> str:
    """The last `lines` lines of a job's file (``tail -n``), read as a file its owner controls."""
    from ml_debug.core.safefs import open_found, opened

    fd, st = open_found(os.path.abspath(path), path)
    with opened(fd):
        start = max(0, st.st_size - max_bytes)
        os.lseek(fd, start, os.SEEK_SET)
        data = os.read(fd, st.st_size - start)
    text = data.decode(errors="replace")
    if start:
        text = text.split("\n", 1)[-1]  # the first line is cut: drop it
    return "\n".join(text.rstrip("\n").split("\n")[-lines:]) + "\n"


@dataclass
class Part:
    """One piece of evidence: what it is, the files it wrote, how it went."""

    name: str
    what: str
    files: list[str] = field(default_factory=list)
    status: str = "pending"  # pending | ok | failed | timed-out | skipped | interrupted
    seconds: float = 0.0
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "what": self.what, "files": self.files, "status": self.status,
                "seconds": round(self.seconds, 2), "error": self.error}


class Bundle:
    """The incident directory and what has been written into it."""

    def __init__(self, path: Path) -> None:
        from ml_debug.core import safefs

        safefs.make_out_dir(path, "--bundle-dir")  # before anything is gathered
        self.path = path
        self.parts: list[Part] = []
        self.notes: list[str] = []
        self._lock = threading.Lock()

    def write(self, name: str, data: str | bytes) -> str:
        """Write one file of the bundle (a planted link is replaced); its name."""
        from ml_debug.core import safefs

        note = safefs.write_out(self.path, name, data, "--bundle-dir")
        if note:
            with self._lock:
                self.notes.append(note)
        return name

    def write_json(self, name: str, obj: Any) -> str:
        from ml_debug.core.output import to_jsonable

        return self.write(name, json.dumps(to_jsonable(obj), indent=2, allow_nan=False) + "\n")

    def part(self, name: str, what: str) -> Part:
        p = Part(name, what)
        with self._lock:
            self.parts.append(p)
        return p


def run_part(part: Part, fn: Callable[[Part], None], timeout: float) -> None:
    """Run ``fn(part)`` in a daemon thread for at most `timeout` seconds; its outcome goes into `part`.

    A part that overruns is marked timed out and left behind (its own tools have their own time
    limits); the bundle never waits for it again."""
    errors: list[BaseException] = []

    def body() -> None:
        try:
            fn(part)
        except BaseException as e:  # noqa: BLE001 - any failure is this part's, never the bundle's
            errors.append(e)

    t0 = time.monotonic()
    worker = threading.Thread(target=body, name=f"mldebug-watch-{part.name}", daemon=True)
    worker.start()
    worker.join(timeout)
    part.seconds = time.monotonic() - t0
    if worker.is_alive():
        part.status, part.error = "timed-out", f"no result within {timeout:g} s"
    elif errors:
        from ml_debug.core.errors import first_line

        e = errors[0]
        if isinstance(e, KeyboardInterrupt):
            raise e
        part.status, part.error = "failed", f"{type(e).__name__}: {first_line(e)}"
    elif part.status == "pending":
        part.status = "ok"


def _md(value: Any) -> str:
    """A value for summary.md, most of which the job wrote: control characters and newlines shown
    visibly (a name with a newline must not add a line), and ``|`` escaped so that it stays in its cell."""
    return visible(str(value)).replace("|", "\\|")


def markdown(result: dict[str, Any]) -> str:
    """summary.md: the sentence first, then the next commands, the ranks and the parts."""
    inc = result.get("incident") or {}
    lines = [f"# mldebug watch: {_md(inc.get('kind', 'incident'))}", "", f"**{visible(result['summary'])}**", ""]
    if result.get("next"):
        lines += ["Next:", ""] + [f"    {visible(c)}" for c in result["next"]] + [""]
    from ml_debug.watch.verdict import clock

    lines += ["| | |", "|---|---|", f"| job | {_md(result.get('job'))} |",
              f"| detected | {clock(inc['time']) if inc.get('time') else '-'} |",
              f"| watcher | {_md(inc.get('detail', '-'))} |", f"| bundle | {_md(result.get('status'))} |", ""]
    ranks = result.get("ranks") or []
    if ranks:
        lines += ["## Ranks", "", "| rank | host | pid | status | state | CPU % | idle | where | signs |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for r in ranks:
            cpu = "-" if r.get("cpu_pct") is None else f"{r['cpu_pct']:.0f}"
            lines.append(f"| {'-' if r.get('rank') is None else r['rank']} | {_md(r.get('host'))} | {r.get('pid')} | "
                         f"{_md(r.get('status'))} | {_md(r.get('state') or '-')} | {cpu} | {r.get('idle_s', 0):.0f} s | "
                         f"{_md(r.get('where') or '-')} | {_md('; '.join(r.get('signs') or []) or '-')} |")
        lines.append("")
    nodes = [n for n in result.get("nodes") or [] if not n.get("answering", True)]
    if nodes:
        lines += ["## Nodes not answering", ""] + [f"- {_md(n['label'])}: {_md(n.get('error') or 'silent')}"
                                                   for n in nodes]
        lines.append("")
    parts = result.get("parts") or []
    if parts:
        lines += ["## What this bundle holds", "", "| part | files | status | seconds |", "|---|---|---|---|"]
        for p in parts:
            status = p["status"] + (f": {p['error']}" if p.get("error") else "")
            lines.append(f"| {_md(p['what'])} | {_md(', '.join(p['files']) or '-')} | {_md(status)} | "
                         f"{p['seconds']:.1f} |")
        lines.append("")
    return "\n".join(lines)

"""The operator's questions, answered from the history database (plain data; the CLI renders it).

- which nodes fail what now, and since when (`failing`);
- which nodes recur in failed jobs (`recurring`): ``node17: in 4 of the last 6 failed jobs, twice as
  the first failure``;
- one node's timeline (`timeline`): its failed checks, drains and resumes, incidents.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ml_debug.core.output import times
from ml_debug.history.store import History


@dataclass
class Failing:
    """A check failing on a node: since the first failure after its last pass, and how many runs."""
    node: str
    check: str
    target: str
    since: float
    last: float
    runs: int
    value: str
    hint: str


@dataclass
class Recurring:
    node: str
    jobs: int        # failed jobs among the last `window` that name this node
    window: int      # how many failed jobs were looked at
    first: int       # of those, how many this node failed first in
    last: float

    @property
    def line(self) -> str:
        tail = f", {times(self.first)} as the first failure" if self.first else ""
        return f"{self.node}: in {self.jobs} of the last {self.window} failed jobs{tail}"


@dataclass
class Event:
    ts: float
    kind: str       # fail, drain, resume, left, would-drain, would-resume, incident, healthy
    what: str


@dataclass
class HistoryResult:
    """The ``result`` of ``mldebug history --json``."""
    ok: bool
    summary: str
    path: str
    schema_version: int
    since: float | None
    counts: dict[str, int]
    failing: list[Failing] = field(default_factory=list)
    recurring: list[Recurring] = field(default_factory=list)
    node: str | None = None
    timeline: list[Event] = field(default_factory=list)


def failing(h: History, since: float | None = None, node: str | None = None) -> list[Failing]:
    """(node, check, target) whose latest result is a failure, with the start of that failing streak."""
    args: list[object] = []
    where = ""
    if node is not None:
        where = "AND c.node = ?"
        args.append(node)
    rows = h.query(f"""
        WITH latest AS (
            SELECT node, check_id, target, MAX(ts) AS last FROM checks c WHERE 1=1 {where}
            GROUP BY node, check_id, target
        ),
        bad AS (
            SELECT c.node, c.check_id, c.target, c.ts, c.value, c.hint FROM latest l
            JOIN checks c ON c.node = l.node AND c.check_id = l.check_id AND c.target = l.target AND c.ts = l.last
            WHERE c.status = 'fail'
        )
        SELECT b.node, b.check_id, b.target, b.ts AS last, b.value, b.hint,
               (SELECT MAX(p.ts) FROM checks p WHERE p.node = b.node AND p.check_id = b.check_id
                  AND p.target = b.target AND p.status != 'fail') AS good
        FROM bad b ORDER BY b.node, b.check_id, b.target""", tuple(args))
    out = []
    for r in rows:
        good = r["good"] if r["good"] is not None else -1.0
        first, n = h.query("SELECT MIN(ts), COUNT(*) FROM checks WHERE node = ? AND check_id = ? AND target = ? "
                           "AND status = 'fail' AND ts > ?", (r["node"], r["check_id"], r["target"], good))[0]
        if since is not None and r["last"] < since:
            continue
        out.append(Failing(r["node"], r["check_id"], r["target"], first, r["last"], n, r["value"], r["hint"]))
    return out


def recurring(h: History, window: int = 20, since: float | None = None) -> list[Recurring]:
    """Nodes named by the last `window` failed jobs, most often first."""
    jobs = h.query("SELECT source, job, MAX(ts) AS ts FROM incidents WHERE ts >= ? GROUP BY source, job "
                   "ORDER BY ts DESC LIMIT ?", (since or 0.0, window))
    if not jobs:
        return []
    keys = [(r["source"], r["job"]) for r in jobs]
    marks = ",".join("(?,?)" for _ in keys)
    flat = tuple(x for k in keys for x in k)
    rows = h.query(f"SELECT node, COUNT(DISTINCT source || ':' || job) AS jobs, SUM(first) AS first, MAX(ts) AS last "
                   f"FROM incidents WHERE (source, job) IN (VALUES {marks}) GROUP BY node "
                   "ORDER BY jobs DESC, first DESC, node", flat)
    return [Recurring(r["node"], r["jobs"], len(keys), int(r["first"] or 0), r["last"]) for r in rows]


def timeline(h: History, node: str, since: float | None = None, limit: int = 200) -> list[Event]:
    """A node's failed checks (one event per failing run), drains/resumes and incidents, oldest first."""
    since = since or 0.0
    events: list[Event] = []
    for r in h.query("SELECT r.ts, r.ok, r.summary FROM runs r WHERE r.node = ? AND r.ts >= ? "
                     "ORDER BY r.ts DESC LIMIT ?", (node, since, limit)):
        events.append(Event(r["ts"], "healthy" if r["ok"] else "fail", r["summary"]))
    for r in h.query("SELECT ts, action, reason FROM actions WHERE node = ? AND ts >= ? ORDER BY ts DESC LIMIT ?",
                     (node, since, limit)):
        events.append(Event(r["ts"], r["action"], r["reason"]))
    for r in h.query("SELECT ts, source, job, first, summary FROM incidents WHERE node = ? AND ts >= ? "
                     "ORDER BY ts DESC LIMIT ?", (node, since, limit)):
        first = ", failed first" if r["first"] else ""
        events.append(Event(r["ts"], "incident", f"{r['source']} {r['job']}{first}: {r['summary']}"))
    events.sort(key=lambda e: e.ts)
    # consecutive healthy runs say nothing new: keep the first of each streak
    out: list[Event] = []
    for e in events[-limit:]:
        if e.kind == "healthy" and out and out[-1].kind == "healthy":
            continue
        out.append(e)
    return out


def known_nodes(h: History) -> set[str]:
    rows = h.query("SELECT node FROM runs UNION SELECT node FROM actions UNION SELECT node FROM incidents")
    return {r["node"] for r in rows}


def counts(h: History) -> dict[str, int]:
    return {t: int(h.query(f"SELECT COUNT(*) FROM {t}")[0][0]) for t in ("runs", "checks", "actions", "incidents")}

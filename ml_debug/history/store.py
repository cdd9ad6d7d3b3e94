"""The history database: one SQLite file (``sqlite3``), versioned schema, safe with several writers.

Several processes write at once (the health hook of every node when the file is on shared storage, an
Epilog beside a HealthCheckProgram, `mldebug logs` on a login node): the file runs in WAL mode with a
busy timeout, and every record is one short transaction, so a writer waits for another instead of
failing or losing its rows. The schema version is SQLite's ``user_version``; an older file is
migrated in place (one transaction per step), a newer one or a file that is not a database is a
clear error and is never replaced.

The path is opened the way ``--out-dir`` is (``core/safefs``): the directory must be ours or root's
and not writable by others, and the database file (and its ``-wal``/``-shm`` companions) must be a
regular file, never a symbolic link that another user planted.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import stat
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ml_debug.core.errors import EnvironmentProblem, UsageError

ENV = "MLDEBUG_HISTORY"
SCHEMA_VERSION = 2
BUSY_TIMEOUT_MS = 30_000  # a writer waits this long for another one before giving up
DAYS_ENV = "MLDEBUG_HISTORY_DAYS"
OUR_TABLES = ("runs", "checks", "actions", "incidents")  # a file without them is not a history database
DEFAULT_DAYS = 90  # check results and runs older than this are pruned; drains and incidents are kept
PRUNE_EVERY = 500  # runs between two prunes (a prune is one indexed DELETE)

# version -> the SQL that takes a file from version-1 to version. Never edit a step once released:
# add the next one.
MIGRATIONS: dict[int, str] = {
    1: """
    CREATE TABLE runs (
        id INTEGER PRIMARY KEY,
        ts REAL NOT NULL,            -- unix time the run ended
        node TEXT NOT NULL,
        source TEXT NOT NULL,        -- 'slurm-check', 'health', ...
        ok INTEGER NOT NULL,
        summary TEXT NOT NULL,
        duration_s REAL
    );
    CREATE TABLE checks (
        id INTEGER PRIMARY KEY,
        run_id INTEGER NOT NULL REFERENCES runs(id),
        ts REAL NOT NULL,
        node TEXT NOT NULL,
        check_id TEXT NOT NULL,      -- 'gpu.row_remap'
        target TEXT NOT NULL,        -- 'gpu3', 'host', '/scratch'
        status TEXT NOT NULL,        -- pass warn fail skip info
        value TEXT NOT NULL,
        hint TEXT NOT NULL
    );
    CREATE INDEX checks_by_node ON checks(node, check_id, target, ts);
    CREATE INDEX checks_by_status ON checks(status, ts);
    CREATE TABLE actions (
        id INTEGER PRIMARY KEY,
        ts REAL NOT NULL,
        node TEXT NOT NULL,
        action TEXT NOT NULL,        -- drain, resume, left (not ours), would-drain, would-resume
        reason TEXT NOT NULL,
        actor TEXT NOT NULL          -- user@host that acted
    );
    CREATE INDEX actions_by_node ON actions(node, ts);
    CREATE TABLE incidents (
        id INTEGER PRIMARY KEY,
        ts REAL NOT NULL,
        source TEXT NOT NULL,        -- 'logs', 'watch'
        job TEXT NOT NULL,           -- the job (Slurm id, log directory): nodes of one job share it
        node TEXT NOT NULL,
        first INTEGER NOT NULL,      -- 1 when this node failed first in that job
        summary TEXT NOT NULL
    );
    CREATE INDEX incidents_by_job ON incidents(job, ts);
    CREATE INDEX incidents_by_node ON incidents(node, ts);
    """,
    # 2: old check results and runs are pruned by time
    2: """
    CREATE INDEX checks_by_ts ON checks(ts);
    CREATE INDEX runs_by_ts ON runs(ts);
    """,
}


def keep_days() -> float:
    """``$MLDEBUG_HISTORY_DAYS`` (default 90; 0 keeps everything)."""
    word = os.environ.get(DAYS_ENV, "").strip()
    try:
        days = float(word) if word else DEFAULT_DAYS
    except ValueError:
        raise UsageError(f"{DAYS_ENV}={word!r} is not a number of days",
                         f"e.g. {DAYS_ENV}=90, or 0 to keep every result") from None
    return max(days, 0.0)


def default_path() -> Path:
    """``$MLDEBUG_HISTORY``; else /var/lib/mldebug/history.db for root (slurmd runs the hook as root),
    else ``$XDG_STATE_HOME/mldebug/history.db`` (``~/.local/state``)."""
    env = os.environ.get(ENV, "").strip()
    if env:
        return Path(env)
    if os.geteuid() == 0:
        return Path("/var/lib/mldebug/history.db")
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(state) / "mldebug" / "history.db"


@dataclass
class CheckRow:
    check_id: str
    target: str
    status: str
    value: str
    hint: str


def _refuse_link(dir_fd: int, name: str, shown: str) -> None:
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        raise UsageError(f"history database {shown} is a directory",
                         "name a file, e.g. --history /var/lib/mldebug/history.db")
    if not stat.S_ISREG(st.st_mode):
        kind = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a regular file"
        raise UsageError(f"history database {shown} is {kind}: not followed",
                         "remove it, or name a regular file in a directory that only you can write")
    if st.st_uid not in (0, os.geteuid()):
        raise UsageError(f"history database {shown} belongs to uid {st.st_uid}",
                         "use a database file that you (or root) own")


def _open_dir(path: Path) -> int:
    from ml_debug.core import safefs

    parent = str(path.parent) or "."
    try:
        fd = safefs.open_out_dir(parent)
    except UsageError as e:
        raise UsageError(e.message.replace("--out-dir", "history directory", 1),
                         "put the history database in a directory that you own (--history PATH or "
                         f"{ENV})") from None
    st = os.fstat(fd)
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        os.close(fd)
        raise UsageError(f"history directory {parent} is writable by other users: they could plant "
                         "the database's companion files", "use a directory only you can write, e.g. "
                         "/var/lib/mldebug or ~/.local/state/mldebug")
    return fd


class History:
    """An open history database. Use as a context manager; every ``record_*`` is its own transaction."""

    def __init__(self, path: Path, *, create: bool = True, read_only: bool = False) -> None:
        self.path = path
        self.read_only = read_only
        shown = str(path)
        if path.name in ("", ".", ".."):
            raise UsageError(f"history database {shown} is a directory", "name a file, e.g. history.db")
        if (read_only or not create) and not path.exists():
            raise UsageError(f"no history database at {shown}",
                             f"the health hook writes one; name it with --history PATH or {ENV}")
        self._dir_fd = _open_dir(path)
        try:
            for name in (path.name, path.name + "-wal", path.name + "-shm", path.name + "-journal"):
                _refuse_link(self._dir_fd, name, shown if name == path.name else f"{shown}{name[len(path.name):]}")
            # through the directory's descriptor: the directory we checked is the one SQLite uses
            at = f"/proc/self/fd/{self._dir_fd}/{path.name}"
            if read_only:  # SQLite itself refuses every write: the file stays byte for byte as it was
                from urllib.parse import quote

                self._db = sqlite3.connect(f"file:{quote(at)}?mode=ro", uri=True, timeout=BUSY_TIMEOUT_MS / 1000,
                                           isolation_level=None)
            else:
                self._db = sqlite3.connect(at, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None)
        except BaseException:
            os.close(self._dir_fd)
            raise
        try:
            if read_only:
                self._check_read_only()
                return
            with self._setup_lock():
                self._prepare()
        except BaseException:
            self.close()
            raise

    @contextlib.contextmanager
    def _setup_lock(self) -> Iterator[None]:
        """One process at a time checks and migrates the schema and sets WAL mode: two hooks opening a new
        file at once otherwise deadlock in SQLite (switching to WAL needs the file alone) until the busy
        timeout. A ``<name>-lock`` file beside it, never followed through a link, held with flock."""
        import fcntl

        name = self.path.name + "-lock"
        try:
            fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=self._dir_fd)
        except OSError as e:
            raise UsageError(f"history database {self.path}: cannot open {name}: {e.strerror}",
                             "a link or another user's file is there: remove it") from None
        try:
            deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise EnvironmentProblem(f"history database {self.path} stayed locked for "
                                                 f"{BUSY_TIMEOUT_MS // 1000} s (its {name})",
                                                 "another writer holds it: see `fuser` on the file") from None
                    time.sleep(0.05)
            yield
        finally:
            os.close(fd)  # releases the lock

    # ---------------------------------------------------------------- schema

    def _tables(self) -> set[str]:
        return {str(r[0]) for r in self._db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}

    def _not_ours(self, why: str) -> UsageError:
        return UsageError(f"{self.path} is not an mldebug history database ({why})",
                          f"it is left as it is: name the history with --history PATH or {ENV} (the health hook "
                          "writes one)")

    def _check_read_only(self) -> None:
        """A reader (`mldebug history`) reads only a history database: another application's SQLite file,
        an empty file or an older file are refused as they are, never created, migrated or converted."""
        try:
            self._db.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            version = int(self._db.execute("PRAGMA user_version").fetchone()[0])
            if version > SCHEMA_VERSION:
                raise EnvironmentProblem(
                    f"history database {self.path} has schema version {version}; this mldebug knows up to "
                    f"{SCHEMA_VERSION}", "it was written by a newer mldebug: upgrade mldebug here")
            missing = set(OUR_TABLES) - self._tables()
            if version < 1 or missing:  # SQLite reads an empty file as an empty database
                raise self._not_ours("empty" if not self.path.stat().st_size else
                                     f"schema version {version}, no table {', '.join(sorted(missing))}" if missing
                                     else f"schema version {version}")
        except sqlite3.DatabaseError as e:
            self.close()
            raise UsageError(f"history database {self.path} is not a readable SQLite database ({e})",
                             "it is left as it is: move it aside to start a new history, or name another file "
                             f"with --history PATH or {ENV}") from None
        except BaseException:
            self.close()
            raise

    def _prepare(self) -> None:
        shown = str(self.path)
        try:
            self._db.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            version = self._db.execute("PRAGMA user_version").fetchone()[0]
            if version == 0 and self._tables():  # another application's database: never add our tables to it
                raise self._not_ours(f"it holds tables {', '.join(sorted(self._tables())[:4])}")
            if version > SCHEMA_VERSION:
                raise EnvironmentProblem(
                    f"history database {shown} has schema version {version}; this mldebug knows up to "
                    f"{SCHEMA_VERSION}", "it was written by a newer mldebug: upgrade mldebug here (the file is "
                    "left as it is)")
            mode = self._db.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":  # a file system without shared memory (some network mounts)
                self._db.execute("PRAGMA journal_mode = DELETE")
            self._db.execute("PRAGMA synchronous = NORMAL")
            if version < SCHEMA_VERSION:
                self._migrate(version)
        except sqlite3.DatabaseError as e:
            if "not a database" in str(e) or "malformed" in str(e) or "disk image" in str(e):
                raise UsageError(f"history database {shown} is not a readable SQLite database ({e})",
                                 "it is left as it is: move it aside to start a new history, or name another "
                                 f"file with --history PATH or {ENV}") from None
            if "locked" in str(e) or "busy" in str(e):
                raise EnvironmentProblem(f"history database {shown} stayed locked for "
                                         f"{BUSY_TIMEOUT_MS // 1000} s ({e})",
                                         "another writer holds it: see `fuser` on the file") from None
            raise UsageError(f"history database {shown}: {e}", "check the file and its directory") from None

    def _migrate(self, version: int) -> None:
        for target in range(version + 1, SCHEMA_VERSION + 1):
            self._db.execute("BEGIN IMMEDIATE")
            try:
                now = self._db.execute("PRAGMA user_version").fetchone()[0]
                if now >= target:  # another writer migrated meanwhile
                    self._db.execute("COMMIT")
                    continue
                for statement in MIGRATIONS[target].split(";"):
                    if statement.strip():
                        self._db.execute(statement)
                self._db.execute(f"PRAGMA user_version = {target}")
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    @property
    def version(self) -> int:
        return int(self._db.execute("PRAGMA user_version").fetchone()[0])

    # ---------------------------------------------------------------- writing

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        try:
            self._db.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as e:
            raise EnvironmentProblem(f"history database {self.path} stayed locked ({e})",
                                     "another writer holds it: see `fuser` on the file") from None
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def record_run(self, node: str, source: str, ok: bool, summary: str, checks: Iterable[CheckRow],
                   duration_s: float | None = None, ts: float | None = None) -> int:
        """One run of the checks on `node` and every check it made; the run's id."""
        ts = time.time() if ts is None else ts
        with self._transaction() as db:
            cur = db.execute("INSERT INTO runs(ts, node, source, ok, summary, duration_s) VALUES (?,?,?,?,?,?)",
                             (ts, node, source, int(ok), summary, duration_s))
            run_id = int(cur.lastrowid or 0)
            db.executemany("INSERT INTO checks(run_id, ts, node, check_id, target, status, value, hint) "
                           "VALUES (?,?,?,?,?,?,?,?)",
                           [(run_id, ts, node, c.check_id, c.target, c.status, c.value, c.hint) for c in checks])
        if run_id % PRUNE_EVERY == 0:
            days = keep_days()
            if days:
                self.prune(time.time() - days * 86400)
        return run_id

    def prune(self, before: float) -> int:
        """Delete check results and runs older than `before` (unix time); drains, resumes and incidents
        stay. The number of check results deleted."""
        with self._transaction() as db:
            n = db.execute("DELETE FROM checks WHERE ts < ?", (before,)).rowcount
            db.execute("DELETE FROM runs WHERE ts < ?", (before,))
        return int(n)

    def record_action(self, node: str, action: str, reason: str, actor: str, ts: float | None = None) -> None:
        with self._transaction() as db:
            db.execute("INSERT INTO actions(ts, node, action, reason, actor) VALUES (?,?,?,?,?)",
                       (time.time() if ts is None else ts, node, action, reason, actor))

    def record_incident(self, source: str, job: str, nodes: Iterable[str], first: str | None, summary: str,
                        ts: float | None = None) -> None:
        """One failed job: every node it names, the one that failed first marked. Recording the same
        job again (the log directory read twice) replaces its rows."""
        ts = time.time() if ts is None else ts
        with self._transaction() as db:
            db.execute("DELETE FROM incidents WHERE source = ? AND job = ?", (source, job))
            db.executemany("INSERT INTO incidents(ts, source, job, node, first, summary) VALUES (?,?,?,?,?,?)",
                           [(ts, source, job, n, int(n == first), summary) for n in dict.fromkeys(nodes)])

    # ---------------------------------------------------------------- reading

    def query(self, sql: str, args: tuple[Any, ...] = ()) -> list[sqlite3.Row]:
        self._db.row_factory = sqlite3.Row
        try:
            return list(self._db.execute(sql, args))
        finally:
            self._db.row_factory = None

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._db.close()
        with contextlib.suppress(OSError):
            os.close(self._dir_fd)

    def __enter__(self) -> History:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_history(path: str | os.PathLike[str] | None = None, *, create: bool = True,
                 read_only: bool = False) -> History:
    """The history database at `path` (default :func:`default_path`), created and migrated as needed;
    `read_only`: opened read-only, and refused unless it is a history database already."""
    return History(Path(path) if path is not None else default_path(), create=create, read_only=read_only)


def record_incident(source: str, job: str, nodes: Iterable[str], first: str | None, summary: str) -> str | None:
    """Record a failed job's nodes when ``$MLDEBUG_HISTORY`` names a database (`mldebug logs`,
    `mldebug watch` call this); None, or why it was not recorded (a warning for the caller to show).
    Without the variable nothing is written: an ad-hoc `mldebug logs` on a laptop keeps no history."""
    if not os.environ.get(ENV, "").strip():
        return None
    nodes = [n for n in nodes if n]
    if not nodes:
        return None
    from ml_debug.core.errors import MLDebugError

    try:
        with open_history() as h:
            h.record_incident(source, job, nodes, first, summary)
    except MLDebugError as e:
        return f"not recorded in the history: {e.message}"
    except sqlite3.Error as e:
        return f"not recorded in the history: {e}"
    return None

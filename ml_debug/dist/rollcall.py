"""The roll call: which ranks are here, where the others stopped, and one verdict for all of them.

A protocol over the job's store (store.py), not the process group, so it still works when the
group is broken, a rank was killed or a rank hangs inside a collective. Every rank:

1. ``check_in(identity)`` (``checkin/<rank>``) and starts a heartbeat (``hb/<rank>``, bumped every
   ``heartbeat_s``); ``await_check_ins`` waits, with a deadline, for the others to do the same;
2. marks each step it starts with ``at(stage)`` (``stage/<rank>``);
3. at the end, ``gather(record)`` posts its record (``result/<rank>``) and waits for the records of
   the ranks that checked in, or for proof that they are gone: a heartbeat unchanged for
   ``dead_after_s`` (killed), or the wait running out after ``wait_s`` (hung, or slow);
4. the lowest rank with a record is the reporter: it reads every record, judges, and publishes
   the verdict with ``publish`` (``verdict``); the others ``await_verdict`` and acknowledge it
   (``ack/<rank>``), and a reporter that hosts the store waits up to ``grace_s`` for those acks
   before its process (and the store with it) goes away.

Records and identities are opaque JSON strings: the caller turns them into its own types. Every wait
has a deadline; a store that cannot be reached raises :class:`StoreUnavailable` (exit code 4), after
which a rank can only report itself. Importing this module does not import torch.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from ml_debug.core.errors import ExitCode, first_line
from ml_debug.dist.store import StoreUnavailable, store_get, store_set, wait_keys
from ml_debug.dist.world import World

HEARTBEAT_S = 1.0
DEAD_AFTER_S = 4.0  # no heartbeat for this long: the rank is gone (killed), stop waiting for it
POLL_S = 0.1  # how often gather looks at the records and heartbeats it still waits for

__all__ = ["DEAD_AFTER_S", "HEARTBEAT_S", "Absent", "Gathered", "Heartbeat", "RollCall", "StoreUnavailable"]


def _gone(e: BaseException) -> StoreUnavailable:
    return StoreUnavailable(f"the job's store went away: {first_line(e)}",
                            "rank 0 (or the launcher hosting the store) probably died")


def _check(store: Any, key: str) -> bool:
    try:
        return bool(store.check([key]))
    except Exception as e:
        raise _gone(e) from e


def _add(store: Any, key: str, amount: int) -> int:
    try:
        return int(store.add(key, amount))
    except Exception as e:
        raise _gone(e) from e


@dataclass(frozen=True)
class Absent:
    """A rank with no record at the end of the roll call, and what the store knows about it."""

    rank: int
    identity_json: str | None  # what it checked in with; None: it never checked in
    last_stage: str | None  # the last stage it marked with ``at``; None: none
    heartbeat_lost: bool  # its heartbeat stopped (killed) rather than the wait running out (hung, slow)

    @property
    def checked_in(self) -> bool:
        return self.identity_json is not None

    @property
    def reason(self) -> str:
        """``never checked in``, ``stopped during <stage>`` or ``stopped during <stage>, no heartbeat``."""
        if not self.checked_in:
            return "never checked in"
        where = f"stopped during {self.last_stage}" if self.last_stage else "stopped after checking in"
        return where + (", no heartbeat" if self.heartbeat_lost else "")


@dataclass(frozen=True)
class Gathered:
    """The end of a roll call, as one rank sees it.

    ``records`` and ``absent`` are read on the reporter only (the others leave them empty, so a
    job of N ranks costs the store N reads, not N*N); every rank knows ``present`` and ``reporter``.
    """

    rank: int
    world_size: int
    reporter: int
    present: tuple[int, ...]  # the ranks whose record reached the store, this one included
    records: dict[int, str] = field(default_factory=dict)  # rank -> its record (reporter only)
    absent: dict[int, Absent] = field(default_factory=dict)  # rank -> why it has no record (reporter only)

    @property
    def is_reporter(self) -> bool:
        return self.rank == self.reporter

    @property
    def missing(self) -> tuple[int, ...]:
        """The ranks without a record (known on every rank)."""
        return tuple(r for r in range(self.world_size) if r not in self.present)


class Heartbeat:
    """Bumps ``hb/<rank>`` in the store every ``every_s`` so peers can tell a killed rank from a slow
    one. A daemon thread: it stops with ``stop()``, at the end of a ``with`` block, when the process
    ends, or at the first store error (the rank's next store call then reports the store's loss)."""

    def __init__(self, store: Any, rank: int, every_s: float = HEARTBEAT_S) -> None:
        self.store, self.key, self.every_s = store, f"hb/{rank}", every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="mldebug-heartbeat", daemon=True)

    def start(self) -> Heartbeat:
        if not self._thread.is_alive() and not self._stop.is_set():
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop bumping; returns once the thread has ended (bounded: a store call that blocks past
        ``every_s`` is left to end on its own)."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=max(1.0, self.every_s))

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.store.add(self.key, 1)
            except Exception:
                return
            self._stop.wait(self.every_s)

    def __enter__(self) -> Heartbeat:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def hosts_store(world: World) -> bool:
    """Whether this process hosts the job's store (as ``create_store`` decides): rank 0, unless the
    launcher's agent hosts it (torchrun, self-launch: TORCHELASTIC_USE_AGENT_STORE=True)."""
    return world.rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True"


class RollCall:
    """One rank's side of the roll call over ``store`` (a torch Store, usually ``create_store``'s).

    ``wait_s`` bounds how long ``gather`` waits for live ranks' records (a caller whose steps each
    end within a timeout passes that timeout plus grace); ``grace_s`` bounds the store host's wait
    for the acks. Keys are used as given: pass a PrefixStore to keep two roll calls apart.
    """

    def __init__(self, store: Any, rank: int, world_size: int, wait_s: float, grace_s: float, *,
                 hosts_store: bool = False, heartbeat_s: float = HEARTBEAT_S,
                 dead_after_s: float = DEAD_AFTER_S) -> None:
        self.store, self.rank, self.world_size = store, rank, world_size
        self.wait_s, self.grace_s = wait_s, grace_s
        self.hosts_store = hosts_store
        self.heartbeat_s, self.dead_after_s = heartbeat_s, dead_after_s
        self.heartbeat: Heartbeat | None = None
        self._present: tuple[int, ...] = ()

    @classmethod
    def for_world(cls, store: Any, world: World, wait_s: float, grace_s: float) -> RollCall:
        """The roll call of this process's rank in ``world``, over the store ``create_store`` made."""
        return cls(store, world.rank, world.world_size, wait_s, grace_s, hosts_store=hosts_store(world))

    # -- arriving --------------------------------------------------------------------------
    def check_in(self, identity_json: str) -> None:
        """Tell the others this rank is here and who it is (shown for it if it goes missing later)."""
        store_set(self.store, f"checkin/{self.rank}", identity_json)

    def start_heartbeat(self) -> Heartbeat:
        """Start (once) this rank's heartbeat; it runs until ``stop_heartbeat`` or the process ends."""
        if self.heartbeat is None:
            self.heartbeat = Heartbeat(self.store, self.rank, self.heartbeat_s).start()
        return self.heartbeat

    def stop_heartbeat(self) -> None:
        if self.heartbeat is not None:
            self.heartbeat.stop()

    def await_check_ins(self, timeout_s: float) -> list[int]:
        """Wait up to ``timeout_s`` for every rank's check-in; returns the ranks still missing."""
        missing = wait_keys(self.store, [f"checkin/{r}" for r in range(self.world_size)], max(0.0, timeout_s))
        return [int(k.split("/", 1)[1]) for k in missing]

    def at(self, stage: str) -> None:
        """Mark the stage this rank starts now: a rank that goes missing is named with it.

        Advisory: a store that went away is not an error here (the next ``gather`` or wait says so).
        """
        try:
            self.store.set(f"stage/{self.rank}", stage)
        except Exception:
            pass

    # -- the end ---------------------------------------------------------------------------
    def gather(self, record_json: str) -> Gathered:
        """Post this rank's record, then wait (at most ``wait_s``) for the record of every rank that
        checked in, or proof that it is gone (no heartbeat for ``dead_after_s``). Ranks that never
        checked in are not waited for. Raises StoreUnavailable when the store cannot be reached."""
        store_set(self.store, f"result/{self.rank}", record_json)
        waiting = {r for r in range(self.world_size) if r != self.rank and _check(self.store, f"checkin/{r}")}
        dead: set[int] = set()
        beats: dict[int, tuple[int, float]] = {}  # rank -> (heartbeat count, when it last changed)
        deadline = time.monotonic() + self.wait_s
        while waiting and time.monotonic() < deadline:
            for r in sorted(waiting):
                if _check(self.store, f"result/{r}"):
                    waiting.discard(r)
                    continue
                count = _add(self.store, f"hb/{r}", 0)
                last = beats.get(r)
                now = time.monotonic()
                if last is None or last[0] != count:
                    beats[r] = (count, now)
                elif now - last[1] > self.dead_after_s:
                    waiting.discard(r)
                    dead.add(r)
            if waiting:
                time.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))
        present = tuple(r for r in range(self.world_size) if r == self.rank or _check(self.store, f"result/{r}"))
        self._present = present
        reporter = min(present)
        if reporter != self.rank:
            return Gathered(self.rank, self.world_size, reporter, present)
        records = {r: store_get(self.store, f"result/{r}") for r in present}
        absent = {r: self._absent(r, r in dead) for r in range(self.world_size) if r not in present}
        return Gathered(self.rank, self.world_size, reporter, present, records, absent)

    def _absent(self, rank: int, heartbeat_lost: bool) -> Absent:
        if not _check(self.store, f"checkin/{rank}"):
            return Absent(rank, None, None, False)
        identity = store_get(self.store, f"checkin/{rank}")
        stage = store_get(self.store, f"stage/{rank}") if _check(self.store, f"stage/{rank}") else None
        return Absent(rank, identity, stage, heartbeat_lost)

    def publish(self, verdict: int) -> None:
        """The reporter's verdict (an exit code) for every rank; a reporter that hosts the store then
        waits up to ``grace_s`` for the others' acks, so they read it before the store goes away."""
        store_set(self.store, "verdict", str(int(verdict)))
        if self.hosts_store:
            wait_keys(self.store, [f"ack/{r}" for r in self._present if r != self.rank], self.grace_s)

    def await_verdict(self) -> int:
        """Wait (at most ``wait_s`` + ``dead_after_s``) for the reporter's verdict and acknowledge it;
        exit code 4 (partial) when none came (the reporter died while judging)."""
        missing = wait_keys(self.store, ["verdict"], self.wait_s + self.dead_after_s)
        code = int(store_get(self.store, "verdict")) if not missing else int(ExitCode.PARTIAL)
        store_set(self.store, f"ack/{self.rank}", "1")
        return code

"""Ctrl-C and SIGTERM held while a child starts (ml_debug.core.lifecycle.held_signals): a signal that comes
then is raised where the child is held, by the same rule (KeyboardInterrupt, the signal named, the same
Ctrl-C twice passed over); handlers that are not mldebug's keep their meaning; outside the main thread
the block changes nothing; the child starts with nothing blocked."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from ml_debug.core import lifecycle

SLEEP = ["sleep", "30"]


@pytest.fixture(autouse=True)
def ours() -> Iterator[None]:
    """mldebug's rule in place (as `install()` puts it), and this process's handlers back afterwards."""
    saved = lifecycle.handlers()
    received, last = list(lifecycle._received), list(lifecycle._last)
    lifecycle._received.clear()
    lifecycle._last[0] = (0, -lifecycle.SAME_SIGNAL_S)
    signal.signal(signal.SIGINT, lifecycle._interrupt)
    signal.signal(signal.SIGTERM, lifecycle._interrupt)
    try:
        yield
    finally:
        lifecycle.restore(saved)
        lifecycle._received[:] = received
        lifecycle._last[:] = last


def _stop(proc: subprocess.Popen[Any]) -> None:
    proc.kill()
    proc.wait()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_while_the_child_starts_is_raised_where_the_child_is_held(sig: signal.Signals) -> None:
    stopped: list[int] = []
    with lifecycle.held_signals() as held:
        proc = held.popen(SLEEP, start_new_session=True)
        os.kill(os.getpid(), sig)  # as if it came during Popen
        assert signal.getsignal(sig) is not lifecycle._interrupt
        try:
            assert proc.poll() is None  # nothing raised yet: the child is held by now
            held.release()
            pytest.fail("the held signal was not delivered")
        except KeyboardInterrupt:
            stopped.append(proc.pid)
            _stop(proc)
    assert stopped == [proc.pid] and proc.returncode == -signal.SIGKILL
    assert lifecycle.interrupting_signal() == sig.name
    assert signal.getsignal(signal.SIGINT) is lifecycle._interrupt
    assert signal.getsignal(signal.SIGTERM) is lifecycle._interrupt


def test_the_same_ctrl_c_twice_is_one_interrupt() -> None:
    """`timeout -s INT` signals the process, then its group: two SIGINTs during the start are one interrupt,
    and one that follows at once is still the same Ctrl-C."""
    with pytest.raises(KeyboardInterrupt), lifecycle.held_signals() as held:
        proc = held.popen(SLEEP, start_new_session=True)
        try:
            signal.raise_signal(signal.SIGINT)
            signal.raise_signal(signal.SIGINT)
            assert held.pending == [signal.SIGINT, signal.SIGINT]
            held.release()
        finally:
            _stop(proc)
    signal.raise_signal(signal.SIGINT)  # within a second of the first: passed over, nothing raised
    assert lifecycle._received == [signal.SIGINT]


def test_a_parent_death_sigterm_again_is_one_interrupt_and_another_signal_is_not() -> None:
    """The kernel sends a tied child its parent-death signal once per thread of the dying parent: a SIGTERM
    again within a second is the same one (the stop it started goes on); a SIGINT then is a new interrupt."""
    with pytest.raises(KeyboardInterrupt):
        signal.raise_signal(signal.SIGTERM)
    signal.raise_signal(signal.SIGTERM)  # passed over, nothing raised
    signal.raise_signal(signal.SIGTERM)
    assert lifecycle._received == [signal.SIGTERM]
    with pytest.raises(KeyboardInterrupt):
        signal.raise_signal(signal.SIGINT)
    assert lifecycle._received == [signal.SIGTERM, signal.SIGINT]


def test_a_handler_that_is_not_ours_gets_the_signal_after_the_block() -> None:
    got: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, _frame: got.append(signum))  # torch's agent, say
    with lifecycle.held_signals() as held:
        proc = held.popen(SLEEP, start_new_session=True)
        signal.raise_signal(signal.SIGTERM)
        assert got == []
    _stop(proc)
    assert got == [signal.SIGTERM]


def test_an_ignored_signal_stays_ignored() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # nohup, a background job
    with lifecycle.held_signals() as held:
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
        proc = held.popen(SLEEP, start_new_session=True)
        signal.raise_signal(signal.SIGINT)
    _stop(proc)
    assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN and held.pending == []


def test_a_start_that_fails_still_delivers_the_signal() -> None:
    with pytest.raises(KeyboardInterrupt) as caught, lifecycle.held_signals() as held:
        signal.raise_signal(signal.SIGTERM)
        held.popen(["/nonexistent/mldebug-no-such-program"])
    assert isinstance(caught.value.__context__, FileNotFoundError)
    assert signal.getsignal(signal.SIGTERM) is lifecycle._interrupt


def test_outside_the_main_thread_the_block_changes_nothing() -> None:
    seen: list[object] = []

    def start() -> None:
        with lifecycle.held_signals() as held:
            seen.append(signal.getsignal(signal.SIGINT))
            proc = held.popen(SLEEP, start_new_session=True)
        _stop(proc)
        seen.append(proc.returncode)

    t = threading.Thread(target=start)
    t.start()
    t.join(30)
    assert seen == [lifecycle._interrupt, -signal.SIGKILL]


def test_the_child_starts_with_no_signal_blocked_and_none_caught() -> None:
    """Held, not blocked: a blocked mask would pass through fork and exec, and an ssh or py-spy started so
    would never see SIGTERM."""
    with lifecycle.held_signals() as held:
        proc = held.popen(["grep", "-E", "^Sig(Blk|Cgt)", "/proc/self/status"], stdout=subprocess.PIPE, text=True)
        try:
            held.release()
            out, _ = proc.communicate(timeout=30)
        except BaseException:
            _stop(proc)
            raise
    masks = {line.split(":")[0]: int(line.split()[1], 16) for line in out.splitlines()}
    bits = (1 << (signal.SIGINT - 1)) | (1 << (signal.SIGTERM - 1))
    assert masks.keys() == {"SigBlk", "SigCgt"} and not masks["SigBlk"] & bits and not masks["SigCgt"] & bits

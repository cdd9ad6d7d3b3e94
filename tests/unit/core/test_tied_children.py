"""core/lifecycle's tied children (PR_SET_PDEATHSIG): a child started from a thread that then ends lives on, and
still dies with the process, however it dies (SIGKILL). Real processes: a Python parent that starts `sleep`."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from ml_debug.core.lifecycle import alive
from tests.conftest import REPO, wait_until

PARENT = """
import sys, threading
from ml_debug.core import lifecycle
started = []
def start():
    started.append(lifecycle.popen_tied(["sleep", "600"], stdin=-3, stdout=-3))
    started.append(threading.get_native_id())
t = threading.Thread(target=start)
t.start()
t.join()  # the thread that asked for the child has ended
print(started[0].pid, started[1], flush=True)
sys.stdin.read()  # until the test kills us
"""


def _sigterm_pending(pid: int) -> bool:
    status = dict(line.split(":\t", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                  if ":\t" in line)
    return bool((int(status["SigPnd"], 16) | int(status["ShdPnd"], 16)) & (1 << (signal.SIGTERM - 1)))


def test_a_child_of_an_ended_thread_lives_on_and_dies_with_the_process(tmp_path: Path) -> None:
    """The kernel sends the signal when the thread that forked the child ends: a `top` stream's srun, started by
    a thread that returns once it is connected, was killed at once. popen_tied starts it from a thread that lives
    as long as the process."""
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, cwd=REPO)
    try:
        assert parent.stdout is not None
        child, thread = (int(w) for w in parent.stdout.readline().split())
        # once the thread is gone from the kernel's view, a signal it was to send has been sent: the child is
        # alive, and no SIGTERM waits for it (a pending one shows in /proc/PID/status before it kills)
        wait_until(lambda: not Path(f"/proc/{parent.pid}/task/{thread}").exists(), 30, "the asking thread to end")
        assert alive(child) and not _sigterm_pending(child) and parent.poll() is None
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=30)
        wait_until(lambda: not alive(child), 30, "the tied child to die with its SIGKILLed parent")
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()

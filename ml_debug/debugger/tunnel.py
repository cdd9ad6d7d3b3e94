"""The prompt here, the debugger on a rank's node: DAP through an ssh session or a Slurm step's pipes.

The node runs mldebug's agent (``mldebug attach --pid P --dap-agent``, ml_debug/debugger/agent.py):
debugpy's adapter behind the agent's stdin and stdout. This side reads the agent's first line (it
could attach, or why not), then hands the stream to the DAP client:

- ``--hosts``: an ssh session (paramiko, the remote layer's pool) whose channel is the wire;
- ``--slurm-job``: ``srun --jobid J --overlap -w NODE -u`` with its stdin and stdout on one end of a
  socket pair (``-u``: srun passes the bytes on at once, not line by line).

Nothing listens for it, here or there. Closing the link ends the agent's stdin: the agent ends the
adapter (the process resumes) and says in its last line whether the process still runs; a client
that dies closes the same stdin (sshd, srun), with the same effect.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import threading
import time
from collections import deque
from typing import Any

from ml_debug.core import lifecycle
from ml_debug.core.errors import EnvironmentProblem, ExitCode, MLDebugError, PartialResult
from ml_debug.debugger.agent import END, START
from ml_debug.debugger.dap import Wire
from ml_debug.remote.targets import Target, TargetSpec

MAX_PREAMBLE = 64 * 1024  # a login banner before the agent's first line; more is not an agent
CLOSE_S = 10.0  # after the detach: how long the agent gets to end the adapter and say its last line


class NodeRefused(MLDebugError):
    """The rank's node could not serve the debugger (its words, its exit code)."""

    def __init__(self, message: str, hint: str | None, exit_code: int) -> None:
        super().__init__(message, hint)
        self.exit_code = ExitCode(exit_code) if exit_code in ExitCode._value2member_map_ else ExitCode.PROBLEM


def agent_script(spec: TargetSpec, pid: int) -> str:
    """What the node's shell runs: ``[prefix &&] exec mldebug attach --pid P --dap-agent``."""
    from ml_debug.remote.runner import build_script, mldebug_base

    return build_script(["exec", *mldebug_base(spec.remote_python), "attach", "--pid", str(pid), "--dap-agent"],
                        spec.remote_prefix)


def _read_header(wire: Wire, where: str, deadline: float, said: Any) -> dict[str, Any]:
    """The agent's first line (a banner before it is skipped); MLDebugError when it never comes."""
    buf = bytearray()
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise PartialResult(f"{where}: mldebug's debugger agent did not answer within its time",
                                "raise --attach-timeout on a loaded node")
        wire.settimeout(left)
        try:
            byte = wire.recv(1)
        except TimeoutError:
            continue
        except OSError as e:
            raise PartialResult(f"{where}: the connection broke ({e})") from None
        if not byte:
            tail = [x for x in said().strip().splitlines() if x.strip()]
            why = tail[-1].removeprefix("srun: error: ") if tail else "no output"
            if "No module named" in why or "not found" in why or "No such file" in why:
                raise EnvironmentProblem(f"{where}: mldebug's debugger agent did not start: {why}",
                                         "install the same mldebug there (--remote-python, --remote-prefix)")
            raise PartialResult(f"{where}: mldebug's debugger agent ended before it answered: {why}")
        if byte != b"\n":
            buf += byte
            if len(buf) > MAX_PREAMBLE:
                raise PartialResult(f"{where}: the node printed {MAX_PREAMBLE} bytes and no agent line")
            continue
        line, buf = bytes(buf).strip(), bytearray()
        if not line.startswith(b'{"' + START.encode()):
            continue  # a login banner
        try:
            doc = json.loads(line)
        except ValueError:
            raise PartialResult(f"{where}: mldebug's debugger agent said something this mldebug cannot read: "
                                f"{line[:120]!r}", "install the same mldebug version on every node") from None
        if not doc.get("ok"):
            raise NodeRefused(f"{doc.get('host') or where}: {doc.get('error')}", doc.get("hint"),
                              int(doc.get("exit_code") or ExitCode.PROBLEM))
        return dict(doc)


def _read_end(wire: Wire, deadline: float) -> bool | None:
    """After the detach: what is left on the stream, up to the agent's last line; its word on the process."""
    rest = bytearray()
    while time.monotonic() < deadline:
        wire.settimeout(max(0.05, deadline - time.monotonic()))
        try:
            data = wire.recv(65536)
        except TimeoutError:
            break
        except OSError:
            break
        if not data:
            break
        rest += data
        del rest[:-4096]
    mark = rest.rfind(b'{"' + END.encode())
    if mark < 0:
        return None
    try:
        alive = json.loads(bytes(rest[mark:]).split(b"\n")[0]).get("alive")
    except ValueError:
        return None
    return alive if isinstance(alive, bool) else None


class SshLink:
    """The agent in an ssh session on the rank's node; the session's channel is the wire."""

    def __init__(self, spec: TargetSpec, target: Target, script: str, deadline: float) -> None:
        from ml_debug.remote.ssh import SshFailure, SshPool

        self.pool = SshPool(spec, spec.connect_timeout_s)
        self.chan: Any = None
        try:
            try:
                transport = self.pool.client(target).get_transport()
            except SshFailure as e:
                raise PartialResult(f"{target.label}: {e.detail}", "is the node up? mldebug exec --hosts "
                                    f"{target.label} -- true tries it") from None
            transport.set_keepalive(15)  # a dead link ends the session instead of staying silent
            self.chan = transport.open_session(timeout=spec.connect_timeout_s)
            self.chan.exec_command(script)
            self.wire: Wire = self.chan
            err = bytearray()

            def said() -> str:
                with contextlib.suppress(Exception):
                    while self.chan.recv_stderr_ready():
                        err.extend(self.chan.recv_stderr(65536))
                return err.decode(errors="replace")

            self.header = _read_header(self.chan, target.label, deadline, said)
        except BaseException:
            self._end()
            raise

    def close(self) -> bool | None:
        alive = None
        try:
            with contextlib.suppress(Exception):
                self.chan.shutdown_write()  # the agent's stdin ends: it ends the adapter, then says its last line
                alive = _read_end(self.chan, time.monotonic() + CLOSE_S)
        finally:
            self._end()
        return alive

    def _end(self) -> None:
        if self.chan is not None:
            with contextlib.suppress(Exception):
                self.chan.close()
        self.pool.close()


class SrunLink:
    """The agent in a step of the Slurm job on the rank's node; srun's stdin and stdout are the wire."""

    def __init__(self, spec: TargetSpec, target: Target, script: str, deadline: float) -> None:
        from ml_debug.remote.slurm import start_srun, stream_argv

        assert spec.slurm_job is not None
        ours, theirs = socket.socketpair()
        self.err: deque[bytes] = deque(maxlen=64)
        with lifecycle.held_signals() as held:  # a Ctrl-C while srun starts is raised in the try, which ends it
            try:
                self.proc = start_srun(
                    stream_argv(spec.slurm_job, target.host, script, spec.slurm_gres_gpu, name="mldebug-attach",
                                unbuffered=True),
                    held, stdin=theirs.fileno(), stdout=theirs.fileno(), stderr=subprocess.PIPE)
            except EnvironmentProblem:
                ours.close()
                raise
            finally:
                theirs.close()
            self.wire: Wire = ours
            self._sock = ours
            threading.Thread(target=self._drain, name="mldebug-attach-srun", daemon=True).start()
            try:
                held.release()
                self.header = _read_header(ours, target.host, deadline,
                                           lambda: b"".join(self.err).decode(errors="replace"))
            except BaseException:
                self._end()
                raise

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for line in iter(self.proc.stderr.readline, b""):
            self.err.append(line)

    def close(self) -> bool | None:
        alive = None
        try:
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_WR)  # srun passes the end of stdin on to the agent
                alive = _read_end(self._sock, time.monotonic() + CLOSE_S)
        finally:
            self._end()
        return alive

    def _end(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.close()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            from ml_debug.remote.slurm import stop_srun

            stop_srun(self.proc)
        if self.proc.stderr is not None:
            with contextlib.suppress(OSError):
                self.proc.stderr.close()


def opener(spec: TargetSpec, target: Target, pid: int, attach_timeout: float) -> Any:
    """A link factory for :class:`~ml_debug.debugger.session.Session`: the agent on `target`, for `pid`;
    its first line is awaited for the connection's time plus `attach_timeout` (--attach-timeout)."""
    script = agent_script(spec, pid)

    def open_link() -> SshLink | SrunLink:
        deadline = time.monotonic() + spec.connect_timeout_s + attach_timeout
        if spec.kind == "ssh":
            return SshLink(spec, target, script, deadline)
        if spec.kind == "slurm":
            return SrunLink(spec, target, script, deadline)
        raise ValueError(f"no debugger link for targets of kind {spec.kind!r}")
    return open_link


__all__ = ["NodeRefused", "SrunLink", "SshLink", "agent_script", "opener"]

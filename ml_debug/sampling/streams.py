"""The client side of node sampling (top, watch): one persistent agent stream per node, read by one thread.

Each node runs ``mldebug top --agent`` once, for as long as the view is open:

- ``--hosts``: an ssh session on the node's connection from the remote layer's pool (paramiko);
- ``--slurm-job``: one ``srun --jobid J --overlap -w NODE`` process per node;
- ``--local``: the agent as a child process.

Connections are opened by at most ``--max-parallel`` threads at once (daemon threads: a connect
that hangs on a stopped sshd never delays the exit). One reader thread waits on every stream's
file descriptor with a selector and parses the JSON lines as they arrive. A stream that ends is
started again after a back-off in the live view; a node that stops sending is not waited for:
:class:`Feed` only records when its last sample came, and the model decides what that means.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ml_debug import __version__
from ml_debug.core.errors import EnvironmentProblem
from ml_debug.core.gcpause import tuned_for_rounds
from ml_debug.core.options import to_argv
from ml_debug.remote.runner import MISSING_HINT, build_script, mldebug_base
from ml_debug.remote.slurm import start_srun, stream_argv
from ml_debug.remote.targets import Target, TargetSpec
from ml_debug.sampling.options import SamplerOptions
from ml_debug.sampling.sample import NodeSample, SampleError
from ml_debug.sampling.sampler import AGENT_MARK

MAX_LINE = 16 * 1024 * 1024
STDERR_KEEP = 4096
RETRY_FIRST_S = 5.0
RETRY_MAX_S = 60.0
AGENT_COMMAND = ("top", "--agent")
"""The mldebug words that start a node's agent (:mod:`ml_debug.sampling.agent`)."""


@dataclass
class Feed:
    """One node's stream and what it last said."""

    target: Target
    label: str
    started: float = 0.0  # monotonic: when the current connection attempt began
    sample: NodeSample | None = None
    received: float | None = None  # monotonic: when the last sample arrived
    samples: int = 0
    ended: bool = False
    error: str | None = None
    note: str | None = None
    attempts: int = 0
    retry_at: float | None = None
    stream: Any = None
    buf: bytearray = field(default_factory=bytearray)
    err_tail: bytearray = field(default_factory=bytearray)


# ------------------------------------------------------------------------------- the agent command


def agent_args(opts: SamplerOptions, spec: TargetSpec) -> list[str]:
    """``top --agent <options>``: what every node runs (with SLURM_JOB_ID for a Slurm job's ranks)."""
    args = [*AGENT_COMMAND, *to_argv(opts)]
    if spec.kind == "slurm" and spec.slurm_job and "SLURM_JOB_ID" not in opts.env_filter:
        args += ["--env", f"SLURM_JOB_ID={spec.slurm_job}"]
    return args


def remote_script(opts: SamplerOptions, spec: TargetSpec) -> str:
    """The shell text a node runs: ``[prefix &&] exec env MLDEBUG_TOP_AGENT=1 mldebug top --agent ...``
    (started the way remote/ starts every command; ``exec`` so that the session's end is the agent's)."""
    return build_script(["exec", "env", f"{AGENT_MARK}=1", *mldebug_base(spec.remote_python),
                         *agent_args(opts, spec)], spec.remote_prefix)


def srun_argv(spec: TargetSpec, node: str, script: str) -> list[str]:
    """One step on one node of the job, sharing its CPUs and taking none of its GPUs."""
    assert spec.slurm_job is not None
    return stream_argv(spec.slurm_job, node, script, spec.slurm_gres_gpu, name="mldebug-top")


def local_argv(opts: SamplerOptions, spec: TargetSpec) -> list[str]:
    return [sys.executable, "-m", "ml_debug", *agent_args(opts, spec)]


# ------------------------------------------------------------------------------- streams


class SshStream:
    """An ssh session running the agent; its channel's fd wakes the selector for stdout and stderr."""

    def __init__(self, chan: Any) -> None:
        self.chan = chan
        self.fd = chan.fileno()

    def fds(self) -> list[int]:
        return [self.fd]

    def read(self, fd: int) -> tuple[bytes, bytes, bool]:
        out, err = bytearray(), bytearray()
        chan = self.chan
        while chan.recv_ready():
            out += chan.recv(65536)
        while chan.recv_stderr_ready():
            err += chan.recv_stderr(65536)
        done = (chan.eof_received or chan.closed) and not chan.recv_ready() and not chan.recv_stderr_ready()
        return bytes(out), bytes(err), done

    def status(self) -> int | None:
        self.chan.status_event.wait(1.0)  # the exit status follows EOF closely, when the agent exited
        if self.chan.exit_status_ready():
            code = self.chan.recv_exit_status()
            return None if code == -1 else int(code)
        return None

    def stop(self) -> None:
        try:
            self.chan.close()  # sshd closes the agent's stdin: it exits at once
        except Exception:
            pass

    def reap(self, deadline: float) -> None:
        pass


class ProcessStream:
    """A child process running the agent (srun for a Slurm node, or the agent itself locally)."""

    def __init__(self, proc: subprocess.Popen[bytes], srun: bool) -> None:
        self.proc = proc
        self.srun = srun
        assert proc.stdout is not None and proc.stderr is not None
        self.out_fd, self.err_fd = proc.stdout.fileno(), proc.stderr.fileno()
        for fd in (self.out_fd, self.err_fd):
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NONBLOCK)
        self._open = {self.out_fd, self.err_fd}

    def fds(self) -> list[int]:
        return [self.out_fd, self.err_fd]

    def read(self, fd: int) -> tuple[bytes, bytes, bool]:
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            data = None
        except OSError:
            data = b""
        if data == b"":
            self._open.discard(fd)
        data = data or b""
        if fd == self.out_fd:
            return data, b"", not self._open
        return b"", data, not self._open

    def status(self) -> int | None:
        code = self.proc.poll()
        if code is None:
            try:
                code = self.proc.wait(timeout=1)
            except subprocess.TimeoutExpired:
                return None
        return code

    def stop(self) -> None:
        """Ask it to end: EOF on its stdin (srun passes it on to the agent on the node)."""
        if self.proc.stdin is not None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass

    def _signal(self, sig: int) -> None:
        try:
            self.proc.send_signal(sig)
        except (ProcessLookupError, OSError):
            pass

    def reap(self, deadline: float) -> None:
        """Wait for it to end; then srun gets two SIGINTs (it cancels its step), the agent SIGTERM; then SIGKILL."""
        try:
            self.proc.wait(timeout=max(0.0, min(deadline - time.monotonic(), 2.0)))
        except subprocess.TimeoutExpired:
            if self.srun:
                self._signal(signal.SIGINT)
                time.sleep(0.2)  # srun wants the second SIGINT within a second of the first
                self._signal(signal.SIGINT)
            else:
                self._signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=max(0.5, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    self.proc.kill()
                try:
                    self.proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
        for f in (self.proc.stdout, self.proc.stderr):
            if f is not None:
                try:
                    f.close()
                except OSError:
                    pass


# ------------------------------------------------------------------------------- the client


class Client:
    """Streams from every target of ``spec``; :attr:`feeds` holds what each node said last.

    Use as a context manager: leaving it ends every agent (and every srun step) it started.
    """

    def __init__(self, spec: TargetSpec, opts: SamplerOptions, *, retry: bool = False,
                 on_sample: Callable[[Feed], None] | None = None) -> None:
        self.spec = spec
        self.opts = opts
        self.retry = retry
        self.on_sample = on_sample
        self.feeds = [Feed(target=t, label=t.label) for t in spec.targets]
        self.lock = threading.Condition()
        self.started = time.monotonic()
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._pending: deque[Feed] = deque()
        self._slots = threading.BoundedSemaphore(max(1, min(spec.max_parallel, len(self.feeds) or 1)))
        self._stopping = False
        self._pool: Any = None
        self._script = remote_script(opts, spec)
        self._reader = threading.Thread(target=self._read_loop, name="mldebug-top-reader", daemon=True)
        self._gc = contextlib.ExitStack()

    # -- lifecycle ---------------------------------------------------------------------------
    def __enter__(self) -> Client:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        self._gc.enter_context(tuned_for_rounds())  # thousands of samples a round (core/gcpause.py)
        if self.spec.kind == "ssh":
            from ml_debug.remote.ssh import SshPool

            self._pool = SshPool(self.spec, self.spec.connect_timeout_s)
        self.started = time.monotonic()
        self._reader.start()
        for feed in self.feeds:
            self._connect_later(feed)

    def close(self) -> None:
        with self.lock:
            self._stopping = True
        self._wake()
        if self._reader.ident is not None:  # started (a client closed unstarted has no reader)
            self._reader.join(timeout=2)  # before the streams go: it must not read a closed one
        with self.lock:
            streams = [f.stream for f in self.feeds if f.stream is not None]
        for s in streams:
            s.stop()
        deadline = time.monotonic() + 5.0
        for s in streams:
            s.reap(deadline)
        if self._pool is not None:
            self._pool.close()
        self._sel.close()
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass
        self._gc.close()

    # -- connecting ----------------------------------------------------------------------------
    def _connect_later(self, feed: Feed) -> None:
        with self.lock:
            feed.started = time.monotonic()
            feed.attempts += 1
            feed.retry_at = None
            feed.ended = False
        threading.Thread(target=self._connect, args=(feed,), name=f"mldebug-top-{feed.label}", daemon=True).start()

    def _connect(self, feed: Feed) -> None:
        with self._slots:
            if self._stopping:
                return
            try:
                stream = self._open(feed.target)
            except Exception as e:  # every failure becomes the node's error, never the run's
                self._ended(feed, getattr(e, "detail", None) or f"{type(e).__name__}: {e}")
                return
        with self.lock:
            if self._stopping:
                stream.stop()
                stream.reap(time.monotonic() + 2)
                return
            feed.stream = stream
            feed.buf.clear()
            feed.err_tail.clear()
            self._pending.append(feed)
        self._wake()

    def _open(self, target: Target) -> Any:
        if self.spec.kind == "ssh":
            client = self._pool.client(target)
            transport = client.get_transport()
            transport.set_keepalive(15)  # a dead link ends the stream instead of staying silent forever
            chan = transport.open_session(timeout=self.spec.connect_timeout_s)
            chan.exec_command(self._script)
            return SshStream(chan)
        if self.spec.kind == "slurm":
            argv, srun = srun_argv(self.spec, target.host, self._script), True
        else:
            argv, srun = local_argv(self.opts, self.spec), False
        env = {**os.environ, AGENT_MARK: "1"}
        # stdin stays open for as long as we want the agent: its end of file (we closed it, or we died) is what
        # stops the agent, on this node or, passed on by srun, on the job's node; srun is also tied to us, and
        # cancels its step when we die (start_srun)
        pipes: dict[str, Any] = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "stderr": subprocess.PIPE,
                                 "env": env}
        try:
            proc = start_srun(argv, **pipes) if srun else subprocess.Popen(argv, start_new_session=True, **pipes)
        except (FileNotFoundError, EnvironmentProblem):
            raise RuntimeError(f"{argv[0]} is not installed here") from None
        return ProcessStream(proc, srun)

    # -- reading -------------------------------------------------------------------------------
    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass

    def _read_loop(self) -> None:
        while not self._stopping:
            try:
                events = self._sel.select(timeout=0.5)
            except OSError:
                return
            for key, _ in events:
                if key.data is None:
                    try:
                        while os.read(self._wake_r, 4096):
                            pass
                    except OSError:
                        pass
                    self._register_pending()
                    continue
                feed, fd = key.data
                try:
                    self._on_readable(feed, fd)
                except Exception as e:  # one broken stream ends that node's feed, never the reader
                    self._drop(feed, f"reading its stream failed: {type(e).__name__}: {e}")
            if self.retry:
                self._retry_due()

    def _register_pending(self) -> None:
        with self.lock:
            pending = list(self._pending)
            self._pending.clear()
        for feed in pending:
            for fd in feed.stream.fds():
                self._sel.register(fd, selectors.EVENT_READ, (feed, fd))

    def _on_readable(self, feed: Feed, fd: int) -> None:
        stream = feed.stream
        if stream is None:
            self._unregister(fd)
            return
        out, err, done = stream.read(fd)
        if err:
            feed.err_tail += err
            del feed.err_tail[:-STDERR_KEEP]
        if out:
            feed.buf += out
            self._lines(feed)
        if isinstance(stream, ProcessStream) and fd not in stream._open:
            self._unregister(fd)
        if done:
            for f in stream.fds():
                self._unregister(f)
            code = stream.status()
            stream.stop()
            stream.reap(time.monotonic() + 1)
            with self.lock:
                feed.stream = None
            self._ended(feed, self._why_ended(feed, code))

    def _drop(self, feed: Feed, why: str) -> None:
        stream = feed.stream
        if stream is not None:
            for f in stream.fds():
                self._unregister(f)
            stream.stop()
            stream.reap(time.monotonic() + 1)
        with self.lock:
            feed.stream = None
        self._ended(feed, why)

    def _unregister(self, fd: int) -> None:
        try:
            self._sel.unregister(fd)
        except (KeyError, ValueError):
            pass

    def _lines(self, feed: Feed) -> None:
        while True:
            cut = feed.buf.find(b"\n")
            if cut < 0:
                if len(feed.buf) > MAX_LINE:
                    feed.buf.clear()
                    feed.note = "the agent sent a line over 16 MiB: dropped"
                return
            line = bytes(feed.buf[:cut])
            del feed.buf[:cut + 1]
            try:
                doc = json.loads(line)
            except ValueError:
                continue  # a stray line (a login banner, a warning on stdout) is not a sample
            if isinstance(doc, dict) and doc.get("schema") == "mldebug.error":  # the agent ended, and said why
                feed.note = f"{feed.label}: mldebug failed: {(doc.get('result') or {}).get('summary')}"
                continue
            try:
                sample = NodeSample.from_json(doc)
            except SampleError as e:
                feed.note = f"{feed.label} sent a sample this mldebug cannot read: {e}"
                continue
            with self.lock:
                feed.sample = sample
                feed.received = time.monotonic()
                feed.samples += 1
                feed.error = None
                feed.attempts = 0
                version = sample.mldebug_version
                feed.note = (None if version == __version__ else
                             f"{feed.label} runs mldebug {version}, this is mldebug {__version__}: "
                             "install the same version on every node")
                self.lock.notify_all()
            if self.on_sample is not None:
                self.on_sample(feed)

    def _why_ended(self, feed: Feed, code: int | None) -> str:
        err = feed.err_tail.decode(errors="replace").strip()
        last = err.splitlines()[-1] if err else ""
        if code == 127 or "command not found" in err or "No such file or directory" in last:
            return f"mldebug is not installed on {feed.label} (or not on the PATH of a non-interactive shell): " \
                   f"{MISSING_HINT}"
        if "No module named" in err:
            return f"the remote python on {feed.label} has no ml_debug module: {MISSING_HINT}"
        if self.spec.kind == "slurm" and last.startswith("srun: error:"):
            return last.removeprefix("srun: error: ")
        what = "the agent stopped" if feed.samples else "the agent did not start"
        status = "" if code is None else f" (exit status {code})"
        return f"{what}{status}" + (f": {last}" if last else "")

    def _ended(self, feed: Feed, why: str) -> None:
        with self.lock:
            feed.ended = True
            feed.error = why
            if self.retry and not self._stopping:
                back_off = min(RETRY_MAX_S, RETRY_FIRST_S * 2 ** max(0, feed.attempts - 1))
                feed.retry_at = time.monotonic() + max(back_off, self.opts.interval)
            self.lock.notify_all()

    def _retry_due(self) -> None:
        now = time.monotonic()
        with self.lock:
            due = [f for f in self.feeds if f.ended and f.retry_at is not None and f.retry_at <= now]
        for feed in due:
            self._connect_later(feed)

    # -- waiting -------------------------------------------------------------------------------
    def wait(self, predicate: Callable[[], bool], deadline: float) -> bool:
        """Wait until ``predicate()`` (called under the lock) holds, or the deadline passes."""
        with self.lock:
            while not predicate():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.lock.wait(min(left, 0.5))
            return True

    def all_first(self) -> bool:
        """Every node has sent a sample or failed (call under the lock)."""
        return all(f.sample is not None or f.ended for f in self.feeds)

    def all_since(self, seqs: dict[str, int]) -> bool:
        """Every answering node has sent a sample newer than ``seqs`` (call under the lock)."""
        return all(f.ended or (f.sample is not None and f.sample.seq > seqs.get(f.label, 0))
                   for f in self.feeds)

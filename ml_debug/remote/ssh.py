"""The ssh transport (paramiko): ~/.ssh/config, keys and agent, known_hosts, timeouts, reuse.

Shell equivalent, per host::

    ssh -o BatchMode=yes -o ConnectTimeout=10 -o StrictHostKeyChecking=yes HOST 'CMD'

What it honours from the ssh config (``~/.ssh/config`` or ``--ssh-config``): HostName, Port,
User, IdentityFile, IdentitiesOnly, UserKnownHostsFile, ProxyJump and ProxyCommand.
Host keys are checked against ``~/.ssh/known_hosts``, ``/etc/ssh/ssh_known_hosts`` and the
config's UserKnownHostsFile; an unknown or changed key refuses the host. ``StrictHostKeyChecking``
in the config is deliberately not honoured: only ``--insecure-no-host-key-check`` skips the check,
so that skipping it is always visible on the command line.

One :class:`SshPool` per run keeps one connection per target, reused by every command run on that
target while the pool is open (``runner.connections(spec)`` keeps one open across calls). Two
targets never share a connection, even when they resolve to the same sshd: sshd allows only
MaxSessions (10) sessions per connection, and a benchmark or a hostfile may repeat an endpoint.
"""

from __future__ import annotations

import getpass
import logging
import os
import select
import shlex
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ml_debug.remote.result import (
    AUTH_FAILED,
    HOST_KEY_MISMATCH,
    INTERRUPTED,
    MAX_OUTPUT_BYTES,
    TIMED_OUT,
    UNREACHABLE,
    Failure,
    Interrupted,
    NodeResult,
    cut_short,
    decode,
    failed,
    finished,
)
from ml_debug.remote.targets import Target, TargetSpec

if TYPE_CHECKING:
    import paramiko

DEFAULT_CONFIG = Path("~/.ssh/config")
DEFAULT_KNOWN_HOSTS = (Path("~/.ssh/known_hosts"), Path("/etc/ssh/ssh_known_hosts"))


class SshFailure(Exception):
    """Connecting failed for a named reason (one of the runner's failure words)."""

    def __init__(self, failure: Failure, detail: str) -> None:
        super().__init__(detail)
        self.failure = failure
        self.detail = detail


@dataclass(frozen=True)
class Endpoint:
    """Where a target really is after the ssh config is applied."""

    alias: str
    hostname: str
    port: int
    user: str
    identities: tuple[str, ...]
    identities_only: bool
    known_hosts: tuple[str, ...]
    proxy_jump: str | None
    proxy_command: str | None


    @property
    def where(self) -> str:
        return f"{self.hostname}:{self.port}"


@dataclass
class _Session:
    """A command under way on one target: its channel, start and output so far."""

    chan: Any
    t0: float
    out: bytearray
    err: bytearray


INTERRUPT_GRACE_S = 3.0  # after Ctrl-C: how long the far sides get to stop and send their last output


class SshPool:
    """Connections for one run: resolve through the ssh config, connect once per endpoint."""

    def __init__(self, spec: TargetSpec, connect_timeout_s: float) -> None:
        import paramiko

        # paramiko logs transport errors (refused banners, resets) to the root logger's
        # last-resort handler; the runner reports each failure itself, once, in words.
        if not logging.getLogger("paramiko").handlers:
            logging.getLogger("paramiko").addHandler(logging.NullHandler())
        logging.getLogger("paramiko").propagate = False
        self.spec = spec
        self.connect_timeout_s = connect_timeout_s
        config_path = (spec.ssh_config or DEFAULT_CONFIG).expanduser()
        if spec.ssh_config is not None or config_path.exists():
            from ml_debug.core.errors import UsageError

            try:
                self.config = paramiko.SSHConfig.from_path(str(config_path))
            except FileNotFoundError:
                raise UsageError(f"ssh config {str(config_path)!r} does not exist",
                                 "--ssh-config takes an ssh_config file (like ~/.ssh/config)") from None
            except Exception as e:  # paramiko's ConfigParseError and friends
                raise UsageError(f"cannot read ssh config {str(config_path)!r}: {e}",
                                 "check it with `ssh -G HOST -F FILE`") from None
        else:
            self.config = paramiko.SSHConfig()
        self._clients: dict[Target, paramiko.SSHClient] = {}
        self._locks: dict[Target, threading.Lock] = {}
        self._jump_clients: dict[tuple[Endpoint, ...], paramiko.SSHClient] = {}
        self._jump_locks: dict[tuple[Endpoint, ...], threading.Lock] = {}
        self._guard = threading.Lock()
        self._running: dict[str, _Session] = {}  # label -> the session of a command under way
        self._user = getpass.getuser()
        _raise_fd_limit()

    # -- resolving ----------------------------------------------------------------------------
    def endpoint(self, target: Target) -> Endpoint:
        """Apply the ssh config to a target (target fields win over the config, like ssh -p)."""
        cfg = self.config.lookup(target.host)
        ids = [str(Path(p).expanduser()) for p in self.spec.identities]
        ids += [str(Path(p).expanduser()) for p in cfg.get("identityfile", [])]
        # As in OpenSSH: UserKnownHostsFile replaces ~/.ssh/known_hosts; the global file stays.
        user_files = shlex.split(cfg.get("userknownhostsfile", "")) or [str(DEFAULT_KNOWN_HOSTS[0])]
        known = [str(Path(f).expanduser()) for f in user_files] + [str(DEFAULT_KNOWN_HOSTS[1])]
        return Endpoint(
            alias=target.host,
            hostname=cfg.get("hostname", target.host),
            port=target.port or int(cfg.get("port", 22)),
            user=target.user or cfg.get("user") or self._user,
            identities=tuple(dict.fromkeys(ids)),
            identities_only=cfg.get("identitiesonly", "no").lower() == "yes",
            known_hosts=tuple(dict.fromkeys(known)),
            proxy_jump=None if cfg.get("proxyjump", "none").lower() == "none" else cfg["proxyjump"],
            proxy_command=None if cfg.get("proxycommand", "none").lower() == "none" else cfg["proxycommand"],
        )

    # -- connecting ---------------------------------------------------------------------------
    def client(self, target: Target) -> paramiko.SSHClient:
        """A connected client for the target, made on first use and reused while the pool is open."""
        with self._guard:
            lock = self._locks.setdefault(target, threading.Lock())
        with lock:
            client = self._clients.get(target)
            transport = client.get_transport() if client is not None else None
            if client is not None and transport is not None and transport.is_active():
                return client
            ep = self.endpoint(target)
            client = self._connect(ep, sock=self._proxy_sock(ep))
            self._clients[target] = client
            return client

    def _proxy_sock(self, ep: Endpoint) -> Any:
        import paramiko

        if ep.proxy_jump:
            sock: Any = None
            # Each hop is resolved through the config too, and tunnelled through the one before.
            # Jump connections are shared by every target behind them (forwarded channels do not
            # count against sshd's MaxSessions), so 64 nodes behind a bastion cost one login there.
            hops = [self.endpoint(_hop_target(h)) for h in ep.proxy_jump.split(",") if h.strip()]
            for i, hop_ep in enumerate(hops):
                jump = self._jump_client(tuple(hops[: i + 1]), sock)
                nxt = hops[i + 1] if i + 1 < len(hops) else ep
                try:
                    sock = jump.get_transport().open_channel(
                        "direct-tcpip", (nxt.hostname, nxt.port), ("127.0.0.1", 0),
                        timeout=self.connect_timeout_s)
                except Exception as e:
                    raise SshFailure(UNREACHABLE, f"jump host {hop_ep.where} cannot reach "
                                                  f"{nxt.where}: {e}") from None
            return sock
        if ep.proxy_command:
            return paramiko.ProxyCommand(ep.proxy_command)
        return None

    def _jump_client(self, chain: tuple[Endpoint, ...], sock: Any) -> paramiko.SSHClient:
        with self._guard:
            lock = self._jump_locks.setdefault(chain, threading.Lock())
        with lock:
            client = self._jump_clients.get(chain)
            transport = client.get_transport() if client is not None else None
            if client is None or transport is None or not transport.is_active():
                client = self._jump_clients[chain] = self._connect(chain[-1], sock=sock, jump=True)
            elif sock is not None:
                sock.close()  # an earlier hop's channel we no longer need
            return client

    def _connect(self, ep: Endpoint, sock: Any = None, jump: bool = False) -> paramiko.SSHClient:
        import paramiko

        client = paramiko.SSHClient()
        if self.spec.insecure_no_host_key_check:
            client.set_missing_host_key_policy(paramiko.AutoAddPolicy())  # memory only, never saved
        else:
            for path in ep.known_hosts:
                if os.path.isfile(path):
                    try:
                        client.load_host_keys(path)
                    except (OSError, paramiko.SSHException):
                        pass
            client.set_missing_host_key_policy(paramiko.RejectPolicy())
        key_files = [p for p in ep.identities if os.path.isfile(p)]
        t = self.connect_timeout_s
        what = f"jump host {ep.where}" if jump else ep.where
        # One budget for the whole handshake (TCP, banner, key exchange, auth), not one per step:
        # a host that accepts TCP and then stalls must not cost three times --connect-timeout.
        deadline = time.monotonic() + t
        try:
            if sock is None:
                sock = socket.create_connection((ep.hostname, ep.port), timeout=t)
            left = max(0.1, deadline - time.monotonic())
            client.connect(
                ep.hostname, port=ep.port, username=ep.user, key_filename=key_files or None,
                timeout=left, banner_timeout=left, auth_timeout=left, channel_timeout=t,
                allow_agent=not (ep.identities_only and key_files),
                look_for_keys=not (ep.identities_only and key_files), sock=sock,
            )
        except paramiko.BadHostKeyException as e:
            client.close()
            raise SshFailure(HOST_KEY_MISMATCH, f"{what} offered a {e.key.get_name()} host key that differs "
                                                "from known_hosts (possible man-in-the-middle, or the host "
                                                "was reinstalled)") from None
        except paramiko.AuthenticationException as e:
            client.close()
            raise SshFailure(AUTH_FAILED, f"{ep.user}@{what} refused our keys ({e})") from None
        except paramiko.SSHException as e:
            # The transport thread keeps the first error (a banner that never came); the error
            # raised here is often only its echo ("No existing session").
            transport = client.get_transport()
            saved = getattr(transport, "saved_exception", None) if transport is not None else None
            client.close()
            msg = str(saved or e)
            if "No existing session" in msg or "banner" in msg.lower():
                raise SshFailure(UNREACHABLE, f"{what}: accepted the connection but sent no ssh banner "
                                              f"within {t:g} s (not an sshd, or overloaded)") from None
            if "not found in known_hosts" in msg:
                raise SshFailure(HOST_KEY_MISMATCH, f"{what} is not in known_hosts, so its host key "
                                                    "cannot be verified") from None
            if isinstance(e, paramiko.PasswordRequiredException):
                raise SshFailure(AUTH_FAILED, f"{what}: the key needs a passphrase; load it into "
                                              "ssh-agent") from None
            raise SshFailure(UNREACHABLE, f"{what}: ssh handshake failed: {msg or type(e).__name__}") from None
        except TimeoutError:
            client.close()
            raise SshFailure(UNREACHABLE, f"{what}: no answer within {t:g} s") from None
        except paramiko.ssh_exception.NoValidConnectionsError as e:
            client.close()
            reasons = {os.strerror(err.errno) if err.errno else str(err) for err in e.errors.values()}
            raise SshFailure(UNREACHABLE, f"{what}: {', '.join(sorted(reasons)).lower()}") from None
        except OSError as e:
            client.close()
            raise SshFailure(UNREACHABLE, f"{what}: {(e.strerror or str(e)).lower()}") from None
        except EOFError:
            client.close()
            raise SshFailure(UNREACHABLE, f"{what}: connection closed during the handshake") from None
        return client

    def release(self, target: Target) -> None:
        """Close the target's connection (the next command on it connects again)."""
        with self._guard:
            client = self._clients.pop(target, None)
        if client is not None:
            client.close()

    def close(self) -> None:
        with self._guard:
            clients = [*self._clients.values(), *reversed(self._jump_clients.values())]
            self._clients.clear()
            self._jump_clients.clear()
        for c in clients:
            try:
                c.close()
            except Exception:
                pass

    # -- running ------------------------------------------------------------------------------
    def end_sessions(self) -> None:
        """Ctrl-C: close the stdin of every command under way; the far side stops it (remote_deadline)
        and its last output and exit status still come back."""
        with self._guard:
            sessions = list(self._running.values())
        for s in sessions:
            try:
                s.chan.shutdown_write()
            except Exception:  # a session closing by itself meanwhile
                pass

    def cut_short(self) -> list[NodeResult]:
        """The commands still under way, as results with what they printed so far."""
        with self._guard:
            running = list(self._running.items())
        return [failed(label, INTERRUPTED, "stopped by Ctrl-C", time.monotonic() - s.t0,
                       stdout=decode(bytes(s.out)), stderr=decode(bytes(s.err))) for label, s in running]

    def run(self, target: Target, script: str, timeout_s: float) -> NodeResult:
        """Connect (or reuse), run the script, collect output until exit or the deadline."""
        label = target.label
        t0 = time.monotonic()
        try:
            client = self.client(target)
        except SshFailure as e:
            return failed(label, e.failure, e.detail, time.monotonic() - t0)
        try:
            chan = client.get_transport().open_session(timeout=self.connect_timeout_s)
            chan.exec_command(remote_deadline(script, timeout_s))  # its stdin stays open: see remote_deadline
        except Exception as e:
            return failed(label, UNREACHABLE, f"{target.label}: cannot open a session: {e}", time.monotonic() - t0)
        deadline = time.monotonic() + timeout_s
        out, err = bytearray(), bytearray()
        with self._guard:
            self._running[label] = _Session(chan, t0, out, err)
        try:
            while True:
                got = False
                while chan.recv_ready():
                    _append(out, chan.recv(65536))
                    got = True
                while chan.recv_stderr_ready():
                    _append(err, chan.recv_stderr(65536))
                    got = True
                if chan.exit_status_ready() and not chan.recv_ready() and not chan.recv_stderr_ready():
                    break
                if chan.closed and not got:
                    break
                if time.monotonic() > deadline:
                    return failed(label, TIMED_OUT, f"still running after {timeout_s:g} s; session closed",
                                  time.monotonic() - t0, stdout=decode(bytes(out)), stderr=decode(bytes(err)))
                if not got:
                    # Sleep until data, EOF or close arrives (the channel's fileno is a pipe paramiko
                    # signals for stdout and stderr alike), not in a polling loop: hundreds of
                    # waiting threads must not spin. After EOF the pipe stays readable, so wait for
                    # the exit status on its own event.
                    if chan.eof_received:
                        chan.status_event.wait(min(0.05, max(0.0, deadline - time.monotonic())))
                    else:
                        select.select([chan], [], [], min(1.0, max(0.0, deadline - time.monotonic())))
            if not chan.exit_status_ready():
                return failed(label, UNREACHABLE, "the connection closed before the command exited",
                              time.monotonic() - t0, stdout=decode(bytes(out)), stderr=decode(bytes(err)))
            status = chan.recv_exit_status()
        finally:
            with self._guard:
                self._running.pop(label, None)
            chan.close()
        if status == -1:  # the server sent no status: the command died of a signal
            return failed(label, "command failed", "killed by a signal (no exit status)", time.monotonic() - t0,
                          stdout=decode(bytes(out)), stderr=decode(bytes(err)))
        return finished(label, status, decode(bytes(out)), decode(bytes(err)), time.monotonic() - t0)


def _raise_fd_limit() -> None:
    # Each open connection is a socket plus a pipe per channel; a 1024 soft limit is low for
    # hundreds of hosts, and raising it up to the hard limit needs no privilege.
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = hard if hard != resource.RLIM_INFINITY else 65536
        if soft != resource.RLIM_INFINITY and soft < want:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    except (ImportError, ValueError, OSError):
        pass


def _hop_target(hop: str) -> Target:
    """A ProxyJump hop, ``[user@]host[:port]`` (here a number after ':' is always a port)."""
    from ml_debug.core.errors import UsageError
    from ml_debug.remote.targets import check_hostname

    hop = hop.strip()
    user, _, rest = hop.rpartition("@")
    host, _, port = rest.partition(":")
    if port and not port.isdigit():
        raise UsageError(f"ProxyJump {hop!r}: {port!r} is not a port", "write [user@]host[:port]")
    return Target(host=check_hostname(host, "ProxyJump: "), port=int(port) if port else None, user=user or None)


def remote_deadline(script: str, timeout_s: float) -> str:
    """Make the far side end the command itself when we stop waiting for it: at the deadline, or as
    soon as the session closes (Ctrl-C here).

    Closing an ssh session without a terminal does not stop the command (sshd sends no SIGHUP), so a
    hung command would outlive the run. coreutils ``timeout`` kills its whole process group at the
    deadline, and on SIGTERM; a watcher reads the session's stdin (which this side keeps open and never
    writes) and sends that SIGTERM when it ends, i.e. when the session closes. Where there is no
    ``timeout``, the command runs as is and only its shell is stopped. The command reads /dev/null.
    The user's login shell runs the script (so ``source venv/bin/activate`` in --remote-prefix keeps
    working under bash).
    """
    quoted = shlex.quote(script)
    grace = f"{timeout_s + 1:.3f}".rstrip("0").rstrip(".")
    shell = '"${SHELL:-/bin/sh}" -c ' + quoted
    return (f"exec 3<&0; if command -v timeout >/dev/null 2>&1; then timeout -k 5 {grace} {shell} </dev/null & "
            f"else {shell} </dev/null & fi; c=$!; "
            "{ cat >/dev/null; kill -TERM $c; } <&3 >/dev/null 2>&1 & w=$!; exec 3<&-; "
            "wait $c; s=$?; kill $w 2>/dev/null; exit $s")


def _append(buf: bytearray, data: bytes) -> None:
    if len(buf) <= MAX_OUTPUT_BYTES:
        buf.extend(data)


def run_ssh(targets: list[Target], spec: TargetSpec, script: str, timeout_s: float,
            connect_timeout_s: float, max_parallel: int, deliver: Callable[[NodeResult], None],
            pool: SshPool | None = None) -> None:
    """Run on every target with at most ``max_parallel`` at once; deliver results as they come."""
    from concurrent.futures import ThreadPoolExecutor, wait

    own = pool is None
    pool = pool or SshPool(spec, connect_timeout_s)
    executor = ThreadPoolExecutor(max_workers=max(1, min(max_parallel, len(targets))),
                                  thread_name_prefix="mldebug-ssh")
    stopping = threading.Event()
    try:
        def one(t: Target) -> None:
            try:
                r = pool.run(t, script, timeout_s)
                deliver(cut_short(r) if stopping.is_set() else r)
            finally:
                if own:  # a one-off run keeps no socket open past its target: fds for 1000s of hosts
                    pool.release(t)

        futures = [executor.submit(one, t) for t in targets]
        try:
            for f in futures:
                f.result()
        except KeyboardInterrupt:  # the commands under way stop there; what they printed is kept
            stopping.set()
            for f in futures:
                f.cancel()  # those not started yet never start
            pool.end_sessions()
            try:
                wait(futures, timeout=INTERRUPT_GRACE_S)
            except KeyboardInterrupt:  # a second Ctrl-C: no more waiting
                pass
            raise Interrupted(pool.cut_short()) from None
    finally:
        # On Ctrl-C: do not start what is queued; open connections are closed below, which ends
        # the sessions still running.
        executor.shutdown(wait=False, cancel_futures=True)
        if own:
            pool.close()

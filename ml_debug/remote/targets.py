"""Where a multi-node command runs: a list of targets and the transport that reaches them.

A :class:`TargetSpec` is what ``--hosts`` / ``--slurm-job`` / ``--local`` resolve to; the
runner (``ml_debug.remote.runner``) takes one and runs a command on every target.

Hostfile formats accepted by :func:`parse_hostfile` (one host per line, ``#`` comments)::

    node1                       # plain
    node1:2222                  # ssh port (a number >= 1024, or 22)
    root@node1 port=2222        # user and an explicit port
    node1 slots=8               # DeepSpeed
    node1 slots=8 max_slots=16  # Open MPI (max-slots also accepted)
    node1:8                     # MPICH: a number below 1024 (other than 22) is a process count

``host:N`` is ambiguous between an ssh port and MPICH's slot count; ports on ssh are 22 or high
numbers and slot counts are small, so N >= 1024 or N == 22 means a port and anything else slots.
``port=N`` says it without guessing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from ml_debug.core.errors import UsageError

Kind = Literal["local", "ssh", "slurm"]

# Host names and addresses only: letters, digits, '.', '-', '_' (and ':' inside [IPv6]).
# Anything else (';', '$', '`', quotes, spaces, '%') is refused up front: names are handed to
# ssh_config's ProxyCommand/ProxyJump expansion and to srun, and OpenSSH itself refuses shell
# metacharacters in host names since 9.6 (CVE-2023-51385).
_HOSTNAME = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9._-]*[A-Za-z0-9_])?")
_IPV6 = re.compile(r"[0-9A-Fa-f:.]+")
_USER = re.compile(r"[A-Za-z0-9._][A-Za-z0-9._-]*")


@dataclass(frozen=True)
class Target:
    """One place to run a command: a host (ssh alias, name or address), optional port/user/slots."""

    host: str
    port: int | None = None
    user: str | None = None
    slots: int | None = None

    @property
    def label(self) -> str:
        """The name results are filed under: ``host``, or ``host:port`` when a port is given."""
        return self.host if self.port is None else f"{self.host}:{self.port}"


@dataclass
class TargetSpec:
    """Resolved targets plus how to reach them (everything the runner needs)."""

    kind: Kind
    targets: list[Target]
    slurm_job: str | None = None
    # ssh
    ssh_config: Path | None = None
    identities: list[Path] = field(default_factory=list)
    insecure_no_host_key_check: bool = False
    connect_timeout_s: float = 10.0
    # the agent pattern: how to start mldebug (or anything) on the far side
    remote_python: str | None = None
    remote_prefix: str | None = None
    max_parallel: int = 64
    # slurm: ask for --gres=gpu:0 so the step neither waits for nor takes the job's GPUs
    slurm_gres_gpu: bool = False

    @property
    def labels(self) -> list[str]:
        return [t.label for t in self.targets]


def check_hostname(host: str, where: str = "") -> str:
    """Return ``host`` if it is a plain host name or address, else raise UsageError."""
    ok = bool(_HOSTNAME.fullmatch(host)) or (
        host.startswith("[") and host.endswith("]") and bool(_IPV6.fullmatch(host[1:-1]))
    )
    if not ok or len(host) > 255:
        raise UsageError(
            f"{where}{host!r} is not a valid host name",
            "host names may hold letters, digits, '.', '-' and '_' only (IPv6 addresses in [brackets])",
        )
    return host


def _port(value: str, where: str) -> int:
    if not value.isdigit() or not 0 < int(value) < 65536:
        raise UsageError(f"{where}port {value!r} is not a number between 1 and 65535",
                         "write host:PORT or host port=PORT")
    return int(value)


def _count(value: str, key: str, where: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise UsageError(f"{where}{key}={value!r} is not a positive whole number", f"write {key}=N, e.g. {key}=8")
    return int(value)


def parse_target(word: str, where: str = "") -> Target:
    """``[user@]host[:N]`` -> Target (see the module docstring for what N means)."""
    user: str | None = None
    if "@" in word:
        user, word = word.rsplit("@", 1)
        if not _USER.fullmatch(user):
            raise UsageError(f"{where}{user!r} is not a valid user name", "write user@host")
    port: int | None = None
    slots: int | None = None
    if word.startswith("["):  # [IPv6]:port
        end = word.find("]")
        host, rest = word[: end + 1], word[end + 1:]
        if rest:
            if not rest.startswith(":"):
                raise UsageError(f"{where}{word!r}: expected [address]:port", None)
            port = _port(rest[1:], where)
    elif ":" in word:
        host, number = word.rsplit(":", 1)
        if not number.isdigit():
            raise UsageError(f"{where}{word!r}: what follows ':' must be a port or a slot count",
                             "write host:PORT, host:SLOTS (MPICH) or host port=PORT slots=N")
        n = int(number)
        if n >= 1024 or n == 22:
            port = _port(number, where)
        else:
            slots = _count(number, "slots", where)
    else:
        host = word
    check_hostname(host, where)
    return Target(host=host, port=port, user=user, slots=slots)


MAX_HOSTFILE_BYTES = 8 << 20
"""The most a hostfile may hold: about 300,000 hosts of 24 characters. A device (/dev/zero) or a file
written by mistake is refused instead of being read into memory."""


def parse_hostfile(path: str | Path) -> list[Target]:
    """Read a hostfile (ours, DeepSpeed's or MPI's); UsageError naming file:line on a mistake."""
    from ml_debug.core.inputs import read_regular

    p = Path(path).expanduser()
    hint = "--hosts takes a file (one host per line) or a hostlist like node[01-04]"
    data = read_regular(p, "hostfile", MAX_HOSTFILE_BYTES, hint)
    try:
        text = data.decode()
    except UnicodeDecodeError as e:
        raise UsageError(f"hostfile {str(p)!r} is not text (byte {e.start} is not UTF-8)", hint) from None
    targets: list[Target] = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{p}:{lineno}: "
        words = line.split()
        target = parse_target(words[0], where)
        port, slots = target.port, target.slots
        for word in words[1:]:
            key, eq, value = word.partition("=")
            key = key.lower().replace("-", "_")
            if not eq:
                raise UsageError(f"{where}unexpected {word!r}",
                                 "after the host only key=value settings may follow: slots=N, max_slots=N, port=N")
            if key == "slots":
                slots = _count(value, "slots", where)
            elif key == "max_slots":
                _count(value, "max_slots", where)  # checked, not used: we start one agent per host
            elif key == "port":
                port = _port(value, where)
            else:
                raise UsageError(f"{where}unknown setting {key!r}", "known settings: slots=N, max_slots=N, port=N")
        targets.append(Target(host=target.host, port=port, user=target.user, slots=slots))
    if not targets:
        raise UsageError(f"hostfile {str(p)!r} names no host",
                         "write one host per line (host, host:port, host slots=N); '#' starts a comment")
    return targets


def unique(targets: list[Target]) -> list[Target]:
    """Drop repeated (user, host, port) targets, keeping the first; order is kept."""
    seen: set[tuple[str | None, str, int | None]] = set()
    out: list[Target] = []
    for t in targets:
        key = (t.user, t.host, t.port)
        if key not in seen:
            seen.add(key)
            out.append(t)
    return out

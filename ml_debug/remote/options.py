"""The target options shared by every command that works on many nodes, and their resolution.

``--local``, ``--hosts FILE|HOSTLIST`` or ``--slurm-job ID`` say where to run; the ssh options say
how to get there. :meth:`TargetOptions.resolve` turns them into a :class:`TargetSpec`.
"""

from __future__ import annotations

import os
import stat
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ml_debug.core.errors import UsageError
from ml_debug.core.options import option

if TYPE_CHECKING:
    from ml_debug.remote.targets import TargetSpec

PANEL = "Targets"


@dataclass(frozen=True)
class TargetOptions:
    """Where a command runs: this node, hosts over ssh, or the nodes of a Slurm job."""

    hosts: str | None = option(
        None, metavar="FILE|HOSTLIST", panel=PANEL, envvar="MLDEBUG_HOSTS", forward=False,
        help="Run on these hosts over ssh: a hostfile (one host per line, host[:port], slots=N; DeepSpeed and "
             "MPI hostfiles work) or a hostlist like 'node[01-04,07],gpu-a'.")
    slurm_job: str | None = option(
        None, metavar="JOBID", panel=PANEL, envvar="MLDEBUG_SLURM_JOB", forward=False,
        help="Run on every node of this running Slurm job, inside its allocation (srun --jobid ID --overlap).")
    local: bool = option(False, panel=PANEL, forward=False,
                         help="Run on this node only (the default when neither --hosts nor --slurm-job is given).")
    ssh_config: Path | None = option(
        None, metavar="FILE", panel=PANEL, envvar="MLDEBUG_SSH_CONFIG", dir_okay=False, forward=False,
        help="ssh config to use instead of ~/.ssh/config (HostName, Port, User, IdentityFile, ProxyJump are "
             "honoured).")
    identity: list[Path] = option(
        flags=("--identity", "-i"), metavar="KEYFILE", panel=PANEL, dir_okay=False, forward=False, default_factory=list,
        help="Private key to try first (repeatable); the ssh agent and the config's keys are tried too.")
    insecure_no_host_key_check: bool = option(
        False, panel=PANEL, forward=False,
        help="DANGEROUS: accept any ssh host key, even a changed one (a man-in-the-middle would go unnoticed). "
             "By default keys are checked against known_hosts.")
    connect_timeout: float = option(
        10.0, min=0.1, metavar="S", panel=PANEL, envvar="MLDEBUG_CONNECT_TIMEOUT", forward=False,
        help="Give up on a host that does not complete the ssh handshake in this time.")
    remote_python: str | None = option(
        None, metavar="PATH", panel=PANEL, envvar="MLDEBUG_REMOTE_PYTHON", forward=False,
        help="Start mldebug on the nodes as 'PATH -m ml_debug' (for a venv that a non-interactive shell does "
             "not activate).")
    remote_prefix: str | None = option(
        None, metavar="SHELL", panel=PANEL, envvar="MLDEBUG_REMOTE_PREFIX", forward=False,
        help="Shell text run on each node before the command, e.g. 'source /opt/venv/bin/activate' or "
             "'module load cuda'.")
    max_parallel: int = option(64, min=1, max=4096, metavar="N", panel=PANEL, envvar="MLDEBUG_MAX_PARALLEL",
                               forward=False, help="At most this many ssh connections at once.")

    @property
    def remote(self) -> bool:
        """True when the command runs on other nodes (--hosts or --slurm-job)."""
        return self.hosts is not None or self.slurm_job is not None

    def resolve(self) -> TargetSpec:
        """The nodes to run on (UsageError, exit 2, on any mistake)."""
        return resolve_targets(**asdict(self))


# Suffixes no hostname ends with: `--hosts hosts.txt` is a file even when it is missing (then the
# error says so instead of trying to reach a host named "hosts.txt").
FILE_SUFFIXES = (".txt", ".hosts", ".list", ".lst", ".cfg", ".conf", ".ini")


MAX_SSH_FILE_BYTES = 1 << 20
"""The most an ssh config or a private key may hold (a key is a few KiB)."""


def looks_like_path(value: str) -> bool:
    """A --hosts value that names a file rather than hosts (a hostlist never holds '/' or '~')."""
    if "/" in value or value.startswith(("~", ".")) or value.lower().endswith(FILE_SUFFIXES) \
            or "hostfile" in value.lower():
        return True
    try:  # a file here, or a FIFO or device that the hostfile reader refuses (a directory is no hostfile)
        return not stat.S_ISDIR(os.stat(value).st_mode)
    except (OSError, ValueError):  # none, or a name too long: a host name then, which the hostlist check judges
        return False


def resolve_targets(
    *,
    hosts: str | None = None,
    slurm_job: str | None = None,
    local: bool = False,
    ssh_config: Path | None = None,
    identity: list[Path] | None = None,
    insecure_no_host_key_check: bool = False,
    connect_timeout: float = 10.0,
    remote_python: str | None = None,
    remote_prefix: str | None = None,
    max_parallel: int = 64,
) -> TargetSpec:
    """Turn the target options into a TargetSpec (UsageError, exit 2, on any mistake).

    ``--hosts`` that is an existing file (or looks like a path) is read as a hostfile, anything
    else is a hostlist expression. ``--slurm-job`` asks squeue for the job's nodes.
    """
    from ml_debug.remote.targets import Target, TargetSpec, parse_hostfile, parse_target, unique

    chosen = [name for name, on in (("--hosts", hosts is not None), ("--slurm-job", slurm_job is not None),
                                    ("--local", local)) if on]
    if len(chosen) > 1:
        raise UsageError(f"{' and '.join(chosen)} cannot be combined", "pick one place to run: "
                         "--local, --hosts FILE|HOSTLIST or --slurm-job ID")
    common = dict(ssh_config=ssh_config, identities=list(identity or []),
                  insecure_no_host_key_check=insecure_no_host_key_check, connect_timeout_s=connect_timeout,
                  remote_python=remote_python, remote_prefix=remote_prefix, max_parallel=max_parallel)
    from ml_debug.core.inputs import read_regular

    if ssh_config is not None and str(ssh_config) != os.devnull:  # `-F /dev/null`: no config, as with ssh
        read_regular(ssh_config.expanduser(), "ssh config", MAX_SSH_FILE_BYTES,
                     "--ssh-config takes an ssh_config file like ~/.ssh/config")
    for key in identity or []:
        hint = "--identity takes a private key file (e.g. ~/.ssh/id_ed25519, not the .pub)"
        if b"PRIVATE KEY-----" not in read_regular(key.expanduser(), "identity file", MAX_SSH_FILE_BYTES, hint):
            raise UsageError(f"identity file {str(key)!r} is not a private key (no '-----BEGIN ... PRIVATE "
                             "KEY-----' line)", hint)
    if hosts is not None:
        value = hosts.strip()
        if not value:
            raise UsageError("--hosts is empty", "give a hostfile or a hostlist like node[01-04]")
        if looks_like_path(value):
            targets = parse_hostfile(value)
        else:
            from ml_debug.remote.hostlist import expand_hostlist

            targets = [parse_target(name, "--hosts: ") for name in expand_hostlist(value)]
        if insecure_no_host_key_check:
            from ml_debug.core.output import warn

            warn("--insecure-no-host-key-check: ssh host keys are NOT verified; a man-in-the-middle "
                 "would go unnoticed")
        return TargetSpec(kind="ssh", targets=unique(targets), **common)  # type: ignore[arg-type]
    if slurm_job is not None:
        from ml_debug.remote.slurm import job_info

        job = job_info(slurm_job.strip())
        return TargetSpec(kind="slurm", targets=[Target(host=n) for n in job.nodes], slurm_job=job.job_id,
                          slurm_gres_gpu=job.gres_gpu, **common)  # type: ignore[arg-type]
    import socket

    return TargetSpec(kind="local", targets=[Target(host=socket.gethostname())], **common)  # type: ignore[arg-type]

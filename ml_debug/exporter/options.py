"""The options of `mldebug exporter` (cheap to import: the CLI builds its options from them)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from ml_debug.core.errors import UsageError
from ml_debug.core.options import option
from ml_debug.procs.selectors import env_option, pattern_option, user_option
from ml_debug.sampling.options import parse_pattern
from ml_debug.watch.options import check_straggler_factor, grace_option, stall_option, straggler_factor_option

SERVE = "Serving"
WHICH = "Which job"
WHEN = "When a rank is stalled or a straggler (the decisions of mldebug watch)"
HEALTH = "Node health"

DEFAULT_PORT = 9477
DEFAULT_LISTEN = f"127.0.0.1:{DEFAULT_PORT}"
LISTEN_HINT = (f"give HOST:PORT with an IP address: {DEFAULT_LISTEN} (this node only, the default), "
               f"0.0.0.0:{DEFAULT_PORT} (every interface), [::1]:{DEFAULT_PORT}")


def parse_listen(word: str) -> str:
    """``--listen HOST:PORT`` checked when the command line is read: an IP address (or localhost) and a port."""
    split_listen(word)
    return word


def split_listen(word: str) -> tuple[str, int]:
    """``"127.0.0.1:9477"`` -> ("127.0.0.1", 9477); ``"[::1]:9477"`` -> ("::1", 9477); a usage error otherwise."""
    text = word.strip()
    host, sep, port_text = text.rpartition(":")
    if not sep or not host:
        raise UsageError(f"--listen {word!r} is not HOST:PORT", LISTEN_HINT)
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:  # an IPv6 address must be bracketed, or its last group reads as the port
        raise UsageError(f"--listen {word!r}: an IPv6 address goes in brackets", LISTEN_HINT)
    if host != "localhost":
        try:
            ipaddress.ip_address(host)
        except ValueError:
            raise UsageError(f"--listen {word!r}: {host!r} is not an IP address", LISTEN_HINT) from None
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise UsageError(f"--listen {word!r}: {port_text!r} is not a port (1-65535)", LISTEN_HINT)
    return ("127.0.0.1" if host == "localhost" else host), int(port_text)


@dataclass(frozen=True)
class ExporterOptions:
    """What `mldebug exporter` serves, where, and how often it samples."""

    listen: str = option(DEFAULT_LISTEN, metavar="HOST:PORT", panel=SERVE, parse=parse_listen,
                         envvar="MLDEBUG_EXPORTER_LISTEN",
                         help="Address and port of the /metrics endpoint. The default answers this node only; "
                              "0.0.0.0:PORT lets a Prometheus server on another host scrape it.")
    once: bool = option(False, panel=SERVE,
                        help="Sample once (ranks over one --interval, health checks once), print the metrics and "
                             "exit: the Prometheus text, or with --json the values as one document.")
    interval: float = option(5.0, min=0.2, max=600.0, metavar="S", panel=SERVE,
                             help="Seconds between samples of the ranks (CPU, state, GPUs, progress files). A scrape "
                                  "never waits for a sample: it gets the last one.")
    job: str | None = option(None, metavar="NAME", panel=WHICH, envvar="MLDEBUG_EXPORTER_JOB",
                             help="The job_id label of every rank (default: the rank's SLURM_JOB_ID, else its "
                                  "TORCHELASTIC_RUN_ID, else 'pid<launcher pid>').")
    pids: list[int] = option(flags=("--pid",), default_factory=list, min=1, metavar="PID", panel=WHICH,
                             help="Only this process (repeatable; a launcher's pid means its ranks).")
    pattern: str | None = pattern_option(WHICH, "Export")
    user: str | None = user_option(WHICH)
    env: list[tuple[str, str]] = env_option(WHICH, " (one job among several on a node).")
    progress_files: list[str] = option(
        flags=("--progress-file",), default_factory=list, metavar="PATTERN", panel=WHICH, parse=parse_pattern,
        help="A file whose growth is the job's progress (repeatable; a glob; {rank} stands for a rank's number), "
             "e.g. 'run/metrics/rank-{rank}.jsonl' (mldebug train --metrics-dir). Gives each rank its step and "
             "step rate; with it a rank stalls when its file stops growing.")
    stall: float = stall_option(WHEN, "A rank without progress for this long is stalled (mldebug_rank_stalled 1).")
    grace: float = grace_option(WHEN, "A rank is not judged in its first S seconds (start-up, compilation, loading a "
                                      "checkpoint), counted from when the exporter first saw it.")
    straggler_factor: float = straggler_factor_option(
        WHEN, "A rank whose step rate stays below the median divided by F is a straggler (0: never).")
    health_interval: float = option(60.0, min=1.0, max=86400.0, metavar="S", panel=HEALTH,
                                    help="Seconds between two runs of the node's health checks (mldebug health "
                                         "--level 1: GPUs through NVML, Xids, host checks).")
    health_timeout: float = option(30.0, min=1.0, max=3600.0, metavar="S", panel=HEALTH,
                                    help="A health run still going after this long is reported hung "
                                         "(mldebug_health_hung 1); no other run starts until it returns.")
    expect_gpus: int | None = option(None, min=0, metavar="N", panel=HEALTH,
                                     help="GPUs this node must have; fewer fails the gpu.count check.")
    paths: list[str] = option(flags=("--path",), default_factory=list, metavar="DIR", panel=HEALTH,
                              help="Check free disk and inodes here (repeatable; default: the working directory and "
                                   "the temp dir).")

    @property
    def env_filter(self) -> dict[str, str]:
        return dict(self.env)

    @property
    def address(self) -> tuple[str, int]:
        return split_listen(self.listen)

    def validate(self) -> None:
        """Raise UsageError (exit 2) for impossible combinations, before anything starts."""
        split_listen(self.listen)
        check_straggler_factor(self.straggler_factor,
                               "a straggler's step rate is below the median divided by F: e.g. 2, or 0 for never")

"""The fan-out runner: one command on every target, results as they arrive, never blocked by one.

* :func:`run_everywhere` runs an argument list (quoted with shlex for the far shell) on every
  target of a :class:`~ml_debug.remote.targets.TargetSpec` and returns one
  :class:`NodeResult` per target, in target order. A dead host fails after the connect timeout,
  a hanging command after ``timeout_s``; the others are not held up.
* :func:`run_mldebug_everywhere` is the agent pattern: the far side runs the same mldebug with
  ``--json ... --local``, and each node's JSON document comes back parsed.

With ``out_dir``, each node's result is written to ``<out_dir>/<host>.out`` (stdout, then
stderr) and ``<host>.json`` the moment it arrives, so Ctrl-C keeps what was gathered.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ml_debug import __version__
from ml_debug.remote.result import (
    COMMAND_FAILED,
    INTERRUPTED,
    NOT_REACHED,
    Interrupted,
    NodeResult,
    failed,
)
from ml_debug.remote.targets import TargetSpec

__all__ = ["AgentResult", "NodeResult", "build_script", "connections", "partial", "run_everywhere",
           "run_mldebug_everywhere"]


def build_script(argv: Sequence[str], remote_prefix: str | None = None) -> str:
    """The text the far shell runs: each argument quoted, after the (trusted) prefix if any.

    ``build_script(["echo", "a;b"], "source venv/bin/activate")`` ->
    ``source venv/bin/activate && exec echo 'a;b'``
    """
    if not argv:
        from ml_debug.core.errors import UsageError

        raise UsageError("no command to run", "put the command after --, e.g. mldebug exec --hosts h -- uptime")
    cmd = shlex.join(argv)
    # The prefix is the user's own shell text (an activation line), so it is not quoted; a failing
    # prefix stops the command (&&) and its status is what the node reports.
    return f"{remote_prefix} && {cmd}" if remote_prefix else cmd


def run_everywhere(
    spec: TargetSpec,
    argv: Sequence[str],
    *,
    timeout_s: float,
    connect_timeout_s: float | None = None,
    max_parallel: int | None = None,
    out_dir: Path | None = None,
    on_result: Callable[[NodeResult], None] | None = None,
    pool: Any = None,
    _script: str | None = None,
) -> list[NodeResult]:
    """Run ``argv`` on every target of ``spec``; one NodeResult per target, in target order.

    Shell equivalent: ``pdsh -w HOSTS -u TIMEOUT CMD`` / ``srun --jobid ID --overlap ... CMD``.
    ``connect_timeout_s`` and ``max_parallel`` default to the spec's. ``pool`` (from
    :func:`connections`) keeps ssh connections open across several calls.
    """
    script = _script if _script is not None else build_script(argv, spec.remote_prefix)
    connect_timeout_s = spec.connect_timeout_s if connect_timeout_s is None else connect_timeout_s
    max_parallel = spec.max_parallel if max_parallel is None else max_parallel
    if out_dir is not None:
        from ml_debug.core.safefs import claim_out_dir

        claim_out_dir(out_dir)  # before any node answers; a second run into it meanwhile is refused
    results: dict[str, NodeResult] = {}
    lock = threading.Lock()

    def deliver(result: NodeResult) -> None:
        with lock:
            if result.host in results:  # a transport must deliver once per target; keep the first
                return
            results[result.host] = result
            if out_dir is not None:
                _write(out_dir, result)
            if on_result is not None:
                on_result(result)

    targets = spec.targets
    try:
        if spec.kind == "local":
            from ml_debug.remote.local import run_local

            for t in targets:
                run_local(t, script, timeout_s, deliver)
        elif spec.kind == "ssh":
            from ml_debug.remote.ssh import run_ssh

            run_ssh(targets, spec, script, timeout_s, connect_timeout_s, max_parallel, deliver, pool=pool)
        elif spec.kind == "slurm":
            from ml_debug.remote.slurm import run_slurm

            if not spec.slurm_job:
                raise ValueError("a slurm TargetSpec needs slurm_job")
            run_slurm(targets, spec.slurm_job, script, timeout_s, spec.slurm_gres_gpu, deliver)
        else:
            raise ValueError(f"unknown target kind {spec.kind!r}")
    except KeyboardInterrupt as e:  # Ctrl-C: every target's result so far, the running ones cut short
        for r in getattr(e, "results", ()):
            deliver(r)
        for t in targets:
            if t.label not in results:
                deliver(failed(t.label, INTERRUPTED, "Ctrl-C before it started", 0.0))
        raise Interrupted([results[t.label] for t in targets]) from None
    return [results[t.label] for t in targets if t.label in results]


@contextmanager
def connections(spec: TargetSpec, connect_timeout_s: float | None = None) -> Iterator[Any]:
    """Keep ssh connections open across several runs on the same spec (None for other kinds)::

        with connections(spec) as pool:
            first = run_everywhere(spec, ["py-spy", "dump", ...], timeout_s=30, pool=pool)
            again = run_everywhere(spec, ["py-spy", "dump", ...], timeout_s=30, pool=pool)
    """
    if spec.kind != "ssh":
        yield None
        return
    from ml_debug.remote.ssh import SshPool

    pool = SshPool(spec, spec.connect_timeout_s if connect_timeout_s is None else connect_timeout_s)
    try:
        yield pool
    finally:
        pool.close()


def partial(results: Sequence[NodeResult]) -> bool:
    """True when some node never answered (unreachable, refused, timed out): exit code 4."""
    return any(r.failure in NOT_REACHED for r in results)


_SAFE_NAME = re.compile(r"[^A-Za-z0-9._:-]")


def _write(out_dir: Path, r: NodeResult) -> None:
    from ml_debug.core.output import to_jsonable, warn
    from ml_debug.core.safefs import write_out

    name = _SAFE_NAME.sub("_", r.host)
    for note in (write_out(out_dir, f"{name}.out", r.stdout + r.stderr),
                 write_out(out_dir, f"{name}.json", json.dumps(to_jsonable(r), indent=2) + "\n")):
        if note:
            warn(f"--out-dir: {note}")


# ------------------------------------------------------------------------------- agent pattern


@dataclass
class AgentResult:
    """One node's run of ``mldebug ... --local --json``: the raw result and the parsed document.

    ``error`` says in words why there is no usable document (mldebug missing, another version,
    no JSON in its output); ``document`` may still be set when only the version differs.
    """

    node: NodeResult
    document: dict[str, Any] | None
    error: str | None


VERSION_LINE = re.compile(r"^mldebug (\S+)[ \t\r]*$", re.MULTILINE)
MISSING_HINT = ("install mldebug there, or say how to start it: --remote-python /path/to/venv/bin/python "
                "or --remote-prefix 'source /path/to/venv/bin/activate'")


def mldebug_base(remote_python: str | None) -> list[str]:
    """How the far side starts mldebug: ``--remote-python``'s ``-m ml_debug``, else ``mldebug`` on its PATH."""
    return [remote_python, "-m", "ml_debug"] if remote_python else ["mldebug"]


def agent_argv(mldebug_args: Sequence[str], remote_python: str | None,
               add_local: bool = True) -> tuple[list[str], list[str]]:
    """(version probe, command) argument lists for the far side."""
    base = mldebug_base(remote_python)
    args = list(mldebug_args)
    # `--local` belongs to the subcommand, so it goes before a `--` that ends its options.
    if add_local and "--local" not in args:
        cut = args.index("--") if "--" in args else len(args)
        args[cut:cut] = ["--local"]
    return [*base, "--version"], [*base, "--json", *args]


def agent_script(mldebug_args: Sequence[str], spec: TargetSpec, add_local: bool = True) -> str:
    """``[prefix &&] mldebug --version && mldebug --json ARGS --local``: one round trip per node."""
    probe, command = agent_argv(mldebug_args, spec.remote_python, add_local)
    body = f"{shlex.join(probe)} && {shlex.join(command)}"
    return f"{spec.remote_prefix} && {body}" if spec.remote_prefix else body


def run_mldebug_everywhere(
    spec: TargetSpec,
    mldebug_args: Sequence[str],
    *,
    timeout_s: float,
    connect_timeout_s: float | None = None,
    max_parallel: int | None = None,
    out_dir: Path | None = None,
    on_result: Callable[[AgentResult], None] | None = None,
    add_local: bool = True,
    pool: Any = None,
) -> list[AgentResult]:
    """Run ``mldebug --json <mldebug_args> --local`` on every target and parse each JSON document.

    The local target runs this very interpreter (``sys.executable -m ml_debug``), so it needs no
    probe. Elsewhere the far side first prints ``mldebug --version``, which must match ours.
    ``add_local=False`` is for commands that have no ``--local`` option (``mldebug env``).
    """
    if spec.kind == "local":
        _, command = agent_argv(mldebug_args, sys.executable, add_local)
        script = shlex.join(command)
    else:
        script = agent_script(mldebug_args, spec, add_local)
    wrap = (lambda r: on_result(to_agent_result(r, local=spec.kind == "local"))) if on_result else None
    try:
        results = run_everywhere(spec, [], timeout_s=timeout_s, connect_timeout_s=connect_timeout_s,
                                 max_parallel=max_parallel, out_dir=out_dir, on_result=wrap, pool=pool,
                                 _script=script)
    except Interrupted as e:  # Ctrl-C: the documents the nodes printed as they stopped (see ssh.INTERRUPT_GRACE_S)
        raise Interrupted([to_agent_result(r, local=spec.kind == "local") for r in e.results]) from None
    return [to_agent_result(r, local=spec.kind == "local") for r in results]


def on_every_node(command: str, config: Any, spec: TargetSpec, *, timeout_s: float, out_dir: Path | None = None,
                  extra: Sequence[str] = (), on_result: Callable[[AgentResult], None] | None = None
                  ) -> list[AgentResult]:
    """Run ``mldebug --json <command> <config> --local`` on every target node; each node's result.

    ``config`` is the command's options dataclass: :func:`ml_debug.core.options.to_argv` turns it
    back into the words that rebuild it there (the one way a configuration travels to a node).
    """
    from ml_debug.core.options import to_argv

    return run_mldebug_everywhere(spec, [command, *to_argv(config), *extra], timeout_s=timeout_s,
                                  out_dir=out_dir, on_result=on_result)


def to_agent_result(r: NodeResult, local: bool = False) -> AgentResult:
    """Parse one node's output: the version line (unless local), then one JSON document."""
    if r.failure in NOT_REACHED:
        return AgentResult(node=r, document=None, error=f"{r.failure}: {r.detail}")
    text = r.stdout
    version: str | None = None
    if not local:
        # The probe's line comes first, after whatever the node's shell start-up printed (a banner).
        m = VERSION_LINE.search(text)
        if not m:
            return AgentResult(node=r, document=None, error=_missing_words(r))
        version, text = m.group(1), text[m.end():]
    document: dict[str, Any] | None = None
    start = text.find("{")
    if start >= 0:
        try:
            parsed, _ = json.JSONDecoder().raw_decode(text, start)
            document = parsed if isinstance(parsed, dict) else None
        except json.JSONDecodeError:
            document = None
    if version is not None and version != __version__:
        return AgentResult(node=r, document=document,
                           error=f"{r.host} runs mldebug {version}, this is mldebug {__version__}: "
                                 "install the same version on every node")
    if document is None:
        tail = (r.stderr.strip().splitlines() or ["no output"])[-1]
        return AgentResult(node=r, document=None, error=f"mldebug printed no JSON document ({tail})")
    if document is not None and document.get("schema") == "mldebug.error":  # it ended without its answer: why
        said = document.get("result")
        why = said.get("summary") if isinstance(said, dict) else None
        return AgentResult(node=r, document=None, error=f"mldebug failed: {why or 'no reason given'}")
    return AgentResult(node=r, document=document, error=None)


def _missing_words(r: NodeResult) -> str:
    err = r.stderr.strip()
    if r.exit_code == 127 or "not found" in err or "No such file" in err:
        return f"mldebug is not installed on {r.host} (or not on the PATH of a non-interactive shell): {MISSING_HINT}"
    if "No module named" in err:
        return f"the remote python on {r.host} has no ml_debug module: {MISSING_HINT}"
    last = err.splitlines()[-1] if err else f"exit status {r.exit_code}"
    if r.failure == COMMAND_FAILED:
        return f"mldebug did not start on {r.host}: {last}"
    return f"unexpected output from mldebug --version on {r.host}: {r.stdout[:80]!r}"

"""What a job left on its nodes, fetched in one round trip per node: the kernel log since the job's start
and the Flight Recorder dump files written since then.

One script (:data:`SCRIPT`) runs on every node, over ``remote/``: ssh with ``--hosts``, ``srun --jobid J
--overlap`` while the job runs; once it has ended, one step of a new allocation on its nodes
(``srun -w NODES --immediate``, which gives up at once on a node that is down). The script's only inputs
are arguments (the start time, the dump prefixes), never text pasted into it. What each node printed is
parsed here: :func:`parse_node` (pure).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
import subprocess
from dataclasses import dataclass, field

from ml_debug.postmortem.kernel import NODE_SCRIPT, NodeKernelLog, parse_node_output

MAX_NODE_DUMP_BYTES = 64 * 1024 * 1024
"""The largest dump file a node sends back (base64 on the wire)."""

# $1 start time (Unix seconds), then the dump prefixes. Files are those of the prefix's name written since
# the start, regular (find -type f: never a link), at most MAX_NODE_DUMP_BYTES; base64 in short lines (srun
# cuts an output line at 1 KiB), up to an end mark.
_DUMPS = r"""
shift
for prefix in "$@"; do
  dir=$(dirname -- "$prefix"); base=$(basename -- "$prefix")
  [ -d "$dir" ] || continue
  find "$dir" -maxdepth 1 -type f -name "${base}[0-9]*" -newermt "@$START" -size -@MAX@c 2>/dev/null | head -n 4096 |
  while IFS= read -r f; do
    echo "@@dump $f"; base64 < "$f" 2>/dev/null || echo "@@dump-error cannot read"; echo "@@end"
  done
done
""".replace("@MAX@", str(MAX_NODE_DUMP_BYTES + 1))

SCRIPT = 'START="$1"\n' + NODE_SCRIPT + "\n" + _DUMPS


@dataclass
class NodeEvidence:
    """One node's kernel log and dump files, or why the node could not be read."""

    node: str
    kernel: NodeKernelLog
    dumps: dict[str, bytes] = field(default_factory=dict)
    """Path on the node -> the dump's bytes."""
    dump_errors: dict[str, str] = field(default_factory=dict)
    error: str | None = None
    """The node was not reached, or its step did not run (then nothing of it was read)."""


def parse_node(text: str, node: str, since: float | None, until: float | None = None) -> NodeEvidence:
    """What :data:`SCRIPT` printed on one node."""
    kernel_part: list[str] = []
    dumps: dict[str, bytes] = {}
    errors: dict[str, str] = {}
    current: str | None = None
    chunks: list[str] = []
    for line in text.splitlines():
        if current is None:
            if line.startswith("@@dump "):
                current, chunks = line[7:], []
            else:
                kernel_part.append(line)
            continue
        if line.startswith("@@dump-error"):
            errors[current] = line[12:].strip() or "cannot read"
        elif line == "@@end":
            if current not in errors:
                try:
                    dumps[current] = base64.b64decode("".join(chunks), validate=True)
                except (binascii.Error, ValueError):
                    errors[current] = "sent back damaged"
            current = None
        else:
            chunks.append(line.strip())
    if current is not None:
        errors[current] = "cut short (the node's output ended before the file did)"
    kernel = parse_node_output("\n".join(kernel_part), node, since, until)
    return NodeEvidence(node=kernel.node or node, kernel=kernel, dumps=dumps, dump_errors=errors)


def unreached(node: str, why: str) -> NodeEvidence:
    return NodeEvidence(node=node, kernel=NodeKernelLog(node=node, reason=why), error=why)


def script_argv(since: float, prefixes: list[str]) -> list[str]:
    return ["sh", "-c", SCRIPT, "mldebug-postmortem", str(int(since)), *prefixes]


_LABEL = re.compile(r"^\s*(\d+): ?(.*)$")


def _split_labelled(out: str) -> dict[int, list[str]]:
    tasks: dict[int, list[str]] = {}
    for line in out.splitlines():
        m = _LABEL.match(line)
        if m:
            tasks.setdefault(int(m.group(1)), []).append(m.group(2))
    return tasks


def fetch_new_step(nodes: list[str], since: float, prefixes: list[str], timeout_s: float,
                   partition: str | None = None, until: float | None = None) -> list[NodeEvidence]:
    """The job has ended: one step of a new allocation on its nodes (``srun -N K -w NODES --immediate``).
    A node that is down, drained or busy makes the step fail at once: each node then says why."""
    from ml_debug.core import bounded

    argv = ["srun", f"--nodes={len(nodes)}", f"--ntasks={len(nodes)}", "--ntasks-per-node=1", "-w", ",".join(nodes),
            "--label", "--immediate=10", "--time=5", "-J", "mldebug-postmortem", "--input=none",
            "--kill-on-bad-exit=0", *([f"--partition={partition}"] if partition else []), *script_argv(since, prefixes)]
    try:
        proc = bounded.run(argv, timeout=timeout_s + 15)
    except FileNotFoundError:
        return [unreached(n, "srun is not installed here") for n in nodes]
    except subprocess.TimeoutExpired:
        return [unreached(n, f"srun did not finish within {timeout_s + 15:g} s") for n in nodes]
    tasks = _split_labelled(proc.stdout)
    got: dict[str, NodeEvidence] = {}
    for lines in tasks.values():
        first = next((ln for ln in lines if ln.startswith("@@node ")), None)
        name = first[7:].strip() if first else None
        if name:
            got[name] = parse_node("\n".join(lines), name, since, until)
    why = (proc.stderr.strip().splitlines() or [f"srun exit status {proc.returncode}"])[-1]
    return [got.get(n) or unreached(n, f"its step did not run there: {why}") for n in nodes]


def fetch_over(spec: object, since: float, prefixes: list[str], timeout_s: float,
               until: float | None = None) -> list[NodeEvidence]:
    """Over ``remote/``: ssh to ``--hosts``, or ``srun --jobid --overlap`` inside a running job."""
    from ml_debug.remote.runner import run_everywhere
    from ml_debug.remote.targets import TargetSpec

    assert isinstance(spec, TargetSpec)
    results = run_everywhere(spec, script_argv(since, prefixes), timeout_s=timeout_s)
    out = []
    for r in results:
        if "@@node " not in r.stdout:
            out.append(unreached(r.host, f"{r.failure or 'no answer'}: {r.detail or r.stderr.strip()[-200:]}"))
        else:
            out.append(parse_node(r.stdout, r.host, since, until))
    return out


def unique_dumps(evidence: list[NodeEvidence]) -> list[tuple[str, str, bytes]]:
    """(node, path, bytes) of every dump, a file seen identically on several nodes (a shared /tmp) once."""
    seen: set[tuple[str, str]] = set()
    out = []
    for ev in evidence:
        for path, data in sorted(ev.dumps.items()):
            key = (path, hashlib.sha256(data).hexdigest())
            if key in seen:
                continue
            seen.add(key)
            out.append((ev.node, path, data))
    return out

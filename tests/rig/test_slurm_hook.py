"""`mldebug health --slurm-check` as Slurm's own HealthCheckProgram and Epilog, on a real Slurm.

A second small rig (2 netns nodes, its own slurmctld, munged, subnet and tag) starts beside the shared
one, whose slurm.conf is never touched: its slurm.conf names a wrapper of the hook as
HealthCheckProgram (every 3 s) and Epilog. The NVML fake (per node, through the test hook) makes
node1's GPU report a pending row remap: slurmd's own health check drains node1 with an `mldebug:`
reason; healed, it is resumed by the next check. node2 drained by hand stays drained. The rig is
stopped at the end and nothing of it survives.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.conftest import mldebug, require, validate_schema, wait_until
from tests.fakes import REPO
from tests.fakes.nvml import healthy_gpu

pytestmark = pytest.mark.rig

RIG = REPO / "tests" / "rig"


def _scenario(path: Path, pending: bool) -> None:
    gpu = healthy_gpu(0)
    if pending:
        gpu["remapped_rows"] = [0, 1, 1, 0]  # correctable, uncorrectable, pending, failure
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"gpus": [gpu]}))
    tmp.replace(path)  # the hook never reads half a file


def _wrapper(base: Path, name: str, extra: str) -> Path:
    """What slurm.conf names: the hook with this rig's Slurm, a history file and the per-node NVML fake.
    slurmd runs it as root with a bare environment, as on a cluster."""
    script = base / f"{name}.sh"
    script.write_text(f"""#!/bin/sh
node=${{SLURMD_NODENAME:-$(hostname)}}
export SLURM_CONF={base}/slurm/etc/slurm.conf PATH=/usr/sbin:/usr/bin:/sbin:/bin
export MLDEBUG_HISTORY={base}/hist/history.db PYTHONPATH={REPO}
export MLDEBUG_TEST_HOOKS=tests.fakes.nvml MLDEBUG_TEST_NVML={base}/nvml-$node.json
out=$({sys.executable} -m ml_debug health --slurm-check {extra} 2>&1)
rc=$?
printf '%s rc=%s %s\\n' "$node" "$rc" "$out" | tr -d '\\r' >> {base}/{name}-$node.log
exit $rc
""")
    script.chmod(0o755)
    return script


def _log(base: Path, name: str, node: str) -> list[str]:
    try:
        return (base / f"{name}-{node}.log").read_text().splitlines()
    except FileNotFoundError:
        return []


def _rig_processes(base: str) -> list[str]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                args = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                environ = Path(f"/proc/{entry}/environ").read_bytes().decode(errors="replace")
                state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if (base in args or base in environ) and state != "Z":
                out.append(f"{entry} {args}")
    return out


def test_slurm_health_check_drains_and_resumes_only_its_own_drains() -> None:
    require(os.geteuid() == 0, "root (the rig's slurmd and network namespaces)")
    require(shutil.which("slurmctld") and shutil.which("scontrol"), "Slurm (slurmctld, scontrol)")
    base = Path(tempfile.mkdtemp(prefix="mldhc-", dir="/tmp"))  # short: munge's socket path is limited
    base.chmod(0o755)
    (base / "hist").mkdir(mode=0o700)
    for node in ("node1", "node2"):
        _scenario(base / f"nvml-{node}.json", pending=False)
    hook = _wrapper(base, "hook", "")
    epilog = _wrapper(base, "epilog", "--exit-zero")
    extra = base / "extra.conf"
    extra.write_text(f"HealthCheckProgram={hook}\nHealthCheckInterval=3\nHealthCheckNodeState=ANY\n"
                     f"Epilog={epilog}\n")
    env = {**os.environ, "RIG_BASE": str(base), "RIG_TAG": "mldhc", "NET_PREFIX": "10.213.23",
           "SLURMCTLD_PORT": "7827", "NODES": "2", "SLURM_GPUS": "1", "SLURM_EXTRA_CONF": str(extra)}
    slurm_env = {**os.environ, "SLURM_CONF": f"{base}/slurm/etc/slurm.conf"}

    def sh(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=60, env=slurm_env)

    def state(node: str) -> tuple[str, str]:
        out = sh("sinfo", "-h", "-N", "-n", node, "-o", "%T|%E").stdout.strip().splitlines()
        return tuple(out[0].split("|", 1)) if out else ("", "")  # type: ignore[return-value]

    try:
        up = subprocess.run(["bash", str(RIG / "up.sh"), "slurm"], capture_output=True, text=True, timeout=240,
                            env=env)
        require(up.returncode == 0, f"a second Slurm rig: {up.stdout[-2000:]}{up.stderr[-2000:]}")
        # slurmd's own health check runs the hook on both nodes: healthy, nothing done
        for node in ("node1", "node2"):
            wait_until(lambda n=node: any("rc=0" in line and "healthy" in line for line in _log(base, "hook", n)),
                       60, f"the health check on {node}")

        # at once: node1's GPU reports a pending row remap, and an administrator drains node2
        _scenario(base / "nvml-node1.json", pending=True)
        assert sh("scontrol", "update", "nodename=node2", "state=drain", "reason=admin: fan swap").returncode == 0
        seen = len(_log(base, "hook", "node2"))
        # node1 is drained by Slurm's own call, with a reason that names the check and the GPU
        st, reason = wait_until(lambda: s if "drain" in (s := state("node1"))[0] else None, 60, "node1 drained")
        assert reason.startswith("mldebug: gpu0 row_remap pending=yes"), reason
        assert "node1" in sh("sinfo", "-R", "-h", "-o", "%N %E").stdout
        wait_until(lambda: any("rc=1" in line and "-> drain" in line for line in _log(base, "hook", "node1")), 30,
                   "the hook's line for the drain")  # written after scontrol returned

        # healed: the next health check resumes node1 (mldebug's own drain)
        _scenario(base / "nvml-node1.json", pending=False)
        wait_until(lambda: state("node1")[0] == "idle", 60, "node1 resumed")
        wait_until(lambda: any("-> resume" in line for line in _log(base, "hook", "node1")), 30,
                   "the hook's line for the resume")
        job = sh("sbatch", "--parsable", "-w", "node1", "-o", "/dev/null", "--wrap", "true")  # for the Epilog
        assert job.returncode == 0, job.stderr

        # node2, healthy all along, has seen health checks since its drain: still drained, the admin's reason
        wait_until(lambda: len(_log(base, "hook", "node2")) >= seen + 2, 60, "two health checks on node2")
        assert state("node2") == ("drained", "admin: fan swap")
        assert "not mldebug's drain" in _log(base, "hook", "node2")[-1]

        # a user who may not update nodes (scontrol run as nobody; slurmctld refuses it): exit 3, said clearly
        bin_dir = base / "nobody-bin"
        bin_dir.mkdir()
        (bin_dir / "scontrol").write_text(f"#!/bin/sh\nexec setpriv --reuid=nobody --regid=nogroup --clear-groups "
                                          f"{shutil.which('scontrol')} \"$@\"\n")
        (bin_dir / "scontrol").chmod(0o755)
        denied = mldebug("health", "--slurm-check", "--node", "node1", "--path", str(base / "missing"),
                         "--history", str(base / "denied.db"), env={"SLURM_CONF": slurm_env["SLURM_CONF"],
                                                                    "PATH": f"{bin_dir}:{os.environ['PATH']}"})
        assert denied.returncode == 3, denied.stdout + denied.stderr
        assert "may not update Slurm nodes" in denied.stderr and "hint:" in denied.stderr
        with sqlite3.connect(base / "denied.db") as con:  # the checks are kept all the same; no drain recorded
            assert con.execute("SELECT COUNT(*) FROM checks WHERE status = 'fail'").fetchone()[0] >= 1
            assert con.execute("SELECT COUNT(*) FROM actions").fetchone()[0] == 0
        assert "drain" not in state("node1")[0]  # idle, or running the Epilog's job

        # the Epilog ran the hook after the job, and said where it ran from
        wait_until(lambda: _log(base, "epilog", "node1"), 60, "the Epilog on node1")
        assert "rc=0" in _log(base, "epilog", "node1")[0]

        # a reason full of shell characters (a --path that is gone) reaches Slurm as text, through no shell;
        # it is still mldebug's drain, so the next health check (without that path) resumes it
        marker = base / "pwned"
        odd = f"{base}/gone;touch {marker};$(touch {marker})`touch {marker}`"
        manual = mldebug("health", "--slurm-check", "--node", "node1", "--path", odd, "--no-record",
                         env={"SLURM_CONF": slurm_env["SLURM_CONF"]})
        assert manual.returncode == 1, manual.stdout + manual.stderr
        ctld_log = base / "slurm" / "log" / "slurmctld.log"  # the health check may resume it before we look
        assert f"node node1 reason set to: mldebug: {odd} disk not accessible\n" in ctld_log.read_text()
        assert not marker.exists()
        wait_until(lambda: "drain" not in state("node1")[0], 60, "node1 resumed after the manual drain")

        # everything is in the history: the drain and the resume, node1's failures, the Epilog's run
        db = base / "hist" / "history.db"
        with sqlite3.connect(db) as con:
            actions = con.execute("SELECT node, action, reason FROM actions ORDER BY id").fetchall()
            sources = {r[0] for r in con.execute("SELECT source FROM runs WHERE node = 'node1'")}
        assert [a[:2] for a in actions if a[0] == "node1"][:2] == [("node1", "drain"), ("node1", "resume")]
        assert ("node2", "resume") not in [a[:2] for a in actions]
        assert "slurm-check:epilog_slurmd" in sources, sources
        proc = mldebug("history", "--node", "node1", "--history", str(db), "--json")
        assert proc.returncode == 0, proc.stderr
        doc = json.loads(proc.stdout)
        validate_schema(doc, "history")
        kinds = [e["kind"] for e in doc["result"]["timeline"]]
        assert "drain" in kinds and "resume" in kinds and kinds.index("drain") < kinds.index("resume")
    finally:
        down = subprocess.run(["bash", str(RIG / "down.sh")], capture_output=True, text=True, timeout=180, env=env)
    assert down.returncode == 0, down.stdout + down.stderr
    assert _rig_processes(str(base)) == []
    shutil.rmtree(base, ignore_errors=True)

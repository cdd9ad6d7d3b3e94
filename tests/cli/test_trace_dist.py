"""A 3-rank gloo job under `mldebug trace` (torchrun): trace-tail sets the odd rank apart (2 ranks are the
majority, the 3rd stands out: the fewest ranks with an odd one out)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import jsonschema
import pytest

from ml_debug.core.errors import UsageError
from ml_debug.tracing.tail import tail_traces
from tests.conftest import REPO, mldebug, require

JOB = textwrap.dedent('''
    import sys
    from datetime import timedelta

    import torch
    import torch.distributed as dist


    def wait_for_peers():
        dist.barrier()


    def stuck_here(fifo):
        with open(fifo) as f:  # blocks until the test writes: this rank is somewhere else
            return f.read()


    def main():
        dist.init_process_group("gloo", timeout=timedelta(seconds=120))
        rank = dist.get_rank()
        for _ in range(3):
            dist.all_reduce(torch.ones(4))
        if rank == int(sys.argv[2]):
            stuck_here(sys.argv[1])
        wait_for_peers()
        dist.barrier()
        dist.destroy_process_group()


    if __name__ == "__main__":
        main()
''')

ODD = 2


def _kill_tree(proc: subprocess.Popen[bytes], ranks: set[int]) -> None:
    """torchrun starts ranks in their own sessions: stop them by pid, then torchrun."""
    import psutil

    try:
        ranks |= {c.pid for c in psutil.Process(proc.pid).children(recursive=True)}
    except psutil.NoSuchProcess:
        pass
    for pid in ranks:
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=30)
    for pid in ranks:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_three_rank_job_odd_rank_stands_out(tmp_path: Path):
    import psutil

    exe = Path(sys.executable).parent / "mldebug"
    require(exe.exists(), "the mldebug console script next to this Python (pip install -e .)")
    script = tmp_path / "job.py"
    script.write_text(JOB)
    fifo = tmp_path / "release"
    os.mkfifo(fifo)
    out = tmp_path / "traces"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    log = open(tmp_path / "torchrun.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "3",
                             "--no-python", str(exe), "trace", "--out-dir", str(out), "--",
                             str(script), str(fifo), str(ODD)],
                            cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    ranks: set[int] = set()
    try:
        report = None
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                ranks |= {c.pid for c in psutil.Process(proc.pid).children(recursive=True)}
            except psutil.NoSuchProcess:
                pass
            try:
                report = tail_traces([out])
            except UsageError:
                report = None
            if (report and len(report.files) == 3 and len(report.groups) == 2
                    and report.groups[0].ending and report.groups[1].ending
                    and report.groups[0].ending[-1].endswith("dist.barrier()")
                    and report.groups[1].ending[-1].endswith("with open(fifo) as f:  # blocks until the test writes: this rank is somewhere else")):
                break
            time.sleep(1)
        assert proc.poll() is None, (tmp_path / "torchrun.log").read_text()[-3000:]
        assert report is not None and len(report.groups) == 2, report

        r = mldebug("trace-tail", str(out), "--json", "--grep", "all_reduce")
        assert r.returncode == 1, r.stderr
        doc = json.loads(r.stdout)
        jsonschema.validate(doc, json.loads((REPO / "ml_debug/schemas/trace-tail.json").read_text()))
        res = doc["result"]
        majority, odd = res["groups"]
        assert (majority["size"], sorted(majority["ranks"]), majority["odd"]) == (2, [0, 1], False)
        assert (odd["ranks"], odd["odd"]) == ([ODD], True)
        assert any(line.startswith("--> ") and line.endswith(" stuck_here") for line in odd["ending"])
        assert any(line.endswith(" wait_for_peers") for line in majority["ending"])
        assert f"rank {ODD} " in res["summary"]
        assert all(f["grep_count"] == 3 for f in res["files"])  # the loop line, once per step
        assert {f["rank"] for f in res["files"]} == {0, 1, 2}
        assert len({f["pid"] for f in res["files"]}) == 3

        human = mldebug("trace-tail", str(out))
        assert "odd one out" in human.stdout and f"rank {ODD} (" in human.stdout

        with open(fifo, "w") as f:  # release the odd rank: the job finishes
            f.write("go")
        proc.wait(timeout=120)
        # Every rank ran the same last lines now (gloo may still abort at exit: not our concern).
        done = mldebug("trace-tail", str(out), "-n", "2", "--json")
        assert done.returncode == 0, done.stdout
    finally:
        _kill_tree(proc, ranks)
        log.close()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))

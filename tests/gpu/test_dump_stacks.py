"""`mldebug dump-stacks` on a hung NCCL job, with NCCL's own Flight Recorder pipe
(TORCH_NCCL_DEBUG_INFO_PIPE_FILE): the dump is triggered through each rank's FIFO, read back from
its pickle, and the rank that stopped issuing collectives is named. With one GPU the job has one rank
(its dump is read, nobody is behind); with two or more, rank 1 stops after 3 all_reduces while rank 0
enqueues a 4th and blocks. Marked gpu: skipped without one.

    pytest -m gpu tests/gpu/test_dump_stacks.py
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, mldebug, require
from tests.gpu.support import json_doc, need_gpus, repo_env

pytestmark = pytest.mark.gpu

WORKER = r'''
import json, os, time
from datetime import timedelta
import torch
import torch.distributed as dist


def odd_one_out():
    while True:
        time.sleep(3600)


local = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local)
dist.init_process_group("nccl", timeout=timedelta(seconds=3600), device_id=torch.device("cuda", local))
rank, n = dist.get_rank(), dist.get_world_size()
t = torch.ones(1024, device="cuda")
for _ in range(3):
    dist.all_reduce(t)
torch.cuda.synchronize()
if n > 1 and rank == 0:
    dist.all_reduce(t)  # enqueued (NCCL returns at once); it never completes without rank 1
marker = os.path.join(os.environ["FR_MARKER_DIR"], f"rank{rank}.json")
with open(marker + ".tmp", "w") as f:
    json.dump({"rank": rank, "pid": os.getpid()}, f)
os.replace(marker + ".tmp", marker)
if n == 1 or rank == 1:
    odd_one_out()
torch.cuda.synchronize()  # rank 0 of 2+: blocks on the all_reduce rank 1 never joins
'''


def _alive(pid: int) -> bool:
    try:
        return not Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z")
    except (OSError, IndexError):
        return False


def _wait(cond: object, what: str, timeout: float, job: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + timeout
    while not cond():  # type: ignore[operator]
        assert job.poll() is None, f"the NCCL job ended early (rc {job.returncode}) while waiting for {what}"
        assert time.monotonic() < deadline, f"timed out after {timeout:g} s waiting for {what}"
        time.sleep(0.2)


def test_dump_stacks_triggers_nccls_flight_recorder_pipe_and_names_the_rank_behind(tmp_path: Path) -> None:
    gpus = need_gpus(1)
    require(shutil.which("py-spy") or (Path(sys.executable).parent / "py-spy").exists(), "py-spy")
    n = 2 if gpus >= 2 else 1
    markers, pipe, trace = tmp_path / "markers", str(tmp_path / "fr_pipe_"), str(tmp_path / "fr_trace_")
    markers.mkdir()
    script = tmp_path / "nccl_fr_worker.py"
    script.write_text(WORKER)
    # Both spellings of the buffer size: torch versions read one or the other for the pipe.
    env = {**os.environ, **repo_env(), "OMP_NUM_THREADS": "1", "TORCH_FR_BUFFER_SIZE": "2000",
           "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000", "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": pipe,
           "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": trace, "TORCH_FR_DUMP_TEMP_FILE": trace,
           "TORCH_NCCL_ENABLE_MONITORING": "1", "FR_MARKER_DIR": str(markers)}
    # --standalone: torchrun binds its rendezvous on a port the OS picks
    job = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(n),
                            str(script)],
                           env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           start_new_session=True)
    ranks: dict[int, int] = {}
    try:
        def all_marked() -> bool:
            for m in markers.glob("rank*.json"):
                d = json.loads(m.read_text())
                ranks[d["rank"]] = d["pid"]
            return len(ranks) == n

        _wait(all_marked, "every rank to reach its hang point", 180, job)
        _wait(lambda: all(Path(f"{pipe}{r}.pipe").exists() for r in range(n)),
              f"torch to create the Flight Recorder FIFOs {pipe}<rank>.pipe (TORCH_NCCL_DEBUG_INFO_PIPE_FILE)",
              60, job)

        proc = mldebug("dump-stacks", "--local", "--pid", str(job.pid), "--json", "--fr-timeout", "30",
                       timeout=240, env=repo_env())
        doc = json_doc(proc.stdout, proc.stderr, "dump-stacks")
        result = doc["result"]
        fr = result["flight_recorder"]
        assert fr is not None, (result["summary"], proc.stderr[-3000:])
        by_rank = {r["rank"]: r for r in fr["ranks"]}
        assert sorted(by_rank) == list(range(n)), fr
        for r, rec in by_rank.items():
            assert rec["source"] == "nccl" and rec["ok"], rec
            assert rec["pid"] == ranks[r] and rec["file"] == f"{trace}{r}", rec
        pg0 = {r: by_rank[r]["process_groups"][0] for r in range(n)}
        if n == 1:
            assert pg0[0]["last_enqueued_seq"] == 3 and pg0[0]["last_enqueued"]["op"] == "nccl:all_reduce", pg0
            assert fr["behind"] == [] and "1 rank(s) dumped, none behind" in fr["evidence"], fr
        else:
            # rank 0 enqueued the 4th all_reduce (it cannot complete); rank 1 stopped after 3
            assert pg0[0]["last_enqueued_seq"] == 4 and pg0[0]["last_enqueued"]["op"] == "nccl:all_reduce", pg0
            assert pg0[1]["last_enqueued_seq"] == 3 and (pg0[1]["last_completed_seq"] or 0) <= 3, pg0
            assert [(b["rank"], b["kind"]) for b in fr["behind"]] == [(1, "enqueued")], fr["behind"]
            assert "flight recorder: rank 1 (pg 0) last enqueued #3" in result["summary"], result["summary"]
        odd = n - 1
        main = [t for t in [p for p in result["processes"] if p["rank"] == odd][0]["samples"][0]["threads"]
                if t["is_main"]][0]
        assert main["frames"][0]["name"] == "odd_one_out", main["frames"][:3]
        assert all(_alive(p) for p in ranks.values())  # dumping left the job running
    finally:
        # torchrun's workers live in their own session: kill them by pid, then torchrun
        import psutil

        try:
            kids = [c.pid for c in psutil.Process(job.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            kids = []
        for pid in {*ranks.values(), *kids}:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        job.kill()
        job.wait(timeout=30)
        deadline = time.monotonic() + 30
        while any(_alive(p) for p in {*ranks.values(), *kids}) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(_alive(p) for p in {*ranks.values(), *kids}), "a rank survived"

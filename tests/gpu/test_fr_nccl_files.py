"""Real NCCL Flight Recorder files, read back the way the post-mortem path reads what a dead job left.

One process on one GPU runs an NCCL process group (world 1; NCCL refuses two ranks on one GPU) and a
sub-group, issues collectives of several kinds, then one all_reduce queued behind a long spin kernel
(so it is still `scheduled` when dumped), and dumps its Flight Recorder with PyTorch's NCCL trace dump
(`_dump_nccl_trace`: the pickle that TORCH_NCCL_DUMP_ON_TIMEOUT writes to TORCH_FR_DUMP_TEMP_FILE<rank>).
The file is read with mldebug's restricted unpickler and summarised: fields, process groups, sequence
numbers and states as NCCL writes them. With MLDEBUG_GPU_KEEP set (benchmarks/gpu_session.sh), the dump
is copied there, so CPU tests can read a real NCCL dump too (tests/data/flight_recorder/nccl/).

    pytest -m gpu tests/gpu/test_fr_nccl_files.py
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ml_debug.stacks.flight import parse_dump, summarise_dump
from ml_debug.stacks.fr_analysis import compact
from tests.gpu.support import need_gpus, repo_env

pytestmark = pytest.mark.gpu

WORKER = r'''
import os, socket, sys, time
from datetime import timedelta
import torch
import torch.distributed as dist

out = sys.argv[1]
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
torch.cuda.set_device(0)
dist.init_process_group("nccl", timeout=timedelta(seconds=120), device_id=torch.device("cuda", 0))
sub = dist.new_group([0])
t = torch.ones(1 << 20, device="cuda")
for _ in range(3):
    dist.all_reduce(t)
dist.broadcast(t, 0)
dist.all_gather_into_tensor(torch.empty(1 << 20, device="cuda"), t)
dist.reduce_scatter_tensor(torch.empty(1 << 20, device="cuda"), t)
dist.all_reduce(t, group=sub)
torch.cuda.synchronize()
time.sleep(1.5)  # NCCL's watchdog marks the finished collectives completed on its next round
torch.cuda._sleep(int(2.5e9 * 3))  # about 3 s of spinning on the compute stream
dist.all_reduce(t)  # waits for the spin kernel on NCCL's stream: still queued when dumped
data = torch._C._distributed_c10d._dump_nccl_trace(True, False, False)
with open(os.path.join(out, "nccl_trace_rank_0"), "wb") as f:
    f.write(data)
torch.cuda.synchronize()
dist.destroy_process_group()
'''


def test_a_real_nccl_dump_is_read_with_its_groups_sequence_numbers_and_states(tmp_path: Path) -> None:
    need_gpus(1)
    script = tmp_path / "nccl_fr_dump.py"
    script.write_text(WORKER)
    env = {**os.environ, **repo_env(), "TORCH_FR_BUFFER_SIZE": "2000", "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000"}
    proc = subprocess.run([sys.executable, str(script), str(tmp_path)], env=env, capture_output=True, text=True,
                          timeout=180)
    assert proc.returncode == 0, proc.stderr[-4000:]
    dump_file = tmp_path / "nccl_trace_rank_0"
    keep = os.environ.get("MLDEBUG_GPU_KEEP")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(dump_file, Path(keep) / "nccl_trace_rank_0")

    dump = parse_dump(dump_file.read_bytes())
    assert {"version", "pg_config", "pg_status", "entries"} <= set(dump), sorted(dump)
    entries = dump["entries"]
    names = [e["profiling_name"] for e in entries]
    assert names.count("nccl:all_reduce") >= 5 and "nccl:broadcast" in names, names
    assert len(set(names)) >= 4, names  # all_reduce, broadcast, the all_gather and the reduce_scatter
    for e in entries:
        assert {"record_id", "pg_id", "collective_seq_id", "profiling_name", "state", "input_sizes",
                "time_created_ns"} <= set(e), sorted(e)
    default = [e for e in entries if str(e["pg_id"]) == "0"]
    seqs = [e["collective_seq_id"] for e in default]
    assert seqs == sorted(seqs) and seqs[-1] == len(default), seqs
    assert default[-1]["state"] in ("scheduled", "started"), default[-1]  # queued behind the spin kernel
    assert all(e["state"] == "completed" for e in default[:-1]), [e["state"] for e in default]
    assert len(dump["pg_status"]) >= 2, dump["pg_status"]  # the default group and the sub-group

    pgs = {p["pg_id"]: p for p in summarise_dump(dump)}
    assert pgs["0"]["last_enqueued_seq"] == seqs[-1] and pgs["0"]["last_completed_seq"] == seqs[-1] - 1, pgs["0"]
    assert pgs["0"]["last_enqueued"]["op"] == "nccl:all_reduce", pgs["0"]
    groups = compact(dump)
    assert {g["pg_id"] for g in groups} >= {"0"}, groups

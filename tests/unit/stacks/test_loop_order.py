"""Loop order (dump-stacks --locals): the rank an iteration behind, named from the loop counters of the
frame every rank shares, pure and on a real 4-rank gloo job."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from ml_debug.stacks.loop_order import RankFrames, loop_order
from ml_debug.stacks.result import Frame
from tests.conftest import REPO, kill_pids, mldebug, pids_with_env, require, wait_until

WORKER = r'''
import json, os, time
from datetime import timedelta
import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=timedelta(seconds=600))
rank = dist.get_rank()
t = torch.ones(4)


def marker(step):
    path = os.path.join(os.environ["LOOP_MARKERS"], f"rank{rank}.json")
    with open(path + ".tmp", "w") as f:
        json.dump({"rank": rank, "pid": os.getpid(), "step": step}, f)
    os.replace(path + ".tmp", path)


def load_next_batch(step):
    marker(step)
    while True:  # the data never comes: this rank stays in iteration 41
        time.sleep(3600)


def train():
    for step in range(1000):
        if step == 42:
            marker(step)
        dist.all_reduce(t)  # iteration 42's: the others wait here for rank 2
        if rank == 2 and step == 41:
            load_next_batch(step)


train()
'''


def _frames(*stack: tuple[str, int, dict[str, str]]) -> list[Frame]:
    return [Frame(name, "/job/train.py", line, locals=loc) for name, line, loc in stack]


def test_the_rank_with_the_smallest_counter_in_the_shared_loop_is_named() -> None:
    ahead = [RankFrames(r, _frames(("<module>", 50, {}), ("train", 40, {"step": "42", "rank": str(r)}),
                                   ("all_reduce", 9, {"tensor": "tensor([1.])"}))) for r in (0, 1, 3)]
    behind = RankFrames(2, _frames(("<module>", 50, {}), ("train", 43, {"step": "41", "rank": "2"}),
                                   ("load_next_batch", 20, {"step": "41"})))
    order = loop_order([*ahead, behind])
    assert order is not None
    assert order.text == "rank 2 at step=41, ranks 0-1,3 at step=42 in train (train.py)"
    assert (order.behind, order.ahead, order.variable) == ([2], [0, 1, 3], "step")
    # the rank's own identity is never compared; counters that agree, or a split with no majority, say nothing
    assert loop_order(ahead) is None
    tie = [RankFrames(r, _frames(("train", 40, {"i": str(r % 2)}))) for r in range(4)]
    assert loop_order(tie) is None
    assert loop_order([RankFrames(0, _frames(("train", 40, {"i": "3"})))]) is None
    # a rank ahead of the others is not "behind"
    lead = [RankFrames(r, _frames(("train", 40, {"i": "5"}))) for r in range(3)] + \
        [RankFrames(3, _frames(("train", 40, {"i": "6"})))]
    assert loop_order(lead) is None


def test_a_4_rank_gloo_job_with_one_rank_an_iteration_behind(tmp_path: Path) -> None:
    require(subprocess.run(["which", "py-spy"], capture_output=True).returncode == 0
            or (Path(sys.executable).parent / "py-spy").exists(), "py-spy")
    markers = tmp_path / "markers"
    markers.mkdir()
    script = tmp_path / "train_loop.py"
    script.write_text(WORKER)
    token = tmp_path.name  # torchrun starts each rank in a session of its own: they are found by this mark
    env = {**os.environ, "OMP_NUM_THREADS": "1", "LOOP_MARKERS": str(markers), "PYTHONPATH": str(REPO),
           "MLDEBUG_LOOP_ORDER_TEST": token}
    job = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4",
                            str(script)], env=env, cwd=tmp_path, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_until(lambda: len(list(markers.glob("rank*.json"))) == 4 or job.poll() is not None, 180,
                   "the four ranks to reach their hang points")
        assert job.poll() is None, "the job ended early"
        proc = mldebug("dump-stacks", "--pid", str(job.pid), "--locals", "--json", "--no-kernel", timeout=180)
        result = json.loads(proc.stdout)["result"]
        order = result["loop_order"]
        assert order is not None, result["summary"]
        assert (order["behind"], order["behind_value"], order["ahead"], order["ahead_value"]) == ([2], 41, [0, 1, 3], 42)
        assert order["variable"] == "step" and order["function"] == "train (train_loop.py)", order
        assert result["summary"].endswith("; loop order: rank 2 at step=41, ranks 0-1,3 at step=42 in train "
                                          "(train_loop.py)"), result["summary"]
    finally:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait(timeout=30)
        kill_pids(pids_with_env("MLDEBUG_LOOP_ORDER_TEST", token))  # rank 2 sleeps outside any collective
        wait_until(lambda: not pids_with_env("MLDEBUG_LOOP_ORDER_TEST", token), 30, "no rank left")

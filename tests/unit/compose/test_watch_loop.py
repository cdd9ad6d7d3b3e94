"""compose/watch_loop directly: this node's source samples a real process picked by --pid into a typed
node sample, a real dump-stacks result becomes the stack observations the tracker reads, and the
bundle is named after the job."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from ml_debug.compose.watch_loop import LocalSource, _job_name, stack_observations
from ml_debug.remote.targets import Target, TargetSpec
from ml_debug.sampling.sample import NodeSample
from ml_debug.watch.options import WatchOptions
from ml_debug.watch.verdict import Tracker
from tests.conftest import mldebug, py_spy, require, wait_in_function

SPIN = "import time\ndef spin_here():\n    while True:\n        time.sleep(0.01)\nspin_here()\n"


def test_the_local_source_samples_the_process_pid_names(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", SPIN])
    source = None
    try:
        opts = WatchOptions(pids=[proc.pid], interval=0.5, progress_files=[str(tmp_path / "rank-{rank}.jsonl")])
        spec = TargetSpec(kind="local", targets=[Target("localhost")])
        source = LocalSource(opts, spec)
        ((label, sample, received, error),) = source.poll()
        assert label == "localhost" and error is None and received is not None
        assert isinstance(sample, NodeSample) and [r.pid for r in sample.ranks] == [proc.pid]
        assert "spin_here" in sample.ranks[0].cmdline and sample.ranks[0].state in ("S", "R")
        tracker = Tracker(stall=10.0, grace=0.0, straggler_factor=2.0, interval=0.5, node_timeout=5.0,
                          started=received)
        tracker.add_node(label, sample, received, error)
        assert list(tracker.ranks) == [f"localhost:{proc.pid}"]
    finally:
        proc.kill()
        proc.wait()
        if source is not None:
            source.close()


def test_a_real_dump_stacks_result_becomes_one_observation_per_rank() -> None:
    require(py_spy(), "py-spy (pip install py-spy)")
    proc = subprocess.Popen([sys.executable, "-c", SPIN])
    try:
        wait_in_function(proc.pid, {"spin_here"}, innermost=False)
        got = mldebug("dump-stacks", "--pid", str(proc.pid), "--json", "--no-flight-recorder", timeout=120)
        assert got.returncode in (0, 1), got.stderr
        obs = stack_observations(json.loads(got.stdout)["result"])
    finally:
        proc.kill()
        proc.wait()
    ((o,),) = [obs]
    assert o["pid"] == proc.pid and o["in_collective"] is False and o["collective"] is None
    assert "spin_here" in o["key"] and o["host"]


def test_the_bundle_is_named_after_the_job() -> None:
    local = TargetSpec(kind="local", targets=[Target("n1")])
    assert _job_name(TargetSpec(kind="slurm", targets=[Target("n1")], slurm_job="77"), WatchOptions()) == "slurm77"
    assert _job_name(local, WatchOptions(pids=[4242, 5])) == "pid4242"
    assert _job_name(local, WatchOptions()) == "n1"

"""Flight Recorder dump files as a source of `mldebug logs`: real dumps of real gloo jobs (torchrun, three
ranks), written the way NCCL's dump on timeout writes them (tests/jobs/fr_dump_worker.py): one job where
rank 1 issues a broadcast while the others issue all_reduce #6, one where rank 1 never issues all_reduce #6.
The rank and the collective are named from the files alone, found by name, by --fr-prefix and by content;
the library call the GPU test uses on NCCL's own dumps reads the same directories."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from ml_debug.postmortem.frdumps import analyse_dump_dir
from tests.conftest import REPO, mldebug, validate_schema

WORKER = REPO / "tests" / "jobs" / "fr_dump_worker.py"
FAULTS = ("desync", "missing")


@pytest.fixture(scope="module")
def dumps(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Both jobs at once (each --standalone on its own port); each rank's dump in <fault>/nccl_trace_rank_<R>."""
    base = tmp_path_factory.mktemp("frdumps")
    procs = {}
    for fault in FAULTS:
        (base / fault).mkdir()
        env = {**os.environ, "OMP_NUM_THREADS": "1", "TORCH_FR_BUFFER_SIZE": "2000", "FR_FAULT": fault, "FR_ODD": "1",
               "FR_DUMP_PREFIX": str(base / fault / "nccl_trace_rank_")}
        procs[fault] = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone",
                                         "--nproc-per-node", "3", str(WORKER)], env=env, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True)
    for fault, p in procs.items():
        out, _ = p.communicate(timeout=180)
        assert p.returncode == 0, out[-3000:]
        assert sorted(f.name for f in (base / fault).iterdir()) == [f"nccl_trace_rank_{r}" for r in range(3)], out
    return {fault: base / fault for fault in FAULTS}


def _logs(*args: str) -> tuple[subprocess.CompletedProcess[str], dict]:
    proc = mldebug("logs", "--json", *args, timeout=120)
    doc = json.loads(proc.stdout)
    validate_schema(doc, "logs")
    return proc, doc["result"]


def test_a_desync_is_named_with_its_rank_and_collective_from_the_files_alone(dumps: dict[str, Path]) -> None:
    proc, result = _logs(str(dumps["desync"]))
    assert proc.returncode == 1, proc.stderr
    v = result["postmortem"]["verdict"]
    assert (v["rank"], v["cause"], v["named_by"]) == (1, "desync", "flight-recorder")
    assert "desync in collective #6 of pg 0 (default_pg): rank 1 issued gloo:broadcast [[16]] Float while " \
           "ranks 0,2 issued gloo:all_reduce [[16]] Float (op mismatch)" in v["summary"]
    fr = result["postmortem"]["flight_recorder"]
    assert len(fr["files"]) == 3 and fr["missing_dumps"] == []
    assert result["postmortem"]["logs_error"]  # no log file: the dumps alone


def test_a_rank_that_never_issued_the_last_collective_is_named(dumps: dict[str, Path]) -> None:
    proc, result = _logs(str(dumps["missing"]))
    assert proc.returncode == 1, proc.stderr
    v = result["postmortem"]["verdict"]
    assert (v["rank"], v["cause"]) == (1, "not-enqueued")
    assert "rank 1 never issued collective #6 of pg 0 (default_pg) (gloo:all_reduce [[16]] Float), which " \
           "ranks 0,2 issued" in v["summary"]
    text = mldebug("logs", str(dumps["missing"]), timeout=120)
    assert text.returncode == 1 and "rank 1: flight-recorder: rank 1 never issued collective #6" in text.stdout


def test_dumps_found_by_prefix_and_by_content_and_a_missing_dump(dumps: dict[str, Path], tmp_path: Path) -> None:
    renamed = tmp_path / "renamed"
    renamed.mkdir()
    for r in range(3):
        shutil.copy(dumps["desync"] / f"nccl_trace_rank_{r}", renamed / f"trace_{r}")
        shutil.copy(dumps["missing"] / f"nccl_trace_rank_{r}", tmp_path / f"dump.{r}")
    proc, result = _logs(str(renamed), "--fr-prefix", str(renamed / "trace_"))
    assert proc.returncode == 1 and result["postmortem"]["verdict"]["cause"] == "desync", proc.stderr
    # named one by one, found by what they hold (the rank from the last digits of the name)
    proc, result = _logs(*(str(tmp_path / f"dump.{r}") for r in range(3)))
    assert proc.returncode == 1 and result["postmortem"]["verdict"]["cause"] == "not-enqueued", proc.stderr
    # a rank whose dump is missing is said (the job's size comes from the dumps' process group)
    (renamed / "trace_2").unlink()
    proc, result = _logs(str(renamed), "--fr-prefix", str(renamed / "trace_"))
    assert result["postmortem"]["flight_recorder"]["missing_dumps"] == [2]
    assert "no dump from rank(s) 2" in result["postmortem"]["flight_recorder"]["evidence"]


def test_dumps_inside_an_archive_are_read_and_the_logs_beside_them(dumps: dict[str, Path], tmp_path: Path) -> None:
    """As users attach them to a bug report: the dumps of a job with a console of its own in one .tar.gz, the other
    job's in a .zip. Shown as ARCHIVE/MEMBER; nothing is left in the temporary directory."""
    console = REPO / "tests" / "data" / "logs_corpus" / "mpirun.log"
    with tarfile.open(tmp_path / "job.tgz", "w:gz") as tar:
        tar.add(dumps["desync"], arcname="desync")
        tar.add(console, arcname="desync/console.log")
    with zipfile.ZipFile(tmp_path / "dumps.zip", "w") as z:
        for r in range(3):
            z.write(dumps["missing"] / f"nccl_trace_rank_{r}", f"nccl_trace_rank_{r}")
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    proc = mldebug("logs", "--json", str(tmp_path / "job.tgz"), env={"TMPDIR": str(scratch)}, timeout=120)
    result = json.loads(proc.stdout)["result"]
    fr = result["postmortem"]["flight_recorder"]
    assert fr["files"] == [f"{tmp_path}/job.tgz/desync/nccl_trace_rank_{r}" for r in range(3)], fr["files"]
    assert "desync in collective #6 of pg 0 (default_pg): rank 1 issued gloo:broadcast" in fr["evidence"]
    assert [s["path"] for s in result["sources"]] == [f"{tmp_path}/job.tgz/desync/console.log"]  # the logs too
    assert proc.returncode == 1 and list(scratch.iterdir()) == [], proc.stderr
    proc, result = _logs(str(tmp_path / "dumps.zip"))
    v = result["postmortem"]["verdict"]
    assert proc.returncode == 1 and (v["rank"], v["cause"], v["named_by"]) == (1, "not-enqueued", "flight-recorder")
    assert result["postmortem"]["files_read"] == [f"{tmp_path}/dumps.zip/nccl_trace_rank_{r}" for r in range(3)]


def test_the_library_call_reads_a_directory_of_dumps(dumps: dict[str, Path]) -> None:
    got = analyse_dump_dir(dumps["desync"])
    assert [c["rank"] for c in got["analysis"]["culprits"]] == [1]
    assert got["analysis"]["findings"][0].startswith("desync in collective #6 of pg 0")
    got = analyse_dump_dir(dumps["missing"])
    assert [(c["rank"], c["why"]) for c in got["analysis"]["culprits"]] == [(1, "not-enqueued")]
    assert got["behind"][0]["rank"] == 1 and got["unreadable"] == []


def test_without_slurm_tools_the_environment_is_said(tmp_path: Path) -> None:
    (tmp_path / "bin").mkdir()
    proc = mldebug("logs", "--slurm-job", "12345", env={"PATH": str(tmp_path / "bin")}, timeout=60)
    assert proc.returncode == 3, proc.stderr
    assert "neither scontrol nor sacct answered" in proc.stderr and "hint: run on a login node" in proc.stderr
    proc = mldebug("logs", "--slurm-job", "12;rm", timeout=60)
    assert proc.returncode == 2 and "is not a Slurm job id" in proc.stderr

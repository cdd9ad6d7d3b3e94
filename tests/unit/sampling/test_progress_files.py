"""`--progress-file` patterns that name nothing, or something that cannot be read, and misspelt
placeholders: said once per pattern, never silently dropped (a user audit found all three left no
trace in the text view, an empty STEP column and exit 0 "nothing stands out")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ml_debug.core.errors import UsageError
from ml_debug.sampling.options import parse_pattern
from ml_debug.sampling.progress import FileSource, ProgressReader
from ml_debug.top.render import outlier_lines
from tests.conftest import mldebug, validate_schema


def test_a_placeholder_other_than_rank_and_local_rank_is_refused_naming_the_valid_ones() -> None:
    assert parse_pattern("run/rank-{rank}-{local_rank}/*.jsonl") == "run/rank-{rank}-{local_rank}/*.jsonl"
    for word, bad in (("/tmp/run/rank-{rnk}.jsonl", "{rnk}"), ("log.{a,b}", "{a,b}"), ("x{}", "{}")):
        with pytest.raises(UsageError) as e:
            parse_pattern(word)
        assert e.value.message == f"--progress-file {word!r}: {bad} is not a placeholder"
        assert "{rank}" in (e.value.hint or "") and "{local_rank}" in (e.value.hint or "")


@pytest.mark.parametrize("command", ["top", "watch"])
def test_a_misspelt_placeholder_is_exit_2_before_anything_starts(command: str) -> None:
    proc = mldebug(command, "--local", "--progress-file", "/tmp/run/rank-{rnk}.jsonl", timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("mldebug: error: --progress-file '/tmp/run/rank-{rnk}.jsonl': {rnk} is not "
                                  "a placeholder\nhint: the placeholders are {rank}")
    assert proc.stdout == ""


def test_a_file_not_there_is_reported_from_the_glob_that_looked_for_it(tmp_path: Path) -> None:
    present = tmp_path / "rank-3.jsonl"
    present.write_text('{"step": 1}\n')
    ranks = str(tmp_path / "rank-{rank}.jsonl")
    reader = ProgressReader([ranks, str(tmp_path / "none-*.log")])
    found, missing = reader.paths_for([(3, 1), (4, 0)])
    assert found == {str(present): FileSource(ranks, 3)}
    assert missing == {str(tmp_path / "rank-4.jsonl"): FileSource(ranks, 4),
                       str(tmp_path / "none-*.log"): FileSource(str(tmp_path / "none-*.log"), None)}


def test_missing_and_unreadable_files_are_one_note_per_pattern_and_in_the_json(tmp_path: Path) -> None:
    """A real rank (RANK=5) without its file, a pattern that names nothing, a directory: the JSON
    holds each with its error, the rank's row keeps no progress, the text says each pattern once."""
    marker = f"top-progress-{tmp_path.name}"
    (tmp_path / "dir").mkdir()
    nowhere, per_rank, directory = str(tmp_path / "nonexist" / "x"), str(tmp_path / "rank-{rank}.jsonl"), \
        str(tmp_path / "dir")
    env = {**os.environ, "RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1"}
    rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", marker], env=env)
    try:
        proc = mldebug("top", "--local", "--once", "--json", "--rank-rows", "--pattern", marker,
                       "--progress-file", nowhere, "--progress-file", per_rank, "--progress-file", directory,
                       timeout=120)
    finally:
        rank.kill()
        rank.wait()
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    validate_schema(doc, "top")
    (node,) = doc["result"]["nodes"]
    assert [(r["rank"], r["progress"]) for r in node["ranks"]] == [(5, None)]
    files = {f["path"]: f for f in node["progress"]}
    assert {p: (f["pattern"], f["rank"], f["error"], f["rate"]) for p, f in files.items()} == {
        nowhere: (nowhere, None, "not found", None),
        str(tmp_path / "rank-5.jsonl"): (per_rank, 5, "not found", None),
        directory: (directory, None, f"{directory} is a directory, not a regular file: not opened", None)}
    assert outlier_lines(doc["result"]) == [
        f"~ progress file {directory}: {directory} is a directory, not a regular file: not opened",
        f"~ progress file {nowhere}: not found",
        f"~ progress file {per_rank}: not found (rank 5)"]


def test_a_pattern_wrong_for_every_rank_is_one_line_naming_them() -> None:
    def fifo(r: int) -> dict:
        path = f"/run/rank-{r}.jsonl"
        return {"path": path, "pattern": "/run/rank-{rank}.jsonl", "error": f"{path} is a FIFO, not a regular file"}

    def node(target: str, ranks: list[int]) -> dict:
        return {"target": target, "status": "ok", "note": None, "notes": [], "progress": [],
                "ranks": [{"rank": r, "progress": fifo(r)} for r in ranks]}

    result = {"outliers": [], "nodes": [node("n1", [0, 1]), node("n2", [2, 3])]}
    assert outlier_lines(result) == [
        "~ progress file /run/rank-{rank}.jsonl: /run/rank-0.jsonl is a FIFO, not a regular file (ranks 0-3)"]
    result["nodes"][1]["ranks"] = []
    result["nodes"][1]["progress"] = [{"path": "/x", "pattern": "/x", "rank": None, "error": "not found"}]
    assert outlier_lines(result)[1:] == ["~ progress file /x: not found (on n2)"]

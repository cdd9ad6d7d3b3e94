"""The node sample (ml_debug.sampling.sample): the golden file pins its wire format, a real sample of this
node has exactly the golden's fields and passes the schema, and another wire version is refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from ml_debug.sampling.options import SamplerOptions
from ml_debug.sampling.sample import SAMPLE_SCHEMA, SAMPLE_VERSION, NodeSample, SampleError
from ml_debug.sampling.sampler import NodeSampler
from tests.conftest import REPO, validate_schema, wait_until

GOLDEN = REPO / "tests" / "golden" / "top-sample.json"


def _golden() -> dict[str, Any]:
    return json.loads(GOLDEN.read_text())


def test_the_golden_sample_passes_the_schema_and_reads_back_to_the_same_line() -> None:
    golden = _golden()
    validate_schema(golden, "top-sample")
    sample = NodeSample.from_json(golden)
    assert (sample.node.host, [g.index for g in sample.gpus], [r.rank for r in sample.ranks]) == ("node1", [0, 1], [0, 1])
    assert sample.ranks[0].progress is not None and sample.ranks[0].progress.step == 1200
    assert sample.progress_missing[0].error == "not found" and sample.progress_missing[0].rank == 1
    # the same fields, the same values, in the same order: what an older client reads stays where it was
    assert json.dumps(sample.to_json()) == json.dumps(golden)


def _keys(doc: dict[str, Any]) -> dict[str, list[str]]:
    """The field names at every level of a sample (the first item of each list)."""
    rank = doc["ranks"][0]
    return {"top": list(doc), "node": list(doc["node"]), "nvml": [k for k in doc["nvml"] if k != "xid_reason"],
            "gpu": list(doc["gpus"][0]) if doc["gpus"] else [], "rank": list(rank),
            "rank.progress": list(rank["progress"]), "progress_missing": list(doc["progress_missing"][0])}


def test_a_real_sample_of_this_node_has_the_golden_fields_and_passes_the_schema(tmp_path: Path) -> None:
    marker = f"mldebug-sample-test-{uuid.uuid4().hex[:8]}"
    (tmp_path / "rank-0.jsonl").write_text('{"step": 5}\n')
    env = {**os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"}
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", marker], env=env)
    sampler = None
    try:
        opts = SamplerOptions(interval=0.5, pattern=marker,
                              progress_files=[str(tmp_path / "rank-{rank}.jsonl"), str(tmp_path / "none-*.log")])
        sampler = wait_until(lambda: (s := NodeSampler(opts)).processes and s, 30, "the process to be found")
        sample = sampler.sample(tick=7)
    finally:
        proc.kill()
        proc.wait()
        if sampler is not None:
            sampler.close()
    doc = sample.to_json()
    validate_schema(doc, "top-sample")
    golden = _golden()
    mine, pinned = _keys(doc), _keys(golden)
    if not doc["gpus"]:
        del pinned["gpu"]
        del mine["gpu"]
    assert mine == pinned
    (rank,) = sample.ranks
    assert (rank.pid, rank.rank, rank.world_size) == (proc.pid, 0, 1)
    assert rank.progress is not None and rank.progress.step == 5
    assert [f.pattern for f in sample.progress_missing] == [str(tmp_path / "none-*.log")]
    # what the client reads is what the agent sent
    assert NodeSample.from_json(json.loads(json.dumps(doc))) == sample


def test_a_sample_of_another_wire_version_is_refused_with_both_versions_named() -> None:
    line = {**_golden(), "v": SAMPLE_VERSION + 1, "mldebug_version": "9.9.9", "new_field": {"x": 1}}
    with pytest.raises(SampleError) as e:
        NodeSample.from_json(line)
    assert f"sample format {SAMPLE_VERSION + 1} from mldebug 9.9.9" in str(e.value)
    assert "install the same version on every node" in str(e.value)
    with pytest.raises(SampleError, match="not a node sample"):
        NodeSample.from_json({**_golden(), "schema": "mldebug.top"})
    broken = _golden()
    broken["ranks"][0]["pid"] = "4101"
    with pytest.raises(SampleError, match=r"pid is '4101', not a whole number \(mldebug 0\.1\.0 there"):
        NodeSample.from_json(broken)
    assert SAMPLE_SCHEMA == _golden()["schema"]


def test_the_client_keeps_a_good_line_and_notes_one_of_another_format() -> None:
    from ml_debug.remote.targets import Target, TargetSpec
    from ml_debug.sampling.streams import Client

    client = Client(TargetSpec(kind="local", targets=[Target("here")]), SamplerOptions())
    try:
        (feed,) = client.feeds
        good = _golden()
        feed.buf += b"a login banner\n" + json.dumps(good).encode() + b"\n"
        client._lines(feed)
        assert feed.sample is not None and feed.sample.node.host == "node1" and feed.samples == 1
        newer = {**good, "v": 2, "mldebug_version": "9.9.9", "seq": 43}
        feed.buf += json.dumps(newer).encode() + b"\n"
        client._lines(feed)
        assert feed.sample.seq == 42 and feed.samples == 1  # the other format is not drawn
        assert feed.note is not None and feed.note.startswith(
            "here sent a sample this mldebug cannot read: sample format 2 from mldebug 9.9.9")
    finally:
        client.close()

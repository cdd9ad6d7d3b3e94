"""What `mldebug drill` found wrong in `mldebug logs`, on real logs:

- when every rank raises the same error about one rank (a check all ranks agree on, such as `mldebug
  train`'s non-finite loss), the rank the error is about is the first failure;
- a rank that left without a word is named even when none of its lines holds a failure: the world size
  comes from the `mldebug launch` manifests, not from the highest rank seen in a failure.
"""

from __future__ import annotations

from ml_debug.logs.triage import triage
from tests.conftest import REPO

LOG = REPO / "tests" / "data" / "logs" / "nan_every_rank_names_rank1.log"


def test_the_rank_named_by_every_rank_is_the_first_failure() -> None:
    report = triage([str(LOG)])
    v = report.verdict
    assert v.primary is not None and v.primary.who.rank == 1, v.summary
    assert v.summary.startswith("first failure: rank 1 (") and v.summary.endswith("(rank 0 reported the same)")
    assert v.basis == "every rank reported the same failure, about rank 1"
    assert v.independent == []  # rank 0 did not fail "on its own"


def test_the_rank_named_by_every_rank_is_first_whichever_copy_comes_first(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The drill's ranks race: rank 1's own copy may be the one torchrun saw first (its "Root Cause"). The others'
    copies, in the same second, are the same finding, not a tie (found by a CI run of the drills)."""
    text = LOG.read_text()
    assert text.index("rank      : 1 (local_rank: 1)") < text.index("Root Cause") < text.index("rank      : 0 (")
    swapped = (text.replace("rank      : 1 (local_rank: 1)", "RANK-A").replace("rank      : 0 (local_rank: 0)", "rank"
               "      : 1 (local_rank: 1)").replace("RANK-A", "rank      : 0 (local_rank: 0)"))
    log = tmp_path / "swapped.log"
    log.write_text(swapped)
    v = triage([str(log)]).verdict
    assert v.primary is not None and v.primary.who.rank == 1 and v.tie is None, v.summary
    assert v.summary.startswith("first failure: rank 1 (") and v.summary.endswith("(rank 0 reported the same)"), v.summary


def test_a_message_about_a_rank_that_did_not_fail_keeps_the_earliest(tmp_path) -> None:  # type: ignore[no-untyped-def]
    log = tmp_path / "about-7.log"
    log.write_text(LOG.read_text().replace("non-finite loss on rank 1", "non-finite loss on rank 7"))
    v = triage([str(log)]).verdict
    assert v.primary is not None and v.primary.who.rank == 0, v.summary  # rank 7 is not in the job
    assert "reported the same" not in v.summary


SILENT = REPO / "tests" / "data" / "logs" / "launch_rank3_exits_silently"


def test_the_last_rank_leaving_silently_is_named_from_the_launch_manifests() -> None:
    report = triage([str(SILENT)])
    assert report.world_size == 4  # 2 nodes x 2 ranks, from launch.json
    v = report.verdict
    assert v.status == "secondary-only" and v.silent_ranks == "3", v.summary
    # ... and the others lost their connection to its node's address
    assert v.summary.endswith("; rank 3 left no failure in the logs; they lost their connection to 10.213.7.12")
    assert v.peers_lost == "10.213.7.12" and not v.findings, v.findings


STOPPED = REPO / "tests" / "data" / "logs" / "launch_nan_rank1_stopped_first"


def test_a_failure_about_a_rank_the_launcher_stopped_first_is_put_on_that_rank() -> None:
    # rank 0 raised "non-finite loss on rank 1" and torchrun stopped rank 1 before it raised its own copy
    v = triage([str(STOPPED)]).verdict
    assert v.primary is not None and v.primary.who.rank == 1 and v.primary.who.node == "vm", v.summary
    assert v.summary.startswith("first failure: rank 1 (vm), reported at ") and v.summary.endswith("(rank 0 reported the same)")
    assert v.basis == "rank 0's error is about rank 1, which was stopped before it wrote its own"
    assert v.secondary == []  # rank 1's SIGTERM from the launcher is no news

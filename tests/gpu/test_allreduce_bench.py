"""`mldebug allreduce-bench` over NCCL on real GPUs: one rank per visible GPU, CUDA-event timing,
nccl-tests' table shape (on 1 GPU all_reduce's bus factor 2(n-1)/n is 0, so busbw is 0 and only
algbw and time mean anything, exactly as nccl-tests prints it), every collective verified.
Marked gpu: skipped without one.

    pytest -m gpu tests/gpu/test_allreduce_bench.py
"""

from __future__ import annotations

import pytest

from tests.conftest import mldebug
from tests.gpu.support import json_doc, need_gpus, repo_env

pytestmark = pytest.mark.gpu

# nccl-tests' busbw / algbw per collective on n ranks
FACTORS = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
           "reduce_scatter": lambda n: (n - 1) / n, "all_to_all": lambda n: (n - 1) / n,
           "broadcast": lambda n: 1.0, "reduce": lambda n: 1.0, "sendrecv": lambda n: 1.0}


def _bench(*args: str) -> tuple[dict, int, str]:
    proc = mldebug("allreduce-bench", "--json", *args, timeout=420, env=repo_env())
    return json_doc(proc.stdout, proc.stderr, "allreduce-bench")["result"], proc.returncode, proc.stderr


def test_all_reduce_sweep_on_nccl_has_nccl_tests_shape_and_no_wrong_element() -> None:
    n = need_gpus(1)
    result, rc, err = _bench("--min-bytes", "1M", "--max-bytes", "256M", "--iters", "10", "--warmup", "3")
    assert rc == 0 and result["ok"], (result["summary"], err[-3000:])
    assert (result["backend"], result["device"], result["world_size"]) == ("nccl", "cuda", n)
    assert all(r["device"].startswith("cuda:") for r in result["ranks"])
    (coll,) = result["collectives"]
    sizes = coll["sizes"]
    assert [s["size"] for s in sizes] == [2**k for k in range(20, 29)]
    assert coll["bus_factor"] == FACTORS["all_reduce"](n)
    for s in sizes:
        assert s["wrong"] == 0 and s["time_us"] > 0, s
        assert s["algbw"] == pytest.approx(s["size"] / (s["time_us"] * 1e-6) / 1e9, rel=1e-6)
        assert s["busbw"] == pytest.approx(s["algbw"] * FACTORS["all_reduce"](n), rel=1e-9, abs=0.0)
        assert len(s["rank_time_us"]) == n
    if n > 1:
        # A GPU link moves a 256M all_reduce far faster than a host's TCP stack: NCCL is really in use.
        assert sizes[-1]["busbw"] > 10, sizes[-1]


def test_every_collective_runs_and_verifies_on_nccl() -> None:
    n = need_gpus(1)
    # A ring send/recv on one rank would send to itself: not a link, and gloo refuses it outright.
    colls = [c for c in FACTORS if n > 1 or c != "sendrecv"]
    result, rc, err = _bench("--collective", ",".join(colls), "--min-bytes", "64K", "--max-bytes", "16M",
                             "--iters", "5", "--warmup", "2", "--dtype", "bfloat16")
    assert rc == 0 and result["ok"], (result["summary"], err[-3000:])
    assert [c["collective"] for c in result["collectives"]] == colls
    for c in result["collectives"]:
        assert c["error"] is None and c["wrong_total"] == 0, c
        assert c["bus_factor"] == pytest.approx(FACTORS[c["collective"]](n))
        assert c["sizes"] and all(s["wrong"] == 0 and s["algbw"] > 0 for s in c["sizes"]), c["collective"]

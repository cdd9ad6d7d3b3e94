"""The active tests' engines on the CPU, for real: the matmul stress catches an injected silent
corruption, its TFLOPs come from the matmuls alone, and the memory pattern test reads back what it wrote."""

from __future__ import annotations

import os

import pytest

from ml_debug.health import active_checks
from ml_debug.health.gpu_checks import Thresholds
from ml_debug.health.result import Status
from ml_debug.health.stress import bare_matmul_tflops, matmul_stress, memory_test

os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_clean_stress_on_cpu_matches_its_reference(dtype: str) -> None:
    r = matmul_stress("cpu", dtype, n=128, duration_s=0.3)
    assert r.error is None and r.reference_ok
    assert r.iterations >= 3 and r.tflops > 0 and 0 < r.matmul_seconds
    assert r.corrupt_iterations == 0 and r.inexact_iterations == 0 and r.max_rel_error == 0.0
    assert active_checks.matmul_check("cpu", "cpu", r, Thresholds()).status is Status.PASS


def test_injected_corruption_is_caught_in_that_iteration_only() -> None:
    r = matmul_stress("cpu", "float32", n=128, duration_s=0.3, min_iterations=4, inject_fault_at=2)
    assert r.error is None and r.iterations >= 4
    assert r.corrupt_iterations == 1 and r.max_rel_error > 1
    c = active_checks.matmul_check("cpu", "cpu", r, Thresholds())
    assert c.status is Status.FAIL and "silent data corruption" in c.hint
    assert f"1/{r.iterations} results differed" in c.hint


def test_bare_loop_and_bad_device_are_reported_not_raised() -> None:
    assert bare_matmul_tflops("cpu", "float32", 128, 5) > 0
    r = matmul_stress("nosuchdevice", "float32", n=16, duration_s=0.1)
    assert r.error is not None and r.iterations == 0
    assert active_checks.matmul_check("gpu0", "x", r, Thresholds()).status is Status.FAIL


def test_memory_pattern_test_reads_back_what_it_wrote() -> None:
    r = memory_test("cpu", max_bytes=4 << 20, chunk_bytes=1 << 20)
    assert r.error is None and r.mismatches == 0
    assert r.bytes_tested == 4 << 20 and r.passes == 5
    c = active_checks.memtest_check("cpu", r)
    assert c.status is Status.PASS and c.value == "0 bad in 4 MiB"


def test_per_gpu_threads_never_wait_forever():
    """A GPU whose test never returns (hung kernel) is named instead of hanging health."""
    import time as _time

    from ml_debug.core.errors import ProblemFound
    from ml_debug.health.run import _in_threads

    assert _in_threads(lambda i: i * 2, [0, 1, 2], "memory test", 10) == [0, 2, 4]
    t0 = _time.monotonic()
    with pytest.raises(ProblemFound, match=r"GPU\(s\) 1 did not finish the matmul stress"):
        _in_threads(lambda i: _time.sleep(30 if i == 1 else 0), [0, 1], "matmul stress", 0.5)
    assert _time.monotonic() - t0 < 20  # returned before the stuck "GPU" (30 s) did

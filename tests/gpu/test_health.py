"""health's active GPU checks on a real GPU: the NVML -> CUDA device map, CUDA-event timing of the
matmul stress and of the pinned copies (each against an independent wall-clock loop), the device
memory pattern test, and `mldebug health --level 2` end to end. Marked gpu: skipped without one.

    pytest -m gpu tests/gpu/test_health.py
"""

from __future__ import annotations

import time

import pytest

from tests.conftest import mldebug
from tests.gpu.support import json_doc, need_gpus, repo_env

pytestmark = pytest.mark.gpu


def _nvml_gpus() -> list:
    from ml_debug.core.nvml import NvmlGateway
    from ml_debug.health.snapshot import read_gpus

    gw = NvmlGateway()
    assert gw.open().available
    try:
        return read_gpus(gw)
    finally:
        gw.close()


def test_cuda_index_map_puts_every_visible_gpu_on_its_own_nvml_index() -> None:
    visible = need_gpus(1)
    import torch

    from ml_debug.health.run import _cuda_index_map

    gpus = _nvml_gpus()
    mapping = _cuda_index_map(gpus)
    # One CUDA device per visible GPU, none twice.
    assert len(mapping) == visible, (mapping, [g.uuid for g in gpus])
    assert len(set(mapping.values())) == visible
    by_index = {g.index: g for g in gpus}
    for nvml_index, device in mapping.items():
        ci = int(device.split(":")[1])
        props = torch.cuda.get_device_properties(ci)
        # The same physical GPU on both sides: the UUID (torch prints it without NVML's "GPU-").
        assert by_index[nvml_index].uuid == f"GPU-{props.uuid}", (nvml_index, device)
        assert by_index[nvml_index].name == props.name


def test_matmul_stress_cuda_events_agree_with_a_wall_clock_loop_and_stay_under_peak() -> None:
    need_gpus(1)
    import torch

    from ml_debug.core.gpu_peaks import peak_tflops
    from ml_debug.health.stress import bare_matmul_tflops, matmul_stress

    r = matmul_stress("cuda:0", "bfloat16", 4096, duration_s=2.0)
    assert r.error is None, r.error
    assert r.reference_ok and r.corrupt_iterations == 0, r
    assert r.iterations >= 3 and r.matmul_seconds > 0
    # The events must time the matmuls themselves: an event recorded on another stream or device
    # reads ~0 ms (absurd TFLOPs), one around the whole loop reads the checks too. A bare loop of
    # the same shape, timed by the wall clock after a synchronize, is the yardstick.
    bare = bare_matmul_tflops("cuda:0", "bfloat16", 4096, r.iterations)
    assert 0.5 < r.tflops / bare < 2.0, (r.tflops, bare)
    peak = peak_tflops(torch.cuda.get_device_name(0), "bf16")
    if peak:
        assert r.tflops < 1.05 * peak, (r.tflops, peak)


def test_matmul_stress_on_the_gpu_sees_an_injected_bit_flip() -> None:
    need_gpus(1)
    from ml_debug.health.stress import matmul_stress

    r = matmul_stress("cuda:0", "bfloat16", 2048, duration_s=0.5, inject_fault_at=1)
    assert r.error is None, r.error
    assert r.corrupt_iterations == 1 and r.max_rel_error > 1e-2, r


def test_copy_bandwidth_events_agree_with_a_wall_clock_loop_and_sample_the_link() -> None:
    need_gpus(1)
    import torch

    from ml_debug.core.nvml import NvmlGateway
    from ml_debug.health.stress import copy_bandwidth

    nbytes, repeat = 128 << 20, 10
    gw = NvmlGateway()
    assert gw.open().available
    try:
        h = gw.handle(0)
        r = copy_bandwidth("cuda:0", nbytes, repeat=repeat, sample_link=lambda: gw.pcie_link(h))
    finally:
        gw.close()
    assert r.error is None, r.error
    assert set(r.link_under_load) == {"gen", "max_gen", "width", "max_width"}, r.link_under_load

    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda:0")
    wall = {}
    for direction in ("h2d", "d2h"):
        torch.cuda.synchronize(0)
        t0 = time.perf_counter()
        for _ in range(repeat):
            dev.copy_(host, non_blocking=True) if direction == "h2d" else host.copy_(dev, non_blocking=True)
        torch.cuda.synchronize(0)
        wall[direction] = nbytes * repeat / (time.perf_counter() - t0) / 1e9
    # CUDA events time the copies alone; the wall clock adds launch and sync: close, never 2x apart.
    for direction, events in (("h2d", r.h2d_gbps), ("d2h", r.d2h_gbps)):
        assert 0.5 < events / wall[direction] < 2.0, (direction, events, wall[direction])


def test_memory_pattern_test_on_the_gpu_finds_no_bad_word() -> None:
    need_gpus(1)
    from ml_debug.health.stress import memory_test

    r = memory_test("cuda:0", fraction=0.05, max_bytes=1 << 30)
    assert r.error is None, r.error
    assert r.bytes_tested > 64 << 20 and r.passes == 5 and r.mismatches == 0, r


def test_level2_cli_runs_every_active_check_on_every_gpu() -> None:
    visible = need_gpus(1)
    proc = mldebug("health", "--level", "2", "--json", "--stress-seconds", "3", "--memtest-fraction", "0.1",
                   "--path", "/tmp", timeout=600, env=repo_env())
    doc = json_doc(proc.stdout, proc.stderr, "health")
    node = doc["result"]["nodes"][0]
    assert proc.returncode == node["exit_code"], proc.stderr[-2000:]
    assert node["gpu"]["present"] and node["gpu"]["nvml_source"] == "pynvml", node["gpu"]
    ids = {c["id"] for c in node["checks"]}
    assert "gpu.active_tests" not in ids, [c for c in node["checks"] if c["id"] == "gpu.active_tests"]
    by = {(c["id"], c["target"]): c for c in node["checks"]}
    targets = sorted({c["target"] for c in node["checks"] if c["id"] == "gpu.matmul"})
    assert len(targets) == visible, targets
    for t in targets:
        mm = by[("gpu.matmul", t)]
        assert mm["status"] in ("pass", "warn"), mm
        assert mm["data"]["tflops"] > 1 and mm["data"]["corrupt_iterations"] == 0, mm
        assert by[("gpu.memtest", t)]["data"]["mismatches"] == 0
        for cid in ("gpu.h2d", "gpu.d2h"):
            assert by[(cid, t)]["data"]["gbps"] > 0.5, by[(cid, t)]
        assert by[("gpu.pcie_link_load", t)]["data"]["under_load"] is True
    sampled = [m for m in node["measurements"] if m["test"] == "matmul"]
    assert len(sampled) == visible and all(m["under_load"]["temp"] is not None for m in sampled), sampled

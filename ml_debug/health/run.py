"""Run the health checks on this node and reach a verdict (the library behind ``mldebug health --local``).

Exit codes: 1 when any check fails; 3 when a GPU was expected (``--expect-gpus N>0`` or
``--require-gpu``) and NVML finds none; otherwise 0. A node without an NVIDIA GPU where none
was expected is not a failure: the GPU part says "no NVIDIA GPU" and the host checks decide.
"""

from __future__ import annotations

import socket
import threading
import time
from collections import Counter
from typing import Any

from ml_debug.core.errors import ExitCode
from ml_debug.core.nvml import NvmlGateway, is_fake_source, is_na, open_gateway
from ml_debug.core.output import log, to_jsonable
from ml_debug.health import active_checks, gpu_checks, host_checks
from ml_debug.health.options import LEVEL_DEFAULTS, HealthOptions
from ml_debug.health.result import Check, GpuInfo, GpuPart, NodeReport, Status, count_statuses
from ml_debug.health.snapshot import read_gpus


def _gpu_part(gw: NvmlGateway, status: Any, gpus: list[GpuInfo]) -> GpuPart:
    if not status.available:
        return GpuPart(False, status.reason, gw.source)
    names = Counter(g.name for g in gpus)
    message = ", ".join(f"{n} x {name}" for name, n in names.items())
    drv, cuda = gw.driver_version(), gw.cuda_driver_version()
    return GpuPart(True, message, gw.source, None if is_na(drv) else drv, None if is_na(cuda) else cuda, gpus)


def passive_gpu_checks(gpus: list[GpuInfo], part: GpuPart, opts: HealthOptions,
                       kernel_log: tuple[list[str] | None, str] | None = None) -> list[Check]:
    """Level 1 GPU checks for a node's GPU snapshots (pure apart from reading the kernel log)."""
    from ml_debug.health.xid import parse_xids, read_kernel_log

    checks = [gpu_checks.check_count(len(gpus), opts.expect_gpus)]
    if part.driver_version:
        checks.append(Check("gpu.driver", "node", Status.INFO, f"{part.driver_version} (CUDA {part.cuda_driver_version})",
                            "-", "", "NVML nvmlSystemGetDriverVersion"))
    lines, reason = kernel_log if kernel_log is not None else read_kernel_log()
    events = parse_xids(lines) if lines is not None else None
    for g in gpus:
        checks += gpu_checks.checks_for_gpu(g, opts.thresholds, events, reason)
    checks += gpu_checks.check_consistency(gpus)
    return checks


def _cuda_index_map(gpus: list[GpuInfo]) -> dict[int, str]:
    """NVML index -> torch device string. CUDA orders devices fastest-first, NVML by PCI bus:
    match by UUID (or PCI bus id) so results land on the right GPU."""
    import torch

    if not torch.cuda.is_available():
        return {}
    out: dict[int, str] = {}
    for ci in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(ci)
        uuid = str(getattr(props, "uuid", "") or "")
        bus = getattr(props, "pci_bus_id", None)
        for g in gpus:
            if (uuid and g.uuid.endswith(uuid)) or (bus is not None and g.bus_id != "N/A"
                                                    and int(g.bus_id.split(":")[-2], 16) == bus
                                                    and g.index not in out):
                out[g.index] = f"cuda:{ci}"
                break
    return out


def _in_threads(fn: Any, items: list[Any], what: str, timeout_s: float) -> list[Any]:
    """fn(item) for every GPU at once; a GPU that does not finish in time (a hung kernel, a GPU
    fallen off the bus) is named in an error instead of waiting forever."""
    results: list[Any] = [None] * len(items)

    def work(i: int, item: Any) -> None:
        results[i] = fn(item)

    threads = [threading.Thread(target=work, args=(i, it), daemon=True) for i, it in enumerate(items)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout_s
    for t in threads:
        t.join(timeout=max(0.0, deadline - time.monotonic()))
    stuck = [items[i] for i, t in enumerate(threads) if t.is_alive()]
    if stuck:
        from ml_debug.core.errors import ProblemFound

        raise ProblemFound(f"GPU(s) {', '.join(map(str, stuck))} did not finish the {what} within {timeout_s:.0f} s",
                           "a hung kernel or a GPU fallen off the bus: check `dmesg | grep -i xid` and "
                           "`nvidia-smi -q -i <gpu>`")
    return results


def active_gpu_checks(gw: NvmlGateway, gpus: list[GpuInfo], opts: HealthOptions,
                      measurements: list[dict[str, Any]]) -> list[Check]:
    """Level 2/3 on GPUs: memory pattern test, copy bandwidth (PCIe sampled under load), matmul
    stress on all GPUs at once with clocks/thermals sampled under load, outliers vs the median."""
    from ml_debug.health import stress

    stress_s, frac, copy_bytes = LEVEL_DEFAULTS[opts.level]
    stress_s = opts.stress_seconds if opts.stress_seconds is not None else stress_s
    frac = opts.memtest_fraction if opts.memtest_fraction is not None else frac
    n = opts.matmul_n or 8192
    th = opts.thresholds
    devices = _cuda_index_map(gpus)
    if not devices:
        return [Check("gpu.active_tests", "node", Status.WARN, "not run", "torch sees the GPUs",
                      "torch cannot use these GPUs (CPU-only torch build, or CUDA_VISIBLE_DEVICES hides them): "
                      "`python -c 'import torch; print(torch.cuda.is_available())'`", "torch.cuda")]
    by_index = {g.index: g for g in gpus if g.index in devices}
    checks: list[Check] = []

    log(f"mldebug health: memory pattern test on {len(devices)} GPU(s) ({frac:.0%} of free memory)")
    mem = _in_threads(lambda i: stress.memory_test(devices[i], frac), list(by_index), "memory test", 900)
    for i, r in zip(by_index, mem, strict=True):
        checks.append(active_checks.memtest_check(f"gpu{i}", r))
        measurements.append({"test": "memtest", "gpu": i, **to_jsonable(r)})

    log("mldebug health: host<->device copy bandwidth, one GPU at a time")
    copies: list[tuple[str, str, float]] = []
    for i, g in by_index.items():
        h = gw.handle(i)
        r = stress.copy_bandwidth(devices[i], copy_bytes, sample_link=lambda h=h: gw.pcie_link(h))
        measurements.append({"test": "copy", "gpu": i, **to_jsonable(r)})
        checks += active_checks.copy_checks(f"gpu{i}", r, g.fields["pcie.link.gen.max"],
                                            g.fields["pcie.link.width.max"], th)
        if r.link_under_load:
            checks.append(gpu_checks.check_pcie(g, under_load=True, link=r.link_under_load))
        if not r.error:
            copies.append((f"gpu{i}", g.name, r.h2d_gbps))
    checks += active_checks.outlier_checks("gpu.h2d_outlier", copies, th.outlier_pct, "GB/s", Status.WARN)

    log(f"mldebug health: {opts.dtype} matmul stress n={n} on {len(devices)} GPU(s) for {stress_s:.0f} s")
    samples: dict[int, dict[str, Any]] = {i: {"mask": 0, "temp": None, "power": None} for i in by_index}
    done = threading.Event()

    def sampler() -> None:
        handles = {i: gw.handle(i) for i in by_index}
        while not done.wait(1.0):
            for i, h in handles.items():
                s = samples[i]
                mask, temp, power = gw.clock_event_reasons(h), gw.temperature(h), gw.power_watts(h)
                if not is_na(mask):
                    s["mask"] |= mask
                if not is_na(temp):
                    s["temp"] = max(temp, s["temp"] or temp)
                if not is_na(power):
                    s["power"] = max(power, s["power"] or power)

    sampling = threading.Thread(target=sampler, daemon=True)
    sampling.start()
    try:
        mm = _in_threads(lambda i: stress.matmul_stress(devices[i], opts.dtype, n, stress_s), list(by_index),
                         "matmul stress", stress_s + 300)
    finally:
        done.set()
        sampling.join(timeout=5)
    speeds: list[tuple[str, str, float]] = []
    for i, r in zip(by_index, mm, strict=True):
        g = by_index[i]
        checks.append(active_checks.matmul_check(f"gpu{i}", g.name, r, th))
        measurements.append({"test": "matmul", "gpu": i, **to_jsonable(r), "under_load": samples[i]})
        if not r.error:
            speeds.append((f"gpu{i}", g.name, r.tflops))
        if samples[i]["temp"] is not None or samples[i]["mask"]:
            loaded = GpuInfo(g.index, g.name, g.uuid, g.bus_id,
                             dict(g.fields, **{"clocks_event_reasons.active": samples[i]["mask"],
                                               "temperature.gpu": samples[i]["temp"]
                                               if samples[i]["temp"] is not None else g.fields["temperature.gpu"]}))
            for c in (gpu_checks.check_clock_events(loaded), gpu_checks.check_temperature(loaded, th)):
                c.id += "_load"
                c.source += ", sampled during the stress"
                checks.append(c)
    checks += active_checks.outlier_checks("gpu.matmul_outlier", speeds, th.outlier_pct, "TFLOPs")
    return checks


def active_cpu_checks(opts: HealthOptions, measurements: list[dict[str, Any]]) -> list[Check]:
    """Without a GPU, level >= 2 still runs the matmul stress (float32) and a small pattern test
    on the CPU, so the code path is exercised for real."""
    from ml_debug.health import stress

    stress_s = opts.stress_seconds if opts.stress_seconds is not None else min(LEVEL_DEFAULTS[opts.level][0], 5.0)
    n = opts.matmul_n or 1024
    log(f"mldebug health: no GPU: float32 matmul stress n={n} on the CPU for {stress_s:.0f} s")
    r = stress.matmul_stress("cpu", "float32", n, stress_s)
    measurements.append({"test": "matmul", "gpu": None, **to_jsonable(r)})
    checks = [active_checks.matmul_check("cpu", "cpu", r, opts.thresholds)]
    m = stress.memory_test("cpu", max_bytes=64 << 20)
    measurements.append({"test": "memtest", "gpu": None, **to_jsonable(m)})
    checks.append(active_checks.memtest_check("cpu", m))
    return checks


def verdict(checks: list[Check], part: GpuPart, opts: HealthOptions) -> tuple[bool, int, str]:
    """(ok, exit code, one-line summary) for one node."""
    fails = [c for c in checks if c.status is Status.FAIL]
    warns = [c for c in checks if c.status is Status.WARN]
    counts = count_statuses(checks)
    tally = f"{counts['pass']} pass, {counts['warn']} warn, {counts['fail']} fail"
    if not part.present:
        gpu_txt = part.message if part.message.startswith("no NVIDIA GPU") else f"no NVIDIA GPU ({part.message})"
    else:
        gpu_txt = part.message
    if is_fake_source(part.nvml_source):
        gpu_txt += " from FAKE NVML"  # test data must never read as this node's hardware
    if not part.present and opts.gpu_expected:
        return False, int(ExitCode.ENVIRONMENT), f"{gpu_txt}, but a GPU was expected; {tally}"
    if fails:
        first = fails[0]
        more = f" (+{len(fails) - 1} more)" if len(fails) > 1 else ""
        return False, int(ExitCode.PROBLEM), f"FAIL {first.label}: {first.hint}{more}; {gpu_txt}; {tally}"
    warn_txt = f" (warn: {', '.join(c.label for c in warns[:4])}{', ...' if len(warns) > 4 else ''})" if warns else ""
    return True, int(ExitCode.OK), f"healthy: {gpu_txt}; {tally}{warn_txt}"


def run_local(opts: HealthOptions, gateway: NvmlGateway | None = None) -> NodeReport:
    """Every check of this node at `opts.level`; never raises for missing hardware."""
    opts.validate()
    t0 = time.perf_counter()
    gw = gateway if gateway is not None else open_gateway()
    checks: list[Check] = []
    measurements: list[dict[str, Any]] = []
    status = gw.open()
    try:
        gpus = read_gpus(gw) if status.available else []
        part = _gpu_part(gw, status, gpus)
        if part.present:
            checks += passive_gpu_checks(gpus, part, opts)
        elif opts.gpu_expected:
            checks.append(Check("gpu.count", "node", Status.FAIL, "0",
                                f"== {opts.expect_gpus}" if opts.expect_gpus else ">= 1", part.message, "NVML nvmlInit"))
        else:
            checks.append(Check("gpu.nvml", "node", Status.INFO, "no NVIDIA GPU", "(none expected)", part.message,
                                "NVML nvmlInit"))
        checks += host_checks.host_checks(opts.paths or None)
        if opts.level >= 2:
            if part.present:
                checks += active_gpu_checks(gw, gpus, opts, measurements)
            elif opts.cpu_stress:
                checks += active_cpu_checks(opts, measurements)
    finally:
        gw.close()
    ok, code, summary = verdict(checks, part, opts)
    return NodeReport(socket.gethostname(), opts.level, ok, summary, code, part, checks, count_statuses(checks),
                      round(time.perf_counter() - t0, 3), measurements)

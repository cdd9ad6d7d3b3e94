"""GPU decision logic through the FakeNVML at the gateway (the project's only fake).

Scenarios: healthy GPU, pending row remap, thermal slowdown, downtrained PCIe (idle vs under
load), an outlier GPU in TFLOPs, plus N/A handling. Thresholds and explanations are checked.
The same paths run on real hardware in tests/gpu/test_health_nvml.py (marked gpu).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pynvml
import pytest

from ml_debug.core.nvml import NA, NvmlGateway, is_na
from ml_debug.health import active_checks, gpu_checks
from ml_debug.health.gpu_checks import Thresholds
from ml_debug.health.result import Check, GpuPart, Status
from ml_debug.health.run import HealthOptions, passive_gpu_checks, run_local, verdict
from ml_debug.health.snapshot import read_gpus
from ml_debug.health.stress import MatmulResult
from tests.conftest import REPO, mldebug
from tests.fakes import nvml as fake_nvml
from tests.fakes.nvml import FakeNVML, healthy_gpu

SCHEMA = json.loads((REPO / "ml_debug" / "schemas" / "health.json").read_text())
NO_KERNEL_LOG: tuple[list[str], str] = ([], "test kernel log")


def gateway(*gpus: dict[str, Any], **kw: Any) -> NvmlGateway:
    return NvmlGateway(FakeNVML(list(gpus), **kw), source="fake:test")


def gpu_verdicts(*gpus: dict[str, Any], opts: HealthOptions | None = None,
                 kernel_log: tuple[list[str], str] = NO_KERNEL_LOG) -> tuple[list[Check], bool, int, str]:
    """Passive GPU checks of a fake node and the node verdict they lead to (host checks left out)."""
    opts = opts or HealthOptions()
    gw = gateway(*gpus)
    status = gw.open()
    assert status.available, status.reason
    snaps = read_gpus(gw)
    part = GpuPart(True, f"{len(snaps)} x {snaps[0].name}", gw.source, "550.54.15", "12.4", snaps)
    checks = passive_gpu_checks(snaps, part, opts, kernel_log)
    ok, code, summary = verdict(checks, part, opts)
    return checks, ok, code, summary


def by_id(checks: list[Check], cid: str, target: str = "gpu0") -> Check:
    found = [c for c in checks if c.id == cid and c.target == target]
    assert len(found) == 1, [(c.id, c.target) for c in checks]
    return found[0]


def test_healthy_gpu_passes_every_check() -> None:
    checks, ok, code, summary = gpu_verdicts(healthy_gpu(0), healthy_gpu(1), opts=HealthOptions(expect_gpus=2))
    bad = [(c.target, c.id, c.status, c.hint) for c in checks if c.status not in (Status.PASS, Status.INFO)]
    assert bad == []
    assert ok and code == 0 and summary.startswith("healthy: 2 x NVIDIA H100 80GB HBM3 from FAKE NVML;")
    assert by_id(checks, "gpu.count", "node").value == "2"
    assert by_id(checks, "gpu.row_remap").status is Status.PASS
    assert by_id(checks, "gpu.nvlink", "gpu1").value == "18/18 active"
    assert by_id(checks, "gpu.temperature").threshold == "< 82 C (slowdown 87 C)"


def test_pending_row_remap_fails_and_says_reset() -> None:
    sick = healthy_gpu(1)
    sick["remapped_rows"] = [0, 2, 1, 0]  # 2 uncorrectable rows, remap pending, no failure
    sick["ecc"]["uncorrected_aggregate"] = 2
    checks, ok, code, summary = gpu_verdicts(healthy_gpu(0), sick)
    c = by_id(checks, "gpu.row_remap", "gpu1")
    assert c.status is Status.FAIL
    assert c.value == "pending=yes failed=no rows unc=2 corr=0"
    assert "reset" in c.hint and "`nvidia-smi -r -i 1`" in c.hint  # ready to paste, for this GPU
    assert c.source.startswith("NVML nvmlDeviceGetRemappedRows")
    assert by_id(checks, "gpu.row_remap", "gpu0").status is Status.PASS
    assert by_id(checks, "gpu.ecc_uncorrected_aggregate", "gpu1").status is Status.WARN
    assert not ok and code == 1 and "gpu1 row_remap" in summary


def test_row_remap_failure_means_rma() -> None:
    g = healthy_gpu()
    g["remapped_rows"] = [0, 9, 0, 1]
    c = by_id(gpu_verdicts(g)[0], "gpu.row_remap")
    assert c.status is Status.FAIL and "RMA" in c.hint


def test_thermal_slowdown_fails_sw_thermal_warns_power_cap_passes() -> None:
    hot = healthy_gpu()
    hot["clock_event_reasons"] = 0x40 | 0x4  # hw thermal slowdown + sw power cap
    hot["temperature"] = 89
    checks, ok, code, _ = gpu_verdicts(hot)
    ev = by_id(checks, "gpu.clock_events")
    assert ev.status is Status.FAIL and ev.value == "sw_power_cap,hw_thermal_slowdown"
    assert "too hot" in ev.hint and "cooling" in ev.hint
    temp = by_id(checks, "gpu.temperature")
    assert temp.status is Status.FAIL and temp.value == "89 C" and "slowdown" in temp.hint
    assert code == 1

    warm = healthy_gpu()
    warm["clock_event_reasons"] = 0x20
    warm["temperature"] = 83  # within the 5 C margin of 87
    checks = gpu_verdicts(warm)[0]
    assert by_id(checks, "gpu.clock_events").status is Status.WARN
    assert by_id(checks, "gpu.temperature").status is Status.WARN

    capped = healthy_gpu()
    capped["clock_event_reasons"] = 0x4
    c = by_id(gpu_verdicts(capped)[0], "gpu.clock_events")
    assert c.status is Status.PASS and "normal" in c.hint


def test_power_brake_and_hw_slowdown_fail() -> None:
    for bit, words in ((0x80, "power brake"), (0x8, "hardware slowdown")):
        g = healthy_gpu()
        g["clock_event_reasons"] = bit
        c = by_id(gpu_verdicts(g)[0], "gpu.clock_events")
        assert c.status is Status.FAIL and words in c.hint


def test_downtrained_pcie_is_a_note_at_idle_and_a_failure_under_load() -> None:
    idle = healthy_gpu()
    idle["pcie"] = [1, 5, 16, 16]  # Gen1 at idle: normal power saving
    checks, ok, code, _ = gpu_verdicts(idle)
    c = by_id(checks, "gpu.pcie_link")
    assert c.status is Status.INFO and c.value == "Gen1 x16" and c.threshold == "Gen5 x16"
    assert "idle" in c.hint and "--level 2" in c.hint
    assert ok and code == 0

    snap = read_gpus(_opened(gateway(idle)))[0]
    loaded = gpu_checks.check_pcie(snap, under_load=True, link={"gen": 3, "max_gen": 5, "width": 16, "max_width": 16})
    assert loaded.id == "gpu.pcie_link_load" and loaded.status is Status.FAIL
    assert "under load" in loaded.hint and loaded.data["under_load"] is True
    full = gpu_checks.check_pcie(snap, under_load=True, link={"gen": 5, "max_gen": 5, "width": 16, "max_width": 16})
    assert full.status is Status.PASS

    narrow = healthy_gpu()
    narrow["pcie"] = [5, 5, 8, 16]  # width never trains down at idle: a lane/riser problem
    c = by_id(gpu_verdicts(narrow)[0], "gpu.pcie_link")
    assert c.status is Status.FAIL and "x8 below x16" in c.hint and "reseat" in c.hint


def _opened(gw: NvmlGateway) -> NvmlGateway:
    assert gw.open().available
    return gw


def test_outlier_gpu_in_tflops_fails_against_the_median_of_identical_gpus() -> None:
    gpus = [healthy_gpu(i) for i in range(4)] + [healthy_gpu(4, "NVIDIA A100-SXM4-80GB")]
    snaps = read_gpus(_opened(gateway(*gpus)))
    tflops = {0: 702.0, 1: 690.0, 2: 560.0, 3: 698.0, 4: 250.0}  # gpu2 is ~20% below the H100 median
    results = {i: MatmulResult(f"cuda:{i}", "bfloat16", 8192, iterations=100, matmul_seconds=1.0, tflops=t)
               for i, t in tflops.items()}
    th = Thresholds(outlier_pct=10.0)
    rows = [(f"gpu{g.index}", g.name, results[g.index].tflops) for g in snaps]
    out = active_checks.outlier_checks("gpu.matmul_outlier", rows, th.outlier_pct, "TFLOPs")
    status = {c.target: c.status for c in out}
    # the lone A100 has no identical sibling: no verdict for it
    assert status == {"gpu0": Status.PASS, "gpu1": Status.PASS, "gpu2": Status.FAIL, "gpu3": Status.PASS}
    slow = next(c for c in out if c.target == "gpu2")
    median = (690.0 + 698.0) / 2
    assert slow.data["median"] == median and slow.data["peers"] == 4
    assert slow.threshold == f">= {median * 0.9:.1f} (median -10%)"
    assert "slower than the median of its 4 identical NVIDIA H100 80GB HBM3 GPUs" in slow.hint
    # the per-GPU matmul check compares with the known peak: 560/989 = 57% >= 50%
    c = active_checks.matmul_check("gpu2", snaps[2].name, results[2], th)
    assert c.status is Status.PASS and c.value == "560.0 TFLOPs (57% of 989)"
    # the A100 at 250/312 passes too; an H100 at 400 is below half its peak: warn
    assert active_checks.matmul_check("gpu4", snaps[4].name, results[4], th).status is Status.PASS
    slow_r = MatmulResult("cuda:0", "bfloat16", 8192, iterations=10, matmul_seconds=1.0, tflops=400.0)
    assert active_checks.matmul_check("gpu0", snaps[0].name, slow_r, th).status is Status.WARN


def test_corrupted_matmul_results_fail() -> None:
    r = MatmulResult("cuda:0", "bfloat16", 8192, iterations=50, matmul_seconds=1.0, tflops=700.0,
                     corrupt_iterations=3, max_rel_error=0.8)
    c = active_checks.matmul_check("gpu0", "NVIDIA H100 80GB HBM3", r, Thresholds())
    assert c.status is Status.FAIL and "silent data corruption" in c.hint and "3/50" in c.hint


def test_ecc_recovery_power_persistence_nvlink_processes() -> None:
    g = healthy_gpu()
    g["ecc"]["uncorrected_volatile"] = 1
    g["ecc"]["corrected_volatile"] = 5000
    g["recovery_action"] = 1
    g["power_limit_mw"] = 500000  # lowered from the 700 W default
    g["persistence"] = 0
    g["nvlink_states"] = [1] * 16 + [0, 0]
    g["nvlink_errors"] = {"3": {"replay": 12}}
    g["processes"] = [[424242, 3 * 2**30]]
    checks = gpu_verdicts(g)[0]
    assert by_id(checks, "gpu.ecc_uncorrected_volatile").status is Status.FAIL
    c = by_id(checks, "gpu.ecc_corrected_volatile")
    assert c.status is Status.WARN and c.threshold == "<= 1000"
    c = by_id(checks, "gpu.recovery_action")
    assert c.status is Status.FAIL and c.value == "GPU reset"
    c = by_id(checks, "gpu.power")
    assert c.status is Status.WARN and "nvidia-smi -pl 700" in c.hint
    assert by_id(checks, "gpu.persistence").status is Status.WARN
    c = by_id(checks, "gpu.nvlink")
    assert c.status is Status.FAIL and c.value == "16/18 active" and "2 NVLink(s) down" in c.hint
    c = by_id(checks, "gpu.nvlink_errors")
    assert c.status is Status.WARN and "replay=12" in c.value
    c = by_id(checks, "gpu.processes")
    assert c.status is Status.WARN and c.value == "1 proc(s), 3072 MiB" and "424242" in c.hint


def test_consumer_gpu_without_features_reads_na_and_never_crashes() -> None:
    g = {"name": "NVIDIA GeForce RTX 4090", "uuid": "GPU-x", "bus_id": "00000000:01:00.0",
         "temperature": 40, "pcie": [4, 4, 16, 16], "processes": []}  # everything else: Not Supported
    gw = _opened(gateway(g))
    snap = read_gpus(gw)[0]
    assert is_na(snap.fields["ecc.mode.current"]) and snap.na["ecc.mode.current"] == "Not Supported"
    assert is_na(snap.fields["nvlink.active"]) and is_na(gw.recovery_action(gw.handle(0)))
    checks, ok, code, _ = gpu_verdicts(g)
    assert ok and code == 0
    assert by_id(checks, "gpu.ecc_mode").status is Status.SKIP
    assert by_id(checks, "gpu.temperature").status is Status.INFO  # slowdown threshold N/A
    assert not [c for c in checks if c.id == "gpu.nvlink"]  # no NVLink: nothing to say
    assert str(NA) == "N/A" and not NA


def test_vbios_mismatch_among_identical_gpus_warns() -> None:
    a, b = healthy_gpu(0), healthy_gpu(1)
    b["vbios"] = "96.00.61.00.01"
    c = by_id(gpu_verdicts(a, b)[0], "gpu.vbios_match", "node")
    assert c.status is Status.WARN and "gpu0" in c.value and "gpu1" in c.value


def test_xids_from_the_kernel_log_map_to_their_gpu() -> None:
    lines = ["NVRM: Xid (PCI:0000:19:00): 79, pid=1234, GPU has fallen off the bus.",
             "NVRM: Xid (PCI:0000:18:00): 31, pid=77, name=python, Ch 00000008, intr 10000000. MMU Fault",
             "something else"]
    checks = gpu_verdicts(healthy_gpu(0), healthy_gpu(1), kernel_log=(lines, "/dev/kmsg (3 records)"))[0]
    app = by_id(checks, "gpu.xid", "gpu0")
    assert app.status is Status.WARN and app.value == "31 (1 events)" and "page fault" in app.hint
    dead = by_id(checks, "gpu.xid", "gpu1")
    assert dead.status is Status.FAIL and "fallen off the bus" in dead.hint and "reboot" in dead.hint
    unread = gpu_verdicts(healthy_gpu(0), kernel_log=(None, "/dev/kmsg not readable"))[0]  # type: ignore[arg-type]
    assert by_id(unread, "gpu.xid").status is Status.SKIP


def test_gpu_count_against_expect_gpus() -> None:
    _, ok, code, summary = gpu_verdicts(healthy_gpu(0), opts=HealthOptions(expect_gpus=8))
    assert not ok and code == 1 and "7 GPU(s) missing" in summary


@pytest.mark.parametrize("error,words", [(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "libnvidia-ml.so.1 is not installed"),
                                         (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "kernel driver is not loaded")])
def test_no_driver_says_no_nvidia_gpu(error: int, words: str) -> None:
    gw = gateway(init_error=error)
    report = run_local(HealthOptions(paths=["/tmp"]), gw)
    assert not report.gpu.present and report.gpu.message.startswith("no NVIDIA GPU") and words in report.gpu.message
    host_fail = any(c.status is Status.FAIL for c in report.checks)
    assert report.exit_code == (1 if host_fail else 0)
    expected = run_local(HealthOptions(paths=["/tmp"], expect_gpus=8), gateway(init_error=error))
    assert expected.exit_code == 3 and not expected.ok and "but a GPU was expected" in expected.summary


def test_cli_with_a_fake_scenario_exits_1_and_names_the_gpu(tmp_path: Path) -> None:
    sick = healthy_gpu(1)
    sick["remapped_rows"] = [0, 1, 1, 0]
    scenario = tmp_path / "scenario.json"
    scenario.write_text(json.dumps({"gpus": [healthy_gpu(0), sick]}))
    proc = mldebug("health", "--json", "--expect-gpus", "2", "--path", str(tmp_path),
                   env=fake_nvml.env(scenario), timeout=120)
    assert proc.returncode == 1, proc.stderr
    doc = json.loads(proc.stdout)
    jsonschema.validate(doc, SCHEMA)
    node = doc["result"]["nodes"][0]
    assert node["gpu"]["nvml_source"] == f"fake:{scenario}"  # a fake can never pass for real hardware
    assert [g["name"] for g in node["gpu"]["gpus"]] == ["NVIDIA H100 80GB HBM3"] * 2
    assert node["gpu"]["gpus"][0]["fields"]["pcie.link.gen.max"] == 5
    assert "gpu1 row_remap" in doc["result"]["summary"]
    human = mldebug("health", "--brief", "--path", str(tmp_path), env=fake_nvml.env(scenario), timeout=120)
    assert human.returncode == 1
    row = next(ln for ln in human.stdout.splitlines() if "gpu1 row_remap" in ln)
    assert "FAIL" in row and "pending=yes" in row
    assert "2 x NVIDIA H100 80GB HBM3" in human.stdout
    # The human view says FAKE NVML too: before the tables (with the scenario) and in the node's title.
    lines = human.stdout.splitlines()
    assert lines[0].startswith("FAKE NVML: the GPU data of ")
    banner = " ".join(human.stdout.split("2 x NVIDIA")[0].split())  # the lines before the node's table
    assert "not from a GPU" in banner and f"fake:{scenario}" in "".join(banner.split())
    assert any("2 x NVIDIA H100 80GB HBM3" in ln and "[FAKE NVML]" in ln for ln in lines)

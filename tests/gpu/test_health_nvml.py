"""The fake-tested GPU paths on real hardware (marked gpu; skipped where NVML finds no GPU).

Run on a GPU node:  pytest -m gpu tests/gpu/test_health_nvml.py
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator

import pytest

from ml_debug.core.nvml import NvmlGateway, is_na
from ml_debug.health import gpu_checks
from ml_debug.health.result import Status
from ml_debug.health.run import HealthOptions, passive_gpu_checks, run_local
from ml_debug.health.snapshot import read_gpus
from tests.conftest import mldebug, require
from tests.gpu.support import check_schema, need_gpus, repo_env


@pytest.fixture(scope="module")
def gw() -> Iterator[NvmlGateway]:
    g = NvmlGateway()
    status = g.open()
    if not status.available:
        pytest.skip(f"no GPU for the gpu-marked tests: {status.reason}")
    yield g
    g.close()


pytestmark = pytest.mark.gpu


def test_real_snapshot_reads_every_field_or_says_why(gw: NvmlGateway) -> None:
    gpus = read_gpus(gw)
    assert gpus and all(g.name.startswith("NVIDIA") for g in gpus)
    for g in gpus:
        assert g.uuid.startswith("GPU-") and g.bus_id.count(":") == 2
        for key, value in g.fields.items():
            if is_na(value):
                assert g.na[key], key  # an N/A always says why
        assert isinstance(g.fields["temperature.gpu"], int)
        assert g.fields["memory.total"] > 1000  # MiB


def test_real_passive_checks_have_a_verdict_for_each_gpu(gw: NvmlGateway) -> None:
    gpus = read_gpus(gw)
    report = run_local(HealthOptions(expect_gpus=len(gpus), paths=["/tmp"]), gw)
    assert report.gpu.present and report.gpu.driver_version
    for g in gpus:
        ids = {c.id for c in report.checks if c.target == f"gpu{g.index}"}
        assert {"gpu.clock_events", "gpu.temperature", "gpu.pcie_link", "gpu.processes", "gpu.xid"} <= ids
    count = next(c for c in report.checks if c.id == "gpu.count")
    assert count.status is Status.PASS


def test_real_pcie_under_load_and_matmul_stress(gw: NvmlGateway) -> None:
    need_gpus(1)  # the active tests need a torch that can use the GPU: say so instead of a KeyError
    gpus = read_gpus(gw)
    opts = HealthOptions(level=2, stress_seconds=3, memtest_fraction=0.1, paths=["/tmp"])
    report = run_local(opts, gw)
    by = {(c.id, c.target): c for c in report.checks}
    for g in gpus:
        mm = by[("gpu.matmul", f"gpu{g.index}")]
        assert mm.status in (Status.PASS, Status.WARN), mm
        assert mm.data["tflops"] > 1 and mm.data["corrupt_iterations"] == 0
        assert by[("gpu.memtest", f"gpu{g.index}")].status is Status.PASS
        link = by[("gpu.pcie_link_load", f"gpu{g.index}")]
        assert link.data["under_load"] is True
    # The idle/under-load rule on this GPU's own numbers.
    g = gpus[0]
    assert gpu_checks.check_pcie(g).status in (Status.PASS, Status.INFO, Status.FAIL, Status.SKIP)
    _ = passive_gpu_checks(gpus, report.gpu, opts, ([], "test"))


def test_real_cli_level1_json_validates(gw: NvmlGateway) -> None:
    proc = mldebug("health", "--json", "--path", "/tmp", timeout=120, env=repo_env())
    doc = json.loads(proc.stdout)
    check_schema(doc, "health")
    assert doc["result"]["nodes"][0]["gpu"]["present"] is True
    assert doc["result"]["nodes"][0]["gpu"]["nvml_source"] == "pynvml"  # the real gateway: no test hooks
    assert "FAKE NVML" not in doc["result"]["summary"]
    assert proc.returncode == doc["result"]["exit_code"]


def test_fields_agree_with_nvidia_smi(gw: NvmlGateway) -> None:
    require(shutil.which("nvidia-smi") is not None, "nvidia-smi (it comes with the NVIDIA driver)")
    from benchmarks.gpu_compare_nvidia_smi import compare, query_smi, smi_fields

    proc = mldebug("health", "--json", "--path", "/tmp", timeout=120, env=repo_env())
    doc = json.loads(proc.stdout)
    ours = {f for g in doc["result"]["nodes"][0]["gpu"]["gpus"] for f in g["fields"]}
    rows = compare(doc, query_smi(sorted(ours & smi_fields())))
    assert rows
    bad = [r for r in rows if r["agree"] == "NO" and not r["live"]]
    assert bad == [], bad

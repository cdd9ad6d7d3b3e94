"""`mldebug gpu-test` on real GPUs with NCCL: one rank per visible GPU (self-launched), and
`--isolate`. Marked gpu: skipped without one.

    pytest -m gpu tests/gpu/test_gpu_test.py
"""

from __future__ import annotations

import pytest

from tests.conftest import mldebug
from tests.gpu.support import json_doc, need_gpus, repo_env

pytestmark = pytest.mark.gpu


def _nvml_uuids() -> set[str]:
    from ml_debug.core.nvml import NvmlGateway, is_na

    gw = NvmlGateway()
    assert gw.open().available
    try:
        uuids = {gw.uuid(gw.handle(i)) for i in range(int(gw.device_count()))}
    finally:
        gw.close()
    return {u for u in uuids if not is_na(u)}


def test_one_nccl_rank_per_gpu_passes_every_stage_on_its_own_gpu() -> None:
    visible = need_gpus(1)
    proc = mldebug("gpu-test", "--json", "--stage-timeout", "60", "--mem-gb", "1", timeout=420, env=repo_env())
    doc = json_doc(proc.stdout, proc.stderr, "gpu-test")
    result = doc["result"]
    assert proc.returncode == 0 and result["ok"], (result["summary"], proc.stderr[-3000:])
    assert result["world_size"] == visible and result["backend"] == "nccl"
    assert result["versions"]["cuda"] and result["versions"]["nccl"], result["versions"]
    nvml = _nvml_uuids()
    seen = []
    for rank in result["ranks"]:
        ident = rank["identity"]
        assert ident["device"] == f"cuda:{ident['local_rank']}" and ident["backend"] == "nccl", ident
        assert ident["gpu_name"] and ident["capability"], ident
        # torch's UUID of the rank's device, in NVML's spelling, is one of this node's GPUs.
        assert ident["gpu_uuid"] in nvml, (ident["gpu_uuid"], nvml)
        seen.append(ident["gpu_uuid"])
        stages = {s["name"]: s for s in rank["stages"]}
        assert stages["device"]["status"] == "ok" and ident["gpu_name"] in stages["device"]["detail"]
        assert stages["alloc"]["status"] == "ok" and "1 GiB" in stages["alloc"]["detail"], stages["alloc"]
        assert stages["all_reduce"]["status"] == "ok" and "exact" in stages["all_reduce"]["detail"]
        for name in ("rendezvous", "init", "all_gather", "broadcast", "barrier"):
            assert stages[name]["status"] == "ok", stages[name]
        assert stages["p2p_ring"]["status"] == ("skipped" if visible == 1 else "ok"), stages["p2p_ring"]
    assert len(set(seen)) == visible, f"two ranks on one GPU: {seen}"


def test_isolate_runs_every_gpu_alone_and_in_pairs() -> None:
    visible = need_gpus(1)
    from ml_debug.gputest.isolate import schedule, visible_members

    proc = mldebug("gpu-test", "--isolate", "--json", "--stage-timeout", "60", timeout=600, env=repo_env())
    doc = json_doc(proc.stdout, proc.stderr, "gpu-test")
    result = doc["result"]
    assert proc.returncode == 0 and result["ok"], (result["summary"], proc.stderr[-3000:])
    assert result["mode"] == "isolate" and result["members"] == visible_members(visible)
    assert [e["members"] for e in result["entries"]] == [list(g) for g in schedule(visible)]
    assert all(e["ok"] and e["exit_code"] == 0 for e in result["entries"]), result["entries"]
    assert result["suspects"] == []

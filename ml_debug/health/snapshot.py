"""Read every GPU once through the gateway into plain :class:`GpuInfo` snapshots.

Field names follow ``nvidia-smi --query-gpu=<field>`` wherever nvidia-smi has one, so the
two can be compared line by line (benchmarks/gpu_compare_nvidia_smi.py does that).
"""

from __future__ import annotations

from typing import Any

from ml_debug.core.nvml import NotAvailable, NvmlGateway, is_na
from ml_debug.health.result import GpuInfo


def _pick(value: Any, i: int) -> Any:
    return value if is_na(value) else value[i]


def read_gpu(gw: NvmlGateway, index: int) -> GpuInfo:
    """One GPU's NVML fields (``nvidia-smi -q -i <index>``)."""
    h = gw.handle(index)
    if is_na(h):
        return GpuInfo(index, "N/A", "N/A", "N/A", {}, {"handle": h.reason})
    mem = gw.memory(h)
    remap = gw.remapped_rows(h)
    pcie = gw.pcie_link(h)
    nvlink = gw.nvlink_states(h)
    fields: dict[str, Any] = {
        "name": gw.name(h),
        "uuid": gw.uuid(h),
        "pci.bus_id": gw.pci_bus_id(h),
        "vbios_version": gw.vbios_version(h),
        "memory.total": _pick(mem, 0) if is_na(mem) else mem[0] // 2**20,
        "memory.used": _pick(mem, 1) if is_na(mem) else mem[1] // 2**20,
        "ecc.mode.current": gw.ecc_mode(h),
        "ecc.errors.corrected.volatile.total": gw.ecc_errors(h, uncorrected=False, aggregate=False),
        "ecc.errors.uncorrected.volatile.total": gw.ecc_errors(h, uncorrected=True, aggregate=False),
        "ecc.errors.corrected.aggregate.total": gw.ecc_errors(h, uncorrected=False, aggregate=True),
        "ecc.errors.uncorrected.aggregate.total": gw.ecc_errors(h, uncorrected=True, aggregate=True),
        "retired_pages.single_bit_ecc.count": gw.retired_pages(h, double_bit=False),
        "retired_pages.double_bit.count": gw.retired_pages(h, double_bit=True),
        "retired_pages.pending": gw.retired_pages_pending(h),
        "remapped_rows.correctable": _pick(remap, 0),
        "remapped_rows.uncorrectable": _pick(remap, 1),
        "remapped_rows.pending": _pick(remap, 2),
        "remapped_rows.failure": _pick(remap, 3),
        "recovery_action": gw.recovery_action(h),
        "clocks_event_reasons.active": gw.clock_event_reasons(h),
        "temperature.gpu": gw.temperature(h),
        "temperature.slowdown": gw.temperature_slowdown(h),
        "power.draw": gw.power_watts(h),
        "enforced.power.limit": gw.power_limit_watts(h),
        "power.default_limit": gw.default_power_limit_watts(h),
        "persistence_mode": gw.persistence_mode(h),
        "utilization.gpu": gw.utilization(h),
        "clocks.sm": gw.sm_clock_mhz(h),
        "clocks.max.sm": gw.sm_clock_mhz(h, maximum=True),
        "pcie.link.gen.current": pcie["gen"],
        "pcie.link.gen.max": pcie["max_gen"],
        "pcie.link.width.current": pcie["width"],
        "pcie.link.width.max": pcie["max_width"],
        "nvlink.active": nvlink if is_na(nvlink) else sum(nvlink),
        "nvlink.links": nvlink if is_na(nvlink) else len(nvlink),
        "compute_processes": gw.compute_processes(h),
    }
    if not is_na(nvlink):
        totals = {"replay": 0, "recovery": 0, "crc_flit": 0, "crc_data": 0}
        for link in range(len(nvlink)):
            for k, v in gw.nvlink_errors(h, link).items():
                if not is_na(v):
                    totals[k] += v
        fields["nvlink.errors"] = totals
    else:
        fields["nvlink.errors"] = nvlink
    na = {k: v.reason for k, v in fields.items() if isinstance(v, NotAvailable)}
    text = {k: (str(v) if not is_na(v) else "N/A") for k, v in
            (("name", fields["name"]), ("uuid", fields["uuid"]), ("bus", fields["pci.bus_id"]))}
    return GpuInfo(index, text["name"], text["uuid"], text["bus"], fields, na)


def read_gpus(gw: NvmlGateway) -> list[GpuInfo]:
    count = gw.device_count()
    return [] if is_na(count) else [read_gpu(gw, i) for i in range(count)]

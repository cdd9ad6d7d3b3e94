"""GPU verdicts from NVML snapshots: pure functions, one :class:`Check` per question.

Every check names its source (the NVML call, as ``nvidia-smi`` would show it), the
measurement, the threshold and a one-line explanation with the next step.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from ml_debug.core.nvml import CLOCK_EVENT_BITS, is_na
from ml_debug.health.result import Check, GpuInfo, Status
from ml_debug.health.xid import XidEvent, bus_matches


@dataclass
class Thresholds:
    """What passes. Defaults follow NVIDIA's field guidance where there is one."""

    corrected_ecc_max: int = 1000  # volatile corrected errors before a warning
    retired_pages_max: int = 60  # NVIDIA's RMA point is 64 retired pages (pre-Ampere)
    temperature_margin_c: int = 5  # warn this close to the GPU's own slowdown temperature
    power_limit_drop: float = 0.95  # enforced limit below this share of the default: warn
    nvlink_error_max: int = 0  # replay/recovery/CRC counts above this: warn
    outlier_pct: float = 10.0  # a GPU this % below the median of identical GPUs fails
    peak_fraction_min: float = 0.5  # achieved matmul TFLOPs below this share of the known peak: warn
    bandwidth_fraction_min: float = 0.5  # H2D/D2H below this share of the PCIe link's rate: warn


RECOVERY_ACTIONS = {
    0: ("none", ""),
    1: ("GPU reset", "the driver asks for a GPU reset: drain the GPU, then `nvidia-smi -r -i <index>`"),
    2: ("node reboot", "the driver asks for a node reboot: drain the node and reboot it"),
    3: ("drain P2P", "the driver asks to stop peer-to-peer traffic: drain the node, then reset"),
    4: ("drain and reset", "the driver asks to drain the GPU and reset it"),
    5: ("recover IMEX domain", "recover the IMEX domain (multi-node NVLink) per NVIDIA's runbook"),
    6: ("bus reset", "the driver asks for a PCIe bus reset: reboot the node"),
    7: ("system reboot", "the driver asks for a full system reboot"),
}

SEVERE_CLOCK_EVENTS = {"hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown"}


def _fmt(v: Any) -> str:
    return "N/A" if is_na(v) else str(v)


def _na(gpu: GpuInfo, key: str) -> str:
    return gpu.na.get(key, "not available")


def _skip(cid: str, target: str, gpu: GpuInfo, key: str, source: str) -> Check:
    return Check(cid, target, Status.SKIP, "N/A", "-", f"not reported by this GPU/driver ({_na(gpu, key)})", source)


def check_count(n_found: int, expected: int | None) -> Check:
    """GPU count against --expect-gpus (``nvidia-smi -L | wc -l``)."""
    src = "NVML nvmlDeviceGetCount"
    if expected is None:
        return Check("gpu.count", "node", Status.INFO, str(n_found), "(no --expect-gpus)", "", src)
    if n_found == expected:
        return Check("gpu.count", "node", Status.PASS, str(n_found), f"== {expected}", "", src)
    if n_found < expected:
        return Check("gpu.count", "node", Status.FAIL, str(n_found), f"== {expected}",
                     f"{expected - n_found} GPU(s) missing: one fell off the bus or the driver failed to init it; "
                     "look for Xid 79 in dmesg and `lspci | grep -i nvidia`, then reboot/drain", src)
    return Check("gpu.count", "node", Status.WARN, str(n_found), f"== {expected}",
                 "more GPUs than expected: is --expect-gpus right, or CUDA_VISIBLE_DEVICES hiding some from jobs?", src)


def check_ecc(gpu: GpuInfo, th: Thresholds) -> list[Check]:
    t, f = f"gpu{gpu.index}", gpu.fields
    src = "NVML nvmlDeviceGetTotalEccErrors (nvidia-smi -q -d ECC)"
    out: list[Check] = []
    mode = f["ecc.mode.current"]
    if is_na(mode):
        return [_skip("gpu.ecc_mode", t, gpu, "ecc.mode.current", "NVML nvmlDeviceGetEccMode")]
    if not mode:
        out.append(Check("gpu.ecc_mode", t, Status.WARN, "off", "on",
                         "ECC is off: memory errors go undetected and silently corrupt training; "
                         "`nvidia-smi -e 1 -i <index>` then reset the GPU", "NVML nvmlDeviceGetEccMode"))
        return out
    out.append(Check("gpu.ecc_mode", t, Status.PASS, "on", "on", "", "NVML nvmlDeviceGetEccMode"))
    unc_v = f["ecc.errors.uncorrected.volatile.total"]
    if is_na(unc_v):
        out.append(_skip("gpu.ecc_uncorrected_volatile", t, gpu, "ecc.errors.uncorrected.volatile.total", src))
    elif unc_v > 0:
        out.append(Check("gpu.ecc_uncorrected_volatile", t, Status.FAIL, str(unc_v), "0",
                         "uncorrectable memory errors since the driver loaded: results on this GPU can be wrong; "
                         "drain it and reset the GPU (nvidia-smi -r), then check row remapping", src, {"count": unc_v}))
    else:
        out.append(Check("gpu.ecc_uncorrected_volatile", t, Status.PASS, "0", "0", "", src))
    unc_a = f["ecc.errors.uncorrected.aggregate.total"]
    if not is_na(unc_a) and unc_a > 0:
        out.append(Check("gpu.ecc_uncorrected_aggregate", t, Status.WARN, str(unc_a), "0",
                         "uncorrectable errors over the GPU's lifetime: fine if row remapping absorbed them "
                         "(remapped_rows.failure = 0); repeated growth means RMA", src, {"count": unc_a}))
    cor_v = f["ecc.errors.corrected.volatile.total"]
    if not is_na(cor_v):
        status = Status.WARN if cor_v > th.corrected_ecc_max else Status.PASS
        hint = ("many corrected memory errors since the driver loaded: memory is degrading; "
                "watch the rate, plan an RMA if it keeps growing") if status is Status.WARN else ""
        out.append(Check("gpu.ecc_corrected_volatile", t, status, str(cor_v), f"<= {th.corrected_ecc_max}", hint,
                         src, {"count": cor_v}))
    return out


def check_memory_repair(gpu: GpuInfo, th: Thresholds) -> list[Check]:
    """Row remapping (Ampere+) or page retirement (pre-Ampere), whichever the GPU reports."""
    t, f = f"gpu{gpu.index}", gpu.fields
    out: list[Check] = []
    if not is_na(f["remapped_rows.pending"]):
        src = "NVML nvmlDeviceGetRemappedRows (nvidia-smi -q -d ROW_REMAPPER)"
        pending, failed = f["remapped_rows.pending"], f["remapped_rows.failure"]
        value = (f"pending={'yes' if pending else 'no'} failed={'yes' if failed else 'no'} "
                 f"rows unc={f['remapped_rows.uncorrectable']} corr={f['remapped_rows.correctable']}")
        data = {k.split(".")[1]: f[k] for k in ("remapped_rows.correctable", "remapped_rows.uncorrectable",
                                                 "remapped_rows.pending", "remapped_rows.failure")}
        if failed:
            out.append(Check("gpu.row_remap", t, Status.FAIL, value, "no pending, no failure",
                             "row remapping failed: the GPU has no spare rows left for bad memory; drain it and RMA",
                             src, data))
        elif pending:
            out.append(Check("gpu.row_remap", t, Status.FAIL, value, "no pending, no failure",
                             "a row remap is pending: the bad memory row is still in use until the GPU is reset; "
                             "drain it and `nvidia-smi -r -i <index>` (or reboot)", src, data))
        else:
            out.append(Check("gpu.row_remap", t, Status.PASS, value, "no pending, no failure", "", src, data))
    elif not is_na(f["retired_pages.pending"]):
        src = "NVML nvmlDeviceGetRetiredPages (nvidia-smi -q -d PAGE_RETIREMENT)"
        sbe, dbe = f["retired_pages.single_bit_ecc.count"], f["retired_pages.double_bit.count"]
        total = (0 if is_na(sbe) else sbe) + (0 if is_na(dbe) else dbe)
        value = f"retired={total} (sbe={_fmt(sbe)} dbe={_fmt(dbe)}) pending={'yes' if f['retired_pages.pending'] else 'no'}"
        if f["retired_pages.pending"]:
            out.append(Check("gpu.retired_pages", t, Status.FAIL, value, f"no pending, < {th.retired_pages_max}",
                             "a page retirement is pending: reset the GPU so the bad page leaves service", src))
        elif total >= th.retired_pages_max:
            out.append(Check("gpu.retired_pages", t, Status.FAIL, value, f"< {th.retired_pages_max}",
                             "near NVIDIA's 64-page retirement limit: RMA the GPU", src))
        else:
            out.append(Check("gpu.retired_pages", t, Status.PASS, value, f"< {th.retired_pages_max}", "", src))
    else:
        out.append(_skip("gpu.row_remap", t, gpu, "remapped_rows.pending", "NVML nvmlDeviceGetRemappedRows"))
    return out


def check_recovery_action(gpu: GpuInfo) -> Check:
    t, v = f"gpu{gpu.index}", gpu.fields["recovery_action"]
    src = "NVML field NVML_FI_DEV_GET_GPU_RECOVERY_ACTION"
    if is_na(v):
        return _skip("gpu.recovery_action", t, gpu, "recovery_action", src)
    name, hint = RECOVERY_ACTIONS.get(int(v), (f"action {v}", "unknown recovery action: see nvidia-smi -q"))
    return Check("gpu.recovery_action", t, Status.PASS if v == 0 else Status.FAIL, name, "none", hint, src,
                 {"action": v})


def clock_event_names(mask: int) -> list[str]:
    return [name for bit, name in CLOCK_EVENT_BITS.items() if mask & bit]


def check_clock_events(gpu: GpuInfo) -> Check:
    t, mask = f"gpu{gpu.index}", gpu.fields["clocks_event_reasons.active"]
    src = "NVML nvmlDeviceGetCurrentClocksEventReasons (nvidia-smi -q -d PERFORMANCE)"
    if is_na(mask):
        return _skip("gpu.clock_events", t, gpu, "clocks_event_reasons.active", src)
    names = clock_event_names(mask)
    value = ",".join(names) or "none"
    severe = sorted(SEVERE_CLOCK_EVENTS.intersection(names))
    data = {"mask": mask, "reasons": names}
    if severe:
        why = {"hw_slowdown": "hardware slowdown (power or thermal event signalled by the board)",
               "hw_thermal_slowdown": "hardware thermal slowdown: the GPU is too hot",
               "hw_power_brake_slowdown": "power brake: the system asserted the power-brake signal (PSU/power delivery)"}
        return Check("gpu.clock_events", t, Status.FAIL, value, "no hw slowdown/thermal/power brake",
                     "; ".join(why[s] for s in severe) + ": this GPU runs slow and drags every rank; check cooling, "
                     "fans, airflow and PSUs (nvidia-smi -q -d PERFORMANCE,TEMPERATURE)", src, data)
    if "sw_thermal_slowdown" in names:
        return Check("gpu.clock_events", t, Status.WARN, value, "no sw thermal slowdown",
                     "the driver lowered clocks to stay under the temperature target: check cooling", src, data)
    return Check("gpu.clock_events", t, Status.PASS, value, "no hw slowdown/thermal/power brake",
                 "sw_power_cap under load is normal" if "sw_power_cap" in names else "", src, data)


def check_temperature(gpu: GpuInfo, th: Thresholds) -> Check:
    t, f = f"gpu{gpu.index}", gpu.fields
    temp, slow = f["temperature.gpu"], f["temperature.slowdown"]
    src = "NVML nvmlDeviceGetTemperature / nvmlDeviceGetTemperatureThreshold(SLOWDOWN)"
    if is_na(temp):
        return _skip("gpu.temperature", t, gpu, "temperature.gpu", src)
    if is_na(slow):
        return Check("gpu.temperature", t, Status.INFO, f"{temp} C", "slowdown N/A", "", src, {"celsius": temp})
    thr = f"< {slow - th.temperature_margin_c} C (slowdown {slow} C)"
    data = {"celsius": temp, "slowdown_celsius": slow}
    if temp >= slow:
        return Check("gpu.temperature", t, Status.FAIL, f"{temp} C", thr,
                     "at or above the GPU's own slowdown temperature: clocks are being cut; fix cooling", src, data)
    if temp >= slow - th.temperature_margin_c:
        return Check("gpu.temperature", t, Status.WARN, f"{temp} C", thr,
                     "close to the slowdown temperature: check fans and airflow", src, data)
    return Check("gpu.temperature", t, Status.PASS, f"{temp} C", thr, "", src, data)


def check_power(gpu: GpuInfo, th: Thresholds) -> Check:
    t, f = f"gpu{gpu.index}", gpu.fields
    draw, limit, default = f["power.draw"], f["enforced.power.limit"], f["power.default_limit"]
    src = "NVML nvmlDeviceGetPowerUsage / nvmlDeviceGetEnforcedPowerLimit (nvidia-smi -q -d POWER)"
    if is_na(limit):
        return _skip("gpu.power", t, gpu, "enforced.power.limit", src)
    value = f"{_fmt(draw if is_na(draw) else round(draw))} W / {limit:.0f} W"
    data = {"draw_w": draw, "limit_w": limit, "default_limit_w": default}
    if not is_na(default) and limit < default * th.power_limit_drop:
        return Check("gpu.power", t, Status.WARN, value, f"limit = default {default:.0f} W",
                     f"power limit lowered to {limit:.0f} W from the default {default:.0f} W: this GPU will be slower "
                     f"than its siblings; restore with `nvidia-smi -pl {default:.0f} -i <index>`", src, data)
    return Check("gpu.power", t, Status.PASS, value, "limit = default" if not is_na(default) else "-", "", src, data)


def check_persistence(gpu: GpuInfo) -> Check:
    t, v = f"gpu{gpu.index}", gpu.fields["persistence_mode"]
    src = "NVML nvmlDeviceGetPersistenceMode"
    if is_na(v):
        return _skip("gpu.persistence", t, gpu, "persistence_mode", src)
    if not v:
        return Check("gpu.persistence", t, Status.WARN, "off", "on",
                     "persistence mode off: each job pays driver init and settings can reset between jobs; "
                     "run nvidia-persistenced (or `nvidia-smi -pm 1`)", src)
    return Check("gpu.persistence", t, Status.PASS, "on", "on", "", src)


def check_pcie(gpu: GpuInfo, *, under_load: bool = False, link: dict[str, Any] | None = None) -> Check:
    """PCIe generation/width now vs max. Idle GPUs train the link down to save power, so a lower
    generation only fails when it was sampled under load (``--level 2`` samples it during H2D copies)."""
    t, f = f"gpu{gpu.index}", gpu.fields
    if link is None:
        link = {"gen": f["pcie.link.gen.current"], "max_gen": f["pcie.link.gen.max"],
                "width": f["pcie.link.width.current"], "max_width": f["pcie.link.width.max"]}
    src = "NVML nvmlDeviceGetCurr/MaxPcieLinkGeneration/Width (nvidia-smi -q -d PCIE)"
    cid = "gpu.pcie_link_load" if under_load else "gpu.pcie_link"
    if any(is_na(v) for v in link.values()):
        return _skip(cid, t, gpu, "pcie.link.gen.current", src)
    value = f"Gen{link['gen']} x{link['width']}"
    thr = f"Gen{link['max_gen']} x{link['max_width']}"
    data = dict(link, under_load=under_load)
    if link["width"] < link["max_width"]:
        return Check(cid, t, Status.FAIL, value, thr,
                     f"link width x{link['width']} below x{link['max_width']}: a bad riser/slot or lane failure; "
                     "reseat the GPU/riser, check `lspci -vv` LnkSta", src, data)
    if link["gen"] < link["max_gen"]:
        if under_load:
            return Check(cid, t, Status.FAIL, value, thr,
                         f"link stays at Gen{link['gen']} under load (max Gen{link['max_gen']}): host-device copies "
                         "are slow; check BIOS PCIe settings, riser, `lspci -vv` LnkSta", src, data)
        return Check(cid, t, Status.INFO, value, thr,
                     "idle GPUs train the link down to save power: compare under load (--level 2 samples it during "
                     "copies)", src, data)
    return Check(cid, t, Status.PASS, value, thr, "", src, data)


def check_nvlink(gpu: GpuInfo, th: Thresholds) -> list[Check]:
    t, f = f"gpu{gpu.index}", gpu.fields
    src = "NVML nvmlDeviceGetNvLinkState / nvmlDeviceGetNvLinkErrorCounter (nvidia-smi nvlink -s / -e)"
    active, links = f["nvlink.active"], f["nvlink.links"]
    if is_na(active):
        return []  # no NVLink on this GPU (PCIe card): nothing to say
    out: list[Check] = []
    value = f"{active}/{links} active"
    if active < links:
        out.append(Check("gpu.nvlink", t, Status.FAIL, value, f"{links}/{links} active",
                         f"{links - active} NVLink(s) down: collectives fall back to slower paths or hang; "
                         "reset the GPU, check the NVSwitch/fabric manager (nvidia-smi nvlink -s)", src))
    else:
        out.append(Check("gpu.nvlink", t, Status.PASS, value, f"{links}/{links} active", "", src))
    errs = f["nvlink.errors"]
    if not is_na(errs):
        bad = {k: v for k, v in errs.items() if v > th.nvlink_error_max}
        value = " ".join(f"{k}={v}" for k, v in errs.items())
        if bad:
            out.append(Check("gpu.nvlink_errors", t, Status.WARN, value, f"each <= {th.nvlink_error_max}",
                             "NVLink replays/recoveries/CRC errors: a marginal link; if they grow during a job, "
                             "reset the GPUs and check the NVSwitch trays", src, errs))
        else:
            out.append(Check("gpu.nvlink_errors", t, Status.PASS, value, f"each <= {th.nvlink_error_max}", "", src, errs))
    return out


def check_processes(gpu: GpuInfo, own_pids: set[int] | None = None) -> Check:
    t, procs = f"gpu{gpu.index}", gpu.fields["compute_processes"]
    src = "NVML nvmlDeviceGetComputeRunningProcesses (nvidia-smi --query-compute-apps)"
    if is_na(procs):
        return _skip("gpu.processes", t, gpu, "compute_processes", src)
    own = own_pids if own_pids is not None else {os.getpid()}
    others = [(pid, used) for pid, used in procs if pid not in own]
    if not others:
        return Check("gpu.processes", t, Status.PASS, "none", "none before a job", "", src)
    mib = sum(u for _, u in others if u) // 2**20
    pids = ",".join(str(p) for p, _ in others[:6])
    return Check("gpu.processes", t, Status.WARN, f"{len(others)} proc(s), {mib} MiB", "none before a job",
                 f"processes hold GPU memory (pids {pids}): a leftover from a dead job will make the next one OOM "
                 "or slow; `nvidia-smi --query-compute-apps=pid,name --format=csv`, then kill them", src,
                 {"processes": [{"pid": p, "used_bytes": u} for p, u in others]})


def check_xids(gpu: GpuInfo, events: list[XidEvent] | None, reason: str) -> Check:
    t = f"gpu{gpu.index}"
    src = f"kernel log {reason}"
    if events is None:
        return Check("gpu.xid", t, Status.SKIP, "N/A", "no Xid", reason, "kernel log")
    mine = [e for e in events if gpu.bus_id != "N/A" and bus_matches(gpu.bus_id, e.bus_id)]
    if not mine:
        return Check("gpu.xid", t, Status.PASS, "none", "no Xid since boot", "", src)
    xids = sorted({e.xid for e in mine})
    worst = next((e for e in mine if e.severity in ("hardware", "reset", "unknown")), None)
    value = ",".join(str(x) for x in xids) + f" ({len(mine)} events)"
    counts: dict[int, int] = {}
    for e in mine:  # every event, not only the 20 kept: `mldebug exporter` serves them as counts
        counts[e.xid] = counts.get(e.xid, 0) + 1
    data = {"events": [{"xid": e.xid, "detail": e.detail, "meaning": e.meaning} for e in mine[-20:]],
            "counts": counts}
    if worst is not None:
        return Check("gpu.xid", t, Status.FAIL, value, "no Xid since boot",
                     f"Xid {worst.xid} {worst.meaning}: {worst.action}", src, data)
    e = mine[-1]
    return Check("gpu.xid", t, Status.WARN, value, "no Xid since boot",
                 f"Xid {e.xid} {e.meaning} (usually the application): {e.action}", src, data)


def check_consistency(gpus: list[GpuInfo]) -> list[Check]:
    """VBIOS versions must agree among identical GPUs (a mixed node behaves unevenly)."""
    out: list[Check] = []
    by_name: dict[str, dict[str, list[int]]] = {}
    for g in gpus:
        v = g.fields.get("vbios_version")
        if v is None or is_na(v):
            continue
        by_name.setdefault(g.name, {}).setdefault(str(v), []).append(g.index)
    for name, versions in by_name.items():
        if len(versions) > 1:
            value = "; ".join(f"{v}: gpu{','.join(map(str, idx))}" for v, idx in versions.items())
            out.append(Check("gpu.vbios_match", "node", Status.WARN, value, "one VBIOS per model",
                             f"{name} GPUs run different VBIOS versions: flash them to one version so they behave "
                             "alike", "NVML nvmlDeviceGetVbiosVersion"))
        elif versions:
            out.append(Check("gpu.vbios_match", "node", Status.PASS, next(iter(versions)), "one VBIOS per model", "",
                             "NVML nvmlDeviceGetVbiosVersion"))
    return out


def checks_for_gpu(gpu: GpuInfo, th: Thresholds, xids: list[XidEvent] | None, xid_reason: str) -> list[Check]:
    """Every passive (level 1) check of one GPU."""
    out: list[Check] = []
    out += check_ecc(gpu, th)
    out += check_memory_repair(gpu, th)
    out.append(check_recovery_action(gpu))
    out.append(check_clock_events(gpu))
    out.append(check_temperature(gpu, th))
    out.append(check_power(gpu, th))
    out.append(check_persistence(gpu))
    out.append(check_pcie(gpu))
    out += check_nvlink(gpu, th)
    out.append(check_processes(gpu))
    out.append(check_xids(gpu, xids, xid_reason))
    for c in out:  # hints name the GPU to act on, ready to paste
        c.hint = c.hint.replace("<index>", str(gpu.index))
    return out

"""One node's GPUs at one moment, through the NVML gateway (what `nvidia-smi dmon` shows), and its Xids.

Every value may be N/A (a consumer card has no ECC, a virtual GPU no power reading); N/A becomes
None in the sample, so a CPU-only node and a GPU that lacks a counter look the same to the client:
"no value", never a crash.
"""

from __future__ import annotations

import errno
import os
import re
import time
from typing import Any

from ml_debug.core.nvml import CLOCK_EVENT_BITS, NvmlGateway, is_na, open_gateway
from ml_debug.sampling.sample import GpuSample, NvmlStatus

BADGE_WORDS = {
    "sw_power_cap": "power-cap",
    "hw_slowdown": "hw-slowdown",
    "sw_thermal_slowdown": "thermal",
    "hw_thermal_slowdown": "hw-thermal",
    "hw_power_brake_slowdown": "power-brake",
}
"""Clock-event reasons worth a badge, and the word shown for each. Idle, application clocks, sync
boost and display clocks are normal operation, not a reason to look."""

XID_RECENT_S = 3600.0
"""Xids logged this long before the agent started are shown too (older ones are history)."""

_XID_RE = re.compile(rb"NVRM: Xid \(PCI:([0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})[^)]*\):\s*(\d+)")


def _value(v: Any) -> Any:
    return None if is_na(v) else v


def _bus_key(bus_id: str) -> str:
    """"00000000:3B:00.0" (NVML) and "0000:3b:00" (the driver's Xid line) -> "3b:00" + domain number."""
    parts = bus_id.lower().split(":")
    if len(parts) < 3:
        return bus_id.lower()
    try:
        domain = int(parts[-3], 16)
    except ValueError:
        domain = 0
    return f"{domain:x}:{parts[-2]}:{parts[-1].split('.')[0]}"


class XidWatch:
    """New Xid records from the kernel log (/dev/kmsg, what ``dmesg`` reads), read without blocking."""

    def __init__(self) -> None:
        self.reason: str | None = None
        self.seen: dict[str, list[int]] = {}  # bus key -> Xids, oldest first
        self._fd: int | None = None
        try:
            self._fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as e:
            self.reason = f"/dev/kmsg not readable: {e.strerror} (needs root or CAP_SYSLOG)"
            return
        try:
            with open("/proc/uptime", "rb") as f:
                uptime_us = float(f.read().split()[0]) * 1e6
        except (OSError, ValueError, IndexError):
            uptime_us = 0.0
        self._since_us = uptime_us - XID_RECENT_S * 1e6
        self.poll()
        self._since_us = 0.0

    def poll(self) -> None:
        """Read what the kernel logged since the last call (bounded: at most 4096 records)."""
        if self._fd is None:
            return
        for _ in range(4096):
            try:
                rec = os.read(self._fd, 8192)
            except OSError as e:
                if e.errno == errno.EPIPE:  # overwritten while we read: skip it
                    continue
                if e.errno != errno.EAGAIN:
                    self.reason = f"/dev/kmsg read failed: {e.strerror}"
                    self.close()
                return
            if not rec:
                return
            head, _, message = rec.partition(b";")
            if b"Xid" not in message:
                continue
            fields = head.split(b",")
            try:
                if len(fields) > 2 and float(fields[2]) < self._since_us:
                    continue
            except ValueError:
                pass
            m = _XID_RE.search(message)
            if m:
                self.seen.setdefault(_bus_key(m.group(1).decode()), []).append(int(m.group(2)))

    def for_bus(self, bus_id: Any) -> list[int] | None:
        if self.reason is not None and self._fd is None:
            return None
        if not isinstance(bus_id, str):
            return []
        return self.seen.get(_bus_key(bus_id), [])[-5:]

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class GpuSampler:
    """Opens NVML once; :meth:`sample` reads every GPU (a few calls each, well under a millisecond)."""

    LIMIT_REFRESH_S = 30.0

    def __init__(self, gateway: NvmlGateway | None = None) -> None:
        self.gw = gateway if gateway is not None else open_gateway()
        status = self.gw.open()
        self.available = status.available
        self.reason = status.reason
        self.source = self.gw.source
        self.handles: list[Any] = []
        self._static: list[dict[str, Any]] = []
        self._limits: dict[int, tuple[float, Any]] = {}
        self.xids: XidWatch | None = None
        if not self.available:
            return
        count = self.gw.device_count()
        for i in range(0 if is_na(count) else int(count)):
            h = self.gw.handle(i)
            self.handles.append(h)
            mem = self.gw.memory(h)
            self._static.append({"index": i, "name": _value(self.gw.name(h)), "uuid": _value(self.gw.uuid(h)),
                                 "bus_id": _value(self.gw.pci_bus_id(h)),
                                 "mem_total_bytes": None if is_na(mem) else mem[0]})
        self.xids = XidWatch()

    def status(self) -> NvmlStatus:
        return NvmlStatus(available=self.available, reason=self.reason, source=self.source,
                          xid_reason=self.xids.reason if self.xids is not None and self.xids.reason else None)

    def _power_limit(self, i: int, h: Any) -> Any:
        now = time.monotonic()
        cached = self._limits.get(i)
        if cached is None or now - cached[0] > self.LIMIT_REFRESH_S:
            cached = self._limits[i] = (now, self.gw.power_limit_watts(h))
        return cached[1]

    def sample(self) -> list[GpuSample]:
        """Every GPU now; values NVML cannot give are None."""
        if not self.available:
            return []
        if self.xids is not None:
            self.xids.poll()
        out = []
        for i, h in enumerate(self.handles):
            static = self._static[i]
            mem = self.gw.memory(h)
            power = _value(self.gw.power_watts(h))
            limit = _value(self._power_limit(i, h))
            reasons = self.gw.clock_event_reasons(h)
            throttle = [] if is_na(reasons) else [name for bit, name in CLOCK_EVENT_BITS.items()
                                                  if int(reasons) & bit and name in BADGE_WORDS]
            procs = self.gw.compute_processes(h)
            ecc = self.gw.ecc_errors(h, uncorrected=True, aggregate=False)
            total = static["mem_total_bytes"]
            out.append(GpuSample(
                index=i, name=static["name"], uuid=static["uuid"], bus_id=static["bus_id"],
                mem_total_bytes=mem[0] if total is None and not is_na(mem) else total,
                util_pct=_value(self.gw.utilization(h)),
                power_w=None if power is None else round(float(power), 1),
                power_limit_w=None if limit is None else round(float(limit), 1),
                power_pct=None if power is None or not limit else round(100.0 * float(power) / float(limit), 1),
                mem_used_bytes=None if is_na(mem) else mem[1],
                temp_c=_value(self.gw.temperature(h)),
                throttle=None if is_na(reasons) else throttle,
                ecc_uncorrected=_value(ecc),
                xid=self.xids.for_bus(static["bus_id"]) if self.xids is not None else None,
                pids=None if is_na(procs) else sorted(p[0] for p in procs),
            ))
        return out

    def close(self) -> None:
        if self.xids is not None:
            self.xids.close()
        self.gw.close()

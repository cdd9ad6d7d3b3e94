"""Xid events from the kernel log (``dmesg | grep Xid``) and what the common ones mean."""

from __future__ import annotations

import errno
import os
import re
from dataclasses import dataclass

# severity: "app" = usually the application's fault (restart it, fix the code);
# "reset" = the GPU needs a reset/drain before it is trusted again; "hardware" = field/RMA path.
XID_TABLE: dict[int, tuple[str, str, str]] = {
    8: ("GPU stopped processing (channel idle timeout)", "app", "restart the job; if it repeats, reset the GPU"),
    13: ("Graphics engine exception", "app", "usually an out-of-bounds access in a kernel: run with "
         "compute-sanitizer; if it follows other Xids, treat it as hardware"),
    31: ("GPU memory page fault", "app", "illegal memory access in the application or a library: "
         "CUDA_LAUNCH_BLOCKING=1 and compute-sanitizer find it"),
    32: ("Invalid or corrupted push buffer stream", "reset", "driver or PCIe corruption: check PCIe errors, reset the GPU"),
    38: ("Driver firmware error", "reset", "reset the GPU; update the driver if it repeats"),
    43: ("GPU stopped processing (user channel fault)", "app", "an application fault; the GPU itself is usually fine"),
    45: ("Preemptive cleanup after earlier errors", "app", "processes were killed after another error: look at "
         "the Xid logged before this one"),
    48: ("Double-bit (uncorrectable) ECC error", "reset", "drain the node and reset the GPU; check row remapping "
         "and retired pages"),
    61: ("Internal micro-controller breakpoint/warning", "reset", "reset the GPU; report with nvidia-bug-report.sh if it repeats"),
    62: ("Internal micro-controller halt", "reset", "reset the GPU or reboot the node"),
    63: ("ECC page retirement / row remapping recorded", "reset", "reset the GPU so the remap takes effect"),
    64: ("ECC page retirement / row remapping recording failed", "hardware", "the GPU could not record the bad "
         "memory: RMA candidate"),
    68: ("Video processor (NVDEC) exception", "app", "video decode error; restart the application"),
    69: ("Graphics engine class error", "app", "restart the application; reset the GPU if it repeats"),
    74: ("NVLink error", "hardware", "check `nvidia-smi nvlink -e` and the link's cabling/NVSwitch; reset the GPUs "
         "on that link"),
    79: ("GPU has fallen off the bus", "hardware", "the GPU stopped answering on PCIe: reboot the node, then check "
         "power, riser and slot; RMA if it repeats"),
    92: ("High single-bit ECC error rate", "hardware", "memory is degrading: watch corrected ECC counts, plan an RMA"),
    94: ("Contained ECC error", "reset", "the affected processes were stopped; restart them and reset the GPU when idle"),
    95: ("Uncontained ECC error", "reset", "every process on this GPU is affected: drain and reset the GPU"),
    109: ("Context switch timeout", "app", "restart the job; if it repeats, reset the GPU"),
    119: ("GSP RPC timeout", "reset", "the GPU's firmware stopped answering: reset the GPU or reboot"),
    120: ("GSP error", "reset", "reset the GPU; update the driver if it repeats"),
    121: ("C2C link corrected error", "hardware", "watch for repeats on Grace Hopper/Blackwell C2C links"),
    140: ("Unrecovered ECC error", "reset", "drain and reset the GPU"),
    143: ("GPU initialization failure", "hardware", "reboot; RMA if it repeats"),
    154: ("GPU recovery action changed", "reset", "read the recovery action (nvidia-smi -q) and do what it says"),
}

_XID_RE = re.compile(r"NVRM: Xid \(PCI:([0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-9a-fA-F])?)\):\s*(\d{1,18})"
                     r"(?:,\s*(.*))?")


@dataclass
class XidEvent:
    bus_id: str  # "0000:3b:00" as the driver prints it
    xid: int
    detail: str
    meaning: str
    severity: str
    action: str


def describe(xid: int) -> tuple[str, str, str]:
    """(meaning, severity, next step) for an Xid; unknown ones point at NVIDIA's catalog."""
    return XID_TABLE.get(xid, ("not in mldebug's table", "unknown",
                               "look it up in NVIDIA's Xid catalog (docs.nvidia.com/deploy/xid-errors)"))


def parse_xids(lines: list[str]) -> list[XidEvent]:
    """Xid events in kernel-log lines (dmesg or /dev/kmsg format)."""
    out = []
    for line in lines:
        m = _XID_RE.search(line)
        if m:
            xid = int(m.group(2))
            meaning, severity, action = describe(xid)
            out.append(XidEvent(m.group(1).lower(), xid, (m.group(3) or "").strip()[:160], meaning, severity, action))
    return out


def bus_matches(nvml_bus_id: str, xid_bus_id: str) -> bool:
    """NVML says "00000000:3B:00.0", the driver's Xid line "0000:3b:00"."""
    a = nvml_bus_id.lower().split(":")
    b = xid_bus_id.lower().split(":")
    if len(a) < 3 or len(b) < 3:
        return False
    return a[-2] == b[-2] and a[-1].split(".")[0] == b[-1].split(".")[0] and int(a[-3], 16) == int(b[-3], 16)


def read_kernel_log(max_bytes: int = 64 * 2**20) -> tuple[list[str] | None, str]:
    """The kernel ring buffer via /dev/kmsg (what ``dmesg`` reads); (None, reason) when not readable.

    Non-blocking, so it returns at the end of the buffer instead of waiting for new lines.
    """
    try:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    except OSError as e:
        return None, f"/dev/kmsg not readable: {e.strerror} (needs root or CAP_SYSLOG; try `sudo dmesg | grep Xid`)"
    lines: list[str] = []
    total = 0
    try:
        while total < max_bytes:
            try:
                rec = os.read(fd, 8192)
            except OSError as e:
                if e.errno == errno.EAGAIN:
                    break
                if e.errno == errno.EPIPE:  # the record was overwritten while reading: skip it
                    continue
                return None, f"/dev/kmsg read failed: {e.strerror}"
            if not rec:
                break
            total += len(rec)
            # "<prio>,<seq>,<usec>,<flags>;<message>" then continuation lines
            text = rec.decode(errors="replace")
            lines.append(text.split(";", 1)[-1].split("\n", 1)[0])
    finally:
        os.close(fd)
    return lines, f"/dev/kmsg ({len(lines)} records)"

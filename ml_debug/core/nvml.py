"""The one NVML gateway: every call into nvidia-ml-py (``pynvml``) goes through here.

Each getter returns a plain value or :data:`NA` (a :class:`NotAvailable` carrying the
reason: "Not Supported", "Insufficient Permissions", a missing function in an old
binding...). Nothing here raises because a GPU lacks a feature: a consumer card without
ECC or a PCIe card without NVLink reads as N/A, never as a crash.

The backend is the ``pynvml`` module itself, or (tests only) a look-alike exposing the same
function names. :func:`open_gateway` uses one only when a test hook module loaded through
``MLDEBUG_TEST_HOOKS`` (:mod:`ml_debug.core.testhooks`) provides an ``nvml_backend``; reports
then say ``nvml_source: "fake:..."`` and the human output FAKE NVML, so a fake can never pass
for real hardware.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pynvml

from ml_debug.core import testhooks


class NotAvailable:
    """The N/A sentinel: falsy, prints as ``N/A``, remembers why the value is missing."""

    __slots__ = ("reason",)

    def __init__(self, reason: str = "not available") -> None:
        self.reason = reason

    def __str__(self) -> str:
        return "N/A"

    def __repr__(self) -> str:
        return f"N/A({self.reason})"

    def __bool__(self) -> bool:
        return False

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NotAvailable)

    def __hash__(self) -> int:
        return hash(NotAvailable)


NA = NotAvailable()


def is_na(value: object) -> bool:
    return isinstance(value, NotAvailable)


def is_fake_source(source: str | None) -> bool:
    """True for data that came from a test's NVML look-alike, not from a GPU."""
    return bool(source) and str(source).startswith("fake:")


def _text(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode(errors="replace").rstrip("\x00")
    return value


@dataclass
class NvmlStatus:
    """Whether NVML could be used here and, when not, a sentence saying why."""

    available: bool
    reason: str
    source: str  # "pynvml" or "fake:<what>"


# Clock event (throttle) reason bits, as nvidia-smi -q -d PERFORMANCE names them.
CLOCK_EVENT_BITS: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}


class NvmlGateway:
    """Guarded access to NVML. ``nvidia-smi -q`` reads the same values."""

    def __init__(self, backend: Any = None, source: str = "pynvml") -> None:
        self._nv = backend if backend is not None else pynvml
        self.source = source
        self._open = False

    @property
    def fake(self) -> bool:
        """True when a test's NVML look-alike, not the driver, answers (see :func:`open_gateway`)."""
        return is_fake_source(self.source)

    # -- lifecycle -------------------------------------------------------------------------
    def open(self) -> NvmlStatus:
        """nvmlInit(); a missing library or driver becomes a plain "no NVIDIA GPU" reason."""
        try:
            self._nv.nvmlInit()
        except pynvml.NVMLError as e:
            code = getattr(e, "value", None)
            if code == pynvml.NVML_ERROR_LIBRARY_NOT_FOUND:
                why = "no NVIDIA GPU: the NVIDIA driver library libnvidia-ml.so.1 is not installed"
            elif code == pynvml.NVML_ERROR_DRIVER_NOT_LOADED:
                why = "no NVIDIA GPU: the NVIDIA kernel driver is not loaded (lsmod | grep nvidia)"
            elif code == pynvml.NVML_ERROR_NO_PERMISSION:
                why = "NVML refused access: no permission on /dev/nvidia* (check the container's device list)"
            else:
                why = f"NVML could not start: {e}"
            return NvmlStatus(False, why, self.source)
        except Exception as e:  # OSError from ctypes, an odd binding
            return NvmlStatus(False, f"NVML could not start: {type(e).__name__}: {e}", self.source)
        self._open = True
        count = self.device_count()
        if is_na(count):
            return NvmlStatus(False, f"NVML started but could not count GPUs: {count.reason}", self.source)
        if count == 0:
            return NvmlStatus(False, "no NVIDIA GPU: the driver is loaded but sees 0 GPUs", self.source)
        return NvmlStatus(True, f"{count} GPU(s)", self.source)

    def close(self) -> None:
        if self._open:
            self._call("nvmlShutdown")
            self._open = False

    def __enter__(self) -> NvmlGateway:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the guard -------------------------------------------------------------------------
    def _call(self, name: str, *args: Any) -> Any:
        fn = getattr(self._nv, name, None)
        if fn is None:
            return NotAvailable(f"{name} is missing from this nvidia-ml-py")
        try:
            return fn(*args)
        except pynvml.NVMLError as e:
            return NotAvailable(str(e))
        except Exception as e:  # a binding bug must not take the whole report down
            return NotAvailable(f"{type(e).__name__}: {e}")

    def _map(self, value: Any, fn: Any) -> Any:
        return value if is_na(value) else fn(value)

    # -- system ----------------------------------------------------------------------------
    def driver_version(self) -> Any:
        return self._map(self._call("nvmlSystemGetDriverVersion"), _text)

    def cuda_driver_version(self) -> Any:
        """CUDA version the driver supports, as "12.4" (nvidia-smi's top line)."""
        v = self._call("nvmlSystemGetCudaDriverVersion")
        return self._map(v, lambda x: f"{x // 1000}.{(x % 1000) // 10}")

    def device_count(self) -> Any:
        return self._call("nvmlDeviceGetCount")

    def handle(self, index: int) -> Any:
        return self._call("nvmlDeviceGetHandleByIndex", index)

    # -- identity --------------------------------------------------------------------------
    def name(self, h: Any) -> Any:
        return self._map(self._call("nvmlDeviceGetName", h), _text)

    def uuid(self, h: Any) -> Any:
        return self._map(self._call("nvmlDeviceGetUUID", h), _text)

    def pci_bus_id(self, h: Any) -> Any:
        return self._map(self._call("nvmlDeviceGetPciInfo", h), lambda p: _text(p.busId))

    def vbios_version(self, h: Any) -> Any:
        return self._map(self._call("nvmlDeviceGetVbiosVersion", h), _text)

    def memory(self, h: Any) -> Any:
        """(total, used) bytes."""
        return self._map(self._call("nvmlDeviceGetMemoryInfo", h), lambda m: (int(m.total), int(m.used)))

    # -- memory errors ---------------------------------------------------------------------
    def ecc_mode(self, h: Any) -> Any:
        """Current ECC mode: True on, False off."""
        return self._map(self._call("nvmlDeviceGetEccMode", h), lambda m: bool(m[0]))

    def ecc_errors(self, h: Any, *, uncorrected: bool, aggregate: bool) -> Any:
        """Total ECC error count (``nvidia-smi -q -d ECC``)."""
        kind = pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED if uncorrected else pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED
        counter = pynvml.NVML_AGGREGATE_ECC if aggregate else pynvml.NVML_VOLATILE_ECC
        return self._map(self._call("nvmlDeviceGetTotalEccErrors", h, kind, counter), int)

    def retired_pages(self, h: Any, *, double_bit: bool) -> Any:
        """Number of retired pages (pre-Ampere; ``nvidia-smi -q -d PAGE_RETIREMENT``)."""
        cause = (pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR if double_bit
                 else pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS)
        return self._map(self._call("nvmlDeviceGetRetiredPages", h, cause), len)

    def retired_pages_pending(self, h: Any) -> Any:
        return self._map(self._call("nvmlDeviceGetRetiredPagesPendingStatus", h), bool)

    def remapped_rows(self, h: Any) -> Any:
        """(correctable, uncorrectable, pending, failed) (Ampere+; ``nvidia-smi -q -d ROW_REMAPPER``)."""
        return self._map(self._call("nvmlDeviceGetRemappedRows", h),
                         lambda r: (int(r[0]), int(r[1]), bool(r[2]), bool(r[3])))

    def recovery_action(self, h: Any) -> Any:
        """The driver's recommended recovery action (0 none, 1 GPU reset, 2 node reboot, ...)."""
        values = self._call("nvmlDeviceGetFieldValues", h, [pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION])
        if is_na(values):
            return values
        return self._field_value(values[0])

    def _field_value(self, fv: Any) -> Any:
        if int(fv.nvmlReturn) != pynvml.NVML_SUCCESS:
            return NotAvailable(str(pynvml.NVMLError(int(fv.nvmlReturn))))
        member = {pynvml.NVML_VALUE_TYPE_DOUBLE: "dVal", pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
                  pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
                  pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
                  pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
                  pynvml.NVML_VALUE_TYPE_SIGNED_INT: "siVal"}.get(int(fv.valueType), "uiVal")
        return getattr(fv.value, member)

    # -- clocks, thermals, power -----------------------------------------------------------
    def clock_event_reasons(self, h: Any) -> Any:
        """Bit mask of why clocks are held down (``nvidia-smi -q -d PERFORMANCE``)."""
        v = self._call("nvmlDeviceGetCurrentClocksEventReasons", h)
        if is_na(v):  # drivers before 535 only know the old name
            v = self._call("nvmlDeviceGetCurrentClocksThrottleReasons", h)
        return self._map(v, int)

    def temperature(self, h: Any) -> Any:
        return self._map(self._call("nvmlDeviceGetTemperature", h, pynvml.NVML_TEMPERATURE_GPU), int)

    def temperature_slowdown(self, h: Any) -> Any:
        """The GPU's own slowdown temperature (°C)."""
        return self._map(self._call("nvmlDeviceGetTemperatureThreshold", h,
                                    pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN), int)

    def power_watts(self, h: Any) -> Any:
        return self._map(self._call("nvmlDeviceGetPowerUsage", h), lambda mw: mw / 1000.0)

    def power_limit_watts(self, h: Any) -> Any:
        return self._map(self._call("nvmlDeviceGetEnforcedPowerLimit", h), lambda mw: mw / 1000.0)

    def default_power_limit_watts(self, h: Any) -> Any:
        return self._map(self._call("nvmlDeviceGetPowerManagementDefaultLimit", h), lambda mw: mw / 1000.0)

    def persistence_mode(self, h: Any) -> Any:
        return self._map(self._call("nvmlDeviceGetPersistenceMode", h), bool)

    def utilization(self, h: Any) -> Any:
        return self._map(self._call("nvmlDeviceGetUtilizationRates", h), lambda u: int(u.gpu))

    def sm_clock_mhz(self, h: Any, *, maximum: bool = False) -> Any:
        fn = "nvmlDeviceGetMaxClockInfo" if maximum else "nvmlDeviceGetClockInfo"
        return self._map(self._call(fn, h, pynvml.NVML_CLOCK_SM), int)

    # -- links -----------------------------------------------------------------------------
    def pcie_link(self, h: Any) -> dict[str, Any]:
        """Current and maximum PCIe generation and width (``nvidia-smi -q -d PCIE``)."""
        return {
            "gen": self._map(self._call("nvmlDeviceGetCurrPcieLinkGeneration", h), int),
            "max_gen": self._map(self._call("nvmlDeviceGetMaxPcieLinkGeneration", h), int),
            "width": self._map(self._call("nvmlDeviceGetCurrPcieLinkWidth", h), int),
            "max_width": self._map(self._call("nvmlDeviceGetMaxPcieLinkWidth", h), int),
        }

    def nvlink_states(self, h: Any) -> Any:
        """Active flag per NVLink that exists; N/A on a GPU without NVLink (``nvidia-smi nvlink -s``)."""
        states: list[bool] = []
        first: Any = None
        for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
            s = self._call("nvmlDeviceGetNvLinkState", h, link)
            if is_na(s):
                first = first if first is not None else s
                continue
            states.append(bool(s))
        return states if states else (first if first is not None else NotAvailable("no NVLink"))

    def nvlink_errors(self, h: Any, link: int) -> dict[str, Any]:
        """DL error counters of one link (``nvidia-smi nvlink -e``)."""
        names = {"replay": pynvml.NVML_NVLINK_ERROR_DL_REPLAY, "recovery": pynvml.NVML_NVLINK_ERROR_DL_RECOVERY,
                 "crc_flit": pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT, "crc_data": pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA}
        return {k: self._map(self._call("nvmlDeviceGetNvLinkErrorCounter", h, link, c), int) for k, c in names.items()}

    # -- processes -------------------------------------------------------------------------
    def compute_processes(self, h: Any) -> Any:
        """[(pid, used bytes or None)] of processes holding a CUDA context on this GPU."""
        procs = self._call("nvmlDeviceGetComputeRunningProcesses", h)
        if is_na(procs):
            return procs
        out = []
        for p in procs:
            used = getattr(p, "usedGpuMemory", None)
            out.append((int(p.pid), int(used) if isinstance(used, int) else None))
        return out


def open_gateway() -> NvmlGateway:
    """The real gateway, or a test's NVML look-alike when a test hook module provides one."""
    fake = testhooks.call(testhooks.NVML_BACKEND)
    if fake is not None:
        backend, source = fake
        return NvmlGateway(backend, source=f"fake:{source}")
    return NvmlGateway()

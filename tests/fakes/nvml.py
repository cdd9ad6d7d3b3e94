"""FakeNVML: the project's only fake, standing in for ``pynvml`` at the NVML gateway.

It implements just the ``nvml*`` functions :class:`~ml_debug.core.nvml.NvmlGateway`
calls, with pynvml's signatures and return shapes, from a plain dict per GPU. A key left
out of a GPU's dict makes that call raise pynvml's own "Not Supported" error, exactly as a
GPU without the feature does. Tests hand it to ``NvmlGateway`` directly; a ``mldebug``
subprocess uses it when ``MLDEBUG_TEST_HOOKS=tests.fakes.nvml`` and
``MLDEBUG_TEST_NVML=<scenario.json>`` are set (:func:`env` builds both). Reports then say
``nvml_source: "fake:<scenario>"`` and the human output says FAKE NVML.
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml

from ml_debug.core.errors import UsageError
from tests.fakes import hooks_env

ENV = "MLDEBUG_TEST_NVML"


def _unsupported() -> pynvml.NVMLError:
    return pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)


def healthy_gpu(index: int = 0, name: str = "NVIDIA H100 80GB HBM3") -> dict[str, Any]:
    """A healthy, idle H100 SXM as NVML would describe it."""
    return {
        "name": name,
        "uuid": f"GPU-00000000-0000-0000-0000-00000000000{index}",
        "bus_id": f"00000000:{0x18 + index:02X}:00.0",
        "vbios": "96.00.74.00.01",
        "memory": [85520809984, 562036736],
        "ecc_mode": 1,
        "ecc": {"corrected_volatile": 0, "uncorrected_volatile": 0,
                "corrected_aggregate": 0, "uncorrected_aggregate": 0},
        "remapped_rows": [0, 0, 0, 0],
        "recovery_action": 0,
        "clock_event_reasons": 0x1,  # idle
        "temperature": 33,
        "temperature_slowdown": 87,
        "power_mw": 72000,
        "power_limit_mw": 700000,
        "default_power_limit_mw": 700000,
        "persistence": 1,
        "utilization": 0,
        "sm_clock": 345,
        "max_sm_clock": 1980,
        "pcie": [5, 5, 16, 16],
        "nvlink_states": [1] * 18,
        "nvlink_errors": {},
        "processes": [],
    }


class FakeNVML:
    """pynvml look-alike over a scenario: ``{"driver_version", "cuda_driver_version", "gpus": [...]}``."""

    def __init__(self, gpus: list[dict[str, Any]], driver_version: str = "550.54.15",
                 cuda_driver_version: int = 12040, init_error: int | None = None) -> None:
        self.gpus = [copy.deepcopy(g) for g in gpus]
        self.driver = driver_version
        self.cuda = cuda_driver_version
        self.init_error = init_error

    @classmethod
    def from_file(cls, path: str | Path) -> FakeNVML:
        spec = json.loads(Path(path).read_text())
        return cls(spec["gpus"], spec.get("driver_version", "550.54.15"),
                   spec.get("cuda_driver_version", 12040), spec.get("init_error"))

    def _get(self, h: int, key: str) -> Any:
        value = self.gpus[h].get(key)
        if value is None:
            raise _unsupported()
        return value

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)

    def nvmlShutdown(self) -> None:
        pass

    def nvmlSystemGetDriverVersion(self) -> str:
        return self.driver

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return self.cuda

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        if not 0 <= index < len(self.gpus):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return index

    def nvmlDeviceGetName(self, h: int) -> str:
        return self._get(h, "name")

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return self._get(h, "uuid")

    def nvmlDeviceGetPciInfo(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(busId=self._get(h, "bus_id").encode())

    def nvmlDeviceGetVbiosVersion(self, h: int) -> str:
        return self._get(h, "vbios")

    def nvmlDeviceGetMemoryInfo(self, h: int) -> SimpleNamespace:
        total, used = self._get(h, "memory")
        return SimpleNamespace(total=total, used=used, free=total - used)

    def nvmlDeviceGetEccMode(self, h: int) -> list[int]:
        mode = self._get(h, "ecc_mode")
        return [mode, mode]

    def nvmlDeviceGetTotalEccErrors(self, h: int, error_type: int, counter_type: int) -> int:
        kind = "uncorrected" if error_type == pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED else "corrected"
        scope = "aggregate" if counter_type == pynvml.NVML_AGGREGATE_ECC else "volatile"
        return self._get(h, "ecc")[f"{kind}_{scope}"]

    def nvmlDeviceGetRetiredPages(self, h: int, cause: int) -> list[int]:
        sbe, dbe = self._get(h, "retired_pages")
        n = dbe if cause == pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR else sbe
        return [0x1000 * (i + 1) for i in range(n)]

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h: int) -> int:
        return self._get(h, "retired_pages_pending")

    def nvmlDeviceGetRemappedRows(self, h: int) -> tuple[int, int, int, int]:
        return tuple(self._get(h, "remapped_rows"))

    def nvmlDeviceGetFieldValues(self, h: int, field_ids: list[int]) -> list[SimpleNamespace]:
        out = []
        for fid in field_ids:
            value = self.gpus[h].get("recovery_action") if fid == pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION else None
            ret = pynvml.NVML_SUCCESS if value is not None else pynvml.NVML_ERROR_NOT_SUPPORTED
            out.append(SimpleNamespace(fieldId=fid, nvmlReturn=ret, valueType=pynvml.NVML_VALUE_TYPE_UNSIGNED_INT,
                                       value=SimpleNamespace(uiVal=value or 0)))
        return out

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: int) -> int:
        return self._get(h, "clock_event_reasons")

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:
        return self._get(h, "temperature")

    def nvmlDeviceGetTemperatureThreshold(self, h: int, which: int) -> int:
        return self._get(h, "temperature_slowdown")

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        return self._get(h, "power_mw")

    def nvmlDeviceGetEnforcedPowerLimit(self, h: int) -> int:
        return self._get(h, "power_limit_mw")

    def nvmlDeviceGetPowerManagementDefaultLimit(self, h: int) -> int:
        return self._get(h, "default_power_limit_mw")

    def nvmlDeviceGetPersistenceMode(self, h: int) -> int:
        return self._get(h, "persistence")

    def nvmlDeviceGetUtilizationRates(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(gpu=self._get(h, "utilization"), memory=0)

    def nvmlDeviceGetClockInfo(self, h: int, clock: int) -> int:
        return self._get(h, "sm_clock")

    def nvmlDeviceGetMaxClockInfo(self, h: int, clock: int) -> int:
        return self._get(h, "max_sm_clock")

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: int) -> int:
        return self._get(h, "pcie")[0]

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: int) -> int:
        return self._get(h, "pcie")[1]

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: int) -> int:
        return self._get(h, "pcie")[2]

    def nvmlDeviceGetMaxPcieLinkWidth(self, h: int) -> int:
        return self._get(h, "pcie")[3]

    def nvmlDeviceGetNvLinkState(self, h: int, link: int) -> int:
        states = self._get(h, "nvlink_states")
        if link >= len(states):
            raise _unsupported()
        return states[link]

    def nvmlDeviceGetNvLinkErrorCounter(self, h: int, link: int, counter: int) -> int:
        names = {pynvml.NVML_NVLINK_ERROR_DL_REPLAY: "replay", pynvml.NVML_NVLINK_ERROR_DL_RECOVERY: "recovery",
                 pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT: "crc_flit", pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA: "crc_data"}
        return self.gpus[h].get("nvlink_errors", {}).get(str(link), {}).get(names[counter], 0)

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list[SimpleNamespace]:
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in self._get(h, "processes")]


def env(scenario: str | Path) -> dict[str, str]:
    """Environment that makes a ``mldebug`` subprocess read NVML from the scenario file."""
    return hooks_env(__name__, {ENV: str(scenario)})


def nvml_backend() -> tuple[FakeNVML, str]:
    """The ``nvml_backend`` hook point: the fake over the scenario ``MLDEBUG_TEST_NVML`` names."""
    path = os.environ.get(ENV, "").strip()
    if not path:
        raise UsageError(f"the NVML fake is loaded but {ENV} names no scenario file",
                         f"set {ENV}=<scenario.json> (test-only), or drop tests.fakes.nvml from MLDEBUG_TEST_HOOKS")
    try:
        return FakeNVML.from_file(path), path
    except (OSError, ValueError, KeyError) as e:
        raise UsageError(f"{ENV}={path}: not a readable scenario ({type(e).__name__}: {e})",
                         'a JSON file like {"gpus": [...]} (see healthy_gpu)') from None

"""Dense (no sparsity) peak TFLOPs per GPU model, from the vendors' data sheets: the one table
behind health's "% of peak" and train's MFU. Matched by the longest substring of the device name
(NVML or torch.cuda.get_device_name), so "H100 PCIe" wins over "H100" and "GH200" over "H200"."""

from __future__ import annotations

# model: (bf16 tensor core, fp8 tensor core or None when the GPU has none, fp32 non-tensor)
PEAKS: dict[str, tuple[float | None, float | None, float]] = {
    "GB200": (2500.0, 5000.0, 80.0),
    "B200": (2250.0, 4500.0, 80.0),
    "H200": (989.0, 1979.0, 67.0),
    "GH200": (989.0, 1979.0, 67.0),
    "H100 NVL": (835.0, 1671.0, 60.0),
    "H100 PCIe": (756.0, 1513.0, 51.0),
    "H100": (989.0, 1979.0, 67.0),  # SXM: "NVIDIA H100 80GB HBM3"
    "H800": (989.0, 1979.0, 67.0),
    "H20": (148.0, 296.0, 44.0),
    "A100": (312.0, None, 19.5),
    "A800": (312.0, None, 19.5),
    "L40S": (362.0, 733.0, 91.6),
    "L40": (181.0, 362.0, 90.5),
    "L4": (121.0, 242.0, 30.3),
    "A10G": (70.0, None, 31.2),
    "A10": (125.0, None, 31.2),
    "V100": (None, None, 15.7),  # no bf16 tensor cores
    "MI300X": (1307.0, 2615.0, 163.4),
}
KINDS = ("bf16", "fp8", "fp32")


def peak_tflops(device_name: str | None, kind: str) -> float | None:
    """Peak TFLOPs of `kind` ("bf16", "fp8" or "fp32") for this device, or None when unknown.

    fp8 on a GPU without fp8 tensor cores runs at best at the bf16 rate, so that peak is returned.
    """
    if not device_name or kind not in KINDS:
        return None
    matches = [model for model in PEAKS if model in device_name]
    if not matches:
        return None
    bf16, fp8, fp32 = PEAKS[max(matches, key=len)]
    return {"bf16": bf16, "fp8": fp8 if fp8 is not None else bf16, "fp32": fp32}[kind]

"""The one peak table behind health's "% of peak" and train's MFU."""

from __future__ import annotations

from ml_debug.core.gpu_peaks import peak_tflops
from ml_debug.health.active_checks import known_peak
from ml_debug.train.metrics import peak_flops


def test_longest_model_name_wins():
    assert peak_tflops("NVIDIA H100 80GB HBM3", "bf16") == 989.0
    assert peak_tflops("NVIDIA H100 NVL", "bf16") == 835.0
    assert peak_tflops("NVIDIA H100 PCIe", "fp8") == 1513.0
    assert peak_tflops("NVIDIA GH200 480GB", "fp32") == 67.0
    assert peak_tflops("NVIDIA A100-SXM4-80GB", "bf16") == 312.0
    assert peak_tflops("NVIDIA A10G", "bf16") == 70.0
    assert peak_tflops("NVIDIA L40S", "fp8") == 733.0


def test_missing_kinds_and_unknown_devices():
    assert peak_tflops("NVIDIA A100-SXM4-40GB", "fp8") == 312.0  # no fp8 cores: the bf16 rate
    assert peak_tflops("Tesla V100-SXM2-32GB", "bf16") is None
    assert peak_tflops("Some CPU", "bf16") is None and peak_tflops(None, "bf16") is None
    assert peak_tflops("NVIDIA H100 80GB HBM3", "int4") is None


def test_health_and_train_read_the_same_table():
    assert known_peak("NVIDIA H100 NVL", "bfloat16") == 835.0
    assert known_peak("NVIDIA H100 NVL", "float16") is None
    assert peak_flops("NVIDIA H100 NVL", "bf16") == 835e12
    assert peak_flops("NVIDIA H200", "mx") == 1979e12

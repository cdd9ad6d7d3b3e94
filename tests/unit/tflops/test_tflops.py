"""`mldebug tflops`: the seed handbook's worked example, published model shapes, mldebug train's own
metrics, and bad input."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import jsonschema
import pytest

from ml_debug.core.errors import UsageError
from ml_debug.tflops.flops import Shape, parse_count, per_iteration, shape_from_hf_config
from tests.conftest import REPO, mldebug

SCHEMA = json.loads((REPO / "ml_debug" / "schemas" / "tflops.json").read_text())

# Llama 2 7B's config.json as Hugging Face publishes it (meta-llama/Llama-2-7b-hf), the keys that count.
LLAMA2_7B = {"model_type": "llama", "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 11008,
             "num_attention_heads": 32, "num_key_value_heads": 32, "num_hidden_layers": 32, "vocab_size": 32000}
# GPT-3 175B (Brown et al. 2020, Table 2.1): 96 layers, d_model 12288, 96 heads, 4h MLP; GPT-2's vocabulary.
GPT3 = {"model_type": "gpt2", "activation_function": "gelu_new", "n_embd": 12288, "n_layer": 96, "n_head": 96,
        "vocab_size": 51200}


def _doc(*args: str) -> dict:
    proc = mldebug("tflops", "--json", *args, timeout=60)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    jsonschema.validate(doc, SCHEMA)
    return doc["result"]


def test_the_seed_handbooks_worked_example() -> None:
    # The handbook's throughput chapter: 52B parameters, 64 A100s, global batch 1024 x 2048 tokens,
    # 127 s per iteration, with activation checkpointing: "ms*4*2*seqlen*gbs / (sp*ng*1e3)" = 107.33.
    r = _doc("--params", "52B", "--seq-len", "2048", "--global-batch", "1024", "--iter-time", "127", "--gpus", "64",
             "--recompute", "--gpu-model", "NVIDIA A100-SXM4-80GB")
    assert round(r["hardware_tflops"], 2) == 107.33
    assert round(r["model_tflops"], 2) == round(107.33 * 3 / 4, 2)  # 6N, not 8N
    assert r["peak_tflops"] == 312.0 and r["mfu"] == pytest.approx(r["model_tflops"] / 312)
    assert r["hfu"] == pytest.approx(107.33 / 312, abs=1e-4)
    assert "8*N" in r["formula"] and any("= 107.3 TFLOP/s" in line for line in r["arithmetic"])
    human = mldebug("tflops", "--params", "52B", "--seq-len", "2048", "--global-batch", "1024", "--iter-time", "127",
                    "--gpus", "64", "--recompute", "--gpu-model", "A100", timeout=60)
    assert human.returncode == 0, human.stderr
    assert human.stdout.splitlines()[0].startswith("80.5 model TFLOP/s per GPU, MFU 25.8%; 107.3 hardware")
    assert "hardware: 8.724e+17 FLOPs / (127 s x 64 GPUs) = 107.3 TFLOP/s" in human.stdout


def test_a_hugging_face_config_counts_llama_2_7b(tmp_path: Path) -> None:
    shape = shape_from_hf_config(LLAMA2_7B, "config.json")
    # 6.74B published, less the 131M-parameter embedding table (a lookup, no matrix work)
    assert shape.params == pytest.approx(6.738e9 - 32000 * 4096, rel=2e-3)
    assert (shape.layers, shape.hidden, shape.vocab, shape.gpt_like) == (32, 4096, 32000, False)
    config = tmp_path / "config.json"
    config.write_text(json.dumps(LLAMA2_7B))
    r = _doc("--hf-config", str(config), "--seq-len", "4096", "--global-batch", "256", "--iter-time", "10",
             "--gpus", "64", "--gpu-model", "H100")
    tokens = 256 * 4096
    want = tokens * (6 * shape.params + 12 * 32 * 4096 * 4096) / (10 * 64 * 1e12)
    assert r["model_tflops"] == pytest.approx(want) and r["mfu"] == pytest.approx(want / 989)
    assert "attention" in r["formula"] and r["layers"] == 32


def test_megatrons_equation_3_agrees_with_8n_for_gpt3() -> None:
    shape = shape_from_hf_config(GPT3, "gpt3")
    assert shape.gpt_like and shape.params == pytest.approx(175e9, rel=0.01)
    tokens = 1536 * 2048
    eq3 = per_iteration(shape, tokens, 2048, recompute=True, megatron=True)
    # the paper: 96*B*s*l*h^2*(1 + s/6h + V/16lh), a few percent above 8N per token for GPT-3
    B, s, L, h, V = 1536, 2048, 96, 12288, 51200
    assert eq3.hardware == pytest.approx(96 * B * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h)))
    params = per_iteration(Shape(shape.params), tokens, None, recompute=True, megatron=False)
    assert 1.0 < eq3.hardware / params.hardware < 1.05
    assert eq3.model / eq3.hardware == pytest.approx(0.75, abs=0.01)


def test_mldebug_trains_metrics_give_the_iteration(tmp_path: Path) -> None:
    metrics = tmp_path / "metrics"
    proc = mldebug("train", "--steps", "4", "--nproc-per-node", "1", "--metrics-dir", str(metrics), "--log-every", "4",
                   "--json", timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    steps = [json.loads(x) for x in (metrics / "rank-0.jsonl").read_text().splitlines()]
    steps = [s for s in steps if "step" in s]
    r = _doc("--params", "90K", "--metrics", str(metrics))
    assert r["gpus"] == 1 and r["iteration_source"].startswith("median of 3 step(s)")
    assert r["iteration_s"] == pytest.approx(statistics.median(s["step_time_s"] for s in steps[1:]))
    assert r["tokens_per_iteration"] == steps[0]["tokens"]
    assert (r["gpu"] is None) == (r["mfu"] is None)  # no GPU found or named: no made-up MFU


@pytest.mark.parametrize("args, message", [
    (["--params", "0", "--seq-len", "8", "--global-batch", "1", "--iter-time", "1"], "is not a parameter count"),
    (["--params", "lots", "--seq-len", "8", "--global-batch", "1", "--iter-time", "1"], "is not a parameter count"),
    (["--seq-len", "8", "--global-batch", "1", "--iter-time", "1"], "the model's size is missing"),
    (["--params", "7B"], "the iteration is missing"),
    (["--params", "7B", "--hf-config", "/dev/null", "--metrics", "x"], "--params and --hf-config both"),
    (["--hf-config", "/dev/zero", "--seq-len", "8", "--global-batch", "1", "--iter-time", "1"],
     "is not a regular file"),
    (["--params", "7B", "--seq-len", "8", "--global-batch", "1", "--iter-time", "1", "--formula", "megatron"],
     "needs the depth, width"),
    (["--params", "7B", "--formula", "exact"], "Invalid value"),
])
def test_bad_input_is_one_line_and_exit_2(args: list[str], message: str) -> None:
    proc = mldebug("tflops", *args, timeout=60)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert message in proc.stderr and "Traceback" not in proc.stderr


def test_parse_count() -> None:
    assert parse_count("52B") == 52e9 and parse_count("1.3b") == 1.3e9 and parse_count("124M") == 124e6
    assert parse_count("7e9") == 7e9 and parse_count("2T") == 2e12
    for bad in ("", "B", "-1B", "inf", "1e30"):
        with pytest.raises(UsageError):
            parse_count(bad)


def test_a_deeply_nested_config_is_refused_not_a_recursion_error(tmp_path: Path) -> None:
    """100,000 nested objects: json's RecursionError was an internal error (exit 1)."""
    deep = tmp_path / "config.json"
    deep.write_text('{"a":' * 100_000 + "1" + "}" * 100_000)
    proc = mldebug("tflops", "--hf-config", str(deep), "--seq-len", "8", "--global-batch", "1", "--iter-time", "1",
                   timeout=60)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "is nested too deeply to be a model config" in proc.stderr and "internal error" not in proc.stderr


def _refused(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """In process: exit 2 with one error line and a hint; the error line."""
    from ml_debug.cli.app import run

    assert run(["tflops", *args]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("mldebug: error: ") and lines[1].startswith("hint: "), lines
    return lines[0]


def test_an_mfu_above_100_percent_is_a_units_mistake(capsys: pytest.CaptureFixture[str]) -> None:
    """--iter-time given in ms (127 for 0.127 s... here 0.01 for 10 s) made MFU 2226% and passed silently."""
    line = _refused(capsys, "--params", "7B", "--seq-len", "4096", "--global-batch", "256", "--iter-time", "0.01",
                    "--gpus", "64", "--gpu-model", "H100")
    assert "MFU" in line and "more than 100%" in line and "units mistake" in line, line
    # with --recompute the hardware's FLOPs are the larger: HFU is what goes over first
    line = _refused(capsys, "--params", "7B", "--seq-len", "4096", "--global-batch", "256", "--iter-time", "0.9",
                    "--gpus", "64", "--gpu-model", "H100", "--recompute")
    assert "HFU" in line and "units mistake" in line, line


@pytest.mark.parametrize(("step_time", "said"), [(0, "step_time_s is 0, not a positive time"),
                                                 (-0.5, "step_time_s is -0.5, not a positive time")])
def test_metrics_with_a_step_time_that_is_not_positive_are_refused(step_time: float, said: str, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """A step time of 0 ended in `internal error: ZeroDivisionError`; a negative one was taken."""
    (tmp_path / "rank-0.jsonl").write_text(json.dumps({"step": 1, "step_time_s": 0.2, "tokens": 64}) + "\n"
                                           + json.dumps({"step": 2, "step_time_s": step_time, "tokens": 64}) + "\n")
    line = _refused(capsys, "--params", "90K", "--metrics", str(tmp_path))
    assert f"rank-0.jsonl line 2 (step 2): {said}" in line, line

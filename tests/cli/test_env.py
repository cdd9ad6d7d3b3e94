"""`mldebug env`: schema, ptrace verdict checked against a real attach, no-GPU verdict, warnings."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from ml_debug.core.extras import find_program
from tests.conftest import mldebug, require, validate_schema
from tests.fakes import nvml as fake_nvml
from tests.fakes.nvml import healthy_gpu


def _env_json(*args: str, **env: str) -> dict:
    out = mldebug("env", "--json", *args, env=env)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_env_json_validates_and_says_no_gpu_plainly():
    doc = _env_json()
    validate_schema(doc, "env")
    r = doc["result"]
    assert r["torch"]["version"].startswith("2.")
    names = {t["name"]: t for t in r["tools"]}
    assert names["gdb"]["path"] and names["gdb"]["version"].startswith("GNU gdb")
    assert any(i["name"] == "lo" and "127.0.0.1" in i["addresses"] for i in r["interfaces"])
    human = mldebug("env", "--no-torch")  # the torch block is the JSON run's; one torch import per test
    assert human.returncode == 0, human.stderr
    if _nvml_works():  # a GPU node: every GPU listed, and no excuse
        assert r["gpus"]["available"] and r["gpus"]["gpus"], r["gpus"]
        assert "no NVIDIA GPU" not in r["summary"] and "no NVIDIA GPU" not in human.stdout
        assert all(g["name"] in human.stdout for g in r["gpus"]["gpus"])
    else:
        assert not r["gpus"]["available"]
        assert r["gpus"]["gpus"] == [] and r["gpus"]["reason"]
        assert "no NVIDIA GPU" in r["summary"]
        assert "no NVIDIA GPU" in human.stdout and r["gpus"]["reason"] in human.stdout.replace("\n", " ")


def _nvml_works() -> bool:
    from ml_debug.core.nvml import open_gateway

    gateway = open_gateway()
    try:
        return bool(gateway.open().available)
    finally:
        gateway.close()


SLEEPER = "import time\nprint('ready', flush=True)\ntime.sleep(60)"


def _sleeper(*prefix: str) -> subprocess.Popen[str]:
    """A Python process that says "ready" (read here) and then sleeps: it is up when this returns."""
    p = subprocess.Popen([*prefix, sys.executable, "-c", SLEEPER], stdout=subprocess.PIPE, text=True, cwd="/tmp")
    assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    return p


def test_ptrace_verdict_matches_a_real_attach():
    py_spy = find_program("py-spy")
    require(py_spy, "py-spy")
    verdict = _env_json("--no-torch")["result"]["ptrace"]
    target = _sleeper()
    try:
        attach = subprocess.run([py_spy, "dump", "--pid", str(target.pid)], capture_output=True, text=True,
                                timeout=30)
    finally:
        target.kill()
        target.wait()
    assert (attach.returncode == 0) == verdict["can_attach_own"], (verdict, attach.stderr)
    if verdict["can_attach_own"]:
        assert "time.sleep" in attach.stdout or "<module>" in attach.stdout


def test_world_variables_and_dangerous_settings_are_reported():
    doc = _env_json("--no-torch", RANK="3", WORLD_SIZE="8", SLURM_JOB_ID="42", TORCH_FR_BUFFER_SIZE="",
                    NCCL_SOCKET_IFNAME="ib9", NCCL_DEBUG="INFO")
    r = doc["result"]
    assert r["world"]["RANK"] == "3" and r["world"]["SLURM_JOB_ID"] == "42"
    assert r["settings"]["NCCL_DEBUG"] == "INFO"
    text = "\n".join(r["warnings"])
    assert "TORCH_FR_BUFFER_SIZE=''" in text and "hangs" in text
    assert "NCCL_SOCKET_IFNAME=ib9 matches no interface" in text and "lo" in text
    assert r["ok"] is False
    assert doc["environment"]["world"]["RANK"] == "3"
    human = mldebug("env", "--no-torch", env={"TORCH_FR_BUFFER_SIZE": ""})
    assert "warning" in human.stdout and "TORCH_FR_BUFFER_SIZE" in human.stdout


def test_ptrace_verdict_for_an_unprivileged_user_matches_real_attaches():
    """As uid 65534 without capabilities: may attach to its own processes, not to root's."""
    import os
    import shutil

    require(os.geteuid() == 0 and shutil.which("setpriv"), "root and setpriv (to drop privileges)")
    py_spy = find_program("py-spy")
    require(py_spy, "py-spy")
    drop = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all",
            "--bounding-set=-all"]
    out = subprocess.run([*drop, sys.executable, "-m", "ml_debug", "env", "--json", "--no-torch"],
                         capture_output=True, text=True, timeout=120, cwd="/tmp")
    assert out.returncode == 0, out.stderr
    verdict = json.loads(out.stdout)["result"]["ptrace"]
    root_target = _sleeper()
    own_target = _sleeper(*drop)
    try:
        pid_own = own_target.pid  # setpriv execs, so the pid is the Python process's
        other = subprocess.run([*drop, py_spy, "dump", "--pid", str(root_target.pid)], capture_output=True,
                               text=True, timeout=30)
        own = subprocess.run([*drop, py_spy, "dump", "--pid", str(pid_own)], capture_output=True, text=True,
                             timeout=30)
    finally:
        for p in (root_target, own_target):
            p.kill()
            p.wait()
    assert (own.returncode == 0) == verdict["can_attach_own"], (verdict, own.stderr)
    assert (other.returncode == 0) == verdict["can_attach_any"], (verdict, other.stderr)
    assert verdict["can_attach_any"] is False and verdict["fix"]


def test_fake_nvml_data_is_marked_in_the_table_and_the_json(tmp_path: Path) -> None:
    scenario = tmp_path / "scenario.json"
    scenario.write_text(json.dumps({"gpus": [healthy_gpu(0)]}))
    doc = _env_json("--no-torch", **fake_nvml.env(scenario))
    validate_schema(doc, "env")
    r = doc["result"]
    assert r["gpus"]["nvml_source"] == f"fake:{scenario}" and r["gpus"]["gpus"][0]["name"] == "NVIDIA H100 80GB HBM3"
    assert "1 GPU(s) from FAKE NVML" in r["summary"] and any(w.startswith("FAKE NVML: ") for w in r["warnings"])
    human = mldebug("env", "--no-torch", env=fake_nvml.env(scenario))
    assert human.returncode == 0, human.stderr
    assert "1 GPU(s) from FAKE NVML" in human.stdout.splitlines()[0]
    assert "GPUs (FAKE NVML: test data, not this node's hardware)" in human.stdout


def test_a_table_written_to_a_pipe_keeps_every_cell_whole_and_no_padding() -> None:
    """Tables were cut to 80 columns when stdout was a pipe or a file (gpu-test's headers read `ho… ┃ ra…`):
    with no terminal and no width asked for, nothing is cut; MLDEBUG_WIDTH=80 cuts, which shows the check can fail."""
    value = "/scratch/" + "x" * 150 + "/nccl-%h-%p.log"
    base = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "MLDEBUG_WIDTH")}

    def shown(extra: dict[str, str]) -> str:
        proc = subprocess.run([sys.executable, "-m", "ml_debug", "env", "--no-torch"], capture_output=True, text=True,
                              timeout=60, env={**base, "NCCL_DEBUG_FILE": value, **extra})
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    whole = shown({})
    (row,) = [line for line in whole.splitlines() if line.startswith("NCCL_DEBUG_FILE")]
    assert row.split("│")[1].strip() == value
    assert value not in shown({"MLDEBUG_WIDTH": "80"})
    # ... and no line is padded with spaces to the table's width (rich pads cells and titles), which
    # made every `diff` of two saved reports and every `grep 'x$'` miss.
    assert "┃" in whole and [line for line in whole.splitlines() if line.endswith(" ")] == []


def test_a_tool_wrapper_that_hangs_is_stopped_with_its_children(tmp_path: Path) -> None:
    """A `gdb` that is a shell shim whose children hang (and hold its output pipe): env reports the tool
    without a version after its 10 s limit, and neither the shim nor its children outlive the command.
    (subprocess.run's timeout killed the shim only, then waited for the children's pipe.)"""
    import uuid

    from tests.conftest import pids_with_env, wait_until

    mark = uuid.uuid4().hex
    shim = tmp_path / "bin" / "gdb"
    shim.parent.mkdir()
    shim.write_text("#!/bin/sh\nsleep 300 &\nexec sleep 300\n")
    shim.chmod(0o755)
    env = {**os.environ, "PATH": f"{shim.parent}:{os.environ['PATH']}", "MLDEBUG_ENV_TEST_MARK": mark}
    proc = subprocess.run([sys.executable, "-m", "ml_debug", "env", "--no-torch", "--json"], capture_output=True,
                          text=True, timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr
    (gdb,) = [t for t in json.loads(proc.stdout)["result"]["tools"] if t["name"] == "gdb"]
    assert gdb["path"] == str(shim) and gdb["version"] is None
    wait_until(lambda: not pids_with_env("MLDEBUG_ENV_TEST_MARK", mark), 5, "the shim's children to be gone")


def test_no_torch_does_not_count_cuda_devices() -> None:
    """--no-torch: the device count row said 0 (read as "no GPU") although torch was never asked."""
    human = mldebug("env", "--no-torch")
    assert human.returncode == 0, human.stderr
    (row,) = [line for line in human.stdout.splitlines() if line.startswith("CUDA devices (torch)")]
    assert row.split("│")[1].strip() == "not imported (--no-torch)", row


def test_a_value_that_is_not_utf8_is_shown_escaped() -> None:
    """NCCL_DEBUG=$'\\xff\\xfe': the raw bytes went to the terminal, and the JSON held lone surrogates
    (\\udcff), which strict JSON parsers refuse; both now show \\xff\\xfe."""
    env = {**os.environ, "NCCL_DEBUG": os.fsdecode(b"\xff\xfe"), "RANK": os.fsdecode(b"7\xff")}
    text = subprocess.run([sys.executable, "-m", "ml_debug", "env", "--no-torch"], capture_output=True, timeout=60,
                          env=env)
    assert text.returncode == 0, text.stderr
    assert b"\xff" not in text.stdout
    (row,) = [line for line in text.stdout.decode().splitlines() if line.startswith("NCCL_DEBUG ")]
    assert row.split("│")[1].strip() == "\\xff\\xfe", row
    out = subprocess.run([sys.executable, "-m", "ml_debug", "env", "--no-torch", "--json"], capture_output=True,
                         timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout.decode("utf-8"))
    validate_schema(doc, "env")
    for block in (doc["result"], doc["environment"]):
        assert block["settings"]["NCCL_DEBUG"] == "\\xff\\xfe" and block["world"]["RANK"] == "7\\xff", block
    json.dumps(doc, ensure_ascii=False).encode("utf-8")  # no lone surrogate left anywhere

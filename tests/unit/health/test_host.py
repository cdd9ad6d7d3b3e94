"""`mldebug health` on this machine for real: host checks, the "no NVIDIA GPU" verdict and its
exit codes, the CPU matmul stress at --level 2, JSON schema, and no torch import at level 1."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from ml_debug.core.nvml import NvmlGateway
from ml_debug.health import host_checks
from ml_debug.health.result import Status
from tests.conftest import REPO, mldebug

SCHEMA = json.loads((REPO / "ml_debug" / "schemas" / "health.json").read_text())


def _nvml_works() -> bool:
    return NvmlGateway().open().available


no_gpu = pytest.mark.skipif(_nvml_works(), reason="checks a node WITHOUT an NVIDIA GPU")


def _failed_code(doc: dict) -> int:
    """The documented exit code when no GPU is expected: 1 if any check failed, else 0."""
    return 1 if any(c["status"] == "fail" for n in doc["result"]["nodes"] for c in n["checks"]) else 0


def _health_json(*args: str, timeout: float = 120) -> tuple[int, dict]:
    proc = mldebug("health", "--json", *args, timeout=timeout)
    assert proc.stdout.strip(), proc.stderr
    doc = json.loads(proc.stdout)
    jsonschema.validate(doc, SCHEMA)
    return proc.returncode, doc


@no_gpu
def test_level1_without_gpu_says_so_and_exit_code_follows_host_checks(tmp_path: Path) -> None:
    code, doc = _health_json("--path", str(tmp_path))
    result = doc["result"]
    node = result["nodes"][0]
    assert node["gpu"]["present"] is False
    assert node["gpu"]["message"].startswith("no NVIDIA GPU")
    assert node["gpu"]["nvml_source"] == "pynvml"
    nvml = next(c for c in node["checks"] if c["id"] == "gpu.nvml")
    assert nvml["status"] == "info" and nvml["value"] == "no NVIDIA GPU"
    ids = {c["id"] for c in node["checks"]}
    assert {"host.swap", "host.d_state", "host.shm", "host.nofile", "host.disk", "host.inodes",
            "host.clock_sync", "host.cpu_governor"} <= ids
    disk = next(c for c in node["checks"] if c["id"] == "host.disk")
    assert disk["target"] == str(tmp_path) and disk["data"]["size_bytes"] > 0
    failed = [c["id"] for c in node["checks"] if c["status"] == "fail"]
    # documented: no GPU expected -> the host checks alone decide (0 all pass, 1 any failure)
    assert code == (1 if failed else 0) == result["exit_code"]
    assert result["ok"] is (not failed)
    assert "no NVIDIA GPU" in result["summary"]
    assert node["measurements"] == []


@no_gpu
@pytest.mark.parametrize("flags", [["--expect-gpus", "8"], ["--require-gpu"]])
def test_expected_gpu_missing_exits_3(flags: list[str], tmp_path: Path) -> None:
    code, doc = _health_json(*flags, "--path", str(tmp_path))
    assert code == 3 and doc["result"]["exit_code"] == 3 and doc["result"]["ok"] is False
    count = next(c for c in doc["result"]["nodes"][0]["checks"] if c["id"] == "gpu.count")
    assert count["status"] == "fail" and count["value"] == "0" and count["hint"].startswith("no NVIDIA GPU")
    assert "but a GPU was expected" in doc["result"]["summary"]
    human = mldebug("health", *flags, "--path", str(tmp_path), timeout=120)
    assert human.returncode == 3 and "no NVIDIA GPU" in human.stdout


@no_gpu
def test_expect_zero_gpus_is_fine(tmp_path: Path) -> None:
    code, doc = _health_json("--expect-gpus", "0", "--path", str(tmp_path))
    # no GPU, none expected: not a 3; the host checks alone decide between 0 and 1
    assert code == _failed_code(doc) == doc["result"]["exit_code"]
    count = next(c for c in doc["result"]["nodes"][0]["checks"] if c["id"] == "gpu.nvml")
    assert count["status"] == "info"
    assert not any(c["id"] == "gpu.count" and c["status"] == "fail" for c in doc["result"]["nodes"][0]["checks"])


@no_gpu
def test_level2_runs_the_matmul_stress_on_cpu(tmp_path: Path) -> None:
    code, doc = _health_json("--level", "2", "--stress-seconds", "1", "--matmul-size", "256", "--path", str(tmp_path))
    node = doc["result"]["nodes"][0]
    mm = next(m for m in node["measurements"] if m["test"] == "matmul")
    assert mm["device"] == "cpu" and mm["dtype"] == "float32" and mm["n"] == 256
    assert mm["iterations"] >= 3 and mm["tflops"] > 0 and mm["error"] is None
    assert mm["corrupt_iterations"] == 0 and mm["reference_ok"] is True
    check = next(c for c in node["checks"] if c["id"] == "gpu.matmul")
    assert check["target"] == "cpu" and check["status"] == "pass" and check["value"].endswith("TFLOPs")
    mem = next(m for m in node["measurements"] if m["test"] == "memtest")
    assert mem["mismatches"] == 0 and mem["bytes_tested"] == 64 << 20 and mem["passes"] == 5
    assert node["level"] == 2 and code == _failed_code(doc) == doc["result"]["exit_code"]


def test_level1_never_imports_torch() -> None:
    code = ("import sys; from ml_debug.cli.app import run; rc = run(['health', '--json', '--path', '/tmp']); "
            "sys.stdout.flush(); sys.stderr.write('RC=%d TORCH=%s' % (rc, 'torch' in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert "TORCH=False" in proc.stderr, proc.stderr
    doc = json.loads(proc.stdout)
    jsonschema.validate(doc, SCHEMA)
    assert f"RC={doc['result']['exit_code']} " in proc.stderr and doc["result"]["level"] == 1
    if not _nvml_works():
        assert doc["result"]["exit_code"] == _failed_code(doc)


def test_bad_usage_exits_2() -> None:
    for args in (["--level", "5"], ["--dtype", "int8"], ["--memtest-fraction", "2"], ["--expect-gpus", "-1"]):
        proc = mldebug("health", *args, timeout=60)
        assert proc.returncode == 2, (args, proc.stderr)
        assert proc.stderr.startswith("mldebug: error:"), proc.stderr


@pytest.mark.parametrize(("args", "words"), [
    (["--path", ""], "--path is empty"),
    (["--out-dir", ""], "--out-dir is empty"),
    (["--level", "2", "--out-dir", "/proc/nonexist/x"], "--out-dir /proc/nonexist/x"),
])
def test_an_empty_or_unusable_path_is_said_before_any_check(args: list[str], words: str, tmp_path: Path) -> None:
    from tests.fakes.held_checks import hook_env

    proc = mldebug("health", *args, env=hook_env(tmp_path), cwd=tmp_path, timeout=60)
    assert proc.returncode == 2 and words in proc.stderr.splitlines()[0], proc.stderr
    assert proc.stderr.splitlines()[1].startswith("hint:")
    assert list(tmp_path.iterdir()) == []  # no check started (the hook marks it), nothing written here


def test_nofile_limit_below_threshold_fails_in_a_real_process() -> None:
    # The real check in a child whose soft limit is 1024, as on a stock Debian login.
    code = ("import resource; resource.setrlimit(resource.RLIMIT_NOFILE, (1024, resource.getrlimit("
            "resource.RLIMIT_NOFILE)[1])); from ml_debug.health.host_checks import check_nofile; "
            "c = check_nofile(); print(c.status.value, c.value)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert out.stdout.split()[0] == "fail", out.stderr
    assert out.stdout.split()[1] == "1024"
    # and in this process, against thresholds on either side of its own limit
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    assert host_checks.check_nofile(minimum=1).status is Status.PASS
    if soft != resource.RLIM_INFINITY:
        assert host_checks.check_nofile(minimum=soft).status is Status.PASS
        assert host_checks.check_nofile(minimum=soft + 1).status is (Status.FAIL if soft < 4096 else Status.WARN)


def test_shm_and_disk_thresholds_on_real_filesystems(tmp_path: Path) -> None:
    assert host_checks.check_shm(min_bytes=1).status is Status.PASS
    huge = host_checks.check_shm(min_bytes=1 << 60)
    assert huge.status is Status.FAIL and "--shm-size" in huge.hint
    missing = host_checks.check_shm(path=str(tmp_path / "nope"))
    assert missing.status is Status.FAIL and missing.value == "missing"
    disk, inodes = host_checks.check_disk(str(tmp_path), min_free_bytes=1)
    assert disk.status is Status.PASS and inodes.id == "host.inodes"
    starved = host_checks.check_disk(str(tmp_path), min_free_bytes=1 << 62)[0]
    assert starved.status is Status.FAIL and "checkpoints" in starved.hint
    gone = host_checks.check_disk(str(tmp_path / "nope"))
    assert gone[0].status is Status.FAIL and gone[0].value == "not accessible"


def test_d_state_parser_reads_real_proc_files(tmp_path: Path) -> None:
    # A process tree laid out like /proc: a comm with spaces and parentheses must not confuse the parser.
    for pid, comm, state in ((11, "nfs (io) worker", "D"), (12, "python", "S"), (13, "kworker/0:1", "D")):
        d = tmp_path / str(pid)
        d.mkdir()
        (d / "stat").write_text(f"{pid} ({comm}) {state} 1 1 1 0 -1 4194560 0 0 0 0\n")
        (d / "wchan").write_text("rpc_wait_bit_killable" if pid == 11 else "0")
    found = sorted(host_checks.d_state_processes(str(tmp_path)))
    assert found == [(11, "nfs (io) worker", "rpc_wait_bit_killable"), (13, "kworker/0:1", "0")]
    # the live system parses too (the list may be empty)
    assert all(isinstance(p, int) for p, _, _ in host_checks.d_state_processes())


def _answers(argv: list[str]) -> str | None:
    """What a command prints when it exists and succeeds (as the check asks it), else None."""
    import shutil

    if shutil.which(argv[0]) is None:
        return None
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return p.stdout if p.returncode == 0 else None


def test_clock_sync_takes_the_first_source_that_answers() -> None:
    c = host_checks.check_clock_sync()
    td = (_answers(["timedatectl", "show", "-p", "NTPSynchronized", "--value"]) or "").strip()
    leap = next((ln.split(":", 1)[1].strip() for ln in (_answers(["chronyc", "-n", "tracking"]) or "").splitlines()
                 if ln.startswith("Leap status")), None)
    if td in ("yes", "no"):
        assert c.source == "timedatectl NTPSynchronized" and (c.status is Status.PASS) == (td == "yes")
    elif leap is not None:
        assert c.source == "chronyc tracking" and (c.status is Status.PASS) == (leap == "Normal")
    else:  # the kernel's own flag, read here with the same read-only adjtimex(2)
        state = host_checks.kernel_clock_state()
        assert state is not None, "adjtimex(2) with modes=0 works for any user on Linux"
        assert c.source == "adjtimex(2)" and "adjtimex: state" in c.data["detail"]
        assert c.status is (Status.PASS if state[0] else Status.WARN)
    assert c.status is not Status.FAIL  # a clock out of sync is a warning, never a failure


def test_cpu_governor_on_real_sysfs_files(tmp_path: Path) -> None:
    def sysfs(name: str, governors: list[str]) -> str:
        root = tmp_path / name
        for i, g in enumerate(governors):
            d = root / f"cpu{i}" / "cpufreq"
            d.mkdir(parents=True)
            (d / "scaling_governor").write_text(g + "\n")
        root.mkdir(exist_ok=True)
        return str(root)

    fast = host_checks.check_cpu_governor(sysfs("fast", ["performance", "performance"]))
    assert fast.status is Status.PASS and fast.value == "performance x2"
    slow = host_checks.check_cpu_governor(sysfs("mixed", ["performance", "powersave"]))
    assert slow.status is Status.WARN and slow.value == "performance x1, powersave x1" and "cpupower" in slow.hint
    none = host_checks.check_cpu_governor(sysfs("vm", []))
    assert none.status is Status.SKIP and "cpufreq" in none.hint
    # this machine: the verdict follows what its sysfs says
    live = host_checks.check_cpu_governor()
    files = list(Path("/sys/devices/system/cpu").glob("cpu[0-9]*/cpufreq/scaling_governor"))
    if not files:
        assert live.status is Status.SKIP
    else:
        govs = {f.read_text().strip() for f in files}
        assert live.status is (Status.PASS if govs == {"performance"} else Status.WARN)


def test_kernel_log_reader_returns_lines_or_a_reason() -> None:
    from ml_debug.health.xid import read_kernel_log

    try:  # can this process read the kernel log at all?
        os.close(os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK))
        readable = True
    except OSError:
        readable = False
    lines, reason = read_kernel_log()
    if readable:
        assert lines is not None, reason
        assert reason.startswith("/dev/kmsg") and all(isinstance(x, str) for x in lines)
    else:
        assert lines is None and ("not readable" in reason or "failed" in reason), reason

"""The Python half of benchmarks/gpu_session.sh: probe the machine, stop a step's leftover processes,
and assemble the session report (report.md + report.json) from the steps' records.

    python benchmarks/gpu_session_report.py probe OUT.json
    python benchmarks/gpu_session_report.py reap SESSION_ID
    python benchmarks/gpu_session_report.py report WORKDIR OUTDIR

Standard library only (torch and pynvml are imported inside the probe, each guarded), so the report
is written even on a machine where the project's dependencies failed to install.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

SESSION_VAR = "MLDEBUG_GPU_SESSION"
MODULES = ("torch", "pynvml", "typer", "rich", "psutil", "numpy", "paramiko", "jsonschema", "torchao", "pytest",
           "pytest_timeout", "hypothesis", "matplotlib")


# ---- probe --------------------------------------------------------------------------------------

def probe() -> dict[str, Any]:
    """What this machine has: Python, the modules mldebug and its tests use, torch/CUDA/NCCL, GPUs."""
    info: dict[str, Any] = {"python": sys.version.split()[0], "executable": sys.executable,
                            "platform": platform.platform(), "host": platform.node(),
                            "modules": {m: importlib.util.find_spec(m) is not None for m in MODULES},
                            "py_spy": shutil.which("py-spy") or (str(Path(sys.executable).parent / "py-spy")
                                                                 if (Path(sys.executable).parent / "py-spy").exists()
                                                                 else None),
                            "nvidia_smi": shutil.which("nvidia-smi")}
    try:
        import torch

        info["torch"] = torch.__version__
        info["torch_cuda_build"] = torch.version.cuda
        info["cuda_available"] = torch.cuda.is_available()
        if torch.cuda.is_available():
            info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
            try:
                v = torch.cuda.nccl.version()
                info["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
            except Exception as e:  # a build without NCCL
                info["nccl"] = f"unavailable: {e}"
    except Exception as e:
        info["torch"] = f"not importable: {type(e).__name__}: {e}"
    try:
        import pynvml

        pynvml.nvmlInit()
        drv = pynvml.nvmlSystemGetDriverVersion()
        info["driver"] = drv.decode() if isinstance(drv, bytes) else drv
        pynvml.nvmlShutdown()
    except Exception as e:
        info["driver"] = f"NVML: {type(e).__name__}: {e}"
    try:
        p = subprocess.run([sys.executable, "-m", "ml_debug", "--version"], capture_output=True, text=True, timeout=60)
        info["mldebug"] = (p.stdout or p.stderr).strip().splitlines()[-1] if (p.stdout or p.stderr).strip() else \
            f"exit {p.returncode}"
    except Exception as e:
        info["mldebug"] = f"{type(e).__name__}: {e}"
    return info


# ---- reap ---------------------------------------------------------------------------------------

def session_pids(session: str) -> list[int]:
    """Live processes started by this session (they carry MLDEBUG_GPU_SESSION=<id>), not this one and
    not its ancestors (the session script itself)."""
    needle = f"{SESSION_VAR}={session}".encode()
    keep = {os.getpid()}
    pid = os.getppid()
    while pid > 1 and pid not in keep:
        keep.add(pid)
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            break
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in keep:
            continue
        try:
            env = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if needle in env and state not in ("Z", "X"):
            out.append(int(entry))
    return out


def reap(session: str) -> list[int]:
    """SIGKILL what a timed-out step left behind (torchrun's ranks live in their own sessions, out of
    `timeout`'s reach); wait until they are gone. Returns the pids that were stopped."""
    pids = session_pids(session)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and session_pids(session):
        time.sleep(0.2)
    return pids


# ---- report -------------------------------------------------------------------------------------

def _tsv(path: Path) -> list[dict[str, str]]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        parts = line.split("\t")
        if len(parts) >= 5:
            rows.append({"name": parts[0], "rc": parts[1], "seconds": parts[2], "limit": parts[3],
                         "command": parts[4], "note": parts[5] if len(parts) > 5 else ""})
    return rows


def _junit(path: Path) -> dict[str, Any]:
    """Per-test outcome from pytest's JUnit XML."""
    if not path.exists():
        return {"available": False, "tests": [], "counts": {}}
    tests = []
    root = ET.parse(path).getroot()
    for case in root.iter("testcase"):
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            el = case.find(tag)
            if el is not None:
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                message = (el.get("message") or el.text or "").strip()
                break
        tests.append({"test": f"{case.get('classname', '')}::{case.get('name', '')}", "outcome": outcome,
                      "seconds": round(float(case.get("time", 0) or 0), 1), "message": message[:600]})
    counts: dict[str, int] = {}
    for t in tests:
        counts[t["outcome"]] = counts.get(t["outcome"], 0) + 1
    return {"available": True, "tests": tests, "counts": counts}


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def report(work: Path, out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    probe_doc = json.loads((work / "probe.json").read_text()) if (work / "probe.json").exists() else {}
    steps = _tsv(work / "steps.tsv")
    install = _tsv(work / "install.tsv")
    benches = []
    for p in sorted(work.glob("bench-*.json")):
        try:
            benches.append(json.loads(p.read_text()))
        except ValueError as e:
            benches.append({"benchmark": p.stem, "figures": [], "notes": [], "errors": [f"unreadable: {e}"]})
    tests = _junit(work / "pytest.xml")
    figures = [dict(f, benchmark=b.get("benchmark")) for b in benches for f in b.get("figures", [])]
    errors = [f"{b.get('benchmark')}: {e}" for b in benches for e in b.get("errors", [])]
    for r in steps:  # a benchmark that wrote nothing (crashed, timed out, skipped) is an error too
        if r["name"].startswith("bench-") and not (work / f"{r['name']}.json").exists():
            errors.append(f"{r['name']}: no figures (exit {r['rc']}{'; ' + r['note'] if r['note'] else ''}; "
                          "see logs.txt)")
    if tests["available"] is False and any(r["name"] == "pytest-gpu" for r in steps):
        errors.append("pytest-gpu: no JUnit report (stopped before it could write one; see logs.txt)")
    missed = [f["name"] for f in figures if f.get("met") is False]
    counts = tests["counts"]
    summary = (f"tests: {', '.join(f'{v} {k}' for k, v in sorted(counts.items())) or 'none ran'}; "
               f"figures: {len(figures)}, goals missed: {', '.join(missed) or 'none'}; errors: {len(errors)}")
    doc = {"schema": "mldebug.gpu-session", "schema_version": 1, "summary": summary,
           "ok": not errors and not counts.get("failed") and not counts.get("error") and bool(tests["available"]),
           "finished": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "machine": probe_doc, "install": install,
           "steps": steps, "figures": figures, "tests": tests,
           "notes": [n for b in benches for n in b.get("notes", [])], "errors": errors}
    (out / "report.json").write_text(json.dumps(doc, indent=2))

    m = probe_doc
    lines = ["# mldebug GPU session report", "", f"**{summary}**", "",
             f"- finished: {doc['finished']}",
             f"- GPUs: {', '.join(m.get('gpus', [])) or 'none seen by torch'}; driver {m.get('driver')}",
             f"- torch {m.get('torch')} (CUDA {m.get('torch_cuda_build')}, NCCL {m.get('nccl')}); "
             f"Python {m.get('python')} at {m.get('executable')}",
             f"- mldebug: {m.get('mldebug')}; py-spy: {m.get('py_spy') or 'missing'}",
             "- modules: " + ", ".join(f"{k} {'yes' if v else 'MISSING'}" for k, v in m.get("modules", {}).items()),
             "", "## Install attempts", "", "| attempt | exit | seconds | command | note |", "|---|---|---|---|---|"]
    lines += [f"| {r['name']} | {r['rc']} | {r['seconds']} | `{_cell(r['command'])}` | {_cell(r['note'])} |"
              for r in install]
    lines += ["", "## Steps", "", "| step | exit | seconds / limit | command |", "|---|---|---|---|"]
    lines += [f"| {r['name']} | {r['rc']}{' (timed out)' if r['rc'] in ('124', '130', '137') else ''} | "
              f"{r['seconds']} / {r['limit']} | `{_cell(r['command'])}` |" for r in steps]
    lines += ["", "## Figures", "", "| figure | value | goal | met | command | detail |", "|---|---|---|---|---|---|"]
    for f in figures:
        v = "n/a" if f.get("value") is None else f"{f['value']:.4g} {f.get('unit', '')}"
        met = {True: "yes", False: "**NO**", None: ""}[f.get("met")]
        lines.append(f"| {_cell(f['name'])} | {_cell(v)} | {_cell(f.get('goal', ''))} | {met} | "
                     f"`{_cell(f.get('command', ''))}` | {_cell(f.get('detail', ''))} |")
    lines += ["", "## Tests: pytest -m gpu", "",
              ("counts: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))) if tests["available"]
              else "no JUnit report: pytest did not run or was stopped before writing it (see logs.txt)", ""]
    if tests["tests"]:
        lines += ["| test | outcome | seconds | message |", "|---|---|---|---|"]
        order = {"failed": 0, "error": 1, "skipped": 2, "passed": 3}
        for t in sorted(tests["tests"], key=lambda t: (order.get(t["outcome"], 9), t["test"])):
            outcome = t["outcome"] if t["outcome"] in ("passed", "skipped") else f"**{t['outcome'].upper()}**"
            lines.append(f"| {_cell(t['test'])} | {outcome} | {t['seconds']} | {_cell(t['message'][:300])} |")
    if doc["notes"] or doc["errors"]:
        lines += ["", "## Notes and errors", ""]
        lines += [f"- note: {_cell(n)}" for n in doc["notes"]]
        lines += [f"- ERROR: {_cell(e)}" for e in doc["errors"]]
    lines += ["", "Per-step output: logs.txt (the last lines of each step). Machine-readable: report.json.", ""]
    (out / "report.md").write_text("\n".join(lines))

    with open(out / "logs.txt", "w") as fh:
        for r in [*install, *steps]:
            log = work / f"{r['name']}.log"
            fh.write(f"===== {r['name']} (exit {r['rc']}, {r['seconds']} s): {r['command']}\n")
            if log.exists():
                text = log.read_text(errors="replace").splitlines()
                if len(text) > 300:
                    fh.write(f"[... {len(text) - 300} earlier lines left out ...]\n")
                fh.write("\n".join(text[-300:]) + "\n")
    return 0


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "probe":
        Path(argv[1]).write_text(json.dumps(probe(), indent=2))
        print(Path(argv[1]).read_text())
        return 0
    if len(argv) == 2 and argv[0] == "reap":
        stopped = reap(argv[1])
        if stopped:
            print(f"stopped leftover processes of this session: {stopped}")
        return 0
    if len(argv) == 3 and argv[0] == "report":
        return report(Path(argv[1]), Path(argv[2]))
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

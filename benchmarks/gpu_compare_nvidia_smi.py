"""Compare every NVML field `mldebug health` reports with `nvidia-smi --query-gpu` (needs a GPU).

    python benchmarks/gpu_compare_nvidia_smi.py            # runs mldebug health --level 2 --json
    python benchmarks/gpu_compare_nvidia_smi.py --level 1  # quicker: the NVML fields only
    python benchmarks/gpu_compare_nvidia_smi.py --json-file health.json

Prints one line per GPU and field: mldebug's value, nvidia-smi's, and whether they agree.
Static fields (names, versions, ECC counters, limits, link maxima) must match exactly;
live ones (temperature, power, clocks, utilization, current PCIe gen) are read a moment apart
and get a tolerance. Exit 1 when a static field disagrees. Also prints the stress figures
(TFLOPs vs the card's peak) from a level 2 run. tests/gpu/test_health_nvml.py runs this too.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

# field -> tolerance for live values (absolute), None for exact match
LIVE = {"temperature.gpu": 5, "power.draw": 60.0, "utilization.gpu": 100, "clocks.sm": 10_000,
        "pcie.link.gen.current": 10, "memory.used": 10_000, "clocks_event_reasons.active": None}
SKIP_EXACT = {"clocks_event_reasons.active"}  # a bit mask that changes from moment to moment


def smi_fields() -> set[str]:
    """Field names this nvidia-smi accepts (`nvidia-smi --help-query-gpu`)."""
    out = subprocess.run(["nvidia-smi", "--help-query-gpu"], capture_output=True, text=True, timeout=30).stdout
    return set(re.findall(r'^"([a-z0-9_.]+)"', out, flags=re.M))


def query_smi(fields: list[str]) -> list[dict[str, str]]:
    out = subprocess.run(["nvidia-smi", f"--query-gpu=index,{','.join(fields)}", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    rows = []
    for line in out.strip().splitlines():
        values = [v.strip() for v in line.split(",")]
        rows.append(dict(zip(["index", *fields], values, strict=False)))
    return rows


def normalise(field: str, value: Any) -> Any:
    """Both sides to one form: numbers as numbers, Enabled/Disabled as bools, N/A as None."""
    if value is None or (isinstance(value, str) and value.strip("[] ") in ("N/A", "Not Supported", "")):
        return None
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        v = value.strip()
        if v in ("Enabled", "Yes"):
            return True
        if v in ("Disabled", "No"):
            return False
        if v.startswith("0x"):
            return int(v, 16)
        try:
            return float(v) if "." in v else int(v)
        except ValueError:
            return v.upper() if field == "pci.bus_id" else v
    return value


def compare(doc: dict[str, Any], smi_rows: list[dict[str, str]]) -> list[dict[str, Any]]:
    """One row per GPU and field that both report."""
    out = []
    node = doc["result"]["nodes"][0]
    by_index = {int(r["index"]): r for r in smi_rows}
    for gpu in node["gpu"]["gpus"]:
        smi = by_index.get(gpu["index"], {})
        for field, ours in gpu["fields"].items():
            if field not in smi:
                continue
            a, b = normalise(field, ours), normalise(field, smi[field])
            if field in SKIP_EXACT:
                agree = "live"
            elif field in LIVE and isinstance(a, (int, float)) and isinstance(b, (int, float)):
                agree = "yes" if abs(a - b) <= LIVE[field] else "NO"
            elif isinstance(a, float) or isinstance(b, float):
                agree = "yes" if a is not None and b is not None and abs(float(a) - float(b)) < 0.5 else (
                    "yes" if a == b else "NO")
            else:
                agree = "yes" if a == b else "NO"
            out.append({"gpu": gpu["index"], "field": field, "mldebug": ours, "nvidia_smi": smi[field],
                        "agree": agree, "live": field in LIVE})
    return out


def stress_lines(doc: dict[str, Any]) -> list[str]:
    lines = []
    for node in doc["result"]["nodes"]:
        for c in node["checks"]:
            if c["id"] in ("gpu.matmul", "gpu.h2d", "gpu.d2h", "gpu.memtest", "gpu.pcie_link_load"):
                lines.append(f"{c['target']:<6} {c['id']:<20} {c['status']:<5} {c['value']}")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--level", type=int, default=2)
    ap.add_argument("--json-file", help="an existing `mldebug health --json` document instead of running it")
    ap.add_argument("--out", help="also write the comparison (and its figures, for benchmarks/gpu_session.sh) "
                                  "as JSON here")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds `mldebug health` may take")
    args = ap.parse_args(argv)
    if shutil.which("nvidia-smi") is None:
        print("nvidia-smi not found: run this on a node with an NVIDIA driver", file=sys.stderr)
        return 3
    if args.json_file:
        doc = json.loads(Path(args.json_file).read_text())
    else:
        proc = subprocess.run([sys.executable, "-m", "ml_debug", "health", "--json", "--level", str(args.level)],
                              capture_output=True, text=True, timeout=args.timeout, cwd=REPO)
        sys.stderr.write(proc.stderr)
        doc = json.loads(proc.stdout)
    ours = {f for g in doc["result"]["nodes"][0]["gpu"]["gpus"] for f in g["fields"]}
    valid = smi_fields()
    fields = sorted(ours & valid)
    rows = compare(doc, query_smi(fields))
    print(f"{'gpu':<4} {'field':<42} {'mldebug':<28} {'nvidia-smi':<28} agree")
    for r in rows:
        print(f"{r['gpu']:<4} {r['field']:<42} {str(r['mldebug'])[:27]:<28} {str(r['nvidia_smi'])[:27]:<28} {r['agree']}")
    only_ours = sorted(ours - valid)
    print(f"\nfields nvidia-smi --query-gpu has no name for (NVML only): {', '.join(only_ours)}")
    stress = stress_lines(doc)
    if stress:
        print("\nactive tests:")
        print("\n".join(stress))
    print(f"\nsummary: {doc['result']['summary']}")
    bad = [r for r in rows if r["agree"] == "NO" and not r["live"]]
    if args.out:
        command = f"python benchmarks/gpu_compare_nvidia_smi.py --level {args.level}"
        static = [r for r in rows if not r["live"]]
        live = [r for r in rows if r["live"] and r["agree"] != "live"]
        figures = [
            {"name": "NVML fields equal to nvidia-smi --query-gpu (static)", "value": len(static) - len(bad),
             "unit": f"of {len(static)}", "goal": "all equal", "met": not bad and bool(static), "command": command,
             "detail": "disagreeing: " + (", ".join(f"gpu{r['gpu']} {r['field']} {r['mldebug']!r} vs "
                                                     f"{r['nvidia_smi']!r}" for r in bad) or "none")},
            {"name": "NVML live fields within tolerance of nvidia-smi", "value": sum(r["agree"] == "yes" for r in live),
             "unit": f"of {len(live)}", "goal": "", "met": None, "command": command,
             "detail": "live values are read a moment apart: " + ", ".join(sorted({r["field"] for r in live}))},
        ]
        Path(args.out).write_text(json.dumps({"benchmark": "gpu_compare_nvidia_smi", "figures": figures,
                                              "notes": [f"NVML-only fields: {', '.join(only_ours)}"],
                                              "errors": [], "rows": rows, "stress": stress,
                                              "summary": doc["result"]["summary"]}, indent=2, default=str))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

"""Run the benchmarks and print one line per measurement with its ratio.

    python benchmarks/run.py              # all of them
    python benchmarks/run.py startup      # benchmarks/bench_startup.py only
"""

from __future__ import annotations

import importlib
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))


def main(argv: list[str]) -> int:
    names = argv or sorted(p.stem.removeprefix("bench_") for p in HERE.glob("bench_*.py"))
    failed = 0
    for name in names:
        t0 = time.perf_counter()
        try:
            module = importlib.import_module(f"benchmarks.bench_{name}")
            for result in module.run():
                print(result.line(), flush=True)
        except Exception:
            failed += 1
            print(f"{name:<44} FAILED", flush=True)
            traceback.print_exc()
        print(f"# {name}: {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

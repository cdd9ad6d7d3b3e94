"""Entry point of a self-launched rank: ``python -m ml_debug.cli.worker <command> [args]``.

Runs the mldebug command like ``python -m ml_debug`` would, writes its exit code where the launcher
reads it (MLDEBUG_LAUNCH_DIR/rank<R>.rc), then exits 0: torch's elastic agent kills every other rank
as soon as one exits non-zero, which would cut off the rank still printing the verdict.
"""

from __future__ import annotations

import os
import sys


def main(argv: list[str]) -> int:
    from ml_debug.cli.app import run

    code = run(argv)
    sys.stdout.flush()
    sys.stderr.flush()
    launch_dir = os.environ.get("MLDEBUG_LAUNCH_DIR")
    if not launch_dir:
        return code
    path = os.path.join(launch_dir, f"rank{os.environ.get('RANK', '0')}.rc")
    with open(path + ".tmp", "w") as fh:
        fh.write(str(code))
    os.replace(path + ".tmp", path)
    return 0


if __name__ == "__main__":
    rc = main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter finalisation: gloo worker threads can abort it after the work is done
    # (FIELD-NOTES "exit crash"); the result is already written.
    os._exit(rc)

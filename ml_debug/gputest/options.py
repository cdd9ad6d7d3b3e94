"""The options of `mldebug gpu-test` (cheap to import: the CLI builds its options from them)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ml_debug.core.options import option, parse_out_dir
from ml_debug.dist.options import backend_option, device_option


@dataclass
class GpuTestConfig:
    """What `mldebug gpu-test` checks and how long each stage may take (the command's options)."""

    timeout_s: float = option(30.0, flags=("--stage-timeout",), renamed_from=("--timeout",), min=0.5, metavar="S",
                              help="Seconds each stage may take on each rank.")
    init_timeout_s: float | None = option(
        None, flags=("--init-timeout",), min=0.5, metavar="S",
        help="Seconds for all ranks to check in and init the group (default: --stage-timeout).")
    mem_gb: float = option(0.0, min=0.0, help="Also allocate and fill this many GiB per device.")
    isolate: bool = option(False, forward=False,
                           help="Test every GPU alone, then in pairs, then the shifted pairs, to find one bad GPU "
                                "or link (CPU: the same over rank slots).")
    backend: str = backend_option()
    device: str = device_option()
    out_dir: Path | None = option(None, metavar="DIR", parse=parse_out_dir,
                                  help="Also write results here as they arrive, so nothing is lost on Ctrl-C or "
                                       "a crash.")
    report_to: Path | None = option(None, hidden=True, forward=False,
                                    help="Internal (--isolate): write the verdict document here.")
    elements: int = 1 << 18
    grace_s: float = 5.0

    @property
    def init_timeout(self) -> float:
        return self.init_timeout_s or self.timeout_s

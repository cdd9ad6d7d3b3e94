"""The merged stacks in speedscope's file format (https://www.speedscope.app/file-format-schema.json),
the viewer py-spy's users already open (``py-spy record --format speedscope``).

The first profile is the whole job: one sample per group of identical main-thread stacks, weighted by
its number of processes, so speedscope's "left heavy" view is the merged tree and its flame width is
ranks. Then one profile per process (up to ``PER_PROCESS``), its samples in the order taken (weight 1:
``--samples 3`` shows whether a rank moved)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ml_debug.stacks.verdict import DumpStacksResult

SCHEMA_URL = "https://www.speedscope.app/file-format-schema.json"
PER_PROCESS = 256  # beyond this, the per-process profiles would only repeat the groups


class _Frames:
    """speedscope's shared frame table: each (name, file, line) once."""

    def __init__(self) -> None:
        self.index: dict[tuple[str, str, int | None], int] = {}
        self.frames: list[dict[str, Any]] = []

    def of(self, name: str, file: str, line: int | None) -> int:
        key = (name, file, line)
        got = self.index.get(key)
        if got is None:
            got = self.index[key] = len(self.frames)
            frame: dict[str, Any] = {"name": name, "file": file}
            if line is not None:
                frame["line"] = line
            self.frames.append(frame)
        return got


def _profile(name: str, samples: list[list[int]], weights: list[int]) -> dict[str, Any]:
    return {"type": "sampled", "name": name, "unit": "none", "startValue": 0, "endValue": sum(weights),
            "samples": samples, "weights": weights}


def export(result: DumpStacksResult, name: str = "mldebug dump-stacks") -> dict[str, Any]:
    """The speedscope document of `result` (a JSON object)."""
    from ml_debug.core.ranges import compress

    table = _Frames()
    samples, weights = [], []
    for g in result.groups:  # frames innermost first: speedscope wants the root first
        samples.append([table.of(f.name, f.file, f.line) for f in reversed(g.frames)])
        weights.append(g.size)
    profiles = [_profile(f"all ranks: {len(result.processes)} processes, {len(result.groups)} distinct stacks "
                         "(weight: processes)", samples, weights)]
    for p in result.processes[:PER_PROCESS]:
        stacks = []
        for dump in p.samples:
            main = dump.main_thread() if dump.ok else None
            if main is not None:
                stacks.append([table.of(f.name, f.short, f.line) for f in reversed(main.python_frames())])
        if stacks:
            who = f"rank {p.rank}" if p.rank is not None else "no rank"
            profiles.append(_profile(f"{who} ({p.host}, pid {p.pid})", stacks, [1] * len(stacks)))
    suspects = [r for s in result.suspects for r in s.ranks]
    return {"$schema": SCHEMA_URL, "shared": {"frames": table.frames}, "profiles": profiles,
            "name": name + (f": suspect rank {compress(suspects)}" if suspects else ""), "activeProfileIndex": 0,
            "exporter": "mldebug"}

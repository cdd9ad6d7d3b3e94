"""Which rank is behind in a loop (LLNL STAT's temporal ordering; the seed handbook's "code loops").

Ranks that stand in the same loop look alike in a stack tree even when one is an iteration behind.
With ``--locals`` each frame carries its variables: in the deepest frame that every rank is in (the
same function of the same file, the training loop as a rule), the loop counters (``step``, ``i``,
``epoch``, ...) are compared, and the ranks with the smallest value are named when the others agree:
``rank 7 at step=41, ranks 0-6,8-15 at step=42``.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from ml_debug.core.ranges import compress
from ml_debug.stacks.result import Frame

# Names that count iterations. A rank's own identity (rank, pid, device, port) differs between ranks
# by design and is never compared.
COUNTER = re.compile(r"^(?:i|j|k|it|n|idx|iter|iteration|epoch|step|steps|micro_step|global_step|batch_idx|"
                     r"batch_id|cur_step|train_step|.*_step|.*_iter|.*_iteration|.*_epoch)$")
INT = re.compile(r"^-?\d{1,18}$")


@dataclass(frozen=True)
class RankFrames:
    """One rank's main-thread frames, outermost first, with their locals."""

    rank: int
    frames: Sequence[Frame]


@dataclass(frozen=True)
class LoopOrder:
    """The ranks behind in the deepest loop every rank shares."""

    function: str
    """Where: ``train (train.py)``."""
    variable: str
    behind: list[int]
    behind_value: int
    ahead: list[int]
    ahead_value: int
    text: str


def _counters(frame: Frame) -> dict[str, int]:
    out = {}
    for name, value in (frame.locals or {}).items():
        text = str(value).strip()
        if COUNTER.match(name) and INT.match(text):
            out[name] = int(text)
    return out


def _key(frame: Frame) -> tuple[str, str]:
    return frame.filename, frame.name


def loop_order(ranks: Sequence[RankFrames]) -> LoopOrder | None:
    """The ranks with the smallest loop counter in the deepest shared frame, or None when the counters agree,
    are missing, or do not split into one majority value and fewer ranks behind it."""
    ranks = [r for r in ranks if r.frames]
    if len(ranks) < 2:
        return None
    depth = min(len(r.frames) for r in ranks)
    for d in reversed(range(depth)):  # the deepest frame first: the innermost loop that all ranks share
        if len({_key(r.frames[d]) for r in ranks}) != 1:
            continue
        counters = [_counters(r.frames[d]) for r in ranks]
        shared = set.intersection(*(set(c) for c in counters)) if counters else set()
        for name in sorted(shared):
            values = Counter(c[name] for c in counters)
            if len(values) < 2:
                continue
            (top, n_top), = values.most_common(1)
            low = min(values)
            if n_top * 2 <= len(ranks) or low >= top:  # no clear majority, or the odd ones are ahead
                continue
            behind = sorted(r.rank for r, c in zip(ranks, counters, strict=True) if c[name] == low)
            ahead = sorted(r.rank for r, c in zip(ranks, counters, strict=True) if c[name] == top)
            f = ranks[0].frames[d]
            where = f"{f.name} ({f.filename.rsplit('/', 1)[-1]})"
            who = f"rank {behind[0]}" if len(behind) == 1 else f"ranks {compress(behind)}"
            text = (f"{who} at {name}={low}, {'rank' if len(ahead) == 1 else 'ranks'} {compress(ahead)} at "
                    f"{name}={top} in {where}")
            return LoopOrder(where, name, behind, low, ahead, top, text)
    return None

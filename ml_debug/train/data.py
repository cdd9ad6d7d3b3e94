"""Training data with no download: a deterministic token stream, byte-level, rank-strided.

Sources:

* ``synthetic``: generated arithmetic lines (``"417+38=455\\n"``) from a fixed seed; the same bytes on
  every machine and Python version, so golden loss curves can be pinned. Partly learnable (the
  format, the carry-free digits), so the loss falls visibly in a few dozen steps.
* ``stdlib``: Python's own standard-library ``.py`` files, sorted by name (real text, but it changes
  between Python versions).
* a path: any text file.

Sequence ``j`` of the global stream is the window starting at byte ``(j * seq_len) mod n``; step
``s`` of a world of ``W`` ranks uses sequences ``pos .. pos + W*B*A - 1`` (B sequences per
micro-batch, A micro-batches) and rank ``r`` takes every W-th of them. The position ``pos`` is all a
checkpoint needs to continue the stream exactly, on any number of ranks.
"""

from __future__ import annotations

import os
import random
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import torch

from ml_debug.core.errors import UsageError

STDLIB_CAP = 8 << 20  # bytes read from the standard library (plenty for any run here)


def synthetic_text(n_bytes: int = 1 << 20, seed: int = 20240229) -> bytes:
    """Arithmetic lines from a fixed-seed generator (random.Random is stable across versions)."""
    rng = random.Random(seed)
    out: list[str] = []
    size = 0
    while size < n_bytes:
        a, b = rng.randrange(1000), rng.randrange(1000)
        line = f"{a}+{b}={a + b}\n" if rng.random() < 0.5 else f"{a + b}-{b}={a}\n"
        out.append(line)
        size += len(line)
    return "".join(out).encode()


def stdlib_text(cap: int = STDLIB_CAP) -> bytes:
    """Concatenated standard-library sources, in sorted path order, up to ``cap`` bytes."""
    root = Path(sysconfig.get_paths()["stdlib"])
    chunks: list[bytes] = []
    size = 0
    for path in sorted(root.glob("*.py")):
        try:
            data = path.read_bytes()
        except OSError:
            continue
        chunks.append(data)
        size += len(data)
        if size >= cap:
            break
    if not chunks:
        raise UsageError(f"no standard-library sources under {root}", "use --data synthetic or a text file")
    return b"".join(chunks)[:cap]


def load_corpus(source: str) -> bytes:
    if source == "synthetic":
        return synthetic_text()
    if source == "stdlib":
        return stdlib_text()
    path = Path(source)
    if not path.is_file():
        raise UsageError(f"--data {source!r} is neither synthetic, stdlib nor a readable file",
                         "use --data synthetic, --data stdlib or --data PATH/TO/TEXT")
    data = path.read_bytes()[:STDLIB_CAP * 8]
    if len(data) < 1024:
        raise UsageError(f"--data {source}: only {len(data)} bytes", "give a text file of at least 1 KiB")
    return data


def encode(text: str) -> list[int]:
    """Byte-level tokenizer: UTF-8 bytes are the tokens (vocabulary 256)."""
    return list(text.encode())


def decode(tokens: list[int]) -> str:
    return bytes(tokens).decode(errors="replace")


@dataclass
class TokenStream:
    """The deterministic, rank-strided stream of (inputs, targets) micro-batches."""

    corpus: torch.Tensor  # uint8 tokens
    seq_len: int
    batch_size: int
    rank: int
    world_size: int
    position: int = 0  # global sequence index of the next step (saved in checkpoints)

    @classmethod
    def open(cls, source: str, seq_len: int, batch_size: int, rank: int, world_size: int) -> TokenStream:
        data = load_corpus(source)
        if len(data) <= seq_len + 1:
            raise UsageError(f"the corpus ({len(data)} bytes) is shorter than one sequence",
                             "use a smaller --seq-len or a larger text")
        corpus = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        return cls(corpus, seq_len, batch_size, rank, world_size)

    def micro_batch(self, accum: int, micro: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Micro-batch ``micro`` of ``accum`` of the current step, for this rank."""
        n_windows = (self.corpus.numel() - 1 - self.seq_len)
        per_step = self.world_size * self.batch_size * accum
        first = self.position + micro * self.world_size * self.batch_size
        idx = [first + self.rank + self.world_size * i for i in range(self.batch_size)]
        assert max(idx) < self.position + per_step
        starts = torch.tensor([(j * self.seq_len) % n_windows for j in idx])
        offsets = starts[:, None] + torch.arange(self.seq_len + 1)
        window = self.corpus[offsets].long()
        return window[:, :-1], window[:, 1:]

    def advance(self, accum: int) -> None:
        self.position += self.world_size * self.batch_size * accum

    def state_dict(self) -> dict[str, int]:
        return {"position": self.position, "seq_len": self.seq_len}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.position = int(state["position"])


def default_threads() -> None:
    """One intra-op thread per CPU rank unless the user chose (2 ranks on 2 cores thrash otherwise)."""
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(1)

"""When the job saves and what it resumes from, around the checkpoint format of ``checkpoint.py``.

* resume: the newest complete ``step-N`` folder under CHECKPOINT_DIR (with ``--resume``);
* saves: every ``--checkpoint-every`` steps, when the save switch file appears, and once at the end
  of a run that completed (unless its last step was just saved);
* switches: the kill and save switch files, read by every rank at the start of a step. Ranks may see a
  file appear at different moments, so the trainer acts on the step's agreement (any rank saw it),
  never on one rank's view.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from ml_debug.core import testhooks
from ml_debug.train import checkpoint as ckpt
from ml_debug.train.config import TrainConfig
from ml_debug.train.data import TokenStream
from ml_debug.train.metrics import MetricsLog


@dataclass(frozen=True)
class Switches:
    """This rank's view of the switch files at the start of a step."""

    kill: bool
    save: bool


class Checkpointer:
    """Saves and resumes one rank's model, optimizer and data position (every rank calls every method)."""

    def __init__(self, cfg: TrainConfig, rank: int, log: MetricsLog, model: nn.Module,
                 optimizer: torch.optim.Optimizer, stream: TokenStream) -> None:
        self.cfg, self.rank, self.log = cfg, rank, log
        self.model, self.optimizer, self.stream = model, optimizer, stream
        self.saved: list[str] = []  # folders saved by this run, oldest first
        self._saved_at = -1

    def switches(self) -> Switches:
        kill, save = self.cfg.kill_switch, self.cfg.save_switch
        return Switches(kill=kill is not None and kill.exists(), save=save is not None and save.exists())

    def resume(self) -> int:
        """Load the newest complete checkpoint when asked to; returns its step (0: a fresh start)."""
        if self.cfg.checkpoint_dir is None or not self.cfg.resume:
            return 0
        found = ckpt.latest_complete(self.cfg.checkpoint_dir)
        if found is None:
            return 0
        step = ckpt.load(found[1], self.model, self.optimizer, self.stream)
        self.log.say(f"resumed from {found[1]} (step {step}, data position {self.stream.position})")
        self.log.event(f"resume step={step}")
        return step

    def after_step(self, step: int, save_switch: bool) -> None:
        """Save when the step is a multiple of --checkpoint-every or some rank saw the save switch."""
        if self.cfg.checkpoint_dir is None:
            return
        every = self.cfg.checkpoint_every and step % self.cfg.checkpoint_every == 0
        if not (every or save_switch):
            return
        folder = self._save(step)
        self.log.event(f"checkpoint step={step}")
        if save_switch:
            self.log.say(f"save switch: saved {folder}")
            # Removing the file is the user's sign that the save is done (and re-arms the switch). No rank reads
            # the switches again before it is gone: a rank quick to its next step would see it and save twice.
            testhooks.call(testhooks.TRAIN_SAVE_SWITCH_DONE, rank=self.rank)
            if self.rank == 0 and self.cfg.save_switch is not None:
                with contextlib.suppress(FileNotFoundError):
                    self.cfg.save_switch.unlink()
            ckpt.barrier()

    def final(self, last_step: int, steps_run: int, completed: bool) -> None:
        """The end-of-run save of a run that completed, unless its last step is already on disk."""
        if self.cfg.checkpoint_dir is not None and completed and steps_run and self._saved_at != last_step:
            self._save(last_step)

    def _save(self, step: int) -> Path:
        assert self.cfg.checkpoint_dir is not None
        folder = ckpt.save(self.cfg.checkpoint_dir, step, self.model, self.optimizer, self.stream,
                           self.cfg.keep_last)
        self._saved_at = step
        self.saved.append(str(folder))
        return folder

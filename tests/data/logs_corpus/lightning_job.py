"""A Lightning DDP job on CPU (2 ranks) whose rank 1 raises in training_step, for the `mldebug logs` corpus."""

from __future__ import annotations

import lightning as L
import torch


class Model(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        if self.global_rank == 1 and batch_idx == 2:
            raise ValueError(f"bad batch on rank {self.global_rank}: shape mismatch")
        return self.layer(batch).sum()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


if __name__ == "__main__":
    data = torch.utils.data.DataLoader(torch.randn(64, 4), batch_size=4)
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=1, logger=False,
                        enable_checkpointing=False, enable_model_summary=False)
    trainer.fit(Model(), data)

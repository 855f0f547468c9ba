"""A Lightning Trainer on the CPU with gpuwatch's callback: 4 steps, validation every 2.

training_step calls a submodule (not the LightningModule itself) and Lightning runs the
forward and backward inside the optimizer's closure: both must still give plain phases.
"""

from __future__ import annotations

import sys

import fake_facts
import torch

fake_facts.install()

import lightning as L  # noqa: E402
from torch import nn  # noqa: E402

from gpuwatch.integrations.lightning import GpuwatchCallback  # noqa: E402


class Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def validation_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", nn.functional.cross_entropy(self.net(x), y))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def main() -> int:
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(32, 16), torch.randint(0, 4, (32,)))
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    trainer = L.Trainer(
        max_steps=4,
        val_check_interval=2,
        limit_val_batches=1,
        num_sanity_val_steps=0,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[GpuwatchCallback()],
    )
    trainer.fit(Tiny(), loader, loader)
    print("trained", trainer.global_step, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

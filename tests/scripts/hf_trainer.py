"""A transformers Trainer on a tiny GPT-2 built from a config (no download), with gpuwatch's
callback: 4 optimizer steps of 2 micro-batches, an evaluation every 2 steps."""

from __future__ import annotations

import sys
import tempfile

import fake_facts
import torch

fake_facts.install()

from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments  # noqa: E402

from gpuwatch.integrations.transformers import GpuwatchCallback  # noqa: E402


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n: int) -> None:
        self.ids = torch.randint(0, 64, (n, 16))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def main() -> int:
    torch.manual_seed(0)
    model = GPT2LMHeadModel(
        GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=16)
    )
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(
            output_dir=out,
            max_steps=4,
            per_device_train_batch_size=2,
            gradient_accumulation_steps=2,
            eval_strategy="steps",
            eval_steps=2,
            per_device_eval_batch_size=4,
            save_strategy="no",
            logging_strategy="no",
            report_to=[],
            use_cpu=True,
            disable_tqdm=True,
            dataloader_num_workers=0,
        )
        trainer = Trainer(
            model=model,
            args=args,
            train_dataset=Tokens(16),
            eval_dataset=Tokens(4),
            callbacks=[GpuwatchCallback()],
        )
        trainer.train()
    print("trained", trainer.state.global_step, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

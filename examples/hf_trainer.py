"""Balanced batches with the Hugging Face ``Trainer``: override ``get_train_dataloader``.

    python examples/hf_trainer.py --steps 5                         # one process
    torchrun --nproc_per_node 2 examples/hf_trainer.py --steps 5    # data parallel

Needs ``transformers`` (and ``accelerate``, which ``Trainer`` uses); without them the script
prints what to install and exits. A tiny Llama model is trained on random variable-length
sequences.

How it fits together:

- :class:`~seqbalance.runtime.BalancedBatchSampler` yields this rank's micro-batches. The plan
  uses ``num_microbatches = gradient_accumulation_steps`` and ``micro_batch_size =
  per_device_train_batch_size`` (global batch = their product times the world size), so every
  optimizer step of the Trainer consumes exactly one planned step on every rank; the last,
  partial step of an epoch is dropped to keep that true.
- ``get_train_dataloader`` returns a plain ``DataLoader`` with that ``batch_sampler``. It is not
  passed through ``accelerator.prepare``: Accelerate would shard the batches across ranks a
  second time. The Trainer still moves each batch to the device.
- ``set_epoch`` is forwarded from the DataLoader to the sampler, so every epoch is re-planned.
- Hugging Face models take padded ``[batch, sequence]`` inputs here, so the plan uses
  ``layout="padded"``: costs count the padding of each micro-batch, and the planner groups
  similar lengths into a micro-batch while balancing the ranks.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from typing import Any

import numpy as np
import torch

from seqbalance.cost import ModelSpec
from seqbalance.runtime import BalancedBatchSampler


class EpochDataLoader(torch.utils.data.DataLoader):
    """A DataLoader whose ``set_epoch`` reaches its batch sampler (the Trainer calls it)."""

    def set_epoch(self, epoch: int) -> None:
        self.batch_sampler.set_epoch(epoch)


def pad(samples: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """Right-pad a micro-batch to its longest sample; padding carries no loss."""
    longest = max(len(s["input_ids"]) for s in samples)
    input_ids = torch.zeros(len(samples), longest, dtype=torch.int64)
    attention_mask = torch.zeros_like(input_ids)
    for row, sample in enumerate(samples):
        input_ids[row, : len(sample["input_ids"])] = torch.tensor(sample["input_ids"])
        attention_mask[row, : len(sample["input_ids"])] = 1
    labels = input_ids.masked_fill(attention_mask == 0, -100)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--samples", type=int, default=1024)
    parser.add_argument("--per-device-batch-size", type=int, default=4)
    parser.add_argument("--gradient-accumulation-steps", type=int, default=2)
    args = parser.parse_args()
    try:
        from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments
    except ImportError:
        print(
            "examples/hf_trainer.py needs Hugging Face transformers: "
            "pip install transformers accelerate",
            file=sys.stderr,
        )
        return 0

    rng = np.random.default_rng(0)
    lengths = np.clip(rng.lognormal(5.0, 0.8, args.samples), 8, 1024).astype(np.int64)
    dataset = [{"input_ids": rng.integers(0, 512, n).tolist()} for n in lengths]
    config = LlamaConfig(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=176,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=1024,
    )
    model = LlamaForCausalLM(config)

    class BalancedTrainer(Trainer):
        def get_train_dataloader(self) -> torch.utils.data.DataLoader:
            micro_batch_size = self.args.per_device_train_batch_size
            accumulation = self.args.gradient_accumulation_steps
            sampler = BalancedBatchSampler(
                lengths,
                micro_batch_size * accumulation * self.args.world_size,
                rank=self.args.process_index,
                world_size=self.args.world_size,
                seed=self.args.seed,
                drop_last=True,
                layout="padded",
                micro_batch_size=micro_batch_size,
                num_microbatches=accumulation,
                cost=ModelSpec.from_hf_config(config),
            )
            return EpochDataLoader(self.train_dataset, batch_sampler=sampler, collate_fn=pad)

    with tempfile.TemporaryDirectory() as output_dir:
        training_args = TrainingArguments(
            output_dir=output_dir,
            max_steps=args.steps,
            per_device_train_batch_size=args.per_device_batch_size,
            gradient_accumulation_steps=args.gradient_accumulation_steps,
            learning_rate=1e-3,
            logging_steps=1,
            save_strategy="no",
            report_to=[],
            use_cpu=not torch.cuda.is_available(),
            seed=0,
        )
        trainer = BalancedTrainer(model=model, args=training_args, train_dataset=dataset)
        result = trainer.train()
    if training_args.process_index == 0:
        print(f"trained {result.global_step} steps, final loss {result.training_loss:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

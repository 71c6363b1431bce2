"""Balanced batches with the Hugging Face ``Trainer``: three lines with the seqbalance mixin.

    python examples/hf_trainer.py --steps 5                         # one process
    torchrun --nproc_per_node 2 examples/hf_trainer.py --steps 5    # data parallel
    python examples/hf_trainer.py --epochs 2                        # by epochs (len() checks)

Needs ``transformers`` (and ``accelerate``, which ``Trainer`` uses); without them the script
prints what to install and exits. A tiny Llama model is trained on random variable-length
sequences.

The three lines (see ``seqbalance.integrations.hf`` for everything they do)::

    from seqbalance.integrations.hf import BalancedTrainerMixin
    class BalancedTrainer(BalancedTrainerMixin, Trainer): ...
    trainer = BalancedTrainer(..., seqbalance_options={"max_tokens": 4096})

Every optimizer step then holds ``per_device_train_batch_size x gradient_accumulation_steps x
world_size`` samples, planned so the ranks finish together; each rank runs exactly
``gradient_accumulation_steps`` padded micro-batches of at most ``per_device_train_batch_size``
samples; the loss is the token mean over the whole step (the Trainer's ``num_items_in_batch``);
checkpoints record the sampler state and resume exactly.

By epochs (``--epochs``), the Trainer sizes the run from ``len(dataloader)``: the sampler knows
it exactly without planning the epoch (every step has ``gradient_accumulation_steps``
micro-batches), so the scheduler's total steps, the number of steps trained and the epoch's end
agree; the script prints them and checks that the linear schedule reaches 0 exactly at the end.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from typing import Any

import numpy as np
import torch

from seqbalance.integrations.hf import BalancedTrainerMixin


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
    parser.add_argument("--epochs", type=int, default=None, help="train whole epochs instead")
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

    class BalancedTrainer(BalancedTrainerMixin, Trainer):
        pass

    with tempfile.TemporaryDirectory() as output_dir:
        training_args = TrainingArguments(
            output_dir=output_dir,
            max_steps=-1 if args.epochs else args.steps,
            num_train_epochs=args.epochs or 1,
            per_device_train_batch_size=args.per_device_batch_size,
            gradient_accumulation_steps=args.gradient_accumulation_steps,
            learning_rate=1e-3,
            logging_steps=1,
            save_strategy="no",
            report_to=[],
            use_cpu=not torch.cuda.is_available(),
            seed=0,
        )
        trainer = BalancedTrainer(
            model=model,
            args=training_args,
            train_dataset=dataset,
            data_collator=pad,
            seqbalance_options={"max_tokens": 4096},
        )
        result = trainer.train()
        sampler = trainer.get_train_dataloader().batch_sampler
        final_lr = trainer.lr_scheduler.get_last_lr()[0]
    if training_args.process_index == 0:
        print(f"trained {result.global_step} steps, final loss {result.training_loss:.3f}")
    if args.epochs:
        # len() = steps x gradient_accumulation_steps, known before any step is planned.
        per_epoch = len(sampler) // args.gradient_accumulation_steps
        print(
            f"len(dataloader) = {len(sampler)} micro-batches = {per_epoch} steps per epoch; "
            f"scheduler total steps {trainer.state.max_steps}, trained {result.global_step} "
            f"steps over {trainer.state.epoch:g} epochs, final learning rate {final_lr:g}"
        )
        expected = per_epoch * args.epochs
        if not (trainer.state.max_steps == result.global_step == expected and final_lr == 0):
            print("the schedule and the epochs disagree", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Train a tiny random Llama with the stock Trainer or seqbalance's, print the run as JSON.

Run directly (one process) or under ``torch.distributed.run`` (gloo), printing ``RESULT`` and
the report as JSON; tests/_hf_train.py calls :func:`main` on ranks of the project's launcher
instead (tests/integrations/test_integrations_hf*.py).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys

import numpy as np
import torch


def dataset(n: int, vocab: int, seed: int) -> list[dict[str, list[int]]]:
    """Learnable sequences: each continues ``t -> (t * 5 + 3) % vocab`` from a random start."""
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(3.2, 0.7, n), 4, 160).astype(int)
    rows = []
    for length in lengths:
        token = int(rng.integers(0, vocab))
        ids = []
        for _ in range(length):
            ids.append(token)
            token = (token * 5 + 3) % vocab
        rows.append({"input_ids": ids})
    return rows


def pad(samples: list[dict]) -> dict[str, torch.Tensor]:
    longest = max(len(s["input_ids"]) for s in samples)
    ids = torch.zeros(len(samples), longest, dtype=torch.int64)
    mask = torch.zeros_like(ids)
    for row, sample in enumerate(samples):
        ids[row, : len(sample["input_ids"])] = torch.tensor(sample["input_ids"])
        mask[row, : len(sample["input_ids"])] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


def word_tokenizer(vocab: int):
    """A tokenizer over tokens "0".."vocab-1" built offline (TRL needs a processing class)."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    words = {str(i): i for i in range(vocab - 2)}
    words.update({"<pad>": vocab - 2, "</s>": vocab - 1})
    backend = Tokenizer(WordLevel(words, unk_token="<pad>"))
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="</s>")


def train_trl(args: argparse.Namespace, mode: str, output_dir: str, model, data, vocab: int):
    import datasets
    from trl import SFTConfig, SFTTrainer

    from seqbalance.integrations.hf import BalancedTrainerMixin

    config = SFTConfig(
        output_dir=output_dir,
        max_steps=args.steps,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        learning_rate=args.lr,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        seed=0,
        lr_scheduler_type="constant",
        padding_free=True,
        max_length=None,
        dataset_num_proc=None,
    )
    table = datasets.Dataset.from_list(data)
    if mode == "stock":
        trainer = SFTTrainer(
            model=model, args=config, train_dataset=table, processing_class=word_tokenizer(vocab)
        )
    else:

        class BalancedSFTTrainer(BalancedTrainerMixin, SFTTrainer):
            pass

        trainer = BalancedSFTTrainer(
            model=model,
            args=config,
            train_dataset=table,
            processing_class=word_tokenizer(vocab),
            seqbalance_options={"max_tokens": 512},
        )
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    layout = None
    if mode == "balanced":
        layout = trainer._seqbalance_loader.batch_sampler.options.layout
    return {"losses": losses, "layout": layout}


def main(argv: list[str] | None = None) -> dict | None:
    """The run that the command line ``argv`` (default: ``sys.argv[1:]``) asks for: its report
    (None on a process other than the first)."""
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--mode",
        choices=("stock", "balanced", "both"),
        required=True,
        help="both: stock, then balanced, in this process (RESULT {'stock': ..., 'balanced': ...})",
    )
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--lr", type=float, default=5e-3)
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--save-steps", type=int, default=0)
    parser.add_argument("--resume", default=None, help="a checkpoint, or 'last' (True)")
    parser.add_argument("--max-tokens", type=int, default=1024)
    parser.add_argument("--data-seed", type=int, default=None)
    parser.add_argument("--trl", action="store_true", help="TRL SFTTrainer(padding_free=True)")
    parser.add_argument(
        "--manual-loss", action="store_true", help="also report step 0's token mean"
    )
    parser.add_argument(
        "--refusals",
        default=None,
        help="JSON list of resumes expected to be refused, each changing output_dir, resume, "
        "data_seed or max_tokens; one process tries them in turn (RESULT {'refused': the "
        "ValueError message of each, or None where one trained})",
    )
    args = parser.parse_args(argv)
    if args.refusals is not None:
        report = {"refused": [_refused(args, changes) for changes in json.loads(args.refusals)]}
    elif args.mode != "both":
        report = train(args, args.mode, args.output_dir)
    else:  # one process for both: a run costs its imports more than its steps
        report = {
            mode: train(args, mode, os.path.join(args.output_dir, mode))
            for mode in ("stock", "balanced")
        }
    return report


def _refused(args: argparse.Namespace, changes: dict) -> str | None:
    """The ValueError of a run with ``changes`` (None: it trained)."""
    attempt = argparse.Namespace(**{**vars(args), **changes})
    try:
        train(attempt, attempt.mode, attempt.output_dir)
    except ValueError as error:
        return str(error)
    return None


def train(args: argparse.Namespace, mode: str, output_dir: str) -> dict | None:
    """One run in ``mode``; its report (None on a process other than the first)."""
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

    from seqbalance.integrations.hf import BalancedTrainerMixin

    torch.manual_seed(0)
    vocab = 64
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=256,
    )
    model = LlamaForCausalLM(config)
    data = dataset(256, vocab, seed=1)
    training_args = TrainingArguments(
        output_dir=output_dir,
        max_steps=args.steps,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        learning_rate=args.lr,
        logging_steps=1,
        save_strategy="steps" if args.save_steps else "no",
        save_steps=args.save_steps or 500,
        report_to=[],
        use_cpu=True,
        seed=0,
        lr_scheduler_type="constant",
        dataloader_num_workers=0,
        data_seed=args.data_seed,
    )
    if args.trl:
        return train_trl(args, mode, output_dir, model, data, vocab)
    if mode == "stock":
        trainer = Trainer(model=model, args=training_args, train_dataset=data, data_collator=pad)
    else:

        class BalancedTrainer(BalancedTrainerMixin, Trainer):
            pass

        trainer = BalancedTrainer(
            model=model,
            args=training_args,
            train_dataset=data,
            data_collator=pad,
            seqbalance_options={"max_tokens": args.max_tokens},
        )
    # Step 0's loss is computed with the initial weights: keep them for the manual token mean.
    initial = copy.deepcopy(model) if args.manual_loss and mode == "balanced" else None
    resume = True if args.resume == "last" else args.resume
    result = trainer.train(resume_from_checkpoint=resume)
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    report = {
        "losses": losses,
        "training_loss": result.training_loss,
        "param_sum": float(sum(p.double().sum() for p in model.parameters())),
        "world_size": training_args.world_size,
    }
    if args.manual_loss and mode == "balanced":
        plan = trainer._seqbalance_loader.batch_sampler.epoch_plan(0)
        samples = plan.sample_indices[0]
        total, tokens = 0.0, 0
        with torch.no_grad():
            for i in samples.tolist():
                ids = torch.tensor(data[i]["input_ids"])[None]
                loss = initial(input_ids=ids, labels=ids).loss
                total += float(loss) * (ids.shape[1] - 1)
                tokens += ids.shape[1] - 1
        report["manual_step0"] = total / tokens
    return report if training_args.process_index == 0 else None


if __name__ == "__main__":
    result = main()
    if result is not None:
        print("RESULT " + json.dumps(result))
    # Under torchrun, the interpreter's teardown with gloo's threads alive has been seen to abort
    # ("terminate called without an active exception", exit -6) after the result was printed:
    # tear the group down and leave without the teardown.
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)

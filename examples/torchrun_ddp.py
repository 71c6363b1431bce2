"""Train a small causal transformer with DDP on variable-length data, balanced by seqbalance.

    torchrun --nproc_per_node 2 examples/torchrun_ddp.py --steps 5
    torchrun --nproc_per_node 2 examples/torchrun_ddp.py --steps 5 --strategy round_robin

Every rank builds the same :class:`~seqbalance.runtime.BalancedBatchSampler` from the dataset's
lengths; it plans each optimizer step (which samples go to which rank and micro-batch, under a
hard token cap per packed micro-batch) so that ranks finish their compute together. The model
takes packed (THD) micro-batches: the samples of a micro-batch are concatenated and
``cu_seqlens`` marks their boundaries. Gradients are accumulated over the step's micro-batches
(``no_sync`` on all but the last) and synchronised once.

Loss normalisation: micro-batches of a balanced plan hold unequal token counts, so averaging
each micro-batch's mean loss would weight tokens unequally. Every micro-batch's summed token
loss is divided by the label tokens of the whole step (all micro-batches, all ranks; known from
the plan, so no communication), times the world size because DDP averages gradients over ranks:
the step's gradient is that of the mean token loss over the step, as Hugging Face's
``num_items_in_batch`` does.

Each step prints its wall time, the plan's predicted imbalance (slowest rank's predicted cost
over the mean) and the measured one: each rank's compute time up to the gradient
synchronisation (the last backward, where the fast ranks wait), max over mean. Runs on CPU with
gloo by default and on GPUs with NCCL when CUDA is available.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from seqbalance.measure.toy_model import IGNORE_INDEX, TinyCausalTransformer, ToyModelConfig
from seqbalance.runtime import BalancedBatchSampler, TorchFlopsMeter


class RandomTokens(torch.utils.data.Dataset):
    """Sample ``i``: ``lengths[i]`` random tokens, the same in every process."""

    def __init__(self, lengths: np.ndarray, vocab_size: int, seed: int) -> None:
        self.lengths = lengths
        self.vocab_size = vocab_size
        self.seed = seed

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, index: int) -> torch.Tensor:
        rng = np.random.default_rng([self.seed, index])
        return torch.from_numpy(rng.integers(0, self.vocab_size, int(self.lengths[index])))


def pack(samples: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """Concatenate samples into one THD micro-batch with next-token labels per sample."""
    input_ids = torch.cat(samples)
    labels = torch.cat([torch.cat([s[1:], torch.tensor([IGNORE_INDEX])]) for s in samples])
    bounds = torch.zeros(len(samples) + 1, dtype=torch.int32)
    bounds[1:] = torch.cumsum(torch.tensor([len(s) for s in samples]), 0)
    return {"input_ids": input_ids, "labels": labels, "cu_seqlens": bounds}


def synthetic_lengths(n: int, max_length: int, seed: int) -> np.ndarray:
    """Heavy-tailed lengths (log-normal, median ~150 tokens), as in chat / SFT data."""
    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(mean=5.0, sigma=0.9, size=n), 8, max_length).astype(np.int64)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps to run")
    parser.add_argument("--samples", type=int, default=4096, help="dataset size")
    parser.add_argument("--global-batch-size", type=int, default=32, help="samples per step")
    parser.add_argument("--max-tokens", type=int, default=2048, help="token cap per micro-batch")
    parser.add_argument(
        "--strategy",
        default="balanced",
        help="plan strategy: balanced, token_kk, round_robin, contiguous, first_fit",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=1e-3)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo", timeout=timedelta(minutes=5))
    rank, world_size = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else None
    if device is not None:
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))

    config = ToyModelConfig(max_position=args.max_tokens)
    model = TinyCausalTransformer(config, seed=args.seed).to(device or "cpu")
    spec = model.model_spec()
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=args.lr)

    lengths = synthetic_lengths(args.samples, args.max_tokens, args.seed)
    sampler = BalancedBatchSampler(
        lengths,
        args.global_batch_size,
        seed=args.seed,
        max_tokens=args.max_tokens,
        cost=spec,
        strategy=args.strategy,
    )
    loader = torch.utils.data.DataLoader(
        RandomTokens(lengths, config.vocab_size, args.seed), batch_sampler=sampler, collate_fn=pack
    )
    meter = TorchFlopsMeter(spec)
    steps = min(args.steps, sampler.num_steps)
    if rank == 0:
        print(
            f"{world_size} ranks ({'nccl' if cuda else 'gloo'}), strategy={args.strategy}, "
            f"{args.global_batch_size} samples/step, max_tokens={args.max_tokens}"
        )
        print("step  seconds  loss    micro-batches  predicted imbalance  measured imbalance")

    batches = iter(loader)
    step_seconds = []
    interval_start = time.perf_counter()
    for step in range(steps):
        started = time.perf_counter()
        # The step's plan, made ahead by the sampler's background planner (not planned again).
        plan = sampler.step_plan(step)
        n_microbatches = plan.n_microbatches
        # Every sample's last token has no label: a step's label tokens are sum(length - 1).
        step_tokens = int((plan.lengths - 1).sum())
        loss_sum = torch.zeros((), device=device or "cpu")
        compute = 0.0
        for index in range(n_microbatches):
            batch = {k: v.to(device or "cpu") for k, v in next(batches).items()}
            last = index == n_microbatches - 1
            with contextlib.nullcontext() if last else ddp.no_sync():
                mean = ddp(batch["input_ids"], batch["cu_seqlens"], batch["labels"])
                tokens = int((batch["labels"] != IGNORE_INDEX).sum())
                if last:  # the fast ranks wait for the slow ones in this backward
                    if cuda:
                        torch.cuda.synchronize()
                    compute = time.perf_counter() - started
                (mean * tokens * world_size / step_tokens).backward()
                loss_sum += mean.detach() * tokens
            meter.add(batch["cu_seqlens"])
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        dist.all_reduce(loss_sum)  # the step's mean token loss, for the log line only
        loss = loss_sum / step_tokens
        computes: list[float] = [0.0] * world_size
        dist.all_gather_object(computes, compute)
        step_seconds.append(time.perf_counter() - started)
        if rank == 0:
            predicted = plan.summary()["imbalance"]
            measured = max(computes) / (sum(computes) / world_size)
            print(
                f"{step:4d}  {step_seconds[-1]:7.3f}  {float(loss):6.3f}  "
                f"{n_microbatches:13d}  {predicted:19.3f}  {measured:18.3f}"
            )
    report = meter.report(time.perf_counter() - interval_start)
    if rank == 0:
        print(
            f"mean step {np.mean(step_seconds):.3f} s; {report.tokens} tokens; "
            f"{report.tflops_per_gpu * 1e3:.2f} GFLOP/s per rank (model FLOPs)"
        )


if __name__ == "__main__":
    main()
    # Tear the group down once the model (and its DDP reducer) is gone, then leave without the
    # interpreter's teardown: freeing a DDP model after the group was destroyed can deadlock
    # in torch's gloo destructor (it joins a thread that waits for the GIL it holds).
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)

"""Overhead of the StepTimer against a real training step of the toy transformer.

    python benchmarks/timer.py [--device cpu|cuda] [--steps 30] [--microbatches 4]

One process trains ``TinyCausalTransformer`` (the bench's "small" size) on packed micro-batches
of 4096 tokens: ``--steps`` steps of ``--microbatches`` micro-batches each (forward + backward,
then an optimizer step), alternately with and without the timer (a ``StepTimer.microbatch()``
region around each micro-batch, a ``sync()`` region around the optimizer step, and
``finish()``), so a slow spell of the machine hits both alike. Reported: the mean step time of
each, the timer's own cost per step measured apart (the same regions around empty bodies,
10,000 steps: what the timer adds, without the step's noise) and that cost as a fraction of
the step. On CUDA the regions record CUDA events (no synchronisation until ``finish``).

Prints a markdown section for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import platform
import time

import torch

from seqbalance.measure.calibrate import model_config
from seqbalance.measure.toy_model import TinyCausalTransformer, make_packed_batch
from seqbalance.runtime.closed_loop.timer import StepTimer

TOKENS = 4096


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--microbatches", type=int, default=4)
    args = parser.parse_args()
    torch.set_num_threads(1)
    device = torch.device(args.device)
    model = TinyCausalTransformer(model_config("small", max_position=TOKENS), seed=0).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    vocab = model.config.vocab_size
    batches = [
        tuple(t.to(device) for t in make_packed_batch([512] * 8, vocab_size=vocab, seed=i))
        for i in range(args.microbatches)
    ]
    timer = StepTimer(device)

    def synchronize() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def step(timed: bool) -> float:
        synchronize()
        start = time.perf_counter()
        for batch in batches:
            if timed:
                with timer.microbatch():
                    model(*batch, reduction="sum").backward()
            else:
                model(*batch, reduction="sum").backward()
        if timed:
            with timer.sync():
                optimizer.step()
            timer.finish()
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=False)
        synchronize()
        return time.perf_counter() - start

    step(False), step(True)  # warm-up
    plain, timed = [], []
    for _ in range(args.steps):
        plain.append(step(False))
        timed.append(step(True))
    repeats = 10_000
    start = time.perf_counter()
    for _ in range(repeats):
        for _ in batches:
            with timer.microbatch():
                pass
        with timer.sync():
            pass
        timer.finish()
    own = (time.perf_counter() - start) / repeats
    mean_plain = sum(plain) / len(plain)
    mean_timed = sum(timed) / len(timed)
    print(
        f"### StepTimer overhead: {args.device}, toy-small, {args.microbatches} micro-batches "
        f"of {TOKENS} tokens per step, {args.steps} steps each\n"
    )
    print("| measure | value |\n|:---|---:|")
    print(f"| mean step without the timer (ms) | {1e3 * mean_plain:.2f} |")
    print(f"| mean step with the timer (ms) | {1e3 * mean_timed:.2f} |")
    print(f"| timer's own cost per step (µs) | {1e6 * own:.1f} |")
    print(f"| own cost / step | {100 * own / mean_plain:.4f}% |")
    print(f"| with / without (noisy) | {mean_timed / mean_plain:.4f} |")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor()
    machine = f"{platform.machine()} {name or platform.platform()}"
    print(f"\nMachine: {machine}, torch {torch.__version__}")


if __name__ == "__main__":
    main()

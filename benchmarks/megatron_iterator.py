"""Benchmark: how soon MegatronDataIterator.steps() yields its first step, against planning the
whole epoch first (what steps() did before it planned lazily).

    python benchmarks/megatron_iterator.py [--samples 100000]

One process, process CPU time (all threads: the sampler's planner thread included), so a loaded
machine changes the wall time but hardly these figures. Lengths: uniform 16..4096 tokens, 256
samples per step over 8 data-parallel ranks, 16,384-token cap, Qwen3-8B FLOPs. Prints a markdown
section for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import platform
import time

import numpy as np

from seqbalance.integrations.megatron import MegatronDataIterator


class _Data:
    """Token sequences made on demand (the benchmark times planning, not a dataset)."""

    def __init__(self, lengths: np.ndarray) -> None:
        self.lengths = lengths

    def __len__(self) -> int:
        return self.lengths.size

    def __getitem__(self, i: int) -> np.ndarray:
        return np.zeros(int(self.lengths[i]), dtype=np.int64)


def _iterator(lengths: np.ndarray) -> MegatronDataIterator:
    return MegatronDataIterator(
        _Data(lengths), lengths, global_batch_size=256, dp_rank=0, dp_size=8,
        max_tokens=16384, cost="flops", model="qwen3-8b",
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=100_000)
    args = parser.parse_args()
    lengths = np.random.default_rng(0).integers(16, 4097, args.samples)

    started = time.process_time()
    steps = _iterator(lengths).steps()
    next(steps)
    lazy = time.process_time() - started
    for _ in range(5):
        next(steps)
    five = time.process_time() - started - lazy

    started = time.process_time()
    eager = _iterator(lengths)
    eager.microbatches_per_step()  # every step planned before the first
    whole = time.process_time() - started

    print(
        "## MegatronDataIterator: time to the first step\n\n"
        f"`python benchmarks/megatron_iterator.py --samples {args.samples}` — "
        f"{platform.processor() or platform.machine()}, process CPU seconds "
        f"({eager.num_steps()} steps of 256 samples, 8 ranks, cap 16,384, Qwen3-8B FLOPs).\n\n"
        "| | CPU s |\n|---|---:|\n"
        f"| `steps()`: first step (planned just ahead) | {lazy:.3f} |\n"
        f"| the next 5 steps | {five:.3f} |\n"
        f"| the whole epoch planned first (before: `steps()` did this, then planned each step "
        f"again) | {whole:.3f} |\n\n"
        f"First step {whole / lazy:.0f}x sooner.\n"
    )


if __name__ == "__main__":
    main()

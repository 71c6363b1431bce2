"""Benchmark of the WindowBalancer: does a bigger window lower the ranks' idle time?

    python benchmarks/window.py [--quick] [--seeds 3] [--out FILE]

A stream of ShareGPT samples (``seqbalance.datasets.load("sharegpt")``, shuffled with a fixed
seed, lengths longer than the cap truncated to it, as trainers do) flows through a
``WindowBalancer(dp_size=8, batch_size=64, window=m * 64)`` with Qwen3-8B training FLOPs as
cost and a 16384-token cap, for window multiples m = 1, 2, 4 at the default ``max_delay``; and,
for comparison, at the previous default (``ceil(window / batch_size) - 1``, which makes every
sample due as soon as the window is full). The loop pushes until the window is full and then
dispatches one step; the final ``flush()`` (partial steps) is not counted.

Idle fraction of a step: ``1 - mean / max`` of the ranks' predicted costs (the share of the
slowest rank's time the average rank waits at the gradient all-reduce); reported as the mean
over dispatched steps, averaged over ``--seeds`` shuffles. ``at deadline`` is the share of
dispatched samples that had waited exactly ``max_delay`` dispatches (forced out by their
deadline rather than chosen for balance).

Prints a markdown section for BENCHMARKS.md (and writes it to FILE with ``--out``).
"""

from __future__ import annotations

import argparse
import platform
import time
from pathlib import Path

import numpy as np

from seqbalance.datasets import load
from seqbalance.runtime import WindowBalancer

DP, BATCH, CAP, MODEL = 8, 64, 16384, "qwen3-8b"
MULTIPLES = (1, 2, 4)


def stream(seed: int, limit: int | None) -> np.ndarray:
    """ShareGPT lengths, truncated to the cap, in a seeded random order."""
    lengths = np.minimum(load("sharegpt"), CAP)
    order = np.random.default_rng(seed).permutation(lengths.size)
    return lengths[order][:limit]


def run(lengths: np.ndarray, multiple: int, max_delay: int | None) -> tuple[float, float, int]:
    """Mean idle fraction over full dispatches, share of samples at their deadline, steps."""
    balancer = WindowBalancer(
        DP,
        BATCH,
        window=multiple * BATCH,
        max_delay=max_delay,
        cost="flops",
        model=MODEL,
        max_tokens=CAP,
    )
    idle, at_deadline, pushed = [], 0, 0
    while pushed < lengths.size:
        take = min(balancer.window - len(balancer), lengths.size - pushed)
        balancer.push(lengths[pushed : pushed + take])
        pushed += take
        if balancer.ready():
            dispatch = balancer.dispatch()
            ranks = dispatch.plan.costs.sum(axis=1)
            idle.append(1.0 - ranks.mean() / ranks.max())
            at_deadline += int((dispatch.waited == balancer.max_delay).sum())
    balancer.flush()
    return float(np.mean(idle)), at_deadline / (len(idle) * BATCH), len(idle)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2,560 samples, one seed")
    parser.add_argument("--seeds", type=int, default=3, help="stream shuffles to average")
    parser.add_argument("--out", type=Path, help="also write the section to this file")
    args = parser.parse_args()
    seeds = 1 if args.quick else args.seeds
    limit = 40 * BATCH if args.quick else None
    started = time.perf_counter()
    rows = []
    for multiple in MULTIPLES:
        for label, max_delay in (("default", None), ("previous default", multiple - 1)):
            if multiple == 1 and max_delay is not None:
                continue  # a 1x window leaves no choice: both defaults are the same
            results = [run(stream(seed, limit), multiple, max_delay) for seed in range(seeds)]
            idle, forced, steps = (np.mean([r[k] for r in results]) for k in range(3))
            delay = WindowBalancer(DP, BATCH, window=multiple * BATCH, max_delay=max_delay)
            rows.append(
                f"| {multiple}x ({multiple * BATCH}) | {label}: {delay.max_delay} | "
                f"{idle:.5f} | {forced:.1%} | {steps:.0f} |"
            )
    elapsed = time.perf_counter() - started
    lines = [
        "## WindowBalancer: idle fraction by window size (`benchmarks/window.py`)",
        "",
        f"ShareGPT stream (truncated to {CAP} tokens), dp {DP}, batch {BATCH}, Qwen3-8B "
        f"training FLOPs, max_tokens {CAP}; mean over {seeds} shuffle(s) of the mean over "
        "dispatched steps of 1 - mean/max rank cost.",
        "",
        "| window | max_delay | idle fraction | at deadline | steps |",
        "|---|---|---|---|---|",
        *rows,
        "",
        f"Machine: {platform.machine()}, {platform.system()} {platform.release()}, Python "
        f"{platform.python_version()}; {time.strftime('%Y-%m-%d')}, {elapsed:.0f} s. "
        "Command: `python benchmarks/window.py"
        + (" --quick" if args.quick else f" --seeds {seeds}")
        + "`.",
    ]
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()

"""seqbalance against what the training stacks run today, on slime's four published setups.

    python benchmarks/stacks.py            # full table (a few minutes on 2 cores)
    python benchmarks/stacks.py --steps 3  # quick look

Every setup is simulated with ``seqbalance.sim.simulate`` on identical batches for ``balanced``
and each stack's real scheduler (``seqbalance.plan.stacks``: ``verl``, ``slime``,
``slime_flops``, ``torchspec``, plus ``token_kk``), under both objectives. The Hugging Face
baselines (``hf_default``, ``hf_length_grouped``) pad their micro-batches and are compared with
``seqbalance simulate --layout padded`` instead (these setups pack).
Predicted step times are FLOPs of the named preset at the default peak and efficiency; the
table shows, per stack, the mean predicted step time, seqbalance's predicted reduction of it
and the stack's over-cap micro-batches (seqbalance's cap is hard: always 0).

The setups follow slime's published FLOPs-balancing comparison (its train-time deltas of
balancing by FLOPs against token-sum Karmarkar–Karp are printed beside them): SFT lengths are the
bundled ShareGPT set, RL lengths come from ``seqbalance.datasets.rl_lengths`` (GRPO-like groups of
8 responses, heavy tails up to the response limit).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

import numpy as np

import seqbalance as sb
from seqbalance.sim import simulate

STACKS = ("token_kk", "verl", "slime", "slime_flops", "torchspec")


@dataclass(frozen=True)
class Setup:
    name: str
    model: str
    dp: int
    cap: int
    global_batch_size: int
    data: str  # "sft" (bundled ShareGPT) or "rl" (rl_lengths)
    max_response: int
    published: str  # slime's reported train-time change, FLOPs balance vs token KK


SETUPS = (
    Setup("SFT Qwen3-4B", "qwen3-4b", 4, 9216, 128, "sft", 0, "-12.7%"),
    Setup("SFT MoE Qwen3-30B-A3B", "qwen3-30b-a3b", 4, 8192, 128, "sft", 0, "-30.1%"),
    Setup("RL dense Qwen3-4B", "qwen3-4b", 4, 9216, 256, "rl", 8192, "-14.0%"),
    Setup("RL MoE Qwen3-30B-A3B", "qwen3-30b-a3b", 2, 20480, 256, "rl", 16384, "-20.6%"),
)


def lengths_of(setup: Setup) -> np.ndarray:
    if setup.data == "sft":
        return sb.datasets.load("sharegpt")
    lengths, _ = sb.datasets.rl_lengths(
        4096, max_response_length=setup.max_response, response_median=2000.0, seed=0
    )
    return lengths


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=10, help="optimizer steps per setup")
    args = parser.parse_args()
    header = (
        f"{'setup':24} {'objective':9} {'stack':18} {'stack s/step':>12} "
        f"{'balanced s/step':>15} {'predicted':>10} {'stack over-cap':>14} {'published':>9}"
    )
    print(header)
    print("-" * len(header))
    for setup in SETUPS:
        lengths = lengths_of(setup)
        for objective in ("step", "lockstep"):
            result = simulate(
                lengths,
                dp_size=setup.dp,
                global_batch_size=setup.global_batch_size,
                steps=args.steps,
                strategies=("balanced", *STACKS),
                cost="flops",
                model=setup.model,
                max_tokens=setup.cap,
                objective=objective,
                allow_oversize=True,
            )
            ours = result.strategies["balanced"]
            for stack in STACKS:
                theirs = result.strategies.get(stack)
                if theirs is None:
                    print(f"{setup.name:24} {objective:9} {stack:18} {'cannot plan':>12}")
                    continue
                gain = 1.0 - ours.mean_step_seconds / theirs.mean_step_seconds
                print(
                    f"{setup.name:24} {objective:9} {stack:18} {theirs.mean_step_seconds:12.3f} "
                    f"{ours.mean_step_seconds:15.3f} {-gain:+10.1%} {theirs.cap_violations:14d} "
                    f"{setup.published if stack == 'token_kk' else '':>9}"
                )
            assert ours.cap_violations == 0
    return 0


if __name__ == "__main__":
    sys.exit(main())

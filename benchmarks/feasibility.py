"""Refusals under a binding cap: how often ``plan_step`` refuses a fixed micro-batch count for
which a valid packing is known.

Every case has a known packing of its samples into ``dp x M`` micro-batches within the cap, so
a refusal is a planner miss, never a true infeasibility:

- ``partition``: lengths drawn from a bundled dataset (ShareGPT, LIMA, GSM8K) or uniform, and
  the cap set to the heaviest part of ``sb.partition(lengths, dp x M)``: the partition engine's
  own split is a valid plan (samples of one part form one micro-batch).
- ``planted``: ``dp x M`` micro-batches built first, each filled with 2 to 8 samples to 95-100%
  of the cap, then shuffled (the bins near full: the sum close to ``dp x M x cap``).
- ``planted_groups``: the same, each rank's samples in 1 to 3 groups (groups stay on a rank).
- ``groups``: one micro-batch per rank, groups of 2 to 6 samples, the cap set to the heaviest
  rank of ``sb.partition`` of the group totals over ``dp`` ranks.

Each case is planned with ``num_microbatches=M`` (``step`` objective, cost in tokens) and, for
the first two kinds, also without a fixed count: then the count ``plan_step`` chooses must be at
most ``M``. Ranks 2-16, M 1-4, 4-400 samples; a fixed seed, so the counts are reproducible.

Run: ``python benchmarks/feasibility.py [--cases 600] [--seed 0]``.
"""

from __future__ import annotations

import argparse
import time
from collections import Counter

import numpy as np

import seqbalance as sb

KINDS = ("partition", "planted", "planted_groups", "groups")
DATASETS = ("sharegpt", "lima", "gsm8k", "uniform")


def draw_case(kind: str, rng: np.random.Generator) -> dict:
    """One case: lengths, dp, M, cap and groups, with a packing within the cap known."""
    dp = int(rng.choice([2, 3, 4, 6, 8, 16]))
    m = 1 if kind == "groups" else int(rng.choice([1, 1, 2, 3, 4]))
    groups = None
    if kind.startswith("planted"):
        cap = int(rng.integers(1_000, 20_000))
        lengths: list[int] = []
        ranks: list[int] = []
        for slot in range(dp * m):
            k = int(rng.integers(2, 9))
            fill = int(cap * rng.uniform(0.95, 1.0))
            cuts = np.sort(rng.choice(np.arange(1, fill), k - 1, replace=False))
            lengths.extend(np.diff(np.concatenate(([0], cuts, [fill]))).tolist())
            ranks.extend([slot // m] * k)
        lengths_array = np.array(lengths, dtype=np.int64)
        if kind == "planted_groups":  # 1 to 3 groups within each rank's micro-batches
            groups = 3 * np.array(ranks) + rng.integers(0, 3, lengths_array.size)
        order = rng.permutation(lengths_array.size)
        groups = None if groups is None else groups[order]
        return {"lengths": lengths_array[order], "dp": dp, "m": m, "cap": cap, "groups": groups}
    per_slot = int(rng.integers(2, 9))
    n = dp * m * per_slot
    source = str(rng.choice(DATASETS))
    if source == "uniform":
        lengths_array = rng.integers(1, 4_000, n)
    else:
        lengths_array = rng.choice(sb.datasets.load(source), n).astype(np.int64)
    if kind == "groups":
        groups = np.repeat(np.arange(n), rng.integers(2, 7, n))[:n]
        totals = np.bincount(groups, weights=lengths_array)
        cap = int(sb.partition(totals, dp).max_load)
    else:
        cap = int(sb.partition(lengths_array, dp * m).max_load)
    return {"lengths": lengths_array, "dp": dp, "m": m, "cap": cap, "groups": groups}


def plan_or_none(case: dict, num_microbatches: int | None) -> sb.plan.StepPlan | None:
    try:
        return sb.plan_step(
            case["lengths"],
            case["dp"],
            max_tokens=case["cap"],
            num_microbatches=num_microbatches,
            groups=case["groups"],
            allow_empty=True,
        )
    except ValueError:
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=600, help="cases per kind")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    sb.plan_step([1], 1)  # imports the planner outside the timings
    refused: Counter[str] = Counter()
    more: Counter[str] = Counter()
    seconds: Counter[str] = Counter()
    for kind in KINDS:
        for _ in range(args.cases):
            case = draw_case(kind, rng)
            start = time.perf_counter()
            plan = plan_or_none(case, case["m"])
            seconds[kind] += time.perf_counter() - start
            if plan is None:
                refused[kind] += 1
            else:
                plan.validate()
            free = plan_or_none(case, None)
            # More micro-batches than M only when that plan is strictly cheaper (invariant 8).
            if free is None or (
                free.n_microbatches > case["m"]
                and (plan is None or free.step_cost >= plan.step_cost)
            ):
                more[kind] += 1
    print("| kind | cases | refused at M | free count above M, not cheaper | mean ms at M |")
    print("|---|---|---|---|---|")
    for kind in KINDS:
        mean = 1e3 * seconds[kind] / args.cases
        print(f"| {kind} | {args.cases} | {refused[kind]} | {more[kind]} | {mean:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

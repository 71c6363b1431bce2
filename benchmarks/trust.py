"""``balanced`` against every baseline on thousands of random steps: the count of steps where it
is worse must be 0.

Each input is a step drawn at random: lengths from a bundled real dataset (ShareGPT, GSM8K, LIMA,
Qwen2.5-Math with its GRPO groups) or synthetic (tiny, wide, all equal), 1 to 4096 samples on 1
to 64 ranks, with or without a token cap, groups, lockstep, the padded layout, fixed or multiple
micro-batch counts and empty micro-batches, costed in tokens, FLOPs or seconds with a
per-micro-batch overhead. Every registered ``baseline`` and ``stack`` strategy plans the same
step; a baseline's plan counts only when it is valid for the same options (a soft-cap plan only
when it kept the cap). ``balanced`` loses when its predicted step cost is higher than a valid
baseline plan's (relative tolerance 1e-9), or when it fails where a baseline plans.
``balanced`` plans with every rival (``planning_budget`` at least samples x ranks): by default
the budget follows the modeled step and may give up at most 0.1% on short steps (design
invariant 8).

Run: ``python benchmarks/trust.py [--inputs 2000] [--seed 0] [--markdown]``.
"""

from __future__ import annotations

import argparse
import platform
import time
from collections import Counter
from datetime import datetime, timezone

import numpy as np

import seqbalance as sb
from seqbalance.cost import TimeModel
from seqbalance.plan import get_strategy, strategy_names

DATASETS = ("sharegpt", "gsm8k", "lima", "qwen25math")
SIZES = (1, 2, 3, 5, 8, 12, 16, 24, 32, 64, 128, 256, 512, 1024, 4096)
SIZE_WEIGHTS = np.array([3, 4, 4, 6, 8, 8, 8, 8, 8, 8, 6, 5, 4, 2, 1], dtype=np.float64)
COSTS = {
    "tokens": "tokens",
    "flops": "flops",
    "seconds": TimeModel(0.05, 1e-5, 1e-9),
    "seconds_no_overhead": TimeModel(0.0, 1e-5, 3e-9),
}


def draw_step(rng: np.random.Generator) -> dict:
    """One random step: lengths, ranks, groups and options, with labels for the report."""
    n = int(rng.choice(SIZES, p=SIZE_WEIGHTS / SIZE_WEIGHTS.sum()))
    source = str(rng.choice([*DATASETS, "tiny", "wide", "equal"]))
    groups = None
    if source in DATASETS:
        dataset_groups = sb.datasets.groups(source)
        if dataset_groups is not None and rng.random() < 0.7:
            ids = np.unique(dataset_groups)
            picked = rng.choice(ids, min(ids.size, max(1, n // 8)), replace=False)
            mask = np.isin(dataset_groups, picked)
            lengths, groups = sb.datasets.load(source)[mask], dataset_groups[mask]
        else:
            lengths = rng.choice(sb.datasets.load(source), n)
    elif source == "tiny":
        lengths = rng.integers(0, 40, n)
    elif source == "wide":
        lengths = rng.integers(1, 32_000, n)
    else:
        lengths = np.full(n, int(rng.integers(1, 4000)))
    n = lengths.size
    if groups is None and rng.random() < 0.2:
        groups = rng.integers(0, max(1, n // int(rng.integers(1, 9))), n)
    options: dict = {"cost": COSTS[str(rng.choice(sorted(COSTS)))]}
    if rng.random() < 0.7:
        options["max_tokens"] = int(rng.choice([256, 1024, 4096, 8192, 16384, 32768]))
        # A cap below the longest sample is an error unless over-cap samples may stand alone.
        options["allow_oversize"] = bool(
            lengths.max(initial=0) > options["max_tokens"] or rng.random() < 0.3
        )
    if rng.random() < 0.3:
        options["objective"] = "lockstep"
    if rng.random() < 0.15:
        options["layout"] = "padded"
        options["microbatch_size"] = int(rng.integers(1, 9))
    if rng.random() < 0.1:
        options["num_microbatches"] = int(rng.integers(1, 5))
    elif rng.random() < 0.2:
        options["microbatch_multiple"] = int(rng.integers(2, 4))
    options["allow_empty"] = bool(rng.random() < (0.6 if groups is not None else 0.2))
    # Mostly at least one sample per rank (a few steps with fewer, for allow_empty).
    ranks = [d for d in (1, 2, 3, 4, 8, 16, 32, 64) if d <= max(1, n) or rng.random() < 0.05]
    dp = int(rng.choice(ranks))
    return {"lengths": lengths, "dp": dp, "groups": groups, "options": options, "source": source}


def _plan(step: dict, strategy: str) -> sb.StepPlan | None:
    every_rival = {"planning_budget": 2**62} if strategy == "balanced" else {}
    try:
        return sb.plan_step(
            step["lengths"],
            step["dp"],
            groups=step["groups"],
            strategy=strategy,
            **step["options"],
            **every_rival,
        )
    except ValueError:
        return None


def compare(step: dict) -> tuple[str, float, float, str]:
    """``("worse", ratio, seconds, family)`` when balanced loses (``family`` of the cheapest
    rival), else ``("ok", best baseline / balanced, seconds, "")`` or ``("infeasible", 1.0,
    seconds, "")`` when no strategy can plan the step; ``seconds`` is balanced's planning time
    (its portfolio of rivals included)."""
    started = time.perf_counter()
    balanced = _plan(step, "balanced")
    seconds = time.perf_counter() - started
    rivals = {}
    for name in strategy_names("baseline", "stack"):
        plan = _plan(step, name)
        if plan is not None and (plan.cap_enforced or plan.cap_violations() == 0):
            rivals[name] = plan
    if balanced is None:
        if rivals:
            return "worse", float("inf"), seconds, get_strategy(next(iter(rivals))).family
        return "infeasible", 1.0, seconds, ""
    balanced.validate()
    if not rivals:
        return "ok", float("nan"), seconds, ""
    name = min(rivals, key=lambda name: rivals[name].step_cost)
    best = rivals[name].step_cost
    if balanced.step_cost > best * (1 + 1e-9):
        return "worse", balanced.step_cost / best, seconds, get_strategy(name).family
    return "ok", best / balanced.step_cost if balanced.step_cost > 0 else 1.0, seconds, ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    outcomes: Counter[str] = Counter()
    by_kind: dict[str, Counter[str]] = {}
    gains: list[float] = []
    worst: dict[str, float] = {}  # family -> largest balanced / best ratio where balanced lost
    losses: Counter[str] = Counter()
    seconds_by_size: dict[str, list[float]] = {}
    started = time.perf_counter()
    for _ in range(args.inputs):
        step = draw_step(rng)
        outcome, ratio, seconds, family = compare(step)
        outcomes[outcome] += 1
        size = (
            "<= 64"
            if step["lengths"].size <= 64
            else ("65-1024" if step["lengths"].size <= 1024 else "> 1024")
        )
        seconds_by_size.setdefault(size, []).append(seconds)
        kinds = [
            f"n {'<=64' if step['lengths'].size <= 64 else '>64'}",
            "groups" if step["groups"] is not None else "no groups",
            "cap" if "max_tokens" in step["options"] else "no cap",
            step["options"].get("objective", "step"),
            step["options"].get("layout", "packed"),
        ]
        for kind in kinds:
            by_kind.setdefault(kind, Counter())[outcome] += 1
        if outcome == "ok" and np.isfinite(ratio):
            gains.append(ratio)
        if outcome == "worse":
            losses[family] += 1
            worst[family] = max(worst.get(family, 1.0), ratio)
    elapsed = time.perf_counter() - started
    rivals = ", ".join(strategy_names("baseline", "stack"))
    lines = [
        f"- Machine: {platform.processor() or platform.machine()}, Python "
        f"{platform.python_version()}, numpy {np.__version__}, seqbalance {sb.__version__}",
        f"- Command: `python benchmarks/trust.py --inputs {args.inputs} --seed {args.seed}`",
        f"- Date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC; {elapsed:.0f} s",
        f"- Baselines: {rivals}",
        "",
        "| inputs | no strategy can plan | compared | balanced worse | balanced at least as good |"
        " of which strictly better | mean / max gain over the best valid baseline |",
        "|---:|---:|---:|---:|---:|---:|---:|",
        f"| {args.inputs} | {outcomes['infeasible']} | {outcomes['ok'] + outcomes['worse']} |"
        f" {outcomes['worse']} | {outcomes['ok']} |"
        f" {sum(g > 1 + 1e-9 for g in gains)} |"
        f" {np.mean(gains) if gains else float('nan'):.4f}x / "
        f"{max(gains, default=float('nan')):.3f}x |",
        "",
        "| kind of input | inputs | balanced worse |",
        "|---|---:|---:|",
        *(
            f"| {kind} | {sum(counts.values())} | {counts['worse']} |"
            for kind, counts in sorted(by_kind.items())
        ),
        "",
        "| samples per step | inputs | balanced planning time, median / p99 / max (ms) |",
        "|---|---:|---:|",
        *(
            f"| {size} | {len(times)} | {1e3 * np.median(times):.1f} / "
            f"{1e3 * np.quantile(times, 0.99):.1f} / {1e3 * max(times):.1f} |"
            for size, times in sorted(seconds_by_size.items(), key=lambda kv: min(kv[1]))
        ),
    ]
    lines.append(
        f"\nWorse than a `baseline` strategy's plan: {losses['baseline']}; than a stack "
        f"scheduler's: {losses['stack']}"
        + (
            f", by at most {worst['stack'] - 1:.1e} (relative)"
            if losses["stack"] and np.isfinite(worst["stack"])
            else ""
        )
        + "."
    )
    print("\n".join(lines))


if __name__ == "__main__":
    main()

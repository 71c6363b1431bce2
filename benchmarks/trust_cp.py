"""Context-parallel ``balanced`` against every CP strategy on thousands of random steps: the count
of steps where it is worse, or refuses what a rival plans, must be 0.

Each input is a step drawn at random: 1 to 60 samples on 2 to 8 ranks, CP sizes up to 8, a
per-rank cap of 64 to 4096 tokens, lengths of one of several shapes (mixed short and long,
tiny, heavily sharded near the largest CP size's reach, all equal, a few samples only), with or
without groups, empty slots, an exact slot count or a minimum / multiple, and the head-tail or
contiguous scheme, costed by Qwen3-8B FLOPs or a seconds model with a per-slot overhead and
collective latency. ``static_cp`` and ``dynamic_cp_megatron`` plan the same step under the same
options; ``balanced`` loses when its predicted step time is above a rival's valid plan
(relative tolerance 1e-9), or when it refuses a step a rival plans. Every plan is validated and
checked against the options it was asked for: a plan with an empty slot where ``allow_empty``
was False, or whose ``allow_empty`` differs from the request, counts as a violation.

Run: ``python benchmarks/trust_cp.py [--inputs 20000] [--seed 0]``.
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
from seqbalance.cost.context_parallel import CommModel, ContextParallelTimeModel
from seqbalance.plan import ContextParallel, ContextParallelPlan, PlanOptions, strategy_names

SIZES = [(1, 2, 4, 8), (1, 2), (1, 2, 4), (2, 4), (1, 4), (1, 8), (1, 2, 4, 8)]
SHAPES = ("mixed", "tiny", "sharded", "uniform", "few")
RIVALS = tuple(name for name in strategy_names(context_parallel=True) if name != "balanced")
COSTS = {
    "flops": ContextParallelTimeModel.from_model("qwen3-8b"),
    "seconds": ContextParallelTimeModel(
        TimeModel(2e-3, 1e-6, 1e-9), CommModel(50e9, 2e-5), 2048, 32
    ),
    "tokens_like": ContextParallelTimeModel(TimeModel(0.0, 1.0, 0.0), CommModel(1.0, 0.0), 0, 1),
}


def draw_step(rng: np.random.Generator) -> dict:
    """One random step: lengths, ranks and options, with the shape label for the report."""
    n_ranks = int(rng.integers(2, 9))
    sizes = SIZES[int(rng.integers(len(SIZES)))]
    usable = [s for s in sizes if n_ranks % s == 0] or [1]
    if usable == [1] and 1 not in sizes:
        sizes = (1, *sizes)
    widest = max(s for s in sizes if n_ranks % s == 0)
    cap = int(rng.choice([64, 128, 256, 512, 1024, 2048, 4096]))
    shape = str(rng.choice(SHAPES))
    reach = widest * cap  # the longest sample any plan can hold
    n = int(rng.integers(1, 4)) if shape == "few" else int(rng.integers(1, 61))
    if shape == "mixed":
        long = rng.random(n) < 0.3
        lengths = np.where(long, rng.integers(cap, reach + 1, n), rng.integers(1, cap + 1, n))
    elif shape == "tiny":
        lengths = rng.integers(0, 9, n)
    elif shape == "sharded":
        lengths = rng.integers(max(1, reach // 2), reach + 1, n)
    elif shape == "uniform":
        lengths = np.full(n, int(rng.integers(1, reach + 1)))
    else:
        lengths = rng.integers(1, reach + 1, n)
    options: dict = {
        "cost": COSTS[str(rng.choice(sorted(COSTS)))],
        "allow_empty": bool(rng.random() < 0.4),
        "max_tokens": cap,  # the per-rank cap
    }
    cp: dict = {"sizes": sizes}
    if rng.random() < 0.2:
        cp["scheme"] = "contiguous"
    if rng.random() < 0.15:
        cp["static_size"] = int(rng.choice(sizes))
    groups = rng.integers(0, max(1, n // 3), n) if rng.random() < 0.15 else None
    draw = rng.random()
    if draw < 0.1:
        options["num_microbatches"] = int(rng.integers(1, 9))
    elif draw < 0.25:
        options["min_microbatches"] = int(rng.integers(1, 5))
        options["microbatch_multiple"] = int(rng.integers(1, 4))
    return {
        "lengths": lengths,
        "n_ranks": n_ranks,
        "context_parallel": ContextParallel(**cp),
        "options": options,
        "groups": groups,
        "shape": shape,
    }


def _plan(step: dict, strategy: str) -> ContextParallelPlan | None:
    try:
        options = PlanOptions(
            context_parallel=step["context_parallel"], strategy=strategy, **step["options"]
        )
        return sb.plan_step(step["lengths"], step["n_ranks"], options, groups=step["groups"])
    except ValueError:
        return None


def _violation(step: dict, plan: ContextParallelPlan) -> str | None:
    """What is wrong with a returned plan, or None: invalid, or not what was asked for."""
    try:
        plan.validate()
    except ValueError as error:
        return f"invalid: {error}"
    asked = step["options"]["allow_empty"]
    if plan.allow_empty != asked:
        return f"allow_empty {plan.allow_empty} where {asked} was asked"
    if not asked and plan.summary()["empty_microbatches"]:
        return "empty slot without allow_empty"
    wanted = step["options"].get("num_microbatches")
    if wanted is not None and plan.n_slots != wanted:
        return f"{plan.n_slots} slots where num_microbatches = {wanted}"
    return None


def compare(step: dict) -> tuple[str, float, float, list[str]]:
    """``(outcome, best rival / balanced, balanced's planning seconds, violations)``; outcome
    ``"slower"`` (than a valid rival plan), ``"refused"`` (what a rival planned), ``"ok"``,
    ``"alone"`` (only balanced plans the step) or ``"infeasible"`` (no strategy does)."""
    started = time.perf_counter()
    balanced = _plan(step, "balanced")
    seconds = time.perf_counter() - started
    violations = []
    rivals = {}
    for name in RIVALS:
        plan = _plan(step, name)
        if plan is not None:
            problem = _violation(step, plan)
            if problem is None:
                rivals[name] = plan
            else:
                violations.append(f"{name}: {problem}")
    if balanced is None:
        return ("refused" if rivals else "infeasible"), float("inf"), seconds, violations
    problem = _violation(step, balanced)
    if problem is not None:
        violations.append(f"balanced: {problem}")
    if not rivals:
        return "alone", float("nan"), seconds, violations
    best = min(plan.step_cost for plan in rivals.values())
    if balanced.step_cost > best * (1 + 1e-9):
        return "slower", balanced.step_cost / best, seconds, violations
    return "ok", best / balanced.step_cost if balanced.step_cost > 0 else 1.0, seconds, violations


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", type=int, default=20000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    outcomes: Counter[str] = Counter()
    by_shape: dict[str, Counter[str]] = {}
    gains: list[float] = []
    violations: list[str] = []
    seconds: list[float] = []
    started = time.perf_counter()
    for _ in range(args.inputs):
        step = draw_step(rng)
        outcome, ratio, planning, problems = compare(step)
        outcomes[outcome] += 1
        by_shape.setdefault(step["shape"], Counter())[outcome] += 1
        seconds.append(planning)
        violations += problems
        if outcome == "ok":
            gains.append(ratio)
    elapsed = time.perf_counter() - started
    compared = outcomes["ok"] + outcomes["slower"] + outcomes["refused"]
    lines = [
        f"- Machine: {platform.processor() or platform.machine()}, Python "
        f"{platform.python_version()}, numpy {np.__version__}, seqbalance {sb.__version__}",
        f"- Command: `python benchmarks/trust_cp.py --inputs {args.inputs} --seed {args.seed}`",
        f"- Date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC; {elapsed:.0f} s",
        f"- Rivals: {', '.join(RIVALS)}",
        "",
        "| inputs | no strategy can plan | only balanced plans | compared | balanced slower |"
        " balanced refuses | balanced at least as good | of which strictly better |"
        " mean / max gain over the best valid rival | plans breaking an invariant or option |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        f"| {args.inputs} | {outcomes['infeasible']} | {outcomes['alone']} | {compared} |"
        f" {outcomes['slower']} | {outcomes['refused']} | {outcomes['ok']} |"
        f" {sum(g > 1 + 1e-9 for g in gains)} |"
        f" {np.mean(gains) if gains else float('nan'):.4f}x / "
        f"{max(gains, default=float('nan')):.3f}x | {len(violations)} |",
        "",
        "| shape of the lengths | inputs | compared | balanced slower or refuses |",
        "|---|---:|---:|---:|",
        *(
            f"| {shape} | {sum(counts.values())} |"
            f" {counts['ok'] + counts['slower'] + counts['refused']} |"
            f" {counts['slower'] + counts['refused']} |"
            for shape, counts in sorted(by_shape.items())
        ),
        "",
        f"balanced planning time: median {1e3 * np.median(seconds):.1f} ms, p99 "
        f"{1e3 * np.quantile(seconds, 0.99):.1f} ms, max {1e3 * max(seconds):.1f} ms.",
    ]
    if violations:
        lines += ["", "Violations (first 10):", *(f"- {v}" for v in violations[:10])]
    print("\n".join(lines))


if __name__ == "__main__":
    main()

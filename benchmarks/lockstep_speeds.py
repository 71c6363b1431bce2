"""Planning time of ``balanced`` under ``objective="lockstep"`` with rank speeds (issue 27).

    python benchmarks/lockstep_speeds.py [--steps 5] [--out FILE]

Each case plans ``--steps`` steps of ShareGPT lengths (drawn with seed 0) on ``dp`` ranks, one
of them slow (speeds ``(1, ..., 1, slow)``), with ``objective="lockstep"``, ``allow_empty``,
``allow_oversize``, Qwen3-8B FLOPs and a token cap, and the same steps without speeds.
Reported: CPU time per step (median and max; the machine is shared, so the process's CPU time,
not the wall clock), the step cost over its lower bound, and the step cost over the best valid
plan of every rival (the baselines and the stacks' schedulers: at most 1 means ``balanced``
never lost). Prints a markdown section (and writes it to ``--out``).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from plan import add_row, machine, publish

import seqbalance as sb
from seqbalance.plan import strategy_names

CASES = [  # (samples, ranks, slow rank's speed, max_tokens)
    (120, 2, None, 2048),
    (120, 2, 0.67, 2048),
    (120, 2, 0.67, 512),
    (120, 2, 0.3, 512),
    (240, 2, 0.67, 2048),
    (240, 2, 0.2, 256),
    (600, 2, 0.2, 64),
    (600, 8, None, 2048),
    (600, 8, 0.5, 2048),
    (600, 8, 0.2, 512),
]
OPTIONS = {
    "cost": "flops",
    "model": "qwen3-8b",
    "objective": "lockstep",
    "allow_empty": True,
    "allow_oversize": True,
}


def _best_rival(lengths: np.ndarray, dp: int, options: dict) -> float:
    """The lowest step cost of a rival's valid plan (inf when none plans the step)."""
    best = np.inf
    for name in strategy_names("baseline", "stack"):
        try:
            plan = sb.plan_step(lengths, dp, strategy=name, **options)
        except ValueError:
            continue
        if plan.cap_enforced or plan.cap_violations() == 0:
            best = min(best, plan.step_cost)
    return best


def _case(n: int, dp: int, slow: float | None, cap: int, steps: int) -> tuple:
    rng = np.random.default_rng(0)
    sharegpt = sb.datasets.load("sharegpt")
    speeds = None if slow is None else (1.0,) * (dp - 1) + (slow,)
    options = {**OPTIONS, "max_tokens": cap, "rank_speeds": speeds}
    seconds, ratios, against = [], [], []
    for _ in range(steps):
        lengths = rng.choice(sharegpt, n)
        start = time.process_time()
        plan = sb.plan_step(lengths, dp, **options)
        seconds.append(time.process_time() - start)
        plan.validate()
        ratios.append(plan.step_cost / plan.lower_bound)
        against.append(plan.step_cost / _best_rival(lengths, dp, options))
    ms = 1e3 * np.array(seconds)
    return (
        n,
        dp,
        "equal" if slow is None else f"1 at {slow}",
        cap,
        f"{np.median(ms):.0f}",
        f"{ms.max():.0f}",
        f"{max(ratios):.3f}",
        f"{max(against):.4f}",
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5, help="steps per case")
    parser.add_argument("--out", help="also write the markdown section to this file")
    args = parser.parse_args(argv)
    sb.plan_step(np.arange(1, 9), 2, **OPTIONS)  # warm-up: imports, model presets
    lines = [
        "## Lockstep planning with rank speeds (`benchmarks/lockstep_speeds.py`)",
        "",
        f"Machine: {machine()}. CPU time of `plan_step` per step, {args.steps} steps per case.",
        "",
        "| samples | ranks | speeds | max_tokens | median ms | max ms | worst vs bound | "
        "worst vs best rival |",
        "|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    for case in CASES:
        row = _case(*case, args.steps)
        add_row(lines, row)
    publish(lines, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Ranks of different speeds: what planning for them saves, and how close ``partition`` gets.

1. Simulator (``seqbalance.sim.simulate`` with ``rank_speeds``, as ``seqbalance simulate
   --rank-speeds``): dp 8 (global batch 512) and dp 64 (global batch 4096), one and two ranks at
   0.67 speed, both objectives, Qwen3-8B FLOPs in seconds. ``balanced`` planned for the speeds
   against ``balanced`` planned for equal ranks, both judged at the true speeds (the gain), and
   ``balanced``'s step time over its lower bound.
2. ``sb.partition(weights, k, speeds=...)`` on every bundled length set
   (``sb.datasets.names()``): weights ``L**2 + 24576*L``, n = 512 and 4096 lengths drawn with
   seed 0 (with replacement where the set is smaller), k = 8 and 64, one and two parts at 0.67
   (and one at 0.01, a 100x slowdown). Ratio = max(load / speed) / lower bound; target <= 1.01.

Run: ``python benchmarks/rank_speeds.py [--steps 10] [--markdown]``.
"""

from __future__ import annotations

import argparse
import platform
import time
from datetime import datetime, timezone

import numpy as np

import seqbalance as sb
from seqbalance.sim import simulate

SLOW = 0.67
TARGET_RATIO = 1.01


def speeds(k: int, slow: int, value: float = SLOW) -> tuple[float, ...]:
    return (1.0,) * (k - slow) + (value,) * slow


def simulator_rows(steps: int) -> list[tuple]:
    rows = []
    for dataset in ("sharegpt", "qwen25math"):
        lengths = sb.datasets.load(dataset)
        for dp, batch in ((8, 512), (64, 4096)):
            for slow in (1, 2):
                for objective in ("step", "lockstep"):
                    start = time.perf_counter()
                    result = simulate(
                        lengths,
                        dp_size=dp,
                        global_batch_size=min(batch, lengths.size),
                        steps=steps,
                        strategies=("balanced",),
                        objective=objective,
                        allow_oversize=True,
                        rank_speeds=speeds(dp, slow),
                    )
                    seconds = time.perf_counter() - start
                    aware = result.strategies["balanced"]
                    equal = float(result.equal_speed_seconds.mean())
                    # Equal shares wait for the slow rank (total / dp / SLOW); shares in
                    # proportion to speed take total / sum(speeds).
                    ideal = 1 - dp * SLOW / (dp - slow * (1 - SLOW))
                    rows.append(
                        (
                            dataset,
                            dp,
                            slow,
                            objective,
                            f"{equal:.3f}",
                            f"{aware.mean_step_seconds:.3f}",
                            f"{100 * result.speed_aware_gain:.1f}%",
                            f"{100 * ideal:.1f}%",
                            f"{aware.ratio:.4f}",
                            f"{aware.planning_ms_mean:.0f}",
                            f"{seconds:.0f}",
                        )
                    )
                    print(*rows[-1], sep=" | ", flush=True)
    return rows


def partition_rows() -> tuple[list[tuple], float]:
    rows, worst = [], 0.0
    rng = np.random.default_rng(0)
    for dataset in sb.datasets.names():
        pool = sb.datasets.load(dataset)
        for n in (512, 4096):
            lengths = rng.choice(pool, n, replace=pool.size < n).astype(np.float64)
            weights = lengths**2 + 24576 * lengths
            for k in (8, 64):
                for slow, value in ((1, SLOW), (2, SLOW), (1, 0.01)):
                    s = speeds(k, slow, value)
                    start = time.perf_counter()
                    result = sb.partition(weights, k, speeds=s)
                    ms = 1e3 * (time.perf_counter() - start)
                    worst = max(worst, result.ratio)
                    plain = sb.partition(weights, k)
                    judged = float((plain.loads / np.array(s)).max())
                    rows.append(
                        (
                            dataset,
                            n,
                            k,
                            f"{slow} x {value:g}",
                            f"{result.ratio:.5f}",
                            f"{100 * (1 - result.times.max() / judged):.1f}%",
                            result.method,
                            f"{ms:.1f}",
                        )
                    )
    return rows, worst


def table(columns: tuple[str, ...], rows: list[tuple]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10, help="simulated steps per case")
    parser.add_argument("--markdown", action="store_true", help="print markdown tables")
    args = parser.parse_args()
    print(
        f"- Machine: {platform.processor() or platform.machine()}, Python "
        f"{platform.python_version()}, numpy {np.__version__}, seqbalance {sb.__version__}"
    )
    print(f"- Date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC")
    print(f"- Command: `python benchmarks/rank_speeds.py --steps {args.steps}`\n")
    sim = simulator_rows(args.steps)
    part, worst = partition_rows()
    print()
    print(
        table(
            (
                "lengths",
                "dp",
                "slow ranks",
                "objective",
                "equal-speed plan (s)",
                "speed-aware plan (s)",
                "gain",
                "ideal gain",
                "vs lower bound",
                "plan ms",
                "case s",
            ),
            sim,
        )
    )
    print()
    print(
        table(
            (
                "lengths",
                "n",
                "k",
                "slow parts",
                "ratio",
                "gain vs equal-speed parts",
                "method",
                "ms",
            ),
            part,
        )
    )
    verdict = "pass" if worst <= TARGET_RATIO else "miss"
    print(f"\nWorst partition ratio: {worst:.5f} (target <= {TARGET_RATIO}): {verdict}")


if __name__ == "__main__":
    main()

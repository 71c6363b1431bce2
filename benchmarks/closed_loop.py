"""The closed loop on simulated time: how fast adaptive planning follows a rank's speed.

    python benchmarks/closed_loop.py [--seeds 3]

Each step samples ``BATCH`` ShareGPT lengths (divided by 2 and cut to the 4096-token cap, as
``seqbalance bench`` does for its toy model) and plans them three ways: ``balanced`` (equal
speeds, the time model known), ``balanced_adaptive`` (``AdaptivePlanner`` starting from the
Qwen3-8B FLOPs prior, learning from the simulated measurements) and ``balanced_oracle``
(``balanced`` given the true speeds). A micro-batch's "measured" time is the true model
``TRUE`` divided by its rank's speed, times log-normal noise (``NOISE``, per micro-batch); a
step's time is its slowest rank's (the DDP objective). Two scenarios: rank 1 at speed 1/1.5 for
the whole run (40 steps), and rank 1 slowed to 1/1.5 at step 20 and back at step 40 (60 steps).

Reported, per dp size and scenario (means over ``--seeds``): mean step time of each strategy
relative to ``balanced`` and to the oracle, and after each speed change the first step from
which ``balanced_adaptive`` stays within 5% of the oracle (the noise-free step times, so the
figure measures planning, not noise).

``--background-load``: the machine is shared, as under ``seqbalance bench --noise 0.5`` with
other processes running: each micro-batch takes ``1 + Exp(0.5)`` times its time, and each
rank's whole step 1, 1, 1.5, 2 or 3 times (drawn per step and rank: other processes taking
turns on its core). Step times then count the load (not the per-micro-batch draws); the
steps and the load are drawn apart from the loop's plans (every version of the loop sees the
same). The table adds the median error of rank 1's planned speed (``|log(planned / true)|`` over the
steps from the 10th).

Prints a markdown section for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import warnings

import numpy as np

from seqbalance.cost import TimeModel
from seqbalance.datasets import load
from seqbalance.plan import PlanOptions, plan_step
from seqbalance.runtime import AdaptivePlanner

TRUE = TimeModel(0.004, 2.5e-5, 2.0e-9)
"""About the toy model on one core: 4 ms per micro-batch, 25 µs per token, 2 ns per token²."""
CAP, BATCH, NOISE = 4096, 32, 0.05
OPTIONS = PlanOptions(cost="flops", model="qwen3-8b", max_tokens=CAP)


def _speeds(scenario: str, dp: int, step: int) -> np.ndarray:
    speeds = np.ones(dp)
    if scenario == "whole run" or 20 <= step < 40:
        speeds[1] = 1 / 1.5
    return speeds


def _times(
    plan, speeds: np.ndarray, rng: np.random.Generator | None, loaded: bool = False
) -> list[list[float]]:
    out = []
    for rank, microbatches in enumerate(plan.ranks):
        seconds = [TRUE.microbatch_seconds(plan.lengths[mb]) / speeds[rank] for mb in microbatches]
        if rng is not None and loaded:
            seconds = [s * (1.0 + float(rng.exponential(0.5))) for s in seconds]
        elif rng is not None:
            seconds = [s * float(rng.lognormal(0.0, NOISE)) for s in seconds]
        out.append(seconds)
    return out


def _step(plan, speeds: np.ndarray) -> float:
    return max(sum(rank) for rank in _times(plan, speeds, None))


def run(dp: int, scenario: str, seed: int, loaded: bool = False) -> dict[str, object]:
    steps = 40 if scenario == "whole run" else 60
    lengths = np.minimum(-(-load("sharegpt") // 2), CAP)
    rng = np.random.default_rng(seed)
    planner = AdaptivePlanner(dp, OPTIONS)
    known = OPTIONS.replace(cost=TRUE, model=None)
    times: dict[str, list[float]] = {"balanced": [], "balanced_adaptive": [], "balanced_oracle": []}
    errors = []
    # Under load, the load and the micro-batches' draws come from their own generator, so
    # every version of the loop sees the same steps and the same load.
    loads = np.random.default_rng((seed, 1))
    draws = np.random.default_rng((seed, 2)) if loaded else rng
    for step in range(steps):
        batch = rng.choice(lengths, size=BATCH * dp // 2, replace=False)
        true = _speeds(scenario, dp, step)
        # Background load: the rank's time this step (a slower rank, for this step only).
        speeds = true / loads.choice([1.0, 1.0, 1.5, 2.0, 3.0], size=dp) if loaded else true
        oracle = known.replace(rank_speeds=None if np.all(true == 1) else tuple(true))
        adaptive = planner.plan(batch)
        errors.append(abs(np.log(planner.online.speeds[1] / true[1])))
        times["balanced"].append(_step(plan_step(batch, dp, known), speeds))
        times["balanced_oracle"].append(_step(plan_step(batch, dp, oracle), speeds))
        times["balanced_adaptive"].append(_step(adaptive, speeds))
        planner.observe(adaptive, _times(adaptive, speeds, draws, loaded))
    ratio = np.array(times["balanced_adaptive"]) / np.array(times["balanced_oracle"])
    changes = [0] if scenario == "whole run" else [20, 40]
    caught_up = []
    for change in changes:
        end = changes[changes.index(change) + 1] if change != changes[-1] else steps
        late = np.nonzero(ratio[change:end] > 1.05)[0]
        caught_up.append(0 if late.size == 0 else int(late[-1]) + 1)
    return {
        "mean": {name: float(np.mean(values)) for name, values in times.items()},
        "caught_up": caught_up,
        "speed_errors": errors[10:],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--background-load", action="store_true")
    args = parser.parse_args()
    warnings.simplefilter("ignore", RuntimeWarning)
    noise = (
        "1 + Exp(0.5) per micro-batch, background load 1/1/1.5/2/3x per step and rank"
        if args.background_load
        else f"noise {100 * NOISE:.0f}% per micro-batch"
    )
    print(
        f"### Closed loop on simulated time (rank 1 at 1/1.5 speed; {noise}; {args.seeds} seeds)\n"
    )
    print(
        "| dp | scenario | adaptive / balanced | adaptive / oracle | oracle / balanced "
        "| steps to within 5% of the oracle after each change (worst seed) "
        "| median error of rank 1's planned speed from step 10 |"
    )
    print("|---:|:---|---:|---:|---:|:---|---:|")
    for dp in (2, 8):
        for scenario in ("whole run", "slow at 20, recovers at 40"):
            results = [run(dp, scenario, seed, args.background_load) for seed in range(args.seeds)]

            def mean(name: str, results=results) -> float:
                return float(np.mean([r["mean"][name] for r in results]))

            worst = np.max([r["caught_up"] for r in results], axis=0).tolist()
            print(
                f"| {dp} | {scenario} | "
                f"{mean('balanced_adaptive') / mean('balanced'):.3f} | "
                f"{mean('balanced_adaptive') / mean('balanced_oracle'):.3f} | "
                f"{mean('balanced_oracle') / mean('balanced'):.3f} | {worst} | "
                f"{np.median([r['speed_errors'] for r in results]):.3f} |"
            )


if __name__ == "__main__":
    main()

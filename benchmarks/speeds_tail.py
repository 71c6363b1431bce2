"""The slowest planning with rank speeds an adversarial pass found (issue 27, adv8c M3): CPU time
of ``plan_step`` with and without ``rank_speeds`` on the same requests.

    python benchmarks/speeds_tail.py [--repeat 3] [--out FILE]

The requests are adv8c's random requests of these seeds, drawn again as its probe drew them
(``_request``): 5061 (3,000 lognormal samples in groups, 2 ranks at speeds (1, 0.01), packed,
``step``, FLOPs, cap 16384, at least 6 micro-batches), 5172 (3,000 samples in groups, 8 ranks
one at 0.01, ``allow_empty``), 1137 (1,500 samples, 16 ranks three at 0.01, ``allow_empty``, at
least 8 micro-batches) and 5055 (3,000 samples in groups, 4 ranks at 0.44 / 1 / 0.08 / 0.86,
``lockstep``). Reported: the least CPU time (``time.process_time``) of ``--repeat`` runs with
and without speeds, their ratio, and the plan's digest (to compare heads).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from plan import add_row, machine, publish

import seqbalance as sb

SEEDS = {5061: "wide", 5172: "wide", 1137: "narrow", 5055: "wide"}
"""Each seed with the request mix of adv8c's probe that drew it (``_request``)."""


def _request(seed: int, mix: str) -> tuple[np.ndarray, int, dict, np.ndarray | None]:
    """adv8c's random request of ``seed``: lengths, ranks, options (speeds included), groups."""
    rng = np.random.default_rng(seed)
    dp = int(rng.choice([1, 2, 3, 4, 8, 16]))
    sizes = [1, 5, 30, 120, 500, 1500, 3000]
    weights = {"wide": [0, 0, 0.05, 0.15, 0.2, 0.3, 0.3]}
    n = int(rng.choice(sizes, p=weights.get(mix, [0.05, 0.1, 0.2, 0.25, 0.2, 0.12, 0.08])))
    shape = rng.integers(3)
    if shape == 0:
        lengths = rng.integers(1, 4096, n)
    elif shape == 1:
        lengths = np.minimum(rng.lognormal(6, 1.2, n).astype(int) + 1, 8192)
    else:
        lengths = rng.choice([16, 2048, 8000], n)
    objectives = [0.3, 0.7] if mix == "wide" else None  # None draws otherwise than [.5, .5]
    objective = str(rng.choice(["step", "lockstep"], p=objectives))
    layout = str(rng.choice(["packed", "padded"]))
    options: dict = {"objective": objective, "layout": layout}
    options["allow_empty"] = bool(rng.integers(2))
    cap = int(rng.choice([8192, 16384, 65536]))
    if layout == "padded":
        options["microbatch_size"] = int(rng.choice([1, 2, 4, 8]))
        if rng.integers(2):
            options["max_tokens"] = cap
    else:
        options["max_tokens"] = cap
    count = rng.integers(3)
    if count == 1:
        options["num_microbatches"] = int(rng.integers(1, 9))
    elif count == 2:
        options["min_microbatches"] = int(rng.integers(1, 9))
    options["cost"] = str(rng.choice(["tokens", "flops"]))
    groups = rng.integers(0, max(1, n // 4), n) if rng.integers(4) == 0 else None
    kind = rng.integers(4)
    if kind == 0:
        speeds = rng.uniform(0.001, 1, dp)
    elif kind == 1:
        speeds = np.where(rng.random(dp) < 0.3, rng.choice([0.001, 0.01, 0.1]), 1.0)
    elif kind == 2:
        speeds = np.round(rng.uniform(0.5, 1, dp), 2)
    else:
        speeds = np.ones(dp)
        speeds[rng.integers(dp)] = float(rng.choice([0.01, 0.3, 0.67]))
    options["rank_speeds"] = tuple(float(s) for s in speeds / speeds.max())
    return lengths, dp, options, groups


def _least(lengths: np.ndarray, dp: int, options: dict, groups, repeat: int) -> tuple:
    """(least CPU seconds of ``repeat`` plans, the plan's digest)."""
    best = np.inf
    for _ in range(repeat):
        start = time.process_time()
        plan = sb.plan_step(lengths, dp, groups=groups, **options)
        best = min(best, time.process_time() - start)
    return best, plan.fingerprint()[:12]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="plans per request and side")
    parser.add_argument("--out", help="also write the markdown section to this file")
    args = parser.parse_args(argv)
    sb.plan_step(np.arange(1, 9), 2, cost="flops")  # warm-up: imports, model presets
    lines = [
        "## Planning with rank speeds: adv8c's slowest requests (`benchmarks/speeds_tail.py`)",
        "",
        f"Machine: {machine()}. Least CPU time of {args.repeat} plans.",
        "",
        "| seed | samples | ranks | objective | no speeds ms | speeds ms | ratio | digest |",
        "|---:|---:|---:|---|---:|---:|---:|---|",
    ]
    for seed, mix in SEEDS.items():
        lengths, dp, options, groups = _request(seed, mix)
        plain, _ = _least(lengths, dp, {**options, "rank_speeds": None}, groups, args.repeat)
        timed, digest = _least(lengths, dp, options, groups, args.repeat)
        row = (seed, lengths.size, dp, options["objective"])
        row += (f"{1e3 * plain:.1f}", f"{1e3 * timed:.1f}", f"{timed / plain:.1f}x", digest)
        add_row(lines, row)
    publish(lines, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""``balanced`` against every peer scheduler a user could pick instead, and on padded steps
against its own lower bound.

    python benchmarks/peers.py [--steps 10] [--out FILE] [--bound-effort 50000] [--padded-only]

Part 1 (README's table): on every bundled length set, ``--steps`` global batches of 256 samples
(lengths capped at 16k, as trainers truncate) on 8 ranks, Qwen3-8B training FLOPs, each peer in
the configuration it runs in (packed with the 16k cap for verl, slime, Megatron's DP-balanced
packer; padded micro-batches of 4 for TorchSpec and the Hugging Face samplers; Hugging Face
``batch_rebalance`` with its variable groups: ``microbatch_size`` = the step, 4 gradient
accumulation steps), and ``balanced`` with the same request at the default planning budget.
Cell: the peer's total predicted step cost over ``balanced``'s (> 1: ``balanced`` is faster) and
the steps where ``balanced`` is worse, by how much at most (only a dear rival the planning
budget skips on a short step can be cheaper, by at most 0.1%: docs/design.md, invariant 8).

Part 2 (issue 25's acceptance): steps ``balanced`` has never seen (generated heavy-tailed,
dominant-sample and uniform lengths, 128 samples on 8 ranks, 4 micro-batches per rank) in
``batch_rebalance``'s configuration with its own cost (``L + 0.001 L^2`` per padded sample),
both objectives: the steps where ``balanced`` is worse than ``hf_batch_rebalance``.

Part 3: padded steps of the bundled sets, ``balanced`` / the lower bound of plans with its
micro-batch count (``summary()["count_ratio"]``, target <= 1.02): micro-batches of 8 samples
(Qwen3-8B FLOPs), and ``batch_rebalance``'s configuration with its cost; both objectives. The
``lockstep`` bound is searched over the positions' levels with ``--bound-effort`` level
vectors (``PlanOptions.bound_effort``, about 5 s a step at the default; 0: none).
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np
from plan import machine, publish

import seqbalance as sb

DATASETS = sb.datasets.names()
N, DP, CAP, GA = 256, 8, 16384, 4
PACKED = {"cost": "flops", "model": "qwen3-8b", "max_tokens": CAP, "allow_oversize": True}
PADDED = {"cost": "flops", "model": "qwen3-8b", "layout": "padded", "microbatch_size": 4}
PEERS: dict[str, tuple[str, dict[str, Any]]] = {
    "verl": ("packed, 16k cap", {**PACKED, "objective": "step"}),
    "slime": ("packed, 16k cap", {**PACKED, "objective": "step"}),
    "slime_flops": ("packed, 16k cap, lockstep", {**PACKED, "objective": "lockstep"}),
    "megatron_dp_balanced": ("packed, 16k cap", {**PACKED, "objective": "step"}),
    "torchspec": ("padded, 4 per micro-batch", {**PADDED, "objective": "step"}),
    "hf_default": ("padded, 4 per micro-batch", {**PADDED, "objective": "step"}),
    "hf_length_grouped": ("padded, 4 per micro-batch", {**PADDED, "objective": "step"}),
    "hf_batch_rebalance": (
        "padded, GA 4, step",
        {**PADDED, "microbatch_size": N, "num_microbatches": GA, "objective": "step"},
    ),
    "hf_batch_rebalance ": (
        "padded, GA 4, lockstep",
        {**PADDED, "microbatch_size": N, "num_microbatches": GA, "objective": "lockstep"},
    ),
}


def hf_cost(lengths: Any) -> np.ndarray:
    """``batch_rebalance``'s own cost of a padded sample: ``L + 0.001 L^2``."""
    lengths = np.asarray(lengths, dtype=np.float64)
    return lengths + 0.001 * lengths * lengths


def steps(dataset: str, count: int, size: int, seed: int = 0) -> list[np.ndarray]:
    pool = sb.datasets.load(dataset)
    rng = np.random.default_rng(seed)
    return [np.minimum(rng.choice(pool, size), CAP) for _ in range(count)]


def versus(lengths: np.ndarray, peer: str, options: dict[str, Any]) -> tuple[float, float] | None:
    """(balanced, peer) step costs on one step; None when the peer cannot plan it."""
    try:
        theirs = sb.plan_step(lengths, DP, strategy=peer.strip(), **options)
    except ValueError:
        return None
    if not theirs.cap_enforced and theirs.cap_violations():
        return None
    return sb.plan_step(lengths, DP, **options).step_cost, theirs.step_cost


def peer_table(count: int) -> list[str]:
    lines = [
        "| peer (configuration) | " + " | ".join(DATASETS) + " |",
        "|---|" + "---:|" * len(DATASETS),
    ]
    for peer, (where, options) in PEERS.items():
        cells = []
        for dataset in DATASETS:
            pairs = [r for x in steps(dataset, count, N) if (r := versus(x, peer, options))]
            if not pairs:
                cells.append("-")
                continue
            ours, theirs = (float(sum(v)) for v in zip(*pairs, strict=True))
            worse = sum(b > t * (1 + 1e-9) for b, t in pairs)
            most = max(b / t - 1 for b, t in pairs)
            note = f" ({worse} worse, by <= {100 * most:.3f}%)" if worse else ""
            cells.append(f"{theirs / ours:.3f}{note}")
        lines.append(f"| `{peer.strip()}` ({where}) | " + " | ".join(cells) + " |")
    return lines


def unseen(kind: str, rng: np.random.Generator, n: int) -> np.ndarray:
    if kind == "heavy-tailed":
        return np.minimum(rng.pareto(1.1, n) * 300 + 1, 32768).astype(np.int64)
    if kind == "dominant":
        lengths = rng.integers(50, 1500, n)
        lengths[rng.integers(0, n)] = rng.integers(8000, 32768)
        return lengths
    return rng.integers(1, 4096, n)


def unseen_table(count: int) -> list[str]:
    lines = [
        "| length set | objective | steps | balanced worse | hf / balanced |",
        "|---|---|---:|---:|---:|",
    ]
    rng = np.random.default_rng(25)
    for kind in ("heavy-tailed", "dominant", "uniform"):
        for objective in ("step", "lockstep"):
            options = {
                "cost": hf_cost,
                "layout": "padded",
                "microbatch_size": 128,
                "num_microbatches": GA,
                "objective": objective,
            }
            pairs = [
                versus(unseen(kind, rng, 128), "hf_batch_rebalance", options) for _ in range(count)
            ]
            pairs = [p for p in pairs if p]
            ours, theirs = (float(sum(v)) for v in zip(*pairs, strict=True))
            worse = sum(b > t * (1 + 1e-9) for b, t in pairs)
            lines.append(f"| {kind} | {objective} | {len(pairs)} | {worse} | {theirs / ours:.3f} |")
    return lines


def padded_table(count: int, effort: int) -> list[str]:
    configs = {
        "8 per micro-batch, FLOPs": {**PADDED, "microbatch_size": 8},
        "batch_rebalance's (GA 4, its cost)": {
            "cost": hf_cost,
            "layout": "padded",
            "microbatch_size": N,
            "num_microbatches": GA,
        },
    }
    lines = [
        "| length set | configuration | objective | mean | worst |",
        "|---|---|---|---:|---:|",
    ]
    for dataset in DATASETS:
        for label, options in configs.items():
            for objective in ("step", "lockstep"):
                ratios = [
                    sb.plan_step(
                        x, DP, objective=objective, bound_effort=effort, **options
                    ).summary()["count_ratio"]
                    for x in steps(dataset, count, N, seed=1)
                ]
                lines.append(
                    f"| {dataset} | {label} | {objective} | {np.mean(ratios):.4f} | "
                    f"{max(ratios):.4f} |"
                )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10, help="steps per length set and peer")
    parser.add_argument("--out", help="also write the markdown section to this file")
    parser.add_argument(
        "--bound-effort",
        type=int,
        default=50_000,
        help="level vectors the padded lockstep bound may check (PlanOptions.bound_effort)",
    )
    parser.add_argument("--padded-only", action="store_true", help="part 3 alone")
    args = parser.parse_args(argv)
    padded = [
        "Padded steps: `balanced` / the lower bound of plans with its micro-batch count "
        f"(`lockstep`: searched over level vectors, `bound_effort={args.bound_effort}`):",
        "",
        *padded_table(args.steps, args.bound_effort),
        "",
    ]
    if args.padded_only:
        publish([f"Machine: {machine()}.", "", *padded], args.out)
        return 0
    lines = [
        f"## Peers' schedulers (`benchmarks/peers.py --steps {args.steps}`)",
        "",
        f"Machine: {machine()}. {N} samples per step on {DP} ranks, Qwen3-8B FLOPs, lengths "
        f"capped at {CAP}; `balanced` at the default planning budget.",
        "",
        "Peer's predicted step cost / `balanced`'s (total over the steps):",
        "",
        *peer_table(args.steps),
        "",
        "Unseen steps, `hf_batch_rebalance`'s configuration and cost (128 samples, 8 ranks, GA 4):",
        "",
        *unseen_table(5 * args.steps),
        "",
        *padded,
    ]
    publish(lines, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

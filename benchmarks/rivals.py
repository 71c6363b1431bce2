"""``balanced`` against every registered strategy on random requests drawn from length sets it
was not developed on, and the slime drop-in against slime's own source (issue 25's acceptance).

    python benchmarks/rivals.py [--requests 3000] [--seed 2511] [--slime-source DIR] [--out FILE]

Part 1: ``--requests`` random requests (1-320 samples on 1-16 ranks; lognormal and Pareto
lengths with parameters no test uses, uniform lengths, one dominant sample, the bundled sets
drawn with a new seed; costs in tokens, Qwen3-8B FLOPs, seconds and Hugging Face
``batch_rebalance``'s ``L + 0.001 L^2``; packed, padded micro-batches of 1-8 and
``batch_rebalance``'s configuration; ``step`` and ``lockstep``; with and without a token cap),
``balanced`` at the default planning budget against every other registered strategy whose plan
is valid. A loss to a rival the budget did not admit, by at most the documented gap
(``plan._budget.budget_gap``, docs/design.md invariant 8), is counted apart from real losses.
Also: ``balanced`` / its padded lower bound (``summary()["count_ratio"]``) on the padded ones.

Part 2 (``--slime-source``: a checkout of THUDM/slime, e.g. from ``git -C MIRROR worktree
add``): random steps for slime's ``build_dp_schedule`` (both paths, ``--balance-data`` and
``--balance-by-flops`` on and off, virtual pipeline groups, sample counts mostly not multiples
of dp x micro_batch_size), our drop-in against every schedule slime's own code makes of the same
step with balancing on or off (valid under the cap), priced with slime's FLOPs as the drop-in
prices them (``lockstep`` with ``--balance-by-flops``, else ``step``).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections import Counter
from types import SimpleNamespace
from typing import Any

import numpy as np
from plan import machine, publish

import seqbalance as sb
from seqbalance.cost import TimeModel
from seqbalance.cost.resolve import evaluate_costs
from seqbalance.plan import PlanOptions, objective_value, strategy_names
from seqbalance.plan._budget import admitted, budget_gap
from seqbalance.plan._problem import Problem
from seqbalance.plan.registry import get_strategy

RIVALS = tuple(name for name in strategy_names() if name != "balanced")
TOLERANCE = 1e-9


def hf_cost(lengths: Any) -> np.ndarray:
    """``batch_rebalance``'s own cost of a padded sample: ``L + 0.001 L^2``."""
    lengths = np.asarray(lengths, dtype=np.float64)
    return lengths + 0.001 * lengths * lengths


COSTS: dict[str, Any] = {
    "tokens": "tokens",
    "flops": "flops",
    "seconds": TimeModel(0.02, 3e-6, 4e-10),
    "hf": hf_cost,
}
KINDS = ("lognormal", "pareto", "uniform", "dominant", "bundled")


def lengths_of(kind: str, rng: np.random.Generator, n: int) -> np.ndarray:
    if kind == "lognormal":  # parameters no test or benchmark uses
        mu, sigma = rng.uniform(4.0, 8.0), rng.uniform(0.3, 1.8)
        return np.clip(rng.lognormal(mu, sigma, n), 1, 65536).astype(np.int64)
    if kind == "pareto":
        alpha, scale = rng.uniform(0.7, 2.5), rng.uniform(20, 800)
        return np.clip(rng.pareto(alpha, n) * scale + 1, 1, 65536).astype(np.int64)
    if kind == "uniform":
        low = int(rng.integers(1, 2000))
        return rng.integers(low, low + int(rng.integers(1, 8000)), n)
    if kind == "dominant":
        lengths = rng.integers(10, int(rng.integers(100, 3000)), n)
        lengths[rng.integers(0, n)] = rng.integers(4000, 60000)
        return lengths
    pool = sb.datasets.load(str(rng.choice(sb.datasets.names())))
    return rng.permutation(pool)[:n] if n <= pool.size else rng.choice(pool, n)


def request(rng: np.random.Generator) -> dict[str, Any]:
    n = int(rng.choice([rng.integers(1, 33), rng.integers(1, 129), rng.integers(100, 321)]))
    kind = str(rng.choice(KINDS))
    options: dict[str, Any] = {
        "lengths": lengths_of(kind, rng, n),
        "dp": int(rng.integers(1, 17)),
        "cost": COSTS[str(rng.choice(sorted(COSTS)))],
        "objective": str(rng.choice(["step", "lockstep"])),
        "allow_empty": bool(rng.integers(0, 2)),
    }
    layout = str(rng.choice(["packed", "padded", "peer"]))
    if layout == "padded":
        options.update(layout="padded", microbatch_size=int(rng.integers(1, 9)))
    elif layout == "peer":  # batch_rebalance: free sizes, GA micro-batches per rank
        options.update(layout="padded", microbatch_size=n, num_microbatches=int(rng.integers(1, 5)))
    if rng.integers(0, 2):
        options.update(max_tokens=int(rng.choice([4096, 16384, 65536])), allow_oversize=True)
    return {"kind": kind, "shape": layout, **options}


def _plan(req: dict[str, Any], strategy: str) -> sb.StepPlan | None:
    options = {k: v for k, v in req.items() if k not in ("kind", "shape", "lengths", "dp")}
    try:
        plan = sb.plan_step(req["lengths"], req["dp"], strategy=strategy, **options)
    except ValueError:
        return None
    return plan if plan.cap_enforced or plan.cap_violations() == 0 else None


def _problem(req: dict[str, Any]) -> Problem:
    keys = ("kind", "shape", "lengths", "dp")
    options = PlanOptions(**{k: v for k, v in req.items() if k not in keys})
    costs, overhead = evaluate_costs(options.cost_model, req["lengths"], None)
    return Problem(
        lengths=np.asarray(req["lengths"]),
        sample_costs=costs,
        overhead=overhead,
        dp=req["dp"],
        groups=None,
        options=options,
    )


def compare(req: dict[str, Any]) -> tuple[list[tuple[str, float, bool]], float | None, int]:
    """Losses of ``balanced`` on one request ((rival, relative loss, excused by the budget)),
    its padded count ratio, and how many rivals planned."""
    ours = _plan(req, "balanced")
    rivals = {name: p for name in RIVALS if (p := _plan(req, name)) is not None}
    if ours is None:
        return [(name, float("inf"), False) for name in rivals], None, len(rivals)
    losses = []
    for name, theirs in rivals.items():
        if ours.step_cost > theirs.step_cost * (1 + TOLERANCE):
            problem = _problem(req)
            skipped = name not in admitted(problem, [get_strategy(n) for n in RIVALS])
            loss = ours.step_cost / theirs.step_cost - 1
            losses.append((name, loss, skipped and loss <= budget_gap(problem)))
    ratio = ours.summary().get("count_ratio") if req["shape"] != "packed" else None
    return losses, ratio, len(rivals)


def rival_section(count: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    pairs, ratios = 0, {(s, o): [] for s in ("padded", "peer") for o in ("step", "lockstep")}
    real, excused = [], []
    for _ in range(count):
        req = request(rng)
        losses, ratio, planned = compare(req)
        pairs += planned
        if ratio is not None:
            ratios[req["shape"], req["objective"]].append(ratio)
        for name, loss, ok in losses:
            (excused if ok else real).append((name, loss, req))
    lines = [
        f"{count} requests (seed {seed}), {pairs} (request, rival) pairs with a valid rival plan: "
        f"`balanced` worse on **{len(real)}** pairs"
        + (f" ({_worst(real)})" if real else "")
        + f"; {len(excused)} more within the budget's documented gap to a rival it skipped"
        + (f" ({_worst(excused)})" if excused else "")
        + ".",
        "",
        "| padded configuration | objective | steps | `balanced` / bound: mean | worst | > 1.02 |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for (layout, objective), values in ratios.items():
        if values:
            label = "micro-batches of 1-8" if layout == "padded" else "batch_rebalance's"
            over = sum(v > 1.02 for v in values)
            lines.append(
                f"| {label} | {objective} | {len(values)} | {np.mean(values):.4f} | "
                f"{max(values):.4f} | {over} |"
            )
    for name, loss, req in real[:10]:
        shown = {k: v for k, v in req.items() if k != "lengths"}
        print(f"LOSS {name} +{100 * loss:.4f}% n={len(req['lengths'])} {shown}", file=sys.stderr)
    return lines


def _worst(losses: list[tuple[str, float, Any]]) -> str:
    by_rival = Counter(name for name, _, _ in losses)
    worst = max(loss for _, loss, _ in losses)
    return ", ".join(f"{k} {v}" for k, v in by_rival.most_common()) + f"; <= {100 * worst:.4f}%"


MODELS = {  # Megatron arguments slime reads (a toy model; a Qwen3-8B-like one)
    "toy": {"hidden_size": 16, "num_attention_heads": 2, "num_query_groups": 2, "vocab_size": 32,
            "ffn_hidden_size": 64, "num_experts": None, "num_layers": 2, "kv_channels": 8},
    "qwen3-8b": {"hidden_size": 4096, "num_attention_heads": 32, "num_query_groups": 8,
                 "vocab_size": 151936, "ffn_hidden_size": 12288, "num_experts": None,
                 "num_layers": 36, "kv_channels": 128},
}  # fmt: skip
FLAGS = ((True, False), (False, True), (True, True), (False, False))


def slime_case(rng: np.random.Generator) -> dict[str, Any]:
    """One call of slime's ``build_dp_schedule``: any sample count it accepts."""
    dp, size = int(rng.integers(1, 9)), int(rng.integers(1, 9))
    vpp, group = ((1, 1), (2, 1), (2, 2), (4, 3))[int(rng.integers(0, 4))]
    align, dynamic = dp * (group if vpp > 1 else 1), bool(rng.integers(0, 2))
    cp, cap = int(rng.integers(1, 3)), int(rng.choice([512, 2048, 8192]))
    if dynamic:
        n = int(rng.integers(dp, 60 * dp + 1))
    else:  # ceil(n / size) micro-batches a multiple of align, the last one mostly short
        chunks = align * int(rng.integers(1, 5))
        n = int(rng.integers((chunks - 1) * size + 1, chunks * size + 1))
    kind = str(rng.choice(KINDS))
    lengths = np.minimum(lengths_of(kind, rng, n), 4 * cap * cp)
    rollouts = np.sort(rng.integers(0, max(1, n * 3 // 4), n)) if rng.integers(0, 2) else None
    return {
        "dp": dp, "size": size, "vpp": vpp, "group": group, "cp": cp, "dynamic": dynamic,
        "cap": cap, "lengths": lengths.tolist(), "kind": kind,
        "rollouts": list(range(n)) if rollouts is None else rollouts.tolist(),
        "model": str(rng.choice(sorted(MODELS))), "flags": FLAGS[int(rng.integers(0, 3))],
    }  # fmt: skip


def _schedule(build: Any, case: dict[str, Any], flags: tuple[bool, bool]) -> Any:
    args = SimpleNamespace(
        micro_batch_size=case["size"],
        use_dynamic_batch_size=case["dynamic"],
        max_tokens_per_gpu=case["cap"] if case["dynamic"] else None,
        balance_data=flags[0],
        balance_by_flops=flags[1],
        **MODELS[case["model"]],
    )
    config = {
        "dp_size": case["dp"],
        "cp_size": case["cp"],
        "vpp_size": case["vpp"],
        "microbatch_group_size_per_vp_stage": case["group"],
    }
    rollouts, steps = case["rollouts"], 1 + len(case["rollouts"]) % 2
    gbs = max(1, len(set(rollouts)) // steps)
    try:
        return build(args, config, case["lengths"], global_batch_size=gbs, rollout_indices=rollouts)
    except (AssertionError, ValueError):  # slime asserts; the drop-in raises ScheduleError
        return None


def _steps_of(result: Any, dp: int) -> list[list[list[list[int]]]]:
    """Per step, per rank, the micro-batches as global sample indices."""
    partitions, mbi, nmb, _ = result
    offsets, steps = [0] * dp, []
    for count in nmb:
        steps.append([])
        for r in range(dp):
            mbs = mbi[r][offsets[r] : offsets[r] + count]
            offsets[r] += count
            steps[-1].append([[partitions[r][i] for i in mb] for mb in mbs])
    return steps


def _value(ranks: Any, costs: np.ndarray, overhead: float, objective: str) -> float:
    rows = [[overhead + float(costs[mb].sum()) for mb in mbs] for mbs in ranks]
    return objective_value(np.asarray(rows), objective)


def slime_compare(case: dict[str, Any], real: Any, ours: Any) -> tuple[int, int, float]:
    """(steps compared, steps where the drop-in is worse than some slime schedule, worst loss)."""
    from seqbalance.cost import FlopsModel
    from seqbalance.integrations.slime import _megatron_model_spec

    mine = _schedule(ours, case, case["flags"])
    if mine is None:
        return 0, 0, 0.0
    theirs = [s for flags in FLAGS if (s := _schedule(real, case, flags)) is not None]
    flops = FlopsModel(_megatron_model_spec(SimpleNamespace(**MODELS[case["model"]])))
    lengths = np.asarray(case["lengths"])
    costs, overhead = flops.per_sample(lengths), flops.microbatch_overhead
    objective, cap = ("lockstep" if case["flags"][1] else "step"), case["cap"] * case["cp"]
    worse, worst, steps = 0, 0.0, _steps_of(mine, case["dp"])
    for s, ranks in enumerate(steps):
        value = _value(ranks, costs, overhead, objective)
        best = min(
            (
                _value(other[s], costs, overhead, objective)
                for schedule in theirs
                if len(other := _steps_of(schedule, case["dp"])) == len(steps)
                and not (
                    case["dynamic"]
                    and any(len(mb) > 1 and lengths[mb].sum() > cap for r in other[s] for mb in r)
                )
            ),
            default=float("inf"),
        )
        if value > best * (1 + 1e-12):
            worse, worst = worse + 1, max(worst, value / best - 1)
    return len(steps), worse, worst


def slime_section(count: int, seed: int, source: str) -> list[str]:
    from seqbalance.integrations.slime import build_dp_schedule

    sys.path.insert(0, source)
    real = importlib.import_module("slime.utils.dp_schedule").build_dp_schedule
    rng = np.random.default_rng(seed)
    steps = worse = odd = 0
    worst = 0.0
    for _ in range(count):
        case = slime_case(rng)
        compared, lost, loss = slime_compare(case, real, build_dp_schedule)
        steps, worse, worst = steps + compared, worse + lost, max(worst, loss)
        if compared and len(case["lengths"]) % (case["dp"] * case["size"]):
            odd += 1
    return [
        f"slime: {count} random calls (seed {seed}), {steps} steps compared ({odd} calls with a "
        f"sample count not a multiple of dp x micro_batch_size): the drop-in worse than a "
        f"schedule slime's own code makes (balancing on or off) on **{worse}** steps"
        + (f" (by <= {100 * worst:.4f}%)" if worse else "")
        + ".",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000, help="random planning requests")
    parser.add_argument("--slime-calls", type=int, default=1000, help="random slime calls")
    parser.add_argument("--seed", type=int, default=2511)
    parser.add_argument("--slime-source", help="a checkout of THUDM/slime (part 2)")
    parser.add_argument("--out", help="also write the markdown section to this file")
    args = parser.parse_args(argv)
    lines = [
        f"### Random requests (`benchmarks/rivals.py --requests {args.requests}`)",
        "",
        f"Machine: {machine()}.",
        "",
        *rival_section(args.requests, args.seed),
        "",
    ]
    if args.slime_source:
        lines += [*slime_section(args.slime_calls, args.seed, args.slime_source), ""]
    publish(lines, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

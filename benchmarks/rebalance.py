"""Benchmark: the in-loop Rebalancer's overhead per step, next to the step it balances.

    python benchmarks/rebalance.py [--quick] [--out FILE] [--world-size 4]

Starts ``--world-size`` gloo processes on this machine (CPU, with
``seqbalance.runtime.launch``). For each step size (256 to 4096
samples over all ranks; heavy-tailed lengths, each rank holding an equal random share, the
situation after RL rollouts), every rank calls ``Rebalancer.rebalance`` on its samples (dicts of
``input_ids`` and ``labels``, int64) and times its three phases: the ``all_gather`` of lengths,
``plan_step`` (FLOPs cost of the example model, 4096-token cap) and the ``all_to_all_single``
exchange. Each figure is the median over repeats of the slowest rank. The step time is one
forward + backward pass of the example model (``seqbalance.measure.toy_model``, as in
``examples/torchrun_ddp.py``) over the rank's rebalanced micro-batches, slowest rank.

Prints a markdown section (and writes it to ``--out``). All ranks share the machine's cores, so
on a small machine both the overhead and the step time are inflated by contention.
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from seqbalance.measure.toy_model import TinyCausalTransformer, ToyModelConfig
from seqbalance.runtime import Rebalancer
from seqbalance.runtime.launch import launch

MAX_TOKENS = 4096


def _lengths(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(5.0, 1.0, n), 16, 2048).astype(np.int64)


def _worker(
    rank: int, world_size: int, sizes: list[int], repeats: int
) -> list[dict[str, Any]] | None:
    """One rank: the table's rows on rank 0, None elsewhere."""
    torch.set_num_threads(1)
    model = TinyCausalTransformer(ToyModelConfig(max_position=MAX_TOKENS))
    rebalancer = Rebalancer(
        timeout=timedelta(minutes=2), max_tokens=MAX_TOKENS, cost=model.model_spec()
    )
    rows = []
    for n in sizes:
        lengths = _lengths(n, seed=n)
        owner = np.random.default_rng(n + 1).permutation(n) % world_size
        generator = torch.Generator().manual_seed(rank)
        local = [
            {"input_ids": ids, "labels": ids.roll(-1)}
            for ids in (
                torch.randint(0, model.config.vocab_size, (int(length),), generator=generator)
                for length in lengths[owner == rank]
            )
        ]
        phases = []
        for _ in range(repeats):
            dist.barrier()
            started = time.perf_counter()
            result = rebalancer.rebalance(local)
            total = time.perf_counter() - started
            phases.append([result.timings[k] for k in ("gather", "plan", "exchange")] + [total])
        dist.barrier()
        started = time.perf_counter()
        for microbatch in result.microbatches:
            cu = torch.tensor([0, *np.cumsum([s["input_ids"].shape[0] for s in microbatch])])
            ids = torch.cat([s["input_ids"] for s in microbatch])
            model(ids, cu, torch.cat([s["labels"] for s in microbatch])).backward()
        compute = time.perf_counter() - started
        mine = {
            "phases": np.median(np.array(phases), axis=0).tolist(),
            "compute": compute,
            "tokens": int(sum(s["input_ids"].shape[0] for mb in result.microbatches for s in mb)),
            "sent": result.sent_samples,
            "microbatches": len(result.microbatches),
            "imbalance": float(result.plan.summary()["imbalance"]),
        }
        everyone: list[Any] = [None] * world_size
        dist.all_gather_object(everyone, mine)
        if rank == 0:
            rows.append(_row(n, everyone))
    return rows if rank == 0 else None


def _row(n: int, ranks: list[dict[str, Any]]) -> dict[str, Any]:
    phases = np.array([r["phases"] for r in ranks]).max(axis=0)
    computes = np.array([r["compute"] for r in ranks])
    return {
        "samples": n,
        "tokens_per_rank": int(np.mean([r["tokens"] for r in ranks])),
        "gather_ms": phases[0] * 1e3,
        "plan_ms": phases[1] * 1e3,
        "exchange_ms": phases[2] * 1e3,
        "total_ms": phases[3] * 1e3,
        "moved": sum(r["sent"] for r in ranks) / n,
        "step_s": float(computes.max()),
        "overhead": phases[3] / computes.max(),
        "predicted_imbalance": ranks[0]["imbalance"],
        "measured_imbalance": float(computes.max() / computes.mean()),
    }


def run(sizes: list[int], repeats: int, world_size: int) -> list[dict[str, Any]]:
    results = launch(
        _worker,
        world_size,
        args=(sizes, repeats),
        timeout=3600.0,
        collective_timeout=300.0,
    )
    return results[0]


def markdown(rows: list[dict[str, Any]], world_size: int, repeats: int, command: str) -> str:
    lines = [
        "## Rebalancer overhead per step",
        "",
        f"`{command}` — {world_size} gloo ranks on one machine ({os.cpu_count()} CPU cores, "
        f"{platform.processor() or platform.machine()}), torch {torch.__version__}; median of "
        f"{repeats} calls, slowest rank. Step = forward + backward of the example model "
        "(`toy_model` defaults) over the rank's rebalanced micro-batches.",
        "",
        "| samples | tokens/rank | all_gather ms | plan ms | exchange ms | total ms "
        "| samples moved | step s | overhead / step | predicted imbalance | measured imbalance |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    lines.extend(
        f"| {r['samples']} | {r['tokens_per_rank']} | {r['gather_ms']:.1f} "
        f"| {r['plan_ms']:.1f} | {r['exchange_ms']:.1f} | {r['total_ms']:.1f} "
        f"| {r['moved']:.0%} | {r['step_s']:.2f} | {r['overhead']:.2%} "
        f"| {r['predicted_imbalance']:.3f} | {r['measured_imbalance']:.3f} |"
        for r in rows
    )
    lines += [
        "",
        "All ranks share the machine's cores, so both columns include contention; on GPUs the "
        "step is far shorter per token but so are the collectives (NCCL), and planning is the "
        "same CPU work.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="256 and 1024 samples, 3 repeats")
    parser.add_argument("--out", type=Path, help="also write the markdown section here")
    parser.add_argument("--world-size", type=int, default=4)
    args = parser.parse_args()
    sizes = [256, 1024] if args.quick else [256, 1024, 4096]
    repeats = 3 if args.quick else 5
    command = "python benchmarks/rebalance.py" + (" --quick" if args.quick else "")
    text = markdown(run(sizes, repeats, args.world_size), args.world_size, repeats, command)
    print(text)
    if args.out is not None:
        args.out.write_text(text)


if __name__ == "__main__":
    main()

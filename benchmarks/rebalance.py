"""Benchmark: the in-loop Rebalancer's overhead per step, next to the step it balances.

    python benchmarks/rebalance.py [--quick] [--out FILE] [--world-size 4] [--device cpu|cuda]

Starts ``--world-size`` gloo processes on this machine (CPU, with
``seqbalance.measure.launch``; ``--device cuda``: NCCL, one GPU per process, the samples and the
model on the rank's GPU, scripts/device_check.sh). For each step size (256 to 4096
samples over all ranks; heavy-tailed lengths, each rank holding an equal random share, the
situation after RL rollouts), every rank runs a training loop over ``Rebalancer.iterate`` of
its samples (dicts of ``input_ids`` and ``labels``, int64; the same batch every step), twice:
``overlap=False`` (each step's ``all_gather`` of lengths, ``plan_step`` with the FLOPs cost of
the example model and a 4096-token cap, and ``all_to_all_single`` exchange run when the loop
asks for the step, as ``rebalance`` does) and ``overlap=True`` (the next step's work runs on
the Rebalancer's thread and process group while the loop computes). A step is one forward +
backward pass of the example model (``seqbalance.measure.toy_model``, as in
``examples/torchrun_ddp.py``) over the rank's rebalanced micro-batches, then an all_reduce on
the world group (the gradient sync). Measured per step: the time the loop is blocked in
``next()``, the step (compute and sync) and its compute alone (the measured imbalance is the
slowest rank's compute over the mean); figures are medians over the steps after the first (whose
work cannot overlap anything), slowest rank.

Prints a markdown section (and writes it to ``--out``). All ranks share the machine's cores, so
on a small machine both the overhead and the step time are inflated by contention.
"""

from __future__ import annotations

import argparse
import itertools
import os
import platform
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from seqbalance.measure.launch import launch
from seqbalance.measure.toy_model import TinyCausalTransformer, ToyModelConfig
from seqbalance.runtime import Rebalancer
from seqbalance.runtime.collectives import synchronize

MAX_TOKENS = 4096
MODES = {"off": False, "on": True}  # overlap


def _lengths(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(5.0, 1.0, n), 16, 2048).astype(np.int64)


def _step(model: TinyCausalTransformer, result: Any, device: torch.device) -> float:
    """One training step over this rank's micro-batches, then the gradient sync; the seconds
    of its compute (before the sync, where ranks wait for each other)."""
    started = time.perf_counter()
    for microbatch in result.microbatches:
        sizes = [s["input_ids"].shape[0] for s in microbatch]
        cu = torch.tensor([0, *np.cumsum(sizes)], device=device)
        ids = torch.cat([s["input_ids"] for s in microbatch])
        model(ids, cu, torch.cat([s["labels"] for s in microbatch])).backward()
    synchronize(device)
    compute = time.perf_counter() - started
    dist.all_reduce(torch.zeros(1, device=device))
    return compute


def _loop(
    model: TinyCausalTransformer,
    rebalancer: Rebalancer,
    local: list[Any],
    steps: int,
    overlap: bool,
    device: torch.device,
) -> dict[str, Any]:
    """This rank's measurements of ``steps`` training steps over ``rebalancer.iterate``."""
    iterator = iter(rebalancer.iterate(itertools.repeat(local, steps), overlap=overlap))
    blocked, computes, totals, phases = [], [], [], []
    dist.barrier()
    for _ in range(steps):
        started = time.perf_counter()
        result = next(iterator)
        blocked.append(time.perf_counter() - started)
        started = time.perf_counter()
        computes.append(_step(model, result, device))
        totals.append(time.perf_counter() - started)
        phases.append([result.timings[k] for k in ("gather", "plan", "exchange")])
    iterator.close()
    return {
        "phases": np.median(np.array(phases[1:]), axis=0).tolist(),
        "blocked": float(np.median(blocked[1:])),
        "compute": float(np.median(computes[1:])),
        "step": float(np.median(totals[1:])),
        "tokens": int(sum(s["input_ids"].shape[0] for mb in result.microbatches for s in mb)),
        "sent": result.sent_samples,
        "imbalance": float(result.plan.summary()["imbalance"]),
    }


def _worker(
    rank: int, world_size: int, sizes: list[int], repeats: int, device_type: str
) -> list[dict[str, Any]] | None:
    """One rank: the table's rows on rank 0, None elsewhere."""
    torch.set_num_threads(1)
    device = torch.device(f"cuda:{rank}" if device_type == "cuda" else "cpu")
    model = TinyCausalTransformer(ToyModelConfig(max_position=MAX_TOKENS)).to(device)
    # The Rebalancer's own collectives, on the backend of the device.
    group = dist.new_group(backend="nccl" if device_type == "cuda" else "gloo")
    rebalancer = Rebalancer(group, timeout=120.0, max_tokens=MAX_TOKENS, cost=model.model_spec())
    rows = []
    for n in sizes:
        lengths = _lengths(n, seed=n)
        owner = np.random.default_rng(n + 1).permutation(n) % world_size
        generator = torch.Generator().manual_seed(rank)
        local = [
            {"input_ids": ids.to(device), "labels": ids.roll(-1).to(device)}
            for ids in (
                torch.randint(0, model.config.vocab_size, (int(length),), generator=generator)
                for length in lengths[owner == rank]
            )
        ]
        for mode, overlap in MODES.items():
            mine = _loop(model, rebalancer, local, repeats + 1, overlap, device)
            everyone: list[Any] = [None] * world_size
            dist.all_gather_object(everyone, mine)
            if rank == 0:
                rows.append(_row(n, mode, everyone))
    return rows if rank == 0 else None


def _row(n: int, mode: str, ranks: list[dict[str, Any]]) -> dict[str, Any]:
    phases = np.array([r["phases"] for r in ranks]).max(axis=0)
    computes = np.array([r["compute"] for r in ranks])
    step = max(r["step"] for r in ranks)
    blocked = max(r["blocked"] for r in ranks)
    return {
        "samples": n,
        "overlap": mode,
        "tokens_per_rank": int(np.mean([r["tokens"] for r in ranks])),
        "gather_ms": phases[0] * 1e3,
        "plan_ms": phases[1] * 1e3,
        "exchange_ms": phases[2] * 1e3,
        "blocked_ms": blocked * 1e3,
        "moved": sum(r["sent"] for r in ranks) / n,
        "step_s": step,
        "overhead": blocked / step,
        "predicted_imbalance": ranks[0]["imbalance"],
        "measured_imbalance": float(computes.max() / computes.mean()),
    }


def run(
    sizes: list[int], repeats: int, world_size: int, device: str = "cpu"
) -> list[dict[str, Any]]:
    results = launch(
        _worker,
        world_size,
        args=(sizes, repeats, device),
        timeout=3600.0,
        collective_timeout=300.0,
        backend="nccl" if device == "cuda" else "gloo",
    )
    return results[0]


def markdown(
    rows: list[dict[str, Any]], world_size: int, repeats: int, command: str, device: str = "cpu"
) -> str:
    where = (
        f"{world_size} NCCL ranks, one {torch.cuda.get_device_name(0)} each"
        if device == "cuda"
        else f"{world_size} gloo ranks on one machine ({os.cpu_count()} CPU cores, "
        f"{platform.processor() or platform.machine()})"
    )
    lines = [
        "## Rebalancer overhead per step",
        "",
        f"`{command}` — {where}, torch {torch.__version__}; median of "
        f"{repeats} steps after the first, slowest rank. Step = forward + backward of the example "
        "model (`toy_model` defaults) over the rank's rebalanced micro-batches and an "
        "all_reduce; overhead = time blocked in `next()` / step. With overlap on, the "
        "all_gather, plan and exchange run on the Rebalancer's thread during the previous "
        "step.",
        "",
        "| samples | tokens/rank | overlap | all_gather ms | plan ms | exchange ms "
        "| blocked in next() ms | samples moved | step s | overhead / step "
        "| predicted imbalance | measured imbalance |",
        "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    lines.extend(
        f"| {r['samples']} | {r['tokens_per_rank']} | {r['overlap']} | {r['gather_ms']:.1f} "
        f"| {r['plan_ms']:.1f} | {r['exchange_ms']:.1f} | {r['blocked_ms']:.1f} "
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
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = parser.parse_args()
    sizes = [256, 1024] if args.quick else [256, 1024, 4096]
    repeats = 3 if args.quick else 5
    command = "python benchmarks/rebalance.py" + (" --quick" if args.quick else "")
    command += " --device cuda" if args.device == "cuda" else ""
    rows = run(sizes, repeats, args.world_size, args.device)
    text = markdown(rows, args.world_size, repeats, command, args.device)
    print(text)
    if args.out is not None:
        args.out.write_text(text)


if __name__ == "__main__":
    main()

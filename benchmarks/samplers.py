"""Benchmark of the lazy samplers over 1M, 10M and 100M memory-mapped lengths.

    python benchmarks/samplers.py [--sizes 1e6 1e7 1e8] [--microbatches 1000] [--out FILE]

For each size, one rank's ``BalancedBatchSampler`` (8 data-parallel ranks, global batch 512,
Qwen3-8B training FLOPs, cap 16384, shuffled) reads an int32 ``.npy`` of lognormal lengths
(median ~400 tokens, clipped to [1, 16384]) generated in a temporary folder and opened with
``np.load(mmap_mode="r")``. Measured, in one process per size (so memory is not shared):

- construction: ``BalancedBatchSampler(...)``, i.e. the vectorised check of every length
  (caps and costs) in one chunked pass;
- first micro-batch: ``next(iter(sampler))`` after construction (target <= 100 ms);
- fingerprint: ``state_dict()`` (SHA-256 of all lengths, computed once; target <= 2 s at 100M);
- blocked in ``next()``: per micro-batch, median, 99th percentile and maximum over
  ``--microbatches`` micro-batches after the first 10, while the loop "trains" ``--train-ms``
  per micro-batch (``time.sleep``: the GIL is released as in a real step) (target <= 1 ms);
- memory: peak growth of the process's anonymous resident memory (``RssAnon``, sampled every
  2 ms; the memory-mapped file's page cache is shared between ranks and not counted) from
  before construction to the end (target <= 4 bytes per sample + 64 MiB);
- identical: of the first 20 steps, how many the sampler yields exactly as an eager
  ``plan_step`` of that step's samples (``Permutation(n, (seed, 0))`` at the step's positions,
  recomputed here) gives for this rank.

Prints a markdown section for BENCHMARKS.md (and writes it to FILE with ``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

DP, BATCH, CAP, MODEL, SEED = 8, 512, 16384, "qwen3-8b", 0
CHECKED_STEPS = 20


def rss_anon() -> int:
    """Anonymous resident memory of this process, bytes (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no RssAnon in /proc/self/status")


def write_lengths(path: Path, n: int) -> None:
    """Lognormal int32 lengths, written in chunks (never all in memory)."""
    out = np.lib.format.open_memmap(path, mode="w+", dtype=np.int32, shape=(n,))
    rng = np.random.default_rng(0)
    for start in range(0, n, 1 << 22):
        size = min(1 << 22, n - start)
        out[start : start + size] = np.clip(rng.lognormal(6.0, 1.0, size), 1, CAP)
    out.flush()
    del out


def measure(path: Path, microbatches: int, train_ms: float) -> dict:
    """One size, in this process (the child of ``main``)."""
    import torch  # noqa: F401  (a training process has torch loaded; not counted below)

    import seqbalance as sb
    from seqbalance.plan.layout import Permutation
    from seqbalance.runtime import BalancedBatchSampler

    lengths = np.load(path, mmap_mode="r")
    n = int(lengths.shape[0])
    peak = [rss_anon()]
    base = peak[0]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], rss_anon())
            time.sleep(0.002)

    watcher = threading.Thread(target=sample, daemon=True)
    watcher.start()
    t0 = time.perf_counter()
    sampler = BalancedBatchSampler(
        lengths, BATCH, dp_rank=0, dp_size=DP, seed=SEED, cost="flops", model=MODEL, max_tokens=CAP
    )
    t1 = time.perf_counter()
    batches = iter(sampler)
    first = next(batches)
    t2 = time.perf_counter()
    yielded = [first]
    blocked = []
    while len(blocked) < microbatches:
        time.sleep(train_ms / 1000)
        start = time.perf_counter()
        batch = next(batches, None)
        if batch is None:
            raise SystemExit(
                f"--microbatches {microbatches}: one rank of {n:,} samples has "
                f"{len(yielded)} micro-batches in an epoch (pass larger --sizes)"
            )
        blocked.append(time.perf_counter() - start)
        yielded.append(batch)
    t3 = time.perf_counter()
    state = sampler.state_dict()
    t4 = time.perf_counter()
    stop.set()
    watcher.join()
    # Eager reference: plan_step of each step's samples, recomputed from the definition.
    options = sb.PlanOptions(cost="flops", model=MODEL, max_tokens=CAP)
    shuffle = Permutation(n, (SEED, 0))
    expected: list[list[int]] = []
    counts = []
    for step in range(CHECKED_STEPS):
        indices = shuffle(np.arange(step * BATCH, (step + 1) * BATCH))
        plan = sb.plan_step(np.asarray(lengths[indices], dtype=np.int64), DP, options)
        counts.append(plan.n_microbatches)
        expected += [indices[mb].tolist() for mb in plan.ranks[0]]
    identical = 0
    position = 0
    for count in counts:
        mine, theirs = yielded[position : position + count], expected[position : position + count]
        identical += mine == theirs
        position += count
    steady = np.array(blocked[10:])
    return {
        "n": n,
        "construct_s": t1 - t0,
        "first_s": t2 - t1,
        "fingerprint_s": t4 - t3,
        "blocked_median_ms": float(np.median(steady) * 1e3),
        "blocked_p99_ms": float(np.percentile(steady, 99) * 1e3),
        "blocked_max_ms": float(steady.max() * 1e3),
        "microbatches": len(blocked),
        "peak_growth_mib": (peak[0] - base) / 2**20,
        "budget_mib": (4 * n + 64 * 2**20) / 2**20,
        "identical": identical,
        "consumed": state["consumed"],
    }


def main() -> int | str:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=float, nargs="+", default=[1e6, 1e7, 1e8])
    parser.add_argument("--microbatches", type=int, default=1000)
    parser.add_argument("--train-ms", type=float, default=5.0)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--child", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(measure(args.child, args.microbatches, args.train_ms)))
        return 0
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for size in args.sizes:
            path = Path(folder) / f"lengths_{int(size)}.npy"
            write_lengths(path, int(size))
            done = subprocess.run(
                [
                    *(sys.executable, __file__, "--child", str(path)),
                    *("--microbatches", str(args.microbatches), "--train-ms", str(args.train_ms)),
                ],
                capture_output=True,
                text=True,
                timeout=1800,
                env={**os.environ, "OMP_NUM_THREADS": "1"},
            )
            if done.returncode:
                # The child's own last line says why (a size too small, a lengths error).
                why = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
                return f"--sizes {int(size):,}: {why}"
            rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
            path.unlink()
    lines = [
        "## Lazy samplers over memory-mapped lengths (`benchmarks/samplers.py`)",
        "",
        f"`python benchmarks/samplers.py --microbatches {args.microbatches} "
        f"--train-ms {args.train_ms:g}` on "
        f"{platform.machine()} ({os.cpu_count()} cores, shared), Python "
        f"{platform.python_version()}. One rank of dp {DP}, global batch {BATCH}, {MODEL} "
        f"FLOPs, cap {CAP}, int32 `.npy` opened with `mmap_mode='r'`; one process per size.",
        "",
        "| samples | construction (check of all lengths) | first micro-batch | fingerprint "
        "| blocked in next(): median / p99 / max | peak memory growth (budget) "
        f"| steps identical to eager plan_step (of {CHECKED_STEPS}) |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {row['n']:,} | {row['construct_s'] * 1e3:.0f} ms | {row['first_s'] * 1e3:.1f} ms "
        f"| {row['fingerprint_s'] * 1e3:.0f} ms "
        f"| {row['blocked_median_ms']:.3f} / {row['blocked_p99_ms']:.3f} / "
        f"{row['blocked_max_ms']:.2f} ms "
        f"| {row['peak_growth_mib']:.1f} MiB ({row['budget_mib']:.0f} MiB) "
        f"| {row['identical']} |"
        for row in rows
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out is not None:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`seqbalance bench`: measure each strategy on real processes training a small transformer.

P worker processes (gloo on CPU, NCCL on GPU), each pinned to one core with one torch thread,
train the toy transformer on the same stream of real lengths, once per strategy (the strategies
take turns step by step, so drift in the machine's speed affects them alike). A step is real
gradient accumulation: forward + backward of every packed micro-batch the plan gives the rank,
a gradient all-reduce where DDP has it (once per step, or after every micro-batch for the
``lockstep`` objective), then an optimizer step. Each rank's compute time and the step wall
time are recorded after warm-up.

Unless ``--time-model`` is given, the processes first calibrate a TimeModel together (each
times a share of the calibration micro-batches, under the same load as training) and every
strategy is planned with it, so ``balanced`` optimises the cost the processes really pay. The
same plans feed the simulator, so its predicted reduction sits beside the measured one.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np

from seqbalance._validation import check_int
from seqbalance.cli._common import (
    add_json_flag,
    add_lengths_option,
    add_objective_argument,
    add_strategies_option,
    load_lengths,
    markdown_table,
    print_json,
    print_table,
    progress_callback,
)
from seqbalance.cli.calibrate import (
    MODEL_SIZES,
    calibration_microbatches,
    fit_time_model,
    model_config,
    time_microbatches,
)

DEFAULT_STRATEGIES = ("round_robin", "token_kk", "balanced")


@dataclass(frozen=True)
class BenchSettings:
    """Everything a worker process needs (written as JSON for it); lengths already scaled."""

    procs: int
    device: str
    port: int
    cores: tuple[int, ...]
    lengths: list[int]
    groups: list[int] | None
    strategies: tuple[str, ...]
    objective: str
    global_batch_size: int
    steps: int
    warmup: int
    max_tokens: int
    model_size: str
    time_model_json: str | None
    trials: int
    repeats: int
    seed: int
    timeout_seconds: float
    output: str


def length_divisor(lengths: np.ndarray, max_tokens: int) -> int:
    """Smallest integer that brings the median sample to at most a quarter of the token cap.

    Keeps several samples per micro-batch, so placement (not truncation) decides step time.
    """
    median = float(np.median(lengths)) if lengths.size else 0.0
    return max(1, math.ceil(median / (max_tokens / 4)))


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _calibrate_together(model: Any, settings: BenchSettings, device: Any, rank: int) -> Any:
    """Every rank times its share of the calibration micro-batches; all fit the same model."""
    import torch.distributed as dist

    microbatches = calibration_microbatches(
        settings.trials,
        max_tokens=settings.max_tokens,
        max_length=min(settings.max_tokens, max(settings.lengths)),
        seed=settings.seed,
    )
    mine = list(range(rank, len(microbatches), settings.procs))
    seconds = time_microbatches(
        model, [microbatches[i] for i in mine], device=device, repeats=settings.repeats
    )
    shares: list[Any] = [None] * settings.procs
    dist.all_gather_object(shares, (mine, seconds.tolist()))
    measured = np.empty(len(microbatches))
    for indices, values in shares:
        measured[indices] = values
    return fit_time_model(microbatches, measured)


def _plan_all(settings: BenchSettings, time_model: Any) -> tuple[dict[str, Any], Any]:
    """Simulate (plan) every strategy on the same batches; per-rank micro-batch lengths."""
    from seqbalance.sim import simulate

    result = simulate(
        np.asarray(settings.lengths, dtype=np.int64),
        groups=None if settings.groups is None else np.asarray(settings.groups),
        dp_size=settings.procs,
        global_batch_size=settings.global_batch_size,
        steps=settings.warmup + settings.steps,
        max_tokens=settings.max_tokens,
        cost=time_model,
        objective=settings.objective,
        strategies=settings.strategies,
        seed=settings.seed,
    )
    schedule = {
        name: [
            [
                [result.lengths[batch][indices].tolist() for indices in rank_microbatches]
                for rank_microbatches in plan.ranks
            ]
            for plan, batch in zip(result.plans[name], result.batches, strict=True)
        ]
        for name in settings.strategies
    }
    return schedule, result


def _progress_path(settings: BenchSettings) -> Path:
    """Rank 0 writes ``DONE TOTAL`` steps here; the launcher reads it to drive a progress bar."""
    return Path(settings.output).parent / "progress"


def _launch(
    settings: BenchSettings,
    folder: Path,
    on_progress: Callable[[int, int], None] = lambda done, total: None,
) -> None:
    """Run ``settings.procs`` worker processes; raise RuntimeError with a log tail on failure.

    Workers are fresh interpreters (not ``multiprocessing``), so nothing depends on the
    caller's ``__main__`` being importable or guarded. ``on_progress(done, total)`` is called
    with the steps rank 0 has finished.
    """
    settings_path = folder / "settings.json"
    settings_path.write_text(json.dumps(asdict(settings)), encoding="utf-8")
    code = "import sys; from seqbalance.cli.bench import worker_main; worker_main(sys.argv[1:])"
    logs = [folder / f"rank{rank}.log" for rank in range(settings.procs)]
    workers = []
    for rank, log in enumerate(logs):
        with log.open("w", encoding="utf-8") as stream:
            workers.append(
                subprocess.Popen(
                    [sys.executable, "-c", code, str(rank), str(settings_path)],
                    stdout=stream,
                    stderr=subprocess.STDOUT,
                )
            )
    failed: list[int] = []
    try:
        while not failed and any(worker.poll() is None for worker in workers):
            time.sleep(0.1)
            with contextlib.suppress(OSError, ValueError):  # not written yet, or mid-write
                done, total = map(int, _progress_path(settings).read_text().split())
                on_progress(done, total)
            failed = [r for r, worker in enumerate(workers) if worker.poll() not in (None, 0)]
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.terminate()
        for worker in workers:
            worker.wait()
    # The first rank to fail explains the run; the others were stopped by us or by its absence.
    failed = failed or [r for r, worker in enumerate(workers) if worker.returncode != 0]
    if failed:
        rank = failed[0]
        tail = logs[rank].read_text(encoding="utf-8", errors="replace")[-3000:]
        raise RuntimeError(f"bench worker {rank} failed (exit {workers[rank].returncode}):\n{tail}")


def worker_main(argv: list[str]) -> None:
    """Entry point of a worker process: ``RANK SETTINGS.json``."""
    data = json.loads(Path(argv[1]).read_text(encoding="utf-8"))
    data["cores"] = tuple(data["cores"])
    data["strategies"] = tuple(data["strategies"])
    _worker(int(argv[0]), BenchSettings(**data))
    # The results are written; skip interpreter teardown, where torch's C++ threads (gloo) have
    # been seen to abort the process ("terminate called without an active exception").
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _worker(rank: int, settings: BenchSettings) -> None:
    import torch
    import torch.distributed as dist

    from seqbalance.cost import TimeModel
    from seqbalance.runtime.toy_model import TinyCausalTransformer, make_packed_batch

    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {settings.cores[rank % len(settings.cores)]})
    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    device = torch.device(f"cuda:{rank}" if settings.device == "cuda" else "cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(
        "nccl" if device.type == "cuda" else "gloo",
        init_method=f"tcp://127.0.0.1:{settings.port}",
        rank=rank,
        world_size=settings.procs,
        timeout=timedelta(seconds=settings.timeout_seconds),
    )
    try:
        config = model_config(settings.model_size, max_position=settings.max_tokens)
        model = TinyCausalTransformer(config, seed=settings.seed).to(device)
        calibration = None
        if settings.time_model_json is None:
            calibration = _calibrate_together(model, settings, device, rank)
            time_model = calibration.time_model
        else:
            time_model = TimeModel.from_json(settings.time_model_json)
        box: list[Any] = [None]
        if rank == 0:
            schedule, result = _plan_all(settings, time_model)
            box[0] = schedule
        dist.broadcast_object_list(box, src=0)
        schedule = box[0]
        records = _train(model, schedule, settings, device, rank, make_packed_batch)
        gathered: list[Any] | None = [None] * settings.procs if rank == 0 else None
        dist.gather_object(records, gathered, dst=0)
        if rank == 0:
            raw = {
                "records": gathered,
                "time_model": json.loads(time_model.to_json()),
                "calibration": None if calibration is None else calibration.to_dict(),
                "simulation": result.to_dict(),
            }
            Path(settings.output).write_text(json.dumps(raw), encoding="utf-8")
        # Leave together: a rank tearing gloo down while its peer is still inside a collective
        # can abort the process.
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _train(
    model: Any,
    schedule: dict[str, Any],
    settings: BenchSettings,
    device: Any,
    rank: int,
    make_packed_batch: Any,
) -> dict[str, list[dict[str, Any]]]:
    """Train every strategy's steps; per step: this rank's compute, micro-batch and wall times."""
    import torch
    import torch.distributed as dist

    parameters = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(parameters, lr=1e-4)
    vocab = model.config.vocab_size

    def synchronize() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def all_reduce_gradients() -> None:
        # One flat bucket, as DDP does, so communication cost does not depend on the plan.
        flat = torch.cat([p.grad.reshape(-1) for p in parameters])
        dist.all_reduce(flat)
        flat.div_(settings.procs)
        offset = 0
        for p in parameters:
            p.grad.copy_(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()

    records: dict[str, list[dict[str, Any]]] = {name: [] for name in settings.strategies}
    # Strategies take turns step by step, so a slow spell of the machine hits them all alike.
    for step in range(settings.warmup + settings.steps):
        for name in settings.strategies:
            microbatches = schedule[name][step][rank]
            inputs = [
                tuple(
                    t.to(device)
                    for t in make_packed_batch(lengths, vocab_size=vocab, seed=step * 1000 + i)
                )
                for i, lengths in enumerate(microbatches)
            ]
            optimizer.zero_grad(set_to_none=False)
            dist.barrier()
            step_start = time.perf_counter()
            seconds = []
            for batch in inputs:
                synchronize()
                start = time.perf_counter()
                model(*batch).backward()
                synchronize()
                seconds.append(time.perf_counter() - start)
                if settings.objective == "lockstep":
                    all_reduce_gradients()
            if settings.objective == "step":
                all_reduce_gradients()
            optimizer.step()
            synchronize()
            wall = time.perf_counter() - step_start
            if rank == 0:
                _progress_path(settings).write_text(
                    f"{step + 1} {settings.warmup + settings.steps}"
                )
            if step >= settings.warmup:
                records[name].append(
                    {
                        "step": step - settings.warmup,
                        "compute_seconds": float(sum(seconds)),
                        "microbatch_seconds": seconds,
                        "microbatch_lengths": microbatches,
                        "wall_seconds": wall,
                    }
                )
    return records


def summarize(raw: dict[str, Any], settings: BenchSettings) -> dict[str, Any]:
    """Per-strategy measured and predicted figures, reductions and time-model errors."""
    from seqbalance.cost import TimeModel

    time_model = TimeModel.from_json(json.dumps(raw["time_model"]))
    simulation = raw["simulation"]
    records = raw["records"]
    strategies: dict[str, dict[str, Any]] = {}
    all_errors = []
    for name in settings.strategies:
        per_rank = [rank_records[name] for rank_records in records]
        compute = np.array([[r["compute_seconds"] for r in rows] for rows in per_rank])  # [P, S]
        wall = np.array([[r["wall_seconds"] for r in rows] for rows in per_rank]).max(axis=0)
        imbalance = compute.max(axis=0) / compute.mean(axis=0)
        errors = [
            abs(time_model.microbatch_seconds(lengths) - seconds) / seconds
            for rows in per_rank
            for r in rows
            for lengths, seconds in zip(
                r["microbatch_lengths"], r["microbatch_seconds"], strict=True
            )
        ]
        all_errors.extend(errors)
        predicted = np.array(simulation["strategies"][name]["step_seconds"][settings.warmup :])
        strategies[name] = {
            "median_step_seconds": float(np.median(wall)),
            "mean_step_seconds": float(wall.mean()),
            "mean_max_rank_compute_seconds": float(compute.max(axis=0).mean()),
            "median_imbalance": float(np.median(imbalance)),
            "mean_imbalance": float(imbalance.mean()),
            "predicted_mean_step_seconds": float(predicted.mean()),
            "microbatch_mape": float(np.mean(errors)),
            "microbatches": len(errors),
            "step_seconds": wall.tolist(),
        }

    def reduction(measure: str, name: str, baseline: str) -> float:
        return 1.0 - strategies[name][measure] / strategies[baseline][measure]

    comparisons = {}
    if "balanced" in strategies:
        for baseline in ("round_robin", "token_kk"):
            if baseline not in strategies:
                continue
            measured = reduction("mean_step_seconds", "balanced", baseline)
            predicted = reduction("predicted_mean_step_seconds", "balanced", baseline)
            comparisons[f"balanced_vs_{baseline}"] = {
                "measured_step_time_reduction": measured,
                "measured_median_step_time_reduction": reduction(
                    "median_step_seconds", "balanced", baseline
                ),
                "measured_compute_reduction": reduction(
                    "mean_max_rank_compute_seconds", "balanced", baseline
                ),
                "predicted_reduction": predicted,
                "prediction_relative_error": abs(predicted - measured) / abs(measured)
                if measured != 0
                else None,
            }
    setup = {
        key: value
        for key, value in asdict(settings).items()
        if key not in ("lengths", "groups", "port", "output", "time_model_json")
    }
    return {
        "setup": setup,
        "time_model": raw["time_model"],
        "calibration": raw["calibration"],
        "microbatch_mape": float(np.mean(all_errors)),
        "strategies": strategies,
        "comparisons": comparisons,
    }


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "bench",
        help="measure the strategies on real processes training a small transformer (torch)",
        description=(
            "Launch --procs processes (gloo on CPU, NCCL on GPU), each pinned to one core with "
            "one thread, and train a small causal transformer on the same stream of real "
            "lengths once per strategy. Reports measured step time, rank imbalance (max/mean "
            "compute), the step-time reduction of balanced, and how far the time model and the "
            "simulator were from the measurement. Lengths are divided by --length-divisor "
            "(default: the smallest integer bringing the median to a quarter of --max-tokens) "
            "so a CPU core trains several samples per micro-batch."
        ),
    )
    parser.add_argument("--procs", type=int, default=2, help="processes (default: 2)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="default: cpu")
    add_lengths_option(parser)
    parser.add_argument(
        "--length-divisor",
        type=int,
        default=None,
        help="divide every length by this (rounded up; default: automatic, see above)",
    )
    add_strategies_option(parser, DEFAULT_STRATEGIES)
    add_objective_argument(parser)
    parser.add_argument("--steps", type=int, default=20, help="measured steps (default: 20)")
    parser.add_argument("--warmup", type=int, default=3, help="warm-up steps (default: 3)")
    parser.add_argument(
        "--global-batch",
        type=int,
        default=32,
        help="samples per step, rounded up to whole groups (default: 32; with groups of 8, "
        "as qwen25math, 64 lets balanced pair groups well)",
    )
    parser.add_argument(
        "--max-tokens",
        type=int,
        default=4096,
        help="token cap per micro-batch; longer samples are truncated (default: 4096)",
    )
    parser.add_argument(
        "--model-size",
        choices=tuple(MODEL_SIZES),
        default="small",
        help="toy transformer size (default: small)",
    )
    parser.add_argument(
        "--time-model",
        metavar="FILE",
        default=None,
        help="TimeModel JSON to plan with (default: calibrate in the processes first)",
    )
    parser.add_argument(
        "--trials", type=int, default=48, help="calibration micro-batches (default: 48)"
    )
    parser.add_argument("--repeats", type=int, default=3, help="calibration repeats (default: 3)")
    parser.add_argument("--seed", type=int, default=0, help="sampling, planner and weight seed")
    parser.add_argument(
        "--timeout",
        type=float,
        default=300.0,
        help="seconds any collective may wait before the run fails (default: 300)",
    )
    parser.add_argument(
        "--markdown", action="store_true", help="print the report as a markdown section"
    )
    add_json_flag(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import torch

    from seqbalance.cost import TimeModel

    procs = check_int(args.procs, "--procs", minimum=1)
    max_tokens = check_int(args.max_tokens, "--max-tokens", minimum=8)
    check_int(args.steps, "--steps", minimum=1)
    check_int(args.warmup, "--warmup", minimum=0)
    check_int(args.trials, "--trials", minimum=3)
    if args.device == "cuda" and torch.cuda.device_count() < procs:
        raise ValueError(
            f"--device cuda needs one GPU per process: {procs} processes, "
            f"{torch.cuda.device_count()} GPUs"
        )
    source = load_lengths(args.lengths)
    divisor = (
        length_divisor(source.lengths, max_tokens)
        if args.length_divisor is None
        else check_int(args.length_divisor, "--length-divisor", minimum=1)
    )
    lengths = np.minimum(-(-source.lengths // divisor), max_tokens)
    time_model_json = None
    if args.time_model is not None:
        time_model_json = TimeModel.load(args.time_model).to_json()
    cores = tuple(sorted(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") else (0,)
    strategies = tuple(args.strategies)
    load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="seqbalance-bench-") as folder:
        settings = BenchSettings(
            procs=procs,
            device=args.device,
            port=_free_port(),
            cores=cores,
            lengths=lengths.tolist(),
            groups=None if source.groups is None else source.groups.tolist(),
            strategies=strategies,
            objective=args.objective,
            global_batch_size=args.global_batch,
            steps=args.steps,
            warmup=args.warmup,
            max_tokens=max_tokens,
            model_size=args.model_size,
            time_model_json=time_model_json,
            trials=args.trials,
            repeats=args.repeats,
            seed=args.seed,
            timeout_seconds=args.timeout,
            output=str(Path(folder) / "raw.json"),
        )
        _check_plannable(settings)
        if not (args.json or args.markdown):
            print(
                f"bench: {procs} processes on cores {list(cores)}, {source.label} lengths / "
                f"{divisor}, {args.steps} steps (+{args.warmup} warm-up) x {len(strategies)} "
                "strategies ...",
                flush=True,
            )
        try:
            with progress_callback("bench steps", enabled=not (args.json or args.markdown)) as bar:
                _launch(settings, Path(folder), bar)
        except RuntimeError as error:
            print(f"seqbalance bench: error: {error}", file=sys.stderr)
            return 1
        raw = json.loads(Path(settings.output).read_text(encoding="utf-8"))
    report = summarize(raw, settings)
    report["setup"].update(
        {
            "lengths": source.label,
            "length_divisor": divisor,
            "cores": list(cores),
            "oversubscribed": procs > len(cores),
            "load_average_before": load_before,
            "elapsed_seconds": time.perf_counter() - started,
        }
    )
    if args.json:
        print_json(report)
        return 0
    _print_report(report, markdown=args.markdown)
    return 0


def _check_plannable(settings: BenchSettings) -> None:
    """Fail in the parent, with the planner's message, before any process is spawned."""
    from seqbalance.cost import TimeModel

    probe = TimeModel(0.0, 1.0, 0.0)
    _plan_all(
        BenchSettings(**{**asdict(settings), "steps": 1, "warmup": 0}),
        probe,
    )


COLUMNS = (
    "strategy",
    "median step (ms)",
    "mean step (ms)",
    "predicted (ms)",
    "imbalance",
    "time model MAPE",
)
CAPTION = (
    "imbalance: median over steps of max/mean rank compute; predicted: simulator, compute only "
    "(no all-reduce/optimizer); time model MAPE: per micro-batch"
)


def _title(setup: dict[str, Any]) -> str:
    return (
        f"bench: {setup['procs']} procs, {setup['lengths']} lengths / {setup['length_divisor']}, "
        f"toy-{setup['model_size']}, global batch {setup['global_batch_size']}, "
        f"max_tokens {setup['max_tokens']}, {setup['steps']} steps, objective {setup['objective']}"
    )


def _rows(report: dict[str, Any]) -> list[tuple[str, ...]]:
    return [
        (
            name,
            f"{1e3 * s['median_step_seconds']:.1f}",
            f"{1e3 * s['mean_step_seconds']:.1f}",
            f"{1e3 * s['predicted_mean_step_seconds']:.1f}",
            f"{s['median_imbalance']:.3f}",
            f"{100 * s['microbatch_mape']:.1f}%",
        )
        for name, s in report["strategies"].items()
    ]


def _notes(report: dict[str, Any]) -> list[str]:
    setup = report["setup"]
    notes = []
    calibration = report["calibration"]
    if calibration is not None:
        heldout = calibration["heldout"]
        notes.append(
            f"calibration: held-out MAPE {100 * heldout['mape']:.1f}%, "
            f"R² {heldout['r2']:.4f} on {heldout['n']} micro-batches"
        )
    notes.append(
        f"time model MAPE over all measured micro-batches: {100 * report['microbatch_mape']:.1f}%"
    )
    for key, c in report["comparisons"].items():
        notes.append(
            f"{key.replace('_vs_', ' vs ')}: mean step time "
            f"{-100 * c['measured_step_time_reduction']:+.1f}% measured "
            f"(max-rank compute {-100 * c['measured_compute_reduction']:+.1f}%), "
            f"{-100 * c['predicted_reduction']:+.1f}% predicted by the simulator"
        )
    if setup["oversubscribed"]:
        notes.append("warning: more processes than cores; timings include time-sharing")
    load = setup.get("load_average_before")
    if load is not None and load > len(setup["cores"]) - setup["procs"] + 0.5:
        notes.append(
            f"warning: the machine was busy before the run (1-minute load {load:.1f} on "
            f"{len(setup['cores'])} cores); other work shares the pinned cores, so timings "
            "are noisy"
        )
    notes.append(f"elapsed {setup['elapsed_seconds']:.0f} s")
    return notes


def _print_report(report: dict[str, Any], *, markdown: bool) -> None:
    if markdown:
        print(f"### {_title(report['setup'])}\n")
        print(markdown_table(COLUMNS, _rows(report)))
        print(f"\n{CAPTION}.\n")
        for note in _notes(report):
            print(f"- {note}")
        return
    print_table(_title(report["setup"]), COLUMNS, _rows(report), caption=CAPTION)
    for note in _notes(report):
        print(note)

"""``seqbalance bench``: the strategies measured on real processes (``measure.bench``)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import numpy as np

from seqbalance._validation import check_int
from seqbalance.cli._common import (
    CONTEXT_PARALLEL_FLAGS,
    LengthsInput,
    add_context_parallel_arguments,
    add_json_flag,
    add_lengths_option,
    add_plan_option_arguments,
    add_strategies_option,
    context_parallel_from_args,
    flag,
    flag_names,
    load_lengths,
    load_time_model,
    plan_options_from_args,
    print_json,
    print_section,
    progress_callback,
    require_torch,
)
from seqbalance.cost import TimeModel
from seqbalance.cost.context_parallel import ContextParallelTimeModel
from seqbalance.defaults import DEFAULT_TIMEOUT_SECONDS
from seqbalance.measure import bench
from seqbalance.measure.bench.context_parallel import MIN_REFIT_WARMUP
from seqbalance.measure.bench.settings import DEFAULT_STRATEGIES, TOY_MAX_TOKENS, SlowRank
from seqbalance.measure.calibrate import MIN_TRIALS, MODEL_SIZES
from seqbalance.plan import ContextParallel, PlanOptions, strategy_names


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "bench",
        help="measure the strategies on real processes training a small transformer (torch)",
        description=(
            "Launch --procs processes (gloo on CPU, NCCL on GPU), each pinned to one core with "
            "one thread, and train a small causal transformer on the same stream of real "
            "lengths once per strategy. Reports measured step time, rank imbalance (max/mean "
            "compute), the step-time reduction of balanced, and how far the time model and the "
            "simulator were from the measurement. Every plan option (--max-tokens, --layout, "
            "--microbatch-size, micro-batch counts, --objective, --order, --allow-oversize, "
            "--allow-empty) applies to every strategy, as in `plan` and `simulate`. Lengths are "
            "divided by --length-divisor (default: the smallest integer bringing the median to "
            "a quarter of --max-tokens) so a CPU core trains several samples per micro-batch; "
            "longer samples are then truncated to --max-tokens (a warning counts them) unless "
            "--allow-oversize. With --context-parallel the processes form a context-parallel "
            "domain instead (see that group below)."
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
    add_strategies_option(
        parser, DEFAULT_STRATEGIES, context_parallel_default=strategy_names(context_parallel=True)
    )
    parser.add_argument("--steps", type=int, default=20, help="measured steps (default: 20)")
    parser.add_argument(
        "--warmup",
        type=int,
        default=3,
        help=f"warm-up steps (default: 3; with --context-parallel, {MIN_REFIT_WARMUP} or more "
        "also refit the time model on the steps the strategies run)",
    )
    parser.add_argument(
        "--global-batch",
        type=int,
        default=32,
        help="samples per step, rounded up to whole groups (default: 32; with groups of 8, "
        "as qwen25math, 64 lets balanced pair groups well)",
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
        help="TimeModel JSON to plan with, from `seqbalance calibrate` (with --context-parallel: "
        "the ContextParallelTimeModel of `calibrate --context-parallel`, same --model-size; "
        "default: calibrate in the processes first)",
    )
    parser.add_argument(
        "--trials",
        type=int,
        default=48,
        help=f"calibration micro-batches, at least {MIN_TRIALS} (default: 48)",
    )
    parser.add_argument("--repeats", type=int, default=3, help="calibration repeats (default: 3)")
    parser.add_argument("--seed", type=int, default=0, help="sampling, planner and weight seed")
    parser.add_argument(
        "--slow-rank",
        metavar="R:F[@START-STOP]",
        type=_slow_rank,
        default=None,
        help="rank R computes F times slower (real extra compute after each micro-batch, "
        "proportional to its time), in measured steps START to STOP-1 (default: all; START- : "
        "to the end); compare "
        "--strategies balanced,balanced_adaptive,balanced_oracle (the closed loop, and "
        "balanced given the true speeds)",
    )
    parser.add_argument(
        "--noise",
        metavar="F",
        type=float,
        default=0.0,
        help="background load on every rank: after each micro-batch, compute again for a random "
        "multiple of its time, exponential with mean F (reproducible from --seed; default: 0). "
        "balanced_adaptive should stay near balanced_oracle under it",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_SECONDS,
        help=f"seconds any collective may wait before the run fails (default: "
        f"{DEFAULT_TIMEOUT_SECONDS:g})",
    )
    parser.add_argument(
        "--launch-timeout",
        type=float,
        default=3600.0,
        help="seconds the whole run may take before it is stopped (default: 3600)",
    )
    add_plan_option_arguments(parser, max_tokens_default=TOY_MAX_TOKENS)
    add_context_parallel_arguments(
        parser,
        "Shard long samples over context-parallel groups of the --procs processes (gloo, CPU) "
        "and compare static_cp, dynamic_cp_megatron and balanced: the processes first fit a "
        "ContextParallelTimeModel together (as `seqbalance calibrate --context-parallel`; "
        "or give its file with --time-model), every strategy is planned with it (predicted) "
        "and run with the context-parallel executor (measured: the slowest rank's time over "
        "its slots). Lengths are divided so the median is a quarter of the per-rank cap and "
        "cut to the largest usable CP size x the per-rank cap. Try --lengths long_context "
        "--max-tokens 1024 (with --context-parallel: the per-rank cap). --num-microbatches, "
        "--min-microbatches, --microbatch-multiple and --allow-empty apply to the slots.",
    )
    parser.add_argument(
        "--hf-model",
        metavar="PRESET",
        default=None,
        help="with --context-parallel: after the toy transformer, measure a small Hugging Face "
        "causal LM of this bundled preset's architecture the same way (scaled down to the toy's "
        "size, no download; needs transformers), e.g. qwen3-8b or llama-3.1-8b",
    )
    add_json_flag(parser, markdown="the report")
    parser.set_defaults(func=run)


_FLAGS = {
    **CONTEXT_PARALLEL_FLAGS,
    **{
        name: flag(name)
        for name in (
            "procs",
            "device",
            "length_divisor",
            "strategies",
            "steps",
            "warmup",
            "model_size",
            "trials",
            "repeats",
            "seed",
            "slow_rank",
            "noise",
            "hf_model",
        )
    },
    "global_batch_size": "--global-batch",
    "dp_size": "--procs",
    "n_ranks": "--procs",
    "timeout": "--timeout",
    "launch_timeout": "--launch-timeout",
    "time_model": "--time-model",
}
"""``BenchSettings`` fields, plan options (and ``scale_lengths`` keywords) as their flags."""


def _slow_rank(text: str) -> SlowRank:
    """``--slow-rank``: ``SlowRank.parse``, its message as the flag's error."""
    try:
        return SlowRank.parse(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _plan_options(args: argparse.Namespace, context_parallel: Any) -> Any:
    """The run's ``PlanOptions``: with context parallelism ``--max-tokens`` is the per-rank cap
    and ``"flops"`` stands for the run's time model (a context-parallel request names
    seconds)."""
    if context_parallel is None:
        return plan_options_from_args(args)
    return plan_options_from_args(args, cost="flops", context_parallel=context_parallel)


def run(args: argparse.Namespace) -> int:
    require_torch()
    from seqbalance.measure.launch import LaunchError

    source = load_lengths(args.lengths)
    context_parallel = context_parallel_from_args(args)
    options = _plan_options(args, context_parallel)
    time_model = (
        None
        if args.time_model is None
        else load_time_model(args.time_model, context_parallel=context_parallel is not None)
    )
    if context_parallel is not None and isinstance(time_model, TimeModel):
        raise ValueError(
            f"--time-model {args.time_model!r} holds a TimeModel; bench --context-parallel "
            "plans with the ContextParallelTimeModel that `seqbalance calibrate "
            "--context-parallel` writes"
        )
    settings, divisor, longest, what = _settings(
        args, source, options, context_parallel, time_model
    )
    if not options.allow_oversize:
        _warn_truncated(source.lengths, divisor, longest, what)
    quiet = args.json or args.markdown
    if not quiet:
        print(
            f"bench: {settings.procs} processes on cores {list(settings.cores)}, "
            f"{source.label} lengths / {divisor}, "
            f"{'calibration, ' if settings.time_model is None else ''}{settings.steps} steps "
            f"(+{settings.warmup} warm-up) x {len(settings.strategies)} strategies"
            f"{'' if settings.hf_model is None else ' x 2 models'} ...",
            flush=True,
        )
    with progress_callback("bench steps", enabled=not quiet) as bar:
        try:
            report = bench.run(settings, progress=bar)
        except ValueError as error:  # a strategy that cannot plan, before any process starts
            raise ValueError(flag_names(str(error), _FLAGS)) from None
        except LaunchError as error:
            print(f"seqbalance bench: error: {error}", file=sys.stderr)
            return 1
    report["setup"].update({"lengths": source.label, "length_divisor": divisor})
    if args.json:
        print_json(report)
    elif context_parallel is None:
        _print_report(report, markdown=args.markdown)
    else:
        _print_context_parallel_report(report, markdown=args.markdown)
    return 0


def _settings(
    args: argparse.Namespace,
    source: LengthsInput,
    options: PlanOptions,
    context_parallel: ContextParallel | None,
    time_model: TimeModel | ContextParallelTimeModel | None,
) -> tuple[bench.BenchSettings, int, int, str]:
    """The run's ``BenchSettings`` from the flags, the lengths scaled to the toy model.

    Returns ``(settings, divisor, longest, what)``: the settings, the length divisor, the
    longest sample kept (tokens) and the flags that set it (for the truncation warning).
    Errors name the flags.
    """
    try:
        if context_parallel is None:
            cap = longest = args.max_tokens
            what = f"--max-tokens = {cap}"
        else:
            cap = options.max_tokens
            largest = max(
                context_parallel.usable_sizes(check_int(args.procs, "procs", minimum=1)) or (1,)
            )
            longest = largest * cap
            what = f"the largest CP size ({largest}) x --max-tokens = {longest}"
        lengths, divisor = bench.scale_lengths(
            source.lengths,
            longest,
            divisor=bench.length_divisor(source.lengths, cap)
            if args.length_divisor is None
            else args.length_divisor,
            truncate=not options.allow_oversize,
        )
        settings = bench.BenchSettings(
            lengths=lengths,
            groups=source.groups,
            procs=args.procs,
            device=args.device,
            strategies=args.strategies,
            options=options,
            global_batch_size=args.global_batch,
            steps=args.steps,
            warmup=args.warmup,
            model_size=args.model_size,
            hf_model=args.hf_model,
            time_model=time_model,
            trials=args.trials,
            repeats=args.repeats,
            seed=args.seed,
            slow_rank=args.slow_rank,
            noise=args.noise,
            timeout=args.timeout,
            launch_timeout=args.launch_timeout,
        )
    except ValueError as error:
        raise ValueError(flag_names(str(error), _FLAGS)) from None
    return settings, divisor, longest, what


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


def _warn_truncated(lengths: Any, divisor: int, longest: int, what: str) -> None:
    """The visible count of samples the scaling cut to ``longest`` (``what`` names it)."""
    cut = int(np.count_nonzero(-(-np.asarray(lengths) // divisor) > longest))
    if cut:
        print(
            f"seqbalance bench: warning: {cut} of {len(lengths)} samples are longer than "
            f"{what} after dividing by {divisor}; they are truncated to it",
            file=sys.stderr,
        )


def _title(setup: dict[str, Any]) -> str:
    options = setup["options"]
    # the PlanOptions/1 document's key for microbatch_size
    layout = f"padded x{options['micro_batch_size']}, " if options["layout"] == "padded" else ""
    return (
        f"bench: {setup['procs']} procs, {setup['lengths']} lengths / {setup['length_divisor']}, "
        f"toy-{setup['model_size']}, global batch {setup['global_batch_size']}, "
        f"{layout}max_tokens {options['max_tokens']}, {setup['steps']} steps, "
        f"objective {options['objective']}"
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
        if "mean_step_ratio" in c:  # balanced_adaptive against balanced / balanced_oracle
            notes.append(
                f"{key.replace('_vs_', ' vs ')}: mean step time "
                f"{-100 * c['mean_step_reduction']:+.1f}% measured"
            )
            continue
        notes.append(
            f"{key.replace('_vs_', ' vs ')}: mean step time "
            f"{-100 * c['measured_step_time_reduction']:+.1f}% measured "
            f"(max-rank compute {-100 * c['measured_compute_reduction']:+.1f}%), "
            f"{-100 * c['predicted_reduction']:+.1f}% predicted by the simulator"
        )
    adaptive = report.get("adaptive")
    if adaptive is not None:
        mape = adaptive["model_mape_after_20_steps"]
        notes.append(
            "balanced_adaptive: plans identical on every rank: "
            f"{'yes' if adaptive['identical_plans_on_every_rank'] else 'NO'}; online model "
            f"MAPE from step 20: {'n/a' if mape is None else f'{100 * mape:.1f}%'}; learning "
            f"{1e3 * adaptive['mean_feedback_seconds']:.2f} ms per step"
        )
    return notes + _machine_notes(setup)


def _machine_notes(setup: dict[str, Any]) -> list[str]:
    """Warnings about the machine during the run, and the elapsed time."""
    notes = []
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
    print_section(
        _title(report["setup"]),
        COLUMNS,
        _rows(report),
        caption=CAPTION,
        notes=_notes(report),
        markdown=markdown,
    )


CP_COLUMNS = (
    "strategy",
    "mean step (ms)",
    "CPU step (ms)",
    "predicted (ms)",
    "measured / predicted",
    "CPU / predicted",
    "sharded samples",
    "slots",
)
CP_CAPTION = (
    "step: the slowest rank's wall time from its first slot to the end of its last (gradient "
    "all-reduce excluded); CPU step: every rank's per-slot CPU seconds through the plan's "
    "lockstep rule (each rank on a core of its own); predicted: the plan's expected step time "
    "under the ContextParallelTimeModel (refit on the warm-up steps when there are at least "
    f"{MIN_REFIT_WARMUP}), its slots varying by its slot jitter"
)


def _print_context_parallel_report(report: dict[str, Any], *, markdown: bool) -> None:
    setup = report["setup"]
    cp = setup["context_parallel"]
    for label, model in report["models"].items():
        title = (
            f"bench --context-parallel: {setup['procs']} procs, CP sizes {cp['sizes']}, "
            f"{setup['options']['max_tokens']} tokens per rank, {setup['lengths']} lengths / "
            f"{setup['length_divisor']}, {label}, global batch {setup['global_batch_size']}, "
            f"{setup['steps']} steps"
        )
        rows = [
            (
                name,
                f"{1e3 * s['mean_step_seconds']:.1f}",
                f"{1e3 * s['mean_cpu_step_seconds']:.1f}",
                f"{1e3 * s['predicted_mean_step_seconds']:.1f}",
                f"{s['measured_over_predicted']:.2f}",
                f"{s['cpu_over_predicted']:.2f}",
                f"{100 * s['sharded_fraction']:.0f}%",
                f"{s['mean_slots']:.1f}",
            )
            for name, s in model["strategies"].items()
        ]
        print_section(
            title,
            CP_COLUMNS,
            rows,
            caption=CP_CAPTION,
            notes=_context_parallel_notes(model) + _machine_notes(setup),
            markdown=markdown,
        )


def _context_parallel_notes(model: dict[str, Any]) -> list[str]:
    cost = model["time_model"]
    time, comm = cost["time"], cost["comm"]
    fit = time["fit_stats"]
    source = "calibrated" if model["calibrated"] else "given (--time-model)"
    if model["refit_steps"]:
        source += f", refit on the {model['refit_steps']} warm-up steps"
    notes = [
        f"{source}: t0 "
        f"{1e3 * time['t0']:.3f} ms, t1 {1e6 * time['t1']:.3f} us/token, t2 "
        f"{1e9 * time['t2']:.4f} ns/token², sharded attention x"
        f"{cost['sharded_attention_factor']:.2f}; K/V gather "
        f"{comm['bandwidth_bytes_per_s'] / 1e9:.3f} GB/s, {1e6 * comm['latency_s']:.0f} us per "
        f"ring step; {1e3 * cost['sample_overhead_s']:.2f} ms per sample and rank, "
        f"{1e3 * cost['piece_overhead_s']:.2f} ms more per sharded sample and member"
        + ("" if fit is None else f" (fit MAPE {100 * fit['mape']:.1f}%)")
        + f"; slot jitter {100 * cost.get('slot_jitter', 0.0):.1f}%"
    ]
    for key, c in model["comparisons"].items():
        notes.append(
            f"{key.replace('_vs_', ' vs ')}: mean step time "
            f"{-100 * c['predicted_reduction']:+.1f}% predicted "
            f"({-100 * c['noiseless_predicted_reduction']:+.1f}% without jitter), "
            f"{-100 * c['measured_cpu_reduction']:+.1f}% CPU step"
            f"{_off(c['cpu_prediction_relative_error'])}, "
            f"{-100 * c['measured_step_time_reduction']:+.1f}% wall"
            f"{_off(c['prediction_relative_error'])}"
        )
    notes.append(
        f"every strategy computed the same step losses (largest relative spread "
        f"{model['max_loss_spread']:.1e})"
    )
    return notes


def _off(error: float | None) -> str:
    """`` (x% off)``: how far the prediction is from a measured reduction, relative."""
    return "" if error is None else f" ({100 * error:.0f}% off)"

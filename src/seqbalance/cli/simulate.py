"""`seqbalance simulate`: what each strategy would cost on your lengths, model and cluster."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import warnings
from collections.abc import Sequence
from typing import Any

from seqbalance.cli._common import (
    CONTEXT_PARALLEL_FLAGS,
    STEP_FLAGS,
    add_context_parallel_arguments,
    add_json_flag,
    add_lengths_option,
    add_plan_option_arguments,
    add_strategies_option,
    add_time_model_arguments,
    context_parallel_from_args,
    cost_from_args,
    flag_names,
    load_lengths,
    plan_options_from_args,
    print_json,
    print_section,
    progress_callback,
    with_kv_sizes,
)
from seqbalance.plan import strategy_names
from seqbalance.plan.stacks import length_grouped_steps
from seqbalance.sim import (
    DEFAULT_MAX_TOKENS,
    TruncationWarning,
    default_strategies,
    plot,
    simulate,
)
from seqbalance.sim.result import default_baselines

_FLAGS = {
    **CONTEXT_PARALLEL_FLAGS,
    **STEP_FLAGS,
    "steps x global_batch_size": "--steps x --global-batch",  # "steps" alone is any word
    "steps must": "--steps must",
    "strategies": "--strategies",
}
"""The plan options' flags and those of simulate's own options, for errors."""
DEFAULT_GLOBAL_BATCH = 512
DEFAULT_STEPS = 20
HF_BASELINES = ("hf_default", "hf_length_grouped", "hf_batch_rebalance")
"""Baselines that pad every micro-batch, as the Hugging Face Trainer does."""
BATCH_REBALANCE = "hf_batch_rebalance"
"""Groups a step's samples freely (no per-micro-batch count): run with micro-batches of up to
the step's samples."""
HF_MICROBATCH_SIZE = 8
"""The Trainer's ``per_device_train_batch_size`` default."""
LENGTH_GROUPED = "hf_length_grouped"
"""Simulated on the steps of Hugging Face's own sampler, not on the shared random steps."""


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "simulate",
        help="predict step time per strategy on your lengths, model and cluster",
        description=(
            "Sample a stream of global batches from the lengths, plan every step with every "
            "strategy on identical data, and compare predicted step times, rank imbalance and "
            "distance to the lower bound. Samples longer than --max-tokens are truncated to it. "
            "With no arguments: bundled ShareGPT lengths, qwen3-8b, 8 ranks, H100 at 40% of "
            "peak."
        ),
    )
    add_lengths_option(parser)
    parser.add_argument("--dp", type=int, default=8, help="data-parallel ranks (default: 8)")
    parser.add_argument(
        "--global-batch",
        type=int,
        default=None,
        help=f"samples per optimizer step, rounded up to whole groups (default: "
        f"{DEFAULT_GLOBAL_BATCH}, or the whole dataset when it is smaller)",
    )
    parser.add_argument(
        "--steps",
        type=int,
        default=DEFAULT_STEPS,
        help=f"optimizer steps to simulate (default: {DEFAULT_STEPS})",
    )
    add_plan_option_arguments(parser, max_tokens_default=DEFAULT_MAX_TOKENS)
    add_strategies_option(
        parser,
        default_strategies(),
        context_parallel_default=default_strategies(context_parallel=True),
    )
    parser.add_argument(
        "--baseline",
        default=None,
        metavar="STRATEGY",
        help="what you run today, e.g. verl, slime, slime_flops, megatron_dp_balanced, "
        "torchspec, hf_default (Hugging Face Trainer), hf_length_grouped (its group_by_length), "
        "hf_batch_rebalance (its batch_rebalance): added to --strategies and named in the "
        "headline with the gain against it (see `seqbalance plan --help` for every strategy). "
        "Default: hf_default with --layout padded (the Trainer's padded micro-batches), none "
        "otherwise. The Hugging Face baselines pad: with them, a packed run becomes --layout "
        f"padded (--microbatch-size default {HF_MICROBATCH_SIZE}, the Trainer's "
        "per_device_train_batch_size; the step's samples for hf_batch_rebalance, whose groups "
        "vary, with --num-microbatches its gradient accumulation)",
    )
    parser.add_argument("--seed", type=int, default=0, help="batch sampling seed")
    add_time_model_arguments(parser)
    add_context_parallel_arguments(
        parser,
        "Shard samples longer than one rank's cap (--max-tokens: the tokens one rank holds in "
        "one slot) over context-parallel groups of the --dp ranks and compare balanced (CP "
        "sizes, placement and packing chosen jointly), static_cp and dynamic_cp_megatron on the "
        "same steps, in the same table (try --lengths long_context). --num-microbatches, "
        "--min-microbatches, --microbatch-multiple and --allow-empty apply to the slots (with "
        "dynamic_cp_megatron every strategy may leave slots empty); --time-model takes a "
        "TimeModel (K/V sizes from --model) or a ContextParallelTimeModel from `seqbalance "
        "calibrate --context-parallel`.",
    )
    parser.add_argument("--plot", metavar="OUT.png", help="also write a PNG of the result")
    add_json_flag(parser, markdown="the table")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    source = load_lengths(args.lengths)
    global_batch = _global_batch(args, source)
    context_parallel = context_parallel_from_args(args)
    if args.strategies is None:
        args.strategies = default_strategies(context_parallel=context_parallel is not None)
    if context_parallel is None:
        _baseline_setup(args, global_batch)
    cost, peak, efficiency, description = cost_from_args(
        args, context_parallel=context_parallel is not None
    )
    if context_parallel is not None:
        cost = with_kv_sizes(cost, args)
    options = plan_options_from_args(args, cost=cost, context_parallel=context_parallel)
    requested = _with_baseline(args.strategies, args.baseline, context_parallel is not None)
    # hf_length_grouped runs on its own steps, after the others; with context parallelism it is
    # no strategy (left in, the planner names it rather than its stand-in hf_default).
    length_grouped = LENGTH_GROUPED in requested and context_parallel is None
    if length_grouped and source.groups is None:
        # Checked after the whole simulation, it refused a step size minutes later.
        _check_length_grouped_step(global_batch, args.dp, options.microbatch_size)
    with (
        progress_callback("planning steps", enabled=not (args.json or args.markdown)) as callback,
        warnings.catch_warnings(record=True) as caught,
    ):
        warnings.simplefilter("always", TruncationWarning)
        try:
            result = simulate(
                source.lengths,
                options,
                groups=source.groups,
                dp_size=args.dp,
                global_batch_size=global_batch,
                steps=args.steps,
                peak_flops_per_s=peak,
                efficiency=efficiency,
                # Alone, a plain run of hf_default gives hf_length_grouped the steps' size and
                # count.
                strategies=(
                    [name for name in requested if name != LENGTH_GROUPED] or ["hf_default"]
                    if length_grouped
                    else requested
                ),
                seed=args.seed,
                progress=callback,
            )
            if length_grouped:
                result = _with_length_grouped(result, source, options, args, peak, efficiency)
        except ValueError as error:
            raise ValueError(flag_names(str(error), _FLAGS)) from None
    for warning in {str(w.message): w for w in caught}.values():  # each message once
        if isinstance(warning.message, TruncationWarning):
            print(
                f"seqbalance simulate: warning: {flag_names(str(warning.message))}", file=sys.stderr
            )
    if args.plot:
        plot(result, args.plot)
    payload = result.to_dict()
    # Its reason names the library's keywords ("pass allow_empty=True"), as the failures do.
    payload["headline"] = flag_names(result.headline(args.baseline))
    payload["setup"]["lengths"] = source.label
    time_model_source = description or result.time_model_source
    payload["setup"]["time_model_source"] = time_model_source
    if args.json:
        print_json(payload)
        return 0
    _print_report(
        result, source.label, time_model_source, markdown=args.markdown, baseline=args.baseline
    )
    if args.plot:
        print(f"plot written to {args.plot}")
    return 0


def _global_batch(args: argparse.Namespace, source: Any) -> int:
    """``--global-batch``, by default ``DEFAULT_GLOBAL_BATCH`` samples or the whole dataset
    when it is smaller."""
    if args.global_batch is None:
        return min(DEFAULT_GLOBAL_BATCH, source.lengths.size)
    return args.global_batch


def _baseline_setup(args: argparse.Namespace, global_batch: int) -> None:
    """Name the baseline that matches what the user runs (padded micro-batches of a fixed sample
    count are the Hugging Face Trainer's default), and run the padded baselines padded (said on
    stderr, never silently): micro-batches of the Trainer's default size, or of up to the step's
    samples for ``hf_batch_rebalance`` as the baseline."""
    if args.baseline is None and args.layout == "padded":
        args.baseline = "hf_default"
    requested = _with_baseline(args.strategies, args.baseline)
    padded = next((name for name in requested if name in HF_BASELINES), None)
    if args.baseline in HF_BASELINES:
        padded = args.baseline
    if padded is not None and args.layout == "packed":
        args.layout = "padded"
        if args.microbatch_size is None:
            free = padded == BATCH_REBALANCE
            args.microbatch_size = global_batch if free else HF_MICROBATCH_SIZE
        print(
            f"seqbalance simulate: note: {padded} pads every micro-batch, as the Hugging "
            f"Face Trainer does: every strategy is simulated with --layout padded "
            f"--microbatch-size {args.microbatch_size}",
            file=sys.stderr,
        )


def _check_length_grouped_step(size: int, dp: int, microbatch_size: int) -> None:
    """Refuse a step of ``size`` samples that Hugging Face's Trainer cannot make: a whole
    number of ``microbatch_size`` samples per rank and accumulation step."""
    per_step = dp * microbatch_size
    if size % per_step:
        raise ValueError(
            f"{LENGTH_GROUPED}: --global-batch ({size}) must be a multiple of --dp x "
            f"--microbatch-size ({per_step}): a Hugging Face step is per_device_train_batch_size "
            "x gradient_accumulation_steps x world_size samples"
        )


def _with_length_grouped(
    result: Any, source: Any, options: Any, args: argparse.Namespace, peak: float, efficiency: float
) -> Any:
    """``result`` plus ``hf_length_grouped``, simulated as the Trainer runs it: its sampler
    (``LengthGroupedSampler``) decides which samples share a step, so its steps are those of
    ``length_grouped_steps`` (as many, of the same size, as the other strategies'), each dealt
    as Accelerate deals the sampler's batches (``hf_default``'s dealing). Its steps hold other
    samples than the random ones (the first steps of each mega-batch its longest), so every
    strategy's speedups are recomputed per unit of work: seconds per second of sample cost, the
    ratio of epoch times (mean step times would credit the lighter steps)."""
    if source.groups is not None:
        result.failed[LENGTH_GROUPED] = "groups are not supported: HF's sampler ignores them"
        return result
    size = int(result.batches[0].size)
    steps = length_grouped_steps(
        result.lengths,
        microbatch_size=options.microbatch_size,
        gradient_accumulation_steps=size // (args.dp * options.microbatch_size),
        world_size=args.dp,
        steps=result.steps,
        seed=args.seed,
    )
    grouped = simulate(
        result.lengths,
        options,
        dp_size=args.dp,
        peak_flops_per_s=peak,
        efficiency=efficiency,
        strategies=["hf_default"],
        batches=steps,
    )
    if not (args.json or args.markdown):
        print(
            f"seqbalance simulate: note: {LENGTH_GROUPED} runs on the steps its own sampler "
            "makes (LengthGroupedSampler: samples of similar length share a step); the other "
            "strategies on random steps of the same size; gains are per unit of work",
            file=sys.stderr,
        )
    stats = dataclasses.replace(grouped.strategies["hf_default"], strategy=LENGTH_GROUPED)
    merged = {**result.strategies, LENGTH_GROUPED: stats}
    order = [n for n in _with_baseline(args.strategies, args.baseline) if n in merged]
    plans = {**result.plans, LENGTH_GROUPED: grouped.plans["hf_default"]}
    plans = {name: plans[name] for name in order}
    per_work = {}
    for name in order:
        work = sum(float(plan.sample_costs.sum()) for plan in plans[name])
        total = merged[name].total_seconds
        per_work[name] = total / work if work > 0 else total
    strategies = {
        name: dataclasses.replace(
            merged[name],
            speedups={
                other: per_work[other] / per_work[name] if per_work[name] > 0 else 1.0
                for other in per_work
            },
        )
        for name in order
    }
    return dataclasses.replace(result, strategies=strategies, plans=plans)


def _with_baseline(
    strategies: Sequence[str], baseline: str | None, context_parallel: bool = False
) -> list[str]:
    if baseline is None:
        return list(strategies)
    names = strategy_names(context_parallel=context_parallel)
    if baseline not in names:
        raise ValueError(f"--baseline must be one of {', '.join(names)}, got {baseline!r}")
    return list(strategies) if baseline in strategies else [baseline, *strategies]


def _speedup(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


COLUMNS = (
    "strategy",
    "step time (s)",
    "vs lower bound",
    "imbalance",
    "padding",
    "cap violations",
    "micro-batches",
    "plan ms mean/max",
)
DEFAULT_VERSUS = ("round_robin", "token_kk")
"""Speedup columns shown unless --baseline names another strategy (with --context-parallel:
``default_baselines``, static_cp and dynamic_cp_megatron)."""


def _print_report(
    result: Any, label: str, time_model_source: str, *, markdown: bool, baseline: str | None
) -> None:
    context_parallel = result.options.context_parallel
    default_versus = (
        DEFAULT_VERSUS if context_parallel is None else default_baselines(result.options)
    )
    versus = (
        (*default_versus, baseline)
        if baseline is not None and baseline not in default_versus
        else default_versus
    )
    sharded = () if context_parallel is None else ("sharded",)
    columns = (*COLUMNS, *sharded, *(f"vs {name}" for name in versus))
    rows = [
        (
            name,
            f"{stats.mean_step_seconds:.3f}",
            f"{stats.ratio:.3f}",
            f"{stats.imbalance:.3f}",
            f"{stats.padding_tokens}",
            f"{stats.cap_violations}",
            f"{stats.mean_microbatches:.1f}",
            f"{stats.planning_ms_mean:.1f} / {stats.planning_ms_max:.1f}",
            *(() if context_parallel is None else (f"{100 * stats.sharded_fraction:.1f}%",)),
            *(_speedup(stats.speedups.get(other)) for other in versus),
        )
        for name, stats in result.strategies.items()
    ]
    rows += [(name, "cannot plan", *["-"] * (len(columns) - 2)) for name in result.failed]
    samples = sum(int(batch.size) for batch in result.batches)
    truncated = f", {result.truncated} truncated to the cap" if result.truncated else ""
    title = (
        f"{label}: {result.model}, dp {result.dp_size}, {result.steps} steps of "
        f"~{samples // result.steps} samples, max_tokens {result.max_tokens}, "
        f"objective {result.objective}"
        + (
            ""
            if result.options.rank_speeds is None
            else ", rank speeds " + ",".join(f"{x:g}" for x in result.options.rank_speeds)
        )
        + (
            ""
            if context_parallel is None
            else f", CP sizes {list(context_parallel.sizes)} (max_tokens per rank and slot)"
        )
    )
    caption = f"time model: {time_model_source}; dataset: {result.lengths.size} samples{truncated}"
    print_section(title, columns, rows, caption=caption, markdown=markdown)
    if markdown:
        for name, message in result.failed.items():
            print(f"- {name} cannot plan these steps: {flag_names(message)}\n")
        print(f"**{flag_names(result.headline(baseline))}**")
        return
    for name, message in result.failed.items():
        print(f"{name} cannot plan these steps: {flag_names(message)}")
    print(flag_names(result.headline(baseline)))

"""The bench harness: length scaling, settings, the report's arithmetic, and a real run."""

from __future__ import annotations

import json

import numpy as np
import pytest
from _bench_run import hand_made_raw

from seqbalance.cost import TimeModel
from seqbalance.cost.context_parallel import CommModel, ContextParallelTimeModel
from seqbalance.measure.bench import (
    BenchSettings,
    length_divisor,
    plan_context_parallel_steps,
    plan_schedule,
    run,
    scale_lengths,
    summarize,
    summarize_context_parallel,
)
from seqbalance.plan import ContextParallel, PlanOptions


def settings(**changes) -> BenchSettings:
    values = {
        "procs": 2,
        "device": "cpu",
        "cores": (0,),
        "lengths": [10, 20],
        "groups": None,
        "strategies": ("round_robin", "balanced"),
        "options": PlanOptions(max_tokens=64),
        "global_batch_size": 2,
        "steps": 2,
        "warmup": 1,
        "model_size": "tiny",
        "time_model": None,
        "trials": 6,
        "repeats": 1,
        "seed": 0,
        "timeout": 60.0,
    }
    return BenchSettings(**{**values, **changes})


def test_length_divisor_brings_the_median_to_a_quarter_of_the_cap() -> None:
    assert length_divisor(np.array([1699, 1700, 1698]), 2048) == 4  # 1699 / 512 -> 4
    assert length_divisor(np.array([400, 424, 500]), 2048) == 1
    assert length_divisor(np.array([513]), 2048) == 2


def test_scale_lengths_divides_rounding_up_and_cuts_at_the_cap() -> None:
    scaled, divisor = scale_lengths([1, 7, 8, 9, 1000], 64, divisor=4)
    assert divisor == 4 and scaled.tolist() == [1, 2, 2, 3, 64]
    scaled, divisor = scale_lengths([1699, 1700, 1698], 2048)
    assert divisor == 4 and scaled.tolist() == [425, 425, 425]
    scaled, _ = scale_lengths([1, 7, 8, 9, 1000], 64, divisor=4, truncate=False)
    assert scaled.tolist() == [1, 2, 2, 3, 250]
    with pytest.raises(ValueError, match="length_divisor must be >= 1, got 0"):
        scale_lengths([1], 64, divisor=0)


def test_settings_are_validated_and_described() -> None:
    s = settings(lengths=np.array([3, 4]), groups=[7, 7], strategies=["balanced"])
    assert s.lengths == (3, 4) and s.groups == (7, 7) and s.strategies == ("balanced",)
    described = s.describe()
    assert "lengths" not in described and "time_model" not in described
    assert described["procs"] == 2 and described["cores"] == (0,)
    assert described["launch_timeout"] == 3600.0
    assert described["context_parallel"] is None
    options = PlanOptions(max_tokens=64).to_dict()
    assert described["options"] == {
        k: v for k, v in options.items() if k not in ("cost", "model", "strategy")
    }
    default = BenchSettings(lengths=[5])
    assert default.cores  # default: the cores this process may use
    assert default.strategies == ("round_robin", "token_kk", "balanced")
    assert default.options == PlanOptions(max_tokens=4096) and default.max_position == 4096
    oversize = settings(lengths=[100, 3], options=PlanOptions(max_tokens=64, allow_oversize=True))
    assert oversize.max_position == 100
    for bad, message in (
        ({"procs": 0}, "procs must be >= 1"),
        ({"device": "tpu"}, "device must be one of"),
        ({"lengths": []}, "lengths must hold at least one sample"),
        ({"groups": [1]}, "groups must hold one id per sample"),
        ({"strategies": "balanced"}, "strategies must be a non-empty sequence"),
        ({"trials": 3}, "trials must be >= 4"),
        ({"options": PlanOptions(max_tokens=7)}, "max_tokens must be >= 8"),
        ({"options": PlanOptions()}, "max_tokens must be set"),
        ({"options": {"max_tokens": 64}}, "options must be a PlanOptions"),
        ({"options": PlanOptions(max_tokens=64, cost="flops")}, "options.cost must be left"),
        ({"options": PlanOptions(max_tokens=64, strategy="token_kk")}, "options.strategy"),
        ({"lengths": [65]}, "above max_tokens = 64"),
        ({"model_size": "huge"}, "model_size must be one of"),
        ({"time_model": "tm.json"}, "time_model must be a TimeModel"),
        ({"timeout": 0}, "timeout must be a positive"),
        ({"cores": ()}, "cores must name at least one"),
    ):
        with pytest.raises(ValueError, match=message):
            settings(**bad)


def cp_options(cp: object, **changes: object) -> PlanOptions:
    """Context-parallel plan options of a bench run ("flops" stands for the run's model), 64
    tokens per rank and slot unless ``changes`` say otherwise."""
    return PlanOptions(**{"cost": "flops", "max_tokens": 64, "context_parallel": cp, **changes})


def test_context_parallel_settings_are_validated_and_described() -> None:
    cp = ContextParallel(sizes=(1, 2))
    s = settings(options=cp_options(cp), lengths=[10, 128], strategies=None)
    assert s.strategies == ("balanced", "static_cp", "dynamic_cp_megatron")
    assert s.max_position == 128 and s.describe()["context_parallel"] == cp.to_dict()
    assert s.context_parallel == cp
    cost = ContextParallelTimeModel(TimeModel(0.0, 1.0, 0.0), CommModel(), 8, 1)
    assert settings(options=cp_options(cp), time_model=cost, strategies=None).time_model == cost
    options = s.context_parallel_options(cost)
    assert options.context_parallel == cp and options.cost == cost
    assert options.max_tokens == 64  # the per-rank cap
    with pytest.raises(ValueError, match="these settings have no context_parallel"):
        settings().context_parallel_options(cost)
    for bad, message in (
        ({"lengths": [129]}, "above the largest CP size usable on 2 processes \\(2\\)"),
        ({"procs": 3, "options": cp_options(ContextParallel(sizes=(2,)))}, "none divides"),
        ({"options": cp_options(cp, cost=cost)}, "options.cost must be left at 'flops'"),
        ({"options": cp_options(ContextParallel(comm=CommModel()))}, "comm must be None"),
        ({"device": "cuda"}, "device 'cuda' is not supported with context_parallel"),
        ({"strategies": ("token_kk",)}, "strategies entry \\(with context_parallel\\)"),
        ({"time_model": TimeModel(0.0, 1.0, 0.0)}, "ContextParallelTimeModel or None"),
        ({"hf_model": "gemma-3-27b"}, "'gemma-3-27b' has layers the context-parallel"),
        ({"hf_model": "qwen9"}, "unknown preset 'qwen9'"),
        # adv13d D5: the processes' calibration made no whole-sample plan, silently.
        ({"procs": 8, "trials": 4}, "trials must be >= procs .*got trials = 4 with procs = 8"),
    ):
        with pytest.raises(ValueError, match=message):
            settings(**{"options": cp_options(cp), "strategies": None, **bad})
    # A given time model is not calibrated: any trials.
    given = {"time_model": cost, "procs": 8, "trials": 4, "strategies": None}
    assert settings(options=cp_options(cp), **given).trials == 4
    hf = settings(options=cp_options(cp), strategies=None, hf_model="qwen3-8b")
    assert hf.describe()["hf_model"] == "qwen3-8b"
    with pytest.raises(ValueError, match="hf_model is measured with context_parallel only"):
        settings(hf_model="qwen3-8b")
    # What PlanOptions refuses with context_parallel, it refuses for bench too.
    for bad, message in (
        ({"max_tokens": None}, "context_parallel needs the per-rank token cap"),
        ({"layout": "padded", "microbatch_size": 2}, "layout = 'padded'"),
        ({"objective": "lockstep"}, "objective = 'lockstep' is not"),
        ({"context_parallel": (1, 2)}, "context_parallel must be a ContextParallel"),
        ({"cost": "tokens"}, "cost must be"),
    ):
        with pytest.raises(ValueError, match=message):
            cp_options(cp, **bad)


def test_plan_schedule_gives_each_rank_its_microbatch_lengths() -> None:
    s = settings(lengths=[30, 20, 10, 5], global_batch_size=4, steps=1, warmup=0)
    schedule, simulation = plan_schedule(s, TimeModel(0.0, 1.0, 0.0))
    assert list(schedule) == ["round_robin", "balanced"]
    for name, steps in schedule.items():
        assert len(steps) == 1 and len(steps[0]) == 2  # one step, two ranks
        lengths = sorted(x for rank in steps[0] for mb in rank for x in mb)
        assert lengths == [5, 10, 20, 30], name
        assert all(sum(mb) <= 64 for rank in steps[0] for mb in rank)
    assert [sum(map(sum, rank)) for rank in schedule["balanced"][0]] in ([35, 30], [30, 35])
    assert simulation.dp_size == 2


def test_summary_arithmetic_on_hand_made_records() -> None:
    raw = hand_made_raw()
    report = summarize(raw, settings())
    rr, balanced = report["strategies"]["round_robin"], report["strategies"]["balanced"]
    assert rr["mean_step_seconds"] == pytest.approx(0.12)
    assert rr["median_step_seconds"] == pytest.approx(0.12)
    assert rr["median_imbalance"] == pytest.approx((0.10 / 0.08 + 0.12 / 0.09) / 2)
    assert balanced["mean_imbalance"] == pytest.approx((1.0 + 0.10 / 0.095) / 2)
    assert rr["predicted_mean_step_seconds"] == pytest.approx(0.11)
    assert rr["microbatches"] == 4
    # Predictions are exact except balanced rank 1 step 1: 0.09 predicted, 0.10 measured.
    assert rr["microbatch_mape"] == pytest.approx(0.0, abs=1e-12)
    assert balanced["microbatch_mape"] == pytest.approx(0.1 / 4)
    assert report["microbatch_mape"] == pytest.approx(0.1 / 8)
    comparison = report["comparisons"]["balanced_vs_round_robin"]
    assert comparison["measured_step_time_reduction"] == pytest.approx(1 - 0.095 / 0.12)
    assert comparison["predicted_reduction"] == pytest.approx(1 - 0.085 / 0.11)
    assert comparison["measured_compute_reduction"] == pytest.approx(1 - 0.09 / 0.11)
    relative = abs((1 - 0.085 / 0.11) - (1 - 0.095 / 0.12)) / (1 - 0.095 / 0.12)
    assert comparison["prediction_relative_error"] == pytest.approx(relative)
    assert "balanced_vs_token_kk" not in report["comparisons"]
    assert report["setup"] == settings().describe()


@pytest.mark.multiprocess
def test_a_real_run_reports_progress_and_every_strategy() -> None:
    pytest.importorskip("torch")
    model = TimeModel(0.001, 2e-6, 1e-9)
    rng = np.random.default_rng(1)
    s = settings(
        lengths=rng.integers(8, 120, size=64),
        global_batch_size=8,
        options=PlanOptions(max_tokens=256),
        steps=2,
        warmup=1,
        time_model=model,
        cores=None,
        launch_timeout=300.0,
    )
    seen: list[tuple[int, int]] = []
    report = run(s, progress=lambda done, total: seen.append((done, total)))
    assert seen and all(total == 3 and 1 <= done <= 3 for done, total in seen)
    assert [done for done, _ in seen] == sorted(done for done, _ in seen)
    assert list(report["strategies"]) == ["round_robin", "balanced"]
    for stats in report["strategies"].values():
        assert len(stats["step_seconds"]) == 2 and stats["microbatches"] >= 4
    assert report["calibration"] is None
    assert TimeModel.from_json(json.dumps(report["time_model"])) == model
    setup = report["setup"]
    assert setup["oversubscribed"] == (len(setup["cores"]) < 2)
    assert setup["elapsed_seconds"] > 0


def _cp_record(step: int, slot: float, sync: float, loss: float) -> dict:
    return {"step": step, "slot_seconds": slot, "sync_seconds": sync, "loss": loss}


def test_context_parallel_summary_arithmetic_on_hand_made_records() -> None:
    cp = ContextParallel(sizes=(1, 2))
    s = settings(options=cp_options(cp), strategies=("balanced", "static_cp"))
    records = [
        {
            "balanced": [_cp_record(0, 0.08, 0.01, 2.0), _cp_record(1, 0.10, 0.01, 3.0)],
            "static_cp": [_cp_record(0, 0.10, 0.01, 2.0002), _cp_record(1, 0.12, 0.02, 3.0)],
        },
        {
            "balanced": [_cp_record(0, 0.09, 0.02, 2.0), _cp_record(1, 0.09, 0.01, 3.0)],
            "static_cp": [_cp_record(0, 0.11, 0.01, 2.0002), _cp_record(1, 0.12, 0.01, 3.0)],
        },
    ]
    described = {
        "time_model": {"placeholder": True},
        "calibrated": True,
        "refit_steps": 4,
        "calibrated_time_model": {"before": True},
        "plans": {
            "balanced": {
                "predicted_seconds": [0.08, 0.10],
                "noiseless_predicted_seconds": [0.07, 0.09],
                "cpu_seconds": [0.07, 0.09],
                "sharded_fraction": [0.1, 0.2],
                "slots": [3, 4],
            },
            "static_cp": {
                "predicted_seconds": [0.10, 0.12],
                "noiseless_predicted_seconds": [0.10, 0.10],
                "cpu_seconds": [0.10, 0.10],
                "sharded_fraction": [1.0, 1.0],
                "slots": [2, 2],
            },
        },
    }
    raw = {
        "records": [{"toy-small": r, "hf-qwen3-8b": r} for r in records],
        "models": {"toy-small": described, "hf-qwen3-8b": {**described, "calibrated": False}},
    }
    report = summarize_context_parallel(raw, s)
    assert report["setup"] == s.describe() and list(report["models"]) == list(raw["models"])
    assert not report["models"]["hf-qwen3-8b"]["calibrated"]
    assert report["models"]["toy-small"]["refit_steps"] == 4
    assert report["models"]["toy-small"]["calibrated_time_model"] == {"before": True}
    toy = report["models"]["toy-small"]
    balanced, static = toy["strategies"]["balanced"], toy["strategies"]["static_cp"]
    # The slowest rank's slots per step: balanced [0.09, 0.10], static_cp [0.11, 0.12].
    assert balanced["step_seconds"] == [0.09, 0.10] and static["step_seconds"] == [0.11, 0.12]
    assert balanced["mean_step_seconds"] == pytest.approx(0.095)
    assert balanced["median_step_seconds"] == pytest.approx(0.095)
    assert balanced["mean_step_with_sync_seconds"] == pytest.approx(0.11)  # 0.09+0.02, 0.10+0.01
    assert balanced["predicted_mean_step_seconds"] == pytest.approx(0.09)
    assert balanced["noiseless_predicted_mean_step_seconds"] == pytest.approx(0.08)
    assert balanced["measured_over_predicted"] == pytest.approx(0.095 / 0.09)
    assert balanced["mean_cpu_step_seconds"] == pytest.approx(0.08)
    assert balanced["cpu_over_predicted"] == pytest.approx(0.08 / 0.09)
    assert balanced["cpu_step_seconds"] == [0.07, 0.09]
    assert balanced["sharded_fraction"] == pytest.approx(0.15) and balanced["mean_slots"] == 3.5
    assert toy["max_loss_spread"] == pytest.approx(0.0002 / 2.0001)
    comparison = toy["comparisons"]["balanced_vs_static_cp"]
    measured, predicted, cpu = 1 - 0.095 / 0.115, 1 - 0.09 / 0.11, 1 - 0.08 / 0.10
    assert comparison["measured_step_time_reduction"] == pytest.approx(measured)
    assert comparison["measured_cpu_reduction"] == pytest.approx(cpu)
    assert comparison["predicted_reduction"] == pytest.approx(predicted)
    # The planner's noiseless steps, reported beside the jitter-aware prediction.
    assert comparison["noiseless_predicted_reduction"] == pytest.approx(1 - 0.08 / 0.10)
    assert comparison["prediction_relative_error"] == pytest.approx(
        abs(predicted - measured) / measured
    )
    assert comparison["cpu_prediction_relative_error"] == pytest.approx(abs(predicted - cpu) / cpu)
    assert "balanced_vs_dynamic_cp_megatron" not in toy["comparisons"]
    assert toy["calibrated"]
    # Steps without a labelled token (samples of 1 token): loss 0 everywhere, no spread, and a
    # report strict JSON takes (adv19d M6: NaN).
    for rank in records:
        for rows in rank.values():
            for row in rows:
                row["loss"] = 0.0
    report = summarize_context_parallel(raw, s)
    assert report["models"]["toy-small"]["max_loss_spread"] == 0.0
    json.dumps(report, allow_nan=False)


def test_context_parallel_steps_plan_every_strategy_with_one_static_size() -> None:
    cp = ContextParallel(sizes=(1, 2))
    lengths = [3, 9, 20, 120, 30, 5, 7, 60, 11, 2, 40, 8]
    s = settings(
        options=cp_options(cp, num_microbatches=6, allow_empty=True),
        strategies=None,
        lengths=lengths,
        global_batch_size=6,
        steps=3,
        warmup=1,
    )
    cost = ContextParallelTimeModel(TimeModel(1e-3, 1e-5, 1e-8), CommModel(1e9, 1e-5), 16, 2)
    comparison = plan_context_parallel_steps(s, cost)
    assert comparison.options.context_parallel.static_size == 2  # the dataset's 120: CP 2
    assert list(comparison.plans) == ["balanced", "static_cp", "dynamic_cp_megatron"]
    again = plan_context_parallel_steps(s, cost)
    for name, plans in comparison.plans.items():
        assert len(plans) == 4  # warm-up + measured steps
        assert all(plan.n_slots == 6 for plan in plans), name  # --num-microbatches honoured
        assert [p.fingerprint() for p in plans] == [p.fingerprint() for p in again.plans[name]]
    # static_cp shards every sample at size 2, also in steps without a long sample.
    assert all((plan.cp_size == 2).all() for plan in comparison.plans["static_cp"])
    # Every step plans the same samples with every strategy.
    for step in range(4):
        firsts = {name: plans[step].lengths.tolist() for name, plans in comparison.plans.items()}
        assert len({tuple(v) for v in firsts.values()}) == 1


def test_settings_round_trip_through_pickle_and_their_description() -> None:
    import pickle

    options = PlanOptions(
        max_tokens=96,
        layout="padded",
        microbatch_size=3,
        num_microbatches=4,
        min_microbatches=2,
        microbatch_multiple=2,
        objective="lockstep",
        order="descending",
        allow_oversize=True,
        allow_empty=True,
    )
    s = settings(options=options, lengths=[10, 200], time_model=TimeModel(0.0, 1.0, 0.0))
    # What the processes receive (launch pickles the settings) is the same request.
    again = pickle.loads(pickle.dumps(s))
    assert again == s and again.options.fingerprint() == options.fingerprint()
    # The report's description rebuilds the same plan options.
    assert PlanOptions.from_dict(s.describe()["options"]) == options
    cp = ContextParallel(sizes=(1, 2), static_size=2)
    s = settings(options=cp_options(cp, allow_empty=True), strategies=None)
    again = pickle.loads(pickle.dumps(s))
    assert again == s and again.context_parallel == cp
    described = s.describe()
    assert ContextParallel.from_dict(described["context_parallel"]) == cp
    rebuilt = {**described["options"], "context_parallel": described["context_parallel"]}
    assert PlanOptions.from_dict({**rebuilt, "cost": "flops"}) == s.options
    assert json.loads(json.dumps(described)) == json.loads(json.dumps(again.describe()))

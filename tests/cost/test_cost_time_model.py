"""TimeModel: predictions, from_flops, exact NNLS fit, statistics and JSON round trips."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from seqbalance.cost import FitStats, FlopsModel, ModelSpec, TimeModel
from seqbalance.cost.time_model import nnls


def test_predictions_by_hand() -> None:
    model = TimeModel(0.5, 0.01, 0.001)
    assert model.per_sample([10, 20]).tolist() == pytest.approx([0.1 + 0.1, 0.2 + 0.4])
    assert model.microbatch_seconds([10, 20]) == pytest.approx(0.5 + 0.8)
    assert model.microbatch_overhead == 0.5
    assert model.microbatch_seconds([]) == 0.5


def test_tile_rounds_only_the_quadratic_term() -> None:
    model = TimeModel(0.0, 1.0, 1.0, tile=128)
    assert model.quadratic_term([0, 1, 128, 129]).tolist() == [0.0, 128.0**2, 128.0**2, 256.0**2]
    assert model.per_sample([129]).tolist() == [129 + 256.0**2]


def test_from_flops_matches_flops_model() -> None:
    flops = FlopsModel(ModelSpec.preset("qwen3-8b"))
    peak, efficiency = 989e12, 0.4
    model = TimeModel.from_flops(flops, peak, efficiency)
    lengths = [1, 100, 4096, 32768]
    assert model.t0 == 0.0
    assert model.per_sample(lengths) == pytest.approx(
        flops.per_sample(lengths) / (peak * efficiency), rel=1e-12
    )
    forward_only = TimeModel.from_flops(flops, peak, efficiency, backward=False)
    assert forward_only.per_sample(lengths) == pytest.approx(model.per_sample(lengths) / 3)
    recompute = TimeModel.from_flops(FlopsModel(flops.spec, recompute=True), peak, efficiency)
    assert recompute.t1 == pytest.approx(model.t1 * 4 / 3)
    full = FlopsModel(flops.spec, attention="full")
    assert TimeModel.from_flops(full, peak, 1.0).per_sample(lengths) == pytest.approx(
        full.per_sample(lengths) / peak, rel=1e-12
    )


def test_from_flops_rejects_non_polynomial_costs() -> None:
    spec = ModelSpec(
        hidden_size=8,
        num_layers=1,
        num_attention_heads=2,
        vocab_size=10,
        intermediate_size=16,
        sliding_window=4,
    )
    with pytest.raises(ValueError, match="sliding-window layers"):
        TimeModel.from_flops(FlopsModel(spec), 1e12, 0.5)
    dense = ModelSpec(
        hidden_size=8, num_layers=1, num_attention_heads=2, vocab_size=10, intermediate_size=16
    )
    with pytest.raises(ValueError, match="extra_per_sample"):
        TimeModel.from_flops(FlopsModel(dense, extra_per_sample=np.ones_like), 1e12, 0.5)
    with pytest.raises(ValueError, match="efficiency must be in"):
        TimeModel.from_flops(FlopsModel(dense), 1e12, 1.5)
    with pytest.raises(ValueError, match="peak_flops_per_s must be a positive finite number"):
        TimeModel.from_flops(FlopsModel(dense), -1.0, 0.5)


def _synthetic(truth: TimeModel, n: int, noise: float, seed: int) -> list:
    rng = np.random.default_rng(seed)
    observations = []
    for _ in range(n):
        lengths = rng.integers(1, 16384, size=rng.integers(1, 9))
        seconds = truth.microbatch_seconds(lengths) * (1 + noise * rng.standard_normal())
        observations.append((lengths, seconds))
    return observations


def test_fit_recovers_known_coefficients_from_noisy_observations() -> None:
    truth = TimeModel(3e-3, 2e-6, 4e-11)
    fitted = TimeModel.fit(_synthetic(truth, 400, noise=0.02, seed=7))
    assert fitted.t0 == pytest.approx(truth.t0, rel=0.15)
    assert fitted.t1 == pytest.approx(truth.t1, rel=0.05)
    assert fitted.t2 == pytest.approx(truth.t2, rel=0.05)
    stats = fitted.fit_stats
    assert stats is not None and stats.n_observations == 400
    assert 0.01 < stats.mape < 0.03  # 2% Gaussian noise: mean |error| ≈ 0.8 · 2%
    assert stats.r2 > 0.99


def test_fit_is_exact_without_noise_and_with_tiles() -> None:
    truth = TimeModel(1e-3, 5e-6, 2e-10, tile=128)
    fitted = TimeModel.fit(_synthetic(truth, 50, noise=0.0, seed=1), tile=128)
    assert (fitted.t0, fitted.t1, fitted.t2) == pytest.approx((truth.t0, truth.t1, truth.t2))
    assert fitted.tile == 128
    assert fitted.fit_stats is not None
    assert fitted.fit_stats.mape < 1e-9 and fitted.fit_stats.r2 == pytest.approx(1.0)


def _wide_range(truth: TimeModel, n: int, noise: float, seed: int) -> list:
    """Micro-batches of 1..64 samples up to 16..23k tokens (3 ms .. ~1.6 s for the truth below),
    with multiplicative log-normal noise of ``noise`` (0.05 ≈ 5%)."""
    rng = np.random.default_rng(seed)
    observations = []
    for _ in range(n):
        longest = int(2 ** rng.uniform(4, 14.5))
        lengths = rng.integers(1, longest + 1, size=rng.integers(1, 65))
        seconds = truth.microbatch_seconds(lengths) * float(np.exp(noise * rng.standard_normal()))
        observations.append((lengths, seconds))
    return observations


@pytest.mark.parametrize("seed", range(5))
def test_relative_fit_lowers_mape_on_a_wide_range_of_sizes(seed: int) -> None:
    truth = TimeModel(3e-3, 2e-6, 4e-11)
    observations = _wide_range(truth, 400, noise=0.05, seed=seed)
    absolute = TimeModel.fit(observations)
    relative = TimeModel.fit(observations, relative=True)
    assert absolute.fit_stats is not None and relative.fit_stats is not None
    assert relative.fit_stats.mape < absolute.fit_stats.mape
    assert relative.fit_stats.mape < 0.045  # 5% log-normal noise: mean |error| ≈ 0.8 · 5%
    assert relative.fit_stats.n_observations == 400
    assert relative.fit_stats.r2 > 0.99
    assert relative.t0 == pytest.approx(truth.t0, rel=0.05)
    assert relative.t1 == pytest.approx(truth.t1, rel=0.05)
    assert relative.t2 == pytest.approx(truth.t2, rel=0.15)


@pytest.mark.parametrize("relative", [False, True])
def test_fit_recovers_exact_data_exactly_either_way(relative: bool) -> None:
    truth = TimeModel(3e-3, 2e-6, 4e-11, tile=64)
    exact = [
        (lengths, truth.microbatch_seconds(lengths))
        for lengths, _ in _wide_range(truth, 60, 0.0, 3)
    ]
    fitted = TimeModel.fit(exact, tile=64, relative=relative)
    assert (fitted.t0, fitted.t1, fitted.t2) == pytest.approx(
        (truth.t0, truth.t1, truth.t2), rel=1e-9
    )
    assert fitted.fit_stats is not None and fitted.fit_stats.mape < 1e-9


def test_fit_rejects_a_non_bool_relative() -> None:
    with pytest.raises(ValueError, match="relative must be True or False, got 1"):
        TimeModel.fit([([1], 1.0), ([2], 2.0), ([3], 3.0)], relative=1)  # type: ignore[arg-type]


def test_fit_clamps_at_zero() -> None:
    # Seconds that shrink with the token count: the unconstrained fit has t1 < 0.
    observations = [([1000], 1.0), ([2000], 0.9), ([3000], 0.8), ([4000], 0.7)]
    fitted = TimeModel.fit(observations)
    assert fitted.t1 == 0.0 and fitted.t2 == 0.0
    assert fitted.t0 == pytest.approx(0.85)  # the best constant is the mean


@given(
    st.lists(
        st.tuples(st.integers(0, 10_000), st.integers(0, 10**8), st.floats(-10, 10)),
        min_size=3,
        max_size=12,
    )
)
def test_nnls_satisfies_the_optimality_conditions(rows) -> None:
    features = np.array([[1.0, a, b] for a, b, _ in rows])
    target = np.array([t for *_, t in rows])
    solution = nnls(features, target)
    assert np.all(solution >= 0)
    # KKT for min |Ax - y|² s.t. x >= 0: gradient A^T(Ax - y) is 0 where x > 0 and >= 0 where
    # x == 0. Tolerances are relative to each column's norm (the columns span 1 .. 1e9).
    gradient = features.T @ (features @ solution - target)
    scale = np.linalg.norm(features, axis=0) * (np.linalg.norm(target) + 1.0)
    tolerance = 1e-7 * np.where(scale > 0, scale, 1.0)
    active = solution > 0
    assert np.all(np.abs(gradient[active]) <= tolerance[active])
    assert np.all(gradient[~active] >= -tolerance[~active])


@pytest.mark.parametrize(
    ("observations", "message"),
    [
        ([], "at least 3"),
        ([([1], 1.0)] * 2, "at least 3"),
        (
            [([1], 1.0), ([2], -1.0), ([3], 1.0)],
            r"observations\[1\] seconds must be a positive finite number, got -1.0",
        ),
        ([([1], 1.0), ([2], float("nan")), ([3], 1.0)], r"observations\[1\] seconds .* got nan"),
        (
            [([1], 1.0), ([2], 1.0), ([3], 1.0, 2)],
            r"observations\[2\] must be a \(lengths, seconds\)",
        ),
        ([([1], 1.0), ([-2], 1.0), ([3], 1.0)], r"observations\[1\] lengths\[0\] = -2 is negative"),
        ([([1], 1.0), ([[2]], 1.0), ([3], 1.0)], r"observations\[1\] lengths must be a 1-D array"),
        (
            [([1], 1.0), ([2], "1"), ([3], 1.0)],
            r"observations\[1\] seconds must be a positive number, got '1'",
        ),
        ("abc", "must be a sequence of"),
    ],
)
def test_fit_rejects_bad_observations(observations, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TimeModel.fit(observations)


def test_constructor_validation() -> None:
    with pytest.raises(ValueError, match="t1 must be a non-negative finite number, got -1"):
        TimeModel(0.0, -1, 0.0)
    with pytest.raises(ValueError, match="t2 must be a non-negative finite number, got inf"):
        TimeModel(0.0, 0.0, float("inf"))
    with pytest.raises(ValueError, match="t0 must be a non-negative number, got '1'"):
        TimeModel("1", 0.0, 0.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="tile must be >= 1, got 0"):
        TimeModel(0.0, 0.0, 0.0, tile=0)
    with pytest.raises(ValueError, match=r"lengths\[0\] = -1 is negative"):
        TimeModel(0.0, 1.0, 0.0).per_sample([-1])


def test_json_round_trip(tmp_path) -> None:
    model = TimeModel(1e-3, 2e-6, 3e-11, tile=64, fit_stats=FitStats(0.02, 0.995, 17))
    again = TimeModel.from_json(model.to_json())
    assert again == model and again.fit_stats == model.fit_stats
    path = tmp_path / "time_model.json"
    model.save(path)
    assert TimeModel.load(path) == model and TimeModel.load(path).fit_stats == model.fit_stats
    plain = TimeModel(0.0, 1.0, 2.0)
    assert TimeModel.from_json(plain.to_json()).fit_stats is None


def test_json_rejects_other_formats() -> None:
    with pytest.raises(ValueError, match="not valid JSON"):
        TimeModel.from_json("{")
    with pytest.raises(ValueError, match=r"format 'seqbalance\.TimeModel'"):
        TimeModel.from_json('{"t0": 0, "t1": 0, "t2": 0}')
    with pytest.raises(ValueError, match="version 99 is not supported"):
        TimeModel.from_json('{"format": "seqbalance.TimeModel", "version": 99}')
    with pytest.raises(ValueError, match="missing or has a bad field"):
        TimeModel.from_json('{"format": "seqbalance.TimeModel", "version": 1, "t0": 0}')


def test_from_flops_rejects_chunked_and_cross_attention() -> None:
    base = {"hidden_size": 8, "num_layers": 2, "num_attention_heads": 2, "vocab_size": 10}
    chunked = ModelSpec(
        **base,
        intermediate_size=16,
        layer_types=("chunked_attention", "full_attention"),
        attention_chunk_size=4,
    )
    with pytest.raises(ValueError, match="chunked-attention layers, whose cost is not"):
        TimeModel.from_flops(FlopsModel(chunked), 1e12, 0.5)
    cross = ModelSpec(**base, intermediate_size=16, cross_attention_layers=(0,))
    with pytest.raises(ValueError, match="cross-attention layers, whose cost is not"):
        TimeModel.from_flops(FlopsModel(cross), 1e12, 0.5)


def test_score_by_hand() -> None:
    model = TimeModel(0.0, 1.0, 0.0)  # one second per token
    # Predictions 1, 2, 3 s against measurements 1, 4, 2 s: relative errors 0, 1/2, 1/2.
    stats = model.score([([1], 1.0), ([2], 4.0), ([3], 2.0)])
    assert stats.n_observations == 3
    assert stats.mape == pytest.approx(1 / 3)
    # Residual 0 + 4 + 1 = 5; spread around the mean 7/3 is 14/3: R² = 1 - 15/14 < 0.
    assert stats.r2 == pytest.approx(-1 / 14)
    assert model.score([([2, 3], 5.0), ([4], 4.0)]) == FitStats(0.0, 1.0, 2)


def test_score_without_spread_and_bad_input() -> None:
    model = TimeModel(1.0, 0.0, 0.0)
    assert model.score([([7], 1.0)]) == FitStats(0.0, 1.0, 1)
    assert model.score([([7], 2.0), ([9], 2.0)]) == FitStats(0.5, 0.0, 2)
    with pytest.raises(ValueError, match=r"at least 1 .* to score, got 0"):
        model.score([])
    with pytest.raises(ValueError, match=r"observations\[0\] seconds"):
        model.score([([1], 0.0)])


def test_fit_records_its_score() -> None:
    observations = _wide_range(TimeModel(3e-3, 2e-6, 4e-11), 40, noise=0.05, seed=0)
    fitted = TimeModel.fit(observations, relative=True)
    assert fitted.fit_stats == fitted.score(observations)


# Seconds an online fit can see: ordinary, subnormal, tiny, huge, and repeated values.
_DEGENERATE_SECONDS = st.one_of(
    st.floats(1e-6, 10.0),
    st.floats(5e-324, 2.2e-308),  # subnormal
    st.sampled_from([5e-324, 1e-310, 1e-300, 1e-30, 1.0, 1e30, 1e300, 1.7e308]),
)
_DEGENERATE_LENGTHS = st.one_of(
    st.lists(st.integers(0, 2**20), min_size=0, max_size=4),
    st.sampled_from([[], [0], [1], [2**26], [2**26, 2**26]]),
)


@given(
    st.lists(st.tuples(_DEGENERATE_LENGTHS, _DEGENERATE_SECONDS), min_size=1, max_size=8),
    st.booleans(),
    st.booleans(),
    st.booleans(),
)
def test_fit_on_degenerate_observations_is_a_model_or_a_value_error(
    observations, relative: bool, repeat: bool, tiled: bool
) -> None:
    import warnings

    if repeat:  # identical observations: nothing tells the coefficients apart
        observations = [observations[0]] * max(3, len(observations))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a numpy warning fails the test
        try:
            model = TimeModel.fit(observations, relative=relative, tile=128 if tiled else None)
        except ValueError as error:
            message = str(error)
            assert "at least 3" in message or "range" in message, message
            return
    coefficients = np.array([model.t0, model.t1, model.t2])
    assert np.isfinite(coefficients).all() and (coefficients >= 0).all()
    assert model.fit_stats is not None and model.fit_stats.n_observations == len(observations)
    seconds = np.array([s for _, s in observations])
    if np.ptp(seconds) == 0 and len(set(map(tuple, (o[0] for o in observations)))) == 1:
        # The documented fallback: identical micro-batches give t0 alone, exactly their time.
        assert model.t1 == model.t2 == 0.0
        assert model.t0 == pytest.approx(seconds[0], rel=1e-12)


@pytest.mark.parametrize("relative", [False, True])
@pytest.mark.parametrize("unit", [1e-310, 1e-300, 1e-9, 1.0, 1e300])
def test_fit_recovers_coefficients_at_any_scale(relative: bool, unit: float) -> None:
    lengths = [[100], [200, 50], [300], [1000, 10, 10], [4096]]
    truth = TimeModel(2 * unit, 1e-3 * unit, 1e-7 * unit)
    observations = [(ls, truth.microbatch_seconds(ls)) for ls in lengths]
    model = TimeModel.fit(observations, relative=relative)
    if unit < 1e-300:  # subnormal seconds keep ~10 significant bits
        assert model.fit_stats.mape < 1e-2
        return
    got = (model.t0, model.t1, model.t2)
    assert got == pytest.approx((truth.t0, truth.t1, truth.t2), rel=1e-6)


def test_fit_refuses_seconds_too_far_apart_for_a_relative_fit() -> None:
    observations = [([100], 1e-310), ([200], 1.0), ([300], 3.0)]
    with pytest.raises(ValueError, match=r"span too wide a range.*relative=False"):
        TimeModel.fit(observations, relative=True)
    assert TimeModel.fit(observations).fit_stats.r2 > 0.9  # the absolute fit is fine


def test_fit_on_identical_or_collinear_observations_keeps_t0_alone() -> None:
    for observations in (
        [([100], 1.0)] * 3,
        [([100], 1.0), ([100, 0], 1.0), ([50, 50], 1.0)],
        [([], 0.5)] * 4,
    ):
        model = TimeModel.fit(observations)
        assert (model.t1, model.t2) == (0.0, 0.0)
        assert model.t0 == pytest.approx(observations[0][1], rel=1e-12)

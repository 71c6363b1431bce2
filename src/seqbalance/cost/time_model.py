"""TimeModel: predicted seconds of one micro-batch, from FLOPs or fitted to measurements.

    seconds(micro-batch) = t0 + t1 · Σ L_i + t2 · Σ q(L_i),   q(L) = ceil(L / tile)² · tile²

``t0`` is a fixed cost per micro-batch (kernel launches, optimizer hooks, communication that does
not scale with tokens), ``t1`` seconds per token, ``t2`` seconds per token² of each sample's own
attention. ``q(L) = L²`` without ``tile``; with ``tile`` (attention kernels work in blocks, e.g.
128 tokens on H100) L is rounded up to a multiple of ``tile`` in the quadratic term only. ``q``
uses ``L²`` (not the causal pair count), matching ``FlopsModel.coefficients``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from itertools import combinations
from pathlib import Path
from typing import Any

import numpy as np

from seqbalance._validation import (
    MAX_TOKENS_LIMIT,
    as_lengths,
    check_bool,
    check_flops_rate,
    check_int,
    check_non_negative_float,
    check_positive_float,
    token_total,
)
from seqbalance.cost.flops import FlopsModel

__all__ = ["FitStats", "TimeModel", "nnls", "read_model_file"]

_FORMAT = "seqbalance.TimeModel"
_FORMAT_VERSION = 1


@dataclass(frozen=True)
class FitStats:
    """How well a TimeModel predicts a set of measured micro-batches (see :meth:`TimeModel.score`).

    Attributes:
        mape: Mean absolute percentage error, as a fraction (0.05 = 5%).
        r2: Coefficient of determination of the measured seconds.
        n_observations: Number of micro-batches scored.
    """

    mape: float
    r2: float
    n_observations: int

    @classmethod
    def of(cls, predicted: np.ndarray, seconds: np.ndarray) -> FitStats:
        """The statistics of ``predicted`` against the measured positive ``seconds``."""
        with np.errstate(all="ignore"):  # huge predictions give inf statistics, not warnings
            mape = float(np.mean(np.abs(predicted - seconds) / seconds))
            # r2 is unit-free: computed in units of the slowest micro-batch, the squares of
            # subnormal or huge seconds neither underflow nor overflow.
            unit = float(seconds.max())
            measured, predicted = seconds / unit, predicted / unit
            residual = float(np.sum((measured - predicted) ** 2))
            spread = float(np.sum((measured - measured.mean()) ** 2))
        if spread > 0:
            r2 = 1.0 - residual / spread
        else:
            r2 = 1.0 if np.allclose(predicted, measured) else 0.0
        return cls(mape=mape, r2=float(r2), n_observations=int(seconds.size))


def _fit_stats(stats: Any) -> FitStats:
    """``fit_stats`` of TimeModel JSON, read strictly: ``float()`` / ``int()`` took ``"0.05"``
    and ``true`` as numbers and cut ``n_observations: 2.7`` to 2, and a list or a missing key
    was refused naming no field ("list indices must be integers or slices, not str")."""
    if not isinstance(stats, dict):
        raise ValueError(f"TimeModel JSON fit_stats must be an object, got {stats!r:.60}")
    values = {}
    for name in ("mape", "r2", "n_observations"):
        if name not in stats:
            raise ValueError(f"TimeModel JSON fit_stats.{name} is missing")
        value = stats[name]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"TimeModel JSON fit_stats.{name} must be a number, got {value!r:.60}")
        values[name] = value
    count = values["n_observations"]
    if (isinstance(count, float) and not count.is_integer()) or count < 0:
        raise ValueError(
            f"TimeModel JSON fit_stats.n_observations must be a whole count, got {count!r}"
        )
    return FitStats(mape=float(values["mape"]), r2=float(values["r2"]), n_observations=int(count))


@dataclass(frozen=True)
class TimeModel:
    """Seconds of a micro-batch: ``t0 + t1·ΣL + t2·Σq(L)`` (see the module docstring).

    Satisfies the planner's cost protocol: :meth:`per_sample` (seconds per sample without the
    fixed cost) and :attr:`microbatch_overhead` (``t0``).
    """

    t0: float
    t1: float
    t2: float
    tile: int | None = field(default=None, kw_only=True)
    fit_stats: FitStats | None = field(default=None, kw_only=True, compare=False)

    def __post_init__(self) -> None:
        for name in ("t0", "t1", "t2"):
            object.__setattr__(self, name, check_non_negative_float(getattr(self, name), name))
        if self.tile is not None:
            object.__setattr__(self, "tile", check_int(self.tile, "tile", minimum=1))
        if self.fit_stats is not None and not isinstance(self.fit_stats, FitStats):
            raise ValueError(f"fit_stats must be a FitStats or None, got {self.fit_stats!r}")

    # --- predictions -------------------------------------------------------------------------

    @property
    def microbatch_overhead(self) -> float:
        """Seconds every micro-batch costs regardless of its samples (``t0``)."""
        return self.t0

    def quadratic_term(self, lengths: Any) -> np.ndarray:
        """``q(L)`` per sample (float64, tokens²): ``L²`` with L rounded up to ``tile``."""
        length = as_lengths(lengths).astype(np.float64)
        if self.tile is not None:
            length = np.ceil(length / self.tile) * self.tile
        return length * length

    def per_sample(self, lengths: Any) -> np.ndarray:
        """Seconds per sample (float64) without the per-micro-batch ``t0``: ``t1·L + t2·q(L)``."""
        length = as_lengths(lengths)
        # Absurd coefficients (a fit in another unit) overflow to inf, which the planner's cost
        # check names; numpy's warning would only add lines to that error.
        with np.errstate(over="ignore"):
            return self.t1 * length.astype(np.float64) + self.t2 * self.quadratic_term(length)

    def microbatch_seconds(self, lengths: Any) -> float:
        """Seconds of one micro-batch of samples of ``lengths`` tokens: ``t0 + Σ per_sample``."""
        return self.t0 + float(self.per_sample(lengths).sum())

    # --- construction ------------------------------------------------------------------------

    @classmethod
    def from_flops(
        cls,
        flops_model: FlopsModel,
        peak_flops_per_s: float,
        efficiency: float,
        *,
        backward: bool = True,
        tile: int | None = None,
    ) -> TimeModel:
        """Seconds from FLOPs: training (or forward) FLOPs / (peak_flops_per_s · efficiency).

        ``t0 = 0``; ``(t1, t2)`` are ``flops_model.coefficients`` (already the polynomial in L and
        L², the causal pair count folded in) times the training multiplier, divided by the
        achieved FLOP/s. Models whose cost is not such a polynomial
        (``flops_model.non_polynomial_terms``: sliding-window, chunked or cross-attention layers,
        an ``extra_per_sample`` term) raise ValueError.
        """
        if not isinstance(flops_model, FlopsModel):
            raise ValueError(f"flops_model must be a FlopsModel, got {type(flops_model).__name__}")
        peak, eff = check_flops_rate(peak_flops_per_s, efficiency)
        if flops_model.non_polynomial_terms:
            raise ValueError(
                f"flops_model has {' and '.join(flops_model.non_polynomial_terms)}, whose cost is "
                "not t1·L + t2·L²; fit a TimeModel to measurements instead"
            )
        linear, quadratic = flops_model.coefficients
        multiplier = flops_model.training_multiplier if backward else 1
        rate = peak * eff
        t1, t2 = linear * multiplier / rate, quadratic * multiplier / rate
        if not math.isfinite(t1 + t2):  # the TimeModel would name t1, which no caller gave
            raise ValueError(
                f"peak_flops_per_s x efficiency = {rate!r} FLOP/s is too small: the model's "
                f"seconds overflow (t1 = {t1!r} s per token)"
            )
        return cls(0.0, t1, t2, tile=tile)

    @classmethod
    def fit(
        cls,
        observations: Sequence[tuple[Any, float]],
        *,
        tile: int | None = None,
        relative: bool = False,
    ) -> TimeModel:
        """Fit ``t0, t1, t2 >= 0`` to measured micro-batches by non-negative least squares.

        ``observations`` is a sequence of ``(lengths of one micro-batch, seconds)`` pairs; at
        least 3 are needed. By default minimises the squared error in seconds,
        ``Σ (predicted_i − seconds_i)²``, over the features ``[1, ΣL, Σq(L)]``. With
        ``relative=True`` it minimises the squared relative error ``Σ ((predicted_i −
        seconds_i) / seconds_i)²`` instead (each row and target divided by its seconds), so
        small micro-batches weigh as much as large ones: use it when the figure that matters is
        the error per micro-batch in percent (MAPE), as in ``seqbalance calibrate``, and the
        measurements span a wide range of sizes. Either way the 3-variable problem is solved
        exactly (every support of the coefficients is solved and the best non-negative solution
        kept), and noise-free observations are recovered exactly.

        Degenerate observations (the online fit sees whatever a window of steps measured):
        seconds are fitted in units of the largest one, so subnormal (1e-310 s) or huge
        (1e300 s) values fit as well as ordinary ones. When the observations cannot tell the
        coefficients apart (identical or collinear micro-batches, all of one size, all empty),
        the fit falls back to the fewest coefficients that fit as well as any (checked in the
        order ``t0``, ``t1``, ``t2``): identical micro-batches give ``t0`` alone.

        The result carries ``fit_stats``: :meth:`score` on the same observations (the same
        unweighted statistics for both objectives).

        Raises:
            ValueError: fewer than 3 observations, malformed ones, a seconds value that is not
                a positive finite number (NaN, inf, 0, negative), or measurements whose
                coefficients cannot be represented: a ``relative=True`` fit of seconds that
                span more than float64 can weigh, or coefficients that overflow float64.
        """
        relative = check_bool(relative, "relative")
        template = cls(0.0, 0.0, 0.0, tile=tile)
        features, seconds = _observation_matrix(
            observations, template, minimum=3, purpose="to fit 3 coefficients"
        )
        unit = float(seconds.max())  # the fit runs in units of the slowest micro-batch
        target = seconds / unit
        span = f"seconds from {float(seconds.min())!r} to {unit!r}"
        with np.errstate(all="ignore"):  # overflow is detected below, not warned about
            weights = 1.0 / target if relative else np.ones_like(target)
            weighted = features * weights[:, None]
            if not (np.isfinite(weighted).all() and np.isfinite(weights).all()):
                raise ValueError(
                    f"observations: {span} span too wide a range to weigh each micro-batch by "
                    "1 / seconds (relative=True); fit with relative=False"
                )
            try:
                coefficients = nnls(weighted, target * weights) * unit
            except np.linalg.LinAlgError as error:
                raise ValueError(f"observations ({span}) cannot be fitted: {error}") from None
        if not np.isfinite(coefficients).all():
            raise ValueError(f"observations: {span} give coefficients beyond float64's range")
        t0, t1, t2 = (float(c) for c in coefficients)
        model = cls(t0, t1, t2, tile=template.tile)
        return replace(model, fit_stats=model.score(observations))

    @classmethod
    def fit_normal_equations(cls, gram: Any, moment: Any, *, tile: int | None = None) -> TimeModel:
        """The :meth:`fit` solution from sufficient statistics instead of the observations.

        For rows ``x_i = w_i·[1, ΣL, Σq(L)]`` and targets ``y_i = w_i·seconds_i`` (``w_i`` any
        per-observation weight, e.g. ``1/seconds_i`` for a relative fit), ``gram = Σ x_i x_iᵀ``
        (3x3) and ``moment = Σ x_i y_i`` (3) determine the least-squares objective up to a
        constant, so sums of them over ranks or steps fit the union of their observations. The
        non-negative solution is found by the same exact support enumeration as :meth:`fit`,
        on a square-root factor of ``gram`` (columns scaled to unit diagonal first). No
        ``fit_stats`` are attached (the observations are not available).

        Raises:
            ValueError: ``gram`` is not a finite symmetric 3x3 matrix, or ``moment`` not 3
                finite numbers.
        """
        gram = np.asarray(gram, dtype=np.float64)
        moment = np.asarray(moment, dtype=np.float64)
        if gram.shape != (3, 3) or not np.all(np.isfinite(gram)):
            raise ValueError(f"gram must be a finite 3x3 matrix, got {gram!r}")
        if not np.allclose(gram, gram.T):
            raise ValueError(f"gram must be symmetric, got {gram!r}")
        if moment.shape != (3,) or not np.all(np.isfinite(moment)):
            raise ValueError(f"moment must be 3 finite numbers, got {moment!r}")
        diagonal = np.sqrt(np.maximum(np.diag(gram), 0.0))
        scale = np.where(diagonal > 0, diagonal, 1.0)
        eigenvalues, vectors = np.linalg.eigh(gram / np.outer(scale, scale))
        # A factor R with RᵀR = gram (in scaled columns) and a target t with Rᵀt = moment: then
        # ||R x − t||² is the least-squares objective up to a constant. Null directions (no
        # observation spans them) carry no information and are dropped.
        keep = eigenvalues > eigenvalues.max(initial=0.0) * 1e-12
        root = np.sqrt(eigenvalues[keep])
        factor = root[:, None] * vectors[:, keep].T
        target = (vectors[:, keep].T @ (moment / scale)) / root
        coefficients = nnls(factor, target) / scale if keep.any() else np.zeros(3)
        return cls(*(float(c) for c in coefficients), tile=tile)

    # --- evaluation --------------------------------------------------------------------------

    def score(self, observations: Sequence[tuple[Any, float]]) -> FitStats:
        """How well this model predicts measured micro-batches: MAPE and R².

        The one definition of the fit statistics: :meth:`fit` records it for its own
        observations, ``seqbalance.measure.calibrate`` for held-out micro-batches and
        ``seqbalance.measure.bench`` for every micro-batch trained.

        With ``p_i = microbatch_seconds(lengths_i)`` the prediction and ``s_i`` the measured
        seconds of observation ``i`` (all ``n`` observations given, each weighted equally):

        - ``mape = (1/n) Σ |p_i − s_i| / s_i``, a fraction (0.05 = 5%);
        - ``r2 = 1 − Σ (s_i − p_i)² / Σ (s_i − mean(s))²``, the squared errors in seconds and
          unweighted (also after a ``relative=True`` fit): 1.0 for exact predictions, negative
          for predictions worse than the mean. When the measurements have no spread (one
          observation, or all equal) the ratio is undefined: ``r2`` is then 1.0 if every
          prediction equals its measurement (``numpy.allclose``) and 0.0 otherwise.

        Args:
            observations: ``(lengths of one micro-batch in tokens, measured seconds)`` pairs;
                at least one, every seconds value positive.

        Returns:
            The statistics, with ``n_observations = n``.

        Raises:
            ValueError: ``observations`` is empty or malformed, or a seconds value is not a
                positive finite number.
        """
        features, seconds = _observation_matrix(observations, self, minimum=1, purpose="to score")
        with np.errstate(all="ignore"):  # huge predictions give inf statistics, not warnings
            predicted = features @ np.array([self.t0, self.t1, self.t2])
        return FitStats.of(predicted, seconds)

    # --- serialisation -----------------------------------------------------------------------

    def to_json(self) -> str:
        """JSON text with the format name and version, coefficients, tile and fit statistics."""
        stats = self.fit_stats
        return json.dumps(
            {
                "format": _FORMAT,
                "version": _FORMAT_VERSION,
                "t0": self.t0,
                "t1": self.t1,
                "t2": self.t2,
                "tile": self.tile,
                "fit_stats": None
                if stats is None
                else {"mape": stats.mape, "r2": stats.r2, "n_observations": stats.n_observations},
            },
            indent=2,
        )

    @classmethod
    def from_json(cls, text: str) -> TimeModel:
        """Inverse of :meth:`to_json`; rejects other formats and unknown versions."""
        try:
            data = json.loads(text)
        except (TypeError, ValueError, RecursionError) as error:
            raise ValueError(f"TimeModel JSON is not valid JSON: {error}") from None
        if not isinstance(data, dict) or data.get("format") != _FORMAT:
            raise ValueError(f"TimeModel JSON must be an object with format {_FORMAT!r}")
        if data.get("version") != _FORMAT_VERSION:
            raise ValueError(
                f"TimeModel JSON version {data.get('version')!r} is not supported "
                f"(this seqbalance reads version {_FORMAT_VERSION})"
            )
        stats = data.get("fit_stats")
        fit_stats = None if stats is None else _fit_stats(stats)
        try:
            return cls(
                data["t0"], data["t1"], data["t2"], tile=data.get("tile"), fit_stats=fit_stats
            )
        except (KeyError, TypeError, ValueError, OverflowError) as error:
            raise ValueError(f"TimeModel JSON is missing or has a bad field: {error}") from None

    def save(self, path: str | Path) -> None:
        """Write :meth:`to_json` to ``path``."""
        Path(path).write_text(self.to_json() + "\n", encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> TimeModel:
        """Read a model written by :meth:`save`.

        Raises:
            FileNotFoundError: no file at ``path`` (the message names it).
            ValueError: the file is not a TimeModel written by :meth:`save`.
        """
        return cls.from_json(read_model_file(path, "TimeModel"))


def read_model_file(path: str | Path, what: str) -> str:
    """The text of the model file ``path`` (``what`` names the model in errors).

    Raises:
        FileNotFoundError: no file at ``path`` (the message names it).
        ValueError: the file is not UTF-8 text.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} file not found: {str(path)!r}")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"{what} file {str(path)!r} is not text: {error}") from None


def _observation_matrix(
    observations: Sequence[tuple[Any, float]], template: TimeModel, *, minimum: int, purpose: str
) -> tuple[np.ndarray, np.ndarray]:
    """Features ``[1, ΣL, Σq(L)]`` per micro-batch (q from ``template``) and measured seconds."""
    if isinstance(observations, (str, bytes)) or not isinstance(observations, Sequence):
        raise ValueError(
            "observations must be a sequence of (lengths, seconds) pairs, "
            f"got {type(observations).__name__}"
        )
    if len(observations) < minimum:
        raise ValueError(
            f"observations must hold at least {minimum} (lengths, seconds) pair(s) {purpose}, "
            f"got {len(observations)}"
        )
    rows = np.empty((len(observations), 3), dtype=np.float64)
    seconds = np.empty(len(observations), dtype=np.float64)
    for i, observation in enumerate(observations):
        if not isinstance(observation, (tuple, list)) or len(observation) != 2:
            raise ValueError(
                f"observations[{i}] must be a (lengths, seconds) pair, got {observation!r}"
            )
        lengths, value = observation
        length = as_lengths(lengths, f"observations[{i}] lengths")
        total = token_total(length)
        if total > MAX_TOKENS_LIMIT:
            raise ValueError(
                f"observations[{i}] lengths sum to {total:,} tokens, more than 2**53: such "
                "sums cannot be represented exactly"
            )
        seconds[i] = check_positive_float(value, f"observations[{i}] seconds")
        rows[i] = (1.0, float(length.sum()), float(template.quadratic_term(length).sum()))
    return rows, seconds


def nnls(features: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Exact non-negative least squares for a handful of columns by enumerating supports.

    The optimum's support S has x_S equal to the unconstrained least-squares solution on the
    columns in S, so the best feasible (all >= 0) support solution is the global optimum.
    Columns are scaled to unit norm first so ΣL² (~1e9) and 1 are solved with equal accuracy.
    """
    n_columns = features.shape[1]
    norms = np.linalg.norm(features, axis=0)
    scale = np.where(norms > 0, norms, 1.0)
    scaled = features / scale
    best = np.zeros(n_columns)
    best_residual = float(np.sum(target**2))
    # A larger support must fit better by more than rounding to win: observations that cannot
    # tell the coefficients apart keep the fewest (the fallback documented in TimeModel.fit).
    tolerance = 1e-24 * best_residual
    for size in range(1, n_columns + 1):
        for support in combinations(range(n_columns), size):
            columns = list(support)
            solution, *_ = np.linalg.lstsq(scaled[:, columns], target, rcond=None)
            if np.any(solution < 0):
                continue
            candidate = np.zeros(n_columns)
            candidate[columns] = solution
            residual = float(np.sum((target - scaled @ candidate) ** 2))
            if residual < best_residual - tolerance:
                best, best_residual = candidate, residual
    return best / scale

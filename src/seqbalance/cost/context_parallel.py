"""Cost of a sample sharded over a context-parallel (CP) group, per member.

A sample of ``L`` tokens sharded over ``cp`` ranks is cut into chunks of consecutive tokens:

* ``"head_tail"`` (the load-balanced causal split of Megatron-LM / Transformer Engine): ``2·cp``
  chunks; member ``s`` holds chunk ``s`` and chunk ``2·cp − 1 − s``. Early chunks have few keys
  to attend to and late chunks many, so pairing them evens out the causal work. When ``L`` is
  not a multiple of ``2·cp`` the first ``L mod 2·cp`` chunks hold one token more.
* ``"contiguous"``: ``cp`` chunks, member ``s`` holds chunk ``s`` (the naive split, for
  comparison: the last member does most of the attention work).

Every token belongs to exactly one chunk. A member's largest share is ``ceil(L / cp)`` tokens
for both schemes. Its attention work is exact: query ``q`` (0-based, causal) attends to
``q + 1`` keys (``min(q + 1, w)`` in a sliding-window layer of window ``w``), so a chunk
``[a, b)`` costs ``f(b) − f(a)`` query–key pairs, with ``f(x)`` the causal pair count of a
sequence of ``x`` tokens (:func:`seqbalance.cost.attention_pairs`). The members' shares add up
to the whole sample's FLOPs exactly.

Communication (all-gather of K/V, or the equivalent ring): in each layer every member receives
the K/V of the tokens it does not hold, in the forward pass (all-gather) and again in the
backward pass (reduce-scatter of the K/V gradients), ``passes`` times in all. A collective over
``cp`` ranks takes ``cp − 1`` ring steps, each paying a fixed latency. :class:`CommModel` holds
the two constants (bandwidth, latency) and :class:`ContextParallelTimeModel` combines them with a
:class:`~seqbalance.cost.TimeModel` for the computation.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, overload

import numpy as np

from seqbalance._validation import (
    MAX_TOKENS_LIMIT,
    as_lengths,
    check_int,
    check_non_negative_float,
    check_positive_float,
)
from seqbalance.cost._shards import (
    SCHEMES,
    kv_elements_per_token,
    kv_layers,
    shard_chunks,
    shard_flops,
    shard_pairs,
    shard_tokens,
)
from seqbalance.cost.flops import FlopsModel
from seqbalance.cost.lookup import flops_model
from seqbalance.cost.spec import ModelSpec
from seqbalance.cost.time_model import FitStats, TimeModel, nnls, read_model_file
from seqbalance.defaults import DEFAULT_EFFICIENCY, DEFAULT_PEAK_FLOPS_PER_S

__all__ = [
    "MAX_SLOT_JITTER",
    "SCHEMES",
    "CommModel",
    "ContextParallelTimeModel",
    "check_slot_jitter",
    "context_parallel_cost",
    "cost_description",
    "cost_from_description",
    "kv_elements_per_token",
    "kv_layers",
    "load_time_model_file",
    "shard_chunks",
    "shard_flops",
    "shard_pairs",
    "shard_tokens",
]

_COMM_FORMAT = "seqbalance.CommModel"
_CP_TIME_FORMAT = "seqbalance.ContextParallelTimeModel"
_FORMAT_VERSION = 1
_DESCRIPTION_TAG = "ContextParallelTimeModel"  # a cost= value in PlanOptions JSON


# ------------------------------------------------------------------ communication
@dataclass(frozen=True)
class CommModel:
    """Seconds of the CP collectives: ``latency_s`` per ring step + bytes / bandwidth.

    Attributes:
        bandwidth_bytes_per_s: bytes per second one member receives during a collective (the
            bus bandwidth of nccl-tests, not the algorithm bandwidth). Default 200e9, a
            conservative figure for all-gathers of a few MiB over NVLink within an 8-GPU H100
            node; across nodes use the network's per-GPU figure (25e9-50e9 for 200-400 Gb/s).
        latency_s: fixed seconds per ring step of one collective (launch + synchronisation).
            Default 20e-6.
        bytes_per_element: bytes of one K/V element as communicated (2 for bf16).
        passes: collectives per layer and CP group per micro-batch: 2 (forward all-gather and
            backward reduce-scatter); 3 with activation recomputation (the forward runs twice).

    Both constants are hardware figures: :meth:`fit` recovers them from measured collectives,
    which is what ``seqbalance calibrate`` must do for CP (see :meth:`fit`).
    """

    bandwidth_bytes_per_s: float = 200e9
    latency_s: float = 20e-6
    bytes_per_element: int = 2
    passes: int = 2
    fit_stats: FitStats | None = field(default=None, kw_only=True, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(
            self,
            "bandwidth_bytes_per_s",
            check_positive_float(self.bandwidth_bytes_per_s, "bandwidth_bytes_per_s"),
        )
        object.__setattr__(self, "latency_s", check_non_negative_float(self.latency_s, "latency_s"))
        for name in ("bytes_per_element", "passes"):
            object.__setattr__(self, name, _check_count(getattr(self, name), name, minimum=1))
        if self.fit_stats is not None and not isinstance(self.fit_stats, FitStats):
            raise ValueError(f"fit_stats must be a FitStats or None, got {self.fit_stats!r}")

    def seconds(self, received_bytes: Any, ring_steps: Any) -> np.ndarray:
        """Seconds (float64) of collectives receiving ``received_bytes`` in ``ring_steps``."""
        received = np.asarray(received_bytes, dtype=np.float64)
        steps = np.asarray(ring_steps, dtype=np.float64)
        return received / self.bandwidth_bytes_per_s + steps * self.latency_s

    @classmethod
    def fit(
        cls,
        observations: Sequence[tuple[float, int, float]],
        *,
        bytes_per_element: int = 2,
        passes: int = 2,
    ) -> CommModel:
        """Fit bandwidth and latency to measured collectives by non-negative least squares.

        ``observations``: ``(bytes received per member, ring steps, seconds)`` triples, at
        least 2 with different sizes, e.g. timed all-gathers of K/V-sized tensors over CP
        groups of 2, 4 and 8 (``ring steps = cp − 1`` per collective). The relative error is
        minimised (each row divided by its seconds), as in ``TimeModel.fit(relative=True)``.

        What ``seqbalance calibrate`` must add for CP: time such all-gathers (and
        reduce-scatters) on the CP groups the trainer uses, for a few message sizes, fit this
        model, and save it beside the compute ``TimeModel`` (``to_json``); the planner takes
        both through :class:`ContextParallelTimeModel`.
        """
        if isinstance(observations, (str, bytes)) or not isinstance(observations, Sequence):
            raise ValueError("observations must be a sequence of (bytes, steps, seconds) triples")
        if len(observations) < 2:
            raise ValueError(
                f"observations must hold at least 2 (bytes, steps, seconds) triples, "
                f"got {len(observations)}"
            )
        rows = np.empty((len(observations), 2))
        seconds = np.empty(len(observations))
        for i, observation in enumerate(observations):
            if not isinstance(observation, (tuple, list)) or len(observation) != 3:
                raise ValueError(
                    f"observations[{i}] must be a (bytes, steps, seconds) triple, "
                    f"got {observation!r}"
                )
            received, steps, value = observation
            rows[i] = (
                check_non_negative_float(received, f"observations[{i}] bytes"),
                check_int(steps, f"observations[{i}] steps", minimum=0),
            )
            seconds[i] = check_positive_float(value, f"observations[{i}] seconds")
        weights = 1.0 / seconds
        inverse_bandwidth, latency = nnls(rows * weights[:, None], seconds * weights)
        if inverse_bandwidth <= 0:
            raise ValueError(
                "observations do not determine a bandwidth (seconds do not grow with bytes); "
                "measure larger messages"
            )
        stats = FitStats.of(rows @ np.array([inverse_bandwidth, latency]), seconds)
        return cls(
            1.0 / float(inverse_bandwidth),
            float(latency),
            bytes_per_element=bytes_per_element,
            passes=passes,
            fit_stats=stats,
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields (with the format name and version)."""
        stats = self.fit_stats
        return {
            "format": _COMM_FORMAT,
            "version": _FORMAT_VERSION,
            "bandwidth_bytes_per_s": self.bandwidth_bytes_per_s,
            "latency_s": self.latency_s,
            "bytes_per_element": self.bytes_per_element,
            "passes": self.passes,
            "fit_stats": None
            if stats is None
            else {"mape": stats.mape, "r2": stats.r2, "n_observations": stats.n_observations},
        }

    @classmethod
    def from_dict(cls, data: Any) -> CommModel:
        """Inverse of :meth:`to_dict`."""
        _check_format(data, _COMM_FORMAT, "CommModel")
        try:
            stats = data.get("fit_stats")
            return cls(
                data["bandwidth_bytes_per_s"],
                data["latency_s"],
                bytes_per_element=data["bytes_per_element"],
                passes=data["passes"],
                fit_stats=None if stats is None else FitStats(**stats),
            )
        except (KeyError, TypeError) as error:
            raise ValueError(f"CommModel: missing or bad field: {error}") from None

    def to_json(self) -> str:
        """JSON text of :meth:`to_dict`."""
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_json(cls, text: str) -> CommModel:
        """Inverse of :meth:`to_json`."""
        return cls.from_dict(_loads(text, "CommModel"))


# ------------------------------------------------------------------ time model
MAX_SLOT_JITTER = 3.0
"""Largest ``slot_jitter`` accepted (σ of log slot seconds): a slot's time varying by a factor
of about 20 (e^3) from one run to the next is no timing of the plan but a broken measurement or
a unit error, and far larger values overflow the expected step (``exp(σ·Z)``) to ``inf``."""


def _check_count(value: Any, name: str, *, minimum: int) -> int:
    """``check_int``, and at most 2**53: the seconds are computed in floats."""
    count = check_int(value, name, minimum=minimum)
    if count > MAX_TOKENS_LIMIT:
        raise ValueError(f"{name} must be <= 2**53 = {MAX_TOKENS_LIMIT}, got {count}")
    return count


def check_slot_jitter(value: Any, name: str) -> float:
    """Return the slot jitter ``value`` as a float: a finite number in ``[0, MAX_SLOT_JITTER]``;
    else ValueError naming ``name``."""
    sigma = check_non_negative_float(value, name)
    if sigma > MAX_SLOT_JITTER:
        raise ValueError(
            f"{name} must be at most MAX_SLOT_JITTER = {MAX_SLOT_JITTER} (σ of log slot "
            f"seconds; 0.05 is about 5%), got {value!r}"
        )
    return sigma


@dataclass(frozen=True)
class ContextParallelTimeModel:
    """Seconds of a rank's share of sharded samples: computation plus CP communication.

    Attributes:
        time: the computation, ``t0 + t1·ΣL + t2·ΣL²`` per micro-batch (a calibrated or
            FLOPs-derived :class:`~seqbalance.cost.TimeModel`, without ``tile``).
        comm: the collectives' bandwidth and latency.
        kv_elements_per_token: K and V elements per token and layer
            (:func:`kv_elements_per_token` of the model).
        kv_layers: layers that gather K/V, each running its own collective
            (:func:`kv_layers` of the model: its softmax-attention layers).
        piece_overhead_s: seconds each member spends per sharded sample per micro-batch beyond
            its tokens' compute and ``sample_overhead_s`` (re-ordering the gathered K/V, the
            chunked attention). Default 0 (a fused varlen CP kernel handles all pieces in one
            launch); calibrate it for an executor that does not
            (``seqbalance.runtime.context_parallel``).
        sample_overhead_s: seconds a rank spends per piece it holds in a micro-batch, whole
            sample or shard, beyond its tokens' compute: an executor that attends each sample
            in its own call per layer pays it (the reference executor on CPU: about 0.4 ms for
            the toy model), a varlen kernel that takes every sample in one launch does not.
            Default 0; without it a calibration spreads that cost over ``t0`` and ``t1``, which
            over-prices slots of few samples against slots of many.
        sharded_attention_factor: a sharded piece's attention seconds per causal pair, relative
            to a whole sample's (``t2``). Default 1 (a varlen kernel that aligns the causal mask
            to the bottom right skips the masked half as a whole sample's causal kernel does);
            an executor whose chunk kernels compute a materialised mask pays more per pair
            (the reference executor on CPU: about 1.5), which its calibration measures.
        slot_jitter: the spread of a slot's seconds from one run to the next: the standard
            deviation of ``log(measured / typical)`` seconds of a slot (0.05: about 5%), what
            ``seqbalance calibrate --context-parallel`` estimates from its repeated timings.
            The planner ignores it (its objective is the step under the slots' typical
            seconds); ``ContextParallelPlan.expected_step_cost`` prices it: the step is the
            last rank's finish, and ranks that end together pay the slowest one's noise.
            Default 0 (no spread: the expected step is ``step_cost``).

    A member's compute for a share of ``x`` tokens and ``p`` causal pairs is
    ``t1·x + f·t2·(2p − x)``, ``f`` the ``sharded_attention_factor`` when the sample is
    sharded and 1 when whole: the whole sample (``x = L``, ``p = L(L+1)/2``) gives back
    ``t1·L + t2·L²``, and with ``f = 1`` the members' shares add up to it. The communication
    of a member holding ``x`` of the sample's ``L`` tokens is ``passes · kv_layers · (L − x) ·
    kv bytes`` over the bandwidth; the latency, ``passes · kv_layers · (cp − 1) · latency_s``,
    is paid once per CP group per micro-batch (:meth:`group_latency`), however many samples it
    gathers at once.

    Satisfies the planner's cost protocol for whole samples (:meth:`per_sample`,
    :attr:`microbatch_overhead`), so one object costs both whole and sharded samples.
    """

    time: TimeModel
    comm: CommModel
    kv_elements_per_token: int
    kv_layers: int
    piece_overhead_s: float = field(default=0.0, kw_only=True)
    sharded_attention_factor: float = field(default=1.0, kw_only=True)
    sample_overhead_s: float = field(default=0.0, kw_only=True)
    slot_jitter: float = field(default=0.0, kw_only=True)

    def __post_init__(self) -> None:
        if not isinstance(self.time, TimeModel):
            raise ValueError(f"time must be a TimeModel, got {type(self.time).__name__}")
        if self.time.tile is not None:
            raise ValueError(
                f"time has tile = {self.time.tile}: tile rounding is per whole sample and does "
                "not split over CP shards; use a TimeModel without tile"
            )
        if not isinstance(self.comm, CommModel):
            raise ValueError(f"comm must be a CommModel, got {type(self.comm).__name__}")
        for name in ("kv_elements_per_token", "kv_layers"):
            object.__setattr__(self, name, _check_count(getattr(self, name), name, minimum=0))
        for name in (
            "piece_overhead_s",
            "sharded_attention_factor",
            "sample_overhead_s",
        ):
            object.__setattr__(self, name, check_non_negative_float(getattr(self, name), name))
        object.__setattr__(self, "slot_jitter", check_slot_jitter(self.slot_jitter, "slot_jitter"))

    @classmethod
    def from_model(
        cls,
        model: str | ModelSpec | FlopsModel | None = None,
        *,
        time: TimeModel | None = None,
        comm: CommModel | None = None,
        peak_flops_per_s: float = DEFAULT_PEAK_FLOPS_PER_S,
        efficiency: float = DEFAULT_EFFICIENCY,
    ) -> ContextParallelTimeModel:
        """The CP time model of ``model`` (a preset name, a :class:`ModelSpec` or a
        ``FlopsModel``; None: ``seqbalance.defaults.DEFAULT_MODEL``).

        ``time`` defaults to ``TimeModel.from_flops(flops, peak_flops_per_s, efficiency)``
        (training FLOPs at the given throughput); pass a calibrated one instead. ``comm``
        defaults to ``CommModel()``. The K/V sizes come from the model's spec.
        """
        flops = flops_model(model)
        if time is None:
            time = TimeModel.from_flops(flops, peak_flops_per_s, efficiency)
        return cls(
            time=time,
            comm=CommModel() if comm is None else comm,
            kv_elements_per_token=kv_elements_per_token(flops.spec),
            kv_layers=kv_layers(flops.spec),
        )

    # --- the cost protocol (whole samples) ---------------------------------------------------
    @property
    def microbatch_overhead(self) -> float:
        """Seconds every non-empty micro-batch costs regardless of its samples (``t0``)."""
        return self.time.t0

    def per_sample(self, lengths: Any) -> np.ndarray:
        """Seconds per whole (unsharded) sample, without ``t0``: ``t1·L + t2·L²`` plus
        ``sample_overhead_s``."""
        return self.time.per_sample(lengths) + self.sample_overhead_s

    # --- shares -------------------------------------------------------------------------------
    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of K and V per token over all layers, for one collective pass."""
        return self.kv_elements_per_token * self.comm.bytes_per_element * self.kv_layers

    def shard_compute(self, lengths: Any, cp: int, scheme: str = "head_tail") -> np.ndarray:
        """Compute seconds (float64 ``[n, cp]``) of each member's share, without ``t0``
        (sharded shares' attention times ``sharded_attention_factor``)."""
        tokens = shard_tokens(lengths, cp, scheme).astype(np.float64)
        pairs = shard_pairs(lengths, cp, scheme)
        t2 = self.time.t2 * (self.sharded_attention_factor if cp > 1 else 1.0)
        return self.time.t1 * tokens + t2 * (2.0 * pairs - tokens)

    def shard_received_bytes(self, lengths: Any, cp: int, scheme: str = "head_tail") -> np.ndarray:
        """Bytes (float64 ``[n, cp]``) each member receives for the sample, all passes."""
        length = as_lengths(lengths)
        if check_int(cp, "cp", minimum=1) == 1:
            return np.zeros((length.size, 1))
        others = length[:, None] - shard_tokens(length, cp, scheme)
        return others.astype(np.float64) * float(self.kv_bytes_per_token * self.comm.passes)

    def shard_seconds(self, lengths: Any, cp: int, scheme: str = "head_tail") -> np.ndarray:
        """Seconds (float64 ``[n, cp]``) of each member's share: compute, the bandwidth part of
        its communication, ``sample_overhead_s`` and, when sharded (``cp > 1``),
        ``piece_overhead_s`` (the group's latency is added per micro-batch, see
        :meth:`group_latency`)."""
        # Absurd constants (a bandwidth in the wrong unit) overflow to inf, which the planner's
        # check of the step's seconds names; numpy's warning would only add lines to that error.
        with np.errstate(over="ignore"):
            received = self.shard_received_bytes(lengths, cp, scheme)
            seconds = (
                self.shard_compute(lengths, cp, scheme)
                + received / self.comm.bandwidth_bytes_per_s
                + self.sample_overhead_s
            )
            return seconds + self.piece_overhead_s if cp > 1 else seconds

    @overload
    def group_latency(self, cp: int) -> float: ...
    @overload
    def group_latency(self, cp: np.ndarray) -> np.ndarray: ...
    def group_latency(self, cp: int | np.ndarray) -> float | np.ndarray:
        """Latency seconds a CP group of ``cp`` ranks pays once per micro-batch it runs
        (``cp`` an int, or an array of sizes: then an array)."""
        if isinstance(cp, np.ndarray):
            sizes = as_lengths(cp, "cp")
            if (sizes < 1).any():
                raise ValueError(f"cp must be >= 1, got {int(sizes.min())}")
            steps: Any = (sizes - 1).astype(np.float64)
        else:
            steps = float(check_int(cp, "cp", minimum=1) - 1)
        # In floats: the counts' product may pass int64 (it is exact below 2**53, as before).
        with np.errstate(over="ignore"):
            return float(self.comm.passes * self.kv_layers) * steps * self.comm.latency_s

    # --- serialisation -------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields: the nested TimeModel and CommModel and the K/V sizes."""
        return {
            "format": _CP_TIME_FORMAT,
            "version": _FORMAT_VERSION,
            "time": json.loads(self.time.to_json()),
            "comm": self.comm.to_dict(),
            "kv_elements_per_token": self.kv_elements_per_token,
            "kv_layers": self.kv_layers,
            "piece_overhead_s": self.piece_overhead_s,
            "sharded_attention_factor": self.sharded_attention_factor,
            "sample_overhead_s": self.sample_overhead_s,
            "slot_jitter": self.slot_jitter,
        }

    @classmethod
    def from_dict(cls, data: Any) -> ContextParallelTimeModel:
        """Inverse of :meth:`to_dict`."""
        _check_format(data, _CP_TIME_FORMAT, "ContextParallelTimeModel")
        try:
            return cls(
                time=TimeModel.from_json(json.dumps(data["time"])),
                comm=CommModel.from_dict(data["comm"]),
                kv_elements_per_token=data["kv_elements_per_token"],
                kv_layers=data["kv_layers"],
                piece_overhead_s=data["piece_overhead_s"],
                # Files written before the factor existed: 1, what they were planned with.
                sharded_attention_factor=data.get("sharded_attention_factor", 1.0),
                # Files written before the per-sample cost existed: 0, as they were planned.
                sample_overhead_s=data.get("sample_overhead_s", 0.0),
                # Files written before the jitter was measured: 0, the noiseless prediction.
                slot_jitter=data.get("slot_jitter", 0.0),
            )
        except (KeyError, TypeError) as error:
            raise ValueError(f"ContextParallelTimeModel: missing or bad field: {error}") from None

    def to_json(self) -> str:
        """JSON text of :meth:`to_dict` (floats at full precision: exact round trip)."""
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_json(cls, text: str) -> ContextParallelTimeModel:
        """Inverse of :meth:`to_json`."""
        return cls.from_dict(_loads(text, "ContextParallelTimeModel"))

    def save(self, path: str | Path) -> None:
        """Write :meth:`to_json` to ``path`` (what ``seqbalance calibrate --context-parallel``
        writes)."""
        Path(path).write_text(self.to_json() + "\n", encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> ContextParallelTimeModel:
        """Read a model written by :meth:`save`.

        Raises:
            FileNotFoundError: no file at ``path`` (the message names it).
            ValueError: the file is not a ContextParallelTimeModel written by :meth:`save`.
        """
        return cls.from_json(read_model_file(path, "ContextParallelTimeModel"))


def load_time_model_file(path: str | Path) -> TimeModel | ContextParallelTimeModel:
    """Either model ``seqbalance calibrate`` writes, told apart by the file's ``format``: a
    :class:`~seqbalance.cost.TimeModel` (``TimeModel.save``) or a
    :class:`ContextParallelTimeModel` (:meth:`ContextParallelTimeModel.save`, with
    ``--context-parallel``).

    Raises:
        FileNotFoundError: no file at ``path`` (the message names it).
        ValueError: the file holds neither model (a file of another format is read as a
            TimeModel, whose error says which format it expects).
    """
    text = read_model_file(path, "time model")
    try:
        data = json.loads(text)
    except (TypeError, ValueError, RecursionError):
        data = None  # TimeModel.from_json says what is wrong with it
    if isinstance(data, dict) and data.get("format") == _CP_TIME_FORMAT:
        return ContextParallelTimeModel.from_dict(data)
    return TimeModel.from_json(text)


def context_parallel_cost(
    cost: Any = "flops", model: Any = None, *, comm: CommModel | None = None
) -> ContextParallelTimeModel:
    """The :class:`ContextParallelTimeModel` for a ``cost=`` / ``model=`` pair and the CP
    options' ``comm`` (None: the cost model's, or ``CommModel()``).

    ``cost``: ``"flops"`` (``model``: a preset name or ``ModelSpec``, default
    ``seqbalance.defaults.DEFAULT_MODEL``), a ``ModelSpec`` or ``FlopsModel`` (seconds at the
    default throughput), or a ``ContextParallelTimeModel`` (as is). As in
    ``seqbalance.cost.resolve_cost``, ``model`` only applies to ``cost="flops"``.

    Raises:
        ValueError: any other cost (``"tokens"``, a callable, a bare ``TimeModel``: they hold
            no K/V sizes or no seconds), ``model`` with another cost, or a ``comm`` that
            differs from the one inside a ``ContextParallelTimeModel``.
    """
    if model is not None and not (isinstance(cost, str) and cost == "flops"):
        raise ValueError(f"model={model!r} only applies to cost='flops', got cost={cost!r}")
    if isinstance(cost, ContextParallelTimeModel):
        if comm is not None and comm != cost.comm:
            raise ValueError(
                f"context_parallel.comm = {comm!r} conflicts with the cost model's comm = "
                f"{cost.comm!r}; set only one"
            )
        return cost
    if (isinstance(cost, str) and cost == "flops") or isinstance(cost, (ModelSpec, FlopsModel)):
        return ContextParallelTimeModel.from_model(
            model if isinstance(cost, str) else cost, comm=comm
        )
    hint = (
        "; build ContextParallelTimeModel.from_model(model, time=your_time_model) to add the "
        "K/V sizes the communication needs"
        if isinstance(cost, TimeModel)
        else ""
    )
    raise ValueError(
        "context parallelism costs compute and communication in seconds: cost must be "
        f"'flops', a ModelSpec, a FlopsModel or a ContextParallelTimeModel, got {cost!r}{hint}"
    )


def cost_description(cost: Any) -> dict[str, Any] | None:
    """JSON form of a ``ContextParallelTimeModel`` given as ``cost=`` (``PlanOptions.to_dict``):
    ``{"ContextParallelTimeModel": to_dict()}``, its full definition, so options holding
    different models differ in JSON and fingerprint; None for any other cost."""
    if isinstance(cost, ContextParallelTimeModel):
        return {_DESCRIPTION_TAG: cost.to_dict()}
    return None


def cost_from_description(value: Any) -> ContextParallelTimeModel | None:
    """Inverse of :func:`cost_description`; None when ``value`` is not such a description.

    Raises:
        ValueError: the tag is there but its model is malformed (the message says what).
    """
    if isinstance(value, dict) and len(value) == 1 and _DESCRIPTION_TAG in value:
        return ContextParallelTimeModel.from_dict(value[_DESCRIPTION_TAG])
    return None


def _loads(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except (TypeError, ValueError, RecursionError) as error:
        raise ValueError(f"{what} JSON is not valid JSON: {error}") from None


def _check_format(data: Any, expected: str, what: str) -> None:
    if not isinstance(data, dict) or data.get("format") != expected:
        raise ValueError(f"{what} must be an object with format {expected!r}")
    if data.get("version") != _FORMAT_VERSION:
        raise ValueError(
            f"{what} version {data.get('version')!r} is not supported "
            f"(this seqbalance reads version {_FORMAT_VERSION})"
        )

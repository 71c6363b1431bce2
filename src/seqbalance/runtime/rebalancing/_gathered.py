"""The Rebalancer's first phase: every rank's description of its samples, gathered and checked.

One ``all_gather`` of every rank's description (``seqbalance.runtime.rebalancing.wire``) makes
every rank hold the same :class:`Batch`, the step's samples as a whole, or raise the same
``ValueError``: settings that differ (named), input errors of any rank, sample schemas or group
flags that differ, parts that cannot be planned together.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from seqbalance.cost.samples import SampleParts
from seqbalance.plan.options import PlanOptions
from seqbalance.runtime.agreement import differing_settings, raise_gathered_error
from seqbalance.runtime.collectives import Comm
from seqbalance.runtime.rebalancing._samples import InputForm
from seqbalance.runtime.rebalancing.wire import Field, decode, encode

__all__ = [
    "Batch",
    "RefusedStep",
    "combined_parts",
    "gather_batch",
    "gather_described",
    "gather_end",
]


def gather_described(comm: Comm, header: dict[str, Any], table: np.ndarray, what: str) -> list[Any]:
    """Every rank's ``(header, table)`` description."""
    payloads = comm.all_gather_bytes(encode(header, table), what)
    return [decode(payload, rank) for rank, payload in enumerate(payloads)]


def _check_ended(headers: Sequence[dict[str, Any]]) -> None:
    """Check that every rank's batches have ended (``header["ended"]``: the steps it made) or
    none's.

    Raises:
        ValueError: on every rank, when only some ranks' batches ended: the others would wait
            for them at their next step until the timeout.
    """
    ended = [rank for rank, header in enumerate(headers) if header.get("ended") is not None]
    if not ended or len(ended) == len(headers):
        return
    going = [rank for rank in range(len(headers)) if rank not in ended]
    raise ValueError(
        f"the batches of rank(s) {ended} ended after {headers[ended[0]]['ended']} steps while "
        f"rank(s) {going} have another step: every rank's iterable must yield the same number "
        "of steps"
    )


def _gather_checked(
    comm: Comm, header: dict[str, Any], table: np.ndarray, options: PlanOptions
) -> list[Any]:
    """The step's first collectives, whether this rank has a step or its batches ended: every
    rank's description, once their settings agree and every rank's batches ended or none's
    (:func:`_check_ended`; else ValueError on every rank)."""
    described = gather_described(comm, header, table, "all_gather")
    headers = [h for h, _ in described]
    _check_settings(comm, headers, options)
    _check_ended(headers)
    return described


def gather_end(
    comm: Comm, header: dict[str, Any], table: np.ndarray, options: PlanOptions
) -> list[Any]:
    """The gather of a rank whose batches ended (``header["ended"]``), in the order of
    :func:`gather_batch`'s collectives: ValueError on every rank unless every rank's ended;
    every rank's adaptive statistics of its last step (``Batch.feedback``), which the end
    learns as a step would."""
    described = _gather_checked(comm, header, table, options)
    return [h.get("feedback") for h, _ in described]


def combined_parts(headers: Sequence[dict[str, Any]]) -> SampleParts | None:
    """Every rank's parts in rank order (the order of the global indices), or None when the
    ranks passed none.

    Raises:
        ValueError: ranks with samples disagree on passing parts, or their parts cannot be
            concatenated (another ``spatial_merge_size``, HSTU fields on some ranks only).
    """
    with_samples = [(rank, h) for rank, h in enumerate(headers) if h["n"]]
    passed = [rank for rank, h in with_samples if h["parts"] is not None]
    if len(passed) not in (0, len(with_samples)):
        without = [rank for rank, h in with_samples if h["parts"] is None]
        raise ValueError(
            f"ranks disagree on passing parts: rank(s) {passed} passed parts, rank(s) "
            f"{without} did not; every rank with samples passes parts, or none does"
        )
    if not with_samples:
        # No samples anywhere: parts are given when any rank passed (empty) ones.
        given = any(h["parts"] is not None for h in headers)
        return SampleParts(tokens=np.zeros(0, dtype=np.int64)) if given else None
    if not passed:
        return None
    try:
        return SampleParts.concatenate([SampleParts.from_dict(h["parts"]) for _, h in with_samples])
    except ValueError as error:
        raise ValueError(f"the ranks' parts cannot be planned together: {error}") from None


@dataclass(frozen=True)
class Batch:
    """What every rank knows after the gather: the description of the whole step."""

    counts: np.ndarray  # samples per rank
    rows: np.ndarray  # [total, fields]: first-dim size of every field of every sample
    groups: np.ndarray | None  # [total] group ids
    fields: list[Field]
    form: InputForm
    parts: SampleParts | None  # [total] every rank's parts in rank order, when passed
    feedback: list[Any]  # every rank's adaptive statistics of the last step (None: not observed)
    bounds: list[Any]  # every rank's cu_seqlens dtype and range (_samples.bounds_range), or None

    @property
    def offsets(self) -> np.ndarray:
        """Global index of each rank's first sample (and the total at the end)."""
        return np.concatenate([[0], np.cumsum(self.counts)]).astype(np.int64)

    @property
    def origin(self) -> np.ndarray:
        """The rank holding each sample before the exchange."""
        return np.repeat(np.arange(self.counts.size), self.counts)

    @property
    def total(self) -> int:
        return int(self.counts.sum())


def gather_batch(
    comm: Comm,
    header: dict[str, Any],
    table: np.ndarray,
    local: list[list[torch.Tensor]],
    options: PlanOptions,
) -> Batch:
    """All-gather every rank's description; check that the ranks agree (else ValueError,
    :class:`RefusedStep` once their settings agree)."""
    # This rank has a step: raises when some rank's batches ended.
    described = _gather_checked(comm, header, table, options)
    try:
        return _batch(described, header, local)
    except ValueError as error:
        raise RefusedStep(str(error), [h.get("feedback") for h, _ in described]) from None


def _batch(described: list[Any], header: dict[str, Any], local: list[list[torch.Tensor]]) -> Batch:
    """The step's :class:`Batch` from every rank's description (ValueError: they disagree, or
    a rank's input is bad)."""
    headers = [h for h, _ in described]
    raise_gathered_error([h.get("error") for h in headers])
    refused = [rank for rank, h in enumerate(headers) if h.get("refused_load")]
    if refused and len(refused) < len(headers):
        # Ranks parted at a checkpoint load; where every rank refused it, each goes on from the
        # state it had (a caller starting afresh after a change of options).
        raise ValueError(f"rank {refused[0]}: {headers[refused[0]]['refused_load']}")
    with_samples = [(rank, h) for rank, h in enumerate(headers) if h["n"]]
    for rank, h in with_samples[1:]:
        for key in ("fields", "groups"):
            if h[key] != with_samples[0][1][key]:
                raise ValueError(
                    f"ranks {with_samples[0][0]} and {rank} disagree on sample {key}: "
                    f"{with_samples[0][1][key]} vs {h[key]}"
                )
    reference = with_samples[0][1] if with_samples else header
    fields = [Field.from_json(f) for f in reference["fields"]]
    form = InputForm(header["form"])
    if not local and form.is_list:
        # An empty list cannot tell bare tensors from dicts: take the other ranks' form.
        form = next(
            (InputForm(h["form"]) for _, h in with_samples if InputForm(h["form"]).is_list),
            form,
        )
    tables = [t for (h, t) in described if h["n"]]
    full = (
        np.concatenate(tables)
        if tables
        else np.zeros((0, len(fields) + bool(reference["groups"])), dtype=np.int64)
    )
    return Batch(
        counts=np.array([h["n"] for h in headers], dtype=np.int64),
        rows=full[:, : len(fields)],
        groups=full[:, len(fields)] if reference["groups"] else None,
        fields=fields,
        form=form,
        parts=combined_parts(headers),
        feedback=[h.get("feedback") for h in headers],
        bounds=[h.get("cu_seqlens") for h in headers],
    )


class RefusedStep(ValueError):
    """A step every rank refused after its gather, the ranks' settings agreeing: its message
    is the error; ``feedback`` is every rank's closed-loop record the step carried (its rank
    order), which the step still learns before raising."""

    def __init__(self, message: str, feedback: list[Any]) -> None:
        super().__init__(message)
        self.feedback = feedback


def _versus(name: str, first: str, second: str) -> str:
    """One setting rank 0 and another rank differ in, in words."""
    return f"{name} ({first} vs {second})"


def _check_settings(comm: Comm, headers: list[dict[str, Any]], options: PlanOptions) -> None:
    """Raise ValueError on every rank when any rank's settings differ from rank 0's.

    The fingerprints travel in the first gather; only when they differ do the ranks
    all-gather their options' JSON (every rank sees the same headers, so every rank makes
    this second call) to name the options that differ.
    """
    reference = headers[0]["settings"]
    differing = [r for r, h in enumerate(headers) if h["settings"] != reference]
    if not differing:
        return
    rank = differing[0]
    texts = comm.all_gather_bytes(options.to_json().encode(), "all_gather of options")
    # The options by their values (the headers hold only their fingerprint), then the rest.
    names = differing_settings(json.loads(texts[0]), json.loads(texts[rank]), _versus)
    others = [
        {k: v for k, v in headers[r]["settings"].items() if k != "options"} for r in (0, rank)
    ]
    names += differing_settings(*others, _versus)
    raise ValueError(
        f"ranks 0 and {rank} disagree on the Rebalancer's settings: {'; '.join(names)}. "
        "Construct the Rebalancer with the same options, keep_local and length_key on "
        "every rank"
    )

"""The forms in which the Rebalancer takes samples and hands them back.

Internally a sample is a list of tensors, one per
:class:`~seqbalance.runtime.rebalancing.wire.Field`; ``normalise`` turns any accepted input form
into that, and ``assemble`` turns a micro-batch of such samples back into the caller's form.
"""

from __future__ import annotations

import enum
import itertools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from seqbalance._validation import as_lengths
from seqbalance.runtime.rebalancing.wire import Field, check_dense

__all__ = [
    "InputForm",
    "LocalSamples",
    "OutputForm",
    "assemble",
    "bounds_dtype",
    "bounds_range",
    "normalise",
]

BARE_FIELD = "tensor"
"""Field name used internally when samples are bare tensors rather than dicts."""


class InputForm(enum.Enum):
    """How a rank passed its samples to ``Rebalancer.rebalance``."""

    LIST_TENSOR = "list_tensor"
    """A list of tensors, one per sample (first dimension: the sequence)."""
    LIST_DICT = "list_dict"
    """A list of dicts of tensors, one dict per sample."""
    PACKED_TENSOR = "packed_tensor"
    """One tensor of all samples concatenated along dim 0, split at ``cu_seqlens``."""
    PACKED_DICT = "packed_dict"
    """A dict of such packed tensors sharing one ``cu_seqlens``."""

    @property
    def is_list(self) -> bool:
        return self in (InputForm.LIST_TENSOR, InputForm.LIST_DICT)


class OutputForm(enum.Enum):
    """How ``RebalanceResult.restore`` got its outputs."""

    ROWS = "rows"
    """One tensor with one row per sample (losses, rewards)."""
    PER_SAMPLE = "per_sample"
    """A sequence of tensors, one per sample, first dimensions may differ (per-token values)."""


@dataclass(frozen=True)
class LocalSamples:
    """One rank's samples as lists of field tensors, their schema and the input form."""

    samples: list[list[torch.Tensor]]
    fields: list[Field]
    form: InputForm


def normalise(samples: Any, cu_seqlens: torch.Tensor | None) -> LocalSamples:
    """Samples in any input form as lists of field tensors (ValueError on a bad input).

    Args:
        samples: a list of tensors or of dicts of tensors, or (with ``cu_seqlens``) a packed
            tensor or a dict of packed tensors.
        cu_seqlens: sample boundaries of packed input (``[k + 1]``, starting at 0).

    Raises:
        ValueError: naming the sample index (``samples[i]``) or the packed field at fault.
    """
    if cu_seqlens is not None:
        if isinstance(cu_seqlens, torch.Tensor):
            # A meta or sparse tensor raised torch's error on this rank alone, its peers
            # waiting in the gather; as_lengths reads the rest on the host.
            check_dense(cu_seqlens, "cu_seqlens")
        bounds = as_lengths(cu_seqlens, "cu_seqlens")
        if bounds.size == 0 or bounds[0] != 0 or (np.diff(bounds) < 0).any():
            raise ValueError("cu_seqlens must start at 0 and be non-decreasing")
        is_dict = isinstance(samples, Mapping)
        packed = samples if is_dict else {BARE_FIELD: samples}
        form = InputForm.PACKED_DICT if is_dict else InputForm.PACKED_TENSOR
        for name, tensor in packed.items():
            _check_name(name)
            if not isinstance(tensor, torch.Tensor) or tensor.dim() == 0:
                raise ValueError(f"packed field {name!r} must be a tensor with >= 1 dimension")
            check_dense(tensor, f"packed field {name!r}")
            if tensor.shape[0] != bounds[-1]:
                raise ValueError(
                    f"packed field {name!r} has {tensor.shape[0]} rows but cu_seqlens ends "
                    f"at {int(bounds[-1])}"
                )
        dicts = [
            {name: t[int(s) : int(e)] for name, t in packed.items()}
            for s, e in itertools.pairwise(bounds.tolist())
        ]
    else:
        if isinstance(samples, (torch.Tensor, Mapping)):
            raise ValueError("a packed tensor (or dict of packed tensors) needs cu_seqlens")
        items = list(samples)
        bare = bool(items) and isinstance(items[0], torch.Tensor)
        form = InputForm.LIST_TENSOR if bare else InputForm.LIST_DICT
        dicts = [{BARE_FIELD: s} if bare else s for s in items]
    if not dicts:
        return LocalSamples([], [], form)
    first = dicts[0]
    # keys(), not iteration: a TensorDict iterates over its rows and has no truth value.
    if not isinstance(first, Mapping) or not first.keys():
        raise ValueError("samples must be tensors or non-empty dicts of tensors")
    names = list(first.keys())
    fields = []
    for name in names:
        _check_name(name)
        tensor = first[name]
        if not isinstance(tensor, torch.Tensor) or tensor.dim() == 0:
            raise ValueError(f"samples[0][{name!r}] must be a tensor with >= 1 dimension")
        check_dense(tensor, f"samples[0][{name!r}]")  # before Field.of reads its shape
        fields.append(Field.of(name, tensor))
    local = []
    for index, sample in enumerate(dicts):
        if not isinstance(sample, Mapping) or list(sample.keys()) != names:
            got = list(sample.keys()) if isinstance(sample, Mapping) else type(sample).__name__
            raise ValueError(f"samples[{index}] has fields {got}, expected {names}")
        row = []
        for spec in fields:
            tensor = sample[spec.name]
            if index and isinstance(tensor, torch.Tensor):  # samples[0]: checked above
                check_dense(tensor, f"samples[{index}][{spec.name!r}]")
            if (
                not isinstance(tensor, torch.Tensor)
                or tensor.dim() == 0
                or tensor.dtype != spec.dtype
                or tensor.shape[1:] != spec.trailing
            ):
                raise ValueError(
                    f"samples[{index}][{spec.name!r}] must be a {spec.dtype} tensor of shape "
                    f"[n, {', '.join(map(str, spec.trailing))}]"
                )
            row.append(tensor)
        local.append(row)
    return LocalSamples(local, fields, form)


def _check_name(name: Any) -> None:
    """A field name travels to the other ranks as JSON: it must come back as itself (a str or
    an int; a tuple would come back as a list, which no dict takes as a key)."""
    try:
        back = json.loads(json.dumps([name]))[0]
        same = type(back) is type(name) and back == name
    except (TypeError, ValueError):  # not JSON at all
        same = False
    if not same:
        raise ValueError(
            f"sample field name {name!r} ({type(name).__name__}) cannot be sent: name fields "
            "with strings"
        )


def bounds_dtype(cu_seqlens: Any) -> torch.dtype:
    """The dtype of the ``cu_seqlens`` a rank's packed micro-batches come back with
    (:func:`assemble`): the input's, int32 for bounds given as no tensor."""
    return cu_seqlens.dtype if isinstance(cu_seqlens, torch.Tensor) else torch.int32


def bounds_range(cu_seqlens: Any) -> list[Any] | None:
    """``[dtype name, largest bound it holds exactly]`` of :func:`bounds_dtype`, or None
    without ``cu_seqlens`` (list input)."""
    if cu_seqlens is None:
        return None
    dtype = bounds_dtype(cu_seqlens)
    # A float counts whole numbers exactly up to 2 / eps (float16: 2048).
    exact = int(2 / torch.finfo(dtype).eps) if dtype.is_floating_point else torch.iinfo(dtype).max
    return [str(dtype).removeprefix("torch."), exact]


def assemble(
    form: InputForm,
    fields: Sequence[Field],
    samples: Sequence[Sequence[torch.Tensor]],
    cu_dtype: torch.dtype,
) -> Any:
    """One micro-batch of ``samples`` in the caller's ``form``.

    List forms give a list of tensors or of dicts; packed forms give ``(packed, cu_seqlens)``
    with the fields concatenated along dim 0 and ``cu_seqlens`` of ``cu_dtype``, ``[k + 1]``.
    """
    names = [f.name for f in fields]
    if form is InputForm.LIST_TENSOR:
        return [s[0] for s in samples]
    if form is InputForm.LIST_DICT:
        return [dict(zip(names, s, strict=True)) for s in samples]
    if samples:
        lengths = torch.tensor([s[0].shape[0] for s in samples], dtype=torch.int64)
        packed = {
            name: torch.cat([s[f].to(samples[0][f].device) for s in samples])
            for f, name in enumerate(names)
        }
    else:
        lengths = torch.zeros(0, dtype=torch.int64)
        packed = {f.name: torch.zeros((0, *f.trailing), dtype=f.dtype) for f in fields}
    bounds = torch.zeros(len(samples) + 1, dtype=torch.int64)
    torch.cumsum(lengths, 0, out=bounds[1:])
    bounds = bounds.to(cu_dtype)
    return (packed[BARE_FIELD] if form is InputForm.PACKED_TENSOR else packed), bounds

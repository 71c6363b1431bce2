"""What ``RebalanceResult.restore`` gathers about each rank's outputs, and their agreement."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from seqbalance.runtime.agreement import error_text
from seqbalance.runtime.rebalancing._samples import OutputForm
from seqbalance.runtime.rebalancing.wire import Field, check_dense

__all__ = ["agreed_output", "describe_outputs"]


def describe_outputs(
    outputs: torch.Tensor | Sequence[torch.Tensor], n: int, rows: Sequence[int] | None = None
) -> tuple[OutputForm, list[torch.Tensor], dict[str, Any], np.ndarray]:
    """Outputs as one tensor per sample, and this rank's description of them; ``rows``: the
    first dimension each of the ``n`` tensors must have (context parallelism: the tokens of
    this rank's share of each piece), which only the per-sample form can meet."""
    form = OutputForm.ROWS if isinstance(outputs, torch.Tensor) else OutputForm.PER_SAMPLE
    try:
        if rows is not None and form is OutputForm.ROWS:
            raise ValueError(
                "with context_parallel, restore takes one tensor per piece, one row per token "
                "of this rank's share (per-token outputs), not one row per sample"
            )
        if form is OutputForm.ROWS:
            check_dense(outputs, "outputs")
            if outputs.dim() == 0 or outputs.shape[0] != n:
                raise ValueError(
                    f"outputs must have num_samples = {n} rows, got shape {tuple(outputs.shape)}"
                )
            local = [row.unsqueeze(0) for row in outputs]
        else:
            local = _listed(outputs)
            if len(local) != n:
                raise ValueError(f"outputs must hold num_samples = {n} tensors, got {len(local)}")
            for k, t in enumerate(local):
                if not isinstance(t, torch.Tensor) or t.dim() == 0:
                    raise ValueError(f"outputs[{k}] must be a tensor with >= 1 dimension")
                check_dense(t, f"outputs[{k}]")
                if rows is not None and t.shape[0] != rows[k]:
                    raise ValueError(
                        f"outputs[{k}] has {t.shape[0]} rows, but this rank computes "
                        f"{rows[k]} tokens of that piece: one row per token of its share"
                    )
        specs = {(t.dtype, tuple(t.shape[1:])) for t in local}
        if len(specs) > 1:
            raise ValueError(f"outputs mix dtypes or trailing shapes: {sorted(map(str, specs))}")
    except ValueError as error:
        header = {"error": error_text(error), "n": 0, "form": form.value}
        return form, [], header, np.zeros((0, 1))
    header = {"error": None, "n": len(local), "form": form.value}
    if local:
        header["fields"] = [Field.of("output", local[0]).to_json()]
    table = np.array([[t.shape[0]] for t in local], dtype=np.int64).reshape(len(local), 1)
    return form, local, header, table


def _listed(outputs: Any) -> list[Any]:
    """The per-sample outputs as a list, or a ValueError naming what they are: a rank's
    TypeError here (``restore(None)``) was raised on it alone, before the gather its peers
    then waited in until the timeout. A mapping or a string iterates over keys or characters:
    no outputs either."""
    if not isinstance(outputs, (Mapping, str, bytes)):
        try:
            return list(outputs)
        except TypeError:
            pass
    raise ValueError(
        f"outputs must be a tensor or a sequence of tensors, got {type(outputs).__name__}"
    )


def agreed_output(headers: Any) -> tuple[OutputForm, Field] | None:
    """The output form and field every rank with outputs agrees on (None: nobody has any)."""
    described = [h for h in headers if h["n"]]
    if not described:
        return None
    reference = (described[0]["form"], described[0]["fields"])
    for h in described[1:]:
        if (h["form"], h["fields"]) != reference:
            raise ValueError(
                "restore needs the same output form, dtype and trailing shape on every rank, "
                f"got {reference[0]} {reference[1]} and {h['form']} {h['fields']}"
            )
    return OutputForm(reference[0]), Field.from_json(reference[1][0])

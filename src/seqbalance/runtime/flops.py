"""FLOPs / MFU accounting for packed (THD) training loops, reduced across data-parallel ranks.

:class:`TorchFlopsMeter` wraps :class:`seqbalance.cost.FlopsMeter` (the one FLOPs formula of the
project): each rank adds the ``cu_seqlens`` of the micro-batches it trained on, and once per
logging interval :meth:`TorchFlopsMeter.report` sums the FLOPs over the group with a single
``all_reduce`` (bounded by a timeout) and returns TFLOP/s per GPU and MFU.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from seqbalance._validation import check_positive_float
from seqbalance.runtime._dist import Comm, wait

__all__ = ["FlopsReport", "TorchFlopsMeter"]


@dataclass(frozen=True)
class FlopsReport:
    """One logging interval, summed over the data-parallel group.

    ``total_flops`` and ``tokens`` are totals over all ranks; ``tflops_per_gpu`` is
    ``total_flops / seconds / world_size / 1e12``; ``mfu`` is that over one GPU's peak FLOP/s
    (None when no peak was given).
    """

    total_flops: float
    tokens: int
    samples: int
    seconds: float
    world_size: int
    tflops_per_gpu: float
    mfu: float | None


class TorchFlopsMeter:
    """Count model FLOPs from ``cu_seqlens`` tensors and report per-GPU TFLOP/s and MFU.

    Parameters
    ----------
    model:
        A :class:`seqbalance.cost.FlopsModel`, a :class:`seqbalance.cost.ModelSpec` or a preset
        name (e.g. ``"qwen3-8b"``); specs and names get a default ``FlopsModel``.
    peak_flops_per_s:
        One GPU's peak FLOP/s for MFU (e.g. ``989e12`` for dense BF16 on an H100 SXM).
    group:
        Data-parallel process group to reduce over (default: the world when torch.distributed
        is initialised; otherwise this process alone).
    timeout:
        Longest wait for the reduction; a peer that never arrives raises
        :class:`seqbalance.runtime.CollectiveError`.
    backward:
        Count training FLOPs (forward + backward, default) or forward only.
    """

    def __init__(
        self,
        model: Any,
        *,
        peak_flops_per_s: float | None = None,
        group: Any = None,
        timeout: timedelta = timedelta(seconds=300),
        backward: bool = True,
    ) -> None:
        from seqbalance.cost import FlopsMeter, FlopsModel, ModelSpec

        if isinstance(model, str):
            model = ModelSpec.preset(model)
        if isinstance(model, ModelSpec):
            model = FlopsModel(model)
        self.meter = FlopsMeter(model, backward=backward)
        self.peak_flops_per_s = (
            None
            if peak_flops_per_s is None
            else check_positive_float(peak_flops_per_s, "peak_flops_per_s")
        )
        if not isinstance(timeout, timedelta) or timeout.total_seconds() <= 0:
            raise ValueError(f"timeout must be a positive datetime.timedelta, got {timeout!r}")
        self.group = group
        self.timeout = timeout

    def add(
        self,
        cu_seqlens: torch.Tensor | Any = None,
        *,
        valid: int | torch.Tensor | None = None,
        lengths: torch.Tensor | Any = None,
    ) -> float:
        """Add one micro-batch; return its FLOPs.

        Give ``cu_seqlens`` (a 1-D tensor or array starting at 0) or ``lengths``. A padded
        ``cu_seqlens`` (Megatron: padded with -1 and ``cu_seqlens_argmin`` = the first pad
        position) is read up to ``valid`` entries; a tensor ``valid`` is fine (one ``.item()``).
        Padding tokens after ``cu_seqlens[valid - 1]`` count no FLOPs.
        """
        if isinstance(valid, torch.Tensor):
            valid = int(valid.item())
        if cu_seqlens is not None:
            return self.meter.add(cu_seqlens=_to_numpy(cu_seqlens), valid=valid)
        return self.meter.add(None if lengths is None else _to_numpy(lengths), valid=valid)

    @property
    def local_flops(self) -> float:
        """FLOPs added on this rank since the last report."""
        return self.meter.total_flops

    def report(self, seconds: float, *, reset: bool = True) -> FlopsReport:
        """Sum this interval over the group (one all_reduce; a collective) and report it.

        ``seconds`` is the wall-clock length of the interval on this rank. Resets the counters
        unless ``reset=False``.
        """
        elapsed = check_positive_float(seconds, "seconds")
        totals = [self.meter.total_flops, float(self.meter.tokens), float(self.meter.samples)]
        world_size = 1
        if dist.is_available() and dist.is_initialized():
            comm = Comm(self.group, self.timeout)
            world_size = comm.world_size
            reduced = torch.tensor(totals, dtype=torch.float64, device=comm.device)
            work = dist.all_reduce(reduced, group=self.group, async_op=True)
            wait(work, "FLOPs all_reduce", self.timeout)
            totals = reduced.cpu().tolist()
        tflops = totals[0] / elapsed / world_size / 1e12
        report = FlopsReport(
            total_flops=totals[0],
            tokens=round(totals[1]),
            samples=round(totals[2]),
            seconds=elapsed,
            world_size=world_size,
            tflops_per_gpu=tflops,
            mfu=None if self.peak_flops_per_s is None else tflops * 1e12 / self.peak_flops_per_s,
        )
        if reset:
            self.meter.reset()
        return report


def _to_numpy(values: Any) -> Any:
    if isinstance(values, torch.Tensor):
        return values.detach().cpu().numpy()
    return values

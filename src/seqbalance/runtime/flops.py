"""FLOPs / MFU accounting for training loops, reduced over the data-parallel group only.

:class:`TorchFlopsMeter` wraps :class:`seqbalance.cost.FlopsMeter` (the one FLOPs formula and
the one report computation of the project): every rank adds the micro-batches it trains on
(``cu_seqlens`` tensors, lengths or sample parts), and once per logging interval
:meth:`TorchFlopsMeter.report` sums the FLOPs over the data-parallel replicas with one small
all_gather of every rank's totals and settings (bounded by a timeout; ranks whose meters are set
up differently raise) and returns TFLOP/s per GPU, tokens/s and MFU for the whole job.
"""

from __future__ import annotations

import json
from typing import Any

import torch
import torch.distributed as dist

from seqbalance._validation import check_bool, check_int, check_positive_float
from seqbalance.cost import FlopsMeter, FlopsModel, ModelSpec, flops_model
from seqbalance.cost.meter import FlopsReport, MeterTotals
from seqbalance.cost.resolve import describe_cost
from seqbalance.defaults import DEFAULT_TIMEOUT_SECONDS
from seqbalance.runtime.agreement import differing_settings, error_text, raise_gathered_error
from seqbalance.runtime.collectives import Comm, deadline

__all__ = ["FlopsReport", "TorchFlopsMeter"]


class TorchFlopsMeter:
    """Count model FLOPs of micro-batches; report TFLOP/s per GPU, tokens/s and MFU of the job.

    Every rank adds the micro-batches it trains on; all ranks of one data-parallel replica (its
    tensor-, pipeline- and context-parallel ranks) add the same ones. :meth:`report` sums one
    copy per replica:

    * ``group`` given (the data-parallel group, e.g. Megatron's ``get_data_parallel_group()``
      or a ``DeviceMesh``'s ``"dp"`` group): the totals are summed over it, ``dp_size`` = its
      size.
    * no ``group``: the totals are summed over the whole world and divided by the
      model-parallel size ``tensor_parallel x pipeline_parallel x context_parallel`` (each
      replica's copies), ``dp_size`` = world size / model-parallel size.

    The default (no group, no model-parallel sizes) treats every rank as its own replica. That is
    right for pure data parallelism (DDP, FSDP) and wrong under tensor, pipeline or context
    parallelism: with tensor-parallel size 2, both ranks of a pair add the same micro-batches,
    the world sum counts each twice and TFLOP/s per GPU comes out 2x too high. Pass the sizes
    (or the data-parallel group) so the meter knows.

    Args:
        model: A FLOPs model (:class:`seqbalance.cost.FlopsModel`, ``VisionLanguageFlopsModel``
            or ``HSTUFlopsModel``), a :class:`seqbalance.cost.ModelSpec` or a preset name (e.g.
            ``"qwen3-8b"``); specs and names get a default ``FlopsModel``.
        peak_flops_per_s: One GPU's peak FLOP/s for MFU (e.g. ``989e12`` for dense BF16 on an
            H100 SXM).
        group: The data-parallel process group to sum over (see above).
        dp_size: The data-parallel size, checked against ``group`` or the world (optional).
        tensor_parallel: Tensor-parallel size, or the tensor-parallel process group.
        pipeline_parallel: Pipeline-parallel size, or the pipeline-parallel process group.
        context_parallel: Context-parallel size, or the context-parallel process group.
        seq_length: Tokens per sequence of a dense micro-batch, for a ``cu_seqlens`` without
            sub-sequences (see :meth:`seqbalance.cost.FlopsMeter.add`).
        micro_batch_size: Sequences per dense micro-batch (with ``seq_length``).
        timeout: Longest wait for the reduction, in seconds; a peer that never arrives raises
            :class:`seqbalance.runtime.CollectiveError`.
        backward: Count training FLOPs (forward + backward, default) or forward only.
    """

    def __init__(
        self,
        model: Any,
        *,
        peak_flops_per_s: float | None = None,
        group: Any = None,
        dp_size: int | None = None,
        tensor_parallel: int | Any = 1,
        pipeline_parallel: int | Any = 1,
        context_parallel: int | Any = 1,
        seq_length: int | None = None,
        micro_batch_size: int = 1,
        timeout: float = DEFAULT_TIMEOUT_SECONDS,
        backward: bool = True,
    ) -> None:
        if isinstance(model, (str, ModelSpec)):
            model = flops_model(model)
        self.meter = FlopsMeter(
            model,
            backward=backward,
            tensor_parallel=_size(tensor_parallel, "tensor_parallel"),
            pipeline_parallel=_size(pipeline_parallel, "pipeline_parallel"),
            context_parallel=_size(context_parallel, "context_parallel"),
            seq_length=seq_length,
            micro_batch_size=micro_batch_size,
            peak_flops_per_s=peak_flops_per_s,
        )
        self._deadline = deadline(timeout)
        self.timeout = self._deadline.total_seconds()
        self.group = group
        self.dp_size = None if dp_size is None else check_int(dp_size, "dp_size", minimum=1)
        if dist.is_available() and dist.is_initialized():
            self._replicas()  # a layout that does not fit the world fails here, not at report

    def add(
        self,
        cu_seqlens: torch.Tensor | Any = None,
        *,
        valid: int | torch.Tensor | None = None,
        cu_seqlens_unpadded: torch.Tensor | Any = None,
        valid_unpadded: int | torch.Tensor | None = None,
        lengths: torch.Tensor | Any = None,
        parts: Any = None,
        vp_stage: int | None = None,
    ) -> float:
        """Add one micro-batch; return its FLOPs (see :meth:`seqbalance.cost.FlopsMeter.add`).

        Give ``cu_seqlens`` and/or ``cu_seqlens_unpadded`` (1-D tensors or arrays starting at
        0; the unpadded boundaries are used when given), ``lengths`` or ``parts``. A padded
        ``cu_seqlens`` (Megatron: padded with -1, ``cu_seqlens_argmin`` = the first pad position)
        is read up to ``valid`` entries; tensor ``valid`` / ``valid_unpadded`` are fine (an
        integer tensor of one element: one ``.item()`` each). ``vp_stage``: the virtual
        pipeline stage of this forward step (only stage 0 counts).
        """
        return self.meter.add(
            _to_numpy(lengths, "lengths"),
            cu_seqlens=_to_numpy(cu_seqlens, "cu_seqlens"),
            valid=_to_int(valid, "valid"),
            cu_seqlens_unpadded=_to_numpy(cu_seqlens_unpadded, "cu_seqlens_unpadded"),
            valid_unpadded=_to_int(valid_unpadded, "valid_unpadded"),
            parts=parts,
            vp_stage=vp_stage,
        )

    @property
    def local_flops(self) -> float:
        """FLOPs added on this rank since the last report."""
        return self.meter.total_flops

    def report(self, seconds: float, *, reset: bool = True) -> FlopsReport:
        """Sum this interval over the data-parallel replicas (one all_gather of every rank's
        totals and meter settings; a collective every rank must call) and report it for the
        whole job.

        ``seconds`` is the wall-clock length of the interval on this rank. Resets the counters
        unless ``reset=False``. Without torch.distributed this process is the whole job.

        Raises:
            ValueError: ``seconds`` not a positive finite number or ``reset`` not a bool (on
                every rank, naming the first rank that gave one); on every rank, naming the
                first rank and setting that differ from rank 0's, when the ranks' meters are
                set up differently (model, ``backward``, parallel sizes, ``seq_length``,
                ``micro_batch_size``, ``peak_flops_per_s``): their sum would mix FLOPs of
                different kinds.
            CollectiveError: a peer did not join within ``timeout``.
        """
        try:  # checked before the gather, which carries a bad value to every rank
            check_positive_float(seconds, "seconds")
            check_bool(reset, "reset")
            problem = None
        except ValueError as error:
            problem = error_text(error)
        local = self.meter.totals
        if not (dist.is_available() and dist.is_initialized()):
            if problem is not None:
                raise ValueError(problem)
            if self.dp_size not in (None, 1):
                raise ValueError(
                    f"dp_size = {self.dp_size}, but torch.distributed is not initialised: the "
                    "meter cannot sum the other replicas"
                )
            summed, replicas = local, 1
        else:
            try:  # a meter built before the group: its layout is checked here, then carried
                replicas, copies = self._replicas()
            except ValueError as error:
                replicas, copies, problem = 0, 1, problem or error_text(error)
            comm = Comm(self.group, self._deadline)
            # The settings travel with the totals: ranks metering another model, backward or
            # layout would sum FLOPs of different kinds and divide by different replica counts,
            # each reporting its own wrong figure without a word.
            totals = [local.flops, local.tokens, local.samples]
            mine = {
                "settings": self._settings(replicas, copies),
                "totals": totals,
                "problem": problem,
            }
            gathered = [
                json.loads(payload)
                for payload in comm.all_gather_bytes(json.dumps(mine).encode(), "FLOPs report")
            ]
            # A rank whose interval is no time (a timer that read 0 or NaN) fails every rank
            # here; raised after the gather on that rank alone, the others went on apart.
            raise_gathered_error(
                [rank["problem"] for rank in gathered], what="TorchFlopsMeter.report on "
            )
            _check_same_settings([rank["settings"] for rank in gathered])
            flops, tokens, samples = (
                sum(rank["totals"][k] for rank in gathered) / copies for k in range(3)
            )
            summed = MeterTotals(flops, round(tokens), round(samples))
        report = self.meter.report(seconds, dp_size=replicas, totals=summed)
        if reset:
            self.meter.reset()
        return report

    def _settings(self, replicas: int, copies: int) -> dict[str, Any]:
        """What shapes this rank's FLOPs and its report (compared across ranks by ``report``)."""
        meter = self.meter
        return {
            "model": _described(meter.flops_model),
            "backward": meter.backward,
            "tensor_parallel": meter.tensor_parallel,
            "pipeline_parallel": meter.pipeline_parallel,
            "context_parallel": meter.context_parallel,
            "seq_length": meter.seq_length,
            "micro_batch_size": meter.micro_batch_size,
            "peak_flops_per_s": meter.peak_flops_per_s,
            "replicas": replicas,
            "copies": copies,
        }

    def _replicas(self) -> tuple[int, int]:
        """(data-parallel size, copies of each replica's totals in the reduction group)."""
        if self.group is not None:
            replicas, copies = dist.get_world_size(self.group), 1
            what = "the size of group"
        else:
            world = dist.get_world_size()
            copies = self.meter.model_parallel_size
            if world % copies:
                raise ValueError(
                    f"the world has {world} ranks, not a multiple of tensor_parallel x "
                    f"pipeline_parallel x context_parallel = {copies}"
                )
            replicas = world // copies
            what = "world size / model-parallel size"
        if self.dp_size is not None and self.dp_size != replicas:
            raise ValueError(f"dp_size = {self.dp_size}, but {what} is {replicas}")
        return replicas, copies


def _described(model: Any) -> Any:
    """The meter's FLOPs model as plain data, alike in every process that builds it alike
    (``describe_cost``; never a repr, which holds a function's address): a ``FlopsModel``'s
    ``extra_per_sample`` by its qualified name beside the rest of the model."""
    extra = getattr(model, "extra_per_sample", None)
    if isinstance(model, FlopsModel) and extra is not None:
        options = {name: getattr(model, name) for name in ("attention", "recompute", "include_mtp")}
        plain = FlopsModel(model.spec, **options)
        return {**describe_cost(plain), "extra_per_sample": describe_cost(extra)}
    return describe_cost(model)


def _check_same_settings(settings: list[dict[str, Any]]) -> None:
    """ValueError, the same on every rank (each compares every rank with rank 0), unless every
    rank's meter is set up alike."""
    for rank, theirs in enumerate(settings[1:], start=1):
        changes = differing_settings(
            settings[0],
            theirs,
            lambda name, ours, other, rank=rank: (
                f"{name} ({ours} on rank 0, {other} on rank {rank})"
            ),
        )
        if changes:
            raise ValueError(
                f"TorchFlopsMeter: ranks 0 and {rank} of the group set up their meters "
                "differently: " + "; ".join(changes) + ". Every rank must build the meter with "
                "the same model and settings, or the summed FLOPs and the report are wrong"
            )


def _size(value: Any, name: str) -> int:
    """A parallel size given as an int or as the process group of that dimension."""
    if dist.is_available() and isinstance(value, dist.ProcessGroup):
        return dist.get_world_size(value)
    return check_int(value, name, minimum=1)


def _to_int(value: int | torch.Tensor | None, name: str) -> Any:
    """A tensor count as the Python number it holds (the meter checks it is an integer): a
    float or bool tensor is no count (``int()`` truncated 3.7 to 3 and read True as 1)."""
    if not isinstance(value, torch.Tensor):
        return value
    _check_readable(value, name)
    if value.numel() != 1:
        raise ValueError(f"{name} must be one integer, got a tensor of shape {tuple(value.shape)}")
    return value.item()


def _to_numpy(values: Any, name: str) -> Any:
    """A tensor as a numpy array of its values on the host (floats as float64, which numpy
    reads for every float dtype: bfloat16 included), for the meter's checks."""
    if not isinstance(values, torch.Tensor):
        return values
    _check_readable(values, name)
    values = values.detach().cpu()
    return (values.double() if values.is_floating_point() else values).numpy()


def _check_readable(tensor: torch.Tensor, name: str) -> None:
    """ValueError naming ``name`` for a tensor with no values to read on the host (meta,
    sparse, quantized): torch's own error named nothing."""
    if tensor.is_meta or tensor.layout != torch.strided or tensor.is_quantized:
        kind = "meta" if tensor.is_meta else "quantized" if tensor.is_quantized else "sparse"
        raise ValueError(f"{name} must be a dense tensor with values, got a {kind} tensor")
    if tensor.is_complex():
        raise ValueError(f"{name} must hold real numbers, got dtype {tensor.dtype}")

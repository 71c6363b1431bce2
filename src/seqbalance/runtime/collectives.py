"""Collectives with a deadline: every wait is bounded, so a failed peer raises, never hangs.

Deadlines are float seconds in every public signature (checked where they are given:
``seqbalance._validation.check_timeout``); :func:`deadline` is the one place they become the
``timedelta`` torch.distributed takes.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from seqbalance._deprecated import warn
from seqbalance._validation import check_timeout

__all__ = ["CollectiveError", "Comm", "deadline", "group_device", "synchronize", "wait"]


class CollectiveError(RuntimeError):
    """A collective failed or did not finish within the timeout (a peer rank failed or hung)."""


def deadline(seconds: Any, name: str = "timeout") -> timedelta:
    """``seconds`` (float seconds) as the ``timedelta`` of a collective's wait: the one place a
    deadline changes form. A ``timedelta`` is still taken, with a ``DeprecationWarning``, for
    one release (the Rebalancer's and the FLOPs meter's ``timeout`` were one).

    Raises:
        ValueError: naming ``name``: not positive and finite, or beyond
            ``MAX_TIMEOUT_SECONDS`` (it could overflow).
    """
    if isinstance(seconds, timedelta):
        warn(
            f"{name} as a datetime.timedelta",
            f"seconds as a float ({name}={seconds.total_seconds():g})",
            stacklevel=3,
        )
        seconds = seconds.total_seconds()
    return timedelta(seconds=check_timeout(seconds, name))


def wait(work: Any, what: str, timeout: timedelta) -> None:
    """Wait for an async collective's ``work`` at most ``timeout``.

    Raises:
        CollectiveError: naming ``what``, when the collective failed or timed out.
    """
    try:
        work.wait(timeout)
    except RuntimeError as error:
        raise CollectiveError(
            f"{what} did not complete within {timeout.total_seconds():g} s: a peer rank failed, "
            f"exited or did not reach the same call ({error})"
        ) from error


def group_device(group: Any) -> torch.device:
    """Where the collectives of ``group`` (an initialised process group, None: the world) take
    their tensors: the current CUDA device on NCCL, else the CPU."""
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def synchronize(device: torch.device) -> None:
    """Wait for the work queued on ``device`` (a CUDA device; nothing to wait for on a CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Comm:
    """Collectives on one process group, each bounded by the timeout."""

    def __init__(self, group: Any, timeout: timedelta) -> None:
        if not (dist.is_available() and dist.is_initialized()):
            raise ValueError("torch.distributed is not initialised: call init_process_group first")
        self.group = group
        self.timeout = timeout
        self.rank = dist.get_rank(group)
        if self.rank < 0:  # torch's own error, at the backend lookup, named no group
            raise ValueError(
                "this process is not a member of the process group it was given (group=): "
                "pass a group this rank belongs to (its data-parallel group)"
            )
        self.world_size = dist.get_world_size(group)
        self.device = group_device(group)

    def all_gather_bytes(self, payload: bytes, what: str) -> list[bytes]:
        """Every rank's ``payload`` (two all_gathers: sizes, then payloads padded to the max)."""
        size = torch.tensor([len(payload)], dtype=torch.int64, device=self.device)
        sizes = [torch.empty_like(size) for _ in range(self.world_size)]
        wait(dist.all_gather(sizes, size, group=self.group, async_op=True), what, self.timeout)
        counts = [int(s.item()) for s in sizes]
        buffer = torch.zeros(max(counts), dtype=torch.uint8)
        buffer[: len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        buffer = buffer.to(self.device)
        gathered = [torch.empty_like(buffer) for _ in range(self.world_size)]
        wait(dist.all_gather(gathered, buffer, group=self.group, async_op=True), what, self.timeout)
        return [g[:n].cpu().numpy().tobytes() for g, n in zip(gathered, counts, strict=True)]

    def exchange(
        self, send: torch.Tensor, send_splits: list[int], recv_splits: list[int], what: str
    ) -> torch.Tensor:
        """``all_to_all_single`` of a uint8 buffer with per-rank split sizes (in bytes)."""
        received = torch.empty(sum(recv_splits), dtype=torch.uint8, device=self.device)
        work = dist.all_to_all_single(
            received,
            send.to(self.device),
            output_split_sizes=recv_splits,
            input_split_sizes=send_splits,
            group=self.group,
            async_op=True,
        )
        wait(work, what, self.timeout)
        return received

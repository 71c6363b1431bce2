"""DataLoader batch samplers that know every sample's length before the epoch starts.

Both samplers are ``batch_sampler`` objects for :class:`torch.utils.data.DataLoader`: they yield
lists of dataset indices, one list per micro-batch, for *this* data-parallel rank only. Every
rank computes the same epoch layout from ``(lengths, seed, epoch)`` without exchanging data, so
they are the zero-overhead path when lengths are known up front (tokenized datasets).

Scale: an epoch is laid out one optimizer step at a time, just ahead of use
(``seqbalance.plan.layout.EpochLayout``: a constant-memory keyed shuffle, no stored
permutation), and ``BalancedBatchSampler`` plans the next ``lookahead`` steps in a background
thread while the loop trains, so the first micro-batch comes without planning the epoch and the
loop does not wait for the planner in steady state. Lengths may be a ``.npy`` file (its path, or
``np.load(path, mmap_mode="r")`` and any view of it), read step by step and never copied whole:
read with ``pread`` rather than through the memory map, each read checking that the file is the
one the sampler opened, so a file rewritten, truncated or replaced under a running sampler is a
``ValueError`` at the next read, never a SIGBUS.
Each step's plan is exactly what ``plan_step`` gives for that step's samples, the plan
``plan_epoch`` makes for the same epoch. A planner error is raised by ``next()`` at the step it
concerns; a pass the loop leaves (``break``, an exception) or ``close()`` stops the thread.

Data-parallel position: a sampler needs this process's data-parallel rank and the data-parallel
size: pass the data-parallel process group (``group=``, e.g. ``device_mesh["dp"].get_group()``) or
``dp_rank=`` and ``dp_size=`` (e.g. from Megatron's parallel state). Only when neither is given do
they default to the global torch.distributed world, which is right for pure data parallelism only:
under tensor or pipeline parallelism the world holds ``dp x tp x pp`` ranks, and the TP (and PP)
ranks of one data-parallel replica must get the *same* samples. Using the global rank would hand
each of them different data and split every replica's batch ``tp x pp`` ways.

Agreement: where torch.distributed is initialised, the first ``iter`` of every epoch all-gathers
the sampler's setup over ``group`` (or the world) once, with a timeout
(``agreement_timeout`` seconds; ``None`` skips the check), and every rank raises a ``ValueError``
naming what differs (lengths, options, a SHA-256 of every sample's cost, seed, batch sizes, the
closed loop and its settings and prior) before any data is yielded. Every rank of that group must
iterate its sampler. An adaptive sampler checks at every ``iter`` (with the steps its closed loop
has observed), so a rank that skipped the ``observe()`` of a pass's last step fails there too.

Resuming mid-epoch: ``state_dict()`` records the epoch, how many micro-batches this rank has
consumed and the step and offset they end at, together with what the layout depends on (a
SHA-256 of the lengths and groups, and of the samples' parts when ``BalancedBatchSampler`` plans a
``SampleParts``; the plan options' fingerprint and a SHA-256 of every sample's cost, seed, shuffle
settings, batch sizes, data-parallel rank and size); ``load_state_dict()`` refuses a resume point
from a different setup with a ``ValueError`` naming what changed, and otherwise makes the next
iteration start at exactly the next micro-batch, planning only the steps from there on. Each
rank saves and loads its own state. A DataLoader with workers pulls indices from its batch
sampler ahead of the training loop (``num_workers * prefetch_factor`` batches), so the number of
batches the *sampler* has yielded can run ahead of the number the *loop* has trained on. For an
exact resume, count the batches your loop has consumed and save
``sampler.state_dict(consumed=count)``; with ``num_workers=0`` the default (batches yielded) is
already exact. ``consumed`` lies between where the pass started and what it has yielded, and
counts a prefix of the pass: the loop must receive the batches in the order the sampler yields
them, which a DataLoader does by default; with ``in_order=False`` its workers hand batches over as
they finish, so no count names what was trained (a resume would train some batches twice and
skip as many): keep ``in_order=True`` for an exact resume. A loaded resume point holds until a
pass takes its first batch (a DataLoader with workers calls ``iter`` twice before it takes
one); an ``iter`` after that starts the epoch anew.
``set_epoch`` to another epoch starts it afresh: a running pass ends (its iterator raises
``RuntimeError`` if used again) and the position is the new epoch's start, so a state never records
one epoch's position under another's number.

``len()``: exact without planning when every step has a fixed micro-batch count
(``num_microbatches``; ``LengthGroupedSampler`` always); otherwise a ``TypeError`` (the count is
the planner's choice per step), which trainers read as "no length" (``num_steps`` is exact).
What ``len()`` promises is checked first, for each epoch (at construction for epoch 0, then by
``iter`` and ``len``), in one vectorised pass over the epoch's order, without planning a step
(``seqbalance.plan.epoch.check_steps``): a step with fewer samples than its micro-batch slots
(a last, partial global batch smaller than ``dp_size x num_microbatches``, without
``allow_empty``; with ``groups``, a step whose groups, each on one rank, cannot give every rank
its micro-batches), and with ``num_microbatches`` a step whose samples need more than its
``dp_size x num_microbatches`` micro-batches under the caps by the planner's own lower bound
(tokens over ``max_tokens``, samples longer than half of it, over-cap samples alone, the same
for ``max_vision_patches``, ``microbatch_size`` when padded; with ``context_parallel`` the
tokens over ``max_tokens`` on every rank), or a group that no rank can hold, are refused with a
``ValueError`` naming the epoch, the first such step (with ``bucket_window``: as bucketing
deals it; with groups too, which costs a pass over every window: for 1M samples in groups of
8 about 0.6-0.9 s CPU per epoch from memory, 1.5-1.7 s from a file) or group, what it holds
and ``num_microbatches``. What remains: a step within that bound that the planner still cannot
pack (bin packing; e.g. five 40-token samples in two micro-batches of 100 tokens). It fails
when it is reached, on every rank alike (planning is deterministic), by ``next()`` at that
step, prefixed with the epoch and step, before any of that step's data.
"""

from __future__ import annotations

from seqbalance.runtime.samplers._position import data_parallel_position
from seqbalance.runtime.samplers._state_format import STATE_FORMAT
from seqbalance.runtime.samplers.balanced import BalancedBatchSampler
from seqbalance.runtime.samplers.length_grouped import LengthGroupedSampler

__all__ = [
    "STATE_FORMAT",
    "BalancedBatchSampler",
    "LengthGroupedSampler",
    "data_parallel_position",
]

"""Hugging Face ``Trainer`` and TRL ``SFTTrainer`` with seqbalance's planned batches.

Three lines::

    from seqbalance.integrations.hf import BalancedTrainerMixin

    class MyTrainer(BalancedTrainerMixin, Trainer): ...   # or SFTTrainer
    trainer = MyTrainer(model=model, args=args, train_dataset=ds, seqbalance_options={...})

What it does:

- ``get_train_dataloader`` returns a DataLoader whose ``batch_sampler`` is
  :class:`seqbalance.runtime.BalancedBatchSampler`: every optimizer step holds
  ``B x gradient_accumulation_steps x dp_size`` samples, ``B`` the batch size the Trainer's own
  loader takes (``per_device_train_batch_size``, ``x n_gpu`` with ``nn.DataParallel``; after an
  out-of-memory error, the size ``auto_find_batch_size`` falls back to), and every rank runs
  exactly ``gradient_accumulation_steps`` micro-batches of it (``num_microbatches``), so the
  Trainer's accumulation loop and the plan agree. The data-parallel rank and size are
  Accelerate's: ``args.process_index // (tp x cp)`` of ``args.world_size // (tp x cp)``, so the
  ranks of a tensor- or context-parallel group (``parallelism_config``) get the same batches;
  sequence parallelism is refused. The loader is not passed through ``accelerator.prepare``,
  which would shard the batches a second time. The last, partial step of an epoch is
  dropped (a dataset smaller than one step is refused). The loader takes the Trainer's loader
  settings (workers, pin memory, persistent workers, prefetch factor, multiprocessing context,
  ``seed_worker``);
  ``dataloader_in_order=False`` is not kept (a warning): a resume is exact only in order.
  ``train_sampling_strategy="sequential"`` keeps the dataset's order across steps (no shuffle);
  ``"group_by_length"`` / ``"batch_rebalance"`` give way to this sampler (a warning). An
  ``IterableDataset`` (a streaming ``datasets`` one too) is refused: steps are planned over a
  map-style dataset. So is a trainer with its own training loader (TRL's GRPO, RLOO and
  distillation trainers repeat prompts with their ``RepeatSampler``), which the mixin would
  replace.
- Layout: padding-free TRL (``args.padding_free``, or ``packing=True`` with
  ``packing_strategy`` ``"bfd"`` / ``"bfd_split"``, which trains padding-free) or
  ``layout="packed"`` in the options plans packed micro-batches (the token cap ``max_tokens``
  applies to their sum); otherwise micro-batches are padded and hold at most ``B`` samples
  (the planner groups similar lengths and balances the ranks). A row TRL packed is costed as
  one sequence of its length, though attention stays within each of its documents
  (``seq_lengths``): rows of many short documents are costed too high.
- Cost: by default the training FLOPs of the model being trained
  (``ModelSpec.from_hf_config(model.config)``), or the ``cost`` / ``model`` in the options.
- Loss: with unequal micro-batches a per-micro-batch mean weights tokens unequally. The Trainer
  already divides the summed token loss by ``num_items_in_batch``, the label tokens of the whole
  optimizer step (over all ranks with ``average_tokens_across_devices``, which is forced on); that
  is the right normalisation, and it holds here because the step's micro-batches are exactly the
  ones the Trainer collects for it. Models without ``num_items_in_batch`` support get no such
  normalisation from the Trainer (a warning is logged).
- Resume: the plan is a function of the lengths, seed, epoch and options, so the Trainer's own
  skip of the micro-batches already trained is exact. The sampler state is written into every
  checkpoint (``seqbalance_sampler.json``) and checked on ``train(resume_from_checkpoint=...)``,
  given a path or ``True`` (the newest checkpoint of ``output_dir``): a different dataset, seed,
  world size or plan options raise ``ValueError`` before training.

Lengths come from ``seqbalance_lengths`` when given, else from the ``input_ids`` of the dataset
(:func:`seqbalance.datasets.lengths_from_dataset`). A sample's length is
``len(sample["input_ids"])``, as in transformers' own ``LengthGroupedSampler`` and
``BatchRebalanceSampler``: the tokens the model runs over, padding already in the sample included
(not the attention mask's sum). Given lengths are checked against it as the loader fetches each
sample (a lazy dataset is not read up front): a mismatch is a ``ValueError`` naming the sample, the
given length and the real one. Samples that are no mapping with ``input_ids`` cannot be checked and
are planned on the given lengths as they are. Needs ``transformers`` (``seqbalance[hf]``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from seqbalance._validation import check_bool
from seqbalance.cost import ModelSpec
from seqbalance.datasets.tokenized import lengths_from_dataset
from seqbalance.integrations._map_style import map_style
from seqbalance.integrations._no_empty import refuse_no_step
from seqbalance.runtime.samplers import BalancedBatchSampler

__all__ = ["SAMPLER_STATE_FILE", "BalancedTrainerMixin", "balanced_train_dataloader"]

SAMPLER_STATE_FILE = "seqbalance_sampler.json"
"""Name of the sampler-state file written into every checkpoint folder."""

_log = logging.getLogger(__name__)


# Sampler arguments the Trainer sets, with the setting they come from: given in the options too,
# they raised TypeError "got multiple values" (or were overridden without a word).
_SET_BY_TRAINER = {
    "num_microbatches": "gradient_accumulation_steps",
    "microbatch_size": "per_device_train_batch_size",
    "micro_batch_size": "per_device_train_batch_size",
    "lengths": "seqbalance_lengths, or the dataset's input_ids",
    "global_batch_size": "per_device_train_batch_size x gradient_accumulation_steps x dp size",
    "dp_rank": "process_index",
    "dp_size": "world_size",
    "seed": "data_seed, or seed",
    "shuffle": "train_sampling_strategy",
    "drop_last": "the Trainer's whole steps",
}


def _plan_options(trainer: Any, options: dict[str, Any]) -> dict[str, Any]:
    """The sampler's plan options from the trainer's arguments and the user's options."""
    args = trainer.args
    chosen = dict(options)
    for fixed, source in _SET_BY_TRAINER.items():
        if fixed in chosen:
            raise ValueError(
                f"seqbalance_options[{fixed!r}] is set by the Trainer ({source}); leave it out"
            )
    if "options" in chosen:
        # The Trainer's settings and the model's cost went on top of a PlanOptions' own
        # (its cost, micro-batch count and size replaced without a word).
        raise ValueError(
            f"seqbalance_options['options'] (a {type(chosen['options']).__name__}) is not "
            "taken: give the PlanOptions fields as keys of seqbalance_options, so the Trainer's "
            "settings are checked against them"
        )
    # check_bool: np.False_ is False to PlanOptions; 0 / None / "no" get its own message.
    if check_bool(chosen.get("allow_empty", False), "seqbalance_options['allow_empty']"):
        # An empty micro-batch reached the collator, which no Hugging Face or TRL collator
        # builds (IndexError on that rank alone, mid-epoch, the others left waiting).
        raise ValueError(
            f"seqbalance_options['allow_empty'] = {chosen['allow_empty']!r} is not supported: "
            "the Trainer runs every micro-batch through its data collator and the model, and "
            "an empty one has nothing to collate"
        )
    chosen["num_microbatches"] = args.gradient_accumulation_steps
    # The trainer's own flag where it has one: TRL's SFTTrainer also trains padding-free with
    # packing=True and packing_strategy "bfd" / "bfd_split" (args.padding_free stays False);
    # its DPOTrainer falls back to padding whatever args.padding_free says.
    flag = getattr(trainer, "padding_free", None)
    padding_free = bool(getattr(args, "padding_free", False) if flag is None else flag)
    if padding_free and chosen.get("layout", "packed") != "packed":
        # TRL's padding-free collator packs each micro-batch into one row: another layout
        # was overridden without a word.
        raise ValueError(
            f"seqbalance_options layout={chosen['layout']!r} contradicts padding_free=True "
            "training (args.padding_free, or TRL's packing with packing_strategy 'bfd' / "
            "'bfd_split'), whose collator packs every micro-batch into one row: leave layout "
            "out or set 'packed'"
        )
    packed = padding_free or chosen.get("layout") == "packed"
    if packed:
        chosen["layout"] = "packed"
    else:
        chosen["layout"] = "padded"
        chosen["microbatch_size"] = _batch_size(trainer)
    if "cost" not in chosen and "model" not in chosen:
        config = getattr(getattr(trainer, "model", None), "config", None)
        if config is not None:
            try:
                chosen["cost"] = ModelSpec.from_hf_config(config)
            except (ValueError, KeyError, TypeError) as error:
                _log.warning(
                    "seqbalance: balancing tokens, the model config is not usable: %s", error
                )
    return chosen


class _LengthChecked:
    """``dataset`` whose fetched samples are checked against the planned ``lengths``.

    The check sits where the DataLoader fetches (``__getitem__`` / ``__getitems__``, in its
    workers too), so it costs one ``len`` per sample trained and reads nothing ahead. The
    ValueError is therefore raised by the rank that fetches the sample, when it fetches it; the
    other ranks stop at their next collective's timeout, as with any error in one rank's data.
    ``lengths`` is the sampler's ``checked_lengths``: a lengths file changed under the run is
    that ValueError too, never a signal.
    """

    def __init__(self, dataset: Any, lengths: Any) -> None:
        self.dataset = dataset
        self.lengths = lengths

    def __len__(self) -> int:
        return len(self.dataset)

    def _checked(self, index: int, given: int, sample: Any) -> Any:
        if isinstance(sample, Mapping) and "input_ids" in sample:
            real = len(sample["input_ids"])
            if given != real:
                raise ValueError(
                    f"seqbalance_lengths[{index}] is {given} but train_dataset[{index}]"
                    f"['input_ids'] has {real} tokens: the plan would balance wrong costs; "
                    "give len(input_ids) of every sample, or leave seqbalance_lengths out"
                )
        return sample

    def __getitem__(self, index: int) -> Any:
        return self.__getitems__([index])[0]

    def __getitems__(self, indices: list[int]) -> list[Any]:
        # The DataLoader fetches a whole micro-batch at once where the dataset can
        # (``datasets.Dataset``); keep that, and read the given lengths at once.
        given = np.asarray(self.lengths[np.asarray(indices, dtype=np.int64)]).tolist()
        fetch = getattr(self.dataset, "__getitems__", None)
        samples = fetch(indices) if fetch is not None else [self.dataset[i] for i in indices]
        return [
            self._checked(i, n, sample)
            for i, n, sample in zip(indices, given, samples, strict=True)
        ]


class _EpochLoader:
    """Mixin for a DataLoader whose ``set_epoch`` reaches its batch sampler."""

    def set_epoch(self, epoch: int) -> None:
        self.batch_sampler.set_epoch(epoch)  # type: ignore[attr-defined]


def balanced_train_dataloader(
    trainer: Any, *, lengths: Any = None, options: dict[str, Any] | None = None
) -> Any:
    """The training DataLoader of ``trainer`` with a ``BalancedBatchSampler`` (module docstring).

    Usable without the mixin: ``trainer.get_train_dataloader = lambda:
    balanced_train_dataloader(trainer, options={...})``.

    Raises:
        ValueError: no ``train_dataset``, an ``IterableDataset`` (steps are planned over a
            map-style dataset), lengths of another size, fewer samples than one optimizer step
            (the partial step is dropped: nothing would be trained), or ``options`` holding a
            sampler argument the Trainer sets (``num_microbatches``, ``seed``, ``dp_size``, ...)
            or a ``PlanOptions`` under ``"options"`` (give its fields as keys), or
            ``allow_empty`` (no collator builds an empty micro-batch).
    """
    import torch

    if trainer.train_dataset is None:
        raise ValueError("Trainer: training requires a train_dataset")
    args = trainer.args
    dataset = trainer.train_dataset
    if isinstance(dataset, torch.utils.data.IterableDataset):
        # Its lengths were read by iterating it to the end (a stream: for ever), then the
        # DataLoader refused the batch sampler.
        raise ValueError(
            f"train_dataset is an IterableDataset ({type(dataset).__name__}): the balanced "
            "sampler plans steps over a map-style dataset (len and dataset[i]); use a "
            "datasets.Dataset (not streaming) or a torch Dataset"
        )
    map_style(dataset, "train_dataset", "the features of sample i")
    given = lengths is not None
    if not given:
        lengths = lengths_from_dataset(dataset, "input_ids")
    collator = trainer.data_collator
    try:
        import datasets

        is_hf_dataset = isinstance(dataset, datasets.Dataset)
    except ImportError:
        is_hf_dataset = False
    if is_hf_dataset:
        dataset = trainer._remove_unused_columns(dataset, description="training")
    else:
        collator = trainer._get_collator_with_removed_columns(collator, description="training")
    if not getattr(args, "average_tokens_across_devices", True):
        _log.warning("seqbalance: average_tokens_across_devices is off; turning it on")
        args.average_tokens_across_devices = True
    if not getattr(trainer, "model_accepts_loss_kwargs", True):
        _log.warning(
            "seqbalance: the model does not take num_items_in_batch, so the Trainer averages "
            "the loss per micro-batch, which weights tokens of unequal micro-batches unequally"
        )
    dp_rank, dp_size = _data_parallel_position(trainer)
    sampler = BalancedBatchSampler(
        lengths,
        _batch_size(trainer) * args.gradient_accumulation_steps * dp_size,
        dp_rank=dp_rank,
        dp_size=dp_size,
        seed=args.data_seed if args.data_seed is not None else args.seed,
        drop_last=True,
        shuffle=_shuffled(args),
        **_plan_options(trainer, options or {}),
    )
    # Given lengths of another size trained a prefix of the dataset without a word (fewer) or
    # failed inside the DataLoader with an IndexError (more).
    if hasattr(dataset, "__len__") and len(sampler.lengths) != len(dataset):
        sampler.close()
        raise ValueError(
            f"lengths has {len(sampler.lengths)} entries but train_dataset has {len(dataset)} "
            "samples (seqbalance_lengths must give the token length of every training sample)"
        )
    # Else the loader held no batch: with max_steps the Trainer trained 0 steps and returned (a
    # warning only), by epochs it raised about max_steps.
    refuse_no_step(
        sampler,
        "train_dataset",
        "the Trainer's batch size x gradient_accumulation_steps x data-parallel size",
    )
    loader_class = type("BalancedDataLoader", (_EpochLoader, torch.utils.data.DataLoader), {})
    return loader_class(
        # Read through the sampler's checked reader, never its memory map of a lengths file:
        # a file cut under the run would kill a loader worker with SIGBUS.
        _LengthChecked(dataset, sampler.checked_lengths) if given else dataset,
        batch_sampler=sampler,
        collate_fn=collator,
        **_loader_settings(args),
    )


def _batch_size(trainer: Any) -> int:
    """Samples per micro-batch: what the Trainer's own training loader batches,
    ``_train_batch_size`` (``per_device_train_batch_size x n_gpu``, or the size
    ``auto_find_batch_size`` fell back to after running out of memory: the per-device size
    alone made every retry run the same micro-batches); ``per_device_train_batch_size`` for a
    trainer-like object without it."""
    size = getattr(trainer, "_train_batch_size", None)
    return trainer.args.per_device_train_batch_size if size is None else size


def _data_parallel_position(trainer: Any) -> tuple[int, int]:
    """This process's data-parallel ``(rank, size)``, as Accelerate shards a training loader
    (``prepare_data_loader`` with a device mesh): the ranks of one tensor- or context-parallel
    group (transformers 5's ``parallelism_config``, a ``tp_plan`` model) run the same batches,
    and ``world_size // (tp x cp)`` ranks split the data, as ``Trainer.get_total_train_batch_size``
    counts them. Sequence parallelism (DeepSpeed Ulysses) is refused: Accelerate's loader adapter
    for it is not applied to this loader.

    Raises:
        ValueError: ``sp_size > 1``, or a world size that the TP x CP group does not divide.
    """
    args = trainer.args
    world = max(1, args.world_size)
    # Trainers before transformers 5's ND parallelism have none of these: one rank per replica.
    tp, cp, sp = (
        int(getattr(trainer, f"get_{kind}_size", lambda: 1)()) for kind in ("tp", "cp", "sp")
    )
    if sp > 1:
        raise ValueError(
            f"sequence parallelism (sp_size = {sp}) is not supported: its loader adapter "
            "(Accelerate's, for DeepSpeed Ulysses) would not wrap seqbalance's loader"
        )
    peers = tp * cp
    if world % peers:
        raise ValueError(f"world_size {world} is not a multiple of tp_size x cp_size = {peers}")
    return (args.process_index // peers if world > 1 else 0), world // peers


def _shuffled(args: Any) -> bool:
    """Whether the Trainer's ``train_sampling_strategy`` shuffles: ``"sequential"`` keeps the
    dataset's order (the sampler's ``shuffle=False``: steps take the samples in order, each
    balanced within); the length samplers it names give way to seqbalance's (a warning)."""
    strategy = getattr(args, "train_sampling_strategy", "random")
    if strategy in ("group_by_length", "batch_rebalance"):
        _log.warning(
            "seqbalance: train_sampling_strategy=%r is replaced by seqbalance's balanced sampler",
            strategy,
        )
    return strategy != "sequential"


def _loader_settings(args: Any) -> dict[str, Any]:
    """The Trainer's own DataLoader settings (``Trainer._get_dataloader``), but in order."""
    from functools import partial

    from transformers.trainer_utils import seed_worker

    if not getattr(args, "dataloader_in_order", True):
        # Batches delivered out of order would make the resume inexact (the sampler cannot
        # see which ones were trained).
        _log.warning("seqbalance: dataloader_in_order=False is not kept; batches come in order")
    workers = args.dataloader_num_workers
    return {
        "num_workers": workers,
        "pin_memory": args.dataloader_pin_memory,
        "persistent_workers": getattr(args, "dataloader_persistent_workers", False),
        "multiprocessing_context": getattr(args, "dataloader_multiprocessing_context", None),
        "prefetch_factor": getattr(args, "dataloader_prefetch_factor", None),
        "worker_init_fn": partial(seed_worker, num_workers=workers, rank=args.process_index),
    }


def _refuse_own_loader(cls: type) -> None:
    """Refuse a trainer after the mixin in ``cls``'s bases whose ``get_train_dataloader`` is
    not the Trainer's: TRL's GRPO, RLOO and distillation trainers repeat each prompt (and each
    generation batch) with their own ``RepeatSampler`` and normalise over those groups, and
    the mixin's loader replaced theirs without a word."""
    after = cls.__mro__[cls.__mro__.index(BalancedTrainerMixin) + 1 :]
    owner = next((base for base in after if "get_train_dataloader" in vars(base)), None)
    if owner is not None and owner.__module__ != "transformers.trainer":
        raise ValueError(
            f"{owner.__name__} builds its own training loader ({owner.__name__}."
            "get_train_dataloader), which BalancedTrainerMixin would replace: the mixin goes "
            "before the Trainer or a trainer that keeps the Trainer's loader (SFTTrainer)"
        )


class BalancedTrainerMixin:
    """Put before ``Trainer`` / ``SFTTrainer`` in the bases (module docstring).

    Keyword arguments taken by ``__init__``: ``seqbalance_options`` (dict of ``PlanOptions``
    fields: ``max_tokens``, ``cost``, ``model``, ``objective``, ``layout``, ...) and
    ``seqbalance_lengths`` (``len(input_ids)`` of every training sample, checked as
    each sample is fetched).
    """

    def __init__(
        self,
        *args: Any,
        seqbalance_options: dict[str, Any] | None = None,
        seqbalance_lengths: Any = None,
        **kwargs: Any,
    ) -> None:
        _refuse_own_loader(type(self))
        self.seqbalance_options = dict(seqbalance_options or {})
        self.seqbalance_lengths = seqbalance_lengths
        self._seqbalance_loader: Any = None
        super().__init__(*args, **kwargs)  # type: ignore[call-arg]
        from transformers import TrainerCallback

        mixin = self

        class _SaveSamplerState(TrainerCallback):
            def on_save(self, args: Any, state: Any, control: Any, **_: Any) -> None:
                # Where the Trainer writes the checkpoint: with save_on_each_node every node's
                # local process 0 (node-local disks), whose ranks otherwise refused the resume
                # alone while the others went on into training.
                if mixin._seqbalance_loader is None or not args.should_save:
                    return
                folder = Path(mixin._run_dir(args)) / f"checkpoint-{state.global_step}"
                # Micro-batches trained in the current epoch (the loader may have prefetched more).
                consumed = (
                    state.global_step * args.gradient_accumulation_steps
                    - mixin._steps_before_epoch(state)
                )
                record = mixin._seqbalance_loader.batch_sampler.state_dict(consumed=consumed)
                folder.mkdir(parents=True, exist_ok=True)
                (folder / SAMPLER_STATE_FILE).write_text(json.dumps(record, indent=2))

        self.add_callback(_SaveSamplerState())  # type: ignore[attr-defined]

    def _run_dir(self, args: Any) -> str:
        """The folder the Trainer saves checkpoints in: ``output_dir/run-<trial>`` under a
        hyperparameter search (``_get_output_dir``), else ``output_dir``."""
        run_dir = getattr(self, "_get_output_dir", None)
        return args.output_dir if run_dir is None else run_dir(getattr(self, "_trial", None))

    def _steps_before_epoch(self, state: Any) -> int:
        """Micro-batches of the epochs before the current one."""
        per_epoch = len(self._seqbalance_loader.batch_sampler)
        done = state.global_step * self.args.gradient_accumulation_steps  # type: ignore[attr-defined]
        return (done // per_epoch) * per_epoch if per_epoch else 0

    def get_train_dataloader(self) -> Any:
        self._seqbalance_loader = balanced_train_dataloader(
            self, lengths=self.seqbalance_lengths, options=self.seqbalance_options
        )
        return self._seqbalance_loader

    def train(self, resume_from_checkpoint: Any = None, *args: Any, **kwargs: Any) -> Any:
        checkpoint = resume_from_checkpoint
        if isinstance(checkpoint, bool):
            # The Trainer's own rule for True: the newest checkpoint in output_dir (the Trainer
            # raises when there is none).
            from transformers.trainer_utils import get_last_checkpoint

            folder = self.args.output_dir  # type: ignore[attr-defined]
            checkpoint = (
                get_last_checkpoint(folder) if checkpoint and Path(folder).is_dir() else None
            )
        if isinstance(checkpoint, (str, Path)):
            self._check_resume(Path(checkpoint))
        return super().train(resume_from_checkpoint, *args, **kwargs)  # type: ignore[misc]

    def _resume_batch_size(self, checkpoint: Path) -> None:
        """With ``auto_find_batch_size``, the batch size the Trainer resumes ``checkpoint`` at:
        ``trainer_state.json``'s ``train_batch_size`` (the size it fell back to), which the
        Trainer sets right after this check; the check planned with the first size and refused
        the checkpoint."""
        from transformers.trainer_callback import TrainerState

        # transformers.trainer.TRAINER_STATE_NAME (that module takes seconds to import).
        state_file = checkpoint / "trainer_state.json"
        args = self.args  # type: ignore[attr-defined]
        if getattr(args, "auto_find_batch_size", False) and state_file.is_file():
            size = TrainerState.load_from_json(str(state_file)).train_batch_size
            if size is not None:
                self._train_batch_size = size

    def _check_resume(self, checkpoint: Path) -> None:
        """Fail before training when the checkpoint's plan is not the one this run would make."""
        saved_file = checkpoint / SAMPLER_STATE_FILE
        if not saved_file.is_file():
            raise ValueError(
                f"{checkpoint} has no {SAMPLER_STATE_FILE}: it was not written by a seqbalance "
                "trainer, so its data order cannot be resumed exactly"
            )
        try:
            # A save cut by a crash leaves half a JSON document: name the file, not a column.
            saved = json.loads(saved_file.read_text(encoding="utf-8"))
        except ValueError as error:  # JSONDecodeError, UnicodeDecodeError
            raise ValueError(
                f"resume from {checkpoint}: {saved_file} is not a sampler state ({error})"
            ) from None
        self._resume_batch_size(checkpoint)
        try:
            # A fresh sampler accepts the state only if it would lay out the same plan; the
            # Trainer itself then skips the micro-batches already trained.
            self.get_train_dataloader().batch_sampler.load_state_dict(saved)
        except ValueError as error:
            raise ValueError(f"resume from {checkpoint}: {error}") from None

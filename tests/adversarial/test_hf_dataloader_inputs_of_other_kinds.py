"""HF Trainer drop-in given inputs the stock Trainer takes differently (adv15b D1, D2): an
``IterableDataset`` was read to its end for lengths (a stream: for ever) before the DataLoader
refused the batch sampler; a sampler argument the Trainer sets, given in ``seqbalance_options``,
raised TypeError "got multiple values"; a ``PlanOptions`` under ``"options"`` had its cost,
micro-batch count and size replaced by the Trainer's without a word."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import numpy as np
import pytest

pytest.importorskip("torch")

import torch
from _hf_train import trainer_stub

from seqbalance.integrations.hf import balanced_train_dataloader
from seqbalance.plan import PlanOptions


class _Stream(torch.utils.data.IterableDataset):
    """An endless stream of records, as a streaming dataset is to the loader."""

    def __iter__(self) -> Iterator[dict[str, list[int]]]:
        for i in itertools.count():
            yield {"input_ids": [1] * (i % 7 + 1)}


def test_an_iterable_dataset_is_refused_before_it_is_read() -> None:
    with pytest.raises(ValueError, match=r"train_dataset is an IterableDataset \(_Stream\)"):
        balanced_train_dataloader(trainer_stub(_Stream()))


@pytest.mark.parametrize(
    ("key", "value"),
    [("dp_size", 4), ("seed", 3), ("shuffle", False), ("drop_last", False), ("lengths", [1])],
)
def test_a_sampler_argument_the_trainer_sets_is_named(key: str, value: object) -> None:
    rows = [{"input_ids": list(range(n))} for n in (3, 4, 5, 6)]
    with pytest.raises(ValueError, match=rf"seqbalance_options\['{key}'\] is set by the Trainer"):
        balanced_train_dataloader(trainer_stub(rows), options={key: value})


def test_plan_options_under_options_are_not_overridden_silently() -> None:
    rows = [{"input_ids": list(range(n))} for n in (3, 4, 5, 6)]
    given = PlanOptions(cost="tokens", layout="padded", microbatch_size=1, num_microbatches=4)
    with pytest.raises(ValueError, match=r"seqbalance_options\['options'\] \(a PlanOptions\)"):
        balanced_train_dataloader(trainer_stub(rows), options={"options": given})


def test_allow_empty_is_refused_before_a_collator_meets_an_empty_micro_batch() -> None:
    """adv18b D6: ``seqbalance_options={"allow_empty": True}`` was taken; a packed plan then
    gave ranks an empty micro-batch (here, of 2 ranks x 2: [the long sample], [] and [7
    short], []), and every Hugging Face / TRL collator raises IndexError on an empty list, on
    that rank alone, mid-epoch."""
    rows = [{"input_ids": [1] * n} for n in (4000, *[10] * 7)]
    options = {"allow_empty": True, "layout": "packed", "max_tokens": 8192, "cost": "tokens"}
    loader = {"gradient_accumulation_steps": 2, "world_size": 2}
    with pytest.raises(ValueError, match=r"seqbalance_options\['allow_empty'\] = True is not"):
        balanced_train_dataloader(trainer_stub(rows, **loader, process_index=0), options=options)
    options["allow_empty"] = False  # said explicitly: the default (rank 1 gets [3], [3])
    batches = balanced_train_dataloader(
        trainer_stub(rows, **loader, process_index=0), options=options
    )
    assert [len(batch) for batch in batches] == [1, 1]
    plan = batches.batch_sampler.step_plan(0)  # review18 item 13: the rank whose were empty
    assert [[len(batch) for batch in rank] for rank in plan.ranks] == [[1, 1], [3, 3]]


@pytest.mark.parametrize(
    ("value", "refused"), [(np.False_, None), (0, "must be True or False"), ("no", "must be")]
)
def test_allow_empty_is_read_as_a_bool(value: object, refused: str | None) -> None:
    """review18 item 14: np.False_ (False to PlanOptions) was refused as "not supported", and
    0 / "no" got that sentence instead of the bool check's."""
    rows = [{"input_ids": list(range(n))} for n in (3, 4, 5, 6)]
    options = {"allow_empty": value}
    if refused is None:
        assert len(balanced_train_dataloader(trainer_stub(rows), options=options)) > 0
        return
    with pytest.raises(ValueError, match=rf"seqbalance_options\['allow_empty'\] {refused}"):
        balanced_train_dataloader(trainer_stub(rows), options=options)


@pytest.mark.parametrize("dataset", [np.int64(2), np.array(3), torch.tensor(3)])
def test_a_scalar_train_dataset_is_refused_naming_it(dataset: object) -> None:
    """review18 item 10 (adv18b D1's sibling): a scalar train_dataset with lengths given built
    the loader, and its first batch raised IndexError (or TypeError naming no argument)."""
    with pytest.raises(ValueError, match=r"^train_dataset must be indexable .* got a scalar"):
        balanced_train_dataloader(trainer_stub(dataset), lengths=[2, 2])

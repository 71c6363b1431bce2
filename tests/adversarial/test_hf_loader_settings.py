"""The HF drop-in built its DataLoader from three of the Trainer's loader settings and dropped
the others without a word: ``dataloader_persistent_workers``, ``dataloader_prefetch_factor``,
``dataloader_multiprocessing_context`` and the Trainer's ``seed_worker`` (each worker's seeds
from the rank, for random augmentation in a collator) (adv11b U14). They are passed as the
Trainer passes them now; ``dataloader_in_order=False`` is kept in order, with a warning (a
resume is exact only in order). ``train_sampling_strategy="sequential"`` was dropped the same
way: the steps came shuffled (adv12b B6); it keeps the dataset's order now, and the length
samplers the Trainer would use instead give way with a warning."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from _hf_train import trainer_stub

from seqbalance.integrations.hf import balanced_train_dataloader

SIZES = (5, 9, 3, 7, 2, 8)


def _trainer(**loader: object) -> SimpleNamespace:
    dataset = [{"input_ids": list(range(n))} for n in SIZES]
    return trainer_stub(dataset, dataloader_num_workers=2, **loader)


def test_the_trainers_loader_settings_reach_the_loader() -> None:
    trainer = _trainer(
        dataloader_persistent_workers=True,
        dataloader_prefetch_factor=3,
        dataloader_multiprocessing_context="spawn",
    )
    loader = balanced_train_dataloader(trainer, options={"cost": "tokens"})
    assert loader.persistent_workers is True and loader.prefetch_factor == 3
    assert loader.multiprocessing_context.get_start_method() == "spawn"
    assert loader.worker_init_fn.func.__name__ == "seed_worker"
    assert loader.worker_init_fn.keywords == {"num_workers": 2, "rank": 0}


def test_out_of_order_delivery_is_kept_in_order_with_a_warning(caplog) -> None:
    with caplog.at_level(logging.WARNING):
        loader = balanced_train_dataloader(
            _trainer(dataloader_in_order=False), options={"cost": "tokens"}
        )
    assert loader.in_order is True and "dataloader_in_order" in caplog.text


def _steps(loader) -> list[list[int]]:
    return [sorted(batch) for batch in loader.batch_sampler]


def test_sequential_sampling_keeps_the_datasets_order(caplog) -> None:
    sizes = list(range(1, 41))
    dataset = [{"input_ids": list(range(n))} for n in sizes]
    trainer = trainer_stub(dataset, train_sampling_strategy="sequential")
    batches = _steps(balanced_train_dataloader(trainer, options={"cost": "tokens"}))
    assert batches == [[i, i + 1] for i in range(0, 40, 2)]  # steps of 2 samples, in order
    shuffled = trainer_stub(dataset, train_sampling_strategy="random")
    assert _steps(balanced_train_dataloader(shuffled, options={"cost": "tokens"})) != batches
    with caplog.at_level(logging.WARNING):
        for strategy in ("group_by_length", "batch_rebalance"):
            trainer = trainer_stub(dataset, train_sampling_strategy=strategy)
            balanced_train_dataloader(trainer, options={"cost": "tokens"})
            assert f"train_sampling_strategy={strategy!r}" in caplog.text


@pytest.mark.parametrize("content", [b'{"epoch": 0, "consumed"', b"\xff\xfe{}", b""])
def test_a_sampler_state_cut_by_a_crash_is_named(tmp_path, content) -> None:
    """adv12b B11: a checkpoint whose ``seqbalance_sampler.json`` a crash cut mid-write gave
    json's "Expecting ',' delimiter: line 1 column 24" (or a UnicodeDecodeError) naming no
    file; the resume check names the checkpoint and the file now."""
    from seqbalance.integrations.hf import SAMPLER_STATE_FILE, BalancedTrainerMixin

    (tmp_path / SAMPLER_STATE_FILE).write_bytes(content)
    with pytest.raises(ValueError, match=f"{SAMPLER_STATE_FILE} is not a sampler state"):
        BalancedTrainerMixin._check_resume(SimpleNamespace(), tmp_path)

"""HF Trainer drop-in under transformers 5's ND parallelism (``parallelism_config``, a
``tp_plan`` model): the ranks of one tensor- or context-parallel group must run the same
batches, as Accelerate's loader gives them (``prepare_data_loader``: ``process_index // (tp x
cp)`` of ``world_size // (tp x cp)`` data-parallel ranks) and as the Trainer counts the step
(``get_total_train_batch_size``). The drop-in planned for every process as a data-parallel
rank: with tp 2 on 4 processes the two ranks of each TP group got different samples (their
shards computed on different inputs, without a word) and the step held twice the samples the
Trainer counted (adv13b D5). ``ParallelismConfig`` needs GPUs, so the Trainer's sizes come from
the stub; the rule is read from the installed transformers and accelerate."""

from __future__ import annotations

import inspect
import re

import pytest

pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
accelerate_loader = pytest.importorskip("accelerate.data_loader")

from _hf_train import trainer_stub  # noqa: E402

from seqbalance.integrations.hf import balanced_train_dataloader  # noqa: E402


def _loader_of(rank: int, world: int, tp: int, cp: int = 1, sp: int = 1) -> list[list[int]]:
    dataset = [{"input_ids": list(range(3 + (7 * i) % 11))} for i in range(48)]
    trainer = trainer_stub(dataset, world_size=world, process_index=rank)
    trainer.get_tp_size, trainer.get_cp_size, trainer.get_sp_size = (
        lambda: tp,
        lambda: cp,
        lambda: sp,
    )
    loader = balanced_train_dataloader(trainer)
    try:
        return [list(batch) for batch in loader.batch_sampler]
    finally:
        loader.batch_sampler.close()


def _code_of(function: object) -> str:
    """``function``'s source without blanks, parentheses or line breaks: the rule read below
    then survives a reformatting of the library, not a change of what it computes."""
    return re.sub(r"[\s()\\]", "", inspect.getsource(function))


def test_the_installed_stacks_shard_data_over_the_data_parallel_ranks_only() -> None:
    counted = _code_of(transformers.Trainer.get_total_train_batch_size)
    assert "args.world_size//self.get_tp_size//self.get_cp_size//self.get_sp_size" in counted
    shard = _code_of(accelerate_loader.prepare_data_loader)
    assert "process_index=process_index//submesh_tp_size*submesh_cp_size" in shard


@pytest.mark.parametrize(("tp", "cp"), [(2, 1), (1, 2)])
def test_tensor_and_context_parallel_peers_get_the_same_batches(tp: int, cp: int) -> None:
    runs = [_loader_of(rank, 4, tp, cp) for rank in range(4)]
    assert runs[0] == runs[1] and runs[2] == runs[3]  # one TP / CP group each
    steps = len(runs[0])
    assert steps == 48 // (2 * 2)  # 2 data-parallel ranks x 2 samples per micro-batch
    for step in range(steps):
        both = runs[0][step] + runs[2][step]
        assert len(set(both)) == len(both) == 4  # the two replicas split the step's samples
    seen = sorted(i for run in (runs[0], runs[2]) for batch in run for i in batch)
    assert seen == list(range(48))


def test_sequence_parallelism_and_odd_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match=r"sequence parallelism \(sp_size = 2\)"):
        _loader_of(0, 4, 1, sp=2)
    with pytest.raises(ValueError, match=r"world_size 4 is not a multiple of tp_size x cp_size"):
        _loader_of(0, 4, 3)

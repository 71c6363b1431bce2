"""seqbalance.integrations.hf: the Trainer trains like stock and normalises by the step's tokens
(on 2 gloo processes, and resuming: test_integrations_hf_resume.py). Each run is
tests/scripts/hf_train.py (a tiny randomly initialised Llama on learnable sequences) in a
process of its own (``_hf_train.run``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from _hf_train import run

pytest.importorskip("torch")
pytest.importorskip("transformers", reason="the hf extra (transformers) is not installed")
pytest.importorskip("accelerate", reason="the hf extra (accelerate) is not installed")

from seqbalance.datasets import lengths_from_dataset


@pytest.fixture(scope="module")
def both(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One process: 6 steps of the stock Trainer, then 6 with seqbalance's sampler and its step
    0's token mean (one run serves the loss curve and the token mean: a process costs its
    start and the Trainer's set-up, the steps little)."""
    return run(tmp_path_factory.mktemp("hf"), "--mode", "both", "--manual-loss")


def test_loss_curve_matches_stock_within_noise(both: dict) -> None:
    stock, ours = both["stock"]["losses"], both["balanced"]["losses"]
    assert len(stock) == len(ours) == 6
    # Different sample order, same data and model: the curves agree to a few hundredths while
    # both fall by more than 0.8 nats over 6 steps.
    assert max(abs(a - b) for a, b in zip(stock, ours, strict=True)) < 0.1
    assert stock[0] - stock[-1] > 0.8 and ours[0] - ours[-1] > 0.8


def test_loss_is_the_token_mean_of_the_whole_step(both: dict) -> None:
    # The logged loss of step 0 (the initial weights) must equal the mean token loss over every
    # sample the plan put in that step (all micro-batches), however unequal the micro-batches
    # are. On 2 processes (all ranks): test_integrations_hf_resume.py, on the run it resumes.
    report = both["balanced"]
    assert report["world_size"] == 1
    assert report["losses"][0] == pytest.approx(report["manual_step0"], rel=1e-6)


def test_lengths_from_dataset_column() -> None:
    datasets = pytest.importorskip("datasets")
    table = datasets.Dataset.from_dict({"input_ids": [[1, 2, 3], [4], []], "length": [3, 1, 0]})
    assert lengths_from_dataset(table).tolist() == [3, 1, 0]
    assert lengths_from_dataset(table, "length").tolist() == [3, 1, 0]
    with pytest.raises(ValueError, match="columns: input_ids, length"):
        lengths_from_dataset(table, "text")
    assert lengths_from_dataset([{"input_ids": np.arange(5)}]).tolist() == [5]
    with pytest.raises(ValueError, match=r"dataset\[0\]\['input_ids'\] must be"):
        lengths_from_dataset([{"input_ids": "abc"}])


def test_trl_sft_trainer_padding_free(tmp_path: Path) -> None:
    pytest.importorskip("trl", reason="the hf extra (trl) is not installed")
    pytest.importorskip("datasets", reason="the hf extra (datasets) is not installed")
    both = run(tmp_path, "--mode", "both", "--trl")  # one process: stock, then balanced
    stock, ours = both["stock"]["losses"], both["balanced"]
    assert ours["layout"] == "packed"  # padding_free=True plans packed micro-batches
    assert max(abs(a - b) for a, b in zip(stock, ours["losses"], strict=True)) < 0.1
    assert ours["losses"][0] - ours["losses"][-1] > 0.8

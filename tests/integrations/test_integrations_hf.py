"""seqbalance.integrations.hf: the Trainer trains like stock, normalises by the step's tokens,
resumes exactly, on 1 and 2 (gloo) processes. Each run is a subprocess of tests/scripts/hf_train.py
(a tiny randomly initialised Llama on learnable sequences)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from _other_process import run_process_tree

pytest.importorskip("torch")
pytest.importorskip("transformers", reason="the hf extra (transformers) is not installed")
pytest.importorskip("accelerate", reason="the hf extra (accelerate) is not installed")

from seqbalance.datasets import lengths_from_dataset

SCRIPT = Path(__file__).parents[1] / "scripts" / "hf_train.py"
SRC = Path(__file__).resolve().parents[2] / "src"


def run(tmp_path: Path, *options: str, processes: int = 1) -> dict:
    launcher = [sys.executable]
    if processes > 1:
        launcher += [
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            str(processes),
        ]
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
    }
    done = run_process_tree(
        [*launcher, str(SCRIPT), "--output-dir", str(tmp_path), *options], timeout=300, env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :])


def test_loss_curve_matches_stock_within_noise(tmp_path: Path) -> None:
    stock = run(tmp_path / "stock", "--mode", "stock")["losses"]
    ours = run(tmp_path / "ours", "--mode", "balanced")["losses"]
    assert len(stock) == len(ours) == 6
    # Different sample order, same data and model: the curves agree to a few hundredths while
    # both fall by more than 0.8 nats over 6 steps.
    assert max(abs(a - b) for a, b in zip(stock, ours, strict=True)) < 0.1
    assert stock[0] - stock[-1] > 0.8 and ours[0] - ours[-1] > 0.8


@pytest.mark.parametrize("processes", [1, pytest.param(2, marks=pytest.mark.multiprocess)])
def test_loss_is_the_token_mean_of_the_whole_step(tmp_path: Path, processes: int) -> None:
    # lr = 0: the logged loss of step 0 must equal the mean token loss over every sample the plan
    # put in that step (all micro-batches, all ranks), however unequal the micro-batches are.
    report = run(
        tmp_path,
        "--mode",
        "balanced",
        "--steps",
        "1",
        "--lr",
        "0",
        "--manual-loss",
        processes=processes,
    )
    assert report["world_size"] == processes
    assert report["losses"][0] == pytest.approx(report["manual_step0"], rel=1e-6)


@pytest.mark.parametrize("processes", [1, pytest.param(2, marks=pytest.mark.multiprocess)])
def test_resume_is_exact(tmp_path: Path, processes: int) -> None:
    full = run(
        tmp_path / "full",
        "--mode",
        "balanced",
        "--steps",
        "4",
        "--save-steps",
        "2",
        processes=processes,
    )
    resumed = run(
        tmp_path / "resumed",
        "--mode",
        "balanced",
        "--steps",
        "4",
        "--resume",
        str(tmp_path / "full" / "checkpoint-2"),
        processes=processes,
    )
    assert resumed["param_sum"] == full["param_sum"]
    assert resumed["losses"] == full["losses"]
    state = json.loads((tmp_path / "full" / "checkpoint-2" / "seqbalance_sampler.json").read_text())
    assert state["consumed"] == 4 and state["setup"]["dp_size"] == processes


def test_resume_with_another_plan_fails_before_training(tmp_path: Path) -> None:
    """By path, and by ``resume_from_checkpoint=True`` (the newest checkpoint of output_dir):
    another data seed or max_tokens fails before training."""
    full = tmp_path / "full"
    run(full, "--mode", "balanced", "--steps", "2", "--save-steps", "2")
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    command = [sys.executable, str(SCRIPT), "--mode", "balanced", "--steps", "4"]
    for changed, output, resume, named in [
        (("--data-seed", "7"), tmp_path / "other", full / "checkpoint-2", "changed: seed"),
        (("--data-seed", "7"), full, "last", "changed: seed"),
        (("--max-tokens", "2048"), full, "last", "options.max_tokens (1024 saved, 2048 now)"),
    ]:
        done = subprocess.run(
            [*command, *changed, "--output-dir", str(output), "--resume", str(resume)],
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
        )
        assert done.returncode != 0
        assert f"resume from {full / 'checkpoint-2'}" in done.stderr, done.stderr[-2000:]
        assert named in done.stderr


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
    stock = run(tmp_path / "stock", "--mode", "stock", "--trl")["losses"]
    ours = run(tmp_path / "ours", "--mode", "balanced", "--trl")
    assert ours["layout"] == "packed"  # padding_free=True plans packed micro-batches
    assert max(abs(a - b) for a, b in zip(stock, ours["losses"], strict=True)) < 0.1
    assert ours["losses"][0] - ours["losses"][-1] > 0.8

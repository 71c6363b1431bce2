"""The closed loop's telemetry log given by a relative path (``Feedback(log="run.jsonl")``)
was opened again at every step by that relative path: once the process changed its working
directory (a launcher's ``chdir``, Hydra's ``hydra.job.chdir``) the next lines went to a new
file there, the log split over two files without a word (``seqbalance report`` read half a
run), or stopped where that folder could not take it (adv12c C6). The path is made absolute
when the loop starts."""

from __future__ import annotations

import json

from seqbalance.cost import TimeModel
from seqbalance.plan import PlanOptions
from seqbalance.runtime import Feedback
from seqbalance.runtime.closed_loop import AdaptivePlanner

OPTIONS = PlanOptions(cost=TimeModel(1e-3, 1e-6, 1e-10), max_tokens=4096)


def test_a_relative_log_path_keeps_one_file_across_a_change_of_directory(
    tmp_path, monkeypatch
) -> None:
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path)
    planner = AdaptivePlanner(2, OPTIONS, feedback=Feedback(log="run.jsonl"))
    for step in range(3):
        if step == 1:
            monkeypatch.chdir(tmp_path / "elsewhere")
        plan = planner.plan([100, 200, 300, 400])
        planner.observe(plan, [[0.01] * len(plan.ranks[r]) for r in range(2)])
    lines = (tmp_path / "run.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [0, 1, 2]
    assert not (tmp_path / "elsewhere" / "run.jsonl").exists()

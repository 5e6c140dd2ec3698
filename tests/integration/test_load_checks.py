"""benchmarks/load.py's checks can fail: a ledger a cent off its attempts' billed seconds x price, a datagram
of one job under another run's tags, a checkpoint of another job in a job's directory. (The load test
itself runs Airflow for minutes: ``make bench-smoke`` runs its ``--quick``, not this suite.)"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO / "benchmarks") not in sys.path:
    sys.path.insert(0, str(REPO / "benchmarks"))

from loadlab import checks  # noqa: E402 - benchmarks/ on sys.path first
from loadlab.runs import Run  # noqa: E402
from trainer.checkpoint.directory import CheckpointDir  # noqa: E402


def _run(job: str) -> Run:
    return Run("train_llama", f"load_x_{job}", {"job": job, "steps": 4}, job)


def _spend(home: Path, run: Run, entries: dict[str, dict]) -> None:
    root = CheckpointDir(checks.checkpoint_dir(home, run))
    for attempt, entry in entries.items():
        root.record_spend(
            attempt, {"capacity": "on_demand", "nodes": 1, "price_per_node_hour": 36.0, **entry}
        )


def test_the_ledger_check_holds_to_the_cent_and_names_a_run_a_cent_off(tmp_path):
    good, bad = _run("load-j0"), _run("load-j1")
    # 100 s and 50.5 s at $36/node-hour: $1.00 and $0.505
    _spend(tmp_path, good, {"a1": {"launched_at": 1000.0, "billed_s": 100.0, "dollars": 1.0},
                            "a2": {"launched_at": 2000.0, "billed_s": 50.5, "dollars": 0.505}})  # fmt: skip
    _spend(tmp_path, bad, {"a1": {"launched_at": 1000.0, "billed_s": 100.0, "dollars": 1.02}})
    problems, billed = checks.ledger_problems(tmp_path, [good, bad])
    assert billed["load_x_load-j0"] == (1.505, 150.5)
    assert len(problems) == 1 and problems[0].startswith("load_x_load-j1: ledger $1.0200"), problems


def test_a_datagram_of_another_job_under_a_run_is_named():
    a, b = _run("load-j0"), _run("load-j1")
    tags = "dag_id:train_llama,task_id:train_spot,map_index:-1"
    lines = [f"dtrain.train.loss:1.5|g|#{tags},run_id:{a.run_id},job:load-j0",
             f"dtrain.train.loss:1.4|g|#{tags},run_id:{b.run_id},job:load-j1"]  # fmt: skip
    # a sender that knows no job (a sweep's budget task) tags it "none": no job's, under any run
    unknown = [f"dtrain.budget.decision:1|c|#{tags},run_id:{r.run_id},job:none" for r in (a, b)]
    assert checks.metric_problems([*lines, *unknown], [a, b]) == []
    crossed = [*lines, f"dtrain.train.loss:1.3|g|#{tags},run_id:{b.run_id},job:load-j0"]
    problems = checks.metric_problems(crossed, [a, b])
    assert any("load-j0" in p and b.run_id in p for p in problems), problems
    assert checks.metric_problems([], [a, b]) == ["no datagram carried one of the runs' tags"]


def test_a_log_line_naming_another_jobs_directory_is_named(tmp_path):
    a, b = _run("load-j0"), _run("load-j1")
    logs = tmp_path / "logs" / "dag_id=train_llama" / f"run_id={a.run_id}" / "task_id=train_spot"
    logs.mkdir(parents=True)
    (logs / "attempt=1.log").write_text(f"saved {checks.checkpoint_dir(tmp_path, a)}/step-00000004\n")
    assert checks.log_problems(tmp_path, tmp_path / "groups", [a, b]) == []
    (logs / "attempt=1.log").write_text(f"resumed from {checks.checkpoint_dir(tmp_path, b)}/step-00000004\n")
    problems = checks.log_problems(tmp_path, tmp_path / "groups", [a, b])
    assert len(problems) == 1 and "load-j1" in problems[0], problems

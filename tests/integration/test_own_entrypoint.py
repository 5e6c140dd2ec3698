"""Your own training program under FSDPTrainOperator: examples/own_trainer/train.py on the local backend,
two real torchrun workers (gloo, CPU), preempted once, relaunched by the operator, resumed from its own
checkpoint, billed per attempt in the job's ledger; and SIGUSR1 / SIGTERM reaching every one of its
processes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from airflow_dtrain import FSDPTrainOperator
from airflow_dtrain.launchers.base import GroupState
from trainer.money.deadline import budget_deadline, repriced_deadline
from airflow_dtrain.launchers.local import LocalLauncher
from airflow_dtrain.job.spec import JobSpec
from trainer.checkpoint.directory import CheckpointDir
from tests.conftest import REPO, RecordingTI
from tests.integration.helpers import group_events, progress, wait_for, wait_for_step
from trainer.contract import latest_checkpoint
from trainer.validate import validate_checkpoint

pytestmark = pytest.mark.torchrun

EXAMPLE = str(REPO / "examples" / "own_trainer" / "train.py")
STEPS, EVERY, PREEMPT_AT = 12, 4, 6


def _train(tmp_path: Path, run_id: str, **overrides) -> tuple[dict, Path]:
    """Run the example through the operator to the end (synchronously): its summary and checkpoint dir."""
    ckpt = tmp_path / run_id / "ckpt"
    op = FSDPTrainOperator(**{
        "task_id": "train", "entrypoint": [EXAMPLE, "--lr", "1e-2"], "job": "own-mlp", "steps": STEPS,
        "checkpoint_every": EVERY, "num_nodes": 1, "procs_per_node": 2, "checkpoint_uri": str(ckpt),
        "local_state_dir": str(tmp_path / "groups"), "capacity": "spot", "price_per_node_hour": 36.0,
        "poll_interval": 0.5, "deferrable": False, **overrides,
    })  # fmt: skip
    return op.execute({"ti": RecordingTI(run_id=run_id)}), ckpt


def _manifest(checkpoint: str) -> dict:
    return json.loads((Path(checkpoint) / "manifest.json").read_text())


def test_your_program_is_preempted_relaunched_resumes_its_own_checkpoint_and_is_billed_per_attempt(tmp_path):
    summary, ckpt = _train(tmp_path, "preempted", simulate_preemption_at_step=PREEMPT_AT)

    # The operator relaunched the preempted group once and the job finished: nothing lost.
    assert summary["final_step"] == STEPS and summary["latest_checkpoint"] == str(ckpt / "step-00000012")
    assert summary["preemptions"] == 1 and summary["relaunches"] == 1 and summary["steps_lost"] == 0
    launcher = LocalLauncher(tmp_path / "groups")
    first, second = launcher.find("")
    status = launcher.status(first)
    assert status.state == GroupState.PREEMPTED and status.node_exit_codes == {0: 75}, status

    # The relaunch resumed from the checkpoint the preempted attempt saved at the step it was on.
    saved = _manifest(str(ckpt / f"step-{PREEMPT_AT:08d}"))
    assert saved["reason"] == "preemption" and saved["format"] == "torch" and saved["job"] == "own-mlp"
    resumed = group_events(tmp_path / "groups", second, "resume")  # its events file, not its group.log
    assert [e["from_step"] for e in resumed] == [PREEMPT_AT], resumed
    state = progress(ckpt)
    assert (state["status"], state["attempt"], state["resumed_from_step"]) == ("completed", 2, PREEMPT_AT)

    # ... and trained exactly what an uninterrupted run trains: the same weights, the same loss curve.
    reference, reference_ckpt = _train(tmp_path, "reference")
    assert reference["preemptions"] == 0
    final = _manifest(summary["latest_checkpoint"])
    assert final["params_sha256"] == _manifest(reference["latest_checkpoint"])["params_sha256"]
    assert state["history"] == progress(reference_ckpt)["history"]
    assert [s for s, _ in state["history"]] == list(range(1, STEPS + 1))

    # Its spend is in the job's ledger: one entry per attempt, each billed to its end.
    spend = {p.stem: json.loads(p.read_text()) for p in (ckpt / "spend").glob("*.json")}
    assert sorted(spend) == [first, second]
    assert all(e["ended"] and e["dollars"] > 0 and e["capacity"] == "spot" for e in spend.values()), spend
    ledger = CheckpointDir(str(ckpt)).ledger()
    assert ledger.total_dollars == pytest.approx(sum(e["dollars"] for e in spend.values()))
    assert summary["dollars"] == pytest.approx(ledger.total_dollars)
    assert ledger.step == STEPS and ledger.step_time_s and ledger.step_time_s > 0  # from its manifest

    # CheckpointValidationOperator's checks pass on it: its manifest and its files' hashes.
    report = validate_checkpoint(str(ckpt))
    assert report["step"] == STEPS and report["checks"]["files"]["count"] == 3  # model.pt, rank0.pt, rank1.pt
    assert report["checks"]["dcp_metadata"].startswith("skipped")


def test_your_program_is_stopped_at_the_dollar_cap_with_its_step_saved_and_the_spend_within_it(tmp_path):
    # $36 per node-hour is a cent a second. $0.45 buys 45 s: the supervisor stops the group 10 s (the final
    # save's grace) + 5 s (the exit's margin) before that, at 30 s after the launch, with nobody else
    # watching.
    budget, grace, margin = 0.45, 10, 5
    summary, ckpt = _train(
        tmp_path, "capped", entrypoint=[EXAMPLE, "--step-sleep", "0.3"], steps=100_000, budget_usd=budget,
        config={"checkpoint": {"grace_period_s": grace}, "cost": {"stop_margin_s": margin}},
    )  # fmt: skip
    assert summary["stopped"] == "budget", summary
    assert "dollar cap by its supervisor" in summary["budget_stop"]["reason"]
    assert "deadline=30" in summary["budget_stop"]["reason"]
    [group] = LocalLauncher(tmp_path / "groups").find("")  # stopped, not relaunched
    assert LocalLauncher(tmp_path / "groups").status(group).state == GroupState.AT_BUDGET
    # every rank saved the step it was on: the next run of the job starts from there
    last = latest_checkpoint(str(ckpt))
    assert last.step > EVERY and _manifest(last.path)["reason"] == "preemption"
    assert progress(ckpt)["step"] == last.step
    # what the ledger bills (from the launch until the group's end was seen) is within the cap
    ledger = CheckpointDir(str(ckpt)).ledger()
    assert 0.25 < ledger.total_dollars <= budget, ledger
    assert summary["dollars"] == pytest.approx(ledger.total_dollars)


def test_checkpoint_now_and_stop_reach_every_process_of_your_program(tmp_path):
    ckpt = tmp_path / "ckpt"
    spec = JobSpec.from_arguments(
        entrypoint=[EXAMPLE, "--step-sleep", "0.2"], steps=100_000, num_nodes=1, procs_per_node=2,
        checkpoint_uri=str(ckpt),
    )  # fmt: skip
    launcher = LocalLauncher(tmp_path / "groups")
    name = "own-signals-r0"
    launcher.launch(name, spec)
    try:
        wait_for_step(ckpt, 3)
        assert launcher.checkpoint_now(name) == 2  # both workers, not their agent

        saved = wait_for(lambda: latest_checkpoint(str(ckpt)), 120, "the checkpoint-now save")
        assert _manifest(saved.path)["reason"] == "checkpoint_now"
        wait_for_step(ckpt, saved.step + 2)  # and training goes on
        log = lambda: (tmp_path / "groups" / name / "group.log").read_text()  # noqa: E731
        wait_for(lambda: all(f"rank {r}: SIGUSR1" in log() for r in (0, 1)), 30, "both ranks to see SIGUSR1")

        status = launcher.stop(name, grace_period_s=60)
        assert status.state == GroupState.STOPPED, status
        last = latest_checkpoint(str(ckpt))
        assert last.step > saved.step and _manifest(last.path)["reason"] == "preemption"
        assert progress(ckpt)["status"] == "preempted"
        assert launcher.processes(name) == []
    finally:
        launcher.stop(name, grace_period_s=5)


def test_a_budget_deadline_moved_later_is_the_one_the_supervisor_stops_the_group_at(tmp_path):
    """$36/node-h is a cent a second: $0.06 buys 6 s, so the launch deadline is 3 s (2 s grace, 1 s margin).
    A later one written while the group runs (``move_deadline``: it spent less than its launch assumed) is
    the one its supervisor keeps; an earlier one is still taken (a spot price rise)."""
    spec = JobSpec.from_arguments(
        entrypoint=[EXAMPLE, "--step-sleep", "0.3"], job="own-mlp", steps=100_000, num_nodes=1,
        procs_per_node=1, checkpoint_uri=str(tmp_path / "ckpt"), price_per_node_hour=36.0, budget_usd=0.06,
        config={"checkpoint": {"grace_period_s": 2}, "cost": {"stop_margin_s": 1}},
    )  # fmt: skip
    launcher = LocalLauncher(tmp_path / "groups")
    launcher.launch("moved", spec)
    launched = budget_deadline(spec)
    assert launched["seconds"] == 3
    later = repriced_deadline(launched, spent_usd=0.0, price=24.0, elapsed_s=0.0)  # 9 s, less 3: 6 s
    assert launcher.move_deadline("moved", later) == 3
    assert launcher.move_deadline("moved", {**later, "seconds": 7}) is None  # under DEADLINE_STEP_S later
    status = wait_for(lambda: (s := launcher.status("moved")).state.terminal and s, 90, "its end")

    assert status.state == GroupState.AT_BUDGET, status
    assert "deadline=6 (set 0s after the launch" in status.message, status.message
    group = json.loads((tmp_path / "groups" / "moved" / "group.json").read_text())
    ran = (
        json.loads((tmp_path / "groups" / "moved" / "result.json").read_text())["finished_at"]
        - group["created_at"]
    )
    assert ran >= 6, ran  # not stopped at the launch deadline, 3 s

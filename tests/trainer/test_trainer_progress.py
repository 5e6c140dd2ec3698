"""progress.json as the operator and the evaluation report read it: valid JSON after every
step, the loss history thinned evenly past HISTORY_POINTS, and carried over a resume."""

import json

from trainer.report.progress import HISTORY_POINTS, Progress


def read(tmp_path):
    return json.loads((tmp_path / "progress.json").read_text())


def test_every_step_rewrites_a_valid_file_and_a_long_run_keeps_its_whole_curve(tmp_path):
    steps = 3 * HISTORY_POINTS
    progress = Progress(str(tmp_path), steps, enabled=True)
    progress.start(None, None, 0)
    for step in range(1, steps + 1):
        progress.update(step=step, loss=10.0 / step, tokens_seen=step * 64, flush=step % 10 == 0)
        if step in (1, 7, HISTORY_POINTS + 1, steps):
            on_disk = read(tmp_path)
            assert (on_disk["step"], on_disk["tokens_seen"], on_disk["status"]) == (
                step,
                step * 64,
                "running",
            )
            assert on_disk["history"] == progress.history  # what the file says is what was recorded
    history = read(tmp_path)["history"]
    assert len(history) <= HISTORY_POINTS
    assert history[0][0] == 1 and history[-1][0] == steps  # the whole run, start to end
    interior = {b[0] - a[0] for a, b in zip(history[1:-1], history[2:-1])}
    assert interior == {4}, interior  # evenly sampled: every 4th step after the stride doubled twice
    assert history[-1][1] == round(10.0 / steps, 6)


def test_a_resume_keeps_the_history_up_to_its_checkpoint_and_counts_the_lost_steps(tmp_path):
    first = Progress(str(tmp_path), 50, enabled=True)
    first.start(None, None, 0)
    for step in range(1, 31):
        first.update(step=step, loss=float(step), tokens_seen=step)
    # killed at step 30; the newest checkpoint is step 20
    second = Progress(str(tmp_path), 50, enabled=True)
    second.start(20, "/ckpt/step-00000020", 20)
    second.update(step=21, loss=-1.0, lr=3e-4, tokens_seen=21)
    on_disk = read(tmp_path)
    assert [p[0] for p in on_disk["history"]] == list(range(1, 22))  # 21..30 of the lost attempt are gone
    assert on_disk["history"][-1][:3] == [21, -1.0, 3e-4] and on_disk["history"][-1][3] > 1.7e9  # + unix time
    # the report's markers: where the first attempt ended (it never said completed) and where the second
    # resumed
    assert [(e["kind"], e["step"]) for e in on_disk["events"]] == [("preempted", 30), ("relaunch", 20)]
    second.update(latest_checkpoint="/ckpt/step-00000021", checkpoint_step=21)
    assert read(tmp_path)["events"][-1]["kind"] == "checkpoint" and read(tmp_path)["events"][-1]["step"] == 21
    assert (on_disk["attempt"], on_disk["steps_lost"], on_disk["resumed_from_step"]) == (2, 10, 20)

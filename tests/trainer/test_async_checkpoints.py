"""Async checkpoints on the torch this suite runs with (``make test-torch-min``: the lowest supported).

torch 2.11's DCP stager broke at the second async save of a run (``KeyError: <class 'type'>``),
killing the default config; the trainer now hands DCP only tensors and plain values and, on
such a torch, a stager that keeps its host buffers from one save to the next
(trainer.checkpoint.state.new_stager).
"""

from __future__ import annotations

import json

import pytest
import torch

from tests.trainer.conftest import FAST, FAST_DEFAULTS, run_trainer
from trainer.testing.faults import activate as activate_faults


def test_three_async_saves_in_one_run_and_a_bitwise_resume_from_the_last(data_dir, tmp_path):
    ckpt = tmp_path / "ckpt"
    args = [
        *FAST,
        "--checkpoint-uri",
        str(ckpt),
        "--checkpoint-every",
        "2",
        "--set",
        "checkpoint.async_save=true",
    ]
    first = run_trainer([*args, "--steps", "7"], data_dir, nproc=2)
    assert first.returncode == 0, first
    saves = [(e["step"], e["reason"]) for e in first.of("checkpoint")]
    assert saves == [(2, "interval"), (4, "interval"), (6, "interval"), (7, "final")], (
        torch.__version__,
        first,
    )
    assert all(e["blocked_s"] < e["seconds"] for e in first.of("checkpoint")[:3]), (
        "the interval saves ran async"
    )
    assert [e["async"] for e in first.of("checkpoint")] == [True, True, True, False]

    # Take away the final (synchronous) save: the next run must resume from the last async one
    # and continue exactly as the first run did (RNG, optimizer and data position all restored).
    (ckpt / "step-00000007" / "manifest.json").unlink()
    second = run_trainer([*args, "--steps", "7"], data_dir, nproc=2)
    assert second.returncode == 0, second
    [resume] = second.of("resume")
    assert resume["from_step"] == 6
    assert second.losses()[7] == first.losses()[7], f"torch {torch.__version__}: the resumed step 7 differs"


def test_unset_async_save_is_sync_on_a_cpu_node(data_dir, tmp_path):
    """Unset (auto), the interval saves of a CPU-only run are synchronous: there the background save takes
    the training threads' cores and costs more than a sync save (benchmarks/RESULTS.md). On a GPU they are
    async."""
    from trainer.checkpoint.checkpointer import Checkpointer
    from trainer.config.sections import CheckpointConfig

    run = run_trainer(
        [
            *FAST_DEFAULTS,
            "--checkpoint-uri",
            str(tmp_path / "ckpt"),
            "--checkpoint-every",
            "2",
            "--steps",
            "4",
        ],
        data_dir,
    )
    assert run.returncode == 0, run
    assert [(e["step"], e["async"]) for e in run.of("checkpoint")] == [(2, False), (4, False)]

    cfg = CheckpointConfig(uri=str(tmp_path / "c2"))
    kw = dict(flavor="debug", config={}, config_hash="0", rank=0, world_size=1)
    assert Checkpointer(cfg, device=torch.device("cuda"), **kw).async_save is True
    assert Checkpointer(cfg, device=torch.device("cpu"), **kw).async_save is False
    assert Checkpointer(CheckpointConfig(uri=str(tmp_path / "c3"), async_save=True), **kw).async_save is True


def test_a_save_slower_than_the_interval_says_what_it_cost_and_how_to_set_the_interval(data_dir, tmp_path):
    """Step 2's commit is held 10 s (the test hook), with a save every 2 steps: step 4's save must wait for
    it.
    Each checkpoint event says what the save cost training (cost_s = blocked_s + overlap_s, the overlapped
    steps' slowdown), the save that waited says how long, and the log says that the interval is shorter than
    a save, and which interval is not."""
    args = [*FAST, "--checkpoint-uri", str(tmp_path / "ckpt"), "--checkpoint-every", "2", "--steps", "6"]
    run = run_trainer(args, data_dir, env=activate_faults({"DTRAIN_TEST_COMMIT_DELAY": "2:10"}))
    assert run.returncode == 0, run
    saves = {e["step"]: e for e in run.of("checkpoint")}
    assert sorted(saves) == [2, 4, 6], run
    assert saves[2]["waited_s"] == 0 and saves[4]["waited_s"] > 1, saves
    assert saves[4]["blocked_s"] >= saves[4]["waited_s"], saves[4]
    # step 2's save was in flight through steps 3 and 4; the final save is synchronous: all of it blocked
    assert saves[2]["overlap_steps"] == 2 and saves[6]["overlap_steps"] == 0, saves
    assert saves[6]["overlap_s"] == 0 and saves[6]["cost_s"] == saves[6]["blocked_s"], saves[6]
    for e in saves.values():
        assert e["overlap_s"] >= 0 and abs(e["cost_s"] - e["blocked_s"] - e["overlap_s"]) <= 0.002, e
    # progress.json (the report's "time the saves took from training") sums what each save cost
    progress = json.loads((tmp_path / "ckpt" / "progress.json").read_text())
    assert progress["checkpoint_cost_s"] == pytest.approx(sum(e["cost_s"] for e in saves.values()), abs=0.005)
    [warning] = [line for line in run.stderr.splitlines() if "this save waited" in line]
    assert "for the save of step 2 to commit" in warning and "checkpoint.every=2 steps" in warning, warning
    suggested = int(warning.rsplit("checkpoint.every >= ", 1)[1].split()[0])
    assert suggested > 2, warning


def test_every_save_of_a_run_reuses_the_host_buffers_of_the_first():
    """The trainer's stager copies each save into the host buffers the first save allocated (pinned on a
    GPU), with the new values. On torch 2.11 DCP's own DefaultStager dropped them after every save (and then
    failed at the next): on an H100 the first step after each async save of a 14 GB state waited 5-11 s for
    them to be allocated and pinned again."""
    from trainer.checkpoint.state import new_stager

    params = {"w": torch.arange(1024, dtype=torch.float32), "b": torch.ones(16)}
    stager = new_stager(cuda=False)
    try:
        first = stager.stage({"model": params}).result()
        pointers = {k: t.data_ptr() for k, t in first["model"].items()}
        params["w"].mul_(2)
        second = stager.stage({"model": params}).result()
        third = stager.stage({"model": params}).result()
    finally:
        stager.close()
    assert {k: t.data_ptr() for k, t in second["model"].items()} == pointers, torch.__version__
    assert {k: t.data_ptr() for k, t in third["model"].items()} == pointers
    assert torch.equal(third["model"]["w"], torch.arange(1024, dtype=torch.float32) * 2), (
        "the new values are copied"
    )
    assert all(t.data_ptr() != params[k].data_ptr() for k, t in third["model"].items()), (
        "a copy, not the tensor"
    )

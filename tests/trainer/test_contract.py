"""trainer/contract.py, the helpers of a training program of your own: what they write is what the
operator, the ledger and CheckpointValidationOperator read; and the copy of the layout they keep agrees
with the house's."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainer import contract

from trainer.checkpoint import directory as checkpoint_dir, lease_files, spend_files

from trainer.config import job_config as config
from trainer.checkpoint.directory import CheckpointDir
from trainer.checkpoint.errors import CheckpointInvalid
from trainer.contract import (
    Fenced,
    JobEnv,
    commit_checkpoint,
    job_env,
    latest_checkpoint,
    progress,
    step_path,
    take_lease,
)
from trainer.validate import validate_checkpoint
from trainer.elastic.workers import AGENT_PID_ENV

REPO = Path(__file__).resolve().parents[2]


def _env(tmp_path: Path, **overrides) -> JobEnv:
    values = {"checkpoint_uri": str(tmp_path / "ckpt"), "steps": 10, "attempt": "job-r0"}
    return JobEnv(**{**values, **overrides})


def _save(uri: str, step: int, payload: bytes = b"weights", **fields) -> str:
    path = step_path(uri, step, create=True)
    Path(path, "model.pt").write_bytes(payload)
    Path(path, "rank1.pt").write_bytes(payload[::-1])
    return commit_checkpoint(uri, step, world_size=2, **fields)


def test_the_copied_layout_and_exit_codes_are_the_houses():
    """contract.py spells them itself (so it can be copied without the package): they must not drift."""
    assert (contract.MANIFEST, contract.PROGRESS, contract.SPEND, contract.LEASES, contract.BEST) == (
        checkpoint_dir.MANIFEST,
        checkpoint_dir.PROGRESS,
        spend_files.SPEND,
        lease_files.LEASES,
        checkpoint_dir.BEST,
    )
    assert contract._step_dir_name(50) == checkpoint_dir.step_dir_name(50)
    assert contract.LEASE_FILE.pattern == lease_files.LEASE_FILE.pattern
    assert contract.STEP_DIR.pattern == checkpoint_dir.STEP_DIR.pattern
    assert (contract.PREEMPTED_EXIT_CODE, contract.STORAGE_EXIT_CODE, contract.BUDGET_EXIT_CODE,
            contract.FENCED_EXIT_CODE) == (config.PREEMPTED_EXIT_CODE, config.STORAGE_EXIT_CODE,
                                           config.BUDGET_EXIT_CODE, config.FENCED_EXIT_CODE)  # fmt: skip


def test_the_contract_imports_nothing_but_the_standard_library(tmp_path):
    """Copied next to a program (with contract_files.py, its file side), it works without this package or any
    other (no site-packages at all)."""
    for name in ("contract.py", "contract_files.py"):
        (tmp_path / name).write_text((REPO / "trainer" / name).read_text())
    code = (
        f"import sys; sys.path.insert(0, {str(tmp_path)!r}); import contract; "
        f"print(contract.latest_checkpoint({str(tmp_path)!r}), "
        "contract.job_env({'DTRAIN_STEPS': '3'}).steps)"
    )
    out = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "None 3"


def test_job_env_reads_what_the_operator_sets_and_names_a_bad_variable(tmp_path):
    env = job_env({"DTRAIN_CHECKPOINT_URI": "/ckpt", "DTRAIN_JOB": "llm", "DTRAIN_STEPS": "500",
                   "DTRAIN_CHECKPOINT_EVERY": "50", "DTRAIN_GRACE_PERIOD_S": "240",
                   "DTRAIN_GROUP_NAME": "g-r1",
                   "RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4"})  # fmt: skip
    assert env == JobEnv(
        checkpoint_uri="/ckpt",
        steps=500,
        job="llm",
        checkpoint_every=50,
        grace_period_s=240.0,
        simulate_preemption_at_step=0,
        attempt="g-r1",
        rank=3,
        local_rank=1,
        world_size=4,
    )
    assert [s for s in range(1, 501) if env.checkpoint_due(s)] == list(range(50, 501, 50))
    with pytest.raises(ValueError, match=r"DTRAIN_STEPS: expected an integer, got 'lots'"):
        job_env({"DTRAIN_STEPS": "lots"})
    with pytest.raises(ValueError, match=r"DTRAIN_STEPS: not set"):
        job_env({})
    with pytest.raises(ValueError, match=r"DTRAIN_SIMULATE_PREEMPTION_AT_STEP: must be >= 0, got '-1'"):
        job_env({"DTRAIN_STEPS": "5", "DTRAIN_SIMULATE_PREEMPTION_AT_STEP": "-1"})


def test_a_committed_checkpoint_is_what_every_reader_of_the_directory_takes_for_one(tmp_path):
    uri = str(tmp_path / "ckpt")
    path = _save(uri, 4, tokens_seen=256, step_time_s=0.5, config_hash="abc")
    # an interrupted save above it: files, no manifest
    Path(step_path(uri, 8, create=True), "model.pt").write_bytes(b"half")

    assert latest_checkpoint(uri) == (4, path)
    root = CheckpointDir(uri)
    assert root.latest() == (4, path)
    manifest = root.checked_manifest(4)  # the budget task's and the validation's first checks
    assert manifest["format"] == "torch" and manifest["world_size"] == 2 and manifest["tokens_seen"] == 256
    ledger = root.ledger()
    assert (ledger.step, ledger.step_time_s) == (4, 0.5)  # the relaunch decision's step time

    report = validate_checkpoint(uri)
    assert report["checks"]["files"] == {"count": 2, "bytes": 14}
    assert report["checks"]["dcp_metadata"].startswith("skipped: format 'torch'")


def test_validation_finds_a_corrupted_file_of_your_checkpoint(tmp_path):
    uri = str(tmp_path / "ckpt")
    _save(uri, 4)
    path = _save(uri, 8)
    Path(path, "rank1.pt").write_bytes(b"xthgiew")  # same size, other bytes

    with pytest.raises(CheckpointInvalid, match=r"check 'checksum' failed for rank1.pt: sha256"):
        validate_checkpoint(uri)
    assert validate_checkpoint(uri, fallback_to_valid=True)["step"] == 4


def test_a_dcp_format_checkpoint_gets_the_dcp_checks(tmp_path):
    uri = str(tmp_path / "ckpt")
    _save(uri, 4, format="dcp")  # says dcp, holds no DCP metadata
    with pytest.raises(CheckpointInvalid, match=r"check 'dcp_metadata' failed for .metadata"):
        validate_checkpoint(uri)


def test_retention_keeps_the_newest_and_the_best(tmp_path):
    uri = str(tmp_path / "ckpt")
    for step in (2, 4, 6):
        _save(uri, step)
    CheckpointDir(uri).mark_best(2)
    Path(step_path(uri, 7, create=True), "model.pt").write_bytes(b"interrupted")
    _save(uri, 8, keep=2)
    assert [c.step for c in CheckpointDir(uri).step_dirs()] == [2, 6, 8]


def test_a_writer_fenced_off_by_a_newer_lease_commits_nothing(tmp_path):
    uri = str(tmp_path / "ckpt")
    mine = take_lease(uri, job="llm")
    _save(uri, 2, lease=mine)
    newer = take_lease(uri, job="llm")  # a retry started while this group still ran
    assert newer == mine + 1 and CheckpointDir(uri).newest_lease().token == newer
    with pytest.raises(
        Fenced, match=rf"writer lease {newer} is newer than this one's {mine}; step 4 is not committed"
    ):
        _save(uri, 4, lease=mine)
    assert latest_checkpoint(uri).step == 2
    assert CheckpointDir(uri).manifest(2)["lease"] == mine


def test_progress_carries_the_counters_over_attempts_as_the_operator_reads_them(tmp_path):
    first = _env(tmp_path, attempt="job-r0")
    progress(0, env=first)
    for step in range(1, 6):
        progress(step, loss=1.0 / step, tokens_seen=step * 64, env=first)
    progress(5, status="preempted", latest_checkpoint="/ckpt/step-00000004", env=first)
    read = CheckpointDir(first.checkpoint_uri).progress()
    assert (read["status"], read["step"], read["steps"], read["attempt"]) == ("preempted", 5, 10, 1)

    second = _env(tmp_path, attempt="job-r1")
    progress(4, tokens_seen=256, env=second)  # resumed from step 4: step 5 is trained again
    for step in range(5, 11):
        progress(step, loss=1.0 / step, env=second)
    progress(10, status="completed", env=second)
    read = CheckpointDir(first.checkpoint_uri).progress()
    assert (read["status"], read["step"], read["attempt"], read["resumed_from_step"], read["steps_lost"]) == (
        "completed",
        10,
        2,
        4,
        1,
    )
    assert [s for s, _ in read["history"]] == list(range(1, 11))  # step 5 once: the retrained one
    assert read["latest_checkpoint"] == "/ckpt/step-00000004" and read["wall_time_s"] >= 0

    assert progress(3, env=_env(tmp_path, rank=1)) is None  # only rank 0 writes


def test_progress_bills_the_attempts_spend_file_the_operator_opened_and_never_a_closed_one(tmp_path):
    env = _env(tmp_path, attempt="job-r0")
    root = CheckpointDir(env.checkpoint_uri)
    launched = time.time() - 3600  # an hour ago, on 2 nodes at $1.50/node-hour
    opened = {"capacity": "spot", "nodes": 2, "price_per_node_hour": 1.5, "gpus_per_node": 8,
              "launched_at": launched,
              "billed_s": 0.0, "node_hours": 0.0, "gpu_hours": 0.0, "dollars": 0.0}  # fmt: skip
    root.record_spend("job-r0", opened)
    progress(1, step_time_s=0.25, env=env)
    entry = root.spend_entry("job-r0")
    assert entry["dollars"] == pytest.approx(3.0, rel=1e-3) and entry["gpu_hours"] == pytest.approx(
        16, rel=1e-3
    )
    assert entry["step_time_s"] == 0.25
    assert root.spend().total_dollars == pytest.approx(3.0, rel=1e-3)

    root.record_spend("job-r0", {**entry, "dollars": 1.0, "ended": True})
    progress(2, status="completed", env=env)
    assert root.spend_entry("job-r0")["dollars"] == 1.0


def test_progress_bills_an_elastic_group_over_its_recorded_sizes(tmp_path):
    env = _env(tmp_path, attempt="job-r0")
    root = CheckpointDir(env.checkpoint_uri)
    launched = time.time() - 3600  # 2 nodes for 30 min, then 1 node, at $1.50/node-hour: $2.25, not $3
    opened = {"capacity": "spot", "nodes": 2, "price_per_node_hour": 1.5, "launched_at": launched,
              "node_changes": [[launched, 2], [launched + 1800, 1]], "dollars": 3.0}  # fmt: skip
    root.record_spend("job-r0", opened)
    progress(1, env=env)
    assert root.spend_entry("job-r0")["dollars"] == pytest.approx(2.25, rel=1e-3)


def test_helpers_refuse_what_they_cannot_write(tmp_path):
    with pytest.raises(ValueError, match=r"local paths and file:// only, got 's3://b/run'"):
        latest_checkpoint("s3://b/run")
    assert latest_checkpoint(f"file://{tmp_path}") is None
    with pytest.raises(FileNotFoundError, match="write the step's files first"):
        commit_checkpoint(str(tmp_path), 3)


SIGNALS = """
import os, signal, sys, time
sys.path.insert(0, sys.argv[1])
from contract import Signals
s = Signals()
os.kill(os.getpid(), signal.SIGUSR1)
time.sleep(0.1)
print("usr1", s.requested, s.take_checkpoint_now(), s.checkpoint_now, s.stop, flush=True)
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(0.1)
print("term", s.requested, s.stop, flush=True)
s.ignore_further()
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(0.1)
sys.exit(75)
"""


def test_signals_set_flags_instead_of_killing_the_process(tmp_path):
    out = subprocess.run([sys.executable, "-c", SIGNALS, str(REPO / "trainer")], capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    assert out.returncode == 75, out.stderr  # not killed by SIGUSR1's or SIGTERM's default action
    assert out.stdout.split("\n")[:2] == ["usr1 True True False False", "term True True"]


def test_simulate_preemption_stops_once_and_not_after_a_resume_past_it(tmp_path, monkeypatch):
    sent = []
    monkeypatch.setattr(os, "kill", lambda pid, sig: sent.append((pid, sig)))
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "g-r0")
    monkeypatch.delenv(AGENT_PID_ENV, raising=False)
    env = _env(tmp_path, simulate_preemption_at_step=5)

    class Flags:
        stop = False

    assert not contract.simulate_preemption(4, env=env)
    assert contract.simulate_preemption(5, signals=Flags, env=env) and Flags.stop
    assert sent == [(os.getppid(), signal.SIGTERM)]  # the torchrun agent, which forwards it to every worker
    assert not contract.simulate_preemption(5, resumed_from=5, env=env)
    assert not contract.simulate_preemption(5, env=_env(tmp_path, simulate_preemption_at_step=5, rank=1))
    assert len(sent) == 1
    # forked from the agent's fork server (trainer.launch), the parent is not the agent: its pid is given
    monkeypatch.setenv(AGENT_PID_ENV, "4242")
    assert contract.simulate_preemption(5, env=env) and sent[-1] == (4242, signal.SIGTERM)


def test_the_documented_environment_is_the_one_the_launchers_set():
    """docs/own_training_code.md and the contract's docstring list the variables agent_env sets."""
    from airflow_dtrain.launchers.torchrun import agent_env
    from airflow_dtrain.job.spec import JobSpec

    spec = JobSpec.from_arguments(steps=40, checkpoint_every=10, simulate_preemption_at_step=20, job="llm",
                                  checkpoint_uri="/ckpt", entrypoint=["/opt/train.py"])  # fmt: skip
    env = agent_env(spec)
    contract_vars = {k: v for k, v in env.items() if k.startswith("DTRAIN_")}
    assert contract_vars == {"DTRAIN_CHECKPOINT_URI": "/ckpt", "DTRAIN_JOB": "llm", "DTRAIN_STEPS": "40",
                             "DTRAIN_CHECKPOINT_EVERY": "10", "DTRAIN_GRACE_PERIOD_S": "110",
                             "DTRAIN_SIMULATE_PREEMPTION_AT_STEP": "20"}  # fmt: skip
    read = job_env({**contract_vars, "DTRAIN_GROUP_NAME": "g-r0"})
    assert (read.checkpoint_uri, read.steps, read.checkpoint_every, read.simulate_preemption_at_step) == (
        "/ckpt",
        40,
        10,
        20,
    )
    docs = (REPO / "docs" / "own_training_code.md").read_text()
    for name in [*contract_vars, "DTRAIN_GROUP_NAME"]:
        assert name in contract.__doc__ and name in docs, name
    assert "DTRAIN_SIMULATE_PREEMPTION_AT_STEP" not in agent_env(
        JobSpec.from_arguments(checkpoint_uri="/ckpt")
    )
    # the statsd tags FSDPTrainOperator puts in the config (the task instance and the job) reach the program
    # too
    tags = "dag_id:d,run_id:manual__2026-01-01T00:00:00+00:00,task_id:t,map_index:-1,job:llm"
    tagged = agent_env(
        JobSpec.from_arguments(checkpoint_uri="/ckpt", config={"metrics": {"statsd_tags": tags}})
    )
    assert tagged["DTRAIN_STATSD_TAGS"] == tags
    assert "DTRAIN_STATSD_TAGS" in contract.__doc__ and "DTRAIN_STATSD_TAGS" in docs

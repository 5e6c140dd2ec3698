"""An s3:// round trip against a real S3 API on 127.0.0.1 (moto in server mode, spoken to by s3fs
over HTTP): train -> preempted -> resume -> complete, then the provider reads progress, the cost
ledger and validates the checkpoint through the same endpoint settings."""

import contextlib
import socket

import pytest
import torch

from conftest import BUCKET, FAST, load_checkpoint_tensors, run_trainer


def _gauges(sock) -> list[str]:
    sock.setblocking(False)
    out = []
    with contextlib.suppress(BlockingIOError):
        while True:
            out.append(sock.recv(1024).decode())
    sock.close()
    return out


def _preempted_first_attempt(uri: str, common: list[str], data_dir: str):
    """Attempt 1 on spot capacity, preempted at step 3: its checkpoints, progress and spot ledger."""
    from airflow_dtrain.operators.fsdp_train import read_progress
    from trainer.checkpoint.directory import CheckpointDir

    first = run_trainer(
        [
            *common,
            "--set",
            "simulate_preemption_at_step=3",
            "--set",
            "cost.capacity_type=spot",
            "--set",
            "cost.price_per_node_hour=3600",
            "--set",
            "cost.gpus_per_node=8",
        ],
        data_dir,
    )
    assert first.returncode == 75, first
    assert [(e["step"], e["reason"]) for e in first.of("checkpoint")] == [(2, "interval"), (3, "preemption")]
    progress = read_progress(uri)  # the provider's own reader, same endpoint settings
    assert (progress["status"], progress["step"], progress["latest_checkpoint"]) == (
        "preempted",
        3,
        f"{uri}/step-00000003",
    )
    spot = CheckpointDir(uri).ledger()
    assert spot.step == 3 and spot.by_capacity["spot"]["node_hours"] > 0
    assert spot.total_dollars == pytest.approx(spot.by_capacity["spot"]["node_hours"] * 3600, rel=1e-3)
    assert spot.by_capacity["spot"]["gpu_hours"] == pytest.approx(
        spot.by_capacity["spot"]["node_hours"] * 8, rel=1e-3
    )
    assert spot.step_time_s and spot.step_time_s > 0
    return spot


def _resumed_second_attempt(uri: str, common: list[str], data_dir: str):
    """Attempt 2 on on-demand capacity resumes from step 3 and completes; returns its statsd socket."""
    from airflow_dtrain.operators.fsdp_train import read_progress

    statsd = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    statsd.bind(("127.0.0.1", 0))
    second = run_trainer(
        [
            *common,
            "--set",
            "cost.capacity_type=on_demand",
            "--set",
            "cost.price_per_node_hour=7200",
            "--set",
            "metrics.statsd_host=127.0.0.1",
            "--set",
            f"metrics.statsd_port={statsd.getsockname()[1]}",
        ],
        data_dir,
    )
    assert second.returncode == 0, second
    assert second.of("resume")[0] == {"event": "resume", "from_step": 3, "path": f"{uri}/step-00000003"}
    progress = read_progress(uri)
    assert (progress["status"], progress["step"], progress["attempt"], progress["steps_lost"]) == (
        "completed",
        6,
        2,
        0,
    )
    return statsd


def _assert_retention_and_leases(fs, uri: str) -> None:
    """What the two attempts left on S3, and whose lease committed what."""
    # Retention on S3: the last 2; nothing half-written left behind.
    names = sorted(p.rsplit("/", 1)[-1] for p in fs.ls(f"{BUCKET}/runs/r1", detail=False))
    assert names == ["lease", "progress.json", "spend", "step-00000004", "step-00000006"]
    # Each attempt took a writer lease of its own (a conditional PUT); the second one committed the last two.
    from trainer.checkpoint.directory import CheckpointDir

    root = CheckpointDir(uri)
    assert root.leases() == [1, 2]
    assert [root.manifest(s)["lease"] for s in (4, 6)] == [2, 2]


def _assert_ledger_and_live_spend(uri: str, spot, statsd):
    """The ledger across both attempts, and the live spend gauges; returns the final ledger."""
    from trainer.checkpoint.directory import CheckpointDir

    # The ledger carried the spot spend over and added the on-demand attempt.
    ledger = CheckpointDir(uri).ledger()
    assert ledger.step == 6
    assert ledger.by_capacity["spot"] == spot.by_capacity["spot"]
    assert ledger.by_capacity["on_demand"]["dollars"] > 0
    assert ledger.total_dollars == pytest.approx(
        spot.total_dollars + ledger.by_capacity["on_demand"]["dollars"], rel=1e-4
    )
    dollars = [
        float(g.split(":")[1].split("|")[0]) for g in _gauges(statsd) if g.startswith("dtrain.cost.dollars:")
    ]
    # live spend, as the budget counts it: from what the first attempt spent (up to its exit, past its
    # checkpoint) it grows; the last one is sent after the final commit, just before the spend file's last
    # write
    assert dollars == sorted(dollars) and spot.total_dollars < dollars[0]
    assert (
        dollars[-1] == pytest.approx(ledger.total_dollars, rel=0.05) and dollars[-1] <= ledger.total_dollars
    )
    return ledger


def _assert_same_weights_as_a_local_run(fs, data_dir: str, tmp_path):
    """Returns the S3 checkpoint's tensors."""
    # The stop and the round trip through S3 change nothing: same weights as one uninterrupted local run.
    local = tmp_path / "local"
    reference = run_trainer([*FAST, "--steps", "6", "--checkpoint-uri", str(local)], data_dir)
    assert reference.returncode == 0, reference
    fs.get(f"{BUCKET}/runs/r1/step-00000006", str(tmp_path / "from-s3"), recursive=True)
    ours = load_checkpoint_tensors(tmp_path / "from-s3")
    theirs = load_checkpoint_tensors(local / "step-00000006")
    weights = [k for k in theirs if k.startswith(("model.", "optim."))]
    assert len(weights) > 30
    for k in weights:
        assert torch.equal(ours[k], theirs[k]), k
    return ours


def _evaluate_export_and_reuse(fs, uri: str, data_dir: str, tmp_path, ours) -> None:
    """trainer.evaluate on the S3 checkpoint: results, report and an export to an S3 registry; run again,
    it reuses the earlier results."""
    # Held-out evaluation reads the checkpoint from S3 and writes its results and report there.
    import json
    import subprocess
    import sys

    from conftest import REPO, trainer_env

    # It exports the checkpoint it evaluated when its loss beats the registry's best (here there is none), to
    # a registry on S3, in the same process (what EvaluateCheckpointOperator runs): uploaded, config.json
    # last.
    transformers = pytest.importorskip("transformers")
    evaluate = [sys.executable, "-m", "trainer.evaluate", "--checkpoint-uri", uri, "--batches", "2", "--all",
                "--out", f"{uri}/evals/latest.json", "--report", f"{uri}/report.png"]  # fmt: skip
    export = [*evaluate, "--export-to", f"s3://{BUCKET}/registry/r1"]
    out = subprocess.run(
        export, cwd=REPO, env=trainer_env(data_dir), capture_output=True, text=True, timeout=240
    )
    assert out.returncode == 0, out.stderr[-3000:]
    fs.invalidate_cache()  # this s3fs instance listed the prefix before the files existed
    with fs.open(f"{BUCKET}/runs/r1/evals/latest.json") as f:
        result = json.load(f)
    assert result["step"] == 6 and result["loss"] > 0 and result["path"] == f"{uri}/step-00000006"
    assert fs.size(f"{BUCKET}/runs/r1/report.png") > 10_000
    registry = f"s3://{BUCKET}/registry/r1/step-00000006"
    exported = result["export"]
    assert (exported["out"], exported["step"], exported["files"]) == (registry, 6, ["model.safetensors"])
    fs.invalidate_cache()
    fs.get(f"{BUCKET}/registry/r1/step-00000006", str(tmp_path / "hf"), recursive=True)
    assert sorted(p.name for p in (tmp_path / "hf").iterdir()) == ["config.json", "model.safetensors"]
    model = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "hf")
    assert torch.equal(model.model.embed_tokens.weight, ours["model.embed_tokens.weight"])

    # Evaluated again (the next run of the job): the earlier checkpoints' results are read back from S3, not
    # evaluated again; the curve is the same.
    again = subprocess.run(
        evaluate, cwd=REPO, env=trainer_env(data_dir), capture_output=True, text=True, timeout=240
    )
    assert again.returncode == 0, again.stderr[-3000:]
    earlier = [step for step, _ in result["eval_curve"] if step != 6]
    assert earlier, result["eval_curve"]
    assert f"[trainer.evaluate] reused the held-out loss of step(s) {earlier}" in again.stderr, again.stderr[
        -3000:
    ]
    fs.invalidate_cache()
    with fs.open(f"{BUCKET}/runs/r1/evals/latest.json") as f:
        assert json.load(f)["eval_curve"] == result["eval_curve"]


def test_s3_round_trip_preempt_resume_complete_with_ledger_progress_and_validation(s3, data_dir, tmp_path):
    import fsspec

    from trainer.validate import validate_checkpoint

    uri = f"s3://{BUCKET}/runs/r1"
    common = [
        *FAST,
        "--steps",
        "6",
        "--checkpoint-uri",
        uri,
        "--checkpoint-every",
        "2",
        "--set",
        "checkpoint.keep=2",
    ]
    spot = _preempted_first_attempt(uri, common, data_dir)
    statsd = _resumed_second_attempt(uri, common, data_dir)
    fs = fsspec.filesystem("s3", skip_instance_cache=True)
    _assert_retention_and_leases(fs, uri)
    _assert_ledger_and_live_spend(uri, spot, statsd)
    report = validate_checkpoint(uri)
    assert (report["checkpoint"], report["step"], report["checks"]["step_forward"]) == (
        f"{uri}/step-00000006",
        6,
        {"previous_step": 4},
    )
    ours = _assert_same_weights_as_a_local_run(fs, data_dir, tmp_path)
    _evaluate_export_and_reuse(fs, uri, data_dir, tmp_path, ours)

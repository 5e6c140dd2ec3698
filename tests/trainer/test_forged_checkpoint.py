"""A forged checkpoint runs nothing: a ``.metadata`` or a byte item whose pickle would run a command, with a
manifest whose sizes and checksums match it (as whoever can write to a ``checkpoint_uri`` can make it), is
refused by validation (the function, and the operator under ``dag.test()``), resume, evaluation, export and
``checkpoint_tensors``, each naming what it refused; the command never runs (its marker file stays absent),
and the older sound checkpoint is still used where a fallback is asked for.

Real checkpoints (one ``python -m trainer`` run on CPU, reused by every test), real processes where the
operator runs one (``python -m trainer``, ``python -m trainer.evaluate``).
"""

from __future__ import annotations

import io
import json
import os
import pickle
import shlex
import shutil
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest

from tests.trainer.conftest import BUCKET, FAST, REPO, read_json, run_trainer, trainer_env

STEPS = 6  # checkpoints at 2, 4 and 6: one forged .metadata, one forged byte item, one sound to fall back to


def _args(ckpt: Path | str, steps: int) -> list[str]:
    return [*FAST, "--checkpoint-uri", str(ckpt), "--checkpoint-every", "2", "--set", "checkpoint.keep=3",
            "--steps", str(steps)]  # fmt: skip


@pytest.fixture(scope="module")
def trained(data_dir, tmp_path_factory) -> Path:
    """One run's committed checkpoints, steps 2, 4 and 6: what every test here copies and forges."""
    ckpt = tmp_path_factory.mktemp("trained") / "ckpt"
    run = run_trainer(_args(ckpt, STEPS), data_dir)
    assert run.returncode == 0, run
    assert sorted(p.name for p in ckpt.glob("step-*")) == ["step-00000002", "step-00000004", "step-00000006"]
    return ckpt


@pytest.fixture
def ckpt(trained, tmp_path) -> Path:
    root = tmp_path / "ckpt"
    shutil.copytree(trained, root)
    return root


@pytest.fixture
def marker(tmp_path) -> Path:
    """The file the forged pickles' command creates: it exists only if something ran it."""
    return tmp_path / "MARKER"


class _Payload:
    """What a forger pickles: unpickling it runs ``touch MARKER`` (``os.system``, which pickles as
    ``posix.system``)."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return os.system, (f"touch {shlex.quote(self.marker)}",)


def _metadata(step: Path):
    from trainer.checkpoint.safe_pickle import load_metadata

    with open(step / ".metadata", "rb") as f:
        return load_metadata(f, str(step / ".metadata"))


def _recommit(step: Path, *names: str) -> None:
    """Rewrite the manifest's size and checksum of ``names`` as the forger would: every file check passes."""
    from trainer.base.storage import checksum_file, manifest_checksum

    manifest = read_json(step / "manifest.json")
    for name in names:
        algorithm, _ = manifest_checksum(manifest["files"][name])
        manifest["files"][name] = {"size": (step / name).stat().st_size,
                                   algorithm: checksum_file(str(step / name), algorithm)}  # fmt: skip
    (step / "manifest.json").write_text(json.dumps(manifest))


def _forge_metadata(step: Path, marker: Path) -> None:
    """The step's real .metadata with the payload among its planner data: read by ``pickle.load``, it runs
    the command and still describes the checkpoint, so a reader that trusted it would go on as usual."""
    metadata = _metadata(step)
    metadata.planner_data["_"] = _Payload(marker)
    (step / ".metadata").write_bytes(pickle.dumps(metadata))
    _recommit(step, ".metadata")


def _forge_byte_item(step: Path, fqn: str, marker: Path) -> str:
    """Point the byte item ``fqn`` (a non-tensor value, e.g. "step") at a torch.save of the payload appended
    to its shard; returns the shard's name. The .metadata stays sound: only the item is forged."""
    import torch
    from torch.distributed.checkpoint.filesystem import _StorageInfo

    metadata = _metadata(step)
    [key] = [k for k in metadata.storage_data if k.fqn == fqn]
    shard = step / metadata.storage_data[key].relative_path
    payload = io.BytesIO()
    torch.save(_Payload(marker), payload)
    offset = shard.stat().st_size
    with open(shard, "ab") as f:
        f.write(payload.getvalue())
    metadata.storage_data[key] = _StorageInfo(shard.name, offset, len(payload.getvalue()))
    (step / ".metadata").write_bytes(pickle.dumps(metadata))
    _recommit(step, ".metadata", shard.name)
    return shard.name


# --------------------------------------------------------------------------- validation


def test_validation_refuses_a_forged_metadata_naming_what_it_holds_and_falls_back(ckpt, marker):
    from trainer.validate import validate_checkpoint
    from trainer.checkpoint.errors import CheckpointInvalid

    _forge_metadata(ckpt / "step-00000006", marker)
    with pytest.raises(CheckpointInvalid) as err:
        validate_checkpoint(str(ckpt))
    assert (err.value.check, err.value.file) == ("dcp_metadata", ".metadata")
    assert "disallowed object, posix.system" in str(err.value)
    assert "nothing in the file was executed" in str(err.value)
    report = validate_checkpoint(str(ckpt), fallback_to_valid=True)
    assert report["step"] == 4 and report["fell_back_from"][0]["check"] == "dcp_metadata"
    assert not marker.exists(), "the forged .metadata ran its command"


def test_validation_refuses_a_forged_byte_item_naming_its_shard_and_item(ckpt, marker):
    from trainer.validate import validate_checkpoint
    from trainer.checkpoint.errors import CheckpointInvalid

    shard = _forge_byte_item(ckpt / "step-00000006", "step", marker)
    with pytest.raises(CheckpointInvalid) as err:
        validate_checkpoint(str(ckpt))
    assert (err.value.check, err.value.file) == ("dcp_objects", shard)
    assert "byte item step holds a disallowed object, posix.system" in str(err.value)
    assert validate_checkpoint(str(ckpt), fallback_to_valid=True)["step"] == 4
    assert not marker.exists(), "the forged byte item ran its command"


def test_the_validation_operator_under_dag_test_fails_on_a_forged_checkpoint_and_falls_back(
    airflow_home, ckpt, marker, tmp_path
):
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.dagbag import DagBag, sync_bag_to_db
    from airflow.sdk import DAG

    from airflow_dtrain.operators.checkpoint_validation import CheckpointValidationOperator

    _forge_metadata(ckpt / "step-00000006", marker)
    start = datetime(2026, 5, 1, tzinfo=timezone.utc)
    with DAG(dag_id="forged_checkpoint", schedule=None, start_date=start) as dag:
        CheckpointValidationOperator(task_id="validate", checkpoint_uri=str(ckpt))
        CheckpointValidationOperator(task_id="fallback", checkpoint_uri=str(ckpt), fallback_to_valid=True)
    bag = DagBag(dag_folder=str(tmp_path / "no-dags"))
    bag.bag_dag(dag)
    DagBundlesManager().sync_bundles_to_db()
    sync_bag_to_db(bag, "dags-folder", None)  # dag.test() runs serialised DAGs only
    run = dag.test()
    assert run.get_task_instance("validate").state == "failed"
    fallback = run.get_task_instance("fallback")
    assert fallback.state == "success"
    report = fallback.xcom_pull(task_ids="fallback")
    assert report["step"] == 4
    assert report["fell_back_from"][0]["check"] == "dcp_metadata"
    assert "posix.system" in report["fell_back_from"][0]["detail"]
    assert not marker.exists(), "the forged .metadata ran its command in the validation task"


# --------------------------------------------------------------------------- resume


def test_resume_falls_back_past_a_forged_metadata_and_a_forged_byte_item(ckpt, marker, data_dir):
    _forge_metadata(ckpt / "step-00000006", marker)
    _forge_byte_item(ckpt / "step-00000004", "scheduler.last_epoch", marker)
    run = run_trainer(_args(ckpt, STEPS + 2), data_dir)
    assert run.returncode == 0, run
    assert run.of("resume")[0]["from_step"] == 2, "both forged checkpoints are skipped for the sound step 2"
    assert "step-00000006 fails verification (dcp_metadata: .metadata" in run.stderr, run.stderr[-3000:]
    assert "step-00000004 fails verification (dcp_objects:" in run.stderr, run.stderr[-3000:]
    assert "posix.system" in run.stderr
    assert read_json(ckpt / "progress.json")["step"] == STEPS + 2
    assert not marker.exists(), "a forged checkpoint ran its command in the trainer"


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_the_readers_resume_loads_through_refuse_without_validation_first(ckpt, marker):
    """What ``Checkpointer.load`` reads through (``read_metadata``, then ``dcp.load`` of every item)
    refuses on its own: the validation in front of it is not the only guard."""
    import torch.distributed.checkpoint as dcp

    from trainer.checkpoint.reader import storage_reader
    from trainer.checkpoint.safe_pickle import UnsafeCheckpoint, refusals_raised
    from trainer.base.storage import Storage

    storage = Storage(str(ckpt))
    forged_metadata, forged_item = ckpt / "step-00000006", ckpt / "step-00000004"
    _forge_metadata(forged_metadata, marker)
    with pytest.raises(UnsafeCheckpoint, match=r"\.metadata: its \.metadata holds a disallowed object, posi"):
        storage_reader(storage, str(forged_metadata)).read_metadata()
    reader = storage_reader(storage, str(forged_metadata))
    with pytest.raises(UnsafeCheckpoint) as err, refusals_raised(reader):
        dcp.load({"step": 0}, storage_reader=reader, no_dist=True)
    assert err.value.refused == "posix.system" and err.value.item is None

    shard = _forge_byte_item(forged_item, "step", marker)
    reader = storage_reader(storage, str(forged_item))
    with pytest.raises(UnsafeCheckpoint) as err, refusals_raised(reader):
        dcp.load({"step": 0}, storage_reader=reader, no_dist=True)
    refusal = (err.value.refused, err.value.item, err.value.file)
    assert refusal == ("posix.system", "step", f"{forged_item}/{shard}")
    assert not marker.exists(), "a forged checkpoint ran its command in a reader"


def test_checkpoint_tensors_refuses_a_forged_metadata(ckpt, marker):
    from trainer.checkpoint.state import checkpoint_tensors
    from trainer.checkpoint.safe_pickle import UnsafeCheckpoint

    sound = checkpoint_tensors(str(ckpt / "step-00000006"))
    assert "model.norm.weight" in sound and "optim.state.norm.weight.exp_avg" in sound
    _forge_metadata(ckpt / "step-00000006", marker)
    with pytest.raises(UnsafeCheckpoint, match="posix.system"):
        checkpoint_tensors(str(ckpt / "step-00000006"))
    assert not marker.exists()


# --------------------------------------------------------------------------- evaluation, export


def test_evaluate_as_the_operator_runs_it_refuses_a_forged_checkpoint(ckpt, marker, data_dir):
    _forge_metadata(ckpt / "step-00000006", marker)
    cmd = [sys.executable, "-m", "trainer.evaluate", "--checkpoint-uri", str(ckpt), "--batches", "1",
           "--batch-size", "2"]  # fmt: skip
    p = subprocess.run(cmd, cwd=REPO, env=trainer_env(data_dir), capture_output=True, text=True, timeout=120,
                       check=False)  # fmt: skip
    assert p.returncode == 1, p.stderr[-3000:]
    assert p.stderr.startswith("refused: "), p.stderr[-3000:]
    assert "disallowed object, posix.system" in p.stderr
    assert "Traceback" not in p.stderr, "a refusal is one clear line, not a crash"
    assert not marker.exists(), "the forged .metadata ran its command in the evaluation"


def test_export_refuses_a_forged_checkpoint_and_writes_nothing(ckpt, marker, tmp_path, capsys):
    from trainer.export import main

    _forge_metadata(ckpt / "step-00000006", marker)
    assert main(["--checkpoint-uri", str(ckpt), "--out", str(tmp_path / "hf")]) == 1
    assert "export: refused:" in capsys.readouterr().err
    assert not (tmp_path / "hf").exists()
    assert not marker.exists(), "the forged .metadata ran its command in the export"


# --------------------------------------------------------------------------- s3://


def test_validation_over_s3_refuses_a_forged_metadata_and_reads_the_sound_one(s3, ckpt, marker):
    """The fsspec reader (s3://) is the safe one too: refuses the forged step 6, reads the sound step 4."""
    import fsspec

    from trainer.validate import validate_checkpoint

    _forge_metadata(ckpt / "step-00000006", marker)
    fs = fsspec.filesystem("s3", skip_instance_cache=True)
    for name in ("step-00000004", "step-00000006"):
        fs.put(str(ckpt / name), f"{BUCKET}/forged/{name}", recursive=True)
    assert fs.exists(f"{BUCKET}/forged/step-00000006/.metadata")
    report = validate_checkpoint(f"s3://{BUCKET}/forged", fallback_to_valid=True)
    assert report["step"] == 4 and report["checks"]["dcp_objects"]["loaded"] > 0
    [skipped] = report["fell_back_from"]
    assert (skipped["check"], skipped["file"]) == ("dcp_metadata", ".metadata")
    assert "posix.system" in skipped["detail"]
    assert not marker.exists()

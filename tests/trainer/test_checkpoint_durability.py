"""Checkpoints that survive: kill -9 in the middle of a save, retention with a best mark, validation
(a flipped byte, a NaN), the CheckpointValidationOperator, and the Hugging Face export.

Real processes on CPU/gloo, 2 ranks under trainer.launch where the brief says so.
"""

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest
import torch

from trainer.testing.faults import activate as activate_faults

from conftest import (
    FAST,
    REPO,
    load_checkpoint_tensors,
    read_json,
    run_trainer,
    trainer_cmd,
    trainer_env,
    worker_pids,
)
from tests.conftest import RecordingTI

STEPS = 8


def _flip_byte(path, offset=None) -> None:
    with open(path, "r+b") as f:
        size = os.fstat(f.fileno()).st_size
        f.seek(size // 2 if offset is None else offset)
        b = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([b[0] ^ 0x01]))


def _wait_until_gone(pids, timeout: float = 30) -> None:
    """The agent is reaped by us; its killed workers (orphans) are reaped by init a moment later."""
    deadline = time.monotonic() + timeout
    for pid in pids:
        while os.path.exists(f"/proc/{pid}") and "State:\tZ" not in _status(pid):
            assert time.monotonic() < deadline, f"worker {pid} still alive after SIGKILL"
            time.sleep(0.05)


def _status(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/status") as f:
            return f.read()
    except OSError:
        return "State:\tZ"


@pytest.fixture(scope="module")
def reference(data_dir, tmp_path_factory):
    """2 ranks, STEPS steps, async interval saves every 2 steps, all kept: steps 2, 4, 6, 8."""
    ckpt = tmp_path_factory.mktemp("reference")
    run = run_trainer(
        [
            *FAST,
            "--steps",
            str(STEPS),
            "--checkpoint-uri",
            str(ckpt),
            "--checkpoint-every",
            "2",
            "--set",
            "checkpoint.keep=4",
        ],
        data_dir,
        nproc=2,
    )
    assert run.returncode == 0, run
    assert [(e["step"], e["reason"]) for e in run.of("checkpoint")] == [
        (2, "interval"),
        (4, "interval"),
        (6, "interval"),
        (8, "final"),
    ]
    return ckpt


# --------------------------------------------------------------------------- kill -9 during a save


@pytest.mark.torchrun
@pytest.mark.fault_trial  # slow fault injection: `make test-faults` (and .ci/run), not `make test`
def test_kill_9_during_a_save_leaves_the_previous_checkpoint_and_the_run_resumes_from_it(
    reference, data_dir, tmp_path
):
    from trainer.checkpoint_dir import CheckpointDir

    ckpt = tmp_path / "ckpt"
    args = [
        *FAST,
        "--steps",
        str(STEPS),
        "--checkpoint-uri",
        str(ckpt),
        "--checkpoint-every",
        "2",
        "--set",
        "checkpoint.keep=2",
    ]
    # The test hook holds rank 0 after the files of step 4 are written, before its manifest.
    env = activate_faults({**trainer_env(data_dir), "DTRAIN_TEST_COMMIT_DELAY": "4:300"})
    stderr = tempfile.NamedTemporaryFile(mode="w+", delete=False)
    proc = subprocess.Popen(
        trainer_cmd(args, 2),
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=stderr,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 180
        while "test hook: step 4 files written" not in open(stderr.name).read():
            assert proc.poll() is None and time.monotonic() < deadline, open(stderr.name).read()[-3000:]
            time.sleep(0.2)
        # kill -9 the agent and both ranks (torchrun starts each worker in a session of its own)
        workers = worker_pids(proc.pid)
        assert sorted(workers) == [0, 1]
        for pid in [*workers.values(), proc.pid]:
            os.kill(pid, signal.SIGKILL)
        proc.wait()
        _wait_until_gone(workers.values())
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        os.unlink(stderr.name)

    step4 = ckpt / "step-00000004"
    assert {".metadata", "__0_0.distcp", "__1_0.distcp"} <= {p.name for p in step4.iterdir()}  # written...
    assert not (step4 / "manifest.json").exists()  # ...never committed
    assert CheckpointDir(str(ckpt)).committed() == [(2, str(ckpt / "step-00000002"))]
    before = read_json(ckpt / "progress.json")
    assert before["status"] == "running" and before["step"] >= 4

    CheckpointDir(str(ckpt)).mark_best(2)  # e.g. by the evaluation task: retention must keep it
    resumed = run_trainer(args, data_dir, nproc=2)
    assert resumed.returncode == 0, resumed
    assert resumed.of("resume")[0]["from_step"] == 2
    assert min(resumed.losses()) == 3
    progress = read_json(ckpt / "progress.json")
    assert (progress["status"], progress["attempt"], progress["steps_lost"]) == (
        "completed",
        2,
        before["step"] - 2,
    )
    # keep=2 plus the best one; the interrupted step 4 was redone and then retired
    assert sorted(p.name for p in ckpt.glob("step-*")) == ["step-00000002", "step-00000006", "step-00000008"]

    ours = load_checkpoint_tensors(ckpt / "step-00000008")
    theirs = load_checkpoint_tensors(reference / "step-00000008")
    weights = [k for k in theirs if k.startswith(("model.", "optim."))]
    assert len(weights) > 30
    for k in weights:
        assert torch.equal(ours[k], theirs[k]), k


# --------------------------------------------------------------------------- validation


@pytest.fixture
def ckpt_copy(reference, tmp_path):
    root = tmp_path / "ckpt"
    shutil.copytree(reference, root)
    return root


def test_a_sound_checkpoint_validates_and_a_flipped_byte_in_one_shard_is_named(ckpt_copy):
    from trainer.validate import CheckpointInvalid, validate_checkpoint

    report = validate_checkpoint(str(ckpt_copy))
    assert (report["checkpoint"], report["step"], report["valid"]) == (
        str(ckpt_copy / "step-00000008"),
        8,
        True,
    )
    assert report["checks"]["step_forward"] == {"previous_step": 6}
    written = sorted(p.name for p in (ckpt_copy / "step-00000008").iterdir() if p.name != "manifest.json")
    # .metadata and checkpoint.write_threads (4) files per rank, every one of them checked
    assert len(written) == 1 + 2 * 4 and report["checks"]["files"]["count"] == len(written)
    assert len(report["checks"]["finite"]["sampled"]) == 8

    _flip_byte(ckpt_copy / "step-00000008" / "__1_0.distcp")
    with pytest.raises(CheckpointInvalid) as err:
        validate_checkpoint(str(ckpt_copy))
    assert (err.value.check, err.value.file) == ("checksum", "__1_0.distcp")
    assert "step-00000008" in str(err.value) and "__1_0.distcp" in str(err.value)

    # The fallback returns the newest valid one and says what it skipped.
    report = validate_checkpoint(str(ckpt_copy), fallback_to_valid=True)
    assert report["step"] == 6
    assert [(s["check"], s["file"]) for s in report["fell_back_from"]] == [("checksum", "__1_0.distcp")]

    # A step that did not move forward, and a missing file, are named too.
    with pytest.raises(CheckpointInvalid, match="step_forward"):
        validate_checkpoint(str(ckpt_copy / "step-00000006"), previous_step=6)
    (ckpt_copy / "step-00000004" / "__0_0.distcp").unlink()
    with pytest.raises(CheckpointInvalid) as err:
        validate_checkpoint(str(ckpt_copy / "step-00000004"))
    assert (err.value.check, err.value.file) == ("presence", "__0_0.distcp")


def test_manifests_record_xxh3_and_older_sha256_manifests_still_validate(ckpt_copy):
    import xxhash

    from trainer.validate import CheckpointInvalid, validate_checkpoint

    step = ckpt_copy / "step-00000008"
    manifest = read_json(step / "manifest.json")
    for name, entry in manifest["files"].items():
        data = (step / name).read_bytes()
        assert entry == {"size": len(data), "xxh3_128": xxhash.xxh3_128(data).hexdigest()}
    # A manifest written before xxh3 (sha256 per file) is verified with sha256.
    manifest["files"] = {
        name: {"size": e["size"], "sha256": hashlib.sha256((step / name).read_bytes()).hexdigest()}
        for name, e in manifest["files"].items()
    }
    (step / "manifest.json").write_text(json.dumps(manifest))
    assert validate_checkpoint(str(step))["valid"]
    _flip_byte(step / "__0_0.distcp")
    with pytest.raises(CheckpointInvalid) as err:
        validate_checkpoint(str(step))
    assert (err.value.check, err.value.file) == ("checksum", "__0_0.distcp") and "sha256" in str(err.value)


def test_a_nan_in_a_saved_tensor_fails_validation_naming_the_tensor(ckpt_copy, tmp_path):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    from trainer.validate import CheckpointInvalid, validate_checkpoint

    # A checkpoint whose files match its manifest but whose weights went NaN.
    dcp_to_torch_save(str(ckpt_copy / "step-00000006"), str(tmp_path / "state.pt"))
    state = torch.load(tmp_path / "state.pt", weights_only=False)
    state["model"]["layers.1.self_attn.q_proj.weight"][3, 5] = float("nan")
    bad = ckpt_copy / "step-00000009"
    dcp.save(state, checkpoint_id=str(bad), no_dist=True)
    manifest = read_json(ckpt_copy / "step-00000006" / "manifest.json")
    manifest["step"] = 9
    manifest["files"] = {
        p.name: {"size": p.stat().st_size, "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
        for p in bad.iterdir()
    }
    (bad / "manifest.json").write_text(json.dumps(manifest))

    with pytest.raises(CheckpointInvalid) as err:
        validate_checkpoint(str(bad), sample_tensors=None)
    assert (err.value.check, err.value.file) == ("finite", "tensor model.layers.1.self_attn.q_proj.weight")
    assert "1 of" in str(err.value) and "NaN/Inf" in str(err.value)


def test_checkpoint_validation_operator_reports_falls_back_and_raises_naming_the_file(ckpt_copy):
    from airflow_dtrain.operators import CheckpointValidationOperator
    from trainer.validate import CheckpointInvalid

    op = CheckpointValidationOperator(task_id="validate", checkpoint_uri=str(ckpt_copy))
    report = op.execute({"ti": RecordingTI(task_id="validate")})
    assert report["step"] == 8 and report["valid"] and report["fell_back_from"] == []
    json.dumps(report)  # an XCom: plain JSON

    _flip_byte(ckpt_copy / "step-00000008" / ".metadata", offset=10)
    with pytest.raises(CheckpointInvalid, match=r"'checksum' failed for \.metadata"):
        op.execute({"ti": RecordingTI(task_id="validate")})
    fallback = CheckpointValidationOperator(
        task_id="validate", checkpoint_uri=str(ckpt_copy), fallback_to_valid=True
    )
    report = fallback.execute({"ti": RecordingTI(task_id="validate")})
    assert report["step"] == 6 and report["fell_back_from"][0]["file"] == ".metadata"


def test_the_validation_module_imports_no_torch():
    code = (
        "import sys, trainer.validate, airflow_dtrain.operators.checkpoint_validation; "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# --------------------------------------------------------------------------- export


def test_export_writes_safetensors_that_transformers_loads_with_the_same_logits(
    reference, data_dir, tmp_path
):
    transformers = pytest.importorskip("transformers")
    from trainer.evaluate import load_model

    out = tmp_path / "hf"
    p = subprocess.run(
        [sys.executable, "-m", "trainer.export", "--checkpoint-uri", str(reference), "--out", str(out)],
        cwd=REPO,
        env=trainer_env(data_dir),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["step"] == 8  # the root resolves to the latest committed checkpoint
    assert {"config.json", "model.safetensors"} <= {f.name for f in out.iterdir()}

    hf = transformers.LlamaForCausalLM.from_pretrained(str(out)).eval()
    ours, _ = load_model(str(reference / "step-00000008"), torch.device("cpu"))
    tokens = torch.tensor([list(b"The checkpoint survives."[:24])])
    with torch.no_grad():
        expected, got = ours(tokens), hf(tokens).logits  # (1, 24, 256)
    assert got.shape == expected.shape == (1, 24, 256)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    fresh = transformers.LlamaForCausalLM(hf.config).eval()  # the weights really came from the checkpoint
    with torch.no_grad():
        assert not torch.allclose(fresh(tokens).logits, expected, atol=1e-2)


def test_evaluate_exports_only_a_checkpoint_whose_loss_beats_the_one_it_is_given(
    reference, data_dir, tmp_path, monkeypatch
):
    from trainer.evaluate import main

    monkeypatch.setenv("DTRAIN_DATA_DIR", data_dir)
    args = ["--checkpoint-uri", str(reference), "--batches", "1", "--batch-size", "2",
            "--out", str(tmp_path / "e.json"), "--export-to", str(tmp_path / "registry")]  # fmt: skip
    assert main([*args, "--export-if-below", "0.0"]) == 0  # no loss is below 0: the best so far stays
    result = json.loads((tmp_path / "e.json").read_text())
    assert result["step"] == 8 and result["loss"] > 0 and result["export"] is None
    assert not (tmp_path / "registry").exists(), "nothing exported"

    # The export writes the weights the evaluation loaded: it does not read the checkpoint a second time (for
    # an 8B model on S3, 16-32 GB), even with --all, which evaluates the other checkpoints first.
    import trainer.export

    def no_second_read(*args, **kwargs):
        raise AssertionError("the export read the checkpoint again")

    monkeypatch.setattr(trainer.export, "load_weights", no_second_read)
    monkeypatch.setattr(trainer.export, "storage_reader", no_second_read)
    assert main([*args, "--all", "--export-if-below", repr(result["loss"] + 1e-6)]) == 0
    evaluation = json.loads((tmp_path / "e.json").read_text())
    exported = evaluation["export"]
    assert exported["out"] == str(tmp_path / "registry" / "step-00000008") and exported["step"] == 8
    assert [point[0] for point in evaluation["eval_curve"]] == sorted(
        int(p.name[5:]) for p in reference.glob("step-*")
    )
    written = {f.name for f in (tmp_path / "registry" / "step-00000008").iterdir()}
    assert {"config.json", "model.safetensors"} <= written
    # ...and they are step 8's, bit for bit
    from safetensors.torch import load_file

    saved = load_checkpoint_tensors(reference / "step-00000008")
    tensors = load_file(tmp_path / "registry" / "step-00000008" / "model.safetensors")
    assert len(tensors) == len([k for k in saved if k.startswith("model.")])
    for name, tensor in tensors.items():
        ours = "model." + (name if name == "lm_head.weight" else name.removeprefix("model."))
        assert torch.equal(tensor, saved[ours]), name


def test_evaluate_all_evaluates_only_what_changed_and_keeps_the_points_retention_deleted(
    ckpt_copy, data_dir, tmp_path, monkeypatch
):
    """A job continued over several runs is evaluated once per checkpoint, not once per run: --all with --out
    reuses the held-out loss of a checkpoint evaluated before as it is committed now, with the same
    batches."""
    import trainer.evaluate as ev

    monkeypatch.setenv("DTRAIN_DATA_DIR", data_dir)
    loaded = []
    load_model = ev.load_model
    monkeypatch.setattr(
        ev, "load_model", lambda path, device: (loaded.append(int(path[-8:])), load_model(path, device))[1]
    )
    out = tmp_path / "evals.json"
    args = [
        "--checkpoint-uri",
        str(ckpt_copy),
        "--batches",
        "1",
        "--batch-size",
        "2",
        "--all",
        "--out",
        str(out),
    ]

    assert ev.main(args) == 0 and loaded == [2, 4, 6, 8]
    first = json.loads(out.read_text())
    assert [s for s, _ in first["eval_curve"]] == [2, 4, 6, 8]

    loaded.clear()
    assert ev.main(args) == 0 and loaded == [8], "the latest is evaluated, the others reused"
    assert json.loads(out.read_text())["eval_curve"] == first["eval_curve"]

    # Retention deletes step 2; step 4 is written again (a resume rewound past it); other batches change
    # everything.
    shutil.rmtree(ckpt_copy / "step-00000002")
    manifest = read_json(ckpt_copy / "step-00000004" / "manifest.json")
    (ckpt_copy / "step-00000004" / "manifest.json").write_text(
        json.dumps({**manifest, "created_at": time.time()})
    )
    loaded.clear()
    assert ev.main(args) == 0 and loaded == [4, 8]
    assert json.loads(out.read_text())["eval_curve"] == first["eval_curve"], "step 2 stays on the curve"
    loaded.clear()
    assert ev.main([*args, "--batches", "2"]) == 0 and loaded == [4, 6, 8]
    assert [s for s, _ in json.loads(out.read_text())["eval_curve"]] == [4, 6, 8], (
        "2 was evaluated on other batches"
    )


@pytest.mark.parametrize("field", ["step_time_s", "cost.total_dollars", "tokens_seen"])
def test_a_nan_in_a_manifest_field_fails_validation_naming_the_field(ckpt_copy, field):
    """json writes NaN as a bare token and reads it back as a float: a NaN step time or cost would turn
    the budget's projection off on resume, so such a manifest is not a checkpoint to resume from."""
    from trainer.validate import CheckpointInvalid, validate_checkpoint

    path = ckpt_copy / "step-00000008" / "manifest.json"
    manifest = read_json(path)
    node, *_, leaf = [manifest, *field.split(".")]
    for key in field.split(".")[:-1]:
        node = node[key]
    node[leaf] = float("nan")
    path.write_text(json.dumps(manifest))  # NaN, as json.dumps writes it

    with pytest.raises(CheckpointInvalid) as err:
        validate_checkpoint(str(ckpt_copy / "step-00000008"))
    assert err.value.check == "manifest" and f"{field} is nan, not a finite number" in str(err.value)
    assert validate_checkpoint(str(ckpt_copy), fallback_to_valid=True)["step"] < 8

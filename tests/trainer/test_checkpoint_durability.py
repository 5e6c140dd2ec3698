"""Checkpoints that survive: kill -9 in the middle of a save, retention with a best mark, validation
(a flipped byte, a NaN), the CheckpointValidationOperator, and the Hugging Face export. kill -9 during
a save: test_checkpoint_kill_9.py.

Real processes on CPU/gloo, 2 ranks under trainer.launch where the brief says so.
"""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time

import pytest
import torch


from conftest import (
    REPO,
    load_checkpoint_tensors,
    read_json,
    trainer_env,
)
from tests.conftest import RecordingTI
from checkpoint_reference import reference  # noqa: F401 - a fixture


def _flip_byte(path, offset=None) -> None:
    with open(path, "r+b") as f:
        size = os.fstat(f.fileno()).st_size
        f.seek(size // 2 if offset is None else offset)
        b = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([b[0] ^ 0x01]))


# --------------------------------------------------------------------------- validation


@pytest.fixture
def ckpt_copy(reference, tmp_path):
    root = tmp_path / "ckpt"
    shutil.copytree(reference, root)
    return root


def test_a_sound_checkpoint_validates_and_a_flipped_byte_in_one_shard_is_named(ckpt_copy):
    from trainer.validate import validate_checkpoint
    from trainer.checkpoint.errors import CheckpointInvalid

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

    from trainer.validate import validate_checkpoint
    from trainer.checkpoint.errors import CheckpointInvalid

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

    from trainer.validate import validate_checkpoint
    from trainer.checkpoint.errors import CheckpointInvalid

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
    from airflow_dtrain.operators.checkpoint_validation import CheckpointValidationOperator
    from trainer.checkpoint.errors import CheckpointInvalid

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
    from trainer.validate import validate_checkpoint
    from trainer.checkpoint.errors import CheckpointInvalid

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

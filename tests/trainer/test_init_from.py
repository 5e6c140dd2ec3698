"""model.init_from: continued pre-training from a Hugging Face Llama (config.json + safetensors), built
locally with transformers. The shape comes from config.json, every rank loads only its shard, step 0
reproduces the source model's held-out loss, and export gives back the source's shape."""

import json
import sys
from pathlib import Path

import pytest
import torch

from conftest import FAST, REPO, run_trainer
from trainer.config.fields import ConfigError
from trainer.data.loader import eval_batches
from trainer.data.builtin_text import BUILTIN_NAME
from trainer.model.hf import model_args_from_config

transformers = pytest.importorskip("transformers", reason="transformers is in the `test` extra of setup.cfg")
sys.path.insert(0, str(REPO / "tests"))
from hf_model_assets import tiny_llama  # noqa: E402

SEQ = 32
LLAMA3 = {
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
}


@pytest.mark.parametrize(
    "kw",
    [dict(n_kv_heads=4, tie=False), dict(n_kv_heads=2, tie=True, rope_scaling=LLAMA3)],
    ids=["mha-untied", "gqa-tied-llama3"],
)
def test_the_shape_comes_from_config_json(kw, tmp_path):
    config = json.loads((Path(tiny_llama(tmp_path / "m", **kw)) / "config.json").read_text())
    args = model_args_from_config(config, SEQ)
    assert (args.dim, args.n_layers, args.n_heads, args.n_kv_heads, args.ffn_dim, args.vocab_size) == (
        64,
        2,
        4,
        kw["n_kv_heads"],
        160,
        256,
    )
    assert args.tie_word_embeddings is kw["tie"]
    assert args.rope_scaling == (LLAMA3 if kw.get("rope_scaling") else None)


@pytest.mark.parametrize("change, message", [
    ({"model_type": "mistral"}, "model_type 'mistral'"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}}, "rope_type 'yarn'"),
    ({"attention_bias": True}, "attention_bias true"),
    ({"head_dim": 32}, "head_dim 32"),
])  # fmt: skip
def test_an_unsupported_config_is_refused_naming_the_field_and_value(change, message, tmp_path):
    config = {**json.loads((Path(tiny_llama(tmp_path / "m")) / "config.json").read_text()), **change}
    with pytest.raises(ConfigError, match="model.init_from") as err:
        model_args_from_config(config, SEQ, "/models/x")
    assert message in str(err.value)


def hf_heldout_loss(model_dir: str, data_dir: str, batches: int, batch_size: int) -> float:
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32, attn_implementation="eager"
    )
    hf.eval()
    total, n = 0.0, 0
    with torch.no_grad():
        for inputs, targets in eval_batches(
            str(Path(data_dir) / BUILTIN_NAME), SEQ, batch_size, batches, "cpu"
        ):
            logits = hf(inputs).logits
            loss = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)
            )
            total += float(loss) * targets.numel()
            n += targets.numel()
    return total / n


def test_two_ranks_start_from_a_sharded_hf_model_with_its_loss_and_export_its_shape(data_dir, tmp_path):
    src = tiny_llama(tmp_path / "src", tie=True, rope_scaling=LLAMA3, max_shard_size="100KB")
    assert len(list(Path(src).glob("*.safetensors"))) > 1  # several files: the index is followed
    ckpt = tmp_path / "ckpt"
    args = [*FAST, "--steps", "3", "--checkpoint-uri", str(ckpt), "--set", f"model.init_from={src}"]
    run = run_trainer(args, data_dir, nproc=2)
    assert run.returncode == 0, run
    start = run.of("eval")
    assert [e["step"] for e in start] == [0], run.events
    # 4 held-out micro-batches of 4 sequences (FAST: micro_batch_size=4), as the trainer's step-0 eval
    expected = hf_heldout_loss(src, data_dir, batches=4, batch_size=4)
    assert start[0]["loss"] == pytest.approx(expected, abs=1e-4)
    assert "initialised" in run.stderr + run.stdout

    manifest = json.loads(sorted(ckpt.glob("step-*/manifest.json"))[-1].read_text())
    assert manifest["model_args"]["tie_word_embeddings"] is True and manifest["model_args"]["dim"] == 64

    out = tmp_path / "export"
    done = __import__("subprocess").run(
        [sys.executable, "-m", "trainer.export", "--checkpoint-uri", str(ckpt), "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    exported = json.loads((out / "config.json").read_text())
    source = json.loads((Path(src) / "config.json").read_text())
    for key in (
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "intermediate_size",
        "vocab_size",
        "tie_word_embeddings",
    ):
        assert exported[key] == source[key], key
    assert exported["rope_parameters"]["rope_type"] == "llama3"
    model = transformers.AutoModelForCausalLM.from_pretrained(str(out))
    assert model.config.num_key_value_heads == 2

    # The job resumes its own checkpoint; a different model for the same checkpoint is refused, naming both
    # shapes.
    other = tiny_llama(tmp_path / "other", n_kv_heads=4)
    refused = run_trainer(
        [*FAST, "--steps", "4", "--checkpoint-uri", str(ckpt), "--set", f"model.init_from={other}"], data_dir
    )
    assert refused.returncode == 2, refused
    assert "n_kv_heads 4 here, 2 there" in refused.stderr, refused


@pytest.mark.parametrize(
    "damage, message",
    [
        ("drop", "has no tensor 'model.layers.1.mlp.up_proj.weight'"),
        ("reshape", "has shape (10, 64), the model needs (160, 64)"),
    ],
)
def test_a_missing_or_misshaped_tensor_fails_naming_it(damage, message, data_dir, tmp_path):
    from safetensors.torch import load_file, save_file

    src = Path(tiny_llama(tmp_path / "src"))
    tensors = load_file(src / "model.safetensors")
    if damage == "drop":
        del tensors["model.layers.1.mlp.up_proj.weight"]
    else:
        tensors["model.layers.1.mlp.up_proj.weight"] = tensors["model.layers.1.mlp.up_proj.weight"][:10]
    save_file(tensors, src / "model.safetensors", metadata={"format": "pt"})
    run = run_trainer([*FAST, "--steps", "1", "--set", f"model.init_from={src}"], data_dir)
    assert run.returncode == 2, run
    assert message in run.stderr, run

"""Continued pre-training of your own Hugging Face Llama, honestly: the export gives the source model back as
it was (its config.json, generation_config.json and dtype; only the weights trained), even once the source
directory is gone, and says what it could not keep; and a model that has a tokenizer trains only on data of
that tokenizer. The source is a tiny Llama (bf16, context 512, llama3 RoPE scaling, special token ids)
with its own BPE tokenizer, built locally."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import FAST, REPO, run_trainer
from trainer.data.builtin_text import builtin_documents
from trainer.export import export, export_weights, load_weights
from trainer.prepare_data.pipeline import prepare

transformers = pytest.importorskip("transformers", reason="transformers is in the `test` extra of setup.cfg")
sys.path.insert(0, str(REPO / "tests"))
from hf_model_assets import tiny_llama  # noqa: E402
from hf_tokenizer_assets import tiny_tokenizer  # noqa: E402

BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"
BOS_ID, EOS_ID, PAD_ID = 0, 1, 2  # the special tokens come first in the tokenizer's vocabulary
SEQ = 64  # the training seq_len; the source's context is 512
LLAMA3 = {
    "factor": 4.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 32,
}
SOURCE_GENERATION = {
    "bos_token_id": BOS_ID,
    "eos_token_id": EOS_ID,
    "pad_token_id": PAD_ID,
    "do_sample": True,
    "temperature": 0.6,
    "top_p": 0.9,
}
# The fields of config.json that training changes: none, only the weights change. (The dtype field follows the
# exported weights: it differs from the source's only when the export is asked for another dtype, --dtype.)
CHANGED_BY_TRAINING: tuple[str, ...] = ()


def tokenizer_with_bos(path: Path) -> None:
    """A byte-level BPE (vocab 256) with BOS and EOS as ids 0 and 1, saved into the model directory."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=256, special_tokens=[BOS, EOS], show_progress=False)
    tok.train_from_iterator(builtin_documents()[:300], trainer=trainer)
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=EOS).save_pretrained(str(path))


def eos_dominant_bf16(path: Path) -> None:
    """Rewrite the model's weights in bfloat16 so that EOS is every position's greedy choice, by a margin a
    few training steps cannot close: residual dimension 0 is a constant +5 (the embeddings' column 0; no
    block writes to it), the final norm passes only that dimension, and only EOS's lm_head row reads it."""
    from safetensors.torch import load_file, save_file

    w = load_file(path / "model.safetensors")
    w["model.embed_tokens.weight"][:, 0] = 5.0
    for name in w:
        if name.endswith(("self_attn.o_proj.weight", "mlp.down_proj.weight")):
            w[name][0, :] = 0.0
    w["model.norm.weight"].zero_()
    w["model.norm.weight"][0] = 1.0
    w["lm_head.weight"][:, 0] = 0.0
    w["lm_head.weight"][EOS_ID, 0] = 10.0
    save_file(
        {k: v.to(torch.bfloat16) for k, v in w.items()}, path / "model.safetensors", metadata={"format": "pt"}
    )


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """The user's model directory: config.json (context 512, llama3 scaling, RoPE theta 500000, bos/eos/pad,
    bfloat16), generation_config.json (sampling settings of its own), bf16 safetensors and its tokenizer."""
    path = Path(tiny_llama(tmp_path_factory.mktemp("models") / "my-llama", rope_scaling=LLAMA3))
    config = json.loads((path / "config.json").read_text())
    rope_key = "rope_parameters" if "rope_parameters" in config else "rope_scaling"
    if rope_key == "rope_scaling":
        config["rope_theta"] = 500000.0
    else:
        config[rope_key]["rope_theta"] = 500000.0
    dtype_key = "dtype" if "dtype" in config else "torch_dtype"
    config.update(
        {
            "max_position_embeddings": 512,
            "bos_token_id": BOS_ID,
            "eos_token_id": EOS_ID,
            "pad_token_id": PAD_ID,
            dtype_key: "bfloat16",
        }
    )
    (path / "config.json").write_text(json.dumps(config, indent=2))
    (path / "generation_config.json").write_text(json.dumps(SOURCE_GENERATION, indent=2))
    eos_dominant_bf16(path)
    tokenizer_with_bos(path)
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in builtin_documents()[:300]))
    return str(path)


def read(path: Path) -> dict:
    return json.loads(path.read_text())


def differing(a: dict, b: dict) -> set[str]:
    return {k for k in a.keys() | b.keys() if a.get(k, "<absent>") != b.get(k, "<absent>")}


def safetensors_dtypes(directory: Path) -> set[str]:
    from safetensors import safe_open

    with safe_open(str(directory / "model.safetensors"), framework="pt") as f:
        return {f.get_slice(name).get_dtype() for name in f.keys()}


def _check_a_float32_export(ckpt, out, tmp_path, source_config: dict, dtype_key: str) -> None:
    """Asked for float32: the dtype is the only field that differs, and the weights take twice the room."""
    fp32 = export(str(ckpt), str(tmp_path / "export-fp32"), torch.float32)
    fp32_config = read(tmp_path / "export-fp32" / "config.json")
    assert differing(fp32_config, source_config) == {*CHANGED_BY_TRAINING, dtype_key}
    assert fp32_config[dtype_key] == "float32"
    assert safetensors_dtypes(tmp_path / "export-fp32") == {"F32"} and "not_kept" not in fp32
    bf16_bytes, fp32_bytes = (
        os.path.getsize(d / "model.safetensors") for d in (out, tmp_path / "export-fp32")
    )
    assert bf16_bytes < 0.55 * fp32_bytes, (bf16_bytes, fp32_bytes)


def _check_generation_stops_at_eos(out) -> None:
    """generate stops at EOS because the exported generation config says which id that is: the same greedy
    decoding told another id runs to max_new_tokens, producing EOS every time."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(out))
    model = transformers.AutoModelForCausalLM.from_pretrained(str(out))
    assert model.generation_config.eos_token_id == EOS_ID
    prompt = tokenizer("the small cat", return_tensors="pt")
    stopped = model.generate(**prompt, max_new_tokens=20, do_sample=False)
    assert stopped.shape[1] == prompt["input_ids"].shape[1] + 1 and stopped[0, -1] == EOS_ID, stopped
    unstopped = model.generate(**prompt, max_new_tokens=20, do_sample=False, eos_token_id=PAD_ID)
    assert unstopped.shape[1] == prompt["input_ids"].shape[1] + 20 and set(unstopped[0, -20:].tolist()) == {
        EOS_ID
    }


def test_the_export_gives_the_source_back_with_only_its_weights_trained(source, corpus, data_dir, tmp_path):
    src = tmp_path / "my-llama"  # a copy: deleted below, as a user's source may be after training
    shutil.copytree(source, src)
    store = tmp_path / "store"
    prepare([corpus], str(store), tokenizer=str(src), log=lambda m: None)
    ckpt = tmp_path / "ckpt"
    sets = [f"data.seq_len={SEQ}", f"model.init_from={src}", f"data.dataset={store}"]
    args = [*FAST, "--steps", "2", "--checkpoint-uri", str(ckpt), *(a for v in sets for a in ("--set", v))]
    run = run_trainer(args, data_dir)
    assert run.returncode == 0, run  # the model's own tokenizer's data is accepted
    source_config, source_generation = read(src / "config.json"), read(src / "generation_config.json")
    dtype_key = "dtype" if "dtype" in source_config else "torch_dtype"

    out = tmp_path / "export"
    done = subprocess.run(
        [sys.executable, "-m", "trainer.export", "--checkpoint-uri", str(ckpt), "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert (
        "not_kept" not in json.loads(done.stdout.strip().splitlines()[-1]) and "not kept" not in done.stderr
    )
    exported = read(out / "config.json")
    assert exported["max_position_embeddings"] == 512  # the source's context, not the training seq_len 64
    assert (exported["bos_token_id"], exported["eos_token_id"], exported["pad_token_id"]) == (
        BOS_ID,
        EOS_ID,
        PAD_ID,
    )
    # every other field too: RoPE settings (llama3 scaling, theta 500000), tied embeddings, dtype, ...
    assert differing(exported, source_config) == set(CHANGED_BY_TRAINING), exported
    assert read(out / "generation_config.json") == source_generation
    assert safetensors_dtypes(out) == {"BF16"}  # as the source, not float32 as trained

    _check_a_float32_export(ckpt, out, tmp_path, source_config, dtype_key)
    _check_generation_stops_at_eos(out)

    # The source directory is gone: the manifest's record of it keeps the export whole.
    shutil.rmtree(src)
    again = tmp_path / "export-again"
    result = export(str(ckpt), str(again))
    assert "not_kept" not in result
    assert read(again / "config.json") == source_config
    assert read(again / "generation_config.json") == source_generation
    assert safetensors_dtypes(again) == {"BF16"}


def test_the_export_makes_a_generation_config_and_says_what_it_could_not_keep(
    source, corpus, data_dir, tmp_path, capsys
):
    src = tmp_path / "my-llama"
    shutil.copytree(source, src)
    (src / "generation_config.json").unlink()  # a source without one: made from config.json's ids
    store = tmp_path / "store"
    prepare([corpus], str(store), tokenizer=str(src), log=lambda m: None)
    ckpt = tmp_path / "ckpt"
    run = run_trainer(
        [
            *FAST,
            "--steps",
            "1",
            "--checkpoint-uri",
            str(ckpt),
            "--set",
            f"data.seq_len={SEQ}",
            "--set",
            f"model.init_from={src}",
            "--set",
            f"data.dataset={store}",
        ],
        data_dir,
    )
    assert run.returncode == 0, run
    weights, manifest, step_dir = load_weights(str(ckpt))
    made = export_weights(weights, manifest, step_dir, str(tmp_path / "made"))
    assert read(tmp_path / "made" / "generation_config.json") == {
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        "pad_token_id": PAD_ID,
    }
    assert "not_kept" not in made

    # A checkpoint from before the manifest recorded the source: read from the source while it is there...
    old = {k: v for k, v in manifest.items() if k != "hf_source"}
    export_weights(weights, old, step_dir, str(tmp_path / "old"))
    assert read(tmp_path / "old" / "config.json") == read(src / "config.json")
    # ...and once it is gone, the shape alone, said plainly.
    shutil.rmtree(src)
    capsys.readouterr()
    degraded = export_weights(weights, old, step_dir, str(tmp_path / "degraded"))
    said = capsys.readouterr().err
    config = read(tmp_path / "degraded" / "config.json")
    assert config["max_position_embeddings"] == 128  # the llama3 scaling's 32 × 4, not the source's 512
    assert config["eos_token_id"] is None and not (tmp_path / "degraded" / "generation_config.json").exists()
    assert safetensors_dtypes(tmp_path / "degraded") == {"F32"}
    not_kept = "; ".join(degraded["not_kept"])
    for what in (
        "config.json",
        "max_position_embeddings",
        "generation_config.json",
        f"{src} has no config.json",
        "the weights' dtype",
    ):
        assert what in not_kept, not_kept
    assert "not kept" in said and str(src) in said


@pytest.mark.parametrize("data", ["builtin", "byte-store"])
def test_a_model_with_a_tokenizer_refuses_byte_level_data(data, source, corpus, data_dir, tmp_path):
    dataset = "builtin"
    if data == "byte-store":
        dataset = str(tmp_path / "bytes")
        prepare([corpus], dataset, tokenizer=None, log=lambda m: None)
    ckpt = tmp_path / "ckpt"
    run = run_trainer(
        [
            *FAST,
            "--steps",
            "1",
            "--checkpoint-uri",
            str(ckpt),
            "--set",
            f"model.init_from={source}",
            "--set",
            f"data.dataset={dataset}",
        ],
        data_dir,
    )
    assert run.returncode == 2, run
    assert not run.of("train") and not list(ckpt.glob("step-*")), run
    named = "(the built-in demo corpus) " if data == "builtin" else ""
    assert (
        f"data.dataset: {dataset!r} {named}is byte-level text (bytes (byte-level, vocab 256), no tokenizer)"
        in run.stderr
    ), run
    assert f"model.init_from {str(source)!r} has its own tokenizer my-llama (sha256 " in run.stderr, run


def test_a_store_of_another_tokenizer_is_refused_naming_both(source, corpus, data_dir, tmp_path):
    other = tiny_tokenizer(tmp_path / "other-tok", vocab_size=256, corpus=builtin_documents()[300:600])
    store = tmp_path / "store"
    theirs = prepare([corpus], str(store), tokenizer=other, log=lambda m: None)["tokenizer"]
    ours = prepare([corpus], str(tmp_path / "ours"), tokenizer=str(source), log=lambda m: None)["tokenizer"]
    assert theirs["sha256"] != ours["sha256"]
    run = run_trainer(
        [*FAST, "--steps", "1", "--set", f"model.init_from={source}", "--set", f"data.dataset={store}"],
        data_dir,
    )
    assert run.returncode == 2, run
    assert not run.of("train"), run
    assert (
        f"data.dataset: {str(store)!r} was prepared with tokenizer other-tok "
        f"(sha256 {theirs['sha256'][:12]}, vocab {theirs['vocab_size']}), "
        f"but model.init_from {str(source)!r} has tokenizer my-llama (sha256 "
        f"{ours['sha256'][:12]}, vocab {ours['vocab_size']})"
    ) in run.stderr, run

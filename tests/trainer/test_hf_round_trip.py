"""The whole Hugging Face path at the trainer level: a locally built Llama and BPE tokenizer, a jsonl corpus
prepared with that tokenizer, a continued run from the model, and an export that transformers loads
with its tokenizer and generates from."""

import json
import subprocess
import sys

import pytest

from conftest import FAST, REPO, run_trainer
from trainer.data.builtin_text import generate_builtin_text
from trainer.prepare_data.pipeline import prepare

transformers = pytest.importorskip("transformers", reason="transformers is in the `test` extra of setup.cfg")
sys.path.insert(0, str(REPO / "tests"))
from hf_model_assets import tiny_llama  # noqa: E402
from hf_tokenizer_assets import tiny_tokenizer  # noqa: E402


def test_a_model_continued_on_its_tokenizers_data_exports_with_the_tokenizer_and_generates(
    data_dir, tmp_path
):
    tok = tiny_tokenizer(tmp_path / "tok", vocab_size=300)
    src = tiny_llama(tmp_path / "model", vocab_size=300)
    corpus = tmp_path / "corpus.jsonl"
    docs = generate_builtin_text(60_000, seed=7).decode().split("\n\n")
    corpus.write_text("".join(json.dumps({"body": d}) + "\n" for d in docs))
    meta = prepare(
        [str(corpus)], str(tmp_path / "store"), tokenizer=tok, text_field="body", log=lambda m: None
    )
    assert meta["vocab_size"] <= 300 and meta["tokenizer"]["kind"] == "hf"

    ckpt = tmp_path / "ckpt"
    run = run_trainer(
        [
            *FAST,
            "--steps",
            "3",
            "--checkpoint-uri",
            str(ckpt),
            "--set",
            f"model.init_from={src}",
            "--set",
            f"data.dataset={tmp_path / 'store'}",
        ],
        data_dir,
    )
    assert run.returncode == 0, run
    manifest = json.loads(sorted(ckpt.glob("step-*/manifest.json"))[-1].read_text())
    assert manifest["tokenizer"]["sha256"] == meta["tokenizer"]["sha256"]

    out = tmp_path / "export"
    done = subprocess.run(
        [sys.executable, "-m", "trainer.export", "--checkpoint-uri", str(ckpt), "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert "tokenizer.json" in json.loads(done.stdout.strip().splitlines()[-1])["files"]
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(out))
    model = transformers.AutoModelForCausalLM.from_pretrained(str(out))
    prompt = tokenizer("the small cat", return_tensors="pt")
    # min_new_tokens: the export keeps the source's eos_token_id (2, transformers' default), an ordinary
    # token here
    generated = model.generate(
        **prompt, max_new_tokens=8, min_new_tokens=8, do_sample=False, pad_token_id=tokenizer.eos_token_id
    )
    assert generated.shape[1] == prompt["input_ids"].shape[1] + 8
    text = tokenizer.decode(generated[0])
    assert text.startswith("the small cat") and len(text) > len("the small cat")

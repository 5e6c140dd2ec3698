"""PrepareDataOperator, the train_llama DAG's data-preparation task: real tokenizers built locally,
real token stores read back with the trainer's reader, object storage through a moto S3 server."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from airflow_dtrain.operators.prepare_data import DataError, PrepareDataOperator
from tests.hf_tokenizer_assets import tiny_tokenizer
from tests.trainer.conftest import BUCKET
from trainer.data.builtin_text import builtin_documents
from trainer.data.token_store import open_split, read_meta

tokenizers = pytest.importorskip("tokenizers", reason="tokenizers is in the `trainer` extra of setup.cfg")


def run(tmp_path, **kwargs) -> str:
    op = PrepareDataOperator(
        task_id="prepare_data", output_root=kwargs.pop("output_root", str(tmp_path / "data")), **kwargs
    )
    return op.execute({})


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    """A model directory's tokenizer files (as save_pretrained writes them), trained on the built-in text."""
    return tiny_tokenizer(
        tmp_path_factory.mktemp("my-llama"), vocab_size=300, corpus=builtin_documents()[:300]
    )


def test_builtin_without_a_tokenizer_is_the_byte_level_default(tmp_path):
    assert run(tmp_path, dataset="builtin", tokenizer="") == "builtin"
    assert not (tmp_path / "data").exists()  # nothing prepared: the trainer builds it


def test_builtin_with_the_models_tokenizer_is_tokenised_once(tmp_path, model_dir, capsys):
    store = run(tmp_path, dataset="builtin", tokenizer=model_dir)
    assert store.startswith(str(tmp_path / "data"))
    meta = read_meta(store)
    tok = tokenizers.Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    assert meta["tokenizer"]["kind"] == "hf" and meta["vocab_size"] == tok.get_vocab_size(
        with_added_tokens=True
    )
    assert meta["eos_id"] == tok.token_to_id("<|end_of_text|>")
    assert "prepare_data: done: 8,898 documents" in capsys.readouterr().out  # progress in the task log

    # The tokens are the built-in documents in the model's tokenizer, each ended by its EOS.
    stream, _ = open_split(store, "train")
    head = np.asarray(stream[0:2000]).tolist()
    first_doc = head[: head.index(meta["eos_id"])]
    assert tok.decode(first_doc) == builtin_documents()[0]

    # The next run (a relaunch, the next scheduled run) finds the same store and does not tokenise again.
    before = os.stat(os.path.join(store, "meta.json")).st_mtime_ns
    assert run(tmp_path, dataset="builtin", tokenizer=model_dir) == store
    assert os.stat(os.path.join(store, "meta.json")).st_mtime_ns == before
    log = capsys.readouterr().out
    assert "was prepared before with the same input and tokenizer" in log and "prepare_data: done" not in log


def test_a_jsonl_file_with_a_named_field_and_a_wide_vocabulary(tmp_path):
    docs = builtin_documents()[:200]
    big = tiny_tokenizer(tmp_path / "big-llama", vocab_size=70_000, corpus=docs)  # ids above 65,535: uint32
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": i, "body": d}) + "\n" for i, d in enumerate(docs)))
    store = run(tmp_path, dataset=str(corpus), tokenizer=big, text_field="body")
    meta = read_meta(store)
    assert meta["dtype"] == "uint32" and meta["text_field"] == "body"
    tok = tokenizers.Tokenizer.from_file(os.path.join(big, "tokenizer.json"))
    train, _ = open_split(store, "train")
    val, _ = open_split(store, "val")
    assert meta["splits"]["train"]["documents"] + meta["splits"]["val"]["documents"] == len(docs)
    text = tok.decode(np.asarray(train[0 : len(train)]).tolist(), skip_special_tokens=True)
    assert docs[0] in text and docs[1] in text

    # A changed input is a new store; the old one stays for the checkpoints trained on it.
    corpus.write_text(corpus.read_text() + json.dumps({"body": "one more document."}) + "\n")
    os.utime(corpus, (1, 1))
    again = run(tmp_path, dataset=str(corpus), tokenizer=big, text_field="body")
    assert again != store and os.path.exists(os.path.join(store, "meta.json"))


def test_bad_inputs_are_refused_naming_the_argument_and_the_value(tmp_path, model_dir, monkeypatch):
    # a platform whose storage roots allow the whole machine: the preparation step's own refusals (the
    # roots' own are tests/unit/test_storage_roots.py's)
    monkeypatch.setenv("AIRFLOW__DTRAIN__STORAGE_ROOTS", "/")
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"text": "a document."}) + "\n")
    with pytest.raises(
        DataError, match=r"^text_field: .*corpus.jsonl line 1: 'body' is missing \(it has: text\)"
    ):
        run(tmp_path, dataset=str(corpus), tokenizer=model_dir, text_field="body")
    with pytest.raises(
        DataError, match=r"^dataset: wikitext: unknown input kind .*hub dataset name is not fetched"
    ):
        run(tmp_path, dataset="wikitext", tokenizer=model_dir)
    with pytest.raises(DataError, match=r"^tokenizer: '/no/such/model' does not exist"):
        run(tmp_path, dataset="builtin", tokenizer="/no/such/model")
    assert (
        not any((tmp_path / "data").glob("*")) if (tmp_path / "data").exists() else True
    )  # nothing half-written


def test_a_store_of_another_tokenizer_is_refused_naming_both(tmp_path, model_dir):
    bytes_store = run(tmp_path, dataset=str(_jsonl(tmp_path)), tokenizer="")  # byte-level
    assert read_meta(bytes_store)["tokenizer"] == {"kind": "bytes"}
    with pytest.raises(DataError) as err:
        run(tmp_path, dataset=bytes_store, tokenizer=model_dir)
    message = str(err.value)
    assert message.startswith(
        f"dataset: {bytes_store!r} was prepared with tokenizer bytes (byte-level, vocab 256)"
    )
    assert f"the model's tokenizer ({model_dir!r}) is {os.path.basename(model_dir)} (sha256" in message
    # The same store with no model tokenizer, or a store of the model's tokenizer, is used as is.
    assert run(tmp_path, dataset=bytes_store, tokenizer="") == bytes_store
    own = run(tmp_path, dataset=str(_jsonl(tmp_path)), tokenizer=model_dir)
    assert run(tmp_path, dataset=own, tokenizer=model_dir) == own


def test_tokenizer_and_store_in_object_storage(tmp_path, model_dir, s3):
    import fsspec

    fs = fsspec.filesystem(
        "s3", skip_instance_cache=True
    )  # a cached one may point at an earlier test's server
    for name in os.listdir(
        model_dir
    ):  # the model's tokenizer files in a bucket (its weights would be there too)
        fs.put_file(os.path.join(model_dir, name), f"{BUCKET}/models/my-llama/{name}")
    fs.put_file(str(_jsonl(tmp_path)), f"{BUCKET}/raw/corpus.jsonl")
    store = run(
        tmp_path,
        dataset=f"s3://{BUCKET}/raw/corpus.jsonl",
        tokenizer=f"s3://{BUCKET}/models/my-llama",
        output_root=f"s3://{BUCKET}/prepared",
    )
    assert store.startswith(f"s3://{BUCKET}/prepared/corpus-my-llama-")
    meta = json.loads(fs.cat_file(f"{store}/meta.json"))
    local = read_meta(run(tmp_path, dataset=str(_jsonl(tmp_path)), tokenizer=model_dir))
    assert meta["tokenizer"]["sha256"] == local["tokenizer"]["sha256"]
    assert meta["splits"]["train"]["tokens"] == local["splits"]["train"]["tokens"]
    assert fs.exists(f"{store}/tokenizer/tokenizer.json")  # exported models get the tokenizer from here
    # Prepared once: the second run reuses the object-storage store.
    assert (
        run(
            tmp_path,
            dataset=f"s3://{BUCKET}/raw/corpus.jsonl",
            tokenizer=f"s3://{BUCKET}/models/my-llama",
            output_root=f"s3://{BUCKET}/prepared",
        )
        == store
    )


def _jsonl(tmp_path):
    path = tmp_path / "docs.jsonl"
    if not path.exists():
        path.write_text("".join(json.dumps({"text": d}) + "\n" for d in builtin_documents()[:50]))
    return path

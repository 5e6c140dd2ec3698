"""The token store v2 (trainer.data.token_store) and its preparation (trainer.prepare_data) with real
Hugging Face tokenizers built locally, every input form, shards, tokenizer identity at resume
(the real trainer under torchrun) and a store on S3 (moto server)."""

import json
import shutil

import numpy as np
import pytest
import torch

from conftest import BUCKET, FAST, run_trainer
from tests.hf_tokenizer_assets import EOS, tiny_tokenizer
from trainer.config.sections import DataConfig
from trainer.data.loader import TrainBatches, eval_batches, resolve_dataset
from trainer.prepare_data.cli import main
from trainer.prepare_data.pipeline import prepare
from trainer.data.token_store import BYTES_TOKENIZER, open_split, same_tokenizer

pytest.importorskip("tokenizers")

DOCS = [
    f"document {i}: the quick brown fox jumps over the lazy dog {i} times. " * (1 + i % 3) for i in range(8)
]
HELD_OUT = {3, 7}  # val_fraction 0.25: every 4th document


@pytest.fixture(scope="module")
def small_tok(tmp_path_factory):
    return tiny_tokenizer(tmp_path_factory.mktemp("tok") / "tok-a", vocab_size=200)


def _tokenizer(path):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(f"{path}/tokenizer.json")


def _expected(tok_dir, docs) -> list[int]:
    tok = _tokenizer(tok_dir)
    eos = tok.token_to_id(EOS)
    return [i for d in docs for i in [*tok.encode(d).ids, eos]]


def _quiet(_line):
    pass


def test_a_vocabulary_above_65535_ids_is_stored_as_uint32_and_round_trips(tmp_path, small_tok):
    big = tiny_tokenizer(tmp_path / "big", vocab_size=70_000)
    docs = ["the dog <|extra_69000|> sees the cat. <|extra_65600|>", "a red <|extra_1|> bird"] * 4
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    meta = prepare(
        [str(tmp_path / "docs.jsonl")], str(tmp_path / "store"), tokenizer=big, val_fraction=0.25, log=_quiet
    )
    assert meta["dtype"] == "uint32" and meta["vocab_size"] == 70_000
    assert meta["tokenizer"]["kind"] == "hf" and meta["tokenizer"]["name"] == "big"
    train = np.asarray(open_split(str(tmp_path / "store"), "train")[0])
    assert train.dtype == np.dtype("<u4") and train.max() > 65_535
    train_docs = [d for i, d in enumerate(docs) if i not in HELD_OUT]
    assert train.tolist() == _expected(big, train_docs)
    tok = _tokenizer(big)
    assert tok.decode(train.tolist(), skip_special_tokens=False).startswith(train_docs[0])
    # The tokenizer travels with the store, for an export to ship it.
    assert sorted(p.name for p in (tmp_path / "store" / "tokenizer").iterdir()) == [
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    # A small vocabulary: uint16.
    small = prepare([str(tmp_path / "docs.jsonl")], str(tmp_path / "s"), tokenizer=small_tok, log=_quiet)
    assert small["dtype"] == "uint16" and small["vocab_size"] == 200


def _write_input(kind: str, tmp_path):
    if kind == "jsonl":
        path = tmp_path / "docs.jsonl"
        path.write_text("".join(json.dumps({"id": i, "body": d}) + "\n" for i, d in enumerate(DOCS)))
    elif kind == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        path = tmp_path / "docs.parquet"
        pq.write_table(pa.table({"id": list(range(len(DOCS))), "body": DOCS}), path, row_group_size=3)
    else:
        datasets = pytest.importorskip("datasets")
        path = tmp_path / "docs-ds"
        datasets.Dataset.from_dict({"id": list(range(len(DOCS))), "body": DOCS}).save_to_disk(str(path))
    return str(path)


@pytest.mark.parametrize("kind", ["jsonl", "parquet", "datasets"])
def test_each_document_input_form_reads_back_as_the_tokenizers_ids(kind, tmp_path, small_tok):
    src = _write_input(kind, tmp_path)
    meta = prepare(
        [src], str(tmp_path / "store"), tokenizer=small_tok, text_field="body", val_fraction=0.25, log=_quiet
    )
    assert meta["splits"]["train"]["documents"] == 6 and meta["splits"]["val"]["documents"] == 2
    store = str(tmp_path / "store")
    train, val = (np.asarray(open_split(store, s)[0]).tolist() for s in ("train", "val"))
    assert train == _expected(small_tok, [d for i, d in enumerate(DOCS) if i not in HELD_OUT])
    assert val == _expected(small_tok, [DOCS[i] for i in sorted(HELD_OUT)])
    # The trainer's readers: a training sequence is a window of that stream; eval reads it in order.
    ld = TrainBatches(store, 16, 4, 2, 0, 1, seed=0, device=torch.device("cpu"))
    (x, _), _ = ld.next_batch()
    row = x[0].tolist()
    assert any(train[s : s + 16] == row for s in range(0, len(train) - 16, 16))
    ((vx, _),) = eval_batches(store, 8, 2, 1, torch.device("cpu"))
    assert vx[1].tolist() == val[8:16]


def test_a_text_file_is_a_document_with_its_tail_held_out(tmp_path, small_tok):
    text = "".join(DOCS) + "\nthe lazy dog.\n"
    (tmp_path / "a.txt").write_text(text)
    prepare(
        [str(tmp_path / "a.txt")], str(tmp_path / "store"), tokenizer=small_tok, val_fraction=0.1, log=_quiet
    )
    cut = len(text) - int(len(text) * 0.1)  # ASCII: bytes are characters
    train, val = (np.asarray(open_split(str(tmp_path / "store"), s)[0]).tolist() for s in ("train", "val"))
    assert train == _expected(small_tok, [text[:cut]]) and val == _expected(small_tok, [text[cut:]])


def test_a_text_file_without_newlines_is_read_in_bounded_blocks_cut_between_words(
    tmp_path, small_tok, monkeypatch
):
    import trainer.prepare_data.readers as prep

    monkeypatch.setattr(prep, "BLOCK_BYTES", 64)
    monkeypatch.setattr(prep, "LONG_LINE_BYTES", 256)
    text = "".join(DOCS).replace("\n", " ") * 4  # one line of about 4 KiB: 16 x LONG_LINE_BYTES
    (tmp_path / "a.txt").write_text(text)
    blocks = []
    read = prep._txt
    monkeypatch.setattr(prep, "_txt", lambda *a: (blocks.append(len(p.text)) or p for p in read(*a)))
    prepare(
        [str(tmp_path / "a.txt")], str(tmp_path / "store"), tokenizer=small_tok, val_fraction=0.1, log=_quiet
    )
    assert len(blocks) > 10 and max(blocks) <= 256 + 64  # never the whole line in memory
    cut = len(text) - int(len(text) * 0.1)
    train, val = (np.asarray(open_split(str(tmp_path / "store"), s)[0]).tolist() for s in ("train", "val"))
    # cut before spaces, the blocks give the very ids of the text encoded whole
    assert train == _expected(small_tok, [text[:cut]]) and val == _expected(small_tok, [text[cut:]])


def test_a_dataset_dict_holds_out_its_validation_split(tmp_path, small_tok):
    datasets = pytest.importorskip("datasets")
    dd = datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict({"text": DOCS[:5]}),
            "validation": datasets.Dataset.from_dict({"text": DOCS[5:]}),
        }
    )
    dd.save_to_disk(str(tmp_path / "dd"))
    prepare([str(tmp_path / "dd")], str(tmp_path / "store"), tokenizer=small_tok, log=_quiet)
    train, val = (np.asarray(open_split(str(tmp_path / "store"), s)[0]).tolist() for s in ("train", "val"))
    assert train == _expected(small_tok, DOCS[:5]) and val == _expected(small_tok, DOCS[5:])


def test_bad_inputs_are_refused_naming_the_option_the_value_and_where(tmp_path, small_tok, capsys):
    bad = tmp_path / "docs.jsonl"
    bad.write_text(json.dumps({"text": "fine"}) + "\n\n" + json.dumps({"body": "no text"}) + "\n")
    out = tmp_path / "store"
    assert main(["--input", str(bad), "--out", str(out), "--tokenizer", small_tok]) == 2
    err = capsys.readouterr().err
    assert f"--text-field: {bad} line 3: 'text' is missing (it has: body)" in err
    assert not out.exists() and not list(tmp_path.glob(".store.tmp-*"))  # nothing half-written left
    (tmp_path / "x.csv").write_text("a,b\n")
    assert main(["--input", str(tmp_path / "x.csv"), "--out", str(out)]) == 2
    assert "unknown input kind" in capsys.readouterr().err
    out.mkdir()
    (tmp_path / "ok.txt").write_text("hello")
    assert main(["--input", str(tmp_path / "ok.txt"), "--out", str(out)]) == 2
    assert f"--out: {out} already exists" in capsys.readouterr().err


def test_shards_read_as_one_stream_and_give_the_same_batches_as_one_file(tmp_path, small_tok):
    src = _write_input("jsonl", tmp_path)
    lines = []
    one = prepare([src], str(tmp_path / "one"), tokenizer=small_tok, text_field="body", log=_quiet)
    many = prepare(
        [src],
        str(tmp_path / "many"),
        tokenizer=small_tok,
        text_field="body",
        shard_tokens=37,
        log=lines.append,
    )
    shards = many["splits"]["train"]["shards"]
    assert len(one["splits"]["train"]["shards"]) == 1 and len(shards) > 5
    assert (
        all(s["tokens"] == 37 for s in shards[:-1])
        and sum(s["tokens"] for s in shards) == one["splits"]["train"]["tokens"]
    )
    assert any("tokens/s" in line for line in lines)  # progress for a task log
    a, b = (np.asarray(open_split(str(tmp_path / d), "train")[0]) for d in ("one", "many"))
    assert a.tolist() == b.tolist()

    def batches(d, ws, rank, state=None):
        ld = TrainBatches(str(tmp_path / d), 16, 4, 2, rank, ws, seed=7, device=torch.device("cpu"))
        if state:
            ld.load_state_dict(state)
        return [[x.tolist() for mb in ld.next_batch() for x in mb[0]] for _ in range(6)], ld.state_dict()

    (first, state) = batches("one", 1, 0)
    assert batches("many", 1, 0)[0] == first  # sequences that straddle shards read whole
    assert batches("many", 2, 0)[0][0] + batches("many", 2, 1)[0][0] == first[0]  # any world size
    assert batches("many", 1, 0, state)[0] == batches("one", 1, 0, state)[0]  # resume at the same place


def test_tokenizer_identity(small_tok, tmp_path):
    other = tiny_tokenizer(tmp_path / "tok-b", vocab_size=180)
    a, b = (json.load(open(f"{d}/tokenizer.json")) for d in (small_tok, other))
    assert a != b
    from trainer.prepare_data.tokenizer import HFTokenizer

    ia, ib = HFTokenizer(small_tok).identity, HFTokenizer(other).identity
    assert same_tokenizer(ia, dict(ia, name="renamed")) and not same_tokenizer(ia, ib)
    assert same_tokenizer(None, BYTES_TOKENIZER) and not same_tokenizer(None, ia)  # old manifests: bytes


@pytest.mark.torchrun
def test_a_checkpoint_refuses_data_prepared_with_another_tokenizer(tmp_path, data_dir):
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"text": d}) + "\n" for d in DOCS * 4))
    tok_a = tiny_tokenizer(tmp_path / "tok-a", vocab_size=200)
    tok_b = tiny_tokenizer(tmp_path / "tok-b", vocab_size=150)
    store, ckpt = tmp_path / "store", tmp_path / "ckpt"
    meta_a = prepare([str(docs)], str(store), tokenizer=tok_a, seq_len=32, log=_quiet)  # FAST's seq_len
    args = [*FAST, "--set", f"data.dataset={store}", "--checkpoint-uri", str(ckpt), "--checkpoint-every", "2"]
    first = run_trainer([*args, "--steps", "2"], data_dir, nproc=2)
    assert first.returncode == 0, first
    manifest = json.load(open(ckpt / "step-00000002" / "manifest.json"))
    assert manifest["tokenizer"] == meta_a["tokenizer"]

    shutil.rmtree(store)  # the same path, re-prepared with another tokenizer
    meta_b = prepare([str(docs)], str(store), tokenizer=tok_b, seq_len=32, log=_quiet)
    second = run_trainer([*args, "--steps", "4"], data_dir, nproc=1)
    assert second.returncode != 0
    sha_a, sha_b = meta_a["tokenizer"]["sha256"][:12], meta_b["tokenizer"]["sha256"][:12]
    assert f"prepared with tokenizer tok-b (sha256 {sha_b}" in second.stderr, second
    assert f"trained with tokenizer tok-a (sha256 {sha_a}" in second.stderr


def test_a_store_on_s3_is_cached_node_locally_and_read_by_the_trainer(s3, tmp_path, small_tok, monkeypatch):
    src = _write_input("jsonl", tmp_path)
    uri = f"s3://{BUCKET}/tokens/docs"
    meta = prepare([src], uri, tokenizer=small_tok, text_field="body", shard_tokens=50, log=_quiet)
    local = prepare([src], str(tmp_path / "local"), tokenizer=small_tok, text_field="body", log=_quiet)
    import fsspec

    fs = fsspec.filesystem("s3", skip_instance_cache=True)
    names = sorted(p.rsplit("/", 1)[-1] for p in fs.find(f"{BUCKET}/tokens/docs"))
    assert "meta.json" in names and "tokenizer.json" in names and len(names) > 5
    with pytest.raises(ValueError, match="--out: .* already exists"):
        prepare([src], uri, log=_quiet)

    monkeypatch.setenv("DTRAIN_DATA_DIR", str(tmp_path / "cache"))
    waited = []
    path = resolve_dataset(DataConfig(dataset=uri), True, lambda: waited.append(1))
    assert waited == [1] and path.startswith(str(tmp_path / "cache"))
    assert (tmp_path / "cache").joinpath(path, "tokenizer", "tokenizer.json").exists()
    stream, m = open_split(path, "train")
    assert m["splits"] == meta["splits"]
    assert np.asarray(stream).tolist() == np.asarray(open_split(str(tmp_path / "local"), "train")[0]).tolist()
    assert local["tokenizer"] == meta["tokenizer"]
    # Another process of the node (not the leader) finds the copy; nothing is downloaded again.
    assert resolve_dataset(DataConfig(dataset=uri), False, lambda: None) == path
    # The evaluation of a checkpoint trained on it reads the same node-local copy.
    from trainer.evaluate import local_dataset

    assert local_dataset(uri) == path
    ld = TrainBatches(path, 16, 4, 2, 0, 1, seed=0, device=torch.device("cpu"))
    assert ld.next_batch()[0][0].shape == (2, 16)

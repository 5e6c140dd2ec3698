"""Your own data as it comes (trainer.prepare_data, PrepareDataOperator): bad rows get one policy in every
format, a binary file or a lone surrogate is refused naming the file and line, a directory or a glob of
shards is a dataset, and five documents prepare and train from a Hugging Face model with its step-0
evaluation."""

import json
import os
import uuid
import re
import shutil
import sys

import numpy as np
import pytest
import torch

from conftest import FAST, REPO, run_trainer
from tests.hf_tokenizer_assets import tiny_tokenizer
from trainer.config.fields import ConfigError
from trainer.data.loader import TrainBatches
from trainer.prepare_data.cli import main
from trainer.prepare_data.errors import PrepareError
from trainer.prepare_data.pipeline import prepare
from trainer.data.token_store import open_split, read_meta

pytest.importorskip("tokenizers")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
datasets = pytest.importorskip("datasets")

DOCS = [f"document {i}: the quick brown fox jumps over the lazy dog {i} times." for i in range(40)]
NULLS = [3, 4, 9, 15, 22, 28, 33, 39]  # 8 of 40 rows


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return tiny_tokenizer(tmp_path_factory.mktemp("tok") / "tok", vocab_size=256)


def _quiet(_line):
    pass


def _write(kind: str, path, values: list) -> str:
    """`values` as the "text" of each row, in the format `kind`."""
    if kind == "jsonl":
        path = path.with_suffix(".jsonl")
        path.write_text("".join(json.dumps({"id": i, "text": v}) + "\n" for i, v in enumerate(values)))
    elif kind == "parquet":
        path = path.with_suffix(".parquet")
        pq.write_table(pa.table({"id": list(range(len(values))), "text": values}), path, row_group_size=7)
    else:
        datasets.Dataset.from_dict({"id": list(range(len(values))), "text": values}).save_to_disk(str(path))
    return str(path)


FORMATS = ["jsonl", "parquet", "datasets"]
PLACE = {"jsonl": "line 4", "parquet": "row 3", "datasets": "row 3"}  # the first null: row 3, the 4th line


@pytest.mark.parametrize("kind", FORMATS)
def test_null_rows_are_refused_or_counted_the_same_in_every_format(kind, tmp_path, tok):
    src = _write(kind, tmp_path / "docs", [None if i in NULLS else d for i, d in enumerate(DOCS)])
    with pytest.raises(PrepareError) as err:
        prepare([src], str(tmp_path / "refused"), tokenizer=tok, log=_quiet)
    assert str(err.value) == (
        f"--input: {src} {PLACE[kind]}: 'text' is null (--on-bad-row=skip counts and skips such rows)"
    )
    assert not (tmp_path / "refused").exists()

    lines = []
    meta = prepare([src], str(tmp_path / "store"), tokenizer=tok, on_bad_row="skip", log=lines.append)
    assert meta["bad_rows"]["policy"] == "skip" and meta["bad_rows"]["rows"] == 40
    assert meta["bad_rows"]["skipped"] == 8
    unit, n = PLACE[kind].split()
    first = [{"file": src, unit: int(n) + (i - 3), "why": "'text' is null"} for i in NULLS[:5]]
    assert meta["bad_rows"]["first"] == first
    assert f"prepare_data: skipped {src} {PLACE[kind]}: 'text' is null" in lines
    assert any(
        line.startswith("prepare_data: skipped 8 bad rows of 40 (--on-bad-row=skip)") for line in lines
    )
    (done,) = [line for line in lines if line.startswith("prepare_data: done")]
    assert "32 documents" in done and "(8 bad rows of 40 skipped)" in done
    # The 32 good documents, whatever the format: the same store as a file without the bad rows.
    good = _write("jsonl", tmp_path / "clean", [d for i, d in enumerate(DOCS) if i not in NULLS])
    clean = prepare([good], str(tmp_path / "clean-store"), tokenizer=tok, log=_quiet)
    assert meta["splits"] == clean["splits"] and clean["bad_rows"]["skipped"] == 0


@pytest.mark.parametrize("kind", FORMATS)
def test_a_column_of_numbers_is_refused_or_skipped_whole_the_same_in_every_format(kind, tmp_path, tok):
    src = _write(kind, tmp_path / "docs", list(range(10)))
    first = {"jsonl": "line 1", "parquet": "row 0", "datasets": "row 0"}[kind]
    with pytest.raises(PrepareError, match=rf"^--text-field: .*{first}: 'text' is an int, not a string \("):
        prepare([src], str(tmp_path / "store"), tokenizer=tok, log=_quiet)
    with pytest.raises(PrepareError, match=r"^--input: no text found in docs.* \(10 bad rows of 10 skipped"):
        prepare([src], str(tmp_path / "store"), tokenizer=tok, on_bad_row="skip", log=_quiet)


def test_binary_files_are_refused_naming_the_file_whatever_the_policy(tmp_path, tok):
    parquet = tmp_path / "real.parquet"
    pq.write_table(pa.table({"text": DOCS[:3]}), parquet)
    cases = {
        "random.jsonl": (bytes(range(256)) * 4, "line 1: the file is binary (a NUL byte"),
        "parquet.jsonl": (parquet.read_bytes(), "line 1: the file is a parquet file, not JSON lines text"),
        "gzip.jsonl": (b"\x1f\x8b\x08\x00" + bytes(range(1, 200)), "line 1: the file is gzip-compressed"),
        "text.parquet": (b'{"text": "a document"}\n', "is not a parquet file pyarrow can read"),
    }
    for name, (data, message) in cases.items():
        path = tmp_path / name
        path.write_bytes(data)
        for policy in ("error", "skip"):
            with pytest.raises(PrepareError) as err:
                prepare([str(path)], str(tmp_path / "store"), tokenizer=tok, on_bad_row=policy, log=_quiet)
            assert str(err.value).startswith(f"--input: {path}"), (name, err.value)
            assert message in str(err.value), (name, err.value)
    # a .txt is one document: refused where it stops being UTF-8, for a tokenizer (byte-level reads bytes)
    latin = tmp_path / "latin.txt"
    latin.write_bytes(b"the dog.\n" * 1000 + b"caf\xe9\n" + b"the cat.\n" * 10)
    with pytest.raises(PrepareError, match=rf"^--input: {re.escape(str(latin))} byte 9003: not UTF-8 text"):
        prepare([str(latin)], str(tmp_path / "store"), tokenizer=tok, log=_quiet)


@pytest.mark.parametrize("tokenizer", ["bytes", "hf"])
def test_a_lone_surrogate_bad_bytes_and_broken_lines_are_named_by_line(tokenizer, tmp_path, tok, capsys):
    path = tmp_path / "docs.jsonl"
    path.write_bytes(
        b'{"text": "fine"}\n'
        b'{"text": "ab\\ud800c"}\n'  # a lone surrogate in JSON's escape: valid JSON, not text
        b'{"text": "caf\xe9"}\n'  # Latin-1, not UTF-8
        b'{"text": "cut short\n'
        b"[1, 2]\n"
        b'{"text": "the end"}\n'
    )
    args = ["--input", str(path), "--out", str(tmp_path / "store")]
    args += ["--tokenizer", tok] if tokenizer == "hf" else []
    assert main(args) == 2
    assert capsys.readouterr().err == (
        f"--input: {path} line 2: 'text' holds a lone surrogate (\\ud800) at "
        "character 2: not Unicode text (--on-bad-row=skip counts and skips "
        "such rows)\n"
    )
    assert main([*args, "--on-bad-row", "skip"]) == 0
    out = capsys.readouterr().out
    for line, why in (
        (2, "'text' holds a lone surrogate"),
        (3, "not UTF-8 (byte 0xe9 at column 14)"),
        (4, "not JSON: Invalid control character at column 20"),
        (5, "a JSON array, not an object with 'text'"),
    ):
        assert f"prepare_data: skipped {path} line {line}: {why}" in out
    meta = read_meta(str(tmp_path / "store"))
    assert meta["bad_rows"]["skipped"] == 4 and meta["splits"]["train"]["documents"] == 1
    assert meta["splits"]["val"]["documents"] == 1  # two documents: one of them held out


def _shards(root, kind="jsonl"):
    """DOCS[:30] as three shards of ten documents, with a marker file that is not data."""
    root.mkdir()
    for n in range(3):
        _write(kind, root / f"part-{n:05d}", DOCS[10 * n : 10 * n + 10])
    (root / "_SUCCESS").write_text("")
    return root


def test_a_directory_or_a_glob_of_shards_is_one_dataset_in_name_order(tmp_path, tok):
    # byte-level: every character counts (the tiny tokenizer has no digits; the documents differ by theirs)
    whole = prepare([_write("jsonl", tmp_path / "whole", DOCS[:30])], str(tmp_path / "one"), log=_quiet)
    for kind in ("jsonl", "parquet"):
        shards = _shards(tmp_path / f"shards-{kind}", kind)
        for n, spec in enumerate((str(shards), f"{shards}/part-*.{kind}", f"{shards}/")):
            meta = prepare([spec], str(tmp_path / f"store-{kind}-{n}"), log=_quiet)
            assert meta["splits"] == whole["splits"], spec
            # the 20th document is held out: the documents are counted across the shards of ten
            for split in ("train", "val"):
                assert (
                    np.asarray(open_split(str(tmp_path / f"store-{kind}-{n}"), split)[0]).tolist()
                    == np.asarray(open_split(str(tmp_path / "one"), split)[0]).tolist()
                )
    assert read_meta(str(tmp_path / "store-jsonl-1"))["source"] == "shards-jsonl/part-*.jsonl"

    mixed = _shards(tmp_path / "mixed")
    _write("parquet", mixed / "part-00009", DOCS[:2])
    named = re.escape(str(mixed))
    with pytest.raises(
        PrepareError,
        match=rf"^--input: {named} mixes jsonl \(.*part-00000.jsonl\) and "
        rf"parquet \(.*part-00009.parquet\) files: .* e.g. .*/\*.jsonl$",
    ):
        prepare([str(mixed)], str(tmp_path / "x"), tokenizer=tok, log=_quiet)
    (mixed / "part-00009.parquet").unlink()
    (mixed / "notes.csv").write_text("a,b\n")
    with pytest.raises(PrepareError, match=rf"^--input: {named} holds .*mixed/notes.csv, which is not a "):
        prepare([str(mixed)], str(tmp_path / "x"), tokenizer=tok, log=_quiet)
    with pytest.raises(PrepareError, match=r"^--input: .*/nothing-\*.jsonl matches no file$"):
        prepare([f"{tmp_path}/nothing-*.jsonl"], str(tmp_path / "x"), tokenizer=tok, log=_quiet)


def test_a_glob_of_shards_on_s3(s3, tmp_path, tok):
    import fsspec

    from conftest import BUCKET

    fs = fsspec.filesystem("s3", skip_instance_cache=True)
    # a prefix of its own: moto keeps one bucket per process, which other tests of this worker write to
    raw = f"raw{uuid.uuid4().hex[:8]}"
    shards = _shards(tmp_path / "shards")
    for name in sorted(os.listdir(shards)):
        fs.put_file(str(shards / name), f"{BUCKET}/{raw}/{name}")
    local = prepare([str(shards)], str(tmp_path / "local"), tokenizer=tok, log=_quiet)
    for n, spec in enumerate((f"s3://{BUCKET}/{raw}/part-*.jsonl", f"s3://{BUCKET}/{raw}")):
        meta = prepare([spec], str(tmp_path / f"from-s3-{n}"), tokenizer=tok, log=_quiet)
        assert meta["splits"] == local["splits"], spec
    # the DAG's task: its store named after the glob's directory, keyed by every shard's ETag
    from airflow_dtrain.operators.prepare_data import PrepareDataOperator

    task = PrepareDataOperator(
        task_id="prepare_data",
        dataset=f"s3://{BUCKET}/{raw}/part-*.jsonl",
        tokenizer=tok,
        output_root=f"s3://{BUCKET}/prepared",
    )
    store = task.execute({})
    assert store.startswith(f"s3://{BUCKET}/prepared/{raw}-tok-")
    assert json.loads(fs.cat_file(f"{store}/meta.json"))["splits"] == local["splits"]


def test_small_data_holds_out_a_document_or_a_sequence_or_is_refused_with_counts(tmp_path, tok):
    src = _write("jsonl", tmp_path / "five", DOCS[:5])
    lines = []
    meta = prepare([src], str(tmp_path / "store"), tokenizer=tok, log=lines.append)  # 1/20 of 5: none
    assert meta["splits"]["val"]["documents"] == 1 and meta["splits"]["train"]["documents"] == 4
    said = "prepare_data: --val-fraction 0.05 held out 0 documents, 0 tokens, short of one document: the last"
    assert any(
        line.startswith(f"{said} 1 document of training (") and line.endswith(") is held out too")
        for line in lines
    )
    tokens = meta["splits"]["train"]["tokens"] + meta["splits"]["val"]["tokens"]
    per_doc = meta["splits"]["val"]["tokens"]
    # --seq-len: the held-out split holds one evaluation sequence, of whole documents
    seq = per_doc
    meta = prepare([src], str(tmp_path / "seq"), tokenizer=tok, seq_len=seq, log=_quiet)
    assert meta["splits"]["val"]["tokens"] >= seq + 1 and meta["splits"]["train"]["tokens"] >= seq + 1
    with pytest.raises(PrepareError) as err:
        prepare([src], str(tmp_path / "refused"), tokenizer=tok, seq_len=tokens // 2, log=_quiet)
    assert str(err.value) == (
        f"--input: too little text to train and evaluate at --seq-len {tokens // 2}: five.jsonl gives 5 "
        f"documents, {tokens} tokens; training and the held-out evaluation need a sequence of "
        f"{tokens // 2 + 1} tokens each (seq_len + 1), from whole documents of their own: give more text, or "
        "a shorter --seq-len"
    )
    one = _write("jsonl", tmp_path / "one", DOCS[:1])
    with pytest.raises(
        PrepareError,
        match=r"^--input: too little text to hold out a document for evaluation"
        r": one.jsonl gives 1 document, \d+ tokens; the held-out split",
    ):
        prepare([one], str(tmp_path / "x"), tokenizer=tok, log=_quiet)
    assert not (tmp_path / "refused").exists() and not (tmp_path / "x").exists()

    # A store that cannot give one evaluation sequence is refused when training starts, with its counts.
    with pytest.raises(
        ConfigError,
        match=rf"^data.dataset: .*/store \(five.jsonl\): its held-out split has "
        rf"{per_doc} tokens, fewer than one sequence of seq_len \+ 1 = "
        rf"{per_doc + 1}",
    ):
        TrainBatches(str(tmp_path / "store"), per_doc, 4, 2, 0, 1, seed=0, device=torch.device("cpu"))


@pytest.mark.torchrun
def test_five_documents_in_three_shards_train_from_a_model_and_evaluate_at_step_0(data_dir, tmp_path):
    sys.path.insert(0, str(REPO / "tests"))
    from hf_model_assets import tiny_llama

    model = tiny_llama(tmp_path / "my-llama", vocab_size=256)
    tiny_tokenizer(model, vocab_size=256)  # the model directory's tokenizer files
    shards = tmp_path / "shards"
    shards.mkdir()
    for n, docs in enumerate((DOCS[:2], DOCS[2:4], DOCS[4:5])):
        _write("jsonl", shards / f"part-{n}", docs)
    meta = prepare([str(shards)], str(tmp_path / "store"), tokenizer=model, seq_len=32, log=_quiet)
    assert meta["splits"]["train"]["documents"] + meta["splits"]["val"]["documents"] == 5
    run = run_trainer(
        [
            *FAST,
            "--steps",
            "2",
            "--set",
            f"model.init_from={model}",
            "--set",
            f"data.dataset={tmp_path / 'store'}",
        ],
        data_dir,
    )
    assert run.returncode == 0, run
    (start,) = run.of("eval")
    assert start["step"] == 0 and np.isfinite(start["loss"]) and start["tokens"] >= 32
    assert sorted(run.losses()) == [1, 2] and "Traceback" not in run.stderr


def test_the_task_takes_a_directory_a_policy_and_a_sequence_length(tmp_path, tok):
    from airflow_dtrain.operators.prepare_data import DataError, PrepareDataOperator

    shards = tmp_path / "shards"
    shards.mkdir()
    rows = [None if i in NULLS else d for i, d in enumerate(DOCS)]
    for n in range(3):
        _write("parquet", shards / f"part-{n}", rows[10 * n : 10 * n + 10])

    model = shutil.copytree(tok, tmp_path / "tok")  # within the roots

    def run(**kwargs):
        return PrepareDataOperator(
            task_id="prepare_data",
            output_root=str(tmp_path / "data"),
            tokenizer=str(model),
            allowed_roots=[str(tmp_path)],
            **kwargs,
        ).execute({})

    with pytest.raises(DataError) as err:
        run(dataset=str(shards))
    assert str(err.value) == (
        f"dataset: {shards}/part-0.parquet row 3: 'text' is null (on_bad_row='skip' "
        "counts and skips such rows)"
    )
    store = run(dataset=str(shards), on_bad_row="skip", seq_len="16")  # templated: a string
    assert os.path.basename(store).startswith("shards-tok-")
    meta = read_meta(store)
    assert meta["bad_rows"]["skipped"] == 6  # the nulls of rows 0-29
    assert meta["splits"]["val"]["tokens"] >= 17
    assert run(dataset=str(shards), on_bad_row="skip", seq_len=16) == store  # prepared once
    # longer sequences than it holds out: a store of their own, from the same text
    longer = run(dataset=str(shards), on_bad_row="skip", seq_len=60)
    assert longer == f"{store}-seq60" and read_meta(longer)["splits"]["val"]["tokens"] >= 61
    with pytest.raises(
        DataError,
        match=r"^dataset: '.*' is a token store whose train split has [\d,]+ "
        r"tokens, fewer than one sequence of seq_len \+ 1 = 100,001",
    ):
        run(dataset=store, seq_len=100_000)
    # A shard behind a symbolic link stays within the roots like any other path.
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    outside.mkdir()
    _write("parquet", outside / "secret", DOCS[:3])
    os.symlink(outside / "secret.parquet", shards / "part-9.parquet")
    with pytest.raises(DataError, match=r"^dataset: '.*/shards/part-9.parquet' is outside the storage roots"):
        run(dataset=f"{shards}/*.parquet", on_bad_row="skip")

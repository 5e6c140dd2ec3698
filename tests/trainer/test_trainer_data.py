"""trainer.data.loader and trainer.prepare_data: the corpus, the on-disk format, each rank's slice."""

import json
import subprocess
import sys

import numpy as np
import torch

from conftest import REPO
from trainer.data.loader import TrainBatches, ensure_builtin, eval_batches
from trainer.data.builtin_text import BUILTIN_NAME, generate_builtin_text
from trainer.data.token_store import open_split


def test_builtin_corpus_is_deterministic_english_like_text():
    a, b = generate_builtin_text(20_000, seed=1234), generate_builtin_text(20_000, seed=1234)
    assert a == b and len(a) == 20_000
    text = a.decode()
    assert text.count(". ") > 100 and " the " in text


def test_builtin_corpus_is_built_once_with_train_and_held_out_splits(data_dir):
    path = ensure_builtin(data_dir)
    assert path.endswith(BUILTIN_NAME)
    meta = json.load(open(f"{path}/meta.json"))
    assert meta["vocab_size"] == 256 and meta["dtype"] == "uint16"
    train, _ = open_split(path, "train")
    val, _ = open_split(path, "val")
    assert len(train) == meta["splits"]["train"] > 1_000_000
    assert len(val) == meta["splits"]["val"] > 10_000
    assert np.asarray(train).max() < 256
    # Held-out text is not a copy of the training text.
    assert bytes(val[:200].astype(np.uint8)) not in bytes(np.asarray(train).astype(np.uint8))
    mtime = (REPO / path / "meta.json").stat().st_mtime
    ensure_builtin(data_dir)  # cached: not rebuilt
    assert (REPO / path / "meta.json").stat().st_mtime == mtime


def _global_batches(path, world_size, steps, micro=2, gbs=8):
    """Per step, the set of sequences (as bytes) seen by all ranks together, and per rank."""
    loaders = [
        TrainBatches(path, 16, gbs, micro, r, world_size, seed=3, device=torch.device("cpu"))
        for r in range(world_size)
    ]
    out = []
    for _ in range(steps):
        per_rank = [
            [bytes(x.numpy().astype(np.uint8)) for mb in ld.next_batch() for x in mb[0]] for ld in loaders
        ]
        out.append(per_rank)
    return out


def test_ranks_read_disjoint_slices_whose_union_does_not_depend_on_world_size(data_dir):
    path = ensure_builtin(data_dir)
    one, two, four = (_global_batches(path, ws, steps=3) for ws in (1, 2, 4))
    for s in range(3):
        assert len(two[s][0]) == 4 and len(four[s][0]) == 2  # 8 sequences split over the ranks
        assert not set(two[s][0]) & set(two[s][1])  # disjoint
        assert sum(two[s], []) == one[s][0] == sum(four[s], [])  # same global batch, same order
    assert one[0][0] != one[1][0]  # and it moves on


def test_inputs_and_targets_are_shifted_by_one(data_dir):
    ld = TrainBatches(ensure_builtin(data_dir), 16, 4, 2, 0, 1, seed=0, device=torch.device("cpu"))
    (x, y), _ = ld.next_batch()
    assert x.shape == y.shape == (2, 16) and x.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])


def test_data_position_restores_exactly(data_dir):
    path = ensure_builtin(data_dir)
    a = TrainBatches(path, 16, 8, 4, 1, 2, seed=5, device=torch.device("cpu"))
    for _ in range(7):
        a.next_batch()
    state = a.state_dict()
    expected = a.next_batch()
    b = TrainBatches(path, 16, 8, 4, 1, 2, seed=5, device=torch.device("cpu"))
    b.load_state_dict(state)
    for (xa, ya), (xb, yb) in zip(expected, b.next_batch()):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)


def test_eval_batches_cover_the_held_out_split_in_order(data_dir):
    path = ensure_builtin(data_dir)
    batches = list(eval_batches(path, 32, 4, 3, torch.device("cpu")))
    assert len(batches) == 3 and batches[0][0].shape == (4, 32)
    val, _ = open_split(path, "val")
    assert torch.equal(batches[0][0][1], torch.from_numpy(val[32:64].astype(np.int64)))


def test_prepare_data_writes_the_trainer_format(tmp_path):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("hello world. " * 400)
    b.write_text("héllo again! " * 400)
    out = tmp_path / "tok"
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainer.prepare_data",
            "--input",
            str(a),
            str(b),
            "--out",
            str(out),
            "--val-fraction",
            "0.1",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert p.returncode == 0, p.stderr
    meta = json.load(open(out / "meta.json"))
    train, _ = open_split(str(out), "train")
    val, _ = open_split(str(out), "val")
    total = len(a.read_bytes()) + len(b.read_bytes())
    assert (meta["version"], meta["tokenizer"], meta["dtype"]) == (2, {"kind": "bytes"}, "uint16")
    assert {s: meta["splits"][s]["tokens"] for s in ("train", "val")} == {
        "train": len(train),
        "val": len(val),
    }
    assert (
        len(train) + len(val) == total + 4 * 2
    )  # each file a document in each split, each ending in a blank line
    assert "héllo".encode() in bytes(np.asarray(train).astype(np.uint8))
    # Refuses to overwrite.
    again = subprocess.run(
        [sys.executable, "-m", "trainer.prepare_data", "--input", str(a), "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert again.returncode == 2 and "already exists" in again.stderr

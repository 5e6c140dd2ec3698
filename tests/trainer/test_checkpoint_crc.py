"""The trainer's saves skip torch.save's per-record CRC32 (the manifest's xxh3 of every file guards them),
and checkpoints written either way load through the trainer's reader."""

from __future__ import annotations

import io
import zipfile

import pytest
import torch
import torch.distributed.checkpoint as dcp
from conftest import FAST, run_trainer
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from trainer.checkpoint.reader import storage_reader
from trainer.checkpoint.state import checkpoint_tensors
from trainer.base.storage import Storage


def _records(step_dir) -> list[zipfile.ZipInfo]:
    """The zip records of every tensor item of a DCP checkpoint (each item is one torch.save blob at the
    offset its metadata gives)."""
    metadata = storage_reader(Storage(str(step_dir)), str(step_dir)).read_metadata()
    records = []
    for index, info in metadata.storage_data.items():
        if not isinstance(metadata.state_dict_metadata[index.fqn], TensorStorageMetadata):
            continue
        with open(step_dir / info.relative_path, "rb") as f:
            f.seek(info.offset)
            blob = f.read(info.length)
        records += zipfile.ZipFile(io.BytesIO(blob)).infolist()
    return records


def test_the_trainers_tensor_records_carry_no_crc(data_dir, tmp_path):
    """(Every resume test of the suite resumes from such checkpoints.)"""
    ckpt = tmp_path / "ckpt"
    run = run_trainer(
        [*FAST, "--checkpoint-uri", str(ckpt), "--checkpoint-every", "2", "--steps", "2"], data_dir
    )
    assert run.returncode == 0, run
    records = [r for r in _records(ckpt / "step-00000002") if r.filename.endswith("data/0")]
    assert records, "no tensor data record found"
    assert {r.CRC for r in records} == {0}, "torch.save computed a CRC32 the manifest's xxh3 makes redundant"


@pytest.mark.parametrize("crc", [True, False], ids=["with-crc", "without-crc"])
def test_a_checkpoint_loads_through_the_trainers_reader_with_or_without_crc(tmp_path, crc):
    """Checkpoints from trainers before this change have CRCs; both kinds read back bit for bit."""
    before = torch.serialization.get_crc32_options()
    torch.serialization.set_crc32_options(crc)  # this thread, which writes the one file
    try:
        _save_and_load(tmp_path, crc)
    finally:
        torch.serialization.set_crc32_options(before)


def _save_and_load(tmp_path, crc: bool) -> None:
    state = {"w": torch.randn(64, 32), "b": torch.arange(10, dtype=torch.int64)}
    step_dir = tmp_path / "step-00000001"
    dcp.save(state, checkpoint_id=str(step_dir), no_dist=True)
    crcs = {r.CRC for r in _records(step_dir) if r.filename.endswith("data/0")}
    assert (crcs != {0}) is crc, crcs

    loaded = checkpoint_tensors(str(step_dir))
    assert torch.equal(loaded["w"], state["w"]) and torch.equal(loaded["b"], state["b"])

"""Reading a checkpoint without running anything it holds: DCP's readers, made safe.

torch.distributed.checkpoint trusts its files. ``FileSystemReader.read_metadata`` is ``pickle.load``
of ``.metadata``, and its load planner unpickles every non-tensor item (the step, the scheduler, the
data position, the optimizer's settings) with ``torch.load(weights_only=False)``. Whoever can write a
directory that a job is pointed at (a trigger's ``checkpoint_uri``) could leave a pickle there that
runs code in the validation task, the trainer, the evaluation and the export; the manifest's checksums
do not help, the same hand writes them.

So every reader of the trainer's checkpoints (``trainer.checkpoint.reader.storage_reader``) is one of
these:

* ``.metadata`` is unpickled by ``MetadataUnpickler``, which resolves only the globals a DCP
  ``Metadata`` is made of (``ALLOWED``) and refuses any other before it is looked up: nothing the
  file names is imported or called;
* a byte item is unpickled by torch's weights-only unpickler before the planner gets it.

A refusal raises ``UnsafeCheckpoint``, naming the file and what it refused.
"""

from __future__ import annotations

import contextlib
import functools
import io
import pathlib
import pickle
import re
from typing import IO, Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import LoadItemType

from trainer.torch_private import tensor_hooks


def _allowed() -> dict[tuple[str, str], Any]:
    """{(module, name): object} of every global a DCP ``.metadata`` names: found by unpickling the metadata
    of the trainer's own checkpoints (model, optimizer, scheduler, data position, RNG states; one rank and
    two) on torch 2.13, whose checkpoint code 2.14 keeps unchanged."""
    dcp_metadata = (
        Metadata,
        TensorStorageMetadata,
        BytesStorageMetadata,
        ChunkStorageMetadata,
        TensorProperties,
        MetadataIndex,
        StorageMeta,
    )
    allowed: dict[tuple[str, str], Any] = {
        **{("torch.distributed.checkpoint.metadata", cls.__name__): cls for cls in dcp_metadata},
        ("torch", "Size"): torch.Size,  # tensor sizes, chunk offsets and sizes
        # the private ones (trainer.torch_private, hook dcp_metadata_globals): each item's slice of a file
        # (storage_data's values, written by FileSystemWriter and FsspecWriter); the memory format enum that
        # TensorProperties pickles; the lookup torch.layout pickles as a call of (copyreg, a dict get by name)
        **tensor_hooks.dcp_metadata_globals(),
    }
    # dtypes pickle as attributes of torch, by name ("torch", "float32")
    allowed.update({("torch", name): v for name, v in vars(torch).items() if isinstance(v, torch.dtype)})
    # StorageMeta.checkpoint_id: the step directory as FileSystemWriter holds it, a Path; Python 3.13 (alone)
    # pickles paths as pathlib._local's
    allowed[("pathlib", "PosixPath")] = allowed[("pathlib._local", "PosixPath")] = pathlib.PosixPath
    return allowed


ALLOWED = _allowed()
"""The globals ``MetadataUnpickler`` resolves: DCP's metadata classes, ``torch.Size``, the dtypes, the layout
lookup and ``PosixPath``. Building any of them from a file's arguments runs no code of the file's choosing."""


class UnsafeCheckpoint(pickle.UnpicklingError):
    """A checkpoint file holds an object that the trainer refuses to unpickle; nothing it names was run.

    ``file``: the file (``.../step-00000050/.metadata``, or the shard holding a byte item); ``refused``: what
    it named (``posix.system``; the weights-only unpickler's reason where torch gives no name); ``item``:
    the byte item's key (None for .metadata); ``detail``: the message without the file.
    """

    def __init__(self, file: str, refused: str, item: str | None = None):
        self.file, self.refused, self.item = file, refused, item
        what = f"its byte item {item}" if item else "its .metadata"
        self.detail = (
            f"{what} holds a disallowed object, {refused}, which a DCP checkpoint never holds; "
            f"refused, nothing in the file was executed (it was written by something other than "
            f"torch.distributed.checkpoint, or tampered with)"
        )
        super().__init__(f"{file}: {self.detail}")

    def __reduce__(self):  # dcp.load gathers every rank's failure to every rank, pickled
        return type(self), (self.file, self.refused, self.item)


class MetadataUnpickler(pickle.Unpickler):
    """``pickle.Unpickler`` for DCP's ``.metadata``: resolves the globals in ``ALLOWED``, refuses any other.

    Every way a pickle reaches a class or a callable (GLOBAL, STACK_GLOBAL, INST, OBJ, the copyreg extension
    codes) goes through ``find_class``; persistent ids and out-of-band buffers are refused by ``pickle``
    itself when, as here, no handler for them is given.
    """

    def __init__(self, file: IO[bytes], name: str):
        super().__init__(file)
        self.name = name

    def find_class(self, module: str, name: str) -> Any:
        try:
            return ALLOWED[(module, name)]
        except KeyError:
            found = tensor_hooks.dcp_global_fallback(module, name)  # where DCP's private names moved
            if found is None:
                raise UnsafeCheckpoint(self.name, f"{module}.{name}") from None
            return found


def load_metadata(file: IO[bytes], name: str) -> Metadata:
    """The DCP ``Metadata`` pickled in ``file`` (called ``name`` in errors), read by ``MetadataUnpickler``."""
    metadata = MetadataUnpickler(file, name).load()
    if not isinstance(metadata, Metadata):
        raise pickle.UnpicklingError(f"{name}: holds a {type(metadata).__name__}, not DCP's Metadata")
    return metadata


def _load_weights_only(value: io.BytesIO, file: str, item: str) -> Any:
    """A byte item, unpickled by torch's weights-only unpickler; a refusal raises ``UnsafeCheckpoint``."""
    try:
        return torch.load(value, weights_only=True)
    except pickle.UnpicklingError as err:
        # torch's words: "... Unsupported global: GLOBAL posix.system was not an allowed global by default"
        found = re.search(r"GLOBAL (\S+)", str(err))
        raise UnsafeCheckpoint(file, found.group(1) if found else str(err).splitlines()[0], item) from None


class _WeightsOnlyBytes:
    """The load planner as ``FileSystemReader.read_data`` sees it: a byte item is first unpickled by the
    weights-only unpickler, and the planner is handed that object as torch.save pickles it anew.

    The planner's own ``load_bytes`` stays (where the object goes in the state dict is its business), and
    ``DefaultLoadPlanner``'s ``torch.load(weights_only=False)`` then reads a pickle of what the weights-only
    unpickler built (containers, numbers, strings, tensors), never the file's bytes.
    """

    def __init__(self, planner, reader: FileSystemReader):
        self._planner, self._reader, self.byte_items = planner, reader, 0

    def __getattr__(self, name: str) -> Any:  # resolve_tensor, commit_tensor, ...: the planner's own
        return getattr(self._planner, name)

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        self.byte_items += 1
        file = f"{self._reader.path}/{self._reader.storage_data[read_item.storage_index].relative_path}"
        try:
            obj = _load_weights_only(value, file, read_item.storage_index.fqn)
        except UnsafeCheckpoint as err:
            self._reader.refusal = self._reader.refusal or err
            raise
        vetted = io.BytesIO()
        torch.save(obj, vetted)
        vetted.seek(0)
        self._planner.load_bytes(read_item, vetted)


class _SafeReading:
    """``read_metadata`` and ``read_data`` of a ``FileSystemReader`` (or a subclass) that run nothing the
    checkpoint holds; the rest is the base reader's."""

    refusal: UnsafeCheckpoint | None = None
    """The first refusal of this reader: ``dcp.load`` turns one into another error (``refusals_raised``)."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        # FileSystemReader.read_metadata (torch 2.13, 2.14), with MetadataUnpickler for its pickle.load
        if self.refusal is not None:  # nothing more of a refused checkpoint, DCP's per-rank fallback neither
            raise self.refusal
        path = tensor_hooks.metadata_path(self, kwargs.get("rank"))
        with self.fs.create_stream(path, "rb") as f:
            try:
                metadata = load_metadata(f, str(path))
            except UnsafeCheckpoint as err:
                self.refusal = self.refusal or err
                raise
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def read_data(self, plan, planner):
        guarded = _WeightsOnlyBytes(planner, self)
        result = super().read_data(plan, guarded)
        expected = sum(item.type == LoadItemType.BYTE_IO for item in plan.items)
        if guarded.byte_items != expected:
            # a torch whose reader unpickles byte items without its planner: a way this module never vetted
            raise RuntimeError(
                f"torch {torch.__version__}: FileSystemReader.read_data handed "
                f"{guarded.byte_items} of {expected} byte items to the planner; "
                f"trainer/checkpoint/safe_pickle.py does not know how this torch reads the others"
            )
        return result


class SafeFileSystemReader(_SafeReading, FileSystemReader):
    """DCP's reader of a local step directory, running nothing the checkpoint holds."""


@functools.cache
def _safe_fsspec_reader() -> type:
    FsspecReader = tensor_hooks.fsspec_reader()  # fsspec: for s3:// only

    class SafeFsspecReader(_SafeReading, FsspecReader):
        """DCP's fsspec reader (s3://), running nothing the checkpoint holds."""

    return SafeFsspecReader


def safe_reader(step_dir: str, *, remote: bool) -> FileSystemReader:
    """The reader of a step directory: the fsspec one for a remote one (s3://), else the filesystem one."""
    if remote:
        # its own filesystem instance, as trainer.base.storage.Storage's: fsspec's cached one keeps the
        # endpoint
        # and credentials it was made with (a rotated credential, another endpoint in the same process)
        return _safe_fsspec_reader()(step_dir, skip_instance_cache=True)
    return SafeFileSystemReader(step_dir)


@contextlib.contextmanager
def refusals_raised(reader: _SafeReading):
    """Raises the refusal of ``reader`` as itself out of a ``dcp.load`` through it. DCP turns it into another
    error: a failed ``read_metadata`` is logged, then reported as an AssertionError that quotes it, and what
    its steps raise comes out wrapped in a ``CheckpointException`` (a BaseException)."""
    try:
        yield
    except (Exception, CheckpointException) as err:
        if reader.refusal is not None:
            raise reader.refusal from err
        raise

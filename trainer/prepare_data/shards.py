"""Writing the store: where its files go (a local directory renamed into place, or an object-storage
prefix, meta.json last) and each split's shards as they fill."""

import json
import os
import shutil
import tempfile
import uuid

import numpy as np

from trainer.prepare_data.errors import PrepareError
from trainer.data.token_store import is_remote, remote_fs


class Sink:
    """Where the store's files go: a local temp directory renamed into place at the end, or an
    object-storage prefix (each shard uploaded once full, meta.json last)."""

    def __init__(self, out: str):
        self.out = out
        self.remote = is_remote(out)
        if self.remote:
            self.fs, self.root = remote_fs(out)
            self.root = self.root.rstrip("/")
            if self.fs.exists(self.root) and self.fs.find(self.root, maxdepth=1):
                raise PrepareError(f"--out: {out} already exists; remove it or choose another prefix")
            self.dir = tempfile.mkdtemp(prefix="dtrain-prepare-")
        else:
            if os.path.exists(out):
                raise PrepareError(f"--out: {out} already exists; remove it or choose another directory")
            parent = os.path.dirname(os.path.abspath(out))
            os.makedirs(parent, exist_ok=True)
            self.dir = os.path.join(
                parent, f".{os.path.basename(os.path.abspath(out))}.tmp-{uuid.uuid4().hex}"
            )
            os.makedirs(self.dir)
        self.written: list[str] = []

    def path(self, name: str) -> str:
        os.makedirs(os.path.dirname(os.path.join(self.dir, name)), exist_ok=True)
        return os.path.join(self.dir, name)

    def done(self, name: str) -> None:
        """`name` is complete locally: upload it (remote) and free the local copy."""
        if self.remote:
            self.fs.put_file(os.path.join(self.dir, name), f"{self.root}/{name}")
            os.remove(os.path.join(self.dir, name))
        self.written.append(name)

    def commit(self, meta: dict) -> None:
        with open(self.path("meta.json"), "w") as f:
            json.dump(meta, f, indent=2)
        self.done("meta.json")  # last: a store without it is incomplete
        if self.remote:
            shutil.rmtree(self.dir, ignore_errors=True)
        else:
            if os.path.exists(self.out):
                raise PrepareError(
                    f"--out: {self.out} appeared while preparing; the new store is left in {self.dir}"
                )
            os.rename(self.dir, self.out)

    def abort(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)
        if self.remote:
            for name in self.written:
                try:
                    self.fs.rm_file(f"{self.root}/{name}")
                except OSError:
                    pass


class ShardWriter:
    """One split's shards, `shard_tokens` ids each (the last one shorter)."""

    def __init__(self, sink: Sink, split: str, dtype: str, shard_tokens: int):
        self.sink, self.split, self.dtype, self.shard_tokens = (
            sink,
            split,
            np.dtype(dtype).newbyteorder("<"),
            shard_tokens,
        )
        self.shards: list[dict] = []
        self.f, self.in_shard, self.tokens, self.documents = None, 0, 0, 0

    def add(self, ids: np.ndarray) -> None:
        ids = ids.astype(self.dtype, copy=False)
        while len(ids):
            if self.f is None:
                name = f"{self.split}-{len(self.shards):05d}.bin"
                self.shards.append({"file": name, "tokens": 0})
                self.f = open(self.sink.path(name), "wb")
            take = ids[: self.shard_tokens - self.in_shard]
            take.tofile(self.f)
            self.in_shard += len(take)
            self.tokens += len(take)
            self.shards[-1]["tokens"] = self.in_shard
            ids = ids[len(take) :]
            if self.in_shard == self.shard_tokens:
                self.close()

    def close(self) -> None:
        if self.f is not None:
            self.f.close()
            self.f, self.in_shard = None, 0
            self.sink.done(self.shards[-1]["file"])

    def summary(self) -> dict:
        return {"tokens": self.tokens, "documents": self.documents, "shards": self.shards}

"""The token store: a directory (local, or ``s3://`` through fsspec) of token ids, its meta.json,
its tokenizer's identity, and the reader that presents a split's shards as one token stream.

Format "dtrain-tokens" version 2 (written by ``python -m trainer.prepare_data``)::

    meta.json           {"format": "dtrain-tokens", "version": 2,
                         "tokenizer": {"kind": "bytes"}
                                   | {"kind": "hf", "name": "llama3", "sha256": "<hex>", "vocab_size": N},
                         "vocab_size": N, "dtype": "uint16" | "uint32", "eos_id": id | null,
                         "shard_tokens": N,
                         "splits": {"train": {"tokens": n, "documents": n,
                                              "shards": [{"file": "train-00000.bin", "tokens": n}, ...]},
                                    "val": {...}},
                         "source": "...", "text_field": "text",
                         "bad_rows": {"policy": "error" | "skip", "rows": n, "skipped": n,
                                      "first": [{"file": "...", "line" | "row": n, "why": "..."}, ...]}}
    train-00000.bin ... raw little-endian ids (uint16 while every id fits, uint32 above 65,535)
    val-00000.bin ...
    tokenizer/          tokenizer.json (+ tokenizer_config.json, special_tokens_map.json when the
                        source has them), so an export can ship the tokenizer with the model

Version 1 (the built-in corpus, and stores prepared before v2) is one ``train.bin`` / ``val.bin``
per split, byte-level: it reads as a store of one shard per split with the "bytes" tokenizer.

A split is one token stream: the shards in order, concatenated. A training sequence may straddle
two shards (its tokens are read from both), so the batches do not depend on the shard size and a
store re-sharded differently trains identically. Each shard is an np.memmap opened on first use;
the corpus is never loaded into memory.

An ``s3://`` store is copied to a node-local cache before training (the node's local rank 0
downloads while the others wait; see trainer.data.loader.resolve_dataset): under
``$DTRAIN_DATA_DIR/remote/<name>-<hash of the URI and its meta.json>``, so a store rewritten at
the same URI is downloaded again, and an unchanged one only once per node. meta.json is written
last, both in the store and in the cache: a directory without it is incomplete and never read.
"""

import functools
import hashlib
import json
import mmap
import os
import shutil
import uuid

import numpy as np

FORMAT = "dtrain-tokens"
VERSION = 2
READS_VERSIONS = (1, 2)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
BYTES_TOKENIZER = {"kind": "bytes"}
BYTES_VOCAB = 256
DEFAULT_SHARD_TOKENS = 100_000_000  # 200 MB a shard in uint16: a quick download, few files


def is_remote(uri: str) -> bool:
    return "://" in uri and not uri.startswith("file://")


def dtype_for_vocab(vocab_size: int) -> str:
    """The narrowest id type that holds every id of the vocabulary (ids 0 .. vocab_size-1)."""
    return "uint16" if vocab_size - 1 <= np.iinfo(np.uint16).max else "uint32"


# --------------------------------------------------------------------------- tokenizer identity


def canonical_sha256(tokenizer_json: bytes) -> str:
    """sha256 of tokenizer.json parsed and re-serialised (sorted keys, no whitespace): the same
    tokenizer saved by another library version or with another indentation has the same identity."""
    obj = json.loads(tokenizer_json)
    return hashlib.sha256(
        json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    ).hexdigest()


def describe_tokenizer(identity: dict | None) -> str:
    """One human phrase for a tokenizer identity: 'llama3 (sha256 1a2b3c4d5e6f, vocab 128256)'."""
    identity = identity or BYTES_TOKENIZER
    if identity.get("kind") == "bytes":
        return f"bytes (byte-level, vocab {BYTES_VOCAB})"
    sha = str(identity.get("sha256"))[:12]
    return f"{identity.get('name')} (sha256 {sha}, vocab {identity.get('vocab_size')})"


def same_tokenizer(a: dict | None, b: dict | None) -> bool:
    """Identities agree: both byte-level, or the same canonical tokenizer.json (the name is a label only)."""
    a, b = a or BYTES_TOKENIZER, b or BYTES_TOKENIZER
    if a.get("kind") != b.get("kind"):
        return False
    return a.get("kind") == "bytes" or a.get("sha256") == b.get("sha256")


# --------------------------------------------------------------------------- reading


def read_meta(directory: str) -> dict:
    """meta.json of a local store, in the v2 shape whatever its version (v1 reads as one shard per split)."""
    path = os.path.join(directory, "meta.json")
    with open(path) as f:
        meta = json.load(f)
    if meta.get("format") != FORMAT or meta.get("version") not in READS_VERSIONS:
        raise ValueError(
            f"{directory}: unsupported token format {meta.get('format')!r} v{meta.get('version')!r} "
            f"(this trainer reads {FORMAT!r} v{', v'.join(map(str, READS_VERSIONS))})"
        )
    if meta["version"] == 1:
        meta = dict(
            meta,
            tokenizer=dict(BYTES_TOKENIZER),
            eos_id=None,
            splits={
                split: {"tokens": n, "shards": [{"file": f"{split}.bin", "tokens": n}]}
                for split, n in meta["splits"].items()
            },
        )
    return meta


class TokenStream:
    """A split's shards as one sequence of token ids: len(), and stream[a:b] -> np.ndarray.

    Shards are memory-mapped on first use (at most `open_shards` at a time, so a store of
    thousands of shards does not exhaust file descriptors).
    """

    def __init__(self, directory: str, shards: list[dict], dtype: str, open_shards: int = 64):
        self.directory = directory
        self.files = [s["file"] for s in shards if s["tokens"] > 0]
        counts = np.array([s["tokens"] for s in shards if s["tokens"] > 0], dtype=np.int64)
        self.starts = np.concatenate([[0], np.cumsum(counts)])  # shard i holds [starts[i], starts[i+1])
        self.dtype = np.dtype(dtype).newbyteorder("<")
        for name, n in zip(self.files, counts):
            size = os.path.getsize(os.path.join(directory, name))
            if size != n * self.dtype.itemsize:
                raise ValueError(
                    f"{directory}: {name} is {size} bytes, meta.json says {n} {dtype} tokens "
                    f"({n * self.dtype.itemsize} bytes): an incomplete copy of the store?"
                )
        self._shard = functools.lru_cache(maxsize=open_shards)(self._open)

    def _open(self, i: int) -> np.ndarray:
        array = np.memmap(os.path.join(self.directory, self.files[i]), dtype=self.dtype, mode="r")
        # Batches read scattered sequences: the kernel's read-ahead around each fault (MBs on some
        # disks) would read mostly unused pages from a store that is not in the page cache.
        mapping = getattr(array, "_mmap", None)
        if mapping is not None and hasattr(mmap, "MADV_RANDOM"):
            mapping.madvise(mmap.MADV_RANDOM)
        return array

    def __len__(self) -> int:
        return int(self.starts[-1])

    def __getitem__(self, key):
        if isinstance(key, (int, np.integer)):
            i = int(key) + len(self) if key < 0 else int(key)
            return self[i : i + 1][0]
        start, stop, step = key.indices(len(self))
        if step != 1:
            raise IndexError("a token stream is read in contiguous slices")
        parts = []
        i = int(np.searchsorted(self.starts, start, side="right")) - 1
        while start < stop:  # a slice straddling shards: one piece from each
            end = min(stop, int(self.starts[i + 1]))
            parts.append(self._shard(i)[start - self.starts[i] : end - self.starts[i]])
            start, i = end, i + 1
        if len(parts) == 1:
            return parts[0]
        return np.concatenate(parts) if parts else np.empty(0, dtype=self.dtype)

    def __array__(self, dtype=None, copy=None):  # the whole split in memory: for tests and small stores only
        out = self[0 : len(self)]
        return np.asarray(out, dtype=dtype)


def open_split(directory: str, split: str) -> tuple[TokenStream, dict]:
    """(the split's token stream, the store's meta in the v2 shape) of a local store."""
    meta = read_meta(directory)
    if split not in meta["splits"]:
        raise ValueError(f"{directory}: no {split!r} split (it has {', '.join(meta['splits'])})")
    return TokenStream(directory, meta["splits"][split]["shards"], meta["dtype"]), meta


# --------------------------------------------------------------------------- object storage


def remote_fs(uri: str):
    """(fsspec filesystem, path inside it) of a remote store; endpoint and credentials from the
    usual AWS settings, as for checkpoints (trainer.base.storage)."""
    import fsspec

    return fsspec.core.url_to_fs(uri, use_listings_cache=False, skip_instance_cache=True)


def cache_remote(uri: str, cache_root: str, log=None) -> str:
    """Copy the remote store at `uri` into `cache_root` (once); returns the local directory.

    Call on one process per node (the others wait): the copy is built in a temp directory and
    renamed into place, so a reader never sees a partial one.
    """
    fs, root = remote_fs(uri)
    root = root.rstrip("/")
    try:
        meta_bytes = fs.cat_file(f"{root}/meta.json")
    except FileNotFoundError:
        raise FileNotFoundError(
            f"{uri}: no meta.json (not a store written by `python -m trainer.prepare_data`, "
            "or one whose preparation has not finished)"
        ) from None
    key = hashlib.sha256(uri.encode() + b"\0" + meta_bytes).hexdigest()[:16]
    local = os.path.join(cache_root, "remote", f"{os.path.basename(root) or 'store'}-{key}")
    if os.path.exists(os.path.join(local, "meta.json")):
        return local
    meta = json.loads(meta_bytes)
    os.makedirs(os.path.dirname(local), exist_ok=True)
    tmp = f"{local}.tmp-{uuid.uuid4().hex}"
    os.makedirs(tmp)
    try:
        names = [s["file"] for split in meta["splits"].values() for s in split.get("shards", [])]
        if meta.get("version") == 1:
            names = [f"{split}.bin" for split in meta["splits"]]
        for n, name in enumerate(names):
            if log:
                log(f"data: downloading {uri}/{name} ({n + 1}/{len(names)}) to {local}")
            fs.get_file(f"{root}/{name}", os.path.join(tmp, name))
        if fs.exists(f"{root}/tokenizer"):
            os.makedirs(os.path.join(tmp, "tokenizer"))
            for name in TOKENIZER_FILES:
                if fs.exists(f"{root}/tokenizer/{name}"):
                    fs.get_file(f"{root}/tokenizer/{name}", os.path.join(tmp, "tokenizer", name))
        with open(os.path.join(tmp, "meta.json"), "wb") as f:
            f.write(meta_bytes)
        read_meta(tmp)  # the version is one we read
        for split in meta["splits"]:
            open_split(tmp, split)  # every shard has the size meta.json says
        try:
            os.rename(tmp, local)
        except OSError:
            if not os.path.exists(os.path.join(local, "meta.json")):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return local

"""Where checkpoints live: a local directory (a path or ``file://``) or ``s3://bucket/prefix``.

The plain file operations on such a root; what lives there (step directories, manifests,
progress.json, ...) and which checkpoint is the latest is trainer/checkpoint/directory.py's.
Standard library only at module level: the Airflow provider imports this (through
trainer.checkpoint.directory) in its workers and at DAG-parse time. Remote URIs go through
fsspec (s3fs for ``s3://``); its endpoint and credentials come from the usual AWS
settings (``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ...).
"""

import hashlib
import json
import os
import shutil
import uuid


# The checksum new manifests record per file, under its own name: {"size": ..., "xxh3_128": "<hex>"}.
# xxh3 hashes at memory speed (the sha256 it replaces took longer than writing the files);
# manifests written before name "sha256", which validation still verifies.
CHECKSUM_ALGORITHM = "xxh3_128"
CHECKSUM_ALGORITHMS = ("xxh3_128", "xxh3_64", "sha256")
_HASH_BLOCK = 8 << 20


def new_hasher(algorithm: str):
    """A hashlib-style object (update/hexdigest) for one of CHECKSUM_ALGORITHMS (xxhash imported on first
    use)."""
    if algorithm == "sha256":
        return hashlib.sha256()
    if algorithm in ("xxh3_128", "xxh3_64"):
        import xxhash

        return getattr(xxhash, algorithm)()
    raise ValueError(f"unknown checksum algorithm {algorithm!r} (known: {', '.join(CHECKSUM_ALGORITHMS)})")


def checksum_stream(f, algorithm: str = CHECKSUM_ALGORITHM) -> str:
    """Hex digest of a binary file object, read in large blocks into one reused buffer."""
    h = new_hasher(algorithm)
    buf = bytearray(_HASH_BLOCK)
    view = memoryview(buf)
    readinto = getattr(f, "readinto", None)
    if readinto is None:  # some remote file objects only read()
        for block in iter(lambda: f.read(_HASH_BLOCK), b""):
            h.update(block)
        return h.hexdigest()
    while n := readinto(buf):
        h.update(view[:n])
    return h.hexdigest()


def checksum_file(path: str, algorithm: str = CHECKSUM_ALGORITHM) -> str:
    with open(path, "rb", buffering=0) as f:
        return checksum_stream(f, algorithm)


def manifest_checksum(entry: dict) -> tuple[str, str] | None:
    """(algorithm, hex digest) a manifest's file entry records, or None when it names no known one."""
    for algorithm in CHECKSUM_ALGORITHMS:
        if algorithm in entry:
            return algorithm, entry[algorithm]
    return None


def write_json_atomic(path: str, obj: dict, durable: bool = True) -> None:
    """Readers (the Airflow operator) never see a half-written file: write a temp file, rename.

    ``durable`` also fsyncs first (manifests: the commit point must survive a crash). A status
    file rewritten every step skips it: an fsync per step is milliseconds of training stalled.
    """
    write_text_atomic(path, json.dumps(obj, indent=2), durable=durable)


def write_text_atomic(path: str, text: str, durable: bool = True) -> None:
    """write_json_atomic's mechanics for text already serialized."""
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
        if durable:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)


class Storage:
    """A checkpoint root. Paths are plain absolute paths locally and full ``s3://`` URLs remotely."""

    def __init__(self, uri: str):
        if not uri:
            raise ValueError("a checkpoint URI is required")
        self.uri = uri
        self.remote = uri.startswith("s3://")
        if self.remote:
            self.root = uri.rstrip("/")
        else:
            self.root = os.path.abspath(uri[len("file://") :] if uri.startswith("file://") else uri)
        self._fs = None

    @property
    def fs(self):
        """The fsspec filesystem of a remote root (imported on first use)."""
        if self._fs is None:
            import fsspec

            # No listing cache: other processes (other ranks, the provider) change the bucket.
            self._fs = fsspec.filesystem("s3", use_listings_cache=False, skip_instance_cache=True)
        return self._fs

    def path(self, *parts: str) -> str:
        if self.remote:
            return "/".join([self.root, *parts])
        return os.path.join(self.root, *parts)

    # -- queries ------------------------------------------------------------------------
    def exists(self, path: str) -> bool:
        return self.fs.exists(path) if self.remote else os.path.exists(path)

    def listdir(self, path: str) -> list[str]:
        """Names (not paths) in a directory; [] when it does not exist."""
        if not self.remote:
            return os.listdir(path) if os.path.isdir(path) else []
        if not self.fs.exists(path):
            return []
        return [entry.rstrip("/").rsplit("/", 1)[-1] for entry in self.fs.ls(path, detail=False)]

    def listdir_modified(self, path: str) -> dict[str, float]:
        """``{name: last change}`` of the files in a directory, in one listing (one LIST request on s3://:
        nothing is read); {} when it does not exist."""
        if not self.remote:
            if not os.path.isdir(path):
                return {}
            with os.scandir(path) as entries:
                return {e.name: e.stat().st_mtime for e in entries if e.is_file()}
        if not self.fs.exists(path):
            return {}
        found = {}
        for info in self.fs.ls(path, detail=True):
            if info.get("type") == "file":
                modified = info.get("LastModified")
                at = modified.timestamp() if hasattr(modified, "timestamp") else float(modified or 0)
                found[info["name"].rstrip("/").rsplit("/", 1)[-1]] = at
        return found

    def size(self, path: str) -> int | None:
        """Bytes in a file, None when it is missing."""
        if not self.remote:
            return os.path.getsize(path) if os.path.isfile(path) else None
        try:
            return int(self.fs.info(path)["size"])
        except FileNotFoundError:
            return None

    def modified_at(self, path: str) -> float:
        """Unix time of a file's last change on the storage's own clock (a local file's mtime, an S3
        object's LastModified): the clock every writer of the job shares (``trainer.money.clock``)."""
        if not self.remote:
            return os.stat(path).st_mtime
        modified = self.fs.info(path)["LastModified"]
        return modified.timestamp() if hasattr(modified, "timestamp") else float(modified)

    def open(self, path: str, mode: str = "rb"):
        return self.fs.open(path, mode) if self.remote else open(path, mode)

    def read_json(self, path: str) -> dict:
        with self.open(path, "r") as f:
            return json.load(f)

    # -- changes ------------------------------------------------------------------------
    def makedirs(self) -> None:
        if not self.remote:
            os.makedirs(self.root, exist_ok=True)

    def write_json(self, path: str, obj: dict, durable: bool = True) -> None:
        """Atomic for readers: a local rename, or a single S3 PUT (an object appears whole or not at all)."""
        self.write_text(path, json.dumps(obj, indent=2), durable=durable)

    def write_text(self, path: str, text: str, durable: bool = True) -> None:
        """write_json for text already serialized."""
        if not self.remote:
            write_text_atomic(path, text, durable=durable)
            return
        self.fs.pipe_file(path, text.encode())

    def create_exclusive(self, path: str, text: str) -> bool:
        """Create ``path`` holding ``text`` only if it does not exist yet; False when it already did.

        Atomic against every other creator, here and on other machines: locally a hard link of a
        complete temporary file (``link`` fails if the name exists, like ``O_CREAT|O_EXCL``, and a
        reader never sees the file half-written); on S3 a conditional PUT (``If-None-Match: *``,
        answered 412 when the key exists, which s3fs raises as FileExistsError).
        """
        if self.remote:
            try:
                self.fs.pipe_file(path, text.encode(), IfNoneMatch="*")
            except FileExistsError:
                return False
            return True
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.tmp-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        except OSError:  # a filesystem without hard links: O_EXCL, the contents written after
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                return False
            with os.fdopen(fd, "w") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
        finally:
            os.remove(tmp)
        return True

    def put_file(self, local_path: str, path: str) -> None:
        """Upload a local file (remote roots only)."""
        self.fs.put_file(local_path, path)

    def remove_file(self, path: str) -> None:
        """Delete a file; nothing when it does not exist, or stops existing meanwhile (another writer pruning
        the same file: two groups pruning old leases at once)."""
        try:
            if not self.remote:
                os.remove(path)
            elif self.fs.exists(path):
                self.fs.rm_file(path)
        except FileNotFoundError:
            pass

    def remove_tree(self, path: str) -> None:
        """Delete a directory and everything under it; nothing when it does not exist."""
        if not self.remote:
            shutil.rmtree(path, ignore_errors=True)
        elif self.fs.exists(path):
            self.fs.rm(path, recursive=True)

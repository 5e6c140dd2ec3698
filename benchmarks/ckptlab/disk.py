"""The disk's own bandwidth, beside which ``benchmarks/checkpoint.py`` measures a save: the same bytes written
by plain file writes and fsync'd, one stream or a save's own shape, and read back."""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor


def disk_write(path: str, nbytes: int) -> float:
    block = os.urandom(8 << 20)
    start = time.perf_counter()
    with open(path, "wb") as f:
        written = 0
        while written < nbytes:
            f.write(block)
            written += len(block)
        f.flush()
        os.fsync(f.fileno())
    return time.perf_counter() - start


def disk_write_files(directory: str, nbytes: int, files: int) -> float:
    """``nbytes`` as ``files`` files written by as many threads, each fsync'd: a save's shape without DCP."""
    os.makedirs(directory, exist_ok=True)
    block = os.urandom(8 << 20)
    per_file = -(-nbytes // files)

    def one(i: int) -> None:
        with open(os.path.join(directory, f"part{i}.bin"), "wb") as f:
            written = 0
            while written < per_file:
                chunk = block[: min(len(block), per_file - written)]
                f.write(chunk)
                written += len(chunk)
            f.flush()
            os.fsync(f.fileno())

    start = time.perf_counter()
    with ThreadPoolExecutor(files) as pool:
        list(pool.map(one, range(files)))
    return time.perf_counter() - start


def disk_read(path: str) -> float:
    start = time.perf_counter()
    with open(path, "rb") as f:
        while f.read(8 << 20):
            pass
    return time.perf_counter() - start


def dir_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(path, n)) for n in os.listdir(path))

"""The commit rule, for every backend and for async saves alike.

Every rank writes its shard files, hashes them and (for s3://) uploads them; only once all ranks have done so
does rank 0 write the manifest, last. A crash or kill -9 at any point before that leaves the previous
checkpoint as the latest. Retention (deleting the oldest checkpoints) and the lease heartbeat follow a commit.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import Future, ThreadPoolExecutor

import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException

from trainer.checkpoint.directory import FORMAT_DCP
from trainer.checkpoint.lease_files import Lease
from trainer.checkpoint.context import CheckpointContext, RunIdentity, describe, say
from trainer.checkpoint.failure import Failure, SaveFailures
from trainer.checkpoint.faults import Faults
from trainer.checkpoint.lease import WriterLease
from trainer.base.storage import CHECKSUM_ALGORITHM, checksum_file


def checksum_files(directory: str, names: list[str]) -> dict[str, dict]:
    """{name: {"size", CHECKSUM_ALGORITHM: hex}} of files just written (so read back from the page cache).

    One thread per file: xxhash releases the GIL, so a rank that wrote several files
    (or .metadata next to its shard) hashes them side by side.
    """

    def one(name: str) -> tuple[str, dict]:
        path = os.path.join(directory, name)
        return name, {"size": os.path.getsize(path), CHECKSUM_ALGORITHM: checksum_file(path)}

    if len(names) <= 1:
        return dict(map(one, names))
    with ThreadPoolExecutor(
        max_workers=min(len(names), os.cpu_count() or 1), thread_name_prefix="checksum"
    ) as pool:
        return dict(pool.map(one, names))


class Committer:
    """Commits written saves, on every rank together; owns the thread that commits and retention run in."""

    def __init__(
        self,
        ctx: CheckpointContext,
        lease: WriterLease,
        failures: SaveFailures,
        faults: Faults,
        run: RunIdentity,
    ):
        self.ctx, self.lease, self.failures, self.faults, self.run = ctx, lease, failures, faults, run
        self._executor: ThreadPoolExecutor | None = None
        self.retention: Future | None = None  # rank 0's retention after a sync save

    def background(self) -> ThreadPoolExecutor:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint-commit")
        return self._executor

    def wait_for_retention(self) -> None:
        if self.retention is not None:
            retention, self.retention = self.retention, None
            retention.result()

    def shutdown(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    def commit(self, upload: Future | None, info: dict) -> dict:
        """On every rank: wait for the write, hash (and upload) this rank's files; then rank 0 commits."""
        write_dir, path, step = info["write_dir"], info["path"], info["step"]
        mine, files, failed = self._hash_and_upload(upload, write_dir, path)
        self.faults.before_manifest(step, self.ctx.rank)
        gathered = [None] * self.ctx.world_size
        dist.all_gather_object(gathered, (files, failed), group=self.ctx.pg)
        failures = sorted((f for _, f in gathered if f is not None), key=lambda f: (not f[2], f[0]))
        if failures:  # every rank saw the same gather: all stop here together
            self.failures.raise_failed(step, write_dir, path, failures[0])
        newer, committed = None, None
        if self.ctx.rank == 0:
            newer, committed = self._write_manifest(step, info, [part for part, _ in gathered])
        # nobody reports the checkpoint before it is committed (a broadcast from rank 0 waits for it)
        newer, committed = self.ctx.from_rank0((None if newer is None else tuple(newer), committed))
        if committed is not None:
            self.failures.raise_failed(step, write_dir, path, committed)
        if self.ctx.storage.remote:
            _remove_staged(write_dir, mine)
        if newer is not None:
            raise self.lease.fenced(Lease(*newer), step)
        return {
            "step": step,
            "path": path,
            "reason": info["reason"],
            "async": info.get("async", False),
            "seconds": time.perf_counter() - info["start"],
            "waited_s": info["waited_s"],
        }

    def _hash_and_upload(
        self, upload: Future | None, write_dir: str, path: str
    ) -> tuple[list[str], dict, Failure | None]:
        """(this rank's files, their sizes and checksums, this rank's failure or None)."""
        mine: list[str] = []
        try:
            if upload is not None:
                upload.result()  # an async write: DCP raises its failure on every rank alike
            # Each rank hashes the shard files it wrote, so the manifest of a large model
            # costs one shard's hashing time, not the whole checkpoint's.
            mine = sorted(n for n in os.listdir(write_dir) if n.startswith(f"__{self.ctx.rank}_"))
            if self.ctx.rank == 0:
                mine.append(".metadata")
            files = checksum_files(write_dir, mine)
            if self.ctx.storage.remote:
                for n in mine:
                    self.ctx.storage.put_file(os.path.join(write_dir, n), f"{path}/{n}")
        except (Exception, CheckpointException) as err:  # this rank's alone (an upload refused): gathered
            return mine, {}, self.failures.failure(err)
        return mine, files, None

    def _write_manifest(
        self, step: int, info: dict, parts: list[dict]
    ) -> tuple[Lease | None, Failure | None]:
        """(Rank 0) the fence, the manifest (the commit point), then retention: (a newer lease, a failure)."""
        newer = self.lease.newer()  # the fence: a newer writer owns the directory now
        if newer is not None:
            return newer, None
        try:
            self.ctx.storage.write_json(self.ctx.dir.manifest_path(step), self._manifest(step, info, parts))
        except Exception as err:  # noqa: BLE001 - not committed: every rank must hear of it
            return None, self.failures.failure(err)
        newer = self.lease.newer()  # retention deletes: only the writer may
        if newer is None and info.get("async"):
            self._retain(step)  # this thread is the background already
        elif newer is None:
            # Deleting the oldest checkpoint is no part of saving this one: a sync save (a preemption's,
            # in its grace period) returns without waiting for it; the next save, wait() and close() do.
            self.retention = self.background().submit(self._retain, step)
        return newer, None

    def _manifest(self, step: int, info: dict, parts: list[dict]) -> dict:
        run = self.run
        return {
            "step": step,
            "format": FORMAT_DCP,
            "job": self.ctx.job,
            "owner": str(run.config.get("owner") or ""),
            "lease": self.lease.token,
            "world_size": self.ctx.world_size,
            "flavor": run.flavor,
            **({"model_args": run.shape} if run.shape is not None else {}),
            "config_hash": run.config_hash,
            **({"tokenizer": run.tokenizer} if run.tokenizer is not None else {}),
            **info["fields"],
            "files": dict(sorted((k, v) for part in parts for k, v in part.items())),
            "created_at": time.time(),
            # not required by readers of the manifest; lets evaluate/export rebuild the model
            "config": run.config,
        }

    def _retain(self, step: int) -> None:
        """(Rank 0, after ``step`` is committed) retention and the lease heartbeat."""
        try:
            self.ctx.dir.prune(self.ctx.cfg.keep, job=self.ctx.job, continues=self.ctx.cfg.continue_job)
            self.lease.heartbeat(step)
        except Exception as err:  # noqa: BLE001 - step is committed: the next save fails if the storage does
            say(
                f"checkpoint step {step} is committed, but retention or the lease heartbeat in "
                f"{self.ctx.root} failed: {describe(err)}"
            )


def _remove_staged(write_dir: str, mine: list[str]) -> None:
    """This rank's local copies of files it uploaded, and the staging directory once empty."""
    for n in mine:
        os.remove(os.path.join(write_dir, n))
    try:
        os.rmdir(write_dir)
    except OSError:
        pass  # another local rank's files are still there

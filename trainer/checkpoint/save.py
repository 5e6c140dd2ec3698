"""A save: synchronous, or async (staged to host memory), one in flight at a time.

Async saves: ``save()`` only snapshots the small non-tensor state and hands the tensors to DCP's
DefaultStager, which copies them to host memory (pinned, reused across saves, on GPU) in a thread of its own.
The copy overlaps the next step's forward/backward, which read the parameters and optimizer state but do not
change them; the training loop calls ``wait_for_staging()`` just before the next optimizer.step(), the first
thing that mutates them (as torchtitan does). The write, the hashing, the upload and the commit then run in
background threads on the checkpoint's own process group (trainer/checkpoint/commit.py). The next save,
the final save and a preemption first wait for the one in flight.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import time
from concurrent.futures import Future

import torch.distributed.checkpoint as dcp
import torch.utils.serialization.config as serialization_config
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict_saver import AsyncSaveResponse

from trainer.torch_private import tensor_hooks
from trainer.checkpoint.directory import step_dir_name
from trainer.checkpoint.commit import Committer
from trainer.checkpoint.context import CheckpointContext
from trainer.checkpoint.failure import SaveFailures
from trainer.checkpoint.faults import Faults
from trainer.checkpoint.lease import WriterLease
from trainer.checkpoint.state import new_stager, training_state


def record_crc32(enabled: bool) -> None:
    """Whether ``torch.save`` computes a CRC32 over every record it writes, in every thread of this process:
    the trainer's saver turns it off.

    DCP writes each tensor with ``torch.save``, whose zip records carry a CRC32 that costs as much CPU as the
    rest of the serialisation: torch.save of 160 MB runs at 2.4 GB/s with it and 5.2 GB/s without, on this
    VM. Every file of a checkpoint is hashed whole (xxh3) into the manifest and checked at resume, validation
    and load, so the per-record CRC adds nothing. ``torch.load`` reads records without a CRC as it reads the
    others, and checkpoints written with one still load (tests/trainer/test_checkpoint_crc.py).

    torch's setting (``torch.serialization.set_crc32_options``) is per thread, and DCP writes from threads of
    its own: so the setting's default changes, for the whole process. The training processes are the only
    ones that run this, and the trainer's saves their only ``torch.save`` files.
    """
    serialization_config.save.compute_crc32 = enabled  # this thread, through the public setting
    # every other thread: the entry's default (torch >= 2.6 keeps one per setting; trainer.torch_private)
    tensor_hooks.crc32_default(serialization_config, enabled)


def _report_warm_up_failure(future: Future) -> None:
    err = None if future.cancelled() else future.exception()  # exception() raises on a cancelled future
    if err is not None:
        print(f"[trainer] allocating the async save's host buffers failed: {err!r}", flush=True)


class Saver:
    """Saves on every rank together and reports the commits; holds the stager and the save in flight."""

    def __init__(
        self,
        ctx: CheckpointContext,
        lease: WriterLease,
        committer: Committer,
        faults: Faults,
        *,
        async_save: bool,
        cuda: bool,
    ):
        self.ctx, self.lease, self.committer, self.faults = ctx, lease, committer, faults
        record_crc32(False)
        self.failures: SaveFailures = committer.failures
        self.async_save, self.cuda = async_save, cuda
        self._stager = None
        self.pending: tuple[Future, dict] | None = None
        # (step, seconds) when the last save() had to wait for the save of that step to commit first
        self.waited: tuple[int, float] | None = None
        self._staging: tuple[Future, dict] | None = None  # the async save's copy to host memory, in flight
        self.warm_up: Future | None = None  # the stager's copy ahead of the first save
        self._completed: list[dict] = []
        # Committed step directories that failed verification at resume (corrupted, truncated): a save that
        # reaches such a step again rewrites it instead of taking it for already saved.
        self.failed_verification: set[int] = set()

    def save(self, step: int, model, optimizer, scheduler, data, *, manifest_fields, reason, blocking) -> str:
        """Save `step` and commit it; returns the step directory (see Checkpointer.save)."""
        start = time.perf_counter()
        waited = self._wait_for_the_last(start)
        path = self.ctx.dir.step_path(step)
        if self.ctx.dir.is_committed(step) and step not in self.failed_verification:
            # e.g. a preemption right after an interval save of the same step
            took = time.perf_counter() - start
            self._completed.append(
                {
                    "step": step,
                    "path": path,
                    "reason": reason,
                    "seconds": took,
                    "blocked_s": took,
                    "waited_s": waited,
                }
            )
            return path
        write_dir = self._staging_dir(step) if self.ctx.storage.remote else path
        self.lease.check(
            step
        )  # a fenced group must not even clear a step directory: it may be the new writer's
        self._clear(step, write_dir, path)
        state = training_state(model, optimizer, scheduler, data, step, self.ctx.rank)
        info = {"step": step, "path": path, "reason": reason, "start": start, "write_dir": write_dir,
                "fields": manifest_fields, "waited_s": waited}  # fmt: skip
        info["async"] = not blocking and self.async_save
        if info["async"]:
            self._start_async(state, info)
        else:
            self._save_now(state, info)
        return path

    def _wait_for_the_last(self, start: float) -> float:
        """Wait for the save in flight (one at a time); the seconds waited for its commit (0.0: none)."""
        behind = self.pending[1]["step"] if self.pending is not None and not self.pending[0].done() else None
        self.wait()
        waited = time.perf_counter() - start if behind is not None else 0.0
        self.waited = (behind, waited) if behind is not None else None
        return waited

    def _clear(self, step: int, write_dir: str, path: str) -> None:
        """Rank 0 clears what an interrupted save of ``step`` left; the others wait for it."""
        cleared = None
        if self.ctx.rank == 0:
            try:
                if os.path.exists(write_dir):
                    shutil.rmtree(write_dir)  # an interrupted save of this step (maybe another world size)
                if self.ctx.storage.remote and self.ctx.storage.exists(path):
                    self.ctx.dir.remove(path)
            except Exception as err:  # noqa: BLE001 - every rank must hear of it, not wait in a collective
                cleared = self.failures.failure(err)
        cleared = self.ctx.from_rank0(cleared)  # the others wait here until rank 0 cleared the step directory
        if cleared is not None:
            self.failures.raise_failed(step, write_dir, path, cleared)

    def _save_now(self, state: dict, info: dict) -> None:
        """A synchronous save: written and committed when this returns."""
        step, write_dir, path = info["step"], info["write_dir"], info["path"]
        try:
            dcp.save(state, storage_writer=self._writer(write_dir, step), process_group=self.ctx.pg)
        except (Exception, CheckpointException) as err:  # DCP raised it on every rank alike
            self.failures.raise_failed(step, write_dir, path, self.failures.failure(err))
        info["blocked_s"] = time.perf_counter() - info["start"]
        self._completed.append({**self.committer.commit(None, info), "blocked_s": info["blocked_s"]})

    def _start_async(self, state: dict, info: dict) -> None:
        """The copy to host memory runs in the stager's thread, the write in DCP's, the commit in ours."""
        response = dcp.async_save(
            state,
            storage_writer=self._writer(info["write_dir"], info["step"]),
            process_group=self.ctx.pg,
            async_stager=self._get_stager(),
        )
        if isinstance(response, AsyncSaveResponse):
            upload = response.upload_completion
            self._staging = (response.staging_completion, info)
        else:  # a stager that staged synchronously
            upload = response
        info["blocked_s"] = time.perf_counter() - info["start"]
        self.pending = (self.committer.background().submit(self.committer.commit, upload, info), info)

    def _writer(self, write_dir: str, step: int):
        # Several files per rank, written (and later hashed) in parallel: one stream leaves
        # most of a disk's bandwidth unused (benchmarks/RESULTS.md).
        threads = self.ctx.cfg.write_threads
        injected = self.faults.storage_writer(write_dir, step, self.ctx.rank, threads)
        return injected if injected is not None else dcp.FileSystemWriter(write_dir, thread_count=threads)

    def wait_for_staging(self) -> float:
        """Block until the async save's copy of the state is taken; returns the seconds waited.

        Called by the training loop right before optimizer.step(): from there on the
        parameters and the optimizer state change. The wait counts into the save's blocked_s.
        """
        if self._staging is None:
            return 0.0
        future, info = self._staging
        self._staging = None
        start = time.perf_counter()
        try:
            future.result()
        finally:
            waited = time.perf_counter() - start
            info["blocked_s"] += waited
        return waited

    def warm_up_staging(self, model, optimizer, scheduler, data, step: int) -> bool:
        """Async saves: have the stager allocate its host buffers (pinned, on GPU) now, in its own thread, by
        copying the state once and dropping the copy; True if this started it (once per run).

        The stager keeps a buffer per tensor storage from its first copy on, so the run's first save would
        otherwise pay for all of them (10.8 s of a 14 GB state's first save on an H100, against 3.0-3.8 s for
        the later ones: benchmarks/RESULTS.md). Called after the first optimizer step, once the optimizer's
        state exists; training goes on meanwhile: the copy only reads the tensors, and what it copies is
        never written anywhere (the first save copies into the same buffers again). A save queues behind it.
        """
        if not self.async_save or self.warm_up is not None:
            return False
        state = training_state(model, optimizer, scheduler, data, step, self.ctx.rank)
        self.warm_up = self._get_stager().stage(state)
        if isinstance(self.warm_up, Future):  # an error shows again at the first save; say it now too
            self.warm_up.add_done_callback(_report_warm_up_failure)
        return True

    def _get_stager(self):
        if self._stager is None or not getattr(self._stager, "reusable", True):
            self._stager = new_stager(self.cuda)
        return self._stager

    def _staging_dir(self, step: int) -> str:
        base = os.environ.get("DTRAIN_STAGING_DIR") or os.path.join(tempfile.gettempdir(), "dtrain-staging")
        run = hashlib.sha256(self.ctx.storage.root.encode()).hexdigest()[:16]
        return os.path.join(base, run, step_dir_name(step))

    def completed(self) -> list[dict]:
        """Saves committed since the last call (Checkpointer.completed); raises if one in flight failed."""
        if self.pending is not None and self.pending[0].done():
            self._finish_pending()
        out, self._completed = self._completed, []
        return out

    def wait(self) -> None:
        """Block until the save in flight (if any) is committed and retention after the last one is done."""
        if self.pending is not None:
            self._finish_pending()
        self.committer.wait_for_retention()

    def _finish_pending(self) -> None:
        future, info = self.pending
        self.pending = None
        self.wait_for_staging()  # done by now if the commit is; counts what training waited
        self._completed.append({**future.result(), "blocked_s": info["blocked_s"]})

    def close(self) -> None:
        """Finish the save in flight and release the staging buffers."""
        try:
            self.wait()
        finally:
            if self._stager is not None:
                self._stager.close()
                self._stager = None
            self.committer.shutdown()

"""A save that fails: every rank agrees on the cause, rank 0 removes the partial step directory, all raise.

``CheckpointStorageError`` when the storage refused the write (a full disk, no permission: one line naming
the path and the cause), a RuntimeError otherwise. A committed step directory, or one a newer writer may
own, is never removed.
"""

from __future__ import annotations

import os
import shutil

from torch.distributed.checkpoint.api import CheckpointException

from trainer.checkpoint.errors import CheckpointStorageError, storage_cause
from trainer.checkpoint.context import CheckpointContext, describe
from trainer.checkpoint.lease import WriterLease

Failure = tuple[int, str, bool]
"""(rank, the cause in one line, whether the storage refused the write)."""


def short_write(err: BaseException | None) -> bool:
    """Whether ``err`` (or what it chains) is torch's stream writer finding its file shorter than written."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if "unexpected pos" in str(err) and "inline_container" in str(err):
            return True
        err = err.__cause__ or err.__context__
    return False


class SaveFailures:
    """Turns what went wrong in a save into one agreed failure, and that into the error every rank raises."""

    def __init__(self, ctx: CheckpointContext, lease: WriterLease):
        self.ctx, self.lease = ctx, lease

    def failure(self, err: BaseException) -> Failure:
        """(rank, the cause in one line, whether the storage refused the write) of a failed save.

        DCP gathers every rank's exception into one ``CheckpointException``: the rank named is the
        first whose failure is a storage refusal (ENOSPC on rank 1 is rank 1's, whoever reports it).
        """
        failures = getattr(err, "failures", None)
        if isinstance(err, CheckpointException) and isinstance(failures, dict):
            ranked = sorted((r, f[0] if isinstance(f, tuple) else f) for r, f in failures.items())
            for rank, exc in ranked:
                cause = storage_cause(exc)
                if cause is not None:
                    return rank, describe(cause), True
            for rank, exc in ranked:
                if short_write(exc):
                    return rank, self.short_write_cause(exc), True
            if ranked:
                return ranked[0][0], describe(ranked[0][1]), False
        cause = storage_cause(err)
        if cause is None and short_write(err):
            return self.ctx.rank, self.short_write_cause(err), True
        return self.ctx.rank, describe(cause or err), cause is not None

    def short_write_cause(self, err: BaseException) -> str:
        """torch's stream writer reports a failed file write (ENOSPC in one of DCP's writer threads) only as
        "unexpected pos": say what the filesystem says about its free space."""
        if self.ctx.storage.remote:
            return f"a short write ({describe(err)})"
        where = self.ctx.root
        while where and not os.path.exists(where):
            where = os.path.dirname(where)
        free = shutil.disk_usage(where).free
        if free < 64 * 2**20:
            return (
                f"[Errno 28] No space left on device ({free} bytes free on {where}; torch: {describe(err)})"
            )
        return f"a short write with {free} bytes free on {where} ({describe(err)})"

    def raise_failed(self, step: int, write_dir: str, path: str, failure: Failure):
        """Every rank together, once they agree that the save of ``step`` failed: rank 0 removes the partial
        step directory (never a committed one, never one a newer writer may own) and every rank raises --
        ``CheckpointStorageError`` when the storage refused the write, a RuntimeError otherwise."""
        rank, cause, storage = failure
        who = f" (rank {rank})" if self.ctx.world_size > 1 else ""
        left = self.remove_partial(step, write_dir, path)
        if not storage:
            raise RuntimeError(f"checkpoint step {step} could not be written to {path}{who}: {cause}")
        raise CheckpointStorageError(
            f"checkpoint step {step} could not be written to {path}{who}: {cause}; "
            f"{left + '; ' if left else ''}{self._intact(step)}"
        )

    def _intact(self, step: int) -> str:
        """What the failure left of the older checkpoints, in words."""
        try:
            older = [c.step for c in self.ctx.dir.committed() if c.step != step]
        except Exception:  # noqa: BLE001 - the listing may fail the same way; the message must not
            return "the older checkpoints were not touched"
        if older:
            return f"the older checkpoints (step {', '.join(map(str, older))}) are intact"
        return "there is no older checkpoint"

    def remove_partial(self, step: int, write_dir: str, path: str) -> str:
        """Remove what a failed save of ``step`` left; "" when done (or not rank 0's to do), else why not."""
        storage = self.ctx.storage
        if storage.remote:
            shutil.rmtree(
                write_dir, ignore_errors=True
            )  # this host's staging files (every local rank, harmlessly)
        if self.ctx.rank != 0:
            return ""
        try:
            if self.ctx.dir.is_committed(step) or self.lease.newer() is not None:
                return ""  # a committed checkpoint, or a step directory the newer writer may be writing
            if storage.remote:
                storage.remove_tree(path)
            else:
                shutil.rmtree(path)
        except FileNotFoundError:
            return ""
        except Exception as err:  # noqa: BLE001 - say so in the one line; the directory has no manifest either way
            return (
                f"the partial step directory could not be removed ({describe(err)}; it has no manifest, "
                "so it is never resumed)"
            )
        return ""

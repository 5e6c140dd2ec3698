"""One writer per checkpoint directory: the writer lease (a fencing token) and the fence.

At construction rank 0 refuses a directory holding another job's checkpoints, then takes a writer lease
(trainer/checkpoint/directory.py). Before every save starts writing and again before every manifest (and
before retention prunes), rank 0 checks that no newer lease exists; if one does, a newer group owns the
directory, and every rank raises ``WriterFenced`` without committing.
"""

from __future__ import annotations

import os
import socket
import time

from trainer.checkpoint.errors import WriterFenced
from trainer.checkpoint.lease_files import Lease
from trainer.checkpoint.context import CheckpointContext, say
from trainer.config.fields import ConfigError


class WriterLease:
    """This group's writer lease on the directory, taken at construction on every rank together."""

    def __init__(self, ctx: CheckpointContext):
        self.ctx = ctx
        self.lease: Lease = self._take()

    @property
    def token(self) -> int:
        return self.lease.token

    def _refusal(self) -> tuple | None:
        """(Rank 0) ("refused", why) when the directory holds another job's checkpoints."""
        ctx = self.ctx
        foreign = ctx.dir.foreign_jobs(ctx.job, ctx.cfg.continue_job)
        if not foreign:
            return None
        other, paths = next(iter(sorted(foreign.items())))
        return ("refused", (
            f"job: this run is job {ctx.job!r}, but {ctx.root} holds checkpoints of job {other!r} "
            f"({', '.join(p.rsplit('/', 1)[-1] for p in paths)}): a job never resumes or prunes "
            f"another job's checkpoints (use another checkpoint.uri, or checkpoint.continue_job={other!r} to "
            f"continue it as {ctx.job!r})"
        ))  # fmt: skip

    def _outcome(self) -> tuple:
        """(Rank 0) what taking the lease came to: refused, a lease, or an error every rank must hear of."""
        try:
            refused = self._refusal()
            if refused is not None:
                return refused
            lease = self.ctx.dir.acquire_lease({
                "job": self.ctx.job, "group": os.environ.get("DTRAIN_GROUP_NAME"),
                "host": socket.gethostname(), "pid": os.getpid(),
            })  # fmt: skip
            return ("lease", lease.token, lease.info)
        except Exception as err:  # noqa: BLE001 - the other ranks must hear of it, not hang
            return ("error", f"cannot take the writer lease in {self.ctx.root}: {type(err).__name__}: {err}")

    def _take(self) -> Lease:
        """Rank 0 refuses another job's directory, else takes the lease; every rank learns the outcome."""
        outcome = self.ctx.from_rank0(self._outcome() if self.ctx.rank == 0 else ())
        if outcome[0] == "refused":
            raise ConfigError(outcome[1])
        if outcome[0] == "error":
            raise RuntimeError(outcome[1])
        if self.ctx.rank == 0:
            say(f"writer lease {outcome[1]} on {self.ctx.root}")
        return Lease(outcome[1], outcome[2])

    def newer(self) -> Lease | None:
        """(Rank 0) the newest lease when it is newer than ours: another group took the directory over."""
        newest = self.ctx.dir.newest_lease()
        return newest if newest is not None and newest.token > self.lease.token else None

    def fenced(self, newer: Lease, step: int) -> WriterFenced:
        message = (f"another group took over the checkpoint directory {self.ctx.root}: writer lease "
                   f"{newer.token} (group {newer.group}) is newer than this group's {self.lease.token}; step "
                   f"{step} is not committed and this group stops")  # fmt: skip
        return WriterFenced(message)

    def check(self, step: int) -> None:
        """On every rank together: raise WriterFenced when rank 0 sees a newer lease."""
        newer = self.newer() if self.ctx.rank == 0 else None
        newer = self.ctx.from_rank0(None if newer is None else tuple(newer))
        if newer is not None:
            raise self.fenced(Lease(*newer), step)

    def heartbeat(self, step: int) -> None:
        """(Rank 0) renew the lease file: who writes here, when it last committed (for people and tools)."""
        info = {**self.lease.info, "heartbeat_at": time.time(), "last_commit": step}
        self.ctx.storage.write_json(self.ctx.dir.lease_path(self.lease.token), info, durable=False)

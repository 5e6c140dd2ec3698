"""Resumable checkpoints: a DCP sharded save per step directory, committed by a manifest.

Layout, listing and retention: trainer/checkpoint/directory.py. A step directory without a
manifest is an interrupted save and is ignored (and cleaned up). The DCP save holds the
model and optimizer (sharded), the LR scheduler, the data position, the step, and each
rank's python/numpy/torch RNG states.

The commit rule, for every backend and for async saves alike: every rank writes its
shard files, hashes them and (for s3://) uploads them; only once all ranks have done
so does rank 0 write the manifest, last. A crash or kill -9 at any point before that
leaves the previous checkpoint as the latest.

One writer per directory: at construction rank 0 refuses a directory holding another job's
checkpoints, then takes a writer lease (a fencing token, trainer/checkpoint/directory.py). Before
every save starts writing and again before every manifest (and before retention prunes),
rank 0 checks that no newer lease exists; if one does, a newer group (e.g. an Airflow retry
that started while this group was orphaned) owns the directory, and every rank raises
``WriterFenced`` without committing. What remains: a save already writing its step files
when the newer lease is taken finishes writing them (never committing them); the newer
group rewrites that step directory from scratch if it reaches the same step. And the check
and the manifest write are two operations: a lease taken between them (a window of one
file write) lets one more manifest through, which the newer writer, having chosen its resume
point already, never reads.

Async saves (checkpoint.async_save; unset = on GPU only): save() only snapshots the small non-tensor state
and hands the tensors to DCP's DefaultStager, which copies them to host memory (pinned,
reused across saves, on GPU) in a thread of its own. The copy overlaps the next step's
forward/backward, which read the parameters and optimizer state but do not change them;
the training loop calls wait_for_staging() just before the next optimizer.step(), the
first thing that mutates them (as torchtitan does), and only blocks there if the copy is
not done yet. The write, the hashing, the upload and the commit then run in background
threads on a process group of their own (gloo), so they never interleave with the
training collectives. One save is in flight at a time: the next save, the final save
and a preemption first wait for it.
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

from trainer.checkpoint.directory import CheckpointDir
from trainer.checkpoint.lease_files import Lease
from trainer.checkpoint.commit import Committer
from trainer.checkpoint.context import CheckpointContext, RunIdentity
from trainer.checkpoint.failure import SaveFailures
from trainer.checkpoint.faults import Faults, faults_from_env
from trainer.checkpoint.lease import WriterLease
from trainer.checkpoint.resume import Resumer, failed_steps
from trainer.checkpoint.save import Saver
from trainer.config.sections import CheckpointConfig
from trainer.base.storage import Storage


class Checkpointer:
    """Saves and restores the training state; every method is called on all ranks together.

    A facade over trainer/checkpoint/: the writer lease (lease.py), saves and their commit
    (save.py, commit.py) and the verified resume (resume.py). ``faults``: the test seam
    (trainer/checkpoint/faults.py; by default what ``DTRAIN_FAULTS`` names, none when unset).
    """

    def __init__(
        self,
        cfg: CheckpointConfig,
        *,
        flavor: str,
        config: dict,
        config_hash: str,
        shape: dict | None = None,
        rank: int,
        world_size: int,
        device: torch.device | None = None,
        job: str | None = None,
        tokenizer: dict | None = None,
        collective_timeout_s: float = 600.0,
        faults: Faults | None = None,
    ):
        self.cfg, self.flavor, self.config, self.config_hash = cfg, flavor, config, config_hash
        self.shape, self.tokenizer = shape, tokenizer  # see RunIdentity
        self.job = str(config.get("job") or "") if job is None else job
        self.rank, self.world_size = rank, world_size
        self.device = device or torch.device("cpu")
        # auto: on a CPU-only node the background save competes with training for the same cores and
        # costs more in total than a synchronous one (benchmarks/RESULTS.md); on a GPU node it overlaps.
        self.async_save = cfg.async_save if cfg.async_save is not None else self.device.type == "cuda"
        self.storage = Storage(cfg.uri) if cfg.uri else None
        self.dir: CheckpointDir | None = None
        self.root = self.storage.root if self.storage else None
        self.pg = None
        self.lease: Lease | None = None
        self._saver: Saver | None = None
        self._resumer: Resumer | None = None
        if self.storage is not None:
            self._compose(collective_timeout_s, faults_from_env() if faults is None else faults)

    def _compose(self, collective_timeout_s: float, faults: Faults) -> None:
        """The parts of an enabled checkpointer; takes the writer lease (every rank together)."""
        cfg = self.cfg
        if dist.is_initialized():
            # The checkpoint's own collectives (DCP's plan/finish, the manifest gather)
            # run here, possibly in a background thread: a separate group keeps them
            # from interleaving with the training collectives on the default group. They wait as long as
            # training's collectives (parallel.collective_timeout_s) and at least as long as a preemption
            # save may take, so a hung peer mid-save still ends the group as lost.
            timeout = max(collective_timeout_s, 2 * cfg.grace_period_s)
            self.pg = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout))
        ctx = CheckpointContext(cfg, self.storage, self.rank, self.world_size, self.job, self.pg)
        self.dir = ctx.dir
        run = RunIdentity(self.flavor, self.config, self.config_hash, self.shape, self.tokenizer)
        lease = WriterLease(ctx)
        self.lease = lease.lease
        committer = Committer(ctx, lease, SaveFailures(ctx, lease), faults, run)
        cuda = self.device.type == "cuda"
        self._saver = Saver(ctx, lease, committer, faults, async_save=self.async_save, cuda=cuda)
        self._resumer = Resumer(ctx, run)

    @property
    def enabled(self) -> bool:
        return self.storage is not None

    def latest(self) -> tuple[int, str] | None:
        return self.dir.latest() if self.enabled else None

    # ------------------------------------------------------------------ save

    def save(
        self,
        step: int,
        model,
        optimizer,
        scheduler,
        data,
        *,
        manifest_fields: dict,
        reason: str,
        blocking: bool = False,
    ) -> str:
        """Save `step` and commit it; returns the step directory.

        Blocking (or async_save off): returns once committed. Otherwise returns once the
        copy to host memory has started; the caller must call wait_for_staging() before it
        next changes the parameters or the optimizer state (optimizer.step()), and
        completed() reports the commit later. Idempotent per step.
        """
        return self._saver.save(
            step,
            model,
            optimizer,
            scheduler,
            data,
            manifest_fields=manifest_fields,
            reason=reason,
            blocking=blocking,
        )

    def warm_up_staging(self, model, optimizer, scheduler, data, step: int) -> bool:
        """Async saves: allocate the host buffers of every save now, in the background
        (Saver.warm_up_staging); True if this started it. Every rank together, after an optimizer step."""
        return self._saver.warm_up_staging(model, optimizer, scheduler, data, step) if self._saver else False

    def wait_for_staging(self) -> float:
        """Block until the async save's copy of the state is taken; returns the seconds waited.

        Called by the training loop right before optimizer.step(): from there on the
        parameters and the optimizer state change. The wait counts into the save's blocked_s.
        """
        return self._saver.wait_for_staging() if self._saver is not None else 0.0

    @property
    def waited(self) -> tuple[int, float] | None:
        """(step, seconds) when the last save() had to wait for the save of that step to commit first."""
        return self._saver.waited if self._saver is not None else None

    @property
    def _pending(self):
        """The save in flight: (its commit's future, its info), or None."""
        return self._saver.pending if self._saver is not None else None

    @property
    def in_flight(self) -> bool:
        """A save was handed to the background and has not been reported committed yet."""
        return self._pending is not None

    def completed(self) -> list[dict]:
        """Saves committed since the last call: [{"step", "path", "reason", "async", "seconds", "blocked_s",
        "waited_s"}]; waited_s: of the blocked time, how long the save waited for the previous one to commit.

        Polls the save in flight without waiting; raises if it failed (a checkpoint that
        silently stopped being written is worse than a stopped run).
        """
        return self._saver.completed() if self._saver is not None else []

    def wait(self) -> None:
        """Block until the save in flight (if any) is committed and retention after the last one is done."""
        if self._saver is not None:
            self._saver.wait()

    def close(self) -> None:
        """Finish the save in flight and release the staging buffers."""
        if self._saver is not None:
            self._saver.close()

    # ------------------------------------------------------------------ load

    def resume_point(self) -> tuple[int, str, list[dict]] | None:
        """The newest committed checkpoint that verifies, with the newer ones that did not.

        Rank 0 verifies (trainer.validate: manifest, sizes, every file's checksum, DCP metadata, a
        sample of tensors for NaN/Inf) from the newest down and tells every rank which one to load,
        so a corrupted or truncated newest checkpoint costs the steps since the one before it, not
        the run. None: nothing committed yet. Raises when nothing committed verifies.
        """
        if not self.enabled:
            return None
        point = self._resumer.resume_point()
        if point is not None:
            self._saver.failed_verification = failed_steps(point[2])
        return point

    def check_compatible(self, path: str) -> dict:
        """Refuse, before any model is built, a checkpoint this run cannot continue; returns its manifest.

        What makes the saved state mean the same thing must match: the model, the data and how it
        is cut into sequences, and the data order (the seed). Everything else (learning rate,
        schedule, steps, checkpoint interval, ...) may change between attempts; the changes are
        reported as a warning on rank 0.
        """
        return self._resumer.check_compatible(path)

    def load(self, path: str, model, optimizer, scheduler, data) -> dict:
        """Restore everything from a committed step directory; returns its manifest.

        A different world size reshards: the model and optimizer are DTensors DCP
        can re-split, the data position is global, only the per-rank RNG states of
        ranks that did not exist before start from the seed.
        """
        return self._resumer.load(path, model, optimizer, scheduler, data)

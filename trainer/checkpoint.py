"""Resumable checkpoints: a DCP sharded save per step directory, committed by a manifest.

Layout, listing and retention: trainer/checkpoint_dir.py. A step directory without a
manifest is an interrupted save and is ignored (and cleaned up). The DCP save holds the
model and optimizer (sharded), the LR scheduler, the data position, the step, and each
rank's python/numpy/torch RNG states.

The commit rule, for every backend and for async saves alike: every rank writes its
shard files, hashes them and (for s3://) uploads them; only once all ranks have done
so does rank 0 write the manifest, last. A crash or kill -9 at any point before that
leaves the previous checkpoint as the latest.

One writer per directory: at construction rank 0 refuses a directory holding another job's
checkpoints, then takes a writer lease (a fencing token, trainer/checkpoint_dir.py). Before
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

import contextlib
import copy
import errno
import hashlib
import os
import random
from typing import Any
import shutil
import socket
import sys
import tempfile
import time
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict_saver import AsyncSaveResponse

from trainer.config import CheckpointConfig, ConfigError
from trainer.fields import flatten
from trainer.checkpoint_dir import (
    FORMAT_DCP,
    CheckpointDir,
    CheckpointStorageError,
    Lease,
    WriterFenced,
    step_dir_name,
    step_of,
    storage_cause,
)
from trainer.checkpoint_reader import storage_reader
from trainer.storage import CHECKSUM_ALGORITHM, Storage, checksum_file, write_json_atomic
from trainer.token_store import BYTES_TOKENIZER, describe_tokenizer, same_tokenizer

__all__ = ["CheckpointStorageError", "Checkpointer", "WriterFenced", "storage_reader", "write_json_atomic"]

# Test hook, named as such: "STEP:SECONDS[:FILE]" makes rank 0 sleep after the files of that
# step are written (and uploaded) but before its manifest, so that a test can kill -9
# a group in the middle of a save deterministically; with FILE, only until FILE exists.
_TEST_COMMIT_DELAY_ENV = "DTRAIN_TEST_COMMIT_DELAY"
# Test hook, named as such: "STEP[:RANK]" (rank 0 by default) makes that rank's storage writer fail the
# write of that step with ENOSPC after leaving a partial shard file behind, as a disk that fills up mid-save does.
_TEST_ENOSPC_ENV = "DTRAIN_TEST_ENOSPC_AT_STEP"


def _describe(err: BaseException) -> str:
    """An error as one line: an OSError as Python words it ("[Errno 28] No space left on device: 'path'")."""
    if isinstance(err, OSError):
        return str(err)
    return f"{type(err).__name__}: {err}".splitlines()[0]


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


def _rng_state() -> dict[str, torch.Tensor]:
    """This rank's Python, numpy and torch RNG states, as tensors only.

    DCP's async stager deep-copies the state it is handed; some torch releases (2.11) cannot
    deep-copy numpy's state tuple (a ``type`` and an ``ndarray`` inside), and every release
    would pickle it into a per-rank blob. So each state is packed into int64/float64 tensors
    (Mersenne Twister words fit in int64), and unpacked on load.
    """
    version, words, gauss = random.getstate()  # words: 624 state words + the position
    _, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "python": torch.tensor([version, *words], dtype=torch.int64),
        "python_gauss": torch.tensor([gauss is not None, gauss or 0.0], dtype=torch.float64),
        "numpy": torch.tensor([pos, has_gauss, *keys.tolist()], dtype=torch.int64),
        "numpy_gauss": torch.tensor([cached], dtype=torch.float64),
        "torch": torch.get_rng_state(),
    }


def _set_rng_state(state: dict[str, torch.Tensor]) -> None:
    python = state["python"].tolist()
    has_gauss, gauss = state["python_gauss"].tolist()
    random.setstate((python[0], tuple(python[1:]), gauss if has_gauss else None))
    pos, has_np_gauss, *keys = state["numpy"].tolist()
    np.random.set_state(
        ("MT19937", np.array(keys, dtype=np.uint32), pos, has_np_gauss, float(state["numpy_gauss"].item()))
    )
    torch.set_rng_state(state["torch"])


MUST_MATCH = ("model.flavor", "data.dataset", "data.seq_len", "seed")
"""Config fields a resumed run must share with its checkpoint: the model's shape, the data, how
it is cut into sequences, and the data order."""


def _torch_version() -> tuple[int, int]:
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    return int(major), int(minor)


# torch 2.11's DefaultStager closes its StateDictStager at the end of every stage (pytorch#183413):
# that clears its copier table, so a second save through the same stager fails inside DCP with
# "KeyError: <class 'type'>", and it drops the cached host buffers, so every save allocates and
# pins the whole state again (on an H100, 14 GB took the first step after each save from 0.22 s to
# 5-11 s). There the trainer uses _KeepBuffersStager, whose _stage is 2.12's: the same copy, no
# close. From 2.12 on, DefaultStager itself is kept for the whole run.
_STAGER_CLOSES_AFTER_STAGE = _torch_version() < (2, 12)


def _new_stager(cuda: bool):
    """A DCP stager for every save of the run: pinned host buffers on GPU, allocated at the
    first save and reused by every later one (DCP keys them by the source tensor's storage)."""
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

    # Async staging: the copy runs in the stager's thread (on a side stream on GPU) while the
    # next step's forward/backward run; Checkpointer.wait_for_staging() joins it.
    options = StagingOptions(
        use_pinned_memory=cuda, use_shared_memory=False, use_async_staging=True, use_non_blocking_copy=cuda
    )
    if not _STAGER_CLOSES_AFTER_STAGE:
        return DefaultStager(options)

    class _KeepBuffersStager(DefaultStager):
        def _stage(self, state_dict, **kwargs):
            non_blocking = self._config.use_non_blocking_copy
            stream = self._staging_stream if non_blocking else None
            with stream if stream is not None else contextlib.nullcontext():
                staged = self._state_dict_stager.stage(state_dict, non_blocking=non_blocking)
            if stream is not None:
                stream.synchronize()
            elif non_blocking:
                torch.cuda.synchronize()
            return staged

    return _KeepBuffersStager(options)


def _plain(state: Any) -> Any:
    """``state`` with every mapping a plain dict and every sequence a list (tensors untouched).

    Only tensors and plain Python values go to DCP: the async stager of some torch releases
    (2.11) cannot deep-copy anything else (an ``OrderedDict``, numpy objects) and fails with
    ``KeyError: <class 'type'>``; the load side fills the same plain structure in place.
    """
    if isinstance(state, torch.Tensor):
        return state
    if isinstance(state, dict):
        return {k: _plain(v) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return [_plain(v) for v in state]
    return state


def _short_write(err: BaseException | None) -> bool:
    """Whether ``err`` (or what it chains) is torch's stream writer finding its file shorter than written."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if "unexpected pos" in str(err) and "inline_container" in str(err):
            return True
        err = err.__cause__ or err.__context__
    return False


def checkpoint_tensors(step_dir: str) -> dict[str, torch.Tensor]:
    """Every tensor of a local DCP checkpoint, unsharded and flattened to dotted keys
    (``{"model.x": t, "optim.state.x.exp_avg": t, ...}``): what a bitwise comparison of two runs reads.

    The keys are the FQNs DCP stored, so a flat dict of full-size tensors loads them whatever the world size
    that saved them; the non-tensor items are not read at all (torch's dcp_to_torch_save would read them, and
    the whole checkpoint, through its own reader, which unpickles whatever the files hold).
    """
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    metadata = storage_reader(Storage(step_dir), step_dir).read_metadata()
    flat = {
        k: torch.empty(m.size, dtype=m.properties.dtype)
        for k, m in metadata.state_dict_metadata.items()
        if isinstance(m, TensorStorageMetadata)
    }
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(flat, storage_reader=storage_reader(Storage(step_dir), step_dir), no_dist=True)
    return flat


class Checkpointer:
    """Saves and restores the training state; every method is called on all ranks together."""

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
    ):
        self.cfg, self.flavor, self.config, self.config_hash = cfg, flavor, config, config_hash
        self.shape = (
            shape  # the model's ModelArgs as a dict: resume, evaluate and export rebuild it from this
        )
        # The identity of the data's tokenizer (trainer.token_store): recorded in every manifest and
        # checked at resume, since the embedding rows mean one tokenizer's tokens. None: neither.
        self.tokenizer = tokenizer
        self.job = str(config.get("job") or "") if job is None else job
        self.rank, self.world_size = rank, world_size
        self.device = device or torch.device("cpu")
        # auto: on a CPU-only node the background save competes with training for the same cores and
        # costs more in total than a synchronous one (benchmarks/RESULTS.md); on a GPU node it overlaps.
        self.async_save = cfg.async_save if cfg.async_save is not None else self.device.type == "cuda"
        self.storage = Storage(cfg.uri) if cfg.uri else None
        self.dir = CheckpointDir(self.storage) if self.storage else None
        self.root = self.storage.root if self.storage else None
        self.pg = None
        if self.storage is not None and dist.is_initialized():
            # The checkpoint's own collectives (DCP's plan/finish, the manifest gather)
            # run here, possibly in a background thread: a separate group keeps them
            # from interleaving with the training collectives on the default group. They wait as long as
            # training's collectives (parallel.collective_timeout_s) and at least as long as a preemption
            # save may take, so a hung peer mid-save still ends the group as lost.
            timeout = max(collective_timeout_s, 2 * cfg.grace_period_s)
            self.pg = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout))
        self._stager = None
        self._executor: ThreadPoolExecutor | None = None
        self._pending: tuple[Future, dict] | None = None
        # (step, seconds) when the last save() had to wait for the save of that step to commit first
        self.waited: tuple[int, float] | None = None
        self._retention: Future | None = None  # rank 0's retention after a sync save
        self._staging: tuple[Future, dict] | None = None  # the async save's copy to host memory, in flight
        self._completed: list[dict] = []
        # Committed step directories that failed verification at resume (corrupted, truncated): a save that
        # reaches such a step again rewrites it instead of taking it for already saved.
        self._failed_verification: set[int] = set()
        self.lease: Lease | None = self._take_lease() if self.storage is not None else None

    @property
    def enabled(self) -> bool:
        return self.storage is not None

    # ------------------------------------------------------------------ one writer

    def _from_rank0(self, value: Any) -> Any:
        """Rank 0's ``value`` on every rank (on the checkpoint's own group)."""
        if dist.is_initialized() and self.world_size > 1:
            box = [value]
            dist.broadcast_object_list(box, src=0, group=self.pg)
            return box[0]
        return value

    def _take_lease(self) -> Lease:
        """Rank 0 refuses another job's directory, else takes the writer lease; every rank learns the outcome."""
        outcome: tuple = ()
        if self.rank == 0:
            try:
                foreign = self.dir.foreign_jobs(self.job, self.cfg.continue_job)
                if foreign:
                    other, paths = next(iter(sorted(foreign.items())))
                    outcome = ("refused", (
                        f"job: this run is job {self.job!r}, but {self.root} holds checkpoints of job {other!r} "
                        f"({', '.join(p.rsplit('/', 1)[-1] for p in paths)}): a job never resumes or prunes "
                        f"another job's checkpoints (use another checkpoint.uri, or checkpoint.continue_job={other!r} to "
                        f"continue it as {self.job!r})"
                    ))  # fmt: skip
                else:
                    lease = self.dir.acquire_lease({
                        "job": self.job, "group": os.environ.get("DTRAIN_GROUP_NAME"),
                        "host": socket.gethostname(), "pid": os.getpid(),
                    })  # fmt: skip
                    outcome = ("lease", lease.token, lease.info)
            except Exception as err:  # noqa: BLE001 - the other ranks must hear of it, not hang
                outcome = (
                    "error",
                    f"cannot take the writer lease in {self.root}: {type(err).__name__}: {err}",
                )
        outcome = self._from_rank0(outcome)
        if outcome[0] == "refused":
            raise ConfigError(outcome[1])
        if outcome[0] == "error":
            raise RuntimeError(outcome[1])
        if self.rank == 0:
            print(f"[trainer] writer lease {outcome[1]} on {self.root}", file=sys.stderr, flush=True)
        return Lease(outcome[1], outcome[2])

    def _newer_lease(self) -> Lease | None:
        """(Rank 0) the newest lease when it is newer than ours: another group took the directory over."""
        newest = self.dir.newest_lease()
        return newest if newest is not None and newest.token > self.lease.token else None

    def _fenced(self, newer: Lease, step: int) -> WriterFenced:
        message = (f"another group took over the checkpoint directory {self.root}: writer lease {newer.token} "
                   f"(group {newer.group}) is newer than this group's {self.lease.token}; step {step} is not "
                   f"committed and this group stops")  # fmt: skip
        return WriterFenced(message)

    def _check_fence(self, step: int) -> None:
        """On every rank together: raise WriterFenced when rank 0 sees a newer lease."""
        newer = self._newer_lease() if self.rank == 0 else None
        newer = self._from_rank0(None if newer is None else tuple(newer))
        if newer is not None:
            raise self._fenced(Lease(*newer), step)

    def latest(self) -> tuple[int, str] | None:
        return self.dir.latest() if self.enabled else None

    def _state(self, model, optimizer, scheduler, data, step: int) -> dict:
        model_sd, optim_sd = get_state_dict(model, optimizer)
        return {
            "model": _plain(model_sd),
            "optim": _plain(optim_sd),
            # copies now: an async save stages the state while training goes on
            "scheduler": copy.deepcopy(scheduler.state_dict()),
            "data": copy.deepcopy(data.state_dict()),
            "step": step,
            # per-rank keys: DCP keeps one copy of keys that every rank saves alike
            f"rng_rank{self.rank}": _rng_state(),
        }

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
        start = time.perf_counter()
        behind = (
            self._pending[1]["step"] if self._pending is not None and not self._pending[0].done() else None
        )
        self.wait()  # one save in flight at a time
        waited = time.perf_counter() - start if behind is not None else 0.0
        self.waited = (behind, waited) if behind is not None else None
        path = self.dir.step_path(step)
        if self.dir.is_committed(step) and step not in self._failed_verification:
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
        write_dir = self._staging_dir(step) if self.storage.remote else path
        self._check_fence(
            step
        )  # a fenced group must not even clear a step directory: it may be the new writer's
        cleared = None
        if self.rank == 0:
            try:
                if os.path.exists(write_dir):
                    shutil.rmtree(write_dir)  # an interrupted save of this step (maybe another world size)
                if self.storage.remote and self.storage.exists(path):
                    self.dir.remove(path)
            except Exception as err:  # noqa: BLE001 - every rank must hear of it, not wait in a collective
                cleared = self._failure(err)
        cleared = self._from_rank0(cleared)  # the others wait here until rank 0 cleared the step directory
        if cleared is not None:
            self._raise_failed(step, write_dir, path, cleared)
        state = self._state(model, optimizer, scheduler, data, step)
        info = {
            "step": step,
            "path": path,
            "reason": reason,
            "start": start,
            "write_dir": write_dir,
            "fields": manifest_fields,
            "waited_s": waited,
        }
        info["async"] = not blocking and self.async_save
        if not info["async"]:
            try:
                dcp.save(state, storage_writer=self._writer(write_dir, step), process_group=self.pg)
            except (Exception, CheckpointException) as err:  # DCP raised it on every rank alike
                self._raise_failed(step, write_dir, path, self._failure(err))
            info["blocked_s"] = time.perf_counter() - start
            self._completed.append({**self._commit(None, info), "blocked_s": info["blocked_s"]})
            return path
        # The copy to host memory runs in the stager's thread, the write in DCP's.
        response = dcp.async_save(
            state,
            storage_writer=self._writer(write_dir, step),
            process_group=self.pg,
            async_stager=self._get_stager(),
        )
        if isinstance(response, AsyncSaveResponse):
            upload = response.upload_completion
            self._staging = (response.staging_completion, info)
        else:  # a stager that staged synchronously
            upload = response
        info["blocked_s"] = time.perf_counter() - start
        self._pending = (self._background().submit(self._commit, upload, info), info)
        return path

    def _writer(self, write_dir: str, step: int):
        # Several files per rank, written (and later hashed) in parallel: one stream leaves
        # most of a disk's bandwidth unused (benchmarks/RESULTS.md).
        spec = os.environ.get(_TEST_ENOSPC_ENV, "")
        at, _, rank = spec.partition(":")
        if spec and int(at) == step and int(rank or 0) == self.rank:
            return _NoSpaceWriter(write_dir, thread_count=self.cfg.write_threads)
        return dcp.FileSystemWriter(write_dir, thread_count=self.cfg.write_threads)

    # ------------------------------------------------------------------ a save that fails

    def _failure(self, err: BaseException) -> tuple[int, str, bool]:
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
                    return rank, _describe(cause), True
            for rank, exc in ranked:
                if _short_write(exc):
                    return rank, self._short_write_cause(exc), True
            if ranked:
                return ranked[0][0], _describe(ranked[0][1]), False
        cause = storage_cause(err)
        if cause is None and _short_write(err):
            return self.rank, self._short_write_cause(err), True
        return self.rank, _describe(cause or err), cause is not None

    def _short_write_cause(self, err: BaseException) -> str:
        """torch's stream writer reports a failed file write (ENOSPC in one of DCP's writer threads) only as
        "unexpected pos": say what the filesystem says about its free space."""
        if self.storage is None or self.storage.remote:
            return f"a short write ({_describe(err)})"
        where = self.root
        while where and not os.path.exists(where):
            where = os.path.dirname(where)
        free = shutil.disk_usage(where).free
        if free < 64 * 2**20:
            return (
                f"[Errno 28] No space left on device ({free} bytes free on {where}; torch: {_describe(err)})"
            )
        return f"a short write with {free} bytes free on {where} ({_describe(err)})"

    def _raise_failed(self, step: int, write_dir: str, path: str, failure: tuple[int, str, bool]):
        """Every rank together, once they agree that the save of ``step`` failed: rank 0 removes the partial
        step directory (never a committed one, never one a newer writer may own) and every rank raises --
        ``CheckpointStorageError`` when the storage refused the write, a RuntimeError otherwise."""
        rank, cause, storage = failure
        who = f" (rank {rank})" if self.world_size > 1 else ""
        left = self._remove_partial(step, write_dir, path)
        if not storage:
            raise RuntimeError(f"checkpoint step {step} could not be written to {path}{who}: {cause}")
        try:
            older = [c.step for c in self.dir.committed() if c.step != step]
            intact = (
                f"the older checkpoints (step {', '.join(map(str, older))}) are intact"
                if older
                else "there is no older checkpoint"
            )
        except Exception:  # noqa: BLE001 - the listing may fail the same way; the message must not
            intact = "the older checkpoints were not touched"
        raise CheckpointStorageError(
            f"checkpoint step {step} could not be written to {path}{who}: {cause}; "
            f"{left + '; ' if left else ''}{intact}"
        )

    def _remove_partial(self, step: int, write_dir: str, path: str) -> str:
        """Remove what a failed save of ``step`` left; "" when done (or not rank 0's to do), else why not."""
        if self.storage.remote:
            shutil.rmtree(
                write_dir, ignore_errors=True
            )  # this host's staging files (every local rank, harmlessly)
        if self.rank != 0:
            return ""
        try:
            if self.dir.is_committed(step) or self._newer_lease() is not None:
                return ""  # a committed checkpoint, or a step directory the newer writer may be writing
            if self.storage.remote:
                self.storage.remove_tree(path)
            else:
                shutil.rmtree(path)
        except FileNotFoundError:
            return ""
        except Exception as err:  # noqa: BLE001 - say so in the one line; the directory has no manifest either way
            return f"the partial step directory could not be removed ({_describe(err)}; it has no manifest, so it is never resumed)"
        return ""

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

    def _get_stager(self):
        if self._stager is None:
            self._stager = _new_stager(self.device.type == "cuda")
        return self._stager

    def _staging_dir(self, step: int) -> str:
        base = os.environ.get("DTRAIN_STAGING_DIR") or os.path.join(tempfile.gettempdir(), "dtrain-staging")
        run = hashlib.sha256(self.storage.root.encode()).hexdigest()[:16]
        return os.path.join(base, run, step_dir_name(step))

    def _commit(self, upload: Future | None, info: dict) -> dict:
        """On every rank: wait for the write, hash (and upload) this rank's files; rank 0 then writes the manifest."""
        write_dir, path, step = info["write_dir"], info["path"], info["step"]
        mine, files, failed = [], {}, None
        try:
            if upload is not None:
                upload.result()  # an async write: DCP raises its failure on every rank alike
            # Each rank hashes the shard files it wrote, so the manifest of a large model
            # costs one shard's hashing time, not the whole checkpoint's.
            mine = sorted(n for n in os.listdir(write_dir) if n.startswith(f"__{self.rank}_"))
            if self.rank == 0:
                mine.append(".metadata")
            files = checksum_files(write_dir, mine)
            if self.storage.remote:
                for n in mine:
                    self.storage.put_file(os.path.join(write_dir, n), f"{path}/{n}")
        except (
            Exception,
            CheckpointException,
        ) as err:  # this rank's alone (an upload refused): gathered below
            failed = self._failure(err)
        _maybe_test_delay(step, self.rank)
        gathered = [None] * self.world_size
        dist.all_gather_object(gathered, (files, failed), group=self.pg)
        failures = sorted((f for _, f in gathered if f is not None), key=lambda f: (not f[2], f[0]))
        if failures:  # every rank saw the same gather: all stop here together
            self._raise_failed(step, write_dir, path, failures[0])
        gathered = [part for part, _ in gathered]
        newer = None
        if self.rank == 0:
            newer = self._newer_lease()  # the fence: a newer writer owns the directory now
        committed = None
        if self.rank == 0 and newer is None:
            manifest = {
                "step": step,
                "format": FORMAT_DCP,
                "job": self.job,
                "owner": str(self.config.get("owner") or ""),
                "lease": self.lease.token,
                "world_size": self.world_size,
                "flavor": self.flavor,
                **({"model_args": self.shape} if self.shape is not None else {}),
                "config_hash": self.config_hash,
                **({"tokenizer": self.tokenizer} if self.tokenizer is not None else {}),
                **info["fields"],
                "files": dict(sorted((k, v) for part in gathered for k, v in part.items())),
                "created_at": time.time(),
                # not required by readers of the manifest; lets evaluate/export rebuild the model
                "config": self.config,
            }
            try:
                self.storage.write_json(self.dir.manifest_path(step), manifest)  # the commit point
            except Exception as err:  # noqa: BLE001 - not committed: every rank must hear of it
                committed = self._failure(err)
        if self.rank == 0 and newer is None and committed is None:
            newer = self._newer_lease()  # retention deletes: only the writer may
            if newer is None and info.get("async"):
                self._retain(step)  # this thread is the background already
            elif newer is None:
                # Deleting the oldest checkpoint is no part of saving this one: a sync save (a preemption's,
                # in its grace period) returns without waiting for it; the next save, wait() and close() do.
                self._retention = self._background().submit(self._retain, step)
        # nobody reports the checkpoint before it is committed (a broadcast from rank 0 waits for it)
        newer, committed = self._from_rank0((None if newer is None else tuple(newer), committed))
        if committed is not None:
            self._raise_failed(step, write_dir, path, committed)
        if self.storage.remote:
            for n in mine:
                os.remove(os.path.join(write_dir, n))
            try:
                os.rmdir(write_dir)
            except OSError:
                pass  # another local rank's files are still there
        if newer is not None:
            raise self._fenced(Lease(*newer), step)
        return {
            "step": step,
            "path": path,
            "reason": info["reason"],
            "async": info.get("async", False),
            "seconds": time.perf_counter() - info["start"],
            "waited_s": info["waited_s"],
        }

    def _retain(self, step: int) -> None:
        """(Rank 0, after ``step`` is committed) retention and the lease heartbeat."""
        try:
            self.dir.prune(self.cfg.keep, job=self.job, continues=self.cfg.continue_job)
            self._heartbeat(step)
        except Exception as err:  # noqa: BLE001 - step is committed: the next save fails if the storage does
            print(
                f"[trainer] checkpoint step {step} is committed, but retention or the lease heartbeat in "
                f"{self.root} failed: {_describe(err)}",
                file=sys.stderr,
                flush=True,
            )

    def _background(self) -> ThreadPoolExecutor:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint-commit")
        return self._executor

    def _heartbeat(self, step: int) -> None:
        """(Rank 0) renew the lease file: who writes here, and when it last committed (for people and tools)."""
        info = {**self.lease.info, "heartbeat_at": time.time(), "last_commit": step}
        self.storage.write_json(self.dir.lease_path(self.lease.token), info, durable=False)

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
        if self._pending is not None and self._pending[0].done():
            self._finish_pending()
        out, self._completed = self._completed, []
        return out

    def wait(self) -> None:
        """Block until the save in flight (if any) is committed and retention after the last one is done."""
        if self._pending is not None:
            self._finish_pending()
        if self._retention is not None:
            retention, self._retention = self._retention, None
            retention.result()

    def _finish_pending(self) -> None:
        future, info = self._pending
        self._pending = None
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
            if self._executor is not None:
                self._executor.shutdown(wait=True)
                self._executor = None

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
        choice: list = [None]
        if self.rank == 0 and self.dir.committed():
            from trainer.validate import CheckpointInvalid, validate_checkpoint

            try:
                report = validate_checkpoint(self.root, sample_tensors=8, fallback_to_valid=True)
                choice[0] = (report["step"], report["checkpoint"], report["fell_back_from"])
            except CheckpointInvalid as err:
                choice[0] = ("invalid", str(err), [])
        if dist.is_initialized() and self.world_size > 1:
            dist.broadcast_object_list(choice, src=0, group=self.pg)
        if choice[0] is None:
            return None
        if choice[0][0] != "invalid":
            self._failed_verification = {
                s for f in choice[0][2] if (s := step_of(f["checkpoint"])) is not None
            }
        if choice[0][0] == "invalid":
            raise ValueError(
                f"cannot resume: {choice[0][1]} (older checkpoints are kept; move them away to start over)"
            )
        return choice[0]

    def check_compatible(self, path: str) -> dict:
        """Refuse, before any model is built, a checkpoint this run cannot continue; returns its manifest.

        What makes the saved state mean the same thing must match: the model, the data and how it
        is cut into sequences, and the data order (the seed). Everything else (learning rate,
        schedule, steps, checkpoint interval, ...) may change between attempts; the changes are
        reported as a warning on rank 0.
        """
        name = path.rstrip("/").rsplit("/", 1)[-1]
        manifest = self.dir.manifest(path)
        if self.job and manifest.get("job") and manifest["job"] not in (self.job, self.cfg.continue_job):
            raise ConfigError(
                f"job: this run is job {self.job!r}, but {path} belongs to job {manifest['job']!r}: "
                f"a job never resumes another job's checkpoints (use another checkpoint.uri)"
            )
        saved_shape = manifest.get("model_args")
        if saved_shape is not None and self.shape is not None:
            differ = [
                f"{k} {self.shape.get(k)!r} here, {saved_shape.get(k)!r} there"
                for k in sorted(self.shape)
                if k != "max_seq_len" and self.shape.get(k) != saved_shape.get(k)
            ]
            if (
                differ
                and manifest["flavor"] != self.flavor
                and not (self.config.get("model") or {}).get("init_from")
            ):
                raise ConfigError(
                    f"model.flavor: {self.flavor!r} cannot resume from {path}, which holds flavour "
                    f"{manifest['flavor']!r} ({'; '.join(differ)}); use the same flavour or another checkpoint.uri"
                )
            if differ:
                raise ConfigError(
                    f"model.init_from: this run's model cannot resume from {path}, whose model has "
                    f"another shape ({'; '.join(differ)}); use the same model or another checkpoint.uri"
                )
        elif manifest["flavor"] != self.flavor:
            raise ConfigError(
                f"model.flavor: {self.flavor!r} cannot resume from {path}, which holds flavour "
                f"{manifest['flavor']!r} (use the same flavour or another checkpoint.uri)"
            )
        saved_tokenizer = (
            manifest.get("tokenizer") or BYTES_TOKENIZER
        )  # manifests before the field: byte-level data
        if self.tokenizer is not None and not same_tokenizer(saved_tokenizer, self.tokenizer):
            raise ConfigError(
                f"data.dataset: this data was prepared with tokenizer {describe_tokenizer(self.tokenizer)}, but "
                f"{path} was trained with tokenizer {describe_tokenizer(saved_tokenizer)}: its embeddings mean "
                "that tokenizer's tokens (prepare the data with the same tokenizer, or use another checkpoint.uri)"
            )
        saved = flatten(manifest.get("config") or {})
        mine = flatten(self.config)
        if saved:
            clashes = [f"{k} is {mine.get(k)!r} here but {saved.get(k)!r} in the checkpoint"
                       for k in MUST_MATCH if k in saved and saved.get(k) != mine.get(k)]  # fmt: skip
            if clashes:
                raise ConfigError(
                    f"{'; '.join(clashes)}: cannot resume from {path} (these must match to continue a run: "
                    f"{', '.join(MUST_MATCH)}; use the checkpoint's values or another checkpoint.uri)"
                )
            changed = [f"{k} {saved[k]!r} -> {mine.get(k)!r}" for k in sorted(saved)
                       if k not in MUST_MATCH and k in mine and saved[k] != mine[k]
                       and not k.startswith(("cost.", "metrics."))]  # fmt: skip
            if changed and self.rank == 0:
                print(
                    f"[trainer] resuming {path} with changed settings: {', '.join(changed)}",
                    file=sys.stderr,
                    flush=True,
                )
        for file, entry in manifest["files"].items():
            size = self.storage.size(self.storage.path(name, file))
            if size != entry["size"]:
                raise ValueError(
                    f"cannot resume from {path}: {file} is {size} bytes, its manifest says {entry['size']}"
                )
        return manifest

    def load(self, path: str, model, optimizer, scheduler, data) -> dict:
        """Restore everything from a committed step directory; returns its manifest.

        A different world size reshards: the model and optimizer are DTensors DCP
        can re-split, the data position is global, only the per-rank RNG states of
        ranks that did not exist before start from the seed.
        """
        manifest = self.check_compatible(path)
        state = self._state(model, optimizer, scheduler, data, 0)
        saved_keys = storage_reader(self.storage, path).read_metadata().state_dict_metadata
        rng_key = f"rng_rank{self.rank}"
        if not any(k.startswith(rng_key + ".") for k in saved_keys):
            del state[rng_key]
        dcp.load(state, storage_reader=storage_reader(self.storage, path), process_group=self.pg)
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        scheduler.load_state_dict(state["scheduler"])
        data.load_state_dict(state["data"])
        if rng_key in state:
            _set_rng_state(state[rng_key])
        if state["step"] != manifest["step"]:
            raise ValueError(
                f"cannot resume from {path}: it holds step {state['step']}, manifest says {manifest['step']}"
            )
        return manifest


class _NoSpaceWriter(dcp.FileSystemWriter):
    """The test hook's writer (``DTRAIN_TEST_ENOSPC_AT_STEP``): a disk that fills up part-way through a shard."""

    def write_data(self, plan, planner):
        name = os.path.join(str(self.path), f"__{dist.get_rank() if dist.is_initialized() else 0}_0.distcp")
        with open(name, "wb") as f:
            f.write(b"\0" * 4096)  # what got written before the disk was full
        print(
            f"[trainer] test hook: {_TEST_ENOSPC_ENV}: {name} fails with ENOSPC", file=sys.stderr, flush=True
        )
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), name)


def _maybe_test_delay(step: int, rank: int) -> None:
    spec = os.environ.get(_TEST_COMMIT_DELAY_ENV, "")
    if rank != 0 or not spec:
        return
    at, _, rest = spec.partition(":")
    seconds, _, release = rest.partition(":")
    if int(at) == step:
        print(
            f"[trainer] test hook: step {step} files written, sleeping {seconds}s before the manifest",
            file=sys.stderr,
            flush=True,
        )
        until = time.monotonic() + float(seconds)
        while time.monotonic() < until and not (release and os.path.exists(release)):
            time.sleep(min(0.2, max(0.0, until - time.monotonic())))

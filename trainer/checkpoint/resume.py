"""Verified resume: the newest committed checkpoint that verifies, checked against this run, then loaded.

Rank 0 verifies (trainer.validate) from the newest down and tells every rank which one to load, so a
corrupted or truncated newest checkpoint costs the steps since the one before it, not the run.
"""

from __future__ import annotations


import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import set_state_dict

from trainer.checkpoint.directory import step_of
from trainer.checkpoint.reader import storage_reader
from trainer.checkpoint.context import CheckpointContext, RunIdentity
from trainer.checkpoint.state import set_rng_state, training_state
from trainer.config.fields import ConfigError, flatten
from trainer.base.say import say
from trainer.data.token_store import BYTES_TOKENIZER, describe_tokenizer, same_tokenizer

MUST_MATCH = ("model.flavor", "data.dataset", "data.seq_len", "seed")
"""Config fields a resumed run must share with its checkpoint: the model's shape, the data, how
it is cut into sequences, and the data order."""


def failed_steps(fell_back_from: list[dict]) -> set[int]:
    """The steps of the newer checkpoints a resume fell back past (they failed verification)."""
    return {s for f in fell_back_from if (s := step_of(f["checkpoint"])) is not None}


class Resumer:
    """Finds, checks and loads the checkpoint a run resumes from; every method on all ranks together."""

    def __init__(self, ctx: CheckpointContext, run: RunIdentity):
        self.ctx, self.run = ctx, run

    def resume_point(self) -> tuple[int, str, list[dict]] | None:
        """(step, path, the newer checkpoints that did not verify), None when nothing is committed yet.
        Raises when nothing committed verifies."""
        choice: list = [None]
        if self.ctx.rank == 0 and self.ctx.dir.committed():
            from trainer.validate import validate_checkpoint
            from trainer.checkpoint.errors import CheckpointInvalid

            try:
                report = validate_checkpoint(self.ctx.root, sample_tensors=8, fallback_to_valid=True)
                choice[0] = (report["step"], report["checkpoint"], report["fell_back_from"])
            except CheckpointInvalid as err:
                choice[0] = ("invalid", str(err), [])
        if dist.is_initialized() and self.ctx.world_size > 1:
            dist.broadcast_object_list(choice, src=0, group=self.ctx.pg)
        if choice[0] is not None and choice[0][0] == "invalid":
            raise ValueError(
                f"cannot resume: {choice[0][1]} (older checkpoints are kept; move them away to start over)"
            )
        return choice[0]

    def check_compatible(self, path: str) -> dict:
        """Refuse a checkpoint this run cannot continue; returns its manifest."""
        manifest = self.ctx.dir.manifest(path)
        self._check_job(path, manifest)
        self._check_model(path, manifest)
        self._check_tokenizer(path, manifest)
        self._check_config(path, manifest)
        self._check_sizes(path, manifest)
        return manifest

    def _check_job(self, path: str, manifest: dict) -> None:
        job = self.ctx.job
        if job and manifest.get("job") and manifest["job"] not in (job, self.ctx.cfg.continue_job):
            raise ConfigError(
                f"job: this run is job {job!r}, but {path} belongs to job {manifest['job']!r}: "
                f"a job never resumes another job's checkpoints (use another checkpoint.uri)"
            )

    def _check_model(self, path: str, manifest: dict) -> None:
        """The same model: the same shape (ModelArgs) where both are known, else the same flavour."""
        shape, flavor, saved_shape = self.run.shape, self.run.flavor, manifest.get("model_args")
        if saved_shape is None or shape is None:
            if manifest["flavor"] != flavor:
                raise ConfigError(
                    f"model.flavor: {flavor!r} cannot resume from {path}, which holds flavour "
                    f"{manifest['flavor']!r} (use the same flavour or another checkpoint.uri)"
                )
            return
        differ = [
            f"{k} {shape.get(k)!r} here, {saved_shape.get(k)!r} there"
            for k in sorted(shape)
            if k != "max_seq_len" and shape.get(k) != saved_shape.get(k)
        ]
        if (
            differ
            and manifest["flavor"] != flavor
            and not (self.run.config.get("model") or {}).get("init_from")
        ):
            raise ConfigError(
                f"model.flavor: {flavor!r} cannot resume from {path}, which holds flavour "
                f"{manifest['flavor']!r} ({'; '.join(differ)}); use the same flavour or another "
                "checkpoint.uri"
            )
        if differ:
            raise ConfigError(
                f"model.init_from: this run's model cannot resume from {path}, whose model has "
                f"another shape ({'; '.join(differ)}); use the same model or another checkpoint.uri"
            )

    def _check_tokenizer(self, path: str, manifest: dict) -> None:
        tokenizer = self.run.tokenizer
        saved = manifest.get("tokenizer") or BYTES_TOKENIZER  # manifests before the field: byte-level data
        if tokenizer is not None and not same_tokenizer(saved, tokenizer):
            raise ConfigError(
                f"data.dataset: this data was prepared with tokenizer {describe_tokenizer(tokenizer)}, but "
                f"{path} was trained with tokenizer {describe_tokenizer(saved)}: its embeddings mean that "
                "tokenizer's tokens (prepare the data with the same tokenizer, or use another checkpoint.uri)"
            )

    def _check_config(self, path: str, manifest: dict) -> None:
        """MUST_MATCH must; the rest may change between attempts, and rank 0 says what did."""
        saved = flatten(manifest.get("config") or {})
        mine = flatten(self.run.config)
        if not saved:
            return
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
        if changed and self.ctx.rank == 0:
            say(f"[trainer] resuming {path} with changed settings: {', '.join(changed)}")

    def _check_sizes(self, path: str, manifest: dict) -> None:
        name = path.rstrip("/").rsplit("/", 1)[-1]
        for file, entry in manifest["files"].items():
            size = self.ctx.storage.size(self.ctx.storage.path(name, file))
            if size != entry["size"]:
                raise ValueError(
                    f"cannot resume from {path}: {file} is {size} bytes, its manifest says {entry['size']}"
                )

    def load(self, path: str, model, optimizer, scheduler, data) -> dict:
        """Restore everything from a committed step directory; returns its manifest (Checkpointer.load)."""
        manifest = self.check_compatible(path)
        rank, storage = self.ctx.rank, self.ctx.storage
        state = training_state(model, optimizer, scheduler, data, 0, rank)
        saved_keys = storage_reader(storage, path).read_metadata().state_dict_metadata
        rng_key = f"rng_rank{rank}"
        if not any(k.startswith(rng_key + ".") for k in saved_keys):
            del state[rng_key]
        dcp.load(state, storage_reader=storage_reader(storage, path), process_group=self.ctx.pg)
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        scheduler.load_state_dict(state["scheduler"])
        data.load_state_dict(state["data"])
        if rng_key in state:
            set_rng_state(state[rng_key])
        if state["step"] != manifest["step"]:
            raise ValueError(
                f"cannot resume from {path}: it holds step {state['step']}, manifest says {manifest['step']}"
            )
        return manifest

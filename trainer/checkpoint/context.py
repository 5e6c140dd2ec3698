"""What every part of a checkpointer shares: the directory, this rank's place, the checkpoint's own group."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch.distributed as dist

from trainer.checkpoint.directory import CheckpointDir
from trainer.config.sections import CheckpointConfig
from trainer.base.say import say as say_line
from trainer.base.storage import Storage


def describe(err: BaseException) -> str:
    """An error as one line: an OSError as Python words it ("[Errno 28] No space left on device: 'path'")."""
    if isinstance(err, OSError):
        return str(err)
    return f"{type(err).__name__}: {err}".splitlines()[0]


def say(message: str) -> None:
    """One line on stderr, as the trainer logs."""
    say_line(f"[trainer] {message}")


@dataclass
class CheckpointContext:
    """The checkpoint directory of an enabled checkpointer and the group that writes it.

    ``pg``: the checkpoint's own (gloo) process group; its collectives (DCP's plan/finish, the manifest
    gather, rank 0's decisions) may run in a background thread and must not interleave with training's.
    """

    cfg: CheckpointConfig
    storage: Storage
    rank: int
    world_size: int
    job: str
    pg: Any = None
    dir: CheckpointDir = field(init=False)

    def __post_init__(self) -> None:
        self.dir = CheckpointDir(self.storage)

    @property
    def root(self) -> str:
        return self.storage.root

    def from_rank0(self, value: Any) -> Any:
        """Rank 0's ``value`` on every rank (on the checkpoint's own group)."""
        if dist.is_initialized() and self.world_size > 1:
            box = [value]
            dist.broadcast_object_list(box, src=0, group=self.pg)
            return box[0]
        return value


@dataclass(frozen=True)
class RunIdentity:
    """What a manifest records of the run that saved it, and what a resume checks against it."""

    flavor: str
    config: dict
    config_hash: str
    shape: dict | None = None
    """The model's ModelArgs as a dict: resume, evaluate and export rebuild it from this."""
    tokenizer: dict | None = None
    """The identity of the data's tokenizer (trainer.data.token_store): recorded in every manifest and
    checked at resume, since the embedding rows mean one tokenizer's tokens. None: neither."""

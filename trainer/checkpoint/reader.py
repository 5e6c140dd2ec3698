"""``storage_reader``: the one reader of a committed step directory. Its own module so that
trainer/validate.py (which trainer/checkpoint/checkpointer.py runs on resume) reads checkpoints without
importing trainer/checkpoint/checkpointer.py; ``trainer.checkpoint.reader.storage_reader`` is this same
function."""

from trainer.checkpoint.safe_pickle import safe_reader
from trainer.base.storage import Storage


def storage_reader(storage: Storage, step_dir: str):
    """DCP's reader for a step directory (the filesystem one locally, its fsspec one for s3://), made to run
    nothing the checkpoint holds: .metadata is unpickled with an allowlist and each byte item by torch's
    weights-only unpickler (trainer/checkpoint/safe_pickle.py). Every reader of a checkpoint comes through
    here."""
    return safe_reader(step_dir, remote=storage.remote)

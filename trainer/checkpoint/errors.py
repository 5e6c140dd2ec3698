"""What goes wrong with a checkpoint directory: the exceptions the trainer and the provider share.

Standard library only: the Airflow provider imports these at DAG-parse time (trainer/checkpoint/directory.py).
"""

from __future__ import annotations


class WriterFenced(RuntimeError):
    """A newer writer lease exists in the checkpoint directory: another group took it over, and
    this one must commit nothing more (``python -m trainer`` exits ``FENCED_EXIT_CODE``)."""


class CheckpointStorageError(RuntimeError):
    """A checkpoint could not be written: the storage refused it (a full disk, no permission, a
    read-only filesystem, S3 AccessDenied). Raised on every rank together, after the partial step
    directory was removed; ``python -m trainer`` prints the message, one line naming the path and the
    cause, and exits ``STORAGE_EXIT_CODE``."""


# Transient network trouble is not the storage refusing a write: those stay ordinary failures.
_NOT_STORAGE = (ConnectionError, TimeoutError)
# S3 error codes (botocore's ClientError.response["Error"]["Code"]) that mean "this principal may not
# write here".
_S3_REFUSALS = frozenset({"AccessDenied", "AllAccessDisabled", "InvalidAccessKeyId", "SignatureDoesNotMatch",
                          "NoSuchBucket", "AccountProblem", "QuotaExceeded"})  # fmt: skip


def storage_cause(err: BaseException | None) -> BaseException | None:
    """The storage refusal behind ``err`` (an OSError such as ENOSPC/EACCES/EROFS, or a botocore S3
    AccessDenied), looking through chained exceptions and DCP's per-rank ``CheckpointException``
    failures; None when ``err`` is something else (a crash, a lost peer, a fence)."""
    seen: set[int] = set()
    todo = [err]
    while todo:
        e = todo.pop(0)
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and not isinstance(e, _NOT_STORAGE):
            return e
        code = (
            ((getattr(e, "response", None) or {}).get("Error") or {}).get("Code")
            if isinstance(getattr(e, "response", None), dict)
            else None
        )
        if code in _S3_REFUSALS:
            return e
        failures = getattr(e, "failures", None)  # torch.distributed.checkpoint's CheckpointException
        if isinstance(failures, dict):
            todo.extend(f[0] if isinstance(f, tuple) else f for f in failures.values())
        todo.extend([e.__cause__, e.__context__])
    return None


class CheckpointInvalid(ValueError):
    """A checkpoint failed a check; ``checkpoint``, ``check`` and ``file`` say which, where."""

    def __init__(self, checkpoint: str, check: str, file: str, detail: str):
        self.checkpoint, self.check, self.file, self.detail = checkpoint, check, file, detail
        super().__init__(f"checkpoint {checkpoint}: check {check!r} failed for {file}: {detail}")

    def to_dict(self) -> dict:
        return {"checkpoint": self.checkpoint, "check": self.check, "file": self.file, "detail": self.detail}

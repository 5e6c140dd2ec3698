"""CheckpointValidationOperator: check a training checkpoint before anyone relies on it."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from airflow_dtrain import metrics

if TYPE_CHECKING:
    from airflow.sdk import Context


class CheckpointValidationOperator(BaseOperator):
    """
    Validate a committed checkpoint of the trainer: its manifest, every file's presence,
    size and checksum (xxh3_128, or sha256 in older manifests), that DCP's metadata loads,
    that the step moved forward, and that a sample of tensors holds no NaN/Inf (see
    ``trainer.validate``).

    Returns the report (XCom): ``{"checkpoint", "step", "valid", "checks", "fell_back_from", ...}``.
    A failure raises ``trainer.validate.CheckpointInvalid`` naming the checkpoint, the check and
    the file (or tensor).

    :param checkpoint_uri: a checkpoint root (its latest committed checkpoint is checked) or one
        step directory; a local path, ``file://`` or ``s3://``. (templated)
    :param previous_step: the checkpoint's step must be greater; default: the committed checkpoint
        before it. (templated)
    :param sample_tensors: floating-point tensors to load and check for NaN/Inf; None: all. (templated)
    :param fallback_to_valid: instead of failing, return the report of the newest valid checkpoint
        (the ones skipped, and why, are under ``fell_back_from``); fails only when none is valid.
    """

    template_fields: Sequence[str] = ("checkpoint_uri", "previous_step", "sample_tensors")
    ui_color = "#e4f0ff"

    def __init__(
        self,
        *,
        checkpoint_uri: str,
        previous_step: int | None = None,
        sample_tensors: int | None = 8,
        fallback_to_valid: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.checkpoint_uri = checkpoint_uri
        self.previous_step = previous_step
        self.sample_tensors = sample_tensors
        self.fallback_to_valid = fallback_to_valid

    def execute(self, context: Context) -> dict[str, Any]:
        from trainer.validate import validate_checkpoint  # torch only once a tensor is looked at

        previous = None if self.previous_step in (None, "", "None") else int(self.previous_step)
        sample = None if self.sample_tensors in (None, "", "None") else int(self.sample_tensors)
        self.log.info("Validating the checkpoint at %s", self.checkpoint_uri)
        try:
            report = validate_checkpoint(
                self.checkpoint_uri,
                previous_step=previous,
                sample_tensors=sample,
                fallback_to_valid=self.fallback_to_valid,
            )
        except Exception:
            metrics.incr("checkpoint.validation_failures", tags=metrics.task_tags(context))
            raise
        if report["fell_back_from"]:
            metrics.incr(
                "checkpoint.validation_failures",
                len(report["fell_back_from"]),
                tags=metrics.task_tags(context),
            )
        for skipped in report["fell_back_from"]:
            self.log.warning(
                "Skipped %s: check %s failed for %s: %s",
                skipped["checkpoint"], skipped["check"], skipped["file"], skipped["detail"],
            )  # fmt: skip
        self.log.info(
            "Checkpoint %s (step %s) is valid: %s",
            report["checkpoint"],
            report["step"],
            json.dumps(report["checks"]),
        )
        return report

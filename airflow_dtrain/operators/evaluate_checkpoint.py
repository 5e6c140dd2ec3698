"""EvaluateCheckpointOperator: held-out evaluation, and promotion of the best checkpoint."""

from __future__ import annotations

import dataclasses
import json
import time
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import Asset, AssetAlias, BaseOperator

from airflow_dtrain import metrics
from airflow_dtrain.launchers import (GroupState, PodGroupLauncher, get_launcher, launcher_kwargs, poll_group,
                                     relaunches)
from airflow_dtrain.spec import JobSpec, SpecError, group_base_name, group_name, relaunch_index

if TYPE_CHECKING:
    from airflow.sdk import Context

BEST_FILE = "best.json"
BEST_MARKER = "BEST"
"""Marks a checkpoint directory as the best so far: retention never deletes it."""


class EvaluationFailed(RuntimeError):
    """The evaluation or export job failed."""


def _fs(uri: str):
    import fsspec

    return fsspec.core.url_to_fs(uri)


def read_json(uri: str) -> dict[str, Any] | None:
    fs, path = _fs(uri)
    if not fs.exists(path):
        return None
    with fs.open(path, "r") as fh:
        return json.load(fh)


def write_json(uri: str, data: dict[str, Any]) -> None:
    fs, path = _fs(uri)
    fs.makedirs(fs._parent(path), exist_ok=True)
    with fs.open(path, "w") as fh:
        json.dump(data, fh, indent=1)


class EvaluateCheckpointOperator(BaseOperator):
    """
    Evaluate the latest checkpoint on held-out data and promote it if it beats the best so far.

    The evaluation runs through the same launcher as training (a local process, or a pod on
    Kubernetes): ``python -m trainer.evaluate`` over every committed checkpoint of the run
    (the eval curve), writing ``evals/latest.json`` and ``report.png`` (train and held-out loss
    curves) next to the checkpoints. If the latest checkpoint's held-out loss is lower than
    the one in ``<registry_uri>/best.json`` it is promoted: marked best (retention keeps it),
    exported as Hugging Face safetensors under ``<registry_uri>/<run>/``, recorded in
    ``best.json``, and an asset event for ``asset`` is emitted. Nothing is emitted otherwise.

    :param checkpoint_uri: the run's checkpoint directory (as given to FSDPTrainOperator). (templated)
    :param step: the checkpoint step to evaluate and maybe promote, e.g. the one validation
        chose (default: the latest committed). (templated)
    :param registry_uri: where the best model so far is recorded and exported. (templated)
    :param asset: the asset a promotion updates (a downstream DAG can be scheduled on it).
    :param batches: held-out batches per checkpoint. (templated)
    :param batch_size: sequences per batch. (templated)
    :param eval_all: evaluate every committed checkpoint for the curve, not only the latest. (templated)
    :param export: export a promoted checkpoint as safetensors. (templated)
    :param min_improvement: promote only if the loss improves by more than this. (templated)
    :param backend: ``local`` or ``kubernetes``, as for training. (templated)
    :param kubernetes: pod settings of the ``kubernetes`` backend (see FSDPTrainOperator). (templated)
    :param kubernetes_conn_id: the Kubernetes connection.
    :param node_resources: the evaluation pod's ``{"cpu", "memory", "gpus_per_node"}``. (templated)
    :param poll_interval: seconds between looks at the evaluation job.
    :param job_timeout_s: fail if one job has not ended after this long.
    :param local_state_dir: state directory of the local backend.
    """

    template_fields: Sequence[str] = (
        "checkpoint_uri", "step", "registry_uri", "batches", "batch_size", "eval_all", "export", "min_improvement",
        "backend", "kubernetes", "node_resources",
    )  # fmt: skip
    template_fields_renderers = {"kubernetes": "json", "node_resources": "json"}
    ui_color = "#e4f4ff"

    def __init__(
        self,
        *,
        checkpoint_uri: str,
        registry_uri: str,
        step: int | str | None = None,
        asset: Asset | None = None,
        batches: int | str = 20,
        batch_size: int | str = 8,
        eval_all: bool | str = True,
        export: bool | str = True,
        min_improvement: float | str = 0.0,
        backend: str = "local",
        kubernetes: dict[str, Any] | None = None,
        kubernetes_conn_id: str = "kubernetes_default",
        node_resources: dict[str, Any] | None = None,
        poll_interval: float = 2.0,
        job_timeout_s: float = 3600.0,
        local_state_dir: str | None = None,
        **kwargs: Any,
    ) -> None:
        if asset is not None:
            # Through an alias, so that only a promotion emits an event for the asset.
            kwargs["outlets"] = [*(kwargs.get("outlets") or []), AssetAlias(self.alias_name(asset))]
        super().__init__(**kwargs)
        self.checkpoint_uri = checkpoint_uri
        self.registry_uri = registry_uri
        self.step = step
        self.asset = asset
        self.batches = batches
        self.batch_size = batch_size
        self.eval_all = eval_all
        self.export = export
        self.min_improvement = min_improvement
        self.backend = backend
        self.kubernetes = kubernetes
        self.kubernetes_conn_id = kubernetes_conn_id
        self.node_resources = node_resources
        self.poll_interval = poll_interval
        self.job_timeout_s = job_timeout_s
        self.local_state_dir = local_state_dir

    @staticmethod
    def alias_name(asset: Asset) -> str:
        return f"{asset.name}__promotions"

    # -- jobs ----------------------------------------------------------------------------------
    def _job_spec(self, *entrypoint: str) -> JobSpec:
        try:
            spec = JobSpec.from_arguments(
                checkpoint_uri=self.checkpoint_uri,
                num_nodes=1,
                procs_per_node=1,
                global_batch_size=1,
                micro_batch_size=1,
                backend=self.backend,
                kubernetes=self.kubernetes,
                resources=self.node_resources,
            )
        except SpecError as err:
            raise SpecError(f"{type(self).__name__}(task_id={self.task_id!r}): {err}") from None
        return dataclasses.replace(spec, entrypoint=tuple(str(a) for a in entrypoint))

    def _launcher(self, spec: JobSpec) -> PodGroupLauncher:
        return get_launcher(spec.backend, **launcher_kwargs(
            spec.backend, kubernetes=self.kubernetes, kubernetes_conn_id=self.kubernetes_conn_id,
            local_state_dir_setting=self.local_state_dir))

    def _run_job(self, context: Context, purpose: str, spec: JobSpec) -> None:
        """Run one job to its end (reattaching to a running one of an earlier try), raise if it failed."""
        ti = context["ti"]
        base = group_base_name(ti.dag_id, ti.run_id, f"{ti.task_id}-{purpose}", getattr(ti, "map_index", -1))
        launcher = self._launcher(spec)
        names = relaunches(launcher, base)
        if names and launcher.status(names[-1]).state in (GroupState.PENDING, GroupState.RUNNING):
            name = names[-1]
            self.log.info("Reattaching to %s job %s", purpose, name)
        else:
            name = group_name(base, relaunch_index(base, names[-1]) + 1 if names else 0)
            self.log.info("Launching %s job %s: python -m %s", purpose, name, " ".join(spec.entrypoint))
            launcher.launch(name, spec)
        self._job = (launcher, name)
        cursor, tail = None, deque(maxlen=40)
        deadline = time.monotonic() + self.job_timeout_s
        while True:
            status, chunk = poll_group(launcher, name, cursor)
            for line in chunk.lines:
                self.log.info("%s", line)
            tail.extend(chunk.lines)
            cursor = chunk.cursor
            if status.state == GroupState.SUCCEEDED:
                return
            if status.state.terminal or status.state == GroupState.NOT_FOUND:
                raise EvaluationFailed(
                    f"{purpose} job {name} {status.state.value}: {status.message}\nLast lines of its log:\n"
                    + "\n".join(tail)
                )
            if time.monotonic() > deadline:
                launcher.stop(name)
                raise EvaluationFailed(f"{purpose} job {name} did not end within {self.job_timeout_s:.0f}s")
            time.sleep(self.poll_interval)

    # -- execution -----------------------------------------------------------------------------
    def execute(self, context: Context) -> dict[str, Any]:
        root = str(self.checkpoint_uri).rstrip("/")
        registry = str(self.registry_uri).rstrip("/")
        out, report = f"{root}/evals/latest.json", f"{root}/report.png"
        entry = ["trainer.evaluate", "--checkpoint-uri", root, "--out", out, "--report", report,
                 "--batches", int(self.batches), "--batch-size", int(self.batch_size)]  # fmt: skip
        if self.step not in (None, "", "None"):
            entry += ["--step", int(self.step)]
        if _true(self.eval_all):
            entry.append("--all")
        self._run_job(context, "eval", self._job_spec(*entry))
        result = read_json(out)
        if result is None:
            raise EvaluationFailed(f"the evaluation job wrote no results to {out}")
        self.log.info(
            "Held-out loss %.4f (perplexity %.2f) at step %d, %.0f tokens/s; loss curves: %s",
            result["loss"], result["perplexity"], result["step"], result["tokens_per_s"], report,
        )  # fmt: skip
        metrics.gauge("eval.loss", result["loss"])
        metrics.gauge("eval.perplexity", result["perplexity"])
        metrics.gauge("eval.tokens_per_s", result["tokens_per_s"])

        best = read_json(f"{registry}/{BEST_FILE}")
        summary = {
            "checkpoint": result["path"],
            "step": result["step"],
            "loss": result["loss"],
            "perplexity": result["perplexity"],
            "tokens_per_s": result["tokens_per_s"],
            "eval_curve": result.get("eval_curve"),
            "report": report,
            "best_loss_before": best["loss"] if best else None,
            "promoted": False,
            "export": None,
        }
        if best is not None and not result["loss"] < best["loss"] - float(self.min_improvement):
            self.log.info(
                "Not promoted: loss %.4f does not beat the best so far, %.4f (%s)",
                result["loss"], best["loss"], best["checkpoint"],
            )  # fmt: skip
            return summary
        return self._promote(context, summary, registry)

    def _promote(self, context: Context, summary: dict[str, Any], registry: str) -> dict[str, Any]:
        checkpoint = summary["checkpoint"]
        fs, path = _fs(checkpoint)
        with fs.open(f"{path}/{BEST_MARKER}", "w") as fh:
            fh.write(json.dumps({"loss": summary["loss"], "marked_at": time.time()}))
        export_dir = None
        if _true(self.export):
            run = context["ti"].run_id.replace(":", "-").replace("+", "-")
            export_dir = f"{registry}/{run}/step-{summary['step']:08d}"
            self._run_job(
                context, "export", self._job_spec("trainer.export", "--checkpoint-uri", checkpoint, "--out", export_dir)
            )
        summary.update(promoted=True, export=export_dir)
        write_json(
            f"{registry}/{BEST_FILE}",
            {**{k: summary[k] for k in ("checkpoint", "step", "loss", "perplexity", "export", "report")},
             "run_id": context["ti"].run_id, "promoted_at": time.time()},
        )  # fmt: skip
        metrics.incr("checkpoint.promotions")
        self.log.info("Promoted %s (loss %.4f, before: %s); export: %s", checkpoint, summary["loss"],
                      summary["best_loss_before"], export_dir)  # fmt: skip
        if self.asset is not None:
            context["outlet_events"][AssetAlias(self.alias_name(self.asset))].add(
                self.asset,
                extra={**{k: summary[k] for k in ("checkpoint", "step", "loss", "perplexity", "export")},
                       "registry": registry},
            )
        return summary

    def on_kill(self) -> None:
        job = getattr(self, "_job", None)
        if job:
            launcher, name = job
            launcher.stop(name)


def _true(value: Any) -> bool:
    return value if isinstance(value, bool) else str(value).strip().lower() in ("1", "true", "yes")

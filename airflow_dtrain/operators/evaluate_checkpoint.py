"""EvaluateCheckpointOperator: held-out evaluation, and promotion of the best checkpoint."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import Asset, AssetAlias, BaseOperator

from airflow_dtrain import jobs_index, metrics
from airflow_dtrain.launchers.factory import get_launcher, launcher_kwargs
from airflow_dtrain.session.group import GroupFailed, GroupSession
from airflow_dtrain.job.spec import JobSpec
from airflow_dtrain.errors import SpecError
from airflow_dtrain.kubernetes.spec import kubernetes_for_run
from airflow_dtrain.job.naming import group_base_name
from airflow_dtrain.templating import check_author_template
from airflow_dtrain.trust.ownership import (
    OWNER_FILE,
    OwnershipError,
    check_job_dir,
    job_key,
    owner_of,
    run_key,
)
from airflow_dtrain.trust.roots import within_roots
from airflow_dtrain.trust.limits import limits_for
from trainer.checkpoint.directory import EVAL_RESULTS, REGISTRY_BEST, REPORT, CheckpointDir

if TYPE_CHECKING:
    from airflow.sdk import Context


class EvaluationFailed(GroupFailed):
    """The evaluation or export job failed."""


class EvaluateCheckpointOperator(BaseOperator):
    """
    Evaluate the latest checkpoint on held-out data and promote it if it beats the best so far.

    The evaluation runs through the same launcher as training (a local process, or a pod on
    Kubernetes): ``python -m trainer.evaluate`` over every committed checkpoint of the run
    (the eval curve), writing ``evals/latest.json`` and ``report.png`` (train and held-out loss
    curves) next to the checkpoints. If the latest checkpoint's held-out loss is lower than
    the best so far *of the same job on the same evaluation set* (``<registry_uri>/<job>/<eval
    set>/best.json``; the evaluation set is the dataset, tokenizer, sequence length and batches the loss was
    measured on, so a loss on easier data never displaces another model) it is promoted: marked best
    (retention keeps it), recorded in ``best.json``, and an asset event for ``asset`` is emitted. Promoted or
    not, the evaluated checkpoint is exported as Hugging Face safetensors under ``<registry_uri>/<job>/<eval
    set>/<run>/`` (by the evaluation job itself: one job, one pod), and the XCom says where (``export``) and
    whether it became the best (``promoted``, ``best_loss_before``).

    The checkpoint directory must be the run's owner's directory of ``job``
    (``airflow_dtrain.trust.ownership``), and the registry must lie under the storage roots; a job's registry
    entry is claimed for its owner like its checkpoints.

    :param checkpoint_uri: the run's checkpoint directory (as given to FSDPTrainOperator). (templated)
    :param step: the checkpoint step to evaluate and maybe promote, e.g. the one validation
        chose (default: the latest committed). (templated)
    :param registry_uri: where the best models are recorded and exported, one entry per job and evaluation
        set; under the storage roots (``limits``). (templated)
    :param job: the job the checkpoints belong to (default: the one recorded in the directory's owner.json,
        which the train task wrote). (templated)
    :param limits: the DAG author's limits (``airflow_dtrain.trust.limits.Limits``; only ``storage_roots``
        applies here), within the platform admin's.
    :param asset: the asset a promotion updates (a downstream DAG can be scheduled on it).
    :param batches: held-out batches per checkpoint. (templated)
    :param batch_size: sequences per batch. (templated)
    :param eval_all: evaluate every committed checkpoint for the curve, not only the latest; one that an
        earlier run evaluated, as it is committed now and with the same batches, is read back from
        ``evals/latest.json``, not evaluated again. (templated)
    :param export: export the evaluated checkpoint as safetensors, promoted or not (every run's model can be
        loaded; the entry's best.json names the best). (templated)
    :param min_improvement: promote only if the loss improves by more than this. (templated)
    :param backend: ``local`` or ``kubernetes``, as for training. (templated)
    :param kubernetes: the DAG author's pod settings of the ``kubernetes`` backend (see FSDPTrainOperator;
        a template here may not read ``params`` or ``dag_run``). (templated)
    :param kubernetes_overrides: what a run chooses of the pods: ``image``, ``namespace``, within
        ``kubernetes.allowed_images`` / ``allowed_namespaces`` (see FSDPTrainOperator). (templated)
    :param kubernetes_conn_id: the Kubernetes connection.
    :param node_resources: the evaluation pod's ``{"cpu", "memory", "gpus_per_node"}``. (templated)
    :param poll_interval: seconds between looks at the evaluation job.
    :param job_timeout_s: fail if one job has not ended after this long.
    :param local_state_dir: state directory of the local backend.
    """

    template_fields: Sequence[str] = (
        "checkpoint_uri",
        "step",
        "registry_uri",
        "job",
        "batches",
        "batch_size",
        "eval_all",
        "export",
        "min_improvement",
        "backend",
        "kubernetes",
        "kubernetes_overrides",
        "node_resources",
    )
    template_fields_renderers = {"kubernetes": "json", "node_resources": "json"}
    ui_color = "#e4f4ff"

    def __init__(
        self,
        *,
        checkpoint_uri: str,
        registry_uri: str,
        step: int | str | None = None,
        job: str | None = None,
        limits: dict[str, Any] | None = None,
        asset: Asset | None = None,
        batches: int | str = 20,
        batch_size: int | str = 8,
        eval_all: bool | str = True,
        export: bool | str = True,
        min_improvement: float | str = 0.0,
        backend: str = "local",
        kubernetes: dict[str, Any] | None = None,
        kubernetes_overrides: dict[str, Any] | None = None,
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
        self.job = job
        self.limits = limits
        self.asset = asset
        self.batches = batches
        self.batch_size = batch_size
        self.eval_all = eval_all
        self.export = export
        self.min_improvement = min_improvement
        self.backend = backend
        check_author_template(f"{type(self).__name__}(task_id={self.task_id!r}): kubernetes", kubernetes)
        self.kubernetes = kubernetes
        self.kubernetes_overrides = kubernetes_overrides
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
            self._pods = kubernetes_for_run(self.kubernetes, self.kubernetes_overrides)
            spec = JobSpec.from_arguments(
                checkpoint_uri=self.checkpoint_uri,
                num_nodes=1,
                procs_per_node=1,
                global_batch_size=1,
                micro_batch_size=1,
                backend=self.backend,
                kubernetes=self._pods,
                resources=self.node_resources,
            )
        except SpecError as err:
            raise SpecError(f"{type(self).__name__}(task_id={self.task_id!r}): {err}") from None
        return dataclasses.replace(spec, entrypoint=tuple(str(a) for a in entrypoint))

    def _run_job(self, context: Context, purpose: str, spec: JobSpec) -> None:
        """Run one job to its end (reattaching to a running one of an earlier try), raise if it failed."""
        ti = context["ti"]
        base = group_base_name(ti.dag_id, ti.run_id, f"{ti.task_id}-{purpose}", getattr(ti, "map_index", -1))
        launcher = get_launcher(spec.backend, **launcher_kwargs(
            spec.backend, kubernetes=self._pods, kubernetes_conn_id=self.kubernetes_conn_id,
            local_state_dir_setting=self.local_state_dir))  # fmt: skip
        self._session = GroupSession(
            launcher, base, spec, log=self.log, error=EvaluationFailed, purpose=purpose
        )
        # A finished job of an earlier try may have evaluated another step: run it again.
        self._session.run(
            poll_interval=self.poll_interval, reuse_succeeded=False, timeout_s=self.job_timeout_s
        )

    # -- execution -----------------------------------------------------------------------------
    def _entry(self, context: Context, root: str) -> tuple[str, str]:
        """The job and the evaluation set whose registry entry this run competes in, after checking that the
        checkpoints are the run's owner's and the registry lies under the storage roots."""
        limits = limits_for(self.limits)
        where = f"{type(self).__name__}(task_id={self.task_id!r})"
        try:
            limits.check_uri("checkpoint_uri", root)
            limits.check_uri("registry_uri", str(self.registry_uri))
            owner = owner_of(context)
            job = self.job if self.job not in (None, "None") else None
            if job is None:  # the job the train task claimed the directory for
                recorded = CheckpointDir(root).read_json(OWNER_FILE) or {}
                job = recorded.get("job")
                if not job:
                    raise OwnershipError(f"checkpoint_uri: {root!r} records no job ({OWNER_FILE}): pass job=")
            check_job_dir(root, owner=owner, job=str(job), claim=False)
        except SpecError as err:
            raise SpecError(f"{where}: {err}") from None
        return str(job), owner

    def execute(self, context: Context) -> dict[str, Any]:
        ti = context["ti"]
        summary = self._evaluate(context)
        # the job's entry in the job index: the Training jobs pages read its registry entry's bests again
        entry = summary["registry_entry"].rsplit("/", 1)[0]  # <registry>/<job key>, above its evaluation sets
        jobs_index.record(
            ti.dag_id,
            self._owner,
            summary["job"],
            run=(ti.run_id, ti.task_id),
            registry_entry=entry,
            evaluated_at=time.time(),
        )
        return summary

    def _evaluate(self, context: Context) -> dict[str, Any]:
        root = str(self.checkpoint_uri).rstrip("/")
        job, owner = self._entry(context, root)
        self._owner = owner
        checkpoints = CheckpointDir(root)
        step = self._step(checkpoints, root)
        eval_set = evaluation_set(checkpoints.manifest(step), int(self.batches), int(self.batch_size))
        registry_root = str(self.registry_uri).rstrip("/")
        if within_roots(registry_root, [root]) or within_roots(root, [registry_root]):
            raise OwnershipError(
                f"{type(self).__name__}(task_id={self.task_id!r}): registry_uri {registry_root!r} and "
                f"checkpoint_uri {root!r} lie one inside the other: a registry is never a job's checkpoints"
            )
        entry_key = job_key(
            owner, job, context["ti"].dag_id
        )  # the DAG owner's: <job>; others: owners/<o>/<job>
        job_entry, self._entry_key = f"{registry_root}/{entry_key}", entry_key
        check_job_dir(
            job_entry, owner=owner, job=job, what="registry_uri", kind="registry"
        )  # claims a new one
        registry = CheckpointDir(f"{job_entry}/{eval_set}")
        out, report = checkpoints.path(EVAL_RESULTS), checkpoints.path(REPORT)
        entry = self._eval_entry(root, out, report, step)
        best = registry.read_json(REGISTRY_BEST)
        # the loss a promotion must beat. Every run's model is exported, by the eval job itself (no second
        # job),
        # into the entry's directory of this run: a run that is not the best still leaves its model to load
        threshold = best["loss"] - float(self.min_improvement) if best is not None else None
        if _true(self.export):
            entry += ["--export-to", registry.path(run_key(context["ti"].run_id))]
        self._run_job(context, "eval", self._job_spec(*entry))
        result = checkpoints.read_json(EVAL_RESULTS)
        if result is None:
            raise EvaluationFailed(f"the evaluation job wrote no results to {out}")
        self._log_result(context, result, report)
        summary = {
            "checkpoint": result["path"],
            "step": result["step"],
            "loss": result["loss"],
            "perplexity": result["perplexity"],
            "tokens_per_s": result["tokens_per_s"],
            "eval_curve": result.get("eval_curve"),
            "report": report,
            "job": job,
            "evaluation_set": eval_set,
            "registry_entry": registry.root,
            "best_loss_before": best["loss"] if best else None,
            "promoted": False,
            "export": self._exported(
                summary_step=result["step"], exported=result.get("export"), checkpoints=checkpoints
            ),
        }
        if threshold is not None and not result["loss"] < threshold:
            self.log.info(
                "Exported %s; not the best of job %s on evaluation set %s: loss %.4f does not beat %.4f (%s)",
                summary["export"], job, eval_set, result["loss"], best["loss"], best["checkpoint"],
            )  # fmt: skip
            return summary
        return self._promote(context, summary, registry)

    def _step(self, checkpoints: CheckpointDir, root: str) -> int:
        """The step to evaluate: ``step``, else the latest committed one; it must be committed."""
        step = None if self.step in (None, "", "None") else int(self.step)
        latest = checkpoints.latest() if step is None else None
        step = step if step is not None else (latest.step if latest else None)
        if step is None or not checkpoints.is_committed(step):
            raise EvaluationFailed(f"no committed checkpoint {step if step is not None else ''} under {root}")
        return step

    def _eval_entry(self, root: str, out: str, report: str, step: int) -> list[Any]:
        """The eval job's ``python -m trainer.evaluate`` arguments."""
        entry: list[Any] = ["trainer.evaluate", "--checkpoint-uri", root, "--out", out, "--report", report]
        entry += ["--batches", int(self.batches), "--batch-size", int(self.batch_size), "--step", step]
        if _true(self.eval_all):
            entry.append("--all")
        return entry

    def _log_result(self, context: Context, result: dict[str, Any], report: str) -> None:
        """Log the held-out loss and send it to the metrics."""
        self.log.info(
            "Held-out loss %.4f (perplexity %.2f) at step %d, %.0f tokens/s; loss curves: %s",
            result["loss"], result["perplexity"], result["step"], result["tokens_per_s"], report,
        )  # fmt: skip
        tags = metrics.task_tags(context)
        metrics.gauge("eval.loss", result["loss"], tags=tags)
        metrics.gauge("eval.perplexity", result["perplexity"], tags=tags)
        metrics.gauge("eval.tokens_per_s", result["tokens_per_s"], tags=tags)

    def _exported(
        self, *, summary_step: int, exported: dict[str, Any] | None, checkpoints: CheckpointDir
    ) -> str | None:
        """Where the eval job exported the evaluated step (None when export is off); it must have."""
        if not _true(self.export):
            return None
        if not exported:
            raise EvaluationFailed(f"the evaluation job exported nothing for step {summary_step} "
                                   f"(its results: {checkpoints.path(EVAL_RESULTS)})")  # fmt: skip
        return exported["out"]

    def _promote(self, context: Context, summary: dict[str, Any], registry: CheckpointDir) -> dict[str, Any]:
        checkpoint, export_dir = summary["checkpoint"], summary["export"]
        checkpoints, step_dir = CheckpointDir.split(checkpoint)
        checkpoints.mark_best(step_dir or checkpoint, {"loss": summary["loss"]})  # retention keeps it
        summary.update(promoted=True)
        registry.write_json(
            REGISTRY_BEST,
            {**{k: summary[k] for k in ("checkpoint", "step", "loss", "perplexity", "export", "report", "job",
                                        "evaluation_set")},
             "run_id": context["ti"].run_id, "promoted_at": time.time()},
        )  # fmt: skip
        metrics.incr("checkpoint.promotions", tags=metrics.task_tags(context))
        self.log.info("Promoted %s (loss %.4f, before: %s); export: %s", checkpoint, summary["loss"],
                      summary["best_loss_before"], export_dir)  # fmt: skip
        if self.asset is not None:
            context["outlet_events"][AssetAlias(self.alias_name(self.asset))].add(
                self.asset,
                # what publish_llama reads back from the registry itself (it takes no path from here but the
                # registry's root, which must lie under the storage roots)
                extra={
                    **{
                        k: summary[k]
                        for k in ("checkpoint", "step", "loss", "perplexity", "job", "evaluation_set")
                    },
                    "registry": str(self.registry_uri).rstrip("/"),
                    "entry": self._entry_key,  # where the entry lies below the registry (owners/<o>/<job>)
                },
            )
        return summary

    def on_kill(self) -> None:
        session = getattr(self, "_session", None)
        if session is not None:
            session.stop()


def evaluation_set(manifest: dict[str, Any], batches: int, batch_size: int) -> str:
    """What a held-out loss was measured on, as a registry key: the dataset, the tokenizer, the sequence
    length and the batches. Two losses compare only when this is equal."""
    import hashlib
    import json

    data = (manifest.get("config") or {}).get("data") or {}
    what = [data.get("dataset"), data.get("val_fraction"), data.get("seq_len"), manifest.get("tokenizer"),
            batches, batch_size]  # fmt: skip
    return "eval-" + hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:12]


def _true(value: Any) -> bool:
    return value if isinstance(value, bool) else str(value).strip().lower() in ("1", "true", "yes")

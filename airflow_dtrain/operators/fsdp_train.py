"""FSDPTrainOperator: train a Llama-family model with FSDP2 as a pod group."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator, conf

from airflow_dtrain import jobs_index, metrics
from airflow_dtrain.launchers.factory import get_launcher, launcher_kwargs
from airflow_dtrain.launchers.state_dir import local_state_dir
from airflow_dtrain.links import TrainingDashboardLink, TrainingReportLink
from airflow_dtrain.session.group import GroupFailed, GroupSession
from airflow_dtrain.job.naming import default_checkpoint_uri, group_base_name
from airflow_dtrain.operators.train_arguments import ARGUMENTS, TEMPLATE_FIELDS, operator_doc, signature
from airflow_dtrain.job.spec import JobSpec
from airflow_dtrain.errors import SpecError
from airflow_dtrain.kubernetes.spec import kubernetes_for_run
from airflow_dtrain.templating import check_author_template, is_template
from airflow_dtrain.triggers.fsdp_train import FSDPTrainTrigger
from airflow_dtrain.trust.ownership import check_read, check_job_dir, owner_of
from airflow_dtrain.trust.limits import Limits, limits_for
from trainer.money.capacity import Capacity
from trainer.checkpoint.directory import CheckpointDir
from trainer.base.statsd import format_tags, parse_tags

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_dtrain.aws.prices import SpotPriceFeed

_SIGNATURE = signature(deferrable=conf.getboolean("operators", "default_deferrable", fallback=False))
"""``FSDPTrainOperator.__init__``'s: every argument's default, as Airflow and ``inspect`` see it."""


class TrainingFailed(GroupFailed):
    """The pod group failed (not preempted) or ran out of relaunches."""


_INTRO = """\
Train a Llama-family model with PyTorch FSDP2 as a pod group of ``num_nodes`` × ``procs_per_node``.

Each node runs one torchrun agent. The group's name is derived from
dag_id/run_id/task_id/map_index, so a task restarted while its group runs
reattaches instead of launching a second one. A group that ends preempted is
relaunched from its latest checkpoint, up to ``max_preemptions`` times,
without spending Airflow retries. Returns a summary (XCom): final step,
tokens seen, final loss, latest checkpoint, wall time, preemptions, steps lost
(on Kubernetes also ``placement``: the chosen zone and instance type, and where
each group's pods ran).
"""


class FSDPTrainOperator(BaseOperator):
    __doc__ = operator_doc(_INTRO)

    template_fields: Sequence[str] = TEMPLATE_FIELDS
    template_fields_renderers = {"config": "json", "node_resources": "json", "kubernetes": "json"}
    operator_extra_links = (TrainingDashboardLink(), TrainingReportLink())
    ui_color = "#f0e4ff"

    def __init__(self, **kwargs: Any) -> None:
        """The arguments are the class docstring's (``train_arguments.ARGUMENTS``); the rest are Airflow's."""
        values = {a.name: kwargs.pop(a.name, _SIGNATURE.parameters[a.name].default) for a in ARGUMENTS}
        super().__init__(**kwargs)
        where = f"{type(self).__name__}(task_id={self.task_id!r})"
        check_author_template(f"{where}: kubernetes", values["kubernetes"])
        for name, value in values.items():
            setattr(self, name, value)
        self.limits = Limits.from_value(self.limits)  # the author's; job_spec() narrows the admin's by them
        self._session: GroupSession | None = None
        # Fail in the DAG file, not at run time, for everything that is not templated.
        self.job_spec(skip_templates=True)

    __init__.__signature__ = _SIGNATURE  # type: ignore[attr-defined]

    # -- spec -------------------------------------------------------------------------------
    def job_spec(self, *, skip_templates: bool = False) -> JobSpec:
        """The validated job spec; raises ``SpecError`` naming the field and the value."""
        arguments = {name: getattr(self, name) for name in TEMPLATE_FIELDS}
        if skip_templates:  # None: the declared default
            arguments = {k: (None if is_template(v) else v) for k, v in arguments.items()}
            if arguments["backend"] not in (None, "local") and (
                is_template(self.kubernetes)
                or is_template(self.kubernetes_overrides)
                or is_template(self.checkpoint_uri)
            ):
                # what the backend requires of these is checked once they are rendered
                arguments["backend"] = "local"
        if not arguments.get("checkpoint_uri") and not skip_templates:
            backend = arguments.get("backend") or JobSpec.backend  # None: the declared default
            arguments["checkpoint_uri"] = self._default_checkpoint_uri(backend)
        arguments["resources"] = arguments.pop("node_resources")
        arguments["kubernetes"] = self._kubernetes(arguments.pop("kubernetes_overrides"))
        if not skip_templates:
            tags = getattr(self, "_statsd_tags", "")  # set once the task instance is known (_open_session)
            arguments["config"] = _with_statsd_defaults(arguments.get("config"), tags)
        try:
            spec = JobSpec.from_arguments(**arguments, entrypoint=self.entrypoint)
            limits = limits_for(self.limits)
            if spec.max_runtime_s is None and limits.max_runtime_s is not None:
                spec = dataclasses.replace(spec, max_runtime_s=limits.max_runtime_s)
            limits.check(spec)
            if not skip_templates and spec.backend == "local" and spec.own_program:
                _check_local_program(spec.entrypoint)
            return spec
        except SpecError as err:
            raise SpecError(f"{type(self).__name__}(task_id={self.task_id!r}): {err}") from None

    def _kubernetes(self, overrides: Any) -> Any:
        """The DAG author's pod settings with what the run chose (checked against them)."""
        if is_template(self.kubernetes):
            return None  # checked once rendered
        try:
            return kubernetes_for_run(self.kubernetes, None if is_template(overrides) else overrides)
        except SpecError as err:
            raise SpecError(f"{type(self).__name__}(task_id={self.task_id!r}): {err}") from None

    def _default_checkpoint_uri(self, backend: str | None) -> str:
        if backend != "local":
            raise SpecError(f"checkpoint_uri: required for backend {backend!r}")
        # A job's checkpoints are found again by every run of it; without a job, each task instance has its
        # own.
        return default_checkpoint_uri(local_state_dir(self.local_state_dir).parent, self.job or self._base)

    # -- the session ---------------------------------------------------------------------------
    def _launcher_kwargs(self, backend: str) -> dict[str, Any]:
        return launcher_kwargs(
            backend,
            kubernetes=self._kubernetes(self.kubernetes_overrides),
            kubernetes_conn_id=self.kubernetes_conn_id,
            local_state_dir_setting=self.local_state_dir,
        )

    def _open_session(self, context: Context) -> GroupSession:
        ti = context["ti"]
        self._base = group_base_name(ti.dag_id, ti.run_id, ti.task_id, getattr(ti, "map_index", -1))
        # what tells this task instance's series from every other's, on both sides of statsd
        self._statsd_tags = format_tags(metrics.task_tags(context, job=self.job or self._base))
        spec = self.job_spec()
        owner = self._check_ownership(
            context, spec
        )  # before the session writes a lease or a spend file there
        spec = dataclasses.replace(spec, train=dataclasses.replace(spec.train, owner=owner))  # the manifests'
        self._index = (
            ti.dag_id,
            owner,
            self.job if self.job is not None else self._base,
            (ti.run_id, ti.task_id),
        )
        self._record(
            state="running",
            checkpoint_uri=spec.train.checkpoint.uri,
            steps=spec.train.steps,
            ledger_uri=spec.train.cost.ledger_uri or None,
            budget_usd=spec.train.cost.budget_usd,
            num_nodes=spec.num_nodes,
            min_nodes=spec.min_nodes or spec.num_nodes,
            backend=spec.backend,
            run_id=ti.run_id,
            task_id=ti.task_id,
            error=None,
            ended_at=None,
        )
        launcher = get_launcher(spec.backend, **self._launcher_kwargs(spec.backend))
        self._session = GroupSession(
            launcher,
            self._base,
            spec,
            log=self.log,
            error=TrainingFailed,
            spot_prices=self._spot_prices(spec),
        )
        for link in self.operator_extra_links:  # while it trains; Airflow writes them again when it ends
            ti.xcom_push(key=link.xcom_key, value=link.get_link(self, ti_key=ti))
        return self._session

    def _check_ownership(self, context: Context, spec: JobSpec) -> str:
        """Refuse a checkpoint directory (or a ledger) of another owner or another job; claim a new one."""
        owner, job = owner_of(context), self.job if self.job is not None else self._base
        train = spec.train
        try:
            # a shared ledger (a sweep's) first: it holds its members' directories
            if train.cost.ledger_uri and train.cost.ledger_uri.rstrip("/") != train.checkpoint.uri.rstrip(
                "/"
            ):
                check_job_dir(train.cost.ledger_uri, owner=owner, job=None, what="cost.ledger_uri")
            check_job_dir(train.checkpoint.uri, owner=owner, job=job)
            check_read(train.model.init_from or None, owner=owner, what="init_from")
            check_read(train.data.dataset or None, owner=owner, what="dataset")
        except SpecError as err:
            raise SpecError(f"{type(self).__name__}(task_id={self.task_id!r}): {err}") from None
        return owner

    def _spot_prices(self, spec: JobSpec) -> SpotPriceFeed | None:
        """Where the session reads a spot group's prices in effect (None: nowhere to read them)."""
        if spec.capacity != Capacity.SPOT or not (spec.zone and spec.instance_type and self.aws_conn_id):
            return None
        from airflow_dtrain.aws.prices import SpotPriceFeed

        return SpotPriceFeed(zone=spec.zone, instance_type=spec.instance_type, aws_conn_id=self.aws_conn_id,
                             every_s=self.spot_price_refresh_s)  # fmt: skip

    def _record(self, **fields: Any) -> None:
        """Write the job's entry in the job index (the Training jobs pages: ``airflow_dtrain.ui``)."""
        if getattr(self, "_index", None) is not None:
            dag_id, owner, job, run = self._index
            jobs_index.record(dag_id, owner, job, run=run, **fields)

    # -- execution ----------------------------------------------------------------------------
    def execute(self, context: Context) -> dict[str, Any]:
        with jobs_index.failed_unless_deferred(self._record):
            return self._execute(context)

    def _execute(self, context: Context) -> dict[str, Any]:
        session = self._open_session(context)
        name = session.attach_or_launch()
        context["ti"].xcom_push(key="group", value=name)
        while True:
            if self.deferrable:
                self._defer(session, name)
            relaunched = session.on_end(session.watch(name, poll_interval=self.poll_interval))
            if relaunched is None:
                return self._summary(session, name)
            name = relaunched
            context["ti"].xcom_push(key="group", value=name)

    def _defer(self, session: GroupSession, name: str) -> None:
        self.defer(
            trigger=FSDPTrainTrigger(
                name=name,
                backend=session.spec.backend,
                launcher_kwargs=self._launcher_kwargs(session.spec.backend),
                poll_interval=self.poll_interval,
                recovering_since=session.recovering_since,
                status=(line := session.status_line()) and line.to_dict(),
                tags=session.tags,
                prices=session.price_watch(),
                ledger_uri=session.spend_uri(),
                deadline=session.deadline_terms(),
            ),
            method_name="execute_complete",
        )

    def execute_complete(self, context: Context, event: dict[str, Any], **_: Any) -> dict[str, Any]:
        with jobs_index.failed_unless_deferred(self._record):
            return self._execute_complete(context, event)

    def _execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        session = self._open_session(context)
        session.current = event.get("name")
        relaunched = session.on_end(event)
        if relaunched is None:
            return self._summary(session, event["name"])
        context["ti"].xcom_push(key="group", value=relaunched)
        self._defer(session, relaunched)
        raise AssertionError("unreachable: defer() raises")

    def _summary(self, session: GroupSession, name: str) -> dict[str, Any]:
        spec = session.spec
        progress = read_progress(spec.train.checkpoint.uri)
        names = session.groups()
        at_cap = session.stopped_at_budget
        if at_cap is None and (
            progress.get("status") != "completed" or progress.get("step") != spec.train.steps
        ):
            raise TrainingFailed(
                f"group {name} exited 0 but its progress says status={progress.get('status')!r} "
                f"step={progress.get('step')} of {spec.train.steps}"
            )
        summary = {
            "group": name,
            "final_step": progress.get("step", 0),  # 0: stopped at the cap before the trainer reported
            "tokens_seen": progress.get("tokens_seen"),
            "final_loss": progress.get("loss"),
            "latest_checkpoint": progress.get("latest_checkpoint"),
            "wall_time_s": progress.get("wall_time_s"),
            "preemptions": session.preemptions(names),
            "relaunches": len(names) - 1,
            "steps_lost": progress.get("steps_lost", 0),
            "startup_s": progress.get("startup_s", 0.0),  # every attempt's start to its first step, summed
            # the torch the last attempt trained on and every private-hook fallback in force there
            "torch": progress.get("torch"),
            **self._cost(spec),
        }
        if spec.backend == "kubernetes":
            # what the budget decision chose, and where each group's pods ran (node, zone, instance, capacity)
            chosen = {"zone": spec.zone, "instance_type": spec.instance_type, "capacity": spec.capacity.value}
            summary["placement"] = {"chosen": chosen, "groups": session.placement(names)}
        if at_cap is not None:
            summary.update(
                stopped="budget",
                budget_usd=spec.train.cost.budget_usd,
                budget_stop={**(progress.get("budget") or {}), **at_cap},
            )
        summary_path = write_summary(spec.train.checkpoint.uri, summary)
        self._record(state="finished" if at_cap is None else "stopped at cap", ended_at=time.time())
        if at_cap is not None:
            self.log.warning(
                "Training stopped at step %s of %d to stay within its $%.2f budget: $%.4f spent; checkpoint "
                "%s. "
                "Raise budget_usd and run the job again to go on from there. Summary: %s (in %s)",
                progress.get("step"),
                spec.train.steps,
                spec.train.cost.budget_usd,
                summary.get("dollars", 0.0),
                progress.get("latest_checkpoint"),
                json.dumps(summary),
                summary_path,
            )
            return summary
        self.log.info("Training finished: %s (summary in %s)", json.dumps(summary), summary_path)
        return summary

    def _cost(self, spec: JobSpec) -> dict[str, Any]:
        """The job's spend so far, from the ledger in the latest checkpoint manifest."""

        try:
            ledger_uri = spec.train.cost.ledger_uri
            ledger = CheckpointDir(spec.train.checkpoint.uri).ledger(
                CheckpointDir(ledger_uri) if ledger_uri else None
            )
        except Exception:  # the summary must not fail on a ledger it cannot read
            self.log.warning(
                "Could not read the cost ledger under %s", spec.train.checkpoint.uri, exc_info=True
            )
            return {}
        tags = metrics.job_tags(spec)
        metrics.gauge("cost.dollars", ledger.total_dollars, tags=tags)
        metrics.gauge("cost.gpu_hours", ledger.gpu_hours, tags=tags)
        return {"dollars": ledger.total_dollars, "gpu_hours": ledger.gpu_hours}

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """OpenLineage (called only where its provider is installed): the token store and the ``init_from``
        model in, the checkpoint directory out (``airflow_dtrain.lineage``)."""
        from airflow_dtrain.lineage import training_lineage

        if self._session is not None:
            return training_lineage(self._session.spec)
        ti = task_instance  # not run in this process: the spec the task builds
        self._base = group_base_name(ti.dag_id, ti.run_id, ti.task_id, getattr(ti, "map_index", -1))
        return training_lineage(self.job_spec())

    def on_kill(self) -> None:
        if self._session is not None:
            self._session.stop(grace_period_s=self.stop_grace_period_s)


def _check_local_program(entrypoint: tuple[str, ...]) -> None:
    """The local backend runs a script from this machine: it must be there (a module is the interpreter's to
    find)."""
    if entrypoint[0] != "-m" and not os.path.isfile(entrypoint[0]):
        raise SpecError(
            f"entrypoint: {entrypoint[0]!r} is not a file on this machine (the local backend runs it here)"
        )


def _with_statsd_defaults(config: dict[str, Any] | None, tags: str = "") -> dict[str, Any] | None:
    """The trainer reports to the provider's statsd (``[dtrain] statsd_*``) unless told otherwise, and
    tags every metric with ``tags`` (the task instance and the job: ``metrics.statsd_tags``; tags of the
    config's own are kept beside them)."""
    host = conf.get("dtrain", "statsd_host", fallback="")
    if not host and not tags:
        return config
    config = dict(config or {})
    metrics_section = dict(config.get("metrics") or {})
    if tags:
        own = config.pop("metrics.statsd_tags", None) or metrics_section.get("statsd_tags") or ""
        metrics_section["statsd_tags"] = format_tags({**parse_tags(str(own)), **parse_tags(tags)})
    if host and not ("metrics.statsd_host" in config or metrics_section.get("statsd_host")):
        metrics_section.update(
            statsd_host=host,
            statsd_port=conf.getint("dtrain", "statsd_port", fallback=8125),
            statsd_prefix=conf.get("dtrain", "statsd_prefix", fallback="dtrain") or "dtrain",
        )
    config["metrics"] = metrics_section
    return config


def read_progress(checkpoint_uri: str) -> dict[str, Any]:
    """The trainer's ``progress.json`` under ``checkpoint_uri`` ({} when there is none yet)."""
    return CheckpointDir(checkpoint_uri).progress() if checkpoint_uri else {}


def write_summary(checkpoint_uri: str, summary: dict[str, Any]) -> str:
    """Write the run summary as ``summary.json`` next to the checkpoints; returns its path."""
    return CheckpointDir(checkpoint_uri).write_summary(summary)

"""SpotInterruptionSensor: on an interruption notice for a training group, checkpoint now."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseSensorOperator, PokeReturnValue, conf
from airflow.sdk.exceptions import AirflowSkipException

from airflow_dtrain import metrics
from airflow_dtrain.aws.sqs import check_queue, queue_patterns
from airflow_dtrain.errors import SpecError
from airflow_dtrain.launchers.factory import launcher_kwargs
from airflow_dtrain.operators.inputs import build, names
from airflow_dtrain.spot.events import KINDS
from airflow_dtrain.spot.interruptions import DEFAULT_KINDS
from airflow_dtrain.spot.members import InstanceSource, StaticInstances
from airflow_dtrain.templating import check_author_template, is_template
from airflow_dtrain.triggers.spot_interruption import SpotInterruptionTrigger
from trainer.config.fields import check, setting

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_dtrain.kubernetes.spec import KubernetesSpec


@dataclass(frozen=True, kw_only=True)
class SpotInterruptionInputs:
    """The sensor's numbers, declared once (neither is templated: checked when the DAG is parsed)."""

    follow_relaunches_s: float = setting(
        0.0, ge=0, help="Seconds to keep watching for a relaunched group after one ends (0: stop then)."
    )
    wait_time_seconds: int = setting(
        5, ge=0, le=20, rule="must be an integer 0-20", help="SQS long-poll seconds per look (0-20)."
    )

    def __post_init__(self) -> None:
        check(self, "")


_INPUTS = names(SpotInterruptionInputs)


class SpotInterruptionSensor(BaseSensorOperator):
    """
    Wait for a spot interruption warning or rebalance recommendation for a group's instances.

    Notices come from the SQS queue that EventBridge feeds (the queue aws-node-termination-handler
    and Karpenter use; raw events or SNS envelopes) and, with a source that can see nodes
    (``KubernetesGroupNodes``), from the taints those tools put on the group's nodes. On a
    notice for one of the group's instances, the group is asked to checkpoint now (SIGUSR1 to
    every trainer on the local backend: they save at the next step boundary and carry on),
    the SQS message is deleted, and the sensor succeeds with the record of the event
    (XCom return value: ``interrupted``, ``group``, ``checkpoint_requested``, ``notices``).
    Notices for other instances are released for other consumers; malformed messages are
    logged and skipped. When the group ends before any notice, the sensor succeeds with
    ``interrupted: False``.

    Which instances belong to the group comes from ``instance_source`` (see
    ``airflow_dtrain.spot.members``); ``instance_ids`` / ``node_names`` are shorthand for a
    ``StaticInstances`` source. With none of them, a ``kubernetes`` group is watched through
    ``KubernetesGroupNodes`` (the nodes its pods run on, in ``namespace``), and a ``local`` group
    has no instances to watch: the task is skipped (so one DAG serves both backends).

    What a run may point the sensor at is bounded like the train task's pods (a trigger form can set
    the queue and the namespace): before any AWS call, the queue must be on the platform admin's
    ``[dtrain] interruption_queues`` (and on ``interruption_queues`` if given; see
    ``airflow_dtrain.aws.sqs``); before any Kubernetes call, the namespace must be one the DAG's author
    allows (``kubernetes``: its ``namespace`` or ``allowed_namespaces``) and one the admin allows (the
    connection's ``dtrain_policy.allowed_namespaces``). Either is refused with an error naming the field.

    :param group: the group's name, e.g. ``"{{ ti.xcom_pull(task_ids='train', key='group') }}"``; a
        prefix of relaunched groups' names also works (the newest one is watched). (templated)
    :param train_task_id: instead of ``group``: watch the groups of this FSDPTrainOperator task of
        the same DAG run, e.g. one running beside the sensor. The watch then follows the task's
        relaunches: every notice is acted on and the sensor succeeds once training is over, with
        all of them (see ``follow_relaunches_s``).
    :param follow_relaunches_s: keep watching this long after the newest group ended (or, at the
        start, before any exists) for a relaunch. Default: 600 with ``train_task_id``, else 0
        (the first notice, or the group's end, ends the watch).
    :param instance_ids: EC2 instance ids of the group. (templated)
    :param node_names: Kubernetes node names of the group. (templated)
    :param instance_source: where the group's instances come from (instead of the two above).
    :param sqs_queue_url: the SQS queue EventBridge sends interruption events to; it must be on the admin's
        ``[dtrain] interruption_queues``. (templated)
    :param interruption_queues: the queues this task may read, set by the DAG's author (not templated):
        queue URLs, or account prefixes ending in ``/``; narrows the admin's list, never widens it.
        None: the admin's.
    :param kinds: which notices count: ``spot-interruption``, ``rebalance-recommendation``,
        ``scheduled-maintenance``, ``disruption``. Default: all but ``scheduled-maintenance``
        (``disruption`` is how Karpenter marks a node it is about to drain, spot reclaims included).
    :param backend: the group's launcher backend, ``local`` or ``kubernetes``. (templated)
    :param namespace: the group's namespace (``kubernetes``), as a run chooses it: ``kubernetes``'s
        ``namespace`` or one of its ``allowed_namespaces``. Written in the DAG without ``kubernetes`` (not a
        template), it is the author's own. Default: ``kubernetes``'s, else the connection's. (templated)
    :param kubernetes: the DAG author's pod settings, as given to ``FSDPTrainOperator(kubernetes=...)``
        (``KubernetesSpec``); only ``namespace`` and ``allowed_namespaces`` are read. A template here may not
        read ``params`` or ``dag_run``. (templated)
    :param kubernetes_conn_id: the Kubernetes connection (``kubernetes``).
    :param local_state_dir: state directory of the local backend (default: ``[dtrain] local_state_dir``).
    :param wait_time_seconds: SQS long-poll seconds per look (0-20).
    :param aws_conn_id: the Airflow AWS connection.
    :param region_name: the queue's region (default: the connection's).
    :param deferrable: watch from the triggerer, freeing the worker slot. Following relaunches
        needs a watch that remembers what it acted on: deferrable or ``mode="poke"``, not ``"reschedule"``.
    """

    template_fields: Sequence[str] = (
        "group", "instance_ids", "node_names", "sqs_queue_url", "backend", "namespace", "kubernetes",
    )  # fmt: skip
    ui_color = "#ffe0cc"

    def __init__(
        self,
        *,
        group: str | None = None,
        train_task_id: str | None = None,
        follow_relaunches_s: float | None = None,
        instance_ids: list[str] | None = None,
        node_names: list[str] | None = None,
        instance_source: InstanceSource | None = None,
        sqs_queue_url: str | None = None,
        interruption_queues: Sequence[str] | None = None,
        kinds: Sequence[str] = DEFAULT_KINDS,
        backend: str = "local",
        namespace: str | None = None,
        kubernetes: dict[str, Any] | KubernetesSpec | None = None,
        kubernetes_conn_id: str = "kubernetes_default",
        local_state_dir: str | None = None,
        wait_time_seconds: int = 5,
        aws_conn_id: str | None = "aws_default",
        region_name: str | None = None,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("poke_interval", 5)  # a spot warning gives two minutes
        super().__init__(**kwargs)
        self.group = group
        self.train_task_id = train_task_id
        self.follow_relaunches_s = (
            (600.0 if train_task_id else 0.0) if follow_relaunches_s is None else follow_relaunches_s
        )
        self._watch = None  # kept across pokes (poke mode): what was handled, when groups ended
        self.instance_ids = instance_ids
        self.node_names = node_names
        self.instance_source = instance_source
        self.sqs_queue_url = sqs_queue_url
        self._queues = interruption_queues
        # for errors: which trigger-form field the queue came from
        self._queue_template = sqs_queue_url if is_template(sqs_queue_url) else None
        self.kinds = tuple(kinds)
        self.backend = backend
        self.namespace = namespace
        if kubernetes is None and isinstance(namespace, str) and namespace and not is_template(namespace):
            kubernetes = {"namespace": namespace}  # written in the DAG: the author's own
        self.kubernetes = kubernetes
        self.kubernetes_conn_id = kubernetes_conn_id
        self.local_state_dir = local_state_dir
        self.wait_time_seconds = wait_time_seconds
        self.aws_conn_id = aws_conn_id
        self.region_name = region_name
        self.deferrable = deferrable
        self._check_arguments()

    def _check_arguments(self) -> None:
        """Fail in the DAG file for what is wrong before any template renders."""
        prefix = f"{type(self).__name__}(task_id={self.task_id!r}): "
        kinds, instance_source, group, train_task_id = (
            self.kinds,
            self.instance_source,
            self.group,
            self.train_task_id,
        )
        instance_ids, node_names, deferrable = self.instance_ids, self.node_names, self.deferrable
        kubernetes, namespace, backend = self.kubernetes, self.namespace, self.backend
        build(SpotInterruptionInputs, {n: getattr(self, n) for n in _INPUTS}, prefix.rstrip(": "))
        unknown = [k for k in self.kinds if k not in KINDS]
        if not self.kinds or unknown:
            raise ValueError(f"{prefix}kinds: expected some of {list(KINDS)}, got {list(kinds)!r}")
        if instance_source is not None and (instance_ids or node_names):
            raise ValueError(f"{prefix}instance_source: give it or instance_ids/node_names, not both")
        if instance_source is not None and not isinstance(instance_source, InstanceSource):
            raise ValueError(f"{prefix}instance_source: expected an InstanceSource, got {instance_source!r}")
        if (group is None) == (train_task_id is None):
            raise ValueError(f"{prefix}group / train_task_id: give one, got {group!r} / {train_task_id!r}")
        if self.mode == "reschedule" and not deferrable and self.follow_relaunches_s > 0:
            # Each reschedule starts a fresh watch: a taint that stays (two minutes, for a spot
            # warning) would ask for a checkpoint at every poke, and relaunch grace would restart.
            raise ValueError(
                f"{prefix}mode: 'reschedule' forgets between pokes which notices were acted on, so it "
                f"cannot follow relaunches (follow_relaunches_s={self.follow_relaunches_s}); use "
                "deferrable=True (no worker slot held) or mode='poke'"
            )
        try:
            check_author_template("kubernetes", kubernetes)
            self.interruption_queues = None
            if self._queues is not None:
                self.interruption_queues = queue_patterns("interruption_queues", self._queues)
            if not is_template(kubernetes) and not is_template(namespace):
                self._kubernetes_spec()  # fail in the DAG file: a bad setting, a namespace outside it
        except SpecError as err:
            raise SpecError(f"{prefix}{err}") from None
        if not is_template(backend) and not is_template(self.sqs_queue_url):
            self._check_sources()

    def _check_sources(self) -> None:
        """Something to watch, and a way to hear of notices (once backend and queue are known)."""
        prefix = f"{type(self).__name__}(task_id={self.task_id!r}): "
        if self.backend not in ("local", "kubernetes"):
            raise ValueError(f"{prefix}backend: expected 'local' or 'kubernetes', got {self.backend!r}")
        if self.backend == "local" and not self._given_instances():
            raise ValueError(
                f"{prefix}instance_ids / node_names / instance_source: give one for the local backend, "
                "got none"
            )
        if self.instance_source is not None:  # a source of its own: does it read node taints?
            taints = type(self.instance_source).node_notices is not InstanceSource.node_notices
        else:  # instance ids/node names: no; nothing given: a Kubernetes group's nodes, yes
            taints = self.backend == "kubernetes" and not self._given_instances()
        if not _given(self.sqs_queue_url) and not taints:
            raise ValueError(
                f"{prefix}sqs_queue_url: required unless the instances come from node taints "
                "(instance_source=KubernetesGroupNodes, or backend='kubernetes' without instance_ids)"
            )

    def _given_instances(self) -> bool:
        return self.instance_source is not None or bool(self.instance_ids) or bool(self.node_names)

    def _source(self, namespace: str | None) -> InstanceSource:
        if self.instance_source is not None:
            return self.instance_source
        if self.backend == "kubernetes" and not self._given_instances():
            from airflow_dtrain.kubernetes.nodes import KubernetesGroupNodes

            return KubernetesGroupNodes(namespace=namespace, kubernetes_conn_id=self.kubernetes_conn_id)
        ids, names = self.instance_ids or [], self.node_names or []
        for field, value in (("instance_ids", ids), ("node_names", names)):
            if isinstance(value, str) or not all(isinstance(v, str) and v for v in value):
                raise ValueError(
                    f"{type(self).__name__}(task_id={self.task_id!r}): {field}: expected a list of names, "
                    f"got {value!r}"
                )
        return StaticInstances(instance_ids=ids, node_names=names)

    def _kubernetes_spec(self) -> KubernetesSpec:
        """The DAG author's pod settings with the namespace this task was given, checked against them the
        way the train task checks a run's choice (``KubernetesSpec.choose``)."""
        from airflow_dtrain.kubernetes.spec import KubernetesSpec

        value = self.kubernetes
        if isinstance(value, dict):  # the older capacity_type spelling is the train task's, not read here
            value = {k: v for k, v in value.items() if k != "capacity_type"}
        chosen = _given(self.namespace)
        return KubernetesSpec.from_value(value).choose({"namespace": chosen} if chosen else None)

    def _namespace(self) -> str | None:
        """The group's namespace on the ``kubernetes`` backend (else None), within the DAG author's bounds and
        the admin's (``dtrain_policy``, as the launcher checks it): checked before any Kubernetes call."""
        if self.backend != "kubernetes":
            return None
        from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook

        from airflow_dtrain.kubernetes.policy import KubernetesPolicy

        spec = self._kubernetes_spec()
        hook = KubernetesHook(conn_id=self.kubernetes_conn_id)
        namespace = spec.namespace or hook.get_namespace() or "default"
        KubernetesPolicy.from_extra(hook.conn_extras).check_namespaces(namespace, spec.allowed_namespaces)
        return namespace

    def _group(self, context: Context) -> str:
        if self.train_task_id is not None:
            from airflow_dtrain.job.naming import group_base_name

            ti = context["ti"]
            return group_base_name(ti.dag_id, ti.run_id, self.train_task_id, getattr(ti, "map_index", -1))
        if not isinstance(self.group, str) or not self.group or self.group == "None":
            raise ValueError(
                f"{type(self).__name__}(task_id={self.task_id!r}): group: expected a group name, got "
                f"{self.group!r}"
            )
        return self.group

    def _watch_kwargs(self, context: Context) -> dict[str, Any]:
        """The watch's arguments, once the namespace and the queue are checked (nothing is called before)."""
        queue = _given(self.sqs_queue_url)
        field = f"sqs_queue_url (from {self._queue_template!r})" if self._queue_template else "sqs_queue_url"
        try:
            namespace = self._namespace()
            check_queue(queue, field=field, allowed=self.interruption_queues)
        except SpecError as err:
            raise SpecError(f"{type(self).__name__}(task_id={self.task_id!r}): {err}") from None
        return {
            "group": self._group(context),
            "source": self._source(namespace),
            "backend": self.backend,
            "launcher_kwargs": launcher_kwargs(
                self.backend,
                kubernetes={"namespace": namespace},
                kubernetes_conn_id=self.kubernetes_conn_id,
                local_state_dir_setting=self.local_state_dir,
            ),
            "sqs_queue_url": queue,
            "aws_conn_id": self.aws_conn_id,
            "region_name": self.region_name,
            "kinds": list(self.kinds),
            "wait_time_seconds": self.wait_time_seconds,
            "follow_relaunches_s": self.follow_relaunches_s,
            "tags": metrics.task_tags(context),
        }

    def execute(self, context: Context) -> Any:
        if self.backend == "local" and not self._given_instances():
            raise AirflowSkipException("local backend: the group runs on this machine, no instances to watch")
        self._check_sources()  # the rendered backend and queue
        watch_kwargs = self._watch_kwargs(context)
        if self.deferrable:
            result = self.poke(context)
            if result:
                return result.xcom_value
            watch_kwargs["source"] = list(watch_kwargs["source"].serialize())
            self.defer(
                trigger=SpotInterruptionTrigger(watch_kwargs=watch_kwargs, poll_interval=self.poke_interval),
                method_name="execute_complete",
                timeout=timedelta(seconds=self.timeout) if self.timeout else None,
            )
        return super().execute(context)

    def poke(self, context: Context) -> PokeReturnValue:
        from airflow_dtrain.interruption_watch import InterruptionWatch

        if self._watch is None:
            self._watch = InterruptionWatch(**self._watch_kwargs(context))
        record = self._watch.look()
        if record is None:
            return PokeReturnValue(is_done=False)
        self._report(record)
        return PokeReturnValue(is_done=True, xcom_value=record)

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        if event.get("status") != "success":
            raise RuntimeError(f"{type(self).__name__}(task_id={self.task_id!r}): {event.get('message')}")
        record = {k: v for k, v in event.items() if k != "status"}
        self._report(record)
        return record

    def _report(self, record: dict[str, Any]) -> None:
        if not record.get("interrupted"):
            self.log.info(
                "Group %s ended (%s) without an interruption notice", record["group"], record["group_state"]
            )
            return
        for notice in record["notices"]:
            self.log.warning(
                "%s for %s (from %s, %s): group %s asked to checkpoint now (%d process(es))",
                notice["kind"], notice.get("instance_id") or notice.get("node_name"), notice["source"],
                notice.get("time"), record["group"], record["checkpoint_requested"],
            )  # fmt: skip


def _given(value: Any) -> str | None:
    """A queue URL or namespace, None for none (a template that rendered ``None`` or nothing included)."""
    return value if isinstance(value, str) and value.strip() not in ("", "None") else None

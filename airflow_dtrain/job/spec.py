"""The job spec: what to train (the trainer's own config) and where (the pod group).

A ``JobSpec`` is the one typed contract of a training job. It is built and validated once,
where it enters -- ``FSDPTrainOperator`` (at construction, or after its templates are
rendered), the render CLI -- and then handed on as this frozen object: to the group
session, the launcher, the Kubernetes objects and the trainer's command line. The training
half is the trainer's ``TrainConfig`` itself (stdlib-only, so importing it here costs
nothing at parse time); the group half (nodes, processes, backend, capacity, price,
resources) is declared with the same ``trainer.config.fields.setting``, so validation messages,
the trigger form (``airflow_dtrain.params``) and the README table come from one place.
The group's capacity, price and GPUs are what the trainer's cost ledger records.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from trainer.money.capacity import Capacity
from trainer.config.job_config import TrainConfig
from trainer.config.fields import ConfigError, check, setting

from airflow_dtrain.job import arguments
from airflow_dtrain.job.checks import check_elastic, check_kubernetes, uneven_batch
from airflow_dtrain.job.entrypoint import TRAINER_MODULE, parse_entrypoint
from airflow_dtrain.errors import SpecError, checked
from airflow_dtrain.kubernetes.spec import KubernetesSpec
from airflow_dtrain.job.resources import Resources
from airflow_dtrain.trust.limits import BACKENDS

GROUP = "Group"
"""Trigger-form section of the group's shape."""
KUBERNETES = "Kubernetes"
"""Trigger-form section of what only the kubernetes backend uses."""

_LABEL_VALUE = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"


@dataclass(frozen=True, kw_only=True)
class JobSpec:
    """One training job: the trainer's config plus the shape of its pod group."""

    train: TrainConfig = field(default_factory=TrainConfig)
    num_nodes: int = setting(
        1,
        ge=1,
        arg="num_nodes",
        section=GROUP,
        title="Nodes",
        help="Nodes in the group; each runs one torchrun agent (on Kubernetes: one pod).",
    )
    min_nodes: int | None = setting(
        None,
        ge=1,
        arg="min_nodes",
        section=GROUP,
        title="Min nodes",
        help="The fewest nodes the group trains on (an elastic group): it starts when that many can be had, "
        "goes on without a lost node until its replacement joins (which compiles first), and grows back to "
        "num_nodes at a checkpoint. The global batch stays the same. Empty: num_nodes (all or nothing).",
    )
    replace_timeout_s: float = setting(
        30.0,
        gt=0,
        arg="replace_timeout_s",
        section=GROUP,
        title="Replace timeout (s)",
        help="The longest an elastic group's survivors wait, at a lost node, for a replacement the platform "
        "runs (a local group's capacity) before they go on without it. Their round closes once every one of "
        "them is back, and no replacement is awaited where nodes warm up before they join (the default: "
        "warm_before_join) or on Kubernetes: a replacement joins when it is ready, with a resize of "
        "its own that costs the survivors seconds.",
    )
    min_nodes_timeout_s: float = setting(
        600.0,
        gt=0,
        arg="min_nodes_timeout_s",
        section=GROUP,
        title="Min nodes timeout (s)",
        help="An elastic group's wait for min_nodes nodes to join; after it the group ends as preempted and "
        "the job decides again (relaunch, fall back or stop).",
    )
    keep_workers: bool = setting(
        True,
        arg="keep_workers",
        help="An elastic group's survivors keep their training processes across a resize: no new "
        "interpreter, no compile again (trainer/elastic/worker_host.py). False: new processes at every "
        "resize, as torchrun starts them.",
    )
    warm_before_join: bool = setting(
        True,
        arg="warm_before_join",
        help="A node that joins an elastic group builds its model and compiles before it joins, while its "
        "peers train (trainer/elastic/warm_join.py). False: it joins at once and compiles in the group's "
        "first step.",
    )
    resize_poll_s: float = setting(
        0.1,
        ge=0.01,  # a group's nodes poll its store: not faster than a hundred times a second
        le=10,
        arg="resize_poll_s",
        help="Seconds between two looks of a node at an elastic group's resize round (torch's: 1).",
    )
    fork_workers: bool = setting(
        True,
        arg="fork_workers",
        help="Each node forks its training processes from a process that has imported torch and the "
        "trainer already (trainer/elastic/workers.py). False: each starts as a new interpreter, as torchrun "
        "starts it: for a library that does not survive a fork.",
    )
    procs_per_node: int = setting(
        1,
        ge=1,
        arg="procs_per_node",
        section=GROUP,
        title="Processes per node",
        help="Training processes per node (one per GPU on GPU nodes).",
    )
    backend: str = setting(
        "local",
        choices=BACKENDS,
        rule="backend",
        arg="backend",
        section=GROUP,
        help="Where the group runs: local (processes on this machine) or kubernetes (an Indexed Job).",
    )
    capacity: Capacity = setting(
        Capacity.ANY,
        arg="capacity",
        help="Capacity the group runs on and is billed as: spot, on_demand or any (on Kubernetes: the nodes "
        "its pods select).",
    )
    price_per_node_hour: float = setting(
        0.0,
        ge=0,
        arg="price_per_node_hour",
        help="Dollars per node-hour of that capacity, for the cost ledger (0: not billed).",
    )
    price_ceiling_per_node_hour: float = setting(
        0.0,
        ge=0,
        arg="price_ceiling_per_node_hour",
        help="The most a node-hour can cost while the group runs (spot: your max price, else on-demand); the "
        "cap's projection uses it. 0: price_per_node_hour.",
    )
    zone: str | None = setting(
        None,
        arg="zone",
        pattern=_LABEL_VALUE,
        rule="not an availability zone (a Kubernetes label value)",
        help="The availability zone the price was chosen for (the budget decision's offer, e.g. us-east-1a): "
        "on Kubernetes the pods require nodes labelled topology.kubernetes.io/zone with it. Empty: any zone.",
    )
    instance_type: str | None = setting(
        None,
        arg="instance_type",
        pattern=_LABEL_VALUE,
        rule="not an instance type (a Kubernetes label value)",
        help="The instance type the price was chosen for (e.g. p5.48xlarge): on Kubernetes the pods require "
        "nodes labelled node.kubernetes.io/instance-type with it. Empty: any type.",
    )
    resources: Resources = field(default_factory=Resources)
    max_preemptions: int = setting(
        3,
        ge=0,
        arg="max_preemptions",
        section=GROUP,
        title="Max preemptions",
        help="How many times a preempted group is relaunched from its checkpoint.",
    )
    max_failures: int = setting(
        2,
        ge=0,
        arg="max_failures",
        section=GROUP,
        title="Max failures",
        help="How many times a group that lost a training process (OOM killer, kill -9) is relaunched from "
        "its last checkpoint; counted apart from max_preemptions.",
    )
    max_runtime_s: int | None = setting(
        None,
        ge=1,
        arg="max_runtime_s",
        help="Longest one group may run, with or without a budget (on Kubernetes the Job's "
        "activeDeadlineSeconds, locally the supervisor's deadline; the earlier of this and the budget's). "
        "Empty: the limits' max_runtime_s (the platform's default: a day).",
    )
    kubernetes: KubernetesSpec = setting(
        factory=KubernetesSpec,
        cli=False,
        help="Pods of the kubernetes backend: image, namespace, volumes, secret_env, kueue_queue, ... "
        "(airflow_dtrain.kubernetes.spec.KubernetesSpec), set by the DAG's author; a trigger form only "
        "chooses within them (airflow_dtrain.params.RunSettings.kubernetes).",
    )
    entrypoint: tuple[str, ...] = setting(
        (),
        cli=False,
        help="What each process runs instead of the bundled trainer (-m trainer --config <the train "
        "config>): "
        "your own script and its arguments ('train.py', '--lr', '3e-4'), a module ('-m', 'my_pkg.train', "
        "...), "
        "or another module of the bundled trainer ('trainer.evaluate', '--checkpoint-uri', uri). Set by the "
        "DAG author only (an operator argument, never templated, never a trigger-form param).",
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "entrypoint", parse_entrypoint(self.entrypoint))
        for name in ("zone", "instance_type"):  # a template that rendered nothing: no placement
            if getattr(self, name) in ("", "None"):
                object.__setattr__(self, name, None)
        checked(check, self, "")
        if self.backend == "local" and self.own_program and self.entrypoint[0] != "-m":
            # what the local backend runs is on this machine: one spelling, absolute
            object.__setattr__(
                self, "entrypoint", (os.path.abspath(self.entrypoint[0]), *self.entrypoint[1:])
            )
        if self.resources.gpus_per_node and self.resources.gpus_per_node != self.procs_per_node:
            raise SpecError(
                f"procs_per_node: {self.procs_per_node} processes per node, but "
                f"resources.gpus_per_node is {self.resources.gpus_per_node}: run one process per GPU"
            )
        if self.elastic and not self.own_program:  # every size it may train at splits the batch, unevenly
            object.__setattr__(self, "train", uneven_batch(self.train))
        try:
            if not self.own_program:  # a program of your own owns its config (and its batch arithmetic)
                self.train.validate_world_size(self.world_size)
        except ConfigError as err:
            raise SpecError(
                f"{err} (world size = num_nodes {self.num_nodes} × procs_per_node {self.procs_per_node})"
            ) from None
        check_elastic(self)
        check_kubernetes(self)
        # One spelling of a local checkpoint directory for every reader: absolute, no "..".
        uri = self.train.checkpoint.uri
        if uri and ("://" not in uri or uri.startswith("file://")):
            normal = os.path.abspath(uri.removeprefix("file://"))
            if normal != uri:
                checkpoint = dataclasses.replace(self.train.checkpoint, uri=normal)
                object.__setattr__(self, "train", dataclasses.replace(self.train, checkpoint=checkpoint))
        # The ledger records what the group is: its capacity, its price, its GPUs; and the job's cap.
        cost = dataclasses.replace(
            self.train.cost,
            capacity_type=self.capacity,
            price_per_node_hour=self.price_per_node_hour,
            price_ceiling_per_node_hour=self.price_ceiling_per_node_hour,
            gpus_per_node=self.resources.gpus_per_node,
        )
        if self.train.cost != cost:
            object.__setattr__(self, "train", dataclasses.replace(self.train, cost=cost))

    @property
    def budget_usd(self) -> float | None:
        """The job's dollar cap (``train.cost.budget_usd``, declared there once); None: no budget."""
        return self.train.cost.budget_usd

    @property
    def world_size(self) -> int:
        return self.num_nodes * self.procs_per_node

    @property
    def elastic(self) -> bool:
        """True when the group may train on fewer than ``num_nodes`` nodes (``min_nodes``)."""
        return self.min_nodes is not None and self.min_nodes < self.num_nodes

    @property
    def fewest_nodes(self) -> int:
        """The fewest nodes the group trains on: ``min_nodes``, else ``num_nodes``."""
        return self.min_nodes if self.elastic else self.num_nodes

    @property
    def own_program(self) -> bool:
        """True when every process runs a program of your own (a script, or a module outside the bundled
        ``trainer``): the trainer's config is then only where the job's settings come from (the DTRAIN_*
        environment, see trainer/contract.py), and the trainer's own checks of it are skipped."""
        head = self.entrypoint[0] if self.entrypoint else "trainer"
        return head == "-m" or not TRAINER_MODULE.fullmatch(head)

    def entrypoint_argv(self, config_path: str, trainer_args: Sequence[str] = ()) -> list[str]:
        """What torchrun runs after its own flags, on every process.

        :param config_path: the trainer's config file as the node sees it (the bundled trainer reads it).
        :param trainer_args: extra flags of the bundled trainer (``--set k=v``); only it gets them.
        """
        if not self.entrypoint or self.entrypoint[0] == "trainer":
            return ["-m", "trainer", "--config", config_path, *self.entrypoint[1:], *trainer_args]
        if self.own_program:
            return list(self.entrypoint)  # ("-m", module, ...) or (script.py, ...): as torchrun takes them
        return ["-m", *self.entrypoint]  # another module of the bundled trainer, e.g. trainer.evaluate

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON values (for the render CLI and for humans); ``from_dict`` reads it back."""
        plain = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return {
            **plain,
            "train": self.train.to_dict(),
            "capacity": self.capacity.value,
            "budget_usd": self.budget_usd,
            "resources": self.resources.to_dict(),
            "kubernetes": self.kubernetes.to_dict(),
            "entrypoint": list(self.entrypoint),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobSpec:
        """What ``to_dict`` gave, read back (``airflow_dtrain.job.arguments.spec_from_dict``)."""
        return arguments.spec_from_dict(cls, data)

    @classmethod
    def from_arguments(cls, **given: Any) -> JobSpec:
        """A spec from operator-style arguments (``flavor=``, ``steps=``, ``num_nodes=``, ``config=``, ...),
        rendered templates coerced (``airflow_dtrain.job.arguments.spec_from_arguments``)."""
        return arguments.spec_from_arguments(cls, **given)

"""FSDPTrainOperator's keyword arguments: generated from the job spec's declarations, plus its own few.

Every field of ``JobSpec`` (its train config included) declared with an operator argument (``arg=`` of
``trainer.config.fields.setting``) is an argument of the operator: templated, default None ("the declared
default, or ``config``'s"), documented by the field's help text. The operator's own arguments -- what is not a
field of the spec (connections, polling, the author's pod settings and limits) -- are the table below. From
the two come the operator's ``__init__`` signature (what Airflow's ``default_args`` are applied by),
``template_fields`` and the ``:param`` list of its docstring: no argument is spelled twice.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

from trainer.config.fields import meta, walk

from airflow_dtrain.job.spec import JobSpec


@dataclass(frozen=True)
class Argument:
    """One keyword argument of the operator."""

    name: str
    help: str
    default: Any = None
    templated: bool = True


SPEC_ARGUMENTS: tuple[Argument, ...] = tuple(
    Argument(meta(f).arg, meta(f).help) for _, f, _ in walk(JobSpec) if meta(f).arg
)
"""The arguments that set a field of the job spec (``JobSpec.from_arguments`` takes them)."""

_NOTES = {
    "checkpoint_uri": "Empty, on the local backend: ``checkpoints/<job>`` next to its group state "
    "(required on Kubernetes).",
    "budget_usd": "The platform enforces it too, for a hung trainer or a program of your own: each group "
    "runs at most what the money left buys at ``price_per_node_hour`` (the Job's activeDeadlineSeconds, "
    "locally its supervisor's deadline), recomputed from the ledger at every relaunch; the task then "
    'succeeds with ``stopped: "budget"`` in its summary.',
}
"""What the operator adds to a field's help text."""

_OWN = (
    Argument("config", "Further trainer config, nested or dotted keys; the flat arguments win."),
    Argument(
        "node_resources",
        'Per-node ``{"cpu", "memory", "ephemeral_storage", "gpus_per_node"}``, on '
        "Kubernetes the trainer container's requests and limits (``resources`` is Airflow's own task "
        "argument).",
    ),
    Argument(
        "kubernetes",
        "Pods of the ``kubernetes`` backend, set by the DAG's author: ``image``, "
        "``namespace``, ``service_account``, ``kueue_queue``, ``volumes``, ``secret_env``, "
        "``pod_template``, and what a run may choose (``allowed_images``, ``allowed_namespaces``), see "
        "``airflow_dtrain.kubernetes.spec.KubernetesSpec``. These carry privilege: templated, but a "
        "template here may not read ``params`` or ``dag_run`` (a trigger chooses through "
        "``kubernetes_overrides``). The platform admin bounds them further (the connection's "
        "``dtrain_policy`` extra, ``airflow_dtrain.kubernetes.policy``).",
    ),
    Argument(
        "kubernetes_overrides",
        "What a run chooses of the pods (the trigger form's ``kubernetes``): "
        "only ``image`` (one of ``kubernetes.allowed_images``) and ``namespace`` (one of "
        "``kubernetes.allowed_namespaces``); any other key is refused naming it.",
    ),
    Argument(
        "limits",
        "What a run may ask for, set by the DAG author (not templated, so a trigger form "
        "cannot widen it), within the platform admin's ``[dtrain] limits`` (``airflow_dtrain.trust.limits."
        'Limits``): ``{"max_nodes", "max_procs_per_node", "max_steps", "max_tokens_per_micro_batch", '
        '"max_price_per_node_hour", "max_runtime_s", "backends", "storage_roots"}``.',
        templated=False,
    ),
    Argument(
        "entrypoint",
        "Run your own training program instead of the bundled trainer, under the same "
        'group, relaunches and spend ledger: ``["/opt/train.py", "--lr", "3e-4"]`` or ``["-m", '
        '"my_pkg.train", ...]``. It gets the job\'s settings as DTRAIN_* environment variables and keeps '
        "the contract of docs/own_training_code.md (``trainer/contract.py``). Set by the DAG author (not "
        "templated, never a trigger-form param); on the local backend a script must exist on this "
        "machine.",
        templated=False,
    ),
    Argument(
        "kubernetes_conn_id",
        "The Kubernetes connection of the ``kubernetes`` backend.",
        "kubernetes_default",
        templated=False,
    ),
    Argument(
        "aws_conn_id",
        "The AWS connection whose spot price history (``zone``, ``instance_type``) "
        "prices a spot group: read every ``spot_price_refresh_s`` while it runs, and when it ends, to "
        'bill it again. Used only for ``capacity="spot"`` with both set; None: the launch price only.',
        "aws_default",
        templated=False,
    ),
    Argument(
        "spot_price_refresh_s",
        "Seconds between two reads of the spot price while a spot group runs.",
        300.0,
        templated=False,
    ),
    Argument("poll_interval", "Seconds between looks at the group.", 5.0, templated=False),
    Argument(
        "stop_grace_period_s",
        "On kill, how long the group gets to checkpoint before it is killed.",
        30.0,
        templated=False,
    ),
    Argument(
        "local_state_dir",
        "State directory of the local backend (default: ``[dtrain] local_state_dir``).",
        templated=False,
    ),
    Argument("deferrable", "Watch the group from the triggerer, freeing the worker slot.", templated=False),
)

ARGUMENTS: tuple[Argument, ...] = (*SPEC_ARGUMENTS, *_OWN)
"""Every keyword argument of the operator, in the order of its signature and its docs."""

TEMPLATE_FIELDS: tuple[str, ...] = tuple(a.name for a in ARGUMENTS if a.templated)


def signature(deferrable: bool) -> inspect.Signature:
    """``__init__``'s signature: Airflow applies ``default_args`` (and checks mapped arguments) by it."""
    keyword = inspect.Parameter.KEYWORD_ONLY
    parameters = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    for a in ARGUMENTS:
        default = deferrable if a.name == "deferrable" else a.default
        parameters.append(inspect.Parameter(a.name, keyword, default=default))
    parameters.append(inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD))
    return inspect.Signature(parameters)


def operator_doc(intro: str) -> str:
    """``intro`` and the ``:param`` list of every argument, from the declarations."""
    lines = [intro.rstrip(), ""]
    for a in ARGUMENTS:
        text = " ".join(filter(None, (a.help, _NOTES.get(a.name), "(templated)" if a.templated else "")))
        lines.append(f":param {a.name}: {text}")
    return "\n".join(lines) + "\n"

"""The trigger form, generated from the field definitions.

A DAG names the fields it offers on its trigger form and, where it wants, other defaults;
everything else -- the JSON Schema type, bounds, enum, title, description and section of
each ``Param`` -- comes from the one declaration of the field (``trainer.config.fields.setting``
in ``trainer/config/job_config.py``, ``airflow_dtrain/job/spec.py`` and ``RunSettings`` below). The same
declarations give the README's table (``markdown_table``), so the form, the validation
messages and the documentation cannot drift apart.

Optional strings are nullable (``["null", "string"]``, default ``None``): the Airflow UI
treats an empty non-nullable string as a missing value and keeps the Trigger button
disabled. Every default is checked against its own schema when the DAG is parsed.

Cheap at parse time: dataclasses and ``jsonschema`` (which Airflow itself imports).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from trainer.config.job_config import TrainConfig
from trainer.config.sections import CHECKPOINTS, MODEL_AND_DATA, BUDGET_AND_SPOT, URI_PATTERN
from trainer.config.fields import Setting, field_types, json_schema, meta, setting, title_of, walk

from airflow_dtrain.kubernetes.spec import TRIGGER_KEYS
from airflow_dtrain.job.spec import GROUP, KUBERNETES, JobSpec
from airflow_dtrain.trust.limits import check_run

SECTIONS = (MODEL_AND_DATA, GROUP, CHECKPOINTS, BUDGET_AND_SPOT, KUBERNETES)
"""The trigger form's sections, in the order they are shown."""


@dataclass(frozen=True, kw_only=True)
class RunSettings:
    """What a run of a training DAG decides with besides the job itself: the budget, the spot
    market it looks at, where the best model goes. (The DAG hands them to
    ``SpotPriceSensor``, ``BudgetBranchOperator``, ``SpotInterruptionSensor`` and
    ``EvaluateCheckpointOperator``.)"""

    max_price: float = setting(
        1.0,
        ge=0,
        arg="max_price",
        section=BUDGET_AND_SPOT,
        title="Max spot price ($/node-hour)",
        help="Highest acceptable spot price per node-hour; above it the run waits.",
    )
    max_wait_s: int = setting(
        3600,
        ge=0,
        arg="max_wait_s",
        section=BUDGET_AND_SPOT,
        title="Max wait for spot (s)",
        help="How long the job may wait for an acceptable spot price.",
    )
    step_time_estimate_s: float = setting(
        0.5, gt=0, arg="step_time_estimate_s", section=BUDGET_AND_SPOT, title="Step time estimate (s)",
        help="Seconds per optimizer step, for the cost estimate before a step has been measured.",
    )  # fmt: skip
    local_spot_price: float = setting(
        0.5,
        ge=0,
        arg="local_spot_price",
        section=BUDGET_AND_SPOT,
        title="Local backend: spot price ($/node-hour)",
        help="On the local backend (no EC2 market): the price charged as spot.",
    )
    local_on_demand_price: float = setting(
        1.5,
        ge=0,
        arg="local_on_demand_price",
        section=BUDGET_AND_SPOT,
        title="Local backend: on-demand price ($/node-hour)",
        help="On the local backend: the price charged as on-demand.",
    )
    text_field: str = setting(
        "text",
        arg="text_field",
        section=MODEL_AND_DATA,
        title="Text field",
        pattern=r"[A-Za-z0-9_.\-]+",
        rule="must be a field or column name (letters, digits, _ . -)",
        help="When the dataset is text to prepare: the JSON field (.jsonl) or column (.parquet, datasets) "
        "with the text.",
    )
    on_bad_row: str = setting(
        "error",
        choices=("error", "skip"),
        arg="on_bad_row",
        section=MODEL_AND_DATA,
        title="Bad rows",
        help="When the dataset is text to prepare: a row without text (null, not a string, not UTF-8, not "
        "JSON) is "
        "refused naming its file and line (error) or counted and skipped (skip).",
    )
    instance_types: list[str] = setting(
        factory=lambda: ["p4d.24xlarge", "p5.48xlarge"],
        arg="instance_types",
        section=BUDGET_AND_SPOT,
        title="EC2 instance types",
        help="EC2 instance types whose spot prices are considered (kubernetes backend).",
    )
    availability_zones: list[str] = setting(
        factory=list,
        arg="availability_zones",
        section=BUDGET_AND_SPOT,
        title="Availability zones",
        help="Zones considered (empty: all).",
    )
    registry_uri: str | None = setting(
        None, arg="registry_uri", section=CHECKPOINTS, title="Model registry", pattern=URI_PATTERN,
        help="Where the best model is recorded and exported (a path or s3://); empty: the DAG's default.",
    )  # fmt: skip
    kubernetes: dict[str, str] = setting(
        factory=dict,
        arg="kubernetes",
        section=KUBERNETES,
        title="Kubernetes: image and namespace",
        help="What a run may choose of the kubernetes backend's pods: image (one this DAG allows) and "
        "namespace "
        "(one this DAG allows). Everything else about the pods (volumes, secrets, service account, pod "
        "template) is the DAG author's and the platform admin's.",
    )
    interruption_queue_url: str | None = setting(
        None, arg="interruption_queue_url", section=KUBERNETES, title="Interruption queue (SQS URL)",
        pattern=r"^https://sqs\.[a-z0-9-]+\.amazonaws\.com(\.cn)?/[0-9]{12}/[A-Za-z0-9_-]+(\.fifo)?$",
        help="SQS queue EventBridge sends EC2 spot interruption warnings to; empty: node taints only.",
    )  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class SweepSettings:
    """What a sweep DAG varies and where its members' checkpoints go (``dags/sweep_llama.py``)."""

    learning_rates: list[float] = setting(
        factory=lambda: [1e-3, 3e-3],
        gt=0,
        arg="learning_rates",
        section=MODEL_AND_DATA,
        title="Learning rates",
        help="One training per learning rate, all behind one budget check.",
    )
    price_per_hour: float = setting(
        0.5,
        ge=0,
        arg="price_per_hour",
        section=BUDGET_AND_SPOT,
        title="Price ($/node-hour)",
        help="$/node-hour charged for every member (local backend).",
    )
    sweep_root: str | None = setting(
        None, arg="sweep_root", section=CHECKPOINTS, title="Sweep root", pattern=URI_PATTERN,
        help="Where the sweep's checkpoints go, one directory per member; empty: under $AIRFLOW_HOME.",
    )  # fmt: skip


_SCHEMAS: dict[str, dict[str, Any]] = {
    # A run chooses only these of the pods (KubernetesSpec.choose checks them again, against the DAG's
    # allowlists).
    "kubernetes": {
        "additionalProperties": False,
        "properties": {
            "image": {"type": "string", "pattern": r"^[^\s]+$", "maxLength": 512},
            "namespace": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "maxLength": 63},
        },
    },
}
"""JSON Schema a field's declaration cannot express, by argument name."""
assert set(_SCHEMAS["kubernetes"]["properties"]) == set(TRIGGER_KEYS)


@functools.cache
def form_fields() -> dict[str, tuple[dataclasses.Field, Any]]:
    """Every field a trigger form may offer, by its argument name: (field, type)."""
    found: dict[str, tuple[dataclasses.Field, Any]] = {}
    for dotted, f, tp in walk(TrainConfig):
        if meta(f).arg:
            found[meta(f).arg] = (f, tp)
    for klass in (JobSpec, RunSettings, SweepSettings):
        types = field_types(klass)
        for f in dataclasses.fields(klass):
            if meta(f).arg:
                found[meta(f).arg] = (f, types[f.name])
    return found


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def param_schema(
    name: str,
    *,
    default: Any = dataclasses.MISSING,
    section: str | None = None,
    description: str | None = None,
    schema: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``Param`` keyword arguments for field ``name``: its JSON Schema, title, description,
    section and default (``default`` and ``section`` override the declaration's)."""
    fields = form_fields()
    if name in AUTHOR_ONLY:
        raise KeyError(
            f"{name}: {AUTHOR_ONLY[name]} is set by the DAG author (an operator argument), never a "
            "trigger-form param"
        )
    if name not in fields:
        raise KeyError(f"{name}: not a form field (known: {', '.join(sorted(fields))})")
    f, tp = fields[name]
    m: Setting = meta(f)
    out = json_schema(f, tp)
    value = _default(f) if default is dataclasses.MISSING else default
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, tuple):
        value = list(value)
    if dataclasses.is_dataclass(value):
        value = {}
    if value == "" and out["type"] == "string":
        value = None  # an optional string: nullable, so that Trigger works without typing
    if value is None and not isinstance(out["type"], list):
        out["type"] = ["null", out["type"]]
        if "enum" in out:
            out["enum"] = [None, *out["enum"]]
    out.update(_SCHEMAS.get(name, {}))
    out.update(schema or {})
    out["title"] = title_of(f)
    out["description"] = description or m.help
    out["section"] = section or m.section or ""
    return {"default": value, **out}


def trigger_params(
    names: Iterable[str],
    *,
    defaults: Mapping[str, Any] | None = None,
    sections: Mapping[str, str] | None = None,
    descriptions: Mapping[str, str] | None = None,
    schemas: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """``Param`` objects for a DAG's trigger form, ordered by section; each default is
    validated against its own schema here, so a DAG with a bad default fails to parse."""
    import jsonschema
    from airflow.sdk import Param

    defaults, sections, descriptions, schemas = (
        defaults or {},
        sections or {},
        descriptions or {},
        schemas or {},
    )
    built = {
        name: param_schema(name, default=defaults.get(name, dataclasses.MISSING), section=sections.get(name),
                           description=descriptions.get(name), schema=schemas.get(name))
        for name in names
    }  # fmt: skip
    order = {s: i for i, s in enumerate(SECTIONS)}
    params: dict[str, Any] = {}
    for name, spec in sorted(built.items(), key=lambda kv: order.get(kv[1]["section"], len(order))):
        spec = dict(spec)
        default = spec.pop("default")
        try:
            jsonschema.validate(default, spec)
        except jsonschema.ValidationError as err:
            raise ValueError(
                f"trigger form: the default of {name} ({default!r}) fails its own schema: {err.message}"
            )
        description = spec.pop("description")
        params[name] = Param(default, description=description, **spec)
    return params


def markdown_table(params: Mapping[str, Any]) -> str:
    """The README table of a trigger form: field, section, type, default, meaning."""
    rows = ["| field | section | type | default | meaning |", "|---|---|---|---|---|"]
    for name, param in params.items():
        schema = param.schema
        kind = schema.get("type")
        kind = " or ".join(kind) if isinstance(kind, list) else kind
        bounds = [
            f"{op} {schema[key]:g}"
            for key, op in (
                ("minimum", "≥"),
                ("exclusiveMinimum", ">"),
                ("maximum", "≤"),
                ("exclusiveMaximum", "<"),
            )
            if key in schema
        ]
        if "enum" in schema:
            kind += ": " + " \\| ".join(str(v) for v in schema["enum"] if v is not None)
        default = "—" if param.value is None else f"`{param.value!r}`".replace("|", "\\|")
        text = (param.description or "").replace("|", "\\|")
        rows.append(
            f"| `{name}` | {schema.get('section', '')} | {kind}{' ' + ', '.join(bounds) if bounds else ''} "
            f"| {default} | {text} |"
        )
    return "\n".join(rows)


AUTHOR_ONLY = {
    "entrypoint": "the program every process runs",
    "limits": "what a run may ask for",
}
"""Operator arguments only the DAG author sets (in the DAG file, never templated): a run can never choose
them."""


class UnknownConfKeys(ValueError):
    """``dag_run.conf`` holds keys that are not params of the DAG."""


def reject_unknown_conf(conf: Mapping[str, Any] | None, params: Iterable[str]) -> None:
    """Raise ``UnknownConfKeys`` naming every key of ``conf`` that is not one of ``params``.

    Airflow passes unknown ``dag_run.conf`` keys through silently, so a typo (``"stepz": 10``) would
    train with the default instead; a DAG's first task calls this, before anything is spent. A key
    only the DAG author may set (``AUTHOR_ONLY``: ``entrypoint``, ``limits``) is refused as such.
    """
    author_only = sorted(set(conf or {}) & set(AUTHOR_ONLY))
    if author_only:
        key = author_only[0]
        raise UnknownConfKeys(
            f"dag_run.conf: key {key!r} is refused: {AUTHOR_ONLY[key]} is set by the DAG author in the DAG "
            f"file (an operator argument), never by a run"
        )
    known = set(params)
    unknown = sorted(set(conf or {}) - known)
    if unknown:
        raise UnknownConfKeys(
            f"dag_run.conf: unknown key(s) {', '.join(map(repr, unknown))}; this DAG takes: "
            f"{', '.join(sorted(known))}"
        )


def check_conf(author: Any = None) -> Any:
    """A DAG's first task, ``check_conf``, called inside its ``with DAG(...)``: it refuses ``dag_run.conf``
    keys that are not the DAG's params (a typo would silently train with a default) and a run that asks for
    more than ``author``'s limits or for a place outside the storage roots (``check_run``), before any task
    runs. ``check_conf(LIMITS) >> the_rest``."""
    from airflow.sdk import task

    @task(task_id="check_conf")
    def refuse_what_is_not_allowed(dag_run=None, dag=None, params=None) -> None:
        """Refuse dag_run.conf keys that are not params, and a run beyond the DAG author's limits."""
        from airflow_dtrain.trust.ownership import owner_for

        reject_unknown_conf(dag_run.conf, dag.params)  # the declared ones: params merges the conf in
        check_run(params, author, owner=owner_for(getattr(dag_run, "triggering_user_name", None), dag.dag_id))

    return refuse_what_is_not_allowed()

"""Who may choose what, and the one place that enforces it.

Three parties, each trusted less than the next:

* whoever can press **Trigger** fills the trigger form (``dag_run.conf``): a job's name, its size, its data,
  where its checkpoints go, prices on the local backend;
* the **DAG author** writes the DAG file: the operators' arguments, and ``limits=`` that narrow what a run may
  ask for (``Limits``), never widened by a run;
* the **platform admin** sets the ``[dtrain]`` options of the Airflow deployment: the limits every DAG lives
  within (``[dtrain] limits``, ``storage_roots``), who owns which jobs (``[dtrain] owners``), the SQS queues a
  DAG may read (``[dtrain] interruption_queues``) and the Kubernetes policy (the connection's
  ``dtrain_policy``).

What one job shares with another is the worker, the cluster and the storage roots; what belongs to a job --
its checkpoint directory, spend ledger, leases and registry entries -- belongs to its **owner** (``owner_of``:
a team the admin maps from the DAG or the triggering user), recorded in the directory's ``owner.json`` and in
every manifest. ``check_job_dir`` refuses another owner's or another job's directory before anything is
written there. Every operator of this package goes through ``limits_for`` and ``check_job_dir``: the bundled
DAGs and a user's own DAG alike.

Cheap at parse time: dataclasses and the stdlib; Airflow's ``conf`` and fsspec are imported where used.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from trainer.config.fields import check, field_types, setting

from airflow_dtrain.errors import SpecError
from airflow_dtrain.trust.roots import conf_json, storage_roots, within_roots
from airflow_dtrain.trust.ownership import JOB_NAME, OwnershipError

BACKENDS = ("local", "kubernetes")
"""Backends this version can launch."""


@dataclass(frozen=True, kw_only=True)
class Limits:
    """What a run may ask for. The admin's (``[dtrain] limits`` and ``storage_roots``) bound every DAG; a DAG
    author's (``FSDPTrainOperator(limits=...)``) narrow them; a trigger chooses within both
    (``limits_for``)."""

    max_nodes: int | None = setting(None, ge=1, help="Most nodes a group may have.")
    max_procs_per_node: int | None = setting(None, ge=1, help="Most processes (GPUs) per node.")
    max_steps: int | None = setting(None, ge=1, help="Most optimizer steps a job may train.")
    max_missing_nodes: int | None = setting(
        None, ge=0, help="Most nodes an elastic group may train without (num_nodes - min_nodes); 0: every "
        "group is all or nothing.",
    )  # fmt: skip
    max_tokens_per_micro_batch: int | None = setting(
        None,
        ge=1,
        help="Most tokens per micro-batch and process (seq_len x micro_batch_size): what bounds a "
        "process's activation memory.",
    )
    max_sweep_members: int | None = setting(None, ge=1, help="Most trainings one sweep may start.")
    max_price_per_node_hour: float | None = setting(
        None,
        gt=0,
        help="Highest price per node-hour a run may set or accept (local prices, max spot price).",
    )
    max_runtime_s: int | None = setting(
        None, ge=1, help="Longest a group may run, with or without a budget: the Job's activeDeadlineSeconds "
        "and the local supervisor's deadline (the earlier of this and the budget's).",
    )  # fmt: skip
    backends: tuple[str, ...] | None = setting(None, help="Backends a run may choose (default: any).")
    storage_roots: tuple[str, ...] | None = setting(
        None,
        help="Where checkpoint_uri, dataset, init_from, the ledger and the registry may point: directories "
        "or s3:// prefixes. The admin's default: the local backend's directory ($AIRFLOW_HOME/dtrain).",
    )

    def __post_init__(self) -> None:
        try:
            check(self, "limits")
        except ValueError as err:
            raise SpecError(str(err)) from None
        if self.storage_roots is not None:
            if isinstance(self.storage_roots, str):
                raise SpecError(f"limits.storage_roots: expected a list of roots, got {self.storage_roots!r}")
            object.__setattr__(self, "storage_roots", tuple(self.storage_roots))
            for root in self.storage_roots:
                if not isinstance(root, str) or not root.startswith(("/", "s3://", "file://")):
                    raise SpecError(
                        f"limits.storage_roots: expected absolute paths or s3:// prefixes, got {root!r}"
                    )
        if self.backends is not None:
            object.__setattr__(self, "backends", tuple(self.backends))
            for backend in self.backends:
                if backend not in BACKENDS:
                    raise SpecError(
                        f"limits.backends: unknown backend {backend!r} (choose from {', '.join(BACKENDS)})"
                    )

    @classmethod
    def from_value(cls, value: Any) -> Limits:
        if value is None or isinstance(value, Limits):
            return value or cls()
        if not isinstance(value, dict):
            raise SpecError(f"limits: expected a mapping, got {value!r}")
        unknown = sorted(set(value) - set(field_types(cls)))
        if unknown:
            raise SpecError(f"limits: unknown key {unknown[0]!r} (allowed: {', '.join(field_types(cls))})")
        return cls(**value)

    def narrowed(self, author: Limits) -> Limits:
        """These (the admin's) limits narrowed by a DAG author's: the lower maximum of each, the backends both
        allow, and the author's roots, each of which must lie under one of these (an author cannot widen
        them)."""
        values: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            mine, theirs = getattr(self, f.name), getattr(author, f.name)
            if f.name == "backends":
                values[f.name] = theirs if mine is None else mine if theirs is None else \
                    tuple(b for b in theirs if b in mine)  # fmt: skip
            elif f.name == "storage_roots":
                if theirs is not None and mine is not None:
                    for root in theirs:
                        if not within_roots(root, mine):
                            raise SpecError(
                                f"limits.storage_roots: {root!r} is outside the platform's storage roots "
                                f"([dtrain] storage_roots: {', '.join(mine)})"
                            )
                values[f.name] = theirs if theirs is not None else mine
            else:
                values[f.name] = mine if theirs is None else theirs if mine is None else min(mine, theirs)
        return Limits(**values)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: (list(v) if isinstance(v := getattr(self, f.name), tuple) else v)
                for f in dataclasses.fields(self)}  # fmt: skip

    # -- checks: each raises SpecError naming the field, the value and the limit -------------------
    def _above(self, name: str, value: float, limit_name: str) -> None:
        limit = getattr(self, limit_name)
        if limit is not None and value is not None and value > limit:
            raise SpecError(f"{name}: {value:g} is above the limit of {limit:g} (limits.{limit_name})")

    def check_price(self, name: str, value: Any) -> None:
        """A price a run set (a trigger-form price, a max spot price): at most ``max_price_per_node_hour``."""
        if value not in (None, "", "None"):
            self._above(name, float(value), "max_price_per_node_hour")

    def check_sweep(self, members: int) -> None:
        self._above("learning_rates", members, "max_sweep_members")

    def check_missing_nodes(self, num_nodes: Any, min_nodes: Any) -> None:
        """An elastic group's ``num_nodes - min_nodes`` at most ``max_missing_nodes``."""
        if min_nodes in (None, "", "None") or self.max_missing_nodes is None:
            return
        missing = int(num_nodes) - int(min_nodes)
        if missing > self.max_missing_nodes:
            raise SpecError(
                f"min_nodes: {min_nodes} lets a group of {num_nodes} train {missing} node(s) short, above "
                f"the limit of {self.max_missing_nodes} (limits.max_missing_nodes)"
            )

    def check_tokens(self, seq_len: int, micro_batch_size: int) -> None:
        """``seq_len x micro_batch_size``, what one process's activations grow with, within the limit."""
        tokens, limit = int(seq_len) * int(micro_batch_size), self.max_tokens_per_micro_batch
        if limit is not None and tokens > limit:
            raise SpecError(
                f"seq_len x micro_batch_size: {seq_len} x {micro_batch_size} = {tokens} tokens is above "
                f"the limit of {limit} (limits.max_tokens_per_micro_batch)"
            )

    def check_uri(self, name: str, uri: str | None) -> None:
        """``uri`` (a path, file:// or s3://) lies under ``storage_roots``."""
        if (
            self.storage_roots is not None
            and uri
            and uri != "builtin"
            and not within_roots(uri, self.storage_roots)
        ):
            raise SpecError(f"{name}: {uri!r} is outside the storage roots "
                            f"(limits.storage_roots: {', '.join(self.storage_roots)})")  # fmt: skip

    def check(self, spec: Any) -> None:
        """Every limit on a ``JobSpec``."""
        train = spec.train
        for name, value, limit_name in (
            ("num_nodes", spec.num_nodes, "max_nodes"),
            ("procs_per_node", spec.procs_per_node, "max_procs_per_node"),
            ("steps", train.steps, "max_steps"),
            ("price_per_node_hour", spec.price_per_node_hour, "max_price_per_node_hour"),
            ("price_ceiling_per_node_hour", spec.price_ceiling_per_node_hour, "max_price_per_node_hour"),
            ("max_runtime_s", spec.max_runtime_s, "max_runtime_s"),
        ):
            self._above(name, value, limit_name)
        self.check_missing_nodes(spec.num_nodes, spec.min_nodes)
        self.check_tokens(train.data.seq_len, train.micro_batch_size)
        for name, uri in (
            ("checkpoint_uri", train.checkpoint.uri),
            ("dataset", train.data.dataset),
            ("init_from", train.model.init_from),
            ("cost.ledger_uri", train.cost.ledger_uri),
        ):
            self.check_uri(name, uri)
        if self.backends is not None and spec.backend not in self.backends:
            raise SpecError(
                f"backend: {spec.backend!r} is not allowed here (limits.backends: {', '.join(self.backends)})"
            )

    def form_maxima(self) -> dict[str, dict[str, Any]]:
        """The trigger form's bounds from these limits (``trigger_params(schemas=...)``): the form shows
        them."""
        out: dict[str, dict[str, Any]] = {}
        for arg, name in (("num_nodes", "max_nodes"), ("procs_per_node", "max_procs_per_node"),
                          ("steps", "max_steps"), ("max_price", "max_price_per_node_hour"),
                          ("local_spot_price", "max_price_per_node_hour"),
                          ("local_on_demand_price", "max_price_per_node_hour"),
                          ("price_per_hour", "max_price_per_node_hour")):  # fmt: skip
            if getattr(self, name) is not None:
                out[arg] = {"maximum": getattr(self, name)}
        if self.max_sweep_members is not None:
            out["learning_rates"] = {"maxItems": self.max_sweep_members}
        return out


ADMIN_DEFAULTS = Limits(
    max_tokens_per_micro_batch=1 << 18, max_price_per_node_hour=500.0, max_runtime_s=86_400
)
"""What bounds every DAG when ``[dtrain] limits`` leaves a field out: 262,144 tokens per micro-batch (32 x
8,192), $500 per node-hour (above any EC2 GPU instance), a day per group launch. ``null`` in ``[dtrain]
limits`` removes one."""

WHO_SETS_WHAT: dict[str, str] = {
    "max_nodes": "admin, narrowed by the author",
    "max_procs_per_node": "admin, narrowed by the author",
    "max_steps": "admin, narrowed by the author",
    "max_missing_nodes": "admin, narrowed by the author",
    "max_tokens_per_micro_batch": "admin (default 262144), narrowed by the author",
    "max_sweep_members": "admin, narrowed by the author",
    "max_price_per_node_hour": "admin (default 500), narrowed by the author",
    "max_runtime_s": "admin (default 86400), narrowed by the author",
    "backends": "admin, narrowed by the author",
    "storage_roots": "admin (default: $AIRFLOW_HOME/dtrain), narrowed by the author",
}
"""The README's "who sets what" rows of the limits (tests/unit/test_trust.py compares the two)."""


def admin_limits() -> Limits:
    """The platform admin's limits: ``[dtrain] limits`` (JSON of ``Limits`` fields; absent fields take
    ``ADMIN_DEFAULTS``) and ``[dtrain] storage_roots`` (comma-separated), always with the local backend's own
    directory among the roots. A bad value raises naming the option."""
    configured = conf_json("limits", "Limits fields")
    values = {**ADMIN_DEFAULTS.to_dict(), **configured}
    values["storage_roots"] = storage_roots(values.get("storage_roots") or [])
    try:
        return Limits.from_value(values)
    except SpecError as err:
        raise SpecError(f"[dtrain] limits: {err}") from None


def limits_for(author: Any = None) -> Limits:
    """The limits a DAG's runs live within: the admin's narrowed by the author's (``Limits`` or a mapping)."""
    return admin_limits().narrowed(Limits.from_value(author))


def limits_table() -> str:
    """The README's table of the limits: each field of ``Limits``, who sets it, what it bounds."""
    rows = ["| limit | who sets it | what it bounds |", "|---|---|---|"]
    for f in dataclasses.fields(Limits):
        rows.append(f"| `{f.name}` | {WHO_SETS_WHAT[f.name]} | {f.metadata['dtrain'].help} |")
    return "\n".join(rows)


_RUN_URIS = ("checkpoint_uri", "registry_uri", "dataset", "init_from", "sweep_root")
_RUN_PRICES = ("max_price", "local_spot_price", "local_on_demand_price", "price_per_hour")
_RUN_MAXIMA = (("num_nodes", "max_nodes"), ("procs_per_node", "max_procs_per_node"), ("steps", "max_steps"))


_RUN_READS = ("init_from", "dataset")
"""The trigger form's fields a run reads from: never another owner's directory (``check_read``)."""


def check_run(params: Any, author: Any = None, owner: str | None = None) -> None:
    """A run's trigger form against the limits its DAG lives within, before any task reads or writes anything:
    a DAG's first task calls it (the tasks check again what reaches them). With ``owner`` (who the run acts
    for), what it reads must not lie in another owner's directory. Raises ``SpecError`` naming the field and
    the value."""
    from airflow_dtrain.aws.sqs import check_queue
    from airflow_dtrain.trust.ownership import check_read

    limits = limits_for(author)
    if "job" in params and not JOB_NAME.fullmatch(str(params["job"] or "")):
        raise OwnershipError(
            f"job: {params['job']!r} is not a job name (lowercase letters, digits, . _ -; not "
            f"empty): a job's checkpoints, ledger and models are found, and owned, by it"
        )
    for name in _RUN_URIS:
        if params.get(name):
            limits.check_uri(name, str(params[name]))
    if owner is not None:
        for name in _RUN_READS:
            check_read(str(params[name]) if params.get(name) else None, owner=owner, what=name)
    if params.get("interruption_queue_url"):  # read by the spot watch: only the admin's dedicated queues
        check_queue(str(params["interruption_queue_url"]), field="interruption_queue_url")
    for name in _RUN_PRICES:
        limits.check_price(name, params.get(name))
    for name, limit in _RUN_MAXIMA:
        if params.get(name) is not None:
            limits._above(name, int(params[name]), limit)
    if params.get("num_nodes") is not None:
        limits.check_missing_nodes(params["num_nodes"], params.get("min_nodes"))
    if params.get("learning_rates") is not None:
        limits.check_sweep(len(params["learning_rates"]))
    if params.get("seq_len") and params.get("micro_batch_size"):
        limits.check_tokens(params["seq_len"], params["micro_batch_size"])

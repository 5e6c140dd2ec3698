"""BudgetBranchOperator: train on spot, on on-demand, wait for a better price, or stop."""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseBranchOperator

from airflow_dtrain.operators.inputs import build, check_given, names, param_doc, parameters
from airflow_dtrain.job.spec import JobSpec
from trainer.money.projection import FIRST_SAVE_GUESS_S, stop_reserve_s
from trainer.config.job_config import TrainConfig
from trainer.config.sections import CheckpointConfig, CostConfig
from trainer.config.fields import REQUIRED, ConfigError, borrow, check, setting

DEFAULT_STOP_RESERVE_S = stop_reserve_s(
    FIRST_SAVE_GUESS_S, CheckpointConfig().grace_period_s, CostConfig().stop_margin_s
)
"""What the bundled trainer keeps back with its defaults (its first-save guess and the stop margin, before the
platform deadline's grace period and margin): 175 s of the group."""

if TYPE_CHECKING:
    from airflow.sdk import Context


def _chance(help: str, default: float | None) -> Any:
    return setting(default, ge=0, le=1, rule="must be a chance in [0, 1]", help=help)


@dataclass(frozen=True, kw_only=True)
class BudgetBranchInputs:
    """What the decision is taken from (every one templated). The job's own settings are borrowed from their
    declarations (``trainer.config.job_config``, ``airflow_dtrain.job.spec``); the rest are the decision's
    own."""

    total_steps: int = borrow(TrainConfig, "steps", REQUIRED, help="Optimizer steps of the whole job.")
    budget_usd: float | None = borrow(CostConfig, "budget_usd")
    step_time_estimate_s: float | None = setting(
        None, ge=0, help="Seconds per step before one has been measured."
    )
    num_nodes: int = borrow(JobSpec, "num_nodes")
    min_nodes: int | None = borrow(JobSpec, "min_nodes")
    replace_timeout_s: float = borrow(JobSpec, "replace_timeout_s")
    spot_price: float | None = setting(None, ge=0, help="Spot $/node-hour (wins over ``price_task_id``).")
    on_demand_price: float | None = setting(
        None, ge=0, help="On-demand $/node-hour (wins over ``price_task_id``)."
    )
    interruption_rate_per_hour: float = setting(
        0.05, ge=0, help="Expected interruptions of the group per hour on spot."
    )
    max_interruption_rate_per_hour: float | None = setting(
        None,
        ge=0,
        help="Above this risk, spot is not used (an elastic group's lost node counts at the "
        "share of a relaunch's time its resize costs).",
    )
    restart_overhead_s: float = setting(600.0, ge=0, help="Time one interruption costs besides lost work.")
    lost_work_s: float = setting(0.0, ge=0, help="Work lost per interruption.")
    deadline_s: float | None = setting(None, ge=0, help="Seconds left to finish (None: no deadline).")
    waited_s: float = setting(0.0, ge=0, help="How long the job has waited for spot so far.")
    max_wait_s: float = setting(0.0, ge=0, help="How long it may wait for spot in all (0: never).")
    wait_interval_s: float = setting(900.0, ge=0, help="How long one wait lasts.")
    wait_target_price: float | None = setting(
        None, ge=0,
        help="The spot $/node-hour a wait hopes for (default: ``max_spot_price``, else the offer's ``limit`` "
        "from ``price_task_id``, else the current spot or on-demand price).",
    )  # fmt: skip
    max_spot_price: float | None = setting(
        None, ge=0,
        help="A spot offer above this $/node-hour is not acceptable: the decision is then to wait for a "
        "better price (if waiting is allowed), on-demand, or stop.",
    )  # fmt: skip
    spot_nodes_available: int | None = setting(
        None, ge=0,
        help="Spot nodes of the offer that can be had at once (None: as many as the group needs; fewer than "
        "``num_nodes`` is no spot at all, unless the group is elastic: then spot on at least ``min_nodes``).",
    )  # fmt: skip
    resize_overhead_s: float = setting(
        90.0, ge=0,
        help="Time an elastic group's resize costs (a checkpoint and the re-rendezvous): what a lost node "
        "costs it in place of ``restart_overhead_s``, and its growing back to ``num_nodes``.",
    )  # fmt: skip
    max_late_risk: float = _chance(
        "The chance of a preemption before the spot run is done (over its start-up and its work) up to which "
        "spot is used without keeping time to finish on on-demand after one (0: always kept).",
        0.0,
    )
    min_finish_chance: float | None = _chance(
        "Train on spot when its chance of finishing within the remaining budget, and by ``deadline_s``, is "
        "at least this (preemptions at ``interruption_rate_per_hour``, each costing ``restart_overhead_s`` + "
        "``lost_work_s``), even if its expected cost or time is over them; the trainer's budget cap stops "
        "the run at the budget when the preemptions are unkind (None: the expected spot cost and hours "
        "must fit).",
        None,
    )
    allow_late: bool = setting(
        True,
        help="When neither capacity can finish by ``deadline_s`` within the budget, finish late within it "
        "(spot, on-demand or a wait for spot) rather than stop.",
    )
    stop_reserve_s: float = setting(
        DEFAULT_STOP_RESERVE_S, ge=0,
        help="Seconds of the group that the training task keeps back of the money left, to stop within the "
        "cap (``trainer.money.projection.stop_reserve_s``: the bundled trainer's save and exit, then the "
        "platform budget deadline's grace period and margin, which also stop a program of your own); the "
        "decision spends only the money left beyond them, counted as the trainer counts them, at its price "
        "ceiling: the on-demand price when there is one, since a spot price can rise to it while the group "
        'runs; the lower price for a fixed-price offer (``source`` "fixed": the local backend). Default: the '
        "bundled trainer's defaults, 175 s.",
    )  # fmt: skip

    def __post_init__(self) -> None:
        check(self, "")
        if self.min_nodes is not None and self.min_nodes > self.num_nodes:
            raise ConfigError(f"min_nodes: must be <= num_nodes {self.num_nodes}, got {self.min_nodes}")


_OWN = (
    ("spot_task_id", inspect.Parameter.empty),
    ("on_demand_task_id", inspect.Parameter.empty),
    ("wait_task_id", None),
    ("stop_task_id", None),
    ("checkpoint_uri", None),
    ("job", None),
    ("limits", None),
    ("price_task_id", None),
)
"""The operator's arguments that are not inputs of the decision: its branches, where the ledger is, the
author's limits and the price task (documented in the class docstring)."""

_INPUTS = names(BudgetBranchInputs)

_SIGNATURE = inspect.Signature(
    [
        inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD),
        *(inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=d) for n, d in _OWN),
        *parameters(BudgetBranchInputs),
        inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD),
    ]
)

_INTRO = """
Choose how the job goes on from what is left to train, the prices and the money left.

Reads the cost ledger and the measured step time from the latest committed checkpoint
manifest under ``checkpoint_uri`` (``CheckpointDir.ledger``), takes the spot offer
chosen by a ``SpotPriceSensor`` (``price_task_id``) or the prices you give, and follows
the decision table of ``airflow_dtrain.spot.budget``: ``spot``, ``on_demand``, ``wait`` or
``stop``. It never chooses work whose estimate exceeds the remaining budget (the money left, less
``stop_reserve_s`` of the group that the training task keeps back to stop within the cap; with
``min_finish_chance``: spot whose chance of finishing within it is below that). The
decision and its reason are logged and pushed to XCom (key ``decision``).

:param spot_task_id: task (or task group) to run when training on spot, or a list of them (e.g. the
    training task and a ``SpotInterruptionSensor`` beside it).
:param on_demand_task_id: task to run when training on on-demand.
:param wait_task_id: task to run when waiting for a better price (None: skip everything).
:param stop_task_id: task to run when stopping (None: skip everything).
:param checkpoint_uri: the job's checkpoint directory (local path or ``s3://``): under the storage roots, and
    the run's owner's directory of ``job`` (``airflow_dtrain.trust.ownership``); read, never written here.
    (templated)
:param job: the job whose ledger this is (None: any job of the run's owner, e.g. a sweep's shared ledger).
    (templated)
:param limits: the DAG author's limits (``airflow_dtrain.trust.limits.Limits``), within the platform
    admin's: the prices a run gives (``spot_price``, ``on_demand_price``, ``max_spot_price``) are at most
    ``max_price_per_node_hour``, the directory lies under ``storage_roots``.
:param price_task_id: a ``SpotPriceSensor`` whose XCom gives ``spot_price`` and ``on_demand_price``.
"""


class BudgetBranchOperator(BaseBranchOperator):
    __doc__ = _INTRO.lstrip() + param_doc(BudgetBranchInputs) + "\n"

    template_fields: Sequence[str] = ("checkpoint_uri", "job", *_INPUTS)

    def __init__(self, **kwargs: Any) -> None:
        """The arguments are the class docstring's (``_OWN``, ``BudgetBranchInputs``); the rest Airflow's."""
        own = {name: kwargs.pop(name, default) for name, default in _OWN}
        inputs = {name: kwargs.pop(name, _SIGNATURE.parameters[name].default) for name in _INPUTS}
        super().__init__(**kwargs)
        for name, value in {**own, **inputs}.items():
            setattr(self, name, value)
        check_given(
            BudgetBranchInputs, inputs, self._where()
        )  # fail in the DAG file for what is not templated

    __init__.__signature__ = _SIGNATURE  # type: ignore[attr-defined]

    def _where(self) -> str:
        return f"{type(self).__name__}(task_id={self.task_id!r})"

    def inputs(self) -> BudgetBranchInputs:
        """The decision's inputs, once the templates have rendered: validated by their declarations."""
        return build(BudgetBranchInputs, {name: getattr(self, name) for name in _INPUTS}, self._where())

    def _prices(self, context: Context, x: BudgetBranchInputs) -> tuple[float | None, float | None, dict]:
        offer: dict[str, Any] = {}
        if self.price_task_id:
            offer = context["ti"].xcom_pull(task_ids=self.price_task_id) or {}
            if not offer:
                self.log.info("No spot offer from task %s (skipped or not run)", self.price_task_id)
        spot = x.spot_price if x.spot_price is not None else offer.get("spot_price")
        od = x.on_demand_price if x.on_demand_price is not None else offer.get("on_demand_price")
        cap = x.max_spot_price
        if spot is not None and cap is not None and float(spot) > cap:
            self.log.info(
                "Spot price $%.4f/h is above max_spot_price $%.4f/h: no acceptable spot offer", spot, cap
            )
            spot = None
        return spot, od, offer

    def _check_trust(self, context: Context, x: BudgetBranchInputs) -> None:
        """Before the ledger is read or a branch taken: the run's prices within the limits, its directory
        under the storage roots and its owner's (another team's ledger is neither read nor billed)."""
        from airflow_dtrain.errors import SpecError
        from airflow_dtrain.trust.limits import limits_for
        from airflow_dtrain.trust.ownership import check_job_dir, owner_of

        limits = limits_for(self.limits)
        try:
            for name in ("spot_price", "on_demand_price", "max_spot_price", "wait_target_price"):
                limits.check_price(name, getattr(x, name))
            if self.checkpoint_uri:
                limits.check_uri("checkpoint_uri", str(self.checkpoint_uri))
                job = None if self.job in (None, "", "None") else str(self.job)
                if self.job == "":
                    raise SpecError(
                        "job: '' is empty: name the job (its checkpoints, ledger and models are found by it)"
                    )
                check_job_dir(str(self.checkpoint_uri), owner=owner_of(context), job=job, claim=False)
        except SpecError as err:
            raise SpecError(f"{self._where()}: {err}") from None

    def _check_prices(self, spot: Any, on_demand: Any) -> None:
        from airflow_dtrain.errors import SpecError
        from airflow_dtrain.trust.limits import limits_for

        limits = limits_for(self.limits)
        try:
            limits.check_price("spot price", spot)
            limits.check_price("on-demand price", on_demand)
        except SpecError as err:
            raise SpecError(f"{self._where()}: {err}") from None

    def _ledger(self) -> Any:
        """The job's ledger (an empty one before its first checkpoint), its skipped checkpoints logged."""
        from trainer.checkpoint.directory import CheckpointDir
        from trainer.checkpoint.spend_files import Ledger

        ledger = CheckpointDir(self.checkpoint_uri).ledger() if self.checkpoint_uri else Ledger()
        for bad in ledger.skipped:  # the trainer's resume skips them too (and verifies the shards as well)
            self.log.warning(
                "Checkpoint %s skipped: its %s check failed for %s: %s",
                bad["checkpoint"], bad["check"], bad["file"], bad["detail"],
            )  # fmt: skip
        return ledger

    def _stop_reserve_usd(self, x: BudgetBranchInputs, spot: Any, od: Any, offer: dict) -> float:
        """The money the training task keeps back to stop (the trainer's save and exit, then the platform
        deadline's grace and margin): money the run cannot spend on training, at the price the trainer counts
        it at, its price ceiling. A market's spot price can rise to on-demand while the group runs (EC2 never
        bills spot above it), so both capacities keep their reserve at on-demand; counted at the spot price a
        spot run could be admitted only to stop after a few steps. A fixed price (the local backend's offer)
        cannot move: the lowest price known."""
        fixed = offer.get("source") == "fixed"
        known = [float(p) for p in (spot, od) if p is not None]
        price = float(od) if od is not None and not fixed else min(known, default=0.0)
        reserve_usd = x.stop_reserve_s * x.num_nodes * price / 3600
        if x.budget_usd is not None and reserve_usd:
            self.log.info(
                "Of the money left, $%.4f is kept back for the training task's stop (stop_reserve_s=%.0f of "
                "%d node(s) at $%.4f/h)",
                reserve_usd, x.stop_reserve_s, x.num_nodes, price,
            )  # fmt: skip
        return reserve_usd

    def _policy_inputs(
        self, x: BudgetBranchInputs, ledger: Any, prices: tuple[Any, Any, dict], reserve_usd: float
    ) -> Any:
        """What ``airflow_dtrain.spot.budget.decide`` takes, from the inputs, the ledger and the prices."""
        from airflow_dtrain.spot.estimates import BudgetInputs
        from airflow_dtrain.spot.estimates import rejoin_wait_s

        spot, od, offer = prices
        step_time = ledger.step_time_s or x.step_time_estimate_s
        remaining = None if x.budget_usd is None else x.budget_usd - ledger.total_dollars - reserve_usd
        self.log.info(
            "Ledger: step %d of %d, $%.2f spent (%s), step time %s s (%s)",
            ledger.step, x.total_steps, ledger.total_dollars, ledger.path or "no checkpoint yet",
            step_time, "measured" if ledger.step_time_s else "estimate",
        )  # fmt: skip
        targets = (x.wait_target_price, x.max_spot_price, offer.get("limit"))
        return BudgetInputs(
            steps_remaining=max(0, x.total_steps - ledger.step),
            step_time_s=step_time,
            num_nodes=x.num_nodes,
            spot_price=None if spot is None else float(spot),
            on_demand_price=None if od is None else float(od),
            remaining_budget=None if remaining is None else max(0.0, remaining),
            interruption_rate_per_hour=x.interruption_rate_per_hour,
            max_interruption_rate_per_hour=(
                float("inf") if x.max_interruption_rate_per_hour is None else x.max_interruption_rate_per_hour
            ),
            restart_overhead_s=x.restart_overhead_s,
            lost_work_s=x.lost_work_s,
            deadline_s=x.deadline_s,
            waited_s=x.waited_s,
            max_wait_s=x.max_wait_s,
            wait_interval_s=x.wait_interval_s or 900.0,
            wait_target_price=next((p for p in targets if p is not None), None),
            spot_nodes_available=x.spot_nodes_available,
            min_nodes=x.min_nodes,
            resize_overhead_s=x.resize_overhead_s,
            replace_timeout_s=rejoin_wait_s(x.replace_timeout_s),  # the round closes once all are back
            max_late_risk=x.max_late_risk,
            min_finish_chance=x.min_finish_chance,
            allow_late=x.allow_late,
        )

    def _report(self, context: Context, decision: Any, pushed: dict[str, Any]) -> None:
        """Log the decision, count it in the metrics and push it to XCom (key ``decision``)."""
        from airflow_dtrain import metrics
        from airflow_dtrain.spot.estimates import Choice

        self.log.info("Decision: %s. %s", decision.choice.value, decision.reason)
        tags = metrics.task_tags(context)
        metrics.incr(f"budget.decision.{decision.choice.value}", tags=tags)
        if decision.remaining_budget is not None:
            metrics.gauge("budget.remaining_dollars", decision.remaining_budget, tags=tags)
        estimate = {Choice.SPOT: decision.spot_cost, Choice.ON_DEMAND: decision.on_demand_cost}.get(
            decision.choice
        )
        if estimate is not None:
            metrics.gauge("budget.estimate_dollars", estimate, tags=tags)
        context["ti"].xcom_push(key="decision", value={**decision.to_dict(), **pushed})

    def choose_branch(self, context: Context) -> str | list[str] | None:
        from airflow_dtrain.spot.budget import decide
        from airflow_dtrain.spot.estimates import Choice

        x = self.inputs()
        self._check_trust(context, x)
        ledger = self._ledger()
        spot, od, offer = self._prices(context, x)
        self._check_prices(spot, od)  # a trigger-set local price arrives through the price task's offer
        reserve_usd = self._stop_reserve_usd(x, spot, od, offer)
        inputs = self._policy_inputs(x, ledger, (spot, od, offer), reserve_usd)
        decision = decide(inputs)
        self._report(
            context,
            decision,
            {
                "ledger": ledger.to_dict(),
                "offer": offer,
                "steps_remaining": inputs.steps_remaining,
                "stop_reserve_usd": round(reserve_usd, 6),
            },
        )
        branch = {
            Choice.SPOT: self.spot_task_id,
            Choice.ON_DEMAND: self.on_demand_task_id,
            Choice.WAIT: self.wait_task_id,
            Choice.STOP: self.stop_task_id,
        }[decision.choice]
        return branch or None

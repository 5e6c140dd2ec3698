"""BudgetBranchOperator: train on spot, on on-demand, wait for a better price, or stop."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseBranchOperator

from airflow_dtrain.templating import is_template
from trainer.budget import FIRST_SAVE_GUESS_S
from trainer.config import CheckpointConfig, CostConfig
from trainer.cost import stop_reserve_s

DEFAULT_STOP_RESERVE_S = stop_reserve_s(
    FIRST_SAVE_GUESS_S, CheckpointConfig().grace_period_s, CostConfig().stop_margin_s
)
"""What the bundled trainer keeps back with its defaults (its first-save guess and the stop margin, before the
platform deadline's grace period and margin): 175 s of the group."""

if TYPE_CHECKING:
    from airflow.sdk import Context

_NUMBERS = (
    "total_steps", "budget_usd", "step_time_estimate_s", "num_nodes", "spot_price", "on_demand_price",
    "interruption_rate_per_hour", "max_interruption_rate_per_hour", "restart_overhead_s", "lost_work_s",
    "deadline_s", "waited_s", "max_wait_s", "wait_interval_s", "wait_target_price", "max_spot_price",
    "spot_nodes_available", "max_late_risk", "min_finish_chance", "stop_reserve_s",
)  # fmt: skip


class BudgetBranchOperator(BaseBranchOperator):
    """
    Choose how the job goes on from what is left to train, the prices and the money left.

    Reads the cost ledger and the measured step time from the latest committed checkpoint
    manifest under ``checkpoint_uri`` (``airflow_dtrain.spot.ledger``), takes the spot offer
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
    :param checkpoint_uri: the job's checkpoint directory (local path or ``s3://``): under the storage roots,
    and the
        run's owner's directory of ``job`` (``airflow_dtrain.trust``); read, never written here. (templated)
    :param job: the job whose ledger this is (None: any job of the run's owner, e.g. a sweep's shared ledger).
        (templated)
    :param limits: the DAG author's limits (``airflow_dtrain.trust.Limits``), within the platform admin's: the
        prices a run gives (``spot_price``, ``on_demand_price``, ``max_spot_price``) are at most
        ``max_price_per_node_hour``, the directory lies under ``storage_roots``.
    :param total_steps: optimizer steps of the whole job. (templated)
    :param budget_usd: the job's budget in US$, across every run, retry and preemption (None: no budget).
    (templated)
    :param step_time_estimate_s: seconds per step before one has been measured. (templated)
    :param num_nodes: nodes of the group. (templated)
    :param price_task_id: a ``SpotPriceSensor`` whose XCom gives ``spot_price`` and ``on_demand_price``.
    :param spot_price: spot $/node-hour (wins over ``price_task_id``). (templated)
    :param on_demand_price: on-demand $/node-hour (wins over ``price_task_id``). (templated)
    :param interruption_rate_per_hour: expected interruptions of the group per hour on spot. (templated)
    :param max_interruption_rate_per_hour: above this risk, spot is not used. (templated)
    :param restart_overhead_s: time one interruption costs besides lost work. (templated)
    :param lost_work_s: work lost per interruption. (templated)
    :param deadline_s: seconds left to finish (None: no deadline). (templated)
    :param waited_s: how long the job has waited for spot so far. (templated)
    :param max_wait_s: how long it may wait for spot in all (0: never). (templated)
    :param wait_interval_s: how long one wait lasts. (templated)
    :param wait_target_price: the spot $/node-hour a wait hopes for (default: ``max_spot_price``,
        else the offer's ``limit`` from ``price_task_id``, else the current spot or on-demand price).
        (templated)
    :param max_spot_price: a spot offer above this $/node-hour is not acceptable: the decision is
        then to wait for a better price (if waiting is allowed), on-demand, or stop. (templated)
    :param spot_nodes_available: spot nodes of the offer that can be had at once (None: as many as the
        group needs; fewer than ``num_nodes`` is no spot at all). (templated)
    :param max_late_risk: the chance of a preemption before the spot run is done (over its start-up and its
        work) up to which spot is used without keeping time to finish on on-demand after one (0: always
        kept). (templated)
    :param min_finish_chance: train on spot when its chance of finishing within the remaining budget, and
        by ``deadline_s``, is at least this (preemptions at ``interruption_rate_per_hour``, each costing
        ``restart_overhead_s`` + ``lost_work_s``), even if its expected cost or time is over them; the
        trainer's budget cap stops the run at the budget when the preemptions are unkind (None: the expected
        spot cost and hours must fit). (templated)
    :param allow_late: when neither capacity can finish by ``deadline_s`` within the budget, finish
        late within it (spot, on-demand or a wait for spot) rather than stop. (templated)
    :param stop_reserve_s: seconds of the group that the training task keeps back of the money left, to stop
        within the cap (``trainer.cost.stop_reserve_s``: the bundled trainer's save and exit, then the
        platform budget deadline's grace period and margin, which also stop a program of your own); the
        decision spends only the money left beyond them, counted as the trainer counts them, at its price
        ceiling: the on-demand price when there is one, since a spot price can rise to it while the group
        runs; the lower price for a fixed-price offer (``source`` "fixed": the local backend). Default: the
        bundled trainer's defaults, 175 s. (templated)
    """

    template_fields: Sequence[str] = ("checkpoint_uri", "job", "allow_late", *_NUMBERS)

    def __init__(
        self,
        *,
        spot_task_id: str | list[str],
        on_demand_task_id: str,
        wait_task_id: str | None = None,
        stop_task_id: str | None = None,
        checkpoint_uri: str | None = None,
        job: str | None = None,
        limits: dict[str, Any] | None = None,
        total_steps: int | str,
        budget_usd: float | str | None = None,
        step_time_estimate_s: float | str | None = None,
        num_nodes: int | str = 1,
        price_task_id: str | None = None,
        spot_price: float | str | None = None,
        on_demand_price: float | str | None = None,
        interruption_rate_per_hour: float | str = 0.05,
        max_interruption_rate_per_hour: float | str | None = None,
        restart_overhead_s: float | str = 600.0,
        lost_work_s: float | str = 0.0,
        deadline_s: float | str | None = None,
        waited_s: float | str = 0.0,
        max_wait_s: float | str = 0.0,
        wait_interval_s: float | str = 900.0,
        wait_target_price: float | str | None = None,
        max_spot_price: float | str | None = None,
        spot_nodes_available: int | str | None = None,
        max_late_risk: float | str = 0.0,
        min_finish_chance: float | str | None = None,
        allow_late: bool | str = True,
        stop_reserve_s: float | str = DEFAULT_STOP_RESERVE_S,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.spot_task_id = spot_task_id
        self.on_demand_task_id = on_demand_task_id
        self.wait_task_id = wait_task_id
        self.stop_task_id = stop_task_id
        self.checkpoint_uri = checkpoint_uri
        self.job = job
        self.limits = limits
        self.total_steps = total_steps
        self.budget_usd = budget_usd
        self.step_time_estimate_s = step_time_estimate_s
        self.num_nodes = num_nodes
        self.price_task_id = price_task_id
        self.spot_price = spot_price
        self.on_demand_price = on_demand_price
        self.interruption_rate_per_hour = interruption_rate_per_hour
        self.max_interruption_rate_per_hour = max_interruption_rate_per_hour
        self.restart_overhead_s = restart_overhead_s
        self.lost_work_s = lost_work_s
        self.deadline_s = deadline_s
        self.waited_s = waited_s
        self.max_wait_s = max_wait_s
        self.wait_interval_s = wait_interval_s
        self.wait_target_price = wait_target_price
        self.max_spot_price = max_spot_price
        self.spot_nodes_available = spot_nodes_available
        self.max_late_risk = max_late_risk
        self.min_finish_chance = min_finish_chance
        self.allow_late = allow_late
        self.stop_reserve_s = stop_reserve_s
        self._numbers(skip_templates=True)  # fail in the DAG file for what is not templated

    def _numbers(self, *, skip_templates: bool = False) -> dict[str, float | None]:
        prefix = f"{type(self).__name__}(task_id={self.task_id!r}): "
        out: dict[str, float | None] = {}
        for name in _NUMBERS:
            value = getattr(self, name)
            if skip_templates and is_template(value):
                continue
            if value is None or value == "" or value == "None":
                out[name] = None
                continue
            try:
                number = float(value)
            except (TypeError, ValueError):
                raise ValueError(f"{prefix}{name}: expected a number, got {value!r}") from None
            if number < 0 or number != number:
                raise ValueError(f"{prefix}{name}: must be >= 0, got {value!r}")
            out[name] = number
        for name in ("total_steps", "num_nodes"):
            if name in out and (out[name] is None or out[name] < 1 or out[name] != int(out[name])):
                raise ValueError(f"{prefix}{name}: must be an integer >= 1, got {getattr(self, name)!r}")
        for name in ("max_late_risk", "min_finish_chance"):
            if out.get(name) is not None and out[name] > 1:
                raise ValueError(f"{prefix}{name}: must be a chance in [0, 1], got {getattr(self, name)!r}")
        if not (skip_templates and is_template(self.allow_late)):
            self._allow_late()
        return out

    def _allow_late(self) -> bool:
        value = self.allow_late
        if isinstance(value, str) and value.strip().lower() in ("true", "false"):
            return value.strip().lower() == "true"
        if not isinstance(value, bool):
            raise ValueError(
                f"{type(self).__name__}(task_id={self.task_id!r}): allow_late: expected true or false, got "
                f"{value!r}"
            )
        return value

    def _prices(
        self, context: Context, numbers: dict[str, float | None]
    ) -> tuple[float | None, float | None, dict]:
        offer: dict[str, Any] = {}
        if self.price_task_id:
            offer = context["ti"].xcom_pull(task_ids=self.price_task_id) or {}
            if not offer:
                self.log.info("No spot offer from task %s (skipped or not run)", self.price_task_id)
        spot = numbers["spot_price"] if numbers["spot_price"] is not None else offer.get("spot_price")
        od = (
            numbers["on_demand_price"]
            if numbers["on_demand_price"] is not None
            else offer.get("on_demand_price")
        )
        cap = numbers.get("max_spot_price")
        if spot is not None and cap is not None and float(spot) > cap:
            self.log.info(
                "Spot price $%.4f/h is above max_spot_price $%.4f/h: no acceptable spot offer", spot, cap
            )
            spot = None
        return spot, od, offer

    def _check_trust(self, context: Context, numbers: dict[str, Any]) -> None:
        """Before the ledger is read or a branch taken: the run's prices within the limits, its directory
        under the
        storage roots and its owner's (another team's ledger is neither read nor billed)."""
        from airflow_dtrain.errors import SpecError
        from airflow_dtrain.trust import check_job_dir, limits_for, owner_of

        limits = limits_for(self.limits)
        try:
            for name in ("spot_price", "on_demand_price", "max_spot_price", "wait_target_price"):
                limits.check_price(name, numbers.get(name))
            if self.checkpoint_uri:
                limits.check_uri("checkpoint_uri", str(self.checkpoint_uri))
                job = None if self.job in (None, "", "None") else str(self.job)
                if self.job == "":
                    raise SpecError(
                        "job: '' is empty: name the job (its checkpoints, ledger and models are found by it)"
                    )
                check_job_dir(str(self.checkpoint_uri), owner=owner_of(context), job=job, claim=False)
        except SpecError as err:
            raise SpecError(f"{type(self).__name__}(task_id={self.task_id!r}): {err}") from None

    def _check_prices(self, spot: Any, on_demand: Any) -> None:
        from airflow_dtrain.errors import SpecError
        from airflow_dtrain.trust import limits_for

        limits = limits_for(self.limits)
        try:
            limits.check_price("spot price", spot)
            limits.check_price("on-demand price", on_demand)
        except SpecError as err:
            raise SpecError(f"{type(self).__name__}(task_id={self.task_id!r}): {err}") from None

    def choose_branch(self, context: Context) -> str | list[str] | None:
        from airflow_dtrain import metrics
        from airflow_dtrain.spot.budget import BudgetInputs, Choice, decide
        from airflow_dtrain.spot.ledger import Ledger, read_ledger

        n = self._numbers()
        self._check_trust(context, n)
        ledger = read_ledger(self.checkpoint_uri) if self.checkpoint_uri else Ledger()
        for bad in ledger.skipped:  # the trainer's resume skips them too (and verifies the shards as well)
            self.log.warning(
                "Checkpoint %s skipped: its %s check failed for %s: %s",
                bad["checkpoint"],
                bad["check"],
                bad["file"],
                bad["detail"],
            )
        spot, od, offer = self._prices(context, n)
        self._check_prices(spot, od)  # a trigger-set local price arrives through the price task's offer
        steps_remaining = max(0, int(n["total_steps"]) - ledger.step)
        step_time = ledger.step_time_s or n["step_time_estimate_s"]
        remaining = None if n["budget_usd"] is None else n["budget_usd"] - ledger.total_dollars
        # the training task stops with this much of the group's time left (the trainer's save and exit, then
        # the
        # platform deadline's grace and margin): money the run cannot spend on training, at the price the
        # trainer
        # counts it at, its price ceiling. A market's spot price can rise to on-demand while the group runs
        # (EC2
        # never bills spot above it), so both capacities keep their reserve at on-demand; counted at the spot
        # price
        # a spot run could be admitted only to stop after a few steps. A fixed price (the local backend's
        # offer)
        # cannot move: the lowest price known, as before.
        fixed = offer.get("source") == "fixed"
        known = [float(p) for p in (spot, od) if p is not None]
        price = float(od) if od is not None and not fixed else min(known, default=0.0)
        reserve_usd = (n["stop_reserve_s"] or 0.0) * int(n["num_nodes"]) * price / 3600
        if remaining is not None and reserve_usd:
            self.log.info(
                "Money left $%.4f, of which $%.4f is kept back for the training task's stop "
                "(stop_reserve_s=%.0f "
                "of %d node(s) at $%.4f/h): $%.4f to train with",
                remaining,
                reserve_usd,
                n["stop_reserve_s"],
                int(n["num_nodes"]),
                price,
                remaining - reserve_usd,
            )
            remaining -= reserve_usd
        self.log.info(
            "Ledger: step %d of %d, $%.2f spent (%s), step time %s s (%s)",
            ledger.step, int(n["total_steps"]), ledger.total_dollars, ledger.path or "no checkpoint yet",
            step_time, "measured" if ledger.step_time_s else "estimate",
        )  # fmt: skip
        inputs = BudgetInputs(
            steps_remaining=steps_remaining,
            step_time_s=step_time,
            num_nodes=int(n["num_nodes"]),
            spot_price=None if spot is None else float(spot),
            on_demand_price=None if od is None else float(od),
            remaining_budget=None if remaining is None else max(0.0, remaining),
            interruption_rate_per_hour=n["interruption_rate_per_hour"] or 0.0,
            max_interruption_rate_per_hour=(
                n["max_interruption_rate_per_hour"]
                if n["max_interruption_rate_per_hour"] is not None
                else float("inf")
            ),
            restart_overhead_s=n["restart_overhead_s"] or 0.0,
            lost_work_s=n["lost_work_s"] or 0.0,
            deadline_s=n["deadline_s"],
            waited_s=n["waited_s"] or 0.0,
            max_wait_s=n["max_wait_s"] or 0.0,
            wait_interval_s=n["wait_interval_s"] or 900.0,
            wait_target_price=next(
                (
                    p
                    for p in (n["wait_target_price"], n["max_spot_price"], offer.get("limit"))
                    if p is not None
                ),
                None,
            ),
            spot_nodes_available=None
            if n["spot_nodes_available"] is None
            else int(n["spot_nodes_available"]),
            max_late_risk=n["max_late_risk"] or 0.0,
            min_finish_chance=n["min_finish_chance"],
            allow_late=self._allow_late(),
        )
        decision = decide(inputs)
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
        context["ti"].xcom_push(
            key="decision",
            value={
                **decision.to_dict(),
                "ledger": ledger.to_dict(),
                "offer": offer,
                "steps_remaining": steps_remaining,
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

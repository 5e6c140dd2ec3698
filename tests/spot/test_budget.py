"""The budget policy, table by table, and BudgetBranchOperator on real checkpoint manifests."""

from __future__ import annotations

import pytest

from airflow_dtrain.operators.budget_branch import BudgetBranchOperator
from airflow_dtrain.spot.budget import decide
from airflow_dtrain.spot.estimates import BudgetInputs, Choice
from trainer.checkpoint.directory import CheckpointDir
from tests.spot.conftest import write_manifest

# 1,000 steps × 3.6 s = 1 h on 2 nodes: on-demand 2 × $3.06 = $6.12;
# spot at $1.20 with the default risk: 1 h × (1 + 0.05 × 600/3600) × 2 × 1.20 = $2.42
BASE = dict(steps_remaining=1000, step_time_s=3.6, num_nodes=2, spot_price=1.20, on_demand_price=3.06)
SPOT_COST = 1 * (1 + 0.05 * 600 / 3600) * 2 * 1.20


@pytest.mark.parametrize(
    ("case", "overrides", "choice", "reason"),
    [
        ("cheap spot, big budget", dict(remaining_budget=100.0), Choice.SPOT, "spot: 1.00 h × 2 node(s)"),
        ("no budget at all", dict(remaining_budget=None), Choice.SPOT, "within no budget"),
        (
            "spot exactly at budget",
            dict(remaining_budget=SPOT_COST),
            Choice.SPOT,
            f"${SPOT_COST:.2f} within ${SPOT_COST:.2f}",
        ),
        (
            "a cent below the spot estimate",
            dict(remaining_budget=SPOT_COST - 0.01),
            Choice.STOP,
            "spot estimate $2.42 exceeds",
        ),
        (
            "on-demand exactly at budget",
            dict(spot_price=None, remaining_budget=6.12),
            Choice.ON_DEMAND,
            "$6.12 within $6.12",
        ),
        (
            "on-demand over budget, no spot",
            dict(spot_price=None, remaining_budget=6.11),
            Choice.STOP,
            "on-demand estimate $6.12 exceeds",
        ),
        (
            "nothing remaining",
            dict(steps_remaining=0, remaining_budget=0.0),
            Choice.STOP,
            "no steps remaining",
        ),
        ("budget spent", dict(remaining_budget=0.0), Choice.STOP, "exceeds the remaining budget $0.00"),
        (
            "unknown step time with a budget",
            dict(step_time_s=None, remaining_budget=50.0),
            Choice.STOP,
            "unknown step time",
        ),
        ("unknown step time, no budget", dict(step_time_s=None), Choice.SPOT, "spot"),
        (
            "no prices at all",
            dict(spot_price=None, on_demand_price=None, remaining_budget=50.0),
            Choice.STOP,
            "no price known",
        ),
        ("only a spot price", dict(on_demand_price=None, remaining_budget=50.0), Choice.SPOT, "spot"),
        (
            "only on-demand",
            dict(spot_price=None, remaining_budget=50.0),
            Choice.ON_DEMAND,
            "no acceptable spot offer",
        ),
        (
            "spot too risky",
            dict(interruption_rate_per_hour=0.5, max_interruption_rate_per_hour=0.2, remaining_budget=50.0),
            Choice.ON_DEMAND,
            "interruption risk 0.500/h above 0.200/h",
        ),
        (
            "no spot offer, may wait, time to spare",
            dict(spot_price=None, remaining_budget=50.0, max_wait_s=3600, deadline_s=3 * 3600),
            Choice.WAIT,
            "wait 900 s",
        ),
        (
            "no spot offer, waited enough",
            dict(spot_price=None, remaining_budget=50.0, max_wait_s=3600, waited_s=3600, deadline_s=3 * 3600),
            Choice.ON_DEMAND,
            "on-demand",
        ),
        (
            "no spot offer, a wait would miss the deadline",
            dict(spot_price=None, remaining_budget=50.0, max_wait_s=3600, deadline_s=3600 + 600),
            Choice.ON_DEMAND,
            "on-demand",
        ),
        (
            "spot too slow for the deadline",
            dict(remaining_budget=50.0, deadline_s=3600),
            Choice.ON_DEMAND,
            "past the deadline",
        ),
        (
            "only spot fits the budget, none offered: wait for it",
            dict(spot_price=None, remaining_budget=3.0, max_wait_s=3600, wait_target_price=1.2),
            Choice.WAIT,
            "wait",
        ),
        (
            "only spot would fit, waiting not allowed",
            dict(spot_price=None, remaining_budget=3.0),
            Choice.STOP,
            "exceeds",
        ),
    ],
)
def test_decision_table(case, overrides, choice, reason):
    decision = decide(BudgetInputs(**{**BASE, **overrides}))
    assert decision.choice == choice, (case, decision.reason)
    assert reason in decision.reason, (case, decision.reason)
    # never launches work whose estimate exceeds the remaining budget
    budget = overrides.get("remaining_budget")
    if budget is not None and decision.choice in (Choice.SPOT, Choice.ON_DEMAND):
        cost = decision.spot_cost if decision.choice == Choice.SPOT else decision.on_demand_cost
        assert round(cost, 6) <= round(budget, 6)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("steps_remaining", -1),
        ("step_time_s", 0.0),
        ("num_nodes", 0),
        ("spot_price", -1.0),
        ("wait_interval_s", 0),
    ],
)
def test_invalid_inputs_name_the_field(field, value):
    with pytest.raises(ValueError, match=f"{field}: invalid value {value!r}"):
        BudgetInputs(**{**BASE, field: value})


# -- the ledger ------------------------------------------------------------------------------


def test_ledger_reads_the_latest_committed_manifest(tmp_path):
    write_manifest(tmp_path, 100, spot_dollars=10.0, step_time_s=2.0)
    write_manifest(tmp_path, 300, spot_dollars=25.5, on_demand_dollars=4.5, step_time_s=2.5)
    write_manifest(tmp_path, 400, spot_dollars=99.0, committed=False)  # an interrupted save

    ledger = CheckpointDir(str(tmp_path)).ledger()

    assert (ledger.step, ledger.step_time_s, ledger.total_dollars) == (300, 2.5, 30.0)
    assert ledger.by_capacity["on_demand"]["dollars"] == 4.5
    assert ledger.gpu_hours == pytest.approx(30.0 / 3.06 * 8)
    assert ledger.path.endswith("step-00000300")


def test_ledger_before_any_checkpoint_is_empty(tmp_path):
    assert CheckpointDir(str(tmp_path / "nothing")).ledger().total_dollars == 0.0
    assert CheckpointDir(str(tmp_path / "nothing")).ledger().path is None


def test_ledger_with_a_malformed_cost_names_the_manifest_and_field_and_uses_the_one_before(tmp_path):
    write_manifest(tmp_path, 50, spot_dollars=1.0)
    write_manifest(tmp_path, 100, cost={"spot": {"dollars": "lots"}})
    ledger = CheckpointDir(str(tmp_path)).ledger()
    assert (ledger.step, ledger.total_dollars) == (50, 1.0)
    [skipped] = ledger.skipped
    assert "step-00000100/manifest.json: cost.spot: expected numbers" in skipped["detail"]


# -- the operator ----------------------------------------------------------------------------


class _TI:
    def __init__(self, xcoms=None):
        self.pulled = xcoms or {}
        self.pushed = {}

    def xcom_pull(self, task_ids=None, key="return_value"):
        return self.pulled.get(task_ids)

    def xcom_push(self, key, value):
        self.pushed[key] = value


def _branch(**kwargs) -> BudgetBranchOperator:
    """The operator with no stop reserve unless a test gives one: these tests check the policy's inputs."""
    arguments = dict(
        task_id="budget", spot_task_id="train_spot", on_demand_task_id="train_on_demand",
        wait_task_id="wait_for_price", stop_task_id="stop", total_steps=10_000, num_nodes=2, stop_reserve_s=0,
    )  # fmt: skip
    return BudgetBranchOperator(**{**arguments, **kwargs})


def test_the_money_the_training_task_keeps_back_to_stop_is_not_spent_on_training(tmp_path):
    """The bundled trainer stops with its save and exit, and the platform deadline's grace and margin, still
    paid for (175 s of the group with the defaults): a job whose estimate fits the money left but not beyond
    that reserve is not launched, since it would stop at once, having paid for its start-up."""
    write_manifest(
        tmp_path, 9_900, spot_dollars=29.8, step_time_s=1.8
    )  # 100 steps left: 180 s, $0.12 of spot
    kwargs = dict(checkpoint_uri=str(tmp_path), budget_usd=30.1, spot_price=1.168, on_demand_price=3.06)
    ti = _TI()
    assert _branch(**kwargs).choose_branch({"ti": ti}) == "train_spot"  # $0.30 left, and no reserve counted
    default = BudgetBranchOperator(task_id="b", spot_task_id="s", on_demand_task_id="o", total_steps=1)
    assert default.stop_reserve_s == 175  # the bundled trainer's, with its defaults
    ti = _TI()
    assert _branch(**kwargs, stop_reserve_s=175).choose_branch({"ti": ti}) == "stop"
    decision = ti.pushed["decision"]
    # 175 s of 2 nodes at the trainer's price ceiling, on-demand's $3.06 also for spot: $0.2975, leaving
    # $0.0025. (At the spot price, $0.1136, the $0.12 of spot would have fitted: a run launched to stop after
    # a few steps.)
    assert decision["stop_reserve_usd"] == pytest.approx(175 * 2 * 3.06 / 3600, abs=1e-6)
    assert "exceeds the remaining budget $0.00" in decision["reason"], decision["reason"]

    # A fixed price (the local backend's offer) cannot rise while the group runs: the reserve is at the lower
    # one.
    from airflow_dtrain.spot.offers import fixed_price_choice

    offer = fixed_price_choice(price_per_hour=1.168, on_demand_price=3.06).to_dict()
    ti = _TI({"spot_price": offer})
    fixed = _branch(
        checkpoint_uri=str(tmp_path), budget_usd=30.1, price_task_id="spot_price", stop_reserve_s=175
    )
    assert fixed.choose_branch({"ti": ti}) == "train_spot"
    assert ti.pushed["decision"]["stop_reserve_usd"] == pytest.approx(175 * 2 * 1.168 / 3600, abs=1e-6)


def test_branch_uses_the_ledger_and_the_sensors_offer(tmp_path):
    # 4,000 of 10,000 steps done, $20 spent, 1.8 s/step measured: 3 h left
    write_manifest(tmp_path, 4000, spot_dollars=20.0, step_time_s=1.8)
    offer = {"spot_price": 1.168, "on_demand_price": 3.06, "instance_type": "p3.2xlarge"}
    ti = _TI({"spot_price": offer})

    branch = _branch(checkpoint_uri=str(tmp_path), budget_usd=30.0, price_task_id="spot_price").choose_branch(
        {"ti": ti}
    )

    assert branch == "train_spot"
    decision = ti.pushed["decision"]
    assert decision["steps_remaining"] == 6000 and decision["remaining_budget"] == pytest.approx(10.0)
    assert decision["spot_cost"] == pytest.approx(3 * (1 + 0.05 / 6) * 2 * 1.168)
    assert decision["ledger"]["total_dollars"] == 20.0


def test_branch_stops_when_the_money_left_does_not_cover_the_rest(tmp_path):
    write_manifest(tmp_path, 4000, spot_dollars=25.0, step_time_s=1.8)
    ti = _TI()
    branch = _branch(
        checkpoint_uri=str(tmp_path), budget_usd=30.0, spot_price=1.168, on_demand_price=3.06
    ).choose_branch({"ti": ti})
    assert branch == "stop"
    assert "spot estimate $7.07 exceeds the remaining budget $5.00" in ti.pushed["decision"]["reason"]


def test_branch_before_the_first_checkpoint_uses_the_estimate_or_stops(tmp_path):
    ti = _TI()
    kwargs = dict(
        checkpoint_uri=str(tmp_path / "new"), budget_usd=100.0, spot_price=None, on_demand_price=3.06
    )
    assert _branch(step_time_estimate_s=1.0, **kwargs).choose_branch({"ti": ti}) == "train_on_demand"
    assert _branch(**kwargs).choose_branch({"ti": ti}) == "stop"
    assert "unknown step time" in ti.pushed["decision"]["reason"]


def test_branch_with_a_deadline_but_no_step_time_and_no_budget_takes_on_demand(tmp_path):
    # nothing can show that spot, with its preemptions, finishes by the deadline: on-demand, and the reason
    # says why
    ti = _TI()
    kwargs = dict(checkpoint_uri=str(tmp_path / "new"), spot_price=1.0, on_demand_price=3.06, deadline_s=3600)
    assert _branch(**kwargs).choose_branch({"ti": ti}) == "train_on_demand"
    assert "no step time to show that spot finishes by the deadline" in ti.pushed["decision"]["reason"]


def test_branch_when_the_job_is_done(tmp_path):
    write_manifest(tmp_path, 10_000, spot_dollars=12.0)
    ti = _TI()
    assert (
        _branch(checkpoint_uri=str(tmp_path), budget_usd=100.0, spot_price=1.0).choose_branch({"ti": ti})
        == "stop"
    )
    assert ti.pushed["decision"]["reason"].startswith("no steps remaining")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        # the job's own settings, by their declarations (TrainConfig.steps, CostConfig.budget_usd, JobSpec):
        ({"total_steps": 0}, "total_steps: must be >= 1, got 0"),
        ({"budget_usd": -5}, "budget_usd: must be > 0, got -5"),
        ({"budget_usd": 0}, "budget_usd: must be > 0, got 0"),  # None is the one spelling of no budget
        ({"num_nodes": 1.5}, "num_nodes: expected an integer, got 1.5"),
        ({"num_nodes": "0"}, "num_nodes: must be >= 1, got 0"),
        ({"spot_price": "cheap"}, "spot_price: expected a number, got 'cheap'"),
        ({"spot_price": -1}, "spot_price: must be >= 0, got -1"),
    ],
)
def test_bad_arguments_fail_when_the_dag_is_parsed(kwargs, message):
    with pytest.raises(ValueError, match="BudgetBranchOperator\\(task_id='budget'\\)") as err:
        _branch(**kwargs)
    assert message in str(err.value)


def test_branch_passes_the_group_and_lateness_inputs_to_the_policy(tmp_path):
    # 2 of the 4 spot nodes: no spot; on-demand over budget; late is not allowed: stop, and the reason says so
    ti = _TI()
    kwargs = dict(
        checkpoint_uri=str(tmp_path / "new"),
        budget_usd=5.0,
        step_time_estimate_s=3.6,
        total_steps=1000,
        num_nodes=4,
        spot_price=1.0,
        on_demand_price=3.06,
        spot_nodes_available="2",
        allow_late="false",
    )
    assert _branch(**kwargs).choose_branch({"ti": ti}) == "stop"
    assert "only 2 of the 4 spot nodes" in ti.pushed["decision"]["reason"]
    assert "allow_late is off" in ti.pushed["decision"]["reason"]
    # the fourth node is there: spot
    assert _branch(**{**kwargs, "spot_nodes_available": 4}).choose_branch({"ti": ti}) == "train_spot"


def test_branch_passes_min_finish_chance_to_the_policy(tmp_path):
    # $4.50 left for $4 of spot at best and $4.73 expected (2 preemptions/h of 330 s): stop on expectation,
    # spot when a 32 % chance of finishing within the budget is enough (a templated string, as a Param gives
    # it)
    ti = _TI()
    kwargs = dict(
        checkpoint_uri=str(tmp_path / "new"),
        budget_usd=4.5,
        step_time_estimate_s=3.6,
        total_steps=1000,
        num_nodes=4,
        spot_price=1.0,
        on_demand_price=3.0,
        interruption_rate_per_hour=2.0,
        restart_overhead_s=300,
        lost_work_s=30,
    )
    assert _branch(**kwargs).choose_branch({"ti": ti}) == "stop"
    assert _branch(**kwargs, min_finish_chance="0.25").choose_branch({"ti": ti}) == "train_spot"
    assert "32% chance of finishing within $4.50" in ti.pushed["decision"]["reason"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"allow_late": "sometimes"}, "allow_late: expected true or false, got 'sometimes'"),
     ({"max_late_risk": 1.5}, "max_late_risk: must be a chance in [0, 1], got 1.5"),
     ({"min_finish_chance": "2"}, "min_finish_chance: must be a chance in [0, 1], got 2.0")],
)  # fmt: skip
def test_bad_lateness_arguments_fail_when_the_dag_is_parsed(kwargs, message):
    with pytest.raises(ValueError, match="BudgetBranchOperator\\(task_id='budget'\\)") as err:
        _branch(**kwargs)
    assert message in str(err.value)

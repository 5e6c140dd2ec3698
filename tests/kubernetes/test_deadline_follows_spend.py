"""An elastic group that runs on fewer nodes spends more slowly than its Job's budget deadline assumed at the
launch (``num_nodes`` throughout): the watch moves activeDeadlineSeconds later by what it did not spend, so
that the cluster does not stop it with money left, and never past the job's max_runtime_s. The time ahead
stays priced on num_nodes: a group that grows back is covered with nobody watching."""

from __future__ import annotations

import json
import logging
import time

import pytest

from airflow_dtrain.kubernetes.launcher import KubernetesLauncher
from airflow_dtrain.session.group import GroupSession
from airflow_dtrain.session.watch import GroupWatch
from airflow_dtrain.job.spec import JobSpec
from tests.conftest import RecordingTI
from tests.kubernetes.conftest import Background
from tests.kubernetes.test_budget_deadline_kubernetes import _finish, _operator, _wait

# fixtures: the zone's spot price history
from tests.spot.conftest import moto_server, spot_market  # noqa: F401

BUDGET, PRICE = 5.0, 3.6  # 2 nodes cost $7.20/h: the budget buys 2,500 s of both, 5,000 s of one
GRACE, MARGIN = 110, 30
LAUNCH_DEADLINE = 2500 - GRACE - MARGIN  # 2,360 s


def _deadline(fake, name: str) -> tuple[int, dict]:
    job = fake.get("jobs", name)
    return job["spec"]["activeDeadlineSeconds"], json.loads(
        job["metadata"]["annotations"]["airflow-dtrain/deadline"]
    )


def _one_node_s(launcher: KubernetesLauncher, name: str) -> float:
    """Seconds the group has run on 1 node, by the pod times its launcher records."""
    changes = launcher.node_changes(name)
    assert [n for _, n in changes] == [2, 1], changes
    return time.time() - changes[1][0]


def test_a_spot_group_on_one_of_its_two_nodes_gets_a_later_deadline_for_what_it_did_not_spend(
    fake, tmp_path, spot_market
):
    """At the quoted price throughout, node 1 lost for good (no replacement allowed): every second on one
    node leaves half a second more of the budget, and the Job's deadline moves that much later."""
    spot_market.set("us-east-1", {("p3.2xlarge", "us-east-1a"): [(3, PRICE)]})
    op = _operator(tmp_path, capacity="spot", zone="us-east-1a", instance_type="p3.2xlarge", min_nodes=1,
                   max_preemptions=0, spot_price_refresh_s=0.5)  # fmt: skip
    ti = RecordingTI()
    task = Background(op.execute, {"ti": ti})
    name = _wait(lambda: ti.xcoms.get("group"), "the group", task)
    assert abs(_deadline(fake, name)[0] - LAUNCH_DEADLINE) <= 1
    fake.run(name)
    time.sleep(1.1)  # pod times have whole seconds, as the API's
    fake.exit(name, 1, 75)  # node 1 saved its step and left; the group trains on node 0

    seconds, said = _wait(lambda: (d := _deadline(fake, name))[0] >= LAUNCH_DEADLINE + 3 and d,
                          "a later deadline", task)  # fmt: skip
    on_one = _one_node_s(KubernetesLauncher(), name)
    assert seconds - LAUNCH_DEADLINE <= on_one / 2 + 2  # not more than what one node's absence saved
    assert said["nodes"] == 2 and said["usd_per_hour"] == pytest.approx(2 * PRICE)  # the time ahead: both
    assert "repriced" in said and said["spent_usd"] > 0

    _finish(fake, name, tmp_path / "ckpt")
    summary = task.result()
    assert "stopped" not in summary and summary["preemptions"] == 0


@pytest.mark.parametrize("max_runtime_s", [None, LAUNCH_DEADLINE + 2])
def test_an_on_demand_group_on_fewer_nodes_gets_a_later_deadline_up_to_max_runtime(
    fake, tmp_path, max_runtime_s
):
    """Without a price feed the watch moves the deadline itself, at every ``deadline_every_s``, once the
    group changed size; the job's max_runtime_s stays the ceiling."""
    spec = JobSpec.from_arguments(
        flavor="debug", steps=20, global_batch_size=4, micro_batch_size=2, num_nodes=2, min_nodes=1,
        backend="kubernetes", checkpoint_uri=str(tmp_path / "ckpt"), budget_usd=BUDGET,
        price_per_node_hour=PRICE, max_preemptions=0, max_runtime_s=max_runtime_s,
        kubernetes={"image": "ghcr.io/acme/dtrain:test",
                    "volumes": [{"claim": "checkpoints", "mount_path": str(tmp_path)}]},
    )  # fmt: skip
    launcher = KubernetesLauncher()
    session = GroupSession(launcher, "deadline", spec, log=logging.getLogger("test"))
    name = session.launch(0)
    watch = GroupWatch(launcher, name, ledger_uri=session.spend_uri(), deadline=session.deadline_terms(),
                       deadline_every_s=0.0)  # fmt: skip
    fake.run(name)
    watch.poll()
    assert _deadline(fake, name)[0] == min(LAUNCH_DEADLINE, max_runtime_s or LAUNCH_DEADLINE)
    time.sleep(1.1)
    fake.exit(name, 1, 75)

    def later():
        watch.poll()
        seconds, said = _deadline(fake, name)
        return (seconds >= LAUNCH_DEADLINE + 2 or _one_node_s(launcher, name) > 8) and (seconds, said)

    seconds, said = _wait(later, "the watch to move the deadline")
    if max_runtime_s is None:
        assert LAUNCH_DEADLINE + 2 <= seconds <= LAUNCH_DEADLINE + _one_node_s(launcher, name) / 2 + 2
        assert "repriced" in said
    else:
        assert seconds == max_runtime_s and said["by"] == "max_runtime_s", said
    launcher.stop(name, grace_period_s=0)

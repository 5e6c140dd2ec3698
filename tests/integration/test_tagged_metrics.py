"""Two runs training at once, on the local backend (real torchrun, gloo), both reporting to one real UDP
statsd listener: every datagram names its run, and no series of one run holds a value of the other."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from airflow_dtrain import FSDPTrainOperator
from airflow_dtrain.job.naming import group_base_name
from tests.conftest import RecordingTI
from tests.integration.helpers import SMALL, group_events
from trainer.report.metrics import PER_RANK_METRICS
from trainer.base.statsd import RANK_TAGS, RUN_TAGS, parse_line

pytestmark = pytest.mark.torchrun

DAG_ID = "train_llama"
# run_ids as Airflow writes them: ':' and '+' in a tag value
RUNS = {"manual__2026-05-01T09:30:00+00:00": 1e-3, "scheduled__2026-05-01T10:00:00+00:00": 4e-3}


def _train_events(state_dir: Path, group: str) -> list[dict]:
    """The run's own "train" events, from its group's events files."""
    return group_events(state_dir, group, "train")


def _train_concurrently(tmp_path: Path, state_dir: Path) -> dict[str, dict]:
    """Both RUNS at once, each an FSDPTrainOperator of 2 ranks in a thread of its own: their summaries."""
    results: dict[str, dict] = {}
    errors: list[BaseException] = []

    def train(run_id: str, lr: float, seed: int) -> None:
        op = FSDPTrainOperator(
            **SMALL, task_id="train", steps=6, lr=lr, seed=seed, num_nodes=1, procs_per_node=2,
            checkpoint_uri=str(tmp_path / f"ckpt-{seed}"), local_state_dir=str(state_dir), poll_interval=0.5,
            deferrable=False,
        )  # fmt: skip
        try:
            results[run_id] = op.execute({"ti": RecordingTI(dag_id=DAG_ID, run_id=run_id)})
        except BaseException as err:  # reported below, in the test's thread
            errors.append(err)

    threads = [
        threading.Thread(target=train, args=(run_id, lr, seed))
        for seed, (run_id, lr) in enumerate(RUNS.items())
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=400)
    assert not errors, errors
    assert set(results) == set(RUNS) and all(r["final_step"] == 6 for r in results.values()), results
    return results


def test_two_concurrent_runs_send_separate_tagged_series(tmp_path, statsd_listener):
    state_dir = tmp_path / "groups"
    results = _train_concurrently(tmp_path, state_dir)
    groups = {run_id: results[run_id]["group"] for run_id in RUNS}

    lines = [parse_line(line) for line in list(statsd_listener.lines)]
    assert lines, "no datagram arrived"
    # both reported at once: each run's first datagram arrived before the other's last
    order = [t.get("run_id") for *_, t in lines]
    for a, b in (list(RUNS), list(RUNS)[::-1]):
        assert order.index(a) < len(order) - 1 - order[::-1].index(b), "the runs did not overlap"
    jobs = {run_id: group_base_name(DAG_ID, run_id, "train", -1) for run_id in RUNS}  # no job: the task's own
    for name, value, kind, tags in lines:
        # every datagram carries the task instance and the job, and they belong together
        assert set(RUN_TAGS) <= set(tags), (name, tags)
        assert tags["run_id"] in RUNS, (name, tags)
        assert (tags["dag_id"], tags["task_id"], tags["map_index"], tags["job"]) == (
            DAG_ID,
            "train",
            "-1",
            jobs[tags["run_id"]],
        ), (name, tags)
        per_rank = name.removeprefix("dtrain.") in PER_RANK_METRICS
        assert (set(RANK_TAGS) <= set(tags)) == per_rank, (name, tags)

    def series(run_id: str, name: str) -> list[float]:
        return [v for n, v, _, t in lines if n == name and t["run_id"] == run_id]

    for run_id, lr in RUNS.items():
        events = _train_events(state_dir, groups[run_id])
        assert [e["step"] for e in events] == [2, 4, 6]
        # each run's series hold exactly its own values, in order, and none of the other's
        assert series(run_id, "dtrain.train.loss") == [e["loss"] for e in events]
        assert series(run_id, "dtrain.train.lr") == [e["lr"] for e in events]
        assert series(run_id, "dtrain.train.step") == [2, 4, 6]
        # per rank: both ranks of the run, each on node 0
        ranks = {(t["node"], t["rank"]) for n, _, _, t in lines
                 if n == "dtrain.train.peak_memory_bytes" and t["run_id"] == run_id}  # fmt: skip
        assert ranks == {("0", "0"), ("0", "1")}, ranks
        # the orchestration side: this run's launch, and its spend at the end, under the same tags
        assert series(run_id, "dtrain.group.launches") == [1]
        assert series(run_id, "dtrain.cost.dollars")
    first, second = (series(r, "dtrain.train.loss") for r in RUNS)
    assert not set(first) & set(second), "the two runs' losses are not told apart by this test's data"

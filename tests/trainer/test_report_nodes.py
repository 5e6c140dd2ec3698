"""report.png shows an elastic group's node count over time, each resize a marker labelled with its cost.

The ledger is the real one on disk (the job's spend files, as the provider writes them); the markers are read
from the figure before it is saved, and the report is saved too.
"""

from __future__ import annotations

import dataclasses

import pytest

from trainer.checkpoint.directory import CheckpointDir
from trainer.config.job_config import TrainConfig
from trainer.report.eval_report import RunRecord, _nodes_axis, plot
from trainer.money.bill import resizes

T0 = 1_800_000_000.0
LATEST = {"flavor": "debug", "loss": 2.5, "step": 8}


def _ledger(tmp_path) -> CheckpointDir:
    """One elastic attempt: 4 nodes for 10 min, 3 for 5 min, 4 again for 15 min, then the end."""
    root = CheckpointDir(str(tmp_path / "ckpt"))
    changes = [[T0, 4], [T0 + 600, 3], [T0 + 900, 4], [T0 + 1800, 0]]
    root.record_spend("job-r0", {"launched_at": T0, "nodes": 4, "price_per_node_hour": 3.6, "billed_s": 1800,
                                 "dollars": 6.9, "node_changes": changes, "capacity": "spot"})  # fmt: skip
    return root


def test_each_resize_is_found_with_the_dollars_of_the_interval_it_ends(tmp_path):
    entry = _ledger(tmp_path).spend_entry("job-r0")
    assert resizes(entry) == [
        {"at": T0 + 600, "nodes_before": 4, "nodes": 3, "usd": pytest.approx(4 * 600 * 3.6 / 3600)},
        {"at": T0 + 900, "nodes_before": 3, "nodes": 4, "usd": pytest.approx(3 * 300 * 3.6 / 3600)},
    ]
    assert resizes({"launched_at": T0, "nodes": 2}) == []  # all or nothing: no resize, no marker


def test_the_report_marks_each_resize_with_its_cost(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    root = _ledger(tmp_path)
    run = RunRecord.read(root, TrainConfig())
    assert run.nodes == [(T0, 4), (T0 + 600, 3), (T0 + 900, 4), (T0 + 1800, 0)]

    fig, ax = plt.subplots()
    labels = _nodes_axis(ax, run)
    nodes_ax = fig.axes[-1]
    line = next(line for line in nodes_ax.get_lines() if line.get_label() == "nodes")
    assert list(line.get_xdata()) == [0.0, 10.0, 15.0, 30.0] and list(line.get_ydata()) == [4, 3, 4, 0]
    assert [t.get_text() for t in labels] == ["4→3 nodes, \\$2.4000", "3→4 nodes, \\$0.9000"]
    assert [t.xy for t in labels] == [(10.0, 3), (15.0, 4)]
    plt.close(fig)

    plot(str(tmp_path / "report.png"), run, [(8, 2.5)], LATEST)
    assert (tmp_path / "report.png").stat().st_size > 10_000


def test_a_run_without_resizes_draws_no_node_axis(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run = dataclasses.replace(RunRecord.read(_ledger(tmp_path), TrainConfig()), nodes=[], resizes=[])
    fig, ax = plt.subplots()
    assert _nodes_axis(ax, run) == [] and fig.axes == [ax]
    plt.close(fig)

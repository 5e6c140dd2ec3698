"""An elastic group's spec (#39): which sizes it may train at, who bounds them, and the torchrun flags that
let its agents meet again without a relaunch."""

from __future__ import annotations

import pytest

from airflow_dtrain.errors import SpecError
from airflow_dtrain.launchers.torchrun import node_command
from airflow_dtrain.job.spec import JobSpec
from airflow_dtrain.trust.limits import Limits


def _flag(args: tuple[str, ...], name: str) -> str:
    return args[args.index(name) + 1]


def test_an_elastic_group_trains_at_every_size_from_min_nodes_with_the_same_global_batch():
    spec = JobSpec.from_arguments(num_nodes=4, min_nodes=2, global_batch_size=12, micro_batch_size=1)
    assert spec.elastic and spec.fewest_nodes == 2
    for nodes in (2, 3, 4):  # gradient accumulation absorbs the size
        assert spec.train.grad_accum_steps(nodes) * nodes == 12


@pytest.mark.parametrize(
    ("arguments", "refusal"),
    [
        ({"num_nodes": 2, "min_nodes": 3}, r"^min_nodes: 3 is more than num_nodes 2$"),
        ({"num_nodes": 4, "min_nodes": 2, "global_batch_size": 4, "micro_batch_size": 1,
          "config": {"parallel": {"replicate_degree": 2}}},
         r"^min_nodes: 2 lets the group train on 3 node\(s\) × procs_per_node 1, and there "
         r"parallel.replicate_degree: 2 replica groups do not divide world size 3"),
        ({"num_nodes": 2, "min_nodes": 0}, r"min_nodes"),
    ],
)  # fmt: skip
def test_a_min_nodes_the_group_could_not_train_at_is_refused_before_anything_runs(arguments, refusal):
    with pytest.raises(SpecError, match=refusal):
        JobSpec.from_arguments(**arguments)


def test_an_elastic_group_trains_at_sizes_that_do_not_divide_its_global_batch():
    """16 nodes down to 8 would need a global batch divisible by lcm(8..16) = 720,720 sequences per process:
    instead the shares are uneven (``parallel.uneven_batch``), a fixed group's stay refused."""
    spec = JobSpec.from_arguments(num_nodes=16, min_nodes=8, procs_per_node=8, global_batch_size=1024,
                                  micro_batch_size=2)  # fmt: skip
    assert spec.train.parallel.uneven_batch
    assert [spec.train.grad_accum_steps(n * 8) for n in (8, 9, 15, 16)] == [8, 8, 5, 4]
    assert not JobSpec.from_arguments(num_nodes=2, global_batch_size=8).train.parallel.uneven_batch
    with pytest.raises(SpecError, match=r"global_batch_size 1024 is not divisible by world size 72"):
        JobSpec.from_arguments(num_nodes=9, procs_per_node=8, global_batch_size=1024, micro_batch_size=2)


def test_min_nodes_equal_to_num_nodes_is_all_or_nothing():
    spec = JobSpec.from_arguments(num_nodes=2, min_nodes=2)
    assert not spec.elastic and spec.fewest_nodes == 2
    args = node_command("g", spec, rdzv_endpoint="127.0.0.1:1", config_path="c.json").args
    assert _flag(args, "--nnodes") == "2" and _flag(args, "--max-restarts") == "0"


def test_the_author_bounds_how_many_nodes_a_group_may_miss():
    spec = JobSpec.from_arguments(num_nodes=4, min_nodes=1, global_batch_size=12, micro_batch_size=1)
    with pytest.raises(SpecError, match=r"above the limit of 1 \(limits.max_missing_nodes\)"):
        Limits(max_missing_nodes=1).check(spec)
    Limits(max_missing_nodes=3).check(spec)
    # the author narrows the admin's limit, never widens it
    assert Limits(max_missing_nodes=2).narrowed(Limits(max_missing_nodes=5)).max_missing_nodes == 2
    assert Limits().narrowed(Limits(max_missing_nodes=0)).max_missing_nodes == 0


def test_an_elastic_node_waits_for_a_replacement_then_goes_on_and_restarts_only_its_workers():
    spec = JobSpec.from_arguments(
        num_nodes=4, min_nodes=2, global_batch_size=12, micro_batch_size=1,
        replace_timeout_s=7.5, min_nodes_timeout_s=90, max_preemptions=5,
    )  # fmt: skip
    args = node_command("g", spec, rdzv_endpoint="127.0.0.1:1", config_path="c.json", is_host=True).args
    assert _flag(args, "--nnodes") == "2:4"
    assert _flag(args, "--rdzv-conf") == "is_host=1,last_call_timeout=8,join_timeout=90"
    assert _flag(args, "--max-restarts") == "5"
    assert args.count("--rdzv-conf") == 1  # torchrun takes one, comma-separated

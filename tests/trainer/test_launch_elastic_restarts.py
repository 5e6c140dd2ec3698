"""An elastic node's agent restarts its workers for a resumable exit only (trainer/launch.py): a peer lost or
a node joining makes them save and meet again; a crash, a fenced or full-disk save or the cap end the node
at once, as in an all-or-nothing group."""

from __future__ import annotations

import pytest
from torch.distributed.elastic.agent.server.api import RunResult, WorkerState
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

from trainer import launch
from trainer.config.job_config import BUDGET_EXIT_CODE, FENCED_EXIT_CODE, STORAGE_EXIT_CODE


class _Agent:
    _remaining_restarts = 3


@pytest.fixture
def monitor_returning(monkeypatch):
    """The agent's monitor, wrapped by ``restart_only_the_resumable``, seeing workers end with ``codes``."""

    def make(codes: list[int]):
        def monitor(self, worker_group):
            failures = {
                rank: ProcessFailure(local_rank=rank, pid=100 + rank, exitcode=code, error_file="")
                for rank, code in enumerate(codes)
            }
            return RunResult(state=WorkerState.FAILED if failures else WorkerState.HEALTHY, failures=failures)

        monkeypatch.setattr(LocalElasticAgent, "_monitor_workers", monitor)
        launch.restart_only_the_resumable()
        return LocalElasticAgent._monitor_workers

    return make


@pytest.mark.parametrize("codes", [[75, 75], [76, 75], [-9, 76], []])
def test_a_resumable_exit_keeps_the_agents_restarts(monitor_returning, codes):
    agent = _Agent()
    monitor_returning(codes)(agent, None)
    assert agent._remaining_restarts == 3


@pytest.mark.parametrize("code", [1, FENCED_EXIT_CODE, STORAGE_EXIT_CODE, BUDGET_EXIT_CODE])
def test_any_other_exit_ends_the_node_without_a_restart(monitor_returning, code):
    agent = _Agent()
    result = monitor_returning([75, code])(agent, None)
    assert agent._remaining_restarts == 0 and result.is_failed()

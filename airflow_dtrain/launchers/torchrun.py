"""The command every node of a pod group runs: one torchrun agent (``python -m trainer.launch``).

Both backends build it here, so a node runs the same agent with the same rendezvous on this
machine and in a pod; only what differs between them is a parameter: where the rendezvous
store is, whether this node hosts it, where torchrun keeps its per-rank logs, where the
trainer's config is, and which interpreter runs it. Pure function, stdlib only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from airflow_dtrain.job.spec import JobSpec

LAUNCH_MODULE = "trainer.launch"
"""torchrun with exit codes that say "preempted" (see trainer/launch.py)."""

SHARED_STORE_OPT_OUT = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"
"""torch's switch off of the rendezvous store shared with the workers (dynamic_rendezvous.py)."""


@dataclass(frozen=True)
class NodeCommand:
    """One node's command: ``executable`` (interpreter and module) then torchrun's ``args``."""

    executable: tuple[str, ...]
    args: tuple[str, ...]

    @property
    def argv(self) -> list[str]:
        return [*self.executable, *self.args]


def agent_env(spec: JobSpec) -> dict[str, str]:
    """The environment of every node's torchrun agent, whatever its entrypoint.

    torchrun forwards SIGTERM to its workers and SIGKILLs them ``TORCH_ELASTIC_SHUTDOWN_TIMEOUT``
    seconds later (30 by default): a preemption save of a large model takes longer, so the
    window is the job's ``checkpoint.grace_period_s`` (the platform's own grace period, which
    the pods' ``terminationGracePeriodSeconds`` covers with a margin, is the outer bound). Your
    own entrypoint gets the same window.

    And the job's contract with a program of your own (``trainer/contract.py``, docs/own_training_code.md):
    where its checkpoints go, the job's name, its steps, how often to save, how long a preemption save
    may take, for tests and demos the step at which to simulate one, and the DogStatsD tags its metrics
    carry (``DTRAIN_STATSD_TAGS``: the task instance and the job). And the group's own settings that its
    agents read (``keep_workers``, ``warm_before_join``, ``fork_workers``, ``resize_poll_s``).
    """
    train = spec.train
    env = {
        "PYTHONUNBUFFERED": "1",
        "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "[rank${rank}]:",
        "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": str(math.ceil(train.checkpoint.grace_period_s)),
        "DTRAIN_CHECKPOINT_URI": train.checkpoint.uri,
        "DTRAIN_JOB": train.job,
        "DTRAIN_STEPS": str(train.steps),
        "DTRAIN_CHECKPOINT_EVERY": str(train.checkpoint.every),
        "DTRAIN_GRACE_PERIOD_S": f"{train.checkpoint.grace_period_s:g}",
    }
    if spec.elastic:
        # torch shares rank 0's first TCP store with its workers and publishes its address once, in the first
        # round's keys: a replacement node joining a later round waits for that address forever (and its
        # peers for it). Without the sharing, each round's rank 0 publishes a fresh address.
        env[SHARED_STORE_OPT_OUT] = "1"
    # The group's settings its agents and workers read (trainer/base/wiring.py), where not their defaults:
    # unset, the trainer takes the default.
    switched_off = {
        "DTRAIN_KEEP_WORKERS": not spec.keep_workers,
        "DTRAIN_WARM_BEFORE_JOIN": not spec.warm_before_join,
        "DTRAIN_FORK_WORKERS": not spec.fork_workers,
    }
    env.update({name: "0" for name, off in switched_off.items() if off})
    if spec.resize_poll_s != type(spec).resize_poll_s:
        env["DTRAIN_RDZV_POLL_S"] = f"{spec.resize_poll_s:g}"
    if train.simulate_preemption_at_step:
        env["DTRAIN_SIMULATE_PREEMPTION_AT_STEP"] = str(train.simulate_preemption_at_step)
    if train.owner:  # who the job belongs to (FSDPTrainOperator sets it once the directory is theirs)
        env["DTRAIN_OWNER"] = train.owner
    if train.metrics.statsd_tags:  # the task instance and job (the trainer reads its config's copy)
        env["DTRAIN_STATSD_TAGS"] = train.metrics.statsd_tags
    return env


def node_command(
    name: str,
    spec: JobSpec,
    *,
    rdzv_endpoint: str,
    config_path: str,
    python: str = "python",
    is_host: bool | None = None,
    log_dir: str | None = None,
    trainer_args: Sequence[str] = (),
) -> NodeCommand:
    """The torchrun agent of one node of group ``name`` (a list: no shell ever sees it).

    Output is unbuffered through ``PYTHONUNBUFFERED=1``, which both backends set.

    :param rdzv_endpoint: ``host:port`` of the c10d rendezvous store, the same for every node.
    :param config_path: the trainer's config file as the node sees it.
    :param python: the interpreter on the node.
    :param is_host: whether this node hosts the store (``--rdzv-conf is_host``); None: let c10d
        decide (the node whose address the endpoint resolves to hosts it, as in a pod).
    :param log_dir: torchrun's per-rank log directory, with ``--tee 3`` so the lines also reach
        the node's stdout; None: stdout only.
    :param trainer_args: extra arguments of the trainer (``--set k=v``), only when it runs the
        bundled trainer (``-m trainer --config ...``); what else a node may run: ``JobSpec.entrypoint_argv``.
    """
    nnodes = f"{spec.fewest_nodes}:{spec.num_nodes}" if spec.elastic else str(spec.num_nodes)
    args = [
        "--nnodes", nnodes,
        "--nproc-per-node", str(spec.procs_per_node),
        # c10d assigns node ranks at the rendezvous (torchrun ignores --node-rank with it, loudly)
        "--rdzv-backend", "c10d",
        "--rdzv-endpoint", rdzv_endpoint,
        "--rdzv-id", name,
    ]  # fmt: skip
    rdzv_conf = [f"is_host={int(is_host)}"] if is_host is not None else []
    if spec.elastic:
        # A lost node: its peers' workers save the step and the same agents meet again (a new rendezvous
        # round, which closes once every survivor is back and the nodes the platform says it runs are in:
        # trainer/elastic/rdzv_round.py; replace_timeout_s at most for those), then train on without it while
        # at least
        # min_nodes are there; below that for min_nodes_timeout_s, the group ends as preempted. A node that
        # joins later makes the agents restart their workers (they save first) at the bigger size. Only
        # resumable exits restart workers (trainer/launch.py), at most max_preemptions times per agent.
        rdzv_conf += [f"last_call_timeout={math.ceil(spec.replace_timeout_s)}",
                      f"join_timeout={math.ceil(spec.min_nodes_timeout_s)}"]  # fmt: skip
    if rdzv_conf:
        args += ["--rdzv-conf", ",".join(rdzv_conf)]
    # all or nothing: a lost node ends the group; the operator relaunches it from the checkpoint
    args += ["--max-restarts", str(max(1, spec.max_preemptions) if spec.elastic else 0)]
    if log_dir is not None:
        args += ["--tee", "3", "--log-dir", log_dir]
    args += spec.entrypoint_argv(config_path, trainer_args)
    return NodeCommand(executable=(python, "-m", LAUNCH_MODULE), args=tuple(args))

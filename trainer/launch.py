"""``python -m trainer.launch <torchrun arguments...>``: torchrun with meaningful exit codes.

torchrun exits 1 for every failure, so a node could not tell "preempted, resumable"
from "crashed". This maps the outcome to the node's exit code:

* all workers succeeded                                   -> 0
* a worker was fenced off (exit 78: another group took over the checkpoint
  directory; its peers may have failed with it in whatever way)          -> 78
* a worker could not write a checkpoint (exit 74: a full disk, no permission; its
  peers may have failed with it in whatever way)                          -> 74
* workers failed, every one of them with exit code 75     -> 75 (they saved and stopped)
* the agent itself got SIGTERM/SIGINT/SIGHUP (SignalException): torchrun has already
  forwarded SIGTERM to its workers and waited for them to save               -> 75
* anything else                                           -> 1

On Kubernetes it also delivers "checkpoint now" to the workers (``trainer.elastic.checkpoint_requests``).
"""

import atexit
import inspect
import logging
import os
import shutil
import signal
import sys
import tempfile

from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from torch.distributed.elastic.multiprocessing.api import PContext, SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.elastic.rendezvous.api import RendezvousClosedError, RendezvousTimeoutError
import torch.distributed.run as torchrun
from torch.distributed.run import parse_args, run

from trainer.config.job_config import (
    BUDGET_EXIT_CODE,
    FENCED_EXIT_CODE,
    PREEMPTED_EXIT_CODE,
    STORAGE_EXIT_CODE,
    WORKER_LOST_EXIT_CODE,
)
from trainer.elastic.rdzv_round import (
    close_the_round_once_all_are_in,
    name_each_world,
    replacements_warm_up_first,
    started_workers,
)
from trainer import torch_private
from trainer.elastic import warm_join, worker_host
from trainer.torch_private import elastic_hooks
from trainer.base.say import say
from trainer.elastic.checkpoint_requests import REQUESTS_FILE_ENV, watch_checkpoint_requests
from trainer.elastic.workers import AGENT_PID_ENV, FORK_ENV, remember_stops_for_restarts

_KILLED = 128 + 9  # a container runtime's way of saying SIGKILL (OOMKilled)

SHUTDOWN_TIMEOUT_ENV = "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"

_forced: list[int] = []
"""Local ranks that the agent's last close of its workers had to SIGKILL (their save, if any, cut short)."""


def _exit_codes(ctx: PContext) -> dict[int, int | None]:
    """Each worker's exit code by local rank, None while it runs."""
    if handlers := getattr(ctx, "subprocess_handlers", None):  # a command entrypoint (ours: python -m ...)
        return {rank: h.proc.poll() for rank, h in handlers.items()}
    # a Python function entrypoint (multiprocessing; None where torch's context holds them otherwise)
    return elastic_hooks.forked_exit_codes(ctx) or {}


def watch_the_agents_close() -> bool:
    """Wrap ``PContext.close``, which the agent calls to stop its workers (SIGTERM, the shutdown timeout,
    SIGKILL):

    * on a torch whose agent has no shutdown timeout, wait ``TORCH_ELASTIC_SHUTDOWN_TIMEOUT`` seconds before
      the SIGKILL. torch 2.11's ``LocalElasticAgent`` closes its workers with a fixed 30 s and reads no
      variable; seen on an H200: a 1B model's preemption save (28 s, after the async save in flight)
      finished 2 s before that SIGKILL, and a larger model's would be killed mid-save, losing every step
      since the last checkpoint. Here the default of ``PContext.close`` becomes the variable's value (every
      call in that torch leaves it to the default); a torch whose agent takes a ``shutdown_timeout`` reads
      the variable itself;
    * on every torch, note the workers it had to SIGKILL, so that the node's last line says their save was cut
      short instead of "told to save" alone. True if the timeout was patched."""
    close = getattr(PContext.close, "__wrapped__", PContext.close)
    patch_timeout = "shutdown_timeout" not in inspect.signature(LocalElasticAgent.__init__).parameters
    default_timeout = (
        int(os.environ[SHUTDOWN_TIMEOUT_ENV])
        if patch_timeout
        else inspect.signature(close).parameters["timeout"].default
    )  # torch's own default

    def close_and_note_the_killed(self, death_sig=None, timeout: int = default_timeout) -> None:
        running = [rank for rank, code in _exit_codes(self).items() if code is None]
        close(self, death_sig, timeout)
        after = _exit_codes(self)
        _forced[:] = [rank for rank in running if after.get(rank) == -signal.SIGKILL]

    close_and_note_the_killed.__wrapped__ = close
    PContext.close = close_and_note_the_killed
    return patch_timeout


RESUMABLE_EXIT_CODES = frozenset({PREEMPTED_EXIT_CODE, WORKER_LOST_EXIT_CODE})
"""Worker exits that an elastic group's agent answers by restarting its workers at a new rendezvous: they
saved their step when a peer node was lost or a new one joined (75), or lost a peer in a collective (76)."""


def restart_only_the_resumable() -> None:
    """Make an elastic group's agent (``--max-restarts`` > 0) restart its workers only for a resumable exit.

    torchrun restarts its workers after any failure while it has restarts left. Here a failure that is not
    resumable (a crash, a fenced or full-disk save, the dollar cap) leaves the agent no restart: it stops at
    once and the node's exit code says why, as in an all-or-nothing group. A worker killed by a signal is a
    lost worker (resumable, as a relaunch would be)."""

    def keep_restarts_for_the_resumable(monitor):
        def monitor_and_keep_restarts_for_the_resumable(self, worker_group):
            result = monitor(self, worker_group)
            codes = {f.exitcode for f in (result.failures or {}).values()}
            if result.is_failed() and any(c not in RESUMABLE_EXIT_CODES and c >= 0 for c in codes):
                elastic_hooks.no_restarts_left(self)
            return result

        return monitor_and_keep_restarts_for_the_resumable

    if not elastic_hooks.patch_monitor_workers(keep_restarts_for_the_resumable):
        remember_stops_for_restarts()  # the fallback: a restart after a stop for good exits with its code


def leave_the_rendezvous_on_a_signal() -> None:
    """Make a node's agent that got SIGTERM (a preemption) leave the rendezvous once its workers have saved.

    torchrun keeps a signalled agent's rendezvous open for the peers (an elastic group goes on), but the
    agent stays listed as a participant until its heartbeats are missed for ``keep_alive_interval`` ×
    ``keep_alive_max_attempt`` (15 s by default): its peers' next round waits that long before it starts.
    Leaving it at once lets them meet again in the time they take to restart their workers (hook
    ``rdzv_leave_on_signal``, ``trainer.torch_private``; where torch differs, after the heartbeats)."""
    from torch.distributed.elastic.agent.server.api import SimpleElasticAgent

    run = getattr(SimpleElasticAgent.run, "__wrapped__", SimpleElasticAgent.run)

    def run_and_leave_on_a_signal(self, *args, **kwargs):
        try:
            return run(self, *args, **kwargs)
        except SignalException:
            _leave(elastic_hooks.agent_handler(self))
            raise

    run_and_leave_on_a_signal.__wrapped__ = run
    SimpleElasticAgent.run = run_and_leave_on_a_signal


def _leave(handler) -> None:
    """Take this node out of the current rendezvous round, without closing it."""
    try:
        elastic_hooks.leave_rendezvous(handler)
        say("[trainer.launch] left the rendezvous: the peers meet again without this node")
    except Exception as err:  # noqa: BLE001 - an older or newer torch: the peers wait for the heartbeat
        say(
            f"[trainer.launch] could not leave the rendezvous ({type(err).__name__}: {err}); the peers "
            "notice this node's end when its heartbeats stop"
        )


def _failed_workers(e: ChildFailedError) -> tuple[int, str]:
    """The node's exit code and its reason when workers failed: the workers' own agreed code where they
    agree (fenced, storage, preempted, budget), a lost worker (resumable), else 1."""
    codes = sorted({f.exitcode for f in e.failures.values()})
    if FENCED_EXIT_CODE in codes:
        return (
            FENCED_EXIT_CODE,
            f"another group took over the checkpoint directory (exit codes {codes})",
        )
    elif STORAGE_EXIT_CODE in codes:
        return (
            STORAGE_EXIT_CODE,
            (
                f"a checkpoint could not be written (full disk or no permission; exit "
                f"codes {codes}): see the [trainer] line above"
            ),
        )
    elif codes == [PREEMPTED_EXIT_CODE]:
        return (
            PREEMPTED_EXIT_CODE,
            f"every failed worker exited {PREEMPTED_EXIT_CODE} (preempted, checkpoint saved)",
        )
    elif codes == [BUDGET_EXIT_CODE]:
        return BUDGET_EXIT_CODE, "every worker stopped at the job's dollar cap (checkpoint saved)"
    elif (first := e.get_first_failure()[1].exitcode) < 0 or first == _KILLED:
        # The first worker to go was killed (the OOM killer, kill -9); its peers then failed in a
        # collective or were stopped. Nothing was saved for this step: the group resumes from its
        # last committed checkpoint. (A worker that failed by itself exits >= 1 first.)
        return (
            WORKER_LOST_EXIT_CODE,
            f"a worker was killed by a signal (exit code {first}; all: {codes}); resumable",
        )
    elif WORKER_LOST_EXIT_CODE in codes:
        return (
            WORKER_LOST_EXIT_CODE,
            f"a worker lost a peer (a collective timed out or broke; all: {codes}); resumable",
        )
    else:
        return 1, f"workers failed with exit codes {codes}"


def use_a_writable_compile_cache() -> bool:
    """Keep ``TORCHINDUCTOR_CACHE_DIR`` (the job's own compile cache: in the local state directory, or on the
    admin's volume on Kubernetes) only if this node can write it; else drop it and ``TRITON_CACHE_DIR``, so
    that the workers compile into torch's default under /tmp, and say so: a cache is a speed-up, never a
    reason to fail. Returns whether the cache is used."""
    cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if not cache:
        return False
    try:
        os.makedirs(cache, exist_ok=True)
        with tempfile.TemporaryFile(dir=cache):
            pass
    except OSError as err:
        say(
            f"[trainer.launch] the job's compile cache {cache} cannot be written ({err}): the workers "
            "compile without it, into /tmp"
        )
        for key in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
            os.environ.pop(key, None)
        return False
    return True


_PRELOAD = ["torch.distributed.run", "trainer.__main__", "trainer.train", "trainer.checkpoint.faults"]


def fork_the_trainers_from_a_warm_process() -> None:
    """Make torchrun start ``python -u -m trainer ...`` workers by forking them from a fork server that
    has imported torch and the trainer once (``trainer.elastic.forked_worker``), in place of a new
    interpreter each.

    A worker's imports take some 2.5 s of CPU here (torch, its distributed checkpoint, FSDP2), paid by
    every local rank at every start and again at every restart of an elastic group's workers (a resize);
    forked, a node pays them once, while its agent meets the others (the fork server starts before the
    rendezvous, with the agent's final environment). The fork server is a process of its own, without
    threads; importing initialises no GPU, no process group and no OpenMP pool, so each worker starts
    these itself, as a new interpreter would. Any other command (a program of your own, ``--no-python``)
    and ``DTRAIN_FORK_WORKERS=0`` (``JobSpec.fork_workers=False``) keep torchrun's own start. A worker names
    itself ``dtrain-r<rank>`` (``trainer.elastic.workers``). An elastic group (``--max-restarts`` > 0) also
    keeps a host process per local rank, in which every start of its workers trains
    (``trainer.elastic.worker_host``): a resize restarts no process; they compile in a world of their own
    before the agent joins (``trainer.elastic.warm_join``)."""
    import multiprocessing
    from multiprocessing import forkserver

    config_from_args = getattr(torchrun.config_from_args, "__wrapped__", torchrun.config_from_args)
    forkserver_context = multiprocessing.get_context("forkserver")

    def config_with_forked_trainers(args):
        config, cmd, cmd_args = config_from_args(args)
        ours = cmd == sys.executable and cmd_args[:3] == ["-u", "-m", "trainer"]
        if not ours or os.environ.get(FORK_ENV, "1") == "0":
            return config, cmd, cmd_args
        from trainer.elastic.forked_worker import run as run_trainer

        # a process kept across worlds needs each world named and torch's mesh caches cleared between them
        keep = (
            config.max_restarts > 0
            and os.environ.get(worker_host.KEEP_ENV, "1") != "0"
            and torch_private.use("rdzv_name_world")
            and torch_private.use("dtensor_mesh_caches")
        )
        if keep:  # before the fork server starts: its environment is every worker's
            os.environ[worker_host.HOSTS_ENV] = hosts = tempfile.mkdtemp(prefix="dtrain-hosts-")
            atexit.register(shutil.rmtree, hosts, True)
        multiprocessing.set_forkserver_preload(_PRELOAD)
        forkserver.ensure_running()  # its imports overlap the rendezvous
        if keep:  # an elastic group: its training processes outlive a resize (started in the background)
            warm = (cmd_args[3:], config.max_nodes * config.nproc_per_node) if warm_join.enabled() else None
            warm = warm if warm and torch_private.use("fake_process_group") else None
            if warm:
                replacements_warm_up_first()
            said = worker_host.keep_training_processes(hosts, config.nproc_per_node, forkserver_context, warm)
            if said:
                say(f"[trainer.launch] {said}")
        config.start_method = "forkserver"
        return config, run_trainer, cmd_args[3:]

    config_with_forked_trainers.__wrapped__ = config_from_args
    torchrun.config_from_args = config_with_forked_trainers
    logging.getLogger(PContext.__module__).addFilter(_no_traceback_for_an_exit_code)


def _no_traceback_for_an_exit_code(record: logging.LogRecord) -> bool:
    """torch logs a forked worker's exit code with the agent's own traceback ("failed (exitcode: 74) ...",
    ``ProcessExitedException``): keep the line, drop the traceback, which says nothing of the worker (its
    own lines say why it exited), as for a worker started as a command."""
    if record.exc_info and type(record.exc_info[1]).__name__ == "ProcessExitedException":
        record.exc_info, record.exc_text = None, None
    return True


def main(argv: list[str] | None = None) -> int:
    # torchrun SIGKILLs workers this long after forwarding SIGTERM (its default is 30 s):
    # leave them the time a preemption save needs; the platform's own grace period is the real bound.
    os.environ.setdefault(SHUTDOWN_TIMEOUT_ENV, "120")
    os.environ[AGENT_PID_ENV] = str(os.getpid())  # the workers' agent (forked, their parent is not)
    watch_the_agents_close()
    restart_only_the_resumable()
    leave_the_rendezvous_on_a_signal()
    close_the_round_once_all_are_in()
    name_each_world()
    fork_the_trainers_from_a_warm_process()
    use_a_writable_compile_cache()
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if os.environ.get(REQUESTS_FILE_ENV):  # on Kubernetes: "checkpoint now" is a pod annotation, no exec
        watch_checkpoint_requests(os.environ[REQUESTS_FILE_ENV])
    try:
        run(args)
        code, why = 0, "all workers succeeded"
    except ChildFailedError as e:
        code, why = _failed_workers(e)
    except SignalException as e:
        # Still a preemption (75, relaunched, not a failure), whatever the save became: the relaunch resumes
        # from the last committed checkpoint, and a save cut short was never committed.
        code, why = PREEMPTED_EXIT_CODE, f"agent received {e.sigval.name}; workers were told to save and stop"
        if _forced:
            why += (
                f"; local rank(s) {_forced} did not stop within {os.environ[SHUTDOWN_TIMEOUT_ENV]} s "
                f"({SHUTDOWN_TIMEOUT_ENV}) and were SIGKILLed, their save cut short: the group resumes from "
                "its last committed checkpoint"
            )
    except RendezvousTimeoutError as e:  # an elastic group: fewer than min_nodes met in time
        code, why = PREEMPTED_EXIT_CODE, f"fewer nodes than the group's min_nodes joined in time ({e})"
    except RendezvousClosedError as e:  # closed by a node that ended: a late joiner has nothing to train
        late = not started_workers()
        code, why = (0, "the group had ended before this node joined") if late else (1, f"launch error: {e}")
    except Exception as e:  # rendezvous errors, bad arguments to the agent, ...
        code, why = 1, f"launcher error: {type(e).__name__}: {e}"
    say(f"[trainer.launch] exit {code}: {why}")
    return code


if __name__ == "__main__":
    sys.exit(main())

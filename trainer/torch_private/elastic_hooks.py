"""The private names of torch's elastic agent and its dynamic rendezvous, and of the training processes an
elastic node keeps across worlds: each reached only here, each the ``Hook`` of ``trainer.torch_private``
that its function asks for."""

from __future__ import annotations

import importlib
from typing import Any

from trainer.torch_private import HOOKS, OFF_ENV, fall_back, resolve, use, why_off

_DR = "torch.distributed.elastic.rendezvous.dynamic_rendezvous"


def rendezvous_join(environ: Any = None) -> tuple[Any, Any] | None:
    """(``_RendezvousJoinOp``, ``_Action``) of torch's dynamic rendezvous; None: torch's own rule."""
    if not use("rdzv_close_round", environ):
        return None
    return resolve(f"{_DR}:_RendezvousJoinOp"), resolve(f"{_DR}:_Action")


def _wrap(owner: Any, name: str, make: Any) -> None:
    """Replace ``owner.name`` with ``make(torch's)``, keeping torch's as ``__wrapped__`` (patched twice: it
    wraps torch's, not itself)."""
    original = getattr(owner, name)
    original = getattr(original, "__wrapped__", original)
    patched = make(original)
    patched.__wrapped__ = original
    setattr(owner, name, patched)


def patch_rendezvous_delay(make: Any) -> None:
    """Replace the delay between two polls of a round's state with ``make(torch's delay)``."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    _wrap(dynamic_rendezvous, "_delay", make)


def patch_agent_rendezvous(make: Any) -> bool:
    """Replace the agent's ``_rendezvous`` with ``make(torch's)``; False (the fallback said) where not."""
    if not use("rdzv_name_world"):
        return False
    from torch.distributed.elastic.agent.server.api import SimpleElasticAgent

    _wrap(SimpleElasticAgent, "_rendezvous", make)
    return True


def rendezvous_round(handler: Any) -> int | None:
    """The round of the rendezvous ``handler`` last completed; None where its state is not what torch 2.11
    to 2.14 keep (the world is then not named: ``rdzv_name_world``'s fallback)."""
    try:
        return int(handler._state_holder.state.round)
    except (AttributeError, TypeError, ValueError) as err:
        fall_back("rdzv_name_world", f"{type(err).__name__}: {err}")
        return None


def leave_rendezvous(handler: Any, timeout_s: float = 10) -> None:
    """Take this node out of the current round now (``_RendezvousExitOp``), without closing it; raises where
    this torch's handler differs (the caller says the fallback)."""
    import time

    if not use("rdzv_leave_on_signal"):
        raise LookupError(f"{OFF_ENV} or this torch: {why_off('rdzv_leave_on_signal')}")
    exit_op = resolve(f"{_DR}:_RendezvousExitOp")
    handler._stop_heartbeats()
    handler._op_executor.run(exit_op(), time.monotonic() + timeout_s)


def agent_handler(agent: Any) -> Any:
    """The rendezvous handler of ``agent``'s worker group."""
    return agent._worker_group.spec.rdzv_handler


def patch_monitor_workers(make: Any) -> bool:
    """Replace ``LocalElasticAgent._monitor_workers`` with ``make(torch's)``; False (fallback) where not."""
    if not use("agent_restarts_only_resumable"):
        return False
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

    _wrap(LocalElasticAgent, "_monitor_workers", make)
    return True


def no_restarts_left(agent: Any) -> bool:
    """Leave ``agent`` no restart of its workers; False where its state is not torch's."""
    if not hasattr(agent, "_remaining_restarts"):
        fall_back("agent_restarts_only_resumable", "the agent has no _remaining_restarts")
        return False
    agent._remaining_restarts = 0
    return True


def forked_exit_codes(ctx: Any) -> dict[int, int | None] | None:
    """Each forked worker's exit code by local rank, from a multiprocessing ``PContext``; None where the
    context holds no such processes (a command's context, or this torch's differs)."""
    if not use("agent_killed_workers"):
        return None
    pc = getattr(ctx, "_pc", None)
    processes = getattr(pc, "processes", None)
    if processes is None:
        return None
    return dict(enumerate(p.exitcode for p in processes))


def clear_mesh_caches() -> bool:
    """Clear DTensor's caches keyed by device mesh; False (fallback said) where this torch lacks them."""
    if not use("dtensor_mesh_caches"):
        return False
    resolve("torch.distributed.tensor.debug:_clear_sharding_prop_cache")()
    for spec in HOOKS["dtensor_mesh_caches"].names[1:]:
        cached = resolve(spec)
        if not hasattr(cached, "cache_clear"):
            fall_back("dtensor_mesh_caches", f"{spec} is not a cache")
            return False
        cached.cache_clear()
    return True


def register_fake_backend() -> bool:
    """Register torch's "fake" process group backend (a world of any size in one process); False where
    not (the warm-up is skipped)."""
    if not use("fake_process_group"):
        return False
    importlib.import_module("torch.testing._internal.distributed.fake_pg")  # registers "fake"
    return True

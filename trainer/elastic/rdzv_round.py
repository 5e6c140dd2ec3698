"""An elastic group's rendezvous round closes once every node still there is back, not at its last call.

torchrun closes a round at ``max_nodes``, or ``last_call_timeout`` (``JobSpec.replace_timeout_s``) after
``min_nodes`` joined. After a lost node, its survivors would so wait the whole last call for a replacement,
billed on every one of them at each loss, though on a cloud a replacement needs a new node (minutes) and joins
later with a resize of its own anyway.

Here a round after the first (a resize: its nodes were in the group before) closes as soon as:

* every node of the previous round that did not leave is in it. torch opens the new round only once the last
  participant of the previous one has left it; each survivor leaves it and waits in the wait list, which the
  round takes in. So an empty wait list means no survivor is missing;
* at least ``min_nodes`` are in, and as many as the platform says it runs (``$DTRAIN_CAPACITY_FILE``, the
  local group's capacity: its supervisor starts a replacement at once, which joins within seconds, one resize
  not two). Where nothing says (Kubernetes), none is awaited; nor where nodes compile before they join
  (``trainer.elastic.warm_join``, ``replacements_warm_up_first``): the survivors train on while the
  replacement warms up, and its join costs them a resize of seconds, less than the wait for its warm-up;
* ``REJOIN_GRACE_S`` has passed since ``min_nodes`` were in: a node between leaving the previous round and
  waiting for the next (milliseconds) is in neither list.

Otherwise the last call still applies: it is the most a round waits for a replacement it was told of.
And a resize round is polled every ``RESIZE_POLL_S`` (``JobSpec.resize_poll_s``: ``$DTRAIN_RDZV_POLL_S``),
not once a second as torch polls every round: a node sees the round close, and closes it, within a tenth of
a second, not up to a second later, and the survivors' new workers start together. A sync is one
compare-and-set of the state on the group's store: 16 nodes polling 10 times a second ask it little.
The first round (the group's launch, nodes starting at different times) is torch's own.
``DTRAIN_TORCH_PRIVATE_OFF=rdzv_close_round`` keeps torch's rule and polling for every round
(benchmarks/recovery.py compares the two).
On torch's private rendezvous join (``trainer.torch_private``, hook ``rdzv_close_round``): where it differs,
torch's rule applies, and the trainer's first line says so.
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timedelta, timezone
from typing import Any

from trainer import torch_private
from trainer.torch_private import elastic_hooks
from trainer.base.say import say

CAPACITY_FILE_ENV = "DTRAIN_CAPACITY_FILE"
"""A JSON file ``{"nodes": k}``: the nodes the platform runs the group on now (the local launcher's
``capacity.json``); a round awaits that many. Set, but no file yet: ``max_nodes``."""
REJOIN_GRACE_S = 0.3
"""How long a round that has all its survivors still waits, from when ``min_nodes`` were in: a survivor
goes from leaving the previous round to the wait list in one store round trip (milliseconds)."""
POLL_ENV = "DTRAIN_RDZV_POLL_S"
RESIZE_POLL_S = 0.1
"""How often a node polls a resize round's state (``$DTRAIN_RDZV_POLL_S``; torch: 1 s)."""
_resize = [False]  # whether the round being polled is a resize (set by the join, read by the delay)
_await_replacements = [True]  # whether a resize round awaits the platform's capacity


def replacements_warm_up_first() -> None:
    """This group's nodes compile before they join (``trainer.elastic.warm_join``): a resize round awaits no
    replacement, whatever the capacity."""
    _await_replacements[0] = False


def expected_nodes(max_nodes: int, environ: Any = None) -> int:
    """The nodes a resize round awaits beyond its survivors: the platform's capacity (at most ``max_nodes``),
    0 where it says none."""
    path = (os.environ if environ is None else environ).get(CAPACITY_FILE_ENV, "")
    if not path:
        return 0
    try:
        with open(path) as f:
            return min(max_nodes, int(json.load(f)["nodes"]))
    except FileNotFoundError:
        return max_nodes  # no capacity written: the group's own size
    except (OSError, ValueError, KeyError, TypeError):
        return 0


def all_are_in(state: Any, settings: Any, node: Any, now: datetime, expected: int) -> bool:
    """Whether ``node``, a participant of the open round ``state`` (torch's ``_RendezvousState``), may close
    it now: a resize round with every survivor in, ``min_nodes`` and ``expected`` in, the grace passed."""
    if state.complete or state.closed or state.round == 0 or node not in state.participants:
        return False
    if state.wait_list or state.deadline is None:
        return False
    if len(state.participants) < max(settings.min_nodes, expected):
        return False
    quorum_at = state.deadline - settings.timeout.last_call  # when min_nodes were in
    return now - quorum_at >= timedelta(seconds=REJOIN_GRACE_S)


def _fall_back(err: Exception) -> None:
    """The rounds wait their last call from now on: torch's rendezvous state is not what this reads."""
    torch_private.fall_back("rdzv_close_round", repr(err))


def close_the_round_once_all_are_in(environ: Any = None) -> bool:
    """Patch torch's rendezvous join (this module's docstring). True if patched."""
    found = elastic_hooks.rendezvous_join(environ)
    if found is None:  # forced off, or an older or newer torch: its own rule
        return False
    join_op, Action = found
    join = getattr(join_op.__call__, "__wrapped__", join_op.__call__)
    _poll_resize_rounds_faster(environ)

    def join_or_close(self, ctx, deadline):
        _resize[0] = getattr(ctx.state, "round", 0) > 0
        action = join(self, ctx, deadline)
        if action not in (Action.KEEP_ALIVE, Action.SYNC):
            return action
        try:
            if not all_are_in(ctx.state, ctx.settings, ctx.node, datetime.now(timezone.utc), expected=0):
                return action
            # the capacity file is read only for a round that could close, not once a second while one waits
            awaited = expected_nodes(ctx.settings.max_nodes, environ) if _await_replacements[0] else 0
            if len(ctx.state.participants) < awaited:
                return action
        except (AttributeError, TypeError) as err:  # torch's private state is not what this reads
            _fall_back(err)
            return action
        return Action.MARK_RENDEZVOUS_COMPLETE

    join_or_close.__wrapped__ = join
    join_op.__call__ = join_or_close
    return True


WORLD_ENV = "DTRAIN_WORLD"
"""``<run id>.<rendezvous round>``, given by ``trainer.launch`` to every worker it starts: the same on every
node of one world, another for the next. ``trainer.step.process_group`` prefixes the world's keys in the
group's
store with it."""
_world = [""]
_started = [False]


def current_world() -> str:
    """The name of the world this node's agent last started workers in ("" before any, or where torch's
    rendezvous state names none: ``rdzv_name_world``'s fallback)."""
    return _world[0]


def started_workers() -> bool:
    """Whether this node's agent has started workers (it joined a world)."""
    return _started[0]


def name_each_world() -> bool:
    """Give every worker the world it belongs to (``WORLD_ENV``), from the round its agent's rendezvous
    completed. The store that workers meet in (the agent's, or an elastic group's own process) outlives a
    world, and torch's workers write their keys in it unprefixed ("a new TCPStore for every retry"), which
    holds only where the agent hosts a new store each round. Elsewhere a rank of the next world could read
    a peer's key of the last one: its gloo address or NCCL id, a connection to a process that has left (or,
    in a process kept across worlds, ``trainer/elastic/worker_host.py``, to its own old group: a hang). On
    torch's private rendezvous state (``trainer.torch_private``, hook ``rdzv_name_world``): where it differs,
    no name is given, torch's keys are used, and ``trainer.launch`` keeps no training process across worlds.
    True if the worlds are named."""
    from torch.distributed.elastic.agent.server import local_elastic_agent

    start = getattr(local_elastic_agent.start_processes, "__wrapped__", local_elastic_agent.start_processes)

    def name_the_world(rendezvous):
        def rendezvous_and_name_the_world(self, worker_group):
            result = rendezvous(self, worker_group)
            handler = worker_group.spec.rdzv_handler
            round_ = elastic_hooks.rendezvous_round(handler)
            _world[0] = "" if round_ is None else f"{handler.get_run_id()}.{round_}"
            return result

        return rendezvous_and_name_the_world

    def start_named(*args, **kwargs):
        _started[0] = True
        if _world[0] and isinstance(kwargs.get("envs"), dict):
            kwargs["envs"] = {rank: {**env, WORLD_ENV: _world[0]} for rank, env in kwargs["envs"].items()}
        return start(*args, **kwargs)

    start_named.__wrapped__ = start
    local_elastic_agent.start_processes = start_named
    return elastic_hooks.patch_agent_rendezvous(name_the_world)


def _poll_s(value: str | None) -> float:
    """``$DTRAIN_RDZV_POLL_S`` as seconds; unset, or not a number of seconds > 0 (said): RESIZE_POLL_S."""
    if not value:
        return RESIZE_POLL_S
    try:
        seconds = float(value)
    except ValueError:
        seconds = 0.0
    if not 0 < seconds < float("inf"):
        say(f"[trainer.launch] {POLL_ENV}={value!r} is not seconds > 0: polling every {RESIZE_POLL_S} s")
        return RESIZE_POLL_S
    return seconds


def _poll_resize_rounds_faster(environ: Any = None) -> None:
    """Patch the delay torch's rendezvous takes between two polls of the state (1 s) to ``RESIZE_POLL_S``
    while the round is a resize; torch's own delay otherwise."""
    poll_s = _poll_s((os.environ if environ is None else environ).get(POLL_ENV))

    def poll_faster(delay):
        def delay_or_poll(seconds):
            delay(poll_s if _resize[0] and seconds == 1 else seconds)

        return delay_or_poll

    elastic_hooks.patch_rendezvous_delay(poll_faster)

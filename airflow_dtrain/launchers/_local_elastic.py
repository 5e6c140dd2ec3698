"""An elastic local group's supervision: absorb the loss of one node, replace it when capacity allows.

An elastic group (``JobSpec.min_nodes`` < ``num_nodes``) runs torchrun with ``--nnodes MIN:MAX`` and
restarts: when a node's agent ends with a resumable code (75, 76, or killed by a signal) while the group
runs, its peers' agents stay (their workers saved the step and meet again in a new rendezvous round, at
the smaller size), so the supervisor does not end them; it starts a replacement agent for that index (the
same node command) once the group's capacity allows, at most ``max_replacements`` times per group. The
replacement joins the running group: the agents see a node waiting, their workers save and restart at the
bigger size.

Capacity is the local stand-in for the spot market: ``GROUP_DIR/capacity.json`` (``{"nodes": k}``, written
by ``LocalLauncher.set_capacity``); replacements start only while fewer than ``k`` agents run (default:
``num_nodes``). Each change of the running-agent count is a line of ``GROUP_DIR/nodes.jsonl``
(``{"at", "nodes", "why"}``), what billing and metrics read (``LocalLauncher.node_changes``).

No node hosts the rendezvous store: it is a process of its own (``rdzv_store``, started by the supervisor
before the agents), so node 0's loss is absorbed and replaced as any other's (a ``group.json`` written before,
without ``rdzv_store``, still has node 0 host it: its loss is the whole group's). Below ``min_nodes``
the survivors wait ``min_nodes_timeout_s`` for a replacement in their rendezvous, then exit 75 on their own
(the group ends preempted).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainer.config.job_config import PREEMPTED_EXIT_CODE, WORKER_LOST_EXIT_CODE

CAPACITY_FILE = "capacity.json"
NODE_CHANGES_FILE = "nodes.jsonl"
HOST_INDEX = 0
"""The node that hosts the c10d store (``is_host=1``) of a group without a store of its own: losing it loses
the rendezvous."""


def resumable(code: int | None) -> bool:
    """An agent's exit that an elastic group absorbs: preempted (75), lost a peer (76), killed by a signal."""
    return code is not None and (code in (PREEMPTED_EXIT_CODE, WORKER_LOST_EXIT_CODE) or code < 0)


def elastic_terms(spec: Any) -> dict[str, int] | None:
    """``group.json``'s ``elastic`` entry for ``spec`` (a JobSpec); None for an all-or-nothing group."""
    if not spec.elastic:
        return None
    return {
        "min_nodes": spec.fewest_nodes,
        "num_nodes": spec.num_nodes,
        "max_replacements": spec.max_preemptions,
    }


def read_capacity(group_dir: Path, default: int) -> int:
    """The nodes the group may run now (``capacity.json``), ``default`` when none was written."""
    try:
        return int(json.loads((group_dir / CAPACITY_FILE).read_text())["nodes"])
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return default


def append_node_change(group_dir: Path, nodes: int, why: str) -> None:
    """One line of ``nodes.jsonl``: from now on ``nodes`` agents run (one write, appended)."""
    line = json.dumps({"at": time.time(), "nodes": nodes, "why": why}) + "\n"
    with open(group_dir / NODE_CHANGES_FILE, "a") as changes:
        changes.write(line)


def read_node_changes(group_dir: Path) -> list[tuple[float, int]]:
    """``nodes.jsonl`` as (wall-clock time, nodes from then on); [] when the group wrote none."""
    try:
        lines = (group_dir / NODE_CHANGES_FILE).read_text().splitlines()
    except FileNotFoundError:
        return []
    changes = []
    for line in lines:
        try:
            record = json.loads(line)
            changes.append((float(record["at"]), int(record["nodes"])))
        except (ValueError, KeyError, TypeError):
            continue  # a line being written
    return changes


class ElasticNodes:
    """What the supervisor's watch does for an elastic group: which ended nodes it absorbs and replaces.

    :param start: starts the agent of a node index again (the same command).
    :param say: a line for the group's log.
    """

    def __init__(self, group_dir: Path, terms: dict[str, int], start: Callable[[int], None],
                 say: Callable[[str], None], standalone_store: bool = False) -> None:  # fmt: skip
        self.group_dir, self.terms, self.start, self.say = group_dir, terms, start, say
        self.standalone_store = standalone_store  # the store is a process of its own: node 0 is like any
        self.absorbed: set[int] = set()  # nodes whose last agent's loss the group absorbed (not replaced yet)
        self.pending: list[int] = []  # of those, the ones waiting for capacity to start a replacement
        self.replacements = 0
        self.nodes = terms["num_nodes"]  # agents running at the last line of nodes.jsonl
        self.why: list[str] = []  # what changed since

    def absorb(self, index: int, code: int | None) -> bool:
        """Whether the group goes on without node ``index``'s agent, which ended with ``code``."""
        if (index == HOST_INDEX and not self.standalone_store) or not resumable(code):
            return False
        if index not in self.absorbed:
            self.absorbed.add(index)
            self.why.append(f"node {index} exited {code}")
            if self.replacements + len(self.pending) < self.terms["max_replacements"]:
                self.pending.append(index)
                self.say(
                    f"node {index} exited {code}: its peers go on; a replacement starts when capacity allows"
                )
            else:
                self.say(f"node {index} exited {code}: its peers go on; no replacement left "
                         f"({self.terms['max_replacements']} used)")  # fmt: skip
        return True

    def replace(self, running: int) -> int:
        """Start the replacements capacity allows now (``running`` agents run); returns how many started."""
        started = 0
        capacity = read_capacity(self.group_dir, self.terms["num_nodes"])
        while self.pending and running + started < capacity:
            index = self.pending.pop(0)
            self.start(index)
            self.absorbed.discard(index)
            self.replacements += 1
            started += 1
            self.why.append(f"node {index} replaced")
            self.say(f"node {index} replaced (replacement {self.replacements} of "
                     f"{self.terms['max_replacements']}; capacity {capacity})")  # fmt: skip
        return started

    def note(self, running: int) -> None:
        """A line of ``nodes.jsonl`` when a loss or a replacement changed the running-agent count (not the
        group's own end: its agents exit 0 one after the other)."""
        if running != self.nodes and self.why:
            append_node_change(self.group_dir, running, "; ".join(self.why))
            self.nodes = running
        self.why = []

    def judged(self, codes: dict[int, int | None]) -> dict[int, int | None]:
        """The exit codes that decide the group's end state: not those of the nodes it trained on without."""
        kept = {i: c for i, c in codes.items() if i not in self.absorbed}
        return kept or codes

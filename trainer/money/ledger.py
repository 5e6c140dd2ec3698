"""The spend ledger an attempt keeps: billed seconds x price x nodes, by capacity.

Node-hours accrue from the moment the attempt's group was launched (``DTRAIN_LAUNCHED_AT``,
set by the provider's launchers: start-up, image pull and rendezvous are billed too) under
the attempt's capacity type; a resumed attempt carries the ledger of the checkpoint it
resumed from, so the manifest's totals add up over preemptions and relaunches. The spend
past the last checkpoint is in the job's spend files (``trainer.checkpoint.spend_files.SPEND``:
``CostLedger.attempt_entry`` here, opened by the provider at the launch (``opening_entry``) and
finalised when the group ends), which the budget reads. The dollars are ``trainer.money.bill``'s.
Standard library only.
"""

import os
import time
from collections.abc import Callable

from trainer.money.capacity import CAPACITIES, Capacity
from trainer.money.bill import billed, dollars_at, dollars_at_prices, node_hours

CAPACITY_TYPES = CAPACITIES
"""The ledger's buckets: one per ``Capacity``."""


def nodes_in_group(world_size: int) -> int:
    """Nodes of the group: torchrun sets LOCAL_WORLD_SIZE (processes per node); one plain process is one
    node."""
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world_size) or world_size)
    return max(1, world_size // max(1, per_node))


def empty_cost() -> dict:
    return {
        **{c: {"node_hours": 0.0, "gpu_hours": 0.0, "dollars": 0.0} for c in CAPACITY_TYPES},
        "total_dollars": 0.0,
    }


LAUNCHED_AT_ENV = "DTRAIN_LAUNCHED_AT"
"""Unix time at which the provider launched this attempt's group: billing starts there."""


def launched_at(now: float | None = None) -> float:
    """When this attempt started being billed: the group's launch, else now (never in the future)."""
    now = time.time() if now is None else now
    try:
        return min(now, float(os.environ.get(LAUNCHED_AT_ENV) or now))
    except ValueError:
        return now


class CostLedger:
    def __init__(
        self,
        *,
        price_per_node_hour: float,
        capacity_type: str,
        gpus_per_node: int,
        nodes: int,
        since: float | None = None,
        clock: Callable[[], float] = time.time,
    ):
        """since: when billing started (the launch the provider recorded in this attempt's spend file);
        clock: the time billing runs on (``trainer.money.clock``: the storage's, where this node's is off)."""
        self.clock = clock
        self.price, self.capacity, self.gpus_per_node, self.nodes = (
            price_per_node_hour,
            capacity_type,
            gpus_per_node,
            nodes,
        )
        # The provider's record of the launch, on the provider's clock: this node's clock may be off (a spot
        # node's clock minutes behind would otherwise move the launch earlier in the spend file it writes).
        self.launched_at = launched_at(now=clock()) if since is None else min(since, launched_at(now=since))
        self.prior = empty_cost()
        self.prices_in_effect: list[tuple[float, float]] = []
        """``[(since, usd_per_node_hour), ...]``: the spot prices in effect since the launch, as the
        provider last read them (``trainer.checkpoint.spend_files.PRICES``); empty: the launch price is all
        there is."""
        self.node_changes: list[tuple[float, int]] = []
        """``[(at, nodes), ...]``: an elastic group's sizes since the launch, as the provider recorded them in
        this attempt's spend file (``trainer.money.bill``); empty: ``nodes`` throughout."""
        self._step_seconds, self._steps_timed = 0.0, 0
        self._prior_step_time: float | None = None

    def carry(self, manifest_cost: dict | None, step_time_s: float | None = None) -> None:
        """Start from the ledger (and step time) of the checkpoint this attempt resumed from."""
        self._prior_step_time = step_time_s
        prior = empty_cost()
        for key, entry in (manifest_cost or {}).items():
            try:  # buckets of older manifests are spelled as they were ("local", "on-demand")
                bucket = Capacity(key).value
            except ValueError:
                continue
            for k in ("node_hours", "gpu_hours", "dollars"):
                prior[bucket][k] += float((entry or {}).get(k, 0.0) or 0.0)
        prior["total_dollars"] = sum(prior[c]["dollars"] for c in CAPACITY_TYPES)
        self.prior = prior

    def at_prices_in_effect(self, until: float) -> float | None:
        """This attempt's dollars up to ``until`` at the prices in effect (None: no price has been read since
        the launch). Seconds before the first price read are at the launch price."""
        if not self.prices_in_effect:
            return None
        prices = self.prices_in_effect
        if min(t for t, _ in prices) > self.launched_at:  # no price read covers the launch: the quote does
            prices = [(self.launched_at, self.price), *prices]
        return dollars_at_prices(self.launched_at, until, self.nodes, prices, self.node_changes)

    def current_price(self) -> float:
        """The price of a node-hour now: the newest price read, else the launch price."""
        return max(self.prices_in_effect)[1] if self.prices_in_effect else self.price

    def snapshot(self) -> dict:
        """The cumulative ledger as of now, in the manifest's shape."""
        now = self.clock()
        hours = node_hours(self.launched_at, now, self.nodes, self.node_changes)
        out = {c: dict(v) for c, v in self.prior.items() if c in CAPACITY_TYPES}
        mine = out[Capacity(self.capacity).value]
        mine["node_hours"] += hours
        mine["gpu_hours"] += hours * self.gpus_per_node
        at_launch = dollars_at(self.launched_at, now, self.nodes, self.price, self.node_changes)
        mine["dollars"] += max(at_launch, self.at_prices_in_effect(now) or 0.0)
        for c in CAPACITY_TYPES:
            out[c] = {k: round(v, 9) for k, v in out[c].items()}
        out["total_dollars"] = round(sum(out[c]["dollars"] for c in CAPACITY_TYPES), 9)
        return out

    def attempt_entry(self, **extra) -> dict:
        """This attempt's spend file as of now (``trainer.checkpoint.spend_files.SPEND``): at the launch
        price, or at the prices in effect where that is more."""
        now = self.clock()
        entry = {
            "capacity": Capacity(self.capacity).value,
            "nodes": self.nodes,
            "price_per_node_hour": self.price,
            "gpus_per_node": self.gpus_per_node,
            "launched_at": self.launched_at,
            **({"node_changes": [[t, n] for t, n in self.node_changes]} if self.node_changes else {}),
            **extra,
        }
        entry = billed(entry, until=now)
        at_prices = self.at_prices_in_effect(now)
        if at_prices is not None:
            entry.update(dollars_at_launch_price=entry["dollars"],
                         dollars_at_prices_in_effect=round(at_prices, 9),
                         dollars=max(entry["dollars"], round(at_prices, 9)))  # fmt: skip
        return entry

    # -- step time ---------------------------------------------------------------------
    def time_step(self, seconds: float) -> None:
        self._step_seconds += seconds
        self._steps_timed += 1

    @property
    def step_time_s(self) -> float | None:
        """Measured mean seconds per optimizer step of this attempt (else the resumed checkpoint's)."""
        if self._steps_timed:
            return round(self._step_seconds / self._steps_timed, 6)
        return self._prior_step_time


def opening_entry(cost, nodes: int, at: float) -> dict:
    """An attempt's spend file as the provider opens it at the launch, before any pod or process exists:
    nothing billed yet. ``cost`` is the attempt's ``CostConfig`` (capacity, price, GPUs, the job's budget)."""
    return {
        "capacity": Capacity(cost.capacity_type).value, "nodes": nodes,
        "price_per_node_hour": cost.price_per_node_hour, "gpus_per_node": cost.gpus_per_node,
        "launched_at": at, "billed_s": 0.0, "node_hours": 0.0, "gpu_hours": 0.0, "dollars": 0.0,
        "budget_usd": cost.budget_usd,
    }  # fmt: skip

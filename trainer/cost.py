"""The cost ledger each checkpoint manifest carries (read by airflow_dtrain.spot.ledger).

Node-hours accrue from the moment the attempt's group was launched (``DTRAIN_LAUNCHED_AT``,
set by the provider's launchers: start-up, image pull and rendezvous are billed too) under
the attempt's capacity type; a resumed attempt carries the ledger of the checkpoint it
resumed from, so the manifest's totals add up over preemptions and relaunches. The spend
past the last checkpoint is in the job's spend files (``trainer.checkpoint_dir.SPEND``:
``attempt_entry`` here, finalised by the provider when the group ends), which the budget
reads. Standard library only.
"""

import os
import time

from trainer.capacity import CAPACITIES, Capacity

CAPACITY_TYPES = CAPACITIES
"""The ledger's buckets: one per ``Capacity``."""


def nodes_in_group(world_size: int) -> int:
    """Nodes of the group: torchrun sets LOCAL_WORLD_SIZE (processes per node); one plain process is one node."""
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


def stop_reserve_s(save_s: float, grace_period_s: float, stop_margin_s: float) -> float:
    """Seconds of money the bundled trainer keeps back when it decides whether to go on: its own stop (the final
    save and ``cost.stop_margin_s`` for the exit and the node's release), done before the platform's budget
    deadline, which itself comes ``checkpoint.grace_period_s`` and ``cost.stop_margin_s`` before the money runs
    out (``airflow_dtrain.launchers.base.budget_deadline``: what ends a hung trainer within the budget). So a
    trainer that stops itself is never cut short by the deadline, and a hung one is killed within the budget."""
    return (save_s + stop_margin_s) + (grace_period_s + stop_margin_s)


def billed(entry: dict, *, until: float) -> dict:
    """``entry`` (an attempt's spend file) with its node-hours and dollars as of ``until``, never less
    than it already says (the trainer's last write and the provider's view of the end agree or the larger wins)."""
    seconds = max(0.0, until - float(entry["launched_at"]))
    node_hours = entry["nodes"] * seconds / 3600
    out = dict(entry)
    out["billed_s"] = max(float(entry.get("billed_s", 0.0)), round(seconds, 3))
    out["node_hours"] = max(float(entry.get("node_hours", 0.0)), round(node_hours, 9))
    out["gpu_hours"] = max(
        float(entry.get("gpu_hours", 0.0)), round(node_hours * entry.get("gpus_per_node", 0), 9)
    )
    out["dollars"] = max(
        float(entry.get("dollars", 0.0)), round(node_hours * entry["price_per_node_hour"], 9)
    )
    out["updated_at"] = until
    return out


def dollars_at_prices(start: float, end: float, nodes: int, prices) -> float | None:
    """Dollars for ``nodes`` nodes from ``start`` to ``end`` (unix seconds), each second at the price in effect
    then; ``prices`` is ``[(since, usd_per_node_hour), ...]``, in any order. None when no price was in effect
    at ``start`` (a history that begins later cannot say what the first seconds cost)."""
    points = sorted((float(t), float(p)) for t, p in prices)
    if not points or points[0][0] > start:
        return None
    usd_seconds = 0.0
    for i, (since, price) in enumerate(points):
        until = points[i + 1][0] if i + 1 < len(points) else end
        usd_seconds += price * max(0.0, min(until, end) - max(since, start))
    return nodes * usd_seconds / 3600


class CostLedger:
    def __init__(
        self,
        *,
        price_per_node_hour: float,
        capacity_type: str,
        gpus_per_node: int,
        nodes: int,
        since: float | None = None,
    ):
        """since: when billing started (the launch the provider recorded in this attempt's spend file)."""
        self.price, self.capacity, self.gpus_per_node, self.nodes = (
            price_per_node_hour,
            capacity_type,
            gpus_per_node,
            nodes,
        )
        self.launched_at = launched_at() if since is None else min(since, launched_at())
        self.prior = empty_cost()
        self.prices_in_effect: list[tuple[float, float]] = []
        """``[(since, usd_per_node_hour), ...]``: the spot prices in effect since the launch, as the provider
        last read them (``trainer.checkpoint_dir.PRICES``); empty: the launch price is all there is."""
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
        """This attempt's dollars up to ``until`` at the prices in effect (None: no price has been read since the
        launch). Seconds before the first price read are at the launch price."""
        if not self.prices_in_effect:
            return None
        prices = self.prices_in_effect
        if min(t for t, _ in prices) > self.launched_at:  # no price read covers the launch: the quote does
            prices = [(self.launched_at, self.price), *prices]
        return dollars_at_prices(self.launched_at, until, self.nodes, prices)

    def current_price(self) -> float:
        """The price of a node-hour now: the newest price read, else the launch price."""
        return max(self.prices_in_effect)[1] if self.prices_in_effect else self.price

    def snapshot(self) -> dict:
        """The cumulative ledger as of now, in the manifest's shape."""
        now = time.time()
        node_hours = self.nodes * (now - self.launched_at) / 3600
        out = {c: dict(v) for c, v in self.prior.items() if c in CAPACITY_TYPES}
        mine = out[Capacity(self.capacity).value]
        mine["node_hours"] += node_hours
        mine["gpu_hours"] += node_hours * self.gpus_per_node
        mine["dollars"] += max(node_hours * self.price, self.at_prices_in_effect(now) or 0.0)
        for c in CAPACITY_TYPES:
            out[c] = {k: round(v, 9) for k, v in out[c].items()}
        out["total_dollars"] = round(sum(out[c]["dollars"] for c in CAPACITY_TYPES), 9)
        return out

    def attempt_entry(self, **extra) -> dict:
        """This attempt's spend file as of now (``trainer.checkpoint_dir.SPEND``): at the launch price, or at the
        prices in effect where that is more."""
        now = time.time()
        entry = {
            "capacity": Capacity(self.capacity).value,
            "nodes": self.nodes,
            "price_per_node_hour": self.price,
            "gpus_per_node": self.gpus_per_node,
            "launched_at": self.launched_at,
            **extra,
        }
        entry = billed(entry, until=now)
        at_prices = self.at_prices_in_effect(now)
        if at_prices is not None:
            entry.update(dollars_at_launch_price=entry["dollars"], dollars_at_prices_in_effect=round(at_prices, 9),
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

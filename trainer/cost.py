"""The cost ledger each checkpoint manifest carries (read by airflow_dtrain.spot.ledger).

Node-hours accrue from the start of an attempt (start-up is billed too) under the
attempt's capacity type; a resumed attempt carries the ledger of the checkpoint it
resumed from, so the totals add up over preemptions and relaunches. Spend past that
checkpoint by an attempt that died without saving is not in the ledger. Standard
library only.
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
    return {**{c: {"node_hours": 0.0, "gpu_hours": 0.0, "dollars": 0.0} for c in CAPACITY_TYPES}, "total_dollars": 0.0}


class CostLedger:
    def __init__(self, *, price_per_node_hour: float, capacity_type: str, gpus_per_node: int, nodes: int):
        self.price, self.capacity, self.gpus_per_node, self.nodes = (
            price_per_node_hour, capacity_type, gpus_per_node, nodes)
        self.start = time.monotonic()
        self.prior = empty_cost()
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

    def snapshot(self) -> dict:
        """The cumulative ledger as of now, in the manifest's shape."""
        node_hours = self.nodes * (time.monotonic() - self.start) / 3600
        out = {c: dict(v) for c, v in self.prior.items() if c in CAPACITY_TYPES}
        mine = out[Capacity(self.capacity).value]
        mine["node_hours"] += node_hours
        mine["gpu_hours"] += node_hours * self.gpus_per_node
        mine["dollars"] += node_hours * self.price
        for c in CAPACITY_TYPES:
            out[c] = {k: round(v, 9) for k, v in out[c].items()}
        out["total_dollars"] = round(sum(out[c]["dollars"] for c in CAPACITY_TYPES), 9)
        return out

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

"""The one capacity vocabulary: which kind of machine a group runs (and is billed) on.

Every module that speaks of capacity -- the budget decision and its branch task ids, the
launchers' node selection, the trainer's cost ledger, the trigger form -- uses ``Capacity``.
This is the only module that spells the words. Standard library only (the trainer and the
provider at DAG-parse time both import it).
"""

from __future__ import annotations

import enum


class Capacity(str, enum.Enum):
    """Capacity a pod group runs on."""

    SPOT = "spot"
    """Spot (preemptible) instances: cheap, may be reclaimed with a two-minute warning."""
    ON_DEMAND = "on_demand"
    """On-demand instances: list price, not reclaimed."""
    ANY = "any"
    """Whatever the cluster gives (no node selection); billed at the price given for the job."""

    def __str__(self) -> str:
        return self.value

    @classmethod
    def _missing_(cls, value: object) -> Capacity | None:
        # Spellings of earlier versions and of the cloud's own labels, read from old manifests,
        # DAG files and trigger forms; always written back in the canonical form above.
        aliases = {"on-demand": cls.ON_DEMAND, "ondemand": cls.ON_DEMAND, "local": cls.ANY}
        if isinstance(value, str):
            return aliases.get(value.strip().lower().replace("_", "-")) or aliases.get(value.strip().lower())
        return None

    @classmethod
    def parse(cls, value: object, *, field: str = "capacity") -> Capacity:
        """``value`` as a Capacity; ValueError naming ``field`` and the value otherwise."""
        try:
            return cls(value)
        except ValueError:
            raise ValueError(
                f"{field}: unknown capacity {value!r} (choose from {', '.join(c.value for c in cls)})"
            ) from None

    @property
    def node_labels(self) -> tuple[tuple[str, str], ...]:
        """Node labels that mark this capacity: Karpenter's and EKS managed node groups' (either
        may hold a pod, so a selector ORs them). Empty for ``ANY``."""
        return _NODE_LABELS.get(self, ())

    @property
    def branch_suffix(self) -> str:
        """The suffix of the DAG's train task for this capacity: ``train_spot``, ``train_on_demand``."""
        return self.value


_NODE_LABELS = {
    Capacity.SPOT: (("karpenter.sh/capacity-type", "spot"), ("eks.amazonaws.com/capacityType", "SPOT")),
    Capacity.ON_DEMAND: (
        ("karpenter.sh/capacity-type", "on-demand"),
        ("eks.amazonaws.com/capacityType", "ON_DEMAND"),
    ),
}

CAPACITIES = tuple(c.value for c in Capacity)
"""The canonical spellings, for enums in schemas and forms."""

"""Spot traces for ``benchmarks/spot_cost.py``: one neutral format, and readers for the shared traces.

The neutral format (``*.market.json``, documented in ``benchmarks/README.md``) is what the simulator
runs on; the readers below turn the public traces in ``../shared/data/spot`` into it, each with the
assumption it needs written into the market's ``notes``:

- ``aws-9az``: SkyNomad's p3.2xlarge spot prices in 9 AZs (195 s ticks) and the same AZs' launch probes.
  A probe launches one instance, so the capacity it shows is 1 (0/1): a group of more than one node
  is never run on spot from these traces (we do not guess how many nodes a successful probe implies).
- ``aws-4node``: SkyNomad's 4-node capture, ``data[i]`` = nodes up (0..4) per 300 s tick in 3 AZs:
  a real count. It has no prices: each AZ gets the time-weighted mean of its own p3.2xlarge spot
  price series (``v100_1node_prices``), flat.
- ``groups``: group sizes over time, resampled to 60 s ticks: Bamboo's AWS autoscaling groups (p3,
  g4dn; add/remove events of named nodes, real preemptions) and GCP preemptible groups (v100, a100;
  ``date, time, n_running`` rows, read in time order, the later row winning at equal times). Each
  group is one zone whose capacity is its size. No price series: spot = on-demand × (1 − s/100) with
  ``s`` the AWS Spot Advisor saving for the type in us-east-1 (p3.2xlarge 53 %, g4dn.xlarge 58 %),
  and 0.30 × on-demand for GCP preemptible (an assumption: the usual preemptible discount).
"""

from __future__ import annotations

import csv
import datetime as dt
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Zone:
    """One place a group can run: per tick, the spot price ($/node-hour) and the nodes that can be had."""

    name: str
    price: list[float]
    capacity: list[int]


@dataclass
class Market:
    """Zones sharing one clock and one on-demand price."""

    name: str
    tick_s: float
    on_demand_price: float
    zones: list[Zone]
    notes: list[str] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)

    @property
    def ticks(self) -> int:
        return min(len(z.capacity) for z in self.zones)

    @property
    def max_capacity(self) -> int:
        return max(max(z.capacity) for z in self.zones)

    def window(self, start: int, stop: int, suffix: str) -> Market:
        """Ticks ``[start, stop)`` only: what a simulation of that part of the time range may see."""
        zones = [Zone(z.name, z.price[start:stop], z.capacity[start:stop]) for z in self.zones]
        return Market(
            f"{self.name} {suffix}", self.tick_s, self.on_demand_price, zones, self.notes, self.sources
        )

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "tick_s": self.tick_s,
            "on_demand_price": self.on_demand_price,
            "notes": self.notes,
            "sources": self.sources,
            "zones": {z.name: {"price": z.price, "capacity": z.capacity} for z in self.zones},
        }

    @classmethod
    def from_json(cls, doc: dict, path: Path) -> Market:
        def need(cond: bool, what: str) -> None:
            if not cond:
                raise SystemExit(f"{path}: {what}")

        need(
            isinstance(doc.get("tick_s"), (int, float)) and doc["tick_s"] > 0,
            "tick_s: a number of seconds > 0",
        )
        need(isinstance(doc.get("on_demand_price"), (int, float)) and doc["on_demand_price"] > 0,
             "on_demand_price: a $/node-hour > 0")  # fmt: skip
        need(
            isinstance(doc.get("zones"), dict) and doc["zones"],
            "zones: {name: {price: [...], capacity: [...]}}",
        )
        zones = []
        for name, z in doc["zones"].items():
            price, cap = z.get("price"), z.get("capacity")
            need(isinstance(price, list) and isinstance(cap, list) and len(price) == len(cap) and cap,
                 f"zones.{name}: price and capacity are lists of the same length")  # fmt: skip
            zones.append(Zone(name, [float(p) for p in price], [int(c) for c in cap]))
        return cls(doc.get("name", path.stem), float(doc["tick_s"]), float(doc["on_demand_price"]), zones,
                   list(doc.get("notes", [])), list(doc.get("sources", [str(path)])))  # fmt: skip


# -- readers for the shared research traces ---------------------------------------------------------

SKYNOMAD = "andylizf_skynomad-artifact/data"
BAMBOO = "uclasystem_bamboo/traces"
P3_ON_DEMAND = 3.06  # p3.2xlarge, us-east-1, $/h (SkyNomad's price_info)
ADVISOR_SAVING = {"p3": 0.53, "g4dn": 0.58}  # AWS Spot Advisor "s" for p3.2xlarge / g4dn.xlarge, us-east-1
G4DN_ON_DEMAND = 0.526  # g4dn.xlarge, us-east-1, $/h
GCP_SPOT_RATIO = 0.30
GROUP_TICK_S = 60.0


def _aws_9az(root: Path) -> Market:
    prices = json.loads((root / SKYNOMAD / "v100_spot_prices.json").read_text())
    probes = root / SKYNOMAD / "real/availability/2023-02-15/processed"
    zones = []
    for name in sorted(prices):
        with (probes / f"{name}.csv").open() as fh:
            cap = [int(float(r["availability"])) for r in csv.DictReader(fh)]
        n = min(len(cap), len(prices[name]))
        zones.append(Zone(name.removesuffix("_v100_1"), [float(p) for p in prices[name][:n]], cap[:n]))
    return Market(
        "aws-9az", 195.0, P3_ON_DEMAND, zones,
        ["p3.2xlarge spot prices per 195 s tick; capacity = the launch probe (1 = one instance could be "
         "launched), so only 1-node jobs can use spot here; a running instance is taken as preempted when "
         "its zone's probe fails (probes are not observed preemptions)"],
        [f"{SKYNOMAD}/v100_spot_prices.json", f"{SKYNOMAD}/real/availability/2023-02-15/processed/*.csv"],
    )  # fmt: skip


def _aws_4node(root: Path) -> Market:
    zones = []
    for path in sorted((root / SKYNOMAD / "spot_hedge_4node_src").glob("*.json")):
        doc = json.loads(path.read_text())
        series = json.loads((root / SKYNOMAD / "v100_1node_prices" / path.name).read_text())["prices"]
        flat = sum(series) / len(series)
        zones.append(
            Zone(path.stem.removesuffix("_v100_1"), [flat] * len(doc["data"]), [int(x) for x in doc["data"]])
        )
    return Market(
        "aws-4node", 300.0, P3_ON_DEMAND, zones,
        ["4-node p3.2xlarge capture (Aug 2023), capacity = nodes up (0..4) per 300 s tick; no prices in the "
         "capture: each AZ's spot price is the mean of its Feb-Apr 2023 series, flat"],
        [f"{SKYNOMAD}/spot_hedge_4node_src/*.json", f"{SKYNOMAD}/v100_1node_prices/*.json (mean price)"],
    )  # fmt: skip


def _steps_to_ticks(points: list[tuple[float, int]], tick_s: float) -> list[int]:
    """A step function (time s, value), sorted by time, sampled every ``tick_s`` from its first point."""
    out, j, t0 = [], 0, points[0][0]
    end = points[-1][0]
    k = 0
    while t0 + k * tick_s <= end:
        t = t0 + k * tick_s
        while j + 1 < len(points) and points[j + 1][0] <= t:
            j += 1
        out.append(points[j][1])
        k += 1
    return out


def _bamboo_group(path: Path) -> list[int]:
    up: set[str] = set()
    points: list[tuple[float, int]] = []
    with path.open() as fh:
        for row in csv.reader(fh):
            if len(row) != 3 or not row[0].isdigit():
                continue
            (up.add if row[1] == "add" else up.discard)(row[2])
            t = int(row[0]) / 1000.0
            if points and points[-1][0] == t:
                points[-1] = (t, len(up))
            else:
                points.append((t, len(up)))
    return _steps_to_ticks(points, GROUP_TICK_S)


def _gcp_group(path: Path) -> list[int]:
    rows = []
    for i, line in enumerate(path.read_text().splitlines()):
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 3:
            continue
        when = dt.datetime.strptime(f"{parts[0]} {parts[1]}", "%Y-%m-%d %H:%M:%S").timestamp()
        rows.append((when, i, int(parts[2])))
    rows.sort()  # time order; at equal times the later row wins (below)
    points: list[tuple[float, int]] = []
    for when, _, n in rows:
        if points and points[-1][0] == when:
            points[-1] = (when, n)
        else:
            points.append((when, n))
    return _steps_to_ticks(points, GROUP_TICK_S)


def _groups(root: Path) -> list[Market]:
    markets = []
    for kind in ("p3", "g4dn"):
        path = root / BAMBOO / f"{kind}-trace.csv"
        od = P3_ON_DEMAND if kind == "p3" else G4DN_ON_DEMAND
        cap = _bamboo_group(path)
        spot = od * (1 - ADVISOR_SAVING[kind])
        markets.append(Market(
            f"groups/bamboo-{kind}", GROUP_TICK_S, od, [Zone(f"aws-{kind}", [spot] * len(cap), cap)],
            [f"Bamboo {kind} autoscaling group: capacity = nodes in the group (add/remove events) per 60 s; "
             f"spot = on-demand x (1 - {ADVISOR_SAVING[kind]:.2f}) (Spot Advisor)"],
            [f"{BAMBOO}/{kind}-trace.csv"],
        ))  # fmt: skip
    for path in sorted((root / BAMBOO / "gcloud").glob("*.txt")):
        cap = _gcp_group(path)
        markets.append(Market(
            f"groups/gcp-{path.stem}", GROUP_TICK_S, 1.0,
            [Zone(f"gcp-{path.stem}", [GCP_SPOT_RATIO] * len(cap), cap)],
            [f"GCP preemptible group {path.stem}: capacity = n_running per 60 s; spot = {GCP_SPOT_RATIO} x "
             "on-demand (assumed), on-demand normalised to $1/node-hour"],
            [f"{BAMBOO}/gcloud/{path.name}"],
        ))  # fmt: skip
    return markets


@dataclass
class Scenario:
    """Markets simulated together: jobs are spread over them, and reported as one table per size."""

    name: str
    markets: list[Market]
    title: str


SYNTHETIC = Path(__file__).parent / "data"
"""A small synthetic market bundled with the repository (4 days of 300 s ticks, two zones): what
``--quick`` runs on where the shared traces are not (a clean clone in CI). Its figures mean nothing; it
checks the code runs."""


def quick_traces(trace_dir: Path) -> Path:
    """``trace_dir`` if it is there, else the bundled synthetic market, said so on stderr (``--quick``
    only)."""
    if trace_dir.is_dir():
        return trace_dir
    print(f"[--quick] {trace_dir} is not here: running on the bundled synthetic market ({SYNTHETIC})",
          file=sys.stderr, flush=True)  # fmt: skip
    return SYNTHETIC


def load_scenarios(trace_dir: Path) -> list[Scenario]:
    """``*.market.json`` files under ``trace_dir`` (one scenario each), else the shared research traces."""
    if not trace_dir.is_dir():
        raise SystemExit(
            f"trace directory {trace_dir} does not exist: pass the directory holding the traces "
            "(see benchmarks/README.md), e.g. python benchmarks/spot_cost.py /path/to/shared/data/spot"
        )
    own = sorted(trace_dir.rglob("*.market.json"))
    if own:
        scenarios = []
        for path in own:
            try:
                doc = json.loads(path.read_text())
            except ValueError as err:
                raise SystemExit(f"{path}: not JSON ({err})") from None
            market = Market.from_json(doc, path)
            scenarios.append(Scenario(market.name, [market], market.name))
        return scenarios
    if not (trace_dir / SKYNOMAD).is_dir() or not (trace_dir / BAMBOO).is_dir():
        raise SystemExit(
            f"{trace_dir}: neither *.market.json files (benchmarks/README.md) nor the shared research traces "
            f"({SKYNOMAD}/, {BAMBOO}/)"
        )
    return [
        Scenario(
            "aws-9az",
            [_aws_9az(trace_dir)],
            "A. AWS p3.2xlarge, 9 AZs, real prices, launch probes (capacity 0/1)",
        ),
        Scenario(
            "aws-4node", [_aws_4node(trace_dir)], "B. AWS p3.2xlarge 4-node capture, 3 AZs (capacity 0..4)"
        ),
        Scenario(
            "groups", _groups(trace_dir), "C. spot/preemptible groups: Bamboo AWS p3, g4dn; GCP v100, a100"
        ),
    ]

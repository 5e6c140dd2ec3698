"""The command line of the spot-cost simulator: per scenario and size, choose our policy's parameters on the
first half, run every strategy on held-out jobs, print the tables and verdicts; then every level pooled."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from _common import REPO
from spot_traces import load_scenarios, quick_traces

from .elastic import ElasticPolicy, where_the_dollars_go
from .strategies import Naive, Policy, UniformProgress
from .tables import HEAD, Row, make_jobs, run_size
from .tuning import tune
from .verdicts import below_every, frontier, seed_by_seed, verdict
from .world import ELASTIC, INPUTS, OURS, REJOIN_WAIT_S, SIZES, Mechanics, World

DEFAULT_TRACES = REPO.parent / "shared" / "data" / "spot"
LEVELS = {"cells": "per scenario and size", "scenarios": "per scenario, all sizes",
          "sizes": "per size, all scenarios", "all": "all jobs together"}  # fmt: skip


def _elastic_args(ap: argparse.ArgumentParser) -> None:
    """The options of elastic groups."""
    ap.add_argument(
        "--min-nodes-fraction",
        type=float,
        default=0.5,
        help="elastic groups: the fewest nodes a group of N runs on, ceil(fraction x N)",
    )
    ap.add_argument(
        "--rerendezvous-s", type=float, default=60.0, help="elastic groups: the cost of a resize, in seconds"
    )
    ap.add_argument(
        "--grow-resize-s", type=float, default=None,
        help="elastic groups: the cost of a resize that only adds nodes (a replacement joins, the group "
        "grows back); default --rerendezvous-s. What if the others trained on while a joiner took the state "
        "from a peer (an in-process resize), not the launchers' restart",
    )  # fmt: skip
    ap.add_argument(
        "--replace-timeout-s", type=float, default=REJOIN_WAIT_S,
        help="elastic groups: a resize to fewer than N nodes waits this long for more: the launchers' round "
        "closes once every survivor is back (default); torch's own waits its last call (replace_timeout_s, "
        "30 s by default)",
    )  # fmt: skip
    ap.add_argument(
        "--tune-elastic",
        action="store_true",
        help="elastic groups: choose their own parameters on the first half, as for all-or-nothing groups "
        "(about twice the tuning time); default: the all-or-nothing setting's parameters of the same user "
        "and size",
    )
    ap.add_argument(
        "--top-up",
        action="store_true",
        help="elastic groups: where decide() would move one to on-demand on all its nodes, keep the spot "
        "nodes on offer and add on-demand ones (decide()'s top_up_on_demand; the launchers cannot yet)",
    )


def parse_args(argv: list[str] | None) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    """The options; ``--quick`` sets few jobs and the quick traces."""
    from . import __doc__ as doc

    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("trace_dir", nargs="?", type=Path, default=DEFAULT_TRACES)
    ap.add_argument("--jobs", type=int, default=200, help="held-out jobs per scenario and size")
    ap.add_argument(
        "--tune-jobs", type=int, default=300, help="jobs per size in the first half, to choose the parameters"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--seeds",
        type=seed_list,
        default=None,
        metavar="A-B|A,B,...",
        help="run every seed (each with its own jobs, draws and parameter choice) and report their "
        "held-out jobs pooled, with how many seeds each setting met the line on; replaces --seed",
    )
    ap.add_argument("--startup-s", type=float, default=300.0)
    ap.add_argument("--checkpoint-s", type=float, default=1800.0)
    ap.add_argument("--step-s", type=float, default=30.0)
    ap.add_argument(
        "--inputs",
        choices=INPUTS,
        default="measured",
        help="what our policy is told: the zone's measured trailing rate and price low, or what the bundled "
        "DAG gives it (one fixed rate from the first half, the price limit as the wait target)",
    )
    ap.add_argument(
        "--scenario",
        action="append",
        default=None,
        metavar="NAME",
        help="simulate only this scenario (aws-9az, aws-4node, groups, or one of yours; "
        "repeatable); default: every scenario in TRACE_DIR",
    )
    _elastic_args(ap)
    ap.add_argument("--quick", action="store_true", help="--jobs 8 --tune-jobs 8: every part, on few jobs")
    args = ap.parse_args(argv)
    if args.quick:
        args.jobs, args.tune_jobs = 8, 8
        args.trace_dir = quick_traces(args.trace_dir)
    return ap, args


def pick_scenarios(ap: argparse.ArgumentParser, args: argparse.Namespace) -> list:
    """The scenarios of the trace folder, or those ``--scenario`` names (an unknown name is refused)."""
    scenarios = load_scenarios(args.trace_dir)
    if args.scenario:
        unknown = sorted(set(args.scenario) - {sc.name for sc in scenarios})
        if unknown:
            ap.error(
                f"--scenario {', '.join(unknown)}: not in {args.trace_dir} (there: "
                f"{', '.join(sc.name for sc in scenarios)})"
            )
        scenarios = [sc for sc in scenarios if sc.name in args.scenario]
    return scenarios


class Report:
    """The rows of every run, kept to pool them by scenario, by size and all together, and the tally of
    verdicts: where each setting of ours missed the line, and on how many seeds it met it."""

    def __init__(self, seeds: list[int], mech: Mechanics) -> None:
        self.seeds, self.mech = seeds, mech
        self.every_row: dict[str, list[Row]] = {}  # strategy -> its rows of every scenario and size
        self.by_size: dict[tuple[int, str], list[Row]] = {}
        self.judged_at: dict[str, int] = {}  # level -> how many verdicts
        self.misses: dict[str, dict[str, list[str]]] = {name: {} for name in OURS.values()}  # level -> where
        self.runs: list[tuple[int, str, int, list[Row]]] = []  # (seed, scenario, size, rows) of every run
        self.seed_met: dict[tuple[str, str], list[int]] = {}  # (ours, level) -> [seeds x places met, of]

    def merged(self, name: str, rows: list[Row]) -> Row:
        return Row(name, [j for r in rows for j in r.jobs], [o for r in rows for o in r.outcomes],
                   sum(r.od_cost for r in rows), self.mech)  # fmt: skip

    def pooled(self, runs_rows: list[list[Row]]) -> list[Row]:
        """Runs of the same strategies, in the same order, merged strategy by strategy."""
        return [self.merged(r.strategy, [rows[j] for rows in runs_rows]) for j, r in enumerate(runs_rows[0])]

    def of_seeds(self, keep) -> list[list[Row]]:
        """Per seed, its runs that ``keep(scenario, size)`` accepts, pooled (none for a single seed)."""
        if len(self.seeds) == 1:
            return []
        return [
            self.pooled([rows for s_, name, n, rows in self.runs if s_ == seed and keep(name, n)])
            for seed in self.seeds
        ]

    def judged(self, rows: list[Row], level: str, where: str, by_seed: list[list[Row]] | None = None) -> None:
        """Print the verdicts on ``rows`` and count them at ``level``."""
        print("\n".join(verdict(rows, name) for name in OURS.values()))
        print(frontier(rows))
        if len(self.seeds) > 1 and by_seed:
            print("\n".join(seed_by_seed(by_seed, self.seeds, name) for name in OURS.values()))
            for name in OURS.values():
                tally = self.seed_met.setdefault((name, level), [0, 0])
                tally[0] += sum(below_every(rows, name) for rows in by_seed)
                tally[1] += len(by_seed)
        self.judged_at[level] = self.judged_at.get(level, 0) + 1
        for name in OURS.values():
            if not below_every(rows, name):
                self.misses[name].setdefault(level, []).append(where)

    def table(self, title: str, rows: list[Row]) -> None:
        print(f"{title}\n{HEAD}")
        print("\n".join(r.line() for r in rows))


def describe_scenario(sc, sizes: list[int]) -> None:
    """The scenario's markets, and the sizes it cannot hold."""
    print(f"\n## {sc.title}")
    for m in sc.markets:
        print(f"- {m.name}: {len(m.zones)} zone(s), {m.ticks} ticks of {m.tick_s:.0f} s "
              f"({m.ticks * m.tick_s / 3600:.1f} h), on-demand ${m.on_demand_price:.3f}/node-h, "
              f"capacity up to {m.max_capacity}" + "".join(f"; {note}" for note in m.notes))  # fmt: skip
    skipped = [n for n in SIZES if n not in sizes]
    if skipped:
        print(f"- sizes {skipped}: not simulated, no zone here ever has that many nodes")


def print_choice(best: dict, at: str, tune_jobs: int) -> None:
    """The parameters chosen on the first half, per user and size."""
    for (late, n, *kind), (below, score, z, ratio, risk, late_risk, chance) in best.items():
        chance_text = "- (expected cost and time)" if chance is None else chance
        name = (ELASTIC if kind else OURS)[late]
        print(f"- {at}{name}, {n} node(s), chosen on the first half ({tune_jobs} jobs): "
              f"max spot price {ratio:.2f} x on-demand, max interruption rate {risk:g}/h, "
              f"max late risk {late_risk:g}, min finish chance {chance_text} "
              f"(smallest paired t against a baseline {z:+.2f}; score {score:.3f}; "
              f"at or below every baseline there: {'yes' if below else 'no'})")  # fmt: skip


def run_seeds(report: Report, sc, sizes: list[int], args: argparse.Namespace) -> dict[int, list[list[Row]]]:
    """Per seed: choose the parameters on the first half, then run every strategy on the held-out jobs."""
    cells: dict[int, list[list[Row]]] = {n: [] for n in sizes}  # size -> each seed's rows
    mech = report.mech
    for seed in report.seeds:
        worlds = [World(m, mech, seed) for m in sc.markets]
        elastic = args.min_nodes_fraction if args.tune_elastic else None
        best = tune(worlds, sizes, args.tune_jobs, seed, mech, args.inputs, elastic=elastic)
        print_choice(best, f"seed {seed}, " if len(report.seeds) > 1 else "", args.tune_jobs)
        for n in sizes:
            ours = [Policy(*best[late, n][3:], allow_late=late, inputs=args.inputs) for late in OURS]
            ours += [ElasticPolicy(*best.get((late, n, "elastic"), best[late, n])[3:], allow_late=late,
                                   inputs=args.inputs, min_fraction=args.min_nodes_fraction,
                                   top_up=args.top_up)
                     for late in OURS]  # fmt: skip
            jobs = make_jobs(sc.markets, args.jobs, n, 1, seed, mech)
            cells[n].append(
                run_size(worlds, jobs, [*ours, Naive(True), Naive(False), UniformProgress()], mech)
            )
            report.runs.append((seed, sc.name, n, cells[n][-1]))
            if len(report.seeds) > 1:  # as it goes: a long pooled run shows each seed's figures
                print(f"- seed {seed}, {n} node(s): " + "; ".join(
                    f"{r.strategy} {r.cost / r.od_cost:.1%} / {r.kept}" for r in cells[n][-1][1:len(ours) + 1]
                ), flush=True)  # fmt: skip
    return cells


def run_scenario(report: Report, sc, args: argparse.Namespace) -> None:
    """One scenario: its tables and verdicts per size, then its sizes together."""
    cap = max(m.max_capacity for m in sc.markets)
    sizes = [n for n in SIZES if n <= cap]
    describe_scenario(sc, sizes)
    cells = run_seeds(report, sc, sizes, args)
    in_scenario: dict[str, list[Row]] = {}
    n_seeds = len(report.seeds)
    for n in sizes:
        rows = report.pooled(cells[n])
        seeds_note = f", {n_seeds} seeds" if n_seeds > 1 else ""
        report.table(
            f"\n{sc.name}, {n} node(s), {len(rows[0].jobs)} held-out jobs (second half{seeds_note}):", rows
        )
        for r in rows:
            report.every_row.setdefault(r.strategy, []).append(r)
            report.by_size.setdefault((n, r.strategy), []).append(r)
            in_scenario.setdefault(r.strategy, []).append(r)
        print("\n".join(where_the_dollars_go(rows, sc.markets)))
        report.judged(rows, "cells", f"{sc.name} at {n} node(s)", cells[n])
    rows = [report.merged(name, rs) for name, rs in in_scenario.items()]
    report.table(f"\n### {sc.name}: all sizes together, {len(rows[0].jobs)} held-out jobs", rows)
    report.judged(rows, "scenarios", sc.name, report.of_seeds(lambda name, size: name == sc.name))


def print_pooled(report: Report) -> None:
    """Every scenario pooled, per size and then all together."""
    for n in SIZES:
        names = [name for (size, name) in report.by_size if size == n]
        if names:
            rows = [report.merged(name, report.by_size[n, name]) for name in names]
            report.table(f"\n## all scenarios, {n} node(s) (held out)", rows)
            report.judged(rows, "sizes", f"{n} node(s)", report.of_seeds(lambda name, size: size == n))
    rows = [report.merged(name, rs) for name, rs in report.every_row.items()]
    report.table("\n## all scenarios and sizes together (held out)", rows)
    report.judged(rows, "all", "all together", report.of_seeds(lambda name, size: True))


def print_summary(report: Report) -> None:
    """Per setting of ours and level: how many places it met the line, where not, and seed by seed."""
    seeds = report.seeds
    print(
        "\n## Where each setting of ours is at or below every baseline (cost, jobs on time within budget), "
        "held out"
        + (
            f", the {len(seeds)} seeds' jobs pooled (seed by seed: each seed's jobs alone, places x seeds)"
            if len(seeds) > 1
            else ""
        )
    )
    for name, by_level in report.misses.items():
        for level, title in LEVELS.items():
            missed = by_level.get(level, [])
            met = report.seed_met.get((name, level))
            print(
                f"- {name}, {title}: {report.judged_at[level] - len(missed)} of {report.judged_at[level]}"
                + (f" (not: {'; '.join(missed)})" if missed else "")
                + (f"; seed by seed: {met[0]} of {met[1]}" if met else "")
            )


def main(argv: list[str] | None = None) -> int:
    ap, args = parse_args(argv)
    seeds = args.seeds or [args.seed]
    mech = Mechanics(args.startup_s, args.checkpoint_s, args.step_s, rerendezvous_s=args.rerendezvous_s,
                     replace_timeout_s=args.replace_timeout_s, grow_resize_s=args.grow_resize_s)  # fmt: skip
    t0 = time.monotonic()
    scenarios = pick_scenarios(ap, args)
    print(f"traces: {args.trace_dir}; {_seeds_text(seeds)}; start-up {mech.startup_s:.0f} s, "
          f"checkpoint every {mech.checkpoint_s:.0f} s, step {mech.step_s:.0f} s; deadline 1.2-2.0x and "
          f"budget 0.5-1.5x on-demand; our policy's inputs: {args.inputs}")  # fmt: skip
    report = Report(seeds, mech)
    for sc in scenarios:
        run_scenario(report, sc, args)
    print_pooled(report)
    print_summary(report)
    print(f"\n{time.monotonic() - t0:.0f} s")
    return 0


def seed_list(text: str) -> list[int]:
    """``A-B`` (both included) or ``A,B,...``: the seeds of a pooled run."""
    try:
        if "-" in text.strip("-"):
            lo, hi = (int(x) for x in text.split("-"))
            seeds = list(range(lo, hi + 1))
        else:
            seeds = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"seeds must be A-B or A,B,...: got {text!r}") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError(f"seeds must name at least one seed, each once: got {text!r}")
    return seeds


def _seeds_text(seeds: list[int]) -> str:
    if len(seeds) == 1:
        return f"seed {seeds[0]}"
    if seeds == list(range(seeds[0], seeds[-1] + 1)):
        return f"seeds {seeds[0]}-{seeds[-1]} ({len(seeds)}, pooled)"
    return f"seeds {','.join(map(str, seeds))} ({len(seeds)}, pooled)"

"""The spot studies beside the simulator: spot_hindsight.py (how many parameter sets would have met the line
on the held-out jobs) and spot_choice.py (other rules of choosing the parameters), on a small synthetic
market in the documented format."""

from __future__ import annotations

import math
import subprocess
import sys

from tests.conftest import REPO
from tests.spot.test_spot_cost_benchmark import _benchmark_modules, _market, _run

USERS = ("our policy", "our policy, on time or stop")


def _script(name: str, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / name), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _figures(text: str) -> tuple[float, int]:
    """(cost %, jobs kept) of a study's line: "...: 61.2% / 17 kept ..."."""
    pct, rest = text.split("% / ", 1)
    return float(pct), int(rest.split(" kept")[0])


def _check_hindsight_line(line: str, cell: str, n_sets: int) -> None:
    """A line's count of sets is in range, it names the cheapest set (some pass) or the closest (none), and
    what it claims holds by the figures it prints: a passing set costs no more than the cheapest baseline and
    keeps as many as the most; the closest one misses on one of the two."""
    count = int(line.split(": ")[1].split(" of ")[0])
    assert 0 <= count <= n_sets and f" of {n_sets} sets" in line
    assert ("; the cheapest set" in line) == (count > 0) and ("; the closest set" in line) == (count == 0), (
        line
    )
    bases = [b.rsplit(" ", 4) for b in cell.splitlines()[0].split(": ", 1)[1].split("; ")]
    base_cost = min(float(b[1].rstrip("%")) for b in bases)
    base_kept = max(int(b[3]) for b in bases)
    cost, kept = _figures(line.split("): ")[1])
    if count:
        assert cost <= base_cost and kept >= base_kept, (line, bases)
    else:
        assert cost > base_cost or kept < base_kept, (line, bases)


def test_the_hindsight_check_counts_every_parameter_set_per_user_and_size(tmp_path):
    """benchmarks/spot_hindsight.py runs the whole grid on the held-out jobs: per size and user, how many sets
    would have been at or below every baseline, and where none is, the closest set and its gap."""
    _market(tmp_path)
    done = _script(
        "spot_hindsight.py", str(tmp_path), "--scenario", "synthetic", "--jobs", "6", "--seed", "3"
    )
    assert done.returncode == 0, done.stderr
    cells = done.stdout.split("\n\nsynthetic, ")[1:]
    assert [c.split(" ")[0] for c in cells] == ["1", "4", "16"]
    spot_cost, _ = _benchmark_modules()
    n_sets = math.prod(
        len(g)
        for g in (spot_cost.PRICE_RATIOS, spot_cost.MAX_RISKS, spot_cost.LATE_RISKS, spot_cost.BUDGET_CHANCES)
    )
    for cell in cells:
        lines = [line for line in cell.splitlines() if line.startswith("- ")]
        assert [line.split(":")[0] for line in lines] == [f"- {u}" for u in USERS], cell
        for line in lines:
            _check_hindsight_line(line, cell, n_sets)

    wrong = _script("spot_hindsight.py", str(tmp_path), "--scenario", "groups", timeout=120)
    assert (
        wrong.returncode == 2
        and "--scenario 'groups': not in" in wrong.stderr
        and "synthetic" in wrong.stderr
    )


def _check_user_rules(user: str, size: str, lines: list[str], base_figures, row: list[str], cost_out: str):
    """One user's lines of a cell: the rules in order; "z, first N" gives spot_cost.py's figures and set;
    each rule's "meets the line" holds by the baselines' figures; the hindsight count is in range."""
    mine = [
        line
        for line in lines
        if line.startswith(f"- {user}, ") and (user != USERS[0] or not line.startswith(f"- {USERS[1]}"))
    ]
    rules = [line[len(f"- {user}, ") :].split(":")[0] for line in mine]
    assert rules == ["z, first 20", "score, first 20", "on-line, last 10", "hindsight"], lines
    pct, kept = _figures(mine[0].split(": ")[1])
    assert f"{pct:.1f}%" == row[2].strip() and kept == int(row[9]), (mine[0], row)
    ratio, risk, late_risk, chance = eval(mine[0].split(" (set ")[1].split("):")[0], {"inf": math.inf})
    assert (
        f"- {user}, {size} node(s), chosen on the first half (20 jobs): max spot price {ratio:.2f} "
        f"x on-demand, max interruption rate {risk:g}/h, max late risk {late_risk:g}, min finish "
        f"chance {'- (expected cost and time)' if chance is None else chance} "
    ) in cost_out, mine[0]
    for line in mine[:-1]:
        pct, kept = _figures(line.split(": ")[1])
        meets = all(pct <= c + 0.005 and kept >= k for c, k in base_figures)
        assert line.endswith("meets the line") == meets, (line, base_figures)
    assert 0 <= int(mine[-1].split(": ")[1].split(" of ")[0]) <= 75


def test_the_choice_study_reproduces_spot_costs_rule_and_scores_every_other_rule(tmp_path):
    """benchmarks/spot_choice.py: its "z, first N" rule is spot_cost.py's choice, so on the same jobs it
    chooses spot_cost.py's sets and gives its held-out figures for both users; every other rule and the
    hindsight count are printed per size and user, and what a line claims (meets the line, or misses a
    baseline) holds by the baselines' figures."""
    _market(tmp_path)
    args = ("--jobs", "12", "--tune-jobs", "20", "--seed", "3")
    choice = _script("spot_choice.py", str(tmp_path), "--scenario", "synthetic", *args, "--recent", "10")
    assert choice.returncode == 0, choice.stderr
    # prices 1.0 and 1.6 of on-demand 4.0: every spot price limit of the grid admits both: a third of the sets
    assert "75 distinct parameter sets of 225 per user" in choice.stdout
    cost = _run(str(tmp_path), *args)
    assert cost.returncode == 0, cost.stderr
    tables = {t.split(" ")[0]: t.split("\n\n")[0] for t in cost.stdout.split("\nsynthetic, ")[1:]}
    cells = {c.split(" ")[0]: c for c in choice.stdout.split("\n\nsynthetic, ")[1:]}
    assert list(cells) == ["1", "4", "16"]
    for size, cell in cells.items():
        head, *lines = cell.strip().splitlines()
        bases = [b.rsplit(" ", 4) for b in head.split("held out: ")[1].split("; ")]
        base_figures = [(float(b[1].rstrip("%")), int(b[3])) for b in bases]
        rows = {
            line.split("|")[1].strip(): line.split("|")
            for line in tables[size].splitlines()
            if line.startswith("| ")
        }
        for user in USERS:
            _check_user_rules(user, size, lines, base_figures, rows[user], cost.stdout)

"""The faults' table (name, function, default trials, kind), and the report of their trials: one row
per fault, then whether each property held."""

from __future__ import annotations

from .corruption import f_flip_byte, f_nan_manifest, f_truncate_manifest
from .process_faults import f_kill_agent, f_kill_rank, f_sigterm, f_sigusr1, f_supervisor
from .resource_faults import f_budget, f_full_disk, f_second_writer

QUICK = ("sigterm-agent", "flipped-byte-shard")  # --quick: a signal-based fault and a corruption

FAULTS = [  # (name, function, default trials, signal-based: bitwise equality must hold)
    ("sigterm-agent", f_sigterm, 2, True),
    ("sigusr1", f_sigusr1, 2, True),
    ("kill-9-rank", f_kill_rank, 1, True),
    ("kill-9-agent", f_kill_agent, 1, True),
    ("kill-9-supervisor+retry", f_supervisor, 1, True),
    ("flipped-byte-shard", f_flip_byte, 2, False),
    ("truncated-manifest", f_truncate_manifest, 2, False),
    ("nan-in-manifest", f_nan_manifest, 2, False),
    ("full-disk", f_full_disk, 1, False),
    ("budget-cap", f_budget, 2, False),
    ("second-writer", f_second_writer, 1, False),
]


def fmt(values, kind) -> str:
    vals = [v for v in values if v is not None]
    if not vals:
        return "n/a"
    if kind == "bool":
        return f"{sum(v is True for v in vals)}/{len(vals)}"
    if kind == "max":
        return f"{max(vals):.3f}" if isinstance(max(vals), float) else str(max(vals))
    if kind == "sum":
        return str(sum(vals))
    return "/".join(map(str, vals))


def print_table(results: dict[str, list[dict]]) -> None:
    """One row per fault: how many trials finished, steps lost, bitwise equality, spend, writers."""
    header = [
        "fault",
        "trials",
        "finished/cap",
        "steps lost",
        "bitwise = ref",
        "max spend/cap",
        "concurrent writers",
        "fenced commits",
        "corruption detected",
        "s/trial",
    ]
    table = [header]
    for name, rows in results.items():
        fin = [("cap" if r["finished"] == "cap" else bool(r["finished"])) for r in rows]
        table.append(
            [
                name,
                str(len(rows)),
                f"{sum(f is True or f == 'cap' for f in fin)}/{len(fin)}"
                + (" (cap)" if "cap" in fin else ""),
                fmt([r["steps_lost"] for r in rows], "list"),
                fmt([r["bitwise"] for r in rows], "bool"),
                fmt([r["spend_ratio"] for r in rows], "max"),
                fmt([r["writers"] for r in rows], "max"),
                fmt([r["fenced"] for r in rows], "sum"),
                fmt([r["detected"] for r in rows], "bool"),
                f"{sum(r['seconds'] for r in rows) / len(rows):.0f}",
            ]
        )
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    print()
    for i, r in enumerate(table):
        print("| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |")
        if i == 0:
            print("|" + "|".join("-" * (w + 2) for w in widths) + "|")


def print_verdicts(results: dict[str, list[dict]]) -> bool:
    """Whether each property held over every trial, one line each; True when all of them did."""
    every = [r for rows in results.values() for r in rows]
    signal_based = {n for n, _, _, s in FAULTS if s}

    held = []

    def verdict(ok: bool, what: str) -> None:
        held.append(ok)
        print(f"{'HOLDS' if ok else 'DOES NOT HOLD'}: {what}")

    print()
    verdict(all(r["finished"] for r in every), "every run finished or stopped at its cap")
    spends = [r["spend_ratio"] for r in every if r["spend_ratio"] is not None]
    verdict(
        all(s <= 1.0 for s in spends), f"spend never above the cap (max {max(spends, default=0):.3f} of it)"
    )
    fenced = [r["fenced"] for r in every if r["fenced"] is not None]
    writers = [r["writers"] for r in results.get("kill-9-supervisor+retry", []) if r["writers"] is not None]
    verdict(
        sum(fenced) == 0 and all(w <= 1 for w in writers),
        f"0 fenced commits ({sum(fenced)}) and never two groups alive at once (max "
        f"{max(writers, default=0)})",
    )
    detected = [r["detected"] for r in every if r["detected"] is not None]
    verdict(
        all(detected),
        f"every corrupted checkpoint detected and the previous one used ({sum(detected)}/{len(detected)})",
    )
    bitwise = [r["bitwise"] for n, rows in results.items() if n in signal_based for r in rows]
    verdict(
        all(b is True for b in bitwise),
        f"bitwise-equal final weights for every signal-based fault "
        f"({sum(b is True for b in bitwise)}/{len(bitwise)})",
    )
    return all(held)

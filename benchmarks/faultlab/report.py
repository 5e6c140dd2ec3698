"""The faults' table (name, function, default trials, kind), and the report of their trials: one row
per fault, then whether each property held."""

from __future__ import annotations

from .airflow_faults import f_database_down, f_scheduler_restart, f_triggerer_restart
from .corruption import f_flip_byte, f_nan_manifest, f_truncate_manifest
from .process_faults import f_kill_agent, f_kill_rank, f_sigterm, f_sigusr1, f_supervisor
from .resource_faults import f_budget, f_full_disk, f_second_writer
from .s3_faults import f_s3_checkpoint, f_s3_ledger, f_s3_lease, f_s3_outage
from .time_faults import f_clock_budget, f_clock_writer, f_slow_disk

NEW_FAULTS = [  # issue #41's storage and time faults: their "outcome held" is checked by the trial itself
    ("s3-5xx-checkpoint", f_s3_checkpoint, 2, True, "1-3 x 500/503 on checkpoint PUTs: retried, exit 0"),
    ("s3-5xx-ledger", f_s3_ledger, 2, True, "1-3 x 500/503 on spend-file PUTs: retried, none given up"),
    (
        "s3-5xx-lease",
        f_s3_lease,
        2,
        True,
        "1-3 x 500/503 on lease PUTs at each start: retried, exit 75 then 0",
    ),
    ("s3-outage-save", f_s3_outage, 1, True, "500/503 on every PUT of one save: exit 74, nothing of it left"),
    ("slow-disk-async", f_slow_disk, 2, True, "a save's fsync 2-5 s late: training goes on, commit late"),
    (
        "clock-5min-writer",
        f_clock_writer,
        2,
        True,
        "a writer's clock +-5 min: the older fenced, 0 fenced commits",
    ),
    (
        "clock-5min-budget",
        f_clock_budget,
        2,
        False,
        "the trainer's clock +-5 min: stops at the cap, spend <= cap",
    ),
    # a real Airflow (scheduler, triggerer; Postgres, else sqlite) around train_llama
    ("triggerer-restart-deferred", f_triggerer_restart, 1, False, "run succeeds, 1 group, 0 steps lost"),
    ("scheduler-restart", f_scheduler_restart, 1, False, "run succeeds, 1 group, 0 steps lost"),
    ("metadata-db-down-30s", f_database_down, 1, False, "run succeeds, 1 group, no second writer"),
]

QUICK = ("sigterm-agent", "flipped-byte-shard")  # --quick: a signal-based fault and a corruption

# (name, function, default trials, bitwise equality must hold, what the fault's own outcome must be: the
# "outcome held" column, for the faults that have one beyond the common properties)
FAULTS = [
    ("sigterm-agent", f_sigterm, 2, True, "exit 75 with a checkpoint, the retry finishes"),
    ("sigusr1", f_sigusr1, 2, True, "a checkpoint now, the run goes on and finishes"),
    ("kill-9-rank", f_kill_rank, 1, True, "exit 76, the retry resumes from the last commit"),
    ("kill-9-agent", f_kill_agent, 1, True, "the orphaned ranks save and exit; the retry finishes"),
    ("kill-9-supervisor+retry", f_supervisor, 1, True, "the retry waits for the orphans: one group alive"),
    ("flipped-byte-shard", f_flip_byte, 2, False, "detected; resume from the checkpoint before"),
    ("truncated-manifest", f_truncate_manifest, 2, False, "detected; resume from the checkpoint before"),
    ("nan-in-manifest", f_nan_manifest, 2, False, "detected; resume from the checkpoint before"),
    ("full-disk", f_full_disk, 1, False, "exit 74 with one clear line, older checkpoints valid"),
    ("budget-cap", f_budget, 2, False, "exit 77 at the cap, spend <= cap"),
    ("second-writer", f_second_writer, 1, False, "the stalled writer is fenced (exit 78), 0 fenced commits"),
    *NEW_FAULTS,
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
        "outcome held",
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
                fmt([r.get("held") for r in rows], "bool"),
                f"{sum(r['seconds'] for r in rows) / len(rows):.0f}",
            ]
        )
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    print()
    for i, r in enumerate(table):
        print("| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |")
        if i == 0:
            print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    print("\nExpected (besides finished or at its cap, spend <= cap, 0 fenced commits):")
    for name, _, _, bitwise, expected in FAULTS:
        if name in results:
            print(f"- {name}: {expected}{'; bitwise = ref' if bitwise else ''}")


def print_verdicts(results: dict[str, list[dict]]) -> bool:
    """Whether each property held over every trial, one line each; True when all of them did."""
    every = [r for rows in results.values() for r in rows]
    signal_based = {n for n, _, _, s, _ in FAULTS if s}

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
        f"bitwise-equal final weights for every fault that must keep them "
        f"({sum(b is True for b in bitwise)}/{len(bitwise)})",
    )
    outcomes = [r["held"] for r in every if r.get("held") is not None]
    verdict(
        all(outcomes), f"each new fault's own expected outcome, as listed ({sum(outcomes)}/{len(outcomes)})"
    )
    return all(held)

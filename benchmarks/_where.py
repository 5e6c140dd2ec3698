"""Where a restart's time went, for benchmarks/recovery.py: the restarted rank 0's "startup" event
(``trainer/elastic/startup.py``) and the time from SIGTERM to that process's start."""

import statistics
import time

from trainer.elastic.startup import PHASES


def startup_after(stream, t0_wall: float) -> dict:
    """Where the restart's time went: the restarted rank 0's "startup" event (``trainer/elastic/startup.py``,
    emitted right after its first step's) and, before it, the time from SIGTERM to that process's start (the
    save, the exit, the agent's start and rendezvous)."""
    for e in stream:
        if e["event"] == "startup":
            phases = {f"{p}_s": e[f"{p}_s"] for p in PHASES}
            return {
                "to_workers_s": e["started_at"] - t0_wall,
                **phases,
                "graphs_compiled": e.get("graphs_compiled"),
            }
    return {}


WHERE = ("to_workers_s", *(f"{p}_s" for p in PHASES))


def where_it_went(rows: list[dict]) -> str:
    """The rows' median time from SIGTERM to the restarted workers' start, then each startup phase."""
    if not all(k in row for row in rows for k in WHERE):
        return "where it went: no startup event"
    med = {k: statistics.median(row[k] for row in rows) for k in WHERE}
    phases = ", ".join(f"{p.replace('_', ' ')} {med[p + '_s']:.2f}" for p in PHASES)
    graphs = [row.get("graphs_compiled") for row in rows]
    compiled = f"; graphs compiled at the first step: {graphs}" if any(g is not None for g in graphs) else ""
    return f"where it went (s): SIGTERM -> workers' start {med['to_workers_s']:.2f}, then {phases}{compiled}"


def after_resume(stream, *kinds: str) -> dict:
    """Read ``stream`` to the first "train" event after a "resume": ``t1`` (the clock then), ``first_step``,
    and the last event of "resume" and of each of ``kinds`` on the way; without ``t1`` if the stream ends
    first."""
    seen: dict = {}
    for e in stream:
        if e["event"] in (*kinds, "resume"):
            seen[e["event"]] = e
        if e["event"] == "train" and "resume" in seen:
            return {"t1": time.perf_counter(), "first_step": e["step"], **seen}
    return seen

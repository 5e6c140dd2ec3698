"""The driver's measurements: the corpus, tokens/s the data path delivers per rank and tokens/s the
trainer consumes (its "train" events, read from an events directory of its own with ``trainer.events``),
and the measuring subprocesses' JSON lines."""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from _common import REPO, events_env, trainer_command
from trainer.events import events_of

MiB, GiB = 1 << 20, 1 << 30


def _run(cmd: list[str], env: dict | None, stdout) -> subprocess.CompletedProcess:
    """Run a subprocess to its end; exit naming the command and its stderr's tail when it fails."""
    proc = subprocess.run(cmd, cwd=REPO, env=env, stdout=stdout, stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return proc


def run_json(cmd: list[str], env: dict | None = None) -> list[dict]:
    """Run a measuring subprocess (a worker of ours, not the trainer); its JSON lines (one per rank)."""
    proc = _run(cmd, env, subprocess.PIPE)
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def train_events(cmd: list[str], env: dict | None = None) -> list[dict]:
    """Run a trainer to its end; its "train" events, from an events directory of its own."""
    with tempfile.TemporaryDirectory(prefix="dtrain-events-") as events:
        _run(cmd, events_env(os.environ if env is None else env, events), subprocess.DEVNULL)
        return events_of(events, "train")


def make_corpus(path: str, megabytes: float) -> list[str]:
    """A JSON-lines corpus of about `megabytes` MB in the built-in corpus's grammar; returns its first
    documents."""
    from trainer.data.builtin_text import generate_builtin_text
    from trainer.data.builtin_text import DOC_SEPARATOR

    docs = generate_builtin_text(int(megabytes * 1e6), seed=7).split(DOC_SEPARATOR)
    with open(path, "w") as f:
        for doc in docs:
            f.write(json.dumps({"text": doc.decode()}) + "\n")
    return [d.decode() for d in docs[:500]]


def data_rate(store: str, world: int, seq_len: int, batch: int, seconds: float) -> list[float]:
    """Tokens/s TrainBatches.next_batch() delivers to each rank of `world` (one rank at a time, for
    `seconds` each)."""
    import torch

    from trainer.data.loader import TrainBatches

    rates = []
    for rank in range(world):
        loader = TrainBatches(
            store, seq_len, batch, batch // world, rank, world, seed=0, device=torch.device("cpu")
        )
        for _ in range(20):  # warm-up: shard memmaps opened, first pages touched
            loader.next_batch()
        calls, start = 0, time.perf_counter()
        while True:
            micro_batches = loader.next_batch()
            calls += 1
            elapsed = time.perf_counter() - start
            if elapsed >= seconds:
                break
        tokens = sum(inputs.numel() for inputs, _ in micro_batches)  # (micro_batch, seq_len) each
        assert tokens == batch // world * seq_len
        rates.append(calls * tokens / elapsed)
    return rates


def trainer_rate(
    store: str, world: int, seq_len: int, batch: int, steps: int, log_every: int, model: list[str], env: dict
) -> tuple[float, list[float]]:
    """Tokens/s per rank the real trainer consumes (group tokens_per_s / world), and the windows' group
    figures."""
    cmd = trainer_command(
        world,
        *model,
        "--dataset",
        store,
        "--steps",
        str(steps),
        "--set",
        f"data.seq_len={seq_len}",
        "--set",
        f"global_batch_size={batch}",
        "--set",
        f"micro_batch_size={batch // world}",
        "--set",
        f"metrics.log_every={log_every}",
        "--set",
        "optim.warmup_steps=2",
    )
    windows = [e["tokens_per_s"] for e in train_events(cmd, env)]
    if len(windows) < 2:
        sys.exit(f"the trainer logged {len(windows)} train events; raise --steps")
    # Equal windows (log_every steps each): the group's rate over all of them is the harmonic mean.
    return statistics.harmonic_mean(windows[1:]) / world, windows


def fmt_bytes(n: float) -> str:
    return f"{n / GiB:.2f} GiB" if n >= GiB else f"{n / MiB:.0f} MiB"

"""A node of an elastic group compiles before it joins: its kept training processes
(``trainer.elastic.worker_host``) build the model and run one step in a world of their own before its agent
meets the others.

A node that joins a group already training (a replacement, or the group growing back) makes every survivor
stop at a new rendezvous and wait, at the first collective, for the newcomer's first step: its GPU's context,
the model's build and ``torch.compile``'s tracing, seconds even from the job's warm compile cache. The
survivors' own processes are kept and compile nothing again; the newcomer's were new. Here each host of the
node, before its agent joins, builds the model in a *fake* process group (``torch.distributed``'s "fake"
backend: every collective is a no-op, no peer is needed) of the group's full size, and runs forward and
backward over the micro-batches a rank of that world trains. dynamo keeps what it compiled on the blocks'
code, so the round that follows, in the real world, compiles nothing (its guards do not depend on the rank
or the world's size, tested); the survivors wait for a rendezvous, a process group and a checkpoint's load.

Best effort: a warm-up that fails, or that takes longer than ``WARM_WAIT_S``, is said and the node joins as
it would have. ``DTRAIN_WARM_BEFORE_JOIN=0`` (``JobSpec.warm_before_join=False``) joins at once. Stdlib only
at import.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time

from trainer.base.say import say

PREEMPTED_EXIT_CODE = 75  # trainer.config.job_config's, without importing the config here

WARM_ENV = "DTRAIN_WARM_BEFORE_JOIN"
"""``0``: a node's agent meets the others at once; its hosts compile at their first round."""
WARM_WAIT_S = 600.0
"""The longest an agent waits for its hosts' warm-up before it joins anyway (a cold compile of an 8B model's
block on a GPU takes about a minute)."""
POLL_S = 0.05


def warm_path(directory: str, local_rank: int) -> str:
    """Where the host of ``local_rank`` tells its agent how its warm-up went (JSON: seconds, or why not)."""
    return os.path.join(directory, f"{local_rank}.warm")


def enabled() -> bool:
    return os.environ.get(WARM_ENV, "1") != "0"


def micro_batch_rows(global_batch: int, micro_batch: int, rank: int, world_size: int) -> list[int]:
    """The rows of each micro-batch that ``rank`` of ``world_size`` trains a step on
    (``trainer.data.loader``'s
    split: a contiguous share, cut into micro-batches)."""
    from trainer.data.loader import rank_share

    _, share = rank_share(global_batch, rank, world_size)
    return [min(micro_batch, share - start) for start in range(0, share, micro_batch)]


def warm_up_and_tell(directory: str, local_rank: int, world_size: int, argv: list[str], free) -> None:
    """A host's warm-up (``warm_up``; ``free()`` lets go of what it made), then its outcome written for the
    agent, whatever it was."""
    started = time.perf_counter()
    try:
        outcome = {"warm_s": round(warm_up(argv, local_rank, world_size, free), 3)}
    except (Exception, SystemExit) as err:  # noqa: BLE001 - a speed-up only: the node joins, its round compiles
        outcome = {"not_warmed": f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"}
    outcome["took_s"] = round(time.perf_counter() - started, 3)
    tmp = warm_path(directory, local_rank) + ".tmp"
    with open(tmp, "w") as f:
        json.dump(outcome, f)
    os.replace(tmp, warm_path(directory, local_rank))


def warm_up(argv: list[str], local_rank: int, world_size: int, free=lambda: None) -> float:
    """Build the model of the training arguments ``argv`` as rank ``local_rank`` of a fake world of
    ``world_size`` and run one step's forward and backward on random tokens; returns the step's seconds.
    The process group is destroyed, and ``free()`` called, before it returns."""
    from trainer.__main__ import parse_config

    cfg = parse_config(argv)
    if cfg.model.init_from and not os.path.isdir(cfg.model.init_from):
        raise ValueError(f"model.init_from {cfg.model.init_from!r} is not on this node yet: no shape")
    if cfg.parallel.auto_micro_batch_size:
        raise ValueError("parallel.auto_micro_batch_size: the micro-batch is known only in the group")

    import torch
    import torch.distributed as dist
    from trainer import torch_private
    from trainer.torch_private import elastic_hooks

    if not elastic_hooks.register_fake_backend():  # forced off, or this torch has none
        raise RuntimeError(f"no fake process group: {torch_private.why_off('fake_process_group')}")

    from trainer.model import hf
    from trainer.step.process_group import Dist
    from trainer.model.parallelize import build_mesh
    from trainer.step.train_step import build_model

    device = torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("fake", store=dist.HashStore(), rank=local_rank, world_size=world_size)
    try:
        mesh = build_mesh(device.type, world_size, cfg.parallel)
        d = Dist(local_rank, local_rank, world_size, device, mesh)
        model = build_model(cfg, d, hf.model_args(cfg, cfg.model.init_from or None))
        started = time.perf_counter()
        rows = micro_batch_rows(cfg.global_batch_size, cfg.micro_batch_size, local_rank, world_size)
        vocab, seq_len = model.args.vocab_size, cfg.data.seq_len
        for n in rows:
            tokens = torch.randint(0, vocab, (n, seq_len + 1), device=device)
            loss = model(tokens[:, :-1], tokens[:, 1:], loss_chunk_tokens=cfg.parallel.loss_chunk_tokens)
            loss.backward()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - started
    finally:
        model = loss = None
        dist.destroy_process_group()
        free()


def wait_for_the_hosts(directory: str, local_ranks: int, ended, timeout_s: float = WARM_WAIT_S) -> str:
    """Wait until every host of this node has warmed up (or said why not), at most ``timeout_s`` and not once
    ``ended()`` (a host has exited); returns the agent's line on it."""
    started = time.monotonic()
    paths = [warm_path(directory, r) for r in range(local_ranks)]
    with _preempted_before_joining():
        return _wait(paths, ended, timeout_s, started)


@contextlib.contextmanager
def _preempted_before_joining():
    """A SIGTERM or SIGINT while the node warms up (a spot reclaim): it has joined nothing and trained
    nothing, so it exits as preempted (75), said, not killed by the signal."""

    def stop(signum, frame):
        why = f"{signal.Signals(signum).name} while this node warmed up, before it joined: nothing to save"
        say(f"[trainer.launch] exit {PREEMPTED_EXIT_CODE}: {why}")
        raise SystemExit(PREEMPTED_EXIT_CODE)

    try:
        previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    except ValueError:  # not the main thread: signals are not this caller's to take
        previous = {}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _wait(paths: list[str], ended, timeout_s: float, started: float) -> str:
    while not all(os.path.exists(p) for p in paths):
        if ended():
            return "joins without warming up: a training process ended while it warmed up"
        if time.monotonic() - started > timeout_s:
            return f"joins before its training processes have warmed up (waited {timeout_s:.0f} s)"
        time.sleep(POLL_S)
    outcomes = []
    for p in paths:
        with open(p) as f:
            outcomes.append(json.load(f))
    waited = time.monotonic() - started
    if failed := [o["not_warmed"] for o in outcomes if "not_warmed" in o]:
        return f"joins without warming up ({failed[0]}); its first round compiles"
    return (
        f"its training processes built the model and ran a step in a world of their own before it joins "
        f"(waited {waited:.1f} s; one step {max(o['warm_s'] for o in outcomes):.2f} s)"
    )

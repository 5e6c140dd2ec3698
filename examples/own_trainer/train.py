"""A training program of your own under FSDPTrainOperator: a small, real torch loop keeping the contract.

    FSDPTrainOperator(task_id="train", entrypoint=["/path/to/examples/own_trainer/train.py", "--lr", "3e-3"],
                      steps=200, checkpoint_every=50, num_nodes=2, procs_per_node=8, ...)

Every process runs this under the group's torchrun agent; the job's settings come from the DTRAIN_*
environment (``trainer.contract.job_env``), not from flags. It trains a tiny MLP regression with DDP
(gloo on CPU, NCCL on GPU) and keeps its side of the contract (docs/own_training_code.md):

* resumes from the newest committed checkpoint under DTRAIN_CHECKPOINT_URI, whatever the attempt;
* saves every DTRAIN_CHECKPOINT_EVERY steps, at the end, on SIGUSR1 (and trains on), and on SIGTERM,
  after which it exits 75 (``PREEMPTED_EXIT_CODE``): the operator relaunches the group from there;
* a checkpoint is ``step-NNNNNNNN/`` with ``model.pt`` (rank 0: model and optimizer) and ``rank<r>.pt``
  (each rank: its RNG state), committed by rank 0's manifest once every rank has written;
* rank 0 keeps progress.json (the operator's summary, the ledger's step time).

Under a plain torchrun, set the environment yourself::

    DTRAIN_CHECKPOINT_URI=/tmp/own DTRAIN_STEPS=40 DTRAIN_CHECKPOINT_EVERY=10 \\
        torchrun --nproc-per-node 2 examples/own_trainer/train.py
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time

try:
    from trainer.contract import (
        FENCED_EXIT_CODE,
        PREEMPTED_EXIT_CODE,
        STORAGE_EXIT_CODE,
        Fenced,
        Signals,
        commit_checkpoint,
        job_env,
        latest_checkpoint,
        progress,
        simulate_preemption,
        step_path,
        take_lease,
    )
except ImportError:  # the contract copied next to this file
    from contract import (
        FENCED_EXIT_CODE,
        PREEMPTED_EXIT_CODE,
        STORAGE_EXIT_CODE,
        Fenced,
        Signals,  # type: ignore
        commit_checkpoint,
        job_env,
        latest_checkpoint,
        progress,
        simulate_preemption,
        step_path,
        take_lease,
    )

# First, before torch is imported: a SIGTERM or SIGUSR1 that came before the handlers would kill the process.
signals = Signals()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

IN_FEATURES = 16


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="A tiny MLP regression keeping the airflow-dtrain contract.")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--batch-per-rank", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--step-sleep", type=float, default=0.0, help="seconds each step waits (tests: time to signal)"
    )
    return p.parse_args(argv)


def batch(step: int, rank: int, args: argparse.Namespace) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch of ``step`` on ``rank``: a function of the step, so a resumed run sees what it would have."""
    g = torch.Generator().manual_seed(args.seed * 1_000_003 + step * 1009 + rank)
    x = torch.randn(args.batch_per_rank, IN_FEATURES, generator=g)  # (batch, features)
    y = torch.sin(x[:, :4].sum(dim=1, keepdim=True)) + 0.1 * x[:, 4:5]  # (batch, 1)
    return x, y


def params_sha256(model: torch.nn.Module) -> str:
    """A fingerprint of the weights: two runs that trained the same steps on the same data agree on it."""
    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def emit(rank: int, event: str, **fields) -> None:
    """Rank 0's events, as the bundled trainer's (trainer/events.py): one line appended, in one write, to
    ``$DTRAIN_EVENTS_DIR/rank-0.jsonl`` (what the provider reads; the local backend sets it), and the same
    line on stdout, in one write too (``print`` writes the newline apart: another rank's output can land
    between the two in the group's log)."""
    if rank != 0:
        return
    line = json.dumps({"event": event, **fields}) + "\n"
    if os.environ.get("DTRAIN_EVENTS_DIR"):
        os.makedirs(os.environ["DTRAIN_EVENTS_DIR"], exist_ok=True)
        path = os.path.join(os.environ["DTRAIN_EVENTS_DIR"], f"rank-{rank}.jsonl")
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)
    sys.stdout.write(line)
    sys.stdout.flush()


class Run:
    """The model, its optimizer, and the job's checkpoints."""

    def __init__(self, args: argparse.Namespace):
        self.args, self.env = args, job_env()
        self.rank, self.world = self.env.rank, self.env.world_size
        cuda = torch.cuda.is_available()
        self.device = torch.device("cuda", self.env.local_rank) if cuda else torch.device("cpu")
        dist.init_process_group("nccl" if cuda else "gloo")
        torch.manual_seed(args.seed)
        module = torch.nn.Sequential(
            torch.nn.Linear(IN_FEATURES, args.hidden), torch.nn.Tanh(), torch.nn.Linear(args.hidden, 1)
        ).to(self.device)
        self.model = DistributedDataParallel(module)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=args.lr, weight_decay=0.0)
        # One writer per checkpoint directory: a group that lost it to a newer one commits nothing more.
        self.lease = take_lease(self.env.checkpoint_uri, job=self.env.job) if self.rank == 0 else None
        self.step_times: list[float] = []
        self.wall_time_s = 0.0  # over every attempt, as progress.json counts it

    def report(self, step: int, **fields) -> None:
        """progress.json (rank 0): the operator's view of the job."""
        state = progress(step, env=self.env, **fields)
        if state is not None:
            self.wall_time_s = state["wall_time_s"]

    def tokens(self, step: int) -> int:
        return step * self.world * self.args.batch_per_rank  # samples, here

    def resume(self) -> int | None:
        latest = latest_checkpoint(self.env.checkpoint_uri)
        if latest is None:
            self.report(0, tokens_seen=0)
            return None
        state = torch.load(os.path.join(latest.path, "model.pt"), map_location=self.device)
        self.model.module.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        mine = os.path.join(latest.path, f"rank{self.rank}.pt")
        if os.path.exists(mine):  # a resume at another world size starts these afresh
            torch.set_rng_state(torch.load(mine)["rng"])
        emit(self.rank, "resume", from_step=latest.step, path=latest.path)
        self.report(latest.step, tokens_seen=self.tokens(latest.step), latest_checkpoint=latest.path)
        return latest.step

    def save(self, step: int, reason: str) -> None:
        """Every rank writes its files, then rank 0 commits; no rank goes on before the commit."""
        start = time.perf_counter()
        path = step_path(self.env.checkpoint_uri, step, create=True)
        if self.rank == 0:
            torch.save({"model": self.model.module.state_dict(), "optimizer": self.optimizer.state_dict(),
                        "step": step}, os.path.join(path, "model.pt"))  # fmt: skip
        torch.save({"rng": torch.get_rng_state()}, os.path.join(path, f"rank{self.rank}.pt"))
        dist.barrier()
        if self.rank == 0:
            commit_checkpoint(self.env.checkpoint_uri, step, format="torch", lease=self.lease, keep=3,
                              tokens_seen=self.tokens(step), wall_time_s=self.wall_time_s,
                              step_time_s=self.step_time(), reason=reason,
                              params_sha256=params_sha256(self.model.module))  # fmt: skip
            self.report(step, latest_checkpoint=path)
            emit(
                self.rank,
                "checkpoint",
                step=step,
                reason=reason,
                path=path,
                seconds=round(time.perf_counter() - start, 3),
            )
        dist.barrier()

    def step_time(self) -> float | None:
        return round(sum(self.step_times) / len(self.step_times), 6) if self.step_times else None

    def train(self) -> int:
        resumed_from = self.resume()
        loss_fn = torch.nn.MSELoss()
        for step in range((resumed_from or 0) + 1, self.env.steps + 1):
            start = time.perf_counter()
            x, y = (t.to(self.device) for t in batch(step, self.rank, self.args))
            loss = loss_fn(self.model(x), y)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()  # DDP all-reduces the gradients here
            self.optimizer.step()
            if self.args.step_sleep:
                time.sleep(self.args.step_sleep)
            self.step_times.append(time.perf_counter() - start)

            simulate_preemption(step, resumed_from=resumed_from, signals=signals, env=self.env)
            # A signal may have reached only some ranks (one node's): every rank acts on what any rank got.
            asked_now = signals.take_checkpoint_now()
            if asked_now:
                print(f"[own_trainer] rank {self.rank}: SIGUSR1 at step {step}", file=sys.stderr, flush=True)
            flags = torch.tensor([signals.stop, asked_now], dtype=torch.int32)
            dist.all_reduce(flags, op=dist.ReduceOp.MAX)
            stop, now = bool(flags[0]), bool(flags[1])
            mean = loss.detach().to(torch.float64).cpu().reshape(1)
            dist.all_reduce(mean)  # the loss over every rank's batch
            mean = mean.item() / self.world
            emit(self.rank, "train", step=step, loss=round(mean, 6))
            self.report(step, loss=mean, tokens_seen=self.tokens(step), step_time_s=self.step_time())

            if stop:
                signals.ignore_further()
                self.save(step, "preemption")
                self.report(step, status="preempted")
                return PREEMPTED_EXIT_CODE
            if now or self.env.checkpoint_due(step):
                self.save(
                    step, "checkpoint_now" if now else "final" if step == self.env.steps else "interval"
                )
        self.report(self.env.steps, status="completed")
        return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        code = Run(args).train()
    except Fenced as err:
        print(f"[own_trainer] fenced off, exit {FENCED_EXIT_CODE}: {err}", file=sys.stderr, flush=True)
        return FENCED_EXIT_CODE
    except OSError as err:  # the checkpoint location refused a write: a full disk does not fix itself
        print(f"[own_trainer] exit {STORAGE_EXIT_CODE}: {err}", file=sys.stderr, flush=True)
        return STORAGE_EXIT_CODE
    if dist.is_initialized():
        dist.destroy_process_group()
    return code


if __name__ == "__main__":
    sys.exit(main())

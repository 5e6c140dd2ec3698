"""The process group a training attempt runs in: joining it (torchrun or one plain process), and the stop
requests its ranks act on together, at a step boundary."""

import os
import socket
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from trainer.config.sections import ParallelConfig
from trainer.contract import Signals
from trainer.model.parallelize import build_mesh
from trainer.base.say import say


@dataclass(frozen=True)
class Dist:
    rank: int
    local_rank: int
    world_size: int
    device: torch.device
    mesh: DeviceMesh


def world_size_from_env() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def world_fields(world_size: int) -> dict[str, int]:
    """The size of the group this attempt trains in, for its "world" event: ranks, nodes (torchrun's
    ``GROUP_WORLD_SIZE``; one plain process: 1) and the agent's restart count (an elastic group's agents
    restart their workers at every resize)."""
    return {
        "world_size": world_size,
        "nodes": int(os.environ.get("GROUP_WORLD_SIZE", "1")),
        "procs_per_node": int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        "restart": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
    }


def setup_distributed(parallel: ParallelConfig | None = None) -> Dist:
    if "RANK" not in os.environ:  # a plain process: become rank 0 of 1
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        if "MASTER_PORT" not in os.environ:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    rank, local_rank, world_size = (int(os.environ[k]) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE"))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        backend = "cpu:gloo,cuda:nccl"  # nccl for the model, gloo for the odd CPU object exchange
    else:
        device, backend = torch.device("cpu"), "gloo"
    timeout = timedelta(seconds=(parallel or ParallelConfig()).collective_timeout_s)
    if store := world_store(rank, world_size, timeout):
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout)
    else:
        dist.init_process_group(backend, init_method="env://", timeout=timeout)
    # One line from every rank, so a group's log shows who joined where.
    say(
        f"[trainer] rank {rank}/{world_size} (local rank {local_rank}, pid {os.getpid()}) on "
        f"{socket.gethostname()}, "
        f"device {device}, backend {backend}"
    )
    mesh = build_mesh(device.type, world_size, parallel or ParallelConfig())
    if rank == 0 and mesh.ndim > 1:
        say(f"[trainer] HSDP mesh {dict(zip(mesh.mesh_dim_names, mesh.shape))}")
    return Dist(rank, local_rank, world_size, device, mesh)


def world_store(rank: int, world_size: int, timeout: timedelta):
    """The agent's store (``TORCHELASTIC_USE_AGENT_STORE``), its keys prefixed with this world's name
    (``$DTRAIN_WORLD``, ``trainer.elastic.rdzv_round.name_each_world``): what ``env://`` connects to, without
    the keys a rank of the last world left there. None where the agent named no world: ``env://`` as is."""
    world = os.environ.get("DTRAIN_WORLD")
    if not world or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size,
                          is_master=False, timeout=timeout)  # fmt: skip
    return dist.PrefixStore(f"dtrain/world/{world}/", store)


class StopRequests(Signals):
    """The contract's Signals (trainer/contract.py: SIGTERM/SIGINT: save and exit 75; SIGUSR1: save now,
    carry on), with the trainer's own reason to stop, the dollar cap (``budget``, set by rank 0), and the
    agreement every rank acts on: a signal that reached only some ranks (one node's) still stops all.

    Not orphan-aware itself: ``python -m trainer`` calls die_with_agent() first thing.
    """

    def __init__(self):
        super().__init__(stop_when_orphaned=False)
        self.budget = False

    def agree(self) -> tuple[bool, bool, bool]:
        """(stop, checkpoint now, stop at the budget) as any rank asked; every rank gets the same answer."""
        # Taken before the collective: a SIGUSR1 that lands while it waits for the other ranks is kept for
        # the next boundary (clearing the flag after it dropped such a request without a trace).
        checkpoint_now = self.take_checkpoint_now()
        # A CPU tensor: gloo carries it even beside NCCL, so this never waits for the GPU.
        flags = torch.tensor([self.stop, checkpoint_now, self.budget], dtype=torch.int32)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        return bool(flags[0]), bool(flags[1]), bool(flags[2])


def log(d: Dist, message: str) -> None:
    if d.rank == 0:
        say(f"[trainer] {message}")

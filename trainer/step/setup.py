"""Building a training attempt's parts, each refused early where it can be: the data (before the checkpoint
directory is touched), the init_from model's local copy and shape, the checkpointer and the checkpoint to
resume from, the model, and the cost ledger."""

import dataclasses
import random

import numpy as np
import torch
import torch.distributed as dist

from trainer.model import hf
from trainer.step.auto_batch import fit_micro_batch_size
from trainer.money.cap import BudgetGuard, attempt_name
from trainer.checkpoint.checkpointer import Checkpointer
from trainer.checkpoint.directory import CheckpointDir
from trainer.checkpoint.spend_files import SPEND
from trainer.config.job_config import TrainConfig
from trainer.config.fields import ConfigError
from trainer.money.ledger import CostLedger, nodes_in_group
from trainer.data.loader import TrainBatches, default_data_dir, resolve_dataset
from trainer.step.process_group import Dist, log
from trainer.report.metrics import Metrics, flops_per_token
from trainer.money import clock
from trainer.model.llama import Llama
from trainer.step.train_step import build_model


def seed(cfg: TrainConfig, d: Dist) -> None:
    """Seed every generator, each rank its own."""
    random.seed(cfg.seed + d.rank)
    np.random.seed(cfg.seed + d.rank)
    torch.manual_seed(cfg.seed + d.rank)


def load_data(cfg: TrainConfig, d: Dist) -> tuple[str, TrainBatches]:
    """(the token directory, this rank's batches). First: a bad dataset is refused before the checkpoint
    directory is touched (no lease taken)."""
    data_dir = resolve_dataset(cfg.data, d.local_rank == 0, dist.barrier)
    data = TrainBatches(
        data_dir,
        cfg.data.seq_len,
        cfg.global_batch_size,
        cfg.micro_batch_size,
        d.rank,
        d.world_size,
        cfg.seed,
        d.device,
    )
    return data_dir, data


def init_from_dir(cfg: TrainConfig, d: Dist) -> str | None:
    """The init_from model's local directory (each node's local rank 0 copies a remote model first)."""
    if not cfg.model.init_from:
        return None
    if d.local_rank == 0:
        hf.local_copy(cfg.model.init_from, default_data_dir())
    dist.barrier()
    return hf.local_copy(cfg.model.init_from, default_data_dir())


def checkpointer(cfg: TrainConfig, d: Dist, args, data: TrainBatches) -> Checkpointer:
    """data.tokenizer: manifests record it, and a checkpoint of another tokenizer's data is refused."""
    return Checkpointer(
        cfg.checkpoint,
        flavor=cfg.model.flavor,
        shape=dataclasses.asdict(args),
        config=cfg.to_dict(),
        config_hash=cfg.config_hash(),
        rank=d.rank,
        world_size=d.world_size,
        device=d.device,
        tokenizer=data.tokenizer,
        collective_timeout_s=cfg.parallel.collective_timeout_s,
    )


def resume_point(ckpt: Checkpointer, d: Dist):
    """The newest checkpoint that verifies (rank 0 decides), checked against this job before a model is
    built that it cannot fill; the newer ones that fail verification are logged."""
    point = ckpt.resume_point()
    if point is not None:
        ckpt.check_compatible(point[1])
        for skipped in point[2] if d.rank == 0 else ():
            log(
                d,
                f"checkpoint {skipped['checkpoint']} fails verification ({skipped['check']}: "
                f"{skipped['file']}: {skipped['detail']}); resuming from an older one",
            )
    return point


def model(cfg: TrainConfig, d: Dist, args, hf_dir: str | None, fresh: bool) -> Llama:
    """The sharded model. One loaded whole next skips the random draw (on a large model, most of a
    start-up); a fresh job from init_from starts from the source's weights."""
    built = build_model(cfg, d, args, random_init=fresh and hf_dir is None)
    if hf_dir is not None and fresh:
        n = hf.load_weights(built, hf_dir, cfg.model.init_from)
        if d.rank == 0:
            log(d, f"initialised {n} tensors from {cfg.model.init_from}")
    return built


def fit_batch(cfg: TrainConfig, d: Dist, built: Llama, data: TrainBatches, data_dir: str) -> TrainConfig:
    """The micro-batch size that fits (auto_micro_batch_size: same global batch, accumulation absorbs the
    change); data of a larger vocabulary than the model's is refused."""
    if cfg.parallel.auto_micro_batch_size:
        cfg = fit_micro_batch_size(cfg, built, d.device, d.world_size, log=lambda m: log(d, m))
        data.micro_batch_size = cfg.micro_batch_size
    if data.vocab_size > built.args.vocab_size:
        raise ConfigError(
            f"data.dataset: {data_dir} has vocab {data.vocab_size} > model vocab {built.args.vocab_size}"
        )
    return cfg


def cost(cfg: TrainConfig, d: Dist) -> tuple[CostLedger, BudgetGuard | None]:
    """The attempt's cost ledger (opened where an earlier start of this attempt left it) and, on rank 0,
    the budget guard over the job's spend files."""
    ledger_uri = cfg.cost.ledger_uri or cfg.checkpoint.uri
    spend_dir = CheckpointDir(ledger_uri) if ledger_uri else None
    opened = (spend_dir.spend_entry(attempt_name()) or {}) if spend_dir is not None else {}
    # rank 0 alone writes the spend file and the manifests' ledger: it alone probes the storage's clock
    probe = spend_dir is not None and d.rank == 0
    ledger = CostLedger(
        price_per_node_hour=cfg.cost.price_per_node_hour,
        capacity_type=cfg.cost.capacity_type,
        gpus_per_node=cfg.cost.gpus_per_node,
        nodes=nodes_in_group(d.world_size),
        since=opened.get("launched_at"),
        clock=clock.measured(spend_dir.storage, spend_dir.path(SPEND)) if probe else clock.Clock(),
    )
    guard = None
    if d.rank == 0:
        guard = BudgetGuard(cfg.cost, ledger, spend_dir, attempt_name(), cfg.checkpoint.grace_period_s)
    return ledger, guard


def metrics(cfg: TrainConfig, d: Dist, built: Llama) -> Metrics:
    fpt = flops_per_token(built.args, built.num_params(exclude_embedding=True), cfg.data.seq_len)
    return Metrics(
        cfg.metrics,
        is_rank0=d.rank == 0,
        rank=d.rank,
        world_size=d.world_size,
        device=d.device,
        flops_per_token=fpt,
    )

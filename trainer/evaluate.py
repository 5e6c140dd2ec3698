"""``python -m trainer.evaluate --checkpoint-uri DIR [--step S] [--batches N] [--batch-size B]``

Held-out loss of a committed checkpoint (the latest unless --step), in one plain
process. Prints one JSON line per evaluated checkpoint: {"step", "loss", "perplexity",
"tokens", "tokens_per_s", "path", "flavor"}. ``--all`` evaluates every committed
checkpoint (the eval curve), ``--out`` writes the results as JSON, ``--report`` a PNG of
the train and held-out loss curves.
"""

import argparse
import json
import math
import os
import sys
import tempfile
import time
import warnings

import torch
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F

from trainer.checkpoint import storage_reader
from trainer.checkpoint_dir import CheckpointDir, step_dir_name
from trainer.config import TrainConfig
from trainer.data import default_data_dir, ensure_builtin, eval_batches
from trainer.token_store import cache_remote, is_remote
from trainer.model import Llama, ModelArgs


def load_model(step_dir: str, device: torch.device) -> tuple[Llama, dict]:
    """An unsharded model with the weights of a committed checkpoint (any world size), local or s3://."""
    root, step_dir = CheckpointDir.split(step_dir)
    if step_dir is None:
        raise ValueError("load_model: expected a step directory, got a checkpoint root")
    manifest = root.manifest(step_dir)
    cfg = TrainConfig.from_dict(manifest["config"])
    with torch.device("meta"):
        model = Llama(ModelArgs.from_manifest(manifest))
    model.to_empty(device=device)
    model.init_weights(cfg.seed)  # fills the rotary tables; the weights are overwritten below
    state = {"model": model.state_dict()}
    # DCP reads the sharded save into these full tensors; no process group needed.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(state, storage_reader=storage_reader(root.storage, step_dir), no_dist=True)
    model.load_state_dict(state["model"])
    return model.eval(), manifest


@torch.no_grad()
def evaluate(model: Llama, data_dir: str, seq_len: int, batches: int, batch_size: int, device) -> dict:
    total_loss, tokens = 0.0, 0
    for inputs, targets in eval_batches(data_dir, seq_len, batch_size, batches, device):  # (batch, seq_len)
        logits = model(inputs)
        total_loss += F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), reduction="sum").item()
        tokens += targets.numel()
    loss = total_loss / tokens
    return {"loss": loss, "perplexity": math.exp(loss), "tokens": tokens}


def local_dataset(dataset: str) -> str:
    """The local directory of a checkpoint's dataset: the built-in corpus (built here if need be), an
    ``s3://`` store copied once to the node-local cache, or the directory itself."""
    if dataset == "builtin":
        return ensure_builtin(default_data_dir())
    if is_remote(dataset):
        return cache_remote(dataset, default_data_dir(), log=lambda m: print(m, file=sys.stderr, flush=True))
    return dataset


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m trainer.evaluate", description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint-uri", required=True)
    p.add_argument("--step", type=int, help="a committed step (default: the latest)")
    p.add_argument("--batches", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--all", action="store_true", help="also evaluate every other committed checkpoint (the eval curve)")
    p.add_argument("--out", help="write the results as JSON to this file")
    p.add_argument("--report", help="write a PNG of the train and eval loss curves to this file")
    args = p.parse_args(argv)
    try:
        root = CheckpointDir(args.checkpoint_uri)
    except ValueError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    found = dict(root.committed())
    step = args.step if args.step is not None else max(found, default=None)
    if step not in found:
        print(f"no committed checkpoint {step_dir_name(step) if step else ''} under {root.root}", file=sys.stderr)
        return 1
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    results = []
    for s in sorted(found) if args.all else [step]:
        start = time.perf_counter()
        model, manifest = load_model(found[s], device)
        cfg = TrainConfig.from_dict(manifest["config"])
        data_dir = local_dataset(cfg.data.dataset)
        result = evaluate(model, data_dir, cfg.data.seq_len, args.batches, args.batch_size, device)
        seconds = time.perf_counter() - start
        result = {"step": s, **result, "tokens_per_s": result["tokens"] / seconds, "path": found[s],
                  "flavor": cfg.model.flavor}  # fmt: skip
        print(json.dumps(result), flush=True)
        results.append(result)
    latest = next(r for r in results if r["step"] == step)
    train_curve = _train_curve(root)
    if args.report:
        _put(args.report, lambda local: _plot(local, train_curve, [(r["step"], r["loss"]) for r in results], latest))
    if args.out:
        payload = {**latest, "eval_curve": [[r["step"], r["loss"]] for r in results], "train_curve": train_curve,
                   "report": args.report}  # fmt: skip

        def dump(local: str) -> None:
            with open(local, "w") as f:
                json.dump(payload, f, indent=1)

        _put(args.out, dump)
    return 0


def _train_curve(root: CheckpointDir) -> list[list[float]]:
    """[[step, loss], ...] of the training run, from progress.json's history (empty if none)."""
    try:
        return [list(point) for point in root.progress().get("history", [])]
    except (OSError, ValueError, KeyError):
        return []


def _put(path: str, write) -> None:
    """Write a result file through a local temporary file: to a path, or to s3:// with fsspec."""
    import fsspec

    with tempfile.TemporaryDirectory() as tmp:
        local = os.path.join(tmp, os.path.basename(path))
        write(local)
        fs, target = fsspec.core.url_to_fs(path)
        fs.makedirs(fs._parent(target), exist_ok=True)
        fs.put_file(local, target + ".tmp")
        fs.mv(target + ".tmp", target)  # readers never see half a file (a rename locally)


def _plot(path: str, train: list, evals: list, latest: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display on training nodes
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    if train:
        ax.plot([p[0] for p in train], [p[1] for p in train], label="train loss", color="tab:blue")
    ax.plot([p[0] for p in evals], [p[1] for p in evals], "o-", label="held-out loss", color="tab:orange")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats/token)")
    ax.set_title(f"{latest['flavor']}: held-out loss {latest['loss']:.3f} at step {latest['step']}")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())

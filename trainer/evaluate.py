"""``python -m trainer.evaluate --checkpoint-uri DIR [--step S] [--batches N] [--batch-size B]``

Held-out loss of a committed checkpoint (the latest unless --step), in one plain
process. Prints one JSON line per evaluated checkpoint: {"step", "loss", "perplexity",
"tokens", "tokens_per_s", "path", "flavor", "key", "job"}. ``--all`` evaluates every
committed checkpoint (the eval curve), ``--out`` writes the results as JSON, ``--report`` a
PNG of the train and held-out loss curves. With both ``--all`` and ``--out``, a checkpoint
that the results already at ``--out`` hold, evaluated as it is committed now and with the
same batches (its ``key``), is not evaluated again, and the curve keeps the points of the
job's checkpoints that retention has deleted since. ``--export-to ROOT`` also exports the
evaluated checkpoint (``trainer.export``) to ``ROOT/step-…`` in the same process, if its
loss is below ``--export-if-below`` (when given): a promotion then needs no second job.
"""

import argparse
import hashlib
import json
import math
import os
import sys
import time
import warnings

import torch
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F

from trainer.checkpoint.reader import storage_reader
from trainer.checkpoint.directory import CheckpointDir, step_dir_name
from trainer.config.job_config import TrainConfig
from trainer.events import emit
from trainer.data.loader import default_data_dir, ensure_builtin, eval_batches
from trainer.report.eval_report import RunRecord, html_report, plot, put
from trainer.export import export_weights
from trainer.model.llama import Llama, ModelArgs
from trainer.checkpoint.safe_pickle import UnsafeCheckpoint
from trainer.base.say import say
from trainer.base.storage import Storage
from trainer.data.token_store import cache_remote, is_remote


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
    reader = storage_reader(root.storage, step_dir)
    # A forged .metadata is refused here, as itself (UnsafeCheckpoint): inside dcp.load, DCP would log the
    # refusal and go on to look for per-rank metadata before failing with an error of its own.
    reader.read_metadata()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(state, storage_reader=reader, no_dist=True)
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
        return cache_remote(dataset, default_data_dir(), log=lambda m: say(m))
    return dataset


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m trainer.evaluate", description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint-uri", required=True)
    p.add_argument("--step", type=int, help="a committed step (default: the latest)")
    p.add_argument("--batches", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument(
        "--all", action="store_true", help="also evaluate every other committed checkpoint (the eval curve)"
    )
    p.add_argument("--out", help="write the results as JSON to this file")
    p.add_argument("--report", help="write a PNG of the train and eval loss curves to this file")
    p.add_argument(
        "--export-to",
        metavar="ROOT",
        help="export the evaluated checkpoint as a Hugging Face model into its step directory under ROOT",
    )
    p.add_argument(
        "--export-if-below",
        type=float,
        metavar="LOSS",
        help="with --export-to: only if its held-out loss is below LOSS",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    """Evaluate, then write what the arguments ask for; 2 for a bad --checkpoint-uri, 1 when the checkpoint
    asked for is missing or refused."""
    args = _parser().parse_args(argv)
    try:
        root = CheckpointDir(args.checkpoint_uri)
    except ValueError as e:
        say(f"config error: {e}")
        return 2
    found = dict(root.committed())
    step = args.step if args.step is not None else max(found, default=None)
    if step not in found:
        say(f"no committed checkpoint {step_dir_name(step) if step else ''} under {root.root}")
        return 1
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    evaluated = _evaluate_checkpoints(args, root, found, step, device)
    if evaluated is None:
        return 1
    results, model, manifest, cfg = evaluated
    latest = next(r for r in results if r["step"] == step)
    exported = None
    if args.export_to and (args.export_if_below is None or latest["loss"] < args.export_if_below):
        weights = {name: tensor.cpu() for name, tensor in model.state_dict().items()}  # `step`'s, as saved
        exported = export_weights(
            weights, manifest, found[step], Storage(args.export_to).path(step_dir_name(step))
        )
        emit("export", **exported)
    _write_results(args, root, cfg, results, latest, exported)
    return 0


def _evaluate_checkpoints(args, root: CheckpointDir, found: dict, step: int, device):
    """(results by step, the model and manifest of `step`, its config): `step`, and with --all every
    committed checkpoint, the ones an earlier run at --out evaluated as they are now reused. None when the
    checkpoint asked for is refused."""
    # --all with --out: the checkpoints that an earlier evaluation of this directory evaluated as they are
    # now committed, with the same batches, are not evaluated again; those retention has deleted since stay
    # on the curve
    earlier = _earlier_results(args.out, args.batches, args.batch_size) if args.all and args.out else {}
    results, reused = [], []
    # `step` last: an export writes the weights still in memory rather than reading the checkpoint again
    for s in [*sorted(set(found) - {step}), step] if args.all else [step]:
        if s != step and s in earlier:
            key = _evaluation_key(root.manifest(found[s]), args.batches, args.batch_size)
            if earlier[s].get("key") == key:
                results.append({**earlier.pop(s), "path": found[s]})
                reused.append(s)
                continue
        start = time.perf_counter()
        try:
            model, manifest = load_model(found[s], device)
        except UnsafeCheckpoint as err:  # a forged checkpoint: refused, nothing in it ran
            say(f"refused: {err}")
            if s == step:
                return None
            continue  # another point of the curve: left out, the checkpoint asked for is still evaluated
        cfg = TrainConfig.from_dict(manifest["config"])
        results.append(_evaluate_one(args, s, found[s], model, manifest, cfg, start, device))
    if reused:
        say(
            f"[trainer.evaluate] reused the held-out loss of step(s) {reused}, evaluated by an earlier "
            f"run as they are committed now, with the same batches"
        )
    job = results[-1]["job"]
    # deleted by retention since, evaluated by this job: still points of its curve
    results += [r for s, r in earlier.items() if s < min(found) and r.get("job") == job]
    results.sort(key=lambda r: r["step"])
    return results, model, manifest, cfg


def _evaluate_one(args, step: int, path: str, model: Llama, manifest: dict, cfg: TrainConfig, start, device):
    """One checkpoint's result, printed as a JSON line."""
    data_dir = local_dataset(cfg.data.dataset)
    result = evaluate(model, data_dir, cfg.data.seq_len, args.batches, args.batch_size, device)
    seconds = time.perf_counter() - start
    result = {
        "step": step,
        **result,
        "tokens_per_s": result["tokens"] / seconds,
        "path": path,
        "flavor": cfg.model.flavor,
        "key": _evaluation_key(manifest, args.batches, args.batch_size),
        "job": manifest.get("job", ""),
    }
    print(json.dumps(result), flush=True)
    return result


def _write_results(args, root: CheckpointDir, cfg: TrainConfig, results, latest, exported) -> None:
    """--report (report.png and report.html) and --out (the results as JSON)."""
    train_curve = _train_curve(root)
    if args.report:
        run = RunRecord.read(root, cfg)
        evals = [(r["step"], r["loss"]) for r in results]
        put(args.report, lambda local: plot(local, run, evals, latest))
        html = os.path.splitext(args.report)[0] + ".html"
        put(html, lambda local: html_report(local, run, evals, latest, os.path.basename(args.report)))
    if args.out:
        payload = {
            **latest,
            "eval_curve": [[r["step"], r["loss"]] for r in results],
            "train_curve": train_curve,
            "report": args.report,
            "export": exported,
            "batches": args.batches,
            "batch_size": args.batch_size,
            "evaluated": results,
        }

        def dump(local: str) -> None:
            with open(local, "w") as f:
                json.dump(payload, f, indent=1)

        put(args.out, dump)


def _evaluation_key(manifest: dict, batches: int, batch_size: int) -> str:
    """What a held-out loss depends on: the checkpoint as it was committed (its job, its writer's lease, its
    commit time and its config, the dataset's among it) and the batches evaluated."""
    fields = ("job", "lease", "created_at", "config_hash", "tokenizer")
    what = [*(manifest.get(k) for k in fields), batches, batch_size]
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:32]


def _earlier_results(out: str, batches: int, batch_size: int) -> dict[int, dict]:
    """{step: result} of the evaluation whose results are at ``out`` (local or s3://), if it evaluated the
    same number of batches of the same size; {} when there is none or it cannot be read."""
    try:
        storage = Storage(out)
        earlier = storage.read_json(storage.root)
    except (OSError, ValueError):
        return {}
    if not isinstance(earlier, dict) or (earlier.get("batches"), earlier.get("batch_size")) != (
        batches,
        batch_size,
    ):
        return {}
    return {int(r["step"]): r for r in earlier.get("evaluated") or [] if isinstance(r, dict) and "step" in r}


def _train_curve(root: CheckpointDir) -> list[list[float]]:
    """[[step, loss], ...] of the training run, from progress.json's history (empty if none)."""
    try:
        return [list(point[:2]) for point in root.progress().get("history", [])]
    except (OSError, ValueError, KeyError):
        return []


if __name__ == "__main__":
    sys.exit(main())

"""``python -m trainer.export --checkpoint-uri URI --out DIR [--dtype bfloat16]``

Write a committed checkpoint as a Hugging Face model directory (config.json +
safetensors + the training data's tokenizer files, when it had a tokenizer) that ``transformers.LlamaForCausalLM.from_pretrained(DIR)`` loads. URI is
a checkpoint root (its latest committed checkpoint) or a step directory, and DIR a
directory, each local or s3:// (an s3:// export is written to a local temporary
directory, then uploaded, config.json last: a reader that finds it finds the weights).
Our parameter names are HF's without its "model." prefix and rotary embeddings use its
rotate-half layout (see trainer/model.py), so the weights map one to one.
"""

import argparse
import json
import os
import shutil
import sys
import tempfile
import warnings

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from trainer.checkpoint import storage_reader
from trainer.checkpoint_dir import CheckpointDir
from trainer.model import ModelArgs
from trainer.safe_pickle import UnsafeCheckpoint
from trainer.storage import Storage

SHARD_BYTES = 4 << 30  # per safetensors file, as HF hub checkpoints are split


def hf_config(args: ModelArgs, seq_len: int, dtype: torch.dtype) -> dict:
    """transformers' config.json for a model of shape ``args`` trained on ``seq_len``-token sequences."""
    rope = {"rope_type": "default", "rope_theta": args.rope_theta}
    if args.rope_scaling:
        rope = {"rope_type": "llama3", "rope_theta": args.rope_theta, **args.rope_scaling}
    # The trained context, or the scaled context of a llama3-scaled shape.
    max_pos = seq_len
    if args.rope_scaling:
        max_pos = max(max_pos, int(args.rope_scaling["original_max_position_embeddings"] * args.rope_scaling["factor"]))
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": args.vocab_size,
        "hidden_size": args.dim,
        "intermediate_size": args.ffn_dim,
        "num_hidden_layers": args.n_layers,
        "num_attention_heads": args.n_heads,
        "num_key_value_heads": args.n_kv_heads,
        "head_dim": args.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": max_pos,
        "rms_norm_eps": args.norm_eps,
        # transformers >= 5 reads rope_parameters; older releases rope_theta / rope_scaling
        "rope_parameters": rope,
        "rope_theta": args.rope_theta,
        "rope_scaling": ({"rope_type": "llama3", **args.rope_scaling} if args.rope_scaling else None),
        "tie_word_embeddings": args.tie_word_embeddings,
        "attention_bias": False,
        "mlp_bias": False,
        "torch_dtype": str(dtype).removeprefix("torch."),
        "bos_token_id": None,
        "eos_token_id": None,
    }


def load_weights(uri: str) -> tuple[dict[str, torch.Tensor], dict, str]:
    """(full model tensors by our names, manifest, step directory) of a committed checkpoint, any world size."""
    root, step_dir, manifest = CheckpointDir.resolve(uri)
    metadata = storage_reader(root.storage, step_dir).read_metadata()
    state = {k: torch.empty(m.size, dtype=m.properties.dtype) for k, m in metadata.state_dict_metadata.items()
             if k.startswith("model.") and isinstance(m, TensorStorageMetadata)}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(state, storage_reader=storage_reader(root.storage, step_dir), no_dist=True)
    return {k.removeprefix("model."): v for k, v in state.items()}, manifest, step_dir


def export(uri: str, out: str, dtype: torch.dtype | None = None) -> dict:
    """Write out/config.json and out/model*.safetensors; returns {"step", "checkpoint", "out", "files"}."""
    return export_weights(*load_weights(uri), out, dtype)


def export_weights(weights: dict[str, torch.Tensor], manifest: dict, step_dir: str, out: str,
                   dtype: torch.dtype | None = None) -> dict:
    """``export`` of weights already read from the checkpoint ``step_dir`` (``manifest``'s): a caller that has
    just loaded them, as the evaluation has, need not read the checkpoint again."""
    dtype = dtype or next(iter(weights.values())).dtype
    destination = Storage(out)
    if not destination.remote:
        files = write_hf_directory(destination.root, weights, manifest, dtype)
    else:
        with tempfile.TemporaryDirectory(prefix="dtrain-export-") as staging:
            files = write_hf_directory(staging, weights, manifest, dtype)
            for name in [*files, "config.json"]:  # config.json last
                destination.put_file(os.path.join(staging, name), destination.path(name))
    return {"step": manifest["step"], "checkpoint": step_dir, "out": destination.root, "files": files}


def copy_tokenizer(dataset: str, out: str) -> list[str]:
    """The tokenizer files of the token store the model was trained on (its ``tokenizer/`` directory,
    local or s3://) copied into ``out``; [] for the built-in byte-level data, which has none."""
    from trainer.token_store import TOKENIZER_FILES, is_remote, remote_fs

    if dataset in ("", "builtin"):
        return []
    copied = []
    if is_remote(dataset):
        fs, root = remote_fs(dataset)
        for name in TOKENIZER_FILES:
            if fs.exists(f"{root.rstrip('/')}/tokenizer/{name}"):
                fs.get_file(f"{root.rstrip('/')}/tokenizer/{name}", os.path.join(out, name))
                copied.append(name)
        return copied
    src = os.path.join(dataset.removeprefix("file://"), "tokenizer")
    for name in TOKENIZER_FILES:
        if os.path.exists(os.path.join(src, name)):
            shutil.copyfile(os.path.join(src, name), os.path.join(out, name))
            copied.append(name)
    return copied


def write_hf_directory(out: str, weights: dict[str, torch.Tensor], manifest: dict, dtype: torch.dtype) -> list[str]:
    """config.json, safetensors shards (plus their index when there are several) and the training data's
    tokenizer files in a local directory; returns the files' names, config.json not."""
    from safetensors.torch import save_file

    # HF: "model." + our name for the decoder, lm_head.weight at the top (absent when tied).
    tensors = {(k if k == "lm_head.weight" else f"model.{k}"): v.to(dtype).contiguous() for k, v in weights.items()}
    os.makedirs(out, exist_ok=True)
    shards, current, size = [], {}, 0
    for name in sorted(tensors):
        nbytes = tensors[name].numel() * tensors[name].element_size()
        if current and size + nbytes > SHARD_BYTES:
            shards.append(current)
            current, size = {}, 0
        current[name], size = tensors[name], size + nbytes
    shards.append(current)
    files = []
    if len(shards) == 1:
        files.append("model.safetensors")
        save_file(shards[0], os.path.join(out, files[0]), metadata={"format": "pt"})
    else:
        weight_map = {}
        for i, shard in enumerate(shards, 1):
            fname = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
            save_file(shard, os.path.join(out, fname), metadata={"format": "pt"})
            weight_map.update({name: fname for name in shard})
            files.append(fname)
        total = sum(t.numel() * t.element_size() for t in tensors.values())
        with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
        files.append("model.safetensors.index.json")
    files += copy_tokenizer(manifest["config"]["data"]["dataset"], out)
    with open(os.path.join(out, "config.json"), "w") as f:
        args = ModelArgs.from_manifest(manifest)
        json.dump(hf_config(args, manifest["config"]["data"]["seq_len"], dtype), f, indent=2)
    return files


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m trainer.export", description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint-uri", required=True, help="a checkpoint root (latest committed) or a step directory")
    p.add_argument("--out", required=True, help="output directory, local or s3://")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), help="default: as trained")
    args = p.parse_args(argv)
    try:
        result = export(args.checkpoint_uri, args.out, getattr(torch, args.dtype) if args.dtype else None)
    except FileNotFoundError as err:
        print(f"export: {err}", file=sys.stderr)
        return 1
    except UnsafeCheckpoint as err:  # a forged checkpoint: refused, nothing in it ran
        print(f"export: refused: {err}", file=sys.stderr)
        return 1
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

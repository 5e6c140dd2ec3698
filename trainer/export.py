"""``python -m trainer.export --checkpoint-uri URI --out DIR [--dtype bfloat16]``

Write a committed checkpoint as a Hugging Face model directory (config.json +
safetensors + the training data's tokenizer files, when it had a tokenizer) that
``transformers.LlamaForCausalLM.from_pretrained(DIR)`` loads. URI is a checkpoint root (its
latest committed checkpoint) or a step directory, and DIR a directory, each local or s3:// (an
s3:// export is written to a local temporary directory, then uploaded, config.json last: a
reader that finds it finds the weights).
Our parameter names are HF's without its "model." prefix and rotary embeddings use its
rotate-half layout (see trainer/model/llama.py), so the weights map one to one.

A model continued from a Hugging Face model (``model.init_from``) is given back as the source was,
only its weights trained: the source's config.json (context length, RoPE settings, special token
ids, everything training does not change), its generation_config.json (or one made from the
config's bos/eos/pad ids, so ``generate`` stops at EOS) and its weights' dtype, unless ``--dtype``
says otherwise. These come from the manifest, which records them at training start (``hf_source``,
trainer/model/hf.py), so the source directory need not exist any more; for a checkpoint from before that
record, from the source directory if it is still readable. What could not be kept is listed in the
result (``not_kept``) and said on stderr.
"""

import argparse
import dataclasses
import json
import os
import shutil
import sys
import tempfile
import warnings
from dataclasses import dataclass, field

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from trainer.model import hf
from trainer.checkpoint.reader import storage_reader
from trainer.checkpoint.directory import CheckpointDir
from trainer.config.fields import ConfigError
from trainer.model.llama import ModelArgs
from trainer.checkpoint.safe_pickle import UnsafeCheckpoint
from trainer.base.say import say
from trainer.base.storage import Storage

SHARD_BYTES = 4 << 30  # per safetensors file, as HF hub checkpoints are split
# config.json's dtype field: transformers >= 5 writes "dtype", older releases "torch_dtype"
DTYPE_KEYS = ("dtype", "torch_dtype")
GENERATION_IDS = ("bos_token_id", "eos_token_id", "pad_token_id")


def hf_config(args: ModelArgs, seq_len: int, dtype: torch.dtype) -> dict:
    """transformers' config.json for a model of shape ``args`` trained on ``seq_len``-token sequences."""
    rope = {"rope_type": "default", "rope_theta": args.rope_theta}
    if args.rope_scaling:
        rope = {"rope_type": "llama3", "rope_theta": args.rope_theta, **args.rope_scaling}
    # The trained context, or the scaled context of a llama3-scaled shape.
    max_pos = seq_len
    if args.rope_scaling:
        max_pos = max(
            max_pos, int(args.rope_scaling["original_max_position_embeddings"] * args.rope_scaling["factor"])
        )
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
    """(full model tensors by our names, manifest, step directory) of a committed checkpoint, any world
    size."""
    root, step_dir, manifest = CheckpointDir.resolve(uri)
    metadata = storage_reader(root.storage, step_dir).read_metadata()
    state = {
        k: torch.empty(m.size, dtype=m.properties.dtype)
        for k, m in metadata.state_dict_metadata.items()
        if k.startswith("model.") and isinstance(m, TensorStorageMetadata)
    }
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(state, storage_reader=storage_reader(root.storage, step_dir), no_dist=True)
    return {k.removeprefix("model."): v for k, v in state.items()}, manifest, step_dir


@dataclass
class Source:
    """The init_from model as the export gives it back: its config files (parsed) and weights' dtype, and what
    of it could not be found (``not_kept``, said with the export's result)."""

    uri: str
    config: dict | None = None
    generation_config: dict | None = None
    dtype: str | None = None
    not_kept: list[str] = field(default_factory=list)


def source_of(manifest: dict) -> Source | None:
    """The init_from model of a checkpoint (None: trained from scratch): as its manifest recorded it, else
    (a checkpoint from before that record) read from the source itself, if it is still there."""
    uri = ((manifest.get("config") or {}).get("model") or {}).get("init_from") or ""
    if not uri:
        return None
    record, why = manifest.get("hf_source"), ""
    if record is None:
        record, why = _read_source(uri)
    source = Source(uri)
    if record is not None:
        files = {name: json.loads(record[name]) for name in hf.SOURCE_FILES if record.get(name)}
        source.config = files.get("config.json")
        source.generation_config = files.get("generation_config.json")
        declared = [source.config[k] for k in DTYPE_KEYS if (source.config or {}).get(k)]
        dtype = record.get("dtype") or (declared[0] if declared else None)
        source.dtype = dtype if isinstance(getattr(torch, str(dtype), None), torch.dtype) else None
    if source.config is not None:  # a config that is not this checkpoint's shape would lie about the weights
        trained = ModelArgs.from_manifest(manifest)
        try:
            described = hf.model_args_from_config(source.config, trained.max_seq_len, uri)
        except ConfigError as err:
            described, why = None, str(err)
        if described != trained:
            why = why or f"its config.json does not describe the trained shape {dataclasses.asdict(trained)}"
            source.config = source.generation_config = None
    if source.config is None:
        seq_len = manifest["config"]["data"]["seq_len"]
        why = why or "the recorded source has no config.json"
        source.not_kept = [
            f"config.json (written from the trained shape instead: max_position_embeddings is "
            f"the training seq_len {seq_len} or the RoPE scaling's, no bos/eos/pad token ids) "
            f"and generation_config.json, because {why}"
        ]
    return source


def _read_source(uri: str) -> tuple[dict | None, str]:
    """(the record trainer.model.hf.source_record would have made, or None, and why not) of a source read
    now."""
    try:
        storage = Storage(uri)
        record = {"uri": uri}
        for name in hf.SOURCE_FILES:
            if storage.exists(storage.path(name)):
                with storage.open(storage.path(name), "rb") as f:
                    record[name] = f.read().decode()
        if not storage.remote and "config.json" in record:
            record["dtype"] = hf.weights_dtype(storage.root)
    except (OSError, ValueError, ConfigError) as err:
        return None, f"{uri} cannot be read ({err})"
    if "config.json" not in record:
        return None, f"{uri} has no config.json (any more), and the manifest holds no record of it"
    return record, ""


def export(uri: str, out: str, dtype: torch.dtype | None = None) -> dict:
    """Write out/config.json and out/model*.safetensors; returns {"step", "checkpoint", "out", "files"} (and
    ``not_kept`` when the source of an init_from model could not be given back whole)."""
    return export_weights(*load_weights(uri), out, dtype)


def export_weights(
    weights: dict[str, torch.Tensor],
    manifest: dict,
    step_dir: str,
    out: str,
    dtype: torch.dtype | None = None,
) -> dict:
    """``export`` of weights already read from the checkpoint ``step_dir`` (``manifest``'s): a caller that has
    just loaded them, as the evaluation has, need not read the checkpoint again.

    dtype: the weights' dtype in the export; default the init_from model's (a bf16 source stays bf16, not
    twice its size in float32), else as trained."""
    source = source_of(manifest)
    not_kept = list(source.not_kept) if source is not None else []
    if dtype is None and source is not None:
        if source.dtype is not None:
            dtype = getattr(torch, source.dtype)  # checked to be a dtype's name by source_of
        else:
            not_kept.append("the weights' dtype (unknown: saved as trained)")
    dtype = dtype or next(iter(weights.values())).dtype
    destination = Storage(out)
    if not destination.remote:
        files = write_hf_directory(destination.root, weights, manifest, dtype, source)
    else:
        with tempfile.TemporaryDirectory(prefix="dtrain-export-") as staging:
            files = write_hf_directory(staging, weights, manifest, dtype, source)
            for name in [*files, "config.json"]:  # config.json last
                destination.put_file(os.path.join(staging, name), destination.path(name))
    result = {"step": manifest["step"], "checkpoint": step_dir, "out": destination.root, "files": files}
    if not_kept:
        say(f"[trainer.export] from the init_from model {source.uri}, not kept: {'; '.join(not_kept)}")
        result["not_kept"] = not_kept
    return result


def copy_tokenizer(dataset: str, out: str) -> list[str]:
    """The tokenizer files of the token store the model was trained on (its ``tokenizer/`` directory,
    local or s3://) copied into ``out``; [] for the built-in byte-level data, which has none."""
    from trainer.data.token_store import TOKENIZER_FILES, is_remote, remote_fs

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


def kept_config(source: dict, dtype: torch.dtype) -> dict:
    """The source's config.json as it was: training changes no field of it, only the weights' dtype may differ
    (written where the source keeps it)."""
    config = dict(source)
    name = str(dtype).removeprefix("torch.")
    keys = [k for k in DTYPE_KEYS if k in config] or ["torch_dtype"]
    config.update({k: name for k in keys})
    return config


def generation_config(config: dict, source: Source | None) -> dict | None:
    """The source's generation_config.json, else one made from config.json's special token ids (what
    transformers' ``GenerationConfig.from_model_config`` takes), so that ``generate`` stops at EOS; None
    when the config names none (a model trained from scratch)."""
    if source is not None and source.generation_config is not None:
        return source.generation_config
    ids = {k: config[k] for k in GENERATION_IDS if config.get(k) is not None}
    return ids or None


def write_hf_directory(
    out: str,
    weights: dict[str, torch.Tensor],
    manifest: dict,
    dtype: torch.dtype,
    source: Source | None = None,
) -> list[str]:
    """config.json, generation_config.json (when there are token ids to stop at), safetensors shards (plus
    their index when there are several) and the training data's tokenizer files in a local directory; returns
    the files' names, config.json not."""
    from safetensors.torch import save_file

    # HF: "model." + our name for the decoder, lm_head.weight at the top (absent when tied).
    tensors = {
        (k if k == "lm_head.weight" else f"model.{k}"): v.to(dtype).contiguous() for k, v in weights.items()
    }
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
    if source is not None and source.config is not None:
        config = kept_config(source.config, dtype)
    else:
        config = hf_config(ModelArgs.from_manifest(manifest), manifest["config"]["data"]["seq_len"], dtype)
    generation = generation_config(config, source)
    if generation is not None:
        with open(os.path.join(out, "generation_config.json"), "w") as f:
            json.dump(generation, f, indent=2)
        files.append("generation_config.json")
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    return files


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m trainer.export", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--checkpoint-uri", required=True, help="a checkpoint root (latest committed) or a step directory"
    )
    p.add_argument("--out", required=True, help="output directory, local or s3://")
    p.add_argument(
        "--dtype",
        choices=("float32", "bfloat16", "float16"),
        help="the weights' dtype; default: the init_from model's, else as trained",
    )
    args = p.parse_args(argv)
    try:
        result = export(args.checkpoint_uri, args.out, getattr(torch, args.dtype) if args.dtype else None)
    except FileNotFoundError as err:
        say(f"export: {err}")
        return 1
    except UnsafeCheckpoint as err:  # a forged checkpoint: refused, nothing in it ran
        say(f"export: refused: {err}")
        return 1
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

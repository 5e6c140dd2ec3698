"""Start from a Hugging Face Llama checkpoint: ``model.init_from`` (config.json + safetensors).

The shape comes from the source's ``config.json`` (any Llama-family size: layers, heads,
KV heads, RoPE theta and "llama3" scaling, tied embeddings, vocabulary), not from a fixed
flavour. The weights go straight into the FSDP2-sharded model: each rank reads, tensor by
tensor, only the rows of its own shard (FSDP2 shards dim 0, so a shard is one contiguous
byte range of the file) through ``safetensors``' lazy slices. No rank ever holds a full
copy of the model; the largest transient is one rank's shard of one tensor in the file's
dtype before it is cast to the parameter's.

Names map one to one (trainer/model/llama.py uses HF's names without the ``model.`` prefix;
``lm_head.weight`` stays at the top and is absent when the embeddings are tied). A missing
or mis-shaped tensor fails before training with its name, both shapes and the file.

An ``s3://`` (or ``file://``) source is copied first: each node's local rank 0 downloads
config.json and the safetensors files into a node-local cache (``DTRAIN_DATA_DIR``'s
``hf/`` directory, keyed by the URI) while the node's other ranks wait; then every rank
reads its slices from there. Hub ids are not fetched here (no network is assumed): put the
model in a directory or a bucket first.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil

import torch
from torch.distributed.tensor import DTensor, distribute_tensor

from trainer.config.job_config import TrainConfig
from trainer.config.fields import ConfigError
from trainer.model.llama import ModelArgs
from trainer.data.token_store import BYTES_TOKENIZER, canonical_sha256, describe_tokenizer, same_tokenizer

SUPPORTED_ROPE = ("default", "llama3")
LLAMA3_SCALING_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
SOURCE_FILES = ("config.json", "generation_config.json")
"""The source's files an export gives back as they were (trainer/export.py), recorded in every manifest."""
SAFETENSORS_DTYPES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32", "F64": "float64"}


def _field(uri: str) -> str:
    return f"model.init_from: {uri}/config.json"


def read_config(directory: str) -> dict:
    path = os.path.join(directory, "config.json")
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        raise ConfigError(
            f"model.init_from: {directory!r} has no config.json (a Hugging Face model directory "
            "holds config.json and *.safetensors)"
        ) from None
    except json.JSONDecodeError as err:
        raise ConfigError(f"model.init_from: {path} is not valid JSON ({err})") from None


def model_args_from_config(config: dict, max_seq_len: int, uri: str = "") -> ModelArgs:
    """Our ModelArgs for a transformers LlamaConfig dict; unsupported features are refused by name."""
    where = _field(uri)
    model_type = config.get("model_type")
    if model_type != "llama":
        raise ConfigError(f"{where} has model_type {model_type!r}; supported: 'llama' (Llama-family models)")
    for flag in ("attention_bias", "mlp_bias"):
        if config.get(flag):
            raise ConfigError(f"{where} has {flag} true; supported: false (Llama has no biases)")
    act = config.get("hidden_act", "silu")
    if act != "silu":
        raise ConfigError(f"{where} has hidden_act {act!r}; supported: 'silu'")
    dim, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
    head_dim = config.get("head_dim")
    if head_dim is not None and int(head_dim) != dim // heads:
        raise ConfigError(
            f"{where} has head_dim {head_dim}; supported: hidden_size / num_attention_heads = {dim // heads}"
        )
    # transformers >= 5: rope_parameters {rope_type, rope_theta, ...}; older: rope_theta + rope_scaling
    rope = dict(config.get("rope_parameters") or {})
    theta = float(rope.get("rope_theta", config.get("rope_theta", 10000.0)))
    scaling = (
        rope if rope.get("rope_type", "default") != "default" else dict(config.get("rope_scaling") or {})
    )
    rope_type = scaling.get("rope_type", scaling.get("type", "default")) if scaling else "default"
    if rope_type not in SUPPORTED_ROPE:
        raise ConfigError(f"{where} has rope_type {rope_type!r}; supported: {', '.join(SUPPORTED_ROPE)}")
    rope_scaling = None
    if rope_type == "llama3":
        missing = [k for k in LLAMA3_SCALING_KEYS if k not in scaling]
        if missing:
            raise ConfigError(f"{where} has llama3 rope scaling without {', '.join(missing)}")
        rope_scaling = {
            k: (int(scaling[k]) if k == "original_max_position_embeddings" else float(scaling[k]))
            for k in LLAMA3_SCALING_KEYS
        }
    return ModelArgs(
        dim=dim,
        n_layers=int(config["num_hidden_layers"]),
        n_heads=heads,
        n_kv_heads=int(config.get("num_key_value_heads") or heads),
        ffn_dim=int(config["intermediate_size"]),
        vocab_size=int(config["vocab_size"]),
        norm_eps=float(config.get("rms_norm_eps", 1e-5)),
        rope_theta=theta,
        rope_scaling=rope_scaling,
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        max_seq_len=max_seq_len,
    )


def local_copy(uri: str, cache_root: str) -> str:
    """The local directory holding ``uri``'s files: the path itself, or a node-local copy of a remote one."""
    if "://" not in uri:
        return uri
    if uri.startswith("file://"):
        return uri[len("file://") :]
    from trainer.base.storage import Storage

    src = Storage(uri)
    dest = os.path.join(cache_root, "hf", hashlib.sha256(uri.encode()).hexdigest()[:16])
    if os.path.exists(os.path.join(dest, "config.json")):
        return dest
    names = [n for n in src.listdir(src.root) if n == "config.json" or n.endswith((".safetensors", ".json"))]
    if "config.json" not in names:
        raise ConfigError(f"model.init_from: {uri!r} has no config.json")
    tmp = f"{dest}.tmp-{os.getpid()}"
    os.makedirs(tmp, exist_ok=True)
    for name in sorted(names, key=lambda n: n == "config.json"):  # config.json last: it marks a whole copy
        with src.open(src.path(name), "rb") as fin, open(os.path.join(tmp, name), "wb") as fout:
            shutil.copyfileobj(fin, fout, 16 << 20)
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    try:
        os.rename(tmp, dest)
    except OSError:  # another process of this node finished first
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def model_args(cfg: TrainConfig, directory: str | None = None) -> ModelArgs:
    """The model's shape: the init_from model's config.json (read from ``directory``, its local copy), else
    the flavour."""
    if cfg.model.init_from:
        return model_args_from_config(
            read_config(directory or cfg.model.init_from), cfg.data.seq_len, cfg.model.init_from
        )
    return ModelArgs.from_flavor(cfg.model.flavor, cfg.data.seq_len)


def _weight_files(directory: str) -> dict[str, str]:
    """{HF tensor name: safetensors file} of a model directory (one file or an index of shards)."""
    index = os.path.join(directory, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            return {name: os.path.join(directory, file) for name, file in json.load(f)["weight_map"].items()}
    single = os.path.join(directory, "model.safetensors")
    if not os.path.exists(single):
        raise ConfigError(
            f"model.init_from: {directory!r} has neither model.safetensors nor "
            "model.safetensors.index.json (only safetensors weights are read)"
        )
    from safetensors import safe_open

    with safe_open(single, framework="pt") as f:
        return {name: single for name in f.keys()}


def hf_name(ours: str) -> str:
    """Our parameter name -> its name in a transformers LlamaForCausalLM checkpoint."""
    return ours if ours == "lm_head.weight" else f"model.{ours}"


@torch.no_grad()
def load_weights(model: torch.nn.Module, directory: str, uri: str = "") -> int:
    """Fill every parameter of ``model`` (sharded or not) from the HF checkpoint in ``directory``,
    each rank reading only its own rows; returns the number of tensors loaded."""
    from safetensors import safe_open
    from trainer.torch_private import tensor_hooks

    files = _weight_files(directory)
    source = uri or directory
    by_file: dict[str, list[tuple[str, torch.Tensor]]] = {}
    for name, param in model.named_parameters():
        key = hf_name(name)
        if key not in files:
            raise ConfigError(
                f"model.init_from: {source} has no tensor {key!r} (our {name}, shape "
                f"{tuple(param.shape)}); is it a Llama checkpoint of the shape in its config.json?"
            )
        by_file.setdefault(files[key], []).append((name, param))
    for path, params in by_file.items():
        with safe_open(path, framework="pt") as f:
            for name, param in params:
                key = hf_name(name)
                lazy = f.get_slice(key)
                shape = tuple(lazy.get_shape())
                if shape != tuple(param.shape):
                    raise ConfigError(
                        f"model.init_from: tensor {key!r} in {os.path.basename(path)} has shape "
                        f"{shape}, the model needs {tuple(param.shape)} (from config.json)"
                    )
                if isinstance(param, DTensor):
                    local = param.to_local()
                    found = tensor_hooks.local_shape_and_offset(param)
                    if found is None:  # the fallback: the whole tensor, cut here as FSDP2 placed the shard
                        whole = lazy[:].to(dtype=param.dtype, device=local.device)
                        local.copy_(distribute_tensor(whole, param.device_mesh, param.placements,
                                                      src_data_rank=None).to_local())  # fmt: skip
                        continue
                    local_shape, offset = found
                    if local.numel() == 0:
                        continue
                    rows = lazy[tuple(slice(o, o + n) for o, n in zip(offset, local_shape))]
                else:
                    local, rows = param, lazy[:]
                local.copy_(rows.to(dtype=local.dtype, device=local.device))
    return sum(len(p) for p in by_file.values())


def weights_dtype(directory: str) -> str | None:
    """The dtype of the source's weights as stored (read from the safetensors headers, not config.json's
    ``torch_dtype``, which may be absent or say otherwise); None when the tensors are of several dtypes."""
    from safetensors import safe_open

    dtypes = set()
    for path in sorted(set(_weight_files(directory).values())):
        with safe_open(path, framework="pt") as f:
            dtypes.update(f.get_slice(name).get_dtype() for name in f.keys())
    names = {SAFETENSORS_DTYPES.get(d, d) for d in dtypes}
    return names.pop() if len(names) == 1 else None


def source_record(directory: str, uri: str) -> dict:
    """What an export needs to give the source model back as it was, beside the trained weights: its
    config.json and generation_config.json verbatim (small JSON files; kept as text, so a manifest's checks
    never see the source's own numbers) and its weights' dtype. Recorded in every manifest of the job
    (``hf_source``), so that an export never depends on the source directory still being there."""
    record = {"uri": uri, "dtype": weights_dtype(directory)}
    for name in SOURCE_FILES:
        path = os.path.join(directory, name)
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                record[name] = f.read()
    return record


def model_tokenizer(directory: str, uri: str) -> dict | None:
    """The identity (trainer.data.token_store) of the tokenizer the init_from model ships (its
    tokenizer.json), as ``prepare_data --tokenizer`` computes it for a store prepared with that directory;
    None: none there."""
    path = os.path.join(directory, "tokenizer.json")
    if not os.path.exists(path):
        return None
    with open(path, "rb") as f:
        raw = f.read()
    try:
        from tokenizers import Tokenizer

        vocab = Tokenizer.from_str(raw.decode()).get_vocab_size(with_added_tokens=True)
        sha = canonical_sha256(raw)
    except ImportError:  # the trainer extra has it; without it, only the vocabulary goes unnamed
        vocab, sha = None, canonical_sha256(raw)
    except Exception as err:  # noqa: BLE001 - the library's own words, with the file named
        message = f"model.init_from: {uri}/tokenizer.json is not a tokenizers JSON file: {err}"
        raise ConfigError(message) from None
    return {"kind": "hf", "name": os.path.basename(uri.rstrip("/")), "sha256": sha, "vocab_size": vocab}


def check_data_tokenizer(directory: str, uri: str, dataset: str, data_tokenizer: dict | None) -> None:
    """Refuse data the init_from model cannot read: its embeddings mean its own tokenizer's tokens, so
    training it on byte-level data (the built-in corpus, a store prepared without ``--tokenizer``) or on
    another tokenizer's ids would overwrite what it knows, silently. A model without a tokenizer.json
    takes any data: there is nothing to compare (a sentencepiece-only model still refuses bytes)."""
    model = model_tokenizer(directory, uri)
    data = data_tokenizer or BYTES_TOKENIZER
    fix = (
        f"prepare the text with the model's tokenizer (python -m trainer.prepare_data --input FILE "
        f"--tokenizer {uri} --out DIR; the train_llama DAG's prepare_data task does it itself) and give "
        "that store as data.dataset"
    )
    where = f"data.dataset: {dataset!r}" + (" (the built-in demo corpus)" if dataset == "builtin" else "")
    if model is None:
        if data.get("kind") == "bytes" and os.path.exists(os.path.join(directory, "tokenizer.model")):
            raise ConfigError(
                f"{where} is byte-level text ({describe_tokenizer(data)}), but model.init_from "
                f"{uri!r} has its own tokenizer (sentencepiece, tokenizer.model): its "
                f"embeddings mean that tokenizer's tokens; {fix}"
            )
        return
    if same_tokenizer(model, data):
        return
    if data.get("kind") == "bytes":
        raise ConfigError(
            f"{where} is byte-level text ({describe_tokenizer(data)}, no tokenizer), but "
            f"model.init_from {uri!r} has its own tokenizer {describe_tokenizer(model)}: its "
            f"embeddings mean that tokenizer's tokens; {fix}"
        )
    raise ConfigError(
        f"{where} was prepared with tokenizer {describe_tokenizer(data)}, but model.init_from "
        f"{uri!r} has tokenizer {describe_tokenizer(model)}: its embeddings mean that "
        f"tokenizer's tokens; {fix}"
    )

"""A tiny Hugging Face Llama saved locally (transformers' own LlamaConfig + save_pretrained): the
source model of the init_from tests, built without the network."""

from __future__ import annotations

import inspect


def tiny_llama(
    path,
    *,
    vocab_size: int = 256,
    tie: bool = False,
    rope_scaling: dict | None = None,
    n_kv_heads: int = 2,
    seed: int = 0,
    max_shard_size: str | None = None,
) -> str:
    """Save a 2-layer Llama (dim 64, 4 heads) with random weights and non-trivial norm gains under
    ``path``; sharded into several safetensors files when ``max_shard_size`` is given. Returns the path."""
    import torch
    import transformers

    rope = {"rope_type": "default", "rope_theta": 10000.0}
    if rope_scaling:
        rope = {"rope_type": "llama3", "rope_theta": 10000.0, **rope_scaling}
    if (
        "rope_parameters" in inspect.signature(transformers.LlamaConfig.__init__).parameters
    ):  # transformers >= 5
        rope_kwargs = {"rope_parameters": rope}
    else:
        rope_kwargs = {
            "rope_theta": 10000.0,
            "rope_scaling": {k: v for k, v in rope.items() if k != "rope_theta"} if rope_scaling else None,
        }
    config = transformers.LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=n_kv_heads,
        rms_norm_eps=1e-5,
        max_position_embeddings=256,
        tie_word_embeddings=tie,
        **rope_kwargs,
    )
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config)
    with torch.no_grad():  # every norm gain 1 would hide a mis-mapped norm
        g = torch.Generator().manual_seed(seed)
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g))
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(str(path), safe_serialization=True, **kwargs)
    return str(path)

"""A Llama 3 decoder: RMSNorm, rotary embeddings, grouped-query attention, SwiGLU.

Parameter names follow Hugging Face's LlamaForCausalLM without its "model." prefix
(``layers.0.self_attn.q_proj.weight``, ``norm.weight``, ``lm_head.weight``), and rotary
embeddings use its rotate-half convention, so weights map one to one onto an HF
checkpoint and logits can be compared with transformers.

The model is built on the meta device (no memory), sharded, then materialised with
``model.to_empty(device=...)`` followed by ``model.init_weights(seed)``.
"""

import math
import zlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from trainer.model.loss import cross_entropy
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.utils.checkpoint import checkpoint, noop_context_fn

from trainer.config.flavors import FLAVORS


@dataclass(frozen=True)
class ModelArgs:
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    ffn_dim: int
    vocab_size: int
    norm_eps: float
    rope_theta: float
    rope_scaling: dict | None
    tie_word_embeddings: bool
    max_seq_len: int

    @classmethod
    def from_flavor(cls, flavor: str, max_seq_len: int) -> "ModelArgs":
        return cls(**FLAVORS[flavor], max_seq_len=max_seq_len)

    @classmethod
    def from_manifest(cls, manifest: dict) -> "ModelArgs":
        """The shape a checkpoint was trained with: its recorded ``model_args``, or (older manifests) its
        flavour."""
        if manifest.get("model_args"):
            return cls(**manifest["model_args"])
        return cls.from_flavor(manifest["flavor"], manifest["config"]["data"]["seq_len"])

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads


def rope_inv_freq(args: ModelArgs) -> torch.Tensor:
    """Inverse rotary frequencies, (head_dim / 2,), with Llama 3.1's long-context scaling when set."""
    # float32 throughout, computed exactly as transformers does, so logits match it closely.
    inv_freq = 1.0 / (
        args.rope_theta ** (torch.arange(0, args.head_dim, 2, dtype=torch.int64).float() / args.head_dim)
    )
    s = args.rope_scaling
    if not s:
        return inv_freq
    # Same rule as transformers' "llama3" rope type: long wavelengths are slowed down by
    # `factor`, short ones kept, and the band in between interpolated smoothly.
    low_wavelen = s["original_max_position_embeddings"] / s["low_freq_factor"]
    high_wavelen = s["original_max_position_embeddings"] / s["high_freq_factor"]
    wavelen = 2 * math.pi / inv_freq
    smooth = (s["original_max_position_embeddings"] / wavelen - s["low_freq_factor"]) / (
        s["high_freq_factor"] - s["low_freq_factor"]
    )
    scaled = torch.where(wavelen > low_wavelen, inv_freq / s["factor"], inv_freq)
    mid = (1 - smooth) * inv_freq / s["factor"] + smooth * inv_freq
    is_mid = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(is_mid, mid, scaled)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: (batch, heads, seq, head_dim); cos/sin: (seq, head_dim), broadcast over batch and heads
    return (x * cos + rotate_half(x) * sin).to(x.dtype)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in fp32 even under bf16: the mean of squares loses precision otherwise.
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = args.n_heads, args.n_kv_heads, args.head_dim
        self.q_proj = nn.Linear(args.dim, args.n_heads * args.head_dim, bias=False)
        self.k_proj = nn.Linear(args.dim, args.n_kv_heads * args.head_dim, bias=False)
        self.v_proj = nn.Linear(args.dim, args.n_kv_heads * args.head_dim, bias=False)
        self.o_proj = nn.Linear(args.n_heads * args.head_dim, args.dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        bsz, seq, _ = x.shape
        q = self.q_proj(x).view(bsz, seq, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(bsz, seq, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(bsz, seq, self.n_kv_heads, self.head_dim).transpose(1, 2)
        # q: (batch, n_heads, seq, head_dim); k, v: (batch, n_kv_heads, seq, head_dim)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        # Grouped-query attention: each kv head serves n_heads / n_kv_heads query heads.
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        out = out.transpose(1, 2).reshape(bsz, seq, -1)  # (batch, seq, n_heads * head_dim)
        return self.o_proj(out)


class MLP(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.gate_proj = nn.Linear(args.dim, args.ffn_dim, bias=False)
        self.up_proj = nn.Linear(args.dim, args.ffn_dim, bias=False)
        self.down_proj = nn.Linear(args.ffn_dim, args.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))  # SwiGLU


class DecoderLayer(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.input_layernorm = RMSNorm(args.dim, args.norm_eps)
        self.self_attn = Attention(args)
        self.post_attention_layernorm = RMSNorm(args.dim, args.norm_eps)
        self.mlp = MLP(args)
        # Activation checkpointing, set by trainer.model.parallelize.apply_ac. It lives inside the
        # block's own forward, not in a wrapper module, so parameter names (and with them
        # checkpoints and the HF mapping) do not change, and torch.compile of the block
        # traces the checkpoint region as one graph. ac_context_fn chooses what is saved
        # (selective op-level); the default saves only the block's input.
        self.checkpoint_activations = False
        self.ac_context_fn = noop_context_fn

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        if self.checkpoint_activations:
            return checkpoint(self._forward, x, cos, sin, use_reentrant=False, context_fn=self.ac_context_fn)
        return self._forward(x, cos, sin)

    def _forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return h + self.mlp(self.post_attention_layernorm(h))


class Llama(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.embed_tokens = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleList(DecoderLayer(args) for _ in range(args.n_layers))
        self.norm = RMSNorm(args.dim, args.norm_eps)
        # Tied flavours (Llama 3.2 1B/3B) reuse embed_tokens.weight in forward() rather
        # than sharing one Parameter between two modules, which to_empty() and
        # per-module sharding would silently untie.
        self.lm_head = None if args.tie_word_embeddings else nn.Linear(args.dim, args.vocab_size, bias=False)
        # Rotary tables are recomputed by init_weights() (they are not learned, so not
        # saved); (max_seq_len, head_dim) each.
        self.register_buffer("rope_cos", torch.empty(args.max_seq_len, args.head_dim), persistent=False)
        self.register_buffer("rope_sin", torch.empty(args.max_seq_len, args.head_dim), persistent=False)
        # Set by trainer.model.parallelize with parallel.compile: the loss runs as a compiled graph too.
        self.compile_loss = False

    @torch.no_grad()
    def init_weights(self, seed: int, *, parameters: bool = True) -> None:
        """Fill every parameter and buffer; call after to_empty(). ``parameters=False``: the buffers
        only (the rotary tables), for a model whose every parameter is loaded next.

        Each parameter is drawn whole from its own generator, seeded by `seed` and its
        name, then cut to this rank's shard: the weights are the same for every world
        size (a 1-process run and a 2-rank run start identical) and independent of
        the order parameters are visited in.
        """
        inv_freq = rope_inv_freq(self.args).to(self.rope_cos.device)
        t = torch.arange(self.args.max_seq_len, device=inv_freq.device, dtype=torch.float32)
        freqs = torch.outer(t, inv_freq)  # (max_seq_len, head_dim / 2)
        emb = torch.cat((freqs, freqs), dim=-1)  # (max_seq_len, head_dim), rotate-half layout
        self.rope_cos.copy_(emb.cos())
        self.rope_sin.copy_(emb.sin())
        if not parameters:
            return

        std = 0.02
        # The projections that write into the residual stream get a depth-scaled std so
        # the residual's variance does not grow with the number of layers (GPT-2 style).
        out_std = std / math.sqrt(2 * self.args.n_layers)
        for name, param in self.named_parameters():
            if name.endswith("norm.weight"):
                fill = lambda t, g: nn.init.ones_(t)  # noqa: E731
            elif name == "embed_tokens.weight":
                fill = lambda t, g: nn.init.normal_(t, std=std, generator=g)  # noqa: E731
            else:
                w_std = out_std if name.endswith(("o_proj.weight", "down_proj.weight")) else std
                fill = lambda t, g, s=w_std: nn.init.trunc_normal_(t, std=s, a=-3 * s, b=3 * s, generator=g)  # noqa: E731
            _fill_whole_then_shard(param, fill, seed * 1_000_003 + zlib.crc32(name.encode()))

    def forward(
        self, tokens: torch.Tensor, targets: torch.Tensor | None = None, loss_chunk_tokens: int = 0
    ) -> torch.Tensor:
        """tokens: (batch, seq) int64 -> logits (batch, seq, vocab_size); with ``targets``
        (batch, seq): the mean cross-entropy instead, computed ``loss_chunk_tokens`` tokens at
        a time so the full logits never exist (trainer/model/loss.py). The loss is taken here, inside
        the root module's forward, where FSDP has the output projection's weight gathered."""
        seq = tokens.shape[1]
        if seq > self.args.max_seq_len:
            raise ValueError(f"sequence of {seq} tokens is longer than max_seq_len {self.args.max_seq_len}")
        h = self.embed_tokens(tokens)  # (batch, seq, dim)
        cos, sin = self.rope_cos[:seq], self.rope_sin[:seq]
        for layer in self.layers:
            h = layer(h, cos.to(h.dtype), sin.to(h.dtype))
        h = self.norm(h)
        weight = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        if targets is not None:
            return cross_entropy(h, weight, targets, loss_chunk_tokens, compiled=self.compile_loss)
        return F.linear(h, weight)

    def num_params(self, exclude_embedding: bool = False) -> int:
        n = sum(p.numel() for p in self.parameters())
        if exclude_embedding:
            n -= self.embed_tokens.weight.numel()
        return n


def _fill_whole_then_shard(param: torch.Tensor, fill, seed: int) -> None:
    g = torch.Generator(device=param.device).manual_seed(seed)
    if not isinstance(param, DTensor):
        fill(param, g)
        return
    # Costs one full copy of the largest parameter at a time (the 8B embedding: 2 GiB fp32).
    full = torch.empty(param.shape, dtype=param.dtype, device=param.device)
    fill(full, g)
    # src_data_rank=None: every rank holds the same `full`, so just cut locally, no scatter.
    shard = distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=None)
    param.to_local().copy_(shard.to_local())

"""trainer.model.llama against a peer: Hugging Face transformers' LlamaForCausalLM with the same weights.

The logits must agree to 1e-5 in fp32 for multi-head and grouped-query attention, untied
and tied embeddings, and Llama 3.1's long-context RoPE scaling. HF runs its eager
attention (explicit softmax of q·kᵀ), so the comparison does not rest on the SDPA kernel
both could share.
"""

import inspect

import pytest
import torch

from trainer.model.llama import Llama, ModelArgs, rope_inv_freq

transformers = pytest.importorskip("transformers", reason="transformers is in the `test` extra of setup.cfg")

SEQ = 64
# Llama 3.1's rule with a short original context, so that at SEQ positions all three
# frequency bands (kept, interpolated, divided by `factor`) change the logits.
LLAMA3_SCALING = {
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 48,
}


def small_args(
    *, n_kv_heads: int, tie: bool, rope_scaling: dict | None, rope_theta: float = 10000.0
) -> ModelArgs:
    return ModelArgs(
        dim=64,
        n_layers=2,
        n_heads=4,
        n_kv_heads=n_kv_heads,
        ffn_dim=160,
        vocab_size=97,
        norm_eps=1e-5,
        rope_theta=rope_theta,
        rope_scaling=rope_scaling,
        tie_word_embeddings=tie,
        max_seq_len=SEQ,
    )


def ours(args: ModelArgs, seed: int = 0) -> Llama:
    with torch.device("meta"):
        model = Llama(args)
    model.to_empty(device="cpu")
    model.init_weights(seed)
    with torch.no_grad():  # init makes every norm gain 1, which would hide a mis-mapped norm
        g = torch.Generator().manual_seed(seed)
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g))
    return model.eval()


def hf_config(args: ModelArgs):
    rope = {"rope_type": "default", "rope_theta": args.rope_theta}
    if args.rope_scaling:
        rope = {"rope_type": "llama3", "rope_theta": args.rope_theta, **args.rope_scaling}
    if (
        "rope_parameters" in inspect.signature(transformers.LlamaConfig.__init__).parameters
    ):  # transformers >= 5
        rope_kwargs = {"rope_parameters": rope}
    else:
        rope_kwargs = {
            "rope_theta": args.rope_theta,
            "rope_scaling": None
            if not args.rope_scaling
            else {k: v for k, v in rope.items() if k != "rope_theta"},
        }
    config = transformers.LlamaConfig(
        vocab_size=args.vocab_size,
        hidden_size=args.dim,
        intermediate_size=args.ffn_dim,
        num_hidden_layers=args.n_layers,
        num_attention_heads=args.n_heads,
        num_key_value_heads=args.n_kv_heads,
        rms_norm_eps=args.norm_eps,
        max_position_embeddings=args.max_seq_len,
        tie_word_embeddings=args.tie_word_embeddings,
        **rope_kwargs,
    )
    config._attn_implementation = "eager"
    return config


def hf_with_our_weights(model: Llama):
    hf = transformers.LlamaForCausalLM(hf_config(model.args)).eval()
    # Our names are HF's without the "model." prefix of the decoder stack.
    state = {(k if k == "lm_head.weight" else f"model.{k}"): v for k, v in model.state_dict().items()}
    missing, unexpected = hf.load_state_dict(state, strict=False)
    assert unexpected == []
    if model.args.tie_word_embeddings:  # HF's lm_head is the embedding itself
        assert missing == ["lm_head.weight"] or missing == []
        assert hf.lm_head.weight.data_ptr() == hf.model.embed_tokens.weight.data_ptr()
        assert "lm_head.weight" not in dict(model.named_parameters())
    else:
        assert missing == []
    return hf


def logits_of_both(model: Llama, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    hf = hf_with_our_weights(model)
    tokens = torch.randint(0, model.args.vocab_size, (2, SEQ), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        return model(tokens), hf(tokens).logits


@pytest.mark.parametrize(
    "n_kv_heads, tie, rope_scaling, rope_theta",
    [
        pytest.param(4, False, None, 10000.0, id="multi-head, untied"),
        pytest.param(2, False, None, 10000.0, id="grouped-query 2:1, untied"),
        pytest.param(1, True, None, 10000.0, id="multi-query, tied"),
        pytest.param(2, True, LLAMA3_SCALING, 500000.0, id="grouped-query, tied, llama3 rope scaling"),
    ],
)
def test_logits_equal_transformers_llama_to_1e_5(n_kv_heads, tie, rope_scaling, rope_theta):
    ours_logits, hf_logits = logits_of_both(
        ours(small_args(n_kv_heads=n_kv_heads, tie=tie, rope_scaling=rope_scaling, rope_theta=rope_theta))
    )
    assert ours_logits.dtype == hf_logits.dtype == torch.float32
    assert ours_logits.abs().max() > 0.1  # not trivially equal near zero
    torch.testing.assert_close(ours_logits, hf_logits, rtol=1e-5, atol=1e-5)


def test_debug_flavour_equals_transformers_llama_to_1e_5():
    # The exact shapes the CPU tests and the demo train.
    ours_logits, hf_logits = logits_of_both(ours(ModelArgs.from_flavor("debug", SEQ)))
    torch.testing.assert_close(ours_logits, hf_logits, rtol=1e-5, atol=1e-5)


def test_llama3_rope_scaling_is_exercised_and_matters():
    # The scaled case above could only pass vacuously if scaling changed nothing at SEQ positions.
    scaled = small_args(n_kv_heads=2, tie=True, rope_scaling=LLAMA3_SCALING, rope_theta=500000.0)
    plain = small_args(n_kv_heads=2, tie=True, rope_scaling=None, rope_theta=500000.0)
    f_scaled, f_plain = rope_inv_freq(scaled), rope_inv_freq(plain)
    kept = torch.isclose(f_scaled, f_plain)
    divided = torch.isclose(f_scaled, f_plain / LLAMA3_SCALING["factor"])
    assert kept.any() and divided.any() and (~kept & ~divided).any()  # all three bands present
    a, _ = logits_of_both(ours(scaled))
    b, _ = logits_of_both(ours(plain))
    assert (a - b).abs().max() > 1e-3

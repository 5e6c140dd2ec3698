"""trainer.model.llama: shapes, causality, and the real Llama 3 sizes."""

import pytest
import torch

from trainer.model.llama import Llama, ModelArgs


def build(flavor="debug", seq_len=32, seed=0, device="cpu"):
    with torch.device("meta"):
        model = Llama(ModelArgs.from_flavor(flavor, seq_len))
    model.to_empty(device=device)
    model.init_weights(seed)
    return model


def test_forward_gives_next_token_logits_over_the_vocab():
    model = build()
    tokens = torch.randint(0, 256, (2, 32))
    logits = model(tokens)
    assert logits.shape == (2, 32, 256)
    assert torch.isfinite(logits).all()


def test_attention_is_causal():
    # Changing a later token must not change the logits at earlier positions.
    model = build()
    a = torch.randint(0, 256, (1, 16))
    b = a.clone()
    b[0, 10] = (a[0, 10] + 1) % 256
    la, lb = model(a), model(b)
    torch.testing.assert_close(la[:, :10], lb[:, :10])
    assert not torch.allclose(la[:, 10:], lb[:, 10:])


def test_init_is_a_function_of_the_seed():
    a, b, c = build(seed=1), build(seed=1), build(seed=2)
    for (name, pa), pb, pc in zip(a.named_parameters(), b.parameters(), c.parameters()):
        assert torch.equal(pa, pb), name
        if "norm" not in name:
            assert not torch.equal(pa, pc), name


def test_sequence_longer_than_max_seq_len_is_refused():
    with pytest.raises(ValueError, match="longer than max_seq_len 32"):
        build()(torch.zeros(1, 33, dtype=torch.long))


def test_parameter_names_match_hugging_face_llama():
    names = {n for n, _ in build().named_parameters()}
    assert "embed_tokens.weight" in names and "norm.weight" in names and "lm_head.weight" in names
    for suffix in (
        "self_attn.q_proj.weight",
        "self_attn.k_proj.weight",
        "self_attn.v_proj.weight",
        "self_attn.o_proj.weight",
        "mlp.gate_proj.weight",
        "mlp.up_proj.weight",
        "mlp.down_proj.weight",
        "input_layernorm.weight",
        "post_attention_layernorm.weight",
    ):
        assert f"layers.3.{suffix}" in names


@pytest.mark.parametrize(
    "flavor, billions", [("llama3_1b", 1.236), ("llama3_3b", 3.213), ("llama3_8b", 8.030)]
)
def test_llama3_flavours_have_the_published_sizes(flavor, billions):
    with torch.device("meta"):  # no memory
        model = Llama(ModelArgs.from_flavor(flavor, 128))
    assert model.num_params() / 1e9 == pytest.approx(billions, abs=0.002)

"""The chunked cross-entropy (trainer/model/loss.py) is the whole-logits loss, value and gradients."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from trainer.model.loss import cross_entropy
from trainer.model.llama import Llama, ModelArgs
from trainer.config.flavors import FLAVORS


@pytest.mark.parametrize("chunk", [1, 7, 64, 10_000])
def test_chunked_loss_and_gradients_equal_the_whole_logits_ones(chunk):
    torch.manual_seed(0)
    model = Llama(ModelArgs(**FLAVORS["debug"], max_seq_len=32))
    model.init_weights(seed=0)
    tokens = torch.randint(0, 256, (3, 21))
    inputs, targets = tokens[:, :-1], tokens[:, 1:]

    reference = F.cross_entropy(model(inputs).flatten(0, 1).float(), targets.flatten())
    reference.backward()
    expected = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)

    loss = model(inputs, targets, loss_chunk_tokens=chunk)
    loss.backward()
    torch.testing.assert_close(loss, reference, rtol=1e-6, atol=1e-6)
    for name, param in model.named_parameters():
        torch.testing.assert_close(
            param.grad, expected[name], rtol=1e-5, atol=1e-6, msg=f"gradient of {name}"
        )


def test_no_chunk_holds_more_than_chunk_tokens_of_logits():
    seen = []
    weight = torch.randn(50, 8, requires_grad=True)
    h = torch.randn(2, 10, 8, requires_grad=True)
    targets = torch.randint(0, 50, (2, 10))

    original = F.linear

    def spy(module_input, *args, **kwargs):
        seen.append(module_input.shape[0])
        return original(module_input, *args, **kwargs)

    try:
        F.linear = spy  # the loss module looks it up at call time
        cross_entropy(h, weight, targets, chunk_tokens=6).backward()
    finally:
        F.linear = original
    assert seen and max(seen) <= 6, seen  # forward and the backward recomputation alike
    assert sum(seen[: len(seen) // 2]) == 20


@pytest.mark.parametrize("chunk", [0, 7])
def test_the_compiled_loss_is_the_eager_loss_value_and_gradients(chunk):
    # parallel.compile runs the loss through torch.compile (Inductor on CPU needs a C++ compiler).
    torch.manual_seed(0)
    weight = torch.randn(50, 8, requires_grad=True)
    h = torch.randn(2, 10, 8, requires_grad=True)
    targets = torch.randint(0, 50, (2, 10))
    from torch._dynamo.utils import counters

    counters.clear()
    results = []
    for compiled in (False, True):
        loss = cross_entropy(h, weight, targets, chunk_tokens=chunk, compiled=compiled)
        loss.backward()
        results.append((loss.detach(), weight.grad.clone(), h.grad.clone()))
        weight.grad = h.grad = None
    assert counters["stats"]["unique_graphs"] >= 1, "the compiled path did not compile anything"
    (eager_loss, eager_w, eager_h), (loss, w, g) = results
    torch.testing.assert_close(loss, eager_loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(w, eager_w, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(g, eager_h, rtol=1e-4, atol=1e-6)

"""trainer.step.auto_batch: the search for the largest micro-batch that fits, and recovery from an OOM.

No GPU here: the search runs against injected "fits" predicates, and an out-of-memory error
is raised by a hook inside a real FSDP2 model on CPU, as CUDA would raise it mid-forward or
mid-backward.
"""

import math

import pytest
import torch
import torch.nn.functional as F

from trainer.step.auto_batch import candidates, fit_micro_batch_size, largest_fitting, probe
from trainer.config.job_config import TrainConfig
from trainer.config.sections import ParallelConfig
from trainer.model.llama import Llama, ModelArgs
from trainer.model.parallelize import build_mesh, parallelize


def test_candidates_are_the_divisors_of_the_per_rank_batch():
    assert candidates(global_batch_size=48, world_size=4) == [1, 2, 3, 4, 6, 12]
    assert candidates(global_batch_size=8, world_size=8) == [1]


@pytest.mark.parametrize("limit", [0, 1, 2, 3, 5, 6, 7, 12, 100])
def test_binary_search_finds_the_largest_size_that_fits_in_log2_probes(limit):
    sizes = candidates(48, 4)  # [1, 2, 3, 4, 6, 12]
    probed = []

    def fits(mb):
        probed.append(mb)
        return mb <= limit

    best = largest_fitting(sizes, fits)
    expected = max((s for s in sizes if s <= limit), default=None)
    assert best == expected
    assert len(probed) <= math.ceil(math.log2(len(sizes) + 1))  # 3 probes for 6 candidates, not 6


def test_cpu_keeps_the_configured_micro_batch_and_says_it_skipped():
    said = []
    cfg = TrainConfig(parallel=ParallelConfig(auto_micro_batch_size=True), micro_batch_size=2)
    assert (
        fit_micro_batch_size(cfg, model=None, device=torch.device("cpu"), world_size=1, log=said.append)
        is cfg
    )
    assert said == [
        "auto micro-batch size: skipped on cpu (no GPU memory to probe); keeping micro_batch_size 2"
    ]


@pytest.fixture
def one_rank_group(gloo_group):
    return build_mesh("cpu", 1, ParallelConfig())


def _fsdp_model(mesh):
    with torch.device("meta"):
        model = Llama(ModelArgs.from_flavor("debug", 16))
    parallelize(model, mesh, shard=True)  # what a GPU rank trains (one CPU process trains a plain module)
    model.to_empty(device="cpu")
    model.init_weights(0)
    return model


def _loss_and_grad_norm(model, tokens):
    loss = F.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten())
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf")).full_tensor()
    return loss.item(), norm.item()


@pytest.mark.parametrize("where", ["forward", "backward"])
def test_an_out_of_memory_probe_leaves_the_model_as_it_was(one_rank_group, where):
    model, reference = _fsdp_model(one_rank_group), _fsdp_model(one_rank_group)
    layer = model.layers[2]  # half-way through: earlier blocks are gathered, later ones not yet

    def oom_if_large(batch: int):
        if batch > 2:
            raise torch.OutOfMemoryError(f"CUDA out of memory (simulated in {where})")

    if where == "forward":
        layer.register_forward_pre_hook(lambda m, args: oom_if_large(args[0].shape[0]))
    else:
        layer.register_full_backward_hook(lambda m, gin, gout: oom_if_large(gout[0].shape[0]))

    found = largest_fitting(candidates(8, 1), lambda mb: probe(model, mb, 2, 16, 256, torch.device("cpu"), 0))
    assert found == 2
    assert all(p.grad is None for p in model.parameters())  # no gradients left behind by the probes
    # The next real step is the step a model that was never probed takes.
    tokens = torch.randint(0, 256, (2, 17), generator=torch.Generator().manual_seed(1))
    assert _loss_and_grad_norm(model, tokens) == pytest.approx(
        _loss_and_grad_norm(reference, tokens), rel=1e-6
    )

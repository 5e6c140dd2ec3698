"""trainer.model.parallelize and the `parallel` config section: the learning-rate schedule a user sees
in the "lr" of train events, HSDP, activation checkpointing, torch.compile, auto micro-batch size."""

import json

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from conftest import read_json, run_trainer
from trainer.config.job_config import TrainConfig
from trainer.config.fields import ConfigError
from trainer.config.sections import OptimConfig, ParallelConfig
from trainer.model.llama import Llama, ModelArgs
from trainer.model.parallelize import apply_ac, lr_lambda, replicate_degree


def test_linear_warmup_then_cosine_to_min_lr_on_the_last_step():
    f = lr_lambda(OptimConfig(warmup_steps=10, min_lr_ratio=0.1), total_steps=50)
    assert [f(s) for s in range(3)] == pytest.approx([0.1, 0.2, 0.3])
    assert f(9) == pytest.approx(1.0)  # peak at the end of warmup
    assert f(10) == pytest.approx(1.0)
    assert f(49) == pytest.approx(0.1)  # the last step (0-based 49) runs at lr * min_lr_ratio
    values = [f(s) for s in range(10, 50)]
    assert all(a >= b for a, b in zip(values, values[1:]))  # monotone decay
    assert f(29) == pytest.approx(0.1 + 0.9 * 0.5, abs=0.03)  # half-way down the cosine


def test_no_warmup_and_warmup_longer_than_the_run():
    assert lr_lambda(OptimConfig(warmup_steps=0), total_steps=10)(0) == pytest.approx(1.0)
    long = lr_lambda(OptimConfig(warmup_steps=100), total_steps=10)
    assert long(9) == pytest.approx(0.1)  # never reaches the peak


# --------------------------------------------------------------------------- the `parallel` config section


@pytest.mark.parametrize(
    "spec, message",
    [
        ({"replicate_degree": -1}, "parallel.replicate_degree: must be >= 0"),
        (
            {"activation_checkpointing": "some"},
            "parallel.activation_checkpointing: unknown value 'some' (choose from none, selective, full)",
        ),
        ({"selective_ac_every": -2}, "parallel.selective_ac_every: must be >= 0"),
        ({"compile": "yes"}, "parallel.compile: expected true or false, got 'yes'"),
        ({"cpu_offload": 1}, "parallel.cpu_offload: expected true or false, got 1"),
        ({"auto_micro_batch_size": None}, "parallel.auto_micro_batch_size: expected true or false"),
        ({"hsdp": True}, "parallel.hsdp: unknown key"),
    ],
)
def test_bad_parallel_settings_are_refused_naming_the_field(spec, message):
    with pytest.raises(ConfigError) as e:
        TrainConfig.from_dict({"parallel": spec})
    assert message in str(e.value)


def test_parallel_settings_come_from_the_command_line_and_round_trip():
    cfg = TrainConfig().with_overrides(
        {
            "parallel.compile": "true",
            "parallel.activation_checkpointing": "full",
            "parallel.replicate_degree": "2",
        }
    )
    assert (cfg.parallel.compile, cfg.parallel.activation_checkpointing, cfg.parallel.replicate_degree) == (
        True,
        "full",
        2,
    )
    assert TrainConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    with pytest.raises(ConfigError, match=r"parallel.compile: expected true or false, got 'maybe'"):
        TrainConfig().with_overrides({"parallel.compile": "maybe"})


def test_replica_groups_must_divide_the_world_size():
    cfg = TrainConfig(parallel=ParallelConfig(replicate_degree=3), global_batch_size=12, micro_batch_size=1)
    cfg.validate_world_size(6)
    with pytest.raises(
        ConfigError, match="parallel.replicate_degree: 3 replica groups do not divide world size 4"
    ):
        cfg.validate_world_size(4)


def test_replicate_degree_0_means_one_replica_group_per_node(monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")  # what torchrun sets: ranks on this node
    assert replicate_degree(ParallelConfig(replicate_degree=0), 32) == 4  # 4 nodes of 8
    assert replicate_degree(ParallelConfig(replicate_degree=1), 32) == 1


# --------------------------------------------------------------------------- activation checkpointing


class _CountMatmuls(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.mm = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.mm += func is torch.ops.aten.mm.default
        return func(*args, **(kwargs or {}))


def _backward(mode: str, every: int = 0):
    """(matmuls run by backward, gradients) of the debug model under an AC setting."""
    with torch.device("meta"):
        model = Llama(ModelArgs.from_flavor("debug", 32))
    model.to_empty(device="cpu")
    model.init_weights(0)
    apply_ac(model, ParallelConfig(activation_checkpointing=mode, selective_ac_every=every))
    tokens = torch.randint(0, 256, (2, 33), generator=torch.Generator().manual_seed(0))
    loss = F.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten())
    with _CountMatmuls() as counter:
        loss.backward()
    return counter.mm, {n: p.grad for n, p in model.named_parameters()}


def test_activation_checkpointing_recomputes_in_backward_and_leaves_the_gradients_unchanged():
    base_mm, base_grads = _backward("none")
    recomputed = {}
    for mode, every in (("selective", 0), ("selective", 2), ("full", 0)):
        mm, grads = _backward(mode, every)
        recomputed[(mode, every)] = mm - base_mm
        for name, g in grads.items():
            torch.testing.assert_close(g, base_grads[name], rtol=1e-5, atol=1e-6, msg=name)
    # A matmul recomputed in backward is an activation not kept from forward. The debug
    # model has 4 blocks of 7 matmuls; the last one's output is never needed again.
    assert recomputed[("full", 0)] == 4 * 6  # every block recomputed
    assert recomputed[("selective", 2)] == 2 * 6  # blocks 0 and 2
    assert 0 < recomputed[("selective", 0)] < recomputed[("full", 0)]  # op-level: keeps every other matmul


# --------------------------------------------------------------------------- through the trainer

P_STEPS = 4
P_ARGS = [
    "--flavor",
    "debug",
    "--set",
    "data.seq_len=32",
    "--set",
    "global_batch_size=8",
    "--set",
    "micro_batch_size=2",
    "--set",
    "metrics.log_every=1",
]


@pytest.fixture(scope="module")
def one_process(data_dir):
    """The reference: 1 process, FSDP over 1 rank, no AC, no compile; auto micro-batch asked for."""
    run = run_trainer(
        [*P_ARGS, "--steps", str(P_STEPS), "--set", "parallel.auto_micro_batch_size=true"], data_dir
    )
    assert run.returncode == 0, run
    return run


def test_auto_micro_batch_size_is_skipped_on_cpu_keeping_the_configured_value(one_process):
    assert (
        "auto micro-batch size: skipped on cpu (no GPU memory to probe); keeping micro_batch_size 2"
        in one_process.stderr
    )
    assert sorted(one_process.losses()) == list(range(1, P_STEPS + 1))


@pytest.mark.torchrun
def test_hsdp_2x2_with_full_activation_checkpointing_follows_the_one_process_trajectory(
    one_process, data_dir, tmp_path
):
    # 4 ranks as 2 "nodes" of 2: shard inside a pair, replicate across pairs.
    ckpt = tmp_path / "ckpt"
    run = run_trainer(
        [
            *P_ARGS,
            "--steps",
            str(P_STEPS),
            "--set",
            "parallel.replicate_degree=2",
            "--set",
            "parallel.activation_checkpointing=full",
            "--checkpoint-uri",
            str(ckpt),
        ],
        data_dir,
        nproc=4,
    )
    assert run.returncode == 0, run
    assert "HSDP mesh {'dp_replicate': 2, 'dp_shard': 2}" in run.stderr
    for step, loss in one_process.losses().items():
        assert run.losses()[step] == pytest.approx(loss, rel=1e-4), step
    assert run.losses()[P_STEPS] < run.losses()[1] - 1  # it trains
    assert read_json(ckpt / f"step-{P_STEPS:08d}" / "manifest.json")["world_size"] == 4


def test_compiled_blocks_follow_the_eager_trajectory(one_process, data_dir):
    # Inductor on CPU needs a C++ compiler; one micro-batch per step keeps this to one compiled graph.
    run = run_trainer(
        [*P_ARGS, "--steps", "2", "--set", "parallel.compile=true", "--set", "micro_batch_size=8"], data_dir
    )
    if run.returncode != 0 and "InductorError" in run.stderr and "compiler" in run.stderr.lower():
        pytest.skip(f"torch.compile cannot build CPU kernels here: {run.stderr[-300:]}")
    assert run.returncode == 0, run
    for step in (1, 2):
        assert run.losses()[step] == pytest.approx(one_process.losses()[step], rel=1e-4), step

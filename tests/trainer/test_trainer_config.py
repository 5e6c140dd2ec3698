"""trainer.config.job_config: what a user sees when a job spec is wrong, and that good specs round-trip."""

import json
import subprocess
import sys

import pytest

from trainer.config.job_config import PREEMPTED_EXIT_CODE, TrainConfig
from trainer.config.fields import ConfigError
from trainer.config.sections import CheckpointConfig, DataConfig, MetricsConfig, ModelConfig, OptimConfig
from trainer.config.flavors import FLAVORS


def test_preempted_exit_code_is_ex_tempfail():
    assert PREEMPTED_EXIT_CODE == 75


def test_flavours_are_the_documented_ones():
    assert set(FLAVORS) == {"debug", "llama3_1b", "llama3_3b", "llama3_8b"}
    assert FLAVORS["debug"]["vocab_size"] == 256
    assert FLAVORS["llama3_8b"]["vocab_size"] == 128256
    assert (FLAVORS["llama3_8b"]["dim"], FLAVORS["llama3_8b"]["n_layers"]) == (4096, 32)


def test_importing_config_does_not_import_torch_or_numpy():
    # The Airflow provider imports this at DAG-parse time on schedulers without torch.
    heavy = "print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))"
    code = f"import sys, trainer.config.job_config\n{heavy}"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(
    "spec, message",
    [
        (
            {"model": {"flavor": "tiny"}},
            "model.flavor: unknown flavour 'tiny' (choose from debug, llama3_1b, llama3_3b, llama3_8b)",
        ),
        ({"data": {"seq_len": 4}}, "data.seq_len: must be >= 8, got 4"),
        ({"optim": {"lr": 0}}, "optim.lr: must be > 0, got 0.0"),
        ({"optim": {"lr": -1e-3}}, "optim.lr: must be > 0, got -0.001"),
        ({"optim": {"min_lr_ratio": 1.5}}, "optim.min_lr_ratio: must be in [0, 1], got 1.5"),
        ({"optim": {"beta2": 1.0}}, "optim.beta2: must be in [0, 1), got 1.0"),
        ({"optim": {"warmup_steps": -1}}, "optim.warmup_steps: must be >= 0, got -1"),
        ({"checkpoint": {"every": -5}}, "checkpoint.every: must be >= 0"),
        ({"checkpoint": {"keep": 0}}, "checkpoint.keep: must be >= 1, got 0"),
        ({"checkpoint": {"grace_period_s": 0}}, "checkpoint.grace_period_s: must be > 0, got 0.0"),
        ({"checkpoint": {"uri": "ftp://x"}}, "checkpoint.uri"),
        ({"checkpoint": {"uri": "s3://"}}, "checkpoint.uri"),
        ({"checkpoint": {"uri": "s3:///prefix"}}, "checkpoint.uri"),
        ({"checkpoint": {"uri": "file://"}}, "checkpoint.uri"),
        ({"metrics": {"statsd_port": 0}}, "metrics.statsd_port: must be in 1..65535, got 0"),
        ({"metrics": {"statsd_port": 70000}}, "metrics.statsd_port: must be in 1..65535, got 70000"),
        ({"metrics": {"log_every": 0}}, "metrics.log_every: must be >= 1, got 0"),
        (
            {"metrics": {"statsd_tags": "run id:x|y"}},
            "metrics.statsd_tags: must be comma-separated key:value pairs",
        ),
        ({"steps": 0}, "steps: must be >= 1, got 0"),
        ({"micro_batch_size": 0}, "micro_batch_size: must be >= 1, got 0"),
        (
            {"global_batch_size": 7, "micro_batch_size": 2},
            "global_batch_size: 7 is not divisible by micro_batch_size 2",
        ),
        (
            {"steps": 10, "simulate_preemption_at_step": 10},
            "simulate_preemption_at_step: must be in [0, steps=10)",
        ),
        ({"simulate_preemption_at_step": -1}, "simulate_preemption_at_step: must be in [0, steps=50)"),
        ({"seed": -1}, "seed: must be in [0, 2**32), got -1"),
    ],
)
def test_invalid_values_name_the_field_and_the_value(spec, message):
    with pytest.raises(ConfigError) as exc:
        TrainConfig.from_dict(spec)
    assert message in str(exc.value)


@pytest.mark.parametrize("uri", ["ftp://x", "s3://", "http://host/path"])
def test_bad_checkpoint_uri_message_quotes_the_uri(uri):
    with pytest.raises(ConfigError, match="checkpoint.uri") as exc:
        CheckpointConfig(uri=uri)
    assert repr(uri) in str(exc.value)


@pytest.mark.parametrize(
    "uri", ["", "/tmp/ckpt", "relative/dir", "file:///tmp/ckpt", "s3://my-bucket", "s3://my-bucket/runs/1"]
)
def test_good_checkpoint_uris_are_accepted(uri):
    assert CheckpointConfig(uri=uri).uri == uri


@pytest.mark.parametrize(
    "spec, message",
    [
        ({"steps": True}, "steps: expected an integer, got True"),
        ({"steps": 10.0}, "steps: expected an integer, got 10.0"),
        ({"steps": "10"}, "steps: expected an integer, got '10'"),
        ({"optim": {"lr": "fast"}}, "optim.lr: expected a number, got 'fast'"),
        ({"optim": {"lr": False}}, "optim.lr: expected a number, got False"),
        ({"optim": {"lr": float("inf")}}, "optim.lr: must be finite, got inf"),
        ({"model": {"flavor": 1}}, "model.flavor: expected a string, got 1"),
        ({"model": "debug"}, "model: expected a table/dict, got 'debug'"),
    ],
)
def test_from_dict_type_checks(spec, message):
    with pytest.raises(ConfigError) as exc:
        TrainConfig.from_dict(spec)
    assert message in str(exc.value)


@pytest.mark.parametrize(
    "spec, dotted",
    [
        ({"stepz": 1}, "stepz"),
        ({"model": {"flavour": "debug"}}, "model.flavour"),
        ({"optim": {"learning_rate": 1e-3}}, "optim.learning_rate"),
        ({"checkpoint": {"uri": "/x", "retention": 2}}, "checkpoint.retention"),
    ],
)
def test_unknown_keys_are_rejected_naming_the_dotted_key(spec, dotted):
    with pytest.raises(ConfigError) as exc:
        TrainConfig.from_dict(spec)
    assert str(exc.value).startswith(f"{dotted}: unknown key")


def test_direct_construction_validates_too():
    with pytest.raises(ConfigError, match="model.flavor"):
        ModelConfig(flavor="gpt5")
    with pytest.raises(ConfigError, match="data.seq_len"):
        DataConfig(seq_len=1)
    with pytest.raises(ConfigError, match="optim.eps"):
        OptimConfig(eps=0)
    with pytest.raises(ConfigError, match="metrics.statsd_port"):
        MetricsConfig(statsd_port=-1)
    with pytest.raises(ConfigError, match="model: expected a ModelConfig"):
        TrainConfig(model={"flavor": "debug"})


def test_ints_are_accepted_for_float_fields_and_stored_as_floats():
    c = TrainConfig.from_dict({"optim": {"lr": 1}})
    assert c.optim.lr == 1.0 and isinstance(c.optim.lr, float)
    # ... so that 1 and 1.0 describe the same job.
    assert c.config_hash() == TrainConfig.from_dict({"optim": {"lr": 1.0}}).config_hash()


def test_dict_and_json_round_trip_preserves_everything():
    c = TrainConfig(
        model=ModelConfig(flavor="llama3_1b"),
        data=DataConfig(dataset="/data/tok", seq_len=2048),
        optim=OptimConfig(lr=3e-4, warmup_steps=100),
        checkpoint=CheckpointConfig(uri="s3://bucket/run", every=100, keep=2),
        metrics=MetricsConfig(statsd_host="localhost"),
        steps=1000,
        global_batch_size=96,
        micro_batch_size=4,
        seed=7,
        simulate_preemption_at_step=500,
    )
    d = json.loads(json.dumps(c.to_dict()))
    assert d["checkpoint"] == {
        "uri": "s3://bucket/run",
        "every": 100,
        "keep": 2,
        "grace_period_s": 110.0,
        "async_save": None,
        "write_threads": 4,
        "continue_job": "",
    }
    assert d["cost"] == {
        "price_per_node_hour": 0.0,
        "capacity_type": "any",
        "gpus_per_node": 0,
        "budget_usd": None,
        "price_ceiling_per_node_hour": 0.0,
        "stop_margin_s": 30.0,
        "ledger_uri": "",
    }
    assert TrainConfig.from_dict(d) == c
    assert TrainConfig.from_dict(d).config_hash() == c.config_hash()


def test_config_hash_is_stable_and_sensitive():
    a = TrainConfig()
    assert a.config_hash() == TrainConfig().config_hash()
    assert len(a.config_hash()) == 64
    assert a.config_hash() != a.with_overrides({"seed": 1}).config_hash()


def test_from_file_json_and_toml(tmp_path):
    spec = {"model": {"flavor": "debug"}, "steps": 12, "optim": {"lr": 1e-3}, "checkpoint": {"uri": "/tmp/x"}}
    (tmp_path / "job.json").write_text(json.dumps(spec))
    (tmp_path / "job.toml").write_text(
        'steps = 12\n[model]\nflavor = "debug"\n[optim]\nlr = 1e-3\n[checkpoint]\nuri = "/tmp/x"\n'
    )
    from_json = TrainConfig.from_file(tmp_path / "job.json")
    from_toml = TrainConfig.from_file(str(tmp_path / "job.toml"))
    assert from_json == from_toml
    assert (from_json.steps, from_json.optim.lr, from_json.checkpoint.uri) == (12, 1e-3, "/tmp/x")


def test_from_file_errors_name_the_file(tmp_path):
    bad = tmp_path / "job.toml"
    bad.write_text("steps = = 3\n")
    with pytest.raises(ConfigError, match="job.toml"):
        TrainConfig.from_file(bad)
    with pytest.raises(ConfigError, match="missing.json"):
        TrainConfig.from_file(tmp_path / "missing.json")
    with pytest.raises(ConfigError, match="job.yaml"):
        TrainConfig.from_file(tmp_path / "job.yaml")
    unknown = tmp_path / "unknown.json"
    unknown.write_text(json.dumps({"optim": {"lrr": 1}}))
    with pytest.raises(ConfigError, match="optim.lrr"):
        TrainConfig.from_file(unknown)


def test_with_overrides_applies_dotted_paths_and_leaves_the_original():
    base = TrainConfig()
    c = base.with_overrides(
        {"model.flavor": "llama3_8b", "steps": 10, "optim.lr": "1e-4", "checkpoint.every": "5"}
    )
    assert (c.model.flavor, c.steps, c.optim.lr, c.checkpoint.every) == ("llama3_8b", 10, 1e-4, 5)
    assert base == TrainConfig()  # frozen: the original is untouched


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"model.flavour": "debug"}, "model.flavour: unknown key 'flavour'"),
        ({"modle.flavor": "debug"}, "modle.flavor: unknown key 'modle'"),
        ({"steps.x": 1}, "steps.x: unknown key 'steps'"),
        ({"optim": 1}, "optim: is a section"),
        ({"steps": "ten"}, "steps: expected an integer, got 'ten'"),
        ({"steps": True}, "steps: expected an integer, got True"),
        ({"optim.lr": "-1"}, "optim.lr: must be > 0, got -1.0"),
        ({"checkpoint.uri": "ftp://host/x"}, "checkpoint.uri"),
    ],
)
def test_bad_overrides_name_the_key(overrides, message):
    with pytest.raises(ConfigError) as exc:
        TrainConfig().with_overrides(overrides)
    assert message in str(exc.value)


def test_world_size_validation_and_grad_accum():
    c = TrainConfig(global_batch_size=96, micro_batch_size=4)
    assert c.grad_accum_steps(8) == 3
    assert c.grad_accum_steps(1) == 24
    with pytest.raises(ConfigError) as exc:
        TrainConfig(global_batch_size=96, micro_batch_size=4).validate_world_size(7)
    assert str(exc.value) == "global_batch_size 96 is not divisible by world size 7 × micro_batch_size 4"
    with pytest.raises(ConfigError, match="world_size"):
        c.grad_accum_steps(0)

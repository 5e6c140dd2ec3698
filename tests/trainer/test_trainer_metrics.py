"""trainer.report.metrics: the names dashboards rely on, their tags, MFU, and GPU telemetry that is absent
without
a GPU."""

import json
import socket
import subprocess
import sys
import types

import pytest
import torch

from trainer.report import metrics as m
from trainer.config.sections import MetricsConfig
from trainer.events import EVENTS_DIR_ENV, read_events
from trainer.report.metrics import (
    PER_RANK_METRICS,
    TRAINING_METRICS,
    GpuTelemetry,
    Metrics,
    SaveOverlap,
    flops_per_token,
)
from trainer.model.llama import ModelArgs
from trainer.base.statsd import RANK_TAGS, RUN_TAGS, parse_line


def test_importing_metrics_does_not_import_torch():
    # TRAINING_METRICS is read by the Airflow side (dashboards, their tests), which has no torch.
    code = "import sys, trainer.report.metrics as m; print(len(m.TRAINING_METRICS), 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == [str(len(TRAINING_METRICS)), "False"]


def test_training_metrics_are_one_dotted_scheme():
    assert {
        "train.loss",
        "train.grad_norm",
        "train.lr",
        "train.tokens_per_s",
        "train.mfu",
        "train.peak_memory_bytes",
        "train.step",
        "gpu.utilization_pct",
        "gpu.memory_used_bytes",
        "gpu.power_w",
        "gpu.temperature_c",
        "checkpoint.seconds",
        "cost.dollars",
        "cost.budget_dollars",
    } <= set(TRAINING_METRICS)
    assert len(set(TRAINING_METRICS)) == len(TRAINING_METRICS)
    assert PER_RANK_METRICS <= set(TRAINING_METRICS)
    assert all(
        n.count(".") == 1 and n.split(".")[0] in ("train", "gpu", "checkpoint", "cost", "startup")
        for n in TRAINING_METRICS
    )


def _listen():
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)  # a real UDP listener standing in for statsd
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(2)
    return sock


def _lines(sock) -> list[tuple[str, float, str, dict[str, str]]]:
    """Every datagram received, parsed: (name, value, type, tags)."""
    sock.setblocking(False)
    out = []
    while True:
        try:
            out.append(parse_line(sock.recv(1024).decode()))
        except BlockingIOError:
            return out


def _received(sock) -> dict[str, float]:
    return {name: value for name, value, _, _ in _lines(sock)}


def test_without_a_gpu_the_gpu_fields_and_gauges_are_absent_and_nothing_fails(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv(EVENTS_DIR_ENV, str(tmp_path / "events"))
    monkeypatch.setenv("RANK", "0")
    assert GpuTelemetry(torch.device("cpu")).read() == {}
    assert (
        GpuTelemetry(torch.device("cuda", 0)).read() == {}
    )  # asked for a GPU that is not there: still quiet
    sock = _listen()
    metrics = Metrics(
        MetricsConfig(statsd_host="127.0.0.1", statsd_port=sock.getsockname()[1], statsd_prefix="job7"),
        is_rank0=True,
        world_size=1,
        device=torch.device("cpu"),
        flops_per_token=1e6,
    )
    metrics.count_tokens(1000)
    metrics.log_step(step=1, loss=2.5, grad_norm=0.5, lr=1e-3, force=True)
    metrics.close()
    [event] = read_events(tmp_path / "events")  # rank 0's file: what the readers read
    [line] = capsys.readouterr().out.splitlines()  # and the same line on stdout, for people and pod logs
    assert json.loads(line) == event
    assert set(event) == {"event", "step", "loss", "grad_norm", "lr", "tokens_per_s", "mfu", "peak_mem_mb"}
    assert event["mfu"] is None  # no known peak on CPU
    gauges = _received(sock)
    assert set(gauges) == {
        f"job7.train.{n}" for n in ("step", "loss", "grad_norm", "lr", "tokens_per_s", "peak_memory_bytes")
    }
    assert gauges["job7.train.loss"] == 2.5


def test_every_line_carries_the_configured_tags_and_per_rank_series_their_node_and_rank(monkeypatch, capsys):
    tags = "dag_id:train_llama,run_id:manual__2026-05-01T09:30:00+00:00,task_id:train,map_index:-1,job:demo"
    monkeypatch.setenv("GROUP_RANK", "1")  # torchrun's node index of the process
    sock = _listen()
    cfg = MetricsConfig(statsd_host="127.0.0.1", statsd_port=sock.getsockname()[1], statsd_tags=tags)
    rank0 = Metrics(cfg, is_rank0=True, world_size=4, device=torch.device("cpu"), flops_per_token=1e6)
    rank3 = Metrics(
        cfg, is_rank0=False, rank=3, world_size=4, device=torch.device("cpu"), flops_per_token=1e6
    )
    for metrics in (rank0, rank3):
        metrics.count_tokens(1000)
        metrics.log_step(step=1, loss=2.5, grad_norm=0.5, lr=1e-3, force=True)
        metrics.close()
    capsys.readouterr()
    lines = _lines(sock)
    run = {
        "dag_id": "train_llama",
        "run_id": "manual__2026-05-01T09:30:00+00:00",
        "task_id": "train",
        "map_index": "-1",
        "job": "demo",
    }
    assert lines and all(
        {k: t.get(k) for k in RUN_TAGS} == run for _, _, _, t in lines
    )  # the run_id's ':' kept
    by_series = {(name, t.get("node"), t.get("rank")) for name, _, _, t in lines}
    # the group's series once, from rank 0, without node/rank; memory from each rank with them
    assert ("dtrain.train.loss", None, None) in by_series
    assert not any(name == "dtrain.train.loss" and rank for name, _, rank in by_series)
    assert {
        ("dtrain.train.peak_memory_bytes", "1", "0"),
        ("dtrain.train.peak_memory_bytes", "1", "3"),
    } <= by_series
    for name, _, _, t in lines:
        per_rank = name.removeprefix("dtrain.") in PER_RANK_METRICS
        assert (set(t) == set(RUN_TAGS) | set(RANK_TAGS)) if per_rank else (set(t) == set(RUN_TAGS)), (
            name,
            t,
        )


def test_without_configured_tags_every_line_still_has_the_same_keys():
    sock = _listen()
    metrics = Metrics(
        MetricsConfig(statsd_host="127.0.0.1", statsd_port=sock.getsockname()[1]),
        is_rank0=True,
        world_size=1,
        device=torch.device("cpu"),
        flops_per_token=1e6,
    )
    metrics.gauge("checkpoint.seconds", 1.5)
    metrics.close()
    [(name, value, kind, tags)] = _lines(sock)
    assert (name, value, kind) == ("dtrain.checkpoint.seconds", 1.5, "g")
    assert tags == dict.fromkeys(RUN_TAGS, "none")  # one label set per metric, whoever started the trainer


class FakeNvml(types.SimpleNamespace):
    """Stands in for pynvml (no GPU or driver here): fixed readings in NVML's units."""

    NVML_TEMPERATURE_GPU = 0
    NVMLError = RuntimeError

    def __init__(self):
        super().__init__(
            nvmlInit=lambda: None,
            nvmlDeviceGetHandleByUUID=lambda uuid: ("handle", uuid),
            nvmlDeviceGetHandleByIndex=lambda i: ("handle", i),
            nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(gpu=87),
            nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(used=40 * 2**30),
            nvmlDeviceGetPowerUsage=lambda h: 612_345,  # mW
            nvmlDeviceGetTemperature=lambda h, sensor: 71,
        )


def test_on_a_gpu_mfu_and_nvml_readings_are_reported_in_the_documented_units(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml())
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d=None: types.SimpleNamespace(uuid="abc"))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda d=None: 3 * 2**30)
    sock = _listen()
    metrics = Metrics(
        MetricsConfig(statsd_host="127.0.0.1", statsd_port=sock.getsockname()[1]),
        is_rank0=True,
        world_size=8,
        device=torch.device("cuda", 0),
        flops_per_token=8e9,
    )
    metrics._window_start -= 1.0  # a one-second window
    metrics.count_tokens(400_000)
    metrics.log_step(step=10, loss=2.0, grad_norm=1.0, lr=3e-4, force=True)
    out, err = capsys.readouterr()
    event = json.loads(out)
    assert "989 TFLOP/s dense bf16" in err  # which peak MFU is against
    tokens_per_s = event["tokens_per_s"]
    assert tokens_per_s == pytest.approx(400_000, rel=0.01)
    assert event["mfu"] == pytest.approx(tokens_per_s * 8e9 / (989e12 * 8), abs=1e-4)
    assert event["peak_mem_mb"] == 3072.0
    assert {k: event[k] for k in event if k.startswith("gpu_")} == {
        "gpu_utilization_pct": 87,
        "gpu_memory_used_mb": 40960.0,
        "gpu_power_w": 612.3,
        "gpu_temperature_c": 71,
    }
    gauges = _received(sock)
    assert gauges["dtrain.gpu.power_w"] == 612.3 and gauges["dtrain.train.mfu"] == event["mfu"]
    # memory in bytes on statsd (the JSON line keeps MiB)
    assert gauges["dtrain.gpu.memory_used_bytes"] == 40 * 2**30
    assert gauges["dtrain.train.peak_memory_bytes"] == 3 * 2**30
    assert set(gauges) == {f"dtrain.{n}" for n in TRAINING_METRICS if n.startswith(("train.", "gpu."))}


@pytest.mark.parametrize(
    "name, peak",
    [
        ("NVIDIA H100 80GB HBM3", 989e12),
        ("NVIDIA H100 PCIe", 756e12),
        ("NVIDIA H200", 989e12),
        ("NVIDIA L40S", 362e12),
        ("NVIDIA L4", 121e12),
        ("NVIDIA A100-SXM4-80GB", 312e12),
        ("NVIDIA GeForce RTX 3090", None),
    ],
)
def test_peak_flops_picks_the_most_specific_device_name(monkeypatch, name, peak):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: name)
    found = m.peak_flops(torch.device("cuda", 0))
    assert (found[1] if found else None) == peak


def test_flops_per_token_counts_a_tied_output_projection_but_not_the_embedding_lookup():
    args = ModelArgs.from_flavor("llama3_1b", 2048)  # tied
    untied = ModelArgs(**{**args.__dict__, "tie_word_embeddings": False})
    n_no_embedding = 1_000_000
    tied_fpt, untied_fpt = (flops_per_token(a, n_no_embedding, 2048) for a in (args, untied))
    attention = 12 * 16 * 2048 * 2048
    assert untied_fpt == 6 * n_no_embedding + attention  # untied: lm_head is already in n_no_embedding
    assert tied_fpt - untied_fpt == 6 * 128256 * 2048


def test_save_overlap_counts_how_much_slower_the_steps_under_a_background_save_ran():
    """On a GPU an async save blocks the loop for milliseconds and slows the next steps by seconds: what a
    save cost is its blocked time plus the overlapped steps' excess over quiet steps, counted once."""
    o = SaveOverlap()
    for seconds in (5.0, 0.2, 0.2, 0.2, 0.2):  # the first step of an attempt (warm-up) is no reference
        o.step(seconds)
    assert o.reference() == pytest.approx(0.2)
    o.saved(10, in_background=True)
    for seconds in (0.3, 0.9, 0.5):  # the save's call and copy (0.1 s blocked) fall in the first
        o.step(seconds)
    assert o.committed(10, blocked_s=0.1) == pytest.approx(
        {"overlap_s": 1.0, "overlap_steps": 3, "cost_s": 1.1}
    )
    assert o.reference() == pytest.approx(0.2), "the slowed steps are no reference"
    # a synchronous save: all of it blocked, and the step that held it is no reference either
    o.saved(12, in_background=False)
    o.step(3.0)
    assert o.committed(12, blocked_s=2.8) == {"overlap_s": 0.0, "overlap_steps": 0, "cost_s": 2.8}
    assert o.reference() == pytest.approx(0.2)
    # steps faster than the reference (noise) never make a save cost less than its blocked time
    o.saved(14, in_background=True)
    o.step(0.15)
    assert o.committed(14, blocked_s=0.01)["cost_s"] == pytest.approx(0.01)
    # before any quiet step there is nothing to compare with: unknown, not zero
    fresh = SaveOverlap()
    fresh.step(1.0)
    fresh.saved(1, in_background=True)
    fresh.step(0.5)
    assert fresh.committed(1, blocked_s=0.01) == {"overlap_s": None, "overlap_steps": 1, "cost_s": None}

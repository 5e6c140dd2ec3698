"""A private torch hook forced off (as a torch that changed it would): the trainer says the fallback on its
first line and records it in progress.json, which summary.json carries; the run is the same."""

import pytest

from conftest import FAST, read_json, run_trainer
from trainer.torch_private import OFF_ENV, TESTED


@pytest.mark.torchrun
def test_a_fallback_forced_off_is_named_on_the_first_line_and_in_progress(data_dir, tmp_path):
    args = [*FAST, "--steps", "4"]
    plain = run_trainer([*args, "--checkpoint-uri", str(tmp_path / "plain")], data_dir, nproc=2)
    off = run_trainer(
        [*args, "--checkpoint-uri", str(tmp_path / "off")], data_dir, nproc=2,
        env={OFF_ENV: "dynamo_graph_counter,crc32_every_thread"},
    )  # fmt: skip
    assert plain.returncode == off.returncode == 0, (plain, off)

    said = [
        line for line in off.stdout.splitlines() + off.stderr.splitlines() if "fallbacks in force" in line
    ]
    assert said and "dynamo_graph_counter: the startup event's graphs_compiled is null" in said[0], off
    assert "crc32_every_thread: DCP's writer threads keep torch.save's CRC32" in said[0]
    assert "every private torch hook in force" in plain.stdout + plain.stderr, plain

    report = read_json(tmp_path / "off" / "progress.json")["torch"]
    assert set(report["fallbacks_in_force"]) == {"dynamo_graph_counter", "crc32_every_thread"}, report
    assert report["version"].startswith("2.") and report["tested"] == f"{TESTED[0]}..{TESTED[1]}"
    assert read_json(tmp_path / "plain" / "progress.json")["torch"]["fallbacks_in_force"] == {}
    assert off.of("startup")[-1]["graphs_compiled"] is None  # not counted, not a made-up 0
    assert plain.of("startup")[-1]["graphs_compiled"] == 0
    assert off.losses() == plain.losses()  # slower is allowed, different is not

"""The trainer benchmarks still run against the trainer's current API (their figures are
measured by hand, see benchmarks/RESULTS.md; here only that they run and report), and
`make bench-smoke` runs every benchmark (in --quick mode: .ci/run, not here)."""

import re
import subprocess
import sys

import pytest

from tests.trainer.conftest import REPO, trainer_env


def run(script: str, *args: str, data_dir: str) -> str:
    out = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / script), *args],
        env=trainer_env(data_dir),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_trainer_overhead_prints_both_rates_and_their_ratio(data_dir):
    out = run("trainer_overhead.py", "--steps", "2", "--rounds", "2", "--seq-len", "32", data_dir=data_dir)
    rates = dict(re.findall(r"^(bare PyTorch loop|trainer):\s+([\d.]+) steps/s", out, re.M))
    ratio = float(re.search(r"^trainer/bare:\s+([\d.]+)", out, re.M).group(1))
    assert set(rates) == {"bare PyTorch loop", "trainer"} and all(float(v) > 0 for v in rates.values()), out
    assert abs(ratio - float(rates["trainer"]) / float(rates["bare PyTorch loop"])) < 0.002, out
    # one process: against a hand-built plain module, and what FSDP2 would cost there
    assert {"trainer/plain", "bare/plain", "FSDP2/plain"} <= set(
        re.findall(r"^([\w/]+):\s+[\d.]+  \(per round", out, re.M)
    ), out


def test_mfu_refuses_a_cpu_unless_asked_and_then_reports_tokens_per_second(data_dir):
    refused = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "mfu.py")],
        env=trainer_env(data_dir),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode == 2 and "torch.cuda.is_available() is False" in refused.stderr
    out = run(
        "mfu.py",
        "--flavor",
        "debug",
        "--allow-cpu",
        "--steps",
        "2",
        "--warmup",
        "1",
        "--seq-len",
        "32",
        "--no-compile",
        data_dir=data_dir,
    )
    assert float(re.search(r"^tokens/s: ([\d,]+)", out, re.M).group(1).replace(",", "")) > 0, out
    assert "MFU: n/a" in out  # no bf16 peak is known for a CPU


# The files of benchmarks/ that are not scripts, and why: bench-smoke runs the scripts that use them.
NOT_SCRIPTS = {
    "spot_traces.py": "the trace reader of spot_cost.py, spot_choice.py and spot_hindsight.py",
    "_common.py": "what the scripts share: the repository on sys.path, helpers of more than one script",
    "_where.py": "recovery.py's reading of a restart's startup event: where its time went",
    "_two_nodes.py": "recovery.py's one-of-two-nodes-lost rows",
}


def test_bench_smoke_runs_every_benchmark_script_in_quick_mode():
    # make's own reading of the target (-n: prints the recipe, runs nothing), as `make bench-smoke` expands it
    dry = subprocess.run(["make", "-n", "bench-smoke"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert dry.returncode == 0, dry.stderr
    loop = re.search(r"for s in ([^;]+);", dry.stdout)
    assert loop and "--quick" in dry.stdout[loop.end() :], dry.stdout
    listed = loop.group(1).split()
    files = sorted(p.name for p in (REPO / "benchmarks").iterdir() if p.suffix in (".py", ".sh"))
    scripts = [f for f in files if f not in NOT_SCRIPTS]
    # a new script goes in the Makefile's BENCH_SCRIPTS (or, if it is not a script, in NOT_SCRIPTS)
    assert sorted(listed) == scripts, f"benchmarks/ has {scripts}, bench-smoke runs {listed}"
    for name in scripts:
        assert "--quick" in (REPO / "benchmarks" / name).read_text(), f"benchmarks/{name} has no --quick mode"
    for name in NOT_SCRIPTS:
        assert "__main__" not in (REPO / "benchmarks" / name).read_text(), f"benchmarks/{name} has a main now"
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    assert ci.index("make bench-smoke") > ci.index("make test-faults") > ci.index("make test"), ci


def test_benchmarks_read_checkpoints_through_checkpoint_dir(tmp_path, monkeypatch):
    # the fault lab's reads: committed manifests only (an interrupted save and a broken manifest are not
    # read), progress.json through CheckpointDir ({} before it exists), leases by group
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    from faultlab.checkpoints import lease_of, manifests, progress

    from trainer.checkpoint.directory import CheckpointDir

    root = CheckpointDir(str(tmp_path))
    assert progress(tmp_path) == {} and manifests(tmp_path) == []
    root.write_json("step-00000005/manifest.json", {"step": 5})
    root.write_json("step-00000015/manifest.json", {"step": 15})
    (tmp_path / "step-00000010").mkdir()  # an interrupted save
    (tmp_path / "step-00000020").mkdir()
    (tmp_path / "step-00000020" / "manifest.json").write_text('{"step": 2')  # a corruption fault's
    root.write_json("progress.json", {"step": 15, "steps_lost": 0})
    assert [m["step"] for m in manifests(tmp_path)] == [5, 15]
    assert progress(tmp_path) == {"step": 15, "steps_lost": 0}
    root.acquire_lease({"group": "writer-a"})
    assert lease_of(tmp_path, "writer-a").token == 1 and lease_of(tmp_path, "writer-b") is None


def test_recovery_reads_a_runs_events_from_its_own_directory(tmp_path, monkeypatch):
    # events come from $DTRAIN_EVENTS_DIR as they are written, not from stdout; one generator per run:
    # leaving a loop over it and looping again goes on where it stopped, and it ends when the run has
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    from recovery import events

    from trainer.events import EVENTS_DIR_ENV

    events_dir = tmp_path / "events"
    writer = (
        "from trainer.events import emit\n"
        "for step in range(1, 6): emit('train', step=step)\n"
        "emit('preempted', step=5)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", writer],
        cwd=REPO,
        env={**trainer_env(str(tmp_path)), EVENTS_DIR_ENV: str(events_dir)},
        stdout=subprocess.DEVNULL,
    )
    stream = events(proc, str(events_dir))
    first = next(e for e in stream if e["event"] == "train" and e["step"] >= 2)
    rest = list(stream)
    assert first["step"] == 2 and [e.get("step") for e in rest] == [3, 4, 5, 5], rest
    assert rest[-1]["event"] == "preempted" and proc.wait() == 0


def test_the_faulty_s3_fails_the_chosen_writes_and_passes_the_rest(monkeypatch):
    # the fault lab's S3 (moto behind a fault front): a burst of 503 SlowDown on matching PUTs is retried by
    # the client and the object lands once; reads and other keys go through; a persistent 500 fails the
    # write with the OSError the trainer reports (exit 74), and nothing of it is stored
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    from faultlab.s3_server import BUCKET, FaultyS3

    s3 = FaultyS3()
    try:
        s3.create_bucket()
        for k, v in s3.env.items():
            monkeypatch.setenv(k, v)
        import fsspec

        fs = fsspec.filesystem("s3", use_listings_cache=False, skip_instance_cache=True)
        s3.faults.fail(r"/step-\d+/", 503, count=2)
        fs.pipe_file(f"{BUCKET}/run/progress.json", b"{}")  # not a checkpoint key: untouched
        fs.pipe_file(f"{BUCKET}/run/step-00000005/manifest.json", b'{"step": 5}')
        assert fs.cat(f"{BUCKET}/run/step-00000005/manifest.json") == b'{"step": 5}'
        assert [(m, p, s) for m, p, s in s3.faults.injected] == [
            ("PUT", f"/{BUCKET}/run/step-00000005/manifest.json", 503)
        ] * 2
        s3.faults.fail(r"/step-00000010/", 500)
        with pytest.raises(OSError, match="internal error"):
            fs.pipe_file(f"{BUCKET}/run/step-00000010/manifest.json", b"{}")
        assert not fs.exists(f"{BUCKET}/run/step-00000010/manifest.json")
        s3.faults.clear()
        fs.pipe_file(f"{BUCKET}/run/step-00000010/manifest.json", b"{}")  # S3 is back
        with pytest.raises(ValueError, match="status: expected one of \\[500, 503\\], got 404"):
            s3.faults.fail("x", 404)
    finally:
        s3.stop()

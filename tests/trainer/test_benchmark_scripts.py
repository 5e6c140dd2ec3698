"""The trainer benchmarks still run against the trainer's current API (their figures are
measured by hand, see benchmarks/RESULTS.md; here only that they run and report), and
`make bench-smoke` runs every benchmark (in --quick mode: .ci/run, not here)."""

import re
import subprocess
import sys

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

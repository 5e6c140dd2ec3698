"""trainer.checkpoint.directory against directories built by hand, locally and on a moto S3 server:
what resume, the ledger, validation, evaluation and the summary all take as "the latest"."""

import json
import subprocess
import sys
import uuid

import pytest

from conftest import BUCKET, REPO
from trainer.checkpoint.directory import (
    BEST,
    EVAL_RESULTS,
    MANIFEST,
    PROGRESS,
    SUMMARY,
    CheckpointDir,
    step_dir_name,
)
from trainer.checkpoint.spend_files import Ledger


class Root:
    """A checkpoint root that a test fills the way the trainer would, file by file."""

    def __init__(self, uri: str, fs, base: str):
        self.uri, self.fs, self.base = uri, fs, base

    def put(self, name: str, data: bytes | dict) -> None:
        if isinstance(data, dict):
            data = json.dumps(data).encode()
        path = f"{self.base}/{name}"
        self.fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        self.fs.pipe_file(path, data)

    def save(
        self, step: int, *, commit: bool = True, cost: dict | None = None, job: str | None = None
    ) -> None:
        """A step directory with its shard files; its manifest only if ``commit`` (else: an interrupted
        save)."""
        name = step_dir_name(step)
        self.put(f"{name}/.metadata", b"meta")
        self.put(f"{name}/__0_0.distcp", b"shard")
        if commit:
            self.put(f"{name}/{MANIFEST}", {
                "step": step, "step_time_s": 1.5, "world_size": 1, "flavor": "debug", "config_hash": "0",
                "files": {}, "tokens_seen": 8 * step, "wall_time_s": 1.5 * step,
                **({"cost": cost} if cost else {}), **({"job": job} if job is not None else {}),
            })  # fmt: skip

    def names(self) -> list[str]:
        self.fs.invalidate_cache()
        return sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in self.fs.ls(self.base, detail=False))


@pytest.fixture(params=["local", "s3"])
def root(request, tmp_path):
    import fsspec

    if request.param == "local":
        base = str(tmp_path / "ckpt")
        fs = fsspec.filesystem("file")
        fs.makedirs(base, exist_ok=True)
        return Root(base, fs, base)
    request.getfixturevalue("s3")
    fs = fsspec.filesystem("s3", skip_instance_cache=True)
    prefix = f"{BUCKET}/runs/{uuid.uuid4().hex[:8]}"  # moto keeps its buckets for the whole process
    return Root(f"s3://{prefix}", fs, prefix)


def test_an_interrupted_save_is_never_the_latest(root):
    root.save(2)
    root.save(4)
    root.save(6, commit=False)  # files written, killed before its manifest
    ckpt = CheckpointDir(root.uri)

    assert ckpt.latest() == (4, ckpt.step_path(4))
    assert [c.step for c in ckpt.committed()] == [2, 4]
    assert [c.step for c in ckpt.step_dirs()] == [2, 4, 6]
    assert ckpt.ledger().step == 4
    with pytest.raises(FileNotFoundError, match="not a committed checkpoint"):
        ckpt.manifest(6)
    with pytest.raises(FileNotFoundError, match="not a committed checkpoint"):
        CheckpointDir.resolve(f"{root.uri}/{step_dir_name(6)}")


def test_the_highest_committed_step_wins_and_other_names_are_ignored(root):
    for step in (100, 8, 10):
        root.save(step)
    root.put("step-12/manifest.json", {"step": 12})  # not step-XXXXXXXX: not a checkpoint
    root.put(f"{step_dir_name(200)}.tmp/{MANIFEST}", {"step": 200})
    root.put(PROGRESS, {"status": "running"})
    ckpt = CheckpointDir(root.uri)

    assert ckpt.latest().step == 100
    assert [c.step for c in ckpt.committed()] == [8, 10, 100]
    resolved, step_dir, manifest = CheckpointDir.resolve(root.uri)
    assert (step_dir, manifest["step"]) == (ckpt.step_path(100), 100)
    # a step directory URI means that checkpoint, not the latest
    resolved, step_dir, manifest = CheckpointDir.resolve(f"{root.uri}/{step_dir_name(8)}/")
    assert (resolved.root, step_dir, manifest["step"]) == (ckpt.root, ckpt.step_path(8), 8)


def test_an_empty_or_missing_directory_has_no_checkpoint_an_empty_ledger_and_no_progress(root, tmp_path):
    for uri in (root.uri, f"{root.uri}/never-written"):
        ckpt = CheckpointDir(uri)
        assert ckpt.latest() is None and ckpt.committed() == []
        assert ckpt.ledger() == Ledger()
        assert (ckpt.ledger().total_dollars, ckpt.ledger().path) == (0.0, None)
        assert ckpt.progress() == {}
        with pytest.raises(FileNotFoundError, match="no committed checkpoint"):
            CheckpointDir.resolve(uri)


def test_a_new_checkpoint_is_seen_by_the_same_reader(root):
    """Another process (the trainer) commits while the provider holds its reader: no stale listing."""
    ckpt = CheckpointDir(root.uri)
    assert ckpt.latest() is None
    root.save(2)
    assert ckpt.latest().step == 2
    root.save(4, commit=False)
    assert ckpt.latest().step == 2
    root.put(f"{step_dir_name(4)}/{MANIFEST}", {"step": 4})
    assert ckpt.latest().step == 4


def test_ledger_progress_and_summary(root):
    cost = {
        "spot": {"node_hours": 1.0, "gpu_hours": 8.0, "dollars": 3.0},
        "on_demand": {"node_hours": 0.5, "gpu_hours": 4.0, "dollars": 5.0},
        "total_dollars": 8.0,
    }
    root.save(2, cost={"spot": {"dollars": 1.0}})
    root.save(4, cost=cost)
    root.put(PROGRESS, {"status": "completed", "step": 4, "history": [[1, 4.0], [4, 3.0]]})
    ckpt = CheckpointDir(root.uri)

    ledger = ckpt.ledger()
    assert (ledger.step, ledger.total_dollars, ledger.gpu_hours, ledger.step_time_s) == (4, 8.0, 12.0, 1.5)
    assert ledger.path == ckpt.step_path(4)
    assert ckpt.progress()["history"] == [[1, 4.0], [4, 3.0]]

    path = ckpt.write_summary({"final_step": 4})
    assert path == ckpt.path(SUMMARY) and SUMMARY in root.names()
    assert CheckpointDir(root.uri).read_json(SUMMARY) == {"final_step": 4}


def test_a_malformed_cost_entry_is_skipped_naming_the_manifest_and_the_field(root):
    root.save(1, cost={"spot": {"dollars": 0.5}})
    root.save(2, cost={"spot": {"dollars": "a lot"}})
    ledger = CheckpointDir(root.uri).ledger()
    assert (ledger.step, ledger.total_dollars) == (1, 0.5)
    (skipped,) = ledger.skipped
    assert (
        skipped["checkpoint"].endswith(step_dir_name(2))
        and f"{step_dir_name(2)}/{MANIFEST}: cost.spot" in skipped["detail"]
    )


@pytest.mark.parametrize("damage", ["truncated", "nan", "not_an_object"])
def test_the_budget_ledger_and_validation_skip_a_bad_newest_manifest_and_never_wait(root, damage):
    """The budget task reads the newest manifest that passes the checks validation makes; a truncated
    manifest, a NaN in it, or one that is not an object is named and skipped, the one before is used."""
    from trainer.checkpoint.errors import CheckpointInvalid

    root.save(2, cost={"spot": {"dollars": 1.0}})
    root.save(4, cost={"spot": {"dollars": 2.0}})
    name = f"{step_dir_name(4)}/{MANIFEST}"
    good = json.dumps(
        {
            "step": 4,
            "step_time_s": 1.5,
            "world_size": 1,
            "flavor": "debug",
            "config_hash": "0",
            "files": {},
            "tokens_seen": 32,
            "wall_time_s": 6.0,
            "cost": {"spot": {"dollars": 2.0}},
        }
    )
    root.put(
        name,
        {
            "truncated": good[: len(good) // 2].encode(),
            "nan": good.replace("1.5", "NaN").encode(),
            "not_an_object": b"[4]",
        }[damage],
    )
    ckpt = CheckpointDir(root.uri)
    ledger = ckpt.ledger()
    assert (ledger.step, ledger.total_dollars, ledger.step_time_s) == (2, 1.0, 1.5)
    assert [s["checkpoint"] for s in ledger.skipped] == [ckpt.step_path(4)]
    with pytest.raises(CheckpointInvalid) as err:
        ckpt.checked_manifest(4)
    assert err.value.check == "manifest" and err.value.file == MANIFEST
    if damage == "nan":
        assert "step_time_s is nan, not a finite number" in str(err.value)


def test_small_json_files_under_a_root_not_created_yet(root):
    registry = CheckpointDir(f"{root.uri}/registry")
    assert registry.read_json("best.json") is None
    registry.write_json("best.json", {"loss": 2.5})
    registry.write_json(EVAL_RESULTS, {"step": 4})  # a subdirectory too
    assert registry.read_json("best.json") == {"loss": 2.5}
    assert CheckpointDir(f"{root.uri}/registry").read_json(EVAL_RESULTS) == {"step": 4}


def test_retention_keeps_the_last_and_the_best_and_drops_dead_interrupted_saves(root):
    for step in (2, 4, 6, 8):
        root.save(step)
    root.save(3, commit=False)  # dead: a later save committed
    root.save(10, commit=False)  # maybe still in flight: left alone
    ckpt = CheckpointDir(root.uri)
    ckpt.mark_best(4, {"loss": 2.0})

    removed = ckpt.prune(keep=2)

    assert sorted(removed) == [ckpt.step_path(2), ckpt.step_path(3)]
    assert [n for n in root.names() if n.startswith("step-")] == [step_dir_name(s) for s in (4, 6, 8, 10)]
    assert [c.step for c in ckpt.committed()] == [4, 6, 8]
    assert ckpt.is_best(4) and not ckpt.is_best(6)
    assert json.loads(root.fs.cat_file(f"{root.base}/{step_dir_name(4)}/{BEST}"))["loss"] == 2.0


def test_mark_best_refuses_an_uncommitted_save(root):
    root.save(2, commit=False)
    with pytest.raises(FileNotFoundError, match="not a committed checkpoint"):
        CheckpointDir(root.uri).mark_best(2)


def test_importing_it_loads_neither_torch_nor_numpy_nor_fsspec():
    """The provider imports it at DAG-parse time."""
    code = (
        "import sys, trainer.checkpoint.directory\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy', 'fsspec', 's3fs')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, check=True, capture_output=True, text=True
    ).stdout
    assert out.strip() == "[]"


def test_retention_never_counts_or_removes_another_jobs_checkpoints(root):
    root.save(2, job="other")
    root.save(4)  # an older manifest: no job field, counts as this job's
    root.save(6, job="mine")
    root.save(8, job="other")
    root.save(10, job="mine")
    ckpt = CheckpointDir(root.uri)

    assert ckpt.foreign_jobs("mine") == {"other": [ckpt.step_path(2), ckpt.step_path(8)]}
    assert ckpt.foreign_jobs("") == {}  # a run without a job name claims nothing and refuses nothing
    assert ckpt.job_of(4) == "" and ckpt.job_of(6) == "mine"

    removed = ckpt.prune(keep=1, job="mine")

    assert sorted(removed) == [ckpt.step_path(4), ckpt.step_path(6)]
    assert [c.step for c in ckpt.committed()] == [2, 8, 10]
    # a run that continues job "other" under its own name: other's checkpoints are its own now
    assert ckpt.foreign_jobs("mine", continues="other") == {}
    assert ckpt.prune(keep=1, job="mine", continues="other") == [ckpt.step_path(2), ckpt.step_path(8)]


def test_writer_leases_taken_concurrently_get_distinct_increasing_tokens(root):
    from concurrent.futures import ThreadPoolExecutor

    ckpt = CheckpointDir(root.uri)
    assert ckpt.leases() == [] and ckpt.newest_lease() is None

    def take(i: int) -> list[int]:
        mine = CheckpointDir(root.uri)  # a reader of its own, as another process would have
        return [mine.acquire_lease({"group": f"g{i}", "pid": i}).token for _ in range(3)]

    with ThreadPoolExecutor(max_workers=6) as pool:
        tokens = [t for part in pool.map(take, range(6)) for t in part]

    # every creator won a token of its own (a token taken from a stale listing is given back: gaps are fine)
    assert len(set(tokens)) == len(tokens) == 18
    newest = ckpt.newest_lease()
    assert (
        newest.token == max(tokens) and newest.info["token"] == max(tokens) and newest.group.startswith("g")
    )
    assert (
        ckpt.leases()[-1] == max(tokens) and len(ckpt.leases()) <= 4 + 6
    )  # old ones pruned (racing prunes may lag)


def test_lease_creation_is_exclusive_across_processes(tmp_path):
    """Processes, not threads: ``Storage.create_exclusive`` must hold against other writers of the file."""
    script = (
        "import sys; from trainer.checkpoint.directory import CheckpointDir\n"
        "d = CheckpointDir(sys.argv[1])\n"
        "print(' '.join(str(d.acquire_lease({'pid': 0}).token) for _ in range(10)))\n"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(tmp_path / "ckpt")],
            cwd=REPO,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    tokens = [int(t) for p in procs for t in p.communicate(timeout=120)[0].split()]
    assert all(p.returncode == 0 for p in procs)
    assert len(set(tokens)) == len(tokens) == 40  # unique across processes (gaps allowed, see acquire_lease)

"""Checkpoint throughput against the disk's own bandwidth, and the stall of an async save.

    python benchmarks/checkpoint.py [--mb 200] [--batch 64] [--dir DIR] [--rounds 6]
    python benchmarks/checkpoint.py --quick     # 16 MiB, 2 rounds: a check that it runs
    python benchmarks/checkpoint.py --device cuda --mb 4700 --rounds 2 --lean   # gpu_check.sh save

One process (a 1-rank gloo group), the trainer's real Checkpointer (get_state_dict, DCP
FileSystemWriter with fsync, xxh3_128 of every file, manifest), on a model of stacked
Linear layers holding --mb MiB of fp32 weights plus AdamW's two moments (3 × mb on disk).
Measured side by side in each round, on the same directory's filesystem:

* disk write:  the same number of bytes written to one file in 8 MiB blocks, then fsync
* disk write, same shape: the same bytes as write_threads files written by as many threads,
               each fsync'd: the reference with the save's own number of files and writers.
               It and the sync save alternate which goes first from round to round, and the
               ratio is reported per round (median, min, max over rounds 1..), not only in total
* disk read:   that file read back (page cache not dropped: see RESULTS.md)
* sync save:   Checkpointer.save(blocking=True): write + fsync + xxh3 + manifest, with
               checkpoint.write_threads files per rank written and hashed in parallel
* 1-stream:    the same with write_threads=1 (one file per rank: DCP's default)
* with CRC32:  the sync save with torch.save's per-record CRC32, as before the trainer turned it off
               (trainer/checkpoint/save.py: record_crc32)
* DCP write:   the same save without our hashing and manifest (dcp.save alone)
* load:        Checkpointer.load of that checkpoint
* host copy:   DCP's DefaultStager copying the state to host memory synchronously
               (what the async save used to block for)
* async save:  as the trainer does it: Checkpointer.save(blocking=False) right after an
               optimizer step, then training steps (forward/backward of --batch rows) go on
               while the copy to host memory, the write, the hashing and the commit run in the
               background (wait_for_staging() right before the first optimizer.step()), until
               the save is committed. Two costs, reported separately:
               - blocked: the time training waited (the save() call plus that wait);
               - overlapped slowdown: the sum, over every step that ran while the save was
                 in flight, of how much longer it took than the median step without a save
                 (the background work competes with training for the cores and the GIL).
               Their sum is what an async save really costs training.

Targets: sync save >= 70% of disk write bandwidth; async blocked + overlapped slowdown <= 25% of
the sync save (on CPU, where training and the background work share two cores).
"""

import argparse
import os
import shutil
import statistics
import tempfile
import time

import _common  # noqa: F401 - the repository on sys.path, before the trainer

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions  # noqa: E402

from ckptlab.disk import dir_bytes, disk_read, disk_write, disk_write_files  # noqa: E402
from trainer.checkpoint.checkpointer import Checkpointer  # noqa: E402
from trainer.checkpoint.save import record_crc32  # noqa: E402
from trainer.checkpoint.state import training_state  # noqa: E402
from trainer.config.sections import CheckpointConfig  # noqa: E402


class _Stateful:
    def __init__(self):
        self.position = 0

    def state_dict(self):
        return {"position": self.position}

    def load_state_dict(self, state):
        self.position = state["position"]


def build(mb: int, device: str = "cpu"):
    width = 1024
    layers = max(1, mb * 2**20 // (width * width * 4))
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False) for _ in range(layers)]).to(
        device
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(2, width, device=device)).sum().backward()
    optimizer.step()  # materialise both moments
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    return model, optimizer, scheduler, _Stateful()


def done_saving(checkpointer: Checkpointer) -> bool:
    """Whether the save in flight has been committed (polls, never waits)."""
    return bool(checkpointer.completed()) or checkpointer._pending is None


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--mb", type=int, default=200, help="MiB of fp32 weights (the checkpoint is ~3x)")
    p.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    p.add_argument(
        "--rounds",
        type=int,
        default=6,
        help="round 0 is reported apart (the first save); >= 6 gives "
        "five alternating pairs of the steady state",
    )
    p.add_argument(
        "--write-threads",
        type=int,
        default=CheckpointConfig.write_threads,
        help="checkpoint.write_threads of the sync and async saves",
    )
    p.add_argument(
        "--batch", type=int, default=64, help="rows per training step of the async-stall measurement"
    )
    p.add_argument(
        "--device",
        default="cpu",
        help="where the state lives: cpu, or cuda (a save copies it to the host first)",
    )
    p.add_argument(
        "--lean",
        action="store_true",
        help="only the sync save beside its same-shape write, the disk, the load and the async save (a GPU's "
        "14 GB state: --device cuda --mb 4700 --rounds 2 --lean fits one device call)",
    )
    p.add_argument("--quick", action="store_true", help="--mb 16 --rounds 2: every measurement, once warm")
    args = p.parse_args()
    if args.quick:
        args.mb, args.rounds = 16, 2
    return args


class Bench:
    """The model, its optimizer and data, a training batch, and one Checkpointer of each kind for the
    whole run, as in training: round 0 is the first save (staging buffers allocated, files created),
    later rounds the steady state of a long run."""

    fields = {"tokens_seen": 0, "wall_time_s": 0.0, "step_time_s": None, "cost": None}

    def __init__(self, args: argparse.Namespace, base: str):
        self.args, self.base = args, base
        self.model, self.optimizer, self.scheduler, self.data = build(args.mb, args.device)
        self.x = torch.randn(args.batch, 1024, device=args.device)
        self.sync, self.asy = self.checkpointer("sync", False), self.checkpointer("async", True)
        self.single = self.checkpointer("single", False, write_threads=1)
        self.crc = self.checkpointer("crc", False)

    def state(self) -> tuple:
        return self.model, self.optimizer, self.scheduler, self.data

    def step(self, before_optimizer_step=None) -> None:
        self.model(self.x).sum().backward()
        if before_optimizer_step is not None:
            before_optimizer_step()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def checkpointer(self, name: str, async_save: bool, write_threads: int | None = None) -> Checkpointer:
        write_threads = self.args.write_threads if write_threads is None else write_threads
        cfg = CheckpointConfig(
            uri=os.path.join(self.base, name), keep=1, async_save=async_save, write_threads=write_threads
        )
        return Checkpointer(
            cfg,
            flavor="bench",
            config={},
            config_hash="0",
            rank=0,
            world_size=1,
            device=torch.device(self.args.device),
        )

    def close(self) -> None:
        self.asy.close()
        self.sync.close()
        self.single.close()
        self.crc.close()


def sync_saves(b: Bench, r: int, rows: list[dict]) -> tuple[str, dict]:
    """The sync save, the same-shape disk write beside it (alternating first) and the 1-stream save."""
    args, base = b.args, b.base
    shape_dir = os.path.join(base, f"shape{r}")
    if r % 2:  # odd rounds: the reference first, with the previous round's size
        shaped_s = disk_write_files(shape_dir, rows[-1]["bytes"], args.write_threads)
    t = time.perf_counter()
    path = b.sync.save(r + 1, *b.state(), manifest_fields=b.fields, reason="bench", blocking=True)
    sync_s = time.perf_counter() - t
    nbytes = dir_bytes(path)
    if not r % 2:
        shaped_s = disk_write_files(shape_dir, nbytes, args.write_threads)
    shutil.rmtree(shape_dir, ignore_errors=True)
    if args.lean:
        return path, dict(bytes=nbytes, sync=sync_s, shaped=shaped_s)
    t = time.perf_counter()
    b.single.save(r + 1, *b.state(), manifest_fields=b.fields, reason="bench", blocking=True)
    single_s = time.perf_counter() - t
    record_crc32(True)
    t = time.perf_counter()
    b.crc.save(r + 1, *b.state(), manifest_fields=b.fields, reason="bench", blocking=True)
    crc_s = time.perf_counter() - t
    record_crc32(False)
    return path, dict(bytes=nbytes, sync=sync_s, shaped=shaped_s, single=single_s, crc=crc_s)


def references(b: Bench, r: int, path: str, nbytes: int) -> tuple[list[str], dict]:
    """DCP alone, the disk's write and read, the load and the host copy; the paths to remove after."""
    raw_dir = os.path.join(b.base, f"raw{r}")
    t = time.perf_counter()
    if not b.args.lean:
        dcp.save(training_state(*b.state(), 1, rank=0), checkpoint_id=raw_dir)
    dcp_s = time.perf_counter() - t

    blob = os.path.join(b.base, f"disk{r}.bin")
    write_s = disk_write(blob, nbytes)
    read_s = disk_read(blob)

    t = time.perf_counter()
    b.sync.load(path, *b.state())
    load_s = time.perf_counter() - t

    stager = DefaultStager(StagingOptions(False, False, False, False))
    t = time.perf_counter()
    stager.stage(training_state(*b.state(), 1, rank=0))
    copy_s = time.perf_counter() - t
    stager.close()
    return [raw_dir, blob], dict(dcp=dcp_s, write=write_s, read=read_s, load=load_s, copy=copy_s)


def async_save(b: Bench, r: int, ckpt: Checkpointer | None = None) -> dict:
    """An async save (by ``ckpt``, default the async checkpointer) right after an optimizer step, training
    going on until it is committed."""
    ckpt = ckpt or b.asy
    plain = []
    for _ in range(5):
        t = time.perf_counter()
        b.step()
        plain.append(time.perf_counter() - t)
    plain_s = statistics.median(plain)
    t = time.perf_counter()
    ckpt.save(r + 1, *b.state(), manifest_fields=b.fields, reason="bench")
    call_s = time.perf_counter() - t
    waited, overlapped = [], []
    while not done_saving(ckpt):
        s0 = time.perf_counter()
        b.step(lambda: waited.append(ckpt.wait_for_staging()))
        overlapped.append(time.perf_counter() - s0 - waited[-1])
    async_total_s = time.perf_counter() - t
    blocked_s = call_s + sum(waited)
    slowdown_s = sum(max(0.0, o - plain_s) for o in overlapped)
    return dict(
        blocked=blocked_s,
        save_call=call_s,
        step_plain=plain_s,
        overlapped_steps=len(overlapped),
        slowdown=slowdown_s,
        async_total=async_total_s,
    )


def warm_first_save(b: Bench) -> dict:
    """The first async save of a checkpointer whose stager allocated its buffers ahead (the trainer's
    ``warm_up_staging`` after the first step), beside round 0's first save without."""
    ckpt = b.checkpointer("warm", True)
    ckpt.warm_up_staging(*b.state(), step=0)
    ckpt._saver.warm_up.result()  # as a run's first steps would have given it time to
    row = async_save(b, 0, ckpt)
    ckpt.close()
    shutil.rmtree(os.path.join(b.base, "warm"), ignore_errors=True)  # a GPU's state is 14 GB a copy
    return {f"warm_{k}": v for k, v in row.items()}


def run_round(b: Bench, r: int, rows: list[dict]) -> dict:
    """Every measurement of one round, side by side on the same directory's filesystem; printed."""
    path, saves = sync_saves(b, r, rows)
    leftovers, refs = references(b, r, path, saves["bytes"])
    asy = async_save(b, r)
    if r == 0:
        asy.update(warm_first_save(b))
    for d in leftovers:  # the DCP-alone directory is not written with --lean
        if os.path.isdir(d):
            shutil.rmtree(d, ignore_errors=True)
        elif os.path.exists(d):
            os.remove(d)
    row = {**saves, **refs, **asy}
    print(
        f"round {r}: " + ", ".join(f"{k}={v:.3f}" for k, v in row.items() if k != "bytes"),
        flush=True,
    )
    return row


def print_saves(args: argparse.Namespace, rows: list[dict], base: str) -> dict:
    """Round 0 apart, then the medians of the others: the disk, the sync saves, DCP, the load and the
    host copy against each other; returns the medians."""
    first = rows[0]
    warm = rows[1:] or rows
    med = {k: statistics.median(row[k] for row in warm) for k in rows[-1]}
    print(
        f"\nfirst save (round 0): sync {first['sync']:.3f} s; async blocked {first['blocked']:.3f} s + "
        f"overlapped slowdown {first['slowdown']:.3f} s (staging buffers allocated by this save); with them "
        f"allocated ahead (warm_up_staging): blocked {first['warm_blocked']:.3f} s + overlapped slowdown "
        f"{first['warm_slowdown']:.3f} s"
    )
    gb = med["bytes"] / 1e9
    print(
        f"checkpoint size: {med['bytes'] / 2**20:.0f} MiB (medians of rounds 1..{args.rounds - 1}: the "
        f"steady state), dir {base}"
    )
    print(f"disk write (fsync): {gb / med['write']:.2f} GB/s   disk read: {gb / med['read']:.2f} GB/s")
    print(
        f"sync save (DCP + fsync + xxh3 + manifest): {gb / med['sync']:.2f} GB/s = "
        f"{med['write'] / med['sync']:.0%} of disk write  [target >= 70%]"
    )
    ratios = [row["shaped"] / row["sync"] for row in warm]
    print(
        f"  vs the same bytes as {args.write_threads} files by {args.write_threads} fsync'd writers "
        f"({gb / med['shaped']:.2f} GB/s), alternating first from round to round: per round median "
        f"{statistics.median(ratios):.0%} (min {min(ratios):.0%}, max {max(ratios):.0%}, {len(ratios)} pairs)"
    )
    if args.lean:
        print(f"load: {gb / med['load']:.2f} GB/s = {med['read'] / med['load']:.0%} of disk read")
        return med
    print(
        f"  one file per rank (write_threads=1): {gb / med['single']:.2f} GB/s = "
        f"{med['write'] / med['single']:.0%} of disk write"
    )
    print(
        f"  with torch.save's per-record CRC32 (before): {gb / med['crc']:.2f} GB/s; the save without it "
        f"takes {med['sync'] / med['crc']:.0%} of its time"
    )
    print(f"  DCP write alone: {gb / med['dcp']:.2f} GB/s = {med['write'] / med['dcp']:.0%} of disk write")
    print(f"load: {gb / med['load']:.2f} GB/s = {med['read'] / med['load']:.0%} of disk read")
    print(
        f"host copy (synchronous staging): {med['copy']:.3f} s = {med['copy'] / med['sync']:.1%} of the "
        f"sync save"
    )
    return med


def print_async(med: dict) -> None:
    """The async save's two costs to training, and their sum, against the sync save."""
    cost = med["blocked"] + med["slowdown"]
    print(
        f"async save, blocked: {med['blocked']:.3f} s = {med['blocked'] / med['sync']:.1%} of the sync save "
        f"({med['sync']:.3f} s); of which the save() call {med['save_call']:.3f} s"
    )
    print(
        f"async save, overlapped slowdown: {med['slowdown']:.3f} s = {med['slowdown'] / med['sync']:.1%} of "
        f"the sync save, over {med['overlapped_steps']:.0f} step(s) of {med['step_plain']:.3f} s without a "
        f"save; saved to committed in {med['async_total']:.3f} s"
    )
    print(
        f"async save, total cost to training: {cost:.3f} s = {cost / med['sync']:.1%} of the sync save  "
        f"[target <= 25%]"
    )


def main() -> None:
    args = parse_args()
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="29581")
    dist.init_process_group("gloo")
    base = tempfile.mkdtemp(dir=args.dir, prefix="dtrain-ckpt-bench-")
    b = Bench(args, base)
    rows = []
    for r in range(args.rounds):
        rows.append(run_round(b, r, rows))
    b.close()
    print_async(print_saves(args, rows, base))
    shutil.rmtree(base, ignore_errors=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

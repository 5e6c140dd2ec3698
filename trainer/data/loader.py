"""Token data: the built-in corpus, where a dataset lives, and each rank's batches.

The on-disk format and its reader are trainer/data/token_store.py's. The built-in corpus is
written here in its version 1 form (unchanged, so existing caches stay valid):

* ``meta.json``: {"format": "dtrain-tokens", "version": 1, "tokenizer": "bytes",
  "vocab_size": 256, "dtype": "uint16", "splits": {"train": n_tokens, "val": n_tokens}}
* ``train.bin``, ``val.bin``: raw little-endian token ids, read through np.memmap.

Batches are a pure function of (seed, samples consumed so far): the loader's whole
state is one integer, saved in every checkpoint, so a resumed run sees exactly the
batches the uninterrupted run would have seen, for any world size.
"""

import json
import math
import os
import random
import shutil
import uuid

import numpy as np
import torch

from trainer.data.builtin_text import (
    BUILTIN_NAME,
    BUILTIN_TRAIN_BYTES,
    BUILTIN_VAL_BYTES,
    generate_builtin_text,
)
from trainer.config.fields import ConfigError
from trainer.config.sections import DataConfig
from trainer.events import emit
from trainer.data.token_store import cache_remote, is_remote, open_split

TRACE_SAMPLES_ENV = "DTRAIN_TRACE_SAMPLES"
"""``1``: every rank emits a "samples" event per step (``TrainBatches._trace``): tests of the data order."""
FORMAT_VERSION = 1  # of the built-in corpus; trainer.data.token_store reads v1 and v2


def default_data_dir() -> str:
    return os.environ.get("DTRAIN_DATA_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "airflow-dtrain", "data"
    )


# --------------------------------------------------------------------------- writing


def write_token_dir(out_dir: str, train: bytes, val: bytes, source: str) -> None:
    """Write the format atomically: build in a sibling temp dir, then rename into place.

    If another process (another node on a shared filesystem) renamed its copy first,
    ours is dropped: both are identical for the built-in corpus.
    """
    parent = os.path.dirname(os.path.abspath(out_dir))
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f".{os.path.basename(out_dir)}.tmp-{uuid.uuid4().hex}")
    os.makedirs(tmp)
    try:
        for name, data in (("train", train), ("val", val)):
            # byte-level tokens: a token id is the byte value; uint16 leaves room for
            # other tokenizers up to 65535 ids.
            np.frombuffer(data, dtype=np.uint8).astype("<u2").tofile(os.path.join(tmp, f"{name}.bin"))
        meta = {
            "format": "dtrain-tokens",
            "version": FORMAT_VERSION,
            "tokenizer": "bytes",
            "vocab_size": 256,
            "dtype": "uint16",
            "splits": {"train": len(train), "val": len(val)},
            "source": source,
        }
        with open(os.path.join(tmp, "meta.json"), "w") as f:
            json.dump(meta, f, indent=2)
        try:
            os.rename(tmp, out_dir)
        except OSError:
            if not os.path.exists(os.path.join(out_dir, "meta.json")):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def ensure_builtin(data_dir: str) -> str:
    """Build the built-in corpus under data_dir if it is not there yet; return its path."""
    path = os.path.join(data_dir, BUILTIN_NAME)
    if not os.path.exists(os.path.join(path, "meta.json")):
        text = generate_builtin_text(BUILTIN_TRAIN_BYTES + BUILTIN_VAL_BYTES, seed=1234)
        write_token_dir(
            path, text[:BUILTIN_TRAIN_BYTES], text[BUILTIN_TRAIN_BYTES:], source="builtin grammar v1"
        )
    return path


# --------------------------------------------------------------------------- reading


def resolve_dataset(cfg: DataConfig, is_local_leader: bool, barrier) -> str:
    """The local directory of cfg.dataset. The local rank 0 of each node builds the built-in
    corpus, or copies an ``s3://`` store to the node-local cache (nodes may not share a
    filesystem), while the others wait on `barrier()`."""
    if cfg.dataset == "builtin":
        path = os.path.join(default_data_dir(), BUILTIN_NAME)
        if is_local_leader:
            ensure_builtin(default_data_dir())
        barrier()
        return path
    if is_remote(cfg.dataset):
        # The leader's outcome travels through the filesystem: after the barrier the others
        # find its copy (cache_remote returns at once), or the leader has raised and the
        # launcher stops the group.
        failed = None
        if is_local_leader:
            try:
                cache_remote(
                    cfg.dataset, default_data_dir(), log=lambda m: print(f"[trainer] {m}", flush=True)
                )
            except FileNotFoundError as e:
                failed = e
        barrier()
        if failed is not None:
            raise ConfigError(f"data.dataset: {failed}")
        try:
            return cache_remote(cfg.dataset, default_data_dir())
        except FileNotFoundError as e:
            raise ConfigError(f"data.dataset: {e}") from None
    if not os.path.exists(os.path.join(cfg.dataset, "meta.json")):
        raise ConfigError(
            f'data.dataset: {cfg.dataset!r} is not "builtin", an s3:// store, nor a directory written by '
            "`python -m trainer.prepare_data` (no meta.json there)"
        )
    return cfg.dataset


def _affine_permutation(n: int, seed: int, epoch: int) -> tuple[int, int]:
    """(a, b) such that i -> (a*i + b) mod n is a permutation of range(n): a cheap,
    O(1)-memory shuffle of the sequence order, different for every epoch."""
    rng = random.Random(f"{seed}-{epoch}")
    if n == 1:
        return 1, 0
    while True:
        a = rng.randrange(1, n)
        if math.gcd(a, n) == 1:
            return a, rng.randrange(n)


def rank_share(global_batch: int, rank: int, world_size: int) -> tuple[int, int]:
    """(first sequence, sequences) of ``rank``'s contiguous block of every global batch: the even split when
    the world divides the batch, else shares that differ by at most one (parallel.uneven_batch)."""
    start = rank * global_batch // world_size
    return start, (rank + 1) * global_batch // world_size - start


class MicroBatches(list):
    """One optimizer step's micro-batches of a rank, ``[(inputs, targets)]``. ``weights`` is None when every
    rank's share splits into equal micro-batches (each micro-batch's mean loss is divided by their count);
    else each micro-batch's factor, its rows x world size / global batch, so that the ranks' mean gradient is
    still the global batch's mean, and 0 for the repeated micro-batches that keep a short rank in step with
    the others' collectives (parallel.uneven_batch)."""

    weights: list[float] | None = None


class TrainBatches:
    """This rank's micro-batches of the training split.

    Global sample g of the run (g = step * global_batch_size + j) is the sequence
    starting at token seq_len * perm(g mod n_seq). In each global batch, rank r takes
    the contiguous block j in [floor(r B/W), floor((r+1) B/W)) and cuts it into micro-batches, so
    ranks read disjoint slices and the union over ranks does not depend on the world size.
    """

    def __init__(
        self,
        directory: str,
        seq_len: int,
        global_batch_size: int,
        micro_batch_size: int,
        rank: int,
        world_size: int,
        seed: int,
        device: torch.device,
    ):
        self.tokens, self.meta = open_split(directory, "train")  # a TokenStream over the shards
        self.seq_len, self.seed, self.device = seq_len, seed, device
        self.global_batch_size, self.micro_batch_size = global_batch_size, micro_batch_size
        self.rank, self.world_size = rank, world_size
        self.start, self.share = rank_share(global_batch_size, rank, world_size)
        # Each sequence needs seq_len + 1 tokens (inputs and next-token targets).
        self.n_seq = (len(self.tokens) - 1) // seq_len
        # The held-out split too: checked at start, not by the first evaluation (step 0, or after the spend).
        held_out = len(open_split(directory, "val")[0])
        for split, n in (("train", len(self.tokens)), ("held-out", held_out)):
            if n < seq_len + 1:
                raise ConfigError(
                    f"data.dataset: {directory} ({self.meta.get('source', '?')}): its {split} split has "
                    f"{n:,} tokens, fewer than one sequence of seq_len + 1 = {seq_len + 1:,}: prepare it "
                    f"again with `python -m trainer.prepare_data --seq-len {seq_len}`, which holds out "
                    "enough or says how much text is missing"
                )
        self.samples_seen = 0  # global samples consumed; the loader's whole state
        # tests: each rank's "samples" event per step (its events file), the data order made visible
        self.trace = os.environ.get(TRACE_SAMPLES_ENV, "") == "1"
        self._perm_epoch, self._perm = -1, (1, 0)

    @property
    def vocab_size(self) -> int:
        return self.meta["vocab_size"]

    @property
    def tokenizer(self) -> dict:
        """The identity of the tokenizer the data was prepared with (trainer.data.token_store)."""
        return self.meta["tokenizer"]

    def _sequence(self, g: int) -> np.ndarray:
        epoch, i = divmod(g, self.n_seq)
        if epoch != self._perm_epoch:
            self._perm_epoch, self._perm = epoch, _affine_permutation(self.n_seq, self.seed, epoch)
        a, b = self._perm
        start = ((a * i + b) % self.n_seq) * self.seq_len
        return self.tokens[start : start + self.seq_len + 1]

    def next_batch(self) -> MicroBatches:
        """One optimizer step's micro-batches for this rank: [(inputs, targets)], each (micro_batch, seq_len)
        int64; where the global batch does not split evenly into micro-batches on every rank, with their
        ``weights`` and as many as the largest share's (``MicroBatches``)."""
        first = self.samples_seen + self.start
        rows = np.stack([self._sequence(first + j) for j in range(self.share)]).astype(np.int64)
        if self.trace:
            self._trace(first)
        self.samples_seen += self.global_batch_size
        rows = torch.from_numpy(rows).to(self.device)  # (share, seq_len + 1)
        out = MicroBatches((mb[:, :-1], mb[:, 1:]) for mb in rows.split(self.micro_batch_size))
        if self.global_batch_size % (self.world_size * self.micro_batch_size):
            largest_share = -(-self.global_batch_size // self.world_size)
            steps = -(-largest_share // self.micro_batch_size)  # every rank's count of micro-steps
            scale = self.world_size / self.global_batch_size
            out.weights = [len(x) * scale for x, _ in out] + [0.0] * (steps - len(out))
            out.extend([out[0]] * (steps - len(out)))
        return out

    def _trace(self, first: int) -> None:
        """A "samples" event of this rank (its own events file): the step, the world size, and the sequences
        it consumes for it, as their places in the training split (the shuffle applied), so that a test can
        check a resumed or resized run's data order against an uninterrupted one's."""
        places = []
        for g in range(first, first + self.share):
            epoch, i = divmod(g, self.n_seq)
            a, b = _affine_permutation(self.n_seq, self.seed, epoch)
            places.append((a * i + b) % self.n_seq)
        step = self.samples_seen // self.global_batch_size + 1
        emit("samples", step=step, rank=self.rank, world_size=self.world_size,
             samples=places)  # fmt: skip

    def state_dict(self) -> dict:
        return {"samples_seen": self.samples_seen, "seq_len": self.seq_len, "seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        self.samples_seen = int(state["samples_seen"])


def eval_batches(directory: str, seq_len: int, batch_size: int, max_batches: int, device: torch.device):
    """Consecutive non-overlapping sequences of the held-out split: (inputs, targets), each (batch,
    seq_len)."""
    tokens, _ = open_split(directory, "val")
    n_seq = (len(tokens) - 1) // seq_len
    if n_seq < 1:
        raise ValueError(
            f"{directory}: val split has {len(tokens)} tokens, fewer than seq_len+1 = {seq_len + 1}"
        )
    for first in range(0, min(n_seq, batch_size * max_batches), batch_size):
        idx = range(first, min(first + batch_size, n_seq))
        rows = np.stack([tokens[i * seq_len : i * seq_len + seq_len + 1] for i in idx]).astype(
            np.int64
        )  # (batch, seq_len + 1)
        rows = torch.from_numpy(rows).to(device)
        yield rows[:, :-1], rows[:, 1:]

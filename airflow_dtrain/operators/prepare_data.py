"""PrepareDataOperator: turn a dataset into the trainer's token store, as a task of the DAG."""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

if TYPE_CHECKING:
    from airflow.sdk import Context

BUILTIN = "builtin"
DEFAULT_ROOT_ENV = "DTRAIN_PREPARED_DATA_ROOT"


class DataError(ValueError):
    """A dataset or tokenizer this task cannot use; the message names the argument and the value."""


class PrepareDataOperator(BaseOperator):
    """
    Tokenise a dataset into the token store the trainer reads (``trainer/data/token_store.py``), with the
    Hugging Face ``tokenizers`` tokenizer of the model being trained, and return the store's location
    (XCom ``return_value``) for ``FSDPTrainOperator(dataset=...)``.

    What ``dataset`` may be:

    * ``"builtin"``: the generated demo corpus. Without a tokenizer it is returned as is (the
      trainer builds it byte-level, the zero-setup default); with one (``init_from``'s model) it is
      tokenised with that tokenizer, so a model with its own vocabulary trains on it.
    * a token store already (a directory or ``s3://`` prefix with the store's ``meta.json``): used
      as is, after checking it was prepared with the same tokenizer.
    * text to prepare: a ``.txt``, ``.jsonl`` (field ``text_field``) or ``.parquet`` file (column
      ``text_field``), a directory of such files (shards, all of one format, in name order) or a glob
      (``/data/c4/*.parquet``), local or ``s3://``; or a directory saved by Hugging Face ``datasets``
      (``save_to_disk``). Hub dataset names are not fetched: save one with ``datasets`` first.

    A row without text (null, not a string, not UTF-8, not JSON) is refused naming its file and line or
    row (``on_bad_row="error"``, the default), or counted and skipped (``"skip"``: the count and the first
    few places are in the log and in the store's ``meta.json``), the same in every format. The held-out
    split holds at least one document, and one evaluation sequence of ``seq_len`` when it is given;
    data too small for that is refused here with its counts, not by the first evaluation.

    A prepared store goes to ``<output_root>/<name>-<key>``, where the key hashes the input (path,
    size and modification time), the tokenizer's identity, ``text_field`` and the split settings:
    the next run of the DAG (a relaunch, the next scheduled run) finds it there and does not
    tokenise again (a directory's or a glob's files are each part of the key). Progress is printed to
    the task log every few seconds.

    :param dataset: see above. (templated)
    :param tokenizer: a ``tokenizer.json``, or a model directory / ``s3://`` prefix holding one
        (the ``init_from`` model); empty: byte-level. (templated)
    :param text_field: the JSON field or parquet/``datasets`` column holding the text. (templated)
    :param output_root: where prepared stores go (a directory or ``s3://`` prefix; on Kubernetes one
        the pods can read). Default: ``$DTRAIN_PREPARED_DATA_ROOT``, else
        ``$AIRFLOW_HOME/dtrain/data``. (templated)
    :param allowed_roots: directories or ``s3://`` prefixes that ``dataset`` and ``tokenizer`` must lie
        under (set by the DAG's author; default: anywhere), so that a trigger form cannot have the worker
        read another place.
    :param val_fraction: share of the text held out for evaluation.
    :param shard_tokens: tokens per shard file (default: the store's).
    :param on_bad_row: ``"error"`` (refuse a row without text, naming it) or ``"skip"`` (count and skip
        it). (templated)
    :param seq_len: the training job's sequence length: both splits must hold one sequence of it (seq_len
        + 1 tokens), a store given as ``dataset`` included; empty: at least one document each. (templated)
    """

    template_fields: Sequence[str] = (
        "dataset", "tokenizer", "text_field", "output_root", "on_bad_row", "seq_len",
    )  # fmt: skip
    ui_color = "#fdf1d6"

    def __init__(
        self,
        *,
        dataset: str = BUILTIN,
        tokenizer: str | None = "",
        text_field: str = "text",
        output_root: str | None = None,
        allowed_roots: list[str] | tuple[str, ...] | None = None,
        val_fraction: float = 0.05,
        shard_tokens: int | None = None,
        on_bad_row: str = "error",
        seq_len: int | str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.dataset = dataset
        self.tokenizer = tokenizer
        self.text_field = text_field
        self.output_root = output_root
        self.allowed_roots = tuple(allowed_roots) if allowed_roots is not None else None
        self.val_fraction = val_fraction
        self.shard_tokens = shard_tokens
        self.on_bad_row = on_bad_row
        self.seq_len = seq_len

    def execute(self, context: Context) -> str:
        dataset = str(self.dataset or BUILTIN).strip()
        tokenizer_spec = str(self.tokenizer or "").strip()
        text_field = str(self.text_field or "text")
        on_bad_row = str(self.on_bad_row or "error").strip()
        if on_bad_row not in ("error", "skip"):
            raise DataError(f"on_bad_row: must be 'error' or 'skip', got {self.on_bad_row!r}")
        try:
            seq_len = int(self.seq_len) if self.seq_len not in (None, "", "None") else None
        except (TypeError, ValueError):
            seq_len = 0
        if seq_len is not None and seq_len < 1:
            raise DataError(f"seq_len: must be a whole number of tokens, at least 1, got {self.seq_len!r}")
        from airflow_dtrain.errors import SpecError
        from airflow_dtrain.trust.limits import limits_for

        # the platform's storage roots, narrowed by this DAG's (allowed_roots): where a run may read and write
        limits = limits_for(None if self.allowed_roots is None else {"storage_roots": self.allowed_roots})
        for name, value in (("dataset", dataset), ("tokenizer", tokenizer_spec)):
            try:
                limits.check_uri(name, value)
            except SpecError as err:
                raise DataError(str(err)) from None
        if dataset == BUILTIN and not tokenizer_spec:
            self.log.info("dataset: the built-in demo corpus, byte-level (the trainer builds it)")
            return BUILTIN

        from trainer.prepare_data.errors import PrepareError
        from trainer.prepare_data.tokenizer import load_tokenizer

        with tempfile.TemporaryDirectory(prefix="dtrain-tokenizer-") as scratch:
            local_spec = _local_tokenizer(tokenizer_spec, scratch) if tokenizer_spec else None
            try:
                tok = load_tokenizer(local_spec)
            except PrepareError as e:
                raise DataError(_named(e)) from None
            store = _read_store_meta(dataset) if dataset != BUILTIN else None
            if store is not None:
                return self._use_store(dataset, store, tok, tokenizer_spec, seq_len)
            return self._prepare(dataset, tok, local_spec, text_field, scratch, limits, on_bad_row, seq_len)

    def _use_store(self, dataset: str, meta: dict, tok, tokenizer_spec: str, seq_len: int | None) -> str:
        from trainer.data.token_store import BYTES_TOKENIZER, describe_tokenizer, same_tokenizer

        saved = meta.get("tokenizer")
        saved = BYTES_TOKENIZER if saved in (None, "bytes") else saved
        if tokenizer_spec and not same_tokenizer(saved, tok.identity):
            raise DataError(
                f"dataset: {dataset!r} was prepared with tokenizer {describe_tokenizer(saved)}, but the "
                "model's "
                f"tokenizer ({tokenizer_spec!r}) is {describe_tokenizer(tok.identity)}: prepare the data "
                "with the "
                "model's tokenizer, or give the text itself as dataset and this task prepares it"
            )
        short = _short_of(meta, seq_len)
        if short:
            raise DataError(
                f"dataset: {dataset!r} is a token store whose {short}: prepare it again with "
                f"`python -m trainer.prepare_data --seq-len {seq_len}`, or give the text itself "
                "as dataset and this task prepares it"
            )
        self.log.info(
            "dataset: %s is a token store already (%s tokens, tokenizer %s)",
            dataset,
            _tokens(meta),
            describe_tokenizer(saved),
        )
        return dataset

    def _prepare(
        self,
        dataset: str,
        tok,
        local_spec: str | None,
        text_field: str,
        scratch: str,
        limits,
        on_bad_row: str,
        seq_len: int | None,
    ) -> str:
        from trainer.data.token_store import DEFAULT_SHARD_TOKENS
        from trainer.prepare_data.errors import PrepareError
        from trainer.prepare_data.pipeline import prepare

        shard_tokens = int(self.shard_tokens or DEFAULT_SHARD_TOKENS)
        inputs, source, text_field, name = self._inputs(dataset, text_field, scratch, limits)
        # on_bad_row: a store that skipped rows is never handed to a run that asked for them to be refused
        key = hashlib.sha256(json.dumps(
            [source, tok.identity, text_field, self.val_fraction, shard_tokens, on_bad_row], sort_keys=True
        ).encode()).hexdigest()[:16]  # fmt: skip
        tok_name = tok.identity.get("name") or tok.identity.get("kind")
        out = f"{self._root().rstrip('/')}/{name}-{tok_name}-{key}"
        existing = _read_store_meta(out)
        if existing is not None and _short_of(existing, seq_len):
            # prepared for shorter sequences (a small corpus): a store of its own holds out enough for these
            out = f"{out}-seq{seq_len}"
            existing = _read_store_meta(out)
        if existing is not None:
            self.log.info(
                "dataset: %s was prepared before with the same input and tokenizer: %s (%s tokens)",
                dataset,
                out,
                _tokens(existing),
            )
            return out
        self.log.info("dataset: preparing %s with tokenizer %s into %s", dataset, tok_name, out)
        try:
            prepare(
                inputs,
                out,
                tokenizer=local_spec,
                text_field=text_field,
                val_fraction=self.val_fraction,
                shard_tokens=shard_tokens,
                log=self.log.info,
                on_bad_row=on_bad_row,
                seq_len=seq_len,
            )
        except PrepareError as e:
            if "already exists" in str(e) or "appeared while preparing" in str(e):
                # Another run prepared the same store meanwhile: the same input and tokenizer, so the same
                # data.
                if _read_store_meta(out) is not None:
                    return out
            raise DataError(_named(e)) from None
        return out

    def _inputs(self, dataset: str, text_field: str, scratch: str, limits) -> tuple[list[str], str, str, str]:
        """What to prepare: (input files, source identity, text field, store name); the builtin corpus
        written to ``scratch``, a path's files checked against the storage roots."""
        from airflow_dtrain.errors import SpecError
        from trainer.prepare_data.errors import PrepareError
        from trainer.prepare_data.inputs import expand_input

        if dataset == BUILTIN:
            from trainer.data.builtin_text import BUILTIN_NAME, builtin_documents

            inputs = [os.path.join(scratch, f"{BUILTIN_NAME}.jsonl")]
            with open(inputs[0], "w") as f:
                for doc in builtin_documents():
                    f.write(json.dumps({"text": doc}) + "\n")
            source, text_field, name = BUILTIN_NAME, "text", BUILTIN_NAME
        else:
            try:
                files = expand_input(dataset)
            except PrepareError as e:
                hint = (
                    ""
                    if os.path.exists(dataset) or "://" in dataset or "*" in dataset
                    else " (it does not exist here; a Hugging Face hub dataset name is not fetched: save it "
                    "with "
                    "datasets' save_to_disk and give that directory)"
                )
                raise DataError(_named(e) + hint) from None
            for path, _ in files:  # a glob's match or a shard behind a symbolic link: within the roots too
                try:
                    limits.check_uri("dataset", path)
                except SpecError as err:
                    raise DataError(str(err)) from None
            inputs, source, name = [dataset], _fingerprint(dataset, files), _store_name(dataset)
        return inputs, source, text_field, name

    def _root(self) -> str:
        if self.output_root:
            return str(self.output_root)
        if os.environ.get(DEFAULT_ROOT_ENV):
            return os.environ[DEFAULT_ROOT_ENV]
        home = os.environ.get("AIRFLOW_HOME") or os.path.expanduser("~/airflow")
        return os.path.join(home, "dtrain", "data")


def _named(error: Exception) -> str:
    """trainer.prepare_data's message with its command-line options renamed to this task's arguments."""
    message = str(error)
    for option, argument in (
        ("--on-bad-row=skip", "on_bad_row='skip'"), ("--on-bad-row", "on_bad_row"), ("--input", "dataset"),
        ("--text-field", "text_field"), ("--tokenizer", "tokenizer"), ("--out", "output_root"),
        ("--seq-len", "seq_len"),
    ):  # fmt: skip
        message = message.replace(option, argument)
    return message


def _short_of(meta: dict, seq_len: int | None) -> str | None:
    """What a store lacks for one training and one evaluation sequence of `seq_len`, in words; None if
    nothing (or no seq_len)."""
    if not seq_len:
        return None
    for split, label in (("train", "train"), ("val", "held-out")):
        entry = (meta.get("splits") or {}).get(split)
        n = entry.get("tokens") if isinstance(entry, dict) else entry
        if isinstance(n, int) and n < seq_len + 1:
            return f"{label} split has {n:,} tokens, fewer than one sequence of seq_len + 1 = {seq_len + 1:,}"
    return None


def _store_name(dataset: str) -> str:
    """A store's name from its dataset: the file's stem, the directory's name, a glob's directory."""
    parts = [p for p in dataset.split("://")[-1].rstrip("/").split("/") if p]
    parts = parts[: next((i for i, p in enumerate(parts) if any(c in p for c in "*?[")), len(parts))]
    stem = os.path.splitext(parts[-1])[0] if parts else ""
    return re.sub(r"[^A-Za-z0-9._-]", "_", stem).strip("._") or "data"


def _tokens(meta: dict) -> str:
    splits = meta.get("splits") or {}
    train = splits.get("train")
    n = train.get("tokens") if isinstance(train, dict) else train
    return f"{n:,}" if isinstance(n, int) else "?"


def _read_store_meta(location: str) -> dict | None:
    """The meta.json of a complete token store at `location` (a directory or remote prefix); None if none."""
    from trainer.data.token_store import FORMAT, is_remote, remote_fs

    try:
        if is_remote(location):
            fs, root = remote_fs(location)
            meta = json.loads(fs.cat_file(f"{root.rstrip('/')}/meta.json"))
        else:
            path = location.removeprefix("file://")
            if not os.path.isdir(path):
                return None
            with open(os.path.join(path, "meta.json")) as f:
                meta = json.load(f)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return meta if meta.get("format") == FORMAT else None


def _fingerprint(dataset: str, files: list[tuple[str, str]]) -> list:
    """What identifies the input's content cheaply: each file's location, size and modification time (the
    ETag for object storage), a shard added to a directory or a glob included; a datasets directory by its
    files'."""
    from trainer.data.token_store import is_remote, remote_fs

    if is_remote(dataset):
        fs, _ = remote_fs(dataset)
        infos = [(path, fs.info(path.split("://", 1)[1])) for path, _ in files]
        return [
            dataset,
            [
                [path, info.get("size"), str(info.get("ETag") or info.get("LastModified") or "")]
                for path, info in infos
            ],
        ]
    out = []
    for path, kind in files:
        path = os.path.abspath(path.removeprefix("file://"))
        if kind == "datasets":
            inside = [os.path.join(d, n) for d, _, names in os.walk(path) for n in names]
            out.append(
                [
                    path,
                    sorted(
                        (os.path.relpath(f, path), os.path.getsize(f), os.path.getmtime(f)) for f in inside
                    ),
                ]
            )
        else:
            out.append([path, os.path.getsize(path), os.path.getmtime(path)])
    return [dataset, out]


def _local_tokenizer(spec: str, scratch: str) -> str:
    """A local path for the tokenizer `spec`: itself, or its files copied from object storage into
    `scratch` (the tokenizer files only, never the model's weights)."""
    from trainer.data.token_store import TOKENIZER_FILES, is_remote, remote_fs

    if not is_remote(spec):
        path = spec.removeprefix("file://")
        if not os.path.exists(path):
            raise DataError(
                f"tokenizer: {spec!r} does not exist (a tokenizer.json, or the model directory holding it)"
            )
        return path
    fs, root = remote_fs(spec)
    root = root.rstrip("/")
    local = os.path.join(scratch, os.path.basename(root) or "tokenizer")
    os.makedirs(local, exist_ok=True)
    if root.endswith(".json"):
        fs.get_file(root, os.path.join(local, "tokenizer.json"))
        return os.path.join(local, "tokenizer.json")
    found = [name for name in TOKENIZER_FILES if fs.exists(f"{root}/{name}")]
    if "tokenizer.json" not in found:
        raise DataError(f"tokenizer: {spec!r} holds no tokenizer.json")
    for name in found:
        fs.get_file(f"{root}/{name}", os.path.join(local, name))
    return local

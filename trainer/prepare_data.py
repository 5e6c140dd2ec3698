"""``python -m trainer.prepare_data --input PATH... --out DIR|s3://... [--tokenizer FILE|DIR] [--text-field text]
[--val-fraction F] [--seq-len N] [--on-bad-row error|skip] [--shard-tokens N]``

Tokenises documents into the trainer's token store (format: trainer/token_store.py), streaming:
documents are read and tokenised in batches and shards are written as they fill, so memory
does not grow with the corpus. The same is ``prepare(inputs, out, ...)`` for a DAG task.

Inputs, by their form:

* ``.txt`` (also .text, .md): one document per file, read in blocks of whole lines (a line longer
  than 4 MiB is cut before a space, so a file without newlines is still read in bounded blocks); the
  last --val-fraction of its bytes is a held-out document, so every file is in both splits.
* ``.jsonl`` / ``.json`` (JSON lines) and ``.parquet``: one document per line / row, from the
  --text-field field / column (parquet read in record batches); every 1/F-th document is held out,
  counted across all the inputs.
* a directory saved by Hugging Face ``datasets`` (``save_to_disk``): a Dataset is split as above;
  a DatasetDict trains on "train" and holds out "validation" (or else "test") when it has one.
* a directory of shards (local or s3://): its files in name order, all of one of the forms above
  (names starting with "." or "_", such as _SUCCESS or .crc files, are not data); or a glob
  (``/data/shards/*.jsonl``, ``s3://bucket/c4/part-*.parquet``): its matching files in name order.

Bad rows (a null, a number or another non-string where the text should be, bytes that are not UTF-8,
a lone surrogate such as "\\ud800", a line that is not JSON, a line without the field) are refused
(--on-bad-row=error, the default: the message names the file and the line, or the row) or counted and
skipped (--on-bad-row=skip: the count and the first few places are logged and kept in meta.json's
"bad_rows"). One policy for every form, so the same data gives the same store whatever its format.
Lines count from 1, as editors number them; rows from 0, as pyarrow, pandas and datasets index them.
A file that is binary, compressed or of another format under a text name is refused whatever the policy.

Held out: at least one document, and with --seq-len at least one evaluation sequence (seq_len + 1 tokens):
when every 1/F-th document gives less (a corpus of fewer than 1/F documents, say), the newest training
documents are held out instead. Data too small for that and a training sequence besides is refused
with its counts: a store the trainer can train on can be evaluated.

Tokenizer: without --tokenizer, byte-level (vocab 256). With it, a Hugging Face ``tokenizers``
tokenizer.json, or a model directory holding one (or a tokenizer ``transformers`` can convert).
Each document ends with the tokenizer's EOS id (tokenizer_config.json's eos_token, else a special
token named <|end_of_text|>, <|endoftext|>, </s> or <eos>); a tokenizer without one ends each
document with the encoding of a blank line ("\\n\\n"), as byte-level stores always have.
A document's first block is encoded with the tokenizer's special tokens (a BOS its
post-processor adds, say); the continuation blocks of a long .txt are not.
"""

import argparse
import glob
import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections import deque
from dataclasses import dataclass

import numpy as np

from trainer.token_store import (
    BYTES_TOKENIZER,
    BYTES_VOCAB,
    DEFAULT_SHARD_TOKENS,
    FORMAT,
    TOKENIZER_FILES,
    VERSION,
    canonical_sha256,
    dtype_for_vocab,
    is_remote,
    remote_fs,
)

TEXT_SUFFIXES = (".txt", ".text", ".md")
JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
SHARD_SUFFIXES = (*TEXT_SUFFIXES, *JSONL_SUFFIXES, ".parquet")
GLOB_CHARS = "*?["
DATASETS_MARKERS = ("dataset_info.json", "dataset_dict.json", "state.json")
EOS_NAMES = ("<|end_of_text|>", "<|endoftext|>", "</s>", "<eos>")
BAD_ROW_POLICIES = ("error", "skip")
FIRST_BAD_ROWS = 5  # bad rows logged one by one and kept in meta.json; the rest are counted
BLOCK_BYTES = 1 << 20  # a .txt is encoded in blocks of whole lines of about this size
LONG_LINE_BYTES = 4 * BLOCK_BYTES  # a line longer than this is cut at a space (see _block_end)
BATCH_CHARS = 8 << 20  # encode_batch once this much text is pending
LOG_EVERY_S = 10.0
# First bytes of files that are not text, whatever their name says: named in the refusal.
MAGIC = (
    (b"\x1f\x8b", "gzip-compressed"),
    (b"\x28\xb5\x2f\xfd", "zstd-compressed"),
    (b"BZh", "bzip2-compressed"),
    (b"\xfd7zXZ\x00", "xz-compressed"),
    (b"PK\x03\x04", "a zip archive"),
    (b"PAR1", "a parquet file"),
)


class PrepareError(ValueError):
    """A bad option or input; the message names the option and the value."""


# --------------------------------------------------------------------------- tokenizers


class ByteTokenizer:
    """Byte-level: a token id is the byte value."""

    identity = BYTES_TOKENIZER
    vocab_size = BYTES_VOCAB
    eos_id = None
    files: dict = {}

    def encode(self, texts: list[str | bytes], special: bool) -> list[np.ndarray]:
        return [np.frombuffer(t if isinstance(t, bytes) else t.encode(), dtype=np.uint8) for t in texts]


class HFTokenizer:
    """A Hugging Face ``tokenizers`` tokenizer, from tokenizer.json or a model directory."""

    def __init__(self, spec: str):
        from tokenizers import Tokenizer

        self.files = {}  # name in the store's tokenizer/ -> local source path
        if os.path.isdir(spec):
            for name in TOKENIZER_FILES:
                if os.path.exists(os.path.join(spec, name)):
                    self.files[name] = os.path.join(spec, name)
            name = os.path.basename(os.path.normpath(spec))
        elif os.path.isfile(spec):
            self.files["tokenizer.json"] = spec
            parent = os.path.dirname(os.path.abspath(spec))
            for extra in TOKENIZER_FILES[1:]:
                if os.path.exists(os.path.join(parent, extra)):
                    self.files[extra] = os.path.join(parent, extra)
            stem = os.path.splitext(os.path.basename(spec))[0]
            name = os.path.basename(parent) if stem == "tokenizer" else stem
        else:
            raise PrepareError(f"--tokenizer: {spec} is neither a tokenizer.json nor a directory")
        if "tokenizer.json" in self.files:
            raw = open(self.files["tokenizer.json"], "rb").read()
            try:
                self.tok = Tokenizer.from_str(raw.decode())
            except Exception as e:  # noqa: BLE001 - the library's own words, with the file named
                raise PrepareError(
                    f"--tokenizer: {self.files['tokenizer.json']} is not a tokenizers JSON file: {e}"
                ) from None
        else:  # a directory with only a slow tokenizer (sentencepiece, ...): let transformers convert it
            self.tok, raw = self._converted(spec)
        self.json_bytes = raw
        self.vocab_size = self.tok.get_vocab_size(with_added_tokens=True)
        self.identity = {
            "kind": "hf",
            "name": name,
            "sha256": canonical_sha256(raw),
            "vocab_size": self.vocab_size,
        }
        self.eos_id = self._eos_id()

    def _converted(self, spec: str):
        try:
            from transformers import AutoTokenizer
        except ImportError:
            raise PrepareError(
                f"--tokenizer: {spec} has no tokenizer.json (converting another tokenizer "
                "needs the transformers package)"
            ) from None
        try:
            fast = AutoTokenizer.from_pretrained(spec, use_fast=True)
        except Exception as e:  # noqa: BLE001
            raise PrepareError(
                f"--tokenizer: {spec} has no tokenizer.json and transformers cannot load it: {e}"
            ) from None
        backend = getattr(fast, "backend_tokenizer", None)
        if backend is None:
            raise PrepareError(f"--tokenizer: {spec} has no tokenizer.json and no fast tokenizer conversion")
        return backend, backend.to_str().encode()

    def _eos_id(self) -> int | None:
        if "tokenizer_config.json" in self.files:
            with open(self.files["tokenizer_config.json"]) as f:
                eos = json.load(f).get("eos_token")
            if isinstance(eos, dict):
                eos = eos.get("content")
            if isinstance(eos, str) and self.tok.token_to_id(eos) is not None:
                return self.tok.token_to_id(eos)
        for name in EOS_NAMES:
            if self.tok.token_to_id(name) is not None:
                return self.tok.token_to_id(name)
        return None

    def encode(self, texts: list[str], special: bool) -> list[np.ndarray]:
        dtype = np.uint32 if self.vocab_size > 1 << 16 else np.uint16
        return [
            np.asarray(e.ids, dtype=dtype) for e in self.tok.encode_batch(texts, add_special_tokens=special)
        ]


def load_tokenizer(spec: str | None):
    return ByteTokenizer() if spec is None else HFTokenizer(spec)


# --------------------------------------------------------------------------- inputs


@dataclass
class Piece:
    """Text of one document, or a block of one: `end` closes the document (its EOS follows)."""

    split: str
    text: str | bytes
    first: bool
    end: bool
    where: str  # for errors: "/data/a.txt", "/data/b.jsonl line 3"
    offset: int = 0  # of a .txt block: where in the file it starts


def _held_out(i: int, fraction: float) -> bool:
    """Every 1/fraction-th document (deterministic, spread evenly, no need to know the count)."""
    return int((i + 1) * fraction) > int(i * fraction)


def _complete_utf8(data: bytes) -> int:
    """Length of the longest prefix of `data` that does not end inside a UTF-8 character."""
    for back in range(1, min(4, len(data)) + 1):
        b = data[-back]
        if b & 0xC0 != 0x80:  # the last character's first byte
            need = 1 if b < 0x80 else 2 if b >> 5 == 0b110 else 3 if b >> 4 == 0b1110 else 4
            return len(data) if back >= need else len(data) - back
    return len(data)


def input_kind(path: str) -> str:
    if not is_remote(path) and os.path.isdir(path):
        if any(os.path.exists(os.path.join(path, n)) for n in DATASETS_MARKERS):
            return "datasets"
        raise PrepareError(
            f"--input: {path} is a directory but not one saved by datasets' save_to_disk "
            "(no dataset_dict.json, dataset_info.json or state.json)"
        )
    lower = path.lower()
    if lower.endswith(TEXT_SUFFIXES):
        return "txt"
    if lower.endswith(JSONL_SUFFIXES):
        return "jsonl"
    if lower.endswith(".parquet"):
        return "parquet"
    raise PrepareError(
        f"--input: {path}: unknown input kind (expected {', '.join(TEXT_SUFFIXES)}, "
        f"{', '.join(JSONL_SUFFIXES)} (JSON lines), .parquet, a datasets save_to_disk "
        "directory, a directory of such files or a glob)"
    )


def expand_input(spec: str) -> list[tuple[str, str]]:
    """The files an --input names, each with its kind ("txt", "jsonl", "parquet" or "datasets"): a file; a
    datasets save_to_disk directory; a directory of shards (its files, by name); a glob (its matches, by
    name).

    The shards of one input are all of one kind: a directory or a glob that mixes kinds, or holds a file
    that is none of them, is refused naming it rather than read in part.
    """
    local = None if is_remote(spec) else spec.removeprefix("file://")
    if any(c in spec for c in GLOB_CHARS):
        if local is not None:
            entries = [(p, os.path.isdir(p)) for p in glob.glob(local)]
        else:
            fs, pattern = remote_fs(spec)
            scheme = spec.split("://", 1)[0]
            entries = [
                (f"{scheme}://{p}", info.get("type") == "directory")
                for p, info in fs.glob(pattern, detail=True).items()
            ]
        if not entries:
            raise PrepareError(f"--input: {spec} matches no file")
        return _shards(spec, sorted(entries), glob_spec=True)
    if local is not None:
        if os.path.isdir(local):
            if any(os.path.exists(os.path.join(local, n)) for n in DATASETS_MARKERS):
                return [(spec, "datasets")]
            paths = [os.path.join(local, n) for n in os.listdir(local)]
            return _shards(spec, sorted((p, os.path.isdir(p)) for p in paths))
        kind = input_kind(spec)
        if not os.path.exists(local):
            raise PrepareError(f"--input: {spec} does not exist")
        return [(spec, kind)]
    if not spec.lower().endswith(SHARD_SUFFIXES):  # an object-storage "directory": the objects under it
        fs, path = remote_fs(spec)
        if fs.isdir(path):
            scheme = spec.split("://", 1)[0]
            entries = [
                (f"{scheme}://{info['name']}", info.get("type") == "directory")
                for info in fs.ls(path.rstrip("/"), detail=True)
            ]
            return _shards(spec, sorted(entries))
    return [(spec, input_kind(spec))]


def _shards(spec: str, entries: list[tuple[str, bool]], glob_spec: bool = False) -> list[tuple[str, str]]:
    """(path, kind) of each data file of a directory listing or a glob's matches, all of one kind."""
    named = [
        (p, is_dir) for p, is_dir in entries if not os.path.basename(p.rstrip("/")).startswith((".", "_"))
    ]  # _SUCCESS, .crc: not data
    holds = "matches" if glob_spec else "holds"
    if not named:
        raise PrepareError(f"--input: {spec} {holds} no data file (names starting with . or _ are not data)")
    suffix = os.path.splitext(named[0][0])[1] or ".jsonl"
    choose = "narrow the glob" if glob_spec else f"name them with a glob, e.g. {spec.rstrip('/')}/*{suffix}"
    shards = []
    for path, is_dir in named:
        if is_dir:
            raise PrepareError(
                f"--input: {spec} {holds} a directory, {path}: the shards of a dataset are "
                "files of one directory, or of one glob"
            )
        if not path.lower().endswith(SHARD_SUFFIXES):
            raise PrepareError(
                f"--input: {spec} {holds} {path}, which is not a data file "
                f"({', '.join(SHARD_SUFFIXES)}): a dataset is files of one format; {choose}"
            )
        shards.append((path, input_kind(path)))
    kinds: dict[str, str] = {}
    for path, kind in shards:
        kinds.setdefault(kind, path)  # each kind's first file
    if len(kinds) > 1:
        listed = " and ".join(f"{kind} ({path})" for kind, path in kinds.items())
        raise PrepareError(
            f"--input: {spec} mixes {listed} files: a dataset is files of one format; {choose}"
        )
    return shards


def _open(path: str):
    import fsspec

    try:
        return fsspec.open(path, "rb", skip_instance_cache=True).open()
    except (OSError, ValueError) as e:
        raise PrepareError(f"--input: cannot read {path}: {getattr(e, 'strerror', None) or e}") from None


class Rows:
    """What the document readers share: the held-out choice (every 1/F-th document, counted across all
    the inputs, so many small shards hold out as much as one big file) and the --on-bad-row policy."""

    def __init__(self, val_fraction: float, policy: str, log):
        self.val_fraction, self.policy, self.log = val_fraction, policy, log
        self.documents = 0  # documents read from lines and rows so far
        self.rows = 0  # lines and rows read, bad ones included (blank lines are not rows)
        self.skipped = 0
        self.first: list[dict] = []  # the first FIRST_BAD_ROWS bad rows: {"file", "line" | "row", "why"}

    def split(self) -> str:
        """The split of the next document."""
        self.documents += 1
        return "val" if _held_out(self.documents - 1, self.val_fraction) else "train"

    def bad(self, option: str, place: dict, why: str) -> None:
        """A row that is not a document: refused (the error names the place), or counted and skipped."""
        if self.policy == "error":
            raise PrepareError(
                f"{option}: {_where(place)}: {why} (--on-bad-row=skip counts and skips such rows)"
            )
        self.skipped += 1
        if len(self.first) < FIRST_BAD_ROWS:
            self.first.append({**place, "why": why})
            self.log(f"prepare_data: skipped {_where(place)}: {why}")

    def summary(self) -> dict:
        return {"policy": self.policy, "rows": self.rows, "skipped": self.skipped, "first": self.first}

    def note(self) -> str:
        """' (3 bad rows of 40 skipped)', or '' when none was."""
        if not self.skipped:
            return ""
        return f" ({self.skipped:,} bad row{'s' * (self.skipped != 1)} of {self.rows:,} skipped)"


def _where(place: dict) -> str:
    """'/data/a.jsonl line 3', '/data/b.parquet row 7', '/data/ds [train] row 2'."""
    split = f" [{place['split']}]" if "split" in place else ""
    unit = "line" if "line" in place else "row"
    return f"{place['file']}{split} {unit} {place[unit]}"


def _text(value, field: str) -> tuple[str | None, str, str]:
    """(the text, "", "") of a row's value, or (None, option, why) when it is no text. Checked here, where the
    row is known: a lone surrogate or an int reaching the tokenizer fails there without naming a row."""
    if isinstance(value, str):
        if not value.isascii():
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as e:
                return (
                    None,
                    "--input",
                    (
                        f"{field!r} holds a lone surrogate (\\u{ord(value[e.start]):04x}) "
                        f"at character {e.start}: not Unicode text"
                    ),
                )
        return value, "", ""
    if value is None:
        return None, "--input", f"{field!r} is null"
    if isinstance(value, (bytes, bytearray)):  # a binary column holding UTF-8 text, as some writers store it
        try:
            return bytes(value).decode("utf-8"), "", ""
        except UnicodeDecodeError as e:
            return (
                None,
                "--input",
                (f"{field!r} is bytes, not UTF-8 text (byte 0x{value[e.start]:02x} at offset {e.start})"),
            )
    name = type(value).__name__
    return None, "--text-field", f"{field!r} is {'an' if name[0] in 'aeiou' else 'a'} {name}, not a string"


def _block_end(buf: bytes, text: bool) -> int:
    """Where a block of a .txt ends: after its last newline; in a line longer than LONG_LINE_BYTES, before its
    last space or tab (a word-level tokenizer sees whole words; the next block starts with the space), else at
    the last whole UTF-8 character. 0: keep reading. A file without newlines is thus read in bounded blocks."""
    nl = buf.rfind(b"\n")
    if nl >= 0:
        return nl + 1
    if len(buf) < LONG_LINE_BYTES:
        return 0
    space = max(buf.rfind(b" "), buf.rfind(b"\t"))
    if space > 0:
        return space
    return _complete_utf8(buf) if text else len(buf)


def _txt(path: str, val_fraction: float, text: bool):
    import fsspec

    fs, p = fsspec.core.url_to_fs(path, skip_instance_cache=True)
    size = fs.size(p)
    if not size:
        return
    cut = size - max(1, int(size * val_fraction))
    with _open(path) as f:
        buf, pos, split, first = b"", 0, "train", True
        while True:
            chunk = f.read(min(BLOCK_BYTES, cut - pos) if split == "train" else BLOCK_BYTES)
            pos += len(chunk)
            buf += chunk
            if split == "train" and pos >= cut:  # the train document ends here; the rest is held out
                keep = _complete_utf8(buf) if text else len(buf)
                if keep or not first:
                    yield Piece("train", buf[:keep], first, True, path, pos - len(buf))
                buf, split, first = buf[keep:], "val", True
                continue
            if not chunk:
                if buf or not first:
                    yield Piece(split, buf, first, True, path, pos - len(buf))
                return
            end = _block_end(buf, text) if len(buf) >= BLOCK_BYTES else 0
            if end:
                yield Piece(split, buf[:end], first, False, path, pos - len(buf))
                buf, first = buf[end:], False


def _not_text(path: str, lineno: int, line: bytes) -> None:
    """Refuse a file that is not text at all, whatever --on-bad-row says: skipping its "lines" one by one
    would bury the one fact that matters (a compressed file, a parquet file named .jsonl)."""
    what = next((kind for magic, kind in MAGIC if line.startswith(magic)), None) if lineno == 1 else None
    if what is None and b"\0" in line:
        what = "binary (a NUL byte; compressed, or UTF-16?)"
    if what is not None:
        raise PrepareError(f"--input: {path} line {lineno}: the file is {what}, not JSON lines text")


JSON_TYPES = {
    list: "array",
    str: "string",
    int: "number",
    float: "number",
    bool: "boolean",
    type(None): "null",
}


def _jsonl(path: str, field: str, rows: Rows):
    with _open(path) as f:
        for lineno, line in enumerate(f, 1):
            _not_text(path, lineno, line)
            if not line.strip():
                continue
            rows.rows += 1
            place = {"file": path, "line": lineno}
            try:
                obj = json.loads(line)
            except UnicodeDecodeError as e:
                rows.bad("--input", place, f"not UTF-8 (byte 0x{line[e.start]:02x} at column {e.start + 1})")
                continue
            except json.JSONDecodeError as e:
                hint = (
                    " (a JSON array? write one JSON object per line)"
                    if lineno == 1 and line.lstrip()[:1] == b"["
                    else ""
                )
                rows.bad("--input", place, f"not JSON: {e.msg.removesuffix(' at')} at column {e.colno}{hint}")
                continue
            if not isinstance(obj, dict):
                kind = JSON_TYPES.get(type(obj), "value")
                rows.bad("--input", place, f"a JSON {kind}, not an object with {field!r}")
                continue
            if field not in obj:
                rows.bad("--text-field", place, f"{field!r} is missing (it has: {', '.join(obj)})")
                continue
            text, option, why = _text(obj[field], field)
            if text is None:
                rows.bad(option, place, why)
                continue
            yield Piece(rows.split(), text, True, True, _where(place))


def _parquet(path: str, field: str, rows: Rows):
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise PrepareError(
            f"--input: {path}: reading parquet needs pyarrow (pip install 'airflow-dtrain[data]')"
        ) from None
    with _open(path) as f:
        try:
            pf = pq.ParquetFile(f)
        except (pa.ArrowException, OSError) as e:
            raise PrepareError(f"--input: {path} is not a parquet file pyarrow can read: {e}") from None
        if field not in pf.schema_arrow.names:
            raise PrepareError(
                f"--text-field: column {field!r} is not in {path} (its columns: "
                f"{', '.join(pf.schema_arrow.names)})"
            )
        row = 0
        batches = pf.iter_batches(batch_size=1024, columns=[field])
        while True:
            try:
                batch = next(batches, None)
            except (pa.ArrowException, OSError) as e:
                raise PrepareError(f"--input: {path}: cannot read the rows from row {row} on: {e}") from None
            if batch is None:
                return
            for value in batch.column(0).to_pylist():
                rows.rows += 1
                place = {"file": path, "row": row}
                row += 1
                text, option, why = _text(value, field)
                if text is None:
                    rows.bad(option, place, why)
                    continue
                yield Piece(rows.split(), text, True, True, _where(place))


def _datasets(path: str, field: str, rows: Rows):
    try:
        import datasets
    except ImportError:
        raise PrepareError(
            f"--input: {path}: reading a datasets directory needs the datasets package "
            "(pip install 'airflow-dtrain[data]')"
        ) from None
    try:
        ds = datasets.load_from_disk(path)
    except Exception as e:  # noqa: BLE001 - the library's own words, with the directory named
        raise PrepareError(f"--input: {path}: datasets cannot load it: {e}") from None
    if isinstance(ds, datasets.DatasetDict):
        if "train" not in ds:
            raise PrepareError(
                f"--input: {path} is a DatasetDict without a 'train' split (it has: {', '.join(ds)})"
            )
        held = next((s for s in ("validation", "test") if s in ds), None)
        parts = [("train", "train", ds["train"])] + ([("val", held, ds[held])] if held else [])
        if held is None:
            parts = [(None, "train", ds["train"])]
    else:
        parts = [(None, None, ds)]
    for split, name, part in parts:
        if field not in part.column_names:
            raise PrepareError(
                f"--text-field: column {field!r} is not in {path} (its columns: "
                f"{', '.join(part.column_names)})"
            )
        row = 0
        for batch in part.select_columns([field]).iter(batch_size=1024):
            for value in batch[field]:
                rows.rows += 1
                place = {"file": path, **({"split": name} if name else {}), "row": row}
                row += 1
                text, option, why = _text(value, field)
                if text is None:
                    rows.bad(option, place, why)
                    continue
                yield Piece(split or rows.split(), text, True, True, _where(place))


def read_inputs(files: list[tuple[str, str]], text_field: str, val_fraction: float, text: bool, rows: Rows):
    """Every document of `files` ((path, kind), as expand_input gives them), in order."""
    for path, kind in files:
        if kind == "txt":
            yield from _txt(path, val_fraction, text)
        elif kind == "jsonl":
            yield from _jsonl(path, text_field, rows)
        elif kind == "parquet":
            yield from _parquet(path, text_field, rows)
        else:
            yield from _datasets(path, text_field, rows)


# --------------------------------------------------------------------------- writing


class Sink:
    """Where the store's files go: a local temp directory renamed into place at the end, or an
    object-storage prefix (each shard uploaded once full, meta.json last)."""

    def __init__(self, out: str):
        self.out = out
        self.remote = is_remote(out)
        if self.remote:
            self.fs, self.root = remote_fs(out)
            self.root = self.root.rstrip("/")
            if self.fs.exists(self.root) and self.fs.find(self.root, maxdepth=1):
                raise PrepareError(f"--out: {out} already exists; remove it or choose another prefix")
            self.dir = tempfile.mkdtemp(prefix="dtrain-prepare-")
        else:
            if os.path.exists(out):
                raise PrepareError(f"--out: {out} already exists; remove it or choose another directory")
            parent = os.path.dirname(os.path.abspath(out))
            os.makedirs(parent, exist_ok=True)
            self.dir = os.path.join(
                parent, f".{os.path.basename(os.path.abspath(out))}.tmp-{uuid.uuid4().hex}"
            )
            os.makedirs(self.dir)
        self.written: list[str] = []

    def path(self, name: str) -> str:
        os.makedirs(os.path.dirname(os.path.join(self.dir, name)), exist_ok=True)
        return os.path.join(self.dir, name)

    def done(self, name: str) -> None:
        """`name` is complete locally: upload it (remote) and free the local copy."""
        if self.remote:
            self.fs.put_file(os.path.join(self.dir, name), f"{self.root}/{name}")
            os.remove(os.path.join(self.dir, name))
        self.written.append(name)

    def commit(self, meta: dict) -> None:
        with open(self.path("meta.json"), "w") as f:
            json.dump(meta, f, indent=2)
        self.done("meta.json")  # last: a store without it is incomplete
        if self.remote:
            shutil.rmtree(self.dir, ignore_errors=True)
        else:
            if os.path.exists(self.out):
                raise PrepareError(
                    f"--out: {self.out} appeared while preparing; the new store is left in {self.dir}"
                )
            os.rename(self.dir, self.out)

    def abort(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)
        if self.remote:
            for name in self.written:
                try:
                    self.fs.rm_file(f"{self.root}/{name}")
                except OSError:
                    pass


class ShardWriter:
    """One split's shards, `shard_tokens` ids each (the last one shorter)."""

    def __init__(self, sink: Sink, split: str, dtype: str, shard_tokens: int):
        self.sink, self.split, self.dtype, self.shard_tokens = (
            sink,
            split,
            np.dtype(dtype).newbyteorder("<"),
            shard_tokens,
        )
        self.shards: list[dict] = []
        self.f, self.in_shard, self.tokens, self.documents = None, 0, 0, 0

    def add(self, ids: np.ndarray) -> None:
        ids = ids.astype(self.dtype, copy=False)
        while len(ids):
            if self.f is None:
                name = f"{self.split}-{len(self.shards):05d}.bin"
                self.shards.append({"file": name, "tokens": 0})
                self.f = open(self.sink.path(name), "wb")
            take = ids[: self.shard_tokens - self.in_shard]
            take.tofile(self.f)
            self.in_shard += len(take)
            self.tokens += len(take)
            self.shards[-1]["tokens"] = self.in_shard
            ids = ids[len(take) :]
            if self.in_shard == self.shard_tokens:
                self.close()

    def close(self) -> None:
        if self.f is not None:
            self.f.close()
            self.f, self.in_shard = None, 0
            self.sink.done(self.shards[-1]["file"])

    def summary(self) -> dict:
        return {"tokens": self.tokens, "documents": self.documents, "shards": self.shards}


class HeldBack:
    """The newest training documents, kept from the train shards until the end: if the held-out split is
    then short of one evaluation (a corpus of fewer than 1/val_fraction documents, say), the newest of them
    are held out instead. Keeps whole documents of one piece, about `tokens` tokens besides the newest; a
    document of several blocks (a long .txt) goes straight to the shards, so memory stays bounded."""

    def __init__(self, train: ShardWriter, separator: np.ndarray, tokens: int):
        self.train, self.separator, self.tokens = train, separator, tokens
        self.docs: deque[np.ndarray] = deque()
        self.held = 0  # tokens in self.docs, separators included

    def add(self, ids: np.ndarray, piece: Piece) -> None:
        if piece.first and piece.end:
            self.docs.append(ids)
            self.held += len(ids) + len(self.separator)
            while len(self.docs) > 1 and self.held - self._size(self.docs[0]) >= self.tokens:
                self._write(self.docs.popleft())
            return
        if piece.first:
            self.release()  # the documents before this one go first, in order
        self.train.add(ids)
        if piece.end:
            self.train.add(self.separator)
            self.train.documents += 1

    def _size(self, ids: np.ndarray) -> int:
        return len(ids) + len(self.separator)

    def _write(self, ids: np.ndarray, writer: ShardWriter | None = None) -> None:
        writer = writer or self.train
        writer.add(ids)
        writer.add(self.separator)
        writer.documents += 1
        if writer is self.train:
            self.held -= self._size(ids)

    def release(self) -> None:
        while self.docs:
            self._write(self.docs.popleft())

    def hold_out(self, val: ShardWriter, val_tokens: int, train_tokens: int) -> tuple[int, int] | None:
        """Move the newest documents to `val` until it holds a document and `val_tokens` tokens, keeping
        `train_tokens` and a document for training; then write the rest. Returns (documents, tokens)
        moved, or None when the data is too small for both (nothing is moved then)."""
        moved, tokens = 0, 0
        while (val.documents + moved < 1 or val.tokens + tokens < val_tokens) and moved < len(self.docs):
            moved, tokens = moved + 1, tokens + self._size(self.docs[-1 - moved])
        if val.documents + moved < 1 or val.tokens + tokens < val_tokens:
            return None
        train_docs = self.train.documents + len(self.docs) - moved
        if train_docs < 1 or self.train.tokens + self.held - tokens < train_tokens:
            return None
        last = [self.docs.pop() for _ in range(moved)][::-1]
        self.held -= tokens
        self.release()
        for ids in last:
            self._write(ids, val)
        return moved, tokens


def _source(inputs: list[str]) -> str:
    """The inputs' names: a file's or a directory's own, a glob with its directory ("shards/*.jsonl")."""
    names = []
    for p in inputs:
        parts = p.rstrip("/").split("/")
        first_glob = next((i for i, part in enumerate(parts) if any(c in part for c in GLOB_CHARS)), None)
        names.append("/".join(parts[max(first_glob - 1, 0) :]) if first_glob is not None else parts[-1])
    return ", ".join(names) if len(names) <= 20 else ", ".join(names[:20]) + f", ... ({len(names)} inputs)"


def _documents(n: int) -> str:
    return f"{n:,} document{'s' * (n != 1)}"


def _too_small(source: str, docs: int, tokens: int, seq_len: int | None, rows: Rows) -> PrepareError:
    counts = f"{source} gives {_documents(docs)}, {tokens:,} tokens{rows.note()}"
    if seq_len:
        return PrepareError(
            f"--input: too little text to train and evaluate at --seq-len {seq_len}: {counts}; training and "
            f"the held-out evaluation need a sequence of {seq_len + 1:,} tokens each (seq_len + 1), from "
            "whole documents of their own: give more text, or a shorter --seq-len"
        )
    return PrepareError(
        f"--input: too little text to hold out a document for evaluation: {counts}; the "
        "held-out split needs a document and training another: give more text"
    )


def prepare(
    inputs: list[str],
    out: str,
    tokenizer: str | None = None,
    text_field: str = "text",
    val_fraction: float = 0.05,
    shard_tokens: int = DEFAULT_SHARD_TOKENS,
    log=print,
    on_bad_row: str = "error",
    seq_len: int | None = None,
) -> dict:
    """Tokenise `inputs` into a token store at `out` (a directory or s3:// prefix); returns its meta.

    :param inputs: files (.txt, .jsonl/.json, .parquet; local or fsspec URLs), datasets directories,
        directories of such files, or globs
    :param out: where the store goes; must not exist
    :param tokenizer: a tokenizer.json or a model directory; None for byte-level
    :param text_field: the JSON field / column holding the text
    :param val_fraction: share of each input held out (see the module docstring)
    :param shard_tokens: tokens per shard file
    :param log: called with each progress line
    :param on_bad_row: "error" (refuse a row that is no text, naming it) or "skip" (count it, log the
        first few)
    :param seq_len: the training sequence length, when known: both splits then hold at least seq_len + 1
        tokens
    """
    if not inputs:
        raise PrepareError("--input: no input given")
    if not 0 < val_fraction < 1:
        raise PrepareError(f"--val-fraction: must be in (0, 1), got {val_fraction}")
    if shard_tokens < 1:
        raise PrepareError(f"--shard-tokens: must be at least 1, got {shard_tokens}")
    if on_bad_row not in BAD_ROW_POLICIES:
        raise PrepareError(f"--on-bad-row: must be {' or '.join(BAD_ROW_POLICIES)}, got {on_bad_row!r}")
    if seq_len is not None and seq_len < 1:
        raise PrepareError(f"--seq-len: must be at least 1, got {seq_len}")
    files = [f for spec in inputs for f in expand_input(spec)]  # every input checked before any work
    tok = load_tokenizer(tokenizer)
    dtype = dtype_for_vocab(tok.vocab_size)
    if tok.eos_id is not None:
        separator = np.array([tok.eos_id], dtype=np.int64)
    else:
        separator = tok.encode(["\n\n"], False)[0].astype(np.int64)
    # What the trainer reads of each split (trainer.data): a sequence of seq_len + 1 tokens; else a document.
    need = seq_len + 1 if seq_len else 1
    rows = Rows(val_fraction, on_bad_row, log)
    sink = Sink(out)
    try:
        writers = {s: ShardWriter(sink, s, dtype, shard_tokens) for s in ("train", "val")}
        held = HeldBack(writers["train"], separator, need)
        started = last_log = time.monotonic()

        def progress(final: bool = False) -> None:
            elapsed = max(time.monotonic() - started, 1e-9)
            tokens = sum(w.tokens for w in writers.values())
            docs = sum(w.documents for w in writers.values())
            log(
                f"prepare_data: {'done: ' if final else ''}{docs:,} documents, {tokens:,} tokens "
                f"(train {writers['train'].tokens:,}, held-out {writers['val'].tokens:,} in "
                f"{writers['val'].documents:,} documents){rows.note()}, {tokens / elapsed:,.0f} tokens/s"
            )

        pending: list[Piece] = []

        def flush() -> None:
            encoded: dict[int, np.ndarray] = {}
            for special in (True, False):
                idx = [i for i, p in enumerate(pending) if p.first == special]
                texts = [pending[i].text for i in idx]
                if isinstance(tok, HFTokenizer):
                    texts = [_decode(pending[i]) for i in idx]
                if texts:
                    encoded.update(zip(idx, tok.encode(texts, special)))
            for i, piece in enumerate(pending):
                if piece.split == "train":
                    held.add(encoded[i], piece)
                    continue
                w = writers["val"]
                w.add(encoded[i])
                if piece.end:
                    w.add(separator)
                    w.documents += 1
            pending.clear()

        chars = 0
        for piece in read_inputs(files, text_field, val_fraction, isinstance(tok, HFTokenizer), rows):
            pending.append(piece)
            chars += len(piece.text)
            if chars >= BATCH_CHARS or len(pending) >= 4096:
                flush()
                chars = 0
                if time.monotonic() - last_log >= LOG_EVERY_S:
                    progress()
                    last_log = time.monotonic()
        flush()
        val = writers["val"]
        short = (val.documents, val.tokens)
        docs = writers["train"].documents + len(held.docs) + val.documents
        if not docs:
            raise PrepareError(f"--input: no text found in {_source(inputs)}{rows.note()}")
        moved = held.hold_out(val, need, need)
        if moved is None:
            tokens = writers["train"].tokens + held.held + val.tokens
            raise _too_small(_source(inputs), docs, tokens, seq_len, rows)
        if moved[0]:
            wanted = f"one evaluation sequence ({need:,} tokens)" if seq_len else "one document"
            log(
                f"prepare_data: --val-fraction {val_fraction:g} held out {_documents(short[0])}, "
                f"{short[1]:,} tokens, short of {wanted}: the last {_documents(moved[0])} of training "
                f"({moved[1]:,} tokens) {'is' if moved[0] == 1 else 'are'} held out too"
            )
        for w in writers.values():
            w.close()
        if rows.skipped:
            first = "; ".join(f"{_where(p)}: {p['why']}" for p in rows.first)
            log(
                f"prepare_data: skipped {rows.skipped:,} bad row{'s' * (rows.skipped != 1)} of {rows.rows:,} "
                f"(--on-bad-row=skip); the first: {first}"
            )
        for name, src in tok.files.items():
            shutil.copyfile(src, sink.path(f"tokenizer/{name}"))
            sink.done(f"tokenizer/{name}")
        if isinstance(tok, HFTokenizer) and "tokenizer.json" not in tok.files:  # converted by transformers
            with open(sink.path("tokenizer/tokenizer.json"), "wb") as f:
                f.write(tok.json_bytes)
            sink.done("tokenizer/tokenizer.json")
        meta = {
            "format": FORMAT,
            "version": VERSION,
            "tokenizer": tok.identity,
            "vocab_size": tok.vocab_size,
            "dtype": dtype,
            "eos_id": tok.eos_id,
            "shard_tokens": shard_tokens,
            "splits": {s: w.summary() for s, w in writers.items()},
            "source": _source(inputs),
            "text_field": text_field,
            "bad_rows": rows.summary(),
        }
        sink.commit(meta)
    except BaseException:
        sink.abort()
        raise
    progress(final=True)
    log(
        f"prepare_data: wrote {out}: {len(meta['splits']['train']['shards'])} train and "
        f"{len(meta['splits']['val']['shards'])} held-out shards, {dtype}, tokenizer {tok.identity.get('name', 'bytes')}"
    )
    return meta


def _decode(piece: Piece) -> str:
    """A .txt block as text, for a tokenizer; a file that is not UTF-8 is refused where it stops being so."""
    if isinstance(piece.text, str):
        return piece.text
    try:
        return piece.text.decode("utf-8")
    except UnicodeDecodeError as e:
        raise PrepareError(
            f"--input: {piece.where} byte {piece.offset + e.start}: not UTF-8 text (0x"
            f"{piece.text[e.start]:02x}): tokenizers read text; prepare it byte-level (no "
            "--tokenizer) or re-encode it"
        ) from None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m trainer.prepare_data", description=__doc__.split("\n\n")[1])
    p.add_argument(
        "--input",
        nargs="+",
        required=True,
        metavar="PATH",
        help=".txt, .jsonl/.json, .parquet files, datasets save_to_disk directories, directories "
        "of such files, or globs (quoted: '/data/shards/*.jsonl')",
    )
    p.add_argument("--out", required=True, metavar="DIR|s3://...")
    p.add_argument(
        "--tokenizer", metavar="FILE|DIR", help="tokenizer.json or a model directory (default: byte-level)"
    )
    p.add_argument(
        "--text-field", default="text", help="the JSON field / column with the text (default: text)"
    )
    p.add_argument("--val-fraction", type=float, default=0.05)
    p.add_argument(
        "--seq-len",
        type=int,
        metavar="N",
        help="the training sequence length: both splits then hold at least N + 1 tokens",
    )
    p.add_argument(
        "--on-bad-row",
        choices=BAD_ROW_POLICIES,
        default="error",
        help="a row without text (null, not a string, not UTF-8, not JSON): error (default) "
        "refuses it naming the file and line; skip counts it and logs the first few",
    )
    p.add_argument("--shard-tokens", type=int, default=DEFAULT_SHARD_TOKENS, metavar="N")
    args = p.parse_args(argv)
    try:
        prepare(
            args.input,
            args.out,
            tokenizer=args.tokenizer,
            text_field=args.text_field,
            val_fraction=args.val_fraction,
            shard_tokens=args.shard_tokens,
            log=lambda m: print(m, flush=True),
            on_bad_row=args.on_bad_row,
            seq_len=args.seq_len,
        )
    except PrepareError as e:
        print(e, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

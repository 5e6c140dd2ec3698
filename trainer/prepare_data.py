"""``python -m trainer.prepare_data --input PATH... --out DIR|s3://... [--tokenizer FILE|DIR] [--text-field text]
[--val-fraction F] [--shard-tokens N]``

Tokenises documents into the trainer's token store (format: trainer/token_store.py), streaming:
documents are read and tokenised in batches and shards are written as they fill, so memory
does not grow with the corpus. The same is ``prepare(inputs, out, ...)`` for a DAG task.

Inputs, by their form:

* ``.txt`` (also .text, .md): one document per file, read in blocks of whole lines (a line longer
  than 4 MiB is cut before a space, so a file without newlines is still read in bounded blocks); the
  last --val-fraction of its bytes is a held-out document, so every file is in both splits.
* ``.jsonl`` / ``.json`` (JSON lines) and ``.parquet``: one document per line / row, from the
  --text-field field / column (parquet read in record batches); every 1/F-th document is held out.
* a directory saved by Hugging Face ``datasets`` (``save_to_disk``): a Dataset is split as above;
  a DatasetDict trains on "train" and holds out "validation" (or else "test") when it has one.

Tokenizer: without --tokenizer, byte-level (vocab 256). With it, a Hugging Face ``tokenizers``
tokenizer.json, or a model directory holding one (or a tokenizer ``transformers`` can convert).
Each document ends with the tokenizer's EOS id (tokenizer_config.json's eos_token, else a special
token named <|end_of_text|>, <|endoftext|>, </s> or <eos>); a tokenizer without one ends each
document with the encoding of a blank line ("\\n\\n"), as byte-level stores always have.
A document's first block is encoded with the tokenizer's special tokens (a BOS its
post-processor adds, say); the continuation blocks of a long .txt are not.
"""

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass

import numpy as np

from trainer.token_store import (BYTES_TOKENIZER, BYTES_VOCAB, DEFAULT_SHARD_TOKENS, FORMAT, TOKENIZER_FILES, VERSION,
                                 canonical_sha256, dtype_for_vocab, is_remote, remote_fs)

TEXT_SUFFIXES = (".txt", ".text", ".md")
JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
EOS_NAMES = ("<|end_of_text|>", "<|endoftext|>", "</s>", "<eos>")
BLOCK_BYTES = 1 << 20  # a .txt is encoded in blocks of whole lines of about this size
LONG_LINE_BYTES = 4 * BLOCK_BYTES  # a line longer than this is cut at a space (see _block_end)
BATCH_CHARS = 8 << 20  # encode_batch once this much text is pending
LOG_EVERY_S = 10.0


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
                raise PrepareError(f"--tokenizer: {self.files['tokenizer.json']} is not a tokenizers JSON file: {e}") from None
        else:  # a directory with only a slow tokenizer (sentencepiece, ...): let transformers convert it
            self.tok, raw = self._converted(spec)
        self.json_bytes = raw
        self.vocab_size = self.tok.get_vocab_size(with_added_tokens=True)
        self.identity = {"kind": "hf", "name": name, "sha256": canonical_sha256(raw), "vocab_size": self.vocab_size}
        self.eos_id = self._eos_id()

    def _converted(self, spec: str):
        try:
            from transformers import AutoTokenizer
        except ImportError:
            raise PrepareError(f"--tokenizer: {spec} has no tokenizer.json (converting another tokenizer "
                               "needs the transformers package)") from None
        try:
            fast = AutoTokenizer.from_pretrained(spec, use_fast=True)
        except Exception as e:  # noqa: BLE001
            raise PrepareError(f"--tokenizer: {spec} has no tokenizer.json and transformers cannot load it: {e}") from None
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
        return [np.asarray(e.ids, dtype=dtype) for e in self.tok.encode_batch(texts, add_special_tokens=special)]


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
    where: str  # for errors: "a.txt", "b.jsonl line 3"


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
        if any(os.path.exists(os.path.join(path, n)) for n in ("dataset_info.json", "dataset_dict.json", "state.json")):
            return "datasets"
        raise PrepareError(f"--input: {path} is a directory but not one saved by datasets' save_to_disk "
                           "(no dataset_dict.json, dataset_info.json or state.json)")
    lower = path.lower()
    if lower.endswith(TEXT_SUFFIXES):
        return "txt"
    if lower.endswith(JSONL_SUFFIXES):
        return "jsonl"
    if lower.endswith(".parquet"):
        return "parquet"
    raise PrepareError(f"--input: {path}: unknown input kind (expected {', '.join(TEXT_SUFFIXES)}, "
                       f"{', '.join(JSONL_SUFFIXES)} (JSON lines), .parquet, or a datasets save_to_disk directory)")


def _open(path: str):
    import fsspec

    try:
        return fsspec.open(path, "rb", skip_instance_cache=True).open()
    except (OSError, ValueError) as e:
        raise PrepareError(f"--input: cannot read {path}: {getattr(e, 'strerror', None) or e}") from None


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
    name = os.path.basename(path)
    with _open(path) as f:
        buf, pos, split, first = b"", 0, "train", True
        while True:
            chunk = f.read(min(BLOCK_BYTES, cut - pos) if split == "train" else BLOCK_BYTES)
            pos += len(chunk)
            buf += chunk
            if split == "train" and pos >= cut:  # the train document ends here; the rest is held out
                keep = _complete_utf8(buf) if text else len(buf)
                if keep or not first:
                    yield Piece("train", buf[:keep], first, True, name)
                buf, split, first = buf[keep:], "val", True
                continue
            if not chunk:
                if buf or not first:
                    yield Piece(split, buf, first, True, name)
                return
            end = _block_end(buf, text) if len(buf) >= BLOCK_BYTES else 0
            if end:
                yield Piece(split, buf[:end], first, False, name)
                buf, first = buf[end:], False


def _jsonl(path: str, field: str, val_fraction: float):
    name = os.path.basename(path)
    with _open(path) as f:
        i = 0
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                hint = " (a JSON array? write one JSON object per line)" if lineno == 1 and line.lstrip()[:1] == b"[" else ""
                raise PrepareError(f"--input: {name} line {lineno} is not JSON: {e.msg}{hint}") from None
            if not isinstance(obj, dict) or field not in obj:
                keys = ", ".join(obj) if isinstance(obj, dict) else type(obj).__name__
                raise PrepareError(f"--text-field: {field!r} is missing in {path} line {lineno} (it has: {keys})")
            if not isinstance(obj[field], str):
                raise PrepareError(f"--text-field: {field!r} in {path} line {lineno} is a "
                                   f"{type(obj[field]).__name__}, not a string")
            yield Piece("val" if _held_out(i, val_fraction) else "train", obj[field], True, True, f"{name} line {lineno}")
            i += 1


def _parquet(path: str, field: str, val_fraction: float):
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise PrepareError(f"--input: {path}: reading parquet needs pyarrow (pip install 'airflow-dtrain[data]')") from None
    name = os.path.basename(path)
    with _open(path) as f:
        pf = pq.ParquetFile(f)
        if field not in pf.schema_arrow.names:
            raise PrepareError(f"--text-field: column {field!r} is not in {path} (its columns: "
                               f"{', '.join(pf.schema_arrow.names)})")
        i = 0
        for batch in pf.iter_batches(batch_size=1024, columns=[field]):
            for text in batch.column(0).to_pylist():
                if text is None:
                    continue
                yield Piece("val" if _held_out(i, val_fraction) else "train", text, True, True, f"{name} row {i}")
                i += 1


def _datasets(path: str, field: str, val_fraction: float):
    try:
        import datasets
    except ImportError:
        raise PrepareError(f"--input: {path}: reading a datasets directory needs the datasets package "
                           "(pip install 'airflow-dtrain[data]')") from None
    ds = datasets.load_from_disk(path)
    name = os.path.basename(os.path.normpath(path))
    if isinstance(ds, datasets.DatasetDict):
        if "train" not in ds:
            raise PrepareError(f"--input: {path} is a DatasetDict without a 'train' split (it has: {', '.join(ds)})")
        held = next((s for s in ("validation", "test") if s in ds), None)
        parts = [("train", ds["train"], None)] + ([("val", ds[held], None)] if held else [])
        if held is None:
            parts = [(None, ds["train"], val_fraction)]
    else:
        parts = [(None, ds, val_fraction)]
    for split, part, fraction in parts:
        if field not in part.column_names:
            raise PrepareError(f"--text-field: column {field!r} is not in {path} (its columns: "
                               f"{', '.join(part.column_names)})")
        i = 0
        for batch in part.select_columns([field]).iter(batch_size=1024):
            for text in batch[field]:
                if text is None:
                    continue
                s = split or ("val" if _held_out(i, fraction) else "train")
                yield Piece(s, text, True, True, f"{name} row {i}")
                i += 1


def read_inputs(inputs: list[str], text_field: str, val_fraction: float, text: bool):
    kinds = [(p, input_kind(p)) for p in inputs]  # every input's kind checked before any work
    for path, kind in kinds:
        if kind == "txt":
            yield from _txt(path, val_fraction, text)
        elif kind == "jsonl":
            yield from _jsonl(path, text_field, val_fraction)
        elif kind == "parquet":
            yield from _parquet(path, text_field, val_fraction)
        else:
            yield from _datasets(path, text_field, val_fraction)


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
            self.dir = os.path.join(parent, f".{os.path.basename(os.path.abspath(out))}.tmp-{uuid.uuid4().hex}")
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
                raise PrepareError(f"--out: {self.out} appeared while preparing; the new store is left in {self.dir}")
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
        self.sink, self.split, self.dtype, self.shard_tokens = sink, split, np.dtype(dtype).newbyteorder("<"), shard_tokens
        self.shards: list[dict] = []
        self.f, self.in_shard, self.tokens, self.documents = None, 0, 0, 0

    def add(self, ids: np.ndarray) -> None:
        ids = ids.astype(self.dtype, copy=False)
        while len(ids):
            if self.f is None:
                name = f"{self.split}-{len(self.shards):05d}.bin"
                self.shards.append({"file": name, "tokens": 0})
                self.f = open(self.sink.path(name), "wb")
            take = ids[:self.shard_tokens - self.in_shard]
            take.tofile(self.f)
            self.in_shard += len(take)
            self.tokens += len(take)
            self.shards[-1]["tokens"] = self.in_shard
            ids = ids[len(take):]
            if self.in_shard == self.shard_tokens:
                self.close()

    def close(self) -> None:
        if self.f is not None:
            self.f.close()
            self.f, self.in_shard = None, 0
            self.sink.done(self.shards[-1]["file"])

    def summary(self) -> dict:
        return {"tokens": self.tokens, "documents": self.documents, "shards": self.shards}


def _source(inputs: list[str]) -> str:
    names = [os.path.basename(os.path.normpath(p)) for p in inputs]
    return ", ".join(names) if len(names) <= 20 else ", ".join(names[:20]) + f", ... ({len(names)} inputs)"


def prepare(inputs: list[str], out: str, tokenizer: str | None = None, text_field: str = "text",
            val_fraction: float = 0.05, shard_tokens: int = DEFAULT_SHARD_TOKENS, log=print) -> dict:
    """Tokenise `inputs` into a token store at `out` (a directory or s3:// prefix); returns its meta.

    :param inputs: files (.txt, .jsonl/.json, .parquet; local or fsspec URLs) and datasets directories
    :param out: where the store goes; must not exist
    :param tokenizer: a tokenizer.json or a model directory; None for byte-level
    :param text_field: the JSON field / column holding the text
    :param val_fraction: share of each input held out (see the module docstring)
    :param shard_tokens: tokens per shard file
    :param log: called with each progress line
    """
    if not inputs:
        raise PrepareError("--input: no input given")
    if not 0 < val_fraction < 1:
        raise PrepareError(f"--val-fraction: must be in (0, 1), got {val_fraction}")
    if shard_tokens < 1:
        raise PrepareError(f"--shard-tokens: must be at least 1, got {shard_tokens}")
    for path in inputs:
        input_kind(path)
        if not is_remote(path) and not os.path.exists(path):
            raise PrepareError(f"--input: {path} does not exist")
    tok = load_tokenizer(tokenizer)
    dtype = dtype_for_vocab(tok.vocab_size)
    if tok.eos_id is not None:
        separator = np.array([tok.eos_id], dtype=np.int64)
    else:
        separator = tok.encode(["\n\n"], False)[0].astype(np.int64)
    sink = Sink(out)
    try:
        writers = {s: ShardWriter(sink, s, dtype, shard_tokens) for s in ("train", "val")}
        started = last_log = time.monotonic()

        def progress(final: bool = False) -> None:
            elapsed = max(time.monotonic() - started, 1e-9)
            tokens = sum(w.tokens for w in writers.values())
            docs = sum(w.documents for w in writers.values())
            log(f"prepare_data: {'done: ' if final else ''}{docs:,} documents, {tokens:,} tokens "
                f"(train {writers['train'].tokens:,}, held-out {writers['val'].tokens:,}), "
                f"{tokens / elapsed:,.0f} tokens/s")

        pending: list[Piece] = []

        def flush() -> None:
            encoded: dict[int, np.ndarray] = {}
            for special in (True, False):
                idx = [i for i, p in enumerate(pending) if p.first == special]
                texts = [pending[i].text for i in idx]
                if isinstance(tok, HFTokenizer):
                    texts = [_decode(t, pending[i].where) for t, i in zip(texts, idx)]
                if texts:
                    encoded.update(zip(idx, tok.encode(texts, special)))
            for i, piece in enumerate(pending):
                w = writers[piece.split]
                w.add(encoded[i])
                if piece.end:
                    w.add(separator)
                    w.documents += 1
            pending.clear()

        chars = 0
        for piece in read_inputs(list(inputs), text_field, val_fraction, text=isinstance(tok, HFTokenizer)):
            pending.append(piece)
            chars += len(piece.text)
            if chars >= BATCH_CHARS or len(pending) >= 4096:
                flush()
                chars = 0
                if time.monotonic() - last_log >= LOG_EVERY_S:
                    progress()
                    last_log = time.monotonic()
        flush()
        for w in writers.values():
            w.close()
        if not writers["train"].tokens:
            raise PrepareError(f"--input: no text found in {_source(inputs)}")
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
        }
        sink.commit(meta)
    except BaseException:
        sink.abort()
        raise
    progress(final=True)
    log(f"prepare_data: wrote {out}: {len(meta['splits']['train']['shards'])} train and "
        f"{len(meta['splits']['val']['shards'])} held-out shards, {dtype}, tokenizer {tok.identity.get('name', 'bytes')}")
    return meta


def _decode(text: str | bytes, where: str) -> str:
    if isinstance(text, str):
        return text
    try:
        return text.decode("utf-8")
    except UnicodeDecodeError as e:
        raise PrepareError(f"--input: {where} is not UTF-8 text (byte {e.start} of a block): "
                           "tokenizers read text; prepare it byte-level (no --tokenizer) or re-encode it") from None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m trainer.prepare_data", description=__doc__.split("\n\n")[1])
    p.add_argument("--input", nargs="+", required=True, metavar="PATH",
                   help=".txt, .jsonl/.json, .parquet files or datasets save_to_disk directories")
    p.add_argument("--out", required=True, metavar="DIR|s3://...")
    p.add_argument("--tokenizer", metavar="FILE|DIR", help="tokenizer.json or a model directory (default: byte-level)")
    p.add_argument("--text-field", default="text", help="the JSON field / column with the text (default: text)")
    p.add_argument("--val-fraction", type=float, default=0.05)
    p.add_argument("--shard-tokens", type=int, default=DEFAULT_SHARD_TOKENS, metavar="N")
    args = p.parse_args(argv)
    try:
        prepare(args.input, args.out, tokenizer=args.tokenizer, text_field=args.text_field,
                val_fraction=args.val_fraction, shard_tokens=args.shard_tokens,
                log=lambda m: print(m, flush=True))
    except PrepareError as e:
        print(e, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

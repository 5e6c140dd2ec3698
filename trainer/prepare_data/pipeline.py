"""``prepare(inputs, out, ...)``: the whole preparation, from options checked to the store's meta.json."""

import shutil

from trainer.prepare_data.errors import PrepareError
from trainer.prepare_data.inputs import GLOB_CHARS, expand_input
from trainer.prepare_data.packing import Packer
from trainer.prepare_data.readers import read_inputs
from trainer.prepare_data.rows import BAD_ROW_POLICIES, Rows, where
from trainer.prepare_data.shards import Sink
from trainer.prepare_data.tokenizer import HFTokenizer, load_tokenizer
from trainer.data.token_store import DEFAULT_SHARD_TOKENS, FORMAT, VERSION, dtype_for_vocab


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


def _check_options(
    inputs: list[str], val_fraction: float, shard_tokens: int, on_bad_row: str, seq_len: int | None
) -> None:
    """Refuse a bad option before any work, naming it and its value."""
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


def _hold_out(packer: Packer, source: str, need: int, seq_len: int | None, val_fraction: float) -> None:
    """Make sure the held-out split holds an evaluation, taking the newest training documents if short;
    data too small for that and a training sequence besides is refused with its counts."""
    val, rows = packer.writers["val"], packer.rows
    short = (val.documents, val.tokens)
    docs = packer.documents()
    if not docs:
        raise PrepareError(f"--input: no text found in {source}{rows.note()}")
    moved = packer.held.hold_out(val, need, need)
    if moved is None:
        raise _too_small(source, docs, packer.tokens(), seq_len, rows)
    if moved[0]:
        wanted = f"one evaluation sequence ({need:,} tokens)" if seq_len else "one document"
        packer.log(
            f"prepare_data: --val-fraction {val_fraction:g} held out {_documents(short[0])}, "
            f"{short[1]:,} tokens, short of {wanted}: the last {_documents(moved[0])} of training "
            f"({moved[1]:,} tokens) {'is' if moved[0] == 1 else 'are'} held out too"
        )


def _log_skipped(rows: Rows, log) -> None:
    if rows.skipped:
        first = "; ".join(f"{where(p)}: {p['why']}" for p in rows.first)
        log(
            f"prepare_data: skipped {rows.skipped:,} bad row{'s' * (rows.skipped != 1)} of {rows.rows:,} "
            f"(--on-bad-row=skip); the first: {first}"
        )


def _write_tokenizer(sink: Sink, tok) -> None:
    """The tokenizer's files into the store's tokenizer/, so the store names and carries its tokenizer."""
    for name, src in tok.files.items():
        shutil.copyfile(src, sink.path(f"tokenizer/{name}"))
        sink.done(f"tokenizer/{name}")
    if isinstance(tok, HFTokenizer) and "tokenizer.json" not in tok.files:  # converted by transformers
        with open(sink.path("tokenizer/tokenizer.json"), "wb") as f:
            f.write(tok.json_bytes)
        sink.done("tokenizer/tokenizer.json")


def _meta(
    tok, dtype: str, shard_tokens: int, packer: Packer, source: str, text_field: str, rows: Rows
) -> dict:
    """The store's meta.json (format: trainer/data/token_store.py)."""
    return {
        "format": FORMAT,
        "version": VERSION,
        "tokenizer": tok.identity,
        "vocab_size": tok.vocab_size,
        "dtype": dtype,
        "eos_id": tok.eos_id,
        "shard_tokens": shard_tokens,
        "splits": {s: w.summary() for s, w in packer.writers.items()},
        "source": source,
        "text_field": text_field,
        "bad_rows": rows.summary(),
    }


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
    :param val_fraction: share of each input held out (see the package docstring)
    :param shard_tokens: tokens per shard file
    :param log: called with each progress line
    :param on_bad_row: "error" (refuse a row that is no text, naming it) or "skip" (count it, log the
        first few)
    :param seq_len: the training sequence length, when known: both splits then hold at least seq_len + 1
        tokens
    """
    _check_options(inputs, val_fraction, shard_tokens, on_bad_row, seq_len)
    files = [f for spec in inputs for f in expand_input(spec)]  # every input checked before any work
    tok = load_tokenizer(tokenizer)
    dtype = dtype_for_vocab(tok.vocab_size)
    # What the trainer reads of each split (trainer.data.loader): a sequence of seq_len + 1 tokens; else a
    # document.
    need = seq_len + 1 if seq_len else 1
    rows = Rows(val_fraction, on_bad_row, log)
    sink = Sink(out)
    try:
        packer = Packer(sink, tok, dtype, shard_tokens, need, rows, log)
        packer.pack(read_inputs(files, text_field, val_fraction, isinstance(tok, HFTokenizer), rows))
        _hold_out(packer, _source(inputs), need, seq_len, val_fraction)
        packer.close()
        _log_skipped(rows, log)
        _write_tokenizer(sink, tok)
        meta = _meta(tok, dtype, shard_tokens, packer, _source(inputs), text_field, rows)
        sink.commit(meta)
    except BaseException:
        sink.abort()
        raise
    packer.progress(final=True)
    splits, name = meta["splits"], tok.identity.get("name", "bytes")
    log(
        f"prepare_data: wrote {out}: {len(splits['train']['shards'])} train and "
        f"{len(splits['val']['shards'])} held-out shards, {dtype}, tokenizer {name}"
    )
    return meta

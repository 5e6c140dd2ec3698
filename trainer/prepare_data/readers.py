"""The document readers, one per input form (.txt, JSON lines, parquet, datasets directory), streaming:
each yields the Pieces of its documents, a .txt in bounded blocks of whole lines."""

import json
from dataclasses import dataclass

from trainer.prepare_data.errors import PrepareError
from trainer.prepare_data.inputs import open_input
from trainer.prepare_data.rows import JSON_TYPES, Rows, check_text, not_text, where

BLOCK_BYTES = 1 << 20  # a .txt is encoded in blocks of whole lines of about this size
LONG_LINE_BYTES = 4 * BLOCK_BYTES  # a line longer than this is cut at a space (see _block_end)


@dataclass
class Piece:
    """Text of one document, or a block of one: `end` closes the document (its EOS follows)."""

    split: str
    text: str | bytes
    first: bool
    end: bool
    where: str  # for errors: "/data/a.txt", "/data/b.jsonl line 3"
    offset: int = 0  # of a .txt block: where in the file it starts


def _complete_utf8(data: bytes) -> int:
    """Length of the longest prefix of `data` that does not end inside a UTF-8 character."""
    for back in range(1, min(4, len(data)) + 1):
        b = data[-back]
        if b & 0xC0 != 0x80:  # the last character's first byte
            need = 1 if b < 0x80 else 2 if b >> 5 == 0b110 else 3 if b >> 4 == 0b1110 else 4
            return len(data) if back >= need else len(data) - back
    return len(data)


def _block_end(buf: bytes, text: bool) -> int:
    """Where a block of a .txt ends: after its last newline; in a line longer than LONG_LINE_BYTES, before
    its last space or tab (a word-level tokenizer sees whole words; the next block starts with the space),
    else at the last whole UTF-8 character. 0: keep reading. A file without newlines is thus read in
    bounded blocks."""
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
    with open_input(path) as f:
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


def _jsonl(path: str, field: str, rows: Rows):
    with open_input(path) as f:
        for lineno, line in enumerate(f, 1):
            not_text(path, lineno, line)
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
            text, option, why = check_text(obj[field], field)
            if text is None:
                rows.bad(option, place, why)
                continue
            yield Piece(rows.split(), text, True, True, where(place))


def _parquet(path: str, field: str, rows: Rows):
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise PrepareError(
            f"--input: {path}: reading parquet needs pyarrow (pip install 'airflow-dtrain[data]')"
        ) from None
    with open_input(path) as f:
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
                text, option, why = check_text(value, field)
                if text is None:
                    rows.bad(option, place, why)
                    continue
                yield Piece(rows.split(), text, True, True, where(place))


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
                text, option, why = check_text(value, field)
                if text is None:
                    rows.bad(option, place, why)
                    continue
                yield Piece(split or rows.split(), text, True, True, where(place))


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

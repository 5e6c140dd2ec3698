"""Row checking and the --on-bad-row policy, one for every input form: what a bad row is (a null, a
non-string, bytes that are not UTF-8, a lone surrogate, a line that is not JSON), how it is named (file
and line, or row), and whether it is refused or counted and skipped; and the held-out choice of each
document, counted across all the inputs."""

from trainer.prepare_data.errors import PrepareError

BAD_ROW_POLICIES = ("error", "skip")
FIRST_BAD_ROWS = 5  # bad rows logged one by one and kept in meta.json; the rest are counted
# First bytes of files that are not text, whatever their name says: named in the refusal.
MAGIC = (
    (b"\x1f\x8b", "gzip-compressed"),
    (b"\x28\xb5\x2f\xfd", "zstd-compressed"),
    (b"BZh", "bzip2-compressed"),
    (b"\xfd7zXZ\x00", "xz-compressed"),
    (b"PK\x03\x04", "a zip archive"),
    (b"PAR1", "a parquet file"),
)
JSON_TYPES = {
    list: "array",
    str: "string",
    int: "number",
    float: "number",
    bool: "boolean",
    type(None): "null",
}


def is_held_out(i: int, fraction: float) -> bool:
    """Every 1/fraction-th document (deterministic, spread evenly, no need to know the count)."""
    return int((i + 1) * fraction) > int(i * fraction)


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
        return "val" if is_held_out(self.documents - 1, self.val_fraction) else "train"

    def bad(self, option: str, place: dict, why: str) -> None:
        """A row that is not a document: refused (the error names the place), or counted and skipped."""
        if self.policy == "error":
            raise PrepareError(
                f"{option}: {where(place)}: {why} (--on-bad-row=skip counts and skips such rows)"
            )
        self.skipped += 1
        if len(self.first) < FIRST_BAD_ROWS:
            self.first.append({**place, "why": why})
            self.log(f"prepare_data: skipped {where(place)}: {why}")

    def summary(self) -> dict:
        return {"policy": self.policy, "rows": self.rows, "skipped": self.skipped, "first": self.first}

    def note(self) -> str:
        """' (3 bad rows of 40 skipped)', or '' when none was."""
        if not self.skipped:
            return ""
        return f" ({self.skipped:,} bad row{'s' * (self.skipped != 1)} of {self.rows:,} skipped)"


def where(place: dict) -> str:
    """'/data/a.jsonl line 3', '/data/b.parquet row 7', '/data/ds [train] row 2'."""
    split = f" [{place['split']}]" if "split" in place else ""
    unit = "line" if "line" in place else "row"
    return f"{place['file']}{split} {unit} {place[unit]}"


def check_text(value, field: str) -> tuple[str | None, str, str]:
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


def not_text(path: str, lineno: int, line: bytes) -> None:
    """Refuse a file that is not text at all, whatever --on-bad-row says: skipping its "lines" one by one
    would bury the one fact that matters (a compressed file, a parquet file named .jsonl)."""
    what = next((kind for magic, kind in MAGIC if line.startswith(magic)), None) if lineno == 1 else None
    if what is None and b"\0" in line:
        what = "binary (a NUL byte; compressed, or UTF-16?)"
    if what is not None:
        raise PrepareError(f"--input: {path} line {lineno}: the file is {what}, not JSON lines text")

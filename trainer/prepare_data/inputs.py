"""What an --input names: its files and their kind (a file, a datasets directory, a directory of shards,
a glob), all checked before any work; and opening one (local or fsspec URL)."""

import glob
import os

from trainer.prepare_data.errors import PrepareError
from trainer.data.token_store import is_remote, remote_fs

TEXT_SUFFIXES = (".txt", ".text", ".md")
JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
SHARD_SUFFIXES = (*TEXT_SUFFIXES, *JSONL_SUFFIXES, ".parquet")
GLOB_CHARS = "*?["
DATASETS_MARKERS = ("dataset_info.json", "dataset_dict.json", "state.json")


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


def open_input(path: str):
    import fsspec

    try:
        return fsspec.open(path, "rb", skip_instance_cache=True).open()
    except (OSError, ValueError) as e:
        raise PrepareError(f"--input: cannot read {path}: {getattr(e, 'strerror', None) or e}") from None

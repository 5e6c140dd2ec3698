"""Is a committed checkpoint sound? ``validate_checkpoint`` and ``python -m trainer.validate URI``.

Checks, in order (the names are those a failure reports):

* ``manifest``      manifest.json exists, parses, has the commit fields, and its step is the directory's
* ``presence``      every file the manifest lists exists
* ``size``          ... has the size the manifest records
* ``checksum``      ... and the checksum it records (xxh3_128; sha256 in older manifests and your own)
* ``dcp_metadata``  DCP's .metadata loads and every file it points into is in the manifest
* ``dcp_objects``   every non-tensor item (the step, the scheduler, the data position) loads
* ``step_forward``  the step is past the previous checkpoint's (or ``previous_step``)
* ``finite``        a sample of floating-point tensors holds no NaN/Inf

The DCP checks (``dcp_metadata``, ``dcp_objects``, ``finite``) are for a manifest whose ``format`` is
``"dcp"``: the bundled trainer's (also when it has no ``format``: older ones). A checkpoint of a program
of your own (trainer/contract.py, another format) is checked by its manifest and its files: presence
always, size and checksum where the manifest records them; its report says the DCP checks were skipped.

A failure raises CheckpointInvalid, whose message names the checkpoint, the check and
the file (or tensor). Nothing a checkpoint holds is run: .metadata is unpickled with an allowlist and
every other object with torch's weights-only unpickler (trainer/checkpoint/safe_pickle.py); a file that holds
anything else fails ``dcp_metadata`` or ``dcp_objects``, naming what it holds. Standard library only at
module level: torch is imported for the DCP checks only, so the Airflow operator module that imports
this stays light.
"""

import argparse
import json
import sys
import warnings

from trainer.checkpoint.directory import (
    FORMAT_DCP,
    MANIFEST,
    STEP_DIR_GLOB,
    CheckpointDir,
    manifest_format,
    step_of,
)
from trainer.checkpoint.errors import CheckpointInvalid
from trainer.base.say import say
from trainer.base.storage import CHECKSUM_ALGORITHMS, Storage, checksum_stream, manifest_checksum


def validate_checkpoint(
    path_or_root: str,
    *,
    previous_step: int | None = None,
    sample_tensors: int | None = 8,
    fallback_to_valid: bool = False,
) -> dict:
    """Validate a step directory, or the latest committed checkpoint under a root.

    :param path_or_root: a step directory (``.../step-00000050``) or a checkpoint root; local or ``s3://``.
    :param previous_step: the step must be greater; default: the committed checkpoint before it, if any.
    :param sample_tensors: floating-point tensors to load and check for NaN/Inf (evenly spread over
        the model and optimizer state); None checks them all.
    :param fallback_to_valid: on a failure, try the next older committed checkpoint, and return
        the newest valid one; its report lists the ones skipped under ``fell_back_from``.
    :return: ``{"checkpoint", "step", "valid": True, "checks": {...}, "fell_back_from": [...]}``.
    """
    root, step_dir = CheckpointDir.split(path_or_root)
    committed = root.committed()
    if step_dir is None:
        if not committed:
            raise CheckpointInvalid(
                root.root, "manifest", MANIFEST, f"no committed checkpoint ({STEP_DIR_GLOB}/{MANIFEST})"
            )
        candidates = [p for _, p in reversed(committed)]
    else:
        step = step_of(step_dir)
        candidates = [step_dir] + [p for s, p in reversed(committed) if s < step]
    steps = {p: s for s, p in committed}
    skipped: list[dict] = []
    for path in candidates if fallback_to_valid else candidates[:1]:
        prev = previous_step
        if prev is None:
            mine = steps.get(path, step_of(path))
            prev = max((s for s in steps.values() if s < mine), default=None)
        try:
            report = _validate_one(root, path, prev, sample_tensors)
        except CheckpointInvalid as err:
            if not fallback_to_valid:
                raise
            skipped.append(err.to_dict())
            continue
        report["fell_back_from"] = skipped
        return report
    detail = "; ".join(f"{s['checkpoint']}: {s['check']} ({s['file']})" for s in skipped)
    raise CheckpointInvalid(
        path_or_root, "fallback", "every committed checkpoint", f"none is valid: {detail}"
    )


def _validate_one(
    root: CheckpointDir, path: str, previous_step: int | None, sample_tensors: int | None
) -> dict:
    storage = root.storage
    checks: dict = {}

    # -- manifest (the same checks the budget task's ledger makes)
    manifest = root.checked_manifest(path)
    checks["manifest"] = "ok"

    fmt = manifest_format(manifest)
    dcp_format = fmt == FORMAT_DCP
    checks["format"] = fmt
    files = manifest["files"]
    if not isinstance(files, dict):
        raise CheckpointInvalid(path, "manifest", MANIFEST, f"files: expected an object, got {files!r}")
    checks["files"] = {"count": len(files), "bytes": _check_files(storage, path, files, dcp_format)}

    if not dcp_format:
        checks["step_forward"] = _step_forward(path, manifest, previous_step)
        skipped = f"skipped: format {fmt!r} is not a torch.distributed.checkpoint save"
        checks["dcp_metadata"] = checks["dcp_objects"] = checks["finite"] = skipped
        return _report(path, manifest, checks)

    # -- DCP metadata
    metadata = _dcp_metadata(storage, path, manifest)
    checks["dcp_metadata"] = {"entries": len(metadata.state_dict_metadata)}
    checks["dcp_objects"] = {"loaded": _check_objects(storage, path, metadata)}

    # -- progress
    checks["step_forward"] = _step_forward(path, manifest, previous_step)

    # -- finite tensors
    checks["finite"] = {"sampled": _check_finite(storage, path, metadata, sample_tensors)}
    return _report(path, manifest, checks)


def _report(path: str, manifest: dict, checks: dict) -> dict:
    return {
        "checkpoint": path,
        "step": manifest["step"],
        "valid": True,
        "checks": checks,
        "tokens_seen": manifest.get("tokens_seen"),
        "world_size": manifest.get("world_size"),
    }


def _check_files(storage: Storage, path: str, files: dict, dcp_format: bool) -> int:
    """Presence, size, checksum of every file the manifest lists (the bundled trainer records both for
    every file; your own may not); returns the bytes they hold."""
    name = path.rstrip("/").rsplit("/", 1)[-1]
    total = 0
    for file, entry in sorted(files.items()):
        entry = entry if isinstance(entry, dict) else {}
        size = storage.size(storage.path(name, file))
        if size is None:
            raise CheckpointInvalid(path, "presence", file, "listed in the manifest but missing")
        if (dcp_format or "size" in entry) and size != entry.get("size"):
            raise CheckpointInvalid(
                path, "size", file, f"{size} bytes, the manifest says {entry.get('size')}"
            )
        recorded = manifest_checksum(entry)
        if recorded is None and dcp_format:
            raise CheckpointInvalid(
                path,
                "manifest",
                file,
                f"its entry records no checksum (one of {', '.join(CHECKSUM_ALGORITHMS)})",
            )
        if recorded is not None:
            algorithm, expected = recorded
            with storage.open(storage.path(name, file), "rb") as f:
                actual = checksum_stream(f, algorithm)
            if actual != expected:
                raise CheckpointInvalid(
                    path,
                    "checksum",
                    file,
                    f"{algorithm} {actual[:16]}..., the manifest says {str(expected)[:16]}...",
                )
        total += size
    return total


def _dcp_metadata(storage: Storage, path: str, manifest: dict):
    """DCP's index of the step directory, loaded safely; every file it references must be in the manifest."""
    from trainer.checkpoint.reader import storage_reader  # torch from here on
    from trainer.checkpoint.safe_pickle import UnsafeCheckpoint

    try:
        metadata = storage_reader(storage, path).read_metadata()
    except UnsafeCheckpoint as err:  # a forged .metadata: refused before anything in it ran
        raise CheckpointInvalid(path, "dcp_metadata", ".metadata", err.detail) from None
    except Exception as err:  # a truncated or foreign .metadata: any unpickling error
        raise CheckpointInvalid(
            path, "dcp_metadata", ".metadata", f"does not load: {type(err).__name__}: {err}"
        ) from None
    referenced = {info.relative_path for info in (metadata.storage_data or {}).values()}
    unlisted = sorted(referenced - set(manifest["files"]))
    if unlisted:
        raise CheckpointInvalid(path, "dcp_metadata", unlisted[0], "holds tensors but is not in the manifest")
    return metadata


def _step_forward(path: str, manifest: dict, previous_step: int | None) -> dict | str:
    if previous_step is None:
        return "first checkpoint"
    if manifest["step"] <= previous_step:
        raise CheckpointInvalid(
            path,
            "step_forward",
            MANIFEST,
            f"step {manifest['step']} did not move past the previous checkpoint's {previous_step}",
        )
    return {"previous_step": previous_step}


def _check_objects(storage: Storage, path: str, metadata) -> int:
    """Load every non-tensor item as a resume does, through the weights-only unpickler; returns how many.

    They are small (the step, the scheduler, the data position, the optimizer's settings), and a forged one
    found here fails validation, so a resume falls back past its checkpoint instead of stopping at its load.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    from trainer.checkpoint.reader import storage_reader
    from trainer.checkpoint.safe_pickle import UnsafeCheckpoint, refusals_raised

    items = metadata.state_dict_metadata.items()
    state = dict.fromkeys(
        k for k, m in items if isinstance(m, BytesStorageMetadata)
    )  # DCP fills in each value
    if not state:
        return 0
    reader = storage_reader(storage, path)
    try:
        with warnings.catch_warnings(), refusals_raised(reader):
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.load(state, storage_reader=reader, no_dist=True)
    except UnsafeCheckpoint as err:
        raise CheckpointInvalid(path, "dcp_objects", err.file.rsplit("/", 1)[-1], err.detail) from None
    return len(state)


def _check_finite(storage: Storage, path: str, metadata, sample_tensors: int | None) -> list[str]:
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from trainer.checkpoint.reader import storage_reader

    keys = sorted(
        k
        for k, m in metadata.state_dict_metadata.items()
        if isinstance(m, TensorStorageMetadata) and m.properties.dtype.is_floating_point
    )
    if sample_tensors is not None and sample_tensors < len(keys):
        # evenly spread, so both the model and the optimizer moments are looked at
        keys = (
            [keys[i * len(keys) // sample_tensors] for i in range(sample_tensors)] if sample_tensors else []
        )
    if not keys:
        return []
    # Flat keys are the FQNs DCP stored ("model.norm.weight", "optim.state.norm.weight.exp_avg"):
    # a flat dict of full-size tensors loads them whatever the world size that saved them.
    state = {
        k: torch.empty(
            metadata.state_dict_metadata[k].size, dtype=metadata.state_dict_metadata[k].properties.dtype
        )
        for k in keys
    }
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(state, storage_reader=storage_reader(storage, path), no_dist=True)
    for key in keys:
        bad = (~torch.isfinite(state[key])).sum().item()
        if bad:
            raise CheckpointInvalid(
                path, "finite", f"tensor {key}", f"{bad} of {state[key].numel()} values are NaN/Inf"
            )
    return keys


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m trainer.validate", description=__doc__.split("\n\n")[0])
    p.add_argument("uri", help="a checkpoint root (its latest committed checkpoint) or a step directory")
    p.add_argument("--previous-step", type=int)
    p.add_argument("--sample-tensors", type=int, default=8, help="-1: all")
    p.add_argument(
        "--fallback", action="store_true", help="report the newest valid checkpoint instead of failing"
    )
    args = p.parse_args(argv)
    try:
        report = validate_checkpoint(
            args.uri,
            previous_step=args.previous_step,
            fallback_to_valid=args.fallback,
            sample_tensors=None if args.sample_tensors < 0 else args.sample_tensors,
        )
    except (CheckpointInvalid, FileNotFoundError) as err:
        say(f"invalid: {err}")
        return 1
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

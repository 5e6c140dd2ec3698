"""The private names of DTensor, FSDP2, DCP, torch.save's settings and the compiler: each reached only here,
each the ``Hook`` of ``trainer.torch_private`` that its function asks for."""

from __future__ import annotations

import importlib
import sys
from typing import Any

from trainer.torch_private import HOOKS, _aten, fall_back, fallbacks_in_force, resolve, use, why_off


def local_shape_and_offset(param: Any) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """(this rank's shape, its offset in the whole tensor) of the DTensor ``param``; None: read it whole."""
    if not use("dtensor_local_shape"):
        return None
    compute = resolve("torch.distributed.tensor._utils:compute_local_shape_and_global_offset")
    shape, offset = compute(param.shape, param.device_mesh, param.placements)
    return tuple(shape), tuple(offset)


def dcp_metadata_globals() -> dict[tuple[str, str], Any]:
    """{(module, name): object} of the private globals a DCP ``.metadata`` pickles; a name this torch lacks
    is left out (the unpickler then refuses a file naming it)."""
    if not use("dcp_metadata_globals"):
        return {}
    out = {}
    for spec in HOOKS["dcp_metadata_globals"].names:
        module, _, name = spec.partition(":")
        try:
            out[(module, name)] = resolve(spec)
        except LookupError as err:
            fall_back("dcp_metadata_globals", str(err))
    return out


_DCP_MODULES = ("torch.distributed.checkpoint.metadata", "torch.distributed.checkpoint.filesystem")


def dcp_global_fallback(module: str, name: str) -> Any | None:
    """``dcp_metadata_globals``' fallback, for a global of a ``.metadata`` that the allowlist lacks while the
    hook is off: a dataclass or enum that DCP's metadata or filesystem module defines, with no
    ``__setstate__`` or ``__reduce__`` of its own (pickle builds it by setting its fields: no code of the
    file's choosing runs), or the layout lookup, answered from torch's public layouts. None: refused."""
    import dataclasses
    import enum

    if why_off("dcp_metadata_globals") is None:
        return None
    if module in _DCP_MODULES:
        obj = getattr(importlib.import_module(module), name, None)
        own = isinstance(obj, type) and obj.__module__ == module
        plain = own and not {"__setstate__", "__reduce__", "__reduce_ex__"} & set(vars(obj))
        if plain and (dataclasses.is_dataclass(obj) or issubclass(obj, enum.Enum)):
            return obj
    if (module, name) == tuple(HOOKS["dcp_metadata_globals"].names[2].split(":")):
        return _public_layout
    return None


def _public_layout(name: str) -> Any:
    """``torch.strided`` for ``"torch.strided"``: a layout by its public name, nothing else."""
    import torch

    layout = getattr(torch, name.removeprefix("torch."), None) if name.startswith("torch.") else None
    if not isinstance(layout, torch.layout):
        raise ValueError(f"{name!r} is not a torch layout")
    return layout


def metadata_path(reader: Any, rank: int | None) -> Any:
    """Where DCP's ``FileSystemReader`` ``reader`` finds its ``.metadata`` (for ``rank``, if given)."""
    if use("dcp_metadata_path"):
        return reader._get_metadata_path(rank) if rank is not None else reader._get_metadata_path()
    name = f"__{rank}_.metadata" if rank is not None else ".metadata"  # DCP's names since 2.6
    return reader.fs.concat_path(reader.path, name)


def fsspec_reader() -> type:
    """DCP's fsspec reader class (s3://)."""
    if not use("dcp_fsspec_reader"):
        raise RuntimeError(
            "s3:// checkpoints: this torch has no DCP fsspec reader "
            f"({fallbacks_in_force().get('dcp_fsspec_reader')})"
        )
    return resolve("torch.distributed.checkpoint._fsspec_filesystem:FsspecReader")


def graphs_compiled() -> int | None:
    """The graphs dynamo compiled in this process (0 before torch.compile is imported); None: not counted."""
    utils = sys.modules.get("torch._dynamo.utils")
    if utils is None:
        return 0
    if not use("dynamo_graph_counter"):
        return None
    try:
        return int(utils.counters["stats"]["unique_graphs"])
    except (AttributeError, KeyError, TypeError) as err:
        fall_back("dynamo_graph_counter", f"{type(err).__name__}: {err}")
        return None


def reset_fsdp_backward(model: Any) -> bool:
    """Bring every FSDP2 module of ``model`` back to idle after an exception inside forward or backward:
    run the root's end-of-backward callback, reshard, and drop gradients held unsharded. False where this
    torch's FSDP state differs (the caller then stops probing)."""
    from torch.distributed.fsdp import FSDPModule

    if not use("fsdp_reset_after_oom"):
        return False
    root = model._get_fsdp_state() if isinstance(model, FSDPModule) else None
    if root is not None and hasattr(root, "_root_post_backward_final_callback"):
        root._root_post_backward_final_callback()
    for m in model.modules():
        if not isinstance(m, FSDPModule):
            continue
        m.reshard()
        # Blocks whose backward finished while gradient sync was off hold their gradients
        # unsharded, where zero_grad() does not reach: the next step would add them in.
        state = m._get_fsdp_state()
        groups = getattr(state, "_fsdp_param_groups", None) or [getattr(state, "_fsdp_param_group", None)]
        for group in filter(None, groups):
            for fsdp_param in group.fsdp_params:
                fsdp_param.unsharded_accumulated_grad = None
                if hasattr(fsdp_param, "_unsharded_param"):
                    fsdp_param._unsharded_param.grad = None
    return True


def crc32_default(config: Any, enabled: bool) -> bool:
    """Make ``enabled`` the default of torch.save's CRC32 setting for every thread; False where not."""
    if not use("crc32_every_thread"):
        return False
    entry = getattr(config, "_config", {}).get("save.compute_crc32")
    if entry is None:
        fall_back("crc32_every_thread", "no save.compute_crc32 entry")
        return False
    entry.default = enabled
    return True


def keep_buffers_stager(default_stager: type, options: Any) -> Any | None:
    """torch 2.11: a ``DefaultStager`` whose stage is 2.12's (the same copy, no close); None: not here."""
    import contextlib

    if not use("stager_keep_buffers"):
        return None

    class _KeepBuffersStager(default_stager):
        def _stage(self, state_dict, **kwargs):
            import torch

            non_blocking = self._config.use_non_blocking_copy
            stream = self._staging_stream if non_blocking else None
            with stream if stream is not None else contextlib.nullcontext():
                staged = self._state_dict_stager.stage(state_dict, non_blocking=non_blocking)
            if stream is not None:
                stream.synchronize()
            elif non_blocking:
                torch.cuda.synchronize()
            return staged

    return _KeepBuffersStager(options)


def attention_ops() -> set:
    """The aten attention ops op-level activation checkpointing keeps; empty: it recomputes attention."""
    if not use("sac_attention_ops"):
        return set()
    aten = _aten()
    names = (
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
    )
    return {getattr(aten, n).default for n in names if hasattr(aten, n)}

"""Every private torch name the trainer uses, in one place, each with its reason and its fallback.

A private name (a ``_``-prefixed module, class or attribute, anything under ``torch.testing``) can change in
any torch release without notice. The trainer touches one only through this module, which for each use
(a ``Hook``) records:

* ``reason``: what the name buys, in one line;
* ``checked_on``: the torch releases its use was checked on (``make test-torch-min`` and ``make test``);
* ``fallback``: what the trainer does without it: slower, never wrong. It is taken when a name is missing
  or not of the shape this module expects (a newer or older torch), or when the hook is forced off with
  ``DTRAIN_TORCH_PRIVATE_OFF`` (``all``, or hook names separated by commas: a check of a new torch, and
  the tests that show each fallback still trains the same tokens in the same order).

Every fallback taken is said once per process and named, with the torch version, on the trainer's first
line and in ``progress.json`` (``torch``), which ``summary.json`` carries (``fallbacks_in_force``).
``tests/unit/test_torch_private.py`` fails on a private torch name used anywhere else.

This package: the hooks and what is in force (here); the private names of the elastic agent, its rendezvous
and the training processes it keeps (``elastic_hooks``); those of DTensor, FSDP2, DCP and the compiler
(``tensor_hooks``). It imports only the standard library and ``trainer.base.say`` at module level; torch
where
a hook runs.

Public extension points are used wherever torch has one; where it has none, the hook says why:

* the rendezvous round that closes once every survivor is back (``rdzv_close_round``) changes how a round
  of torch's dynamic rendezvous closes. torch's registry (``torch.distributed.elastic.rendezvous.registry``,
  torchrun's ``--rdzv-backend``) chooses the *store* a round meets in (c10d, etcd, static), not the rule
  that closes it: that rule lives in ``_RendezvousJoinOp``, and a handler of our own would re-implement
  torch's whole state machine (heartbeats, the wait list, redundancy, a node's exit) to change one branch.
  Until torch makes the rule pluggable, the hook wraps the private join and falls back to torch's rule;
* the warm-up's fake world (``fake_process_group``) has no public home: ``FakeProcessGroup`` is torch's test
  backend, and a Python ``ProcessGroup`` of our own needs ``torch._C``'s private work objects to answer a
  collective. Without it the joining node compiles after it joins (``trainer.elastic.warm_join``'s own
  fallback).
"""

from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass
from typing import Any

from trainer.base.say import say

TESTED = ("2.11", "2.14")
"""The oldest and newest torch releases the trainer is tested on (setup.cfg's range; the Makefile's pins)."""

OFF_ENV = "DTRAIN_TORCH_PRIVATE_OFF"
"""``all``, or hook names separated by commas: those hooks take their fallback as if torch had changed."""


@dataclass(frozen=True)
class Hook:
    name: str
    reason: str
    fallback: str
    names: tuple[str, ...]
    """``module:attribute.path`` of every private name the hook needs that a class or module holds (checked
    when the hook is asked for); the instance attributes it reads are checked where it reads them."""
    checked_on: tuple[str, ...] = TESTED


_DR = "torch.distributed.elastic.rendezvous.dynamic_rendezvous"
_AGENT = "torch.distributed.elastic.agent.server"

HOOKS: dict[str, Hook] = {
    h.name: h
    for h in (
        Hook(
            "rdzv_close_round",
            "a resize round closes once every survivor is back, not at its last call "
            "(trainer/elastic/rdzv_round.py)",
            "rendezvous rounds wait their last call (replace_timeout_s) after a lost node",
            (f"{_DR}:_RendezvousJoinOp.__call__", f"{_DR}:_Action.MARK_RENDEZVOUS_COMPLETE",
             f"{_DR}:_Action.KEEP_ALIVE", f"{_DR}:_Action.SYNC", f"{_DR}:_delay"),
        ),
        Hook(
            "rdzv_name_world",
            "every world's keys in the group's store carry its rendezvous round "
            "(trainer/elastic/rdzv_round.py)",
            "a resize starts new training processes, which meet in torch's own per-round keys",
            (f"{_AGENT}.api:SimpleElasticAgent._rendezvous", f"{_DR}:DynamicRendezvousHandler.get_run_id"),
        ),
        Hook(
            "rdzv_leave_on_signal",
            "a preempted node leaves the rendezvous at once, so its peers meet again without waiting",
            "a preempted node's peers wait for its heartbeats to stop (about 15 s) before they meet again",
            (f"{_DR}:_RendezvousExitOp", f"{_DR}:DynamicRendezvousHandler._stop_heartbeats"),
        ),
        Hook(
            "agent_restarts_only_resumable",
            "an elastic group's agent restarts its workers only for a resumable exit (75, 76)",
            "a node whose workers stopped for good (crash, cap, fence, full disk) has each restart exit at "
            "once with the same code, before it builds anything",
            (f"{_AGENT}.local_elastic_agent:LocalElasticAgent._monitor_workers",),
        ),
        Hook(
            "agent_killed_workers",
            "the node's last line names the workers the agent had to SIGKILL at its shutdown timeout",
            "the node's last line does not name the workers SIGKILLed at the shutdown timeout",
            (),
        ),
        Hook(
            "dtensor_mesh_caches",
            "a training process kept across worlds clears DTensor's caches keyed by the last world's mesh",
            "a resize starts new training processes (a kept one would reuse the last world's shard offsets)",
            ("torch.distributed.tensor.debug:_clear_sharding_prop_cache",
             "torch.distributed.tensor._redistribute:_gen_transform_infos",
             "torch.distributed.tensor._collective_utils:MeshTopoInfo.build_from_mesh"),
        ),
        Hook(
            "fake_process_group",
            "a joining node compiles in a fake world of the group's size before it joins "
            "(trainer.elastic.warm_join)",
            "a joining node compiles after it joins, in the group's first step",
            ("torch.testing._internal.distributed.fake_pg:FakeStore",),
        ),
        Hook(
            "dtensor_local_shape",
            "model.init_from: each rank reads only its own rows of each safetensors tensor",
            "model.init_from: each rank reads every tensor whole and keeps its shard (distribute_tensor)",
            ("torch.distributed.tensor._utils:compute_local_shape_and_global_offset",),
        ),
        Hook(
            "dcp_metadata_globals",
            "a checkpoint's .metadata unpickles only DCP's own classes, which include private ones",
            "a checkpoint's .metadata may name any dataclass or enum of DCP's own metadata and filesystem "
            "modules that runs no code of its own when unpickled, and layouts by their public names",
            ("torch.distributed.checkpoint.filesystem:_StorageInfo",
             "torch.distributed.checkpoint.metadata:_MEM_FORMAT_ENCODING",
             "torch.serialization:_get_layout"),
        ),
        Hook(
            "dcp_metadata_path",
            "the safe reader reads .metadata where DCP's FileSystemReader says it lies",
            "the safe reader reads <step>/.metadata, DCP's documented name",
            ("torch.distributed.checkpoint:FileSystemReader._get_metadata_path",),
        ),
        Hook(
            "dcp_fsspec_reader",
            "s3:// checkpoints are read with DCP's fsspec reader, which torch does not export publicly",
            "an s3:// checkpoint cannot be read: resume and validation say so and stop, nothing loaded",
            ("torch.distributed.checkpoint._fsspec_filesystem:FsspecReader",),
        ),
        Hook(
            "dynamo_graph_counter",
            "the startup event counts the graphs torch.compile compiled before the first step",
            "the startup event's graphs_compiled is null (not counted)",
            ("torch._dynamo.utils:counters",),
        ),
        Hook(
            "fsdp_reset_after_oom",
            "the micro-batch search resets FSDP2's backward state after an out-of-memory probe",
            "parallel.auto_micro_batch_size is not searched: the configured micro_batch_size is used",
            ("torch.distributed.fsdp:FSDPModule._get_fsdp_state",),
        ),
        Hook(
            "crc32_every_thread",
            "torch.save skips its per-record CRC32 in DCP's writer threads too (the manifest hashes files)",
            "DCP's writer threads keep torch.save's CRC32: saves take more CPU",
            ("torch.utils.serialization.config:_config",),
        ),
        Hook(
            "stager_keep_buffers",
            "torch 2.11: one DCP stager keeps its pinned buffers for every save (pytorch#183413)",
            "torch 2.11: every save gets a new stager, allocating and pinning its buffers again",
            ("torch.distributed.checkpoint.staging:DefaultStager._stage",),
        ),
        Hook(
            "sac_attention_ops",
            "op-level activation checkpointing keeps attention's outputs, found by their aten op names",
            "op-level activation checkpointing recomputes attention in the backward",
            ("torch.ops.aten:_scaled_dot_product_efficient_attention",),
        ),
    )
}  # fmt: skip

_taken: dict[str, str] = {}  # hook name -> what went wrong when it ran, in this process (its fallback since)
_said: set[str] = set()  # hooks whose fallback this process has said


def _forced_off(environ: Any = None) -> set[str]:
    value = (os.environ if environ is None else environ).get(OFF_ENV, "").strip()
    if not value:
        return set()
    if value == "all":
        return set(HOOKS)
    names = {n.strip() for n in value.split(",") if n.strip()}
    if unknown := sorted(names - set(HOOKS)):
        raise ValueError(f"{OFF_ENV}={value!r}: no hook {', '.join(unknown)}; one of all, {', '.join(HOOKS)}")
    return names


def resolve(spec: str) -> Any:
    """The object ``module:attribute.path`` names; LookupError where this torch has none."""
    module, _, path = spec.partition(":")
    try:
        owner = importlib.import_module(module) if module != "torch.ops.aten" else _aten()
    except ImportError as err:
        raise LookupError(f"no module {module} ({err})") from None
    for part in path.split(".") if path else ():
        if not hasattr(owner, part):
            raise LookupError(f"{module} has no {path}")
        owner = getattr(owner, part)
    return owner


def _aten() -> Any:
    import torch

    return torch.ops.aten


def _version() -> str:
    torch = sys.modules.get("torch")
    if torch is None:
        import torch
    return torch.__version__.split("+")[0]


def why_off(name: str, environ: Any = None) -> str | None:
    """Why ``name``'s fallback is in force in this process (forced off, a name this torch lacks, or what
    went wrong when it ran); None while the hook is in force."""
    if name in _taken:
        return _taken[name]
    hook = HOOKS[name]
    if name in _forced_off(environ):
        return f"forced off ({OFF_ENV})"
    for spec in hook.names:
        try:
            resolve(spec)
        except LookupError as err:
            return f"torch {_version()}: {err}"
    return None


def use(name: str, environ: Any = None) -> bool:
    """Whether hook ``name`` may run here; where not, its fallback is said (once per process)."""
    why = why_off(name, environ)
    if why is not None:
        _say(name, why)
    return why is None


def fall_back(name: str, why: str) -> None:
    """Hook ``name`` failed when it ran (``why``): its fallback is in force from now on in this process."""
    _taken.setdefault(name, why)
    _say(name, why)


def _say(name: str, why: str) -> None:
    if name not in _said:
        _said.add(name)
        say(f"[trainer] {HOOKS[name].fallback} (torch {_version()}: {name} {why})")


def fallbacks_in_force(environ: Any = None) -> dict[str, str]:
    """{hook: "<fallback> (<why>)"} of every hook whose fallback is in force in this process and torch."""
    out = {}
    for name, hook in HOOKS.items():
        why = why_off(name, environ)
        if why is not None:
            out[name] = f"{hook.fallback} ({why})"
    return out


def newer_than_tested(version: str | None = None) -> bool:
    """Whether this torch is newer than the newest release the trainer is tested on."""
    major, minor = (int(x) for x in (version or _version()).split(".")[:2])
    newest = tuple(int(x) for x in TESTED[1].split("."))
    return (major, minor) > newest


def torch_report(environ: Any = None) -> dict[str, Any]:
    """What ``progress.json`` and ``summary.json`` carry of torch: its version and the fallbacks in force."""
    version = _version()
    return {
        "version": version,
        "tested": f"{TESTED[0]}..{TESTED[1]}",
        "newer_than_tested": newer_than_tested(version),
        "fallbacks_in_force": fallbacks_in_force(environ),
    }


def startup_line(environ: Any = None) -> str:
    """The trainer's first line on torch: ``torch 2.14.1 (tested 2.11..2.14): every private hook in force``,
    or the fallbacks in force, each with why."""
    report = torch_report(environ)
    head = f"torch {report['version']} (tested {report['tested']}"
    head += ", newer than tested)" if report["newer_than_tested"] else ")"
    fallbacks = report["fallbacks_in_force"]
    if not fallbacks:
        return f"{head}: every private torch hook in force"
    return f"{head}: fallbacks in force: " + "; ".join(f"{k}: {v}" for k, v in fallbacks.items())

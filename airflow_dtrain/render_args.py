"""The arguments of ``render``: what ``airflow dtrain render`` (``cli``) and ``python -m airflow_dtrain
render`` (``__main__``) both take. Its own module so that neither command line imports the other
(``cli`` runs ``__main__.run_render``).

The flags that set a ``JobSpec`` field take that field's declaration (help, integer or not) from where it is
declared (``JobSpec``, ``Resources``, ``KubernetesSpec``, the trainer's sections), so a flag says what the
operator argument says. The declarations are imported when the arguments are built (``render_args()``), not
when this module is: it stays cheap to import on every ``airflow`` command.
"""

from __future__ import annotations

from typing import Any

DEFAULT_CHECKPOINT = "s3://change-me/dtrain/{name}"
"""The placeholder checkpoint.uri of a group rendered without ``--checkpoint-uri``."""

FIELD_FLAGS: tuple[tuple[tuple[str, ...], str, str, str], ...] = (
    (("--num-nodes", "--nodes"), "airflow_dtrain.job.spec:JobSpec", "num_nodes", ""),
    (
        ("--gpus-per-node",),
        "airflow_dtrain.job.resources:Resources",
        "gpus_per_node",
        " (and training processes)",
    ),
    (("--image",), "airflow_dtrain.kubernetes.spec:KubernetesSpec", "image", ""),
    (
        ("--checkpoint-uri",),
        "trainer.config.sections:CheckpointConfig",
        "uri",
        f" Default: {DEFAULT_CHECKPOINT}",
    ),
    (("--flavor",), "trainer.config.sections:ModelConfig", "flavor", ""),
    (("--namespace",), "airflow_dtrain.kubernetes.spec:KubernetesSpec", "namespace", ""),
    (("--capacity",), "airflow_dtrain.job.spec:JobSpec", "capacity", ""),
    (("--zone",), "airflow_dtrain.job.spec:JobSpec", "zone", ""),
    (("--instance-type",), "airflow_dtrain.job.spec:JobSpec", "instance_type", ""),
)
"""Flags that set one declared field: (flags, ``module:class``, field, what the flag adds to its help).
The first flag is the name; the others are deprecated aliases (``--nodes``: use ``--num-nodes``)."""


def _field_arg(flags: tuple[str, ...], where: str, name: str, extra: str) -> tuple[tuple[str, ...], dict]:
    """The argparse keywords of a flag from the field's declaration: its help; int fields parse as int."""
    import importlib

    from trainer.config.fields import declared, field_types, meta

    module, _, klass_name = where.partition(":")
    klass = getattr(importlib.import_module(module), klass_name)
    f = declared(klass, name)
    kwargs: dict[str, Any] = {
        "dest": flags[0].lstrip("-").replace("-", "_"),
        "help": f"{meta(f).help}{extra}".replace("%", "%%"),
    }
    if field_types(klass)[name] is int:
        kwargs.update(type=int, metavar="N")
    for alias in flags[1:]:
        kwargs["help"] += f" ({alias} is a deprecated spelling of {flags[0]})"
    return flags, kwargs


def render_args() -> tuple[tuple[tuple[str, ...], dict[str, Any]], ...]:
    """The arguments of ``render``, as ``(flags, argparse keywords)``: one definition for both command
    lines, the field flags generated from the declarations (``FIELD_FLAGS``)."""
    own = (
        (
            ("--backend",),
            {"required": True, "choices": ["kubernetes"], "help": "the backend (kubernetes only)"},
        ),
        (("--spec",), {"help": "a JobSpec as JSON or YAML; the flags win over it"}),
        (("--name",), {"default": "dtrain-manual-r0", "help": "the group's name (default dtrain-manual-r0)"}),
        (
            ("--policy",),
            {
                "help": "the platform admin's policy, the Kubernetes connection extra's dtrain_policy (a "
                "file, JSON or YAML): the group is checked against it and carries what it adds (the job's "
                "compile cache), as the operator launches it on that connection"
            },
        ),
    )
    return own + tuple(_field_arg(*row) for row in FIELD_FLAGS)


def __getattr__(name: str) -> Any:
    """``RENDER_ARGS``, the older name of ``render_args()``'s value, built when first read."""
    if name == "RENDER_ARGS":
        return render_args()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

"""The arguments of ``render``: what ``airflow dtrain render`` (``cli``) and ``python -m airflow_dtrain
render`` (``__main__``) both take. Its own module so that neither command line imports the other
(``cli`` runs ``__main__.run_render``); plain data, cheap to import on every ``airflow`` command."""

from __future__ import annotations

from typing import Any

DEFAULT_CHECKPOINT = "s3://change-me/dtrain/{name}"

RENDER_ARGS: tuple[tuple[tuple[str, ...], dict[str, Any]], ...] = (
    (("--backend",), {"required": True, "choices": ["kubernetes"], "help": "the backend (kubernetes only)"}),
    (("--nodes",), {"type": int, "help": "num_nodes"}),
    (("--gpus-per-node",), {"type": int, "help": "GPUs (and training processes) per node"}),
    (("--image",), {"help": "the trainer image (kubernetes.image)"}),
    (("--spec",), {"help": "a JobSpec as JSON or YAML"}),
    (("--checkpoint-uri",), {"help": f"checkpoint.uri (default {DEFAULT_CHECKPOINT})"}),
    (("--flavor",), {"help": "model.flavor"}),
    (("--name",), {"default": "dtrain-manual-r0", "help": "the group's name (default dtrain-manual-r0)"}),
    (("--namespace",), {"help": "kubernetes.namespace (default: default)"}),
    (("--capacity",), {"help": "capacity: spot, on_demand or any (the node labels the pods require)"}),
    (("--zone",), {"help": "the availability zone the price was chosen for (required node affinity)"}),
    (("--instance-type",), {"help": "the instance type the price was chosen for (required node affinity)"}),
)
"""The arguments of ``render``, as ``(flags, argparse keywords)``: one definition for both command lines."""

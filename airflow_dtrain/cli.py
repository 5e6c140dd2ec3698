"""``airflow dtrain render``: the provider's commands in Airflow's own CLI.

Registered through the provider info's ``cli`` entry (Airflow 3 providers can add CLI commands:
``ProvidersManager`` imports ``get_dtrain_cli_commands`` when it builds the ``airflow`` command
line). The same command runs without Airflow's CLI as ``python -m airflow_dtrain render``; both
take ``RENDER_ARGS`` and run ``airflow_dtrain.__main__.run_render``. This module is imported on
every ``airflow`` command, so it imports nothing heavy until a command of its own runs.
"""

from __future__ import annotations

from typing import Any

DEFAULT_CHECKPOINT = "s3://change-me/dtrain/{name}"

RENDER_HELP = "Print a pod group's Kubernetes objects as YAML (what FSDPTrainOperator creates for the spec)"

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


def get_dtrain_cli_commands() -> list:
    """The ``airflow dtrain`` command group (the provider info's ``cli`` entry)."""
    from airflow.cli.cli_config import ActionCommand, Arg, GroupCommand, lazy_load_command

    render = ActionCommand(
        name="render",
        help=RENDER_HELP,
        description=RENDER_HELP + ", for kubectl apply -f -. Also: python -m airflow_dtrain render.",
        func=lazy_load_command("airflow_dtrain.cli.render_command"),
        args=[Arg(flags, **kwargs) for flags, kwargs in RENDER_ARGS],
    )
    return [GroupCommand(name="dtrain", help="airflow-dtrain: training pod groups", subcommands=[render])]


def render_command(args: Any) -> None:
    """``airflow dtrain render``: the YAML on stdout; a refused spec exits 2 with the reason on stderr."""
    from airflow_dtrain.__main__ import run_render

    code = run_render(args)
    if code:
        raise SystemExit(code)

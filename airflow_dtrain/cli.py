"""``airflow dtrain render``: the provider's commands in Airflow's own CLI.

Registered through the provider info's ``cli`` entry (Airflow 3 providers can add CLI commands:
``ProvidersManager`` imports ``get_dtrain_cli_commands`` when it builds the ``airflow`` command
line). The same command runs without Airflow's CLI as ``python -m airflow_dtrain render``; both
take ``render_args()`` and run ``airflow_dtrain.__main__.run_render``. This module is imported on
every ``airflow`` command, so it imports nothing heavy until a command of its own runs.
"""

from __future__ import annotations

from typing import Any

from airflow_dtrain.render_args import render_args

RENDER_HELP = "Print a pod group's Kubernetes objects as YAML (what FSDPTrainOperator creates for the spec)"


def get_dtrain_cli_commands() -> list:
    """The ``airflow dtrain`` command group (the provider info's ``cli`` entry)."""
    from airflow.cli.cli_config import ActionCommand, Arg, GroupCommand, lazy_load_command

    render = ActionCommand(
        name="render",
        help=RENDER_HELP,
        description=RENDER_HELP + ", for kubectl apply -f -. Also: python -m airflow_dtrain render.",
        func=lazy_load_command("airflow_dtrain.cli.render_command"),
        args=[Arg(flags, **kwargs) for flags, kwargs in render_args()],
    )
    return [GroupCommand(name="dtrain", help="airflow-dtrain: training pod groups", subcommands=[render])]


def render_command(args: Any) -> None:
    """``airflow dtrain render``: the YAML on stdout; a refused spec exits 2 with the reason on stderr."""
    from airflow_dtrain.__main__ import run_render

    code = run_render(args)
    if code:
        raise SystemExit(code)

"""Provider metadata, read by Airflow's ProvidersManager through the entry point."""

from __future__ import annotations

INTEGRATION = "Distributed Training"


def get_provider_info() -> dict:
    from airflow_dtrain import __version__

    return {
        "package-name": "airflow-dtrain",
        "name": "Distributed LLM training (airflow-dtrain)",
        "description": (
            "FSDP2 training of Llama-family models as pod groups (N nodes x P processes under "
            "torchrun) on this machine or on Kubernetes, with checkpoints that survive spot preemption."
        ),
        "versions": [__version__],
        "integrations": [
            {
                "integration-name": INTEGRATION,
                "external-doc-url": "https://pypi.org/project/airflow-dtrain/",
                "tags": ["software"],
            }
        ],
        "operators": [
            {
                "integration-name": INTEGRATION,
                "python-modules": ["airflow_dtrain.operators.budget_branch", "airflow_dtrain.operators.fsdp_train"],
            },
        ],
        "sensors": [
            {
                "integration-name": INTEGRATION,
                "python-modules": ["airflow_dtrain.sensors.spot_interruption", "airflow_dtrain.sensors.spot_price"],
            },
        ],
        "triggers": [
            {
                "integration-name": INTEGRATION,
                "python-modules": [
                    "airflow_dtrain.triggers.fsdp_train",
                    "airflow_dtrain.triggers.spot_interruption",
                    "airflow_dtrain.triggers.spot_price",
                ],
            },
        ],
        "config": {
            "dtrain": {
                "description": "Settings of the airflow-dtrain provider.",
                "options": {
                    "local_state_dir": {
                        "description": (
                            "Where the local backend keeps the state and logs of its pod groups. "
                            "Must be shared by the worker and the triggerer (the local backend runs "
                            "both on one machine). Defaults to $AIRFLOW_HOME/dtrain/groups."
                        ),
                        "version_added": "0.1.0",
                        "type": "string",
                        "example": "/var/lib/airflow/dtrain/groups",
                        "default": "",
                    },
                },
            }
        },
    }

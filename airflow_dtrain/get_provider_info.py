"""Provider metadata, read by Airflow's ProvidersManager through the entry point."""

from __future__ import annotations

INTEGRATION = "Distributed Training"
DOCUMENTATION_URL = "https://pypi.org/project/airflow-dtrain/"
"""Where the README (the provider's documentation) is published: the package's page."""


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
        # shown by the Providers page (the API reads it for every provider) and `airflow providers get --full`
        "documentation-url": DOCUMENTATION_URL,
        "integrations": [
            {
                "integration-name": INTEGRATION,
                "external-doc-url": DOCUMENTATION_URL,
                "tags": ["software"],
            }
        ],
        "operators": [
            {
                "integration-name": INTEGRATION,
                "python-modules": [
                    "airflow_dtrain.operators.budget_branch",
                    "airflow_dtrain.operators.checkpoint_validation",
                    "airflow_dtrain.operators.evaluate_checkpoint",
                    "airflow_dtrain.operators.fsdp_train",
                    "airflow_dtrain.operators.prepare_data",
                ],
            },
        ],
        "sensors": [
            {
                "integration-name": INTEGRATION,
                "python-modules": [
                    "airflow_dtrain.sensors.spot_interruption",
                    "airflow_dtrain.sensors.spot_price",
                ],
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
        "extra-links": [
            "airflow_dtrain.links.TrainingDashboardLink",
            "airflow_dtrain.links.TrainingReportLink",
        ],
        # `airflow dtrain render` (also `python -m airflow_dtrain render`)
        "cli": ["airflow_dtrain.cli.get_dtrain_cli_commands"],
        # No "connection-types": the provider defines no hook. It uses the cncf.kubernetes provider's
        # connection (kubernetes_conn_id) and the amazon provider's (aws_conn_id), which list theirs.
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
                    "statsd_host": {
                        "description": (
                            "Where operators, sensors and triggers send orchestration metrics "
                            "(airflow_dtrain.metrics.ORCHESTRATION_METRICS). Empty: off."
                        ),
                        "version_added": "0.1.0",
                        "type": "string",
                        "example": "statsd-exporter.monitoring",
                        "default": "",
                    },
                    "statsd_port": {
                        "description": "UDP port of the statsd server.",
                        "version_added": "0.1.0",
                        "type": "integer",
                        "example": "9125",
                        "default": "8125",
                    },
                    "statsd_prefix": {
                        "description": "Prefix of every metric name (the trainer uses the same one).",
                        "version_added": "0.1.0",
                        "type": "string",
                        "example": "dtrain",
                        "default": "dtrain",
                    },
                    "grafana_url": {
                        "description": (
                            "Base URL of the Grafana that shows docker/grafana/dtrain-dashboard.json; "
                            "the train task's 'Training dashboard' link opens it filtered to the task's run "
                            "and job over the run's time range. Empty: no such link."
                        ),
                        "version_added": "0.1.0",
                        "type": "string",
                        "example": "https://grafana.example.com",
                        "default": "",
                    },
                    "storage_roots": {
                        "description": (
                            "Comma-separated directories or s3:// prefixes where every DAG's checkpoint_uri, "
                            "registry_uri, dataset, init_from and ledger must lie, besides the local "
                            "backend's own "
                            "$AIRFLOW_HOME/dtrain (always allowed); empty: that directory only."
                        ),
                        "version_added": "0.1.0",
                        "type": "string",
                        "example": "/mnt/ckpt, s3://ml-data/, s3://ml-checkpoints/",
                        "default": "",
                    },
                    "limits": {
                        "description": (
                            "What any DAG's run may ask for, as JSON of airflow_dtrain.trust.limits.Limits "
                            "fields (max_nodes, max_procs_per_node, max_steps, max_tokens_per_micro_batch, "
                            "max_sweep_members, max_price_per_node_hour, max_runtime_s, backends); a DAG "
                            "author's "
                            "limits only narrow them. A field left out takes its default (262144 tokens per "
                            "micro-batch, $500 per node-hour, 86400 s per group); null removes it."
                        ),
                        "version_added": "0.2.0",
                        "type": "string",
                        "example": '{"max_nodes": 16, "max_runtime_s": 172800}',
                        "default": "",
                    },
                    "owners": {
                        "description": (
                            "Who owns a run's jobs, as JSON: "
                            '{"users": {user: team}, "dags": {dag_id: team}}; '
                            "the triggering user's team, else the DAG's, else the user itself (user:<name>), "
                            "else (a scheduled run) the DAG id. A job's directory, ledger and registry entry "
                            "belong to the owner that first wrote them."
                        ),
                        "version_added": "0.2.0",
                        "type": "string",
                        "example": '{"users": {"alice": "team-a"}, "dags": {"train_llama": "ml-platform"}}',
                        "default": "",
                    },
                    "shared_reads": {
                        "description": (
                            "Prefixes (paths or s3://, comma-separated) that a run of any owner may read "
                            "as init_from or dataset, e.g. a published model; empty: no read crosses owners."
                        ),
                        "version_added": "0.3.0",
                        "type": "string",
                        "example": "/srv/dtrain/models/train_llama/published",
                        "default": "",
                    },
                    "jobs_index": {
                        "description": (
                            "Where the train and evaluate tasks record each job for the Training jobs "
                            "pages (a path or s3:// prefix that the workers write and the api-server reads); "
                            "empty: $AIRFLOW_HOME/dtrain/jobs."
                        ),
                        "version_added": "0.3.0",
                        "type": "string",
                        "example": "s3://ml-platform/dtrain/jobs",
                        "default": "",
                    },
                    "interruption_queues": {
                        "description": (
                            "SQS queues SpotInterruptionSensor may read: comma-separated URLs of queues "
                            "that only it reads (an account prefix is refused: a shared queue's messages "
                            "would reach its dead-letter queue); empty: none."
                        ),
                        "version_added": "0.2.0",
                        "type": "string",
                        "example": "https://sqs.us-east-1.amazonaws.com/123456789012/dtrain-spot-events",
                        "default": "",
                    },
                    "local_memory_per_node": {
                        "description": (
                            "Memory limit of each node of a local group without resources.memory, a "
                            "Kubernetes "
                            "quantity such as 16Gi (cgroup v2 where delegated, else RLIMIT_DATA per "
                            "process). "
                            "Empty: 32Gi per GPU, else 4Gi per process, as on Kubernetes."
                        ),
                        "version_added": "0.2.0",
                        "type": "string",
                        "example": "16Gi",
                        "default": "",
                    },
                    "interruption_rate_per_hour": {
                        "description": (
                            "How often a spot group is interrupted, per hour, on the market the bundled "
                            "train_llama "
                            "runs on (its budget task's interruption_rate_per_hour, used in the spot "
                            "estimates); "
                            "set it from your own history. Empty: the operator's default (0.05)."
                        ),
                        "version_added": "0.1.0",
                        "type": "float",
                        "example": "1.5",
                        "default": "",
                    },
                    "kubernetes": {
                        "description": (
                            "Pod settings of the bundled DAGs (train_llama, sweep_llama) on the kubernetes "
                            "backend, as JSON (airflow_dtrain.kubernetes.spec.KubernetesSpec): image, "
                            "namespace, "
                            "service_account, volumes, secret_env, pod_template, allowed_images, "
                            "allowed_namespaces... Set by whoever deploys those DAGs; a trigger form only "
                            "chooses an image and a namespace within it."
                        ),
                        "version_added": "0.1.0",
                        "type": "string",
                        "example": '{"image": "ghcr.io/acme/dtrain:1.0", '
                        '"allowed_images": ["ghcr.io/acme/dtrain:"], '
                        '"volumes": [{"claim": "ckpt", "mount_path": "/mnt/ckpt"}]}',
                        "default": "",
                    },
                },
            }
        },
    }

"""airflow-dtrain's trainer: FSDP2 Llama pre-training launched by torchrun.

Only ``trainer.config`` is imported by the Airflow provider (at DAG-parse time); it is
standard-library only. Everything else imports torch and runs on the training nodes.
"""

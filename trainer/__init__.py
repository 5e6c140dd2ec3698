"""airflow-dtrain's trainer: FSDP2 Llama pre-training launched by torchrun.

The Airflow provider imports ``trainer.config`` and ``trainer.checkpoint_dir`` (with
``trainer.storage`` and ``trainer.cost``) at DAG-parse time; they are standard-library only.
Everything else imports torch and runs on the training nodes (``trainer.validate`` only
once a tensor is looked at).
"""

"""airflow-dtrain's trainer: FSDP2 Llama pre-training launched by torchrun.

The top level holds the entry points a user or a pod types (``python -m trainer``, ``trainer.launch``,
``trainer.evaluate``, ``trainer.export``, ``trainer.validate``, ``trainer.prepare_data``), the training loop
(``train``) and what a program of your own imports (``contract``, ``contract_files``, ``events``). The parts,
one package each (each ``__init__`` says what it owns; tests/unit/test_architecture.py holds which may
import which): ``config``, ``data``, ``model``, ``step``, ``checkpoint``, ``elastic``, ``money``, ``report``,
and ``torch_private`` (torch's private names, each with a fallback).

The Airflow provider imports ``trainer.config``, ``trainer.checkpoint`` (``directory``, ``storage``) and
``trainer.money`` at DAG-parse time; they are standard-library only. Everything else imports torch and runs
on the training nodes (``trainer.validate`` only once a tensor is looked at).
"""

"""Training jobs in Airflow's own UI: an Airflow plugin (``plugin``) whose app (``app``) serves a jobs page
and a job page on the api-server, behind Airflow's login and DAG permissions, read from the job index
(``airflow_dtrain.jobs_index``) and the jobs' directories (``read``), with Vega-Lite charts (``charts``).

May import: ``airflow_dtrain.jobs_index``, ``airflow_dtrain.trust.roots``, the trainer's readers
(``trainer.checkpoint.directory``, ``trainer.base.storage``, ``trainer.money``), Airflow's api_fastapi
and FastAPI.
Nothing imports it but Airflow's plugin manager.
"""

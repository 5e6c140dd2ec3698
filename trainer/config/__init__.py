"""The trainer's settings: every field declared once (``fields``), the job's config and its exit codes
(``job_config``: ``TrainConfig``), its sections (``sections``) and the model shapes a config names
(``flavors``).

May import: ``base``, ``money`` (``capacity``: the capacity words a config names). Standard library
only: the provider imports it at DAG-parse time.
"""

"""A training job as the provider takes it: ``spec`` (the ``JobSpec``: the trainer's config and the shape of
its pod group), ``checks`` (what looks at more than one field), ``resources`` (a node's CPU, memory and GPUs),
``entrypoint`` (what each process runs) and ``naming`` (the names of a task's groups, a job's default paths).

May import: ``errors``, ``kubernetes`` (``KubernetesSpec``), ``trust`` (the backends) and, of the
trainer, ``config`` and ``money``: DAG files build a ``JobSpec`` at parse time, so nothing that imports
torch.
"""

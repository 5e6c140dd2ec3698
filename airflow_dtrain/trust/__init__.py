"""Who may do what: ``limits`` (what a trigger, a DAG's author and the platform admin may each choose, and
the one place that enforces it), ``ownership`` (a job's directories belong to its owner) and ``roots`` (the
storage roots every path must lie under, below both).

May import: ``aws`` (the queues), ``errors``, ``launchers`` (the state directory) and, of the trainer,
``base``, ``checkpoint`` and ``config``: never ``job`` or ``session``, which it checks.
"""

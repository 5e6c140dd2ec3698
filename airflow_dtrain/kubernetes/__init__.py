"""The ``kubernetes`` backend: a pod group as a ConfigMap, a headless Service and an Indexed Job.

``objects`` renders them from a ``JobSpec`` (pure, no client) from ``names`` (labels,
annotations), ``container`` (the trainer container) and ``pod_template`` (the pod and its
scheduling). ``launcher`` creates and watches them through the cncf.kubernetes provider's hook
(``api``), with ``memory`` (what a Job remembers of earlier groups), ``group_logs`` and
``checkpoint_now``; ``status`` turns what it sees into a group's state. ``nodes`` tells the
spot interruption watch which nodes (and EC2 instances) a group's pods run on, and their
interruption taints. Importing this package imports no kubernetes client.
"""

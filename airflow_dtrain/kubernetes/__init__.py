"""The ``kubernetes`` backend: a pod group as a ConfigMap, a headless Service and an Indexed Job.

``objects`` renders them from a ``JobSpec`` (pure, no client), ``launcher`` creates and
watches them through the cncf.kubernetes provider's hook, ``status`` turns what it sees
into a group's state. ``nodes`` tells the spot interruption watch which nodes (and EC2
instances) a group's pods run on, and their interruption taints. Importing this package
imports no kubernetes client.
"""

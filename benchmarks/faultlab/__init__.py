"""The fault-injection benchmark's parts (``benchmarks/faults.py`` runs them): a trainer run and its
checkpoints (``runs``, ``checkpoints``), the faults (``process_faults``: signals and kills;
``corruption``: damaged checkpoints; ``resource_faults``: a full disk, a spend cap, a second writer),
and their table and verdicts (``report``).
"""

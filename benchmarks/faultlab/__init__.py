"""The fault-injection benchmark's parts (``benchmarks/faults.py`` runs them): a trainer run and its
checkpoints (``runs``, ``checkpoints``), the faults (``process_faults``: signals and kills;
``corruption``: damaged checkpoints; ``resource_faults``: a full disk, a spend cap, a second writer;
``s3_faults``: S3 answering 500/503 through ``s3_server``'s fault front on moto; ``time_faults``: a slow
disk under an async save, a clock 5 minutes off), and their table and verdicts (``report``).
"""

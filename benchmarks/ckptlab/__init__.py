"""The checkpoint benchmark's parts (``benchmarks/checkpoint.py`` runs them): the disk's own write and
read, the references a save is measured against (``disk``).
"""

"""The data-throughput benchmark's parts (``benchmarks/data_throughput.py`` runs them): the measuring
processes (``workers``), the data path's and the trainer's rates (``rates``), and the peak memory of an
init_from load (``model_memory``).
"""

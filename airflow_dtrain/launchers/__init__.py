"""Pod-group backends: ``local`` (processes on this machine) and ``kubernetes`` (an Indexed Job).

``base`` is the interface, ``factory`` picks a backend (importing it only then), ``torchrun``
builds the command every node runs. Nothing here imports a backend at import time.
"""

"""A task's pod groups from their first launch to their end: ``group`` (``GroupSession``: attach or launch,
relaunch from the latest checkpoint, stop), ``watch`` (``GroupWatch``: one running group, a poll at a time,
with its prices, size and budget deadline) and ``money`` (what the groups cost: their spend files, their
bills and the stop at the budget, a mixin of ``GroupSession``).

May import: ``aws``, ``job``, ``launchers``, ``metrics``, ``status_line`` and, of the trainer,
``checkpoint``, ``config`` and ``money``: never an operator, a sensor or a trigger, which are above it.
"""

"""A task's pod groups from their first launch to their end: ``group`` (``GroupSession``: attach or launch,
watch, relaunch from the latest checkpoint, stop) and ``money`` (what the groups cost: their spend files,
their bills and the stop at the budget, a mixin of ``GroupSession``).
"""

"""Token data: the built-in corpus (``builtin_text``), the token store and its reader (``token_store``),
and each rank's batches (``loader``).

May import: ``base``, ``config``, ``trainer.events``.
"""

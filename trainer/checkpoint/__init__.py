"""Checkpoints: the directory's layout and its one reader (``directory``, with ``spend_files`` and
``lease_files``), the errors they share (``errors``), reading without running anything (``safe_pickle``,
``reader``), and the checkpointer (``checkpointer``), one concern a module: ``context``, ``lease`` (one
writer), ``state``, ``save``, ``commit``, ``failure``, ``resume`` (verified) and ``faults`` (a test's seam).

May import: ``base``, ``config``, ``data`` (a resume checks the token store), ``money``, ``report``,
``torch_private``, ``trainer.validate`` (the checks a resume runs). ``directory`` and its parts are
standard library only: the provider imports them at DAG-parse time.
"""

"""What the trainer reports: metrics and JSON lines (``metrics``), progress.json (``progress``), what a
save and the spend report (``checkpoint_reports``) and the evaluation report (``eval_report``).

May import: ``base``, ``config``, ``checkpoint``, ``money``, ``step`` (the process group it logs on),
``trainer.events``.
"""

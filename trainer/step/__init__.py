"""One training step and the parts of an attempt: the process group and its agreed stops
(``process_group``), the step itself (``train_step``), the auto micro-batch (``auto_batch``) and the
attempt's parts, each refused early (``setup``).

May import: ``base``, ``config``, ``data``, ``model``, ``checkpoint``, ``money``, ``report``,
``torch_private``, ``trainer.contract``.
"""

"""A group's processes across worlds: the rendezvous round and store (``rdzv_round``, ``rdzv_store``),
kept training processes (``worker_host``, ``forked_worker``, ``workers``), compiling before a join
(``warm_join``), where a start went (``startup``) and a pod's checkpoint-now requests
(``checkpoint_requests``).

May import: ``base``, ``config``, ``data``, ``model``, ``step``, ``report``, ``torch_private``, and the
entry points it runs (``trainer.__main__``), ``trainer.contract``. With ``torch_private`` and
``trainer.launch``, the only code that imports torch's elastic agent.
"""

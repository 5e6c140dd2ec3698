"""A training process forked from its node's fork server (``trainer.launch``), where torch and the
trainer are already imported: ``python -u -m trainer <args>`` without the interpreter's start-up and
imports, at a node's first start and at every restart of its workers (an elastic group's resize)."""

from __future__ import annotations

import os
import sys


def run(*argv: str) -> None:
    """``python -u -m trainer *argv``: in this local rank's host where an elastic group keeps one
    (``trainer/elastic/worker_host.py``), else in this process. Exits with the trainer's exit code."""
    from trainer.elastic.worker_host import prepare, run_in_host

    code = run_in_host(int(os.environ.get("LOCAL_RANK", "0")), list(argv))
    if code is None:
        prepare(int(os.environ.get("RANK", "0")))
        from trainer.__main__ import main

        sys.argv = [sys.argv[0], *argv]
        code = main(list(argv))
    if code:
        sys.exit(code)

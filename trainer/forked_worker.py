"""A training process forked from its node's fork server (``trainer.launch``), where torch and the
trainer are already imported: ``python -u -m trainer <args>`` without the interpreter's start-up and
imports, at a node's first start and at every restart of its workers (an elastic group's resize)."""

from __future__ import annotations

import os
import sys

from trainer.workers import name_this_process


def run(*argv: str) -> None:
    """``python -u -m trainer *argv`` in this process: exits with the trainer's exit code."""
    name_this_process(int(os.environ.get("RANK", "0")))
    if threads := os.environ.get("OMP_NUM_THREADS"):  # the worker's, whatever the fork server's OpenMP read
        import torch

        torch.set_num_threads(int(threads))
    for stream in (sys.stdout, sys.stderr):
        stream.reconfigure(line_buffering=True)  # as -u: each line reaches the node's log whole, at once
    from trainer.__main__ import main

    sys.argv = [sys.argv[0], *argv]
    code = main(list(argv))
    if code:
        sys.exit(code)

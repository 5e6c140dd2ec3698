"""Checkpointing, one concern a module; trainer/checkpoint.py's Checkpointer composes them.

- context.py: what every part shares (the storage, the ranks, the checkpoint's own process group).
- lease.py: the writer lease and the fence (one writer per directory).
- state.py: the training state DCP saves (RNG states packed as tensors, the async stager).
- save.py: a save, synchronous or async (staged to host memory), one in flight at a time.
- commit.py: the commit rule: every rank hashes (and uploads) its files, then rank 0 writes the manifest.
- failure.py: a save that fails: the cause in one line, the partial step directory removed.
- resume.py: verified resume: the newest checkpoint that verifies, checked against this run, loaded.
- faults.py: the seam a test injects faults through (production: none).
"""

"""StopRequests.agree never drops a SIGUSR1 that lands while the ranks agree."""

import signal

import torch.distributed as dist

from trainer.step.process_group import StopRequests


def test_a_checkpoint_request_during_the_collective_is_kept_for_the_next_boundary(monkeypatch):
    handlers = {}
    monkeypatch.setattr(signal, "signal", lambda sig, handler: handlers.setdefault(sig, handler))
    stops = StopRequests()
    calls = []

    def all_reduce(flags, op=None):  # the other rank is slow: SIGUSR1 arrives while this rank waits
        calls.append(flags.tolist())
        if len(calls) == 1:
            handlers[signal.SIGUSR1](signal.SIGUSR1, None)

    monkeypatch.setattr(dist, "all_reduce", all_reduce)
    assert stops.agree() == (False, False, False)
    assert stops.agree() == (False, True, False), "the request that landed during the first agree is honoured"
    assert stops.agree() == (False, False, False)

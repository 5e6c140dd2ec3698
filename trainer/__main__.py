"""``python -m trainer [--config FILE] [--steps N] [--checkpoint-uri U] [--optim-lr X] ...
[--set dotted.key=value ...]``

Every field of the training config is a flag, named after its dotted path
(``checkpoint.every`` is ``--checkpoint-every``; the operator's short names such as
``--flavor`` and ``--lr`` work too): the flags are generated from the field definitions
in ``trainer/config/job_config.py``. Flags override the config file; ``--set`` overrides anything
(applied last, in order). A bad configuration prints the ConfigError to stderr and exits
2 before training.
"""

import argparse
import sys

from trainer.checkpoint.errors import CheckpointStorageError, WriterFenced
from trainer.contract import die_with_agent  # stdlib only; shared with programs of your own
from trainer.config.job_config import FENCED_EXIT_CODE, STORAGE_EXIT_CODE, WORKER_LOST_EXIT_CODE, TrainConfig
from trainer.config.fields import ConfigError, add_arguments
from trainer.base.say import say
from trainer.elastic.startup import StartupClock  # stdlib only
from trainer.elastic.workers import remember_a_stop, stopped_for_good  # stdlib only


def parse_config(argv: list[str]) -> TrainConfig:
    p = argparse.ArgumentParser(prog="python -m trainer", description=__doc__.split("\n\n")[1])
    p.add_argument("--config", help="a .json or .toml TrainConfig file")
    p.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="any dotted field, repeatable"
    )
    fields = add_arguments(p, TrainConfig)
    args = p.parse_args(argv)

    cfg = TrainConfig.from_file(args.config) if args.config else TrainConfig()
    overrides = {
        dotted: getattr(args, dest) for dest, dotted in fields.items() if getattr(args, dest) is not None
    }
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--set: expected dotted.key=value, got {item!r}")
        overrides[key.strip()] = value
    return cfg.with_overrides(overrides)


def main(argv: list[str] | None = None) -> int:
    die_with_agent()
    if (code := stopped_for_good()) is not None:  # torch's agent restarted a node that stopped for good
        say(f"[trainer] this node's workers stopped for good (exit {code}): exit {code} again, nothing built")
        return code
    try:
        code = _main(argv)
    except BaseException:
        remember_a_stop(1)
        raise
    remember_a_stop(code)
    return code


def _main(argv: list[str] | None) -> int:
    startup = StartupClock()
    try:
        cfg = parse_config(sys.argv[1:] if argv is None else argv)
        from trainer.train import train  # torch: only once the config is good
        from trainer.step.process_group import world_size_from_env
        from trainer.checkpoint.faults import faults_from_env  # none unless DTRAIN_FAULTS names some

        cfg.validate_world_size(world_size_from_env())
        startup.mark("imports")
    except ConfigError as e:
        say(f"config error: {e}")
        return 2
    try:
        return train(cfg, step_hook=faults_from_env().after_step, startup=startup)
    except ConfigError as e:  # found while starting up (e.g. data.dataset is not a token directory)
        say(f"config error: {e}")
        return 2
    except WriterFenced as e:
        say(f"[trainer] fenced off, exit {FENCED_EXIT_CODE}: {e}")
        return FENCED_EXIT_CODE
    except CheckpointStorageError as e:
        # One line, no traceback: the path and the cause are the whole story (every rank that knows says it:
        # the first to exit takes its peers down, so rank 0 may not live to print it).
        say(f"[trainer] exit {STORAGE_EXIT_CODE}: {e}")
        return STORAGE_EXIT_CODE
    except Exception as e:
        if not peer_lost(e):
            raise
        # A collective timed out or its connection broke: a peer hung or vanished (a node lost, a rank
        # killed on another node). Nothing of this step was saved; the group resumes from its last
        # checkpoint.
        why = f"{type(e).__name__}: {str(e).splitlines()[0]}"
        say(f"[trainer] lost a peer, exit {WORKER_LOST_EXIT_CODE}: {why}")
        return WORKER_LOST_EXIT_CODE


_PEER_LOST = ("timed out", "timeout", "connection closed by peer", "connection reset by peer", "broken pipe")


def peer_lost(error: BaseException) -> bool:
    """Whether ``error`` says a collective's peer hung or vanished (not a bug of this process)."""
    import torch.distributed as dist

    if isinstance(error, (dist.DistNetworkError, dist.DistStoreError)):
        return True
    message = str(error).lower()
    return isinstance(error, (dist.DistBackendError, RuntimeError)) and any(m in message for m in _PEER_LOST)


if __name__ == "__main__":
    sys.exit(main())

"""``python -m trainer [--config FILE] [--steps N] [--checkpoint-uri U] [--optim-lr X] ... [--set dotted.key=value ...]``

Every field of the training config is a flag, named after its dotted path
(``checkpoint.every`` is ``--checkpoint-every``; the operator's short names such as
``--flavor`` and ``--lr`` work too): the flags are generated from the field definitions
in ``trainer/config.py``. Flags override the config file; ``--set`` overrides anything
(applied last, in order). A bad configuration prints the ConfigError to stderr and exits
2 before training.
"""

import argparse
import sys

from trainer.config import ConfigError, TrainConfig
from trainer.fields import add_arguments


def parse_config(argv: list[str]) -> TrainConfig:
    p = argparse.ArgumentParser(prog="python -m trainer", description=__doc__.split("\n\n")[1])
    p.add_argument("--config", help="a .json or .toml TrainConfig file")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="any dotted field, repeatable")
    fields = add_arguments(p, TrainConfig)
    args = p.parse_args(argv)

    cfg = TrainConfig.from_file(args.config) if args.config else TrainConfig()
    overrides = {dotted: getattr(args, dest) for dest, dotted in fields.items() if getattr(args, dest) is not None}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--set: expected dotted.key=value, got {item!r}")
        overrides[key.strip()] = value
    return cfg.with_overrides(overrides)


def main(argv: list[str] | None = None) -> int:
    try:
        cfg = parse_config(sys.argv[1:] if argv is None else argv)
        from trainer.train import train, world_size_from_env  # torch: only once the config is good

        cfg.validate_world_size(world_size_from_env())
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    try:
        return train(cfg)
    except ConfigError as e:  # found while starting up (e.g. data.dataset is not a token directory)
        print(f"config error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

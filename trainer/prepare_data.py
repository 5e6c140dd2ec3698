"""``python -m trainer.prepare_data --input FILE... --out DIR [--val-fraction F]``

Tokenises UTF-8 text files byte-level (vocab 256) into the trainer's token format
(see trainer/data.py). Files are joined with a blank line; the last --val-fraction of
each file's bytes goes to the held-out split, so every source is represented in both.
"""

import argparse
import os
import sys

from trainer.data import DOC_SEPARATOR, write_token_dir


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m trainer.prepare_data", description=__doc__.split("\n\n")[0])
    p.add_argument("--input", nargs="+", required=True, metavar="FILE")
    p.add_argument("--out", required=True, metavar="DIR")
    p.add_argument("--val-fraction", type=float, default=0.05)
    args = p.parse_args(argv)
    if not 0 < args.val_fraction < 1:
        print(f"--val-fraction: must be in (0, 1), got {args.val_fraction}", file=sys.stderr)
        return 2
    if os.path.exists(args.out):
        print(f"--out: {args.out} already exists; remove it or choose another directory", file=sys.stderr)
        return 2
    train, val = [], []
    for path in args.input:
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as e:
            print(f"--input: cannot read {path}: {e.strerror}", file=sys.stderr)
            return 2
        cut = len(data) - max(1, int(len(data) * args.val_fraction))
        train.append(data[:cut])
        val.append(data[cut:])
    train_bytes, val_bytes = DOC_SEPARATOR.join(train), DOC_SEPARATOR.join(val)
    write_token_dir(args.out, train_bytes, val_bytes, source=", ".join(os.path.basename(p) for p in args.input))
    print(f"wrote {args.out}: {len(train_bytes)} train tokens, {len(val_bytes)} held-out tokens", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

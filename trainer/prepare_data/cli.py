"""The command line: ``python -m trainer.prepare_data --input PATH... --out DIR|s3://... [options]``."""

import argparse

from trainer.prepare_data.errors import PrepareError
from trainer.prepare_data.pipeline import prepare
from trainer.prepare_data.rows import BAD_ROW_POLICIES
from trainer.base.say import say
from trainer.data.token_store import DEFAULT_SHARD_TOKENS

DESCRIPTION = (
    "Tokenises documents into the trainer's token store (format: trainer/data/token_store.py), streaming: "
    "documents are read and tokenised in batches and shards are written as they fill, so memory "
    "does not grow with the corpus. The same is ``prepare(inputs, out, ...)`` for a DAG task."
)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m trainer.prepare_data", description=DESCRIPTION)
    p.add_argument(
        "--input",
        nargs="+",
        required=True,
        metavar="PATH",
        help=".txt, .jsonl/.json, .parquet files, datasets save_to_disk directories, directories "
        "of such files, or globs (quoted: '/data/shards/*.jsonl')",
    )
    p.add_argument("--out", required=True, metavar="DIR|s3://...")
    p.add_argument(
        "--tokenizer", metavar="FILE|DIR", help="tokenizer.json or a model directory (default: byte-level)"
    )
    p.add_argument(
        "--text-field", default="text", help="the JSON field / column with the text (default: text)"
    )
    p.add_argument("--val-fraction", type=float, default=0.05)
    p.add_argument(
        "--seq-len",
        type=int,
        metavar="N",
        help="the training sequence length: both splits then hold at least N + 1 tokens",
    )
    p.add_argument(
        "--on-bad-row",
        choices=BAD_ROW_POLICIES,
        default="error",
        help="a row without text (null, not a string, not UTF-8, not JSON): error (default) "
        "refuses it naming the file and line; skip counts it and logs the first few",
    )
    p.add_argument("--shard-tokens", type=int, default=DEFAULT_SHARD_TOKENS, metavar="N")
    return p


def main(argv: list[str] | None = None) -> int:
    """Prepare the store the arguments name; exit status 2 with the message for a bad option or input."""
    args = _parser().parse_args(argv)
    try:
        prepare(
            args.input,
            args.out,
            tokenizer=args.tokenizer,
            text_field=args.text_field,
            val_fraction=args.val_fraction,
            shard_tokens=args.shard_tokens,
            log=lambda m: print(m, flush=True),
            on_bad_row=args.on_bad_row,
            seq_len=args.seq_len,
        )
    except PrepareError as e:
        say(e)
        return 2
    return 0

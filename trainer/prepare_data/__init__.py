"""``python -m trainer.prepare_data --input PATH... --out DIR|s3://... [--tokenizer FILE|DIR]
[--text-field text] [--val-fraction F] [--seq-len N] [--on-bad-row error|skip] [--shard-tokens N]``

Tokenises documents into the trainer's token store (format: trainer/data/token_store.py), streaming:
documents are read and tokenised in batches and shards are written as they fill, so memory does not grow
with the corpus. The same is ``trainer.prepare_data.pipeline.prepare(inputs, out, ...)`` for a DAG task.

Inputs, by their form:

* ``.txt`` (also .text, .md): one document per file, read in blocks of whole lines (a line longer
  than 4 MiB is cut before a space, so a file without newlines is still read in bounded blocks); the
  last --val-fraction of its bytes is a held-out document, so every file is in both splits.
* ``.jsonl`` / ``.json`` (JSON lines) and ``.parquet``: one document per line / row, from the
  --text-field field / column (parquet read in record batches); every 1/F-th document is held out,
  counted across all the inputs.
* a directory saved by Hugging Face ``datasets`` (``save_to_disk``): a Dataset is split as above;
  a DatasetDict trains on "train" and holds out "validation" (or else "test") when it has one.
* a directory of shards (local or s3://): its files in name order, all of one of the forms above
  (names starting with "." or "_", such as _SUCCESS or .crc files, are not data); or a glob
  (``/data/shards/*.jsonl``, ``s3://bucket/c4/part-*.parquet``): its matching files in name order.

Bad rows (a null, a number or another non-string where the text should be, bytes that are not UTF-8,
a lone surrogate such as "\\ud800", a line that is not JSON, a line without the field) are refused
(--on-bad-row=error, the default: the message names the file and the line, or the row) or counted and
skipped (--on-bad-row=skip: the count and the first few places are logged and kept in meta.json's
"bad_rows"). One policy for every form, so the same data gives the same store whatever its format.
Lines count from 1, as editors number them; rows from 0, as pyarrow, pandas and datasets index them.
A file that is binary, compressed or of another format under a text name is refused whatever the policy.

Held out: at least one document, and with --seq-len at least one evaluation sequence (seq_len + 1 tokens):
when every 1/F-th document gives less (a corpus of fewer than 1/F documents, say), the newest training
documents are held out instead. Data too small for that and a training sequence besides is refused
with its counts: a store the trainer can train on can be evaluated.

Tokenizer: without --tokenizer, byte-level (vocab 256). With it, a Hugging Face ``tokenizers``
tokenizer.json, or a model directory holding one (or a tokenizer ``transformers`` can convert).
Each document ends with the tokenizer's EOS id (tokenizer_config.json's eos_token, else a special
token named <|end_of_text|>, <|endoftext|>, </s> or <eos>); a tokenizer without one ends each
document with the encoding of a blank line ("\\n\\n"), as byte-level stores always have.
A document's first block is encoded with the tokenizer's special tokens (a BOS its
post-processor adds, say); the continuation blocks of a long .txt are not.
"""

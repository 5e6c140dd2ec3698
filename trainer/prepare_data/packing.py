"""Tokenizing and packing: pieces are encoded in batches (a document's first block with the tokenizer's
special tokens, continuation blocks without), each document followed by the separator, into the split's
shards; training documents pass through the HeldBack, so the held-out split can take the newest."""

import time

import numpy as np

from trainer.prepare_data.errors import PrepareError
from trainer.prepare_data.held_out import HeldBack
from trainer.prepare_data.readers import Piece
from trainer.prepare_data.rows import Rows
from trainer.prepare_data.shards import ShardWriter, Sink
from trainer.prepare_data.tokenizer import HFTokenizer

BATCH_CHARS = 8 << 20  # encode_batch once this much text is pending
BATCH_PIECES = 4096  # ... or once this many pieces are
LOG_EVERY_S = 10.0


def separator_ids(tok) -> np.ndarray:
    """What ends each document: the tokenizer's EOS id, else the encoding of a blank line."""
    if tok.eos_id is not None:
        return np.array([tok.eos_id], dtype=np.int64)
    return tok.encode(["\n\n"], False)[0].astype(np.int64)


def decode(piece: Piece) -> str:
    """A .txt block as text, for a tokenizer; a file that is not UTF-8 is refused where it stops being so."""
    if isinstance(piece.text, str):
        return piece.text
    try:
        return piece.text.decode("utf-8")
    except UnicodeDecodeError as e:
        raise PrepareError(
            f"--input: {piece.where} byte {piece.offset + e.start}: not UTF-8 text (0x"
            f"{piece.text[e.start]:02x}): tokenizers read text; prepare it byte-level (no "
            "--tokenizer) or re-encode it"
        ) from None


class Packer:
    """Both splits' shard writers and the batch of pieces waiting to be encoded."""

    def __init__(self, sink: Sink, tok, dtype: str, shard_tokens: int, need: int, rows: Rows, log):
        self.tok, self.rows, self.log = tok, rows, log
        self.separator = separator_ids(tok)
        self.writers = {s: ShardWriter(sink, s, dtype, shard_tokens) for s in ("train", "val")}
        self.held = HeldBack(self.writers["train"], self.separator, need)
        self.pending: list[Piece] = []
        self.chars = 0
        self.started = self.last_log = time.monotonic()

    def pack(self, pieces) -> None:
        """Encode and write every piece, a batch at a time, with a progress line every LOG_EVERY_S."""
        for piece in pieces:
            self.pending.append(piece)
            self.chars += len(piece.text)
            if self.chars >= BATCH_CHARS or len(self.pending) >= BATCH_PIECES:
                self.flush()
                if time.monotonic() - self.last_log >= LOG_EVERY_S:
                    self.progress()
                    self.last_log = time.monotonic()
        self.flush()

    def _encoded(self) -> dict[int, np.ndarray]:
        """The pending pieces' ids by index: first blocks with special tokens, continuations without."""
        encoded: dict[int, np.ndarray] = {}
        for special in (True, False):
            idx = [i for i, p in enumerate(self.pending) if p.first == special]
            texts = [self.pending[i].text for i in idx]
            if isinstance(self.tok, HFTokenizer):
                texts = [decode(self.pending[i]) for i in idx]
            if texts:
                encoded.update(zip(idx, self.tok.encode(texts, special)))
        return encoded

    def flush(self) -> None:
        encoded = self._encoded()
        for i, piece in enumerate(self.pending):
            if piece.split == "train":
                self.held.add(encoded[i], piece)
                continue
            w = self.writers["val"]
            w.add(encoded[i])
            if piece.end:
                w.add(self.separator)
                w.documents += 1
        self.pending.clear()
        self.chars = 0

    def progress(self, final: bool = False) -> None:
        writers, rows = self.writers, self.rows
        elapsed = max(time.monotonic() - self.started, 1e-9)
        tokens = sum(w.tokens for w in writers.values())
        docs = sum(w.documents for w in writers.values())
        self.log(
            f"prepare_data: {'done: ' if final else ''}{docs:,} documents, {tokens:,} tokens "
            f"(train {writers['train'].tokens:,}, held-out {writers['val'].tokens:,} in "
            f"{writers['val'].documents:,} documents){rows.note()}, {tokens / elapsed:,.0f} tokens/s"
        )

    def close(self) -> None:
        for w in self.writers.values():
            w.close()

    def documents(self) -> int:
        """Documents read so far: written to either split or still held back."""
        return self.writers["train"].documents + len(self.held.docs) + self.writers["val"].documents

    def tokens(self) -> int:
        return self.writers["train"].tokens + self.held.held + self.writers["val"].tokens

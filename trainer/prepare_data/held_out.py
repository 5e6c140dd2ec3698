"""The held-out split's floor: the newest training documents are kept back until the end, so that a
held-out split short of one evaluation can take them instead."""

from collections import deque

import numpy as np

from trainer.prepare_data.readers import Piece
from trainer.prepare_data.shards import ShardWriter


class HeldBack:
    """The newest training documents, kept from the train shards until the end: if the held-out split is
    then short of one evaluation (a corpus of fewer than 1/val_fraction documents, say), the newest of them
    are held out instead. Keeps whole documents of one piece, about `tokens` tokens besides the newest; a
    document of several blocks (a long .txt) goes straight to the shards, so memory stays bounded."""

    def __init__(self, train: ShardWriter, separator: np.ndarray, tokens: int):
        self.train, self.separator, self.tokens = train, separator, tokens
        self.docs: deque[np.ndarray] = deque()
        self.held = 0  # tokens in self.docs, separators included

    def add(self, ids: np.ndarray, piece: Piece) -> None:
        if piece.first and piece.end:
            self.docs.append(ids)
            self.held += len(ids) + len(self.separator)
            while len(self.docs) > 1 and self.held - self._size(self.docs[0]) >= self.tokens:
                self._write(self.docs.popleft())
            return
        if piece.first:
            self.release()  # the documents before this one go first, in order
        self.train.add(ids)
        if piece.end:
            self.train.add(self.separator)
            self.train.documents += 1

    def _size(self, ids: np.ndarray) -> int:
        return len(ids) + len(self.separator)

    def _write(self, ids: np.ndarray, writer: ShardWriter | None = None) -> None:
        writer = writer or self.train
        writer.add(ids)
        writer.add(self.separator)
        writer.documents += 1
        if writer is self.train:
            self.held -= self._size(ids)

    def release(self) -> None:
        while self.docs:
            self._write(self.docs.popleft())

    def hold_out(self, val: ShardWriter, val_tokens: int, train_tokens: int) -> tuple[int, int] | None:
        """Move the newest documents to `val` until it holds a document and `val_tokens` tokens, keeping
        `train_tokens` and a document for training; then write the rest. Returns (documents, tokens)
        moved, or None when the data is too small for both (nothing is moved then)."""
        moved, tokens = 0, 0
        while (val.documents + moved < 1 or val.tokens + tokens < val_tokens) and moved < len(self.docs):
            moved, tokens = moved + 1, tokens + self._size(self.docs[-1 - moved])
        if val.documents + moved < 1 or val.tokens + tokens < val_tokens:
            return None
        train_docs = self.train.documents + len(self.docs) - moved
        if train_docs < 1 or self.train.tokens + self.held - tokens < train_tokens:
            return None
        last = [self.docs.pop() for _ in range(moved)][::-1]
        self.held -= tokens
        self.release()
        for ids in last:
            self._write(ids, val)
        return moved, tokens

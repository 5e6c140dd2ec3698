"""The tokenizers a token store is written with: byte-level, or a Hugging Face ``tokenizers`` one."""

import json
import os

import numpy as np

from trainer.prepare_data.errors import PrepareError
from trainer.data.token_store import BYTES_TOKENIZER, BYTES_VOCAB, TOKENIZER_FILES, canonical_sha256

EOS_NAMES = ("<|end_of_text|>", "<|endoftext|>", "</s>", "<eos>")


class ByteTokenizer:
    """Byte-level: a token id is the byte value."""

    identity = BYTES_TOKENIZER
    vocab_size = BYTES_VOCAB
    eos_id = None
    files: dict = {}

    def encode(self, texts: list[str | bytes], special: bool) -> list[np.ndarray]:
        return [np.frombuffer(t if isinstance(t, bytes) else t.encode(), dtype=np.uint8) for t in texts]


class HFTokenizer:
    """A Hugging Face ``tokenizers`` tokenizer, from tokenizer.json or a model directory."""

    def __init__(self, spec: str):
        from tokenizers import Tokenizer

        self.files = {}  # name in the store's tokenizer/ -> local source path
        if os.path.isdir(spec):
            for name in TOKENIZER_FILES:
                if os.path.exists(os.path.join(spec, name)):
                    self.files[name] = os.path.join(spec, name)
            name = os.path.basename(os.path.normpath(spec))
        elif os.path.isfile(spec):
            self.files["tokenizer.json"] = spec
            parent = os.path.dirname(os.path.abspath(spec))
            for extra in TOKENIZER_FILES[1:]:
                if os.path.exists(os.path.join(parent, extra)):
                    self.files[extra] = os.path.join(parent, extra)
            stem = os.path.splitext(os.path.basename(spec))[0]
            name = os.path.basename(parent) if stem == "tokenizer" else stem
        else:
            raise PrepareError(f"--tokenizer: {spec} is neither a tokenizer.json nor a directory")
        if "tokenizer.json" in self.files:
            raw = open(self.files["tokenizer.json"], "rb").read()
            try:
                self.tok = Tokenizer.from_str(raw.decode())
            except Exception as e:  # noqa: BLE001 - the library's own words, with the file named
                raise PrepareError(
                    f"--tokenizer: {self.files['tokenizer.json']} is not a tokenizers JSON file: {e}"
                ) from None
        else:  # a directory with only a slow tokenizer (sentencepiece, ...): let transformers convert it
            self.tok, raw = self._converted(spec)
        self.json_bytes = raw
        self.vocab_size = self.tok.get_vocab_size(with_added_tokens=True)
        self.identity = {
            "kind": "hf",
            "name": name,
            "sha256": canonical_sha256(raw),
            "vocab_size": self.vocab_size,
        }
        self.eos_id = self._eos_id()

    def _converted(self, spec: str):
        try:
            from transformers import AutoTokenizer
        except ImportError:
            raise PrepareError(
                f"--tokenizer: {spec} has no tokenizer.json (converting another tokenizer "
                "needs the transformers package)"
            ) from None
        try:
            fast = AutoTokenizer.from_pretrained(spec, use_fast=True)
        except Exception as e:  # noqa: BLE001
            raise PrepareError(
                f"--tokenizer: {spec} has no tokenizer.json and transformers cannot load it: {e}"
            ) from None
        backend = getattr(fast, "backend_tokenizer", None)
        if backend is None:
            raise PrepareError(f"--tokenizer: {spec} has no tokenizer.json and no fast tokenizer conversion")
        return backend, backend.to_str().encode()

    def _eos_id(self) -> int | None:
        if "tokenizer_config.json" in self.files:
            with open(self.files["tokenizer_config.json"]) as f:
                eos = json.load(f).get("eos_token")
            if isinstance(eos, dict):
                eos = eos.get("content")
            if isinstance(eos, str) and self.tok.token_to_id(eos) is not None:
                return self.tok.token_to_id(eos)
        for name in EOS_NAMES:
            if self.tok.token_to_id(name) is not None:
                return self.tok.token_to_id(name)
        return None

    def encode(self, texts: list[str], special: bool) -> list[np.ndarray]:
        dtype = np.uint32 if self.vocab_size > 1 << 16 else np.uint16
        return [
            np.asarray(e.ids, dtype=dtype) for e in self.tok.encode_batch(texts, add_special_tokens=special)
        ]


def load_tokenizer(spec: str | None):
    return ByteTokenizer() if spec is None else HFTokenizer(spec)

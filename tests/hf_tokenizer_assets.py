"""Tiny Hugging Face tokenizers built locally for the tests (no download)."""

import os

EOS = "<|end_of_text|>"
CORPUS = [
    "the quick brown fox jumps over the lazy dog. ",
    "a small red cat sees the old house near the river. ",
    "we count one, two, three, four and five birds today. ",
    "did the dog follow the cat? yes, the dog followed the cat.\n",
]


def tiny_tokenizer(path, *, vocab_size: int, corpus: list[str] | None = None, name: str | None = None) -> str:
    """Train a byte-level BPE on `corpus` and save it as a model directory at `path`; returns the path.

    The directory holds tokenizer.json and tokenizer_config.json (eos_token <|end_of_text|>), so
    both ``tokenizers.Tokenizer.from_file`` and ``transformers.AutoTokenizer`` load it. The
    alphabet is the corpus's characters only (not all 256 bytes), so a vocabulary under 256 fits
    the debug model; past what the corpus can teach, the vocabulary is padded with added tokens
    ``<|extra_N|>`` (how a vocabulary above 65,535 is made in a fraction of a second).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    path = str(path)
    os.makedirs(path, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=min(vocab_size, 2000), special_tokens=[EOS], show_progress=False)
    tok.train_from_iterator((corpus or CORPUS) * 20, trainer=trainer)
    missing = vocab_size - tok.get_vocab_size(with_added_tokens=True)
    if missing > 0:
        tok.add_tokens([f"<|extra_{i}|>" for i in range(missing)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS)
    fast.save_pretrained(path)
    return path

"""The built-in demo corpus: English-like text from a small grammar, generated (no download).

Standard library only, so that a DAG task can tokenise it with a real tokenizer without
importing torch (``airflow_dtrain.operators.prepare_data``); the trainer stores it byte-level
(``trainer.data.loader.ensure_builtin``).
"""

import random

BUILTIN_NAME = "builtin-v1"  # bump when the generator below changes, so caches are rebuilt
BUILTIN_TRAIN_BYTES = 2_000_000
BUILTIN_VAL_BYTES = 100_000
DOC_SEPARATOR = b"\n\n"


NAMES = ["Ada", "Ben", "Clara", "Dev", "Ella", "Finn", "Grace", "Hugo", "Iris", "Jon"]
ADJS = [
    "small",
    "red",
    "quiet",
    "bright",
    "old",
    "young",
    "happy",
    "tired",
    "clever",
    "green",
    "heavy",
    "warm",
]
NOUNS = ["cat", "dog", "bird", "tree", "river", "house", "garden", "train", "book", "lamp", "horse", "child"]
VERBS = [
    ("sees", "see", "saw"),
    ("finds", "find", "found"),
    ("likes", "like", "liked"),
    ("follows", "follow", "followed"),
    ("watches", "watch", "watched"),
    ("paints", "paint", "painted"),
]
PREPS = ["near", "under", "behind", "beside", "above", "inside"]
ADVS = ["slowly", "quickly", "happily", "today", "again", "at night"]
NUMBERS = ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]


class _Grammar:
    """The sentences of the demo corpus, drawn from one seeded generator (the draws' order is the corpus:
    changing it changes every cache, see BUILTIN_NAME)."""

    def __init__(self, seed: int):
        self.rng = random.Random(seed)

    def noun_phrase(self, plural: bool) -> str:
        rng = self.rng
        noun = rng.choice(NOUNS)
        noun = noun + ("ren" if noun == "child" else "es" if noun.endswith("s") else "s") if plural else noun
        return f"the {rng.choice(ADJS)} {noun}" if rng.random() < 0.6 else f"the {noun}"

    def sentence(self) -> str:
        rng, np_ = self.rng, self.noun_phrase
        kind = rng.randrange(6)
        v = rng.choice(VERBS)
        if kind == 0:  # subject-verb agreement
            plural = rng.random() < 0.5
            subject = np_(plural).capitalize()
            obj, prep, place = np_(rng.random() < 0.3), rng.choice(PREPS), np_(False)
            return f"{subject} {v[1] if plural else v[0]} {obj} {prep} {place}."
        if kind == 1:
            return f"{rng.choice(NAMES)} {v[2]} {np_(False)} {rng.choice(ADVS)}."
        if kind == 2:  # question and its answer repeat the words
            a, b = rng.choice(NOUNS), rng.choice(NOUNS)
            return f"Did the {a} {v[1]} the {b}? Yes, the {a} {v[2]} the {b}."
        if kind == 3:  # counting
            start = rng.randrange(7)
            return "We count " + ", ".join(NUMBERS[start : start + 4]) + "."
        if kind == 4:
            n = rng.choice(NAMES)
            return (
                f"{n} has {rng.choice(NUMBERS[1:])} {rng.choice(NOUNS[:6])}s, and {n} is {rng.choice(ADJS)}."
            )
        return f"There is a {rng.choice(NOUNS)} {rng.choice(PREPS)} {np_(False)}."


def generate_builtin_text(n_bytes: int, seed: int) -> bytes:
    """English-like text from a small grammar: learnable structure (spelling, agreement,
    punctuation, recurring names) so that the loss falls clearly within a few hundred steps."""
    grammar = _Grammar(seed)
    out, size = [], 0
    while size < n_bytes:
        doc = " ".join(grammar.sentence() for _ in range(grammar.rng.randint(3, 8)))
        out.append(doc)
        size += len(doc) + len(DOC_SEPARATOR)
    return DOC_SEPARATOR.join(d.encode() for d in out)[:n_bytes]


def builtin_documents(seed: int = 1234) -> list[str]:
    """The built-in corpus (train then held-out bytes, as ``trainer.data.loader`` splits it) as documents."""
    text = generate_builtin_text(BUILTIN_TRAIN_BYTES + BUILTIN_VAL_BYTES, seed=seed)
    return [doc for doc in text.decode().split("\n\n") if doc]

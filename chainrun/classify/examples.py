"""Nearest examples: a message gets the label of the labelled examples closest to it in
embedding space (k-nearest neighbours, cosine similarity, votes weighted by the squared
similarity, :data:`VOTE_POWER`).

With MiniLM (all-MiniLM-L6-v2, run in NumPy: :mod:`chainrun.retrieval.embeddings`) one
message costs one forward pass (about 5-25 ms on 2 cores) and no model server call. The
examples are embedded once, on first use (:meth:`NearestExamples.warm`): with the local
embedders (MiniLM, hash) once per process, and the shipped examples
(:data:`DEFAULT_EXAMPLES`) not at all with MiniLM, whose vectors of them ship beside
them (:data:`DEFAULT_VECTORS`). The shipped examples are of two kinds: 151 written for
this purpose (not the regression eval set's messages, which measure the classifier),
and 677 rows of public corpora's training splits, each naming its ``source``: 500
out-of-scope requests for ``other`` (CLINC150's ``oos_train`` and eight of its intents
a clothes shop does not serve), 50 order-status requests for ``order_status``
(CLINC150's ``order_status``) and 127 refund requests for ``returns`` (Bitext's
``get_refund`` and ``track_refund``, BANKING77's ``request_refund`` and
``Refund_not_showing_up``, without the rows on which a single keyword rule names
another label); evals/corpora/ holds them with their licences.

**Out of scope.** A message whose most similar example of a shop label (any label but
``other``) is less similar than :data:`OUT_OF_SCOPE_BELOW` is ``other`` whatever the
vote says: nothing the shop's examples ask resembles it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from chainrun.classify.base import FALLBACK_LABEL, Classification, shares
from chainrun.errors import InputFileError
from chainrun.retrieval.embeddings import Embedder, HashEmbedder, MiniLMEmbedder
from chainrun.retrieval.vector import text_hash

#: neighbours that vote: chosen by leave-one-out on the shipped examples (72 of 90 right at
#: k = 11; 58 at 3, 65 at 5, 70 at 9, 71 at 15, 68 at 21), not on the eval set
DEFAULT_K = 11

#: a neighbour's vote is its cosine similarity to this power: with 500 out-of-scope
#: examples shipped, many weakly similar ``other`` neighbours outvoted one close example
#: of a shop label at 1 ("Do I need to print a label?": other 0.48, returns 0.29; at 2:
#: returns 0.45, other 0.38). Chosen with :data:`OUT_OF_SCOPE_BELOW`, on training data only
#: (``python benchmarks/routes_public.py --tune``, benchmarks/README.md); with the 677
#: public rows shipped now the grid's mean is 0.0021 higher at 1 (one row fewer of 210
#: cross-validated, six more of 677 public rows), not a measurable difference, and at 1
#: that message is ``other`` again, so 2 stays
VOTE_POWER = 2

#: cosine similarity (MiniLM) below which a message that resembles no example of a shop
#: label is out of scope (``other``). Chosen with :data:`VOTE_POWER` on training data only,
#: as the pair with the best mean of two accuracies: the combined method's cross-validated
#: accuracy on the team's examples and the regression cases (193.7 of 210 right, mean of 3
#: repeats; 195.3 without a threshold) and the public training rows' when their source is
#: left out (612 of 677; 558 without); ``python benchmarks/routes_public.py --tune``
OUT_OF_SCOPE_BELOW = 0.38

#: labelled examples shipped with chainrun: JSONL lines ``{"label": ..., "message": ...}``
DEFAULT_EXAMPLES = Path(__file__).resolve().parent.parent / "data" / "classify_examples.jsonl"

#: all-MiniLM-L6-v2 vectors of the shipped examples (keys ``model``, ``text_hashes``,
#: ``vectors``, as the catalogue's), made by ``python benchmarks/make_classify_vectors.py``:
#: a chain then opens without embedding them (about 1-2 s of CPU on an idle core, each
#: process); an example whose text has no vector there is embedded as usual
DEFAULT_VECTORS = DEFAULT_EXAMPLES.with_name("classify_examples.minilm.npz")


#: the examples' vectors by (embedder, examples): embedded once per process, as every
#: chain a process opens (a server's, each test's) would embed the same 828 messages again
#: (about 1 s on an idle core); only for the local, deterministic embedders
_MATRICES: dict[tuple[object, ...], np.ndarray] = {}


def _matrix_key(embedder: Embedder, messages: Sequence[str]) -> tuple[object, ...] | None:
    if isinstance(embedder, MiniLMEmbedder):
        return ("minilm", str(embedder.model_dir), tuple(messages))
    if isinstance(embedder, HashEmbedder):
        return (embedder.model, tuple(messages))
    return None


def seeded_vectors(
    model: str, messages: Sequence[str], seeds: Path = DEFAULT_VECTORS
) -> dict[int, np.ndarray]:
    """The vectors ``seeds`` holds for ``messages`` embedded by ``model``, by the message's
    index (messages it has none for are left out; an unreadable file gives none)."""
    try:
        with np.load(seeds, allow_pickle=False) as f:
            if str(f["model"]) != model:
                return {}
            by_hash = dict(zip((str(h) for h in f["text_hashes"]), f["vectors"], strict=True))
    except (OSError, KeyError, ValueError):
        return {}
    found = {i: by_hash.get(text_hash(model, m)) for i, m in enumerate(messages)}
    return {i: np.asarray(v, dtype=np.float32) for i, v in found.items() if v is not None}


def read_examples(path: str | Path, labels: Sequence[str]) -> list[tuple[str, str]]:
    """The (label, message) pairs of an examples file, every label one of ``labels``.

    Raises:
        InputFileError: the file cannot be read, a line is not such an object, names a
            label outside ``labels``, or the file holds no example (file and line named).
    """
    p = Path(path)
    try:
        lines = p.read_text(encoding="utf-8-sig").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise InputFileError(str(p), None, f"cannot read examples ({e})") from None
    out: list[tuple[str, str]] = []
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            doc = json.loads(line)
        except json.JSONDecodeError as e:
            raise InputFileError(str(p), n, f"not JSON ({e.msg})") from None
        if (
            not isinstance(doc, dict)
            or not isinstance(doc.get("message"), str)
            or not (isinstance(doc.get("label"), str))
        ):
            raise InputFileError(str(p), n, 'expected {"label": "...", "message": "..."}')
        if doc["label"] not in labels:
            raise InputFileError(
                str(p), n, f"label {doc['label']!r} is not one of the step's labels {list(labels)}"
            )
        out.append((doc["label"], doc["message"]))
    if not out:
        raise InputFileError(str(p), None, "no example in the file")
    return out


class NearestExamples:
    """The nearest-examples classifier (see the module docstring).

    Args:
        labels: the label set.
        examples: (label, message) pairs.
        embedder: turns texts into L2-normalised vectors (MiniLM by default in the step).
        k: neighbours that vote (:data:`DEFAULT_K`).
        vectors: the examples' embeddings by the same embedder, one row per example
            (None: embedded on :meth:`warm`); a cross-validation embeds once and
            passes each fold's rows.
        out_of_scope_below: a message whose nearest example of a shop label is less
            similar (cosine) is :data:`~chainrun.classify.base.FALLBACK_LABEL`
            (:data:`OUT_OF_SCOPE_BELOW`; 0 or no fallback label among ``labels``: never).
        vote_power: a neighbour's vote is its similarity to this power (:data:`VOTE_POWER`).

    Raises:
        ValueError: ``k`` < 1, or ``vectors`` has not one row per example.
    """

    method = "examples"

    def __init__(
        self,
        labels: Sequence[str],
        examples: Sequence[tuple[str, str]],
        embedder: Embedder,
        *,
        k: int = DEFAULT_K,
        vectors: np.ndarray | None = None,
        out_of_scope_below: float = OUT_OF_SCOPE_BELOW,
        vote_power: float = VOTE_POWER,
    ) -> None:
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        if vectors is not None and len(vectors) != len(examples):
            raise ValueError(f"{len(vectors)} vectors for {len(examples)} examples")
        self._labels = list(labels)
        self.examples = list(examples)
        self.embedder = embedder
        self.k = k
        self.vote_power = vote_power
        has_fallback = FALLBACK_LABEL in self._labels
        self.out_of_scope_below = out_of_scope_below if has_fallback else 0.0
        #: rows of the examples of a shop label (every label but the fallback)
        self._shop_rows = np.array([lab != FALLBACK_LABEL for lab, _ in self.examples], bool)
        self._matrix: np.ndarray | None = (
            None if vectors is None else np.asarray(vectors, dtype=np.float32)
        )
        self._lock = asyncio.Lock()

    @property
    def labels(self) -> Sequence[str]:
        return self._labels

    async def warm(self) -> None:
        """Embed the examples and load the embedder's model now (the first
        :meth:`classify` does it otherwise, on a shopper's turn): the shipped examples'
        vectors need no model, the message's does."""
        load = getattr(self.embedder, "warm", None)
        if load is not None:
            await load()
        if self._matrix is None:
            async with self._lock:
                if self._matrix is None:
                    messages = [m for _, m in self.examples]
                    key = _matrix_key(self.embedder, messages)
                    matrix = _MATRICES.get(key) if key is not None else None
                    if matrix is None:
                        matrix = await self._embed(messages)
                        matrix.flags.writeable = False
                        if key is not None:
                            _MATRICES[key] = matrix
                    self._matrix = matrix

    async def _embed(self, messages: list[str]) -> np.ndarray:
        """The examples' vectors: the shipped ones where they match, the rest embedded."""
        seeded = (
            seeded_vectors(self.embedder.model, messages)
            if isinstance(self.embedder, MiniLMEmbedder)
            else {}
        )
        missing = [i for i in range(len(messages)) if i not in seeded]
        rows = dict(seeded)
        if missing:
            embedded = await self.embedder.embed([messages[i] for i in missing])
            rows.update(zip(missing, np.asarray(embedded, np.float32), strict=True))
        return np.stack([rows[i] for i in range(len(messages))]).astype(np.float32)

    def vote(self, vector: np.ndarray) -> Classification:
        """The label for one message's embedding (after :meth:`warm`); a label's
        confidence is its share of the neighbours' votes (each its similarity to the
        power ``vote_power``).

        Out of scope (the nearest example of a shop label less similar than
        ``out_of_scope_below``): the fallback label; when the vote named a shop label, that
        label and the fallback share the confidence (0.5 each: unsure, so a turn still gets
        the voted label's material). ``detail["shop_similarity"]`` is that nearest
        example's cosine similarity (None: no shop example)."""
        assert self._matrix is not None, "call warm() first"
        sims = self._matrix @ np.asarray(vector, dtype=np.float32)
        shop = float(sims[self._shop_rows].max()) if self._shop_rows.any() else None
        top = np.argsort(-sims)[: self.k]
        votes: dict[str, float] = {}
        for i in top:
            label = self.examples[i][0]
            votes[label] = votes.get(label, 0.0) + max(float(sims[i]), 0.0) ** self.vote_power
        label = max(votes, key=lambda lab: votes[lab]) if votes else self.examples[top[0]][0]
        nearest = [
            {"label": self.examples[i][0], "message": self.examples[i][1],
             "similarity": round(float(sims[i]), 4)}
            for i in top
        ]  # fmt: skip
        detail: dict[str, object] = {"nearest": nearest, "shop_similarity": (
            None if shop is None else round(shop, 4))}
        confidences = shares(votes)
        if self.out_of_scope(shop):
            detail["out_of_scope"] = True
            if label != FALLBACK_LABEL:
                confidences = {FALLBACK_LABEL: 0.5, label: 0.5}
            label = FALLBACK_LABEL
        return Classification(label, self.method, float(sims[top[0]]), detail, confidences)

    def out_of_scope(self, shop_similarity: float | None) -> bool:
        """Whether a message whose nearest shop example has ``shop_similarity`` (cosine)
        is out of scope (False when the threshold is off or there is no shop example)."""
        return shop_similarity is not None and shop_similarity < self.out_of_scope_below

    async def classify(self, message: str) -> Classification:
        await self.warm()
        vector = (await self.embedder.embed([message]))[0]
        return self.vote(vector)

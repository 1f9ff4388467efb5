"""Classifying without a model call: keyword rules, nearest examples on MiniLM, both; the
``classify`` step kind in a chain; the label set as a JSON Schema enum for a model; and
the regression eval set's expected labels."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import numpy as np
import pytest
from conftest import reply_by_step

from chainrun.chain import Chain
from chainrun.classify import (
    DEFAULT_EXAMPLES,
    DEFAULT_LABELS,
    KeywordRules,
    NearestExamples,
    RulesThenExamples,
    label_schema,
    read_examples,
)
from chainrun.classify import examples as examples_module
from chainrun.classify.examples import seeded_vectors
from chainrun.config import config_from_dict
from chainrun.errors import ConfigError, InputFileError
from chainrun.providers.fake import FakeProvider
from chainrun.retrieval.embeddings import MINILM_PACKAGE, HashEmbedder, MiniLMEmbedder

ROOT = Path(__file__).resolve().parents[1]


def test_every_regression_case_has_an_expected_label() -> None:
    lines = (ROOT / "evals" / "regression.jsonl").read_text().splitlines()
    cases = [json.loads(ln) for ln in lines]
    assert cases and all(c.get("label") in DEFAULT_LABELS for c in cases)
    for c in cases:  # the label assertions the cases already had agree with it
        for a in c["assert"]:
            if a["type"] == "equals" and a.get("step") == "label":
                assert a["value"] == c["label"], c["id"]


def test_keyword_rules_and_their_tie_break() -> None:
    rules = KeywordRules(DEFAULT_LABELS)
    assert rules.classify_now("Where is my order FS-10293?").label == "order_status"
    assert rules.classify_now("Can I exchange it for a smaller size?").label == "returns"
    assert rules.classify_now("What's the capital of Peru?").label == "other"  # no rule
    custom = KeywordRules(DEFAULT_LABELS, {"styling": [r"\bvibe\b"]})
    assert custom.classify_now("what vibe for a party").label == "styling"
    with pytest.raises(ValueError, match=r"rules\.styling"):
        KeywordRules(DEFAULT_LABELS, {"styling": ["("]})


async def test_nearest_examples_vote() -> None:
    examples = [("returns", "refund please"), ("returns", "send it back for a refund"),
                ("sizing", "does it run small"), ("sizing", "which size fits me")]  # fmt: skip
    nearest = NearestExamples(["returns", "sizing"], examples, HashEmbedder(256), k=3)
    found = await nearest.classify("I want a refund")
    assert found.label == "returns" and found.method == "examples"
    assert found.detail["nearest"][0]["label"] == "returns"
    both = RulesThenExamples(KeywordRules(["returns", "sizing"]), nearest)
    assert (await both.classify("a refund for my parcel")).detail["decided_by"] == "keywords"


def test_shipped_examples_are_labelled_and_a_bad_file_is_one_error(tmp_path: Path) -> None:
    examples = read_examples(DEFAULT_EXAMPLES, DEFAULT_LABELS)
    assert {label for label, _ in examples} == set(DEFAULT_LABELS)
    bad = tmp_path / "ex.jsonl"
    bad.write_text('{"label": "sizing", "message": "a"}\n{"label": "nope", "message": "b"}\n')
    with pytest.raises(InputFileError) as e:
        read_examples(bad, DEFAULT_LABELS)
    assert e.value.line == 2 and "nope" in str(e.value)


def test_label_schema_admits_only_the_labels() -> None:
    schema = label_schema(DEFAULT_LABELS)
    jsonschema.validate({"label": "returns"}, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"label": "refunds"}, schema)


async def test_a_classify_step_labels_the_turn_without_a_model_call() -> None:
    cfg = config_from_dict({"steps": {"classify": {"kind": "classify", "method": "keywords"}}})
    fake = FakeProvider(name="local", script=reply_by_step())
    async with Chain(cfg, providers={"local": fake}, quiet=True) as chain:
        done = await chain.run_turn("Where is my order FS-10293? It's been a week.")
    assert done.label == "order_status"
    assert not [r for r in fake.requests if "Category:" in r.messages[-1]["content"]]


def test_a_classify_step_key_it_does_not_take_is_one_config_line() -> None:
    with pytest.raises(ConfigError) as e:
        config_from_dict({"steps": {"classify": {"kind": "classify", "methd": "keywords"}}})
    assert "methd" in str(e.value) and "\n" not in str(e.value)


async def test_the_shipped_examples_open_without_being_embedded(monkeypatch) -> None:
    """Their MiniLM vectors ship beside them (benchmarks/make_classify_vectors.py): warming
    the default classifier embeds nothing, and the shipped vectors are MiniLM's."""
    pytest.importorskip(MINILM_PACKAGE)
    monkeypatch.setattr(examples_module, "_MATRICES", {})  # nothing warmed earlier
    examples = read_examples(DEFAULT_EXAMPLES, DEFAULT_LABELS)
    messages = [m for _, m in examples]
    seeded = seeded_vectors(MiniLMEmbedder.model, messages)
    assert sorted(seeded) == list(range(len(messages))), (
        "classify_examples.minilm.npz is stale: run benchmarks/make_classify_vectors.py"
    )

    class Counting(MiniLMEmbedder):
        def __init__(self) -> None:
            super().__init__()
            self.texts: list[str] = []

        async def embed(self, texts):  # type: ignore[no-untyped-def]
            self.texts.extend(texts)
            return await super().embed(texts)

    embedder = Counting()
    await NearestExamples(DEFAULT_LABELS, examples, embedder).warm()
    assert embedder.texts == []
    # the model itself is loaded by warm (the chain's open), not by the first turn's
    # message (which waited ~1.7 s for it on the answer's path)
    assert embedder._encoder is not None
    fresh = await embedder.embed(messages[:5])
    assert np.allclose(fresh, [seeded[i] for i in range(5)], atol=1e-4)
    # a message the shipped file does not know is embedded, and only that one
    other = Counting()
    await NearestExamples(DEFAULT_LABELS, [*examples, ("other", "a brand new example")],
                          other).warm()  # fmt: skip
    assert other.texts == ["a brand new example"]

"""The configuration keys and log columns as documented data (chainrun.reference.pages): every
key and every column has an entry, and the walk finds what a new model adds by itself."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

import pytest
from pydantic import BaseModel, Field

from chainrun.reference import pages as reference
from chainrun.reference.pages import (
    config_keys,
    config_markdown,
    field_doc,
    log_markdown,
    log_tables,
    type_text,
    unit_of,
)


def test_every_config_key_has_an_entry() -> None:
    keys = config_keys()
    missing = [f"{k.path} ({k.model})" for k in keys if not k.doc]
    assert not missing, (
        "config keys without documentation (give the field a `#:` comment above it or "
        "Field(description=...)): " + ", ".join(missing)
    )
    paths = {k.path for k in keys}
    # the walk reaches every level: top, named tables, nested tables, arrays of tables
    for path in ("answer_step", "providers.NAME.base_url", "steps.NAME.deadline_s",
                 "steps.NAME.hedge.delay_ms", "steps.NAME.retrieval.embedding.backend",
                 "checks.patterns[].regex", "log.durable_turns"):  # fmt: skip
        assert path in paths


def test_keys_the_config_refuses_are_not_listed() -> None:
    """The engine's own hedge settings that the step sets for you are not [hedge] keys."""
    paths = {k.path for k in config_keys()}
    assert "steps.NAME.hedge.deadline_s" not in paths
    assert "steps.NAME.hedge.delay_percentile" not in paths
    assert {"steps.NAME.hedge.delay", "steps.NAME.hedge.delay_ms"} <= paths


def test_each_built_in_kind_names_the_keys_it_takes() -> None:
    keys: dict[str, set[str]] = {}
    for k in config_keys():
        if k.table == "steps.NAME":
            for kind in k.kinds:
                keys.setdefault(kind, set()).add(k.key)
    assert {"llm", "guard", "retrieve"} <= set(keys)
    assert {"model", "prompt", "hedge"} <= keys["llm"] and "model" not in keys["retrieve"]
    assert "retrieval" in keys["retrieve"] and "on_missing_verdict" in keys["guard"]
    assert "on_failure" in keys["llm"] & keys["guard"] & keys["retrieve"]


def test_every_log_column_has_an_entry() -> None:
    tables = log_tables()
    names = [t.name for t in tables]
    assert names[:4] == ["runs", "turns", "steps", "calls"]
    missing = [f"{t.name}.{c.name}" for t in tables if t.model is not None
               for c in t.columns if not c.doc]  # fmt: skip
    assert not missing, (
        "log columns without documentation (give the row model's field a `#:` comment "
        "above it or a trailing comment): " + ", ".join(missing)
    )
    for t in tables:
        if t.model is not None:  # one shape per log fact: the model's fields are the columns
            assert {c.name for c in t.columns} == set(t.model.model_fields)


def test_units_come_from_the_name() -> None:
    assert unit_of("ttft_ms") == "ms"
    assert unit_of("deadline_s") == "s"
    assert unit_of("max_copies_per_s") == "per s"
    assert unit_of("bytes_received") == "bytes"
    assert unit_of("started_at") == "ISO-8601 UTC"
    assert unit_of("cached_input_tokens") == "tokens"
    assert unit_of("model") == ""
    units = {k.path: k.unit for k in config_keys()}
    assert units["steps.NAME.deadline_s"] == "s"
    assert units["steps.NAME.hedge.delay_ms"] == "ms"


# -- the walk is generic: a model added tomorrow appears by itself ------------------------


class _Hedge(BaseModel):
    #: the delay, in ms
    delay_ms: float = 10.0
    internal: int = 0
    not_config_keys: ClassVar[frozenset[str]] = frozenset({"internal"})


class _LlmStep(BaseModel):
    #: the step's kind
    kind: Literal["llm"] = "llm"
    #: the model
    model: str = "m"
    hedge: _Hedge | None = None


class _SearchStep(BaseModel):
    #: the step's kind
    kind: Literal["search"]
    #: the model
    model: str = "m"
    k: int = Field(default=8, description="results per search")
    undocumented: bool = False


class _Pattern(BaseModel):
    name: str  # the pattern's name


class _Root(BaseModel):
    steps: dict[str, Annotated[_LlmStep | _SearchStep, Field(discriminator="kind")]]
    patterns: list[_Pattern] = Field(default_factory=list)
    #: a choice
    mode: Literal["a", "b"] = "a"


def test_a_discriminated_union_names_the_kinds_that_take_each_key() -> None:
    keys = {k.path: k for k in config_keys(_Root)}
    assert keys["steps.NAME.model"].kinds == ("llm", "search")  # same key, same way: one entry
    assert keys["steps.NAME.k"].kinds == ("search",)
    assert keys["steps.NAME.k"].doc == "results per search"
    assert keys["steps.NAME.hedge.delay_ms"].kinds == ("llm",)
    assert keys["steps.NAME.hedge.delay_ms"].unit == "ms"
    assert "steps.NAME.hedge.internal" not in keys
    assert keys["patterns[].name"].doc == "the pattern's name"
    assert keys["mode"].type == '"a" | "b"' and keys["mode"].default == '"a"'
    assert keys["steps.NAME.kind"].default in ('"llm"', "required")
    # a key without documentation is reported as such (the completeness test fails on it)
    assert keys["steps.NAME.undocumented"].doc == ""


class _BaseStep(BaseModel):
    #: the step's kind
    kind: str = "llm"
    #: steps that end first
    after: list[str] = Field(default_factory=list)


class _ModelStep(_BaseStep):
    #: the model
    model: str = "m"


class _PolicyStep(_BaseStep):
    #: the policy text
    text: str = ""


class _Chain(BaseModel):
    steps: dict[str, _BaseStep]


def test_kinds_that_bring_their_own_model_are_each_walked() -> None:
    """A field declared with a base model whose kinds subclass it (the step registry's
    design): each kind's keys appear, keys they share are one entry naming them all."""
    keys = {k.path: k for k in config_keys(_Chain, {"llm": _ModelStep, "policy": _PolicyStep})}
    assert keys["steps.NAME.model"].kinds == ("llm",)
    assert keys["steps.NAME.text"].kinds == ("policy",)
    assert keys["steps.NAME.after"].kinds == ("llm", "policy")
    plain = {k.path: k.kinds for k in config_keys(_Chain, {})}
    assert plain == {"steps": (), "steps.NAME.kind": (), "steps.NAME.after": ()}


def test_the_generated_page_has_a_row_per_key_and_a_kinds_column() -> None:
    text = config_markdown(config_keys(_Root))
    assert "## `[steps.NAME]`" in text and "## `[[patterns]]`" in text
    assert "| `k` | int | `8` |  | search | results per search |" in text
    assert "| key | type | default | unit | kinds | meaning |" in text


def test_field_doc_sources() -> None:
    class M(BaseModel):
        #: above
        #: and more
        a: int = 0
        b: int = 0  # trailing
        c: int = 0
        """a docstring"""
        d: int = Field(default=0, description="described")
        e: int = 0

    assert field_doc(M, "a") == reference.FieldDoc("above and more", "comment")
    assert field_doc(M, "b") == reference.FieldDoc("trailing", "trailing")
    assert field_doc(M, "c") == reference.FieldDoc("a docstring", "docstring")
    assert field_doc(M, "d") == reference.FieldDoc("described", "description")
    assert field_doc(M, "e") == reference.FieldDoc("", "")


@pytest.mark.parametrize(
    ("tp", "text"),
    [(int, "int"), (float | None, "float | unset"), (list[str], "list of str"),
     (dict[str, int], "table of int"), (Literal["x", "y"] | None, '"x" | "y" | unset')],
)  # fmt: skip
def test_type_text(tp: object, text: str) -> None:
    assert type_text(tp) == text


def test_the_log_page_has_a_section_per_row_model() -> None:
    text = log_markdown()
    for table in ("runs", "turns", "steps", "calls"):
        assert f"### `{table}`" in text
    assert "| `ttft_ms` | REAL | float \\| NULL | ms |" in text


def test_the_committed_reference_pages_are_current() -> None:
    """docs/reference/{configuration,log,cli}.md hold their generated parts as committed
    Markdown; a config key, log column or command changed without regenerating them fails
    here (regenerate: ``python -m chainrun.cli.reference_pages``)."""
    from chainrun.cli.reference_pages import stale_pages

    assert stale_pages() == [], "run: python -m chainrun.cli.reference_pages"


def test_the_page_writer_replaces_only_its_part(tmp_path) -> None:
    from chainrun.cli.reference_pages import fill

    end = "<!-- end generated: cli -->"
    page = f"# T\n\nintro\n\n<!-- generated: cli -->\n\nold\n\n{end}\n\nafter\n"
    new = f"# T\n\nintro\n\n<!-- generated: cli -->\n\nnew\n\n{end}\n\nafter\n"
    assert fill(page, "cli", "new") == new
    with pytest.raises(ValueError, match="expected one line"):
        fill("# no marker\n", "cli", "x", page="p.md")

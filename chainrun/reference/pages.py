"""The configuration keys and the log's columns as documented data, read from the models.

The docs' reference pages (``docs/reference/configuration.md`` and ``docs/reference/log.md``)
are generated from what this module returns, and a test fails when an entry has no
text, so a key or a column added to a model appears in the docs by itself and cannot
appear undocumented.

Where a field's text comes from, in this order (the first that exists):

1. ``Field(description=...)``;
2. a block of ``#:`` comment lines right above the field (the Sphinx convention the
   code already uses);
3. a string literal right below the field (an attribute docstring);
4. a trailing ``# comment`` on the field's line;
5. the field's entry in the class docstring's Google-style ``Attributes:`` section.

Walking is generic: a nested model is a table (``[log]``), ``dict[str, Model]`` a table
of named tables (``[providers.NAME]``), ``list[Model]`` an array of tables
(``[[checks.patterns]]``), and a union of models discriminated on a field (the step
kinds) gives each key the kinds that take it. A model hides a field that is not a
configuration key (an engine setting the config sets for you) by listing it in a
``not_config_keys`` class variable.

Units are read off the name: ``_ms`` milliseconds, ``_s`` seconds, ``_bytes`` bytes,
``_at`` an ISO-8601 UTC time, ``tokens`` a token count; ``json_schema_extra={"unit": ...}``
overrides that.
"""

from __future__ import annotations

import ast
import inspect
import io
import re
import textwrap
import tokenize
import types
import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any, Literal, Union, get_args, get_origin

import sqlite_utils
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from chainrun.config import ChainConfig
from chainrun.log import rows as rows_module
from chainrun.log.migrations import migrate
from chainrun.steps import step_kinds

__all__ = [
    "ConfigKey",
    "FieldDoc",
    "config_keys",
    "field_doc",
    "type_text",
    "unit_of",
]


@dataclass(frozen=True)
class ConfigKey:
    """One key of ``chainrun.toml``.

    Attributes:
        table: the TOML table the key sits in, e.g. ``"steps.NAME.hedge"`` (``""``: top
            level; ``NAME`` stands for a name you choose, ``[]`` for an array of tables).
        key: the key's name within that table.
        type: the value's type in words (``float | unset``, ``"open" | "closed"``).
        default: the value when the key is left out, as TOML-ish text (``unset`` for
            None; ``required`` when it must be given).
        unit: ``ms``, ``s``, ``bytes``, ... or ``""``.
        kinds: the step kinds that take the key (empty: not a step key, or every kind).
        doc: the documentation text (``""`` when the model has none: a test fails then).
        model: the pydantic model that defines the field (for messages).
        table_doc: the first paragraph of that model's docstring.
    """

    table: str
    key: str
    type: str
    default: str
    unit: str
    kinds: tuple[str, ...]
    doc: str
    model: str
    table_doc: str

    @property
    def path(self) -> str:
        """``table.key``, e.g. ``steps.NAME.hedge.delay_ms``."""
        return f"{self.table}.{self.key}" if self.table else self.key


@dataclass(frozen=True)
class FieldDoc:
    """A model field's documentation: the text and where it came from
    (``description``, ``comment``, ``docstring``, ``trailing``, ``attributes``, or ``""``
    when none)."""

    text: str
    source: str


# -- where a field's text comes from ---------------------------------------------------


@cache
def _source_docs(cls: type) -> Mapping[str, FieldDoc]:
    """The comment- and docstring-documented fields of one class body (not its bases)."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    lines = source.splitlines()
    comments: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string
    tree = ast.parse(source)
    body = next(n for n in tree.body if isinstance(n, ast.ClassDef)).body
    docs: dict[str, FieldDoc] = {}
    for i, node in enumerate(body):
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        name = node.target.id
        above: list[str] = []
        line = node.lineno - 1
        while line >= 1 and lines[line - 1].strip().startswith("#:"):
            above.insert(0, lines[line - 1].strip()[2:].strip())
            line -= 1
        nxt = body[i + 1] if i + 1 < len(body) else None
        end = node.end_lineno or node.lineno
        if above:
            docs[name] = FieldDoc(" ".join(above), "comment")
        elif (
            isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
            and isinstance(nxt.value.value, str)
        ):
            docs[name] = FieldDoc(" ".join(inspect.cleandoc(nxt.value.value).split()), "docstring")
        elif end in comments and not comments[end].startswith("#:"):
            text = comments[end].lstrip("#").strip()
            if text and not text.startswith(("fmt:", "type:", "noqa")):
                docs[name] = FieldDoc(text, "trailing")
    return docs


@cache
def _docstring_attributes(cls: type) -> Mapping[str, str]:
    """The entries of a class docstring's Google-style ``Attributes:`` section."""
    doc = cls.__dict__.get("__doc__")
    if not isinstance(doc, str):
        return {}
    lines = inspect.cleandoc(doc).splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == "Attributes:")
    except StopIteration:
        return {}
    found: dict[str, list[str]] = {}
    current: list[str] | None = None
    indent = None
    for line in lines[start + 1 :]:
        if not line.strip():
            continue
        width = len(line) - len(line.lstrip())
        if width == 0:
            break  # the next section
        m = re.match(r"^(\w+)(?: \([^)]*\))?: (.*)$", line.strip())
        if m and (indent is None or width == indent):
            indent = width
            current = found.setdefault(m.group(1), [m.group(2)])
        elif current is not None:
            current.append(line.strip())
    return {k: " ".join(v) for k, v in found.items()}


def field_doc(model: type[BaseModel], name: str) -> FieldDoc:
    """The documentation of ``model``'s field ``name`` (see the module docstring for the
    order of sources), looked up in the class that declares it, then its bases."""
    info = model.model_fields[name]
    if info.description:
        return FieldDoc(" ".join(info.description.split()), "description")
    for cls in model.__mro__:
        if name in getattr(cls, "__annotations__", {}):
            doc = _source_docs(cls).get(name)
            if doc is not None:
                return doc
            entry = _docstring_attributes(cls).get(name)
            if entry:
                return FieldDoc(entry, "attributes")
    return FieldDoc("", "")


def model_summary(model: type) -> str:
    """The first paragraph of a model's docstring, on one line (``""`` without one)."""
    doc = inspect.getdoc(model) or ""
    if model.__doc__ is None or doc == inspect.getdoc(BaseModel):
        return ""
    return " ".join(doc.split("\n\n")[0].split())


# -- types, defaults and units in words --------------------------------------------------


def _strip_none(tp: Any) -> tuple[Any, bool]:
    """``(T, True)`` for ``T | None``; ``(tp, False)`` otherwise."""
    if get_origin(tp) in (Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        if len(args) < len(get_args(tp)):
            inner = args[0] if len(args) == 1 else Union[tuple(args)]  # noqa: UP007
            return inner, True
    return tp, False


def type_text(tp: Any) -> str:
    """A type as a reader of TOML or SQL would name it: ``float``, ``list of str``,
    ``"open" | "closed"``, ``table``; ``| unset`` for an optional value."""
    tp, optional = _strip_none(tp)
    text = _plain_type(tp)
    return f"{text} | unset" if optional else text


def _grouped(text: str) -> str:
    """A type inside another in words, in parentheses when it is a choice."""
    return f"({text})" if " | " in text else text


def _plain_type(tp: Any) -> str:
    origin = get_origin(tp)
    if origin is typing.Annotated:
        return _plain_type(get_args(tp)[0])
    if origin is Literal:
        return " | ".join(f'"{a}"' if isinstance(a, str) else repr(a) for a in get_args(tp))
    if origin in (Union, types.UnionType):
        return " | ".join(dict.fromkeys(_plain_type(a) for a in get_args(tp)))
    if origin in (list, tuple, set, frozenset):
        items = [a for a in get_args(tp) if a is not Ellipsis]
        return "list of " + (_grouped(_plain_type(items[0])) if items else "values")
    if origin is dict:
        kv = get_args(tp)
        if not kv:
            return "table"
        value = _plain_type(kv[1])
        return "tables by name" if value == "table" else f"table of {_grouped(value)}"
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return "table"
    if tp is Any:
        return "any"
    if isinstance(tp, type):
        return {"str": "str", "int": "int", "float": "float", "bool": "bool"}.get(
            tp.__name__, tp.__name__
        )
    return str(tp).replace("typing.", "")


def _value_text(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, frozenset | set):
        value = sorted(value, key=str)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_value_text(v) for v in value) + "]"
    if isinstance(value, dict):
        return (
            "{}"
            if not value
            else "{" + ", ".join(f"{k} = {_value_text(v)}" for k, v in value.items()) + "}"
        )
    if isinstance(value, BaseModel):
        return "(table)"
    if isinstance(value, float) and value.is_integer():
        return repr(value)
    return repr(value)


def default_text(info: FieldInfo) -> str:
    """A field's default as text: ``required`` when it has none."""
    if info.default_factory is not None:
        try:
            return _value_text(info.default_factory())  # type: ignore[call-arg]
        except TypeError:
            return "(computed)"
    if info.is_required():
        return "required"
    return _value_text(info.default)


_UNITS = (
    (re.compile(r"(^|_)per_s$"), "per s"),
    (re.compile(r"_ms$"), "ms"),
    (re.compile(r"_s$"), "s"),
    (re.compile(r"(^|_)bytes(_|$)"), "bytes"),
    (re.compile(r"_at$"), "ISO-8601 UTC"),
    (re.compile(r"(^|_)tokens$"), "tokens"),
)


def unit_of(name: str, info: FieldInfo | None = None) -> str:
    """The unit of a key or column, from ``json_schema_extra["unit"]`` or its name."""
    extra = info.json_schema_extra if info is not None else None
    if isinstance(extra, dict) and isinstance(extra.get("unit"), str):
        return str(extra["unit"])
    for pattern, unit in _UNITS:
        if pattern.search(name):
            return unit
    return ""


# -- walking the configuration -----------------------------------------------------------


def _models_in(tp: Any) -> tuple[str, list[type[BaseModel]], bool]:
    """How a field's type nests models: ``("table" | "named" | "array" | "", models,
    optional)``; several models for a union (e.g. of step kinds)."""
    tp, optional = _strip_none(tp)
    origin = get_origin(tp)
    if origin is typing.Annotated:
        tp = get_args(tp)[0]
        origin = get_origin(tp)
    shape = "table"
    if origin is dict:
        shape, tp = "named", get_args(tp)[1]
    elif origin in (list, tuple):
        shape, tp = "array", get_args(tp)[0]
    tp, _ = _strip_none(tp)
    if get_origin(tp) is typing.Annotated:
        tp = get_args(tp)[0]
    members = get_args(tp) if get_origin(tp) in (Union, types.UnionType) else (tp,)
    models = [m for m in members if isinstance(m, type) and issubclass(m, BaseModel)]
    if not models or len(models) != len(members):
        return "", [], optional
    return shape, models, optional


def _kinds_of(model: type[BaseModel], discriminator: str) -> tuple[str, ...]:
    info = model.model_fields.get(discriminator)
    if info is None:
        return (model.__name__,)
    tp, _ = _strip_none(info.annotation)
    if get_origin(tp) is Literal:
        return tuple(str(a) for a in get_args(tp))
    if isinstance(info.default, str):
        return (info.default,)
    return (model.__name__,)


def _discriminator(models: list[type[BaseModel]]) -> str:
    """The field the union's members tell each other apart by (``kind`` for steps)."""
    common = set(models[0].model_fields)
    for m in models[1:]:
        common &= set(m.model_fields)
    for name in ("kind", "type"):
        if name in common:
            return name
    return next(
        (
            n
            for n in sorted(common)
            if all(
                get_origin(_strip_none(m.model_fields[n].annotation)[0]) is Literal for m in models
            )
        ),
        "",
    )


Variants = Mapping[str, type[BaseModel]]


def _walk(
    model: type[BaseModel], table: str, kinds: tuple[str, ...], variants: Variants
) -> Iterator[ConfigKey]:
    hidden: frozenset[str] = getattr(model, "not_config_keys", frozenset())
    for name, info in model.model_fields.items():
        if name in hidden:
            continue
        key = info.alias or name
        shape, models, _ = _models_in(info.annotation)
        yield ConfigKey(
            table=table,
            key=key,
            type=type_text(info.annotation),
            default=default_text(info) if not models else _nested_default(info),
            unit=unit_of(name, info),
            kinds=kinds,
            doc=field_doc(model, name).text,
            model=model.__name__,
            table_doc=model_summary(model),
        )
        if not models:
            continue
        sub = f"{table}.{key}" if table else key
        if shape == "named":
            sub += ".NAME"
        elif shape == "array":
            sub += "[]"
        if len(models) == 1:
            mine = {k: v for k, v in variants.items() if issubclass(v, models[0])}
            if not mine:
                yield from _walk(models[0], sub, kinds, variants)
            for kind, variant in mine.items():  # a base model whose kinds bring their own
                yield from _walk(variant, sub, (kind,), variants)
            continue
        disc = _discriminator(models)
        for member in models:
            yield from _walk(member, sub, _kinds_of(member, disc), variants)


def step_variants() -> dict[str, type[BaseModel]]:
    """The config model of each built-in step kind, by kind (``llm`` → its model): a
    ``[steps.NAME]`` table is validated by the model of its ``kind``. Kinds registered
    outside chainrun (an application's, a test's) are not part of the reference."""
    found: dict[str, type[BaseModel]] = {}
    for kind, cls in step_kinds().items():
        model = getattr(cls, "config_model", None)
        if cls.__module__.startswith("chainrun.") and isinstance(model, type):
            found[kind] = model
    return found


def _nested_default(info: FieldInfo) -> str:
    if info.is_required():
        return "required"
    if info.default_factory is None and info.default is None:
        return "unset"
    return "(table)" if get_origin(_strip_none(info.annotation)[0]) is not dict else "{}"


def config_keys(
    model: type[BaseModel] | None = None, variants: Variants | None = None
) -> list[ConfigKey]:
    """Every key of the configuration, table by table, in declaration order.

    Keys that several step kinds take in the same way (same type, default and text) are
    one entry naming those kinds; where kinds differ, each way is its own entry.

    Args:
        model: the root model (default: :class:`chainrun.config.ChainConfig`).
        variants: models that stand for a field's model by kind (default: the built-in
            step kinds' config models, :func:`step_variants`); a field whose model is a
            base of some of them is documented once per kind.
    """
    model = ChainConfig if model is None else model
    variants = step_variants() if variants is None else variants
    merged: dict[tuple[str, str, str, str, str], ConfigKey] = {}
    for entry in _walk(model, "", (), variants):
        ident = (entry.table, entry.key, entry.type, entry.default, entry.doc)
        seen = merged.get(ident)
        if seen is None:
            merged[ident] = entry
        elif entry.kinds and seen.kinds:
            kinds = tuple(dict.fromkeys((*seen.kinds, *entry.kinds)))
            merged[ident] = ConfigKey(**{**seen.__dict__, "kinds": kinds})
    return list(merged.values())


# -- the configuration page --------------------------------------------------------------


def _cell(text: str) -> str:
    """Text safe inside a Markdown table cell."""
    return " ".join(text.split()).replace("|", "\\|")


def _code(text: str) -> str:
    return f"`{text}`" if text else ""


def config_markdown(keys: list[ConfigKey] | None = None) -> str:
    """The configuration reference as Markdown: one section per TOML table, one row per
    key (key, type, default, unit, the step kinds that take it, what it does)."""
    keys = config_keys() if keys is None else keys
    by_table: dict[str, list[ConfigKey]] = {}
    for k in keys:
        by_table.setdefault(k.table, []).append(k)
    out: list[str] = []
    for table, entries in by_table.items():
        title = "Top level" if not table else _table_title(table)
        out.append(f"## {title}\n")
        summaries = list(dict.fromkeys(e.table_doc for e in entries if e.table_doc))
        for summary in summaries:
            out.append(summary + "\n")
        show_kinds = any(e.kinds for e in entries)
        head = "| key | type | default | unit |" + (" kinds |" if show_kinds else "") + " meaning |"
        out.append(head)
        out.append("|" + "---|" * (head.count("|") - 1))
        for e in entries:
            kinds = (" " + _cell(", ".join(e.kinds)) + " |") if show_kinds else ""
            out.append(
                f"| `{e.key}` | {_cell(e.type)} | {_cell(_code(e.default))} | {e.unit} |{kinds}"
                f" {_cell(e.doc)} |"
            )
        out.append("")
    return "\n".join(out)


def lab_scenario_markdown() -> str:
    """The latency lab's scenario file as Markdown, in the configuration page's form: one
    section per TOML table of :class:`chainrun.lab.scenarios.Scenario`, one row per key."""
    from chainrun.lab.scenarios import Scenario

    return config_markdown(config_keys(Scenario, variants={}))


def _table_title(table: str) -> str:
    if table.endswith("[]"):
        return f"`[[{table[:-2]}]]`"
    return f"`[{table}]`"


# -- the log's data model ----------------------------------------------------------------


@dataclass(frozen=True)
class Column:
    """One column of a log table.

    Attributes:
        name: the column's name.
        sql_type: its SQLite type (``INTEGER``, ``REAL``, ``TEXT``, ``BLOB``).
        type: the row model's type in words (``""`` for a table without a row model).
        unit: ``ms``, ``s``, ``tokens``, ... or ``""``.
        doc: the documentation text (``""`` when none: a test fails then).
    """

    name: str
    sql_type: str
    type: str
    unit: str
    doc: str


@dataclass(frozen=True)
class Table:
    """One table of the log: its row model (None when it has none) and its columns in
    the order of the schema after every migration."""

    name: str
    model: type[BaseModel] | None
    doc: str
    columns: tuple[Column, ...]


def row_models() -> dict[str, type[BaseModel]]:
    """Every row model of the log by table name: the models of the rows module that
    name their table in a ``table`` class variable."""
    found: dict[str, type[BaseModel]] = {}
    for obj in vars(rows_module).values():
        if isinstance(obj, type) and issubclass(obj, BaseModel):
            table = obj.__dict__.get("table")
            if isinstance(table, str):
                found[table] = obj
    return found


def _schema() -> dict[str, list[tuple[str, str]]]:
    """The tables a new log has after every migration: name → [(column, SQL type)]."""
    db = sqlite_utils.Database(memory=True)
    try:
        migrate(db)
        names = [
            r[0]
            for r in db.execute(
                "select name from sqlite_master where type = 'table' order by rowid"
            ).fetchall()
        ]
        return {
            name: [(c.name, c.type) for c in db[name].columns]
            for name in names
            if not _internal(name, names)
        }
    finally:
        db.close()


def _internal(name: str, names: list[str]) -> bool:
    """Bookkeeping tables (migrations, id blocks) and a full-text index's own tables."""
    if name.startswith(("_", "sqlite_")):
        return True
    return any(name != base and name.startswith(base + "_fts") for base in names) or (
        name.endswith("_fts") or "_fts_" in name
    )


def log_tables() -> list[Table]:
    """Every table of a new log, in creation order, each column with its documentation
    from the table's row model (tables without a row model have ``doc = ""`` columns;
    the data-model page documents those by hand)."""
    models = row_models()
    tables = []
    for name, columns in _schema().items():
        model = models.get(name)
        cols = []
        for col, sql_type in columns:
            info = model.model_fields.get(col) if model is not None else None
            cols.append(
                Column(
                    name=col,
                    sql_type=sql_type,
                    type=_null_text(type_text(info.annotation)) if info is not None else "",
                    unit=unit_of(col, info),
                    doc=field_doc(model, col).text if model is not None and info else "",
                )
            )
        doc = model_summary(model) if model is not None else ""
        tables.append(Table(name, model, doc, tuple(cols)))
    return tables


def _null_text(text: str) -> str:
    """A row type in the log's words: an optional value is NULL when unknown or unset."""
    return text.replace("| unset", "| NULL")


def log_markdown(tables: list[Table] | None = None) -> str:
    """The generated part of the data-model page: one section per table that has a row
    model, one row per column (column, SQL type, Python type, unit, meaning)."""
    tables = log_tables() if tables is None else tables
    out: list[str] = []
    for t in tables:
        if t.model is None:
            continue
        out.append(f"### `{t.name}`\n")
        if t.doc:
            out.append(f"{t.doc} Row model: `{t.model.__module__}.{t.model.__name__}`.\n")
        out.append("| column | SQL type | type | unit | meaning |")
        out.append("|---|---|---|---|---|")
        for c in t.columns:
            out.append(
                f"| `{c.name}` | {c.sql_type} | {_cell(c.type)} | {c.unit} | {_cell(c.doc)} |"
            )
        out.append("")
    return "\n".join(out)

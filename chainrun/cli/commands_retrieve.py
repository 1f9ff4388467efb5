"""``chainrun retrieve QUERY`` (the retrieve stage alone: what each search did, where it
stopped) and ``chainrun catalog load FILE``.

Thin: loads the config, opens the log database, calls :mod:`chainrun.retrieval` and prints
(rich tables, or the ``--json`` document of :meth:`RetrievalResult.as_json`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from chainrun.cli import (
    DEFAULT_DB_PATH,
    ConfigOpt,
    DbOpt,
    JsonOpt,
    app,
    catalog_app,
    err,
    handle_errors,
    out,
    print_json,
    run_async,
)

if TYPE_CHECKING:
    from rich.table import Table

    from chainrun.retrieval import RetrievalResult, RetrievalSettings

# The library is imported inside each function, when it runs (fast --help).


def retrieval_settings(config_path: str | None) -> RetrievalSettings:
    """The ``retrieval`` settings of the config's first step that searches (whose table
    has ``retrieval`` settings, whatever its kind); defaults if none has.

    Raises:
        ConfigError: the config file is invalid.
    """
    from chainrun.config import load_config
    from chainrun.retrieval import RetrievalSettings

    cfg = load_config(config_path)
    for name in cfg.order:
        settings = getattr(cfg.steps[name], "retrieval", None)
        if isinstance(settings, RetrievalSettings):
            return settings
    return RetrievalSettings()


def _price(p: dict[str, Any]) -> str:
    """A product's price as its shop writes it (its currency, its catalogue's locale)."""
    from chainrun.money import DEFAULT_LOCALE, format_money

    return format_money(p["price"], p.get("currency") or "EUR", p.get("locale") or DEFAULT_LOCALE)


def _hits_table(title: str, ids: list[str], products: dict[str, dict[str, Any]]) -> Table:
    from rich.table import Table

    t = Table(title=title, title_justify="left")
    for col in ("#", "id", "title", "category", "price"):
        t.add_column(col, justify="right" if col in ("#", "price") else "left")
    for rank, pid in enumerate(ids, start=1):
        p = products.get(pid, {})
        t.add_row(str(rank), escape(pid), escape(p.get("title", "?")),
                  escape(p.get("category", "?")), _price(p) if p else "-")  # fmt: skip
    return t


def print_result(
    result: RetrievalResult, settings: RetrievalSettings, products: dict[str, dict[str, Any]]
) -> None:
    """Rich tables: the searches (with the stop point), each search's hits, the merged list.

    ``products`` maps the ids the searches found to their product dicts (for titles).
    """
    from rich.table import Table

    ran = [s.name for s in result.searches]
    skipped = [n for n in settings.searches if n not in ran]
    t = Table(title=escape(f"query {result.query!r}  filters {result.filters.as_json()}"),
              title_justify="left")  # fmt: skip
    for col in ("search", "ms", "hits", "new", "hedged", "error"):
        t.add_column(col, justify="right" if col in ("ms", "hits", "new") else "left")
    for s in result.searches:
        t.add_row(s.name if s.answered_by in (None, s.name) else f"{s.name} → {s.answered_by}",
                  f"{s.ms:.1f}", str(s.n), str(s.new), s.hedged or "-", s.error or "-")  # fmt: skip
    for name in skipped:
        t.add_row(f"[dim]{name}[/dim]", "-", "-", "-", "-", "[dim]skipped (early exit)[/dim]")
    out.print(t)
    for s in result.searches:
        if s.ids:
            out.print(_hits_table(f"{s.name}: {s.n} hits, {s.ms:.1f} ms", s.ids, products))
    merged = Table(title=f"merged: {len(result.items)} products in {result.ms:.1f} ms",
                   title_justify="left")  # fmt: skip
    for col in ("#", "id", "title", "category", "price", "sizes in stock", "found by"):
        merged.add_column(col, justify="right" if col in ("#", "price") else "left")
    for rank, item in enumerate(result.items, start=1):
        sizes = [s for s, n in (item.get("sizes") or {}).items() if n > 0]
        merged.add_row(
            str(rank), escape(item["id"]), escape(item["title"]), escape(item["category"]),
            _price(item),
            ", ".join(sizes), item.get("source", "-"),
        )  # fmt: skip
    out.print(merged)
    if result.stopped_after:
        out.print(f"early exit: stopped after [bold]{result.stopped_after}[/] with "
                  f"{len(result.items)} ≥ min_results={settings.min_results}; "
                  f"skipped: {', '.join(skipped)}")  # fmt: skip
    else:
        out.print(f"no early exit: every search ran (min_results={settings.min_results})")


def retrieve_command(query: str, db_path: str, config_path: str | None, as_json: bool) -> None:
    """Run the retrieve stage for ``query`` on the catalogue in ``db_path`` and print it.

    Loads the sample catalogue if the database has none, embeds the catalogue on first
    use (cached in the database), then prints tables or, with ``as_json``, one JSON
    document (keys ``results``, ``searches``, ``stopped_after``, ...).

    Raises:
        ConfigError: invalid config. UserInputError: ``db_path`` is not a chainrun log.
    """
    from chainrun.errors import ProviderError
    from chainrun.log.store import Store
    from chainrun.retrieval import build_retriever
    from chainrun.retrieval.catalog import ensure_sample_catalog, get_products

    settings = retrieval_settings(config_path)
    store = Store.open(db_path)
    try:
        loaded = ensure_sample_catalog(store.db)
        if loaded:
            err.print(f"loaded the sample catalogue ({loaded} products) into {db_path}")

        async def go() -> RetrievalResult:
            async with build_retriever(settings, store.db) as retriever:
                try:
                    n = await retriever.warm()
                    if n:
                        err.print(f"embedded {n} products (cached in {db_path} for next time)")
                except ProviderError as e:
                    err.print(f"warning: vector search unavailable: {e}")
                return await retriever.retrieve(query)

        result: RetrievalResult = run_async(go())
        if as_json:
            print_json(result.as_json())
        else:
            ids = sorted({i for s in result.searches for i in s.ids})
            products = {p["id"]: p for p in get_products(store.db, ids)}
            print_result(result, settings, products)
    finally:
        store.close()


@app.command("retrieve")
@handle_errors
def retrieve(
    query: Annotated[str, typer.Argument(help="What the shopper asked.")],
    config: ConfigOpt = None,
    db: DbOpt = DEFAULT_DB_PATH,
    as_json: JsonOpt = False,
) -> None:
    """Run the retrieve step alone: each search's hits and time, the merged list, the stop."""
    retrieve_command(query, str(db), str(config) if config else None, as_json)


@catalog_app.command("load")
@handle_errors
def catalog_load(
    file: Annotated[Path, typer.Argument(help="Products as JSONL or CSV.")],
    db: DbOpt = DEFAULT_DB_PATH,
    currency: Annotated[str, typer.Option(
        help="The catalogue's currency (ISO 4217), e.g. CHF.")] = "EUR",
    locale: Annotated[str | None, typer.Option(
        help="The locale the file writes prices in (CLDR), e.g. de_CH for 1'299.00 or "
             "de_DE for 1.299,00; without it, a price such as 1.299 is refused.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Load (replace) the product catalogue from JSONL or CSV; a bad row loads nothing."""
    from chainrun.log.store import Store
    from chainrun.retrieval.catalog import read_catalog, write_products

    # validated before the log is opened (or created)
    products = read_catalog(file, currency=currency, locale=locale)
    with Store.open(db) as store:
        n = write_products(store.db, products, source=str(file), currency=currency,
                           locale=locale)  # fmt: skip
    if as_json:
        print_json({"loaded": n, "file": str(file), "db": str(db)})
    else:
        out.print(f"loaded {n} products from {file} into {db}")

"""The product catalogue: loading JSONL and CSV, rejecting malformed rows whole, the sample."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import sqlite_utils

from chainrun.errors import InputFileError
from chainrun.log.store import Store
from chainrun.retrieval.catalog import (
    SAMPLE_CATALOG,
    all_products,
    catalog_version,
    ensure_catalog_tables,
    ensure_sample_catalog,
    get_products,
    load_catalog,
    product_count,
    product_text,
    read_catalog,
)

REPO = Path(__file__).resolve().parent.parent


def _p(pid: str, **kw: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "id": pid,
        "title": f"Product {pid}",
        "description": "A test product.",
        "category": "jackets",
        "colours": ["navy"],
        "sizes": {"S": 1, "M": 2},
        "price": 50.0,
        "tags": ["test"],
    }
    base.update(kw)
    return base


def _jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture
def db() -> sqlite_utils.Database:
    d = sqlite_utils.Database(memory=True)
    ensure_catalog_tables(d)
    return d


def test_store_open_creates_catalogue_tables_through_the_migration() -> None:
    with Store.open(":memory:") as store:
        names = set(store.db.table_names())
        assert {"products", "products_fts", "product_sizes", "product_embeddings"} <= names
        applied = {r["name"] for r in store.db["_migrations"].rows}
        assert "010_catalog" in applied


def test_load_jsonl(db: sqlite_utils.Database, tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "c.jsonl", [_p("A-1"), _p("A-2", sizes={"M": 0}, price=9.5)])
    assert load_catalog(db, path) == 2
    a1, a2 = get_products(db, ["A-1", "A-2"])
    assert a1["sizes"] == {"S": 1, "M": 2} and a1["stock"] == 3  # stock defaults to the sum
    assert a1["colours"] == ["navy"] and a1["tags"] == ["test"]
    assert a2["price"] == 9.5 and a2["stock"] == 0
    assert get_products(db, ["A-2", "nope", "A-1"]) == [a2, a1]  # order kept, unknown left out
    assert catalog_version(db) == 1


def test_load_csv(db: sqlite_utils.Database, tmp_path: Path) -> None:
    path = tmp_path / "c.csv"
    path.write_text(
        "id,title,description,category,colours,sizes,price,stock,tags\n"
        'B-1,Rain Jacket,"Dry, light",Jackets,navy;black,S:3;M:0,89.00,,waterproof;rain\n'
        'B-2,Scarf,Soft,accessories,"[""red""]","{""one size"": 4}",19.5,4,gift\n',
        encoding="utf-8",
    )
    assert load_catalog(db, path) == 2
    b1, b2 = get_products(db, ["B-1", "B-2"])
    assert b1["category"] == "jackets"  # categories are lower-cased
    assert b1["colours"] == ["navy", "black"] and b1["sizes"] == {"S": 3, "M": 0}
    assert b1["stock"] == 3 and b1["tags"] == ["waterproof", "rain"] and b1["price"] == 89.0
    assert b2["colours"] == ["red"] and b2["sizes"] == {"one size": 4}


@pytest.mark.parametrize(
    ("rows", "line", "fragment"),
    [
        ([_p("A-1"), _p("A-2"), _p("A-3", price="cheap")], 3, "price"),
        ([_p("A-1"), _p("A-2", sizes={"M": -1})], 2, "stock of size 'M'"),
        ([_p("A-1"), _p("A-1")], 2, "duplicate product id 'A-1' (first on line 1)"),
        ([_p("A-1", colour="red")], 1, "unknown field 'colour'"),
        ([{k: v for k, v in _p("A-1").items() if k != "title"}], 1, "missing field 'title'"),
        ([_p("A-1"), ["not", "an", "object"]], 2, "expected a JSON object"),
        ([_p("A-1", price=-3)], 1, "price"),
        ([_p("   ")], 1, "id"),
    ],
)
def test_malformed_jsonl_row_names_line_and_writes_nothing(
    db: sqlite_utils.Database, tmp_path: Path, rows: list[Any], line: int, fragment: str
) -> None:
    load_catalog(db, _jsonl(tmp_path / "old.jsonl", [_p("OLD-1"), _p("OLD-2")]))
    bad = _jsonl(tmp_path / "bad.jsonl", rows)
    with pytest.raises(InputFileError) as exc:
        load_catalog(db, bad)
    assert exc.value.line == line and exc.value.path == str(bad)
    assert fragment in str(exc.value) and str(exc.value).startswith(f"{bad}:{line}: ")
    # nothing half-loaded: the previous catalogue is intact
    assert [p["id"] for p in all_products(db)] == ["OLD-1", "OLD-2"]
    assert catalog_version(db) == 1


def test_bad_json_line(db: sqlite_utils.Database, tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps(_p("A-1")) + "\n\n{not json\n", encoding="utf-8")
    with pytest.raises(InputFileError, match=r"c\.jsonl:3: not valid JSON"):
        load_catalog(db, path)
    assert product_count(db) == 0


def test_malformed_csv_row_names_line(db: sqlite_utils.Database, tmp_path: Path) -> None:
    path = tmp_path / "c.csv"
    path.write_text(
        "id,title,category,sizes,price\n"
        "C-1,Jeans,jeans,30:2;32:1,59.95\n"
        '"C-2","Multi\nline title",jeans,30:1,10\n'
        "C-3,Belt,accessories,S-2,20\n",
        encoding="utf-8",
    )
    with pytest.raises(InputFileError) as exc:
        load_catalog(db, path)
    assert exc.value.line == 5  # C-3 starts on line 5: the quoted title spans lines 3-4
    assert "SIZE:STOCK" in exc.value.problem
    assert product_count(db) == 0


@pytest.mark.parametrize(
    ("name", "text", "fragment"),
    [
        ("c.csv", "id,title,colour\nA,B,red\n", "unknown column 'colour'"),
        ("c.jsonl", "\n\n", "no products"),
        ("c.txt", "x", "expected a .jsonl or .csv"),
    ],
)
def test_bad_files(tmp_path: Path, name: str, text: str, fragment: str) -> None:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    with pytest.raises(InputFileError, match=fragment):
        read_catalog(path)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(InputFileError, match="cannot read"):
        read_catalog(tmp_path / "absent.jsonl")


def test_upsert_load_keeps_other_products(db: sqlite_utils.Database, tmp_path: Path) -> None:
    load_catalog(db, _jsonl(tmp_path / "a.jsonl", [_p("A-1"), _p("A-2")]))
    load_catalog(db, _jsonl(tmp_path / "b.jsonl", [_p("A-2", price=1.0), _p("A-3")]), replace=False)
    assert [(p["id"], p["price"]) for p in all_products(db)] == [
        ("A-1", 50.0), ("A-2", 1.0), ("A-3", 50.0)
    ]  # fmt: skip
    assert db.execute("select count(*) from product_sizes").fetchone()[0] == 6


def test_fts_index_follows_replacement(db: sqlite_utils.Database, tmp_path: Path) -> None:
    load_catalog(db, _jsonl(tmp_path / "a.jsonl", [_p("A-1", title="Velvet Blazer")]))
    load_catalog(db, _jsonl(tmp_path / "b.jsonl", [_p("B-1", title="Linen Shirt")]))
    match = "select count(*) from products_fts where products_fts match ?"
    assert db.execute(match, ["velvet"]).fetchone()[0] == 0
    assert db.execute(match, ["linen"]).fetchone()[0] == 1


def test_sample_catalogue_loads_once(db: sqlite_utils.Database) -> None:
    n = ensure_sample_catalog(db)
    assert 250 <= n <= 350
    assert ensure_sample_catalog(db) == 0  # already there: not loaded again
    products = all_products(db)
    categories = {p["category"] for p in products}
    assert {
        "jackets",
        "coats",
        "dresses",
        "jeans",
        "shoes",
        "knitwear",
        "accessories",
    } <= categories
    rain = [p for p in products if "waterproof" in p["tags"] and p["category"] == "jackets"]
    prices = sorted(p["price"] for p in rain)
    assert prices[0] < 50 and any(50 <= x <= 100 for x in prices) and prices[-1] > 200
    assert all(p["sizes"] and p["stock"] == sum(p["sizes"].values()) for p in products)


def test_sample_file_matches_its_generator(monkeypatch: pytest.MonkeyPatch) -> None:
    path = REPO / "benchmarks" / "make_catalog.py"
    spec = importlib.util.spec_from_file_location("make_catalog", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "make_catalog", mod)  # dataclasses look their module up
    spec.loader.exec_module(mod)
    lines = SAMPLE_CATALOG.read_text(encoding="utf-8").splitlines()
    assert [json.loads(line) for line in lines] == mod.generate()


def test_product_text() -> None:
    text = product_text(_p("A-1", title="Storm Shell", colours=["navy", "olive"], tags=["rain"]))
    assert text == (
        "Storm Shell. Category: jackets. A test product. Colours: navy, olive. Tags: rain."
    )


def test_a_catalogue_write_waits_for_another_writer_instead_of_failing(tmp_path: Path) -> None:
    """Two commands on one log: a catalogue write waits for another command's write lock
    (busy timeout) and then succeeds. (A new user saw two first replays at once end one
    with "database is locked" while embedding the catalogue; catalogue and embedding
    writes now take the write lock first, BEGIN IMMEDIATE. This test does not reproduce
    that race's timing; it pins the waiting.)"""
    import threading
    import time

    path = tmp_path / "log.db"
    Store.open(path).close()
    locked = threading.Event()

    def other_writer() -> None:  # another command: holds the write lock for 0.5 s
        with Store.open(path) as b:
            b.db.execute("BEGIN IMMEDIATE")
            b.db.execute("insert into catalog_loads (source, n_products) values ('other', 0)")
            locked.set()
            time.sleep(0.5)
            b.db.execute("COMMIT")

    other = threading.Thread(target=other_writer)
    with Store.open(path) as a:
        a.db.execute("select count(*) from products").fetchone()  # a read snapshot, as before
        other.start()
        try:
            assert locked.wait(10)
            assert load_catalog(a.db, _jsonl(tmp_path / "c.jsonl", [_p("A-1")])) == 1
        finally:
            other.join()
        assert product_count(a.db) == 1

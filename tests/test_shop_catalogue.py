"""A shop's own catalogue: its categories, and its own words for them, through the CLI.

A CSV whose jackets are sold under ``outerwear``: "rain jacket" must find "Storm Rain
Jacket" (the built-in word "jacket" points to categories the shop does not have, which
must never empty the search), the shop's categories filter by their own names, and
synonyms the shop configures point to its categories.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from chainrun.retrieval.categories import BUILTIN_VOCABULARY, CategoryVocabulary
from chainrun.retrieval.filters import parse_query

SHOP_CSV = """id,title,description,category,colours,sizes,price,tags
SH-1,Storm Rain Jacket,Waterproof shell with a hood,outerwear,navy,S:2;M:3,89.00,rain
SH-2,Quilted Parka,Warm padded winter parka,outerwear,black,M:2;L:2,149.00,winter
SH-3,Merino Crew Jumper,Fine merino wool jumper,knitwear,grey,S:1;M:1,69.00,wool
SH-4,Linen Summer Shirt,Breathable linen shirt,shirts,white,M:4,45.00,linen
SH-5,Trail Waterproof Boots,Hiking boots with a membrane,footwear,brown,42:2,120.00,hiking
"""

CONFIG = """
[steps.retrieve.retrieval]
searches = ["keyword", "keyword_any", "filter"]
min_results = 1
"""


def chainrun(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "chainrun", *args],
        capture_output=True, text=True, timeout=120, cwd=cwd,
    )  # fmt: skip


def _shop(tmp_path: Path, config: str = CONFIG) -> Path:
    (tmp_path / "shop.csv").write_text(SHOP_CSV, encoding="utf-8")
    (tmp_path / "chainrun.toml").write_text(config, encoding="utf-8")
    proc = chainrun("catalog", "load", "shop.csv", "--db", "shop.db", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    return tmp_path


def _retrieve(cwd: Path, query: str) -> dict[str, Any]:
    proc = chainrun("retrieve", query, "--db", "shop.db", "--json", cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    doc: dict[str, Any] = json.loads(proc.stdout)
    return doc


def test_rain_jacket_finds_the_shops_outerwear(tmp_path: Path) -> None:
    cwd = _shop(tmp_path)
    doc = _retrieve(cwd, "rain jacket")
    assert doc["filters"]["categories"] == []  # no category of this catalogue named
    assert [r["id"] for r in doc["results"]][:1] == ["SH-1"]


def test_the_shops_category_names_filter(tmp_path: Path) -> None:
    cwd = _shop(tmp_path)
    doc = _retrieve(cwd, "waterproof outerwear")
    assert doc["filters"]["categories"] == ["outerwear"]
    assert {r["id"] for r in doc["results"]} == {"SH-1"}
    # a built-in word is kept where it points to one of the shop's categories
    assert _retrieve(cwd, "a wool jumper")["filters"]["categories"] == ["knitwear"]


def test_configured_synonyms_name_the_shops_categories(tmp_path: Path) -> None:
    config = CONFIG + 'category_synonyms = { outerwear = ["jacket", "raincoat"], ' \
        'footwear = ["boot"] }\n'  # fmt: skip
    cwd = _shop(tmp_path, config)
    doc = _retrieve(cwd, "rain jacket")
    assert doc["filters"]["categories"] == ["outerwear"]
    assert [r["id"] for r in doc["results"]] == ["SH-1"]
    doc = _retrieve(cwd, "waterproof boots")
    assert doc["filters"]["categories"] == ["footwear"]
    assert [r["id"] for r in doc["results"]] == ["SH-5"]


def test_a_blank_synonym_is_one_config_line(tmp_path: Path) -> None:
    cwd = _shop(tmp_path, CONFIG + 'category_synonyms = { outerwear = [" "] }\n')
    proc = chainrun("retrieve", "rain jacket", "--db", "shop.db", cwd=cwd)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "category_synonyms" in proc.stderr


def test_vocabulary_keeps_only_the_catalogues_categories() -> None:
    vocab = CategoryVocabulary.for_catalogue(
        ["outerwear", "dresses", "accessories"], {"outerwear": ["rain coat"]}
    )
    assert vocab.find("a rain coat") == ("outerwear",)
    assert vocab.find("a jacket") == ()  # jackets/coats/sportswear: none in this catalogue
    assert vocab.find("a red dress and a scarf") == ("dresses", "accessories")
    assert vocab.find("summer accessory") == ("accessories",)
    assert vocab.find("something", label="outerwear") == ("outerwear",)
    # with no catalogue at hand, the built-in words as before
    assert parse_query("waterproof jacket").filters.categories == BUILTIN_VOCABULARY.find(
        "waterproof jacket"
    ) == ("jackets", "coats", "sportswear")  # fmt: skip


def test_a_category_ending_in_ves_is_named_by_its_singular() -> None:
    """A new user's catalogue with the category ``scarves``: "a scarf" named no category
    (the singular was taken as "scarve", the plural minus its s)."""
    vocab = CategoryVocabulary.for_catalogue(["scarves", "gloves", "rainwear"])
    assert vocab.find("a scarf") == ("scarves",)
    assert vocab.find("two scarves") == ("scarves",)
    assert vocab.find("a glove") == ("gloves",)
    assert vocab.find("a rain poncho") == ()

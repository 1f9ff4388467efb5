"""The documentation site: `mkdocs build --strict` passes (no broken link or anchor, no page
outside the navigation), the generated reference pages list every configuration key and
every log column, the README stays a front door, and the site opens in a browser."""

from __future__ import annotations

import html
import importlib
import os
import re
import subprocess
import sys
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from static_files import serve_directory

from chainrun.reference.pages import config_keys, log_tables

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
CHROMIUM = "/usr/bin/chromium"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site as CI builds it: ``mkdocs build --strict`` (warnings are errors)."""
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out


def _sections(site: Path, page: str, level: int) -> dict[str, set[str]]:
    """A built page's sections at heading ``level``: title → the first cells (code) of the
    rows of the tables in that section (``page`` as in the nav, e.g. ``tour.md``)."""
    raw = (site / page.replace(".md", ".html")).read_text(encoding="utf-8")
    sections: dict[str, set[str]] = {}
    for part in re.split(rf"(?=<h{level}[ >])", raw)[1:]:
        head = part[: part.index(f"</h{level}>")]
        title = html.unescape(re.sub(r"<[^>]+>", "", head)).replace("¶", "").strip()
        cells = re.findall(r"<tr>\s*<td><code>([^<]+)</code>", part)
        sections[title] = {html.unescape(c) for c in cells}
    return sections


def _nav_pages(nav: object) -> list[str]:
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, list):
        return [p for item in nav for p in _nav_pages(item)]
    if isinstance(nav, dict):
        return [p for value in nav.values() for p in _nav_pages(value)]
    return []


def _mkdocs_config() -> dict:
    class Loader(yaml.SafeLoader):
        pass

    # mkdocs.yml names a Python function for heading anchors: not needed here
    Loader.add_multi_constructor("tag:yaml.org,2002:python/", lambda *_: None)
    return yaml.load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"), Loader=Loader)


def test_every_page_is_in_the_navigation() -> None:
    nav = set(_nav_pages(_mkdocs_config()["nav"]))
    pages = {
        p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")
        if "hooks" not in p.relative_to(DOCS).parts
    }  # fmt: skip
    assert pages - nav == set(), "pages outside the navigation"
    assert nav - pages == {"measurements.md"}  # made at build time from benchmarks/README.md


def test_the_configuration_page_lists_every_key(site: Path) -> None:
    sections = _sections(site, "reference/configuration.md", 2)
    for key in config_keys():
        if not key.table:
            title = "Top level"
        elif key.table.endswith("[]"):
            title = f"[[{key.table[:-2]}]]"
        else:
            title = f"[{key.table}]"
        assert key.key in sections.get(title, set()), f"{key.path} is not on the page"


def test_the_data_model_page_lists_every_column(site: Path) -> None:
    """Every column of every table a new log has (after all migrations): generated from
    the row model where the table has one, written by hand in the page otherwise."""
    sections = _sections(site, "reference/log.md", 3)
    for table in log_tables():
        assert table.name in sections, f"no section for table {table.name}"
        for column in table.columns:
            assert column.name in sections[table.name], (
                f"{table.name}.{column.name} has no entry in docs/reference/log.md"
            )


def test_the_command_line_page_lists_every_command_and_option(site: Path) -> None:
    import typer.main

    from chainrun.cli import app

    def walk(group: Any, path: str) -> Iterator[tuple[str, Any]]:
        for name, sub in group.commands.items():
            if hasattr(sub, "commands"):
                yield from walk(sub, f"{path} {name}")
            else:
                yield f"{path} {name}", sub

    sections = _sections(site, "reference/cli.md", 2)
    found = list(walk(typer.main.get_command(app), "chainrun"))
    assert len(found) >= 15
    for name, cmd in found:
        assert name in sections, f"{name} is not on the page"
        for param in cmd.params:
            first = (param.metavar or param.name).upper() if param.param_type_name == "argument" \
                else param.opts[0]  # fmt: skip
            assert first in sections[name], f"{name} {first}"


def test_the_benchmarks_page_links_into_the_measurement_log(site: Path) -> None:
    raw = (site / "benchmarks.html").read_text(encoding="utf-8")
    anchors = re.findall(r'href="measurements\.html#([^"]+)"', raw)
    assert len(anchors) >= 8
    log = (site / "measurements.html").read_text(encoding="utf-8")
    for anchor in anchors:  # --strict checks them too; this says which one broke
        assert f'id="{anchor}"' in log, anchor


def test_the_readme_is_a_front_door() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) < 200
    assert readme.count("![") == 1  # one screenshot
    for link in re.findall(r"\]\((docs/[^)#]+)", readme):
        assert (ROOT / link).exists(), link


def test_the_ci_script_runs_the_readme_test_command_exactly() -> None:
    """.ci/run exports the command's environment, then runs the rest of it as one line."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```bash\n(.*?)```", readme, re.S)
    command = next(b.strip() for b in blocks if b.strip().endswith("&& pytest"))
    env = re.match(r"^((?:[A-Z_]+=(?:\"[^\"]*\"|\S+) )+)(.*)$", command)
    assert env, command
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert f"export {env.group(1).strip()}" in ci
    assert env.group(2) in ci
    assert any(line.startswith("mkdocs build --strict") for line in ci)


def test_the_architecture_page_places_every_module() -> None:
    """Every module and package directly under chainrun/ has a row in the layout table."""
    text = (DOCS / "architecture.md").read_text(encoding="utf-8")
    for child in sorted((ROOT / "chainrun").iterdir()):
        if child.name in {"__init__.py", "__main__.py", "py.typed", "data", "__pycache__"}:
            continue
        assert f"`chainrun/{child.stem}" in text, f"chainrun/{child.name} is not in the layout"


#: dotted names in the docs that are not Python: files, OpenTelemetry attribute names
NOT_PYTHON = ("chainrun.toml", "chainrun.db", "chainrun.hedge.", "chainrun.request.",
              "chainrun.tool.")  # OpenTelemetry attribute prefixes


def test_every_python_name_the_docs_cite_exists() -> None:
    """A module, class or function named in the docs (`chainrun.x.y`) can be imported:
    a module moved or renamed fails here instead of leaving the docs behind."""
    pages = [ROOT / "README.md", *DOCS.rglob("*.md")]
    names = {n for p in pages for n in re.findall(r"`(chainrun\.[A-Za-z_.]*[A-Za-z_])`",
                                                    p.read_text(encoding="utf-8"))}  # fmt: skip
    checked = 0
    for name in sorted(names):
        if name.startswith(NOT_PYTHON) or name == "chainrun.":
            continue
        parts = name.split(".")
        for cut in range(len(parts), 0, -1):
            try:
                obj: Any = importlib.import_module(".".join(parts[:cut]))
            except ImportError:
                continue
            for attr in parts[cut:]:
                assert hasattr(obj, attr), f"{name}: no {attr} in {obj!r}"
                obj = getattr(obj, attr)
            break
        else:
            raise AssertionError(f"{name}: no such module")
        checked += 1
    assert checked >= 20


def test_no_issue_numbers_in_the_docs_or_the_measurement_log() -> None:
    texts = {p: p.read_text(encoding="utf-8") for p in [ROOT / "README.md",
             ROOT / "benchmarks" / "README.md", *DOCS.rglob("*.md")]}  # fmt: skip
    for path, text in texts.items():
        assert not re.search(r"\bissues? #?\d+", text, re.I), path


if not Path(CHROMIUM).exists():
    if os.environ.get("CI"):  # .ci/run installs it: missing there is a failure, not a skip
        raise RuntimeError(f"{CHROMIUM} is missing (apt-get install -y chromium)")


@pytest.fixture(scope="module")
def served_site(site: Path) -> Iterator[str]:
    """The built site over HTTP on loopback, as `mkdocs serve` or any static host serves it."""
    with serve_directory(site) as url:
        yield url + "/"


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"{CHROMIUM} is not installed")
def test_the_site_opens_in_a_browser_and_every_nav_link_leads_to_a_page(
    served_site: str, tmp_path: Path
) -> None:
    """The tour page in headless Chromium (``CHAINRUN_DOCS_SCREENSHOT=path`` keeps a
    screenshot of it); every page of the navigation is reached from its menu and has one
    title; the search finds a page; no script error on the way."""
    from playwright.sync_api import sync_playwright

    args = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--no-first-run"]  # fmt: skip
    nav = _nav_pages(_mkdocs_config()["nav"])
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=args, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.goto(served_site + "tour.html")
            assert page.title().startswith("Tour")
            page.screenshot(path=str(os.environ.get("CHAINRUN_DOCS_SCREENSHOT")
                                     or tmp_path / "tour.png"))  # fmt: skip
            links = page.eval_on_selector_all(
                "nav.md-nav--primary a.md-nav__link[href]", "els => els.map(e => e.href)"
            )
            reached = {urllib.parse.urlparse(link).path.lstrip("/") for link in links}
            assert {p.replace(".md", ".html") for p in nav} <= reached
            for target in sorted(reached):  # each a page with one title (over HTTP: quicker)
                with urllib.request.urlopen(served_site + target, timeout=10) as resp:
                    assert resp.read().decode().count("<h1") == 1, target
            page.goto(served_site + "index.html")
            page.fill("input.md-search__input", "hedge delay")
            page.wait_for_selector(".md-search-result__item", timeout=10_000)
            assert errors == []
        finally:
            browser.close()

"""The package's shape, kept by tests: who may import whom, no import circles (not even
ones hidden in a function or under ``TYPE_CHECKING``), and every imported distribution
declared in ``pyproject.toml``. The layout is described in docs/architecture.md."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "chainrun"

#: (modules matching this prefix, must not import any module with these prefixes)
RULES = [
    # the hedging engine knows nothing about LLMs, HTTP or the rest of chainrun
    ("chainrun.hedging", ("chainrun.providers", "chainrun.chain", "chainrun.steps",
                          "chainrun.timing", "chainrun.config", "chainrun.log",
                          "chainrun.errors", "openai", "httpx", "httpx2", "httpcore",
                          "httpcore2")),
    # the provider adapter knows nothing about hedging or the chain
    ("chainrun.providers", ("chainrun.hedging", "chainrun.chain", "chainrun.steps",
                            "chainrun.scheduler", "chainrun.log", "chainrun.serve")),
    # the run log is read and written by the chain, never the other way round
    ("chainrun.log", ("chainrun.chain", "chainrun.steps", "chainrun.scheduler",
                      "chainrun.serve", "chainrun.analysis", "chainrun.audit")),
    # analyses read logs; they do not run chains or serve
    ("chainrun.analysis", ("chainrun.chain", "chainrun.steps", "chainrun.scheduler",
                           "chainrun.serve", "chainrun.audit")),
    ("chainrun.runtime", ("chainrun.chain", "chainrun.steps", "chainrun.scheduler",
                          "chainrun.log", "chainrun.analysis", "chainrun.serve")),
    ("chainrun.lab", ("chainrun.chain", "chainrun.steps", "chainrun.scheduler",
                      "chainrun.log", "chainrun.providers")),
    ("chainrun.timing", ("chainrun.providers", "chainrun.hedging", "chainrun.log")),
    # a replay runs the chain and logs it; the analyses read the log afterwards (the
    # evals run replays, so a replay importing analysis would run back up)
    ("chainrun.replay", ("chainrun.analysis", "chainrun.audit", "chainrun.serve")),
    # evals score runs; the analyses read eval results, never the other way round
    ("chainrun.evals", ("chainrun.analysis", "chainrun.audit", "chainrun.serve")),
    ("chainrun", ("chainrun.cli",)),  # nothing outside the CLI imports the CLI
    # the shopper's identity is a leaf every package may import
    ("chainrun.identity", ("chainrun",)),
    # the tools know nothing of what decides for them (the desk, the pending actions'
    # decisions): one way down, actions -> tools
    ("chainrun.tools", ("chainrun.actions", "chainrun.desk", "chainrun.chain",
                        "chainrun.scheduler", "chainrun.serve")),
    ("chainrun.actions", ("chainrun.desk", "chainrun.chain", "chainrun.scheduler",
                          "chainrun.serve")),
    # the desk admits turns for the chain and every face: it knows neither
    ("chainrun.desk", ("chainrun.chain", "chainrun.scheduler", "chainrun.serve")),
    # the chain asks the desk, never the actions behind it
    ("chainrun.chain", ("chainrun.actions",)),
]  # fmt: skip


def _module(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports, wherever the import stands (module level, inside a
    function, under ``if TYPE_CHECKING``), relative imports resolved."""
    tree = ast.parse(path.read_text())
    here = _module(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.add(mod)
            # `from chainrun.x import y` may import the submodule chainrun.x.y
            out.update(f"{mod}.{a.name}" for a in node.names)
    return out


MODULES = {_module(p): _imports(p) for p in PKG.rglob("*.py")}


def _internal_edges() -> dict[str, set[str]]:
    """Module -> the chainrun modules it imports (names that are not modules dropped)."""
    edges: dict[str, set[str]] = {}
    for mod, imports in MODULES.items():
        edges[mod] = {i for i in imports if i in MODULES and i != mod}
    return edges


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan's algorithm), a
    package's ``__init__`` importing its own submodules left out: that edge is how a
    package re-exports, and a submodule importing its package's ``__init__`` is what
    would close a circle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]
    sys.setrecursionlimit(max(10_000, sys.getrecursionlimit()))

    def succ(v: str) -> set[str]:
        return {w for w in edges[v] if not w.startswith(v + ".")}

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in succ(v):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


@pytest.mark.parametrize(("scope", "forbidden"), RULES)
def test_import_rules(scope: str, forbidden: tuple[str, ...]) -> None:
    bad = []
    for mod, imports in MODULES.items():
        if not (mod == scope or mod.startswith(scope + ".")):
            continue
        if scope == "chainrun" and (mod == "chainrun.cli" or mod.startswith("chainrun.cli.")
                                    or mod == "chainrun.__main__"):  # fmt: skip
            continue
        for imp in imports:
            if any(imp == f or imp.startswith(f + ".") for f in forbidden):
                bad.append(f"{mod} imports {imp}")
    assert not bad, bad


def test_the_statistics_import_nothing_else_of_chainrun() -> None:
    """chainrun.statistics sits below every package that reports a number (the hedge
    window, the analyses, the evals, the audit): it imports no other part of chainrun."""
    bad = [f"{mod} imports {imp}" for mod, imports in MODULES.items()
           if mod.startswith("chainrun.statistics") for imp in imports
           if imp.startswith("chainrun") and not imp.startswith("chainrun.statistics")]  # fmt: skip
    assert not bad, bad


#: the one module that speaks HTTP on aiohttp (a provider's ``transport = "aiohttp"``)
AIOHTTP_MODULE = "chainrun.providers.aiohttp_transport"


def test_one_http_client_library() -> None:
    """chainrun speaks HTTP through httpx2 (the client under openai that the provider's
    pools hold), never httpx beside it, and aiohttp only in the module that carries a
    provider's Chat Completions streams on it."""
    others = {"httpx", "httpcore", "requests", "aiohttp", "urllib3"}
    bad = [f"{mod} imports {imp}" for mod, imports in MODULES.items() for imp in imports
           if imp.split(".")[0] in others
           and not (mod == AIOHTTP_MODULE and imp.split(".")[0] == "aiohttp")]  # fmt: skip
    assert not bad, bad
    assert "aiohttp" in MODULES[AIOHTTP_MODULE]


#: the package root holds at most this many modules besides __init__ and __main__: the
#: ones a newcomer needs there (the chain, its graph and scheduler, errors, events,
#: timing, ...); every other concept is a package of its own
MAX_ROOT_MODULES = 12
#: the log store is the face over modules by concept (opening, lifecycle, writes,
#: reads, eval results): it stays a face
MAX_STORE_LINES = 600


def test_the_package_root_holds_at_most_twelve_modules() -> None:
    root = sorted(p.name for p in PKG.glob("*.py") if p.name not in {"__init__.py",
                                                                   "__main__.py"})  # fmt: skip
    assert len(root) <= MAX_ROOT_MODULES, root


def test_the_log_store_stays_a_face() -> None:
    lines = len((PKG / "log" / "store.py").read_text().splitlines())
    assert lines <= MAX_STORE_LINES, f"chainrun/log/store.py has {lines} lines"


def _private_names_defined(tree: ast.AST) -> set[str]:
    """The ``_private`` attribute names a module gives its own objects: assigned on
    ``self``/``cls`` or declared in a class body (``_x: int = ...``, ``def _x``)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            if isinstance(node.value, ast.Name) and node.value.id in {"self", "cls"}:
                names.add(node.attr)
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                target = item.target if isinstance(item, ast.AnnAssign) else None
                if isinstance(target, ast.Name):
                    names.add(target.id)
                elif isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    names.add(item.name)
                elif isinstance(item, ast.Assign):
                    names.update(n.id for n in item.targets if isinstance(n, ast.Name))
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def _foreign_private_reads(trees: dict[str, ast.AST]) -> list[str]:
    """``module:line reads obj._x`` for each read of a private attribute that only other
    modules give their objects (``self``/``cls`` and ``super()`` left out)."""
    owners: dict[str, set[str]] = {}
    for name, tree in trees.items():
        for attr in _private_names_defined(tree):
            owners.setdefault(attr, set()).add(name)
    bad = []
    for name, tree in trees.items():
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and node.attr in owners):
                continue
            if isinstance(node.value, ast.Name) and node.value.id in {"self", "cls"}:
                continue
            if isinstance(node.value, ast.Call) and ast.unparse(node.value.func) == "super":
                continue
            if name not in owners[node.attr]:
                bad.append(f"{name}:{node.lineno} reads {ast.unparse(node)}")
    return bad


def test_no_module_reads_the_private_attributes_of_another() -> None:
    """``obj._x`` is read only in the module whose objects have ``_x`` (a class's own
    private state, reached through ``self`` or another instance of it there): another
    module asks through a public name. Checked by name, statically: an ``_x`` that two
    modules define is taken as each one's own."""
    trees = {str(p.relative_to(ROOT)): ast.parse(p.read_text()) for p in PKG.rglob("*.py")}
    bad = _foreign_private_reads(trees)
    assert not bad, bad


def test_the_private_attribute_check_finds_a_reader() -> None:
    owner = ast.parse("class A:\n    _cache: dict = {}\n    def __init__(self):\n"
                      "        self._secret = 1\n    def peek(self, other):\n"
                      "        return other._secret\n")  # fmt: skip
    reader = ast.parse("def f(a):\n    return a._secret + len(a._cache) + a._unknown\n")
    assert _private_names_defined(owner) == {"_cache", "_secret"}
    assert _foreign_private_reads({"owner.py": owner, "reader.py": reader}) == [
        "reader.py:2 reads a._secret", "reader.py:2 reads a._cache"]


def test_no_import_circles_anywhere() -> None:
    """No circle among chainrun's modules, counting imports inside functions and under
    ``TYPE_CHECKING`` too: an import moved into a function to dodge a circle still
    closes it."""
    assert _cycles(_internal_edges()) == []


def test_the_circle_finder_finds_a_circle() -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "p": {"p.x"}, "p.x": set()}
    assert _cycles(edges) == [["a", "b", "c"]]


def _declared() -> set[str]:
    """Distribution names declared in pyproject.toml (dependencies and every extra),
    normalised as PEP 503 does."""
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    reqs = list(data["project"]["dependencies"])
    for extra in data["project"].get("optional-dependencies", {}).values():
        reqs.extend(extra)
    names = set()
    for r in reqs:
        m = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", r)
        assert m, r
        names.add(re.sub(r"[-_.]+", "-", m.group(0)).lower())
    return names


def test_every_imported_distribution_is_declared() -> None:
    """Each top-level third-party name imported anywhere in chainrun/ comes from a
    distribution pyproject.toml declares (httpx2 included: imported directly, it must be
    declared even though openai depends on it)."""
    declared = _declared()
    dists = importlib.metadata.packages_distributions()
    stdlib = set(sys.stdlib_module_names)
    missing = []
    for mod, imports in MODULES.items():
        for imp in imports:
            top = imp.split(".")[0]
            if not top or top == "chainrun" or top in stdlib or top == "__future__":
                continue
            owners = {re.sub(r"[-_.]+", "-", d).lower() for d in dists.get(top, [])}
            if not owners:
                # not installed here (an optional extra): it must still be declared by name
                owners = {re.sub(r"[-_.]+", "-", top).lower()}
            if not owners & declared:
                missing.append(f"{mod} imports {top} (from {sorted(owners)})")
    assert not missing, sorted(set(missing))


def _tracked_text_files() -> list[Path]:
    import subprocess

    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:  # not a git checkout (an sdist): read the tree
        return [p for p in ROOT.rglob("*") if p.is_file() and ".git" not in p.parts]
    return [ROOT / line for line in out.stdout.splitlines() if line]


def test_nothing_cites_a_file_outside_the_repository() -> None:
    """Facts are cited to their public source or to a page of the docs, never to notes
    that are not in the repository."""
    outside = ("FIELD" + ".md", "STYLE" + ".md", "../" + "shared/")
    bad = []
    for p in _tracked_text_files():
        if p.suffix not in {".py", ".md", ".toml", ".yml", ".yaml", ".json", ".jsonl", ".js",
                            ".html", ".txt", ".cfg", ""} or not p.exists():
            continue
        text = p.read_text(errors="replace")
        bad += [f"{p.relative_to(ROOT)} cites {o}" for o in outside if o in text]
    assert not bad, bad


def test_code_and_docs_name_no_issue_numbers() -> None:
    """Issue numbers and who did what belong in the project's notes, not in the code or
    the docs, which say what is true now."""
    pattern = re.compile(r"\bissues? #?\d+", re.I)
    bad = []
    for p in _tracked_text_files():
        rel = p.relative_to(ROOT)
        if not p.exists() or rel.parts[0] not in {"chainrun", "docs", "tests", "README.md"}:
            continue
        if p.suffix not in {".py", ".md", ".js", ".html", ".toml", ".yml"}:
            continue
        bad += [f"{rel}: {m.group(0)}" for m in pattern.finditer(p.read_text(errors="replace"))]
    assert not bad, bad


def _definitions(name: str) -> list[str]:
    """The modules of chainrun that define a function or method called ``name``."""
    found = []
    for path in sorted(PKG.rglob("*.py")):
        tree = ast.parse(path.read_text())
        if any(isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == name
               for n in ast.walk(tree)):  # fmt: skip
            found.append(_module(path))
    return found


@pytest.mark.parametrize("name", ["_shadow_settler", "_record", "_call_rows", "call_row",
                                  "race", "step_items"])  # fmt: skip
def test_the_hedged_model_call_is_written_once(name: str) -> None:
    """The shadow settler, the call-row recording and the race of a step's model call live
    in one piece (chainrun.steps.model_call), used by the model step and the tool loop."""
    assert _definitions(name) == ["chainrun.steps.model_call"]


#: the Hedger's private state; the race reads it through its public RaceSite
_HEDGER_PRIVATE = ("_policy", "_call_order", "_running", "_shadows", "_calls",
                   "_seeded_until")  # fmt: skip


def test_no_module_reads_the_hedgers_private_attributes() -> None:
    """``x._policy`` and the like only on ``self`` inside the Hedger's own module, and
    there only inside the Hedger class (its race gets a RaceSite)."""
    offenders = []
    for path in sorted(PKG.rglob("*.py")):
        tree = ast.parse(path.read_text())
        hedger_nodes: set[int] = set()
        for cls in ast.walk(tree):
            if isinstance(cls, ast.ClassDef) and cls.name in ("Hedger", "HedgeOutcome"):
                hedger_nodes |= {id(n) for n in ast.walk(cls)}
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and node.attr in _HEDGER_PRIVATE
                    and id(node) not in hedger_nodes):  # fmt: skip
                owner = node.value
                # a class's own private state (the advisor's _running, say) is its own
                if isinstance(owner, ast.Name) and owner.id == "self":
                    if path.name != "engine.py":
                        continue
                offenders.append(f"{_module(path)}:{node.lineno}: .{node.attr}")
    assert offenders == []


def test_the_model_step_has_no_pass_through_members() -> None:
    """The tool loop gets what it needs as arguments, not through members of the model
    step that only hand its insides on (and no protocol mirrors them)."""
    from chainrun.steps import tool_use
    from chainrun.steps.llm import LLMStep

    for name in ("hedger", "providers", "store", "holdback", "record_holdback",
                 "result_of", "call_rows", "request"):  # fmt: skip
        assert not hasattr(LLMStep, name), name
    assert not hasattr(tool_use, "ToolStep")


def test_one_survival_estimator() -> None:
    """The Kaplan-Meier estimate is written once, below the hedge window and the offline
    advisor that both use it."""
    assert _definitions("kaplan_meier") == ["chainrun.statistics.survival"]
    assert _definitions("product_limit") == ["chainrun.statistics.survival"]


#: the longest ``Chain.stream_turn`` may be, in lines (docstring included): admit, run,
#: record; what the turn needs before it starts is the desk's
MAX_STREAM_TURN_LINES = 60


def _function(path: Path, qualname: str) -> ast.FunctionDef | ast.AsyncFunctionDef:
    cls, _, name = qualname.rpartition(".")
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and item.name == name:
                    return item
    raise AssertionError(f"no {qualname} in {path}")


def _assigned_attributes(fn: ast.AST, base: str) -> list[str]:
    """``base.x = ...`` (and ``base.x.y = ...``) assignments inside ``fn``."""
    out = []
    for node in ast.walk(fn):
        targets = (node.targets if isinstance(node, ast.Assign) else
                   [node.target] if isinstance(node, ast.AugAssign | ast.AnnAssign) else [])
        for t in targets:
            root = t
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(t, ast.Attribute) and isinstance(root, ast.Name) and root.id == base:
                out.append(ast.unparse(t))
    return out


def test_a_turn_is_admit_run_record() -> None:
    """``Chain.stream_turn`` asks the front desk once and hands the run what it admitted as
    one value: it assigns nothing on the run or its tools (it used to hand the pending
    actions' decision on by ``run.tools.confirmed = ...``, ``run.tools.claim = ...``,
    ``run.verdicts[...] = ...``), stays under 60 lines, and calls into no module of
    ``chainrun.actions`` (the desk does, once a turn)."""
    chain = PKG / "chain.py"
    turn = _function(chain, "Chain.stream_turn")
    assert turn.end_lineno is not None
    assert turn.end_lineno - turn.lineno + 1 < MAX_STREAM_TURN_LINES
    fns = [n for n in ast.walk(ast.parse(chain.read_text()))
           if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]  # fmt: skip
    assert not [a for fn in fns for a in _assigned_attributes(fn, "run")]
    subscripts = [ast.unparse(n) for fn in fns for n in ast.walk(fn)
                  if isinstance(n, ast.Subscript) and isinstance(n.ctx, ast.Store)]  # fmt: skip
    assert not [s for s in subscripts if s.startswith("run.")], subscripts
    admits = [n for n in ast.walk(turn) if isinstance(n, ast.Call)
              and ast.unparse(n.func) == "self.desk.admit"]  # fmt: skip
    assert len(admits) == 1
    init = _function(PKG / "scheduler.py", "TurnRun.__init__")
    assert "admitted" in [a.arg for a in init.args.args]
    assert not any(i.startswith("chainrun.actions") for i in MODULES["chainrun.chain"])


def test_the_desk_decides_a_pending_action_once_a_turn() -> None:
    """Of the actions' decisions, the desk asks ``decide`` once (and ``check_known`` for
    an explicit id before it), never the log's action tables itself."""
    desk = ast.parse((PKG / "desk" / "desk.py").read_text())
    calls = [ast.unparse(n.func) for n in ast.walk(desk) if isinstance(n, ast.Call)
             and ast.unparse(n.func).startswith("self.confirmations.")]  # fmt: skip
    assert calls.count("self.confirmations.decide") == 1
    assert calls.count("self.confirmations.check_known") == 1
    log_actions = ("pending_actions", "open_actions", "decide_action", "action_row",
                   "record_action", "start_action", "reopen_action")
    assert not [n.attr for n in ast.walk(desk) if isinstance(n, ast.Attribute)
                and n.attr in log_actions]  # fmt: skip

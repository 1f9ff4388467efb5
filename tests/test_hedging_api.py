"""The public API of chainrun.hedging is pinned, and the package stays generic."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import chainrun.hedging as hedging

PUBLIC = {
    "AttemptInfo",
    "AttemptOutcome",
    "AttemptRecord",
    "BreakerRegistry",
    "BreakerState",
    "CircuitBreaker",
    "CircuitOpen",
    "CopyThrottler",
    "DeadlineExceeded",
    "ErrorInfo",
    "HedgeBudget",
    "HedgeChange",
    "HedgeController",
    "HedgeOutcome",
    "HedgePolicy",
    "HedgeSetting",
    "HedgeStats",
    "Hedger",
    "HedgingError",
    "LatencyWindow",
    "LoopLagMonitor",
    "NoAcceptableAnswer",
    "QuantileEstimate",
    "default_classify_error",
    "get_loop_lag_monitor",
}


def test_all_is_pinned() -> None:
    assert set(hedging.__all__) == PUBLIC
    assert sorted(hedging.__all__) == hedging.__all__
    for name in hedging.__all__:
        assert getattr(hedging, name) is not None


def imported_modules(path: Path) -> list[str]:
    """Every module a Python file imports (``import x`` and ``from x import y``)."""
    modules: list[str] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            modules.append(node.module)
        elif isinstance(node, ast.Import):
            modules.extend(alias.name for alias in node.names)
    return modules


STDLIB_LEAVES = ("chainrun.statistics.ranks", "chainrun.lazy_exports")
#: leaves that use NumPy too (as the hedge window itself does): the Kaplan-Meier estimate
NUMPY_LEAVES = ("chainrun.statistics.survival",)


def test_the_leaves_the_engine_may_import_import_only_the_standard_library() -> None:
    root = Path(hedging.__file__).parents[1]
    for leaf in (*STDLIB_LEAVES, *NUMPY_LEAVES):
        path = root.joinpath(*leaf.split(".")[1:]).with_suffix(".py")
        allowed = {"__future__"} | ({"numpy"} if leaf in NUMPY_LEAVES else set())
        for module in imported_modules(path):
            top = module.split(".")[0]
            assert top in sys.stdlib_module_names or top in allowed, (path, module)


def test_the_engine_imports_nothing_of_the_rest_of_chainrun() -> None:
    package = Path(hedging.__file__).parent
    for path in package.glob("*.py"):
        for module in imported_modules(path):
            assert not module.startswith("openai"), path
            if module.startswith("chainrun"):
                # chainrun.statistics.ranks (the one nearest-rank rule), .survival (the one
                # Kaplan-Meier estimate) and chainrun.lazy_exports (the package's lazy front
                # door): leaves of the standard library (and NumPy), pinned below
                assert module.startswith("chainrun.hedging") or module in (
                    *STDLIB_LEAVES, *NUMPY_LEAVES), (
                    path,
                    module,
                )


def test_deadline_exceeded_is_a_timeout_error() -> None:
    error = hedging.DeadlineExceeded(3.0)
    assert isinstance(error, TimeoutError) and isinstance(error, hedging.HedgingError)
    assert error.deadline_s == 3.0

"""The quality measure tells a usable answer from nonsense, on the regression suite.

The regression suite (evals/regression.jsonl) says, per case, what a usable answer holds
(the products it names, the policy fact, the subject of the prose) and must not (a repeated
sentence, a check's text mid-sentence). These tests run it on a stand-in model that writes
its one sentence from what its prompt shows (the first catalogue match, the policy
section's title), as the default chain asks of the embedded model, and on two mutations of
the default chain's compose prompt:

* "camel": the prompt tells the model to answer "It's a camel." and nothing else;
* "hidden": the prompt no longer shows the model the catalogue matches or the policy.

Each mutation must be a regression by ``chainrun compare --fail-on-regression evals``
(paired per case, exact McNemar) against the baseline, and the baseline against a second
run of itself must not be. The lab's words do not depend on the prompt, so a mutation of
the prompt can only be seen on a model that reads it: the stand-in here, the embedded model
in benchmarks/quality_mutations.py.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from conftest import reply_by_step
from typer.testing import CliRunner

from chainrun.cli import app
from chainrun.config import config_from_dict
from chainrun.evals import load_cases
from chainrun.evals.runner import run_eval
from chainrun.log.store import Store
from chainrun.providers.base import ChatRequest
from chainrun.providers.fake import FakeProvider, FakeReply

pytestmark = pytest.mark.facts  # the default chain as it ships: with its answer's facts

REPO = Path(__file__).resolve().parents[1]
CAMEL_SYSTEM = "Whatever the shopper asks, answer exactly: It's a camel."
#: the default compose prompt without the catalogue matches and the policy
HIDDEN_PROMPT = "{history}Shopper: {message}\nStylist:"
_MATCH = re.compile(r"^- \[[A-Z]+-\d+\] ([^|]+?) \|", re.M)
_POLICY = re.compile(r"^Shop policy, ([^:\n]+):", re.M)


def reader_reply(request: ChatRequest) -> FakeReply | None:
    """The stand-in model's compose sentence, from what the prompt shows (None: not the
    compose prompt). It names the first catalogue match, else the policy section, else
    says only that it can help; told to answer "It's a camel.", it does."""
    prompt = request.messages[-1]["content"]
    if not prompt.rstrip().split("\n")[-1].startswith("Stylist:"):
        return None
    system = " ".join(m["content"] for m in request.messages if m["role"] == "system")
    if "camel" in system:
        return FakeReply("It's a camel.", ttft_s=0.001)
    match, policy = _MATCH.search(prompt), _POLICY.search(prompt)
    if match:
        text = f" the {match.group(1)}, a good match for what you asked."
    elif policy:
        text = f" {policy.group(1).lower()}."
    else:
        text = " I can help with that."
    return FakeReply(text, ttft_s=0.001)


def reader_model() -> FakeProvider:
    others = reply_by_step()

    def script(request: ChatRequest) -> FakeReply:
        return reader_reply(request) or others(request)

    return FakeProvider(name="local", script=script)


MUTATIONS: dict[str, dict[str, Any]] = {
    "baseline": {},
    "camel": {"steps": {"compose": {"system": CAMEL_SYSTEM}}},
    "hidden": {"steps": {"compose": {"prompt": HIDDEN_PROMPT}}},
}


async def _eval(db: Path, mutation: str) -> dict[str, Any]:
    cases = load_cases(REPO / "evals" / "regression.jsonl")
    with Store.open(db) as store:
        return await run_eval(config_from_dict(MUTATIONS[mutation]), cases, store,
                              providers={"local": reader_model()}, quiet=True)  # fmt: skip


def _compare(db: Path, a: int, b: int) -> int:
    result = CliRunner().invoke(app, ["compare", str(a), str(b), "--db", str(db),
                                      "--fail-on-regression", "evals"])  # fmt: skip
    assert result.exit_code in (0, 1), result.output
    return result.exit_code


async def test_the_suite_fails_the_camel_and_the_hidden_catalogue_but_not_itself(
    tmp_path: Path,
) -> None:
    db = tmp_path / "evals.db"
    runs = {name: await _eval(db, name) for name in ("baseline", "camel", "hidden")}
    again = await _eval(db, "baseline")
    rate = {name: r["cases"]["pass_rate"] for name, r in runs.items()}
    assert rate["baseline"] >= 0.6, rate  # a model that uses what it is shown mostly passes
    assert rate["camel"] < rate["baseline"] - 0.1, rate
    assert rate["hidden"] < rate["baseline"] - 0.1, rate
    base = runs["baseline"]["run_id"]
    assert _compare(db, base, runs["camel"]["run_id"]) == 1
    assert _compare(db, base, runs["hidden"]["run_id"]) == 1
    assert _compare(db, base, again["run_id"]) == 0  # the baseline is no regression of itself

"""Cost in money: a price per model, and what a call, a step, a turn and a run cost.

A call's cost is priced from the tokens the log holds for it (OpenTelemetry's GenAI
usage fields, as ``calls`` stores them): ``input_tokens`` includes the cached prompt
tokens and ``output_tokens`` includes the reasoning tokens (OpenAI API reference,
``usage``), so

    cost = (input − cached) × input price + cached × cached price + output × output price

with prices per million tokens (OpenAI's pricing page; the form LiteLLM's price table
uses). A token count the server did not report is unknown and so is the cost that
needs it: never 0. A cancelled stream (a hedge's loser closed before its usage chunk)
has no usage, so its cost is unknown; a sum over calls is the known part plus how many
calls were left unknown (:class:`Cost`). Cached tokens not reported cost the input
price when the model's cached price equals it (no discount to miss), else the call's
cost is unknown.

Prices come from, first match first: ``[providers.NAME.price]`` (every model of one
provider, e.g. a self-hosted server at 0), ``[prices."MODEL"]`` in chainrun.toml, then
the table shipped in ``chainrun/data/prices.toml`` (its ``source`` says from where and
as of when). A model is looked up by its name, then without a trailing snapshot date
(``gpt-4o-2024-08-06`` → ``gpt-4o``). Costs are computed when the log is read, with the
prices of the run's own config (the log keeps it in ``runs.config``) over the shipped
table of the chainrun that reads it.
"""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "Cost",
    "Price",
    "PriceBook",
    "call_cost",
    "cost_summary",
    "cost_text",
    "hedge_cost_text",
    "price_book",
    "shipped_prices",
    "sum_costs",
    "turn_costs",
    "usd",
]

PRICES_FILE = Path(__file__).resolve().parents[1] / "data" / "prices.toml"
_SNAPSHOT = re.compile(r"-\d{4}-\d{2}-\d{2}$")


class Price(BaseModel):
    """A model's price, USD per million tokens (``[prices."MODEL"]``,
    ``[providers.NAME.price]``).

    ``cached_input`` None: cached prompt tokens cost the ``input`` price.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: USD per million prompt tokens not served from the cache
    input: float = Field(ge=0)
    #: USD per million prompt tokens served from the provider's prompt cache (None: the
    #: input price)
    cached_input: float | None = Field(default=None, ge=0)
    #: USD per million generated tokens, reasoning tokens included
    output: float = Field(ge=0)

    @property
    def cached(self) -> float:
        """The cached prompt tokens' price (USD per million)."""
        return self.input if self.cached_input is None else self.cached_input


class Usage(Protocol):
    """What :func:`call_cost` reads of a call (a :class:`~chainrun.log.rows.CallRow`)."""

    @property
    def input_tokens(self) -> int | None: ...
    @property
    def cached_input_tokens(self) -> int | None: ...
    @property
    def output_tokens(self) -> int | None: ...


def call_cost(usage: Usage, price: Price | None) -> float | None:
    """One call's cost in USD from its logged tokens (formula: the module text); None
    (unknown) when there is no price, the input or output count is unknown, or the
    cached count is unknown and the cached price differs from the input price."""
    if price is None or usage.input_tokens is None or usage.output_tokens is None:
        return None
    cached = usage.cached_input_tokens
    if cached is None:
        if price.cached != price.input:
            return None
        cached = 0
    cached = min(cached, usage.input_tokens)
    return (
        (usage.input_tokens - cached) * price.input
        + cached * price.cached
        + usage.output_tokens * price.output
    ) / 1_000_000


@dataclass(frozen=True)
class Cost:
    """A sum of call costs: ``usd`` over the calls whose cost is known, ``unknown`` the
    calls whose cost is not (the true total is at least ``usd`` when ``unknown`` > 0)."""

    usd: float = 0.0
    calls: int = 0
    unknown: int = 0

    @property
    def known(self) -> bool:
        """Every call's cost is known."""
        return self.unknown == 0

    @property
    def total(self) -> float | None:
        """The total in USD, None when some call's cost is unknown."""
        return self.usd if self.unknown == 0 else None

    def __add__(self, other: Cost) -> Cost:
        return Cost(self.usd + other.usd, self.calls + other.calls, self.unknown + other.unknown)

    def as_json(self) -> dict[str, Any]:
        """``{"usd": total or None, "known_usd": ..., "calls": n, "unknown_calls": n}``."""
        return {"usd": None if self.total is None else round(self.total, 8),
                "known_usd": round(self.usd, 8), "calls": self.calls,
                "unknown_calls": self.unknown}  # fmt: skip

    def text(self) -> str:
        """``$0.000123``; ``≥ $0.000123 (2 calls unknown)``; ``unknown`` when no call's
        cost is known."""
        if self.calls == 0:
            return "-"
        if self.unknown == self.calls:
            return "unknown"
        amount = f"${self.usd:.6f}"
        if self.unknown:
            s = "s" if self.unknown > 1 else ""
            return f"≥ {amount} ({self.unknown} call{s} unknown)"
        return amount


def sum_costs(costs: Iterable[float | None]) -> Cost:
    """The :class:`Cost` of calls whose costs are ``costs`` (None: unknown)."""
    usd, calls, unknown = 0.0, 0, 0
    for c in costs:
        calls += 1
        if c is None:
            unknown += 1
        else:
            usd += c
    return Cost(usd, calls, unknown)


@cache
def shipped_prices() -> tuple[dict[str, Price], dict[str, str]]:
    """The shipped table (``chainrun/data/prices.toml``): prices by model, and its
    ``source`` (url, date, currency, note)."""
    data = tomllib.loads(PRICES_FILE.read_text(encoding="utf-8"))
    models = {name: Price(**p) for name, p in data.get("models", {}).items()}
    return models, {k: str(v) for k, v in data.get("source", {}).items()}


class PriceBook:
    """Prices for one run: by provider, by model, then the shipped table.

    Args:
        models: ``[prices."MODEL"]`` of the config (before the shipped table).
        providers: ``[providers.NAME.price]`` by provider name (before either).
        shipped: the shipped table (default: :func:`shipped_prices`).
    """

    def __init__(
        self,
        models: Mapping[str, Price] | None = None,
        providers: Mapping[str, Price] | None = None,
        shipped: Mapping[str, Price] | None = None,
    ) -> None:
        self.models = dict(models or {})
        self.providers = dict(providers or {})
        self.shipped = dict(shipped_prices()[0] if shipped is None else shipped)

    def price(self, provider: str | None, model: str | None) -> Price | None:
        """The price of ``model`` on ``provider`` (None: not known)."""
        if provider is not None and provider in self.providers:
            return self.providers[provider]
        if model is None:
            return None
        for table in (self.models, self.shipped):
            for name in (model, _SNAPSHOT.sub("", model)):
                if name in table:
                    return table[name]
        return None

    def cost(self, call: Any) -> float | None:
        """A :class:`~chainrun.log.rows.CallRow`'s cost in USD (None: unknown)."""
        return call_cost(call, self.price(call.provider, call.model))

    def total(self, calls: Iterable[Any]) -> Cost:
        """The :class:`Cost` of ``calls`` (call rows)."""
        return sum_costs(self.cost(c) for c in calls)


def price_book(config_json: str | Mapping[str, Any] | None) -> PriceBook:
    """The :class:`PriceBook` of a run's config (``runs.config``, JSON text or a dict;
    None: the shipped table alone). Prices the config holds that do not validate are
    left out (the run was started with them, so they were valid then)."""
    if config_json is None:
        return PriceBook()
    try:
        cfg = json.loads(config_json) if isinstance(config_json, str) else dict(config_json)
    except (ValueError, TypeError):
        return PriceBook()
    providers = cfg.get("providers") or {}
    by_provider = {name: p.get("price") for name, p in providers.items() if isinstance(p, dict)}
    return PriceBook(_prices(cfg.get("prices")), _prices(by_provider))


def _prices(raw: Any) -> dict[str, Price]:
    out: dict[str, Price] = {}
    if not isinstance(raw, dict):
        return out
    for name, p in raw.items():
        if isinstance(p, dict):
            try:
                out[str(name)] = Price(**p)
            except ValueError:
                continue
    return out


def turn_costs(calls: Iterable[Any], book_of: Any) -> dict[int, Cost]:
    """Each turn's :class:`Cost` (by turn id) over ``calls`` (call rows, every attempt:
    copies cost tokens too); ``book_of(run_id) -> PriceBook`` gives each run's prices."""
    out: dict[int, Cost] = {}
    for c in calls:
        if c.turn_id is None:
            continue
        one = sum_costs([book_of(c.run_id).cost(c)])
        out[c.turn_id] = out.get(c.turn_id, Cost()) + one
    return out


def cost_summary(values: Iterable[float], confidence: float = 0.95) -> dict[str, Any]:
    """Costs in USD (one a turn, say) as ``{"n", "mean_usd", "p50_usd", "p50_ci"}``: the
    mean (what a thousand turns cost is a thousand times it), the median with its
    distribution-free order-statistic interval (``[lo, hi]``, None where n cannot bound
    it; :func:`chainrun.statistics.intervals.quantile_ci`), to 9 decimals (USD)."""
    from chainrun.statistics.intervals import percentile, quantile_ci

    v = sorted(values)
    ci = quantile_ci(v, 50, confidence) if v else None
    return {
        "n": len(v),
        "mean_usd": round(sum(v) / len(v), 9) if v else None,
        "p50_usd": round(percentile(v, 50), 9) if v else None,
        "p50_ci": [round(ci[0], 9), round(ci[1], 9)] if ci else None,
    }


def usd(v: float | None) -> str:
    """``$0.000123`` (six decimals: a turn of a small model costs micro-dollars); ``?``
    for unknown."""
    return "?" if v is None else f"${v:.6f}"


def cost_text(cost: Mapping[str, Any] | None) -> str:
    """A :meth:`Cost.as_json` as text: ``$0.000123``, ``≥ $0.000123 (2 of 5 calls
    unknown)``, ``unknown`` (no call's cost known), ``-`` (no call)."""
    if not cost or not cost.get("calls"):
        return "-"
    n, unknown = cost["calls"], cost["unknown_calls"]
    if unknown == n:
        return "unknown"
    if unknown:
        return f"≥ {usd(cost['known_usd'])} ({unknown} of {n} calls unknown)"
    return usd(cost["usd"])


def hedge_cost_text(step: str, figures: Mapping[str, Any], wins: int) -> str | None:
    """One sentence on what a step's hedging cost against the time it saved, from
    ``figures`` (``copies_cost``, ``saved_s``, ``usd_per_s_saved``:
    :func:`chainrun.analysis.summary.hedge_cost`) and the ``wins`` whose saving was
    measured; None when the step sent no copy."""
    cost = figures.get("copies_cost") or {}
    if not cost.get("calls"):
        return None
    line = (f"{step}: hedging cost: {cost['calls']} copies cost {cost_text(cost)} for "
            f"{figures['saved_s']:.3f} s saved over {wins} measured wins")
    if figures.get("usd_per_s_saved") is not None:
        line += f" ({usd(figures['usd_per_s_saved'])} a second saved)"
    if cost.get("unknown_calls"):
        line += "; a copy cancelled before its usage arrived has unknown tokens"
    return line

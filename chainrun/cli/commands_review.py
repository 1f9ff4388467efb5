"""``chainrun review A B``: two runs' answers to the same requests judged side by side."""

from __future__ import annotations

import secrets
import sys
from typing import Annotated, Any

import typer

from chainrun.cli import DEFAULT_DB_PATH, DbOpt, JsonOpt, app, handle_errors, out, print_json


@app.command("review")
@handle_errors
def review_command(
    run_a: Annotated[int, typer.Argument(help="The baseline run (see `chainrun runs`).")],
    run_b: Annotated[int, typer.Argument(help="The candidate run, on the same requests.")],
    db: DbOpt = DEFAULT_DB_PATH,
    reviewer: Annotated[
        str, typer.Option(help="Who judges (kept with every judgement; several may review).")
    ] = "reviewer",
    port: Annotated[int, typer.Option(min=0, max=65535, help="TCP port (0: any free).")] = 8070,
    seed: Annotated[
        int | None, typer.Option(help="Seed of the random order shown (default: a new one).")
    ] = None,
    summary: Annotated[
        bool, typer.Option("--summary", help="Print the paired result and exit.")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Serve a page on loopback that shows each request both runs answered, the two
    answers side by side in a random, hidden order, for a person to judge by keyboard
    (better / the same / worse, tags, a note); judgements go to the log. --summary gives
    the share judged better, worse and the same with intervals, a sign test, the tags by
    run and the reviewers' agreement."""
    from chainrun.log.store import Store
    from chainrun.review.pairs import shared_pairs
    from chainrun.review.summary import review_summary

    with Store.open(db, create=False) as store:
        if summary:
            doc = review_summary(store.review_judgements(run_a, run_b),
                                 len(shared_pairs(store, run_a, run_b)))  # fmt: skip
            if as_json:
                print_json(doc)
                return
            out.print(_summary_text(run_a, run_b, doc), markup=False)
            return
        from chainrun.review.server import serve_review

        serve_review(store, run_a, run_b, reviewer=reviewer, port=port,
                     seed=secrets.randbits(32) if seed is None else seed,
                     announce=lambda url: print(f"chainrun review: {url} (Ctrl-C to stop)",
                                                file=sys.stderr, flush=True))  # fmt: skip


def _pct(block: dict[str, Any]) -> str:
    ci = block["ci95"]
    share = block["share"]
    if share is None:
        return "-"
    return f"{share:.0%} ({block['n']}; 95% CI {ci[0]:.0%}-{ci[1]:.0%})"


def _summary_text(run_a: int, run_b: int, doc: dict[str, Any]) -> str:
    lines = [f"review of run {run_b} against run {run_a}: {doc['n_judgements']} judgements "
             f"of {doc['n_shared']} shared requests",
             f"  run {run_b} better: {_pct(doc['b_better'])}",
             f"  run {run_b} worse:  {_pct(doc['b_worse'])}",
             f"  the same:      {_pct(doc['same'])}"]  # fmt: skip
    st = doc["sign_test"]
    verdict = doc["verdict"]
    line = (f"  sign test: {st['b_preferred']} of {st['decisive']} decisive judgements prefer "
            f"run {run_b}, p = {st['p_value']:.3g}: {verdict}")
    if verdict == "inconclusive" and doc["to_decide"]:
        line += f" (at this split, about {doc['to_decide']} decisive judgements would decide)"
    lines.append(line)
    for side, run in (("a", run_a), ("b", run_b)):
        if doc["tags"][side]:
            tags = ", ".join(f"{t} {n}" for t, n in doc["tags"][side].items())
            lines.append(f"  tags on run {run}: {tags}")
    agree = doc["agreement"]
    if agree["reviewer_pairs"]:
        kappa = agree["cohens_kappa"]
        lines.append(f"  agreement: {agree['percent_agreement']:.0%} of "
                     f"{agree['reviewer_pairs']} reviewer pairs"
                     + (f", Cohen's kappa {kappa}" if kappa is not None else ""))  # fmt: skip
    return "\n".join(lines)

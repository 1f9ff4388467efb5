"""A follow-up's answer TTFT on one embedded server, and where its time goes: the
floor that a conversation's later turns meet with this prompt layout.

What: ``chainrun replay replays/conversations.jsonl`` (10 conversations, 28 turns, the
default chain on the embedded model, Gemma 3 270M on llama-server) for ``--runs`` runs,
each cold (this checkout's own server stopped first with ``chainrun local down``, which
stops only this checkout's; the replay starts it again with empty prompt caches), each
into its own SQLite log. From the logs, for turn 1 and for turns at index ≥ 2:

- answer TTFT (``turns.answer_ttft_ms``): n, p50 with its distribution-free 95%
  interval (:func:`chainrun.statistics.intervals.quantile_ci`);
- where it goes (ms), per turn and as medians: ``before_compose`` (the answer step's
  ``steps.started_offset_ms``; within it each earlier step's ``duration_ms``: classify,
  retrieve, policy, which may overlap), ``call_ttft`` (the compose call's ``ttft_ms``,
  its first round's winning attempt) split into the server's ``prompt_ms`` (llama-server's
  ``timings``: ``prompt_n`` new prompt tokens, ``cache_n`` reused) and
  ``call_ttft − prompt_ms`` (the first token's decode, sampling and HTTP), and
  ``after_call`` (answer TTFT − compose start − call TTFT: the step's own work before
  its request and the hold between the call's first token and the answer's first text);
- the follow-ups split by what is new in their compose prompt: ``stayed`` (no new policy
  section or product line: the route and its material stayed) and ``changed`` (a policy
  section or products the conversation's earlier prompt did not hold);
- what is new in each follow-up's prompt: the text after its longest common prefix with
  the previous turn's compose prompt and answer (the text a slot could hold; what the
  server did reuse is ``cache_n``, and the previous prompt's tokens it did not,
  ``previous_prompt_not_reused``), cut
  at the layout's markers (``Shop policy, ...:``, ``Catalogue matches:``, ``Shopper:``,
  ``Stylist:``) into parts, each tokenized alone by the checkout's llama-server
  (``POST /tokenize``; the llama.cpp server README) when it is up;
- the floor: median new prompt tokens × median ms per prompt token + median
  (call TTFT − prompt ms) + median before_compose + median after_call, for all
  follow-ups and per group, beside the measured p50.

Run (a timing run: alone, under the lock)::

    flock /tmp/chainrun-timing.lock env PYTHONPATH=. python benchmarks/followup_floor.py \\
        --runs 2 --out benchmarks/results/followup_floor.json

``--from-dir DIR`` reads the logs (``run-N.db``) and run facts (``runs.json``: the
command, each run's start, end and load) a previous run kept with ``--keep-dir DIR``,
without running anything; given more than once, their runs are pooled.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import finish, median, new_document, r

from chainrun.statistics.intervals import percentile, quantile_ci

ROOT = Path(__file__).resolve().parents[1]
REPLAY = "replays/conversations.jsonl"
ANSWER_STEP = "compose"
#: the steps before the answer step in the default chain
EARLY_STEPS = ("classify", "retrieve", "policy")
#: the attempt outcomes whose answer a step used (chainrun.log.rows.WINNER_OUTCOMES)
WINNERS = ("not_fired", "primary", "duplicate")
#: the compose prompt's layout markers: a new part starts at each
MARKERS = re.compile(r"(Shop policy, [^\n:]*:\n|Catalogue matches:\n|Shopper: |Stylist: )")
PART_NAMES = {"Shop policy": "policy_section", "Catalogue matches": "catalogue",
              "Shopper": "message", "Stylist": "lead"}  # fmt: skip


# ------------------------------------------------------------------ running


def uptime() -> str:
    """``uptime``'s line (load averages over 1, 5 and 15 minutes)."""
    done = subprocess.run(["uptime"], capture_output=True, text=True, check=False)
    return done.stdout.strip()


def load1() -> float:
    """The 1-minute load average."""
    return round(os.getloadavg()[0], 2)


def stop_server() -> None:
    """Stop this checkout's own embedded model server (``chainrun local down``: other
    checkouts' servers are left alone); none running is fine."""
    subprocess.run([sys.executable, "-m", "chainrun", "local", "down"], cwd=ROOT,
                   env=child_env(), capture_output=True, text=True, check=False)  # fmt: skip


def child_env() -> dict[str, str]:
    """The environment with this checkout first on the import path (an editable install
    of another checkout would otherwise be imported)."""
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def run_replay(db: Path) -> dict[str, Any]:
    """One cold replay into ``db``: its start and end (UTC), load and wall time (s).

    Raises:
        SystemExit: the replay exited non-zero (its last output says why).
    """
    stop_server()
    meta: dict[str, Any] = {"db": db.name, "started": now(), "uptime_start": uptime(),
                            "load_start": load1()}  # fmt: skip
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "chainrun", "replay", REPLAY, "--db", str(db)],
                          cwd=ROOT, env=child_env(), capture_output=True, text=True,
                          check=False)  # fmt: skip
    meta |= {"wall_s": round(time.perf_counter() - t0, 1), "ended": now(),
             "uptime_end": uptime(), "load_end": load1(), "exit": done.returncode}  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"replay into {db} exited {done.returncode}: {done.stderr[-1500:]}")
    return meta


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


# ------------------------------------------------------------------ reading a log


def prompt_text(prompt: str | None) -> str:
    """A logged prompt (a JSON list of messages) as its messages' contents, one after
    another (the chat template's role markers left out)."""
    if not prompt:
        return ""
    try:
        messages = json.loads(prompt)
    except json.JSONDecodeError:
        return prompt
    if not isinstance(messages, list):
        return str(messages)
    return "\n".join(str(m.get("content") or "") for m in messages if isinstance(m, dict))


def common_prefix(a: str, b: str) -> int:
    """The length (characters) of the longest common prefix of ``a`` and ``b``."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def new_parts(text: str) -> list[tuple[str, str]]:
    """``text`` (a prompt's part the cache cannot hold) cut at the layout's markers:
    ``[(part name, text)]``; what comes before the first marker is ``history``."""
    parts: list[tuple[str, str]] = []
    pos, name = 0, "history"
    for m in MARKERS.finditer(text):
        if m.start() > pos:
            parts.append((name, text[pos:m.start()]))
        name = PART_NAMES[m.group(1).split(",")[0].split(":")[0]]
        pos = m.start()
    if pos < len(text):
        parts.append((name, text[pos:]))
    return parts


def read_log(db: Path, run: int) -> list[dict[str, Any]]:
    """Every answered turn of the log at ``db``: its answer TTFT and its parts (ms), the
    compose call's tokens and server timings, and what is new in its compose prompt."""
    con = sqlite3.connect(db)
    con.row_factory = sqlite3.Row
    turns = con.execute(
        "SELECT id, conversation_id, turn_index, label, status, answer_ttft_ms, admit_ms "
        "FROM turns ORDER BY id").fetchall()  # fmt: skip
    steps: dict[int, dict[str, sqlite3.Row]] = {}
    for s in con.execute("SELECT turn_id, step, started_offset_ms, duration_ms, status "
                         "FROM steps"):  # fmt: skip
        steps.setdefault(s["turn_id"], {})[s["step"]] = s
    calls: dict[int, sqlite3.Row] = {}
    marks = ",".join("?" * len(WINNERS))
    for c in con.execute(
        "SELECT turn_id, attempt, ttft_ms, started_offset_ms, input_tokens, "
        "cached_input_tokens, server_timings, prompt, output FROM calls WHERE step = ? "
        f"AND coalesce(round, 1) = 1 AND outcome IN ({marks}) ORDER BY turn_id, attempt",
        (ANSWER_STEP, *WINNERS),
    ):
        calls.setdefault(c["turn_id"], c)
    con.close()
    out: list[dict[str, Any]] = []
    previous: dict[str, dict[str, Any]] = {}  # conversation -> its previous turn's row
    for t in turns:
        turn: dict[str, Any] = {
            "run": run, "conversation": t["conversation_id"], "turn_index": t["turn_index"],
            "label": t["label"], "status": t["status"], "answer_ttft": t["answer_ttft_ms"],
            "admit": t["admit_ms"],
        }  # fmt: skip
        by_step = steps.get(t["id"], {})
        compose = by_step.get(ANSWER_STEP)
        call = calls.get(t["id"])
        if compose is not None:
            turn["before_compose"] = compose["started_offset_ms"]
            for name in EARLY_STEPS:
                if name in by_step:
                    turn[name] = by_step[name]["duration_ms"]
        if call is not None:
            timings = json.loads(call["server_timings"]) if call["server_timings"] else None
            turn |= {"call_ttft": call["ttft_ms"], "call_sent_at": call["started_offset_ms"],
                     "input_tokens": call["input_tokens"],
                     "cached_input_tokens": call["cached_input_tokens"]}  # fmt: skip
            if isinstance(timings, dict):
                turn |= {k: timings.get(k) for k in ("cache_n", "prompt_n", "prompt_ms",
                         "prompt_per_token_ms", "predicted_n", "predicted_ms")}  # fmt: skip
        if (turn["answer_ttft"] is not None and turn.get("before_compose") is not None
                and turn.get("call_ttft") is not None):  # fmt: skip
            turn["after_call"] = (turn["answer_ttft"] - turn["before_compose"]
                                  - turn["call_ttft"])  # fmt: skip
        if turn.get("predicted_ms") is not None and turn.get("predicted_n"):
            turn["decode_per_token_ms"] = turn["predicted_ms"] / turn["predicted_n"]
        if turn.get("call_ttft") is not None and turn.get("prompt_ms") is not None:
            turn["call_ttft_minus_prompt"] = turn["call_ttft"] - turn["prompt_ms"]
        # what is new: after the longest common prefix with the previous turn's compose
        # prompt followed by its answer (the tokens a slot holds after that call)
        text = prompt_text(call["prompt"]) if call is not None else ""
        prev = previous.get(str(t["conversation_id"]))
        if call is not None and prev is not None and prev.get("_text") is not None:
            held = prev["_text"] + prev["_output"]
            cut = common_prefix(text, held)
            turn["new_text"] = text[cut:]
            turn["new_parts"] = [[name, part] for name, part in new_parts(text[cut:])]
            turn["new_material"] = any(
                name == "policy_section"
                or (name == "catalogue" and re.search(r"^- \[", part, re.M) is not None)
                for name, part in turn["new_parts"]
            )
            turn["label_changed"] = turn["label"] != prev["label"]
            turn["previous_input_tokens"] = prev.get("input_tokens")
            if prev.get("input_tokens") is not None and turn.get("cache_n") is not None:
                # the previous prompt's tokens this call did not find cached: a few at the
                # boundary (the prompt's end tokenizes differently when text follows it);
                # many: the slot lost the conversation's prefix
                turn["previous_prompt_not_reused"] = prev["input_tokens"] - turn["cache_n"]
        if call is not None:
            turn["_text"], turn["_output"] = text, call["output"] or ""
        previous[str(t["conversation_id"])] = turn
        out.append(turn)
    return out


# ------------------------------------------------------------------ tokens


def tokenizer() -> Any:
    """A function counting a text's tokens on this checkout's running llama-server
    (``POST /tokenize``), or None when none is up."""
    try:
        from chainrun.runtime import local_model

        server = local_model.status()
    except Exception:  # no [local] extra, no server: no token counts
        return None
    if server is None:
        return None
    url = f"http://127.0.0.1:{server.port}/tokenize"

    def count(text: str) -> int | None:
        body = json.dumps({"content": text, "add_special": False}).encode()
        req = urllib.request.Request(url, body, {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return len(json.loads(resp.read())["tokens"])
        except (OSError, ValueError, KeyError):
            return None

    return count


# ------------------------------------------------------------------ summaries


def values(turns: Sequence[dict[str, Any]], key: str) -> list[float]:
    return [float(t[key]) for t in turns if t.get(key) is not None]


def p50_ci(xs: Sequence[float]) -> dict[str, Any]:
    """n, p50 and its distribution-free 95% interval (ms)."""
    ci = quantile_ci(xs, 50) if xs else None
    return {"n": len(xs), "p50": r(percentile(xs, 50)) if xs else None,
            "p50_ci": [r(ci[0]), r(ci[1])] if ci else None}  # fmt: skip


PARTS = ("before_compose", *EARLY_STEPS, "call_ttft", "prompt_ms", "call_ttft_minus_prompt",
         "after_call", "call_sent_at", "admit", "prompt_n", "cache_n",
         "prompt_per_token_ms", "predicted_n", "predicted_ms", "decode_per_token_ms",
         "input_tokens",
         "cached_input_tokens")  # fmt: skip


def group(turns: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One group of turns: answer TTFT n, p50 [95% CI]; the medians of its parts; and
    the floor its medians add up to."""
    out: dict[str, Any] = {"answer_ttft_ms": p50_ci(values(turns, "answer_ttft"))}
    med = {k: median(values(turns, k)) for k in PARTS}
    out["medians"] = {k: r(v, 2) for k, v in med.items()}
    out["range_prompt_n"] = ([min(values(turns, "prompt_n")), max(values(turns, "prompt_n"))]
                             if values(turns, "prompt_n") else None)  # fmt: skip
    out["floor"] = floor(med)
    return out


def floor(med: dict[str, float | None]) -> dict[str, Any] | None:
    """What a turn with these medians must compute before its first text (ms):
    new prompt tokens × ms per prompt token + (call TTFT − prompt ms) + before compose +
    after the call."""
    need = ("prompt_n", "prompt_per_token_ms", "call_ttft_minus_prompt", "before_compose",
            "after_call")  # fmt: skip
    if any(med.get(k) is None for k in need):
        return None
    prompt = float(med["prompt_n"] or 0) * float(med["prompt_per_token_ms"] or 0)
    parts = {"prompt": prompt, "first_token_and_http": med["call_ttft_minus_prompt"],
             "before_compose": med["before_compose"], "after_call": med["after_call"]}
    total = sum(float(v or 0) for v in parts.values())
    return {"total_ms": r(total), **{k: r(v) for k, v in parts.items()}}


def analyse(dbs: Sequence[Path], count: Any = None) -> dict[str, Any]:
    """The document's results from the logs ``dbs`` (one a run)."""
    turns = [t for i, db in enumerate(dbs, 1) for t in read_log(db, i)]
    ok = [t for t in turns if t["status"] == "ok" and t["answer_ttft"] is not None]
    first = [t for t in ok if t["turn_index"] == 1]
    later = [t for t in ok if (t["turn_index"] or 0) >= 2]
    stayed = [t for t in later if t.get("new_material") is False]
    changed = [t for t in later if t.get("new_material") is True]
    # new prompt parts, tokenized alone (the server's tokenizer), per follow-up
    for t in later:
        parts = t.get("new_parts") or []
        tokens: dict[str, int] = {}
        for name, part in parts:
            n = count(part) if count is not None else None
            if n is not None:
                tokens[name] = tokens.get(name, 0) + n
        t["new_part_tokens"] = tokens if count is not None and parts else None
    part_names = ("history", "policy_section", "catalogue", "message", "lead")
    new_by_part: dict[str, Any] = {}
    for name, grp in (("later", later), ("stayed", stayed), ("changed", changed)):
        counted = [t["new_part_tokens"] for t in grp if t.get("new_part_tokens") is not None]
        medians = {p: median([float(c.get(p, 0)) for c in counted]) for p in part_names}
        new_by_part[name] = {"n": len(counted), "median_tokens": medians if counted else None}
    # a floor with only the shopper's message and the lead new (and the same overheads)
    med_later = {k: median(values(later, k)) for k in PARTS}
    msg_lead = [float(c.get("message", 0) + c.get("lead", 0)) for t in later
                if (c := t.get("new_part_tokens")) is not None]  # fmt: skip
    only_message = None
    if msg_lead and med_later["prompt_per_token_ms"] is not None:
        only_message = floor({**med_later, "prompt_n": median(msg_lead)})
        if only_message is not None:
            only_message["new_prompt_tokens"] = median(msg_lead)
    not_reused = values(later, "previous_prompt_not_reused")
    per_turn = [{k: (r(v, 1) if isinstance(v, float) else v) for k, v in t.items()
                 if not k.startswith("_") and k not in ("new_text", "new_parts")}
                for t in ok]  # fmt: skip
    return {
        "turns_logged": len(turns),
        "turns_ok": len(ok),
        "compose_calls_without_server_timings": sum(1 for t in ok if t.get("prompt_ms") is None),
        "turn_1": group(first),
        "turns_2_on": group(later),
        "turns_2_on_stayed": group(stayed),
        "turns_2_on_changed": group(changed),
        "turns_2_on_unsplit": len(later) - len(stayed) - len(changed),
        "new_prompt_tokens_by_part": new_by_part,
        "floor_if_only_message_and_lead_were_new": only_message,
        "previous_prompt_tokens_not_reused": {
            "n": len(not_reused),
            "median": median(not_reused),
            "max": max(not_reused, default=None),
            "over_20": sum(1 for x in not_reused if x > 20),
        },
        "per_turn": per_turn,
    }


def example_prompts(db: Path, conversation: str) -> list[dict[str, Any]]:
    """One conversation's compose prompts in ``db``, turn by turn, with what is new."""
    rows = [t for t in read_log(db, 1) if t["conversation"] == conversation]
    return [{"turn_index": t["turn_index"], "label": t["label"],
             "prompt_n": t.get("prompt_n"), "cache_n": t.get("cache_n"),
             "prompt": t.get("_text"), "new_parts": t.get("new_parts")}
            for t in rows]  # fmt: skip


# ------------------------------------------------------------------ report


def summary(doc: dict[str, Any]) -> str:
    res = doc["results"]
    lines = ["group: answer TTFT n, p50 [95% CI] ms | medians: before compose, call TTFT "
             "(prompt ms for prompt_n new tokens, cache_n reused), call TTFT − prompt, "
             "after call | floor ms"]
    for key in ("turn_1", "turns_2_on", "turns_2_on_stayed", "turns_2_on_changed"):
        g = res[key]
        a, m = g["answer_ttft_ms"], g["medians"]
        fl = g["floor"]["total_ms"] if g["floor"] else None
        lines.append(
            f"{key}: {a['n']}, {a['p50']} {a['p50_ci']} | {m['before_compose']}, "
            f"{m['call_ttft']} ({m['prompt_ms']} for {m['prompt_n']}, {m['cache_n']} reused, "
            f"{m['prompt_per_token_ms']} ms/token), {m['call_ttft_minus_prompt']}, "
            f"{m['after_call']} | {fl}"
        )
    lines.append(f"new prompt tokens by part (medians): {res['new_prompt_tokens_by_part']}")
    lines.append(f"floor if only message and lead were new: "
                 f"{res['floor_if_only_message_and_lead_were_new']}")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2, help="cold replays (default 2)")
    parser.add_argument("--keep-dir", type=Path,
                        help="keep the logs (run-N.db) and runs.json here")
    parser.add_argument("--from-dir", type=Path, action="append",
                        help="read the logs a --keep-dir run kept; run nothing (given "
                        "more than once: their runs pooled)")
    parser.add_argument("--no-tokenize", action="store_true",
                        help="leave out the new parts' token counts (no server asked)")
    parser.add_argument("--example", default="hiking-boots",
                        help="the conversation whose compose prompts the document shows")
    parser.add_argument("--json", action="store_true", help="print the result document")
    parser.add_argument("--out", help="the result document (default "
                        "benchmarks/results/followup_floor.json)")  # fmt: skip
    args = parser.parse_args()
    argv = sys.argv[1:]
    doc = new_document("followup_floor", argv, {
        "replay": REPLAY, "runs": args.runs, "cold": True, "answer_step": ANSWER_STEP,
        "from_dir": [str(d) for d in args.from_dir or []]})  # fmt: skip
    doc["machine"]["uptime_at_start"] = uptime()
    with tempfile.TemporaryDirectory(prefix="followup-floor-") as tmp:
        dbs: list[Path] = []
        runs: list[dict[str, Any]] = []
        if args.from_dir:
            doc["runs_command"] = []
            for where in args.from_dir:
                runs_file = where / "runs.json"
                if not runs_file.is_file():
                    print(f"{runs_file}: no such file (a --keep-dir run writes it)",
                          file=sys.stderr)  # fmt: skip
                    raise SystemExit(2)
                kept = json.loads(runs_file.read_text(encoding="utf-8"))
                doc["runs_command"].append(kept["command"])
                runs += kept["runs"]
                dbs += [where / run["db"] for run in kept["runs"]]
        else:
            where = args.keep_dir or Path(tmp)
            where.mkdir(parents=True, exist_ok=True)
            for i in range(1, args.runs + 1):
                runs.append(run_replay(where / f"run-{i}.db"))
                print(f"run {i}: {runs[-1]['wall_s']} s, load {runs[-1]['load_start']} → "
                      f"{runs[-1]['load_end']}", file=sys.stderr, flush=True)  # fmt: skip
            kept = {"command": doc["command"], "runs": runs}
            (where / "runs.json").write_text(json.dumps(kept, indent=1) + "\n",
                                             encoding="utf-8")  # fmt: skip
            dbs = [where / run["db"] for run in runs]
        count = None if args.no_tokenize else tokenizer()
        doc["runs"] = runs
        doc["results"] = analyse(dbs, count)
        doc["results"]["tokenized_by_server"] = count is not None
        doc["results"]["example_conversation"] = {
            "conversation": args.example, "run": 1,
            "turns": example_prompts(dbs[0], args.example) if dbs else []}  # fmt: skip
    doc["machine"]["load_avg_1m_at_end"] = load1()
    doc["machine"]["uptime_at_end"] = uptime()
    finish(doc, as_json=args.json, summary=summary, out=args.out)


if __name__ == "__main__":
    main()

"""The run log's schema history: numbered, append-only migrations, listed explicitly.

Each migration runs once per database, forward only, inside a transaction, and is
recorded in ``_migrations`` (the pattern of simonw/llm's migrations). Never edit a
migration that has shipped: add the next number. The row models in
:mod:`chainrun.log.rows` must match the tables after the last migration
(``tests/test_store.py`` pins that).

One list serves SQLite and PostgreSQL: a migration gets a
:class:`~chainrun.log.backend.LogDb` and writes the schema as sqlite-utils does
(``db.table(T).create/add_column/create_index``, which the PostgreSQL side maps to its
types) or as SQL both run. What must differ branches on ``db.dialect``: the product
catalogue (FTS5 and sqlite-vec exist only in SQLite; a PostgreSQL log keeps its
catalogue in a SQLite file, see :mod:`chainrun.log.store`) and a column type.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime

import sqlite_utils

from chainrun.log.backend import LogDb, PgLogDb, SqliteLogDb

#: the catalogue's columns searched by full-text search (FTS5, bm25)
FTS_COLUMNS = ("title", "description", "category", "colours", "tags")


_second: tuple[int, str] = (-1, "")


def utc_now() -> str:
    """Current wall-clock time as ISO-8601 UTC with ms (the format of every *_at column),
    e.g. ``2026-11-30T15:22:51.123+00:00``, as ``datetime.isoformat(timespec=
    "milliseconds")`` gives it (ms truncated, not rounded).

    The date and time to the second are formatted once per second (every turn takes
    one timestamp: the whole ``datetime`` path was ~2 us of each turn's loop time).
    """
    global _second
    sec, ns = divmod(time.time_ns(), 1_000_000_000)
    cached, prefix = _second
    if sec != cached:
        prefix = datetime.fromtimestamp(sec, UTC).strftime("%Y-%m-%dT%H:%M:%S")
        _second = (sec, prefix)
    return f"{prefix}.{ns // 1_000_000:03d}+00:00"


def _m001_initial(db: LogDb) -> None:
    db.table("runs").create(
        {
            "id": int,
            "kind": str,  # replay | live | eval
            "label": str,
            "config": str,  # JSON snapshot of the ChainConfig
            "source": str,  # replay / eval file, if any
            "started_at": str,
            "ended_at": str,
            "status": str,  # running | complete | failed | interrupted
            "n_turns": int,
            "meta": str,  # JSON
        },
        pk="id",
    )
    db.table("turns").create(
        {
            "id": int,
            "run_id": int,
            "request_id": str,
            "conversation_id": str,  # gen_ai.conversation.id
            "input": str,
            "output": str,
            "label": str,
            "status": str,  # ok | refused | replaced | error | cancelled
            "verdicts": str,  # JSON
            "started_at": str,
            "duration_ms": float,
            "original_ms": float,
            "error_type": str,
        },
        pk="id",
        foreign_keys=[("run_id", "runs", "id")],
    )
    db.table("steps").create(
        {
            "id": int,
            "run_id": int,
            "turn_id": int,
            "step": str,
            "kind": str,
            "status": str,
            "started_offset_ms": float,
            "duration_ms": float,
            "output": str,
            "error_type": str,
            "n_attempts": int,
            "hedge_delay_ms": float,
            "hedge_fired": int,
            "hedge_won": int,
            "time_saved_ms": float,
            "detail": str,  # JSON
        },
        pk="id",
        foreign_keys=[("run_id", "runs", "id"), ("turn_id", "turns", "id")],
    )
    db.table("calls").create(
        {
            "id": int,
            "run_id": int,
            "turn_id": int,
            "step": str,
            "attempt": int,
            "target": str,
            "provider": str,  # gen_ai.provider.name
            "server_address": str,  # server.address:server.port
            "model": str,  # gen_ai.request.model
            "response_model": str,  # gen_ai.response.model
            "response_id": str,  # gen_ai.response.id
            "reasoning_effort": str,  # chainrun.request.reasoning_effort
            "stream": int,  # gen_ai.request.stream
            "temperature": float,  # gen_ai.request.temperature
            "max_tokens": int,  # gen_ai.request.max_tokens
            "prompt": str,  # messages sent, JSON
            "output": str,
            "reasoning": str,
            "started_at": str,
            "started_offset_ms": float,
            "ttft_ms": float,  # gen_ai.client.operation.time_to_first_chunk, in ms
            "duration_ms": float,  # gen_ai.client.operation.duration, in ms
            "chunk_gaps_ms": str,  # JSON list of ms between consecutive chunks
            "n_chunks": int,
            "bytes_received": int,
            "input_tokens": int,  # gen_ai.usage.input_tokens (NULL = unknown)
            "output_tokens": int,  # gen_ai.usage.output_tokens (includes reasoning)
            "reasoning_tokens": int,  # gen_ai.usage.reasoning.output_tokens
            "cached_input_tokens": int,  # gen_ai.usage.cache_read.input_tokens
            "finish_reason": str,  # gen_ai.response.finish_reasons
            "truncated": int,
            "error_type": str,  # error.type
            "error_message": str,
            "outcome": str,  # hedging outcome of this attempt
            "loop_lag_ms": float,
            "server_timings": str,  # JSON: llama.cpp `timings`
        },
        pk="id",
        foreign_keys=[("run_id", "runs", "id"), ("turn_id", "turns", "id")],
    )
    db.table("turns").create_index(["run_id"])
    db.table("steps").create_index(["run_id", "step"])
    db.table("calls").create_index(["run_id", "step"])
    db.table("calls").create_index(["turn_id"])


def _m002_fired_late(db: LogDb) -> None:
    # a copy fired while the client's own event loop was late (chainrun.hedging.looplag)
    db.table("calls").add_column("fired_late", int)


def _m003_answer_timings(db: LogDb) -> None:
    # the shopper's wait: first answer token and answer complete, per turn;
    # NULL for turns logged before this migration (unknown, never 0)
    db.table("turns").add_column("answer_ttft_ms", float)
    db.table("turns").add_column("answer_done_ms", float)
    # steps that only read the answer (validate, critique): not part of the wait
    db.table("steps").add_column("post_answer", int)
    # the stop sequences actually sent, JSON list
    db.table("calls").add_column("stop", str)


def _m004_steps_turn_index(db: LogDb) -> None:
    # a turn's steps read back by turn id (Store.turn: chainrun serve, telemetry) without
    # scanning every step of a long-running live run
    db.table("steps").create_index(["turn_id"], if_not_exists=True)


def _m010_catalog(db: LogDb) -> None:
    if db.dialect != "sqlite":
        return  # FTS5 and sqlite-vec: the catalogue of a PostgreSQL log lives in SQLite
    db.table("products").create(
        {
            "id": str,
            "title": str,
            "description": str,
            "category": str,
            "colours": str,  # JSON list
            "sizes": str,  # JSON {size: units in stock}
            "price": float,  # EUR
            "stock": int,
            "tags": str,  # JSON list
        },
        pk="id",
        not_null={"title", "category", "price", "stock"},
    )
    db.table("products").create_index(["category"])
    db.table("products").create_index(["price"])
    db.table("product_sizes").create(
        {"product_id": str, "size": str, "stock": int},
        pk=("product_id", "size"),
        foreign_keys=[("product_id", "products", "id")],
    )
    db.table("product_sizes").create_index(["size"])
    db.table("product_embeddings").create(
        {
            "product_id": str,
            "model": str,  # the embedder's model id
            "text_hash": str,  # hash of the text embedded: a changed product is re-embedded
            "dims": int,
            "embedding": bytes,  # float32 little-endian, L2-normalised
        },
        pk=("product_id", "model"),
    )
    db.table("catalog_loads").create(
        {"id": int, "source": str, "n_products": int, "loaded_at": str}, pk="id"
    )
    # porter: "jackets" finds "jacket"; triggers keep the index in step with the table.
    # The statements sqlite-utils' enable_fts(FTS_COLUMNS, fts_version="FTS5",
    # tokenize="porter unicode61", create_triggers=True) runs, one by one: enable_fts uses
    # executescript, which commits the migration's open transaction first
    for sql in fts_statements("products", FTS_COLUMNS, tokenize="porter unicode61"):
        db.execute(sql)


def fts_statements(table: str, columns: Sequence[str], *, tokenize: str) -> list[str]:
    """The SQL of an external-content FTS5 index on ``table`` kept in step by triggers.

    The same virtual table ``{table}_fts`` and triggers ``{table}_ai/_ad/_au`` as
    sqlite-utils' ``Table.enable_fts(columns, fts_version="FTS5", create_triggers=True)``
    (sqlite-utils 3.x), as single statements that run inside an open transaction.
    """
    fts = f"{table}_fts"
    cols = ", ".join(f'"{c}"' for c in columns)
    new = ", ".join(f'new."{c}"' for c in columns)
    old = ", ".join(f'old."{c}"' for c in columns)
    delete = f'INSERT INTO "{fts}" ("{fts}", rowid, {cols}) VALUES(\'delete\', old.rowid, {old});'
    insert = f'INSERT INTO "{fts}" (rowid, {cols}) VALUES (new.rowid, {new});'
    return [
        f'CREATE VIRTUAL TABLE "{fts}" USING FTS5 ({cols}, tokenize=\'{tokenize}\', '
        f'content="{table}")',
        f'INSERT INTO "{fts}" (rowid, {cols}) SELECT rowid, {cols} FROM "{table}"',
        f'CREATE TRIGGER "{table}_ai" AFTER INSERT ON "{table}" BEGIN {insert} END',
        f'CREATE TRIGGER "{table}_ad" AFTER DELETE ON "{table}" BEGIN {delete} END',
        f'CREATE TRIGGER "{table}_au" AFTER UPDATE ON "{table}" BEGIN {delete} {insert} END',
    ]


def _m020_eval_results(db: LogDb) -> None:
    db.table("eval_results").create(
        {
            "id": int,
            "run_id": int,
            "turn_id": int,
            "case_id": str,
            "repeat": int,
            "type": str,  # assertion type (equals, regex, llm-rubric...)
            "step": str,  # NULL = the final answer / the whole turn
            "passed": int,  # NULL = skipped (no verdict; detail says why)
            "detail": str,
            "grader": str,  # JSON GraderConfig for llm-rubric, else NULL
            "scored_at": str,
        },
        pk="id",
        foreign_keys=[("run_id", "runs", "id"), ("turn_id", "turns", "id")],
    )
    db.table("eval_results").create_index(["run_id", "case_id"])


def _m030_turn_ids(db: LogDb) -> None:
    # the next turn id no process has reserved (chainrun.log.turn_ids): a turn's id is known
    # before its row is committed, so a turn can return before its write
    next_id = "integer" if db.dialect == "sqlite" else "bigint"
    db.execute(
        "create table _turn_ids (id integer primary key check (id = 1), "
        f"next_id {next_id} not null)"
    )


def _m050_tool_calls(db: LogDb) -> None:
    # one row per tool call a model asked for (chainrun.tools): what ran, once, and why not
    db.table("tool_calls").create(
        {
            "id": int,
            "run_id": int,
            "turn_id": int,
            "step": str,
            "attempt": int,  # the model call attempt that asked (its race's winner)
            "round": int,  # the step's tool round (1: the answer to the message)
            "call_id": str,  # gen_ai.tool.call.id
            "tool": str,  # gen_ai.tool.name
            "arguments": str,  # JSON text as the model sent it ([log] redact applied)
            "idempotency_key": str,  # "{turn id}:{call id}", handed to the tool
            "side_effects": int,
            "status": str,  # ok | error | timeout | invalid_arguments | unknown_tool | not_started
            "started_offset_ms": float,  # from the step's start; NULL: never started
            "duration_ms": float,  # NULL: never started
            "result": str,  # what the model was told (JSON text)
            "error_type": str,
            "error_message": str,
            "turn_cancelled": int,  # the turn was cancelled while the tool ran (awaited)
        },
        pk="id",
        foreign_keys=[("run_id", "runs", "id"), ("turn_id", "turns", "id")],
    )
    db.table("tool_calls").create_index(["turn_id"])
    db.table("tool_calls").create_index(["run_id", "step"])


def _m060_truncated_answers(db: LogDb) -> None:
    # an answer cut at the token cap (finish reason length) is said in the step and turn
    # rows, not only in a call's finish_reason
    db.table("steps").add_column("truncated", int)
    db.table("turns").add_column("truncated", int)


def _m070_conversations(db: LogDb) -> None:
    # a turn's 1-based position in its conversation (NULL for turns logged before this
    # migration: unknown); a conversation's turns read back by id, in order, for history
    db.table("turns").add_column("turn_index", int)
    db.table("turns").create_index(["conversation_id", "turn_index"], if_not_exists=True)


def _m080_turns_started_index(db: LogDb) -> None:
    # the newest turns across every run and process (hedge windows seeded from the log,
    # Store.recent_latencies; a window of live traffic) without scanning every turn
    db.table("turns").create_index(["started_at"], if_not_exists=True)


def _m090_step_updates(db: LogDb) -> None:
    # the turn-state fields each step handed on, as JSON (StepRow.updates): what a turn
    # was shown (its products) is read from the log as data, whichever step wrote it
    db.table("steps").add_column("updates", str)


def _m100_tool_call_notes(db: LogDb) -> None:
    # how chainrun read a tool call a server sent out of the API's shape (index inferred,
    # name fragments joined, arguments object serialised, id reused...): nothing silent
    db.table("tool_calls").add_column("wire_notes", str)


def _m110_time_between_tokens(db: LogDb) -> None:
    # the mean gap between the chunks that carried text (CallRow.time_between_tokens_ms):
    # chunk_gaps_ms holds every chunk's gap, usage and finish chunks too, so the time
    # between tokens cannot be computed from it afterwards; rows logged before stay NULL
    db.table("calls").add_column("time_between_tokens_ms", float)


def _m120_review_judgements(db: LogDb) -> None:
    # a person's side-by-side judgements of two runs' answers (chainrun review)
    db.table("review_judgements").create(
        {
            "id": int,
            "run_a": int,
            "run_b": int,
            "request_id": str,
            "reviewer": str,
            "judged_at": str,
            "left_run": int,  # the run shown on the left: the order the reviewer saw
            "choice": str,  # left | same | right
            "preferred_run": int,  # NULL: the same
            "tags": str,  # JSON: {"a": [...], "b": [...]}
            "note": str,
        },
        pk="id",
    )
    db.table("review_judgements").create_index(["run_a", "run_b", "reviewer"])


def _m130_call_rounds(db: LogDb) -> None:
    # a call with tools runs rounds: each call row says its round (attempts are numbered
    # within it, so copies are counted per round) and, for a round that asked for tools,
    # when the first piece of a tool call came (its first event, there being no TTFT)
    db.table("calls").add_column("round", int)
    db.table("calls").add_column("first_tool_call_ms", float)


def _m140_conversation_index(db: LogDb) -> None:
    # each live conversation's last turn index handed out, one row per conversation: the
    # atomic counter that keeps the turn indexes of a conversation served by several
    # processes unique (chainrun.log.store.Store.claim_turn_index)
    db.table("conversation_index").create(
        {"conversation_id": str, "last_index": int}, pk="conversation_id"
    )


def _m150_pending_actions(db: LogDb) -> None:
    # a confirm tool's call waits for the shopper's yes (chainrun.tools.confirm): its row
    # holds the question and expiry, then who decided and when; a confirmed action's run
    # (in the deciding turn) names the action it carried out
    for name, kind in (("question", str), ("expires_at", str), ("expires_after_turn", int),
                       ("decided_by", str), ("decided_at", str), ("decided_turn_id", int),
                       ("action_id", str)):  # fmt: skip
        db.table("tool_calls").add_column(name, kind)
    db.table("tool_calls").create_index(["status"], if_not_exists=True)


def _m151_turn_identity(db: LogDb) -> None:
    # the shopper a turn was for, and the client's Idempotency-Key it was started with
    db.table("turns").add_column("user_id", str)
    db.table("turns").add_column("idempotency_key", str)
    # each conversation's owner: the identity that started it (one row, taken atomically)
    db.table("conversation_owners").create(
        {"conversation_id": str, "user_id": str, "bound_at": str}, pk="conversation_id"
    )


def _m152_request_keys(db: LogDb) -> None:
    # a client's Idempotency-Key, per conversation ("" without one): the first request's
    # turn, found again by a retry in any process sharing the log
    db.table("request_keys").create(
        {"scope": str, "key": str, "body_sha256": str, "request_id": str,
         "turn_id": int, "created_at": str},
        pk=("scope", "key"),
    )  # fmt: skip
    # a retry finds the first request's turn by its request id, in any run
    db.table("turns").create_index(["request_id"], if_not_exists=True)


def _m170_claimed_turns(db: LogDb) -> None:
    # who claimed a conversation's last turn index, with what message and when: a turn
    # whose process dies before its rows are written is logged ``lost`` from these when
    # its run is marked interrupted (chainrun.log.lifecycle.mark_interrupted_runs)
    for name, kind in (("claimed_run_id", int), ("claimed_input", str), ("claimed_at", str)):
        db.table("conversation_index").add_column(name, kind)


def _m171_rate_limit_wait(db: LogDb) -> None:
    # how long a call's first attempt waited for its provider's rate limit (ms)
    db.table("calls").add_column("rate_limit_wait_ms", float)


def _m240_catalog_money(db: LogDb) -> None:
    if db.dialect != "sqlite":
        return  # the catalogue of a PostgreSQL log lives in SQLite (see _m010_catalog)
    # a product's currency (ISO 4217) and the locale its catalogue writes amounts in
    # (CLDR, e.g. de_CH; NULL: the default), so prices are shown as the shop writes them
    db.table("products").add_column("currency", str, not_null_default="EUR")
    db.table("products").add_column("locale", str)
    db.table("catalog_loads").add_column("currency", str, not_null_default="EUR")
    db.table("catalog_loads").add_column("locale", str)


def _m200_claim_token(db: LogDb) -> None:
    # the token of the claim that took a conversation's last turn index: a claim tried
    # again after its answer was lost finds itself in place (Store.claim_turn_index)
    db.table("conversation_index").add_column("claim_token", str)


def _m230_claimed_request_id(db: LogDb) -> None:
    # the request id of the claim's turn: a turn logged lost keeps it, so a client's retry
    # with the same Idempotency-Key finds that turn (chainrun.log.lifecycle.log_lost_turns)
    db.table("conversation_index").add_column("claimed_request_id", str)


def _m245_request_key_claims(db: LogDb) -> None:
    # who claimed a request key, in which run, for which conversation and message: a keyed
    # turn whose process dies before its rows are written is logged ``lost`` from these
    # on SQLite too (chainrun.log.lifecycle.log_lost_turns), and its retry gets that turn
    for name, kind in (("run_id", int), ("conversation_id", str), ("input", str)):
        db.table("request_keys").add_column(name, kind)
    # the log's own random id, made once: tools' idempotency keys made from turn ids
    # (which start at 1 in every log) carry it, so they do not repeat across logs
    db.table("log_meta").create({"key": str, "value": str}, pk="key")
    db.execute("insert into log_meta (key, value) values ('nonce', ?)", [uuid.uuid4().hex])


def _m250_admit_ms(db: LogDb) -> None:
    # the time a turn spent at the front desk before its first step (ms): its clock
    # starts at the request, so a wait on the log there is part of the turn
    db.table("turns").add_column("admit_ms", float)


def _m260_actions(db: LogDb) -> None:
    # a pending action on its own, written when it is asked (before its question reaches
    # the shopper, so a yes sent at once finds it), decided in one conditional update,
    # claimed by its deciding turn, started and finished there (chainrun.log.actions)
    db.table("actions").create(
        {
            "id": str,  # the asking call's idempotency key (the key the tool gets)
            "run_id": int,
            "turn_id": int,  # the asking turn (its row is written when the turn ends)
            "conversation_id": str,
            "turn_index": int,
            "step": str,
            "tool": str,
            "arguments": str,  # JSON text: exactly what a yes runs
            "question": str,
            "config_sha256": str,  # the tool's config when asked (a change asks again)
            "asked_at": str,
            "expires_at": str,
            "expires_after_turn": int,
            "status": str,  # awaiting_confirmation | confirmed | denied | expired
            "decided_by": str,
            "decided_at": str,
            "decided_turn_id": int,
            "started_at": str,  # the confirmed run started (NULL: not yet, or never)
            "outcome": str,  # the run's tool status (ok, error, timeout, ...); NULL: none
            "finished_at": str,
        },
        pk="id",
    )
    db.table("actions").create_index(["conversation_id", "status"])
    # a decision is also said in the asking call's tool_calls row, found by its key
    db.table("tool_calls").create_index(["idempotency_key"], if_not_exists=True)
    # the actions still waiting when the log is upgraded wait on here (their tool's
    # config when asked is unknown: a yes runs them as asked, not asked again)
    db.execute(
        "insert into actions (id, run_id, turn_id, conversation_id, turn_index, step, tool, "
        "arguments, question, config_sha256, asked_at, expires_at, expires_after_turn, status) "
        "select c.idempotency_key, c.run_id, c.turn_id, t.conversation_id, t.turn_index, "
        "c.step, c.tool, c.arguments, c.question, '', t.started_at, c.expires_at, "
        "c.expires_after_turn, c.status from tool_calls c join turns t on t.id = c.turn_id "
        "where c.status = 'awaiting_confirmation' and c.question is not null "
        "and c.idempotency_key is not null and t.conversation_id is not null"
    )


#: Every migration in order. Append only.
MIGRATIONS: tuple[tuple[str, Callable[[LogDb], None]], ...] = (
    ("001_initial", _m001_initial),
    ("002_fired_late", _m002_fired_late),
    ("003_answer_timings", _m003_answer_timings),
    ("004_steps_turn_index", _m004_steps_turn_index),
    ("010_catalog", _m010_catalog),
    ("020_eval_results", _m020_eval_results),
    ("030_turn_ids", _m030_turn_ids),
    ("050_tool_calls", _m050_tool_calls),
    ("060_truncated_answers", _m060_truncated_answers),
    ("070_conversations", _m070_conversations),
    ("080_turns_started_index", _m080_turns_started_index),
    ("090_step_updates", _m090_step_updates),
    ("100_tool_call_notes", _m100_tool_call_notes),
    ("110_time_between_tokens", _m110_time_between_tokens),
    ("120_review_judgements", _m120_review_judgements),
    ("130_call_rounds", _m130_call_rounds),
    ("140_conversation_index", _m140_conversation_index),
    ("150_pending_actions", _m150_pending_actions),
    ("151_turn_identity", _m151_turn_identity),
    ("152_request_keys", _m152_request_keys),
    ("170_claimed_turns", _m170_claimed_turns),
    ("171_rate_limit_wait", _m171_rate_limit_wait),
    ("200_claim_token", _m200_claim_token),
    ("230_claimed_request_id", _m230_claimed_request_id),
    ("240_catalog_money", _m240_catalog_money),
    ("245_request_key_claims", _m245_request_key_claims),
    ("250_admit_ms", _m250_admit_ms),
    ("260_actions", _m260_actions),
)


#: the advisory lock key of migrations (with the schema's hash as the second key)
MIGRATION_LOCK_KEY = 7262


def _lock_migrations(log: LogDb) -> None:
    """Inside a transaction: on PostgreSQL, wait for the migration lock, a
    transaction-level advisory lock keyed by the schema (released at commit or rollback,
    so it cannot outlive its transaction on a server connection that a transaction
    pooler such as PgBouncer hands to another client; a session lock can: PostgreSQL
    docs, "Advisory Locks"). Two processes racing to ``create table if not exists``
    could otherwise both fail on the catalogue's unique index. SQLite's write lock
    (``BEGIN IMMEDIATE``) does the same there."""
    if isinstance(log, PgLogDb):
        log.execute("select pg_advisory_xact_lock(?, hashtext(current_schema()))",
                    [MIGRATION_LOCK_KEY])  # fmt: skip


def _applied(log: LogDb) -> set[str] | None:
    """The migrations recorded in ``_migrations`` (None: no such table yet)."""
    if isinstance(log, PgLogDb):
        exists = log.execute("select to_regclass('_migrations') is not null").fetchone()
        if not exists or not exists[0]:
            return None
    elif "_migrations" not in log.table_names():
        return None
    return {r[0] for r in log.execute("select name from _migrations").fetchall()}


def migrate(db: LogDb | sqlite_utils.Database) -> list[str]:
    """Apply every migration not yet recorded in ``_migrations``; return the names applied.

    Each migration is one write transaction (on SQLite ``BEGIN IMMEDIATE``,
    :mod:`chainrun.log.transactions`) with its ``_migrations`` row: a process killed
    mid-migration leaves none of it, and of two processes opening a new log at once,
    the second waits for the write lock (on PostgreSQL a transaction-level advisory
    lock, taken only when a migration is pending), then finds the migration recorded and
    skips it. Idempotent: a second call applies nothing. A
    migration must not use ``executescript`` (it commits first).
    """
    log = db if isinstance(db, LogDb) else SqliteLogDb(db)
    done = _applied(log)
    if done is not None and all(name in done for name, _ in MIGRATIONS):
        return []  # nothing pending: no lock taken (the common open)
    applied = []
    with log.transaction():
        _lock_migrations(log)
        log.execute('CREATE TABLE IF NOT EXISTS "_migrations" ("name" TEXT PRIMARY KEY, '
                    '"applied_at" TEXT)')  # fmt: skip
    for name, fn in MIGRATIONS:
        if done is not None and name in done:
            continue
        with log.transaction():
            _lock_migrations(log)
            # re-read under the lock: another process may have applied it meanwhile
            if log.execute("SELECT 1 FROM _migrations WHERE name = ?", [name]).fetchone():
                continue
            fn(log)
            log.execute(
                "INSERT INTO _migrations (name, applied_at) VALUES (?, ?)", [name, utc_now()]
            )
        applied.append(name)
    return applied

"""Secrets and untrusted text: a sentinel API key appears in no file chainrun wrote;
``[log] redact`` masks personal data in the stored record; model and user text prints
literally (rich markup escaped); compare's table stays one line per step."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import reply_by_step
from typer.testing import CliRunner

from chainrun.chain import Chain
from chainrun.cli import app
from chainrun.config import config_from_dict
from chainrun.events import TokenDelta
from chainrun.lab import LabServer
from chainrun.log.redaction import Redactor
from chainrun.log.rows import CallRow, StepRow, TurnLog, TurnRow
from chainrun.log.store import Store
from chainrun.providers.fake import FakeProvider, FakeReply

REPO = Path(__file__).resolve().parents[1]
SENTINEL = "sk-chainrun-sentinel-7f3a9c1e5b"


def test_sentinel_key_is_in_no_file_chainrun_wrote(tmp_path: Path) -> None:
    with LabServer("fast", n_tokens=4) as lab:
        cfg = tmp_path / "chainrun.toml"
        cfg.write_text(
            'order = ["answer"]\nanswer_step = "answer"\n'
            f'[providers.lab]\nbase_url = "{lab.base_url}"\napi_key_env = "SENTINEL_KEY"\n'
            '[steps.answer]\nprovider = "lab"\nprompt = "{message}"\nstream = true\n',
            encoding="utf-8",
        )
        replay = tmp_path / "r.jsonl"
        replay.write_text("".join(json.dumps({"id": f"r{i}", "message": f"hello {i}"}) + "\n"
                                  for i in range(5)), encoding="utf-8")  # fmt: skip
        db = tmp_path / "log.db"
        env = {**os.environ, "SENTINEL_KEY": SENTINEL,
               "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH"))
                                             if p)}  # fmt: skip
        outputs = []
        for args in (["replay", str(replay), "--config", str(cfg), "--db", str(db)],
                     ["show", "1", "--db", str(db), "--json"],
                     ["runs", "--db", str(db), "--json"],
                     ["hedge-stats", "1", "--db", str(db), "--json"]):  # fmt: skip
            proc = subprocess.run([sys.executable, "-m", "chainrun", *args], cwd=tmp_path,
                                  capture_output=True, text=True, timeout=120, env=env)
            assert proc.returncode == 0, proc.stderr
            outputs += [proc.stdout, proc.stderr]
        assert len(lab.requests()) == 5
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(p.name == "log.db" for p in written)
    for p in written:
        assert SENTINEL.encode() not in p.read_bytes(), p
    for text in outputs:
        assert SENTINEL not in text
    with Store.open(db) as store:
        snapshot = store.get_run(1).config or ""
    assert "SENTINEL_KEY" in snapshot and SENTINEL not in snapshot  # the name, never the key


# -- redaction ---------------------------------------------------------------------------


def test_redactor_kinds() -> None:
    r = Redactor(["email", "phone", "card"])
    assert r.text("mail ann.lee+shop@example.co.uk now") == "mail [email] now"
    assert r.text("call +44 20 7946 0958 or (030) 1234-5678") == "call [phone] or [phone]"
    assert r.text("card 4111 1111 1111 1111 ok") == "card [card] ok"
    assert r.text("card 4111-1111-1111-1111") == "card [card]"
    assert r.text("card 4111 1111 1111 1112") == "card 4111 1111 1111 1112"  # fails Luhn
    plain = "order FS-10293 costs 89.50 in size 38"
    assert r.text(plain) == plain
    assert Redactor(["email"]).text("4111 1111 1111 1111 a@b.io") == "4111 1111 1111 1111 [email]"
    with pytest.raises(ValueError, match="unknown redaction kind"):
        Redactor(["ssn"])
    assert r.json_text('[{"content": "a@b.io"}]') == '[{"content": "[email]"}]'


async def test_log_redact_masks_stored_prompts_and_outputs(store: Store) -> None:
    cfg = config_from_dict({"log": {"redact": ["email", "phone", "card"]}})
    answer = "We will write to ann@example.com, card 4111 1111 1111 1111 noted."
    fake = FakeProvider(name="local", script=reply_by_step({
        "compose": FakeReply(answer, ttft_s=0.001),
    }))  # fmt: skip
    message = "I am ann@example.com, call +44 20 7946 0958: where is my order?"
    streamed = []
    async with Chain(cfg, store=store, providers={"local": fake}) as chain:
        async with contextlib.aclosing(chain.stream_turn(message)) as events:
            async for ev in events:
                if isinstance(ev, TokenDelta):
                    streamed.append(ev.text)
        run_id = chain.run_id
    assert "".join(streamed) == answer  # the caller sees the real answer
    dump = json.dumps([list(store.db[t].rows) for t in ("runs", "turns", "steps", "calls")])
    for secret in ("ann@example.com", "4111 1111 1111 1111", "7946 0958"):
        assert secret not in dump
    turn = store.turns(run_id)[0]
    assert turn.input == "I am [email], call [phone]: where is my order?"
    assert turn.output == "We will write to [email], card [card] noted."
    assert any("[email]" in (c.prompt or "") for c in store.calls(run_id))


def test_redact_is_validated_in_config() -> None:
    from chainrun.errors import ConfigError

    with pytest.raises(ConfigError, match=r"log\.redact"):
        config_from_dict({"log": {"redact": ["ssn"]}})


# -- rich markup -------------------------------------------------------------------------

runner = CliRunner()


def test_model_and_user_text_prints_literally(tmp_path: Path) -> None:
    db = tmp_path / "log.db"
    with Store.open(db) as store:
        run_id = store.create_run("replay", "{}")
        store.log_turn(run_id, TurnLog(
            TurnRow(input="[link=https://evil.example]click[/link]", request_id="[bold]id[/bold]",
                    output="[bold red]SALE[/bold red] now", status="ok", label="[i]x[/i]"),
            [StepRow(step="compose", output="[blink]x")],
            [CallRow(step="[b]s[/b]", target="[u]t[/u]", output="[b]")],
        ))  # fmt: skip
        store.finish_run(run_id, "complete")
    result = runner.invoke(app, ["show", str(run_id), "--db", str(db)])
    assert result.exit_code == 0, result.output
    for literal in ("[bold red]SALE[/bold red] now", "[link=https://evil.example]click[/link]",
                    "[bold]id[/bold]", "[i]x[/i]", "[b]s[/b]", "[u]t[/u]"):  # fmt: skip
        assert literal in result.output, literal


# -- compare: not enough data ----------------------------------------------------------


def test_compare_shows_a_dash_and_one_footnote(tmp_path: Path) -> None:
    db = tmp_path / "log.db"
    with Store.open(db) as store:
        for _ in range(2):
            run_id = store.create_run("replay", "{}")
            for i in range(5):
                store.log_turn(run_id, TurnLog(
                    TurnRow(input=f"m{i}", status="ok", duration_ms=100.0 + i),
                    [StepRow(step="compose", duration_ms=90.0 + i)],
                ))  # fmt: skip
            store.finish_run(run_id, "complete")
    env = {"COLUMNS": "120"}
    result = runner.invoke(app, ["compare", "1", "2", "--db", str(db)], env=env)
    assert result.exit_code == 0, result.output
    assert result.output.count("not enough data") == 1  # the footnote, in no cell
    assert result.output.count("* not enough data for a 95% interval at this n") == 1
    rows = [ln for ln in result.output.splitlines()
            if ln.lstrip("│ ").startswith(("turn", "compose"))]  # fmt: skip
    assert len(rows) == 2 and all("-*" in r for r in rows)  # one line per step


@pytest.mark.parametrize("redact", [[], ["email"]])
async def test_the_prompt_has_one_encoding_whatever_redact_says(
    store: Store, redact: list[str]
) -> None:
    """The step hands its messages as data; they are masked (when asked) before their one
    JSON encoding, so a non-ASCII prompt is stored the same way with ``[log] redact`` on
    and off: UTF-8 text, never ``\\u`` escapes."""
    cfg = config_from_dict({"log": {"redact": redact}})
    fake = FakeProvider(name="local", script=reply_by_step({
        "compose": FakeReply("Ja, in Größe 38.", ttft_s=0.001),
    }))  # fmt: skip
    message = "Gibt es die Jacke in Größe 38 für 89,50 €? (ann@example.com)"
    async with Chain(cfg, store=store, providers={"local": fake}) as chain:
        await chain.run_turn(message)
        run_id = chain.run_id
    (compose,) = [c for c in store.calls(run_id or 0) if c.step == "compose"]
    raw = store.log.scalar("select prompt from calls where id = ?", [compose.id])
    assert isinstance(raw, str) and raw == compose.prompt
    assert "Größe 38 für 89,50 €" in raw and "\\u00" not in raw
    messages = json.loads(raw)
    assert isinstance(messages, list) and messages[-1]["role"] == "user"
    shown = "[email]" if redact else "ann@example.com"
    assert shown in messages[-1]["content"]
    assert ("ann@example.com" in raw) is not bool(redact)

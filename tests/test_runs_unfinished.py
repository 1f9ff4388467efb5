"""``chainrun runs`` says how to go on with a replay that did not finish (a replay killed
with ``kill -9`` prints nothing, and its run was found ``interrupted`` later)."""

from __future__ import annotations

import shlex
from pathlib import Path

from cli_runner import chainrun

from chainrun.log.store import Store


def test_runs_names_the_resume_command_of_an_unfinished_replay(tmp_path: Path) -> None:
    db = tmp_path / "shop log.db"  # a space: the command must be quoted to be run as is
    source = tmp_path / "replay.jsonl"
    with Store.open(db) as store:
        done = store.create_run("replay", "{}", source=str(source))
        store.finish_run(done, "complete")
        killed = store.create_run("replay", "{}", source=str(source))
        store.finish_run(killed, "interrupted")
        live = store.create_run("live", "{}")
        store.finish_run(live, "interrupted")  # a serve run: nothing to resume
    out = chainrun("runs", "--db", str(db))
    assert out.returncode == 0, out.stderr
    again = shlex.join(["chainrun", "replay", str(source), "--db", str(db),
                        "--resume", str(killed)])  # fmt: skip
    hints = [line for line in out.stdout.splitlines() if "runs the rest" in line]
    expected = f"run {killed} is interrupted after 0 turns: {again} runs the rest"
    assert hints == [expected], out.stdout


def test_every_resume_hint_is_one_command_that_keeps_the_log_and_its_quoting() -> None:
    """One function builds the command every unfinished replay's message names (Ctrl-C,
    a provider gone, the log unreachable, lost turns, ``chainrun runs``): ``--db`` always
    (the log may not be the default one), each word quoted for a POSIX shell."""
    from chainrun.replay.hints import resume_command

    line = resume_command("my replays/set 1.jsonl", Path("logs/shop log.db"), 7)
    assert line == "chainrun replay 'my replays/set 1.jsonl' --db 'logs/shop log.db' --resume 7"
    assert shlex.split(line) == ["chainrun", "replay", "my replays/set 1.jsonl", "--db",
                                 "logs/shop log.db", "--resume", "7"]  # fmt: skip
    core = (Path(__file__).parents[1] / "chainrun" / "cli" / "commands_core.py").read_text()
    assert '"--resume"' not in core  # the CLI builds no resume command of its own

"""Steps as a protocol and the turn as a graph."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field

import pytest
from conftest import model_classify_config, reply_by_step

from chainrun.chain import Chain
from chainrun.config import config_from_dict
from chainrun.errors import ConfigError
from chainrun.events import StepStarted, TokenDelta, TurnFinished
from chainrun.providers.base import ChatRequest
from chainrun.providers.fake import FakeProvider, FakeReply, words_in_sentences
from chainrun.steps import Step, StepContext, StepResult, TurnState, register_step_kind
from chainrun.steps.base import StepItem
from chainrun.timing import Chunk


class Shout(Step):
    """A step kind defined outside the package: upper-cases the answer."""

    kind = "test_shout"

    @property
    def reads(self) -> frozenset[str]:
        return frozenset({"answer"})

    @property
    def writes(self) -> frozenset[str]:
        return frozenset({"answer"})

    async def run(self, state: TurnState, ctx: StepContext) -> AsyncGenerator[StepItem, None]:
        ctx.row.output = (state.answer or "").upper()
        ctx.row.duration_ms = ctx.elapsed_ms()
        yield StepResult(updates={"answer": ctx.row.output})


register_step_kind(Shout)


async def test_a_custom_step_kind_from_outside_the_package(store) -> None:
    cfg = config_from_dict({
        "order": ["classify", "retrieve", "policy", "compose", "shout"],
        "steps": {"shout": {"kind": "test_shout"}},
    })  # fmt: skip
    fake = FakeProvider(name="local", script=reply_by_step())
    async with Chain(cfg, store=store, providers={"local": fake}) as chain:
        done = await chain.run_turn("a jacket?")
        assert done.status == "ok" and done.output == "TRY THE STORM SHELL, LIGHT AND DRY."
        steps = {s.step: s for s in store.steps(done.run_id)}
    assert steps["shout"].kind == "test_shout" and steps["shout"].status == "ok"
    assert steps["shout"].started_offset_ms >= steps["compose"].started_offset_ms


async def test_unknown_step_kind_is_a_config_error() -> None:
    # found when the config is validated (each kind's model validates its tables)
    with pytest.raises(ConfigError, match=r"steps\.classify\.kind: unknown step kind 'lmm' "
                                          r"\(did you mean 'llm'\?\)"):  # fmt: skip
        config_from_dict({"order": ["classify", "retrieve", "compose"],
                          "steps": {"classify": {"kind": "lmm"}}})  # fmt: skip


def _offsets(store, run_id: int) -> dict[str, tuple[float, float]]:
    return {s.step: (s.started_offset_ms, s.started_offset_ms + s.duration_ms)
            for s in store.steps(run_id)}  # fmt: skip


def _step_of(request: ChatRequest) -> str:
    """Which default step sent ``request`` (told apart by its prompt, as reply_by_step)."""
    prompt = request.messages[-1]["content"]
    for marker, step in (("Category:", "classify"), ("Review as JSON", "validate"),
                         ("more helpful", "critique")):  # fmt: skip
        if marker in prompt:
            return step
    return "compose"


@dataclass
class HeldSteps(FakeProvider):
    """The fake provider with some steps' replies held until another step's request came
    (``"started"``) or its reply ended (``"finished"``): ``hold = {"classify": ("compose",
    "finished")}`` makes "classify ended after the answer" an order, not a race of sleeps.
    A hold never released fails the step after :data:`HOLD_S` (a wrong order is a failure,
    never a hang)."""

    hold: dict[str, tuple[str, str]] = field(default_factory=dict)
    seen: dict[tuple[str, str], asyncio.Event] = field(default_factory=dict)

    def _event(self, step: str, moment: str) -> asyncio.Event:
        return self.seen.setdefault((step, moment), asyncio.Event())

    async def chunks(self, request: ChatRequest) -> AsyncIterator[Chunk]:
        step = _step_of(request)
        self._event(step, "started").set()
        if step in self.hold:
            async with asyncio.timeout(HOLD_S):
                await self._event(*self.hold[step]).wait()
        async for chunk in super().chunks(request):
            yield chunk
        self._event(step, "finished").set()


#: how long a held step waits for its release before it fails, in s
HOLD_S = 20.0


def _held(**hold: tuple[str, str]) -> HeldSteps:
    # an answer of two sentences ("!": ". " is a stop sequence of the default compose): the
    # grounding check releases the first before the second is written, so the shopper's
    # first token comes before compose finishes
    script = reply_by_step({
        "classify": FakeReply("sizing"),
        "compose": FakeReply("Try the Storm Shell! It is light and dry.",
                             ttft_s=0.005, gap_s=0.002),
    })  # fmt: skip
    return HeldSteps(name="local", script=script, hold=hold)


async def test_independent_steps_run_concurrently_when_ready(store) -> None:
    """off_path_steps = "when_ready": classify runs beside retrieve/compose (compose does
    not read the label); validate and critique both need only the answer and overlap."""
    cfg = model_classify_config({"off_path_steps": "when_ready"})
    # classify answers only once the answer is complete; validate once critique has started
    fake = _held(classify=("compose", "finished"), validate=("critique", "started"))
    async with Chain(cfg, store=store, providers={"local": fake}) as chain:
        assert chain.graph.deferred == frozenset()
        done = await chain.run_turn("a jacket?")
    spans = _offsets(store, done.run_id)
    assert spans["compose"][0] < spans["classify"][1]  # compose started before classify ended
    assert spans["critique"][0] < spans["validate"][1]  # post-answer checks overlap
    assert done.answer_ttft_ms is not None and done.answer_ttft_ms < spans["classify"][1]
    assert done.answer_done_ms is not None and done.answer_done_ms <= done.duration_ms
    steps = {s.step: s for s in store.steps(done.run_id)}
    assert steps["validate"].post_answer and steps["critique"].post_answer
    assert not steps["compose"].post_answer and not steps["classify"].post_answer
    (turn,) = store.turns(done.run_id)
    assert turn.answer_ttft_ms == done.answer_ttft_ms and turn.label == "sizing"


async def test_off_path_steps_wait_for_the_answer_by_default(store) -> None:
    """Default: classify (nothing on the answer's path reads the label, it cannot end the
    turn) starts once the answer is complete, beside validate and critique, so it does not
    share a compute-bound model server with the answer's prefill; it is post-answer."""
    fake = _held(validate=("classify", "started"))  # validate ends after classify started
    async with Chain(model_classify_config(), store=store, providers={"local": fake}) as chain:
        assert chain.graph.deferred == {"classify"}
        assert chain.graph.deps["classify"] == {"compose"}
        done = await chain.run_turn("a jacket?")
    spans = _offsets(store, done.run_id)
    assert spans["classify"][0] >= spans["compose"][1]
    assert spans["classify"][0] < spans["validate"][1]  # beside the post-answer checks
    assert done.answer_done_ms is not None and done.answer_done_ms <= spans["classify"][0] + 1
    steps = {s.step: s for s in store.steps(done.run_id)}
    assert steps["classify"].post_answer and steps["classify"].output == "sizing"
    (turn,) = store.turns(done.run_id)
    assert turn.label == "sizing"


async def test_the_default_classify_step_is_on_the_path_and_calls_no_model(store) -> None:
    """The default chain routes on the label, so classify runs first, before retrieve or
    policy, and the answer waits for it; it calls no model (keyword rules; a message they
    do not decide costs one MiniLM forward pass: benchmarks/conversation_routes.py measures
    the wait) and no model call precedes the answer's."""
    fake = FakeProvider(name="local", script=reply_by_step())
    async with Chain(config_from_dict({}), store=store, providers={"local": fake}) as chain:
        assert chain.graph.deferred == frozenset()
        assert chain.graph.deps["classify"] == frozenset()
        assert chain.graph.deps["retrieve"] == chain.graph.deps["policy"] == {"classify"}
        done = await chain.run_turn("Do you have a rain jacket?")
    spans = _offsets(store, done.run_id)
    assert spans["classify"][1] <= spans["retrieve"][0] + 1.0
    steps = {s.step: s for s in store.steps(done.run_id)}
    assert not steps["classify"].post_answer and steps["classify"].n_attempts == 0
    assert next(c.step for c in store.calls(done.run_id)) == "compose"


def test_a_step_that_can_end_the_turn_is_never_deferred() -> None:
    """A fail-closed classify (or a guard, or a step such a step waits for) keeps its
    place before the answer: ending the turn after the answer was shown is too late."""
    closed = Chain(model_classify_config({"steps": {"classify": {"on_failure": "closed"}}}))
    assert closed.graph.deferred == frozenset() and closed.graph.deps["classify"] == frozenset()
    gate = Chain(model_classify_config({
        "order": ["classify", "gate", "retrieve", "compose"],
        "steps": {"gate": {"prompt": "{label}", "on_failure": "closed"}},
    }))  # fmt: skip
    assert gate.graph.deferred == frozenset() and "compose" not in gate.graph.deps["classify"]


async def test_a_compose_prompt_that_reads_the_label_waits_for_classify(store) -> None:
    cfg = config_from_dict({"steps": {"compose": {"prompt": "{label}: {products} {message}"}}})
    fake = FakeProvider(name="local", script=reply_by_step({
        "classify": FakeReply("sizing", ttft_s=0.2),
    }))  # fmt: skip
    chain = Chain(cfg, store=store, providers={"local": fake})
    assert chain.graph.deps["compose"] == {"classify", "retrieve"}
    async with chain:
        done = await chain.run_turn("does it run small?")
    spans = _offsets(store, done.run_id)
    assert spans["compose"][0] >= spans["classify"][1]
    prompt = next(c.prompt for c in store.calls(done.run_id) if c.step == "compose")
    assert prompt is not None and "sizing:" in prompt


def test_retrieve_reads_the_label_only_when_asked() -> None:
    unrouted = Chain(model_classify_config())
    assert unrouted.graph.deps["retrieve"] == frozenset()
    use_label = {"steps": {"retrieve": {"retrieval": {"use_label": True}}}}
    with_label = Chain(model_classify_config(use_label))
    assert with_label.graph.deps["retrieve"] == {"classify"}
    # or when it routes on it, as in the default chain
    assert Chain(config_from_dict({})).graph.deps["retrieve"] == {"classify"}


def test_a_cycle_is_one_config_error_naming_both_steps() -> None:
    cfg = config_from_dict({
        "order": ["a", "b"], "answer_step": "a",
        "steps": {"a": {"prompt": "{label} {message}"},
                  "b": {"prompt": "{answer}", "labels": ["x", "y"]}},
    })  # fmt: skip
    with pytest.raises(ConfigError) as e:
        Chain(cfg)
    msg = str(e.value)
    assert "\n" not in msg and "cycle" in msg and "a" in msg and "b" in msg
    assert "reads {label}, which b writes" in msg and "reads {answer}, which a writes" in msg


def test_a_cycle_in_a_config_file_is_one_line_naming_the_file_and_steps_exit_2(tmp_path) -> None:
    cfg = tmp_path / "cyc.toml"
    cfg.write_text('order = ["a", "b"]\nanswer_step = "a"\n[steps.a]\n'
                   'prompt = "{label} {message}"\n[steps.b]\nprompt = "{answer}"\n'
                   'labels = ["x", "y"]\n')  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-m", "chainrun", "run", "hi", "--config", str(cfg),
         "--db", str(tmp_path / "log.db")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2 and proc.stdout == ""
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"chainrun: error: {cfg}: steps a, b wait for each other in a cycle")
    assert not (tmp_path / "log.db").exists()  # no empty log left by the failed command


def test_a_capability_error_names_the_config_file_exit_2(tmp_path) -> None:
    """Found by a new user: the capability check's error was the only config error
    without the file's name (and ``"file": null`` with --json)."""
    cfg = tmp_path / "cap.toml"
    cfg.write_text('[steps.compose]\nmodel = "gpt-5.1"\nreasoning_effort = "minimal"\n')
    proc = subprocess.run(
        [sys.executable, "-m", "chainrun", "run", "hi", "--config", str(cfg),
         "--db", str(tmp_path / "log.db"), "--json"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2
    error = json.loads(proc.stdout)["error"]
    assert error["file"] == str(cfg) and error["message"].startswith(f"{cfg}: steps.compose.")


def test_a_field_nothing_writes_is_a_config_error() -> None:
    cfg = config_from_dict({"order": ["compose"], "steps": {"compose": {
        "prompt": "{products} {message}"}}})  # fmt: skip
    with pytest.raises(ConfigError, match=r"steps\.compose: reads \{products\}, which no step"):
        Chain(cfg)


def test_after_adds_an_edge() -> None:
    cfg = config_from_dict({"steps": {"critique": {"after": ["validate"]}}})
    assert "validate" in Chain(cfg).graph.deps["critique"]
    with pytest.raises(ConfigError, match=r"steps\.critique\.after: 'nope'"):
        config_from_dict({"steps": {"critique": {"after": ["nope"]}}})


async def test_a_closed_failure_cancels_running_siblings(store) -> None:
    """compose fails closed while classify (slow) is still running: classify is
    cancelled (its stream closed), the checks are skipped, the turn refused."""
    fake = FakeProvider(name="local", script=reply_by_step({
        "classify": FakeReply("sizing", ttft_s=5.0),
        "compose": FakeReply(error=TimeoutError()),
    }))  # fmt: skip
    cfg = model_classify_config({"off_path_steps": "when_ready"})  # classify beside compose
    async with Chain(cfg, store=store, providers={"local": fake}) as chain:
        done = await chain.run_turn("hi")
    # not waited for: classify's 5 s reply was closed unfinished
    assert done.status == "refused" and fake.finished == 0
    status = {s.step: s.status for s in store.steps(done.run_id)}
    assert status == {"classify": "cancelled", "retrieve": "ok", "compose": "failed_closed",
                      "validate": "skipped", "critique": "skipped"}  # fmt: skip
    assert fake.closed_early >= 1


class HoldGate(Step):
    """A check that holds the answer back while it runs, then refuses or passes."""

    kind = "test_hold_gate"
    holds_answer = True

    @property
    def reads(self) -> frozenset[str]:
        return frozenset({"message"})

    @property
    def writes(self) -> frozenset[str]:
        return frozenset()

    async def run(self, state: TurnState, ctx: StepContext) -> AsyncGenerator[StepItem, None]:
        await asyncio.sleep(0.2)
        yield StepResult(refuse="unsafe" in state.message, verdict={"checked": True})


register_step_kind(HoldGate)


@pytest.mark.parametrize("message", ["a safe question", "an unsafe question"])
async def test_an_answer_held_by_a_check_is_released_or_dropped(store, message) -> None:
    cfg = config_from_dict({
        "order": ["gate", "retrieve", "compose"],
        "steps": {"gate": {"kind": "test_hold_gate"}, "retrieve": {"when": {}},
                  "compose": {"prompt": "Catalogue matches:\n{products}\n\n{message}"}},
    })  # fmt: skip
    fake = FakeProvider(name="local", script=reply_by_step({
        "compose": FakeReply("one two three four", ttft_s=0.01, gap_s=0.01),
    }))  # fmt: skip
    events = []
    async with Chain(cfg, store=store, providers={"local": fake}) as chain:
        async with contextlib.aclosing(chain.stream_turn(message)) as it:
            async for ev in it:
                events.append(ev)
    done = events[-1]
    assert isinstance(done, TurnFinished)
    text = "".join(e.text for e in events if isinstance(e, TokenDelta))
    if "unsafe" in message:
        assert done.status == "refused" and text == "" and done.answer_ttft_ms is None
    else:
        assert done.status == "ok" and text == done.output
        assert done.answer_ttft_ms is not None and done.answer_ttft_ms >= 190  # held ~0.2 s
    assert [e.step for e in events if isinstance(e, StepStarted)][:2] == ["gate", "retrieve"]


async def test_a_call_in_flight_when_the_turn_is_cancelled_is_still_a_row(store) -> None:
    """Cancelled before its first token (the race not settled): the attempt is a calls
    row with outcome cancelled, not missing (found by a new user's Ctrl-C)."""
    fake = FakeProvider(name="local", script=reply_by_step({
        "classify": FakeReply("sizing", ttft_s=5.0),
        "compose": FakeReply("slow", ttft_s=5.0),
    }))  # fmt: skip
    cfg = model_classify_config({"off_path_steps": "when_ready"})  # classify beside compose
    async with Chain(cfg, store=store, providers={"local": fake}) as chain:
        task = asyncio.create_task(chain.run_turn("hi"))
        await asyncio.sleep(0.3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        run_id = chain.run_id
    calls = {c.step: c for c in store.calls(run_id)}
    assert calls["classify"].outcome == "cancelled" and calls["classify"].ttft_ms is None
    assert calls["compose"].outcome == "cancelled"
    steps = {s.step: s for s in store.steps(run_id)}
    assert steps["classify"].status == "cancelled" and steps["classify"].n_attempts == 1


async def test_a_stream_cut_by_the_step_deadline_has_an_error_type(store) -> None:
    cfg = config_from_dict({"steps": {"compose": {"deadline_s": 0.3}}})
    fake = FakeProvider(name="local", script=reply_by_step({
        "compose": FakeReply(words_in_sentences(100), ttft_s=0.01, gap_s=0.05),
    }))  # fmt: skip
    async with Chain(cfg, store=store, providers={"local": fake}) as chain:
        done = await chain.run_turn("hi")
    # its first words had reached the shopper: the turn is cut there, not refused
    assert done.status == "cut" and done.error_type == "timeout"
    (compose,) = [c for c in store.calls(done.run_id) if c.step == "compose"]
    assert compose.error_type == "timeout" and compose.ttft_ms is not None


def test_terminal_control_characters_in_model_text_are_shown_not_sent() -> None:
    from chainrun.cli.tables import printable

    text = "ok\x1b[31mRED\x1b[0m\nnext\tcol\x07"
    shown = printable(text)
    assert "\x1b" not in shown and "\x07" not in shown
    assert shown == "ok\\x1b[31mRED\\x1b[0m\nnext\tcol\\x07"

"""A conversation's earlier turns as the shopper saw them, cut to a budget.

A turn of history is the shopper's message and what reached them: the answer, the
refusal text of a refused turn, the part of the answer streamed before a cancelled
turn stopped or a cut one ended (its answer step's deadline), or nothing (``""``) when
nothing reached them. Prompts read the history as ``{history}``: the kept turns oldest
first, rendered as a transcript in the default prompts' own speaker names::

    Shopper: Do you have rain jackets?
    Stylist: Yes: the City Drizzle Packable Rain Jacket (44.95 EUR) and ...

followed by one blank line, so a template places ``{history}`` just before its own
sections; a conversation's first turn renders ``""``.

A turn that knows what the answer step's prompt showed after its history (its
``context``: the sections and the message, as the model read them) renders as that
text, the answer and a blank line. A conversation's next prompt then begins with its
previous prompt and answer, whole, which is the layout prompt caches reuse: what
changes per turn comes last (llama-server reuses a slot's common prefix; OpenAI caches
prompt prefixes). The chain records that context when the answer step's template
begins with ``{history}`` (the default's does); a thread given by a client, or read
back from the log, has none and renders as the two lines above.

The budget (``[history]`` in chainrun.toml, :class:`HistorySettings`) keeps the newest
turns: at most ``max_turns``, then the newest of those whose rendered lines together
hold at most ``max_tokens`` tokens. Turns are kept or dropped whole (a turn cut half way
would show the model an answer to a question it cannot see). Tokens are counted with
the answer step's provider's own tokenizer where it has one, else estimated from the
characters (:mod:`chainrun.conversations.tokens`).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "History",
    "HistorySettings",
    "HistoryTurn",
    "continuation",
    "cut_to_budget",
    "history_messages",
    "prose",
    "render_history",
    "render_turn",
    "turn_context",
]


@dataclass(frozen=True, slots=True)
class HistoryTurn:
    """One earlier turn of a conversation.

    Attributes:
        message: the shopper's message as the chain received it (after the
            deterministic checks' redactions).
        answer: what reached the shopper ("" when nothing did).
        products: the ids of the products the turn's search showed, in the order shown
            (None: not known, e.g. a client's own thread; ``()``: none were found).
            A follow-up that points back at them ("Which of those is cheapest?")
            searches among them (:mod:`chainrun.retrieval.followup`).
        context: the answer step's prompt text after its history (None: not known).
        messages: its user message, tool calls and tool results as sent (() without tools).
    """

    message: str
    answer: str = ""
    products: tuple[str, ...] | None = None
    #: the answer step's prompt text after its history: what the model read for this
    #: turn (None: not known; the turn renders as two transcript lines)
    context: str | None = None
    #: the turn's messages as the answer step sent them after its history, when it
    #: called tools: its user message, each round's assistant tool calls and tool
    #: results (Chat Completions shape); () when it called none
    messages: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True, slots=True)
class History:
    """A turn's history as the turn state holds it (the ``history`` field).

    Attributes:
        turns: the kept earlier turns, oldest first (cut to the budget).
        text: their transcript, what ``{history}`` shows (:func:`render_history`).
        dropped: earlier turns the budget left out.
    """

    turns: tuple[HistoryTurn, ...] = ()
    text: str = ""
    dropped: int = 0

    def __str__(self) -> str:
        return self.text


class HistorySettings(BaseModel):
    """The history budget (``[history]`` in chainrun.toml).

    Attributes:
        max_turns: earlier turns kept at most (0: prompts see no history).
        max_tokens: tokens the kept turns' rendered lines hold at most.
        tokenizer: ``"auto"``: the answer step's provider's tokenizer when its server
            has one (llama-server's ``POST /tokenize``), else the character estimate;
            ``"estimate"``: always the estimate (no request to the server).
        shopper, assistant: the speaker names of the rendered transcript (those of the
            default prompts).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: earlier turns a prompt's {history} shows at most, newest kept (0: none)
    max_turns: int = Field(default=4, ge=0, le=1000)
    #: tokens the kept turns' transcript holds at most (whole turns are dropped, oldest
    #: first); counted with the answer step's provider's tokenizer where it has one. A
    #: turn rendered with its context (its products or policy text) takes about 400
    #: tokens with the default chain: four of them fit
    max_tokens: int = Field(default=1600, ge=0, le=1_000_000)
    #: "auto": llama-server's POST /tokenize when the answer step's server answers it,
    #: else the script-aware estimate; "estimate": always the estimate
    #: (chainrun.conversations.tokens.estimate_tokens)
    tokenizer: Literal["auto", "estimate"] = "auto"
    #: the shopper's name in the {history} transcript (the default prompts' own)
    shopper: str = Field(default="Shopper", min_length=1, max_length=40)
    #: the assistant's name in the {history} transcript
    assistant: str = Field(default="Stylist", min_length=1, max_length=40)


def _one_line(text: str) -> str:
    # a blank line inside an earlier answer would read as the end of the transcript to
    # a model continuing it; the words are kept, the layout is not
    return " ".join(text.split())


def _answer_text(text: str) -> str:
    # the answer as generated (the next prompt repeats it token for token where it can),
    # without the blank lines that would end a transcript
    return re.sub(r"\n\s*\n", "\n", text.strip())


#: the shortest start of an answer taken for the words its prompt already ended with
#: (the answer step's lead: "Here are our rain jackets"), in characters
MIN_LEAD_CHARS = 8


def continuation(context: str, answer: str) -> str:
    """``answer`` without the words ``context`` already ends with: an answer that starts
    with its prompt's last words (the lead written at the end of the prompt for the
    model to continue, shown again as the answer's start) continues the prompt rather
    than repeating them. Only a whole-word overlap of at least :data:`MIN_LEAD_CHARS`
    characters counts; else ``answer`` unchanged."""
    end = context.rstrip()
    for k in range(min(len(end), len(answer)), MIN_LEAD_CHARS - 1, -1):
        if (end.endswith(answer[:k]) and (k == len(answer) or not answer[k].isalnum())
                and (k == len(end) or not end[-k - 1].isalnum())):
            return answer[k:].lstrip(" ")
    return answer


#: an answer's product line (chainrun.steps.facts.product_line): "- Title, ID: price..."
_PRODUCT_LINE = re.compile(r"^- .+?, ([A-Z0-9][A-Z0-9_-]*): ")


def _known(line: str, context: str) -> bool:
    """Whether ``context`` (the prompt the model answered) already holds ``line``: a
    policy line it quoted word for word, or a product line whose id it listed, whole
    (``- [ID] ...``) or among the ones an earlier turn showed (``- as above: ID, ...``:
    :func:`chainrun.retrieval.products.render_products`)."""
    if not line.strip() or line.strip() in context:
        return True
    product = _PRODUCT_LINE.match(line)
    if product is None:
        return False
    pid = product.group(1)
    return f"[{pid}]" in context or any(
        pid in row.removeprefix("- as above:").replace(",", " ").split()
        for row in context.splitlines() if row.startswith("- as above:"))


def prose(answer: str, context: str) -> str:
    """``answer`` without its last paragraphs that ``context`` already holds (the facts
    chainrun rendered from data under the model's words: the products and policy lines
    of the turn's prompt): the next prompt shows what the model read and what it wrote,
    not the same lines twice. The first paragraph is always kept."""
    paragraphs = re.split(r"\n\s*\n", answer.strip())
    while len(paragraphs) > 1 and all(_known(line, context)
                                      for line in paragraphs[-1].splitlines()):
        paragraphs.pop()
    return "\n\n".join(paragraphs)


def render_turn(turn: HistoryTurn, settings: HistorySettings) -> str:
    """One turn's text: with a ``context``, that text, the answer and a blank line (the
    turn's prompt continued by its answer: :func:`continuation`, without the facts its
    context already holds: :func:`prose`); else two transcript lines, each ending in a
    newline."""
    if turn.context is not None:
        said = prose(continuation(turn.context, turn.answer), turn.context)
        answer = _answer_text(said) or "(no answer)"
        glue = "" if answer[0] in ".,;:!?\n" else " "
        return f"{turn.context.rstrip()}{glue}{answer}\n\n"
    answer = _one_line(turn.answer) or "(no answer)"
    return f"{settings.shopper}: {_one_line(turn.message)}\n{settings.assistant}: {answer}\n"


def render_history(turns: Sequence[HistoryTurn], settings: HistorySettings) -> str:
    """The ``{history}`` text of ``turns`` (oldest first): their text, ending in one
    blank line; ``""`` for no turns."""
    text = ""
    for t in turns:
        if t.context is not None and text and not text.endswith("\n\n"):
            text += "\n"  # the blank line this turn's prompt had after the lines before it
        text += render_turn(t, settings)
    return text if not text or text.endswith("\n\n") else text + "\n"


def history_messages(turns: Sequence[HistoryTurn]) -> list[dict[str, Any]]:
    """``turns`` as Chat Completions role messages, oldest first: each turn's user
    message (its ``context`` when known, else the shopper's message), the tool calls it
    made with their results when it made any, then the assistant's answer (a turn whose
    answer never reached the shopper answers ``(no answer)``)."""
    out: list[dict[str, Any]] = []
    for t in turns:
        if t.messages:
            out.extend(dict(m) for m in t.messages)
        else:
            out.append({"role": "user", "content": t.context if t.context is not None
                        else t.message})  # fmt: skip
        out.append({"role": "assistant", "content": t.answer.strip() or "(no answer)"})
    return out


def turn_context(prompt: str, template: str, history: str) -> str | None:
    """What an answer prompt showed after its history: ``prompt`` (the user message the
    answer step sent) without its leading ``history`` text, when its ``template`` begins
    with ``{history}``; None otherwise (the history is elsewhere in the prompt, so the
    turn cannot be repeated as the next prompt's start)."""
    if not template.startswith("{history}") or not prompt.startswith(history):
        return None
    return prompt[len(history):]


async def cut_to_budget(
    turns: Sequence[HistoryTurn],
    settings: HistorySettings,
    count_tokens: Callable[[str], Awaitable[int]],
) -> tuple[HistoryTurn, ...]:
    """The newest of ``turns`` (oldest first) that fit the budget, oldest first.

    ``count_tokens(text) -> int`` counts one rendered turn's tokens. Counting stops at
    the first turn that does not fit: an older turn is never kept once a newer one was
    dropped.
    """
    if settings.max_turns == 0 or settings.max_tokens == 0:
        return ()
    kept: list[HistoryTurn] = []
    used = 0
    for turn in reversed(turns[-settings.max_turns :]):
        used += await count_tokens(render_turn(turn, settings))
        if used > settings.max_tokens:
            break
        kept.append(turn)
    kept.reverse()
    return tuple(kept)

"""Conversations: a turn's earlier turns (``{history}``), where they come from, and the
budget they are cut to.

Modules: ``history`` (:class:`HistoryTurn`, :class:`HistorySettings`, the budget cut and
the transcript a prompt reads), ``tokens`` (counting with the server's tokenizer or an
estimate), ``memory`` (a chain's conversations, read from the run log when unknown),
``messages`` (a Chat Completions ``messages`` list read as a conversation).
"""

from chainrun.conversations.history import (
    HistorySettings,
    HistoryTurn,
    cut_to_budget,
    render_history,
    render_turn,
)
from chainrun.conversations.memory import ConversationMemory
from chainrun.conversations.messages import Thread, read_thread
from chainrun.conversations.tokens import EstimateCounter, ServerTokenizer, TokenCounter

__all__ = [
    "ConversationMemory",
    "EstimateCounter",
    "HistorySettings",
    "HistoryTurn",
    "ServerTokenizer",
    "Thread",
    "TokenCounter",
    "cut_to_budget",
    "read_thread",
    "render_history",
    "render_turn",
]

"""Which conversation a request belongs to when its client names none.

A stateless client (the OpenAI API's clients and the chat UIs built on them) sends the
whole thread with every request and no conversation id. OpenAI's ``user`` field is no
conversation either: it names the end user (OpenAI API reference, "Create chat
completion": ``user``, now ``safety_identifier``), and chat UIs send the person's id
there on every request of every chat (danny-avila/LibreChat#6341), so two chats of one
person taken as one conversation would let a "yes" in one decide an action asked in the
other. So, in order:

1. the conversation the client names (``metadata.conversation_id``, a header);
2. for a request with an ``Idempotency-Key``, one derived from the key and the caller
   (:func:`chainrun.desk.keys.keyed_conversation_id`), so that its retry finds it;
3. one **derived from the chat's opening** (:func:`derived_conversation_id`): the
   instructions before its first user message and that message, scoped by the caller
   (the identity, else the end user the client names), so every turn of one chat gets
   the same id and two chats get different ones unless they open alike; where they do,
   a reply still decides only the actions its own thread shows
   (:meth:`chainrun.actions.confirmations.Confirmations.decide`).

The conversation is also what keeps a chat's model calls on one prompt cache (a
llama-server slot, OpenAI's ``prompt_cache_key``: :mod:`chainrun.providers.affinity`),
so every turn of a stateless chat lands where its earlier prompts are. A client that
gives OpenAI's own hint for this, ``prompt_cache_key`` ("used to cache responses for
similar requests to optimize your cache hit rates", OpenAI API reference, "Create chat
completion"), has its turns keyed by that hint instead, scoped by the caller
(:func:`hinted_cache_key`): requests that share a hint share a cache, as at OpenAI,
and two callers' equal hints never do. The hint names no conversation.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

__all__ = ["MAX_HINT_CHARS", "derived_conversation_id", "hinted_cache_key"]

#: the longest prompt-cache hint taken, in characters (the API reference sets none; a
#: provider's configured ``prompt_cache_key`` is held to the same)
MAX_HINT_CHARS = 1024


def derived_conversation_id(caller: str, opening: Sequence[str]) -> str:
    """The conversation id of a chat whose client names none: ``"d"`` and 31 hex digits
    of a SHA-256 of the caller (:attr:`chainrun.desk.TurnRequest.caller`) and the chat's
    ``opening`` (its instructions and first user message, as sent), the same for every
    turn of the chat."""
    text = json.dumps(["chat", caller, *opening], ensure_ascii=False)
    return "d" + hashlib.sha256(text.encode()).hexdigest()[:31]


def hinted_cache_key(caller: str, hint: str) -> str:
    """The prompt-cache affinity key of a turn whose client gave ``hint`` (OpenAI's
    ``prompt_cache_key``): ``"p"`` and 31 hex digits of a SHA-256 of the caller and the
    hint, so that one caller's requests with one hint share a cache and another caller's
    equal hint is another key."""
    text = json.dumps(["cache", caller, hint], ensure_ascii=False)
    return "p" + hashlib.sha256(text.encode()).hexdigest()[:31]

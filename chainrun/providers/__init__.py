"""Model providers behind one protocol (see :mod:`chainrun.providers.base`).

Build a configured one with :func:`open_provider` (the one factory the chain, the
eval grader and library users share).
"""

from chainrun.providers.base import ChatRequest, ChatStream, Provider, open_stream
from chainrun.providers.factory import open_provider
from chainrun.providers.fake import FakeProvider, FakeReply
from chainrun.providers.openai_compat import OpenAICompatProvider
from chainrun.providers.responses import ResponsesProvider

__all__ = [
    "ChatRequest",
    "ChatStream",
    "FakeProvider",
    "FakeReply",
    "OpenAICompatProvider",
    "Provider",
    "ResponsesProvider",
    "open_provider",
    "open_stream",
]

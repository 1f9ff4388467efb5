"""Model providers behind one protocol (see :mod:`chainrun.providers.base`)."""

from chainrun.providers.base import ChatRequest, ChatStream, Provider, open_stream
from chainrun.providers.fake import FakeProvider, FakeReply
from chainrun.providers.openai_compat import OpenAICompatProvider

__all__ = [
    "ChatRequest",
    "ChatStream",
    "FakeProvider",
    "FakeReply",
    "OpenAICompatProvider",
    "Provider",
    "open_stream",
]

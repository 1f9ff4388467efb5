"""``chainrun serve``: the chain inside a chat backend.

* :mod:`chainrun.serve.app`: the ASGI app (Starlette, served by uvicorn), its shared
  state (one chain for every chat) and the bearer-token check;
* :mod:`chainrun.serve.turns`: one turn as wire events, and the summary read back from
  the log;
* :mod:`chainrun.serve.chat`: ``POST /chat`` as Server-Sent Events;
* :mod:`chainrun.serve.openai_face`: ``/v1/chat/completions`` and ``/v1/models``;
* :mod:`chainrun.serve.errors`: the one error shape of every route;
* :mod:`chainrun.serve.disconnect`: cancel a non-streamed turn whose client went away;
* :mod:`chainrun.serve.server`: run it under uvicorn (loopback unless a token is set);
* :mod:`chainrun.serve.settings`: the fixed settings (default model id, body limit, the
  token's environment variable);
* ``static/``: the chat page with its live step waterfall.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from chainrun.lazy_exports import lazy_exports
from chainrun.serve.settings import DEFAULT_MAX_BODY_BYTES, DEFAULT_MODEL_ID, TOKEN_ENV

if TYPE_CHECKING:
    from chainrun.serve.app import ServeState, create_app
    from chainrun.serve.server import serve
    from chainrun.serve.turns import TurnObserver, TurnRunner, WireEvent, turn_summary

#: public name -> its module, imported on first use (PEP 562): ``chainrun serve --help``
#: needs the settings, not the HTTP stack
_EXPORTS = {
    "ServeState": "chainrun.serve.app",
    "create_app": "chainrun.serve.app",
    "serve": "chainrun.serve.server",
    **dict.fromkeys(
        ("TurnObserver", "TurnRunner", "WireEvent", "turn_summary"), "chainrun.serve.turns"
    ),
}


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)


__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_MODEL_ID",
    "TOKEN_ENV",
    "ServeState",
    "TurnObserver",
    "TurnRunner",
    "WireEvent",
    "create_app",
    "serve",
    "turn_summary",
]

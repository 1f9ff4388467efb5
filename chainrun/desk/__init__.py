"""The front desk: who asks, which conversation, whether the turn runs, decided once.

Every face (``/chat``, the OpenAI-compatible face, the library, replays) hands a turn to
the chain as one :class:`TurnRequest`; the chain's :class:`Desk` admits it (identity and
ownership, the ``Idempotency-Key``, the input checks, the conversation's place, the
decision on a pending action, the tools' keys) into the one value the turn runs with
(:class:`Admitted`), or refuses it with an error that carries its HTTP status.

Modules: ``request`` (:class:`TurnRequest`), ``desk`` (:class:`Desk`), ``keys`` (clients'
``Idempotency-Key`` s and the tools' keys), ``conversations`` (which conversation a
stateless client's request belongs to), ``background`` (chat UIs' background requests).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from chainrun.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from chainrun.desk.desk import Admitted, Desk, Repeated
    from chainrun.desk.request import Received, TurnRequest

#: public name -> its module, imported on first use (PEP 562): a face that needs only the
#: background patterns or the request's shape does not load the desk's log and actions
_EXPORTS = {
    **dict.fromkeys(("Admitted", "Desk", "Repeated"), "chainrun.desk.desk"),
    **dict.fromkeys(("Received", "TurnRequest"), "chainrun.desk.request"),
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = ["Admitted", "Desk", "Received", "Repeated", "TurnRequest"]

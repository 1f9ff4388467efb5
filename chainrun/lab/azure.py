"""Azure OpenAI's URL shape on the lab, so an Azure provider is tested without a cloud account.

::

    POST /openai/deployments/{deployment}/chat/completions?api-version=YYYY-MM-DD
    POST /openai/responses?api-version=YYYY-MM-DD

As Azure does, a request must carry an ``api-version`` query parameter (else 404,
"Resource not found") and an ``api-key`` header or an ``Authorization: Bearer`` Entra
ID token (else 401). The deployment in the path is the model that answers (Azure
ignores the body's ``model`` on the deployments route). The lab records which kind of
credential came (``auth``: "api-key" or "bearer"), never the secret. Everything else
(scenario, plans, faults, records) is the ``/v1`` route's.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from chainrun.lab.chat_completions import chat_completions
from chainrun.lab.responses import responses


def _azure_error(status: int, message: str) -> Response:
    return JSONResponse({"error": {"code": str(status), "message": message}}, status_code=status)


def _refusal(request: Request) -> Response | None:
    """Azure's answer to a request without an api-version or a credential (None: accepted)."""
    if not request.query_params.get("api-version"):
        return _azure_error(404, "Resource not found (no api-version query parameter)")
    if request.headers.get("api-key"):
        request.scope["chainrun.auth"] = "api-key"
    elif request.headers.get("authorization", "").lower().startswith("bearer "):
        request.scope["chainrun.auth"] = "bearer"
    else:
        return _azure_error(
            401, "Access denied: missing api-key header or Authorization bearer token"
        )
    return None


async def azure_chat_completions(request: Request) -> Response:
    """``POST /openai/deployments/{deployment}/chat/completions?api-version=...``."""
    refused = _refusal(request)
    if refused is not None:
        return refused
    return await chat_completions(request, deployment=request.path_params["deployment"])


async def azure_responses(request: Request) -> Response:
    """``POST /openai/responses?api-version=...`` (the body's ``model`` is the deployment)."""
    refused = _refusal(request)
    if refused is not None:
        return refused
    return await responses(request)

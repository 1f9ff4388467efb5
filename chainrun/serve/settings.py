"""The serve face's fixed settings, in a module of their own so that ``chainrun serve
--help`` shows them without loading the HTTP stack."""

#: the largest request body accepted, in bytes (1 MiB: a chat body is a few KB, and
#: a message is at most 8,000 characters, 32 KB of UTF-8 at most, JSON escapes aside)
DEFAULT_MAX_BODY_BYTES = 1 << 20
#: the largest request head (its request line and headers), in bytes: past it a request
#: is answered 431 as it arrives (:mod:`chainrun.serve.head_limit`). 64 KiB: above
#: nginx's default (4 buffers of 8 KiB, ``large_client_header_buffers``) and Node.js's
#: (16 KiB, ``--max-http-header-size``), so that no client a proxy passes is refused
MAX_HEAD_BYTES = 64 << 10
#: the chain's model id on the OpenAI-compatible face (``/v1/models``)
DEFAULT_MODEL_ID = "chainrun-shop"
#: the environment variable holding the bearer token (never a command-line argument,
#: which other users of the machine can read in the process list)
TOKEN_ENV = "CHAINRUN_SERVE_TOKEN"
#: the environment variable holding the key of signed identity tokens (HS256), read
#: with ``--identity-header`` (never a command-line argument, as the bearer token)
IDENTITY_KEY_ENV = "CHAINRUN_SERVE_IDENTITY_KEY"
#: s the turns in flight get to finish after ``chainrun serve`` is told to stop (SIGINT,
#: SIGTERM) before they are cancelled (each logged ``cancelled``; its stream then ends)
SHUTDOWN_GRACE_S = 5
#: s between keep-alive comment lines on ``/chat`` by default (``chainrun serve
#: --chat-keepalive-s``); the OpenAI face sends none unless asked (``--v1-keepalive-s``)
CHAT_KEEPALIVE_S = 15.0
#: the request header the OpenAI face reads a conversation id from when the body's
#: ``metadata.conversation_id`` names none (``chainrun serve --conversation-header``)
CONVERSATION_HEADER = "Conversation-Id"
#: s of clock skew allowed on a signed identity token's ``exp``, ``nbf`` and ``iat`` by
#: default (``--identity-leeway-s``): PyJWT and joserfc default to 0, which refuses a
#: token whose issuer's clock runs a second ahead; about a minute is common practice
LEEWAY_S = 60.0

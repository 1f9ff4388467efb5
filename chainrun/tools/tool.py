"""Tools as chainrun runs them: a Python callable or a JSON POST, built from the config.

What a callable receives: the model's arguments, validated against the tool's
``parameters`` schema, as keyword arguments; plus, when its signature names them (or
takes ``**kwargs``):

- ``idempotency_key`` (str): ``"{turn id}:{step}:{round}:{position}"``, the same for
  every attempt to carry out one tool call of one turn. chainrun runs a call at most
  once, but a tool that reaches a system of its own (a shop's cart service) should pass
  the key on, so that a process restarted mid-call cannot act twice either.
- ``context`` (:class:`ToolContext`): the turn id, the call id, the step, the
  conversation id, the shopper (``context.user``, a :class:`chainrun.identity.Identity`
  or None) and the turn-state fields known when the model asked.

It returns a JSON-serialisable result (sent back to the model as the tool message's
content), or raises: the exception's type and message go back to the model as the
tool's error. A sync callable runs in a worker thread of the tool's own
(``threads`` of them), so the event loop (other turns' streams) goes on meanwhile and a
call that hangs holds only its tool's threads: Python cannot stop a thread, so a call
past ``timeout_s`` runs on until the callable returns, and while every thread of the
tool is held its next call is refused at once (:class:`ToolBusy`).

A URL tool receives ``POST url`` with the JSON body ``{"tool", "arguments",
"idempotency_key", "context": {"turn_id", "call_id", "step", "conversation_id",
"user": {"user_id", "claims"} or null}}`` and an
``Idempotency-Key`` header (the IETF HTTPAPI draft "The Idempotency-Key HTTP Header
Field"); a 2xx answer's JSON body is the result, any other status is the tool's error.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import importlib
import inspect
import json
import sys
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chainrun.errors import ConfigError
from chainrun.identity import Identity
from chainrun.tools.spec import ToolConfig, check_tool_name

__all__ = [
    "FunctionTool",
    "HttpTool",
    "Tool",
    "ToolBusy",
    "ToolContext",
    "ToolFailed",
    "build_tools",
    "import_callable",
]


@dataclass(frozen=True)
class ToolContext:
    """What a tool is told about the call besides its arguments.

    Attributes:
        turn_id: the turn's id in the run log (None: the chain keeps no log).
        call_id: the model's id for this tool call.
        idempotency_key: ``"{turn key}:{step}:{round}:{position}"`` (the turn key is the
            turn id, or a random hex id for a chain without a log).
        step: the step whose model asked.
        conversation_id: the turn's conversation, when it has one.
        state: the turn-state fields known when the model asked (read-only).
        user: the shopper the turn is for, as the shop vouched for them (None: the
            turn was given no identity).
    """

    turn_id: int | None
    call_id: str
    idempotency_key: str
    step: str
    conversation_id: str | None = None
    state: Mapping[str, Any] = field(default_factory=dict)
    user: Identity | None = None


class ToolFailed(Exception):
    """A tool ran and reported a failure (a URL tool's non-2xx status, a result that is
    not JSON); the message is what the model is told."""


class ToolBusy(Exception):
    """A sync tool's every thread is held by a call still running (timed-out ones
    included): the call was refused before anything ran; the message is what the model
    is told."""


class Tool(ABC):
    """One configured tool.

    Attributes:
        name: ``NAME`` of ``[tools.NAME]``.
        config: its configuration.
    """

    def __init__(self, name: str, config: ToolConfig) -> None:
        self.name = name
        self.config = config

    @property
    def side_effects(self) -> bool:
        return self.config.side_effects

    @property
    def timeout_s(self) -> float:
        return self.config.timeout_s

    def definition(self) -> dict[str, Any]:
        """What the model is told: ``{"name", "description", "parameters"}`` (each wire
        format wraps it its own way)."""
        return {"name": self.name, "description": self.config.description,
                "parameters": self.config.parameters}  # fmt: skip

    @abstractmethod
    async def invoke(self, arguments: dict[str, Any], context: ToolContext) -> Any:
        """Run the tool once with validated ``arguments``; its JSON-serialisable result.

        Raises:
            ToolFailed, or whatever the callable raised.
        """

    async def aclose(self) -> None:  # noqa: B027 (optional hook)
        """Release what the tool holds (an HTTP client)."""


def _accepts(fn: Callable[..., Any], name: str) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin without a signature: pass nothing extra
        return False
    return name in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


class FunctionTool(Tool):
    """A tool that is a Python callable (sync: run in a thread of its own pool of
    ``threads``; async: awaited).

    Attributes:
        busy: the sync calls whose thread has not returned (timed-out ones included).
    """

    def __init__(self, name: str, config: ToolConfig, fn: Callable[..., Any]) -> None:
        super().__init__(name, config)
        self.fn = fn
        self.busy = 0
        self._busy_lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
            getattr(fn, "__call__", None)  # noqa: B004 (an object with an async __call__)
        )
        self._wants_key = _accepts(fn, "idempotency_key")
        self._wants_context = _accepts(fn, "context")

    async def invoke(self, arguments: dict[str, Any], context: ToolContext) -> Any:
        kwargs = dict(arguments)
        if self._wants_key:
            kwargs["idempotency_key"] = context.idempotency_key
        if self._wants_context:
            kwargs["context"] = context
        if self._is_async:
            return await self.fn(**kwargs)
        result = await self._in_thread(kwargs)
        if inspect.isawaitable(result):  # a sync wrapper that returned a coroutine
            return await result
        return result

    async def _in_thread(self, kwargs: dict[str, Any]) -> Any:
        """``fn(**kwargs)`` in one of the tool's threads (the caller's context vars
        copied), or :class:`ToolBusy` at once when all are held."""
        threads = self.config.threads
        with self._busy_lock:
            if self.busy >= threads:
                raise ToolBusy(
                    f"all {threads} threads of tool {self.name!r} are held by calls still "
                    "running (timed-out calls run on until they return); nothing was done, "
                    "try again later")  # fmt: skip
            self.busy += 1
        if self._pool is None:
            self._pool = ThreadPoolExecutor(threads,
                                            thread_name_prefix=f"chainrun-tool-{self.name}")
        try:
            ctx = contextvars.copy_context()
            future = self._pool.submit(ctx.run, functools.partial(self.fn, **kwargs))
        except BaseException:
            self._release()
            raise
        future.add_done_callback(lambda _: self._release())
        return await asyncio.wrap_future(future)

    def _release(self) -> None:
        with self._busy_lock:
            self.busy -= 1

    async def aclose(self) -> None:
        """Let the tool's threads go (a call still running finishes on its own)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


class HttpTool(Tool):
    """A tool behind a URL: one JSON POST per call (body in the module docstring)."""

    def __init__(self, name: str, config: ToolConfig) -> None:
        super().__init__(name, config)
        assert config.url is not None
        self.url = config.url
        self._client: Any = None

    def _http(self) -> Any:
        if self._client is None:
            import httpx2  # the HTTP client the openai SDK ships with (lazy: start-up)

            self._client = httpx2.AsyncClient(timeout=self.timeout_s)
        return self._client

    async def invoke(self, arguments: dict[str, Any], context: ToolContext) -> Any:
        import httpx2

        body = {
            "tool": self.name,
            "arguments": arguments,
            "idempotency_key": context.idempotency_key,
            "context": {"turn_id": context.turn_id, "call_id": context.call_id,
                        "step": context.step, "conversation_id": context.conversation_id,
                        "user": context.user.as_json() if context.user else None},
        }  # fmt: skip
        try:
            response = await self._http().post(
                self.url, json=body, headers={"Idempotency-Key": context.idempotency_key}
            )
        except httpx2.HTTPError as e:
            raise ToolFailed(f"{self.url}: {type(e).__name__}: {e}") from e
        if not 200 <= response.status_code < 300:
            text = response.text[:200]
            raise ToolFailed(f"{self.url} answered HTTP {response.status_code}: {text}")
        try:
            return json.loads(response.content) if response.content else None
        except ValueError as e:
            raise ToolFailed(f"{self.url} answered something that is not JSON ({e})") from e

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None


def _import(module_name: str) -> Any:
    """The module, or None when it (not something it imports) does not exist.

    Raises:
        ValueError: the module failed while importing (its error named).
    """
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name is not None and module_name.startswith(e.name):
            return None  # the module (or its package) is not there
        raise ValueError(f"cannot import {module_name!r} ({e})") from None
    except Exception as e:  # the module itself failed while importing
        raise ValueError(f"cannot import {module_name!r} ({type(e).__name__}: {e})") from None


def import_callable(spec: str, search_dirs: Sequence[Path] = ()) -> Callable[..., Any]:
    """The callable ``"module:attr.path"`` names. When the module is not importable as
    is, each of ``search_dirs`` (e.g. the config file's directory) is put on
    ``sys.path`` in turn and the import tried again (the directory stays on the path:
    the module may import its neighbours when it runs).

    Raises:
        ValueError: the module does not import (its error named), the attribute is
            missing, or it is not callable.
    """
    module_name, _, attr_path = spec.partition(":")
    module = _import(module_name)
    for d in search_dirs if module is None else ():
        path = str(Path(d).resolve())
        if path not in sys.path:
            sys.path.insert(0, path)
            importlib.invalidate_caches()
        module = _import(module_name)
        if module is not None:
            break
    if module is None:
        where = f" (looked on sys.path and in {', '.join(str(d) for d in search_dirs)})"
        raise ValueError(f"cannot import {module_name!r}: no such module"
                         f"{where if search_dirs else ''}")  # fmt: skip
    obj: Any = module
    for part in attr_path.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"module {module_name!r} has no attribute {attr_path!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"{spec!r} is not callable (got {type(obj).__name__})")
    result: Callable[..., Any] = obj
    return result


def build_tools(
    configs: Mapping[str, ToolConfig], *, base_dir: Path | None = None
) -> dict[str, Tool]:
    """One :class:`Tool` per ``[tools.NAME]`` table, every callable imported now.

    Args:
        configs: the tables by name.
        base_dir: the config file's directory, searched for a callable's module that is
            not importable otherwise.

    Raises:
        ConfigError: one line naming ``tools.NAME.function`` (or the name) and why: a
            bad name, a module that does not import, a missing or uncallable attribute.
    """
    tools: dict[str, Tool] = {}
    dirs = [base_dir] if base_dir is not None else []
    for name, cfg in configs.items():
        try:
            check_tool_name(name)
        except ValueError as e:
            raise ConfigError(f"tools.{name}: {e}") from None
        if cfg.function is not None:
            try:
                fn = import_callable(cfg.function, dirs)
            except ValueError as e:
                raise ConfigError(f"tools.{name}.function: {e}; expected \"module:callable\" "
                                  "naming a callable on the Python path or in the config "
                                  "file's folder") from None  # fmt: skip
            tools[name] = FunctionTool(name, cfg, fn)
        else:
            tools[name] = HttpTool(name, cfg)
    return tools

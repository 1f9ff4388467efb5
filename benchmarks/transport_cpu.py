"""CPU per streamed call of HTTP transports, on the same lab bytes, in one run.

Every arm sends the same streamed Chat Completions request (16 tokens, ``stream = true``
with usage) to one lab server (``fast`` scenario: no added latency, 2 ms between tokens)
and feeds the response body's bytes, as they arrive, to chainrun's stream parser
(:class:`~chainrun.providers.chat_sse.ChatSSEParser`), so the arms differ only in how
the request is sent and the bytes are read:

* ``chainrun``: :meth:`OpenAICompatProvider.chunks` with ``transport = "httpx"`` (the
  ``openai`` client's request path on ``httpx2``, chainrun's sharded pools and its
  asyncio network backend :mod:`chainrun.providers.netio`);
* ``chainrun_transport_aiohttp``: the provider with ``transport = "aiohttp"``
  (:mod:`chainrun.providers.aiohttp_transport`: the request sent on an
  ``aiohttp.ClientSession`` by chainrun, errors mapped by chainrun, the bytes fed to
  the same parser): the adopted aiohttp path;
* ``chainrun_aiohttp``: the same provider code on the ``openai`` client's aiohttp
  transport (``http_client=openai.DefaultAioHttpClient(...)``, its connection limit set
  as chainrun's): what chainrun would cost if it used that transport;
* ``sdk_httpx2``: the ``openai`` client's default ``httpx2`` client (one pool, anyio),
  the same request path;
* ``sdk_aiohttp``: the ``openai`` client on aiohttp (``openai.DefaultAioHttpClient``),
  when the installed SDK supports it (``pip install 'openai[aiohttp]'``); otherwise
  reported as unavailable with the reason;
* ``raw_asyncio``: a minimal HTTP/1.1 client on ``asyncio.open_connection`` (keep-alive
  connections, a request written by hand, status line, headers and a chunked body read
  with ``StreamReader``): no library, no checks, the floor of what reading these bytes
  costs in Python.

CPU is the client process's CPU time (``time.process_time``: every thread; the lab
runs in its own process and is not counted) over the calls of an arm, per call, in ms.
The arms run interleaved for ``--rounds`` rounds (machine load moves over a run); the
table gives each arm's median over the rounds, the spread, and the ratio to the floor.

Run: ``python benchmarks/transport_cpu.py [--calls 2000] [--concurrency 100] [--rounds 3]
[--json]``.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import statistics
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

import _common as c
import httpx2
import openai

from chainrun.lab import LabServer
from chainrun.providers.base import ChatRequest
from chainrun.providers.chat_sse import DONE, ChatSSEParser
from chainrun.providers.openai_compat import OpenAICompatProvider

ARMS = (
    "chainrun", "chainrun_transport_aiohttp", "chainrun_aiohttp", "sdk_httpx2", "sdk_aiohttp",
    "raw_asyncio",
)  # fmt: skip
N_TOKENS = 16
MODEL = "chainrun-lab"
#: generous: on a loaded shared machine a connect can take seconds; CPU is what is measured
CONNECT_TIMEOUT_S = 60.0
TIMEOUT = httpx2.Timeout(120.0, connect=CONNECT_TIMEOUT_S)


def request_body(i: int) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"Is the linen shirt true to size? ({i})"}],
        "max_completion_tokens": N_TOKENS,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def parse(parser: ChatSSEParser, part: bytes) -> tuple[int, bool]:
    """Feed one read to the parser: (chunks, whether ``[DONE]`` was seen)."""
    n = 0
    for item in parser.feed(part, len(part)):
        if item is DONE:
            return n, True
        n += 1
    return n, False


# ------------------------------------------------------------------ the floor


class RawHTTP:
    """A minimal HTTP/1.1 client: keep-alive connections to one host, a POST with a JSON
    body, the response read by ``Content-Length`` or chunked transfer coding (RFC 9112
    section 7.1). No redirects, no TLS, no proxy, no timeouts: a floor, not a client."""

    def __init__(self, base_url: str) -> None:
        url = urlsplit(base_url)
        self.host, self.port = url.hostname or "127.0.0.1", url.port or 80
        self.prefix = url.path.rstrip("/")
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def post_stream(self, path: str, body: bytes) -> AsyncIterator[bytes]:
        conn = self.idle.pop() if self.idle else await asyncio.open_connection(self.host, self.port)
        reader, writer = conn
        writer.write(
            f"POST {self.prefix}{path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            f"Content-Type: application/json\r\nAuthorization: Bearer x\r\n"
            f"Content-Length: {len(body)}\r\n\r\n".encode() + body
        )
        status = await reader.readline()
        if b" 200 " not in status:
            raise RuntimeError(f"raw client: {status!r}")
        length, chunked, keep = None, False, True
        while (line := await reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.partition(b":")
            key = name.strip().lower()
            if key == b"content-length":
                length = int(value)
            elif key == b"transfer-encoding" and b"chunked" in value.lower():
                chunked = True
            elif key == b"connection" and b"close" in value.lower():
                keep = False
        if chunked:
            while True:
                size = int((await reader.readline()).split(b";")[0], 16)
                if size == 0:
                    while await reader.readline() not in (b"\r\n", b""):
                        pass  # trailers
                    break
                data = await reader.readexactly(size + 2)
                yield data[:-2]
        elif length is not None:
            yield await reader.readexactly(length)
        else:
            yield await reader.read()
            keep = False
        if keep:
            self.idle.append(conn)
        else:
            writer.close()

    async def aclose(self) -> None:
        for _, writer in self.idle:
            writer.close()
        self.idle.clear()


# ------------------------------------------------------------------ the arms

Call = Callable[[int], Awaitable[int]]


async def make_arm(
    arm: str, lab: LabServer, concurrency: int
) -> tuple[Call, Callable[[], Awaitable[None]]]:
    """(one call -> chunks parsed, close) for ``arm``; raises RuntimeError if unavailable."""
    if arm in ("chainrun", "chainrun_transport_aiohttp", "chainrun_aiohttp"):
        pool = max(100, concurrency * 2)
        http = None
        if arm == "chainrun_aiohttp":
            http = _aiohttp_client(pool)
        transport = "aiohttp" if arm == "chainrun_transport_aiohttp" else "httpx"
        if transport == "aiohttp" and importlib.util.find_spec("aiohttp") is None:
            raise RuntimeError("aiohttp is not installed")
        provider = OpenAICompatProvider(
            "lab", lab.base_url, None, pool, CONNECT_TIMEOUT_S, http_client=http,
            transport=transport,
        )  # fmt: skip

        async def chainrun_call(i: int) -> int:
            body = request_body(i)
            req = ChatRequest(model=MODEL, messages=body["messages"], max_output_tokens=N_TOKENS)
            n = 0
            async for _ in provider.chunks(req):
                n += 1
            return n

        async def close_provider() -> None:
            await provider.aclose()
            if http is not None:
                await http.aclose()

        return chainrun_call, close_provider
    if arm in ("sdk_httpx2", "sdk_aiohttp"):
        if arm == "sdk_aiohttp":
            http = _aiohttp_client(max(100, concurrency * 2))
        else:
            http = openai.DefaultAsyncHttpxClient(timeout=TIMEOUT)
        client = openai.AsyncOpenAI(
            base_url=lab.base_url, api_key="x", max_retries=0, http_client=http
        )

        async def sdk_call(i: int) -> int:
            stream = await client.post(
                "/chat/completions", body=request_body(i), cast_to=object, stream=True,
                stream_cls=openai.AsyncStream[object],
            )  # fmt: skip
            parser, n = ChatSSEParser("lab"), 0
            try:
                async for part in stream.response.aiter_bytes():
                    k, done = parse(parser, part)
                    n += k
                    if done:
                        break
            finally:
                await stream.response.aclose()
            return n

        return sdk_call, client.close
    raw = RawHTTP(lab.base_url)

    async def raw_call(i: int) -> int:
        parser, n = ChatSSEParser("lab"), 0
        body = json.dumps(request_body(i)).encode()
        async for part in raw.post_stream("/chat/completions", body):
            k, _ = parse(parser, part)
            n += k
        return n

    return raw_call, raw.aclose


def _aiohttp_client(max_connections: int) -> Any:
    """The SDK's aiohttp-backed client with ``max_connections``; RuntimeError (with the
    reason) when the installed SDK or its ``aiohttp`` extra is missing."""
    factory = getattr(openai, "DefaultAioHttpClient", None)
    if factory is None:
        raise RuntimeError(f"openai {openai.__version__} has no DefaultAioHttpClient")
    limits = httpx2.Limits(max_connections=max_connections, keepalive_expiry=2.0)
    try:
        return factory(limits=limits, timeout=TIMEOUT)
    except (ImportError, RuntimeError) as e:
        raise RuntimeError(f"openai {openai.__version__}: {e}") from e


async def run_arm(call: Call, calls: int, concurrency: int) -> dict[str, Any]:
    """``calls`` calls, ``concurrency`` in flight: CPU and wall time per call (ms)."""
    index = iter(range(calls))
    chunks = 0

    async def worker() -> None:
        nonlocal chunks
        for i in index:
            n = await call(i)  # not `chunks += await ...`: that reads chunks before the await
            chunks += n

    for i in range(min(concurrency, 20)):  # warm the connections and code paths
        await call(i)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    return {
        "calls": calls,
        "chunks_per_call": round(chunks / calls, 2),
        "cpu_ms_per_call": round(cpu * 1000 / calls, 4),
        "wall_ms_per_call": round(wall * 1000 / calls, 4),
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    doc = c.new_document(
        "transport_cpu", sys.argv[1:] if args.argv is None else args.argv,
        {"calls": args.calls, "concurrency": args.concurrency, "rounds": args.rounds,
         "scenario": "fast", "n_tokens": N_TOKENS, "arms": args.arms,
         "openai": openai.__version__},
    )  # fmt: skip
    rounds: dict[str, list[dict[str, Any]]] = {a: [] for a in args.arms}
    unavailable: dict[str, str] = {}
    with LabServer("fast") as lab:
        lab_cpu0 = lab.cpu_s()
        for _ in range(args.rounds):
            for arm in args.arms:
                if arm in unavailable:
                    continue
                try:
                    call, close = await make_arm(arm, lab, args.concurrency)
                except RuntimeError as e:
                    unavailable[arm] = str(e)
                    continue
                try:
                    rounds[arm].append(await run_arm(call, args.calls, args.concurrency))
                finally:
                    await close()
                lab.reset()
        lab_cpu1 = lab.cpu_s()
        lab_cpu = None if lab_cpu0 is None or lab_cpu1 is None else round(lab_cpu1 - lab_cpu0, 2)
    arms: dict[str, Any] = {}
    for arm, rs in rounds.items():
        if not rs:
            continue
        cpu = [r["cpu_ms_per_call"] for r in rs]
        arms[arm] = {
            "cpu_ms_per_call": round(statistics.median(cpu), 4),
            "cpu_ms_per_call_rounds": cpu,
            "wall_ms_per_call": round(statistics.median(r["wall_ms_per_call"] for r in rs), 4),
            "chunks_per_call": rs[0]["chunks_per_call"],
        }
    floor = arms.get("raw_asyncio", {}).get("cpu_ms_per_call")
    for m in arms.values():
        m["over_floor"] = round(m["cpu_ms_per_call"] / floor, 3) if floor else None
    doc["results"] = {"arms": arms, "unavailable": unavailable, "lab_cpu_s": lab_cpu}
    return doc


def summary(doc: dict[str, Any]) -> str:
    res, par = doc["results"], doc["parameters"]
    lines = [
        f"CPU per streamed call ({par['calls']} calls x {par['rounds']} rounds per arm, "
        f"{par['concurrency']} in flight, {N_TOKENS} tokens, openai {par['openai']})",
        f"{'arm':<26} {'CPU ms/call':>11} {'rounds':>26} {'x floor':>8} {'wall ms/call':>12}",
    ]
    for arm, m in res["arms"].items():
        rounds = ", ".join(f"{x:.3f}" for x in m["cpu_ms_per_call_rounds"])
        lines.append(
            f"{arm:<26} {m['cpu_ms_per_call']:>11.3f} {rounds:>26} "
            f"{c.fmt(m['over_floor']):>8} {m['wall_ms_per_call']:>12.3f}"
        )
    for arm, why in res["unavailable"].items():
        lines.append(f"{arm:<26} unavailable: {why}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=2000, help="calls per arm and round")
    parser.add_argument("--concurrency", type=int, default=100, help="calls in flight")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    parser.add_argument("--arms", default=",".join(ARMS), help=f"subset of {', '.join(ARMS)}")
    c.add_common_options(parser)
    args = parser.parse_args(argv)
    args.argv = argv
    args.arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    if not args.arms or any(a not in ARMS for a in args.arms):
        parser.error(f"--arms: a comma-separated subset of {', '.join(ARMS)}")
    if args.calls < 1 or args.concurrency < 1 or args.rounds < 1:
        parser.error("--calls, --concurrency and --rounds must be >= 1")
    doc = asyncio.run(run(args))
    c.finish(doc, as_json=args.json, summary=summary, out=args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

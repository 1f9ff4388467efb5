"""What the embedded model (Gemma 3 270M, pre-trained) does when a request offers tools.

Sends the shop's questions with the example's two tools (``order_status``,
``add_to_cart``) to the local llama-server through chainrun's Chat Completions adapter
and counts, per question: the answer called a tool at all, called the tool the question
needs, and gave arguments that follow the tool's schema (jsonschema, Draft 2020-12).
Each rate with n and a 95% Wilson interval. Writes benchmarks/results/tools_local_model.json.

    python benchmarks/tools_local_model.py [--repeats 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from _common import add_common_options, finish, new_document, wilson

from chainrun.answer_json import schema_errors
from chainrun.providers.base import ChatRequest, ChatStream
from chainrun.providers.openai_compat import OpenAICompatProvider
from chainrun.runtime import local_model

TOOLS = [
    {"name": "order_status", "description": "Look an order up by its number",
     "parameters": {"type": "object", "required": ["order_id"],
                    "properties": {"order_id": {"type": "integer"}}}},
    {"name": "add_to_cart", "description": "Add a product to the shopper's cart",
     "parameters": {"type": "object", "required": ["sku", "qty"],
                    "properties": {"sku": {"type": "string"},
                                   "qty": {"type": "integer", "minimum": 1}}}},
]  # fmt: skip
QUESTIONS = [
    ("Where is my order 1042?", "order_status"),
    ("Has order 1043 shipped yet?", "order_status"),
    ("What is the status of my order number 1044?", "order_status"),
    ("Can you track order 1045 for me?", "order_status"),
    ("Please add 2 of JKT-12 to my cart.", "add_to_cart"),
    ("Put one DRS-7 in my cart.", "add_to_cart"),
    ("Add 3 TSH-1 shirts to the cart please.", "add_to_cart"),
    ("I'd like to buy 1 SHO-4, add it to my cart.", "add_to_cart"),
]
SYSTEM = "You are a shop assistant. Use the tools to look orders up and to fill the cart."


async def ask(provider: OpenAICompatProvider, question: str) -> dict[str, Any]:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    request = ChatRequest(model="gemma-3-270m", tools=TOOLS, max_output_tokens=96,
                          temperature=0.0, messages=messages)  # fmt: skip
    stream = ChatStream(provider, request)
    try:
        await stream.collect()
        error = None
    except Exception as e:  # a refusal of the tools by the server is a finding, not a crash
        error = f"{type(e).__name__}: {e}"
    finally:
        await stream.aclose()
    calls = stream.timer.tool_calls
    return {"question": question, "error": error, "text": stream.timer.text[:200],
            "finish_reason": stream.timer.finish_reason,
            "tool_calls": [{"name": c.name, "arguments": c.arguments} for c in calls]}  # fmt: skip


def judge(answer: dict[str, Any], wanted: str) -> dict[str, bool]:
    calls = answer["tool_calls"]
    right = [c for c in calls if c["name"] == wanted]
    valid = False
    for c in right:
        try:
            args = json.loads(c["arguments"] or "{}")
        except ValueError:
            continue
        schema = next(t["parameters"] for t in TOOLS if t["name"] == wanted)
        valid = valid or (isinstance(args, dict) and not schema_errors(args, schema))
    return {"called": bool(calls), "right_tool": bool(right), "valid_arguments": valid}


async def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=2, help="times each question is asked")
    add_common_options(parser)
    args = parser.parse_args(argv)
    doc = new_document("tools_local_model", argv, {"repeats": args.repeats,
                                                   "questions": len(QUESTIONS)})  # fmt: skip
    server = await asyncio.to_thread(local_model.up, quiet=True)
    provider = OpenAICompatProvider("local", server.base_url)
    answers = []
    try:
        for _ in range(args.repeats):
            for question, wanted in QUESTIONS:
                answer = await ask(provider, question)
                answer.update(judge(answer, wanted))
                answers.append(answer)
    finally:
        await provider.aclose()
    n = len(answers)
    results: dict[str, Any] = {"n": n, "errors": sum(1 for a in answers if a["error"])}
    for key in ("called", "right_tool", "valid_arguments"):
        k = sum(1 for a in answers if a[key])
        results[key] = {"k": k, "rate": round(k / n, 3), "ci95": wilson(k, n)}
    results["answers"] = answers
    doc["results"] = results

    def summary(d: dict[str, Any]) -> str:
        r = d["results"]
        lines = [f"n = {r['n']} requests offering 2 tools ({r['errors']} refused by the server)"]
        for key in ("called", "right_tool", "valid_arguments"):
            lines.append(f"  {key}: {r[key]['k']}/{r['n']} = {r[key]['rate']:.0%} "
                         f"(95% CI {r[key]['ci95']})")  # fmt: skip
        return "\n".join(lines)

    finish(doc, as_json=args.json, summary=summary, out=args.out)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    asyncio.run(main(sys.argv[1:]))

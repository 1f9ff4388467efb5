"""The lab's tool-call planning (pure): which tool, which arguments, which round."""

from __future__ import annotations

import json

from chainrun.lab.tool_calls import (
    ToolCallsConfig,
    conversation_round,
    plan_tool_answer,
    split_fragments,
    tool_results_text,
)

ORDER_TOOL = {"type": "function", "function": {
    "name": "order_status", "description": "d",
    "parameters": {"type": "object", "properties": {"order_id": {"type": "integer"}},
                   "required": ["order_id"]}}}  # fmt: skip
CART_TOOL = {"type": "function", "name": "add_to_cart", "description": "d",  # Responses shape
             "parameters": {"type": "object", "required": ["sku", "qty"],
                            "properties": {"sku": {"type": "string"},
                                           "qty": {"type": "integer"}}}}  # fmt: skip


def test_round_one_calls_the_first_tool_with_arguments_from_the_message() -> None:
    msgs = [{"role": "system", "content": "s"},
            {"role": "user", "content": "Where is my order 1042?"}]
    call = plan_tool_answer([ORDER_TOOL], msgs, ToolCallsConfig())
    assert call is not None and call.name == "order_status" and call.round == 1
    assert json.loads(call.arguments) == {"order_id": 1042} and not call.malformed
    assert plan_tool_answer([ORDER_TOOL], msgs, None) is None  # not configured: text
    assert plan_tool_answer([], msgs, ToolCallsConfig()) is None  # no tools offered


def test_a_string_takes_a_word_with_digits_and_an_integer_the_next_number() -> None:
    msgs = [{"role": "user", "content": "put 2 of JKT-12 in my cart"}]
    call = plan_tool_answer([CART_TOOL], msgs, ToolCallsConfig())
    assert call is not None and json.loads(call.arguments) == {"sku": "JKT-12", "qty": 2}


def test_rounds_count_tool_call_turns_since_the_last_user_message() -> None:
    first = [{"role": "user", "content": "order 7"}]
    call = plan_tool_answer([ORDER_TOOL], first, ToolCallsConfig(rounds=2, malformed_rounds=[1]))
    assert call is not None and call.malformed
    assert json.loads(call.arguments) == {"order_id": "two"}  # breaks the integer type
    second = [*first,
              {"role": "assistant", "content": None, "tool_calls": [
                  {"id": call.call_id, "type": "function",
                   "function": {"name": "order_status", "arguments": call.arguments}}]},
              {"role": "tool", "tool_call_id": call.call_id,
               "content": '{"error": "bad"}'}]  # fmt: skip
    again = plan_tool_answer([ORDER_TOOL], second,
                             ToolCallsConfig(rounds=2, malformed_rounds=[1]))
    assert again is not None and again.round == 2 and not again.malformed
    assert again.call_id != call.call_id
    assert conversation_round(second) == (2, "order 7")
    third = [*second,
             {"role": "assistant", "content": None, "tool_calls": [
                 {"id": again.call_id, "type": "function",
                  "function": {"name": "order_status", "arguments": again.arguments}}]},
             {"role": "tool", "tool_call_id": again.call_id,
              "content": '{"status": "shipped"}'}]  # fmt: skip
    assert plan_tool_answer([ORDER_TOOL], third, ToolCallsConfig(rounds=2)) is None
    assert tool_results_text(third) == 'order_status: {"status": "shipped"}'


def test_responses_items_count_as_rounds_too() -> None:
    items = [{"role": "user", "content": "2 of JKT-12"},
             {"type": "function_call", "call_id": "c1", "name": "add_to_cart",
              "arguments": "{}"},
             {"type": "function_call_output", "call_id": "c1",
              "output": '{"ok": true}'}]  # fmt: skip
    assert conversation_round(items)[0] == 2
    assert tool_results_text(items) == 'add_to_cart: {"ok": true}'


def test_fragments_concatenate_back() -> None:
    text = '{"order_id": 1042}'
    parts = split_fragments(text, 3)
    assert len(parts) == 3 and "".join(parts) == text
    assert split_fragments("{}", 5) == ["{", "}"]

// openai-node against `chainrun serve`: one case per run, its observations as one JSON
// line on stdout (tests/test_compatibility.py asserts on them and on the server's log).
// usage: node openai_node.mjs BASE_URL chat|responses whole|stream|error|cancel|two-turns
import OpenAI from "openai";

const [base, api, what] = process.argv.slice(2);
// the paths the client asked for (which API it used), reported with the observations
const paths = [];
const recording = (url, init) => { paths.push(new URL(String(url)).pathname); return fetch(url, init); };
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: "x", maxRetries: 0, fetch: recording });
const model = "chainrun-shop";
const messages = [{ role: "user", content: "a rain jacket?" }];

// usage as { input, output, total } whichever API's names the client gives it
function counts(u) {
  if (!u) return null;
  return { input: u.prompt_tokens ?? u.input_tokens ?? null,
           output: u.completion_tokens ?? u.output_tokens ?? null,
           total: u.total_tokens ?? null };
}

function failure(e) {
  // openai-node's APIError: the HTTP status and the error object's fields
  return { status: e.status ?? null, code: e.code ?? null, type: e.type ?? null,
           requestId: e.requestID ?? null, name: e.constructor.name };
}

async function chat() {
  if (what === "whole") {
    const r = await client.chat.completions.create({ model, messages });
    return { text: r.choices[0].message.content, finish: r.choices[0].finish_reason,
             usage: counts(r.usage), requestId: r._request_id ?? null };
  }
  if (what === "stream") {
    const s = await client.chat.completions.create({
      model, messages, stream: true, stream_options: { include_usage: true } });
    let text = "", usage = null, finish = null;
    for await (const c of s) {
      if (c.choices.length) {
        text += c.choices[0].delta.content ?? "";
        finish = c.choices[0].finish_reason ?? finish;
      }
      if (c.usage) usage = c.usage;
    }
    return { text, finish, usage: counts(usage) };
  }
  if (what === "error") {
    try {
      await client.chat.completions.create({ model: "gpt-4o", messages });
    } catch (e) {
      return failure(e);
    }
    return { status: 200 };
  }
  if (what === "cancel") {
    const s = await client.chat.completions.create({ model, messages, stream: true });
    let text = "";
    for await (const c of s) {
      text += c.choices[0]?.delta.content ?? "";
      if (text) { s.controller.abort(); break; }
    }
    return { text };
  }
  if (what === "two-turns") {
    const first = await client.chat.completions.create({ model, messages });
    const thread = [...messages, { role: "assistant", content: first.choices[0].message.content },
                    { role: "user", content: "in blue?" }];
    const second = await client.chat.completions.create({ model, messages: thread });
    return { texts: [first.choices[0].message.content, second.choices[0].message.content],
             usage: counts(second.usage) };
  }
}

async function responses() {
  if (what === "whole") {
    const r = await client.responses.create({ model, input: "a rain jacket?" });
    return { text: r.output_text, status: r.status, usage: counts(r.usage),
             requestId: r._request_id ?? null };
  }
  if (what === "stream") {
    const s = await client.responses.create({ model, input: "a rain jacket?", stream: true });
    let text = "", last = null, usage = null, done = null;
    for await (const e of s) {
      if (e.type === "response.output_text.delta") text += e.delta;
      if (e.type === "response.completed") {
        usage = e.response.usage;
        done = e.response.output.flatMap((o) => o.content ?? [])
          .filter((c) => c.type === "output_text").map((c) => c.text).join("");
      }
      last = e.type;
    }
    return { text, last, usage: counts(usage), done };
  }
  if (what === "error") {
    try {
      await client.responses.create({ model, input: "x", previous_response_id: "resp_x" });
    } catch (e) {
      return failure(e);
    }
    return { status: 200 };
  }
  if (what === "cancel") {
    const s = await client.responses.create({ model, input: "a rain jacket?", stream: true });
    let text = "";
    for await (const e of s) {
      if (e.type === "response.output_text.delta") text += e.delta;
      if (text) { s.controller.abort(); break; }
    }
    return { text };
  }
  if (what === "two-turns") {
    const first = await client.responses.create({ model, input: "a rain jacket?" });
    const second = await client.responses.create({
      model, input: "in blue?", previous_response_id: first.id });
    return { texts: [first.output_text, second.output_text], usage: counts(second.usage) };
  }
}

const out = await (api === "chat" ? chat() : responses());
if (out === undefined) throw new Error(`no case ${api} ${what}`);
console.log(JSON.stringify({ ...out, paths }));

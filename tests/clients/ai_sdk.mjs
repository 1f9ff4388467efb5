// The Vercel AI SDK against `chainrun serve`: one case per run, its observations as one
// JSON line on stdout (tests/test_compatibility.py asserts on them and on the server's log).
// usage: node ai_sdk.mjs BASE_URL compatible|openai whole|stream|error|cancel|two-turns
//   compatible: @ai-sdk/openai-compatible (Chat Completions)
//   openai:     @ai-sdk/openai's default openai(model) (the Responses API)
import { createOpenAI } from "@ai-sdk/openai";
import { createOpenAICompatible } from "@ai-sdk/openai-compatible";
import { generateText, streamText } from "ai";

const [base, provider, what] = process.argv.slice(2);
// the paths the client asked for (which API it used), reported with the observations
const paths = [];
const recording = (url, init) => { paths.push(new URL(String(url)).pathname); return fetch(url, init); };
const make = provider === "compatible"
  ? createOpenAICompatible({ name: "chainrun", baseURL: `${base}/v1`, apiKey: "x",
                             includeUsage: true, fetch: recording })
  : createOpenAI({ baseURL: `${base}/v1`, apiKey: "x", fetch: recording });
const model = (id) => make(id);
const MODEL = "chainrun-shop";
const prompt = "a rain jacket?";

function usageOf(u) {
  // usage as { input, output, total }, as openai_node.mjs reports it
  return { input: u.inputTokens ?? null, output: u.outputTokens ?? null,
           total: u.totalTokens ?? null };
}

async function run() {
  if (what === "whole") {
    const r = await generateText({ model: model(MODEL), prompt, maxRetries: 0 });
    return { text: r.text, finish: r.finishReason, usage: usageOf(r.usage) };
  }
  if (what === "stream") {
    let error = null;
    const r = streamText({ model: model(MODEL), prompt, maxRetries: 0,
                           onError: ({ error: e }) => { error = String(e); } });
    let text = "";
    for await (const t of r.textStream) text += t;
    return { text, finish: await r.finishReason, usage: usageOf(await r.usage), error };
  }
  if (what === "error") {
    try {
      await generateText({ model: model("gpt-4o"), prompt, maxRetries: 0 });
    } catch (e) {
      return { status: e.statusCode ?? null, name: e.name, body: e.responseBody ?? null };
    }
    return { status: 200 };
  }
  if (what === "cancel") {
    const stop = new AbortController();
    const r = streamText({ model: model(MODEL), prompt, maxRetries: 0,
                           abortSignal: stop.signal, onError: () => {} });
    let text = "";
    try {
      for await (const t of r.textStream) {
        text += t;
        if (text) { stop.abort(); break; }
      }
    } catch (e) {
      if (e.name !== "AbortError") throw e;
    }
    return { text };
  }
  if (what === "two-turns") {
    const messages = [{ role: "user", content: prompt }];
    const first = await generateText({ model: model(MODEL), messages, maxRetries: 0 });
    messages.push({ role: "assistant", content: first.text },
                  { role: "user", content: "in blue?" });
    const second = await generateText({ model: model(MODEL), messages, maxRetries: 0 });
    return { texts: [first.text, second.text], usage: usageOf(second.usage) };
  }
  throw new Error(`no case ${what}`);
}

console.log(JSON.stringify({ ...(await run()), paths }));

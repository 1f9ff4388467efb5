// The chat page of `chainrun serve`: POST /chat, read its Server-Sent Events, stream the
// answer and draw a live waterfall of the turn's steps. No framework, no build step.
// Every string from the user or a model goes in through textContent, never as HTML.
// The page keeps one conversation (its id and thread, in sessionStorage so a reload
// keeps them) until "New conversation": every question is sent with its id, and the
// server reads the earlier turns from its own record of that conversation.
"use strict";

const $ = (id) => document.getElementById(id);
const saved = JSON.parse(sessionStorage.getItem("chainrun-conversation") || "null");
const state = { conversationId: saved ? saved.id : null, thread: saved ? saved.thread : [],
                token: sessionStorage.getItem("chainrun-token"), controller: null,
                finishing: null, turn: null };

function saveConversation() {
  sessionStorage.setItem("chainrun-conversation",
                         JSON.stringify({ id: state.conversationId, thread: state.thread }));
  $("conversation").textContent = state.conversationId
    ? "conversation " + state.conversationId.slice(0, 8) + " · " +
      state.thread.filter((m) => m.role === "user").length + " turns"
    : "new conversation";
}

function el(tag, cls, text) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined && text !== null) node.textContent = String(text);
  return node;
}

function ms(value) {
  if (value === null || value === undefined) return "–";
  return value >= 1000 ? (value / 1000).toFixed(2) + " s" : Math.round(value) + " ms";
}

function headers() {
  // the operator's events (the waterfall's): taken with the bearer token or serve --step-events
  const h = { "Content-Type": "application/json", "Accept": "text/event-stream",
              "Chainrun-Events": "steps" };
  if (state.token) h["Authorization"] = "Bearer " + state.token;
  return h;
}

async function checkReady() {
  const badge = $("ready");
  try {
    const r = await fetch("/readyz", { cache: "no-store" });
    const body = await r.json();
    badge.dataset.state = r.ok ? "ready" : "starting";
    badge.textContent = r.ok ? "ready" : "starting: " + (body.detail || "");
    if (!r.ok) setTimeout(checkReady, 1000);
  } catch (e) {
    badge.dataset.state = "down";
    badge.textContent = "server unreachable";
    setTimeout(checkReady, 2000);
  }
}

// ---- Server-Sent Events over fetch (EventSource cannot POST) ------------------------
async function* sseEvents(response, signal) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer = (buffer + decoder.decode(value, { stream: true })).replace(/\r\n/g, "\n");
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const block = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        let event = "message";
        const data = [];
        for (const line of block.split("\n")) {
          if (line.startsWith(":")) continue; // comment (keep-alive ping)
          const colon = line.indexOf(":");
          const field = colon < 0 ? line : line.slice(0, colon);
          let v = colon < 0 ? "" : line.slice(colon + 1);
          if (v.startsWith(" ")) v = v.slice(1);
          if (field === "event") event = v;
          else if (field === "data") data.push(v);
        }
        if (data.length) yield { event, data: JSON.parse(data.join("\n")) };
      }
    }
  } finally {
    if (signal.aborted) reader.cancel().catch(() => {});
  }
}

// ---- the waterfall --------------------------------------------------------------------
class Waterfall {
  constructor(steps, answerStep) {
    this.t0 = performance.now();
    this.steps = new Map();
    this.answerStep = answerStep;
    this.scale = 1000; // ms across the track; grows with the turn
    this.done = false;
    $("rows").replaceChildren();
    $("turn-facts").replaceChildren();
    $("turn-status").textContent = "running";
    for (const name of steps) this.row(name);
    this.tick = this.tick.bind(this);
    requestAnimationFrame(this.tick);
  }

  row(name) {
    if (this.steps.has(name)) return this.steps.get(name);
    const row = el("div", "wf-row");
    row.dataset.step = name;
    row.dataset.status = "pending";
    const track = el("div", "wf-track");
    const bar = el("div", "wf-bar");
    bar.hidden = true;
    track.append(bar);
    const facts = el("div", "wf-facts");
    row.append(el("div", "wf-name", name), track, facts);
    $("rows").append(row);
    const s = { row, track, bar, facts, start: null, duration: null, ttft: null, attempts: [],
                tools: new Map() };
    this.steps.set(name, s);
    return s;
  }

  now() { return performance.now() - this.t0; }

  started(d) {
    const s = this.row(d.step);
    s.row.dataset.status = "running";
    s.row.dataset.kind = d.kind;
    s.start = d.started_ms;
    s.bar.hidden = false;
    s.facts.textContent = "running…";
  }

  finished(d) {
    const s = this.row(d.step);
    Object.assign(s, { start: d.started_ms ?? s.start, duration: d.duration_ms, ttft: d.ttft_ms });
    s.row.dataset.status = d.status;
    s.row.dataset.kind = d.kind;
    s.bar.hidden = s.start === null || s.start === undefined;
    s.bar.title = d.output ? String(d.output).slice(0, 300) : "";
    this.facts(s, d);
  }

  facts(s, d) {
    s.facts.replaceChildren();
    const parts = [ms(d.duration_ms)];
    if (d.ttft_ms !== null && d.ttft_ms !== undefined) parts.push("TTFT " + ms(d.ttft_ms));
    if (d.output_tokens !== null && d.output_tokens !== undefined) parts.push(d.output_tokens + " tok");
    if (d.status !== "ok") parts.push(d.status + (d.error_type ? " (" + d.error_type + ")" : ""));
    if (d.post_answer) parts.push("after the answer");
    s.facts.append(el("div", null, parts.join(" · ")));
    if (s.tools.size && !d.hedge_fired) {  // one model call per tool round, no copies
      if (d.n_attempts > 1) s.facts.append(el("div", null, d.n_attempts + " model calls (tool rounds)"));
    } else if (d.n_attempts > 1 || d.hedge_fired) {
      const won = (d.attempts || []).find((a) => a.outcome === "primary" || a.outcome === "duplicate");
      let text = "hedge fired, " + d.n_attempts + " attempts";
      if (won) text += ", #" + won.attempt + " won";
      else if (d.hedge_won) text += ", a copy won";
      s.facts.append(el("div", "hedge", text));
    }
    for (const t of s.tools.values()) s.facts.append(t.line);  // kept across updates
  }

  // a tool call of a step: a bar under the step's bar, from its start for its duration
  // (still growing while it runs); a call that never ran is a thin mark at the step's end
  tool(d) {
    const s = this.row(d.step);
    let t = s.tools.get(d.call_id);
    if (!t) {
      const bar = el("div", "wf-tool");
      bar.dataset.tool = d.tool;
      bar.dataset.callId = d.call_id;
      bar.style.top = 20 + (s.attempts.length + s.tools.size) * 8 + "px";
      s.track.append(bar);
      t = { bar, start: null, duration: null };
      s.tools.set(d.call_id, t);
      s.track.style.minHeight = 22 + (s.attempts.length + s.tools.size) * 8 + "px";
      const line = el("div", "tool-call");
      line.dataset.callId = d.call_id;
      s.facts.append(line);
      t.line = line;
    }
    t.bar.dataset.status = d.status || "running";
    t.bar.dataset.sideEffects = String(!!d.side_effects);
    if (d.started_ms !== null && d.started_ms !== undefined) t.start = d.started_ms;
    if (d.duration_ms !== null && d.duration_ms !== undefined) t.duration = d.duration_ms;
    t.done = d.phase === "finished";
    const parts = ["tool " + d.tool + " (round " + d.round + ")", d.status || "running"];
    if (t.duration !== null) parts.push(ms(t.duration));
    t.bar.title = parts.join(" · ");
    t.line.textContent = parts.join(" · ");
  }

  attempts(stepSummary) {
    const s = this.row(stepSummary.step);
    for (const a of s.attempts) a.remove();
    s.attempts = [];
    const sent = stepSummary.attempts.filter((a) => a.duration_ms !== null);
    if (sent.length < 2 && !stepSummary.hedge_fired) return;
    sent.forEach((a, i) => {
      const bar = el("div", "wf-attempt");
      bar.dataset.attempt = a.attempt;
      bar.dataset.outcome = a.outcome;
      bar.dataset.won = String(a.outcome === "primary" || a.outcome === "duplicate");
      bar.title = "attempt " + a.attempt + " (" + (a.target || "") + "): " + a.outcome;
      bar._start = (stepSummary.started_ms || 0) + (a.started_ms || 0);
      bar._duration = a.duration_ms;
      bar.style.top = 20 + i * 8 + "px";
      s.track.append(bar);
      s.attempts.push(bar);
    });
    s.track.style.minHeight = 22 + sent.length * 8 + "px";
  }

  summary(t) {
    this.done = true;
    this.total = t.duration_ms;
    $("turn-status").textContent = t.status + (t.turn_id ? " · turn " + t.turn_id : "") +
      (t.turn_index ? " · #" + t.turn_index + " of its conversation" : "");
    for (const step of t.steps) {
      const s = this.row(step.step);
      this.finished(step);
      this.attempts(step);
      for (const tc of step.tool_calls || []) {
        this.tool({ ...tc, step: step.step, phase: "finished",
                    started_ms: tc.started_ms === null ? null : (step.started_ms || 0) + tc.started_ms });
      }
      if (step.status === "skipped") s.bar.hidden = true;
    }
    const facts = $("turn-facts");
    const u = t.usage;
    const n = (v) => (v === null || v === undefined ? "?" : String(v));
    const rows = [
      ["turn", ms(t.duration_ms)],
      ["answer TTFT", ms(t.answer_ttft_ms)],
      ["answer done", ms(t.answer_done_ms)],
      // a count no call reported is null (unknown), shown as "?", never as 0
      ["tokens", n(u.input_tokens) + " in (" + n(u.cached_input_tokens) + " cached) · " +
                 n(u.output_tokens) + " out (" + n(u.reasoning_tokens) + " reasoning) over " +
                 u.calls + " calls" + (u.unknown_calls ? ", " + u.unknown_calls + " unknown" : "")],
      ["label", t.label ?? "–"],
    ];
    for (const [k, v] of rows) facts.append(el("dt", null, k), el("dd", null, v));
    this.draw();
  }

  tick() {
    this.draw();
    if (!this.done) requestAnimationFrame(this.tick);
  }

  draw() {
    const now = this.done ? this.total : this.now();
    let end = now;
    for (const s of this.steps.values()) {
      if (s.start !== null && s.duration !== null) end = Math.max(end, s.start + s.duration);
    }
    while (end > this.scale) this.scale *= 2;
    const pct = (v) => (100 * v) / this.scale + "%";
    for (const s of this.steps.values()) {
      if (s.start === null || s.start === undefined) continue;
      const width = s.duration ?? Math.max(0, now - s.start);
      s.bar.style.left = pct(s.start);
      s.bar.style.width = pct(width);
      let marker = s.track.querySelector(".wf-ttft");
      if (s.ttft !== null && s.ttft !== undefined) {
        if (!marker) { marker = el("div", "wf-ttft"); s.track.append(marker); }
        marker.style.left = pct(s.start + s.ttft);
        marker.title = "TTFT " + ms(s.ttft);
      }
      for (const a of s.attempts) {
        a.style.left = pct(a._start);
        a.style.width = pct(a._duration || 0);
      }
      for (const t of s.tools.values()) {
        const begin = t.start ?? (s.start + (s.duration ?? Math.max(0, now - s.start)));
        const width = t.duration ?? (t.done || t.start === null ? 0 : Math.max(0, now - t.start));
        t.bar.style.left = pct(begin);
        t.bar.style.width = "max(3px, " + pct(width) + ")";
      }
    }
    const axis = $("axis");
    axis.replaceChildren();
    for (let i = 0; i <= 4; i++) {
      const tick = el("span", null, ms((this.scale * i) / 4));
      tick.style.left = 25 * i + "%";
      axis.append(tick);
    }
  }
}

// ---- one turn ---------------------------------------------------------------------------
function addMessage(role, text) {
  const li = el("li", role, text);
  $("messages").append(li);
  li.scrollIntoView({ block: "end" });
  return li;
}

function restoreThread() {
  for (const m of state.thread) addMessage(m.role, m.text).dataset.status = m.status || "";
  saveConversation();
}

function newConversation() {
  if (state.controller) return;
  state.conversationId = null;
  state.thread = [];
  $("messages").replaceChildren();
  saveConversation();
}

// One turn of the thread, kept as the shopper saw it (at answer_done, or at the end).
function remember(message, answer) {
  state.thread.push({ role: "user", text: message },
                    { role: "assistant", text: answer.textContent, status: answer.dataset.status });
  saveConversation();
}

// The answer is the shopper's as soon as the server says "answer_done": Send is enabled
// again then, while the checks after the answer (validate, critique) finish on the server
// and this turn's waterfall keeps drawing them, until the next question replaces it.
function answerIsDone(answer, data) {
  answer.dataset.status = "answered";
  if (data.output !== null && data.output !== answer.textContent) answer.textContent = data.output;
  state.controller = null;
  $("send").disabled = false;
  $("stop").disabled = true;
}

// An action waiting for the shopper's yes (an `action` event): its question, chainrun's
// words from the recorded arguments, with Yes / No buttons. A click sends the decision
// as {"confirm": id} or {"deny": id} in the same conversation; typing yes or no works too.
function showAction(action) {
  const li = el("li", "action");
  li.dataset.actionId = action.id;
  li.dataset.tool = action.tool;
  li.append(el("p", "question", action.question));
  const yes = el("button", "yes", "Yes");
  const no = el("button", "no", "No");
  yes.type = no.type = "button";
  const decide = (key, label) => {
    if (state.controller) return;  // a turn is still answering: decide after it
    yes.disabled = no.disabled = true;
    li.dataset.decision = key === "confirm" ? "confirmed" : "denied";
    ask(label, { [key]: action.id });
  };
  yes.addEventListener("click", () => decide("confirm", "Yes"));
  no.addEventListener("click", () => decide("deny", "No"));
  li.append(yes, no);
  $("messages").append(li);
  li.scrollIntoView({ block: "end" });
}

function money(amount, currency) {
  try {
    return new Intl.NumberFormat(undefined, { style: "currency", currency }).format(amount);
  } catch (e) {
    return amount.toFixed(2) + " " + currency;
  }
}

// the answer's text without the lines that list the products drawn as cards: a product
// line is "- TITLE, ID: PRICE; ..." (chainrun.steps.facts.product_line)
function withoutProductLines(text, products) {
  const ids = products.map((p) => ", " + p.id + ": ");
  const kept = text.split("\n").filter((line) =>
    !(line.startsWith("- ") && ids.some((id) => line.includes(id))));
  return kept.join("\n").replace(/\n{3,}/g, "\n\n").trimEnd();
}

// the products an answer lists, as cards (the /chat "products" event: rows from the catalogue)
function showProducts(products) {
  const li = el("li", "products");
  for (const p of products) {
    const card = el("article", "card");
    card.dataset.productId = p.id;
    card.append(el("h3", "title", p.title), el("p", "price", money(p.price, p.currency)));
    if (p.colours && p.colours.length) card.append(el("p", "colours", p.colours.join(", ")));
    const sizes = Object.entries(p.sizes || {}).filter(([, n]) => n > 0).map(([s]) => s);
    const stock = Object.keys(p.sizes || {}).length
      ? (sizes.length ? "In stock: " + sizes.join(", ") : "Sold out")
      : (p.stock === 0 ? "Sold out" : "");
    if (stock) card.append(el("p", "stock", stock));
    card.append(el("p", "id", p.id));
    li.append(card);
  }
  $("messages").append(li);
  li.scrollIntoView({ block: "end" });
}

async function ask(message, decision) {
  if (state.finishing) state.finishing.abort();  // the previous turn's checks: leave them
  addMessage("user", message);
  const answer = addMessage("assistant", "");
  answer.id = "answer";
  for (const old of document.querySelectorAll("#messages li.assistant")) {
    if (old !== answer) old.removeAttribute("id");
  }
  answer.dataset.status = "running";
  $("grounding").hidden = true;
  const controller = new AbortController();
  state.controller = controller;
  $("send").disabled = true;
  $("stop").disabled = false;
  let wf = null;
  let answered = false;
  let products = null;
  const pending = [];
  for (const old of document.querySelectorAll("#messages li.action button")) old.disabled = true;
  try {
    const body = { message, ...(decision || {}) };
    if (state.conversationId) body.conversation_id = state.conversationId;
    const response = await fetch("/chat", { method: "POST", headers: headers(),
                                            body: JSON.stringify(body), signal: controller.signal });
    if (response.status === 401) {
      $("auth").hidden = false;
      answer.dataset.status = "error";
      answer.textContent = "This server needs a bearer token: enter it below and ask again.";
      return;
    }
    if (!response.ok) {
      const err = await response.json().catch(() => ({}));
      answer.dataset.status = "error";
      answer.textContent = "Error " + response.status + ": " +
                           ((err.error && err.error.message) || response.statusText);
      return;
    }
    for await (const { event, data } of sseEvents(response, controller.signal)) {
      if (event === "turn_started") {
        state.conversationId = data.conversation_id;
        saveConversation();
        wf = new Waterfall(data.steps, data.answer_step);
      } else if (event === "step" && wf) {
        if (data.phase === "started") wf.started(data); else wf.finished(data);
      } else if (event === "tool" && wf) {
        wf.tool(data);
      } else if (event === "token" && wf && data.step === wf.answerStep) {
        answer.textContent += data.text;
        answer.scrollIntoView({ block: "end" });
      } else if (event === "grounding") {
        // the grounding check of the answer: claims checked, the ungrounded ones and why
        answer.dataset.grounded = data.grounded ? "yes" : "no";
        const note = $("grounding");
        const done = (data.done || []).map((d) => d.action);
        note.textContent = "Grounding: " + data.claims + " claims checked" +
          (data.n_ungrounded ? ", " + data.n_ungrounded + " ungrounded (" +
           [...new Set(done)].join(", ") + "): " +
           data.ungrounded.map((u) => u.kind + " " + JSON.stringify(u.text) + ": " + u.why)
             .join("; ") : ", all grounded");
        note.hidden = false;
      } else if (event === "action") {
        pending.push(data);
      } else if (event === "products") {
        products = data.products;
      } else if (event === "answer_done") {
        answered = true;
        state.finishing = controller;
        answerIsDone(answer, data);
        remember(message, answer);
      } else if (event === "turn") {
        answer.dataset.status = data.status;
        if (data.output !== null && data.output !== answer.textContent) answer.textContent = data.output;
        answer.dataset.turnIndex = data.turn_index;
        if (wf) wf.summary(data);
      }
    }
  } catch (e) {
    if (answered) {
      // the next question was asked: this turn's checks finish on the server
    } else if (e.name === "AbortError") {
      answer.dataset.status = "cancelled";
      if (wf) { wf.done = true; wf.total = wf.now(); $("turn-status").textContent = "cancelled"; }
    } else {
      answer.dataset.status = "error";
      answer.textContent += " [" + e.message + "]";
    }
  } finally {
    if (!answered) remember(message, answer);
    if (products && products.length) {
      // the cards show the products: the text keeps the model's sentence and any policy
      answer.textContent = withoutProductLines(answer.textContent, products);
      showProducts(products);
    }
    for (const action of pending) showAction(action);
    if (state.finishing === controller) state.finishing = null;
    if (state.controller === controller) {
      state.controller = null;
      $("send").disabled = false;
      $("stop").disabled = true;
    }
  }
}

$("ask").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const input = $("message");
  const message = input.value.trim();
  if (!message || state.controller) return;
  input.value = "";
  ask(message);
});
$("stop").addEventListener("click", () => { if (state.controller) state.controller.abort(); });
$("new").addEventListener("click", newConversation);
restoreThread();
$("auth").addEventListener("submit", (ev) => {
  ev.preventDefault();
  state.token = $("token").value;
  sessionStorage.setItem("chainrun-token", state.token);
  $("auth").hidden = true;
});
checkReady();

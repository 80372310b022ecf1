// `weld serve` under faults: shutdown in the middle of streams, clients that stop reading,
// and the access log.
// usage: node serve_faults.mjs WELD_BIN STORIES260K_GGUF TMP_DIR [SANITIZE]
//
// The long generations run on a random model made here with `weld mkmodel` (2 layers,
// dim 64, 8,192-token context) and a byte-level tokenizer of 259 tokens written here, so
// that thousands of tokens take well under a second per stream.
//
// Shutdown (--shutdown-timeout 1, --max-num-seqs 1): four 8,000-token streams through the
// official openai client, one through a raw socket and one non-streaming request, then
// SIGTERM. After the grace second every stream must end well-formed (the client parses it
// to its end without an error; finish_reason "length", or "abort" for those cut short, at
// least one of them), the raw one byte for byte: a last chunk with finish_reason "abort",
// "data: [DONE]" and the chunked terminator; the non-streaming request gets a 503 OpenAI
// error object; the server exits 0.
//
// Stalled clients (--stream-buffer-size 16K --stream-stall-timeout 8): 20 raw sockets send
// a streaming request (with logprobs, so that chunks are large) and never read. Each
// request must be paused (num_requests_paused reaches 20, generation stops), and the
// memory the server holds for them, its RSS (VmRSS) plus its sockets' send queues (from
// /proc/net/tcp), must stay within 16 MiB of the baseline (without the cap each stream's
// output piles up, first in the kernel's send buffer, up to 4 MiB, then in the process),
// other requests are served meanwhile (one plain, one streamed), 10 clients that hang up
// get their requests aborted, the other 10 are aborted by the server after the stall
// timeout (one warning each, stream_stall_aborts_total 10) and their connections end; then
// nothing runs, no KV block is used and RSS is back within 16 MiB of the baseline. Under
// the sanitizers (SANITIZE=1) the RSS numbers are printed but not checked.
//
// Access log: one "request id=... method= path= status= prompt_tokens= completion_tokens=
// ttft_s= total_s= finish=" line per request on stderr by default, the prompt text only with
// --log-prompts, no line at all with --disable-log-requests.
import OpenAI from 'openai';
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import { join } from 'node:path';
import { counter, metrics, sleep, startServer, stopServer } from './serve_lib.mjs';

const [weld, stories, tmp, sanitizeArg] = process.argv.slice(2);
const sanitize = sanitizeArg === '1';
const t = counter();
mkdirSync(tmp, { recursive: true });
const MiB = 1024 * 1024;

// ---- a fast model with a long context ---------------------------------------------------
// GPT-2's byte-to-character map: token id b is byte b.
function byteTokenizer(dir) {
  const bs = [];
  for (let b = 33; b <= 126; b++) bs.push(b);
  for (let b = 161; b <= 172; b++) bs.push(b);
  for (let b = 174; b <= 255; b++) bs.push(b);
  const cs = bs.slice();
  for (let b = 0, n = 0; b < 256; b++) if (!bs.includes(b)) { bs.push(b); cs.push(256 + n++); }
  const vocab = {};
  bs.forEach((b, i) => { vocab[String.fromCodePoint(cs[i])] = b; });
  vocab['ĠĠ'] = 256;
  vocab['<s>'] = 257;
  vocab['</s>'] = 258;
  const special = (id, content) => ({ id, content, single_word: false, lstrip: false,
                                      rstrip: false, normalized: false, special: true });
  const split = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
  const tok = {
    version: '1.0', truncation: null, padding: null, normalizer: null, post_processor: null,
    added_tokens: [special(257, '<s>'), special(258, '</s>')],
    pre_tokenizer: { type: 'Sequence', pretokenizers: [
      { type: 'Split', pattern: { Regex: split }, behavior: 'Isolated', invert: false },
      { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: false }] },
    decoder: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
    model: { type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: null,
             end_of_word_suffix: null, fuse_unk: false, byte_fallback: false, vocab,
             merges: ['Ġ Ġ'] },
  };
  mkdirSync(dir, { recursive: true });
  writeFileSync(join(dir, 'tokenizer.json'), JSON.stringify(tok));
  writeFileSync(join(dir, 'tokenizer_config.json'),
                JSON.stringify({ bos_token: '<s>', eos_token: '</s>', add_bos_token: true }));
}

const model = join(tmp, 'bytes-ctx8192.gguf');
if (!existsSync(model)) {
  byteTokenizer(join(tmp, 'bytetok'));
  execFileSync(weld, ['mkmodel', '--dim', '64', '--layers', '2', '--heads', '4', '--kv-heads', '2',
                      '--ffn', '128', '--ctx', '8192', '--seed', '3', '--tokenizer',
                      join(tmp, 'bytetok'), '--out', model], { stdio: 'ignore' });
}

const rss = (pid) => Number(readFileSync(`/proc/${pid}/status`, 'utf8').match(/VmRSS:\s+(\d+)/)[1]) * 1024;
// Bytes waiting in the send queues of the server's sockets (local port `port`): what the
// kernel holds for clients that do not read, on top of the process's RSS.
function sendQueues(port) {
  let sum = 0;
  for (const line of readFileSync('/proc/net/tcp', 'utf8').split('\n').slice(1)) {
    const f = line.trim().split(/\s+/);
    if (f.length > 4 && parseInt(f[1].split(':')[1], 16) === port)
      sum += parseInt(f[4].split(':')[0], 16);
  }
  return sum;
}
const serverMem = (s) => rss(s.proc.pid) + sendQueues(s.port);

function httpRequest(path, body, extra = '') {
  return `POST ${path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n` +
         `Content-Length: ${Buffer.byteLength(body)}\r\n${extra}\r\n${body}`;
}

// A streaming request on a raw socket, read to the end: status, headers, the de-chunked body
// and whether the chunked terminator came.
function rawStream(port, body) {
  const sock = net.connect(port, '127.0.0.1');
  const parts = [];
  let headersSeen;
  const headers = new Promise((resolve) => { headersSeen = resolve; });
  sock.on('data', (d) => {
    parts.push(d);
    if (Buffer.concat(parts).includes('\r\n\r\n')) headersSeen();
  });
  sock.on('error', () => {});
  sock.write(httpRequest('/v1/completions', body, 'Connection: close\r\n'));
  const done = new Promise((resolve) => sock.on('close', () => {
    headersSeen();
    const raw = Buffer.concat(parts);
    const h = raw.indexOf('\r\n\r\n');
    const head = raw.subarray(0, h < 0 ? raw.length : h).toString();
    let rest = h < 0 ? Buffer.alloc(0) : raw.subarray(h + 4);
    const out = { status: Number(head.split(' ')[1]), chunked: /transfer-encoding: chunked/i.test(head),
                  body: '', terminated: false };
    while (rest.length) {
      const eol = rest.indexOf('\r\n');
      if (eol < 0) break;
      const size = parseInt(rest.subarray(0, eol).toString(), 16);
      if (size === 0) { out.terminated = rest.subarray(eol).toString() === '\r\n\r\n'; break; }
      if (rest.length < eol + 2 + size + 2) break;
      out.body += rest.subarray(eol + 2, eol + 2 + size).toString();
      rest = rest.subarray(eol + 2 + size + 2);
    }
    resolve(out);
  }));
  return { headers, done };
}

// ---- shutdown with streams running --------------------------------------------------------
async function shutdown() {
  const s = await startServer(weld, model, ['--shutdown-timeout', '1', '--max-num-seqs', '1',
                                            '--log-prompts']);
  const client = new OpenAI({ baseURL: s.base + '/v1', apiKey: 'x', maxRetries: 0 });
  const body = { model, prompt: 'tell a long story', max_tokens: 8000, ignore_eos: true };
  const streams = [];
  for (let i = 0; i < 4; i++)
    streams.push(await client.completions.create({ ...body, stream: true }));
  const raw = rawStream(s.port, JSON.stringify({ ...body, stream: true }));
  await raw.headers;
  const whole = fetch(s.base + '/v1/completions', { method: 'POST', body: JSON.stringify(body),
    headers: { 'Content-Type': 'application/json' } })
    .then(async (r) => ({ status: r.status, body: await r.text() }))
    .catch((e) => ({ status: 'error: ' + e.message }));
  // all six in the engine (one running, five waiting) before the signal
  let m;
  for (let i = 0; i < 500; i++) {
    m = await metrics(s.base);
    if (m['weld:num_requests_running'] + m['weld:num_requests_waiting'] === 6) break;
    await sleep(10);
  }
  t.eq(m['weld:num_requests_running'] + m['weld:num_requests_waiting'], 6, 'six requests in the engine');
  s.proc.kill('SIGTERM');
  const finishes = [];
  for (const [i, st] of streams.entries()) {
    let fin = null, err = null, text = '';
    try {
      for await (const ch of st) {
        text += ch.choices[0]?.text ?? '';
        if (ch.choices[0]?.finish_reason) fin = ch.choices[0].finish_reason;
      }
    } catch (e) { err = String(e); }
    t.eq(err, null, `stream ${i}: read to its end without an error`);
    t.check(fin === 'length' || fin === 'abort', `stream ${i}: ends with a finish_reason`, fin);
    finishes.push(fin);
  }
  const r = await raw.done;
  t.eq([r.status, r.chunked, r.terminated], [200, true, true], 'raw stream: 200, chunked, terminator');
  const events = r.body.split('\n\n').filter((x) => x);
  t.eq(events.at(-1), 'data: [DONE]', 'raw stream: ends with data: [DONE]');
  let last = null;
  try { last = JSON.parse(events.at(-2).replace(/^data: /, '')); } catch { /* checked below */ }
  t.eq(last?.choices?.[0]?.finish_reason, 'abort', 'raw stream: last chunk says abort');
  finishes.push(last?.choices?.[0]?.finish_reason);
  t.check(finishes.includes('abort'), 'some stream was cut short by the shutdown', finishes);
  const w = await whole;
  t.eq(w.status, 503, 'non-streaming request aborted at shutdown: 503');
  let e = null;
  try { e = JSON.parse(w.body).error; } catch { /* checked below */ }
  t.check(e && typeof e.message === 'string' && /shutting down/.test(e.message) &&
          'type' in e && 'param' in e && 'code' in e, 'OpenAI error object', w.body);
  t.eq(await s.exited, { code: 0, sig: null }, 'exits 0 after the shutdown');
  // access log with --log-prompts: every request, the prompt included
  const lines = s.stderr().split('\n').filter((l) => l.includes(' request id='));
  const posts = lines.filter((l) => l.includes('path=/v1/completions'));
  t.eq(posts.length, 6, 'one access-log line per completion request');
  t.check(posts.some((l) => /status=503 .*finish=abort/.test(l)), 'the 503 is logged', posts);
  t.check(posts.every((l) => l.includes('prompt="tell a long story"')), '--log-prompts logs the prompt',
          posts[0]);
}

// ---- clients that stop reading -------------------------------------------------------------
async function stalled() {
  const STALL = 8;
  const s = await startServer(weld, model, ['--stream-buffer-size', '16K', '--stream-stall-timeout',
                                            String(STALL), '--kv-cache-memory', '64M']);
  const client = new OpenAI({ baseURL: s.base + '/v1', apiKey: 'x', maxRetries: 0, timeout: 60000 });
  const PROMPT = 'zebra canary';
  const warm = await client.completions.create({ model, prompt: PROMPT, max_tokens: 16, ignore_eos: true });
  t.eq(warm.usage.completion_tokens, 16, 'warm-up request');
  await fetch(s.base + '/health');
  const base = serverMem(s);

  const req = httpRequest('/v1/completions', JSON.stringify({ model, prompt: PROMPT,
    max_tokens: 8000, logprobs: 20, ignore_eos: true, stream: true }));
  const socks = [];
  for (let i = 0; i < 20; i++) {
    const sk = net.connect(s.port, '127.0.0.1');
    sk.pause();
    sk.on('error', () => {});
    sk.ended = false;
    sk.on('end', () => { sk.ended = true; });
    sk.write(req);
    socks.push(sk);
  }
  let peak = 0, m;
  for (let i = 0; i < 600; i++) {
    peak = Math.max(peak, serverMem(s));
    m = await metrics(s.base);
    if (m['weld:num_requests_paused'] === 20) break;
    await sleep(100);
  }
  t.eq(m['weld:num_requests_paused'], 20, 'the 20 non-reading streams are paused');
  // A paused stream resumes while its socket still takes bytes (its queue drains below
  // half); once every socket is full, nothing more is generated. Wait for that (bounded).
  let gen0 = m['weld:generation_tokens_total'];
  for (let i = 0; i < 40; i++) {
    await sleep(500);
    peak = Math.max(peak, serverMem(s));
    m = await metrics(s.base);
    if (m['weld:generation_tokens_total'] === gen0) break;
    gen0 = m['weld:generation_tokens_total'];
  }
  t.eq(m['weld:generation_tokens_total'], gen0, 'paused streams generate nothing');
  t.check(gen0 < 20 * 4000, 'the paused streams stopped long before their max_tokens', gen0);
  t.eq(m['weld:num_requests_paused'], 20, 'the 20 streams stay paused');
  t.eq(m['weld:num_requests_running'], 20, 'paused streams keep their place (and KV)');
  console.log(`  stalled: RSS + send queues: baseline ${(base / MiB).toFixed(1)} MiB, peak ` +
              `+${((peak - base) / MiB).toFixed(1)} MiB (send queues now ${(sendQueues(s.port) / 1024).toFixed(0)} KiB)`);
  if (!sanitize)
    t.check(peak - base < 16 * MiB, 'RSS + send queues within 16 MiB of the baseline while 20 ' +
            'clients stall', { base, peak });

  // 10 clients hang up: their requests are aborted at once
  for (const sk of socks.slice(0, 10)) sk.destroy();
  for (let i = 0; i < 200; i++) {
    m = await metrics(s.base);
    if (m['weld:num_requests_paused'] === 10) break;
    await sleep(50);
  }
  t.eq(m['weld:num_requests_paused'], 10, 'clients that hang up: their requests end');
  // others are served meanwhile
  const ok = await client.completions.create({ model, prompt: PROMPT, max_tokens: 32, ignore_eos: true });
  t.eq(ok.usage.completion_tokens, 32, 'a plain request is served while streams stall');
  let n = 0;
  for await (const ch of await client.completions.create({ model, prompt: PROMPT, max_tokens: 200,
                                                           ignore_eos: true, stream: true }))
    if (ch.choices[0]?.text !== undefined) n++;
  t.check(n >= 100, 'a stream that reads is served while others stall', n);

  // the other 10 are aborted by the server after the stall timeout
  for (let i = 0; i < (STALL + 30) * 10; i++) {
    m = await metrics(s.base);
    if (m['weld:num_requests_running'] === 0) break;
    await sleep(100);
  }
  t.eq([m['weld:num_requests_running'], m['weld:num_requests_paused'], m['weld:kv_cache_blocks_used']],
       [0, 0, 0], 'stalled streams aborted after the timeout: nothing runs, no block used');
  t.eq(m['weld:stream_stall_aborts_total'], 10, 'stream_stall_aborts_total counts them');
  const warns = s.stderr().split('\n').filter((l) => /aborted: its client stopped reading/.test(l));
  t.eq(warns.length, 10, 'one warning per stalled stream');
  // their connections were shut: reading again, each one ends
  for (const sk of socks.slice(10)) sk.resume();
  for (let i = 0; i < 100 && !socks.slice(10).every((sk) => sk.ended); i++) await sleep(100);
  t.eq(socks.slice(10).filter((sk) => sk.ended).length, 10, 'the server closed the stalled connections');
  for (const sk of socks) sk.destroy();
  await sleep(200);
  const after = serverMem(s);
  console.log(`  stalled: after ${((after - base) / MiB).toFixed(1)} MiB over the baseline`);
  if (!sanitize)
    t.check(after - base < 16 * MiB, 'RSS + send queues back within 16 MiB of the baseline',
            { base, after });

  t.eq(await stopServer(s), { code: 0, sig: null }, 'exits 0');
  // default access log: lines with every field, no prompt text
  const lines = s.stderr().split('\n').filter((l) => l.includes(' request id='));
  const re = /request id=cmpl-\w+ client=127\.0\.0\.1:\d+ method=POST path=\/v1\/completions status=200 prompt_tokens=\d+ completion_tokens=16 ttft_s=[\d.]+ total_s=[\d.]+ finish=length$/;
  t.check(lines.some((l) => re.test(l)), 'access-log line with every field', lines.slice(0, 2));
  t.check(lines.some((l) => /id=- .*method=GET path=\/health status=200 prompt_tokens=- /.test(l)),
          'GET requests are logged too', lines.filter((l) => l.includes('GET')).slice(0, 1));
  t.check(lines.some((l) => /status=200 .*finish=abort/.test(l)), 'aborted streams logged as abort');
  t.check(!s.stderr().includes(PROMPT), 'no prompt text in the log without --log-prompts');
}

// ---- --disable-log-requests ----------------------------------------------------------------
async function quiet() {
  const s = await startServer(weld, stories, ['--disable-log-requests']);
  const client = new OpenAI({ baseURL: s.base + '/v1', apiKey: 'x', maxRetries: 0 });
  const r = await client.completions.create({ model: stories, prompt: 'Once upon a time', max_tokens: 8 });
  t.eq(r.choices.length, 1, 'served with --disable-log-requests');
  t.eq(await stopServer(s), { code: 0, sig: null }, 'exits 0');
  t.check(!s.stderr().includes(' request id='), 'no access-log line with --disable-log-requests',
          s.stderr());
}

try {
  await shutdown();
  await stalled();
  await quiet();
} catch (e) {
  t.check(false, 'unexpected exception', String(e?.stack || e));
}
process.exit(t.summary());

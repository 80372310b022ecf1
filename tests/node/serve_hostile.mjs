// `weld serve` against hostile and careless clients, over raw loopback sockets and the
// official `openai` client. Usage: node serve_hostile.mjs WELD MODEL TMPDIR
//   A: 1,000 idle connections from 127.0.0.1 do not stop /health (or /metrics) from
//      127.0.0.2 answering in < 1 s; past --max-connections-per-client the server answers
//      429 at once; a request line starting with a NUL byte is answered 400 at once (the
//      send timeout is 30 s there); the slots come back when the client goes.
//   B: --send-timeout 1: a connection that sends nothing, or half a request, is closed
//      after about 1 s; a request that waits longer than that for the engine (queued
//      behind a request of many prompts, --max-num-seqs 1) still completes, streamed and not.
//   C: --max-connections 32: its reserve keeps /health answering while the other slots
//      hold half-sent generation requests, which get 503 beyond them.
//   D: API keys: --api-key twice and --api-key-file, the scheme in any case, wrong keys
//      refused, and no key ever in the server's log or error messages.
// Exits 77 (skipped) when the open-files hard limit cannot hold the 1,000 sockets.
import OpenAI from 'openai';
import { execSync } from 'node:child_process';
import { mkdirSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import { join } from 'node:path';
import { spawnSync } from 'node:child_process';
import { counter, sleep, startServer, stopServer } from './serve_lib.mjs';

const [weld, stories, tmp] = process.argv.slice(2);
const t = counter();
mkdirSync(tmp, { recursive: true });

const hard = execSync('ulimit -Hn', { shell: '/bin/sh', encoding: 'utf8' }).trim();
if (hard !== 'unlimited' && Number(hard) < 2600) {
  console.log(`skipped: the open-files hard limit is ${hard}; this test needs 2,600 ` +
              '(1,000 client sockets, the server\'s side of them and the server\'s own)');
  process.exit(77);
}

// One socket from `from` to the server; resolves once connected (or failed).
function connect(port, from = '127.0.0.1') {
  return new Promise((resolve) => {
    const sock = net.connect({ host: '127.0.0.1', port, localAddress: from });
    const st = { sock, data: '', closed: false, closedAt: 0, error: null };
    st.done = new Promise((r) => sock.on('close', () => {
      st.closed = true; st.closedAt = Date.now(); r();
    }));
    sock.on('data', (d) => { st.data += d.toString('latin1'); });
    sock.on('error', (e) => { st.error = e.code; });
    sock.on('connect', () => resolve(st));
    sock.on('close', () => resolve(st));
  });
}

// A whole raw request; resolves {status, body, ms} when the server closes the connection.
async function raw(port, text, from = '127.0.0.1', limitMs = 10000) {
  const t0 = Date.now();
  const st = await connect(port, from);
  if (!st.closed) st.sock.write(Buffer.from(text, 'latin1'));
  const timer = setTimeout(() => st.sock.destroy(), limitMs);
  await st.done;
  clearTimeout(timer);
  const m = st.data.match(/^HTTP\/1\.1 (\d+)/);
  const i = st.data.indexOf('\r\n\r\n');
  return { status: m ? Number(m[1]) : 0, body: i >= 0 ? st.data.slice(i + 4) : '',
           ms: Date.now() - t0, data: st.data };
}

const get = (path, headers = '') =>
  `GET ${path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n${headers}\r\n`;

// ---- A: one client holds 1,000 connections ---------------------------------------------
async function serverA() {
  const s = await startServer(weld, stories, ['--send-timeout', '30']);
  const socks = [];
  for (let i = 0; i < 1000; i += 100) {
    socks.push(...await Promise.all(Array.from({ length: 100 }, () => connect(s.port))));
  }
  // Some of them send half a request (so the server's HTTP side holds them, not only the
  // accept loop); the rest send nothing.
  for (const st of socks.slice(0, 100)) if (!st.closed) st.sock.write('GET /health HTTP/1.1\r\n');
  await sleep(300);
  const h = await raw(s.port, get('/health'), '127.0.0.2');
  t.eq(h.status, 200, 'A: /health from 127.0.0.2 while 127.0.0.1 holds 1,000 connections');
  t.check(h.ms < 1000, 'A: ... answered in < 1 s', h.ms);
  const m = await raw(s.port, get('/metrics'), '127.0.0.3');
  t.check(m.status === 200 && m.body.includes('weld:'), 'A: /metrics from 127.0.0.3', m.status);
  const open = socks.filter((x) => !x.closed).length;
  t.check(open <= 256, 'A: at most --max-connections-per-client (256) stay open', open);
  const refused = socks.filter((x) => x.closed);
  t.check(refused.length >= 700 && refused.every((x) => x.data.startsWith('HTTP/1.1 429')),
          'A: the connections past the limit were answered 429',
          { n: refused.length, first: refused[0]?.data.slice(0, 60) });
  const errs = Number(m.body.match(/^weld:http_errors_total\S* (\d+)/m)?.[1]);
  t.check(errs >= refused.length, 'A: the refusals count in weld:http_errors_total',
          { errs, refused: refused.length });
  const same = await raw(s.port, get('/health'), '127.0.0.1');
  t.eq(same.status, 429, 'A: /health from the full address: 429');
  t.check(/max-connections-per-client/.test(same.body), 'A: the 429 names the flag', same.body);

  const nul = await raw(s.port, '\0\0\0\0', '127.0.0.4');
  t.eq(nul.status, 400, 'A: a request line starting with NUL bytes: 400');
  t.check(nul.ms < 2000, 'A: ... at once (send timeout 30 s)', nul.ms);
  t.check(/"error"/.test(nul.body), 'A: ... with an error object', nul.body);
  const tls = await raw(s.port, '\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03', '127.0.0.4');
  t.eq(tls.status, 400, 'A: a TLS hello on the HTTP port: 400');
  const nul2 = await raw(s.port, 'GE\0T / HTTP/1.1\r\n\r\n', '127.0.0.4');
  t.eq(nul2.status, 400, 'A: a NUL inside the method: 400');

  for (const st of socks) st.sock.destroy();
  let back = 0;
  for (const t0 = Date.now(); Date.now() - t0 < 10000; await sleep(100)) {
    back = (await raw(s.port, get('/health'), '127.0.0.1')).status;
    if (back === 200) break;
  }
  t.eq(back, 200, 'A: the slots come back once the client closes its connections');
  t.eq(await stopServer(s), { code: 0, sig: null }, 'A: exits 0');
}

// ---- B: the send timeout, and requests that run longer than it ---------------------------
async function serverB() {
  const s = await startServer(weld, stories, ['--send-timeout', '1', '--max-num-seqs', '1']);
  const idle = await raw(s.port, '', '127.0.0.1', 15000);
  t.eq(idle.status, 408, 'B: a connection that sends nothing: 408');
  t.check(idle.ms >= 700 && idle.ms < 6000, 'B: ... after about --send-timeout 1', idle.ms);
  const half = await raw(s.port, 'GET /health HTTP/1.1\r\nHost: x\r\n', '127.0.0.1', 15000);
  t.check(half.ms >= 700 && half.ms < 6000, 'B: half a request is closed after about 1 s',
          { ms: half.ms, data: half.data.slice(0, 40) });

  // Long requests: one request of many prompts keeps the only sequence slot busy, so the
  // two requests sent after it wait before their first token; the prompts double until
  // that wait is over 2 s (twice the send timeout) on this machine.
  const client = new OpenAI({ baseURL: s.base + '/v1', apiKey: 'x', maxRetries: 0,
                              timeout: 300000 });
  const job = { model: stories, prompt: 'Once upon a time', max_tokens: 120, ignore_eos: true,
                temperature: 0 };
  let w, sr, np;
  for (np = 64; np <= 1024; np *= 2) {
    const t0 = Date.now();
    const blocker = client.completions.create({ ...job, max_tokens: 100,
      prompt: Array.from({ length: np }, (_, i) => `Once upon a time ${i}`) });
    await sleep(200);
    const whole = client.completions.create(job).then((r) => ({ r, ms: Date.now() - t0 }));
    const streamed = (async () => {
      const st = await client.completions.create({ ...job, stream: true });
      let text = '', finish = null;
      for await (const ch of st) {
        text += ch.choices[0]?.text ?? '';
        if (ch.choices[0]?.finish_reason) finish = ch.choices[0].finish_reason;
      }
      return { text, finish, ms: Date.now() - t0 };
    })();
    [w, sr] = await Promise.all([whole.catch((e) => ({ e })), streamed.catch((e) => ({ e }))]);
    await blocker.catch(() => null);
    if (w.e || sr.e || (w.ms > 2000 && sr.ms > 2000)) break;
  }
  t.check(!w.e && w.r.choices[0].finish_reason === 'length' && w.r.usage.completion_tokens === 120,
          'B: a non-streamed request that waited longer than the send timeout completes',
          w.e ? String(w.e) : w.r.usage);
  t.check(!sr.e && sr.finish === 'length' && sr.text.length > 0,
          'B: a stream that waited longer than the send timeout completes',
          sr.e ? String(sr.e) : sr);
  t.check(w.ms > 2000 && sr.ms > 2000, 'B: (the wait was longer than the send timeout)',
          { prompts: np, w: w.ms, s: sr.ms });
  t.eq(await stopServer(s), { code: 0, sig: null }, 'B: exits 0');
}

// ---- C: the reserve for /health and /metrics ------------------------------------------
async function serverC() {
  const s = await startServer(weld, stories, ['--max-connections', '32',
                                              '--max-connections-per-client', '0']);
  const half = 'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n' +
               'Content-Length: 100\r\n\r\n{"prompt":';
  const socks = [];
  for (let i = 0; i < 32; i++) {
    const st = await connect(s.port);
    st.sock.write(half);
    socks.push(st);
    await sleep(5);
  }
  await sleep(300);
  const busy = socks.filter((x) => x.closed);
  t.check(busy.length >= 1 && busy.every((x) => x.data.startsWith('HTTP/1.1 503')),
          'C: generation requests past the non-reserved slots: 503',
          { n: busy.length, first: busy[0]?.data.slice(0, 40) });
  const h = await raw(s.port, get('/health'), '127.0.0.2');
  t.eq(h.status, 200, 'C: /health answers from the reserve');
  t.check(h.ms < 1000, 'C: ... in < 1 s', h.ms);
  const m = await raw(s.port, get('/metrics'), '127.0.0.2');
  t.eq(m.status, 200, 'C: /metrics answers from the reserve');
  const models = await raw(s.port, get('/v1/models'), '127.0.0.2');
  t.eq(models.status, 503, 'C: other routes do not take the reserve');
  for (const st of socks) st.sock.destroy();
  t.eq(await stopServer(s), { code: 0, sig: null }, 'C: exits 0');
}

// ---- D: API keys ------------------------------------------------------------------------
async function serverD() {
  const keys = ['sk-alpha-7f3e9c1d', 'sk-bravo-52ab0e77', 'sk-charlie-0c44d1aa',
                'sk-delta-9be1f203'];
  const file = join(tmp, 'keys.txt');
  writeFileSync(file, `\n  ${keys[2]}  \r\n\n${keys[3]}\n`);
  const s = await startServer(weld, stories, ['--api-key', keys[0], '--api-key', keys[1],
                                              '--api-key-file', file]);
  for (const [i, key] of keys.entries()) {
    const c = new OpenAI({ baseURL: s.base + '/v1', apiKey: key, maxRetries: 0 });
    const r = await c.models.list().then(() => 200, (e) => e.status);
    t.eq(r, 200, `D: key ${i + 1} of 4 accepted`);
  }
  const auth = async (h) => (await raw(s.port, get('/v1/models', h ? `Authorization: ${h}\r\n` : ''),
                                       '127.0.0.1')).status;
  t.eq(await auth(`bearer ${keys[2]}`), 200, 'D: scheme "bearer" (RFC 7235: any case)');
  t.eq(await auth(`BEARER ${keys[0]}`), 200, 'D: scheme "BEARER"');
  t.eq(await auth(`Bearer   ${keys[1]}`), 200, 'D: several spaces after the scheme');
  t.eq(await auth(`Bearer ${keys[0]}x`), 401, 'D: a key with a byte more: 401');
  t.eq(await auth(`Bearer ${keys[0].slice(0, -1)}`), 401, 'D: a key with a byte less: 401');
  t.eq(await auth(`Bearer ${keys[0].slice(0, -1)}X`), 401, 'D: a key with its last byte changed: 401');
  t.eq(await auth(`Basic ${keys[0]}`), 401, 'D: another scheme: 401');
  t.eq(await auth(`Bearer${keys[0]}`), 401, 'D: no space after the scheme: 401');
  t.eq(await auth('Bearer '), 401, 'D: an empty key: 401');
  t.eq(await auth(null), 401, 'D: no header: 401');
  const bad = await raw(s.port, get('/v1/models', 'Authorization: Bearer sk-wrong-guess\r\n'));
  t.check(bad.status === 401 && !bad.body.includes('sk-wrong-guess'),
          'D: the 401 does not echo the key sent', bad.body);
  t.eq(await stopServer(s), { code: 0, sig: null }, 'D: exits 0');
  const log = s.stderr();
  t.check(keys.every((k) => !log.includes(k)) && !log.includes('sk-wrong-guess'),
          'D: no key in the server log', log);

  // Start-up errors name the flag and the file, never a key.
  const run = (args) => spawnSync(weld, ['serve', stories, '--port', '0', ...args],
                                  { encoding: 'utf8', timeout: 30000 });
  const missing = run(['--api-key', keys[0], '--api-key-file', join(tmp, 'no-such-file')]);
  t.check(missing.status === 1 && /--api-key-file .*no-such-file/.test(missing.stderr) &&
          !missing.stderr.includes(keys[0]), 'D: a missing key file: exit 1, named',
          { status: missing.status, err: missing.stderr });
  const empty = join(tmp, 'empty-keys.txt');
  writeFileSync(empty, '\n  \n');
  const e2 = run(['--api-key-file', empty]);
  t.check(e2.status === 1 && /no key/.test(e2.stderr), 'D: a key file without keys: exit 1',
          { status: e2.status, err: e2.stderr });
  const many = run(Array.from({ length: 17 }, (_, i) => ['--api-key', `sk-many-${i}`]).flat());
  t.check(many.status === 2 && !many.stderr.includes('sk-many-'),
          'D: too many --api-key: usage error without echoing a key',
          { status: many.status, err: many.stderr });
}

try {
  await serverA();
  await serverB();
  await serverC();
  await serverD();
} catch (e) {
  t.check(false, 'unexpected exception', String(e?.stack || e));
}
process.exit(t.summary());

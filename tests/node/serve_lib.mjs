// Helpers shared by the `weld serve` integration tests (serve_api.mjs, serve_load.mjs):
// start a server on a free loopback port (--port 0; the bound port is read from its
// "listening on" line), wait for /health, read /metrics, stop it with SIGTERM and check
// the exit status, and a tiny pass/fail counter printing "N passed, N failed" like the C
// tests. A server still running when the script exits is killed.
import { spawn } from 'node:child_process';

const live = new Set();
process.on('exit', () => { for (const p of live) { try { p.kill('SIGKILL'); } catch {} } });

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

export function counter() {
  const c = { pass: 0, fail: 0 };
  c.check = (cond, what, detail) => {
    if (cond) { c.pass++; return true; }
    c.fail++;
    console.error(`FAIL: ${what}${detail !== undefined ? ': ' + JSON.stringify(detail) : ''}`);
    return false;
  };
  c.eq = (got, want, what) => c.check(JSON.stringify(got) === JSON.stringify(want), what,
                                      { got, want });
  c.summary = () => { console.log(`${c.pass} passed, ${c.fail} failed`); return c.fail ? 1 : 0; };
  return c;
}

// An OpenAI-client call that must fail with HTTP status; check (optional) gets its error
// object. Counted in t (a counter()).
export async function expectStatus(t, promise, status, what, check) {
  try {
    await promise;
    t.check(false, `${what}: expected HTTP ${status}, got success`);
  } catch (e) {
    if (!t.eq(e.status, status, `${what}: status`)) console.error(e);
    if (check) check(e.error || {});
  }
}

export async function startServer(weld, model, args = [], env = {}) {
  const proc = spawn(weld, ['serve', model, '--port', '0', ...args],
                     { stdio: ['ignore', 'ignore', 'pipe'], env: { ...process.env, ...env } });
  live.add(proc);
  let err = '', gone = false;
  const exited = new Promise((resolve) => proc.on('exit', (code, sig) => {
    live.delete(proc);
    gone = true;
    resolve({ code, sig });
  }));
  const port = await new Promise((resolve, reject) => {
    const t = setTimeout(() => reject(new Error('no "listening on" line in 60 s: ' + err)), 60000);
    proc.stderr.on('data', (d) => {
      err += d.toString();
      const m = err.match(/listening on http:\/\/[\d.]+:(\d+)/);
      if (m) { clearTimeout(t); resolve(Number(m[1])); }
    });
    proc.on('exit', (code) => reject(new Error(`weld serve exited (${code}): ${err}`)));
  });
  const base = `http://127.0.0.1:${port}`;
  const t0 = Date.now();
  for (;;) {
    const r = await fetch(base + '/health').catch(() => null);
    if (r && r.status === 200) break;
    if (gone) throw new Error('weld serve exited: ' + err);
    if (Date.now() - t0 > 60000) throw new Error('/health never became 200: ' + err);
    await sleep(20);
  }
  return { proc, port, base, exited, stderr: () => err };
}

// `weld router ARGS` on a free port (--port 0; its "listening on" line), waiting for
// /health to answer 200 unless healthy is false. Killed like servers if still running
// when the script exits.
export async function startRouter(weld, args, { healthy = true } = {}) {
  const proc = spawn(weld, ['router', '--port', '0', ...args],
                     { stdio: ['ignore', 'ignore', 'pipe'] });
  live.add(proc);
  let err = '';
  const exited = new Promise((resolve) => proc.on('exit', (code, sig) => {
    live.delete(proc);
    resolve({ code, sig });
  }));
  const port = await new Promise((resolve, reject) => {
    const tm = setTimeout(() => reject(new Error('no "listening on" line in 30 s: ' + err)), 30000);
    proc.stderr.on('data', (d) => {
      err += d.toString();
      const m = err.match(/weld router: listening on http:\/\/[\d.]+:(\d+)/);
      if (m) { clearTimeout(tm); resolve(Number(m[1])); }
    });
    proc.on('exit', (code) => reject(new Error(`weld router exited (${code}): ${err}`)));
  });
  const base = `http://127.0.0.1:${port}`;
  if (healthy) {
    const t0 = Date.now();
    while ((await fetch(base + '/health').catch(() => null))?.status !== 200) {
      if (Date.now() - t0 > 20000) throw new Error('router /health never 200: ' + err);
      await sleep(20);
    }
  }
  return { proc, base, exited, stderr: () => err };
}

export async function stopServer(s) {
  s.proc.kill('SIGTERM');
  return s.exited;
}

// /metrics as {name{labels}: value} plus by-name sums; labels kept verbatim.
export async function metrics(base) {
  const txt = await (await fetch(base + '/metrics')).text();
  const m = { raw: txt };
  for (const line of txt.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const i = line.lastIndexOf(' ');
    const key = line.slice(0, i);
    const v = Number(line.slice(i + 1));
    m[key] = v;
    const name = key.replace(/\{.*$/, '');
    const reason = key.match(/finished_reason="(\w+)"/);
    const k = reason ? `${name}:${reason[1]}` : name;
    if (!key.includes('le="') && k !== key) m[k] = (m[k] || 0) + v;
  }
  return m;
}

// `weld serve` with speculative decoding, driven by the official `openai` npm client: the
// same requests to a plain server and to servers that speculate (ngram prompt lookup, and
// the model drafting for itself through llama.cpp's -md) give the same responses, and
// /metrics counts the drafts with vLLM's names under weld:.
// usage: node serve_spec.mjs WELD_BIN STORIES260K_GGUF
//
// Requests, sent concurrently so verify rows share steps with plain decodes and prefills:
// greedy completions of several lengths, a stop string, logprobs with top 3, n = 2 seeded
// sampling at temperature 0.8 with top_p / top_k / penalties / logit_bias, a streamed
// greedy completion, a chat completion (chatml). Everything but ids and timestamps must be equal.
// Metrics: spec_decode_num_drafts_total, _num_draft_tokens_total,
// _num_accepted_tokens_total (accepted <= drafted; a model drafting for itself has its
// guesses for the greedy requests accepted), _num_accepted_tokens_per_pos_total{position}.
import OpenAI from 'openai';
import { counter, metrics, startServer, stopServer } from './serve_lib.mjs';

const [weld, stories] = process.argv.slice(2);
const t = counter();

function requests(client, model) {
  const c = (body) => client.completions.create({ model, ...body });
  const strip = (r) => r.choices.map((ch) => ({ text: ch.text, finish: ch.finish_reason,
                                                logprobs: ch.logprobs ?? null, index: ch.index }));
  const jobs = [];
  for (const n of [8, 24, 40, 64])
    jobs.push(c({ prompt: 'Once upon a time', max_tokens: n, temperature: 0 }).then(strip));
  jobs.push(c({ prompt: 'Lily and Tom went to the park. Lily and Tom', max_tokens: 48,
                temperature: 0 }).then(strip));
  jobs.push(c({ prompt: 'Once upon a time', max_tokens: 64, temperature: 0, stop: ['park'] })
              .then(strip));
  jobs.push(c({ prompt: 'The cat sat', max_tokens: 32, temperature: 0, logprobs: 3 }).then(strip));
  jobs.push(c({ prompt: 'One day, a little dog', max_tokens: 40, n: 2, temperature: 0.8, seed: 11,
                top_p: 0.9, top_k: 20, frequency_penalty: 0.3, presence_penalty: 0.2,
                logit_bias: { 400: -2 } }).then(strip));
  jobs.push((async () => {
    const s = await c({ prompt: 'Once upon a time', max_tokens: 48, temperature: 0, stream: true });
    let text = '';
    for await (const ch of s) text += ch.choices.map((x) => x.text).join('');
    return text;
  })());
  jobs.push(client.chat.completions.create({ model, max_tokens: 32, temperature: 0,
                                             messages: [{ role: 'user', content: 'Tell me a story' }] })
              .then((r) => r.choices.map((ch) => [ch.message.content, ch.finish_reason])));
  return Promise.all(jobs);
}

async function run(args) {
  const s = await startServer(weld, stories, ['--chat-template', 'chatml', ...args]);
  try {
    const client = new OpenAI({ baseURL: s.base + '/v1', apiKey: 'none', maxRetries: 0 });
    const out = await requests(client, stories);
    const m = await metrics(s.base);
    return { out, m, code: (await stopServer(s)).code };
  } catch (e) {
    await stopServer(s);
    throw e;
  }
}

try {
  const plain = await run([]);
  t.eq(plain.code, 0, 'plain server exit status');
  t.eq(plain.m['weld:spec_decode_num_drafts_total'] ?? 0, 0, 'plain: no drafts');
  const spec = [
    ['ngram', ['--speculative-config', '{"method": "ngram", "num_speculative_tokens": 4}']],
    ['-md', ['-md', stories, '--speculative-config', '{"num_speculative_tokens": 3}']],
  ];
  for (const [name, args] of spec) {
    const r = await run(args);
    t.eq(r.code, 0, `${name}: exit status`);
    for (let i = 0; i < plain.out.length; i++)
      t.eq(r.out[i], plain.out[i], `${name}: request ${i} as without speculation`);
    const drafts = r.m['weld:spec_decode_num_drafts_total'];
    const drafted = r.m['weld:spec_decode_num_draft_tokens_total'];
    const accepted = r.m['weld:spec_decode_num_accepted_tokens_total'];
    t.check(drafts > 0 && drafted >= drafts, `${name}: drafts counted`, { drafts, drafted });
    t.check(accepted <= drafted && (name === 'ngram' || accepted > 0), `${name}: accepted <= drafted`,
            { accepted, drafted });
    const pos0 = Object.entries(r.m).filter(([k]) =>
      k.startsWith('weld:spec_decode_num_accepted_tokens_per_pos_total{') && k.includes('position="0"'))
      .reduce((a, [, v]) => a + v, 0);
    t.check(pos0 <= drafts && pos0 <= accepted && (accepted === 0 || pos0 > 0),
            `${name}: accepted at position 0`, pos0);
    t.check(r.m.raw.includes('# TYPE weld:spec_decode_num_accepted_tokens_total counter'),
            `${name}: metric type line`);
  }
} catch (e) {
  t.check(false, 'unexpected exception', String(e.stack || e));
}
process.exit(t.summary());

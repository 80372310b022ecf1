// `weld serve` requests that read the prompt, driven by the official `openai` npm client:
// /v1/embeddings and echo with prompt logprobs on /v1/completions.
// usage: node serve_pooling.mjs WELD_BIN STORIES260K_GGUF
//
// Embeddings: client.embeddings.create (the client asks for base64 unless told "float"):
//   shape (object list, data[i].object/index, model, usage), length = the model's hidden
//   size (64), unit L2 norm, base64 == float, deterministic, several inputs in one request
//   (strings and token-id lists) equal to each alone, while a long completion streams beside
//   them (batched, never blocking generation); errors: dimensions, encoding_format, empty or
//   missing input, bad token id, unknown model, too long an input.
// Prompt logprobs: echo + logprobs (+ max_tokens 0, lm-evaluation-harness's log-likelihood
//   request): tokens / token_logprobs (first null) / top_logprobs (first null) /
//   text_offset over the prompt then the completion; each prompt token's logprob equals the
//   one a separate request gets when that token is forced as the next token of the prefix
//   (logit_bias; logprobs are of the raw row), and so does their sum; max_tokens 0 without
//   echo is a 400 naming max_tokens.
// --pooling-type mean (a second server): unit norm, deterministic, not the last token's;
//   another value is refused at start (exit 2, the flag named).
import OpenAI from 'openai';
import { execFileSync } from 'node:child_process';
import { counter, startServer, stopServer } from './serve_lib.mjs';

const [weld, stories] = process.argv.slice(2);
const t = counter();
const PROMPT = 'Once upon a time';

async function expectStatus(promise, status, what, param) {
  try {
    await promise;
    t.check(false, `${what}: expected HTTP ${status}, got success`);
  } catch (e) {
    if (!t.eq(e.status, status, `${what}: status`)) console.error(e);
    if (param !== undefined) t.eq(e.error?.param ?? e.param, param, `${what}: param`);
  }
}

const norm = (v) => Math.sqrt(v.reduce((s, x) => s + x * x, 0));

async function embeddings(client, model) {
  const one = await client.embeddings.create({ model, input: PROMPT });
  t.eq(one.object, 'list', 'embeddings object');
  t.eq(one.model, model, 'embeddings model');
  t.eq(one.data.length, 1, 'one input, one vector');
  t.eq([one.data[0].object, one.data[0].index], ['embedding', 0], 'data entry');
  const v = one.data[0].embedding;
  t.eq(v.length, 64, 'hidden size');
  t.check(Math.abs(norm(v) - 1) < 1e-5, 'unit norm', norm(v));
  t.eq([one.usage.prompt_tokens, one.usage.total_tokens], [5, 5], 'usage');
  const flt = await client.embeddings.create({ model, input: PROMPT, encoding_format: 'float' });
  t.eq(flt.data[0].embedding, v, 'float == base64');
  const again = await client.embeddings.create({ model, input: PROMPT });
  t.eq(again.data[0].embedding, v, 'deterministic');

  // several inputs while a completion streams: each equals its own single request
  const texts = ['The cat sat', 'Lily went to the park and', 'A big red ball'];
  const singles = [];
  for (const x of texts)
    singles.push((await client.embeddings.create({ model, input: x })).data[0].embedding);
  const stream = await client.completions.create({ model, prompt: PROMPT, max_tokens: 120, n: 3,
                                                   ignore_eos: true, temperature: 0.8, stream: true });
  let chunks = 0;
  const reading = (async () => { for await (const ch of stream) chunks += ch.choices.length; })();
  const many = await client.embeddings.create({ model, input: texts });
  const ids = await client.embeddings.create({ model, input: [[1, 403, 407, 261, 378], [1, 403]] });
  const idsOne = await client.embeddings.create({ model, input: [1, 403, 407, 261, 378] });
  await reading;
  t.check(chunks > 10, 'the completion streamed beside the embeddings', chunks);
  t.eq(many.data.map((d) => d.index), [0, 1, 2], 'indices in input order');
  for (let i = 0; i < texts.length; i++)
    t.eq(many.data[i].embedding, singles[i], `batched input ${i} == alone`);
  t.check(many.data[0].embedding.some((x, i) => x !== many.data[1].embedding[i]),
          'different inputs, different vectors');
  t.eq(ids.data[0].embedding, v, 'token ids [1, 403, 407, 261, 378] == the text');
  t.eq(idsOne.data[0].embedding, v, 'one token-id list == the text');
  t.eq(ids.usage.prompt_tokens, 7, 'token-id lists usage');

  // errors
  await expectStatus(client.embeddings.create({ model, input: PROMPT, dimensions: 8 }), 400,
                     'dimensions', 'dimensions');
  await expectStatus(client.embeddings.create({ model, input: PROMPT, encoding_format: 'int8' }),
                     400, 'encoding_format', 'encoding_format');
  await expectStatus(client.embeddings.create({ model, input: '' }), 400, 'empty input', 'input');
  await expectStatus(client.embeddings.create({ model, input: [] }), 400, 'empty list', 'input');
  await expectStatus(client.embeddings.create({ model }), 400, 'missing input', 'input');
  await expectStatus(client.embeddings.create({ model, input: [[1, 99999]] }), 400,
                     'bad token id', 'input');
  await expectStatus(client.embeddings.create({ model: 'nope', input: PROMPT }), 404,
                     'unknown model', 'model');
  await expectStatus(client.embeddings.create({ model, input: 'a b '.repeat(200) }), 400,
                     'too long', 'input');
}

async function promptLogprobs(client, model, base) {
  const r = await client.completions.create({ model, prompt: PROMPT, max_tokens: 0, echo: true,
                                              logprobs: 1, temperature: 0 });
  const c = r.choices[0], lp = c.logprobs;
  t.eq(c.text, PROMPT, 'max_tokens 0 + echo: the prompt only');
  t.eq(c.finish_reason, 'length', 'max_tokens 0 finish');
  t.eq([r.usage.prompt_tokens, r.usage.completion_tokens], [5, 0], 'max_tokens 0 usage');
  t.eq(lp.tokens.length, 5, 'a logprob entry per prompt token');
  t.eq([lp.token_logprobs[0], lp.top_logprobs[0]], [null, null], 'first token has none');
  t.eq(lp.text_offset.length, 5, 'text_offset per token');
  t.check(lp.token_logprobs.slice(1).every((x) => typeof x === 'number' && x <= 0),
          'prompt logprobs are logprobs', lp.token_logprobs);
  t.check(lp.top_logprobs.slice(1).every((o) => o && Object.keys(o).length >= 1),
          'top_logprobs per prompt token', lp.top_logprobs);

  // each prompt token forced after its prefix in a separate request: the same logprob
  const tok = await (await fetch(base + '/tokenize', { method: 'POST',
    headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ model, prompt: PROMPT }) })).json();
  t.eq(tok.tokens.length, 5, 'tokenize');
  let sum = 0, sumSep = 0;
  for (let k = 1; k < tok.tokens.length; k++) {
    const one = await client.completions.create({
      model, prompt: tok.tokens.slice(0, k), max_tokens: 1, temperature: 0, logprobs: 0,
      logit_bias: { [tok.tokens[k]]: 100 } });
    const got = one.choices[0].logprobs.token_logprobs[0];
    t.check(Math.abs(got - lp.token_logprobs[k]) < 1e-4, `prompt token ${k} logprob`,
            { echo: lp.token_logprobs[k], separate: got });
    sum += lp.token_logprobs[k];
    sumSep += got;
  }
  t.check(Math.abs(sum - sumSep) < 1e-3, 'sum of prompt logprobs', { sum, sumSep });

  // echo + logprobs with a completion: prompt then completion entries
  const g = await client.completions.create({ model, prompt: PROMPT, max_tokens: 3, echo: true,
                                              logprobs: 0, temperature: 0 });
  const gl = g.choices[0].logprobs;
  t.eq(gl.tokens.length, 8, 'prompt + completion entries');
  t.eq(gl.token_logprobs.slice(0, 5), lp.token_logprobs, 'same prompt logprobs');
  t.check(gl.text_offset.every((x, i) => i === 0 || x >= gl.text_offset[i - 1]) &&
          gl.text_offset[5] === PROMPT.length, 'text_offset covers prompt then completion',
          gl.text_offset);
  const plain = await client.completions.create({ model, prompt: PROMPT, max_tokens: 3,
                                                  logprobs: 0, temperature: 0 });
  t.eq(gl.token_logprobs.slice(5), plain.choices[0].logprobs.token_logprobs,
       'completion logprobs as without echo');
  t.eq(g.choices[0].text, PROMPT + plain.choices[0].text, 'echo text');

  // several prompts, n > 1: every choice gets its prompt's entries
  const m = await client.completions.create({ model, prompt: [PROMPT, 'The cat'], n: 2,
                                              max_tokens: 0, echo: true, logprobs: 0 });
  t.eq(m.choices.map((x) => x.logprobs.tokens.length), [5, 5, 4, 4], 'prompt list x n');
  t.eq(m.choices[1].logprobs.token_logprobs, lp.token_logprobs, 'n > 1 choice');

  await expectStatus(client.completions.create({ model, prompt: PROMPT, max_tokens: 0 }), 400,
                     'max_tokens 0 without echo', 'max_tokens');
}

const s = await startServer(weld, stories, ['--served-model-name', 'stories']);
const client = new OpenAI({ baseURL: s.base + '/v1', apiKey: 'none', maxRetries: 0 });
try {
  await embeddings(client, 'stories');
  await promptLogprobs(client, 'stories', s.base);
} catch (e) {
  t.check(false, 'unexpected exception', String(e.stack || e));
}
const ex = await stopServer(s);
t.eq(ex.code, 0, 'server exit status');

// --pooling-type mean: the mean of every prompt token's state, also unit length
const lastVec = (await (async () => {
  const s2 = await startServer(weld, stories, ['--pooling-type', 'last']);
  const c2 = new OpenAI({ baseURL: s2.base + '/v1', apiKey: 'none', maxRetries: 0 });
  const v = (await c2.embeddings.create({ model: stories, input: PROMPT })).data[0].embedding;
  await stopServer(s2);
  return v;
})());
const sm = await startServer(weld, stories, ['--pooling-type', 'mean']);
try {
  const cm = new OpenAI({ baseURL: sm.base + '/v1', apiKey: 'none', maxRetries: 0 });
  const m1 = (await cm.embeddings.create({ model: stories, input: PROMPT })).data[0].embedding;
  const m2 = (await cm.embeddings.create({ model: stories, input: [PROMPT, 'The cat'] })).data[0].embedding;
  t.check(Math.abs(norm(m1) - 1) < 1e-5, 'mean: unit norm', norm(m1));
  t.eq(m2, m1, 'mean: deterministic, batched');
  t.check(m1.some((x, i) => Math.abs(x - lastVec[i]) > 1e-3), 'mean differs from last');
} catch (e) {
  t.check(false, 'unexpected exception (mean)', String(e.stack || e));
}
t.eq((await stopServer(sm)).code, 0, 'mean server exit status');
let bad = null;
try {
  execFileSync(weld, ['serve', stories, '--pooling-type', 'cls'], { stdio: 'pipe' });
} catch (e) {
  bad = e;
}
t.eq(bad?.status, 2, '--pooling-type cls: exit status 2');
t.check(String(bad?.stderr).includes('--pooling-type cls: expected last or mean'),
        '--pooling-type error names the flag', String(bad?.stderr));
process.exit(t.summary());

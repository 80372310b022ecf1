// tokenizer_corpus.js - the deterministic tokenizer parity corpus.
//
// Returns an array of strings: the hand-written tricky cases of
// tests/data/tokenizer_cases.jsonl (one JSON string per line) followed by strings built by
// a seeded PRNG (mulberry32) that glues together fragments of many scripts, code, numbers,
// whitespace runs, emoji sequences and spelled-out special tokens. Same seed, same corpus,
// on every machine: the C test only reads what tokenizer_ref.js wrote, so the corpus never
// has to be regenerated in C.
'use strict';
const fs = require('fs');
const path = require('path');

function mulberry32(a) {
  return function () {
    a |= 0; a = (a + 0x6D2B79F5) | 0;
    let t = Math.imul(a ^ (a >>> 15), 1 | a);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const FRAGMENTS = [
  // English prose
  'The quick brown fox jumps over the lazy dog.', 'Once upon a time, there was a little girl.',
  'It was the best of times, it was the worst of times.', 'However', 'although', 'Mr. Smith',
  "I'd've", "they're", "We'LL", "Can't", "WON'T", "it's", "She'S", "O'Neill", "rock 'n' roll",
  'e.g.', 'i.e.', 'etc.', 'U.S.A.', 'Dr.', 'naïve café', 'résumé', 'coöperate', 'Zürich',
  // code
  'def f(x):', '    return x', '\tif (a && b) {', '}', 'int *p = &x;', 'std::vector<int> v;',
  '#!/bin/bash', 'echo "$HOME"', 'let x = 42;', 'const y = () => {};', 'print(f"{x:>10}")',
  'import numpy as np', 'np.array([1, 2, 3])', '<html><body></body></html>', '/* comment */',
  '// line comment', '-- sql comment', 'x == y != z', 'a->b', 'a::b', '@property', '0xDEADBEEF',
  'SELECT id, name FROM users;', 'fn add(a: i32) -> i32 { a + 1 }', '{"a": 1}', '[[1,2],[3,4]]',
  // numbers
  '0', '7', '42', '123', '1234', '12345', '9876543210', '3.14', '-17', '+1', '1e10', '1,234.56',
  '2023', '100%', '$19.99', '€5', '¥1000', '٠١٢٣', '०१२', '௧௨', '〇', '²³', '¼',
  // CJK and other scripts
  '你好', '世界', '我们', '中华人民共和国', '東京', 'こんにちは', 'カタカナ', 'ｶﾀｶﾅ', '안녕하세요', '한글',
  'Привет', 'мир', 'Ёлка', 'Ελληνικά', 'العربية', 'مرحبا', 'עברית', 'שלום', 'हिन्दी', 'नमस्ते',
  'ภาษาไทย', 'สวัสดี', 'Tiếng Việt', 'Türkçe', 'Polski', 'ﷺ', 'ﷲ', 'ᚠᛇᚻ', 'ⴰⵣⵓⵍ', '𐌰𐌱',
  'ñ', 'ß', 'ẞ', 'ﬁ', 'Ω', 'Ω', 'K', 'Å', 'ǈ', 'İ', 'ı', 'ſ', 'ΐ', 'ŉ',
  // combining marks
  'e\u0301', 'a\u0308', 'n\u0303', 'o\u0302\u0323', 'Z\u0336', 'q\u0307\u0323', '\u0301', 'ᄀ\u1161',
  // emoji
  '😀', '😂', '🤖', '🚀', '👍', '👍🏻', '👍🏿', '👨‍💻', '👩‍❤️‍👨', '👨‍👩‍👧', '🏴‍☠️', '🇩🇪', '🇫🇷', '✨', '❤️', '☺', '🫠', '🧑🏾‍🚀',
  // special-token spellings
  '<s>', '</s>', '<unk>', '<|begin_of_text|>', '<|end_of_text|>', '<|eot_id|>', '<|start_header_id|>',
  '<|end_header_id|>', '<|im_start|>', '<|im_end|>', '<|endoftext|>', '<｜begin▁of▁sentence｜>',
  '<｜end▁of▁sentence｜>', '<｜User｜>', '<｜Assistant｜>', '<think>', '</think>', '<|reserved_special_token_3|>',
  '<tool_call>', '<|fim_pad|>', '<|vision_start|>', '<|', '|>', '<｜', '｜>', '▁', '<0x41>',
  // punctuation and symbols
  '!', '?', '...', '…', ',', ';', ':', '(', ')', '[', ']', '{', '}', '"', "'", '`', '~', '^', '|',
  '\\', '/', '-', '—', '–', '_', '*', '&', '%', '#', '@', '©', '®', '™', '§', '¶', '•', '→', '∀x∈ℝ',
  '≤', '≠', '∞', '√2', '∑', '°C', '℃', '♠♥', '☃', '♪',
];
const SEPS = [' ', ' ', ' ', ' ', '', '', '  ', '   ', '\t', '\n', '\n\n', '\r\n', ' \n', '\n ',
  '      ', '\t\t', '\u00a0', '\u3000', '\u2009', '\u200b', '\u200d', '\u2028', '\u0085', '\v', '\f'];

function genString(rnd) {
  const n = 1 + Math.floor(rnd() * 12);
  let s = rnd() < 0.15 ? SEPS[Math.floor(rnd() * SEPS.length)] : '';
  for (let i = 0; i < n; i++) {
    let f = FRAGMENTS[Math.floor(rnd() * FRAGMENTS.length)];
    const r = rnd();
    if (r < 0.05) f = f.toUpperCase();
    else if (r < 0.08) f = f.repeat(2 + Math.floor(rnd() * 5));
    else if (r < 0.10) f = String(Math.floor(rnd() * 1e15));
    s += f;
    if (i + 1 < n || rnd() < 0.1) s += SEPS[Math.floor(rnd() * SEPS.length)];
  }
  return s;
}

function randomCodepoints(rnd) {
  // Assorted code points from many blocks (never surrogates).
  const ranges = [[0x20, 0x7e], [0xa0, 0x24f], [0x370, 0x52f], [0x590, 0x6ff], [0x900, 0x97f],
    [0xe00, 0xe7f], [0x1100, 0x11ff], [0x2000, 0x206f], [0x2100, 0x22ff], [0x3000, 0x30ff],
    [0x4e00, 0x9fff], [0xac00, 0xd7a3], [0xf900, 0xfaff], [0xfe00, 0xffef], [0x1f300, 0x1faff],
    [0x10000, 0x1014f], [0x1d400, 0x1d7ff], [0x20000, 0x2a6df], [0xe0000, 0xe007f]];
  const n = 1 + Math.floor(rnd() * 20);
  let s = '';
  for (let i = 0; i < n; i++) {
    const [a, b] = ranges[Math.floor(rnd() * ranges.length)];
    s += String.fromCodePoint(a + Math.floor(rnd() * (b - a + 1)));
  }
  return s;
}

// Adversarial strings: rare white space and format characters, combining marks, Hangul
// jamo, case-folding oddities and code points from every plane up to U+2FFFF (assigned in
// newer Unicode versions or not at all), where regex engines' Unicode tables disagree.
const RARE = [' ', '  ', '\t', '\n', '\r\n', '\u00a0', '\u180e', '\ufeff', '\u2028', '\u3000',
  '\u200b', '\u0301', '\u0308', '\u1161', '\u11a8', '\u3099', '\u309a', "'", 's', "'S", "'ll",
  '0', '٣', 'Ⅻ', 'ǅ', 'İ', 'ß', 'ﬃ', 'ᾼ', '\u0345'];

function adversarial(rnd) {
  let s = '';
  const n = 1 + Math.floor(rnd() * 15);
  for (let k = 0; k < n; k++) {
    const x = rnd();
    let cp;
    if (x < 0.4) { s += RARE[Math.floor(rnd() * RARE.length)]; continue; }
    if (x < 0.7) cp = Math.floor(rnd() * 0x30000);
    else if (x < 0.85) cp = 0x1100 + Math.floor(rnd() * 0x200);
    else cp = 0xac00 + Math.floor(rnd() * 0x2c00);
    if (cp >= 0xd800 && cp < 0xe000) cp = 0x41;
    s += String.fromCodePoint(cp);
  }
  return s;
}

function corpus() {
  const file = path.join(__dirname, '..', 'data', 'tokenizer_cases.jsonl');
  const out = fs.readFileSync(file, 'utf8').split('\n').filter((l) => l.length).map((l) => JSON.parse(l));
  const rnd = mulberry32(20240611);
  for (let i = 0; i < 1800; i++) out.push(genString(rnd));
  for (let i = 0; i < 250; i++) out.push(randomCodepoints(rnd));
  for (let i = 0; i < 20; i++) out.push(genString(rnd).repeat(20)); // long texts
  for (let i = 0; i < 400; i++) out.push(adversarial(rnd));
  // Soak testing: WELD_TOK_CORPUS_EXTRA=N appends N more strings from a second seed
  // (WELD_TOK_CORPUS_SEED); the committed test runs without it.
  const extra = parseInt(process.env.WELD_TOK_CORPUS_EXTRA || '0', 10);
  const rnd2 = mulberry32(parseInt(process.env.WELD_TOK_CORPUS_SEED || '7', 10));
  for (let i = 0; i < extra; i++) out.push(i % 8 === 7 ? randomCodepoints(rnd2) : genString(rnd2));
  return out;
}

module.exports = { corpus };

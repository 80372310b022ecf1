/*
 * tokenizer - text <-> token ids, byte-exact with Hugging Face `tokenizers`.
 *
 * One struct tokenizer holds a whole Hugging Face-style pipeline, loaded either from a
 * tokenizer.json (tokenizer_load_hf) or from GGUF metadata (tokenizer_load_gguf):
 *
 *   text -> split out added/special tokens (leftmost-longest; unnormalized ones on the raw
 *           text, normalized ones after normalization)
 *        -> normalizers (NFC/NFKC/NFD/NFKD, Prepend, Replace, Lowercase, Sequence)
 *        -> pre-tokenizers (regex Split, ByteLevel, Digits, Metaspace, Sequence)
 *        -> model: BPE by merge rank (tokenizer.json; byte-level or SentencePiece-style with
 *           byte fallback) or SentencePiece BPE by score (GGUF "llama", llama.cpp semantics)
 *        -> post-processor (TemplateProcessing: BOS/EOS; ByteLevel adds nothing)
 *   ids  -> decoders (ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip) -> text
 *
 * Text must be valid UTF-8 (tokenizer_encode rejects anything else, naming the byte
 * offset). A loaded tokenizer is immutable except for an internal per-word BPE cache that
 * is guarded by a mutex, so one tokenizer may be shared by threads.
 *
 * Streaming: a struct detok turns ids into text one at a time. It keeps a short window of
 * recent ids, decodes the window and emits only the part after what the window's prefix
 * already produced, once that part does not end in U+FFFD (a partial character): the same
 * rule as Hugging Face's DecodeStream. Concatenating every detok_push output and the
 * detok_flush output equals tokenizer_decode of the whole sequence.
 */
#ifndef WELD_TOKENIZER_H
#define WELD_TOKENIZER_H

#include "core/err.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct tokenizer;
struct gguf_file;
struct detok;

/* GGUF metadata (tokenizer.ggml.*): model "llama" (SentencePiece BPE by score, byte fallback)
   or "gpt2" (byte-level BPE with merges; tokenizer.ggml.pre picks the pre-tokenizer regex). */
int tokenizer_load_gguf(struct tokenizer **out, const struct gguf_file *f, struct weld_err *e);
/* Whether a GGUF without tokenizer.ggml.add_bos_token adds BOS: llama.cpp's default for the
   tokenizer.ggml.model / .pre pair (yes for "llama" and for the Llama 3 pre-tokenizer
   "llama-bpe"/"llama3", no otherwise). */
bool tokenizer_gguf_default_add_bos(const char *model, const char *pre);
/* path: a tokenizer.json or a directory holding one; tokenizer_config.json and
   generation_config.json beside it are read when present. */
int tokenizer_load_hf(struct tokenizer **out, const char *path, struct weld_err *e);
/* A tokenizer.json already in memory; `where` names it in errors. */
int tokenizer_load_hf_json_buf(struct tokenizer **out, const char *buf, size_t len,
                               const char *where, struct weld_err *e);
void tokenizer_free(struct tokenizer *t);

/* Encode len bytes of text. add_special: apply the post-processor (BOS/EOS), like HF's
   add_special_tokens. parse_special: special tokens spelled in the text become their ids
   (non-special added tokens always do, as in HF). *ids is a heap array (wfree) of *n_ids. */
int tokenizer_encode(const struct tokenizer *t, const char *text, size_t len, bool add_special,
                     bool parse_special, int32_t **ids, size_t *n_ids, struct weld_err *e);
/* HF decode(ids, skip_special_tokens): ids out of range are ignored. *out is NUL-terminated
   heap memory (wfree); *len excludes the NUL. */
int tokenizer_decode(const struct tokenizer *t, const int32_t *ids, size_t n, bool skip_special,
                     char **out, size_t *len, struct weld_err *e);

int tokenizer_n_vocab(const struct tokenizer *t);
int tokenizer_bos(const struct tokenizer *t); /* -1 if none */
int tokenizer_eos(const struct tokenizer *t); /* -1 if none */
/* End of generation: EOS, EOT, <|im_end|>, <|eot_id|>, generation_config eos ids ... */
bool tokenizer_is_eog(const struct tokenizer *t, int32_t id);
/* A special (control) token: skipped by decode(skip_special). */
bool tokenizer_is_special(const struct tokenizer *t, int32_t id);
const char *tokenizer_chat_template(const struct tokenizer *t); /* NULL if none */
const char *tokenizer_bos_text(const struct tokenizer *t);      /* NULL if none */
const char *tokenizer_eos_text(const struct tokenizer *t);      /* NULL if none */
/* The raw vocabulary entry of id (not NUL-terminated-safe: use *len); NULL if out of range. */
const char *tokenizer_token_text(const struct tokenizer *t, int32_t id, size_t *len);
/* The bytes token id stands for in the middle of a text, as a byte-level constraint sees
   it: the decoder chain without its start-of-text rules or UTF-8 repair (a byte token is
   its byte). *out: a NUL-terminated allocation of *len bytes (wfree it). */
int tokenizer_token_bytes(const struct tokenizer *t, int32_t id, char **out, size_t *len);
/* Id of an exact vocabulary entry or added token; -1 if none. */
int32_t tokenizer_token_id(const struct tokenizer *t, const char *text, size_t len);

/* Streaming detokenizer (see the top of this file). NULL on out of memory. */
struct detok *detok_create(const struct tokenizer *t, bool skip_special);
/* Push one id (id < 0: push nothing, only drain); writes newly completed text to out, at most
   cap bytes and only whole characters, and returns the number of bytes written. Text that
   did not fit stays pending and comes out of the next push or flush. */
size_t detok_push(struct detok *d, int32_t id, char *out, size_t cap);
/* Seed a fresh stream with the ids before the ones to decode (a prompt; only its last few
   matter): their text is not output, and pushed ids decode as a continuation of them, as
   vLLM's incremental detokenizer does (" Once" after a prompt, not "Once"). */
void detok_prime(struct detok *d, const int32_t *ids, size_t n);
/* Write what is still held back (a trailing partial character becomes U+FFFD, as in
   decode), at most cap bytes; returns the bytes written. Call again while it returns > 0. */
size_t detok_flush(struct detok *d, char *out, size_t cap);
void detok_free(struct detok *d);

#endif

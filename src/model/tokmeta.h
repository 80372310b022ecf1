/*
 * tokmeta - tokenizer metadata as files carry it: Hugging Face tokenizer.json (+
 * tokenizer_config.json, generation_config.json) on one side, GGUF tokenizer.* keys on the
 * other, and the conversions between them (the way llama.cpp's convert_hf_to_gguf.py maps
 * them, re-derived in C).
 *
 * This works on the FILE FORMATS only, never on the tokenizer engine: it does not
 * tokenize. A struct tokmeta is the common middle: one row per token id 0..n_tokens-1
 * (text, GGUF token type, score), BPE merges as "left right" strings, special ids and the
 * add-BOS/EOS flags, the chat template. Two families are supported:
 *   "gpt2"  byte-level BPE (Llama 3, Qwen2/3, DeepSeek V3): tokens in the byte-to-unicode
 *           form tokenizer.json uses ("Ġthe"), merges kept, pre-tokenizer named by `pre`
 *           ("llama-bpe", "qwen2", "deepseek-v3").
 *   "llama" SentencePiece-style BPE with byte fallback (Llama 2, stories260K): tokens with
 *           U+2581 for spaces, <0xXX> byte tokens, scores instead of merges.
 *
 * Scores for "llama" from tokenizer.json: llama.cpp's LlamaHfVocab writes -1000 for every
 * token, which leaves its SentencePiece tokenizer nothing to rank merges by. We rank by
 * the merges instead: each merge's result token, in merge order, gets the next score 0,
 * -1, -2, ...; normal tokens no merge produces follow in id order; byte, control and
 * unknown tokens score 0. For a SentencePiece file stored in score order (stories260K:
 * score = -(id - 259)) this gives back the original scores, so GGUF -> HF -> GGUF keeps
 * them.
 * Merges for "llama" going to tokenizer.json are derived from the scores like HF's
 * SentencePieceExtractor: every split of a normal piece into two pieces both in the
 * vocabulary, ordered by the piece's score (descending), then by the ids of left and right.
 *
 * Invariants: tokens[i] != NULL for every i < n_tokens (missing ids become "[PAD<i>]" with
 * type UNUSED); special ids are -1 or < n_tokens; flags are -1 (unset), 0 or 1.
 * Not done: WordPiece/Unigram models, tokenizer.model (protobuf) files, added tokens that
 * need normalization round trips (we keep their text as is).
 */
#ifndef WELD_MODEL_TOKMETA_H
#define WELD_MODEL_TOKMETA_H

#include "core/err.h"
#include "format/gguf.h"

#include <stdint.h>

/* GGUF token types (llama.cpp's llama_token_type). */
enum tokmeta_type {
    TOKMETA_NORMAL = 1,
    TOKMETA_UNKNOWN = 2,
    TOKMETA_CONTROL = 3,
    TOKMETA_USER_DEFINED = 4,
    TOKMETA_UNUSED = 5,
    TOKMETA_BYTE = 6,
};

struct tokmeta {
    char model[16];        /* "gpt2" | "llama" */
    char pre[32];          /* gpt2: "llama-bpe" | "qwen2" | "deepseek-v3" | "default" (GPT-2)
                              (| "custom" with TOKMETA_PRE_ANY); llama: "default" */
    int64_t n_tokens;
    char **tokens;         /* (n_tokens) NUL-terminated UTF-8 */
    float *scores;         /* (n_tokens) */
    int32_t *types;        /* (n_tokens) enum tokmeta_type */
    int64_t n_merges;
    char **merges;         /* (n_merges) "left right"; written to GGUF for gpt2 only; a
                              llama tokmeta read from GGUF has none (derived on output) */
    int64_t bos, eos, unk, pad; /* token ids, -1 if none */
    int add_bos, add_eos;  /* -1 unset (the reader's default applies), else 0/1 */
    int add_space_prefix;  /* llama: -1 unset, else 0/1 */
    char *chat_template;   /* or NULL */
};

/*
 * Read a Hugging Face tokenizer: `path` is tokenizer.json or a directory holding it;
 * tokenizer_config.json and generation_config.json next to it are read when present.
 * pre_hint (NULL: detect from the pre-tokenizer regexes) names the gpt2 pre-tokenizer;
 * TOKMETA_PRE_ANY detects too, but a pre-tokenizer of no known family gives pre "custom"
 * instead of WELD_ERR_UNSUPPORTED (for showing it: GGUF has no name for it). A lone
 * ByteLevel with its own regex (GPT-2's tokenizer.json) is "default".
 * n_vocab_min pads the token list with "[PAD<i>]" up to that many ids (a model's
 * vocab_size may exceed the tokenizer's).
 */
#define TOKMETA_PRE_ANY "*"
int tokmeta_from_hf(struct tokmeta **out, const char *path, const char *pre_hint,
                    int64_t n_vocab_min, struct weld_err *e);
/* Read the tokenizer.* keys of a GGUF file. */
int tokmeta_from_gguf(struct tokmeta **out, const struct gguf_file *f, struct weld_err *e);
void tokmeta_free(struct tokmeta *t);

/* Write the tokenizer.* keys (and chat template) into a GGUF writer. */
int tokmeta_to_gguf(const struct tokmeta *t, struct gguf_writer *w, struct weld_err *e);
/* Write dir/tokenizer.json and dir/tokenizer_config.json (dir must exist). */
int tokmeta_to_hf(const struct tokmeta *t, const char *dir, struct weld_err *e);

/* The add-BOS flag a reader ends up with: t->add_bos, else llama.cpp's default for the
   model/pre (tokenizer_gguf_default_add_bos: true for llama, llama-bpe; false otherwise).
   tokmeta_from_hf always sets add_bos/add_eos; only a GGUF may leave them unset. */
int tokmeta_effective_add_bos(const struct tokmeta *t);

#endif

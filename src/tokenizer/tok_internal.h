/*
 * tok_internal - the data layout shared by the tokenizer's source files (not public).
 *
 * Vocabulary: vocab[id] is the token's text (heap copy, may hold NUL bytes; len given);
 * ids without an entry have s == NULL. vmap maps model-vocabulary text -> id (open
 * addressing, keys are the vocab strings themselves); added tokens live in `added` and in
 * vocab[] but are only put in vmap when the model vocabulary already has them, as in HF.
 * merges maps the id pair (a, b) -> (rank, merged id). Pipeline stages are arrays of small
 * tagged structs applied in order. Everything is filled once at load time and then only
 * read, except `cache` (per-word BPE results), which has its own mutex.
 */
#ifndef WELD_TOKENIZER_TOK_INTERNAL_H
#define WELD_TOKENIZER_TOK_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/tokenizer.h"

#include <pcre2.h>
#include <pthread.h>

struct tok_str {
    char *s; /* NULL: no token with this id */
    uint32_t len;
};

/* text -> id, open addressing; slot value is id + 1, 0 = empty. */
struct tok_map {
    uint32_t *slots;
    size_t cap; /* power of two */
    size_t n;
};

/* (a, b) -> (rank, merged id). */
struct tok_merge_slot {
    uint64_t key; /* ((uint64_t)a << 32 | b) + 1; 0 = empty */
    uint32_t rank;
    int32_t id;
};

enum tok_norm_kind {
    TOK_NORM_NFC, TOK_NORM_NFD, TOK_NORM_NFKC, TOK_NORM_NFKD, TOK_NORM_PREPEND,
    TOK_NORM_REPLACE, TOK_NORM_LOWERCASE, TOK_NORM_STRIP
};
struct tok_norm {
    enum tok_norm_kind kind;
    char *a;           /* Prepend: text; Replace: pattern string (when re == NULL) */
    size_t alen;
    char *b;           /* Replace: content */
    size_t blen;
    pcre2_code *re;    /* Replace with a Regex pattern */
    bool left, right;  /* Strip */
};

enum tok_split_behavior {
    TOK_SPLIT_REMOVED, TOK_SPLIT_ISOLATED, TOK_SPLIT_MERGED_PREV, TOK_SPLIT_MERGED_NEXT,
    TOK_SPLIT_CONTIGUOUS
};
enum tok_pre_kind { TOK_PRE_SPLIT, TOK_PRE_BYTELEVEL, TOK_PRE_DIGITS, TOK_PRE_METASPACE };
enum tok_prepend { TOK_PREPEND_ALWAYS, TOK_PREPEND_FIRST, TOK_PREPEND_NEVER };
struct tok_pre {
    enum tok_pre_kind kind;
    pcre2_code *re;                 /* Split; ByteLevel with use_regex (GPT-2 pattern) */
    enum tok_split_behavior behavior;
    bool invert;
    bool add_prefix_space;          /* ByteLevel */
    bool individual;                /* Digits */
    char repl[8];                   /* Metaspace replacement (UTF-8) */
    size_t repl_len;
    enum tok_prepend prepend;       /* Metaspace */
    bool split;                     /* Metaspace */
};

enum tok_dec_kind {
    TOK_DEC_BYTELEVEL, TOK_DEC_METASPACE, TOK_DEC_REPLACE, TOK_DEC_BYTEFALLBACK, TOK_DEC_FUSE,
    TOK_DEC_STRIP
};
struct tok_dec {
    enum tok_dec_kind kind;
    char *a, *b;          /* Replace: pattern -> content; Metaspace: a = replacement */
    size_t alen, blen;
    uint32_t strip_ch;    /* Strip: content code point */
    int start, stop;      /* Strip */
    enum tok_prepend prepend;
};

struct tok_added {
    char *text;
    size_t len;
    int32_t id;
    bool special, lstrip, rstrip, single_word, normalized;
    int next; /* next added token with the same first byte, longer first; -1 = end */
};

enum tok_model { TOK_MODEL_BPE, TOK_MODEL_SPM };

struct tok_cache_ent {
    uint64_t hash;
    char *word;
    uint32_t len;
    int32_t *ids;
    uint32_t n_ids;
};
struct tok_cache {
    pthread_mutex_t lock;
    struct tok_cache_ent *ents; /* cap slots, direct-mapped by hash */
    size_t cap;
};

#define TOK_MAX_STAGES 16

struct tokenizer {
    int32_t n_vocab;          /* max id + 1 over model and added tokens */
    struct tok_str *vocab;    /* (n_vocab) */
    uint8_t *special;         /* (n_vocab) 1 = special added token (skipped by skip_special) */
    uint8_t *eog;             /* (n_vocab) 1 = ends generation */
    float *scores;            /* (n_vocab) SPM only, else NULL */
    struct tok_map vmap;

    enum tok_model model;
    struct tok_merge_slot *merges; /* merge_cap slots */
    size_t merge_cap;
    bool byte_fallback, fuse_unk, ignore_merges;
    int32_t unk_id;
    char *cont_prefix, *eow_suffix; /* NULL when unset */
    int32_t byte_id[256];     /* <0xXX> tokens, -1 if absent */

    struct tok_norm norms[TOK_MAX_STAGES];
    int n_norms;
    struct tok_pre pres[TOK_MAX_STAGES];
    int n_pres;
    struct tok_dec decs[TOK_MAX_STAGES];
    int n_decs;

    struct tok_added *added;
    int n_added;
    int added_head[256];      /* first added token by first byte, -1 = none */
    bool any_normalized_added;

    int32_t *post_pre, *post_post; /* ids added before / after the sequence (add_special) */
    int n_post_pre, n_post_post;

    int32_t bos, eos, eot, unk, pad;
    char *chat_template;

    struct tok_cache *cache;
};

/* tokenizer.c */
uint64_t tok_hash(const void *s, size_t len);
int tok_map_put(struct tokenizer *t, int32_t id);   /* vocab[id] must be set */
int32_t tok_map_get(const struct tokenizer *t, const char *s, size_t len);
int tok_merge_put(struct tokenizer *t, int32_t a, int32_t b, uint32_t rank, int32_t id);
const struct tok_merge_slot *tok_merge_get(const struct tokenizer *t, int32_t a, int32_t b);
int tok_set_token(struct tokenizer *t, int32_t id, const char *s, size_t len);
int tok_alloc_vocab(struct tokenizer *t, int32_t n);
int tok_add_added(struct tokenizer *t, const struct tok_added *a); /* copies a->text */
int tok_finish(struct tokenizer *t, const char *where, struct weld_err *e);
struct tokenizer *tok_new(void);

/* tok_utf8.c */
int tok_utf8_next(const char *s, size_t len, size_t i, uint32_t *cp); /* bytes, 0 = invalid */
size_t tok_utf8_valid_prefix(const char *s, size_t len); /* length of the valid prefix */
extern const uint16_t tok_byte_to_cp[256];
int tok_cp_to_byte(uint32_t cp); /* GPT-2 byte-level map inverse, -1 if not mapped */

/* growable byte buffer */
struct tok_buf {
    char *p;
    size_t n, cap;
};
int tok_buf_put(struct tok_buf *b, const void *s, size_t n);
int tok_buf_putc(struct tok_buf *b, char c);
/* Copy exactly n bytes (NUL bytes included) plus a terminating NUL; NULL on no memory. */
char *tok_memdup(const char *s, size_t n);
/* Append s with invalid UTF-8 replaced the way Rust's String::from_utf8_lossy does. */
int tok_buf_put_lossy(struct tok_buf *b, const char *s, size_t n);

/* tok_norm.c: normalize / pre-tokenize */
int tok_normalize(const struct tokenizer *t, const char *s, size_t n, struct tok_buf *out);
/* Split one piece into pre-tokens: appends (offset, len) pairs into words (offsets into
   *text_out, which the function fills). first: the piece starts the input (Metaspace). */
struct tok_span {
    size_t off, len;
};
struct tok_spans {
    struct tok_span *v;
    size_t n, cap;
};
int tok_spans_push(struct tok_spans *s, size_t off, size_t len);
int tok_pretokenize(const struct tokenizer *t, const char *s, size_t n, bool first,
                    struct tok_buf *text_out, struct tok_spans *words);
pcre2_code *tok_regex_compile(const char *pat, size_t len, bool literal, char *errbuf,
                              size_t errcap);
/* pcre2_match with the process's match limit (WELD_REGEX_MATCH_LIMIT, read once; else
   PCRE2's default). A negative PCRE2 status other than NOMATCH is kept for
   tok_regex_error() (per thread). */
int tok_regex_match(const pcre2_code *re, const char *s, size_t n, size_t pos,
                    pcre2_match_data *md);
/* PCRE2 status -> WELD_ERR_LIMIT (match, depth, heap or JIT stack limit), WELD_ERR_NOMEM or
   WELD_ERR_INTERNAL. */
int tok_regex_status(int pcre2_rc);
/* The last failing tok_regex_match on this thread as a sentence for an error message
   ("internal error" if none), then forgotten. */
void tok_regex_error(char *buf, size_t cap);
/* The GPT-2 pre-tokenizer regex (ByteLevel use_regex) and the ones llama.cpp names in
   tokenizer.ggml.pre, as the matching tokenizer.json files spell them. */
extern const char tok_re_gpt2[], tok_re_llama3[], tok_re_qwen2[], tok_re_dsv3_digits[],
    tok_re_dsv3_cjk[], tok_re_dsv3_main[];
/* Shared tail of both loaders: mark EOS, EOT and the usual end-of-turn tokens as EOG. */
void tok_mark_eog(struct tokenizer *t);

/* tok_bpe.c: model */
struct tok_ids {
    int32_t *v;
    size_t n, cap;
};
int tok_ids_push(struct tok_ids *ids, int32_t id);
int tok_model_encode(const struct tokenizer *t, const char *w, size_t n, struct tok_ids *out);
struct tok_cache *tok_cache_create(void);
void tok_cache_free(struct tok_cache *c);

#endif

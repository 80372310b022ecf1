/*
 * vocab - a model's vocabulary as a constraint sees it, and token masks.
 *
 * Each token's bytes (tokenizer_token_bytes: what it appends in the middle of a text),
 * sorted, with the common prefix length of each with the one before, so a mask walks the
 * vocabulary as a trie: the matcher state after each prefix is kept by depth, a token
 * sharing a prefix with the previous one starts from that depth, and once a prefix is
 * refused every following token sharing it is skipped without a step. Special tokens
 * never match inside a constraint; the end-of-generation ones are allowed exactly where
 * the grammar may end. Tokens of no bytes are never allowed (they would not advance).
 */
#ifndef WELD_GRAMMAR_VOCAB_H
#define WELD_GRAMMAR_VOCAB_H

#include "core/err.h"
#include "grammar/grammar.h"

#include <stdbool.h>
#include <stdint.h>

struct tokenizer;

struct gvocab {
    int n_vocab;
    char **bytes;   /* (n_vocab) each token's bytes, NULL for special tokens */
    uint32_t *len;  /* (n_vocab) */
    int32_t *order; /* (n_order) the byte tokens by their bytes */
    uint32_t *lcp;  /* (n_order) common prefix with the one before (0 for the first) */
    int n_order;
    int32_t *eog; /* (n_eog) end-of-generation ids */
    int n_eog;
    uint32_t max_len;
};

/* n_vocab: the model's vocabulary when larger than the tokenizer's (a padded LM head: the
   ids past the tokenizer's are never allowed); else 0. */
int gvocab_create(struct gvocab **out, const struct tokenizer *t, int n_vocab,
                  struct weld_err *e);
void gvocab_free(struct gvocab *v);

/* s[0, n) as tokens, each the longest whose bytes start what is left (at most max; stops
   where no token fits): the tokens a forced text is drafted as. */
int gvocab_greedy_tokens(const struct gvocab *v, const uint8_t *s, int n, int32_t *out, int max);

/* Bit i of mask ((n_vocab + 31) / 32 words): token i may come next from m's state. */
int gmatch_mask(struct gmatch *m, const struct gvocab *v, uint32_t *mask, struct weld_err *e);

#endif

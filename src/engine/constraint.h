/*
 * constraint - the engine's compiled constraints: GBNF text -> struct grammar, cached by
 * the text, and the model's vocabulary as the matchers see it (grammar/vocab.h).
 *
 * Requests name their constraint by its text (request_params.grammar); a server sees the
 * same schema or tool list again and again, so compiled grammars stay in a small cache
 * (CONSTRAINT_CACHE entries, least recently used dropped first, never one a request still
 * holds), each with the space its matchers share, where the token masks of the states
 * met so far are kept (grammar/match.c; at most GSPACE_BUDGET each, and of the grammars
 * no request holds, CONSTRAINT_IDLE_BYTES in all). The vocabulary's bytes are made on the first constrained request (a pass over
 * the vocabulary, ~20 ms at 150k tokens) and kept.
 *
 * Not thread-safe: the engine's thread owns it.
 */
#ifndef WELD_ENGINE_CONSTRAINT_H
#define WELD_ENGINE_CONSTRAINT_H

#include "core/err.h"

#include <stdint.h>

#define CONSTRAINT_CACHE 64                       /* compiled grammars kept idle */
#define CONSTRAINT_IDLE_BYTES ((size_t)128 << 20) /* their cached states and masks */

struct tokenizer;
struct gspace;
struct gvocab;
struct constraints;
struct constraint;

int constraints_create(struct constraints **out, const struct tokenizer *tok, int n_vocab,
                       struct weld_err *e);
void constraints_free(struct constraints *c);
/* text's grammar, compiled now or found in the cache, with a reference the caller drops
   with constraint_release; *v gets the vocabulary. A compile error names the line and
   column (WELD_ERR_INVALID_ARG); no tokenizer is WELD_ERR_INVALID_ARG too. */
int constraint_get(struct constraints *c, const char *text, struct constraint **out,
                   const struct gvocab **v, struct weld_err *e);
void constraint_release(struct constraints *c, struct constraint *k);
/* The space its matchers share (grammar.h): states and token masks met by one request
   are there for the next. */
struct gspace *constraint_space(const struct constraint *k);
/* Cache lookups that found the text compiled, and compiles. */
void constraints_counts(const struct constraints *c, uint64_t *hits, uint64_t *compiles);

#endif

/*
 * batch - one forward step: a list of sequences, each with a span of new tokens.
 *
 * A prefill chunk and a one-token decode are the same thing: sequence s feeds
 * tokens[0..n_tokens) at positions pos, pos+1, ...; the KV cache must already hold
 * positions [0, pos) of that sequence (pos may be below what the cache holds: the
 * sequence is then truncated to pos first, which is how a rejected speculative draft or a
 * re-run is undone).
 *
 * Flattened layout used by everything below: tokens are numbered seq by seq in batch
 * order (token index t = sum of earlier sequences' n_tokens + i). Logit rows are numbered
 * the same way: a sequence with all_logits gives one row per token, otherwise one row for
 * its last token. The caller's logits buffer is (batch_n_logit_rows, n_vocab).
 *
 * A batch only points at caller memory; it owns nothing. A sequence's numbers never
 * depend on what else is in the batch (see kernels/cpu/kernels.h).
 */
#ifndef WELD_EXEC_BATCH_H
#define WELD_EXEC_BATCH_H

#include "core/err.h"

#include <stdbool.h>
#include <stdint.h>

struct batch_seq {
    int seq_id;             /* [0, max_seqs) of the runner; unique within a batch */
    const int32_t *tokens;  /* (n_tokens) token ids */
    int n_tokens;           /* >= 1 */
    int pos;                /* position of tokens[0] */
    bool all_logits;        /* true: logits for every token; false: last token only */
};

struct batch {
    const struct batch_seq *seqs; /* (n_seqs) */
    int n_seqs;                   /* >= 1 */
};

/* Total tokens and logit rows of a batch (no validation: call batch_validate first). */
int batch_n_tokens(const struct batch *b);
int batch_n_logit_rows(const struct batch *b);

/* Check a batch against the runner's limits: seq ids in [0, max_seqs) and unique, tokens
   in [0, n_vocab), n_tokens >= 1, pos >= 0, pos + n_tokens <= max_ctx (WELD_ERR_LIMIT
   otherwise), totals that fit in an int. */
int batch_validate(const struct batch *b, int max_seqs, int max_ctx, int n_vocab,
                   struct weld_err *e);

#endif

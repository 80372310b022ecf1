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
 * KV placement (the step plan of the engine's KV block manager; see exec/kv.h):
 *   - engine tables (the primary design): every sequence carries `blocks`, the physical
 *     KV block ids of its positions (position p lives in block blocks[p / block_size],
 *     slot p % block_size). The backend reads positions [0, pos) from those blocks and
 *     writes [pos, pos + n_tokens) into them; it never recomputes or checks what the
 *     blocks hold, so a table may start with blocks another sequence computed (a cached
 *     prefix). Only the first ceil((pos + n_tokens) / block_size) entries are read; a
 *     block written this step may appear in no other sequence of the batch.
 *     `copies` lists whole-block copies (all layers, K and V) done in list order before
 *     the step: copy-on-write of a shared, partially filled last block for n > 1.
 *   - internal allocator (runner callers such as the CLI): no sequence carries a table,
 *     no copies; the backend keeps each seq_id's blocks itself (truncate/prepare).
 *   A batch is one or the other, never a mix.
 *
 * A batch only points at caller memory; it owns nothing. A sequence's numbers never
 * depend on what else is in the batch, its chunking, or which blocks hold its prefix
 * (see kernels/cpu/kernels.h).
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
    const int32_t *blocks;  /* (n_blocks) physical KV block ids chosen by the engine, or
                               NULL: the backend's internal allocator places seq_id */
    int n_blocks;           /* >= ceil((pos + n_tokens) / block_size) when blocks is set */
    const float *embeds;    /* (n_tokens, dim) the input rows in place of the tokens'
                               embeddings (tokens still name the ids), or NULL; on every
                               sequence of a batch or on none */
    bool all_hidden;        /* runner_forward_hidden: the final hidden state of every token,
                               not only of the logit rows (batch_n_hidden_rows) */
};

/* Copy physical KV block src to dst (every layer, K and V) before a step. */
struct kv_block_copy {
    int32_t src, dst;
};

struct batch {
    const struct batch_seq *seqs;        /* (n_seqs) */
    int n_seqs;                          /* >= 1 */
    const struct kv_block_copy *copies;  /* (n_copies), done in order; engine tables only */
    int n_copies;
    bool copies_fill; /* a copy may fill a block sequences only read this
                                            step (a proposer completing a block it then
                                            reads); else a copy target must be one its
                                            sequence writes (copy-on-write) or unused */
};

/* Total tokens and logit rows of a batch (no validation: call batch_validate first). */
int batch_n_tokens(const struct batch *b);
int batch_n_logit_rows(const struct batch *b);
/* Rows of runner_forward_hidden's output: the logit rows, then the tokens of all_hidden
   sequences that are not logit rows, in batch order. */
int batch_n_hidden_rows(const struct batch *b);

/* Check a batch against the runner's limits: seq ids in [0, max_seqs) and unique, tokens
   in [0, n_vocab), n_tokens >= 1, pos >= 0, pos + n_tokens <= max_ctx (WELD_ERR_LIMIT
   otherwise), totals that fit in an int; tables on all sequences or none, n_blocks >= 0
   with a non-NULL array, n_copies >= 0 with a non-NULL array and only with tables. Block
   ids are checked against the pool by the backend (kv_check_tables). */
bool batch_has_tables(const struct batch *b);
int batch_validate(const struct batch *b, int max_seqs, int max_ctx, int n_vocab,
                   struct weld_err *e);

#endif

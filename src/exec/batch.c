/*
 * batch - counting and validating a step's batch (see batch.h for the layout).
 *
 * Validation is the one place caller-supplied step data is checked; everything below the
 * runner (program, executor, KV cache) trusts a validated batch.
 */
#include "exec/batch.h"

#include <limits.h>

int batch_n_tokens(const struct batch *b)
{
    int n = 0;
    for (int i = 0; i < b->n_seqs; i++)
        n += b->seqs[i].n_tokens;
    return n;
}

int batch_n_logit_rows(const struct batch *b)
{
    int n = 0;
    for (int i = 0; i < b->n_seqs; i++)
        n += b->seqs[i].all_logits ? b->seqs[i].n_tokens : 1;
    return n;
}

int batch_n_hidden_rows(const struct batch *b)
{
    int n = batch_n_logit_rows(b);
    for (int i = 0; i < b->n_seqs; i++)
        if (b->seqs[i].all_hidden && !b->seqs[i].all_logits)
            n += b->seqs[i].n_tokens - 1;
    return n;
}

static int check_seq(const struct batch_seq *s, int i, int max_seqs, int max_ctx,
                     int n_vocab, struct weld_err *e)
{
    if (s->seq_id < 0 || s->seq_id >= max_seqs)
        return err_set(e, WELD_ERR_INVALID_ARG,
                       "batch seq %d: seq_id %d out of range [0, %d)", i, s->seq_id, max_seqs);
    if (s->n_tokens < 1 || !s->tokens)
        return err_set(e, WELD_ERR_INVALID_ARG, "batch seq %d (id %d): n_tokens %d, need >= 1",
                       i, s->seq_id, s->n_tokens);
    if (s->pos < 0)
        return err_set(e, WELD_ERR_INVALID_ARG, "batch seq %d (id %d): negative pos %d", i,
                       s->seq_id, s->pos);
    if ((long long)s->pos + s->n_tokens > max_ctx)
        return err_set(e, WELD_ERR_LIMIT,
                       "batch seq %d (id %d): positions %d..%lld exceed the context limit "
                       "max_ctx = %d",
                       i, s->seq_id, s->pos, (long long)s->pos + s->n_tokens - 1, max_ctx);
    for (int t = 0; t < s->n_tokens; t++)
        if (s->tokens[t] < 0 || s->tokens[t] >= n_vocab)
            return err_set(e, WELD_ERR_INVALID_ARG,
                           "batch seq %d (id %d): token %d = %d out of vocabulary [0, %d)", i,
                           s->seq_id, t, (int)s->tokens[t], n_vocab);
    return WELD_OK;
}

bool batch_has_tables(const struct batch *b) { return b->n_seqs > 0 && b->seqs[0].blocks; }

static int check_tables(const struct batch *b, struct weld_err *e)
{
    bool tables = batch_has_tables(b);
    for (int i = 0; i < b->n_seqs; i++) {
        const struct batch_seq *s = &b->seqs[i];
        if ((s->blocks != NULL) != tables)
            return err_set(e, WELD_ERR_INVALID_ARG,
                           "batch seq %d (id %d): %s a block table but batch seq 0 %s; a "
                           "batch uses engine tables on every sequence or on none", i,
                           s->seq_id, s->blocks ? "has" : "lacks", tables ? "has" : "lacks");
        if (s->n_blocks < 0 || (s->n_blocks > 0 && !s->blocks))
            return err_set(e, WELD_ERR_INVALID_ARG, "batch seq %d (id %d): n_blocks %d "
                           "without a block array", i, s->seq_id, s->n_blocks);
    }
    for (int i = 1; i < b->n_seqs; i++)
        if ((b->seqs[i].embeds != NULL) != (b->seqs[0].embeds != NULL))
            return err_set(e, WELD_ERR_INVALID_ARG,
                           "batch seq %d (id %d): %s input rows but batch seq 0 %s; a batch "
                           "gives embeds on every sequence or on none",
                           i, b->seqs[i].seq_id, b->seqs[i].embeds ? "has" : "lacks",
                           b->seqs[0].embeds ? "has" : "lacks");
    if (b->n_copies < 0 || (b->n_copies > 0 && !b->copies))
        return err_set(e, WELD_ERR_INVALID_ARG, "batch: n_copies %d without a copy list",
                       b->n_copies);
    if (b->n_copies > 0 && !tables)
        return err_set(e, WELD_ERR_INVALID_ARG, "batch: %d block copies but no block tables "
                       "(copies are for engine-placed KV blocks)", b->n_copies);
    return WELD_OK;
}

int batch_validate(const struct batch *b, int max_seqs, int max_ctx, int n_vocab,
                   struct weld_err *e)
{
    if (!b || b->n_seqs < 1 || !b->seqs)
        return err_set(e, WELD_ERR_INVALID_ARG, "batch: no sequences");
    if (b->n_seqs > max_seqs)
        return err_set(e, WELD_ERR_LIMIT, "batch: %d sequences, max_seqs = %d", b->n_seqs,
                       max_seqs);
    long long total = 0;
    for (int i = 0; i < b->n_seqs; i++) {
        int rc = check_seq(&b->seqs[i], i, max_seqs, max_ctx, n_vocab, e);
        if (rc)
            return rc;
        for (int j = 0; j < i; j++)
            if (b->seqs[j].seq_id == b->seqs[i].seq_id)
                return err_set(e, WELD_ERR_INVALID_ARG,
                               "batch seq %d: seq_id %d already used by batch seq %d", i,
                               b->seqs[i].seq_id, j);
        total += b->seqs[i].n_tokens;
        if (total > INT_MAX / 2)
            return err_set(e, WELD_ERR_LIMIT, "batch: more than %d tokens", INT_MAX / 2);
    }
    return check_tables(b, e);
}

/*
 * draft - the draft-model proposer (spec.h): a smaller model with the target's vocabulary
 * guesses greedily, token by token, from its own runner, every sequence of a step in one
 * batch.
 *
 * Each sequence the engine asks about gets a slot of the draft runner (a seq id of its
 * paged KV cache, exec/runner.h's internal placement) holding the tokens whose KV it
 * computed. The runner has a slot per sequence the engine runs at once (spec_limits
 * max_seqs) and a pool of as many positions as the engine's own pool holds, so the draft
 * never needs more room than the target; blocks are taken as positions are written. A
 * call (propose_batch) first rewinds each slot to the longest prefix it shares with its
 * sequence's tokens now (the guesses the target rejected fall away there), feeds the rest
 * (the accepted guesses and the target's own token; a new sequence its whole prompt) and
 * then its guesses back, one per pass, in passes of at most DRAFT_BATCH tokens across the
 * sequences, taking the argmax of each caught-up sequence's last row: k guesses for every
 * sequence in about k forward passes however many sequences there are.
 *
 * Slots go least recently used first when every one is taken (a slot in the current call
 * is never taken); a sequence whose positions do not fit in the pool drops slots of other
 * sequences, least recently used first, and otherwise gets no guesses this step. Errors of
 * the draft never reach the request: that sequence gets no guesses and its slot is reset.
 *
 * Not yet: sampled drafts (greedy guesses are checked exactly anyway), sharing the target's
 * prefix cache (a sequence that hits it is fed to the draft from its first token).
 */
#include "spec/spec.h"

#include "core/alloc.h"
#include "exec/runner.h"
#include "model/model.h"

#include <string.h>

#define DRAFT_BATCH 1024 /* tokens per catch-up forward pass */
#define DRAFT_SEQS_DEFAULT 16

struct slot {
    uint64_t key, last_use;
    bool used;
    int32_t *toks; /* (max_ctx) the tokens whose KV the runner holds for this slot */
    int n;
    int ask; /* index of its ask in the current call, or -1 */
};

struct draft {
    struct spec_proposer base;
    struct model *m;
    struct runner *r;
    int n_vocab, max_ctx, n_slots;
    uint64_t clock;
    float *logits; /* (n_slots, n_vocab) */
    struct slot *slots;
    struct batch_seq *bs; /* (n_slots) */
    int *row_ask;         /* (n_slots) the ask of each batch entry */
};

static int argmax(const float *v, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[b])
            b = i;
    return b;
}

static void slot_reset(struct draft *d, int i)
{
    runner_drop_seq(d->r, i);
    d->slots[i].n = 0;
}

/* The slot of key, or a free or least recently used one not in this call (-1: none). */
static int slot_for(struct draft *d, uint64_t key)
{
    int lru = -1;
    for (int i = 0; i < d->n_slots; i++) {
        struct slot *s = &d->slots[i];
        if (s->used && s->key == key)
            return i;
        if (s->ask >= 0)
            continue;
        if (lru < 0 || !s->used || (d->slots[lru].used && s->last_use < d->slots[lru].last_use))
            lru = i;
    }
    if (lru >= 0) {
        slot_reset(d, lru);
        d->slots[lru].used = true, d->slots[lru].key = key;
    }
    return lru;
}

/* Room in the pool for positions [slot's n, + n) of slot i beside the blocks this call
   reserved already (*reserved, which grows by them): drops the least recently used slots
   outside this call until there is (false: not even then). */
static bool make_room(struct draft *d, int i, int n, int64_t *reserved)
{
    for (;;) {
        int n_free, need = runner_seq_blocks_needed(d->r, i, d->slots[i].n, n, &n_free);
        need = need > 0 ? need : 0;
        if (need <= n_free - *reserved) {
            *reserved += need;
            return true;
        }
        int lru = -1;
        for (int j = 0; j < d->n_slots; j++)
            if (d->slots[j].used && d->slots[j].ask < 0 && d->slots[j].n > 0 &&
                (lru < 0 || d->slots[j].last_use < d->slots[lru].last_use))
                lru = j;
        if (lru < 0)
            return false;
        slot_reset(d, lru);
        d->slots[lru].used = false;
    }
}

/* One forward pass over the d->bs entries [0, nb); on failure every slot in it is reset
   and its ask gets no (more) guesses. */
static int run(struct draft *d, int nb, bool *alive)
{
    struct weld_err e;
    struct batch b = {.seqs = d->bs, .n_seqs = nb};
    if (runner_forward(d->r, &b, d->logits, &e) == WELD_OK)
        return 0;
    for (int j = 0; j < nb; j++) {
        slot_reset(d, d->bs[j].seq_id);
        alive[d->row_ask[j]] = false;
    }
    return -1;
}

static void draft_propose_batch(struct spec_proposer *p, struct spec_ask *asks, int n)
{
    struct draft *d = (struct draft *)p;
    for (int i = 0; i < d->n_slots; i++)
        d->slots[i].ask = -1;
    bool alive_buf[64], *alive = n <= 64 ? alive_buf : wcalloc((size_t)n, sizeof *alive);
    int *slot_of = wcalloc((size_t)n + 1, sizeof *slot_of);
    if (!alive || !slot_of) {
        for (int a = 0; a < n; a++)
            asks[a].n_out = 0;
        if (alive != alive_buf)
            wfree(alive);
        wfree(slot_of);
        return;
    }
    /* slots, rewinds, room */
    int64_t reserved = 0;
    for (int a = 0; a < n; a++) {
        struct spec_ask *q = &asks[a];
        q->n_out = 0;
        alive[a] = false;
        slot_of[a] = -1;
        int k = q->max_k < d->max_ctx - q->n ? q->max_k : d->max_ctx - q->n;
        if (q->n < 1 || k < 1)
            continue;
        q->max_k = k;
        int i = slot_for(d, q->seq_key);
        if (i < 0)
            continue;
        struct slot *s = &d->slots[i];
        s->last_use = ++d->clock;
        s->ask = a;
        int common = 0;
        while (common < s->n && common < q->n - 1 && s->toks[common] == q->tokens[common])
            common++;
        s->n = common;
        memcpy(s->toks + common, q->tokens + common, sizeof(int32_t) * (size_t)(q->n - common));
        /* the tokens to feed, then k - 1 guesses fed back */
        if (!make_room(d, i, q->n - common + k - 1, &reserved)) {
            slot_reset(d, i);
            continue;
        }
        alive[a] = true;
        slot_of[a] = i;
    }
    /* Passes of at most DRAFT_BATCH tokens: a sequence behind feeds its unfed tokens, one
       caught up feeds its last guess back; the last row of a caught-up sequence gives its
       next guess (its argmax). Sequences that catch up early guess while others still feed. */
    for (;;) {
        int nb = 0, tok = 0;
        for (int a = 0; a < n && tok < DRAFT_BATCH; a++) {
            struct spec_ask *q = &asks[a];
            if (!alive[a] || q->n_out >= q->max_k)
                continue;
            struct slot *s = &d->slots[slot_of[a]];
            int c = 1;
            if (s->n < q->n)
                c = q->n - s->n < DRAFT_BATCH - tok ? q->n - s->n : DRAFT_BATCH - tok;
            else
                s->toks[s->n] = q->out[q->n_out - 1];
            d->bs[nb] = (struct batch_seq){.seq_id = slot_of[a],
                                           .tokens = s->toks + s->n,
                                           .n_tokens = c,
                                           .pos = s->n};
            d->row_ask[nb++] = a;
            tok += c;
        }
        if (!nb)
            break;
        if (run(d, nb, alive))
            continue;
        for (int j = 0; j < nb; j++) {
            struct spec_ask *q = &asks[d->row_ask[j]];
            struct slot *s = &d->slots[slot_of[d->row_ask[j]]];
            s->n += d->bs[j].n_tokens;
            if (s->n < q->n)
                continue;
            const float *lg = d->logits + (size_t)j * (size_t)d->n_vocab;
            if (q->logits)
                memcpy(q->logits + (size_t)q->n_out * (size_t)d->n_vocab, lg,
                       sizeof(float) * (size_t)d->n_vocab);
            q->out[q->n_out++] = argmax(lg, d->n_vocab);
        }
    }
    runner_park(d->r);
    if (alive != alive_buf)
        wfree(alive);
    wfree(slot_of);
}

static int draft_propose(struct spec_proposer *p, uint64_t key, const int32_t *tokens, int n,
                         int max_k, int32_t *out)
{
    struct spec_ask q = {.seq_key = key, .tokens = tokens, .n = n, .max_k = max_k, .out = out};
    draft_propose_batch(p, &q, 1);
    return q.n_out;
}

static void draft_forget(struct spec_proposer *p, uint64_t key)
{
    struct draft *d = (struct draft *)p;
    for (int i = 0; i < d->n_slots; i++)
        if (d->slots[i].used && d->slots[i].key == key) {
            slot_reset(d, i);
            d->slots[i].used = false;
        }
}

static void draft_free(struct spec_proposer *p)
{
    struct draft *d = (struct draft *)p;
    runner_free(d->r);
    model_free(d->m);
    for (int i = 0; d->slots && i < d->n_slots; i++)
        wfree(d->slots[i].toks);
    wfree(d->slots);
    wfree(d->bs);
    wfree(d->row_ask);
    wfree(d->logits);
    wfree(d);
}

int spec_draft_create(struct spec_proposer **out, const char *path, const struct spec_limits *lim,
                      struct weld_err *e)
{
    *out = NULL;
    struct draft *d = wcalloc(1, sizeof *d);
    if (!d)
        return err_set(e, WELD_ERR_NOMEM, "draft model: out of memory");
    d->base = (struct spec_proposer){.propose = draft_propose,
                                     .propose_batch = draft_propose_batch,
                                     .forget = draft_forget,
                                     .free = draft_free,
                                     .runs_model = true};
    d->n_slots = lim->max_seqs > 0 ? lim->max_seqs : DRAFT_SEQS_DEFAULT;
    int rc = model_load(&d->m, path, e);
    if (rc == WELD_OK) {
        d->max_ctx = lim->max_ctx > 0 && lim->max_ctx < d->m->cfg.max_ctx ? lim->max_ctx
                                                                          : d->m->cfg.max_ctx;
        struct backend_params bp;
        backend_params_init(&bp, d->n_slots, d->max_ctx);
        int64_t tokens = lim->kv_tokens > 0 ? lim->kv_tokens : (int64_t)d->n_slots * d->max_ctx;
        int bsz = 16; /* backend_params' default block size */
        int64_t blocks = (tokens + bsz - 1) / bsz + d->n_slots; /* + a partial block each */
        int64_t most = ((int64_t)d->max_ctx + bsz - 1) / bsz * d->n_slots;
        bp.kv_blocks = (int)(blocks < most ? blocks : most);
        rc = runner_create_ex(&d->r, d->m, &bp, e);
    }
    if (rc == WELD_OK) {
        d->n_vocab = d->base.n_vocab = runner_n_vocab(d->r);
        d->logits = wmalloc(sizeof(float) * (size_t)d->n_vocab * (size_t)d->n_slots);
        d->slots = wcalloc((size_t)d->n_slots, sizeof *d->slots);
        d->bs = wcalloc((size_t)d->n_slots, sizeof *d->bs);
        d->row_ask = wcalloc((size_t)d->n_slots, sizeof *d->row_ask);
        if (!d->logits || !d->slots || !d->bs || !d->row_ask)
            rc = err_set(e, WELD_ERR_NOMEM, "draft model: out of memory");
        for (int i = 0; rc == WELD_OK && i < d->n_slots; i++)
            if (!(d->slots[i].toks = wmalloc(sizeof(int32_t) * (size_t)d->max_ctx)))
                rc = err_set(e, WELD_ERR_NOMEM, "draft model: out of memory");
    }
    if (rc != WELD_OK) {
        err_prefix(e, "draft model %s", path);
        draft_free(&d->base);
        return rc;
    }
    *out = &d->base;
    return WELD_OK;
}

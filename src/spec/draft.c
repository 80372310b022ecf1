/*
 * draft - the draft-model proposer (spec.h): a smaller model with the target's vocabulary
 * guesses greedily, token by token, from its own runner, every sequence of a step in one
 * batch.
 *
 * KV in the engine's block manager: the draft's cache is a pool of its own (its model's
 * layers and dtype) indexed by the engine's block ids, as vLLM lays out a draft's layers,
 * so block X of the draft holds the draft's KV of the tokens block X holds in the target.
 * Each ask carries its sequence's block table. The draft writes only the full blocks the
 * target has computed (positions below the last full block boundary at or before n - 1,
 * the ones the prefix cache can share) plus, for the partial tail (at most block_size - 1
 * known positions, the last token, then its guesses), per-ask scratch blocks past the
 * engine's ids, rewritten on every call. So a guess never lands in a block the target owns
 * and copy-on-write never needs mirroring.
 *
 * What each block holds is known by its fingerprint (blocks.h): a sequence's leading
 * blocks whose fingerprint matches its tokens need no feeding, so a prefix-cache hit, a
 * sibling's prompt after a fork and a readmitted preempted sequence reuse what the draft
 * computed. An ask whose blocks another entry of a pass writes waits a pass (and then
 * finds them valid).
 *
 * A call (propose_batch) feeds each sequence from its first invalid block to its last
 * token, then its guesses back, one per pass, in passes of at most DRAFT_BATCH tokens
 * across the sequences, taking the argmax of each caught-up sequence's last row: k guesses
 * for every sequence in about k forward passes however many sequences there are. Errors of
 * the draft never reach the request: that sequence gets no guesses this step.
 *
 * Not yet: sampled drafts (greedy guesses are checked exactly anyway). The engine counts
 * the draft's pool in its KV budget (spec_proposer_cost).
 */
#include "spec/spec.h"

#include "core/alloc.h"
#include "core/log.h"
#include "exec/runner.h"
#include "model/model.h"
#include "spec/blocks.h"

#include <string.h>
#define DRAFT_BATCH 1024 /* tokens per catch-up forward pass */
#define DRAFT_SEQS_DEFAULT 16

struct dseq {
    struct spec_seq h; /* key, use, its ask */
    int32_t *toks;     /* (max_ctx) its tokens as last seen */
    int n_tok;
    uint64_t *fp; /* (max_blocks) fp[j]: the chained hash of tokens [0, (j + 1) block_size) */
    int n_fp;
    /* the current call */
    int b;        /* full blocks the target computed (the rest goes to scratch) */
    int fed;      /* positions whose KV this call's table holds */
    int32_t *tab; /* (max_blocks + 2) its blocks [0, b), then its scratch pair */
};

struct draft {
    struct spec_proposer base;
    struct model *m;
    struct runner *r;
    int n_vocab, max_ctx, n_seqs, bsz, n_pool, max_blocks;
    uint64_t clock;
    struct spec_blocks kb;     /* what each engine block holds of the draft's KV */
    float *logits;             /* (n_seqs, n_vocab) */
    struct dseq *seqs;         /* (n_seqs) */
    struct batch_seq *bs;      /* (n_seqs) */
    struct kv_block_copy *cps; /* (2 n_seqs) a pass's copies */
    int *row_ask;              /* (n_seqs) */
};

/* The state of key (a fresh one forgets what it held). */
static struct dseq *seq_for(struct draft *d, uint64_t key)
{
    bool fresh;
    struct dseq *s = (struct dseq *)spec_seq_for(d->seqs, d->n_seqs, sizeof *d->seqs, key, &fresh);
    if (s && fresh)
        s->n_tok = s->n_fp = 0;
    return s;
}

/* s's fingerprints of its first b full blocks (tokens[0, n) its tokens now); its scratch
   tail keeps the positions whose tokens did not change. */
static void fingerprints(struct draft *d, struct dseq *s, const int32_t *tokens, int n, int b)
{
    int c = 0;
    while (c < s->n_tok && c < n && s->toks[c] == tokens[c])
        c++;
    if (s->n_fp > c / d->bsz)
        s->n_fp = c / d->bsz;
    memcpy(s->toks + c, tokens + c, sizeof(int32_t) * (size_t)(n - c));
    s->n_tok = n;
    spec_blocks_fingerprints(&d->kb, tokens, b, 0, s->fp, &s->n_fp);
    if (s->h.tail_end > c)
        s->h.tail_end = c > s->h.tail_from ? c : s->h.tail_from;
}

static void draft_propose_batch(struct spec_proposer *p, struct spec_ask *asks, int n)
{
    struct draft *d = (struct draft *)p;
    const int B = d->bsz;
    for (int i = 0; i < d->n_seqs; i++)
        d->seqs[i].h.ask = -1;
    struct dseq *of_buf[64], **of = n <= 64 ? of_buf : wcalloc((size_t)n, sizeof *of);
    if (!of) {
        for (int a = 0; a < n; a++)
            asks[a].n_out = 0;
        return;
    }
    /* states, fingerprints, what is valid, tables */
    for (int a = 0; a < n; a++) {
        struct spec_ask *q = &asks[a];
        q->n_out = 0;
        of[a] = NULL;
        int k = q->max_k < d->max_ctx - q->n ? q->max_k : d->max_ctx - q->n;
        k = k < B + 1 ? k : B + 1; /* what the scratch pair holds past block b */
        if (q->n < 1 || k < 1 || !q->blocks)
            continue;
        q->max_k = k;
        struct dseq *s = seq_for(d, q->seq_key);
        if (!s)
            continue;
        s->h.last_use = ++d->clock;
        s->h.ask = a;
        s->b = (q->n - 1) / B;
        s->b = s->b < q->n_blocks ? s->b : q->n_blocks;
        fingerprints(d, s, q->tokens, q->n, s->b);
        if (!spec_blocks_table(&d->kb, q->blocks, s->b, (int)(s - d->seqs), s->tab))
            continue;
        int ok = spec_blocks_valid_until(&d->kb, s->tab, s->fp, 0, s->b);
        s->fed = spec_blocks_start(&s->h, s->tab, s->b, ok, B);
        s->fed = s->fed < q->n - 1 ? s->fed : q->n - 1; /* its last token at least */
        of[a] = s;
    }
    /* Passes of at most DRAFT_BATCH tokens: a sequence behind feeds its unfed tokens, one
       caught up feeds its last guess back; the last row of a caught-up sequence gives its
       next guess. Sequences that catch up early guess while others still feed. */
    for (;;) {
        int nb = 0, tok = 0, n_cps = 0;
        spec_blocks_next_pass(&d->kb);
        bool waiting = false;
        for (int a = 0; a < n && tok < DRAFT_BATCH; a++) {
            struct spec_ask *q = &asks[a];
            struct dseq *s = of[a];
            if (!s || q->n_out >= q->max_k)
                continue;
            if (s->fed % B == 0 && s->fed / B < s->b) /* others may have written them */
                s->fed = spec_blocks_valid_until(&d->kb, s->tab, s->fp, s->fed / B, s->b) * B;
            int c = 1;
            if (s->fed < q->n)
                c = q->n - s->fed < DRAFT_BATCH - tok ? q->n - s->fed : DRAFT_BATCH - tok;
            if (!spec_blocks_join(&d->kb, &s->h, s->tab, s->b, s->fed, c, d->cps, &n_cps)) {
                waiting = true;
                continue;
            }
            if (s->fed >= q->n) { /* a guess fed back: its KV stands if it is taken */
                s->toks[s->fed] = q->out[q->n_out - 1];
                s->n_tok = s->fed + 1;
            }
            const int32_t *t = s->toks + s->fed;
            d->bs[nb] = (struct batch_seq){.seq_id = nb,
                                           .tokens = t,
                                           .n_tokens = c,
                                           .pos = s->fed,
                                           .blocks = s->tab,
                                           .n_blocks = s->b + 2};
            d->row_ask[nb++] = a;
            tok += c;
        }
        if (!nb) {
            if (waiting) /* cannot happen (an entry alone always fits): do not spin */
                for (int a = 0; a < n; a++)
                    of[a] = NULL;
            break;
        }
        struct weld_err e;
        struct batch b = {.seqs = d->bs,
                          .n_seqs = nb,
                          .copies = n_cps ? d->cps : NULL,
                          .n_copies = n_cps,
                          .copies_fill = true};
        d->base.computed += (uint64_t)tok;
        if (runner_forward(d->r, &b, d->logits, &e) != WELD_OK) {
            if (!d->base.failures++)
                log_warn("draft model: %s (those sequences get no guesses)", e.msg);
            for (int j = 0; j < nb; j++) { /* no (more) guesses; its blocks stay invalid */
                struct dseq *s = of[d->row_ask[j]];
                s->h.tail_end = s->h.tail_from, s->h.n_cp = 0;
                of[d->row_ask[j]] = NULL;
            }
            continue;
        }
        for (int j = 0; j < nb; j++) {
            struct spec_ask *q = &asks[d->row_ask[j]];
            struct dseq *s = of[d->row_ask[j]];
            int from = s->fed;
            s->fed += d->bs[j].n_tokens;
            spec_blocks_ran(&d->kb, &s->h, s->tab, s->fp, NULL, s->b, from, s->fed, s->fed);
            if (s->fed < q->n)
                continue;
            spec_take_guess(q, d->logits + (size_t)j * (size_t)d->n_vocab, d->n_vocab);
        }
    }
    runner_park(d->r);
    if (of != of_buf)
        wfree(of);
}

static void draft_forget(struct spec_proposer *p, uint64_t key)
{
    struct draft *d = (struct draft *)p;
    for (int i = 0; i < d->n_seqs; i++)
        if (d->seqs[i].h.used && d->seqs[i].h.key == key)
            d->seqs[i].h.used = false;
}

static void draft_free(struct spec_proposer *p)
{
    struct draft *d = (struct draft *)p;
    runner_free(d->r);
    model_free(d->m);
    for (int i = 0; d->seqs && i < d->n_seqs; i++) {
        wfree(d->seqs[i].toks);
        wfree(d->seqs[i].fp);
        wfree(d->seqs[i].tab);
    }
    wfree(d->seqs);
    wfree(d->bs);
    wfree(d->cps);
    wfree(d->row_ask);
    wfree(d->logits);
    spec_blocks_free(&d->kb);
    wfree(d);
}

int spec_draft_create(struct spec_proposer **out, const char *path, const struct spec_limits *lim,
                      struct weld_err *e)
{
    *out = NULL;
    struct draft *d = wcalloc(1, sizeof *d);
    if (!d)
        return err_set(e, WELD_ERR_NOMEM, "draft model: out of memory");
    d->base = (struct spec_proposer){.propose_batch = draft_propose_batch,
                                     .forget = draft_forget,
                                     .free = draft_free,
                                     .runs_model = true};
    d->n_seqs = lim->max_seqs > 0 ? lim->max_seqs : DRAFT_SEQS_DEFAULT;
    d->bsz = lim->block_size > 0 ? lim->block_size : 16;
    int rc = model_load(&d->m, path, e);
    if (rc == WELD_OK) {
        d->max_ctx = lim->max_ctx > 0 && lim->max_ctx < d->m->cfg.max_ctx ? lim->max_ctx
                                                                          : d->m->cfg.max_ctx;
        d->max_blocks = (d->max_ctx + d->bsz - 1) / d->bsz;
        int64_t pool = lim->kv_tokens > 0 ? lim->kv_tokens / d->bsz
                                          : (int64_t)d->n_seqs * d->max_blocks;
        int64_t total = pool + (int64_t)d->n_seqs * 2;
        if (total > (1 << 30))
            rc = err_set(e, WELD_ERR_LIMIT, "draft model: a pool of %lld blocks is too large",
                         (long long)total);
        d->n_pool = (int)pool;
        struct backend_params bp;
        backend_params_init(&bp, d->n_seqs, d->max_ctx);
        bp.kv_block_size = d->bsz;
        bp.kv_blocks = (int)total;
        if (rc == WELD_OK)
            rc = runner_create_ex(&d->r, d->m, &bp, e);
    }
    if (rc == WELD_OK) {
        d->n_vocab = d->base.n_vocab = runner_n_vocab(d->r);
        d->logits = wmalloc(sizeof(float) * (size_t)d->n_vocab * (size_t)d->n_seqs);
        d->seqs = wcalloc((size_t)d->n_seqs, sizeof *d->seqs);
        d->bs = wcalloc((size_t)d->n_seqs, sizeof *d->bs);
        d->cps = wcalloc(2 * (size_t)d->n_seqs, sizeof *d->cps);
        d->row_ask = wcalloc((size_t)d->n_seqs, sizeof *d->row_ask);
        if (!spec_blocks_init(&d->kb, d->n_pool, d->bsz) || !d->logits || !d->seqs || !d->bs ||
            !d->row_ask || !d->cps)
            rc = err_set(e, WELD_ERR_NOMEM, "draft model: out of memory");
        for (int i = 0; rc == WELD_OK && i < d->n_seqs; i++) {
            struct dseq *s = &d->seqs[i];
            s->toks = wmalloc(sizeof(int32_t) * (size_t)d->max_ctx);
            s->fp = wmalloc(sizeof(uint64_t) * (size_t)d->max_blocks);
            s->tab = wmalloc(sizeof(int32_t) * ((size_t)d->max_blocks + 2));
            if (!s->toks || !s->fp || !s->tab)
                rc = err_set(e, WELD_ERR_NOMEM, "draft model: out of memory");
        }
    }
    if (rc != WELD_OK) {
        err_prefix(e, "draft model %s", path);
        draft_free(&d->base);
        return rc;
    }
    *out = &d->base;
    return WELD_OK;
}

/*
 * draft - the draft-model proposer (spec.h): a smaller model with the target's vocabulary
 * guesses greedily, token by token, from its own runner.
 *
 * Each sequence the engine asks about gets a slot of the draft runner (its own KV cache,
 * exec/runner.h's internal placement) holding the tokens whose KV it computed. A call
 * first rewinds the slot to the longest prefix it shares with the sequence's tokens now
 * (the guesses the target rejected fall away there), feeds the rest (the accepted
 * guesses, the target's own token; a new sequence its whole prompt, in chunks of
 * DRAFT_CHUNK), then decodes max_k - 1 more tokens, taking the argmax at every row: k
 * guesses for 1 prefill chunk and k - 1 one-token steps. Slots are reused least recently
 * used first when every one is taken, so forget is only a hint.
 *
 * Not yet: the draft's KV in the engine's block manager (prefix sharing, one pool), drafts
 * batched across sequences, sampling drafts (greedy guesses are checked exactly anyway).
 */
#include "spec/spec.h"

#include "core/alloc.h"
#include "exec/runner.h"
#include "model/model.h"

#include <string.h>

#define DRAFT_CHUNK 512
#define DRAFT_SLOTS 16

struct slot {
    uint64_t key, last_use;
    bool used;
    int32_t *toks; /* (max_ctx) the tokens whose KV the runner holds for this slot */
    int n;
};

struct draft {
    struct spec_proposer base;
    struct model *m;
    struct runner *r;
    int n_vocab, max_ctx;
    uint64_t clock;
    float *logits; /* (n_vocab) */
    struct slot slots[DRAFT_SLOTS];
};

static int argmax(const float *v, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[b])
            b = i;
    return b;
}

static struct slot *slot_for(struct draft *d, uint64_t key, int *index)
{
    int lru = 0;
    for (int i = 0; i < DRAFT_SLOTS; i++) {
        if (d->slots[i].used && d->slots[i].key == key) {
            *index = i;
            return &d->slots[i];
        }
        if (!d->slots[i].used ||
            (d->slots[lru].used && d->slots[i].last_use < d->slots[lru].last_use))
            lru = i;
    }
    struct slot *s = &d->slots[lru];
    runner_drop_seq(d->r, lru);
    s->used = true, s->key = key, s->n = 0;
    *index = lru;
    return s;
}

/* Feed toks[0, n) at positions pos.. of slot i; the last row's logits into d->logits. */
static int feed(struct draft *d, int i, const int32_t *toks, int n, int pos)
{
    struct weld_err e;
    for (int off = 0; off < n; off += DRAFT_CHUNK) {
        int c = n - off < DRAFT_CHUNK ? n - off : DRAFT_CHUNK;
        struct batch_seq s = {.seq_id = i, .tokens = toks + off, .n_tokens = c, .pos = pos + off};
        struct batch b = {.seqs = &s, .n_seqs = 1};
        if (runner_forward(d->r, &b, d->logits, &e) != WELD_OK)
            return -1;
    }
    return 0;
}

static int draft_propose(struct spec_proposer *p, uint64_t key, const int32_t *tokens, int n,
                         int max_k, int32_t *out)
{
    struct draft *d = (struct draft *)p;
    if (max_k > d->max_ctx - n)
        max_k = d->max_ctx - n;
    if (n < 1 || max_k < 1)
        return 0;
    int i;
    struct slot *s = slot_for(d, key, &i);
    s->last_use = ++d->clock;
    int common = 0;
    while (common < s->n && common < n - 1 && s->toks[common] == tokens[common])
        common++;
    memcpy(s->toks + common, tokens + common, sizeof(int32_t) * (size_t)(n - common));
    s->n = common;
    if (feed(d, i, tokens + common, n - common, common)) {
        s->used = false;
        return 0;
    }
    s->n = n;
    for (int j = 0; j < max_k; j++) {
        out[j] = argmax(d->logits, d->n_vocab);
        if (j + 1 == max_k)
            break;
        s->toks[s->n] = out[j];
        if (feed(d, i, out + j, 1, s->n)) {
            s->used = false;
            return j + 1;
        }
        s->n++;
    }
    runner_park(d->r);
    return max_k;
}

static void draft_forget(struct spec_proposer *p, uint64_t key)
{
    struct draft *d = (struct draft *)p;
    for (int i = 0; i < DRAFT_SLOTS; i++)
        if (d->slots[i].used && d->slots[i].key == key) {
            runner_drop_seq(d->r, i);
            d->slots[i].used = false;
        }
}

static void draft_free(struct spec_proposer *p)
{
    struct draft *d = (struct draft *)p;
    runner_free(d->r);
    model_free(d->m);
    for (int i = 0; i < DRAFT_SLOTS; i++)
        wfree(d->slots[i].toks);
    wfree(d->logits);
    wfree(d);
}

int spec_draft_create(struct spec_proposer **out, const char *path, int max_ctx, struct weld_err *e)
{
    *out = NULL;
    struct draft *d = wcalloc(1, sizeof *d);
    if (!d)
        return err_set(e, WELD_ERR_NOMEM, "draft model: out of memory");
    d->base = (struct spec_proposer){draft_propose, draft_forget, draft_free, 0, true};
    int rc = model_load(&d->m, path, e);
    if (rc == WELD_OK) {
        d->max_ctx = max_ctx > 0 && max_ctx < d->m->cfg.max_ctx ? max_ctx : d->m->cfg.max_ctx;
        rc = runner_create(&d->r, d->m, DRAFT_SLOTS, d->max_ctx, e);
    }
    if (rc == WELD_OK) {
        d->n_vocab = d->base.n_vocab = runner_n_vocab(d->r);
        d->logits = wmalloc(sizeof(float) * (size_t)d->n_vocab);
        for (int i = 0; rc == WELD_OK && i < DRAFT_SLOTS; i++)
            if (!(d->slots[i].toks = wmalloc(sizeof(int32_t) * (size_t)d->max_ctx)))
                rc = err_set(e, WELD_ERR_NOMEM, "draft model: out of memory");
        if (!d->logits && rc == WELD_OK)
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

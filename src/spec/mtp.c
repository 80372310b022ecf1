/*
 * mtp - the multi-token-prediction proposer (spec.h): the target's own MTP layer
 * (DeepSeek-V3's nextn layer, model/model.h) guesses from the target's final hidden states.
 *
 * The layer sees position i as x_i = eh_proj . [enorm(embed(t_{i+1})); hnorm(h_i)], h_i
 * the target's final hidden state at i (after its final norm, as vLLM and SGLang hand it
 * over), then runs one decoder layer with a KV cache of its own over positions 0..i and
 * its shared head (norm, LM head) predicts t_{i+2}. The input stage is computed here; the
 * layer runs in a runner of its own over model_mtp_view, fed those rows through
 * batch_seq.embeds. Guesses past the first chain (EAGLE's way, and SGLang's): the next
 * position takes the layer's own normed output in place of the target's hidden state,
 * with the guess as its token.
 *
 * State per sequence (a slot of the runner, as in draft.c): the tokens known, the hidden
 * rows the engine handed over (observe) not yet fed, and how many positions the layer's
 * KV holds from true rows (n_fed; the chained positions after them are rewound on the
 * next call). A call (propose_batch) keeps what still matches the sequence's tokens,
 * feeds positions n_fed..n-2 (the target has computed up to n-2, and t_{i+1} is known for
 * each), whose last row gives the first guess, then chains: k guesses in k passes across
 * every sequence of the step.
 *
 * A position the engine never handed a row for (a prefix-cache hit the target did not
 * recompute, evicted slots) is fed with a zero hidden state (its token alone): guesses are
 * verified exactly anyway, so only acceptance can suffer. A finished sequence's slot keeps
 * its KV and tokens, and a new sequence takes the free slot sharing its longest prefix
 * (a conversation's next turn). Rows wait in their slot until the sequence's first guess:
 * a long prompt holds dim floats per position until then.
 */
#include "spec/spec.h"

#include "core/alloc.h"
#include "exec/runner.h"
#include "kernels/cpu/kernels.h"
#include "model/model.h"

#include <string.h>

#define MTP_BATCH 1024 /* tokens per forward pass */
#define MTP_SEQS_DEFAULT 16

struct mslot {
    uint64_t key, last_use;
    bool used;     /* held by a live sequence; a free slot keeps its KV for a prefix reuse */
    int ask;       /* its ask in the current call, or -1 */
    int32_t *toks; /* (max_ctx) the sequence's tokens as last known */
    int n_tok;
    int n_fed;   /* KV positions [0, n_fed) fed from rows and toks */
    int kv;      /* positions the runner holds (n_fed, then chained guesses) */
    float *rows; /* (cap_rows, dim) hidden rows of positions [row0, row0 + n_rows) */
    int row0, n_rows, cap_rows;
};

struct mtp {
    struct spec_proposer base;
    struct model view;
    struct runner *r;
    int dim, n_vocab, max_ctx, n_slots;
    float eps;
    const struct tensor *eh_proj, *tok_embd;
    float *enorm, *hnorm; /* (dim) */
    uint64_t clock;
    struct mslot *slots;
    /* one pass: entries, their input rows, logits and output hidden rows */
    struct batch_seq *bs; /* (n_slots) */
    int *row_ask;         /* (n_slots) */
    float *in;            /* (MTP_BATCH + n_slots, dim) */
    float *logits;        /* (n_slots, n_vocab) */
    float *hid;           /* (n_slots, dim) */
    float *chain;         /* (n_slots, dim) each ask's last output hidden row */
    float *cat, *scratch; /* (2 dim) each */
};

static int argmax(const float *v, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[b])
            b = i;
    return b;
}

/* x = eh_proj . [enorm(embed(tok)); hnorm(h)] (h NULL: zeros). */
static void input_row(struct mtp *t, int32_t tok, const float *h, float *x)
{
    const int D = t->dim;
    const struct tensor *E = t->tok_embd;
    kern_to_f32(E->type, kern_tensor_row(E, kern_row_bytes(E), tok), t->cat, D);
    kern_rmsnorm(t->cat, t->enorm, t->eps, t->cat, D);
    if (h)
        kern_rmsnorm(h, t->hnorm, t->eps, t->cat + D, D);
    else
        memset(t->cat + D, 0, sizeof(float) * (size_t)D);
    kern_matvec(t->eh_proj, 0, D, t->cat, x, t->scratch);
}

static void slot_reset(struct mtp *t, int i)
{
    runner_drop_seq(t->r, i);
    struct mslot *s = &t->slots[i];
    s->n_tok = s->n_fed = s->kv = s->n_rows = s->row0 = 0;
}

static int lcp(const int32_t *a, int na, const int32_t *b, int nb)
{
    int c = 0;
    while (c < na && c < nb && a[c] == b[c])
        c++;
    return c;
}

/* The slot of key; else a free slot (the one sharing the longest prefix with tokens[0, n)
   first), else the least recently used one outside this call (-1: none). */
static int slot_for(struct mtp *t, uint64_t key, const int32_t *tokens, int n)
{
    int pick = -1, best = -1;
    for (int i = 0; i < t->n_slots; i++) {
        struct mslot *s = &t->slots[i];
        if (s->used && s->key == key)
            return i;
        if (s->ask >= 0 || s->used)
            continue;
        int c = tokens ? lcp(s->toks, s->n_tok, tokens, n) : 0;
        if (c > best)
            best = c, pick = i;
    }
    if (pick < 0) {
        for (int i = 0; i < t->n_slots; i++)
            if (t->slots[i].ask < 0 && (pick < 0 || t->slots[i].last_use < t->slots[pick].last_use))
                pick = i;
        if (pick < 0)
            return -1;
        slot_reset(t, pick);
    }
    struct mslot *s = &t->slots[pick];
    s->used = true, s->key = key, s->n_rows = 0, s->row0 = s->n_fed;
    return pick;
}

static bool rows_room(struct mslot *s, int n, int dim)
{
    if (n <= s->cap_rows)
        return true;
    int cap = s->cap_rows ? s->cap_rows : 16;
    while (cap < n)
        cap *= 2;
    float *r = wrealloc(s->rows, (size_t)cap * (size_t)dim * sizeof *r);
    if (!r)
        return false;
    s->rows = r, s->cap_rows = cap;
    return true;
}

static void mtp_observe(struct spec_proposer *p, uint64_t key, int pos, int n,
                        const int32_t *tokens, const float *hidden)
{
    struct mtp *t = (struct mtp *)p;
    const size_t D = (size_t)t->dim;
    if (n < 1 || pos < 0 || pos + n > t->max_ctx)
        return;
    for (int i = 0; i < t->n_slots; i++)
        t->slots[i].ask = -1;
    int i = slot_for(t, key, tokens, pos + n);
    if (i < 0)
        return;
    struct mslot *s = &t->slots[i];
    s->last_use = ++t->clock;
    /* rows stay where the tokens up to them still match and below pos (replaced) */
    int c = lcp(s->toks, s->n_tok, tokens, pos + n);
    if (s->n_fed > c - 1)
        s->n_fed = c > 0 ? c - 1 : 0;
    int keep = c < pos ? c : pos;
    if (s->n_rows && s->row0 + s->n_rows > keep)
        s->n_rows = keep > s->row0 ? keep - s->row0 : 0;
    memcpy(s->toks + c, tokens + c, sizeof(int32_t) * (size_t)(pos + n - c));
    s->n_tok = pos + n;
    if (!s->n_rows || s->row0 + s->n_rows < s->n_fed)
        s->n_rows = 0, s->row0 = pos; /* positions before pos without rows: zeros */
    /* a hole between the rows kept and pos is filled with zero rows */
    int hole = pos - (s->row0 + s->n_rows);
    if (!rows_room(s, s->n_rows + hole + n, t->dim)) {
        s->n_rows = 0, s->row0 = pos;
        if (!rows_room(s, n, t->dim))
            return;
        hole = 0;
    }
    memset(s->rows + (size_t)s->n_rows * D, 0, sizeof(float) * (size_t)hole * D);
    memcpy(s->rows + (size_t)(s->n_rows + hole) * D, hidden, sizeof(float) * (size_t)n * D);
    s->n_rows += hole + n;
}

static void mtp_fork(struct spec_proposer *p, uint64_t parent, uint64_t child)
{
    struct mtp *t = (struct mtp *)p;
    int a = -1;
    for (int i = 0; i < t->n_slots; i++)
        if (t->slots[i].used && t->slots[i].key == parent)
            a = i;
    if (a < 0)
        return;
    for (int i = 0; i < t->n_slots; i++)
        t->slots[i].ask = i == a ? 0 : -1; /* keep the parent's slot */
    int b = slot_for(t, child, t->slots[a].toks, t->slots[a].n_tok);
    if (b < 0)
        return;
    struct mslot *P = &t->slots[a], *C = &t->slots[b];
    C->last_use = ++t->clock;
    /* the child's KV is its own (fed from the rows again where the prefix differs) */
    int keep = lcp(C->toks, C->n_tok, P->toks, P->n_tok);
    C->n_fed = C->n_fed < keep - 1 ? C->n_fed : keep > 0 ? keep - 1 : 0;
    memcpy(C->toks, P->toks, sizeof(int32_t) * (size_t)P->n_tok);
    C->n_tok = P->n_tok;
    C->n_rows = 0, C->row0 = P->row0;
    if (P->n_rows && rows_room(C, P->n_rows, t->dim)) {
        memcpy(C->rows, P->rows, sizeof(float) * (size_t)P->n_rows * (size_t)t->dim);
        C->n_rows = P->n_rows;
    }
}

/* Room for positions [n_fed, n_fed + n) of slot i beside the blocks this call reserved
   (*reserved): drops other slots outside this call, free ones then least recently used
   (false: not even then). */
static bool make_room(struct mtp *t, int i, int n, int64_t *reserved)
{
    for (;;) {
        int n_free, need = runner_seq_blocks_needed(t->r, i, t->slots[i].n_fed, n, &n_free);
        need = need > 0 ? need : 0;
        if (need <= n_free - *reserved) {
            *reserved += need;
            return true;
        }
        int v = -1;
        for (int j = 0; j < t->n_slots; j++) {
            const struct mslot *s = &t->slots[j];
            if (s->ask >= 0 || s->kv == 0)
                continue;
            if (v < 0 || (t->slots[v].used && !s->used) ||
                (t->slots[v].used == s->used && s->last_use < t->slots[v].last_use))
                v = j;
        }
        if (v < 0)
            return false;
        bool used = t->slots[v].used;
        slot_reset(t, v);
        t->slots[v].used = used;
    }
}

/* The hidden row of position q of slot s, or NULL (none handed over: zeros). */
static const float *row_of(const struct mtp *t, const struct mslot *s, int q)
{
    if (q < s->row0 || q >= s->row0 + s->n_rows)
        return NULL;
    return s->rows + (size_t)(q - s->row0) * (size_t)t->dim;
}

static void mtp_propose_batch(struct spec_proposer *p, struct spec_ask *asks, int n)
{
    struct mtp *t = (struct mtp *)p;
    const size_t D = (size_t)t->dim;
    for (int i = 0; i < t->n_slots; i++)
        t->slots[i].ask = -1;
    int *slot_of = wcalloc((size_t)n + 1, sizeof *slot_of);
    if (!slot_of) {
        for (int a = 0; a < n; a++)
            asks[a].n_out = 0;
        return;
    }
    int64_t reserved = 0;
    for (int a = 0; a < n; a++) {
        struct spec_ask *q = &asks[a];
        q->n_out = 0;
        slot_of[a] = -1;
        /* the guesses' positions: n - 1 .. n + k - 2 must stay inside the context */
        int k = q->max_k < t->max_ctx - q->n + 1 ? q->max_k : t->max_ctx - q->n + 1;
        if (q->n < 2 || k < 1 || q->n > t->max_ctx)
            continue;
        q->max_k = k;
        int i = slot_for(t, q->seq_key, q->tokens, q->n);
        if (i < 0)
            continue;
        struct mslot *s = &t->slots[i];
        s->last_use = ++t->clock;
        s->ask = a;
        /* keep what matches: KV of position j needs tokens [0, j + 1] */
        int c = lcp(s->toks, s->n_tok, q->tokens, q->n);
        if (s->n_fed > c - 1)
            s->n_fed = c > 0 ? c - 1 : 0;
        if (s->n_fed > q->n - 2) /* the first guess comes from position n - 2's row */
            s->n_fed = q->n - 2;
        if (s->n_rows && s->row0 + s->n_rows > c)
            s->n_rows = c > s->row0 ? c - s->row0 : 0;
        memcpy(s->toks + c, q->tokens + c, sizeof(int32_t) * (size_t)(q->n - c));
        s->n_tok = q->n;
        s->kv = s->n_fed;
        if (!make_room(t, i, q->n - 1 - s->n_fed + k - 1, &reserved)) {
            slot_reset(t, i);
            continue;
        }
        slot_of[a] = i;
    }
    /* Passes of at most MTP_BATCH tokens: a sequence behind feeds positions n_fed..n-2,
       one caught up feeds its last guess with its last output row; a caught-up sequence's
       last row gives its next guess. */
    for (;;) {
        int nb = 0, tok = 0;
        for (int a = 0; a < n && tok < MTP_BATCH; a++) {
            struct spec_ask *q = &asks[a];
            if (slot_of[a] < 0 || q->n_out >= q->max_k)
                continue;
            struct mslot *s = &t->slots[slot_of[a]];
            float *x = t->in + (size_t)tok * D;
            int c = 1;
            if (s->n_fed < q->n - 1) {
                c = q->n - 1 - s->n_fed;
                c = c < MTP_BATCH - tok ? c : MTP_BATCH - tok;
                for (int j = 0; j < c; j++) {
                    int pos = s->n_fed + j;
                    input_row(t, q->tokens[pos + 1], row_of(t, s, pos), x + (size_t)j * D);
                }
            } else {
                input_row(t, q->out[q->n_out - 1], t->chain + (size_t)slot_of[a] * D, x);
            }
            t->bs[nb] = (struct batch_seq){.seq_id = slot_of[a],
                                           .tokens = s->toks + s->kv,
                                           .n_tokens = c,
                                           .pos = s->kv,
                                           .embeds = x};
            /* tokens only name the rows: the positions' own tokens where known */
            if (s->kv + c > s->n_tok)
                t->bs[nb].tokens = q->out + q->n_out - 1;
            t->row_ask[nb++] = a;
            tok += c;
        }
        if (!nb)
            break;
        struct weld_err e;
        struct batch b = {.seqs = t->bs, .n_seqs = nb};
        t->base.computed += (uint64_t)tok;
        if (runner_forward_hidden(t->r, &b, t->logits, NULL, t->hid, &e) != WELD_OK) {
            for (int j = 0; j < nb; j++) {
                slot_reset(t, t->bs[j].seq_id);
                slot_of[t->row_ask[j]] = -1;
            }
            continue;
        }
        for (int j = 0; j < nb; j++) {
            struct spec_ask *q = &asks[t->row_ask[j]];
            struct mslot *s = &t->slots[slot_of[t->row_ask[j]]];
            s->kv += t->bs[j].n_tokens;
            if (s->n_fed < q->n - 1)
                s->n_fed = s->kv;
            if (s->n_fed < q->n - 1)
                continue;
            const float *lg = t->logits + (size_t)j * (size_t)t->n_vocab;
            if (q->logits)
                memcpy(q->logits + (size_t)q->n_out * (size_t)t->n_vocab, lg,
                       sizeof(float) * (size_t)t->n_vocab);
            q->out[q->n_out++] = argmax(lg, t->n_vocab);
            memcpy(t->chain + (size_t)slot_of[t->row_ask[j]] * D, t->hid + (size_t)j * D,
                   sizeof(float) * D);
        }
    }
    /* rows of fed positions are done with, but the last (a call before the sequence
       moves on feeds it again for its first guess) */
    for (int a = 0; a < n; a++) {
        if (slot_of[a] < 0)
            continue;
        struct mslot *s = &t->slots[slot_of[a]];
        int drop = s->n_fed - 1 - s->row0;
        if (drop >= s->n_rows) {
            s->n_rows = 0, s->row0 = s->n_fed;
        } else if (drop > 0) {
            memmove(s->rows, s->rows + (size_t)drop * D,
                    sizeof(float) * (size_t)(s->n_rows - drop) * D);
            s->n_rows -= drop, s->row0 += drop;
        }
    }
    runner_park(t->r);
    wfree(slot_of);
}

static int mtp_propose(struct spec_proposer *p, uint64_t key, const int32_t *tokens, int n,
                       int max_k, int32_t *out)
{
    struct spec_ask q = {.seq_key = key, .tokens = tokens, .n = n, .max_k = max_k, .out = out};
    mtp_propose_batch(p, &q, 1);
    return q.n_out;
}

static void mtp_forget(struct spec_proposer *p, uint64_t key)
{
    struct mtp *t = (struct mtp *)p;
    for (int i = 0; i < t->n_slots; i++)
        if (t->slots[i].used && t->slots[i].key == key) {
            struct mslot *s = &t->slots[i];
            s->used = false;
            s->n_rows = 0;
            /* what the KV holds stays for a later sequence with the same prefix */
            s->n_tok = s->n_fed + 1 < s->n_tok ? s->n_fed + 1 : s->n_tok;
        }
}

static void mtp_free(struct spec_proposer *p)
{
    struct mtp *t = (struct mtp *)p;
    runner_free(t->r);
    for (int i = 0; t->slots && i < t->n_slots; i++) {
        wfree(t->slots[i].toks);
        wfree(t->slots[i].rows);
    }
    wfree(t->slots);
    wfree(t->bs);
    wfree(t->row_ask);
    wfree(t->in);
    wfree(t->logits);
    wfree(t->hid);
    wfree(t->chain);
    wfree(t->cat);
    wfree(t->scratch);
    wfree(t->enorm);
    wfree(t->hnorm);
    wfree(t);
}

int spec_mtp_create(struct spec_proposer **out, const struct spec_limits *lim, struct weld_err *e)
{
    *out = NULL;
    const struct model *m = lim->target;
    if (!m || m->cfg.n_nextn < 1 || !m->nextn)
        return err_set(e, WELD_ERR_UNSUPPORTED,
                       "speculative decoding: method mtp needs a model with "
                       "multi-token-prediction layers (%s has none: DeepSeek-V3's HF "
                       "checkpoints carry one; GGUF conversions drop it)",
                       m && m->path ? m->path : "the model");
    struct mtp *t = wcalloc(1, sizeof *t);
    if (!t)
        return err_set(e, WELD_ERR_NOMEM, "mtp: out of memory");
    t->base = (struct spec_proposer){.propose = mtp_propose,
                                     .propose_batch = mtp_propose_batch,
                                     .forget = mtp_forget,
                                     .observe = mtp_observe,
                                     .fork = mtp_fork,
                                     .free = mtp_free,
                                     .hidden_dim = m->cfg.dim,
                                     .runs_model = true};
    model_mtp_view(m, 0, &t->view);
    const struct nextn_weights *N = &m->nextn[0];
    t->dim = m->cfg.dim;
    t->eps = m->cfg.norm_eps;
    t->eh_proj = &N->eh_proj;
    t->tok_embd = &t->view.tok_embd;
    t->n_slots = lim->max_seqs > 0 ? lim->max_seqs : MTP_SEQS_DEFAULT;
    t->max_ctx = lim->max_ctx > 0 && lim->max_ctx < m->cfg.max_ctx ? lim->max_ctx : m->cfg.max_ctx;
    int rc = WELD_OK;
    if (!kern_type_supported(N->eh_proj.type) || !kern_type_supported(t->tok_embd->type))
        rc = err_set(e, WELD_ERR_UNSUPPORTED,
                     "mtp: eh_proj or the embeddings have a type "
                     "the input stage cannot read");
    if (rc == WELD_OK) {
        struct backend_params bp;
        backend_params_init(&bp, t->n_slots, t->max_ctx);
        int64_t tokens = lim->kv_tokens > 0 ? lim->kv_tokens : (int64_t)t->n_slots * t->max_ctx;
        int bsz = 16; /* backend_params' default block size */
        int64_t blocks = (tokens + bsz - 1) / bsz + t->n_slots;
        int64_t most = ((int64_t)t->max_ctx + bsz - 1) / bsz * t->n_slots;
        bp.kv_blocks = (int)(blocks < most ? blocks : most);
        rc = runner_create_ex(&t->r, &t->view, &bp, e);
    }
    if (rc == WELD_OK) {
        const size_t D = (size_t)t->dim, S = (size_t)t->n_slots;
        t->n_vocab = t->base.n_vocab = runner_n_vocab(t->r);
        t->slots = wcalloc(S, sizeof *t->slots);
        t->bs = wcalloc(S, sizeof *t->bs);
        t->row_ask = wcalloc(S, sizeof *t->row_ask);
        t->in = wmalloc(sizeof(float) * (MTP_BATCH + S) * D);
        t->logits = wmalloc(sizeof(float) * S * (size_t)t->n_vocab);
        t->hid = wmalloc(sizeof(float) * S * D);
        t->chain = wmalloc(sizeof(float) * S * D);
        t->cat = wmalloc(sizeof(float) * 2 * D);
        t->scratch = wmalloc(sizeof(float) * KERN_ROW_SCRATCH(2 * D));
        t->enorm = wmalloc(sizeof(float) * D);
        t->hnorm = wmalloc(sizeof(float) * D);
        if (!t->slots || !t->bs || !t->row_ask || !t->in || !t->logits || !t->hid || !t->chain ||
            !t->cat || !t->scratch || !t->enorm || !t->hnorm)
            rc = err_set(e, WELD_ERR_NOMEM, "mtp: out of memory");
        for (size_t i = 0; rc == WELD_OK && i < S; i++)
            if (!(t->slots[i].toks = wmalloc(sizeof(int32_t) * (size_t)t->max_ctx)))
                rc = err_set(e, WELD_ERR_NOMEM, "mtp: out of memory");
        if (rc == WELD_OK) {
            kern_to_f32(N->enorm.type, N->enorm.data, t->enorm, t->dim);
            kern_to_f32(N->hnorm.type, N->hnorm.data, t->hnorm, t->dim);
        }
    }
    if (rc != WELD_OK) {
        err_prefix(e, "mtp layer of %s", m->path ? m->path : "the model");
        mtp_free(&t->base);
        return rc;
    }
    *out = &t->base;
    return WELD_OK;
}

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
 * KV as the draft model's (draft.c, blocks.h): a pool of the layer's own indexed by the
 * engine's block ids, full computed blocks written in place (fingerprinted over their
 * tokens and the one after, which position i's input reads), the tail and the guesses in
 * per-ask scratch blocks. So a prefix-cache hit, a fork's siblings and a readmitted
 * sequence reuse what the layer computed.
 *
 * Rows: the engine hands over each step's hidden rows (observe) before sampling; each
 * sequence keeps those it has not fed, from the last full block on (a repeated ask feeds
 * that block again for its first guess). A call (propose_batch) feeds positions from the
 * first block without valid KV to n - 2 (the target has computed up to n - 2, and t_{i+1}
 * is known for each), whose last row gives the first guess, then chains: k guesses in k
 * passes across every sequence of the step. A position with no row (the target never
 * computed it for this sequence, and no block holds the layer's KV for it) enters with a
 * zero hidden state, its token alone: guesses are verified exactly anyway, so only
 * acceptance can suffer. A block fed so is still marked as holding its tokens (the best
 * the layer will get for that prefix: its rows will not come again).
 */
#include "spec/spec.h"

#include "core/alloc.h"
#include "core/log.h"
#include "exec/runner.h"
#include "kernels/cpu/kernels.h"
#include "model/model.h"
#include "spec/blocks.h"

#include <string.h>

#define MTP_BATCH 1024 /* tokens per forward pass */
#define MTP_SEQS_DEFAULT 16

struct mseq {
    struct spec_seq h; /* key, use, its ask */
    int32_t *toks;     /* (max_ctx) its tokens as last seen */
    int n_tok;
    uint64_t *fp, *fpx; /* (max_blocks) fp[j]: the chained hash of tokens [0, (j + 1) bsz),
                           fpx[j] of [0, (j + 1) bsz + 1) (position i reads t_{i+1}) */
    int n_fp, n_fpx;
    float *rows; /* (cap_rows, dim) the target's hidden rows of [row0, row0 + n_rows) */
    int row0, n_rows, cap_rows;
    /* the current call */
    int b;        /* full blocks the target computed (the rest goes to scratch) */
    int fed;      /* positions whose KV this call's table holds */
    int32_t *tab; /* (max_blocks + 2) its blocks [0, b), then its scratch pair */
};

struct mtp {
    struct spec_proposer base;
    struct model view;
    struct runner *r;
    int dim, n_vocab, max_ctx, n_seqs, bsz, n_pool, max_blocks;
    float eps;
    const struct tensor *eh_proj, *tok_embd;
    float *enorm, *hnorm; /* (dim) */
    uint64_t clock;
    struct spec_blocks kb; /* what each engine block holds of the layer's KV */
    struct mseq *seqs;     /* (n_seqs) */
    /* one pass: entries, their input rows, logits and output hidden rows */
    struct batch_seq *bs;      /* (n_seqs) */
    struct kv_block_copy *cps; /* (2 n_seqs) a pass's copies */
    int *row_ask;              /* (n_seqs) */
    float *in;                 /* (MTP_BATCH + n_seqs, dim) */
    float *logits;             /* (n_seqs, n_vocab) */
    float *hid;                /* (n_seqs, dim) */
    float *chain;              /* (n_seqs, dim) each ask's last output hidden row */
    float *cat, *scratch;      /* (2 dim) each */
};

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

static int lcp(const int32_t *a, int na, const int32_t *b, int nb)
{
    int c = 0;
    while (c < na && c < nb && a[c] == b[c])
        c++;
    return c;
}

/* The state of key (a fresh one forgets what it held). */
static struct mseq *seq_for(struct mtp *t, uint64_t key)
{
    bool fresh;
    struct mseq *s = (struct mseq *)spec_seq_for(t->seqs, t->n_seqs, sizeof *t->seqs, key, &fresh);
    if (s && fresh)
        s->n_tok = s->n_fp = s->n_fpx = s->n_rows = s->row0 = 0;
    return s;
}

/* s now knows tokens[0, n): what depended on tokens that changed goes (fingerprints, rows
   of positions from the first change on). */
static void take_tokens(struct mtp *t, struct mseq *s, const int32_t *tokens, int n)
{
    int c = lcp(s->toks, s->n_tok, tokens, n);
    int keep = c / t->bsz, keepx = c > 0 ? (c - 1) / t->bsz : 0;
    s->n_fp = s->n_fp < keep ? s->n_fp : keep;
    s->n_fpx = s->n_fpx < keepx ? s->n_fpx : keepx;
    if (s->n_rows && s->row0 + s->n_rows > c)
        s->n_rows = c > s->row0 ? c - s->row0 : 0;
    if (s->h.tail_end > c - 1) /* position i's KV read tokens up to i + 1 */
        s->h.tail_end = c - 1 > s->h.tail_from ? c - 1 : s->h.tail_from;
    memcpy(s->toks + c, tokens + c, sizeof(int32_t) * (size_t)(n - c));
    s->n_tok = n;
}

static bool rows_room(struct mseq *s, int n, int dim)
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
    for (int i = 0; i < t->n_seqs; i++)
        t->seqs[i].h.ask = -1;
    struct mseq *s = seq_for(t, key);
    if (!s)
        return;
    s->h.last_use = ++t->clock;
    take_tokens(t, s, tokens, pos + n);
    /* rows from pos on are replaced; a hole between the rows kept and pos is zeros */
    if (s->n_rows && s->row0 + s->n_rows > pos)
        s->n_rows = pos > s->row0 ? pos - s->row0 : 0;
    if (!s->n_rows)
        s->row0 = pos;
    int hole = pos - (s->row0 + s->n_rows);
    if (!rows_room(s, s->n_rows + hole + n, t->dim)) {
        s->n_rows = 0, s->row0 = pos, hole = 0;
        if (!rows_room(s, n, t->dim))
            return;
    }
    memset(s->rows + (size_t)s->n_rows * D, 0, sizeof(float) * (size_t)hole * D);
    memcpy(s->rows + (size_t)(s->n_rows + hole) * D, hidden, sizeof(float) * (size_t)n * D);
    s->n_rows += hole + n;
}

static void mtp_fork(struct spec_proposer *p, uint64_t parent, uint64_t child)
{
    struct mtp *t = (struct mtp *)p;
    struct mseq *P = NULL;
    for (int i = 0; i < t->n_seqs; i++) {
        t->seqs[i].h.ask = -1;
        if (t->seqs[i].h.used && t->seqs[i].h.key == parent)
            P = &t->seqs[i];
    }
    if (!P)
        return;
    P->h.ask = 0; /* not the one taken */
    struct mseq *C = seq_for(t, child);
    P->h.ask = -1;
    if (!C)
        return;
    C->h.last_use = ++t->clock;
    memcpy(C->toks, P->toks, sizeof(int32_t) * (size_t)P->n_tok);
    C->n_tok = P->n_tok;
    memcpy(C->fp, P->fp, sizeof(uint64_t) * (size_t)P->n_fp);
    memcpy(C->fpx, P->fpx, sizeof(uint64_t) * (size_t)P->n_fpx);
    C->n_fp = P->n_fp, C->n_fpx = P->n_fpx;
    C->n_rows = 0, C->row0 = P->row0;
    if (P->n_rows && rows_room(C, P->n_rows, t->dim)) {
        memcpy(C->rows, P->rows, sizeof(float) * (size_t)P->n_rows * (size_t)t->dim);
        C->n_rows = P->n_rows;
    }
}

/* The hidden row of position q of s, or NULL (none handed over: zeros). */
static const float *row_of(const struct mtp *t, const struct mseq *s, int q)
{
    if (q < s->row0 || q >= s->row0 + s->n_rows)
        return NULL;
    return s->rows + (size_t)(q - s->row0) * (size_t)t->dim;
}

/* The leading blocks of s's table that hold the layer's KV of its tokens, from block j on,
   never past the block of position n - 2 (the first guess needs that row fed). A block
   written for the same tokens but another next token (its last position read that one:
   a prefix another sequence continued differently) counts when s has no row of that last
   position to do better with. */
static int valid_from(struct mtp *t, const struct mseq *s, int j, int n)
{
    const int B = t->bsz, most = (n - 2) / B;
    for (; j < s->b && j < most; j++) {
        const int32_t x = s->tab[j];
        if (t->kb.fpx[x] != s->fpx[j] && (t->kb.fp[x] != s->fp[j] || row_of(t, s, (j + 1) * B - 1)))
            break;
    }
    return j;
}

static void mtp_propose_batch(struct spec_proposer *p, struct spec_ask *asks, int n)
{
    struct mtp *t = (struct mtp *)p;
    const size_t D = (size_t)t->dim;
    const int B = t->bsz;
    for (int i = 0; i < t->n_seqs; i++)
        t->seqs[i].h.ask = -1;
    struct mseq *of_buf[64], **of = n <= 64 ? of_buf : wcalloc((size_t)n, sizeof *of);
    if (!of) {
        for (int a = 0; a < n; a++)
            asks[a].n_out = 0;
        return;
    }
    for (int a = 0; a < n; a++) {
        struct spec_ask *q = &asks[a];
        q->n_out = 0;
        of[a] = NULL;
        /* the guesses' positions n - 1 .. n + k - 3 inside the context and the scratch */
        int k = q->max_k < t->max_ctx - q->n + 2 ? q->max_k : t->max_ctx - q->n + 2;
        k = k < B + 2 ? k : B + 2;
        if (q->n < 2 || k < 1 || q->n > t->max_ctx || !q->blocks)
            continue;
        q->max_k = k;
        struct mseq *s = seq_for(t, q->seq_key);
        if (!s)
            continue;
        s->h.last_use = ++t->clock;
        s->h.ask = a;
        take_tokens(t, s, q->tokens, q->n);
        s->b = (q->n - 1) / B;
        s->b = s->b < q->n_blocks ? s->b : q->n_blocks;
        spec_blocks_fingerprints(&t->kb, q->tokens, s->b, 0, s->fp, &s->n_fp);
        spec_blocks_fingerprints(&t->kb, q->tokens, s->b, 1, s->fpx, &s->n_fpx);
        if (!spec_blocks_table(&t->kb, q->blocks, s->b, (int)(s - t->seqs), s->tab))
            continue;
        s->fed = spec_blocks_start(&s->h, s->tab, s->b, valid_from(t, s, 0, q->n), B);
        s->fed = s->fed < q->n - 2 ? s->fed : q->n - 2; /* the first guess reads row n - 2 */
        of[a] = s;
    }
    /* Passes of at most MTP_BATCH tokens: a sequence behind feeds positions up to n - 2,
       one caught up feeds its last guess with its last output row; a caught-up sequence's
       last row gives its next guess. */
    for (;;) {
        int nb = 0, tok = 0, n_cps = 0;
        spec_blocks_next_pass(&t->kb);
        for (int a = 0; a < n && tok < MTP_BATCH; a++) {
            struct spec_ask *q = &asks[a];
            struct mseq *s = of[a];
            if (!s || q->n_out >= q->max_k)
                continue;
            if (s->fed % B == 0 && s->fed < q->n - 1 && s->fed / B < s->b) {
                int v = valid_from(t, s, s->fed / B, q->n) * B; /* others may have written */
                s->fed = v > s->fed ? v : s->fed;
            }
            const int slot = (int)(s - t->seqs);
            float *x = t->in + (size_t)tok * D;
            int c = 1;
            if (s->fed < q->n - 1) {
                c = q->n - 1 - s->fed;
                c = c < MTP_BATCH - tok ? c : MTP_BATCH - tok;
            }
            if (!spec_blocks_join(&t->kb, &s->h, s->tab, s->b, s->fed, c, t->cps, &n_cps))
                continue;
            if (s->fed < q->n - 1) {
                for (int j = 0; j < c; j++) {
                    int pos = s->fed + j;
                    input_row(t, q->tokens[pos + 1], row_of(t, s, pos), x + (size_t)j * D);
                }
            } else {
                input_row(t, q->out[q->n_out - 1], t->chain + (size_t)slot * D, x);
            }
            /* tokens only name the rows: each position's own token */
            t->bs[nb] = (struct batch_seq){.seq_id = nb,
                                           .tokens = s->fed + c <= q->n ? s->toks + s->fed
                                                                        : q->out + q->n_out - 1,
                                           .n_tokens = c,
                                           .pos = s->fed,
                                           .blocks = s->tab,
                                           .n_blocks = s->b + 2,
                                           .embeds = x};
            t->row_ask[nb++] = a;
            tok += c;
        }
        if (!nb)
            break;
        struct weld_err e;
        struct batch b = {.seqs = t->bs,
                          .n_seqs = nb,
                          .copies = n_cps ? t->cps : NULL,
                          .n_copies = n_cps,
                          .copies_fill = true};
        t->base.computed += (uint64_t)tok;
        if (runner_forward_hidden(t->r, &b, t->logits, NULL, t->hid, &e) != WELD_OK) {
            if (!t->base.failures++)
                log_warn("mtp: %s (those sequences get no guesses)", e.msg);
            for (int j = 0; j < nb; j++) { /* no (more) guesses; its blocks stay invalid */
                struct mseq *s = of[t->row_ask[j]];
                s->h.tail_end = s->h.tail_from, s->h.n_cp = 0;
                of[t->row_ask[j]] = NULL;
            }
            continue;
        }
        for (int j = 0; j < nb; j++) {
            struct spec_ask *q = &asks[t->row_ask[j]];
            struct mseq *s = of[t->row_ask[j]];
            const int from = s->fed;
            s->fed += t->bs[j].n_tokens;
            /* the tail holds true KV up to n - 2 (guesses chain on the layer's own rows) */
            spec_blocks_ran(&t->kb, &s->h, s->tab, s->fp, s->fpx, s->b, from, s->fed,
                            s->fed < q->n - 1 ? s->fed : q->n - 1);
            if (s->fed < q->n - 1)
                continue;
            spec_take_guess(q, t->logits + (size_t)j * (size_t)t->n_vocab, t->n_vocab);
            memcpy(t->chain + (size_t)(s - t->seqs) * D, t->hid + (size_t)j * D, sizeof(float) * D);
        }
    }
    /* rows are kept from the last full block on (a repeated ask feeds it again) */
    for (int a = 0; a < n; a++) {
        struct mseq *s = of[a];
        if (!s)
            continue;
        int keep = (s->b > 0 ? s->b - 1 : 0) * B, drop = keep - s->row0;
        if (drop >= s->n_rows) {
            s->n_rows = 0, s->row0 = keep;
        } else if (drop > 0) {
            memmove(s->rows, s->rows + (size_t)drop * D,
                    sizeof(float) * (size_t)(s->n_rows - drop) * D);
            s->n_rows -= drop, s->row0 += drop;
        }
    }
    runner_park(t->r);
    if (of != of_buf)
        wfree(of);
}

static void mtp_forget(struct spec_proposer *p, uint64_t key)
{
    struct mtp *t = (struct mtp *)p;
    for (int i = 0; i < t->n_seqs; i++)
        if (t->seqs[i].h.used && t->seqs[i].h.key == key)
            t->seqs[i].h.used = false, t->seqs[i].n_rows = 0;
}

static void mtp_free(struct spec_proposer *p)
{
    struct mtp *t = (struct mtp *)p;
    runner_free(t->r);
    for (int i = 0; t->seqs && i < t->n_seqs; i++) {
        wfree(t->seqs[i].toks);
        wfree(t->seqs[i].rows);
        wfree(t->seqs[i].fp);
        wfree(t->seqs[i].fpx);
        wfree(t->seqs[i].tab);
    }
    wfree(t->seqs);
    spec_blocks_free(&t->kb);
    wfree(t->bs);
    wfree(t->cps);
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
    t->base = (struct spec_proposer){.propose_batch = mtp_propose_batch,
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
    t->n_seqs = lim->max_seqs > 0 ? lim->max_seqs : MTP_SEQS_DEFAULT;
    t->bsz = lim->block_size > 0 ? lim->block_size : 16;
    t->max_ctx = lim->max_ctx > 0 && lim->max_ctx < m->cfg.max_ctx ? lim->max_ctx : m->cfg.max_ctx;
    t->max_blocks = (t->max_ctx + t->bsz - 1) / t->bsz;
    int64_t pool = lim->kv_tokens > 0 ? lim->kv_tokens / t->bsz
                                      : (int64_t)t->n_seqs * t->max_blocks;
    int rc = WELD_OK;
    if (!kern_type_supported(N->eh_proj.type) || !kern_type_supported(t->tok_embd->type))
        rc = err_set(e, WELD_ERR_UNSUPPORTED,
                     "mtp: eh_proj or the embeddings have a type "
                     "the input stage cannot read");
    if (rc == WELD_OK && pool + (int64_t)t->n_seqs * 2 > (1 << 30))
        rc = err_set(e, WELD_ERR_LIMIT, "mtp: a pool of %lld blocks is too large", (long long)pool);
    t->n_pool = (int)pool;
    if (rc == WELD_OK) {
        struct backend_params bp;
        backend_params_init(&bp, t->n_seqs, t->max_ctx);
        bp.kv_block_size = t->bsz;
        bp.kv_blocks = t->n_pool + t->n_seqs * 2;
        rc = runner_create_ex(&t->r, &t->view, &bp, e);
    }
    if (rc == WELD_OK) {
        const size_t D = (size_t)t->dim, S = (size_t)t->n_seqs;
        t->n_vocab = t->base.n_vocab = runner_n_vocab(t->r);
        t->seqs = wcalloc(S, sizeof *t->seqs);
        t->bs = wcalloc(S, sizeof *t->bs);
        t->cps = wcalloc(2 * S, sizeof *t->cps);
        t->row_ask = wcalloc(S, sizeof *t->row_ask);
        t->in = wmalloc(sizeof(float) * (MTP_BATCH + S) * D);
        t->logits = wmalloc(sizeof(float) * S * (size_t)t->n_vocab);
        t->hid = wmalloc(sizeof(float) * S * D);
        t->chain = wmalloc(sizeof(float) * S * D);
        t->cat = wmalloc(sizeof(float) * 2 * D);
        t->scratch = wmalloc(sizeof(float) * KERN_ROW_SCRATCH(2 * D));
        t->enorm = wmalloc(sizeof(float) * D);
        t->hnorm = wmalloc(sizeof(float) * D);
        if (!spec_blocks_init(&t->kb, t->n_pool, t->bsz) || !t->seqs || !t->bs || !t->cps ||
            !t->row_ask || !t->in || !t->logits || !t->hid || !t->chain || !t->cat || !t->scratch ||
            !t->enorm || !t->hnorm)
            rc = err_set(e, WELD_ERR_NOMEM, "mtp: out of memory");
        for (size_t i = 0; rc == WELD_OK && i < S; i++) {
            struct mseq *s = &t->seqs[i];
            s->toks = wmalloc(sizeof(int32_t) * (size_t)t->max_ctx);
            s->fp = wmalloc(sizeof(uint64_t) * (size_t)t->max_blocks);
            s->fpx = wmalloc(sizeof(uint64_t) * (size_t)t->max_blocks);
            s->tab = wmalloc(sizeof(int32_t) * ((size_t)t->max_blocks + 2));
            if (!s->toks || !s->fp || !s->fpx || !s->tab)
                rc = err_set(e, WELD_ERR_NOMEM, "mtp: out of memory");
        }
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

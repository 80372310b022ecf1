/*
 * backend_tp - rank 0's backend over a group of ranks, and the other ranks' loop.
 *
 * Messages: a fixed header (struct tp_msg) broadcast by rank 0, then, when the header
 * says so, a payload of that many bytes broadcast the same way. The answers are
 * point-to-point to rank 0: for CREATE a status from every rank; for FORWARD, from each
 * last-stage rank a status and a result per micro-batch (logits columns, tops,
 * statistics, hidden states; result_bytes says how many bytes, which both sides compute
 * from the batch), sent without waiting (comm_isend) so the stage takes the next
 * micro-batch at once, and from every other rank one status. Context slots (TP_MAX_CTX)
 * let rank 0 hold several contexts of the model at once (a server's runner and a
 * benchmark's).
 */
#include "exec/backend_tp.h"

#include "core/alloc.h"
#include "core/log.h"
#include "exec/weights.h"
#include "model/model.h"

#include <stdio.h>
#include <string.h>

#define TP_MAX_CTX 8
#define TP_MB_TOKENS 64 /* fewest tokens a pipeline micro-batch is worth (mb_split) */
#define TP_TAG_STATUS 11
#define TP_TAG_RESULT 12

enum tp_op { TP_CREATE = 1, TP_FREE, TP_FORWARD, TP_DROP, TP_RESET, TP_STOP };

struct tp_msg {
    int32_t op, slot, arg, pad;
    int64_t payload; /* bytes broadcast after the header */
};

struct tp_status {
    int32_t rc;
    char msg[240];
};

/* The backend parameters every rank's context is made with. */
struct tp_create {
    int32_t max_seqs, max_ctx, n_splits, n_threads, kv_block_size, kv_blocks, kv_type;
    int32_t oversubscribe, kv_groups, decode_pairs, l2_prefetch, repack, trace_steps;
    int32_t dump_program, k_parts, tp_overlap;
    char executor[16];
    char model[1024]; /* the model's path */
};

/* One candidate list as it travels (struct logits_top without the caller's pointers). */
struct tp_top {
    int32_t n, n_nan;
    int32_t ids[LOGITS_TOP_K];
    float vals[LOGITS_TOP_K];
};

struct tp_group {
    struct comm *c;        /* every rank: steps, results, stage to stage */
    struct comm *tpc;      /* this rank's stage: the ALLGATHERs */
    const struct model *m; /* the model sharded: rank 0's first context's */
    struct model *own;     /* other ranks: loaded from rank 0's path */
    int rank, size;        /* in the world */
    int tp, pp, stage, tp_rank; /* rank = stage * tp + tp_rank */
    bool ep;                    /* experts placed whole over a stage's TP ranks */
};

int tp_group_create(struct tp_group **out, int tp_size, int pp_size, bool ep, double timeout_s,
                    struct weld_err *e)
{
    *out = NULL;
    int rc = comm_init(e);
    if (rc)
        return rc;
    tp_size = tp_size < 1 ? 1 : tp_size;
    pp_size = pp_size < 1 ? 1 : pp_size;
    if (comm_world_size() != tp_size * pp_size)
        return err_set(e, WELD_ERR_INVALID_ARG,
                       "--tensor-parallel-size %d x --pipeline-parallel-size %d is %d ranks, "
                       "but this job has %d (start it with mpirun -np %d)",
                       tp_size, pp_size, tp_size * pp_size, comm_world_size(), tp_size * pp_size);
    struct tp_group *g = wcalloc(1, sizeof *g);
    if (!g)
        return err_set(e, WELD_ERR_NOMEM, "tensor parallel: out of memory");
    const int wr = comm_world_rank();
    if ((rc = comm_create(&g->c, 0, wr, timeout_s, e)) ||
        (rc = comm_create(&g->tpc, wr / tp_size, wr, timeout_s, e))) {
        comm_free(g->c);
        wfree(g);
        return rc;
    }
    g->rank = comm_rank(g->c);
    g->size = comm_size(g->c);
    g->tp = tp_size, g->pp = pp_size;
    g->ep = ep;
    g->stage = g->rank / tp_size, g->tp_rank = g->rank % tp_size;
    *out = g;
    return WELD_OK;
}

struct exec_part tp_group_part(const struct tp_group *g, const struct model_config *c)
{
    const int L = c->n_layer;
    return (struct exec_part){.tp_rank = g->tp_rank,
                              .tp_size = g->tp,
                              .layer0 = (int)((long long)L * g->stage / g->pp),
                              .layer1 = (int)((long long)L * (g->stage + 1) / g->pp),
                              .vocab0 = exec_tp_vocab_cut(c->n_vocab, g->tp_rank, g->tp),
                              .vocab1 = exec_tp_vocab_cut(c->n_vocab, g->tp_rank + 1, g->tp),
                              .first = g->stage == 0,
                              .last = g->stage == g->pp - 1,
                              .ep = g->ep && g->tp > 1};
}

double tp_group_share(const struct tp_group *g, const struct model_config *c)
{
    const struct exec_part pt = tp_group_part(g, c);
    /* (a stage without layers is refused when its weights are made; never a zero here) */
    const int nl = pt.layer1 > pt.layer0 ? pt.layer1 - pt.layer0 : 1;
    const double layers = c->n_layer > 0 ? (double)nl / c->n_layer : 1.0;
    return layers / (double)(pt.tp_size > 0 ? pt.tp_size : 1);
}

int tp_group_tp_size(const struct tp_group *g)
{
    return g->tp;
}
int tp_group_pp_size(const struct tp_group *g)
{
    return g->pp;
}
struct comm *tp_group_tp_comm(const struct tp_group *g)
{
    return g->tpc;
}

static int send_msg(struct tp_group *g, int op, int slot, int arg, const void *payload, size_t n,
                    struct weld_err *e)
{
    struct tp_msg h = {.op = op, .slot = slot, .arg = arg, .payload = (int64_t)n};
    int rc = comm_bcast(g->c, &h, sizeof h, 0, false, e);
    if (!rc && n)
        rc = comm_bcast(g->c, (void *)payload, n, 0, false, e);
    return rc;
}

void tp_group_free(struct tp_group *g)
{
    if (!g)
        return;
    struct weld_err e = {0};
    if (g->rank == 0 && !comm_broken(g->c) && send_msg(g, TP_STOP, 0, 0, NULL, 0, &e))
        log_warn("tensor parallel: could not stop the other ranks: %s", e.msg);
    comm_free(g->tpc);
    comm_free(g->c);
    model_free(g->own);
    wfree(g);
}

int tp_group_rank(const struct tp_group *g)
{
    return g->rank;
}
int tp_group_size(const struct tp_group *g)
{
    return g->size;
}
struct comm *tp_group_comm(const struct tp_group *g)
{
    return g->c;
}
const struct model *tp_group_model(const struct tp_group *g)
{
    return g->m;
}
bool tp_group_broken(const struct tp_group *g)
{
    return comm_broken(g->c) || comm_broken(g->tpc);
}

void tp_group_stats(struct tp_group *g, struct comm_stats *out, bool reset)
{
    struct comm_stats s;
    comm_stats_get(g->c, out, reset);
    comm_stats_get(g->tpc, &s, reset); /* the stage's exchanges */
    out->bytes_sent += s.bytes_sent;
    out->bytes_recv += s.bytes_recv;
    out->calls += s.calls;
    out->wait_s += s.wait_s;
}

/* ---- the batch on the wire ----------------------------------------------------------- */

/* FORWARD payload: a header of counts, per sequence six ints, then tokens, blocks, copies
   (int32), inv_t per logit row (when tops are wanted) and embedding rows (floats). */
struct tp_fwd {
    int32_t n_seqs, n_copies, copies_fill, want_tops, has_embeds, has_tables;
    int32_t n_rows, n_tokens, n_blocks, want_hidden;
};

static size_t fwd_bytes(const struct tp_fwd *f, int dim)
{
    return sizeof *f + (size_t)f->n_seqs * 6 * 4 + (size_t)f->n_tokens * 4 +
           (size_t)f->n_blocks * 4 + (size_t)f->n_copies * 8 +
           (f->want_tops ? (size_t)f->n_rows * 4 : 0) +
           (f->has_embeds ? (size_t)f->n_tokens * (size_t)dim * 4 : 0);
}

static int fwd_pack(const struct batch *b, const struct logits_top *tops, bool hidden, int dim,
                    uint8_t **buf, size_t *cap, size_t *len, struct weld_err *e)
{
    struct tp_fwd f = {.n_seqs = b->n_seqs,
                       .n_copies = b->n_copies,
                       .copies_fill = b->copies_fill,
                       .want_tops = tops != NULL,
                       .has_embeds = b->seqs[0].embeds != NULL,
                       .has_tables = batch_has_tables(b),
                       .n_rows = batch_n_logit_rows(b),
                       .n_tokens = batch_n_tokens(b),
                       .want_hidden = hidden};
    for (int s = 0; f.has_tables && s < b->n_seqs; s++)
        f.n_blocks += b->seqs[s].n_blocks;
    *len = fwd_bytes(&f, dim);
    if (*len > *cap) {
        uint8_t *p = wrealloc(*buf, *len);
        if (!p)
            return err_set(e, WELD_ERR_NOMEM, "tensor parallel: out of memory for a step");
        *buf = p, *cap = *len;
    }
    uint8_t *w = *buf;
#define PUT(src, n) (memcpy(w, (src), (n)), w += (n))
    PUT(&f, sizeof f);
    for (int s = 0; s < b->n_seqs; s++) {
        const struct batch_seq *q = &b->seqs[s];
        int32_t v[6] = {
            q->seq_id,    q->n_tokens, q->pos, q->all_logits, f.has_tables ? q->n_blocks : 0,
            q->all_hidden};
        PUT(v, sizeof v);
    }
    for (int s = 0; s < b->n_seqs; s++)
        PUT(b->seqs[s].tokens, (size_t)b->seqs[s].n_tokens * 4);
    for (int s = 0; f.has_tables && s < b->n_seqs; s++)
        PUT(b->seqs[s].blocks, (size_t)b->seqs[s].n_blocks * 4);
    for (int i = 0; i < b->n_copies; i++) {
        int32_t v[2] = {b->copies[i].src, b->copies[i].dst};
        PUT(v, sizeof v);
    }
    for (int r = 0; f.want_tops && r < f.n_rows; r++)
        PUT(&tops[r].inv_t, 4);
    for (int s = 0; f.has_embeds && s < b->n_seqs; s++)
        PUT(b->seqs[s].embeds, (size_t)b->seqs[s].n_tokens * (size_t)dim * 4);
#undef PUT
    return WELD_OK;
}

/* ---- a worker's state ------------------------------------------------------------------ */

/* Pipeline parallelism: the step's sequences in micro-batches [mb[k], mb[k + 1]), k < the
   count returned, near equal in tokens, so stage s runs micro-batch k while stage s + 1
   runs k - 1. One (the whole step) with one stage, when hidden states are wanted, or for
   one sequence (a prompt is not cut across micro-batches). Rank 0 and the workers cut
   the same way. mb: room for pp + 1. */
static int mb_split(const struct batch *b, int pp, bool hidden, int *mb)
{
    const long long total = batch_n_tokens(b);
    int want = pp > 1 && !hidden ? (b->n_seqs < pp ? b->n_seqs : pp) : 1;
    /* a micro-batch re-reads the stage's weights: below TP_MB_TOKENS tokens each (decode
       steps) that costs more than the overlap gives */
    while (want > 1 && total < (long long)want * TP_MB_TOKENS)
        want--;
    long long acc = 0;
    int k = 1;
    mb[0] = 0;
    for (int s = 0; s < b->n_seqs && k < want; s++) {
        acc += b->seqs[s].n_tokens;
        if (acc * want >= total * k && b->n_seqs - (s + 1) >= want - k)
            mb[k++] = s + 1;
    }
    mb[k] = b->n_seqs;
    return k;
}

/* Micro-batch k of b (sequences [mb[k], mb[k + 1]); the block copies go with the first). */
static struct batch mb_batch(const struct batch *b, const int *mb, int k, int *row0)
{
    struct batch s = {.seqs = b->seqs + mb[k],
                      .n_seqs = mb[k + 1] - mb[k],
                      .copies = k ? NULL : b->copies,
                      .n_copies = k ? 0 : b->n_copies,
                      .copies_fill = b->copies_fill};
    struct batch before = {.seqs = b->seqs, .n_seqs = mb[k]};
    *row0 = mb[k] ? batch_n_logit_rows(&before) : 0;
    return s;
}

struct tp_worker {
    struct tp_group *g;
    void *ctx[TP_MAX_CTX];
    uint8_t *in; /* the last payload */
    size_t cap_in;
    struct batch_seq *seqs;
    int cap_seqs;
    struct kv_block_copy *copies;
    int cap_copies;
    float *logits; /* (rows, n_vocab) */
    size_t cap_logits;
    struct logits_top *tops;
    float *stats; /* (rows, 2, n_chunks) */
    int cap_rows;
    float *hidden; /* (hidden rows, dim) */
    size_t cap_hidden;
    uint8_t *out[PROG_KPARTS_MAX + 1]; /* each micro-batch's result (a pipeline holds at
                                          most PROG_KPARTS_MAX stages) */
    size_t cap_out[PROG_KPARTS_MAX + 1];
};

/* Bytes of a worker's FORWARD result: logits columns [v0, v1) of every row, a tp_top per
   row if tops are wanted, and max and sum of chunks [v0 / CHUNK, ceil(v1 / CHUNK)) of each
   row that asked for statistics. */
/* The statistics chunks wholly inside rank rows [v0, v1) of a vocabulary of V: [*c0, *c1)
   (a chunk a rank boundary cuts is rank 0's to compute once the logits are merged). */
static void stat_chunks(int V, int v0, int v1, int *c0, int *c1)
{
    *c0 = (v0 + LOGITS_CHUNK - 1) / LOGITS_CHUNK;
    *c1 = v1 == V ? logits_n_chunks(V) : v1 / LOGITS_CHUNK;
    if (*c1 < *c0)
        *c1 = *c0;
}

static size_t result_bytes(int V, int n_rows, int v0, int v1, bool tops, int n_stat_rows)
{
    int c0, c1;
    stat_chunks(V, v0, v1, &c0, &c1);
    const int nch = c1 - c0;
    return (size_t)n_rows * (size_t)(v1 - v0) * 4 +
           (tops ? (size_t)n_rows * sizeof(struct tp_top) : 0) + (size_t)n_stat_rows * 2 * nch * 4;
}

static int grow(void **p, size_t *cap, size_t need)
{
    if (need <= *cap)
        return 0;
    void *q = wrealloc(*p, need);
    if (!q)
        return -1;
    *p = q, *cap = need;
    return 0;
}

static int worker_forward(struct tp_worker *w, void *ctx, size_t n, struct weld_err *e)
{
    const struct model_config *c = &w->g->m->cfg;
    struct tp_fwd f;
    if (n < sizeof f)
        return err_set(e, WELD_ERR_INTERNAL, "tensor parallel: short step message");
    memcpy(&f, w->in, sizeof f);
    if (fwd_bytes(&f, c->dim) != n || f.n_seqs < 1 || f.n_rows < 1)
        return err_set(e, WELD_ERR_INTERNAL, "tensor parallel: bad step message");
    if (f.n_seqs > w->cap_seqs) {
        void *p = wrealloc(w->seqs, (size_t)f.n_seqs * sizeof *w->seqs);
        if (!p)
            return err_set(e, WELD_ERR_NOMEM, "tensor parallel: out of memory");
        w->seqs = p, w->cap_seqs = f.n_seqs;
    }
    if (f.n_copies > w->cap_copies) {
        void *p = wrealloc(w->copies, (size_t)f.n_copies * sizeof *w->copies);
        if (!p)
            return err_set(e, WELD_ERR_NOMEM, "tensor parallel: out of memory");
        w->copies = p, w->cap_copies = f.n_copies;
    }
    const uint8_t *r = w->in + sizeof f;
    const int32_t *sv = (const int32_t *)r;
    r += (size_t)f.n_seqs * 24;
    const int32_t *tok = (const int32_t *)r;
    r += (size_t)f.n_tokens * 4;
    const int32_t *blk = (const int32_t *)r;
    r += (size_t)f.n_blocks * 4;
    for (int i = 0; i < f.n_copies; i++, r += 8) {
        memcpy(&w->copies[i].src, r, 4);
        memcpy(&w->copies[i].dst, r + 4, 4);
    }
    const float *inv_t = (const float *)r;
    r += f.want_tops ? (size_t)f.n_rows * 4 : 0;
    const float *emb = f.has_embeds ? (const float *)r : NULL;
    long long nt = 0, nb = 0;
    for (int s = 0; s < f.n_seqs; s++) {
        const int32_t *v = sv + 6 * s;
        if (v[1] < 1 || nt + v[1] > f.n_tokens || v[4] < 0 || nb + v[4] > f.n_blocks)
            return err_set(e, WELD_ERR_INTERNAL, "tensor parallel: bad step message");
        w->seqs[s] = (struct batch_seq){.seq_id = v[0],
                                        .tokens = tok + nt,
                                        .n_tokens = v[1],
                                        .pos = v[2],
                                        .all_logits = v[3] != 0,
                                        .blocks = f.has_tables ? blk + nb : NULL,
                                        .n_blocks = v[4],
                                        .all_hidden = v[5] != 0,
                                        .embeds = emb ? emb + nt * c->dim : NULL};
        nt += v[1], nb += v[4];
    }
    struct batch b = {.seqs = w->seqs,
                      .n_seqs = f.n_seqs,
                      .copies = w->copies,
                      .n_copies = f.n_copies,
                      .copies_fill = f.copies_fill != 0};
    const int nch = logits_n_chunks(c->n_vocab);
    if (f.n_rows > w->cap_rows) {
        void *t = wrealloc(w->tops, (size_t)f.n_rows * sizeof *w->tops);
        if (t)
            w->tops = t;
        void *st = wrealloc(w->stats, (size_t)f.n_rows * 2 * (size_t)nch * sizeof(float));
        if (st)
            w->stats = st;
        if (!t || !st)
            return err_set(e, WELD_ERR_NOMEM, "tensor parallel: out of memory");
        w->cap_rows = f.n_rows;
    }
    const size_t old_cap = w->cap_logits;
    if (grow((void **)&w->logits, &w->cap_logits,
             (size_t)f.n_rows * (size_t)c->n_vocab * sizeof(float)))
        return err_set(e, WELD_ERR_NOMEM, "tensor parallel: out of memory for logits");
    if (w->cap_logits > old_cap) /* other ranks' columns are never written here */
        memset(w->logits, 0, w->cap_logits);
    const struct tp_group *g = w->g;
    const bool last = g->stage == g->pp - 1, hid = f.want_hidden && last && g->tp_rank == 0;
    const int n_hid = hid ? batch_n_hidden_rows(&b) : 0;
    if (hid &&
        grow((void **)&w->hidden, &w->cap_hidden, (size_t)n_hid * (size_t)c->dim * sizeof(float)))
        return err_set(e, WELD_ERR_NOMEM, "tensor parallel: out of memory for hidden states");
    for (int i = 0; f.want_tops && i < f.n_rows; i++)
        w->tops[i] = (struct logits_top){.inv_t = inv_t[i],
                                         .chunk_max = w->stats + (size_t)i * 2 * nch,
                                         .chunk_sum = w->stats + (size_t)i * 2 * nch + nch};
    int mb[PROG_KPARTS_MAX + 1];
    const int M = mb_split(&b, g->pp, f.want_hidden != 0, mb);
    const int v0 = exec_tp_vocab_cut(c->n_vocab, g->tp_rank, g->tp);
    const int v1 = exec_tp_vocab_cut(c->n_vocab, g->tp_rank + 1, g->tp);
    struct comm_req *reqs[2 * (PROG_KPARTS_MAX + 1)] = {0};
    struct tp_status sts[PROG_KPARTS_MAX + 1];
    int rc = WELD_OK, send_rc = WELD_OK;
    struct weld_err err = {0};
    for (int k = 0; k < M; k++) {
        int r0;
        const struct batch bk = mb_batch(&b, mb, k, &r0);
        const int rows = batch_n_logit_rows(&bk);
        if (!rc)
            rc = backend_cpu.forward(ctx, &bk, w->logits + (size_t)r0 * c->n_vocab,
                                     f.want_tops ? w->tops + r0 : NULL, hid ? w->hidden : NULL,
                                     &err);
        if (!last)
            continue;
        /* the last stage: this micro-batch's status, then its result, sent at once */
        sts[k] = (struct tp_status){.rc = rc};
        if (rc)
            snprintf(sts[k].msg, sizeof sts[k].msg, "%s", err.msg);
        if (!send_rc)
            send_rc = comm_isend(g->c, &sts[k], sizeof sts[k], 0, TP_TAG_STATUS, &reqs[2 * k], e);
        if (rc || send_rc)
            continue;
        int n_stat = 0;
        for (int i = r0; f.want_tops && i < r0 + rows; i++)
            n_stat += inv_t[i] > 0.0f;
        const size_t len = result_bytes(c->n_vocab, rows, v0, v1, f.want_tops, n_stat) +
                           (size_t)n_hid * (size_t)c->dim * sizeof(float);
        if (grow((void **)&w->out[k], &w->cap_out[k], len)) {
            send_rc = err_set(e, WELD_ERR_NOMEM, "tensor parallel: out of memory for a result");
            continue;
        }
        uint8_t *o = w->out[k];
        for (int i = r0; i < r0 + rows; i++, o += (size_t)(v1 - v0) * 4)
            memcpy(o, w->logits + (size_t)i * c->n_vocab + v0, (size_t)(v1 - v0) * 4);
        for (int i = r0; f.want_tops && i < r0 + rows; i++, o += sizeof(struct tp_top)) {
            struct tp_top t = {.n = w->tops[i].n, .n_nan = w->tops[i].n_nan};
            memcpy(t.ids, w->tops[i].ids, sizeof t.ids);
            memcpy(t.vals, w->tops[i].vals, sizeof t.vals);
            memcpy(o, &t, sizeof t);
        }
        int c0, c1;
        stat_chunks(c->n_vocab, v0, v1, &c0, &c1);
        for (int i = r0; f.want_tops && i < r0 + rows; i++) {
            if (!(inv_t[i] > 0.0f))
                continue;
            memcpy(o, w->tops[i].chunk_max + c0, (size_t)(c1 - c0) * 4);
            o += (size_t)(c1 - c0) * 4;
            memcpy(o, w->tops[i].chunk_sum + c0, (size_t)(c1 - c0) * 4);
            o += (size_t)(c1 - c0) * 4;
        }
        if (n_hid) { /* one micro-batch when hidden states are wanted */
            memcpy(o, w->hidden, (size_t)n_hid * (size_t)c->dim * sizeof(float));
            o += (size_t)n_hid * (size_t)c->dim * sizeof(float);
        }
        WELD_ASSERT((size_t)(o - w->out[k]) == len);
        send_rc = comm_isend(g->c, w->out[k], len, 0, TP_TAG_RESULT, &reqs[2 * k + 1], e);
    }
    for (int i = 0; i < 2 * M; i++) {
        struct weld_err we;
        int wr = comm_wait(g->c, reqs[i], &we);
        if (wr && !send_rc)
            send_rc = err_set(e, wr, "%s", we.msg);
    }
    if (send_rc)
        return send_rc; /* the group is broken: the worker loop ends */
    if (!last) {        /* one status for the whole step */
        struct tp_status st = {.rc = rc};
        if (rc)
            snprintf(st.msg, sizeof st.msg, "%s", err.msg);
        return comm_send(g->c, &st, sizeof st, 0, TP_TAG_STATUS, e);
    }
    return WELD_OK;
}

static int send_status(struct tp_group *g, int rc, const struct weld_err *err, struct weld_err *e)
{
    struct tp_status st = {.rc = rc};
    if (rc)
        snprintf(st.msg, sizeof st.msg, "%s", err->msg);
    return comm_send(g->c, &st, sizeof st, 0, TP_TAG_STATUS, e);
}

static int worker_create(struct tp_worker *w, int slot, size_t n, struct weld_err *e)
{
    struct tp_create cr;
    if (n != sizeof cr || slot < 0 || slot >= TP_MAX_CTX || w->ctx[slot])
        return err_set(e, WELD_ERR_INTERNAL, "tensor parallel: bad create message");
    memcpy(&cr, w->in, sizeof cr);
    cr.executor[sizeof cr.executor - 1] = '\0';
    cr.model[sizeof cr.model - 1] = '\0';
    if (!w->g->m) {
        int rc = model_load(&w->g->own, cr.model, e);
        if (rc)
            return rc;
        w->g->m = w->g->own;
    } else if (strcmp(w->g->m->path, cr.model)) {
        return err_set(e, WELD_ERR_INVALID_ARG,
                       "tensor parallel: rank 0 asks for '%s', this "
                       "rank holds '%s'",
                       cr.model, w->g->m->path);
    }
    struct backend_params p = {.max_seqs = cr.max_seqs,
                               .max_ctx = cr.max_ctx,
                               .n_splits = cr.n_splits,
                               .n_threads = cr.n_threads,
                               .oversubscribe = cr.oversubscribe != 0,
                               .kv_block_size = cr.kv_block_size,
                               .kv_blocks = cr.kv_blocks,
                               .kv_type = (enum weld_dtype)cr.kv_type};
    p.tuning = (struct exec_tuning){.executor = cr.executor[0] ? cr.executor : NULL,
                                    .kv_groups = cr.kv_groups,
                                    .decode_pairs = (enum tune_pairs)cr.decode_pairs,
                                    .l2_prefetch = (enum tune_switch)cr.l2_prefetch,
                                    .repack = (enum tune_switch)cr.repack,
                                    .trace_steps = cr.trace_steps,
                                    .dump_program = cr.dump_program != 0,
                                    .k_parts = cr.k_parts,
                                    .tp_overlap = (enum tune_switch)cr.tp_overlap,
                                    .tp = w->g};
    return backend_cpu.ctx_create(&w->ctx[slot], w->g->m, &p, e);
}

int tp_worker_run(struct tp_group *g, struct weld_err *e)
{
    struct tp_worker w = {.g = g};
    int rc = WELD_OK;
    for (;;) {
        struct tp_msg h;
        if ((rc = comm_bcast(g->c, &h, sizeof h, 0, true, e)))
            break;
        if (h.payload < 0 || grow((void **)&w.in, &w.cap_in, (size_t)h.payload)) {
            rc = err_set(e, WELD_ERR_NOMEM, "tensor parallel: out of memory for a message");
            break;
        }
        if (h.payload && (rc = comm_bcast(g->c, w.in, (size_t)h.payload, 0, false, e)))
            break;
        if (h.op == TP_STOP)
            break;
        void *ctx = h.slot >= 0 && h.slot < TP_MAX_CTX ? w.ctx[h.slot] : NULL;
        struct weld_err err = {0};
        int r;
        switch (h.op) {
        case TP_CREATE:
            r = worker_create(&w, h.slot, (size_t)h.payload, &err);
            rc = send_status(g, r, &err, e);
            break;
        case TP_FORWARD:
            /* statuses and results go to rank 0 from inside; an error here is the group's */
            rc = ctx ? worker_forward(&w, ctx, (size_t)h.payload, e)
                     : err_set(e, WELD_ERR_INTERNAL, "tensor parallel: no context %d", h.slot);
            break;
        case TP_DROP:
            if (ctx)
                backend_cpu.drop_seq(ctx, h.arg);
            break;
        case TP_RESET:
            if (ctx)
                backend_cpu.reset(ctx);
            break;
        case TP_FREE:
            if (ctx)
                backend_cpu.ctx_free(ctx);
            if (h.slot >= 0 && h.slot < TP_MAX_CTX)
                w.ctx[h.slot] = NULL;
            break;
        default: rc = err_set(e, WELD_ERR_INTERNAL, "tensor parallel: unknown message %d", h.op);
        }
        if (rc)
            break;
    }
    struct comm_stats cs;
    comm_stats_get(g->c, &cs, false);
    log_debug("tensor parallel rank %d: %.3f s in %llu exchanges, %.1f MB sent, %.1f MB "
              "received",
              g->rank, cs.wait_s, (unsigned long long)cs.calls, (double)cs.bytes_sent / 1e6,
              (double)cs.bytes_recv / 1e6);
    for (int i = 0; i < TP_MAX_CTX; i++)
        if (w.ctx[i])
            backend_cpu.ctx_free(w.ctx[i]);
    wfree(w.in), wfree(w.seqs), wfree(w.copies), wfree(w.logits), wfree(w.tops);
    wfree(w.stats), wfree(w.hidden);
    for (int i = 0; i <= PROG_KPARTS_MAX; i++)
        wfree(w.out[i]);
    return rc;
}

/* ---- rank 0 ---------------------------------------------------------------------------- */

struct tp_ctx {
    struct tp_group *g;
    const struct model *m;
    int slot;
    void *cpu;    /* rank 0's own shard */
    uint8_t *msg; /* FORWARD payload */
    size_t cap_msg;
    uint8_t *res; /* one worker's result */
    size_t cap_res;
    struct logits_top *parts; /* (size) a row's tops to merge */
    char desc[300];
};

static bool slots_used[TP_MAX_CTX];

/* Every worker's status; the first failure becomes e, naming the rank. */
static int collect_status(struct tp_ctx *t, int rc, struct weld_err *e)
{
    for (int r = 1; r < t->g->size; r++) {
        struct tp_status st;
        struct weld_err ce = {0};
        if (comm_recv(t->g->c, &st, sizeof st, r, TP_TAG_STATUS, &ce))
            return rc ? rc : err_set(e, WELD_ERR_IO, "%s", ce.msg);
        st.msg[sizeof st.msg - 1] = '\0';
        if (st.rc && !rc)
            rc = err_set(e, st.rc, "tensor parallel rank %d: %s", r, st.msg);
    }
    return rc;
}

static void tp_ctx_free(void *ctx)
{
    struct tp_ctx *t = ctx;
    if (!t)
        return;
    struct weld_err e = {0};
    if (t->slot >= 0 && !comm_broken(t->g->c))
        send_msg(t->g, TP_FREE, t->slot, 0, NULL, 0, &e);
    if (t->slot >= 0)
        slots_used[t->slot] = false;
    if (t->cpu)
        backend_cpu.ctx_free(t->cpu);
    wfree(t->msg), wfree(t->res), wfree(t->parts);
    wfree(t);
}

static int tp_ctx_create(void **out, const struct model *m, const struct backend_params *p,
                         struct weld_err *e)
{
    *out = NULL;
    struct tp_group *g = p->tuning.tp;
    if (g && g->rank == 0 && !g->m)
        g->m = m;
    if (!g || g->rank != 0 || m != g->m)
        return err_set(e, WELD_ERR_INVALID_ARG,
                       "tensor parallel: a context of the group's "
                       "model on rank 0 only");
    if (comm_broken(g->c))
        return err_set(e, WELD_ERR_IO, "tensor parallel: the ranks lost each other earlier");
    struct tp_ctx *t = wcalloc(1, sizeof *t);
    if (!t || !(t->parts = wcalloc((size_t)g->size, sizeof *t->parts))) {
        wfree(t);
        return err_set(e, WELD_ERR_NOMEM, "tensor parallel: out of memory");
    }
    t->g = g, t->m = m, t->slot = -1;
    for (int i = 0; i < TP_MAX_CTX && t->slot < 0; i++)
        if (!slots_used[i])
            t->slot = i;
    if (t->slot < 0) {
        wfree(t->parts), wfree(t);
        return err_set(e, WELD_ERR_LIMIT, "tensor parallel: more than %d contexts at once",
                       TP_MAX_CTX);
    }
    slots_used[t->slot] = true;
    const struct exec_tuning *u = &p->tuning;
    struct tp_create cr = {.max_seqs = p->max_seqs,
                           .max_ctx = p->max_ctx,
                           .n_splits = p->n_splits,
                           .n_threads = p->n_threads,
                           .kv_block_size = p->kv_block_size,
                           .kv_blocks = p->kv_blocks,
                           .kv_type = (int32_t)p->kv_type,
                           .oversubscribe = p->oversubscribe,
                           .kv_groups = u->kv_groups,
                           .decode_pairs = (int32_t)u->decode_pairs,
                           .l2_prefetch = (int32_t)u->l2_prefetch,
                           .repack = (int32_t)u->repack,
                           .trace_steps = u->trace_steps,
                           .dump_program = u->dump_program,
                           .k_parts = u->k_parts,
                           .tp_overlap = (int32_t)u->tp_overlap};
    if (u->executor)
        snprintf(cr.executor, sizeof cr.executor, "%s", u->executor);
    if (!m->path || strlen(m->path) >= sizeof cr.model) {
        slots_used[t->slot] = false;
        wfree(t->parts), wfree(t);
        return err_set(e, WELD_ERR_INVALID_ARG,
                       "tensor parallel: the model needs a path of "
                       "under %zu bytes that every rank can open",
                       sizeof cr.model);
    }
    snprintf(cr.model, sizeof cr.model, "%s", m->path);
    int rc = send_msg(g, TP_CREATE, t->slot, 0, &cr, sizeof cr, e);
    if (rc) {
        slots_used[t->slot] = false;
        t->slot = -1;
        tp_ctx_free(t);
        return rc;
    }
    rc = backend_cpu.ctx_create(&t->cpu, m, p, e);
    rc = collect_status(t, rc, e);
    if (rc) {
        tp_ctx_free(t);
        return rc;
    }
    snprintf(t->desc, sizeof t->desc, "tensor parallel %d, rank 0 %s", g->size,
             backend_cpu.describe(t->cpu));
    *out = t;
    return WELD_OK;
}

/* Merge the result (in t->res) of the last stage's TP rank tr for rows of one
   micro-batch (logits, tops: its first row's; hidden: NULL or its hidden rows) into the
   caller's buffers. */
static void merge_result(struct tp_ctx *t, int tr, int n_rows, float *logits,
                         struct logits_top *tops, float *hidden, int n_hidden)
{
    const int V = t->m->cfg.n_vocab, n = t->g->tp;
    const int v0 = exec_tp_vocab_cut(V, tr, n), v1 = exec_tp_vocab_cut(V, tr + 1, n);
    const uint8_t *o = t->res;
    for (int i = 0; i < n_rows; i++, o += (size_t)(v1 - v0) * 4)
        memcpy(logits + (size_t)i * V + v0, o, (size_t)(v1 - v0) * 4);
    for (int i = 0; tops && i < n_rows; i++, o += sizeof(struct tp_top)) {
        struct tp_top w;
        memcpy(&w, o, sizeof w);
        struct logits_top parts[2] = {tops[i], {.n = w.n, .n_nan = w.n_nan}};
        memcpy(parts[1].ids, w.ids, sizeof w.ids);
        memcpy(parts[1].vals, w.vals, sizeof w.vals);
        logits_top_merge(&tops[i], parts, 2);
    }
    int c0, c1;
    stat_chunks(V, v0, v1, &c0, &c1);
    for (int i = 0; tops && i < n_rows; i++) {
        if (!(tops[i].inv_t > 0.0f))
            continue;
        memcpy(tops[i].chunk_max + c0, o, (size_t)(c1 - c0) * 4);
        o += (size_t)(c1 - c0) * 4;
        memcpy(tops[i].chunk_sum + c0, o, (size_t)(c1 - c0) * 4);
        o += (size_t)(c1 - c0) * 4;
    }
    if (hidden)
        memcpy(hidden, o, (size_t)n_hidden * (size_t)t->m->cfg.dim * sizeof(float));
}

/* Rank 0's step: broadcast it, run this rank's part of every micro-batch, then take each
   micro-batch's status and result from every rank of the last stage (in micro-batch
   order, as they sent them) and the status of every other rank. */
static int tp_forward(void *ctx, const struct batch *b, float *logits, struct logits_top *tops,
                      float *hidden, struct weld_err *e)
{
    struct tp_ctx *t = ctx;
    const struct tp_group *g = t->g;
    const struct model_config *c = &t->m->cfg;
    int rc = batch_validate(b, INT32_MAX, INT32_MAX, c->n_vocab, e);
    if (rc)
        return rc;
    size_t len = 0;
    if ((rc = fwd_pack(b, tops, hidden != NULL, c->dim, &t->msg, &t->cap_msg, &len, e)) ||
        (rc = send_msg(t->g, TP_FORWARD, t->slot, 0, t->msg, len, e)))
        return rc;
    int mb[PROG_KPARTS_MAX + 1];
    const int M = mb_split(b, g->pp, hidden != NULL, mb);
    for (int k = 0; k < M && !rc; k++) {
        int r0;
        const struct batch bk = mb_batch(b, mb, k, &r0);
        rc = backend_cpu.forward(t->cpu, &bk, logits + (size_t)r0 * c->n_vocab,
                                 tops ? tops + r0 : NULL, g->pp == 1 ? hidden : NULL, e);
    }
    const int n_hid = hidden ? batch_n_hidden_rows(b) : 0;
    for (int k = 0; k < M; k++) {
        int r0;
        const struct batch bk = mb_batch(b, mb, k, &r0);
        const int rows = batch_n_logit_rows(&bk);
        int n_stat = 0;
        for (int i = r0; tops && i < r0 + rows; i++)
            n_stat += tops[i].inv_t > 0.0f;
        for (int tr = 0; tr < g->tp; tr++) {
            const int src = (g->pp - 1) * g->tp + tr;
            if (src == 0)
                continue; /* rank 0's own part */
            struct tp_status st;
            struct weld_err ce = {0};
            if (comm_recv(g->c, &st, sizeof st, src, TP_TAG_STATUS, &ce))
                return err_set(e, WELD_ERR_IO, "%s", ce.msg);
            st.msg[sizeof st.msg - 1] = '\0';
            if (st.rc) {
                if (!rc)
                    rc = err_set(e, st.rc, "tensor parallel rank %d: %s", src, st.msg);
                continue;
            }
            const bool hid = hidden && tr == 0 && g->pp > 1;
            const size_t n = result_bytes(c->n_vocab, rows,
                                          exec_tp_vocab_cut(c->n_vocab, tr, g->tp),
                                          exec_tp_vocab_cut(c->n_vocab, tr + 1, g->tp),
                                          tops != NULL, n_stat) +
                             (hid ? (size_t)n_hid * (size_t)c->dim * sizeof(float) : 0);
            if (grow((void **)&t->res, &t->cap_res, n))
                return err_set(e, WELD_ERR_NOMEM, "tensor parallel: out of memory for a result");
            if (comm_recv(g->c, t->res, n, src, TP_TAG_RESULT, &ce))
                return err_set(e, WELD_ERR_IO, "%s", ce.msg);
            merge_result(t, tr, rows, logits + (size_t)r0 * c->n_vocab, tops ? tops + r0 : NULL,
                         hid ? hidden : NULL, n_hid);
        }
    }
    for (int src = 1; src < (g->pp - 1) * g->tp; src++) { /* the stages before the last */
        struct tp_status st;
        struct weld_err ce = {0};
        if (comm_recv(g->c, &st, sizeof st, src, TP_TAG_STATUS, &ce))
            return err_set(e, WELD_ERR_IO, "%s", ce.msg);
        st.msg[sizeof st.msg - 1] = '\0';
        if (st.rc && !rc)
            rc = err_set(e, st.rc, "tensor parallel rank %d: %s", src, st.msg);
    }
    if (rc)
        return rc;
    /* the statistics chunks a rank boundary cuts, from the merged rows */
    const int n_rows = batch_n_logit_rows(b);
    for (int r = 1; tops && r < g->tp; r++) {
        const int v = exec_tp_vocab_cut(c->n_vocab, r, g->tp), ch = v / LOGITS_CHUNK;
        for (int i = 0; v % LOGITS_CHUNK && i < n_rows; i++)
            if (tops[i].inv_t > 0.0f)
                logits_stats_chunks(&tops[i], logits + (size_t)i * c->n_vocab, c->n_vocab, ch,
                                    ch + 1, NULL);
    }
    return WELD_OK;
}

static void tp_drop_seq(void *ctx, int seq_id)
{
    struct tp_ctx *t = ctx;
    struct weld_err e = {0};
    if (!comm_broken(t->g->c) && send_msg(t->g, TP_DROP, t->slot, seq_id, NULL, 0, &e))
        log_error("tensor parallel: %s", e.msg);
    backend_cpu.drop_seq(t->cpu, seq_id);
}

static int tp_seq_len(void *ctx, int seq_id)
{
    struct tp_ctx *t = ctx;
    return backend_cpu.seq_len(t->cpu, seq_id);
}

static void tp_reset(void *ctx)
{
    struct tp_ctx *t = ctx;
    struct weld_err e = {0};
    if (!comm_broken(t->g->c) && send_msg(t->g, TP_RESET, t->slot, 0, NULL, 0, &e))
        log_error("tensor parallel: %s", e.msg);
    backend_cpu.reset(t->cpu);
}

static void tp_park(void *ctx)
{
    struct tp_ctx *t = ctx;
    backend_cpu.park(t->cpu);
}

struct tp_group *backend_tp_group(void *ctx)
{
    return ((struct tp_ctx *)ctx)->g;
}

void *backend_tp_local(void *ctx)
{
    return ((struct tp_ctx *)ctx)->cpu;
}

static bool tp_broken(void *ctx)
{
    struct tp_ctx *t = ctx;
    return comm_broken(t->g->c);
}

static const char *tp_describe(void *ctx)
{
    struct tp_ctx *t = ctx;
    return t->desc;
}

const struct backend_iface backend_tp = {
    .name = "tp",
    .ctx_create = tp_ctx_create,
    .ctx_free = tp_ctx_free,
    .forward = tp_forward,
    .drop_seq = tp_drop_seq,
    .seq_len = tp_seq_len,
    .reset = tp_reset,
    .park = tp_park,
    .describe = tp_describe,
    .broken = tp_broken,
};

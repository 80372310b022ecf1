/*
 * program - the builder and buffer planner: the shape of a batch -> an instruction list.
 *
 * Build order: fill the shape tables from the batch (fill_shape); emit EMBED, each layer
 * (emit_layer, or emit_layer_kp with K parts) and FINAL as stages, each a run of
 * instructions sharing one counter, recording each buffer's first write and last read;
 * then place the buffers in the arena (plan_buffers). What each opcode computes, over
 * which rows and buffers, is written above its function in exec/ops.c; every executor
 * must give exactly those results.
 *
 * Splits: EMBED by tokens, QKV by head units, ATTENTION by sequence and KV-head range
 * (attn_pieces); the matrix ops by output rows at multiples of 16, the group size of
 * repacked weights (emit_split_n), and FINAL as the comment in program_build_kp says.
 *
 * PROG_HEAD_DEPS: the QKV stage is cut into G = min(n_splits, n_kv_head) KV-head groups,
 * each signalling a counter of its own (emit_qkv_groups), and an ATTENTION over KV heads
 * [h0, h1) waits only on the counters of the groups holding them. Needs n_head % n_kv_head
 * == 0.
 *
 * K parts (program.kp.n > 1; program_build_kp with the weights' cuts, exec/weights.h): a
 * layer's O, FFN and DOWN give way to O_PART and FFN_DOWN_PART (emit_layer_kp), so a
 * layer needs other workers' outputs twice instead of four times.
 *
 * Invariants: instructions of one stage write disjoint outputs and read only what earlier
 * stages finished, so any number of workers run a stage without atomics; every wait names
 * counters signalled only by earlier instructions, so list order is a valid serial
 * schedule. Buffer liveness is taken at stage granularity (widen_to_stages), so buffers
 * whose stage ranges do not overlap share memory with no extra synchronisation.
 */
#include "exec/program.h"

#include "core/alloc.h"
#include "exec/logits_top.h"

#include <limits.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define PROG_MAX_SPLITS 4096
#define PROG_ALIGN_FLOATS 16 /* 64 bytes */
#define PROG_ROW_ALIGN 16    /* weight-row splits start at multiples of this (gemm.h) */
#define PROG_FINAL_ROWS 2048 /* LM head rows per slice when a step has few logit rows... */
#define PROG_FINAL_FEW_ROWS 16 /* ... at most this many */
#define PROG_FINAL_MAX 64    /* and at most this many slices */
#define PROG_OVERLAP_TOKENS 64 /* tensor parallelism: token groups of at least this many */
#define PROG_OVERLAP_ALIGN 16  /* start on a token tile (exec/weights.h EXEC_TILE) */
#define PROG_RS_BYTES (64u << 10) /* reduce-scatter exchanges from this size of a block on */

static const char *const op_names[OP_COUNT] = {
    "EMBED",
    "ATTN_NORM_QKV_ROPE",
    "ATTENTION",
    "O_PROJ_RESIDUAL",
    "FFN_NORM_GATE_UP_SILU",
    "DOWN_PROJ_RESIDUAL",
    "FINAL_NORM_LOGITS",
    "O_PART",
    "FFN_DOWN_PART",
    "MOE_ROUTE",
    "MOE_GATE_UP",
    "MOE_DOWN",
    "MOE_COMBINE",
    "MLA_PROJ_A",
    "MLA_Q_KV",
    "ALLGATHER",
    "SEND_X",
    "RECV_X",
    "AG_START",
    "AG_WAIT",
    "MOE_EXCHANGE",
    "REDUCE",
};

const char *prog_op_name(int op)
{
    return op >= 0 && op < OP_COUNT ? op_names[op] : "?";
}

void program_free(struct program *p)
{
    if (!p)
        return;
    wfree(p->seq_ntok);
    wfree(p->seq_all_logits);
    wfree(p->seq_tok0);
    wfree(p->tok_seq);
    wfree(p->logit_tok);
    wfree(p->instrs);
    wfree(p->stage_first);
    wfree(p->bufs);
    wfree(p);
}

bool program_matches(const struct program *p, const struct batch *b)
{
    if (!p || p->n_seqs != b->n_seqs)
        return false;
    for (int s = 0; s < b->n_seqs; s++)
        if (p->seq_ntok[s] != b->seqs[s].n_tokens ||
            p->seq_all_logits[s] != b->seqs[s].all_logits)
            return false;
    return true;
}

static int fill_shape(struct program *p, const struct batch *b)
{
    p->n_seqs = b->n_seqs;
    p->n_tokens = batch_n_tokens(b);
    p->n_logit_rows = batch_n_logit_rows(b);
    p->seq_ntok = wcalloc((size_t)p->n_seqs, sizeof(int));
    p->seq_all_logits = wcalloc((size_t)p->n_seqs, sizeof(bool));
    p->seq_tok0 = wcalloc((size_t)p->n_seqs, sizeof(int));
    p->tok_seq = wcalloc((size_t)p->n_tokens, sizeof(int));
    p->logit_tok = wcalloc((size_t)p->n_logit_rows, sizeof(int));
    if (!p->seq_ntok || !p->seq_all_logits || !p->seq_tok0 || !p->tok_seq || !p->logit_tok)
        return WELD_ERR_NOMEM;
    int t = 0, r = 0;
    for (int s = 0; s < b->n_seqs; s++) {
        const struct batch_seq *bs = &b->seqs[s];
        p->seq_ntok[s] = bs->n_tokens;
        p->seq_all_logits[s] = bs->all_logits;
        p->seq_tok0[s] = t;
        for (int i = 0; i < bs->n_tokens; i++, t++) {
            p->tok_seq[t] = s;
            if (bs->all_logits || i == bs->n_tokens - 1)
                p->logit_tok[r++] = t;
        }
    }
    return WELD_OK;
}

/* ---- emitting ---------------------------------------------------------------------- */

struct builder {
    struct program *p;
    int cap;
    int wait, n_wait, wait_count; /* what the current stage's instructions wait on */
    int stage_counter;            /* counter the current stage signals (single-counter) */
    int stage_first;              /* first instruction of the current stage */
    bool x_whole;                 /* K parts: the residual stream after the layers emitted
                                     so far is whole in X (EMBED / RECV_X, a MoE layer, a
                                     reduce-scatter layer); false: xmid + the down sums */
};

/* A stage whose instructions all signal one new counter. */
static void stage_begin(struct builder *bd)
{
    bd->stage_first = bd->p->n_instr;
    bd->stage_counter = bd->p->n_counters++;
}

/* The next stage waits for every instruction of this one. */
static void stage_end(struct builder *bd)
{
    bd->wait = bd->stage_counter;
    bd->n_wait = 1;
    bd->wait_count = bd->p->n_instr - bd->stage_first;
    bd->p->n_stages++;
}

/* Buffer bi is used by instruction i. */
static void note_buf_at(struct program *p, int bi, int i)
{
    if (bi < 0)
        return;
    struct prog_buf *buf = &p->bufs[bi];
    if (buf->first < 0 || buf->first > i)
        buf->first = i;
    if (buf->last < i)
        buf->last = i;
}

static void note_buf(struct program *p, int bi)
{
    note_buf_at(p, bi, p->n_instr);
}

/* Append an instruction of the current stage signalling `signal`, waiting as bd says. */
static struct prog_instr *emit_to(struct builder *bd, int op, int layer, int seq, int row0,
                                  int row1, int in, int out, int signal)
{
    struct program *p = bd->p;
    WELD_ASSERT(p->n_instr < bd->cap);
    struct prog_instr *ins = &p->instrs[p->n_instr];
    ins->op = (uint8_t)op;
    ins->layer = (int16_t)layer;
    ins->seq = seq;
    ins->row0 = row0;
    ins->row1 = row1;
    ins->in = in;
    ins->out = out;
    ins->signal = signal;
    ins->stage = p->n_stages;
    ins->wait = bd->n_wait ? bd->wait : -1;
    ins->n_wait = bd->n_wait;
    ins->wait_count = bd->n_wait ? bd->wait_count : 0;
    ins->sums = ins->xout = ins->aux = ins->part = ins->in2 = -1;
    ins->x0 = ins->x1 = 0;
    ins->tok0 = ins->tok1 = 0;
    note_buf(p, in);
    note_buf(p, out);
    p->n_instr++;
    return ins;
}

static struct prog_instr *emit(struct builder *bd, int op, int layer, int seq, int row0,
                               int row1, int in, int out)
{
    return emit_to(bd, op, layer, seq, row0, row1, in, out, bd->stage_counter);
}

/* One stage of a row-range op over `total` units cut into n_splits slices. With align > 1
   every boundary but the last (total) is a multiple of align, so the gemm kernels may run
   weights repacked in 16-row groups (fewer slices when there are fewer groups). */
static void emit_split_at(struct builder *bd, int op, int layer, int lo, int total, int align,
                          int in, int out, int n_splits)
{
    int groups = (int)(((long long)total + align - 1) / align);
    int n = n_splits < groups ? n_splits : groups;
    stage_begin(bd);
    for (int i = 0; i < n; i++) {
        int r0 = (int)((long long)groups * i / n) * align;
        int r1 = i + 1 == n ? total : (int)((long long)groups * (i + 1) / n) * align;
        emit(bd, op, layer, -1, lo + r0, lo + r1, in, out);
    }
    stage_end(bd);
}

static void emit_split_n(struct builder *bd, int op, int layer, int total, int align, int in,
                         int out, int n_splits)
{
    emit_split_at(bd, op, layer, 0, total, align, in, out, n_splits);
}

static void emit_split(struct builder *bd, int op, int layer, int total, int align, int in,
                       int out)
{
    emit_split_n(bd, op, layer, total, align, in, out, bd->p->n_splits);
}

static int add_buf(struct program *p, enum prog_buf_kind kind, int layer, size_t rows,
                   size_t cols)
{
    struct prog_buf *b = &p->bufs[p->n_bufs];
    b->kind = kind;
    b->layer = layer;
    b->n_floats = rows * cols;
    b->first = b->last = -1;
    b->external = kind == PROG_BUF_LOGITS;
    return p->n_bufs++;
}

/* How many KV-head ranges sequence s's attention is cut into. Fewer, wider ranges read
   each cached row in longer contiguous runs (a range of heads is one stretch of the row),
   so decode sequences, plentiful in a batch, take all heads in one instruction once there
   are enough of them to share among the splits; a prefill chunk, whose attention is most
   of its stage, is cut into up to n_splits ranges so every worker gets a part of it. */
static int attn_pieces(const struct program *p, const struct model_config *c, int s)
{
    int per = p->seq_ntok[s] > 1 ? p->n_splits : (p->n_splits + p->n_seqs - 1) / p->n_seqs;
    const int heads = c->kv_lora_rank > 0 ? c->n_head : c->n_kv_head; /* latent: query heads */
    return per < 1 ? 1 : per > heads ? heads : per;
}

/* PROG_HEAD_DEPS: KV-head group g of G holds KV heads [g * n_kv / G, (g + 1) * n_kv / G). */
static int group_head0(int g, int n_groups, int n_kv)
{
    return (int)((long long)g * n_kv / n_groups);
}

static int group_of_head(int h, int n_groups, int n_kv)
{
    int g = (int)((long long)h * n_groups / n_kv);
    while (g + 1 < n_groups && group_head0(g + 1, n_groups, n_kv) <= h)
        g++;
    while (g > 0 && group_head0(g, n_groups, n_kv) > h)
        g--;
    return g;
}

static int emit_qkv_groups_of(struct builder *bd, const struct model_config *c, int l, int q,
                              int lo, int nkv, int *counter0, int *n_groups);

/* The QKV stage cut by KV-head groups (min(n_splits, n_kv) of them): per group, q_pieces
   ranges of its query heads (n_splits / G, at least 1, at most the smallest group's query
   heads), then its K heads, then its V heads, all signalling the group's own counter
   (from *counter0 on), so every group counter expects the same count; an ATTENTION over
   KV heads [h0, h1) waits on the consecutive counters of the groups holding h0 .. h1 - 1.
   Returns the instructions per group. */
static int emit_qkv_groups(struct builder *bd, const struct model_config *c, int l, int q,
                           int *counter0, int *n_groups)
{
    return emit_qkv_groups_of(bd, c, l, q, 0, c->n_kv_head, counter0, n_groups);
}

/* The same over KV heads [lo, lo + nkv) only (a tensor-parallel rank's): groups, and
   group_of_head, count from lo. */
static int emit_qkv_groups_of(struct builder *bd, const struct model_config *c, int l, int q,
                              int lo, int nkv, int *counter0, int *n_groups)
{
    struct program *p = bd->p;
    int grp = c->n_head / c->n_kv_head;
    int G = p->n_splits < nkv ? p->n_splits : nkv;
    int min_q = nkv / G * grp;
    int qp = p->n_splits / G;
    qp = qp < 1 ? 1 : qp > min_q ? min_q : qp;
    int base = p->n_counters;
    p->n_counters += G;
    bd->stage_first = p->n_instr;
    for (int g = 0; g < G; g++) {
        int h0 = lo + group_head0(g, G, nkv), h1 = lo + group_head0(g + 1, G, nkv);
        for (int k = 0; k < qp; k++)
            emit_to(bd, OP_ATTN_NORM_QKV_ROPE, l, -1, h0 * grp + (h1 - h0) * grp * k / qp,
                    h0 * grp + (h1 - h0) * grp * (k + 1) / qp, p->buf_x, q, base + g);
        emit_to(bd, OP_ATTN_NORM_QKV_ROPE, l, -1, c->n_head + h0, c->n_head + h1, p->buf_x,
                q, base + g);
        emit_to(bd, OP_ATTN_NORM_QKV_ROPE, l, -1, c->n_head + c->n_kv_head + h0,
                c->n_head + c->n_kv_head + h1, p->buf_x, q, base + g);
    }
    p->n_stages++;
    *counter0 = base;
    *n_groups = G;
    return qp + 2;
}

/* Active-expert ranks a step of n_tokens has instructions for: every expert, or one per
   (token, slot) when there are fewer. */
static int moe_ranks(const struct program *p, const struct model_config *c)
{
    long long pairs = (long long)p->n_tokens * c->n_expert_used;
    return pairs < c->n_expert ? (int)pairs : c->n_expert;
}

/* One expert's instructions of a MoE stage (rank >= 0, or -1: the shared expert): its
   `total` rows cut into `cuts` slices at multiples of 16. */
static void emit_expert(struct builder *bd, int op, int l, int rank, int total, int cuts, int in,
                        int out, int route)
{
    int groups = (total + PROG_ROW_ALIGN - 1) / PROG_ROW_ALIGN;
    int n = cuts < groups ? cuts : groups;
    for (int i = 0; i < n; i++) {
        int r0 = (int)((long long)groups * i / n) * PROG_ROW_ALIGN;
        int r1 = i + 1 == n ? total : (int)((long long)groups * (i + 1) / n) * PROG_ROW_ALIGN;
        struct prog_instr *ins = emit(bd, op, l, -1, r0, r1, in, out);
        ins->part = rank;
        ins->aux = route;
        note_buf_at(bd->p, route, bd->p->n_instr - 1);
    }
}

/* A MoE layer's FFN in four stages: ROUTE (by tokens: the normalised input into MOE_H,
   the choice into ROUTE); GATE_UP (per active-expert rank, then the shared expert);
   DOWN (the same, into MOE_OUT buffers); COMBINE (by model dims, into X). The ranks'
   experts are known only when the step runs (ops.c): a program has min(n_expert,
   n_tokens * n_expert_used) ranks, each cut so the stage has about n_splits slices, and
   a rank past the step's active experts does nothing. */
static void set_residual(struct program *p, int i, int dim, int in, int sums, int xout, int k,
                         int n);

/* A MoE layer's FFN; with K parts (sums >= 0, the attention's O sums) ROUTE reads X + the
   sums and stores that residual to X, which COMBINE then adds to; on an expert-parallel
   rank an EXCHANGE stage after DOWN gives every rank every expert's outputs. */
static void emit_moe_kp(struct builder *bd, const struct model_config *c, int l, int sums);

static void emit_moe(struct builder *bd, const struct model_config *c, int l)
{
    emit_moe_kp(bd, c, l, -1);
}

static void emit_moe_kp(struct builder *bd, const struct model_config *c, int l, int sums)
{
    struct program *p = bd->p;
    const size_t nt = (size_t)p->n_tokens, K = (size_t)c->n_expert_used;
    const int ranks = moe_ranks(p, c), sf = c->shared_ffn_dim;
    const int cuts = p->n_splits > ranks ? (p->n_splits + ranks - 1) / ranks : 1;
    int h = add_buf(p, PROG_BUF_MOE_H, l, nt, (size_t)c->dim);
    int route = add_buf(p, PROG_BUF_ROUTE, l, nt, 2 * K + 1);
    int hid = add_buf(p, PROG_BUF_HID, l, nt * K, (size_t)c->moe_ffn_dim);
    int out = add_buf(p, PROG_BUF_MOE_OUT, l, nt * K, (size_t)c->dim);
    int shid = sf > 0 ? add_buf(p, PROG_BUF_HID, l, nt, (size_t)sf) : -1;
    int sout = sf > 0 ? add_buf(p, PROG_BUF_MOE_OUT, l, nt, (size_t)c->dim) : -1;
    stage_begin(bd);
    int n = p->n_splits < p->n_tokens ? p->n_splits : p->n_tokens;
    for (int i = 0; i < n; i++) {
        emit(bd, OP_MOE_ROUTE, l, -1, (int)((long long)p->n_tokens * i / n),
             (int)((long long)p->n_tokens * (i + 1) / n), p->buf_x, route)
            ->aux = h;
        note_buf_at(p, h, p->n_instr - 1);
        if (sums >= 0) /* all dims of its tokens */
            set_residual(p, p->n_instr - 1, c->dim, p->buf_x, sums, p->buf_x, 0, 1);
    }
    stage_end(bd);
    stage_begin(bd);
    for (int r = 0; r < ranks; r++)
        emit_expert(bd, OP_MOE_GATE_UP, l, r, c->moe_ffn_dim, cuts, h, hid, route);
    if (sf > 0)
        emit_expert(bd, OP_MOE_GATE_UP, l, -1, sf, p->n_splits, h, shid, route);
    stage_end(bd);
    stage_begin(bd);
    for (int r = 0; r < ranks; r++)
        emit_expert(bd, OP_MOE_DOWN, l, r, c->dim, cuts, hid, out, route);
    if (sf > 0)
        emit_expert(bd, OP_MOE_DOWN, l, -1, c->dim, p->n_splits, shid, sout, route);
    stage_end(bd);
    if (p->part.ep && p->part.tp_size > 1) {
        stage_begin(bd);
        struct prog_instr *ins = emit(bd, OP_MOE_EXCHANGE, l, -1, 0, 1, out, out);
        ins->aux = route;
        ins->part = p->part.tp_rank;
        note_buf_at(p, route, p->n_instr - 1);
        stage_end(bd);
    }
    stage_begin(bd);
    int groups = (c->dim + PROG_ROW_ALIGN - 1) / PROG_ROW_ALIGN;
    n = p->n_splits < groups ? p->n_splits : groups;
    for (int i = 0; i < n; i++) {
        int r0 = groups * i / n * PROG_ROW_ALIGN;
        int r1 = i + 1 == n ? c->dim : groups * (i + 1) / n * PROG_ROW_ALIGN;
        struct prog_instr *ins = emit(bd, OP_MOE_COMBINE, l, -1, r0, r1, out, p->buf_x);
        ins->aux = route;
        ins->in2 = sout;
        note_buf_at(p, route, p->n_instr - 1);
        note_buf_at(p, sout, p->n_instr - 1);
    }
    stage_end(bd);
}

/* A latent-attention layer's attention (model/config.h): PROJ_A (q_a and kv_a rows, each
   matrix cut on its own at multiples of 16), Q_KV (query heads, then the latent unit that
   writes the cache), ATTENTION per sequence and query-head range (every head reads the
   one latent row per position), then the usual O projection. */
static void emit_mla(struct builder *bd, const struct model_config *c, int l)
{
    struct program *p = bd->p;
    const size_t nt = (size_t)p->n_tokens, hk = (size_t)(c->kv_lora_rank + c->rope_dim);
    const int ql = c->q_lora_rank, kva = c->kv_lora_rank + c->rope_dim;
    int qa = ql > 0 ? add_buf(p, PROG_BUF_MLA_A, l, nt, (size_t)ql) : -1;
    int kv = add_buf(p, PROG_BUF_MLA_A, l, nt, hk);
    int q = add_buf(p, PROG_BUF_Q, l, nt, (size_t)c->n_head * hk);
    int lat = add_buf(p, PROG_BUF_LAT, l, nt, (size_t)c->n_head * (size_t)c->kv_lora_rank);
    int att = add_buf(p, PROG_BUF_ATT, l, nt, (size_t)c->n_head * (size_t)c->v_head_dim);
    stage_begin(bd);
    for (int part = 0; part < 2; part++) {
        const int base = part ? ql : 0, total = part ? kva : ql;
        if (total <= 0)
            continue;
        int groups = (total + PROG_ROW_ALIGN - 1) / PROG_ROW_ALIGN;
        int want = ql > 0 ? (int)((long long)p->n_splits * total / (ql + kva)) : p->n_splits;
        int n = want < 1 ? 1 : want < groups ? want : groups;
        for (int i = 0; i < n; i++) {
            int r0 = (int)((long long)groups * i / n) * PROG_ROW_ALIGN;
            int r1 = i + 1 == n ? total : (int)((long long)groups * (i + 1) / n) * PROG_ROW_ALIGN;
            emit(bd, OP_MLA_PROJ_A, l, -1, base + r0, base + r1, p->buf_x, kv)->aux = qa;
            note_buf_at(p, qa, p->n_instr - 1);
        }
    }
    stage_end(bd);
    stage_begin(bd);
    int units = c->n_head + 1, n = p->n_splits < units ? p->n_splits : units;
    for (int i = 0; i < n; i++) {
        struct prog_instr *ins = emit(bd, OP_MLA_Q_KV, l, -1, (int)((long long)units * i / n),
                                      (int)((long long)units * (i + 1) / n), p->buf_x, q);
        ins->aux = qa;
        ins->in2 = kv;
        note_buf_at(p, qa, p->n_instr - 1);
        note_buf_at(p, kv, p->n_instr - 1);
    }
    stage_end(bd);
    stage_begin(bd);
    for (int s = 0; s < p->n_seqs; s++) {
        int per = attn_pieces(p, c, s);
        for (int k = 0; k < per; k++) {
            emit(bd, OP_ATTENTION, l, s, k * c->n_head / per, (k + 1) * c->n_head / per, q, att)
                ->aux = lat;
            note_buf_at(p, lat, p->n_instr - 1);
        }
    }
    stage_end(bd);
    emit_split(bd, OP_O_PROJ_RESIDUAL, l, c->dim, PROG_ROW_ALIGN, att, p->buf_x);
}

static void emit_layer(struct builder *bd, const struct model_config *c, int l)
{
    if (c->kv_lora_rank > 0) {
        emit_mla(bd, c, l);
        if (model_layer_moe(c, l)) {
            emit_moe(bd, c, l);
            return;
        }
        int hid = add_buf(bd->p, PROG_BUF_HID, l, (size_t)bd->p->n_tokens, (size_t)c->ffn_dim);
        emit_split(bd, OP_FFN_NORM_GATE_UP_SILU, l, c->ffn_dim, PROG_ROW_ALIGN, bd->p->buf_x, hid);
        emit_split(bd, OP_DOWN_PROJ_RESIDUAL, l, c->dim, PROG_ROW_ALIGN, hid, bd->p->buf_x);
        return;
    }
    struct program *p = bd->p;
    size_t nt = (size_t)p->n_tokens, qd = (size_t)c->n_head * (size_t)c->head_dim;
    int q = add_buf(p, PROG_BUF_Q, l, nt, qd);
    int att = add_buf(p, PROG_BUF_ATT, l, nt, qd);
    bool heads = p->flags & PROG_HEAD_DEPS;
    int counter0 = 0, n_groups = 1, per_group = 0;
    if (heads)
        per_group = emit_qkv_groups(bd, c, l, q, &counter0, &n_groups);
    else
        emit_split(bd, OP_ATTN_NORM_QKV_ROPE, l, c->n_head + 2 * c->n_kv_head, 1, p->buf_x, q);
    stage_begin(bd);
    for (int s = 0; s < p->n_seqs; s++) {
        int per = attn_pieces(p, c, s);
        for (int k = 0; k < per; k++) {
            int h0 = k * c->n_kv_head / per, h1 = (k + 1) * c->n_kv_head / per;
            if (heads) {
                int g0 = group_of_head(h0, n_groups, c->n_kv_head);
                bd->wait = counter0 + g0;
                bd->n_wait = group_of_head(h1 - 1, n_groups, c->n_kv_head) - g0 + 1;
                bd->wait_count = per_group;
            }
            emit(bd, OP_ATTENTION, l, s, h0, h1, q, att);
        }
    }
    stage_end(bd);
    emit_split(bd, OP_O_PROJ_RESIDUAL, l, c->dim, PROG_ROW_ALIGN, att, p->buf_x);
    if (model_layer_moe(c, l)) {
        emit_moe(bd, c, l);
        return;
    }
    int hid = add_buf(p, PROG_BUF_HID, l, nt, (size_t)c->ffn_dim);
    emit_split(bd, OP_FFN_NORM_GATE_UP_SILU, l, c->ffn_dim, PROG_ROW_ALIGN, p->buf_x, hid);
    emit_split(bd, OP_DOWN_PROJ_RESIDUAL, l, c->dim, PROG_ROW_ALIGN, hid, p->buf_x);
}

/* K parts: instruction i reads the residual stream as in + sums (in part order) and, when
   xout >= 0, stores slice k of n of it (whole lines of PROG_ALIGN_FLOATS dims) to xout. */
static void set_residual(struct program *p, int i, int dim, int in, int sums, int xout, int k,
                         int n)
{
    struct prog_instr *ins = &p->instrs[i];
    ins->in = in;
    ins->sums = sums;
    ins->xout = xout;
    if (xout >= 0) {
        long long g = (dim + PROG_ALIGN_FLOATS - 1) / PROG_ALIGN_FLOATS;
        long long a = g * k / n * PROG_ALIGN_FLOATS, b = g * (k + 1) / n * PROG_ALIGN_FLOATS;
        ins->x0 = (int)(a < dim ? a : dim);
        ins->x1 = k + 1 == n || b > dim ? dim : (int)b;
    }
    note_buf_at(p, in, i);
    note_buf_at(p, sums, i);
    note_buf_at(p, xout, i);
}

static void emit_qkv_range(struct builder *bd, const struct model_config *c, int l, int q, int lo,
                           int nkv);
static void emit_allgather(struct builder *bd, int l, int sums);
static void emit_reduce(struct builder *bd, int l, int in, int sums, int out);
static void emit_parts_overlapped(struct builder *bd, const struct model_config *c, int l, int rank,
                                  int hid, int att);

/* A layer in K parts (struct prog_kparts): QKV as emit_layer's, reading x = xmid + the
   previous layer's down sums and storing it to X (layer 0: X as EMBED wrote it); attention
   part by part (with PROG_HEAD_DEPS each part signals a counter of its own, and its O part
   waits only on that); O parts into sums_o; FFN_DOWN parts reading X + sums_o, storing it
   to xmid and their down sums into sums_d. */
static void emit_layer_kp(struct builder *bd, const struct model_config *c, int l)
{
    struct program *p = bd->p;
    const struct prog_kparts *kp = &p->kp;
    size_t nt = (size_t)p->n_tokens, qd = (size_t)c->n_head * (size_t)c->head_dim;
    int q = add_buf(p, PROG_BUF_Q, l, nt, qd);
    int att = add_buf(p, PROG_BUF_ATT, l, nt, qd);
    int hid = add_buf(p, PROG_BUF_HID, l, nt, (size_t)c->ffn_dim);
    const bool heads = p->flags & PROG_HEAD_DEPS;
    const int grp = c->n_head / c->n_kv_head, rank = p->tp_rank;
    /* the parts this program runs: all, or a tensor-parallel rank's one */
    const int part0 = rank >= 0 ? rank : 0, part1 = rank >= 0 ? rank + 1 : kp->n;
    const int kv_lo = kp->head_cut[part0] / grp, kv_n = kp->head_cut[part1] / grp - kv_lo;
    int counter0 = 0, n_groups = 1, per_group = 0, first = p->n_instr;
    if (heads)
        per_group = emit_qkv_groups_of(bd, c, l, q, kv_lo, kv_n, &counter0, &n_groups);
    else if (rank >= 0)
        emit_qkv_range(bd, c, l, q, kv_lo, kv_n);
    else
        emit_split(bd, OP_ATTN_NORM_QKV_ROPE, l, c->n_head + 2 * c->n_kv_head, 1, p->buf_x, q);
    for (int i = first; !bd->x_whole && i < p->n_instr; i++)
        set_residual(p, i, c->dim, p->buf_xmid, p->buf_sums_d, p->buf_x, i - first,
                     p->n_instr - first);
    /* attention, part-major so each part's counter has consecutive signallers */
    int attn_c0 = p->n_counters, part_count[PROG_KPARTS_MAX] = {0};
    if (heads) {
        bd->stage_first = p->n_instr;
        p->n_counters += kp->n;
    } else {
        stage_begin(bd);
    }
    for (int i = part0; i < part1; i++) {
        const int a = kp->head_cut[i] / grp, b = kp->head_cut[i + 1] / grp;
        for (int s = 0; s < p->n_seqs; s++) {
            int per = (attn_pieces(p, c, s) + kp->n - 1) / kp->n;
            per = per > b - a ? b - a : per;
            for (int k = 0; k < per; k++) {
                int h0 = a + k * (b - a) / per, h1 = a + (k + 1) * (b - a) / per;
                if (heads) {
                    int g0 = group_of_head(h0 - kv_lo, n_groups, kv_n);
                    bd->wait = counter0 + g0;
                    bd->n_wait = group_of_head(h1 - 1 - kv_lo, n_groups, kv_n) - g0 + 1;
                    bd->wait_count = per_group;
                }
                emit_to(bd, OP_ATTENTION, l, s, h0, h1, q, att,
                        heads ? attn_c0 + i : bd->stage_counter);
                part_count[i]++;
            }
        }
    }
    if (heads)
        p->n_stages++;
    else
        stage_end(bd);
    if (model_layer_moe(c, l)) { /* the O parts, then the experts (which add to X) */
        stage_begin(bd);
        for (int i = part0; i < part1; i++) {
            if (heads) {
                bd->wait = attn_c0 + i;
                bd->n_wait = 1;
                bd->wait_count = part_count[i];
            }
            emit(bd, OP_O_PART, l, -1, 0, c->dim, att, p->buf_sums_o)->part = i;
        }
        stage_end(bd);
        if (rank >= 0)
            emit_allgather(bd, l, p->buf_sums_o);
        emit_moe_kp(bd, c, l, p->buf_sums_o);
        bd->x_whole = true;
        return;
    }
    /* many ranks and large exchanges: the reduce-scatter form (each rank adds the parts of
       1/N of the dims, then they are gathered whole) moves 2 (N - 1) / N of a block per rank
       instead of N - 1 */
    if (rank >= 0 && kp->n > 2 &&
        (size_t)p->n_tokens * (size_t)c->dim * sizeof(float) >= PROG_RS_BYTES) {
        stage_begin(bd);
        if (heads) {
            bd->wait = attn_c0 + rank;
            bd->n_wait = 1;
            bd->wait_count = part_count[rank];
        }
        emit(bd, OP_O_PART, l, -1, 0, c->dim, att, p->buf_sums_o)->part = rank;
        stage_end(bd);
        emit_reduce(bd, l, p->buf_x, p->buf_sums_o, p->buf_xmid);
        stage_begin(bd);
        struct prog_instr *ins = emit(bd, OP_FFN_DOWN_PART, l, -1, kp->ffn_cut[rank],
                                      kp->ffn_cut[rank + 1], p->buf_xmid, p->buf_sums_d);
        ins->part = rank;
        ins->aux = hid;
        note_buf_at(p, hid, p->n_instr - 1);
        stage_end(bd);
        emit_reduce(bd, l, p->buf_xmid, p->buf_sums_d, p->buf_x);
        bd->x_whole = true;
        return;
    }
    bd->x_whole = false;
    if (rank >= 0 && !(p->flags & PROG_NO_OVERLAP) && p->n_tokens >= 2 * PROG_OVERLAP_TOKENS) {
        if (heads) {
            bd->wait = attn_c0 + rank;
            bd->n_wait = 1;
            bd->wait_count = part_count[rank];
        }
        emit_parts_overlapped(bd, c, l, rank, hid, att);
        return;
    }
    stage_begin(bd);
    for (int i = part0; i < part1; i++) {
        if (heads) {
            bd->wait = attn_c0 + i;
            bd->n_wait = 1;
            bd->wait_count = part_count[i];
        }
        emit(bd, OP_O_PART, l, -1, 0, c->dim, att, p->buf_sums_o)->part = i;
    }
    stage_end(bd);
    if (rank >= 0)
        emit_allgather(bd, l, p->buf_sums_o);
    stage_begin(bd);
    for (int i = part0; i < part1; i++) {
        struct prog_instr *ins = emit(bd, OP_FFN_DOWN_PART, l, -1, kp->ffn_cut[i],
                                      kp->ffn_cut[i + 1], p->buf_x, p->buf_sums_d);
        ins->part = i;
        ins->aux = hid;
        int idx = p->n_instr - 1;
        note_buf_at(p, hid, idx);
        /* a rank's one part stores the whole xmid */
        set_residual(p, idx, c->dim, p->buf_x, p->buf_sums_o, p->buf_xmid, i - part0,
                     part1 - part0);
    }
    stage_end(bd);
    if (rank >= 0)
        emit_allgather(bd, l, p->buf_sums_d);
}

/* Tensor parallelism: the QKV stage of a rank, its query heads (those of KV heads [lo, lo
   + nkv)) and its K and V heads, each cut into up to n_splits ranges. */
static void emit_qkv_range(struct builder *bd, const struct model_config *c, int l, int q, int lo,
                           int nkv)
{
    struct program *p = bd->p;
    const int grp = c->n_head / c->n_kv_head;
    const int base[3] = {lo * grp, c->n_head + lo, c->n_head + c->n_kv_head + lo};
    const int count[3] = {nkv * grp, nkv, nkv};
    stage_begin(bd);
    for (int k = 0; k < 3; k++) {
        const int n = p->n_splits < count[k] ? p->n_splits : count[k];
        for (int i = 0; i < n; i++)
            emit(bd, OP_ATTN_NORM_QKV_ROPE, l, -1, base[k] + count[k] * i / n,
                 base[k] + count[k] * (i + 1) / n, p->buf_x, q);
    }
    stage_end(bd);
}

/* Tensor parallelism: a stage of one ALLGATHER of sums (every rank's part to every rank). */
/* A stage of one REDUCE: out = in + every rank's part of sums, in part order. */
static void emit_reduce(struct builder *bd, int l, int in, int sums, int out)
{
    struct program *p = bd->p;
    stage_begin(bd);
    struct prog_instr *ins = emit(bd, OP_REDUCE, l, -1, 0, 1, in, out);
    ins->sums = sums;
    ins->part = p->tp_rank;
    note_buf_at(p, sums, p->n_instr - 1);
    stage_end(bd);
}

static void emit_allgather(struct builder *bd, int l, int sums)
{
    stage_begin(bd);
    emit(bd, OP_ALLGATHER, l, -1, 0, 1, sums, sums)->part = bd->p->tp_rank;
    stage_end(bd);
}

/* One instruction in a stage of its own over tokens [t0, t1). */
static struct prog_instr *emit_one(struct builder *bd, int op, int l, int row0, int row1, int in,
                                   int out, int t0, int t1, int part, int aux)
{
    stage_begin(bd);
    struct prog_instr *ins = emit(bd, op, l, -1, row0, row1, in, out);
    ins->tok0 = t0, ins->tok1 = t1, ins->part = part, ins->aux = aux;
    stage_end(bd);
    return ins;
}

/* Tensor parallelism, a step of many tokens: a rank's O part and FFN / down part in two
   token groups, each group's exchange started as soon as its sums exist and completed
   only where they are read, so the first group's exchange runs under the second group's
   product (the ops poke MPI's progress between token tiles, exec/ops.c):
     O(g0) START_o(g0) O(g1) START_o(g1) WAIT_o(g0) FFN_DOWN(g0) START_d(g0)
     WAIT_o(g1) FFN_DOWN(g1) START_d(g1) WAIT_d(g0) WAIT_d(g1)
   Every token's numbers are those of the one-group program (the same products, the same
   sums in part order); only the order of work changes. Exchange slots: o g -> g, d g ->
   2 + g. */
static void emit_parts_overlapped(struct builder *bd, const struct model_config *c, int l, int rank,
                                  int hid, int att)
{
    struct program *p = bd->p;
    const struct prog_kparts *kp = &p->kp;
    const int n = p->n_tokens;
    const int mid = n / 2 / PROG_OVERLAP_ALIGN * PROG_OVERLAP_ALIGN;
    const int g[3] = {0, mid, n};
    for (int k = 0; k < 2; k++) {
        emit_one(bd, OP_O_PART, l, 0, c->dim, att, p->buf_sums_o, g[k], g[k + 1], rank, -1);
        emit_one(bd, OP_AG_START, l, 0, 1, p->buf_sums_o, p->buf_sums_o, g[k], g[k + 1], rank, k);
    }
    for (int k = 0; k < 2; k++) {
        emit_one(bd, OP_AG_WAIT, l, 0, 1, p->buf_sums_o, p->buf_sums_o, g[k], g[k + 1], rank, k);
        struct prog_instr *ins = emit_one(bd, OP_FFN_DOWN_PART, l, kp->ffn_cut[rank],
                                          kp->ffn_cut[rank + 1], p->buf_x, p->buf_sums_d, g[k],
                                          g[k + 1], rank, hid);
        const int idx = (int)(ins - p->instrs);
        note_buf_at(p, hid, idx);
        set_residual(p, idx, c->dim, p->buf_x, p->buf_sums_o, p->buf_xmid, 0, 1);
        emit_one(bd, OP_AG_START, l, 0, 1, p->buf_sums_d, p->buf_sums_d, g[k], g[k + 1], rank,
                 2 + k);
    }
    for (int k = 0; k < 2; k++)
        emit_one(bd, OP_AG_WAIT, l, 0, 1, p->buf_sums_d, p->buf_sums_d, g[k], g[k + 1], rank,
                 2 + k);
}

/* Is kp a valid set of K parts for config c? */
static int check_kparts(const struct model_config *c, const struct prog_kparts *kp,
                        struct weld_err *e)
{
    const int n = kp->n, grp = c->n_head % c->n_kv_head ? 0 : c->n_head / c->n_kv_head;
    bool ok = n >= 1 && n <= PROG_KPARTS_MAX && grp > 0 && kp->head_cut[0] == 0 &&
              kp->ffn_cut[0] == 0 && kp->head_cut[n] == c->n_head && kp->ffn_cut[n] == c->ffn_dim;
    for (int i = 0; ok && i < n; i++)
        ok = kp->head_cut[i] < kp->head_cut[i + 1] && kp->head_cut[i] % grp == 0 &&
             kp->ffn_cut[i] < kp->ffn_cut[i + 1] && kp->ffn_cut[i] % PROG_ROW_ALIGN == 0;
    if (!ok)
        return err_set(e, WELD_ERR_INVALID_ARG, "program: %d K parts do not cut %d heads "
                       "(%d KV heads) and %d ffn dims at KV-head and %d-row boundaries", n,
                       c->n_head, c->n_kv_head, c->ffn_dim, PROG_ROW_ALIGN);
    return WELD_OK;
}

/* ---- buffer planning --------------------------------------------------------------- */

static bool lifetimes_overlap(const struct prog_buf *a, const struct prog_buf *b)
{
    return a->first <= b->last && b->first <= a->last;
}

static int cmp_size_desc(const void *pa, const void *pb, void *ctx)
{
    const struct prog_buf *bufs = ctx;
    size_t a = bufs[*(const int *)pa].n_floats, b = bufs[*(const int *)pb].n_floats;
    if (a != b)
        return a < b ? 1 : -1;
    return *(const int *)pa - *(const int *)pb;
}

/* Lowest offset where buf fits without touching any placed buffer alive at the same time. */
static size_t place_one(const struct program *p, const int *placed, int n_placed,
                        const struct prog_buf *buf, size_t len)
{
    size_t best = 0;
    for (;;) {
        bool moved = false;
        for (int j = 0; j < n_placed; j++) {
            const struct prog_buf *o = &p->bufs[placed[j]];
            size_t olen = (o->n_floats + PROG_ALIGN_FLOATS - 1) / PROG_ALIGN_FLOATS *
                          PROG_ALIGN_FLOATS;
            if (!lifetimes_overlap(buf, o))
                continue;
            if (best < o->offset + olen && o->offset < best + len) {
                best = o->offset + olen;
                moved = true;
            }
        }
        if (!moved)
            return best;
    }
}

/* Instructions of one stage may run at the same time, so a buffer is alive from the first
   instruction of the stage that first writes it to the last of the stage that last reads
   it. With PROG_HEAD_DEPS a layer's QKV, ATTENTION and (K parts) O stages may also run at
   the same time (an instruction there waits only on the heads it needs), so those are
   taken as one: a buffer alive in any of them is alive in all. */
static int widen_to_stages(struct program *p)
{
    int *lo = wcalloc((size_t)p->n_stages, sizeof(int));
    int *hi = wcalloc((size_t)p->n_stages, sizeof(int));
    int *g0 = wcalloc((size_t)p->n_stages, sizeof(int));
    int *g1 = wcalloc((size_t)p->n_stages, sizeof(int));
    if (!lo || !hi || !g0 || !g1) {
        wfree(lo), wfree(hi), wfree(g0), wfree(g1);
        return WELD_ERR_NOMEM;
    }
    for (int i = p->n_instr - 1; i >= 0; i--)
        lo[p->instrs[i].stage] = i;
    for (int i = 0; i < p->n_instr; i++)
        hi[p->instrs[i].stage] = i;
    for (int k = 0; k < p->n_stages; k++) {
        const int op = p->instrs[lo[k]].op;
        const bool joins = k > 0 && (p->flags & PROG_HEAD_DEPS) &&
                           (op == OP_ATTENTION || op == OP_O_PART);
        g0[k] = joins ? g0[k - 1] : k;
    }
    for (int k = p->n_stages - 1; k >= 0; k--)
        g1[k] = k + 1 < p->n_stages && g0[k + 1] == g0[k] ? g1[k + 1] : k;
    for (int b = 0; b < p->n_bufs; b++) {
        struct prog_buf *buf = &p->bufs[b];
        if (buf->first < 0)
            continue;
        buf->first = lo[g0[p->instrs[buf->first].stage]];
        buf->last = hi[g1[p->instrs[buf->last].stage]];
    }
    wfree(lo), wfree(hi), wfree(g0), wfree(g1);
    return WELD_OK;
}

static int plan_buffers(struct program *p)
{
    if (widen_to_stages(p))
        return WELD_ERR_NOMEM;
    int *order = wcalloc((size_t)p->n_bufs, sizeof(int));
    if (!order)
        return WELD_ERR_NOMEM;
    int n = 0;
    for (int i = 0; i < p->n_bufs; i++)
        if (!p->bufs[i].external)
            order[n++] = i;
    qsort_r(order, (size_t)n, sizeof(int), cmp_size_desc, p->bufs);
    p->arena_floats = 0;
    for (int k = 0; k < n; k++) {
        struct prog_buf *buf = &p->bufs[order[k]];
        size_t len = (buf->n_floats + PROG_ALIGN_FLOATS - 1) / PROG_ALIGN_FLOATS *
                     PROG_ALIGN_FLOATS;
        buf->offset = place_one(p, order, k, buf, len);
        if (buf->offset + len > p->arena_floats)
            p->arena_floats = buf->offset + len;
    }
    wfree(order);
    return WELD_OK;
}

/* Stage boundaries (stages are runs of the list, in order). */
static int fill_stages(struct program *p)
{
    p->stage_first = wcalloc((size_t)p->n_stages + 1, sizeof(int));
    if (!p->stage_first)
        return WELD_ERR_NOMEM;
    for (int i = p->n_instr - 1; i >= 0; i--)
        p->stage_first[p->instrs[i].stage] = i;
    p->stage_first[p->n_stages] = p->n_instr;
    return WELD_OK;
}

/* ---- entry point ------------------------------------------------------------------- */

static int check_sizes(const struct model_config *c, const struct program *p, int n_splits,
                       unsigned flags, long long *max_instr, struct weld_err *e)
{
    if (c->n_layer < 1 || c->n_layer > INT16_MAX || c->n_head < 1 || c->n_kv_head < 1 ||
        c->head_dim < 1 || c->dim < 1 || c->ffn_dim < 1 || c->n_vocab < 1)
        return err_set(e, WELD_ERR_INVALID_ARG, "program: bad model config (n_layer %d, "
                       "n_head %d, n_kv_head %d, head_dim %d, dim %d, ffn_dim %d, n_vocab %d)",
                       c->n_layer, c->n_head, c->n_kv_head, c->head_dim, c->dim, c->ffn_dim,
                       c->n_vocab);
    if (n_splits < 1 || n_splits > PROG_MAX_SPLITS)
        return err_set(e, WELD_ERR_INVALID_ARG, "program: n_splits %d not in [1, %d]",
                       n_splits, PROG_MAX_SPLITS);
    if ((flags & PROG_HEAD_DEPS) && c->n_head % c->n_kv_head)
        return err_set(e, WELD_ERR_INVALID_ARG, "program: n_head %d is not a multiple of "
                       "n_kv_head %d", c->n_head, c->n_kv_head);
    /* QKV: at most 3 * n_splits (head groups), O / FFN / DOWN n_splits each (or O and
       FFN_DOWN parts) */
    long long per_layer = 6LL * n_splits + 2LL * PROG_KPARTS_MAX + 12 /* overlapped parts */ +
                          (long long)p->n_seqs * c->n_kv_head;
    if (c->n_expert > 0) {
        if (c->n_expert_used < 1 || c->n_expert_used > c->n_expert || c->moe_ffn_dim < 1 ||
            c->shared_ffn_dim < 0)
            return err_set(e, WELD_ERR_INVALID_ARG,
                           "program: bad experts (%d, %d used, "
                           "ffn %d, shared ffn %d)",
                           c->n_expert, c->n_expert_used, c->moe_ffn_dim, c->shared_ffn_dim);
        /* ROUTE, COMBINE n_splits; GATE_UP, DOWN: ranks (cut to about n_splits) + shared */
        per_layer += 6LL * n_splits + 2LL * c->n_expert;
    }
    *max_instr = n_splits + (n_splits > PROG_FINAL_MAX ? n_splits : PROG_FINAL_MAX) +
                 per_layer * c->n_layer; /* EMBED, FINAL (up to PROG_FINAL_MAX at decode) */
    if (*max_instr > INT_MAX / 2)
        return err_set(e, WELD_ERR_LIMIT, "program: %lld instructions is too many", *max_instr);
    if (c->kv_lora_rank > 0)
        per_layer += 3LL * n_splits + (long long)p->n_seqs * c->n_head + 2;
    /* largest buffer: n_tokens * max(dim, n_head*head_dim, ffn_dim) floats */
    long long widest = c->dim;
    if ((long long)c->n_head * c->head_dim > widest)
        widest = (long long)c->n_head * c->head_dim;
    if (c->ffn_dim > widest)
        widest = c->ffn_dim;
    if (c->n_expert > 0 &&
        (long long)c->n_expert_used * (c->moe_ffn_dim > c->dim ? c->moe_ffn_dim : c->dim) > widest)
        widest = (long long)c->n_expert_used * (c->moe_ffn_dim > c->dim ? c->moe_ffn_dim : c->dim);
    if (c->kv_lora_rank > 0 && (long long)c->n_head * (c->kv_lora_rank + c->rope_dim) > widest)
        widest = (long long)c->n_head * (c->kv_lora_rank + c->rope_dim);
    if ((double)widest * p->n_tokens * (3.0 * c->n_layer + 1) * sizeof(float) > (double)SIZE_MAX / 2)
        return err_set(e, WELD_ERR_LIMIT, "program: activation buffers overflow");
    return WELD_OK;
}

static _Atomic uint64_t next_program_id = 1;

uint64_t program_id(const struct program *p) { return p->id; }

int program_build(struct program **out, const struct model_config *c, const struct batch *b,
                  int n_splits, struct weld_err *e)
{
    return program_build_ex(out, c, b, n_splits, 0, e);
}

int program_build_ex(struct program **out, const struct model_config *c,
                     const struct batch *b, int n_splits, unsigned flags, struct weld_err *e)
{
    return program_build_kp(out, c, b, n_splits, flags, NULL, e);
}

int program_build_kp(struct program **out, const struct model_config *c,
                     const struct batch *b, int n_splits, unsigned flags,
                     const struct prog_kparts *kp, struct weld_err *e)
{
    return program_build_tp(out, c, b, n_splits, flags, kp, NULL, e);
}

int program_build_tp(struct program **out, const struct model_config *c, const struct batch *b,
                     int n_splits, unsigned flags, const struct prog_kparts *kp,
                     const struct exec_part *part, struct weld_err *e)
{
    *out = NULL;
    const struct exec_part whole = exec_part_whole(c);
    if (!part)
        part = &whole;
    const int tp_rank = part->tp_size > 1 ? part->tp_rank : -1;
    if ((tp_rank >= 0 && (!kp || kp->n != part->tp_size || tp_rank >= kp->n)) || part->layer0 < 0 ||
        part->layer1 > c->n_layer || part->layer0 >= part->layer1 ||
        (part->last &&
         (part->vocab0 < 0 || part->vocab1 <= part->vocab0 || part->vocab1 > c->n_vocab)))
        return err_set(e, WELD_ERR_INVALID_ARG,
                       "program: part %d of %d, layers [%d, %d), "
                       "vocabulary [%d, %d) do not fit the model (or its K parts)",
                       part->tp_rank, part->tp_size, part->layer0, part->layer1, part->vocab0,
                       part->vocab1);
    struct program *p = wcalloc(1, sizeof *p);
    if (!p || fill_shape(p, b))
        goto nomem;
    long long max_instr = 0;
    int rc = check_sizes(c, p, n_splits, flags, &max_instr, e);
    if (rc) {
        program_free(p);
        return rc;
    }
    p->n_splits = n_splits;
    p->flags = flags;
    p->tp_rank = tp_rank;
    p->part = *part;
    p->kp = (struct prog_kparts){.n = 1, .head_cut = {0, c->n_head}, .ffn_cut = {0, c->ffn_dim}};
    if (kp && kp->n > 1) {
        if (c->kv_lora_rank > 0)
            rc = err_set(e, WELD_ERR_INVALID_ARG, "program: latent attention has no K parts");
        if (rc || (rc = check_kparts(c, kp, e))) {
            program_free(p);
            return rc;
        }
        p->kp = *kp;
    }
    p->id = atomic_fetch_add_explicit(&next_program_id, 1, memory_order_relaxed);
    p->instrs = wcalloc((size_t)max_instr, sizeof *p->instrs);
    p->bufs = wcalloc(12 * (size_t)c->n_layer + 5, sizeof *p->bufs);
    if (!p->instrs || !p->bufs)
        goto nomem;
    struct builder bd = {.p = p, .cap = (int)max_instr, .x_whole = true};
    p->buf_x = add_buf(p, PROG_BUF_X, -1, (size_t)p->n_tokens, (size_t)c->dim);
    p->buf_logits = add_buf(p, PROG_BUF_LOGITS, -1, (size_t)p->n_logit_rows,
                            (size_t)c->n_vocab);
    const bool parts = p->kp.n > 1;
    p->buf_xmid = p->buf_sums_o = p->buf_sums_d = -1;
    if (parts) {
        p->buf_xmid = add_buf(p, PROG_BUF_XMID, -1, (size_t)p->n_tokens, (size_t)c->dim);
        p->buf_sums_o = add_buf(p, PROG_BUF_SUMS, -1, (size_t)p->kp.n * (size_t)p->n_tokens,
                                (size_t)c->dim);
        p->buf_sums_d = add_buf(p, PROG_BUF_SUMS, -1, (size_t)p->kp.n * (size_t)p->n_tokens,
                                (size_t)c->dim);
    }
    if (part->first)
        emit_split(&bd, OP_EMBED, -1, p->n_tokens, 1, -1, p->buf_x);
    else
        emit_split(&bd, OP_RECV_X, -1, 1, 1, -1, p->buf_x);
    for (int l = part->layer0; l < part->layer1; l++) {
        if (parts)
            emit_layer_kp(&bd, c, l);
        else
            emit_layer(&bd, c, l);
    }
    if (!part->last) { /* the residual stream to the next stage */
        emit_split(&bd, OP_SEND_X, -1, 1, 1, p->buf_x, p->buf_x);
        if (parts && !bd.x_whole)
            set_residual(p, p->n_instr - 1, c->dim, p->buf_xmid, p->buf_sums_d, p->buf_x, 0, 1);
        if (plan_buffers(p) || fill_stages(p))
            goto nomem;
        *out = p;
        return WELD_OK;
    }
    const int first_fin = p->n_instr;
    /* The LM head is the step's last and largest matrix: with at most PROG_FINAL_FEW_ROWS
       logit rows (decode) it is cut into up to PROG_FINAL_MAX slices of ~PROG_FINAL_ROWS
       vocabulary rows instead of n_splits, so the workers balance its end among themselves
       (exec_mega.c); its slices start on softmax-statistics chunks (LOGITS_CHUNK,
       logits_top.h) when the vocabulary has at least 8 of them per slice (else at
       multiples of 16, and the backend does the chunks a boundary cuts). */
    const int nv = part->vocab1 - part->vocab0; /* a tensor-parallel rank's rows, else all */
    int n_fin = p->n_splits;
    if (p->n_splits > 1 && p->n_logit_rows <= PROG_FINAL_FEW_ROWS && nv / PROG_FINAL_ROWS > n_fin)
        n_fin = nv / PROG_FINAL_ROWS < PROG_FINAL_MAX ? nv / PROG_FINAL_ROWS : PROG_FINAL_MAX;
    const int fin_align = nv >= LOGITS_CHUNK * 8 * n_fin ? LOGITS_CHUNK : PROG_ROW_ALIGN;
    emit_split_at(&bd, OP_FINAL_NORM_LOGITS, -1, part->vocab0, nv, fin_align, p->buf_x,
                  p->buf_logits, n_fin);
    for (int i = first_fin; parts && !bd.x_whole && i < p->n_instr; i++)
        set_residual(p, i, c->dim, p->buf_xmid, p->buf_sums_d, -1, 0, 1);
    if (plan_buffers(p) || fill_stages(p))
        goto nomem;
    *out = p;
    return WELD_OK;
nomem:
    program_free(p);
    return err_set(e, WELD_ERR_NOMEM, "program: out of memory building the instruction list");
}

static const char *buf_kind_name(enum prog_buf_kind k)
{
    static const char *const names[] = {"X",    "Q",     "ATT",   "HID",     "LOGITS", "XMID",
                                        "SUMS", "MOE_H", "ROUTE", "MOE_OUT", "MLA_A",  "LAT"};
    return (unsigned)k < sizeof names / sizeof names[0] ? names[k] : "?";
}

void program_dump(const struct program *p, FILE *f)
{
    fprintf(f, "program: %d seqs, %d tokens, %d logit rows, %d splits, %d K parts, %d "
            "instructions, %d stages, %d counters, arena %zu floats\n", p->n_seqs,
            p->n_tokens, p->n_logit_rows, p->n_splits, p->kp.n, p->n_instr, p->n_stages,
            p->n_counters, p->arena_floats);
    for (int i = 0; i < p->n_bufs; i++) {
        const struct prog_buf *b = &p->bufs[i];
        fprintf(f, "  buf %d %s layer %d: %zu floats at %zu%s, live [%d, %d]\n", i,
                buf_kind_name(b->kind), b->layer, b->n_floats, b->offset,
                b->external ? " (external)" : "", b->first, b->last);
    }
    for (int i = 0; i < p->n_instr; i++) {
        const struct prog_instr *in = &p->instrs[i];
        fprintf(f, "  %4d %-22s layer %3d seq %3d rows [%d, %d) in %d out %d wait %d+%d>=%d "
                "signal %d stage %d\n", i, prog_op_name(in->op), in->layer, in->seq,
                in->row0, in->row1, in->in, in->out, in->wait, in->n_wait, in->wait_count,
                in->signal, in->stage);
        if (in->sums >= 0 || in->xout >= 0 || in->part >= 0)
            fprintf(f, "       + sums %d, x [%d, %d) to %d, part %d, aux %d\n", in->sums,
                    in->x0, in->x1, in->xout, in->part, in->aux);
    }
}

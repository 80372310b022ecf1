/*
 * ops - one function per opcode, over the instruction's slice of work (see program.c for
 * what each computes and ops.h for what each may touch).
 *
 * Loop order: weight rows outside, tokens inside, so each weight row is read (and, for
 * non-F32 types, converted) once per OPS_TILE tokens rather than once per token; the
 * normalised inputs of a tile of tokens are kept in scratch. The arithmetic of one
 * (row, token) pair is always kern_dot_f32(row as f32, input) in the same order, so a
 * token's numbers do not depend on the tile, the batch, the split or the executor.
 *
 * Scratch layout (floats, per worker):
 *   h     (OPS_TILE, dim)          normalised inputs of a tile of tokens
 *   row   (max matrix width)       a weight row converted to f32
 *   y     (OPS_TILE, ywidth)       per-token outputs of one head, or gate and up values
 *   cosv, sinv (OPS_TILE, rope_dim/2) rope angles of the tile's positions
 *   acc   (n_head, head_dim)       attention accumulators of one KV head's query group
 *   mx, sum (n_head)               their running max and sum
 *   kbuf, vbuf (head_dim)          a key / value head converted from the KV type to f32
 *
 * KV: K/V heads are stored with kv_write_head (converted to the cache type right after
 * rope) and read back with kv_read_head, one (position, head) at a time, so attention
 * sees exactly the stored values whatever the type (f32 reads in place).
 */
#include "exec/ops.h"

#include "kernels/cpu/kernels.h"

#include <math.h>
#include <string.h>

#define OPS_TILE 16

struct scratch {
    float *h, *row, *y, *cosv, *sinv, *acc, *mx, *sum, *kbuf, *vbuf;
};

static int max_width(const struct model_config *c)
{
    int w = c->dim;
    if (c->n_head * c->head_dim > w)
        w = c->n_head * c->head_dim;
    if (c->ffn_dim > w)
        w = c->ffn_dim;
    return w;
}

static int y_width(const struct model_config *c) { return c->head_dim > 2 ? c->head_dim : 2; }

size_t exec_scratch_floats(const struct model_config *c)
{
    return (size_t)OPS_TILE * (size_t)c->dim + (size_t)max_width(c) +
           (size_t)OPS_TILE * (size_t)y_width(c) + (size_t)OPS_TILE * (size_t)c->rope_dim +
           (size_t)c->n_head * (size_t)c->head_dim + 2 * (size_t)c->n_head +
           2 * (size_t)c->head_dim + 64;
}

static struct scratch scratch_split(const struct model_config *c, float *base)
{
    struct scratch s;
    s.h = base;
    s.row = s.h + (size_t)OPS_TILE * c->dim;
    s.y = s.row + max_width(c);
    s.cosv = s.y + (size_t)OPS_TILE * y_width(c);
    s.sinv = s.cosv + (size_t)OPS_TILE * (c->rope_dim / 2);
    s.acc = s.sinv + (size_t)OPS_TILE * (c->rope_dim / 2);
    s.mx = s.acc + (size_t)c->n_head * c->head_dim;
    s.sum = s.mx + c->n_head;
    s.kbuf = s.sum + c->n_head;
    s.vbuf = s.kbuf + c->head_dim;
    return s;
}

static float *buf_ptr(const struct exec_step *st, int id)
{
    if (id == st->p->buf_logits)
        return st->logits;
    return st->arena + st->p->bufs[id].offset;
}

/* Row r of w as f32 (in place for F32, else converted into buf). */
static const float *wrow(const struct tensor *w, size_t rb, int64_t r, float *buf)
{
    return kern_row_f32(w->type, kern_tensor_row(w, rb, r), w->ne[0], buf);
}

static void op_embed(const struct exec_step *st, const struct prog_instr *in)
{
    const struct tensor *emb = &st->m->tok_embd;
    const int64_t dim = st->m->cfg.dim;
    size_t rb = kern_row_bytes(emb);
    float *x = buf_ptr(st, in->out);
    for (int t = in->row0; t < in->row1; t++)
        kern_to_f32(emb->type, kern_tensor_row(emb, rb, st->tokens[t]), x + t * dim, dim);
}

/* Where a head unit's output goes and what is applied to it (see program.c). */
struct qkv_target {
    const struct tensor *w;
    const float *bias, *norm; /* bias already offset to the head; may be NULL */
    int head;
    int kind; /* 0 q, 1 k, 2 v */
};

static struct qkv_target qkv_select(const struct exec_step *st, int layer, int u)
{
    const struct model_config *c = &st->m->cfg;
    const struct layer_weights *L = &st->m->layers[layer];
    const struct exec_layer_vecs *v = &st->w->layers[layer];
    struct qkv_target q = {0};
    if (u < c->n_head)
        q = (struct qkv_target){&L->wq, v->bq, v->q_norm, u, 0};
    else if (u < c->n_head + c->n_kv_head)
        q = (struct qkv_target){&L->wk, v->bk, v->k_norm, u - c->n_head, 1};
    else
        q = (struct qkv_target){&L->wv, v->bv, NULL, u - c->n_head - c->n_kv_head, 2};
    if (q.bias)
        q.bias += (size_t)q.head * c->head_dim;
    return q;
}

/* One head unit for tokens [t0, t0 + nt) whose normalised inputs are in sc->h. */
static void qkv_unit(const struct exec_step *st, int layer, int u, int t0, int nt, float *qbuf,
                     const struct scratch *sc)
{
    const struct model_config *c = &st->m->cfg;
    const int hd = c->head_dim, half = c->rope_dim / 2;
    struct qkv_target q = qkv_select(st, layer, u);
    size_t rb = kern_row_bytes(q.w);
    for (int j = 0; j < hd; j++) {
        const float *wr = wrow(q.w, rb, (int64_t)q.head * hd + j, sc->row);
        for (int i = 0; i < nt; i++)
            sc->y[(size_t)i * hd + j] = kern_dot_f32(wr, sc->h + (size_t)i * c->dim, c->dim);
    }
    for (int i = 0; i < nt; i++) {
        int t = t0 + i, pos = st->pos[t];
        const int32_t *table = st->tables[st->p->tok_seq[t]];
        float *y = sc->y + (size_t)i * hd;
        if (q.bias)
            for (int k = 0; k < hd; k++)
                y[k] += q.bias[k];
        if (q.norm)
            kern_rmsnorm(y, q.norm, c->norm_eps, y, hd);
        if (q.kind != 2)
            kern_rope_apply(y, c->rope_dim, c->rope_neox, sc->cosv + (size_t)i * half,
                            sc->sinv + (size_t)i * half);
        if (q.kind == 0)
            memcpy(qbuf + (size_t)t * c->n_head * hd + (size_t)q.head * hd, y,
                   sizeof(float) * (size_t)hd);
        else
            kv_write_head(st->kv, kv_pos_row(st->kv, q.kind == 1 ? st->kv->k : st->kv->v,
                                             layer, table, pos), q.head, y);
    }
}

/* Normalise tokens' residual rows into sc->h: tok[i] or, if tok is NULL, t0 + i. */
static void norm_tile(const struct exec_step *st, const float *x, const float *weight,
                      const int *tok, int t0, int nt, const struct scratch *sc)
{
    const struct model_config *c = &st->m->cfg;
    for (int i = 0; i < nt; i++) {
        int t = tok ? tok[i] : t0 + i;
        kern_rmsnorm(x + (size_t)t * c->dim, weight, c->norm_eps, sc->h + (size_t)i * c->dim,
                     c->dim);
    }
}

static void op_qkv(const struct exec_step *st, const struct prog_instr *in,
                   const struct scratch *sc)
{
    const struct model_config *c = &st->m->cfg;
    const int half = c->rope_dim / 2;
    const float *x = buf_ptr(st, in->in);
    float *q = buf_ptr(st, in->out);
    for (int t0 = 0; t0 < st->p->n_tokens; t0 += OPS_TILE) {
        int nt = st->p->n_tokens - t0 < OPS_TILE ? st->p->n_tokens - t0 : OPS_TILE;
        norm_tile(st, x, st->w->layers[in->layer].attn_norm, NULL, t0, nt, sc);
        if (in->row0 < c->n_head + c->n_kv_head)
            for (int i = 0; i < nt; i++)
                kern_rope_angles((double)st->pos[t0 + i] * st->w->rope_pos_scale,
                                 c->rope_theta, c->rope_dim, st->m->rope_freq_factors,
                                 sc->cosv + (size_t)i * half, sc->sinv + (size_t)i * half);
        for (int u = in->row0; u < in->row1; u++)
            qkv_unit(st, in->layer, u, t0, nt, q, sc);
    }
}

/* Causal attention of the `group` query heads sharing KV head kvh, for one token, over
   positions [0, n_pos) of the sequence whose block table is `table`; online softmax per
   head. q and out point at the group's first head (heads are hd apart). Each key/value
   head is converted once for the whole group; every head's arithmetic is the same as if
   it ran alone. */
static void attend_group(const struct exec_step *st, int layer, const int32_t *table,
                         int kvh, int n_pos, const float *q, float *out, int group,
                         const struct scratch *sc)
{
    const struct kv_cache *kv = st->kv;
    const int hd = st->m->cfg.head_dim;
    const float scale = 1.0f / sqrtf((float)hd);
    float *mx = sc->mx, *sum = sc->sum;
    for (int g = 0; g < group; g++) {
        mx[g] = -INFINITY, sum[g] = 0.0f;
        for (int i = 0; i < hd; i++)
            sc->acc[(size_t)g * hd + i] = 0.0f;
    }
    for (int j = 0; j < n_pos; j++) {
        const float *k = kv_read_head(kv, kv_pos_row(kv, kv->k, layer, table, j), kvh,
                                      sc->kbuf);
        const float *v = kv_read_head(kv, kv_pos_row(kv, kv->v, layer, table, j), kvh,
                                      sc->vbuf);
        for (int g = 0; g < group; g++) {
            float *acc = sc->acc + (size_t)g * hd;
            float s = kern_dot_f32(q + (size_t)g * hd, k, hd) * scale;
            if (s > mx[g]) {
                float corr = expf(mx[g] - s); /* 0 on the first key */
                sum[g] *= corr;
                kern_scale(corr, acc, hd);
                mx[g] = s;
            }
            float wgt = expf(s - mx[g]);
            sum[g] += wgt;
            kern_axpy(wgt, v, acc, hd);
        }
    }
    for (int g = 0; g < group; g++)
        for (int i = 0; i < hd; i++)
            out[(size_t)g * hd + i] = sc->acc[(size_t)g * hd + i] / sum[g];
}

static void op_attention(const struct exec_step *st, const struct prog_instr *in,
                         const struct scratch *sc)
{
    const struct model_config *c = &st->m->cfg;
    const struct program *p = st->p;
    const int hd = c->head_dim, group = c->n_head / c->n_kv_head;
    const size_t qd = (size_t)c->n_head * hd;
    const float *q = buf_ptr(st, in->in);
    float *att = buf_ptr(st, in->out);
    int s = in->seq;
    const int32_t *table = st->tables[s];
    for (int t = p->seq_tok0[s]; t < p->seq_tok0[s] + p->seq_ntok[s]; t++)
        for (int kvh = in->row0; kvh < in->row1; kvh++) {
            size_t off = (size_t)t * qd + (size_t)kvh * group * hd;
            attend_group(st, in->layer, table, kvh, st->pos[t] + 1, q + off, att + off, group,
                         sc);
        }
}

/* x[t][r] += W[r] . in[t] for the instruction's rows, every token. */
static void op_proj_residual(const struct exec_step *st, const struct prog_instr *in,
                             const struct tensor *w, const struct scratch *sc)
{
    const int64_t dim = st->m->cfg.dim, n_in = w->ne[0];
    const float *src = buf_ptr(st, in->in);
    float *x = buf_ptr(st, in->out);
    size_t rb = kern_row_bytes(w);
    for (int r = in->row0; r < in->row1; r++) {
        const float *wr = wrow(w, rb, r, sc->row);
        for (int t = 0; t < st->p->n_tokens; t++)
            x[t * dim + r] += kern_dot_f32(wr, src + t * n_in, n_in);
    }
}

static void op_ffn(const struct exec_step *st, const struct prog_instr *in,
                   const struct scratch *sc)
{
    const struct model_config *c = &st->m->cfg;
    const struct layer_weights *L = &st->m->layers[in->layer];
    const float *x = buf_ptr(st, in->in);
    float *hid = buf_ptr(st, in->out), *g = sc->y, *u = sc->y + OPS_TILE;
    size_t rbg = kern_row_bytes(&L->w_gate), rbu = kern_row_bytes(&L->w_up);
    for (int t0 = 0; t0 < st->p->n_tokens; t0 += OPS_TILE) {
        int nt = st->p->n_tokens - t0 < OPS_TILE ? st->p->n_tokens - t0 : OPS_TILE;
        norm_tile(st, x, st->w->layers[in->layer].ffn_norm, NULL, t0, nt, sc);
        for (int r = in->row0; r < in->row1; r++) {
            const float *wg = wrow(&L->w_gate, rbg, r, sc->row);
            for (int i = 0; i < nt; i++)
                g[i] = kern_dot_f32(wg, sc->h + (size_t)i * c->dim, c->dim);
            const float *wu = wrow(&L->w_up, rbu, r, sc->row);
            for (int i = 0; i < nt; i++)
                u[i] = kern_dot_f32(wu, sc->h + (size_t)i * c->dim, c->dim);
            for (int i = 0; i < nt; i++)
                kern_silu_mul(&g[i], &u[i], &hid[(size_t)(t0 + i) * c->ffn_dim + r], 1);
        }
    }
}

static void op_final(const struct exec_step *st, const struct prog_instr *in,
                     const struct scratch *sc)
{
    const struct model_config *c = &st->m->cfg;
    const struct program *p = st->p;
    const struct tensor *w = &st->m->output;
    const float *x = buf_ptr(st, in->in);
    float *logits = buf_ptr(st, in->out);
    size_t rb = kern_row_bytes(w);
    for (int k0 = 0; k0 < p->n_logit_rows; k0 += OPS_TILE) {
        int nk = p->n_logit_rows - k0 < OPS_TILE ? p->n_logit_rows - k0 : OPS_TILE;
        norm_tile(st, x, st->w->output_norm, p->logit_tok + k0, 0, nk, sc);
        for (int r = in->row0; r < in->row1; r++) {
            const float *wr = wrow(w, rb, r, sc->row);
            for (int i = 0; i < nk; i++)
                logits[(size_t)(k0 + i) * c->n_vocab + r] =
                    kern_dot_f32(wr, sc->h + (size_t)i * c->dim, c->dim);
        }
    }
}

void exec_op_run(const struct exec_step *st, const struct prog_instr *in, float *scratch)
{
    struct scratch sc = scratch_split(&st->m->cfg, scratch);
    switch (in->op) {
    case OP_EMBED:
        op_embed(st, in);
        break;
    case OP_ATTN_NORM_QKV_ROPE:
        op_qkv(st, in, &sc);
        break;
    case OP_ATTENTION:
        op_attention(st, in, &sc);
        break;
    case OP_O_PROJ_RESIDUAL:
        op_proj_residual(st, in, &st->m->layers[in->layer].wo, &sc);
        break;
    case OP_FFN_NORM_GATE_UP_SILU:
        op_ffn(st, in, &sc);
        break;
    case OP_DOWN_PROJ_RESIDUAL:
        op_proj_residual(st, in, &st->m->layers[in->layer].w_down, &sc);
        break;
    case OP_FINAL_NORM_LOGITS:
        op_final(st, in, &sc);
        break;
    default:
        WELD_ASSERT(!"unknown opcode");
    }
}

/*
 * ops - one function per opcode, over the instruction's slice of work (see program.c for
 * what each computes and ops.h for what each may touch).
 *
 * Scratch layout (floats, per worker): h (dim) normalised input | row (max matrix width)
 * dequantised weight row | cos, sin (rope_dim/2 each) | acc (head_dim) attention
 * accumulator. Everything is per token and in a fixed order, so a token's numbers do not
 * depend on the batch, the split or the executor.
 */
#include "exec/ops.h"

#include "kernels/cpu/kernels.h"

#include <math.h>

struct scratch {
    float *h, *row, *cosv, *sinv, *acc;
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

size_t exec_scratch_floats(const struct model_config *c)
{
    return (size_t)c->dim + (size_t)max_width(c) + (size_t)c->rope_dim + (size_t)c->head_dim +
           64;
}

static struct scratch scratch_split(const struct model_config *c, float *base)
{
    struct scratch s;
    s.h = base;
    s.row = s.h + c->dim;
    s.cosv = s.row + max_width(c);
    s.sinv = s.cosv + c->rope_dim / 2;
    s.acc = s.sinv + c->rope_dim / 2;
    return s;
}

static float *buf_ptr(const struct exec_step *st, int id)
{
    if (id == st->p->buf_logits)
        return st->logits;
    return st->arena + st->p->bufs[id].offset;
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

/* One head unit of the QKV op for token t (see program.c for the unit numbering). */
static void qkv_unit(const struct exec_step *st, int layer, int t, int u, float *q,
                     const struct scratch *sc)
{
    const struct model_config *c = &st->m->cfg;
    const struct layer_weights *L = &st->m->layers[layer];
    const struct exec_layer_vecs *v = &st->w->layers[layer];
    const int hd = c->head_dim;
    int sid = st->seq_id[st->p->tok_seq[t]], pos = st->pos[t];
    const struct tensor *w;
    const float *bias, *norm;
    float *dst;
    int head;
    if (u < c->n_head) {
        head = u, w = &L->wq, bias = v->bq, norm = v->q_norm;
        dst = q + (size_t)t * c->n_head * hd + (size_t)head * hd;
    } else if (u < c->n_head + c->n_kv_head) {
        head = u - c->n_head, w = &L->wk, bias = v->bk, norm = v->k_norm;
        dst = kv_k_row(st->kv, layer, sid, pos) + (size_t)head * hd;
    } else {
        head = u - c->n_head - c->n_kv_head, w = &L->wv, bias = v->bv, norm = NULL;
        dst = kv_v_row(st->kv, layer, sid, pos) + (size_t)head * hd;
    }
    kern_matvec(w, (int64_t)head * hd, (int64_t)(head + 1) * hd, sc->h, dst, sc->row);
    if (bias)
        for (int i = 0; i < hd; i++)
            dst[i] += bias[(size_t)head * hd + i];
    if (norm)
        kern_rmsnorm(dst, norm, c->norm_eps, dst, hd);
    if (u < c->n_head + c->n_kv_head)
        kern_rope_apply(dst, c->rope_dim, c->rope_neox, sc->cosv, sc->sinv);
}

static void op_qkv(const struct exec_step *st, const struct prog_instr *in,
                   const struct scratch *sc)
{
    const struct model_config *c = &st->m->cfg;
    const float *x = buf_ptr(st, in->in);
    float *q = buf_ptr(st, in->out);
    for (int t = 0; t < st->p->n_tokens; t++) {
        kern_rmsnorm(x + (size_t)t * c->dim, st->w->layers[in->layer].attn_norm, c->norm_eps,
                     sc->h, c->dim);
        if (in->row0 < c->n_head + c->n_kv_head)
            kern_rope_angles((double)st->pos[t] * st->w->rope_pos_scale, c->rope_theta,
                             c->rope_dim, st->m->rope_freq_factors, sc->cosv, sc->sinv);
        for (int u = in->row0; u < in->row1; u++)
            qkv_unit(st, in->layer, t, u, q, sc);
    }
}

/* Causal attention of one query head over positions [0, n_pos) of sid, online softmax. */
static void attend_head(const struct exec_step *st, int layer, int sid, int kvh, int n_pos,
                        const float *qv, float *out, float *acc)
{
    const int hd = st->m->cfg.head_dim;
    const float scale = 1.0f / sqrtf((float)hd);
    float mx = -INFINITY, sum = 0.0f;
    for (int i = 0; i < hd; i++)
        acc[i] = 0.0f;
    for (int j = 0; j < n_pos; j++) {
        const float *k = kv_k_row(st->kv, layer, sid, j) + (size_t)kvh * hd;
        const float *v = kv_v_row(st->kv, layer, sid, j) + (size_t)kvh * hd;
        float s = kern_dot_f32(qv, k, hd) * scale;
        if (s > mx) {
            float corr = expf(mx - s); /* 0 on the first key */
            sum *= corr;
            kern_scale(corr, acc, hd);
            mx = s;
        }
        float wgt = expf(s - mx);
        sum += wgt;
        kern_axpy(wgt, v, acc, hd);
    }
    for (int i = 0; i < hd; i++)
        out[i] = acc[i] / sum;
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
    int s = in->seq, sid = st->seq_id[s];
    for (int t = p->seq_tok0[s]; t < p->seq_tok0[s] + p->seq_ntok[s]; t++)
        for (int kvh = in->row0; kvh < in->row1; kvh++)
            for (int g = 0; g < group; g++) {
                size_t off = (size_t)t * qd + (size_t)(kvh * group + g) * hd;
                attend_head(st, in->layer, sid, kvh, st->pos[t] + 1, q + off, att + off,
                            sc->acc);
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
    for (int t = 0; t < st->p->n_tokens; t++)
        for (int r = in->row0; r < in->row1; r++)
            x[t * dim + r] += kern_row_dot(w->type, kern_tensor_row(w, rb, r),
                                           src + t * n_in, n_in, sc->row);
}

static void op_ffn(const struct exec_step *st, const struct prog_instr *in,
                   const struct scratch *sc)
{
    const struct model_config *c = &st->m->cfg;
    const struct layer_weights *L = &st->m->layers[in->layer];
    const float *x = buf_ptr(st, in->in);
    float *hid = buf_ptr(st, in->out);
    size_t rbg = kern_row_bytes(&L->w_gate), rbu = kern_row_bytes(&L->w_up);
    for (int t = 0; t < st->p->n_tokens; t++) {
        kern_rmsnorm(x + (size_t)t * c->dim, st->w->layers[in->layer].ffn_norm, c->norm_eps,
                     sc->h, c->dim);
        for (int r = in->row0; r < in->row1; r++) {
            float g = kern_row_dot(L->w_gate.type, kern_tensor_row(&L->w_gate, rbg, r), sc->h,
                                   c->dim, sc->row);
            float u = kern_row_dot(L->w_up.type, kern_tensor_row(&L->w_up, rbu, r), sc->h,
                                   c->dim, sc->row);
            kern_silu_mul(&g, &u, &hid[(size_t)t * c->ffn_dim + r], 1);
        }
    }
}

static void op_final(const struct exec_step *st, const struct prog_instr *in,
                     const struct scratch *sc)
{
    const struct model_config *c = &st->m->cfg;
    const struct tensor *w = &st->m->output;
    const float *x = buf_ptr(st, in->in);
    float *logits = buf_ptr(st, in->out);
    size_t rb = kern_row_bytes(w);
    for (int k = 0; k < st->p->n_logit_rows; k++) {
        int t = st->p->logit_tok[k];
        kern_rmsnorm(x + (size_t)t * c->dim, st->w->output_norm, c->norm_eps, sc->h, c->dim);
        for (int r = in->row0; r < in->row1; r++)
            logits[(size_t)k * c->n_vocab + r] =
                kern_row_dot(w->type, kern_tensor_row(w, rb, r), sc->h, c->dim, sc->row);
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

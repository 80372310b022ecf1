/*
 * The forward pass (program + reference executor + kernels + paged KV, through the runner)
 * against a naive forward pass written here straight from the math: plain double arrays,
 * attention recomputed over the whole prefix for every position, no KV cache, no program.
 *
 * Models are tiny and random, built in memory for each architecture variant: llama with
 * GQA, llama3 rope frequency factors and tied embeddings (adjacent-pair rope); llama with
 * neox rope, partial rotary and linear scaling; qwen2 with QKV biases; qwen3 with qk-norm
 * and head_dim != dim / n_head; with F32 weights and with F16 / BF16 weights (the reference
 * dequantizes the same bytes), with Q8_0 / Q4_0 / Q4_K / Q6_K weights (integer gemm paths,
 * repacked where the ISA gains: checked against a reference that quantizes activations
 * the same way and, with a derived bound, against the exact one), with Q5_0 (no gemm
 * kernel: the kern_row_dot fallback), and which matrices get repacked. Then the batch
 * invariants, which must hold bit-for-bit (also for repacked and K-quant weights):
 * batching with other sequences, prefill chunking, n_splits, KV block size.
 * Then errors: context limit, KV exhaustion, bad tensors, the tuning's accelerator / executor.
 */
#include "core/alloc.h"
#include "core/fp16.h"
#include "core/rng.h"
#include "core/team.h"
#include "exec/exec.h"
#include "exec/runner.h"
#include "exec/weights.h"
#include "kernels/cpu/kernels.h"
#include "test.h"
#include "test_models.h"

#include <stdint.h>

/* ---- the naive reference ----------------------------------------------------------- */

/* Dequantized copy of a tensor, as doubles (ne1 rows of ne0). */
static double *deq(const struct tensor *t)
{
    int64_t n0 = t->ne[0], n1 = t->ne[1];
    size_t rb = dtype_row_bytes(t->type, n0);
    float *row = malloc(sizeof(float) * (size_t)n0);
    double *out = malloc(sizeof(double) * (size_t)(n0 * n1));
    for (int64_t r = 0; r < n1; r++) {
        dtype_dequantize_row(t->type, (const uint8_t *)t->data + r * rb, row, n0);
        for (int64_t i = 0; i < n0; i++)
            out[r * n0 + i] = row[i];
    }
    free(row);
    return out;
}

/* When set, matvec quantizes its input the way the gemm kernels do for integer-path weight
   types before the (double) dot: per block of 32 (Q8_0, Q4_0) or 256 (Q4_K, Q6_K),
   d = max|x| / 127, x -> rint(x / d) * d (kernels/cpu/gemm.h), as llama.cpp does. */
static bool ref_quant_act;
static int k_parts; /* K parts of every runner made (0: none), as a test sets it */

static int act_block(int type)
{
    return type == DT_Q8_0 || type == DT_Q4_0 ? 32 : type == DT_Q4_K || type == DT_Q6_K ? 256 : 0;
}

static void quant_act(int bs, const double *x, double *out, int64_t n)
{
    for (int64_t b = 0; b < n; b += bs) {
        double amax = 0;
        for (int i = 0; i < bs; i++)
            amax = fmax(amax, fabs(x[b + i]));
        double d = amax / 127;
        for (int i = 0; i < bs; i++)
            out[b + i] = d > 0 ? fmin(127, fmax(-127, rint(x[b + i] / d))) * d : 0;
    }
}

/* With ref_quant_act, BF16 weights take their input rounded to bf16 (gemm.h's BF16
   contract, as llama.cpp does for BF16 weights), and F16 weights are computed as BF16
   (exec/weights.h): each weight rounded to bf16 as well. */
static void matvec(const struct tensor *t, const double *x, double *y)
{
    double *w = deq(t), *xq = NULL;
    int bs = act_block(t->type);
    if (ref_quant_act && t->type == DT_F16)
        for (int64_t i = 0; i < t->ne[0] * t->ne[1]; i++)
            w[i] = bf16_to_f32(gemm_bf16_round((float)w[i]));
    if (ref_quant_act && bs) {
        xq = malloc(sizeof(double) * (size_t)t->ne[0]);
        quant_act(bs, x, xq, t->ne[0]);
        x = xq;
    } else if (ref_quant_act && (t->type == DT_BF16 || t->type == DT_F16)) {
        xq = malloc(sizeof(double) * (size_t)t->ne[0]);
        for (int64_t i = 0; i < t->ne[0]; i++)
            xq[i] = bf16_to_f32(gemm_bf16_round((float)x[i]));
        x = xq;
    }
    for (int64_t r = 0; r < t->ne[1]; r++) {
        double s = 0;
        for (int64_t i = 0; i < t->ne[0]; i++)
            s += w[r * t->ne[0] + i] * x[i];
        y[r] = s;
    }
    free(w), free(xq);
}

static void rmsnorm(const double *x, const struct tensor *w, double eps, double *out, int n)
{
    double *wd = deq(w), ss = 0;
    for (int i = 0; i < n; i++)
        ss += x[i] * x[i];
    double inv = 1.0 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++)
        out[i] = x[i] * inv * wd[i];
    free(wd);
}

static void rope(const struct model *m, double *v, int pos)
{
    const struct model_config *c = &m->cfg;
    double p = c->rope_scaling == ROPE_SCALING_LINEAR ? pos / c->rope_factor : pos;
    for (int i = 0; i < c->rope_dim / 2; i++) {
        double f = pow(c->rope_theta, -2.0 * i / c->rope_dim);
        if (m->rope_freq_factors)
            f /= m->rope_freq_factors[i];
        if (c->rope_scaling == ROPE_SCALING_YARN) { /* HF DeepSeek's yarn_find_correction_range */
            double d = c->rope_dim, lb = 2 * log(c->rope_theta);
            double lo = floor(d * log(c->rope_orig_ctx / (c->yarn_beta_fast * 2 * M_PI)) / lb);
            double hi = ceil(d * log(c->rope_orig_ctx / (c->yarn_beta_slow * 2 * M_PI)) / lb);
            lo = fmax(lo, 0), hi = fmin(hi, d - 1);
            double ramp = fmin(1, fmax(0, (i - lo) / fmax(hi - lo, 0.001)));
            f = f / c->rope_factor * ramp + f * (1 - ramp);
        }
        double a = p * f, cs = cos(a), sn = sin(a);
        int i0 = c->rope_neox ? i : 2 * i, i1 = c->rope_neox ? i + c->rope_dim / 2 : 2 * i + 1;
        double x0 = v[i0], x1 = v[i1];
        v[i0] = x0 * cs - x1 * sn;
        v[i1] = x0 * sn + x1 * cs;
    }
}

static void add_bias(const struct tensor *b, double *y)
{
    if (!b->data)
        return;
    double *bd = deq(b);
    for (int64_t i = 0; i < b->ne[0]; i++)
        y[i] += bd[i];
    free(bd);
}

/* q/k projections of one token: bias, qk-norm, rope; hd-sized heads. */
static void ref_qk(const struct model *m, const struct layer_weights *L, const double *h,
                   int pos, double *q, double *k, double *v)
{
    const struct model_config *c = &m->cfg;
    int hd = c->head_dim;
    matvec(&L->wq, h, q), add_bias(&L->bq, q);
    matvec(&L->wk, h, k), add_bias(&L->bk, k);
    matvec(&L->wv, h, v), add_bias(&L->bv, v);
    double tmp[256];
    for (int hh = 0; hh < c->n_head + c->n_kv_head; hh++) {
        double *x = hh < c->n_head ? q + hh * hd : k + (hh - c->n_head) * hd;
        if (c->qk_norm) {
            rmsnorm(x, hh < c->n_head ? &L->q_norm : &L->k_norm, c->norm_eps, tmp, hd);
            memcpy(x, tmp, sizeof(double) * (size_t)hd);
        }
        rope(m, x, pos);
    }
}

/* A SwiGLU FFN of `width` on h, into o (dim): o = down(silu(gate h) * (up h)). */
static void ref_ffn(const struct tensor *gate, const struct tensor *up, const struct tensor *down,
                    int width, const double *h, double *o)
{
    double *g = calloc((size_t)width, 8), *u = calloc((size_t)width, 8);
    matvec(gate, h, g);
    matvec(up, h, u);
    for (int i = 0; i < width; i++)
        g[i] = g[i] / (1 + exp(-g[i])) * u[i];
    matvec(down, g, o);
    free(g), free(u);
}

/* A MoE FFN on the normalised h, from the config's words (model/config.h): scores by
   softmax or sigmoid, biased choices, group-limited top-k, weights renormalised and
   scaled; the chosen experts' outputs weighted, plus the (gated) shared expert. */
static void ref_moe(const struct model *m, const struct layer_weights *L, const double *h,
                    double *o)
{
    const struct model_config *c = &m->cfg;
    const int E = c->n_expert, K = c->n_expert_used, D = c->dim;
    double *lg = calloc((size_t)E, 8), *sc = calloc((size_t)E, 8), *ch = calloc((size_t)E, 8);
    double *eo = calloc((size_t)D, 8), *bias = L->exp_bias.data ? deq(&L->exp_bias) : NULL;
    bool keep[TM_MAX_EXPERTS];
    matvec(&L->router, h, lg);
    double mx = -1e300, sum = 0;
    for (int i = 0; i < E; i++)
        mx = fmax(mx, lg[i]);
    for (int i = 0; i < E; i++)
        sum += exp(lg[i] - mx);
    for (int i = 0; i < E; i++) {
        sc[i] = c->gating == MOE_GATING_SOFTMAX ? exp(lg[i] - mx) / sum : 1 / (1 + exp(-lg[i]));
        ch[i] = sc[i] + (bias ? bias[i] : 0);
        keep[i] = true;
    }
    if (c->n_group > 1) {
        int gs = E / c->n_group;
        double gsc[TM_MAX_EXPERTS];
        bool gk[TM_MAX_EXPERTS] = {false};
        for (int g = 0; g < c->n_group; g++) {
            double b1 = -1e300, b2 = -1e300;
            for (int i = g * gs; i < (g + 1) * gs; i++)
                if (ch[i] > b1)
                    b2 = b1, b1 = ch[i];
                else if (ch[i] > b2)
                    b2 = ch[i];
            gsc[g] = gs > 1 ? b1 + b2 : b1;
        }
        for (int k = 0; k < c->topk_group; k++) {
            int best = -1;
            for (int g = 0; g < c->n_group; g++)
                if (!gk[g] && (best < 0 || gsc[g] > gsc[best]))
                    best = g;
            gk[best] = true;
        }
        for (int i = 0; i < E; i++)
            keep[i] = gk[i / gs];
    }
    int ids[TM_MAX_EXPERTS];
    double w[TM_MAX_EXPERTS], tot = 0;
    for (int k = 0; k < K; k++) {
        int best = -1;
        for (int i = 0; i < E; i++)
            if (keep[i] && (best < 0 || ch[i] > ch[best]))
                best = i;
        keep[best] = false;
        ids[k] = best, w[k] = sc[best], tot += w[k];
    }
    memset(o, 0, sizeof(double) * (size_t)D);
    for (int k = 0; k < K; k++) {
        double wk = (c->expert_norm ? w[k] / fmax(tot, 6.103515625e-5) : w[k]) * c->expert_scale;
        ref_ffn(&L->exp_gate[ids[k]], &L->exp_up[ids[k]], &L->exp_down[ids[k]], c->moe_ffn_dim, h,
                eo);
        for (int i = 0; i < D; i++)
            o[i] += wk * eo[i];
    }
    if (c->shared_ffn_dim > 0) {
        double sg = 1;
        if (L->sh_gate_inp.data) {
            double *gi = deq(&L->sh_gate_inp), s = 0;
            for (int i = 0; i < D; i++)
                s += gi[i] * h[i];
            sg = 1 / (1 + exp(-s));
            free(gi);
        }
        ref_ffn(&L->sh_gate, &L->sh_up, &L->sh_down, c->shared_ffn_dim, h, eo);
        for (int i = 0; i < D; i++)
            o[i] += sg * eo[i];
    }
    free(lg), free(sc), free(ch), free(eo), free(bias);
}

/* Latent attention in its expanded form (model/config.h), no absorption: per token the
   query heads from [wq_a, q_a_norm,] wq_b or wq, roped on their last rope_dim dims; the
   latent c = rmsnorm(kv_a[..kvl]) and the shared roped key k_pe; per head keys [Wk_h c,
   k_pe] and values Wv_h c from the up-projection (attn_kv_b, or attn_k_b / attn_v_b
   transposed back); softmax(q.k / sqrt(head_dim)); x += Wo [heads' outputs]. */
static void ref_mla_attention(const struct model *m, int l, double *x, int n)
{
    const struct model_config *c = &m->cfg;
    const struct layer_weights *L = &m->layers[l];
    const int D = c->dim, nh = c->n_head, hd = c->head_dim, nope = c->qk_nope_dim;
    const int rd = c->rope_dim, kvl = c->kv_lora_rank, vd = c->v_head_dim, ql = c->q_lora_rank;
    const int per = nope + vd;
    double *ukv = malloc(sizeof(double) * (size_t)nh * per * kvl); /* [h*per + r][kvl] */
    if (L->wkv_b.data) {
        double *d = deq(&L->wkv_b);
        memcpy(ukv, d, sizeof(double) * (size_t)nh * per * kvl);
        free(d);
    } else {
        struct tensor kb = L->wk_b, vb = L->wv_b;
        kb.ne[1] *= kb.ne[2], vb.ne[1] *= vb.ne[2];
        double *dk = deq(&kb), *dv = deq(&vb);
        for (int h = 0; h < nh; h++)
            for (int cc = 0; cc < kvl; cc++) {
                for (int i = 0; i < nope; i++)
                    ukv[((size_t)h * per + i) * kvl + cc] = dk[((size_t)h * kvl + cc) * nope + i];
                for (int j = 0; j < vd; j++)
                    ukv[((size_t)h * per + nope + j) * kvl + cc] =
                        dv[((size_t)h * vd + j) * kvl + cc];
            }
        free(dk), free(dv);
    }
    double *q = calloc((size_t)n * nh * hd, 8), *k = calloc((size_t)n * nh * hd, 8);
    double *v = calloc((size_t)n * nh * vd, 8), *h = calloc((size_t)D, 8);
    double *qa = calloc((size_t)(ql > 0 ? ql : 1), 8), *qn = calloc((size_t)(ql > 0 ? ql : 1), 8);
    double *kva = calloc((size_t)(kvl + rd), 8), *lat = calloc((size_t)kvl, 8);
    double *o = calloc((size_t)nh * vd, 8), *y = calloc((size_t)D, 8), *sc = calloc((size_t)n, 8);
    for (int t = 0; t < n; t++) {
        rmsnorm(x + (size_t)t * D, &L->attn_norm, c->norm_eps, h, D);
        double *qt = q + (size_t)t * nh * hd;
        if (ql > 0) {
            matvec(&L->wq_a, h, qa);
            rmsnorm(qa, &L->q_a_norm, c->norm_eps, qn, ql);
            matvec(&L->wq_b, qn, qt);
        } else {
            matvec(&L->wq, h, qt);
        }
        for (int hh = 0; hh < nh; hh++)
            rope(m, qt + (size_t)hh * hd + nope, t);
        matvec(&L->wkv_a, h, kva);
        rmsnorm(kva, &L->kv_a_norm, c->norm_eps, lat, kvl);
        rope(m, kva + kvl, t);
        for (int hh = 0; hh < nh; hh++) {
            double *kt = k + ((size_t)t * nh + hh) * hd, *vt = v + ((size_t)t * nh + hh) * vd;
            for (int i = 0; i < nope; i++) {
                double a = 0;
                for (int cc = 0; cc < kvl; cc++)
                    a += ukv[((size_t)hh * per + i) * kvl + cc] * lat[cc];
                kt[i] = a;
            }
            memcpy(kt + nope, kva + kvl, sizeof(double) * (size_t)rd);
            for (int j = 0; j < vd; j++) {
                double a = 0;
                for (int cc = 0; cc < kvl; cc++)
                    a += ukv[((size_t)hh * per + nope + j) * kvl + cc] * lat[cc];
                vt[j] = a;
            }
        }
    }
    for (int t = 0; t < n; t++) {
        for (int hh = 0; hh < nh; hh++) {
            double mx = -1e300, sum = 0;
            for (int j = 0; j <= t; j++) {
                double s2 = 0;
                for (int i = 0; i < hd; i++)
                    s2 += q[((size_t)t * nh + hh) * hd + i] * k[((size_t)j * nh + hh) * hd + i];
                double ms = c->rope_scaling == ROPE_SCALING_YARN
                                ? 1 + c->yarn_log_mul * log(c->rope_factor)
                                : 1;
                sc[j] = s2 * ms * ms / sqrt(hd);
                mx = fmax(mx, sc[j]);
            }
            for (int j = 0; j <= t; j++)
                sum += (sc[j] = exp(sc[j] - mx));
            for (int i = 0; i < vd; i++) {
                double a = 0;
                for (int j = 0; j <= t; j++)
                    a += sc[j] / sum * v[((size_t)j * nh + hh) * vd + i];
                o[(size_t)hh * vd + i] = a;
            }
        }
        matvec(&L->wo, o, y);
        for (int i = 0; i < D; i++)
            x[(size_t)t * D + i] += y[i];
    }
    free(ukv), free(q), free(k), free(v), free(h), free(qa), free(qn), free(kva), free(lat);
    free(o), free(y), free(sc);
}

static void ref_layer(const struct model *m, int l, double *x, int n)
{
    const struct model_config *c = &m->cfg;
    const struct layer_weights *L = &m->layers[l];
    if (c->kv_lora_rank > 0) {
        int D = c->dim;
        double *h = calloc((size_t)D, 8), *o = calloc((size_t)D, 8);
        ref_mla_attention(m, l, x, n);
        for (int t = 0; t < n; t++) {
            rmsnorm(x + t * D, &L->ffn_norm, c->norm_eps, h, D);
            if (model_layer_moe(c, l))
                ref_moe(m, L, h, o);
            else
                ref_ffn(&L->w_gate, &L->w_up, &L->w_down, c->ffn_dim, h, o);
            for (int i = 0; i < D; i++)
                x[t * D + i] += o[i];
        }
        free(h), free(o);
        return;
    }
    int hd = c->head_dim, qd = c->n_head * hd, kd = c->n_kv_head * hd, D = c->dim;
    double *q = calloc((size_t)n * qd, 8), *k = calloc((size_t)n * kd, 8);
    double *v = calloc((size_t)n * kd, 8), *att = calloc((size_t)qd, 8);
    double *h = calloc((size_t)(D > c->ffn_dim ? D : c->ffn_dim), 8), *o = calloc((size_t)D, 8);
    double *sc = calloc((size_t)n, 8);
    for (int t = 0; t < n; t++) {
        rmsnorm(x + t * D, &L->attn_norm, c->norm_eps, h, D);
        ref_qk(m, L, h, t, q + t * qd, k + t * kd, v + t * kd);
    }
    for (int t = 0; t < n; t++) {
        for (int hq = 0; hq < c->n_head; hq++) {
            int kvh = hq / (c->n_head / c->n_kv_head);
            double mx = -1e300, sum = 0;
            for (int j = 0; j <= t; j++) {
                double s = 0;
                for (int i = 0; i < hd; i++)
                    s += q[t * qd + hq * hd + i] * k[j * kd + kvh * hd + i];
                sc[j] = s / sqrt(hd);
                mx = sc[j] > mx ? sc[j] : mx;
            }
            for (int j = 0; j <= t; j++)
                sum += (sc[j] = exp(sc[j] - mx));
            for (int i = 0; i < hd; i++) {
                double a = 0;
                for (int j = 0; j <= t; j++)
                    a += sc[j] / sum * v[j * kd + kvh * hd + i];
                att[hq * hd + i] = a;
            }
        }
        matvec(&L->wo, att, o);
        for (int i = 0; i < D; i++)
            x[t * D + i] += o[i];
    }
    for (int t = 0; t < n; t++) {
        rmsnorm(x + t * D, &L->ffn_norm, c->norm_eps, h, D);
        if (model_layer_moe(c, l))
            ref_moe(m, L, h, o);
        else
            ref_ffn(&L->w_gate, &L->w_up, &L->w_down, c->ffn_dim, h, o);
        for (int i = 0; i < D; i++)
            x[t * D + i] += o[i];
    }
    free(q), free(k), free(v), free(att), free(h), free(o), free(sc);
}

/* The final hidden state (after the final norm: the LM head's input) of every position
   of tokens[0..n): (n, dim). */
static void ref_hidden(const struct model *m, const int32_t *tokens, int n, double *hidden)
{
    const struct model_config *c = &m->cfg;
    int D = c->dim;
    double *x = calloc((size_t)n * D, 8);
    double *emb = deq(&m->tok_embd);
    for (int t = 0; t < n; t++)
        memcpy(x + t * D, emb + (size_t)tokens[t] * D, sizeof(double) * (size_t)D);
    free(emb);
    for (int l = 0; l < c->n_layer; l++)
        ref_layer(m, l, x, n);
    for (int t = 0; t < n; t++)
        rmsnorm(x + t * D, &m->output_norm, c->norm_eps, hidden + (size_t)t * D, D);
    free(x);
}

/* Logits (n, n_vocab) for every position of tokens[0..n). */
static void ref_forward(const struct model *m, const int32_t *tokens, int n, double *logits)
{
    const struct model_config *c = &m->cfg;
    int D = c->dim;
    double *x = calloc((size_t)n * D, 8), *h = calloc((size_t)D, 8);
    double *emb = deq(&m->tok_embd);
    for (int t = 0; t < n; t++)
        memcpy(x + t * D, emb + (size_t)tokens[t] * D, sizeof(double) * (size_t)D);
    free(emb);
    for (int l = 0; l < c->n_layer; l++)
        ref_layer(m, l, x, n);
    for (int t = 0; t < n; t++) {
        rmsnorm(x + t * D, &m->output_norm, c->norm_eps, h, D);
        matvec(&m->output, h, logits + (size_t)t * c->n_vocab);
    }
    free(x), free(h);
}

/* ---- specs -------------------------------------------------------------------------- */

static const struct tspec spec_llama = {ARCH_LLAMA, 64,    2,    8,    2,     8,        96,   50,
                                        8,          false, true, true, false, 10000.0f, NULL, NULL};
static const struct tspec spec_llama_neox = {ARCH_LLAMA, 64,       2,    4,    4,     16,
                                             64,         40,       8,    true, false, false,
                                             true,       10000.0f, NULL, NULL};
static const struct tspec spec_qwen2 = {ARCH_QWEN2, 64,         2,    4,    2,     16,
                                        128,        45,         16,   true, false, false,
                                        false,      1000000.0f, NULL, NULL};
static const struct tspec spec_qwen3 = {ARCH_QWEN3, 64,         2,    4,    2,     32,
                                        96,         60,         32,   true, false, false,
                                        false,      1000000.0f, NULL, NULL};

/* Qwen2.5-0.5B's FFN width, 4864: the float down projection runs repacked (GEMM_F*_R16,
   four segments of 1216) on AVX-512 and AVX2, the other matrices (K = 64) as they are. */
static const struct tspec spec_long = {ARCH_LLAMA, 64,       2,    4,     2,     16,
                                       4864,       40,       16,   false, false, false,
                                       false,      10000.0f, NULL, NULL};

/* Widths that are whole K-quant super-blocks (256), for Q4_K / Q6_K weights. */
static const struct tspec spec_kquant = {ARCH_LLAMA, 256,      2,    4,     2,     64,
                                         512,        40,       64,   false, false, false,
                                         false,      10000.0f, NULL, NULL};

/* Mixtures of experts (tspec's MoE fields): Qwen3-MoE (qk-norm, softmax, renormalised top
   2 of 8, every layer sparse); Mixtral (llama, softmax top 2 of 4, renormalised); Qwen2-MoE
   (QKV bias, softmax top 3 of 8 without renormalising, a shared expert behind a sigmoid
   gate); DeepSeek-V3's router on llama attention (a dense first layer, sigmoid scores
   with a choice bias, 4 groups of which 2 compete, top 3 of 16, renormalised and scaled
   by 2.5, a shared expert). */
static const struct tmoe moe_qwen3 = {8, 2, 64, 0, 0, 0, 0, false, true, false, false, 0, 0};
static const struct tmoe moe_mixtral = {4, 2, 64, 0, 0, 0, 0, false, true, false, false, 0, 0};
static const struct tmoe moe_qwen2 = {8, 3, 32, 80, 0, 0, 0, false, false, false, true, 0, 0};
static const struct tmoe moe_ds = {16, 3, 32, 64, 1, 4, 2, true, true, true, false, 2.5f, 0};
static const struct tspec spec_qwen3moe = {
    ARCH_QWEN3MOE, 64,    2,     4,     2,          32,         96,  60, 32,
    true,          false, false, false, 1000000.0f, &moe_qwen3, NULL};
static const struct tspec spec_mixtral = {ARCH_LLAMA,   64,  2,     4,     2,     16,    96,
                                          50,           16,  false, false, false, false, 10000.0f,
                                          &moe_mixtral, NULL};
static const struct tspec spec_qwen2moe = {
    ARCH_QWEN2MOE, 64,    2,     4,     2,          16,         128, 45, 16,
    true,          false, false, false, 1000000.0f, &moe_qwen2, NULL};
static const struct tspec spec_dsmoe = {ARCH_LLAMA, 64,       3,       4,    2,     16,
                                        128,        50,       16,      true, false, false,
                                        false,      10000.0f, &moe_ds, NULL};

/* Latent attention (DeepSeek-V2/V3's MLA) on the DeepSeek router: q through q_lora 64,
   kv_lora 32, nope 16 + rope 8, values of 24; and without q_lora, the up-projections as
   the file's attn_k_b / attn_v_b, a dense model. */
static const struct tmla mla_q = {64, 32, 16, 24, false, 0};
static const struct tmla mla_split = {0, 32, 16, 16, true, 0};
static const struct tmla mla_yarn = {64, 32, 16, 24, false, 4.0f};
static const struct tspec spec_mla_yarn = {
    ARCH_DEEPSEEK2, 64,    2,     4,     4,        24,   96,       50, 8,
    false,          false, false, false, 10000.0f, NULL, &mla_yarn};
static const struct tspec spec_mla_moe = {
    ARCH_DEEPSEEK2, 64,    3,     4,     4,        24,      128,   50, 8,
    false,          false, false, false, 10000.0f, &moe_ds, &mla_q};
static const struct tspec spec_mla_split = {
    ARCH_DEEPSEEK2, 64,    2,     4,     4,        24,   96,        50, 8,
    false,          false, false, false, 10000.0f, NULL, &mla_split};

/* Experts in K-quants at super-block widths, Q4_K with Q6_K down projections (the mix of
   llama.cpp's Q4_K_M), and in BF16. A bf16 rounding flip that moves a router input moves
   the route, so the seed is one without a flip (seeds 54-58: 7.5e-7 at 56, 1.9e-4 to
   7.9e-3 at the others, the size of a flip and not of a wiring error, which would be off
   at every seed); the wiring is checked at float precision. */
static const struct tmoe moe_kq = {8, 2, 256, 256, 0, 0, 0, false, true, false, false, 0, DT_Q6_K};
static const struct tspec spec_moe_kquant = {ARCH_QWEN3MOE, 256,  2,       4,    2,     64,
                                             512,           40,   64,      true, false, false,
                                             false,         1e6f, &moe_kq, NULL};

static void rand_tokens(uint64_t seed, int32_t *t, int n, int vocab)
{
    struct rng r;
    rng_seed(&r, seed);
    for (int i = 0; i < n; i++)
        t[i] = (int32_t)(rng_u64(&r) % (uint64_t)vocab);
}

/* Prompt of 9 (all logits) then 5 one-token decode steps vs the naive reference, with KV
   entries stored as kvtype: max |diff| / max |logit| <= tol. */
static void check_against_ref_mode(const struct tspec *s, int wtype, uint64_t seed,
                                   int kvtype, bool quant_act, double tol)
{
    enum { P = 9, N = 14 };
    struct tmodel *tm = tm_build(s, wtype, seed);
    const int V = s->vocab;
    int32_t toks[N];
    rand_tokens(seed + 1, toks, N, V);
    double *want = malloc(sizeof(double) * N * V);
    float *got = malloc(sizeof(float) * N * V);
    ref_quant_act = quant_act;
    ref_forward(&tm->m, toks, N, want);
    ref_quant_act = false;
    struct runner *r = NULL;
    struct weld_err e = {0};
    struct backend_params bp;
    backend_params_init(&bp, 2, 32);
    bp.tuning.k_parts = k_parts;
    bp.kv_type = kvtype;
    int rc = runner_create_ex(&r, &tm->m, &bp, &e);
    if (rc)
        fprintf(stderr, "runner_create: %s\n", e.msg);
    REQUIRE(rc == WELD_OK);
    struct batch_seq bs = {.seq_id = 1, .tokens = toks, .n_tokens = P, .pos = 0,
                           .all_logits = true};
    struct batch b = {.seqs = &bs, .n_seqs = 1};
    CHECK_EQ_INT(runner_forward(r, &b, got, &e), WELD_OK);
    for (int p = P; p < N; p++) {
        bs = (struct batch_seq){.seq_id = 1, .tokens = toks + p, .n_tokens = 1, .pos = p};
        CHECK_EQ_INT(runner_forward(r, &b, got + (size_t)p * V, &e), WELD_OK);
    }
    CHECK_EQ_INT(runner_seq_len(r, 1), N);
    double max_ref = 0, max_diff = 0;
    for (int i = 0; i < N * V; i++) {
        max_ref = fmax(max_ref, fabs(want[i]));
        max_diff = fmax(max_diff, fabs(want[i] - got[i]));
    }
    if (getenv("SHOWDIFF") || !(max_diff / max_ref <= tol))
        fprintf(stderr, "arch %s type %s kv %s%s: max diff %g / max %g\n", model_arch_name(s->arch),
                dtype_name(wtype), dtype_name(kvtype), quant_act ? " (quantized ref)" : "",
                max_diff, max_ref);
    CHECK(max_ref > 0.1);
    CHECK(max_diff / max_ref <= tol);
    runner_free(r);
    free(want), free(got);
    tm_free(tm);
}

static void check_against_ref_kv(const struct tspec *s, int wtype, uint64_t seed, int kvtype,
                                 double tol)
{
    check_against_ref_mode(s, wtype, seed, kvtype, false, tol);
}

/* f32 KV: the forward pass itself, tight. */
static void check_against_ref(const struct tspec *s, int wtype, uint64_t seed)
{
    check_against_ref_kv(s, wtype, seed, DT_F32, 1e-4);
}

TEST(llama_gqa_llama3_tied_f32) { check_against_ref(&spec_llama, DT_F32, 11); }
TEST(llama_neox_linear_partial_rope_f32) { check_against_ref(&spec_llama_neox, DT_F32, 12); }
TEST(qwen2_bias_f32) { check_against_ref(&spec_qwen2, DT_F32, 13); }
TEST(qwen3_qknorm_f32) { check_against_ref(&spec_qwen3, DT_F32, 14); }
TEST(qwen3moe_f32)
{
    check_against_ref(&spec_qwen3moe, DT_F32, 41);
}
TEST(mixtral_f32)
{
    check_against_ref(&spec_mixtral, DT_F32, 42);
}
TEST(qwen2moe_shared_gate_f32)
{
    check_against_ref(&spec_qwen2moe, DT_F32, 43);
}
TEST(deepseek_router_f32)
{
    check_against_ref(&spec_dsmoe, DT_F32, 44);
}
TEST(mla_moe_f32)
{
    check_against_ref(&spec_mla_moe, DT_F32, 49);
}
TEST(mla_split_f32)
{
    check_against_ref(&spec_mla_split, DT_F32, 50);
}
TEST(mla_yarn_f32)
{
    check_against_ref(&spec_mla_yarn, DT_F32, 52);
}

/* Integer-path weights (Q8_0, Q4_0, Q4_K, Q6_K): the gemm kernels quantize activations to
   int8 per block of 32 or 256 (d = max|x| / 127), as llama.cpp does, so the exact
   reference is not the right oracle by itself.
   1. Against a reference that quantizes each matrix input the same way (in double), the
      wiring is checked to float precision (measured ~4e-7): any wrong row, head, stale
      activation or misplaced output would be far off. The one legitimate source of a
      larger gap is an element whose x / d lies within f32 noise of a rounding boundary:
      its q moves by one, and that difference then moves many later q's (a cascade;
      at other seeds it reached 1.4%). The seeds below are ones without a flip; if a
      kernel change makes one appear, pick another seed only after the exact-reference
      bound below still holds.
   2. Against the exact reference: each quantized element is off by at most d / 2 =
      max|x_block| / 254, so each quantized matrix input carries a relative error of at
      most ~1/254 of its block's peak; a logit sees 4 quantized inputs per layer in series
      (h -> qkv, att -> o, h -> gate/up, hid -> down) plus the final one, 9 for these
      2-layer models: 9/254 ~ 3.5% for 32-element blocks (measured 1.0-2.2%). A 256-element
      block's peak sits further from its typical element (expected max of 256 gaussians
      ~2.9 sigma vs ~2.1 for 32), so K-quants get 3.5% * 2.9 / 2.1 ~ 5% (measured 2.7-3.9%
      over seeds 25-30). */
#define TOL_QREF 1e-4
#define TOL_QEXACT_32 3.5e-2
#define TOL_QEXACT_256 5e-2
static void check_quantized(const struct tspec *s, int wtype, uint64_t seed)
{
    double exact = act_block(wtype) == 256 ? TOL_QEXACT_256 : TOL_QEXACT_32;
    check_against_ref_mode(s, wtype, seed, DT_F32, true, TOL_QREF);
    /* A mixture of experts has no such bound: a router input moved by the quantization
       picks another expert when two choices are that close, which random routers over
       few tokens meet often (seeds 50-55 of spec_dsmoe at Q4_0: 5 of 6). The
       quantizing reference, which routes from the same inputs, still checks it tightly. */
    if (!s->moe)
        check_against_ref_mode(s, wtype, seed, DT_F32, false, exact);
}

/* BF16 weights: activations rounded to bf16 (gemm.h), each off by at most 2^-8 of itself,
   so the same two checks. Against the reference that rounds the same way (in double), a
   flip at a rounding boundary moves an input by a whole bf16 step (2^-8, not int8's
   1/254 of a block's peak spread over many elements), and long rows meet one often:
   TOL_BF16REF is 1e-3 (seeds here: 4e-7 without a flip, 8e-5 with; any wiring error is
   far off). Against the exact reference 9 matrix inputs in series at 2^-8 bound 3.5%;
   measured 0.3-0.6%. */
#define TOL_BF16REF 1e-3
#define TOL_BF16EXACT 2e-2
static void check_bf16_as(const struct tspec *s, int wtype, uint64_t seed)
{
    check_against_ref_mode(s, wtype, seed, DT_F32, true, TOL_BF16REF);
    if (!s->moe) /* routing flips, as for check_quantized */
        check_against_ref_mode(s, wtype, seed, DT_F32, false, TOL_BF16EXACT);
}
static void check_bf16(const struct tspec *s, uint64_t seed)
{
    check_bf16_as(s, DT_BF16, seed);
}

/* F16 weights are computed as BF16 ones (exec/weights.h): rounded to bf16 in the
   reference too, the same tolerances; and about as far from the exact products. */
TEST(llama_f16)
{
    check_bf16_as(&spec_llama, DT_F16, 15);
}
TEST(llama_f16_long_rows)
{
    check_bf16_as(&spec_long, DT_F16, 28);
}

TEST(qwen3_bf16)
{
    check_bf16(&spec_qwen3, 16);
}
TEST(llama_bf16_long_rows)
{
    check_bf16(&spec_long, 32);
}

TEST(qwen2_q8_0) { check_quantized(&spec_qwen2, DT_Q8_0, 17); }
TEST(llama_neox_q8_0) { check_quantized(&spec_llama_neox, DT_Q8_0, 18); }
TEST(llama_q4_0) { check_quantized(&spec_llama, DT_Q4_0, 19); }
TEST(qwen3_q4_0) { check_quantized(&spec_qwen3, DT_Q4_0, 20); }
TEST(llama_q4_k) { check_quantized(&spec_kquant, DT_Q4_K, 27); }
TEST(llama_q6_k) { check_quantized(&spec_kquant, DT_Q6_K, 27); }
/* Q5_0 has no gemm kernel: its matrices take the kern_row_dot fallback (f32 rows, no
   activation quantization), so the exact reference and the float tolerance apply. */
TEST(qwen3moe_q8_0)
{
    check_quantized(&spec_qwen3moe, DT_Q8_0, 45);
}
TEST(deepseek_router_q4_0)
{
    check_quantized(&spec_dsmoe, DT_Q4_0, 55);
}
TEST(moe_q4_k_with_q6_k_down)
{
    check_quantized(&spec_moe_kquant, DT_Q4_K, 53);
}
TEST(moe_bf16)
{
    check_bf16_as(&spec_moe_kquant, DT_BF16, 56);
}
TEST(qwen2_q5_0_fallback) { check_against_ref(&spec_qwen2, DT_Q5_0, 24); }

/* K parts (tuning k_parts): another summation order of the O and down products, the same
   tolerances against the naive forward pass; bad requests are refused by name. */
TEST(k_parts_against_ref)
{
    k_parts = 2;
    check_against_ref(&spec_llama, DT_F32, 11);
    check_bf16(&spec_qwen3, 18);
    check_quantized(&spec_qwen3, DT_Q4_0, 20);
    check_quantized(&spec_qwen2, DT_Q8_0, 17);
    check_against_ref(&spec_qwen2, DT_Q5_0, 24);
    k_parts = 4; /* 4 KV heads */
    check_bf16_as(&spec_llama_neox, DT_F16, 12);
    struct tmodel *tm = tm_build(&spec_llama, DT_F32, 11);
    struct exec_weights *w = NULL;
    struct weld_err e = {0};
    struct exec_tuning t = {.k_parts = 3}; /* spec_llama has 2 KV heads */
    CHECK_EQ_INT(exec_weights_create(&w, &tm->m, &t, &e), WELD_ERR_INVALID_ARG);
    CHECK(strstr(e.msg, "k_parts=3") && strstr(e.msg, "2 here"));
    t.k_parts = PROG_KPARTS_MAX + 1;
    CHECK_EQ_INT(exec_weights_create(&w, &tm->m, &t, &e), WELD_ERR_INVALID_ARG);
    CHECK(strstr(e.msg, "needs at most") != NULL);
    CHECK(w == NULL);
    t.k_parts = 2;
    REQUIRE(exec_weights_create(&w, &tm->m, &t, &e) == WELD_OK);
    CHECK_EQ_INT(w->kp.n, 2);
    CHECK_EQ_INT(w->kp.head_cut[1], 4);
    CHECK_EQ_INT(w->kp.ffn_cut[1], 48);
    CHECK(!w->mats[0].wo.repacked && !w->mats[0].down.repacked);
    CHECK_EQ_INT(w->mats[0].down_part[1].k, 48);
    exec_weights_free(w);
    tm_free(tm);
    k_parts = 0;
}

/* Which matrices run repacked: every Q4_0 matrix where the ISA gains from it, except Q/K/V
   when head_dim is not a multiple of 16 (spec_llama: 8); Q5_0 none, on the fallback. */
static void check_plan(const struct tspec *s, int wtype, uint64_t seed)
{
    struct tmodel *tm = tm_build(s, wtype, seed);
    struct exec_weights *w = NULL;
    struct weld_err e = {0};
    REQUIRE(exec_weights_create(&w, &tm->m, NULL, &e) == WELD_OK);
    bool gemm = wtype != DT_Q5_0, pays = gemm && gemm_repack_pays(w->go, wtype);
    bool heads = pays && s->head_dim % 16 == 0;
    for (int l = 0; l < s->n_layer; l++) {
        const struct exec_layer_mats *M = &w->mats[l];
        CHECK(M->wq.gemm == gemm && M->wk.gemm == gemm && M->down.gemm == gemm);
        CHECK(M->wq.repacked == heads && M->wk.repacked == heads && M->wv.repacked == heads);
        /* K parts (small models) view wo and down by columns: those keep the file's layout */
        const bool parts = w->kp.n > 1;
        CHECK(M->wo.repacked == (pays && !parts) && M->gate.repacked == pays &&
              M->up.repacked == pays && M->down.repacked == (pays && !parts));
        for (int i = 0; i < w->kp.n && parts; i++) {
            CHECK(M->wo_part[i].rows == M->wo.rows && M->down_part[i].rows == M->down.rows);
            CHECK(M->down_part[i].k == w->kp.ffn_cut[i + 1] - w->kp.ffn_cut[i]);
        }
        CHECK(M->gate.rows == s->ffn && M->down.k == s->ffn);
        if (M->wo.repacked) {
            CHECK_EQ_INT(M->wo.wtype, wtype == DT_Q4_0 ? GEMM_Q4_0_R16 : GEMM_Q8_0_R16);
            CHECK((uintptr_t)M->wo.data % 64 == 0);
        }
    }
    CHECK(w->output.repacked == pays && w->output.rows == s->vocab);
    CHECK(w->max_act_row_bytes <= (size_t)3 * 256 * 4); /* dims here are <= 128 */
    exec_weights_free(w);
    tm_free(tm);
}

/* F32: only rows of at least 2 * GEMM_FSEG (the down projection here; gemm_fseg);
   BF16, and F16 (computed as BF16, rounded into the pool either way): every matrix (rows
   of any even length); only where the ISA has the kernels (AVX-512, AVX2); repack off
   keeps them all in the file's layout. */
static void check_plan_long(int wtype, uint64_t seed)
{
    struct tmodel *tm = tm_build(&spec_long, wtype, seed);
    for (int off = 0; off < 2; off++) {
        struct exec_weights *w = NULL;
        struct weld_err e = {0};
        struct exec_tuning t = {.repack = off ? TUNE_OFF : TUNE_AUTO};
        REQUIRE(exec_weights_create(&w, &tm->m, &t, &e) == WELD_OK);
        const int ct = wtype == DT_F16 ? DT_BF16 : wtype;
        CHECK_EQ_INT(exec_compute_type(wtype), ct);
        bool pays = !off && gemm_repack_pays(w->go, ct);
        for (int l = 0; l < spec_long.n_layer; l++) {
            const struct exec_layer_mats *M = &w->mats[l];
            const bool all = pays && ct == DT_BF16;
            CHECK(M->down.repacked == pays && M->up.repacked == all && M->wo.repacked == all);
            CHECK_EQ_INT(M->down.wtype, pays ? ct + 0x100 : ct);
            CHECK(M->up.from_f16 == (wtype == DT_F16) && M->down.from_f16 == M->up.from_f16);
        }
        exec_weights_free(w);
    }
    tm_free(tm);
}

/* A tied embedding table is read from the pool's output matrix when that holds its values
   (BF16, repacked or not; F32 rows as they are), from the file otherwise (F16: the pool's
   rows are rounded to bf16); every row it serves equals the file's, and the forward pass
   through it stays within the BF16 tolerances. */
TEST(tied_embed_from_pool)
{
    check_bf16(&spec_llama, 37); /* spec_llama is tied */
    static const int types[] = {DT_BF16, DT_F16, DT_F32};
    for (int ti = 0; ti < 3; ti++)
        for (int off = 0; off < 2; off++) {
            struct tmodel *tm = tm_build(&spec_llama, types[ti], 38);
            struct exec_weights *w = NULL;
            struct weld_err e = {0};
            struct exec_tuning t = {.repack = off ? TUNE_OFF : TUNE_AUTO};
            REQUIRE(exec_weights_create(&w, &tm->m, &t, &e) == WELD_OK);
            const struct exec_mat *pe = w->embed;
            if (types[ti] == DT_F16)
                CHECK(pe == NULL);
            else if (types[ti] == DT_BF16)
                CHECK(pe == &w->output && (pe->wtype == GEMM_BF16_R16) == (pe->repacked && !off));
            else
                CHECK(pe == (w->output.repacked ? NULL : &w->output));
            const int64_t dim = spec_llama.dim;
            float *a = malloc(sizeof(float) * (size_t)dim),
                  *b = malloc(sizeof(float) * (size_t)dim);
            const size_t rb = kern_row_bytes(&tm->m.tok_embd);
            for (int64_t r = 0; pe && r < spec_llama.vocab; r++) {
                kern_to_f32(tm->m.tok_embd.type, kern_tensor_row(&tm->m.tok_embd, rb, r), a, dim);
                if (pe->wtype == GEMM_BF16_R16)
                    gemm_bf16r_row_f32(pe->data, pe->row_bytes, r, dim, b);
                else
                    kern_to_f32(pe->wtype, (const uint8_t *)pe->data + (size_t)r * pe->row_bytes, b,
                                dim);
                CHECK(memcmp(a, b, sizeof(float) * (size_t)dim) == 0);
            }
            free(a), free(b);
            exec_weights_free(w);
            tm_free(tm);
        }
}

TEST(repack_plan)
{
    check_plan_long(DT_F32, 36);
    check_plan_long(DT_F16, 34);
    check_plan_long(DT_BF16, 35);
    check_plan(&spec_llama, DT_Q4_0, 31);
    check_plan(&spec_llama_neox, DT_Q8_0, 32);
    check_plan(&spec_qwen2, DT_Q5_0, 33);
}

/* One pool per model and plan: a second exec_weights of the model references the
   first's (same bytes, same types), one with another plan (repack off) or of another
   model gets its own, and a pool outlives whichever of its users is freed first. */
TEST(shared_pool)
{
    struct tmodel *tm = tm_build(&spec_llama_neox, DT_Q8_0, 36);
    struct tmodel *tm2 = tm_build(&spec_llama_neox, DT_Q8_0, 37);
    struct exec_weights *a = NULL, *b = NULL, *c = NULL, *d = NULL;
    struct weld_err e = {0};
    REQUIRE(exec_weights_create(&a, &tm->m, NULL, &e) == WELD_OK);
    REQUIRE(exec_weights_create(&b, &tm->m, NULL, &e) == WELD_OK);
    const struct exec_tuning no_repack = {.repack = TUNE_OFF};
    REQUIRE(exec_weights_create(&c, &tm->m, &no_repack, &e) == WELD_OK);
    REQUIRE(exec_weights_create(&d, &tm2->m, NULL, &e) == WELD_OK);
    CHECK(a->pool && a->pool == b->pool && c->pool != a->pool && d->pool != a->pool);
    CHECK(a->mats[1].down.data == b->mats[1].down.data && a->output.data == b->output.data);
    CHECK_EQ_INT(b->mats[1].down.wtype, a->mats[1].down.wtype);
    CHECK(b->mats[0].wo.act_row_bytes == a->mats[0].wo.act_row_bytes);
    bool pays = gemm_repack_pays(a->go, DT_Q8_0);
    CHECK(!pays || (a->output.repacked && !c->output.repacked && c->output.data != a->output.data));
    size_t n = (size_t)spec_llama_neox.vocab * a->output.row_bytes;
    uint8_t *copy = malloc(n);
    REQUIRE(copy);
    memcpy(copy, b->output.data, n);
    exec_weights_free(a); /* b still holds the pool */
    CHECK(memcmp(copy, b->output.data, n) == 0);
    struct exec_weights *a2 = NULL;
    REQUIRE(exec_weights_create(&a2, &tm->m, NULL, &e) == WELD_OK);
    CHECK(a2->pool == b->pool);
    exec_weights_free(b);
    exec_weights_free(a2);
    REQUIRE(exec_weights_create(&a, &tm->m, NULL, &e) == WELD_OK); /* refilled from the file */
    CHECK(memcmp(copy, a->output.data, n) == 0);
    free(copy);
    exec_weights_free(a);
    exec_weights_free(c);
    exec_weights_free(d);
    tm_free(tm2);
    tm_free(tm);
}

/* KV storage types against the exact reference, tolerances from their precision (f16: 11
   bits of mantissa, bf16: 8, q8_0: 7 bits of a per-32 scale). */
TEST(kv_f16_llama) { check_against_ref_kv(&spec_llama, DT_F32, 11, DT_F16, 1e-3); }
TEST(kv_f16_qwen2) { check_against_ref_kv(&spec_qwen2, DT_F32, 13, DT_F16, 1e-3); }
TEST(kv_bf16_qwen3) { check_against_ref_kv(&spec_qwen3, DT_F32, 14, DT_BF16, 5e-3); }
TEST(kv_q8_0_qwen3) { check_against_ref_kv(&spec_qwen3, DT_F32, 14, DT_Q8_0, 1.5e-2); }

/* ---- batch invariants (bit-identical) ------------------------------------------------ */

struct sched_seq {
    int id;              /* runner seq id */
    const int32_t *toks; /* the whole sequence */
    int n;
    int start_step;      /* first step it takes part in */
    const int *chunks;   /* chunk sizes, the last one repeats */
    int n_chunks;
};

/* Run a schedule; out[i] gets (n, vocab) logits of sched seq i, one row per position. */
static int run_schedule(const struct model *m, const struct backend_params *bp,
                        const struct sched_seq *ss, int n_ss, float **out)
{
    struct runner *r = NULL;
    struct weld_err e = {0};
    if (runner_create_ex(&r, m, bp, &e)) {
        fprintf(stderr, "runner_create_ex: %s\n", e.msg);
        return -1;
    }
    const int V = m->cfg.n_vocab;
    int cur[8] = {0}, k[8] = {0}, rc = 0;
    float *logits = malloc(sizeof(float) * 64 * (size_t)V);
    for (int step = 0; rc == 0; step++) {
        struct batch_seq bs[8];
        int n = 0, idx[8];
        for (int i = 0; i < n_ss; i++) {
            if (step < ss[i].start_step || cur[i] >= ss[i].n)
                continue;
            int c = ss[i].chunks[k[i] < ss[i].n_chunks ? k[i] : ss[i].n_chunks - 1];
            k[i]++;
            if (c > ss[i].n - cur[i])
                c = ss[i].n - cur[i];
            bs[n] = (struct batch_seq){.seq_id = ss[i].id, .tokens = ss[i].toks + cur[i],
                                       .n_tokens = c, .pos = cur[i], .all_logits = true};
            idx[n++] = i;
        }
        if (n == 0) {
            bool left = false;
            for (int i = 0; i < n_ss; i++)
                left |= cur[i] < ss[i].n;
            if (!left)
                break;
            continue;
        }
        struct batch b = {.seqs = bs, .n_seqs = n};
        if ((rc = runner_forward(r, &b, logits, &e)) != 0) {
            fprintf(stderr, "runner_forward: %s\n", e.msg);
            break;
        }
        for (int j = 0, row = 0; j < n; j++)
            for (int t = 0; t < bs[j].n_tokens; t++, row++)
                memcpy(out[idx[j]] + (size_t)(cur[idx[j]] + t) * V,
                       logits + (size_t)row * V, sizeof(float) * (size_t)V);
        for (int j = 0; j < n; j++)
            cur[idx[j]] += bs[j].n_tokens;
    }
    free(logits);
    runner_free(r);
    return rc;
}

static float **alloc_outs(int n, int len, int V)
{
    float **o = calloc((size_t)n, sizeof *o);
    for (int i = 0; i < n; i++)
        o[i] = calloc((size_t)len * V, sizeof(float));
    return o;
}

static void free_outs(float **o, int n)
{
    for (int i = 0; i < n; i++)
        free(o[i]);
    free(o);
}

static void check_batch_invariants(const struct tspec *s, int wtype, uint64_t seed)
{
    enum { NS = 3, LEN = 21 };
    struct tmodel *tm = tm_build(s, wtype, seed);
    const int V = s->vocab, lens[NS] = {21, 9, 15};
    int32_t toks[NS][LEN];
    for (int i = 0; i < NS; i++)
        rand_tokens(seed * 10 + (uint64_t)i, toks[i], lens[i], V);
    /* alone: each sequence prefilled whole, by itself */
    static const int whole[] = {64}, one[] = {1}, three[] = {3}, seven[] = {7};
    static const int mixA[] = {5, 1, 1, 4, 1}, mixB[] = {3, 2, 1}, mixC[] = {1, 6, 1};
    float **alone = alloc_outs(NS, LEN, V);
    struct backend_params bp = {.max_seqs = 8, .max_ctx = 32, .tuning.k_parts = k_parts};
    for (int i = 0; i < NS; i++) {
        struct sched_seq one_seq = {2, toks[i], lens[i], 0, whole, 1};
        REQUIRE(run_schedule(&tm->m, &bp, &one_seq, 1, &alone[i]) == 0);
    }
    /* chunked prefill, alone */
    const int *chunkings[] = {one, three, seven};
    for (int c = 0; c < 3; c++)
        for (int i = 0; i < NS; i++) {
            float **o = alloc_outs(1, LEN, V);
            struct sched_seq one_seq = {i, toks[i], lens[i], 0, chunkings[c], 1};
            REQUIRE(run_schedule(&tm->m, &bp, &one_seq, 1, o) == 0);
            CHECK(memcmp(o[0], alone[i], sizeof(float) * (size_t)lens[i] * V) == 0);
            free_outs(o, 1);
        }
    /* mixed batches: sequences join at different steps with prefill chunks and decodes,
       with several splits and KV block sizes */
    struct sched_seq mixed[NS] = {
        {5, toks[0], lens[0], 0, mixA, 5},
        {0, toks[1], lens[1], 1, mixB, 3},
        {7, toks[2], lens[2], 3, mixC, 3},
    };
    const int splits[] = {1, 3, 7}, blocks[] = {16, 4, 1};
    for (int v = 0; v < 3; v++) {
        struct backend_params bq = {.max_seqs = 8, .max_ctx = 32, .n_splits = splits[v],
                                    .kv_block_size = blocks[v], .tuning.k_parts = k_parts};
        float **o = alloc_outs(NS, LEN, V);
        REQUIRE(run_schedule(&tm->m, &bq, mixed, NS, o) == 0);
        for (int i = 0; i < NS; i++)
            if (memcmp(o[i], alone[i], sizeof(float) * (size_t)lens[i] * V) != 0) {
                fprintf(stderr, "variant %d (splits %d, block %d), seq %d differs\n", v,
                        splits[v], blocks[v], i);
                CHECK(0);
            }
        free_outs(o, NS);
    }
    free_outs(alone, NS);
    tm_free(tm);
}

TEST(batch_invariants_llama) { check_batch_invariants(&spec_llama, DT_F32, 21); }
TEST(batch_invariants_qwen3_q8_0) { check_batch_invariants(&spec_qwen3, DT_Q8_0, 22); }
TEST(batch_invariants_qwen2_bf16) { check_batch_invariants(&spec_qwen2, DT_BF16, 23); }
TEST(batch_invariants_llama_q4_0) { check_batch_invariants(&spec_llama, DT_Q4_0, 34); }
TEST(batch_invariants_kquant_q4_k) { check_batch_invariants(&spec_kquant, DT_Q4_K, 35); }
TEST(batch_invariants_qwen3moe_q8_0)
{
    check_batch_invariants(&spec_qwen3moe, DT_Q8_0, 47);
}
TEST(batch_invariants_deepseek_router)
{
    check_batch_invariants(&spec_dsmoe, DT_F32, 48);
}
TEST(batch_invariants_mla_q8_0)
{
    check_batch_invariants(&spec_mla_moe, DT_Q8_0, 51);
}

/* runner_forward_hidden: each logit row's final hidden state (embeddings' input) against
   the naive reference, every position (all_logits) and the last one alone (the same bits),
   with the logits unchanged by asking for it; in K parts too. */
static void check_hidden(const struct tspec *s, int wtype, uint64_t seed, int kp)
{
    enum { P = 11 };
    k_parts = kp;
    struct tmodel *tm = tm_build(s, wtype, seed);
    const int V = s->vocab, D = s->dim;
    int32_t toks[P];
    rand_tokens(seed + 1, toks, P, V);
    double *want = malloc(sizeof(double) * P * D);
    float *got = malloc(sizeof(float) * P * D), *last = malloc(sizeof(float) * D);
    float *lg = malloc(sizeof(float) * P * V), *lg2 = malloc(sizeof(float) * P * V);
    float *lg3 = malloc(sizeof(float) * V);
    ref_hidden(&tm->m, toks, P, want);
    struct weld_err e;
    for (int mode = 0; mode < 3; mode++) {
        struct runner *r;
        struct backend_params bp;
        backend_params_init(&bp, 2, 32);
        bp.tuning.k_parts = k_parts;
        bp.kv_type = DT_F32;
        REQUIRE(runner_create_ex(&r, &tm->m, &bp, &e) == WELD_OK);
        struct batch_seq bs = {.seq_id = 0, .tokens = toks, .n_tokens = P, .all_logits = mode < 2};
        struct batch b = {.seqs = &bs, .n_seqs = 1};
        int rc = mode == 1 ? runner_forward(r, &b, lg2, &e)
                 : runner_forward_hidden(r, &b, mode == 0 ? lg : lg3, NULL,
                                         mode == 0 ? got : last, &e);
        CHECK_EQ_INT(rc, WELD_OK);
        runner_free(r);
    }
    double max_ref = 0, max_diff = 0;
    for (int i = 0; i < P * D; i++) {
        max_ref = fmax(max_ref, fabs(want[i]));
        max_diff = fmax(max_diff, fabs(want[i] - got[i]));
    }
    CHECK(max_ref > 0.1);
    if (!(max_diff / max_ref <= 1e-4))
        fprintf(stderr, "hidden: max diff %g / max %g\n", max_diff, max_ref);
    CHECK(max_diff / max_ref <= 1e-4);
    CHECK(memcmp(last, got + (size_t)(P - 1) * D, sizeof(float) * D) == 0);
    CHECK(memcmp(lg, lg2, sizeof(float) * P * V) == 0);
    CHECK(memcmp(lg3, lg + (size_t)(P - 1) * V, sizeof(float) * V) == 0);
    free(want), free(got), free(last), free(lg), free(lg2), free(lg3);
    tm_free(tm);
    k_parts = 0;
}

TEST(final_hidden_states)
{
    check_hidden(&spec_llama, DT_F32, 41, 1);
    check_hidden(&spec_qwen3, DT_F32, 42, 1);
    check_hidden(&spec_qwen2, DT_F32, 43, 2);
}

/* all_logits = false returns exactly the last row of the all_logits run. */
TEST(last_logits_only)
{
    struct tmodel *tm = tm_build(&spec_qwen2, DT_F32, 31);
    const int V = spec_qwen2.vocab;
    int32_t a[6], b2[3];
    rand_tokens(1, a, 6, V);
    rand_tokens(2, b2, 3, V);
    float *all = malloc(sizeof(float) * 9 * V), *last = malloc(sizeof(float) * 2 * V);
    struct weld_err e;
    for (int mode = 0; mode < 2; mode++) {
        struct runner *r;
        REQUIRE(runner_create(&r, &tm->m, 4, 16, &e) == WELD_OK);
        struct batch_seq bs[2] = {{3, a, 6, 0, mode == 0, NULL, 0, NULL, false},
                                  {1, b2, 3, 0, mode == 0, NULL, 0, NULL, false}};
        struct batch b = {.seqs = bs, .n_seqs = 2};
        CHECK_EQ_INT(batch_n_logit_rows(&b), mode == 0 ? 9 : 2);
        CHECK_EQ_INT(runner_forward(r, &b, mode == 0 ? all : last, &e), WELD_OK);
        runner_free(r);
    }
    CHECK(memcmp(last, all + 5 * V, sizeof(float) * V) == 0);
    CHECK(memcmp(last + V, all + 8 * V, sizeof(float) * V) == 0);
    free(all), free(last);
    tm_free(tm);
}

/* Re-running from an earlier position (truncation) gives the same logits again. */
TEST(rewind_and_drop)
{
    struct tmodel *tm = tm_build(&spec_llama, DT_F32, 41);
    const int V = spec_llama.vocab;
    int32_t t[10];
    rand_tokens(3, t, 10, V);
    float *l1 = malloc(sizeof(float) * 10 * V), *l2 = malloc(sizeof(float) * 10 * V);
    struct weld_err e;
    struct runner *r;
    REQUIRE(runner_create(&r, &tm->m, 2, 16, &e) == WELD_OK);
    struct batch_seq bs = {0, t, 10, 0, true, NULL, 0, NULL, false};
    struct batch b = {.seqs = &bs, .n_seqs = 1};
    CHECK_EQ_INT(runner_forward(r, &b, l1, &e), WELD_OK);
    bs = (struct batch_seq){0, t + 4, 6, 4, true, NULL, 0, NULL, false}; /* redo positions 4..9 */
    CHECK_EQ_INT(runner_forward(r, &b, l2 + 4 * V, &e), WELD_OK);
    CHECK(memcmp(l1 + 4 * V, l2 + 4 * V, sizeof(float) * 6 * V) == 0);
    runner_drop_seq(r, 0);
    CHECK_EQ_INT(runner_seq_len(r, 0), 0);
    bs = (struct batch_seq){0, t + 4, 1, 4, true, NULL, 0, NULL, false}; /* gap after a drop */
    CHECK_EQ_INT(runner_forward(r, &b, l2, &e), WELD_ERR_INVALID_ARG);
    bs = (struct batch_seq){0, t, 10, 0, true, NULL, 0, NULL, false};
    CHECK_EQ_INT(runner_forward(r, &b, l2, &e), WELD_OK);
    CHECK(memcmp(l1, l2, sizeof(float) * 10 * V) == 0);
    runner_free(r);
    free(l1), free(l2);
    tm_free(tm);
}

/* ---- errors -------------------------------------------------------------------------- */

TEST(limits_and_bad_batches)
{
    struct tmodel *tm = tm_build(&spec_llama, DT_F32, 51);
    const int V = spec_llama.vocab;
    int32_t t[20];
    rand_tokens(4, t, 20, V);
    float *lg = malloc(sizeof(float) * 20 * V);
    struct weld_err e;
    struct runner *r;
    REQUIRE(runner_create(&r, &tm->m, 2, 16, &e) == WELD_OK);
    CHECK_EQ_INT(runner_max_ctx(r), 16);
    CHECK_EQ_INT(runner_n_vocab(r), V);
    struct batch_seq bs = {0, t, 17, 0, false, NULL, 0, NULL, false};
    struct batch b = {.seqs = &bs, .n_seqs = 1};
    CHECK_EQ_INT(runner_forward(r, &b, lg, &e), WELD_ERR_LIMIT);
    CHECK(strstr(e.msg, "max_ctx = 16") != NULL);
    bs.n_tokens = 16;
    CHECK_EQ_INT(runner_forward(r, &b, lg, &e), WELD_OK);
    bs = (struct batch_seq){0, t, 1, 16, false, NULL, 0, NULL, false}; /* position 16 == max_ctx */
    CHECK_EQ_INT(runner_forward(r, &b, lg, &e), WELD_ERR_LIMIT);
    bs = (struct batch_seq){2, t, 1, 0, false, NULL, 0, NULL, false}; /* seq id out of range */
    CHECK_EQ_INT(runner_forward(r, &b, lg, &e), WELD_ERR_INVALID_ARG);
    int32_t bad = V;
    bs = (struct batch_seq){1, &bad, 1, 0, false, NULL, 0, NULL, false};
    CHECK_EQ_INT(runner_forward(r, &b, lg, &e), WELD_ERR_INVALID_ARG);
    CHECK(strstr(e.msg, "vocabulary") != NULL);
    struct batch_seq two[2] = {{1, t, 1, 0, false, NULL, 0, NULL, false},
                               {1, t, 1, 0, false, NULL, 0, NULL, false}};
    struct batch b2 = {.seqs = two, .n_seqs = 2};
    CHECK_EQ_INT(runner_forward(r, &b2, lg, &e), WELD_ERR_INVALID_ARG);
    bs = (struct batch_seq){1, t, 0, 0, false, NULL, 0, NULL, false};
    CHECK_EQ_INT(runner_forward(r, &b, lg, &e), WELD_ERR_INVALID_ARG);
    b.n_seqs = 0;
    CHECK_EQ_INT(runner_forward(r, &b, lg, &e), WELD_ERR_INVALID_ARG);
    runner_free(r);
    runner_free(NULL);
    free(lg);
    tm_free(tm);
}

TEST(kv_exhaustion_is_all_or_nothing)
{
    struct tmodel *tm = tm_build(&spec_qwen2, DT_F32, 52);
    const int V = spec_qwen2.vocab;
    int32_t t[16];
    rand_tokens(5, t, 16, V);
    float *lg = malloc(sizeof(float) * 16 * V);
    struct weld_err e;
    struct runner *r;
    struct backend_params bp = {.max_seqs = 3, .max_ctx = 16, .kv_block_size = 4,
                                .kv_blocks = 5};
    REQUIRE(runner_create_ex(&r, &tm->m, &bp, &e) == WELD_OK);
    struct batch_seq bs[2] = {{0, t, 12, 0, false, NULL, 0, NULL, false}, /* 3 blocks */
                              {1, t, 5, 0, false, NULL, 0, NULL, false}}; /* + 2 blocks */
    struct batch b = {.seqs = bs, .n_seqs = 2};
    CHECK_EQ_INT(runner_forward(r, &b, lg, &e), WELD_OK);
    bs[0] = (struct batch_seq){0,    t + 12, 1,    12,   false,
                               NULL, 0,      NULL, false}; /* needs a 6th block */
    bs[1] = (struct batch_seq){1, t + 5, 1, 5, false, NULL, 0, NULL, false};
    CHECK_EQ_INT(runner_forward(r, &b, lg, &e), WELD_ERR_LIMIT);
    CHECK(strstr(e.msg, "blocks") != NULL);
    CHECK_EQ_INT(runner_seq_len(r, 0), 12);
    CHECK_EQ_INT(runner_seq_len(r, 1), 5);
    /* the pool is full; seq 1 grows by a block while seq 0 (listed after it) rewinds and
       frees one: fits */
    bs[0] = (struct batch_seq){1, t + 5, 4, 5, false, NULL, 0, NULL, false};
    bs[1] = (struct batch_seq){0, t + 4, 1, 4, false, NULL, 0, NULL, false};
    CHECK_EQ_INT(runner_forward(r, &b, lg, &e), WELD_OK);
    CHECK_EQ_INT(runner_seq_len(r, 0), 5);
    CHECK_EQ_INT(runner_seq_len(r, 1), 9);
    runner_drop_seq(r, 1);
    bs[0] = (struct batch_seq){0, t + 5, 7, 5, false, NULL, 0, NULL, false};
    bs[1] = (struct batch_seq){1, t + 9, 1, 9, false, NULL, 0, NULL, false};
    CHECK_EQ_INT(runner_forward(r, &b, lg, &e), WELD_ERR_INVALID_ARG); /* seq 1 was dropped */
    b.n_seqs = 1;
    CHECK_EQ_INT(runner_forward(r, &b, lg, &e), WELD_OK);
    CHECK_EQ_INT(runner_seq_len(r, 0), 12);
    runner_free(r);
    free(lg);
    tm_free(tm);
}

TEST(bad_tensors_are_named)
{
    struct tmodel *tm = tm_build(&spec_qwen3, DT_F32, 53);
    struct weld_err e;
    struct runner *r = NULL;
    tm->layers[1].wq.ne[1] -= 1;
    CHECK_EQ_INT(runner_create(&r, &tm->m, 1, 8, &e), WELD_ERR_FORMAT);
    CHECK(strstr(e.msg, "blk.1.attn_q.weight") != NULL);
    CHECK(r == NULL);
    tm->layers[1].wq.ne[1] += 1;
    const void *kn = tm->layers[0].k_norm.data;
    tm->layers[0].k_norm.data = NULL;
    CHECK_EQ_INT(runner_create(&r, &tm->m, 1, 8, &e), WELD_ERR_FORMAT);
    CHECK(strstr(e.msg, "blk.0.attn_k_norm.weight") != NULL && strstr(e.msg, "missing"));
    tm->layers[0].k_norm.data = kn;
    tm->m.output.type = DT_I32;
    CHECK_EQ_INT(runner_create(&r, &tm->m, 1, 8, &e), WELD_ERR_UNSUPPORTED);
    CHECK(strstr(e.msg, "output.weight") != NULL);
    tm->m.output.type = DT_F32;
    tm->m.output.nbytes -= 4;
    CHECK_EQ_INT(runner_create(&r, &tm->m, 1, 8, &e), WELD_ERR_FORMAT);
    tm->m.output.nbytes += 4;
    tm->m.cfg.n_kv_head = 3;
    CHECK_EQ_INT(runner_create(&r, &tm->m, 1, 8, &e), WELD_ERR_FORMAT);
    CHECK(strstr(e.msg, "n_kv_head") != NULL);
    tm->m.cfg.n_kv_head = 2;
    tm->m.cfg.rope_dim = 33;
    CHECK_EQ_INT(runner_create(&r, &tm->m, 1, 8, &e), WELD_ERR_FORMAT);
    tm->m.cfg.rope_dim = 32;
    CHECK_EQ_INT(runner_create(&r, &tm->m, 0, 8, &e), WELD_ERR_INVALID_ARG);
    CHECK_EQ_INT(runner_create(&r, &tm->m, 1, 8, &e), WELD_OK);
    runner_free(r);
    tm_free(tm);
}

/* Backend and executor come from the parameters' tuning, by name, or by default. */
TEST(accelerator_and_executor_tuning)
{
    struct tmodel *tm = tm_build(&spec_llama, DT_F32, 54);
    struct weld_err e;
    struct runner *r = NULL;
    /* default: mega on a team of one worker per physical core, ref with one core or for
       a model of tiny steps (this one, unless the tuning names an executor) */
    struct exec_tuning t = exec_tuning_default();
    CHECK_EQ_INT(backend_cpu_default_threads(&tm->m, NULL), 1);
    CHECK_EQ_INT(backend_cpu_default_threads(&tm->m, &t), 1);
    REQUIRE(runner_create(&r, &tm->m, 1, 8, &e) == WELD_OK);
    CHECK(strncmp(runner_describe(r), "cpu: ref executor", 17) == 0);
    runner_free(r);
    t.executor = "mega";
    CHECK_EQ_INT(backend_cpu_default_threads(&tm->m, &t), team_default_size());
    struct backend_params bp;
    backend_params_init(&bp, 1, 8);
    bp.tuning = t;
    REQUIRE(runner_create_ex(&r, &tm->m, &bp, &e) == WELD_OK);
    if (team_physical_cores() > 1)
        CHECK(strncmp(runner_describe(r), "cpu: mega executor", 18) == 0);
    else
        CHECK(strncmp(runner_describe(r), "cpu: ref executor", 17) == 0);
    runner_free(r);
    bp.tuning.accelerator = "cpu";
    bp.tuning.executor = "ref";
    CHECK_EQ_INT(runner_create_ex(&r, &tm->m, &bp, &e), WELD_OK);
    runner_free(r);
    r = NULL;
    bp.tuning.accelerator = "cuda";
    CHECK_EQ_INT(runner_create_ex(&r, &tm->m, &bp, &e), WELD_ERR_NOT_FOUND);
    CHECK_EQ_STR(e.msg, "unknown accelerator 'cuda' (available: cpu)");
    CHECK(r == NULL);
    bp.tuning.accelerator = NULL;
    bp.tuning.executor = "megakernel";
    CHECK_EQ_INT(runner_create_ex(&r, &tm->m, &bp, &e), WELD_ERR_NOT_FOUND);
    CHECK_EQ_STR(e.msg, "unknown executor 'megakernel' (available: ref, ops, mega)");
    CHECK(r == NULL);
    tm_free(tm);
}

/* Every allocation in create and forward may fail: NOMEM, no leak (ASan), no crash. */
TEST(allocation_failures)
{
    struct tmodel *tm = tm_build(&spec_qwen2, DT_F32, 55);
    int32_t t[5] = {1, 2, 3, 4, 5};
    float *lg = malloc(sizeof(float) * 5 * spec_qwen2.vocab);
    int saw_ok = 0;
    for (long n = 1; n < 200 && !saw_ok; n++) {
        struct weld_err e;
        struct runner *r = NULL;
        alloc_fail_at(n);
        int rc = runner_create(&r, &tm->m, 2, 8, &e);
        if (rc == WELD_OK) {
            struct batch_seq bs = {1, t, 5, 0, true, NULL, 0, NULL, false};
            struct batch b = {.seqs = &bs, .n_seqs = 1};
            rc = runner_forward(r, &b, lg, &e);
            if (rc == WELD_OK)
                saw_ok = alloc_failed_count() == 0;
            else
                CHECK_EQ_INT(runner_seq_len(r, 1), 0);
        }
        alloc_fail_at(0);
        if (rc != WELD_OK)
            CHECK_EQ_INT(rc, WELD_ERR_NOMEM);
        runner_free(r);
    }
    CHECK(saw_ok);
    free(lg);
    tm_free(tm);
}

/* The reference executor refuses a list whose order breaks its own dependencies. */
TEST(ref_checks_schedule)
{
    struct tmodel *tm = tm_build(&spec_llama, DT_F32, 56);
    struct weld_err e;
    struct exec_weights *w = NULL;
    struct kv_cache *kv = NULL;
    struct program *p = NULL;
    void *state = NULL;
    int32_t toks[3] = {1, 2, 3};
    int pos[3] = {0, 1, 2};
    struct batch_seq bs = {0, toks, 3, 0, false, NULL, 0, NULL, false};
    struct batch b = {.seqs = &bs, .n_seqs = 1};
    struct kv_config kc = {.n_layer = tm->m.cfg.n_layer,
                           .kv_dim = tm->m.cfg.n_kv_head * tm->m.cfg.head_dim,
                           .head_dim = tm->m.cfg.head_dim, .max_seqs = 1, .max_ctx = 8,
                           .type = DT_F32};
    REQUIRE(exec_weights_create(&w, &tm->m, NULL, &e) == WELD_OK);
    REQUIRE(kv_create(&kv, &kc, &e) == WELD_OK);
    REQUIRE(kv_seq_prepare(kv, 0, 0, 3, &e) == WELD_OK);
    const int32_t *tables[1] = {kv->seqs[0].blocks};
    REQUIRE(program_build(&p, &tm->m.cfg, &b, 2, &e) == WELD_OK);
    REQUIRE(exec_ref_impl.create(&state, &tm->m.cfg, NULL, &e) == WELD_OK);
    float *arena = calloc(p->arena_floats, sizeof(float));
    float *logits = calloc((size_t)tm->m.cfg.n_vocab, sizeof(float));
    struct exec_step st = {.m = &tm->m, .w = w, .p = p, .kv = kv, .tokens = toks, .pos = pos,
                           .tables = tables, .arena = arena, .logits = logits};
    CHECK_EQ_INT(exec_ref_impl.run(state, &st, &e), WELD_OK);
    /* move the first ATTENTION of layer 0 ahead of its QKV stage */
    int a = 0;
    while (p->instrs[a].op != OP_ATTENTION)
        a++;
    struct prog_instr tmp = p->instrs[a];
    p->instrs[a] = p->instrs[1];
    p->instrs[1] = tmp;
    CHECK_EQ_INT(exec_ref_impl.run(state, &st, &e), WELD_ERR_INTERNAL);
    CHECK(strstr(e.msg, "ATTENTION") != NULL);
    free(arena), free(logits);
    exec_ref_impl.free(state);
    program_free(p);
    kv_free(kv);
    exec_weights_free(w);
    tm_free(tm);
}

static void run_batch_tests(void)
{
    RUN(batch_invariants_llama);
    RUN(batch_invariants_qwen3_q8_0);
    RUN(batch_invariants_qwen2_bf16);
    RUN(batch_invariants_llama_q4_0);
    RUN(batch_invariants_kquant_q4_k);
    RUN(batch_invariants_qwen3moe_q8_0);
    RUN(batch_invariants_deepseek_router);
    RUN(batch_invariants_mla_q8_0);
    RUN(last_logits_only);
    RUN(final_hidden_states);
    RUN(rewind_and_drop);
    RUN(limits_and_bad_batches);
    RUN(kv_exhaustion_is_all_or_nothing);
    RUN(bad_tensors_are_named);
    RUN(accelerator_and_executor_tuning);
    RUN(allocation_failures);
    RUN(ref_checks_schedule);
    RUN(shared_pool);
}

int main(void)
{
    RUN(llama_gqa_llama3_tied_f32);
    RUN(tied_embed_from_pool);
    RUN(llama_neox_linear_partial_rope_f32);
    RUN(qwen2_bias_f32);
    RUN(qwen3_qknorm_f32);
    RUN(qwen3moe_f32);
    RUN(mixtral_f32);
    RUN(qwen2moe_shared_gate_f32);
    RUN(deepseek_router_f32);
    RUN(mla_moe_f32);
    RUN(mla_split_f32);
    RUN(mla_yarn_f32);
    RUN(qwen3moe_q8_0);
    RUN(deepseek_router_q4_0);
    RUN(moe_q4_k_with_q6_k_down);
    RUN(moe_bf16);
    RUN(llama_f16);
    RUN(llama_f16_long_rows);
    RUN(llama_bf16_long_rows);
    RUN(qwen3_bf16);
    RUN(qwen2_q8_0);
    RUN(llama_neox_q8_0);
    RUN(llama_q4_0);
    RUN(qwen3_q4_0);
    RUN(llama_q4_k);
    RUN(llama_q6_k);
    RUN(qwen2_q5_0_fallback);
    RUN(k_parts_against_ref);
    RUN(repack_plan);
    RUN(kv_f16_llama);
    RUN(kv_f16_qwen2);
    RUN(kv_bf16_qwen3);
    RUN(kv_q8_0_qwen3);
    run_batch_tests();
    return test_summary();
}

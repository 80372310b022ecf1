/*
 * test_models.h - tiny random models built in memory, for test_exec_forward and
 * test_exec_executors.
 *
 * tm_build(spec, wtype, seed) fills a struct model from a struct tspec (architecture,
 * shapes, rope variant: llama3 frequency factors, linear scaling, neox, tied embeddings):
 * matrices of type wtype drawn from a normal distribution scaled by 1/sqrt(fan-in), norms
 * and biases F32 around 1 and 0. The draws come in a fixed order (tok_embd, output_norm,
 * output unless tied, then per layer attn_norm, wq, wk, wv, [bq, bk, bv], [q_norm,
 * k_norm], wo, ffn_norm, w_gate, w_up, w_down), so a seed names one model in every test.
 * qkv biases come with ARCH_QWEN2(MOE), qk-norm with ARCH_QWEN3(MOE); max_ctx is TM_CTX.
 * With n_expert > 0 the layers from dense_lead on are mixtures of experts: the router
 * (always F32, as GGUF files keep it), [exp_bias], each expert's gate, up, down, [the
 * shared expert's gate, up, down], [sh_gate_inp] replace w_gate, w_up, w_down.
 * Every buffer is owned by the tmodel and released by tm_free. The specs themselves stay
 * in each test: they differ between tests.
 */
#ifndef WELD_TEST_MODELS_H
#define WELD_TEST_MODELS_H

#include "core/rng.h"
#include "model/model.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#define TM_MAX_LAYERS 3
#define TM_CTX 64
#define TM_MAX_EXPERTS 32

struct tmodel {
    struct model m;
    struct layer_weights layers[TM_MAX_LAYERS];
    float factors[64];
    void *mem[64 * TM_MAX_LAYERS + 3 * TM_MAX_EXPERTS * TM_MAX_LAYERS];
    int n_mem;
};

struct tspec {
    enum model_arch arch;
    int dim, n_layer, n_head, n_kv, head_dim, ffn, vocab, rope_dim;
    bool neox, tied, llama3, linear;
    float theta;
    const struct tmoe *moe; /* NULL: dense */
    const struct tmla *mla; /* NULL: per-head attention */
};

/* Multi-head latent attention (model_config's fields; head_dim = nope + rope_dim, with
   n_head, dim and rope_dim from the spec; split: the value/key up-projections as the
   file's per-head attn_k_b / attn_v_b instead of attn_kv_b). */
struct tmla {
    int q_lora, kv_lora, nope, v_dim;
    bool split;
    float yarn; /* YaRN factor (original context 16, betas 32 / 1, log multiplier 0.1); 0:
                   none */
};

/* A mixture of experts (model_config's fields of the same meaning). */
struct tmoe {
    int n_expert, n_used, moe_ffn, shared_ffn, dense_lead, n_group, topk_group;
    bool sigmoid, norm, bias, shared_gate;
    float scale;   /* 0: 1 */
    int down_type; /* the experts' down projections' type (a GGUF mix such as Q4_K_M's
                      Q6_K downs); 0: the model's */
};

static inline void *tm_alloc(struct tmodel *tm, size_t n)
{
    void *p = calloc(1, n);
    tm->mem[tm->n_mem++] = p;
    return p;
}

static inline void tm_free(struct tmodel *tm)
{
    for (int i = 0; i < tm->n_mem; i++)
        free(tm->mem[i]);
    free(tm);
}

static inline struct tensor make_tensor(struct tmodel *tm, struct rng *r, int t, int64_t ne0,
                                        int64_t ne1, double mean, double scale)
{
    size_t n = (size_t)(ne0 * ne1);
    float *f = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        f[i] = (float)(mean + scale * rng_normal(r));
    size_t rb = dtype_row_bytes(t, ne0);
    void *data = tm_alloc(tm, rb * (size_t)ne1);
    for (int64_t row = 0; row < ne1; row++)
        dtype_quantize_row(t, f + row * ne0, (uint8_t *)data + row * rb, ne0);
    free(f);
    struct tensor out = {.name = NULL, .type = t, .n_dims = ne1 > 1 ? 2 : 1,
                         .ne = {ne0, ne1, 1, 1}, .data = data, .nbytes = rb * (size_t)ne1};
    return out;
}

/* A latent-attention layer's projections (struct tmla): [wq_a, q_a_norm, wq_b | wq],
   wkv_a, kv_a_norm, then the key/value up-projection drawn as one {kv_lora, n_head *
   (nope + v)} matrix and stored as attn_kv_b or (split, F32 only) as attn_k_b and attn_v_b
   (names.h's transposition), then wo. */
static inline void tm_mla(struct tmodel *tm, struct rng *r, const struct tspec *s, int wtype,
                          struct layer_weights *L)
{
    const struct tmla *a = s->mla;
    const int nh = s->n_head, hd = a->nope + s->rope_dim, per = a->nope + a->v_dim;
    double sd = 1.0 / sqrt(s->dim);
    if (a->q_lora > 0) {
        L->wq_a = make_tensor(tm, r, wtype, s->dim, a->q_lora, 0, sd * 2);
        L->q_a_norm = make_tensor(tm, r, DT_F32, a->q_lora, 1, 1, 0.1);
        L->wq_b = make_tensor(tm, r, wtype, a->q_lora, nh * hd, 0, 2.0 / sqrt(a->q_lora));
    } else {
        L->wq = make_tensor(tm, r, wtype, s->dim, nh * hd, 0, sd * 2);
    }
    L->wkv_a = make_tensor(tm, r, wtype, s->dim, a->kv_lora + s->rope_dim, 0, sd * 2);
    L->kv_a_norm = make_tensor(tm, r, DT_F32, a->kv_lora, 1, 1, 0.1);
    struct tensor kvb = make_tensor(tm, r, a->split ? DT_F32 : wtype, a->kv_lora, nh * per, 0,
                                    1.5 / sqrt(a->kv_lora));
    if (!a->split) {
        L->wkv_b = kvb;
    } else {
        const float *src = kvb.data;
        float *kb = tm_alloc(tm, sizeof(float) * (size_t)nh * a->kv_lora * a->nope);
        float *vb = tm_alloc(tm, sizeof(float) * (size_t)nh * a->kv_lora * a->v_dim);
        for (int h = 0; h < nh; h++)
            for (int c = 0; c < a->kv_lora; c++) {
                for (int i = 0; i < a->nope; i++)
                    kb[((size_t)h * a->kv_lora + c) * a->nope + i] =
                        src[((size_t)h * per + i) * a->kv_lora + c];
                for (int j = 0; j < a->v_dim; j++)
                    vb[((size_t)h * a->v_dim + j) * a->kv_lora + c] =
                        src[((size_t)h * per + a->nope + j) * a->kv_lora + c];
            }
        L->wk_b = (struct tensor){.type = DT_F32,
                                  .n_dims = 3,
                                  .ne = {a->nope, a->kv_lora, nh, 1},
                                  .data = kb,
                                  .nbytes = sizeof(float) * (size_t)nh * a->kv_lora * a->nope};
        L->wv_b = (struct tensor){.type = DT_F32,
                                  .n_dims = 3,
                                  .ne = {a->kv_lora, a->v_dim, nh, 1},
                                  .data = vb,
                                  .nbytes = sizeof(float) * (size_t)nh * a->kv_lora * a->v_dim};
    }
    L->wo = make_tensor(tm, r, wtype, nh * a->v_dim, s->dim, 0, 1.0 / sqrt(nh * a->v_dim));
}

static inline void tm_layer(struct tmodel *tm, struct rng *r, const struct tspec *sp, int wtype,
                            int l)
{
    const struct tspec *s = sp;
    const struct model_config *c = &tm->m.cfg;
    int qd = s->n_head * s->head_dim, kd = s->n_kv * s->head_dim;
    double sd = 1.0 / sqrt(s->dim), sq = 1.0 / sqrt(qd), sf = 1.0 / sqrt(s->ffn);
    struct layer_weights *L = &tm->layers[l];
    L->attn_norm = make_tensor(tm, r, DT_F32, s->dim, 1, 1, 0.1);
    if (s->mla) {
        tm_mla(tm, r, s, wtype, L);
    } else {
        L->wq = make_tensor(tm, r, wtype, s->dim, qd, 0, sd * 2);
        L->wk = make_tensor(tm, r, wtype, s->dim, kd, 0, sd * 2);
        L->wv = make_tensor(tm, r, wtype, s->dim, kd, 0, sd);
        if (c->qkv_bias) {
            L->bq = make_tensor(tm, r, DT_F32, qd, 1, 0, 0.2);
            L->bk = make_tensor(tm, r, DT_F32, kd, 1, 0, 0.2);
            L->bv = make_tensor(tm, r, DT_F32, kd, 1, 0, 0.2);
        }
        if (c->qk_norm) {
            L->q_norm = make_tensor(tm, r, DT_F32, s->head_dim, 1, 1, 0.2);
            L->k_norm = make_tensor(tm, r, DT_F32, s->head_dim, 1, 1, 0.2);
        }
        L->wo = make_tensor(tm, r, wtype, qd, s->dim, 0, sq);
    }
    L->ffn_norm = make_tensor(tm, r, DT_F32, s->dim, 1, 1, 0.1);
    if (model_layer_moe(c, l)) {
        const struct tmoe *mo = s->moe;
        int E = mo->n_expert;
        double se = 1.0 / sqrt(mo->moe_ffn);
        L->router = make_tensor(tm, r, DT_F32, s->dim, E, 0, sd * 4);
        if (mo->bias)
            L->exp_bias = make_tensor(tm, r, DT_F32, E, 1, 0, 0.2);
        L->exp_gate = tm_alloc(tm, 3 * (size_t)E * sizeof(struct tensor));
        L->exp_up = L->exp_gate + E, L->exp_down = L->exp_gate + 2 * E;
        for (int x = 0; x < E; x++) {
            L->exp_gate[x] = make_tensor(tm, r, wtype, s->dim, mo->moe_ffn, 0, sd);
            L->exp_up[x] = make_tensor(tm, r, wtype, s->dim, mo->moe_ffn, 0, sd);
            L->exp_down[x] = make_tensor(tm, r, mo->down_type ? mo->down_type : wtype, mo->moe_ffn,
                                         s->dim, 0, se);
        }
        if (mo->shared_ffn > 0) {
            double ss = 1.0 / sqrt(mo->shared_ffn);
            L->sh_gate = make_tensor(tm, r, wtype, s->dim, mo->shared_ffn, 0, sd);
            L->sh_up = make_tensor(tm, r, wtype, s->dim, mo->shared_ffn, 0, sd);
            L->sh_down = make_tensor(tm, r, wtype, mo->shared_ffn, s->dim, 0, ss);
        }
        if (mo->shared_gate)
            L->sh_gate_inp = make_tensor(tm, r, DT_F32, s->dim, 1, 0, sd);
        return;
    }
    L->w_gate = make_tensor(tm, r, wtype, s->dim, s->ffn, 0, sd);
    L->w_up = make_tensor(tm, r, wtype, s->dim, s->ffn, 0, sd);
    L->w_down = make_tensor(tm, r, wtype, s->ffn, s->dim, 0, sf);
}

static inline struct tmodel *tm_build(const struct tspec *s, int wtype, uint64_t seed)
{
    struct tmodel *tm = calloc(1, sizeof *tm);
    struct rng r;
    rng_seed(&r, seed);
    struct model_config *c = &tm->m.cfg;
    c->arch = s->arch;
    c->n_vocab = s->vocab, c->dim = s->dim, c->n_layer = s->n_layer, c->n_head = s->n_head;
    c->n_kv_head = s->n_kv, c->head_dim = s->head_dim, c->ffn_dim = s->ffn;
    c->max_ctx = TM_CTX, c->rope_dim = s->rope_dim, c->norm_eps = 1e-5f;
    c->rope_theta = s->theta, c->rope_neox = s->neox, c->tied_embeddings = s->tied;
    c->qkv_bias = s->arch == ARCH_QWEN2 || s->arch == ARCH_QWEN2MOE;
    c->qk_norm = s->arch == ARCH_QWEN3 || s->arch == ARCH_QWEN3MOE;
    if (s->moe) {
        const struct tmoe *mo = s->moe;
        c->n_expert = mo->n_expert, c->n_expert_used = mo->n_used, c->moe_ffn_dim = mo->moe_ffn;
        c->shared_ffn_dim = mo->shared_ffn, c->n_shared_expert = mo->shared_ffn > 0;
        c->shared_gate = mo->shared_gate, c->n_dense_lead = mo->dense_lead;
        c->gating = mo->sigmoid ? MOE_GATING_SIGMOID : MOE_GATING_SOFTMAX;
        c->expert_norm = mo->norm, c->expert_scale = mo->scale > 0 ? mo->scale : 1.0f;
        c->n_group = mo->n_group, c->topk_group = mo->topk_group, c->expert_bias = mo->bias;
    }
    if (s->mla) {
        c->q_lora_rank = s->mla->q_lora, c->kv_lora_rank = s->mla->kv_lora;
        c->qk_nope_dim = s->mla->nope, c->v_head_dim = s->mla->v_dim;
        c->head_dim = s->mla->nope + s->rope_dim;
        if (s->mla->yarn > 0) {
            c->rope_scaling = ROPE_SCALING_YARN, c->rope_factor = s->mla->yarn;
            c->rope_orig_ctx = 16, c->yarn_beta_fast = 32, c->yarn_beta_slow = 1;
            c->yarn_log_mul = 0.1f;
        }
    }
    if (s->linear)
        c->rope_scaling = ROPE_SCALING_LINEAR, c->rope_factor = 2.0f;
    if (s->llama3) {
        c->rope_scaling = ROPE_SCALING_LLAMA3;
        for (int i = 0; i < s->rope_dim / 2; i++)
            tm->factors[i] = 1.0f + (float)(i % 3); /* 1, 2, 3, 1, ... */
        tm->m.rope_freq_factors = tm->factors;
    }
    tm->m.tok_embd = make_tensor(tm, &r, wtype, s->dim, s->vocab, 0, 1.0);
    tm->m.output_norm = make_tensor(tm, &r, DT_F32, s->dim, 1, 1, 0.1);
    tm->m.output = s->tied ? tm->m.tok_embd
                           : make_tensor(tm, &r, wtype, s->dim, s->vocab, 0, 1.0 / sqrt(s->dim));
    tm->m.layers = tm->layers;
    for (int l = 0; l < s->n_layer; l++)
        tm_layer(tm, &r, s, wtype, l);
    return tm;
}

#endif

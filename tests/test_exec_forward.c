/*
 * The forward pass (program + reference executor + kernels + paged KV, through the runner)
 * against a naive forward pass written here straight from the math: plain double arrays,
 * attention recomputed over the whole prefix for every position, no KV cache, no program.
 *
 * Models are tiny and random, built in memory for each architecture variant: llama with
 * GQA, llama3 rope frequency factors and tied embeddings (adjacent-pair rope); llama with
 * neox rope, partial rotary and linear scaling; qwen2 with QKV biases; qwen3 with qk-norm
 * and head_dim != dim / n_head; with F32 weights and with F16 / BF16 / Q8_0 weights (the
 * reference dequantizes the same bytes). Then the batch invariants, which must hold
 * bit-for-bit: batching with other sequences, prefill chunking, n_splits, KV block size.
 * Then errors: context limit, KV exhaustion, bad tensors, WELD_ACCELERATOR / WELD_EXEC.
 */
#include "core/rng.h"
#include "exec/runner.h"
#include "test.h"

#include <stdint.h>

#define MAX_LAYERS 3

struct tmodel {
    struct model m;
    struct layer_weights layers[MAX_LAYERS];
    float factors[64];
    void *mem[64 * MAX_LAYERS];
    int n_mem;
};

struct tspec {
    enum model_arch arch;
    int dim, n_layer, n_head, n_kv, head_dim, ffn, vocab, rope_dim;
    bool neox, tied, llama3, linear;
    float theta;
};

static void *tm_alloc(struct tmodel *tm, size_t n)
{
    void *p = calloc(1, n);
    tm->mem[tm->n_mem++] = p;
    return p;
}

static void tm_free(struct tmodel *tm)
{
    for (int i = 0; i < tm->n_mem; i++)
        free(tm->mem[i]);
    free(tm);
}

static struct tensor make_tensor(struct tmodel *tm, struct rng *r, int t, int64_t ne0,
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

static struct tmodel *tm_build(const struct tspec *s, int wtype, uint64_t seed)
{
    struct tmodel *tm = calloc(1, sizeof *tm);
    struct rng r;
    rng_seed(&r, seed);
    struct model_config *c = &tm->m.cfg;
    c->arch = s->arch;
    c->n_vocab = s->vocab, c->dim = s->dim, c->n_layer = s->n_layer, c->n_head = s->n_head;
    c->n_kv_head = s->n_kv, c->head_dim = s->head_dim, c->ffn_dim = s->ffn;
    c->max_ctx = 64, c->rope_dim = s->rope_dim, c->norm_eps = 1e-5f;
    c->rope_theta = s->theta, c->rope_neox = s->neox, c->tied_embeddings = s->tied;
    c->qkv_bias = s->arch == ARCH_QWEN2, c->qk_norm = s->arch == ARCH_QWEN3;
    if (s->linear)
        c->rope_scaling = ROPE_SCALING_LINEAR, c->rope_factor = 2.0f;
    if (s->llama3) {
        c->rope_scaling = ROPE_SCALING_LLAMA3;
        for (int i = 0; i < s->rope_dim / 2; i++)
            tm->factors[i] = 1.0f + (float)(i % 3); /* 1, 2, 3, 1, ... */
        tm->m.rope_freq_factors = tm->factors;
    }
    int qd = s->n_head * s->head_dim, kd = s->n_kv * s->head_dim;
    double sd = 1.0 / sqrt(s->dim), sq = 1.0 / sqrt(qd), sf = 1.0 / sqrt(s->ffn);
    tm->m.tok_embd = make_tensor(tm, &r, wtype, s->dim, s->vocab, 0, 1.0);
    tm->m.output_norm = make_tensor(tm, &r, DT_F32, s->dim, 1, 1, 0.1);
    tm->m.output = s->tied ? tm->m.tok_embd : make_tensor(tm, &r, wtype, s->dim, s->vocab, 0, sd);
    tm->m.layers = tm->layers;
    for (int l = 0; l < s->n_layer; l++) {
        struct layer_weights *L = &tm->layers[l];
        L->attn_norm = make_tensor(tm, &r, DT_F32, s->dim, 1, 1, 0.1);
        L->wq = make_tensor(tm, &r, wtype, s->dim, qd, 0, sd * 2);
        L->wk = make_tensor(tm, &r, wtype, s->dim, kd, 0, sd * 2);
        L->wv = make_tensor(tm, &r, wtype, s->dim, kd, 0, sd);
        if (c->qkv_bias) {
            L->bq = make_tensor(tm, &r, DT_F32, qd, 1, 0, 0.2);
            L->bk = make_tensor(tm, &r, DT_F32, kd, 1, 0, 0.2);
            L->bv = make_tensor(tm, &r, DT_F32, kd, 1, 0, 0.2);
        }
        if (c->qk_norm) {
            L->q_norm = make_tensor(tm, &r, DT_F32, s->head_dim, 1, 1, 0.2);
            L->k_norm = make_tensor(tm, &r, DT_F32, s->head_dim, 1, 1, 0.2);
        }
        L->wo = make_tensor(tm, &r, wtype, qd, s->dim, 0, sq);
        L->ffn_norm = make_tensor(tm, &r, DT_F32, s->dim, 1, 1, 0.1);
        L->w_gate = make_tensor(tm, &r, wtype, s->dim, s->ffn, 0, sd);
        L->w_up = make_tensor(tm, &r, wtype, s->dim, s->ffn, 0, sd);
        L->w_down = make_tensor(tm, &r, wtype, s->ffn, s->dim, 0, sf);
    }
    return tm;
}

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

static void matvec(const struct tensor *t, const double *x, double *y)
{
    double *w = deq(t);
    for (int64_t r = 0; r < t->ne[1]; r++) {
        double s = 0;
        for (int64_t i = 0; i < t->ne[0]; i++)
            s += w[r * t->ne[0] + i] * x[i];
        y[r] = s;
    }
    free(w);
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

static void ref_layer(const struct model *m, int l, double *x, int n)
{
    const struct model_config *c = &m->cfg;
    const struct layer_weights *L = &m->layers[l];
    int hd = c->head_dim, qd = c->n_head * hd, kd = c->n_kv_head * hd, D = c->dim;
    double *q = calloc((size_t)n * qd, 8), *k = calloc((size_t)n * kd, 8);
    double *v = calloc((size_t)n * kd, 8), *att = calloc((size_t)qd, 8);
    double *h = calloc((size_t)(D > c->ffn_dim ? D : c->ffn_dim), 8), *o = calloc((size_t)D, 8);
    double *g = calloc((size_t)c->ffn_dim, 8), *u = calloc((size_t)c->ffn_dim, 8);
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
        matvec(&L->w_gate, h, g);
        matvec(&L->w_up, h, u);
        for (int i = 0; i < c->ffn_dim; i++)
            g[i] = g[i] / (1 + exp(-g[i])) * u[i];
        matvec(&L->w_down, g, o);
        for (int i = 0; i < D; i++)
            x[t * D + i] += o[i];
    }
    free(q), free(k), free(v), free(att), free(h), free(o), free(g), free(u), free(sc);
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

static const struct tspec spec_llama = {ARCH_LLAMA, 64, 2, 8, 2, 8, 96, 50, 8,
                                        false, true, true, false, 10000.0f};
static const struct tspec spec_llama_neox = {ARCH_LLAMA, 64, 2, 4, 4, 16, 64, 40, 8,
                                             true, false, false, true, 10000.0f};
static const struct tspec spec_qwen2 = {ARCH_QWEN2, 64, 2, 4, 2, 16, 128, 45, 16,
                                        true, false, false, false, 1000000.0f};
static const struct tspec spec_qwen3 = {ARCH_QWEN3, 64, 2, 4, 2, 32, 96, 60, 32,
                                        true, false, false, false, 1000000.0f};

static void rand_tokens(uint64_t seed, int32_t *t, int n, int vocab)
{
    struct rng r;
    rng_seed(&r, seed);
    for (int i = 0; i < n; i++)
        t[i] = (int32_t)(rng_u64(&r) % (uint64_t)vocab);
}

/* Prompt of 9 (all logits) then 5 one-token decode steps vs the naive reference. */
static void check_against_ref(const struct tspec *s, int wtype, uint64_t seed)
{
    enum { P = 9, N = 14 };
    struct tmodel *tm = tm_build(s, wtype, seed);
    const int V = s->vocab;
    int32_t toks[N];
    rand_tokens(seed + 1, toks, N, V);
    double *want = malloc(sizeof(double) * N * V);
    float *got = malloc(sizeof(float) * N * V);
    ref_forward(&tm->m, toks, N, want);
    struct runner *r = NULL;
    struct weld_err e = {0};
    int rc = runner_create(&r, &tm->m, 2, 32, &e);
    if (rc)
        fprintf(stderr, "runner_create: %s\n", e.msg);
    REQUIRE(rc == WELD_OK);
    struct batch_seq bs = {.seq_id = 1, .tokens = toks, .n_tokens = P, .pos = 0,
                           .all_logits = true};
    struct batch b = {&bs, 1};
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
    if (getenv("SHOWDIFF") || !(max_diff / max_ref <= 1e-4))
        fprintf(stderr, "arch %s type %s: max diff %g / max %g\n", (s->arch == ARCH_LLAMA ? "llama" : s->arch == ARCH_QWEN2 ? "qwen2" : "qwen3"),
                dtype_name(wtype), max_diff, max_ref);
    CHECK(max_ref > 0.1);
    CHECK(max_diff / max_ref <= 1e-4);
    runner_free(r);
    free(want), free(got);
    tm_free(tm);
}

TEST(llama_gqa_llama3_tied_f32) { check_against_ref(&spec_llama, DT_F32, 11); }
TEST(llama_neox_linear_partial_rope_f32) { check_against_ref(&spec_llama_neox, DT_F32, 12); }
TEST(qwen2_bias_f32) { check_against_ref(&spec_qwen2, DT_F32, 13); }
TEST(qwen3_qknorm_f32) { check_against_ref(&spec_qwen3, DT_F32, 14); }
TEST(llama_f16) { check_against_ref(&spec_llama, DT_F16, 15); }
TEST(qwen3_bf16) { check_against_ref(&spec_qwen3, DT_BF16, 16); }
TEST(qwen2_q8_0) { check_against_ref(&spec_qwen2, DT_Q8_0, 17); }
TEST(llama_neox_q8_0) { check_against_ref(&spec_llama_neox, DT_Q8_0, 18); }

/* BATCH_TESTS */
static void run_batch_tests(void) {}

int main(void)
{
    RUN(llama_gqa_llama3_tied_f32);
    RUN(llama_neox_linear_partial_rope_f32);
    RUN(qwen2_bias_f32);
    RUN(qwen3_qknorm_f32);
    RUN(llama_f16);
    RUN(qwen3_bf16);
    RUN(qwen2_q8_0);
    RUN(llama_neox_q8_0);
    run_batch_tests();
    return test_summary();
}

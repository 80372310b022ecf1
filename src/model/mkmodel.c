/*
 * mkmodel - random-weight models at real shapes (see mkmodel.h for the contract).
 *
 * A "plan" lists the model's tensors in HF order: HF name, GGUF name, HF shape
 * (outermost first), kind (weight / norm / bias) and, for llama Q/K going to GGUF, the
 * head count to permute with. One struct mk_fill per tensor is the writers' callback
 * context; the callback draws the tensor's values from its own rng stream row by row and
 * converts each row to the output type straight into the writer's buffer.
 */
#include "model/mkmodel.h"

#include "core/alloc.h"
#include "core/fp16.h"
#include "core/json.h"
#include "core/mfile.h"
#include "core/rng.h"
#include "format/dtype.h"
#include "format/gguf.h"
#include "format/safetensors.h"
#include "model/names.h"
#include "model/tokmeta.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#define MK_STD 0.02

enum mk_kind { MK_WEIGHT = 0, MK_NORM, MK_BIAS };

struct mk_tensor {
    char hf[96];
    char gguf[64];
    int n_dims;
    int64_t shape[2]; /* HF order: [rows, cols] or [n]; of one expert when stacked */
    enum mk_kind kind;
    int permute_heads; /* > 0: permute rows for GGUF llama with this many heads */
    /* GGUF only: */
    int stack_layer; /* >= 0: the stacked experts of this layer and projection... */
    enum expert_proj stack_proj;
    int kv_b_part; /* 1: attn_k_b, 2: attn_v_b, drawn as kv_b_proj (hf) and split */
    int gguf_dims; /* GGUF n_dims and ne (innermost first) */
    int64_t ne[3];
};

struct mk_fill {
    const struct mk_tensor *t;
    const struct model_config *c;
    uint64_t seed;
    int dtype; /* of the output tensor */
    int gguf;
};

int mkmodel_is_gguf_path(const char *path)
{
    size_t n = strlen(path);
    return n >= 5 && !strcmp(path + n - 5, ".gguf");
}

uint64_t mkmodel_tensor_seed(uint64_t seed, const char *hf_name)
{
    return XXH64(hf_name, strlen(hf_name), seed);
}

/* ---- presets ---- */

void mkmodel_config_defaults(struct model_config *c)
{
    int qwen = c->arch != ARCH_LLAMA && c->arch != ARCH_DEEPSEEK2;
    if (!c->n_kv_head)
        c->n_kv_head = c->n_head;
    if (!c->head_dim && c->n_head)
        c->head_dim = c->dim / c->n_head;
    if (!c->rope_dim)
        c->rope_dim = c->head_dim;
    if (!c->ffn_dim)
        c->ffn_dim = 4 * c->dim;
    if (!c->max_ctx)
        c->max_ctx = 2048;
    if (!(c->norm_eps > 0))
        c->norm_eps = qwen ? 1e-6f : 1e-5f;
    if (!(c->rope_theta > 0))
        c->rope_theta = qwen ? 1000000.0f : 10000.0f;
    c->rope_neox = qwen;
    c->qkv_bias = c->arch == ARCH_QWEN2 || c->arch == ARCH_QWEN2MOE;
    c->qk_norm = c->arch == ARCH_QWEN3 || c->arch == ARCH_QWEN3MOE;
    if (c->arch == ARCH_DEEPSEEK2) {
        c->n_kv_head = c->n_head;
        c->head_dim = c->qk_nope_dim + c->rope_dim;
    }
    if (c->arch != ARCH_DEEPSEEK2)
        c->v_head_dim = c->head_dim;
    if (c->n_expert > 0) {
        if (!c->gating)
            c->gating = MOE_GATING_SOFTMAX;
        if (!(c->expert_scale > 0))
            c->expert_scale = 1.0f;
        if (!c->moe_ffn_dim)
            c->moe_ffn_dim = c->arch == ARCH_LLAMA ? c->ffn_dim : c->ffn_dim / 4;
        if (c->arch == ARCH_LLAMA)
            c->moe_ffn_dim = c->ffn_dim;
        if (c->arch == ARCH_DEEPSEEK2)
            c->shared_ffn_dim = c->n_shared_expert * c->moe_ffn_dim;
    }
}

/* The sparse presets: "tiny" (unit tests: a few hundred KB at f32) and ~1.4 B parameter
   models at real layer shapes (Qwen3-30B-A3B's heads and expert width, DeepSeek-V3's MLA
   ranks scaled down). */
static void preset_tiny_moe(struct model_config *c)
{
    c->dim = 64, c->n_layer = 2, c->n_head = 4, c->n_kv_head = 2, c->ffn_dim = 128;
    c->max_ctx = 256;
    c->n_expert = 8, c->n_expert_used = 2, c->moe_ffn_dim = 32;
    c->gating = MOE_GATING_SOFTMAX, c->expert_scale = 1.0f;
    switch (c->arch) {
    case ARCH_QWEN3MOE: c->head_dim = 16, c->expert_norm = true, c->tied_embeddings = true; break;
    case ARCH_QWEN2MOE: /* llama.cpp's qwen2moe requires output.weight */
        c->n_shared_expert = 1, c->shared_ffn_dim = 64, c->shared_gate = true;
        break;
    case ARCH_LLAMA: /* Mixtral */
        c->ffn_dim = 64, c->moe_ffn_dim = 64, c->expert_norm = true;
        break;
    default: /* deepseek2, V3-style */
        c->n_layer = 3, c->n_dense_lead = 1, c->n_kv_head = 4;
        c->q_lora_rank = 32, c->kv_lora_rank = 32, c->qk_nope_dim = 32, c->rope_dim = 16;
        c->v_head_dim = 32;
        c->n_shared_expert = 1, c->n_group = 4, c->topk_group = 2;
        c->gating = MOE_GATING_SIGMOID, c->expert_bias = true, c->expert_norm = true;
        c->expert_scale = 2.5f, c->rope_theta = 10000.0f;
        c->rope_scaling = ROPE_SCALING_YARN, c->rope_factor = 4.0f, c->rope_orig_ctx = 64;
        c->yarn_beta_fast = 32.0f, c->yarn_beta_slow = 1.0f, c->yarn_log_mul = 0.1f;
    }
}

static void preset_deepseek_1b(struct model_config *c)
{
    c->arch = ARCH_DEEPSEEK2;
    c->dim = 1024, c->n_layer = 12, c->n_head = 16, c->n_kv_head = 16, c->ffn_dim = 2816;
    c->n_vocab = 129280, c->max_ctx = 163840, c->norm_eps = 1e-6f, c->rope_theta = 10000.0f;
    c->q_lora_rank = 384, c->kv_lora_rank = 256, c->qk_nope_dim = 64, c->rope_dim = 32;
    c->v_head_dim = 64;
    c->n_expert = 64, c->n_expert_used = 6, c->moe_ffn_dim = 512, c->n_shared_expert = 2;
    c->n_dense_lead = 1, c->n_group = 8, c->topk_group = 4;
    c->gating = MOE_GATING_SIGMOID, c->expert_bias = true, c->expert_norm = true;
    c->expert_scale = 2.5f;
    c->rope_scaling = ROPE_SCALING_YARN, c->rope_factor = 40.0f, c->rope_orig_ctx = 4096;
    c->yarn_beta_fast = 32.0f, c->yarn_beta_slow = 1.0f, c->yarn_log_mul = 0.1f;
}

int mkmodel_preset(const char *name, enum model_arch arch, struct model_config *c,
                   struct weld_err *e)
{
    memset(c, 0, sizeof *c);
    c->arch = arch;
    if (!strcmp(name, "tiny") &&
        (arch == ARCH_QWEN3MOE || arch == ARCH_QWEN2MOE || arch == ARCH_DEEPSEEK2)) {
        preset_tiny_moe(c);
    } else if (!strcmp(name, "mixtral-tiny")) {
        c->arch = ARCH_LLAMA;
        preset_tiny_moe(c);
    } else if (!strcmp(name, "tiny")) {
        c->dim = 64, c->n_layer = 2, c->n_head = 4, c->n_kv_head = 2, c->ffn_dim = 128;
        c->max_ctx = 256;
        c->tied_embeddings = arch != ARCH_LLAMA;
    } else if (!strcmp(name, "qwen3-moe-1b")) {
        c->arch = ARCH_QWEN3MOE;
        c->dim = 1024, c->n_layer = 12, c->n_head = 16, c->n_kv_head = 4, c->head_dim = 128;
        c->ffn_dim = 3072, c->n_vocab = 151936, c->tied_embeddings = true;
        c->rope_theta = 1000000.0f, c->norm_eps = 1e-6f, c->max_ctx = 40960;
        c->n_expert = 64, c->n_expert_used = 8, c->moe_ffn_dim = 512, c->expert_norm = true;
    } else if (!strcmp(name, "deepseek-moe-1b")) {
        preset_deepseek_1b(c);
    } else if (!strcmp(name, "llama-110m")) {
        c->arch = ARCH_LLAMA;
        c->dim = 768, c->n_layer = 12, c->n_head = 12, c->n_kv_head = 12, c->ffn_dim = 2048;
        c->max_ctx = 1024, c->n_vocab = 32000;
    } else if (!strcmp(name, "llama-3.2-1b")) {
        c->arch = ARCH_LLAMA;
        c->dim = 2048, c->n_layer = 16, c->n_head = 32, c->n_kv_head = 8, c->head_dim = 64;
        c->ffn_dim = 8192, c->n_vocab = 128256, c->tied_embeddings = true;
        c->rope_theta = 500000.0f, c->norm_eps = 1e-5f, c->max_ctx = 131072;
        c->rope_scaling = ROPE_SCALING_LLAMA3, c->rope_factor = 32.0f;
        c->rope_low_freq_factor = 1.0f, c->rope_high_freq_factor = 4.0f;
        c->rope_orig_ctx = 8192;
    } else if (!strcmp(name, "qwen3-0.6b")) {
        c->arch = ARCH_QWEN3;
        c->dim = 1024, c->n_layer = 28, c->n_head = 16, c->n_kv_head = 8, c->head_dim = 128;
        c->ffn_dim = 3072, c->n_vocab = 151936, c->tied_embeddings = true;
        c->rope_theta = 1000000.0f, c->norm_eps = 1e-6f, c->max_ctx = 40960;
    } else if (!strcmp(name, "qwen2-0.5b")) {
        c->arch = ARCH_QWEN2;
        c->dim = 896, c->n_layer = 24, c->n_head = 14, c->n_kv_head = 2, c->ffn_dim = 4864;
        c->n_vocab = 151936, c->tied_embeddings = true;
        c->rope_theta = 1000000.0f, c->norm_eps = 1e-6f, c->max_ctx = 32768;
    } else {
        return err_set(e, WELD_ERR_INVALID_ARG,
                       "unknown preset '%s' (tiny, mixtral-tiny, "
                       "llama-110m, llama-3.2-1b, qwen3-0.6b, qwen2-0.5b, qwen3-moe-1b, "
                       "deepseek-moe-1b)",
                       name);
    }
    mkmodel_config_defaults(c);
    snprintf(c->name, sizeof c->name, "weld-mkmodel-%s", name);
    return WELD_OK;
}

/* ---- the tensor plan ---- */

static void plan_add(struct mk_tensor *p, int *n, const char *hf, int n_dims, int64_t d0,
                     int64_t d1, enum mk_kind kind, int permute)
{
    struct mk_tensor *t = &p[(*n)++];
    memset(t, 0, sizeof *t);
    snprintf(t->hf, sizeof t->hf, "%s", hf);
    if (tensor_name_hf_to_gguf(hf, t->gguf, sizeof t->gguf) != 0)
        snprintf(t->gguf, sizeof t->gguf, "%s", hf);
    t->n_dims = n_dims;
    t->shape[0] = d0;
    t->shape[1] = n_dims == 2 ? d1 : 1;
    t->kind = kind;
    t->permute_heads = permute;
    t->stack_layer = -1;
    t->gguf_dims = n_dims;
    t->ne[0] = n_dims == 2 ? d1 : d0;
    t->ne[1] = n_dims == 2 ? d0 : 1;
    t->ne[2] = 1;
}

static enum hf_style mk_style(const struct model_config *c)
{
    if (c->arch == ARCH_LLAMA && c->n_expert > 0)
        return HF_STYLE_MIXTRAL;
    return c->arch == ARCH_DEEPSEEK2 ? HF_STYLE_DEEPSEEK : HF_STYLE_DEFAULT;
}

/* A layer tensor by its GGUF suffix, named in HF by the arch's style. */
static void plan_layer(struct mk_tensor *p, int *n, const struct model_config *c, int l,
                       const char *gguf_suffix, int n_dims, int64_t d0, int64_t d1,
                       enum mk_kind kind)
{
    char g[96], hf[96];
    snprintf(g, sizeof g, "blk.%d.%s", l, gguf_suffix);
    WELD_ASSERT(tensor_name_gguf_to_hf_style(g, mk_style(c), hf, sizeof hf) == 0);
    plan_add(p, n, hf, n_dims, d0, d1, kind, 0);
}

static void plan_mla(struct mk_tensor *p, int *n, const struct model_config *c, int l, int gguf)
{
    int64_t nh = c->n_head, lora = c->kv_lora_rank, ql = c->q_lora_rank;
    if (ql > 0) {
        plan_layer(p, n, c, l, "attn_q_a.weight", 2, ql, c->dim, MK_WEIGHT);
        plan_layer(p, n, c, l, "attn_q_a_norm.weight", 1, ql, 0, MK_NORM);
        plan_layer(p, n, c, l, "attn_q_b.weight", 2, nh * c->head_dim, ql, MK_WEIGHT);
    } else {
        plan_layer(p, n, c, l, "attn_q.weight", 2, nh * c->head_dim, c->dim, MK_WEIGHT);
    }
    plan_layer(p, n, c, l, "attn_kv_a_mqa.weight", 2, lora + c->rope_dim, c->dim, MK_WEIGHT);
    plan_layer(p, n, c, l, "attn_kv_a_norm.weight", 1, lora, 0, MK_NORM);
    plan_layer(p, n, c, l, "attn_kv_b.weight", 2, nh * (c->qk_nope_dim + c->v_head_dim), lora,
               MK_WEIGHT);
    if (gguf) { /* llama.cpp's form: k_b and v_b, both drawn as kv_b_proj */
        struct mk_tensor kv = p[--*n];
        for (int part = 1; part <= 2; part++) {
            struct mk_tensor *t = &p[(*n)++];
            *t = kv;
            t->kv_b_part = part;
            t->gguf_dims = 3;
            snprintf(t->gguf, sizeof t->gguf, "blk.%d.%s", l,
                     part == 1 ? "attn_k_b.weight" : "attn_v_b.weight");
            t->ne[0] = part == 1 ? c->qk_nope_dim : lora;
            t->ne[1] = part == 1 ? lora : c->v_head_dim;
            t->ne[2] = nh;
        }
    }
    plan_layer(p, n, c, l, "attn_output.weight", 2, c->dim, nh * c->v_head_dim, MK_WEIGHT);
}

static void plan_moe(struct mk_tensor *p, int *n, const struct model_config *c, int l, int gguf)
{
    char nm[96];
    plan_layer(p, n, c, l, "ffn_gate_inp.weight", 2, c->n_expert, c->dim, MK_WEIGHT);
    if (c->expert_bias)
        plan_layer(p, n, c, l, "exp_probs_b.bias", 1, c->n_expert, 0, MK_BIAS);
    static const enum expert_proj order[3] = {EXP_GATE, EXP_UP, EXP_DOWN};
    for (int i = 0; i < 3; i++) {
        enum expert_proj pr = order[i];
        int64_t rows = pr == EXP_DOWN ? c->dim : c->moe_ffn_dim;
        int64_t cols = pr == EXP_DOWN ? c->moe_ffn_dim : c->dim;
        for (int x = 0; x < (gguf ? 1 : c->n_expert); x++) {
            tensor_name_expert_hf(l, x, pr, mk_style(c), nm, sizeof nm);
            plan_add(p, n, nm, 2, rows, cols, MK_WEIGHT, 0);
            if (gguf) {
                struct mk_tensor *t = &p[*n - 1];
                t->stack_layer = l;
                t->stack_proj = pr;
                tensor_name_expert_gguf(l, pr, t->gguf, sizeof t->gguf);
                t->gguf_dims = 3;
                t->ne[2] = c->n_expert;
            }
        }
    }
    if (c->shared_ffn_dim > 0) {
        int64_t sh = c->shared_ffn_dim;
        plan_layer(p, n, c, l, "ffn_gate_shexp.weight", 2, sh, c->dim, MK_WEIGHT);
        plan_layer(p, n, c, l, "ffn_up_shexp.weight", 2, sh, c->dim, MK_WEIGHT);
        plan_layer(p, n, c, l, "ffn_down_shexp.weight", 2, c->dim, sh, MK_WEIGHT);
    }
    if (c->shared_gate) { /* HF Linear(dim, 1); llama.cpp wants it 1-D */
        plan_layer(p, n, c, l, "ffn_gate_inp_shexp.weight", 2, 1, c->dim, MK_WEIGHT);
        p[*n - 1].gguf_dims = 1;
    }
}

/* Tensors of c in HF order (GGUF: stacked experts, split kv_b; no MTP layers). */
static int plan_build(const struct model_config *c, int gguf, struct mk_tensor **out, int *n)
{
    int n_all = c->n_layer + (gguf ? 0 : c->n_nextn);
    int cap = 3 + (40 + 3 * c->n_expert) * n_all;
    struct mk_tensor *p = wcalloc((size_t)cap, sizeof *p);
    if (!p)
        return WELD_ERR_NOMEM;
    int64_t q = (int64_t)c->n_head * c->head_dim, kv = (int64_t)c->n_kv_head * c->head_dim;
    int perm = gguf && c->arch == ARCH_LLAMA;
    char nm[96];
    *n = 0;
    plan_add(p, n, "model.embed_tokens.weight", 2, c->n_vocab, c->dim, MK_WEIGHT, 0);
    for (int l = 0; l < n_all; l++) {
#define L(s) (snprintf(nm, sizeof nm, "model.layers.%d.%s", l, s), nm)
        plan_add(p, n, L("input_layernorm.weight"), 1, c->dim, 0, MK_NORM, 0);
        if (c->kv_lora_rank > 0) {
            plan_mla(p, n, c, l, gguf);
        } else {
            plan_add(p, n, L("self_attn.q_proj.weight"), 2, q, c->dim, MK_WEIGHT,
                     perm ? c->n_head : 0);
            if (c->qkv_bias)
                plan_add(p, n, L("self_attn.q_proj.bias"), 1, q, 0, MK_BIAS, 0);
            plan_add(p, n, L("self_attn.k_proj.weight"), 2, kv, c->dim, MK_WEIGHT,
                     perm ? c->n_kv_head : 0);
            if (c->qkv_bias)
                plan_add(p, n, L("self_attn.k_proj.bias"), 1, kv, 0, MK_BIAS, 0);
            plan_add(p, n, L("self_attn.v_proj.weight"), 2, kv, c->dim, MK_WEIGHT, 0);
            if (c->qkv_bias)
                plan_add(p, n, L("self_attn.v_proj.bias"), 1, kv, 0, MK_BIAS, 0);
            plan_add(p, n, L("self_attn.o_proj.weight"), 2, c->dim, q, MK_WEIGHT, 0);
            if (c->qk_norm) {
                plan_add(p, n, L("self_attn.q_norm.weight"), 1, c->head_dim, 0, MK_NORM, 0);
                plan_add(p, n, L("self_attn.k_norm.weight"), 1, c->head_dim, 0, MK_NORM, 0);
            }
        }
        plan_add(p, n, L("post_attention_layernorm.weight"), 1, c->dim, 0, MK_NORM, 0);
        if (model_layer_moe(c, l)) {
            plan_moe(p, n, c, l, gguf);
        } else {
            plan_add(p, n, L("mlp.gate_proj.weight"), 2, c->ffn_dim, c->dim, MK_WEIGHT, 0);
            plan_add(p, n, L("mlp.up_proj.weight"), 2, c->ffn_dim, c->dim, MK_WEIGHT, 0);
            plan_add(p, n, L("mlp.down_proj.weight"), 2, c->dim, c->ffn_dim, MK_WEIGHT, 0);
        }
        if (l >= c->n_layer) { /* DeepSeek MTP */
            plan_add(p, n, L("enorm.weight"), 1, c->dim, 0, MK_NORM, 0);
            plan_add(p, n, L("hnorm.weight"), 1, c->dim, 0, MK_NORM, 0);
            plan_add(p, n, L("eh_proj.weight"), 2, c->dim, 2 * (int64_t)c->dim, MK_WEIGHT, 0);
            plan_add(p, n, L("shared_head.norm.weight"), 1, c->dim, 0, MK_NORM, 0);
        }
#undef L
    }
    plan_add(p, n, "model.norm.weight", 1, c->dim, 0, MK_NORM, 0);
    if (!c->tied_embeddings)
        plan_add(p, n, "lm_head.weight", 2, c->n_vocab, c->dim, MK_WEIGHT, 0);
    WELD_ASSERT(*n <= cap);
    *out = p;
    return WELD_OK;
}

/* ---- value generation ---- */

static void convert_row(const float *src, void *dst, int dtype, int64_t n)
{
    if (dtype == DT_F32) {
        memcpy(dst, src, (size_t)n * sizeof(float));
    } else if (dtype == DT_F16) {
        uint16_t *d = dst;
        for (int64_t i = 0; i < n; i++)
            d[i] = fp16_from_f32(src[i]);
    } else if (dtype == DT_BF16) {
        uint16_t *d = dst;
        for (int64_t i = 0; i < n; i++)
            d[i] = bf16_from_f32(src[i]);
    } else {
        dtype_quantize_row(dtype, src, dst, n);
    }
}

static void draw_row(struct rng *r, enum mk_kind kind, float *row, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        row[i] = kind == MK_NORM ? 1.0f : (float)(MK_STD * rng_normal(r));
}

/* GGUF attn_k_b / attn_v_b: draw kv_b_proj (HF rows), split, encode GGUF rows. */
static int mk_fill_kv_b(const struct mk_fill *f, uint8_t *out, size_t size, struct weld_err *e)
{
    const struct mk_tensor *t = f->t;
    const struct model_config *c = f->c;
    size_t n = (size_t)t->shape[0] * (size_t)t->shape[1];
    size_t nk = (size_t)c->n_head * (size_t)c->kv_lora_rank * (size_t)c->qk_nope_dim;
    float *kv = wmalloc(n * sizeof *kv), *k = wmalloc(nk * sizeof *k);
    float *v = wmalloc((n - nk + 1) * sizeof *v);
    if (!kv || !k || !v) {
        wfree(kv), wfree(k), wfree(v);
        return err_set(e, WELD_ERR_NOMEM, "mkmodel: out of memory for '%s'", t->gguf);
    }
    struct rng r;
    rng_seed(&r, mkmodel_tensor_seed(f->seed, t->hf));
    draw_row(&r, t->kind, kv, (int64_t)n);
    kv_b_split(kv, k, v, c->n_head, c->qk_nope_dim, c->v_head_dim, c->kv_lora_rank, sizeof(float));
    const float *src = t->kv_b_part == 1 ? k : v;
    int64_t cols = t->ne[0], rows = t->ne[1] * t->ne[2];
    size_t row_bytes = dtype_row_bytes(f->dtype, cols);
    int rc = WELD_OK;
    if ((size_t)rows * row_bytes != size)
        rc = err_set(e, WELD_ERR_INTERNAL, "mkmodel: tensor '%s': %zu bytes asked", t->gguf, size);
    for (int64_t i = 0; rc == WELD_OK && i < rows; i++)
        convert_row(src + i * cols, out + (size_t)i * row_bytes, f->dtype, cols);
    wfree(kv), wfree(k), wfree(v);
    return rc;
}

/* GGUF ffn_*_exps: each expert drawn from its own HF name's stream, one after another. */
static int mk_fill_stacked(const struct mk_fill *f, uint8_t *out, size_t size, struct weld_err *e)
{
    const struct mk_tensor *t = f->t;
    int64_t rows = t->shape[0], cols = t->shape[1];
    size_t row_bytes = dtype_row_bytes(f->dtype, cols);
    if ((size_t)rows * row_bytes * (size_t)f->c->n_expert != size)
        return err_set(e, WELD_ERR_INTERNAL, "mkmodel: tensor '%s': %zu bytes asked", t->gguf,
                       size);
    float *row = wmalloc((size_t)cols * sizeof *row);
    if (!row)
        return err_set(e, WELD_ERR_NOMEM, "mkmodel: out of memory for '%s'", t->gguf);
    for (int x = 0; x < f->c->n_expert; x++) {
        char hf[96];
        tensor_name_expert_hf(t->stack_layer, x, t->stack_proj, mk_style(f->c), hf, sizeof hf);
        struct rng r;
        rng_seed(&r, mkmodel_tensor_seed(f->seed, hf));
        for (int64_t i = 0; i < rows; i++) {
            draw_row(&r, t->kind, row, cols);
            convert_row(row, out, f->dtype, cols);
            out += row_bytes;
        }
    }
    wfree(row);
    return WELD_OK;
}

static int mk_fill_fn(void *ctx, void *dst, size_t size, struct weld_err *e)
{
    const struct mk_fill *f = ctx;
    const struct mk_tensor *t = f->t;
    if (f->gguf && t->kv_b_part)
        return mk_fill_kv_b(f, dst, size, e);
    if (f->gguf && t->stack_layer >= 0)
        return mk_fill_stacked(f, dst, size, e);
    int64_t rows = t->n_dims == 2 ? t->shape[0] : 1;
    int64_t cols = t->n_dims == 2 ? t->shape[1] : t->shape[0];
    size_t row_bytes = dtype_row_bytes(f->dtype, cols);
    if (row_bytes == 0 || (size_t)rows * row_bytes != size)
        return err_set(e, WELD_ERR_INTERNAL, "mkmodel: tensor '%s': %zu bytes asked, %zu "
                       "expected", t->hf, size, (size_t)rows * row_bytes);
    struct rng r;
    rng_seed(&r, mkmodel_tensor_seed(f->seed, t->hf));
    uint8_t *out = dst;
    if (t->permute_heads) {
        size_t n = (size_t)rows * (size_t)cols;
        float *a = wmalloc(n * sizeof *a), *b = wmalloc(n * sizeof *b);
        if (!a || !b) {
            wfree(a);
            wfree(b);
            return err_set(e, WELD_ERR_NOMEM, "mkmodel: out of memory for '%s'", t->hf);
        }
        draw_row(&r, t->kind, a, (int64_t)n);
        rope_permute_rows(a, b, t->permute_heads, (int)(rows / t->permute_heads),
                          (size_t)cols * sizeof(float), 1);
        for (int64_t i = 0; i < rows; i++)
            convert_row(b + i * cols, out + (size_t)i * row_bytes, f->dtype, cols);
        wfree(a);
        wfree(b);
        return WELD_OK;
    }
    float *row = wmalloc((size_t)cols * sizeof *row);
    if (!row)
        return err_set(e, WELD_ERR_NOMEM, "mkmodel: out of memory for '%s'", t->hf);
    for (int64_t i = 0; i < rows; i++) {
        draw_row(&r, t->kind, row, cols);
        convert_row(row, out + (size_t)i * row_bytes, f->dtype, cols);
    }
    wfree(row);
    return WELD_OK;
}

/* ---- GGUF output ---- */

/* llama.cpp's general.file_type (enum llama_ftype) for an all-`dtype` model. */
static uint32_t file_type_of(int dtype)
{
    switch (dtype) {
    case DT_F32: return 0;
    case DT_F16: return 1;
    case DT_Q4_0: return 2;
    case DT_Q4_1: return 3;
    case DT_Q8_0: return 7;
    case DT_Q5_0: return 8;
    case DT_Q5_1: return 9;
    case DT_Q4_K: return 14;
    case DT_Q5_K: return 16;
    case DT_Q6_K: return 18;
    case DT_BF16: return 32;
    default: return 0;
    }
}

static int gguf_tensor_type(const struct mk_tensor *t, int dtype)
{
    if (t->gguf_dims == 1)
        return DT_F32;
    const struct dtype_info *di = dtype_get(dtype);
    if (di && di->quantized && strstr(t->gguf, ".ffn_gate_inp.")) /* as llama.cpp keeps it */
        return DT_F32;
    if (di && di->quantized && t->ne[0] % di->block_size != 0)
        return DT_F16;
    return dtype;
}

static int gguf_meta(struct gguf_writer *w, const struct model_config *c, int dtype,
                     const struct tokmeta *tm, struct weld_err *e)
{
    int rc = model_config_to_gguf(c, w, e);
    if (rc)
        return rc;
    const struct dtype_info *di = dtype_get(dtype);
    if (gguf_writer_set_u32(w, "general.file_type", file_type_of(dtype)) ||
        (di && di->quantized && gguf_writer_set_u32(w, "general.quantization_version", 2)))
        return err_set(e, WELD_ERR_NOMEM, "gguf writer: out of memory");
    return tm ? tokmeta_to_gguf(tm, w, e) : WELD_OK;
}

static int write_gguf(const struct model_config *c, const struct mkmodel_opts *o,
                      const struct tokmeta *tm, struct weld_err *e)
{
    struct mk_tensor *plan = NULL;
    struct mk_fill *fills = NULL;
    float *freqs = NULL;
    int n = 0, rc;
    struct gguf_writer *w = gguf_writer_create();
    if (!w || plan_build(c, 1, &plan, &n)) {
        rc = err_set(e, WELD_ERR_NOMEM, "mkmodel: out of memory");
        goto out;
    }
    if ((rc = gguf_meta(w, c, o->dtype, tm, e)))
        goto out;
    fills = wcalloc((size_t)n, sizeof *fills);
    if (!fills) {
        rc = err_set(e, WELD_ERR_NOMEM, "mkmodel: out of memory");
        goto out;
    }
    if (c->rope_scaling == ROPE_SCALING_LLAMA3) {
        freqs = wcalloc((size_t)c->rope_dim / 2 + 1, sizeof *freqs);
        int64_t ne[1] = {c->rope_dim / 2};
        if (!freqs) {
            rc = err_set(e, WELD_ERR_NOMEM, "mkmodel: out of memory");
            goto out;
        }
        model_config_llama3_freq_factors(c, freqs);
        if ((rc = gguf_writer_add_tensor(w, "rope_freqs.weight", DT_F32, 1, ne, freqs))) {
            rc = err_set(e, rc, "mkmodel: adding rope_freqs.weight failed");
            goto out;
        }
    }
    for (int i = 0; i < n; i++) {
        struct mk_tensor *t = &plan[i];
        fills[i] = (struct mk_fill){t, c, o->seed, gguf_tensor_type(t, o->dtype), 1};
        if ((rc = gguf_writer_add_tensor_fn(w, t->gguf, fills[i].dtype, t->gguf_dims, t->ne,
                                            mk_fill_fn, &fills[i]))) {
            rc = err_set(e, rc, "mkmodel: adding tensor '%s' failed", t->gguf);
            goto out;
        }
    }
    rc = gguf_writer_write(w, o->out, e);
out:
    gguf_writer_free(w);
    wfree(plan);
    wfree(fills);
    wfree(freqs);
    return rc;
}

/* ---- HF output ---- */

static const char *torch_dtype_name(int dtype)
{
    return dtype == DT_F16 ? "float16" : dtype == DT_BF16 ? "bfloat16" : "float32";
}

static int copy_file(const char *src, const char *dst, struct weld_err *e)
{
    char *buf = NULL;
    size_t len = 0;
    int rc = file_read_all(src, &buf, &len, e);
    if (!rc)
        rc = file_write_all(dst, buf, len, e);
    wfree(buf);
    return rc;
}

/* tokenizer.json, tokenizer_config.json (and chat_template.jinja) into dir. */
static int copy_tokenizer(const char *tok, const char *dir, struct weld_err *e)
{
    char src_dir[4096], src[4200], dst[4200];
    size_t n = strlen(tok);
    int is_file = n >= 5 && !strcmp(tok + n - 5, ".json");
    snprintf(src_dir, sizeof src_dir, "%s", tok);
    if (is_file) {
        char *slash = strrchr(src_dir, '/');
        if (slash)
            *slash = 0;
        else
            snprintf(src_dir, sizeof src_dir, ".");
        snprintf(src, sizeof src, "%s", tok);
    } else {
        snprintf(src, sizeof src, "%s/tokenizer.json", src_dir);
    }
    snprintf(dst, sizeof dst, "%s/tokenizer.json", dir);
    int rc = copy_file(src, dst, e);
    static const char *extra[2] = {"tokenizer_config.json", "chat_template.jinja"};
    for (int i = 0; !rc && i < 2; i++) {
        snprintf(src, sizeof src, "%s/%s", src_dir, extra[i]);
        snprintf(dst, sizeof dst, "%s/%s", dir, extra[i]);
        if (access(src, R_OK) == 0)
            rc = copy_file(src, dst, e);
    }
    return rc;
}

/* config.json (with bos/eos ids) and generation_config.json. */
int mkmodel_write_hf_json(const struct model_config *c, const char *torch_dtype,
                          const struct tokmeta *tm, const char *dir, struct weld_err *e)
{
    char path[4200];
    json_t *cfg = model_config_to_hf_json(c, torch_dtype);
    json_t *gen = json_object();
    if (!cfg || !gen) {
        json_decref(cfg);
        json_decref(gen);
        return err_set(e, WELD_ERR_NOMEM, "%s: building config.json failed", dir);
    }
    if (tm && tm->bos >= 0) {
        json_object_set_new(cfg, "bos_token_id", json_integer(tm->bos));
        json_object_set_new(gen, "bos_token_id", json_integer(tm->bos));
    }
    if (tm && tm->eos >= 0) {
        json_object_set_new(cfg, "eos_token_id", json_integer(tm->eos));
        json_object_set_new(gen, "eos_token_id", json_integer(tm->eos));
    }
    json_object_set_new(gen, "_from_model_config", json_true());
    snprintf(path, sizeof path, "%s/config.json", dir);
    int rc = jsave_file(cfg, path, e);
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    if (!rc)
        rc = jsave_file(gen, path, e);
    json_decref(cfg);
    json_decref(gen);
    return rc;
}

int mkmodel_make_dir(const char *dir, struct weld_err *e)
{
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return err_set(e, WELD_ERR_IO, "%s: cannot create directory: %s", dir, strerror(errno));
    return WELD_OK;
}

static int write_hf(const struct model_config *c, const struct mkmodel_opts *o,
                    const struct tokmeta *tm, struct weld_err *e)
{
    struct mk_tensor *plan = NULL;
    struct mk_fill *fills = NULL;
    int n = 0, rc;
    struct st_writer *w = st_writer_create();
    if (!w || plan_build(c, 0, &plan, &n) ||
        !(fills = wcalloc((size_t)n, sizeof *fills))) {
        rc = err_set(e, WELD_ERR_NOMEM, "mkmodel: out of memory");
        goto out;
    }
    if ((rc = mkmodel_make_dir(o->out, e)))
        goto out;
    for (int i = 0; i < n; i++) {
        fills[i] = (struct mk_fill){&plan[i], c, o->seed, o->dtype, 0};
        if ((rc = st_writer_add_fn(w, plan[i].hf, o->dtype, plan[i].n_dims, plan[i].shape,
                                   mk_fill_fn, &fills[i]))) {
            rc = err_set(e, rc, "mkmodel: adding tensor '%s' failed", plan[i].hf);
            goto out;
        }
    }
    st_writer_set_metadata(w, "format", "pt");
    if ((rc = st_writer_write_dir(w, o->out, 0, e)) ||
        (rc = mkmodel_write_hf_json(c, torch_dtype_name(o->dtype), tm, o->out, e)))
        goto out;
    if (o->tokenizer)
        rc = copy_tokenizer(o->tokenizer, o->out, e);
out:
    st_writer_free(w);
    wfree(plan);
    wfree(fills);
    return rc;
}

int mkmodel_write(const struct model_config *cfg, const struct mkmodel_opts *o,
                  struct weld_err *e)
{
    struct model_config c = *cfg;
    struct tokmeta *tm = NULL;
    int gguf = mkmodel_is_gguf_path(o->out);
    int rc;
    const struct dtype_info *di = dtype_get(o->dtype);
    if (!di || !di->can_quantize)
        return err_set(e, WELD_ERR_INVALID_ARG, "mkmodel: dtype '%s' is not one of f32, f16, "
                       "bf16, q4_0, q4_1, q5_0, q5_1, q8_0, q4_K, q5_K, q6_K",
                       dtype_name(o->dtype));
    if (!gguf && di->quantized)
        return err_set(e, WELD_ERR_INVALID_ARG, "mkmodel: %s: Hugging Face directories hold "
                       "f32, f16 or bf16 weights; use one of those, or write a .gguf file for "
                       "%s", o->out, di->name);
    if (o->tokenizer) {
        if ((rc = tokmeta_from_hf(&tm, o->tokenizer, NULL, c.n_vocab, e)))
            return err_prefix(e, "mkmodel: tokenizer");
        if (tm->n_tokens > c.n_vocab)
            c.n_vocab = (int)tm->n_tokens;
    }
    if ((rc = model_config_validate(&c, "mkmodel", e)))
        goto out;
    rc = gguf ? write_gguf(&c, o, tm, e) : write_hf(&c, o, tm, e);
out:
    tokmeta_free(tm);
    return rc;
}

/*
 * weights (exec) - model checks and f32 copies of small vectors (see weights.h).
 *
 * Two passes over the layer tensors: the first checks and counts the floats the vectors
 * need, the second (after one allocation) converts them. Tensor names in messages are
 * built from the GGUF naming scheme so hand-built models (name == NULL) still get useful
 * errors.
 *
 * Matrices (struct exec_mat) are set up after the checks: each gets its gemm type (or the
 * kern_row_dot fallback), then the pool is sized (repacked form or a plain copy per gemm
 * matrix, each 64-byte aligned), mapped once (wmap_huge) and filled, with a progress bar
 * when that takes over a second (this is where the file is first read; scalar repacking:
 * ~1 s per GB); the source pages of every pooled matrix are then dropped from the
 * resident set (model_release_pages), so resident memory stays at about one copy of the
 * weights. A pool already filled for the same model and plan (struct weight_pool, a
 * registry of live pools under a mutex) is referenced instead: same offsets, same types,
 * nothing read or repacked again. Filling is single-threaded and eager; doing it lazily
 * per matrix or on the thread team would be the next step for large models.
 */
#include "exec/weights.h"

#include "core/alloc.h"
#include "core/mfile.h"
#include "core/progress.h"
#include "exec/logits_top.h"
#include "kernels/cpu/kernels.h"

#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

static const char *model_where(const struct model *m) { return m->path ? m->path : "model"; }

static int check_config(const struct model *m, struct weld_err *e)
{
    const struct model_config *c = &m->cfg;
    const char *w = model_where(m);
    if (c->n_vocab < 1 || c->dim < 1 || c->n_layer < 1 || c->n_head < 1 || c->n_kv_head < 1 ||
        c->head_dim < 1 || c->ffn_dim < 1)
        return err_set(e, WELD_ERR_FORMAT, "%s: config: n_vocab %d, dim %d, n_layer %d, "
                       "n_head %d, n_kv_head %d, head_dim %d, ffn_dim %d must all be >= 1", w,
                       c->n_vocab, c->dim, c->n_layer, c->n_head, c->n_kv_head, c->head_dim,
                       c->ffn_dim);
    if (c->n_head % c->n_kv_head)
        return err_set(e, WELD_ERR_FORMAT, "%s: config: n_head %d is not a multiple of "
                       "n_kv_head %d", w, c->n_head, c->n_kv_head);
    if (c->rope_dim < 2 || c->rope_dim % 2 || c->rope_dim > c->head_dim)
        return err_set(e, WELD_ERR_FORMAT, "%s: config: rope_dim %d must be even and in "
                       "[2, head_dim %d]", w, c->rope_dim, c->head_dim);
    if (!(c->norm_eps >= 0) || !(c->rope_theta > 0))
        return err_set(e, WELD_ERR_FORMAT, "%s: config: norm_eps %g / rope_theta %g out of "
                       "range", w, c->norm_eps, c->rope_theta);
    if (c->rope_scaling == ROPE_SCALING_LINEAR && !(c->rope_factor > 0))
        return err_set(e, WELD_ERR_FORMAT, "%s: config: linear rope factor %g must be > 0", w,
                       c->rope_factor);
    if ((long long)c->n_head * c->head_dim > INT_MAX / 4 || c->n_layer > INT16_MAX)
        return err_set(e, WELD_ERR_LIMIT, "%s: config: model too large", w);
    if (c->kv_lora_rank > 0 &&
        (c->kv_lora_rank > 65536 || c->q_lora_rank < 0 || c->q_lora_rank > 65536 ||
         c->qk_nope_dim < 1 || c->v_head_dim < 1 || c->head_dim != c->qk_nope_dim + c->rope_dim))
        return err_set(e, WELD_ERR_FORMAT,
                       "%s: config: latent attention with kv_lora_rank %d, "
                       "q_lora_rank %d, qk_nope_dim %d + rope_dim %d (head_dim %d), v_head_dim "
                       "%d does not add up",
                       w, c->kv_lora_rank, c->q_lora_rank, c->qk_nope_dim, c->rope_dim, c->head_dim,
                       c->v_head_dim);
    if (c->rope_scaling == ROPE_SCALING_YARN &&
        (c->kv_lora_rank <= 0 || !(c->rope_factor >= 1.0f) || c->rope_orig_ctx < 1 ||
         !(c->yarn_beta_fast > c->yarn_beta_slow) || !(c->yarn_beta_slow > 0.0f) ||
         !(c->yarn_log_mul >= 0.0f)))
        return err_set(e, WELD_ERR_UNSUPPORTED,
                       "%s: YaRN rope scaling (factor %g, original "
                       "context %d, beta %g / %g) is supported for latent-attention models "
                       "with factor >= 1 and beta_fast > beta_slow > 0",
                       w, (double)c->rope_factor, c->rope_orig_ctx, (double)c->yarn_beta_fast,
                       (double)c->yarn_beta_slow);
    if (c->n_expert > 0) {
        if (c->n_expert > EXEC_MAX_EXPERTS || c->n_expert_used < 1 ||
            c->n_expert_used > c->n_expert || c->moe_ffn_dim < 1 || c->shared_ffn_dim < 0 ||
            c->n_dense_lead < 0 || c->n_dense_lead > c->n_layer ||
            (c->n_group > 1 &&
             (c->n_expert % c->n_group || c->topk_group < 1 || c->topk_group > c->n_group ||
              c->n_expert_used > c->topk_group * (c->n_expert / c->n_group))) ||
            !(c->gating == MOE_GATING_SOFTMAX || c->gating == MOE_GATING_SIGMOID) ||
            !(c->expert_scale > 0.0f))
            return err_set(e, WELD_ERR_FORMAT,
                           "%s: config: experts %d (at most %d), used %d, "
                           "expert ffn %d, shared ffn %d, dense layers %d, groups %d (use %d), "
                           "gating %d, scale %g do not make a mixture of experts",
                           w, c->n_expert, EXEC_MAX_EXPERTS, c->n_expert_used, c->moe_ffn_dim,
                           c->shared_ffn_dim, c->n_dense_lead, c->n_group, c->topk_group,
                           (int)c->gating, (double)c->expert_scale);
    }
    return WELD_OK;
}

static int check_tensor3(const struct model *m, const struct tensor *t, const char *name,
                         int64_t ne0, int64_t ne1, int64_t ne2, struct weld_err *e);

static int check_tensor(const struct model *m, const struct tensor *t, const char *name,
                        int64_t ne0, int64_t ne1, struct weld_err *e)
{
    return check_tensor3(m, t, name, ne0, ne1, 1, e);
}

/* Present, a type the kernels read, shape {ne0, ne1, ne2}, whole blocks, enough bytes. */
static int check_tensor3(const struct model *m, const struct tensor *t, const char *name,
                         int64_t ne0, int64_t ne1, int64_t ne2, struct weld_err *e)
{
    const char *w = model_where(m);
    if (!t->data)
        return err_set(e, WELD_ERR_FORMAT, "%s: tensor '%s' is missing", w, name);
    if (!kern_type_supported(t->type))
        return err_set(e, WELD_ERR_UNSUPPORTED, "%s: tensor '%s': type %s (%d) cannot be "
                       "computed with", w, name, dtype_name(t->type), (int)t->type);
    if (t->ne[0] != ne0 || t->ne[1] != ne1 || t->ne[2] != ne2 || t->ne[3] != 1)
        return err_set(e, WELD_ERR_FORMAT,
                       "%s: tensor '%s': shape {%lld, %lld, %lld, %lld}, "
                       "expected {%lld, %lld, %lld}",
                       w, name, (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2],
                       (long long)t->ne[3], (long long)ne0, (long long)ne1, (long long)ne2);
    ne1 *= ne2;
    size_t rb = dtype_row_bytes(t->type, ne0);
    if (rb == 0)
        return err_set(e, WELD_ERR_FORMAT, "%s: tensor '%s': row of %lld elements is not a "
                       "whole number of %s blocks", w, name, (long long)ne0,
                       dtype_name(t->type));
    if ((uint64_t)ne1 > SIZE_MAX / rb || t->nbytes < rb * (size_t)ne1)
        return err_set(e, WELD_ERR_FORMAT, "%s: tensor '%s': %zu bytes, %lld rows of %zu "
                       "bytes need more", w, name, t->nbytes, (long long)ne1, rb);
    return WELD_OK;
}

/* A vector tensor: optional ones may be absent (data == NULL); counts floats needed. */
static int check_vec(const struct model *m, const struct tensor *t, const char *name,
                     int64_t n, bool required, size_t *n_floats, struct weld_err *e)
{
    if (!t->data && !required)
        return WELD_OK;
    int rc = check_tensor(m, t, name, n, 1, e);
    if (rc)
        return rc;
    *n_floats += (size_t)n;
    return WELD_OK;
}

static float *take_vec(const struct tensor *t, int64_t n, float **cursor)
{
    if (!t->data)
        return NULL;
    float *v = *cursor;
    kern_to_f32(t->type, t->data, v, n);
    *cursor += n;
    return v;
}

/* A MoE layer's router, experts (each named by its expert: the GGUF slice or the HF
   tensor), shared expert and vectors. */
static int check_moe(const struct model *m, int l, size_t *nf, struct weld_err *e)
{
    const struct model_config *c = &m->cfg;
    const struct layer_weights *L = &m->layers[l];
    const int64_t ef = c->moe_ffn_dim, sf = c->shared_ffn_dim;
    char nm[96];
    int rc;
#define NAME(s) (snprintf(nm, sizeof nm, "blk.%d." s, l), nm)
#define NAME_E(s, x) (snprintf(nm, sizeof nm, "blk.%d." s " (expert %d)", l, x), nm)
    if ((rc = check_tensor(m, &L->router, NAME("ffn_gate_inp.weight"), c->dim, c->n_expert, e)) ||
        (rc = check_vec(m, &L->exp_bias, NAME("exp_probs_b.bias"), c->n_expert, c->expert_bias, nf,
                        e)) ||
        (rc = check_vec(m, &L->sh_gate_inp, NAME("ffn_gate_inp_shexp.weight"), c->dim,
                        c->shared_gate, nf, e)))
        return rc;
    if (!L->exp_gate || !L->exp_up || !L->exp_down)
        return err_set(e, WELD_ERR_FORMAT,
                       "%s: tensor 'blk.%d.ffn_gate_exps.weight' is "
                       "missing",
                       model_where(m), l);
    for (int x = 0; x < c->n_expert; x++)
        if ((rc = check_tensor(m, &L->exp_gate[x], NAME_E("ffn_gate_exps.weight", x), c->dim, ef,
                               e)) ||
            (rc = check_tensor(m, &L->exp_up[x], NAME_E("ffn_up_exps.weight", x), c->dim, ef, e)) ||
            (rc = check_tensor(m, &L->exp_down[x], NAME_E("ffn_down_exps.weight", x), ef, c->dim,
                               e)))
            return rc;
    if (sf > 0 &&
        ((rc = check_tensor(m, &L->sh_gate, NAME("ffn_gate_shexp.weight"), c->dim, sf, e)) ||
         (rc = check_tensor(m, &L->sh_up, NAME("ffn_up_shexp.weight"), c->dim, sf, e)) ||
         (rc = check_tensor(m, &L->sh_down, NAME("ffn_down_shexp.weight"), sf, c->dim, e))))
        return rc;
#undef NAME
#undef NAME_E
    return WELD_OK;
}

/* A latent-attention layer's projections and norms (model/config.h). */
static int check_mla(const struct model *m, int l, size_t *nf, struct weld_err *e)
{
    const struct model_config *c = &m->cfg;
    const struct layer_weights *L = &m->layers[l];
    const int64_t qd = (int64_t)c->n_head * c->head_dim, ql = c->q_lora_rank;
    const int64_t kvl = c->kv_lora_rank;
    char nm[96];
    int rc;
#define NAME(s) (snprintf(nm, sizeof nm, "blk.%d." s, l), nm)
    if (ql > 0) {
        if ((rc = check_tensor(m, &L->wq_a, NAME("attn_q_a.weight"), c->dim, ql, e)) ||
            (rc = check_vec(m, &L->q_a_norm, NAME("attn_q_a_norm.weight"), ql, true, nf, e)) ||
            (rc = check_tensor(m, &L->wq_b, NAME("attn_q_b.weight"), ql, qd, e)))
            return rc;
    } else if ((rc = check_tensor(m, &L->wq, NAME("attn_q.weight"), c->dim, qd, e))) {
        return rc;
    }
    if ((rc = check_tensor(m, &L->wkv_a, NAME("attn_kv_a_mqa.weight"), c->dim, kvl + c->rope_dim,
                           e)) ||
        (rc = check_vec(m, &L->kv_a_norm, NAME("attn_kv_a_norm.weight"), kvl, true, nf, e)) ||
        (L->wkv_b.data
             ? (rc = check_tensor(m, &L->wkv_b, NAME("attn_kv_b.weight"), kvl,
                                  (int64_t)c->n_head * (c->qk_nope_dim + c->v_head_dim), e))
             : ((rc = check_tensor3(m, &L->wk_b, NAME("attn_k_b.weight"), c->qk_nope_dim, kvl,
                                    c->n_head, e)) ||
                (rc = check_tensor3(m, &L->wv_b, NAME("attn_v_b.weight"), kvl, c->v_head_dim,
                                    c->n_head, e)))) ||
        (rc = check_tensor(m, &L->wo, NAME("attn_output.weight"),
                           (int64_t)c->n_head * c->v_head_dim, c->dim, e)))
        return rc;
#undef NAME
    return WELD_OK;
}

static int check_layer(const struct model *m, int l, size_t *nf, struct weld_err *e)
{
    const struct model_config *c = &m->cfg;
    const struct layer_weights *L = &m->layers[l];
    int64_t qd = (int64_t)c->n_head * c->head_dim, kd = (int64_t)c->n_kv_head * c->head_dim;
    char nm[96];
    int rc;
#define NAME(s) (snprintf(nm, sizeof nm, "blk.%d." s, l), nm)
    if ((rc = check_vec(m, &L->attn_norm, NAME("attn_norm.weight"), c->dim, true, nf, e)) ||
        (rc = check_vec(m, &L->ffn_norm, NAME("ffn_norm.weight"), c->dim, true, nf, e)))
        return rc;
    if (c->kv_lora_rank > 0)
        rc = check_mla(m, l, nf, e);
    else if ((rc = check_tensor(m, &L->wq, NAME("attn_q.weight"), c->dim, qd, e)) ||
             (rc = check_tensor(m, &L->wk, NAME("attn_k.weight"), c->dim, kd, e)) ||
             (rc = check_tensor(m, &L->wv, NAME("attn_v.weight"), c->dim, kd, e)) ||
             (rc = check_vec(m, &L->bq, NAME("attn_q.bias"), qd, c->qkv_bias, nf, e)) ||
             (rc = check_vec(m, &L->bk, NAME("attn_k.bias"), kd, c->qkv_bias, nf, e)) ||
             (rc = check_vec(m, &L->bv, NAME("attn_v.bias"), kd, c->qkv_bias, nf, e)) ||
             (rc = check_vec(m, &L->q_norm, NAME("attn_q_norm.weight"), c->head_dim, c->qk_norm, nf,
                             e)) ||
             (rc = check_vec(m, &L->k_norm, NAME("attn_k_norm.weight"), c->head_dim, c->qk_norm, nf,
                             e)) ||
             (rc = check_tensor(m, &L->wo, NAME("attn_output.weight"), qd, c->dim, e)))
        return rc;
    if (rc)
        return rc;
    if (model_layer_moe(c, l))
        return check_moe(m, l, nf, e);
    if ((rc = check_tensor(m, &L->w_gate, NAME("ffn_gate.weight"), c->dim, c->ffn_dim, e)) ||
        (rc = check_tensor(m, &L->w_up, NAME("ffn_up.weight"), c->dim, c->ffn_dim, e)) ||
        (rc = check_tensor(m, &L->w_down, NAME("ffn_down.weight"), c->ffn_dim, c->dim, e)))
        return rc;
#undef NAME
    return WELD_OK;
}

static int check_model(const struct model *m, size_t *nf, struct weld_err *e)
{
    int rc = check_config(m, e);
    if (rc)
        return rc;
    const struct model_config *c = &m->cfg;
    if (!m->layers)
        return err_set(e, WELD_ERR_FORMAT, "%s: no layers", model_where(m));
    if ((rc = check_tensor(m, &m->tok_embd, "token_embd.weight", c->dim, c->n_vocab, e)) ||
        (rc = check_tensor(m, &m->output, "output.weight", c->dim, c->n_vocab, e)) ||
        (rc = check_vec(m, &m->output_norm, "output_norm.weight", c->dim, true, nf, e)))
        return rc;
    for (int l = 0; l < c->n_layer; l++)
        if ((rc = check_layer(m, l, nf, e)))
            return rc;
    return WELD_OK;
}

/* ---- matrices ------------------------------------------------------------------------ */

/* The list of every matrix (exec_weights.list): per layer wq, wk, wv, wo, then the dense
   FFN's gate, up, down or the MoE layer's router, each expert's gate, up, down and the
   shared expert's gate, up, down; then the output. Its order is the pool's. */
static int list_add(struct exec_weights *w, int *n, struct exec_mat *x, const struct tensor *t,
                    bool aligned)
{
    if (w->list)
        w->list[*n] = (struct exec_mat_ref){x, t, aligned, 0, t->ne[1], 0, t->ne[0]};
    return ++*n;
}

/* The same for a shard: rows [r0, r1) and columns [k0, k1) of t (exec_weights.tp_size
   > 1). */
static int list_add_shard(struct exec_weights *w, int *n, struct exec_mat *x,
                          const struct tensor *t, bool aligned, int64_t r0, int64_t r1, int64_t k0,
                          int64_t k1)
{
    if (w->list)
        w->list[*n] = (struct exec_mat_ref){x, t, aligned, r0, r1, k0, k1};
    return ++*n;
}

/* A tensor-parallel shard's matrices (exec_weights_create_shard): the part's heads, ffn
   rows and vocabulary rows; wo and down in columns. */
static int list_fill_shard(struct exec_weights *w)
{
    const struct model *m = w->m;
    const struct model_config *c = &m->cfg;
    const int r = w->tp_rank, hd = c->head_dim, grp = c->n_head / c->n_kv_head;
    const int64_t q0 = (int64_t)w->kp.head_cut[r] * hd, q1 = (int64_t)w->kp.head_cut[r + 1] * hd;
    const int64_t f0 = w->kp.ffn_cut[r], f1 = w->kp.ffn_cut[r + 1];
    const bool hd16 = hd % 16 == 0;
    /* expert parallelism: this rank's routed experts, whole */
    const int e0 = c->n_expert * r / w->tp_size, e1 = c->n_expert * (r + 1) / w->tp_size;
    struct exec_mat *em = w->expert_mats;
    int n = 0;
    for (int l = w->part.layer0; l < w->part.layer1; l++) {
        const struct layer_weights *L = &m->layers[l];
        struct exec_layer_mats *M = &w->mats[l];
        list_add_shard(w, &n, &M->wq, &L->wq, hd16, q0, q1, 0, c->dim);
        list_add_shard(w, &n, &M->wk, &L->wk, hd16, q0 / grp, q1 / grp, 0, c->dim);
        list_add_shard(w, &n, &M->wv, &L->wv, hd16, q0 / grp, q1 / grp, 0, c->dim);
        list_add_shard(w, &n, &M->wo_part[r], &L->wo, true, 0, c->dim, q0, q1);
        if (model_layer_moe(c, l)) { /* router and shared expert whole, on every rank */
            list_add(w, &n, &M->router, &L->router, true);
            if (em) {
                M->egate = em, M->eup = em + c->n_expert, M->edown = em + 2 * c->n_expert;
                em += 3 * c->n_expert;
            }
            for (int x = e0; x < e1; x++) {
                list_add(w, &n, M->egate ? &M->egate[x] : NULL, &L->exp_gate[x], true);
                list_add(w, &n, M->eup ? &M->eup[x] : NULL, &L->exp_up[x], true);
                list_add(w, &n, M->edown ? &M->edown[x] : NULL, &L->exp_down[x], true);
            }
            if (c->shared_ffn_dim > 0) {
                list_add(w, &n, &M->sh_gate, &L->sh_gate, true);
                list_add(w, &n, &M->sh_up, &L->sh_up, true);
                list_add(w, &n, &M->sh_down, &L->sh_down, true);
            }
            continue;
        }
        list_add_shard(w, &n, &M->gate, &L->w_gate, true, f0, f1, 0, c->dim);
        list_add_shard(w, &n, &M->up, &L->w_up, true, f0, f1, 0, c->dim);
        list_add_shard(w, &n, &M->down_part[r], &L->w_down, true, 0, c->dim, f0, f1);
    }
    if (w->part.last)
        list_add_shard(w, &n, &w->output, &m->output, true, w->vocab0, w->vocab1, 0, c->dim);
    return n;
}

static int list_fill(struct exec_weights *w)
{
    const struct model *m = w->m;
    const struct model_config *c = &m->cfg;
    const bool kp = w->kp.n > 1;
    int n = 0;
    struct exec_mat *em = w->expert_mats;
    /* a pipeline stage's layers (experts and latent layers only ever run whole) */
    for (int l = w->part.layer0; l < w->part.layer1; l++) {
        const struct layer_weights *L = &m->layers[l];
        struct exec_layer_mats *M = &w->mats[l];
        const bool hd16 = c->head_dim % 16 == 0; /* Q/K/V products start on heads */
        if (c->kv_lora_rank > 0) {
            if (c->q_lora_rank > 0) {
                list_add(w, &n, &M->wq_a, &L->wq_a, true);
                list_add(w, &n, &M->wq_b, &L->wq_b, hd16);
            } else {
                list_add(w, &n, &M->wq, &L->wq, hd16);
            }
            list_add(w, &n, &M->wkv_a, &L->wkv_a, true);
            if (L->wkv_b.data) { /* value rows of head h start at h * (nope + v) + nope */
                list_add(w, &n, &M->vb, &L->wkv_b,
                         c->qk_nope_dim % 16 == 0 && c->v_head_dim % 16 == 0);
                M->vb_stride = c->qk_nope_dim + c->v_head_dim, M->vb_off = c->qk_nope_dim;
            } else { /* the file's per-head matrices, as 2-d views */
                list_add(w, &n, &M->kbt, &w->mla_views[2 * l], c->kv_lora_rank % 16 == 0);
                list_add(w, &n, &M->vb, &w->mla_views[2 * l + 1], c->v_head_dim % 16 == 0);
                M->vb_stride = c->v_head_dim, M->vb_off = 0;
            }
        } else {
            list_add(w, &n, &M->wq, &L->wq, hd16);
            list_add(w, &n, &M->wk, &L->wk, hd16);
            list_add(w, &n, &M->wv, &L->wv, hd16);
        }
        for (int i = 0; i < w->kp.n && kp; i++) /* K parts: each part's columns */
            list_add_shard(w, &n, &M->wo_part[i], &L->wo, true, 0, c->dim,
                           (int64_t)w->kp.head_cut[i] * c->head_dim,
                           (int64_t)w->kp.head_cut[i + 1] * c->head_dim);
        if (!kp)
            list_add(w, &n, &M->wo, &L->wo, true);
        if (!model_layer_moe(c, l)) {
            list_add(w, &n, &M->gate, &L->w_gate, true);
            list_add(w, &n, &M->up, &L->w_up, true);
            for (int i = 0; i < w->kp.n && kp; i++)
                list_add_shard(w, &n, &M->down_part[i], &L->w_down, true, 0, c->dim,
                               w->kp.ffn_cut[i], w->kp.ffn_cut[i + 1]);
            if (!kp)
                list_add(w, &n, &M->down, &L->w_down, true);
            continue;
        }
        list_add(w, &n, &M->router, &L->router, true);
        if (em) {
            M->egate = em, M->eup = em + c->n_expert, M->edown = em + 2 * c->n_expert;
            em += 3 * c->n_expert;
        }
        for (int x = 0; x < c->n_expert; x++) {
            list_add(w, &n, M->egate ? &M->egate[x] : NULL, &L->exp_gate[x], true);
            list_add(w, &n, M->eup ? &M->eup[x] : NULL, &L->exp_up[x], true);
            list_add(w, &n, M->edown ? &M->edown[x] : NULL, &L->exp_down[x], true);
        }
        if (c->shared_ffn_dim > 0) {
            list_add(w, &n, &M->sh_gate, &L->sh_gate, true);
            list_add(w, &n, &M->sh_up, &L->sh_up, true);
            list_add(w, &n, &M->sh_down, &L->sh_down, true);
        }
    }
    if (w->part.last)
        list_add(w, &n, &w->output, &m->output, true);
    return n;
}

/* Matrix i of the list. */
static struct exec_mat *mat_at(struct exec_weights *w, int i, const struct tensor **t,
                               bool *per_head)
{
    *t = w->list[i].t;
    *per_head = !w->list[i].aligned;
    return w->list[i].x;
}

/* Bytes of the pool a gemm matrix takes (repacked form, or a copy of its rows), rounded
   up to 64 so every matrix in the pool starts on a cache line. */
static size_t mat_pool_bytes(const struct exec_mat *x, const struct tensor *t)
{
    if (!x->gemm)
        return 0;
    size_t nb = x->repacked ? gemm_repack_bytes(x->from_f16 ? DT_BF16 : t->type, x->rows, x->k)
                            : x->row_bytes * (size_t)x->rows;
    return (nb + 63) / 64 * 64;
}

/* Describe every matrix; returns the bytes of the pool they need. */
static size_t mats_plan(struct exec_weights *w)
{
    int n = w->n_list;
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        const struct tensor *t;
        bool per_head;
        struct exec_mat *x = mat_at(w, i, &t, &per_head);
        struct weld_err ignored;
        /* F16 is computed as BF16 (weights.h): the same row bytes, rounded when pooled */
        const int ct = exec_compute_type(t->type);
        const struct exec_mat_ref *sh = &w->list[i];
        const size_t full = dtype_row_bytes(t->type, t->ne[0]);
        *x = (struct exec_mat){.wtype = ct,
                               .data = (const uint8_t *)t->data + (size_t)sh->r0 * full,
                               .row0 = sh->r0,
                               .rows = sh->r1 - sh->r0,
                               .k = sh->k1 - sh->k0,
                               .row_bytes = dtype_row_bytes(t->type, sh->k1 - sh->k0),
                               .from_f16 = ct != (int)t->type};
        x->gemm = gemm_check(ct, x->k, NULL, &ignored) == WELD_OK;
        if (!x->gemm) { /* read in place: columns as a view, rows `full` bytes apart */
            x->wtype = t->type;
            x->from_f16 = false;
            if (sh->k0 != 0 || sh->k1 != t->ne[0]) {
                x->data = (const uint8_t *)x->data + dtype_row_bytes(t->type, sh->k0);
                x->row_bytes = full;
            }
            continue;
        }
        x->repacked = w->repack && w->list[i].aligned && gemm_repack_pays(w->go, ct) &&
                      gemm_repack_bytes(ct, x->rows, x->k) > 0;
        total += mat_pool_bytes(x, t);
    }
    return total;
}

/* The pools of every live exec_weights, each shared by all of one model's exec_weights
   that plan the same layout (the same matrices repacked, so the same bytes at the same
   offsets): made and filled by the first, referenced by the others, unmapped with the
   last. Guarded by pools_lock (backends may be created on different threads). */
struct weight_pool {
    const struct model *m;
    struct exec_part part; /* the part of the model it holds (exec_weights.part) */
    size_t bytes;
    int n;                /* matrices (mat_at indices) */
    int *wtype;           /* (n) each matrix's type in the pool */
    uint8_t *repacked;    /* (n) each matrix's plan (1: repacked, 2: from F16), compared
                             on lookup */
    void *mem;
    int refs;
    struct weight_pool *next;
};

static pthread_mutex_t pools_lock = PTHREAD_MUTEX_INITIALIZER;
static struct weight_pool *pools;

/* A live pool of w's model with w's plan, with a reference taken; NULL if none. */
static struct weight_pool *pool_find(struct exec_weights *w, size_t total, int n)
{
    pthread_mutex_lock(&pools_lock);
    struct weight_pool *p = pools;
    for (; p; p = p->next) {
        if (p->m != w->m || p->bytes != total || p->n != n || p->part.tp_rank != w->part.tp_rank ||
            p->part.tp_size != w->part.tp_size || p->part.layer0 != w->part.layer0 ||
            p->part.layer1 != w->part.layer1 || p->part.vocab0 != w->part.vocab0 ||
            p->part.vocab1 != w->part.vocab1 || p->part.first != w->part.first ||
            p->part.last != w->part.last)
            continue;
        bool same = true;
        for (int i = 0; i < n && same; i++) {
            const struct tensor *t;
            bool per_head;
            const struct exec_mat *x = mat_at(w, i, &t, &per_head);
            same = p->repacked[i] == (uint8_t)(x->repacked | x->from_f16 << 1);
        }
        if (same)
            break;
    }
    if (p)
        p->refs++;
    pthread_mutex_unlock(&pools_lock);
    return p;
}

static void pool_unref(struct weight_pool *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&pools_lock);
    bool last = --p->refs == 0;
    if (last)
        for (struct weight_pool **q = &pools; *q; q = &(*q)->next)
            if (*q == p) {
                *q = p->next;
                break;
            }
    pthread_mutex_unlock(&pools_lock);
    if (!last)
        return;
    wunmap(p->mem, p->bytes);
    wfree(p->wtype);
    wfree(p->repacked);
    wfree(p);
}

static int pool_new(struct weight_pool **out, struct exec_weights *w, size_t total, int n,
                    struct weld_err *e)
{
    struct weight_pool *p = wcalloc(1, sizeof *p);
    if (p && (p->wtype = wcalloc((size_t)n, sizeof *p->wtype)) &&
        (p->repacked = wcalloc((size_t)n, 1)))
        p->mem = wmap_huge(total);
    if (!p || !p->mem) {
        if (p)
            wfree(p->wtype), wfree(p->repacked), wfree(p);
        return err_set(e, WELD_ERR_NOMEM, "%s: out of memory for %zu bytes of weights",
                       model_where(w->m), total);
    }
    p->m = w->m;
    p->part = w->part;
    p->bytes = total;
    p->n = n;
    p->refs = 1;
    *out = p;
    return WELD_OK;
}

/* Point every pooled matrix at its bytes in a pool another exec_weights filled. */
static void mats_share(struct exec_weights *w, const struct weight_pool *p)
{
    uint8_t *dst = p->mem;
    for (int i = 0; i < p->n; i++) {
        const struct tensor *t;
        bool per_head;
        struct exec_mat *x = mat_at(w, i, &t, &per_head);
        size_t nb = mat_pool_bytes(x, t);
        if (nb) {
            x->wtype = p->wtype[i];
            x->data = dst;
            dst += nb;
        }
    }
}

/* rows x k F16 values at src as bf16 at dst (row-major, same row bytes): widened exactly,
   then rounded as gemm_bf16_round (the BF16 activations' quantizer, vectorised). */
static bool mat_f16_to_bf16(const struct gemm_ops *go, const void *src, void *dst, int64_t rows,
                            int64_t k)
{
    const size_t rb = 2 * (size_t)k, arb = gemm_act_row_bytes(DT_BF16, k);
    float *f = wmalloc((size_t)k * sizeof *f);
    uint8_t *b = wmalloc(arb);
    for (int64_t r = 0; f && b && r < rows; r++) {
        go->to_f32(DT_F16, (const uint8_t *)src + (size_t)r * rb, f, k);
        go->act_quant(DT_BF16, f, (size_t)k, k, 1, b, arb);
        memcpy((uint8_t *)dst + (size_t)r * rb, b, rb);
    }
    bool ok = f && b;
    wfree(f);
    wfree(b);
    return ok;
}

/* Fill a new pool: repack the planned matrices, copy the other gemm matrices' rows (F16
   ones rounded to bf16). WELD_ERR_NOMEM when the rounding's scratch cannot be had. */
static int mats_fill_pool(struct exec_weights *w, struct weight_pool *p, struct weld_err *e)
{
    uint8_t *dst = p->mem;
    struct progress pr;
    progress_start(&pr, "loading weights", p->bytes);
    for (int i = 0; i < p->n; i++) {
        const struct tensor *t;
        bool per_head;
        struct exec_mat *x = mat_at(w, i, &t, &per_head);
        size_t nb = mat_pool_bytes(x, t);
        p->repacked[i] = (uint8_t)(x->repacked | x->from_f16 << 1);
        if (!nb)
            continue;
        bool ok = true;
        /* a shard's rows start at x->data; its columns are gathered into rows of their own */
        const uint8_t *src = x->data;
        uint8_t *cols = NULL;
        const struct exec_mat_ref *sh = &w->list[i];
        if (sh->k0 != 0 || sh->k1 != t->ne[0]) {
            const size_t full = dtype_row_bytes(t->type, t->ne[0]);
            const size_t off = dtype_row_bytes(t->type, sh->k0);
            if (!(cols = wmalloc(x->row_bytes * (size_t)x->rows))) {
                progress_end(&pr);
                return err_set(e, WELD_ERR_NOMEM, "%s: out of memory cutting '%s'",
                               model_where(w->m), t->name ? t->name : "a matrix");
            }
            for (int64_t r = 0; r < x->rows; r++)
                memcpy(cols + (size_t)r * x->row_bytes, src + (size_t)r * full + off, x->row_bytes);
            src = cols;
        }
        if (x->from_f16 && x->repacked) {
            /* rounded 16 rows at a time, each group repacked on its own (a group's layout
               does not depend on the others): scratch of one group, not of the matrix */
            uint8_t *g16 = wmalloc(16 * x->row_bytes);
            for (int64_t r = 0; g16 && ok && r < x->rows; r += 16) {
                const int64_t n = x->rows - r < 16 ? x->rows - r : 16;
                if (!(ok = mat_f16_to_bf16(w->go, src + (size_t)r * x->row_bytes, g16, n, x->k)))
                    break;
                x->wtype = gemm_repack(DT_BF16, g16, x->row_bytes, n, x->k,
                                       dst + (size_t)r * x->row_bytes);
                WELD_ASSERT(x->wtype == GEMM_BF16_R16);
            }
            ok = ok && g16;
            wfree(g16);
        } else if (x->from_f16) {
            ok = mat_f16_to_bf16(w->go, src, dst, x->rows, x->k);
        } else if (x->repacked) {
            x->wtype = gemm_repack(t->type, src, x->row_bytes, x->rows, x->k, dst);
            WELD_ASSERT(x->wtype >= 0);
        } else {
            memcpy(dst, src, x->row_bytes * (size_t)x->rows);
        }
        wfree(cols);
        if (!ok) {
            progress_end(&pr);
            return err_set(e, WELD_ERR_NOMEM, "%s: out of memory rounding '%s' to bf16",
                           model_where(w->m), t->name ? t->name : "a matrix");
        }
        /* the original stays mapped (a tied embedding still reads rows of it) but
           leaves the resident set: otherwise the model costs twice its size */
        model_release_pages(w->m, t->data, t->nbytes);
        p->wtype[i] = x->wtype;
        x->data = dst;
        dst += nb;
        progress_add(&pr, nb);
    }
    progress_end(&pr);
    return WELD_OK;
}

/* Give the planned matrices their pool (shared with another exec_weights of the model
   and plan if one is alive, else made and filled now) and set every act_row_bytes. */
static int mats_fill(struct exec_weights *w, size_t total, struct weld_err *e)
{
    int n = w->n_list;
    if (total) {
        struct weight_pool *p = pool_find(w, total, n);
        if (p) {
            mats_share(w, p);
        } else {
            int rc = pool_new(&p, w, total, n, e);
            if (rc)
                return rc;
            if ((rc = mats_fill_pool(w, p, e))) {
                pool_unref(p); /* not listed yet: just freed */
                return rc;
            }
            pthread_mutex_lock(&pools_lock);
            p->next = pools;
            pools = p;
            pthread_mutex_unlock(&pools_lock);
        }
        w->pool = p;
    }
    for (int i = 0; i < n; i++) {
        const struct tensor *t;
        bool per_head;
        struct exec_mat *x = mat_at(w, i, &t, &per_head);
        if (x->gemm) {
            x->act_row_bytes = (gemm_act_row_bytes(x->wtype, x->k) + 63) / 64 * 64;
            if (x->act_row_bytes > w->max_act_row_bytes)
                w->max_act_row_bytes = x->act_row_bytes;
        }
    }
    /* Decode reads one embedding row a token, a new page most of the time: as first
       touches those were page faults of 12-25 us each in a VM (110M Q8_0, 2 threads:
       0.3-0.5% of a decode step, which the other worker waited out, and a few of 1-7
       ms). A table of its own is mapped in now; a tied one is the output matrix's
       source, released above, and is left to fault (mapping it would keep two copies). */
    if (w->m->tok_embd.data && w->m->tok_embd.data != w->m->output.data)
        mfile_prefault(w->m->tok_embd.data, w->m->tok_embd.nbytes);
    /* A tied table whose pooled copy holds its values (not rounded from F16, and rows as
       they are or BF16's repacked form) serves the lookups from the pool instead. */
    const struct exec_mat *o = &w->output;
    if (w->tp_size == 1 && w->part.first && w->part.last &&
        w->m->tok_embd.data == w->m->output.data && o->gemm && !o->from_f16 &&
        (!o->repacked || o->wtype == GEMM_BF16_R16))
        w->embed = o;
    return WELD_OK;
}

/* Bytes of the matrices a decode step reads (every layer's and the LM head; of a MoE
   layer the router, the shared expert and n_expert_used experts' worth). */
static size_t matrix_bytes(const struct model *m)
{
    const struct model_config *c = &m->cfg;
    size_t bytes = m->output.nbytes;
    for (int l = 0; m->layers && l < c->n_layer; l++) {
        const struct layer_weights *L = &m->layers[l];
        bytes += L->wq.nbytes + L->wk.nbytes + L->wv.nbytes + L->wo.nbytes + L->wq_a.nbytes +
                 L->wq_b.nbytes + L->wkv_a.nbytes + L->wkv_b.nbytes + L->wk_b.nbytes +
                 L->wv_b.nbytes;
        if (!model_layer_moe(c, l)) {
            bytes += L->w_gate.nbytes + L->w_up.nbytes + L->w_down.nbytes;
            continue;
        }
        size_t ex = 0;
        for (int x = 0; L->exp_gate && L->exp_up && L->exp_down && x < c->n_expert; x++)
            ex += L->exp_gate[x].nbytes + L->exp_up[x].nbytes + L->exp_down[x].nbytes;
        bytes += L->router.nbytes + L->sh_gate.nbytes + L->sh_up.nbytes + L->sh_down.nbytes +
                 ex / (size_t)c->n_expert * (size_t)c->n_expert_used;
    }
    return bytes;
}

/* gemm_decode_flags() as tuning t asks: decode pairs and L2 prefetch where t sets them,
   GEMM_RESIDENT for a model whose matrices fit in a few MiB of cache; and whether
   matrices go into their repacked forms where those pay (t->repack: off keeps every
   matrix in its file's layout, same numbers, for comparisons). */
static void tuning_settings(struct exec_weights *w, const struct exec_tuning *t)
{
    static const unsigned pairs[] = {
        [PAIRS_OFF] = 0, [PAIRS_ON] = GEMM_DECODE_PAIRS, [PAIRS_LONG] = GEMM_DECODE_PAIRS_LONG};
    w->gemm_flags = gemm_decode_flags();
    if (t->decode_pairs != PAIRS_AUTO)
        w->gemm_flags = (w->gemm_flags & ~(GEMM_DECODE_PAIRS | GEMM_DECODE_PAIRS_LONG)) |
                        pairs[t->decode_pairs];
    if (t->l2_prefetch != TUNE_AUTO)
        w->gemm_flags = (w->gemm_flags & ~GEMM_L2_PREFETCH) |
                        (t->l2_prefetch == TUNE_ON ? GEMM_L2_PREFETCH : 0u);
    w->gemm_flags &= ~GEMM_RESIDENT;
    if (matrix_bytes(w->m) <= GEMM_RESIDENT_BYTES)
        w->gemm_flags |= GEMM_RESIDENT;
    w->repack = t->repack != TUNE_OFF;
}

/* Can a matrix of type t (gemm: one the gemm kernels run) be viewed as its columns
   [k0, k1): k0 on a block boundary, and the width one its path takes? */
static bool cut_fits(int t, bool gemm, int64_t k0, int64_t k1)
{
    const struct dtype_info *d = dtype_get(t);
    struct weld_err ignored;
    return d && k0 % d->block_size == 0 && k1 > k0 && dtype_row_bytes(t, k1 - k0) > 0 &&
           (!gemm || gemm_check(t, k1 - k0, NULL, &ignored) == WELD_OK);
}

int exec_kparts_ffn_cut(int ffn_dim, int block, int i, int n)
{
    int64_t a = 16;
    while (block > 0 && a % block)
        a += 16;
    return i >= n ? ffn_dim : (int)(((int64_t)ffn_dim * i / n + a / 2) / a * a);
}

/* The cuts of n K parts for model m: KV-head boundaries for wo, multiples of 16 rows and
   of down's blocks near the equal split for the ffn. False if some layer's types do not
   allow them (or n is not in [2, min(n_kv_head, PROG_KPARTS_MAX)]). */
static bool kparts_cut(const struct model *m, int n, struct prog_kparts *kp)
{
    const struct model_config *c = &m->cfg;
    const int nkv = c->n_kv_head, grp = c->n_head / nkv;
    if (n < 2 || n > nkv || n > PROG_KPARTS_MAX)
        return false;
    kp->n = n;
    for (int i = 0; i <= n; i++) {
        kp->head_cut[i] = i * nkv / n * grp;
        kp->ffn_cut[i] = i == n ? c->ffn_dim : 0;
    }
    for (int l = 0; l < c->n_layer; l++) {
        const struct tensor *wo = &m->layers[l].wo, *dn = &m->layers[l].w_down;
        const struct dtype_info *d = dtype_get(dn->type);
        if (!d)
            return false;
        for (int i = 1; i < n && !model_layer_moe(c, l); i++) { /* dense layers' ffn */
            int cut = exec_kparts_ffn_cut(c->ffn_dim, d->block_size, i, n);
            if (cut > kp->ffn_cut[i])
                kp->ffn_cut[i] = cut;
        }
        struct weld_err ignored;
        bool g_wo = gemm_check(wo->type, wo->ne[0], NULL, &ignored) == WELD_OK;
        for (int i = 0; i < n; i++) {
            int64_t h0 = (int64_t)kp->head_cut[i] * c->head_dim;
            int64_t h1 = (int64_t)kp->head_cut[i + 1] * c->head_dim;
            if (!cut_fits(wo->type, g_wo, h0, h1))
                return false;
        }
    }
    for (int i = 1; i < n; i++) /* a model of MoE layers only: cuts no layer uses */
        if (!kp->ffn_cut[i])
            kp->ffn_cut[i] = exec_kparts_ffn_cut(c->ffn_dim, 32, i, n);
    for (int l = 0; l < c->n_layer; l++) {
        if (model_layer_moe(c, l))
            continue;
        const struct tensor *dn = &m->layers[l].w_down;
        struct weld_err ignored;
        bool g_dn = gemm_check(dn->type, dn->ne[0], NULL, &ignored) == WELD_OK;
        for (int i = 0; i < n; i++)
            if (kp->ffn_cut[i] >= kp->ffn_cut[i + 1] ||
                !cut_fits(dn->type, g_dn, kp->ffn_cut[i], kp->ffn_cut[i + 1]))
                return false;
    }
    return true;
}

/* The K parts of w's model: none unless the tuning asks for n (1 to PROG_KPARTS_MAX), and
   an error if the model cannot be cut so. Not the default: on the 2-vCPU hosts here two
   parts made stories260K's decode at two threads 0-5% faster and its prefill 15-20% slower
   (docs/bench-log/2026-12-04-k-parts-tiny-models.md). */
static int kparts_choose(struct exec_weights *w, int n, struct weld_err *e)
{
    const struct model *m = w->m;
    const struct model_config *c = &m->cfg;
    w->kp = (struct prog_kparts){.n = 1, .head_cut = {0, c->n_head}, .ffn_cut = {0, c->ffn_dim}};
    if (n <= 1)
        return WELD_OK;
    if (c->kv_lora_rank > 0)
        return err_set(e, WELD_ERR_INVALID_ARG,
                       "k_parts=%d: %s has latent attention, "
                       "which runs without K parts; use 1",
                       n, model_where(m));
    struct prog_kparts kp;
    if (n > PROG_KPARTS_MAX || !kparts_cut(m, n, &kp))
        return err_set(e, WELD_ERR_INVALID_ARG, "k_parts=%d: %s cannot be cut in %d K parts "
                       "(needs at most %d parts, that many KV heads, %d here, and cuts on its "
                       "matrices' blocks); use 1", n, model_where(m), n, PROG_KPARTS_MAX,
                       c->n_kv_head);
    w->kp = kp;
    return WELD_OK;
}

/* Every latent layer's kbt (weights.h): row h * kvl + c holds wkv_b's element c of rows
   h * (nope + v) + i, i < nope, as f32 (exact: dequantized), so the query's absorption
   into the latent space is an ordinary product. */
static int mla_build(struct exec_weights *w, struct weld_err *e)
{
    const struct model *m = w->m;
    const struct model_config *c = &m->cfg;
    if (c->kv_lora_rank <= 0)
        return WELD_OK;
    const int kvl = c->kv_lora_rank, nope = c->qk_nope_dim, per = nope + c->v_head_dim;
    const size_t per_layer = (size_t)c->n_head * (size_t)kvl * (size_t)nope;
    size_t n_kvb = 0;
    for (int l = 0; l < c->n_layer; l++)
        n_kvb += m->layers[l].wkv_b.data != NULL;
    float *row = wmalloc(sizeof(float) * (size_t)kvl);
    if (!row || (n_kvb && !(w->mla_mem = wmalloc(per_layer * n_kvb * sizeof(float))))) {
        wfree(row);
        return err_set(e, WELD_ERR_NOMEM, "%s: out of memory for the latent key projections",
                       model_where(m));
    }
    if (!(w->mla_views = wcalloc(2 * (size_t)c->n_layer, sizeof *w->mla_views))) {
        wfree(row);
        return err_set(e, WELD_ERR_NOMEM, "%s: out of memory", model_where(m));
    }
    for (int l = 0; l < c->n_layer; l++) {
        const struct tensor *t = &m->layers[l].wkv_b;
        if (!t->data) {
            for (int i = 0; i < 2; i++) {
                struct tensor *v = &w->mla_views[2 * l + i];
                *v = i ? m->layers[l].wv_b : m->layers[l].wk_b;
                v->ne[1] *= v->ne[2];
                v->ne[2] = 1;
                v->n_dims = 2;
            }
            continue;
        }
        const size_t rb = dtype_row_bytes(t->type, kvl);
        float *kb = w->mla_mem + per_layer * --n_kvb;
        for (int h = 0; h < c->n_head; h++)
            for (int i = 0; i < nope; i++) {
                dtype_dequantize_row(t->type, (const uint8_t *)t->data + (size_t)(h * per + i) * rb,
                                     row, kvl);
                for (int k = 0; k < kvl; k++)
                    kb[((size_t)h * kvl + (size_t)k) * (size_t)nope + (size_t)i] = row[k];
            }
        struct exec_mat *x = &w->mats[l].kbt;
        struct weld_err ignored;
        *x = (struct exec_mat){.wtype = DT_F32,
                               .data = kb,
                               .rows = (int64_t)c->n_head * kvl,
                               .k = nope,
                               .row_bytes = sizeof(float) * (size_t)nope};
        x->gemm = gemm_check(DT_F32, nope, NULL, &ignored) == WELD_OK;
        x->act_row_bytes = x->gemm ? (gemm_act_row_bytes(DT_F32, nope) + 63) / 64 * 64 : 0;
    }
    wfree(row);
    return WELD_OK;
}

static int mats_create(struct exec_weights *w, const struct exec_tuning *t, struct weld_err *e)
{
    int rc = isa_init(e);
    if (rc)
        return rc;
    w->go = gemm_ops_get();
    tuning_settings(w, t);
    if (!(w->mats = wcalloc((size_t)w->m->cfg.n_layer, sizeof *w->mats)))
        return err_set(e, WELD_ERR_NOMEM, "%s: out of memory for matrix table",
                       model_where(w->m));
    if ((rc = kparts_choose(w, w->tp_size > 1 ? w->tp_size : t->k_parts, e)))
        return rc;
    const struct model_config *c = &w->m->cfg;
    int n_moe = 0;
    for (int l = 0; l < c->n_layer; l++)
        n_moe += model_layer_moe(c, l);
    if (n_moe && !(w->expert_mats = wcalloc((size_t)n_moe * 3 * (size_t)c->n_expert,
                                            sizeof *w->expert_mats)))
        return err_set(e, WELD_ERR_NOMEM, "%s: out of memory for the expert matrix table",
                       model_where(w->m));
    if ((rc = mla_build(w, e)))
        return rc;
    const bool tp = w->tp_size > 1;
    w->n_list = tp ? list_fill_shard(w) : list_fill(w);
    if (!(w->list = wcalloc((size_t)w->n_list, sizeof *w->list)))
        return err_set(e, WELD_ERR_NOMEM, "%s: out of memory for matrix table", model_where(w->m));
    tp ? list_fill_shard(w) : list_fill(w);
    const size_t pool_bytes = mats_plan(w);
    rc = mats_fill(w, pool_bytes, e);
    if (rc)
        return rc;
    bool all_float = true;
    for (int i = 0; i < w->n_list; i++) {
        const struct exec_mat *x = w->list[i].x;
        if (x == &w->output)
            continue;
        all_float = all_float && x->gemm &&
                    (gemm_act_kind(x->wtype) == GEMM_ACT_F32 ||
                     gemm_act_kind(x->wtype) == GEMM_ACT_BF16);
    }
    w->tok_tile = all_float ? EXEC_TILE_FLOAT : EXEC_TILE;
    w->piece_bytes = EXEC_PIECE_BYTES;
    return WELD_OK;
}

size_t exec_decode_bytes(const struct model *m)
{
    return matrix_bytes(m);
}

size_t exec_stage_bytes(const struct model *m)
{
    const int n_layer = m->cfg.n_layer;
    return matrix_bytes(m) / (5 * (size_t)(n_layer > 0 ? n_layer : 0) + 2);
}

void exec_weights_free(struct exec_weights *w)
{
    if (!w)
        return;
    pool_unref(w->pool);
    wfree(w->list);
    wfree(w->expert_mats);
    wfree(w->mla_mem);
    wfree(w->mla_views);
    wfree(w->yarn_factors);
    wfree(w->mats);
    wfree(w->mem);
    wfree(w->layers);
    wfree(w);
}

/* YaRN (DeepSeek-V2/V3; llama.cpp's ggml_rope_yarn_corr_dims and rope_yarn, HF's
   yarn_find_correction_range): with d = rope_dim, pair i's frequency f_i = theta^(-2i/d)
   becomes f_i / s (s = rope_factor) below the correction range and stays f_i above it,
   mixed linearly inside: mix_i = 1 - clamp((i - lo) / max(0.001, hi - lo), 0, 1) with
   lo = max(0, floor(c(beta_fast))), hi = min(d - 1, ceil(c(beta_slow))), c(b) = d *
   ln(orig_ctx / (2 pi b)) / (2 ln theta); f_i' = f_i ((1 - mix_i) / s + mix_i), kept as
   the divisor f_i / f_i' (exec_weights.rope_factors). The magnitude factor of cos / sin
   is mscale(s, m) / mscale(s, m_all), 1 for the DeepSeek configs weld reads (mscale ==
   mscale_all_dim; model/config.c refuses others), and the attention scores take
   mscale(s, m_all)^2 = (1 + yarn_log_mul ln s)^2. */
static int yarn_setup(struct exec_weights *w, struct weld_err *e)
{
    const struct model_config *c = &w->m->cfg;
    const int d = c->rope_dim, n = d / 2;
    if (!(w->yarn_factors = wcalloc((size_t)n, sizeof(float))))
        return err_set(e, WELD_ERR_NOMEM, "%s: out of memory", model_where(w->m));
    const double s = c->rope_factor, lb = 2.0 * log((double)c->rope_theta);
    const double cf = d * log(c->rope_orig_ctx / (c->yarn_beta_fast * 2.0 * M_PI)) / lb;
    const double cs = d * log(c->rope_orig_ctx / (c->yarn_beta_slow * 2.0 * M_PI)) / lb;
    const double lo = fmax(0.0, floor(cf)), hi = fmin(d - 1.0, ceil(cs));
    for (int i = 0; i < n; i++) {
        double y = (i - lo) / fmax(0.001, hi - lo);
        double mix = 1.0 - fmin(1.0, fmax(0.0, y));
        w->yarn_factors[i] = (float)(1.0 / ((1.0 - mix) / s + mix));
    }
    w->rope_factors = w->yarn_factors;
    const double ms = s > 1.0 ? 1.0 + c->yarn_log_mul * log(s) : 1.0;
    w->attn_scale = (float)(ms * ms / sqrt((double)c->head_dim));
    return WELD_OK;
}

int exec_tp_vocab_cut(int n_vocab, int r, int n)
{
    if (r >= n)
        return n_vocab;
    /* whole statistics chunks where each rank gets two or more, else 16-row groups */
    const int align = n_vocab >= 2 * n * LOGITS_CHUNK ? LOGITS_CHUNK : 16;
    const long long units = (n_vocab + align - 1) / align;
    const long long cut = units * r / n * align;
    return cut < n_vocab ? (int)cut : n_vocab;
}

/* Can model m be cut into n tensor-parallel shards? */
static int shard_check(const struct model *m, int n, bool ep, struct weld_err *e)
{
    const struct model_config *c = &m->cfg;
    if (c->kv_lora_rank > 0)
        return err_set(e, WELD_ERR_UNSUPPORTED,
                       "tensor parallel size %d: %s has latent attention, which runs in one "
                       "process only",
                       n, model_where(m));
    if (c->n_expert > 0 && !ep)
        return err_set(e, WELD_ERR_INVALID_ARG,
                       "tensor parallel size %d: %s is a mixture of experts; add "
                       "--enable-expert-parallel to place its experts whole on the ranks",
                       n, model_where(m));
    if (c->n_expert > 0 && c->n_expert % n)
        return err_set(e, WELD_ERR_INVALID_ARG,
                       "expert parallel size %d: %s has %d experts, which must divide by it", n,
                       model_where(m), c->n_expert);
    if (n > PROG_KPARTS_MAX)
        return err_set(e, WELD_ERR_UNSUPPORTED,
                       "tensor parallel size %d: at most %d ranks "
                       "are supported",
                       n, PROG_KPARTS_MAX);
    if (c->n_kv_head % n || c->n_head % n)
        return err_set(e, WELD_ERR_INVALID_ARG,
                       "tensor parallel size %d: %s has %d attention "
                       "heads and %d KV heads; both must divide by the tensor parallel size",
                       n, model_where(m), c->n_head, c->n_kv_head);
    if (c->n_vocab < n * 16)
        return err_set(e, WELD_ERR_INVALID_ARG,
                       "tensor parallel size %d: %s has a vocabulary "
                       "of %d, under 16 ids per rank",
                       n, model_where(m), c->n_vocab);
    return WELD_OK;
}

static int weights_create(struct exec_weights **out, const struct model *m,
                          const struct exec_tuning *t, const struct exec_part *part,
                          struct weld_err *e);

int exec_weights_create(struct exec_weights **out, const struct model *m,
                        const struct exec_tuning *t, struct weld_err *e)
{
    const struct exec_part whole = exec_part_whole(&m->cfg);
    return weights_create(out, m, t, &whole, e);
}

int exec_weights_create_shard(struct exec_weights **out, const struct model *m,
                              const struct exec_tuning *t, const struct exec_part *part,
                              struct weld_err *e)
{
    *out = NULL;
    const struct model_config *c = &m->cfg;
    int rc = check_model(m, &(size_t){0}, e);
    if (rc)
        return rc;
    if (part->layer0 >= part->layer1 && part->layer0 >= 0 && part->layer1 <= c->n_layer)
        return err_set(e, WELD_ERR_INVALID_ARG,
                       "pipeline stages: %s has %d layers, fewer "
                       "than the stages (each needs one or more); use fewer stages",
                       model_where(m), c->n_layer);
    if (part->tp_size < 1 || part->tp_rank < 0 || part->tp_rank >= part->tp_size ||
        part->layer0 < 0 || part->layer1 > c->n_layer || part->layer0 >= part->layer1 ||
        (part->last &&
         (part->vocab0 < 0 || part->vocab1 <= part->vocab0 || part->vocab1 > c->n_vocab)))
        return err_set(e, WELD_ERR_INVALID_ARG,
                       "weights: part %d of %d, layers [%d, %d), "
                       "vocabulary [%d, %d) of %s",
                       part->tp_rank, part->tp_size, part->layer0, part->layer1, part->vocab0,
                       part->vocab1, model_where(m));
    if (part->tp_size > 1 && (rc = shard_check(m, part->tp_size, part->ep, e)))
        return rc;
    if (part->tp_size == 1 && (part->layer0 > 0 || part->layer1 < c->n_layer) &&
        (c->n_expert > 0 || c->kv_lora_rank > 0))
        return err_set(e, WELD_ERR_UNSUPPORTED,
                       "pipeline stages: %s has %s, which runs in "
                       "one process only",
                       model_where(m), c->n_expert > 0 ? "experts" : "latent attention");
    return weights_create(out, m, t, part, e);
}

static int weights_create(struct exec_weights **out, const struct model *m,
                          const struct exec_tuning *t, const struct exec_part *part,
                          struct weld_err *e)
{
    *out = NULL;
    const struct exec_tuning dflt = exec_tuning_default();
    if (!t)
        t = &dflt;
    size_t nf = 0;
    int rc = check_model(m, &nf, e);
    if (rc)
        return rc;
    const struct model_config *c = &m->cfg;
    struct exec_weights *w = wcalloc(1, sizeof *w);
    if (!w || !(w->layers = wcalloc((size_t)c->n_layer, sizeof *w->layers)) ||
        !(w->mem = wcalloc(nf, sizeof(float)))) {
        exec_weights_free(w);
        return err_set(e, WELD_ERR_NOMEM, "%s: out of memory for norm vectors",
                       model_where(m));
    }
    w->m = m;
    w->part = *part;
    w->tp_rank = part->tp_size > 1 ? part->tp_rank : 0;
    w->tp_size = part->tp_size;
    w->vocab0 = part->last ? part->vocab0 : 0;
    w->vocab1 = part->last ? part->vocab1 : 0;
    w->rope_pos_scale = c->rope_scaling == ROPE_SCALING_LINEAR ? 1.0f / c->rope_factor : 1.0f;
    w->attn_scale = 1.0f / sqrtf((float)c->head_dim);
    w->rope_factors = m->rope_freq_factors;
    if (c->rope_scaling == ROPE_SCALING_YARN && (rc = yarn_setup(w, e))) {
        exec_weights_free(w);
        return rc;
    }
    float *cur = w->mem;
    int64_t qd = (int64_t)c->n_head * c->head_dim, kd = (int64_t)c->n_kv_head * c->head_dim;
    w->output_norm = take_vec(&m->output_norm, c->dim, &cur);
    for (int l = 0; l < c->n_layer; l++) {
        const struct layer_weights *L = &m->layers[l];
        struct exec_layer_vecs *v = &w->layers[l];
        v->attn_norm = take_vec(&L->attn_norm, c->dim, &cur);
        if (c->kv_lora_rank > 0) {
            v->q_a_norm = c->q_lora_rank > 0 ? take_vec(&L->q_a_norm, c->q_lora_rank, &cur) : NULL;
            v->kv_a_norm = take_vec(&L->kv_a_norm, c->kv_lora_rank, &cur);
        }
        v->bq = take_vec(&L->bq, qd, &cur);
        v->bk = take_vec(&L->bk, kd, &cur);
        v->bv = take_vec(&L->bv, kd, &cur);
        if (c->qk_norm) { /* only qwen3 normalises q and k, whatever else the file holds */
            v->q_norm = take_vec(&L->q_norm, c->head_dim, &cur);
            v->k_norm = take_vec(&L->k_norm, c->head_dim, &cur);
        }
        v->ffn_norm = take_vec(&L->ffn_norm, c->dim, &cur);
        if (model_layer_moe(c, l)) {
            v->exp_bias = c->expert_bias ? take_vec(&L->exp_bias, c->n_expert, &cur) : NULL;
            v->sh_gate_inp = c->shared_gate ? take_vec(&L->sh_gate_inp, c->dim, &cur) : NULL;
        }
    }
    if ((rc = mats_create(w, t, e))) {
        exec_weights_free(w);
        return rc;
    }
    *out = w;
    return WELD_OK;
}

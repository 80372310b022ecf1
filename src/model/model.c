/*
 * model - the loader: a GGUF file or a Hugging Face directory -> struct model (model.h).
 *
 * Flow: resolve the reference (model_resolve_path: a local path, or org/name in the Hugging
 * Face cache; m->path keeps what was typed, m->dir the place found), read the config (model_config_from_gguf / model_config_from_hf, both validated),
 * open the weights (gguf_open / st_open_dir), then bind every tensor the config needs.
 * Binding looks a tensor up by its GGUF name (HF sets translate it with
 * tensor_name_gguf_to_hf and reverse the shape into GGUF's ne[] order), then checks, in
 * this order: present (or optional), the expected ne[] (unused dimensions are 1), a type
 * dtype_get() knows and can dequantize, rows a whole number of blocks, and a byte size of
 * exactly rows * row bytes. Data pointers point into the mapping; nothing is copied except
 * the Llama 3 rope divisors (a small float array).
 *
 * Memory: one allocation holds the layer array (n_layer + n_nextn: MTP layers last), the
 * per-expert views (3 * n_expert per layer, used by MoE layers only) and the layer
 * tensors' GGUF names (NAME_SLOT bytes each), so struct tensor.name stays valid until
 * model_free and the global names are string literals. The model owns the gguf_file /
 * st_set and the nextn array.
 *
 * Experts: a MoE layer (model_layer_moe) binds the router, the optional selection bias,
 * shared-expert tensors when the config has them, and n_expert 2-D views per projection:
 * for GGUF expert x is bytes [x * per, (x + 1) * per) of the stacked 3-D tensor (per =
 * its size / n_expert; all views carry the stacked tensor's name), for HF the expert's own
 * tensor (errors name the HF tensor, the expert and the stacked name). The pre-2024
 * per-expert GGUF form (blk.N.ffn_gate.E.weight) is refused. Dense layers (also the
 * leading ones of DeepSeek) bind ffn_gate/up/down at ffn_dim.
 *
 * MLA (kv_lora_rank > 0) binds wq or wq_a/q_a_norm/wq_b, wkv_a, kv_a_norm, and either
 * wkv_b (HF; older GGUFs) or wk_b + wv_b (llama.cpp 81ff7abe), never wk / wv. MTP layers
 * (HF model.layers.{n_layer..}) are bound like other layers plus struct nextn_weights.
 *
 * Optional tensors: QKV biases are required for qwen2 and, for other architectures, used
 * when all three are present (llama.cpp treats them as optional for llama; cfg.qkv_bias is
 * then set). Biases weld cannot apply (attn_output.bias, ffn_*.bias) make the load fail
 * rather than be silently ignored. Other unknown tensors are ignored with a debug log.
 *
 * Rope scaling: rope_freq_factors is set from rope_freqs.weight when the GGUF has it (the
 * tensor wins over keys), else computed from the config when cfg.rope_scaling is LLAMA3,
 * else NULL. Executors use it when non-NULL, whatever cfg.rope_scaling says.
 *
 * Not done here: reading or validating the weight bytes themselves (pages are touched
 * lazily by the executor), Q/K permutation (HF llama keeps rope_neox = true instead), and
 * tokenizers (tokenizer/ reads model->gguf or model->dir).
 */
#include "model/model.h"
#include "model/resolve.h"

#include "core/alloc.h"
#include "core/log.h"
#include "core/progress.h"
#include "model/names.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#define NAME_SLOT 48   /* "blk.1023.nextn.shared_head_norm.weight" fits */
#define LAYER_NAMES 38 /* name slots per layer (see bind_layer for who uses which) */

/* What a lookup found, in GGUF order. */
struct found {
    int type;
    int n_dims;
    int64_t ne[4];
    const void *data;
    size_t nbytes;
};

static const char *where(const struct model *m)
{
    return m->path;
}

static enum hf_style style(const struct model *m)
{
    if (m->cfg.arch == ARCH_LLAMA && m->cfg.n_expert > 0)
        return HF_STYLE_MIXTRAL;
    return m->cfg.arch == ARCH_DEEPSEEK2 ? HF_STYLE_DEEPSEEK : HF_STYLE_DEFAULT;
}

static int to_hf(const struct model *m, const char *name, char *out, size_t n)
{
    return tensor_name_gguf_to_hf_style(name, style(m), out, n);
}

/* Quote a name for messages: "'blk.0.x'" for GGUF, "'model.layers.0.y' (blk.0.x)" for HF. */
static const char *disp(const struct model *m, const char *name, char *buf, size_t n)
{
    char hf[160];
    if (m->source == MODEL_SRC_HF && to_hf(m, name, hf, sizeof hf) == 0)
        snprintf(buf, n, "'%s' (%s)", hf, name);
    else
        snprintf(buf, n, "'%s'", name);
    return buf;
}

static int lookup_hf(const struct model *m, const char *hf, const char *shown, struct found *f,
                     struct weld_err *e);

/* WELD_OK, WELD_ERR_NOT_FOUND, or an error naming the tensor. */
static int lookup(const struct model *m, const char *name, struct found *f, struct weld_err *e)
{
    memset(f, 0, sizeof *f);
    if (m->source == MODEL_SRC_GGUF) {
        const struct gguf_tensor *t = gguf_find_tensor(m->gguf, name);
        if (!t)
            return WELD_ERR_NOT_FOUND;
        f->type = (int)t->type;
        f->n_dims = t->n_dims;
        memcpy(f->ne, t->ne, sizeof f->ne);
        f->data = t->data;
        f->nbytes = t->nbytes;
        return WELD_OK;
    }
    char hf[160], d[256];
    if (to_hf(m, name, hf, sizeof hf) != 0)
        return WELD_ERR_NOT_FOUND;
    return lookup_hf(m, hf, disp(m, name, d, sizeof d), f, e);
}

/* An HF tensor by its own name; `shown` names it in messages. */
static int lookup_hf(const struct model *m, const char *hf, const char *shown, struct found *f,
                     struct weld_err *e)
{
    memset(f, 0, sizeof *f);
    const struct st_tensor *t = st_find(m->st, hf);
    if (!t)
        return WELD_ERR_NOT_FOUND;
    if (t->n_dims > 4)
        return err_set(e, WELD_ERR_FORMAT, "%s: tensor %s has %d dimensions", where(m), shown,
                       t->n_dims);
    if (t->dtype < 0)
        return err_set(e, WELD_ERR_UNSUPPORTED, "%s: tensor %s: dtype %s is not supported",
                       where(m), shown, t->dtype_name);
    f->type = t->dtype;
    f->n_dims = t->n_dims;
    for (int i = 0; i < 4; i++)
        f->ne[i] = i < t->n_dims ? t->shape[t->n_dims - 1 - i] : 1;
    f->data = t->data;
    f->nbytes = t->nbytes;
    return WELD_OK;
}

static void fmt_shape(char *buf, size_t n, int n_dims, const int64_t *ne)
{
    size_t off = (size_t)snprintf(buf, n, "{");
    for (int i = 0; i < n_dims && off < n; i++)
        off += (size_t)snprintf(buf + off, n - off, "%s%lld", i ? ", " : "", (long long)ne[i]);
    if (off < n)
        snprintf(buf + off, n - off, "}");
}

/* `d` is the tensor as messages show it. */
static int check_shown(const struct model *m, const char *d, const struct found *f, int n_dims,
                       const int64_t *want, struct weld_err *e)
{
    char s1[96], s2[96];
    for (int i = 0; i < 4; i++)
        if (f->ne[i] != want[i]) {
            fmt_shape(s1, sizeof s1, n_dims, want);
            fmt_shape(s2, sizeof s2, f->n_dims > 0 ? f->n_dims : 1, f->ne);
            return err_set(e, WELD_ERR_FORMAT, "%s: tensor %s: expected shape %s, found %s",
                           where(m), d, s1, s2);
        }
    const struct dtype_info *di = dtype_get(f->type);
    if (!di || !di->can_dequantize)
        return err_set(e, WELD_ERR_UNSUPPORTED, "%s: tensor %s: type %s (%d) is not supported",
                       where(m), d, dtype_name(f->type), f->type);
    size_t rb = dtype_row_bytes(f->type, want[0]);
    if (rb == 0)
        return err_set(e, WELD_ERR_FORMAT,
                       "%s: tensor %s: a row of %lld elements is not a whole number of %s "
                       "blocks",
                       where(m), d, (long long)want[0], di->name);
    /* want[1..3] come from a validated config: the product cannot overflow */
    uint64_t need = (uint64_t)rb * (uint64_t)(want[1] * want[2] * want[3]);
    if (f->nbytes != need || (need && !f->data))
        return err_set(e, WELD_ERR_FORMAT, "%s: tensor %s: %zu bytes of data, expected %llu",
                       where(m), d, f->nbytes, (unsigned long long)need);
    return WELD_OK;
}

static int check_found(const struct model *m, const char *name, const struct found *f, int n_dims,
                       const int64_t *want, struct weld_err *e)
{
    char d[256];
    return check_shown(m, disp(m, name, d, sizeof d), f, n_dims, want, e);
}

/* Bind tensor `name` of shape {ne0} (ne1 == 0), {ne0, ne1} or {ne0, ne1, ne2} into t. */
static int bind3(const struct model *m, struct tensor *t, const char *name, int64_t ne0,
                 int64_t ne1, int64_t ne2, bool required, struct weld_err *e)
{
    struct found f;
    int64_t want[4] = {ne0, ne1 ? ne1 : 1, ne2 ? ne2 : 1, 1};
    int n_dims = ne2 ? 3 : ne1 ? 2 : 1;
    memset(t, 0, sizeof *t);
    t->name = name;
    t->type = DT_F32;
    t->n_dims = n_dims;
    memcpy(t->ne, want, sizeof want);
    int rc = lookup(m, name, &f, e);
    if (rc == WELD_ERR_NOT_FOUND) {
        char d[256];
        if (!required)
            return WELD_OK;
        return err_set(e, WELD_ERR_FORMAT, "%s: tensor %s is missing", where(m),
                       disp(m, name, d, sizeof d));
    }
    if (rc != WELD_OK)
        return rc;
    if ((rc = check_found(m, name, &f, n_dims, want, e)) != WELD_OK)
        return rc;
    t->type = (enum weld_dtype)f.type;
    t->data = f.data;
    t->nbytes = f.nbytes;
    return WELD_OK;
}

static int bind(const struct model *m, struct tensor *t, const char *name, int64_t ne0, int64_t ne1,
                bool required, struct weld_err *e)
{
    return bind3(m, t, name, ne0, ne1, 0, required, e);
}

static int n_layer_all(const struct model *m)
{
    return m->cfg.n_layer + m->cfg.n_nextn;
}

/* One allocation: layers, then 3 * n_expert expert views per layer, then the names. */
static struct tensor *expert_views(const struct model *m, int l, enum expert_proj p)
{
    struct tensor *base = (struct tensor *)(m->layers + n_layer_all(m));
    return base + ((size_t)l * 3 + (size_t)p) * (size_t)m->cfg.n_expert;
}

static const char *layer_name(struct model *m, int l, int slot, const char *suffix)
{
    char *names = (char *)expert_views(m, n_layer_all(m), EXP_GATE);
    char *s = names + ((size_t)l * LAYER_NAMES + (size_t)slot) * NAME_SLOT;
    snprintf(s, NAME_SLOT, "blk.%d.%s", l, suffix);
    return s;
}

/* Fail on tensors that would change the result if ignored. */
static int check_unsupported(const struct model *m, int l, struct weld_err *e)
{
    static const char *const bad[] = {"attn_output.bias", "ffn_gate.bias", "ffn_up.bias",
                                      "ffn_down.bias", "attn_norm.bias", "ffn_norm.bias"};
    char name[NAME_SLOT], d[256];
    struct found f;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(name, sizeof name, "blk.%d.%s", l, bad[i]);
        int rc = lookup(m, name, &f, e);
        if (rc == WELD_OK)
            return err_set(e, WELD_ERR_UNSUPPORTED, "%s: tensor %s: this bias is not supported",
                           where(m), disp(m, name, d, sizeof d));
        if (rc != WELD_ERR_NOT_FOUND)
            return rc;
    }
    /* HF names that have no GGUF counterpart in names.c */
    if (m->source == MODEL_SRC_HF) {
        const char *hf_bad[] = {"self_attn.o_proj.bias", "mlp.gate_proj.bias",
                                "mlp.up_proj.bias", "mlp.down_proj.bias"};
        char hf[160];
        for (size_t i = 0; i < sizeof hf_bad / sizeof hf_bad[0]; i++) {
            snprintf(hf, sizeof hf, "model.layers.%d.%s", l, hf_bad[i]);
            if (st_find(m->st, hf))
                return err_set(e, WELD_ERR_UNSUPPORTED,
                               "%s: tensor '%s': this bias is not supported", where(m), hf);
        }
    }
    return WELD_OK;
}

/* QKV biases: required for qwen2; for other archs optional, but all three in every layer
   or in none (layer 0 decides, and sets cfg.qkv_bias). */
static int bind_biases(struct model *m, int l, struct weld_err *e)
{
    struct model_config *c = &m->cfg;
    struct layer_weights *L = &m->layers[l];
    int64_t qd = (int64_t)c->n_head * c->head_dim, kd = (int64_t)c->n_kv_head * c->head_dim;
    bool req = c->qkv_bias;
    int rc;
    if ((rc = bind(m, &L->bq, layer_name(m, l, 11, "attn_q.bias"), qd, 0, req, e)) ||
        (rc = bind(m, &L->bk, layer_name(m, l, 12, "attn_k.bias"), kd, 0, req, e)) ||
        (rc = bind(m, &L->bv, layer_name(m, l, 13, "attn_v.bias"), kd, 0, req, e)))
        return rc;
    int n = !!L->bq.data + !!L->bk.data + !!L->bv.data;
    char d[256];
    if (n == 3 && !c->qkv_bias) {
        if (l == 0) {
            c->qkv_bias = true;
            return WELD_OK;
        }
        return err_set(e, WELD_ERR_FORMAT,
                       "%s: tensor %s: layer %d has QKV biases but layer 0 has none",
                       where(m), disp(m, L->bq.name, d, sizeof d), l);
    }
    if (n == 0 || n == 3)
        return WELD_OK;
    const char *missing = !L->bq.data ? L->bq.name : !L->bk.data ? L->bk.name : L->bv.name;
    return err_set(e, WELD_ERR_FORMAT, "%s: tensor %s is missing (the layer has other QKV "
                   "biases)", where(m), disp(m, missing, d, sizeof d));
}

/* Slots 0-13: the dense tensors (and biases, bind_biases); 14-22 MoE; 23-30 MLA; 32-37
   nextn. */
static int bind_attn(struct model *m, int l, struct weld_err *e)
{
    const struct model_config *c = &m->cfg;
    struct layer_weights *L = &m->layers[l];
    int64_t qd = (int64_t)c->n_head * c->head_dim, kd = (int64_t)c->n_kv_head * c->head_dim;
    int64_t dim = c->dim;
    int rc;
    if ((rc = bind(m, &L->wq, layer_name(m, l, 1, "attn_q.weight"), dim, qd, true, e)) ||
        (rc = bind(m, &L->wk, layer_name(m, l, 2, "attn_k.weight"), dim, kd, true, e)) ||
        (rc = bind(m, &L->wv, layer_name(m, l, 3, "attn_v.weight"), dim, kd, true, e)) ||
        (rc = bind(m, &L->wo, layer_name(m, l, 4, "attn_output.weight"), qd, dim, true, e)) ||
        (rc = bind(m, &L->q_norm, layer_name(m, l, 9, "attn_q_norm.weight"), c->head_dim, 0,
                   c->qk_norm, e)) ||
        (rc = bind(m, &L->k_norm, layer_name(m, l, 10, "attn_k_norm.weight"), c->head_dim, 0,
                   c->qk_norm, e)))
        return rc;
    if (!c->qk_norm && (L->q_norm.data || L->k_norm.data)) {
        char d[256];
        return err_set(e, WELD_ERR_UNSUPPORTED, "%s: tensor %s: q/k norms are not used by %s",
                       where(m), disp(m, L->q_norm.data ? L->q_norm.name : L->k_norm.name, d,
                                      sizeof d),
                       model_arch_name(c->arch));
    }
    return bind_biases(m, l, e);
}

/* Latent attention: kv_b whole (HF, older GGUFs) or split into k_b / v_b (llama.cpp). */
static int bind_mla(struct model *m, int l, struct weld_err *e)
{
    const struct model_config *c = &m->cfg;
    struct layer_weights *L = &m->layers[l];
    int64_t dim = c->dim, nh = c->n_head, qd = nh * c->head_dim, lora = c->kv_lora_rank;
    int64_t ql = c->q_lora_rank;
    int rc;
    if (ql > 0) {
        if ((rc = bind(m, &L->wq_a, layer_name(m, l, 23, "attn_q_a.weight"), dim, ql, true, e)) ||
            (rc = bind(m, &L->q_a_norm, layer_name(m, l, 24, "attn_q_a_norm.weight"), ql, 0, true,
                       e)) ||
            (rc = bind(m, &L->wq_b, layer_name(m, l, 25, "attn_q_b.weight"), ql, qd, true, e)))
            return rc;
    } else if ((rc = bind(m, &L->wq, layer_name(m, l, 1, "attn_q.weight"), dim, qd, true, e))) {
        return rc;
    }
    if ((rc = bind(m, &L->wkv_a, layer_name(m, l, 26, "attn_kv_a_mqa.weight"), dim,
                   lora + c->rope_dim, true, e)) ||
        (rc = bind(m, &L->kv_a_norm, layer_name(m, l, 27, "attn_kv_a_norm.weight"), lora, 0, true,
                   e)) ||
        (rc = bind(m, &L->wkv_b, layer_name(m, l, 28, "attn_kv_b.weight"), lora,
                   nh * (c->qk_nope_dim + c->v_head_dim), false, e)) ||
        (rc = bind(m, &L->wo, layer_name(m, l, 4, "attn_output.weight"), nh * c->v_head_dim, dim,
                   true, e)))
        return rc;
    if (L->wkv_b.data || m->source == MODEL_SRC_HF) {
        if (!L->wkv_b.data)
            return bind(m, &L->wkv_b, L->wkv_b.name, lora, nh * (c->qk_nope_dim + c->v_head_dim),
                        true, e); /* the "missing" error */
        return WELD_OK;
    }
    if ((rc = bind3(m, &L->wk_b, layer_name(m, l, 29, "attn_k_b.weight"), c->qk_nope_dim, lora, nh,
                    true, e)))
        return rc;
    return bind3(m, &L->wv_b, layer_name(m, l, 30, "attn_v_b.weight"), lora, c->v_head_dim, nh,
                 true, e);
}

/* A layer's routed experts of one projection: n_expert views {ne0, ne1}. */
static int bind_experts(struct model *m, int l, enum expert_proj p, int64_t ne0, int64_t ne1,
                        struct weld_err *e)
{
    const struct model_config *c = &m->cfg;
    struct tensor *v = expert_views(m, l, p);
    static const char *const suffix[3] = {"ffn_gate_exps.weight", "ffn_up_exps.weight",
                                          "ffn_down_exps.weight"};
    char d[256];
    const char *name = layer_name(m, l, 16 + (int)p, suffix[p]);
    struct found f;
    int rc;
    if (m->source == MODEL_SRC_GGUF) {
        int64_t want[4] = {ne0, ne1, c->n_expert, 1};
        rc = lookup(m, name, &f, e);
        if (rc == WELD_ERR_NOT_FOUND) {
            char old[NAME_SLOT];
            snprintf(old, sizeof old, "blk.%d.ffn_%s.0.weight", l,
                     p == EXP_GATE ? "gate"
                     : p == EXP_UP ? "up"
                                   : "down");
            if (gguf_find_tensor(m->gguf, old))
                return err_set(e, WELD_ERR_UNSUPPORTED,
                               "%s: tensor '%s': per-expert tensors (the pre-2024 Mixtral "
                               "form) are not supported; reconvert the model with stacked "
                               "'%s'",
                               where(m), old, name);
            return err_set(e, WELD_ERR_FORMAT, "%s: tensor '%s' is missing", where(m), name);
        }
        if (rc != WELD_OK || (rc = check_found(m, name, &f, 3, want, e)))
            return rc;
        size_t per = f.nbytes / (size_t)c->n_expert;
        for (int x = 0; x < c->n_expert; x++) {
            v[x] = (struct tensor){name,
                                   (enum weld_dtype)f.type,
                                   2,
                                   {ne0, ne1, 1, 1},
                                   (const char *)f.data + (size_t)x * per,
                                   per};
        }
        return WELD_OK;
    }
    int64_t want[4] = {ne0, ne1, 1, 1};
    for (int x = 0; x < c->n_expert; x++) {
        char hf[160];
        tensor_name_expert_hf(l, x, p, style(m), hf, sizeof hf);
        snprintf(d, sizeof d, "'%s' (expert %d of %s)", hf, x, name);
        rc = lookup_hf(m, hf, d, &f, e);
        if (rc == WELD_ERR_NOT_FOUND)
            return err_set(e, WELD_ERR_FORMAT, "%s: tensor %s is missing", where(m), d);
        if (rc != WELD_OK || (rc = check_shown(m, d, &f, 2, want, e)))
            return rc;
        v[x] = (struct tensor){name,    (enum weld_dtype)f.type, 2, {ne0, ne1, 1, 1}, f.data,
                               f.nbytes};
    }
    return WELD_OK;
}

static int bind_moe(struct model *m, int l, struct weld_err *e)
{
    const struct model_config *c = &m->cfg;
    struct layer_weights *L = &m->layers[l];
    int64_t dim = c->dim, mf = c->moe_ffn_dim, sh = c->shared_ffn_dim;
    int rc;
    if ((rc = bind(m, &L->router, layer_name(m, l, 14, "ffn_gate_inp.weight"), dim, c->n_expert,
                   true, e)) ||
        (rc = bind(m, &L->exp_bias, layer_name(m, l, 15, "exp_probs_b.bias"), c->n_expert, 0,
                   c->expert_bias, e)) ||
        (rc = bind_experts(m, l, EXP_GATE, dim, mf, e)) ||
        (rc = bind_experts(m, l, EXP_UP, dim, mf, e)) ||
        (rc = bind_experts(m, l, EXP_DOWN, mf, dim, e)))
        return rc;
    L->exp_gate = expert_views(m, l, EXP_GATE);
    L->exp_up = expert_views(m, l, EXP_UP);
    L->exp_down = expert_views(m, l, EXP_DOWN);
    char d[256];
    if (L->exp_bias.data && !c->expert_bias)
        return err_set(e, WELD_ERR_FORMAT,
                       "%s: tensor %s: an expert selection bias, but the config has none "
                       "(layer %d has none)",
                       where(m), disp(m, L->exp_bias.name, d, sizeof d), c->n_dense_lead);
    if (sh > 0 &&
        ((rc = bind(m, &L->sh_gate, layer_name(m, l, 19, "ffn_gate_shexp.weight"), dim, sh, true,
                    e)) ||
         (rc = bind(m, &L->sh_up, layer_name(m, l, 20, "ffn_up_shexp.weight"), dim, sh, true, e)) ||
         (rc = bind(m, &L->sh_down, layer_name(m, l, 21, "ffn_down_shexp.weight"), sh, dim, true,
                    e))))
        return rc;
    if (c->shared_gate)
        return bind(m, &L->sh_gate_inp, layer_name(m, l, 22, "ffn_gate_inp_shexp.weight"), dim, 0,
                    true, e);
    return WELD_OK;
}

static int bind_layer(struct model *m, int l, struct weld_err *e)
{
    const struct model_config *c = &m->cfg;
    struct layer_weights *L = &m->layers[l];
    int64_t dim = c->dim, ffn = c->ffn_dim;
    int rc;
    if ((rc = bind(m, &L->attn_norm, layer_name(m, l, 0, "attn_norm.weight"), dim, 0, true, e)) ||
        (rc = c->kv_lora_rank > 0 ? bind_mla(m, l, e) : bind_attn(m, l, e)) ||
        (rc = bind(m, &L->ffn_norm, layer_name(m, l, 5, "ffn_norm.weight"), dim, 0, true, e)))
        return rc;
    if (model_layer_moe(c, l))
        rc = bind_moe(m, l, e);
    else if ((rc = bind(m, &L->w_gate, layer_name(m, l, 6, "ffn_gate.weight"), dim, ffn, true,
                        e)) ||
             (rc = bind(m, &L->w_up, layer_name(m, l, 7, "ffn_up.weight"), dim, ffn, true, e)))
        return rc;
    else
        rc = bind(m, &L->w_down, layer_name(m, l, 8, "ffn_down.weight"), ffn, dim, true, e);
    return rc ? rc : check_unsupported(m, l, e);
}

/* Multi-token-prediction layer l (>= n_layer): a decoder layer plus its own tensors. */
static int bind_nextn(struct model *m, int l, struct weld_err *e)
{
    const struct model_config *c = &m->cfg;
    struct nextn_weights *N = &m->nextn[l - c->n_layer];
    int64_t dim = c->dim, nv = c->n_vocab;
    int rc;
    if ((rc = bind_layer(m, l, e)) ||
        (rc = bind(m, &N->eh_proj, layer_name(m, l, 32, "nextn.eh_proj.weight"), 2 * dim, dim, true,
                   e)) ||
        (rc = bind(m, &N->enorm, layer_name(m, l, 33, "nextn.enorm.weight"), dim, 0, true, e)) ||
        (rc = bind(m, &N->hnorm, layer_name(m, l, 34, "nextn.hnorm.weight"), dim, 0, true, e)) ||
        (rc = bind(m, &N->shared_head_norm, layer_name(m, l, 35, "nextn.shared_head_norm.weight"),
                   dim, 0, true, e)) ||
        (rc = bind(m, &N->shared_head_head, layer_name(m, l, 36, "nextn.shared_head_head.weight"),
                   dim, nv, false, e)))
        return rc;
    return bind(m, &N->embed_tokens, layer_name(m, l, 37, "nextn.embed_tokens.weight"), dim, nv,
                false, e);
}

static int bind_rope_freqs(struct model *m, struct weld_err *e)
{
    const struct model_config *c = &m->cfg;
    int n = c->rope_dim / 2;
    struct tensor t;
    int rc = bind(m, &t, "rope_freqs.weight", n, 0, false, e);
    if (rc != WELD_OK)
        return rc;
    if (!t.data && c->rope_scaling != ROPE_SCALING_LLAMA3)
        return WELD_OK;
    m->rope_freq_factors = wmalloc((size_t)n * sizeof(float));
    if (!m->rope_freq_factors)
        return err_set(e, WELD_ERR_NOMEM, "%s: out of memory", where(m));
    if (!t.data) {
        model_config_llama3_freq_factors(c, m->rope_freq_factors);
        return WELD_OK;
    }
    dtype_dequantize_row(t.type, t.data, m->rope_freq_factors, n);
    for (int i = 0; i < n; i++)
        if (!(isfinite(m->rope_freq_factors[i]) && m->rope_freq_factors[i] > 0.0f))
            return err_set(e, WELD_ERR_FORMAT,
                           "%s: tensor 'rope_freqs.weight': element %d = %g must be > 0",
                           where(m), i, (double)m->rope_freq_factors[i]);
    return WELD_OK;
}

static int bind_all(struct model *m, struct weld_err *e)
{
    struct model_config *c = &m->cfg;
    size_t n_all = (size_t)n_layer_all(m);
    size_t layers_bytes = n_all * sizeof(struct layer_weights);
    size_t views_bytes = n_all * 3 * (size_t)c->n_expert * sizeof(struct tensor);
    size_t names_bytes = n_all * LAYER_NAMES * NAME_SLOT;
    m->layers = wcalloc(1, layers_bytes + views_bytes + names_bytes);
    if (!m->layers)
        return err_set(e, WELD_ERR_NOMEM, "%s: out of memory", where(m));
    if (c->n_nextn && !(m->nextn = wcalloc((size_t)c->n_nextn, sizeof *m->nextn)))
        return err_set(e, WELD_ERR_NOMEM, "%s: out of memory", where(m));
    int rc;
    if ((rc = bind(m, &m->tok_embd, "token_embd.weight", c->dim, c->n_vocab, true, e)) ||
        (rc = bind(m, &m->output_norm, "output_norm.weight", c->dim, 0, true, e)))
        return rc;
    if (c->tied_embeddings) {
        m->output = m->tok_embd;
    } else if ((rc = bind(m, &m->output, "output.weight", c->dim, c->n_vocab, true, e))) {
        return rc;
    }
    struct progress p;
    progress_start(&p, "checking weights", (uint64_t)n_all);
    for (int l = 0; l < (int)n_all && rc == WELD_OK; l++) {
        rc = l < c->n_layer ? bind_layer(m, l, e) : bind_nextn(m, l, e);
        progress_update(&p, (uint64_t)l + 1);
    }
    progress_end(&p);
    if (rc == WELD_OK)
        rc = bind_rope_freqs(m, e);
    return rc;
}

/* Is `name` (GGUF style) one of the tensors bind_all looks at? */
static bool is_used(const struct model *m, const char *name)
{
    char hf[160];
    if (strcmp(name, "rope_freqs.weight") == 0)
        return true;
    if (strcmp(name, "output.weight") == 0)
        return !m->cfg.tied_embeddings;
    int l, x;
    enum expert_proj p;
    if (tensor_name_expert_parse(name, &l, &x, &p) == 0)
        return m->cfg.n_expert > 0 && l < n_layer_all(m) && x < m->cfg.n_expert;
    if (tensor_name_gguf_to_hf(name, hf, sizeof hf) != 0 && !strstr(name, ".attn_k_b.") &&
        !strstr(name, ".attn_v_b."))
        return false;
    if (sscanf(name, "blk.%d.", &l) == 1)
        return l < n_layer_all(m);
    return true;
}

static void log_unused(const struct model *m)
{
    if (log_get_level() < LOG_DEBUG)
        return;
    char gg[160];
    if (m->source == MODEL_SRC_GGUF) {
        for (uint64_t i = 0; i < m->gguf->n_tensors; i++)
            if (!is_used(m, m->gguf->tensors[i].name))
                log_debug("%s: ignoring tensor '%s'", where(m), m->gguf->tensors[i].name);
        return;
    }
    for (int i = 0; i < m->st->n_tensors; i++) {
        const char *hf = m->st->tensors[i].name;
        int l, x;
        enum expert_proj p;
        if (tensor_name_expert_parse(hf, &l, &x, &p) == 0 && is_used(m, hf))
            continue;
        if (tensor_name_hf_to_gguf(hf, gg, sizeof gg) != 0 || !is_used(m, gg))
            log_debug("%s: ignoring tensor '%s'", where(m), hf);
    }
}

static int open_source(struct model *m, const char *path, struct weld_err *e)
{
    struct stat st;
    if (stat(path, &st) != 0)
        return err_set(e, WELD_ERR_NOT_FOUND, "%s: no such file or directory", path);
    int rc;
    if (S_ISDIR(st.st_mode)) {
        m->source = MODEL_SRC_HF;
        m->dir = wstrdup(path);
        if (!m->dir)
            return err_set(e, WELD_ERR_NOMEM, "%s: out of memory", path);
        if ((rc = model_config_from_hf(path, &m->cfg, e)))
            return rc;
        return st_open_dir(&m->st, path, e);
    }
    m->source = MODEL_SRC_GGUF;
    const char *slash = strrchr(path, '/');
    m->dir = slash ? wstrndup(path, slash == path ? 1 : (size_t)(slash - path)) : wstrdup(".");
    if (!m->dir)
        return err_set(e, WELD_ERR_NOMEM, "%s: out of memory", path);
    if ((rc = gguf_open(&m->gguf, path, e)))
        return rc;
    return model_config_from_gguf(m->gguf, &m->cfg, e);
}

int model_load(struct model **out, const char *path, struct weld_err *e)
{
    *out = NULL;
    struct model *m = wcalloc(1, sizeof *m);
    if (!m)
        return err_set(e, WELD_ERR_NOMEM, "%s: out of memory", path);
    m->path = wstrdup(path);
    if (!m->path) {
        wfree(m);
        return err_set(e, WELD_ERR_NOMEM, "%s: out of memory", path);
    }
    char where[4096];
    int rc = model_resolve_path(path, where, sizeof where, e);
    if (rc == WELD_OK)
        rc = open_source(m, where, e);
    if (rc == WELD_OK)
        rc = bind_all(m, e);
    if (rc != WELD_OK) {
        model_free(m);
        return rc;
    }
    log_unused(m);
    log_debug("%s: %s model, %d layers, dim %d, %.1f MB of weights", path,
              model_arch_name(m->cfg.arch), m->cfg.n_layer, m->cfg.dim,
              (double)model_weight_bytes(m) / 1e6);
    *out = m;
    return WELD_OK;
}

void model_free(struct model *m)
{
    if (!m)
        return;
    gguf_close(m->gguf);
    st_close(m->st);
    wfree(m->rope_freq_factors);
    wfree(m->layers);
    wfree(m->nextn);
    wfree(m->dir);
    wfree(m->path);
    wfree(m);
}

void model_mtp_view(const struct model *m, int i, struct model *view)
{
    const struct nextn_weights *N = &m->nextn[i];
    const int l = m->cfg.n_layer + i;
    *view = *m;
    view->cfg.n_layer = 1;
    view->cfg.n_nextn = 0;
    view->cfg.n_dense_lead = model_layer_moe(&m->cfg, l) ? 0 : 1;
    view->layers = m->layers + l;
    view->nextn = NULL;
    view->output_norm = N->shared_head_norm;
    if (N->shared_head_head.data)
        view->output = N->shared_head_head;
    if (N->embed_tokens.data)
        view->tok_embd = N->embed_tokens;
    view->cfg.tied_embeddings = view->output.data == view->tok_embd.data;
}

static size_t layer_bytes(const struct layer_weights *L, int n_expert)
{
    const struct tensor *ts[] = {&L->attn_norm, &L->wq,       &L->wk,       &L->wv,
                                 &L->bq,        &L->bk,       &L->bv,       &L->q_norm,
                                 &L->k_norm,    &L->wo,       &L->ffn_norm, &L->w_gate,
                                 &L->w_up,      &L->w_down,   &L->router,   &L->exp_bias,
                                 &L->sh_gate,   &L->sh_up,    &L->sh_down,  &L->sh_gate_inp,
                                 &L->wq_a,      &L->q_a_norm, &L->wq_b,     &L->wkv_a,
                                 &L->kv_a_norm, &L->wkv_b,    &L->wk_b,     &L->wv_b};
    size_t n = 0;
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
        if (ts[i]->data)
            n += ts[i]->nbytes;
    for (int x = 0; L->exp_gate && x < n_expert; x++)
        n += L->exp_gate[x].nbytes + L->exp_up[x].nbytes + L->exp_down[x].nbytes;
    return n;
}

size_t model_weight_bytes(const struct model *m)
{
    size_t n = m->tok_embd.nbytes + m->output_norm.nbytes;
    if (m->output.data && m->output.data != m->tok_embd.data)
        n += m->output.nbytes;
    for (int l = 0; m->layers && l < m->cfg.n_layer; l++)
        n += layer_bytes(&m->layers[l], m->cfg.n_expert);
    return n;
}

int model_release_pages(const struct model *m, const void *p, size_t n)
{
    if (m->source == MODEL_SRC_GGUF)
        return m->gguf ? mfile_release(&m->gguf->map, p, n) : 0;
    for (int i = 0; m->st && i < m->st->n_files; i++)
        if (mfile_release(&m->st->maps[i], p, n))
            return 1;
    return 0;
}

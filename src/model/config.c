/*
 * config - reading, checking and writing struct model_config (see config.h).
 *
 * Three sources of truth, one struct:
 *   GGUF   model_config_from_gguf: general.architecture picks the key prefix A; the keys
 *          and their defaults follow llama.cpp's llama_model::load_hparams (head_dim =
 *          dim / n_head unless A.attention.key_length, n_kv_head = n_head, rope_dim =
 *          head_dim, rope_theta 10000, rms eps 1e-5 when absent). Per-layer arrays for
 *          head counts and FFN length are accepted only when every layer has the same value.
 *   HF     model_config_from_hf_json: transformers' LlamaConfig / MistralConfig /
 *          Qwen2Config / Qwen3Config field names and defaults. HF checkpoints always use
 *          rotate-half rope, so rope_neox = true.
 *   check  model_config_validate: ranges that keep every size product of the executor in
 *          comfortable int64 territory; both readers call it before returning.
 *
 * Llama 3 rope scaling: llama.cpp keeps no keys for it, only the tensor rope_freqs.weight.
 * So from_gguf reports ROPE_SCALING_LLAMA3 only when weld's own keys (weld.rope.llama3.*,
 * written by model_config_to_gguf and ignored by llama.cpp) are present; otherwise the
 * model loader reads the tensor. The writer never writes rope.scaling.type "llama3", which
 * llama.cpp would reject.
 *
 * Experts and MLA: gguf_read_moe / gguf_read_mla and hf_read_experts; llama.cpp
 * hard-codes the renormalisation of qwen3moe (on), qwen2moe (off) and Mixtral (on), so an
 * HF config asking otherwise is refused rather than written to a GGUF that would run
 * differently. DeepSeek groups with topk_group == n_group (no restriction) are written as
 * no groups (llama.cpp asserts used < count).
 *
 * Not handled (reported as WELD_ERR_UNSUPPORTED): longrope / dynamic rope scaling, yarn
 * outside deepseek2, per-layer differing head counts, biases other than qwen2's QKV bias,
 * MLP activations other than SiLU, value heads of a different size than key heads (but
 * MLA's), dense layers among sparse ones (decoder_sparse_step, mlp_only_layers,
 * moe_layer_freq).
 */
#include "model/config.h"

#include "core/alloc.h"
#include "core/mfile.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GGUF_LLAMA3_PREFIX "weld.rope.llama3."

static const char *const arch_names[ARCH_COUNT] = {"llama",    "qwen2",    "qwen3",
                                                   "qwen3moe", "qwen2moe", "deepseek2"};
static const char *const arch_hf_classes[ARCH_COUNT] = {
    "LlamaForCausalLM",    "Qwen2ForCausalLM",    "Qwen3ForCausalLM",
    "Qwen3MoeForCausalLM", "Qwen2MoeForCausalLM", "DeepseekV3ForCausalLM"};
/* HF model_type per arch (config.json spells them with underscores) */
static const char *const arch_hf_types[ARCH_COUNT] = {"llama",     "qwen2",     "qwen3",
                                                      "qwen3_moe", "qwen2_moe", "deepseek_v3"};
/* Other HF names for the same archs: model_type or class -> arch */
static const struct {
    const char *name;
    enum model_arch arch;
} hf_aliases[] = {
    {"mistral", ARCH_LLAMA},         {"MistralForCausalLM", ARCH_LLAMA},
    {"mixtral", ARCH_LLAMA},         {"MixtralForCausalLM", ARCH_LLAMA},
    {"deepseek_v2", ARCH_DEEPSEEK2}, {"DeepseekV2ForCausalLM", ARCH_DEEPSEEK2},
    {"kimi_k2", ARCH_DEEPSEEK2},
};
#define SUPPORTED_ARCHS "llama, qwen2, qwen3, qwen3moe, qwen2moe, deepseek2"

const char *model_arch_name(enum model_arch a)
{
    if ((unsigned)a >= ARCH_COUNT)
        return "unknown";
    return arch_names[a];
}

int model_arch_from_name(const char *name)
{
    for (int i = 0; name && i < ARCH_COUNT; i++)
        if (strcmp(name, arch_names[i]) == 0)
            return i;
    return -1;
}

/* ------------------------------------------------------------------------------------ */
/* GGUF                                                                                 */
/* ------------------------------------------------------------------------------------ */

/* Copy a gguf string into buf as a C string; 0 if it fits and has no NUL, else -1. */
static int gstr_copy(struct gguf_str s, char *buf, size_t n)
{
    if (s.len >= n || (s.len && memchr(s.ptr, '\0', (size_t)s.len)))
        return -1;
    if (s.len)
        memcpy(buf, s.ptr, (size_t)s.len);
    buf[s.len] = '\0';
    return 0;
}

/* Integer key "<arch>.<suffix>", in [0, INT_MAX]. A numeric array (per-layer values) is
   accepted when it has n_layer elements that are all equal. NOT_FOUND leaves *out alone. */
static int gkey_int(const struct gguf_file *f, const char *arch, const char *suffix,
                    int n_layer, int *out, struct weld_err *e)
{
    char key[160];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    const struct gguf_kv *kv = gguf_find_kv(f, key);
    if (!kv)
        return WELD_ERR_NOT_FOUND;
    int64_t v;
    if (kv->type == GGUF_TYPE_ARRAY) {
        if (!kv->arr_data || kv->arr_type == GGUF_TYPE_STRING || kv->arr_type == GGUF_TYPE_BOOL
            || kv->arr_n == 0)
            return err_set(e, WELD_ERR_FORMAT, "%s: key '%s': expected an integer", f->path,
                           key);
        if (n_layer > 0 && kv->arr_n != (uint64_t)n_layer)
            return err_set(e, WELD_ERR_FORMAT,
                           "%s: key '%s': per-layer array has %llu elements, expected %d",
                           f->path, key, (unsigned long long)kv->arr_n, n_layer);
        v = gguf_arr_i64(kv, 0);
        for (uint64_t i = 1; i < kv->arr_n; i++)
            if (gguf_arr_i64(kv, i) != v)
                return err_set(e, WELD_ERR_UNSUPPORTED,
                               "%s: key '%s': layers with different values are not supported",
                               f->path, key);
    } else {
        int rc = gguf_get_i64(f, key, &v, e);
        if (rc != WELD_OK)
            return rc;
    }
    if (v < 0 || v > INT_MAX)
        return err_set(e, WELD_ERR_FORMAT, "%s: key '%s': value %lld out of range", f->path,
                       key, (long long)v);
    *out = (int)v;
    return WELD_OK;
}

static int gkey_f32(const struct gguf_file *f, const char *arch, const char *suffix,
                    float *out, struct weld_err *e)
{
    char key[160];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    return gguf_get_f32(f, key, out, e);
}

/* rc is WELD_OK or NOT_FOUND for optional keys; anything else is passed up. */
#define OPTIONAL(call)                                                                      \
    do {                                                                                    \
        int rc_ = (call);                                                                   \
        if (rc_ != WELD_OK && rc_ != WELD_ERR_NOT_FOUND)                                    \
            return rc_;                                                                     \
    } while (0)

static int required(int rc, const struct gguf_file *f, const char *arch, const char *suffix,
                    struct weld_err *e)
{
    if (rc == WELD_ERR_NOT_FOUND)
        return err_set(e, WELD_ERR_FORMAT, "%s: missing key '%s.%s'", f->path, arch, suffix);
    return rc;
}

static int gguf_read_arch(const struct gguf_file *f, struct model_config *c, char *arch,
                          size_t arch_len, struct weld_err *e)
{
    struct gguf_str s;
    int rc = gguf_get_str(f, "general.architecture", &s, e);
    if (rc == WELD_ERR_NOT_FOUND)
        return err_set(e, WELD_ERR_FORMAT, "%s: missing key 'general.architecture'", f->path);
    if (rc != WELD_OK)
        return rc;
    if (gstr_copy(s, arch, arch_len) != 0)
        return err_set(e, WELD_ERR_UNSUPPORTED,
                       "%s: general.architecture is not a supported name (supported: %s)",
                       f->path, SUPPORTED_ARCHS);
    int a = model_arch_from_name(arch);
    if (a < 0)
        return err_set(e, WELD_ERR_UNSUPPORTED,
                       "%s: architecture '%s' is not supported (supported: %s)", f->path, arch,
                       SUPPORTED_ARCHS);
    c->arch = (enum model_arch)a;
    if (gguf_get_str(f, "general.name", &s, NULL) == WELD_OK) {
        s.len = s.len < sizeof c->name ? s.len : sizeof c->name - 1; /* truncate */
        if (gstr_copy(s, c->name, sizeof c->name) != 0)
            c->name[0] = '\0';
    }
    return WELD_OK;
}

static int gguf_read_sizes(const struct gguf_file *f, const char *a, struct model_config *c,
                           struct weld_err *e)
{
    int rc;
    if ((rc = required(gkey_int(f, a, "block_count", 0, &c->n_layer, e), f, a, "block_count",
                       e)))
        return rc;
    if ((rc = required(gkey_int(f, a, "embedding_length", 0, &c->dim, e), f, a,
                       "embedding_length", e)))
        return rc;
    if ((rc = required(gkey_int(f, a, "feed_forward_length", c->n_layer, &c->ffn_dim, e), f,
                       a, "feed_forward_length", e)))
        return rc;
    if ((rc = required(gkey_int(f, a, "attention.head_count", c->n_layer, &c->n_head, e), f,
                       a, "attention.head_count", e)))
        return rc;
    if ((rc = required(gkey_int(f, a, "context_length", 0, &c->max_ctx, e), f, a,
                       "context_length", e)))
        return rc;
    if (c->n_head <= 0)
        return err_set(e, WELD_ERR_FORMAT, "%s: key '%s.attention.head_count' must be > 0",
                       f->path, a);
    c->n_kv_head = c->n_head;
    OPTIONAL(gkey_int(f, a, "attention.head_count_kv", c->n_layer, &c->n_kv_head, e));
    c->head_dim = c->dim / c->n_head;
    OPTIONAL(gkey_int(f, a, "attention.key_length", 0, &c->head_dim, e));
    int v_len = c->head_dim;
    OPTIONAL(gkey_int(f, a, "attention.value_length", 0, &v_len, e));
    if (v_len != c->head_dim && c->arch != ARCH_DEEPSEEK2)
        return err_set(e, WELD_ERR_UNSUPPORTED,
                       "%s: key '%s.attention.value_length' = %d differs from key_length %d",
                       f->path, a, v_len, c->head_dim);
    c->v_head_dim = v_len;
    c->rope_dim = c->head_dim;
    OPTIONAL(gkey_int(f, a, "rope.dimension_count", 0, &c->rope_dim, e));
    OPTIONAL(gkey_int(f, a, "attention.sliding_window", 0, &c->sliding_window, e));
    c->norm_eps = 1e-5f;
    OPTIONAL(gkey_f32(f, a, "attention.layer_norm_rms_epsilon", &c->norm_eps, e));
    c->rope_theta = 10000.0f;
    OPTIONAL(gkey_f32(f, a, "rope.freq_base", &c->rope_theta, e));
    return WELD_OK;
}

static int gkey_bool(const struct gguf_file *f, const char *arch, const char *suffix, bool *out,
                     struct weld_err *e)
{
    char key[160];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    return gguf_get_bool(f, key, out, e);
}

/* Experts (llama.cpp's load_hparams plus each arch's load_arch_hparams). */
static int gguf_read_moe(const struct gguf_file *f, const char *a, struct model_config *c,
                         struct weld_err *e)
{
    int rc;
    OPTIONAL(gkey_int(f, a, "expert_count", 0, &c->n_expert, e));
    OPTIONAL(gkey_int(f, a, "expert_used_count", 0, &c->n_expert_used, e));
    c->expert_scale = 1.0f;
    if (c->n_expert == 0 && c->arch != ARCH_QWEN3MOE && c->arch != ARCH_QWEN2MOE &&
        c->arch != ARCH_DEEPSEEK2)
        return WELD_OK;
    OPTIONAL(gkey_int(f, a, "expert_group_count", 0, &c->n_group, e));
    OPTIONAL(gkey_int(f, a, "expert_group_used_count", 0, &c->topk_group, e));
    c->gating = MOE_GATING_SOFTMAX;
    /* llama.cpp's fallback for a missing expert length: n_ff / n_expert_used (qwen), n_ff
       (llama, whose experts are feed_forward_length wide) */
    c->moe_ffn_dim = c->arch == ARCH_LLAMA || !c->n_expert_used ? c->ffn_dim
                                                                : c->ffn_dim / c->n_expert_used;
    if (c->arch == ARCH_DEEPSEEK2)
        rc = required(gkey_int(f, a, "expert_feed_forward_length", 0, &c->moe_ffn_dim, e), f, a,
                      "expert_feed_forward_length", e);
    else
        rc = gkey_int(f, a, "expert_feed_forward_length", 0, &c->moe_ffn_dim, e);
    if (rc != WELD_OK && rc != WELD_ERR_NOT_FOUND)
        return rc;
    switch (c->arch) {
    case ARCH_LLAMA: /* Mixtral */
    case ARCH_QWEN3MOE:
        c->expert_norm = true; /* llama.cpp passes norm_w = true for both */
        break;
    case ARCH_QWEN2MOE:
        c->expert_norm = false;
        c->n_shared_expert = 1;
        c->shared_gate = true;
        c->shared_ffn_dim = c->ffn_dim;
        OPTIONAL(gkey_int(f, a, "expert_shared_feed_forward_length", 0, &c->shared_ffn_dim, e));
        break;
    default: { /* deepseek2 */
        if ((rc = required(gkey_int(f, a, "expert_shared_count", 0, &c->n_shared_expert, e), f, a,
                           "expert_shared_count", e)))
            return rc;
        c->shared_ffn_dim = c->n_shared_expert * c->moe_ffn_dim;
        OPTIONAL(gkey_int(f, a, "leading_dense_block_count", 0, &c->n_dense_lead, e));
        OPTIONAL(gkey_bool(f, a, "expert_weights_norm", &c->expert_norm, e));
        float scale = 0.0f;
        OPTIONAL(gkey_f32(f, a, "expert_weights_scale", &scale, e));
        c->expert_scale = scale == 0.0f ? 1.0f : scale;
        int g = 0;
        OPTIONAL(gkey_int(f, a, "expert_gating_func", 0, &g, e));
        if (g == 0)
            g = MOE_GATING_SOFTMAX; /* llama.cpp: DeepSeek V2 GGUFs predate the key */
        if (g != MOE_GATING_SOFTMAX && g != MOE_GATING_SIGMOID)
            return err_set(e, WELD_ERR_UNSUPPORTED,
                           "%s: key '%s.expert_gating_func' = %d is not supported (1 softmax, "
                           "2 sigmoid)",
                           f->path, a, g);
        c->gating = (enum moe_gating)g;
        /* exp_probs_b is optional in llama.cpp: its presence turns the bias on */
        char name[64];
        snprintf(name, sizeof name, "blk.%d.exp_probs_b.bias", c->n_dense_lead);
        c->expert_bias = gguf_find_tensor(f, name) != NULL;
    }
    }
    return WELD_OK;
}

/* Multi-head latent attention. llama.cpp's converter (81ff7abe) writes the MQA view:
   head_count_kv 1, key_length kv_lora_rank + rope, value_length kv_lora_rank, and the
   per-head sizes as key_length_mla / value_length_mla; older files have key_length /
   value_length = the per-head sizes and no *_mla keys. */
static int gguf_read_mla(const struct gguf_file *f, const char *a, struct model_config *c,
                         struct weld_err *e)
{
    int rc;
    OPTIONAL(gkey_int(f, a, "attention.q_lora_rank", 0, &c->q_lora_rank, e));
    if ((rc = required(gkey_int(f, a, "attention.kv_lora_rank", 0, &c->kv_lora_rank, e), f, a,
                       "attention.kv_lora_rank", e)))
        return rc;
    int k_mla = 0, v_mla = 0;
    OPTIONAL(gkey_int(f, a, "attention.key_length_mla", 0, &k_mla, e));
    OPTIONAL(gkey_int(f, a, "attention.value_length_mla", 0, &v_mla, e));
    if (!!k_mla != !!v_mla)
        return err_set(e, WELD_ERR_FORMAT,
                       "%s: keys '%s.attention.key_length_mla' and 'value_length_mla' come "
                       "together",
                       f->path, a);
    if (k_mla) {
        if (c->head_dim != c->kv_lora_rank + c->rope_dim || c->v_head_dim != c->kv_lora_rank)
            return err_set(e, WELD_ERR_FORMAT,
                           "%s: key '%s.attention.key_length' = %d / value_length = %d: "
                           "expected kv_lora_rank + rope dims = %d / kv_lora_rank = %d",
                           f->path, a, c->head_dim, c->v_head_dim, c->kv_lora_rank + c->rope_dim,
                           c->kv_lora_rank);
        c->head_dim = k_mla;
        c->v_head_dim = v_mla;
    }
    c->n_kv_head = c->n_head; /* the MQA view's single kv head is the latent */
    c->qk_nope_dim = c->head_dim - c->rope_dim;
    float log_mul = 0.0f;
    OPTIONAL(gkey_f32(f, a, "rope.scaling.yarn_log_multiplier", &log_mul, e));
    c->yarn_log_mul = log_mul;
    /* block_count includes the multi-token-prediction layers when this key is present
       (llama.cpp's own deepseek2 converter drops them and writes no key) */
    OPTIONAL(gkey_int(f, a, "nextn_predict_layers", 0, &c->n_nextn, e));
    if (c->n_nextn >= c->n_layer)
        return err_set(e, WELD_ERR_FORMAT,
                       "%s: key '%s.nextn_predict_layers' = %d leaves no layers of %d", f->path, a,
                       c->n_nextn, c->n_layer);
    c->n_layer -= c->n_nextn;
    return WELD_OK;
}

static int gguf_read_vocab(const struct gguf_file *f, const char *a, struct model_config *c,
                           struct weld_err *e)
{
    int rc = gkey_int(f, a, "vocab_size", 0, &c->n_vocab, e);
    if (rc != WELD_ERR_NOT_FOUND)
        return rc;
    const struct gguf_kv *kv = gguf_find_kv(f, "tokenizer.ggml.tokens");
    if (kv && kv->type == GGUF_TYPE_ARRAY) {
        if (kv->arr_n > INT_MAX)
            return err_set(e, WELD_ERR_FORMAT, "%s: key 'tokenizer.ggml.tokens': %llu tokens",
                           f->path, (unsigned long long)kv->arr_n);
        c->n_vocab = (int)kv->arr_n;
        return WELD_OK;
    }
    const struct gguf_tensor *t = gguf_find_tensor(f, "token_embd.weight");
    if (t && t->n_dims == 2 && t->ne[1] > 0 && t->ne[1] <= INT_MAX) {
        c->n_vocab = (int)t->ne[1];
        return WELD_OK;
    }
    return err_set(e, WELD_ERR_FORMAT,
                   "%s: cannot tell the vocabulary size (no '%s.vocab_size', no "
                   "'tokenizer.ggml.tokens', no 2-D 'token_embd.weight')",
                   f->path, a);
}

/* weld.rope.llama3.* keys: all four or none. */
static int gguf_read_llama3(const struct gguf_file *f, struct model_config *c,
                            struct weld_err *e)
{
    int n_found = 0, rc;
    float *dst[3] = {&c->rope_factor, &c->rope_low_freq_factor, &c->rope_high_freq_factor};
    const char *names[3] = {"factor", "low_freq_factor", "high_freq_factor"};
    for (int i = 0; i < 3; i++) {
        rc = gkey_f32(f, "weld.rope.llama3", names[i], dst[i], e);
        if (rc == WELD_OK)
            n_found++;
        else if (rc != WELD_ERR_NOT_FOUND)
            return rc;
    }
    rc = gkey_int(f, "weld.rope.llama3", "original_context_length", 0, &c->rope_orig_ctx, e);
    if (rc == WELD_OK)
        n_found++;
    else if (rc != WELD_ERR_NOT_FOUND)
        return rc;
    if (n_found == 0)
        return WELD_OK;
    if (n_found != 4)
        return err_set(e, WELD_ERR_FORMAT,
                       "%s: keys '" GGUF_LLAMA3_PREFIX "*': need all of factor, "
                       "low_freq_factor, high_freq_factor, original_context_length",
                       f->path);
    c->rope_scaling = ROPE_SCALING_LLAMA3;
    return WELD_OK;
}

static int gguf_read_rope_scaling(const struct gguf_file *f, const char *a,
                                  struct model_config *c, struct weld_err *e)
{
    char key[160], type[32] = "linear";
    snprintf(key, sizeof key, "%s.rope.scaling.type", a);
    struct gguf_str s;
    int rc = gguf_get_str(f, key, &s, e);
    if (rc != WELD_OK && rc != WELD_ERR_NOT_FOUND)
        return rc;
    if (rc == WELD_OK && gstr_copy(s, type, sizeof type) != 0)
        return err_set(e, WELD_ERR_UNSUPPORTED, "%s: key '%s': unknown rope scaling type",
                       f->path, key);
    bool yarn = strcmp(type, "yarn") == 0 && c->arch == ARCH_DEEPSEEK2;
    if (strcmp(type, "none") != 0 && strcmp(type, "linear") != 0 && !yarn)
        return err_set(e, WELD_ERR_UNSUPPORTED,
                       "%s: key '%s': rope scaling '%s' is not supported (supported: none, "
                       "linear, llama3 via rope_freqs.weight, yarn for deepseek2)",
                       f->path, key, type);
    float factor = 0.0f;
    rc = gkey_f32(f, a, "rope.scaling.factor", &factor, e);
    if (rc == WELD_ERR_NOT_FOUND)
        rc = gkey_f32(f, a, "rope.scale_linear", &factor, e);
    if (rc != WELD_OK && rc != WELD_ERR_NOT_FOUND)
        return rc;
    if (yarn) { /* defaults as llama.cpp's hparams */
        c->rope_scaling = ROPE_SCALING_YARN;
        c->rope_factor = factor == 0.0f ? 1.0f : factor;
        c->rope_orig_ctx = c->max_ctx;
        c->yarn_beta_fast = 32.0f;
        c->yarn_beta_slow = 1.0f;
        OPTIONAL(gkey_int(f, a, "rope.scaling.original_context_length", 0, &c->rope_orig_ctx, e));
        OPTIONAL(gkey_f32(f, a, "rope.scaling.yarn_beta_fast", &c->yarn_beta_fast, e));
        OPTIONAL(gkey_f32(f, a, "rope.scaling.yarn_beta_slow", &c->yarn_beta_slow, e));
        return WELD_OK;
    }
    if (strcmp(type, "linear") == 0 && factor != 0.0f && factor != 1.0f) {
        c->rope_scaling = ROPE_SCALING_LINEAR;
        c->rope_factor = factor;
        return WELD_OK;
    }
    return gguf_read_llama3(f, c, e);
}

int model_config_from_gguf(const struct gguf_file *f, struct model_config *c,
                           struct weld_err *e)
{
    char arch[64];
    memset(c, 0, sizeof *c);
    int rc = gguf_read_arch(f, c, arch, sizeof arch, e);
    if (rc == WELD_OK)
        rc = gguf_read_sizes(f, arch, c, e);
    if (rc == WELD_OK)
        rc = gguf_read_vocab(f, arch, c, e);
    if (rc == WELD_OK && c->arch == ARCH_DEEPSEEK2)
        rc = gguf_read_mla(f, arch, c, e);
    if (rc == WELD_OK)
        rc = gguf_read_moe(f, arch, c, e);
    if (rc == WELD_OK)
        rc = gguf_read_rope_scaling(f, arch, c, e);
    if (rc != WELD_OK)
        return rc;
    /* GGUF llama: Q/K rows permuted by the converter; deepseek2: never permuted, and both
       HF and GGUF rotate adjacent pairs (see config.h) */
    c->rope_neox = c->arch != ARCH_LLAMA && c->arch != ARCH_DEEPSEEK2;
    c->qkv_bias = c->arch == ARCH_QWEN2 || c->arch == ARCH_QWEN2MOE;
    c->qk_norm = c->arch == ARCH_QWEN3 || c->arch == ARCH_QWEN3MOE;
    c->tied_embeddings = gguf_find_tensor(f, "output.weight") == NULL;
    return model_config_validate(c, f->path, e);
}

/* ------------------------------------------------------------------------------------ */
/* Hugging Face config.json                                                             */
/* ------------------------------------------------------------------------------------ */

/* An integer field in [0, INT_MAX] (JSON reals with an integral value are accepted). */
static int hf_int(const json_t *o, const char *key, int *out, const char *where,
                  struct weld_err *e)
{
    const json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v))
        return WELD_ERR_NOT_FOUND;
    double d;
    if (json_is_integer(v))
        d = (double)json_integer_value(v);
    else if (json_is_real(v) && floor(json_real_value(v)) == json_real_value(v))
        d = json_real_value(v);
    else
        return err_set(e, WELD_ERR_FORMAT, "%s: field '%s' must be an integer", where, key);
    if (!(d >= 0 && d <= INT_MAX))
        return err_set(e, WELD_ERR_FORMAT, "%s: field '%s' = %.17g is out of range", where,
                       key, d);
    *out = (int)d;
    return WELD_OK;
}

static int hf_req_int(const json_t *o, const char *key, int *out, const char *where,
                      struct weld_err *e)
{
    int rc = hf_int(o, key, out, where, e);
    if (rc == WELD_ERR_NOT_FOUND)
        return err_set(e, WELD_ERR_FORMAT, "%s: missing field '%s'", where, key);
    return rc;
}

static int hf_float(const json_t *o, const char *key, float *out, const char *where,
                    struct weld_err *e)
{
    double d;
    int rc = jget_double(o, key, &d, where, e);
    if (rc != WELD_OK)
        return rc;
    if (!isfinite(d) || fabs(d) > 3.0e38)
        return err_set(e, WELD_ERR_FORMAT, "%s: field '%s' = %g is out of range", where, key,
                       d);
    *out = (float)d;
    return WELD_OK;
}

/* An HF model_type or class name -> arch, or -1. */
static int hf_arch_lookup(const char *name)
{
    for (int i = 0; i < ARCH_COUNT; i++)
        if (strcmp(name, arch_hf_types[i]) == 0 || strcmp(name, arch_hf_classes[i]) == 0)
            return i;
    for (size_t i = 0; i < sizeof hf_aliases / sizeof hf_aliases[0]; i++)
        if (strcmp(name, hf_aliases[i].name) == 0)
            return (int)hf_aliases[i].arch;
    /* weld before MoE support wrote the GGUF arch names as model_type */
    return model_arch_from_name(name);
}

/* model_type first, then architectures[0]. */
static int hf_read_arch(const json_t *root, struct model_config *c, const char *where,
                        struct weld_err *e)
{
    const char *mt = NULL;
    int rc = jget_str(root, "model_type", &mt, where, e);
    if (rc != WELD_OK && rc != WELD_ERR_NOT_FOUND)
        return rc;
    if (mt) {
        int a = hf_arch_lookup(mt);
        if (a < 0)
            return err_set(e, WELD_ERR_UNSUPPORTED,
                           "%s: model_type '%s' is not supported (supported: llama, mistral, "
                           "mixtral, qwen2, qwen3, qwen2_moe, qwen3_moe, deepseek_v2, "
                           "deepseek_v3, kimi_k2)",
                           where, mt);
        c->arch = (enum model_arch)a;
        return WELD_OK;
    }
    const json_t *archs = json_object_get(root, "architectures");
    const json_t *a0 = json_is_array(archs) ? json_array_get(archs, 0) : NULL;
    if (!json_is_string(a0))
        return err_set(e, WELD_ERR_FORMAT,
                       "%s: neither 'model_type' nor 'architectures' names the model", where);
    const char *cls = json_string_value(a0);
    int a = hf_arch_lookup(cls);
    if (a >= 0 && strstr(cls, "ForCausalLM")) {
        c->arch = (enum model_arch)a;
        return WELD_OK;
    }
    return err_set(e, WELD_ERR_UNSUPPORTED,
                   "%s: architecture '%s' is not supported (supported: LlamaForCausalLM, "
                   "MistralForCausalLM, MixtralForCausalLM, Qwen2ForCausalLM, "
                   "Qwen3ForCausalLM, Qwen2MoeForCausalLM, Qwen3MoeForCausalLM, "
                   "DeepseekV2ForCausalLM, DeepseekV3ForCausalLM)",
                   where, cls);
}

static int hf_read_sizes(const json_t *root, struct model_config *c, const char *where,
                         struct weld_err *e)
{
    int rc;
    if ((rc = hf_req_int(root, "hidden_size", &c->dim, where, e)) ||
        (rc = hf_req_int(root, "num_hidden_layers", &c->n_layer, where, e)) ||
        (rc = hf_req_int(root, "num_attention_heads", &c->n_head, where, e)) ||
        (rc = hf_req_int(root, "intermediate_size", &c->ffn_dim, where, e)) ||
        (rc = hf_req_int(root, "vocab_size", &c->n_vocab, where, e)))
        return rc;
    if (c->n_head <= 0)
        return err_set(e, WELD_ERR_FORMAT, "%s: field 'num_attention_heads' must be > 0",
                       where);
    c->n_kv_head = c->n_head;
    OPTIONAL(hf_int(root, "num_key_value_heads", &c->n_kv_head, where, e));
    c->head_dim = c->dim / c->n_head;
    OPTIONAL(hf_int(root, "head_dim", &c->head_dim, where, e));
    c->rope_dim = c->head_dim;
    /* transformers' defaults per config class */
    c->max_ctx = c->arch == ARCH_LLAMA ? 2048 : 32768;
    const char *mt = NULL;
    if (jget_str(root, "model_type", &mt, where, NULL) == WELD_OK &&
        (strcmp(mt, "mistral") == 0 || strcmp(mt, "mixtral") == 0))
        c->max_ctx = 4096 * 32;
    OPTIONAL(hf_int(root, "max_position_embeddings", &c->max_ctx, where, e));
    c->norm_eps = 1e-6f;
    OPTIONAL(hf_float(root, "rms_norm_eps", &c->norm_eps, where, e));
    return WELD_OK;
}

static int hf_read_llama3(const json_t *rs, struct model_config *c, const char *where,
                          struct weld_err *e)
{
    /* defaults as llama.cpp's converter */
    c->rope_factor = 8.0f;
    c->rope_low_freq_factor = 1.0f;
    c->rope_high_freq_factor = 4.0f;
    c->rope_orig_ctx = 8192;
    OPTIONAL(hf_float(rs, "factor", &c->rope_factor, where, e));
    OPTIONAL(hf_float(rs, "low_freq_factor", &c->rope_low_freq_factor, where, e));
    OPTIONAL(hf_float(rs, "high_freq_factor", &c->rope_high_freq_factor, where, e));
    OPTIONAL(hf_int(rs, "original_max_position_embeddings", &c->rope_orig_ctx, where, e));
    c->rope_scaling = ROPE_SCALING_LLAMA3;
    return WELD_OK;
}

/* DeepSeek's YaRN: llama.cpp keeps only mscale_all_dim (as yarn_log_multiplier = 0.1 *
   mscale_all_dim) and assumes mscale == mscale_all_dim (V2, V3 and Kimi K2 all have it). */
static int hf_read_yarn(const json_t *rs, struct model_config *c, const char *field,
                        const char *where, struct weld_err *e)
{
    c->rope_scaling = ROPE_SCALING_YARN;
    c->rope_orig_ctx = c->max_ctx;
    c->yarn_beta_fast = 32.0f;
    c->yarn_beta_slow = 1.0f;
    float mscale = 1.0f, mscale_all = 0.0f;
    int rc = hf_float(rs, "factor", &c->rope_factor, where, e);
    if (rc == WELD_ERR_NOT_FOUND)
        return err_set(e, WELD_ERR_FORMAT, "%s: field '%s.factor' is missing", where, field);
    if (rc != WELD_OK)
        return rc;
    OPTIONAL(hf_int(rs, "original_max_position_embeddings", &c->rope_orig_ctx, where, e));
    OPTIONAL(hf_float(rs, "beta_fast", &c->yarn_beta_fast, where, e));
    OPTIONAL(hf_float(rs, "beta_slow", &c->yarn_beta_slow, where, e));
    OPTIONAL(hf_float(rs, "mscale", &mscale, where, e));
    OPTIONAL(hf_float(rs, "mscale_all_dim", &mscale_all, where, e));
    if (mscale_all != 0.0f && mscale != mscale_all)
        return err_set(e, WELD_ERR_UNSUPPORTED,
                       "%s: field '%s': mscale %g differs from mscale_all_dim %g (llama.cpp "
                       "and weld assume they are equal)",
                       where, field, (double)mscale, (double)mscale_all);
    c->yarn_log_mul = 0.1f * mscale_all;
    return WELD_OK;
}

/* rope_scaling (or newer transformers' rope_parameters) and rope_theta. */
static int hf_read_rope(const json_t *root, struct model_config *c, const char *where,
                        struct weld_err *e)
{
    c->rope_theta = 10000.0f;
    const json_t *rs = json_object_get(root, "rope_scaling");
    const char *field = "rope_scaling";
    const json_t *rp = json_object_get(root, "rope_parameters");
    if (json_is_object(rp)) {
        OPTIONAL(hf_float(rp, "rope_theta", &c->rope_theta, where, e));
        if (!rs || json_is_null(rs)) {
            rs = rp;
            field = "rope_parameters";
        }
    }
    OPTIONAL(hf_float(root, "rope_theta", &c->rope_theta, where, e));
    if (!rs || json_is_null(rs))
        return WELD_OK;
    if (!json_is_object(rs))
        return err_set(e, WELD_ERR_FORMAT, "%s: field '%s' must be an object or null", where,
                       field);
    const char *type = NULL;
    OPTIONAL(jget_str(rs, "rope_type", &type, where, e));
    if (!type)
        OPTIONAL(jget_str(rs, "type", &type, where, e));
    if (!type || strcmp(type, "default") == 0)
        return WELD_OK;
    if (strcmp(type, "llama3") == 0)
        return hf_read_llama3(rs, c, where, e);
    if (strcmp(type, "yarn") == 0 && c->arch == ARCH_DEEPSEEK2)
        return hf_read_yarn(rs, c, field, where, e);
    if (strcmp(type, "linear") == 0) {
        int rc = hf_float(rs, "factor", &c->rope_factor, where, e);
        if (rc == WELD_ERR_NOT_FOUND)
            return err_set(e, WELD_ERR_FORMAT, "%s: field '%s.factor' is missing", where,
                           field);
        if (rc != WELD_OK)
            return rc;
        c->rope_scaling = ROPE_SCALING_LINEAR;
        return WELD_OK;
    }
    return err_set(e, WELD_ERR_UNSUPPORTED,
                   "%s: field '%s': rope type '%s' is not supported (supported: default, "
                   "linear, llama3, yarn for DeepSeek)",
                   where, field, type);
}

static int hf_read_flags(const json_t *root, struct model_config *c, const char *where,
                         struct weld_err *e)
{
    bool b = false;
    OPTIONAL(jget_bool(root, "tie_word_embeddings", &c->tied_embeddings, where, e));
    b = false;
    OPTIONAL(jget_bool(root, "attention_bias", &b, where, e));
    if (b && c->arch != ARCH_QWEN2 && c->arch != ARCH_QWEN2MOE)
        return err_set(e, WELD_ERR_UNSUPPORTED,
                       "%s: field 'attention_bias': biased attention projections are not "
                       "supported for %s",
                       where, model_arch_name(c->arch));
    b = false;
    OPTIONAL(jget_bool(root, "mlp_bias", &b, where, e));
    if (b)
        return err_set(e, WELD_ERR_UNSUPPORTED, "%s: field 'mlp_bias': not supported", where);
    const char *act = NULL;
    OPTIONAL(jget_str(root, "hidden_act", &act, where, e));
    if (act && strcmp(act, "silu") != 0)
        return err_set(e, WELD_ERR_UNSUPPORTED,
                       "%s: field 'hidden_act': '%s' is not supported (only silu)", where, act);
    c->sliding_window = 0;
    OPTIONAL(hf_int(root, "sliding_window", &c->sliding_window, where, e));
    b = true;
    OPTIONAL(jget_bool(root, "use_sliding_window", &b, where, e));
    if (!b)
        c->sliding_window = 0;
    c->qkv_bias = c->arch == ARCH_QWEN2 || c->arch == ARCH_QWEN2MOE;
    c->qk_norm = c->arch == ARCH_QWEN3 || c->arch == ARCH_QWEN3MOE;
    /* DeepSeek's modeling code de-interleaves q_pe / k_pe before rotate-half: its weights
       rotate adjacent pairs, as llama.cpp's (unpermuted) deepseek2 GGUFs do */
    c->rope_neox = c->arch != ARCH_DEEPSEEK2;
    c->v_head_dim = c->head_dim; /* hf_read_deepseek sets MLA's own */
    return WELD_OK;
}

/* An HF field that must keep its trivial value: an integer equal to want (absent is fine). */
static int hf_want_int(const json_t *root, const char *key, int want, const char *what,
                       const char *where, struct weld_err *e)
{
    int v = want;
    OPTIONAL(hf_int(root, key, &v, where, e));
    if (v != want)
        return err_set(e, WELD_ERR_UNSUPPORTED, "%s: field '%s' = %d is not supported (%s)", where,
                       key, v, what);
    return WELD_OK;
}

/* Qwen2-MoE / Qwen3-MoE: every layer sparse; refuse the fields that make layers differ. */
static int hf_read_qwen_moe(const json_t *root, struct model_config *c, const char *where,
                            struct weld_err *e)
{
    int rc;
    if ((rc = hf_req_int(root, "num_experts", &c->n_expert, where, e)) ||
        (rc = hf_req_int(root, "num_experts_per_tok", &c->n_expert_used, where, e)) ||
        (rc = hf_req_int(root, "moe_intermediate_size", &c->moe_ffn_dim, where, e)) ||
        (rc = hf_want_int(root, "decoder_sparse_step", 1, "every layer must be sparse", where, e)))
        return rc;
    const json_t *mlp_only = json_object_get(root, "mlp_only_layers");
    if (mlp_only && !json_is_null(mlp_only) &&
        !(json_is_array(mlp_only) && json_array_size(mlp_only) == 0))
        return err_set(e, WELD_ERR_UNSUPPORTED,
                       "%s: field 'mlp_only_layers': dense layers among sparse ones are not "
                       "supported (must be [])",
                       where);
    bool norm = false; /* transformers' default for both */
    OPTIONAL(jget_bool(root, "norm_topk_prob", &norm, where, e));
    bool want = c->arch == ARCH_QWEN3MOE; /* what llama.cpp hard-codes per arch */
    if (norm != want)
        return err_set(e, WELD_ERR_UNSUPPORTED,
                       "%s: field 'norm_topk_prob' = %s is not supported for %s (llama.cpp "
                       "and weld use %s)",
                       where, norm ? "true" : "false", arch_hf_types[c->arch],
                       want ? "true" : "false");
    c->expert_norm = norm;
    c->gating = MOE_GATING_SOFTMAX;
    c->expert_scale = 1.0f;
    if (c->arch == ARCH_QWEN2MOE) {
        if ((rc = hf_req_int(root, "shared_expert_intermediate_size", &c->shared_ffn_dim, where,
                             e)))
            return rc;
        c->n_shared_expert = 1;
        c->shared_gate = true;
    }
    return WELD_OK;
}

/* Mixtral: llama with experts as wide as intermediate_size, softmax, renormalised. */
static int hf_read_mixtral(const json_t *root, struct model_config *c, const char *where,
                           struct weld_err *e)
{
    int rc;
    if ((rc = hf_req_int(root, "num_local_experts", &c->n_expert, where, e)) ||
        (rc = hf_req_int(root, "num_experts_per_tok", &c->n_expert_used, where, e)))
        return rc;
    c->moe_ffn_dim = c->ffn_dim;
    c->gating = MOE_GATING_SOFTMAX;
    c->expert_norm = true;
    c->expert_scale = 1.0f;
    return WELD_OK;
}

/* DeepSeek-V2/V3 (and Kimi K2): MLA sizes and the routed + shared experts. */
static int hf_read_deepseek(const json_t *root, struct model_config *c, const char *where,
                            struct weld_err *e)
{
    int rc, rope = 0;
    c->q_lora_rank = 0; /* null: no query compression (V2-Lite) */
    OPTIONAL(hf_int(root, "q_lora_rank", &c->q_lora_rank, where, e));
    if ((rc = hf_req_int(root, "kv_lora_rank", &c->kv_lora_rank, where, e)) ||
        (rc = hf_req_int(root, "qk_nope_head_dim", &c->qk_nope_dim, where, e)) ||
        (rc = hf_req_int(root, "qk_rope_head_dim", &rope, where, e)) ||
        (rc = hf_req_int(root, "v_head_dim", &c->v_head_dim, where, e)) ||
        (rc = hf_req_int(root, "n_routed_experts", &c->n_expert, where, e)) ||
        (rc = hf_req_int(root, "num_experts_per_tok", &c->n_expert_used, where, e)) ||
        (rc = hf_req_int(root, "moe_intermediate_size", &c->moe_ffn_dim, where, e)) ||
        (rc = hf_want_int(root, "moe_layer_freq", 1,
                          "every layer after the dense ones must "
                          "be sparse",
                          where, e)))
        return rc;
    c->head_dim = c->qk_nope_dim + rope;
    c->rope_dim = rope;
    c->n_kv_head = c->n_head;
    OPTIONAL(hf_int(root, "n_shared_experts", &c->n_shared_expert, where, e));
    c->shared_ffn_dim = c->n_shared_expert * c->moe_ffn_dim;
    OPTIONAL(hf_int(root, "first_k_dense_replace", &c->n_dense_lead, where, e));
    c->expert_scale = 1.0f;
    OPTIONAL(hf_float(root, "routed_scaling_factor", &c->expert_scale, where, e));
    c->n_group = 1, c->topk_group = 1;
    OPTIONAL(hf_int(root, "n_group", &c->n_group, where, e));
    OPTIONAL(hf_int(root, "topk_group", &c->topk_group, where, e));
    OPTIONAL(jget_bool(root, "norm_topk_prob", &c->expert_norm, where, e));
    OPTIONAL(hf_int(root, "num_nextn_predict_layers", &c->n_nextn, where, e));
    const char *score = "softmax", *method = "greedy";
    OPTIONAL(jget_str(root, "scoring_func", &score, where, e));
    OPTIONAL(jget_str(root, "topk_method", &method, where, e));
    if (strcmp(score, "softmax") == 0)
        c->gating = MOE_GATING_SOFTMAX;
    else if (strcmp(score, "sigmoid") == 0)
        c->gating = MOE_GATING_SIGMOID;
    else
        return err_set(e, WELD_ERR_UNSUPPORTED,
                       "%s: field 'scoring_func': '%s' is not supported (softmax, sigmoid)", where,
                       score);
    if (strcmp(method, "noaux_tc") == 0)
        c->expert_bias = true;
    else if (strcmp(method, "greedy") != 0 && strcmp(method, "group_limited_greedy") != 0)
        return err_set(e, WELD_ERR_UNSUPPORTED,
                       "%s: field 'topk_method': '%s' is not supported (greedy, "
                       "group_limited_greedy, noaux_tc)",
                       where, method);
    if (strcmp(method, "greedy") == 0)
        c->n_group = 1, c->topk_group = 1; /* groups are ignored by plain greedy */
    return WELD_OK;
}

static int hf_read_experts(const json_t *root, struct model_config *c, const char *where,
                           struct weld_err *e)
{
    if (c->arch == ARCH_QWEN3MOE || c->arch == ARCH_QWEN2MOE)
        return hf_read_qwen_moe(root, c, where, e);
    if (c->arch == ARCH_DEEPSEEK2)
        return hf_read_deepseek(root, c, where, e);
    const json_t *n = json_object_get(root, "num_local_experts");
    if (c->arch == ARCH_LLAMA && n && !json_is_null(n))
        return hf_read_mixtral(root, c, where, e);
    return WELD_OK;
}

int model_config_from_hf_json(const char *buf, size_t len, const char *where,
                              struct model_config *c, struct weld_err *e)
{
    memset(c, 0, sizeof *c);
    json_t *root = jload_buf(buf, len, where, e);
    if (!root)
        return e ? e->status : WELD_ERR_FORMAT;
    int rc = WELD_OK;
    if (!json_is_object(root)) {
        rc = err_set(e, WELD_ERR_FORMAT, "%s: expected a JSON object", where);
        goto out_root;
    }
    if ((rc = hf_read_arch(root, c, where, e)) || (rc = hf_read_sizes(root, c, where, e)) ||
        (rc = hf_read_rope(root, c, where, e)) || (rc = hf_read_flags(root, c, where, e)) ||
        (rc = hf_read_experts(root, c, where, e)))
        goto out_root;
    const char *name = NULL;
    if (jget_str(root, "_name_or_path", &name, where, NULL) == WELD_OK)
        snprintf(c->name, sizeof c->name, "%s", name);
    rc = model_config_validate(c, where, e);
out_root:
    json_decref(root);
    return rc;
}

int model_config_from_hf(const char *dir, struct model_config *c, struct weld_err *e)
{
    size_t n = strlen(dir) + sizeof "/config.json";
    char *path = wmalloc(n);
    if (!path)
        return err_set(e, WELD_ERR_NOMEM, "%s: out of memory", dir);
    snprintf(path, n, "%s/config.json", dir);
    char *buf = NULL;
    size_t len = 0;
    int rc = file_read_all(path, &buf, &len, e);
    if (rc == WELD_OK)
        rc = model_config_from_hf_json(buf, len, path, c, e);
    wfree(buf);
    wfree(path);
    return rc;
}

/* ------------------------------------------------------------------------------------ */
/* validation                                                                           */
/* ------------------------------------------------------------------------------------ */

static int check_range(long long v, long long lo, long long hi, const char *field,
                       const char *where, struct weld_err *e)
{
    if (v < lo || v > hi)
        return err_set(e, WELD_ERR_FORMAT, "%s: %s = %lld is out of range [%lld, %lld]", where,
                       field, v, lo, hi);
    return WELD_OK;
}

static int check_rope(const struct model_config *c, const char *where, struct weld_err *e)
{
    if (!(isfinite(c->rope_theta) && c->rope_theta > 0.0f))
        return err_set(e, WELD_ERR_FORMAT, "%s: rope_theta = %g must be > 0", where,
                       (double)c->rope_theta);
    switch (c->rope_scaling) {
    case ROPE_SCALING_NONE:
        return WELD_OK;
    case ROPE_SCALING_LINEAR:
        if (!(isfinite(c->rope_factor) && c->rope_factor > 0.0f))
            return err_set(e, WELD_ERR_FORMAT, "%s: rope scaling factor = %g must be > 0",
                           where, (double)c->rope_factor);
        return WELD_OK;
    case ROPE_SCALING_YARN:
        if (!(isfinite(c->rope_factor) && c->rope_factor > 0.0f))
            return err_set(e, WELD_ERR_FORMAT, "%s: rope scaling factor = %g must be > 0", where,
                           (double)c->rope_factor);
        if (!(isfinite(c->yarn_beta_fast) && isfinite(c->yarn_beta_slow) &&
              c->yarn_beta_fast > 0.0f && c->yarn_beta_slow > 0.0f && isfinite(c->yarn_log_mul) &&
              c->yarn_log_mul >= 0.0f))
            return err_set(e, WELD_ERR_FORMAT,
                           "%s: yarn beta_fast = %g, beta_slow = %g, log multiplier = %g: need "
                           "betas > 0 and multiplier >= 0",
                           where, (double)c->yarn_beta_fast, (double)c->yarn_beta_slow,
                           (double)c->yarn_log_mul);
        return check_range(c->rope_orig_ctx, 1, 1 << 24, "rope original context", where, e);
    case ROPE_SCALING_LLAMA3:
        if (!(isfinite(c->rope_factor) && c->rope_factor > 0.0f))
            return err_set(e, WELD_ERR_FORMAT, "%s: rope scaling factor = %g must be > 0",
                           where, (double)c->rope_factor);
        if (!(isfinite(c->rope_low_freq_factor) && isfinite(c->rope_high_freq_factor) &&
              c->rope_low_freq_factor > 0.0f &&
              c->rope_high_freq_factor > c->rope_low_freq_factor))
            return err_set(e, WELD_ERR_FORMAT,
                           "%s: rope scaling low_freq_factor = %g, high_freq_factor = %g: "
                           "need 0 < low < high",
                           where, (double)c->rope_low_freq_factor,
                           (double)c->rope_high_freq_factor);
        return check_range(c->rope_orig_ctx, 1, 1 << 24, "rope original context", where, e);
    }
    return err_set(e, WELD_ERR_FORMAT, "%s: unknown rope scaling type %d", where,
                   (int)c->rope_scaling);
}

static int check_experts(const struct model_config *c, const char *where, struct weld_err *e)
{
    int rc;
    bool moe_arch = c->arch == ARCH_QWEN3MOE || c->arch == ARCH_QWEN2MOE ||
                    c->arch == ARCH_DEEPSEEK2;
    if ((rc = check_range(c->n_expert, moe_arch ? 1 : 0, 1024, "expert count", where, e)))
        return rc;
    if (c->n_expert == 0) {
        if (c->n_expert_used || c->n_shared_expert || c->shared_ffn_dim || c->n_dense_lead ||
            c->n_group > 1 || c->expert_bias || c->shared_gate)
            return err_set(e, WELD_ERR_FORMAT,
                           "%s: expert settings (used %d, shared %d, dense leading layers %d, "
                           "groups %d) without experts",
                           where, c->n_expert_used, c->n_shared_expert, c->n_dense_lead,
                           c->n_group);
        return WELD_OK;
    }
    if ((rc = check_range(c->n_expert_used, 1, c->n_expert, "experts used per token", where, e)) ||
        (rc = check_range(c->moe_ffn_dim, 1, 1 << 20, "expert ffn size", where, e)) ||
        (rc = check_range(c->shared_ffn_dim, 0, 1 << 20, "shared expert ffn size", where, e)) ||
        (rc = check_range(c->n_shared_expert, 0, 64, "shared expert count", where, e)) ||
        (rc = check_range(c->n_dense_lead, 0, c->n_layer, "leading dense layers", where, e)) ||
        (rc = check_range(c->n_group, 0, c->n_expert, "expert group count", where, e)))
        return rc;
    if (c->gating != MOE_GATING_SOFTMAX && c->gating != MOE_GATING_SIGMOID)
        return err_set(e, WELD_ERR_FORMAT,
                       "%s: expert gating %d is not softmax (1) or "
                       "sigmoid (2)",
                       where, (int)c->gating);
    if (!(isfinite(c->expert_scale) && c->expert_scale > 0.0f))
        return err_set(e, WELD_ERR_FORMAT, "%s: expert weights scale = %g must be > 0", where,
                       (double)c->expert_scale);
    if (c->shared_gate && c->shared_ffn_dim == 0)
        return err_set(e, WELD_ERR_FORMAT, "%s: a shared expert gate without a shared expert",
                       where);
    if (c->arch == ARCH_LLAMA && (c->moe_ffn_dim != c->ffn_dim || c->shared_ffn_dim ||
                                  c->n_dense_lead || c->n_group > 1 || c->expert_bias))
        return err_set(e, WELD_ERR_UNSUPPORTED,
                       "%s: llama experts (Mixtral) must be ffn size wide (%d, not %d), with "
                       "no shared experts, dense layers, groups or bias",
                       where, c->ffn_dim, c->moe_ffn_dim);
    if (c->n_group > 1) {
        if (c->n_expert % c->n_group != 0)
            return err_set(e, WELD_ERR_FORMAT,
                           "%s: expert count %d is not a multiple of the group count %d", where,
                           c->n_expert, c->n_group);
        if ((rc = check_range(c->topk_group, 1, c->n_group, "expert groups used", where, e)))
            return rc;
        if ((long long)c->topk_group * (c->n_expert / c->n_group) < c->n_expert_used)
            return err_set(e, WELD_ERR_FORMAT,
                           "%s: %d groups of %d experts cannot supply %d experts per token", where,
                           c->topk_group, c->n_expert / c->n_group, c->n_expert_used);
    }
    return WELD_OK;
}

static int check_mla(const struct model_config *c, const char *where, struct weld_err *e)
{
    int rc;
    if (c->arch != ARCH_DEEPSEEK2) {
        if (c->kv_lora_rank || c->q_lora_rank || c->n_nextn)
            return err_set(e, WELD_ERR_FORMAT,
                           "%s: latent attention / next-token layers are deepseek2 only", where);
        if (c->v_head_dim && c->v_head_dim != c->head_dim)
            return err_set(e, WELD_ERR_UNSUPPORTED,
                           "%s: value head size %d differs from head_dim %d", where, c->v_head_dim,
                           c->head_dim);
        return WELD_OK;
    }
    if ((rc = check_range(c->kv_lora_rank, 1, 65536, "kv_lora_rank", where, e)) ||
        (rc = check_range(c->q_lora_rank, 0, 65536, "q_lora_rank", where, e)) ||
        (rc = check_range(c->qk_nope_dim, 1, 4096, "qk_nope_head_dim", where, e)) ||
        (rc = check_range(c->v_head_dim, 1, 4096, "v_head_dim", where, e)) ||
        (rc = check_range(c->n_nextn, 0, 16, "next-token prediction layers", where, e)))
        return rc;
    if (c->head_dim != c->qk_nope_dim + c->rope_dim)
        return err_set(e, WELD_ERR_FORMAT,
                       "%s: head_dim %d is not qk_nope_head_dim %d + rope dims %d", where,
                       c->head_dim, c->qk_nope_dim, c->rope_dim);
    if (c->n_kv_head != c->n_head)
        return err_set(e, WELD_ERR_FORMAT,
                       "%s: latent attention expands to every head: kv heads %d != heads %d", where,
                       c->n_kv_head, c->n_head);
    if ((long long)c->n_head * c->v_head_dim > 65536)
        return err_set(e, WELD_ERR_FORMAT, "%s: head count %d x v_head_dim %d is too large", where,
                       c->n_head, c->v_head_dim);
    if (c->rope_neox)
        return err_set(e, WELD_ERR_FORMAT,
                       "%s: deepseek2 rotates adjacent pairs (rope_neox must be false)", where);
    return WELD_OK;
}

int model_config_validate(const struct model_config *c, const char *where, struct weld_err *e)
{
    int rc;
    if ((unsigned)c->arch >= ARCH_COUNT)
        return err_set(e, WELD_ERR_FORMAT, "%s: unknown architecture %d", where, (int)c->arch);
    if ((rc = check_range(c->n_vocab, 1, 4 << 20, "vocab size", where, e)) ||
        (rc = check_range(c->dim, 1, 65536, "hidden size (dim)", where, e)) ||
        (rc = check_range(c->n_layer, 1, 1024, "layer count", where, e)) ||
        (rc = check_range(c->n_head, 1, 1024, "attention head count", where, e)) ||
        (rc = check_range(c->n_kv_head, 1, c->n_head, "kv head count", where, e)) ||
        (rc = check_range(c->head_dim, 2, 4096, "head_dim", where, e)) ||
        (rc = check_range(c->ffn_dim, 1, 1 << 20, "ffn (intermediate) size", where, e)) ||
        (rc = check_range(c->max_ctx, 1, 1 << 24, "context length", where, e)) ||
        (rc = check_range(c->rope_dim, 2, c->head_dim, "rope_dim", where, e)) ||
        (rc = check_range(c->sliding_window, 0, INT_MAX, "sliding_window", where, e)))
        return rc;
    if (c->n_head % c->n_kv_head != 0)
        return err_set(e, WELD_ERR_FORMAT,
                       "%s: head count %d is not a multiple of kv head count %d", where,
                       c->n_head, c->n_kv_head);
    if (c->rope_dim % 2 != 0)
        return err_set(e, WELD_ERR_FORMAT, "%s: rope_dim = %d must be even", where,
                       c->rope_dim);
    if ((long long)c->n_head * c->head_dim > 65536)
        return err_set(e, WELD_ERR_FORMAT, "%s: head count %d x head_dim %d is too large",
                       where, c->n_head, c->head_dim);
    if (!(isfinite(c->norm_eps) && c->norm_eps > 0.0f && c->norm_eps < 1.0f))
        return err_set(e, WELD_ERR_FORMAT, "%s: norm epsilon = %g must be in (0, 1)", where,
                       (double)c->norm_eps);
    if ((rc = check_experts(c, where, e)) || (rc = check_mla(c, where, e)))
        return rc;
    return check_rope(c, where, e);
}

/* ------------------------------------------------------------------------------------ */
/* writers                                                                              */
/* ------------------------------------------------------------------------------------ */

static int w_check(int rc, const char *key, struct weld_err *e)
{
    if (rc != WELD_OK)
        return err_set(e, rc, "gguf writer: cannot set key '%s'", key);
    return WELD_OK;
}

static int w_u32(struct gguf_writer *w, const char *a, const char *suffix, int v,
                 struct weld_err *e)
{
    char key[160];
    snprintf(key, sizeof key, "%s.%s", a, suffix);
    return w_check(gguf_writer_set_u32(w, key, (uint32_t)v), key, e);
}

static int w_f32(struct gguf_writer *w, const char *a, const char *suffix, float v,
                 struct weld_err *e)
{
    char key[160];
    snprintf(key, sizeof key, "%s.%s", a, suffix);
    return w_check(gguf_writer_set_f32(w, key, v), key, e);
}

static int w_rope_scaling(const struct model_config *c, struct gguf_writer *w, const char *a,
                          struct weld_err *e)
{
    char key[160];
    int rc = WELD_OK;
    if (c->rope_scaling == ROPE_SCALING_LINEAR) {
        snprintf(key, sizeof key, "%s.rope.scaling.type", a);
        if ((rc = w_check(gguf_writer_set_str(w, key, "linear"), key, e)))
            return rc;
        return w_f32(w, a, "rope.scaling.factor", c->rope_factor, e);
    }
    if (c->rope_scaling == ROPE_SCALING_YARN) {
        snprintf(key, sizeof key, "%s.rope.scaling.type", a);
        if ((rc = w_check(gguf_writer_set_str(w, key, "yarn"), key, e)) ||
            (rc = w_f32(w, a, "rope.scaling.factor", c->rope_factor, e)) ||
            (rc = w_u32(w, a, "rope.scaling.original_context_length", c->rope_orig_ctx, e)) ||
            (rc = w_f32(w, a, "rope.scaling.yarn_beta_fast", c->yarn_beta_fast, e)) ||
            (rc = w_f32(w, a, "rope.scaling.yarn_beta_slow", c->yarn_beta_slow, e)))
            return rc;
        if (c->yarn_log_mul != 0.0f)
            return w_f32(w, a, "rope.scaling.yarn_log_multiplier", c->yarn_log_mul, e);
        return WELD_OK;
    }
    if (c->rope_scaling == ROPE_SCALING_LLAMA3) {
        const char *p = "weld.rope.llama3";
        if ((rc = w_f32(w, p, "factor", c->rope_factor, e)) ||
            (rc = w_f32(w, p, "low_freq_factor", c->rope_low_freq_factor, e)) ||
            (rc = w_f32(w, p, "high_freq_factor", c->rope_high_freq_factor, e)) ||
            (rc = w_u32(w, p, "original_context_length", c->rope_orig_ctx, e)))
            return rc;
    }
    return WELD_OK;
}

static int w_experts(const struct model_config *c, struct gguf_writer *w, const char *a,
                     struct weld_err *e)
{
    int rc;
    if (c->n_expert == 0)
        return WELD_OK;
    if ((rc = w_u32(w, a, "expert_count", c->n_expert, e)) ||
        (rc = w_u32(w, a, "expert_used_count", c->n_expert_used, e)))
        return rc;
    if (c->arch != ARCH_LLAMA && /* Mixtral's experts are feed_forward_length wide */
        (rc = w_u32(w, a, "expert_feed_forward_length", c->moe_ffn_dim, e)))
        return rc;
    if (c->arch == ARCH_QWEN2MOE)
        return w_u32(w, a, "expert_shared_feed_forward_length", c->shared_ffn_dim, e);
    if (c->arch != ARCH_DEEPSEEK2)
        return WELD_OK;
    char key[160];
    snprintf(key, sizeof key, "%s.expert_weights_norm", a);
    if ((rc = w_u32(w, a, "leading_dense_block_count", c->n_dense_lead, e)) ||
        (rc = w_u32(w, a, "expert_shared_count", c->n_shared_expert, e)) ||
        (rc = w_u32(w, a, "expert_gating_func", (int)c->gating, e)) ||
        (rc = w_check(gguf_writer_set_bool(w, key, c->expert_norm), key, e)) ||
        (c->expert_scale != 1.0f && (rc = w_f32(w, a, "expert_weights_scale", c->expert_scale, e))))
        return rc;
    /* llama.cpp asserts used < count when count > 1; all groups used = no grouping */
    if (c->n_group > 1 && c->topk_group < c->n_group &&
        ((rc = w_u32(w, a, "expert_group_count", c->n_group, e)) ||
         (rc = w_u32(w, a, "expert_group_used_count", c->topk_group, e))))
        return rc;
    return WELD_OK;
}

/* The MLA keys; nextn layers are not written (weld writes them to no GGUF, as llama.cpp's
   converter drops them for deepseek2). */
static int w_mla(const struct model_config *c, struct gguf_writer *w, const char *a,
                 struct weld_err *e)
{
    int rc;
    if ((rc = w_u32(w, a, "attention.q_lora_rank", c->q_lora_rank, e)) ||
        (rc = w_u32(w, a, "attention.kv_lora_rank", c->kv_lora_rank, e)) ||
        (rc = w_u32(w, a, "attention.key_length_mla", c->head_dim, e)) ||
        (rc = w_u32(w, a, "attention.value_length_mla", c->v_head_dim, e)))
        return rc;
    return WELD_OK;
}

int model_config_to_gguf(const struct model_config *c, struct gguf_writer *w,
                         struct weld_err *e)
{
    int rc = model_config_validate(c, "model config", e);
    if (rc != WELD_OK)
        return rc;
    const char *a = model_arch_name(c->arch);
    if ((rc = w_check(gguf_writer_set_str(w, "general.architecture", a),
                      "general.architecture", e)))
        return rc;
    if (c->name[0] &&
        (rc = w_check(gguf_writer_set_str(w, "general.name", c->name), "general.name", e)))
        return rc;
    /* deepseek2: the MQA view llama.cpp's converter writes (see gguf_read_mla) */
    bool mla = c->arch == ARCH_DEEPSEEK2;
    if ((rc = w_u32(w, a, "vocab_size", c->n_vocab, e)) ||
        (rc = w_u32(w, a, "context_length", c->max_ctx, e)) ||
        (rc = w_u32(w, a, "embedding_length", c->dim, e)) ||
        (rc = w_u32(w, a, "block_count", c->n_layer, e)) ||
        (rc = w_u32(w, a, "feed_forward_length", c->ffn_dim, e)) ||
        (rc = w_u32(w, a, "attention.head_count", c->n_head, e)) ||
        (rc = w_u32(w, a, "attention.head_count_kv", mla ? 1 : c->n_kv_head, e)) ||
        (rc = w_u32(w, a, "attention.key_length", mla ? c->kv_lora_rank + c->rope_dim : c->head_dim,
                    e)) ||
        (rc = w_u32(w, a, "attention.value_length", mla ? c->kv_lora_rank : c->head_dim, e)) ||
        (rc = w_u32(w, a, "rope.dimension_count", c->rope_dim, e)) ||
        (rc = w_f32(w, a, "rope.freq_base", c->rope_theta, e)) ||
        (rc = w_f32(w, a, "attention.layer_norm_rms_epsilon", c->norm_eps, e)))
        return rc;
    if (c->sliding_window > 0 &&
        (rc = w_u32(w, a, "attention.sliding_window", c->sliding_window, e)))
        return rc;
    if ((rc = w_experts(c, w, a, e)) || (mla && (rc = w_mla(c, w, a, e))))
        return rc;
    return w_rope_scaling(c, w, a, e);
}

/* The shortest decimal that reads back as the same float, as a double, so config.json
   shows 1e-05 rather than 9.999999747378752e-06. */
static json_t *json_float(float f)
{
    char buf[48];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, (double)f);
        if ((float)strtod(buf, NULL) == f) /* how the readers convert it back */
            break;
    }
    return json_real(strtod(buf, NULL));
}

/* json_object_set_new for every member; remembers the first failure in *ok. */
static void jset(json_t *o, const char *key, json_t *v, int *ok)
{
    if (!v || json_object_set_new(o, key, v) != 0)
        *ok = 0;
}

static json_t *hf_rope_scaling_json(const struct model_config *c)
{
    if (c->rope_scaling == ROPE_SCALING_NONE)
        return json_null();
    json_t *o = json_object();
    int ok = o != NULL;
    if (!ok)
        return NULL;
    if (c->rope_scaling == ROPE_SCALING_LINEAR) {
        jset(o, "rope_type", json_string("linear"), &ok);
        jset(o, "factor", json_float(c->rope_factor), &ok);
    } else if (c->rope_scaling == ROPE_SCALING_YARN) {
        float mscale = c->yarn_log_mul / 0.1f;
        jset(o, "type", json_string("yarn"), &ok);
        jset(o, "factor", json_float(c->rope_factor), &ok);
        jset(o, "original_max_position_embeddings", json_integer(c->rope_orig_ctx), &ok);
        jset(o, "beta_fast", json_float(c->yarn_beta_fast), &ok);
        jset(o, "beta_slow", json_float(c->yarn_beta_slow), &ok);
        if (mscale != 0.0f) {
            jset(o, "mscale", json_float(mscale), &ok);
            jset(o, "mscale_all_dim", json_float(mscale), &ok);
        }
    } else {
        jset(o, "rope_type", json_string("llama3"), &ok);
        jset(o, "factor", json_float(c->rope_factor), &ok);
        jset(o, "low_freq_factor", json_float(c->rope_low_freq_factor), &ok);
        jset(o, "high_freq_factor", json_float(c->rope_high_freq_factor), &ok);
        jset(o, "original_max_position_embeddings", json_integer(c->rope_orig_ctx), &ok);
    }
    if (!ok) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/* The MoE / MLA fields of each HF config class. */
static void hf_experts_json(const struct model_config *c, json_t *o, int *ok)
{
    if (c->n_expert == 0)
        return;
    jset(o, "num_experts_per_tok", json_integer(c->n_expert_used), ok);
    if (c->arch == ARCH_LLAMA) {
        jset(o, "num_local_experts", json_integer(c->n_expert), ok);
        return;
    }
    jset(o, "moe_intermediate_size", json_integer(c->moe_ffn_dim), ok);
    jset(o, "norm_topk_prob", json_boolean(c->expert_norm), ok);
    if (c->arch != ARCH_DEEPSEEK2) {
        jset(o, "num_experts", json_integer(c->n_expert), ok);
        jset(o, "decoder_sparse_step", json_integer(1), ok);
        jset(o, "mlp_only_layers", json_array(), ok);
        if (c->arch == ARCH_QWEN2MOE)
            jset(o, "shared_expert_intermediate_size", json_integer(c->shared_ffn_dim), ok);
        return;
    }
    bool grouped = c->n_group > 1 && c->topk_group < c->n_group;
    jset(o, "n_routed_experts", json_integer(c->n_expert), ok);
    jset(o, "n_shared_experts", json_integer(c->n_shared_expert), ok);
    jset(o, "first_k_dense_replace", json_integer(c->n_dense_lead), ok);
    jset(o, "moe_layer_freq", json_integer(1), ok);
    jset(o, "routed_scaling_factor", json_float(c->expert_scale), ok);
    jset(o, "n_group", json_integer(grouped ? c->n_group : 1), ok);
    jset(o, "topk_group", json_integer(grouped ? c->topk_group : 1), ok);
    jset(o, "scoring_func", json_string(c->gating == MOE_GATING_SIGMOID ? "sigmoid" : "softmax"),
         ok);
    jset(o, "topk_method",
         json_string(c->expert_bias ? "noaux_tc"
                     : grouped      ? "group_limited_greedy"
                                    : "greedy"),
         ok);
    jset(o, "q_lora_rank", c->q_lora_rank ? json_integer(c->q_lora_rank) : json_null(), ok);
    jset(o, "kv_lora_rank", json_integer(c->kv_lora_rank), ok);
    jset(o, "qk_nope_head_dim", json_integer(c->qk_nope_dim), ok);
    jset(o, "qk_rope_head_dim", json_integer(c->rope_dim), ok);
    jset(o, "v_head_dim", json_integer(c->v_head_dim), ok);
    jset(o, "num_nextn_predict_layers", json_integer(c->n_nextn), ok);
    jset(o, "attention_bias", json_false(), ok);
    json_object_del(o, "head_dim"); /* DeepSeek's is qk_nope + qk_rope */
}

json_t *model_config_to_hf_json(const struct model_config *c, const char *torch_dtype)
{
    if ((unsigned)c->arch >= ARCH_COUNT)
        return NULL;
    const char *cls = arch_hf_classes[c->arch], *hf_type = arch_hf_types[c->arch];
    if (c->arch == ARCH_LLAMA && c->n_expert > 0)
        cls = "MixtralForCausalLM", hf_type = "mixtral";
    if (c->arch == ARCH_DEEPSEEK2 && c->gating == MOE_GATING_SOFTMAX && !c->expert_bias)
        cls = "DeepseekV2ForCausalLM", hf_type = "deepseek_v2";
    json_t *o = json_object(), *archs = json_array();
    int ok = o && archs && json_array_append_new(archs, json_string(cls)) == 0;
    if (!ok) {
        json_decref(o);
        json_decref(archs);
        return NULL;
    }
    jset(o, "architectures", archs, &ok);
    jset(o, "model_type", json_string(hf_type), &ok);
    if (c->name[0])
        jset(o, "_name_or_path", json_string(c->name), &ok);
    jset(o, "hidden_size", json_integer(c->dim), &ok);
    jset(o, "intermediate_size", json_integer(c->ffn_dim), &ok);
    jset(o, "num_hidden_layers", json_integer(c->n_layer), &ok);
    jset(o, "num_attention_heads", json_integer(c->n_head), &ok);
    jset(o, "num_key_value_heads", json_integer(c->n_kv_head), &ok);
    jset(o, "head_dim", json_integer(c->head_dim), &ok);
    jset(o, "vocab_size", json_integer(c->n_vocab), &ok);
    jset(o, "max_position_embeddings", json_integer(c->max_ctx), &ok);
    jset(o, "rms_norm_eps", json_float(c->norm_eps), &ok);
    jset(o, "rope_theta", json_float(c->rope_theta), &ok);
    jset(o, "rope_scaling", hf_rope_scaling_json(c), &ok);
    jset(o, "hidden_act", json_string("silu"), &ok);
    jset(o, "tie_word_embeddings", json_boolean(c->tied_embeddings), &ok);
    if (c->arch == ARCH_LLAMA || c->arch == ARCH_QWEN3)
        jset(o, "attention_bias", json_false(), &ok);
    if (c->arch == ARCH_LLAMA)
        jset(o, "mlp_bias", json_false(), &ok);
    if (c->arch != ARCH_LLAMA)
        jset(o, "use_sliding_window", json_boolean(c->sliding_window > 0), &ok);
    jset(o, "sliding_window", c->sliding_window > 0 ? json_integer(c->sliding_window)
                                                    : json_null(), &ok);
    hf_experts_json(c, o, &ok);
    if (torch_dtype)
        jset(o, "torch_dtype", json_string(torch_dtype), &ok);
    if (!ok) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/* ------------------------------------------------------------------------------------ */
/* Llama 3 rope frequencies                                                             */
/* ------------------------------------------------------------------------------------ */

void model_config_llama3_freq_factors(const struct model_config *c, float *out)
{
    int n = c->rope_dim / 2;
    for (int i = 0; i < n; i++)
        out[i] = 1.0f;
    if (c->rope_scaling != ROPE_SCALING_LLAMA3)
        return;
    const double pi = 3.14159265358979323846;
    double factor = c->rope_factor, lo = c->rope_low_freq_factor;
    double hi = c->rope_high_freq_factor, orig = c->rope_orig_ctx;
    double lo_wavelen = orig / lo, hi_wavelen = orig / hi;
    for (int i = 0; i < n; i++) {
        double freq = pow((double)c->rope_theta, -2.0 * i / c->rope_dim);
        double wavelen = 2.0 * pi / freq;
        if (wavelen < hi_wavelen) {
            out[i] = 1.0f;
        } else if (wavelen > lo_wavelen) {
            out[i] = (float)factor;
        } else {
            /* the frequency becomes freq * ((1 - s) / factor + s); store the divisor */
            double s = (orig / wavelen - lo) / (hi - lo);
            out[i] = (float)(1.0 / ((1.0 - s) / factor + s));
        }
    }
}

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
 * Not handled (reported as WELD_ERR_UNSUPPORTED): yarn / longrope / dynamic rope scaling,
 * per-layer differing head counts, biases other than qwen2's QKV bias, MLP activations
 * other than SiLU, value heads of a different size than key heads.
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
#define SUPPORTED_ARCHS "llama, qwen2, qwen3"

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
    if (v_len != c->head_dim)
        return err_set(e, WELD_ERR_UNSUPPORTED,
                       "%s: key '%s.attention.value_length' = %d differs from key_length %d",
                       f->path, a, v_len, c->head_dim);
    c->rope_dim = c->head_dim;
    OPTIONAL(gkey_int(f, a, "rope.dimension_count", 0, &c->rope_dim, e));
    OPTIONAL(gkey_int(f, a, "attention.sliding_window", 0, &c->sliding_window, e));
    c->norm_eps = 1e-5f;
    OPTIONAL(gkey_f32(f, a, "attention.layer_norm_rms_epsilon", &c->norm_eps, e));
    c->rope_theta = 10000.0f;
    OPTIONAL(gkey_f32(f, a, "rope.freq_base", &c->rope_theta, e));
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
    if (strcmp(type, "none") != 0 && strcmp(type, "linear") != 0)
        return err_set(e, WELD_ERR_UNSUPPORTED,
                       "%s: key '%s': rope scaling '%s' is not supported (supported: none, "
                       "linear, llama3 via rope_freqs.weight)",
                       f->path, key, type);
    float factor = 0.0f;
    rc = gkey_f32(f, a, "rope.scaling.factor", &factor, e);
    if (rc == WELD_ERR_NOT_FOUND)
        rc = gkey_f32(f, a, "rope.scale_linear", &factor, e);
    if (rc != WELD_OK && rc != WELD_ERR_NOT_FOUND)
        return rc;
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
    if (rc == WELD_OK)
        rc = gguf_read_rope_scaling(f, arch, c, e);
    if (rc != WELD_OK)
        return rc;
    c->rope_neox = c->arch != ARCH_LLAMA;
    c->qkv_bias = c->arch == ARCH_QWEN2;
    c->qk_norm = c->arch == ARCH_QWEN3;
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

/* model_type first, then architectures[0]. */
static int hf_read_arch(const json_t *root, struct model_config *c, const char *where,
                        struct weld_err *e)
{
    const char *mt = NULL;
    int rc = jget_str(root, "model_type", &mt, where, e);
    if (rc != WELD_OK && rc != WELD_ERR_NOT_FOUND)
        return rc;
    if (mt) {
        int a = strcmp(mt, "mistral") == 0 ? ARCH_LLAMA : model_arch_from_name(mt);
        if (a < 0)
            return err_set(e, WELD_ERR_UNSUPPORTED,
                           "%s: model_type '%s' is not supported (supported: llama, mistral, "
                           "qwen2, qwen3)",
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
    for (int i = 0; i < ARCH_COUNT; i++)
        if (strcmp(cls, arch_hf_classes[i]) == 0) {
            c->arch = (enum model_arch)i;
            return WELD_OK;
        }
    if (strcmp(cls, "MistralForCausalLM") == 0) {
        c->arch = ARCH_LLAMA;
        return WELD_OK;
    }
    return err_set(e, WELD_ERR_UNSUPPORTED,
                   "%s: architecture '%s' is not supported (supported: LlamaForCausalLM, "
                   "MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM)",
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
    if (jget_str(root, "model_type", &mt, where, NULL) == WELD_OK && strcmp(mt, "mistral") == 0)
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
                   "linear, llama3)",
                   where, field, type);
}

static int hf_read_flags(const json_t *root, struct model_config *c, const char *where,
                         struct weld_err *e)
{
    bool b = false;
    OPTIONAL(jget_bool(root, "tie_word_embeddings", &c->tied_embeddings, where, e));
    b = false;
    OPTIONAL(jget_bool(root, "attention_bias", &b, where, e));
    if (b && c->arch != ARCH_QWEN2)
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
    c->qkv_bias = c->arch == ARCH_QWEN2;
    c->qk_norm = c->arch == ARCH_QWEN3;
    c->rope_neox = true;
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
        (rc = hf_read_rope(root, c, where, e)) || (rc = hf_read_flags(root, c, where, e)))
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
    case ROPE_SCALING_YARN:
        if (!(isfinite(c->rope_factor) && c->rope_factor > 0.0f))
            return err_set(e, WELD_ERR_FORMAT, "%s: rope scaling factor = %g must be > 0",
                           where, (double)c->rope_factor);
        return WELD_OK;
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
    if ((rc = w_u32(w, a, "vocab_size", c->n_vocab, e)) ||
        (rc = w_u32(w, a, "context_length", c->max_ctx, e)) ||
        (rc = w_u32(w, a, "embedding_length", c->dim, e)) ||
        (rc = w_u32(w, a, "block_count", c->n_layer, e)) ||
        (rc = w_u32(w, a, "feed_forward_length", c->ffn_dim, e)) ||
        (rc = w_u32(w, a, "attention.head_count", c->n_head, e)) ||
        (rc = w_u32(w, a, "attention.head_count_kv", c->n_kv_head, e)) ||
        (rc = w_u32(w, a, "attention.key_length", c->head_dim, e)) ||
        (rc = w_u32(w, a, "attention.value_length", c->head_dim, e)) ||
        (rc = w_u32(w, a, "rope.dimension_count", c->rope_dim, e)) ||
        (rc = w_f32(w, a, "rope.freq_base", c->rope_theta, e)) ||
        (rc = w_f32(w, a, "attention.layer_norm_rms_epsilon", c->norm_eps, e)))
        return rc;
    if (c->sliding_window > 0 &&
        (rc = w_u32(w, a, "attention.sliding_window", c->sliding_window, e)))
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

json_t *model_config_to_hf_json(const struct model_config *c, const char *torch_dtype)
{
    if ((unsigned)c->arch >= ARCH_COUNT)
        return NULL;
    json_t *o = json_object(), *archs = json_array();
    int ok = o && archs && json_array_append_new(archs, json_string(arch_hf_classes[c->arch]))
                               == 0;
    if (!ok) {
        json_decref(o);
        json_decref(archs);
        return NULL;
    }
    jset(o, "architectures", archs, &ok);
    jset(o, "model_type", json_string(model_arch_name(c->arch)), &ok);
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

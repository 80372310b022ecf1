/*
 * test_model_config - model config readers/writers, tensor names and the Q/K permutation.
 *
 * Reference data: the config.json texts below are the published configs of real models
 * (Llama 3.2 1B, Qwen2.5 0.5B, Qwen3 0.6B, Mistral 7B v0.1), trimmed of fields weld does
 * not read; the expected numbers are those models' documented hyperparameters. Llama 3
 * frequency factors are checked against a second formulation (transformers'
 * _compute_llama3_parameters: scale the inverse frequencies, then divide) and against
 * hand-derived values at the ends of the spectrum.
 */
#include "test.h"

#include "core/alloc.h"
#include "core/mfile.h"
#include "format/gguf.h"
#include "model/config.h"
#include "model/names.h"

#include <stdint.h>

static const char llama32_1b[] =
    "{\"architectures\": [\"LlamaForCausalLM\"], \"attention_bias\": false,"
    " \"bos_token_id\": 128000, \"eos_token_id\": 128001, \"head_dim\": 64,"
    " \"hidden_act\": \"silu\", \"hidden_size\": 2048, \"initializer_range\": 0.02,"
    " \"intermediate_size\": 8192, \"max_position_embeddings\": 131072, \"mlp_bias\": false,"
    " \"model_type\": \"llama\", \"num_attention_heads\": 32, \"num_hidden_layers\": 16,"
    " \"num_key_value_heads\": 8, \"pretraining_tp\": 1, \"rms_norm_eps\": 1e-05,"
    " \"rope_scaling\": {\"factor\": 32.0, \"high_freq_factor\": 4.0, \"low_freq_factor\": 1.0,"
    " \"original_max_position_embeddings\": 8192, \"rope_type\": \"llama3\"},"
    " \"rope_theta\": 500000.0, \"tie_word_embeddings\": true, \"torch_dtype\": \"bfloat16\","
    " \"use_cache\": true, \"vocab_size\": 128256}";

static const char qwen25_05b[] =
    "{\"architectures\": [\"Qwen2ForCausalLM\"], \"attention_dropout\": 0.0,"
    " \"bos_token_id\": 151643, \"eos_token_id\": 151643, \"hidden_act\": \"silu\","
    " \"hidden_size\": 896, \"initializer_range\": 0.02, \"intermediate_size\": 4864,"
    " \"max_position_embeddings\": 32768, \"max_window_layers\": 24, \"model_type\": \"qwen2\","
    " \"num_attention_heads\": 14, \"num_hidden_layers\": 24, \"num_key_value_heads\": 2,"
    " \"rms_norm_eps\": 1e-06, \"rope_theta\": 1000000.0, \"sliding_window\": 32768,"
    " \"tie_word_embeddings\": true, \"torch_dtype\": \"bfloat16\", \"use_cache\": true,"
    " \"use_sliding_window\": false, \"vocab_size\": 151936}";

static const char qwen3_06b[] =
    "{\"architectures\": [\"Qwen3ForCausalLM\"], \"attention_bias\": false,"
    " \"attention_dropout\": 0.0, \"bos_token_id\": 151643, \"eos_token_id\": 151645,"
    " \"head_dim\": 128, \"hidden_act\": \"silu\", \"hidden_size\": 1024,"
    " \"initializer_range\": 0.02, \"intermediate_size\": 3072,"
    " \"max_position_embeddings\": 40960, \"max_window_layers\": 28, \"model_type\": \"qwen3\","
    " \"num_attention_heads\": 16, \"num_hidden_layers\": 28, \"num_key_value_heads\": 8,"
    " \"rms_norm_eps\": 1e-06, \"rope_scaling\": null, \"rope_theta\": 1000000,"
    " \"sliding_window\": null, \"tie_word_embeddings\": true, \"torch_dtype\": \"bfloat16\","
    " \"use_cache\": true, \"use_sliding_window\": false, \"vocab_size\": 151936}";

static const char mistral_7b[] =
    "{\"architectures\": [\"MistralForCausalLM\"], \"bos_token_id\": 1, \"eos_token_id\": 2,"
    " \"hidden_act\": \"silu\", \"hidden_size\": 4096, \"initializer_range\": 0.02,"
    " \"intermediate_size\": 14336, \"max_position_embeddings\": 32768,"
    " \"model_type\": \"mistral\", \"num_attention_heads\": 32, \"num_hidden_layers\": 32,"
    " \"num_key_value_heads\": 8, \"rms_norm_eps\": 1e-05, \"rope_theta\": 10000.0,"
    " \"sliding_window\": 4096, \"tie_word_embeddings\": false, \"torch_dtype\": \"bfloat16\","
    " \"vocab_size\": 32000}";

static int parse(const char *json, struct model_config *c, struct weld_err *e)
{
    err_clear(e);
    return model_config_from_hf_json(json, strlen(json), "config.json", c, e);
}

TEST(hf_llama3)
{
    struct model_config c;
    struct weld_err e;
    REQUIRE(parse(llama32_1b, &c, &e) == WELD_OK);
    CHECK_EQ_INT(c.arch, ARCH_LLAMA);
    CHECK_EQ_INT(c.dim, 2048);
    CHECK_EQ_INT(c.n_layer, 16);
    CHECK_EQ_INT(c.n_head, 32);
    CHECK_EQ_INT(c.n_kv_head, 8);
    CHECK_EQ_INT(c.head_dim, 64);
    CHECK_EQ_INT(c.rope_dim, 64);
    CHECK_EQ_INT(c.ffn_dim, 8192);
    CHECK_EQ_INT(c.n_vocab, 128256);
    CHECK_EQ_INT(c.max_ctx, 131072);
    CHECK(c.norm_eps == 1e-5f);
    CHECK(c.rope_theta == 500000.0f);
    CHECK(c.rope_neox);
    CHECK(c.tied_embeddings);
    CHECK(!c.qkv_bias && !c.qk_norm);
    CHECK_EQ_INT(c.rope_scaling, ROPE_SCALING_LLAMA3);
    CHECK(c.rope_factor == 32.0f);
    CHECK(c.rope_low_freq_factor == 1.0f);
    CHECK(c.rope_high_freq_factor == 4.0f);
    CHECK_EQ_INT(c.rope_orig_ctx, 8192);
    CHECK_EQ_INT(c.sliding_window, 0);
}

TEST(hf_qwen2)
{
    struct model_config c;
    struct weld_err e;
    REQUIRE(parse(qwen25_05b, &c, &e) == WELD_OK);
    CHECK_EQ_INT(c.arch, ARCH_QWEN2);
    CHECK_EQ_INT(c.dim, 896);
    CHECK_EQ_INT(c.n_layer, 24);
    CHECK_EQ_INT(c.n_head, 14);
    CHECK_EQ_INT(c.n_kv_head, 2);
    CHECK_EQ_INT(c.head_dim, 64);
    CHECK_EQ_INT(c.ffn_dim, 4864);
    CHECK_EQ_INT(c.n_vocab, 151936);
    CHECK_EQ_INT(c.max_ctx, 32768);
    CHECK(c.norm_eps == 1e-6f);
    CHECK(c.rope_theta == 1000000.0f);
    CHECK(c.qkv_bias && !c.qk_norm && c.rope_neox && c.tied_embeddings);
    CHECK_EQ_INT(c.rope_scaling, ROPE_SCALING_NONE);
    CHECK_EQ_INT(c.sliding_window, 0); /* use_sliding_window false */
}

TEST(hf_qwen3)
{
    struct model_config c;
    struct weld_err e;
    REQUIRE(parse(qwen3_06b, &c, &e) == WELD_OK);
    CHECK_EQ_INT(c.arch, ARCH_QWEN3);
    CHECK_EQ_INT(c.dim, 1024);
    CHECK_EQ_INT(c.n_head, 16);
    CHECK_EQ_INT(c.n_kv_head, 8);
    CHECK_EQ_INT(c.head_dim, 128); /* explicit, != dim / n_head */
    CHECK_EQ_INT(c.rope_dim, 128);
    CHECK_EQ_INT(c.n_layer, 28);
    CHECK_EQ_INT(c.max_ctx, 40960);
    CHECK(!c.qkv_bias && c.qk_norm && c.rope_neox);
    CHECK(c.rope_theta == 1000000.0f);
}

TEST(hf_mistral)
{
    struct model_config c;
    struct weld_err e;
    REQUIRE(parse(mistral_7b, &c, &e) == WELD_OK);
    CHECK_EQ_INT(c.arch, ARCH_LLAMA);
    CHECK_EQ_INT(c.head_dim, 128);
    CHECK_EQ_INT(c.ffn_dim, 14336);
    CHECK_EQ_INT(c.sliding_window, 4096);
    CHECK(!c.tied_embeddings);
    CHECK_EQ_INT(c.n_vocab, 32000);
}

TEST(hf_defaults_and_variants)
{
    struct model_config c;
    struct weld_err e;
    /* no model_type: architectures decides; defaults as transformers' LlamaConfig */
    REQUIRE(parse("{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":64,"
                  "\"num_hidden_layers\":2,\"num_attention_heads\":4,"
                  "\"intermediate_size\":128,\"vocab_size\":100}",
                  &c, &e) == WELD_OK);
    CHECK_EQ_INT(c.arch, ARCH_LLAMA);
    CHECK_EQ_INT(c.n_kv_head, 4);
    CHECK_EQ_INT(c.head_dim, 16);
    CHECK_EQ_INT(c.max_ctx, 2048);
    CHECK(c.norm_eps == 1e-6f);
    CHECK(c.rope_theta == 10000.0f);
    CHECK(!c.tied_embeddings);
    /* linear rope scaling, legacy "type" key; integral reals accepted as integers */
    REQUIRE(parse("{\"model_type\":\"llama\",\"hidden_size\":64.0,\"num_hidden_layers\":2,"
                  "\"num_attention_heads\":4,\"intermediate_size\":128,\"vocab_size\":100,"
                  "\"rope_scaling\":{\"type\":\"linear\",\"factor\":4}}",
                  &c, &e) == WELD_OK);
    CHECK_EQ_INT(c.rope_scaling, ROPE_SCALING_LINEAR);
    CHECK(c.rope_factor == 4.0f);
    CHECK_EQ_INT(c.dim, 64);
    /* "default" rope type is no scaling; newer transformers' rope_parameters */
    REQUIRE(parse("{\"model_type\":\"qwen3\",\"hidden_size\":64,\"num_hidden_layers\":2,"
                  "\"num_attention_heads\":4,\"intermediate_size\":128,\"vocab_size\":100,"
                  "\"rope_parameters\":{\"rope_type\":\"default\",\"rope_theta\":5000}}",
                  &c, &e) == WELD_OK);
    CHECK_EQ_INT(c.rope_scaling, ROPE_SCALING_NONE);
    CHECK(c.rope_theta == 5000.0f);
    CHECK_EQ_INT(c.max_ctx, 32768);
}

/* Parse json, expect status st and every string in subs to appear in the message. */
static int expect_err(const char *json, int st, const char *sub1, const char *sub2)
{
    struct model_config c;
    struct weld_err e;
    int rc = parse(json, &c, &e);
    int ok = rc == st && strstr(e.msg, "config.json") && (!sub1 || strstr(e.msg, sub1)) &&
             (!sub2 || strstr(e.msg, sub2));
    if (!ok)
        fprintf(stderr, "  json %s\n  got status %d: %s\n", json, rc, e.msg);
    return ok;
}

#define BASE "\"hidden_size\":64,\"num_hidden_layers\":2,\"intermediate_size\":128," \
             "\"vocab_size\":100"

TEST(hf_errors)
{
    CHECK(expect_err("{\"model_type\":\"llama\"," BASE ",\"num_attention_heads\":\"8\"}",
                     WELD_ERR_FORMAT, "'num_attention_heads'", "integer"));
    CHECK(expect_err("{\"model_type\":\"llama\"," BASE ",\"num_attention_heads\":4.5}",
                     WELD_ERR_FORMAT, "'num_attention_heads'", "integer"));
    CHECK(expect_err("{\"model_type\":\"llama\",\"num_hidden_layers\":2,"
                     "\"intermediate_size\":128,\"vocab_size\":100,\"num_attention_heads\":4}",
                     WELD_ERR_FORMAT, "missing field 'hidden_size'", NULL));
    CHECK(expect_err("{\"model_type\":\"gpt2\"," BASE ",\"num_attention_heads\":4}",
                     WELD_ERR_UNSUPPORTED, "gpt2", "qwen3"));
    CHECK(expect_err("{\"architectures\":[\"GPT2LMHeadModel\"]," BASE
                     ",\"num_attention_heads\":4}",
                     WELD_ERR_UNSUPPORTED, "GPT2LMHeadModel", "Qwen2ForCausalLM"));
    CHECK(expect_err("{" BASE ",\"num_attention_heads\":4}", WELD_ERR_FORMAT, "model_type",
                     NULL));
    CHECK(expect_err("{\"model_type\":\"llama\"," BASE ",\"num_attention_heads\":4,"
                     "\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":4}}",
                     WELD_ERR_UNSUPPORTED, "yarn", NULL));
    CHECK(expect_err("{\"model_type\":\"llama\"," BASE ",\"num_attention_heads\":4,"
                     "\"rope_scaling\":{\"rope_type\":\"linear\"}}",
                     WELD_ERR_FORMAT, "factor", NULL));
    CHECK(expect_err("{\"model_type\":\"llama\"," BASE ",\"num_attention_heads\":4,"
                     "\"num_key_value_heads\":3}",
                     WELD_ERR_FORMAT, "kv head", NULL));
    CHECK(expect_err("{\"model_type\":\"llama\"," BASE ",\"num_attention_heads\":4,"
                     "\"head_dim\":15}",
                     WELD_ERR_FORMAT, "rope_dim", "even"));
    CHECK(expect_err("{\"model_type\":\"llama\"," BASE ",\"num_attention_heads\":1e300}",
                     WELD_ERR_FORMAT, "'num_attention_heads'", "range"));
    CHECK(expect_err("{\"model_type\":\"llama\"," BASE ",\"num_attention_heads\":-4}",
                     WELD_ERR_FORMAT, "'num_attention_heads'", "range"));
    CHECK(expect_err("{\"model_type\":\"llama\"," BASE ",\"num_attention_heads\":0}",
                     WELD_ERR_FORMAT, "num_attention_heads", NULL));
    CHECK(expect_err("{\"model_type\":\"llama\"," BASE ",\"num_attention_heads\":4,"
                     "\"rms_norm_eps\":0}",
                     WELD_ERR_FORMAT, "epsilon", NULL));
    CHECK(expect_err("{\"model_type\":\"llama\"," BASE ",\"num_attention_heads\":4,"
                     "\"hidden_act\":\"gelu\"}",
                     WELD_ERR_UNSUPPORTED, "hidden_act", NULL));
    CHECK(expect_err("{\"model_type\":\"llama\"," BASE ",\"num_attention_heads\":4,"
                     "\"attention_bias\":true}",
                     WELD_ERR_UNSUPPORTED, "attention_bias", NULL));
    CHECK(expect_err("{\"model_type\":\"llama\"," BASE ",\"num_attention_heads\":4,"
                     "\"tie_word_embeddings\":1}",
                     WELD_ERR_FORMAT, "tie_word_embeddings", NULL));
    CHECK(expect_err("{\"model_type\":\"llama\"," BASE ",\"num_attention_heads\":4,"
                     "\"rope_scaling\":{\"rope_type\":\"llama3\",\"low_freq_factor\":4,"
                     "\"high_freq_factor\":1}}",
                     WELD_ERR_FORMAT, "low_freq_factor", NULL));
    CHECK(expect_err("{\"model_type\":\"llama\", \"hidden_size\": ", WELD_ERR_FORMAT,
                     "JSON", NULL));
    CHECK(expect_err("[1,2]", WELD_ERR_FORMAT, "object", NULL));
}

TEST(hf_from_dir)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", test_tmpdir());
    struct weld_err e;
    REQUIRE(file_write_all(path, qwen3_06b, strlen(qwen3_06b), &e) == WELD_OK);
    struct model_config c;
    REQUIRE(model_config_from_hf(test_tmpdir(), &c, &e) == WELD_OK);
    CHECK_EQ_INT(c.arch, ARCH_QWEN3);
    CHECK_EQ_INT(c.head_dim, 128);
    char sub[4200];
    snprintf(sub, sizeof sub, "%s/nonexistent", test_tmpdir());
    CHECK(model_config_from_hf(sub, &c, &e) != WELD_OK);
    CHECK(strstr(e.msg, "nonexistent/config.json") != NULL);
}

static int same_config(const struct model_config *a, const struct model_config *b)
{
    return a->arch == b->arch && strcmp(a->name, b->name) == 0 && a->n_vocab == b->n_vocab &&
           a->dim == b->dim && a->n_layer == b->n_layer && a->n_head == b->n_head &&
           a->n_kv_head == b->n_kv_head && a->head_dim == b->head_dim &&
           a->ffn_dim == b->ffn_dim && a->max_ctx == b->max_ctx &&
           a->rope_dim == b->rope_dim && a->norm_eps == b->norm_eps &&
           a->rope_theta == b->rope_theta && a->rope_neox == b->rope_neox &&
           a->rope_scaling == b->rope_scaling && a->rope_factor == b->rope_factor &&
           a->rope_low_freq_factor == b->rope_low_freq_factor &&
           a->rope_high_freq_factor == b->rope_high_freq_factor &&
           a->rope_orig_ctx == b->rope_orig_ctx && a->tied_embeddings == b->tied_embeddings &&
           a->qkv_bias == b->qkv_bias && a->qk_norm == b->qk_norm &&
           a->sliding_window == b->sliding_window;
}

TEST(hf_json_round_trip)
{
    const char *srcs[] = {llama32_1b, qwen25_05b, qwen3_06b, mistral_7b};
    for (size_t i = 0; i < sizeof srcs / sizeof srcs[0]; i++) {
        struct model_config a, b;
        struct weld_err e;
        REQUIRE(parse(srcs[i], &a, &e) == WELD_OK);
        snprintf(a.name, sizeof a.name, "test/model-%zu", i);
        json_t *j = model_config_to_hf_json(&a, "bfloat16");
        REQUIRE(j != NULL);
        const char *dt = NULL;
        CHECK(jget_str(j, "torch_dtype", &dt, "x", NULL) == WELD_OK && strcmp(dt, "bfloat16") == 0);
        char *s = json_dumps(j, JSON_COMPACT);
        json_decref(j);
        REQUIRE(s != NULL);
        int rc = parse(s, &b, &e);
        if (rc != WELD_OK)
            fprintf(stderr, "  %s\n  %s\n", s, e.msg);
        free(s);
        REQUIRE(rc == WELD_OK);
        CHECK(same_config(&a, &b));
    }
}

TEST(gguf_round_trip)
{
    const char *srcs[] = {llama32_1b, qwen25_05b, qwen3_06b, mistral_7b};
    for (size_t i = 0; i < sizeof srcs / sizeof srcs[0]; i++) {
        struct model_config a, b;
        struct weld_err e;
        REQUIRE(parse(srcs[i], &a, &e) == WELD_OK);
        if (i == 1) { /* exercise linear scaling too */
            a.rope_scaling = ROPE_SCALING_LINEAR;
            a.rope_factor = 2.5f;
        }
        snprintf(a.name, sizeof a.name, "round trip %zu", i);
        struct gguf_writer *w = gguf_writer_create();
        REQUIRE(w != NULL);
        REQUIRE(model_config_to_gguf(&a, w, &e) == WELD_OK);
        char path[4200];
        snprintf(path, sizeof path, "%s/cfg%zu.gguf", test_tmpdir(), i);
        int rc = gguf_writer_write(w, path, &e);
        gguf_writer_free(w);
        REQUIRE(rc == WELD_OK);
        struct gguf_file *f = NULL;
        REQUIRE(gguf_open(&f, path, &e) == WELD_OK);
        rc = model_config_from_gguf(f, &b, &e);
        gguf_close(f);
        if (rc != WELD_OK)
            fprintf(stderr, "  %s\n", e.msg);
        REQUIRE(rc == WELD_OK);
        /* GGUF conventions: llama rows are permuted (adjacent-pair rope); no tensors here,
           so no output.weight, so tied */
        CHECK_EQ_INT(b.rope_neox, a.arch != ARCH_LLAMA);
        CHECK(b.tied_embeddings);
        b.rope_neox = a.rope_neox;
        b.tied_embeddings = a.tied_embeddings;
        CHECK(same_config(&a, &b));
    }
}

/* Build a GGUF with only metadata; keys as (name, type, value) triples. */
static int write_meta_gguf(const char *path, const char *arch, int with_layer_count,
                           const char *scaling_type)
{
    struct gguf_writer *w = gguf_writer_create();
    char key[128];
    if (!w)
        return -1;
    gguf_writer_set_str(w, "general.architecture", arch);
    snprintf(key, sizeof key, "%s.embedding_length", arch);
    gguf_writer_set_u32(w, key, 64);
    if (with_layer_count) {
        snprintf(key, sizeof key, "%s.block_count", arch);
        gguf_writer_set_u32(w, key, 2);
    }
    snprintf(key, sizeof key, "%s.feed_forward_length", arch);
    gguf_writer_set_u32(w, key, 128);
    snprintf(key, sizeof key, "%s.attention.head_count", arch);
    gguf_writer_set_u32(w, key, 4);
    snprintf(key, sizeof key, "%s.context_length", arch);
    gguf_writer_set_u32(w, key, 256);
    const char *toks[] = {"a", "b", "c"};
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, NULL, 3);
    if (scaling_type) {
        snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
        gguf_writer_set_str(w, key, scaling_type);
    }
    struct weld_err e;
    int rc = gguf_writer_write(w, path, &e);
    gguf_writer_free(w);
    return rc;
}

static int gguf_cfg(const char *arch, int with_layer_count, const char *scaling,
                    struct model_config *c, struct weld_err *e)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/meta.gguf", test_tmpdir());
    if (write_meta_gguf(path, arch, with_layer_count, scaling) != 0)
        return -1;
    struct gguf_file *f = NULL;
    int rc = gguf_open(&f, path, e);
    if (rc != WELD_OK)
        return rc;
    rc = model_config_from_gguf(f, c, e);
    gguf_close(f);
    return rc;
}

TEST(gguf_defaults_and_errors)
{
    struct model_config c;
    struct weld_err e;
    REQUIRE(gguf_cfg("qwen2", 1, NULL, &c, &e) == WELD_OK);
    CHECK_EQ_INT(c.arch, ARCH_QWEN2);
    CHECK_EQ_INT(c.n_vocab, 3);       /* tokenizer.ggml.tokens length */
    CHECK_EQ_INT(c.n_kv_head, 4);     /* = n_head */
    CHECK_EQ_INT(c.head_dim, 16);     /* dim / n_head */
    CHECK_EQ_INT(c.rope_dim, 16);
    CHECK(c.rope_theta == 10000.0f);
    CHECK(c.norm_eps == 1e-5f);
    CHECK(c.rope_neox && c.qkv_bias && !c.qk_norm && c.tied_embeddings);
    CHECK_EQ_INT(c.rope_scaling, ROPE_SCALING_NONE);
    REQUIRE(gguf_cfg("qwen3", 1, "none", &c, &e) == WELD_OK);
    CHECK(c.qk_norm && !c.qkv_bias);
    CHECK_EQ_INT(gguf_cfg("gpt2", 1, NULL, &c, &e), WELD_ERR_UNSUPPORTED);
    CHECK(strstr(e.msg, "gpt2") && strstr(e.msg, "llama, qwen2, qwen3") &&
          strstr(e.msg, "meta.gguf"));
    CHECK_EQ_INT(gguf_cfg("llama", 0, NULL, &c, &e), WELD_ERR_FORMAT);
    CHECK(strstr(e.msg, "llama.block_count") != NULL);
    CHECK_EQ_INT(gguf_cfg("llama", 1, "yarn", &c, &e), WELD_ERR_UNSUPPORTED);
    CHECK(strstr(e.msg, "yarn") != NULL);
}

/* transformers' _compute_llama3_parameters: scale the inverse frequencies themselves
   (long wavelengths / factor, medium ones interpolated); the divisor is old / new. */
static double ref_divisor(double theta, int dim, int i, double factor, double lo, double hi,
                          double orig)
{
    double inv_freq = 1.0 / pow(theta, (double)(2 * i) / dim);
    double wavelen = 2 * M_PI / inv_freq;
    double llama = wavelen > orig / lo ? inv_freq / factor : inv_freq;
    double smooth = (orig / wavelen - lo) / (hi - lo);
    double smoothed = (1 - smooth) * llama / factor + smooth * llama;
    int medium = !(wavelen < orig / hi) && !(wavelen > orig / lo);
    return inv_freq / (medium ? smoothed : llama);
}

TEST(llama3_freq_factors)
{
    struct model_config c;
    struct weld_err e;
    REQUIRE(parse(llama32_1b, &c, &e) == WELD_OK);
    float f[32];
    model_config_llama3_freq_factors(&c, f);
    int n_one = 0, n_factor = 0, n_mid = 0;
    for (int i = 0; i < 32; i++) {
        double r = ref_divisor(500000.0, 64, i, 32.0, 1.0, 4.0, 8192.0);
        CHECK_NEAR(f[i], r, 1e-5 * r);
        if (i > 0)
            CHECK(f[i] >= f[i - 1]);
        n_one += f[i] == 1.0f;
        n_factor += f[i] == 32.0f;
        n_mid += f[i] > 1.0f && f[i] < 32.0f;
    }
    /* hand-derived: wavelen_i = 2 pi 500000^(i/32): i = 14: 1956.5 < 8192/4 (factor 1),
       i = 15..17: 2948, 4443, 6695 (interpolated), i = 18: 10089 > 8192/1 (factor 32) */
    CHECK_EQ_INT(n_one, 15);
    CHECK_EQ_INT(n_mid, 3);
    CHECK_EQ_INT(n_factor, 14);
    CHECK(f[0] == 1.0f && f[31] == 32.0f);
    /* i = 16: wavelen 4442.88; smooth = (8192/4442.88 - 1) / 3 = 0.28129 */
    double s = (8192.0 / (2 * M_PI * sqrt(500000.0)) - 1.0) / 3.0;
    CHECK_NEAR(f[16], 1.0 / ((1 - s) / 32.0 + s), 1e-4);
    /* no scaling: all ones */
    c.rope_scaling = ROPE_SCALING_NONE;
    model_config_llama3_freq_factors(&c, f);
    for (int i = 0; i < 32; i++)
        CHECK(f[i] == 1.0f);
}

TEST(validate)
{
    struct model_config c;
    struct weld_err e;
    REQUIRE(parse(qwen3_06b, &c, &e) == WELD_OK);
    CHECK(model_config_validate(&c, "x", &e) == WELD_OK);
    struct model_config d = c;
    d.n_layer = 2000;
    CHECK(model_config_validate(&d, "where.json", &e) == WELD_ERR_FORMAT);
    CHECK(strstr(e.msg, "where.json") && strstr(e.msg, "layer count"));
    d = c;
    d.rope_dim = 130;
    CHECK(model_config_validate(&d, "x", &e) == WELD_ERR_FORMAT && strstr(e.msg, "rope_dim"));
    d = c;
    d.n_vocab = 5 << 20;
    CHECK(model_config_validate(&d, "x", &e) == WELD_ERR_FORMAT && strstr(e.msg, "vocab"));
    d = c;
    d.rope_theta = NAN;
    CHECK(model_config_validate(&d, "x", &e) == WELD_ERR_FORMAT && strstr(e.msg, "rope_theta"));
    d = c;
    d.arch = (enum model_arch)7;
    CHECK(model_config_validate(&d, "x", &e) == WELD_ERR_FORMAT);
    CHECK_EQ_STR(model_arch_name(ARCH_QWEN2), "qwen2");
    CHECK_EQ_INT(model_arch_from_name("qwen3"), ARCH_QWEN3);
    CHECK_EQ_INT(model_arch_from_name("gpt2"), -1);
}

/* ---- names ---- */

static const char *const hf_layer_suffixes[] = {
    "input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.q_proj.bias",
    "self_attn.k_proj.weight", "self_attn.k_proj.bias", "self_attn.v_proj.weight",
    "self_attn.v_proj.bias", "self_attn.o_proj.weight", "self_attn.q_norm.weight",
    "self_attn.k_norm.weight", "post_attention_layernorm.weight", "mlp.gate_proj.weight",
    "mlp.up_proj.weight", "mlp.down_proj.weight"};
static const char *const gguf_layer_suffixes[] = {
    "attn_norm.weight", "attn_q.weight", "attn_q.bias", "attn_k.weight", "attn_k.bias",
    "attn_v.weight", "attn_v.bias", "attn_output.weight", "attn_q_norm.weight",
    "attn_k_norm.weight", "ffn_norm.weight", "ffn_gate.weight", "ffn_up.weight",
    "ffn_down.weight"};

TEST(names_round_trip)
{
    char out[256], back[256], hf[256], gg[256];
    const char *glob[][2] = {{"model.embed_tokens.weight", "token_embd.weight"},
                             {"model.norm.weight", "output_norm.weight"},
                             {"lm_head.weight", "output.weight"}};
    for (int i = 0; i < 3; i++) {
        CHECK(tensor_name_hf_to_gguf(glob[i][0], out, sizeof out) == 0);
        CHECK_EQ_STR(out, glob[i][1]);
        CHECK(tensor_name_gguf_to_hf(glob[i][1], back, sizeof back) == 0);
        CHECK_EQ_STR(back, glob[i][0]);
    }
    const int layers[] = {0, 7, 10, 123, 2147483647};
    for (size_t l = 0; l < sizeof layers / sizeof layers[0]; l++)
        for (size_t i = 0; i < 14; i++) {
            snprintf(hf, sizeof hf, "model.layers.%d.%s", layers[l], hf_layer_suffixes[i]);
            snprintf(gg, sizeof gg, "blk.%d.%s", layers[l], gguf_layer_suffixes[i]);
            CHECK(tensor_name_hf_to_gguf(hf, out, sizeof out) == 0);
            CHECK_EQ_STR(out, gg);
            CHECK(tensor_name_gguf_to_hf(gg, back, sizeof back) == 0);
            CHECK_EQ_STR(back, hf);
        }
}

TEST(names_reject)
{
    char out[256];
    const char *bad_hf[] = {"model.layers.01.mlp.up_proj.weight",
                            "model.layers.-1.mlp.up_proj.weight",
                            "model.layers.+1.mlp.up_proj.weight",
                            "model.layers..mlp.up_proj.weight",
                            "model.layers.2147483648.mlp.up_proj.weight",
                            "model.layers.99999999999999999999.mlp.up_proj.weight",
                            "model.layers.1x.mlp.up_proj.weight",
                            "model.layers.1.mlp.up_proj.weightx",
                            "model.layers.1.mlp.up_proj.weight.",
                            "model.layers.1.mlp.up_proj",
                            "model.layers.1",
                            "model.layers.",
                            "model.embed_tokens.weight ",
                            "model.rotary_emb.inv_freq",
                            "blk.0.ffn_up.weight",
                            ""};
    for (size_t i = 0; i < sizeof bad_hf / sizeof bad_hf[0]; i++)
        if (tensor_name_hf_to_gguf(bad_hf[i], out, sizeof out) == 0) {
            fprintf(stderr, "  accepted '%s' -> '%s'\n", bad_hf[i], out);
            CHECK(0);
        }
    const char *bad_gguf[] = {"blk.00.ffn_up.weight", "blk.1.ffn_up", "blk.1.ffn_up.weight2",
                              "blk.4294967296.ffn_up.weight", "blk.1", "blk.1.", "output",
                              "model.layers.0.mlp.up_proj.weight", "rope_freqs.weight"};
    for (size_t i = 0; i < sizeof bad_gguf / sizeof bad_gguf[0]; i++)
        if (tensor_name_gguf_to_hf(bad_gguf[i], out, sizeof out) == 0) {
            fprintf(stderr, "  accepted '%s' -> '%s'\n", bad_gguf[i], out);
            CHECK(0);
        }
    /* output buffer too small */
    CHECK(tensor_name_hf_to_gguf("model.layers.12.mlp.up_proj.weight", out, 10) == -1);
    CHECK(tensor_name_hf_to_gguf("model.layers.12.mlp.up_proj.weight", out, 20) == -1);
    CHECK(tensor_name_hf_to_gguf("model.layers.12.mlp.up_proj.weight", out, 21) == 0);
    CHECK_EQ_STR(out, "blk.12.ffn_up.weight");
}

/* ---- permutation ---- */

TEST(permute_hand_case)
{
    /* 2 heads of head_dim 4, rows of 2 floats: HF rows per head are
       (half 0: i=0, i=1), (half 1: i=0, i=1) -> GGUF (i=0: half 0, half 1), (i=1: ...) */
    float hf[8][2], gg[8][2], back[8][2];
    for (int r = 0; r < 8; r++) {
        hf[r][0] = (float)r;
        hf[r][1] = (float)(100 + r);
    }
    rope_permute_rows(hf, gg, 2, 4, sizeof hf[0], 1);
    const int expect[8] = {0, 2, 1, 3, 4, 6, 5, 7};
    for (int r = 0; r < 8; r++) {
        CHECK(gg[r][0] == (float)expect[r]);
        CHECK(gg[r][1] == (float)(100 + expect[r]));
    }
    rope_permute_rows(gg, back, 2, 4, sizeof hf[0], 0);
    CHECK(memcmp(hf, back, sizeof hf) == 0);
}

/* Independent model of the permutation: adjacent-pair rope on GGUF rows must equal
   rotate-half rope on HF rows (that is why the permutation exists). */
TEST(permute_rope_equivalence)
{
    enum { NH = 3, HD = 8 };
    float w_hf[NH * HD], w_gg[NH * HD];
    for (int r = 0; r < NH * HD; r++)
        w_hf[r] = sinf((float)r * 1.7f) + 0.1f * (float)r;
    rope_permute_rows(w_hf, w_gg, NH, HD, sizeof(float), 1);
    float pos = 5.0f;
    for (int h = 0; h < NH; h++)
        for (int i = 0; i < HD / 2; i++) {
            float th = pos * powf(10000.0f, -2.0f * (float)i / HD);
            float c = cosf(th), s = sinf(th);
            const float *a = w_hf + h * HD, *b = w_gg + h * HD;
            /* neox: pair (i, i + HD/2); normal: pair (2i, 2i+1) */
            float n0 = a[i] * c - a[i + HD / 2] * s, n1 = a[i] * s + a[i + HD / 2] * c;
            float g0 = b[2 * i] * c - b[2 * i + 1] * s, g1 = b[2 * i] * s + b[2 * i + 1] * c;
            CHECK_NEAR(n0, g0, 1e-6);
            CHECK_NEAR(n1, g1, 1e-6);
        }
}

TEST(permute_identity_random)
{
    enum { NH = 5, HD = 64, ROW = 3 };
    static uint16_t src[NH * HD * ROW], mid[NH * HD * ROW], back[NH * HD * ROW];
    for (size_t i = 0; i < sizeof src / sizeof src[0]; i++)
        src[i] = (uint16_t)(i * 2654435761u >> 7);
    rope_permute_rows(src, mid, NH, HD, ROW * sizeof(uint16_t), 1);
    CHECK(memcmp(src, mid, sizeof src) != 0);
    rope_permute_rows(mid, back, NH, HD, ROW * sizeof(uint16_t), 0);
    CHECK(memcmp(src, back, sizeof src) == 0);
    rope_permute_rows(src, mid, NH, HD, ROW * sizeof(uint16_t), 0);
    rope_permute_rows(mid, back, NH, HD, ROW * sizeof(uint16_t), 1);
    CHECK(memcmp(src, back, sizeof src) == 0);
}

int main(void)
{
    RUN(hf_llama3);
    RUN(hf_qwen2);
    RUN(hf_qwen3);
    RUN(hf_mistral);
    RUN(hf_defaults_and_variants);
    RUN(hf_errors);
    RUN(hf_from_dir);
    RUN(hf_json_round_trip);
    RUN(gguf_round_trip);
    RUN(gguf_defaults_and_errors);
    RUN(llama3_freq_factors);
    RUN(validate);
    RUN(names_round_trip);
    RUN(names_reject);
    RUN(permute_hand_case);
    RUN(permute_rope_equivalence);
    RUN(permute_identity_random);
    return test_summary();
}

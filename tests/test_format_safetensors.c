/*
 * Tests for src/format/safetensors.c.
 *
 * The reference for the format is a set of files assembled byte by byte here (an 8-byte
 * little-endian length, a JSON header written out as a literal, then the data), so the
 * reader is checked against the format itself and not against our own writer. The writer
 * is then checked by reading its output back and by inspecting its bytes (padding, index
 * JSON). Malformed inputs each expect a status and a message naming the tensor and field;
 * truncation is tried at every offset on an exact-size heap copy so ASan sees any overread;
 * fault injection fails every allocation in turn on the open and write paths.
 */
#include "core/alloc.h"
#include "core/fp16.h"
#include "core/json.h"
#include "format/safetensors.h"
#include "test.h"

#include <stdarg.h>
#include <stdint.h>
#include <sys/stat.h>

/* ---- helpers ---- */

struct buf {
    uint8_t *p;
    size_t n;
};

/* An image: u64 header length, header (padded with `pad` spaces), then data_len bytes
   0, 1, 2, ... */
static struct buf make_image(const char *header, size_t pad, size_t data_len)
{
    size_t hl = strlen(header) + pad;
    struct buf b = {malloc(8 + hl + data_len + 1), 8 + hl + data_len};
    for (int i = 0; i < 8; i++)
        b.p[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memcpy(b.p + 8, header, strlen(header));
    memset(b.p + 8 + strlen(header), ' ', pad);
    for (size_t i = 0; i < data_len; i++)
        b.p[8 + hl + i] = (uint8_t)i;
    return b;
}

/* Open an image from a heap copy of exactly n bytes; returns the status, fills e. */
static int open_bytes(const uint8_t *p, size_t n, struct weld_err *e)
{
    uint8_t *copy = malloc(n ? n : 1);
    memcpy(copy, p, n);
    struct st_set *s = NULL;
    err_clear(e);
    int rc = st_open_memory(&s, copy, n, "bad.safetensors", e);
    if (rc == WELD_OK) {
        for (int i = 0; i < s->n_tensors; i++)
            if (st_find(s, s->tensors[i].name) != &s->tensors[i])
                rc = -1;
        st_close(s);
    } else if (s != NULL) {
        rc = -2;
    }
    free(copy);
    return rc;
}

/* Expect header (with data_len data bytes) to fail with status and a message containing
   each of the NULL-terminated substrings. */
static int expect_bad(const char *header, size_t data_len, int status, ...)
{
    struct buf b = make_image(header, 0, data_len);
    struct weld_err e;
    int rc = open_bytes(b.p, b.n, &e);
    free(b.p);
    int ok = rc == status;
    va_list ap;
    va_start(ap, status);
    for (const char *sub; (sub = va_arg(ap, const char *)) != NULL;)
        if (!strstr(e.msg, sub))
            ok = 0;
    va_end(ap);
    if (!ok)
        fprintf(stderr, "  header %s: rc %d (want %d), msg: %s\n", header, rc, status, e.msg);
    return ok;
}

static void write_file(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    fwrite(p, 1, n, f);
    fclose(f);
}

static void write_str(const char *path, const char *s) { write_file(path, s, strlen(s)); }

/* dir/name in one of 8 rotating buffers: use the result right away. */
static const char *path_in(const char *dir, const char *name)
{
    static char bufs[8][4096];
    static int k;
    char *p = bufs[k++ & 7];
    snprintf(p, 4096, "%s/%s", dir, name);
    return p;
}

/* A directory under the test's scratch dir; its path goes into out (4096 bytes). */
static const char *new_dir(char *out, const char *name)
{
    snprintf(out, 4096, "%s/%s", test_tmpdir(), name);
    mkdir(out, 0755);
    return out;
}

/* ---- reading hand-made files ---- */

TEST(reads_handmade_file)
{
    const char *h = "{\"__metadata__\":{\"format\":\"pt\"},"
                    "\"b\":{\"dtype\":\"F16\",\"shape\":[2,2],\"data_offsets\":[16,24]},"
                    "\"a\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]},"
                    "\"s\":{\"dtype\":\"BF16\",\"shape\":[],\"data_offsets\":[24,26]},"
                    "\"z\":{\"dtype\":\"F32\",\"shape\":[0,7],\"data_offsets\":[26,26]},"
                    "\"i\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[32,40]}}";
    struct buf b = make_image(h, 3, 40);
    struct st_set *s = NULL;
    struct weld_err e;
    err_clear(&e);
    REQUIRE(st_open_memory(&s, b.p, b.n, "m.safetensors", &e) == WELD_OK);
    CHECK_EQ_INT(s->n_tensors, 5);
    CHECK_EQ_INT(s->n_files, 1);
    const struct st_tensor *a = st_find(s, "a"), *t16 = st_find(s, "b"), *sc = st_find(s, "s");
    const struct st_tensor *z = st_find(s, "z"), *i64 = st_find(s, "i");
    REQUIRE(a && t16 && sc && z && i64);
    CHECK_EQ_INT(a->dtype, DT_F32);
    CHECK_EQ_STR(a->dtype_name, "F32");
    CHECK_EQ_INT(a->n_dims, 2);
    CHECK_EQ_INT(a->shape[0], 2);
    CHECK_EQ_INT(a->shape[1], 2);
    CHECK_EQ_INT(a->nbytes, 16);
    CHECK(a->data == b.p + 8 + strlen(h) + 3);
    CHECK_EQ_INT(((const uint8_t *)t16->data)[0], 16);
    CHECK_EQ_INT(t16->dtype, DT_F16);
    CHECK_EQ_INT(sc->dtype, DT_BF16);
    CHECK_EQ_INT(sc->n_dims, 0);
    CHECK_EQ_INT(sc->nbytes, 2);
    CHECK_EQ_INT(z->nbytes, 0);
    CHECK_EQ_INT(i64->dtype, -1);
    CHECK_EQ_STR(i64->dtype_name, "I64");
    CHECK(st_find(s, "nope") == NULL);
    CHECK(st_find(s, "") == NULL);
    CHECK(st_find(NULL, "a") == NULL);
    REQUIRE(s->metadata_json != NULL);
    json_t *md = jload_buf(s->metadata_json, strlen(s->metadata_json), "md", &e);
    REQUIRE(md != NULL);
    CHECK_EQ_STR(json_string_value(json_object_get(md, "format")), "pt");
    json_decref(md);
    CHECK(s->dir == NULL);
    CHECK_EQ_STR(s->file_paths[0], "m.safetensors");
    st_close(s);
    st_close(NULL);
    free(b.p);
}

TEST(every_known_dtype_opens)
{
    static const struct { const char *name; int bytes_per_8; } dt[] = {
        {"F64", 64}, {"I8", 8}, {"U8", 8}, {"I16", 16}, {"U16", 16}, {"I32", 32}, {"U32", 32},
        {"I64", 64}, {"U64", 64}, {"BOOL", 8}, {"F8_E4M3", 8}, {"F8_E5M2", 8}, {"F4", 4},
        {"F6_E2M3", 6}};
    for (size_t k = 0; k < sizeof dt / sizeof dt[0]; k++) {
        char h[256];
        snprintf(h, sizeof h, "{\"x\":{\"dtype\":\"%s\",\"shape\":[8],\"data_offsets\":[0,%d]}}",
                 dt[k].name, dt[k].bytes_per_8);
        struct buf b = make_image(h, 0, (size_t)dt[k].bytes_per_8);
        struct st_set *s = NULL;
        CHECK_EQ_INT(st_open_memory(&s, b.p, b.n, "d.safetensors", NULL), WELD_OK);
        if (s) {
            CHECK_EQ_INT(s->tensors[0].dtype, -1);
            CHECK_EQ_STR(s->tensors[0].dtype_name, dt[k].name);
        }
        st_close(s);
        free(b.p);
    }
    /* F4 with an odd element count is not a whole number of bytes */
    CHECK(expect_bad("{\"x\":{\"dtype\":\"F4\",\"shape\":[3],\"data_offsets\":[0,2]}}", 2,
                     WELD_ERR_FORMAT, "'x'", "whole number of bytes", NULL));
}

TEST(empty_header_object_and_lookup_of_many)
{
    struct buf empty = make_image("{}", 6, 0);
    struct weld_err e;
    CHECK_EQ_INT(open_bytes(empty.p, empty.n, &e), WELD_OK);
    free(empty.p);
    char *h = malloc(1 << 16);
    size_t n = 0;
    n += (size_t)sprintf(h + n, "{");
    for (int i = 0; i < 300; i++)
        n += (size_t)sprintf(h + n, "%s\"layer.%d.w\":{\"dtype\":\"F32\",\"shape\":[1],"
                             "\"data_offsets\":[%d,%d]}", i ? "," : "", (i * 7919) % 300,
                             4 * i, 4 * i + 4);
    sprintf(h + n, "}");
    struct buf b = make_image(h, 0, 1200);
    struct st_set *s = NULL;
    REQUIRE(st_open_memory(&s, b.p, b.n, "many", NULL) == WELD_OK);
    CHECK_EQ_INT(s->n_tensors, 300);
    for (int i = 0; i < 300; i++) {
        char name[32];
        snprintf(name, sizeof name, "layer.%d.w", i);
        const struct st_tensor *t = st_find(s, name);
        CHECK(t != NULL && strcmp(t->name, name) == 0);
    }
    for (int i = 1; i < s->n_tensors; i++)
        CHECK(strcmp(s->tensors[i - 1].name, s->tensors[i].name) < 0);
    st_close(s);
    free(b.p);
    free(h);
}

/* ---- malformed files ---- */

TEST(truncated_at_every_offset)
{
    const char *h = "{\"__metadata__\":{\"k\":\"v\"},"
                    "\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,12]},"
                    "\"b\":{\"dtype\":\"BF16\",\"shape\":[2,1],\"data_offsets\":[12,16]}}";
    struct buf b = make_image(h, 5, 16);
    struct weld_err e;
    CHECK_EQ_INT(open_bytes(b.p, b.n, &e), WELD_OK);
    int all_failed = 1, named = 1;
    for (size_t k = 0; k < b.n; k++) {
        int rc = open_bytes(b.p, k, &e);
        if (rc != WELD_ERR_FORMAT) {
            all_failed = 0;
            fprintf(stderr, "  truncated at %zu: rc %d\n", k, rc);
        }
        if (!strstr(e.msg, "bad.safetensors"))
            named = 0;
    }
    CHECK(all_failed);
    CHECK(named);
    CHECK_EQ_INT(open_bytes(b.p, 5, &e), WELD_ERR_FORMAT);
    CHECK(strstr(e.msg, "too short") != NULL);
    CHECK_EQ_INT(open_bytes(b.p, 60, &e), WELD_ERR_FORMAT);
    CHECK(strstr(e.msg, "past the end of the file") != NULL);
    CHECK_EQ_INT(open_bytes(b.p, b.n - 1, &e), WELD_ERR_FORMAT);
    CHECK(strstr(e.msg, "tensor 'b'") && strstr(e.msg, "past end of data (15 bytes)"));
    free(b.p);
}

TEST(header_length_huge)
{
    struct weld_err e;
    uint8_t img[16] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, '{', '}'};
    CHECK_EQ_INT(open_bytes(img, sizeof img, &e), WELD_ERR_FORMAT);
    CHECK(strstr(e.msg, "header length 18446744073709551615") != NULL);
    /* a header over 100 MB inside a file that is big enough */
    size_t hl = 100u * 1000 * 1000 + 1, n = hl + 8;
    uint8_t *big = calloc(1, n);
    for (int i = 0; i < 8; i++)
        big[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    struct st_set *s = NULL;
    err_clear(&e);
    CHECK_EQ_INT(st_open_memory(&s, big, n, "big.safetensors", &e), WELD_ERR_LIMIT);
    CHECK(s == NULL);
    CHECK(strstr(e.msg, "big.safetensors") && strstr(e.msg, "exceeds the limit"));
    free(big);
}

TEST(bad_json_and_wrong_types)
{
    const int F = WELD_ERR_FORMAT;
    CHECK(expect_bad("{\"a\":", 0, F, "bad header JSON at byte offset", NULL));
    CHECK(expect_bad("[1,2]", 0, F, "not a JSON object", NULL));
    CHECK(expect_bad("{\"a\":1}", 0, F, "tensor 'a'", "JSON object", NULL));
    CHECK(expect_bad("{\"a\":{\"dtype\":3,\"shape\":[],\"data_offsets\":[0,4]}}", 4, F,
                     "tensor 'a'", "'dtype'", NULL));
    CHECK(expect_bad("{\"a\":{\"shape\":[],\"data_offsets\":[0,4]}}", 4, F, "'dtype'", NULL));
    CHECK(expect_bad("{\"a\":{\"dtype\":\"Q8\",\"shape\":[],\"data_offsets\":[0,4]}}", 4,
                     WELD_ERR_UNSUPPORTED, "tensor 'a'", "unknown dtype 'Q8'", NULL));
    CHECK(expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":\"1\",\"data_offsets\":[0,4]}}", 4, F,
                     "tensor 'a'", "'shape'", NULL));
    CHECK(expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, F,
                     "'shape'", NULL));
    CHECK(expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1.0],\"data_offsets\":[0,4]}}", 4, F,
                     "'shape'", NULL));
    CHECK(expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],"
                     "\"data_offsets\":[0,4]}}", 4, F, "'shape'", "at most 8", NULL));
    CHECK(expect_bad("{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4, F, "'shape'",
                     NULL));
    CHECK(expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4],"
                     "\"data_offsets\":[0,4]}}", 4, F, "tensor 'a'", "overflows", NULL));
    CHECK(expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904],"
                     "\"data_offsets\":[0,4]}}", 4, F, "tensor 'a'", "overflows", NULL));
    CHECK(expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", 8, F,
                     "'data_offsets'", NULL));
    CHECK(expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":\"0-4\"}}", 4, F,
                     "'data_offsets'", NULL));
    CHECK(expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}", 4, F,
                     "'data_offsets'", NULL));
    CHECK(expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, F, "'data_offsets'", NULL));
    CHECK(expect_bad("{\"__metadata__\":[1]}", 0, F, "'__metadata__'", NULL));
    CHECK(expect_bad("{\"__metadata__\":{\"x\":1}}", 0, F, "'__metadata__'", "'x'", NULL));
    CHECK(expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                     "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, F,
                     "duplicate", NULL));
}

TEST(offsets_out_of_range_overlap_and_size_mismatch)
{
    const int F = WELD_ERR_FORMAT;
    CHECK(expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 8, F,
                     "bad.safetensors: tensor 'w': data_offsets [4, 12) past end of data "
                     "(8 bytes)", NULL));
    CHECK(expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,4]}}", 8, F,
                     "tensor 'w'", "begin after end", NULL));
    CHECK(expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, F,
                     "tensor 'w'", "hold 8 bytes", "need 12", NULL));
    CHECK(expect_bad("{\"w\":{\"dtype\":\"F16\",\"shape\":[2,2],\"data_offsets\":[0,16]}}", 16,
                     F, "tensor 'w'", "need 8", NULL));
    CHECK(expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                     "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12, F,
                     "tensors 'a' [0, 8) and 'b' [4, 12) overlap", NULL));
    CHECK(expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
                     "\"c\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[16,20]},"
                     "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}", 20, F,
                     "'a'", "'b'", "overlap", NULL));
    CHECK(expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                     "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, F,
                     "overlap", NULL));
    /* gaps and zero-size tensors inside another range are fine */
    struct weld_err e;
    struct buf b = make_image("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]},"
                              "\"e\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[6,6]}}",
                              0, 12);
    CHECK_EQ_INT(open_bytes(b.p, b.n, &e), WELD_OK);
    free(b.p);
}

/* ---- directories and the writer ---- */

static int fill_ramp(void *ctx, void *dst, size_t size, struct weld_err *e)
{
    float *f = dst;
    float base = *(const float *)ctx;
    for (size_t i = 0; i < size / 4; i++)
        f[i] = base + (float)i;
    return WELD_OK;
}

static int fill_fails(void *ctx, void *dst, size_t size, struct weld_err *e)
{
    return err_set(e, WELD_ERR_IO, "source went away");
}

/* A writer with 5 tensors: F32 [3,4] from memory, F16 [5], BF16 scalar, F32 [0,2], and
   F32 [6] from a callback; data in *a, *h, *bf. */
static struct st_writer *make_writer(float *a, uint16_t *h, uint16_t *bf, float *base)
{
    for (int i = 0; i < 12; i++)
        a[i] = (float)i * 0.5f - 2.0f;
    for (int i = 0; i < 5; i++)
        h[i] = fp16_from_f32((float)i - 1.5f);
    *bf = bf16_from_f32(3.25f);
    *base = 100.0f;
    struct st_writer *w = st_writer_create();
    int64_t s34[2] = {3, 4}, s5[1] = {5}, s02[2] = {0, 2}, s6[1] = {6};
    int rc = 0;
    rc |= st_writer_add(w, "model.embed.weight", DT_F32, 2, s34, a);
    rc |= st_writer_add(w, "model.norm.weight", DT_F16, 1, s5, h);
    rc |= st_writer_add(w, "scalar", DT_BF16, 0, NULL, bf);
    rc |= st_writer_add(w, "empty", DT_F32, 2, s02, NULL);
    rc |= st_writer_add_fn(w, "lm_head.weight", DT_F32, 1, s6, fill_ramp, base);
    rc |= st_writer_set_metadata(w, "format", "pt");
    CHECK_EQ_INT(rc, WELD_OK);
    return w;
}

static void check_written(const struct st_set *s, const float *a, const uint16_t *h,
                          uint16_t bf)
{
    CHECK_EQ_INT(s->n_tensors, 5);
    const struct st_tensor *t = st_find(s, "model.embed.weight");
    REQUIRE(t != NULL);
    CHECK(t->dtype == DT_F32 && t->n_dims == 2 && t->shape[0] == 3 && t->shape[1] == 4);
    CHECK(t->nbytes == 48 && memcmp(t->data, a, 48) == 0);
    t = st_find(s, "model.norm.weight");
    REQUIRE(t != NULL);
    CHECK(t->dtype == DT_F16 && t->nbytes == 10 && memcmp(t->data, h, 10) == 0);
    t = st_find(s, "scalar");
    REQUIRE(t != NULL);
    CHECK(t->dtype == DT_BF16 && t->n_dims == 0 && memcmp(t->data, &bf, 2) == 0);
    t = st_find(s, "empty");
    REQUIRE(t != NULL);
    CHECK(t->nbytes == 0 && t->n_dims == 2 && t->shape[0] == 0 && t->shape[1] == 2);
    t = st_find(s, "lm_head.weight");
    REQUIRE(t != NULL);
    float f[6];
    memcpy(f, t->data, 24);
    CHECK(f[0] == 100.0f && f[5] == 105.0f);
    REQUIRE(s->metadata_json != NULL);
    CHECK(strstr(s->metadata_json, "\"format\"") && strstr(s->metadata_json, "\"pt\""));
}

TEST(writer_round_trip_single_file)
{
    float a[12], base;
    uint16_t h[5], bf;
    struct st_writer *w = make_writer(a, h, &bf, &base);
    char dir[4096];
    new_dir(dir, "single");
    struct weld_err e;
    err_clear(&e);
    REQUIRE(st_writer_write_dir(w, dir, 0, &e) == WELD_OK);
    st_writer_free(w);
    st_writer_free(NULL);
    /* the bytes: header length a multiple of 8, space padded, tensors in insertion order */
    struct mfile m;
    REQUIRE(mfile_open(&m, path_in(dir, "model.safetensors"), &e) == WELD_OK);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--)
        hl = hl << 8 | m.data[i];
    CHECK_EQ_INT(hl % 8, 0);
    CHECK_EQ_INT(m.size, 8 + hl + 48 + 10 + 2 + 0 + 24);
    CHECK(memcmp(m.data + 8 + hl, a, 48) == 0);
    const char *hdr = (const char *)m.data + 8;
    CHECK(hdr[0] == '{' && strstr(hdr, "\"__metadata__\"") == hdr + 1);
    const char *p1 = strstr(hdr, "model.embed.weight"), *p2 = strstr(hdr, "lm_head.weight");
    CHECK(p1 && p2 && p1 < p2);
    mfile_close(&m);
    CHECK(access(path_in(dir, "model.safetensors.tmp"), F_OK) != 0);
    CHECK(access(path_in(dir, "model.safetensors.index.json"), F_OK) != 0);

    struct st_set *s = NULL;
    REQUIRE(st_open_dir(&s, dir, &e) == WELD_OK);
    CHECK_EQ_INT(s->n_files, 1);
    CHECK_EQ_STR(s->dir, dir);
    check_written(s, a, h, bf);
    st_close(s);
    REQUIRE(st_open_file(&s, path_in(dir, "model.safetensors"), &e) == WELD_OK);
    CHECK_EQ_STR(s->dir, dir);
    check_written(s, a, h, bf);
    st_close(s);
}

TEST(writer_round_trip_sharded)
{
    float a[12], base;
    uint16_t h[5], bf;
    struct st_writer *w = make_writer(a, h, &bf, &base);
    char dir[4096];
    new_dir(dir, "sharded");
    struct weld_err e;
    err_clear(&e);
    /* 48 | 10+2+0 | 24 with a 16-byte limit: the big tensor alone, then 12, then 24 */
    REQUIRE(st_writer_write_dir(w, dir, 16, &e) == WELD_OK);
    st_writer_free(w);
    CHECK(access(path_in(dir, "model-00001-of-00003.safetensors"), F_OK) == 0);
    CHECK(access(path_in(dir, "model-00003-of-00003.safetensors"), F_OK) == 0);
    CHECK(access(path_in(dir, "model-00004-of-00004.safetensors"), F_OK) != 0);
    json_t *idx = jload_file(path_in(dir, "model.safetensors.index.json"), &e);
    REQUIRE(idx != NULL);
    json_t *md = json_object_get(idx, "metadata"), *wm = json_object_get(idx, "weight_map");
    CHECK_EQ_INT(json_integer_value(json_object_get(md, "total_size")), 84);
    CHECK_EQ_INT(json_object_size(wm), 5);
    CHECK_EQ_STR(json_string_value(json_object_get(wm, "model.embed.weight")),
                 "model-00001-of-00003.safetensors");
    CHECK_EQ_STR(json_string_value(json_object_get(wm, "scalar")),
                 "model-00002-of-00003.safetensors");
    CHECK_EQ_STR(json_string_value(json_object_get(wm, "lm_head.weight")),
                 "model-00003-of-00003.safetensors");
    json_decref(idx);

    struct st_set *s = NULL;
    REQUIRE(st_open_dir(&s, dir, &e) == WELD_OK);
    CHECK_EQ_INT(s->n_files, 3);
    check_written(s, a, h, bf);
    CHECK(st_find(s, "model.embed.weight")->shard != st_find(s, "lm_head.weight")->shard);
    st_close(s);

    /* a single-file rewrite into the same directory removes the stale index */
    w = make_writer(a, h, &bf, &base);
    REQUIRE(st_writer_write_dir(w, dir, 0, &e) == WELD_OK);
    st_writer_free(w);
    CHECK(access(path_in(dir, "model.safetensors.index.json"), F_OK) != 0);
}

TEST(writer_errors)
{
    struct weld_err e;
    char d1[4096], d2[4096], dir[4096];
    int64_t shape[1] = {2};
    float d[2] = {1, 2};
    struct st_writer *w = st_writer_create();
    CHECK_EQ_INT(st_writer_add(w, "q", DT_Q8_0, 1, shape, d), WELD_ERR_UNSUPPORTED);
    err_clear(&e);
    CHECK_EQ_INT(st_writer_write_dir(w, new_dir(d1, "werr1"), 0, &e), WELD_ERR_UNSUPPORTED);
    CHECK(strstr(e.msg, "tensor 'q'") && strstr(e.msg, "dtype"));
    st_writer_free(w);

    w = st_writer_create();
    CHECK_EQ_INT(st_writer_add(w, "x", DT_F32, 1, shape, d), WELD_OK);
    CHECK_EQ_INT(st_writer_add(w, "x", DT_F32, 1, shape, d), WELD_ERR_INVALID_ARG);
    CHECK_EQ_INT(st_writer_write_dir(w, new_dir(d2, "werr2"), 0, &e), WELD_ERR_INVALID_ARG);
    CHECK(strstr(e.msg, "tensor 'x'") && strstr(e.msg, "twice"));
    st_writer_free(w);

    w = st_writer_create();
    int64_t neg[1] = {-1};
    CHECK_EQ_INT(st_writer_add(w, "n", DT_F32, 1, neg, d), WELD_ERR_INVALID_ARG);
    CHECK_EQ_INT(st_writer_add(w, "__metadata__", DT_F32, 1, shape, d), WELD_ERR_INVALID_ARG);
    st_writer_free(w);

    w = st_writer_create();
    CHECK_EQ_INT(st_writer_add(w, "ok", DT_F32, 1, shape, d), WELD_OK);
    CHECK_EQ_INT(st_writer_add_fn(w, "bad", DT_F32, 1, shape, fill_fails, NULL), WELD_OK);
    new_dir(dir, "werr3");
    err_clear(&e);
    CHECK_EQ_INT(st_writer_write_dir(w, dir, 0, &e), WELD_ERR_IO);
    CHECK(strstr(e.msg, "tensor 'bad'") && strstr(e.msg, "source went away"));
    CHECK(access(path_in(dir, "model.safetensors"), F_OK) != 0);
    CHECK(access(path_in(dir, "model.safetensors.tmp"), F_OK) != 0);
    st_writer_free(w);
}

/* Two shards a.safetensors ("x", "y") and b.safetensors ("z") in dir. */
static void write_two_shards(const char *dir, int b_also_has_x)
{
    struct buf a = make_image("{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                              "\"y\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                              0, 8);
    struct buf b = make_image(b_also_has_x
        ? "{\"z\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
          "\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}"
        : "{\"z\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 0,
        b_also_has_x ? 8 : 4);
    write_file(path_in(dir, "a.safetensors"), a.p, a.n);
    write_file(path_in(dir, "b.safetensors"), b.p, b.n);
    free(a.p);
    free(b.p);
}

static int open_dir_expect(const char *dir, int status, const char *sub1, const char *sub2)
{
    struct st_set *s = NULL;
    struct weld_err e;
    err_clear(&e);
    int rc = st_open_dir(&s, dir, &e);
    st_close(s);
    int ok = rc == status && (rc == WELD_OK || (rc != WELD_OK && s == NULL)) &&
             (!sub1 || strstr(e.msg, sub1)) && (!sub2 || strstr(e.msg, sub2));
    if (!ok)
        fprintf(stderr, "  %s: rc %d (want %d): %s\n", dir, rc, status, e.msg);
    return ok;
}

TEST(directory_without_index)
{
    char dir[4096], dup[4096], other[4096];
    new_dir(dir, "noindex");
    write_two_shards(dir, 0);
    write_str(path_in(dir, "notes.txt"), "not a shard");
    struct st_set *s = NULL;
    REQUIRE(st_open_dir(&s, dir, NULL) == WELD_OK);
    CHECK_EQ_INT(s->n_files, 2);
    CHECK(strstr(s->file_paths[0], "/a.safetensors") && strstr(s->file_paths[1], "/b.safetensors"));
    CHECK_EQ_INT(st_find(s, "z")->shard, 1);
    CHECK_EQ_INT(st_find(s, "y")->shard, 0);
    CHECK_EQ_INT(*(const uint8_t *)st_find(s, "y")->data, 4);
    st_close(s);

    new_dir(dup, "dup");
    write_two_shards(dup, 1);
    CHECK(open_dir_expect(dup, WELD_ERR_FORMAT, "tensor 'x' appears in both", "b.safetensors"));
    CHECK(open_dir_expect(new_dir(other, "emptydir"), WELD_ERR_NOT_FOUND, "no *.safetensors", NULL));
    CHECK(open_dir_expect(path_in(test_tmpdir(), "missing"), WELD_ERR_NOT_FOUND, "missing",
                          NULL));
    const char *badf = new_dir(other, "badfile");
    write_file(path_in(badf, "model.safetensors"), "\x02\0\0\0\0\0\0\0{}", 10);
    CHECK(open_dir_expect(badf, WELD_OK, NULL, NULL));
    write_file(path_in(badf, "model.safetensors"), "\x02\0\0\0\0\0\0\0[]", 10);
    CHECK(open_dir_expect(badf, WELD_ERR_FORMAT, "badfile/model.safetensors", "JSON object"));
}

TEST(directory_with_index)
{
    char dir[4096], idx[4096];
    new_dir(dir, "index");
    write_two_shards(dir, 0);
    snprintf(idx, sizeof idx, "%s/model.safetensors.index.json", dir);
    write_str(idx, "{\"metadata\":{\"total_size\":12},\"weight_map\":{\"x\":\"a.safetensors\","
                   "\"y\":\"a.safetensors\",\"z\":\"b.safetensors\"}}");
    CHECK(open_dir_expect(dir, WELD_OK, NULL, NULL));
    /* only the shards named in the index are opened */
    write_str(path_in(dir, "zz.safetensors"), "garbage");
    CHECK(open_dir_expect(dir, WELD_OK, NULL, NULL));

    write_str(idx, "{\"weight_map\":{\"x\":\"a.safetensors\",\"q\":\"b.safetensors\"}}");
    CHECK(open_dir_expect(dir, WELD_ERR_FORMAT, "tensor 'q' is not in shard 'b.safetensors'",
                          "index.json"));
    write_str(idx, "{\"weight_map\":{\"x\":\"a.safetensors\",\"y\":\"b.safetensors\"}}");
    CHECK(open_dir_expect(dir, WELD_ERR_FORMAT, "tensor 'y' is not in shard 'b.safetensors'",
                          "it is in a.safetensors"));
    write_str(idx, "{\"weight_map\":{\"x\":\"c.safetensors\"}}");
    CHECK(open_dir_expect(dir, WELD_ERR_NOT_FOUND, "c.safetensors", "cannot open"));
    write_str(idx, "{\"weight_map\":{\"x\":\"../index/a.safetensors\"}}");
    CHECK(open_dir_expect(dir, WELD_ERR_FORMAT, "tensor 'x'", "plain name"));
    write_str(idx, "{\"weight_map\":{\"x\":\"/etc/passwd\"}}");
    CHECK(open_dir_expect(dir, WELD_ERR_FORMAT, "'/etc/passwd'", "plain name"));
    write_str(idx, "{\"weight_map\":{\"x\":\"..\"}}");
    CHECK(open_dir_expect(dir, WELD_ERR_FORMAT, "plain name", NULL));
    write_str(idx, "{\"weight_map\":{\"x\":7}}");
    CHECK(open_dir_expect(dir, WELD_ERR_FORMAT, "tensor 'x'", "file name string"));
    write_str(idx, "{\"weight_map\":[]}");
    CHECK(open_dir_expect(dir, WELD_ERR_FORMAT, "'weight_map'", NULL));
    write_str(idx, "{\"weight_map\":{}}");
    CHECK(open_dir_expect(dir, WELD_ERR_FORMAT, "weight_map is empty", NULL));
    write_str(idx, "{\"weight_map\":");
    CHECK(open_dir_expect(dir, WELD_ERR_FORMAT, "index.json", "JSON"));
}

/* ---- allocation failures ---- */

TEST(allocation_failures_are_reported_and_clean)
{
    struct buf b = make_image("{\"__metadata__\":{\"k\":\"v\"},"
                              "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                              "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                              0, 8);
    int n_fail = 0, ok_at = 0;
    for (long k = 1; k < 100 && !ok_at; k++) {
        struct st_set *s = NULL;
        struct weld_err e;
        alloc_fail_at(k);
        int rc = st_open_memory(&s, b.p, b.n, "f", &e);
        long failed = alloc_failed_count();
        alloc_fail_at(0);
        if (failed == 0) {
            CHECK_EQ_INT(rc, WELD_OK);
            ok_at = (int)k;
        } else if (rc != WELD_ERR_NOMEM || s != NULL) {
            n_fail++;
        }
        st_close(s);
    }
    CHECK(ok_at > 3);
    CHECK_EQ_INT(n_fail, 0);
    free(b.p);

    float a[12], base;
    uint16_t h[5], bf;
    char dir[4096];
    ok_at = 0;
    for (long k = 1; k < 200 && !ok_at; k++) {
        struct st_writer *w = make_writer(a, h, &bf, &base);
        struct weld_err e;
        alloc_fail_at(k);
        int rc = st_writer_write_dir(w, new_dir(dir, "faults"), 8, &e);
        long failed = alloc_failed_count();
        alloc_fail_at(0);
        /* Jansson allocates through malloc, so not every failure is ours to see */
        if (failed == 0)
            ok_at = (int)k;
        else
            CHECK(rc == WELD_ERR_NOMEM);
        st_writer_free(w);
    }
    CHECK(ok_at > 3);
}

int main(void)
{
    RUN(reads_handmade_file);
    RUN(every_known_dtype_opens);
    RUN(empty_header_object_and_lookup_of_many);
    RUN(truncated_at_every_offset);
    RUN(header_length_huge);
    RUN(bad_json_and_wrong_types);
    RUN(offsets_out_of_range_overlap_and_size_mismatch);
    RUN(writer_round_trip_single_file);
    RUN(writer_round_trip_sharded);
    RUN(writer_errors);
    RUN(directory_without_index);
    RUN(directory_with_index);
    RUN(allocation_failures_are_reported_and_clean);
    return test_summary();
}

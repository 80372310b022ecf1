/* Unit tests for src/core: errors, allocation failure injection, fp16/bf16, rng, json,
   the UTF-8 encoder. */
#include "core/alloc.h"
#include "core/err.h"
#include "core/fp16.h"
#include "core/json.h"
#include "core/mfile.h"
#include "core/rng.h"
#include "core/strbuf.h"
#include "core/utf8.h"
#include "test.h"

TEST(err_set_formats_and_returns_status)
{
    struct weld_err e;
    err_clear(&e);
    CHECK_EQ_INT(err_set(&e, WELD_ERR_FORMAT, "%s: field '%s'", "f.json", "x"), WELD_ERR_FORMAT);
    CHECK_EQ_STR(e.msg, "f.json: field 'x'");
    err_prefix(&e, "loading %s", "m");
    CHECK_EQ_STR(e.msg, "loading m: f.json: field 'x'");
    CHECK_EQ_INT(e.status, WELD_ERR_FORMAT);
    CHECK_EQ_INT(err_set(NULL, WELD_ERR_IO, "ignored"), WELD_ERR_IO);
}

TEST(alloc_fault_injection)
{
    alloc_fail_at(2);
    void *a = wmalloc(8);
    void *b = wmalloc(8);
    void *c = wmalloc(8);
    CHECK(a != NULL);
    CHECK(b == NULL);
    CHECK(c != NULL);
    CHECK_EQ_INT(alloc_failed_count(), 1);
    alloc_fail_at(0);
    wfree(a);
    wfree(c);
    wfree(NULL);
    CHECK(wcalloc((size_t)1 << 62, 16) == NULL);
}

TEST(fp16_roundtrip_and_rounding)
{
    CHECK_EQ_INT(fp16_from_f32(1.0f), 0x3c00);
    CHECK_EQ_INT(fp16_from_f32(-2.0f), 0xc000);
    CHECK_EQ_INT(fp16_from_f32(65504.0f), 0x7bff);
    CHECK_EQ_INT(fp16_from_f32(1e6f), 0x7c00);
    CHECK_EQ_INT(fp16_from_f32(1.0f + 1.0f / 2048), 0x3c00); /* tie rounds to even */
    CHECK_EQ_INT(fp16_from_f32(1.0f + 3.0f / 2048), 0x3c02);
    for (uint32_t h = 0; h < 0x7c00; h++)
        if (fp16_from_f32(fp16_to_f32((uint16_t)h)) != h) {
            CHECK_EQ_INT(fp16_from_f32(fp16_to_f32((uint16_t)h)), h);
            break;
        }
    CHECK_NEAR(fp16_to_f32(0x0001), 5.960464477539063e-08, 1e-15);
    CHECK_EQ_INT(bf16_from_f32(1.0f), 0x3f80);
    CHECK_EQ_INT(bf16_from_f32(f32_from_bits(0x3f808000u)), 0x3f80); /* tie to even */
    CHECK_EQ_INT(bf16_from_f32(f32_from_bits(0x3f818000u)), 0x3f82);
    CHECK(bf16_to_f32(bf16_from_f32(3.140625f)) == 3.140625f);
}

TEST(rng_is_deterministic_and_normal)
{
    struct rng a, b;
    rng_seed(&a, 42);
    rng_seed(&b, 42);
    for (int i = 0; i < 100; i++)
        CHECK(rng_u64(&a) == rng_u64(&b));
    double s = 0, s2 = 0;
    int n = 100000;
    for (int i = 0; i < n; i++) {
        double x = rng_normal(&a);
        s += x;
        s2 += x * x;
    }
    CHECK_NEAR(s / n, 0.0, 0.02);
    CHECK_NEAR(s2 / n, 1.0, 0.02);
}

TEST(json_errors_name_position_and_field)
{
    struct weld_err e;
    err_clear(&e);
    const char *bad = "{\"a\": 1,\n \"b\": }";
    json_t *v = jload_buf(bad, strlen(bad), "cfg.json", &e);
    CHECK(v == NULL);
    CHECK(strstr(e.msg, "cfg.json:2:") != NULL);
    const char *good = "{\"a\": 1, \"s\": \"x\", \"f\": 2.5, \"n\": null}";
    v = jload_buf(good, strlen(good), "cfg.json", &e);
    REQUIRE(v != NULL);
    int64_t i = 0;
    double d = 0;
    const char *s = NULL;
    CHECK_EQ_INT(jget_int(v, "a", &i, "cfg.json", &e), WELD_OK);
    CHECK_EQ_INT(i, 1);
    CHECK_EQ_INT(jget_int(v, "n", &i, "cfg.json", &e), WELD_ERR_NOT_FOUND);
    CHECK_EQ_INT(jget_int(v, "missing", &i, "cfg.json", &e), WELD_ERR_NOT_FOUND);
    CHECK_EQ_INT(jget_int(v, "f", &i, "cfg.json", &e), WELD_ERR_FORMAT);
    CHECK(strstr(e.msg, "field 'f'") != NULL);
    CHECK_EQ_INT(jget_double(v, "f", &d, "cfg.json", &e), WELD_OK);
    CHECK_NEAR(d, 2.5, 0);
    CHECK_EQ_INT(jget_str(v, "s", &s, "cfg.json", &e), WELD_OK);
    CHECK_EQ_STR(s, "x");
    CHECK_EQ_INT(jget_str(v, "a", &s, "cfg.json", &e), WELD_ERR_FORMAT);
    json_decref(v);
}

TEST(mfile_reports_missing_file)
{
    struct mfile m;
    struct weld_err e;
    CHECK_EQ_INT(mfile_open(&m, "/nonexistent/x.gguf", &e), WELD_ERR_NOT_FOUND);
    CHECK(strstr(e.msg, "/nonexistent/x.gguf") != NULL);
    mfile_close(&m);
}

/* Known encodings, the length at each boundary, and Jansson's own encoder (a \u escape,
   surrogate pairs above U+FFFF) as the oracle over every code point below U+1000 and a
   stride of the rest. */
TEST(utf8_put_matches_known_bytes_and_jansson)
{
    char b[4];
    CHECK(utf8_put(0x24, b) == 1 && memcmp(b, "$", 1) == 0);
    CHECK(utf8_put(0xA2, b) == 2 && memcmp(b, "\xC2\xA2", 2) == 0);
    CHECK(utf8_put(0x20AC, b) == 3 && memcmp(b, "\xE2\x82\xAC", 3) == 0);
    CHECK(utf8_put(0x10348, b) == 4 && memcmp(b, "\xF0\x90\x8D\x88", 4) == 0);
    static const uint32_t edge[][2] = {{0x7F, 1},   {0x80, 2},    {0x7FF, 2},   {0x800, 3},
                                       {0xFFFF, 3}, {0x10000, 4}, {0x10FFFF, 4}};
    for (size_t i = 0; i < sizeof edge / sizeof edge[0]; i++)
        CHECK_EQ_INT((int)utf8_put(edge[i][0], b), (int)edge[i][1]);
    int bad = 0;
    for (uint32_t cp = 1; cp <= 0x10FFFF; cp += cp < 0x1000 ? 1 : 61) {
        if (cp >= 0xD800 && cp <= 0xDFFF)
            continue;
        char esc[32];
        if (cp < 0x10000)
            snprintf(esc, sizeof esc, "\"\\u%04X\"", (unsigned)cp);
        else
            snprintf(esc, sizeof esc, "\"\\u%04X\\u%04X\"",
                     (unsigned)(0xD800 + ((cp - 0x10000) >> 10)),
                     (unsigned)(0xDC00 + ((cp - 0x10000) & 0x3FF)));
        json_t *s = json_loads(esc, JSON_DECODE_ANY, NULL);
        size_t n = utf8_put(cp, b);
        if (!s || json_string_length(s) != n || memcmp(json_string_value(s), b, n) != 0)
            bad++;
        json_decref(s);
    }
    CHECK_EQ_INT(bad, 0);
}

/* strbuf: pieces and formatted text (past the 512-byte stack buffer) in order, always
   NUL-terminated; out of memory sticks and drops later writes. */
TEST(strbuf_appends_and_fails_sticky)
{
    struct strbuf b = {0};
    strbuf_put(&b, "ab", 2);
    strbuf_printf(&b, "-%d-%s", 42, "x");
    char big[1000];
    memset(big, 'y', sizeof big - 1);
    big[sizeof big - 1] = 0;
    strbuf_printf(&b, "%s!", big);
    CHECK_EQ_INT((int)b.n, 7 + 999 + 1);
    CHECK(!strncmp(b.p, "ab-42-xyy", 9) && b.p[b.n - 1] == '!' && b.p[b.n] == 0);
    CHECK(!b.oom);
    wfree(b.p);
    struct strbuf c = {0};
    alloc_fail_at(1);
    strbuf_put(&c, "abc", 3);
    alloc_fail_at(0);
    CHECK(c.oom && c.p == NULL);
    strbuf_put(&c, "def", 3); /* sticky: nothing more is written */
    CHECK(c.oom && c.n == 0);
}

int main(void)
{
    RUN(err_set_formats_and_returns_status);
    RUN(alloc_fault_injection);
    RUN(fp16_roundtrip_and_rounding);
    RUN(rng_is_deterministic_and_normal);
    RUN(json_errors_name_position_and_field);
    RUN(mfile_reports_missing_file);
    RUN(utf8_put_matches_known_bytes_and_jansson);
    RUN(strbuf_appends_and_fails_sticky);
    return test_summary();
}

/*
 * test_tokenizer_parity - weld's tokenizers against Hugging Face `tokenizers`, byte-exact.
 *
 * Reads the reference file written by tests/node/tokenizer_ref.js (path from
 * $WELD_TOKENIZER_REF, else tokenizer_ref/tokenizer_ref.json in the working directory):
 * ~2,600 strings and, for four real tokenizers (Llama 2/Mistral SentencePiece-style BPE,
 * Llama 3, Qwen 3, DeepSeek V3), HF's ids with and without special tokens and HF's decode
 * of the ids with and without skip_special_tokens. Each tokenizer.json is loaded on its
 * own (tokenizer_load_hf_json_buf: exactly what the Rust library sees) and must give the
 * same ids and decodes; streaming detok_push output, concatenated, must equal the decode.
 * Every mismatch is printed (string, both id lists) and counted; the test fails if any.
 */
#include "test.h"

#include "core/alloc.h"
#include "core/json.h"
#include "core/mfile.h"
#include "tokenizer/tokenizer.h"

#include <time.h>

static json_t *g_ref;
static int g_shown;

static void print_escaped(const char *s, size_t n)
{
    fputc('"', stderr);
    for (size_t i = 0; i < n && i < 300; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\n')
            fputs("\\n", stderr);
        else if (c == '\r')
            fputs("\\r", stderr);
        else if (c == '\t')
            fputs("\\t", stderr);
        else if (c < 0x20)
            fprintf(stderr, "\\x%02x", c);
        else
            fputc(c, stderr);
    }
    fputs(n > 300 ? "\"..." : "\"", stderr);
}

static void print_ids(const char *label, const int32_t *ids, size_t n)
{
    fprintf(stderr, "    %s:", label);
    for (size_t i = 0; i < n && i < 80; i++)
        fprintf(stderr, " %d", ids[i]);
    fprintf(stderr, n > 80 ? " ...\n" : "\n");
}

static bool ids_equal(const json_t *ref, const int32_t *ids, size_t n)
{
    if (json_array_size(ref) != n)
        return false;
    for (size_t i = 0; i < n; i++)
        if (json_integer_value(json_array_get(ref, i)) != ids[i])
            return false;
    return true;
}

static void report_ids(const char *tok, const char *what, const json_t *text, const json_t *ref,
                       const int32_t *ids, size_t n)
{
    if (g_shown++ > 60)
        return;
    fprintf(stderr, "MISMATCH %s %s: ", tok, what);
    print_escaped(json_string_value(text), json_string_length(text));
    fputc('\n', stderr);
    int32_t *r = wcalloc(json_array_size(ref) + 1, sizeof *r);
    for (size_t i = 0; r && i < json_array_size(ref); i++)
        r[i] = (int32_t)json_integer_value(json_array_get(ref, i));
    print_ids("hf  ", r, json_array_size(ref));
    print_ids("weld", ids, n);
    wfree(r);
}

static void report_str(const char *tok, const char *what, const json_t *text, const char *want,
                       size_t wn, const char *got, size_t gn)
{
    if (g_shown++ > 60)
        return;
    fprintf(stderr, "MISMATCH %s %s: ", tok, what);
    print_escaped(json_string_value(text), json_string_length(text));
    fprintf(stderr, "\n    hf  : ");
    print_escaped(want, wn);
    fprintf(stderr, "\n    weld: ");
    print_escaped(got, gn);
    fputc('\n', stderr);
}

/* Streamed decode of ids must equal want. Uses a small output buffer to exercise pending. */
static bool stream_ok(const struct tokenizer *t, const int32_t *ids, size_t n, bool skip,
                      const char *want, size_t wn)
{
    struct detok *d = detok_create(t, skip);
    char *acc = wmalloc(wn * 2 + 64), buf[7];
    size_t an = 0, cap = wn * 2 + 64;
    bool ok = d && acc;
    for (size_t i = 0; ok && i <= n; i++) {
        size_t k = i < n ? detok_push(d, ids[i], buf, sizeof buf) : detok_flush(d, buf, sizeof buf);
        while (ok && k > 0) {
            if (an + k > cap) {
                ok = false;
                break;
            }
            memcpy(acc + an, buf, k);
            an += k;
            k = i < n ? detok_push(d, -1, buf, sizeof buf) : detok_flush(d, buf, sizeof buf);
        }
    }
    ok = ok && an == wn && memcmp(acc, want, wn) == 0;
    detok_free(d);
    wfree(acc);
    return ok;
}

static void check_one(const char *name, const json_t *texts, const json_t *r)
{
    const char *path = json_string_value(json_object_get(r, "path"));
    char *buf = NULL;
    size_t len = 0;
    struct weld_err e = {0};
    REQUIRE(path && file_read_all(path, &buf, &len, &e) == WELD_OK);
    struct tokenizer *t = NULL;
    clock_t c0 = clock();
    int rc = tokenizer_load_hf_json_buf(&t, buf, len, path, &e);
    wfree(buf);
    if (rc)
        fprintf(stderr, "%s\n", e.msg);
    REQUIRE(rc == WELD_OK);
    clock_t c1 = clock();
    int bad_ids = 0, bad_plain = 0, bad_dec = 0, bad_skip = 0, bad_stream = 0;
    size_t n_texts = json_array_size(texts);
    for (size_t i = 0; i < n_texts; i++) {
        const json_t *tx = json_array_get(texts, i);
        const char *s = json_string_value(tx);
        size_t sn = json_string_length(tx);
        int32_t *ids = NULL, *plain = NULL;
        size_t n = 0, np = 0;
        CHECK(tokenizer_encode(t, s, sn, true, true, &ids, &n, &e) == WELD_OK);
        CHECK(tokenizer_encode(t, s, sn, false, true, &plain, &np, &e) == WELD_OK);
        const json_t *ref_ids = json_array_get(json_object_get(r, "ids"), i);
        if (!ids_equal(ref_ids, ids, n)) {
            bad_ids++;
            report_ids(name, "ids", tx, ref_ids, ids, n);
        }
        const json_t *ref_plain = json_array_get(json_object_get(r, "ids_plain"), i);
        if (!ids_equal(ref_plain, plain, np)) {
            bad_plain++;
            report_ids(name, "ids(no special)", tx, ref_plain, plain, np);
        }
        /* decode HF's ids (so a decode bug is not hidden behind an encode bug) */
        size_t nr = json_array_size(ref_ids);
        int32_t *rids = wcalloc(nr + 1, sizeof *rids);
        for (size_t k = 0; rids && k < nr; k++)
            rids[k] = (int32_t)json_integer_value(json_array_get(ref_ids, k));
        for (int skip = 0; skip < 2; skip++) {
            const json_t *want = json_array_get(
                json_object_get(r, skip ? "decode_skip" : "decode"), i);
            char *out = NULL;
            size_t on = 0;
            CHECK(tokenizer_decode(t, rids, nr, skip, &out, &on, &e) == WELD_OK);
            if (!out || on != json_string_length(want) ||
                memcmp(out, json_string_value(want), on) != 0) {
                *(skip ? &bad_skip : &bad_dec) += 1;
                report_str(name, skip ? "decode(skip)" : "decode", tx, json_string_value(want),
                           json_string_length(want), out ? out : "", on);
            }
            if (!stream_ok(t, rids, nr, skip, json_string_value(want),
                           json_string_length(want))) {
                bad_stream++;
                if (g_shown++ < 60) {
                    fprintf(stderr, "MISMATCH %s stream(skip=%d): ", name, skip);
                    print_escaped(s, sn);
                    fputc('\n', stderr);
                }
            }
            wfree(out);
        }
        wfree(rids);
        wfree(ids);
        wfree(plain);
    }
    clock_t c2 = clock();
    printf("%-12s load %.2fs, %zu strings: %d ids, %d ids(no special), %d decode, %d "
           "decode(skip), %d stream mismatches (%.2fs)\n", name,
           (double)(c1 - c0) / CLOCKS_PER_SEC, n_texts, bad_ids, bad_plain, bad_dec, bad_skip,
           bad_stream, (double)(c2 - c1) / CLOCKS_PER_SEC);
    CHECK_EQ_INT(bad_ids, 0);
    CHECK_EQ_INT(bad_plain, 0);
    CHECK_EQ_INT(bad_dec, 0);
    CHECK_EQ_INT(bad_skip, 0);
    CHECK_EQ_INT(bad_stream, 0);
    tokenizer_free(t);
}

#define PARITY(tok)                                                                         \
    TEST(parity_##tok)                                                                      \
    {                                                                                       \
        REQUIRE(g_ref);                                                                     \
        const json_t *r = json_object_get(json_object_get(g_ref, "tokenizers"), #tok);      \
        REQUIRE(r);                                                                         \
        check_one(#tok, json_object_get(g_ref, "texts"), r);                                \
    }
PARITY(llama2)
PARITY(llama3)
PARITY(qwen3)
PARITY(deepseek_v3)

TEST(corpus_size)
{
    REQUIRE(g_ref);
    CHECK(json_array_size(json_object_get(g_ref, "texts")) >= 2000);
}

int main(void)
{
    const char *path = getenv("WELD_TOKENIZER_REF");
    if (!path)
        path = "tokenizer_ref/tokenizer_ref.json";
    struct weld_err e = {0};
    g_ref = jload_file(path, &e);
    if (!g_ref)
        fprintf(stderr, "cannot read the reference data (%s); run tests/node/tokenizer_ref.js "
                "OUT_DIR first (ctest does this as the tokenizer_ref_data fixture)\n", e.msg);
    RUN(corpus_size);
    RUN(parity_llama2);
    RUN(parity_llama3);
    RUN(parity_qwen3);
    RUN(parity_deepseek_v3);
    json_decref(g_ref);
    return test_summary();
}

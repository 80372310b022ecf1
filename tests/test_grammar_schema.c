/*
 * test_grammar_schema - JSON Schema to GBNF (grammar/schema.h).
 *
 * Each schema's grammar accepts hand-written instances that satisfy it and rejects ones
 * that break it (a missing required key, a wrong type, an extra key under
 * additionalProperties: false, an enum miss, too many items, a bad date); random
 * sentences derived from the grammar are JSON (jansson parses them) with the required
 * keys present. Refused keywords name themselves and their path.
 */
#include "core/json.h"
#include "core/rng.h"
#include "grammar/grammar.h"
#include "grammar/schema.h"
#include "test.h"

#include <stdlib.h>
#include <string.h>

static struct grammar *from_schema(const char *schema)
{
    char *gbnf = NULL;
    struct weld_err e;
    if (grammar_gbnf_from_json_schema(schema, strlen(schema), &gbnf, &e) != WELD_OK) {
        fprintf(stderr, "  %s\n", e.msg);
        return NULL;
    }
    struct grammar *g = NULL;
    if (grammar_parse_gbnf(&g, gbnf, strlen(gbnf), NULL, &e) != WELD_OK)
        fprintf(stderr, "  %s\n--- grammar:\n%s\n", e.msg, gbnf);
    free(gbnf);
    return g;
}

static bool accepts(const struct grammar *g, const char *s)
{
    struct gmatch *m = NULL;
    struct weld_err e;
    if (gmatch_create(&m, g, &e) != WELD_OK)
        return false;
    bool ok = gmatch_accept(m, (const uint8_t *)s, strlen(s)) && gmatch_can_end(m);
    gmatch_free(m);
    return ok;
}

static int derive(const struct grammar *g, struct rng *r, int rule, int depth, char *out, int n,
                  int cap)
{
    int na = g->rule_n_alt[rule];
    int a = depth > 10 ? na - 1 : (int)(rng_u64(r) % (uint64_t)na);
    for (int el = g->alt[g->rule_alt0[rule] + a]; g->el[el].kind != GR_END && n >= 0; el++) {
        const struct gr_elem *x = &g->el[el];
        if (x->kind == GR_BYTES) {
            if (n >= cap)
                return -1;
            out[n++] = (char)(x->lo + rng_u64(r) % (uint64_t)(x->hi - x->lo + 1));
        } else {
            n = derive(g, r, x->rule, depth + 1, out, n, cap);
        }
    }
    return n;
}

static const struct {
    const char *schema;
    const char *good[4], *bad[6];
    const char *required; /* a key every derivation must have, or NULL */
} cases[] = {
    {"{\"type\": \"object\", \"properties\": {\"name\": {\"type\": \"string\"}, \"age\": "
     "{\"type\": \"integer\"}, \"tags\": {\"type\": \"array\", \"items\": {\"type\": "
     "\"string\"}, \"maxItems\": 3}}, \"required\": [\"name\"], \"additionalProperties\": false}",
     {"{\"name\": \"Ann\"}", "{\"name\":\"B\",\"age\":-3,\"tags\":[\"x\",\"y\"]}",
      "{ \"name\" : \"\\u00e9\" , \"tags\" : [ ] }"},
     {"{}", "{\"age\": 3}", "{\"name\": 1}", "{\"name\": \"a\", \"x\": 1}",
      "{\"name\": \"a\", \"tags\": [\"1\",\"2\",\"3\",\"4\"]}", "{\"name\": \"a\", \"age\": 1.5}"},
     "name"},
    {"{\"enum\": [\"red\", \"green\", 3, null]}",
     {"\"red\"", "3", "null"},
     {"\"blue\"", "4", "\"Red\""},
     NULL},
    {"{\"type\": \"array\", \"items\": {\"anyOf\": [{\"type\": \"number\"}, {\"const\": \"x\"}]}, "
     "\"minItems\": 2, \"maxItems\": 4}",
     {"[1, \"x\"]", "[1,2,3,4]", "[\"x\",\"x\"]"},
     {"[1]", "[1,2,3,4,5]", "[\"y\", 1]", "[]"},
     NULL},
    {"{\"type\": \"object\", \"properties\": {\"when\": {\"type\": \"string\", \"format\": "
     "\"date-time\"}, \"id\": {\"type\": \"string\", \"format\": \"uuid\"}, \"ok\": {\"type\": "
     "\"boolean\"}}, \"required\": [\"when\", \"ok\"]}",
     {"{\"when\": \"2024-02-29T13:05:00Z\", \"ok\": true}",
      "{\"when\": \"2024-12-01T00:00:00.5+01:00\", \"id\": "
      "\"123e4567-e89b-12d3-a456-426614174000\", \"ok\": false, \"extra\": [1]}"},
     {"{\"when\": \"2024-13-01T00:00:00Z\", \"ok\": true}", "{\"when\": \"2024-02-29\", \"ok\": 1}",
      "{\"ok\": true}"},
     "when"},
    {"{\"$defs\": {\"node\": {\"type\": \"object\", \"properties\": {\"v\": {\"type\": "
     "\"integer\"}, \"next\": {\"anyOf\": [{\"$ref\": \"#/$defs/node\"}, {\"type\": "
     "\"null\"}]}}, \"required\": [\"v\", \"next\"], \"additionalProperties\": false}}, \"$ref\": "
     "\"#/$defs/node\"}",
     {"{\"v\": 1, \"next\": null}", "{\"v\": 1, \"next\": {\"v\": 2, \"next\": null}}"},
     {"{\"v\": 1}", "{\"v\": 1, \"next\": {\"v\": 2}}"},
     "v"},
    {"{\"type\": \"string\", \"minLength\": 2, \"maxLength\": 3}",
     {"\"ab\"", "\"a\\nb\""},
     {"\"a\"", "\"abcd\""},
     NULL},
    {"{\"type\": [\"integer\", \"null\"]}", {"12", "null"}, {"1.5", "\"1\""}, NULL},
    {"{\"type\": \"string\", \"pattern\": \"^[a-z]+\\\"?\\\\n?$\"}",
     {"\"abc\"", "\"ab\\\"\"", "\"a\\\"\\n\""},
     {"\"ab\"\"", "\"a1\"", "\"\"", "\"a\\\\\""},
     NULL},
    {"{\"type\": \"string\", \"pattern\": \"b\\\\d\"}",
     {"\"ab1c\"", "\"b2\""},
     {"\"ab\"", "\"b\""},
     NULL},
    {"{\"type\": \"array\", \"prefixItems\": [{\"type\": \"string\"}, {\"type\": \"number\"}], "
     "\"items\": false}",
     {"[\"a\", 1]"},
     {"[\"a\"]", "[\"a\", 1, 2]", "[1, \"a\"]"},
     NULL},
};

TEST(schemas_accept_and_reject)
{
    struct rng r;
    rng_seed(&r, 4);
    int derived = 0;
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        struct grammar *g = from_schema(cases[i].schema);
        REQUIRE(g);
        for (int k = 0; k < 4 && cases[i].good[k]; k++) {
            if (!accepts(g, cases[i].good[k]))
                fprintf(stderr, "  schema %zu refused %s\n", i, cases[i].good[k]);
            CHECK(accepts(g, cases[i].good[k]));
        }
        for (int k = 0; k < 6 && cases[i].bad[k]; k++) {
            if (accepts(g, cases[i].bad[k]))
                fprintf(stderr, "  schema %zu took %s\n", i, cases[i].bad[k]);
            CHECK(!accepts(g, cases[i].bad[k]));
        }
        for (int it = 0; it < 200; it++) {
            char s[4096];
            int n = derive(g, &r, g->root, 0, s, 0, (int)sizeof s - 1);
            if (n < 0)
                continue;
            s[n] = 0;
            json_error_t je;
            json_t *j = json_loads(s, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
            if (!j)
                fprintf(stderr, "  schema %zu derived non-JSON: %s\n", i, s);
            CHECK(j != NULL);
            if (j && cases[i].required)
                CHECK(json_object_get(j, cases[i].required) != NULL);
            json_decref(j);
            derived++;
        }
        grammar_free(g);
    }
    CHECK(derived > 1000);
}

TEST(refusals_name_keyword_and_path)
{
    static const struct {
        const char *schema, *names;
    } bad[] = {
        {"{\"type\": \"number\", \"multipleOf\": 2}", "at /: \"multipleOf\" is not supported"},
        {"{\"type\": \"string\", \"pattern\": \"(a\"}",
         "\"pattern\": regex: at offset 0: unclosed ("},
        {"{\"properties\": {\"a\": {\"type\": \"integer\", \"minimum\": 3}}}",
         "at /properties/a: \"minimum\" is not supported"},
        {"{\"allOf\": [{}]}", "\"allOf\""},
        {"{\"type\": \"strin\"}", "type \"strin\""},
        {"{\"$ref\": \"#/$defs/missing\"}", "names nothing"},
        {"{\"$ref\": \"http://x/y\"}", "only \"#\""},
        {"{\"type\": \"string\", \"format\": \"email\"}", "format \"email\""},
        {"{\"type\": \"object\", \"properties\": {}, \"required\": [\"x\"]}", "\"required\" names"},
        {"{\"type\": \"array\", \"minItems\": 3, \"maxItems\": 2}", "below"},
        {"{\"type\": \"string\", \"nullable\": true}", "\"nullable\""},
        {"[1, 2", "not JSON"},
        {"{\"$ref\": \"#\"}", "$ref cycle"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char *gbnf = NULL;
        struct weld_err e;
        CHECK_EQ_INT(grammar_gbnf_from_json_schema(bad[i].schema, strlen(bad[i].schema), &gbnf, &e),
                     WELD_ERR_INVALID_ARG);
        CHECK(gbnf == NULL);
        if (!strstr(e.msg, bad[i].names))
            fprintf(stderr, "  %s -> %s\n", bad[i].schema, e.msg);
        CHECK(strstr(e.msg, bad[i].names) != NULL);
    }
}

int main(int argc, char **argv)
{
    test_args(argc, argv);
    RUN(schemas_accept_and_reject);
    RUN(refusals_name_keyword_and_path);
    return test_summary();
}

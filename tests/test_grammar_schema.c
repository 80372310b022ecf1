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
    {"{\"type\": \"string\", \"format\": \"date\"}",
     {"\"2024-02-29\"", "\"2000-02-29\"", "\"1999-12-31\"", "\"2023-04-30\""},
     {"\"2023-02-29\"", "\"1900-02-29\"", "\"2023-04-31\"", "\"2023-13-01\"", "\"2023-00-10\""},
     NULL},
    {"{\"type\": \"object\", \"properties\": {\"e\": {\"format\": \"email\"}, \"h\": "
     "{\"type\": \"string\", \"format\": \"hostname\"}, \"i\": {\"type\": \"string\", "
     "\"format\": \"ipv4\"}, \"u\": {\"type\": \"string\", \"format\": \"uri\"}}, "
     "\"required\": [\"e\", \"h\", \"i\", \"u\"]}",
     {"{\"e\": \"a.b+c@x-y.org\", \"h\": \"db-1.local\", \"i\": \"10.0.255.9\", \"u\": "
      "\"https://ex.com:8080/a/b.c?q=1&r=2\"}"},
     {"{\"e\": \"a@b\", \"h\": \"x\", \"i\": \"1.2.3.4\", \"u\": \"http://a\"}",
      "{\"e\": \"a@b.c\", \"h\": \"-x\", \"i\": \"1.2.3.4\", \"u\": \"http://a\"}",
      "{\"e\": \"a@b.c\", \"h\": \"x\", \"i\": \"256.2.3.4\", \"u\": \"http://a\"}",
      "{\"e\": \"a@b.c\", \"h\": \"x\", \"i\": \"1.2.3.4\", \"u\": \"ftp://a\"}"},
     "u"},
    {"{\"type\": \"object\", \"properties\": {\"n\": {\"type\": \"integer\", \"minimum\": "
     "-5, \"exclusiveMaximum\": 120}, \"x\": {\"type\": \"number\", \"minimum\": -2, "
     "\"maximum\": 3}, \"m\": {\"maximum\": 0}}, \"required\": [\"n\", \"x\", \"m\"]}",
     {"{\"n\": -5, \"x\": -1.25, \"m\": -0.5}", "{\"n\": 119, \"x\": 3, \"m\": 0}",
      "{\"n\": 0, \"x\": 2.999, \"m\": -7}"},
     {"{\"n\": -6, \"x\": 0, \"m\": 0}", "{\"n\": 120, \"x\": 0, \"m\": 0}",
      "{\"n\": 1, \"x\": 3.5, \"m\": 0}", "{\"n\": 1, \"x\": -2.5, \"m\": 0}",
      "{\"n\": 1, \"x\": 1, \"m\": 0.5}", "{\"n\": 1.0, \"x\": 1, \"m\": 0}"},
     "x"},
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

/* Integer bounds: every integer near and between the bounds accepted exactly when inside
   them; number bounds: random decimals accepted only inside, and every integer inside. */
TEST(numeric_bounds_exact)
{
    static const struct {
        long long lo, hi;
        const char *kw;
    } r[] = {{-130, 47, "\"minimum\": -130, \"maximum\": 47"},
             {5, 5, "\"minimum\": 5, \"maximum\": 5"},
             {0, 1000, "\"minimum\": 0, \"maximum\": 1000"},
             {-1000, -7, "\"minimum\": -1000, \"maximum\": -7"},
             {123, 98765, "\"exclusiveMinimum\": 122, \"maximum\": 98765"},
             {7, 9999999999999999LL, "\"minimum\": 6.5"},
             {-9999999999999999LL, -3, "\"exclusiveMaximum\": -2"},
             {-19, 19, "\"exclusiveMinimum\": -20, \"exclusiveMaximum\": 20"}};
    struct rng g;
    rng_seed(&g, 17);
    int checked = 0;
    for (size_t i = 0; i < sizeof r / sizeof *r; i++)
        for (int num = 0; num < 2; num++) {
            if (num && (strstr(r[i].kw, "exclusive") || strstr(r[i].kw, ".5")))
                continue;
            char schema[256];
            snprintf(schema, sizeof schema, "{\"type\": \"%s\", %s}", num ? "number" : "integer",
                     r[i].kw);
            struct grammar *gr = from_schema(schema);
            REQUIRE(gr);
            long long a = r[i].lo > -100000 ? r[i].lo - 60 : -100000;
            long long b = r[i].hi < 100000 ? r[i].hi + 60 : 100000;
            for (long long x = a; x <= b; x += (b - a > 5000 && x > a + 200 && x < b - 200) ? 97 : 1) {
                char t[40];
                snprintf(t, sizeof t, "%lld", x);
                bool in = x >= r[i].lo && x <= r[i].hi;
                if (accepts(gr, t) != in) {
                    fprintf(stderr, "  %s: %s %s\n", schema, t, in ? "refused" : "taken");
                    CHECK(0);
                }
                checked++;
            }
            for (int k = 0; num && k < 3000; k++) { /* decimals: taken only inside */
                double x = (double)(a + (long long)(rng_u64(&g) % (uint64_t)(b - a + 1))) +
                           (double)(rng_u64(&g) % 1000) / 1000.0;
                char t[48];
                snprintf(t, sizeof t, "%.3f", x);
                double v = atof(t);
                if (accepts(gr, t) && !(v >= (double)r[i].lo && v <= (double)r[i].hi)) {
                    fprintf(stderr, "  %s: %s taken\n", schema, t);
                    CHECK(0);
                }
                checked++;
            }
            grammar_free(gr);
        }
    CHECK(checked > 10000);
}

/* --structured-outputs-config: no blanks between tokens; objects without
   additionalProperties take no other keys */
TEST(options)
{
    const char *schema = "{\"type\": \"object\", \"properties\": {\"a\": {\"type\": "
                         "\"array\", \"items\": {\"type\": \"integer\"}}}}";
    struct schema_opts o[3] = {{false, false}, {true, false}, {false, true}};
    const char *docs[] = {"{\"a\":[1,2]}", "{ \"a\": [1, 2] }", "{\"a\":[1],\"b\":true}"};
    const bool want[3][3] = {{true, true, true}, {true, false, true}, {true, true, false}};
    for (int i = 0; i < 3; i++) {
        char *gbnf = NULL;
        struct weld_err e;
        REQUIRE(grammar_gbnf_json_schema_ex(schema, strlen(schema), "root", &o[i], &gbnf, &e) ==
                WELD_OK);
        struct grammar *g = NULL;
        REQUIRE(grammar_parse_gbnf(&g, gbnf, strlen(gbnf), NULL, &e) == WELD_OK);
        for (int d = 0; d < 3; d++) {
            if (accepts(g, docs[d]) != want[i][d])
                fprintf(stderr, "  options %d, %s: %s\n", i, docs[d],
                        want[i][d] ? "refused" : "taken");
            CHECK(accepts(g, docs[d]) == want[i][d]);
        }
        grammar_free(g);
        free(gbnf);
    }
}

TEST(refusals_name_keyword_and_path)
{
    static const struct {
        const char *schema, *names;
    } bad[] = {
        {"{\"type\": \"number\", \"multipleOf\": 2}", "at /: \"multipleOf\" is not supported"},
        {"{\"type\": \"string\", \"pattern\": \"(a\"}",
         "\"pattern\": regex: at offset 0: unclosed ("},
        {"{\"properties\": {\"a\": {\"type\": \"number\", \"minimum\": 0.5}}}",
         "at /properties/a: \"minimum\" 0.5 on a number is not supported"},
        {"{\"type\": \"number\", \"exclusiveMaximum\": 3}", "\"exclusiveMaximum\" 3 on a number"},
        {"{\"type\": \"integer\", \"minimum\": 4, \"maximum\": 3.5}", "no integer lies"},
        {"{\"type\": \"integer\", \"minimum\": \"1\"}", "\"minimum\" must be a number"},
        {"{\"allOf\": [{}]}", "\"allOf\""},
        {"{\"type\": \"strin\"}", "type \"strin\""},
        {"{\"$ref\": \"#/$defs/missing\"}", "names nothing"},
        {"{\"$ref\": \"http://x/y\"}", "only \"#\""},
        {"{\"type\": \"string\", \"format\": \"ipv6\"}", "format \"ipv6\""},
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
    RUN(numeric_bounds_exact);
    RUN(options);
    RUN(refusals_name_keyword_and_path);
    return test_summary();
}

/*
 * test_grammar_gbnf - GBNF compilation and the stack-set matcher (grammar/grammar.h).
 *
 * The matcher is checked against a reference written here the slow way: for a rule and a
 * position, the set of positions where a derivation of the rule can end (memoised
 * recursion over the compiled rules; fine without left recursion, which compilation
 * refuses). Random strings, and strings derived at random from the grammars, must get the
 * same verdict from both, for hand-written grammars: JSON, arithmetic, repetition counts,
 * classes over multi-byte characters. Errors name their line and column.
 */
#include "core/rng.h"
#include "grammar/grammar.h"
#include "test.h"

#include <string.h>

/* ---- the reference ---- */

#define RMAX 48 /* string length the reference handles (end positions in a uint64_t) */

struct ref {
    const struct grammar *g;
    const uint8_t *s;
    int n;
    uint64_t *memo; /* (n_rules, n + 1) */
    uint8_t *done;
};

static uint64_t ends(struct ref *r, int rule, int pos);

static uint64_t alt_ends(struct ref *r, int el, int pos)
{
    uint64_t cur = 1ull << pos;
    for (; r->g->el[el].kind != GR_END; el++) {
        const struct gr_elem *x = &r->g->el[el];
        uint64_t next = 0;
        for (int p = 0; p <= r->n; p++) {
            if (!(cur >> p & 1))
                continue;
            if (x->kind == GR_BYTES) {
                if (p < r->n && r->s[p] >= x->lo && r->s[p] <= x->hi)
                    next |= 1ull << (p + 1);
            } else {
                next |= ends(r, x->rule, p);
            }
        }
        cur = next;
    }
    return cur;
}

static uint64_t ends(struct ref *r, int rule, int pos)
{
    size_t k = (size_t)rule * (size_t)(r->n + 1) + (size_t)pos;
    if (r->done[k])
        return r->memo[k];
    uint64_t e = 0;
    for (int a = 0; a < r->g->rule_n_alt[rule]; a++)
        e |= alt_ends(r, r->g->alt[r->g->rule_alt0[rule] + a], pos);
    r->done[k] = 1, r->memo[k] = e;
    return e;
}

static bool ref_accepts(const struct grammar *g, const uint8_t *s, int n)
{
    struct ref r = {g, s, n, calloc((size_t)g->n_rules * (size_t)(n + 1), sizeof(uint64_t)),
                    calloc((size_t)g->n_rules * (size_t)(n + 1), 1)};
    bool ok = ends(&r, g->root, 0) >> n & 1;
    free(r.memo), free(r.done);
    return ok;
}

static bool match_accepts(struct gmatch *m, const uint8_t *s, int n)
{
    gmatch_reset(m);
    return gmatch_accept(m, s, (size_t)n) && gmatch_can_end(m);
}

/* A random sentence of rule into out (depth-limited: past depth, the shortest-looking
   alternative, the last one, which for this file's grammars ends recursion). */
static int derive(const struct grammar *g, struct rng *r, int rule, int depth, uint8_t *out, int n,
                  int cap)
{
    int na = g->rule_n_alt[rule];
    int a = depth > 12 ? na - 1 : (int)(rng_u64(r) % (uint64_t)na);
    for (int el = g->alt[g->rule_alt0[rule] + a]; g->el[el].kind != GR_END && n >= 0; el++) {
        const struct gr_elem *x = &g->el[el];
        if (x->kind == GR_BYTES) {
            if (n >= cap)
                return -1;
            out[n++] = (uint8_t)(x->lo + rng_u64(r) % (uint64_t)(x->hi - x->lo + 1));
        } else {
            n = derive(g, r, x->rule, depth + 1, out, n, cap);
        }
    }
    return n;
}

static struct grammar *compile(const char *text)
{
    struct grammar *g = NULL;
    struct weld_err e;
    if (grammar_parse_gbnf(&g, text, strlen(text), NULL, &e) != WELD_OK)
        fprintf(stderr, "  %s\n", e.msg);
    return g;
}

static const char *const json_gbnf =
    "root   ::= ws value ws\n"
    "value  ::= object | array | string | number | (\"true\" | \"false\" | \"null\")\n"
    "object ::= \"{\" ws ( member ( ws \",\" ws member )* )? ws \"}\"\n"
    "member ::= string ws \":\" ws value\n"
    "array  ::=\n"
    "  \"[\" ws ( value ( ws \",\" ws value )* )? ws \"]\"\n"
    "string ::= \"\\\"\" ( [^\"\\\\\\x00-\\x1f] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4} ) )* "
    "\"\\\"\"\n"
    "number ::= \"-\"? ( \"0\" | [1-9] [0-9]* ) ( \".\" [0-9]+ )? ( [eE] [-+]? [0-9]+ )?\n"
    "ws     ::= [ \\t\\n]*   # JSON's white space\n";

TEST(json_strings)
{
    struct grammar *g = compile(json_gbnf);
    REQUIRE(g);
    struct gmatch *m = NULL;
    struct weld_err e;
    REQUIRE(gmatch_create(&m, g, &e) == WELD_OK);
    static const char *const good[] = {
        "{}",
        "[]",
        "0",
        "-12.5e+3",
        " {\"a\": [1, 2, {\"b\": null}], \"c\": \"x\\u00e9\"} ",
        "\"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\"",
        "[true,false,null]",
        "\"\\n\\\"\"",
    };
    static const char *const bad[] = {
        "{", "[1,]", "01", "{\"a\" 1}", "\"\\x\"", "\"a", "nul", "[1 2]", "\"\x01\"", "- 1",
    };
    for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
        const uint8_t *s = (const uint8_t *)good[i];
        int n = (int)strlen(good[i]);
        CHECK(match_accepts(m, s, n));
        if (n <= RMAX)
            CHECK(ref_accepts(g, s, n));
    }
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        const uint8_t *s = (const uint8_t *)bad[i];
        int n = (int)strlen(bad[i]);
        CHECK(!match_accepts(m, s, n));
        CHECK(!ref_accepts(g, s, n));
    }
    /* a rejected byte leaves the state as it was; prefixes stay alive */
    gmatch_reset(m);
    CHECK(gmatch_accept(m, (const uint8_t *)"{\"k\":", 5));
    CHECK(!gmatch_can_end(m));
    CHECK(!gmatch_accept(m, (const uint8_t *)"}", 1));
    CHECK(gmatch_accept(m, (const uint8_t *)" 7}", 3));
    CHECK(gmatch_can_end(m));
    gmatch_free(m);
    grammar_free(g);
}

/* Grammars beside JSON, each checked on random strings over its own alphabet and on random
   derivations. */
static const struct {
    const char *gbnf, *alphabet;
} cases[] = {
    {"root ::= expr\nexpr ::= term ((\"+\" | \"-\") term)*\nterm ::= factor ((\"*\" | \"/\") factor)*\n"
     "factor ::= [0-9]+ | \"(\" expr \")\"",
     "0123+-*/()"},
    {"root ::= \"a\"{2,4} \"b\"{3} \"c\"{1,} \"d\"{0,2}", "abcd"},
    {"root ::= ( [a-c] | \"xy\" )* \"z\"?", "abcxyz"},
    {"root ::= [\xce\xb1-\xcf\x89]+ \" \" [^a-z]", "\xce\xb1\xce\xb2\xcf\x89 az\xc3"},
    {"root ::= s\ns ::= \"(\" s \")\" s | \"\"", "()"},
    {"root ::= \"ab\" | \"a\" \"b\" | [a] [b] \"c\"?\n  | \"abc\"", "abc"},
    {"root ::= x y\nx ::= \"a\"?\ny ::= \"a\" \"b\"*", "ab"},
};

TEST(matcher_against_reference)
{
    struct rng r;
    rng_seed(&r, 3);
    int checked = 0, accepted = 0;
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        struct grammar *g = compile(cases[c].gbnf);
        REQUIRE(g);
        struct gmatch *m = NULL;
        struct weld_err e;
        REQUIRE(gmatch_create(&m, g, &e) == WELD_OK);
        const char *al = cases[c].alphabet;
        const int na = (int)strlen(al);
        uint8_t s[RMAX];
        int bad = 0;
        for (int it = 0; it < 3000; it++) {
            int n;
            if (it % 2) {
                n = derive(g, &r, g->root, 0, s, 0, RMAX);
                if (n < 0)
                    continue;
            } else {
                n = (int)(rng_u64(&r) % 12);
                for (int i = 0; i < n; i++)
                    s[i] = (uint8_t)al[rng_u64(&r) % (uint64_t)na];
            }
            bool want = ref_accepts(g, s, n), got = match_accepts(m, s, n);
            bad += want != got;
            accepted += want, checked++;
            if (it % 2)
                bad += !want; /* a derivation is a sentence */
            /* byte by byte equals all at once */
            gmatch_reset(m);
            bool ok = true;
            for (int i = 0; i < n && ok; i++)
                ok = gmatch_accept(m, s + i, 1);
            bad += (ok && gmatch_can_end(m)) != got;
        }
        if (bad)
            fprintf(stderr, "  grammar %zu: %d disagreements\n", c, bad);
        CHECK_EQ_INT(bad, 0);
        gmatch_free(m);
        grammar_free(g);
    }
    fprintf(stderr, "  %d strings checked, %d accepted\n", checked, accepted);
    CHECK(accepted > checked / 4);
}

static int enc(uint32_t c, uint8_t *b)
{
    if (c < 0x80)
        return b[0] = (uint8_t)c, 1;
    if (c < 0x800)
        return b[0] = (uint8_t)(0xC0 | c >> 6), b[1] = (uint8_t)(0x80 | (c & 0x3F)), 2;
    if (c < 0x10000)
        return b[0] = (uint8_t)(0xE0 | c >> 12), b[1] = (uint8_t)(0x80 | (c >> 6 & 0x3F)),
               b[2] = (uint8_t)(0x80 | (c & 0x3F)), 3;
    b[0] = (uint8_t)(0xF0 | c >> 18), b[1] = (uint8_t)(0x80 | (c >> 12 & 0x3F));
    b[2] = (uint8_t)(0x80 | (c >> 6 & 0x3F)), b[3] = (uint8_t)(0x80 | (c & 0x3F));
    return 4;
}

/* A class over code points accepts the UTF-8 of exactly its members (every code point up
   to U+3000, then a sample to U+10FFFF), and nothing that is not UTF-8. */
TEST(classes_are_utf8)
{
    static const struct {
        const char *gbnf;
        uint32_t lo, hi; /* members: [lo, hi], or its complement when neg */
        bool neg;
    } cls[] = {
        {"root ::= [\\u0700-\\u0900]", 0x700, 0x900, false},
        {"root ::= [\\u00ff-\\U00010100]", 0xFF, 0x10100, false},
        {"root ::= [^\\x80-\\uFFFF]", 0x80, 0xFFFF, true},
        {"root ::= [\\x41-\\x5a]", 0x41, 0x5A, false},
        {"root ::= [^a-z]", 'a', 'z', true},
        {"root ::= .", 1, 0, true},
    };
    struct rng r;
    rng_seed(&r, 9);
    for (size_t i = 0; i < sizeof cls / sizeof *cls; i++) {
        struct grammar *g = compile(cls[i].gbnf);
        REQUIRE(g);
        struct gmatch *m = NULL;
        struct weld_err e;
        REQUIRE(gmatch_create(&m, g, &e) == WELD_OK);
        int bad = 0;
        for (uint32_t k = 0; k < 0x3000 + 20000; k++) {
            uint32_t c = k < 0x3000 ? k : 0x3000 + (uint32_t)(rng_u64(&r) % (0x110000 - 0x3000));
            if (c >= 0xD800 && c <= 0xDFFF)
                continue;
            uint8_t b[4];
            int n = enc(c, b);
            bool in = (c >= cls[i].lo && c <= cls[i].hi) != cls[i].neg;
            bad += match_accepts(m, b, n) != in;
        }
        /* not UTF-8: an overlong '/', a surrogate, a lone continuation byte, past U+10FFFF */
        static const char *const junk[] = {"\xc0\xaf", "\xed\xa0\x80", "\x80", "\xf4\x90\x80\x80"};
        for (size_t j = 0; j < sizeof junk / sizeof *junk; j++)
            bad += match_accepts(m, (const uint8_t *)junk[j], (int)strlen(junk[j]));
        if (bad)
            fprintf(stderr, "  %s: %d wrong\n", cls[i].gbnf, bad);
        CHECK_EQ_INT(bad, 0);
        gmatch_free(m);
        grammar_free(g);
    }
}

TEST(errors_name_the_place)
{
    static const struct {
        const char *text, *names;
    } bad[] = {
        {"root ::= foo", "line 1, column 10: rule 'foo' is used but not defined"},
        {"root \"a\"", "line 1, column 6: expected ::="},
        {"root ::= \"abc", "line 1, column 10: unterminated \"literal\""},
        {"root ::= [a-", "unterminated [class]"},
        {"root ::= \"\\q\"", "unknown escape"},
        {"root ::= a\na ::= a \"x\" | \"y\"", "line 2, column 1: rule 'a' is left-recursive"},
        {"root ::= b \"x\"\nb ::= \"\"? root", "left-recursive"},
        {"root ::= [z-a]", "runs backwards"},
        {"root ::= \"a\"{5,2}", "n below m"},
        {"root ::= \"a\"{1001}", "above 1000"},
        {"root ::= ( \"a\" ", "unclosed ("},
        {"root ::= \"a\" )", "unmatched )"},
        {"root ::= r\nr ::= \"x\" r", "no string satisfies"},
        {"root ::= \"a\"\nroot ::= \"b\"", "line 2, column 1: rule defined twice"},
        {"start ::= \"a\"", "no rule 'root'"},
        {"root ::= \"\\uD800\"", "not a Unicode scalar value"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        struct grammar *g = NULL;
        struct weld_err e;
        CHECK_EQ_INT(grammar_parse_gbnf(&g, bad[i].text, strlen(bad[i].text), NULL, &e),
                     WELD_ERR_INVALID_ARG);
        CHECK(g == NULL);
        if (!strstr(e.msg, bad[i].names))
            fprintf(stderr, "  %s -> %s\n", bad[i].text, e.msg);
        CHECK(strstr(e.msg, bad[i].names) != NULL);
    }
    /* another start rule by name; a grammar of the empty string */
    struct grammar *g = NULL;
    struct weld_err e;
    CHECK_EQ_INT(grammar_parse_gbnf(&g, "start ::= \"a\"", 13, "start", &e), WELD_OK);
    grammar_free(g);
    REQUIRE(grammar_parse_gbnf(&g, "root ::= \"\"", 11, NULL, &e) == WELD_OK);
    struct gmatch *m = NULL;
    REQUIRE(gmatch_create(&m, g, &e) == WELD_OK);
    CHECK(gmatch_can_end(m));
    CHECK(!gmatch_accept(m, (const uint8_t *)"a", 1));
    gmatch_free(m);
    grammar_free(g);
}

/* gmatch_forced: the bytes every continuation starts with, up to a choice or a possible
   end; the state is left as it was. */
TEST(forced_bytes)
{
    static const char *g_text = "root ::= \"ab\" ( \"c\" [xy] \"de\" | \"d\" ) \"!\"?\n";
    struct grammar *g = NULL;
    struct weld_err e;
    REQUIRE(grammar_parse_gbnf(&g, g_text, strlen(g_text), NULL, &e) == WELD_OK);
    struct gmatch *m = NULL;
    REQUIRE(gmatch_create(&m, g, &e) == WELD_OK);
    uint8_t out[16];
    int n = gmatch_forced(m, out, 16);
    CHECK(n == 2 && !memcmp(out, "ab", 2));
    CHECK(gmatch_accept(m, (const uint8_t *)"a", 1)); /* unchanged: "a" still next */
    n = gmatch_forced(m, out, 16);
    CHECK(n == 1 && out[0] == 'b');
    CHECK(gmatch_accept(m, (const uint8_t *)"bcx", 3));
    n = gmatch_forced(m, out, 16);
    CHECK(n == 2 && !memcmp(out, "de", 2)); /* then "!" or the end: a choice */
    CHECK_EQ_INT(gmatch_forced(m, out, 1), 1);
    CHECK(gmatch_accept(m, (const uint8_t *)"de", 2));
    CHECK_EQ_INT(gmatch_forced(m, out, 16), 0);
    gmatch_free(m);
    grammar_free(g);
}

int main(int argc, char **argv)
{
    test_args(argc, argv);
    RUN(json_strings);
    RUN(matcher_against_reference);
    RUN(classes_are_utf8);
    RUN(errors_name_the_place);
    RUN(forced_bytes);
    return test_summary();
}

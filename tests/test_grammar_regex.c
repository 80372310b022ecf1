/*
 * test_grammar_regex - regular expressions to GBNF (grammar/regex.h), checked on
 * hand-written cases whose verdicts are JavaScript's (RegExp with the u flag, the whole
 * string for guided_regex, a search for patterns), against node's own RegExp on random
 * strings (skipped without node), and refusals with their offsets.
 */
#include "core/json.h"
#include "core/rng.h"
#include "grammar/grammar.h"
#include "grammar/regex.h"
#include "test.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <string.h>

static int verdict(const char *re, bool search, const char *s)
{
    char *gbnf = NULL;
    struct weld_err e;
    if (grammar_gbnf_from_regex(re, strlen(re), search, false, "root", &gbnf, &e) != WELD_OK) {
        fprintf(stderr, "  %s: %s\n", re, e.msg);
        return -1;
    }
    struct grammar *g = NULL;
    if (grammar_parse_gbnf(&g, gbnf, strlen(gbnf), NULL, &e) != WELD_OK) {
        fprintf(stderr, "  %s -> %s\n  %s\n", re, gbnf, e.msg);
        free(gbnf);
        return -1;
    }
    free(gbnf);
    struct gmatch *m = NULL;
    int v = -1;
    if (gmatch_create(&m, g, &e) == WELD_OK)
        v = gmatch_accept(m, (const uint8_t *)s, strlen(s)) && gmatch_can_end(m);
    gmatch_free(m);
    grammar_free(g);
    return v;
}

TEST(cases)
{
    static const struct {
        const char *re, *s;
        bool search;
        int want;
    } c[] = {
        {"abc", "abc", false, 1},
        {"abc", "abcd", false, 0},
        {"abc", "xabcy", true, 1},
        {"^abc", "xabc", true, 0},
        {"abc$", "abcx", true, 0},
        {"^a+$", "aaa", true, 1},
        {"a|b|", "", false, 1},
        {"(ab)+c?", "ababc", false, 1},
        {"(ab)+c?", "abac", false, 0},
        {"(?:x|yz){2,3}", "xyzx", false, 1},
        {"(?:x|yz){2,3}", "x", false, 0},
        {"(?<year>\\d{4})-(\\d{2})", "2024-06", false, 1},
        {"\\d+\\.\\d*", "12.", false, 1},
        {"\\D", "5", false, 0},
        {"\\w+\\s\\W", "ab_9 !", false, 1},
        {"[a-c\\d]+", "a1c2", false, 1},
        {"[^a-c]", "d", false, 1},
        {"[^a-c]", "b", false, 0},
        {"[\\]\\-x]+", "]-x", false, 1},
        {".", "\n", false, 0},
        {".", "\xc3\xa9", false, 1},
        {"\\u00e9|\\u{1F600}", "\xf0\x9f\x98\x80", false, 1},
        {"[\xce\xb1-\xcf\x89]{2}", "\xce\xb2\xce\xb3", false, 1},
        {"a{3}", "aaa", false, 1},
        {"a{2,}", "a", false, 0},
        {"a*?b", "aab", false, 1},
        {"\\x41\\t", "A\t", false, 1},
        {"\\.", "a", false, 0},
        {"[.]", ".", false, 1},
        {"ab?", "abb", false, 0},
        {"a?", "aa", false, 0},
        {"a+", "", false, 0},
        {"(ab)*", "", false, 1},
        {"a{1,2}", "aaa", false, 0},
    };
    int bad = 0;
    for (size_t i = 0; i < sizeof c / sizeof *c; i++) {
        int v = verdict(c[i].re, c[i].search, c[i].s);
        if (v != c[i].want) {
            fprintf(stderr, "  /%s/ on \"%s\" (search %d): %d, want %d\n", c[i].re, c[i].s,
                    c[i].search, v, c[i].want);
            bad++;
        }
    }
    CHECK_EQ_INT(bad, 0);
}

/* weld's verdicts on random strings, written as JSON lines for node to check with its
   RegExp; node prints the lines where it disagrees. */
TEST(against_javascript)
{
    const char *nd = getenv("WELD_NODE_DIR");
    if (!nd || system("node --version >/dev/null 2>&1") != 0)
        SKIP("node is not here");
    static const char *const res[] = {
        "[a-c]+x?",     "(ab|a)(c|bcd)", "^a.*b$",      "\\d{2,3}-?\\w",
        "(?:x|y{2})*z", "[^ab]c|a",      "a(b(c|d)?)+", "\\s*[\xc3\xa9\xc3\xa8]+\\S",
        "(|a)b",        "a{0,2}b{1,}",
    };
    static const char *const alpha[] = {"a", "b", "c", "d",  "x", "y",        "z",        "1",
                                        "2", "-", " ", "\n", "_", "\xc3\xa9", "\xc3\xa8", "."};
    char path[4200];
    snprintf(path, sizeof path, "%s/regex-cases.jsonl", test_tmpdir());
    FILE *f = fopen(path, "w");
    REQUIRE(f);
    struct rng r;
    rng_seed(&r, 17);
    int n = 0;
    for (size_t i = 0; i < sizeof res / sizeof *res; i++)
        for (int search = 0; search < 2; search++)
            for (int it = 0; it < 400; it++) {
                char str[64] = "";
                int len = (int)(rng_u64(&r) % 7);
                /* a third of the strings from the regex's own characters */
                for (int k = 0; k < len; k++) {
                    const char *a = alpha[rng_u64(&r) % (sizeof alpha / sizeof *alpha)];
                    char one[2] = {res[i][rng_u64(&r) % strlen(res[i])], 0};
                    strcat(str, it % 3 == 0 && (unsigned char)one[0] < 0x80 ? one : a);
                }
                int v = verdict(res[i], search, str);
                REQUIRE(v >= 0);
                json_t *o = json_pack("{s:s, s:b, s:s, s:b}", "re", res[i], "search", search, "s",
                                      str, "v", v);
                char *line = json_dumps(o, JSON_COMPACT);
                fprintf(f, "%s\n", line);
                free(line);
                json_decref(o);
                n++;
            }
    fclose(f);
    char cmd[8600];
    snprintf(cmd, sizeof cmd,
             "node -e 'const fs = require(\"fs\"); let bad = 0; for (const l of "
             "fs.readFileSync(process.argv[1], \"utf8\").split(\"\\n\")) { if (!l) continue; "
             "const c = JSON.parse(l); const re = new RegExp(c.search ? c.re : \"^(?:\" + c.re + "
             "\")$\", \"u\"); if (re.test(c.s) !== c.v) { if (bad++ < 5) console.log(l); } } "
             "console.log(\"bad\", bad)' '%s'",
             path);
    FILE *p = popen(cmd, "r");
    REQUIRE(p);
    char out[4096];
    int bad = -1;
    while (fgets(out, sizeof out, p)) {
        if (sscanf(out, "bad %d", &bad) != 1)
            fprintf(stderr, "  disagrees: %s", out);
    }
    pclose(p);
    fprintf(stderr, "  %d strings, %d disagreements with node\n", n, bad);
    CHECK_EQ_INT(bad, 0);
}

TEST(refusals)
{
    static const struct {
        const char *re, *names;
    } c[] = {
        {"(a)\\1", "offset 3: backreferences"},
        {"a(?=b)", "offset 1: lookaround"},
        {"\\bword", "offset 0: word boundaries"},
        {"a^b", "offset 1: ^ and $"},
        {"*a", "nothing to repeat"},
        {"(ab", "offset 0: unclosed ("},
        {"ab)", "offset 2: unmatched )"},
        {"[a-", "unterminated ["},
        {"[z-a]", "out of order"},
        {"a{3,1}", "n below m"},
        {"a{2000}", "above 1000"},
        {"\\q", "unknown escape"},
    };
    for (size_t i = 0; i < sizeof c / sizeof *c; i++) {
        char *g = NULL;
        struct weld_err e;
        CHECK_EQ_INT(grammar_gbnf_from_regex(c[i].re, strlen(c[i].re), false, false, "root", &g,
                                             &e),
                     WELD_ERR_INVALID_ARG);
        CHECK(g == NULL);
        if (!strstr(e.msg, c[i].names))
            fprintf(stderr, "  %s -> %s\n", c[i].re, e.msg);
        CHECK(strstr(e.msg, c[i].names) != NULL);
    }
}

int main(int argc, char **argv)
{
    test_args(argc, argv);
    RUN(cases);
    RUN(against_javascript);
    RUN(refusals);
    return test_summary();
}

/*
 * regex - a regular expression to GBNF (grammar/regex.h): vLLM's `guided_regex` and JSON
 * Schema's `pattern`.
 *
 * The syntax is ECMAScript's, the part that describes a regular language: literals,
 * `.`, escapes (\d \D \w \W \s \S, \t \n \r \f \v \0, \xHH, \uHHHH, \u{H...}, an escaped
 * punctuation character), [classes] with ranges and ^, groups ( ) and (?: ), named groups
 * (?<n> ) (the name is dropped), `|`, and the quantifiers * + ? {m} {m,} {m,n} (lazy `?`
 * after one changes which match a search finds, not the language, so it is accepted and
 * ignored). `^` and `$` count only at the ends; an expression without them matches
 * anywhere (a search, as JSON Schema's pattern) when `search` is set, else the whole text.
 * Refused, with the offset: backreferences, lookaround, \b \B, anchors inside, flags.
 * `.` is any character but a line terminator, as in JavaScript.
 *
 * With json, the expression describes the characters of a JSON string's content and the
 * rule its JSON text: '"', '\\' and control characters appear in their escaped forms.
 * The output is one rule, `rule`, for the caller to put beside its own rules.
 */
#include "grammar/regex.h"

#include "core/alloc.h"
#include "core/strbuf.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

struct rx {
    const char *s, *p, *end;
    const char *prefix;
    bool json; /* inside a JSON string: characters as JSON writes them */
    struct strbuf b;
    int n_rules;
    struct weld_err *e;
    int rc;
};

static void put(struct rx *r, const char *s, size_t n)
{
    strbuf_put(&r->b, s, n);
}

static void putf(struct rx *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void putf(struct rx *r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    strbuf_vprintf(&r->b, fmt, ap);
    va_end(ap);
}

static int fail(struct rx *r, const char *at, const char *what)
{
    if (!r->rc)
        r->rc = err_set(r->e, WELD_ERR_INVALID_ARG, "regex: at offset %d: %s", (int)(at - r->s),
                        what);
    return r->rc;
}

/* A code point as a GBNF class member (escaped). */
static void put_cp(struct rx *r, uint32_t c)
{
    if (c == '\\' || c == ']' || c == '[' || c == '-' || c == '^' || c == '"')
        putf(r, "\\%c", (char)c);
    else if (c < 0x20 || c == 0x7F)
        putf(r, "\\x%02x", c);
    else if (c < 0x80)
        putf(r, "%c", (char)c);
    else if (c < 0x10000)
        putf(r, "\\u%04X", c);
    else
        putf(r, "\\U%08X", c);
}

static int hexv(char c)
{
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

/* One source code point (UTF-8) at r->p. */
static int64_t next_cp(struct rx *r)
{
    const char *at = r->p;
    uint8_t c = (uint8_t)*r->p++;
    if (c < 0x80)
        return c;
    int n = c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : c >= 0xC0 ? 1 : -1;
    if (n < 0)
        return fail(r, at, "invalid UTF-8"), -1;
    uint32_t v = c & (0x3F >> n);
    for (int i = 0; i < n; i++) {
        if (r->p >= r->end || ((uint8_t)*r->p & 0xC0) != 0x80)
            return fail(r, at, "invalid UTF-8"), -1;
        v = v << 6 | ((uint8_t)*r->p++ & 0x3F);
    }
    return v;
}

static int64_t hex_escape(struct rx *r, const char *at, int digits)
{
    uint32_t v = 0;
    for (int i = 0; i < digits; i++) {
        int h = r->p < r->end ? hexv(*r->p) : -1;
        if (h < 0)
            return fail(r, at, "escape needs hexadecimal digits"), -1;
        v = v << 4 | (uint32_t)h, r->p++;
    }
    return v;
}

/* A set of code points: sorted, merged ranges. */
struct cset {
    uint32_t lo[300], hi[300];
    int n;
};

static bool cs_add(struct cset *c, uint32_t lo, uint32_t hi)
{
    if (c->n == 300)
        return false;
    c->lo[c->n] = lo, c->hi[c->n++] = hi;
    return true;
}

static void cs_norm(struct cset *c)
{
    for (int i = 1; i < c->n; i++)
        for (int j = i; j > 0 && c->lo[j] < c->lo[j - 1]; j--) {
            uint32_t t = c->lo[j];
            c->lo[j] = c->lo[j - 1], c->lo[j - 1] = t;
            t = c->hi[j], c->hi[j] = c->hi[j - 1], c->hi[j - 1] = t;
        }
    int m = 0;
    for (int i = 0; i < c->n; i++)
        if (m && c->lo[i] <= c->hi[m - 1] + 1)
            c->hi[m - 1] = c->hi[i] > c->hi[m - 1] ? c->hi[i] : c->hi[m - 1];
        else
            c->lo[m] = c->lo[i], c->hi[m++] = c->hi[i];
    c->n = m;
}

static void cs_invert(struct cset *c)
{
    cs_norm(c);
    struct cset o = {.n = 0};
    uint32_t next = 0;
    for (int i = 0; i < c->n; i++) {
        if (c->lo[i] > next)
            cs_add(&o, next, c->lo[i] - 1);
        next = c->hi[i] + 1;
    }
    if (next <= 0x10FFFF)
        cs_add(&o, next, 0x10FFFF);
    *c = o;
}

static bool cs_has(const struct cset *c, uint32_t x)
{
    for (int i = 0; i < c->n; i++)
        if (x >= c->lo[i] && x <= c->hi[i])
            return true;
    return false;
}

/* The ranges of a class escape \d \w \s (its letter in either case) added to out (NULL:
   none); false: not a class escape. */
static bool class_escape(char c, struct cset *out)
{
    static const uint32_t d[] = {'0', '9'}, w[] = {'a', 'z', 'A', 'Z', '0', '9', '_', '_'};
    static const uint32_t sp[] = {0x09,   0x0D,   0x20,   0x20,   0xA0,   0xA0,   0x1680,
                                  0x1680, 0x2000, 0x200A, 0x2028, 0x2029, 0x202F, 0x202F,
                                  0x205F, 0x205F, 0x3000, 0x3000, 0xFEFF, 0xFEFF};
    const uint32_t *v = NULL;
    size_t n = 0;
    switch (c | 0x20) {
    case 'd': v = d, n = 2; break;
    case 'w': v = w, n = 8; break;
    case 's': v = sp, n = 20; break;
    default: return false;
    }
    for (size_t i = 0; out && i < n; i += 2)
        cs_add(out, v[i], v[i + 1]);
    return true;
}

/* The set as a GBNF item: a [class], and in JSON mode without the characters JSON writes
   escaped (", \, controls) but with their escaped forms as alternatives. */
static void emit_set(struct rx *r, struct cset *c)
{
    cs_norm(c);
    struct cset safe = {.n = 0};
    for (int i = 0; i < c->n; i++) {
        uint32_t lo = c->lo[i], hi = c->hi[i];
        if (r->json) { /* minus 0x00-0x1F, '"', '\\' */
            lo = lo < 0x20 ? 0x20 : lo;
            for (int cut = 0; cut < 2 && lo <= hi; cut++) {
                uint32_t x = cut ? 0x5C : 0x22;
                if (x >= lo && x <= hi) {
                    if (x > lo)
                        cs_add(&safe, lo, x - 1);
                    lo = x + 1;
                }
            }
        }
        if (lo <= hi)
            cs_add(&safe, lo, hi);
    }
    cs_norm(&safe);
    /* the escaped forms, as GBNF literal bodies */
    char lit[80][12];
    int nl = 0;
    if (r->json) {
        static const char shortf[14] = {[8] = 'b', [9] = 't', [10] = 'n', [12] = 'f', [13] = 'r'};
        if (cs_has(c, '"'))
            snprintf(lit[nl++], sizeof lit[0], "\\\\\\\"");
        if (cs_has(c, '\\'))
            snprintf(lit[nl++], sizeof lit[0], "\\\\\\\\");
        for (uint32_t x = 0; x < 0x20; x++)
            if (cs_has(c, x)) {
                snprintf(lit[nl++], sizeof lit[0], "\\\\u00%02x", (unsigned)x);
                if (x < sizeof shortf && shortf[x])
                    snprintf(lit[nl++], sizeof lit[0], "\\\\%c", shortf[x]);
            }
    }
    const int alts = (safe.n ? 1 : 0) + nl;
    if (!alts) {
        put(r, "[^\\x00-\\U0010FFFF]", 18); /* the empty set: nothing matches */
        return;
    }
    if (alts > 1)
        put(r, "(", 1);
    bool first = true;
    if (safe.n) {
        put(r, " [", 2);
        for (int i = 0; i < safe.n; i++) {
            put_cp(r, safe.lo[i]);
            if (safe.hi[i] != safe.lo[i]) {
                put(r, "-", 1);
                put_cp(r, safe.hi[i]);
            }
        }
        put(r, "]", 1);
        first = false;
    }
    for (int i = 0; i < nl; i++) {
        putf(r, "%s \"%s\"", first ? "" : " |", lit[i]);
        first = false;
    }
    if (alts > 1)
        put(r, " )", 2);
}

/* An escape after '\' (r->p past it) as a single code point, or -2 for a class escape
   (its letter in *cls), -1 on error. */
static int64_t escape(struct rx *r, char *cls)
{
    const char *at = r->p - 1;
    if (r->p >= r->end)
        return fail(r, at, "unfinished escape"), -1;
    char c = *r->p++;
    if (class_escape(c, NULL)) {
        *cls = c;
        return -2;
    }
    switch (c) {
    case 't': return '\t';
    case 'n': return '\n';
    case 'r': return '\r';
    case 'f': return '\f';
    case 'v': return '\v';
    case '0': return 0;
    case 'x': return hex_escape(r, at, 2);
    case 'u':
        if (r->p < r->end && *r->p == '{') {
            r->p++;
            uint32_t v = 0;
            int n = 0;
            while (r->p < r->end && hexv(*r->p) >= 0 && n < 6)
                v = v << 4 | (uint32_t)hexv(*r->p++), n++;
            if (!n || r->p >= r->end || *r->p != '}' || v > 0x10FFFF)
                return fail(r, at, "bad \\u{...} escape"), -1;
            r->p++;
            return v;
        }
        return hex_escape(r, at, 4);
    case 'b':
    case 'B': return fail(r, at, "word boundaries (\\b, \\B) are not supported"), -1;
    default:
        if (c >= '1' && c <= '9')
            return fail(r, at, "backreferences are not supported"), -1;
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
            return fail(r, at, "unknown escape"), -1;
        return (uint8_t)c;
    }
}

/* [class] at r->p (after '['): appended as a set. */
static int parse_class(struct rx *r)
{
    const char *at = r->p - 1;
    bool neg = r->p < r->end && *r->p == '^';
    if (neg)
        r->p++;
    struct cset set = {.n = 0};
    bool first = true;
    while (r->p < r->end && (*r->p != ']' || first)) {
        first = false;
        int64_t a;
        char cls = 0;
        if (*r->p == '\\') {
            r->p++;
            if ((a = escape(r, &cls)) == -1)
                return r->rc;
            if (a == -2) {
                struct cset e = {.n = 0};
                class_escape(cls, &e);
                if (cls >= 'A' && cls <= 'Z')
                    cs_invert(&e);
                for (int i = 0; i < e.n; i++)
                    if (!cs_add(&set, e.lo[i], e.hi[i]))
                        return fail(r, at, "class of too many ranges");
                continue;
            }
        } else if ((a = next_cp(r)) < 0) {
            return r->rc;
        }
        int64_t b = a;
        if (r->p + 1 < r->end && *r->p == '-' && r->p[1] != ']') {
            r->p++;
            if (*r->p == '\\') {
                r->p++;
                if ((b = escape(r, &cls)) == -1)
                    return r->rc;
                if (b == -2)
                    return fail(r, r->p - 2, "a class escape cannot end a range");
            } else if ((b = next_cp(r)) < 0) {
                return r->rc;
            }
            if (b < a)
                return fail(r, at, "class range out of order");
        }
        if (!cs_add(&set, (uint32_t)a, (uint32_t)b))
            return fail(r, at, "class of too many ranges");
    }
    if (r->p >= r->end)
        return fail(r, at, "unterminated [");
    r->p++;
    if (neg)
        cs_invert(&set);
    emit_set(r, &set);
    return 0;
}

static int parse_alt(struct rx *r, int depth);

static int read_int(struct rx *r, int *v)
{
    long x = 0;
    int n = 0;
    while (r->p < r->end && *r->p >= '0' && *r->p <= '9' && n < 6)
        x = x * 10 + (*r->p++ - '0'), n++;
    *v = (int)x;
    return n;
}

/* A sequence of quantified atoms up to '|', ')' or the end. */
static int parse_seq(struct rx *r, int depth)
{
    for (;;) {
        if (r->p >= r->end || *r->p == '|' || *r->p == ')')
            return 0;
        const char *at = r->p;
        char c = *r->p;
        put(r, " ", 1);
        if (c == '(') {
            r->p++;
            if (r->p < r->end && *r->p == '?') {
                if (r->p + 1 < r->end && r->p[1] == ':') {
                    r->p += 2;
                } else if (r->p + 1 < r->end && r->p[1] == '<' && r->p + 2 < r->end &&
                           r->p[2] != '=' && r->p[2] != '!') {
                    const char *q = memchr(r->p, '>', (size_t)(r->end - r->p));
                    if (!q)
                        return fail(r, at, "unterminated group name");
                    r->p = q + 1;
                } else {
                    return fail(r, at, "lookaround and inline flags are not supported");
                }
            }
            put(r, "(", 1);
            if (parse_alt(r, depth + 1))
                return r->rc;
            if (r->p >= r->end || *r->p != ')')
                return fail(r, at, "unclosed (");
            r->p++;
            put(r, " )", 2);
        } else if (c == '[') {
            r->p++;
            if (parse_class(r))
                return r->rc;
        } else if (c == '.') {
            r->p++;
            struct cset dot = {.n = 0};
            cs_add(&dot, '\n', '\n'), cs_add(&dot, '\r', '\r'), cs_add(&dot, 0x2028, 0x2029);
            cs_invert(&dot);
            emit_set(r, &dot);
        } else if (c == '^' || c == '$') {
            return fail(r, at, "^ and $ are supported only at the ends");
        } else if (c == '*' || c == '+' || c == '?' || c == '{') {
            return fail(r, at, "a quantifier with nothing to repeat");
        } else {
            int64_t v;
            char cls = 0;
            if (c == '\\') {
                r->p++;
                if ((v = escape(r, &cls)) == -1)
                    return r->rc;
            } else if ((v = next_cp(r)) < 0) {
                return r->rc;
            }
            struct cset one = {.n = 0};
            if (v == -2) {
                class_escape(cls, &one);
                if (cls >= 'A' && cls <= 'Z')
                    cs_invert(&one);
            } else {
                cs_add(&one, (uint32_t)v, (uint32_t)v);
            }
            emit_set(r, &one);
        }
        /* a quantifier */
        if (r->p < r->end && (*r->p == '*' || *r->p == '+' || *r->p == '?')) {
            put(r, r->p, 1);
            r->p++;
        } else if (r->p < r->end && *r->p == '{') {
            const char *q = r->p + 1;
            int m = 0, n = -1;
            r->p++;
            if (!read_int(r, &m)) { /* a literal '{' in JavaScript; refused here */
                r->p = q - 1;
                return fail(r, q - 1, "'{' not starting a {m,n} quantifier: escape it");
            }
            n = m;
            if (r->p < r->end && *r->p == ',') {
                r->p++;
                n = -1;
                if (r->p < r->end && *r->p != '}' && !read_int(r, &n))
                    return fail(r, q - 1, "bad {m,n} quantifier");
            }
            if (r->p >= r->end || *r->p != '}')
                return fail(r, q - 1, "bad {m,n} quantifier");
            r->p++;
            if (n >= 0 && n < m)
                return fail(r, q - 1, "{m,n} with n below m");
            if (m > 1000 || n > 1000)
                return fail(r, q - 1, "repetition count above 1000");
            if (n < 0)
                putf(r, "{%d,}", m);
            else
                putf(r, "{%d,%d}", m, n);
        }
        if (r->p < r->end && *r->p == '?' && r->p > at + 1 &&
            (r->p[-1] == '*' || r->p[-1] == '+' || r->p[-1] == '?' || r->p[-1] == '}'))
            r->p++; /* lazy: the same language */
    }
}

static int parse_alt(struct rx *r, int depth)
{
    if (depth > 100)
        return fail(r, r->p, "groups nested more than 100 deep");
    for (;;) {
        const size_t before = r->b.n;
        if (parse_seq(r, depth))
            return r->rc;
        if (r->b.n == before)
            put(r, " \"\"", 3); /* an empty alternative */
        if (r->p < r->end && *r->p == '|') {
            r->p++;
            put(r, " |", 2);
            continue;
        }
        return 0;
    }
}

int grammar_gbnf_from_regex(const char *re, size_t len, bool search, bool json, const char *rule,
                            char **gbnf, struct weld_err *e)
{
    *gbnf = NULL;
    struct rx r = {.s = re, .p = re, .end = re + len, .prefix = rule, .json = json, .e = e};
    bool head = len && re[0] == '^';
    bool tail = len >= 1 && re[len - 1] == '$' && (len < 2 || re[len - 2] != '\\');
    if (head)
        r.p++;
    if (tail && r.end > r.p)
        r.end--;
    struct cset any = {.n = 0}; /* a search: any text around the match */
    cs_add(&any, 0, 0x10FFFF);
    putf(&r, "%s ::=", rule);
    if (search && !head) {
        put(&r, " (", 2);
        emit_set(&r, &any);
        put(&r, " )*", 3);
    }
    put(&r, " (", 2);
    if (!parse_alt(&r, 0) && r.p < r.end)
        fail(&r, r.p, "unmatched )");
    put(&r, " )", 2);
    if (search && !tail) {
        put(&r, " (", 2);
        emit_set(&r, &any);
        put(&r, " )*", 3);
    }
    put(&r, "\n", 1);
    if (!r.rc && r.b.oom)
        r.rc = err_set(e, WELD_ERR_NOMEM, "regex: out of memory");
    if (r.rc) {
        wfree(r.b.p);
        return r.rc;
    }
    *gbnf = r.b.p;
    return WELD_OK;
}

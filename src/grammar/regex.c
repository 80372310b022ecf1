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
 * The output is one rule per group, named `<prefix>`, `<prefix>-1`, ..., so a schema can
 * embed several patterns; the caller puts it beside its own rules.
 */
#include "grammar/regex.h"

#include "core/alloc.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

struct rx {
    const char *s, *p, *end;
    const char *prefix;
    char *out;
    size_t n, cap;
    int n_rules;
    struct weld_err *e;
    int rc;
    bool oom;
};

static void put(struct rx *r, const char *s, size_t n)
{
    if (r->oom)
        return;
    if (r->n + n + 1 > r->cap) {
        size_t cap = r->cap ? r->cap : 256;
        while (cap < r->n + n + 1)
            cap *= 2;
        char *p = wrealloc(r->out, cap);
        if (!p) {
            r->oom = true;
            return;
        }
        r->out = p, r->cap = cap;
    }
    memcpy(r->out + r->n, s, n);
    r->n += n;
    r->out[r->n] = 0;
}

static void putf(struct rx *r, const char *fmt, ...)
{
    char buf[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    put(r, buf, n < 0 ? 0 : (size_t)n < sizeof buf ? (size_t)n : sizeof buf - 1);
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

/* The class text (without brackets) of a class escape \d \w \s (upper case: negated, which
   the caller writes as [^...]). */
static const char *class_escape(char c)
{
    switch (c | 0x20) {
    case 'd': return "0-9";
    case 'w': return "a-zA-Z0-9_";
    case 's':
        return " \\t\\n\\r\\x0b\\x0c\\u00A0\\u1680\\u2000-\\u200A\\u2028\\u2029\\u202F\\u205F\\u3000\\uFEFF";
    default: return NULL;
    }
}

/* An escape after '\' (r->p past it) as a single code point, or -2 for a class escape
   (its letter in *cls), -1 on error. */
static int64_t escape(struct rx *r, char *cls)
{
    const char *at = r->p - 1;
    if (r->p >= r->end)
        return fail(r, at, "unfinished escape"), -1;
    char c = *r->p++;
    if (class_escape(c)) {
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

/* [class] at r->p (after '['): appended as a GBNF class. */
static int parse_class(struct rx *r)
{
    const char *at = r->p - 1;
    bool neg = r->p < r->end && *r->p == '^';
    if (neg)
        r->p++;
    /* negated class escapes inside a class ([\D]) cannot be written as one GBNF class */
    put(r, neg ? "[^" : "[", neg ? 2 : 1);
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
                if (cls >= 'A' && cls <= 'Z')
                    return fail(r, r->p - 2,
                                "a negated class escape inside [...] is not "
                                "supported");
                put(r, class_escape(cls), strlen(class_escape(cls)));
                continue;
            }
        } else if ((a = next_cp(r)) < 0) {
            return r->rc;
        }
        put_cp(r, (uint32_t)a);
        if (r->p + 1 < r->end && *r->p == '-' && r->p[1] != ']') {
            r->p++;
            int64_t b;
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
            put(r, "-", 1);
            put_cp(r, (uint32_t)b);
        }
    }
    if (r->p >= r->end)
        return fail(r, at, "unterminated [");
    r->p++;
    put(r, "]", 1);
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
            static const char dot[] = "[^\\n\\r\\u2028\\u2029]";
            put(r, dot, sizeof dot - 1);
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
            if (v == -2) {
                bool neg = cls >= 'A' && cls <= 'Z';
                putf(r, "[%s", neg ? "^" : "");
                put(r, class_escape(cls), strlen(class_escape(cls)));
                put(r, "]", 1);
            } else {
                put(r, "[", 1);
                put_cp(r, (uint32_t)v);
                put(r, "]", 1);
            }
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
        const size_t before = r->n;
        if (parse_seq(r, depth))
            return r->rc;
        if (r->n == before)
            put(r, " \"\"", 3); /* an empty alternative */
        if (r->p < r->end && *r->p == '|') {
            r->p++;
            put(r, " |", 2);
            continue;
        }
        return 0;
    }
}

int grammar_gbnf_from_regex(const char *re, size_t len, bool search, const char *rule, char **gbnf,
                            struct weld_err *e)
{
    *gbnf = NULL;
    struct rx r = {.s = re, .p = re, .end = re + len, .prefix = rule, .e = e};
    bool head = len && re[0] == '^';
    bool tail = len >= 1 && re[len - 1] == '$' && (len < 2 || re[len - 2] != '\\');
    if (head)
        r.p++;
    if (tail && r.end > r.p)
        r.end--;
    const char *any = ".*"; /* a search: any text around the match */
    putf(&r, "%s ::=", rule);
    if (search && !head)
        putf(&r, " %s", any);
    put(&r, " (", 2);
    if (!parse_alt(&r, 0) && r.p < r.end)
        fail(&r, r.p, "unmatched )");
    put(&r, " )", 2);
    if (search && !tail)
        putf(&r, " %s", any);
    put(&r, "\n", 1);
    if (!r.rc && r.oom)
        r.rc = err_set(e, WELD_ERR_NOMEM, "regex: out of memory");
    if (r.rc) {
        wfree(r.out);
        return r.rc;
    }
    *gbnf = r.out;
    return WELD_OK;
}

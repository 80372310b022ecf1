/*
 * gbnf - GBNF text to a byte-level grammar (grammar.h).
 *
 * A recursive-descent parser builds rules as growable lists of alternatives, each a
 * growable list of elements; groups, repetitions and classes get auxiliary rules named
 * after the rule they occur in. A code-point range becomes UTF-8 byte sequences by the
 * usual split (at the encoding-length boundaries, then wherever a continuation byte's
 * range would not be whole), surrogates excluded. Finishing checks every referenced rule
 * is defined, computes which rules derive the empty string and which derive any string at
 * all, rejects left recursion by a depth-first search of the "can start with" graph, and
 * flattens the lists into the arrays of struct grammar.
 *
 * Newlines end a rule outside parentheses, unless the next line starts with `|`.
 */
#include "grammar/grammar.h"

#include "core/alloc.h"

#include <stdio.h>
#include <string.h>

struct palt {
    struct gr_elem *el;
    int n, cap;
};

struct prule {
    char *name;
    bool defined;
    int line, col; /* where it was first named */
    struct palt *alts;
    int n, cap;
};

struct parser {
    const char *s, *end, *p;
    struct prule *rules;
    int n_rules, cap_rules;
    struct weld_err *e;
    int rc;
};

static void where(const struct parser *ps, const char *at, int *line, int *col)
{
    *line = 1, *col = 1;
    for (const char *q = ps->s; q < at && q < ps->end; q++)
        if (*q == '\n')
            ++*line, *col = 1;
        else
            ++*col;
}

static int fail(struct parser *ps, const char *at, const char *what)
{
    if (ps->rc)
        return ps->rc;
    int line, col;
    where(ps, at, &line, &col);
    ps->rc = err_set(ps->e, WELD_ERR_INVALID_ARG, "grammar: line %d, column %d: %s", line, col,
                     what);
    return ps->rc;
}

static int oom(struct parser *ps)
{
    if (!ps->rc)
        ps->rc = err_set(ps->e, WELD_ERR_NOMEM, "grammar: out of memory");
    return ps->rc;
}

static int rule_id(struct parser *ps, const char *name, size_t len, const char *at)
{
    for (int i = 0; i < ps->n_rules; i++)
        if (strlen(ps->rules[i].name) == len && !memcmp(ps->rules[i].name, name, len))
            return i;
    if (ps->n_rules == ps->cap_rules) {
        int cap = ps->cap_rules ? 2 * ps->cap_rules : 16;
        struct prule *r = wrealloc(ps->rules, (size_t)cap * sizeof *r);
        if (!r)
            return -1;
        ps->rules = r, ps->cap_rules = cap;
    }
    struct prule *r = &ps->rules[ps->n_rules];
    memset(r, 0, sizeof *r);
    if (!(r->name = wmalloc(len + 1)))
        return -1;
    memcpy(r->name, name, len);
    r->name[len] = 0;
    where(ps, at, &r->line, &r->col);
    return ps->n_rules++;
}

/* A fresh auxiliary rule named after rule `of`. */
static int aux_rule(struct parser *ps, int of, const char *at)
{
    char name[256];
    snprintf(name, sizeof name, "%.200s_%d", ps->rules[of].name, ps->n_rules);
    int id = rule_id(ps, name, strlen(name), at);
    if (id >= 0)
        ps->rules[id].defined = true;
    return id;
}

static struct palt *new_alt(struct parser *ps, int rule)
{
    struct prule *r = &ps->rules[rule];
    if (r->n == r->cap) {
        int cap = r->cap ? 2 * r->cap : 4;
        struct palt *a = wrealloc(r->alts, (size_t)cap * sizeof *a);
        if (!a)
            return NULL;
        r->alts = a, r->cap = cap;
    }
    struct palt *a = &r->alts[r->n++];
    memset(a, 0, sizeof *a);
    return a;
}

static bool push(struct palt *a, struct gr_elem x)
{
    if (a->n == a->cap) {
        int cap = a->cap ? 2 * a->cap : 8;
        struct gr_elem *el = wrealloc(a->el, (size_t)cap * sizeof *el);
        if (!el)
            return false;
        a->el = el, a->cap = cap;
    }
    a->el[a->n++] = x;
    return true;
}

static bool push_bytes(struct palt *a, uint8_t lo, uint8_t hi)
{
    return push(a, (struct gr_elem){.kind = GR_BYTES, .lo = lo, .hi = hi});
}

static bool push_rule(struct palt *a, int rule)
{
    return push(a, (struct gr_elem){.kind = GR_RULE, .rule = rule});
}

static int utf8_encode(uint32_t c, uint8_t *b)
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

/* The byte sequences of code points [lo, hi] as alternatives of rule `into`. */
static bool utf8_ranges(struct parser *ps, int into, uint32_t lo, uint32_t hi)
{
    if (lo > hi)
        return true;
    if (lo <= 0xDFFF && hi >= 0xD800) /* no surrogates */
        return (lo >= 0xD800 || utf8_ranges(ps, into, lo, 0xD7FF)) &&
               (hi <= 0xDFFF || utf8_ranges(ps, into, 0xE000, hi));
    static const uint32_t edge[] = {0x7F, 0x7FF, 0xFFFF};
    for (int i = 0; i < 3; i++)
        if (lo <= edge[i] && hi > edge[i])
            return utf8_ranges(ps, into, lo, edge[i]) && utf8_ranges(ps, into, edge[i] + 1, hi);
    if (hi >= 0x80)
        for (int i = 1; i < 4; i++) {
            uint32_t m = (1u << (6 * i)) - 1;
            if ((lo & ~m) != (hi & ~m)) {
                if (lo & m)
                    return utf8_ranges(ps, into, lo, lo | m) &&
                           utf8_ranges(ps, into, (lo | m) + 1, hi);
                if ((hi & m) != m)
                    return utf8_ranges(ps, into, lo, (hi & ~m) - 1) &&
                           utf8_ranges(ps, into, hi & ~m, hi);
            }
        }
    uint8_t a[4], b[4];
    int n = utf8_encode(lo, a);
    utf8_encode(hi, b);
    struct palt *alt = new_alt(ps, into);
    if (!alt)
        return false;
    for (int i = 0; i < n; i++)
        if (!push_bytes(alt, a[i], b[i]))
            return false;
    return push(alt, (struct gr_elem){.kind = GR_END});
}

static void skip_space(struct parser *ps, bool newlines)
{
    while (ps->p < ps->end) {
        char c = *ps->p;
        if (c == '#') {
            while (ps->p < ps->end && *ps->p != '\n')
                ps->p++;
        } else if (c == ' ' || c == '\t' || c == '\r' || (newlines && c == '\n')) {
            ps->p++;
        } else {
            break;
        }
    }
}

static bool is_name(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '_';
}

static int hexval(char c)
{
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

/* One code point of a literal or class at ps->p (escapes, UTF-8); -1: error set. */
static int64_t read_char(struct parser *ps)
{
    const char *at = ps->p;
    if (ps->p >= ps->end)
        return fail(ps, at, "unexpected end of text"), -1;
    uint8_t c = (uint8_t)*ps->p++;
    if (c == '\\') {
        if (ps->p >= ps->end)
            return fail(ps, at, "unfinished escape"), -1;
        char x = *ps->p++;
        int digits = x == 'x' ? 2 : x == 'u' ? 4 : x == 'U' ? 8 : 0;
        if (!digits) {
            switch (x) {
            case 'n': return '\n';
            case 'r': return '\r';
            case 't': return '\t';
            case '\\':
            case '"':
            case '[':
            case ']':
            case '-':
            case '^': return x;
            default:
                return fail(ps, at,
                            "unknown escape (known: \\n \\r \\t \\\\ \\\" \\[ \\] "
                            "\\- \\^ \\xHH \\uHHHH \\UHHHHHHHH)"),
                       -1;
            }
        }
        uint32_t v = 0;
        for (int i = 0; i < digits; i++) {
            int h = ps->p < ps->end ? hexval(*ps->p) : -1;
            if (h < 0)
                return fail(ps, at, "escape needs hexadecimal digits"), -1;
            v = v << 4 | (uint32_t)h, ps->p++;
        }
        if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF))
            return fail(ps, at, "escape is not a Unicode scalar value"), -1;
        return v;
    }
    if (c < 0x80)
        return c;
    int n = c >= 0xF0 && c < 0xF5 ? 3 : c >= 0xE0 ? 2 : c >= 0xC2 ? 1 : -1;
    if (n < 0 || c >= 0xF5)
        return fail(ps, at, "invalid UTF-8"), -1;
    uint32_t v = c & (0x3F >> n);
    for (int i = 0; i < n; i++) {
        if (ps->p >= ps->end || ((uint8_t)*ps->p & 0xC0) != 0x80)
            return fail(ps, at, "invalid UTF-8"), -1;
        v = v << 6 | ((uint8_t)*ps->p++ & 0x3F);
    }
    return v;
}

/* [class] or [^class] at ps->p (after '['): an element of alt, through an aux rule. */
static int parse_class(struct parser *ps, int rule, struct palt **alt, int ai)
{
    const char *at = ps->p - 1;
    bool neg = ps->p < ps->end && *ps->p == '^';
    if (neg)
        ps->p++;
    uint32_t lo[256], hi[256];
    int n = 0;
    while (ps->p < ps->end && *ps->p != ']') {
        int64_t a = read_char(ps);
        if (a < 0)
            return ps->rc;
        int64_t b = a;
        if (ps->p + 1 < ps->end && *ps->p == '-' && ps->p[1] != ']') {
            ps->p++;
            if ((b = read_char(ps)) < 0)
                return ps->rc;
            if (b < a)
                return fail(ps, at, "class range runs backwards");
        }
        if (n == 256)
            return fail(ps, at, "class of more than 256 ranges");
        lo[n] = (uint32_t)a, hi[n++] = (uint32_t)b;
    }
    if (ps->p >= ps->end)
        return fail(ps, at, "unterminated [class]");
    ps->p++;
    /* sort and merge, then complement when negated */
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && lo[j] < lo[j - 1]; j--) {
            uint32_t t = lo[j];
            lo[j] = lo[j - 1], lo[j - 1] = t, t = hi[j], hi[j] = hi[j - 1], hi[j - 1] = t;
        }
    int m = 0;
    for (int i = 0; i < n; i++)
        if (m && lo[i] <= hi[m - 1] + 1)
            hi[m - 1] = hi[i] > hi[m - 1] ? hi[i] : hi[m - 1];
        else
            lo[m] = lo[i], hi[m++] = hi[i];
    uint32_t clo[257], chi[257];
    int cn = 0;
    if (neg) {
        uint32_t next = 0;
        for (int i = 0; i < m; i++) {
            if (lo[i] > next)
                clo[cn] = next, chi[cn++] = lo[i] - 1;
            next = hi[i] + 1;
        }
        if (next <= 0x10FFFF)
            clo[cn] = next, chi[cn++] = 0x10FFFF;
    } else {
        memcpy(clo, lo, sizeof(uint32_t) * (size_t)m),
            memcpy(chi, hi, sizeof(uint32_t) * (size_t)m);
        cn = m;
    }
    if (cn == 1 && chi[0] < 0x80) { /* one ASCII range: one element */
        alt[0] = &ps->rules[rule].alts[ai];
        return push_bytes(alt[0], (uint8_t)clo[0], (uint8_t)chi[0]) ? 0 : oom(ps);
    }
    int aux = aux_rule(ps, rule, at);
    if (aux < 0)
        return oom(ps);
    for (int i = 0; i < cn; i++)
        if (!utf8_ranges(ps, aux, clo[i], chi[i]))
            return oom(ps);
    alt[0] = &ps->rules[rule].alts[ai];
    return push_rule(alt[0], aux) ? 0 : oom(ps);
}

static int parse_alternatives(struct parser *ps, int rule, bool nested);

/* Move elements [from, a->n) of alternative ai of rule into a new aux rule; return it. */
static int span_to_rule(struct parser *ps, int rule, int ai, int from, const char *at)
{
    int aux = aux_rule(ps, rule, at);
    if (aux < 0)
        return -1;
    struct palt *src = &ps->rules[rule].alts[ai];
    int n = src->n - from;
    struct gr_elem tmp[64], *buf = n <= 64 ? tmp : wmalloc(sizeof *buf * (size_t)n);
    if (!buf)
        return -1;
    if (n > 0)
        memcpy(buf, src->el + from, sizeof *buf * (size_t)n);
    src->n = from;
    struct palt *dst = new_alt(ps, aux);
    bool ok = dst != NULL;
    for (int i = 0; ok && i < n; i++)
        ok = push(&ps->rules[aux].alts[0], buf[i]);
    ok = ok && push(&ps->rules[aux].alts[0], (struct gr_elem){.kind = GR_END});
    if (buf != tmp)
        wfree(buf);
    return ok ? aux : -1;
}

/* x* as a rule: star ::= x star | "" (x: rule item). */
static int star_rule(struct parser *ps, int rule, int item, const char *at)
{
    int star = aux_rule(ps, rule, at);
    if (star < 0)
        return -1;
    struct palt *a = new_alt(ps, star);
    if (!a || !push_rule(a, item) || !push_rule(a, star) ||
        !push(a, (struct gr_elem){.kind = GR_END}))
        return -1;
    a = new_alt(ps, star);
    if (!a || !push(a, (struct gr_elem){.kind = GR_END}))
        return -1;
    return star;
}

/* Up to k more x as a rule: opt_k ::= x opt_{k-1} | "" (opt_0 absent). */
static int upto_rule(struct parser *ps, int rule, int item, int k, const char *at)
{
    int next = -1;
    for (int i = 0; i < k; i++) {
        int r = aux_rule(ps, rule, at);
        if (r < 0)
            return -1;
        struct palt *a = new_alt(ps, r);
        if (!a || !push_rule(a, item) || (next >= 0 && !push_rule(&ps->rules[r].alts[0], next)) ||
            !push(&ps->rules[r].alts[0], (struct gr_elem){.kind = GR_END}))
            return -1;
        a = new_alt(ps, r);
        if (!a || !push(a, (struct gr_elem){.kind = GR_END}))
            return -1;
        next = r;
    }
    return next;
}

/* A repetition {lo, hi} (hi -1: unbounded) of elements [from, end) of alternative ai. */
static int repeat(struct parser *ps, int rule, int ai, int from, int lo, int hi, const char *at)
{
    int item = span_to_rule(ps, rule, ai, from, at);
    if (item < 0)
        return oom(ps);
    for (int i = 0; i < lo; i++)
        if (!push_rule(&ps->rules[rule].alts[ai], item))
            return oom(ps);
    int tail = hi < 0 ? star_rule(ps, rule, item, at) : upto_rule(ps, rule, item, hi - lo, at);
    if (hi >= 0 && hi == lo)
        return 0;
    if (tail < 0)
        return oom(ps);
    return push_rule(&ps->rules[rule].alts[ai], tail) ? 0 : oom(ps);
}

static int read_count(struct parser *ps, int *v)
{
    const char *at = ps->p;
    long x = 0;
    int digits = 0;
    while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') {
        x = x * 10 + (*ps->p++ - '0'), digits++;
        if (x > GRAMMAR_MAX_REPEAT)
            return fail(ps, at, "repetition count above 1000");
    }
    if (!digits)
        return fail(ps, at, "expected a repetition count");
    *v = (int)x;
    return 0;
}

/* One sequence of rule's alternative ai, up to '|', ')' or the end of the rule. */
static int parse_sequence(struct parser *ps, int rule, int ai, bool nested)
{
    for (;;) {
        skip_space(ps, nested);
        if (ps->p >= ps->end || *ps->p == '|' || *ps->p == ')' || *ps->p == '\n')
            return 0;
        const char *at = ps->p;
        int from = ps->rules[rule].alts[ai].n;
        char c = *ps->p;
        if (c == '"') {
            ps->p++;
            while (ps->p < ps->end && *ps->p != '"') {
                int64_t v = read_char(ps);
                if (v < 0)
                    return ps->rc;
                uint8_t b[4];
                int n = utf8_encode((uint32_t)v, b);
                for (int i = 0; i < n; i++)
                    if (!push_bytes(&ps->rules[rule].alts[ai], b[i], b[i]))
                        return oom(ps);
            }
            if (ps->p >= ps->end)
                return fail(ps, at, "unterminated \"literal\"");
            ps->p++;
        } else if (c == '[') {
            ps->p++;
            struct palt *dummy;
            if (parse_class(ps, rule, &dummy, ai))
                return ps->rc;
        } else if (c == '.') {
            ps->p++;
            int aux = aux_rule(ps, rule, at);
            if (aux < 0 || !utf8_ranges(ps, aux, 0, 0x10FFFF) ||
                !push_rule(&ps->rules[rule].alts[ai], aux))
                return oom(ps);
        } else if (c == '(') {
            ps->p++;
            int aux = aux_rule(ps, rule, at);
            if (aux < 0)
                return oom(ps);
            if (parse_alternatives(ps, aux, true))
                return ps->rc;
            skip_space(ps, true);
            if (ps->p >= ps->end || *ps->p != ')')
                return fail(ps, at, "unclosed (");
            ps->p++;
            if (!push_rule(&ps->rules[rule].alts[ai], aux))
                return oom(ps);
        } else if (is_name(c)) {
            const char *n0 = ps->p;
            while (ps->p < ps->end && is_name(*ps->p))
                ps->p++;
            const char *q = ps->p;
            while (q < ps->end && (*q == ' ' || *q == '\t'))
                q++;
            if (q + 2 < ps->end && q[0] == ':' && q[1] == ':' && q[2] == '=') {
                ps->p = n0; /* the next rule starts here */
                return 0;
            }
            int r = rule_id(ps, n0, (size_t)(ps->p - n0), n0);
            if (r < 0 || !push_rule(&ps->rules[rule].alts[ai], r))
                return oom(ps);
        } else {
            return fail(ps, at, "expected a literal, [class], rule name, ( or .");
        }
        /* a repetition of what was just read */
        skip_space(ps, nested);
        if (ps->p >= ps->end)
            continue;
        int lo = -1, hi = -1;
        const char *rat = ps->p;
        if (*ps->p == '*')
            lo = 0, ps->p++;
        else if (*ps->p == '+')
            lo = 1, ps->p++;
        else if (*ps->p == '?')
            lo = 0, hi = 1, ps->p++;
        else if (*ps->p == '{') {
            ps->p++;
            skip_space(ps, false);
            if (read_count(ps, &lo))
                return ps->rc;
            skip_space(ps, false);
            hi = lo;
            if (ps->p < ps->end && *ps->p == ',') {
                ps->p++;
                skip_space(ps, false);
                hi = -1;
                if (ps->p < ps->end && *ps->p != '}' && read_count(ps, &hi))
                    return ps->rc;
                skip_space(ps, false);
            }
            if (ps->p >= ps->end || *ps->p != '}')
                return fail(ps, rat, "expected } after the repetition count");
            ps->p++;
            if (hi >= 0 && hi < lo)
                return fail(ps, rat, "repetition {m,n} with n below m");
        }
        if (lo >= 0 && repeat(ps, rule, ai, from, lo, hi, rat))
            return ps->rc;
    }
}

static int parse_alternatives(struct parser *ps, int rule, bool nested)
{
    for (;;) {
        int ai = ps->rules[rule].n;
        if (!new_alt(ps, rule))
            return oom(ps);
        if (parse_sequence(ps, rule, ai, nested))
            return ps->rc;
        if (!push(&ps->rules[rule].alts[ai], (struct gr_elem){.kind = GR_END}))
            return oom(ps);
        skip_space(ps, nested);
        if (!nested && ps->p < ps->end && *ps->p == '\n') { /* continued by a leading '|'? */
            const char *q = ps->p;
            while (q < ps->end && (*q == ' ' || *q == '\t' || *q == '\r' || *q == '\n'))
                q++;
            if (q < ps->end && *q == '|')
                ps->p = q;
        }
        if (ps->p < ps->end && *ps->p == '|') {
            ps->p++;
            skip_space(ps, true);
            continue;
        }
        return 0;
    }
}

static int parse_rules(struct parser *ps)
{
    for (;;) {
        skip_space(ps, true);
        if (ps->p >= ps->end)
            return 0;
        const char *at = ps->p;
        while (ps->p < ps->end && is_name(*ps->p))
            ps->p++;
        if (ps->p == at)
            return fail(ps, at, "expected a rule name");
        int r = rule_id(ps, at, (size_t)(ps->p - at), at);
        if (r < 0)
            return oom(ps);
        if (ps->rules[r].defined)
            return fail(ps, at, "rule defined twice");
        ps->rules[r].defined = true;
        where(ps, at, &ps->rules[r].line, &ps->rules[r].col);
        skip_space(ps, false);
        if (ps->end - ps->p < 3 || memcmp(ps->p, "::=", 3))
            return fail(ps, ps->p, "expected ::= after the rule name");
        ps->p += 3;
        skip_space(ps, true);
        if (parse_alternatives(ps, r, false))
            return ps->rc;
        skip_space(ps, false);
        if (ps->p < ps->end && *ps->p == ')')
            return fail(ps, ps->p, "unmatched )");
    }
}

/* Analyses and flattening. */

static bool nullable_alt(const struct prule *rules, const bool *nul, const struct palt *a)
{
    for (int i = 0; i < a->n; i++) {
        const struct gr_elem *x = &a->el[i];
        if (x->kind == GR_END)
            return true;
        if (x->kind == GR_BYTES || !nul[x->rule])
            return false;
    }
    return true;
}

static bool productive_alt(const bool *prod, const struct palt *a)
{
    for (int i = 0; i < a->n; i++)
        if (a->el[i].kind == GR_RULE && !prod[a->el[i].rule])
            return false;
    return true;
}

/* Depth-first search for a left-recursive cycle from rule r; state 1: on the path. */
static int left_cycle(const struct parser *ps, const bool *nul, uint8_t *state, int r)
{
    if (state[r] == 1)
        return r;
    if (state[r] == 2)
        return -1;
    state[r] = 1;
    const struct prule *R = &ps->rules[r];
    for (int a = 0; a < R->n; a++)
        for (int i = 0; i < R->alts[a].n; i++) {
            const struct gr_elem *x = &R->alts[a].el[i];
            if (x->kind != GR_RULE)
                break;
            int c = left_cycle(ps, nul, state, x->rule);
            if (c >= 0)
                return c;
            if (!nul[x->rule])
                break;
        }
    state[r] = 2;
    return -1;
}

static int finish(struct parser *ps, const char *root, struct grammar **out)
{
    const int n = ps->n_rules;
    for (int i = 0; i < n; i++)
        if (!ps->rules[i].defined) {
            int line = ps->rules[i].line, col = ps->rules[i].col;
            return ps->rc = err_set(ps->e, WELD_ERR_INVALID_ARG,
                                    "grammar: line %d, column %d: rule '%s' is used but not "
                                    "defined",
                                    line, col, ps->rules[i].name);
        }
    int rootid = -1;
    for (int i = 0; i < n; i++)
        if (!strcmp(ps->rules[i].name, root))
            rootid = i;
    if (rootid < 0)
        return ps->rc = err_set(ps->e, WELD_ERR_INVALID_ARG, "grammar: no rule '%s' to start from",
                                root);
    bool *nul = wcalloc((size_t)n + 1, sizeof *nul), *prod = wcalloc((size_t)n + 1, sizeof *prod);
    uint8_t *state = wcalloc((size_t)n + 1, 1);
    if (!nul || !prod || !state) {
        wfree(nul), wfree(prod), wfree(state);
        return oom(ps);
    }
    for (bool changed = true; changed;) {
        changed = false;
        for (int i = 0; i < n; i++)
            for (int a = 0; a < ps->rules[i].n; a++) {
                if (!nul[i] && nullable_alt(ps->rules, nul, &ps->rules[i].alts[a]))
                    nul[i] = changed = true;
                if (!prod[i] && productive_alt(prod, &ps->rules[i].alts[a]))
                    prod[i] = changed = true;
            }
    }
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) {
        int c = left_cycle(ps, nul, state, i);
        if (c >= 0)
            rc = err_set(ps->e, WELD_ERR_INVALID_ARG,
                         "grammar: line %d, column %d: rule '%s' is left-recursive (it can "
                         "reach itself before reading a character): rewrite it with repetition",
                         ps->rules[c].line, ps->rules[c].col, ps->rules[c].name);
    }
    if (!rc && !prod[rootid])
        rc = err_set(ps->e, WELD_ERR_INVALID_ARG, "grammar: no string satisfies rule '%s'", root);
    wfree(nul), wfree(prod), wfree(state);
    if (rc)
        return ps->rc = rc;
    struct grammar *g = wcalloc(1, sizeof *g);
    if (!g)
        return oom(ps);
    int n_alt = 0, n_el = 0;
    for (int i = 0; i < n; i++) {
        n_alt += ps->rules[i].n;
        for (int a = 0; a < ps->rules[i].n; a++)
            n_el += ps->rules[i].alts[a].n;
    }
    g->el = wmalloc(sizeof *g->el * ((size_t)n_el + 1));
    g->alt = wmalloc(sizeof *g->alt * ((size_t)n_alt + 1));
    g->rule_alt0 = wmalloc(sizeof *g->rule_alt0 * (size_t)n);
    g->rule_n_alt = wmalloc(sizeof *g->rule_n_alt * (size_t)n);
    g->names = wcalloc((size_t)n, sizeof *g->names);
    if (!g->el || !g->alt || !g->rule_alt0 || !g->rule_n_alt || !g->names) {
        grammar_free(g);
        return oom(ps);
    }
    g->n_rules = n, g->root = rootid;
    for (int i = 0; i < n; i++) {
        g->rule_alt0[i] = g->n_alt, g->rule_n_alt[i] = ps->rules[i].n;
        g->names[i] = ps->rules[i].name, ps->rules[i].name = NULL;
        for (int a = 0; a < ps->rules[i].n; a++) {
            g->alt[g->n_alt++] = g->n_el;
            memcpy(g->el + g->n_el, ps->rules[i].alts[a].el,
                   sizeof *g->el * (size_t)ps->rules[i].alts[a].n);
            g->n_el += ps->rules[i].alts[a].n;
        }
    }
    *out = g;
    return 0;
}

int grammar_parse_gbnf(struct grammar **out, const char *text, size_t len, const char *root,
                       struct weld_err *e)
{
    *out = NULL;
    struct parser ps = {.s = text, .end = text + len, .p = text, .e = e};
    if (!parse_rules(&ps))
        finish(&ps, root ? root : "root", out);
    for (int i = 0; i < ps.n_rules; i++) {
        for (int a = 0; a < ps.rules[i].n; a++)
            wfree(ps.rules[i].alts[a].el);
        wfree(ps.rules[i].alts);
        wfree(ps.rules[i].name);
    }
    wfree(ps.rules);
    return ps.rc;
}

void grammar_free(struct grammar *g)
{
    if (!g)
        return;
    for (int i = 0; g->names && i < g->n_rules; i++)
        wfree(g->names[i]);
    wfree(g->names);
    wfree(g->el);
    wfree(g->alt);
    wfree(g->rule_alt0);
    wfree(g->rule_n_alt);
    wfree(g);
}

/*
 * tok_norm - normalizers and pre-tokenizers, as Hugging Face `tokenizers` defines them.
 *
 * Normalizers rewrite one piece of text: NFC/NFD/NFKC/NFKD (utf8proc), Prepend (only when
 * the piece is not empty), Replace (a literal string or a PCRE2 regex, every
 * non-overlapping match left to right), Lowercase (per code point), Strip (whitespace).
 * Offsets are not tracked: weld only needs ids.
 *
 * Pre-tokenizers turn a piece into a list of words. The list is a set of spans into a byte
 * buffer; each stage reads one (buffer, spans) pair and writes the next, ping-ponging
 * between two, and empty words are dropped after every stage, as HF does. Regexes use
 * PCRE2 with UTF and UCP (Unicode \s, \p{L}, case folding), JIT-compiled when the library
 * has JIT; empty regex matches are ignored. A match that exceeds PCRE2's limits fails the
 * encode with WELD_ERR_LIMIT (see tok_regex.c), never a partial split.
 */
#include "tokenizer/tok_internal.h"

#include "core/alloc.h"
#include "core/utf8.h"

#include <string.h>
#include <utf8proc.h>

/* Non-empty matches of re in s[0..n): appends (start, end) pairs to m. */
static int regex_matches(const pcre2_code *re, const char *s, size_t n, struct tok_spans *m)
{
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
    if (!md)
        return WELD_ERR_NOMEM;
    int rc = WELD_OK;
    size_t pos = 0;
    while (pos <= n) {
        int r = tok_regex_match(re, s, n, pos, md);
        if (r < 0) {
            if (r != PCRE2_ERROR_NOMATCH)
                rc = tok_regex_status(r); /* the match limit: WELD_ERR_LIMIT */
            break;
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t ms = ov[0], me = ov[1];
        if (me > ms) {
            if (tok_spans_push(m, ms, me - ms)) {
                rc = WELD_ERR_NOMEM;
                break;
            }
            pos = me;
        } else {
            /* empty match: step over one character */
            uint32_t cp;
            int w = ms < n ? tok_utf8_next(s, n, ms, &cp) : 1;
            pos = ms + (size_t)(w > 0 ? w : 1);
        }
    }
    pcre2_match_data_free(md);
    return rc;
}

static int put_cp(struct tok_buf *b, uint32_t cp)
{
    char u[4];
    return tok_buf_put(b, u, utf8_put(cp, u));
}

static int norm_unicode(enum tok_norm_kind k, const char *s, size_t n, struct tok_buf *out)
{
    int opt = UTF8PROC_STABLE;
    if (k == TOK_NORM_NFC || k == TOK_NORM_NFKC)
        opt |= UTF8PROC_COMPOSE;
    else
        opt |= UTF8PROC_DECOMPOSE;
    if (k == TOK_NORM_NFKC || k == TOK_NORM_NFKD)
        opt |= UTF8PROC_COMPAT;
    if (n == 0)
        return WELD_OK;
    utf8proc_uint8_t *dst = NULL;
    utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &dst,
                                      (utf8proc_option_t)opt);
    if (r < 0)
        return r == UTF8PROC_ERROR_NOMEM ? WELD_ERR_NOMEM : WELD_ERR_INVALID_ARG;
    int rc = tok_buf_put(out, dst, (size_t)r);
    free(dst); /* allocated by utf8proc with malloc */
    return rc;
}

static int norm_replace(const struct tok_norm *nm, const char *s, size_t n, struct tok_buf *out)
{
    struct tok_spans m = {0};
    int rc = WELD_OK;
    if (nm->re) {
        rc = regex_matches(nm->re, s, n, &m);
    } else if (nm->alen) {
        for (size_t i = 0; rc == WELD_OK && i + nm->alen <= n;) {
            if (memcmp(s + i, nm->a, nm->alen) == 0) {
                rc = tok_spans_push(&m, i, nm->alen);
                i += nm->alen;
            } else {
                i++;
            }
        }
    }
    size_t pos = 0;
    for (size_t i = 0; rc == WELD_OK && i < m.n; i++) {
        rc = tok_buf_put(out, s + pos, m.v[i].off - pos);
        if (rc == WELD_OK)
            rc = tok_buf_put(out, nm->b, nm->blen);
        pos = m.v[i].off + m.v[i].len;
    }
    if (rc == WELD_OK)
        rc = tok_buf_put(out, s + pos, n - pos);
    wfree(m.v);
    return rc;
}

static bool is_ws(uint32_t cp)
{
    if (cp == ' ' || (cp >= 9 && cp <= 13) || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
        (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
        cp == 0x205F || cp == 0x3000)
        return true;
    return false;
}

static int norm_one(const struct tok_norm *nm, const char *s, size_t n, struct tok_buf *out)
{
    switch (nm->kind) {
    case TOK_NORM_NFC:
    case TOK_NORM_NFD:
    case TOK_NORM_NFKC:
    case TOK_NORM_NFKD:
        return norm_unicode(nm->kind, s, n, out);
    case TOK_NORM_PREPEND:
        if (n && tok_buf_put(out, nm->a, nm->alen))
            return WELD_ERR_NOMEM;
        return tok_buf_put(out, s, n);
    case TOK_NORM_REPLACE:
        return norm_replace(nm, s, n, out);
    case TOK_NORM_LOWERCASE:
        for (size_t i = 0; i < n;) {
            uint32_t cp;
            int w = tok_utf8_next(s, n, i, &cp);
            if (w <= 0)
                return WELD_ERR_INVALID_ARG;
            if (put_cp(out, (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp)))
                return WELD_ERR_NOMEM;
            i += (size_t)w;
        }
        return WELD_OK;
    case TOK_NORM_STRIP: {
        size_t a = 0, b = n;
        uint32_t cp;
        int w;
        while (nm->left && a < b && (w = tok_utf8_next(s, n, a, &cp)) > 0 && is_ws(cp))
            a += (size_t)w;
        while (nm->right && b > a) {
            size_t p = b - 1;
            while (p > a && ((uint8_t)s[p] & 0xC0) == 0x80)
                p--;
            if (tok_utf8_next(s, n, p, &cp) <= 0 || !is_ws(cp))
                break;
            b = p;
        }
        return tok_buf_put(out, s + a, b - a);
    }
    }
    return WELD_ERR_INTERNAL;
}

int tok_normalize(const struct tokenizer *t, const char *s, size_t n, struct tok_buf *out)
{
    struct tok_buf tmp[2] = {{0}, {0}};
    const char *cur = s;
    size_t cn = n;
    int rc = WELD_OK;
    for (int i = 0; rc == WELD_OK && i < t->n_norms; i++) {
        struct tok_buf *dst = &tmp[i & 1];
        dst->n = 0;
        rc = tok_buf_put(dst, "", 0);
        if (rc == WELD_OK)
            rc = norm_one(&t->norms[i], cur, cn, dst);
        cur = dst->p;
        cn = dst->n;
    }
    if (rc == WELD_OK)
        rc = tok_buf_put(out, cur, cn);
    wfree(tmp[0].p);
    wfree(tmp[1].p);
    return rc;
}

/* ---- pre-tokenizers ---- */

/* Split word w by the non-empty, ordered, disjoint matches m (offsets relative to w),
   following SplitDelimiterBehavior; the doc example for "the-final--countdown" split on '-':
   Removed [the, final, countdown]; Isolated [the, -, final, -, -, countdown];
   MergedWithPrevious [the-, final-, -, countdown]; MergedWithNext [the, -final, -,
   -countdown]; Contiguous [the, -, final, --, countdown]. */
static int split_apply(const char *w, size_t n, const struct tok_spans *m,
                       enum tok_split_behavior beh, bool invert, struct tok_buf *dst,
                       struct tok_spans *out)
{
    size_t pos = 0, base = dst->n;
    bool have_last = false, last_match = false;
    int rc = tok_buf_put(dst, w, n); /* pieces are contiguous runs of this copy */
    for (size_t i = 0; rc == WELD_OK && i <= m->n; i++) {
        size_t ms = i < m->n ? m->v[i].off : n, ml = i < m->n ? m->v[i].len : 0;
        for (int part = 0; rc == WELD_OK && part < 2; part++) {
            size_t st = part == 0 ? pos : ms, ln = part == 0 ? ms - pos : ml;
            if (ln == 0)
                continue;
            bool is_match = (part == 1) != invert, extend = false;
            if (beh == TOK_SPLIT_REMOVED && is_match)
                continue;
            if (beh == TOK_SPLIT_MERGED_PREV)
                extend = is_match && have_last && !last_match;
            else if (beh == TOK_SPLIT_MERGED_NEXT)
                extend = !is_match && have_last && last_match;
            else if (beh == TOK_SPLIT_CONTIGUOUS)
                extend = is_match && have_last && last_match;
            if (extend)
                out->v[out->n - 1].len += ln;
            else
                rc = tok_spans_push(out, base + st, ln);
            have_last = true;
            last_match = is_match;
        }
        pos = ms + ml;
    }
    return rc;
}

static bool is_numeric(uint32_t cp)
{
    utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
    return c == UTF8PROC_CATEGORY_ND || c == UTF8PROC_CATEGORY_NL || c == UTF8PROC_CATEGORY_NO;
}

/* Matches for Digits: each numeric character (individual) or each run of them. */
static int digit_matches(const char *s, size_t n, bool individual, struct tok_spans *m)
{
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int w = tok_utf8_next(s, n, i, &cp);
        if (w <= 0)
            return WELD_ERR_INVALID_ARG;
        if (is_numeric(cp)) {
            if (!individual && m->n && m->v[m->n - 1].off + m->v[m->n - 1].len == i)
                m->v[m->n - 1].len += (size_t)w;
            else if (tok_spans_push(m, i, (size_t)w))
                return WELD_ERR_NOMEM;
        }
        i += (size_t)w;
    }
    return WELD_OK;
}

/* ByteLevel: optional prefix space, optional GPT-2 regex split, then bytes -> alphabet. */
static int pre_bytelevel(const struct tok_pre *p, const char *w, size_t n, struct tok_buf *dst,
                         struct tok_spans *out, struct tok_buf *tmp, struct tok_spans *m)
{
    tmp->n = 0;
    m->n = 0;
    if (p->add_prefix_space && (n == 0 || w[0] != ' ') && tok_buf_putc(tmp, ' '))
        return WELD_ERR_NOMEM;
    if (tok_buf_put(tmp, w, n))
        return WELD_ERR_NOMEM;
    if (p->re) {
        int rc = regex_matches(p->re, tmp->p, tmp->n, m);
        if (rc)
            return rc;
    } else if (tok_spans_push(m, 0, tmp->n)) {
        return WELD_ERR_NOMEM;
    }
    for (size_t i = 0; i < m->n; i++) {
        size_t off = dst->n;
        for (size_t k = 0; k < m->v[i].len; k++)
            if (put_cp(dst, tok_byte_to_cp[(uint8_t)tmp->p[m->v[i].off + k]]))
                return WELD_ERR_NOMEM;
        if (dst->n > off && tok_spans_push(out, off, dst->n - off))
            return WELD_ERR_NOMEM;
    }
    return WELD_OK;
}

/* Metaspace: spaces -> replacement, prepend per scheme, optional split before each
   replacement (MergedWithNext). */
static int pre_metaspace(const struct tok_pre *p, const char *w, size_t n, bool first,
                         struct tok_buf *dst, struct tok_spans *out, struct tok_buf *tmp,
                         struct tok_spans *m)
{
    tmp->n = 0;
    m->n = 0;
    bool pre = p->prepend == TOK_PREPEND_ALWAYS || (p->prepend == TOK_PREPEND_FIRST && first);
    if (pre && !(n >= p->repl_len && memcmp(w, p->repl, p->repl_len) == 0) &&
        tok_buf_put(tmp, p->repl, p->repl_len))
        return WELD_ERR_NOMEM;
    for (size_t i = 0; i < n; i++) {
        int rc = w[i] == ' ' ? tok_buf_put(tmp, p->repl, p->repl_len) : tok_buf_putc(tmp, w[i]);
        if (rc)
            return rc;
    }
    if (!p->split) {
        size_t off = dst->n;
        if (tok_buf_put(dst, tmp->p, tmp->n))
            return WELD_ERR_NOMEM;
        return tmp->n ? tok_spans_push(out, off, tmp->n) : WELD_OK;
    }
    for (size_t i = 0; i + p->repl_len <= tmp->n;) {
        if (memcmp(tmp->p + i, p->repl, p->repl_len) == 0) {
            if (tok_spans_push(m, i, p->repl_len))
                return WELD_ERR_NOMEM;
            i += p->repl_len;
        } else {
            i++;
        }
    }
    return split_apply(tmp->p, tmp->n, m, TOK_SPLIT_MERGED_NEXT, false, dst, out);
}

static int pre_one(const struct tok_pre *p, const char *w, size_t n, bool first,
                   struct tok_buf *dst, struct tok_spans *out, struct tok_buf *tmp,
                   struct tok_spans *m)
{
    m->n = 0;
    int rc;
    switch (p->kind) {
    case TOK_PRE_SPLIT:
        rc = regex_matches(p->re, w, n, m);
        return rc ? rc : split_apply(w, n, m, p->behavior, p->invert, dst, out);
    case TOK_PRE_DIGITS:
        rc = digit_matches(w, n, p->individual, m);
        return rc ? rc
                  : split_apply(w, n, m,
                                p->individual ? TOK_SPLIT_ISOLATED : TOK_SPLIT_CONTIGUOUS,
                                false, dst, out);
    case TOK_PRE_BYTELEVEL:
        return pre_bytelevel(p, w, n, dst, out, tmp, m);
    case TOK_PRE_METASPACE:
        return pre_metaspace(p, w, n, first, dst, out, tmp, m);
    }
    return WELD_ERR_INTERNAL;
}

int tok_pretokenize(const struct tokenizer *t, const char *s, size_t n, bool first,
                    struct tok_buf *text_out, struct tok_spans *words)
{
    if (t->n_pres == 0) {
        size_t off = text_out->n;
        if (tok_buf_put(text_out, s, n))
            return WELD_ERR_NOMEM;
        return n ? tok_spans_push(words, off, n) : WELD_OK;
    }
    struct tok_buf buf[2] = {{0}, {0}}, tmp = {0};
    struct tok_spans sp[2] = {{0}, {0}}, m = {0};
    int rc = tok_buf_put(&buf[0], s, n);
    if (rc == WELD_OK && n)
        rc = tok_spans_push(&sp[0], 0, n);
    int cur = 0;
    for (int k = 0; rc == WELD_OK && k < t->n_pres; k++) {
        int nx = cur ^ 1;
        buf[nx].n = 0;
        sp[nx].n = 0;
        for (size_t i = 0; rc == WELD_OK && i < sp[cur].n; i++)
            rc = pre_one(&t->pres[k], buf[cur].p + sp[cur].v[i].off, sp[cur].v[i].len,
                         first && i == 0, &buf[nx], &sp[nx], &tmp, &m);
        cur = nx;
    }
    for (size_t i = 0; rc == WELD_OK && i < sp[cur].n; i++) {
        size_t off = text_out->n;
        rc = tok_buf_put(text_out, buf[cur].p + sp[cur].v[i].off, sp[cur].v[i].len);
        if (rc == WELD_OK)
            rc = tok_spans_push(words, off, sp[cur].v[i].len);
    }
    wfree(buf[0].p);
    wfree(buf[1].p);
    wfree(tmp.p);
    wfree(sp[0].v);
    wfree(sp[1].v);
    wfree(m.v);
    return rc;
}

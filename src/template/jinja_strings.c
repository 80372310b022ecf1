/*
 * jinja_strings - Python str semantics over UTF-8 bytes, shared by filters and methods.
 *
 * Strings are UTF-8; indexing and lengths count code points as Python does. Invalid bytes
 * are treated as one code point each and copied through unchanged. Case mapping uses
 * utf8proc's simple one-to-one mappings (so 'ß'.upper() stays 'ß', where Python gives
 * 'SS'); whitespace is Python's str.isspace() set (ASCII controls 9-13 and 28-31, space,
 * U+0085, U+00A0 and Unicode Zs/Zl/Zp).
 */
#include "template/jinja_strings.h"

#include <string.h>
#include <utf8proc.h>

size_t jstr_next(struct jinja_str s, size_t i, int32_t *cp)
{
    utf8proc_int32_t c = -1;
    utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s.s + i,
                                          (utf8proc_ssize_t)(s.n - i), &c);
    if (k <= 0) {
        *cp = -1 - (int32_t)(unsigned char)s.s[i]; /* invalid byte: distinct negative */
        return i + 1;
    }
    *cp = c;
    return i + (size_t)k;
}

bool jstr_is_space(int32_t cp)
{
    if (cp < 0)
        return false;
    if ((cp >= 9 && cp <= 13) || (cp >= 28 && cp <= 32) || cp == 0x85 || cp == 0xA0)
        return true;
    if (cp < 0x80)
        return false;
    utf8proc_category_t cat = utf8proc_category(cp);
    return cat == UTF8PROC_CATEGORY_ZS || cat == UTF8PROC_CATEGORY_ZL ||
           cat == UTF8PROC_CATEGORY_ZP;
}

static bool is_cased(int32_t cp)
{
    if (cp < 0)
        return false;
    utf8proc_category_t cat = utf8proc_category(cp);
    return cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL ||
           cat == UTF8PROC_CATEGORY_LT;
}

static void put_cp(struct jinja_ctx *c, struct jinja_buf *b, int32_t cp, struct jinja_str src,
                   size_t at)
{
    if (cp < 0) {
        jbuf_put(c, b, src.s + at, 1);
        return;
    }
    utf8proc_uint8_t tmp[4];
    utf8proc_ssize_t k = utf8proc_encode_char(cp, tmp);
    jbuf_put(c, b, (const char *)tmp, (size_t)k);
}

static int32_t map_case(int32_t cp, int mode)
{
    if (cp < 0)
        return cp;
    switch (mode) {
    case JSTR_UPPER: return utf8proc_toupper(cp);
    case JSTR_LOWER: return utf8proc_tolower(cp);
    default: return utf8proc_totitle(cp);
    }
}

struct jinja_str jstr_case(struct jinja_ctx *c, struct jinja_str s, enum jstr_case mode)
{
    struct jinja_buf b = {0};
    bool prev_cased = false, first = true;
    for (size_t i = 0; i < s.n;) {
        int32_t cp;
        size_t nx = jstr_next(s, i, &cp);
        int32_t out = cp;
        switch (mode) {
        case JSTR_UPPER:
        case JSTR_LOWER: out = map_case(cp, mode); break;
        case JSTR_TITLE: /* str.title(): upper after an uncased char, else lower */
            out = prev_cased ? map_case(cp, JSTR_LOWER) : map_case(cp, JSTR_TITLE);
            prev_cased = is_cased(cp);
            break;
        case JSTR_CAPITALIZE:
            out = first ? map_case(cp, JSTR_TITLE) : map_case(cp, JSTR_LOWER);
            break;
        }
        first = false;
        put_cp(c, &b, out, s, i);
        i = nx;
    }
    return (struct jinja_str){b.p ? b.p : "", b.n};
}

static bool in_chars(int32_t cp, const struct jinja_str *chars)
{
    if (!chars)
        return jstr_is_space(cp);
    for (size_t i = 0; i < chars->n;) {
        int32_t x;
        i = jstr_next(*chars, i, &x);
        if (x == cp)
            return true;
    }
    return false;
}

struct jinja_str jstr_strip(struct jinja_str s, const struct jinja_str *chars, bool left,
                            bool right)
{
    size_t a = 0, b = s.n;
    if (left) {
        while (a < b) {
            int32_t cp;
            size_t nx = jstr_next(s, a, &cp);
            if (!in_chars(cp, chars))
                break;
            a = nx;
        }
    }
    if (right) {
        while (b > a) {
            size_t p = b - 1;
            while (p > a && ((unsigned char)s.s[p] & 0xC0) == 0x80)
                p--;
            int32_t cp;
            size_t nx = jstr_next(s, p, &cp);
            if (nx != b) /* not a whole code point ending at b: treat the byte alone */
                p = b - 1, cp = -1 - (int32_t)(unsigned char)s.s[p];
            if (!in_chars(cp, chars))
                break;
            b = p;
        }
    }
    return (struct jinja_str){s.s + a, b - a};
}

struct jinja_value *jstr_split(struct jinja_ctx *c, struct jinja_str s,
                               const struct jinja_str *sep, int64_t maxsplit)
{
    struct jinja_value *out = jv_list(c, JV_LIST, 0);
    jinja_charge(c, s.n / 16);
    if (sep && sep->n == 0)
        jinja_fail_at(c, WELD_ERR_FORMAT, "split: empty separator");
    size_t i = 0;
    int64_t splits = 0;
    if (sep) {
        for (;;) {
            const char *hit = maxsplit >= 0 && splits >= maxsplit
                                  ? NULL
                                  : memmem(s.s + i, s.n - i, sep->s, sep->n);
            if (!hit) {
                jv_list_push(c, out, jv_str(c, s.s + i, s.n - i));
                return out;
            }
            size_t at = (size_t)(hit - s.s);
            jv_list_push(c, out, jv_str(c, s.s + i, at - i));
            i = at + sep->n;
            splits++;
        }
    }
    for (;;) { /* whitespace split: runs of whitespace, no empty strings */
        struct jinja_str rest = jstr_strip((struct jinja_str){s.s + i, s.n - i}, NULL, true,
                                           false);
        i = (size_t)(rest.s - s.s);
        if (i >= s.n)
            return out;
        if (maxsplit >= 0 && splits >= maxsplit) {
            struct jinja_str last = jstr_strip(rest, NULL, false, true);
            jv_list_push(c, out, jv_str(c, last.s, last.n));
            return out;
        }
        size_t j = i;
        while (j < s.n) {
            int32_t cp;
            size_t nx = jstr_next(s, j, &cp);
            if (jstr_is_space(cp))
                break;
            j = nx;
        }
        jv_list_push(c, out, jv_str(c, s.s + i, j - i));
        splits++;
        i = j;
    }
}

struct jinja_str jstr_replace(struct jinja_ctx *c, struct jinja_str s, struct jinja_str old,
                              struct jinja_str rep, int64_t count)
{
    struct jinja_buf b = {0};
    size_t i = 0;
    int64_t done = 0;
    jinja_charge(c, s.n / 16);
    if (old.n == 0) { /* Python inserts rep between every code point */
        while (count < 0 || done < count) {
            jbuf_put(c, &b, rep.s, rep.n);
            done++;
            if (i >= s.n)
                break;
            int32_t cp;
            size_t nx = jstr_next(s, i, &cp);
            jbuf_put(c, &b, s.s + i, nx - i);
            i = nx;
        }
        jbuf_put(c, &b, s.s + i, s.n - i);
        return (struct jinja_str){b.p ? b.p : "", b.n};
    }
    while (count < 0 || done < count) {
        const char *hit = memmem(s.s + i, s.n - i, old.s, old.n);
        if (!hit)
            break;
        size_t at = (size_t)(hit - s.s);
        jbuf_put(c, &b, s.s + i, at - i);
        jbuf_put(c, &b, rep.s, rep.n);
        i = at + old.n;
        done++;
    }
    jbuf_put(c, &b, s.s + i, s.n - i);
    return (struct jinja_str){b.p ? b.p : "", b.n};
}

int64_t jstr_cp_index(struct jinja_str s, size_t byte_off)
{
    int64_t n = 0;
    for (size_t i = 0; i < byte_off && i < s.n; i++)
        if (((unsigned char)s.s[i] & 0xC0) != 0x80)
            n++;
    return n;
}

bool jstr_all(struct jinja_str s, bool (*pred)(int32_t))
{
    if (s.n == 0)
        return false;
    for (size_t i = 0; i < s.n;) {
        int32_t cp;
        i = jstr_next(s, i, &cp);
        if (!pred(cp))
            return false;
    }
    return true;
}

static bool cat_in(int32_t cp, const utf8proc_category_t *cats, int n)
{
    if (cp < 0)
        return false;
    utf8proc_category_t cat = utf8proc_category(cp);
    for (int i = 0; i < n; i++)
        if (cat == cats[i])
            return true;
    return false;
}

bool jstr_cp_alpha(int32_t cp)
{
    static const utf8proc_category_t cats[] = {UTF8PROC_CATEGORY_LU, UTF8PROC_CATEGORY_LL,
                                               UTF8PROC_CATEGORY_LT, UTF8PROC_CATEGORY_LM,
                                               UTF8PROC_CATEGORY_LO};
    return cat_in(cp, cats, 5);
}

bool jstr_cp_digit(int32_t cp)
{
    static const utf8proc_category_t cats[] = {UTF8PROC_CATEGORY_ND};
    return cat_in(cp, cats, 1);
}

bool jstr_cp_alnum(int32_t cp)
{
    static const utf8proc_category_t cats[] = {UTF8PROC_CATEGORY_NL, UTF8PROC_CATEGORY_NO};
    return jstr_cp_alpha(cp) || jstr_cp_digit(cp) || cat_in(cp, cats, 2);
}

/* islower/isupper: at least one cased char and no cased char of the other case. */
bool jstr_case_is(struct jinja_str s, bool upper)
{
    bool any = false;
    for (size_t i = 0; i < s.n;) {
        int32_t cp;
        i = jstr_next(s, i, &cp);
        if (!is_cased(cp))
            continue;
        utf8proc_category_t cat = utf8proc_category(cp);
        if (upper ? cat == UTF8PROC_CATEGORY_LL : cat == UTF8PROC_CATEGORY_LU)
            return false;
        any = true;
    }
    return any;
}

/*
 * jinja_builtins - filters, tests, methods of str/list/dict/loop, and global functions.
 *
 * Each group is a name -> handler lookup over a static table; handlers get evaluated
 * arguments (struct jinja_args: positional, then keyword) and fetch them with arg(), which
 * accepts a parameter either by position or by its Python name, as jinja2 does.
 *
 * Semantics are jinja2's (filters, tests) and Python's (methods), as transformers sees them:
 *   - tojson is transformers' override: json.dumps(ensure_ascii=False), keywords indent
 *     and sort_keys;
 *   - sort/unique/dictsort/min/max compare strings case-insensitively unless
 *     case_sensitive=true; sort is stable;
 *   - lists are immutable (transformers renders in ImmutableSandboxedEnvironment), so
 *     append/pop/update raise an error; range() is capped at 100000 items like the sandbox.
 * Global functions: range, namespace, dict, raise_exception (-> WELD_ERR_INVALID_ARG with
 * the template's message), strftime_now (see jinja_methods.c).
 */
#include "template/jinja.h"

#include "template/jinja_strings.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static struct jinja_value *arg(const struct jinja_args *a, size_t pos, const char *name)
{
    if (pos < a->n_pos)
        return a->pos[pos];
    for (size_t i = 0; name && i < a->n_kw; i++)
        if (jinja_str_eq(a->kw_names[i], name))
            return a->kw[i];
    return NULL;
}

static struct jinja_value *str_val(struct jinja_ctx *c, struct jinja_str s)
{
    return jv_str_ref(c, s);
}

static struct jinja_str need_str(struct jinja_ctx *c, const struct jinja_value *v,
                                 const char *what)
{
    if (v && v->t == JV_STR)
        return v->u.s;
    jinja_fail_at(c, WELD_ERR_FORMAT, "%s: expected a string, got %s", what,
                  v ? jv_type_name(v) : "nothing");
}

static int64_t need_int(struct jinja_ctx *c, const struct jinja_value *v, const char *what)
{
    if (v && v->t == JV_INT)
        return v->u.i;
    if (v && v->t == JV_BOOL)
        return v->u.b;
    jinja_fail_at(c, WELD_ERR_FORMAT, "%s: expected an integer, got %s", what,
                  v ? jv_type_name(v) : "nothing");
}

static bool opt_bool(const struct jinja_value *v, bool dflt)
{
    return v ? jv_truthy(v) : dflt;
}

static struct jinja_value **items_of(struct jinja_ctx *c, struct jinja_value *v, size_t *n,
                                     const char *what)
{
    if (v->t == JV_UNDEF || v->t == JV_STR || v->t == JV_DICT || jv_is_seq(v))
        return jinja_iter_items(c, v, n);
    jinja_fail_at(c, WELD_ERR_FORMAT, "%s: '%s' object is not iterable", what, jv_type_name(v));
}

static struct jinja_value *list_of(struct jinja_ctx *c, struct jinja_value **v, size_t n)
{
    struct jinja_value *l = jv_list(c, JV_LIST, n);
    for (size_t i = 0; i < n; i++)
        jv_list_push(c, l, v[i]);
    return l;
}

/* Item attribute for map/selectattr/sort(attribute=): "a" or "a.b" or "0". */
static struct jinja_value *attr_path(struct jinja_ctx *c, struct jinja_value *v,
                                     struct jinja_str path)
{
    size_t i = 0;
    while (i <= path.n) {
        size_t j = i;
        while (j < path.n && path.s[j] != '.')
            j++;
        struct jinja_str part = {path.s + i, j - i};
        if (v->t == JV_DICT || v->t == JV_NS) {
            struct jinja_value *x = jv_dict_get(v, part);
            v = x ? x : jv_undef(c, "attribute");
        } else if (jv_is_seq(v) && part.n > 0 && part.n < 10 && part.s[0] >= '0' &&
                   part.s[0] <= '9') {
            size_t k = (size_t)strtoul(part.s, NULL, 10);
            v = k < v->u.list.n ? v->u.list.v[k] : jv_undef(c, "attribute");
        } else {
            return jv_undef(c, "attribute");
        }
        i = j + 1;
    }
    return v;
}

/* ---- sorting ---- */

struct sort_ctx {
    struct jinja_ctx *c;
    bool case_sensitive;
};

static struct jinja_value *sort_key(struct jinja_ctx *c, struct jinja_value *v, bool cs)
{
    if (!cs && v->t == JV_STR)
        return str_val(c, jstr_case(c, v->u.s, JSTR_LOWER));
    return v;
}

/* Stable merge sort of v[0..n) by keys k[0..n). */
static void merge_sort(struct jinja_ctx *c, struct jinja_value **v, struct jinja_value **k,
                       size_t n, struct jinja_value **tv, struct jinja_value **tk, bool rev)
{
    if (n < 2)
        return;
    size_t h = n / 2;
    merge_sort(c, v, k, h, tv, tk, rev);
    merge_sort(c, v + h, k + h, n - h, tv, tk, rev);
    size_t i = 0, j = h, o = 0;
    while (i < h || j < n) {
        bool take_left;
        if (i >= h)
            take_left = false;
        else if (j >= n)
            take_left = true;
        else {
            int r = jv_compare(c, k[i], k[j]);
            take_left = rev ? r >= 0 : r <= 0;
        }
        size_t s = take_left ? i++ : j++;
        tv[o] = v[s];
        tk[o++] = k[s];
    }
    memcpy(v, tv, n * sizeof *v);
    memcpy(k, tk, n * sizeof *k);
}

static struct jinja_value *do_sort(struct jinja_ctx *c, struct jinja_value *v,
                                   const struct jinja_args *a)
{
    size_t n;
    struct jinja_value **src = items_of(c, v, &n, "sort");
    bool rev = opt_bool(arg(a, 0, "reverse"), false);
    bool cs = opt_bool(arg(a, 1, "case_sensitive"), false);
    struct jinja_value *attr = arg(a, 2, "attribute");
    struct jinja_value **vv = jinja_alloc(c->a, (n + 1) * sizeof *vv * 4);
    struct jinja_value **kk = vv + n + 1, **tv = kk + n + 1, **tk = tv + n + 1;
    for (size_t i = 0; i < n; i++) {
        vv[i] = src[i];
        struct jinja_value *key = attr ? attr_path(c, src[i], need_str(c, attr, "sort")) : src[i];
        kk[i] = sort_key(c, key, cs);
    }
    merge_sort(c, vv, kk, n, tv, tk, rev);
    return list_of(c, vv, n);
}

/* ---- filters ---- */

static struct jinja_value *f_length(struct jinja_ctx *c, struct jinja_value *v)
{
    switch (v->t) {
    case JV_UNDEF: return jv_int(c, 0);
    case JV_STR: return jv_int(c, jstr_cp_index(v->u.s, v->u.s.n));
    case JV_LIST:
    case JV_TUPLE: return jv_int(c, (int64_t)v->u.list.n);
    case JV_DICT:
    case JV_NS: return jv_int(c, (int64_t)v->u.dict.n);
    default:
        jinja_fail_at(c, WELD_ERR_FORMAT, "object of type '%s' has no len()", jv_type_name(v));
    }
}

static struct jinja_value *f_join(struct jinja_ctx *c, struct jinja_value *v,
                                  const struct jinja_args *a)
{
    size_t n;
    struct jinja_value **it = items_of(c, v, &n, "join");
    struct jinja_value *sep = arg(a, 0, "d"), *attr = arg(a, 1, "attribute");
    struct jinja_str d = sep ? jv_as_str(c, sep) : (struct jinja_str){"", 0};
    struct jinja_buf b = {0};
    for (size_t i = 0; i < n; i++) {
        if (i)
            jbuf_put(c, &b, d.s, d.n);
        struct jinja_value *x = attr ? attr_path(c, it[i], need_str(c, attr, "join")) : it[i];
        jv_to_str(c, &b, x);
    }
    return str_val(c, (struct jinja_str){b.p ? b.p : "", b.n});
}

static struct jinja_value *f_tojson(struct jinja_ctx *c, struct jinja_value *v,
                                    const struct jinja_args *a)
{
    /* transformers: tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) */
    struct jinja_value *ea = arg(a, 0, "ensure_ascii"), *ind = arg(a, 1, "indent");
    struct jinja_value *sep = arg(a, 2, "separators"), *sk = arg(a, 3, "sort_keys");
    if (sep && sep->t != JV_NONE)
        jinja_fail_at(c, WELD_ERR_UNSUPPORTED, "tojson: separators= is not supported");
    struct jinja_json_opts o = {.indent = -1, .sort_keys = opt_bool(sk, false),
                                .ensure_ascii = opt_bool(ea, false)};
    if (ind && ind->t != JV_NONE) {
        int64_t k = need_int(c, ind, "tojson indent");
        o.indent = k < 0 ? 0 : k > 64 ? 64 : (int)k;
    }
    struct jinja_buf b = {0};
    jv_to_json(c, &b, v, &o, 0);
    return str_val(c, (struct jinja_str){b.p ? b.p : "", b.n});
}

static struct jinja_value *f_map(struct jinja_ctx *c, struct jinja_value *v,
                                 const struct jinja_args *a, struct jinja_scope *s)
{
    size_t n;
    if (!jv_truthy(v)) /* jinja2: `if value:` before iterating */
        return jv_list(c, JV_LIST, 0);
    struct jinja_value **it = items_of(c, v, &n, "map");
    struct jinja_value *attr = arg(a, 99, "attribute"), *dflt = arg(a, 99, "default");
    struct jinja_value *out = jv_list(c, JV_LIST, n);
    if (attr) {
        struct jinja_str path = need_str(c, attr, "map attribute");
        for (size_t i = 0; i < n; i++) {
            struct jinja_value *x = attr_path(c, it[i], path);
            jv_list_push(c, out, x->t == JV_UNDEF && dflt ? dflt : x);
        }
        return out;
    }
    if (a->n_pos == 0)
        jinja_fail_at(c, WELD_ERR_FORMAT, "map: needs a filter name or attribute=");
    struct jinja_str fname = need_str(c, a->pos[0], "map filter");
    struct jinja_args rest = {a->pos + 1, a->n_pos - 1, a->kw_names, a->kw, a->n_kw};
    for (size_t i = 0; i < n; i++)
        jv_list_push(c, out, jinja_filter(c, fname, it[i], &rest, s));
    return out;
}

/* select/reject (by_attr false) and selectattr/rejectattr (by_attr true). */
static struct jinja_value *f_select(struct jinja_ctx *c, struct jinja_value *v,
                                    const struct jinja_args *a, bool by_attr, bool keep)
{
    size_t n;
    if (!jv_truthy(v)) /* jinja2: `if value:` before iterating */
        return jv_list(c, JV_LIST, 0);
    struct jinja_value **it = items_of(c, v, &n, "select");
    size_t k = 0;
    struct jinja_str path = {0};
    if (by_attr) {
        if (a->n_pos == 0)
            jinja_fail_at(c, WELD_ERR_FORMAT, "selectattr: needs an attribute name");
        path = need_str(c, a->pos[0], "selectattr");
        k = 1;
    }
    struct jinja_str test = {0};
    bool has_test = k < a->n_pos;
    if (has_test)
        test = need_str(c, a->pos[k], "select test");
    struct jinja_args rest = {a->pos + k + 1, has_test ? a->n_pos - k - 1 : 0, NULL, NULL, 0};
    struct jinja_value *out = jv_list(c, JV_LIST, 0);
    for (size_t i = 0; i < n; i++) {
        struct jinja_value *x = by_attr ? attr_path(c, it[i], path) : it[i];
        bool ok = has_test ? jinja_test(c, test, x, &rest) : jv_truthy(x);
        if (ok == keep)
            jv_list_push(c, out, it[i]);
    }
    return out;
}

static struct jinja_value *f_items(struct jinja_ctx *c, struct jinja_value *v)
{
    if (v->t == JV_UNDEF)
        return jv_list(c, JV_LIST, 0);
    if (v->t != JV_DICT && v->t != JV_NS)
        jinja_fail_at(c, WELD_ERR_FORMAT, "items: expected a mapping, got %s", jv_type_name(v));
    struct jinja_value *out = jv_list(c, JV_LIST, v->u.dict.n);
    for (size_t i = 0; i < v->u.dict.n; i++) {
        struct jinja_value *t = jv_list(c, JV_TUPLE, 2);
        jv_list_push(c, t, jv_dict_key(c, v, i));
        jv_list_push(c, t, v->u.dict.v[i]);
        jv_list_push(c, out, t);
    }
    return out;
}

static struct jinja_value *f_int(struct jinja_ctx *c, struct jinja_value *v,
                                 const struct jinja_args *a)
{
    struct jinja_value *d = arg(a, 0, "default");
    if (v->t == JV_INT)
        return v;
    if (v->t == JV_BOOL)
        return jv_int(c, v->u.b);
    if (v->t == JV_FLOAT && isfinite(v->u.f) && fabs(v->u.f) < 9.2e18)
        return jv_int(c, (int64_t)v->u.f);
    if (v->t == JV_STR && v->u.s.n > 0 && v->u.s.n < 64) {
        char buf[64];
        struct jinja_str t = jstr_strip(v->u.s, NULL, true, true);
        memcpy(buf, t.s, t.n);
        buf[t.n] = '\0';
        char *end;
        errno = 0;
        long long x = strtoll(buf, &end, 10);
        if (t.n && *end == '\0' && errno == 0)
            return jv_int(c, x);
        double f = strtod(buf, &end);
        if (t.n && *end == '\0' && isfinite(f) && fabs(f) < 9.2e18)
            return jv_int(c, (int64_t)f);
    }
    return d ? d : jv_int(c, 0);
}

static struct jinja_value *f_float(struct jinja_ctx *c, struct jinja_value *v,
                                   const struct jinja_args *a)
{
    struct jinja_value *d = arg(a, 0, "default");
    if (v->t == JV_FLOAT)
        return v;
    if (v->t == JV_INT || v->t == JV_BOOL)
        return jv_float(c, v->t == JV_INT ? (double)v->u.i : v->u.b);
    if (v->t == JV_STR && v->u.s.n > 0 && v->u.s.n < 64) {
        char buf[64], *end;
        struct jinja_str t = jstr_strip(v->u.s, NULL, true, true);
        memcpy(buf, t.s, t.n);
        buf[t.n] = '\0';
        double f = strtod(buf, &end);
        if (t.n && *end == '\0')
            return jv_float(c, f);
    }
    return d ? d : jv_float(c, 0.0);
}

static struct jinja_value *f_indent(struct jinja_ctx *c, struct jinja_value *v,
                                    const struct jinja_args *a)
{
    struct jinja_value *w = arg(a, 0, "width");
    bool first = opt_bool(arg(a, 1, "first"), false), blank = opt_bool(arg(a, 2, "blank"), false);
    struct jinja_str pad = {"    ", 4};
    if (w && w->t == JV_STR)
        pad = w->u.s;
    else if (w) {
        int64_t k = need_int(c, w, "indent width");
        struct jinja_buf pb = {0};
        for (int64_t i = 0; i < k && i < 256; i++)
            jbuf_put(c, &pb, " ", 1);
        pad = (struct jinja_str){pb.p ? pb.p : "", pb.n};
    }
    struct jinja_str s = jv_as_str(c, v);
    struct jinja_buf b = {0};
    size_t i = 0;
    bool line_start = true, is_first = true;
    while (i <= s.n) {
        size_t j = i;
        while (j < s.n && s.s[j] != '\n')
            j++;
        bool empty = j == i;
        if (line_start && (is_first ? first : (blank || !empty)) && !(is_first && empty && !first))
            jbuf_put(c, &b, pad.s, pad.n);
        jbuf_put(c, &b, s.s + i, j - i);
        if (j < s.n)
            jbuf_put(c, &b, "\n", 1);
        is_first = false;
        i = j + 1;
    }
    return str_val(c, (struct jinja_str){b.p ? b.p : "", b.n});
}

static struct jinja_value *f_format(struct jinja_ctx *c, struct jinja_value *v,
                                    const struct jinja_args *a)
{
    struct jinja_str f = need_str(c, v, "format");
    struct jinja_buf b = {0};
    size_t k = 0;
    for (size_t i = 0; i < f.n; i++) {
        if (f.s[i] != '%' || i + 1 >= f.n) {
            jbuf_put(c, &b, f.s + i, 1);
            continue;
        }
        char conv = f.s[++i];
        if (conv == '%') {
            jbuf_put(c, &b, "%", 1);
            continue;
        }
        if (k >= a->n_pos)
            jinja_fail_at(c, WELD_ERR_FORMAT, "format: not enough arguments");
        struct jinja_value *x = a->pos[k++];
        if (conv == 's')
            jv_to_str(c, &b, x);
        else if (conv == 'd' || conv == 'i')
            jbuf_printf(c, &b, "%lld", (long long)need_int(c, f_int(c, x, a), "format %d"));
        else if (conv == 'r')
            jv_to_str(c, &b, x);
        else
            jinja_fail_at(c, WELD_ERR_UNSUPPORTED, "format: conversion '%%%c' not supported",
                          conv);
    }
    return str_val(c, (struct jinja_str){b.p ? b.p : "", b.n});
}

struct jinja_value *jinja_markup(struct jinja_ctx *c, struct jinja_str s)
{
    struct jinja_value *m = jv_str_ref(c, s);
    m->safe = true;
    return m;
}

struct jinja_str jinja_html_escape(struct jinja_ctx *c, struct jinja_str s)
{
    struct jinja_buf b = {0};
    for (size_t i = 0; i < s.n; i++) {
        switch (s.s[i]) {
        case '&': jbuf_putz(c, &b, "&amp;"); break;
        case '<': jbuf_putz(c, &b, "&lt;"); break;
        case '>': jbuf_putz(c, &b, "&gt;"); break;
        case '"': jbuf_putz(c, &b, "&#34;"); break;
        case '\'': jbuf_putz(c, &b, "&#39;"); break;
        default: jbuf_put(c, &b, s.s + i, 1);
        }
    }
    return (struct jinja_str){b.p ? b.p : "", b.n};
}

static struct jinja_value *f_escape(struct jinja_ctx *c, struct jinja_value *v)
{
    if (v->t == JV_STR && v->safe)
        return v;
    return jinja_markup(c, jinja_html_escape(c, jv_as_str(c, v)));
}

/* jinja2's title filter: capitalize each piece split at whitespace and -([{< runs. */
static struct jinja_value *f_title(struct jinja_ctx *c, struct jinja_value *v)
{
    struct jinja_str s = jv_as_str(c, v);
    struct jinja_buf b = {0};
    bool boundary = true;
    for (size_t i = 0; i < s.n;) {
        int32_t cp;
        size_t nx = jstr_next(s, i, &cp);
        struct jinja_str one = {s.s + i, nx - i};
        bool sep = jstr_is_space(cp) || cp == '-' || cp == '(' || cp == '{' || cp == '[' ||
                   cp == '<';
        struct jinja_str m = sep ? one : jstr_case(c, one, boundary ? JSTR_UPPER : JSTR_LOWER);
        jbuf_put(c, &b, m.s, m.n);
        boundary = sep;
        i = nx;
    }
    return str_val(c, (struct jinja_str){b.p ? b.p : "", b.n});
}

static struct jinja_value *f_minmax(struct jinja_ctx *c, struct jinja_value *v,
                                    const struct jinja_args *a, bool want_max)
{
    size_t n;
    struct jinja_value **it = items_of(c, v, &n, want_max ? "max" : "min");
    bool cs = opt_bool(arg(a, 0, "case_sensitive"), false);
    struct jinja_value *attr = arg(a, 1, "attribute");
    if (n == 0)
        return jv_undef(c, "min/max of empty sequence");
    struct jinja_value *best = it[0];
    struct jinja_str path = attr ? need_str(c, attr, "attribute") : (struct jinja_str){0};
    struct jinja_value *bk = sort_key(c, attr ? attr_path(c, best, path) : best, cs);
    for (size_t i = 1; i < n; i++) {
        struct jinja_value *k = sort_key(c, attr ? attr_path(c, it[i], path) : it[i], cs);
        int r = jv_compare(c, k, bk);
        if (want_max ? r > 0 : r < 0) {
            best = it[i];
            bk = k;
        }
    }
    return best;
}

static struct jinja_value *f_unique(struct jinja_ctx *c, struct jinja_value *v,
                                    const struct jinja_args *a)
{
    size_t n;
    struct jinja_value **it = items_of(c, v, &n, "unique");
    bool cs = opt_bool(arg(a, 0, "case_sensitive"), false);
    struct jinja_value *attr = arg(a, 1, "attribute");
    struct jinja_value *out = jv_list(c, JV_LIST, 0), *keys = jv_list(c, JV_LIST, 0);
    for (size_t i = 0; i < n; i++) {
        struct jinja_value *k = attr ? attr_path(c, it[i], need_str(c, attr, "attribute")) : it[i];
        k = sort_key(c, k, cs);
        bool seen = false;
        for (size_t j = 0; j < keys->u.list.n && !seen; j++)
            seen = jv_equal(c, keys->u.list.v[j], k);
        if (!seen) {
            jv_list_push(c, keys, k);
            jv_list_push(c, out, it[i]);
        }
    }
    return out;
}

static struct jinja_value *f_dictsort(struct jinja_ctx *c, struct jinja_value *v,
                                      const struct jinja_args *a)
{
    struct jinja_value *pairs = f_items(c, v);
    bool cs = opt_bool(arg(a, 0, "case_sensitive"), false);
    struct jinja_value *by = arg(a, 1, "by");
    bool rev = opt_bool(arg(a, 2, "reverse"), false);
    size_t idx = by && by->t == JV_STR && jinja_str_eq(by->u.s, "value") ? 1 : 0;
    size_t n = pairs->u.list.n;
    struct jinja_value **vv = jinja_alloc(c->a, (n + 1) * sizeof *vv * 4);
    struct jinja_value **kk = vv + n + 1, **tv = kk + n + 1, **tk = tv + n + 1;
    for (size_t i = 0; i < n; i++) {
        vv[i] = pairs->u.list.v[i];
        kk[i] = sort_key(c, vv[i]->u.list.v[idx], cs);
    }
    merge_sort(c, vv, kk, n, tv, tk, rev);
    return list_of(c, vv, n);
}

static struct jinja_value *f_sum(struct jinja_ctx *c, struct jinja_value *v,
                                 const struct jinja_args *a)
{
    size_t n;
    struct jinja_value **it = items_of(c, v, &n, "sum");
    struct jinja_value *attr = arg(a, 0, "attribute"), *start = arg(a, 1, "start");
    bool is_f = false;
    int64_t si = 0;
    double sf = 0;
    if (start) {
        is_f = start->t == JV_FLOAT;
        si = is_f ? 0 : need_int(c, start, "sum start");
        sf = is_f ? start->u.f : (double)si;
    }
    for (size_t i = 0; i < n; i++) {
        struct jinja_value *x = attr ? attr_path(c, it[i], need_str(c, attr, "sum")) : it[i];
        if (x->t == JV_FLOAT) {
            if (!is_f)
                sf = (double)si;
            is_f = true;
            sf += x->u.f;
        } else {
            int64_t k = need_int(c, x, "sum item");
            if (is_f)
                sf += (double)k;
            else if (__builtin_add_overflow(si, k, &si))
                jinja_fail_at(c, WELD_ERR_LIMIT, "integer overflow in sum");
        }
    }
    return is_f ? jv_float(c, sf) : jv_int(c, si);
}

static struct jinja_value *f_reverse(struct jinja_ctx *c, struct jinja_value *v)
{
    size_t n;
    struct jinja_value **it = items_of(c, v, &n, "reverse");
    if (v->t == JV_STR) {
        struct jinja_buf b = {0};
        for (size_t i = n; i-- > 0;)
            jbuf_put(c, &b, it[i]->u.s.s, it[i]->u.s.n);
        return str_val(c, (struct jinja_str){b.p ? b.p : "", b.n});
    }
    struct jinja_value *out = jv_list(c, JV_LIST, n);
    for (size_t i = n; i-- > 0;)
        jv_list_push(c, out, it[i]);
    return out;
}

static struct jinja_value *f_round(struct jinja_ctx *c, struct jinja_value *v,
                                   const struct jinja_args *a)
{
    struct jinja_value *p = arg(a, 0, "precision"), *m = arg(a, 1, "method");
    int64_t prec = p ? need_int(c, p, "round precision") : 0;
    if (prec < -20 || prec > 20)
        jinja_fail_at(c, WELD_ERR_FORMAT, "round: precision out of range");
    double x = v->t == JV_FLOAT ? v->u.f : (double)need_int(c, v, "round");
    double scale = pow(10.0, (double)prec), y = x * scale;
    struct jinja_str method = m ? need_str(c, m, "round method") : (struct jinja_str){"common", 6};
    if (jinja_str_eq(method, "floor"))
        y = floor(y);
    else if (jinja_str_eq(method, "ceil"))
        y = ceil(y);
    else
        y = nearbyint(y); /* Python round(): half to even */
    return jv_float(c, y / scale);
}

static struct jinja_value *f_first_last(struct jinja_ctx *c, struct jinja_value *v, bool last)
{
    size_t n;
    struct jinja_value **it = items_of(c, v, &n, last ? "last" : "first");
    if (n == 0)
        return jv_undef(c, last ? "last item" : "first item");
    return it[last ? n - 1 : 0];
}

static struct jinja_value *f_default(struct jinja_ctx *c, struct jinja_value *v,
                                     const struct jinja_args *a)
{
    struct jinja_value *d = arg(a, 0, "default_value");
    bool boolean = opt_bool(arg(a, 1, "boolean"), false);
    if (v->t == JV_UNDEF || (boolean && !jv_truthy(v)))
        return d ? d : str_val(c, (struct jinja_str){"", 0});
    return v;
}

static struct jinja_value *f_replace(struct jinja_ctx *c, struct jinja_value *v,
                                     const struct jinja_args *a)
{
    struct jinja_value *cnt = arg(a, 2, "count");
    struct jinja_str s = jv_as_str(c, v);
    struct jinja_value *o = arg(a, 0, "old"), *r = arg(a, 1, "new");
    if (!o || !r)
        jinja_fail_at(c, WELD_ERR_FORMAT, "replace: needs old and new");
    int64_t count = cnt && cnt->t != JV_NONE ? need_int(c, cnt, "replace count") : -1;
    return str_val(c, jstr_replace(c, s, jv_as_str(c, o), jv_as_str(c, r), count));
}

static struct jinja_value *f_trim(struct jinja_ctx *c, struct jinja_value *v,
                                  const struct jinja_args *a)
{
    struct jinja_value *ch = arg(a, 0, "chars");
    struct jinja_str chars = ch && ch->t != JV_NONE ? need_str(c, ch, "trim chars")
                                                    : (struct jinja_str){0};
    return str_val(c, jstr_strip(jv_as_str(c, v), ch && ch->t != JV_NONE ? &chars : NULL,
                                 true, true));
}

/* Uniform signature for the filter table; `s` is the caller's scope (map() re-enters). */
typedef struct jinja_value *(*filter_fn)(struct jinja_ctx *c, struct jinja_value *v,
                                         const struct jinja_args *a, struct jinja_scope *s);

#define FILTER(fname) \
    static struct jinja_value *fname(struct jinja_ctx *c, struct jinja_value *v, \
                                     const struct jinja_args *a, struct jinja_scope *s)

FILTER(fx_trim) { return f_trim(c, v, a); }
FILTER(fx_length) { return f_length(c, v); }
FILTER(fx_tojson) { return f_tojson(c, v, a); }
FILTER(fx_default) { return f_default(c, v, a); }
FILTER(fx_first) { return f_first_last(c, v, false); }
FILTER(fx_last) { return f_first_last(c, v, true); }
FILTER(fx_join) { return f_join(c, v, a); }
FILTER(fx_upper) { return str_val(c, jstr_case(c, jv_as_str(c, v), JSTR_UPPER)); }
FILTER(fx_lower) { return str_val(c, jstr_case(c, jv_as_str(c, v), JSTR_LOWER)); }
FILTER(fx_capitalize) { return str_val(c, jstr_case(c, jv_as_str(c, v), JSTR_CAPITALIZE)); }
FILTER(fx_title) { return f_title(c, v); }
FILTER(fx_items) { return f_items(c, v); }
FILTER(fx_replace) { return f_replace(c, v, a); }
FILTER(fx_map) { return f_map(c, v, a, s); }
FILTER(fx_select) { return f_select(c, v, a, false, true); }
FILTER(fx_reject) { return f_select(c, v, a, false, false); }
FILTER(fx_selectattr) { return f_select(c, v, a, true, true); }
FILTER(fx_rejectattr) { return f_select(c, v, a, true, false); }
FILTER(fx_string) { return str_val(c, jv_as_str(c, v)); }
FILTER(fx_int) { return f_int(c, v, a); }
FILTER(fx_float) { return f_float(c, v, a); }
FILTER(fx_round) { return f_round(c, v, a); }
FILTER(fx_sort) { return do_sort(c, v, a); }
FILTER(fx_unique) { return f_unique(c, v, a); }
FILTER(fx_reverse) { return f_reverse(c, v); }
FILTER(fx_dictsort) { return f_dictsort(c, v, a); }
FILTER(fx_indent) { return f_indent(c, v, a); }
FILTER(fx_escape) { return f_escape(c, v); }
FILTER(fx_sum) { return f_sum(c, v, a); }
FILTER(fx_min) { return f_minmax(c, v, a, false); }
FILTER(fx_max) { return f_minmax(c, v, a, true); }
FILTER(fx_format) { return f_format(c, v, a); }

FILTER(fx_list)
{
    size_t n;
    struct jinja_value **it = items_of(c, v, &n, "list");
    return list_of(c, it, n);
}

FILTER(fx_abs)
{
    if (v->t == JV_FLOAT)
        return jv_float(c, fabs(v->u.f));
    int64_t k = need_int(c, v, "abs");
    if (k == INT64_MIN)
        jinja_fail_at(c, WELD_ERR_LIMIT, "integer overflow");
    return jv_int(c, k < 0 ? -k : k);
}

FILTER(fx_safe)
{
    return v->t == JV_STR && v->safe ? v : jinja_markup(c, jv_as_str(c, v));
}

FILTER(fx_attr)
{
    struct jinja_str nm = need_str(c, arg(a, 0, "name"), "attr");
    if (v->t == JV_NS) { /* getattr only: dict items are not attributes */
        struct jinja_value *x = jv_dict_get(v, nm);
        return x ? x : jv_undef(c, "attribute");
    }
    return jv_undef(c, "attribute");
}

FILTER(fx_wordcount)
{
    return jv_int(c, (int64_t)jstr_split(c, jv_as_str(c, v), NULL, -1)->u.list.n);
}

static const struct {
    const char *name;
    filter_fn fn;
} filters[] = {
    {"trim", fx_trim},       {"length", fx_length},         {"count", fx_length},
    {"tojson", fx_tojson},   {"default", fx_default},       {"d", fx_default},
    {"first", fx_first},     {"last", fx_last},             {"join", fx_join},
    {"upper", fx_upper},     {"lower", fx_lower},           {"capitalize", fx_capitalize},
    {"title", fx_title},     {"items", fx_items},           {"replace", fx_replace},
    {"list", fx_list},       {"map", fx_map},               {"select", fx_select},
    {"reject", fx_reject},   {"selectattr", fx_selectattr}, {"rejectattr", fx_rejectattr},
    {"string", fx_string},   {"int", fx_int},               {"float", fx_float},
    {"abs", fx_abs},         {"round", fx_round},           {"sort", fx_sort},
    {"unique", fx_unique},   {"reverse", fx_reverse},       {"dictsort", fx_dictsort},
    {"indent", fx_indent},   {"safe", fx_safe},             {"escape", fx_escape},
    {"e", fx_escape},        {"forceescape", fx_escape},    {"sum", fx_sum},
    {"min", fx_min},         {"max", fx_max},               {"format", fx_format},
    {"attr", fx_attr},       {"wordcount", fx_wordcount},
};

struct jinja_value *jinja_filter(struct jinja_ctx *c, struct jinja_str name,
                                 struct jinja_value *v, const struct jinja_args *a,
                                 struct jinja_scope *s)
{
    for (size_t i = 0; i < sizeof filters / sizeof filters[0]; i++)
        if (jinja_str_eq(name, filters[i].name))
            return filters[i].fn(c, v, a, s);
    jinja_fail_at(c, WELD_ERR_UNSUPPORTED, "unknown filter '%.*s'", (int)name.n, name.s);
}

/* ---- tests ---- */

static bool t_compare(struct jinja_ctx *c, struct jinja_str name, struct jinja_value *v,
                      struct jinja_value *o, bool *known)
{
    *known = true;
#define IS(z) jinja_str_eq(name, z)
    if (IS("eq") || IS("equalto") || IS("=="))
        return jv_equal(c, v, o);
    if (IS("ne") || IS("!="))
        return !jv_equal(c, v, o);
    if (IS("lt") || IS("lessthan") || IS("<"))
        return jv_compare(c, v, o) < 0;
    if (IS("le") || IS("<="))
        return jv_compare(c, v, o) <= 0;
    if (IS("gt") || IS("greaterthan") || IS(">"))
        return jv_compare(c, v, o) > 0;
    if (IS("ge") || IS(">="))
        return jv_compare(c, v, o) >= 0;
    if (IS("sameas")) {
        if (v->t != o->t)
            return false;
        if (v->t == JV_NONE || v->t == JV_UNDEF)
            return true;
        if (v->t == JV_BOOL)
            return v->u.b == o->u.b;
        return v == o;
    }
    if (IS("in")) {
        struct jinja_value *lst = o;
        if (lst->t == JV_STR)
            return v->t == JV_STR &&
                   (v->u.s.n == 0 || memmem(lst->u.s.s, lst->u.s.n, v->u.s.s, v->u.s.n));
        if (lst->t == JV_DICT)
            return jv_dict_lookup(c, lst, v) != NULL;
        size_t n;
        struct jinja_value **it = items_of(c, lst, &n, "in test");
        for (size_t i = 0; i < n; i++)
            if (jv_equal(c, v, it[i]))
                return true;
        return false;
    }
    if (IS("divisibleby")) {
        int64_t d = need_int(c, o, "divisibleby");
        if (d == 0)
            jinja_fail_at(c, WELD_ERR_FORMAT, "divisibleby: division by zero");
        return d == -1 || need_int(c, v, "divisibleby") % d == 0;
    }
#undef IS
    *known = false;
    return false;
}

bool jinja_test(struct jinja_ctx *c, struct jinja_str name, struct jinja_value *v,
                const struct jinja_args *a)
{
#define IS(z) jinja_str_eq(name, z)
    if (IS("defined"))
        return v->t != JV_UNDEF;
    if (IS("undefined"))
        return v->t == JV_UNDEF;
    if (IS("none"))
        return v->t == JV_NONE;
    if (IS("string"))
        return v->t == JV_STR;
    if (IS("number"))
        return v->t == JV_INT || v->t == JV_FLOAT || v->t == JV_BOOL;
    if (IS("integer"))
        return v->t == JV_INT;
    if (IS("float"))
        return v->t == JV_FLOAT;
    if (IS("boolean"))
        return v->t == JV_BOOL;
    if (IS("true"))
        return v->t == JV_BOOL && v->u.b;
    if (IS("false"))
        return v->t == JV_BOOL && !v->u.b;
    if (IS("mapping"))
        return v->t == JV_DICT;
    if (IS("iterable"))
        return v->t == JV_UNDEF || v->t == JV_STR || v->t == JV_DICT || jv_is_seq(v);
    if (IS("sequence"))
        return v->t == JV_STR || v->t == JV_DICT || jv_is_seq(v);
    if (IS("callable"))
        return v->t == JV_MACRO || v->t == JV_FUNC;
    if (IS("even") || IS("odd")) {
        int64_t k = need_int(c, v, "even/odd");
        return (k % 2 == 0) == IS("even");
    }
    if (IS("lower") || IS("upper"))
        return v->t == JV_STR && jstr_case_is(v->u.s, IS("upper"));
    if (IS("escaped"))
        return false;
#undef IS
    struct jinja_value *o = arg(a, 0, NULL);
    bool known;
    if (o) {
        bool r = t_compare(c, name, v, o, &known);
        if (known)
            return r;
    }
    jinja_fail_at(c, WELD_ERR_UNSUPPORTED, "unknown test '%.*s'%s", (int)name.n, name.s,
                  o ? "" : " (or missing argument)");
}

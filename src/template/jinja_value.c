/*
 * jinja_value - the arena, error raising, and the value model of the interpreter.
 *
 * Arena: a list of chunks (64 KiB, or exactly the request when larger than 16 KiB); bump
 * allocation, zeroed, 16-byte aligned; freed all at once. Exceeding the byte limit or
 * failing to allocate raises WELD_ERR_LIMIT / WELD_ERR_NOMEM through the arena's jinja_fail.
 *
 * Values (struct jinja_value) mirror the Python objects jinja2 would see: Undefined, None,
 * bool, int (int64; overflow is an error, not a wrap), float, str (UTF-8 bytes), list,
 * tuple, dict (str or int keys, an int key kept as its decimal text plus a flag; insertion
 * ordered; linear lookup, charged as work since template dicts are small), namespace,
 * macro, function, loop. A str may carry `safe` (jinja2 Markup, from |safe or |escape).
 * Containers are shared by reference, as in Python; only namespaces are ever mutated after
 * construction. None/True/False are static singletons and never written.
 *
 * Printing follows Python: str() for {{ }} and ~ (True, None, 1.0, ['a', 1], {'k': 'v'}),
 * repr() inside containers; tojson follows json.dumps(ensure_ascii=False).
 */
#include "template/jinja.h"

#include "core/alloc.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

struct jinja_chunk {
    struct jinja_chunk *next;
    size_t cap, used;
    _Alignas(16) unsigned char data[];
};

#define CHUNK_SIZE (64 * 1024)
#define BIG_ALLOC (16 * 1024)

void jinja_raise(struct jinja_fail *f, enum weld_status s, const char *fmt, ...)
{
    if (f->e) {
        char msg[sizeof f->e->msg];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        err_set(f->e, s, "%s", msg);
    }
    longjmp(f->jb, s == WELD_OK ? WELD_ERR_INTERNAL : (int)s);
}

void *jinja_alloc(struct jinja_arena *a, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    if (n == 0)
        n = 16;
    struct jinja_chunk *c = a->head;
    if (c && c->cap - c->used >= n) {
        void *p = c->data + c->used;
        c->used += n;
        return p;
    }
    size_t cap = n > BIG_ALLOC ? n : CHUNK_SIZE;
    if (cap > SIZE_MAX / 2 || (a->limit && a->used + cap > a->limit))
        jinja_raise(a->fail, WELD_ERR_LIMIT, "template needs more than %zu bytes of memory",
                    a->limit);
    struct jinja_chunk *nc = wmalloc(sizeof *nc + cap);
    if (!nc)
        jinja_raise(a->fail, WELD_ERR_NOMEM, "out of memory (%zu bytes)", cap);
    memset(nc->data, 0, cap);
    nc->cap = cap;
    nc->used = n;
    a->used += cap;
    if (n > BIG_ALLOC && c) { /* keep the partly used chunk in front */
        nc->next = c->next;
        c->next = nc;
    } else {
        nc->next = c;
        a->head = nc;
    }
    return nc->data;
}

void jinja_arena_free(struct jinja_arena *a)
{
    struct jinja_chunk *c = a->head;
    while (c) {
        struct jinja_chunk *nx = c->next;
        wfree(c);
        c = nx;
    }
    a->head = NULL;
    a->used = 0;
}

bool jinja_str_eq(struct jinja_str a, const char *z)
{
    size_t n = strlen(z);
    return a.n == n && memcmp(a.s, z, n) == 0;
}

void jinja_fail_at(struct jinja_ctx *c, enum weld_status s, const char *fmt, ...)
{
    char msg[900];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (s == WELD_ERR_INVALID_ARG) /* raise_exception: the template's own words */
        jinja_raise(c->fail, s, "%s", msg);
    jinja_raise(c->fail, s, "line %d: %s", c->line, msg);
}

void jinja_charge(struct jinja_ctx *c, size_t n)
{
    if (n > (size_t)c->lim.max_steps || c->steps > c->lim.max_steps - (long)n)
        jinja_fail_at(c, WELD_ERR_LIMIT, "template ran more than %ld steps", c->lim.max_steps);
    c->steps += (long)n;
}

/* ---- constructors ---- */

static struct jinja_value v_none = {.t = JV_NONE};
static struct jinja_value v_true = {.t = JV_BOOL, .u.b = true};
static struct jinja_value v_false = {.t = JV_BOOL, .u.b = false};

struct jinja_value *jv_new(struct jinja_ctx *c, enum jinja_vtype t)
{
    struct jinja_value *v = jinja_alloc(c->a, sizeof *v);
    v->t = t;
    return v;
}

struct jinja_value *jv_undef(struct jinja_ctx *c, const char *name)
{
    struct jinja_value *v = jv_new(c, JV_UNDEF);
    v->undef_name = name;
    return v;
}

struct jinja_value *jv_none(void)
{
    return &v_none;
}

struct jinja_value *jv_bool(bool b)
{
    return b ? &v_true : &v_false;
}

struct jinja_value *jv_int(struct jinja_ctx *c, int64_t i)
{
    struct jinja_value *v = jv_new(c, JV_INT);
    v->u.i = i;
    return v;
}

struct jinja_value *jv_float(struct jinja_ctx *c, double f)
{
    struct jinja_value *v = jv_new(c, JV_FLOAT);
    v->u.f = f;
    return v;
}

struct jinja_value *jv_str(struct jinja_ctx *c, const char *s, size_t n)
{
    char *p = jinja_alloc(c->a, n + 1);
    if (n)
        memcpy(p, s, n);
    return jv_str_ref(c, (struct jinja_str){p, n});
}

struct jinja_value *jv_str_ref(struct jinja_ctx *c, struct jinja_str s)
{
    struct jinja_value *v = jv_new(c, JV_STR);
    v->u.s = s;
    return v;
}

struct jinja_value *jv_list(struct jinja_ctx *c, enum jinja_vtype t, size_t cap)
{
    struct jinja_value *v = jv_new(c, t);
    if (cap) {
        v->u.list.v = jinja_alloc(c->a, cap * sizeof *v->u.list.v);
        v->u.list.cap = cap;
    }
    return v;
}

void jv_list_push(struct jinja_ctx *c, struct jinja_value *l, struct jinja_value *x)
{
    if (l->u.list.n == l->u.list.cap) {
        size_t cap = l->u.list.cap ? l->u.list.cap * 2 : 4;
        struct jinja_value **nv = jinja_alloc(c->a, cap * sizeof *nv);
        if (l->u.list.n)
            memcpy(nv, l->u.list.v, l->u.list.n * sizeof *nv);
        l->u.list.v = nv;
        l->u.list.cap = cap;
    }
    l->u.list.v[l->u.list.n++] = x;
}

struct jinja_value *jv_dict(struct jinja_ctx *c, enum jinja_vtype t)
{
    return jv_new(c, t);
}

static size_t dict_find(const struct jinja_value *d, struct jinja_str k, int kint)
{
    for (size_t i = 0; i < d->u.dict.n; i++)
        if (d->u.dict.kint[i] == kint && d->u.dict.k[i].n == k.n &&
            memcmp(d->u.dict.k[i].s, k.s, k.n) == 0)
            return i;
    return (size_t)-1;
}

static void dict_set(struct jinja_ctx *c, struct jinja_value *d, struct jinja_str k, int kint,
                     struct jinja_value *v)
{
    size_t i = dict_find(d, k, kint);
    if (i != (size_t)-1) {
        d->u.dict.v[i] = v;
        return;
    }
    if (d->u.dict.n == d->u.dict.cap) {
        size_t cap = d->u.dict.cap ? d->u.dict.cap * 2 : 4;
        struct jinja_str *nk = jinja_alloc(c->a, cap * sizeof *nk);
        unsigned char *ni = jinja_alloc(c->a, cap);
        struct jinja_value **nv = jinja_alloc(c->a, cap * sizeof *nv);
        if (d->u.dict.n) {
            memcpy(nk, d->u.dict.k, d->u.dict.n * sizeof *nk);
            memcpy(ni, d->u.dict.kint, d->u.dict.n);
            memcpy(nv, d->u.dict.v, d->u.dict.n * sizeof *nv);
        }
        d->u.dict.k = nk;
        d->u.dict.kint = ni;
        d->u.dict.v = nv;
        d->u.dict.cap = cap;
    }
    d->u.dict.k[d->u.dict.n] = k;
    d->u.dict.kint[d->u.dict.n] = (unsigned char)kint;
    d->u.dict.v[d->u.dict.n++] = v;
}

void jv_dict_set(struct jinja_ctx *c, struct jinja_value *d, struct jinja_str k,
                 struct jinja_value *v)
{
    dict_set(c, d, k, 0, v);
}

struct jinja_value *jv_dict_get(const struct jinja_value *d, struct jinja_str k)
{
    size_t i = dict_find(d, k, 0);
    return i == (size_t)-1 ? NULL : d->u.dict.v[i];
}

/* The (text, is_int) form of a key value; false if the type cannot be a key here. */
static bool key_form(struct jinja_ctx *c, const struct jinja_value *key, struct jinja_str *k,
                     int *kint)
{
    if (key->t == JV_STR) {
        *k = key->u.s;
        *kint = 0;
        return true;
    }
    if (key->t != JV_INT && key->t != JV_BOOL)
        return false;
    char buf[32];
    int n = snprintf(buf, sizeof buf, "%lld", (long long)(key->t == JV_INT ? key->u.i : key->u.b));
    char *p = jinja_alloc(c->a, (size_t)n + 1);
    memcpy(p, buf, (size_t)n + 1);
    *k = (struct jinja_str){p, (size_t)n};
    *kint = 1;
    return true;
}

struct jinja_value *jv_dict_lookup(struct jinja_ctx *c, const struct jinja_value *d,
                                   const struct jinja_value *key)
{
    struct jinja_str k;
    int kint;
    if (!key_form(c, key, &k, &kint))
        return NULL;
    size_t i = dict_find(d, k, kint);
    return i == (size_t)-1 ? NULL : d->u.dict.v[i];
}

void jv_dict_put(struct jinja_ctx *c, struct jinja_value *d, const struct jinja_value *key,
                 struct jinja_value *v)
{
    struct jinja_str k;
    int kint;
    if (!key_form(c, key, &k, &kint))
        jinja_fail_at(c, WELD_ERR_UNSUPPORTED, "dict keys must be str or int, not %s",
                      jv_type_name(key));
    dict_set(c, d, k, kint, v);
}

struct jinja_value *jv_dict_key(struct jinja_ctx *c, const struct jinja_value *d, size_t i)
{
    if (!d->u.dict.kint[i])
        return jv_str_ref(c, d->u.dict.k[i]);
    return jv_int(c, strtoll(d->u.dict.k[i].s, NULL, 10));
}

struct jinja_value *jv_func(struct jinja_ctx *c, const char *name, struct jinja_value *self)
{
    struct jinja_value *v = jv_new(c, JV_FUNC);
    v->u.func.name = name;
    v->u.func.self = self;
    return v;
}

/* ---- predicates ---- */

const char *jv_type_name(const struct jinja_value *v)
{
    switch (v->t) {
    case JV_UNDEF: return "Undefined";
    case JV_NONE: return "NoneType";
    case JV_BOOL: return "bool";
    case JV_INT: return "int";
    case JV_FLOAT: return "float";
    case JV_STR: return "str";
    case JV_LIST: return "list";
    case JV_TUPLE: return "tuple";
    case JV_DICT: return "dict";
    case JV_NS: return "Namespace";
    case JV_MACRO: return "Macro";
    case JV_FUNC: return "function";
    case JV_LOOP: return "LoopContext";
    }
    return "?";
}

bool jv_is_seq(const struct jinja_value *v)
{
    return v->t == JV_LIST || v->t == JV_TUPLE;
}

bool jv_truthy(const struct jinja_value *v)
{
    switch (v->t) {
    case JV_UNDEF:
    case JV_NONE: return false;
    case JV_BOOL: return v->u.b;
    case JV_INT: return v->u.i != 0;
    case JV_FLOAT: return v->u.f != 0.0;
    case JV_STR: return v->u.s.n > 0;
    case JV_LIST:
    case JV_TUPLE: return v->u.list.n > 0;
    case JV_DICT: return v->u.dict.n > 0;
    default: return true;
    }
}

static bool is_num(const struct jinja_value *v)
{
    return v->t == JV_INT || v->t == JV_FLOAT || v->t == JV_BOOL;
}

static double num_val(const struct jinja_value *v)
{
    return v->t == JV_FLOAT ? v->u.f : v->t == JV_INT ? (double)v->u.i : (double)v->u.b;
}

static bool equal_d(struct jinja_ctx *c, const struct jinja_value *a,
                    const struct jinja_value *b, int depth)
{
    if (depth > c->lim.max_depth)
        jinja_fail_at(c, WELD_ERR_LIMIT, "values nested too deeply to compare");
    jinja_charge(c, 1);
    if (is_num(a) && is_num(b)) {
        if (a->t != JV_FLOAT && b->t != JV_FLOAT)
            return (a->t == JV_INT ? a->u.i : a->u.b) == (b->t == JV_INT ? b->u.i : b->u.b);
        return num_val(a) == num_val(b);
    }
    if (jv_is_seq(a) && jv_is_seq(b)) {
        if (a->t != b->t || a->u.list.n != b->u.list.n)
            return false;
        for (size_t i = 0; i < a->u.list.n; i++)
            if (!equal_d(c, a->u.list.v[i], b->u.list.v[i], depth + 1))
                return false;
        return true;
    }
    if (a->t != b->t)
        return false;
    switch (a->t) {
    case JV_UNDEF:
    case JV_NONE: return true;
    case JV_STR: return a->u.s.n == b->u.s.n && memcmp(a->u.s.s, b->u.s.s, a->u.s.n) == 0;
    case JV_DICT:
        if (a->u.dict.n != b->u.dict.n)
            return false;
        for (size_t i = 0; i < a->u.dict.n; i++) {
            size_t j = dict_find(b, a->u.dict.k[i], a->u.dict.kint[i]);
            struct jinja_value *o = j == (size_t)-1 ? NULL : b->u.dict.v[j];
            if (!o || !equal_d(c, a->u.dict.v[i], o, depth + 1))
                return false;
        }
        return true;
    case JV_MACRO: return a->u.macro == b->u.macro;
    default: return a == b;
    }
}

bool jv_equal(struct jinja_ctx *c, const struct jinja_value *a, const struct jinja_value *b)
{
    return equal_d(c, a, b, 0);
}

static int compare_d(struct jinja_ctx *c, const struct jinja_value *a,
                     const struct jinja_value *b, int depth)
{
    if (depth > c->lim.max_depth)
        jinja_fail_at(c, WELD_ERR_LIMIT, "values nested too deeply to compare");
    jinja_charge(c, 1);
    if (is_num(a) && is_num(b)) {
        double x = num_val(a), y = num_val(b);
        if (a->t == JV_INT && b->t == JV_INT)
            return a->u.i < b->u.i ? -1 : a->u.i > b->u.i;
        return x < y ? -1 : x > y;
    }
    if (a->t == JV_STR && b->t == JV_STR) {
        size_t n = a->u.s.n < b->u.s.n ? a->u.s.n : b->u.s.n;
        int r = n ? memcmp(a->u.s.s, b->u.s.s, n) : 0;
        if (r)
            return r < 0 ? -1 : 1;
        return a->u.s.n < b->u.s.n ? -1 : a->u.s.n > b->u.s.n;
    }
    if (jv_is_seq(a) && a->t == b->t) {
        for (size_t i = 0; i < a->u.list.n && i < b->u.list.n; i++) {
            if (!equal_d(c, a->u.list.v[i], b->u.list.v[i], depth + 1))
                return compare_d(c, a->u.list.v[i], b->u.list.v[i], depth + 1);
        }
        return a->u.list.n < b->u.list.n ? -1 : a->u.list.n > b->u.list.n;
    }
    jinja_fail_at(c, WELD_ERR_FORMAT, "cannot compare %s with %s", jv_type_name(a),
                  jv_type_name(b));
}

int jv_compare(struct jinja_ctx *c, const struct jinja_value *a, const struct jinja_value *b)
{
    return compare_d(c, a, b, 0);
}

/* ---- buffers ---- */

void jbuf_put(struct jinja_ctx *c, struct jinja_buf *b, const char *s, size_t n)
{
    if (n == 0)
        return;
    if (n > c->lim.max_output || b->n > c->lim.max_output - n) /* any string, output included */
        jinja_fail_at(c, WELD_ERR_LIMIT, "string or output longer than %zu bytes",
                      c->lim.max_output);
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) {
            if (cap > SIZE_MAX / 4)
                jinja_fail_at(c, WELD_ERR_LIMIT, "string too long");
            cap *= 2;
        }
        char *p = jinja_alloc(c->a, cap);
        if (b->n)
            memcpy(p, b->p, b->n);
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}

void jbuf_putz(struct jinja_ctx *c, struct jinja_buf *b, const char *z)
{
    jbuf_put(c, b, z, strlen(z));
}

void jbuf_printf(struct jinja_ctx *c, struct jinja_buf *b, const char *fmt, ...)
{
    char tmp[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n > 0)
        jbuf_put(c, b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

/* ---- printing ---- */

/* Python's float repr: shortest round-trip digits, exponent outside [-4, 16). */
static void put_float(struct jinja_ctx *c, struct jinja_buf *b, double f, bool json)
{
    if (isnan(f)) {
        jbuf_putz(c, b, json ? "NaN" : "nan");
        return;
    }
    if (isinf(f)) {
        jbuf_putz(c, b, f < 0 ? (json ? "-Infinity" : "-inf") : (json ? "Infinity" : "inf"));
        return;
    }
    char e[64], out[400];
    int p = 1;
    for (; p < 17; p++) {
        snprintf(e, sizeof e, "%.*e", p - 1, f);
        if (strtod(e, NULL) == f)
            break;
    }
    snprintf(e, sizeof e, "%.*e", p - 1, f);
    int exp10 = atoi(strchr(e, 'e') + 1);
    if (exp10 >= -4 && exp10 < 16) {
        int decimals = p - 1 - exp10;
        snprintf(out, sizeof out, "%.*f", decimals > 0 ? decimals : 0, f);
        if (!strchr(out, '.'))
            strcat(out, ".0");
    } else {
        snprintf(out, sizeof out, "%.*e", p - 1, f);
        char *ep = strchr(out, 'e'); /* Python: 1e+16, 1.5e-07 */
        if (p == 1) {
            char *dot = strchr(out, '.');
            if (dot && dot < ep)
                memmove(dot, ep, strlen(ep) + 1);
        }
    }
    jbuf_putz(c, b, out);
}

static void put_repr_str(struct jinja_ctx *c, struct jinja_buf *b, struct jinja_str s)
{
    bool has_sq = memchr(s.s, '\'', s.n) != NULL, has_dq = memchr(s.s, '"', s.n) != NULL;
    char q = has_sq && !has_dq ? '"' : '\'';
    jbuf_put(c, b, &q, 1);
    for (size_t i = 0; i < s.n; i++) {
        unsigned char ch = (unsigned char)s.s[i];
        if (ch == '\\' || ch == (unsigned char)q) {
            char esc[2] = {'\\', (char)ch};
            jbuf_put(c, b, esc, 2);
        } else if (ch == '\n') {
            jbuf_putz(c, b, "\\n");
        } else if (ch == '\r') {
            jbuf_putz(c, b, "\\r");
        } else if (ch == '\t') {
            jbuf_putz(c, b, "\\t");
        } else if (ch < 0x20 || ch == 0x7f) {
            jbuf_printf(c, b, "\\x%02x", ch);
        } else {
            jbuf_put(c, b, (const char *)&ch, 1);
        }
    }
    jbuf_put(c, b, &q, 1);
}

static void put_repr(struct jinja_ctx *c, struct jinja_buf *b, const struct jinja_value *v,
                     int depth)
{
    if (depth > c->lim.max_depth)
        jinja_fail_at(c, WELD_ERR_LIMIT, "value nested too deeply to print");
    if (v->t == JV_STR) {
        put_repr_str(c, b, v->u.s);
    } else if (jv_is_seq(v)) {
        jbuf_putz(c, b, v->t == JV_LIST ? "[" : "(");
        for (size_t i = 0; i < v->u.list.n; i++) {
            if (i)
                jbuf_putz(c, b, ", ");
            put_repr(c, b, v->u.list.v[i], depth + 1);
        }
        jbuf_putz(c, b, v->t == JV_LIST ? "]" : v->u.list.n == 1 ? ",)" : ")");
    } else if (v->t == JV_DICT) {
        jbuf_putz(c, b, "{");
        for (size_t i = 0; i < v->u.dict.n; i++) {
            if (i)
                jbuf_putz(c, b, ", ");
            if (v->u.dict.kint[i])
                jbuf_put(c, b, v->u.dict.k[i].s, v->u.dict.k[i].n);
            else
                put_repr_str(c, b, v->u.dict.k[i]);
            jbuf_putz(c, b, ": ");
            put_repr(c, b, v->u.dict.v[i], depth + 1);
        }
        jbuf_putz(c, b, "}");
    } else {
        jv_to_str(c, b, v);
    }
}

void jv_to_str(struct jinja_ctx *c, struct jinja_buf *b, const struct jinja_value *v)
{
    switch (v->t) {
    case JV_UNDEF: return;
    case JV_NONE: jbuf_putz(c, b, "None"); return;
    case JV_BOOL: jbuf_putz(c, b, v->u.b ? "True" : "False"); return;
    case JV_INT: jbuf_printf(c, b, "%lld", (long long)v->u.i); return;
    case JV_FLOAT: put_float(c, b, v->u.f, false); return;
    case JV_STR: jbuf_put(c, b, v->u.s.s, v->u.s.n); return;
    case JV_LIST:
    case JV_TUPLE:
    case JV_DICT: put_repr(c, b, v, 0); return;
    case JV_NS: jbuf_putz(c, b, "<Namespace>"); return;
    case JV_MACRO: jbuf_putz(c, b, "<Macro>"); return;
    case JV_FUNC: jbuf_putz(c, b, "<function>"); return;
    case JV_LOOP: jbuf_putz(c, b, "<LoopContext>"); return;
    }
}

struct jinja_str jv_as_str(struct jinja_ctx *c, const struct jinja_value *v)
{
    if (v->t == JV_STR)
        return v->u.s;
    struct jinja_buf b = {0};
    jv_to_str(c, &b, v);
    return (struct jinja_str){b.p ? b.p : "", b.n};
}

/* ---- JSON ---- */

static void put_json_str(struct jinja_ctx *c, struct jinja_buf *b, struct jinja_str s, bool ascii)
{
    jbuf_putz(c, b, "\"");
    size_t run = 0;
    for (size_t i = 0; i < s.n; i++) {
        unsigned char ch = (unsigned char)s.s[i];
        if (ch >= 0x20 && ch != '"' && ch != '\\' && (ch < 0x80 || !ascii))
            continue;
        jbuf_put(c, b, s.s + run, i - run);
        run = i + 1;
        if (ch >= 0x80) { /* ensure_ascii: \uXXXX, surrogate pairs above the BMP */
            uint32_t cp = 0;
            int extra = ch >= 0xF0 ? 3 : ch >= 0xE0 ? 2 : ch >= 0xC0 ? 1 : 0;
            cp = ch & (0x3F >> extra);
            for (int k = 0; k < extra && i + 1 < s.n; k++)
                cp = (cp << 6) | ((unsigned char)s.s[++i] & 0x3F);
            run = i + 1;
            if (cp >= 0x10000) {
                cp -= 0x10000;
                jbuf_printf(c, b, "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
            } else {
                jbuf_printf(c, b, "\\u%04x", cp);
            }
            continue;
        }
        switch (ch) {
        case '"': jbuf_putz(c, b, "\\\""); break;
        case '\\': jbuf_putz(c, b, "\\\\"); break;
        case '\n': jbuf_putz(c, b, "\\n"); break;
        case '\r': jbuf_putz(c, b, "\\r"); break;
        case '\t': jbuf_putz(c, b, "\\t"); break;
        case '\b': jbuf_putz(c, b, "\\b"); break;
        case '\f': jbuf_putz(c, b, "\\f"); break;
        default: jbuf_printf(c, b, "\\u%04x", ch);
        }
    }
    jbuf_put(c, b, s.s + run, s.n - run);
    jbuf_putz(c, b, "\"");
}

static void put_indent(struct jinja_ctx *c, struct jinja_buf *b, int indent, int depth)
{
    jbuf_putz(c, b, "\n");
    for (int i = 0; i < indent * depth; i++)
        jbuf_putz(c, b, " ");
}

static int key_cmp(const void *x, const void *y)
{
    const struct jinja_str *a = x, *b_ = y;
    size_t n = a->n < b_->n ? a->n : b_->n;
    int r = n ? memcmp(a->s, b_->s, n) : 0;
    return r ? r : (a->n > b_->n) - (a->n < b_->n);
}

/* Key text plus its index, so sort_keys can reorder without losing the value. */
struct json_key {
    struct jinja_str k;
    size_t i;
};

static int json_key_cmp(const void *x, const void *y)
{
    const struct json_key *a = x, *b_ = y;
    int r = key_cmp(&a->k, &b_->k);
    return r ? r : (a->i > b_->i) - (a->i < b_->i);
}

static void put_json_dict(struct jinja_ctx *c, struct jinja_buf *b, const struct jinja_value *v,
                          const struct jinja_json_opts *o, int depth)
{
    size_t n = v->u.dict.n;
    struct json_key *keys = jinja_alloc(c->a, (n ? n : 1) * sizeof *keys);
    for (size_t i = 0; i < n; i++)
        keys[i] = (struct json_key){v->u.dict.k[i], i};
    if (o->sort_keys && n > 1)
        qsort(keys, n, sizeof *keys, json_key_cmp);
    int indent = o->indent;
    jbuf_putz(c, b, "{");
    for (size_t i = 0; i < n; i++) {
        if (i)
            jbuf_putz(c, b, indent >= 0 ? "," : ", ");
        if (indent >= 0)
            put_indent(c, b, indent, depth + 1);
        put_json_str(c, b, keys[i].k, o->ensure_ascii);
        jbuf_putz(c, b, ": ");
        jv_to_json(c, b, v->u.dict.v[keys[i].i], o, depth + 1);
    }
    if (indent >= 0 && n)
        put_indent(c, b, indent, depth);
    jbuf_putz(c, b, "}");
}

void jv_to_json(struct jinja_ctx *c, struct jinja_buf *b, const struct jinja_value *v,
                const struct jinja_json_opts *o, int depth)
{
    int indent = o->indent;
    if (depth > c->lim.max_depth)
        jinja_fail_at(c, WELD_ERR_LIMIT, "value nested too deeply for tojson");
    switch (v->t) {
    case JV_NONE: jbuf_putz(c, b, "null"); return;
    case JV_BOOL: jbuf_putz(c, b, v->u.b ? "true" : "false"); return;
    case JV_INT: jbuf_printf(c, b, "%lld", (long long)v->u.i); return;
    case JV_FLOAT: put_float(c, b, v->u.f, true); return;
    case JV_STR: put_json_str(c, b, v->u.s, o->ensure_ascii); return;
    case JV_LIST:
    case JV_TUPLE:
        jbuf_putz(c, b, "[");
        for (size_t i = 0; i < v->u.list.n; i++) {
            if (i)
                jbuf_putz(c, b, indent >= 0 ? "," : ", ");
            if (indent >= 0)
                put_indent(c, b, indent, depth + 1);
            jv_to_json(c, b, v->u.list.v[i], o, depth + 1);
        }
        if (indent >= 0 && v->u.list.n)
            put_indent(c, b, indent, depth);
        jbuf_putz(c, b, "]");
        return;
    case JV_DICT: put_json_dict(c, b, v, o, depth); return;
    default:
        jinja_fail_at(c, WELD_ERR_FORMAT, "tojson: object of type %s is not JSON serializable",
                      jv_type_name(v));
    }
}

struct jinja_value *jv_from_json(struct jinja_ctx *c, const json_t *j, int depth)
{
    if (depth > c->lim.max_depth)
        jinja_fail_at(c, WELD_ERR_LIMIT, "context JSON nested deeper than %d", c->lim.max_depth);
    switch (json_typeof(j)) {
    case JSON_NULL: return jv_none();
    case JSON_TRUE: return jv_bool(true);
    case JSON_FALSE: return jv_bool(false);
    case JSON_INTEGER: return jv_int(c, (int64_t)json_integer_value(j));
    case JSON_REAL: return jv_float(c, json_real_value(j));
    case JSON_STRING: return jv_str(c, json_string_value(j), json_string_length(j));
    case JSON_ARRAY: {
        size_t n = json_array_size(j);
        struct jinja_value *l = jv_list(c, JV_LIST, n);
        for (size_t i = 0; i < n; i++)
            jv_list_push(c, l, jv_from_json(c, json_array_get(j, i), depth + 1));
        return l;
    }
    case JSON_OBJECT: {
        struct jinja_value *d = jv_dict(c, JV_DICT);
        const char *key;
        json_t *val;
        json_object_foreach((json_t *)j, key, val) {
            struct jinja_value *k = jv_str(c, key, strlen(key));
            jv_dict_set(c, d, k->u.s, jv_from_json(c, val, depth + 1));
        }
        return d;
    }
    }
    return jv_none();
}

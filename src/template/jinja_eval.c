/*
 * jinja_eval - walks the AST: statements write to the current output buffer, expressions
 * return values (see jinja_value.c for the value model).
 *
 * Scopes: a chain of struct jinja_scope, each a JV_DICT of variables. Lookup walks to the
 * root; `set` writes the innermost scope. As in jinja2, each for-loop iteration and each
 * macro call gets a fresh scope, so `set` inside a loop does not leak out of it (templates
 * use namespace() for that); `if` does not open a scope. The chain is:
 *   globals (the render context) <- template top level <- loop / macro scopes ...
 * Macros run in a scope whose parent is the template top level. Names not found anywhere
 * that are global functions (range, namespace, raise_exception, strftime_now, dict) yield
 * JV_FUNC; anything else is Undefined carrying its name.
 *
 * Undefined follows jinja2's default: it prints as "", is falsy, iterates as empty, has
 * length 0 and equals only Undefined; arithmetic on it, calling it, or taking an attribute
 * or item of it is an error naming the variable.
 *
 * Limits: every node evaluated costs one step (max_steps), nesting of eval/exec calls is
 * bounded by max_depth (covers macro recursion), strings are bounded by max_output and the
 * arena by max_memory.
 */
#include "template/jinja.h"

#include <limits.h>
#include <math.h>
#include <string.h>

struct jinja_scope {
    struct jinja_scope *parent;
    struct jinja_value *vars; /* JV_DICT */
};

enum flow { FLOW_NORMAL, FLOW_BREAK, FLOW_CONTINUE };

static struct jinja_scope *scope_new(struct jinja_ctx *c, struct jinja_scope *parent)
{
    struct jinja_scope *s = jinja_alloc(c->a, sizeof *s);
    s->parent = parent;
    s->vars = jv_dict(c, JV_DICT);
    return s;
}

static struct jinja_value *scope_lookup(struct jinja_scope *s, struct jinja_str name)
{
    for (; s; s = s->parent) {
        struct jinja_value *v = jv_dict_get(s->vars, name);
        if (v)
            return v;
    }
    return NULL;
}

static const char *cstr(struct jinja_ctx *c, struct jinja_str s)
{
    char *p = jinja_alloc(c->a, s.n + 1);
    memcpy(p, s.s, s.n);
    return p;
}

_Noreturn static void undefined_error(struct jinja_ctx *c, const struct jinja_value *v)
{
    jinja_fail_at(c, WELD_ERR_FORMAT, "'%s' is undefined",
                  v->undef_name ? v->undef_name : "value");
}

static void enter(struct jinja_ctx *c, const struct jinja_node *n)
{
    if (++c->steps > c->lim.max_steps)
        jinja_fail_at(c, WELD_ERR_LIMIT, "template ran more than %ld steps", c->lim.max_steps);
    if (++c->depth > c->lim.max_depth)
        jinja_fail_at(c, WELD_ERR_LIMIT, "template nested deeper than %d (runaway recursion?)",
                      c->lim.max_depth);
    c->line = n->line;
}

/* ---- attribute and item access ---- */

static struct jinja_value *loop_attr(struct jinja_ctx *c, struct jinja_value *lv,
                                     struct jinja_str name)
{
    const struct jinja_loop *L = lv->u.loop;
    if (jinja_str_eq(name, "index"))
        return jv_int(c, L->index0 + 1);
    if (jinja_str_eq(name, "index0"))
        return jv_int(c, L->index0);
    if (jinja_str_eq(name, "revindex"))
        return jv_int(c, L->length - L->index0);
    if (jinja_str_eq(name, "revindex0"))
        return jv_int(c, L->length - L->index0 - 1);
    if (jinja_str_eq(name, "first"))
        return jv_bool(L->index0 == 0);
    if (jinja_str_eq(name, "last"))
        return jv_bool(L->index0 == L->length - 1);
    if (jinja_str_eq(name, "length"))
        return jv_int(c, L->length);
    if (jinja_str_eq(name, "depth"))
        return jv_int(c, L->depth0 + 1);
    if (jinja_str_eq(name, "depth0"))
        return jv_int(c, L->depth0);
    if (jinja_str_eq(name, "previtem"))
        return L->index0 > 0 ? L->items[L->index0 - 1] : jv_undef(c, "loop.previtem");
    if (jinja_str_eq(name, "nextitem"))
        return L->index0 + 1 < L->length ? L->items[L->index0 + 1]
                                         : jv_undef(c, "loop.nextitem");
    if (jinja_str_eq(name, "cycle"))
        return jv_func(c, "cycle", lv);
    return jv_undef(c, "loop attribute");
}

static struct jinja_value *get_attr(struct jinja_ctx *c, struct jinja_value *obj,
                                    struct jinja_str name)
{
    switch (obj->t) {
    case JV_UNDEF: undefined_error(c, obj);
    case JV_NS: {
        struct jinja_value *v = jv_dict_get(obj, name);
        return v ? v : jv_undef(c, cstr(c, name));
    }
    case JV_DICT: {
        struct jinja_value *m = jinja_method(c, obj, name);
        if (m)
            return m;
        struct jinja_value *v = jv_dict_get(obj, name);
        return v ? v : jv_undef(c, cstr(c, name));
    }
    case JV_LOOP: return loop_attr(c, obj, name);
    default: {
        struct jinja_value *m = jinja_method(c, obj, name);
        return m ? m : jv_undef(c, cstr(c, name));
    }
    }
}

/* Byte offset of code point index `cp` in s (clamped to s.n). */
static size_t utf8_offset(struct jinja_str s, int64_t cp)
{
    size_t i = 0;
    while (i < s.n && cp > 0) {
        i++;
        while (i < s.n && ((unsigned char)s.s[i] & 0xC0) == 0x80)
            i++;
        cp--;
    }
    return i;
}

static int64_t utf8_len(struct jinja_str s)
{
    int64_t n = 0;
    for (size_t i = 0; i < s.n; i++)
        if (((unsigned char)s.s[i] & 0xC0) != 0x80)
            n++;
    return n;
}

static bool as_index(const struct jinja_value *k, int64_t *out)
{
    if (k->t == JV_INT) {
        *out = k->u.i;
        return true;
    }
    if (k->t == JV_BOOL) {
        *out = k->u.b;
        return true;
    }
    return false;
}

static struct jinja_value *get_item(struct jinja_ctx *c, struct jinja_value *obj,
                                    struct jinja_value *key)
{
    int64_t i;
    switch (obj->t) {
    case JV_UNDEF: undefined_error(c, obj);
    case JV_DICT:
    case JV_NS:
        {
            struct jinja_value *v = jv_dict_lookup(c, obj, key);
            if (v)
                return v;
            return jv_undef(c, key->t == JV_STR ? cstr(c, key->u.s) : "item");
        }
    case JV_LIST:
    case JV_TUPLE:
        if (!as_index(key, &i))
            return jv_undef(c, "item");
        if (i < 0)
            i += (int64_t)obj->u.list.n;
        if (i < 0 || (uint64_t)i >= obj->u.list.n)
            return jv_undef(c, "list index");
        return obj->u.list.v[i];
    case JV_STR: {
        if (!as_index(key, &i))
            return jv_undef(c, "item");
        int64_t len = utf8_len(obj->u.s);
        if (i < 0)
            i += len;
        if (i < 0 || i >= len)
            return jv_undef(c, "string index");
        size_t a = utf8_offset(obj->u.s, i);
        size_t b = a + utf8_offset((struct jinja_str){obj->u.s.s + a, obj->u.s.n - a}, 1);
        return jv_str(c, obj->u.s.s + a, b - a);
    }
    case JV_LOOP:
        if (key->t == JV_STR)
            return loop_attr(c, obj, key->u.s);
        return jv_undef(c, "item");
    default: return jv_undef(c, "item");
    }
}

/* Python slice index normalisation for a sequence of length len. */
static int64_t slice_bound(struct jinja_ctx *c, struct jinja_value *v, int64_t len, int64_t step,
                           bool is_start)
{
    if (!v || v->t == JV_NONE)
        return step > 0 ? (is_start ? 0 : len) : (is_start ? len - 1 : -1);
    int64_t x;
    if (!as_index(v, &x))
        jinja_fail_at(c, WELD_ERR_FORMAT, "slice indices must be integers, not %s",
                      jv_type_name(v));
    if (x < 0) {
        x += len;
        if (x < 0)
            x = step > 0 ? 0 : -1;
    } else if (x >= len) {
        x = step > 0 ? len : len - 1;
    }
    return x;
}

static struct jinja_value *eval_slice(struct jinja_ctx *c, struct jinja_scope *s,
                                      const struct jinja_node *n)
{
    struct jinja_value *obj = jinja_eval(c, s, n->k[0]);
    struct jinja_value *vs[3];
    for (int k = 0; k < 3; k++)
        vs[k] = n->k[k + 1] ? jinja_eval(c, s, n->k[k + 1]) : NULL;
    int64_t step = 1;
    if (vs[2] && vs[2]->t != JV_NONE && !as_index(vs[2], &step))
        jinja_fail_at(c, WELD_ERR_FORMAT, "slice step must be an integer");
    if (step == 0)
        jinja_fail_at(c, WELD_ERR_FORMAT, "slice step cannot be zero");
    if (obj->t == JV_UNDEF)
        undefined_error(c, obj);
    size_t n_items;
    struct jinja_value **items;
    if (obj->t == JV_STR || jv_is_seq(obj)) {
        items = jinja_iter_items(c, obj, &n_items);
    } else {
        jinja_fail_at(c, WELD_ERR_FORMAT, "cannot slice %s", jv_type_name(obj));
    }
    int64_t len = (int64_t)n_items;
    int64_t a = slice_bound(c, vs[0], len, step, true), b = slice_bound(c, vs[1], len, step, false);
    struct jinja_value *out = jv_list(c, obj->t == JV_TUPLE ? JV_TUPLE : JV_LIST, 0);
    for (int64_t i = a; step > 0 ? i < b : i > b; i += step)
        jv_list_push(c, out, items[i]);
    if (obj->t != JV_STR)
        return out;
    struct jinja_buf buf = {0};
    for (size_t i = 0; i < out->u.list.n; i++)
        jbuf_put(c, &buf, out->u.list.v[i]->u.s.s, out->u.list.v[i]->u.s.n);
    return jv_str_ref(c, (struct jinja_str){buf.p ? buf.p : "", buf.n});
}

struct jinja_value **jinja_iter_items(struct jinja_ctx *c, struct jinja_value *v, size_t *n)
{
    if (jv_is_seq(v))
        jinja_charge(c, v->u.list.n);
    else if (v->t == JV_DICT)
        jinja_charge(c, v->u.dict.n);
    else if (v->t == JV_STR)
        jinja_charge(c, v->u.s.n);
    switch (v->t) {
    case JV_UNDEF: *n = 0; return NULL;
    case JV_LIST:
    case JV_TUPLE: *n = v->u.list.n; return v->u.list.v;
    case JV_DICT: {
        struct jinja_value **out = jinja_alloc(c->a, (v->u.dict.n + 1) * sizeof *out);
        for (size_t i = 0; i < v->u.dict.n; i++)
            out[i] = jv_dict_key(c, v, i);
        *n = v->u.dict.n;
        return out;
    }
    case JV_STR: {
        size_t cnt = (size_t)utf8_len(v->u.s);
        struct jinja_value **out = jinja_alloc(c->a, (cnt + 1) * sizeof *out);
        size_t i = 0, k = 0;
        while (i < v->u.s.n && k < cnt) {
            struct jinja_str rest = {v->u.s.s + i, v->u.s.n - i};
            size_t step = utf8_offset(rest, 1);
            out[k++] = jv_str_ref(c, (struct jinja_str){rest.s, step});
            i += step;
        }
        *n = k;
        return out;
    }
    default:
        jinja_fail_at(c, WELD_ERR_FORMAT, "'%s' object is not iterable", jv_type_name(v));
    }
}

/* ---- calls ---- */

static void eval_args(struct jinja_ctx *c, struct jinja_scope *s, const struct jinja_node *n,
                      struct jinja_args *args)
{
    args->n_pos = n->n_items;
    args->pos = jinja_alloc(c->a, (n->n_items + 1) * sizeof *args->pos);
    for (size_t i = 0; i < n->n_items; i++)
        args->pos[i] = jinja_eval(c, s, n->items[i]);
    args->n_kw = n->n_kw;
    args->kw_names = n->kw_names;
    args->kw = jinja_alloc(c->a, (n->n_kw + 1) * sizeof *args->kw);
    for (size_t i = 0; i < n->n_kw; i++)
        args->kw[i] = jinja_eval(c, s, n->kw_vals[i]);
}

static enum flow exec_node(struct jinja_ctx *c, struct jinja_scope *s, const struct jinja_node *n);

struct jinja_value *jinja_call_macro(struct jinja_ctx *c, const struct jinja_value *m,
                                     const struct jinja_args *args)
{
    const struct jinja_node *def = m->u.macro;
    struct jinja_scope *s = scope_new(c, c->globals); /* under the template top level */
    if (args->n_pos > def->n_items)
        jinja_fail_at(c, WELD_ERR_FORMAT, "macro '%.*s' takes %zu arguments, got %zu",
                      (int)def->str.n, def->str.s, def->n_items, args->n_pos);
    for (size_t i = 0; i < def->n_items; i++) {
        struct jinja_value *v = i < args->n_pos ? args->pos[i] : NULL;
        for (size_t k = 0; k < args->n_kw && !v; k++)
            if (args->kw_names[k].n == def->items[i]->str.n &&
                memcmp(args->kw_names[k].s, def->items[i]->str.s, args->kw_names[k].n) == 0)
                v = args->kw[k];
        if (!v)
            v = def->kw_vals[i] ? jinja_eval(c, s, def->kw_vals[i])
                                : jv_undef(c, cstr(c, def->items[i]->str));
        jv_dict_set(c, s->vars, def->items[i]->str, v);
    }
    struct jinja_buf *saved = c->out, buf = {0};
    c->out = &buf;
    exec_node(c, s, def->k[0]);
    c->out = saved;
    return jv_str_ref(c, (struct jinja_str){buf.p ? buf.p : "", buf.n});
}

static struct jinja_value *eval_call(struct jinja_ctx *c, struct jinja_scope *s,
                                     const struct jinja_node *n)
{
    struct jinja_value *f = jinja_eval(c, s, n->k[0]);
    struct jinja_args args;
    eval_args(c, s, n, &args);
    c->line = n->line;
    if (f->t == JV_MACRO)
        return jinja_call_macro(c, f, &args);
    if (f->t == JV_FUNC)
        return jinja_call_func(c, f, &args);
    if (f->t == JV_UNDEF)
        undefined_error(c, f);
    jinja_fail_at(c, WELD_ERR_FORMAT, "'%s' object is not callable", jv_type_name(f));
}

/* ---- operators ---- */

static bool is_number(const struct jinja_value *v)
{
    return v->t == JV_INT || v->t == JV_FLOAT || v->t == JV_BOOL;
}

static double fnum(const struct jinja_value *v)
{
    return v->t == JV_FLOAT ? v->u.f : v->t == JV_INT ? (double)v->u.i : (double)v->u.b;
}

static int64_t inum(const struct jinja_value *v)
{
    return v->t == JV_INT ? v->u.i : v->u.b;
}

_Noreturn static void op_error(struct jinja_ctx *c, const char *op, const struct jinja_value *a,
                               const struct jinja_value *b)
{
    if (a->t == JV_UNDEF)
        undefined_error(c, a);
    if (b->t == JV_UNDEF)
        undefined_error(c, b);
    jinja_fail_at(c, WELD_ERR_FORMAT, "unsupported operand types for %s: '%s' and '%s'", op,
                  jv_type_name(a), jv_type_name(b));
}

static struct jinja_value *int_result(struct jinja_ctx *c, bool overflow, const int64_t *r)
{
    if (overflow)
        jinja_fail_at(c, WELD_ERR_LIMIT, "integer overflow");
    return jv_int(c, *r);
}

static struct jinja_value *repeat(struct jinja_ctx *c, struct jinja_value *seq, int64_t times)
{
    if (times < 0)
        times = 0;
    if (seq->t == JV_STR) {
        if (seq->u.s.n && (uint64_t)times > c->lim.max_output / seq->u.s.n)
            jinja_fail_at(c, WELD_ERR_LIMIT, "string repetition too long");
        struct jinja_buf b = {0};
        for (int64_t i = 0; i < times; i++)
            jbuf_put(c, &b, seq->u.s.s, seq->u.s.n);
        return jv_str_ref(c, (struct jinja_str){b.p ? b.p : "", b.n});
    }
    if (seq->u.list.n && (uint64_t)times > (uint64_t)c->lim.max_steps / seq->u.list.n)
        jinja_fail_at(c, WELD_ERR_LIMIT, "list repetition too long");
    struct jinja_value *out = jv_list(c, seq->t, 0);
    for (int64_t i = 0; i < times; i++)
        for (size_t k = 0; k < seq->u.list.n; k++)
            jv_list_push(c, out, seq->u.list.v[k]);
    c->steps += times * (int64_t)seq->u.list.n;
    return out;
}

/* x ** y for y >= 0, by squaring; overflow is an error (Python would go to a bigint). */
static struct jinja_value *int_pow(struct jinja_ctx *c, int64_t x, int64_t y)
{
    int64_t acc = 1, base = x;
    while (y > 0) {
        if ((y & 1) && __builtin_mul_overflow(acc, base, &acc))
            jinja_fail_at(c, WELD_ERR_LIMIT, "integer overflow");
        y >>= 1;
        if (y && __builtin_mul_overflow(base, base, &base))
            jinja_fail_at(c, WELD_ERR_LIMIT, "integer overflow");
    }
    return jv_int(c, acc);
}

static struct jinja_value *arith(struct jinja_ctx *c, const char *op, struct jinja_value *a,
                                 struct jinja_value *b)
{
    if (!is_number(a) || !is_number(b))
        op_error(c, op, a, b);
    bool ints = a->t != JV_FLOAT && b->t != JV_FLOAT;
    int64_t x = ints ? inum(a) : 0, y = ints ? inum(b) : 0, r;
    double fx = fnum(a), fy = fnum(b);
    switch (op[0]) {
    case '+':
        if (ints)
            return int_result(c, __builtin_add_overflow(x, y, &r), &r);
        return jv_float(c, fx + fy);
    case '-':
        if (ints)
            return int_result(c, __builtin_sub_overflow(x, y, &r), &r);
        return jv_float(c, fx - fy);
    case '*':
        if (op[1] == '*')
            return ints && y >= 0 ? int_pow(c, x, y) : jv_float(c, pow(fx, fy));
        if (ints)
            return int_result(c, __builtin_mul_overflow(x, y, &r), &r);
        return jv_float(c, fx * fy);
    case '/':
        if (ints ? y == 0 : fy == 0.0)
            jinja_fail_at(c, WELD_ERR_FORMAT, "division by zero");
        if (op[1] != '/')
            return jv_float(c, fx / fy);
        if (ints) {
            if (x == INT64_MIN && y == -1)
                jinja_fail_at(c, WELD_ERR_LIMIT, "integer overflow");
            int64_t q = x / y;
            if ((x % y != 0) && ((x < 0) != (y < 0)))
                q--;
            return jv_int(c, q);
        }
        return jv_float(c, floor(fx / fy));
    case '%':
        if (ints ? y == 0 : fy == 0.0)
            jinja_fail_at(c, WELD_ERR_FORMAT, "modulo by zero");
        if (ints) {
            if (y == -1)
                return jv_int(c, 0);
            int64_t m = x % y;
            if (m != 0 && ((m < 0) != (y < 0)))
                m += y;
            return jv_int(c, m);
        }
        {
            double m = fmod(fx, fy);
            if (m != 0 && ((m < 0) != (fy < 0)))
                m += fy;
            return jv_float(c, m);
        }
    }
    op_error(c, op, a, b);
}

static bool contains(struct jinja_ctx *c, struct jinja_value *needle, struct jinja_value *hay)
{
    switch (hay->t) {
    case JV_STR:
        jinja_charge(c, hay->u.s.n / 16);
        if (needle->t != JV_STR)
            jinja_fail_at(c, WELD_ERR_FORMAT, "'in <string>' requires string as left operand");
        if (needle->u.s.n == 0)
            return true;
        return memmem(hay->u.s.s, hay->u.s.n, needle->u.s.s, needle->u.s.n) != NULL;
    case JV_LIST:
    case JV_TUPLE:
        for (size_t i = 0; i < hay->u.list.n; i++)
            if (jv_equal(c, needle, hay->u.list.v[i]))
                return true;
        return false;
    case JV_DICT:
    case JV_NS:
        jinja_charge(c, hay->u.dict.n);
        return jv_dict_lookup(c, hay, needle) != NULL;
    case JV_UNDEF: return false;
    default:
        jinja_fail_at(c, WELD_ERR_FORMAT, "argument of type '%s' is not iterable",
                      jv_type_name(hay));
    }
}

static struct jinja_value *eval_binary(struct jinja_ctx *c, struct jinja_scope *s,
                                       const struct jinja_node *n)
{
    struct jinja_value *a = jinja_eval(c, s, n->k[0]), *b = jinja_eval(c, s, n->k[1]);
    c->line = n->line;
    const char *op = n->str.s;
    if (strcmp(op, "~") == 0) {
        struct jinja_buf buf = {0};
        jv_to_str(c, &buf, a);
        jv_to_str(c, &buf, b);
        return jv_str_ref(c, (struct jinja_str){buf.p ? buf.p : "", buf.n});
    }
    if (strcmp(op, "==") == 0)
        return jv_bool(jv_equal(c, a, b));
    if (strcmp(op, "!=") == 0)
        return jv_bool(!jv_equal(c, a, b));
    if (strcmp(op, "in") == 0)
        return jv_bool(contains(c, a, b));
    if (strcmp(op, "not in") == 0)
        return jv_bool(!contains(c, a, b));
    if (op[0] == '<' || op[0] == '>') {
        if (a->t == JV_UNDEF || b->t == JV_UNDEF)
            op_error(c, op, a, b);
        int r = jv_compare(c, a, b);
        if (op[0] == '<')
            return jv_bool(op[1] == '=' ? r <= 0 : r < 0);
        return jv_bool(op[1] == '=' ? r >= 0 : r > 0);
    }
    if (op[0] == '+' && a->t == JV_STR && b->t == JV_STR) {
        /* Markup + str escapes the str (markupsafe), and the result stays Markup */
        bool safe = a->safe || b->safe;
        struct jinja_str x = safe && !a->safe ? jinja_html_escape(c, a->u.s) : a->u.s;
        struct jinja_str y = safe && !b->safe ? jinja_html_escape(c, b->u.s) : b->u.s;
        struct jinja_buf buf = {0};
        jbuf_put(c, &buf, x.s, x.n);
        jbuf_put(c, &buf, y.s, y.n);
        struct jinja_value *r = jv_str_ref(c, (struct jinja_str){buf.p ? buf.p : "", buf.n});
        r->safe = safe;
        return r;
    }
    if (op[0] == '+' && jv_is_seq(a) && a->t == b->t) {
        jinja_charge(c, a->u.list.n + b->u.list.n);
        struct jinja_value *out = jv_list(c, a->t, a->u.list.n + b->u.list.n);
        for (size_t i = 0; i < a->u.list.n; i++)
            jv_list_push(c, out, a->u.list.v[i]);
        for (size_t i = 0; i < b->u.list.n; i++)
            jv_list_push(c, out, b->u.list.v[i]);
        return out;
    }
    if (op[0] == '*' && op[1] == 0) {
        if ((a->t == JV_STR || jv_is_seq(a)) && (b->t == JV_INT || b->t == JV_BOOL))
            return repeat(c, a, inum(b));
        if ((b->t == JV_STR || jv_is_seq(b)) && (a->t == JV_INT || a->t == JV_BOOL))
            return repeat(c, b, inum(a));
    }
    return arith(c, op, a, b);
}

static struct jinja_value *eval_unary(struct jinja_ctx *c, struct jinja_scope *s,
                                      const struct jinja_node *n)
{
    struct jinja_value *v = jinja_eval(c, s, n->k[0]);
    if (n->str.s[0] == 'n')
        return jv_bool(!jv_truthy(v));
    if (!is_number(v)) {
        if (v->t == JV_UNDEF)
            undefined_error(c, v);
        jinja_fail_at(c, WELD_ERR_FORMAT, "bad operand type for unary %c: '%s'", n->str.s[0],
                      jv_type_name(v));
    }
    if (n->str.s[0] == '+')
        return v->t == JV_BOOL ? jv_int(c, v->u.b) : v;
    if (v->t == JV_FLOAT)
        return jv_float(c, -v->u.f);
    if (inum(v) == INT64_MIN)
        jinja_fail_at(c, WELD_ERR_LIMIT, "integer overflow");
    return jv_int(c, -inum(v));
}

static struct jinja_value *eval_name(struct jinja_ctx *c, struct jinja_scope *s,
                                     const struct jinja_node *n)
{
    struct jinja_value *v = scope_lookup(s, n->str);
    if (v)
        return v;
    const char *canon;
    if (jinja_is_global_func(n->str, &canon))
        return jv_func(c, canon, NULL);
    return jv_undef(c, cstr(c, n->str));
}

static struct jinja_value *eval_literal_coll(struct jinja_ctx *c, struct jinja_scope *s,
                                             const struct jinja_node *n)
{
    if (n->kind == JN_DICT) {
        struct jinja_value *d = jv_dict(c, JV_DICT);
        for (size_t i = 0; i < n->n_items; i++) {
            struct jinja_value *k = jinja_eval(c, s, n->items[i]);
            jinja_charge(c, d->u.dict.n); /* linear key lookup */
            jv_dict_put(c, d, k, jinja_eval(c, s, n->kw_vals[i]));
        }
        return d;
    }
    struct jinja_value *l = jv_list(c, n->kind == JN_LIST ? JV_LIST : JV_TUPLE, n->n_items);
    for (size_t i = 0; i < n->n_items; i++)
        jv_list_push(c, l, jinja_eval(c, s, n->items[i]));
    return l;
}

static struct jinja_value *eval_inner(struct jinja_ctx *c, struct jinja_scope *s,
                                      const struct jinja_node *n)
{
    switch (n->kind) {
    case JN_LITERAL: return n->lit;
    case JN_NAME: return eval_name(c, s, n);
    case JN_ATTR: return get_attr(c, jinja_eval(c, s, n->k[0]), n->str);
    case JN_ITEM: {
        struct jinja_value *obj = jinja_eval(c, s, n->k[0]);
        return get_item(c, obj, jinja_eval(c, s, n->k[1]));
    }
    case JN_SLICE: return eval_slice(c, s, n);
    case JN_CALL: return eval_call(c, s, n);
    case JN_FILTER: {
        struct jinja_value *v = jinja_eval(c, s, n->k[0]);
        struct jinja_args args;
        eval_args(c, s, n, &args);
        c->line = n->line;
        return jinja_filter(c, n->str, v, &args, s);
    }
    case JN_TEST: {
        struct jinja_value *v = jinja_eval(c, s, n->k[0]);
        struct jinja_args args;
        eval_args(c, s, n, &args);
        c->line = n->line;
        bool r = jinja_test(c, n->str, v, &args);
        return jv_bool(n->flag ? !r : r);
    }
    case JN_UNARY: return eval_unary(c, s, n);
    case JN_BINARY: return eval_binary(c, s, n);
    case JN_AND: {
        struct jinja_value *a = jinja_eval(c, s, n->k[0]);
        return jv_truthy(a) ? jinja_eval(c, s, n->k[1]) : a;
    }
    case JN_OR: {
        struct jinja_value *a = jinja_eval(c, s, n->k[0]);
        return jv_truthy(a) ? a : jinja_eval(c, s, n->k[1]);
    }
    case JN_COND:
        if (jv_truthy(jinja_eval(c, s, n->k[1])))
            return jinja_eval(c, s, n->k[0]);
        return n->k[2] ? jinja_eval(c, s, n->k[2]) : jv_undef(c, "conditional expression");
    case JN_LIST:
    case JN_TUPLE:
    case JN_DICT: return eval_literal_coll(c, s, n);
    default: jinja_fail_at(c, WELD_ERR_INTERNAL, "statement node %d used as expression", n->kind);
    }
}

struct jinja_value *jinja_eval(struct jinja_ctx *c, struct jinja_scope *s,
                               const struct jinja_node *n)
{
    enter(c, n);
    struct jinja_value *v = eval_inner(c, s, n);
    c->depth--;
    return v;
}

/* ---- statements ---- */

static void assign(struct jinja_ctx *c, struct jinja_scope *s, const struct jinja_node *target,
                   struct jinja_value *v)
{
    if (target->kind == JN_NAME) {
        jv_dict_set(c, s->vars, target->str, v);
        return;
    }
    if (target->kind == JN_ATTR) {
        struct jinja_value *ns = jinja_eval(c, s, target->k[0]);
        if (ns->t != JV_NS)
            jinja_fail_at(c, WELD_ERR_FORMAT,
                          "cannot assign attribute '%.*s' on %s (only namespace() objects)",
                          (int)target->str.n, target->str.s, jv_type_name(ns));
        jv_dict_set(c, ns, target->str, v);
        return;
    }
    size_t n;
    struct jinja_value **items;
    if (v->t == JV_UNDEF || v->t == JV_STR || v->t == JV_DICT || jv_is_seq(v))
        items = jinja_iter_items(c, v, &n);
    else
        jinja_fail_at(c, WELD_ERR_FORMAT, "cannot unpack non-iterable %s", jv_type_name(v));
    if (n != target->n_items)
        jinja_fail_at(c, WELD_ERR_FORMAT, "cannot unpack %zu values into %zu names", n,
                      target->n_items);
    for (size_t i = 0; i < n; i++)
        assign(c, s, target->items[i], items[i]);
}

static enum flow exec_for(struct jinja_ctx *c, struct jinja_scope *s, const struct jinja_node *n)
{
    struct jinja_value *it = jinja_eval(c, s, n->k[1]);
    if (it->t == JV_NONE || !(it->t == JV_UNDEF || it->t == JV_STR || it->t == JV_DICT ||
                               jv_is_seq(it)))
        jinja_fail_at(c, WELD_ERR_FORMAT, "'%s' object is not iterable", jv_type_name(it));
    size_t n_items;
    struct jinja_value **items = jinja_iter_items(c, it, &n_items);
    struct jinja_scope *outer = scope_new(c, s);
    if (n->k[4]) { /* for x in xs if cond: filter first, so loop.* counts kept items */
        struct jinja_value **kept = jinja_alloc(c->a, (n_items + 1) * sizeof *kept);
        size_t k = 0;
        for (size_t i = 0; i < n_items; i++) {
            struct jinja_scope *fs = scope_new(c, s);
            assign(c, fs, n->k[0], items[i]);
            if (jv_truthy(jinja_eval(c, fs, n->k[4])))
                kept[k++] = items[i];
        }
        items = kept;
        n_items = k;
    }
    struct jinja_loop *L = jinja_alloc(c->a, sizeof *L);
    struct jinja_value *parent_loop = scope_lookup(s, (struct jinja_str){"loop", 4});
    L->depth0 = parent_loop && parent_loop->t == JV_LOOP ? parent_loop->u.loop->depth0 + 1 : 0;
    L->length = (int64_t)n_items;
    L->items = items;
    struct jinja_value *lv = jv_new(c, JV_LOOP);
    lv->u.loop = L;
    for (size_t i = 0; i < n_items; i++) {
        struct jinja_scope *is = scope_new(c, outer);
        L->index0 = (int64_t)i;
        jv_dict_set(c, is->vars, (struct jinja_str){"loop", 4}, lv);
        assign(c, is, n->k[0], items[i]);
        enum flow f = exec_node(c, is, n->k[2]);
        if (f == FLOW_BREAK)
            break;
    }
    if (n_items == 0 && n->k[3])
        return exec_node(c, s, n->k[3]);
    return FLOW_NORMAL;
}

static enum flow exec_inner(struct jinja_ctx *c, struct jinja_scope *s, const struct jinja_node *n)
{
    switch (n->kind) {
    case JN_BODY:
        for (size_t i = 0; i < n->n_items; i++) {
            enum flow f = exec_node(c, s, n->items[i]);
            if (f != FLOW_NORMAL)
                return f;
        }
        return FLOW_NORMAL;
    case JN_TEXT: jbuf_put(c, c->out, n->str.s, n->str.n); return FLOW_NORMAL;
    case JN_OUTPUT: jv_to_str(c, c->out, jinja_eval(c, s, n->k[0])); return FLOW_NORMAL;
    case JN_IF:
        if (jv_truthy(jinja_eval(c, s, n->k[0])))
            return exec_node(c, s, n->k[1]);
        return n->k[2] ? exec_node(c, s, n->k[2]) : FLOW_NORMAL;
    case JN_FOR: return exec_for(c, s, n);
    case JN_SET: assign(c, s, n->k[0], jinja_eval(c, s, n->k[1])); return FLOW_NORMAL;
    case JN_SET_BLOCK: {
        struct jinja_buf *saved = c->out, buf = {0};
        c->out = &buf;
        exec_node(c, s, n->k[1]);
        c->out = saved;
        assign(c, s, n->k[0], jv_str_ref(c, (struct jinja_str){buf.p ? buf.p : "", buf.n}));
        return FLOW_NORMAL;
    }
    case JN_MACRO: {
        struct jinja_value *m = jv_new(c, JV_MACRO);
        m->u.macro = n;
        jv_dict_set(c, s->vars, n->str, m);
        return FLOW_NORMAL;
    }
    case JN_BREAK: return FLOW_BREAK;
    case JN_CONTINUE: return FLOW_CONTINUE;
    default: jinja_eval(c, s, n); return FLOW_NORMAL;
    }
}

static enum flow exec_node(struct jinja_ctx *c, struct jinja_scope *s, const struct jinja_node *n)
{
    enter(c, n);
    enum flow f = exec_inner(c, s, n);
    c->depth--;
    return f;
}

void jinja_render(struct jinja_ctx *c, const struct jinja_node *root, const json_t *context)
{
    struct jinja_scope *g = scope_new(c, NULL);
    if (context && json_is_object(context)) {
        const char *key;
        json_t *val;
        json_object_foreach((json_t *)context, key, val) {
            struct jinja_value *k = jv_str(c, key, strlen(key));
            jv_dict_set(c, g->vars, k->u.s, jv_from_json(c, val, 0));
        }
    }
    struct jinja_scope *top = scope_new(c, g);
    c->globals = top;
    exec_node(c, top, root);
}

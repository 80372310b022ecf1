/*
 * jinja_methods - Python methods of str, list/tuple and dict values, loop.cycle, and the
 * global functions (range, namespace, dict, raise_exception, strftime_now: C strftime of the
 * local time, or of chat_template_opts.now in UTC when set).
 *
 * `obj.name` on a str/list/dict first asks jinja_method() whether name is a method of that
 * type (Python's getattr comes before the item lookup, so `d.items` is the method even if
 * d has an "items" key); the result is a JV_FUNC bound to obj, called by jinja_call_func().
 * Method names point into static tables, so a JV_FUNC never owns its name.
 * Mutating methods (append, pop, update, ...) exist only to fail with a clear message:
 * transformers renders in an ImmutableSandboxedEnvironment where they are forbidden.
 */
#include "template/jinja.h"

#include "template/jinja_strings.h"

#include <string.h>
#include <time.h>

#define MAX_RANGE 100000

static const char *const str_methods[] = {
    "startswith", "endswith", "strip",   "lstrip",  "rstrip",  "split",        "upper",
    "lower",      "title",    "capitalize", "replace", "find",  "index",        "count",
    "join",       "isdigit",  "isalpha", "isalnum", "isspace", "islower",      "isupper",
    "splitlines", "removeprefix", "removesuffix", "rfind", NULL};
static const char *const list_methods[] = {"index", "count", "append", "pop", "extend",
                                           "insert", "remove", "sort", "reverse", "clear",
                                           NULL};
static const char *const dict_methods[] = {"items", "keys",    "values", "get", "pop",
                                           "update", "setdefault", "clear", NULL};
static const char *const global_funcs[] = {"range", "namespace", "dict", "raise_exception",
                                           "strftime_now", NULL};

static const char *find_name(const char *const *tab, struct jinja_str name)
{
    for (int i = 0; tab[i]; i++)
        if (jinja_str_eq(name, tab[i]))
            return tab[i];
    return NULL;
}

bool jinja_is_global_func(struct jinja_str name, const char **canon)
{
    *canon = find_name(global_funcs, name);
    return *canon != NULL;
}

struct jinja_value *jinja_method(struct jinja_ctx *c, struct jinja_value *self,
                                 struct jinja_str name)
{
    const char *m = NULL;
    if (self->t == JV_STR)
        m = find_name(str_methods, name);
    else if (self->t == JV_LIST)
        m = find_name(list_methods, name);
    else if (self->t == JV_TUPLE)
        m = jinja_str_eq(name, "index") || jinja_str_eq(name, "count")
                ? find_name(list_methods, name)
                : NULL;
    else if (self->t == JV_DICT)
        m = find_name(dict_methods, name);
    return m ? jv_func(c, m, self) : NULL;
}

static struct jinja_value *p(const struct jinja_args *a, size_t i)
{
    return i < a->n_pos ? a->pos[i] : NULL;
}

static struct jinja_str sarg(struct jinja_ctx *c, const struct jinja_args *a, size_t i,
                             const char *m)
{
    struct jinja_value *v = p(a, i);
    if (!v || v->t != JV_STR)
        jinja_fail_at(c, WELD_ERR_FORMAT, "str.%s(): argument %zu must be a string, not %s", m,
                      i + 1, v ? jv_type_name(v) : "missing");
    return v->u.s;
}

static int64_t iarg(struct jinja_ctx *c, const struct jinja_args *a, size_t i, int64_t dflt,
                    const char *m)
{
    struct jinja_value *v = p(a, i);
    if (!v || v->t == JV_NONE)
        return dflt;
    if (v->t == JV_INT)
        return v->u.i;
    if (v->t == JV_BOOL)
        return v->u.b;
    jinja_fail_at(c, WELD_ERR_FORMAT, "%s(): argument %zu must be an integer, not %s", m, i + 1,
                  jv_type_name(v));
}

static bool affix(struct jinja_str s, struct jinja_str x, bool end)
{
    if (x.n > s.n)
        return false;
    return memcmp(end ? s.s + s.n - x.n : s.s, x.s, x.n) == 0;
}

static struct jinja_value *m_affix(struct jinja_ctx *c, struct jinja_str s,
                                   const struct jinja_args *a, bool end)
{
    struct jinja_value *x = p(a, 0);
    if (x && jv_is_seq(x)) { /* startswith(("a", "b")) */
        for (size_t i = 0; i < x->u.list.n; i++) {
            if (x->u.list.v[i]->t != JV_STR)
                jinja_fail_at(c, WELD_ERR_FORMAT, "startswith/endswith: tuple items must be str");
            if (affix(s, x->u.list.v[i]->u.s, end))
                return jv_bool(true);
        }
        return jv_bool(false);
    }
    return jv_bool(affix(s, sarg(c, a, 0, end ? "endswith" : "startswith"), end));
}

static struct jinja_value *m_splitlines(struct jinja_ctx *c, struct jinja_str s)
{
    struct jinja_value *out = jv_list(c, JV_LIST, 0);
    size_t i = 0;
    while (i < s.n) {
        size_t j = i;
        while (j < s.n && s.s[j] != '\n' && s.s[j] != '\r')
            j++;
        jv_list_push(c, out, jv_str(c, s.s + i, j - i));
        if (j < s.n && s.s[j] == '\r' && j + 1 < s.n && s.s[j + 1] == '\n')
            j++;
        i = j + 1;
    }
    return out;
}

static struct jinja_value *m_find(struct jinja_ctx *c, struct jinja_str s, struct jinja_str x,
                                  bool last)
{
    const char *hit = NULL;
    jinja_charge(c, s.n / 16);
    if (!last) {
        hit = x.n == 0 ? s.s : memmem(s.s, s.n, x.s, x.n);
    } else {
        for (size_t i = s.n + 1; i-- > 0;)
            if (i + x.n <= s.n && memcmp(s.s + i, x.s, x.n) == 0) {
                hit = s.s + i;
                break;
            }
    }
    return jv_int(c, hit ? jstr_cp_index(s, (size_t)(hit - s.s)) : -1);
}

static struct jinja_value *m_count(struct jinja_ctx *c, struct jinja_str s, struct jinja_str x)
{
    jinja_charge(c, s.n / 16);
    if (x.n == 0)
        return jv_int(c, jstr_cp_index(s, s.n) + 1);
    int64_t n = 0;
    const char *q = s.s, *end = s.s + s.n;
    while ((q = memmem(q, (size_t)(end - q), x.s, x.n)) != NULL) {
        n++;
        q += x.n;
    }
    return jv_int(c, n);
}

static struct jinja_value *str_method_more(struct jinja_ctx *c, const char *m,
                                           struct jinja_str s, const struct jinja_args *a);

/* Python str methods; m is one of str_methods[]. */
static struct jinja_value *str_method(struct jinja_ctx *c, const char *m, struct jinja_str s,
                                      const struct jinja_args *a)
{
#define IS(z) (strcmp(m, z) == 0)
    if (IS("startswith") || IS("endswith"))
        return m_affix(c, s, a, IS("endswith"));
    if (IS("strip") || IS("lstrip") || IS("rstrip")) {
        struct jinja_value *ch = p(a, 0);
        struct jinja_str chars = {0};
        if (ch && ch->t != JV_NONE)
            chars = sarg(c, a, 0, m);
        return jv_str_ref(c, jstr_strip(s, ch && ch->t != JV_NONE ? &chars : NULL, !IS("rstrip"),
                                        !IS("lstrip")));
    }
    if (IS("split")) {
        struct jinja_value *sep = p(a, 0);
        struct jinja_str sp = {0};
        if (sep && sep->t != JV_NONE)
            sp = sarg(c, a, 0, m);
        return jstr_split(c, s, sep && sep->t != JV_NONE ? &sp : NULL, iarg(c, a, 1, -1, m));
    }
    if (IS("upper") || IS("lower") || IS("title") || IS("capitalize"))
        return jv_str_ref(c, jstr_case(c, s, IS("upper") ? JSTR_UPPER : IS("lower") ? JSTR_LOWER
                                             : IS("title")              ? JSTR_TITLE
                                                                        : JSTR_CAPITALIZE));
    if (IS("replace"))
        return jv_str_ref(c, jstr_replace(c, s, sarg(c, a, 0, m), sarg(c, a, 1, m),
                                          iarg(c, a, 2, -1, m)));
    if (IS("find") || IS("rfind"))
        return m_find(c, s, sarg(c, a, 0, m), IS("rfind"));
    if (IS("index")) {
        struct jinja_value *r = m_find(c, s, sarg(c, a, 0, m), false);
        if (r->u.i < 0)
            jinja_fail_at(c, WELD_ERR_FORMAT, "str.index(): substring not found");
        return r;
    }
    if (IS("count"))
        return m_count(c, s, sarg(c, a, 0, m));
#undef IS
    return str_method_more(c, m, s, a);
}

/* join, the is*() predicates, splitlines, removeprefix/removesuffix. */
static struct jinja_value *str_method_more(struct jinja_ctx *c, const char *m, struct jinja_str s,
                                           const struct jinja_args *a)
{
#define IS(z) (strcmp(m, z) == 0)
    if (IS("join")) {
        size_t n;
        struct jinja_value *v = p(a, 0);
        if (!v)
            jinja_fail_at(c, WELD_ERR_FORMAT, "str.join(): missing argument");
        struct jinja_value **it = jinja_iter_items(c, v, &n);
        struct jinja_buf b = {0};
        for (size_t i = 0; i < n; i++) {
            if (it[i]->t != JV_STR)
                jinja_fail_at(c, WELD_ERR_FORMAT, "str.join(): item %zu is %s, not str", i,
                              jv_type_name(it[i]));
            if (i)
                jbuf_put(c, &b, s.s, s.n);
            jbuf_put(c, &b, it[i]->u.s.s, it[i]->u.s.n);
        }
        return jv_str_ref(c, (struct jinja_str){b.p ? b.p : "", b.n});
    }
    if (IS("isdigit"))
        return jv_bool(jstr_all(s, jstr_cp_digit));
    if (IS("isalpha"))
        return jv_bool(jstr_all(s, jstr_cp_alpha));
    if (IS("isalnum"))
        return jv_bool(jstr_all(s, jstr_cp_alnum));
    if (IS("isspace"))
        return jv_bool(jstr_all(s, jstr_is_space));
    if (IS("islower") || IS("isupper"))
        return jv_bool(jstr_case_is(s, IS("isupper")));
    if (IS("splitlines"))
        return m_splitlines(c, s);
    if (IS("removeprefix") || IS("removesuffix")) {
        struct jinja_str x = sarg(c, a, 0, m);
        bool end = IS("removesuffix");
        if (!affix(s, x, end))
            return jv_str_ref(c, s);
        return jv_str_ref(c, (struct jinja_str){end ? s.s : s.s + x.n, s.n - x.n});
    }
#undef IS
    jinja_fail_at(c, WELD_ERR_INTERNAL, "str.%s not implemented", m);
}

static struct jinja_value *seq_method(struct jinja_ctx *c, const char *m, struct jinja_value *self,
                                      const struct jinja_args *a)
{
    struct jinja_value *x = p(a, 0);
    if (strcmp(m, "index") == 0 || strcmp(m, "count") == 0) {
        if (!x)
            jinja_fail_at(c, WELD_ERR_FORMAT, "list.%s(): missing argument", m);
        int64_t n = 0;
        for (size_t i = 0; i < self->u.list.n; i++) {
            if (!jv_equal(c, self->u.list.v[i], x))
                continue;
            if (m[0] == 'i')
                return jv_int(c, (int64_t)i);
            n++;
        }
        if (m[0] == 'i')
            jinja_fail_at(c, WELD_ERR_FORMAT, "list.index(): value not in list");
        return jv_int(c, n);
    }
    jinja_fail_at(c, WELD_ERR_UNSUPPORTED,
                  "list.%s(): lists are immutable in chat templates (transformers renders in "
                  "an ImmutableSandboxedEnvironment)",
                  m);
}

static struct jinja_value *dict_method(struct jinja_ctx *c, const char *m, struct jinja_value *self,
                                       const struct jinja_args *a)
{
    if (strcmp(m, "get") == 0) {
        struct jinja_value *k = p(a, 0), *d = p(a, 1);
        if (!k)
            jinja_fail_at(c, WELD_ERR_FORMAT, "dict.get(): missing key");
        struct jinja_value *v = jv_dict_lookup(c, self, k);
        return v ? v : d ? d : jv_none();
    }
    if (strcmp(m, "items") == 0 || strcmp(m, "keys") == 0 || strcmp(m, "values") == 0) {
        struct jinja_value *out = jv_list(c, JV_LIST, self->u.dict.n);
        for (size_t i = 0; i < self->u.dict.n; i++) {
            struct jinja_value *key = jv_dict_key(c, self, i);
            if (m[0] == 'k') {
                jv_list_push(c, out, key);
            } else if (m[0] == 'v') {
                jv_list_push(c, out, self->u.dict.v[i]);
            } else {
                struct jinja_value *t = jv_list(c, JV_TUPLE, 2);
                jv_list_push(c, t, key);
                jv_list_push(c, t, self->u.dict.v[i]);
                jv_list_push(c, out, t);
            }
        }
        return out;
    }
    jinja_fail_at(c, WELD_ERR_UNSUPPORTED,
                  "dict.%s(): dicts are immutable in chat templates (transformers renders in "
                  "an ImmutableSandboxedEnvironment)",
                  m);
}

/* ---- global functions ---- */

static struct jinja_value *g_range(struct jinja_ctx *c, const struct jinja_args *a)
{
    if (a->n_pos == 0 || a->n_pos > 3)
        jinja_fail_at(c, WELD_ERR_FORMAT, "range() takes 1 to 3 arguments");
    int64_t start = 0, stop, step = 1;
    if (a->n_pos == 1) {
        stop = iarg(c, a, 0, 0, "range");
    } else {
        start = iarg(c, a, 0, 0, "range");
        stop = iarg(c, a, 1, 0, "range");
        step = iarg(c, a, 2, 1, "range");
    }
    if (step == 0)
        jinja_fail_at(c, WELD_ERR_FORMAT, "range() step must not be zero");
    struct jinja_value *out = jv_list(c, JV_LIST, 0);
    int64_t n = 0;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; n++) {
        if (n >= MAX_RANGE)
            jinja_fail_at(c, WELD_ERR_LIMIT, "range() longer than %d items", MAX_RANGE);
        jv_list_push(c, out, jv_int(c, i));
        if (__builtin_add_overflow(i, step, &i))
            break;
    }
    return out;
}

static struct jinja_value *g_dict(struct jinja_ctx *c, const struct jinja_args *a, bool ns)
{
    struct jinja_value *d = jv_dict(c, ns ? JV_NS : JV_DICT);
    if (a->n_pos > 1)
        jinja_fail_at(c, WELD_ERR_FORMAT, "%s() takes at most one positional argument",
                      ns ? "namespace" : "dict");
    if (a->n_pos == 1) {
        struct jinja_value *src = a->pos[0];
        if (src->t != JV_DICT && src->t != JV_NS)
            jinja_fail_at(c, WELD_ERR_FORMAT, "%s(): positional argument must be a mapping",
                          ns ? "namespace" : "dict");
        for (size_t i = 0; i < src->u.dict.n; i++)
            jv_dict_put(c, d, jv_dict_key(c, src, i), src->u.dict.v[i]);
    }
    for (size_t i = 0; i < a->n_kw; i++)
        jv_dict_set(c, d, a->kw_names[i], a->kw[i]);
    return d;
}

static struct jinja_value *g_strftime(struct jinja_ctx *c, const struct jinja_args *a)
{
    struct jinja_str fmt = sarg(c, a, 0, "strftime_now");
    char f[256], out[512];
    if (fmt.n >= sizeof f)
        jinja_fail_at(c, WELD_ERR_FORMAT, "strftime_now(): format too long");
    memcpy(f, fmt.s, fmt.n);
    f[fmt.n] = '\0';
    struct tm tm;
    if (c->lim.now) { /* a fixed clock (tests, reproducible prompts): UTC */
        time_t t = (time_t)c->lim.now;
        gmtime_r(&t, &tm);
    } else {
        time_t t = time(NULL);
        localtime_r(&t, &tm);
    }
    size_t n = strftime(out, sizeof out, f, &tm);
    return jv_str(c, out, n);
}

struct jinja_value *jinja_call_func(struct jinja_ctx *c, const struct jinja_value *f,
                                    const struct jinja_args *a)
{
    const char *m = f->u.func.name;
    struct jinja_value *self = f->u.func.self;
    if (self) {
        if (self->t == JV_STR)
            return str_method(c, m, self->u.s, a);
        if (jv_is_seq(self))
            return seq_method(c, m, self, a);
        if (self->t == JV_DICT)
            return dict_method(c, m, self, a);
        if (self->t == JV_LOOP) { /* loop.cycle(a, b, ...) */
            if (a->n_pos == 0)
                jinja_fail_at(c, WELD_ERR_FORMAT, "loop.cycle() needs at least one value");
            return a->pos[self->u.loop->index0 % (int64_t)a->n_pos];
        }
    }
    if (strcmp(m, "range") == 0)
        return g_range(c, a);
    if (strcmp(m, "namespace") == 0 || strcmp(m, "dict") == 0)
        return g_dict(c, a, m[0] == 'n');
    if (strcmp(m, "raise_exception") == 0) {
        struct jinja_str msg = a->n_pos ? jv_as_str(c, a->pos[0]) : (struct jinja_str){"", 0};
        jinja_fail_at(c, WELD_ERR_INVALID_ARG, "%.*s", (int)(msg.n > 800 ? 800 : msg.n), msg.s);
    }
    if (strcmp(m, "strftime_now") == 0)
        return g_strftime(c, a);
    jinja_fail_at(c, WELD_ERR_INTERNAL, "unknown function %s", m);
}

/*
 * jinja - internals of the chat template interpreter (see chat_template.h for the language).
 *
 * Pipeline: jinja_lex() turns the source into a token array (text runs already trimmed by
 * whitespace control, trim_blocks and lstrip_blocks); jinja_parse() builds an AST of
 * struct jinja_node; jinja_render() walks it.
 *
 * Memory: everything is bump-allocated from a struct jinja_arena. The template owns one
 * arena (tokens, AST, literals), each render owns another (values, scopes, output), freed
 * in one go at the end. Values are therefore never refcounted or individually freed, and
 * cycles (a namespace stored in itself) are harmless. The render arena has a byte limit.
 *
 * Errors: inside the lexer, parser and evaluator, a failure calls jinja_raise(), which
 * fills the weld_err and longjmps to the jmp_buf set by the public entry point; since all
 * memory is in the arena, nothing needs unwinding. No jinja_* function except the entry
 * points in chat_template.c may be called without a jinja_fail armed by setjmp.
 */
#ifndef WELD_TEMPLATE_JINJA_H
#define WELD_TEMPLATE_JINJA_H

#include "core/err.h"
#include "template/chat_template.h"

#include <setjmp.h>
#include <stdbool.h>
#include <stdint.h>

struct jinja_fail {
    jmp_buf jb;
    struct weld_err *e;
};

_Noreturn void jinja_raise(struct jinja_fail *f, enum weld_status s, const char *fmt, ...)
    WELD_PRINTF(3, 4);

struct jinja_chunk;
struct jinja_arena {
    struct jinja_chunk *head; /* newest chunk first */
    size_t used;              /* bytes taken from the heap so far */
    size_t limit;             /* 0 = unlimited */
    struct jinja_fail *fail;  /* where to jump when out of memory or over limit */
};

void *jinja_alloc(struct jinja_arena *a, size_t n); /* zeroed, 16-aligned; never NULL */
void jinja_arena_free(struct jinja_arena *a);

/* A byte string; not NUL-terminated unless said so. */
struct jinja_str {
    const char *s;
    size_t n;
};

bool jinja_str_eq(struct jinja_str a, const char *z);

/* ---- tokens ---- */

enum jinja_tok_type {
    JT_TEXT,
    JT_VAR_BEGIN,
    JT_VAR_END,
    JT_BLOCK_BEGIN,
    JT_BLOCK_END,
    JT_NAME,
    JT_STRING,
    JT_INT,
    JT_FLOAT,
    JT_OP,
    JT_EOF,
};

struct jinja_tok {
    enum jinja_tok_type type;
    int line, col;          /* 1-based position in the source */
    struct jinja_str s;     /* text, name, op, or the unescaped string literal */
    int64_t i;              /* JT_INT */
    double f;               /* JT_FLOAT */
};

struct jinja_toks {
    struct jinja_tok *v;
    size_t n;
};

void jinja_lex(struct jinja_arena *a, const char *src, size_t len, struct jinja_toks *out);

/* ---- AST ---- */

enum jinja_node_kind {
    /* statements */
    JN_BODY,     /* items: statements */
    JN_TEXT,     /* str */
    JN_OUTPUT,   /* k[0]: expression */
    JN_IF,       /* k[0] cond, k[1] body, k[2] else body (may be NULL) */
    JN_FOR,      /* k[0] target, k[1] iterable, k[2] body, k[3] else, k[4] filter cond */
    JN_SET,      /* k[0] target, k[1] value */
    JN_SET_BLOCK, /* k[0] target, k[1] body */
    JN_MACRO,    /* str name, items params (JN_NAME), kw_vals defaults (NULL = none), k[0] body */
    JN_BREAK,
    JN_CONTINUE,
    /* expressions */
    JN_LITERAL,  /* lit */
    JN_NAME,     /* str */
    JN_ATTR,     /* k[0] object, str attribute */
    JN_ITEM,     /* k[0] object, k[1] key */
    JN_SLICE,    /* k[0] object, k[1..3] start/stop/step (each may be NULL) */
    JN_CALL,     /* k[0] callee, items args, kw_names/kw_vals */
    JN_FILTER,   /* k[0] operand, str name, items args, kw_names/kw_vals */
    JN_TEST,     /* k[0] operand, str name, items args, flag = negated */
    JN_UNARY,    /* str op ("-", "+", "not"), k[0] */
    JN_BINARY,   /* str op, k[0], k[1] */
    JN_AND,      /* k[0], k[1] */
    JN_OR,       /* k[0], k[1] */
    JN_COND,     /* k[0] value if k[1] else k[2] (k[2] may be NULL) */
    JN_LIST,     /* items */
    JN_TUPLE,    /* items */
    JN_DICT,     /* items keys, kw_vals values */
};

struct jinja_value;

struct jinja_node {
    enum jinja_node_kind kind;
    int line, col;
    struct jinja_str str;
    struct jinja_value *lit;
    struct jinja_node *k[5];
    struct jinja_node **items;
    size_t n_items;
    struct jinja_str *kw_names;
    struct jinja_node **kw_vals;
    size_t n_kw;
    int flag;
};

struct jinja_node *jinja_parse(struct jinja_arena *a, const struct jinja_toks *toks);

/* ---- values ---- */

enum jinja_vtype {
    JV_UNDEF,
    JV_NONE,
    JV_BOOL,
    JV_INT,
    JV_FLOAT,
    JV_STR,
    JV_LIST,
    JV_TUPLE,
    JV_DICT,
    JV_NS,    /* namespace(): a dict whose attributes can be set */
    JV_MACRO,
    JV_FUNC,  /* a global function or a bound method (self != NULL) */
    JV_LOOP,
};

struct jinja_loop;

struct jinja_value {
    enum jinja_vtype t;
    union {
        bool b;
        int64_t i;
        double f;
        struct jinja_str s;
        struct {
            struct jinja_value **v;
            size_t n, cap;
        } list; /* JV_LIST, JV_TUPLE */
        struct {
            struct jinja_str *k;   /* (n) key text */
            unsigned char *kint;   /* (n) 1 where the key is an int, kept as its decimal text */
            struct jinja_value **v;
            size_t n, cap;
        } dict; /* JV_DICT, JV_NS; insertion order */
        const struct jinja_node *macro;
        struct {
            const char *name;
            struct jinja_value *self;
        } func;
        struct jinja_loop *loop;
    } u;
    const char *undef_name; /* JV_UNDEF: what was looked up, for error messages */
    bool safe;              /* JV_STR: a jinja2 Markup (from |safe or |escape) */
};

struct jinja_loop {
    int64_t index0, length;
    struct jinja_value **items;
    int depth0;
};

/* The render state shared by jinja_eval.c and jinja_builtins.c. */
struct jinja_scope;
struct jinja_buf {
    char *p;
    size_t n, cap;
};

struct jinja_ctx {
    struct jinja_arena *a;
    struct jinja_fail *fail;
    struct chat_template_opts lim;
    struct jinja_buf *out; /* where statements write: the result, or a macro/set capture */
    long steps;
    int depth;
    int line; /* line of the node being evaluated, for messages */
    struct jinja_scope *globals; /* the template's top-level scope; its parent holds the context */
};

/* Count n units of work against max_steps (loops over items, scans of long strings). */
void jinja_charge(struct jinja_ctx *c, size_t n);

_Noreturn void jinja_fail_at(struct jinja_ctx *c, enum weld_status s, const char *fmt, ...)
    WELD_PRINTF(3, 4);

struct jinja_value *jv_new(struct jinja_ctx *c, enum jinja_vtype t);
struct jinja_value *jv_undef(struct jinja_ctx *c, const char *name);
struct jinja_value *jv_none(void);
struct jinja_value *jv_bool(bool b);
struct jinja_value *jv_int(struct jinja_ctx *c, int64_t i);
struct jinja_value *jv_float(struct jinja_ctx *c, double f);
struct jinja_value *jv_str(struct jinja_ctx *c, const char *s, size_t n); /* copies */
struct jinja_value *jv_str_ref(struct jinja_ctx *c, struct jinja_str s);  /* no copy */
struct jinja_value *jv_list(struct jinja_ctx *c, enum jinja_vtype t, size_t cap);
void jv_list_push(struct jinja_ctx *c, struct jinja_value *l, struct jinja_value *v);
struct jinja_value *jv_dict(struct jinja_ctx *c, enum jinja_vtype t);
void jv_dict_set(struct jinja_ctx *c, struct jinja_value *d, struct jinja_str k,
                 struct jinja_value *v);
struct jinja_value *jv_dict_get(const struct jinja_value *d, struct jinja_str k); /* or NULL */
/* Keys given as values: str or int (bool counts as int, as in Python). */
struct jinja_value *jv_dict_lookup(struct jinja_ctx *c, const struct jinja_value *d,
                                   const struct jinja_value *key); /* NULL if absent */
void jv_dict_put(struct jinja_ctx *c, struct jinja_value *d, const struct jinja_value *key,
                 struct jinja_value *v);
struct jinja_value *jv_dict_key(struct jinja_ctx *c, const struct jinja_value *d, size_t i);
struct jinja_value *jv_func(struct jinja_ctx *c, const char *name, struct jinja_value *self);

const char *jv_type_name(const struct jinja_value *v);
bool jv_truthy(const struct jinja_value *v);
bool jv_equal(struct jinja_ctx *c, const struct jinja_value *a, const struct jinja_value *b);
int jv_compare(struct jinja_ctx *c, const struct jinja_value *a, const struct jinja_value *b);
bool jv_is_seq(const struct jinja_value *v); /* list or tuple */

/* str() as Python prints it (str values verbatim, containers via repr()). */
void jv_to_str(struct jinja_ctx *c, struct jinja_buf *b, const struct jinja_value *v);
struct jinja_str jv_as_str(struct jinja_ctx *c, const struct jinja_value *v);
struct jinja_json_opts {
    int indent; /* < 0: single line with ", " and ": " */
    bool sort_keys, ensure_ascii;
};
/* json.dumps(v, ensure_ascii, indent, sort_keys) as transformers' tojson calls it. */
void jv_to_json(struct jinja_ctx *c, struct jinja_buf *b, const struct jinja_value *v,
                const struct jinja_json_opts *o, int depth);
struct jinja_value *jv_from_json(struct jinja_ctx *c, const json_t *j, int depth);

void jbuf_put(struct jinja_ctx *c, struct jinja_buf *b, const char *s, size_t n);
void jbuf_putz(struct jinja_ctx *c, struct jinja_buf *b, const char *z);
void jbuf_printf(struct jinja_ctx *c, struct jinja_buf *b, const char *fmt, ...)
    WELD_PRINTF(3, 4);

/* ---- evaluation (jinja_eval.c) and builtins (jinja_builtins.c) ---- */

struct jinja_value *jinja_eval(struct jinja_ctx *c, struct jinja_scope *s,
                               const struct jinja_node *n);
void jinja_render(struct jinja_ctx *c, const struct jinja_node *root, const json_t *context);
/* Iterate: returns the items of a list/tuple/string(chars)/dict(keys)/undefined(none). */
struct jinja_value **jinja_iter_items(struct jinja_ctx *c, struct jinja_value *v, size_t *n);

struct jinja_args {
    struct jinja_value **pos;
    size_t n_pos;
    struct jinja_str *kw_names;
    struct jinja_value **kw;
    size_t n_kw;
};

struct jinja_value *jinja_filter(struct jinja_ctx *c, struct jinja_str name,
                                 struct jinja_value *v, const struct jinja_args *args,
                                 struct jinja_scope *s);
bool jinja_test(struct jinja_ctx *c, struct jinja_str name, struct jinja_value *v,
                const struct jinja_args *args);
/* Attribute of a str/list/dict that is a method: a bound JV_FUNC, or NULL if none. */
struct jinja_value *jinja_method(struct jinja_ctx *c, struct jinja_value *self,
                                 struct jinja_str name);
struct jinja_value *jinja_call_func(struct jinja_ctx *c, const struct jinja_value *f,
                                    const struct jinja_args *args);
/* jinja2 Markup: a str flagged safe; html escaping as markupsafe does it. */
struct jinja_value *jinja_markup(struct jinja_ctx *c, struct jinja_str s);
struct jinja_str jinja_html_escape(struct jinja_ctx *c, struct jinja_str s);
bool jinja_is_global_func(struct jinja_str name, const char **canon);
/* Call a macro value (defined in jinja_eval.c). */
struct jinja_value *jinja_call_macro(struct jinja_ctx *c, const struct jinja_value *m,
                                     const struct jinja_args *args);

#endif

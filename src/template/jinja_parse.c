/*
 * jinja_parse - tokens -> AST (struct jinja_node), recursive descent after jinja2's parser.
 *
 * Statement layer: a body is a list of JN_TEXT / JN_OUTPUT / statement nodes, ended by EOF
 * or by a block tag whose keyword is one of the caller's end words (left unconsumed so the
 * caller can tell elif/else/endif apart). elif is desugared to a nested JN_IF in the else
 * branch.
 *
 * Expression precedence, lowest first, exactly as jinja2:
 *   cond (a if b else c) < or < and < not < compare (== != < <= > >= in, not in; chained)
 *   < + - < ~ < * / // % < ** < unary - + < primary with postfix (.attr [key] [a:b:c]
 *   (call)) and then filters (| f(args)) and tests (is [not] t(args)), left to right.
 * So `messages|length - 1` is `(messages|length) - 1` and `-x|abs` is `(-x)|abs`.
 *
 * Nesting depth is capped (PARSE_MAX_DEPTH) so hostile input cannot overflow the stack.
 * Errors name the token's line and column.
 */
#include "template/jinja.h"

#include <string.h>

#define PARSE_MAX_DEPTH 200

struct parser {
    struct jinja_arena *a;
    const struct jinja_tok *t;
    size_t n, i;
    int depth;
};

static const char *tok_desc(const struct jinja_tok *t, char *buf, size_t cap)
{
    switch (t->type) {
    case JT_EOF: return "end of template";
    case JT_TEXT: return "text";
    case JT_VAR_BEGIN: return "'{{'";
    case JT_VAR_END: return "'}}'";
    case JT_BLOCK_BEGIN: return "'{%'";
    case JT_BLOCK_END: return "'%}'";
    case JT_STRING: return "string literal";
    case JT_INT:
    case JT_FLOAT: return "number";
    default:
        snprintf(buf, cap, "'%.*s'", (int)(t->s.n > 40 ? 40 : t->s.n), t->s.s);
        return buf;
    }
}

_Noreturn static void perr(struct parser *P, const char *fmt, const char *arg)
{
    const struct jinja_tok *t = &P->t[P->i < P->n ? P->i : P->n - 1];
    char buf[64], what[256];
    snprintf(what, sizeof what, fmt, arg);
    jinja_raise(P->a->fail, WELD_ERR_FORMAT, "line %d, column %d: %s (got %s)", t->line,
                t->col, what, tok_desc(t, buf, sizeof buf));
}

static const struct jinja_tok *peek(struct parser *P)
{
    return &P->t[P->i];
}

static const struct jinja_tok *peek2(struct parser *P)
{
    return &P->t[P->i + 1 < P->n ? P->i + 1 : P->n - 1];
}

static const struct jinja_tok *next(struct parser *P)
{
    const struct jinja_tok *t = &P->t[P->i];
    if (t->type != JT_EOF)
        P->i++;
    return t;
}

static bool is_op(const struct jinja_tok *t, const char *op)
{
    return t->type == JT_OP && jinja_str_eq(t->s, op);
}

static bool is_name(const struct jinja_tok *t, const char *name)
{
    return t->type == JT_NAME && jinja_str_eq(t->s, name);
}

static bool accept_op(struct parser *P, const char *op)
{
    if (!is_op(peek(P), op))
        return false;
    next(P);
    return true;
}

static bool accept_name(struct parser *P, const char *name)
{
    if (!is_name(peek(P), name))
        return false;
    next(P);
    return true;
}

static void expect_op(struct parser *P, const char *op)
{
    if (!accept_op(P, op))
        perr(P, "expected '%s'", op);
}

static void expect_type(struct parser *P, enum jinja_tok_type ty, const char *what)
{
    if (peek(P)->type != ty)
        perr(P, "expected %s", what);
    next(P);
}

static struct jinja_str expect_ident(struct parser *P)
{
    if (peek(P)->type != JT_NAME)
        perr(P, "expected %s", "a name");
    return next(P)->s;
}

static struct jinja_node *mk(struct parser *P, enum jinja_node_kind k, const struct jinja_tok *at)
{
    struct jinja_node *n = jinja_alloc(P->a, sizeof *n);
    n->kind = k;
    n->line = at->line;
    n->col = at->col;
    return n;
}

/* A growable node list used while parsing, copied into the arena when done. */
struct nlist {
    struct jinja_node **v;
    struct jinja_str *names;
    size_t n, cap;
};

static void nl_push(struct parser *P, struct nlist *l, struct jinja_node *x, struct jinja_str name)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 4;
        struct jinja_node **nv = jinja_alloc(P->a, cap * sizeof *nv);
        struct jinja_str *nn = jinja_alloc(P->a, cap * sizeof *nn);
        if (l->n) {
            memcpy(nv, l->v, l->n * sizeof *nv);
            memcpy(nn, l->names, l->n * sizeof *nn);
        }
        l->v = nv;
        l->names = nn;
        l->cap = cap;
    }
    l->v[l->n] = x;
    l->names[l->n++] = name;
}

static struct jinja_node *parse_expr(struct parser *P);
static struct jinja_node *parse_or(struct parser *P);
static struct jinja_node *parse_unary(struct parser *P, bool with_filter);
static struct jinja_node *parse_body(struct parser *P, const char *const *ends);

static void enter(struct parser *P)
{
    if (++P->depth > PARSE_MAX_DEPTH)
        perr(P, "nesting deeper than %s levels", "200");
}

static struct jinja_node *lit_node(struct parser *P, const struct jinja_tok *t)
{
    struct jinja_node *n = mk(P, JN_LITERAL, t);
    struct jinja_value *v = jinja_alloc(P->a, sizeof *v);
    if (t->type == JT_STRING) {
        v->t = JV_STR;
        v->u.s = t->s;
    } else if (t->type == JT_INT) {
        v->t = JV_INT;
        v->u.i = t->i;
    } else {
        v->t = JV_FLOAT;
        v->u.f = t->f;
    }
    n->lit = v;
    return n;
}

static struct jinja_node *const_node(struct parser *P, const struct jinja_tok *t,
                                     enum jinja_vtype ty, bool b)
{
    struct jinja_node *n = mk(P, JN_LITERAL, t);
    struct jinja_value *v = jinja_alloc(P->a, sizeof *v);
    v->t = ty;
    v->u.b = b;
    n->lit = v;
    return n;
}

/* Arguments of a call/filter/test after '(' : positional then name=value. */
static void parse_args(struct parser *P, struct jinja_node *n)
{
    struct nlist pos = {0}, kw = {0};
    while (!accept_op(P, ")")) {
        if (pos.n + kw.n > 0)
            expect_op(P, ",");
        if (accept_op(P, ")"))
            break;
        if (peek(P)->type == JT_NAME && is_op(peek2(P), "=")) {
            struct jinja_str name = next(P)->s;
            next(P);
            nl_push(P, &kw, parse_expr(P), name);
        } else {
            if (kw.n)
                perr(P, "%s", "positional argument after keyword argument");
            nl_push(P, &pos, parse_expr(P), (struct jinja_str){0});
        }
    }
    n->items = pos.v;
    n->n_items = pos.n;
    n->kw_vals = kw.v;
    n->kw_names = kw.names;
    n->n_kw = kw.n;
}

static struct jinja_node *parse_paren_or_tuple(struct parser *P, const struct jinja_tok *at)
{
    if (accept_op(P, ")"))
        return mk(P, JN_TUPLE, at);
    struct jinja_node *first = parse_expr(P);
    if (accept_op(P, ")"))
        return first;
    struct nlist l = {0};
    nl_push(P, &l, first, (struct jinja_str){0});
    while (accept_op(P, ",")) {
        if (is_op(peek(P), ")"))
            break;
        nl_push(P, &l, parse_expr(P), (struct jinja_str){0});
    }
    expect_op(P, ")");
    struct jinja_node *n = mk(P, JN_TUPLE, at);
    n->items = l.v;
    n->n_items = l.n;
    return n;
}

static struct jinja_node *parse_list_or_dict(struct parser *P, const struct jinja_tok *at,
                                             bool dict)
{
    struct nlist keys = {0}, vals = {0};
    const char *close = dict ? "}" : "]";
    while (!accept_op(P, close)) {
        if (keys.n)
            expect_op(P, ",");
        if (accept_op(P, close))
            break;
        nl_push(P, &keys, parse_expr(P), (struct jinja_str){0});
        if (dict) {
            expect_op(P, ":");
            nl_push(P, &vals, parse_expr(P), (struct jinja_str){0});
        }
    }
    struct jinja_node *n = mk(P, dict ? JN_DICT : JN_LIST, at);
    n->items = keys.v;
    n->n_items = keys.n;
    n->kw_vals = vals.v;
    n->n_kw = vals.n;
    return n;
}

static struct jinja_node *parse_primary(struct parser *P)
{
    const struct jinja_tok *t = next(P);
    switch (t->type) {
    case JT_STRING: {
        struct jinja_node *n = lit_node(P, t);
        size_t first = P->i, total = t->s.n;
        while (peek(P)->type == JT_STRING) /* adjacent literals concatenate */
            total += next(P)->s.n;
        if (P->i > first) {
            char *s = jinja_alloc(P->a, total + 1);
            size_t k = t->s.n;
            memcpy(s, t->s.s, k);
            for (size_t j = first; j < P->i; j++) {
                memcpy(s + k, P->t[j].s.s, P->t[j].s.n);
                k += P->t[j].s.n;
            }
            n->lit->u.s = (struct jinja_str){s, total};
        }
        return n;
    }
    case JT_INT:
    case JT_FLOAT: return lit_node(P, t);
    case JT_NAME:
        if (jinja_str_eq(t->s, "true") || jinja_str_eq(t->s, "True"))
            return const_node(P, t, JV_BOOL, true);
        if (jinja_str_eq(t->s, "false") || jinja_str_eq(t->s, "False"))
            return const_node(P, t, JV_BOOL, false);
        if (jinja_str_eq(t->s, "none") || jinja_str_eq(t->s, "None"))
            return const_node(P, t, JV_NONE, false);
        {
            struct jinja_node *n = mk(P, JN_NAME, t);
            n->str = t->s;
            return n;
        }
    case JT_OP:
        if (jinja_str_eq(t->s, "("))
            return parse_paren_or_tuple(P, t);
        if (jinja_str_eq(t->s, "["))
            return parse_list_or_dict(P, t, false);
        if (jinja_str_eq(t->s, "{"))
            return parse_list_or_dict(P, t, true);
        break;
    default: break;
    }
    P->i--;
    perr(P, "%s", "expected an expression");
}

static struct jinja_node *parse_subscript(struct parser *P, struct jinja_node *obj,
                                          const struct jinja_tok *at)
{
    struct jinja_node *parts[3] = {NULL, NULL, NULL};
    int n_colons = 0;
    for (;;) {
        if (is_op(peek(P), ":")) {
            if (++n_colons > 2)
                perr(P, "%s", "too many ':' in slice");
            next(P);
            continue;
        }
        if (is_op(peek(P), "]"))
            break;
        if (parts[n_colons])
            perr(P, "%s", "expected ']'");
        parts[n_colons] = parse_expr(P);
    }
    expect_op(P, "]");
    struct jinja_node *n = mk(P, n_colons ? JN_SLICE : JN_ITEM, at);
    n->k[0] = obj;
    if (n_colons) {
        n->k[1] = parts[0];
        n->k[2] = parts[1];
        n->k[3] = parts[2];
    } else {
        if (!parts[0])
            perr(P, "%s", "empty subscript");
        n->k[1] = parts[0];
    }
    return n;
}

static struct jinja_node *parse_postfix(struct parser *P, struct jinja_node *node)
{
    for (;;) {
        const struct jinja_tok *at = peek(P);
        if (accept_op(P, ".")) {
            const struct jinja_tok *nt = next(P);
            if (nt->type == JT_INT) {
                struct jinja_node *n = mk(P, JN_ITEM, at);
                n->k[0] = node;
                n->k[1] = lit_node(P, nt);
                node = n;
                continue;
            }
            if (nt->type != JT_NAME) {
                P->i--;
                perr(P, "%s", "expected an attribute name after '.'");
            }
            struct jinja_node *n = mk(P, JN_ATTR, at);
            n->k[0] = node;
            n->str = nt->s;
            node = n;
        } else if (accept_op(P, "[")) {
            node = parse_subscript(P, node, at);
        } else if (accept_op(P, "(")) {
            struct jinja_node *n = mk(P, JN_CALL, at);
            n->k[0] = node;
            parse_args(P, n);
            node = n;
        } else {
            return node;
        }
    }
}

static bool test_arg_follows(const struct jinja_tok *t)
{
    if (t->type == JT_STRING || t->type == JT_INT || t->type == JT_FLOAT)
        return true;
    if (t->type == JT_NAME)
        return !jinja_str_eq(t->s, "else") && !jinja_str_eq(t->s, "or") &&
               !jinja_str_eq(t->s, "and") && !jinja_str_eq(t->s, "if") &&
               !jinja_str_eq(t->s, "in") && !jinja_str_eq(t->s, "is") &&
               !jinja_str_eq(t->s, "not");
    return t->type == JT_OP && (jinja_str_eq(t->s, "[") || jinja_str_eq(t->s, "{"));
}

static struct jinja_node *parse_filters(struct parser *P, struct jinja_node *node)
{
    for (;;) {
        const struct jinja_tok *at = peek(P);
        if (accept_op(P, "|")) {
            struct jinja_node *n = mk(P, JN_FILTER, at);
            n->k[0] = node;
            n->str = expect_ident(P);
            while (accept_op(P, ".")) /* dotted filter names: keep the last part */
                n->str = expect_ident(P);
            if (accept_op(P, "("))
                parse_args(P, n);
            node = n;
        } else if (accept_name(P, "is")) {
            struct jinja_node *n = mk(P, JN_TEST, at);
            n->flag = accept_name(P, "not");
            n->k[0] = node;
            n->str = expect_ident(P);
            if (accept_op(P, "(")) {
                parse_args(P, n);
            } else if (test_arg_follows(peek(P))) {
                n->items = jinja_alloc(P->a, sizeof *n->items);
                n->items[0] = parse_postfix(P, parse_primary(P));
                n->n_items = 1;
            }
            node = n;
        } else if (accept_op(P, "(")) {
            struct jinja_node *n = mk(P, JN_CALL, at);
            n->k[0] = node;
            parse_args(P, n);
            node = n;
        } else {
            return node;
        }
    }
}

static struct jinja_node *parse_unary(struct parser *P, bool with_filter)
{
    enter(P);
    const struct jinja_tok *at = peek(P);
    struct jinja_node *node;
    if (is_op(at, "-") || is_op(at, "+")) {
        next(P);
        node = mk(P, JN_UNARY, at);
        node->str = at->s;
        node->k[0] = parse_unary(P, false);
    } else {
        node = parse_primary(P);
    }
    node = parse_postfix(P, node);
    if (with_filter)
        node = parse_filters(P, node);
    P->depth--;
    return node;
}

static struct jinja_node *binary(struct parser *P, const struct jinja_tok *at, const char *op,
                                 struct jinja_node *l, struct jinja_node *r)
{
    struct jinja_node *n = mk(P, JN_BINARY, at);
    n->str = (struct jinja_str){op, strlen(op)};
    n->k[0] = l;
    n->k[1] = r;
    return n;
}

static struct jinja_node *parse_pow(struct parser *P)
{
    struct jinja_node *l = parse_unary(P, true);
    while (is_op(peek(P), "**")) {
        const struct jinja_tok *at = next(P);
        l = binary(P, at, "**", l, parse_unary(P, true));
    }
    return l;
}

static struct jinja_node *parse_math2(struct parser *P)
{
    static const char *const ops[] = {"*", "/", "//", "%", NULL};
    struct jinja_node *l = parse_pow(P);
    for (;;) {
        int k = 0;
        while (ops[k] && !is_op(peek(P), ops[k]))
            k++;
        if (!ops[k])
            return l;
        const struct jinja_tok *at = next(P);
        l = binary(P, at, ops[k], l, parse_pow(P));
    }
}

static struct jinja_node *parse_concat(struct parser *P)
{
    struct jinja_node *l = parse_math2(P);
    while (is_op(peek(P), "~")) {
        const struct jinja_tok *at = next(P);
        l = binary(P, at, "~", l, parse_math2(P));
    }
    return l;
}

static struct jinja_node *parse_math1(struct parser *P)
{
    struct jinja_node *l = parse_concat(P);
    while (is_op(peek(P), "+") || is_op(peek(P), "-")) {
        const struct jinja_tok *at = next(P);
        l = binary(P, at, is_op(at, "+") ? "+" : "-", l, parse_concat(P));
    }
    return l;
}

/* Chained comparisons a < b < c become (a < b) and (b < c), b evaluated twice (pure). */
static struct jinja_node *parse_compare(struct parser *P)
{
    static const char *const ops[] = {"==", "!=", "<", "<=", ">", ">=", NULL};
    struct jinja_node *l = parse_math1(P), *result = NULL;
    for (;;) {
        const struct jinja_tok *at = peek(P);
        const char *op = NULL;
        for (int k = 0; ops[k]; k++)
            if (is_op(at, ops[k]))
                op = ops[k];
        if (op) {
            next(P);
        } else if (is_name(at, "in")) {
            next(P);
            op = "in";
        } else if (is_name(at, "not") && is_name(peek2(P), "in")) {
            next(P);
            next(P);
            op = "not in";
        } else {
            return result ? result : l;
        }
        struct jinja_node *r = parse_math1(P);
        struct jinja_node *cmp = binary(P, at, op, l, r);
        if (result) {
            struct jinja_node *both = mk(P, JN_AND, at);
            both->k[0] = result;
            both->k[1] = cmp;
            result = both;
        } else {
            result = cmp;
        }
        l = r;
    }
}

static struct jinja_node *parse_not(struct parser *P)
{
    const struct jinja_tok *at = peek(P);
    if (is_name(at, "not")) {
        next(P);
        enter(P);
        struct jinja_node *n = mk(P, JN_UNARY, at);
        n->str = (struct jinja_str){"not", 3};
        n->k[0] = parse_not(P);
        P->depth--;
        return n;
    }
    return parse_compare(P);
}

static struct jinja_node *parse_and(struct parser *P)
{
    struct jinja_node *l = parse_not(P);
    while (is_name(peek(P), "and")) {
        struct jinja_node *n = mk(P, JN_AND, next(P));
        n->k[0] = l;
        n->k[1] = parse_not(P);
        l = n;
    }
    return l;
}

static struct jinja_node *parse_or(struct parser *P)
{
    struct jinja_node *l = parse_and(P);
    while (is_name(peek(P), "or")) {
        struct jinja_node *n = mk(P, JN_OR, next(P));
        n->k[0] = l;
        n->k[1] = parse_and(P);
        l = n;
    }
    return l;
}

static struct jinja_node *parse_expr(struct parser *P)
{
    enter(P);
    struct jinja_node *l = parse_or(P);
    while (is_name(peek(P), "if")) {
        struct jinja_node *n = mk(P, JN_COND, next(P));
        n->k[0] = l;
        n->k[1] = parse_or(P);
        if (accept_name(P, "else"))
            n->k[2] = parse_expr(P);
        l = n;
    }
    P->depth--;
    return l;
}

/* expr [, expr]* -> the expression or a JN_TUPLE (for set and for-iterables). */
static struct jinja_node *parse_tuple(struct parser *P, bool with_cond)
{
    const struct jinja_tok *at = peek(P);
    struct jinja_node *first = with_cond ? parse_expr(P) : parse_or(P);
    if (!is_op(peek(P), ","))
        return first;
    struct nlist l = {0};
    nl_push(P, &l, first, (struct jinja_str){0});
    while (accept_op(P, ",")) {
        if (peek(P)->type == JT_BLOCK_END || is_op(peek(P), "="))
            break;
        nl_push(P, &l, with_cond ? parse_expr(P) : parse_or(P), (struct jinja_str){0});
    }
    struct jinja_node *n = mk(P, JN_TUPLE, at);
    n->items = l.v;
    n->n_items = l.n;
    return n;
}

/* name | name.attr | name, name, ... (optionally in parentheses) */
static struct jinja_node *parse_target(struct parser *P, bool allow_attr)
{
    const struct jinja_tok *at = peek(P);
    bool paren = accept_op(P, "(");
    struct nlist l = {0};
    do {
        const struct jinja_tok *nt = peek(P);
        struct jinja_node *n = mk(P, JN_NAME, nt);
        n->str = expect_ident(P);
        if (allow_attr && !paren && l.n == 0 && accept_op(P, ".")) {
            struct jinja_node *a = mk(P, JN_ATTR, nt);
            a->k[0] = n;
            a->str = expect_ident(P);
            return a;
        }
        nl_push(P, &l, n, (struct jinja_str){0});
    } while (accept_op(P, ","));
    if (paren)
        expect_op(P, ")");
    if (l.n == 1 && !paren)
        return l.v[0];
    struct jinja_node *n = mk(P, JN_TUPLE, at);
    n->items = l.v;
    n->n_items = l.n;
    return n;
}

static void end_block(struct parser *P)
{
    expect_type(P, JT_BLOCK_END, "'%}'");
}

/* Consume "{% word %}" where word is the end word the body stopped at. */
static void expect_end(struct parser *P, const char *word)
{
    expect_type(P, JT_BLOCK_BEGIN, "'{%'");
    if (!accept_name(P, word))
        perr(P, "expected '%s'", word);
    end_block(P);
}

static struct jinja_node *parse_if(struct parser *P, const struct jinja_tok *at)
{
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    struct jinja_node *n = mk(P, JN_IF, at);
    n->k[0] = parse_tuple(P, true);
    end_block(P);
    n->k[1] = parse_body(P, ends);
    expect_type(P, JT_BLOCK_BEGIN, "'{%'");
    const struct jinja_tok *w = next(P);
    if (jinja_str_eq(w->s, "elif")) {
        enter(P);
        n->k[2] = parse_if(P, w);
        P->depth--;
        return n;
    }
    if (jinja_str_eq(w->s, "else")) {
        static const char *const ends2[] = {"endif", NULL};
        end_block(P);
        n->k[2] = parse_body(P, ends2);
        expect_end(P, "endif");
        return n;
    }
    end_block(P);
    return n;
}

static struct jinja_node *parse_for(struct parser *P, const struct jinja_tok *at)
{
    static const char *const ends[] = {"else", "endfor", NULL};
    struct jinja_node *n = mk(P, JN_FOR, at);
    n->k[0] = parse_target(P, false);
    if (!accept_name(P, "in"))
        perr(P, "%s", "expected 'in' in for loop");
    n->k[1] = parse_tuple(P, false);
    if (accept_name(P, "if"))
        n->k[4] = parse_expr(P);
    if (accept_name(P, "recursive"))
        perr(P, "%s", "recursive for loops are not supported");
    end_block(P);
    n->k[2] = parse_body(P, ends);
    expect_type(P, JT_BLOCK_BEGIN, "'{%'");
    if (accept_name(P, "else")) {
        static const char *const ends2[] = {"endfor", NULL};
        end_block(P);
        n->k[3] = parse_body(P, ends2);
        expect_end(P, "endfor");
        return n;
    }
    next(P); /* endfor */
    end_block(P);
    return n;
}

static struct jinja_node *parse_set(struct parser *P, const struct jinja_tok *at)
{
    struct jinja_node *target = parse_target(P, true);
    if (accept_op(P, "=")) {
        struct jinja_node *n = mk(P, JN_SET, at);
        n->k[0] = target;
        n->k[1] = parse_tuple(P, true);
        end_block(P);
        return n;
    }
    static const char *const ends[] = {"endset", NULL};
    if (target->kind != JN_NAME)
        perr(P, "%s", "block set needs a plain name");
    end_block(P);
    struct jinja_node *n = mk(P, JN_SET_BLOCK, at);
    n->k[0] = target;
    n->k[1] = parse_body(P, ends);
    expect_end(P, "endset");
    return n;
}

static struct jinja_node *parse_macro(struct parser *P, const struct jinja_tok *at)
{
    static const char *const ends[] = {"endmacro", NULL};
    struct jinja_node *n = mk(P, JN_MACRO, at);
    n->str = expect_ident(P);
    expect_op(P, "(");
    struct nlist params = {0}, defs = {0};
    while (!accept_op(P, ")")) {
        if (params.n)
            expect_op(P, ",");
        if (accept_op(P, ")"))
            break;
        const struct jinja_tok *pt = peek(P);
        struct jinja_node *p = mk(P, JN_NAME, pt);
        p->str = expect_ident(P);
        nl_push(P, &params, p, p->str);
        nl_push(P, &defs, accept_op(P, "=") ? parse_expr(P) : NULL, (struct jinja_str){0});
    }
    end_block(P);
    n->items = params.v;
    n->n_items = params.n;
    n->kw_vals = defs.v;
    n->n_kw = defs.n;
    n->k[0] = parse_body(P, ends);
    expect_end(P, "endmacro");
    return n;
}

static struct jinja_node *parse_statement(struct parser *P)
{
    const struct jinja_tok *at = peek(P);
    if (at->type != JT_NAME)
        perr(P, "%s", "expected a statement keyword");
    next(P);
    struct jinja_node *n;
    enter(P);
    if (jinja_str_eq(at->s, "if")) {
        n = parse_if(P, at);
    } else if (jinja_str_eq(at->s, "for")) {
        n = parse_for(P, at);
    } else if (jinja_str_eq(at->s, "set")) {
        n = parse_set(P, at);
    } else if (jinja_str_eq(at->s, "macro")) {
        n = parse_macro(P, at);
    } else if (jinja_str_eq(at->s, "break") || jinja_str_eq(at->s, "continue")) {
        n = mk(P, at->s.n == 5 ? JN_BREAK : JN_CONTINUE, at);
        end_block(P);
    } else if (jinja_str_eq(at->s, "generation")) {
        static const char *const ends[] = {"endgeneration", NULL};
        end_block(P);
        n = parse_body(P, ends);
        expect_end(P, "endgeneration");
    } else {
        P->i--;
        perr(P, "%s", "unknown or unsupported statement");
    }
    P->depth--;
    return n;
}

static bool at_end_word(struct parser *P, const char *const *ends)
{
    if (peek(P)->type != JT_BLOCK_BEGIN || !ends)
        return false;
    const struct jinja_tok *w = peek2(P);
    for (int k = 0; ends[k]; k++)
        if (is_name(w, ends[k]))
            return true;
    return false;
}

static struct jinja_node *parse_body(struct parser *P, const char *const *ends)
{
    struct jinja_node *body = mk(P, JN_BODY, peek(P));
    struct nlist l = {0};
    for (;;) {
        const struct jinja_tok *t = peek(P);
        if (t->type == JT_EOF) {
            if (ends) {
                int k = 0;
                while (ends[k + 1])
                    k++;
                perr(P, "missing '{%% %s %%}'", ends[k]);
            }
            break;
        }
        if (at_end_word(P, ends))
            break;
        next(P);
        struct jinja_node *n;
        if (t->type == JT_TEXT) {
            n = mk(P, JN_TEXT, t);
            n->str = t->s;
        } else if (t->type == JT_VAR_BEGIN) {
            n = mk(P, JN_OUTPUT, t);
            n->k[0] = parse_tuple(P, true);
            expect_type(P, JT_VAR_END, "'}}'");
        } else if (t->type == JT_BLOCK_BEGIN) {
            n = parse_statement(P);
        } else {
            P->i--;
            perr(P, "%s", "unexpected token");
        }
        nl_push(P, &l, n, (struct jinja_str){0});
    }
    body->items = l.v;
    body->n_items = l.n;
    return body;
}

struct jinja_node *jinja_parse(struct jinja_arena *a, const struct jinja_toks *toks)
{
    struct parser P = {.a = a, .t = toks->v, .n = toks->n};
    return parse_body(&P, NULL);
}

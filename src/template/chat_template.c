/*
 * chat_template - the public entry points (see chat_template.h); the interpreter itself is
 * in jinja_lex.c, jinja_parse.c, jinja_eval.c, jinja_builtins.c, jinja_methods.c,
 * jinja_strings.c and jinja_value.c.
 *
 * A struct chat_template owns a copy of the source and an arena holding the tokens and the
 * AST (tokens point into the source copy). Each render builds its own arena, so a template
 * can be rendered from several threads at once; the arena is freed before returning, after
 * the result has been copied into a wmalloc'd string.
 *
 * These functions arm the jinja_fail jmp_buf that the interpreter longjmps to on any error;
 * locals that change after setjmp() and are read after a longjmp are volatile.
 */
#include "template/chat_template.h"

#include "core/alloc.h"
#include "template/jinja.h"

#include <string.h>

struct chat_template {
    char *src;                /* copy of the source, NUL-terminated */
    size_t len;
    struct jinja_arena arena; /* tokens, AST, literals */
    struct jinja_node *root;
};

struct chat_template_opts chat_template_default_opts(void)
{
    struct chat_template_opts l = {
        .max_output = 64u << 20,
        .max_memory = 512u << 20,
        .max_steps = 50000000,
        .max_depth = 256,
    };
    return l;
}

int chat_template_parse(struct chat_template **out, const char *src, size_t len,
                        struct weld_err *e)
{
    *out = NULL;
    if (!src && len)
        return err_set(e, WELD_ERR_INVALID_ARG, "chat template: NULL source");
    struct chat_template *t = wcalloc(1, sizeof *t);
    if (!t)
        return err_set(e, WELD_ERR_NOMEM, "chat template: out of memory");
    t->src = wmalloc(len + 1);
    if (!t->src) {
        wfree(t);
        return err_set(e, WELD_ERR_NOMEM, "chat template: out of memory (%zu bytes)", len);
    }
    size_t n = 0; /* jinja2 normalises \r\n and \r to \n before lexing */
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            t->src[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n')
                i++;
        } else {
            t->src[n++] = src[i];
        }
    }
    t->src[n] = '\0';
    t->len = n;
    struct jinja_fail fail = {.e = e};
    t->arena.fail = &fail;
    int rc = setjmp(fail.jb);
    if (rc != 0) {
        err_prefix(e, "chat template");
        chat_template_free(t);
        return rc;
    }
    struct jinja_toks toks;
    jinja_lex(&t->arena, t->src, t->len, &toks);
    t->root = jinja_parse(&t->arena, &toks);
    t->arena.fail = NULL;
    *out = t;
    return WELD_OK;
}

void chat_template_free(struct chat_template *t)
{
    if (!t)
        return;
    jinja_arena_free(&t->arena);
    wfree(t->src);
    wfree(t);
}

int chat_template_render_ex(const struct chat_template *t, const json_t *context,
                            const struct chat_template_opts *opts, char **out,
                            size_t *out_len, struct weld_err *e)
{
    *out = NULL;
    if (out_len)
        *out_len = 0;
    if (!t)
        return err_set(e, WELD_ERR_INVALID_ARG, "chat template: NULL template");
    if (context && !json_is_object(context))
        return err_set(e, WELD_ERR_INVALID_ARG, "chat template: context must be a JSON object");
    /* Heap state, so nothing the interpreter changes lives in this frame's locals. */
    struct render_state {
        struct jinja_fail fail;
        struct jinja_arena arena;
        struct jinja_buf buf;
        struct jinja_ctx ctx;
    } *st = wcalloc(1, sizeof *st);
    if (!st)
        return err_set(e, WELD_ERR_NOMEM, "chat template: out of memory");
    st->fail.e = e;
    st->arena.fail = &st->fail;
    st->ctx.a = &st->arena;
    st->ctx.fail = &st->fail;
    st->ctx.out = &st->buf;
    st->ctx.lim = opts ? *opts : chat_template_default_opts();
    if (st->ctx.lim.max_depth < 8)
        st->ctx.lim.max_depth = 8;
    st->arena.limit = st->ctx.lim.max_memory;
    int rc = setjmp(st->fail.jb);
    if (rc != 0) {
        err_prefix(e, "chat template");
        jinja_arena_free(&st->arena);
        wfree(st);
        return rc;
    }
    jinja_render(&st->ctx, t->root, context);
    size_t n = st->buf.n;
    char *s = wmalloc(n + 1);
    if (s) {
        if (n)
            memcpy(s, st->buf.p, n);
        s[n] = '\0';
    }
    jinja_arena_free(&st->arena);
    wfree(st);
    if (!s)
        return err_set(e, WELD_ERR_NOMEM, "chat template: out of memory (%zu bytes)", n);
    *out = s;
    if (out_len)
        *out_len = n;
    return WELD_OK;
}

int chat_template_render(const struct chat_template *t, const json_t *context, char **out,
                         size_t *out_len, struct weld_err *e)
{
    return chat_template_render_ex(t, context, NULL, out, out_len, e);
}

static json_t *simple_context(const char *const *roles, const char *const *contents,
                              int n_messages, bool add_generation_prompt, const char *bos,
                              const char *eos)
{
    json_t *ctx = json_object(), *msgs = json_array();
    if (!ctx || !msgs || json_object_set_new(ctx, "messages", msgs) != 0) {
        json_decref(ctx);
        return NULL;
    }
    for (int i = 0; i < n_messages; i++) {
        json_t *m = json_pack("{s:s, s:s}", "role", roles[i] ? roles[i] : "",
                              "content", contents[i] ? contents[i] : "");
        if (!m || json_array_append_new(msgs, m) != 0) {
            json_decref(ctx);
            return NULL;
        }
    }
    if (json_object_set_new(ctx, "add_generation_prompt", json_boolean(add_generation_prompt)) ||
        (bos && json_object_set_new(ctx, "bos_token", json_string(bos))) ||
        (eos && json_object_set_new(ctx, "eos_token", json_string(eos)))) {
        json_decref(ctx);
        return NULL;
    }
    return ctx;
}

int chat_template_apply_simple(const char *src, const char *const *roles,
                               const char *const *contents, int n_messages,
                               bool add_generation_prompt, const char *bos, const char *eos,
                               char **out, struct weld_err *e)
{
    *out = NULL;
    if (!src || n_messages < 0 || (n_messages > 0 && (!roles || !contents)))
        return err_set(e, WELD_ERR_INVALID_ARG, "chat template: bad arguments");
    json_t *ctx = simple_context(roles, contents, n_messages, add_generation_prompt, bos, eos);
    if (!ctx)
        return err_set(e, WELD_ERR_INVALID_ARG,
                       "chat template: could not build the context (invalid UTF-8 in a "
                       "role or content?)");
    struct chat_template *t = NULL;
    int rc = chat_template_parse(&t, src, strlen(src), e);
    if (rc == WELD_OK)
        rc = chat_template_render(t, ctx, out, NULL, e);
    chat_template_free(t);
    json_decref(ctx);
    return rc;
}

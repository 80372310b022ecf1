/*
 * test_template_chat - the Jinja interpreter against independent references.
 *
 *  - reference_renders: real chat templates (llama2, llama3, llama3.1, qwen2.5, qwen3,
 *    deepseek_v3, gemma2, mistral-nemo) over ~19 conversations each, expected output made
 *    by @huggingface/jinja (tests/node/chat_template_ref.js, run as a ctest fixture into
 *    the build dir; path overridable with WELD_CHAT_TEMPLATE_REF). Byte-for-byte compare;
 *    a mismatch prints the first differing offset with both sides around it. A render
 *    that fails there must fail here the same way: raise_exception's message, or a
 *    runtime error naming the line.
 *  - jinja_cases: language features (loops, filters, tests, methods, whitespace control,
 *    printing, errors), expected output rendered by Python jinja2 configured as transformers
 *    does (tests/data/chat_jinja_cases.json); an error case checks weld's status and message.
 *  - hand-written checks: syntax errors name line and column, runtime error statuses,
 *    limits stop runaway templates, strftime_now/date_string, apply_simple, and allocation
 *    failure injection on every allocation of a parse + render.
 *  - builtins: the named --chat-template sources equal their copies in
 *    tests/data/chat_templates.json (so reference_renders covers them); chat_template_load.
 */
#include "test.h"

#include "core/alloc.h"
#include "core/json.h"
#include "template/chat_template.h"

#include <stdbool.h>
#include <string.h>

static void print_escaped(const char *label, const char *s, size_t n, size_t from, size_t to)
{
    fprintf(stderr, "    %s[%zu..%zu]: \"", label, from, to < n ? to : n);
    for (size_t i = from; i < to && i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\n')
            fputs("\\n", stderr);
        else if (c == '\t')
            fputs("\\t", stderr);
        else if (c == '"' || c == '\\')
            fprintf(stderr, "\\%c", c);
        else if (c < 0x20)
            fprintf(stderr, "\\x%02x", c);
        else
            fputc(c, stderr);
    }
    fputs("\"\n", stderr);
}

static void report_diff(const char *what, const char *exp, size_t en, const char *got, size_t gn)
{
    size_t i = 0;
    while (i < en && i < gn && exp[i] == got[i])
        i++;
    size_t from = i > 60 ? i - 60 : 0;
    fprintf(stderr, "  MISMATCH %s: first difference at byte %zu (expected %zu bytes, got %zu)\n",
            what, i, en, gn);
    print_escaped("expected", exp, en, from, i + 60);
    print_escaped("got     ", got, gn, from, i + 60);
}

/* Render src with ctx; returns status, *out set on success. */
static int render(const char *src, const json_t *ctx, char **out, size_t *len, struct weld_err *e)
{
    struct chat_template *t = NULL;
    *out = NULL;
    int rc = chat_template_parse(&t, src, strlen(src), e);
    if (rc == WELD_OK)
        rc = chat_template_render(t, ctx, out, len, e);
    chat_template_free(t);
    return rc;
}

static int render_str(const char *src, const char *ctx_json, char **out, struct weld_err *e)
{
    json_t *ctx = ctx_json ? json_loads(ctx_json, 0, NULL) : NULL;
    int rc = render(src, ctx, out, NULL, e);
    json_decref(ctx);
    return rc;
}

/* The failure a case expects: weld's status, a piece of its message (or NULL), and whether
   the message must name the template line. */
struct want_err {
    int status;
    const char *msg;
    bool line;
};

/* Compare one {template|source, context, expected | error} case; returns true if it
   passes. we: the error expected, or NULL for success. */
static bool check_case(const char *what, const char *src, const json_t *ctx, const json_t *exp,
                       const struct want_err *we, const struct chat_template_opts *opts)
{
    char *out = NULL;
    size_t len = 0;
    struct weld_err e = {0};
    struct chat_template *t = NULL;
    int rc = chat_template_parse(&t, src, strlen(src), &e);
    if (rc == WELD_OK)
        rc = chat_template_render_ex(t, ctx, opts, &out, &len, &e);
    chat_template_free(t);
    bool ok;
    if (we) {
        ok = rc == we->status && (!we->msg || strstr(e.msg, we->msg)) &&
             (!we->line || strstr(e.msg, "line "));
        if (!ok)
            fprintf(stderr, "  MISMATCH %s: expected error %d \"%s\"%s, got %d \"%s\"\n", what,
                    we->status, we->msg ? we->msg : "", we->line ? " naming the line" : "", rc,
                    rc ? e.msg : "");
    } else if (rc != WELD_OK) {
        ok = false;
        fprintf(stderr, "  MISMATCH %s: expected success, got error: %s\n", what, e.msg);
    } else {
        ok = len == json_string_length(exp) && memcmp(out, json_string_value(exp), len) == 0;
        if (!ok)
            report_diff(what, json_string_value(exp), json_string_length(exp), out, len);
    }
    wfree(out);
    return ok;
}

TEST(reference_renders)
{
    const char *path = getenv("WELD_CHAT_TEMPLATE_REF");
    if (!path)
        path = WELD_BINARY_DIR "/chat_template_ref.json";
    struct weld_err e = {0};
    json_t *doc = jload_file(path, &e);
    if (!doc)
        fprintf(stderr, "  %s\n  (made by tests/node/chat_template_ref.js; run through ctest)\n",
                e.msg);
    REQUIRE(doc);
    json_t *templates = json_object_get(doc, "templates"), *cases = json_object_get(doc, "cases");
    REQUIRE(json_is_object(templates) && json_is_array(cases));
    CHECK(json_object_size(templates) >= 4);
    CHECK(json_array_size(cases) >= 4 * 15 * 2);
    struct chat_template_opts opts = chat_template_default_opts();
    opts.now = (int64_t)json_integer_value(json_object_get(doc, "now"));
    CHECK(opts.now > 0);
    size_t i, n_fail = 0, n_run = 0, n_err = 0;
    json_t *c;
    json_array_foreach(cases, i, c) {
        if (json_object_get(c, "skip"))
            continue;
        const char *tname = json_string_value(json_object_get(c, "template"));
        const char *conv = json_string_value(json_object_get(c, "conversation"));
        const json_t *ctx = json_object_get(c, "context");
        const char *src = json_string_value(json_object_get(templates, tname ? tname : ""));
        REQUIRE(tname && conv && src && ctx);
        char what[256];
        snprintf(what, sizeof what, "%s / %s / add_generation_prompt=%s", tname, conv,
                 json_is_true(json_object_get(ctx, "add_generation_prompt")) ? "true" : "false");
        /* the template's raise_exception: that message; the interpreter's own error: a
           runtime error of weld's naming the line (its wording is @huggingface/jinja's) */
        const char *experr = json_string_value(json_object_get(c, "error"));
        const char *kind = json_string_value(json_object_get(c, "error_kind"));
        struct want_err we = {WELD_ERR_FORMAT, NULL, true};
        if (experr) {
            n_err++;
            REQUIRE(kind);
            if (strcmp(kind, "raise_exception") == 0)
                we = (struct want_err){WELD_ERR_INVALID_ARG, experr, false};
            else
                REQUIRE(strcmp(kind, "runtime") == 0);
        }
        if (!check_case(what, src, ctx, json_object_get(c, "expected"), experr ? &we : NULL,
                        &opts))
            n_fail++;
        n_run++;
    }
    printf("reference_renders: %zu cases (%zu expected errors), %zu mismatches\n", n_run, n_err,
           n_fail);
    CHECK(n_fail == 0);
    CHECK(n_run > n_err * 2);
    json_decref(doc);
}

TEST(jinja_cases)
{
    struct weld_err e = {0};
    json_t *doc = jload_file(WELD_SOURCE_DIR "/tests/data/chat_jinja_cases.json", &e);
    REQUIRE(doc);
    json_t *cases = json_object_get(doc, "cases"), *c;
    REQUIRE(json_array_size(cases) >= 50);
    size_t i, n_fail = 0;
    json_array_foreach(cases, i, c) {
        const char *src = json_string_value(json_object_get(c, "template"));
        REQUIRE(src);
        char what[128];
        snprintf(what, sizeof what, "case %zu: %.80s", i, src);
        /* "Kind: message" as jinja2 raised it: TemplateError is raise_exception's */
        const char *experr = json_string_value(json_object_get(c, "error"));
        struct want_err we = {0};
        if (experr) {
            const char *colon = strstr(experr, ": ");
            REQUIRE(colon);
            bool raised = strncmp(experr, "TemplateError:", 14) == 0;
            const char *weld_msg = json_string_value(json_object_get(c, "weld_error"));
            we = (struct want_err){raised ? WELD_ERR_INVALID_ARG : WELD_ERR_FORMAT,
                                   weld_msg ? weld_msg : colon + 2, !raised};
        }
        if (!check_case(what, src, json_object_get(c, "context"), json_object_get(c, "expected"),
                        experr ? &we : NULL, NULL))
            n_fail++;
    }
    CHECK(n_fail == 0);
    json_decref(doc);
}

static void expect_parse_error(const char *src, const char *needle)
{
    struct chat_template *t = NULL;
    struct weld_err e = {0};
    int rc = chat_template_parse(&t, src, strlen(src), &e);
    CHECK_EQ_INT(rc, WELD_ERR_FORMAT);
    CHECK(t == NULL);
    if (!strstr(e.msg, needle)) {
        fprintf(stderr, "  parse error for %s\n    message: %s\n    wanted: %s\n", src, e.msg,
                needle);
        CHECK(0);
    }
}

TEST(syntax_errors)
{
    expect_parse_error("{{ x ", "line 1, column 1: unclosed '{{'");
    expect_parse_error("a\n{% if x %}\nno end", "missing '{% endif %}'");
    expect_parse_error("line1\n  {{ 1 + }}", "line 2, column 10: expected an expression");
    expect_parse_error("{% for x in %}{% endfor %}", "line 1, column 13: expected an expression");
    expect_parse_error("{% frobnicate %}", "unknown or unsupported statement");
    expect_parse_error("\n\n   {{ 'abc }}", "line 3, column 7: unterminated string literal");
    expect_parse_error("{# never closed", "unclosed comment");
    expect_parse_error("{% if x %}{% endfor %}", "line 1");
    expect_parse_error("{{ a[1:2:3:4] }}", "too many ':'");
    expect_parse_error("{{ f(a=1, 2) }}", "positional argument after keyword");
    expect_parse_error("{% include 'x' %}", "unsupported");
    expect_parse_error("{{ 99999999999999999999 }}", "out of range");
    expect_parse_error("{% raw %}abc", "without '{% endraw %}'");
    /* deep nesting is refused, not a stack overflow */
    static char deep[20000];
    size_t k = (size_t)snprintf(deep, sizeof deep, "{{ ");
    for (int i = 0; i < 1000; i++)
        deep[k++] = '-';
    snprintf(deep + k, sizeof deep - k, "1 }}");
    expect_parse_error(deep, "nesting deeper");
    k = 0;
    for (int i = 0; i < 1000; i++)
        k += (size_t)snprintf(deep + k, sizeof deep - k, "{%% if x %%}");
    expect_parse_error(deep, "nesting deeper");
    k = (size_t)snprintf(deep, sizeof deep, "{{ ");
    for (int i = 0; i < 1000; i++)
        k += (size_t)snprintf(deep + k, sizeof deep - k, "not ");
    snprintf(deep + k, sizeof deep - k, "x }}");
    expect_parse_error(deep, "nesting deeper");
}

TEST(runtime_errors)
{
    char *out = NULL;
    struct weld_err e = {0};
    int rc = render_str("a\n{{ raise_exception('Roles must alternate') }}", "{}", &out, &e);
    CHECK_EQ_INT(rc, WELD_ERR_INVALID_ARG);
    CHECK(strstr(e.msg, "Roles must alternate") != NULL);
    CHECK(out == NULL);
    rc = render_str("x\ny\n{{ foo.bar }}", "{}", &out, &e);
    CHECK_EQ_INT(rc, WELD_ERR_FORMAT);
    CHECK(strstr(e.msg, "line 3") && strstr(e.msg, "'foo' is undefined"));
    rc = render_str("{{ 'a' + 1 }}", NULL, &out, &e);
    CHECK_EQ_INT(rc, WELD_ERR_FORMAT);
    rc = render_str("{{ x|nosuchfilter }}", "{}", &out, &e);
    CHECK_EQ_INT(rc, WELD_ERR_UNSUPPORTED);
    CHECK(strstr(e.msg, "nosuchfilter") != NULL);
    rc = render_str("{% set l = [1] %}{{ l.append(2) }}", "{}", &out, &e);
    CHECK_EQ_INT(rc, WELD_ERR_UNSUPPORTED);
    rc = render_str("{% set x.y = 1 %}", "{\"x\": {}}", &out, &e);
    CHECK_EQ_INT(rc, WELD_ERR_FORMAT);
    CHECK(strstr(e.msg, "namespace") != NULL);
    /* a bad context is rejected up front */
    struct chat_template *t = NULL;
    REQUIRE(chat_template_parse(&t, "x", 1, &e) == WELD_OK);
    json_t *arr = json_array();
    CHECK_EQ_INT(chat_template_render(t, arr, &out, NULL, &e), WELD_ERR_INVALID_ARG);
    json_decref(arr);
    chat_template_free(t);
    chat_template_free(NULL);
}

static int render_limited(const char *src, const struct chat_template_opts *lim,
                          struct weld_err *e)
{
    struct chat_template *t = NULL;
    char *out = NULL;
    int rc = chat_template_parse(&t, src, strlen(src), e);
    if (rc == WELD_OK)
        rc = chat_template_render_ex(t, NULL, lim, &out, NULL, e);
    wfree(out);
    chat_template_free(t);
    return rc;
}

TEST(limits)
{
    struct weld_err e = {0};
    struct chat_template_opts lim = chat_template_default_opts();
    lim.max_steps = 200000;
    /* nested loops that would run 10^10 iterations */
    CHECK_EQ_INT(render_limited("{% for i in range(100000) %}{% for j in range(100000) %}x"
                                "{% endfor %}{% endfor %}",
                                &lim, &e),
                 WELD_ERR_LIMIT);
    CHECK(strstr(e.msg, "steps") != NULL);
    /* unbounded recursion */
    CHECK_EQ_INT(render_limited("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", &lim, &e),
                 WELD_ERR_LIMIT);
    CHECK(strstr(e.msg, "deeper") != NULL);
    /* output size */
    lim = chat_template_default_opts();
    lim.max_output = 1000;
    CHECK_EQ_INT(render_limited("{% for i in range(2000) %}ab{% endfor %}", &lim, &e),
                 WELD_ERR_LIMIT);
    CHECK_EQ_INT(render_limited("{{ 'x' * 100000000000 }}", &lim, &e), WELD_ERR_LIMIT);
    /* memory: quadratic string growth */
    lim = chat_template_default_opts();
    lim.max_memory = 4u << 20;
    CHECK_EQ_INT(render_limited("{% set ns = namespace(s='') %}{% for i in range(100000) %}"
                                "{% set ns.s = ns.s ~ 'abcdefgh' %}{% endfor %}",
                                &lim, &e),
                 WELD_ERR_LIMIT);
    CHECK_EQ_INT(render_limited("{{ range(1000000)|length }}", NULL, &e), WELD_ERR_LIMIT);
    /* under the limits the same shapes work */
    CHECK_EQ_INT(render_limited("{% for i in range(100) %}{% for j in range(100) %}x"
                                "{% endfor %}{% endfor %}",
                                NULL, &e),
                 WELD_OK);
}

TEST(dates)
{
    char *out = NULL;
    struct weld_err e = {0};
    /* Llama 3.x: the template prefers a given date_string over strftime_now() */
    const char *llama = "{%- if not date_string is defined %}{%- set date_string = "
                        "strftime_now('%d %b %Y') %}{%- endif %}Today Date: {{ date_string }}";
    REQUIRE(render_str(llama, "{\"date_string\": \"26 Jul 2024\"}", &out, &e) == WELD_OK);
    CHECK_EQ_STR(out, "Today Date: 26 Jul 2024");
    wfree(out);
    /* a fixed clock */
    struct chat_template *t = NULL;
    REQUIRE(chat_template_parse(&t, llama, strlen(llama), &e) == WELD_OK);
    struct chat_template_opts o = chat_template_default_opts();
    o.now = 1721995200; /* 2024-07-26 12:00:00 UTC */
    REQUIRE(chat_template_render_ex(t, NULL, &o, &out, NULL, &e) == WELD_OK);
    CHECK_EQ_STR(out, "Today Date: 26 Jul 2024");
    wfree(out);
    chat_template_free(t);
    /* the real clock */
    REQUIRE(render_str("{{ strftime_now('%Y') }}|{{ strftime_now is defined }}", "{}", &out,
                       &e) == WELD_OK);
    CHECK(strlen(out) == 4 + 5 && out[0] == '2' && strcmp(out + 4, "|True") == 0);
    wfree(out);
}

TEST(apply_simple)
{
    const char *tpl = "{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content }}"
                      "{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}";
    const char *roles[] = {"system", "user"}, *contents[] = {"S", "héllo\n"};
    char *out = NULL;
    struct weld_err e = {0};
    REQUIRE(chat_template_apply_simple(tpl, roles, contents, 2, true, "<s>", NULL, &out, &e) ==
            WELD_OK);
    CHECK_EQ_STR(out, "<s><system>S<user>héllo\n<assistant>");
    wfree(out);
    REQUIRE(chat_template_apply_simple(tpl, roles, contents, 0, false, NULL, NULL, &out, &e) ==
            WELD_OK);
    CHECK_EQ_STR(out, "");
    wfree(out);
    CHECK_EQ_INT(chat_template_apply_simple("{% if %}", roles, contents, 2, true, NULL, NULL, &out,
                                            &e),
                 WELD_ERR_FORMAT);
}

/* Every allocation of a parse + render fails in turn: each must end in NOMEM (or succeed)
 * and free what it took (ASan builds check the leaks). */
TEST(alloc_failures)
{
    const char *tpl = "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
                      "{{ m.role|upper ~ ':' ~ m.content|trim }}{% endfor %}{{ ns.n }}";
    json_t *ctx = json_loads("{\"messages\": [{\"role\": \"user\", \"content\": \" hi \"}]}", 0,
                             NULL);
    REQUIRE(ctx);
    int n_nomem = 0;
    for (long k = 1; k < 40; k++) {
        struct weld_err e = {0};
        char *out = NULL;
        alloc_fail_at(k);
        int rc = render(tpl, ctx, &out, NULL, &e);
        alloc_fail_at(0);
        CHECK(rc == WELD_OK || rc == WELD_ERR_NOMEM);
        if (rc == WELD_OK)
            CHECK_EQ_STR(out, "USER:hi1");
        n_nomem += rc == WELD_ERR_NOMEM;
        wfree(out);
    }
    CHECK(n_nomem >= 3);
    json_decref(ctx);
}

/* The builtin --chat-template sources equal the copies in tests/data/chat_templates.json
 * (which reference_renders compares against @huggingface/jinja), and chat_template_load
 * takes a file first, then a builtin name, and names both when neither fits. */
TEST(builtins)
{
    static const char *const refs[][2] = {
        {"chatml", "chatml"},          {"llama2", "llama2"}, {"llama3", "llama3-instruct"},
        {"mistral", "mistral-instruct"}, {"qwen", "qwen2.5"}, {"gemma", "gemma2"},
    };
    struct weld_err e = {0};
    json_t *doc = jload_file(WELD_SOURCE_DIR "/tests/data/chat_templates.json", &e);
    REQUIRE(doc);
    json_t *templates = json_object_get(doc, "templates");
    int n = 0;
    while (chat_template_builtin_name(n))
        n++;
    CHECK_EQ_INT(n, (int)(sizeof refs / sizeof refs[0]));
    for (int i = 0; i < n; i++) {
        const char *name = chat_template_builtin_name(i);
        CHECK_EQ_STR(name, refs[i][0]);
        CHECK(strstr(chat_template_builtin_names(), name) != NULL);
        const char *want =
            json_string_value(json_object_get(json_object_get(templates, refs[i][1]), "source"));
        REQUIRE(want);
        CHECK_EQ_STR(chat_template_builtin(name), want);
        char *src = NULL;
        CHECK_EQ_INT(chat_template_load(name, &src, &e), WELD_OK);
        CHECK_EQ_STR(src, want);
        wfree(src);
    }
    CHECK(chat_template_builtin("nope") == NULL && chat_template_builtin_name(-1) == NULL);
    json_decref(doc);

    char *src = NULL;
    CHECK_EQ_INT(chat_template_load("no-such-template", &src, &e), WELD_ERR_NOT_FOUND);
    CHECK(src == NULL);
    CHECK(strstr(e.msg, "no-such-template") && strstr(e.msg, "chatml, llama2"));
    char path[512];
    snprintf(path, sizeof path, "%s/builtin_test.jinja", WELD_BINARY_DIR);
    FILE *f = fopen(path, "wb");
    REQUIRE(f);
    fputs("{% for m in messages %}[{{ m.content }}]{% endfor %}", f);
    fclose(f);
    REQUIRE(chat_template_load(path, &src, &e) == WELD_OK);
    CHECK_EQ_STR(src, "{% for m in messages %}[{{ m.content }}]{% endfor %}");
    wfree(src);
    f = fopen(path, "wb");
    REQUIRE(f);
    fputs("{% for m in messages %}", f);
    fclose(f);
    CHECK_EQ_INT(chat_template_load(path, &src, &e), WELD_ERR_FORMAT);
    CHECK(src == NULL && strstr(e.msg, "builtin_test.jinja") && strstr(e.msg, "line 1"));
    remove(path);
}

int main(void)
{
    RUN(reference_renders);
    RUN(jinja_cases);
    RUN(syntax_errors);
    RUN(runtime_errors);
    RUN(limits);
    RUN(dates);
    RUN(apply_simple);
    RUN(alloc_failures);
    RUN(builtins);
    return test_summary();
}

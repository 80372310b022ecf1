/*
 * chat_template - a Jinja2 interpreter for Hugging Face chat templates.
 *
 * Models ship their chat format as a Jinja2 template (tokenizer_config.json "chat_template",
 * GGUF key tokenizer.chat_template). chat_template_parse() compiles the source once into an
 * AST; chat_template_render() evaluates it against a Jansson object (messages,
 * add_generation_prompt, bos_token, eos_token, tools, ...) and returns the rendered bytes.
 *
 * Semantics follow Python jinja2 as transformers configures it: trim_blocks=True,
 * lstrip_blocks=True, the loopcontrols extension (break/continue), jinja2's default
 * Undefined (prints as "", falsy, `is defined` false, attribute access on it is an error),
 * Python value printing (True, None, ['a', 1]) and transformers' globals raise_exception()
 * and strftime_now(). tojson writes like json.dumps(ensure_ascii=False) (", " and ": ").
 * Dates: Llama 3.x templates use a "date_string" context variable when it is defined and
 * call strftime_now() otherwise; callers wanting reproducible output pass date_string, or
 * fix the clock with chat_template_opts.now (which also covers templates such as gpt-oss
 * that call strftime_now() unconditionally).
 *
 * Supported: text, {{ }}, {% %}, {# #}, whitespace control (- and +), raw, if/elif/else,
 * for (tuple targets, `if` filter, else, loop.*), set (names, tuples, namespace attributes,
 * block set), macro (positional/keyword args with defaults), break/continue, generation
 * (rendered as plain body), expressions (literals, lists, tuples, dicts, attribute/item
 * access, slices, calls, filters, tests, arithmetic, comparisons, in, and/or/not, ~,
 * conditional expressions) and the filters, tests and str/list/dict methods real templates
 * use. Not supported: include/extends/import, call blocks, filter blocks, recursive loops,
 * autoescape, str.format, integers beyond 64 bits (an error, not a bigint), macros closing
 * over loop variables. Markup is modelled only as far as templates use it ('x'|safe + y
 * escapes y).
 *
 * Limits (struct chat_template_opts) bound output size, evaluation steps, recursion depth
 * and memory so that no template can hang or exhaust the process; exceeding one returns
 * WELD_ERR_LIMIT. A parsed template is immutable: concurrent renders are safe.
 *
 * This module (template/) knows only core/: it never sees a tokenizer. The seam is text:
 * callers fetch the source (tokenizer_chat_template(), a file, a builtin) and put
 * bos_token/eos_token into the context as strings; tokenizing the result is theirs.
 */
#ifndef WELD_TEMPLATE_CHAT_TEMPLATE_H
#define WELD_TEMPLATE_CHAT_TEMPLATE_H

#include "core/err.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct chat_template;

struct chat_template_opts {
    size_t max_output; /* bytes of rendered output (and of any one string) */
    size_t max_memory; /* bytes of scratch values alive during one render */
    long max_steps;    /* expression/statement evaluations and items iterated */
    int max_depth;     /* nesting of evaluation (macro recursion included) */
    int64_t now;       /* strftime_now() clock, seconds since the epoch in UTC; 0 = the real
                          clock in local time, as transformers' datetime.now() */
};

/* The defaults: 64 MiB output, 512 MiB memory, 50M steps, depth 256, real clock. */
struct chat_template_opts chat_template_default_opts(void);

/* Compile src (len bytes, need not be NUL-terminated). Syntax errors return WELD_ERR_FORMAT
 * with "line L, column C: ..." in the message. */
int chat_template_parse(struct chat_template **out, const char *src, size_t len,
                        struct weld_err *e);
void chat_template_free(struct chat_template *t);

/* Render with `context` (a JSON object, may be NULL). *out is NUL-terminated, allocated
 * with wmalloc (free with wfree); *out_len (may be NULL) gets its length. Errors:
 * raise_exception() -> WELD_ERR_INVALID_ARG with the template's message; type and
 * undefined errors -> WELD_ERR_FORMAT naming the line; limits -> WELD_ERR_LIMIT. */
int chat_template_render(const struct chat_template *t, const json_t *context, char **out,
                         size_t *out_len, struct weld_err *e);
int chat_template_render_ex(const struct chat_template *t, const json_t *context,
                            const struct chat_template_opts *opts, char **out,
                            size_t *out_len, struct weld_err *e);

/* Parse and render in one call for plain {role, content} conversations. bos/eos may be NULL
 * (then left undefined). */
int chat_template_apply_simple(const char *src, const char *const *roles,
                               const char *const *contents, int n_messages,
                               bool add_generation_prompt, const char *bos, const char *eos,
                               char **out, struct weld_err *e);

/* Well-known templates by name (chat_builtin.c): "chatml", "llama2", "llama3", "mistral",
 * "qwen", "gemma". chat_template_builtin returns the source or NULL; _name(i) the i-th name
 * (NULL past the end); _names all of them, comma-separated, for messages. */
const char *chat_template_builtin(const char *name);
const char *chat_template_builtin_name(int i);
const char *chat_template_builtin_names(void);
/* "--chat-template FILE|NAME": an existing file's text, else the named builtin; parsed once
 * to check it. *src is wmalloc'd. Errors name the argument (and list the builtin names when
 * it is neither a file nor a name). */
int chat_template_load(const char *file_or_name, char **src, struct weld_err *e);

#endif

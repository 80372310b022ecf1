/*
 * openai_chat - chat messages -> prompt text -> token ids, for /v1/chat/completions and
 * POST /tokenize with "messages".
 *
 * Messages are validated and normalized before the template sees them: each is an object
 * with a role among system, developer, user, assistant and tool, and a content that is a
 * string, null (an assistant turn carrying tool_calls) or a list of {"type": "text",
 * "text": ...} parts, joined with "\n" into one string (vLLM's "string" content format,
 * which every text-only template understands); null (an assistant turn that only calls
 * tools) becomes "", as templates test content as a string. Other keys (name, tool_calls,
 * tool_call_id) pass through, tool calls' JSON-text arguments as objects (as templates
 * expect them). A part of another type is refused with 400: this
 * server has no image or audio input.
 *
 * The template context: messages, add_generation_prompt (default true; a request may set
 * it), bos_token and eos_token (the tokenizer's texts), tools when the request has them,
 * and the keys of chat_template_kwargs. The rendered text is tokenized with special tokens
 * parsed; the tokenizer's own BOS is added only when the text does not already start with
 * the BOS text, so a template that writes BOS never yields two.
 */
#include "server/openai.h"

#include "core/alloc.h"
#include "template/chat_template.h"
#include "tokenizer/tokenizer.h"

#include <limits.h>
#include <string.h>

static bool role_ok(const char *r)
{
    static const char *const roles[] = {"system", "developer", "user", "assistant", "tool"};
    for (size_t i = 0; i < sizeof roles / sizeof roles[0]; i++)
        if (!strcmp(r, roles[i]))
            return true;
    return false;
}

/* Join a list of text parts into one string; NULL + e on a bad part. */
static json_t *join_parts(const json_t *parts, size_t mi, struct server_error *e)
{
    size_t total = 0;
    for (size_t k = 0; k < json_array_size(parts); k++) {
        const json_t *p = json_array_get(parts, k);
        const json_t *ty = json_object_get(p, "type");
        const json_t *tx = json_object_get(p, "text");
        if (!json_is_object(p) || !json_is_string(ty) || strcmp(json_string_value(ty), "text")) {
            server_error_set(e, 400, "messages", "field 'messages[%zu].content[%zu]': only "
                             "{\"type\": \"text\"} parts are supported", mi, k);
            return NULL;
        }
        if (!json_is_string(tx)) {
            server_error_set(e, 400, "messages", "field 'messages[%zu].content[%zu].text': "
                             "expected a string", mi, k);
            return NULL;
        }
        total += json_string_length(tx) + 1;
    }
    char *buf = wmalloc(total + 1), *w = buf;
    if (!buf) {
        server_error_set(e, 500, NULL, "out of memory");
        return NULL;
    }
    for (size_t k = 0; k < json_array_size(parts); k++) {
        const json_t *tx = json_object_get(json_array_get(parts, k), "text");
        if (k)
            *w++ = '\n';
        memcpy(w, json_string_value(tx), json_string_length(tx));
        w += json_string_length(tx);
    }
    json_t *s = json_stringn(buf, (size_t)(w - buf));
    wfree(buf);
    if (!s)
        server_error_set(e, 400, "messages", "field 'messages[%zu].content': not valid UTF-8",
                         mi);
    return s;
}

/* An assistant turn's tool calls carry their arguments as JSON text (OpenAI's shape);
   templates expect the object (Hugging Face's, and vLLM hands them over so): each
   function.arguments that parses as a JSON object replaces its text. */
static void args_to_objects(json_t *calls)
{
    size_t i;
    json_t *tc;
    json_array_foreach(calls, i, tc)
    {
        json_t *fn = json_object_get(tc, "function");
        const json_t *a = json_object_get(fn, "arguments");
        if (!json_is_string(a))
            continue;
        json_t *o = json_loads(json_string_value(a), 0, NULL);
        if (json_is_object(o))
            json_object_set_new(fn, "arguments", o);
        else
            json_decref(o);
    }
}

/* A normalized deep copy of messages, or NULL + e. */
static json_t *normalize(const json_t *msgs, struct server_error *e)
{
    if (!json_is_array(msgs) || json_array_size(msgs) == 0) {
        server_error_set(e, 400, "messages", "field 'messages': expected a non-empty array of "
                         "message objects");
        return NULL;
    }
    json_t *out = json_array();
    for (size_t i = 0; i < json_array_size(msgs); i++) {
        const json_t *m = json_array_get(msgs, i);
        const json_t *role = json_object_get(m, "role");
        if (!json_is_object(m) || !json_is_string(role) || !role_ok(json_string_value(role))) {
            server_error_set(e, 400, "messages", "field 'messages[%zu].role': expected one of "
                             "system, developer, user, assistant, tool", i);
            goto fail;
        }
        json_t *c = json_deep_copy(m);
        json_array_append_new(out, c);
        args_to_objects(json_object_get(c, "tool_calls"));
        const json_t *content = json_object_get(m, "content");
        if (content && json_is_null(content)) { /* templates test it as a string */
            json_object_set_new(c, "content", json_string(""));
            continue;
        }
        if (!content || json_is_string(content))
            continue;
        if (!json_is_array(content)) {
            server_error_set(e, 400, "messages", "field 'messages[%zu].content': expected a "
                             "string, null or a list of text parts", i);
            goto fail;
        }
        json_t *joined = join_parts(content, i, e);
        if (!joined)
            goto fail;
        json_object_set_new(c, "content", joined);
    }
    return out;
fail:
    json_decref(out);
    return NULL;
}

static int context_extras(json_t *ctx, const json_t *extra, struct server_error *e)
{
    if (!extra)
        return 0;
    const json_t *agp = json_object_get(extra, "add_generation_prompt");
    if (agp && !json_is_null(agp)) {
        if (!json_is_boolean(agp))
            return server_error_set(e, 400, "add_generation_prompt",
                                    "field 'add_generation_prompt': expected a boolean");
        json_object_set(ctx, "add_generation_prompt", (json_t *)agp);
    }
    const json_t *tools = json_object_get(extra, "tools");
    if (json_is_array(tools))
        json_object_set_new(ctx, "tools", json_deep_copy(tools));
    const json_t *kw = json_object_get(extra, "chat_template_kwargs");
    if (kw && !json_is_null(kw)) {
        if (!json_is_object(kw))
            return server_error_set(e, 400, "chat_template_kwargs",
                                    "field 'chat_template_kwargs': expected an object");
        const char *k;
        const json_t *v;
        json_object_foreach((json_t *)kw, k, v)
            if (strcmp(k, "messages"))
                json_object_set_new(ctx, k, json_deep_copy(v));
    }
    return 0;
}

int server_chat_render(const struct server_model *m, const json_t *messages,
                       const json_t *extra, char **out, struct server_error *e)
{
    *out = NULL;
    if (!m->tmpl)
        return server_error_set(e, 400, "messages", "this model has no chat template; start "
                                "the server with --chat-template FILE or use /v1/completions");
    json_t *msgs = normalize(messages, e);
    if (!msgs)
        return e->http;
    json_t *ctx = json_object();
    json_object_set_new(ctx, "messages", msgs);
    json_object_set_new(ctx, "add_generation_prompt", json_true());
    const char *bos = m->tok ? tokenizer_bos_text(m->tok) : NULL;
    const char *eos = m->tok ? tokenizer_eos_text(m->tok) : NULL;
    if (bos)
        json_object_set_new(ctx, "bos_token", json_string(bos));
    if (eos)
        json_object_set_new(ctx, "eos_token", json_string(eos));
    int rc = context_extras(ctx, extra, e);
    struct weld_err we = {0};
    if (!rc && chat_template_render(m->tmpl, ctx, out, NULL, &we)) {
        wfree(*out);
        *out = NULL;
        rc = server_error_set(e, we.status == WELD_ERR_NOMEM ? 500 : 400, "messages",
                              "chat template: %s", we.msg);
    }
    json_decref(ctx);
    return rc;
}

int server_chat_encode(const struct server_model *m, const char *text, int32_t **ids,
                       int *n_ids, struct server_error *e)
{
    *ids = NULL;
    *n_ids = 0;
    if (!m->tok)
        return server_error_set(e, 400, "messages", "this model has no tokenizer");
    const char *bos = tokenizer_bos_text(m->tok);
    bool add_special = !(bos && *bos && !strncmp(text, bos, strlen(bos)));
    size_t n = 0;
    struct weld_err we = {0};
    if (tokenizer_encode(m->tok, text, strlen(text), add_special, true, ids, &n, &we)) {
        wfree(*ids);
        *ids = NULL;
        return server_error_set(e, 400, "messages", "messages: %s", we.msg);
    }
    if (n == 0 || n > INT_MAX) {
        wfree(*ids);
        *ids = NULL;
        return server_error_set(e, 400, "messages", "messages: render to %zu tokens", n);
    }
    *n_ids = (int)n;
    return 0;
}

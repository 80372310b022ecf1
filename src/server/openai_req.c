/*
 * openai_req - request bodies of /v1/completions and /v1/chat/completions -> struct
 * server_req (see openai.h for the accepted shapes and the vLLM defaults).
 *
 * Order of work: the body must be an object; "model" must name the served model (404
 * otherwise, OpenAI's model_not_found); the api-specific types (logprobs int vs bool,
 * stream_options, echo) and logit_bias's OpenAI ranges (ids in the vocabulary, biases in
 * [-100, 100]) are checked here; the remaining sampling fields go
 * through batch_request_parse() on a shallow copy of the body without "prompt" and
 * "messages" (that copy, server_req.fields, keeps the strings bl points into alive). Then
 * the prompts: completions accept a string, a list of strings, a list of token ids or a
 * list of such lists; chat renders "messages". Each prompt is tokenized, its ids checked
 * against the vocabulary, and its length against max_model_len together with max_tokens.
 * Finally request_params_check() runs on the result with the first prompt's ids, so the
 * engine will not refuse what was accepted here (except for a KV pool too small for the
 * prompt, which the engine reports and the caller turns into a 400).
 *
 * Fields weld does not implement but that would change the output are refused by
 * batch_request_parse (the same table `weld batch` uses), naming the field; unknown
 * harmless ones are logged in one warning line per request, as vLLM does.
 *
 * Messages from lower layers look like "line 0: field 'stop[1]': expected a string" or
 * "max_tokens: 0, must be at least 1"; the "line 0: " prefix is cut and the parameter is
 * taken from the field name or the leading word for the error's "param".
 */
#include "server/openai.h"
#include "server/server.h"

#include "core/alloc.h"
#include "core/log.h"
#include "httpd/httpd.h"
#include "template/chat_template.h"
#include "tokenizer/tokenizer.h"

#include <ctype.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int server_error_set(struct server_error *e, int http, const char *param, const char *fmt, ...)
{
    e->http = http;
    e->type = httpd_error_type(http);
    e->code = httpd_error_code(http);
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    return http;
}

json_t *server_error_json(const struct server_error *e)
{
    return httpd_error_json(e->http, e->type ? e->type : "invalid_request_error", e->param,
                            e->code ? e->code : "", e->msg);
}

/* A lower layer's message -> 400 with the parameter it names. */
static int from_weld_err(struct server_error *e, const struct weld_err *we)
{
    const char *m = we->msg;
    if (!strncmp(m, "line ", 5)) {
        const char *c = strstr(m, ": ");
        if (c)
            m = c + 2;
    }
    char param[64] = "";
    const char *f = strstr(m, "field '");
    size_t n = 0;
    if (f) {
        f += 7;
        while (f[n] && f[n] != '\'' && f[n] != '[' && f[n] != '.' && n < sizeof param - 1)
            n++;
    } else {
        f = m;
        bool smp = !strncmp(f, "sampler: ", 9); /* "sampler: top_p 0 must be ..." */
        if (smp)
            f += 9;
        while (f[n] && (isalnum((unsigned char)f[n]) || f[n] == '_') && n < sizeof param - 1)
            n++;
        if (f[n] != ':' && f[n] != '[' && !(smp && f[n] == ' '))
            n = 0;
    }
    memcpy(param, f, n);
    param[n] = 0;
    int http = we->status == WELD_ERR_NOMEM || we->status == WELD_ERR_INTERNAL ? 500 : 400;
    return server_error_set(e, http, param, "%s", m);
}

/* ---- api-specific fields ---------------------------------------------------------------- */

static int check_model(const json_t *body, const struct server_model *m, struct server_req *r,
                       struct server_error *e)
{
    const json_t *mv = json_object_get(body, "model");
    snprintf(r->model, sizeof r->model, "%s", m->name);
    if (!mv || json_is_null(mv))
        return 0;
    if (!json_is_string(mv))
        return server_error_set(e, 400, "model", "field 'model': expected a string");
    const char *s = json_string_value(mv);
    if (strcmp(s, m->name) && !(m->path && !strcmp(s, m->path)))
        return server_error_set(e, 404, "model", "The model `%s` does not exist.", s);
    return 0;
}

static int check_bool(const json_t *body, const char *key, bool *out, struct server_error *e)
{
    const json_t *v = json_object_get(body, key);
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_boolean(v))
        return server_error_set(e, 400, key, "field '%s': expected a boolean", key);
    *out = json_is_true(v);
    return 0;
}

static int check_logit_bias(const json_t *body, int n_vocab, struct server_error *e)
{
    const json_t *lb = json_object_get(body, "logit_bias");
    if (!lb || json_is_null(lb))
        return 0;
    if (!json_is_object(lb))
        return server_error_set(e, 400, "logit_bias", "field 'logit_bias': expected an object "
                                "mapping token ids to numbers");
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)lb, k, v) {
        char *end;
        long id = strtol(k, &end, 10);
        if (end == k || *end || id < 0 || id >= n_vocab)
            return server_error_set(e, 400, "logit_bias", "field 'logit_bias': key '%s' is "
                                    "not a token id in [0, %d)", k, n_vocab);
        if (!json_is_number(v) || json_number_value(v) < -100 || json_number_value(v) > 100)
            return server_error_set(e, 400, "logit_bias", "field 'logit_bias[%s]': expected "
                                    "a number in [-100, 100]", k);
    }
    return 0;
}

static int api_fields(const json_t *body, const struct server_model *m, struct server_req *r,
                      struct server_error *e)
{
    int rc;
    if ((rc = check_model(body, m, r, e)) || (rc = check_bool(body, "stream", &r->stream, e)) ||
        (rc = check_logit_bias(body, m->n_vocab, e)))
        return rc;
    const json_t *so = json_object_get(body, "stream_options");
    if (so && !json_is_null(so)) {
        if (!json_is_object(so))
            return server_error_set(e, 400, "stream_options",
                                    "field 'stream_options': expected an object");
        if ((rc = check_bool(so, "include_usage", &r->include_usage, e)))
            return rc;
    }
    const json_t *lp = json_object_get(body, "logprobs");
    const json_t *tlp = json_object_get(body, "top_logprobs");
    if (r->api == SERVER_API_COMPLETIONS) {
        if ((rc = check_bool(body, "echo", &r->echo, e)))
            return rc;
        if (lp && !json_is_null(lp) && !json_is_integer(lp))
            return server_error_set(e, 400, "logprobs",
                                    "field 'logprobs': expected an integer (completions)");
    } else {
        if (json_is_true(json_object_get(body, "echo")))
            return server_error_set(e, 400, "echo", "field 'echo': not supported for chat "
                                    "completions");
        if (lp && !json_is_null(lp) && !json_is_boolean(lp))
            return server_error_set(e, 400, "logprobs",
                                    "field 'logprobs': expected a boolean (chat)");
        if (tlp && !json_is_null(tlp) && !json_is_integer(tlp))
            return server_error_set(e, 400, "top_logprobs",
                                    "field 'top_logprobs': expected an integer");
        if (tlp && json_is_integer(tlp) && !json_is_true(lp))
            return server_error_set(e, 400, "top_logprobs",
                                    "field 'top_logprobs': needs logprobs: true");
    }
    return 0;
}

/* ---- prompts ------------------------------------------------------------------------------ */

static int add_prompt(struct server_req *r, int32_t *ids, int n_ids, char *text, size_t len,
                      struct server_error *e)
{
    struct server_prompt *np = wrealloc(r->prompts, (size_t)(r->n_prompts + 1) * sizeof *np);
    if (!np) {
        wfree(ids);
        wfree(text);
        return server_error_set(e, 500, NULL, "out of memory");
    }
    r->prompts = np;
    np[r->n_prompts++] = (struct server_prompt){ids, n_ids, text, len};
    return 0;
}

static int text_prompt(struct server_req *r, const struct server_model *m, const char *s,
                       size_t len, const char *param, struct server_error *e)
{
    if (!m->tok)
        return server_error_set(e, 400, "prompt", "%s: this model has no tokenizer; send "
                                "token ids", param);
    int32_t *ids = NULL;
    size_t n = 0;
    struct weld_err we = {0};
    if (tokenizer_encode(m->tok, s, len, r->bl.p.add_special_tokens, true, &ids, &n, &we)) {
        wfree(ids);
        return server_error_set(e, we.status == WELD_ERR_NOMEM ? 500 : 400, "prompt", "%s: %s",
                                param, we.msg);
    }
    if (n == 0 || n > INT_MAX) {
        wfree(ids);
        return server_error_set(e, 400, "prompt", "%s: encodes to %zu tokens", param, n);
    }
    char *t = wstrndup(s, len);
    if (!t) {
        wfree(ids);
        return server_error_set(e, 500, NULL, "out of memory");
    }
    return add_prompt(r, ids, (int)n, t, len, e);
}

int server_token_ids(const struct server_model *m, const json_t *a, const char *param,
                     const char *where, int32_t **out, size_t *n_out, struct server_error *e)
{
    size_t n = json_array_size(a);
    if (n == 0)
        return server_error_set(e, 400, param, "%s: empty list of token ids", where);
    if (n > INT_MAX)
        return server_error_set(e, 400, param, "%s: too many token ids", where);
    int32_t *ids = wmalloc(n * sizeof *ids);
    if (!ids)
        return server_error_set(e, 500, NULL, "out of memory");
    for (size_t i = 0; i < n; i++) {
        const json_t *v = json_array_get(a, i);
        json_int_t x = json_is_integer(v) ? json_integer_value(v) : -1;
        if (x < 0 || x >= m->n_vocab) {
            wfree(ids);
            return server_error_set(e, 400, param, "%s[%zu]: not a token id in [0, %d)",
                                    where, i, m->n_vocab);
        }
        ids[i] = (int32_t)x;
    }
    *out = ids;
    *n_out = n;
    return 0;
}

static int ids_prompt(struct server_req *r, const struct server_model *m, const json_t *a,
                      const char *param, struct server_error *e)
{
    int32_t *ids;
    size_t n;
    int rc = server_token_ids(m, a, "prompt", param, &ids, &n, e);
    if (rc)
        return rc;
    char *text = NULL;
    size_t len = 0;
    if (m->tok && tokenizer_decode(m->tok, ids, n, false, &text, &len, NULL))
        text = NULL;
    if (!text && !(text = wstrdup(""))) {
        wfree(ids);
        return server_error_set(e, 500, NULL, "out of memory");
    }
    return add_prompt(r, ids, (int)n, text, len, e);
}

static bool all_of(const json_t *a, int (*pred)(const json_t *))
{
    for (size_t i = 0; i < json_array_size(a); i++)
        if (!pred(json_array_get(a, i)))
            return false;
    return true;
}
static int is_int(const json_t *v) { return json_is_integer(v); }
static int is_str(const json_t *v) { return json_is_string(v); }
static int is_arr(const json_t *v) { return json_is_array(v); }

static int completion_prompts(const json_t *body, const struct server_model *m,
                              struct server_req *r, struct server_error *e)
{
    const json_t *pr = json_object_get(body, "prompt");
    char param[48];
    if (json_is_string(pr))
        return text_prompt(r, m, json_string_value(pr), json_string_length(pr), "prompt", e);
    if (!json_is_array(pr) || json_array_size(pr) == 0)
        return server_error_set(e, 400, "prompt", "field 'prompt': expected a string, a "
                                "non-empty list of strings, token ids or lists of token ids");
    if (all_of(pr, is_int))
        return ids_prompt(r, m, pr, "prompt", e);
    if (json_array_size(pr) > SERVER_MAX_CHOICES)
        return server_error_set(e, 400, "prompt", "field 'prompt': %zu prompts, at most %d",
                                json_array_size(pr), SERVER_MAX_CHOICES);
    bool strs = all_of(pr, is_str), arrs = all_of(pr, is_arr);
    if (!strs && !arrs)
        return server_error_set(e, 400, "prompt", "field 'prompt': a list must hold only "
                                "strings, only token ids or only lists of token ids");
    for (size_t i = 0; i < json_array_size(pr); i++) {
        const json_t *v = json_array_get(pr, i);
        snprintf(param, sizeof param, "prompt[%zu]", i);
        int rc = strs ? text_prompt(r, m, json_string_value(v), json_string_length(v), param, e)
                      : ids_prompt(r, m, v, param, e);
        if (rc)
            return rc;
    }
    return 0;
}

static int chat_prompt(const json_t *body, const struct server_model *m, struct server_req *r,
                       struct server_error *e)
{
    char *text = NULL;
    int32_t *ids = NULL;
    int n = 0;
    int rc = server_chat_render(m, json_object_get(body, "messages"), body, &text, e);
    if (!rc)
        rc = server_chat_encode(m, text, &ids, &n, e);
    if (rc) {
        wfree(text);
        return rc;
    }
    return add_prompt(r, ids, n, text, strlen(text), e);
}

/* max_tokens default and the context limit (vLLM's wording). */
static int check_lengths(const json_t *body, const struct server_model *m, struct server_req *r,
                         struct server_error *e)
{
    bool given = (json_is_integer(json_object_get(body, "max_tokens")) ||
                  json_is_integer(json_object_get(body, "max_completion_tokens")));
    int longest = 0;
    for (int i = 0; i < r->n_prompts; i++)
        if (r->prompts[i].n_ids > longest)
            longest = r->prompts[i].n_ids;
    const char *what = r->api == SERVER_API_CHAT ? "messages" : "prompt";
    if (longest >= m->max_model_len)
        return server_error_set(e, 400, what, "This model's maximum context length is %d "
                                "tokens. However, your %s has %d tokens, leaving no room for "
                                "the completion. Please reduce the length of the %s.",
                                m->max_model_len, what, longest, what);
    int room = m->max_model_len - longest;
    if (!given) {
        r->bl.p.max_tokens = r->api == SERVER_API_CHAT ? room : (room < 16 ? room : 16);
        return 0;
    }
    if (r->bl.p.max_tokens >= 1 && (int64_t)longest + r->bl.p.max_tokens > m->max_model_len)
        return server_error_set(e, 400, "max_tokens", "This model's maximum context length "
                                "is %d tokens. However, you requested %lld tokens (%d in the "
                                "%s, %d in the completion). Please reduce the length of the "
                                "%s or completion.", m->max_model_len,
                                (long long)longest + r->bl.p.max_tokens, longest, what,
                                r->bl.p.max_tokens, what);
    return 0;
}

/* kv_transfer_params, vLLM's shape for disaggregated prefill: {"do_remote_decode": true}
   from the router to a prefill server, {"do_remote_prefill": true, "remote_num_tokens": N,
   ...} (the prefill server's answer) to a decode server. Other keys (remote_engine_id,
   remote_block_hash, ...) are the handle's and pass unread. */
static int kv_transfer_params(const json_t *body, const struct server_model *m,
                              struct server_req *r, struct server_error *e)
{
    const json_t *kt = json_object_get(body, "kv_transfer_params");
    if (!kt || json_is_null(kt))
        return 0;
    if (!json_is_object(kt))
        return server_error_set(e, 400, "kv_transfer_params",
                                "field 'kv_transfer_params': expected an object");
    const json_t *d = json_object_get(kt, "do_remote_decode");
    const json_t *p = json_object_get(kt, "do_remote_prefill");
    const json_t *n = json_object_get(kt, "remote_num_tokens");
    if ((d && !json_is_boolean(d)) || (p && !json_is_boolean(p)) ||
        (n &&
         (!json_is_integer(n) || json_integer_value(n) < 0 || json_integer_value(n) > INT32_MAX)))
        return server_error_set(e, 400, "kv_transfer_params",
                                "field 'kv_transfer_params': do_remote_decode and "
                                "do_remote_prefill must be booleans, remote_num_tokens an "
                                "integer >= 0");
    r->kv_remote_decode = json_is_true(d);
    r->kv_remote_prefill = json_is_true(p);
    r->kv_remote_tokens = n ? (int)json_integer_value(n) : 0;
    if (r->kv_remote_decode && r->kv_remote_prefill)
        return server_error_set(e, 400, "kv_transfer_params",
                                "field 'kv_transfer_params': do_remote_decode and "
                                "do_remote_prefill both set");
    if (r->kv_remote_decode && m->kv_role != SERVER_KV_PRODUCER && m->kv_role != SERVER_KV_BOTH)
        return server_error_set(e, 400, "kv_transfer_params",
                                "kv_transfer_params.do_remote_decode: this server is not a KV "
                                "producer (start it with --kv-transfer-config "
                                "'{\"kv_role\": \"kv_producer\"}' and a --kv-store)");
    if (r->kv_remote_prefill && m->kv_role != SERVER_KV_CONSUMER && m->kv_role != SERVER_KV_BOTH)
        return server_error_set(e, 400, "kv_transfer_params",
                                "kv_transfer_params.do_remote_prefill: this server is not a KV "
                                "consumer (start it with --kv-transfer-config "
                                "'{\"kv_role\": \"kv_consumer\"}' and the producer's "
                                "--kv-store)");
    if (r->kv_remote_decode && r->stream)
        return server_error_set(e, 400, "kv_transfer_params",
                                "kv_transfer_params.do_remote_decode: the prefill step answers "
                                "with the transfer handle in a whole response: set \"stream\": "
                                "false");
    return 0;
}

int server_req_parse(const json_t *body, enum server_api api, const struct server_model *m,
                     struct server_req *r, struct server_error *e)
{
    memset(r, 0, sizeof *r);
    r->api = api;
    r->logprobs = -1;
    r->bl.p = request_params_default();
    if (!json_is_object(body))
        return server_error_set(e, 400, NULL, "the request body must be a JSON object");
    int rc = api_fields(body, m, r, e);
    if (rc)
        return rc;
    if (!(r->fields = json_copy((json_t *)body)))
        return server_error_set(e, 500, NULL, "out of memory");
    json_object_del(r->fields, "prompt");
    json_object_del(r->fields, "messages");
    json_object_del(r->fields, "prompt_token_ids");
    if (api == SERVER_API_CHAT) { /* tools are the chat API's (server/tools.h) */
        if ((rc = server_tools_parse(body, m->tool_parser, m->auto_tool_choice, &m->schema_opts,
                                     &r->tools, e)))
            return rc;
        json_object_del(r->fields, "tools");
        json_object_del(r->fields, "tool_choice");
        json_object_del(r->fields, "parallel_tool_calls");
    }
    if ((rc = kv_transfer_params(body, m, r, e)))
        return rc;
    json_object_del(r->fields, "kv_transfer_params");
    struct weld_err we = {0};
    if (batch_request_parse(r->fields, 0, &m->schema_opts, &r->bl, &we))
        return from_weld_err(e, &we);
    r->bl.p.kv_save = r->kv_remote_decode;
    r->bl.p.kv_remote_tokens = r->kv_remote_prefill ? r->kv_remote_tokens : -1;
    if (r->tools.gbnf) {
        if (r->bl.p.grammar)
            return server_error_set(e, 400, "tool_choice",
                                    "field 'tool_choice': a required "
                                    "or named tool call and a structured-output field both "
                                    "constrain the output; give one");
        r->bl.p.grammar = r->tools.gbnf;
    }
    if (r->tools.choice == TOOL_CHOICE_AUTO) /* call markers are often special tokens */
        r->bl.p.skip_special_tokens = false;
    if (r->bl.unknown[0]) /* vLLM's warning, one line per request */
        log_warn("weld serve: the following fields were present in the request but ignored: "
                 "%s", r->bl.unknown);
    r->logprobs = r->bl.p.logprobs;
    /* echo: the prompt's logprobs (vLLM's prompt_logprobs); max_tokens 0 scores it only */
    if (r->echo && (r->logprobs >= 0 || r->bl.p.max_tokens == 0))
        r->bl.p.prompt_logprobs = r->logprobs >= 0 ? r->logprobs : 0;
    if (api == SERVER_API_CHAT) {
        if (!json_object_get(body, "messages"))
            return server_error_set(e, 400, "messages", "field 'messages': required");
        rc = chat_prompt(body, m, r, e);
    } else {
        if (!json_object_get(body, "prompt"))
            return server_error_set(e, 400, "prompt", "field 'prompt': required");
        rc = completion_prompts(body, m, r, e);
    }
    if (rc || (rc = check_lengths(body, m, r, e)))
        return rc;
    if ((int64_t)r->n_prompts * r->bl.p.n > SERVER_MAX_CHOICES && r->bl.p.n <= REQUEST_MAX_N)
        return server_error_set(e, 400, "n", "%d prompts times n = %d is more than %d choices",
                                r->n_prompts, r->bl.p.n, SERVER_MAX_CHOICES);
    r->bl.p.prompt_ids = r->prompts[0].ids;
    r->bl.p.n_prompt_ids = r->prompts[0].n_ids;
    if (request_params_check(&r->bl.p, m->n_vocab, &we))
        return from_weld_err(e, &we);
    return 0;
}

void server_req_release(struct server_req *r)
{
    if (!r)
        return;
    for (int i = 0; i < r->n_prompts; i++) {
        wfree(r->prompts[i].ids);
        wfree(r->prompts[i].text);
    }
    wfree(r->prompts);
    batch_line_release(&r->bl);
    server_tools_release(&r->tools);
    json_decref(r->fields);
    memset(r, 0, sizeof *r);
}

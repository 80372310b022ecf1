/*
 * batch_io - the JSONL request line parser behind `weld batch` (see batch_io.h for the
 * accepted keys and the ownership of what it returns).
 *
 * Order of work: load the JSON (jansson, with its own line/column diagnostics), pick the
 * request object ("body" of an OpenAI batch line, else the line), take the id, then read
 * the prompt, stop_token_ids, stop strings, numeric sampling fields and flags, each helper
 * failing with a message naming its field. The "line N" prefix is added once, at the top.
 * Every integer is range-checked before it is narrowed to an int; arrays longer than
 * INT_MAX elements are refused before their count is narrowed. Then the OpenAI / vLLM
 * ranges (api_ranges) and the fields weld does not implement (refused[]: they would change
 * the output, so silently ignoring them would be a lie); every other key not in known[] is
 * listed in batch_line.unknown for the caller's one warning line.
 */
#include "engine/batch_io.h"

#include "core/alloc.h"
#include "core/json.h"
#include "core/log.h"
#include "engine/structured.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* An array of token ids (JSON integers in [0, INT32_MAX]). */
static int get_ids(const json_t *a, const char *key, int32_t **out, int *n, struct weld_err *e)
{
    if (!json_is_array(a))
        return err_set(e, WELD_ERR_FORMAT, "field '%s': expected an array of token ids", key);
    size_t len = json_array_size(a);
    if (len > INT_MAX)
        return err_set(e, WELD_ERR_FORMAT, "field '%s': %zu ids is too many", key, len);
    *out = wmalloc((len ? len : 1) * sizeof **out);
    if (!*out)
        return err_set(e, WELD_ERR_NOMEM, "field '%s': out of memory", key);
    for (size_t i = 0; i < len; i++) {
        const json_t *v = json_array_get(a, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 ||
            json_integer_value(v) > INT32_MAX)
            return err_set(e, WELD_ERR_FORMAT, "field '%s[%zu]': not a token id", key, i);
        (*out)[i] = (int32_t)json_integer_value(v);
    }
    *n = (int)len;
    return WELD_OK;
}

static int get_stop(const json_t *o, struct batch_line *l, struct weld_err *e)
{
    const json_t *s = json_object_get(o, "stop");
    if (!s || json_is_null(s))
        return WELD_OK;
    if (!json_is_string(s) && !json_is_array(s))
        return err_set(e, WELD_ERR_FORMAT, "field 'stop': expected a string or an array");
    size_t n = json_is_string(s) ? 1 : json_array_size(s);
    if (n > INT_MAX)
        return err_set(e, WELD_ERR_FORMAT, "field 'stop': %zu strings is too many", n);
    if (!(l->stops = wcalloc(n ? n : 1, sizeof *l->stops)))
        return err_set(e, WELD_ERR_NOMEM, "field 'stop': out of memory");
    for (size_t i = 0; i < n; i++) {
        const json_t *v = json_is_string(s) ? s : json_array_get(s, i);
        if (!json_is_string(v))
            return err_set(e, WELD_ERR_FORMAT, "field 'stop[%zu]': expected a string", i);
        l->stops[i] = json_string_value(v);
    }
    l->p.stop = l->stops;
    l->p.n_stop = (int)n;
    return WELD_OK;
}

/* logit_bias: {"<token id>": number}; ids are decimal integers in [0, INT32_MAX]. */
static int get_logit_bias(const json_t *o, struct batch_line *l, struct weld_err *e)
{
    const json_t *lb = json_object_get(o, "logit_bias");
    if (!lb || json_is_null(lb))
        return WELD_OK;
    if (!json_is_object(lb))
        return err_set(e, WELD_ERR_FORMAT, "field 'logit_bias': expected an object of "
                       "token id -> bias");
    size_t n = json_object_size(lb);
    if (n > INT_MAX)
        return err_set(e, WELD_ERR_FORMAT, "field 'logit_bias': %zu entries is too many", n);
    if (!(l->bias_ids = wmalloc((n ? n : 1) * sizeof *l->bias_ids)) ||
        !(l->bias = wmalloc((n ? n : 1) * sizeof *l->bias)))
        return err_set(e, WELD_ERR_NOMEM, "field 'logit_bias': out of memory");
    const char *k;
    const json_t *v;
    size_t i = 0;
    json_object_foreach((json_t *)lb, k, v) {
        char *end;
        errno = 0;
        long long id = strtoll(k, &end, 10);
        if (end == k || *end || errno || id < 0 || id > INT32_MAX)
            return err_set(e, WELD_ERR_FORMAT, "field 'logit_bias': key '%s' is not a token id",
                           k);
        double b = json_is_number(v) ? json_number_value(v) : NAN;
        if (!(b >= -100.0 && b <= 100.0)) /* OpenAI's range */
            return err_set(e, WELD_ERR_FORMAT, "field 'logit_bias[%s]': expected a number in "
                           "[-100, 100]", k);
        l->bias_ids[i] = (int32_t)id;
        l->bias[i++] = (float)b;
    }
    l->p.logit_bias_ids = l->bias_ids;
    l->p.logit_bias = l->bias;
    l->p.n_logit_bias = (int)n;
    return WELD_OK;
}

static int get_floats(const json_t *o, struct request_params *p, struct weld_err *e)
{
    static const char *const keys[] = {"temperature", "top_p", "min_p", "repetition_penalty",
                                       "frequency_penalty", "presence_penalty"};
    float *dst[] = {&p->sampling.temperature, &p->sampling.top_p, &p->sampling.min_p,
                    &p->sampling.repetition_penalty, &p->sampling.frequency_penalty,
                    &p->sampling.presence_penalty};
    for (int i = 0; i < 6; i++) {
        double d;
        int rc = jget_double(o, keys[i], &d, "request", e);
        if (rc == WELD_OK && !(d >= -3.0e38 && d <= 3.0e38))
            return err_set(e, WELD_ERR_FORMAT, "field '%s': %g does not fit a float",
                           keys[i], d);
        if (rc == WELD_OK)
            *dst[i] = (float)d;
        else if (rc != WELD_ERR_NOT_FOUND)
            return rc;
    }
    return WELD_OK;
}

static int get_ints(const json_t *o, struct request_params *p, struct weld_err *e)
{
    static const char *const keys[] = {"top_k", "max_tokens", "max_completion_tokens",
                                       "min_tokens", "n", "priority"};
    int *dst[] = {&p->sampling.top_k, &p->max_tokens, &p->max_tokens, &p->min_tokens, &p->n,
                  &p->priority};
    for (int i = 0; i < 6; i++) {
        int64_t v;
        int rc = jget_int(o, keys[i], &v, "request", e);
        if (rc == WELD_OK && (v < INT32_MIN || v > INT32_MAX))
            return err_set(e, WELD_ERR_FORMAT, "field '%s': %lld out of range", keys[i],
                           (long long)v);
        if (rc == WELD_OK)
            *dst[i] = (int)v;
        else if (rc != WELD_ERR_NOT_FOUND)
            return rc;
    }
    int64_t seed;
    int rc = jget_int(o, "seed", &seed, "request", e);
    if (rc == WELD_OK) {
        p->has_seed = true;
        p->sampling.seed = (uint64_t)seed;
    } else if (rc != WELD_ERR_NOT_FOUND) {
        return rc;
    }
    return WELD_OK;
}

/* logprobs: an integer N, or true with top_logprobs N; clamped to [INT32_MIN, 1000] so
   the narrowing is exact (request_params_check rejects what is out of its range). */
static int get_logprobs(const json_t *o, struct request_params *p, struct weld_err *e)
{
    const json_t *lp = json_object_get(o, "logprobs");
    int64_t v;
    if (json_is_integer(lp)) {
        v = json_integer_value(lp);
        if (v < 0 || v > REQUEST_MAX_LOGPROBS)
            return err_set(e, WELD_ERR_FORMAT, "field 'logprobs': %lld, must be in [0, %d]",
                           (long long)v, REQUEST_MAX_LOGPROBS);
    } else if (json_is_true(lp)) {
        v = 0;
        int rc = jget_int(o, "top_logprobs", &v, "request", e);
        if (rc != WELD_OK && rc != WELD_ERR_NOT_FOUND)
            return rc;
        if (v < 0 || v > REQUEST_MAX_LOGPROBS)
            return err_set(e, WELD_ERR_FORMAT, "field 'top_logprobs': %lld, must be in "
                           "[0, %d]", (long long)v, REQUEST_MAX_LOGPROBS);
    } else if (lp && !json_is_null(lp) && !json_is_false(lp)) {
        return err_set(e, WELD_ERR_FORMAT, "field 'logprobs': expected an integer or a bool");
    } else {
        return WELD_OK;
    }
    p->logprobs = (int)(v > 1000 ? 1000 : v < INT32_MIN ? INT32_MIN : v);
    return WELD_OK;
}

static int get_flags(const json_t *o, struct request_params *p, struct weld_err *e)
{
    static const char *const keys[] = {"ignore_eos", "include_stop_str_in_output",
                                       "skip_special_tokens", "add_special_tokens"};
    bool *dst[] = {&p->ignore_eos, &p->include_stop_str_in_output, &p->skip_special_tokens,
                   &p->add_special_tokens};
    for (int i = 0; i < 4; i++) {
        int rc = jget_bool(o, keys[i], dst[i], "request", e);
        if (rc != WELD_OK && rc != WELD_ERR_NOT_FOUND)
            return rc;
    }
    int rc = get_logprobs(o, p, e);
    if (rc)
        return rc;
    rc = jget_str(o, "cache_salt", &p->cache_salt, "request", e);
    return rc == WELD_ERR_NOT_FOUND ? WELD_OK : rc;
}

/* OpenAI chat messages: objects with a string "role" and a "content" that is a string,
   null (an assistant turn with tool calls) or a list of parts ({"type": "text", "text":
   ...} objects, passed on for the template to join). Other keys go through untouched. */
static int check_messages(const json_t *m, struct weld_err *e)
{
    if (!json_is_array(m))
        return err_set(e, WELD_ERR_FORMAT, "field 'messages': expected an array of objects");
    for (size_t i = 0; i < json_array_size(m); i++) {
        const json_t *msg = json_array_get(m, i);
        if (!json_is_object(msg))
            return err_set(e, WELD_ERR_FORMAT, "field 'messages[%zu]': expected an object", i);
        if (!json_is_string(json_object_get(msg, "role")))
            return err_set(e, WELD_ERR_FORMAT, "field 'messages[%zu].role': expected a string",
                           i);
        const json_t *c = json_object_get(msg, "content");
        if (!c || json_is_string(c) || json_is_null(c))
            continue;
        if (!json_is_array(c))
            return err_set(e, WELD_ERR_FORMAT, "field 'messages[%zu].content': expected a "
                           "string, null or a list of parts", i);
        for (size_t k = 0; k < json_array_size(c); k++)
            if (!json_is_object(json_array_get(c, k)))
                return err_set(e, WELD_ERR_FORMAT, "field 'messages[%zu].content[%zu]': "
                               "expected an object", i, k);
    }
    return WELD_OK;
}

/* prompt (string or ids), prompt_token_ids, messages; a string prompt wins over ids. */
static int get_prompt(const json_t *o, struct batch_line *l, struct weld_err *e)
{
    const json_t *pr = json_object_get(o, "prompt");
    const json_t *pids = json_object_get(o, "prompt_token_ids");
    const json_t *msgs = json_object_get(o, "messages");
    if (json_is_string(pr))
        l->p.prompt = json_string_value(pr);
    else if (pr && !json_is_null(pr))
        pids = pr;
    if (pids && !json_is_null(pids)) {
        int rc = get_ids(pids, pids == pr ? "prompt" : "prompt_token_ids", &l->prompt_ids,
                         &l->p.n_prompt_ids, e);
        if (rc)
            return rc;
        l->p.prompt_ids = l->prompt_ids;
    }
    if (msgs && !json_is_null(msgs)) {
        int rc = check_messages(msgs, e);
        if (rc)
            return rc;
        l->p.messages = msgs;
    }
    return WELD_OK;
}

/* OpenAI / vLLM ranges of the sampling fields (request_params_check has the engine's own,
   looser ones, which CLI flags use). */
static int api_ranges(const struct request_params *p, bool echo, struct weld_err *e)
{
    const struct sampler_params *s = &p->sampling;
    if (!(s->temperature >= 0.0f && s->temperature <= 2.0f))
        return err_set(e, WELD_ERR_INVALID_ARG, "field 'temperature': %g, must be in [0, 2] "
                       "(below 1e-5 means greedy)", (double)s->temperature);
    if (s->top_k < -1)
        return err_set(e, WELD_ERR_INVALID_ARG, "field 'top_k': %d, must be -1 or 0 (off) or "
                       "at least 1", s->top_k);
    if (!(s->presence_penalty >= -2.0f && s->presence_penalty <= 2.0f))
        return err_set(e, WELD_ERR_INVALID_ARG, "field 'presence_penalty': %g, must be in "
                       "[-2, 2]", (double)s->presence_penalty);
    if (!(s->frequency_penalty >= -2.0f && s->frequency_penalty <= 2.0f))
        return err_set(e, WELD_ERR_INVALID_ARG, "field 'frequency_penalty': %g, must be in "
                       "[-2, 2]", (double)s->frequency_penalty);
    if (!(s->repetition_penalty > 0.0f))
        return err_set(e, WELD_ERR_INVALID_ARG, "field 'repetition_penalty': %g, must be "
                       "greater than 0", (double)s->repetition_penalty);
    if (p->n < 1)
        return err_set(e, WELD_ERR_INVALID_ARG, "field 'n': %d, must be at least 1", p->n);
    if (p->max_tokens < (echo ? 0 : 1)) /* echo + max_tokens 0: score the prompt only */
        return err_set(e, WELD_ERR_INVALID_ARG, "field 'max_tokens': %d, must be at least 1",
                       p->max_tokens);
    return WELD_OK;
}

static bool str_is(const json_t *v, const char *s)
{
    return json_is_string(v) && !strcmp(json_string_value(v), s);
}

/* Fields that would change the output but are not implemented: refused when set to
   anything but their neutral value (null, false, "" or as noted). */
static int refused(const json_t *o, struct weld_err *e)
{
    const json_t *tc = json_object_get(o, "tool_choice");
    if (tc && !json_is_null(tc) && !str_is(tc, "none"))
        return err_set(e, WELD_ERR_UNSUPPORTED, "field 'tool_choice': only \"none\" is "
                       "supported (weld does not parse tool calls out of the output)");
    const json_t *tools = json_object_get(o, "tools");
    if (tools && !json_is_null(tools) && !(json_is_array(tools) && !json_array_size(tools)) &&
        !str_is(tc, "none"))
        return err_set(e, WELD_ERR_UNSUPPORTED, "field 'tools': tool calling is not supported "
                       "(tool calls in the output are not parsed); with tool_choice \"none\" "
                       "the chat template shows the tools and the answer is plain text");
    static const char *const others[] = {
        "functions", "function_call", "suffix", "allowed_token_ids", "bad_words",
        "logits_processors", "truncate_prompt_tokens", "chat_template", "documents",
        "audio", "prompt_embeds"};
    for (size_t i = 0; i < sizeof others / sizeof others[0]; i++) {
        const json_t *v = json_object_get(o, others[i]);
        if (v && !json_is_null(v) && !str_is(v, "") && !json_is_false(v) &&
            !(json_is_array(v) && !json_array_size(v)) &&
            !(json_is_object(v) && !json_object_size(v)))
            return err_set(e, WELD_ERR_UNSUPPORTED, "field '%s': not supported by weld%s",
                           others[i], !strcmp(others[i], "chat_template")
                           ? " per request (start it with --chat-template)" : "");
    }
    static const char *const flags[] = {"use_beam_search", "continue_final_message",
                                        "return_tokens_as_token_ids"};
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++)
        if (json_is_true(json_object_get(o, flags[i])))
            return err_set(e, WELD_ERR_UNSUPPORTED, "field '%s': not supported by weld",
                           flags[i]);
    const json_t *bo = json_object_get(o, "best_of");
    const json_t *n = json_object_get(o, "n");
    if (bo && !json_is_null(bo) && !(json_is_integer(bo) && (json_integer_value(bo) == 1 ||
                                     (json_is_integer(n) && json_equal(bo, (json_t *)n)))))
        return err_set(e, WELD_ERR_UNSUPPORTED, "field 'best_of': only 1 or n is supported");
    const json_t *mod = json_object_get(o, "modalities");
    for (size_t i = 0; json_is_array(mod) && i < json_array_size(mod); i++)
        if (!str_is(json_array_get(mod, i), "text"))
            return err_set(e, WELD_ERR_UNSUPPORTED, "field 'modalities': only \"text\" is "
                           "supported");
    return WELD_OK;
}

/* Keys read above or harmless to ignore (OpenAI / vLLM bookkeeping that does not change
   the output); anything else goes to l->unknown. */
static void list_unknown(const json_t *o, struct batch_line *l)
{
    static const char *const known[] = {
        "model", "prompt", "messages", "prompt_token_ids", "max_tokens", "max_completion_tokens",
        "min_tokens", "temperature", "top_p", "top_k", "min_p", "repetition_penalty",
        "frequency_penalty", "presence_penalty", "seed", "stop", "stop_token_ids", "logit_bias",
        "ignore_eos", "n", "logprobs", "top_logprobs", "priority", "cache_salt",
        "include_stop_str_in_output", "skip_special_tokens", "add_special_tokens", "stream",
        "stream_options", "echo", "add_generation_prompt", "chat_template_kwargs", "id", "user",
        "metadata", "store", "service_tier", "request_id", "parallel_tool_calls",
        "spaces_between_special_tokens", "mm_processor_kwargs", "custom_id", "method", "url",
        "body", /* batch envelope */
        /* structured outputs (engine/structured.h) */
        "guided_json", "guided_regex", "guided_choice", "guided_grammar", "guided_decoding_backend",
        "guided_whitespace_pattern", "structured_outputs", "grammar", "json_schema",
        "response_format",
        /* refused unless neutral (see refused()) */
        "tool_choice", "tools", "functions", "function_call", "suffix", "allowed_token_ids",
        "bad_words", "logits_processors", "truncate_prompt_tokens", "chat_template", "documents",
        "audio", "prompt_embeds", "use_beam_search", "continue_final_message",
        "return_tokens_as_token_ids", "best_of", "modalities"};
    size_t w = 0;
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)o, k, v) {
        size_t i = 0;
        while (i < sizeof known / sizeof known[0] && strcmp(known[i], k))
            i++;
        if (i < sizeof known / sizeof known[0] || w + 8 >= sizeof l->unknown)
            continue;
        int n = snprintf(l->unknown + w, sizeof l->unknown - w, "%s%s", w ? ", " : "", k);
        if (n < 0 || (size_t)n >= sizeof l->unknown - w) { /* cut: end with "..." */
            snprintf(l->unknown + (sizeof l->unknown - 8), 8, ", ...");
            w = sizeof l->unknown;
        } else {
            w += (size_t)n;
        }
    }
}

static int parse_object(const json_t *o, const struct schema_opts *opts, struct batch_line *l,
                        struct weld_err *e)
{
    if (!json_is_object(o))
        return err_set(e, WELD_ERR_FORMAT, "expected a JSON object");
    int rc = get_prompt(o, l, e);
    const json_t *sid = json_object_get(o, "stop_token_ids");
    if (!rc && sid && !json_is_null(sid)) {
        rc = get_ids(sid, "stop_token_ids", &l->stop_ids, &l->p.n_stop_token_ids, e);
        if (!rc)
            l->p.stop_token_ids = l->stop_ids;
    }
    if (!rc && !(rc = get_stop(o, l, e)) && !(rc = get_logit_bias(o, l, e)) &&
        !(rc = get_floats(o, &l->p, e)) && !(rc = get_ints(o, &l->p, e)) &&
        !(rc = get_flags(o, &l->p, e)) &&
        !(rc = api_ranges(&l->p, json_is_true(json_object_get(o, "echo")), e)) &&
        !(rc = refused(o, e)) && !(rc = structured_gbnf(o, opts, &l->gbnf, e)))
        l->p.grammar = l->gbnf;
    if (!rc)
        list_unknown(o, l);
    return rc;
}

int batch_request_parse(const json_t *o, int line_no, const struct schema_opts *opts,
                        struct batch_line *out, struct weld_err *e)
{
    memset(out, 0, sizeof *out);
    out->p = request_params_default();
    int rc = parse_object(o, opts, out, e);
    if (rc)
        err_prefix(e, "line %d", line_no);
    return rc;
}

int batch_line_parse(const char *text, size_t len, int line_no, const struct schema_opts *opts,
                     struct batch_line *out, struct weld_err *e)
{
    memset(out, 0, sizeof *out);
    out->p = request_params_default();
    json_error_t je;
    out->root = json_loadb(text, len, 0, &je);
    if (!out->root)
        return err_set(e, WELD_ERR_FORMAT, "line %d, column %d: %s", line_no, je.column,
                       je.text);
    const json_t *o = out->root;
    const json_t *body = json_object_get(out->root, "body");
    if (json_is_object(body))
        o = body;
    out->id = json_object_get(o, "id");
    if (!out->id)
        out->id = json_object_get(out->root, "custom_id");
    int rc = parse_object(o, opts, out, e);
    if (!rc && json_is_true(json_object_get(o, "echo")))
        rc = err_set(e, WELD_ERR_UNSUPPORTED, "field 'echo': not supported by weld batch");
    if (rc)
        err_prefix(e, "line %d", line_no);
    static _Atomic bool warned; /* one line per run: input files repeat their keys */
    if (!rc && out->unknown[0] && !atomic_exchange(&warned, true))
        log_warn("line %d: ignoring unknown fields: %s (not reported again for later lines)",
                 line_no, out->unknown);
    return rc;
}

void batch_line_release(struct batch_line *l)
{
    if (!l)
        return;
    wfree(l->prompt_ids);
    wfree(l->stop_ids);
    wfree((void *)l->stops);
    wfree(l->bias_ids);
    wfree(l->bias);
    wfree(l->gbnf);
    json_decref(l->root);
    memset(l, 0, sizeof *l);
    l->p = request_params_default();
}

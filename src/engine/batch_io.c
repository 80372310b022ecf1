/*
 * batch_io - the JSONL request line parser behind `weld batch` (see batch_io.h for the
 * accepted keys and the ownership of what it returns).
 *
 * Order of work: load the JSON (jansson, with its own line/column diagnostics), pick the
 * request object ("body" of an OpenAI batch line, else the line), take the id, then read
 * the prompt, stop_token_ids, stop strings, numeric sampling fields and flags, each helper
 * failing with a message naming its field. The "line N" prefix is added once, at the top.
 * Every integer is range-checked before it is narrowed to an int; arrays longer than
 * INT_MAX elements are refused before their count is narrowed.
 */
#include "engine/batch_io.h"

#include "core/alloc.h"
#include "core/json.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
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
        if (!(b >= -3.0e38 && b <= 3.0e38))
            return err_set(e, WELD_ERR_FORMAT, "field 'logit_bias[%s]': expected a number", k);
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
    } else if (json_is_true(lp)) {
        v = 0;
        int rc = jget_int(o, "top_logprobs", &v, "request", e);
        if (rc != WELD_OK && rc != WELD_ERR_NOT_FOUND)
            return rc;
        if (v < 0)
            v = -2;
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

static int parse_object(const json_t *o, struct batch_line *l, struct weld_err *e)
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
        !(rc = get_floats(o, &l->p, e)) &&
        !(rc = get_ints(o, &l->p, e)))
        rc = get_flags(o, &l->p, e);
    return rc;
}

int batch_request_parse(const json_t *o, int line_no, struct batch_line *out,
                        struct weld_err *e)
{
    memset(out, 0, sizeof *out);
    out->p = request_params_default();
    int rc = parse_object(o, out, e);
    if (rc)
        err_prefix(e, "line %d", line_no);
    return rc;
}

int batch_line_parse(const char *text, size_t len, int line_no, struct batch_line *out,
                     struct weld_err *e)
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
    int rc = parse_object(o, out, e);
    if (rc)
        err_prefix(e, "line %d", line_no);
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
    json_decref(l->root);
    memset(l, 0, sizeof *l);
    l->p = request_params_default();
}

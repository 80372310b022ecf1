/*
 * loadgen_sse - server-sent events in, per-request timings out.
 *
 * The parser follows the WHATWG "event stream interpretation" rules: a line ends at CR, LF
 * or CRLF (a CRLF split across two feeds is one line end: `last_cr` remembers a trailing
 * CR and swallows one LF at the start of the next feed); an empty line dispatches the
 * pending event; a line starting with ':' is a comment; "field:value" drops one space
 * after the colon; "data" lines accumulate, joined by LF; "event" sets the type; "id" and
 * "retry" are ignored (a load generator never reconnects). An event without data lines is
 * not dispatched, and an unterminated event at the end of the stream is dropped.
 *
 * Memory: one growing line buffer and one data buffer per stream, both capped at
 * max_bytes so a server that never sends a line end cannot exhaust memory.
 *
 * The stream layer (loadgen_stream_*) reads each event as an OpenAI stream chunk: "[DONE]"
 * ends the stream; otherwise a JSON object whose choices[0].text (completions) or
 * choices[0].delta.content / reasoning_content (chat) is the text, `usage` carries token
 * counts and `error` an error object. Timestamps are the time the bytes were handed to
 * loadgen_stream_feed, so chunks that arrive in one TCP read share a timestamp (as they do
 * for every HTTP client).
 */
#include "loadgen/loadgen.h"

#include "core/alloc.h"

#include <stdarg.h>
#include <string.h>

#define SSE_DEFAULT_MAX ((size_t)16 << 20)

void loadgen_sse_init(struct loadgen_sse *s, size_t max_bytes, loadgen_sse_fn fn, void *user)
{
    memset(s, 0, sizeof *s);
    s->max_bytes = max_bytes ? max_bytes : SSE_DEFAULT_MAX;
    s->fn = fn;
    s->user = user;
}

void loadgen_sse_release(struct loadgen_sse *s)
{
    if (!s)
        return;
    wfree(s->line);
    wfree(s->data);
    s->line = s->data = NULL;
    s->line_len = s->line_cap = s->data_len = s->data_cap = 0;
    s->has_data = s->last_cr = false;
    s->event[0] = 0;
}

/* Make room for `more` bytes plus a NUL in a buffer; false on overflow of max or memory. */
static int buf_reserve(char **buf, size_t *cap, size_t len, size_t more, size_t max)
{
    if (more > max || len > max - more)
        return WELD_ERR_FORMAT;
    if (len + more + 1 <= *cap)
        return WELD_OK;
    size_t ncap = *cap ? *cap : 256;
    while (ncap < len + more + 1)
        ncap *= 2;
    char *nb = wrealloc(*buf, ncap);
    if (!nb)
        return WELD_ERR_NOMEM;
    *buf = nb;
    *cap = ncap;
    return WELD_OK;
}

static int sse_dispatch(struct loadgen_sse *s)
{
    int rc = 0;
    if (s->has_data) {
        size_t len = s->data_len;
        if (len > 0 && s->data[len - 1] == '\n')
            len--;
        s->data[len] = 0;
        rc = s->fn ? s->fn(s->user, s->event[0] ? s->event : "message", s->data, len) : 0;
    }
    s->data_len = 0;
    s->has_data = false;
    s->event[0] = 0;
    return rc;
}

/* One complete line (without its end) in s->line[0..line_len). */
static int sse_line(struct loadgen_sse *s, struct weld_err *e)
{
    const char *l = s->line;
    size_t n = s->line_len;
    if (n == 0)
        return sse_dispatch(s);
    if (l[0] == ':')
        return WELD_OK;
    const char *colon = memchr(l, ':', n);
    size_t flen = colon ? (size_t)(colon - l) : n;
    const char *v = colon ? colon + 1 : l + n;
    size_t vlen = n - (size_t)(v - l);
    if (vlen > 0 && v[0] == ' ')
        v++, vlen--;
    if (flen == 4 && !memcmp(l, "data", 4)) {
        int rc = buf_reserve(&s->data, &s->data_cap, s->data_len, vlen + 1, s->max_bytes);
        if (rc)
            return err_set(e, rc, "event stream byte %llu: %s", (unsigned long long)s->offset,
                           rc == WELD_ERR_NOMEM ? "out of memory"
                                                : "event data over the size limit");
        memcpy(s->data + s->data_len, v, vlen);
        s->data_len += vlen;
        s->data[s->data_len++] = '\n';
        s->data[s->data_len] = 0;
        s->has_data = true;
    } else if (flen == 5 && !memcmp(l, "event", 5)) {
        size_t k = vlen < sizeof s->event - 1 ? vlen : sizeof s->event - 1;
        memcpy(s->event, v, k);
        s->event[k] = 0;
    }
    return WELD_OK;
}

int loadgen_sse_feed(struct loadgen_sse *s, const char *buf, size_t n, struct weld_err *e)
{
    size_t i = 0;
    if (n == 0)
        return WELD_OK;
    if (s->last_cr && buf[0] == '\n')
        i = 1, s->offset++;
    s->last_cr = false;
    while (i < n) {
        size_t j = i;
        while (j < n && buf[j] != '\r' && buf[j] != '\n')
            j++;
        int rc = buf_reserve(&s->line, &s->line_cap, s->line_len, j - i, s->max_bytes);
        if (rc)
            return err_set(e, rc, "event stream byte %llu: %s",
                           (unsigned long long)(s->offset + (j - i)),
                           rc == WELD_ERR_NOMEM ? "out of memory" : "line over the size limit");
        memcpy(s->line + s->line_len, buf + i, j - i);
        s->line_len += j - i;
        s->offset += j - i;
        if (j == n)
            break;
        /* a line end at j */
        bool cr = buf[j] == '\r';
        size_t end = j + 1;
        if (cr && end < n && buf[end] == '\n')
            end++;
        else if (cr && end == n)
            s->last_cr = true;
        s->offset += end - j;
        s->line[s->line_len] = 0;
        rc = sse_line(s, e);
        s->line_len = 0;
        if (rc)
            return rc;
        i = end;
    }
    return WELD_OK;
}

/* ---- results ---- */

void loadgen_result_fail(struct loadgen_result *r, const char *fmt, ...)
{
    r->success = false;
    if (r->failed)
        return;
    r->failed = true;
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    r->error = wstrdup(buf); /* NULL on out of memory: still failed */
}

void loadgen_result_release(struct loadgen_result *r)
{
    if (!r)
        return;
    wfree(r->error);
    wfree(r->itl);
    r->error = NULL;
    r->itl = NULL;
    r->n_itl = r->cap_itl = 0;
}

void loadgen_results_free(struct loadgen_result *r, int n)
{
    if (!r)
        return;
    for (int i = 0; i < n; i++)
        loadgen_result_release(&r[i]);
    wfree(r);
}

static bool push_itl(struct loadgen_result *r, double v)
{
    if (r->n_itl == r->cap_itl) {
        int cap = r->cap_itl ? r->cap_itl * 2 : 64;
        double *n = wrealloc(r->itl, (size_t)cap * sizeof *n);
        if (!n)
            return false;
        r->itl = n;
        r->cap_itl = cap;
    }
    r->itl[r->n_itl++] = v;
    return true;
}

/* The text of choices[0]: completions' text, chat's delta.content or reasoning_content. */
static const char *chunk_text(json_t *obj, size_t *len)
{
    json_t *ch = json_object_get(obj, "choices");
    json_t *c0 = json_is_array(ch) ? json_array_get(ch, 0) : NULL;
    if (!json_is_object(c0))
        return NULL;
    json_t *t = json_object_get(c0, "text");
    json_t *d = json_object_get(c0, "delta");
    if (!json_is_string(t) && json_is_object(d)) {
        t = json_object_get(d, "content");
        if (!json_is_string(t) || json_string_length(t) == 0)
            t = json_object_get(d, "reasoning_content");
    }
    if (!json_is_string(t))
        return NULL;
    *len = json_string_length(t);
    return json_string_value(t);
}

static void chunk_usage(struct loadgen_result *r, json_t *obj)
{
    json_t *u = json_object_get(obj, "usage");
    if (!json_is_object(u))
        return;
    json_t *pt = json_object_get(u, "prompt_tokens");
    json_t *ct = json_object_get(u, "completion_tokens");
    if (json_is_integer(ct) && json_integer_value(ct) >= 0) {
        r->output_tokens = json_integer_value(ct);
        r->got_usage = true;
    }
    if (json_is_integer(pt) && json_integer_value(pt) >= 0)
        r->prompt_tokens = json_integer_value(pt);
}

static void chunk_error(struct loadgen_result *r, json_t *err)
{
    json_t *m = json_is_object(err) ? json_object_get(err, "message") : NULL;
    if (json_is_string(m)) {
        loadgen_result_fail(r, "server error in stream: %s", json_string_value(m));
        return;
    }
    char *s = json_dumps(err, JSON_COMPACT | JSON_ENCODE_ANY);
    loadgen_result_fail(r, "server error in stream: %s", s ? s : "(unprintable)");
    free(s);
}

static int stream_event(void *user, const char *event, const char *data, size_t len)
{
    struct loadgen_stream *st = user;
    struct loadgen_result *r = st->res;
    (void)event;
    while (len > 0 && (data[len - 1] == ' ' || data[len - 1] == '\t'))
        len--;
    if (r->got_done)
        return WELD_OK; /* anything after [DONE] is ignored */
    if (len == 6 && !memcmp(data, "[DONE]", 6)) {
        r->got_done = true;
        return WELD_OK;
    }
    json_error_t je;
    json_t *obj = json_loadb(data, len, 0, &je);
    if (!json_is_object(obj)) {
        loadgen_result_fail(r, "stream byte %llu: chunk is not a JSON object: %.80s",
                            (unsigned long long)st->sse.offset, data);
        json_decref(obj);
        return WELD_ERR_FORMAT;
    }
    json_t *err = json_object_get(obj, "error");
    if (err && !json_is_null(err)) {
        chunk_error(r, err);
        json_decref(obj);
        return WELD_ERR_FORMAT;
    }
    size_t tlen = 0;
    const char *text = chunk_text(obj, &tlen);
    if (text && tlen > 0) {
        if (r->n_chunks == 0)
            r->ttft = st->t_now - r->t_send;
        else if (!push_itl(r, st->t_now - st->t_last)) {
            json_decref(obj);
            loadgen_result_fail(r, "out of memory");
            return WELD_ERR_NOMEM;
        }
        st->t_last = st->t_now;
        r->n_chunks++;
        r->text_bytes += tlen;
    }
    chunk_usage(r, obj);
    json_decref(obj);
    return WELD_OK;
}

void loadgen_stream_init(struct loadgen_stream *st, struct loadgen_result *res)
{
    memset(st, 0, sizeof *st);
    st->res = res;
    loadgen_sse_init(&st->sse, 0, stream_event, st);
}

int loadgen_stream_feed(struct loadgen_stream *st, const char *buf, size_t n, double now,
                        struct weld_err *e)
{
    st->t_now = now;
    int rc = loadgen_sse_feed(&st->sse, buf, n, e);
    if (rc && !st->res->failed)
        loadgen_result_fail(st->res, "%s", e ? e->msg : "event stream error");
    if (rc && e && e->status == WELD_OK)
        err_set(e, rc, "%s", st->res->error ? st->res->error : "event stream error");
    return rc;
}

void loadgen_stream_end(struct loadgen_stream *st, double now)
{
    struct loadgen_result *r = st->res;
    r->e2el = now - r->t_send;
    if (!r->got_usage)
        r->output_tokens = r->n_chunks;
    if (!r->failed) {
        if (r->n_chunks == 0)
            loadgen_result_fail(r, "the stream carried no chunk with text");
        else if (!r->got_done)
            loadgen_result_fail(r, "the stream ended before data: [DONE]");
    }
    r->success = !r->failed;
}

void loadgen_stream_release(struct loadgen_stream *st)
{
    if (st)
        loadgen_sse_release(&st->sse);
}

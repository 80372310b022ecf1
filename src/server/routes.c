/*
 * routes - the POST routes of `weld serve`: /v1/completions, /v1/chat/completions,
 * /tokenize and /detokenize.
 *
 * A generation request: parse (openai_req.c; errors are answered at once), submit a job to
 * the engine thread (gen.h), wait until the engine took it (a prompt the KV pool can never
 * hold is refused there: 400), then
 *   - non-streaming: collect every choice's events in this connection's thread; every
 *     50 ms (also while tokens keep coming) a poll() on the socket checks whether the
 *     client went away: then the job is cancelled, which aborts its engine requests and
 *     returns their KV blocks, and the connection is closed without an answer; else the
 *     whole body is the answer (500 if a choice failed in the engine, 503 if the server
 *     aborted it at shutdown);
 *   - streaming: answer 200 text/event-stream at once with a callback body; the callback
 *     turns events into "data: {chunk}\n\n" lines (chat opens each choice with a role
 *     chunk; echo opens each completion choice with its prompt), then the usage chunk when
 *     stream_options.include_usage, then "data: [DONE]\n\n". A client gone between chunks
 *     ends the body with an error and cancels the job; so does a failed write, which MHD
 *     reports through the free callback. The job is watched (gen.h): a client that stops
 *     reading gets its request paused once --stream-buffer-size bytes wait for it, and
 *     aborted (connection shut) after --stream-stall-timeout; the socket's kernel send
 *     buffer (SO_SNDBUF) gets the same size. A job aborted at shutdown still ends its
 *     stream: each choice's last chunk says finish_reason "abort", then [DONE];
 *     server_run waits (http_wait_generations) until those bytes left before it stops
 *     the daemon.
 * Every generation fills the access-log record (struct http_access) as its events arrive.
 * Usage: prompt_tokens sums the prompts (each once, whatever n is); cached_tokens is what
 * the prefix cache served of them; completion_tokens sums every choice's tokens.
 */
#include "server/http.h"

#include "core/alloc.h"
#include "core/log.h"
#include "core/progress.h"
#include "tokenizer/tokenizer.h"

#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

struct gen_ctx {
    struct server *s;
    struct MHD_Connection *c;
    struct server_req r;
    struct http_access *acc;       /* until MHD's completion callback: not in ctx_free */
    struct server_job *job;
    struct server_choice *ch;      /* (n_choices) */
    int n_choices, prompt_tokens, cached_tokens;
    int kv_saved; /* kv_save: prompt tokens saved, and the last hash */
    uint64_t kv_hash[2];
    uint64_t kv_ticket; /* wait for it before handing out the handle */
    char id[64];
    long created;
    double t_check;                /* last disconnect check (time_now) */
    /* streaming */
    char *pend;                    /* bytes not yet handed to MHD: [off, len) */
    size_t len, off, cap;
    bool finished, failed;
};

static void ctx_free(struct gen_ctx *g)
{
    if (!g)
        return;
    if (g->job) {
        if (!g->finished)
            server_gen_cancel(g->job);
        server_gen_release(g->job);
    }
    for (int i = 0; g->ch && i < g->n_choices; i++) {
        wfree(g->ch[i].text);
        wfree(g->ch[i].stop_reason);
        json_decref(g->ch[i].lp);
        tool_calls_free(g->ch[i].calls, g->ch[i].n_calls);
    }
    wfree(g->ch);
    server_req_release(&g->r);
    wfree(g->pend);
    __atomic_sub_fetch(&g->s->n_gen_open, 1, __ATOMIC_RELEASE);
    wfree(g);
}

static bool text_add(char **buf, size_t *len, size_t *cap, const char *t, size_t n)
{
    if (*len + n + 1 > *cap) {
        size_t c = *cap ? *cap : 256;
        while (c < *len + n + 1)
            c *= 2;
        char *nb = wrealloc(*buf, c);
        if (!nb)
            return false;
        *buf = nb;
        *cap = c;
    }
    memcpy(*buf + *len, t, n);
    *len += n;
    (*buf)[*len] = 0;
    return true;
}

/* The access-log record learns of one event. */
static void acc_event(struct gen_ctx *g, const struct server_event *ev)
{
    struct http_access *a = g->acc;
    if (ev->n_tokens && a->t_first == 0)
        a->t_first = time_now();
    a->delta_tokens += ev->n_tokens;
    if (!ev->finish)
        return;
    a->n_finished++;
    a->completion_tokens += ev->n_generated;
    if (ev->choice % g->r.bl.p.n == 0)
        a->prompt_tokens += ev->n_prompt;
    if (ev->reason > REQUEST_FINISH_NONE && ev->reason <= REQUEST_FINISH_ERROR)
        a->finish_seen |= 1u << ev->reason;
}

/* Fold one event into its choice (non-streaming) and the usage counts. */
static void apply_event(struct gen_ctx *g, const struct server_event *ev)
{
    if (ev->choice < 0 || ev->choice >= g->n_choices)
        return;
    struct server_choice *c = &g->ch[ev->choice];
    if (ev->finish) {
        c->done = true;
        c->finish = ev->reason;
        c->stop_token = ev->stop_token;
        c->n_generated = ev->n_generated;
        if (ev->stop_reason)
            c->stop_reason = wstrdup(ev->stop_reason);
        if (ev->error && !c->stop_reason)
            c->stop_reason = wstrdup(ev->error);
        if (ev->choice % g->r.bl.p.n == 0) {
            g->prompt_tokens += ev->n_prompt;
            g->cached_tokens += ev->n_cached;
        }
        if (ev->choice == 0) {
            g->kv_saved = ev->n_kv_saved;
            g->kv_hash[0] = ev->kv_saved_hash[0];
            g->kv_hash[1] = ev->kv_saved_hash[1];
            g->kv_ticket = ev->kv_ticket;
        }
        return;
    }
    if (ev->plp && g->r.echo && g->r.logprobs >= 0)
        server_lp_prepend_prompt(g->s->model.tok, &c->lp, ev->plp, ev->n_plp,
                                 g->r.prompts[ev->choice / g->r.bl.p.n].text_len);
    if (ev->has_lp)
        server_lp_append(g->r.api, g->s->model.tok, &c->lp, ev->token, ev->logprob, ev->n_top,
                         ev->top_ids, ev->top_lps, c->len);
    text_add(&c->text, &c->len, &c->cap, ev->text, ev->len);
}

static int start_job(struct gen_ctx *g, enum server_api api, const json_t *body,
                     struct server_error *e)
{
    struct server_model m;
    if (!http_model(g->s, &m))
        return server_error_set(e, 503, NULL, "the model is still loading");
    int rc = server_req_parse(body, api, &m, &g->r, e);
    if (rc)
        return rc;
    g->n_choices = g->r.n_prompts * g->r.bl.p.n;
    if (!(g->ch = wcalloc((size_t)g->n_choices, sizeof *g->ch)))
        return server_error_set(e, 500, NULL, "out of memory");
    for (int i = 0; i < g->n_choices; i++) {
        g->ch[i].stop_token = -1;
        const struct server_prompt *p = &g->r.prompts[i / g->r.bl.p.n];
        if (g->r.echo && !g->r.stream)
            text_add(&g->ch[i].text, &g->ch[i].len, &g->ch[i].cap, p->text, p->text_len);
    }
    unsigned long id = __atomic_add_fetch(&g->s->next_id, 1, __ATOMIC_RELAXED);
    snprintf(g->id, sizeof g->id, "%s-%lx%08lx", api == SERVER_API_CHAT ? "chatcmpl" : "cmpl",
             (unsigned long)g->s->t_start, id);
    g->created = (long)time(NULL);
    snprintf(g->acc->id, sizeof g->acc->id, "%s", g->id);
    g->acc->generation = true;
    g->acc->n_choices = g->n_choices;
    if (g->s->o.log_requests && g->s->o.log_prompts)
        http_access_prompt(g->acc, &g->r);
    g->job = server_gen_submit(g->s->gen, &g->r.bl.p, g->r.prompts, g->r.n_prompts, e);
    if (!g->job)
        return e->http;
    return server_gen_wait_accepted(g->job, e);
}

/* The client went away? Checked at most every 50 ms (a poll() on its socket). */
static bool gone_check(struct gen_ctx *g)
{
    double now = time_now();
    if (now - g->t_check < 0.05)
        return false;
    g->t_check = now;
    return httpd_client_gone(g->c);
}

static enum MHD_Result answer_whole(struct gen_ctx *g)
{
    for (;;) {
        struct server_event *ev = NULL;
        int rc = server_gen_next(g->job, 100, &ev);
        if (rc == 1) {
            acc_event(g, ev);
            apply_event(g, ev);
            wfree(ev);
        } else if (rc < 0) {
            break;
        }
        if (gone_check(g)) {
            ctx_free(g);
            return MHD_NO;
        }
    }
    g->finished = true;
    struct server_error e;
    for (int i = 0; i < g->n_choices; i++)
        if (g->ch[i].finish == REQUEST_FINISH_ABORT) {
            /* not the client (it is still here): the server aborted it at shutdown */
            server_error_set(&e, 503, NULL, "the server is shutting down: the request was "
                             "aborted before it finished; retry on another instance");
            enum MHD_Result r = http_send_error(g->s, g->c, &e);
            ctx_free(g);
            return r;
        }
    for (int i = 0; i < g->n_choices; i++)
        if (g->ch[i].finish == REQUEST_FINISH_ERROR || !g->ch[i].done) {
            server_error_set(&e, 500, NULL, "generation failed: %s",
                             g->ch[i].stop_reason ? g->ch[i].stop_reason : "no result");
            enum MHD_Result r = http_send_error(g->s, g->c, &e);
            ctx_free(g);
            return r;
        }
    for (int i = 0; g->r.tools.choice != TOOL_CHOICE_NONE && i < g->n_choices; i++) {
        struct server_choice *c = &g->ch[i];
        server_tools_extract(&g->r.tools, c->text ? c->text : "", c->len, &c->content_len,
                             &c->calls, &c->n_calls);
    }
    json_t *body = server_resp_json(&g->r, g->id, g->created, g->ch, g->n_choices,
                                    g->prompt_tokens, g->cached_tokens);
    if (body && g->r.kv_remote_decode) { /* the handle for the decode server (kv_transfer.c) */
        server_gen_tier_wait(g->s->gen, g->kv_ticket); /* its blocks are written first */
        char hash[40], engine[96];
        snprintf(hash, sizeof hash, "%016llx%016llx", (unsigned long long)g->kv_hash[1],
                 (unsigned long long)g->kv_hash[0]);
        snprintf(engine, sizeof engine, "weld-%ld-%d", g->s->t_start,
                 g->s->http ? g->s->http->port : 0);
        json_object_set_new(body, "kv_transfer_params",
                            json_pack("{s:b, s:b, s:s, s:i, s:s}", "do_remote_prefill", 1,
                                      "do_remote_decode", 0, "remote_engine_id", engine,
                                      "remote_num_tokens", g->kv_saved, "remote_block_hash",
                                      g->kv_saved ? hash : ""));
    }
    enum MHD_Result r = http_send_json(g->s, g->c, 200, body);
    ctx_free(g);
    return r;
}

/* ---- streaming -------------------------------------------------------------------------- */

static void sse(struct gen_ctx *g, json_t *chunk)
{
    char *txt = chunk ? json_dumps(chunk, JSON_COMPACT) : NULL;
    json_decref(chunk);
    if (!txt) {
        g->failed = true;
        return;
    }
    if (!text_add(&g->pend, &g->len, &g->cap, "data: ", 6) ||
        !text_add(&g->pend, &g->len, &g->cap, txt, strlen(txt)) ||
        !text_add(&g->pend, &g->len, &g->cap, "\n\n", 2))
        g->failed = true;
    free(txt);
}

/* A finished choice of a request with tools: what is left of its content, its calls (if
   the text holds any) and the finish chunk ("tool_calls" when there are calls). */
static void stream_tools_finish(struct gen_ctx *g, const struct server_event *ev)
{
    struct server_choice *c = &g->ch[ev->choice];
    apply_event(g, ev);
    server_tools_extract(&g->r.tools, c->text ? c->text : "", c->len, &c->content_len, &c->calls,
                         &c->n_calls);
    const size_t content = c->n_calls ? c->content_len : c->len;
    if (content > c->sent)
        sse(g, server_chunk_json(&g->r, g->id, g->created, ev->choice, c->text + c->sent,
                                 content - c->sent, NULL, REQUEST_FINISH_NONE, NULL, -1, false));
    c->sent = content > c->sent ? content : c->sent;
    if (c->n_calls)
        sse(g, server_tool_chunk_json(&g->r, g->id, g->created, ev->choice, c->calls, c->n_calls));
    json_t *fin = server_chunk_json(&g->r, g->id, g->created, ev->choice, "", 0, NULL, ev->reason,
                                    ev->stop_reason, ev->stop_token, false);
    if (c->n_calls && ev->reason == REQUEST_FINISH_STOP)
        json_object_set_new(json_array_get(json_object_get(fin, "choices"), 0), "finish_reason",
                            json_string("tool_calls"));
    sse(g, fin);
}

/* A text delta of a request with tools: kept, and sent as content as far as it cannot be
   the start of a call (server_tools_content_prefix). */
static void stream_tools_delta(struct gen_ctx *g, const struct server_event *ev, json_t *lp)
{
    struct server_choice *c = &g->ch[ev->choice];
    text_add(&c->text, &c->len, &c->cap, ev->text, ev->len);
    size_t ok = server_tools_content_prefix(&g->r.tools, c->text ? c->text : "", c->len);
    size_t n = ok > c->sent ? ok - c->sent : 0;
    if (n || lp)
        sse(g, server_chunk_json(&g->r, g->id, g->created, ev->choice, c->text + c->sent, n, lp,
                                 REQUEST_FINISH_NONE, NULL, -1, false));
    c->sent += n;
}

static void stream_event(struct gen_ctx *g, const struct server_event *ev)
{
    if (ev->choice < 0 || ev->choice >= g->n_choices)
        return;
    struct server_choice *c = &g->ch[ev->choice];
    const bool tools = g->r.tools.choice != TOOL_CHOICE_NONE;
    if (ev->finish && tools) {
        stream_tools_finish(g, ev);
        return;
    }
    if (ev->finish) {
        apply_event(g, ev);
        sse(g, server_chunk_json(&g->r, g->id, g->created, ev->choice, "", 0, NULL, ev->reason,
                                 ev->stop_reason, ev->stop_token, false));
        return;
    }
    json_t *lp = NULL;
    if (ev->has_lp)
        server_lp_append(g->r.api, g->s->model.tok, &lp, ev->token, ev->logprob, ev->n_top,
                         ev->top_ids, ev->top_lps, c->text_offset);
    c->text_offset += ev->len;
    if (tools) {
        stream_tools_delta(g, ev, lp);
        return;
    }
    if (ev->len || lp)
        sse(g, server_chunk_json(&g->r, g->id, g->created, ev->choice, ev->text, ev->len, lp,
                                 REQUEST_FINISH_NONE, NULL, -1, false));
}

static void stream_open(struct gen_ctx *g)
{
    for (int i = 0; i < g->n_choices; i++) {
        const struct server_prompt *p = &g->r.prompts[i / g->r.bl.p.n];
        if (g->r.api == SERVER_API_CHAT)
            sse(g, server_chunk_json(&g->r, g->id, g->created, i, "", 0, NULL,
                                     REQUEST_FINISH_NONE, NULL, -1, true));
        else if (g->r.echo) {
            sse(g, server_chunk_json(&g->r, g->id, g->created, i, p->text, p->text_len, NULL,
                                     REQUEST_FINISH_NONE, NULL, -1, false));
            g->ch[i].text_offset = p->text_len;
        }
    }
}

static void stream_close(struct gen_ctx *g)
{
    if (g->r.include_usage) {
        int completion = 0;
        for (int i = 0; i < g->n_choices; i++)
            completion += g->ch[i].n_generated;
        sse(g, server_usage_chunk_json(&g->r, g->id, g->created,
                                       server_usage_json(g->prompt_tokens, completion,
                                                         g->cached_tokens)));
    }
    text_add(&g->pend, &g->len, &g->cap, "data: [DONE]\n\n", 14);
    g->finished = true;
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    struct gen_ctx *g = cls;
    (void)pos;
    for (;;) {
        if (g->failed)
            return MHD_CONTENT_READER_END_WITH_ERROR;
        if (g->off < g->len) {
            size_t n = g->len - g->off < max ? g->len - g->off : max;
            memcpy(buf, g->pend + g->off, n);
            g->off += n;
            if (g->off == g->len)
                g->off = g->len = 0;
            http_touch(g->s, g->c); /* however long the wait, the send timeout starts now */
            return (ssize_t)n;
        }
        if (g->finished)
            return MHD_CONTENT_READER_END_OF_STREAM;
        struct server_event *ev = NULL;
        int rc = server_gen_next(g->job, 100, &ev);
        if (rc == 1) {
            acc_event(g, ev);
            stream_event(g, ev);
            wfree(ev);
        } else if (rc < 0) {
            stream_close(g);
        }
        if (!g->finished && gone_check(g))
            return MHD_CONTENT_READER_END_WITH_ERROR;
    }
}

static void stream_free(void *cls)
{
    ctx_free(cls);
}

static enum MHD_Result answer_stream(struct gen_ctx *g)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(g->c, MHD_CONNECTION_INFO_CONNECTION_FD);
    int fd = ci ? ci->connect_fd : -1;
    /* the kernel's send buffer is capped too (Linux doubles the value), else a client that
       stops reading parks up to tcp_wmem's maximum (4 MiB) there */
    size_t cap = g->s->o.stream_buffer;
    if (fd >= 0 && cap > 0) {
        int sz = cap < (1u << 30) ? (int)cap : 1 << 30;
        setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sz, sizeof sz);
    }
    server_gen_watch(g->job, fd, g->id);
    stream_open(g);
    struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384,
                                                                  stream_read, g, stream_free);
    if (!resp) {
        ctx_free(g);
        return MHD_NO;
    }
    MHD_add_response_header(resp, "Content-Type", "text/event-stream");
    MHD_add_response_header(resp, "Cache-Control", "no-cache");
    enum MHD_Result rc = MHD_queue_response(g->c, 200, resp);
    MHD_destroy_response(resp);
    server_gen_count_http(g->s->gen, 200);
    return rc;
}

static enum MHD_Result generate(struct server *s, struct MHD_Connection *c, enum server_api api,
                                const json_t *body, struct http_access *acc)
{
    struct server_error e;
    struct gen_ctx *g = wcalloc(1, sizeof *g);
    if (!g) {
        server_error_set(&e, 500, NULL, "out of memory");
        return http_send_error(s, c, &e);
    }
    __atomic_add_fetch(&s->n_gen_open, 1, __ATOMIC_RELAXED);
    g->s = s;
    g->c = c;
    g->acc = acc;
    if (start_job(g, api, body, &e)) {
        acc->generation = false; /* refused: no tokens, no finish to log */
        g->finished = true;
        enum MHD_Result r = http_send_error(s, c, &e);
        ctx_free(g);
        return r;
    }
    return g->r.stream ? answer_stream(g) : answer_whole(g);
}

/* ---- tokenize / detokenize (vLLM's shapes) ---------------------------------------------- */

static int tokenize_body(const json_t *body, const struct server_model *m, int32_t **ids,
                         int *n, struct server_error *e)
{
    const json_t *pr = json_object_get(body, "prompt");
    const json_t *msgs = json_object_get(body, "messages");
    const json_t *mv = json_object_get(body, "model");
    if (json_is_string(mv) && strcmp(json_string_value(mv), m->name) &&
        !(m->path && !strcmp(json_string_value(mv), m->path)))
        return server_error_set(e, 404, "model", "The model `%s` does not exist.",
                                json_string_value(mv));
    if (!m->tok)
        return server_error_set(e, 400, NULL, "this model has no tokenizer");
    if (msgs) {
        char *text = NULL;
        int rc = server_chat_render(m, msgs, body, &text, e);
        if (!rc)
            rc = server_chat_encode(m, text, ids, n, e);
        wfree(text);
        return rc;
    }
    if (!json_is_string(pr))
        return server_error_set(e, 400, "prompt", "field 'prompt' (a string) or 'messages' "
                                "required");
    const json_t *as = json_object_get(body, "add_special_tokens");
    if (as && !json_is_boolean(as))
        return server_error_set(e, 400, "add_special_tokens",
                                "field 'add_special_tokens': expected a boolean");
    size_t cnt = 0;
    struct weld_err we = {0};
    if (tokenizer_encode(m->tok, json_string_value(pr), json_string_length(pr),
                         !as || json_is_true(as), true, ids, &cnt, &we))
        return server_error_set(e, 400, "prompt", "prompt: %s", we.msg);
    *n = (int)cnt;
    return 0;
}

static enum MHD_Result tokenize(struct server *s, struct MHD_Connection *c, const json_t *body)
{
    struct server_error e;
    struct server_model m;
    if (!http_model(s, &m)) {
        server_error_set(&e, 503, NULL, "the model is still loading");
        return http_send_error(s, c, &e);
    }
    int32_t *ids = NULL;
    int n = 0;
    if (!json_is_object(body) || tokenize_body(body, &m, &ids, &n, &e)) {
        if (!json_is_object(body))
            server_error_set(&e, 400, NULL, "the request body must be a JSON object");
        wfree(ids);
        return http_send_error(s, c, &e);
    }
    json_t *arr = json_array();
    for (int i = 0; i < n; i++)
        json_array_append_new(arr, json_integer(ids[i]));
    wfree(ids);
    return http_send_json(s, c, 200, json_pack("{s:i, s:i, s:o, s:n}", "count", n,
                                               "max_model_len", m.max_model_len, "tokens", arr,
                                               "token_strs"));
}

static enum MHD_Result detokenize(struct server *s, struct MHD_Connection *c,
                                  const json_t *body)
{
    struct server_error e;
    struct server_model m;
    if (!http_model(s, &m)) {
        server_error_set(&e, 503, NULL, "the model is still loading");
        return http_send_error(s, c, &e);
    }
    const json_t *t = json_is_object(body) ? json_object_get(body, "tokens") : NULL;
    if (!json_is_array(t)) {
        server_error_set(&e, 400, "tokens", "field 'tokens': expected an array of token ids");
        return http_send_error(s, c, &e);
    }
    size_t n = json_array_size(t);
    int32_t *ids = wmalloc((n ? n : 1) * sizeof *ids);
    if (!ids || !m.tok) {
        wfree(ids);
        server_error_set(&e, ids ? 400 : 500, NULL, ids ? "this model has no tokenizer"
                                                        : "out of memory");
        return http_send_error(s, c, &e);
    }
    for (size_t i = 0; i < n; i++) {
        const json_t *v = json_array_get(t, i);
        json_int_t x = json_is_integer(v) ? json_integer_value(v) : -1;
        if (x < 0 || x >= m.n_vocab) {
            wfree(ids);
            server_error_set(&e, 400, "tokens", "tokens[%zu]: not a token id in [0, %d)", i,
                             m.n_vocab);
            return http_send_error(s, c, &e);
        }
        ids[i] = (int32_t)x;
    }
    char *text = NULL;
    size_t len = 0;
    struct weld_err we = {0};
    int rc = tokenizer_decode(m.tok, ids, n, false, &text, &len, &we);
    wfree(ids);
    if (rc) {
        server_error_set(&e, 400, "tokens", "%s", we.msg);
        return http_send_error(s, c, &e);
    }
    json_t *js = json_stringn(text, len);
    wfree(text);
    return http_send_json(s, c, 200, json_pack("{s:o}", "prompt", js ? js : json_string("")));
}

enum MHD_Result http_post(struct server *s, struct MHD_Connection *c, enum http_post which,
                          const json_t *body, struct http_access *acc)
{
    switch (which) {
    case HTTP_POST_COMPLETIONS: return generate(s, c, SERVER_API_COMPLETIONS, body, acc);
    case HTTP_POST_CHAT: return generate(s, c, SERVER_API_CHAT, body, acc);
    case HTTP_POST_TOKENIZE: return tokenize(s, c, body);
    case HTTP_POST_DETOKENIZE: return detokenize(s, c, body);
    case HTTP_POST_EMBEDDINGS: return http_embeddings(s, c, body);
    }
    return MHD_NO;
}

void http_wait_generations(struct server *s, double timeout)
{
    double t_end = time_now() + timeout;
    while (__atomic_load_n(&s->n_gen_open, __ATOMIC_ACQUIRE) > 0 && time_now() < t_end) {
        struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
    }
    int left = __atomic_load_n(&s->n_gen_open, __ATOMIC_ACQUIRE);
    if (left > 0)
        log_warn("weld serve: %d response%s not sent in full after %.0f s (clients not "
                 "reading); closing them", left, left == 1 ? "" : "s", timeout);
}

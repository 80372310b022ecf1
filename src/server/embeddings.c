/*
 * embeddings - POST /v1/embeddings (OpenAI's shape, vLLM's pooling semantics).
 *
 * Request: {"model", "input", "encoding_format", "dimensions", "user",
 * "add_special_tokens"}. input is a string, a list of strings, a list of token ids or a
 * list of token-id lists (at most SERVER_MAX_CHOICES inputs); text is encoded with the
 * tokenizer's special tokens (BOS) unless add_special_tokens is false. encoding_format is
 * "float" (default) or "base64" (the little-endian float32 bytes, what the official
 * clients ask for by default). dimensions (shortening the vector) is not supported: a 400
 * naming it. Other unknown fields are ignored, as in the completion routes.
 *
 * Each input is one engine request of kind REQUEST_KIND_EMBED (engine/request.h): it is
 * scheduled and batched with everything else (prefill chunks; its prefix may come from the
 * prefix cache, its last token is always computed), and its vector is the final hidden
 * state of its last token after the final norm, L2-normalised (last-token pooling, vLLM's
 * default for decoder models; llama-server --embeddings --pooling last), or with
 * `--pooling-type mean` the mean of every prompt token's (then computed in full, never
 * from the prefix cache). No tokens are generated.
 *
 * Response: {"object": "list", "data": [{"object": "embedding", "index": i, "embedding":
 * [...] | "base64"}], "model", "usage": {"prompt_tokens", "total_tokens"}}. A client that
 * goes away cancels its requests (checked every 100 ms while waiting), as in routes.c;
 * requests aborted at shutdown get a 503, failed ones a 500.
 */
#include "server/http.h"

#include "core/alloc.h"
#include "tokenizer/tokenizer.h"

#include <limits.h>
#include <string.h>

struct emb_req {
    struct server_prompt *prompts; /* (n) */
    int n;
    bool base64;
    char model[256];
};

static void emb_req_release(struct emb_req *r)
{
    for (int i = 0; r->prompts && i < r->n; i++) {
        wfree(r->prompts[i].ids);
        wfree(r->prompts[i].text);
    }
    wfree(r->prompts);
}

static int add_input(struct emb_req *r, int32_t *ids, int n_ids, struct server_error *e)
{
    struct server_prompt *np = wrealloc(r->prompts, (size_t)(r->n + 1) * sizeof *np);
    if (!np) {
        wfree(ids);
        return server_error_set(e, 500, NULL, "out of memory");
    }
    r->prompts = np;
    np[r->n++] = (struct server_prompt){.ids = ids, .n_ids = n_ids};
    return 0;
}

static int text_input(struct emb_req *r, const struct server_model *m, const json_t *v,
                      bool special, const char *where, struct server_error *e)
{
    if (!m->tok)
        return server_error_set(e, 400, "input", "%s: this model has no tokenizer; send token "
                                "ids", where);
    if (json_string_length(v) == 0)
        return server_error_set(e, 400, "input", "%s: empty string", where);
    int32_t *ids = NULL;
    size_t n = 0;
    struct weld_err we = {0};
    if (tokenizer_encode(m->tok, json_string_value(v), json_string_length(v), special, true,
                         &ids, &n, &we)) {
        wfree(ids);
        return server_error_set(e, we.status == WELD_ERR_NOMEM ? 500 : 400, "input", "%s: %s",
                                where, we.msg);
    }
    if (n == 0 || n > INT_MAX) {
        wfree(ids);
        return server_error_set(e, 400, "input", "%s: encodes to %zu tokens", where, n);
    }
    return add_input(r, ids, (int)n, e);
}

static int ids_input(struct emb_req *r, const struct server_model *m, const json_t *a,
                     const char *where, struct server_error *e)
{
    int32_t *ids;
    size_t n;
    int rc = server_token_ids(m, a, "input", where, &ids, &n, e);
    return rc ? rc : add_input(r, ids, (int)n, e);
}

static int parse_input(struct emb_req *r, const struct server_model *m, const json_t *in,
                       bool special, struct server_error *e)
{
    if (json_is_string(in))
        return text_input(r, m, in, special, "input", e);
    if (!json_is_array(in) || json_array_size(in) == 0)
        return server_error_set(e, 400, "input", "field 'input' (required): a string, a list "
                                "of strings, a list of token ids or a list of token-id lists");
    size_t n = json_array_size(in);
    if (json_is_integer(json_array_get(in, 0)))
        return ids_input(r, m, in, "input", e);
    if (n > SERVER_MAX_CHOICES)
        return server_error_set(e, 400, "input", "input: %zu inputs, at most %d", n,
                                SERVER_MAX_CHOICES);
    for (size_t i = 0; i < n; i++) {
        const json_t *v = json_array_get(in, i);
        char where[32];
        snprintf(where, sizeof where, "input[%zu]", i);
        int rc = json_is_string(v) ? text_input(r, m, v, special, where, e)
                 : json_is_array(v) ? ids_input(r, m, v, where, e)
                 : server_error_set(e, 400, "input", "%s: expected a string or a list of "
                                    "token ids", where);
        if (rc)
            return rc;
    }
    return 0;
}

static int parse(const json_t *body, const struct server_model *m, struct emb_req *r,
                 struct server_error *e)
{
    if (!json_is_object(body))
        return server_error_set(e, 400, NULL, "the request body must be a JSON object");
    const json_t *mv = json_object_get(body, "model");
    snprintf(r->model, sizeof r->model, "%s", m->name);
    if (mv && !json_is_null(mv)) {
        if (!json_is_string(mv))
            return server_error_set(e, 400, "model", "field 'model': expected a string");
        const char *s = json_string_value(mv);
        if (strcmp(s, m->name) && !(m->path && !strcmp(s, m->path)))
            return server_error_set(e, 404, "model", "The model `%s` does not exist.", s);
    }
    const json_t *dims = json_object_get(body, "dimensions");
    if (dims && !json_is_null(dims))
        return server_error_set(e, 400, "dimensions", "field 'dimensions' is not supported: "
                                "this model's embeddings have %d dimensions; leave it out",
                                m->dim);
    const json_t *fmt = json_object_get(body, "encoding_format");
    if (fmt && !json_is_null(fmt)) {
        const char *f = json_is_string(fmt) ? json_string_value(fmt) : "";
        if (strcmp(f, "float") && strcmp(f, "base64"))
            return server_error_set(e, 400, "encoding_format", "field 'encoding_format': "
                                    "expected \"float\" or \"base64\"");
        r->base64 = !strcmp(f, "base64");
    }
    const json_t *as = json_object_get(body, "add_special_tokens");
    if (as && !json_is_boolean(as))
        return server_error_set(e, 400, "add_special_tokens",
                                "field 'add_special_tokens': expected a boolean");
    int rc = parse_input(r, m, json_object_get(body, "input"), !as || json_is_true(as), e);
    if (rc)
        return rc;
    for (int i = 0; i < r->n; i++)
        if (r->prompts[i].n_ids > m->max_model_len)
            return server_error_set(e, 400, "input", "This model's maximum context length is "
                                    "%d tokens. However, input[%d] has %d tokens. Please "
                                    "shorten it.", m->max_model_len, i, r->prompts[i].n_ids);
    return 0;
}

static json_t *base64_json(const float *v, int n)
{
    static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t nb = (size_t)n * 4, len = (nb + 2) / 3 * 4;
    unsigned char *b = wmalloc(nb ? nb : 1);
    char *out = wmalloc(len + 1);
    json_t *j = NULL;
    if (b && out) {
        for (int i = 0; i < n; i++) { /* little-endian float32, as numpy's '<f4' */
            uint32_t u;
            memcpy(&u, &v[i], 4);
            for (int k = 0; k < 4; k++)
                b[(size_t)i * 4 + (size_t)k] = (unsigned char)(u >> (8 * k));
        }
        size_t o = 0;
        for (size_t i = 0; i < nb; i += 3) {
            uint32_t x = (uint32_t)b[i] << 16 | (i + 1 < nb ? (uint32_t)b[i + 1] << 8 : 0) |
                         (i + 2 < nb ? b[i + 2] : 0);
            out[o++] = tab[x >> 18 & 63];
            out[o++] = tab[x >> 12 & 63];
            out[o++] = i + 1 < nb ? tab[x >> 6 & 63] : '=';
            out[o++] = i + 2 < nb ? tab[x & 63] : '=';
        }
        out[o] = 0;
        j = json_stringn(out, o);
    }
    wfree(b);
    wfree(out);
    return j;
}

static json_t *vector_json(const float *v, int n, bool base64)
{
    if (base64)
        return base64_json(v, n);
    json_t *a = json_array();
    for (int i = 0; a && i < n; i++)
        json_array_append_new(a, json_real((double)v[i]));
    return a;
}

/* Wait for every input's vector; NULL when the client went away (job cancelled). */
static json_t *collect(struct server *s, struct MHD_Connection *c, struct server_job *job,
                       const struct emb_req *r, int *prompt_tokens, struct server_error *e)
{
    json_t **vec = wcalloc((size_t)r->n, sizeof *vec);
    char *fail = NULL;
    bool gone = false, aborted = false;
    if (!vec) {
        server_error_set(e, 500, NULL, "out of memory");
        return NULL;
    }
    for (;;) {
        struct server_event *ev = NULL;
        int rc = server_gen_next(job, 100, &ev);
        if (rc < 0)
            break;
        if (rc == 1 && ev->choice >= 0 && ev->choice < r->n) {
            if (ev->emb && !vec[ev->choice])
                vec[ev->choice] = vector_json(ev->emb, ev->n_emb, r->base64);
            if (ev->finish) {
                *prompt_tokens += ev->n_prompt;
                aborted |= ev->reason == REQUEST_FINISH_ABORT;
                if (ev->reason != REQUEST_FINISH_STOP && !fail)
                    fail = wstrdup(ev->error ? ev->error : server_finish_str(ev->reason));
            }
        }
        wfree(ev);
        if (rc == 0 && httpd_client_gone(c)) {
            gone = true;
            break;
        }
    }
    json_t *data = NULL;
    if (!gone && !fail) {
        data = json_array();
        for (int i = 0; data && i < r->n; i++) {
            if (!vec[i]) {
                fail = wstrdup("no result");
                break;
            }
            json_array_append_new(data, json_pack("{s:s, s:i, s:O}", "object", "embedding",
                                                  "index", i, "embedding", vec[i]));
        }
    }
    if (fail) {
        json_decref(data);
        data = NULL;
        if (aborted) /* shutdown */
            server_error_set(e, 503, NULL, "the server is shutting down; retry elsewhere");
        else
            server_error_set(e, 500, NULL, "embedding failed: %s", fail);
    } else if (gone) {
        e->http = 0; /* no answer */
    }
    (void)s;
    for (int i = 0; i < r->n; i++)
        json_decref(vec[i]);
    wfree(vec);
    wfree(fail);
    return data;
}

enum MHD_Result http_embeddings(struct server *s, struct MHD_Connection *c, const json_t *body)
{
    struct server_error e = {0};
    struct server_model m;
    struct emb_req r = {0};
    if (!http_model(s, &m)) {
        server_error_set(&e, 503, NULL, "the model is still loading");
        return http_send_error(s, c, &e);
    }
    if (parse(body, &m, &r, &e)) {
        emb_req_release(&r);
        return http_send_error(s, c, &e);
    }
    struct request_params p = request_params_default();
    p.kind = REQUEST_KIND_EMBED;
    p.pooling = s->o.pooling;
    struct server_job *job = server_gen_submit(s->gen, &p, r.prompts, r.n, &e);
    if (!job || server_gen_wait_accepted(job, &e)) {
        server_gen_release(job);
        emb_req_release(&r);
        return http_send_error(s, c, &e);
    }
    int prompt_tokens = 0;
    json_t *data = collect(s, c, job, &r, &prompt_tokens, &e);
    if (!data)
        server_gen_cancel(job);
    server_gen_release(job);
    enum MHD_Result res;
    if (data)
        res = http_send_json(s, c, 200, json_pack("{s:s, s:o, s:s, s:{s:i, s:i}}", "object",
                                                   "list", "data", data, "model", r.model,
                                                   "usage", "prompt_tokens", prompt_tokens,
                                                   "total_tokens", prompt_tokens));
    else
        res = e.http ? http_send_error(s, c, &e) : MHD_NO;
    emb_req_release(&r);
    return res;
}

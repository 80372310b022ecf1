/*
 * request - parameters, prompt encoding and the per-sequence output path (see request.h).
 *
 * Ownership: struct request holds deep copies of everything in its params (stop strings,
 * stop token ids, cache salt, prompt ids); p.prompt / p.prompt_ids / p.messages are cleared
 * in the copy because the prompt now lives in r->prompt. Each sequence owns its sampler,
 * detokenizer, stop matcher, generated-token array and a text scratch buffer that grows to
 * hold one step's delta.
 */
#include "engine/request.h"

#include "core/alloc.h"
#include "core/progress.h"
#include "engine/stop.h"
#include "grammar/grammar.h"
#include "grammar/vocab.h"
#include "template/chat_template.h"
#include "tokenizer/tokenizer.h"

#include <math.h>
#include <string.h>

const char *request_finish_str(enum request_finish f)
{
    switch (f) {
    case REQUEST_FINISH_STOP: return "stop";
    case REQUEST_FINISH_LENGTH: return "length";
    case REQUEST_FINISH_ABORT: return "abort";
    case REQUEST_FINISH_ERROR: return "error";
    default: return NULL;
    }
}

struct request_params request_params_default(void)
{
    struct request_params p;
    memset(&p, 0, sizeof p);
    p.add_special_tokens = true;
    p.sampling = sampler_params_default();
    p.max_tokens = 16;
    p.skip_special_tokens = true;
    p.n = 1;
    p.logprobs = -1;
    p.prompt_logprobs = -1;
    p.kv_remote_tokens = -1;
    return p;
}

static int check_counts(const struct request_params *p, struct weld_err *e)
{
    if (p->kind != REQUEST_KIND_GENERATE && p->kind != REQUEST_KIND_EMBED)
        return err_set(e, WELD_ERR_INVALID_ARG, "kind: %d is not a request kind", (int)p->kind);
    if (p->pooling != REQUEST_POOLING_LAST && p->pooling != REQUEST_POOLING_MEAN)
        return err_set(e, WELD_ERR_INVALID_ARG, "pooling: %d is not a pooling type",
                       (int)p->pooling);
    if (p->kind == REQUEST_KIND_EMBED && (p->n != 1 || p->prompt_logprobs >= 0))
        return err_set(e, WELD_ERR_INVALID_ARG, "an embedding request takes n = 1 (got %d) "
                       "and no prompt_logprobs", p->n);
    if (p->prompt_logprobs < -1 || p->prompt_logprobs > REQUEST_MAX_LOGPROBS)
        return err_set(e, WELD_ERR_INVALID_ARG, "prompt_logprobs: %d, must be in [0, %d] "
                       "(or off)", p->prompt_logprobs, REQUEST_MAX_LOGPROBS);
    if (p->kind == REQUEST_KIND_GENERATE && p->max_tokens < (p->prompt_logprobs >= 0 ? 0 : 1))
        return err_set(e, WELD_ERR_INVALID_ARG, "max_tokens: %d, must be at least 1 (0 only "
                       "with prompt logprobs: echo)", p->max_tokens);
    if (p->min_tokens < 0 || p->min_tokens > p->max_tokens)
        return err_set(e, WELD_ERR_INVALID_ARG,
                       "min_tokens: %d, must be in [0, max_tokens = %d]", p->min_tokens,
                       p->max_tokens);
    if (p->n < 1 || p->n > REQUEST_MAX_N)
        return err_set(e, WELD_ERR_INVALID_ARG, "n: %d, must be in [1, %d]", p->n,
                       REQUEST_MAX_N);
    if (p->logprobs < -1 || p->logprobs > REQUEST_MAX_LOGPROBS)
        return err_set(e, WELD_ERR_INVALID_ARG, "logprobs: %d, must be in [0, %d] (or off)",
                       p->logprobs, REQUEST_MAX_LOGPROBS);
    if (p->n_stop < 0 || p->n_stop > REQUEST_MAX_STOPS || (p->n_stop && !p->stop))
        return err_set(e, WELD_ERR_INVALID_ARG, "stop: %d strings, at most %d", p->n_stop,
                       REQUEST_MAX_STOPS);
    if (p->n_stop_token_ids < 0 || (p->n_stop_token_ids && !p->stop_token_ids))
        return err_set(e, WELD_ERR_INVALID_ARG, "stop_token_ids: bad count %d",
                       p->n_stop_token_ids);
    if (p->n_logit_bias < 0 || (p->n_logit_bias && (!p->logit_bias_ids || !p->logit_bias)))
        return err_set(e, WELD_ERR_INVALID_ARG, "logit_bias: bad count %d", p->n_logit_bias);
    return WELD_OK;
}

int request_params_check(const struct request_params *p, int n_vocab, struct weld_err *e)
{
    int n_src = (p->prompt != NULL) + (p->prompt_ids != NULL) + (p->messages != NULL);
    if (n_src != 1)
        return err_set(e, WELD_ERR_INVALID_ARG,
                       "prompt: give exactly one of prompt, prompt_token_ids, messages "
                       "(got %d)", n_src);
    if (p->prompt_ids && p->n_prompt_ids < 1)
        return err_set(e, WELD_ERR_INVALID_ARG, "prompt_token_ids: empty");
    int rc = check_counts(p, e);
    if (rc)
        return rc;
    if ((rc = sampler_params_check(&p->sampling, e)))
        return rc;
    for (int i = 0; i < p->n_stop; i++) {
        size_t l = p->stop[i] ? strlen(p->stop[i]) : 0;
        if (l == 0 || !stop_utf8_valid(p->stop[i], l))
            return err_set(e, WELD_ERR_INVALID_ARG, "stop[%d]: %s", i,
                           l ? "not valid UTF-8" : "empty stop string");
    }
    for (int i = 0; n_vocab > 0 && i < p->n_stop_token_ids; i++)
        if (p->stop_token_ids[i] < 0 || p->stop_token_ids[i] >= n_vocab)
            return err_set(e, WELD_ERR_INVALID_ARG,
                           "stop_token_ids[%d]: %d outside the vocabulary [0, %d)", i,
                           (int)p->stop_token_ids[i], n_vocab);
    for (int i = 0; i < p->n_logit_bias; i++)
        if ((n_vocab > 0 && (p->logit_bias_ids[i] < 0 || p->logit_bias_ids[i] >= n_vocab)) ||
            !isfinite(p->logit_bias[i]))
            return err_set(e, WELD_ERR_INVALID_ARG,
                           "logit_bias[%d]: token %d (bias %g) outside the vocabulary [0, %d) "
                           "or not finite", i, (int)p->logit_bias_ids[i],
                           (double)p->logit_bias[i], n_vocab);
    for (int i = 0; n_vocab > 0 && p->prompt_ids && i < p->n_prompt_ids; i++)
        if (p->prompt_ids[i] < 0 || p->prompt_ids[i] >= n_vocab)
            return err_set(e, WELD_ERR_INVALID_ARG,
                           "prompt_token_ids[%d]: %d outside the vocabulary [0, %d)", i,
                           (int)p->prompt_ids[i], n_vocab);
    return WELD_OK;
}

/* Render chat messages with src, else the tokenizer's template (add_generation_prompt). */
static int render_messages(const struct tokenizer *tok, const char *src, const json_t *messages,
                           char **out, struct weld_err *e)
{
    if (!src)
        src = tokenizer_chat_template(tok);
    if (!src)
        return err_set(e, WELD_ERR_NOT_FOUND,
                       "messages: the model has no chat template; send a prompt instead");
    if (!json_is_array(messages))
        return err_set(e, WELD_ERR_INVALID_ARG, "messages: must be an array of objects");
    struct chat_template *t = NULL;
    int rc = chat_template_parse(&t, src, strlen(src), e);
    if (rc != WELD_OK)
        return err_prefix(e, "chat template");
    json_t *ctx = json_object();
    json_object_set_new(ctx, "messages", json_deep_copy(messages));
    json_object_set_new(ctx, "add_generation_prompt", json_true());
    const char *bos = tokenizer_bos_text(tok), *eos = tokenizer_eos_text(tok);
    if (bos)
        json_object_set_new(ctx, "bos_token", json_string(bos));
    if (eos)
        json_object_set_new(ctx, "eos_token", json_string(eos));
    rc = chat_template_render(t, ctx, out, NULL, e);
    if (rc != WELD_OK)
        err_prefix(e, "messages: chat template");
    json_decref(ctx);
    chat_template_free(t);
    return rc;
}

int request_encode_prompt(const struct tokenizer *tok, const struct request_params *p,
                          int32_t **ids, int *n_ids, struct weld_err *e)
{
    *ids = NULL;
    *n_ids = 0;
    if (p->prompt_ids) {
        if (p->n_prompt_ids < 1)
            return err_set(e, WELD_ERR_INVALID_ARG, "prompt_token_ids: empty");
        if (!(*ids = wmalloc((size_t)p->n_prompt_ids * sizeof **ids)))
            return err_set(e, WELD_ERR_NOMEM, "prompt: out of memory");
        memcpy(*ids, p->prompt_ids, (size_t)p->n_prompt_ids * sizeof **ids);
        *n_ids = p->n_prompt_ids;
        return WELD_OK;
    }
    if (!tok)
        return err_set(e, WELD_ERR_INVALID_ARG, "prompt: text needs a tokenizer");
    char *rendered = NULL;
    const char *text = p->prompt;
    bool add_special = p->add_special_tokens;
    int rc;
    if (p->messages) {
        if ((rc = render_messages(tok, p->chat_template, p->messages, &rendered, e)))
            return rc;
        text = rendered;
        const char *bos = tokenizer_bos_text(tok);
        add_special = !(bos && *bos && !strncmp(text, bos, strlen(bos)));
    }
    if (!text)
        return err_set(e, WELD_ERR_INVALID_ARG, "prompt: missing");
    size_t n = 0;
    rc = tokenizer_encode(tok, text, strlen(text), add_special, true, ids, &n, e);
    wfree(rendered);
    if (rc)
        return err_prefix(e, p->messages ? "messages" : "prompt");
    if (n == 0 || n > (size_t)INT32_MAX) {
        wfree(*ids);
        *ids = NULL;
        return err_set(e, WELD_ERR_INVALID_ARG, "prompt: encodes to %zu tokens", n);
    }
    *n_ids = (int)n;
    return WELD_OK;
}

void request_free(struct request *r)
{
    if (!r)
        return;
    for (int i = 0; r->seqs && i < r->n_seqs; i++) {
        struct request_seq *s = &r->seqs[i];
        sampler_free(s->smp);
        detok_free(s->dt);
        stop_free(s->stop);
        wfree(s->tokens);
        wfree(s->text);
        gmatch_free(s->gm);
    }
    wfree(r->seqs);
    wfree(r->allow);
    for (int i = 0; i < r->p.n_stop; i++)
        wfree((char *)r->p.stop[i]);
    wfree((void *)r->p.stop);
    wfree((void *)r->p.stop_token_ids);
    wfree((void *)r->p.cache_salt);
    wfree((void *)r->p.logit_bias_ids);
    wfree((void *)r->p.logit_bias);
    wfree(r->prompt);
    wfree(r->edit_ids);
    wfree(r->edit_vals);
    wfree(r->top_ids);
    wfree(r->top_lps);
    wfree(r->eog_ids);
    wfree(r->plp);
    wfree(r->plp_ids);
    wfree(r->plp_lps);
    wfree(r->emb);
    wfree(r->emb_sum);
    wfree(r->error);
    wfree(r);
}

/* Deep-copy the params' owned parts into r->p; false when out of memory. */
static bool copy_params(struct request *r, const struct request_params *p)
{
    r->p = *p;
    r->p.prompt = NULL;
    r->p.prompt_ids = NULL;
    r->p.n_prompt_ids = 0;
    r->p.messages = NULL;
    r->p.chat_template = NULL;
    r->p.stop = NULL;
    r->p.n_stop = 0;
    r->p.stop_token_ids = NULL;
    r->p.cache_salt = NULL;
    r->p.logit_bias_ids = NULL;
    r->p.logit_bias = NULL;
    r->p.grammar = NULL;
    if (p->n_logit_bias) {
        int32_t *ids = wmalloc((size_t)p->n_logit_bias * sizeof *ids);
        float *b = wmalloc((size_t)p->n_logit_bias * sizeof *b);
        r->p.logit_bias_ids = ids;
        r->p.logit_bias = b;
        if (!ids || !b)
            return false;
        memcpy(ids, p->logit_bias_ids, (size_t)p->n_logit_bias * sizeof *ids);
        memcpy(b, p->logit_bias, (size_t)p->n_logit_bias * sizeof *b);
    }
    if (p->n_stop) {
        char **s = wcalloc((size_t)p->n_stop, sizeof *s);
        if (!s)
            return false;
        r->p.stop = (const char *const *)s;
        for (int i = 0; i < p->n_stop; i++, r->p.n_stop++)
            if (!(s[i] = wstrdup(p->stop[i])))
                return false;
    }
    if (p->n_stop_token_ids) {
        int32_t *ids = wmalloc((size_t)p->n_stop_token_ids * sizeof *ids);
        if (!ids)
            return false;
        memcpy(ids, p->stop_token_ids, (size_t)p->n_stop_token_ids * sizeof *ids);
        r->p.stop_token_ids = ids;
    }
    if (p->cache_salt && !(r->p.cache_salt = wstrdup(p->cache_salt)))
        return false;
    return true;
}

/* The ids min_tokens masks: every end-of-generation id of the tokenizer. */
static bool collect_eog(struct request *r)
{
    if (!r->tok || r->p.min_tokens == 0 || r->p.ignore_eos)
        return true;
    int n = 0;
    for (int id = 0; id < r->n_vocab; id++)
        if (tokenizer_is_eog(r->tok, id))
            n++;
    if (!n)
        return true;
    if (!(r->eog_ids = wmalloc((size_t)n * sizeof *r->eog_ids)))
        return false;
    for (int id = 0; id < r->n_vocab; id++)
        if (tokenizer_is_eog(r->tok, id))
            r->eog_ids[r->n_eog++] = id;
    return true;
}

/* Room for the most edits a step can make (row_edits). */
static bool edits_alloc(struct request *r)
{
    size_t n = (size_t)r->n_eog + (size_t)r->p.n_stop_token_ids + (size_t)r->p.n_logit_bias;
    r->edit_ids = wmalloc((n ? n : 1) * sizeof *r->edit_ids);
    r->edit_vals = wmalloc((n ? n : 1) * sizeof *r->edit_vals);
    return r->edit_ids && r->edit_vals;
}

static int seq_init(struct request *r, int i, struct weld_err *e)
{
    struct request_seq *s = &r->seqs[i];
    s->index = i;
    s->stop_token = -1;
    struct sampler_params sp = r->p.sampling;
    sp.seed += (uint64_t)i * 0x9E3779B97F4A7C15ull;
    int rc = sampler_create(&s->smp, &sp, r->n_vocab, e);
    if (rc)
        return rc;
    for (int k = 0; k < r->n_prompt; k++)
        if ((rc = sampler_accept(s->smp, r->prompt[k], true)))
            return err_set(e, rc, "prompt[%d]: token %d not accepted by the sampler", k,
                           (int)r->prompt[k]);
    if ((rc = stop_create(&s->stop, r->p.stop, r->p.n_stop, r->p.include_stop_str_in_output,
                          e)))
        return rc;
    stop_arm(s->stop, r->p.min_tokens == 0);
    if (r->tok && !(s->dt = detok_create(r->tok, r->p.skip_special_tokens)))
        return err_set(e, WELD_ERR_NOMEM, "request: out of memory");
    if (s->dt)
        detok_prime(s->dt, r->prompt, (size_t)r->n_prompt);
    return WELD_OK;
}

/* prompt_logprobs: one entry per prompt token, each pointing at its tops; entry 0 (no
   context to predict it from) has logprob NAN and is scored from the start. */
static int plp_alloc(struct request *r, struct weld_err *e)
{
    const size_t n = (size_t)r->n_prompt, N = (size_t)r->p.prompt_logprobs;
    r->plp = wcalloc(n, sizeof *r->plp);
    r->plp_ids = wmalloc((n * N + 1) * sizeof *r->plp_ids);
    r->plp_lps = wmalloc((n * N + 1) * sizeof *r->plp_lps);
    if (!r->plp || !r->plp_ids || !r->plp_lps)
        return err_set(e, WELD_ERR_NOMEM, "request: out of memory for %zu prompt logprobs", n);
    for (size_t i = 0; i < n; i++)
        r->plp[i] = (struct request_logprob){.token = r->prompt[i], .logprob = NAN,
                                             .top_ids = r->plp_ids + i * N,
                                             .top_logprobs = r->plp_lps + i * N};
    r->n_prompt_lp = 1;
    return WELD_OK;
}

int request_create(struct request **out, uint64_t id, const struct request_params *p,
                   const int32_t *prompt, int n_prompt, const struct tokenizer *tok,
                   int n_vocab, const struct request_callbacks *cb, struct weld_err *e)
{
    *out = NULL;
    int rc = request_params_check(p, n_vocab, e);
    if (rc)
        return rc;
    if (n_prompt < 1 || !prompt || n_vocab < 1)
        return err_set(e, WELD_ERR_INVALID_ARG, "prompt: %d tokens (n_vocab %d)", n_prompt,
                       n_vocab);
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= n_vocab)
            return err_set(e, WELD_ERR_INVALID_ARG, "prompt[%d]: token %d outside [0, %d)",
                           i, (int)prompt[i], n_vocab);
    struct request *r = wcalloc(1, sizeof *r);
    if (!r)
        return err_set(e, WELD_ERR_NOMEM, "request: out of memory");
    r->id = id;
    r->tok = tok;
    r->n_vocab = n_vocab;
    if (cb)
        r->cb = *cb;
    r->t_arrival = time_now();
    if (!copy_params(r, p) || !(r->prompt = wmalloc((size_t)n_prompt * sizeof *r->prompt)) ||
        !(r->top_ids = wmalloc(REQUEST_MAX_LOGPROBS * sizeof *r->top_ids)) ||
        !(r->top_lps = wmalloc(REQUEST_MAX_LOGPROBS * sizeof *r->top_lps)) ||
        !collect_eog(r) || !edits_alloc(r) ||
        !(r->seqs = wcalloc((size_t)p->n, sizeof *r->seqs))) {
        rc = err_set(e, WELD_ERR_NOMEM, "request: out of memory");
        goto fail;
    }
    memcpy(r->prompt, prompt, (size_t)n_prompt * sizeof *prompt);
    r->n_prompt = n_prompt;
    r->n_seqs = p->n;
    if (p->prompt_logprobs >= 0 && (rc = plp_alloc(r, e)))
        goto fail;
    for (int i = 0; i < r->n_seqs; i++)
        if ((rc = seq_init(r, i, e)))
            goto fail;
    *out = r;
    return WELD_OK;
fail:
    request_free(r);
    return rc;
}

int request_constrain(struct request *r, struct gspace *sp, const struct gvocab *v,
                      struct weld_err *e)
{
    if (v->n_vocab != r->n_vocab)
        return err_set(e, WELD_ERR_INVALID_ARG, "request: a constraint over %d tokens for a "
                       "model of %d", v->n_vocab, r->n_vocab);
    if (!r->allow && !(r->allow = wmalloc(((size_t)r->n_vocab + 31) / 32 * sizeof *r->allow)))
        return err_set(e, WELD_ERR_NOMEM, "request: out of memory for a token mask");
    for (int i = 0; i < r->n_seqs; i++) {
        int rc;
        gmatch_free(r->seqs[i].gm);
        r->seqs[i].gm = NULL;
        if ((rc = gmatch_create_in(&r->seqs[i].gm, sp, e)))
            return rc;
    }
    r->gv = v;
    return WELD_OK;
}

int request_seq_forced(struct request *r, int i, int32_t *out, int max)
{
    struct request_seq *s = &r->seqs[i];
    if (!s->gm || s->finish != REQUEST_FINISH_NONE)
        return 0;
    uint8_t buf[256];
    const int nb = gmatch_forced(s->gm, buf, (int)sizeof buf);
    return nb ? gvocab_greedy_tokens(r->gv, buf, nb, out, max) : 0;
}

int32_t request_seq_last_token(const struct request *r, int i)
{
    const struct request_seq *s = &r->seqs[i];
    return s->n_tokens ? s->tokens[s->n_tokens - 1] : -1;
}

bool request_done(const struct request *r) { return r->n_finished == r->n_seqs; }

/* Append len bytes to the sequence's delta scratch at *used; false when out of memory. */
static bool text_add(struct request_seq *s, size_t *used, const char *text, size_t len)
{
    if (!len)
        return true;
    if (*used + len + 1 > s->cap_text) {
        size_t cap = s->cap_text ? s->cap_text : 256;
        while (cap < *used + len + 1)
            cap *= 2;
        char *nb = wrealloc(s->text, cap);
        if (!nb)
            return false;
        s->text = nb;
        s->cap_text = cap;
    }
    memcpy(s->text + *used, text, len);
    *used += len;
    s->text[*used] = 0;
    return true;
}

/* Run detokenizer output (push id, or drain/flush with id < 0 and flush) through the stop
   matcher into the delta scratch. *matched: a stop string completed. */
static int text_feed(struct request_seq *s, int32_t id, bool flush, size_t *used,
                     bool *matched, struct weld_err *e)
{
    char buf[512];
    *matched = false;
    if (!s->dt)
        return WELD_OK;
    for (int first = 1;; first = 0) {
        size_t k = flush ? detok_flush(s->dt, buf, sizeof buf)
                         : detok_push(s->dt, first ? id : -1, buf, sizeof buf);
        if (k == 0 && !first)
            break;
        const char *o;
        size_t ol;
        int rc = stop_push(s->stop, buf, k, &o, &ol, matched, e);
        if (rc)
            return rc;
        if (!text_add(s, used, o, ol))
            return err_set(e, WELD_ERR_NOMEM, "request: out of memory");
        if (*matched || k == 0)
            break;
    }
    return WELD_OK;
}

static bool is_stop_token(const struct request *r, int32_t t)
{
    for (int i = 0; i < r->p.n_stop_token_ids; i++)
        if (r->p.stop_token_ids[i] == t)
            return true;
    return false;
}

/* Logits to sample from: the raw row, or a copy with eog / stop ids masked while
   min_tokens is not reached and logit_bias added. */
/* Index of id in the step's edit list, or -1. */
static int edit_index(const struct request *r, int n, int32_t id)
{
    for (int k = 0; k < n; k++)
        if (r->edit_ids[k] == id)
            return k;
    return -1;
}

/* What sampling changes in the raw row this step (sampler_edits, each token once): under
   min_tokens the eog and stop token ids get -inf, then each logit_bias entry is added to
   its token's (possibly masked) logit, in order. NULL when nothing changes. */
static const struct sampler_edits *row_edits(struct request *r, const struct request_seq *s,
                                             const float *logits, struct sampler_edits *ed)
{
    bool mask = s->n_tokens < r->p.min_tokens && (r->n_eog || r->p.n_stop_token_ids);
    if (!mask && !r->p.n_logit_bias)
        return NULL;
    int n = 0;
    for (int k = 0; mask && k < r->n_eog + r->p.n_stop_token_ids; k++) {
        int32_t id = k < r->n_eog ? r->eog_ids[k] : r->p.stop_token_ids[k - r->n_eog];
        if (edit_index(r, n, id) < 0) {
            r->edit_ids[n] = id;
            r->edit_vals[n++] = -INFINITY;
        }
    }
    for (int k = 0; k < r->p.n_logit_bias; k++) {
        int32_t id = r->p.logit_bias_ids[k];
        int j = edit_index(r, n, id);
        if (j < 0) {
            j = n++;
            r->edit_ids[j] = id;
            r->edit_vals[j] = logits[id];
        }
        r->edit_vals[j] += r->p.logit_bias[k];
    }
    *ed = (struct sampler_edits){r->edit_ids, r->edit_vals, n, NULL};
    return ed;
}

static void seq_finish(struct request *r, struct request_seq *s, enum request_finish f)
{
    s->finish = f;
    r->n_finished++;
    if (r->n_finished == r->n_seqs)
        r->t_finish = time_now();
    if (!r->cb.on_finish)
        return;
    double now = time_now();
    struct request_result res = {
        .req_id = r->id,
        .seq_index = s->index,
        .finish = f,
        .stop_reason = f == REQUEST_FINISH_STOP ? stop_string(s->stop, stop_matched_index(s->stop))
                                                : NULL,
        .stop_token = s->stop_token,
        .error = f == REQUEST_FINISH_ERROR ? (r->error ? r->error : "error") : NULL,
        .n_prompt_tokens = r->n_prompt,
        .n_cached_tokens = r->n_cached,
        .n_tier_tokens = r->n_tier,
        .n_kv_saved_tokens = r->n_kv_saved,
        .kv_saved_hash = {r->kv_saved_hash[0], r->kv_saved_hash[1]},
        .kv_ticket = r->kv_ticket,
        .n_generated_tokens = s->n_tokens,
        .t_queue = r->t_scheduled > 0 ? r->t_scheduled - r->t_arrival : now - r->t_arrival,
        .t_first_token = r->t_first_token > 0 ? r->t_first_token - r->t_arrival : 0,
        .t_total = now - r->t_arrival,
        .prompt_logprobs = r->plp && r->n_prompt_lp == r->n_prompt ? r->plp : NULL,
        .n_prompt_logprobs = r->plp && r->n_prompt_lp == r->n_prompt ? r->n_prompt : 0,
        .embedding = r->emb,
        .n_embedding = r->emb ? r->n_emb : 0,
    };
    r->cb.on_finish(r->cb.user, r->id, s->index, &res);
}

/* Record the sampled token and decide the finish (see the top of request.h). */
static int seq_output(struct request *r, struct request_seq *s, int32_t t, bool at_limit,
                      size_t *used, enum request_finish *fin, struct weld_err *e)
{
    bool matched = false;
    int rc;
    *fin = REQUEST_FINISH_NONE;
    bool eog = !r->p.ignore_eos && r->tok && tokenizer_is_eog(r->tok, t);
    if (eog || is_stop_token(r, t)) {
        s->stop_token = t;
        *fin = REQUEST_FINISH_STOP;
        if (!eog && r->p.include_stop_str_in_output && (rc = text_feed(s, t, false, used,
                                                                       &matched, e)))
            return rc;
    } else {
        if ((rc = sampler_accept(s->smp, t, false)))
            return err_set(e, rc, "sampled token %d not accepted", (int)t);
        stop_arm(s->stop, s->n_tokens >= r->p.min_tokens);
        if ((rc = text_feed(s, t, false, used, &matched, e)))
            return rc;
        if (matched)
            *fin = REQUEST_FINISH_STOP;
        else if (s->n_tokens >= r->p.max_tokens || at_limit)
            *fin = REQUEST_FINISH_LENGTH;
    }
    if (*fin != REQUEST_FINISH_NONE && !matched) {
        if ((rc = text_feed(s, -1, true, used, &matched, e)))
            return rc;
        if (matched)
            *fin = REQUEST_FINISH_STOP;
        const char *o;
        size_t ol;
        stop_flush(s->stop, &o, &ol);
        if (!text_add(s, used, o, ol))
            return err_set(e, WELD_ERR_NOMEM, "request: out of memory");
    }
    return WELD_OK;
}

static bool seq_push_token(struct request_seq *s, int32_t t)
{
    if (s->n_tokens == s->cap_tokens) {
        int cap = s->cap_tokens ? s->cap_tokens * 2 : 16;
        int32_t *nt = wrealloc(s->tokens, (size_t)cap * sizeof *nt);
        if (!nt)
            return false;
        s->tokens = nt;
        s->cap_tokens = cap;
    }
    s->tokens[s->n_tokens++] = t;
    return true;
}

/* The constraint's mask for s's next token into r->allow, less what the step's edits ban
   (-inf: min_tokens' eog and stop ids, a -100 bias is not a ban) and eog ids under
   ignore_eos. *any: some token is allowed. */
static int seq_mask(struct request *r, struct request_seq *s, const struct sampler_edits *ed,
                    bool *any, struct weld_err *e)
{
    const double t0 = time_now();
    int rc = gmatch_mask(s->gm, r->gv, r->allow, e);
    if (rc)
        return rc;
    for (int k = 0; ed && k < ed->n; k++)
        if (isinf(ed->vals[k]) && ed->vals[k] < 0)
            r->allow[ed->ids[k] / 32] &= ~(1u << (ed->ids[k] % 32));
    for (int k = 0; r->p.ignore_eos && k < r->gv->n_eog; k++)
        r->allow[r->gv->eog[k] / 32] &= ~(1u << (r->gv->eog[k] % 32));
    uint32_t acc = 0;
    for (int w = 0; w < (r->n_vocab + 31) / 32; w++)
        acc |= r->allow[w];
    *any = acc != 0;
    r->n_masks++;
    r->t_masks += time_now() - t0;
    return WELD_OK;
}

/* Advance s's matcher over the sampled token's bytes (end-of-generation and stop ids end
   the sequence instead). */
static int seq_match(struct request *r, struct request_seq *s, int32_t t, struct weld_err *e)
{
    const struct gvocab *v = r->gv;
    if ((!r->p.ignore_eos && r->tok && tokenizer_is_eog(r->tok, t)) || is_stop_token(r, t))
        return WELD_OK;
    if (!v->bytes[t] || !gmatch_accept(s->gm, (const uint8_t *)v->bytes[t], v->len[t]))
        return err_set(e, WELD_ERR_INTERNAL, "request %llu: token %d is outside its "
                       "constraint", (unsigned long long)r->id, (int)t);
    return WELD_OK;
}

/* No token may follow: a complete sentence finishes "stop" (its held text flushed), an
   incomplete one "error". */
static int seq_constraint_end(struct request *r, struct request_seq *s, bool *finished,
                              struct weld_err *e)
{
    *finished = true;
    if (!gmatch_can_end(s->gm)) {
        if (!r->error) {
            char msg[200];
            snprintf(msg, sizeof msg, "the constraint allows no token of the vocabulary "
                     "after %d generated tokens (it needs bytes no token has)", s->n_tokens);
            r->error = wstrdup(msg);
        }
        seq_finish(r, s, REQUEST_FINISH_ERROR);
        return WELD_OK;
    }
    size_t used = 0;
    bool matched;
    int rc = text_feed(s, -1, true, &used, &matched, e);
    if (rc)
        return rc;
    const char *o;
    size_t ol;
    stop_flush(s->stop, &o, &ol);
    if (!text_add(s, &used, o, ol))
        return err_set(e, WELD_ERR_NOMEM, "request: out of memory");
    if (used && r->cb.on_delta)
        r->cb.on_delta(r->cb.user, r->id, s->index, s->text, used, NULL, 0, NULL);
    seq_finish(r, s, REQUEST_FINISH_STOP);
    return WELD_OK;
}

int request_seq_step(struct request *r, int i, const float *logits,
                     const struct logits_top *top, bool at_ctx_limit, bool *finished,
                     struct weld_err *e)
{
    *finished = false;
    if (i < 0 || i >= r->n_seqs || r->seqs[i].finish != REQUEST_FINISH_NONE)
        return err_set(e, WELD_ERR_INVALID_ARG, "request %llu: sequence %d is not running",
                       (unsigned long long)r->id, i);
    struct request_seq *s = &r->seqs[i];
    int token, rc;
    struct sampler_edits ed;
    const struct sampler_edits *edp = row_edits(r, s, logits, &ed);
    if (s->gm) {
        bool any;
        if ((rc = seq_mask(r, s, edp, &any, e)))
            return err_prefix(e, "request %llu seq %d", (unsigned long long)r->id, i);
        if (!any)
            return seq_constraint_end(r, s, finished, e);
        if (!edp)
            ed = (struct sampler_edits){0}, edp = &ed;
        ed.allow = r->allow;
    }
    if ((rc = sampler_sample_ex(s->smp, logits, top, edp, &token, e)))
        return err_prefix(e, "request %llu seq %d", (unsigned long long)r->id, i);
    if (s->gm && (rc = seq_match(r, s, token, e)))
        return rc;
    if (!seq_push_token(s, token))
        return err_set(e, WELD_ERR_NOMEM, "request: out of memory");
    if (r->t_first_token == 0)
        r->t_first_token = time_now();
    struct request_logprob lp = {.token = token, .top_ids = r->top_ids,
                                 .top_logprobs = r->top_lps};
    if (r->p.logprobs >= 0) {
        const double lse = sampler_log_sum_exp(logits, r->n_vocab, top);
        lp.logprob = (float)((double)logits[token] - lse);
        lp.n_top = r->p.logprobs ? sampler_top_logprobs_ex(logits, r->n_vocab, r->p.logprobs,
                                                           top, lse, r->top_ids, r->top_lps)
                                 : 0;
    }
    size_t used = 0;
    enum request_finish fin;
    if ((rc = seq_output(r, s, token, at_ctx_limit, &used, &fin, e)))
        return rc;
    int32_t tk = token;
    if (r->cb.on_delta)
        r->cb.on_delta(r->cb.user, r->id, i, used ? s->text : "", used, &tk, 1,
                       r->p.logprobs >= 0 ? &lp : NULL);
    if (fin != REQUEST_FINISH_NONE) {
        seq_finish(r, s, fin);
        *finished = true;
    }
    return WELD_OK;
}

void request_prompt_logprobs(struct request *r, int first, const float *rows, int n_rows)
{
    if (!r->plp)
        return;
    const int N = r->p.prompt_logprobs;
    for (int k = 0; k < n_rows; k++) {
        const int pos = first + k + 1; /* the prompt token row k predicts */
        if (pos != r->n_prompt_lp || pos >= r->n_prompt)
            continue;
        const float *row = rows + (size_t)k * (size_t)r->n_vocab;
        const double lse = sampler_log_sum_exp(row, r->n_vocab, NULL);
        struct request_logprob *lp = &r->plp[pos];
        lp->logprob = (float)((double)row[lp->token] - lse);
        lp->n_top = N > 0 ? sampler_top_logprobs_ex(row, r->n_vocab, N, NULL, lse,
                                                    r->plp_ids + (size_t)pos * N,
                                                    r->plp_lps + (size_t)pos * N)
                          : 0;
        r->n_prompt_lp = pos + 1;
    }
}

int request_embed_rows(struct request *r, int first, const float *rows, int n_rows, int dim,
                       struct weld_err *e)
{
    if (!r->emb_sum && !(r->emb_sum = wcalloc((size_t)(dim > 0 ? dim : 1), sizeof *r->emb_sum)))
        return err_set(e, WELD_ERR_NOMEM, "request: out of memory for an embedding");
    for (int k = 0; k < n_rows; k++) {
        if (first + k != r->n_emb_pos || first + k >= r->n_prompt)
            continue;
        for (int i = 0; i < dim; i++)
            r->emb_sum[i] += rows[(size_t)k * (size_t)dim + (size_t)i];
        r->n_emb_pos++;
    }
    return WELD_OK;
}

int request_embed_done(struct request *r, const float *h, int dim, struct weld_err *e)
{
    const bool mean = r->p.pooling == REQUEST_POOLING_MEAN;
    if (mean && (!r->emb_sum || r->n_emb_pos != r->n_prompt))
        return err_set(e, WELD_ERR_INTERNAL, "request %llu: mean pooling saw %d of %d prompt "
                       "tokens", (unsigned long long)r->id, r->n_emb_pos, r->n_prompt);
    float *v = wmalloc((size_t)(dim > 0 ? dim : 1) * sizeof *v);
    if (!v)
        return err_set(e, WELD_ERR_NOMEM, "request: out of memory for an embedding");
    wfree(r->emb);
    r->emb = v;
    r->n_emb = dim;
    double ss = 0;
    for (int i = 0; i < dim; i++) {
        double x = mean ? r->emb_sum[i] / r->n_prompt : (double)h[i];
        ss += x * x;
    }
    const double inv = ss > 0 ? 1.0 / sqrt(ss) : 0.0; /* an all-zero state stays zero */
    for (int i = 0; i < dim; i++)
        v[i] = (float)((mean ? r->emb_sum[i] / r->n_prompt : (double)h[i]) * inv);
    if (r->t_first_token == 0)
        r->t_first_token = time_now();
    for (int i = 0; i < r->n_seqs; i++)
        if (r->seqs[i].finish == REQUEST_FINISH_NONE)
            seq_finish(r, &r->seqs[i], REQUEST_FINISH_STOP);
    return WELD_OK;
}

void request_finish_prompt_only(struct request *r)
{
    if (r->t_first_token == 0)
        r->t_first_token = time_now();
    for (int i = 0; i < r->n_seqs; i++)
        if (r->seqs[i].finish == REQUEST_FINISH_NONE)
            seq_finish(r, &r->seqs[i], REQUEST_FINISH_LENGTH);
}

void request_finish_all(struct request *r, enum request_finish f, const char *msg)
{
    if (f == REQUEST_FINISH_ERROR && msg && !r->error)
        r->error = wstrdup(msg);
    for (int i = 0; i < r->n_seqs; i++)
        if (r->seqs[i].finish == REQUEST_FINISH_NONE)
            seq_finish(r, &r->seqs[i], f);
}

/*
 * spec - the --speculative-config parser and the ngram proposer (spec.h).
 *
 * ngram: for L from lookup_max down to lookup_min (never more than n - 1), the pattern is
 * the last L tokens; the search walks back from the latest earlier start, so the most
 * recent occurrence wins (recent text predicts best: the continuation of a span being
 * copied). The guess is the tokens after the occurrence, up to max_k and never past the
 * sequence's end. O(n * L) per call, no state: a prompt of thousands of tokens costs
 * microseconds a step.
 */
#include "spec/spec.h"

#include "core/alloc.h"
#include "core/json.h"
#include "exec/backend.h"
#include "model/model.h"

#include <string.h>

int spec_ngram_propose(const int32_t *tokens, int n, int lookup_min, int lookup_max, int max_k,
                       int32_t *out)
{
    if (n < 2 || max_k < 1 || lookup_min < 1)
        return 0;
    for (int L = lookup_max < n - 1 ? lookup_max : n - 1; L >= lookup_min; L--) {
        const int32_t *pat = tokens + n - L;
        for (int start = n - L - 1; start >= 0; start--) {
            if (memcmp(tokens + start, pat, sizeof(int32_t) * (size_t)L) != 0)
                continue;
            int from = start + L, k = n - from < max_k ? n - from : max_k;
            memcpy(out, tokens + from, sizeof(int32_t) * (size_t)k);
            return k;
        }
    }
    return 0;
}

struct ngram {
    struct spec_proposer base;
    int lookup_min, lookup_max;
};

static int ngram_propose(struct spec_proposer *p, uint64_t seq_key, const int32_t *tokens, int n,
                         int max_k, int32_t *out)
{
    (void)seq_key;
    const struct ngram *g = (const struct ngram *)p;
    return spec_ngram_propose(tokens, n, g->lookup_min, g->lookup_max, max_k, out);
}

static void ngram_free(struct spec_proposer *p)
{
    wfree(p);
}

int spec_proposer_create(struct spec_proposer **out, const struct spec_config *c,
                         const struct spec_limits *lim, struct weld_err *e)
{
    *out = NULL;
    if (c->method == SPEC_DRAFT_MODEL)
        return spec_draft_create(out, c->draft_model, lim, e);
    if (c->method == SPEC_MTP)
        return spec_mtp_create(out, lim, e);
    if (c->method != SPEC_NGRAM)
        return err_set(e, WELD_ERR_UNSUPPORTED, "speculative decoding: no such method");
    struct ngram *g = wcalloc(1, sizeof *g);
    if (!g)
        return err_set(e, WELD_ERR_NOMEM, "speculative decoding: out of memory");
    g->base = (struct spec_proposer){.propose = ngram_propose, .free = ngram_free};
    g->lookup_min = c->lookup_min;
    g->lookup_max = c->lookup_max;
    *out = &g->base;
    return WELD_OK;
}

int spec_proposer_cost(const struct spec_config *c, const struct model *target, int block_size,
                       size_t *block_bytes, size_t *weight_bytes, struct weld_err *e)
{
    *block_bytes = *weight_bytes = 0;
    if (c->method == SPEC_MTP && target && target->cfg.n_nextn > 0 && target->nextn) {
        struct model view;
        model_mtp_view(target, 0, &view);
        *block_bytes = backend_kv_block_bytes(&view.cfg, DT_F16, block_size);
    } else if (c->method == SPEC_DRAFT_MODEL) {
        struct model *m = NULL;
        int rc = model_load(&m, c->draft_model, e);
        if (rc) {
            err_prefix(e, "draft model %s", c->draft_model);
            return rc;
        }
        *block_bytes = backend_kv_block_bytes(&m->cfg, DT_F16, block_size);
        *weight_bytes = model_weight_bytes(m);
        model_free(m);
    }
    return WELD_OK;
}

void spec_proposer_free(struct spec_proposer *p)
{
    if (p && p->free)
        p->free(p);
}

static int get_int(const json_t *o, const char *key, int lo, int hi, int *v, struct weld_err *e)
{
    const json_t *j = json_object_get(o, key);
    if (!j || json_is_null(j))
        return WELD_OK;
    if (!json_is_integer(j) || json_integer_value(j) < lo || json_integer_value(j) > hi)
        return err_set(e, WELD_ERR_INVALID_ARG,
                       "--speculative-config: \"%s\" must be an "
                       "integer in [%d, %d]",
                       key, lo, hi);
    *v = (int)json_integer_value(j);
    return WELD_OK;
}

int spec_config_parse(const char *text, struct spec_config *c, struct weld_err *e)
{
    return spec_config_parse_draft(text, NULL, c, e);
}

int spec_config_parse_draft(const char *text, const char *draft, struct spec_config *c,
                            struct weld_err *e)
{
    memset(c, 0, sizeof *c);
    json_error_t je;
    json_t *o = json_loads(text, 0, &je);
    if (!o || !json_is_object(o)) {
        json_decref(o);
        return err_set(e, WELD_ERR_INVALID_ARG, "--speculative-config: not a JSON object (%s)",
                       o ? "another JSON value" : je.text);
    }
    static const char *const known[] = {"method", "num_speculative_tokens", "prompt_lookup_min",
                                        "prompt_lookup_max", "model"};
    const char *key;
    json_t *val;
    int rc = WELD_OK;
    json_object_foreach(o, key, val)
    {
        bool ok = false;
        for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
            ok |= !strcmp(key, known[i]);
        if (!ok && !rc)
            rc = err_set(e, WELD_ERR_INVALID_ARG,
                         "--speculative-config: unknown field \"%s\" "
                         "(known: method, num_speculative_tokens, prompt_lookup_min, "
                         "prompt_lookup_max, model)",
                         key);
    }
    const json_t *m = json_object_get(o, "method"), *model = json_object_get(o, "model");
    if (!rc && m && !json_is_string(m))
        rc = err_set(e, WELD_ERR_INVALID_ARG, "--speculative-config: \"method\" must be a string");
    if (!rc && model && !json_is_string(model))
        rc = err_set(e, WELD_ERR_INVALID_ARG, "--speculative-config: \"model\" must be a path");
    if (!rc) {
        const char *ms = m ? json_string_value(m) : model || draft ? "draft_model" : NULL;
        if (!ms)
            rc = err_set(e, WELD_ERR_INVALID_ARG,
                         "--speculative-config: give \"method\" "
                         "(\"ngram\", \"mtp\") or a draft \"model\"");
        else if (!strcmp(ms, "ngram"))
            c->method = SPEC_NGRAM;
        else if (!strcmp(ms, "draft_model") || !strcmp(ms, "draft"))
            c->method = SPEC_DRAFT_MODEL;
        else if (!strcmp(ms, "mtp") || !strcmp(ms, "deepseek_mtp"))
            c->method = SPEC_MTP;
        else
            rc = err_set(e, WELD_ERR_INVALID_ARG,
                         "--speculative-config: method \"%s\" is not "
                         "known (ngram, draft_model, mtp)",
                         ms);
    }
    if (!rc && draft && model)
        rc = err_set(e, WELD_ERR_INVALID_ARG,
                     "--model-draft and --speculative-config's \"model\" both name a draft: "
                     "give one");
    else if (!rc && draft && c->method != SPEC_DRAFT_MODEL)
        rc = err_set(e, WELD_ERR_INVALID_ARG,
                     "--model-draft needs method draft_model, not \"%s\", in --speculative-config",
                     json_string_value(m));
    else if (!rc && c->method == SPEC_DRAFT_MODEL && draft) {
        if (strlen(draft) >= sizeof c->draft_model)
            rc = err_set(e, WELD_ERR_INVALID_ARG, "--model-draft: path too long");
        else
            strcpy(c->draft_model, draft);
    } else if (!rc && c->method == SPEC_DRAFT_MODEL) {
        if (!model)
            rc = err_set(e, WELD_ERR_INVALID_ARG,
                         "--speculative-config: method draft_model "
                         "needs \"model\"");
        else if (strlen(json_string_value(model)) >= sizeof c->draft_model)
            rc = err_set(e, WELD_ERR_INVALID_ARG, "--speculative-config: \"model\" is too long");
        else
            strcpy(c->draft_model, json_string_value(model));
    }
    c->num_tokens = 4, c->lookup_min = 1, c->lookup_max = 4;
    if (!rc)
        rc = get_int(o, "num_speculative_tokens", 1, SPEC_MAX_TOKENS, &c->num_tokens, e);
    if (!rc)
        rc = get_int(o, "prompt_lookup_min", 1, 64, &c->lookup_min, e);
    if (!rc)
        rc = get_int(o, "prompt_lookup_max", 1, 64, &c->lookup_max, e);
    if (!rc && c->lookup_max < c->lookup_min)
        rc = err_set(e, WELD_ERR_INVALID_ARG,
                     "--speculative-config: prompt_lookup_max %d is "
                     "below prompt_lookup_min %d",
                     c->lookup_max, c->lookup_min);
    json_decref(o);
    return rc;
}

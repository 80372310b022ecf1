/*
 * bench_masks - `weld bench masks`: the time one token mask of a constraint takes, per
 * token, on a model's vocabulary.
 *
 * For each JSON schema of --schemas (a file holding one schema, or an array of
 * {"name", "schema"} like tests/data/json_schemas/corpus.json), --seqs sequences decode up
 * to --tokens tokens each the way a random-weight model would: each step computes the
 * mask (timed alone, with a monotonic clock) and picks one allowed token uniformly (an
 * end-of-generation token only when it is all that is allowed). The sequences of one
 * schema share one space, as the requests of one schema do in the engine, so its later
 * sequences meet states whose masks are cached. Reported: the median, p90 and p99 of every
 * mask, those of each schema's first sequence alone (a schema never seen before), the
 * share of masks copied from the cache, and the states made. --json: one JSON object.
 */
#include "cli/cli.h"
#include "core/alloc.h"
#include "core/err.h"
#include "core/log.h"
#include "core/mfile.h"
#include "core/progress.h"
#include "core/rng.h"
#include "grammar/grammar.h"
#include "grammar/schema.h"
#include "grammar/vocab.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct times {
    double *t;
    size_t n, cap;
};

static bool times_add(struct times *t, double x)
{
    if (t->n == t->cap) {
        size_t cap = t->cap ? 2 * t->cap : 4096;
        double *nt = wrealloc(t->t, cap * sizeof *nt);
        if (!nt)
            return false;
        t->t = nt, t->cap = cap;
    }
    t->t[t->n++] = x;
    return true;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double pct(struct times *t, double p)
{
    if (!t->n)
        return 0;
    qsort(t->t, t->n, sizeof *t->t, cmp_d);
    size_t i = (size_t)(p * (double)(t->n - 1) + 0.5);
    return t->t[i];
}

/* A token allowed by mask, uniformly (eog ids only when nothing else is); -1: none. */
static int32_t pick(const uint32_t *mask, const struct gvocab *v, struct rng *g)
{
    const int W = (v->n_vocab + 31) / 32;
    long long n = 0;
    for (int w = 0; w < W; w++)
        n += __builtin_popcount(mask[w]);
    long long n_eog = 0;
    for (int i = 0; i < v->n_eog; i++)
        n_eog += mask[v->eog[i] / 32] >> (v->eog[i] % 32) & 1;
    if (!n)
        return -1;
    if (n == n_eog)
        for (int i = 0; i < v->n_eog; i++)
            if (mask[v->eog[i] / 32] >> (v->eog[i] % 32) & 1)
                return v->eog[i];
    for (;;) {
        long long k = (long long)(rng_u64(g) % (uint64_t)n);
        for (int w = 0; w < W; w++) {
            int c = __builtin_popcount(mask[w]);
            if (k >= c) {
                k -= c;
                continue;
            }
            uint32_t b = mask[w];
            while (k--)
                b &= b - 1;
            int32_t id = w * 32 + __builtin_ctz(b);
            bool eog = false;
            for (int i = 0; i < v->n_eog; i++)
                eog |= v->eog[i] == id;
            if (!eog)
                return id;
            break; /* an eog among others: draw again */
        }
    }
}

int cmd_bench_masks(int argc, char **argv)
{
    const char *model = NULL, *schemas = NULL;
    int seqs = 8, tokens = 256;
    int64_t seed = 1;
    bool json = false;
    const struct cli_opt opts[] = {
        {"model", 'm', OPT_STR, &model, "MODEL", "the model whose tokenizer gives the vocabulary"},
        {"schemas", 0, OPT_STR, &schemas, "FILE", "a JSON schema, or an array of {\"name\", \"schema\"}"},
        {"seqs", 0, OPT_INT, &seqs, "N", "sequences per schema (default 8)"},
        {"tokens", 0, OPT_INT, &tokens, "N", "tokens per sequence at most (default 256)"},
        {"seed", 's', OPT_I64, &seed, "S", "random seed (default 1)"},
        {"json", 0, OPT_FLAG, &json, NULL, "print one JSON object on stdout"},
    };
    int n_pos = 0;
    int prc = cli_parse(argc - 1, argv + 1, "bench masks -m MODEL --schemas FILE [options]",
                        "Time the token masks of JSON-schema constraints on MODEL's vocabulary "
                        "(random allowed tokens;\nsequences of one schema share its cache).",
                        opts, sizeof opts / sizeof *opts, NULL, 0, &n_pos);
    if (prc)
        return prc == 1 ? 0 : 2;
    if (!model || !schemas || seqs < 1 || tokens < 1) {
        fprintf(stderr, "weld bench masks: -m MODEL and --schemas FILE are required; --seqs "
                        "and --tokens at least 1 (see --help)\n");
        return 2;
    }
    struct weld_err e = {0};
    struct model *m = NULL;
    struct tokenizer *tok = NULL;
    struct gvocab *v = NULL;
    char *text = NULL;
    size_t len;
    json_t *doc = NULL;
    int rc = file_read_all(schemas, &text, &len, &e);
    if (rc == WELD_OK && !(doc = json_loadb(text, len, 0, NULL)))
        rc = err_set(&e, WELD_ERR_FORMAT, "%s: not JSON", schemas);
    if (rc == WELD_OK && (rc = model_load(&m, model, &e)) == WELD_OK) {
        rc = m->source == MODEL_SRC_GGUF ? tokenizer_load_gguf(&tok, m->gguf, &e)
                                         : tokenizer_load_hf(&tok, m->dir, &e);
    }
    if (rc == WELD_OK)
        rc = gvocab_create(&v, tok, m->cfg.n_vocab, &e);
    struct times all = {0}, cold = {0};
    uint64_t hits = 0, misses = 0;
    int states = 0, n_schemas = 0;
    uint32_t *mask = v ? wmalloc(((size_t)v->n_vocab + 31) / 32 * sizeof *mask) : NULL;
    struct rng g;
    rng_seed(&g, (uint64_t)seed);
    const size_t n_items = json_is_array(doc) ? json_array_size(doc) : 1;
    for (size_t i = 0; rc == WELD_OK && i < n_items; i++) {
        const json_t *item = json_is_array(doc) ? json_array_get(doc, i) : doc;
        const json_t *s = json_is_array(doc) ? json_object_get(item, "schema") : item;
        char *st = json_dumps(s, JSON_COMPACT | JSON_ENCODE_ANY), *gbnf = NULL;
        struct grammar *gr = NULL;
        struct gspace *sp = NULL;
        struct weld_err se;
        if (!st || grammar_gbnf_from_json_schema(st, strlen(st), &gbnf, &se) ||
            grammar_parse_gbnf(&gr, gbnf, strlen(gbnf), NULL, &se) ||
            gspace_create(&sp, gr, &se)) {
            log_warn("schema %zu skipped: %s", i, st ? se.msg : "out of memory");
            free(st), wfree(gbnf), grammar_free(gr);
            continue;
        }
        n_schemas++;
        for (int q = 0; rc == WELD_OK && q < seqs; q++) {
            struct gmatch *gm = NULL;
            if ((rc = gmatch_create_in(&gm, sp, &e)))
                break;
            for (int t = 0; t < tokens; t++) {
                double t0 = time_now();
                if ((rc = gmatch_mask(gm, v, mask, &e)))
                    break;
                double dt = time_now() - t0;
                if (!times_add(&all, dt) || (q == 0 && !times_add(&cold, dt))) {
                    rc = err_set(&e, WELD_ERR_NOMEM, "out of memory");
                    break;
                }
                int32_t id = pick(mask, v, &g);
                if (id < 0 || !v->bytes[id] ||
                    !gmatch_accept(gm, (const uint8_t *)v->bytes[id], v->len[id]))
                    break;
            }
            gmatch_free(gm);
        }
        struct gspace_counts c;
        gspace_counts(sp, &c);
        hits += c.mask_hits, misses += c.mask_misses, states += c.states;
        gspace_free(sp), grammar_free(gr), wfree(gbnf), free(st);
    }
    if (rc == WELD_OK) {
        const double med = pct(&all, 0.5), p90 = pct(&all, 0.9), p99 = pct(&all, 0.99);
        const double cmed = pct(&cold, 0.5), cp90 = pct(&cold, 0.9);
        double sum = 0;
        for (size_t i = 0; i < all.n; i++)
            sum += all.t[i];
        fprintf(stderr,
                "weld bench masks: %s, %d tokens; %d schemas x %d sequences, %zu masks\n"
                "  per mask: median %.1f us, p90 %.1f us, p99 %.1f us, mean %.1f us\n"
                "  first sequence of each schema: median %.1f us, p90 %.1f us (%zu masks)\n"
                "  cache: %.1f%% of masks copied; %d states made\n",
                model, v->n_vocab, n_schemas, seqs, all.n, 1e6 * med, 1e6 * p90, 1e6 * p99,
                all.n ? 1e6 * sum / (double)all.n : 0, 1e6 * cmed, 1e6 * cp90, cold.n,
                hits + misses ? 100.0 * (double)hits / (double)(hits + misses) : 0, states);
        if (json)
            printf("{\"n_vocab\": %d, \"schemas\": %d, \"masks\": %zu, \"median_us\": %.2f, "
                   "\"p90_us\": %.2f, \"p99_us\": %.2f, \"cold_median_us\": %.2f, "
                   "\"hit_rate\": %.4f}\n",
                   v->n_vocab, n_schemas, all.n, 1e6 * med, 1e6 * p90, 1e6 * p99, 1e6 * cmed,
                   hits + misses ? (double)hits / (double)(hits + misses) : 0);
    } else {
        fprintf(stderr, "weld bench masks: %s\n", e.msg);
    }
    wfree(all.t), wfree(cold.t), wfree(mask), wfree(text);
    json_decref(doc);
    gvocab_free(v);
    tokenizer_free(tok);
    model_free(m);
    return rc == WELD_OK ? 0 : 1;
}

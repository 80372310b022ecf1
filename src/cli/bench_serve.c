/*
 * bench_serve - `weld bench serve`: load-test an OpenAI-compatible server (weld serve,
 * llama.cpp's llama-server, vLLM) over HTTP, in the shape of `vllm bench serve`.
 *
 *   weld bench serve --base-url URL --dataset random|shared-prefix|chat --num-prompts N
 *        --request-rate R|inf --max-concurrency C [--model NAME] [--input-len I]
 *        [--output-len O] [--mix I:O[:W],...] [--prefix-len P] [--num-groups G] [--seed S] [--api-key KEY]
 *        [--endpoint /v1/completions|/v1/chat/completions] [--tokenizer PATH]
 *        [--goodput ttft:MS tpot:MS e2el:MS] [--save-result FILE] [--json]
 *
 * Flow: build the dataset (before the clock; src/loadgen/loadgen_data.c), ask the server
 * for its model name if --model is absent (GET /v1/models, data[0].id, as vLLM does), run
 * the requests (loadgen_run: one thread, curl multi), summarise, then print vLLM's
 * "Serving Benchmark Result" table on stdout, or with --json the result object on stdout
 * and the table on stderr. --save-result writes the same object, pretty-printed, with the
 * per-request arrays. The first few failures are listed on stderr; the exit status is 1
 * when no request succeeded.
 *
 * --goodput takes vLLM's form, several KEY:MS words after one flag (the argv is rewritten
 * to one "--goodput=..." before the table-driven parser sees it); commas work too.
 */
#include "cli/cli.h"

#include "core/alloc.h"
#include "core/err.h"
#include "core/json.h"
#include "format/gguf.h"
#include "loadgen/loadgen.h"
#include "tokenizer/tokenizer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

struct serve_opts {
    const char *base_url, *endpoint, *dataset, *model, *api_key, *tokenizer;
    const char *request_rate, *goodput, *save_result, *mix;
    int num_prompts, max_concurrency, input_len, output_len, prefix_len, num_groups;
    int64_t seed;
    float burstiness, timeout;
    bool json;
    struct cli_strs scrape; /* --scrape-metrics URL...; none: base_url */
};

/* ---- the servers' KV cache counters (/metrics before and after the run) ------------------- */

/* weld serve's counters that say where prompt tokens came from and what moved; "@tier"
   keys are summed per tier label. */
static const char *const kv_keys[] = {
    "weld:prefix_cache_queries_total",       "weld:prefix_cache_hits_total",
    "weld:kv_tier_query_tokens_total",       "weld:kv_tier_hit_tokens_total",
    "weld:kv_tier_read_bytes_total@file",    "weld:kv_tier_read_bytes_total@store",
    "weld:kv_tier_written_bytes_total@file", "weld:kv_tier_written_bytes_total@store",
    "weld:kv_tier_block_hits_total@file",    "weld:kv_tier_block_hits_total@store",
    "weld:kv_tier_read_seconds_total@file",  "weld:kv_tier_read_seconds_total@store",
    "weld:kv_transfer_saved_tokens_total",   "weld:kv_transfer_save_seconds_total",
    "weld:kv_transfer_saved_requests_total", "weld:kv_transfer_remote_tokens_total",
    "weld:kv_transfer_loaded_tokens_total",  "weld:prompt_tokens_total",
};
enum { KV_N = sizeof kv_keys / sizeof kv_keys[0] };

/* Add every server's values of kv_keys into v; false when one could not be read. */
static bool kv_scrape(const struct serve_opts *o, const char *api_key, double *v)
{
    bool all = true;
    memset(v, 0, KV_N * sizeof *v);
    int n = o->scrape.n ? o->scrape.n : 1;
    for (int i = 0; i < n; i++) {
        const char *url = o->scrape.n ? o->scrape.v[i] : o->base_url;
        char *txt = NULL;
        struct weld_err e;
        if (loadgen_fetch_text(url, "/metrics", api_key, 10, &txt, &e)) {
            all = false;
            continue;
        }
        for (char *line = txt; line && *line;) {
            char *end = strchr(line, '\n');
            if (end)
                *end = 0;
            if (*line != '#') {
                size_t nl = strcspn(line, "{ ");
                const char *tier = strstr(line, "tier=\"");
                const char *sp = strrchr(line, ' ');
                for (int k = 0; sp && k < KV_N; k++) {
                    const char *at = strchr(kv_keys[k], '@');
                    size_t kl = at ? (size_t)(at - kv_keys[k]) : strlen(kv_keys[k]);
                    if (kl != nl || strncmp(line, kv_keys[k], kl))
                        continue;
                    if (at && (!tier || strncmp(tier + 6, at + 1, strlen(at + 1)) ||
                               tier[6 + strlen(at + 1)] != '"'))
                        continue;
                    v[k] += strtod(sp + 1, NULL);
                }
            }
            line = end ? end + 1 : NULL;
        }
        wfree(txt);
    }
    return all;
}

static double kvd(const double *a, const double *b, const char *key)
{
    for (int k = 0; k < KV_N; k++)
        if (!strcmp(kv_keys[k], key))
            return b[k] - a[k];
    return 0;
}

/* The "KV cache" lines of the report and their JSON (NULL when no server had weld's). */
static json_t *kv_report(FILE *f, const double *a, const double *b)
{
    double q = kvd(a, b, "weld:prefix_cache_queries_total");
    double h = kvd(a, b, "weld:prefix_cache_hits_total");
    double tq = kvd(a, b, "weld:kv_tier_query_tokens_total");
    double th = kvd(a, b, "weld:kv_tier_hit_tokens_total");
    double pt = kvd(a, b, "weld:prompt_tokens_total");
    if (q <= 0 && pt <= 0)
        return NULL;
    fprintf(f, "%s\n", "----------------KV cache (servers' /metrics)--------------");
    fprintf(f, "%-40s %-10.2f\n", "Prefix hit rate, pool (%):", q > 0 ? 100 * h / q : 0.0);
    fprintf(f, "%-40s %-10.2f\n", "Prefix hit rate, KV tier (%):", tq > 0 ? 100 * th / tq : 0.0);
    fprintf(f, "%-40s %-10.2f\n",
            "Prompt tokens computed (%):", pt > 0 ? 100 * (pt - h - th) / pt : 0.0);
    json_t *j = json_pack("{s:f, s:f, s:f, s:f}", "prefix_hit_rate_pool", q > 0 ? h / q : 0.0,
                          "prefix_hit_rate_tier", tq > 0 ? th / tq : 0.0, "prompt_tokens", pt,
                          "tier_hit_tokens", th);
    static const char *const tiers[] = {"file", "store"};
    for (int t = 0; t < 2; t++) {
        char k1[80], k2[80], k3[80], k4[80];
        snprintf(k1, sizeof k1, "weld:kv_tier_read_bytes_total@%s", tiers[t]);
        snprintf(k2, sizeof k2, "weld:kv_tier_written_bytes_total@%s", tiers[t]);
        snprintf(k3, sizeof k3, "weld:kv_tier_block_hits_total@%s", tiers[t]);
        snprintf(k4, sizeof k4, "weld:kv_tier_read_seconds_total@%s", tiers[t]);
        double rd = kvd(a, b, k1), wr = kvd(a, b, k2), bh = kvd(a, b, k3), rs = kvd(a, b, k4);
        if (rd <= 0 && wr <= 0)
            continue;
        char lbl[64];
        snprintf(lbl, sizeof lbl, "KV tier %s read / written (MB):", tiers[t]);
        fprintf(f, "%-40s %.1f / %.1f\n", lbl, rd / 1e6, wr / 1e6);
        snprintf(lbl, sizeof lbl, "KV tier %s read per block (ms):", tiers[t]);
        fprintf(f, "%-40s %-10.3f\n", lbl, bh > 0 ? 1e3 * rs / bh : 0.0);
        json_object_set_new(j, tiers[t],
                            json_pack("{s:f, s:f, s:f}", "read_bytes", rd, "written_bytes", wr,
                                      "read_ms_per_block", bh > 0 ? 1e3 * rs / bh : 0.0));
    }
    double sr = kvd(a, b, "weld:kv_transfer_saved_requests_total");
    if (sr > 0) {
        double st = kvd(a, b, "weld:kv_transfer_saved_tokens_total");
        double ss = kvd(a, b, "weld:kv_transfer_save_seconds_total");
        double rt = kvd(a, b, "weld:kv_transfer_remote_tokens_total");
        double lt = kvd(a, b, "weld:kv_transfer_loaded_tokens_total");
        fprintf(f, "%-40s %-10.0f\n", "P/D handoffs:", sr);
        fprintf(f, "%-40s %-10.3f\n", "P/D save per handoff (ms):", 1e3 * ss / sr);
        fprintf(f, "%-40s %-10.2f\n",
                "P/D tokens loaded by decode (%):", rt > 0 ? 100 * lt / rt : 0.0);
        json_object_set_new(j, "pd",
                            json_pack("{s:f, s:f, s:f, s:f}", "handoffs", sr, "saved_tokens", st,
                                      "save_ms_per_handoff", 1e3 * ss / sr, "loaded_tokens", lt));
    }
    fprintf(f, "%s\n", "==================================================");
    return j;
}

static int load_tokenizer(const char *path, struct tokenizer **t, struct weld_err *e)
{
    struct stat st;
    if (stat(path, &st) != 0)
        return err_set(e, WELD_ERR_IO, "--tokenizer %s: no such file or directory", path);
    size_t n = strlen(path);
    if (S_ISDIR(st.st_mode) || n < 5 || strcmp(path + n - 5, ".gguf"))
        return tokenizer_load_hf(t, path, e);
    struct gguf_file *f = NULL;
    int rc = gguf_open(&f, path, e);
    if (rc == WELD_OK)
        rc = tokenizer_load_gguf(t, f, e);
    gguf_close(f);
    return rc;
}

/* "inf" (or <= 0 meaning no pacing) or a positive rate. */
static int parse_rate(const char *s, double *out)
{
    if (!strcmp(s, "inf") || !strcmp(s, "Inf") || !strcmp(s, "infinity")) {
        *out = INFINITY;
        return 0;
    }
    char *end;
    double v = strtod(s, &end);
    if (end == s || *end || !(v > 0) || isinf(v))
        return -1;
    *out = v;
    return 0;
}

/* Copy argv, folding "--goodput A B C" (words with ':' after the flag) into
   "--goodput=A B C". *joined owns the folded string. */
static char **fold_goodput(int argc, char **argv, int *out_argc, char **joined)
{
    char **v = wcalloc((size_t)argc + 1, sizeof *v);
    if (!v)
        return NULL;
    int n = 0;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--goodput") || *joined) {
            v[n++] = argv[i];
            continue;
        }
        size_t len = strlen("--goodput=") + 1;
        int k = i + 1;
        while (k < argc && strncmp(argv[k], "--", 2) && strchr(argv[k], ':'))
            len += strlen(argv[k++]) + 1;
        if (k == i + 1) { /* nothing to fold: let the parser report it */
            v[n++] = argv[i];
            continue;
        }
        char *s = wmalloc(len);
        if (!s) {
            wfree(v);
            return NULL;
        }
        strcpy(s, "--goodput=");
        for (int j = i + 1; j < k; j++) {
            if (j > i + 1)
                strcat(s, " ");
            strcat(s, argv[j]);
        }
        *joined = s;
        v[n++] = s;
        i = k - 1;
    }
    *out_argc = n;
    return v;
}

static void print_failures(const struct loadgen_result *r, int n)
{
    int shown = 0, failed = 0;
    for (int i = 0; i < n; i++) {
        if (r[i].success)
            continue;
        failed++;
        if (shown < 5) {
            fprintf(stderr, "weld bench serve: request %d failed: %s\n", i,
                    r[i].error ? r[i].error : "(no message: out of memory)");
            shown++;
        }
    }
    if (failed > shown)
        fprintf(stderr, "weld bench serve: ... %d more failed requests\n", failed - shown);
}

/* The result object: configuration, then the summary and per-request arrays. */
static json_t *result_json(const struct serve_opts *o, const struct loadgen_config *c,
                           const struct loadgen_summary *s, const struct loadgen_slo *slo,
                           const struct loadgen_result *r, int n)
{
    json_t *j = loadgen_summary_json(s, slo, r, n);
    if (!j)
        return NULL;
    char date[32] = "";
    time_t now = time(NULL);
    struct tm tm;
    if (gmtime_r(&now, &tm))
        strftime(date, sizeof date, "%Y%m%d-%H%M%S", &tm);
    json_t *cfg = json_pack("{s:s, s:s, s:s, s:s, s:s, s:s, s:i, s:i, s:i, s:i, s:i, s:I, s:f}",
                            "date", date, "backend", strstr(c->endpoint, "chat") ? "openai-chat"
                                                                                 : "openai",
                            "base_url", c->base_url, "endpoint", c->endpoint, "model_id",
                            c->model, "dataset", o->dataset, "num_prompts", o->num_prompts,
                            "input_len", o->input_len, "output_len", o->output_len,
                            "prefix_len", o->prefix_len, "num_groups", o->num_groups, "seed",
                            (json_int_t)o->seed, "burstiness", (double)c->burstiness);
    int bad = !cfg || json_object_update(j, cfg);
    json_decref(cfg);
    bad |= json_object_set_new(j, "request_rate", isinf(c->request_rate)
                                                      ? json_string("inf")
                                                      : json_real(c->request_rate));
    bad |= json_object_set_new(j, "max_concurrency", c->max_concurrency > 0
                                                         ? json_integer(c->max_concurrency)
                                                         : json_null());
    bad |= json_object_set_new(j, "mix", o->mix ? json_string(o->mix) : json_null());
    bad |= json_object_set_new(j, "tokenizer", o->tokenizer ? json_string(o->tokenizer)
                                                            : json_null());
    if (bad) {
        json_decref(j);
        return NULL;
    }
    return j;
}

static int check_opts(const struct serve_opts *o)
{
    const char *bad = NULL;
    enum loadgen_dataset_kind k;
    if (loadgen_dataset_kind_parse(o->dataset, &k))
        bad = "--dataset: expected random, shared-prefix or chat";
    else if (o->num_prompts < 1)
        bad = "--num-prompts must be >= 1";
    else if (o->input_len < 1 || o->output_len < 1)
        bad = "--input-len and --output-len must be >= 1";
    else if (o->prefix_len < 0)
        bad = "--prefix-len must be >= 0";
    else if (o->num_groups < 1)
        bad = "--num-groups must be >= 1";
    else if (o->max_concurrency < 0)
        bad = "--max-concurrency must be >= 0 (0: no limit)";
    else if (!(o->burstiness > 0))
        bad = "--burstiness must be > 0";
    struct loadgen_mix_class mix[LOADGEN_MIX_MAX];
    struct weld_err e;
    int n_mix;
    if (!bad && o->mix && loadgen_mix_parse(o->mix, mix, &n_mix, &e))
        bad = e.msg;
    if (bad)
        fprintf(stderr, "weld bench serve: %s\n", bad);
    return bad ? 2 : 0;
}

/* Report: table (stdout, or stderr with --json), JSON, --save-result. */
static int report(const struct serve_opts *o, const struct loadgen_config *c,
                  const struct loadgen_slo *slo, const struct loadgen_result *r, int n,
                  double duration, const double *kv0, const double *kv1, struct weld_err *e)
{
    struct loadgen_summary s;
    int rc = loadgen_summarize(r, n, duration, slo, &s, e);
    if (rc)
        return rc;
    print_failures(r, n);
    loadgen_summary_print(o->json ? stderr : stdout, &s, slo, "Serving Benchmark Result");
    json_t *kv = kv0 ? kv_report(o->json ? stderr : stdout, kv0, kv1) : NULL;
    if (!o->json && !o->save_result) {
        json_decref(kv);
        return s.completed > 0 ? WELD_OK
                               : err_set(e, WELD_ERR_IO, "no request succeeded (see above)");
    }
    json_t *j = result_json(o, c, &s, slo, r, n);
    if (!j) {
        json_decref(kv);
        return err_set(e, WELD_ERR_NOMEM, "result JSON: out of memory");
    }
    if (kv)
        json_object_set_new(j, "kv_cache", kv);
    if (o->save_result && (rc = jsave_file(j, o->save_result, e)) == WELD_OK)
        fprintf(stderr, "weld bench serve: results saved to %s\n", o->save_result);
    if (rc == WELD_OK && o->json) {
        char *txt = json_dumps(j, JSON_COMPACT);
        if (!txt)
            rc = err_set(e, WELD_ERR_NOMEM, "result JSON: out of memory");
        else
            printf("%s\n", txt);
        free(txt);
    }
    json_decref(j);
    if (rc == WELD_OK && s.completed == 0)
        rc = err_set(e, WELD_ERR_IO, "no request succeeded (see above)");
    return rc;
}

static int bench_serve(const struct serve_opts *o, struct loadgen_config *c,
                       const struct loadgen_slo *slo, struct weld_err *e)
{
    struct loadgen_dataset_params dp = {.num_prompts = o->num_prompts,
                                        .input_len = o->input_len,
                                        .output_len = o->output_len,
                                        .prefix_len = o->prefix_len,
                                        .num_groups = o->num_groups,
                                        .seed = (uint64_t)o->seed};
    if (loadgen_dataset_kind_parse(o->dataset, &dp.kind))
        return err_set(e, WELD_ERR_INVALID_ARG,
                       "--dataset '%s': expected random, shared-prefix or chat", o->dataset);
    struct loadgen_mix_class mix[LOADGEN_MIX_MAX];
    if (o->mix && loadgen_mix_parse(o->mix, mix, &dp.n_mix, e))
        return WELD_ERR_INVALID_ARG;
    dp.mix = o->mix ? mix : NULL;
    struct tokenizer *tok = NULL;
    struct loadgen_dataset *d = NULL;
    struct loadgen_result *r = NULL;
    char *model = NULL;
    double duration = 0;
    int rc = WELD_OK;
    if (o->tokenizer && (rc = load_tokenizer(o->tokenizer, &tok, e)))
        goto done;
    dp.tok = tok;
    if ((rc = loadgen_dataset_build(&dp, &d, e)))
        goto done;
    if (!c->model) {
        if ((rc = loadgen_fetch_model(c->base_url, c->api_key, c->timeout_s, &model, e)))
            goto done;
        c->model = model;
    }
    char conc[32] = "no limit on requests";
    if (c->max_concurrency > 0)
        snprintf(conc, sizeof conc, "at most %d", c->max_concurrency);
    fprintf(stderr,
            "weld bench serve: %d %s requests%s%s to %s%s (model %s), rate %s, %s in "
            "flight\n",
            d->n, o->dataset, o->mix ? " of mix " : "", o->mix ? o->mix : "", c->base_url,
            c->endpoint, c->model, o->request_rate, conc);
    double kv0[KV_N], kv1[KV_N];
    bool kv_ok = kv_scrape(o, c->api_key, kv0);
    if ((rc = loadgen_run(c, d, &r, &duration, e)))
        goto done;
    kv_ok = kv_scrape(o, c->api_key, kv1) && kv_ok;
    rc = report(o, c, slo, r, d->n, duration, kv_ok ? kv0 : NULL, kv1, e);
done:
    loadgen_results_free(r, d ? d->n : 0);
    loadgen_dataset_free(d);
    tokenizer_free(tok);
    wfree(model);
    return rc;
}

static int parse_serve_opts(int argc, char **argv, struct serve_opts *o)
{
    const struct cli_opt opts[] = {
        {"base-url", 0, OPT_STR, &o->base_url, "URL",
         "server to load (default http://127.0.0.1:8000)"},
        {"endpoint", 0, OPT_STR, &o->endpoint, "PATH",
         "/v1/completions (default; chat dataset: /v1/chat/completions)"},
        {"dataset", 0, OPT_STR, &o->dataset, "D", "random (default), shared-prefix or chat"},
        {"num-prompts", 'n', OPT_INT, &o->num_prompts, "N", "requests (default 100)"},
        {"request-rate", 0, OPT_STR, &o->request_rate, "R",
         "requests/s, Poisson arrivals, or inf: all at once (default inf)"},
        {"burstiness", 0, OPT_FLOAT, &o->burstiness, "B",
         "gamma shape of the arrival gaps; 1 = Poisson (default 1)"},
        {"max-concurrency", 'c', OPT_INT, &o->max_concurrency, "C",
         "at most C requests in flight (default 0: no limit)"},
        {"model", 0, OPT_STR, &o->model, "NAME",
         "model name sent (default: the server's first in /v1/models)"},
        {"input-len", 0, OPT_INT, &o->input_len, "I",
         "prompt tokens (shared-prefix: after the prefix; chat: all turns) (default 512)"},
        {"output-len", 0, OPT_INT, &o->output_len, "O",
         "tokens generated per request (max_tokens, ignore_eos) (default 128)"},
        {"mix", 0, OPT_STR, &o->mix, "I:O[:W],...",
         "length classes in place of --input-len/--output-len, W their shares (default 1): "
         "e.g. 1536:16,64:512"},
        {"prefix-len", 0, OPT_INT, &o->prefix_len, "P",
         "shared-prefix: tokens shared per group; chat: system prompt (default 256)"},
        {"num-groups", 0, OPT_INT, &o->num_groups, "G", "shared-prefix / chat groups (default 8)"},
        {"tokenizer", 0, OPT_STR, &o->tokenizer, "PATH",
         "tokenizer.json or GGUF: prompts of exact token lengths (default: word text, ~lengths)"},
        {"seed", 's', OPT_I64, &o->seed, "S", "seed of prompts and arrivals (default 0)"},
        {"api-key", 0, OPT_STR, &o->api_key, "KEY", "sent as Authorization: Bearer KEY"},
        {"goodput", 0, OPT_STR, &o->goodput, "SLOs",
         "ttft:MS tpot:MS e2el:MS: report requests/s meeting all"},
        {"timeout", 0, OPT_FLOAT, &o->timeout, "S",
         "per-request timeout in seconds (default 3600)"},
        {"save-result", 0, OPT_STR, &o->save_result, "FILE",
         "write the result JSON (with per-request arrays)"},
        {"json", 0, OPT_FLAG, &o->json, NULL,
         "print the result JSON on stdout (the table goes to stderr)"},
        {"scrape-metrics", 0, OPT_STRS, &o->scrape, "URL",
         "servers whose /metrics give the KV cache section (repeat; default: --base-url; behind a router, give the workers)"},
    };
    const char *pos[1];
    int n_pos;
    int prc = cli_parse(argc, argv, "bench serve --base-url URL [options]",
                        "Load-test an OpenAI-compatible server (weld serve, llama-server, vLLM)\n"
                        "with streaming requests; report TTFT, TPOT, ITL, end-to-end latency,\n"
                        "throughput and goodput like vLLM's `vllm bench serve`.",
                        opts, (int)(sizeof opts / sizeof opts[0]), pos, 0, &n_pos);
    return prc == 1 ? 1 : prc ? 2 : 0;
}

int cmd_bench_serve(int argc, char **argv)
{
    struct serve_opts o = {.base_url = "http://127.0.0.1:8000", .dataset = "random",
                           .request_rate = "inf", .num_prompts = 100, .input_len = 512,
                           .output_len = 128, .prefix_len = 256, .num_groups = 8,
                           .burstiness = 1.0f, .timeout = 3600};
    char *joined = NULL;
    int nargc = 0;
    char **nargv = fold_goodput(argc - 1, argv + 1, &nargc, &joined);
    if (!nargv) {
        fprintf(stderr, "weld bench serve: out of memory\n");
        return 1;
    }
    nargv[0] = "bench serve"; /* errors read "weld bench serve: ..." */
    int prc = parse_serve_opts(nargc, nargv, &o);
    int status = prc == 1 ? 0 : prc ? 2 : check_opts(&o);
    struct loadgen_config c = {.base_url = o.base_url, .model = o.model, .api_key = o.api_key,
                               .burstiness = o.burstiness, .max_concurrency = o.max_concurrency,
                               .timeout_s = o.timeout, .seed = (uint64_t)o.seed,
                               .progress = !o.json};
    c.endpoint = o.endpoint ? o.endpoint
                 : !strcmp(o.dataset, "chat") ? "/v1/chat/completions" : "/v1/completions";
    struct loadgen_slo slo = {0};
    struct weld_err e;
    err_clear(&e);
    if (!prc && !status && parse_rate(o.request_rate, &c.request_rate)) {
        fprintf(stderr, "weld bench serve: --request-rate '%s': expected a rate > 0 or inf\n",
                o.request_rate);
        status = 2;
    }
    if (!prc && !status && o.goodput && loadgen_slo_parse(o.goodput, &slo, &e)) {
        fprintf(stderr, "weld bench serve: --goodput: %s\n", e.msg);
        status = 2;
    }
    if (!prc && !status && bench_serve(&o, &c, &slo, &e)) {
        fprintf(stderr, "weld bench serve: %s%s%s%s\n", e.msg,
                strstr(e.msg, "onnect") ? " (is a server running at --base-url " : "",
                strstr(e.msg, "onnect") ? c.base_url : "",
                strstr(e.msg, "onnect") ? "? start one with weld serve MODEL)" : "");
        status = 1;
    }
    wfree(joined);
    wfree(nargv);
    return status;
}

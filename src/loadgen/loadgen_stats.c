/*
 * loadgen_stats - when requests are sent, and what the answers add up to.
 *
 * Arrivals: the first request goes at t = 0 and each next one after a gap drawn from a
 * gamma distribution with shape `burstiness` and mean 1/rate (vLLM's model: burstiness 1
 * is a Poisson process, i.e. exponential gaps, drawn here directly as -ln(1-u)/rate;
 * other shapes use Marsaglia-Tsang). The generator is the project's seeded xoshiro, so a
 * seed fixes the schedule.
 *
 * Summary: the metrics of vLLM's benchmark_serving, over successful requests only:
 * request/output/total-token throughput over the whole duration; TTFT, TPOT (requests
 * with more than one output token), ITL (every gap of every request pooled) and E2EL as
 * mean, population std, median, p90, p99, min and max in milliseconds, percentiles by
 * numpy's default linear interpolation. Goodput counts successful requests that meet
 * every SLO given (a request with one output token has TPOT 0, as in vLLM).
 *
 * Deliberately not here: warm-up requests, per-second throughput curves.
 */
#include "loadgen/loadgen.h"

#include "core/alloc.h"
#include "core/rng.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static double gamma_draw(struct rng *g, double shape)
{
    if (shape < 1.0) { /* boost: Gamma(k) = Gamma(k + 1) * U^(1/k) */
        double u = rng_uniform(g);
        return gamma_draw(g, shape + 1.0) * pow(u > 0 ? u : 1e-300, 1.0 / shape);
    }
    double d = shape - 1.0 / 3.0, c = 1.0 / sqrt(9.0 * d);
    for (;;) {
        double x = rng_normal(g), v = 1.0 + c * x;
        if (v <= 0)
            continue;
        v = v * v * v;
        double u = rng_uniform(g);
        if (u < 1.0 - 0.0331 * x * x * x * x)
            return d * v;
        if (u > 0 && log(u) < 0.5 * x * x + d * (1.0 - v + log(v)))
            return d * v;
    }
}

int loadgen_arrivals(double rate, double burstiness, uint64_t seed, int n, double *out,
                     struct weld_err *e)
{
    if (n < 0)
        return err_set(e, WELD_ERR_INVALID_ARG, "arrivals: negative request count %d", n);
    if (!(burstiness > 0) || !isfinite(burstiness))
        return err_set(e, WELD_ERR_INVALID_ARG, "arrivals: burstiness %g must be > 0",
                       burstiness);
    if (isnan(rate))
        return err_set(e, WELD_ERR_INVALID_ARG, "arrivals: request rate is NaN");
    bool all_at_once = rate <= 0 || isinf(rate);
    struct rng g;
    rng_seed(&g, seed);
    double t = 0;
    for (int i = 0; i < n; i++) {
        out[i] = t;
        if (all_at_once)
            continue;
        double gap = burstiness == 1.0 ? -log1p(-rng_uniform(&g)) / rate
                                       : gamma_draw(&g, burstiness) / (rate * burstiness);
        t += gap;
    }
    return WELD_OK;
}

double loadgen_percentile_sorted(const double *x, size_t n, double p)
{
    if (n == 0)
        return 0;
    if (p <= 0)
        return x[0];
    if (p >= 100)
        return x[n - 1];
    double pos = p / 100.0 * (double)(n - 1);
    size_t lo = (size_t)floor(pos);
    size_t hi = lo + 1 < n ? lo + 1 : lo;
    double f = pos - (double)lo;
    return x[lo] + (x[hi] - x[lo]) * f;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Sorts x in place; values are seconds, the distribution is in milliseconds. */
static void dist_of(double *x, size_t n, struct loadgen_dist *d)
{
    memset(d, 0, sizeof *d);
    d->n = n;
    if (n == 0)
        return;
    qsort(x, n, sizeof *x, cmp_double);
    double sum = 0, sq = 0;
    for (size_t i = 0; i < n; i++)
        sum += x[i];
    double mean = sum / (double)n;
    for (size_t i = 0; i < n; i++)
        sq += (x[i] - mean) * (x[i] - mean);
    d->mean = mean * 1e3;
    d->std = sqrt(sq / (double)n) * 1e3;
    d->median = loadgen_percentile_sorted(x, n, 50) * 1e3;
    d->p90 = loadgen_percentile_sorted(x, n, 90) * 1e3;
    d->p99 = loadgen_percentile_sorted(x, n, 99) * 1e3;
    d->min = x[0] * 1e3;
    d->max = x[n - 1] * 1e3;
}

bool loadgen_slo_any(const struct loadgen_slo *s)
{
    return s && (s->ttft_ms > 0 || s->tpot_ms > 0 || s->e2el_ms > 0);
}

/* One "key:value" item of a goodput spec. */
static int slo_item(const char *it, size_t len, struct loadgen_slo *out, struct weld_err *e)
{
    char buf[64];
    if (len >= sizeof buf)
        return err_set(e, WELD_ERR_INVALID_ARG, "goodput: item '%.*s...' too long", 20, it);
    memcpy(buf, it, len);
    buf[len] = 0;
    char *colon = strchr(buf, ':');
    if (!colon)
        return err_set(e, WELD_ERR_INVALID_ARG,
                       "goodput: item '%s' is not KEY:MS (keys ttft, tpot, e2el)", buf);
    *colon = 0;
    char *end;
    double v = strtod(colon + 1, &end);
    if (end == colon + 1 || *end || !(v > 0) || !isfinite(v))
        return err_set(e, WELD_ERR_INVALID_ARG,
                       "goodput: '%s': value '%s' is not a positive number of ms", buf, colon + 1);
    double *dst = !strcmp(buf, "ttft") ? &out->ttft_ms
                  : !strcmp(buf, "tpot") ? &out->tpot_ms
                  : !strcmp(buf, "e2el") ? &out->e2el_ms : NULL;
    if (!dst)
        return err_set(e, WELD_ERR_INVALID_ARG,
                       "goodput: unknown key '%s' (known: ttft, tpot, e2el)", buf);
    if (*dst > 0)
        return err_set(e, WELD_ERR_INVALID_ARG, "goodput: key '%s' given twice", buf);
    *dst = v;
    return WELD_OK;
}

int loadgen_slo_parse(const char *spec, struct loadgen_slo *out, struct weld_err *e)
{
    memset(out, 0, sizeof *out);
    const char *p = spec;
    while (*p) {
        while (*p == ' ' || *p == ',')
            p++;
        if (!*p)
            break;
        size_t len = strcspn(p, " ,");
        int rc = slo_item(p, len, out, e);
        if (rc)
            return rc;
        p += len;
    }
    if (!loadgen_slo_any(out))
        return err_set(e, WELD_ERR_INVALID_ARG, "goodput: no SLO in '%s'", spec);
    return WELD_OK;
}

static double tpot_of(const struct loadgen_result *r)
{
    return r->output_tokens > 1 ? (r->e2el - r->ttft) / (double)(r->output_tokens - 1) : 0;
}

static bool meets_slo(const struct loadgen_result *r, const struct loadgen_slo *slo)
{
    if (slo->ttft_ms > 0 && r->ttft * 1e3 > slo->ttft_ms)
        return false;
    if (slo->tpot_ms > 0 && tpot_of(r) * 1e3 > slo->tpot_ms)
        return false;
    if (slo->e2el_ms > 0 && r->e2el * 1e3 > slo->e2el_ms)
        return false;
    return true;
}

int loadgen_summarize(const struct loadgen_result *r, int n, double duration,
                      const struct loadgen_slo *slo, struct loadgen_summary *s,
                      struct weld_err *e)
{
    memset(s, 0, sizeof *s);
    s->duration = duration;
    size_t n_itl = 0;
    for (int i = 0; i < n; i++)
        if (r[i].success)
            n_itl += (size_t)r[i].n_itl;
    size_t m = (size_t)(n > 0 ? n : 1);
    double *ttft = wmalloc(m * sizeof *ttft), *tpot = wmalloc(m * sizeof *tpot);
    double *e2el = wmalloc(m * sizeof *e2el), *itl = wmalloc((n_itl + 1) * sizeof *itl);
    int rc = WELD_OK;
    if (!ttft || !tpot || !e2el || !itl) {
        rc = err_set(e, WELD_ERR_NOMEM, "summary: out of memory");
        goto free_arrays;
    }
    size_t n_ok = 0, n_tpot = 0;
    n_itl = 0;
    for (int i = 0; i < n; i++) {
        if (!r[i].success) {
            s->failed++;
            continue;
        }
        s->total_input += r[i].prompt_tokens;
        s->total_output += r[i].output_tokens;
        ttft[n_ok] = r[i].ttft;
        e2el[n_ok++] = r[i].e2el;
        if (r[i].output_tokens > 1)
            tpot[n_tpot++] = tpot_of(&r[i]);
        for (int k = 0; k < r[i].n_itl; k++)
            itl[n_itl++] = r[i].itl[k];
        if (loadgen_slo_any(slo) && meets_slo(&r[i], slo))
            s->good++;
    }
    s->completed = (int)n_ok;
    if (duration > 0) {
        s->request_throughput = (double)n_ok / duration;
        s->output_throughput = (double)s->total_output / duration;
        s->total_token_throughput = (double)(s->total_input + s->total_output) / duration;
        s->request_goodput = (double)s->good / duration;
    }
    dist_of(ttft, n_ok, &s->ttft);
    dist_of(tpot, n_tpot, &s->tpot);
    dist_of(itl, n_itl, &s->itl);
    dist_of(e2el, n_ok, &s->e2el);
free_arrays:
    wfree(ttft);
    wfree(tpot);
    wfree(e2el);
    wfree(itl);
    return rc;
}

static int dist_json(json_t *o, const char *name, const struct loadgen_dist *d)
{
    static const char *const keys[] = {"mean", "std", "median", "p90", "p99", "min", "max"};
    const double v[] = {d->mean, d->std, d->median, d->p90, d->p99, d->min, d->max};
    char k[64];
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        snprintf(k, sizeof k, "%s_%s_ms", keys[i], name);
        if (json_object_set_new(o, k, json_real(v[i])))
            return -1;
    }
    return 0;
}

/* The per-request arrays. */
static int requests_json(json_t *o, const struct loadgen_result *r, int n)
{
    json_t *in = json_array(), *out = json_array(), *tt = json_array(), *tp = json_array();
    json_t *el = json_array(), *it = json_array(), *st = json_array(), *er = json_array();
    int bad = json_object_set_new(o, "input_lens", in) | json_object_set_new(o, "output_lens", out)
              | json_object_set_new(o, "ttfts", tt) | json_object_set_new(o, "tpots", tp)
              | json_object_set_new(o, "e2els", el) | json_object_set_new(o, "itls", it)
              | json_object_set_new(o, "send_times", st) | json_object_set_new(o, "errors", er);
    for (int i = 0; i < n && !bad; i++) {
        json_t *gaps = json_array();
        for (int k = 0; gaps && k < r[i].n_itl; k++)
            bad |= json_array_append_new(gaps, json_real(r[i].itl[k]));
        bad |= json_array_append_new(in, json_integer(r[i].prompt_tokens));
        bad |= json_array_append_new(out, json_integer(r[i].success ? r[i].output_tokens : 0));
        bad |= json_array_append_new(tt, json_real(r[i].ttft));
        bad |= json_array_append_new(tp, json_real(r[i].success ? tpot_of(&r[i]) : 0));
        bad |= json_array_append_new(el, json_real(r[i].e2el));
        bad |= json_array_append_new(it, gaps);
        bad |= json_array_append_new(st, json_real(r[i].t_send));
        bad |= json_array_append_new(er, json_string(r[i].success ? ""
                                                     : r[i].error ? r[i].error : "failed"));
    }
    return bad ? -1 : 0;
}

json_t *loadgen_summary_json(const struct loadgen_summary *s, const struct loadgen_slo *slo,
                             const struct loadgen_result *r, int n)
{
    json_t *o = json_pack("{s:f, s:i, s:i, s:I, s:I, s:f, s:f, s:f}", "duration", s->duration,
                          "completed", s->completed, "failed", s->failed, "total_input_tokens",
                          (json_int_t)s->total_input, "total_output_tokens",
                          (json_int_t)s->total_output, "request_throughput",
                          s->request_throughput, "output_throughput", s->output_throughput,
                          "total_token_throughput", s->total_token_throughput);
    if (!o)
        return NULL;
    int bad = 0;
    if (loadgen_slo_any(slo)) {
        bad |= json_object_set_new(o, "request_goodput", json_real(s->request_goodput));
        bad |= json_object_set_new(o, "good_requests", json_integer(s->good));
        json_t *g = json_object();
        bad |= json_object_set_new(o, "goodput_slo_ms", g);
        if (g && slo->ttft_ms > 0)
            bad |= json_object_set_new(g, "ttft", json_real(slo->ttft_ms));
        if (g && slo->tpot_ms > 0)
            bad |= json_object_set_new(g, "tpot", json_real(slo->tpot_ms));
        if (g && slo->e2el_ms > 0)
            bad |= json_object_set_new(g, "e2el", json_real(slo->e2el_ms));
    }
    bad |= dist_json(o, "ttft", &s->ttft) | dist_json(o, "tpot", &s->tpot)
           | dist_json(o, "itl", &s->itl) | dist_json(o, "e2el", &s->e2el);
    if (!bad && r)
        bad = requests_json(o, r, n);
    if (bad) {
        json_decref(o);
        return NULL;
    }
    return o;
}

static void print_dist(FILE *f, const char *title, const char *name,
                       const struct loadgen_dist *d)
{
    int pad = 50 - 2 - (int)strlen(title), l = pad > 0 ? pad / 2 : 0, rr = pad > 0 ? pad - l : 0;
    fprintf(f, "%.*s %s %.*s\n", l, "--------------------------------------------------", title,
            rr, "--------------------------------------------------");
    char k[64];
    snprintf(k, sizeof k, "Mean %s (ms):", name);
    fprintf(f, "%-40s %-10.2f\n", k, d->mean);
    snprintf(k, sizeof k, "Median %s (ms):", name);
    fprintf(f, "%-40s %-10.2f\n", k, d->median);
    snprintf(k, sizeof k, "P90 %s (ms):", name);
    fprintf(f, "%-40s %-10.2f\n", k, d->p90);
    snprintf(k, sizeof k, "P99 %s (ms):", name);
    fprintf(f, "%-40s %-10.2f\n", k, d->p99);
}

void loadgen_summary_print(FILE *f, const struct loadgen_summary *s,
                           const struct loadgen_slo *slo, const char *title)
{
    int pad = 50 - 2 - (int)strlen(title), l = pad > 0 ? pad / 2 : 0, rr = pad > 0 ? pad - l : 0;
    fprintf(f, "%.*s %s %.*s\n", l, "==================================================", title,
            rr, "==================================================");
    fprintf(f, "%-40s %-10d\n", "Successful requests:", s->completed);
    fprintf(f, "%-40s %-10d\n", "Failed requests:", s->failed);
    fprintf(f, "%-40s %-10.2f\n", "Benchmark duration (s):", s->duration);
    fprintf(f, "%-40s %-10lld\n", "Total input tokens:", (long long)s->total_input);
    fprintf(f, "%-40s %-10lld\n", "Total generated tokens:", (long long)s->total_output);
    fprintf(f, "%-40s %-10.2f\n", "Request throughput (req/s):", s->request_throughput);
    if (loadgen_slo_any(slo))
        fprintf(f, "%-40s %-10.2f\n", "Request goodput (req/s):", s->request_goodput);
    fprintf(f, "%-40s %-10.2f\n", "Output token throughput (tok/s):", s->output_throughput);
    fprintf(f, "%-40s %-10.2f\n", "Total Token throughput (tok/s):", s->total_token_throughput);
    print_dist(f, "Time to First Token", "TTFT", &s->ttft);
    print_dist(f, "Time per Output Token (excl. 1st token)", "TPOT", &s->tpot);
    print_dist(f, "Inter-token Latency", "ITL", &s->itl);
    print_dist(f, "End-to-end Latency", "E2EL", &s->e2el);
    fprintf(f, "==================================================\n");
}

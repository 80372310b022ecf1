/*
 * metrics - the router's GET /metrics: Prometheus text under "weld_router:" (the workers'
 * own metrics stay on the workers, under "weld:").
 *
 * Per worker (label worker="URL", every listed worker):
 *   requests_total               attempts sent to it (a retried request counts on each)
 *   request_failures_total       attempts that got no usable answer (no answer, cut, 503)
 *   worker_healthy               1 in rotation, 0 out
 *   worker_requests_in_flight    requests the router has on it now
 *   worker_load                  running + waiting at its last /metrics scrape (least_load
 *                                only; absent when not scraped)
 *   worker_tree_chars            bytes of request text the cache-aware tree holds for it
 * Router-wide:
 *   http_requests_total{status="2xx"...}, retries_total, client_disconnects_total,
 *   no_worker_total (requests refused for want of a healthy worker), stream_pauses_total
 *   (worker transfers paused because their client read slower than the worker wrote),
 *   cache_aware_decisions_total{reason="match|room|balance"}, cache_hit_estimate (bytes of
 *   routed text its worker's tree already held / bytes routed: the prefix hit rate the
 *   tree expects), prefix_match_chars (histogram, per routed request), tree_nodes,
 *   tree_bytes, request_latency_seconds (arrival to the answer's last byte),
 *   time_to_first_byte_seconds (arrival to the commit point: the first byte sent),
 *   pd_requests_total, pd_fallbacks_total, pd_prefill_latency_seconds.
 * The text is built under router.mu from one consistent view.
 */
#include "router/internal.h"

#include "core/alloc.h"

#include <string.h>

static const double lat_le[] = {0.005, 0.01, 0.025, 0.05, 0.1,  0.25,  0.5,   1.0,  2.5,
                                5.0,   10.0, 20.0,  40.0, 80.0, 160.0, 320.0, 640.0};
static const double chars_le[] = {0, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576};

#define N_OF(a) ((int)(sizeof a / sizeof a[0]))
#define NS "weld_router"

void rmetrics_init(struct rmetrics *m)
{
    memset(m, 0, sizeof *m);
    prom_hist_init(&m->latency, lat_le, N_OF(lat_le));
    prom_hist_init(&m->ttfb, lat_le, N_OF(lat_le));
    prom_hist_init(&m->pd_prefill, lat_le, N_OF(lat_le));
    prom_hist_init(&m->match, chars_le, N_OF(chars_le));
}

enum wval { V_REQUESTS, V_FAILURES, V_HEALTHY, V_IN_FLIGHT, V_LOAD, V_TREE };

static double wvalue(const struct router *r, const struct worker *w, enum wval k)
{
    switch (k) {
    case V_REQUESTS: return (double)w->n_requests;
    case V_FAILURES: return (double)w->n_failures;
    case V_HEALTHY: return w->healthy;
    case V_IN_FLIGHT: return w->in_flight;
    case V_LOAD: return w->scraped;
    case V_TREE: return (double)rtree_chars(r->tree, w->slot);
    }
    return -1;
}

/* One family with a sample per worker; a value < 0 leaves that worker out. */
static void per_worker(struct strbuf *b, const struct router *r, const char *name, const char *type,
                       const char *help, enum wval k)
{
    prom_head(b, NS, name, type, help);
    for (int i = 0; i < r->n_w; i++) {
        double v = wvalue(r, r->w[i], k);
        if (v < 0)
            continue;
        char lbl[1100];
        prom_label(lbl, sizeof lbl, "worker", r->w[i]->url);
        prom_sample(b, NS, name, lbl, v);
    }
}

char *rmetrics_text(struct router *r)
{
    struct strbuf b = {0};
    pthread_mutex_lock(&r->mu);
    const struct rmetrics *m = &r->m;
    per_worker(&b, r, "requests_total", "counter",
               "Attempts sent to the worker (a retried request counts on each).", V_REQUESTS);
    per_worker(&b, r, "request_failures_total", "counter",
               "Attempts that got no usable answer (none, cut, or 503).", V_FAILURES);
    per_worker(&b, r, "worker_healthy", "gauge", "1 while the worker is in rotation.", V_HEALTHY);
    per_worker(&b, r, "worker_requests_in_flight", "gauge",
               "Requests the router has on the worker now.", V_IN_FLIGHT);
    per_worker(&b, r, "worker_load", "gauge",
               "Running + waiting requests at the worker's last /metrics scrape.", V_LOAD);
    per_worker(&b, r, "worker_tree_chars", "gauge",
               "Bytes of request text the cache-aware tree holds for the worker.", V_TREE);
    prom_gauge(&b, NS, "workers", "Workers listed (healthy or not).", r->n_w, "");
    prom_head(&b, NS, "http_requests_total", "counter", "Answers by status class.");
    for (int k = 1; k <= 5; k++) {
        char lbl[32];
        snprintf(lbl, sizeof lbl, "status=\"%dxx\"", k);
        prom_sample(&b, NS, "http_requests_total", lbl, (double)m->http[k]);
    }
    prom_counter(&b, NS, "retries_total", "Attempts beyond the first (another worker tried).",
                 m->retries, "");
    prom_counter(&b, NS, "client_disconnects_total",
                 "Requests whose client left before the answer ended.", m->client_gone, "");
    prom_counter(&b, NS, "no_worker_total", "Requests refused: no healthy worker.", m->no_worker,
                 "");
    prom_counter(&b, NS, "stream_pauses_total",
                 "Worker transfers paused because their client read slower than the worker "
                 "wrote (--stream-buffer-size).",
                 m->stream_pauses, "");
    prom_head(&b, NS, "cache_aware_decisions_total", "counter",
              "cache_aware picks by reason: match (longest prefix), room (smallest tree), "
              "balance (least load).");
    for (int k = 0; k < POLICY_REASON_COUNT; k++) {
        char lbl[32];
        snprintf(lbl, sizeof lbl, "reason=\"%s\"", policy_reason_name((enum policy_reason)k));
        prom_sample(&b, NS, "cache_aware_decisions_total", lbl, (double)m->decisions[k]);
    }
    prom_gauge(&b, NS, "cache_hit_estimate",
               "Bytes of routed text the chosen worker's tree held / bytes routed.",
               m->text_chars ? (double)m->match_chars / (double)m->text_chars : 0, "");
    prom_hist(&b, NS, "prefix_match_chars",
              "Bytes of each routed text found in the chosen "
              "worker's tree.",
              &m->match, "");
    prom_gauge(&b, NS, "tree_nodes", "Nodes of the cache-aware tree.", (double)rtree_nodes(r->tree),
               "");
    prom_gauge(&b, NS, "tree_bytes", "Memory of the cache-aware tree.",
               (double)rtree_bytes(r->tree), "");
    prom_hist(&b, NS, "request_latency_seconds", "Arrival to the answer's last byte.", &m->latency,
              "");
    prom_hist(&b, NS, "time_to_first_byte_seconds", "Arrival to the first byte sent.", &m->ttfb,
              "");
    prom_counter(&b, NS, "pd_requests_total", "P/D: requests sent to a prefill worker first.",
                 m->pd_requests, "");
    prom_counter(&b, NS, "pd_fallbacks_total",
                 "P/D: prefills that failed or returned no kv_transfer_params.", m->pd_fallbacks,
                 "");
    prom_hist(&b, NS, "pd_prefill_latency_seconds", "P/D: the prefill step's time.", &m->pd_prefill,
              "");
    pthread_mutex_unlock(&r->mu);
    if (b.oom) {
        wfree(b.p);
        return NULL;
    }
    return b.p;
}

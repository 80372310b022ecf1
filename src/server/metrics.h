/*
 * metrics - what GET /metrics reports, in the Prometheus text format with vLLM's metric
 * names under the "weld:" prefix.
 *
 * struct server_metrics is plain data: the engine thread updates it (under the server's
 * mutex) as requests finish and tokens arrive, and /metrics renders a copy. Counters are
 * monotonic and carry the _total suffix as vLLM's do; gauges come from the engine's own
 * stats (engine_stats_get) taken after every step. kv_cache_usage_perc counts blocks in
 * use by running sequences only: blocks kept in the prefix cache with no user are free.
 * Histograms use vLLM's bucket bounds (cumulative _bucket{le}, _sum, _count); the text
 * itself is written by httpd/prom.h, which the router shares.
 *
 * weld's own: num_requests_paused (engine requests paused because their stream's client is
 * not reading) and stream_stall_aborts_total (streams aborted after the stall timeout).
 *
 * request_success_total counts finished choices (one per sequence: n > 1 counts n) by
 * finished_reason: stop, length, abort, error. It moves with the gauges: a finish is
 * counted in the snapshot taken after its request left the engine, so a scrape that sees
 * it also sees that request's blocks returned.
 */
#ifndef WELD_SERVER_METRICS_H
#define WELD_SERVER_METRICS_H

#include "engine/engine.h"
#include "httpd/prom.h"

#include <stdint.h>

struct server_metrics {
    struct prom_hist ttft, itl, e2e, queue;
    uint64_t success[5];           /* by enum request_finish (index 0 unused) */
    struct engine_stats st;        /* the engine's last snapshot */
    uint64_t http_requests, http_errors; /* every HTTP request / those answered >= 400 */
    uint64_t stream_stalls;        /* streams aborted after --stream-stall-timeout */
    double kv_save_wait_seconds;   /* answers held until their blocks were written (P/D) */
};

void server_metrics_init(struct server_metrics *m);
/* The whole exposition text (wmalloc'd), or NULL on out of memory. */
char *server_metrics_text(const struct server_metrics *m, const char *model_name);

#endif

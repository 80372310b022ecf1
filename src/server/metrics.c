/*
 * metrics - histogram bookkeeping and the Prometheus text of GET /metrics (names and
 * semantics in metrics.h). The text is built in a strbuf by httpd/prom.h, which escapes the
 * label value (the model name) as the exposition format asks.
 */
#include "server/metrics.h"

#include "core/alloc.h"

#include <stddef.h>
#include <string.h>

static const double ttft_le[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,
                                 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0,
                                 640.0, 2560.0};
static const double itl_le[] = {0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3,
                                0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0};
static const double e2e_le[] = {0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0,
                                15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
                                960.0, 1920.0};

#define N_OF(a) ((int)(sizeof a / sizeof a[0]))

void server_metrics_init(struct server_metrics *m)
{
    memset(m, 0, sizeof *m);
    prom_hist_init(&m->ttft, ttft_le, N_OF(ttft_le));
    prom_hist_init(&m->itl, itl_le, N_OF(itl_le));
    prom_hist_init(&m->e2e, e2e_le, N_OF(e2e_le));
    prom_hist_init(&m->queue, e2e_le, N_OF(e2e_le));
}

static void head(struct strbuf *b, const char *name, const char *type, const char *help)
{
    prom_head(b, "weld", name, type, help);
}

static void hist(struct strbuf *b, const char *name, const char *help, const struct prom_hist *h,
                 const char *lbl)
{
    prom_hist(b, "weld", name, help, h, lbl);
}

static void counter(struct strbuf *b, const char *name, const char *help, uint64_t v,
                    const char *lbl)
{
    prom_counter(b, "weld", name, help, v, lbl);
}

static void gauge(struct strbuf *b, const char *name, const char *help, double v, const char *lbl)
{
    prom_gauge(b, "weld", name, help, v, lbl);
}

/* One metric per tier that is on, labelled tier="file" / "store". */
static void tier_metric(struct strbuf *b, const char *name, const char *type, const char *help,
                        const struct kvtier_stats *t, size_t off, bool is_double, const char *lbl)
{
    head(b, name, type, help);
    for (int w = 0; w < KVTIER_N; w++) {
        if (!t->t[w].on)
            continue;
        const char *p = (const char *)&t->t[w] + off;
        double v;
        if (is_double) {
            memcpy(&v, p, sizeof v);
        } else {
            uint64_t u;
            memcpy(&u, p, sizeof u);
            v = (double)u;
        }
        strbuf_printf(b, "weld:%s{%s,tier=\"%s\"} %.9g\n", name, lbl, kvtier_name(w), v);
    }
}

static void tier_metrics(struct strbuf *b, const struct engine_stats *st, const char *lbl)
{
    const struct kvtier_stats *t = &st->tier;
    counter(b, "kv_tier_query_tokens_total",
            "Prompt tokens past the pool's prefix hit looked up in the KV tier.",
            st->tier_query_tokens, lbl);
    counter(b, "kv_tier_hit_tokens_total", "Of them, loaded from the tier instead of computed.",
            st->tier_hit_tokens, lbl);
    counter(b, "kv_tier_blocks_loaded_total", "KV blocks loaded into the pool from the tier.",
            st->tier_blocks_loaded, lbl);
    counter(b, "kv_tier_blocks_saved_total", "KV blocks queued to be saved to the tier.",
            st->tier_blocks_saved, lbl);
    counter(b, "kv_tier_dropped_total", "Saves dropped because the write queue was full.",
            t->dropped, lbl);
    gauge(b, "kv_tier_queue_bytes", "Bytes waiting to be written to the tier.",
          (double)t->queued_bytes, lbl);
    counter(b, "kv_tier_queue_hits_total",
            "Blocks loaded from the write queue before they reached a tier.", t->queue_hits, lbl);
    struct {
        const char *name, *type, *help;
        size_t off;
        bool dbl;
    } const rows[] = {
        {"kv_tier_block_hits_total", "counter", "Blocks found valid at this tier.",
         offsetof(struct kvtier_tier_stats, hits), false},
        {"kv_tier_block_misses_total", "counter", "Runs that ended at this tier.",
         offsetof(struct kvtier_tier_stats, misses), false},
        {"kv_tier_rejects_total", "counter",
         "Entries refused (another model or dtype, a failed checksum) and deleted.",
         offsetof(struct kvtier_tier_stats, rejects), false},
        {"kv_tier_errors_total", "counter", "I/O or connection errors.",
         offsetof(struct kvtier_tier_stats, errors), false},
        {"kv_tier_writes_total", "counter", "Entries written.",
         offsetof(struct kvtier_tier_stats, puts), false},
        {"kv_tier_read_bytes_total", "counter", "Bytes read from this tier.",
         offsetof(struct kvtier_tier_stats, bytes_read), false},
        {"kv_tier_written_bytes_total", "counter", "Bytes written to this tier.",
         offsetof(struct kvtier_tier_stats, bytes_written), false},
        {"kv_tier_read_seconds_total", "counter",
         "Seconds in reads that hit (transfer latency: divide by block hits).",
         offsetof(struct kvtier_tier_stats, read_seconds), true},
        {"kv_tier_evictions_total", "counter", "Entries deleted to stay under the budget.",
         offsetof(struct kvtier_tier_stats, evictions), false},
        {"kv_tier_entries", "gauge", "Entries the tier holds (file tier).",
         offsetof(struct kvtier_tier_stats, entries), false},
        {"kv_tier_bytes", "gauge", "Bytes the tier holds (file tier).",
         offsetof(struct kvtier_tier_stats, bytes), false},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
        tier_metric(b, rows[i].name, rows[i].type, rows[i].help, t, rows[i].off, rows[i].dbl, lbl);
}

char *server_metrics_text(const struct server_metrics *m, const char *model_name)
{
    struct strbuf b = {0};
    char lbl[600];
    prom_label(lbl, sizeof lbl, "model_name", model_name);
    const struct engine_stats *st = &m->st;
    gauge(&b, "num_requests_running", "Sequences running (scheduled for steps).", st->running, lbl);
    gauge(&b, "num_requests_waiting", "Sequences waiting to be scheduled.", st->waiting, lbl);
    gauge(&b, "num_requests_paused", "Requests paused because their stream's client is not "
          "reading (--stream-buffer-size).", st->paused, lbl);
    counter(&b, "stream_stall_aborts_total", "Streams aborted after their client read nothing "
            "for --stream-stall-timeout.", m->stream_stalls, lbl);
    gauge(&b, "kv_cache_usage_perc", "Fraction of KV blocks in use by sequences (1 = 100%).",
          st->kv_usage, lbl);
    gauge(&b, "kv_cache_blocks_used", "KV blocks referenced by sequences.", st->kv_blocks_used, lbl);
    gauge(&b, "kv_cache_blocks_cached", "KV blocks kept only by the prefix cache (free).",
          st->kv_blocks_cached, lbl);
    gauge(&b, "kv_cache_blocks_total", "KV blocks in the pool.", st->kv_blocks, lbl);
    counter(&b, "prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache.",
            st->cache_query_tokens, lbl);
    counter(&b, "prefix_cache_hits_total", "Prompt tokens found in the prefix cache.",
            st->cache_hit_tokens, lbl);
    counter(&b, "num_preemptions_total", "Sequences preempted for lack of KV blocks.",
            st->preemptions, lbl);
    if (st->tier_on) {
        tier_metrics(&b, st, lbl);
        counter(&b, "kv_transfer_saved_requests_total",
                "Requests whose prompt blocks were saved for a decode server "
                "(kv_transfer_params.do_remote_decode).",
                st->kv_handoffs, lbl);
        counter(&b, "kv_transfer_saved_tokens_total", "Prompt tokens of those blocks.",
                st->kv_handoff_tokens, lbl);
        head(&b, "kv_transfer_save_seconds_total", "counter",
             "Seconds from the end of their prompts until their blocks were written: the "
             "engine's copy into the write queue plus the answers' wait for the writer (the "
             "prefill side's transfer latency).");
        strbuf_printf(&b, "weld:kv_transfer_save_seconds_total{%s} %.6f\n", lbl,
                      st->kv_handoff_seconds + m->kv_save_wait_seconds);
        counter(&b, "kv_transfer_remote_prefills_total",
                "Requests that came with a prefill server's handle "
                "(kv_transfer_params.do_remote_prefill).",
                st->kv_remote_prefills, lbl);
        counter(&b, "kv_transfer_remote_tokens_total",
                "Prompt tokens those handles said were saved.", st->kv_remote_tokens, lbl);
        counter(&b, "kv_transfer_loaded_tokens_total",
                "Of their prompts, tokens loaded from the tier (the rest was computed).",
                st->kv_remote_loaded_tokens, lbl);
    }
    counter(&b, "prompt_tokens_total", "Prompt tokens of accepted requests.", st->prompt_tokens, lbl);
    counter(&b, "generation_tokens_total", "Generated tokens.", st->generated_tokens, lbl);
    counter(&b, "spec_decode_num_drafts_total", "Speculative verify steps of a sequence.",
            st->spec_drafts, lbl);
    counter(&b, "spec_decode_num_draft_tokens_total", "Drafted tokens verified.",
            st->spec_draft_tokens, lbl);
    counter(&b, "spec_decode_num_accepted_tokens_total", "Drafted tokens accepted.",
            st->spec_accepted_tokens, lbl);
    head(&b, "spec_decode_num_accepted_tokens_per_pos_total", "counter",
         "Drafted tokens accepted, by position in the draft.");
    for (int i = 0; i < SPEC_MAX_TOKENS; i++)
        strbuf_printf(
            &b, "weld:spec_decode_num_accepted_tokens_per_pos_total{%s,position=\"%d\"} %llu\n",
            lbl, i, (unsigned long long)st->spec_accepted_at[i]);
    counter(&b, "structured_output_masks_total",
            "Token masks of constrained requests (finished ones).", st->mask_count, lbl);
    head(&b, "structured_output_mask_seconds_total", "counter",
         "Seconds spent computing those masks.");
    strbuf_printf(&b, "weld:structured_output_mask_seconds_total{%s} %.6f\n", lbl, st->t_mask);
    counter(&b, "jump_forward_draft_tokens_total",
            "Tokens drafted from text a grammar forces (jump-forward).", st->forced_draft_tokens,
            lbl);
    counter(&b, "jump_forward_accepted_tokens_total", "Of them, taken by the verifying step.",
            st->forced_accepted_tokens, lbl);
    counter(&b, "http_requests_total", "HTTP requests answered.", m->http_requests, lbl);
    counter(&b, "http_errors_total", "HTTP requests answered with status >= 400.",
            m->http_errors, lbl);
    head(&b, "request_success_total", "counter", "Finished choices by finished_reason.");
    static const char *const reasons[] = {NULL, "stop", "length", "abort", "error"};
    for (int i = 1; i < 5; i++)
        strbuf_printf(&b, "weld:request_success_total{%s,finished_reason=\"%s\"} %llu\n", lbl,
                      reasons[i], (unsigned long long)m->success[i]);
    hist(&b, "time_to_first_token_seconds", "Time to first token.", &m->ttft, lbl);
    hist(&b, "inter_token_latency_seconds", "Time between tokens of a sequence.", &m->itl, lbl);
    hist(&b, "e2e_request_latency_seconds", "Arrival to finish.", &m->e2e, lbl);
    hist(&b, "request_queue_time_seconds", "Arrival to first scheduled.", &m->queue, lbl);
    if (b.oom) {
        wfree(b.p);
        return NULL;
    }
    return b.p;
}

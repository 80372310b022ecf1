/*
 * prom - Prometheus text exposition (format 0.0.4) for GET /metrics: histograms with fixed
 * bucket bounds and the lines of counters, gauges and histograms, written into a strbuf.
 *
 * Names are "NS:name" (NS "weld" for the server, "weld_router" for the router), as vLLM
 * writes "vllm:...". lbl is the text between the braces of every sample of a family
 * ("model_name=\"x\"", or "" for none); prom_label builds one pair with the value escaped
 * as the format asks (backslash, quote, newline). A histogram keeps per-bucket counts (not
 * cumulative) and renders them cumulative with _sum and _count. Not thread-safe: the
 * caller snapshots under its own lock.
 */
#ifndef WELD_HTTPD_PROM_H
#define WELD_HTTPD_PROM_H

#include "core/strbuf.h"

#include <stddef.h>
#include <stdint.h>

#define PROM_HIST_MAX 24

struct prom_hist {
    const double *le;               /* (n_le) upper bounds, ascending; +Inf is implicit */
    int n_le;                       /* < PROM_HIST_MAX */
    uint64_t counts[PROM_HIST_MAX]; /* (n_le + 1) per bucket, not cumulative */
    double sum;
    uint64_t n;
};

void prom_hist_init(struct prom_hist *h, const double *le, int n_le);
void prom_hist_observe(struct prom_hist *h, double v);

/* key="value" with value escaped, into out (cut to cap, always terminated). */
void prom_label(char *out, size_t cap, const char *key, const char *value);
/* # HELP and # TYPE lines of a family. */
void prom_head(struct strbuf *b, const char *ns, const char *name, const char *type,
               const char *help);
/* One sample line: NS:name{lbl} v (no braces when lbl is ""). */
void prom_sample(struct strbuf *b, const char *ns, const char *name, const char *lbl, double v);
/* A family of one sample: head plus the line. */
void prom_counter(struct strbuf *b, const char *ns, const char *name, const char *help, uint64_t v,
                  const char *lbl);
void prom_gauge(struct strbuf *b, const char *ns, const char *name, const char *help, double v,
                const char *lbl);
/* The _bucket, _sum and _count lines of one labelled histogram (no head). */
void prom_hist_lines(struct strbuf *b, const char *ns, const char *name, const struct prom_hist *h,
                     const char *lbl);
/* Head plus prom_hist_lines. */
void prom_hist(struct strbuf *b, const char *ns, const char *name, const char *help,
               const struct prom_hist *h, const char *lbl);

#endif

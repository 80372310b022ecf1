/*
 * prom - the Prometheus text (prom.h). Integers print exactly (%llu); gauges and sums with
 * 9 significant digits, as before the split from server/metrics.c, so scrapers see the same
 * text.
 */
#include "httpd/prom.h"

#include "core/err.h"

#include <stdio.h>
#include <string.h>

void prom_hist_init(struct prom_hist *h, const double *le, int n_le)
{
    WELD_ASSERT(n_le < PROM_HIST_MAX);
    memset(h, 0, sizeof *h);
    h->le = le;
    h->n_le = n_le;
}

void prom_hist_observe(struct prom_hist *h, double v)
{
    int b = 0;
    while (b < h->n_le && v > h->le[b])
        b++;
    h->counts[b]++;
    h->sum += v;
    h->n++;
}

void prom_label(char *out, size_t cap, const char *key, const char *value)
{
    size_t w = (size_t)snprintf(out, cap, "%s=\"", key);
    for (const char *s = value; *s && w + 4 < cap; s++) {
        if (*s == '\\' || *s == '"') {
            out[w++] = '\\';
            out[w++] = *s;
        } else if (*s == '\n') {
            out[w++] = '\\';
            out[w++] = 'n';
        } else {
            out[w++] = *s;
        }
    }
    if (w < cap)
        snprintf(out + w, cap - w, "\"");
}

void prom_head(struct strbuf *b, const char *ns, const char *name, const char *type,
               const char *help)
{
    strbuf_printf(b, "# HELP %s:%s %s\n# TYPE %s:%s %s\n", ns, name, help, ns, name, type);
}

void prom_sample(struct strbuf *b, const char *ns, const char *name, const char *lbl, double v)
{
    const char *l = lbl[0] ? "{" : "", *r = lbl[0] ? "}" : "";
    strbuf_printf(b, "%s:%s%s%s%s %.9g\n", ns, name, l, lbl, r, v);
}

void prom_counter(struct strbuf *b, const char *ns, const char *name, const char *help, uint64_t v,
                  const char *lbl)
{
    prom_head(b, ns, name, "counter", help);
    const char *l = lbl[0] ? "{" : "", *r = lbl[0] ? "}" : "";
    strbuf_printf(b, "%s:%s%s%s%s %llu\n", ns, name, l, lbl, r, (unsigned long long)v);
}

void prom_gauge(struct strbuf *b, const char *ns, const char *name, const char *help, double v,
                const char *lbl)
{
    prom_head(b, ns, name, "gauge", help);
    prom_sample(b, ns, name, lbl, v);
}

void prom_hist_lines(struct strbuf *b, const char *ns, const char *name, const struct prom_hist *h,
                     const char *lbl)
{
    const char *sep = lbl[0] ? "," : "";
    uint64_t cum = 0;
    for (int i = 0; i <= h->n_le; i++) {
        cum += h->counts[i];
        if (i < h->n_le)
            strbuf_printf(b, "%s:%s_bucket{%s%sle=\"%g\"} %llu\n", ns, name, lbl, sep, h->le[i],
                          (unsigned long long)cum);
        else
            strbuf_printf(b, "%s:%s_bucket{%s%sle=\"+Inf\"} %llu\n", ns, name, lbl, sep,
                          (unsigned long long)cum);
    }
    const char *l = lbl[0] ? "{" : "", *r = lbl[0] ? "}" : "";
    strbuf_printf(b, "%s:%s_sum%s%s%s %.9g\n%s:%s_count%s%s%s %llu\n", ns, name, l, lbl, r, h->sum,
                  ns, name, l, lbl, r, (unsigned long long)h->n);
}

void prom_hist(struct strbuf *b, const char *ns, const char *name, const char *help,
               const struct prom_hist *h, const char *lbl)
{
    prom_head(b, ns, name, "histogram", help);
    prom_hist_lines(b, ns, name, h, lbl);
}

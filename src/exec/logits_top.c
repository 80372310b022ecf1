/*
 * logits_top - a slice's largest logits kept while the LM head writes them (design in
 * logits_top.h).
 *
 * Scan: the first LOGITS_TOP_K non-NaN values fill a list kept sorted best first; after
 * that a value enters only if it beats the list's last (the threshold), and since ids grow
 * along the scan an equal value never does, so the test is one float compare per logit
 * and !(v <= threshold) also catches NaN. On random logits about K (1 + ln(n / K)) values
 * enter (some 400 of 16,000), each an insertion into 64 sorted slots.
 *
 * Merge: a k-way merge of the parts' sorted lists, K steps of n_parts compares.
 */
#include "exec/logits_top.h"

#include "core/err.h"
#include "kernels/cpu/gemm.h"

#include <math.h>
#include <string.h>

/* Insert (v, id) into t's sorted list (not full, or v beats the last). */
static void top_insert(struct logits_top *t, float v, int32_t id)
{
    int i = t->n < LOGITS_TOP_K ? t->n++ : LOGITS_TOP_K - 1;
    while (i > 0 && logits_top_better(v, id, t->vals[i - 1], t->ids[i - 1])) {
        t->vals[i] = t->vals[i - 1];
        t->ids[i] = t->ids[i - 1];
        i--;
    }
    t->vals[i] = v;
    t->ids[i] = id;
}

void logits_top_scan(struct logits_top *t, const float *l, int n, int32_t id0)
{
    t->n = 0;
    t->n_nan = 0;
    int j = 0;
    for (; j < n && t->n < LOGITS_TOP_K; j++) {
        if (isnan(l[j]))
            t->n_nan++;
        else
            top_insert(t, l[j], id0 + j);
    }
    if (t->n < LOGITS_TOP_K)
        return;
    float thr = t->vals[LOGITS_TOP_K - 1];
    for (; j < n; j++) {
        const float v = l[j];
        if (v <= thr)
            continue;
        if (isnan(v)) {
            t->n_nan++;
            continue;
        }
        top_insert(t, v, id0 + j);
        thr = t->vals[LOGITS_TOP_K - 1];
    }
}

void logits_stats_chunks(struct logits_top *t, const float *row, int n_vocab, int c0, int c1,
                         const struct gemm_ops *so)
{
    if (!so)
        so = gemm_ops_get();
    for (int c = c0; c < c1; c++) {
        const int a = c * LOGITS_CHUNK;
        const int n = logits_chunk_len(n_vocab, c);
        so->softmax_stats(row + a, n, t->inv_t, &t->chunk_max[c], &t->chunk_sum[c]);
    }
}

static void top_copy(struct logits_top *out, const struct logits_top *in)
{
    out->n = in->n;
    out->n_nan = in->n_nan;
    memcpy(out->ids, in->ids, (size_t)in->n * sizeof *in->ids);
    memcpy(out->vals, in->vals, (size_t)in->n * sizeof *in->vals);
}

void logits_top_merge(struct logits_top *out, const struct logits_top *parts, int n_parts)
{
    int cur[64];
    WELD_ASSERT(n_parts >= 0);
    out->n = 0;
    out->n_nan = 0;
    /* more parts than cursors: merge in groups, then merge the groups */
    if (n_parts > 64) {
        struct logits_top acc, tmp[2];
        logits_top_merge(&acc, parts, 64);
        for (int p = 64; p < n_parts; p += 63) {
            int m = n_parts - p < 63 ? n_parts - p : 63;
            logits_top_merge(&tmp[0], parts + p, m);
            top_copy(&tmp[1], &acc);
            logits_top_merge(&acc, tmp, 2);
        }
        top_copy(out, &acc);
        return;
    }
    for (int p = 0; p < n_parts; p++) {
        cur[p] = 0;
        out->n_nan += parts[p].n_nan;
    }
    while (out->n < LOGITS_TOP_K) {
        int best = -1;
        for (int p = 0; p < n_parts; p++) {
            if (cur[p] >= parts[p].n)
                continue;
            if (best < 0 || logits_top_better(parts[p].vals[cur[p]], parts[p].ids[cur[p]],
                                              parts[best].vals[cur[best]],
                                              parts[best].ids[cur[best]]))
                best = p;
        }
        if (best < 0)
            break;
        out->vals[out->n] = parts[best].vals[cur[best]];
        out->ids[out->n] = parts[best].ids[cur[best]];
        out->n++;
        cur[best]++;
    }
}

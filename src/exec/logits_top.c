/*
 * logits_top - a slice's largest logits kept while the LM head writes them (design in
 * logits_top.h).
 *
 * Scan: the first LOGITS_TOP_K non-NaN values fill a binary heap whose root is the worst
 * kept; after that a value enters only if it beats the root (the threshold), replacing
 * it, and since ids grow along the scan an equal value never does, so the test is one
 * float compare per logit and !(v <= threshold) also catches NaN. On random logits about
 * K (1 + ln(n / K)) values enter (some 400 of 16,000), each ~log2 K steps down the heap;
 * a heap sort then puts the K best first. (A list kept sorted by insertion, before, cost
 * ~K^2 / 4 moves to fill and K / 2 per entry: 2.53 us for a slice of 256 random logits,
 * 6.14 us for 2,048, against 1.14 and 2.68 us now, one core of the Zen 5 host.)
 *
 * That heap is the reference; where the instruction set has a gemm_ops.top_k (AVX-512:
 * a sorted list in registers, kernels/cpu/topk_avx512.c) the scan runs that instead, with
 * the same result. The timings above, from a harness scanning one row over and over, let
 * the branch predictor learn the row: in the engine (`weld generate`, 2 threads, Zen 5) the
 * heap took 15,000-24,000 TSC cycles (2.1 GHz) per 256-logit slice (stories260K) and
 * 32,000-43,000 per 2,000 (llama-110m), the kernel 12,700 and 19,900.
 *
 * Merge: a k-way merge of the parts' sorted lists, K steps of n_parts compares.
 */
#include "exec/logits_top.h"

#include "core/err.h"
#include "kernels/cpu/gemm.h"

#include <math.h>
#include <string.h>

/* The kept candidates as a binary heap whose root is the worst (the one a better value
   replaces), ordered by logits_top_better; sorted best first at the end of a scan. */
static bool heap_worse(const struct logits_top *t, int a, int b)
{
    return logits_top_better(t->vals[b], t->ids[b], t->vals[a], t->ids[a]);
}

static void heap_swap(struct logits_top *t, int a, int b)
{
    float v = t->vals[a];
    int32_t id = t->ids[a];
    t->vals[a] = t->vals[b], t->ids[a] = t->ids[b];
    t->vals[b] = v, t->ids[b] = id;
}

static void heap_down(struct logits_top *t, int i, int n)
{
    for (;;) {
        int c = 2 * i + 1;
        if (c >= n)
            return;
        if (c + 1 < n && heap_worse(t, c + 1, c))
            c++;
        if (!heap_worse(t, c, i))
            return;
        heap_swap(t, c, i);
        i = c;
    }
}

static void heap_push(struct logits_top *t, float v, int32_t id)
{
    int i = t->n++;
    t->vals[i] = v, t->ids[i] = id;
    while (i > 0 && heap_worse(t, i, (i - 1) / 2)) {
        heap_swap(t, i, (i - 1) / 2);
        i = (i - 1) / 2;
    }
}

static void heap_scan(struct logits_top *t, const float *l, int n, int32_t id0)
{
    t->n = 0;
    t->n_nan = 0;
    int j = 0;
    for (; j < n && t->n < LOGITS_TOP_K; j++) {
        if (isnan(l[j]))
            t->n_nan++;
        else
            heap_push(t, l[j], id0 + j);
    }
    if (t->n == LOGITS_TOP_K) {
        float thr = t->vals[0];
        for (; j < n; j++) {
            const float v = l[j];
            if (v <= thr)
                continue;
            if (isnan(v)) {
                t->n_nan++;
                continue;
            }
            t->vals[0] = v, t->ids[0] = id0 + j;
            heap_down(t, 0, LOGITS_TOP_K);
            thr = t->vals[0];
        }
    }
    for (int k = t->n - 1; k > 0; k--) { /* the worst left goes last: best first */
        heap_swap(t, 0, k);
        heap_down(t, 0, k);
    }
}

_Static_assert(LOGITS_TOP_K >= 1 && LOGITS_TOP_K <= 64, "gemm_ops.top_k keeps at most 64");

void logits_top_scan_ops(struct logits_top *t, const float *l, int n, int32_t id0,
                         const struct gemm_ops *so)
{
    if (!so)
        so = gemm_ops_get();
    if (!so->top_k) {
        heap_scan(t, l, n, id0);
        return;
    }
    int nan = 0;
    t->n = so->top_k(l, n, LOGITS_TOP_K, t->vals, t->ids, &nan);
    t->n_nan = nan;
    for (int i = 0; i < t->n; i++)
        t->ids[i] += id0;
}

void logits_top_scan(struct logits_top *t, const float *l, int n, int32_t id0)
{
    logits_top_scan_ops(t, l, n, id0, NULL);
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

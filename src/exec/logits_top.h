/*
 * logits_top - the sampler's first pass over a logits row, fused into the LM head.
 *
 * A sampler that is greedy, or keeps only the top k tokens, needs a few of a row's
 * largest logits, not all n_vocab of them. The FINAL_NORM_LOGITS instructions already
 * hold each row slice they wrote in cache, so each one also keeps the slice's
 * LOGITS_TOP_K largest logits (logits_top_scan); the backend merges the slices of a row
 * after the step (logits_top_merge) and hands the engine one struct logits_top per logit
 * row next to the logits. The sampler then picks from those candidates instead of copying
 * and selecting over the whole row (engine/sampler.h, sampler_sample_ex), which at a
 * 128k-token vocabulary is most of a small model's per-token work outside the forward
 * pass, and all of it on the engine's one thread.
 *
 * Order: candidates rank by larger value, then lower id (the sampler's order), so the top
 * K of a row is one well-defined set whatever the slices were: every member of the row's
 * top K is in the top K of its own slice, and the merge keeps the K best of those. The
 * result therefore never depends on the executor, the thread count or the split. NaN
 * logits are counted (n_nan) and never candidates; infinities are ordinary values.
 */
#ifndef WELD_EXEC_LOGITS_TOP_H
#define WELD_EXEC_LOGITS_TOP_H

#include <stdbool.h>
#include <stdint.h>

#define LOGITS_TOP_K 64

struct logits_top {
    int32_t n;                    /* candidates held: min(LOGITS_TOP_K, non-NaN logits) */
    int32_t n_nan;                /* NaN logits seen */
    int32_t ids[LOGITS_TOP_K];    /* token ids of the n largest logits, best first */
    float vals[LOGITS_TOP_K];     /* their logits */
};

/* a ranks before b: larger value, then lower id (values are never NaN here). */
static inline bool logits_top_better(float va, int32_t ia, float vb, int32_t ib)
{
    return va > vb || (va == vb && ia < ib);
}

/* The top of l[0, n), whose ids are id0 + j. */
void logits_top_scan(struct logits_top *t, const float *l, int n, int32_t id0);

/* The top of the union of parts[0, n_parts) (disjoint id sets, each a scan's result). */
void logits_top_merge(struct logits_top *out, const struct logits_top *parts, int n_parts);

#endif

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
 *
 * Softmax statistics (the temperature pass). Sampling at a temperature with no top-k,
 * top-p or min-p (the OpenAI API's default, temperature 1) draws from every token's
 * weight exp((l - max) / T), which took the engine thread two passes over the row per
 * token (1.2 ms at a 128k vocabulary). A caller that sets inv_t = 1 / T and two arrays on
 * a row's struct gets, per fixed chunk c of LOGITS_CHUNK ids [c * LOGITS_CHUNK, ...), the
 * chunk's max and its sum of weights relative to that max, under the kernels' softmax
 * contract (kernels/cpu/attn.h: attn_softmax_stats): the FINAL instruction computes the
 * chunks inside its slice, the backend the few a slice boundary cuts
 * (logits_stats_fill). Chunks are fixed by id, not by slice, so the numbers never depend
 * on the executor, the thread count or the split, and the sampler computing them itself
 * gets the same bits; it then draws with a walk over ~n_vocab / 256 chunk sums and one
 * chunk's weights (engine/sampler.h).
 */
#ifndef WELD_EXEC_LOGITS_TOP_H
#define WELD_EXEC_LOGITS_TOP_H

#include <stdbool.h>
#include <stdint.h>

#define LOGITS_TOP_K 64
#define LOGITS_CHUNK 256 /* ids per softmax-statistics chunk (<= ATTN_STATS_MAX) */

struct logits_top {
    int32_t n;                    /* candidates held: min(LOGITS_TOP_K, non-NaN logits) */
    int32_t n_nan;                /* NaN logits seen */
    int32_t ids[LOGITS_TOP_K];    /* token ids of the n largest logits, best first */
    float vals[LOGITS_TOP_K];     /* their logits */
    /* softmax statistics: set by the caller before the step (inv_t 0: none wanted) */
    float inv_t;                  /* 1 / temperature */
    float *chunk_max, *chunk_sum; /* (logits_n_chunks(n_vocab)) filled by the step: chunk
                                     c's max and sum (attn.h's softmax statistics) */
};

static inline int logits_n_chunks(int n_vocab)
{
    return (n_vocab + LOGITS_CHUNK - 1) / LOGITS_CHUNK;
}

/* Ids in chunk c (ids [c * LOGITS_CHUNK, ...)) of a row of n_vocab. */
static inline int logits_chunk_len(int n_vocab, int c)
{
    const int a = c * LOGITS_CHUNK;
    return n_vocab - a < LOGITS_CHUNK ? n_vocab - a : LOGITS_CHUNK;
}

/* The statistics of chunks [c0, c1) of row (n_vocab logits) at t->inv_t into t's arrays,
   with the instruction set's softmax_stats (gemm_ops_get()'s when so is NULL). */
struct gemm_ops;
void logits_stats_chunks(struct logits_top *t, const float *row, int n_vocab, int c0, int c1,
                         const struct gemm_ops *so);

/* a ranks before b: larger value, then lower id (values are never NaN here). */
static inline bool logits_top_better(float va, int32_t ia, float vb, int32_t ib)
{
    return va > vb || (va == vb && ia < ib);
}

/* The top of l[0, n), whose ids are id0 + j. */
void logits_top_scan(struct logits_top *t, const float *l, int n, int32_t id0);
/* The same with the kernels of so (NULL: gemm_ops_get()'s): its top_k when it has one,
   else the heap. Every so gives the same top. */
void logits_top_scan_ops(struct logits_top *t, const float *l, int n, int32_t id0,
                         const struct gemm_ops *so);

/* The top of the union of parts[0, n_parts) (disjoint id sets, each a scan's result);
   writes out's top fields only (n, n_nan, ids, vals). */
void logits_top_merge(struct logits_top *out, const struct logits_top *parts, int n_parts);

#endif

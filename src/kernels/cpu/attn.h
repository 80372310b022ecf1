/*
 * attn - the inner step of causal attention with an online softmax, for every
 * instruction set, under one numeric contract (bit-identical across ISAs, like gemm.h).
 *
 * What: the executor (exec/ops.c) walks a sequence's keys in chunks of ATTN_CHUNK = 16
 * consecutive positions, starting at position 0 (chunk c = positions [16c, 16c + 16)),
 * and calls attn_chunk with one KV head's key and value rows of the chunk, read in place
 * from the paged cache (f16/bf16/f32, widened to f32 exactly inside the kernel; q8_0 is
 * dequantized by the caller into f32 rows), for every query row that sees the chunk: the
 * query heads sharing that KV head, for a tile of tokens. Each row r carries its own
 * running state (max m[r], denominator l[r], accumulator acc[r][hd]) and its own count of
 * visible positions n[r] in [0, 16] (causality: a token at position p sees p + 1 keys).
 * After the last chunk, out = acc / l. Because chunks are fixed by absolute position, a
 * row's numbers depend only on its query, its position and the cache contents: not on
 * which tokens share the tile, how the prompt was chunked, or the ISA.
 *
 * The numeric contract, per row with n > 0 visible positions j < n (all f32):
 *   k_j, v_j = row j widened to f32 (exact)
 *   dot_j  = q . k_j under gemm.h's float-path contract: 16 lanes, element i into lane
 *            i % 16 with fmaf in increasing i, lanes folded pairwise (w = 8, 4, 2, 1);
 *   s_j    = dot_j * scale;  cm = max_j s_j;  m' = max(m, cm)   (max: attn_fmax, cm from
 *            -inf over j in increasing order; the SIMD row kernels take cm by a tree of
 *            vmaxps, which can differ only for NaN scores or equal zeros of both signs)
 *   corr   = attn_exp(m - m')                 (m = -inf before the first chunk: corr = 0)
 *   p_j    = attn_exp(s_j - m') for j < n, 0 for j >= n
 *   l'     = l * corr + fold(p)               fold: the 16 p lanes folded as above
 *   acc'   = acc * corr, then acc' = fmaf(p_j, v_j, acc') for j = 0 .. n-1 (per element)
 * attn_exp is the polynomial below (not libm's expf), written with fmaf and exact
 * operations only, so a SIMD lane computes the same bits as the scalar function.
 *
 * The same exp and fold give the softmax statistics of a logits chunk (attn_softmax_stats,
 * the sampler's temperature pass fused into the LM head: exec/logits_top.h), for l[j],
 * j < n <= ATTN_STATS_MAX, at inverse temperature inv_t:
 *   m      = max_j l[j] (NaN ignored; -inf if none), then m + 0 (so a zero max is +0)
 *   x_j    = (l[j] - m) * inv_t;  p_j = attn_exp(x_j)
 *   s      = fold(lanes), lane j % 16 summing p_j by plain adds in increasing j
 *
 * And the FFN's SiLU (attn_silu_mul), with the exp taken only of non-positive numbers:
 *   E      = attn_exp(-|g|)
 *   out    = ((g < 0 ? g * E : g) / (1 + E)) * u
 * which is g * sigmoid(g) * u for either sign (sigmoid(g) = 1 / (1 + e^-g) = e^g / (1 + e^g)).
 * libm's expf, used before, differs between libm builds and cannot be vectorized lane
 * for lane; this runs 16 lanes at a time and gives the same bits on every ISA.
 *
 * Reading the rows in place (no widened copy) matters at long contexts: a batch of decode
 * sequences reads more KV bytes per step than weights, and a copy doubled that traffic.
 * Not here: finding the rows in the block tables, q8_0, the final division, the causal
 * bookkeeping.
 */
#ifndef WELD_KERNELS_CPU_ATTN_H
#define WELD_KERNELS_CPU_ATTN_H

#include "format/dtype.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define ATTN_CHUNK 16

struct attn_chunk_args {
    int kv_type;          /* DT_F32, DT_F16 or DT_BF16: the element type of the rows below */
    const uint8_t *k[ATTN_CHUNK], *v[ATTN_CHUNK]; /* the chunk's key / value rows of one KV
                                                     head (hd elements each); entries past
                                                     the largest n[] are not read */
    int hd;               /* head dimension (any >= 1) */
    int nq;               /* query rows */
    const float *const *q; /* (nq) the query rows (hd floats each) */
    const int *n;         /* (nq) visible positions of each row, 0 .. ATTN_CHUNK */
    float scale;          /* 1 / sqrt(hd) */
    float *m, *l;         /* (nq) running max and denominator (m = -inf, l = 0 at start) */
    float *acc;           /* row r at acc + r * hd (zero at start) */
};

/* exp(x) for the attention contract: x <= 0 in use (scores minus their running max);
   below ATTN_EXP_MIN it returns 0 (also for -inf), above 88 it is not meant to be used.
   Cody-Waite reduction x = k ln2 + r, |r| <= ln2/2, then a degree-6 polynomial (relative
   error ~2e-7 against exp), scaled by 2^k through the exponent bits. Every step is an
   exactly rounded f32 operation (fmaf, mul, add, rounding to nearest even), which is why
   vector lanes reproduce it bit for bit. */
#define ATTN_EXP_MIN (-86.0f)
#define ATTN_LOG2E 1.44269504088896341f
#define ATTN_LN2_HI 0.693145751953125f
#define ATTN_LN2_LO 1.42860682030941723212e-6f
#define ATTN_P6 1.3888889e-3f
#define ATTN_P5 8.3333338e-3f
#define ATTN_P4 4.1666668e-2f
#define ATTN_P3 1.6666667e-1f
#define ATTN_P2 0.5f

static inline float attn_exp(float x)
{
    if (!(x >= ATTN_EXP_MIN))
        return 0.0f;
    float k = nearbyintf(x * ATTN_LOG2E);
    float r = fmaf(-k, ATTN_LN2_HI, x);
    r = fmaf(-k, ATTN_LN2_LO, r);
    float p = fmaf(ATTN_P6, r, ATTN_P5);
    p = fmaf(p, r, ATTN_P4);
    p = fmaf(p, r, ATTN_P3);
    p = fmaf(p, r, ATTN_P2);
    p = fmaf(p, r, 1.0f);
    p = fmaf(p, r, 1.0f);
    int32_t bits;
    memcpy(&bits, &p, sizeof bits);
    bits += (int32_t)k * (1 << 23); /* k in [-124, 0], p in [0.7, 1.5): stays normal */
    memcpy(&p, &bits, sizeof p);
    return p;
}

/* The contract's max: y if x < y or x == y (so of two zeros, y), x if y is NaN, y if x is
   NaN: what vmaxps gives with a NaN y replaced by x. Written out rather than libm's fmaxf,
   whose choice between equal zeros is the library's, and which is a call in a hot loop. */
static inline float attn_fmax(float x, float y)
{
    return y != y ? x : x > y ? x : y;
}

/* silu(g) * u under the contract above. */
static inline float attn_silu_mul1(float g, float u)
{
    const float e = attn_exp(-fabsf(g));
    return ((g < 0.0f ? g * e : g) / (1.0f + e)) * u;
}

#define ATTN_STATS_MAX 4096 /* the longest chunk attn_softmax_stats takes */

/* The scalar reference of the contract (what every SIMD version must match bit for bit). */
void attn_chunk_scalar(const struct attn_chunk_args *a);
/* The softmax statistics above of l[0, n), 1 <= n <= ATTN_STATS_MAX, into *m and *s. */
void attn_softmax_stats_scalar(const float *l, int n, float inv_t, float *m, float *s);
/* out[i] = attn_silu_mul1(gate[i], up[i]), i < n; out may alias gate or up. */
void attn_silu_mul_scalar(const float *gate, const float *up, float *out, int64_t n);
#if defined(__x86_64__)
void attn_chunk_avx2(const struct attn_chunk_args *a);
void attn_chunk_avx512(const struct attn_chunk_args *a);
/* attn_chunk_avx512 without the per-CPU choice of the one-row kernel (for tests). */
void attn_chunk_avx512_zmm(const struct attn_chunk_args *a);
void attn_softmax_stats_avx2(const float *l, int n, float inv_t, float *m, float *s);
void attn_softmax_stats_avx512(const float *l, int n, float inv_t, float *m, float *s);
void attn_silu_mul_avx2(const float *gate, const float *up, float *out, int64_t n);
void attn_silu_mul_avx512(const float *gate, const float *up, float *out, int64_t n);
#endif

#endif

/*
 * kernels (cpu) - the scalar reference kernels of the forward pass.
 *
 * Every kernel here is a straightforward loop over f32 data, written so the compiler can
 * vectorize it without changing its arithmetic: reductions keep KERN_LANES independent
 * partial sums in a fixed order and combine them in a fixed order, so a result depends
 * only on its inputs, never on how the caller split the work (rows, tokens, sequences) or
 * on what else is in the batch. That property is what makes batched, chunked and split
 * runs bit-identical to single runs; the per-ISA kernels (gemm.h) keep it under their own
 * contract, exact across ISAs.
 *
 * Weights: one place, kern_row_dot(), knows how to take the dot product of a weight row of
 * any supported type with an f32 vector. F32 rows are used in place; F16/BF16 rows are
 * widened and every other type is expanded with dtype_dequantize_row() into a caller
 * scratch buffer (KERN_ROW_SCRATCH(n) floats), then dotted. Simple and correct. The
 * executor's matrix products and norms now run on gemm.h (quantized blocks dotted
 * directly, activations quantized to int8); kern_row_dot remains the path for weight types
 * gemm.h does not cover (Q4_1, Q5_*, ...) and q8_0 KV keys, and the rest of this file
 * (rope, axpy, embedding rows) is used as is; SiLU moved to attn.h's exp contract.
 *
 * Nothing here allocates, fails or checks shapes: callers (exec/weights.c) validate
 * tensors once at load time.
 */
#ifndef WELD_KERNELS_CPU_KERNELS_H
#define WELD_KERNELS_CPU_KERNELS_H

#include "format/dtype.h"
#include "model/model.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KERN_LANES 8

/* Scratch floats kern_row_dot needs for a row of n elements. */
#define KERN_ROW_SCRATCH(n) ((size_t)(n))

/* True if weight rows of type t can be dotted (F32, F16, BF16, or a dequantizable type). */
bool kern_type_supported(int t);

/* sum_i a[i] * b[i] in f32 with KERN_LANES fixed partial sums. */
float kern_dot_f32(const float *a, const float *b, int64_t n);

/* Convert n elements of type t at src to f32 (F32 copied, F16/BF16 widened, others
   dequantized). n must be a multiple of the type's block size. */
void kern_to_f32(int t, const void *src, float *dst, int64_t n);

/* A weight row of type t (n elements) as f32: the row itself for F32, else converted into
   scratch (n floats). kern_dot_f32(kern_row_f32(...), x, n) == kern_row_dot(...), bit for
   bit, so callers may convert a row once and dot it with many vectors. */
const float *kern_row_f32(int t, const void *row, int64_t n, float *scratch);

/* Dot product of a weight row of type t (n elements) with x; scratch holds n floats. */
float kern_row_dot(int t, const void *row, const float *x, int64_t n, float *scratch);

/* Bytes per row of a 2-d weight, and a pointer to its row r. */
size_t kern_row_bytes(const struct tensor *w);
static inline const void *kern_tensor_row(const struct tensor *w, size_t row_bytes, int64_t r)
{
    return (const uint8_t *)w->data + (size_t)r * row_bytes;
}

/* y[r - row0] = W[r] . x for r in [row0, row1), W a 2-d weight {ne0 = n, ne1 = rows}. */
void kern_matvec(const struct tensor *w, int64_t row0, int64_t row1, const float *x,
                 float *y, float *scratch);

/* out = x / sqrt(mean(x^2) + eps) * weight (weight may be NULL: no scale). out may be x. */
void kern_rmsnorm(const float *x, const float *weight, float eps, float *out, int64_t n);

/* Rope angles for one position: cos/sin of pos * freq_i for i < rope_dim/2, where
   freq_i = theta^(-2i/rope_dim) / factor_i (factors may be NULL). pos is already scaled
   (linear scaling divides it before the call). */
void kern_rope_angles(double pos, float theta, int rope_dim, const float *factors,
                      float *cos_out, float *sin_out);

/* Rotate one head vector in place: neox pairs (i, i + rope_dim/2), else (2i, 2i+1).
   Elements at rope_dim and beyond are unchanged. */
void kern_rope_apply(float *v, int rope_dim, bool neox, const float *cosv, const float *sinv);


/* y[i] += a * x[i] */
void kern_axpy(float a, const float *x, float *y, int64_t n);

/* y[i] *= a */
void kern_scale(float a, float *y, int64_t n);

#endif

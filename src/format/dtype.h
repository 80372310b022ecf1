/*
 * dtype - tensor element types, with the same numeric ids and block layouts as GGUF/ggml,
 * so a GGUF tensor's type field is an enum weld_dtype as it stands.
 *
 * A quantized type stores blocks of `block_size` elements in `type_size` bytes; a row of n
 * elements (n a multiple of block_size) takes n / block_size * type_size bytes. Layouts are
 * bit-compatible with llama.cpp (ggml-common.h): Q8_0 {f16 d; int8 qs[32]}, Q4_0 {f16 d;
 * u8 qs[16]}, Q4_1 {f16 d, m; u8 qs[16]}, Q5_0 {f16 d; u8 qh[4]; u8 qs[16]}, Q5_1 {f16 d,
 * m; u8 qh[4]; u8 qs[16]}, Q4_K/Q5_K/Q6_K super-blocks of 256 (QK_K).
 *
 * The scalar (de)quantizers here are the reference every fast kernel is tested against.
 */
#ifndef WELD_FORMAT_DTYPE_H
#define WELD_FORMAT_DTYPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum weld_dtype {
    DT_F32 = 0,
    DT_F16 = 1,
    DT_Q4_0 = 2,
    DT_Q4_1 = 3,
    DT_Q5_0 = 6,
    DT_Q5_1 = 7,
    DT_Q8_0 = 8,
    DT_Q8_1 = 9,
    DT_Q2_K = 10,
    DT_Q3_K = 11,
    DT_Q4_K = 12,
    DT_Q5_K = 13,
    DT_Q6_K = 14,
    DT_Q8_K = 15,
    DT_I8 = 24,
    DT_I16 = 25,
    DT_I32 = 26,
    DT_I64 = 27,
    DT_F64 = 28,
    DT_BF16 = 30,
    DT_COUNT = 31, /* ids < DT_COUNT; not every id below it is a known type */
};

struct dtype_info {
    const char *name;  /* lower case as in llama.cpp: "f32", "q8_0", "q4_K" */
    int block_size;    /* elements per block (1 for plain types) */
    size_t type_size;  /* bytes per block */
    bool quantized;
    bool can_dequantize; /* dtype_dequantize_row supports it */
    bool can_quantize;   /* dtype_quantize_row supports it */
};

/* NULL if t is not a type weld knows (use this to validate ids read from files). */
const struct dtype_info *dtype_get(int t);
const char *dtype_name(int t); /* "unknown" if not known */
/* Case-insensitive lookup by name ("q8_0", "Q4_K", "bf16"); -1 if unknown. */
int dtype_from_name(const char *name);
/* Bytes of a row of n elements; 0 if t is unknown or n is not a multiple of block_size. */
size_t dtype_row_bytes(int t, int64_t n);

/* Convert n elements (a multiple of the block size) to f32. Requires can_dequantize. */
void dtype_dequantize_row(int t, const void *src, float *dst, int64_t n);
/* Convert n f32 elements to type t (reference rounding as llama.cpp's *_ref quantizers).
   Requires can_quantize. */
void dtype_quantize_row(int t, const float *src, void *dst, int64_t n);

#endif

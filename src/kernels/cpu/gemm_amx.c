/*
 * gemm_amx - the repacked Q8_0 / Q4_0 products on Intel AMX (tile registers, TMUL), for
 * prefill and batched decode: whole tiles of 16 tokens; everything else (fewer tokens,
 * other weight types, activation quantization, norms, attention) is the AVX-512 code,
 * which this level includes (isa.h: ISA_AMX = AVX-512 + AMX-TILE + AMX-INT8).
 *
 * Same numeric contract as every ISA's repacked kernels (gemm.h, GEMM_*_R16): per block
 * of 32 the exact integer dot isum_b, then acc = fmaf((float)isum_b, dw_b * dx_b, acc),
 * one f32 accumulator per (row, token), blocks in order; so the results are bit-identical
 * to gemm_scalar_r16 and to the AVX-512 kernel, and tests check it.
 *
 * Mapping. The repacked layout of a 16-row group's block (gemm.h: q[c][i][e], chunk c of
 * four elements for row i) is exactly the VNNI form AMX wants for its B operand: 8 rows of
 * 64 bytes, B[c][4i + e]. The activations are the A operand as they are: 16 tokens' q[32]
 * of block b, one tile row per token at the activation row stride (struct gemm_act_br).
 * TDPBSUD (signed A x unsigned B) gives C[t][i] = sum over the block of xq * (w + bias),
 * the same biased sum the AVX-512 vpdpbusd kernel makes, and the activation's corr
 * (-bias * sum xq) makes it the exact signed dot. Q4_0's nibbles are unpacked into a
 * 512-byte B image first (AMX has no 4-bit operand). C goes to a 1 KiB buffer and each
 * token's row of 16 weight rows is finished with AVX-512: add corr, convert, scale by
 * dw * dx, FMA into that token's accumulator (16 zmm for the 16 tokens).
 * Two blocks per step in their own tiles (A 0/1, B 2/3, C 4/5), software-pipelined one
 * step ahead (group16).
 *
 * Cost per block of 16 rows x 16 tokens: two tile loads, one TDPBSUD, one tile store and
 * 5 vector instructions per token, against 12 per token (8 vpdpbusd) for AVX-512 VNNI.
 * Measured on a Sapphire-Rapids-class core (one thread, 16 tokens, 2048 x 768 Q8_0): the
 * tile part alone 60 us, the vector finish alone 66 us, together ~104 us against 137 us for
 * the AVX-512 kernel (1.3x); the two overlap little, and the finish, which the per-block
 * scales of the contract make unavoidable, bounds the gain. End to end (llama-110m Q8_0,
 * pp512, 2 threads) 1.07-1.10x.
 *
 * Tile state: each call loads the tile configuration and releases the tiles on return, so
 * a worker never holds AMX state between products (the kernel saves no tile data for it
 * on a context switch) and no call depends on what another left configured. The OS
 * permission (arch_prctl ARCH_REQ_XCOMP_PERM) is requested once by isa.c before the level
 * is offered.
 */
#include "kernels/cpu/gemm.h"

#include "core/err.h"

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define AI static inline __attribute__((always_inline))

/* Tokens per AMX tile (rows of A and C). Calls with fewer tokens, and the remainder of a
   call, run the AVX-512 kernel. */
#define AMX_TOK 16

/* Bytes of one 16-row group's block in the repacked layouts (gemm.h). */
#define GBS_Q8 (16 * 34)
#define GBS_Q4 (16 * 18)

struct amx_cfg {
    uint8_t palette;
    uint8_t start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

/* Tiles 0, 1: A (16 tokens x 32 bytes); 2, 3: B (8 x 64 bytes); 4, 5: C (16 x 16 int32). */
static void amx_config(void)
{
    struct amx_cfg c __attribute__((aligned(64)));
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int i = 0; i < 2; i++) {
        c.rows[i] = AMX_TOK;
        c.colsb[i] = 32;
        c.rows[2 + i] = 8;
        c.colsb[2 + i] = 64;
        c.rows[4 + i] = AMX_TOK;
        c.colsb[4 + i] = 64;
    }
    _tile_loadconfig(&c);
}

/* Q4_0 block of a group (32 bytes of f16 scales, then q[4][16][4] nibble pairs) unpacked
   into the Q8-like B image: chunk c of four elements per row in bytes 64c .. 64c+63. */
AI void unpack_q4(const uint8_t *blk, uint8_t *img)
{
    const __m512i lo = _mm512_set1_epi8(0x0f);
    for (int c = 0; c < 4; c++) {
        __m512i p = _mm512_loadu_si512(blk + 32 + 64 * c);
        _mm512_store_si512(img + 64 * c, _mm512_and_si512(p, lo));
        _mm512_store_si512(img + 64 * (c + 4), _mm512_and_si512(_mm512_srli_epi16(p, 4), lo));
    }
}

/* Finish block b for the 16 tokens: acc[t] += (C[t] + corr) * (dw * d). */
AI void finish(const int32_t *cb, const uint8_t *blk, const uint8_t *act, size_t stride,
               int64_t b, __m512 *acc)
{
    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)blk));
    _Pragma("GCC unroll 16")
    for (int t = 0; t < AMX_TOK; t++) {
        const struct gemm_act_br *a = (const struct gemm_act_br *)(act + (size_t)t * stride) + b;
        __m512i s = _mm512_add_epi32(_mm512_load_si512(cb + 16 * t), _mm512_set1_epi32(a->corr));
        acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dw, _mm512_set1_ps(a->d)),
                                 acc[t]);
    }
}

/* Q4_0 blocks b and, if two, b + 1 of a group unpacked into img[0], img[1]. */
AI void unpack2(const uint8_t *w, int64_t b, int two, uint8_t (*img)[512])
{
    unpack_q4(w + (size_t)b * GBS_Q4, img[0]);
    if (two)
        unpack_q4(w + (size_t)(b + 1) * GBS_Q4, img[1]);
}

/* TMUL part of blocks b and, if two, b + 1 of a group (w: its first block) for 16 tokens
   (act: token 0's row): C of block b + h into cb[h]. Q4_0 reads the B images img[h],
   unpacked a step earlier (a tile load right after the stores that wrote its source would
   wait for them). */
AI void tmul2(const uint8_t *w, const uint8_t *act, size_t stride, int64_t b, int two,
              const int is_q8, int32_t (*cb)[AMX_TOK * 16], uint8_t (*img)[512])
{
    const uint8_t *b0 = w + (size_t)b * GBS_Q8;
    _tile_loadd(0, act + (size_t)b * sizeof(struct gemm_act_br), stride);
    _tile_loadd(2, is_q8 ? b0 + 32 : img[0], 64);
    _tile_zero(4);
    _tile_dpbsud(4, 0, 2);
    if (two) {
        _tile_loadd(1, act + (size_t)(b + 1) * sizeof(struct gemm_act_br), stride);
        _tile_loadd(3, is_q8 ? b0 + GBS_Q8 + 32 : img[1], 64);
        _tile_zero(5);
        _tile_dpbsud(5, 1, 3);
    }
    _tile_stored(4, cb[0], 64);
    if (two)
        _tile_stored(5, cb[1], 64);
}

/* One 16-row group x 16 tokens over all nb blocks, software-pipelined: the tiles of blocks
   b + 2, b + 3 are computed (into the other pair of C buffers) before blocks b, b + 1 are
   finished, so the vector loads of C never wait on a tile store just issued and TMUL
   overlaps the vector work. Rows at or past `valid` are not stored. */
AI void group16(const uint8_t *w, const uint8_t *act, size_t stride, int64_t nb, const int is_q8,
                int valid, float *y, size_t ldy)
{
    const size_t gbs = is_q8 ? GBS_Q8 : GBS_Q4;
    int32_t cb[2][2][AMX_TOK * 16] __attribute__((aligned(64)));
    uint8_t img[3][2][512] __attribute__((aligned(64)));
    __m512 acc[AMX_TOK];
    for (int t = 0; t < AMX_TOK; t++)
        acc[t] = _mm512_setzero_ps();
    if (!is_q8) {
        unpack2(w, 0, nb > 1, img[0]);
        if (nb > 2)
            unpack2(w, 2, nb > 3, img[1]);
    }
    tmul2(w, act, stride, 0, nb > 1, is_q8, cb[0], img[0]);
    int s = 0, u = 1;
    for (int64_t b = 0; b < nb; b += 2, s ^= 1, u = u == 2 ? 0 : u + 1) {
        if (!is_q8 && b + 4 < nb)
            unpack2(w, b + 4, b + 5 < nb, img[u == 2 ? 0 : u + 1]);
        if (b + 2 < nb)
            tmul2(w, act, stride, b + 2, b + 3 < nb, is_q8, cb[s ^ 1], img[u]);
        finish(cb[s][0], w + (size_t)b * gbs, act, stride, b, acc);
        if (b + 1 < nb)
            finish(cb[s][1], w + (size_t)(b + 1) * gbs, act, stride, b + 1, acc);
    }
    const __mmask16 m = valid >= 16 ? 0xffff : (__mmask16)((1u << valid) - 1);
    for (int t = 0; t < AMX_TOK; t++)
        _mm512_mask_storeu_ps(y + (size_t)t * ldy, m, acc[t]);
}

static void amx_r16(const struct gemm_args *a, int n_full)
{
    const int is_q8 = a->wtype == GEMM_Q8_0_R16;
    const int64_t nb = a->k / 32;
    amx_config();
    for (int64_t r = a->r0; r < a->r1; r += 16) {
        const int valid = a->r1 - r >= 16 ? 16 : (int)(a->r1 - r);
        const uint8_t *w = (const uint8_t *)a->w + (size_t)r * a->w_row_bytes;
        for (int t0 = 0; t0 < n_full; t0 += AMX_TOK) {
            const uint8_t *act = (const uint8_t *)a->act + (size_t)t0 * a->act_row_bytes;
            float *y = a->y + (size_t)t0 * a->ldy + (size_t)(r - a->r0);
            if (is_q8)
                group16(w, act, a->act_row_bytes, nb, 1, valid, y, a->ldy);
            else
                group16(w, act, a->act_row_bytes, nb, 0, valid, y, a->ldy);
        }
    }
    _tile_release();
}

static void amx_gemm(const struct gemm_args *a)
{
    const int n_full = a->n_tok / AMX_TOK * AMX_TOK;
    if (gemm_act_kind(a->wtype) != GEMM_ACT_Q8_R || n_full == 0 || a->r0 == a->r1) {
        gemm_ops_avx512.gemm(a);
        return;
    }
    WELD_ASSERT(a->r0 % 16 == 0 && a->act_row_bytes % 4 == 0);
    amx_r16(a, n_full);
    if (n_full < a->n_tok) {
        struct gemm_args rest = *a;
        rest.n_tok = a->n_tok - n_full;
        rest.act = (const uint8_t *)a->act + (size_t)n_full * a->act_row_bytes;
        rest.y = a->y + (size_t)n_full * a->ldy;
        gemm_ops_avx512.gemm(&rest);
    }
}

/* The rest is AVX-512's (a const table cannot name another file's static functions). */
static void amx_act_quant(int wtype, const float *x, size_t ldx, int64_t k, int n_tok, void *act,
                          size_t act_row_bytes)
{
    gemm_ops_avx512.act_quant(wtype, x, ldx, k, n_tok, act, act_row_bytes);
}

static float amx_row_dot(int t, const void *row, const float *x, int64_t n)
{
    return gemm_ops_avx512.row_dot(t, row, x, n);
}

static void amx_to_f32(int t, const void *row, float *dst, int64_t n)
{
    gemm_ops_avx512.to_f32(t, row, dst, n);
}

static void amx_rmsnorm(const float *x, const float *w, float eps, float *out, int64_t n)
{
    gemm_ops_avx512.rmsnorm(x, w, eps, out, n);
}

static void amx_to_f16(const float *x, void *dst, int64_t n)
{
    gemm_ops_avx512.to_f16(x, dst, n);
}

const struct gemm_ops gemm_ops_amx = {
    .isa = ISA_AMX,
    .act_quant = amx_act_quant,
    .gemm = amx_gemm,
    .row_dot = amx_row_dot,
    .to_f32 = amx_to_f32,
    .rmsnorm = amx_rmsnorm,
    .attn_chunk = attn_chunk_avx512,
    .softmax_stats = attn_softmax_stats_avx512,
    .top_k = kern_top_k_avx512,
    .silu_mul = attn_silu_mul_avx512,
    .to_f16 = amx_to_f16,
};

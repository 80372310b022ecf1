/*
 * gemm - weight x activation products for every instruction set, with one numeric
 * contract so any ISA can be checked against the scalar reference.
 *
 * What: y[t*ldy + (r - r0)] = sum_k W[r][k] * x[t][k] for rows r in [r0, r1) of a weight W
 * stored in GGUF block layout (row r at w + r*w_row_bytes, K elements) and tokens
 * t < n_tok. One entry point covers matrix-vector (n_tok = 1, decode) and matrix-matrix
 * (prefill, batched decode); workers splitting the rows of one matrix pass y + r0 of a
 * shared (n_tok, ldy) output, a caller wanting one head's rows passes a small buffer.
 * Weight types: F32, F16 (float path), BF16 (bf16 activations, vdpbf16ps's arithmetic) and
 * Q8_0, Q4_0, Q4_K, Q6_K (integer path). Levels: scalar, AVX2, AVX-512 and AMX
 * (gemm_amx.c: the repacked Q8_0 / Q4_0 products of 16 or more tokens on tile registers).
 *
 * Integer path: activations are quantized once per step (gemm_ops.act_quant) into int8
 * blocks matching the weight's block size, in a private layout (struct gemm_act_*):
 *   Q8_0, Q4_0 weights -> "q8_32": per block of 32, f32 scale d, int8 q[32] and the eight
 *       sums of 4 consecutive q ("lane sums") pre-multiplied by -128 (Q8_0) or -8 (Q4_0),
 *       stored two blocks at a time (struct gemm_act_b64),
 *       which lets an unsigned x signed dot (VNNI vpdpbusd, AVX2 maddubs) take the weights
 *       as unsigned bytes and still produce the exact signed products;
 *   Q4_K, Q6_K weights -> "q8_K": per 256, f32 scale d, int8 q[256], int16 sums of 16;
 *   repacked Q8_0 / Q4_0 -> per block of 32, q[32], d and the block sum times -128 / -8.
 *   Quantization: d = max|x| / 127, q = round-to-nearest-even(x / d) (x * (1/d)), clamped
 *   to [-127, 127] (so |q| <= 127 and AVX2 maddubs cannot saturate).
 *
 * The numeric contract (what "exact" means in the tests). Every (row, token) pair is
 * computed by the same sequence of f32 operations on every ISA, independently of n_tok,
 * of the tile the token falls in and of r0/r1, so results are bit-identical across ISAs
 * and deterministic under any batching or row split:
 *   F32/F16: 16 f32 lanes, element i accumulates into lane i % 16 with fmaf, in
 *       increasing i (F16 widens exactly first); then the lanes fold pairwise
 *       (lane i += lane i + w for w = 8, 4, 2, 1).
 *   BF16: activations rounded to bf16, one chain of fmaf per (row, token) over element
 *       pairs, odd element first, denormals flushed (below, before GEMM_BF16_R16).
 *   Q8_0/Q4_0: 16 f32 lanes, 8 for even and 8 for odd blocks; for block b, with
 *       l_j = the exact integer sum of the products of elements 4j..4j+3 (weight value
 *       times activation q), lane L = 8 * (b % 2) + j gets
 *       acc[L] = fmaf((float)l_j, dw_b * dx_b, acc[L]); after the last block the lanes fold
 *       as above (w = 8, 4, 2, 1). dw is the block's f16 scale widened to f32. (One zmm
 *       holds a row's two blocks; AVX2 keeps an even and an odd accumulator.)
 *   Q4_K/Q6_K: per super-block, the exact int32 S = sum over sub-blocks of scale * (q . x)
 *       (Q6_K: q - 32, with the 32 * sum16 part taken from the activation's sums) and, for
 *       Q4_K, M = sum of min * sum32(x); then acc = fmaf(d * dx, (float)S, acc) and, for
 *       Q4_K, acc = fmaf(-(dmin * dx), (float)M, acc); one f32 accumulator per pair.
 * So the fast kernels reorganize only integer arithmetic (exact) or keep the lane
 * structure; the accuracy against a dequantize-then-dot in double is that of the int8
 * activation quantization (integer paths) or of f32 accumulation (float paths).
 *
 * Register blocking: kernels process a few rows x up to GEMM_TILE_TOK tokens at a time so
 * each weight block is loaded (and unpacked) once per tile of tokens. Weights run in their
 * GGUF layout, or, for Q8_0 and Q4_0 on AVX-512 and AVX2 (gemm_repack_pays), repacked at
 * load into 16-row interleaved groups (gemm_repack, GEMM_*_R16 below: same bytes, its own
 * numeric contract). Measured on a Zen 5 core (AVX-512), 110M shapes, one thread: decode
 * Q4_0 20 -> 39 GB/s, Q8_0 29 -> 41 GB/s; prefill (64 tokens) 950 -> 2100-2400 tok/s. On a
 * Zen 3 core (AVX2), weld_kernel_bench pp64: Q8_0 184 -> 343 tok/s, Q4_0 122 -> 382.
 * F32 / F16 matrices of long rows are repacked on AVX-512 and AVX2 into segments
 * (GEMM_F*_R16 below: the float contract, so the same bits) so that one-token products keep
 * their activations in L1.
 * Q4_K (AVX2 and AVX-512) and Q6_K (AVX-512 only) are repacked too (GEMM_Q4_K_R16,
 * GEMM_Q6_K_R16: same bytes and the same contract as their GGUF layout, so the same bits): the GGUF
 * kernels reduce every (row, super-block) across lanes, the repacked ones keep a row per
 * lane. Sapphire-Rapids-class core, one thread, 110M shapes (weld_kernel_bench): Q4_K
 * decode 72 -> 190-290 tok/s, pp64 290 -> 1,100; Q6_K decode 95 -> 117, pp64 355 -> 805;
 * AVX2 kernel on the same core (WELD_ISA=avx2): Q4_K decode 64-69 -> 147-198, pp64 310 -> 430.
 *
 * Preconditions (checked by gemm_check once, at load; the kernels only assert cheap
 * invariants): K a multiple of the type's block size (F32/F16/BF16: any K >= 1), rows in
 * range, act from act_quant for the same weight type and K.
 *
 * Threading: every function is pure (reads its inputs, writes only its outputs), so workers
 * may run disjoint row ranges of one product at once; repacked weights split at multiples
 * of 16 rows.
 *
 * Attention's inner step (attn.h) rides in the same table (gemm_ops.attn_chunk), as do the
 * softmax statistics of logits chunks and the FFN's SiLU under the same exp
 * (gemm_ops.softmax_stats, .silu_mul), so one ISA pick covers them. Not here: rope
 * (kernels.h), the thread split, types other than the seven above (exec falls back to
 * kern_row_dot for those).
 */
#ifndef WELD_KERNELS_CPU_GEMM_H
#define WELD_KERNELS_CPU_GEMM_H

#include "kernels/cpu/attn.h"
#include "kernels/cpu/isa.h"

#include "weld.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Token tile of the register-blocked kernels (numbers do not depend on it). */
#define GEMM_TILE_TOK 4

enum gemm_act_kind {
    GEMM_ACT_NONE = 0, /* weight type not supported */
    GEMM_ACT_F32,      /* float path: x used as is */
    GEMM_ACT_Q8_32,    /* Q8_0, Q4_0 */
    GEMM_ACT_Q8_K,     /* Q4_K, Q6_K */
    GEMM_ACT_Q8_R,     /* GEMM_Q8_0_R16, GEMM_Q4_0_R16 */
    GEMM_ACT_BF16,     /* BF16, GEMM_BF16_R16: x rounded to bf16 (gemm_bf16_round) */
};

/* Repacked weight types (ids above every GGUF type): Q8_0 / Q4_0 rows interleaved in
   groups of 16 so that one zmm holds 4 consecutive elements of each of 16 rows and
   vpdpbusd yields 16 rows' block sums at once (no per-row reduction, no per-row scale
   broadcast). Same bytes as the original (16 rows x row bytes per group); made by
   gemm_repack. Layout of group g (rows 16g..16g+15), block b, at
   w + 16 * g * row_bytes + b * (16 * block bytes):
     uint16 d[16]              the rows' f16 scales
     Q8_0: u8 q[8][16][4]      q[c][i][e] = 128 + value of element 4c+e of row i
     Q4_0: u8 q[4][16][4]      low nibble: element 4c+e of row i; high: element 4(c+4)+e
                               (nibble = value + 8)
   Rows past the matrix end in the last group are zero. Numeric contract (all ISAs): per
   block the exact integer dot isum_b, then acc = fmaf((float)isum_b, dw_b * dx_b, acc),
   one f32 accumulator per (row, token), blocks in order. */
enum { GEMM_Q4_0_R16 = 0x102, GEMM_Q8_0_R16 = 0x108, GEMM_Q4_K_R16 = 0x10c, GEMM_Q6_K_R16 = 0x10e };

/* Repacked Q4_K (GEMM_Q4_K_R16): 16 rows interleaved per super-block of 256 so that one
   zmm lane is one row and a super-block's scales, mins and sums never leave their lanes.
   Same bytes as the original (16 x 144 per group and super-block); super-block b of group
   g at w + 16 * g * row_bytes + b * 2304:
     uint16 d[16], dmin[16]     the rows' f16 scales                           (64 bytes)
     uint32 sm[3][16]           sm[k][i] = bytes 4k..4k+3 of row i's 12 packed
                                6-bit scale / min bytes                        (192 bytes)
     u8 q[4][8][16][4]          q[c][e][i][x] = byte 32c + 4e + x of row i's qs: low
                                nibble = element 64c + 4e + x (sub-block 2c), high nibble
                                = element 64c + 32 + 4e + x (sub-block 2c + 1) (2048 bytes)
   Rows past the matrix end are zero. Activations: q8_K (struct gemm_act_bk), as for Q4_K.
   Numeric contract: exactly Q4_K's (the integers S and M per super-block, then the two
   fmaf), so a repacked matrix gives the same bits as its GGUF layout on every ISA. */

/* Repacked Q6_K (GEMM_Q6_K_R16), the same idea: 16 x 210 bytes per group and super-block,
   at w + 16 * g * row_bytes + b * 3360, with code(n) the unsigned 6-bit code of element n
   and chunk c (0..63) = elements 4c .. 4c+3:
     uint16 d[16]               the rows' f16 scales                           (32 bytes)
     int8 sc[8][16][2]          sc[p][i][h] = scale of sub-block 2p + h of row i (256)
     u8 ql[32][16][4]           ql[k][i][x]: low nibble = code(4k + x) & 15, high nibble
                                = code(4(k + 32) + x) & 15                     (2048)
     u8 qh[16][16][4]           qh[k][i][x]: bits 2s..2s+1 = code(4(k + 16s) + x) >> 4 (1024)
   Numeric contract: exactly Q6_K's, so again the same bits as the GGUF layout. */

/* BF16 weights have a contract of their own, the one AVX512_BF16's vdpbf16ps computes, so
   that instruction (32 products into 16 f32 lanes) can run it:
     activations: each x rounded to bf16 by gemm_bf16_round (round to nearest even, a
       denormal input to zero, NaN quieted; vcvtneps2bf16), stored as K bf16 values and
       zeros up to a multiple of 32 (gemm_act_row_bytes: 64 bytes per 32 elements);
     per (row, token), one f32 chain over the pairs p = 0 .. ceil(K/2) - 1 of elements
       (2p, 2p+1) (an odd K's missing element is +0 in both operands), from acc = +0:
         acc = ftz(fmaf(daz(w[2p+1]), daz(x[2p+1]), acc)),
         acc = ftz(fmaf(daz(w[2p]),   daz(x[2p]),   acc)),
       with daz() reading a denormal as a zero of its sign and ftz() flushing a denormal
       result to a zero of its sign (MXCSR's DAZ and FTZ, which vdpbf16ps always applies).
   llama.cpp does the same for BF16 weights on such CPUs (x rounded to bf16, then
   vdpbf16ps: ggml_vec_dot_bf16 in two zmm of 16 lane chains, summed in double at the end;
   tinyBLAS's prefill tiles likewise in lane chains); weld's one chain per output differs
   from those sums by rounding order only (about sqrt(K) f32 ulps of the products' size),
   far below the bf16 rounding of x (up to 2^-8 relative) that both share.
   Repacked BF16 (GEMM_BF16_R16): 16 rows interleaved by element pairs, so one zmm holds
   pair p of 16 rows and one vdpbf16ps advances 16 rows' chains by a pair:
     pair p of row i of group g at w + 16 * g * w_row_bytes + 64 * p + 4 * i
   (uint16 element 2p, then 2p + 1), K even, rows past the matrix zero, denormal weights
   stored as zeros of their sign (what daz() reads anyway). Columns [k0, k1) with k0 even
   are the same matrix at w + 32 * k0 with the same w_row_bytes (gemm_view_offset), and
   row ranges may start anywhere. */
enum { GEMM_BF16_R16 = 0x11e };

/* x rounded to bf16 as vcvtneps2bf16 does: nearest even, denormal -> signed zero, NaN
   quieted. (A normal x cannot round to a bf16 denormal: the exponents are f32's.) */
static inline uint16_t gemm_bf16_round(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40u);
    if ((u & 0x7f800000u) == 0)
        u &= 0x80000000u;
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* Byte offset of column k0 in a row of weights of (possibly repacked) type t: where the
   view of columns [k0, k1) starts, with the same w_row_bytes (k0 a whole block; even for
   GEMM_BF16_R16). */
size_t gemm_view_offset(int t, int64_t k0);

/* Row r (k elements) of a GEMM_BF16_R16 matrix (w, w_row_bytes as its gemm_args) widened
   to f32 into dst: the values the products read (a denormal weight is a zero of its
   sign, as repacking stored it). For a tied embedding table served from the weight pool. */
void gemm_bf16r_row_f32(const void *w, size_t w_row_bytes, int64_t r, int64_t k, float *dst);

/* Repacked float matrices (GEMM_F32_R16, GEMM_F16_R16): groups of 16 rows
   with each row cut in segments of S = gemm_fseg(K) elements, segment c of the group's 16
   rows one after the other, then segment c + 1. Same bytes as the original (rows rounded
   up to 16, the extra rows zero); segment c of row i of group g at
     w + 16 * g * row_bytes + (16 * c + i) * S * (element bytes).
   For every K that S = 128, 64 or 32 divides (the first that does) into at least two
   segments (gemm_fseg > 0); others stay in row order. Why: a one-token product then reads
   its weights in one stream, 16 rows' dependent FMA chains (the contract gives each row
   one per lane) side by side in short segments, and a segment's f32 activations (512
   bytes) stay in L1 for the 16 rows. Row order runs one row's chain of K / 16 FMAs at a
   time, which bounds a core by latency, not by memory: one Zen 5 core, one-token
   products over 128 MiB, GB/s row order / S = 128: K = 768 F16 29-33 / 40-43, K = 2048
   F16 and BF16 30-34 / 38-42, K = 8192 and 14336 BF16 (S = 2048 before) 32-37 / 40-43,
   against a plain read of 42; in the engine (2 threads, `weld bench --pair
   mega,mega@repack=0`) llama-110m F16 decode 1.06-1.12x, a Llama-3.2-1B-shaped BF16
   1.14x. Longer segments (256-2048) stream slower (35-40). Prefill tiles of 4 of the
   16 rows read 256-byte pieces of each segment, too short for the hardware prefetchers:
   the AVX-512 tile prefetches its rows' next segment, which brings prefill to 0.96-0.98x
   of row order (0.83-0.87x without).
   Every segment the same length, so one stride per matrix and no shorter last segment for
   the kernels to special-case, and every segment whole 64-byte lines of F16 / BF16.
   Numeric contract: the float path's (16 lanes per row, each in order of k; S is a
   multiple of 16, so element k stays in lane k % 16), so the same bits as the GGUF layout
   on every ISA. */
enum { GEMM_F32_R16 = 0x100, GEMM_F16_R16 = 0x101 };
#define GEMM_FSEG 128
#define GEMM_FSEG_MIN 32

/* Segment length of a repacked float matrix of rows of k elements (see above), or 0 if
   such rows stay in row order. */
static inline int64_t gemm_fseg(int64_t k)
{
    for (int64_t s = GEMM_FSEG; s >= GEMM_FSEG_MIN; s /= 2)
        if (k % s == 0)
            return k >= 2 * s ? s : 0;
    return 0;
}

/* The GGUF type a repacked type was made from (every id is 0x100 + that type), or t. */
static inline int gemm_base_type(int t) { return t >= 0x100 ? t - 0x100 : t; }

/* Quantized activations of one block of 32 for the repacked types. 40 bytes. */
struct gemm_act_br {
    int8_t q[32];
    int32_t corr; /* -off * sum(q); off = 128 (Q8_0_R16) or 8 (Q4_0_R16) */
    float d;
};

/* Bytes of the repacked form of a (rows, k) matrix of type t (Q8_0, Q4_0, Q4_K, Q6_K; F32,
   F16 when gemm_fseg(k) > 0; BF16 when k is even): rows rounded up to 16; 0 if t has no
   repacked form or k is not a multiple of its block. */
size_t gemm_repack_bytes(int t, int64_t rows, int64_t k);

/* Repack rows [0, rows) of w (type t, row r at w + r * w_row_bytes) into dst
   (gemm_repack_bytes). Returns the repacked type id, or -1 if t has none. Use the result
   with w_row_bytes = dtype row bytes of k, and r0 a multiple of 16 (r1 a multiple of 16
   or the matrix's last row + 1). */
int gemm_repack(int t, const void *w, size_t w_row_bytes, int64_t rows, int64_t k, void *dst);

/* Whether ops o run the repacked form of t faster than the GGUF layout (AVX-512 and
   AVX2; the scalar reference runs either form, the repacked one only for tests). */
struct gemm_ops;
bool gemm_repack_pays(const struct gemm_ops *o, int t);

/* Quantized activations of two consecutive blocks of 32 (Q8_0 / Q4_0 weights), blocks 2i
   (h = 0) and 2i + 1 (h = 1), laid out so a 512-bit register takes each field whole. For
   an odd block count the last pair's second half is all zero. 192 bytes. */
struct gemm_act_b64 {
    int8_t q[64];      /* q[32h + e]: element e of block 2i+h */
    int32_t corr[16];  /* corr[8h + j] = -off * (q[32h+4j] + .. + q[32h+4j+3]);
                          off = 128 (Q8_0) or 8 (Q4_0) */
    float d[16];       /* d[8h .. 8h+7]: the scale of block 2i+h, repeated */
};

/* Quantized activations of one super-block of 256 (Q4_K / Q6_K weights). 320 bytes. */
struct gemm_act_bk {
    int8_t q[256];
    int16_t bsums[16]; /* sum of q[16g .. 16g+15] */
    float d;
    uint8_t pad[28];
};

/* Which activation layout weight type t needs (GEMM_ACT_NONE: not supported here). */
enum gemm_act_kind gemm_act_kind(int t);

/* Bytes of quantized activations per token for weight type t and K (0 for the float path
   and for unsupported types). A row of n_tok tokens needs n_tok times this. */
size_t gemm_act_row_bytes(int t, int64_t k);

/* Is (t, K) something these kernels run? WELD_ERR_UNSUPPORTED / INVALID_ARG with a
   message naming `what` (a tensor name) otherwise. */
int gemm_check(int t, int64_t k, const char *what, struct weld_err *e);

struct gemm_args {
    int wtype;
    const void *w;          /* row r at (uint8_t *)w + r * w_row_bytes */
    size_t w_row_bytes;     /* >= dtype row bytes of K (may be larger: padded rows) */
    int64_t r0, r1;         /* rows to compute */
    int64_t k;
    int n_tok;              /* >= 1 */
    const float *x;         /* float path: (n_tok, ldx) */
    size_t ldx;
    const void *act;        /* integer path: (n_tok, act_row_bytes) from act_quant; 4-byte
                               aligned (64 is best) */
    size_t act_row_bytes;   /* >= gemm_act_row_bytes(wtype, k), a multiple of 4 */
    float *y;               /* y[t * ldy + (r - r0)] */
    size_t ldy;
    unsigned flags;         /* GEMM_* below: how to walk the weights, never the numbers */
};

/* gemm_args.flags. GEMM_DECODE_PAIRS: one-token products of repacked Q8_0 / Q4_0 on
   AVX-512 walk two neighbouring 16-row groups side by side (two weight streams per core)
   instead of one group after the other (one stream). Same bits either way; which is
   faster depends on the core's prefetchers (gemm_decode_flags). */
#define GEMM_DECODE_PAIRS 1u
/* GEMM_L2_PREFETCH: the AVX-512 kernels' weight streams get a second software prefetch,
   into L2, further ahead than the one into L1. Same bits either way. */
#define GEMM_L2_PREFETCH 2u
/* GEMM_DECODE_PAIRS_LONG: GEMM_DECODE_PAIRS only for Q4_0 matrices whose 16-row groups
   are at least GEMM_PAIRS_LONG_BYTES (rows of K >= 2048): the nibbles' unpacking is the
   work a second chain hides. */
#define GEMM_DECODE_PAIRS_LONG 4u
#define GEMM_PAIRS_LONG_BYTES (16u << 10)
/* GEMM_RESIDENT: the weights stay in cache from one call to the next (a model of a few
   MiB, exec_weights): one-token float products run several rows side by side, which pays
   in cache and loses when streaming from memory. Same bits either way. */
#define GEMM_RESIDENT 8u
#define GEMM_RESIDENT_BYTES (8u << 20) /* models with at most this much in matrices */

/* The flags this CPU's cores stream fastest with: Intel GEMM_DECODE_PAIRS and
   GEMM_L2_PREFETCH, AMD Zen 5 (family 0x1A) GEMM_DECODE_PAIRS_LONG, others
   GEMM_L2_PREFETCH.
   GEMM_DECODE_PAIRS: one group at a time left the chains waiting on Intel (one SPR-class
   core: Q4_0 9-13 GB/s alone, 16 in pairs); two streams per core ran 10-19% slower on an
   AMD Zen 4 host (1B and 110M, Q8_0 and Q4_0, `weld bench --pair`, with the L2 prefetch),
   and the AVX2 kernels already keep one stream (Zen 3: two rows at once halved Q6_K
   decode). On Zen 5 without the L2 prefetch it depends on the type and the rows: 1B Q4_0
   decodes 5-14% faster in pairs (its down projection, K = 8192, 50% faster: 33 -> 49
   GB/s), 110M Q4_0 (K = 768) 6% slower, 110M Q8_0 the same or 4-6% slower, 1B Q8_0 from
   2.5% slower to 7% faster over one afternoon: hence pairs there for long Q4_0 rows only.
   GEMM_L2_PREFETCH: +5-10% per core on the SPR-class host (gemm_avx512.c); on Zen 5 the
   extra prefetch instructions cost instead: 110M shapes, 2 threads, weld_kernel_bench
   "of read" F16 100-105% -> 107-114%, Q8_0 repacked 121-125% -> 132-141%, Q4_0 repacked
   118-131% -> 144-154%; a one-thread F16 row loop 0.73-0.77 -> 0.93-0.98 of a plain
   read; the engine 3-9% faster. The tuning's decode_pairs and l2_prefetch (exec/tuning.h)
   override them for the exec layer (exec_weights). */
unsigned gemm_decode_flags(void);

struct gemm_ops {
    enum isa_level isa;
    /* Quantize n_tok rows of x (row t at x + t*ldx) for weight type wtype into act (row t
       at act + t*act_row_bytes). No-op for the float path. */
    void (*act_quant)(int wtype, const float *x, size_t ldx, int64_t k, int n_tok, void *act,
                      size_t act_row_bytes);
    /* The product described above. */
    void (*gemm)(const struct gemm_args *a);
    /* A single F32/F16/BF16 row (n elements) dotted with x under the float-path contract
       (for attention over K rows of any KV type). */
    float (*row_dot)(int t, const void *row, const float *x, int64_t n);
    /* dst[i] = row element i widened to f32, i < n, for an F32/F16/BF16 row (exact, so the
       same on every ISA; for attention's value rows). */
    void (*to_f32)(int t, const void *row, float *dst, int64_t n);
    /* out = x * (1 / sqrtf(ss / n + eps)) * w (w may be NULL), ss = x . x under the F32
       contract; elementwise ops in that order, so exact across ISAs. out may be x. */
    void (*rmsnorm)(const float *x, const float *w, float eps, float *out, int64_t n);
    /* dst[i] = x[i] rounded to f16 (little-endian bytes), exactly as format/dtype.c's
       scalar converter (round to nearest even; NaN -> 0x7E00 with the sign): the KV
       cache's writes. */
    void (*to_f16)(const float *x, void *dst, int64_t n);
    /* One chunk of attention under attn.h's contract. */
    void (*attn_chunk)(const struct attn_chunk_args *a);
    /* Softmax statistics of a logits chunk under attn.h's contract. */
    void (*softmax_stats)(const float *l, int n, float inv_t, float *m, float *s);
    /* out[i] = silu(gate[i]) * up[i] under attn.h's contract (its exp); out may alias. */
    void (*silu_mul)(const float *gate, const float *up, float *out, int64_t n);
    /* The k (1..64) best of the non-NaN l[0, n), larger value first, then lower position:
       their values and positions into vals / pos, best first; returns how many (k, or
       fewer non-NaN values); *n_nan = the NaN count. NULL where the exec layer's heap
       (exec/logits_top.c, the reference) is the fastest there is. */
    int (*top_k)(const float *l, int n, int k, float *vals, int32_t *pos, int *n_nan);
};

/* gemm_ops.top_k of AVX-512 (topk_avx512.c). */
int kern_top_k_avx512(const float *l, int n, int k, float *vals, int32_t *pos, int *n_nan);

extern const struct gemm_ops gemm_ops_scalar;

/* Scale d and inverse scale id of an activation block with max |x| = amax (the contract's
   "d = max|x| / 127, q = rne(x * (1/d))"): one definition for every ISA, so no copy can
   drift from the others. */
static inline void gemm_quant_scale(float amax, float *d, float *id)
{
    *d = amax / 127.0f;
    *id = *d != 0.0f ? 1.0f / *d : 0.0f;
}

/* The scalar reference for the repacked types (other ISAs without their own call it):
   Q8_0 / Q4_0 (GEMM_ACT_Q8_R), Q4_K and Q6_K, and the floats (GEMM_F*_R16). */
void gemm_scalar_r16(const struct gemm_args *a);
void gemm_scalar_fr16(const struct gemm_args *a);
void gemm_scalar_r16k(const struct gemm_args *a);
void gemm_scalar_r16q6(const struct gemm_args *a);
void gemm_scalar_bf16r(const struct gemm_args *a);
#if defined(__x86_64__)
extern const struct gemm_ops gemm_ops_avx2;
extern const struct gemm_ops gemm_ops_avx512;
extern const struct gemm_ops gemm_ops_amx; /* AVX-512 plus AMX repacked products */
#endif

/* The kernels of level l, or NULL if not built for this target or the CPU lacks it. */
const struct gemm_ops *gemm_ops_for(enum isa_level l);

/* The kernels of isa_active(). */
const struct gemm_ops *gemm_ops_get(void);

#endif

/*
 * gemm_scalar - the reference implementation of gemm.h, plus the ISA-independent parts
 * (activation layouts, shape checks, dispatch).
 *
 * Written as the numeric contract of gemm.h reads, one (row, token) pair at a time, with
 * fmaf for every multiply-add so that the SIMD kernels' FMA instructions give the same bits.
 * Speed is not a goal here (the engine runs it only under WELD_ISA=scalar or on non-x86);
 * clarity is, because every other kernel is tested against it. Weight blocks are read
 * byte by byte (unaligned, endian-independent); the block layouts are those of
 * format/dtype.h.
 */
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/gemm_quant.h"

#include "core/err.h"
#include "core/fp16.h"
#include "format/dtype.h"

#include <float.h>
#include <math.h>
#include <string.h>

_Static_assert(sizeof(struct gemm_act_b64) == 192, "gemm_act_b64 is 192 bytes");
_Static_assert(sizeof(struct gemm_act_bk) == 320, "gemm_act_bk is 320 bytes");
_Static_assert(sizeof(struct gemm_act_br) == 40, "gemm_act_br is 40 bytes");
_Static_assert(GEMM_F32_R16 == 0x100 + DT_F32 && GEMM_F16_R16 == 0x100 + DT_F16 &&
                   GEMM_BF16_R16 == 0x100 + DT_BF16 && GEMM_Q8_0_R16 == 0x100 + DT_Q8_0,
               "repacked ids are 0x100 + the GGUF type");

enum gemm_act_kind gemm_act_kind(int t)
{
    switch (t) {
    case DT_F32:
    case DT_F16:
    case GEMM_F32_R16:
    case GEMM_F16_R16: return GEMM_ACT_F32;
    case DT_BF16:
    case GEMM_BF16_R16: return GEMM_ACT_BF16;
    case DT_Q8_0:
    case DT_Q4_0:
        return GEMM_ACT_Q8_32;
    case DT_Q4_K:
    case DT_Q6_K:
    case GEMM_Q4_K_R16:
    case GEMM_Q6_K_R16:
        return GEMM_ACT_Q8_K;
    case GEMM_Q8_0_R16:
    case GEMM_Q4_0_R16:
        return GEMM_ACT_Q8_R;
    default:
        return GEMM_ACT_NONE;
    }
}

size_t gemm_act_row_bytes(int t, int64_t k)
{
    if (k <= 0)
        return 0;
    switch (gemm_act_kind(t)) {
    case GEMM_ACT_Q8_32:
        return (size_t)((k / 32 + 1) / 2) * sizeof(struct gemm_act_b64);
    case GEMM_ACT_Q8_K:
        return (size_t)(k / 256) * sizeof(struct gemm_act_bk);
    case GEMM_ACT_Q8_R:
        return (size_t)(k / 32) * sizeof(struct gemm_act_br);
    case GEMM_ACT_BF16: return (size_t)((k + 31) / 32) * 64;
    default:
        return 0;
    }
}

int gemm_check(int t, int64_t k, const char *what, struct weld_err *e)
{
    enum gemm_act_kind kind = gemm_act_kind(t);
    if (kind == GEMM_ACT_NONE)
        return err_set(e, WELD_ERR_UNSUPPORTED, "%s: weight type %s has no gemm kernel",
                       what ? what : "gemm", dtype_name(t));
    int64_t bs = kind == GEMM_ACT_Q8_32 || kind == GEMM_ACT_Q8_R ? 32
                 : kind == GEMM_ACT_Q8_K                         ? 256
                                                                 : 1;
    if (k < 1 || k % bs != 0 || k > ((int64_t)1 << 40))
        return err_set(e, WELD_ERR_INVALID_ARG,
                       "%s: row length %lld is not a positive multiple of %s's block size %lld",
                       what ? what : "gemm", (long long)k, dtype_name(t), (long long)bs);
    return WELD_OK;
}

const struct gemm_ops *gemm_ops_for(enum isa_level l)
{
    if (!isa_cpu_has(l))
        return NULL;
    switch (l) {
    case ISA_SCALAR:
        return &gemm_ops_scalar;
#if defined(__x86_64__)
    case ISA_AVX2:
        return &gemm_ops_avx2;
    case ISA_AVX512:
        return &gemm_ops_avx512;
    case ISA_AMX:
        return &gemm_ops_amx;
#endif
    default:
        return NULL;
    }
}

unsigned gemm_decode_flags(void)
{
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    if (__builtin_cpu_is("intel"))
        return GEMM_DECODE_PAIRS | GEMM_L2_PREFETCH;
    return isa_amd_family() >= 0x1A ? GEMM_DECODE_PAIRS_LONG : GEMM_L2_PREFETCH;
#else
    return 0u;
#endif
}

const struct gemm_ops *gemm_ops_get(void)
{
    const struct gemm_ops *o = gemm_ops_for(isa_active());
    return o ? o : &gemm_ops_scalar;
}

/* ------------------------------------------------------------------------------------ */
/* activation quantization                                                              */

static float ld_f16(const uint8_t *p) { return fp16_to_f32((uint16_t)(p[0] | p[1] << 8)); }

/* q = clamp(rne(x * id), -127, 127); NaN -> 0 (unspecified by the contract). */
static int8_t quant_one(float x, float id)
{
    float v = nearbyintf(x * id);
    if (v > 127.0f)
        return 127;
    if (v < -127.0f)
        return -127;
    return v == v ? (int8_t)v : 0;
}

/* Block 2i+h of x (32 floats) into half h of p; x NULL: a zero half. */
static void quant_b32(const float *x, struct gemm_act_b64 *p, int h, int32_t off)
{
    float amax = 0.0f, d = 0.0f, id = 0.0f;
    for (int i = 0; x && i < 32; i++)
        amax = fmaxf(amax, fabsf(x[i]));
    gemm_quant_scale(amax, &d, &id);
    int8_t *q = p->q + 32 * h;
    for (int i = 0; i < 32; i++)
        q[i] = x ? quant_one(x[i], id) : 0;
    for (int j = 0; j < 8; j++) {
        p->corr[8 * h + j] = -off * (q[4 * j] + q[4 * j + 1] + q[4 * j + 2] + q[4 * j + 3]);
        p->d[8 * h + j] = d;
    }
}

static void quant_br(const float *x, struct gemm_act_br *b, int32_t off)
{
    float amax = 0.0f, id;
    for (int i = 0; i < 32; i++)
        amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
    gemm_quant_scale(amax, &b->d, &id);
    int s = 0;
    for (int i = 0; i < 32; i++) {
        b->q[i] = quant_one(x[i], id);
        s += b->q[i];
    }
    b->corr = -off * s;
}

static void quant_bk(const float *x, struct gemm_act_bk *b)
{
    float amax = 0.0f;
    for (int i = 0; i < 256; i++)
        amax = fmaxf(amax, fabsf(x[i]));
    float id;
    gemm_quant_scale(amax, &b->d, &id);
    for (int i = 0; i < 256; i++)
        b->q[i] = quant_one(x[i], id);
    for (int g = 0; g < 16; g++) {
        int s = 0;
        for (int i = 0; i < 16; i++)
            s += b->q[16 * g + i];
        b->bsums[g] = (int16_t)s;
    }
    memset(b->pad, 0, sizeof b->pad);
}

/* Blocks 2i and (if nblk == 2) 2i+1 of x into pair p; a missing second block is zero. */
static void quant_pair(const float *x, int nblk, struct gemm_act_b64 *p, int32_t off)
{
    quant_b32(x, p, 0, off);
    quant_b32(nblk == 2 ? x + 32 : NULL, p, 1, off);
}

static void quant_bf16(const float *x, int64_t k, uint16_t *dst)
{
    for (int64_t i = 0; i < k; i++)
        dst[i] = gemm_bf16_round(x[i]);
    for (int64_t i = k; i % 32; i++)
        dst[i] = 0;
}

static const struct gemm_act_quantizers scalar_quantizers = {quant_pair, quant_bk, quant_br,
                                                             quant_bf16};

static void scalar_act_quant(int wtype, const float *x, size_t ldx, int64_t k, int n_tok,
                             void *act, size_t act_row_bytes)
{
    gemm_act_quant_rows(&scalar_quantizers, wtype, x, ldx, k, n_tok, act, act_row_bytes);
}

/* ------------------------------------------------------------------------------------ */
/* float path                                                                           */

static float fold(float *s, int n)
{
    for (int w = n / 2; w > 0; w /= 2)
        for (int i = 0; i < w; i++)
            s[i] += s[i + w];
    return s[0];
}

/* Element i of a float row at p, widened. */
static float ld_float(int t, const uint8_t *p, int64_t i)
{
    float w;
    if (t == DT_F32)
        memcpy(&w, p + 4 * i, 4);
    else if (t == DT_F16)
        w = ld_f16(p + 2 * i);
    else
        w = bf16_to_f32((uint16_t)(p[2 * i] | p[2 * i + 1] << 8));
    return w;
}

static float scalar_row_dot(int t, const void *row, const float *x, int64_t n)
{
    float s[16] = {0};
    for (int64_t i = 0; i < n; i++)
        s[i % 16] = fmaf(ld_float(t, row, i), x[i], s[i % 16]);
    return fold(s, 16);
}

/* Repacked floats (GEMM_F*_R16): each (row, token) as scalar_row_dot over the row's
   segments in order of k. */
void gemm_scalar_fr16(const struct gemm_args *a)
{
    const int bt = gemm_base_type(a->wtype);
    const int64_t seg = gemm_fseg(a->k);
    const size_t es = bt == DT_F32 ? 4 : 2, sb = (size_t)seg * es;
    WELD_ASSERT((a->r0 % 16 == 0 || a->r0 == a->r1) && seg > 0);
    for (int64_t r = a->r0; r < a->r1; r++) {
        const uint8_t *row = (const uint8_t *)a->w + (size_t)(r / 16) * 16 * a->w_row_bytes +
                             (size_t)(r % 16) * sb;
        for (int t = 0; t < a->n_tok; t++) {
            const float *x = a->x + (size_t)t * a->ldx;
            float s[16] = {0};
            for (int64_t i = 0; i < a->k; i++)
                s[i % 16] = fmaf(ld_float(bt, row + (size_t)(i / seg) * 16 * sb, i % seg), x[i],
                                 s[i % 16]);
            a->y[(size_t)t * a->ldy + (size_t)(r - a->r0)] = fold(s, 16);
        }
    }
}

/* ------------------------------------------------------------------------------------ */
/* BF16 (gemm.h's BF16 contract: one chain per (row, token) over element pairs)          */

static uint16_t ld_u16(const uint8_t *p)
{
    return (uint16_t)(p[0] | p[1] << 8);
}

/* daz(): a denormal bf16 reads as a zero of its sign. */
static float bf16_daz(uint16_t h)
{
    return bf16_to_f32((h & 0x7f80u) ? h : (uint16_t)(h & 0x8000u));
}

/* ftz(): a denormal result becomes a zero of its sign. */
static float bf16_ftz(float r)
{
    return fabsf(r) < FLT_MIN ? copysignf(0.0f, r) : r;
}

/* The chain's step for pair (w0, w1) . (x0, x1): the odd elements first. */
static float bf16_step(float acc, uint16_t w0, uint16_t w1, uint16_t x0, uint16_t x1)
{
    acc = bf16_ftz(fmaf(bf16_daz(w1), bf16_daz(x1), acc));
    return bf16_ftz(fmaf(bf16_daz(w0), bf16_daz(x0), acc));
}

/* Row (GGUF layout) dot the bf16 activations x, k elements. */
static float bf16_dot_row(const uint8_t *w, const uint16_t *x, int64_t k)
{
    float acc = 0.0f;
    for (int64_t i = 0; i < k; i += 2)
        acc = bf16_step(acc, ld_u16(w + 2 * i), i + 1 < k ? ld_u16(w + 2 * i + 2) : 0, x[i],
                        i + 1 < k ? x[i + 1] : 0);
    return acc;
}

/* Rows [r0, r1) of a GEMM_BF16_R16 matrix (any r0: the layout is per row). */
void gemm_scalar_bf16r(const struct gemm_args *a)
{
    WELD_ASSERT(a->k % 2 == 0 && a->r0 <= a->r1 && a->n_tok >= 1);
    for (int64_t r = a->r0; r < a->r1; r++) {
        const uint8_t *w = (const uint8_t *)a->w + (size_t)(r / 16) * 16 * a->w_row_bytes +
                           4 * (size_t)(r % 16);
        for (int t = 0; t < a->n_tok; t++) {
            const uint16_t *x = (const uint16_t *)((const uint8_t *)a->act +
                                                   (size_t)t * a->act_row_bytes);
            float acc = 0.0f;
            for (int64_t p = 0; p < a->k / 2; p++)
                acc = bf16_step(acc, ld_u16(w + 64 * p), ld_u16(w + 64 * p + 2), x[2 * p],
                                x[2 * p + 1]);
            a->y[(size_t)t * a->ldy + (size_t)(r - a->r0)] = acc;
        }
    }
}

/* ------------------------------------------------------------------------------------ */
/* integer path: one (row, token) pair                                                  */

/* Value of element i of a Q8_0 (is_q8) or Q4_0 weight block. */
static int b32_value(const uint8_t *blk, int i, int is_q8)
{
    const uint8_t *qs = blk + 2;
    if (is_q8)
        return (int8_t)qs[i];
    return (i < 16 ? qs[i] & 0x0f : qs[i - 16] >> 4) - 8;
}

static float dot_b32(const uint8_t *w, const struct gemm_act_b64 *a, int64_t nb, int is_q8)
{
    float acc[16] = {0};
    const size_t bs = is_q8 ? 34 : 18;
    for (int64_t b = 0; b < nb; b++, w += bs) {
        const struct gemm_act_b64 *p = a + b / 2;
        const int h = (int)(b % 2);
        const float s = ld_f16(w) * p->d[8 * h];
        for (int j = 0; j < 8; j++) {
            int l = 0;
            for (int i = 4 * j; i < 4 * j + 4; i++)
                l += b32_value(w, i, is_q8) * p->q[32 * h + i];
            acc[8 * h + j] = fmaf((float)l, s, acc[8 * h + j]);
        }
    }
    return fold(acc, 16);
}

/* 6-bit scale and min of sub-block j of a q4_K block (as dtype.c's scale_min_k4). */
static void q4k_scale_min(int j, const uint8_t *q, int *sc, int *m)
{
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* One q4_K block w against a: acc after the contract's two fmaf. */
static float q4k_block(const uint8_t *w, const struct gemm_act_bk *a, float acc)
{
    const uint8_t *qs = w + 16;
    int32_t S = 0, M = 0;
    for (int j = 0; j < 8; j++) {
        int sc, m;
        q4k_scale_min(j, w + 4, &sc, &m);
        const uint8_t *qb = qs + 32 * (j / 2);
        int32_t d = 0;
        for (int l = 0; l < 32; l++)
            d += (j % 2 ? qb[l] >> 4 : qb[l] & 0x0f) * a->q[32 * j + l];
        S += sc * d;
        M += m * (a->bsums[2 * j] + a->bsums[2 * j + 1]);
    }
    acc = fmaf(ld_f16(w) * a->d, (float)S, acc);
    return fmaf(-(ld_f16(w + 2) * a->d), (float)M, acc);
}

static float dot_q4_K(const uint8_t *w, const struct gemm_act_bk *a, int64_t nb)
{
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++, w += 144)
        acc = q4k_block(w, a + b, acc);
    return acc;
}

/* Element i (0..255) of a q6_K block as its unsigned 6-bit code. */
static int q6k_code(const uint8_t *w, int i)
{
    const uint8_t *ql = w + 64 * (i / 128), *qh = w + 128 + 32 * (i / 128);
    int l = i % 32, part = (i % 128) / 32; /* 0..3: ql low, ql+32 low, ql high, ql+32 high */
    int lo = part & 1 ? ql[l + 32] : ql[l];
    lo = part & 2 ? lo >> 4 : lo & 0x0f;
    return lo | (((qh[l] >> (2 * part)) & 3) << 4);
}

static float dot_q6_K(const uint8_t *w, const struct gemm_act_bk *a, int64_t nb)
{
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++, w += 210) {
        const int8_t *sc = (const int8_t *)(w + 192);
        int32_t S = 0;
        for (int g = 0; g < 16; g++) {
            int32_t d = 0;
            for (int i = 16 * g; i < 16 * g + 16; i++)
                d += q6k_code(w, i) * a[b].q[i];
            S += sc[g] * (d - 32 * a[b].bsums[g]);
        }
        acc = fmaf(ld_f16(w + 208) * a[b].d, (float)S, acc);
    }
    return acc;
}

static void scalar_gemm(const struct gemm_args *a)
{
    const enum gemm_act_kind kind = gemm_act_kind(a->wtype);
    WELD_ASSERT(kind != GEMM_ACT_NONE && a->n_tok >= 1 && a->r0 <= a->r1);
    if (kind == GEMM_ACT_Q8_R) {
        gemm_scalar_r16(a);
        return;
    }
    if (a->wtype == GEMM_Q4_K_R16) {
        gemm_scalar_r16k(a);
        return;
    }
    if (a->wtype == GEMM_Q6_K_R16) {
        gemm_scalar_r16q6(a);
        return;
    }
    if (a->wtype == GEMM_BF16_R16) {
        gemm_scalar_bf16r(a);
        return;
    }
    if (gemm_base_type(a->wtype) != a->wtype) { /* the floats: the only ones left */
        gemm_scalar_fr16(a);
        return;
    }
    for (int64_t r = a->r0; r < a->r1; r++) {
        const uint8_t *w = (const uint8_t *)a->w + (size_t)r * a->w_row_bytes;
        for (int t = 0; t < a->n_tok; t++) {
            const void *act = (const uint8_t *)a->act + (size_t)t * a->act_row_bytes;
            float v;
            switch (a->wtype) {
            case DT_Q8_0: v = dot_b32(w, act, a->k / 32, 1); break;
            case DT_Q4_0: v = dot_b32(w, act, a->k / 32, 0); break;
            case DT_Q4_K: v = dot_q4_K(w, act, a->k / 256); break;
            case DT_Q6_K: v = dot_q6_K(w, act, a->k / 256); break;
            case DT_BF16: v = bf16_dot_row(w, act, a->k); break;
            default: v = scalar_row_dot(a->wtype, w, a->x + (size_t)t * a->ldx, a->k);
            }
            a->y[(size_t)t * a->ldy + (size_t)(r - a->r0)] = v;
        }
    }
}

/* ------------------------------------------------------------------------------------ */
/* repacked Q8_0 / Q4_0 / Q4_K (groups of 16 rows)                                      */

size_t gemm_repack_bytes(int t, int64_t rows, int64_t k)
{
    if (t == DT_BF16)
        return k >= 2 && k % 2 == 0 && rows >= 0 ? (size_t)((rows + 15) / 16 * 16) * 2 * (size_t)k
                                                 : 0;
    if (t == DT_F32 || t == DT_F16)
        return gemm_fseg(k) > 0 && rows >= 0
                   ? (size_t)((rows + 15) / 16 * 16) * dtype_row_bytes(t, k)
                   : 0;
    const int64_t bs = t == DT_Q4_K || t == DT_Q6_K ? 256 : 32;
    if ((t != DT_Q8_0 && t != DT_Q4_0 && t != DT_Q4_K && t != DT_Q6_K) || k <= 0 || k % bs != 0 ||
        rows < 0)
        return 0;
    return (size_t)((rows + 15) / 16 * 16) * dtype_row_bytes(t, k);
}

/* Row i (0..15) of a group, super-block b, from its GGUF block src into the repacked
   group grp (gemm.h, GEMM_Q4_K_R16). */
static void repack_q4k_block(const uint8_t *src, int i, uint8_t *o)
{
    memcpy(o + 2 * i, src, 2);
    memcpy(o + 32 + 2 * i, src + 2, 2);
    for (int k = 0; k < 3; k++)
        memcpy(o + 64 + 4 * (16 * k + i), src + 4 + 4 * k, 4);
    for (int c = 0; c < 4; c++)
        for (int e = 0; e < 8; e++)
            memcpy(o + 256 + 4 * (16 * (8 * c + e) + i), src + 16 + 32 * c + 4 * e, 4);
}

/* The inverse: row i's GGUF block of super-block o into dst (144 bytes). */
static void unpack_q4k_block(const uint8_t *o, int i, uint8_t *dst)
{
    memcpy(dst, o + 2 * i, 2);
    memcpy(dst + 2, o + 32 + 2 * i, 2);
    for (int k = 0; k < 3; k++)
        memcpy(dst + 4 + 4 * k, o + 64 + 4 * (16 * k + i), 4);
    for (int c = 0; c < 4; c++)
        for (int e = 0; e < 8; e++)
            memcpy(dst + 16 + 32 * c + 4 * e, o + 256 + 4 * (16 * (8 * c + e) + i), 4);
}

/* Row i's GGUF q6_K block src into super-block o of a repacked group (GEMM_Q6_K_R16).
   o starts zeroed (qh bits are or-ed in). */
static void repack_q6k_block(const uint8_t *src, int i, uint8_t *o)
{
    memcpy(o + 2 * i, src + 208, 2);
    for (int g = 0; g < 16; g++)
        o[32 + 32 * (g / 2) + 2 * i + g % 2] = src[192 + g];
    for (int n = 0; n < 256; n++) {
        const int code = q6k_code(src, n), c = n / 4, x = n % 4;
        uint8_t *ql = o + 288 + 64 * (c % 32) + 4 * i + x;
        *ql |= (uint8_t)((code & 15) << (c < 32 ? 0 : 4));
        o[2336 + 64 * (c % 16) + 4 * i + x] |= (uint8_t)((code >> 4) << (2 * (c / 16)));
    }
}

/* Code of element n of row i in a repacked q6_K super-block o. */
static int r16q6_code(const uint8_t *o, int i, int n)
{
    const int c = n / 4, x = n % 4;
    const int lo = (o[288 + 64 * (c % 32) + 4 * i + x] >> (c < 32 ? 0 : 4)) & 15;
    const int hi = (o[2336 + 64 * (c % 16) + 4 * i + x] >> (2 * (c / 16))) & 3;
    return lo | hi << 4;
}

/* Row i of repacked q6_K super-block o against x: dot_q6_K's arithmetic on codes read from
   the repacked layout. */
static float r16q6_block(const uint8_t *o, int i, const struct gemm_act_bk *x, float acc)
{
    int32_t S = 0;
    for (int g = 0; g < 16; g++) {
        int32_t d = 0;
        for (int n = 16 * g; n < 16 * g + 16; n++)
            d += r16q6_code(o, i, n) * x->q[n];
        S += (int8_t)o[32 + 32 * (g / 2) + 2 * i + g % 2] * (d - 32 * x->bsums[g]);
    }
    return fmaf(ld_f16(o + 2 * i) * x->d, (float)S, acc);
}

/* Row i of repacked q4_K super-block o against x: the row's GGUF block rebuilt and run
   through q4k_block, so the reference is the GGUF one by construction. */
static float r16q4k_block(const uint8_t *o, int i, const struct gemm_act_bk *x, float acc)
{
    uint8_t blk[144];
    unpack_q4k_block(o, i, blk);
    return q4k_block(blk, x, acc);
}

/* The repacked K-quants: each (row, token) over the super-blocks (sbs bytes per group). */
static void scalar_r16kq(const struct gemm_args *a, size_t sbs,
                         float (*block)(const uint8_t *, int, const struct gemm_act_bk *, float))
{
    const int64_t nb = a->k / 256;
    WELD_ASSERT((a->r0 % 16 == 0 || a->r0 == a->r1) && a->r0 <= a->r1 && a->n_tok >= 1);
    for (int64_t r = a->r0; r < a->r1; r++) {
        const uint8_t *grp = (const uint8_t *)a->w + (size_t)(r / 16) * 16 * a->w_row_bytes;
        for (int t = 0; t < a->n_tok; t++) {
            const struct gemm_act_bk *x =
                (const struct gemm_act_bk *)((const uint8_t *)a->act + (size_t)t * a->act_row_bytes);
            float acc = 0.0f;
            for (int64_t b = 0; b < nb; b++)
                acc = block(grp + sbs * (size_t)b, (int)(r % 16), x + b, acc);
            a->y[(size_t)t * a->ldy + (size_t)(r - a->r0)] = acc;
        }
    }
}

void gemm_scalar_r16k(const struct gemm_args *a) { scalar_r16kq(a, 2304, r16q4k_block); }
void gemm_scalar_r16q6(const struct gemm_args *a) { scalar_r16kq(a, 3360, r16q6_block); }

int gemm_repack(int t, const void *w, size_t w_row_bytes, int64_t rows, int64_t k, void *dst)
{
    const size_t total = gemm_repack_bytes(t, rows, k);
    if (total == 0)
        return -1;
    memset(dst, 0, total);
    if (t == DT_BF16) {
        for (int64_t r = 0; r < rows; r++) {
            const uint8_t *src = (const uint8_t *)w + (size_t)r * w_row_bytes;
            uint8_t *o = (uint8_t *)dst + (size_t)(r / 16) * 32 * (size_t)k + 4 * (size_t)(r % 16);
            for (int64_t i = 0; i < k; i++) {
                uint16_t h = ld_u16(src + 2 * i);
                if (!(h & 0x7f80u)) /* daz(), once here */
                    h &= 0x8000u;
                o[64 * (i / 2) + 2 * (i % 2)] = (uint8_t)h;
                o[64 * (i / 2) + 2 * (i % 2) + 1] = (uint8_t)(h >> 8);
            }
        }
        return GEMM_BF16_R16;
    }
    if (t == DT_F32 || t == DT_F16) {
        const int64_t seg = gemm_fseg(k);
        const size_t sb = (size_t)seg * dtype_row_bytes(t, 1);
        for (int64_t r = 0; r < rows; r++) {
            const uint8_t *src = (const uint8_t *)w + (size_t)r * w_row_bytes;
            uint8_t *grp = (uint8_t *)dst + (size_t)(r / 16) * 16 * dtype_row_bytes(t, k);
            for (int64_t c = 0; c < k / seg; c++)
                memcpy(grp + (size_t)(16 * c + r % 16) * sb, src + (size_t)c * sb, sb);
        }
        return t + 0x100;
    }
    if (t == DT_Q4_K || t == DT_Q6_K) {
        const int q6 = t == DT_Q6_K;
        const size_t bs = q6 ? 210 : 144, sbs = 16 * bs;
        const int64_t nb = k / 256;
        for (int64_t r = 0; r < rows; r++) {
            const uint8_t *src = (const uint8_t *)w + (size_t)r * w_row_bytes;
            uint8_t *grp = (uint8_t *)dst + (size_t)(r / 16) * 16 * dtype_row_bytes(t, k);
            for (int64_t b = 0; b < nb; b++)
                (q6 ? repack_q6k_block : repack_q4k_block)(src + bs * (size_t)b, (int)(r % 16),
                                                           grp + sbs * (size_t)b);
        }
        return q6 ? GEMM_Q6_K_R16 : GEMM_Q4_K_R16;
    }
    const int is_q8 = t == DT_Q8_0;
    const size_t bs = is_q8 ? 34 : 18, gbs = 16 * bs;
    const int64_t nb = k / 32;
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t *src = (const uint8_t *)w + (size_t)r * w_row_bytes;
        const int i = (int)(r % 16);
        uint8_t *grp = (uint8_t *)dst + (size_t)(r / 16) * 16 * dtype_row_bytes(t, k);
        for (int64_t b = 0; b < nb; b++, src += bs) {
            uint8_t *o = grp + (size_t)b * gbs;
            memcpy(o + 2 * i, src, 2);
            uint8_t *q = o + 32;
            for (int e = 0; e < 32; e++) {
                const int c = e / 4, x = e % 4;
                if (is_q8)
                    q[(c * 16 + i) * 4 + x] = (uint8_t)(src[2 + e] ^ 0x80);
                else if (c < 4)
                    q[(c * 16 + i) * 4 + x] |= (uint8_t)(b32_value(src, e, 0) + 8);
                else
                    q[((c - 4) * 16 + i) * 4 + x] |= (uint8_t)((b32_value(src, e, 0) + 8) << 4);
            }
        }
    }
    return is_q8 ? GEMM_Q8_0_R16 : GEMM_Q4_0_R16;
}

void gemm_bf16r_row_f32(const void *w, size_t w_row_bytes, int64_t r, int64_t k, float *dst)
{
    const uint8_t *g = (const uint8_t *)w + (size_t)(r / 16) * 16 * w_row_bytes +
                       4 * (size_t)(r % 16);
    for (int64_t i = 0; i < k; i++) {
        uint16_t h;
        memcpy(&h, g + 64 * (size_t)(i / 2) + 2 * (size_t)(i % 2), 2);
        dst[i] = bf16_to_f32(h);
    }
}

size_t gemm_view_offset(int t, int64_t k0)
{
    if (t == GEMM_BF16_R16)
        return 32 * (size_t)k0;
    return dtype_row_bytes(gemm_base_type(t), k0);
}

bool gemm_repack_pays(const struct gemm_ops *o, int t)
{
    if (t == DT_F32 || t == DT_F16 || t == DT_BF16)
        return o && o->isa != ISA_SCALAR;
    if (t == DT_Q6_K) /* only the AVX-512 levels have a repacked Q6_K kernel */
        return o && (o->isa == ISA_AVX512 || o->isa == ISA_AMX);
    return o && o->isa != ISA_SCALAR && (t == DT_Q8_0 || t == DT_Q4_0 || t == DT_Q4_K);
}

/* Unsigned code (value + offset) of element e of row i in a repacked block. */
static int r16_code(const uint8_t *blk, int i, int e, int is_q8)
{
    const uint8_t *q = blk + 32;
    const int c = e / 4, x = e % 4;
    if (is_q8)
        return q[(c * 16 + i) * 4 + x];
    const uint8_t byte = q[((c % 4) * 16 + i) * 4 + x];
    return c < 4 ? byte & 0x0f : byte >> 4;
}

void gemm_scalar_r16(const struct gemm_args *a)
{
    const int is_q8 = a->wtype == GEMM_Q8_0_R16;
    const size_t gbs = is_q8 ? 16 * 34 : 16 * 18;
    const int64_t nb = a->k / 32;
    WELD_ASSERT((a->r0 % 16 == 0 || a->r0 == a->r1) && a->r0 <= a->r1 && a->n_tok >= 1);
    for (int64_t r = a->r0; r < a->r1; r++) {
        const uint8_t *grp = (const uint8_t *)a->w + (size_t)(r / 16) * 16 * a->w_row_bytes;
        const int i = (int)(r % 16);
        for (int t = 0; t < a->n_tok; t++) {
            const struct gemm_act_br *x =
                (const struct gemm_act_br *)((const uint8_t *)a->act + (size_t)t * a->act_row_bytes);
            float acc = 0.0f;
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t *blk = grp + (size_t)b * gbs;
                int32_t isum = x[b].corr;
                for (int e = 0; e < 32; e++)
                    isum += r16_code(blk, i, e, is_q8) * x[b].q[e];
                acc = fmaf((float)isum, ld_f16(blk + 2 * i) * x[b].d, acc);
            }
            a->y[(size_t)t * a->ldy + (size_t)(r - a->r0)] = acc;
        }
    }
}

static void scalar_to_f32(int t, const void *row, float *dst, int64_t n)
{
    const uint8_t *p = row;
    if (t == DT_F32) {
        memcpy(dst, row, (size_t)n * sizeof(float));
        return;
    }
    for (int64_t i = 0; i < n; i++)
        dst[i] = t == DT_F16 ? ld_f16(p + 2 * i)
                             : bf16_to_f32((uint16_t)(p[2 * i] | p[2 * i + 1] << 8));
}

static void scalar_rmsnorm(const float *x, const float *w, float eps, float *out, int64_t n)
{
    const float ss = scalar_row_dot(DT_F32, x, x, n);
    const float inv = 1.0f / sqrtf(ss / (float)n + eps);
    for (int64_t i = 0; i < n; i++)
        out[i] = w ? x[i] * inv * w[i] : x[i] * inv;
}

static void scalar_to_f16(const float *x, void *dst, int64_t n)
{
    dtype_quantize_row(DT_F16, x, dst, n);
}

const struct gemm_ops gemm_ops_scalar = {
    .isa = ISA_SCALAR,
    .act_quant = scalar_act_quant,
    .gemm = scalar_gemm,
    .row_dot = scalar_row_dot,
    .to_f32 = scalar_to_f32,
    .rmsnorm = scalar_rmsnorm,
    .attn_chunk = attn_chunk_scalar,
    .softmax_stats = attn_softmax_stats_scalar,
    .silu_mul = attn_silu_mul_scalar,
    .to_f16 = scalar_to_f16,
};

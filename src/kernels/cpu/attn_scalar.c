/*
 * attn_scalar - the reference of attn.h's contract, written as the contract reads: plain
 * loops, fmaf, the 16-lane dot and fold. Every SIMD attn_chunk must match it bit for bit
 * (tests/test_kernels_attn.c).
 */
#include "kernels/cpu/attn.h"
#include "core/fp16.h"

#include <math.h>
#include <string.h>

/* 16 f32 lanes folded pairwise (w = 8, 4, 2, 1). */
static float fold16(float *v)
{
    for (int w = 8; w >= 1; w /= 2)
        for (int i = 0; i < w; i++)
            v[i] += v[i + w];
    return v[0];
}

/* Element i of a row of type t widened to f32 (exact). */
static float elem(int t, const uint8_t *row, int i)
{
    if (t == DT_F32) {
        float f;
        memcpy(&f, row + 4 * (size_t)i, sizeof f);
        return f;
    }
    uint16_t h = (uint16_t)(row[2 * (size_t)i] | row[2 * (size_t)i + 1] << 8);
    return t == DT_F16 ? fp16_to_f32(h) : bf16_to_f32(h);
}

static float dot16(const float *q, int t, const uint8_t *row, int n)
{
    float lane[16] = {0};
    for (int i = 0; i < n; i++)
        lane[i % 16] = fmaf(q[i], elem(t, row, i), lane[i % 16]);
    return fold16(lane);
}

void attn_chunk_scalar(const struct attn_chunk_args *a)
{
    const int hd = a->hd;
    for (int r = 0; r < a->nq; r++) {
        const int n = a->n[r];
        if (n <= 0)
            continue;
        const float *q = a->q[r];
        float s[ATTN_CHUNK], p[ATTN_CHUNK];
        float cm = -INFINITY;
        for (int j = 0; j < n; j++) {
            s[j] = dot16(q, a->kv_type, a->k[j], hd) * a->scale;
            cm = attn_fmax(cm, s[j]);
        }
        const float m = a->m[r], mn = attn_fmax(m, cm);
        const float corr = attn_exp(m - mn);
        for (int j = 0; j < ATTN_CHUNK; j++)
            p[j] = j < n ? attn_exp(s[j] - mn) : 0.0f;
        float pf[ATTN_CHUNK];
        memcpy(pf, p, sizeof pf);
        a->l[r] = a->l[r] * corr + fold16(pf);
        a->m[r] = mn;
        float *acc = a->acc + (size_t)r * hd;
        for (int i = 0; i < hd; i++)
            acc[i] *= corr;
        for (int j = 0; j < n; j++)
            for (int i = 0; i < hd; i++)
                acc[i] = fmaf(p[j], elem(a->kv_type, a->v[j], i), acc[i]);
    }
}

void attn_softmax_stats_scalar(const float *l, int n, float inv_t, float *m, float *s)
{
    float mx = -INFINITY;
    for (int j = 0; j < n; j++)
        if (l[j] > mx)
            mx = l[j];
    mx += 0.0f;
    float lane[16] = {0};
    for (int j = 0; j < n; j++)
        lane[j % 16] += attn_exp((l[j] - mx) * inv_t);
    *m = mx;
    *s = fold16(lane);
}

void attn_silu_mul_scalar(const float *gate, const float *up, float *out, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        out[i] = attn_silu_mul1(gate[i], up[i]);
}

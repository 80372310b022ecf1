/*
 * gemm_quant - the walk of gemm_ops.act_quant over a step's activation rows and blocks
 * (gemm.h's layouts), written once for every ISA: an ISA file supplies only its block
 * quantizers (struct gemm_act_quantizers, each under the contract of its block layout)
 * and its act_quant calls gemm_act_quant_rows with them.
 *
 * Inline, so each ISA's copy calls its own quantizers directly and may inline them, as a
 * loop written in that file would: a block of 32 takes a few nanoseconds to quantize, so
 * an indirect call per block would be a share of it. Internal to kernels/cpu; include
 * only from gemm_*.c.
 */
#ifndef WELD_KERNELS_CPU_GEMM_QUANT_H
#define WELD_KERNELS_CPU_GEMM_QUANT_H

#include "format/dtype.h"
#include "kernels/cpu/gemm.h"

#include <stddef.h>
#include <stdint.h>

/* One ISA's activation block quantizers; off is the weights' bias (Q8_0 128, Q4_0 8). */
struct gemm_act_quantizers {
    /* Blocks 2i and, if nblk == 2, 2i+1 (32 floats each, from x) into pair p; with
       nblk == 1 the pair's second half is zeros (d, corr and q). */
    void (*b32_pair)(const float *x, int nblk, struct gemm_act_b64 *p, int32_t off);
    void (*bk)(const float *x, struct gemm_act_bk *b);              /* 256 floats */
    void (*br)(const float *x, struct gemm_act_br *b, int32_t off); /* 32 floats */
    /* k floats rounded by gemm_bf16_round into dst, then zeros up to a multiple of 32 */
    void (*bf16)(const float *x, int64_t k, uint16_t *dst);
};

/* gemm_ops.act_quant with the block quantizers *q (a constant, for the calls to fold). */
static inline __attribute__((always_inline)) void
gemm_act_quant_rows(const struct gemm_act_quantizers *q, int wtype, const float *x, size_t ldx,
                    int64_t k, int n_tok, void *act, size_t act_row_bytes)
{
    enum gemm_act_kind kind = gemm_act_kind(wtype);
    for (int t = 0; t < n_tok; t++) {
        const float *xt = x + (size_t)t * ldx;
        uint8_t *row = (uint8_t *)act + (size_t)t * act_row_bytes;
        if (kind == GEMM_ACT_Q8_32) {
            struct gemm_act_b64 *p = (struct gemm_act_b64 *)row;
            const int64_t nb = k / 32;
            for (int64_t i = 0; i < nb; i += 2)
                q->b32_pair(xt + 32 * i, nb - i >= 2 ? 2 : 1, p + i / 2,
                            wtype == DT_Q8_0 ? 128 : 8);
        } else if (kind == GEMM_ACT_Q8_K) {
            struct gemm_act_bk *b = (struct gemm_act_bk *)row;
            for (int64_t i = 0; i < k / 256; i++)
                q->bk(xt + 256 * i, b + i);
        } else if (kind == GEMM_ACT_Q8_R) {
            struct gemm_act_br *b = (struct gemm_act_br *)row;
            for (int64_t i = 0; i < k / 32; i++)
                q->br(xt + 32 * i, b + i, wtype == GEMM_Q8_0_R16 ? 128 : 8);
        } else if (kind == GEMM_ACT_BF16) {
            q->bf16(xt, k, (uint16_t *)row);
        }
    }
}

#endif

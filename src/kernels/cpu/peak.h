/*
 * peak - the compute probe: how many arithmetic operations per second n threads get from
 * one product instruction in a tight loop, the ceiling a compute-bound kernel (prefill's
 * matrix products) is measured against, as the bandwidth probe (bandwidth.h) is decode's.
 *
 * Method: each thread (pinned to CPU i when it can be) runs PEAK_ACC independent
 * accumulator chains of the instruction over register operands for a fixed count, so
 * neither latency nor loads limit it; a pass starts when all threads leave a barrier and
 * ends when the last one is done; the result is the best of `passes` passes (the machine
 * is shared and noisy: the best is the repeatable figure). Operations count multiplies
 * and adds separately, as GFLOP/s figures do: vdpbf16ps on 512 bits is 32 products and 32
 * adds = 64, vfmadd231ps 2 per lane, vpdpbusd 64 byte products and their adds = 128 (int8
 * operations, reported as such). The wide loops run at the clock heavy 512-bit work
 * gets, which is the clock the kernels get too.
 *
 * Which instruction bounds a product depends on the weight type and the ISA level
 * (peak_op_for): BF16 weights under AVX-512 use vdpbf16ps, float weights FMA, quantized
 * ones vpdpbusd (AVX-512) or AMX tiles, for which there is no probe yet (PEAK_NONE).
 */
#ifndef WELD_KERNELS_CPU_PEAK_H
#define WELD_KERNELS_CPU_PEAK_H

#include "format/dtype.h"
#include "kernels/cpu/isa.h"
#include "weld.h"

#include <stdint.h>

#define PEAK_ACC 16      /* independent chains per thread (512-bit loops) */
#define PEAK_ACC_AVX2 12 /* the 256-bit loop: 16 registers in all */

enum peak_op {
    PEAK_NONE = 0,
    PEAK_BF16_DOT, /* vdpbf16ps zmm: 64 ops */
    PEAK_F32_FMA,  /* vfmadd231ps zmm (AVX-512) or ymm (AVX2): 32 or 16 ops */
    PEAK_I8_DOT,   /* vpdpbusd zmm: 128 ops */
};

struct peak_result {
    enum peak_op op;
    const char *instr; /* e.g. "vdpbf16ps zmm" */
    double gops_best;  /* 1e9 operations per second, best pass */
    double gops_median;
    int threads, passes;
    double checksum; /* of every accumulator (keeps the loops live) */
};

/* The instruction weld's products of weights of type dt run on at level l (PEAK_NONE when
   there is no probe for it: scalar code, AMX tiles). */
enum peak_op peak_op_for(enum weld_dtype dt, enum isa_level l);

/* The instruction's name at level l, NULL when this build or CPU has no loop for it. */
const char *peak_instr(enum peak_op op, enum isa_level l);

/* Probe op at level l with n_threads (1..256) threads, `passes` (1..100) passes.
   WELD_ERR_INVALID_ARG out of range, WELD_ERR_UNSUPPORTED when peak_instr is NULL,
   WELD_ERR_INTERNAL when threads cannot be started. */
int peak_probe(enum peak_op op, enum isa_level l, int n_threads, int passes,
               struct peak_result *out, struct weld_err *e);

/* The loops: `iters` rounds of PEAK_ACC instructions; return a value that depends on every
   accumulator (keeps them live). Operations per round: peak_round_ops. */
double peak_loop_avx512(enum peak_op op, uint64_t iters);
double peak_loop_avx2(enum peak_op op, uint64_t iters);
double peak_round_ops(enum peak_op op, enum isa_level l);

#endif

/*
 * peak - the compute probe (design in peak.h): best and median of passes (the threads and
 * their timed passes: probe_team.h), and which instruction bounds which weight type.
 */
#include "kernels/cpu/peak.h"

#include "core/alloc.h"
#include "core/err.h"
#include "kernels/cpu/probe_team.h"

#include <stdlib.h>
#include <string.h>

/* Rounds per pass: about 10-30 ms of one core at the rates these loops reach. */
#define PEAK_ROUNDS (1u << 21)

enum peak_op peak_op_for(enum weld_dtype dt, enum isa_level l)
{
    if (l == ISA_SCALAR)
        return PEAK_NONE;
    switch (dt) {
    case DT_BF16: return l >= ISA_AVX512 ? PEAK_BF16_DOT : PEAK_F32_FMA;
    case DT_F16:
    case DT_F32: return PEAK_F32_FMA;
    default: /* quantized: int8 dot products (AVX-512 VNNI); AMX tiles have no probe */
        return l == ISA_AVX512 ? PEAK_I8_DOT : PEAK_NONE;
    }
}

const char *peak_instr(enum peak_op op, enum isa_level l)
{
#if defined(__x86_64__)
    if (l >= ISA_AVX512 && isa_cpu_has(ISA_AVX512)) {
        if (op == PEAK_BF16_DOT)
            return "vdpbf16ps zmm";
        if (op == PEAK_F32_FMA)
            return "vfmadd231ps zmm";
        if (op == PEAK_I8_DOT)
            return "vpdpbusd zmm";
    } else if (l == ISA_AVX2 && isa_cpu_has(ISA_AVX2) && op == PEAK_F32_FMA) {
        return "vfmadd231ps ymm";
    }
#else
    (void)op;
    (void)l;
#endif
    return NULL;
}

double peak_round_ops(enum peak_op op, enum isa_level l)
{
    if (l == ISA_AVX2)
        return op == PEAK_F32_FMA ? PEAK_ACC_AVX2 * 16.0 : 0;
    switch (op) {
    case PEAK_BF16_DOT: return PEAK_ACC * 64.0;
    case PEAK_F32_FMA: return PEAK_ACC * 32.0;
    case PEAK_I8_DOT: return PEAK_ACC * 128.0;
    default: return 0;
    }
}

struct peak_ctx {
    enum peak_op op;
    int wide; /* 1: the 512-bit loops */
    double sink[256];
};

static void peak_body(void *ctx, int id, int pass)
{
    struct peak_ctx *c = ctx;
    (void)pass;
#if defined(__x86_64__)
    c->sink[id] += c->wide ? peak_loop_avx512(c->op, PEAK_ROUNDS)
                           : peak_loop_avx2(c->op, PEAK_ROUNDS);
#else
    (void)c;
    (void)id;
#endif
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int peak_probe(enum peak_op op, enum isa_level l, int n_threads, int passes,
               struct peak_result *out, struct weld_err *e)
{
    memset(out, 0, sizeof *out);
    if (n_threads < 1 || n_threads > 256 || passes < 1 || passes > 100)
        return err_set(e, WELD_ERR_INVALID_ARG,
                       "compute probe: threads %d (1..256), passes %d "
                       "(1..100): out of range",
                       n_threads, passes);
    const char *instr = peak_instr(op, l);
    if (!instr)
        return err_set(e, WELD_ERR_UNSUPPORTED,
                       "compute probe: no loop for this instruction "
                       "at ISA level %s",
                       isa_name(l));
    struct peak_ctx c = {.op = op, .wide = l >= ISA_AVX512};
    double *rate = wcalloc((size_t)passes, sizeof *rate);
    if (!rate)
        return err_set(e, WELD_ERR_NOMEM, "compute probe: out of memory");
    int st = probe_team_run(n_threads, passes, peak_body, &c, rate, "compute probe", e);
    if (st != WELD_OK) {
        wfree(rate);
        return st;
    }
    const double ops = peak_round_ops(op, l) * PEAK_ROUNDS * n_threads;
    for (int i = 0; i < passes; i++)
        rate[i] = ops / (rate[i] > 0 ? rate[i] : 1e-9) / 1e9;
    qsort(rate, (size_t)passes, sizeof *rate, cmp_double);
    *out = (struct peak_result){.op = op,
                                .instr = instr,
                                .gops_best = rate[passes - 1],
                                .gops_median = rate[passes / 2],
                                .threads = n_threads,
                                .passes = passes};
    for (int i = 0; i < n_threads; i++)
        out->checksum += c.sink[i];
    wfree(rate);
    return WELD_OK;
}

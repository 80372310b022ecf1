/*
 * weld_kernel_bench - time the gemm kernels (kernels/cpu/gemm.h) on the weight shapes of a
 * whole model and compare decode with the read-bandwidth probe run in the same process.
 *
 *   weld_kernel_bench [-t THREADS] [--isa scalar|avx2|avx512|amx] [--preset 110m|1b|8b-4l|7b2-4l|all]
 *                     [--types f16,q8_0,q4_0,q8_0r,q4_0r...] [--gib G] [--seconds S] [--pp N]
 *                     [--pairs 0|1|2] [--l2 0|1]
 *
 * A type name ending in "r" (q8_0r, q4_0r, q4_Kr, f16r) runs the repacked 16-row form
 * (gemm_repack) of the matrices that have one (floats: K that gemm_fseg cuts into segments).
 *
 * For each preset and type it builds the model's matrices (q, k, v, o, gate, up, down per
 * layer, plus the output head; embeddings are not read by decode) filled with valid blocks,
 * then:
 *   tg: one token at a time through every matrix (n_tok = 1); threads split each matrix's
 *       rows and meet at a barrier per token; reports tokens/s and weight GB/s (medians
 *       over TG_ROUNDS), that as a share of the probe's best with the same threads, and
 *       "of read": the kernels' speed over that of a plain read of the same bytes, split
 *       the same way, as the probe's one-stream loop reads (alternated with the kernels,
 *       median of the ratios: on a shared host the probe's best pass, minutes from the
 *       kernels' runs, overstates what the memory gives them; this pairing does not);
 *       --pairs 1 sets GEMM_DECODE_PAIRS, 2 GEMM_DECODE_PAIRS_LONG, --l2 GEMM_L2_PREFETCH
 *       (default: the CPU's gemm_decode_flags);
 *   pp: N tokens (default 64) through every matrix as one matrix-matrix product; tokens/s
 *       of the products alone.
 * Not a unit test and not registered with ctest (bench/CMakeLists.txt builds it).
 * Attention, norms and the executor are not included, so tg here is an upper bound of what
 * the engine can reach with these kernels. The weights live in huge-page-advised memory
 * (wmap_huge), as the engine's weight pool does: from malloc (4 KiB pages) each page
 * boundary stops the hardware prefetcher.
 */
#include "core/alloc.h"
#include "core/fp16.h"
#include "core/rng.h"
#include "format/dtype.h"
#include "kernels/cpu/bandwidth.h"
#include "kernels/cpu/gemm.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct mat {
    int wtype; /* the model's type, or its repacked form */
    int64_t rows, k;
    size_t rb;
    uint8_t *w;
    size_t bytes; /* mapped at w (wmap_huge, as the engine's weight pool) */
};

struct model {
    const char *name;
    int wtype;
    int n_mat;
    struct mat *m;
    size_t bytes;
    int64_t max_k, max_rows;
};

struct preset {
    const char *name;
    int dim, n_layer, q_dim, kv_dim, ffn, vocab;
};

static const struct preset presets[] = {
    {"110m", 768, 12, 768, 768, 2048, 32000},
    {"1b", 2048, 16, 2048, 512, 8192, 128256},
    {"8b-4l", 4096, 4, 4096, 1024, 14336, 128256}, /* 4 of Llama-3-8B's 32 layers */
    {"7b2-4l", 4096, 4, 4096, 4096, 11008, 32000},  /* 4 of Llama-2-7B's: K = 11008 */
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static size_t row_bytes(int t, int64_t k)
{
    return t == DT_F32 ? (size_t)k * 4 : t == DT_F16 || t == DT_BF16 ? (size_t)k * 2
                                                                      : dtype_row_bytes(t, k);
}

/* Fill w (n bytes) with copies of one valid 256-element-multiple pattern row. */
static void fill(int t, uint8_t *w, size_t n)
{
    enum { PK = 4096 };
    static float f[PK];
    static uint8_t pat[PK * 4];
    struct rng r;
    rng_seed(&r, 7);
    for (int i = 0; i < PK; i++)
        f[i] = (float)(rng_normal(&r) * 0.02);
    size_t pb = row_bytes(t, PK);
    if (t == DT_F32)
        memcpy(pat, f, pb);
    else if (t == DT_F16 || t == DT_BF16)
        for (int i = 0; i < PK; i++) {
            uint16_t h = t == DT_F16 ? fp16_from_f32(f[i]) : bf16_from_f32(f[i]);
            memcpy(pat + 2 * i, &h, 2);
        }
    else
        dtype_quantize_row(t, f, pat, PK);
    for (size_t off = 0; off < n; off += pb)
        memcpy(w + off, pat, n - off < pb ? n - off : pb);
}

/* Replace every matrix that has one by its repacked form (gemm_repack), as the engine
   does (floats: only rows gemm_fseg cuts into segments). */
static int model_repack(struct model *md)
{
    int n = 0;
    for (int i = 0; i < md->n_mat; i++) {
        struct mat *m = &md->m[i];
        size_t nb = gemm_repack_bytes(md->wtype, m->rows, m->k);
        if (nb == 0)
            continue;
        uint8_t *dst = wmap_huge(nb);
        if (!dst)
            return -1;
        m->wtype = gemm_repack(md->wtype, m->w, m->rb, m->rows, m->k, dst);
        wunmap(m->w, m->bytes);
        m->w = dst;
        m->bytes = nb;
        n++;
    }
    return n > 0 ? 0 : -1;
}

static int model_make(struct model *md, const struct preset *p, int t)
{
    md->name = p->name;
    md->wtype = t;
    md->n_mat = 7 * p->n_layer + 1;
    md->m = calloc((size_t)md->n_mat, sizeof *md->m);
    md->bytes = 0;
    md->max_k = md->max_rows = 0;
    for (int i = 0; i < md->n_mat; i++) {
        struct mat *m = &md->m[i];
        int j = i % 7;
        if (i == md->n_mat - 1)
            m->rows = p->vocab, m->k = p->dim;
        else if (j == 0 || j == 3)
            m->rows = j == 0 ? p->q_dim : p->dim, m->k = j == 0 ? p->dim : p->q_dim;
        else if (j == 1 || j == 2)
            m->rows = p->kv_dim, m->k = p->dim;
        else if (j == 4 || j == 5)
            m->rows = p->ffn, m->k = p->dim;
        else
            m->rows = p->dim, m->k = p->ffn;
        m->wtype = t;
        m->rb = row_bytes(t, m->k);
        m->bytes = m->rb * (size_t)m->rows;
        m->w = wmap_huge(m->bytes);
        if (!m->w)
            return -1;
        fill(t, m->w, m->rb * (size_t)m->rows);
        md->bytes += m->rb * (size_t)m->rows;
        if (m->k > md->max_k)
            md->max_k = m->k;
        if (m->rows > md->max_rows)
            md->max_rows = m->rows;
    }
    return 0;
}

static void model_free(struct model *md)
{
    for (int i = 0; i < md->n_mat; i++)
        wunmap(md->m[i].w, md->m[i].bytes);
    free(md->m);
}

/* gemm_args.flags of every product (--pairs, --l2; default gemm_decode_flags()), and whether a
   pass only reads the weights (the paired reference of the tg figures). */
static unsigned g_flags;
static bool g_read_only;
static volatile uint64_t g_sink;

/* XOR of bytes [p, end) of a weight stream, as the probe's one-stream loop reads (from the
   first cache line on, whole 256-byte steps). */
static uint64_t read_span(const uint8_t *p, const uint8_t *end)
{
    const uint8_t *a = (const uint8_t *)(((uintptr_t)p + 63) & ~(uintptr_t)63);
    size_t n = end > a ? (size_t)(end - a) : 0;
    if (isa_cpu_has(ISA_AVX512))
        return bw_read_avx512(a, n & ~(size_t)255, 1, 2048, 4096, 0);
    return bw_read_scalar(a, n & ~(size_t)(BW_STREAMS * 256 - 1));
}

struct job {
    const struct model *md;
    const struct gemm_ops *o;
    int id, n_threads, n_tok, iters;
    float *x, *y;
    void *act;
    pthread_barrier_t *bar;
};

/* Thread id's rows of every matrix, iters times, a barrier after each pass. */
static void *job_main(void *arg)
{
    struct job *j = arg;
    const struct model *md = j->md;
    for (int it = 0; it < j->iters; it++) {
        for (int i = 0; i < md->n_mat; i++) {
            const struct mat *m = &md->m[i];
            int64_t r0 = m->rows * j->id / j->n_threads, r1 = m->rows * (j->id + 1) / j->n_threads;
            if (m->wtype != md->wtype) { /* repacked: groups of 16 rows */
                r0 = j->id ? r0 / 16 * 16 : 0;
                r1 = j->id + 1 < j->n_threads ? r1 / 16 * 16 : m->rows;
            }
            if (g_read_only) {
                g_sink ^= read_span(m->w + (size_t)r0 * m->rb, m->w + (size_t)r1 * m->rb);
                continue;
            }
            size_t arb = gemm_act_row_bytes(m->wtype, m->k);
            j->o->act_quant(m->wtype, j->x, (size_t)md->max_k, m->k, j->n_tok, j->act, arb);
            struct gemm_args a = {
                .wtype = m->wtype, .w = m->w, .w_row_bytes = m->rb, .r0 = r0, .r1 = r1,
                .k = m->k, .n_tok = j->n_tok, .x = j->x, .ldx = (size_t)md->max_k,
                .act = j->act, .act_row_bytes = arb, .y = j->y + r0, .ldy = (size_t)md->max_rows,
                .flags = g_flags,
            };
            j->o->gemm(&a);
        }
        pthread_barrier_wait(j->bar);
    }
    return NULL;
}

/* Seconds for iters passes of n_tok tokens with n threads. */
static double run(const struct model *md, const struct gemm_ops *o, int n, int n_tok, int iters)
{
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, (unsigned)n);
    struct job jobs[64];
    pthread_t th[64];
    for (int i = 0; i < n; i++) {
        jobs[i] = (struct job){md, o, i, n, n_tok, iters, NULL, NULL, NULL, &bar};
        jobs[i].x = calloc((size_t)n_tok * (size_t)md->max_k, sizeof(float));
        jobs[i].y = calloc((size_t)n_tok * (size_t)md->max_rows, sizeof(float));
        size_t arb = gemm_act_row_bytes(md->wtype, md->max_k) +
                     gemm_act_row_bytes(md->wtype + 0x100, md->max_k); /* either layout */
        jobs[i].act = calloc((size_t)n_tok, arb + 64);
        for (int64_t e = 0; e < (int64_t)n_tok * md->max_k; e++)
            jobs[i].x[e] = (float)((e * 7919) % 201 - 100) * 0.01f;
    }
    double t0 = now_s();
    for (int i = 1; i < n; i++)
        pthread_create(&th[i], NULL, job_main, &jobs[i]);
    job_main(&jobs[0]);
    for (int i = 1; i < n; i++)
        pthread_join(th[i], NULL);
    double dt = now_s() - t0;
    for (int i = 0; i < n; i++) {
        free(jobs[i].x);
        free(jobs[i].y);
        free(jobs[i].act);
    }
    pthread_barrier_destroy(&bar);
    return dt;
}

#define TG_ROUNDS 7 /* kernel / read alternations of the tg figure; medians over them */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    int threads = 2, pp = 64, pairs = -1, l2 = -1;
    double gib = 2.0, seconds = 2.0;
    const char *preset = "all", *types = "f16,bf16,q8_0,q4_0,q4_K,q6_K";
    const char *isa = NULL;
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(argv[i], "-t") && v) threads = atoi(v), i++;
        else if (!strcmp(argv[i], "--isa") && v) isa = v, i++;
        else if (!strcmp(argv[i], "--preset") && v) preset = v, i++;
        else if (!strcmp(argv[i], "--types") && v) types = v, i++;
        else if (!strcmp(argv[i], "--gib") && v) gib = atof(v), i++;
        else if (!strcmp(argv[i], "--seconds") && v) seconds = atof(v), i++;
        else if (!strcmp(argv[i], "--pp") && v) pp = atoi(v), i++;
        else if (!strcmp(argv[i], "--pairs") && v) pairs = atoi(v), i++;
        else if (!strcmp(argv[i], "--l2") && v) l2 = atoi(v), i++;
        else {
            fprintf(stderr, "usage: %s [-t N] [--isa L] [--preset 110m|1b|8b-4l|7b2-4l|all] "
                    "[--types a,b] [--gib G] [--seconds S] [--pp N] [--pairs 0|1|2] [--l2 0|1]\n", argv[0]);
            return 2;
        }
    }
    if (threads < 1 || threads > 64 || pp < 0 || pp > 4096 || pairs > 2 || l2 > 1) {
        fprintf(stderr, "threads must be 1..64, --pp 0..4096, --pairs 0..2, --l2 0 or 1\n");
        return 2;
    }
    g_flags = gemm_decode_flags();
    if (pairs >= 0)
        g_flags = (g_flags & ~(GEMM_DECODE_PAIRS | GEMM_DECODE_PAIRS_LONG)) |
                  (pairs == 1 ? GEMM_DECODE_PAIRS : pairs == 2 ? GEMM_DECODE_PAIRS_LONG : 0u);
    if (l2 >= 0)
        g_flags = l2 ? g_flags | GEMM_L2_PREFETCH : g_flags & ~GEMM_L2_PREFETCH;
    struct weld_err e = {0};
    enum isa_level lvl;
    if (isa_resolve(isa, &lvl, &e) != WELD_OK) {
        fprintf(stderr, "%s\n", e.msg);
        return 1;
    }
    const struct gemm_ops *o = gemm_ops_for(lvl);
    struct bw_result bw;
    if (gib > 0) {
        if (bw_probe((size_t)(gib * (1 << 30)), threads, 10, &bw, &e) != WELD_OK) {
            fprintf(stderr, "%s\n", e.msg);
            return 1;
        }
        printf("bandwidth probe: %d threads, %.2f GiB, %s loop: best %.1f GB/s, median %.1f GB/s\n",
               threads, (double)bw.bytes / (1 << 30), bw.isa, bw.gb_s_best, bw.gb_s_median);
    }
    printf("decode pairs (GEMM_DECODE_PAIRS): %s, L2 prefetch (GEMM_L2_PREFETCH): %s\n",
           g_flags & GEMM_DECODE_PAIRS        ? "on"
           : g_flags & GEMM_DECODE_PAIRS_LONG ? "long Q4_0 rows"
                                              : "off",
           g_flags & GEMM_L2_PREFETCH ? "on" : "off");
    printf("%-5s %-5s %-7s %9s %9s %8s %7s %7s %10s\n", "model", "type", "isa", "MB", "tg tok/s",
           "GB/s", "share", "of read", "pp tok/s");
    for (size_t pi = 0; pi < sizeof presets / sizeof presets[0]; pi++) {
        if (strcmp(preset, "all") && strcmp(preset, presets[pi].name))
            continue;
        char tl[256];
        snprintf(tl, sizeof tl, "%s", types);
        for (char *sv = NULL, *tn = strtok_r(tl, ",", &sv); tn; tn = strtok_r(NULL, ",", &sv)) {
            size_t tnl = strlen(tn);
            int repack = tnl > 1 && tn[tnl - 1] == 'r';
            if (repack)
                tn[tnl - 1] = 0;
            int t = dtype_from_name(tn);
            if (gemm_check(t, 256, tn, &e) != WELD_OK) {
                fprintf(stderr, "%s\n", e.msg);
                continue;
            }
            struct model md;
            if (model_make(&md, &presets[pi], t) != 0 || (repack && model_repack(&md) != 0)) {
                fprintf(stderr, "out of memory for %s %s\n", presets[pi].name, tn);
                model_free(&md);
                continue;
            }
            double one = run(&md, o, threads, 1, 1); /* warm-up, and sizes the timed run */
            int iters = (int)(seconds / (one > 1e-6 ? one : 1e-6) / TG_ROUNDS);
            iters = iters < 1 ? 1 : iters;
            double tk[TG_ROUNDS], ratio[TG_ROUNDS]; /* seconds per pass; read / kernel */
            for (int rd = 0; rd < TG_ROUNDS; rd++) { /* kernel and read alternate, ABBA */
                double ts[2];
                for (int h = 0; h < 2; h++) {
                    g_read_only = (h ^ rd) & 1;
                    ts[g_read_only] = run(&md, o, threads, 1, iters) / iters;
                }
                g_read_only = false;
                tk[rd] = ts[0];
                ratio[rd] = ts[1] / ts[0];
            }
            qsort(tk, TG_ROUNDS, sizeof tk[0], cmp_double);
            qsort(ratio, TG_ROUNDS, sizeof ratio[0], cmp_double);
            double tg = 1.0 / tk[TG_ROUNDS / 2], gbs = (double)md.bytes * tg / 1e9;
            double pps = pp > 0 ? pp / run(&md, o, threads, pp, 1) : 0.0;
            char tname[32];
            snprintf(tname, sizeof tname, "%s%s", dtype_name(t), repack ? "r" : "");
            printf("%-5s %-5s %-7s %9.1f %9.1f %8.1f %6.0f%% %6.0f%% %10.1f\n", md.name, tname,
                   isa_name(o->isa), md.bytes / 1e6, tg, gbs,
                   gib > 0 ? 100.0 * gbs / bw.gb_s_best : 0.0, 100.0 * ratio[TG_ROUNDS / 2], pps);
            fflush(stdout);
            model_free(&md);
        }
    }
    return 0;
}

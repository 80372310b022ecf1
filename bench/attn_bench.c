/*
 * weld_attn_bench - time attention's chunk step (kernels/cpu/attn.h) on one core, in the
 * three memory situations decode meets, for every instruction set this CPU has.
 *
 *   weld_attn_bench [--hd 64] [--rows 1,2,4] [--kv f16|bf16|f32] [--isa LIST] [--mib 256]
 *                   [--visible 16]
 *                   [--seconds 1]
 *
 * --isa: a list such as avx2,avx512 (default: every SIMD level this CPU has; scalar only
 * when named).
 *
 * One query row per KV head is decode without GQA; 2-8 rows are a GQA group (Llama 3: 4).
 * Every call is a full chunk (16 positions, every row sees all of them; --visible N < 16:
 * every row sees the first N, the kernel's path for a decode's last chunk), the state
 * carried from call to call as the executor carries it. Each KV head's chunk is one run of 16 rows
 * (exec/kv.h: a block's positions of one head are consecutive), and the runs are placed:
 *   hot:     4 chunks, over and over (in L1: the kernel's own speed);
 *   stream:  back to back over --mib MiB of K and of V (a sequence's consecutive blocks
 *            in the cache's layout since 2026-12-03: one stream per plane);
 *   islands: one run every 12 runs (the layout before: a block's heads side by side, so
 *            one head's next block was n_kv_head runs away; 12 heads as llama-110m).
 * Rows "avx512z" are attn_chunk_avx512_zmm: AVX-512 without the per-CPU choice that hands
 * one-row chunks to the AVX2 kernel on Zen 4 (attn_avx512.c).
 * Prints ns per chunk and the KV bytes read per second (K and V: 2 * 16 * hd * element
 * size per chunk), the best of 3 passes of --seconds each. KV memory is huge-page advised
 * (wmap_huge) as the engine's cache is. Not a unit test and not registered with ctest.
 */
#include "core/alloc.h"
#include "core/fp16.h"
#include "core/rng.h"
#include "format/dtype.h"
#include "kernels/cpu/attn.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/isa.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_ROWS 16
#define ISLAND_GAP 12

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

struct setup {
    int hd, nq, kv_type;
    int visible;         /* positions of each chunk every row sees (16: full chunks) */
    size_t esz, run;     /* bytes of one element, of one chunk's 16 rows */
    uint8_t *k, *v;      /* planes */
    size_t n_runs;       /* runs that fit in a plane */
    float *q, *acc, m[MAX_ROWS], l[MAX_ROWS];
};

/* Seconds per chunk over at least `seconds`: chunks at run index i * gap (mod n_runs,
   which is what wraps the walk), n_used distinct chunks. */
static double time_chunks(struct setup *s, void (*chunk)(const struct attn_chunk_args *),
                          size_t n_used, size_t gap, double seconds)
{
    const float *qp[MAX_ROWS];
    int n[MAX_ROWS];
    for (int r = 0; r < s->nq; r++)
        qp[r] = s->q + (size_t)r * s->hd, n[r] = s->visible;
    struct attn_chunk_args a = {.kv_type = s->kv_type, .hd = s->hd, .nq = s->nq, .q = qp,
                                .n = n, .scale = 1.0f / sqrtf((float)s->hd), .m = s->m,
                                .l = s->l, .acc = s->acc};
    long long calls = 0;
    double t0 = now_s(), t = 0;
    do {
        for (int r = 0; r < s->nq; r++)
            s->m[r] = -INFINITY, s->l[r] = 0.0f;
        memset(s->acc, 0, sizeof(float) * (size_t)s->nq * (size_t)s->hd);
        for (size_t i = 0; i < n_used; i++) {
            size_t at = (i * gap) % s->n_runs * s->run;
            for (int j = 0; j < ATTN_CHUNK; j++) {
                a.k[j] = s->k + at + (size_t)j * s->hd * s->esz;
                a.v[j] = s->v + at + (size_t)j * s->hd * s->esz;
            }
            chunk(&a);
        }
        calls += (long long)n_used;
        t = now_s() - t0;
    } while (t < seconds);
    return t / (double)calls;
}

static int parse_type(const char *v)
{
    return !strcmp(v, "f16") ? DT_F16 : !strcmp(v, "bf16") ? DT_BF16 : !strcmp(v, "f32") ? DT_F32
                                                                                       : -1;
}

int main(int argc, char **argv)
{
    int hd = 64, kv_type = DT_F16, visible = ATTN_CHUNK;
    const char *rows = "1,2,4", *isas = NULL;
    double mib = 256, seconds = 1;
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(argv[i], "--hd") && v) hd = atoi(v), i++;
        else if (!strcmp(argv[i], "--rows") && v) rows = v, i++;
        else if (!strcmp(argv[i], "--kv") && v) kv_type = parse_type(v), i++;
        else if (!strcmp(argv[i], "--isa") && v) isas = v, i++;
        else if (!strcmp(argv[i], "--mib") && v) mib = atof(v), i++;
        else if (!strcmp(argv[i], "--seconds") && v) seconds = atof(v), i++;
        else if (!strcmp(argv[i], "--visible") && v) visible = atoi(v), i++;
        else {
            fprintf(stderr, "usage: %s [--hd 64] [--rows 1,2,4] [--kv f16|bf16|f32] "
                            "[--isa avx2,avx512] [--mib 256] [--seconds 1] [--visible 16]\n",
                    argv[0]);
            return 2;
        }
    }
    if (hd < 1 || hd > 1024 || kv_type < 0 || mib < 1 || mib > 8192 || seconds <= 0 ||
        visible < 1 || visible > ATTN_CHUNK) {
        fprintf(stderr, "%s: bad option value (hd 1-1024, kv f16/bf16/f32, mib 1-8192, "
                        "visible 1-16)\n", argv[0]);
        return 2;
    }
    struct setup s = {.hd = hd, .kv_type = kv_type, .esz = kv_type == DT_F32 ? 4 : 2,
                      .visible = visible};
    s.run = (size_t)ATTN_CHUNK * (size_t)hd * s.esz;
    size_t plane = (size_t)(mib * 1048576.0) / s.run * s.run;
    s.n_runs = plane / s.run;
    if (s.n_runs < 4 * ISLAND_GAP + 1) {
        fprintf(stderr, "%s: --mib too small for hd %d\n", argv[0], hd);
        return 2;
    }
    s.k = wmap_huge(plane);
    s.v = wmap_huge(plane);
    s.q = malloc(sizeof(float) * MAX_ROWS * (size_t)hd);
    s.acc = malloc(sizeof(float) * MAX_ROWS * (size_t)hd);
    if (!s.k || !s.v || !s.q || !s.acc) {
        fprintf(stderr, "%s: out of memory\n", argv[0]);
        return 1;
    }
    /* keys spread so scores move up and down; values of the same scale */
    struct rng r;
    rng_seed(&r, 5);
    enum { PAT = 4096 };
    uint8_t pat[PAT * 4];
    for (int i = 0; i < PAT; i++) {
        float x = (float)rng_normal(&r);
        uint16_t h = kv_type == DT_F16 ? fp16_from_f32(x) : bf16_from_f32(x);
        if (kv_type == DT_F32)
            memcpy(pat + 4 * i, &x, 4);
        else
            memcpy(pat + 2 * i, &h, 2);
    }
    const size_t pb = PAT * s.esz;
    for (size_t off = 0; off < plane; off += pb) {
        memcpy(s.k + off, pat, plane - off < pb ? plane - off : pb);
        memcpy(s.v + off, pat, plane - off < pb ? plane - off : pb);
    }
    for (int i = 0; i < MAX_ROWS * hd; i++)
        s.q[i] = (float)rng_normal(&r) * 0.2f;

    printf("attention chunk step, one core: hd %d, kv %s, KV planes of %.0f MiB each, %d of "
           "16 positions visible\n", hd,
           kv_type == DT_F16 ? "f16" : kv_type == DT_BF16 ? "bf16" : "f32",
           (double)plane / 1048576.0, visible);
    printf("isa     rows   hot ns  (GB/s)   stream ns  (GB/s)   islands ns  (GB/s)\n");
    const double bytes = 2.0 * (double)s.run;
    /* the ISAs' kernels, and on AVX-512 also attn_chunk_avx512_zmm ("avx512z"): the same
       without the per-CPU one-row choice (attn_avx512.c) */
    for (int lvl = ISA_SCALAR; lvl <= ISA_COUNT; lvl++) {
        const bool zmm = lvl == ISA_COUNT;
        const struct gemm_ops *o = gemm_ops_for(zmm ? ISA_AVX512 : (enum isa_level)lvl);
        if (!o || lvl == ISA_AMX) /* AMX runs the AVX-512 attention kernel */
            continue;
        const char *name = zmm ? "avx512z" : isa_name(o->isa);
        if (isas ? !strstr(isas, zmm ? "avx512" : name) : lvl == ISA_SCALAR)
            continue; /* the scalar reference only when asked: ~40x slower */
        void (*chunk)(const struct attn_chunk_args *) = zmm ? attn_chunk_avx512_zmm
                                                            : o->attn_chunk;
        for (const char *p = rows; *p;) {
            int nq = atoi(p);
            if (nq >= 1 && nq <= MAX_ROWS) {
                s.nq = nq;
                double best[3] = {1e9, 1e9, 1e9};
                for (int pass = 0; pass < 3; pass++) {
                    double t[3] = {time_chunks(&s, chunk, 4, 1, seconds / 3),
                                   time_chunks(&s, chunk, s.n_runs, 1, seconds / 3),
                                   time_chunks(&s, chunk, s.n_runs / ISLAND_GAP, ISLAND_GAP,
                                               seconds / 3)};
                    for (int k = 0; k < 3; k++)
                        best[k] = t[k] < best[k] ? t[k] : best[k];
                }
                printf("%-7s %4d %8.1f %7.1f %11.1f %7.1f %12.1f %7.1f\n", name, nq,
                       best[0] * 1e9, bytes / best[0] / 1e9, best[1] * 1e9,
                       bytes / best[1] / 1e9, best[2] * 1e9, bytes / best[2] / 1e9);
            }
            p = strchr(p, ',');
            if (!p)
                break;
            p++;
        }
    }
    wunmap(s.k, plane);
    wunmap(s.v, plane);
    free(s.q);
    free(s.acc);
    return 0;
}

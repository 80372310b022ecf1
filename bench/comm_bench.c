/*
 * comm_bench - the exchanges of tensor parallelism, alone: latency and bandwidth of
 * comm_allgather (and of a rank's result sent to rank 0) at the sizes a step moves.
 *
 *     mpirun -np N build/bench/weld_comm_bench [--sizes 3072,8192,393216,1048576]
 *                                                [--iters 2000] [--json]
 *
 * For each size S (bytes of one rank's block) every rank runs `iters` allgathers of S
 * (after a tenth as many untimed ones) and rank 0 prints the median and 90th percentile
 * of the per-call time (the collective's time as its slowest rank sees it: each call
 * starts after a barrier-free exchange, as in a step) and the bandwidth S * (N - 1) /
 * median: the bytes each rank receives per call. Then the same for a point-to-point
 * message of S bytes from the last rank to rank 0 (a logits slice). These are the alpha
 * (latency) and beta (per byte) terms of the scaling model in docs/SCALING.md: decode
 * moves dim * 4 bytes per rank per exchange, prefill that times its tokens.
 */
#include "comm/comm.h"
#include "core/alloc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    const char *sizes = "3072,8192,65536,393216,1048576";
    int iters = 2000;
    int json = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--sizes") && i + 1 < argc)
            sizes = argv[++i];
        else if (!strcmp(argv[i], "--iters") && i + 1 < argc)
            iters = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--json"))
            json = 1;
        else {
            fprintf(stderr, "usage: mpirun -np N weld_comm_bench [--sizes B,B,..] "
                            "[--iters N] [--json]\n");
            return 2;
        }
    }
    struct weld_err e = {0};
    struct comm *c;
    if (iters < 10 || comm_create(&c, 0, 0, 60.0, &e)) {
        fprintf(stderr, "weld_comm_bench: %s\n", iters < 10 ? "--iters must be >= 10" : e.msg);
        return 1;
    }
    const int rank = comm_rank(c), n = comm_size(c);
    if (rank == 0 && !json)
        printf("%d ranks on %s; %d calls per size\n%10s %14s %14s %12s %14s %12s\n", n,
               comm_node_name(), iters, "bytes", "allgather us", "p90 us", "GB/s", "send us",
               "GB/s");
    if (rank == 0 && json)
        printf("{\"ranks\": %d, \"results\": [", n);
    double *t = wmalloc(sizeof(double) * (size_t)iters);
    int first = 1, rc = 0;
    for (const char *s = sizes; *s && !rc;) {
        size_t bytes = strtoull(s, NULL, 10);
        s = strchr(s, ',') ? strchr(s, ',') + 1 : s + strlen(s);
        uint8_t *buf = wcalloc((size_t)n, bytes ? bytes : 1);
        if (!buf || !t)
            return 1;
        for (int i = -iters / 10; i < iters && !rc; i++) {
            double t0 = now_s();
            rc = comm_allgather(c, buf, bytes, &e);
            if (i >= 0)
                t[i] = now_s() - t0;
        }
        qsort(t, (size_t)iters, sizeof *t, cmp_d);
        const double ag = t[iters / 2], ag90 = t[iters * 9 / 10];
        for (int i = -iters / 10; i < iters && !rc && n > 1; i++) {
            double t0 = now_s();
            if (rank == n - 1)
                rc = comm_send(c, buf, bytes, 0, 7, &e);
            else if (rank == 0)
                rc = comm_recv(c, buf, bytes, n - 1, 7, &e);
            if (!rc)
                rc = comm_barrier(c, &e);
            if (i >= 0)
                t[i] = now_s() - t0;
        }
        qsort(t, (size_t)iters, sizeof *t, cmp_d);
        const double p2p = n > 1 ? t[iters / 2] : 0;
        if (rank == 0 && !json)
            printf("%10zu %14.2f %14.2f %12.2f %14.2f %12.2f\n", bytes, ag * 1e6, ag90 * 1e6,
                   ag > 0 ? (double)bytes * (n - 1) / ag / 1e9 : 0, p2p * 1e6,
                   p2p > 0 ? (double)bytes / p2p / 1e9 : 0);
        if (rank == 0 && json)
            printf("%s{\"bytes\": %zu, \"allgather_s\": %.9f, \"allgather_p90_s\": %.9f, "
                   "\"send_s\": %.9f}",
                   first ? "" : ", ", bytes, ag, ag90, p2p);
        first = 0;
        wfree(buf);
    }
    if (rank == 0 && json)
        printf("]}\n");
    if (rc)
        fprintf(stderr, "weld_comm_bench: rank %d: %s\n", rank, e.msg);
    wfree(t);
    comm_free(c);
    comm_finalize();
    return rc ? 1 : 0;
}

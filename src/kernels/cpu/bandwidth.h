/*
 * bandwidth - the read-bandwidth probe: how many bytes per second the memory system
 * delivers to n threads streaming through a buffer far larger than the caches. Decode
 * reads every weight once per token, so this is the roofline `weld bench` reports decode
 * speed against.
 *
 * Method: one buffer of `bytes` (rounded down to 4 KiB per thread), filled once so every
 * page is backed; each thread (pinned to CPU i when it can be) owns a contiguous slice and
 * reads it as several independent streams (BW_STREAMS sub-slices walked side by side, two
 * 64-byte lines per stream per step, XOR-folded so no load is dead). A pass starts when
 * all threads leave a barrier and ends when the last one arrives at the next; the result
 * is the best pass (the machine is shared and noisy: the best is the repeatable figure)
 * and the median. The AVX-512 read loop (bandwidth_avx512.c) runs when the CPU has
 * ISA_AVX512, else a portable 64-bit loop.
 *
 * Not here: write or copy bandwidth, latency, NUMA placement (one node assumed).
 */
#ifndef WELD_KERNELS_CPU_BANDWIDTH_H
#define WELD_KERNELS_CPU_BANDWIDTH_H

#include "weld.h"

#include <stddef.h>
#include <stdint.h>

#define BW_STREAMS 4

struct bw_result {
    double gb_s_best;   /* 1e9 bytes per second, best pass */
    double gb_s_median;
    size_t bytes;       /* bytes read per pass */
    int threads, passes;
    const char *isa;    /* read loop used: "avx512" or "scalar" */
    uint64_t checksum;  /* XOR of everything read in the last pass (keeps loads live) */
};

/* Read `bytes` (>= 1 MiB) with n_threads (1..256) threads, `passes` (1..1000) times.
   WELD_ERR_INVALID_ARG for out-of-range arguments, WELD_ERR_NOMEM / WELD_ERR_INTERNAL if
   the buffer or the threads cannot be had. */
int bw_probe(size_t bytes, int n_threads, int passes, struct bw_result *out,
             struct weld_err *e);

/* The read loops: XOR-fold of n bytes at p (p 64-byte aligned, n a multiple of
   BW_STREAMS * 128), read as BW_STREAMS interleaved streams. */
uint64_t bw_read_scalar(const void *p, size_t n);
uint64_t bw_read_avx512(const void *p, size_t n);

#endif

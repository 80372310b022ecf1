/*
 * bandwidth - the read-bandwidth probe: how many bytes per second the memory system
 * delivers to n threads streaming through a buffer far larger than the caches. Decode
 * reads every weight once per token, so this is the roofline `weld bench` reports decode
 * speed against.
 *
 * Method: one buffer of `bytes` (rounded down to 4 KiB per thread) in anonymous memory
 * with huge pages requested, as the weight pool is (wmap_huge), filled once so every page
 * is backed; each thread (pinned to CPU i when it can be) owns a contiguous slice. Every
 * read loop of the CPU (bw_loops) makes `passes` passes; a pass starts when all threads
 * leave a barrier and ends when the last one arrives at the next. The result is the best
 * pass of any loop (the machine is shared and noisy: the best is the repeatable figure),
 * the loop that made it, and that loop's median. The AVX-512 loops (bandwidth_avx512.c)
 * read the slice as BW_STREAMS interleaved streams or as one, with and without software
 * prefetches into L1 and L2, one of them paced: which wins depends on the core (one Intel
 * SPR-class core: 4 streams 16.2 GB/s, one stream prefetched 2 KiB into L1 and 4 KiB into
 * L2 18.6; two cores 32.0 and 35.7-37.9). The kernels' one-token products read one such
 * stream, so a probe without those loops understated the roof by 10-15% there. Without
 * AVX-512, a portable 64-bit loop.
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
    double gb_s_best;   /* 1e9 bytes per second, best pass of any loop */
    double gb_s_median; /* median pass of the loop that made the best */
    size_t bytes;       /* bytes read per pass */
    int threads, passes; /* passes per loop */
    int loops;          /* read loops tried */
    const char *isa;    /* read loops used: "avx512" or "scalar" */
    const char *loop;   /* the best one, e.g. "avx512, 1 stream, prefetch 1 KiB" */
    uint64_t checksum;  /* XOR of everything read in the last pass (keeps loads live) */
};

/* Read `bytes` (>= 1 MiB) with n_threads (1..256) threads, `passes` (1..1000) times.
   WELD_ERR_INVALID_ARG for out-of-range arguments, WELD_ERR_NOMEM / WELD_ERR_INTERNAL if
   the buffer or the threads cannot be had. */
int bw_probe(size_t bytes, int n_threads, int passes, struct bw_result *out,
             struct weld_err *e);

/* The same in steps, for pairing probe passes with other work: a session holds the
   buffer (bytes, n_threads as bw_probe; memory stays mapped until close); a probe is
   bw_probe's passes over every loop; a pass is one timed pass of the loop named `loop`
   (a bw_result.loop), its rate in *gb_s. */
/* The last-level cache of CPU 0 in bytes (sysfs cache/index*, else sysconf), 0 if
   unknown. Weights no larger than it may be read from cache rather than memory, which
   makes a decode-to-probe share meaningless (it can pass 100%). */
size_t bw_llc_bytes(void);

struct bw_session;
int bw_session_open(struct bw_session **out, size_t bytes, int n_threads, struct weld_err *e);
int bw_session_probe(struct bw_session *s, int passes, struct bw_result *out,
                     struct weld_err *e);
int bw_session_pass(struct bw_session *s, const char *loop, double *gb_s, struct weld_err *e);
void bw_session_close(struct bw_session *s);
/* The read loops: XOR-fold of n bytes at p (p 64-byte aligned, n a multiple of
   BW_STREAMS * 256). The scalar one reads BW_STREAMS interleaved streams; the AVX-512 one
   `streams` (1..BW_STREAMS, n a multiple of streams * 256) of them, prefetching pf bytes
   ahead into L1 and pf2 into L2 in each (0: none), with `pace` (0, or a divisor of 64)
   dependent operations per line. */
uint64_t bw_read_scalar(const void *p, size_t n);
uint64_t bw_read_avx512(const void *p, size_t n, int streams, size_t pf, size_t pf2, int pace);

#endif

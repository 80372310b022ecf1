/*
 * probe_team - the thread harness of the machine probes (bandwidth.h, peak.h): n threads,
 * thread 0 the caller, each pinned to CPU i when it can be, run a body pass by pass; a pass
 * starts when all leave a barrier and ends when the last arrives at the next, and thread 0
 * times it. Threads are started and joined per call (a probe is a one-off measurement, not
 * a hot path); the caller's own affinity is restored afterwards.
 */
#ifndef WELD_KERNELS_CPU_PROBE_TEAM_H
#define WELD_KERNELS_CPU_PROBE_TEAM_H

#include "weld.h"

/* body(ctx, id, pass) on threads id = 0 .. n_threads - 1 (1..256) for passes 0 .. passes -
   1; seconds[pass] gets each pass's wall time. WELD_ERR_INTERNAL (naming `what`) when the
   threads or the barrier cannot be had; nothing runs then. */
int probe_team_run(int n_threads, int passes, void (*body)(void *ctx, int id, int pass), void *ctx,
                   double *seconds, const char *what, struct weld_err *e);

#endif

/*
 * comm - the communicator of an engine that spans processes: MPI underneath.
 *
 * A weld engine of N ranks (`mpirun -np N weld ... --tensor-parallel-size N`) is one
 * scheduler and KV block manager in rank 0 and N shards of the model, one per rank
 * (exec/backend_tp.c). This module is the only one that speaks MPI; the rest of weld sees
 * groups of ranks (struct comm) and a handful of collective operations on byte buffers,
 * each with the exact semantics the forward pass needs:
 *   - comm_bcast: rank 0 hands every rank the step it is about to run;
 *   - comm_allgather: every rank's block of partial sums to every rank, blocks in rank
 *     order, so each rank adds them in the same order (the determinism contract: tensor
 *     parallel N computes the logits of one process with N K parts, exec/program.h);
 *   - comm_send / comm_recv: a rank's slice of the logits rows to rank 0.
 * No reduction is ever left to MPI, whose algorithms may add in any order.
 *
 * Faults: every blocking call is a non-blocking MPI call polled against a deadline
 * (comm_create's timeout), so a rank that died or hangs turns into WELD_ERR_IO naming
 * the operation and the wait, never a process stuck forever; after one failure the
 * communicator is broken and every later call fails at once (a collective cannot be
 * resumed half-way). A wait with no deadline (a worker rank idle between steps) backs off
 * to sleeping 100 us between polls, so an idle server burns no core.
 *
 * Initialisation: MPI starts only in a process launched by mpirun (comm_launched: Open
 * MPI's or PMIx's environment) or asked to (comm_init), with MPI_THREAD_MULTIPLE (the
 * megakernel's workers may run a communication instruction on any thread, one at a time
 * per communicator). A plain `weld` never touches MPI.
 *
 * Counters (comm_stats): bytes sent and received and the time spent in calls, per
 * communicator, for `weld bench`'s report of bytes per token and communication waits.
 * Threading: one call at a time per communicator.
 */
#ifndef WELD_COMM_COMM_H
#define WELD_COMM_COMM_H

#include "core/err.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* True if this process was started by an MPI launcher (mpirun / mpiexec / srun with PMIx). */
bool comm_launched(void);
/* Start MPI once (later calls return its first result). */
int comm_init(struct weld_err *e);
bool comm_initialized(void);
/* This process's rank and the number of ranks: 0 and 1 before comm_init. */
int comm_world_rank(void);
int comm_world_size(void);
/* The node name MPI reports for this process ("" before comm_init). */
const char *comm_node_name(void);
/* Shut MPI down (no-op if it never started). */
void comm_finalize(void);
/* End every rank of the job now with status code (MPI_Abort; exit(code) without MPI). */
_Noreturn void comm_abort(int code);

struct comm;
struct comm_stats {
    uint64_t bytes_sent, bytes_recv; /* payload bytes this rank sent and received */
    uint64_t calls;                  /* operations completed */
    double wait_s;                   /* seconds spent inside the operations */
};

/* A communicator of the world's ranks with the same color, ranked by key (MPI_Comm_split).
   timeout_s > 0: the deadline of every operation (comm_op_timeout for the others). */
int comm_create(struct comm **out, int color, int key, double timeout_s, struct weld_err *e);
void comm_free(struct comm *c);
int comm_rank(const struct comm *c);
int comm_size(const struct comm *c);
bool comm_broken(const struct comm *c);

/* Every rank gets root's n bytes of buf. wait_forever: no deadline (an idle worker). */
int comm_bcast(struct comm *c, void *buf, size_t n, int root, bool wait_forever,
               struct weld_err *e);
/* In place: buf holds size blocks of n bytes, block r is rank r's; on return every rank
   has every block. */
int comm_allgather(struct comm *c, void *buf, size_t n, struct weld_err *e);
int comm_send(struct comm *c, const void *buf, size_t n, int peer, int tag, struct weld_err *e);
/* Every rank's `counts[rank]` bytes (send; NULL: already at recv + displs[rank]) into recv
   at displs[rank], on every rank, in rank order (MPI_Allgatherv); counts and displs the
   same on every rank. */
int comm_allgatherv(struct comm *c, const void *send, void *recv, const size_t *counts,
                    const size_t *displs, struct weld_err *e);
/* Rank r's sdispls[q] .. + scounts[q] bytes of send to rank q, which puts them at
   rdispls[r] of its recv (MPI_Alltoallv); every rank's rcounts must match. */
int comm_alltoallv(struct comm *c, const void *send, const size_t *scounts, const size_t *sdispls,
                   void *recv, const size_t *rcounts, const size_t *rdispls, struct weld_err *e);
int comm_recv(struct comm *c, void *buf, size_t n, int peer, int tag, struct weld_err *e);
/* A send that returns at once: buf must stay untouched until comm_wait(*req) (which frees
   the request; the deadline counts from there). A pipeline's last stage sends each
   micro-batch's result this way, so it can take the next one before rank 0 receives. */
struct comm_req;
int comm_isend(struct comm *c, const void *buf, size_t n, int peer, int tag, struct comm_req **req,
               struct weld_err *e);
int comm_wait(struct comm *c, struct comm_req *req, struct weld_err *e);
/* In place, started and returned at once: rank r's n bytes at buf + r * stride + off go to
   every rank (an allgather of one slice of each rank's block, MPI_Iallgatherv); complete
   it with comm_wait. */
int comm_iallgather_rows(struct comm *c, void *buf, size_t stride, size_t off, size_t n,
                         struct comm_req **req, struct weld_err *e);
/* Let MPI move req's bytes now (a test, never a wait): computation between a start and
   its wait calls this so the exchange progresses under it. */
void comm_test(struct comm *c, struct comm_req *req);
/* Wait until every rank reached this point. */
int comm_barrier(struct comm *c, struct weld_err *e);

void comm_stats_get(struct comm *c, struct comm_stats *out, bool reset);

#endif

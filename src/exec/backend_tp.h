/*
 * backend_tp - one engine's forward pass over N processes (MPI ranks): tensor, pipeline
 * and expert parallelism.
 *
 * Rank 0 runs everything a single process runs (server, engine, scheduler, KV block
 * manager, sampler); the other ranks only run forward steps. Ranks = TP x PP: a pipeline
 * stage's layers (`--pipeline-parallel-size`) over TP ranks, each holding a shard of the
 * stage's weights (exec_weights_create_shard: its part of the query and KV heads, of the
 * ffn rows, of the LM head's vocabulary; with `--enable-expert-parallel` whole routed
 * experts) and the KV cache of its heads and layers, and running its part of each step's
 * program (program_build_tp), Megatron's layout: column-parallel Q/K/V and gate/up,
 * row-parallel O and down whose partial sums the stage's ranks exchange and add in rank
 * order. So the logits are exactly those of one process with K parts = TP (`--k-parts`),
 * the oracle every test compares with.
 *
 * Protocol (the group's world communicator): rank 0's backend (`backend_tp`, which the
 * runner picks when the tuning names a group and the model is the group's) broadcasts
 * each call that changes state: CREATE (the backend parameters, so every rank sizes the
 * same KV block pool), FORWARD (the batch: tokens, positions, block tables, copies, the
 * rows wanting softmax statistics), DROP, RESET, FREE, and at the end STOP. Each rank
 * runs the call on its own cpu context, the step cut into micro-batches when there are
 * stages (the same cut everywhere); after each micro-batch every rank of the last stage
 * sends rank 0 its status and its columns [vocab0, vocab1) of the logits rows, its merged
 * top candidates and the softmax statistics of its chunks (and hidden states when asked),
 * which rank 0 merges (exact: tops and statistics are per id range); the other ranks send
 * one status. A failure on any rank is rank 0's error, naming the rank.
 *
 * Faults: every exchange but a worker's wait for the next call has comm's deadline; a
 * rank that dies or hangs makes rank 0's step fail with WELD_ERR_IO after it, and the
 * group is then broken: every later call fails at once (tp_group_broken), so the engine
 * fails its requests and the command exits non-zero (comm_abort ends the other ranks).
 *
 * Contexts of other models (a draft model) run on rank 0 alone, as plain cpu contexts.
 * Threading: rank 0 calls from one thread at a time, like any backend context.
 */
#ifndef WELD_EXEC_BACKEND_TP_H
#define WELD_EXEC_BACKEND_TP_H

#include "comm/comm.h"
#include "exec/backend.h"
#include "exec/program.h"

struct tp_group;

/* The group of every rank of the job (comm_world_size() must be tp_size x pp_size):
   world rank = stage x tp_size + tp rank, so a stage's TP ranks are adjacent (one
   machine, shared memory) and only one residual row per token crosses between stages.
   Its model is the first one rank 0 makes a context of; the other ranks load the same
   path (the model file must be at that path on every machine). ep: expert parallelism, a
   mixture of experts' routed experts placed whole over the TP ranks (exec_part.ep).
   timeout_s: comm's deadline (0: its default). */
int tp_group_create(struct tp_group **out, int tp_size, int pp_size, bool ep, double timeout_s,
                    struct weld_err *e);
/* What of model config c this rank runs: its K part, its stage's layers (an even split),
   its LM head rows (last stage). */
struct exec_part tp_group_part(const struct tp_group *g, const struct model_config *c);
int tp_group_tp_size(const struct tp_group *g);
/* The share of model config c's KV cache (and, near enough, of its layers' weights) that
   one rank holds: its KV heads' of every head times its stage's layers' of every layer. */
double tp_group_share(const struct tp_group *g, const struct model_config *c);
int tp_group_pp_size(const struct tp_group *g);
/* The ranks of this rank's stage (the ALLGATHERs); tp_group_comm: every rank. */
struct comm *tp_group_tp_comm(const struct tp_group *g);
/* Rank 0: tells the other ranks to stop (tp_worker_run returns). Then frees. */
void tp_group_free(struct tp_group *g);
int tp_group_rank(const struct tp_group *g);
int tp_group_size(const struct tp_group *g);
struct comm *tp_group_comm(const struct tp_group *g);
/* The group's model (NULL before rank 0's first context). */
const struct model *tp_group_model(const struct tp_group *g);
bool tp_group_broken(const struct tp_group *g);
/* Ranks other than 0: serve rank 0's calls until it sends STOP (WELD_OK) or the group
   breaks (the error). */
int tp_worker_run(struct tp_group *g, struct weld_err *e);

/* Communication counters of the group's communicator on this rank, reset if asked. */
void tp_group_stats(struct tp_group *g, struct comm_stats *out, bool reset);

extern const struct backend_iface backend_tp;
/* The group of a backend_tp context, and rank 0's own cpu context in it. */
struct tp_group *backend_tp_group(void *ctx);
void *backend_tp_local(void *ctx);

#endif

/*
 * runner - the small API the CLI and engine call to run forward steps on a model.
 *
 *     struct runner *r;
 *     runner_create(&r, model, max_seqs, max_ctx, &err);        // cpu, automatic tuning
 *     struct batch_seq s = {.seq_id = 0, .tokens = ids, .n_tokens = n, .pos = 0};
 *     struct batch b = {&s, 1};
 *     runner_forward(r, &b, logits, &err);    // logits: (batch_n_logit_rows(&b), n_vocab)
 *     ... next step: pos = n, one token ...
 *     runner_drop_seq(r, 0);
 *     runner_free(r);
 *
 * A runner holds the backend context (KV cache, cached programs) for one model; the model
 * must outlive it. Positions at or beyond max_ctx give WELD_ERR_LIMIT. Not thread-safe:
 * one step at a time.
 */
#ifndef WELD_EXEC_RUNNER_H
#define WELD_EXEC_RUNNER_H

#include "exec/backend.h"
#include "exec/batch.h"
#include "exec/exec.h"

struct runner;

/* max_ctx <= 0: the model's trained context length. Default backend parameters
   (backend_params_init: f16 KV cache, internal KV placement). */
int runner_create(struct runner **out, const struct model *m, int max_seqs, int max_ctx,
                  struct weld_err *e);
/* Same with every backend parameter (n_splits, KV block size, count and type, tuning:
   backend, executor, kernel settings); params as given (a zero kv_type is f32: start
   from backend_params_init for the defaults). */
int runner_create_ex(struct runner **out, const struct model *m,
                     const struct backend_params *params, struct weld_err *e);
int runner_forward(struct runner *r, const struct batch *b, float *logits,
                   struct weld_err *e);
/* The same, and each logit row's largest logits into tops (batch_n_logit_rows entries;
   NULL: none), made by the LM head instructions as they write the row (logits_top.h),
   with the softmax statistics of every row whose inv_t is > 0 (the caller sets inv_t and
   the two arrays on every entry: inv_t 0 where none are wanted). */
int runner_forward_top(struct runner *r, const struct batch *b, float *logits,
                       struct logits_top *tops, struct weld_err *e);
/* The same, and (hidden not NULL) each logit row's final hidden state, after the final
   norm (the LM head's input), into hidden: (batch_n_hidden_rows, dim) floats, the logit
   rows' first, then those of the other tokens of all_hidden sequences. Identical on
   every executor (embeddings pool these rows). */
int runner_forward_hidden(struct runner *r, const struct batch *b, float *logits,
                          struct logits_top *tops, float *hidden, struct weld_err *e);
void runner_drop_seq(struct runner *r, int seq_id);
/* The backend's threads sleep now instead of spinning for the next step (no-op where the
   backend has none). */
/* A multi-process backend's communication counters on this rank (comm.h), reset if
   asked: false (nothing written) for a backend of one process. */
struct comm_stats;
bool runner_comm_stats(const struct runner *r, struct comm_stats *out, bool reset);
/* True once the backend is lost for good (backend_iface.broken): fail the work, stop. */
bool runner_broken(const struct runner *r);
void runner_park(struct runner *r);
/* KV blocks in and out of the pool (backend_iface.block_*): 0 bytes when the backend
   cannot move blocks (then save and load must not be called). */
size_t runner_block_bytes(const struct runner *r);
void runner_block_save(struct runner *r, const int32_t *blocks, int n, void *dst);
void runner_block_load(struct runner *r, const int32_t *blocks, int n, const void *src);
void runner_free(struct runner *r);

int runner_n_vocab(const struct runner *r);
int runner_max_ctx(const struct runner *r);
/* Positions cached for seq_id (what the next step's pos should be). */
int runner_seq_len(const struct runner *r, int seq_id);
/* "cpu: ref executor, ..." */
const char *runner_describe(const struct runner *r);
/* The executor's stats since creation or the last reset (exec.h: bubble, syncs); with
   reset, counting starts again. WELD_ERR_UNSUPPORTED when the backend or executor keeps
   none (out zeroed). */
int runner_exec_stats(struct runner *r, struct exec_stats *out, bool reset,
                      struct weld_err *e);

#endif

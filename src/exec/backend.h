/*
 * backend - the interface between the engine and a device that runs forward steps.
 *
 * Modelled on ggml's backend interface (ggml-backend-impl.h): a struct of function
 * pointers with a context per (backend, model). Required members must be set; optional
 * ones may be NULL and callers check. The engine sees only batches in and logits out:
 * KV cache layout, programs and executors are the backend's business.
 *
 * Selection: backend_params.tuning.accelerator names the backend ("cpu" when NULL or
 * empty; `--accelerator` in the CLI). Names of backends weld knows but this build lacks
 * (e.g. "cuda" without nvcc) and unknown names both give WELD_ERR_NOT_FOUND: "unknown
 * accelerator 'cuda' (available: cpu)".
 *
 * KV placement: with engine block tables in the batch (batch.h) the engine's KV block
 * manager owns the pool of kv_blocks physical blocks and the backend only reads and writes
 * the slots the tables name (and does the batch's block copies first); without tables the
 * backend places each seq_id itself. The engine sizes the pool from a memory budget with
 * backend_kv_blocks_for_bytes().
 *
 * The cpu backend = program builder + executor (tuning.executor; default the megakernel
 * executor on a thread team when n_threads > 1, else the reference executor) + kernels +
 * paged KV cache (f16 / bf16 / f32 / q8_0), all tuned by backend_params.tuning
 * (exec/tuning.h).
 */
#ifndef WELD_EXEC_BACKEND_H
#define WELD_EXEC_BACKEND_H

#include "core/err.h"
#include "exec/batch.h"
#include "exec/logits_top.h"
#include "exec/tuning.h"
#include "model/model.h"

#include <stdbool.h>
#include <stddef.h>

struct backend_params {
    int max_seqs;       /* seq ids are [0, max_seqs) */
    int max_ctx;        /* positions per sequence */
    int n_splits;       /* row slices per matrix op; 0: what the executor wants (ref 1,
                           ops / mega a few per worker) */
    int n_threads;      /* executor workers; 0: backend_cpu_default_threads (one per
                           physical core, or one for models of tiny steps). With more than
                           one and no executor named, the mega executor runs */
    bool oversubscribe; /* tests only: allow more threads than physical cores */
    int kv_block_size;  /* 0: default (16) */
    int kv_blocks;      /* physical KV blocks in the pool (ids [0, kv_blocks) in engine
                           tables); 0: enough for max_seqs sequences of max_ctx */
    size_t kv_prefault_bytes; /* pool pages touched at creation (kv_config.prefault_bytes);
                                0: the default 256 MiB; SIZE_MAX: all of it */
    enum weld_dtype kv_type; /* KV element type: DT_F16 (the default backend_params_init
                                and runner_create pick), DT_BF16, DT_F32 or DT_Q8_0 (needs
                                head_dim % 32 == 0). Zero-initialised params mean DT_F32. */
    struct exec_tuning tuning; /* backend, executor and kernel settings; zero: automatic */
};

/* Defaults: kv_type f16, everything else 0 (one thread per physical core, n_splits as the
   executor wants, block size 16, pool sized for max_seqs full sequences, every tuning
   choice automatic). */
void backend_params_init(struct backend_params *p, int max_seqs, int max_ctx);

/* The cpu backend's workers when n_threads is 0: one per physical core (core/team.h), or,
   unless t (may be NULL) names an executor, one for a model whose decode step streams
   under EXEC_SMALL_STAGE_BYTES of weights per stage (exec/weights.h: a second worker would
   cost more than it saves). */
int backend_cpu_default_threads(const struct model *m, const struct exec_tuning *t);

/* Bytes one KV block of block_size tokens (0: default) takes for model config c and
   kv_type, K and V of every layer; 0 when the type cannot hold this model's heads. */
size_t backend_kv_block_bytes(const struct model_config *c, enum weld_dtype kv_type,
                              int block_size);
/* The number of blocks that fit in `bytes` (--kv-cache-memory), at most INT_MAX; 0 when
   not even one fits or the type is unusable (check with backend_kv_block_bytes). */
int backend_kv_blocks_for_bytes(const struct model_config *c, enum weld_dtype kv_type,
                                int block_size, size_t bytes);

struct backend_iface {
    const char *name;
    /* required: per-model context (weights stay the model's; the model must outlive it) */
    int (*ctx_create)(void **ctx, const struct model *m, const struct backend_params *p,
                      struct weld_err *e);
    void (*ctx_free)(void *ctx);
    /* required: validate and run one step; logits is (batch_n_logit_rows, n_vocab);
       tops, if not NULL, (batch_n_logit_rows) gets each logit row's LOGITS_TOP_K largest
       logits (the sampler's first pass, made while the LM head wrote the row:
       exec/logits_top.h), and the softmax statistics of the rows whose inv_t the caller
       set > 0 (set it to 0 on every other row). On a validation failure nothing changes; with internal
       placement the batch's sequences are left as they were before any failure. With
       engine tables the backend keeps no per-sequence state. hidden, if not NULL,
       (batch_n_hidden_rows, dim) gets each logit row's final hidden state, then each other
       token's of the all_hidden sequences (after the final
       norm: the LM head's input), the same on every executor: a failed run may have done
       the copies and written slots at positions >= pos, never below. */
    int (*forward)(void *ctx, const struct batch *b, float *logits, struct logits_top *tops,
                   float *hidden, struct weld_err *e);
    /* required: forget a sequence's cached positions (internal placement; no-op for
       engine tables, whose blocks the engine frees) */
    void (*drop_seq)(void *ctx, int seq_id);
    /* optional: positions cached for seq_id */
    int (*seq_len)(void *ctx, int seq_id);
    /* optional: drop every sequence and leave engine-table mode */
    void (*reset)(void *ctx);
    /* optional: device memory for host-visible buffers (NULL: use the heap) */
    void *(*buffer_alloc)(void *ctx, size_t nbytes);
    void (*buffer_free)(void *ctx, void *buf);
    /* optional: the executor's threads sleep now instead of spinning for the next step
       (the caller will idle, or run another context on the same cores) */
    void (*park)(void *ctx);
    /* optional: a one-line description of the context ("cpu: mega executor, 2 threads, ...") */
    const char *(*describe)(void *ctx);
    /* optional: true once the device is lost for good (a rank of a multi-process backend
       died or hung): every later step fails, so callers fail their work and stop */
    bool (*broken)(void *ctx);
    /* optional, all three or none (engine tables only): the bytes of one KV block in the
       layout-independent order of kv_block_save, and copying n blocks' contents out of the
       pool into dst (n * block_bytes) or into it from src; ids already valid. The KV tier
       (kvtier/) moves blocks through these between steps. */
    size_t (*block_bytes)(void *ctx);
    void (*block_save)(void *ctx, const int32_t *blocks, int n, void *dst);
    void (*block_load)(void *ctx, const int32_t *blocks, int n, const void *src);
};

extern const struct backend_iface backend_cpu;

/* Look up a backend by name (NULL or "": "cpu"); WELD_ERR_NOT_FOUND with the list of
   built-in ones. */
int backend_find(const struct backend_iface **out, const char *name, struct weld_err *e);

#endif

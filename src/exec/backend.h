/*
 * backend - the interface between the engine and a device that runs forward steps.
 *
 * Modelled on ggml's backend interface (ggml-backend-impl.h): a struct of function
 * pointers with a context per (backend, model). Required members must be set; optional
 * ones may be NULL and callers check. The engine sees only batches in and logits out:
 * KV cache layout, programs and executors are the backend's business.
 *
 * Selection: WELD_ACCELERATOR names the backend ("cpu" when unset or empty). Names of
 * backends weld knows but this build lacks (e.g. "cuda" without nvcc) and unknown names
 * both give WELD_ERR_NOT_FOUND: "WELD_ACCELERATOR=cuda: backend not built in; available:
 * cpu".
 *
 * The cpu backend = program builder + executor (WELD_EXEC, default the reference
 * executor) + scalar kernels + paged f32 KV cache.
 */
#ifndef WELD_EXEC_BACKEND_H
#define WELD_EXEC_BACKEND_H

#include "core/err.h"
#include "exec/batch.h"
#include "model/model.h"

#include <stddef.h>

struct backend_params {
    int max_seqs;       /* seq ids are [0, max_seqs) */
    int max_ctx;        /* positions per sequence */
    int n_splits;       /* row slices per matrix op (executors with workers); 0: 1 */
    int kv_block_size;  /* 0: default (16) */
    int kv_blocks;      /* 0: enough for max_seqs sequences of max_ctx */
};

struct backend_iface {
    const char *name;
    /* required: per-model context (weights stay the model's; the model must outlive it) */
    int (*ctx_create)(void **ctx, const struct model *m, const struct backend_params *p,
                      struct weld_err *e);
    void (*ctx_free)(void *ctx);
    /* required: validate and run one step; logits is (batch_n_logit_rows, n_vocab). On
       failure the batch's sequences are left as they were before the call. */
    int (*forward)(void *ctx, const struct batch *b, float *logits, struct weld_err *e);
    /* required: forget a sequence's cached positions */
    void (*drop_seq)(void *ctx, int seq_id);
    /* optional: positions cached for seq_id */
    int (*seq_len)(void *ctx, int seq_id);
    /* optional: drop every sequence */
    void (*reset)(void *ctx);
    /* optional: device memory for host-visible buffers (NULL: use the heap) */
    void *(*buffer_alloc)(void *ctx, size_t nbytes);
    void (*buffer_free)(void *ctx, void *buf);
    /* optional: a one-line description of the context ("cpu: ref executor, 5 layers...") */
    const char *(*describe)(void *ctx);
};

extern const struct backend_iface backend_cpu;

/* Look up a backend by name; WELD_ERR_NOT_FOUND with the list of built-in ones. */
int backend_find(const struct backend_iface **out, const char *name, struct weld_err *e);
/* The backend WELD_ACCELERATOR names ("cpu" when unset or empty). */
int backend_from_env(const struct backend_iface **out, struct weld_err *e);

#endif

/*
 * weights (exec) - what an executor needs from a model beyond its mmapped matrices.
 *
 * exec_weights_create() checks, once, everything the kernels will trust: the config
 * numbers the forward pass relies on (head counts divide, rope_dim even and <= head_dim,
 * ...) and every tensor the config needs (present, the exact 2-d shape, a type the kernels
 * can read, enough bytes), with errors that name the model and the tensor. A hand-built or
 * foreign struct model cannot crash the executor once this passed.
 *
 * It also widens the small per-layer vectors (norm weights, biases, qk-norm weights) to
 * f32 once, so kernels never convert them per token; matrices stay where they are (mmapped
 * or caller-owned) in their own type.
 */
#ifndef WELD_EXEC_WEIGHTS_H
#define WELD_EXEC_WEIGHTS_H

#include "core/err.h"
#include "model/model.h"

struct exec_layer_vecs {
    float *attn_norm, *ffn_norm; /* (dim) */
    float *bq;                   /* (n_head*head_dim) or NULL */
    float *bk, *bv;              /* (n_kv_head*head_dim) or NULL */
    float *q_norm, *k_norm;      /* (head_dim) or NULL */
};

struct exec_weights {
    const struct model *m;
    float *output_norm;              /* (dim) */
    struct exec_layer_vecs *layers;  /* (n_layer) */
    float rope_pos_scale;            /* 1 / linear rope factor, else 1 */
    float *mem;                      /* backing of every vector above */
};

int exec_weights_create(struct exec_weights **out, const struct model *m, struct weld_err *e);
void exec_weights_free(struct exec_weights *w);

#endif

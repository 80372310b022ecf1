/*
 * model - a loaded Llama-family model: its config and views of its weight tensors.
 *
 * model_load() takes a GGUF file or a Hugging Face directory (config.json + *.safetensors
 * [+ index]), or a Hugging Face repo id already in the local hub cache (model/resolve.h).
 * Weights are never copied: each struct tensor points into the mmapped file,
 * in the file's own type (F32/F16/BF16/quantized for GGUF; F32/F16/BF16 for HF). Shapes
 * use GGUF's order whatever the source (ne[0] is the contiguous dimension), so a Linear
 * weight is ne = {in_features, out_features} and row r (one output) is contiguous.
 *
 * The loader checks every tensor the config needs: present, the expected shape, a type the
 * kernels can read; errors name the file and the tensor. HF llama checkpoints keep their
 * rotate-half rope (cfg.rope_neox = true); GGUF llama ones use adjacent pairs.
 * Tokenizers are loaded separately (tokenizer/), from model->gguf or model->dir.
 */
#ifndef WELD_MODEL_MODEL_H
#define WELD_MODEL_MODEL_H

#include "core/err.h"
#include "format/dtype.h"
#include "format/gguf.h"
#include "format/safetensors.h"
#include "model/config.h"

#include <stddef.h>
#include <stdint.h>

struct tensor {
    const char *name;      /* GGUF-style name, e.g. "blk.0.attn_q.weight" */
    enum weld_dtype type;
    int n_dims;
    int64_t ne[4];         /* ne[0] contiguous; unused dims are 1 */
    const void *data;      /* NULL: tensor absent (optional tensors only) */
    size_t nbytes;
};

struct layer_weights {
    struct tensor attn_norm;      /* (dim) */
    struct tensor wq;             /* {dim, n_head*head_dim} */
    struct tensor wk, wv;         /* {dim, n_kv_head*head_dim} */
    struct tensor bq, bk, bv;     /* qwen2: (n_head*head_dim) / (n_kv_head*head_dim) */
    struct tensor q_norm, k_norm; /* qwen3: (head_dim) */
    struct tensor wo;             /* {n_head*head_dim, dim} */
    struct tensor ffn_norm;       /* (dim) */
    struct tensor w_gate, w_up;   /* {dim, ffn_dim} */
    struct tensor w_down;         /* {ffn_dim, dim} */
};

enum model_source { MODEL_SRC_GGUF = 0, MODEL_SRC_HF };

struct model {
    struct model_config cfg;
    char *path;                   /* as given */
    char *dir;                    /* HF: the directory; GGUF: directory holding the file */
    enum model_source source;
    struct gguf_file *gguf;       /* MODEL_SRC_GGUF */
    struct st_set *st;            /* MODEL_SRC_HF */
    struct tensor tok_embd;       /* {dim, n_vocab} */
    struct tensor output_norm;    /* (dim) */
    struct tensor output;         /* {dim, n_vocab}; a copy of tok_embd's view when tied */
    float *rope_freq_factors;     /* (rope_dim/2) divisors, or NULL (no llama3 scaling) */
    struct layer_weights *layers; /* (n_layer) */
};

/* Load a GGUF file or an HF directory; shows a progress bar if it takes over a second. */
int model_load(struct model **out, const char *path, struct weld_err *e);
void model_free(struct model *m);
/* Bytes of all weight tensors (what decoding one token reads). */
size_t model_weight_bytes(const struct model *m);
/* Drop the mmapped pages of [p, p + n) (a tensor's bytes) from the resident set: for a
   tensor the executor copied (repacked) and will not read in place. They come back from
   the file if read. No-op (0) for models in caller memory. */
int model_release_pages(const struct model *m, const void *p, size_t n);

#endif

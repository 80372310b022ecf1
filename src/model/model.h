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
 * Mixture-of-experts layers expose each expert as its own 2-D view (a slice of GGUF's
 * stacked 3-D tensor, or HF's per-expert tensor), so callers never see the stacking.
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
    /* MoE layers (model_layer_moe): w_gate / w_up / w_down are absent (data NULL) */
    struct tensor router;         /* ffn_gate_inp {dim, n_expert} */
    struct tensor exp_bias;       /* exp_probs_b.bias (n_expert) when cfg.expert_bias */
    struct tensor *exp_gate;      /* (n_expert) views {dim, moe_ffn_dim}: GGUF slices of */
    struct tensor *exp_up;        /*   ffn_{gate,up,down}_exps, HF tensors of each expert */
    struct tensor *exp_down;      /* (n_expert) {moe_ffn_dim, dim} */
    struct tensor sh_gate, sh_up; /* ffn_{gate,up}_shexp {dim, shared_ffn_dim} or absent */
    struct tensor sh_down;        /* ffn_down_shexp {shared_ffn_dim, dim} or absent */
    struct tensor sh_gate_inp;    /* ffn_gate_inp_shexp (dim) when cfg.shared_gate */
    /* MLA (cfg.kv_lora_rank > 0): wq is attn_q, or absent when q_lora_rank > 0; wk, wv
       are absent */
    struct tensor wq_a;      /* attn_q_a {dim, q_lora_rank} */
    struct tensor q_a_norm;  /* attn_q_a_norm (q_lora_rank) */
    struct tensor wq_b;      /* attn_q_b {q_lora_rank, n_head * head_dim} */
    struct tensor wkv_a;     /* attn_kv_a_mqa {dim, kv_lora_rank + rope_dim} */
    struct tensor kv_a_norm; /* attn_kv_a_norm (kv_lora_rank) */
    struct tensor wkv_b;     /* attn_kv_b {kv_lora_rank, n_head * (qk_nope_dim +
                                     v_head_dim)}: HF files and older GGUFs; absent when
                                     wk_b / wv_b are bound (llama.cpp 81ff7abe's GGUFs) */
    struct tensor wk_b;      /* attn_k_b {qk_nope_dim, kv_lora_rank, n_head} or absent */
    struct tensor wv_b;      /* attn_v_b {kv_lora_rank, v_head_dim, n_head} or absent */
};

/* A multi-token-prediction (nextn) layer's own tensors; its decoder layer is
   layers[n_layer + i]. Loaded and checked, not run. */
struct nextn_weights {
    struct tensor eh_proj;          /* {2 * dim, dim} */
    struct tensor enorm, hnorm;     /* (dim) */
    struct tensor shared_head_norm; /* (dim) */
    struct tensor shared_head_head; /* {dim, n_vocab} or absent (shares output) */
    struct tensor embed_tokens;     /* {dim, n_vocab} or absent (shares tok_embd) */
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
    struct layer_weights *layers; /* (n_layer + cfg.n_nextn): the MTP layers come last */
    struct nextn_weights *nextn;  /* (cfg.n_nextn) or NULL */
};

/* Load a GGUF file or an HF directory; shows a progress bar if it takes over a second. */
int model_load(struct model **out, const char *path, struct weld_err *e);
void model_free(struct model *m);
/* Bytes of the weight tensors the forward pass uses, every expert included (MTP layers
   excluded). */
size_t model_weight_bytes(const struct model *m);
/* Drop the mmapped pages of [p, p + n) (a tensor's bytes) from the resident set: for a
   tensor the executor copied (repacked) and will not read in place. They come back from
   the file if read. No-op (0) for models in caller memory. */
int model_release_pages(const struct model *m, const void *p, size_t n);
/* MTP layer i (< cfg.n_nextn) as a model of its own, for a runner: one decoder layer
   (layers[n_layer + i], MoE as in m), its shared head as the final norm and LM head (m's
   output when it has no head of its own), its embed_tokens or m's. The view points into
   m (m must outlive it) and owns nothing: never model_free it. The input stage (enorm,
   hnorm, eh_proj) is the caller's, through batch_seq.embeds. */
void model_mtp_view(const struct model *m, int i, struct model *view);

#endif

/*
 * config - the hyperparameters of a Llama-family model, read from and written to both
 * GGUF metadata and Hugging Face config.json.
 *
 * One struct describes every supported architecture; flags turn on the differences:
 *   llama  (Llama 2/3, Mistral; HF "LlamaForCausalLM", "MistralForCausalLM")
 *   qwen2  (QKV bias; HF "Qwen2ForCausalLM")
 *   qwen3  (per-head RMSNorm on q and k before rope; HF "Qwen3ForCausalLM")
 *
 * Rope layout depends on where the weights came from, not only on the architecture: HF
 * checkpoints (all archs) and GGUF qwen2/qwen3 rotate pairs (i, i + rope_dim/2) ("neox");
 * GGUF llama rotates adjacent pairs (2i, 2i+1) because llama.cpp's converter permutes the
 * rows of Q and K (see names.h). The loaders set rope_neox accordingly.
 *
 * GGUF keys (with A = general.architecture): A.vocab_size (or the length of
 * tokenizer.ggml.tokens), A.embedding_length, A.block_count, A.attention.head_count,
 * A.attention.head_count_kv, A.attention.key_length, A.feed_forward_length,
 * A.context_length, A.attention.layer_norm_rms_epsilon, A.rope.freq_base,
 * A.rope.dimension_count, A.rope.scaling.type/factor/original_context_length. Llama 3
 * rope scaling is stored by llama.cpp as the tensor rope_freqs.weight (per-frequency
 * divisors), not as keys: the model loader reads that tensor; the writer creates it.
 * model_config_to_gguf also records the Llama 3 parameters as weld.rope.llama3.{factor,
 * low_freq_factor, high_freq_factor, original_context_length} (ignored by llama.cpp), and
 * model_config_from_gguf reports ROPE_SCALING_LLAMA3 only when those keys are present.
 * Tied embeddings in GGUF = no output.weight tensor.
 *
 * Sparse archs (GGUF name / HF class): qwen3moe / Qwen3MoeForCausalLM, qwen2moe /
 * Qwen2MoeForCausalLM, llama with A.expert_count > 0 / MixtralForCausalLM, deepseek2 /
 * DeepseekV2ForCausalLM, DeepseekV3ForCausalLM (Kimi K2). Expert keys: A.expert_count,
 * expert_used_count, expert_feed_forward_length (Mixtral: feed_forward_length),
 * expert_shared_feed_forward_length (qwen2moe), expert_shared_count,
 * leading_dense_block_count, expert_weights_scale/norm, expert_gating_func,
 * expert_group_count/used_count (deepseek2). Routing defaults follow llama.cpp 81ff7abe:
 * qwen3moe and Mixtral softmax + renormalise; qwen2moe softmax, no renormalisation, sigmoid
 * shared gate; deepseek2 as its keys say (no gating key = softmax, as V2), the bias on when
 * blk.L.exp_probs_b.bias exists (HF: topk_method "noaux_tc").
 *
 * deepseek2 GGUF is llama.cpp's MQA view of MLA: head_count_kv 1, key_length = kv_lora_rank
 * + rope_dim, value_length = kv_lora_rank, key/value_length_mla the per-head sizes (older
 * files: key/value_length are the per-head sizes). In this struct n_kv_head = n_head,
 * head_dim = qk_nope_dim + rope_dim. Rope rotates adjacent pairs (rope_neox = false) from
 * both sources: DeepSeek's HF code de-interleaves before rotate-half, and llama.cpp copies
 * the rows unpermuted (names.h). YaRN keys: rope.scaling.{type "yarn", factor,
 * original_context_length, yarn_beta_fast, yarn_beta_slow, yarn_log_multiplier}. MTP
 * (nextn) layers: HF's model.layers.{n_layer..}; a GGUF with A.nextn_predict_layers counts
 * them in block_count; weld, like llama.cpp's converter, writes none to GGUF.
 */
#ifndef WELD_MODEL_CONFIG_H
#define WELD_MODEL_CONFIG_H

#include "core/err.h"
#include "core/json.h"
#include "format/gguf.h"

#include <stdbool.h>

enum model_arch {
    ARCH_LLAMA = 0, /* also Mixtral: llama with n_expert > 0 */
    ARCH_QWEN2,
    ARCH_QWEN3,
    ARCH_QWEN3MOE,  /* qwen3 attention (qk-norm) + MoE FFN; HF "Qwen3MoeForCausalLM" */
    ARCH_QWEN2MOE,  /* qwen2 attention (QKV bias) + MoE FFN + gated shared expert */
    ARCH_DEEPSEEK2, /* MLA attention + MoE with shared experts (DeepSeek-V2/V3, Kimi K2) */
    ARCH_COUNT
};

/* How router logits become expert weights (llama.cpp's expert_gating_func numbers). */
enum moe_gating {
    MOE_GATING_SOFTMAX = 1, /* softmax over all experts, top-k of the probabilities */
    MOE_GATING_SIGMOID = 2, /* sigmoid per expert; top-k of sigmoid + exp_bias (DeepSeek-V3) */
};

enum rope_scaling_type {
    ROPE_SCALING_NONE = 0,
    ROPE_SCALING_LINEAR, /* positions divided by factor */
    ROPE_SCALING_LLAMA3, /* frequency-dependent divisors (Llama 3.1/3.2) */
    ROPE_SCALING_YARN,   /* YaRN (DeepSeek-V2/V3, Kimi K2) */
};

struct model_config {
    enum model_arch arch;
    char name[128];        /* general.name / HF _name_or_path, may be empty */
    int n_vocab;
    int dim;               /* hidden size */
    int n_layer;
    int n_head;
    int n_kv_head;         /* == n_head without GQA */
    int head_dim;          /* usually dim / n_head; Qwen3 sets it explicitly */
    int ffn_dim;           /* intermediate size */
    int max_ctx;           /* trained context length */
    int rope_dim;          /* rotated dimensions per head, usually head_dim */
    float norm_eps;
    float rope_theta;
    bool rope_neox;        /* true: pairs (i, i+rope_dim/2); false: pairs (2i, 2i+1) */
    enum rope_scaling_type rope_scaling;
    float rope_factor;             /* LINEAR and LLAMA3 */
    float rope_low_freq_factor;    /* LLAMA3 */
    float rope_high_freq_factor;   /* LLAMA3 */
    int rope_orig_ctx;             /* LLAMA3: original_max_position_embeddings */
    bool tied_embeddings;  /* output projection reuses token_embd */
    bool qkv_bias;         /* qwen2 */
    bool qk_norm;          /* qwen3 */
    int sliding_window;    /* 0: none (Mistral v0.1 used 4096); recorded, not yet applied */

    /* Mixture of experts (n_expert > 0). Layers [0, n_dense_lead) have a dense FFN of
       ffn_dim; the others route each token to n_expert_used of n_expert experts (each a
       SwiGLU FFN of moe_ffn_dim) plus, when shared_ffn_dim > 0, one always-on shared
       expert FFN of shared_ffn_dim (DeepSeek: n_shared_expert * moe_ffn_dim). Router:
       gating (softmax or sigmoid) of ffn_gate_inp . h; with n_group > 1 only experts of
       the topk_group best groups compete (a group scores the sum of its two best biased
       scores, under either gating, as llama.cpp does); the top n_expert_used are taken,
       their weights renormalised to sum 1 when expert_norm, then scaled by expert_scale. */
    int n_expert;        /* routed experts per MoE layer; 0: a dense model */
    int n_expert_used;   /* experts per token (top-k) */
    int moe_ffn_dim;     /* intermediate size of each routed expert */
    int n_shared_expert; /* shared experts (DeepSeek); 0 or 1 for qwen2moe */
    int shared_ffn_dim;  /* intermediate size of the shared expert FFN; 0: none */
    bool shared_gate;    /* qwen2moe: shared output times sigmoid(ffn_gate_inp_shexp . h) */
    int n_dense_lead;    /* leading layers with a dense FFN (first_k_dense_replace) */
    enum moe_gating gating;
    bool expert_norm;        /* renormalise the chosen weights (norm_topk_prob) */
    float expert_scale;      /* routed_scaling_factor; 1: none */
    int n_group, topk_group; /* group-limited routing; n_group <= 1: none */
    bool expert_bias;        /* exp_probs_b (e_score_correction_bias) biases the choice */

    /* Multi-head latent attention (arch DEEPSEEK2, kv_lora_rank > 0). Queries: plain
       attn_q, or attn_q_a -> attn_q_a_norm -> attn_q_b when q_lora_rank > 0; each head
       has qk_nope_dim + rope_dim dims (head_dim = their sum). attn_kv_a_mqa gives the
       kv_lora_rank latent (normalised by attn_kv_a_norm) and one shared rope key of
       rope_dim; attn_kv_b expands the latent to per-head keys (qk_nope_dim) and values
       (v_head_dim). The cache holds only latent + rope key per position. */
    int q_lora_rank;  /* 0: no query compression */
    int kv_lora_rank; /* 0: not MLA */
    int qk_nope_dim;
    int v_head_dim; /* MLA value head size (== head_dim otherwise; 0 in a hand-made
                              config means head_dim) */
    /* YaRN rope (rope_scaling == ROPE_SCALING_YARN): rope_factor, rope_orig_ctx, and */
    float yarn_beta_fast, yarn_beta_slow; /* 32, 1 */
    float yarn_log_mul; /* llama.cpp rope.scaling.yarn_log_multiplier = 0.1 * mscale_all_dim */
    int n_nextn;        /* multi-token-prediction layers after n_layer (loaded, kept) */
};

/* True if layer l's FFN is a mixture of experts. */
static inline bool model_layer_moe(const struct model_config *c, int l)
{
    return c->n_expert > 0 && l >= c->n_dense_lead;
}

const char *model_arch_name(enum model_arch a);  /* GGUF names: "llama", "qwen3moe", ... */
int model_arch_from_name(const char *name);      /* -1 if unknown */

/* Fill c from GGUF metadata (does not look at tensors except to count the vocabulary). */
int model_config_from_gguf(const struct gguf_file *f, struct model_config *c,
                           struct weld_err *e);
/* Fill c from an HF config.json in dir, or from its text (fuzzing); `where` names it. */
int model_config_from_hf(const char *dir, struct model_config *c, struct weld_err *e);
int model_config_from_hf_json(const char *buf, size_t len, const char *where,
                              struct model_config *c, struct weld_err *e);
/* Check that the numbers make a runnable model (positive, divisible, in sane ranges). */
int model_config_validate(const struct model_config *c, const char *where, struct weld_err *e);

/* Write the architecture keys (general.architecture, A.*) into a GGUF writer. */
int model_config_to_gguf(const struct model_config *c, struct gguf_writer *w,
                         struct weld_err *e);
/* Build an HF config.json object (architectures, model_type, torch_dtype as given). */
json_t *model_config_to_hf_json(const struct model_config *c, const char *torch_dtype);

/* Llama 3 rope: the per-frequency divisors (rope_dim/2 floats) that llama.cpp stores as
   rope_freqs.weight; all 1 when rope_scaling != LLAMA3. */
void model_config_llama3_freq_factors(const struct model_config *c, float *out);

#endif

/*
 * names - tensor names in GGUF and Hugging Face checkpoints, and the Q/K row permutation
 * between them.
 *
 *   GGUF                        HF
 *   token_embd.weight           model.embed_tokens.weight
 *   output_norm.weight          model.norm.weight
 *   output.weight               lm_head.weight          (absent when tied)
 *   rope_freqs.weight           (none: GGUF llama3 rope scaling factors)
 *   blk.N.attn_norm.weight      model.layers.N.input_layernorm.weight
 *   blk.N.attn_q.weight/.bias   model.layers.N.self_attn.q_proj.weight/.bias
 *   blk.N.attn_k.weight/.bias   model.layers.N.self_attn.k_proj.weight/.bias
 *   blk.N.attn_v.weight/.bias   model.layers.N.self_attn.v_proj.weight/.bias
 *   blk.N.attn_output.weight    model.layers.N.self_attn.o_proj.weight
 *   blk.N.attn_q_norm.weight    model.layers.N.self_attn.q_norm.weight
 *   blk.N.attn_k_norm.weight    model.layers.N.self_attn.k_norm.weight
 *   blk.N.ffn_norm.weight       model.layers.N.post_attention_layernorm.weight
 *   blk.N.ffn_gate.weight       model.layers.N.mlp.gate_proj.weight
 *   blk.N.ffn_up.weight         model.layers.N.mlp.up_proj.weight
 *   blk.N.ffn_down.weight       model.layers.N.mlp.down_proj.weight
 *
 *   blk.N.ffn_gate_inp.weight   model.layers.N.mlp.gate.weight       (router; Mixtral:
 *                               ...block_sparse_moe.gate.weight)
 *   blk.N.exp_probs_b.bias      model.layers.N.mlp.gate.e_score_correction_bias
 *   blk.N.ffn_{gate,up,down}_shexp.weight   ...mlp.shared_expert.{gate,up,down}_proj.weight
 *                               (qwen2moe; DeepSeek: mlp.shared_experts.*)
 *   blk.N.ffn_gate_inp_shexp.weight  model.layers.N.mlp.shared_expert_gate.weight
 *   blk.N.attn_q_a.weight       ...self_attn.q_a_proj.weight      (and attn_q_a_norm <->
 *   blk.N.attn_q_b.weight       ...self_attn.q_b_proj.weight       q_a_layernorm,
 *   blk.N.attn_kv_a_mqa.weight  ...self_attn.kv_a_proj_with_mqa.weight  attn_kv_a_norm <->
 *   blk.N.attn_kv_b.weight      ...self_attn.kv_b_proj.weight      kv_a_layernorm)
 *   blk.N.nextn.{eh_proj,enorm,hnorm,embed_tokens,shared_head_head,shared_head_norm}.weight
 *                               model.layers.N.{eh_proj,enorm,hnorm,embed_tokens,
 *                               shared_head.head,shared_head.norm}.weight  (DeepSeek MTP)
 *
 * Experts: GGUF stacks a layer's routed experts into one 3-D tensor
 * blk.N.ffn_{gate,up,down}_exps.weight, ne = {in, out, n_expert} (expert e is the e-th
 * slice of in * out elements); HF has one tensor per expert,
 * model.layers.N.mlp.experts.E.{gate,up,down}_proj.weight (Mixtral:
 * block_sparse_moe.experts.E.{w1,w3,w2}.weight). These are not in the 1:1 table; the
 * tensor_name_expert_* functions name and parse them.
 *
 * MLA's kv_b: llama.cpp 81ff7abe's converter writes no attn_kv_b but attn_k_b, ne =
 * {qk_nope, kv_lora_rank, n_head} (per head the transpose of kv_b's first qk_nope rows),
 * and attn_v_b, ne = {kv_lora_rank, v_head_dim, n_head} (kv_b's last v_head_dim rows of
 * each head, unchanged). kv_b_proj rows are per head [qk_nope key rows | v_head_dim value
 * rows]. attn_k_b / attn_v_b have no HF name; kv_b_split / kv_b_join convert.
 *
 * DeepSeek rope: HF's modeling code de-interleaves q_pe / k_pe (view(d/2, 2).transpose)
 * before rotate-half, i.e. it rotates adjacent pairs of the weights' rows; llama.cpp
 * copies the rows unpermuted and uses adjacent-pair rope (LLAMA_ROPE_TYPE_NORM). So no
 * permutation for deepseek2, and rope_neox = false from either source.
 *
 * Shapes: the bytes are the same; GGUF's ne[] lists dimensions innermost first, HF's shape
 * outermost first (a Linear weight is ne = {in, out} in GGUF, shape = [out, in] in HF).
 *
 * Permutation: for arch llama, GGUF stores attn_q / attn_k rows permuted so that rope on
 * adjacent pairs equals HF's rotate-half. Per head of head_dim rows, HF row
 * (h, half, i) -> GGUF row (h, i, half) for half in {0,1}, i < head_dim/2 (llama.cpp's
 * `permute` in convert_hf_to_gguf.py, with n_head = n_kv_head for K).
 */
#ifndef WELD_MODEL_NAMES_H
#define WELD_MODEL_NAMES_H

#include <stddef.h>
#include <stdint.h>

/* HF spellings that depend on the model (only gguf -> hf needs to choose; hf -> gguf
   accepts every spelling). */
enum hf_style {
    HF_STYLE_DEFAULT = 0, /* Llama, Qwen (mlp.shared_expert.*) */
    HF_STYLE_MIXTRAL,     /* block_sparse_moe.{gate, experts.E.w1/w3/w2} */
    HF_STYLE_DEEPSEEK,    /* mlp.shared_experts.* */
};

/* Write the other format's name into out; return 0, or -1 if the name is not a known
   tensor (or out is too small). tensor_name_gguf_to_hf uses HF_STYLE_DEFAULT. */
int tensor_name_hf_to_gguf(const char *hf, char *out, size_t out_len);
int tensor_name_gguf_to_hf(const char *gguf, char *out, size_t out_len);
int tensor_name_gguf_to_hf_style(const char *gguf, enum hf_style style, char *out, size_t out_len);

/* Routed experts (see above). */
enum expert_proj { EXP_GATE = 0, EXP_UP, EXP_DOWN };
int tensor_name_expert_gguf(int layer, enum expert_proj p, char *out, size_t out_len);
int tensor_name_expert_hf(int layer, int expert, enum expert_proj p, enum hf_style style, char *out,
                          size_t out_len);
/* Parse a per-expert HF name (either spelling) or a stacked GGUF name (*expert = -1);
   0, or -1 if it is neither. */
int tensor_name_expert_parse(const char *name, int *layer, int *expert, enum expert_proj *p);

/* kv_b_proj (HF rows, [n_head][qk_nope + v_dim][lora] elements of el bytes) <-> attn_k_b
   ([n_head][lora][qk_nope]) and attn_v_b ([n_head][v_dim][lora]). */
void kv_b_split(const void *kv_b, void *k_b, void *v_b, int n_head, int qk_nope, int v_dim,
                int lora, size_t el);
void kv_b_join(const void *k_b, const void *v_b, void *kv_b, int n_head, int qk_nope, int v_dim,
               int lora, size_t el);

/* Permute the rows of a Q or K weight (or bias: row_bytes = element size) for n_head heads
   of head_dim rows each, each row row_bytes long. to_gguf: HF order -> GGUF order;
   otherwise the inverse. src and dst must not overlap. */
void rope_permute_rows(const void *src, void *dst, int n_head, int head_dim,
                       size_t row_bytes, int to_gguf);

#endif

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

/* Write the other format's name into out; return 0, or -1 if the name is not a known
   tensor (or out is too small). */
int tensor_name_hf_to_gguf(const char *hf, char *out, size_t out_len);
int tensor_name_gguf_to_hf(const char *gguf, char *out, size_t out_len);

/* Permute the rows of a Q or K weight (or bias: row_bytes = element size) for n_head heads
   of head_dim rows each, each row row_bytes long. to_gguf: HF order -> GGUF order;
   otherwise the inverse. src and dst must not overlap. */
void rope_permute_rows(const void *src, void *dst, int n_head, int head_dim,
                       size_t row_bytes, int to_gguf);

#endif

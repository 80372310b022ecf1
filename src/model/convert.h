/*
 * convert - model conversion between GGUF files and Hugging Face directories, and
 * (re)quantization, with tensors streamed through the writers' fill callbacks (one tensor,
 * often one row, in memory at a time; never the whole model).
 *
 *   GGUF -> HF    config.json (+ bos/eos), generation_config.json, tokenizer.json and
 *                 tokenizer_config.json (tokmeta), safetensors with HF names and reversed
 *                 shapes; llama attn_q/attn_k rows un-permuted; quantized tensors
 *                 dequantized to the target float type (default: F16 or BF16 when every
 *                 matrix already is, else F32); rope_freqs.weight dropped (config.json
 *                 carries the llama3 rope_scaling). Stacked experts split into one tensor
 *                 per expert (Mixtral: block_sparse_moe.experts.E.w1/w2/w3, others
 *                 mlp.experts.E.*_proj), attn_k_b + attn_v_b joined into kv_b_proj.
 *   HF -> GGUF    GGUF names and ne order, llama Q/K permuted, tokenizer keys via tokmeta,
 *                 llama3 rope scaling as rope_freqs.weight, tied embeddings -> no
 *                 output.weight; 1-D tensors F32, matrices in --dtype (default: as stored).
 *                 Sparse models as llama.cpp 81ff7abe's converter writes them: each layer's
 *                 per-expert tensors stacked into 3-D ffn_{gate,up,down}_exps, the router
 *                 (ffn_gate_inp) kept F32 under quantization, qwen2moe's shared expert gate
 *                 1-D, MLA kv_b_proj split into attn_k_b / attn_v_b (names.h), no rope
 *                 permutation but for llama, MTP (nextn) layers dropped (noted on stderr).
 *   GGUF -> GGUF  metadata copied; matrices quantized to --dtype when their rows are a
 *                 multiple of the block size, else kept F16 (noted on stderr), a float
 *                 router F32; 1-D F32.
 *   HF -> HF      dtype change (f32/f16/bf16; default: keep each tensor's), resharding;
 *                 config.json copied with torch_dtype updated, tokenizer and generation
 *                 config files copied.
 * The output kind follows the OUT path: "*.gguf" is a GGUF file, anything else a directory.
 * The input kind: a directory is HF, a file is GGUF; IN may also be a Hugging Face repo id
 * already in the local cache (model_resolve_path).
 */
#ifndef WELD_MODEL_CONVERT_H
#define WELD_MODEL_CONVERT_H

#include "core/err.h"

#include <stdint.h>

struct convert_opts {
    int dtype;           /* enum weld_dtype, or -1 for the default described above */
    uint64_t shard_size; /* HF output: max bytes per safetensors shard, 0 = one file */
};

int convert_model(const char *in, const char *out, const struct convert_opts *o,
                  struct weld_err *e);

#endif

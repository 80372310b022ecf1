/*
 * mkmodel - write a random-weight model at a real model's shape, as a GGUF file or a
 * Hugging Face directory (for tests, benchmarks and loader checks without downloads).
 *
 * Weights are N(0, 0.02) from core/rng.h, norms are 1, biases N(0, 0.02). Every tensor has
 * its own stream, seeded from (seed, HF tensor name), and draws its values in HF order
 * (row-major over the HF shape), so the same seed gives the same weights in both formats:
 * the GGUF writer permutes llama Q/K rows (rope_permute_rows) after drawing. Tensors are
 * generated a row at a time inside the writers' fill callbacks (only the llama Q/K
 * matrices, which need the permutation, are drawn whole), so a 1B model never sits in
 * memory.
 *
 * GGUF output: 1-D tensors (norms, biases) stay F32, 2-D ones take the requested type
 * (f32, f16, bf16, or any type format/dtype.c quantizes: q4_0, q4_1, q5_0, q5_1, q8_0,
 * q4_K, q5_K, q6_K); a row that is not a multiple of the block size falls back to F16. The tokenizer goes into the metadata through tokmeta; Llama 3 rope scaling
 * becomes the rope_freqs.weight tensor. HF output: config.json, model.safetensors,
 * generation_config.json, and tokenizer.json / tokenizer_config.json copied byte for byte
 * from the tokenizer's directory. Quantized types are GGUF-only.
 */
#ifndef WELD_MODEL_MKMODEL_H
#define WELD_MODEL_MKMODEL_H

#include "core/err.h"
#include "model/config.h"

#include <stdint.h>

/* Fill c with a named shape ("tiny", "mixtral-tiny", "llama-110m", "llama-3.2-1b",
   "qwen3-0.6b", "qwen2-0.5b", "qwen3-moe-1b", "deepseek-moe-1b") for arch (the preset's
   own arch wins for the named real models; "tiny" takes the given arch, sparse for
   qwen3moe, qwen2moe and deepseek2). */
int mkmodel_preset(const char *name, enum model_arch arch, struct model_config *c,
                   struct weld_err *e);

/* Fill in derived fields of a hand-made config (head_dim, rope_dim, flags for the arch,
   defaults for eps/theta/ctx), leaving what is already set. */
void mkmodel_config_defaults(struct model_config *c);

struct mkmodel_opts {
    const char *tokenizer; /* tokenizer.json or a directory holding it; NULL: none */
    int dtype;             /* enum weld_dtype: F32, F16, BF16 or one dtype_quantize_row makes */
    uint64_t seed;
    const char *out;       /* ends with .gguf: GGUF file; else an HF directory (created) */
};

/* Write the model. c->n_vocab is raised to the tokenizer's size when smaller. */
int mkmodel_write(const struct model_config *c, const struct mkmodel_opts *o,
                  struct weld_err *e);

/* The value every generator uses: tensor `hf_name`'s stream under `seed`. */
uint64_t mkmodel_tensor_seed(uint64_t seed, const char *hf_name);

struct tokmeta;
/* Write dir/config.json (config plus bos/eos ids from tm, which may be NULL) and
   dir/generation_config.json. */
int mkmodel_write_hf_json(const struct model_config *c, const char *torch_dtype,
                          const struct tokmeta *tm, const char *dir, struct weld_err *e);
/* mkdir dir (an existing directory is fine). */
int mkmodel_make_dir(const char *dir, struct weld_err *e);

/* 1 if path names a GGUF file (ends with ".gguf"), else 0. */
int mkmodel_is_gguf_path(const char *path);

#endif

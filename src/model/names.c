/*
 * names - the GGUF <-> Hugging Face tensor name table and the Q/K row permutation (see
 * names.h for the table and the permutation's definition).
 *
 * A name is either global (token_embd.weight <-> model.embed_tokens.weight) or a layer
 * tensor: a prefix with the layer number ("blk.N." / "model.layers.N.") and a suffix from
 * the per-layer table. The layer number is parsed strictly: decimal digits only, no sign,
 * no leading zero (except "0" itself), no overflow, followed by exactly one '.', so that a
 * name maps to exactly one other name and back. Anything else is "not a known tensor".
 *
 * rope_permute_rows moves whole rows (row_bytes each) with memcpy; it is type-agnostic, so
 * it works for F32/F16/BF16 weights, biases (row_bytes = element size) and quantized rows.
 */
#include "model/names.h"

#include "core/err.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>

struct name_pair {
    const char *gguf, *hf;
};

static const struct name_pair global_names[] = {
    {"token_embd.weight", "model.embed_tokens.weight"},
    {"output_norm.weight", "model.norm.weight"},
    {"output.weight", "lm_head.weight"},
};

static const struct name_pair layer_names[] = {
    {"attn_norm.weight", "input_layernorm.weight"},
    {"attn_q.weight", "self_attn.q_proj.weight"},
    {"attn_q.bias", "self_attn.q_proj.bias"},
    {"attn_k.weight", "self_attn.k_proj.weight"},
    {"attn_k.bias", "self_attn.k_proj.bias"},
    {"attn_v.weight", "self_attn.v_proj.weight"},
    {"attn_v.bias", "self_attn.v_proj.bias"},
    {"attn_output.weight", "self_attn.o_proj.weight"},
    {"attn_q_norm.weight", "self_attn.q_norm.weight"},
    {"attn_k_norm.weight", "self_attn.k_norm.weight"},
    {"ffn_norm.weight", "post_attention_layernorm.weight"},
    {"ffn_gate.weight", "mlp.gate_proj.weight"},
    {"ffn_up.weight", "mlp.up_proj.weight"},
    {"ffn_down.weight", "mlp.down_proj.weight"},
};

#define N_GLOBAL (sizeof global_names / sizeof global_names[0])
#define N_LAYER (sizeof layer_names / sizeof layer_names[0])

/* Parse "<digits>." at s; returns the text after the '.', or NULL. */
static const char *parse_layer(const char *s, int *layer)
{
    if (*s < '0' || *s > '9')
        return NULL;
    if (s[0] == '0' && s[1] != '.')
        return NULL;
    long long v = 0;
    while (*s >= '0' && *s <= '9') {
        v = v * 10 + (*s - '0');
        if (v > INT_MAX)
            return NULL;
        s++;
    }
    if (*s != '.')
        return NULL;
    *layer = (int)v;
    return s + 1;
}

static int put(char *out, size_t out_len, const char *prefix, int layer, const char *suffix)
{
    int n = layer < 0 ? snprintf(out, out_len, "%s", suffix)
                      : snprintf(out, out_len, "%s%d.%s", prefix, layer, suffix);
    return n >= 0 && (size_t)n < out_len ? 0 : -1;
}

/* from_hf selects which column is the input. */
static int translate(const char *name, char *out, size_t out_len, int from_hf)
{
    if (!name || !out || out_len == 0)
        return -1;
    for (size_t i = 0; i < N_GLOBAL; i++) {
        const char *src = from_hf ? global_names[i].hf : global_names[i].gguf;
        const char *dst = from_hf ? global_names[i].gguf : global_names[i].hf;
        if (strcmp(name, src) == 0)
            return put(out, out_len, "", -1, dst);
    }
    const char *in_prefix = from_hf ? "model.layers." : "blk.";
    const char *out_prefix = from_hf ? "blk." : "model.layers.";
    size_t pl = strlen(in_prefix);
    if (strncmp(name, in_prefix, pl) != 0)
        return -1;
    int layer = 0;
    const char *suffix = parse_layer(name + pl, &layer);
    if (!suffix)
        return -1;
    for (size_t i = 0; i < N_LAYER; i++) {
        const char *src = from_hf ? layer_names[i].hf : layer_names[i].gguf;
        const char *dst = from_hf ? layer_names[i].gguf : layer_names[i].hf;
        if (strcmp(suffix, src) == 0)
            return put(out, out_len, out_prefix, layer, dst);
    }
    return -1;
}

int tensor_name_hf_to_gguf(const char *hf, char *out, size_t out_len)
{
    return translate(hf, out, out_len, 1);
}

int tensor_name_gguf_to_hf(const char *gguf, char *out, size_t out_len)
{
    return translate(gguf, out, out_len, 0);
}

void rope_permute_rows(const void *src, void *dst, int n_head, int head_dim,
                       size_t row_bytes, int to_gguf)
{
    WELD_ASSERT(n_head >= 0 && head_dim >= 0 && head_dim % 2 == 0);
    const unsigned char *s = src;
    unsigned char *d = dst;
    size_t half = (size_t)head_dim / 2;
    for (size_t h = 0; h < (size_t)n_head; h++) {
        size_t base = h * (size_t)head_dim;
        for (size_t p = 0; p < 2; p++) {
            for (size_t i = 0; i < half; i++) {
                size_t hf_row = base + p * half + i;  /* (h, half p, i) */
                size_t gguf_row = base + i * 2 + p;   /* (h, i, half p) */
                size_t from = to_gguf ? hf_row : gguf_row;
                size_t to = to_gguf ? gguf_row : hf_row;
                memcpy(d + to * row_bytes, s + from * row_bytes, row_bytes);
            }
        }
    }
}

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
 * Model-dependent HF spellings (Mixtral, DeepSeek) sit in a second, styled table: gguf -> hf
 * picks the style's entry first, hf -> gguf accepts any. Stacked expert tensors are not a
 * 1:1 mapping and have their own functions; kv_b_split / kv_b_join move elements (they work
 * on float types only, as a transpose cannot cut through quantization blocks).
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
    {"ffn_gate_inp.weight", "mlp.gate.weight"},
    {"exp_probs_b.bias", "mlp.gate.e_score_correction_bias"},
    {"ffn_gate_shexp.weight", "mlp.shared_expert.gate_proj.weight"},
    {"ffn_up_shexp.weight", "mlp.shared_expert.up_proj.weight"},
    {"ffn_down_shexp.weight", "mlp.shared_expert.down_proj.weight"},
    {"ffn_gate_inp_shexp.weight", "mlp.shared_expert_gate.weight"},
    {"attn_q_a.weight", "self_attn.q_a_proj.weight"},
    {"attn_q_a_norm.weight", "self_attn.q_a_layernorm.weight"},
    {"attn_q_b.weight", "self_attn.q_b_proj.weight"},
    {"attn_kv_a_mqa.weight", "self_attn.kv_a_proj_with_mqa.weight"},
    {"attn_kv_a_norm.weight", "self_attn.kv_a_layernorm.weight"},
    {"attn_kv_b.weight", "self_attn.kv_b_proj.weight"},
    {"nextn.eh_proj.weight", "eh_proj.weight"},
    {"nextn.enorm.weight", "enorm.weight"},
    {"nextn.hnorm.weight", "hnorm.weight"},
    {"nextn.embed_tokens.weight", "embed_tokens.weight"},
    {"nextn.shared_head_head.weight", "shared_head.head.weight"},
    {"nextn.shared_head_norm.weight", "shared_head.norm.weight"},
};

/* Per-style HF spellings, tried first (gguf -> hf) or in addition (hf -> gguf). */
static const struct {
    enum hf_style style;
    struct name_pair p;
} styled_names[] = {
    {HF_STYLE_MIXTRAL, {"ffn_gate_inp.weight", "block_sparse_moe.gate.weight"}},
    {HF_STYLE_DEEPSEEK, {"ffn_gate_shexp.weight", "mlp.shared_experts.gate_proj.weight"}},
    {HF_STYLE_DEEPSEEK, {"ffn_up_shexp.weight", "mlp.shared_experts.up_proj.weight"}},
    {HF_STYLE_DEEPSEEK, {"ffn_down_shexp.weight", "mlp.shared_experts.down_proj.weight"}},
};
#define N_STYLED (sizeof styled_names / sizeof styled_names[0])

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

/* from_hf selects which column is the input; style picks the HF spelling (gguf -> hf). */
static int translate(const char *name, char *out, size_t out_len, int from_hf, enum hf_style style)
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
    for (size_t i = 0; i < N_STYLED; i++) {
        if (!from_hf && styled_names[i].style != style)
            continue;
        const char *src = from_hf ? styled_names[i].p.hf : styled_names[i].p.gguf;
        const char *dst = from_hf ? styled_names[i].p.gguf : styled_names[i].p.hf;
        if (strcmp(suffix, src) == 0)
            return put(out, out_len, out_prefix, layer, dst);
    }
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
    return translate(hf, out, out_len, 1, HF_STYLE_DEFAULT);
}

int tensor_name_gguf_to_hf(const char *gguf, char *out, size_t out_len)
{
    return translate(gguf, out, out_len, 0, HF_STYLE_DEFAULT);
}

int tensor_name_gguf_to_hf_style(const char *gguf, enum hf_style style, char *out, size_t out_len)
{
    return translate(gguf, out, out_len, 0, style);
}

static const char *const exp_gguf[3] = {"ffn_gate_exps.weight", "ffn_up_exps.weight",
                                        "ffn_down_exps.weight"};
static const char *const exp_hf[3] = {"gate_proj.weight", "up_proj.weight", "down_proj.weight"};
static const char *const exp_mixtral[3] = {"w1.weight", "w3.weight", "w2.weight"};

int tensor_name_expert_gguf(int layer, enum expert_proj p, char *out, size_t out_len)
{
    if (layer < 0 || (unsigned)p > EXP_DOWN)
        return -1;
    return put(out, out_len, "blk.", layer, exp_gguf[p]);
}

int tensor_name_expert_hf(int layer, int expert, enum expert_proj p, enum hf_style style, char *out,
                          size_t out_len)
{
    if (layer < 0 || expert < 0 || (unsigned)p > EXP_DOWN)
        return -1;
    int n = style == HF_STYLE_MIXTRAL
                ? snprintf(out, out_len, "model.layers.%d.block_sparse_moe.experts.%d.%s", layer,
                           expert, exp_mixtral[p])
                : snprintf(out, out_len, "model.layers.%d.mlp.experts.%d.%s", layer, expert,
                           exp_hf[p]);
    return n >= 0 && (size_t)n < out_len ? 0 : -1;
}

int tensor_name_expert_parse(const char *name, int *layer, int *expert, enum expert_proj *p)
{
    const char *s;
    if (strncmp(name, "blk.", 4) == 0 && (s = parse_layer(name + 4, layer))) {
        for (int i = 0; i < 3; i++)
            if (strcmp(s, exp_gguf[i]) == 0) {
                *expert = -1;
                *p = (enum expert_proj)i;
                return 0;
            }
        return -1;
    }
    if (strncmp(name, "model.layers.", 13) != 0 || !(s = parse_layer(name + 13, layer)))
        return -1;
    const char *const *tails;
    if (strncmp(s, "mlp.experts.", 12) == 0)
        s += 12, tails = exp_hf;
    else if (strncmp(s, "block_sparse_moe.experts.", 25) == 0)
        s += 25, tails = exp_mixtral;
    else
        return -1;
    if (!(s = parse_layer(s, expert)))
        return -1;
    for (int i = 0; i < 3; i++)
        if (strcmp(s, tails[i]) == 0) {
            *p = (enum expert_proj)i;
            return 0;
        }
    return -1;
}

void kv_b_split(const void *kv_b, void *k_b, void *v_b, int n_head, int qk_nope, int v_dim,
                int lora, size_t el)
{
    const unsigned char *src = kv_b;
    unsigned char *k = k_b, *v = v_b;
    size_t row = (size_t)lora * el, per_head = (size_t)(qk_nope + v_dim) * row;
    for (size_t h = 0; h < (size_t)n_head; h++) {
        const unsigned char *hs = src + h * per_head;
        for (size_t d = 0; d < (size_t)qk_nope; d++) /* k_b[h][c][d] = kv_b[h][d][c] */
            for (size_t c = 0; c < (size_t)lora; c++)
                memcpy(k + ((h * (size_t)lora + c) * (size_t)qk_nope + d) * el,
                       hs + d * row + c * el, el);
        memcpy(v + h * (size_t)v_dim * row, hs + (size_t)qk_nope * row, (size_t)v_dim * row);
    }
}

void kv_b_join(const void *k_b, const void *v_b, void *kv_b, int n_head, int qk_nope, int v_dim,
               int lora, size_t el)
{
    const unsigned char *k = k_b, *v = v_b;
    unsigned char *dst = kv_b;
    size_t row = (size_t)lora * el, per_head = (size_t)(qk_nope + v_dim) * row;
    for (size_t h = 0; h < (size_t)n_head; h++) {
        unsigned char *hd = dst + h * per_head;
        for (size_t d = 0; d < (size_t)qk_nope; d++)
            for (size_t c = 0; c < (size_t)lora; c++)
                memcpy(hd + d * row + c * el,
                       k + ((h * (size_t)lora + c) * (size_t)qk_nope + d) * el, el);
        memcpy(hd + (size_t)qk_nope * row, v + h * (size_t)v_dim * row, (size_t)v_dim * row);
    }
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

/*
 * convert - GGUF <-> HF conversion and quantization (see convert.h for what each
 * direction does).
 *
 * Every output tensor is a struct cv_tensor: a view of the source bytes (type, rows x
 * cols with cols contiguous), the output type, and an optional Q/K row permutation. The
 * writers call cv_fill() when they reach the tensor: with the same type and no
 * permutation the bytes are copied as they are; otherwise each row is decoded to f32
 * (F32/F16/BF16 or any quantized type the dtype module can dequantize) and encoded to the
 * output type straight into the writer's buffer. A permuted tensor (llama attn_q/attn_k,
 * a few MB even for 70B models) is decoded whole, permuted, then encoded. A stacked expert
 * tensor (HF -> GGUF) lists one source per expert (parts), filled one after another; an MLA
 * kv_b split or join decodes its source(s) whole to f32, moves elements with kv_b_split /
 * kv_b_join and encodes (exact for float types, so round trips keep every byte). GGUF ->
 * HF experts are plain views of row-aligned slices of the stacked tensor.
 *
 * Invariant: every source view has been checked (rows * row_bytes(type, cols) == its byte
 * size) before a writer sees it, so the fill callback never reads out of bounds.
 */
#include "model/convert.h"
#include "model/resolve.h"

#include "core/alloc.h"
#include "core/fp16.h"
#include "core/json.h"
#include "core/log.h"
#include "core/mfile.h"
#include "format/dtype.h"
#include "format/gguf.h"
#include "format/safetensors.h"
#include "model/config.h"
#include "model/mkmodel.h"
#include "model/names.h"
#include "model/tokmeta.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum cv_kvb {
    KVB_NONE = 0,
    KVB_K,    /* attn_k_b from kv_b_proj (src) */
    KVB_V,    /* attn_v_b from kv_b_proj (src) */
    KVB_JOIN, /* kv_b_proj from attn_k_b (src) and attn_v_b (src2) */
};

struct cv_tensor {
    char name[96];        /* output name */
    const void *src;
    int src_type;
    int64_t rows, cols; /* of the output; cols contiguous */
    int n_dims;
    int64_t shape[4];     /* output order: GGUF ne[] or HF shape */
    int dst_type;
    int permute_heads;    /* > 0: permute rows (heads of rows / permute_heads rows) */
    int permute_to_gguf;
    const void **parts; /* stacked experts: n_parts sources of rows / n_parts rows each */
    int n_parts;
    int kvb;          /* enum cv_kvb: an MLA kv_b split or join (decoded whole) */
    const void *src2; /* KVB_JOIN: attn_v_b */
    int src2_type;
    int kvb_heads, kvb_nope, kvb_v, kvb_lora;
    int keep_f32; /* a router kept F32 under quantization (not an f16 fallback) */
};

struct cv_job {
    struct cv_tensor *t;
    int n, cap;
};

static void job_free(struct cv_job *j)
{
    for (int i = 0; i < j->n; i++)
        wfree((void *)j->t[i].parts);
    wfree(j->t);
    j->t = NULL;
    j->n = j->cap = 0;
}

static struct cv_tensor *job_push(struct cv_job *j)
{
    if (j->n == j->cap) {
        int nc = j->cap ? j->cap * 2 : 64;
        struct cv_tensor *p = wrealloc(j->t, (size_t)nc * sizeof *p);
        if (!p)
            return NULL;
        j->t = p;
        j->cap = nc;
    }
    struct cv_tensor *t = &j->t[j->n++];
    memset(t, 0, sizeof *t);
    return t;
}

/* ---- row codecs ---- */

static void decode_row(int type, const void *src, float *dst, int64_t n)
{
    if (type == DT_F32) {
        memcpy(dst, src, (size_t)n * sizeof(float));
    } else if (type == DT_F16) {
        const uint8_t *s = src;
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, s + 2 * i, 2);
            dst[i] = fp16_to_f32(h);
        }
    } else if (type == DT_BF16) {
        const uint8_t *s = src;
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, s + 2 * i, 2);
            dst[i] = bf16_to_f32(h);
        }
    } else {
        dtype_dequantize_row(type, src, dst, n);
    }
}

static void encode_row(int type, const float *src, void *dst, int64_t n)
{
    if (type == DT_F32) {
        memcpy(dst, src, (size_t)n * sizeof(float));
    } else if (type == DT_F16 || type == DT_BF16) {
        uint8_t *d = dst;
        for (int64_t i = 0; i < n; i++) {
            uint16_t h = type == DT_F16 ? fp16_from_f32(src[i]) : bf16_from_f32(src[i]);
            memcpy(d + 2 * i, &h, 2);
        }
    } else {
        dtype_quantize_row(type, src, dst, n);
    }
}

static int cv_fill_permuted(const struct cv_tensor *t, uint8_t *dst, size_t dst_row,
                            struct weld_err *e)
{
    size_t n = (size_t)t->rows * (size_t)t->cols, src_row = dtype_row_bytes(t->src_type, t->cols);
    float *a = wmalloc(n * sizeof *a), *b = wmalloc(n * sizeof *b);
    if (!a || !b) {
        wfree(a);
        wfree(b);
        return err_set(e, WELD_ERR_NOMEM, "convert: out of memory for '%s'", t->name);
    }
    for (int64_t r = 0; r < t->rows; r++)
        decode_row(t->src_type, (const uint8_t *)t->src + (size_t)r * src_row,
                   a + (size_t)r * (size_t)t->cols, t->cols);
    rope_permute_rows(a, b, t->permute_heads, (int)(t->rows / t->permute_heads),
                      (size_t)t->cols * sizeof(float), t->permute_to_gguf);
    for (int64_t r = 0; r < t->rows; r++)
        encode_row(t->dst_type, b + (size_t)r * (size_t)t->cols, dst + (size_t)r * dst_row,
                   t->cols);
    wfree(a);
    wfree(b);
    return WELD_OK;
}

/* decode rows x cols elements of type at src to f32 */
static void decode_rows(int type, const void *src, float *dst, int64_t rows, int64_t cols)
{
    size_t rb = dtype_row_bytes(type, cols);
    for (int64_t r = 0; r < rows; r++)
        decode_row(type, (const uint8_t *)src + (size_t)r * rb, dst + (size_t)r * (size_t)cols,
                   cols);
}

/* MLA kv_b: decode the source(s) whole, split or join as f32 (exact for float types), encode
   the output rows. */
static int cv_fill_kvb(const struct cv_tensor *t, uint8_t *dst, size_t dst_row, struct weld_err *e)
{
    size_t h = (size_t)t->kvb_heads, nope = (size_t)t->kvb_nope, v = (size_t)t->kvb_v;
    size_t lora = (size_t)t->kvb_lora, nk = h * lora * nope, nv = h * v * lora;
    float *kv = wmalloc((nk + nv) * sizeof *kv), *k = wmalloc(nk * sizeof *k);
    float *vb = wmalloc(nv * sizeof *vb);
    if (!kv || !k || !vb) {
        wfree(kv), wfree(k), wfree(vb);
        return err_set(e, WELD_ERR_NOMEM, "convert: out of memory for '%s'", t->name);
    }
    const float *out;
    if (t->kvb == KVB_JOIN) {
        decode_rows(t->src_type, t->src, k, (int64_t)(h * lora), (int64_t)nope);
        decode_rows(t->src2_type, t->src2, vb, (int64_t)(h * v), (int64_t)lora);
        kv_b_join(k, vb, kv, (int)h, (int)nope, (int)v, (int)lora, sizeof(float));
        out = kv;
    } else {
        decode_rows(t->src_type, t->src, kv, (int64_t)(h * (nope + v)), (int64_t)lora);
        kv_b_split(kv, k, vb, (int)h, (int)nope, (int)v, (int)lora, sizeof(float));
        out = t->kvb == KVB_K ? k : vb;
    }
    for (int64_t r = 0; r < t->rows; r++)
        encode_row(t->dst_type, out + (size_t)r * (size_t)t->cols, dst + (size_t)r * dst_row,
                   t->cols);
    wfree(kv), wfree(k), wfree(vb);
    return WELD_OK;
}

/* rows of t's types from src to dst, through f32 unless the types are equal */
static void cv_rows(const struct cv_tensor *t, const uint8_t *src, uint8_t *dst, int64_t rows,
                    float *row)
{
    size_t src_row = dtype_row_bytes(t->src_type, t->cols);
    size_t dst_row = dtype_row_bytes(t->dst_type, t->cols);
    if (t->src_type == t->dst_type) {
        memcpy(dst, src, (size_t)rows * src_row);
        return;
    }
    for (int64_t r = 0; r < rows; r++) {
        decode_row(t->src_type, src + (size_t)r * src_row, row, t->cols);
        encode_row(t->dst_type, row, dst + (size_t)r * dst_row, t->cols);
    }
}

static int cv_fill(void *ctx, void *dst, size_t size, struct weld_err *e)
{
    const struct cv_tensor *t = ctx;
    size_t dst_row = dtype_row_bytes(t->dst_type, t->cols);
    if ((size_t)t->rows * dst_row != size)
        return err_set(e, WELD_ERR_INTERNAL, "convert: tensor '%s': writer asks %zu bytes, "
                       "expected %zu", t->name, size, (size_t)t->rows * dst_row);
    if (t->kvb)
        return cv_fill_kvb(t, dst, dst_row, e);
    if (t->permute_heads)
        return cv_fill_permuted(t, dst, dst_row, e);
    float *row = wmalloc((size_t)t->cols * sizeof *row);
    if (!row)
        return err_set(e, WELD_ERR_NOMEM, "convert: out of memory for '%s'", t->name);
    if (t->parts) { /* experts one after another */
        int64_t rp = t->rows / t->n_parts;
        for (int p = 0; p < t->n_parts; p++)
            cv_rows(t, t->parts[p], (uint8_t *)dst + (size_t)p * (size_t)rp * dst_row, rp, row);
    } else {
        cv_rows(t, t->src, dst, t->rows, row);
    }
    wfree(row);
    return WELD_OK;
}

/* Check that the source and output types can be converted. */
static int cv_check_types(const struct cv_tensor *t, int src_type, const char *where,
                          struct weld_err *e)
{
    const struct dtype_info *si = dtype_get(src_type), *di = dtype_get(t->dst_type);
    if (!si ||
        (src_type != DT_F32 && src_type != DT_F16 && src_type != DT_BF16 && !si->can_dequantize))
        return err_set(e, WELD_ERR_UNSUPPORTED, "%s: tensor '%s': type %s cannot be converted",
                       where, t->name, dtype_name(src_type));
    if (!di || (t->dst_type != DT_F32 && t->dst_type != DT_F16 && t->dst_type != DT_BF16 &&
                !di->can_quantize && t->dst_type != src_type))
        return err_set(e, WELD_ERR_UNSUPPORTED, "%s: tensor '%s': cannot write type %s", where,
                       t->name, dtype_name(t->dst_type));
    if (t->cols <= 0 || dtype_row_bytes(t->dst_type, t->cols) == 0)
        return err_set(e, WELD_ERR_FORMAT,
                       "%s: tensor '%s': rows of %lld elements cannot be "
                       "written as %s",
                       where, t->name, (long long)t->cols, dtype_name(t->dst_type));
    return WELD_OK;
}

/* Check that src_bytes hold rows x cols elements of type (name: the source tensor). */
static int cv_check_view(const char *name, int type, int64_t rows, int64_t cols, size_t src_bytes,
                         const char *where, struct weld_err *e)
{
    size_t row = dtype_row_bytes(type, cols);
    if (rows <= 0 || cols <= 0 || row == 0 || (uint64_t)rows > SIZE_MAX / row ||
        (size_t)rows * row != src_bytes)
        return err_set(e, WELD_ERR_FORMAT,
                       "%s: tensor '%s': %zu bytes do not hold %lld rows "
                       "of %lld %s elements",
                       where, name, src_bytes, (long long)rows, (long long)cols, dtype_name(type));
    return WELD_OK;
}

/* Check a source view and the output type before any writer sees it. */
static int cv_check(const struct cv_tensor *t, size_t src_bytes, const char *where,
                    struct weld_err *e)
{
    int rc = cv_check_types(t, t->src_type, where, e);
    if (rc || (rc = cv_check_view(t->name, t->src_type, t->rows, t->cols, src_bytes, where, e)))
        return rc;
    if (t->permute_heads && (t->rows % t->permute_heads || (t->rows / t->permute_heads) % 2))
        return err_set(e, WELD_ERR_FORMAT, "%s: tensor '%s': %lld rows do not split into %d "
                       "heads of an even size", where, t->name, (long long)t->rows,
                       t->permute_heads);
    return WELD_OK;
}

/* 2-D output type for a requested dtype: quantized only when rows fit its blocks. */
static int matrix_type(int want, int src_type, int64_t cols, const char *name)
{
    if (want < 0)
        return src_type;
    const struct dtype_info *di = dtype_get(want);
    if (di && di->quantized && cols % di->block_size) {
        log_debug("convert: %s: rows of %lld are not a multiple of %d; kept as f16", name,
                  (long long)cols, di->block_size);
        return DT_F16;
    }
    return want;
}

static int is_float_type(int t)
{
    return t == DT_F32 || t == DT_F16 || t == DT_BF16;
}

static int file_exists(const char *path)
{
    return access(path, R_OK) == 0;
}

static int is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* llama.cpp's general.file_type for an output whose matrices are `dtype`. */
static uint32_t ftype_of(int dtype)
{
    static const struct { int dt; uint32_t ft; } map[] = {
        {DT_F32, 0}, {DT_F16, 1}, {DT_Q4_0, 2}, {DT_Q4_1, 3}, {DT_Q8_0, 7}, {DT_Q5_0, 8},
        {DT_Q5_1, 9}, {DT_Q4_K, 14}, {DT_Q5_K, 16}, {DT_Q6_K, 18}, {DT_BF16, 32},
    };
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (map[i].dt == dtype)
            return map[i].ft;
    return 0;
}

/* ---- GGUF -> HF ---- */

/* Default HF type for a GGUF source: its common float type, else F32. */
static int gguf_default_float(const struct gguf_file *f)
{
    int common = -1;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const struct gguf_tensor *t = &f->tensors[i];
        if (t->n_dims < 2)
            continue;
        if (common < 0)
            common = t->type;
        else if (common != (int)t->type)
            return DT_F32;
    }
    return common == DT_F16 || common == DT_BF16 ? common : DT_F32;
}

/* The HF spellings of c's architecture (Mixtral, DeepSeek or the default). */
static enum hf_style hf_style_of(const struct model_config *c)
{
    if (c->arch == ARCH_LLAMA && c->n_expert > 0)
        return HF_STYLE_MIXTRAL;
    return c->arch == ARCH_DEEPSEEK2 ? HF_STYLE_DEEPSEEK : HF_STYLE_DEFAULT;
}

static int ends_with(const char *s, const char *tail)
{
    size_t n = strlen(s), m = strlen(tail);
    return n >= m && !strcmp(s + n - m, tail);
}

/* blk.L.ffn_{gate,up,down}_exps.weight -> one HF tensor per expert (row-aligned slices). */
static int gguf_split_experts(const struct gguf_file *f, const struct gguf_tensor *g, int layer,
                              enum expert_proj pr, const struct model_config *c, int dst_float,
                              struct cv_job *job, struct weld_err *e)
{
    if (g->n_dims != 3 || g->ne[2] != c->n_expert || g->nbytes % (size_t)c->n_expert)
        return err_set(e, WELD_ERR_FORMAT,
                       "%s: tensor '%s': expected %d stacked experts "
                       "(3 dimensions), found %d dimensions, %lld in the last",
                       f->path, g->name, c->n_expert, g->n_dims, (long long)g->ne[g->n_dims - 1]);
    size_t part = g->nbytes / (size_t)c->n_expert;
    for (int x = 0; x < c->n_expert; x++) {
        struct cv_tensor *t = job_push(job);
        if (!t)
            return err_set(e, WELD_ERR_NOMEM, "convert: out of memory");
        if (tensor_name_expert_hf(layer, x, pr, hf_style_of(c), t->name, sizeof t->name))
            return err_set(e, WELD_ERR_INTERNAL, "%s: tensor '%s': expert name too long", f->path,
                           g->name);
        t->src = (const uint8_t *)g->data + (size_t)x * part;
        t->src_type = g->type;
        t->cols = g->ne[0];
        t->rows = g->ne[1];
        t->n_dims = 2;
        t->shape[0] = g->ne[1];
        t->shape[1] = g->ne[0];
        t->dst_type = dst_float;
        int rc = cv_check(t, part, f->path, e);
        if (rc)
            return rc;
    }
    return WELD_OK;
}

/* blk.L.attn_k_b + attn_v_b (llama.cpp's MLA form) -> HF kv_b_proj. */
static int gguf_join_kv_b(const struct gguf_file *f, const struct gguf_tensor *kb, int layer,
                          const struct model_config *c, int dst_float, struct cv_job *job,
                          struct weld_err *e)
{
    char vname[96], kvname[96];
    snprintf(vname, sizeof vname, "blk.%d.attn_v_b.weight", layer);
    snprintf(kvname, sizeof kvname, "blk.%d.attn_kv_b.weight", layer);
    const struct gguf_tensor *vb = gguf_find_tensor(f, vname);
    int64_t h = c->n_head, nope = c->qk_nope_dim, v = c->v_head_dim, lora = c->kv_lora_rank;
    if (!vb)
        return err_set(e, WELD_ERR_FORMAT,
                       "%s: tensor '%s' has no '%s' to join into "
                       "kv_b_proj",
                       f->path, kb->name, vname);
    if (kb->n_dims != 3 || kb->ne[0] != nope || kb->ne[1] != lora || kb->ne[2] != h)
        return err_set(e, WELD_ERR_FORMAT,
                       "%s: tensor '%s': expected shape %lld x %lld x %lld "
                       "(qk_nope x kv_lora_rank x heads)",
                       f->path, kb->name, (long long)nope, (long long)lora, (long long)h);
    if (vb->n_dims != 3 || vb->ne[0] != lora || vb->ne[1] != v || vb->ne[2] != h)
        return err_set(e, WELD_ERR_FORMAT,
                       "%s: tensor '%s': expected shape %lld x %lld x %lld "
                       "(kv_lora_rank x v_head_dim x heads)",
                       f->path, vname, (long long)lora, (long long)v, (long long)h);
    struct cv_tensor *t = job_push(job);
    if (!t)
        return err_set(e, WELD_ERR_NOMEM, "convert: out of memory");
    if (tensor_name_gguf_to_hf_style(kvname, hf_style_of(c), t->name, sizeof t->name))
        return err_set(e, WELD_ERR_INTERNAL, "%s: no HF name for '%s'", f->path, kvname);
    t->src = kb->data, t->src_type = kb->type;
    t->src2 = vb->data, t->src2_type = vb->type;
    t->kvb = KVB_JOIN;
    t->kvb_heads = (int)h, t->kvb_nope = (int)nope, t->kvb_v = (int)v, t->kvb_lora = (int)lora;
    t->rows = h * (nope + v), t->cols = lora;
    t->n_dims = 2, t->shape[0] = t->rows, t->shape[1] = lora;
    t->dst_type = dst_float;
    int rc;
    if ((rc = cv_check_types(t, kb->type, f->path, e)) ||
        (rc = cv_check_types(t, vb->type, f->path, e)) ||
        (rc = cv_check_view(kb->name, kb->type, h * lora, nope, kb->nbytes, f->path, e)) ||
        (rc = cv_check_view(vname, vb->type, h * v, lora, vb->nbytes, f->path, e)))
        return rc;
    return WELD_OK;
}

static int gguf_to_hf_tensors(const struct gguf_file *f, const struct model_config *c,
                              int dst_float, struct cv_job *job, struct st_writer *w,
                              struct weld_err *e)
{
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const struct gguf_tensor *g = &f->tensors[i];
        if (!strcmp(g->name, "rope_freqs.weight"))
            continue;
        int layer, expert, rc;
        enum expert_proj pr;
        if (tensor_name_expert_parse(g->name, &layer, &expert, &pr) == 0 && expert < 0) {
            if ((rc = gguf_split_experts(f, g, layer, pr, c, dst_float, job, e)))
                return rc;
            continue;
        }
        if (ends_with(g->name, ".attn_k_b.weight") || ends_with(g->name, ".attn_v_b.weight")) {
            char kv[96];
            if (sscanf(g->name, "blk.%d.", &layer) != 1 || layer < 0)
                return err_set(e, WELD_ERR_UNSUPPORTED,
                               "%s: tensor '%s' has no Hugging Face "
                               "name",
                               f->path, g->name);
            snprintf(kv, sizeof kv, "blk.%d.attn_kv_b.weight", layer);
            if (gguf_find_tensor(f, kv)) /* some GGUFs hold both forms: kv_b is the HF one */
                continue;
            if (ends_with(g->name, ".attn_k_b.weight")) {
                if ((rc = gguf_join_kv_b(f, g, layer, c, dst_float, job, e)))
                    return rc;
            } else {
                snprintf(kv, sizeof kv, "blk.%d.attn_k_b.weight", layer);
                if (!gguf_find_tensor(f, kv))
                    return err_set(e, WELD_ERR_FORMAT,
                                   "%s: tensor '%s' has no '%s' to join "
                                   "into kv_b_proj",
                                   f->path, g->name, kv);
            }
            continue;
        }
        struct cv_tensor *t = job_push(job);
        if (!t)
            return err_set(e, WELD_ERR_NOMEM, "convert: out of memory");
        if (tensor_name_gguf_to_hf_style(g->name, hf_style_of(c), t->name, sizeof t->name) != 0)
            return err_set(e, WELD_ERR_UNSUPPORTED, "%s: tensor '%s' has no Hugging Face name",
                           f->path, g->name);
        t->src = g->data;
        t->src_type = g->type;
        t->cols = g->ne[0];
        t->rows = 1;
        for (int d = 1; d < g->n_dims; d++)
            t->rows *= g->ne[d];
        t->n_dims = g->n_dims;
        for (int d = 0; d < g->n_dims; d++)
            t->shape[d] = g->ne[g->n_dims - 1 - d];
        if (g->n_dims == 1 && ends_with(g->name, ".ffn_gate_inp_shexp.weight")) {
            t->n_dims = 2; /* HF Linear(dim, 1) */
            t->shape[0] = 1, t->shape[1] = g->ne[0];
        }
        t->dst_type = dst_float;
        if (c->arch == ARCH_LLAMA && (strstr(g->name, ".attn_q.") || strstr(g->name, ".attn_k."))) {
            t->permute_heads = strstr(g->name, ".attn_q.") ? c->n_head : c->n_kv_head;
            t->permute_to_gguf = 0;
        }
        if ((rc = cv_check(t, g->nbytes, f->path, e)))
            return rc;
    }
    for (int i = 0; i < job->n; i++) {
        struct cv_tensor *t = &job->t[i];
        if (st_writer_add_fn(w, t->name, t->dst_type, t->n_dims, t->shape, cv_fill, t))
            return err_set(e, WELD_ERR_NOMEM, "convert: adding tensor '%s' failed", t->name);
    }
    return WELD_OK;
}

static const char *torch_dtype_of(int t)
{
    return t == DT_F16 ? "float16" : t == DT_BF16 ? "bfloat16" : "float32";
}

static int gguf_to_hf(const char *in, const char *out, const struct convert_opts *o,
                      struct weld_err *e)
{
    struct gguf_file *f = NULL;
    struct tokmeta *tm = NULL;
    struct st_writer *w = NULL;
    struct cv_job job = {0};
    struct model_config c;
    int rc = gguf_open(&f, in, e);
    if (rc)
        return rc;
    if ((rc = model_config_from_gguf(f, &c, e)))
        goto out;
    c.tied_embeddings = gguf_find_tensor(f, "output.weight") == NULL;
    int dst = o->dtype >= 0 ? o->dtype : gguf_default_float(f);
    if (!is_float_type(dst)) {
        rc = err_set(e, WELD_ERR_INVALID_ARG, "convert: %s: Hugging Face output holds f32, f16 "
                     "or bf16 tensors, not %s", out, dtype_name(dst));
        goto out;
    }
    rc = tokmeta_from_gguf(&tm, f, e);
    if (rc == WELD_ERR_NOT_FOUND)
        log_warn("%s: no tokenizer in the file; writing the model without one", in);
    else if (rc)
        goto out;
    if (!(w = st_writer_create())) {
        rc = err_set(e, WELD_ERR_NOMEM, "convert: out of memory");
        goto out;
    }
    st_writer_set_metadata(w, "format", "pt");
    if ((rc = gguf_to_hf_tensors(f, &c, dst, &job, w, e)) || (rc = mkmodel_make_dir(out, e)) ||
        (rc = st_writer_write_dir(w, out, o->shard_size, e)) ||
        (rc = mkmodel_write_hf_json(&c, torch_dtype_of(dst), tm, out, e)))
        goto out;
    if (tm)
        rc = tokmeta_to_hf(tm, out, e);
out:
    st_writer_free(w);
    job_free(&job);
    tokmeta_free(tm);
    gguf_close(f);
    return rc;
}

/* ---- HF -> GGUF ---- */

static int hf_tensor_view(const struct st_tensor *s, struct cv_tensor *t, const char *where,
                          struct weld_err *e)
{
    if (s->dtype < 0 || !is_float_type(s->dtype))
        return err_set(e, WELD_ERR_UNSUPPORTED, "%s: tensor '%s': dtype %s is not supported "
                       "(F32, F16, BF16)", where, s->name, s->dtype_name);
    if (s->n_dims < 1 || s->n_dims > 4)
        return err_set(e, WELD_ERR_UNSUPPORTED, "%s: tensor '%s': %d dimensions", where,
                       s->name, s->n_dims);
    t->src = s->data;
    t->src_type = s->dtype;
    t->cols = s->shape[s->n_dims - 1];
    t->rows = 1;
    for (int d = 0; d < s->n_dims - 1; d++)
        t->rows *= s->shape[d];
    t->n_dims = s->n_dims;
    return WELD_OK;
}

/* What the HF -> GGUF pass collects besides the job: where each layer's expert stacks
   are, and the MTP tensors it drops. */
struct hf_gather {
    int *stack;    /* (n_layer * 3) job index + 1 of blk.L.ffn_*_exps, 0: not yet */
    int n_dropped; /* tensors of layers >= n_layer (MTP) */
};

/* "model.layers.N." -> N, else -1 */
static int hf_layer_of(const char *name)
{
    int l, n = 0;
    if (strncmp(name, "model.layers.", 13) || sscanf(name + 13, "%d.%n", &l, &n) != 1 || !n)
        return -1;
    return l;
}

/* One expert's HF tensor into its layer's stacked GGUF tensor (created at the first). */
static int hf_stack_expert(const struct st_tensor *s, int layer, int expert, enum expert_proj pr,
                           const struct model_config *c, int want, struct cv_job *job,
                           struct hf_gather *g, const char *where, struct weld_err *e)
{
    if (!model_layer_moe(c, layer) || expert >= c->n_expert)
        return err_set(e, WELD_ERR_FORMAT,
                       "%s: tensor '%s': config.json has %d experts from "
                       "layer %d on",
                       where, s->name, c->n_expert, c->n_dense_lead);
    int k = layer * 3 + (int)pr, rc;
    struct cv_tensor v = {0}; /* this expert's view */
    snprintf(v.name, sizeof v.name, "%s", s->name);
    if ((rc = hf_tensor_view(s, &v, where, e)))
        return rc;
    if (s->n_dims != 2)
        return err_set(e, WELD_ERR_FORMAT, "%s: tensor '%s': %d dimensions, expected 2", where,
                       s->name, s->n_dims);
    if ((rc = cv_check_view(s->name, v.src_type, v.rows, v.cols, s->nbytes, where, e)))
        return rc;
    if (!g->stack[k]) {
        struct cv_tensor *t = job_push(job);
        if (!t)
            return err_set(e, WELD_ERR_NOMEM, "convert: out of memory");
        *t = v;
        tensor_name_expert_gguf(layer, pr, t->name, sizeof t->name);
        t->parts = wcalloc((size_t)c->n_expert, sizeof *t->parts);
        if (!t->parts)
            return err_set(e, WELD_ERR_NOMEM, "convert: out of memory");
        t->n_parts = c->n_expert;
        t->rows = v.rows * c->n_expert;
        t->n_dims = 3;
        t->shape[0] = v.cols, t->shape[1] = v.rows, t->shape[2] = c->n_expert;
        t->dst_type = matrix_type(want, v.src_type, v.cols, t->name);
        if ((rc = cv_check_types(t, t->src_type, where, e)))
            return rc;
        g->stack[k] = job->n;
    }
    struct cv_tensor *t = &job->t[g->stack[k] - 1];
    if (v.src_type != t->src_type || v.rows * t->n_parts != t->rows || v.cols != t->cols)
        return err_set(e, WELD_ERR_FORMAT,
                       "%s: tensor '%s': %s %lld x %lld, but the layer's "
                       "other experts are %s %lld x %lld",
                       where, s->name, dtype_name(v.src_type), (long long)v.rows, (long long)v.cols,
                       dtype_name(t->src_type), (long long)(t->rows / t->n_parts),
                       (long long)t->cols);
    if (t->parts[expert])
        return err_set(e, WELD_ERR_FORMAT, "%s: tensor '%s' appears twice", where, s->name);
    t->parts[expert] = v.src;
    return WELD_OK;
}

/* Every MoE layer has all its experts' tensors. */
static int hf_check_stacks(const struct model_config *c, const struct cv_job *job,
                           const struct hf_gather *g, const char *where, struct weld_err *e)
{
    for (int l = c->n_dense_lead; c->n_expert > 0 && l < c->n_layer; l++)
        for (int p = 0; p < 3; p++) {
            int k = l * 3 + p, x = 0;
            const struct cv_tensor *t = g->stack[k] ? &job->t[g->stack[k] - 1] : NULL;
            while (t && x < c->n_expert && t->parts[x])
                x++;
            if (t && x == c->n_expert)
                continue;
            char name[96];
            tensor_name_expert_hf(l, x, (enum expert_proj)p, hf_style_of(c), name, sizeof name);
            return err_set(e, WELD_ERR_FORMAT,
                           "%s: tensor '%s' not found (layer %d has %d "
                           "routed experts)",
                           where, name, l, c->n_expert);
        }
    return WELD_OK;
}

/* HF kv_b_proj -> llama.cpp's attn_k_b and attn_v_b. */
static int hf_split_kv_b(const struct st_tensor *s, const char *gname, const struct model_config *c,
                         int want, struct cv_job *job, const char *where, struct weld_err *e)
{
    int64_t h = c->n_head, nope = c->qk_nope_dim, v = c->v_head_dim, lora = c->kv_lora_rank;
    struct cv_tensor src = {0};
    snprintf(src.name, sizeof src.name, "%s", s->name);
    int rc = hf_tensor_view(s, &src, where, e);
    if (rc)
        return rc;
    if (s->n_dims != 2 || s->shape[0] != h * (nope + v) || s->shape[1] != lora)
        return err_set(e, WELD_ERR_FORMAT,
                       "%s: tensor '%s': expected shape [%lld, %lld] "
                       "(heads * (qk_nope + v_head_dim), kv_lora_rank)",
                       where, s->name, (long long)(h * (nope + v)), (long long)lora);
    if ((rc = cv_check_view(s->name, src.src_type, src.rows, src.cols, s->nbytes, where, e)))
        return rc;
    int layer = 0;
    sscanf(gname, "blk.%d.", &layer);
    for (int part = KVB_K; part <= KVB_V; part++) {
        struct cv_tensor *t = job_push(job);
        if (!t)
            return err_set(e, WELD_ERR_NOMEM, "convert: out of memory");
        snprintf(t->name, sizeof t->name, "blk.%d.%s", layer,
                 part == KVB_K ? "attn_k_b.weight" : "attn_v_b.weight");
        t->src = src.src, t->src_type = src.src_type;
        t->kvb = part;
        t->kvb_heads = (int)h, t->kvb_nope = (int)nope, t->kvb_v = (int)v;
        t->kvb_lora = (int)lora;
        t->cols = part == KVB_K ? nope : lora;
        t->rows = part == KVB_K ? h * lora : h * v;
        t->n_dims = 3;
        t->shape[0] = t->cols, t->shape[1] = t->rows / h, t->shape[2] = h;
        t->dst_type = matrix_type(want, t->src_type, t->cols, t->name);
        if ((rc = cv_check_types(t, t->src_type, where, e)))
            return rc;
    }
    return WELD_OK;
}

static int hf_to_gguf_tensor(const struct st_tensor *s, const struct model_config *c, int want,
                             struct cv_job *job, struct hf_gather *g, const char *where,
                             struct weld_err *e)
{
    char gname[96];
    if (!strcmp(s->name, "lm_head.weight") && c->tied_embeddings)
        return WELD_OK;
    int layer = hf_layer_of(s->name), expert;
    enum expert_proj pr;
    if (layer >= c->n_layer && c->n_nextn > 0) { /* MTP: llama.cpp's converter drops them */
        g->n_dropped++;
        return WELD_OK;
    }
    if (tensor_name_expert_parse(s->name, &layer, &expert, &pr) == 0 && expert >= 0 &&
        layer < c->n_layer && c->n_expert > 0)
        return hf_stack_expert(s, layer, expert, pr, c, want, job, g, where, e);
    if (tensor_name_hf_to_gguf(s->name, gname, sizeof gname) != 0) {
        log_warn("%s: tensor '%s' is not part of the model; skipped", where, s->name);
        return WELD_OK;
    }
    if (c->kv_lora_rank > 0 && ends_with(gname, ".attn_kv_b.weight"))
        return hf_split_kv_b(s, gname, c, want, job, where, e);
    struct cv_tensor *t = job_push(job);
    if (!t)
        return err_set(e, WELD_ERR_NOMEM, "convert: out of memory");
    snprintf(t->name, sizeof t->name, "%s", gname);
    int rc = hf_tensor_view(s, t, where, e);
    if (rc)
        return rc;
    for (int d = 0; d < s->n_dims; d++)
        t->shape[d] = s->shape[s->n_dims - 1 - d];
    const struct dtype_info *wi = want >= 0 ? dtype_get(want) : NULL;
    if (s->n_dims == 2 && s->shape[0] == 1 && ends_with(gname, ".ffn_gate_inp_shexp.weight")) {
        t->n_dims = 1; /* llama.cpp's qwen2moe wants it 1-D */
        t->shape[1] = 1;
        t->dst_type = DT_F32;
    } else if (s->n_dims < 2) {
        t->dst_type = DT_F32;
    } else if (wi && wi->quantized && ends_with(gname, ".ffn_gate_inp.weight")) {
        t->dst_type = DT_F32; /* the router, as llama.cpp keeps it */
        t->keep_f32 = 1;
    } else {
        t->dst_type = matrix_type(want, s->dtype, t->cols, gname);
    }
    if (c->arch == ARCH_LLAMA && (strstr(gname, ".attn_q.") || strstr(gname, ".attn_k."))) {
        t->permute_heads = strstr(gname, ".attn_q.") ? c->n_head : c->n_kv_head;
        t->permute_to_gguf = 1;
        if (s->n_dims == 1) /* a bias: one element per row */
            t->rows = t->cols, t->cols = 1;
    }
    return cv_check(t, s->nbytes, where, e);
}

/* llama.cpp's tensor order: token_embd, blk.0 .. blk.N (numerically), output_norm, output;
   within a layer by name. Keeps a layer's weights together in the file. */
static int gguf_order_key(const char *name, long *layer)
{
    *layer = 0;
    if (!strncmp(name, "token_embd.", 11))
        return 0;
    if (sscanf(name, "blk.%ld.", layer) == 1)
        return 1;
    if (!strncmp(name, "output_norm.", 12))
        return 2;
    return 3;
}

static int gguf_order_cmp(const void *pa, const void *pb)
{
    const struct cv_tensor *a = pa, *b = pb;
    long la, lb;
    int ga = gguf_order_key(a->name, &la), gb = gguf_order_key(b->name, &lb);
    if (ga != gb)
        return ga - gb;
    if (la != lb)
        return la < lb ? -1 : 1;
    return strcmp(a->name, b->name);
}

static int gguf_add_all(struct gguf_writer *w, struct cv_job *job, struct weld_err *e)
{
    for (int i = 0; i < job->n; i++) {
        struct cv_tensor *t = &job->t[i];
        if (gguf_writer_add_tensor_fn(w, t->name, t->dst_type, t->n_dims, t->shape, cv_fill, t))
            return err_set(e, WELD_ERR_NOMEM, "convert: adding tensor '%s' failed", t->name);
    }
    return WELD_OK;
}

/* The matrices' common type, for general.file_type; notes the f16 fallbacks. */
static int job_main_type(const struct cv_job *job, int want)
{
    int n_f16 = 0, n_mat = 0;
    const char *first = NULL;
    for (int i = 0; want >= 0 && i < job->n; i++) {
        if (job->t[i].n_dims < 2 || job->t[i].keep_f32)
            continue;
        n_mat++;
        if (job->t[i].dst_type != want) {
            n_f16++;
            first = first ? first : job->t[i].name;
        }
    }
    if (n_f16)
        log_info("convert: %d matrices (%s, ...) have rows that are not whole %s blocks; kept "
                 "as f16", n_f16, first, dtype_name(want));
    if (want >= 0 && n_f16 < n_mat)
        return want;
    for (int i = 0; i < job->n; i++)
        if (job->t[i].n_dims >= 2 && !job->t[i].keep_f32)
            return job->t[i].dst_type;
    return DT_F32;
}

/* The common end of every conversion to GGUF: file type keys, the tensors, the write. */
static int gguf_finish(struct gguf_writer *w, struct cv_job *job,
                       const struct convert_opts *o, const char *out, struct weld_err *e)
{
    int main_type = job_main_type(job, o->dtype);
    const struct dtype_info *di = dtype_get(main_type);
    if (gguf_writer_set_u32(w, "general.file_type", ftype_of(main_type)) ||
        (di && di->quantized && gguf_writer_set_u32(w, "general.quantization_version", 2)))
        return err_set(e, WELD_ERR_NOMEM, "convert: out of memory");
    int rc = gguf_add_all(w, job, e);
    return rc ? rc : gguf_writer_write(w, out, e);
}

static int hf_to_gguf_meta(struct gguf_writer *w, struct model_config *c, const char *in,
                           struct tokmeta **tm, struct weld_err *e)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/tokenizer.json", in);
    if (file_exists(path)) {
        int rc = tokmeta_from_hf(tm, in, NULL, c->n_vocab, e);
        if (rc)
            return rc;
        if ((*tm)->n_tokens > c->n_vocab)
            log_warn("%s: the tokenizer has %lld tokens, more than vocab_size %d", in,
                     (long long)(*tm)->n_tokens, c->n_vocab);
    } else {
        log_warn("%s: no tokenizer.json; the GGUF will have no tokenizer", in);
    }
    if (!c->name[0]) {
        const char *base = strrchr(in, '/');
        snprintf(c->name, sizeof c->name, "%s", base && base[1] ? base + 1 : in);
    }
    int rc = model_config_to_gguf(c, w, e);
    if (rc)
        return rc;
    return *tm ? tokmeta_to_gguf(*tm, w, e) : WELD_OK;
}

static int hf_to_gguf(const char *in, const char *out, const struct convert_opts *o,
                      struct weld_err *e)
{
    struct st_set *s = NULL;
    struct tokmeta *tm = NULL;
    struct gguf_writer *w = NULL;
    struct cv_job job = {0};
    struct hf_gather gather = {0};
    struct model_config c;
    float *freqs = NULL;
    int rc = model_config_from_hf(in, &c, e);
    if (rc || (rc = st_open_dir(&s, in, e)))
        return rc;
    if (!c.tied_embeddings && !st_find(s, "lm_head.weight"))
        c.tied_embeddings = true;
    if (!(w = gguf_writer_create())) {
        rc = err_set(e, WELD_ERR_NOMEM, "convert: out of memory");
        goto out;
    }
    if ((rc = hf_to_gguf_meta(w, &c, in, &tm, e)))
        goto out;
    if (!(gather.stack = wcalloc((size_t)c.n_layer * 3, sizeof *gather.stack))) {
        rc = err_set(e, WELD_ERR_NOMEM, "convert: out of memory");
        goto out;
    }
    for (int i = 0; i < s->n_tensors; i++)
        if ((rc = hf_to_gguf_tensor(&s->tensors[i], &c, o->dtype, &job, &gather, in, e)))
            goto out;
    if ((rc = hf_check_stacks(&c, &job, &gather, in, e)))
        goto out;
    if (gather.n_dropped)
        log_info("convert: %s: dropped the %d multi-token-prediction layer%s (model.layers.%d "
                 "on, %d tensors), as llama.cpp's converter does; the GGUF predicts one token "
                 "per step",
                 in, c.n_nextn, c.n_nextn == 1 ? "" : "s", c.n_layer, gather.n_dropped);
    if (job.n)
        qsort(job.t, (size_t)job.n, sizeof *job.t, gguf_order_cmp);
    if (c.rope_scaling == ROPE_SCALING_LLAMA3) {
        int64_t ne[1] = {c.rope_dim / 2};
        freqs = wcalloc((size_t)c.rope_dim / 2 + 1, sizeof *freqs);
        if (!freqs) {
            rc = err_set(e, WELD_ERR_NOMEM, "convert: out of memory");
            goto out;
        }
        model_config_llama3_freq_factors(&c, freqs);
        if (gguf_writer_add_tensor(w, "rope_freqs.weight", DT_F32, 1, ne, freqs)) {
            rc = err_set(e, WELD_ERR_NOMEM, "convert: adding rope_freqs.weight failed");
            goto out;
        }
    }
    rc = gguf_finish(w, &job, o, out, e);
out:
    gguf_writer_free(w);
    job_free(&job);
    wfree(gather.stack);
    wfree(freqs);
    tokmeta_free(tm);
    st_close(s);
    return rc;
}

/* ---- GGUF -> GGUF ---- */

static int gguf_to_gguf(const char *in, const char *out, const struct convert_opts *o,
                        struct weld_err *e)
{
    struct gguf_file *f = NULL;
    struct gguf_writer *w = NULL;
    struct cv_job job = {0};
    int rc = gguf_open(&f, in, e);
    if (rc)
        return rc;
    if (!(w = gguf_writer_create())) {
        rc = err_set(e, WELD_ERR_NOMEM, "convert: out of memory");
        goto out;
    }
    if ((rc = gguf_writer_copy_kv(w, f, e)))
        goto out;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const struct gguf_tensor *g = &f->tensors[i];
        struct cv_tensor *t = job_push(&job);
        if (!t) {
            rc = err_set(e, WELD_ERR_NOMEM, "convert: out of memory");
            goto out;
        }
        snprintf(t->name, sizeof t->name, "%s", g->name);
        t->src = g->data;
        t->src_type = g->type;
        t->cols = g->ne[0];
        t->rows = 1;
        for (int d = 1; d < g->n_dims; d++)
            t->rows *= g->ne[d];
        t->n_dims = g->n_dims;
        memcpy(t->shape, g->ne, sizeof t->shape);
        const struct dtype_info *wi = o->dtype >= 0 ? dtype_get(o->dtype) : NULL;
        if (g->n_dims < 2) {
            t->dst_type = is_float_type(g->type) ? DT_F32 : (int)g->type;
        } else if (wi && wi->quantized && is_float_type(g->type) &&
                   ends_with(g->name, ".ffn_gate_inp.weight")) {
            t->dst_type = DT_F32; /* the router, as llama.cpp keeps it */
            t->keep_f32 = 1;
        } else {
            t->dst_type = matrix_type(o->dtype, g->type, t->cols, g->name);
        }
        if ((rc = cv_check(t, g->nbytes, in, e)))
            goto out;
    }
    rc = gguf_finish(w, &job, o, out, e);
out:
    gguf_writer_free(w);
    job_free(&job);
    gguf_close(f);
    return rc;
}

/* ---- HF -> HF ---- */

static int copy_if_exists(const char *in, const char *out, const char *name, struct weld_err *e)
{
    char src[4200], dst[4200];
    snprintf(src, sizeof src, "%s/%s", in, name);
    snprintf(dst, sizeof dst, "%s/%s", out, name);
    if (!file_exists(src))
        return WELD_OK;
    char *buf = NULL;
    size_t len = 0;
    int rc = file_read_all(src, &buf, &len, e);
    if (!rc)
        rc = file_write_all(dst, buf, len, e);
    wfree(buf);
    return rc;
}

static int hf_config_copy(const char *in, const char *out, int dst, struct weld_err *e)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", in);
    json_t *cfg = jload_file(path, e);
    if (!cfg)
        return e ? e->status : WELD_ERR_IO;
    json_object_set_new(cfg, "torch_dtype", json_string(torch_dtype_of(dst)));
    snprintf(path, sizeof path, "%s/config.json", out);
    int rc = jsave_file(cfg, path, e);
    json_decref(cfg);
    return rc;
}

static int hf_to_hf(const char *in, const char *out, const struct convert_opts *o,
                    struct weld_err *e)
{
    struct st_set *s = NULL;
    struct st_writer *w = NULL;
    struct cv_job job = {0};
    struct model_config c;
    int dst = o->dtype; /* -1: keep each tensor's type */
    if (dst >= 0 && !is_float_type(dst))
        return err_set(e, WELD_ERR_INVALID_ARG, "convert: %s: Hugging Face output holds f32, "
                       "f16 or bf16 tensors, not %s", out, dtype_name(dst));
    int rc = model_config_from_hf(in, &c, e);
    if (rc || (rc = st_open_dir(&s, in, e)))
        return rc;
    if (!(w = st_writer_create())) {
        rc = err_set(e, WELD_ERR_NOMEM, "convert: out of memory");
        goto out;
    }
    for (int i = 0; i < s->n_tensors; i++) {
        struct cv_tensor *t = job_push(&job);
        if (!t) {
            rc = err_set(e, WELD_ERR_NOMEM, "convert: out of memory");
            goto out;
        }
        snprintf(t->name, sizeof t->name, "%s", s->tensors[i].name);
        if ((rc = hf_tensor_view(&s->tensors[i], t, in, e)))
            goto out;
        memcpy(t->shape, s->tensors[i].shape, sizeof t->shape);
        t->dst_type = dst >= 0 ? dst : t->src_type;
        if ((rc = cv_check(t, s->tensors[i].nbytes, in, e)))
            goto out;
    }
    for (int i = 0; i < job.n; i++) { /* job.t no longer moves: hand out pointers */
        struct cv_tensor *t = &job.t[i];
        if (st_writer_add_fn(w, t->name, t->dst_type, t->n_dims, t->shape, cv_fill, t)) {
            rc = err_set(e, WELD_ERR_NOMEM, "convert: adding tensor '%s' failed", t->name);
            goto out;
        }
    }
    st_writer_set_metadata(w, "format", "pt");
    if ((rc = mkmodel_make_dir(out, e)) || (rc = st_writer_write_dir(w, out, o->shard_size, e)) ||
        (rc = hf_config_copy(in, out, dst >= 0 ? dst : job_main_type(&job, -1), e)))
        goto out;
    static const char *files[] = {"generation_config.json", "tokenizer.json",
                                  "tokenizer_config.json", "chat_template.jinja",
                                  "special_tokens_map.json"};
    for (size_t i = 0; !rc && i < sizeof files / sizeof files[0]; i++)
        rc = copy_if_exists(in, out, files[i], e);
out:
    st_writer_free(w);
    job_free(&job);
    st_close(s);
    return rc;
}

int convert_model(const char *in, const char *out, const struct convert_opts *o,
                  struct weld_err *e)
{
    if (o->dtype >= 0) {
        const struct dtype_info *di = dtype_get(o->dtype);
        if (!di || (!is_float_type(o->dtype) && !di->can_quantize))
            return err_set(e, WELD_ERR_INVALID_ARG, "convert: cannot write type %s",
                           dtype_name(o->dtype));
    }
    char where[4096]; /* a local path, or org/name in the Hugging Face cache */
    int rc = model_resolve_path(in, where, sizeof where, e);
    if (rc)
        return rc;
    in = where;
    int in_hf = is_dir(in), out_gguf = mkmodel_is_gguf_path(out);
    if (in_hf)
        return out_gguf ? hf_to_gguf(in, out, o, e) : hf_to_hf(in, out, o, e);
    return out_gguf ? gguf_to_gguf(in, out, o, e) : gguf_to_hf(in, out, o, e);
}

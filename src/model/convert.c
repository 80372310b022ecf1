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
 * a few MB even for 70B models) is decoded whole, permuted, then encoded.
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

struct cv_tensor {
    char name[96];        /* output name */
    const void *src;
    int src_type;
    int64_t rows, cols;   /* cols contiguous */
    int n_dims;
    int64_t shape[4];     /* output order: GGUF ne[] or HF shape */
    int dst_type;
    int permute_heads;    /* > 0: permute rows (heads of rows / permute_heads rows) */
    int permute_to_gguf;
};

struct cv_job {
    struct cv_tensor *t;
    int n, cap;
};

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

static int cv_fill(void *ctx, void *dst, size_t size, struct weld_err *e)
{
    const struct cv_tensor *t = ctx;
    size_t src_row = dtype_row_bytes(t->src_type, t->cols);
    size_t dst_row = dtype_row_bytes(t->dst_type, t->cols);
    if ((size_t)t->rows * dst_row != size)
        return err_set(e, WELD_ERR_INTERNAL, "convert: tensor '%s': writer asks %zu bytes, "
                       "expected %zu", t->name, size, (size_t)t->rows * dst_row);
    if (t->permute_heads)
        return cv_fill_permuted(t, dst, dst_row, e);
    if (t->src_type == t->dst_type) {
        memcpy(dst, t->src, size);
        return WELD_OK;
    }
    float *row = wmalloc((size_t)t->cols * sizeof *row);
    if (!row)
        return err_set(e, WELD_ERR_NOMEM, "convert: out of memory for '%s'", t->name);
    for (int64_t r = 0; r < t->rows; r++) {
        decode_row(t->src_type, (const uint8_t *)t->src + (size_t)r * src_row, row, t->cols);
        encode_row(t->dst_type, row, (uint8_t *)dst + (size_t)r * dst_row, t->cols);
    }
    wfree(row);
    return WELD_OK;
}

/* Check a source view and the output type before any writer sees it. */
static int cv_check(const struct cv_tensor *t, size_t src_bytes, const char *where,
                    struct weld_err *e)
{
    const struct dtype_info *si = dtype_get(t->src_type), *di = dtype_get(t->dst_type);
    if (!si || (t->src_type != DT_F32 && t->src_type != DT_F16 && t->src_type != DT_BF16 &&
                !si->can_dequantize))
        return err_set(e, WELD_ERR_UNSUPPORTED, "%s: tensor '%s': type %s cannot be converted",
                       where, t->name, dtype_name(t->src_type));
    if (!di || (t->dst_type != DT_F32 && t->dst_type != DT_F16 && t->dst_type != DT_BF16 &&
                !di->can_quantize && t->dst_type != t->src_type))
        return err_set(e, WELD_ERR_UNSUPPORTED, "%s: tensor '%s': cannot write type %s", where,
                       t->name, dtype_name(t->dst_type));
    size_t row = dtype_row_bytes(t->src_type, t->cols);
    if (t->rows <= 0 || t->cols <= 0 || row == 0 || dtype_row_bytes(t->dst_type, t->cols) == 0 ||
        (uint64_t)t->rows > SIZE_MAX / row || (size_t)t->rows * row != src_bytes)
        return err_set(e, WELD_ERR_FORMAT, "%s: tensor '%s': %zu bytes do not hold %lld rows "
                       "of %lld %s elements", where, t->name, src_bytes, (long long)t->rows,
                       (long long)t->cols, dtype_name(t->src_type));
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

static int gguf_to_hf_tensors(const struct gguf_file *f, const struct model_config *c,
                              int dst_float, struct cv_job *job, struct st_writer *w,
                              struct weld_err *e)
{
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const struct gguf_tensor *g = &f->tensors[i];
        if (!strcmp(g->name, "rope_freqs.weight"))
            continue;
        struct cv_tensor *t = job_push(job);
        if (!t)
            return err_set(e, WELD_ERR_NOMEM, "convert: out of memory");
        if (tensor_name_gguf_to_hf(g->name, t->name, sizeof t->name) != 0)
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
        t->dst_type = dst_float;
        if (c->arch == ARCH_LLAMA && (strstr(g->name, ".attn_q.") || strstr(g->name, ".attn_k."))) {
            t->permute_heads = strstr(g->name, ".attn_q.") ? c->n_head : c->n_kv_head;
            t->permute_to_gguf = 0;
        }
        int rc = cv_check(t, g->nbytes, f->path, e);
        if (rc)
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
    wfree(job.t);
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

static int hf_to_gguf_tensor(const struct st_tensor *s, const struct model_config *c, int want,
                             struct cv_job *job, const char *where, struct weld_err *e)
{
    char gname[96];
    if (!strcmp(s->name, "lm_head.weight") && c->tied_embeddings)
        return WELD_OK;
    if (tensor_name_hf_to_gguf(s->name, gname, sizeof gname) != 0) {
        log_warn("%s: tensor '%s' is not part of the model; skipped", where, s->name);
        return WELD_OK;
    }
    struct cv_tensor *t = job_push(job);
    if (!t)
        return err_set(e, WELD_ERR_NOMEM, "convert: out of memory");
    snprintf(t->name, sizeof t->name, "%s", gname);
    int rc = hf_tensor_view(s, t, where, e);
    if (rc)
        return rc;
    for (int d = 0; d < s->n_dims; d++)
        t->shape[d] = s->shape[s->n_dims - 1 - d];
    t->dst_type = s->n_dims < 2 ? DT_F32 : matrix_type(want, s->dtype, t->cols, gname);
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
        n_mat += job->t[i].n_dims >= 2;
        if (job->t[i].n_dims >= 2 && job->t[i].dst_type != want) {
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
        if (job->t[i].n_dims >= 2)
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
    for (int i = 0; i < s->n_tensors; i++)
        if ((rc = hf_to_gguf_tensor(&s->tensors[i], &c, o->dtype, &job, in, e)))
            goto out;
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
    wfree(job.t);
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
        if (g->n_dims < 2)
            t->dst_type = is_float_type(g->type) ? DT_F32 : (int)g->type;
        else
            t->dst_type = matrix_type(o->dtype, g->type, t->cols, g->name);
        if ((rc = cv_check(t, g->nbytes, in, e)))
            goto out;
    }
    rc = gguf_finish(w, &job, o, out, e);
out:
    gguf_writer_free(w);
    wfree(job.t);
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
    wfree(job.t);
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

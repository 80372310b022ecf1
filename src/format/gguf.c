/*
 * gguf - reader and writer for GGUF v2/v3 files; see gguf.h for the file layout.
 *
 * Reader design. The whole file is one read-only view (mmapped, or caller memory for
 * gguf_open_memory). A cursor (struct rd) walks the header; every primitive read goes
 * through rd_need(), which checks the bytes remaining BEFORE touching them and writes
 * "<file>: offset N: <what>: ..." on failure, so no path can read past the end. Counts
 * that size an allocation are bounded by the bytes that could hold them first (a kv needs
 * at least 13 bytes, a tensor info 32, an array string 8), so a hostile header cannot make
 * us allocate more than a small multiple of the file size. Nested arrays (which nothing
 * uses) are walked to find their end, to a depth of GGUF_MAX_NEST, and reported with
 * arr_data NULL and arr_type GGUF_TYPE_COUNT.
 *
 * Tensor infos are validated as they are read: 1..4 dims, each ne in [0, 2^63), the element
 * count free of overflow, a known type, ne[0] a multiple of the block size, the offset a
 * multiple of the alignment, and [data_offset + offset, + nbytes) inside the file. Keys and
 * tensor names must be unique, non-empty and free of NUL bytes; uniqueness and gguf_find_*
 * use an open-addressing hash table (xxhash) kept next to the public struct (struct
 * gguf_priv wraps struct gguf_file), so files with many keys stay O(n). Other limits:
 * at most 2^31 - 1 keys and tensors, general.alignment (any integer type) a power of two
 * up to 2^30. An opened file is never modified, so any number of threads may read it.
 *
 * Writer design. Keys are stored already serialized (the value bytes that follow the type
 * field), in insertion order; setting a key again replaces its bytes. Tensors keep a data
 * pointer or a fill callback; offsets are assigned at write time, each tensor padded to the
 * alignment (32, or general.alignment when set as a u32). The file is written to
 * "<path>.tmp" with stdio and renamed into place only when everything succeeded, so a
 * failed conversion never leaves a truncated model under the real name. A writer is used
 * from one thread. Its set/add calls return WELD_ERR_INVALID_ARG for bad arguments (empty
 * key, duplicate tensor, ne[0] not a multiple of the block size, general.alignment that is
 * not a u32 power of two) and WELD_ERR_NOMEM; gguf_writer_write fills a message.
 *
 * Not done on purpose: big-endian GGUF files (rejected with a hint), GGUF v1, in-place
 * editing, and checks that tensor data regions do not overlap (llama.cpp writes them
 * back to back, but a reader that only points into the file does not need it).
 */
#include "format/gguf.h"

#include "core/alloc.h"
#include "core/fp16.h"
#include "core/log.h"
#include "core/progress.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <float.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#define GGUF_MAGIC "GGUF"
#define GGUF_MAX_NEST 8
#define GGUF_MAX_ALIGNMENT (1u << 30)
#define GGUF_MIN_KV_BYTES 13     /* key length (8) + type (4) + smallest value (1) */
#define GGUF_MIN_TENSOR_BYTES 32 /* name length (8) + n_dims (4) + ne[0] (8) + type + offset */

/* ------------------------------------------------------------------------------------ */
/* name index: open addressing over indices into an array of names                      */

struct name_index {
    uint32_t *slots; /* cap entries; 0 = empty, else index + 1 */
    size_t cap;      /* power of two, >= 2 * count */
};

static uint64_t name_hash(const char *s) { return XXH3_64bits(s, strlen(s)); }

static int name_index_init(struct name_index *ix, uint64_t n)
{
    size_t cap = 16;
    while (cap < 2 * n)
        cap *= 2;
    ix->slots = wcalloc(cap, sizeof *ix->slots);
    ix->cap = cap;
    return ix->slots ? WELD_OK : WELD_ERR_NOMEM;
}

/* Look up s; names(i) gives the name of entry i. Returns the slot (empty or matching). */
static size_t name_index_slot(const struct name_index *ix, const char *s,
                              const char *(*names)(const void *, uint32_t), const void *ctx)
{
    size_t mask = ix->cap - 1, i = (size_t)name_hash(s) & mask;
    while (ix->slots[i] && strcmp(names(ctx, ix->slots[i] - 1), s) != 0)
        i = (i + 1) & mask;
    return i;
}

static const char *kv_name(const void *ctx, uint32_t i)
{
    return ((const struct gguf_file *)ctx)->kv[i].key;
}

static const char *tensor_name(const void *ctx, uint32_t i)
{
    return ((const struct gguf_file *)ctx)->tensors[i].name;
}

struct gguf_priv {
    struct gguf_file pub; /* first, so a struct gguf_file * is a struct gguf_priv * */
    struct name_index kv_ix, tensor_ix;
};

/* ------------------------------------------------------------------------------------ */
/* bounds-checked cursor                                                                 */

struct rd {
    const uint8_t *p;
    size_t size, pos;
    const char *name;
    struct weld_err *e;
};

static int rd_need(struct rd *r, uint64_t n, const char *what)
{
    if (n > r->size - r->pos)
        return err_set(r->e, WELD_ERR_FORMAT,
                       "%s: offset %zu: %s: need %" PRIu64 " bytes but only %zu remain "
                       "(file truncated?)",
                       r->name, r->pos, what, n, r->size - r->pos);
    return WELD_OK;
}

static uint64_t ld_le(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static int rd_uint(struct rd *r, int n, uint64_t *out, const char *what)
{
    int rc = rd_need(r, (uint64_t)n, what);
    if (rc)
        return rc;
    *out = ld_le(r->p + r->pos, n);
    r->pos += (size_t)n;
    return WELD_OK;
}

static int rd_u32(struct rd *r, uint32_t *out, const char *what)
{
    uint64_t v = 0;
    int rc = rd_uint(r, 4, &v, what);
    *out = (uint32_t)v;
    return rc;
}

static int rd_str(struct rd *r, struct gguf_str *s, const char *what)
{
    uint64_t len;
    int rc = rd_uint(r, 8, &len, what);
    if (rc)
        return rc;
    if (len > r->size - r->pos)
        return err_set(r->e, WELD_ERR_FORMAT,
                       "%s: offset %zu: %s: string length %" PRIu64 " exceeds the %zu bytes "
                       "remaining",
                       r->name, r->pos - 8, what, len, r->size - r->pos);
    s->ptr = (const char *)r->p + r->pos;
    s->len = len;
    r->pos += (size_t)len;
    return WELD_OK;
}

/* A NUL-terminated heap copy of a key or tensor name (no embedded NULs, non-empty). */
static int rd_name(struct rd *r, char **out, const char *what)
{
    size_t at = r->pos;
    struct gguf_str s;
    int rc = rd_str(r, &s, what);
    if (rc)
        return rc;
    if (s.len == 0)
        return err_set(r->e, WELD_ERR_FORMAT, "%s: offset %zu: %s is empty", r->name, at, what);
    if (memchr(s.ptr, 0, (size_t)s.len))
        return err_set(r->e, WELD_ERR_FORMAT, "%s: offset %zu: %s contains a NUL byte",
                       r->name, at, what);
    *out = wstrndup(s.ptr, (size_t)s.len);
    if (!*out)
        return err_set(r->e, WELD_ERR_NOMEM, "%s: out of memory", r->name);
    return WELD_OK;
}

/* ------------------------------------------------------------------------------------ */
/* values                                                                                */

static const char *const type_names[GGUF_TYPE_COUNT] = {
    "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64",
};

const char *gguf_type_name(enum gguf_type t)
{
    return (unsigned)t < GGUF_TYPE_COUNT ? type_names[t] : "unknown";
}

/* Bytes of one scalar of type t; 0 for STRING, ARRAY and unknown types. */
static int type_size(uint32_t t)
{
    switch (t) {
    case GGUF_TYPE_UINT8: case GGUF_TYPE_INT8: case GGUF_TYPE_BOOL: return 1;
    case GGUF_TYPE_UINT16: case GGUF_TYPE_INT16: return 2;
    case GGUF_TYPE_UINT32: case GGUF_TYPE_INT32: case GGUF_TYPE_FLOAT32: return 4;
    case GGUF_TYPE_UINT64: case GGUF_TYPE_INT64: case GGUF_TYPE_FLOAT64: return 8;
    default: return 0;
    }
}

static bool type_is_signed(uint32_t t)
{
    return t == GGUF_TYPE_INT8 || t == GGUF_TYPE_INT16 || t == GGUF_TYPE_INT32 ||
           t == GGUF_TYPE_INT64;
}

static bool type_is_unsigned(uint32_t t)
{
    return t == GGUF_TYPE_UINT8 || t == GGUF_TYPE_UINT16 || t == GGUF_TYPE_UINT32 ||
           t == GGUF_TYPE_UINT64;
}

static int64_t sign_extend(uint64_t v, int bytes)
{
    if (bytes == 8)
        return (int64_t)v;
    int shift = 64 - 8 * bytes;
    return (int64_t)(v << shift) >> shift;
}

/* Decode one scalar of type t from p (little-endian) into kv->v. */
static void decode_scalar(uint32_t t, const uint8_t *p, struct gguf_kv *kv)
{
    int n = type_size(t);
    uint64_t raw = ld_le(p, n);
    if (t == GGUF_TYPE_FLOAT32)
        kv->v.f64 = f32_from_bits((uint32_t)raw);
    else if (t == GGUF_TYPE_FLOAT64)
        memcpy(&kv->v.f64, &raw, 8);
    else if (t == GGUF_TYPE_BOOL)
        kv->v.u64 = raw != 0;
    else if (type_is_signed(t))
        kv->v.i64 = sign_extend(raw, n);
    else
        kv->v.u64 = raw;
}

static int read_array(struct rd *r, struct gguf_kv *kv, int depth);

/* Skip the body of a nested array (element type + count + elements). */
static int skip_array(struct rd *r, const char *key, int depth)
{
    if (depth > GGUF_MAX_NEST)
        return err_set(r->e, WELD_ERR_FORMAT, "%s: offset %zu: key '%s': arrays nested deeper "
                       "than %d", r->name, r->pos, key, GGUF_MAX_NEST);
    struct gguf_kv tmp;
    memset(&tmp, 0, sizeof tmp);
    tmp.key = (char *)key;
    int rc = read_array(r, &tmp, depth);
    wfree(tmp.arr_str);
    return rc;
}

static int read_str_array(struct rd *r, struct gguf_kv *kv, uint64_t n)
{
    if (n > (r->size - r->pos) / 8)
        return err_set(r->e, WELD_ERR_FORMAT, "%s: offset %zu: key '%s': %" PRIu64 " strings "
                       "cannot fit in the %zu bytes remaining",
                       r->name, r->pos, kv->key, n, r->size - r->pos);
    if (n == 0)
        return WELD_OK;
    kv->arr_str = wcalloc((size_t)n, sizeof *kv->arr_str);
    if (!kv->arr_str)
        return err_set(r->e, WELD_ERR_NOMEM, "%s: key '%s': out of memory for %" PRIu64
                       " strings", r->name, kv->key, n);
    for (uint64_t i = 0; i < n; i++) {
        int rc = rd_str(r, &kv->arr_str[i], "array string");
        if (rc)
            return err_prefix(r->e, "key '%s': element %" PRIu64, kv->key, i);
    }
    return WELD_OK;
}

/* Element type, count and elements of an array value. */
static int read_array(struct rd *r, struct gguf_kv *kv, int depth)
{
    size_t at = r->pos;
    uint32_t et;
    uint64_t n;
    int rc = rd_u32(r, &et, "array element type");
    if (!rc)
        rc = rd_uint(r, 8, &n, "array length");
    if (rc)
        return err_prefix(r->e, "key '%s'", kv->key);
    if (et >= GGUF_TYPE_COUNT)
        return err_set(r->e, WELD_ERR_FORMAT, "%s: offset %zu: key '%s': unknown array element "
                       "type %" PRIu32, r->name, at, kv->key, et);
    kv->arr_n = n;
    kv->arr_type = (enum gguf_type)et;
    if (et == GGUF_TYPE_STRING)
        return read_str_array(r, kv, n);
    if (et == GGUF_TYPE_ARRAY) {
        kv->arr_type = GGUF_TYPE_COUNT;
        if (n > (r->size - r->pos) / 12)
            return err_set(r->e, WELD_ERR_FORMAT, "%s: offset %zu: key '%s': %" PRIu64 " nested "
                           "arrays cannot fit in the %zu bytes remaining",
                           r->name, r->pos, kv->key, n, r->size - r->pos);
        for (uint64_t i = 0; i < n; i++)
            if ((rc = skip_array(r, kv->key, depth + 1)))
                return rc;
        return WELD_OK;
    }
    int es = type_size(et);
    if (n > (r->size - r->pos) / (uint64_t)es)
        return err_set(r->e, WELD_ERR_FORMAT, "%s: offset %zu: key '%s': array of %" PRIu64
                       " %s needs more than the %zu bytes remaining",
                       r->name, r->pos, kv->key, n, gguf_type_name(et), r->size - r->pos);
    kv->arr_data = r->p + r->pos;
    r->pos += (size_t)(n * (uint64_t)es);
    return WELD_OK;
}

static int read_kv(struct rd *r, struct gguf_kv *kv)
{
    int rc = rd_name(r, &kv->key, "key");
    if (rc)
        return rc;
    uint32_t t;
    if ((rc = rd_u32(r, &t, "value type")))
        return err_prefix(r->e, "key '%s'", kv->key);
    if (t >= GGUF_TYPE_COUNT)
        return err_set(r->e, WELD_ERR_FORMAT, "%s: offset %zu: key '%s': unknown value type %"
                       PRIu32, r->name, r->pos - 4, kv->key, t);
    kv->type = (enum gguf_type)t;
    if (t == GGUF_TYPE_STRING) {
        if ((rc = rd_str(r, &kv->v.str, "string value")))
            return err_prefix(r->e, "key '%s'", kv->key);
    } else if (t == GGUF_TYPE_ARRAY) {
        if ((rc = read_array(r, kv, 0)))
            return rc;
    } else {
        if ((rc = rd_need(r, (uint64_t)type_size(t), "value")))
            return err_prefix(r->e, "key '%s'", kv->key);
        decode_scalar(t, r->p + r->pos, kv);
        r->pos += (size_t)type_size(t);
    }
    return WELD_OK;
}

/* ------------------------------------------------------------------------------------ */
/* header                                                                                */

static int read_header(struct rd *r, struct gguf_file *f)
{
    if (r->size < 4 || memcmp(r->p, GGUF_MAGIC, 4) != 0) {
        if (r->size < 4)
            return err_set(r->e, WELD_ERR_FORMAT, "%s: not a GGUF file (%zu bytes, too short "
                           "for the magic)", r->name, r->size);
        return err_set(r->e, WELD_ERR_FORMAT, "%s: offset 0: not a GGUF file (magic "
                       "%02x %02x %02x %02x, expected \"GGUF\")",
                       r->name, r->p[0], r->p[1], r->p[2], r->p[3]);
    }
    r->pos = 4;
    int rc = rd_u32(r, &f->version, "version");
    if (rc)
        return rc;
    if (f->version == 1)
        return err_set(r->e, WELD_ERR_UNSUPPORTED, "%s: offset 4: GGUF version 1 is not "
                       "supported (re-convert the model with a current llama.cpp)", r->name);
    if (f->version != 2 && f->version != 3) {
        const char *hint = (f->version & 0xffff) == 0 ? " (a big-endian GGUF file?)" : "";
        return err_set(r->e, WELD_ERR_FORMAT, "%s: offset 4: unknown GGUF version %" PRIu32
                       "%s; weld reads versions 2 and 3", r->name, f->version, hint);
    }
    if ((rc = rd_uint(r, 8, &f->n_tensors, "tensor count")) ||
        (rc = rd_uint(r, 8, &f->n_kv, "key/value count")))
        return rc;
    size_t left = r->size - r->pos;
    if (f->n_kv > left / GGUF_MIN_KV_BYTES)
        return err_set(r->e, WELD_ERR_FORMAT, "%s: offset 16: key/value count %" PRIu64
                       " is impossible: the %zu bytes after the header hold at most %zu",
                       r->name, f->n_kv, left, left / GGUF_MIN_KV_BYTES);
    if (f->n_tensors > left / GGUF_MIN_TENSOR_BYTES)
        return err_set(r->e, WELD_ERR_FORMAT, "%s: offset 8: tensor count %" PRIu64
                       " is impossible: the %zu bytes after the header hold at most %zu",
                       r->name, f->n_tensors, left, left / GGUF_MIN_TENSOR_BYTES);
    if (f->n_kv > INT32_MAX || f->n_tensors > INT32_MAX)
        return err_set(r->e, WELD_ERR_UNSUPPORTED, "%s: %" PRIu64 " keys and %" PRIu64
                       " tensors: weld supports at most 2^31 - 1 of each",
                       r->name, f->n_kv, f->n_tensors);
    return WELD_OK;
}

static int read_kvs(struct rd *r, struct gguf_priv *g)
{
    struct gguf_file *f = &g->pub;
    uint64_t n = f->n_kv;
    f->n_kv = 0; /* counts the entries that hold allocations, for cleanup */
    f->kv = wcalloc(n ? (size_t)n : 1, sizeof *f->kv);
    int rc = f->kv ? name_index_init(&g->kv_ix, n) : WELD_ERR_NOMEM;
    if (rc)
        return err_set(r->e, WELD_ERR_NOMEM, "%s: out of memory for %" PRIu64 " keys",
                       r->name, n);
    for (uint64_t i = 0; i < n; i++) {
        size_t at = r->pos;
        f->n_kv = i + 1;
        if ((rc = read_kv(r, &f->kv[i])))
            return rc;
        size_t s = name_index_slot(&g->kv_ix, f->kv[i].key, kv_name, f);
        if (g->kv_ix.slots[s])
            return err_set(r->e, WELD_ERR_FORMAT, "%s: offset %zu: duplicate key '%s'",
                           r->name, at, f->kv[i].key);
        g->kv_ix.slots[s] = (uint32_t)i + 1;
    }
    return WELD_OK;
}

/* general.alignment: any integer type, a power of two up to 2^30. */
static int read_alignment(struct rd *r, struct gguf_file *f)
{
    f->alignment = GGUF_DEFAULT_ALIGNMENT;
    const struct gguf_kv *kv = gguf_find_kv(f, "general.alignment");
    if (!kv)
        return WELD_OK;
    uint64_t a;
    if (type_is_unsigned(kv->type))
        a = kv->v.u64;
    else if (type_is_signed(kv->type) && kv->v.i64 > 0)
        a = (uint64_t)kv->v.i64;
    else
        return err_set(r->e, WELD_ERR_FORMAT, "%s: key 'general.alignment': must be an "
                       "unsigned integer, found %s", r->name, gguf_type_name(kv->type));
    if (a == 0 || (a & (a - 1)) != 0 || a > GGUF_MAX_ALIGNMENT)
        return err_set(r->e, WELD_ERR_FORMAT, "%s: key 'general.alignment': %" PRIu64
                       " is not a power of two in [1, 2^30]", r->name, a);
    f->alignment = a;
    return WELD_OK;
}

/* Shape and type of one tensor info; the offset is checked once data_offset is known. */
static int check_tensor_shape(struct rd *r, size_t at, struct gguf_tensor *t, uint32_t type)
{
    const struct dtype_info *di = dtype_get((int)type);
    if (!di)
        return err_set(r->e, WELD_ERR_FORMAT, "%s: offset %zu: tensor '%s': unknown type %"
                       PRIu32, r->name, at, t->name, type);
    t->type = (enum weld_dtype)type;
    int64_t count = 1;
    for (int d = 0; d < GGUF_MAX_DIMS; d++) {
        if (t->ne[d] < 0)
            return err_set(r->e, WELD_ERR_FORMAT, "%s: offset %zu: tensor '%s': ne[%d] = %"
                           PRIu64 " is out of range", r->name, at, t->name, d,
                           (uint64_t)t->ne[d]);
        if (t->ne[d] != 0 && count > INT64_MAX / t->ne[d])
            return err_set(r->e, WELD_ERR_FORMAT, "%s: offset %zu: tensor '%s': element count "
                           "overflows (ne = [%" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64
                           "])", r->name, at, t->name, t->ne[0], t->ne[1], t->ne[2], t->ne[3]);
        count *= t->ne[d];
    }
    if (t->ne[0] % di->block_size != 0)
        return err_set(r->e, WELD_ERR_FORMAT, "%s: offset %zu: tensor '%s': ne[0] = %" PRId64
                       " is not a multiple of the %s block size %d",
                       r->name, at, t->name, t->ne[0], di->name, di->block_size);
    uint64_t blocks = (uint64_t)(count / di->block_size);
    if (blocks > SIZE_MAX / di->type_size)
        return err_set(r->e, WELD_ERR_FORMAT, "%s: offset %zu: tensor '%s': byte size "
                       "overflows", r->name, at, t->name);
    t->nbytes = (size_t)blocks * di->type_size;
    return WELD_OK;
}

static int read_tensor_info(struct rd *r, struct gguf_tensor *t)
{
    size_t at = r->pos;
    int rc = rd_name(r, &t->name, "tensor name");
    if (rc)
        return rc;
    uint32_t n_dims, type;
    if ((rc = rd_u32(r, &n_dims, "tensor dimension count")))
        return err_prefix(r->e, "tensor '%s'", t->name);
    if (n_dims < 1 || n_dims > GGUF_MAX_DIMS)
        return err_set(r->e, WELD_ERR_FORMAT, "%s: offset %zu: tensor '%s': %" PRIu32
                       " dimensions (must be 1 to %d)", r->name, r->pos - 4, t->name, n_dims,
                       GGUF_MAX_DIMS);
    t->n_dims = (int)n_dims;
    for (int d = 0; d < GGUF_MAX_DIMS; d++) {
        uint64_t ne = 1;
        if ((uint32_t)d < n_dims && (rc = rd_uint(r, 8, &ne, "tensor dimension")))
            return err_prefix(r->e, "tensor '%s'", t->name);
        t->ne[d] = ne > (uint64_t)INT64_MAX ? -1 : (int64_t)ne;
    }
    if ((rc = rd_u32(r, &type, "tensor type")) ||
        (rc = rd_uint(r, 8, &t->offset, "tensor data offset")))
        return err_prefix(r->e, "tensor '%s'", t->name);
    return check_tensor_shape(r, at, t, type);
}

static int read_tensor_infos(struct rd *r, struct gguf_priv *g, size_t *info_at)
{
    struct gguf_file *f = &g->pub;
    uint64_t n = f->n_tensors;
    f->n_tensors = 0;
    f->tensors = wcalloc(n ? (size_t)n : 1, sizeof *f->tensors);
    int rc = f->tensors ? name_index_init(&g->tensor_ix, n) : WELD_ERR_NOMEM;
    if (rc)
        return err_set(r->e, WELD_ERR_NOMEM, "%s: out of memory for %" PRIu64 " tensors",
                       r->name, n);
    for (uint64_t i = 0; i < n; i++) {
        info_at[i] = r->pos;
        f->n_tensors = i + 1;
        if ((rc = read_tensor_info(r, &f->tensors[i])))
            return rc;
        size_t s = name_index_slot(&g->tensor_ix, f->tensors[i].name, tensor_name, f);
        if (g->tensor_ix.slots[s])
            return err_set(r->e, WELD_ERR_FORMAT, "%s: offset %zu: duplicate tensor name '%s'",
                           r->name, info_at[i], f->tensors[i].name);
        g->tensor_ix.slots[s] = (uint32_t)i + 1;
    }
    return WELD_OK;
}

/* Pad to the alignment, then check every tensor's offset and extent against the file. */
static int place_tensors(struct rd *r, struct gguf_file *f, const size_t *info_at)
{
    uint64_t a = f->alignment, pos = r->pos;
    f->data_offset = (pos + a - 1) / a * a; /* pos < 2^63 and a <= 2^30: no overflow */
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        struct gguf_tensor *t = &f->tensors[i];
        if (t->offset % a != 0)
            return err_set(r->e, WELD_ERR_FORMAT, "%s: offset %zu: tensor '%s': data offset %"
                           PRIu64 " is not a multiple of the alignment %" PRIu64,
                           r->name, info_at[i], t->name, t->offset, a);
        uint64_t begin = f->data_offset + t->offset; /* may wrap: checked next */
        if (t->offset > r->size || begin > r->size || begin < f->data_offset ||
            t->nbytes > r->size - begin)
            return err_set(r->e, WELD_ERR_FORMAT, "%s: offset %zu: tensor '%s': data [%" PRIu64
                           ", %" PRIu64 ") past end of file (size %zu)", r->name, info_at[i],
                           t->name, begin, begin + (uint64_t)t->nbytes, r->size);
        t->data = r->p + begin;
    }
    return WELD_OK;
}

static int parse(struct gguf_priv *g, struct weld_err *e)
{
    struct gguf_file *f = &g->pub;
    struct rd r = {f->map.data, f->map.size, 0, f->path, e};
    int rc = read_header(&r, f);
    if (!rc)
        rc = read_kvs(&r, g);
    if (!rc)
        rc = read_alignment(&r, f);
    if (rc)
        return rc;
    size_t *info_at = wcalloc(f->n_tensors ? (size_t)f->n_tensors : 1, sizeof *info_at);
    if (!info_at)
        return err_set(e, WELD_ERR_NOMEM, "%s: out of memory", f->path);
    rc = read_tensor_infos(&r, g, info_at);
    if (!rc)
        rc = place_tensors(&r, f, info_at);
    wfree(info_at);
    return rc;
}

static int open_common(struct gguf_file **out, struct gguf_priv *g, struct weld_err *e)
{
    int rc = parse(g, e);
    if (rc) {
        gguf_close(&g->pub);
        return rc;
    }
    *out = &g->pub;
    return WELD_OK;
}

static struct gguf_priv *priv_create(const char *name, struct weld_err *e)
{
    struct gguf_priv *g = wcalloc(1, sizeof *g);
    if (g)
        g->pub.path = wstrdup(name ? name : "(memory)");
    if (!g || !g->pub.path) {
        wfree(g);
        err_set(e, WELD_ERR_NOMEM, "%s: out of memory", name ? name : "(memory)");
        return NULL;
    }
    return g;
}

int gguf_open(struct gguf_file **out, const char *path, struct weld_err *e)
{
    *out = NULL;
    struct gguf_priv *g = priv_create(path, e);
    if (!g)
        return WELD_ERR_NOMEM;
    int rc = mfile_open(&g->pub.map, path, e);
    if (rc) {
        gguf_close(&g->pub);
        return rc;
    }
    return open_common(out, g, e);
}

int gguf_open_memory(struct gguf_file **out, const void *data, size_t size, const char *name,
                     struct weld_err *e)
{
    *out = NULL;
    struct gguf_priv *g = priv_create(name, e);
    if (!g)
        return WELD_ERR_NOMEM;
    mfile_wrap(&g->pub.map, data, size);
    return open_common(out, g, e);
}

void gguf_close(struct gguf_file *f)
{
    if (!f)
        return;
    struct gguf_priv *g = (struct gguf_priv *)f;
    /* counts read from the header describe the arrays only once they are allocated */
    for (uint64_t i = 0; f->kv && i < f->n_kv; i++) {
        wfree(f->kv[i].key);
        wfree(f->kv[i].arr_str);
    }
    for (uint64_t i = 0; f->tensors && i < f->n_tensors; i++)
        wfree(f->tensors[i].name);
    wfree(f->kv);
    wfree(f->tensors);
    wfree(g->kv_ix.slots);
    wfree(g->tensor_ix.slots);
    mfile_close(&f->map);
    wfree(f->path);
    wfree(g);
}

/* ------------------------------------------------------------------------------------ */
/* lookups and typed getters                                                             */

const struct gguf_kv *gguf_find_kv(const struct gguf_file *f, const char *key)
{
    const struct gguf_priv *g = (const struct gguf_priv *)f;
    if (!f || !key || !g->kv_ix.slots)
        return NULL;
    size_t s = name_index_slot(&g->kv_ix, key, kv_name, f);
    return g->kv_ix.slots[s] ? &f->kv[g->kv_ix.slots[s] - 1] : NULL;
}

const struct gguf_tensor *gguf_find_tensor(const struct gguf_file *f, const char *name)
{
    const struct gguf_priv *g = (const struct gguf_priv *)f;
    if (!f || !name || !g->tensor_ix.slots)
        return NULL;
    size_t s = name_index_slot(&g->tensor_ix, name, tensor_name, f);
    return g->tensor_ix.slots[s] ? &f->tensors[g->tensor_ix.slots[s] - 1] : NULL;
}

static const struct gguf_kv *find_typed(const struct gguf_file *f, const char *key, int *rc)
{
    const struct gguf_kv *kv = gguf_find_kv(f, key);
    *rc = kv ? WELD_OK : WELD_ERR_NOT_FOUND;
    return kv;
}

static int bad_type(const struct gguf_file *f, const struct gguf_kv *kv, const char *want,
                    struct weld_err *e)
{
    return err_set(e, WELD_ERR_FORMAT, "%s: key '%s': expected %s, found %s", f->path, kv->key,
                   want, kv->type == GGUF_TYPE_ARRAY ? "an array" : gguf_type_name(kv->type));
}

static int out_of_range(const struct gguf_file *f, const struct gguf_kv *kv, const char *want,
                        struct weld_err *e)
{
    if (type_is_signed(kv->type))
        return err_set(e, WELD_ERR_FORMAT, "%s: key '%s': value %" PRId64 " does not fit in %s",
                       f->path, kv->key, kv->v.i64, want);
    return err_set(e, WELD_ERR_FORMAT, "%s: key '%s': value %" PRIu64 " does not fit in %s",
                   f->path, kv->key, kv->v.u64, want);
}

int gguf_get_u32(const struct gguf_file *f, const char *key, uint32_t *out, struct weld_err *e)
{
    int rc;
    const struct gguf_kv *kv = find_typed(f, key, &rc);
    if (!kv)
        return rc;
    if (type_is_unsigned(kv->type)) {
        if (kv->v.u64 > UINT32_MAX)
            return out_of_range(f, kv, "u32", e);
        *out = (uint32_t)kv->v.u64;
    } else if (type_is_signed(kv->type)) {
        if (kv->v.i64 < 0 || kv->v.i64 > (int64_t)UINT32_MAX)
            return out_of_range(f, kv, "u32", e);
        *out = (uint32_t)kv->v.i64;
    } else {
        return bad_type(f, kv, "an integer", e);
    }
    return WELD_OK;
}

int gguf_get_i64(const struct gguf_file *f, const char *key, int64_t *out, struct weld_err *e)
{
    int rc;
    const struct gguf_kv *kv = find_typed(f, key, &rc);
    if (!kv)
        return rc;
    if (type_is_unsigned(kv->type)) {
        if (kv->v.u64 > (uint64_t)INT64_MAX)
            return out_of_range(f, kv, "i64", e);
        *out = (int64_t)kv->v.u64;
    } else if (type_is_signed(kv->type)) {
        *out = kv->v.i64;
    } else {
        return bad_type(f, kv, "an integer", e);
    }
    return WELD_OK;
}

int gguf_get_f32(const struct gguf_file *f, const char *key, float *out, struct weld_err *e)
{
    int rc;
    const struct gguf_kv *kv = find_typed(f, key, &rc);
    if (!kv)
        return rc;
    if (kv->type == GGUF_TYPE_FLOAT32 || kv->type == GGUF_TYPE_FLOAT64) {
        if (isfinite(kv->v.f64) && fabs(kv->v.f64) > FLT_MAX)
            return err_set(e, WELD_ERR_FORMAT, "%s: key '%s': value %g does not fit in f32",
                           f->path, kv->key, kv->v.f64);
        *out = (float)kv->v.f64;
    } else if (type_is_unsigned(kv->type)) {
        *out = (float)kv->v.u64;
    } else if (type_is_signed(kv->type)) {
        *out = (float)kv->v.i64;
    } else {
        return bad_type(f, kv, "a number", e);
    }
    return WELD_OK;
}

int gguf_get_bool(const struct gguf_file *f, const char *key, bool *out, struct weld_err *e)
{
    int rc;
    const struct gguf_kv *kv = find_typed(f, key, &rc);
    if (!kv)
        return rc;
    if (kv->type != GGUF_TYPE_BOOL)
        return bad_type(f, kv, "bool", e);
    *out = kv->v.u64 != 0;
    return WELD_OK;
}

int gguf_get_str(const struct gguf_file *f, const char *key, struct gguf_str *out,
                 struct weld_err *e)
{
    int rc;
    const struct gguf_kv *kv = find_typed(f, key, &rc);
    if (!kv)
        return rc;
    if (kv->type != GGUF_TYPE_STRING)
        return bad_type(f, kv, "string", e);
    *out = kv->v.str;
    return WELD_OK;
}

int gguf_get_arr(const struct gguf_file *f, const char *key, enum gguf_type elem,
                 const struct gguf_kv **out, struct weld_err *e)
{
    int rc;
    const struct gguf_kv *kv = find_typed(f, key, &rc);
    if (!kv)
        return rc;
    if (kv->type != GGUF_TYPE_ARRAY)
        return err_set(e, WELD_ERR_FORMAT, "%s: key '%s': expected an array of %s, found %s",
                       f->path, key, gguf_type_name(elem), gguf_type_name(kv->type));
    if (kv->arr_type != elem)
        return err_set(e, WELD_ERR_FORMAT, "%s: key '%s': expected an array of %s, found an "
                       "array of %s", f->path, key, gguf_type_name(elem),
                       kv->arr_type == GGUF_TYPE_COUNT ? "arrays" : gguf_type_name(kv->arr_type));
    *out = kv;
    return WELD_OK;
}

/* Element i of a numeric array, as whichever of the three widened forms applies. */
static struct gguf_kv arr_elem(const struct gguf_kv *kv, uint64_t i)
{
    WELD_ASSERT(kv->type == GGUF_TYPE_ARRAY && kv->arr_data && i < kv->arr_n);
    int es = type_size(kv->arr_type);
    WELD_ASSERT(es > 0);
    struct gguf_kv x;
    memset(&x, 0, sizeof x);
    x.type = kv->arr_type;
    decode_scalar(kv->arr_type, (const uint8_t *)kv->arr_data + i * (uint64_t)es, &x);
    return x;
}

double gguf_arr_f64(const struct gguf_kv *kv, uint64_t i)
{
    struct gguf_kv x = arr_elem(kv, i);
    if (x.type == GGUF_TYPE_FLOAT32 || x.type == GGUF_TYPE_FLOAT64)
        return x.v.f64;
    return type_is_signed(x.type) ? (double)x.v.i64 : (double)x.v.u64;
}

int64_t gguf_arr_i64(const struct gguf_kv *kv, uint64_t i)
{
    struct gguf_kv x = arr_elem(kv, i);
    if (x.type == GGUF_TYPE_FLOAT32 || x.type == GGUF_TYPE_FLOAT64) {
        double d = x.v.f64;
        return d >= -9.2e18 && d <= 9.2e18 ? (int64_t)d : 0; /* NaN and huge: 0 */
    }
    return type_is_signed(x.type) ? x.v.i64 : (int64_t)x.v.u64;
}

/* ------------------------------------------------------------------------------------ */
/* writer                                                                                */

struct buf {
    uint8_t *p;
    size_t n, cap;
};

static int buf_put(struct buf *b, const void *data, size_t n)
{
    if (n > SIZE_MAX - b->n)
        return WELD_ERR_NOMEM;
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n)
            cap = cap > SIZE_MAX / 2 ? b->n + n : cap * 2;
        uint8_t *q = wrealloc(b->p, cap);
        if (!q)
            return WELD_ERR_NOMEM;
        b->p = q;
        b->cap = cap;
    }
    if (n)
        memcpy(b->p + b->n, data, n);
    b->n += n;
    return WELD_OK;
}

static int buf_le(struct buf *b, uint64_t v, int n)
{
    uint8_t tmp[8];
    for (int i = 0; i < n; i++)
        tmp[i] = (uint8_t)(v >> 8 * i);
    return buf_put(b, tmp, (size_t)n);
}

static int buf_str(struct buf *b, const char *s, uint64_t len)
{
    int rc = buf_le(b, len, 8);
    return rc ? rc : buf_put(b, s, (size_t)len);
}

struct wkv {
    char *key;
    enum gguf_type type;
    struct buf val; /* the serialized value: what follows the type field in the file */
};

struct wtensor {
    char *name;
    enum weld_dtype type;
    int n_dims;
    int64_t ne[GGUF_MAX_DIMS];
    size_t nbytes;
    const void *data; /* or fill + ctx */
    gguf_fill_fn fill;
    void *ctx;
    uint64_t offset; /* assigned by gguf_writer_write */
};

struct gguf_writer {
    struct wkv *kv;
    size_t n_kv, cap_kv;
    struct wtensor *t;
    size_t n_t, cap_t;
    uint64_t alignment;
};

struct gguf_writer *gguf_writer_create(void)
{
    struct gguf_writer *w = wcalloc(1, sizeof *w);
    if (w)
        w->alignment = GGUF_DEFAULT_ALIGNMENT;
    return w;
}

void gguf_writer_free(struct gguf_writer *w)
{
    if (!w)
        return;
    for (size_t i = 0; i < w->n_kv; i++) {
        wfree(w->kv[i].key);
        wfree(w->kv[i].val.p);
    }
    for (size_t i = 0; i < w->n_t; i++)
        wfree(w->t[i].name);
    wfree(w->kv);
    wfree(w->t);
    wfree(w);
}

/* Grow an array of elem-size items so that one more fits. */
static int grow(void **arr, size_t *cap, size_t n, size_t elem)
{
    if (n < *cap)
        return WELD_OK;
    size_t nc = *cap ? *cap * 2 : 16;
    void *p = wrealloc(*arr, nc * elem); /* nc * elem cannot overflow before memory does */
    if (!p)
        return WELD_ERR_NOMEM;
    *arr = p;
    *cap = nc;
    return WELD_OK;
}

/* Check general.alignment: only a u32 power of two is accepted (as llama.cpp does). */
static int check_alignment_kv(struct gguf_writer *w, const char *key, enum gguf_type type,
                              const struct buf *val)
{
    if (strcmp(key, "general.alignment") != 0)
        return WELD_OK;
    if (type != GGUF_TYPE_UINT32)
        return WELD_ERR_INVALID_ARG;
    uint64_t a = ld_le(val->p, 4);
    if (a == 0 || (a & (a - 1)) != 0 || a > GGUF_MAX_ALIGNMENT)
        return WELD_ERR_INVALID_ARG;
    w->alignment = a;
    return WELD_OK;
}

/* Store key = (type, serialized value); takes ownership of val's buffer on success. */
static int writer_set(struct gguf_writer *w, const char *key, enum gguf_type type,
                      struct buf *val)
{
    int rc = WELD_ERR_INVALID_ARG;
    if (!w || !key || !key[0] || (rc = check_alignment_kv(w, key, type, val)))
        goto fail;
    for (size_t i = 0; i < w->n_kv; i++)
        if (strcmp(w->kv[i].key, key) == 0) {
            wfree(w->kv[i].val.p);
            w->kv[i].type = type;
            w->kv[i].val = *val;
            return WELD_OK;
        }
    rc = WELD_ERR_NOMEM;
    if (grow((void **)&w->kv, &w->cap_kv, w->n_kv, sizeof *w->kv))
        goto fail;
    char *k = wstrdup(key);
    if (!k)
        goto fail;
    w->kv[w->n_kv].key = k;
    w->kv[w->n_kv].type = type;
    w->kv[w->n_kv].val = *val;
    w->n_kv++;
    return WELD_OK;
fail:
    wfree(val->p);
    return rc;
}

static int set_scalar(struct gguf_writer *w, const char *key, enum gguf_type type, uint64_t bits)
{
    struct buf b = {0};
    if (buf_le(&b, bits, type_size(type)))
        return WELD_ERR_NOMEM;
    return writer_set(w, key, type, &b);
}

int gguf_writer_set_u8(struct gguf_writer *w, const char *key, uint8_t v)
{
    return set_scalar(w, key, GGUF_TYPE_UINT8, v);
}

int gguf_writer_set_u32(struct gguf_writer *w, const char *key, uint32_t v)
{
    return set_scalar(w, key, GGUF_TYPE_UINT32, v);
}

int gguf_writer_set_i32(struct gguf_writer *w, const char *key, int32_t v)
{
    return set_scalar(w, key, GGUF_TYPE_INT32, (uint32_t)v);
}

int gguf_writer_set_u64(struct gguf_writer *w, const char *key, uint64_t v)
{
    return set_scalar(w, key, GGUF_TYPE_UINT64, v);
}

int gguf_writer_set_f32(struct gguf_writer *w, const char *key, float v)
{
    return set_scalar(w, key, GGUF_TYPE_FLOAT32, f32_to_bits(v));
}

int gguf_writer_set_bool(struct gguf_writer *w, const char *key, bool v)
{
    return set_scalar(w, key, GGUF_TYPE_BOOL, v ? 1 : 0);
}

int gguf_writer_set_strn(struct gguf_writer *w, const char *key, const char *v, size_t len)
{
    struct buf b = {0};
    if (!v && len)
        return WELD_ERR_INVALID_ARG;
    if (buf_str(&b, v, len)) {
        wfree(b.p);
        return WELD_ERR_NOMEM;
    }
    return writer_set(w, key, GGUF_TYPE_STRING, &b);
}

int gguf_writer_set_str(struct gguf_writer *w, const char *key, const char *v)
{
    if (!v)
        return WELD_ERR_INVALID_ARG;
    return gguf_writer_set_strn(w, key, v, strlen(v));
}

int gguf_writer_set_arr(struct gguf_writer *w, const char *key, enum gguf_type elem,
                        const void *data, uint64_t n)
{
    int es = type_size(elem);
    if (es == 0 || (n && !data) || n > SIZE_MAX / 8)
        return WELD_ERR_INVALID_ARG;
    struct buf b = {0};
    int rc = buf_le(&b, elem, 4);
    if (!rc)
        rc = buf_le(&b, n, 8);
    const uint8_t *p = data;
    for (uint64_t i = 0; i < n && !rc; i++, p += es) {
        uint64_t v = 0; /* host-order element to little-endian */
        if (es == 1)
            v = p[0];
        else if (es == 2) {
            uint16_t x;
            memcpy(&x, p, 2);
            v = x;
        } else if (es == 4) {
            uint32_t x;
            memcpy(&x, p, 4);
            v = x;
        } else {
            memcpy(&v, p, 8);
        }
        rc = buf_le(&b, v, es);
    }
    if (rc) {
        wfree(b.p);
        return rc;
    }
    return writer_set(w, key, GGUF_TYPE_ARRAY, &b);
}

int gguf_writer_set_arr_str(struct gguf_writer *w, const char *key, const char *const *strs,
                            const uint64_t *lens, uint64_t n)
{
    if (n && !strs)
        return WELD_ERR_INVALID_ARG;
    struct buf b = {0};
    int rc = buf_le(&b, GGUF_TYPE_STRING, 4);
    if (!rc)
        rc = buf_le(&b, n, 8);
    for (uint64_t i = 0; i < n && !rc; i++) {
        if (!strs[i] && (!lens || lens[i])) {
            rc = WELD_ERR_INVALID_ARG;
            break;
        }
        rc = buf_str(&b, strs[i], lens ? lens[i] : strlen(strs[i]));
    }
    if (rc) {
        wfree(b.p);
        return rc;
    }
    return writer_set(w, key, GGUF_TYPE_ARRAY, &b);
}

/* Re-serialize one reader kv (the widened value narrowed back to its type). */
static int serialize_kv(const struct gguf_kv *kv, struct buf *b)
{
    if (kv->type == GGUF_TYPE_STRING)
        return buf_str(b, kv->v.str.ptr, kv->v.str.len);
    if (kv->type != GGUF_TYPE_ARRAY) {
        uint64_t bits = kv->v.u64;
        if (kv->type == GGUF_TYPE_FLOAT32)
            bits = f32_to_bits((float)kv->v.f64);
        else if (kv->type == GGUF_TYPE_FLOAT64)
            memcpy(&bits, &kv->v.f64, 8);
        return buf_le(b, bits, type_size(kv->type)); /* signed: two's complement, truncated */
    }
    int rc = buf_le(b, kv->arr_type, 4);
    if (!rc)
        rc = buf_le(b, kv->arr_n, 8);
    if (rc || kv->arr_n == 0)
        return rc;
    if (kv->arr_type == GGUF_TYPE_STRING) {
        for (uint64_t i = 0; i < kv->arr_n && !rc; i++)
            rc = buf_str(b, kv->arr_str[i].ptr, kv->arr_str[i].len);
        return rc;
    }
    return buf_put(b, kv->arr_data, (size_t)(kv->arr_n * (uint64_t)type_size(kv->arr_type)));
}

int gguf_writer_copy_kv(struct gguf_writer *w, const struct gguf_file *f, struct weld_err *e)
{
    for (uint64_t i = 0; i < f->n_kv; i++) {
        const struct gguf_kv *kv = &f->kv[i];
        if (kv->type == GGUF_TYPE_ARRAY && kv->arr_type == GGUF_TYPE_COUNT) {
            log_warn("%s: key '%s': nested arrays are not copied", f->path, kv->key);
            continue;
        }
        int rc;
        if (strcmp(kv->key, "general.alignment") == 0) {
            rc = gguf_writer_set_u32(w, kv->key, (uint32_t)f->alignment);
        } else {
            struct buf b = {0};
            rc = serialize_kv(kv, &b);
            if (rc)
                wfree(b.p);
            else
                rc = writer_set(w, kv->key, kv->type, &b);
        }
        if (rc)
            return err_set(e, rc, "%s: key '%s': cannot copy: %s", f->path, kv->key,
                           weld_status_str(rc));
    }
    return WELD_OK;
}

static int add_tensor(struct gguf_writer *w, const char *name, enum weld_dtype type,
                      int n_dims, const int64_t *ne, const void *data, gguf_fill_fn fill,
                      void *ctx)
{
    const struct dtype_info *di = dtype_get((int)type);
    if (!w || !name || !name[0] || !di || n_dims < 1 || n_dims > GGUF_MAX_DIMS || !ne)
        return WELD_ERR_INVALID_ARG;
    struct wtensor t = {.type = type, .n_dims = n_dims, .data = data, .fill = fill, .ctx = ctx};
    int64_t count = 1;
    for (int d = 0; d < GGUF_MAX_DIMS; d++) {
        t.ne[d] = d < n_dims ? ne[d] : 1;
        if (t.ne[d] < 0 || (t.ne[d] && count > INT64_MAX / t.ne[d]))
            return WELD_ERR_INVALID_ARG;
        count *= t.ne[d];
    }
    if (t.ne[0] % di->block_size)
        return WELD_ERR_INVALID_ARG;
    uint64_t blocks = (uint64_t)(count / di->block_size);
    if (blocks > (SIZE_MAX >> 2) / di->type_size)
        return WELD_ERR_INVALID_ARG;
    t.nbytes = (size_t)blocks * di->type_size;
    if (t.nbytes && !data && !fill)
        return WELD_ERR_INVALID_ARG;
    for (size_t i = 0; i < w->n_t; i++)
        if (strcmp(w->t[i].name, name) == 0)
            return WELD_ERR_INVALID_ARG;
    if (grow((void **)&w->t, &w->cap_t, w->n_t, sizeof *w->t) || !(t.name = wstrdup(name)))
        return WELD_ERR_NOMEM;
    w->t[w->n_t++] = t;
    return WELD_OK;
}

int gguf_writer_add_tensor(struct gguf_writer *w, const char *name, enum weld_dtype type,
                           int n_dims, const int64_t *ne, const void *data)
{
    return add_tensor(w, name, type, n_dims, ne, data, NULL, NULL);
}

int gguf_writer_add_tensor_fn(struct gguf_writer *w, const char *name, enum weld_dtype type,
                              int n_dims, const int64_t *ne, gguf_fill_fn fill, void *ctx)
{
    if (!fill)
        return WELD_ERR_INVALID_ARG;
    return add_tensor(w, name, type, n_dims, ne, NULL, fill, ctx);
}

/* Header, key/values and tensor infos, padded to the alignment; assigns tensor offsets. */
static int build_header(struct gguf_writer *w, struct buf *b, uint64_t *data_bytes)
{
    int rc = buf_put(b, GGUF_MAGIC, 4);
    rc = rc ? rc : buf_le(b, 3, 4);
    rc = rc ? rc : buf_le(b, w->n_t, 8);
    rc = rc ? rc : buf_le(b, w->n_kv, 8);
    for (size_t i = 0; i < w->n_kv && !rc; i++) {
        rc = buf_str(b, w->kv[i].key, strlen(w->kv[i].key));
        rc = rc ? rc : buf_le(b, w->kv[i].type, 4);
        rc = rc ? rc : buf_put(b, w->kv[i].val.p, w->kv[i].val.n);
    }
    uint64_t off = 0, a = w->alignment;
    for (size_t i = 0; i < w->n_t && !rc; i++) {
        struct wtensor *t = &w->t[i];
        t->offset = off;
        uint64_t padded = (t->nbytes + a - 1) / a * a; /* nbytes < SIZE_MAX / 4 */
        if (padded > UINT64_MAX / 2 - off)
            return WELD_ERR_LIMIT;
        off += padded;
        rc = buf_str(b, t->name, strlen(t->name));
        rc = rc ? rc : buf_le(b, (uint64_t)t->n_dims, 4);
        for (int d = 0; d < t->n_dims && !rc; d++)
            rc = buf_le(b, (uint64_t)t->ne[d], 8);
        rc = rc ? rc : buf_le(b, (uint64_t)t->type, 4);
        rc = rc ? rc : buf_le(b, t->offset, 8);
    }
    static const uint8_t zeros[GGUF_DEFAULT_ALIGNMENT];
    while (!rc && b->n % a)
        rc = buf_put(b, zeros, (size_t)(a - b->n % a < sizeof zeros ? a - b->n % a : sizeof zeros));
    *data_bytes = off;
    return rc;
}

static int write_bytes(FILE *fp, const void *p, size_t n, const char *tmp, struct weld_err *e)
{
    if (n && fwrite(p, 1, n, fp) != n)
        return err_set(e, WELD_ERR_IO, "%s: write failed: %s", tmp, strerror(errno));
    return WELD_OK;
}

static int write_zeros(FILE *fp, uint64_t n, const char *tmp, struct weld_err *e)
{
    static const uint8_t zeros[4096];
    while (n) {
        size_t k = n < sizeof zeros ? (size_t)n : sizeof zeros;
        int rc = write_bytes(fp, zeros, k, tmp, e);
        if (rc)
            return rc;
        n -= k;
    }
    return WELD_OK;
}

/* One tensor's bytes (from its pointer or its fill callback, via *scratch) and padding. */
static int write_tensor(struct gguf_writer *w, struct wtensor *t, FILE *fp, const char *tmp,
                        struct buf *scratch, struct progress *pg, struct weld_err *e)
{
    const uint8_t *src = t->data;
    int rc;
    if (t->nbytes && !src) {
        if (scratch->cap < t->nbytes) {
            wfree(scratch->p);
            scratch->cap = 0;
            if (!(scratch->p = wmalloc(t->nbytes)))
                return err_set(e, WELD_ERR_NOMEM, "%s: tensor '%s': out of memory for %zu "
                               "bytes", tmp, t->name, t->nbytes);
            scratch->cap = t->nbytes;
        }
        err_clear(e);
        if ((rc = t->fill(t->ctx, scratch->p, t->nbytes, e))) {
            if (!e)
                return rc;
            if (e->status == WELD_OK || !e->msg[0])
                err_set(e, rc, "fill callback failed (%s)", weld_status_str(rc));
            return err_prefix(e, "%s: tensor '%s'", tmp, t->name);
        }
        src = scratch->p;
    }
    const size_t chunk = (size_t)1 << 24;
    for (size_t at = 0; at < t->nbytes; at += chunk) {
        size_t k = t->nbytes - at < chunk ? t->nbytes - at : chunk;
        if ((rc = write_bytes(fp, src + at, k, tmp, e)))
            return rc;
        progress_add(pg, k);
    }
    return write_zeros(fp, (w->alignment - t->nbytes % w->alignment) % w->alignment, tmp, e);
}

static int write_all(struct gguf_writer *w, FILE *fp, const char *path, const char *tmp,
                     struct weld_err *e)
{
    struct buf hdr = {0}, scratch = {0};
    uint64_t data_bytes = 0;
    int rc = build_header(w, &hdr, &data_bytes);
    if (rc)
        rc = err_set(e, rc, "%s: cannot build the header: %s", path, weld_status_str(rc));
    else
        rc = write_bytes(fp, hdr.p, hdr.n, tmp, e);
    wfree(hdr.p);
    if (rc)
        return rc;
    struct progress pg;
    progress_start(&pg, path, data_bytes);
    for (size_t i = 0; i < w->n_t && !rc; i++)
        rc = write_tensor(w, &w->t[i], fp, tmp, &scratch, &pg, e);
    progress_end(&pg);
    wfree(scratch.p);
    if (!rc && (fflush(fp) != 0 || fsync(fileno(fp)) != 0))
        rc = err_set(e, WELD_ERR_IO, "%s: write failed: %s", tmp, strerror(errno));
    return rc;
}

int gguf_writer_write(struct gguf_writer *w, const char *path, struct weld_err *e)
{
    if (!w || !path)
        return err_set(e, WELD_ERR_INVALID_ARG, "gguf_writer_write: no writer or path");
    size_t n = strlen(path);
    char *tmp = wmalloc(n + 5);
    if (!tmp)
        return err_set(e, WELD_ERR_NOMEM, "%s: out of memory", path);
    memcpy(tmp, path, n);
    memcpy(tmp + n, ".tmp", 5);
    FILE *fp = fopen(tmp, "wb");
    int rc;
    if (!fp) {
        rc = err_set(e, WELD_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
        goto free_tmp;
    }
    rc = write_all(w, fp, path, tmp, e);
    if (fclose(fp) != 0 && !rc)
        rc = err_set(e, WELD_ERR_IO, "%s: close failed: %s", tmp, strerror(errno));
    if (!rc && rename(tmp, path) != 0)
        rc = err_set(e, WELD_ERR_IO, "%s: cannot rename to %s: %s", tmp, path, strerror(errno));
    if (rc)
        unlink(tmp);
free_tmp:
    wfree(tmp);
    return rc;
}

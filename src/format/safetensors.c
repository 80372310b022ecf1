/*
 * safetensors - reader and writer for Hugging Face *.safetensors files (see safetensors.h
 * for the file layout).
 *
 * Reader. Each file is mmapped (or wrapped, for st_open_memory) and its header parsed with
 * Jansson, rejecting duplicate keys. Everything is checked before use:
 *   - the u64 header length N fits the file (N <= size - 8) and is at most 100 MB;
 *   - the header is a JSON object; "__metadata__", if present, maps strings to strings;
 *   - every other key is a tensor: an object with a string "dtype" from the table below,
 *     "shape" an array of 0..8 non-negative integers whose product (and byte size) does not
 *     overflow, "data_offsets" [begin, end] with begin <= end <= data size and
 *     end - begin == numel * element size;
 *   - within a file, no two tensors' byte ranges overlap (gaps are allowed; zero-byte
 *     tensors overlap nothing).
 * Element types other than F32/F16/BF16 are known (so sizes can be checked and the file
 * opens) but get dtype = -1; a consumer that needs the data reports them as unsupported.
 * A set's tensors from all shards live in one array sorted by name; st_find is a bsearch.
 * A name in two shards is an error. Every message names the file, the tensor and the field.
 * Data pointers point into the mapping and are only as aligned as the file makes them
 * (files written here have 8-byte-aligned data sections; offsets are the file's own).
 *
 * Directory sets. With model.safetensors.index.json, the shards are the distinct file names
 * in its "weight_map" (each a plain name: no '/', no "..") and every tensor listed there
 * must be in the shard named for it; tensors a shard holds beyond the map are kept. Without
 * an index, every *.safetensors file in the directory is a shard, in sorted name order.
 *
 * Writer. Tensors are recorded (name, dtype, shape, and a data pointer or a fill callback)
 * and written at st_writer_write_dir in insertion order. Shards are cut greedily: a tensor
 * starts a new shard when adding it would push a non-empty shard past max_shard_bytes (a
 * tensor larger than the limit gets a shard of its own). One shard is written as
 * model.safetensors (and a stale index in the directory is removed); several as
 * model-0000i-of-0000N.safetensors plus model.safetensors.index.json with
 * {"metadata": {"total_size": bytes}, "weight_map": {name: file}}. Each header is compact
 * JSON ("__metadata__" first, then tensors) padded with spaces to a multiple of 8 bytes.
 * Tensors are packed back to back with no padding (the reference reader rejects gaps), so
 * a tensor's data is aligned to its element size only when the sizes before it keep it so,
 * which real model shapes do; odd-sized tensors can leave later ones unaligned.
 * Callback tensors are filled one at a time into a single reused buffer (one tensor in
 * memory at a time, never the model). Files are written as NAME.tmp and renamed only after
 * every shard was written; on failure the .tmp files are removed. Errors from
 * st_writer_add* (which has no error slot) are kept and reported by st_writer_write_dir.
 *
 * Deliberately not done: dtype conversion, byte-swapping (little-endian hosts only, like
 * the format), rewriting a file in place, or requiring the contiguous packing that the
 * reference implementation checks.
 */
#include "format/safetensors.h"

#include "core/alloc.h"
#include "core/json.h"
#include "core/progress.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define ST_MAX_HEADER ((uint64_t)100 * 1000 * 1000)
#define ST_INDEX_NAME "model.safetensors.index.json"

/* ------------------------------------------------------------------------------------- */
/* dtypes */

struct st_dtype {
    const char *name;
    int weld;  /* enum weld_dtype, or -1: known but not supported */
    int bits;  /* per element */
};

static const struct st_dtype st_dtypes[] = {
    {"F32", DT_F32, 32},      {"F16", DT_F16, 16},      {"BF16", DT_BF16, 16},
    {"F64", -1, 64},          {"I8", -1, 8},            {"U8", -1, 8},
    {"I16", -1, 16},          {"U16", -1, 16},          {"I32", -1, 32},
    {"U32", -1, 32},          {"I64", -1, 64},          {"U64", -1, 64},
    {"BOOL", -1, 8},          {"F8_E4M3", -1, 8},       {"F8_E5M2", -1, 8},
    {"F8_E8M0", -1, 8},       {"F6_E2M3", -1, 6},       {"F6_E3M2", -1, 6},
    {"F4", -1, 4},            {"C64", -1, 64},
};

static const struct st_dtype *st_dtype_by_name(const char *name)
{
    for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0]; i++)
        if (strcmp(st_dtypes[i].name, name) == 0)
            return &st_dtypes[i];
    return NULL;
}

static const char *st_dtype_name_of(int dtype)
{
    switch (dtype) {
    case DT_F32: return "F32";
    case DT_F16: return "F16";
    case DT_BF16: return "BF16";
    }
    return NULL;
}

static int st_dtype_bits(int dtype)
{
    return dtype == DT_F32 ? 32 : (dtype == DT_F16 || dtype == DT_BF16) ? 16 : 0;
}

/* Byte size of numel elements of `bits` bits; 0 and *ok = 0 on overflow or a partial byte. */
static uint64_t st_bytes_of(uint64_t numel, int bits, int *ok)
{
    uint64_t total_bits;
    *ok = !__builtin_mul_overflow(numel, (uint64_t)bits, &total_bits) && total_bits % 8 == 0;
    return *ok ? total_bits / 8 : 0;
}

/* ------------------------------------------------------------------------------------- */
/* reader: one header */

/* A tensor's byte range inside its file's data section, for the overlap check. */
struct st_range {
    uint64_t begin, end;
    int tensor;
};

static int st_cmp_range(const void *a, const void *b)
{
    const struct st_range *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

static int st_grow_tensors(struct st_set *s, size_t *cap)
{
    if ((size_t)s->n_tensors < *cap)
        return WELD_OK;
    size_t ncap = *cap ? *cap * 2 : 64;
    if (ncap > (size_t)INT_MAX)
        return WELD_ERR_LIMIT;
    struct st_tensor *t = wrealloc(s->tensors, ncap * sizeof *t);
    if (!t)
        return WELD_ERR_NOMEM;
    s->tensors = t;
    *cap = ncap;
    return WELD_OK;
}

/* Read a JSON array of non-negative integers into out (at most max); -1 if it is not one. */
static int st_read_uint_array(const json_t *a, uint64_t *out, int max)
{
    if (!json_is_array(a) || json_array_size(a) > (size_t)max)
        return -1;
    for (size_t i = 0; i < json_array_size(a); i++) {
        const json_t *v = json_array_get(a, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0)
            return -1;
        out[i] = (uint64_t)json_integer_value(v);
    }
    return (int)json_array_size(a);
}

/* Validate one tensor entry and fill t (name not yet set). */
static int st_parse_entry(const char *file, const char *name, const json_t *v,
                          uint64_t data_size, struct st_tensor *t, struct st_range *r,
                          struct weld_err *e)
{
    if (!json_is_object(v))
        return err_set(e, WELD_ERR_FORMAT, "%s: tensor '%s': entry must be a JSON object",
                       file, name);
    const json_t *dt = json_object_get(v, "dtype");
    if (!json_is_string(dt))
        return err_set(e, WELD_ERR_FORMAT, "%s: tensor '%s': field 'dtype' must be a string",
                       file, name);
    const struct st_dtype *d = st_dtype_by_name(json_string_value(dt));
    if (!d)
        return err_set(e, WELD_ERR_UNSUPPORTED, "%s: tensor '%s': field 'dtype': unknown "
                       "dtype '%.32s'", file, name, json_string_value(dt));
    uint64_t shape[ST_MAX_DIMS];
    int nd = st_read_uint_array(json_object_get(v, "shape"), shape, ST_MAX_DIMS);
    if (nd < 0)
        return err_set(e, WELD_ERR_FORMAT, "%s: tensor '%s': field 'shape' must be an array "
                       "of at most %d non-negative integers", file, name, ST_MAX_DIMS);
    uint64_t numel = 1;
    for (int i = 0; i < nd; i++)
        if (__builtin_mul_overflow(numel, shape[i], &numel) || shape[i] > (uint64_t)INT64_MAX)
            return err_set(e, WELD_ERR_FORMAT, "%s: tensor '%s': field 'shape': element "
                           "count overflows", file, name);
    int ok;
    uint64_t nbytes = st_bytes_of(numel, d->bits, &ok);
    if (!ok)
        return err_set(e, WELD_ERR_FORMAT, "%s: tensor '%s': field 'shape': %llu elements "
                       "of %s is not a whole number of bytes or overflows", file, name,
                       (unsigned long long)numel, d->name);
    uint64_t off[2];
    if (st_read_uint_array(json_object_get(v, "data_offsets"), off, 2) != 2)
        return err_set(e, WELD_ERR_FORMAT, "%s: tensor '%s': field 'data_offsets' must be "
                       "[begin, end], two non-negative integers", file, name);
    if (off[0] > off[1])
        return err_set(e, WELD_ERR_FORMAT, "%s: tensor '%s': data_offsets [%llu, %llu): "
                       "begin after end", file, name, (unsigned long long)off[0],
                       (unsigned long long)off[1]);
    if (off[1] > data_size)
        return err_set(e, WELD_ERR_FORMAT, "%s: tensor '%s': data_offsets [%llu, %llu) past "
                       "end of data (%llu bytes)", file, name, (unsigned long long)off[0],
                       (unsigned long long)off[1], (unsigned long long)data_size);
    if (off[1] - off[0] != nbytes)
        return err_set(e, WELD_ERR_FORMAT, "%s: tensor '%s': data_offsets [%llu, %llu) hold "
                       "%llu bytes but shape and dtype %s need %llu", file, name,
                       (unsigned long long)off[0], (unsigned long long)off[1],
                       (unsigned long long)(off[1] - off[0]), d->name,
                       (unsigned long long)nbytes);
    t->dtype = d->weld;
    snprintf(t->dtype_name, sizeof t->dtype_name, "%s", d->name);
    t->n_dims = nd;
    for (int i = 0; i < ST_MAX_DIMS; i++)
        t->shape[i] = i < nd ? (int64_t)shape[i] : 0;
    t->nbytes = (size_t)nbytes;
    r->begin = off[0];
    r->end = off[1];
    return WELD_OK;
}

static int st_parse_metadata(struct st_set *s, const char *file, const json_t *v,
                             struct weld_err *e)
{
    if (!json_is_object(v))
        return err_set(e, WELD_ERR_FORMAT, "%s: '__metadata__' must be a JSON object", file);
    const char *k;
    const json_t *x;
    json_object_foreach((json_t *)v, k, x) {
        if (!json_is_string(x))
            return err_set(e, WELD_ERR_FORMAT, "%s: '__metadata__': value of '%s' must be a "
                           "string", file, k);
    }
    if (s->metadata_json)
        return WELD_OK;
    char *js = json_dumps(v, JSON_COMPACT);
    s->metadata_json = js ? wstrdup(js) : NULL;
    free(js);
    if (!s->metadata_json)
        return err_set(e, WELD_ERR_NOMEM, "%s: out of memory for '__metadata__'", file);
    return WELD_OK;
}

/* Reject overlapping byte ranges among the tensors of one file. */
static int st_check_overlap(const struct st_set *s, const char *file, struct st_range *r,
                            size_t n, struct weld_err *e)
{
    qsort(r, n, sizeof *r, st_cmp_range);
    size_t prev = SIZE_MAX;
    for (size_t i = 0; i < n; i++) {
        if (r[i].begin == r[i].end)
            continue;
        if (prev != SIZE_MAX && r[i].begin < r[prev].end)
            return err_set(e, WELD_ERR_FORMAT, "%s: tensors '%s' [%llu, %llu) and '%s' "
                           "[%llu, %llu) overlap", file, s->tensors[r[prev].tensor].name,
                           (unsigned long long)r[prev].begin, (unsigned long long)r[prev].end,
                           s->tensors[r[i].tensor].name, (unsigned long long)r[i].begin,
                           (unsigned long long)r[i].end);
        if (prev == SIZE_MAX || r[i].end > r[prev].end)
            prev = i;
    }
    return WELD_OK;
}

/* Check the header length and parse the header JSON of shard `shard`. */
static int st_load_header(const struct st_set *s, int shard, json_t **root,
                          uint64_t *data_start, struct weld_err *e)
{
    const struct mfile *m = &s->maps[shard];
    const char *file = s->file_paths[shard];
    if (m->size < 8)
        return err_set(e, WELD_ERR_FORMAT, "%s: file is %zu bytes, too short for the 8-byte "
                       "header length", file, m->size);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = hlen << 8 | m->data[i];
    if (hlen > m->size - 8)
        return err_set(e, WELD_ERR_FORMAT, "%s: header length %llu at offset 0 is past the "
                       "end of the file (%zu bytes)", file, (unsigned long long)hlen, m->size);
    if (hlen > ST_MAX_HEADER)
        return err_set(e, WELD_ERR_LIMIT, "%s: header length %llu exceeds the limit of %llu "
                       "bytes", file, (unsigned long long)hlen,
                       (unsigned long long)ST_MAX_HEADER);
    json_error_t je;
    *root = json_loadb((const char *)m->data + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &je);
    if (!*root)
        return err_set(e, WELD_ERR_FORMAT, "%s: bad header JSON at byte offset %llu: %s",
                       file, (unsigned long long)(8 + (uint64_t)je.position), je.text);
    if (!json_is_object(*root)) {
        json_decref(*root);
        *root = NULL;
        return err_set(e, WELD_ERR_FORMAT, "%s: header (byte offset 8) is not a JSON object",
                       file);
    }
    *data_start = 8 + hlen;
    return WELD_OK;
}

/* Parse shard `shard` (already in s->maps) and append its tensors to s. */
static int st_parse_shard(struct st_set *s, int shard, size_t *cap, struct weld_err *e)
{
    const char *file = s->file_paths[shard];
    json_t *root = NULL;
    uint64_t dstart;
    int rc = st_load_header(s, shard, &root, &dstart, e);
    if (rc != WELD_OK)
        return rc;
    const uint8_t *data = s->maps[shard].data + dstart;
    uint64_t dsize = s->maps[shard].size - dstart;
    size_t n_entries = json_object_size(root), n_ranges = 0;
    struct st_range *ranges = wcalloc(n_entries ? n_entries : 1, sizeof *ranges);
    if (!ranges) {
        rc = err_set(e, WELD_ERR_NOMEM, "%s: out of memory", file);
        goto out_root;
    }
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        if (strcmp(key, "__metadata__") == 0) {
            if ((rc = st_parse_metadata(s, file, v, e)) != WELD_OK)
                goto out_ranges;
            continue;
        }
        if ((rc = st_grow_tensors(s, cap)) != WELD_OK) {
            err_set(e, rc, "%s: too many tensors", file);
            goto out_ranges;
        }
        struct st_tensor *t = &s->tensors[s->n_tensors];
        memset(t, 0, sizeof *t);
        struct st_range *r = &ranges[n_ranges];
        if ((rc = st_parse_entry(file, key, v, dsize, t, r, e)) != WELD_OK)
            goto out_ranges;
        if (!(t->name = wstrdup(key))) {
            rc = err_set(e, WELD_ERR_NOMEM, "%s: out of memory", file);
            goto out_ranges;
        }
        t->data = data + r->begin;
        t->shard = shard;
        r->tensor = s->n_tensors++;
        n_ranges++;
    }
    rc = st_check_overlap(s, file, ranges, n_ranges, e);
out_ranges:
    wfree(ranges);
out_root:
    json_decref(root);
    return rc;
}

/* ------------------------------------------------------------------------------------- */
/* reader: sets */

static int st_cmp_tensor(const void *a, const void *b)
{
    return strcmp(((const struct st_tensor *)a)->name, ((const struct st_tensor *)b)->name);
}

/* Sort by name and reject a name that appears twice (only possible across shards). */
static int st_finish(struct st_set *s, struct weld_err *e)
{
    if (s->n_tensors > 1)
        qsort(s->tensors, (size_t)s->n_tensors, sizeof *s->tensors, st_cmp_tensor);
    for (int i = 1; i < s->n_tensors; i++) {
        const struct st_tensor *a = &s->tensors[i - 1], *b = &s->tensors[i];
        if (strcmp(a->name, b->name) == 0)
            return err_set(e, WELD_ERR_FORMAT, "tensor '%s' appears in both %s and %s",
                           a->name, s->file_paths[a->shard], s->file_paths[b->shard]);
    }
    return WELD_OK;
}

/* An empty set with room for n files (paths and maps zeroed). */
static struct st_set *st_set_alloc(int n_files, const char *dir)
{
    struct st_set *s = wcalloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->file_paths = wcalloc((size_t)(n_files ? n_files : 1), sizeof *s->file_paths);
    s->maps = wcalloc((size_t)(n_files ? n_files : 1), sizeof *s->maps);
    s->dir = dir ? wstrdup(dir) : NULL;
    if (!s->file_paths || !s->maps || (dir && !s->dir)) {
        st_close(s);
        return NULL;
    }
    s->n_files = n_files;
    return s;
}

void st_close(struct st_set *s)
{
    if (!s)
        return;
    for (int i = 0; i < s->n_tensors; i++)
        wfree(s->tensors[i].name);
    wfree(s->tensors);
    for (int i = 0; s->maps && i < s->n_files; i++)
        mfile_close(&s->maps[i]);
    for (int i = 0; s->file_paths && i < s->n_files; i++)
        wfree(s->file_paths[i]);
    wfree(s->maps);
    wfree(s->file_paths);
    wfree(s->metadata_json);
    wfree(s->dir);
    wfree(s);
}

const struct st_tensor *st_find(const struct st_set *s, const char *name)
{
    if (!s || !name || s->n_tensors == 0)
        return NULL;
    struct st_tensor key;
    key.name = (char *)name;
    return bsearch(&key, s->tensors, (size_t)s->n_tensors, sizeof key, st_cmp_tensor);
}

/* Map and parse each of s->file_paths (already filled), then sort. */
static int st_load_files(struct st_set *s, struct weld_err *e)
{
    size_t cap = 0;
    for (int i = 0; i < s->n_files; i++) {
        int rc = mfile_open(&s->maps[i], s->file_paths[i], e);
        if (rc == WELD_OK)
            rc = st_parse_shard(s, i, &cap, e);
        if (rc != WELD_OK)
            return rc;
    }
    return st_finish(s, e);
}

int st_open_memory(struct st_set **out, const void *data, size_t size, const char *name,
                   struct weld_err *e)
{
    *out = NULL;
    struct st_set *s = st_set_alloc(1, NULL);
    if (!s || !(s->file_paths[0] = wstrdup(name ? name : "<memory>"))) {
        st_close(s);
        return err_set(e, WELD_ERR_NOMEM, "%s: out of memory", name ? name : "<memory>");
    }
    mfile_wrap(&s->maps[0], data, size);
    size_t cap = 0;
    int rc = st_parse_shard(s, 0, &cap, e);
    if (rc == WELD_OK)
        rc = st_finish(s, e);
    if (rc != WELD_OK) {
        st_close(s);
        return rc;
    }
    *out = s;
    return WELD_OK;
}

int st_open_file(struct st_set **out, const char *path, struct weld_err *e)
{
    *out = NULL;
    const char *slash = strrchr(path, '/');
    char *dir = slash ? wstrndup(path, (size_t)(slash - path) + (slash == path)) : wstrdup(".");
    struct st_set *s = dir ? st_set_alloc(1, dir) : NULL;
    wfree(dir);
    if (!s || !(s->file_paths[0] = wstrdup(path))) {
        st_close(s);
        return err_set(e, WELD_ERR_NOMEM, "%s: out of memory", path);
    }
    int rc = st_load_files(s, e);
    if (rc != WELD_OK) {
        st_close(s);
        return rc;
    }
    *out = s;
    return WELD_OK;
}

static char *st_join(const char *dir, const char *name)
{
    size_t a = strlen(dir), b = strlen(name);
    char *p = wmalloc(a + b + 2);
    if (p) {
        memcpy(p, dir, a);
        p[a] = '/';
        memcpy(p + a + 1, name, b + 1);
    }
    return p;
}

static int st_cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Names of the *.safetensors files in dir, sorted; *n gets the count. */
static int st_list_dir(const char *dir, char ***names, int *n, struct weld_err *e)
{
    *names = NULL;
    *n = 0;
    DIR *d = opendir(dir);
    if (!d)
        return err_set(e, errno == ENOENT ? WELD_ERR_NOT_FOUND : WELD_ERR_IO,
                       "%s: cannot open directory: %s", dir, strerror(errno));
    int rc = WELD_OK, cap = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        size_t len = strlen(de->d_name), sl = strlen(".safetensors");
        if (len <= sl || strcmp(de->d_name + len - sl, ".safetensors") != 0)
            continue;
        if (*n == cap) {
            cap = cap ? cap * 2 : 8;
            char **nn = wrealloc(*names, (size_t)cap * sizeof *nn);
            if (!nn) {
                rc = err_set(e, WELD_ERR_NOMEM, "%s: out of memory", dir);
                break;
            }
            *names = nn;
        }
        if (!((*names)[*n] = wstrdup(de->d_name))) {
            rc = err_set(e, WELD_ERR_NOMEM, "%s: out of memory", dir);
            break;
        }
        (*n)++;
    }
    closedir(d);
    if (rc == WELD_OK && *n == 0)
        rc = err_set(e, WELD_ERR_NOT_FOUND, "%s: no *.safetensors files and no %s", dir,
                     ST_INDEX_NAME);
    if (rc == WELD_OK)
        qsort(*names, (size_t)*n, sizeof **names, st_cmp_str);
    return rc;
}

/* Shard names from an index's weight_map: validated, distinct, sorted. */
static int st_index_shards(const json_t *wm, const char *ipath, char ***names, int *n,
                           struct weld_err *e)
{
    *names = wcalloc(json_object_size(wm) ? json_object_size(wm) : 1, sizeof **names);
    *n = 0;
    if (!*names)
        return err_set(e, WELD_ERR_NOMEM, "%s: out of memory", ipath);
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)wm, k, v) {
        const char *f = json_string_value(v);
        if (!f)
            return err_set(e, WELD_ERR_FORMAT, "%s: weight_map: value for tensor '%s' must "
                           "be a file name string", ipath, k);
        if (!*f || strchr(f, '/') || strstr(f, "..") || strchr(f, '\\'))
            return err_set(e, WELD_ERR_FORMAT, "%s: weight_map: tensor '%s': file name '%s' "
                           "must be a plain name inside the directory (no '/' or '..')",
                           ipath, k, f);
        int seen = 0;
        for (int i = 0; i < *n && !seen; i++)
            seen = strcmp((*names)[i], f) == 0;
        if (!seen && !((*names)[(*n)++] = wstrdup(f)))
            return err_set(e, WELD_ERR_NOMEM, "%s: out of memory", ipath);
    }
    if (*n == 0)
        return err_set(e, WELD_ERR_FORMAT, "%s: weight_map is empty", ipath);
    qsort(*names, (size_t)*n, sizeof **names, st_cmp_str);
    return WELD_OK;
}

/* Every tensor the index lists must be in the shard it names. */
static int st_check_index(const struct st_set *s, const json_t *wm, const char *ipath,
                          struct weld_err *e)
{
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)wm, k, v) {
        const struct st_tensor *t = st_find(s, k);
        const char *f = json_string_value(v);
        const char *have = t ? strrchr(s->file_paths[t->shard], '/') + 1 : NULL;
        if (!t || strcmp(have, f) != 0)
            return err_set(e, WELD_ERR_FORMAT, "%s: weight_map: tensor '%s' is not in shard "
                           "'%s'%s%s", ipath, k, f, t ? ", it is in " : "", t ? have : "");
    }
    return WELD_OK;
}

/* Read the index (if any) and produce the list of shard names. *wm is the weight_map, or
   NULL when there is no index; the caller releases *root. */
static int st_dir_shards(const char *dir, const char *ipath, json_t **root, json_t **wm,
                         char ***names, int *n, struct weld_err *e)
{
    *root = *wm = NULL;
    if (access(ipath, F_OK) != 0)
        return st_list_dir(dir, names, n, e);
    if (!(*root = jload_file(ipath, e)))
        return e ? e->status : WELD_ERR_FORMAT;
    *wm = json_object_get(*root, "weight_map");
    if (!json_is_object(*wm))
        return err_set(e, WELD_ERR_FORMAT, "%s: field 'weight_map' must be a JSON object",
                       ipath);
    return st_index_shards(*wm, ipath, names, n, e);
}

int st_open_dir(struct st_set **out, const char *dir, struct weld_err *e)
{
    *out = NULL;
    struct st_set *s = NULL;
    json_t *root = NULL, *wm = NULL;
    char **names = NULL;
    int n = 0, rc;
    char *ipath = st_join(dir, ST_INDEX_NAME);
    if (!ipath)
        return err_set(e, WELD_ERR_NOMEM, "%s: out of memory", dir);
    rc = st_dir_shards(dir, ipath, &root, &wm, &names, &n, e);
    if (rc != WELD_OK)
        goto out;
    if (!(s = st_set_alloc(n, dir))) {
        rc = err_set(e, WELD_ERR_NOMEM, "%s: out of memory", dir);
        goto out;
    }
    for (int i = 0; i < n; i++)
        if (!(s->file_paths[i] = st_join(dir, names[i]))) {
            rc = err_set(e, WELD_ERR_NOMEM, "%s: out of memory", dir);
            goto out;
        }
    if ((rc = st_load_files(s, e)) != WELD_OK)
        goto out;
    if (wm && (rc = st_check_index(s, wm, ipath, e)) != WELD_OK)
        goto out;
    *out = s;
    s = NULL;
out:
    st_close(s);
    for (int i = 0; names && i < n; i++)
        wfree(names[i]);
    wfree(names);
    json_decref(root);
    wfree(ipath);
    return rc;
}

/* ------------------------------------------------------------------------------------- */
/* writer */

struct st_wentry {
    char *name;
    int dtype;
    int n_dims;
    int64_t shape[ST_MAX_DIMS];
    uint64_t nbytes;
    const void *data; /* or fill/ctx */
    st_fill_fn fill;
    void *ctx;
    int shard;        /* assigned at write time */
};

struct st_writer {
    struct st_wentry *ents;
    int n, cap;
    json_t *metadata;       /* object of strings */
    int add_status;         /* first st_writer_add* failure, reported by write_dir */
    char add_msg[256];
};

struct st_writer *st_writer_create(void)
{
    return wcalloc(1, sizeof(struct st_writer));
}

void st_writer_free(struct st_writer *w)
{
    if (!w)
        return;
    for (int i = 0; i < w->n; i++)
        wfree(w->ents[i].name);
    wfree(w->ents);
    json_decref(w->metadata);
    wfree(w);
}

static int st_writer_fail(struct st_writer *w, int status, const char *name, const char *what)
{
    if (w->add_status == WELD_OK) {
        w->add_status = status;
        snprintf(w->add_msg, sizeof w->add_msg, "tensor '%.120s': %s", name ? name : "(null)",
                 what);
    }
    return status;
}

static int st_writer_add_common(struct st_writer *w, const char *name, int dtype, int n_dims,
                                const int64_t *shape, const void *data, st_fill_fn fill,
                                void *ctx)
{
    if (!w)
        return WELD_ERR_INVALID_ARG;
    if (!name || !*name || strcmp(name, "__metadata__") == 0)
        return st_writer_fail(w, WELD_ERR_INVALID_ARG, name, "invalid tensor name");
    if (!st_dtype_name_of(dtype))
        return st_writer_fail(w, WELD_ERR_UNSUPPORTED, name, "dtype must be F32, F16 or BF16");
    if (n_dims < 0 || n_dims > ST_MAX_DIMS || (n_dims && !shape))
        return st_writer_fail(w, WELD_ERR_INVALID_ARG, name, "bad number of dimensions");
    uint64_t numel = 1;
    for (int i = 0; i < n_dims; i++)
        if (shape[i] < 0 || __builtin_mul_overflow(numel, (uint64_t)shape[i], &numel))
            return st_writer_fail(w, WELD_ERR_INVALID_ARG, name, "bad shape");
    int ok;
    uint64_t nbytes = st_bytes_of(numel, st_dtype_bits(dtype), &ok);
    if (!ok || nbytes > SIZE_MAX / 2 || (nbytes && !data && !fill))
        return st_writer_fail(w, WELD_ERR_INVALID_ARG, name, "size overflows or no data");
    for (int i = 0; i < w->n; i++)
        if (strcmp(w->ents[i].name, name) == 0)
            return st_writer_fail(w, WELD_ERR_INVALID_ARG, name, "added twice");
    if (w->n == w->cap) {
        int ncap = w->cap ? w->cap * 2 : 64;
        struct st_wentry *ne = wrealloc(w->ents, (size_t)ncap * sizeof *ne);
        if (!ne)
            return st_writer_fail(w, WELD_ERR_NOMEM, name, "out of memory");
        w->ents = ne;
        w->cap = ncap;
    }
    struct st_wentry *en = &w->ents[w->n];
    memset(en, 0, sizeof *en);
    if (!(en->name = wstrdup(name)))
        return st_writer_fail(w, WELD_ERR_NOMEM, name, "out of memory");
    en->dtype = dtype;
    en->n_dims = n_dims;
    for (int i = 0; i < n_dims; i++)
        en->shape[i] = shape[i];
    en->nbytes = nbytes;
    en->data = data;
    en->fill = fill;
    en->ctx = ctx;
    w->n++;
    return WELD_OK;
}

int st_writer_add(struct st_writer *w, const char *name, int dtype, int n_dims,
                  const int64_t *shape, const void *data)
{
    return st_writer_add_common(w, name, dtype, n_dims, shape, data, NULL, NULL);
}

int st_writer_add_fn(struct st_writer *w, const char *name, int dtype, int n_dims,
                     const int64_t *shape, st_fill_fn fill, void *ctx)
{
    if (!fill)
        return w ? st_writer_fail(w, WELD_ERR_INVALID_ARG, name, "no fill callback")
                 : WELD_ERR_INVALID_ARG;
    return st_writer_add_common(w, name, dtype, n_dims, shape, NULL, fill, ctx);
}

int st_writer_set_metadata(struct st_writer *w, const char *key, const char *value)
{
    if (!w || !key || !value)
        return WELD_ERR_INVALID_ARG;
    if (!w->metadata && !(w->metadata = json_object()))
        return st_writer_fail(w, WELD_ERR_NOMEM, "__metadata__", "out of memory");
    if (json_object_set_new(w->metadata, key, json_string(value)) != 0)
        return st_writer_fail(w, WELD_ERR_INVALID_ARG, "__metadata__",
                              "key or value is not valid UTF-8, or out of memory");
    return WELD_OK;
}

/* The header JSON of shard `shard`, padded with spaces to a multiple of 8 bytes. */
static char *st_shard_header(const struct st_writer *w, int shard, size_t *len)
{
    json_t *root = json_object();
    char *out = NULL, *js = NULL;
    if (!root)
        return NULL;
    if (w->metadata && json_object_set(root, "__metadata__", w->metadata) != 0)
        goto out;
    uint64_t off = 0;
    for (int i = 0; i < w->n; i++) {
        const struct st_wentry *en = &w->ents[i];
        if (en->shard != shard)
            continue;
        json_t *shape = json_array();
        for (int d = 0; shape && d < en->n_dims; d++)
            if (json_array_append_new(shape, json_integer(en->shape[d])) != 0) {
                json_decref(shape);
                shape = NULL;
            }
        if (!shape)
            goto out;
        json_t *t = json_pack("{s:s, s:o, s:[I, I]}", "dtype", st_dtype_name_of(en->dtype),
                              "shape", shape, "data_offsets", (json_int_t)off,
                              (json_int_t)(off + en->nbytes));
        if (!t || json_object_set_new(root, en->name, t) != 0)
            goto out;
        off += en->nbytes;
    }
    if (!(js = json_dumps(root, JSON_COMPACT)))
        goto out;
    size_t n = strlen(js), padded = (n + 7) & ~(size_t)7;
    if ((out = wmalloc(padded + 1))) {
        memcpy(out, js, n);
        memset(out + n, ' ', padded - n);
        out[padded] = '\0';
        *len = padded;
    }
out:
    free(js);
    json_decref(root);
    return out;
}

/* Shared state of one st_writer_write_dir call. */
struct st_wjob {
    struct st_writer *w;
    int n_shards;
    char **paths;      /* final path of each shard */
    void *buf;         /* reused fill buffer */
    size_t buf_cap;
    struct progress prog;
};

static int st_write_bytes(FILE *f, const void *p, size_t n, const char *path,
                          struct progress *prog, struct weld_err *e)
{
    const size_t chunk = (size_t)64 << 20;
    const uint8_t *b = p;
    while (n) {
        size_t k = n < chunk ? n : chunk;
        if (fwrite(b, 1, k, f) != k)
            return err_set(e, WELD_ERR_IO, "%s: write failed: %s", path, strerror(errno));
        b += k;
        n -= k;
        progress_add(prog, k);
    }
    return WELD_OK;
}

static int st_write_tensor(struct st_wjob *j, FILE *f, const struct st_wentry *en,
                           const char *path, struct weld_err *e)
{
    if (!en->fill)
        return st_write_bytes(f, en->data, (size_t)en->nbytes, path, &j->prog, e);
    if (en->nbytes > j->buf_cap) {
        void *nb = wrealloc(j->buf, (size_t)en->nbytes);
        if (!nb)
            return err_set(e, WELD_ERR_NOMEM, "%s: tensor '%s': out of memory for %llu bytes",
                           path, en->name, (unsigned long long)en->nbytes);
        j->buf = nb;
        j->buf_cap = (size_t)en->nbytes;
    }
    if (en->nbytes) {
        struct weld_err fe;
        err_clear(&fe);
        int rc = en->fill(en->ctx, j->buf, (size_t)en->nbytes, &fe);
        if (rc != WELD_OK)
            return err_set(e, rc, "%s: tensor '%s': %s", path, en->name,
                           fe.msg[0] ? fe.msg : "fill callback failed");
    }
    return st_write_bytes(f, j->buf, (size_t)en->nbytes, path, &j->prog, e);
}

/* Write shard `shard` to path.tmp. */
static int st_write_shard(struct st_wjob *j, int shard, struct weld_err *e)
{
    const char *path = j->paths[shard];
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp)
        return err_set(e, WELD_ERR_INVALID_ARG, "%s: path too long", path);
    size_t hlen = 0;
    char *hdr = st_shard_header(j->w, shard, &hlen);
    if (!hdr)
        return err_set(e, WELD_ERR_NOMEM, "%s: cannot build the header JSON", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        wfree(hdr);
        return err_set(e, WELD_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
    }
    uint8_t le[8];
    for (int i = 0; i < 8; i++)
        le[i] = (uint8_t)((uint64_t)hlen >> (8 * i));
    int rc = st_write_bytes(f, le, 8, tmp, &j->prog, e);
    if (rc == WELD_OK)
        rc = st_write_bytes(f, hdr, hlen, tmp, &j->prog, e);
    for (int i = 0; rc == WELD_OK && i < j->w->n; i++)
        if (j->w->ents[i].shard == shard)
            rc = st_write_tensor(j, f, &j->w->ents[i], tmp, e);
    if (fclose(f) != 0 && rc == WELD_OK)
        rc = err_set(e, WELD_ERR_IO, "%s: write failed: %s", tmp, strerror(errno));
    wfree(hdr);
    return rc;
}

/* Assign shards greedily; returns the number of shards (>= 1). */
static int st_assign_shards(struct st_writer *w, uint64_t max_shard_bytes, uint64_t *total)
{
    int shard = 0;
    uint64_t cur = 0;
    *total = 0;
    for (int i = 0; i < w->n; i++) {
        uint64_t nb = w->ents[i].nbytes;
        if (max_shard_bytes && cur > 0 && cur + nb > max_shard_bytes) {
            shard++;
            cur = 0;
        }
        w->ents[i].shard = shard;
        cur += nb;
        *total += nb;
    }
    return shard + 1;
}

static int st_write_index(const struct st_wjob *j, const char *dir, uint64_t total,
                          struct weld_err *e)
{
    json_t *wm = json_object();
    json_t *root = json_pack("{s:{s:I}, s:o}", "metadata", "total_size", (json_int_t)total,
                             "weight_map", wm);
    if (!root)
        return err_set(e, WELD_ERR_NOMEM, "%s: out of memory for the index", dir);
    int rc = WELD_OK;
    for (int i = 0; i < j->w->n && rc == WELD_OK; i++) {
        const char *base = strrchr(j->paths[j->w->ents[i].shard], '/') + 1;
        if (json_object_set_new(wm, j->w->ents[i].name, json_string(base)) != 0)
            rc = err_set(e, WELD_ERR_NOMEM, "%s: out of memory for the index", dir);
    }
    char *ipath = rc == WELD_OK ? st_join(dir, ST_INDEX_NAME) : NULL;
    if (rc == WELD_OK && !ipath)
        rc = err_set(e, WELD_ERR_NOMEM, "%s: out of memory", dir);
    if (rc == WELD_OK)
        rc = jsave_file(root, ipath, e);
    wfree(ipath);
    json_decref(root);
    return rc;
}

static int st_make_paths(struct st_wjob *j, const char *dir, struct weld_err *e)
{
    j->paths = wcalloc((size_t)j->n_shards, sizeof *j->paths);
    if (!j->paths)
        return err_set(e, WELD_ERR_NOMEM, "%s: out of memory", dir);
    for (int i = 0; i < j->n_shards; i++) {
        char name[64];
        if (j->n_shards == 1)
            snprintf(name, sizeof name, "model.safetensors");
        else
            snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", i + 1, j->n_shards);
        if (!(j->paths[i] = st_join(dir, name)))
            return err_set(e, WELD_ERR_NOMEM, "%s: out of memory", dir);
    }
    return WELD_OK;
}

/* Rename every shard's .tmp into place (rc == OK), or remove the .tmp files. */
static int st_commit_shards(struct st_wjob *j, int rc, struct weld_err *e)
{
    for (int i = 0; j->paths && i < j->n_shards; i++) {
        char tmp[4096];
        if (!j->paths[i] || snprintf(tmp, sizeof tmp, "%s.tmp", j->paths[i]) >= (int)sizeof tmp)
            continue;
        if (rc == WELD_OK && rename(tmp, j->paths[i]) != 0)
            rc = err_set(e, WELD_ERR_IO, "%s: cannot rename into place: %s", j->paths[i],
                         strerror(errno));
        if (rc != WELD_OK)
            unlink(tmp);
    }
    return rc;
}

int st_writer_write_dir(struct st_writer *w, const char *dir, uint64_t max_shard_bytes,
                        struct weld_err *e)
{
    if (!w || !dir)
        return err_set(e, WELD_ERR_INVALID_ARG, "st_writer_write_dir: no writer or directory");
    if (w->add_status != WELD_OK)
        return err_set(e, w->add_status, "%s: %s", dir, w->add_msg);
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return err_set(e, WELD_ERR_IO, "%s: cannot create directory: %s", dir, strerror(errno));
    struct st_wjob j;
    memset(&j, 0, sizeof j);
    j.w = w;
    uint64_t total;
    j.n_shards = st_assign_shards(w, max_shard_bytes, &total);
    int rc = st_make_paths(&j, dir, e);
    progress_start(&j.prog, "writing safetensors", total);
    for (int i = 0; rc == WELD_OK && i < j.n_shards; i++)
        rc = st_write_shard(&j, i, e);
    rc = st_commit_shards(&j, rc, e);
    progress_end(&j.prog);
    if (rc == WELD_OK && j.n_shards > 1) {
        rc = st_write_index(&j, dir, total, e);
    } else if (rc == WELD_OK) {
        char *ipath = st_join(dir, ST_INDEX_NAME);
        if (ipath)
            unlink(ipath); /* a stale index would shadow the new single file */
        wfree(ipath);
    }
    for (int i = 0; j.paths && i < j.n_shards; i++)
        wfree(j.paths[i]);
    wfree(j.paths);
    wfree(j.buf);
    return rc;
}

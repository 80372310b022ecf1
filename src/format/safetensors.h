/*
 * safetensors - reader and writer for Hugging Face *.safetensors files and sharded sets.
 *
 * File layout: u64 little-endian header length N, N bytes of JSON
 *   {"__metadata__": {str: str}, "name": {"dtype": "F32"|"F16"|"BF16"|...,
 *    "shape": [d0, d1, ...], "data_offsets": [begin, end]}, ...}
 * then the data section; offsets are relative to it. Shapes are row-major with the LAST
 * dimension contiguous (the reverse of GGUF's ne[] order): a Linear weight is
 * [out_features, in_features].
 *
 * Reader: mmaps each file, validates the header JSON (size limit 100 MB, every field typed,
 * offsets in range and non-overlapping, byte size == product(shape) * dtype size) with
 * errors naming file and tensor. A set is one file, or the shards listed by
 * model.safetensors.index.json ("weight_map": {tensor: file}); tensors are looked up by
 * name across shards. Supported dtypes: F32, F16, BF16 (others are reported as
 * unsupported when used, but do not stop the file from opening).
 *
 * Writer: tensors added with a data pointer or a fill callback, written as one file or
 * split into shards of at most max_shard_bytes with an index JSON.
 */
#ifndef WELD_FORMAT_SAFETENSORS_H
#define WELD_FORMAT_SAFETENSORS_H

#include "core/err.h"
#include "core/mfile.h"
#include "format/dtype.h"

#include <stdint.h>

#define ST_MAX_DIMS 8

struct st_tensor {
    char *name;
    int dtype;                /* enum weld_dtype (DT_F32/DT_F16/DT_BF16/...), -1 if unknown */
    char dtype_name[16];      /* as in the file, e.g. "BF16" */
    int n_dims;
    int64_t shape[ST_MAX_DIMS]; /* row-major, last dimension contiguous */
    size_t nbytes;
    const void *data;         /* into the mapping of its shard */
    int shard;                /* index into st_set.files */
};

struct st_set {
    char *dir;                /* directory the set was opened from (or file's directory) */
    int n_files;
    char **file_paths;
    struct mfile *maps;
    int n_tensors;
    struct st_tensor *tensors; /* sorted by name for lookup */
    char *metadata_json;       /* "__metadata__" of the first file, serialized, or NULL */
};

/* Open one .safetensors file. */
int st_open_file(struct st_set **out, const char *path, struct weld_err *e);
/* Open a model directory: model.safetensors.index.json if present, else every
   *.safetensors file in it (sorted). */
int st_open_dir(struct st_set **out, const char *dir, struct weld_err *e);
/* Parse one safetensors image in memory (fuzzing, tests). */
int st_open_memory(struct st_set **out, const void *data, size_t size, const char *name,
                   struct weld_err *e);
void st_close(struct st_set *s);
const struct st_tensor *st_find(const struct st_set *s, const char *name);

struct st_writer;
typedef int (*st_fill_fn)(void *ctx, void *dst, size_t size, struct weld_err *e);
struct st_writer *st_writer_create(void);
void st_writer_free(struct st_writer *w);
/* shape is row-major (safetensors order). dtype must be DT_F32, DT_F16 or DT_BF16. */
int st_writer_add(struct st_writer *w, const char *name, int dtype, int n_dims,
                  const int64_t *shape, const void *data);
int st_writer_add_fn(struct st_writer *w, const char *name, int dtype, int n_dims,
                     const int64_t *shape, st_fill_fn fill, void *ctx);
int st_writer_set_metadata(struct st_writer *w, const char *key, const char *value);
/* Write dir/model.safetensors, or dir/model-0000i-of-0000n.safetensors plus
   model.safetensors.index.json when the data exceeds max_shard_bytes (0: never split). */
int st_writer_write_dir(struct st_writer *w, const char *dir, uint64_t max_shard_bytes,
                        struct weld_err *e);

#endif

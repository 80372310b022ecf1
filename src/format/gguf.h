/*
 * gguf - reader and writer for GGUF v2/v3 model files (llama.cpp's format).
 *
 * File layout (little-endian): magic "GGUF", u32 version, u64 n_tensors, u64 n_kv; n_kv
 * key/value pairs (gguf string key, u32 value type, value; arrays are u32 element type,
 * u64 count, elements); n_tensors tensor infos (name, u32 n_dims, u64 ne[n_dims], u32
 * type, u64 offset relative to the data section); padding to `general.alignment`
 * (default 32); the data section. A gguf string is u64 length + bytes (no NUL).
 *
 * Reader: the file is mmapped; every count, length, offset and size is checked against
 * the bytes that exist before it is used, so a truncated or hostile file yields a
 * WELD_ERR_FORMAT naming the file, the byte offset and the key or tensor involved, never a
 * crash. Keys and tensor names are copied NUL-terminated; string values and numeric array
 * data point into the mapping. Tensor data pointers point into the mapping (aligned as the
 * file says).
 *
 * Writer: collect key/values and tensor infos, then write. Tensor data either comes from a
 * pointer given at add time (must stay valid until write) or from a callback that fills the
 * tensor's bytes at write time, so multi-GB models are written without being held in
 * memory. Keys keep the order they were set in; setting an existing key replaces it.
 */
#ifndef WELD_FORMAT_GGUF_H
#define WELD_FORMAT_GGUF_H

#include "core/err.h"
#include "core/mfile.h"
#include "format/dtype.h"

#include <stdbool.h>
#include <stdint.h>

#define GGUF_MAX_DIMS 4
#define GGUF_DEFAULT_ALIGNMENT 32

enum gguf_type {
    GGUF_TYPE_UINT8 = 0,
    GGUF_TYPE_INT8 = 1,
    GGUF_TYPE_UINT16 = 2,
    GGUF_TYPE_INT16 = 3,
    GGUF_TYPE_UINT32 = 4,
    GGUF_TYPE_INT32 = 5,
    GGUF_TYPE_FLOAT32 = 6,
    GGUF_TYPE_BOOL = 7,
    GGUF_TYPE_STRING = 8,
    GGUF_TYPE_ARRAY = 9,
    GGUF_TYPE_UINT64 = 10,
    GGUF_TYPE_INT64 = 11,
    GGUF_TYPE_FLOAT64 = 12,
    GGUF_TYPE_COUNT
};

struct gguf_str {
    const char *ptr; /* not NUL-terminated; points into the mapping */
    uint64_t len;
};

struct gguf_kv {
    char *key;           /* NUL-terminated copy */
    enum gguf_type type; /* of the value; GGUF_TYPE_ARRAY for arrays */
    union {
        uint64_t u64;    /* every unsigned integer type and bool, widened */
        int64_t i64;     /* every signed integer type, widened */
        double f64;      /* FLOAT32 and FLOAT64, widened */
        struct gguf_str str;
    } v;
    /* arrays (type == GGUF_TYPE_ARRAY) */
    enum gguf_type arr_type; /* element type (never ARRAY: nested arrays are skipped over
                                and reported as arr_n elements with arr_data NULL and
                                arr_type GGUF_TYPE_COUNT) */
    uint64_t arr_n;
    const void *arr_data;    /* numeric elements, packed little-endian, maybe unaligned */
    struct gguf_str *arr_str; /* string elements (arr_n of them), heap array */
};

struct gguf_tensor {
    char *name;
    int n_dims;
    int64_t ne[GGUF_MAX_DIMS]; /* ne[0] is the contiguous (row) dimension; unused are 1 */
    enum weld_dtype type;
    uint64_t offset;           /* relative to the data section */
    size_t nbytes;
    const void *data;          /* into the mapping */
};

struct gguf_file {
    char *path;
    struct mfile map;
    uint32_t version;
    uint64_t n_kv;
    struct gguf_kv *kv;
    uint64_t n_tensors;
    struct gguf_tensor *tensors;
    uint64_t alignment;
    uint64_t data_offset; /* start of the data section in the file */
};

int gguf_open(struct gguf_file **out, const char *path, struct weld_err *e);
/* Parse a GGUF image already in memory (kept by the caller while the result lives). */
int gguf_open_memory(struct gguf_file **out, const void *data, size_t size, const char *name,
                     struct weld_err *e);
void gguf_close(struct gguf_file *f);

const struct gguf_kv *gguf_find_kv(const struct gguf_file *f, const char *key);
const struct gguf_tensor *gguf_find_tensor(const struct gguf_file *f, const char *name);

/* Typed getters: WELD_OK; WELD_ERR_NOT_FOUND if absent (out untouched); WELD_ERR_FORMAT if
   of an incompatible type or out of range (message names file and key). Integer getters
   accept any integer type that fits; float getters accept FLOAT32/FLOAT64 and integers. */
int gguf_get_u32(const struct gguf_file *f, const char *key, uint32_t *out, struct weld_err *e);
int gguf_get_i64(const struct gguf_file *f, const char *key, int64_t *out, struct weld_err *e);
int gguf_get_f32(const struct gguf_file *f, const char *key, float *out, struct weld_err *e);
int gguf_get_bool(const struct gguf_file *f, const char *key, bool *out, struct weld_err *e);
int gguf_get_str(const struct gguf_file *f, const char *key, struct gguf_str *out,
                 struct weld_err *e);
/* An array key whose element type is exactly elem; *out = the kv. */
int gguf_get_arr(const struct gguf_file *f, const char *key, enum gguf_type elem,
                 const struct gguf_kv **out, struct weld_err *e);
/* "u8", "i32", "string", "array", ...; "unknown" for anything else. */
const char *gguf_type_name(enum gguf_type t);
/* Element i (< arr_n) of a numeric array as double / int64 (any numeric element type; for
   int64, u64 values above INT64_MAX wrap and floats truncate, NaN or out of range giving 0). */
double gguf_arr_f64(const struct gguf_kv *kv, uint64_t i);
int64_t gguf_arr_i64(const struct gguf_kv *kv, uint64_t i);

/* ---- writer ---- */

struct gguf_writer;
/* Fills `size` bytes of tensor data at dst; returns WELD_OK or an error status. */
typedef int (*gguf_fill_fn)(void *ctx, void *dst, size_t size, struct weld_err *e);

struct gguf_writer *gguf_writer_create(void); /* NULL on out of memory */
void gguf_writer_free(struct gguf_writer *w);
int gguf_writer_set_u8(struct gguf_writer *w, const char *key, uint8_t v);
int gguf_writer_set_u32(struct gguf_writer *w, const char *key, uint32_t v);
int gguf_writer_set_i32(struct gguf_writer *w, const char *key, int32_t v);
int gguf_writer_set_u64(struct gguf_writer *w, const char *key, uint64_t v);
int gguf_writer_set_f32(struct gguf_writer *w, const char *key, float v);
int gguf_writer_set_bool(struct gguf_writer *w, const char *key, bool v);
int gguf_writer_set_str(struct gguf_writer *w, const char *key, const char *v);
int gguf_writer_set_strn(struct gguf_writer *w, const char *key, const char *v, size_t len);
/* Array of n numeric elements of type elem, copied (elem_size * n bytes). */
int gguf_writer_set_arr(struct gguf_writer *w, const char *key, enum gguf_type elem,
                        const void *data, uint64_t n);
/* Array of n strings (lens may be NULL for NUL-terminated strings), copied. */
int gguf_writer_set_arr_str(struct gguf_writer *w, const char *key, const char *const *strs,
                            const uint64_t *lens, uint64_t n);
/* Copy every kv of a reader into the writer (for conversions that keep metadata). */
int gguf_writer_copy_kv(struct gguf_writer *w, const struct gguf_file *f, struct weld_err *e);

/* Add a tensor whose bytes are at data (kept by the caller until write). */
int gguf_writer_add_tensor(struct gguf_writer *w, const char *name, enum weld_dtype type,
                           int n_dims, const int64_t *ne, const void *data);
/* Add a tensor whose bytes the callback fills at write time. */
int gguf_writer_add_tensor_fn(struct gguf_writer *w, const char *name, enum weld_dtype type,
                              int n_dims, const int64_t *ne, gguf_fill_fn fill, void *ctx);
/* Write the file (version 3). Shows a progress bar when it takes over a second. */
int gguf_writer_write(struct gguf_writer *w, const char *path, struct weld_err *e);

#endif

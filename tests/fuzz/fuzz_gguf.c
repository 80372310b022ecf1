/*
 * fuzz_gguf - libFuzzer target for the GGUF reader: parse the input with
 * gguf_open_memory(), then touch everything the reader hands out (every kv, every string
 * and array element, every tensor's bytes, the typed getters, dequantizing the first row of
 * each tensor weld can dequantize) so any out-of-bounds pointer shows up under ASan.
 * Seeds (the .seed files in corpus/fuzz_gguf) are tiny hand-built GGUF images (no model weights),
 * committed: made once with the gguf writer and with test_format_gguf's image builders.
 */
#include "format/gguf.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static volatile uint64_t sink;
static volatile double dsink;

static void touch(const void *p, uint64_t n)
{
    const uint8_t *b = p;
    uint64_t acc = 0;
    for (uint64_t i = 0; i < n; i++)
        acc += b[i];
    sink += acc;
}

static void walk_kv(const struct gguf_file *f, const struct gguf_kv *kv)
{
    struct weld_err e;
    uint32_t u;
    int64_t i64;
    float f32;
    bool b;
    struct gguf_str s;
    const struct gguf_kv *arr;
    sink += strlen(kv->key);
    (void)gguf_get_u32(f, kv->key, &u, &e);
    (void)gguf_get_i64(f, kv->key, &i64, &e);
    (void)gguf_get_f32(f, kv->key, &f32, &e);
    (void)gguf_get_bool(f, kv->key, &b, &e);
    if (gguf_get_str(f, kv->key, &s, &e) == WELD_OK)
        touch(s.ptr, s.len);
    if (kv->type != GGUF_TYPE_ARRAY)
        return;
    if (kv->arr_type == GGUF_TYPE_STRING) {
        for (uint64_t i = 0; i < kv->arr_n; i++)
            touch(kv->arr_str[i].ptr, kv->arr_str[i].len);
    } else if (kv->arr_data && gguf_get_arr(f, kv->key, kv->arr_type, &arr, &e) == WELD_OK) {
        for (uint64_t i = 0; i < kv->arr_n; i++) {
            sink += (uint64_t)gguf_arr_i64(kv, i);
            dsink += gguf_arr_f64(kv, i);
        }
    }
}

static void walk_tensor(const struct gguf_file *f, const struct gguf_tensor *t)
{
    if (gguf_find_tensor(f, t->name) != t)
        abort();
    touch(t->data, t->nbytes);
    const struct dtype_info *di = dtype_get((int)t->type);
    if (!di)
        abort();
    if (di->can_dequantize && t->ne[0] > 0 && t->ne[0] <= 4096 && t->nbytes) {
        float row[4096];
        if (dtype_row_bytes((int)t->type, t->ne[0]) > t->nbytes)
            abort();
        dtype_dequantize_row((int)t->type, t->data, row, t->ne[0]);
        touch(row, sizeof(float) * (size_t)t->ne[0]);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* a private exact-size copy, so reading one byte past the end is caught */
    uint8_t *copy = malloc(size ? size : 1);
    if (!copy)
        return 0;
    memcpy(copy, data, size);
    struct gguf_file *f = NULL;
    struct weld_err e;
    if (gguf_open_memory(&f, copy, size, "fuzz.gguf", &e) == WELD_OK) {
        for (uint64_t i = 0; i < f->n_kv; i++) {
            walk_kv(f, &f->kv[i]);
            if (gguf_find_kv(f, f->kv[i].key) != &f->kv[i])
                abort();
        }
        for (uint64_t i = 0; i < f->n_tensors; i++)
            walk_tensor(f, &f->tensors[i]);
        gguf_close(f);
    } else if (f != NULL || !e.msg[0]) {
        abort(); /* a failure must leave *out NULL and say why */
    }
    free(copy);
    return 0;
}

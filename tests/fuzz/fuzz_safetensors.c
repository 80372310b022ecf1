/*
 * fuzz_safetensors - libFuzzer target for the safetensors header parser.
 *
 * The input is a whole .safetensors image, opened with st_open_memory from an exact-size
 * copy (so ASan catches any read past the end). When it opens, every tensor is looked up
 * by name and must be found at its own slot, and its bytes are touched to prove the data
 * pointer and size lie inside the image. Seeds live in tests/fuzz/corpus/fuzz_safetensors/.
 */
#include "format/safetensors.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t *copy = malloc(size ? size : 1);
    if (!copy)
        return 0;
    memcpy(copy, data, size);
    struct st_set *s = NULL;
    struct weld_err e;
    if (st_open_memory(&s, copy, size, "fuzz.safetensors", &e) == WELD_OK) {
        volatile uint8_t sink = 0;
        for (int i = 0; i < s->n_tensors; i++) {
            const struct st_tensor *t = &s->tensors[i];
            if (st_find(s, t->name) != t)
                abort();
            const uint8_t *p = t->data;
            if (t->nbytes) {
                sink ^= p[0];
                sink ^= p[t->nbytes - 1];
            }
        }
        (void)sink;
        st_close(s);
    } else if (s != NULL || e.msg[0] == '\0') {
        abort();
    }
    free(copy);
    return 0;
}

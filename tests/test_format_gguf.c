/* Tests for src/format/gguf.c: the reader on a real model, writer round trips, and corrupted
   files (every one must give WELD_ERR_FORMAT with a message naming the problem). */
#include "core/alloc.h"
#include "core/mfile.h"
#include "format/gguf.h"
#include "test.h"

#include <stdint.h>

static int str_eq(struct gguf_str s, const char *z)
{
    return s.len == strlen(z) && memcmp(s.ptr, z, s.len) == 0;
}

TEST(reads_stories260k)
{
    const char *path = test_shared_path("models/stories260K.gguf");
    REQUIRE(path != NULL);
    struct weld_err e = {0};
    struct gguf_file *f = NULL;
    int rc = gguf_open(&f, path, &e);
    if (rc)
        fprintf(stderr, "%s\n", e.msg);
    REQUIRE(rc == WELD_OK);
    struct gguf_str s;
    CHECK_EQ_INT(gguf_get_str(f, "general.architecture", &s, &e), WELD_OK);
    CHECK(str_eq(s, "llama"));
    uint32_t u = 0;
    CHECK_EQ_INT(gguf_get_u32(f, "llama.embedding_length", &u, &e), WELD_OK);
    CHECK_EQ_INT(u, 64);
    CHECK_EQ_INT(gguf_get_u32(f, "llama.block_count", &u, &e), WELD_OK);
    CHECK_EQ_INT(u, 5);
    const struct gguf_kv *toks = NULL;
    CHECK_EQ_INT(gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_TYPE_STRING, &toks, &e), WELD_OK);
    REQUIRE(toks != NULL);
    CHECK_EQ_INT(toks->arr_n, 512);
    const struct gguf_tensor *t = gguf_find_tensor(f, "token_embd.weight");
    REQUIRE(t != NULL);
    CHECK_EQ_INT(t->type, DT_F32);
    CHECK_EQ_INT(t->n_dims, 2);
    CHECK_EQ_INT(t->ne[0], 64);
    CHECK_EQ_INT(t->ne[1], 512);
    CHECK_EQ_INT(t->nbytes, 64 * 512 * 4);
    CHECK_EQ_INT(((uintptr_t)t->data - (uintptr_t)f->map.data) % f->alignment, 0);
    CHECK(gguf_find_tensor(f, "nope") == NULL);
    CHECK(gguf_find_kv(f, "nope") == NULL);
    CHECK_EQ_INT(gguf_get_u32(f, "nope", &u, &e), WELD_ERR_NOT_FOUND);
    CHECK_EQ_INT(gguf_get_u32(f, "general.architecture", &u, &e), WELD_ERR_FORMAT);
    CHECK(strstr(e.msg, "general.architecture") != NULL);
    gguf_close(f);
    gguf_close(NULL);
}

int main(void)
{
    RUN(reads_stories260k);
    return test_summary();
}

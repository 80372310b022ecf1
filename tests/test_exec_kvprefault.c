/*
 * test_exec_kvprefault - a KV pool larger than kv_config.prefault_bytes is touched at
 * creation only in its lowest blocks (issue 26: a 110M model's 2.3 GiB default pool took
 * seconds to start); a pool within the budget is touched whole. Checked with mincore().
 */
#include "test.h"

#include "exec/kv.h"

#include <sys/mman.h>
#include <unistd.h>

/* Is the page holding p resident? */
static int resident(const uint8_t *p)
{
    long pg = sysconf(_SC_PAGESIZE);
    unsigned char v = 0;
    void *a = (void *)((uintptr_t)p & ~(uintptr_t)(pg - 1));
    return mincore(a, 1, &v) == 0 && (v & 1);
}

TEST(prefault_budget)
{
    /* 2 layers, 4 heads of 64 f32 (1 KiB rows), blocks of 16, 1024 blocks: 32 MiB planes
       (under the 2 MiB-page threshold); 4 MiB budget = 64 blocks. */
    struct kv_config kc = {.n_layer = 2, .kv_dim = 256, .head_dim = 64, .max_seqs = 1,
                           .max_ctx = 16384, .block_size = 16, .n_blocks = 1024,
                           .type = DT_F32, .prefault_bytes = (size_t)4 << 20};
    struct kv_cache *kv = NULL;
    struct weld_err e = {0};
    REQUIRE(kv_create(&kv, &kc, &e) == WELD_OK);
    int low = 0, high = 0;
    for (int l = 0; l < 2; l++)
        for (int h = 0; h < 4; h++) {
            low += resident(kv_slot_head(kv, kv->k, l, 0, 0, h)) +
                   resident(kv_slot_head(kv, kv->v, l, 63, 15, h));
            high += resident(kv_slot_head(kv, kv->k, l, 1000, 0, h)) +
                    resident(kv_slot_head(kv, kv->v, l, 1023, 15, h));
        }
    CHECK_EQ_INT(low, 16);
    CHECK_EQ_INT(high, 0);
    kv_free(kv);
    kc.prefault_bytes = (size_t)64 << 20; /* the whole pool fits: all touched */
    REQUIRE(kv_create(&kv, &kc, &e) == WELD_OK);
    high = 0;
    for (int h = 0; h < 4; h++)
        high += resident(kv_slot_head(kv, kv->v, 1, 1023, 15, h));
    CHECK_EQ_INT(high, 4);
    kv_free(kv);
}

int main(void)
{
    RUN(prefault_budget);
    return test_summary();
}

/*
 * test_engine_kvsize - the automatic KV pool size (engine_kv_auto_bytes): what
 * max_num_seqs sequences of max_model_len need, capped by half of MemAvailable beside the
 * weights, never below one full sequence.
 */
#include "test.h"

#include "engine/engine.h"

#define MiB(x) ((uint64_t)(x) << 20)
#define GiB(x) ((uint64_t)(x) << 30)

TEST(auto_bytes)
{
    /* llama-110m at serve's defaults: 64 x 1024 tokens x 36 KiB = 2.25 GiB, all free */
    uint64_t seq = 1024ull * 36864;
    CHECK(engine_kv_auto_bytes(seq, 64, GiB(23), MiB(286)) == 64 * seq);
    CHECK(engine_kv_auto_bytes(seq, 1, GiB(23), MiB(286)) == seq); /* generate */
    /* capped by half of (free - weights) */
    CHECK(engine_kv_auto_bytes(seq, 64, GiB(2), MiB(286)) == (GiB(2) - MiB(286)) / 2);
    /* weights beyond free memory: a quarter of it; unknown: 1 GiB */
    CHECK(engine_kv_auto_bytes(GiB(1), 64, GiB(4), GiB(8)) == GiB(1));
    CHECK(engine_kv_auto_bytes(MiB(1), 4096, 0, GiB(8)) == GiB(1));
    /* floor: one full sequence even when memory says less */
    CHECK(engine_kv_auto_bytes(GiB(4), 8, GiB(2), GiB(1)) == GiB(4));
    /* no overflow */
    CHECK(engine_kv_auto_bytes(UINT64_MAX / 2, 64, GiB(16), 0) == UINT64_MAX / 2); /* no wrap */
}

int main(void)
{
    RUN(auto_bytes);
    return test_summary();
}

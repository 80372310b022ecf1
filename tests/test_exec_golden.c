/*
 * Golden test: stories260K.gguf (shared/models) loaded with model_load and run through the
 * runner must reproduce llama.cpp (commit 81ff7abe): greedy decoding of 32 tokens after
 * the prompt ids 1 403 407 261 378 gives exactly the ids below, and the logits at the
 * first generated position put token 432 on top, then 383.
 *
 * Logit values: shared/models/README.md quotes 17.798 / 14.282, what llama.cpp gives with
 * its defaults (flash attention, f16 K/V on the CPU). With f32 K/V and flash attention
 * off (llama_context_params type_k = type_v = GGML_TYPE_F32, flash_attn_type = DISABLED),
 * llama.cpp gives 17.799397 / 14.281260; weld computes attention in f32, so it is checked
 * against those (tolerance 1e-3), and against the README values within 2e-3.
 *
 * The greedy run is done with each KV cache type. f32 K/V is checked against the f32
 * numbers above; f16 K/V (weld's default, stored rounded to nearest even, attention in
 * f32) against the README's f16 numbers within 2e-3; bf16 and q8_0 must still give the
 * golden tokens (stories260K has head_dim 8, so q8_0, which needs head_dim % 32 == 0, is
 * refused with an error naming head_dim).
 *
 * The same run is repeated batched with a second copy of the prompt (chunked prefill,
 * n_splits 3): tokens identical and logits bit-identical.
 */
#include "exec/runner.h"
#include "model/model.h"
#include "test.h"

static const int32_t prompt[5] = {1, 403, 407, 261, 378};
static const int32_t golden[32] = {432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426,
                                   338, 401, 396, 267, 337, 410, 408, 419, 292, 411, 322,
                                   265, 282, 295, 433, 426, 385, 328, 432, 358, 394};

static int argmax(const float *v, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[best])
            best = i;
    return best;
}

static struct model *load(void)
{
    const char *path = test_shared_path("models/stories260K.gguf");
    if (!path) {
        fprintf(stderr, "stories260K.gguf not found (set WELD_SHARED)\n");
        return NULL;
    }
    struct model *m = NULL;
    struct weld_err e;
    if (model_load(&m, path, &e)) {
        fprintf(stderr, "model_load: %s\n", e.msg);
        return NULL;
    }
    return m;
}

static void greedy_32_tokens(enum weld_dtype kv_type)
{
    struct model *m = load();
    REQUIRE(m != NULL);
    const int V = m->cfg.n_vocab;
    float *lg = malloc(sizeof(float) * (size_t)V);
    struct runner *r;
    struct weld_err e;
    struct backend_params bp;
    backend_params_init(&bp, 1, 0);
    bp.tuning.executor = test_exec;
    bp.kv_type = kv_type;
    REQUIRE(runner_create_ex(&r, m, &bp, &e) == WELD_OK);
    int32_t toks[40];
    memcpy(toks, prompt, sizeof prompt);
    int n = 5;
    for (int step = 0; step < 32; step++) {
        struct batch_seq bs = {
            0,    step ? toks + n - 1 : toks, step ? 1 : n, step ? n - 1 : 0, false, NULL, 0, NULL,
            false};
        struct batch b = {.seqs = &bs, .n_seqs = 1};
        REQUIRE(runner_forward(r, &b, lg, &e) == WELD_OK);
        int best = argmax(lg, V);
        if (step == 0) {
            int second = best == 0 ? 1 : 0;
            for (int i = 0; i < V; i++)
                if (i != best && lg[i] > lg[second])
                    second = i;
            CHECK_EQ_INT(best, 432);
            CHECK_EQ_INT(second, 383);
            if (getenv("SHOWDIFF"))
                fprintf(stderr, "kv %s: %.6f %.6f\n", dtype_name(kv_type), lg[432], lg[383]);
            if (kv_type == DT_F32) {
                CHECK_NEAR(lg[432], 17.799397, 1e-3);
                CHECK_NEAR(lg[383], 14.281260, 1e-3);
            }
            if (kv_type == DT_F32 || kv_type == DT_F16) {
                CHECK_NEAR(lg[432], 17.798, 2e-3);
                CHECK_NEAR(lg[383], 14.282, 2e-3);
            }
        }
        if (best != golden[step]) {
            fprintf(stderr, "kv %s, step %d: got %d, want %d\n", dtype_name(kv_type), step,
                    best, golden[step]);
            CHECK(0);
            break;
        }
        toks[n++] = best;
    }
    runner_free(r);
    free(lg);
    model_free(m);
}

TEST(greedy_32_tokens_f16_kv) { greedy_32_tokens(DT_F16); }
TEST(greedy_32_tokens_f32_kv) { greedy_32_tokens(DT_F32); }
TEST(greedy_32_tokens_bf16_kv) { greedy_32_tokens(DT_BF16); }

TEST(q8_0_kv_refused)
{
    struct model *m = load();
    REQUIRE(m != NULL);
    struct runner *r = NULL;
    struct weld_err e;
    struct backend_params bp;
    backend_params_init(&bp, 1, 0);
    bp.tuning.executor = test_exec;
    bp.kv_type = DT_Q8_0;
    CHECK_EQ_INT(runner_create_ex(&r, m, &bp, &e), WELD_ERR_UNSUPPORTED);
    CHECK(strstr(e.msg, "head_dim is 8") != NULL);
    CHECK(r == NULL);
    CHECK(backend_kv_block_bytes(&m->cfg, DT_Q8_0, 0) == 0);
    model_free(m);
}

/* Two copies of the prompt: seq 3 prefilled in chunks of 2, seq 1 whole and one step
   later, both decoded in the same batches; n_splits 3. */
TEST(batched_copies_match)
{
    struct model *m = load();
    REQUIRE(m != NULL);
    const int V = m->cfg.n_vocab;
    float *lg = malloc(sizeof(float) * 2 * (size_t)V);
    struct backend_params bp; /* default f16 KV */
    backend_params_init(&bp, 4, 64);
    bp.tuning.executor = test_exec;
    bp.n_splits = 3;
    bp.kv_block_size = 8;
    struct runner *r;
    struct weld_err e;
    REQUIRE(runner_create_ex(&r, m, &bp, &e) == WELD_OK);
    int32_t a[40], b[40];
    memcpy(a, prompt, sizeof prompt);
    memcpy(b, prompt, sizeof prompt);
    int na = 0, nb = 0, genA = 0, genB = 0; /* tokens fed so far; tokens generated */
    for (int step = 0; genA < 32 || genB < 32; step++) {
        struct batch_seq bs[2];
        int n = 0, lenA = 5 + genA, lenB = 5 + genB;
        int ca = lenA - na < 2 ? lenA - na : 2;
        if (genA < 32)
            bs[n++] = (struct batch_seq){3, a + na, ca, na, false, NULL, 0, NULL, false};
        if (step >= 1 && genB < 32)
            bs[n++] = (struct batch_seq){1, b + nb, lenB - nb, nb, false, NULL, 0, NULL, false};
        struct batch batch = {.seqs = bs, .n_seqs = n};
        REQUIRE(runner_forward(r, &batch, lg, &e) == WELD_OK);
        int row = 0;
        if (genA < 32) {
            na += ca;
            if (na == lenA)
                a[5 + genA++] = argmax(lg, V);
            row++;
        }
        if (step >= 1 && genB < 32) {
            nb = lenB;
            b[5 + genB++] = argmax(lg + (size_t)row * V, V);
        }
    }
    CHECK(memcmp(a + 5, golden, sizeof golden) == 0);
    CHECK(memcmp(b + 5, golden, sizeof golden) == 0);
    runner_free(r);
    free(lg);
    model_free(m);
}

int main(int argc, char **argv)
{
    test_args(argc, argv);
    RUN(greedy_32_tokens_f16_kv);
    RUN(greedy_32_tokens_f32_kv);
    RUN(greedy_32_tokens_bf16_kv);
    RUN(q8_0_kv_refused);
    RUN(batched_copies_match);
    return test_summary();
}

/*
 * The same random model written as a GGUF file and as a Hugging Face directory (by
 * mkmodel, same seed) gives the same logits through the whole stack: loader, Q/K
 * permutation + adjacent-pair rope (GGUF llama) versus rotate-half rope (HF), tied and
 * untied embeddings, llama3 rope factors from rope_freqs.weight versus config.json.
 */
#include "core/alloc.h"
#include "exec/runner.h"
#include "model/mkmodel.h"
#include "model/model.h"
#include "test.h"

static float max_abs(const float *a, size_t n)
{
    float m = 0;
    for (size_t i = 0; i < n; i++)
        m = fabsf(a[i]) > m ? fabsf(a[i]) : m;
    return m;
}

/* Run a 12-token prompt and 4 decode steps; return all logit rows (5 x n_vocab). */
static float *run(const char *path, int *n_vocab)
{
    struct weld_err e;
    struct model *m = NULL;
    struct runner *r = NULL;
    if (model_load(&m, path, &e) != WELD_OK) {
        fprintf(stderr, "%s\n", e.msg);
        return NULL;
    }
    if (runner_create(&r, m, 1, 64, &e) != WELD_OK) {
        fprintf(stderr, "%s\n", e.msg);
        model_free(m);
        return NULL;
    }
    int nv = runner_n_vocab(r);
    float *out = wcalloc(5 * (size_t)nv, sizeof(float));
    int32_t prompt[12];
    for (int i = 0; i < 12; i++)
        prompt[i] = (int32_t)((i * 37 + 5) % nv);
    struct batch_seq s = {.seq_id = 0, .tokens = prompt, .n_tokens = 12, .pos = 0};
    struct batch b = {.seqs = &s, .n_seqs = 1};
    for (int step = 0; step < 5 && out; step++) {
        if (runner_forward(r, &b, out + (size_t)step * nv, &e) != WELD_OK) {
            fprintf(stderr, "%s\n", e.msg);
            wfree(out);
            out = NULL;
            break;
        }
        s.pos += s.n_tokens;
        s.tokens = &prompt[step];
        s.n_tokens = 1;
    }
    *n_vocab = nv;
    runner_free(r);
    model_free(m);
    return out;
}

static void same_logits(enum model_arch arch, int dtype, bool llama3_rope, bool tied)
{
    struct weld_err e;
    struct model_config c;
    REQUIRE(mkmodel_preset("tiny", arch, &c, &e) == WELD_OK);
    c.n_vocab = 300;
    c.tied_embeddings = tied;
    if (llama3_rope) {
        c.rope_scaling = ROPE_SCALING_LLAMA3;
        c.rope_factor = 8;
        c.rope_low_freq_factor = 1;
        c.rope_high_freq_factor = 4;
        c.rope_orig_ctx = 16;
        c.rope_theta = 500000;
    }
    char gguf[4200], hf[4200];
    snprintf(gguf, sizeof gguf, "%s/%s-%d-%d-%d.gguf", test_tmpdir(), model_arch_name(arch),
             dtype, llama3_rope, tied);
    snprintf(hf, sizeof hf, "%s/%s-%d-%d-%d-hf", test_tmpdir(), model_arch_name(arch), dtype,
             llama3_rope, tied);
    struct mkmodel_opts o = {.tokenizer = NULL, .dtype = dtype, .seed = 11, .out = gguf};
    REQUIRE(mkmodel_write(&c, &o, &e) == WELD_OK);
    o.out = hf;
    REQUIRE(mkmodel_write(&c, &o, &e) == WELD_OK);
    int nv1 = 0, nv2 = 0;
    float *a = run(gguf, &nv1), *b = run(hf, &nv2);
    REQUIRE(a && b);
    REQUIRE(nv1 == nv2);
    size_t n = 5 * (size_t)nv1;
    float scale = max_abs(a, n), worst = 0;
    for (size_t i = 0; i < n; i++)
        worst = fabsf(a[i] - b[i]) > worst ? fabsf(a[i] - b[i]) : worst;
    CHECK(scale > 0);
    CHECK(worst <= 1e-5f * scale);
    if (worst > 1e-5f * scale)
        fprintf(stderr, "  %s dtype %d: max |gguf - hf| = %g (scale %g)\n",
                model_arch_name(arch), dtype, worst, scale);
    wfree(a);
    wfree(b);
}

TEST(llama_f32) { same_logits(ARCH_LLAMA, DT_F32, false, false); }
TEST(llama_f32_tied_llama3_rope) { same_logits(ARCH_LLAMA, DT_F32, true, true); }
TEST(llama_f16) { same_logits(ARCH_LLAMA, DT_F16, false, false); }
TEST(llama_bf16) { same_logits(ARCH_LLAMA, DT_BF16, false, true); }
TEST(qwen2_f32) { same_logits(ARCH_QWEN2, DT_F32, false, true); }
TEST(qwen3_f32) { same_logits(ARCH_QWEN3, DT_F32, false, true); }
TEST(qwen3_bf16) { same_logits(ARCH_QWEN3, DT_BF16, false, false); }

int main(void)
{
    RUN(llama_f32);
    RUN(llama_f32_tied_llama3_rope);
    RUN(llama_f16);
    RUN(llama_bf16);
    RUN(qwen2_f32);
    RUN(qwen3_f32);
    RUN(qwen3_bf16);
    return test_summary();
}

/*
 * llamacpp_side - the llama.cpp half of weld_llamacpp_pair (bench/llamacpp_pair.c): a
 * context run the way llama-bench runs it, behind a small C interface
 * (bench/llamacpp_side.h), in a file of its own because llama.cpp's headers and weld's
 * declare the same GGUF names. See llamacpp_pair.c for the method.
 */
#include "llamacpp_side.h"

#include "ggml-cpu.h"
#include "llama.h"

#include <stdio.h>
#include <stdlib.h>

struct lside {
    struct llama_model *model;
    struct llama_context *ctx;
    struct ggml_threadpool *tp;
};

static void quiet(enum ggml_log_level level, const char *text, void *user)
{
    (void)user;
    if (level == GGML_LOG_LEVEL_ERROR)
        fputs(text, stderr);
}

void lside_init(void)
{
    llama_log_set(quiet, NULL);
    llama_backend_init();
}

void lside_fini(void) { llama_backend_free(); }

int lside_open(struct lside **out, const char *path, int threads, int n_ctx, char *err,
               size_t err_n)
{
    struct lside *l = calloc(1, sizeof *l);
    *out = l;
    if (!l) {
        snprintf(err, err_n, "out of memory");
        return -1;
    }
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    mp.use_mlock =
        true; /* resident, as weld's pool is: this host's DAMON pages out idle file pages */
    if (!(l->model = llama_model_load_from_file(path, mp))) {
        snprintf(err, err_n, "llama.cpp could not load %s", path);
        return -1;
    }
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t)n_ctx;
    cp.n_batch = 2048;
    cp.n_ubatch = 512;
    cp.type_k = GGML_TYPE_F16;
    cp.type_v = GGML_TYPE_F16;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_AUTO;
    cp.n_threads = threads;
    cp.n_threads_batch = threads;
    cp.no_perf = true;
    if (!(l->ctx = llama_init_from_model(l->model, cp))) {
        snprintf(err, err_n, "llama.cpp could not make a context of %d positions", n_ctx);
        return -1;
    }
    struct ggml_threadpool_params tpp = ggml_threadpool_params_default(threads);
    tpp.poll = 50;
    if (!(l->tp = ggml_threadpool_new(&tpp))) {
        snprintf(err, err_n, "llama.cpp: a threadpool of %d threads failed", threads);
        return -1;
    }
    llama_attach_threadpool(l->ctx, l->tp, NULL);
    return 0;
}

int lside_n_vocab(const struct lside *l)
{
    return llama_vocab_n_tokens(llama_model_get_vocab(l->model));
}

int32_t lside_bos(const struct lside *l)
{
    const struct llama_vocab *v = llama_model_get_vocab(l->model);
    return llama_vocab_get_add_bos(v) ? llama_vocab_bos(v) : -1;
}

int lside_decode(struct lside *l, int32_t *ids, int n)
{
    int32_t rc = llama_decode(l->ctx, llama_batch_get_one(ids, n));
    llama_synchronize(l->ctx);
    return (int)rc;
}

void lside_clear(struct lside *l) { llama_memory_clear(llama_get_memory(l->ctx), true); }

void lside_pause(struct lside *l) { ggml_threadpool_pause(l->tp); }

void lside_resume(struct lside *l) { ggml_threadpool_resume(l->tp); }

void lside_close(struct lside *l)
{
    if (!l)
        return;
    if (l->ctx)
        llama_free(l->ctx);
    if (l->tp)
        ggml_threadpool_free(l->tp);
    if (l->model)
        llama_model_free(l->model);
    free(l);
}

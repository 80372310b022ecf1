/*
 * llamacpp_side - llama.cpp as weld_llamacpp_pair drives it (llamacpp_side.c): open a
 * model and context the way llama-bench does, decode, clear the cache, pause and resume
 * its threadpool. Functions returning int give 0 on success.
 */
#ifndef WELD_BENCH_LLAMACPP_SIDE_H
#define WELD_BENCH_LLAMACPP_SIDE_H

#include <stddef.h>
#include <stdint.h>

struct lside;

void lside_init(void); /* once per process, before lside_open; quiets llama.cpp's log */
void lside_fini(void);
/* threads: the threadpool's size (poll 50, as llama-bench); n_ctx: positions. On failure
   a message in err and *out still to be closed. */
int lside_open(struct lside **out, const char *path, int threads, int n_ctx, char *err,
               size_t err_n);
int lside_n_vocab(const struct lside *l);
int32_t lside_bos(const struct lside *l); /* -1 when the vocabulary adds none */
int lside_decode(struct lside *l, int32_t *ids, int n); /* llama_decode, synchronized */
void lside_clear(struct lside *l);                      /* empty the KV cache */
void lside_pause(struct lside *l);                      /* threadpool sleeps */
void lside_resume(struct lside *l);
void lside_close(struct lside *l);

#endif

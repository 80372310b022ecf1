/*
 * weld_llamacpp_pair - weld and llama.cpp in one process on the same GGUF file, their
 * decode steps interleaved in blocks, for a host whose memory bandwidth moves by tens of
 * percent between seconds (other tenants): runs of separate processes minutes apart
 * compare minutes, not engines.
 *
 *   weld_llamacpp_pair -m MODEL [-t THREADS] [-p 512] [-n 128] [-d 0] [-r 5] [--block B]
 *                      [--json]
 *
 * Built only when CMake is given -DWELD_LLAMACPP_BIN=DIR (a llama.cpp build's bin
 * directory, with libllama.so; headers from DIR/../../include and DIR/../../ggml/include,
 * or -DWELD_LLAMACPP_INCLUDE="dir1;dir2"); bench/vs-llamacpp-paired does that. Nothing of
 * llama.cpp is in this repository: this file calls its public C API.
 *
 * llama.cpp runs as llama-bench runs it (tools/llama-bench at 81ff7abe): model with mmap
 * and default parameters but mlock (llama.cpp's --mlock: the hosts here run DAMON's
 * "pageout" scheme, which drops file pages idle for a moment, so a mixture of experts'
 * rarely chosen experts, read in place from the mapping, came back from disk: 4 tok/s
 * instead of 53 in blocks of 8 steps; weld's weights are anonymous memory, never paged
 * out without swap, so mlock puts both sides on the same footing), a context of P + N positions, n_batch 2048, n_ubatch 512, f16
 * K/V cache, flash attention "auto", a ggml threadpool of T threads with poll 50 attached;
 * pp = one llama_decode of P random ids (BOS first when the vocabulary adds one) on an
 * empty cache; tg = N one-token decodes from an empty cache, each synchronized. weld runs
 * as `weld bench` does: a runner with the default executor, T workers, f16
 * KV cache, pp = one P-token step at position 0, tg = N one-token steps from position 0.
 * With -d D (llama-bench's -d), both sides first take D random ids (untimed, in decodes
 * of up to 512) before every pp and every repetition's tg, which then start at
 * position D: decode speed at a long context, where attention reads more KV than a short
 * one.
 *
 * Method (as `weld bench --pair`): a warm-up of both, then per repetition each side's pp
 * (weld first on even repetitions), then both sides' tg in blocks of B steps (default:
 * about 200 ms of weld's decode, at least 4 steps: the first step after a side's threads
 * slept pays their wake-up, so one-step blocks would charge it to every token), weld,
 * llama, weld, ...; each llama block is compared
 * with the mean of the weld blocks either side of it (linear drift cancels). Between its
 * blocks a side's threads sleep: weld's team is parked (runner_park), llama's threadpool
 * paused (ggml_threadpool_pause), so the other side has the cores. Report: each side's
 * tok/s over the timed work, and the median weld / llama speed ratio over the block pairs
 * (tg) and the repetitions (pp) with its 10th and 90th percentiles. All of it twice, both
 * sides made anew: weld's runner made first, then llama.cpp's (as `weld bench --pair`: on
 * a Zen 4 host the side made first ran a few % slower); the median reported is
 * sqrt(m1 * m2) of the two orders' medians, which cancels that bias, printed beside it as
 * sqrt(m1 / m2); the percentiles are over both orders' pairs.
 *
 * JSON (--json): {"model", "threads", "depth", "block_steps", "weld": {"pp_tok_s", "tg_tok_s"},
 * "llama": {same}, "tg_ratio": {"median", "p10", "p90", "pairs", "weld_first",
 * "llama_first", "order_bias"}, "pp_ratio": {same}}.
 */
#include "core/alloc.h"
#include "core/err.h"
#include "core/json.h"
#include "core/rng.h"
#include "exec/runner.h"
#include "model/model.h"

#include "llamacpp_side.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct opts {
    const char *model;
    int threads, n_prompt, n_gen, depth, reps, block;
    bool json;
};

struct side_w { /* weld */
    struct model *m;
    struct runner *r;
    float *logits;
};

struct ratios {
    double *v;
    int n;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static struct rng g_rng;

/* Untimed pause after every block, so the side that ran lets go of the cores before the
   other starts: llama.cpp built with OpenMP (its default) keeps its threads spinning for
   some milliseconds after a graph (libgomp's spin count; ggml_threadpool_pause has no
   effect there), which took a core from weld's next block: weld 206 tok/s in one process
   against 286 alone, 110M Q8_0. */
#define GAP_MS 20

static void gap(void)
{
    struct timespec ts = {0, GAP_MS * 1000000L};
    nanosleep(&ts, NULL);
}

static int32_t rand_id(int n_vocab) { return (int32_t)(rng_u64(&g_rng) % (uint64_t)n_vocab); }

/* ---- weld ---------------------------------------------------------------------------- */

static int w_open(struct side_w *w, const struct opts *o, struct weld_err *e)
{
    int rc = model_load(&w->m, o->model, e);
    if (rc)
        return rc;
    struct backend_params p;
    backend_params_init(&p, 1, o->depth + (o->n_prompt > o->n_gen ? o->n_prompt : o->n_gen) + 1);
    p.n_threads = o->threads;
    if ((rc = runner_create_ex(&w->r, w->m, &p, e)))
        return rc;
    if (!(w->logits = wmalloc((size_t)w->m->cfg.n_vocab * sizeof(float))))
        return err_set(e, WELD_ERR_NOMEM, "out of memory");
    return WELD_OK;
}

static int w_step(struct side_w *w, const int32_t *ids, int n, int pos, struct weld_err *e)
{
    struct batch_seq s = {.seq_id = 0, .tokens = ids, .n_tokens = n, .pos = pos};
    struct batch b = {.seqs = &s, .n_seqs = 1};
    return runner_forward(w->r, &b, w->logits, e);
}

static void w_close(struct side_w *w)
{
    runner_free(w->r);
    model_free(w->m);
    wfree(w->logits);
}

/* ---- measurement --------------------------------------------------------------------- */

struct run {
    const struct opts *o;
    struct side_w w;
    struct lside *l;
    int32_t *ids;
    int n_vocab;
    int32_t bos;
    double w_pp_s, l_pp_s, w_tg_s, l_tg_s;
    long long pp_tok, tg_tok;
};

static void fill_ids(struct run *r, int n)
{
    for (int i = 0; i < n; i++)
        r->ids[i] = rand_id(r->n_vocab);
    if (r->bos >= 0)
        r->ids[0] = r->bos;
}

#define DEPTH_PIECE 512 /* tokens per decode of the untimed depth prefill */

/* An empty cache, then D random ids on each side (untimed), the pause after it included. */
static int depth_w(struct run *r, struct weld_err *e)
{
    const int d = r->o->depth;
    int rc = WELD_OK;
    runner_drop_seq(r->w.r, 0);
    fill_ids(r, d);
    for (int i = 0; rc == WELD_OK && i < d; i += DEPTH_PIECE)
        rc = w_step(&r->w, r->ids + i, d - i < DEPTH_PIECE ? d - i : DEPTH_PIECE, i, e);
    return rc;
}

static int depth_l(struct run *r, struct weld_err *e)
{
    const int d = r->o->depth;
    int rc = 0;
    lside_clear(r->l);
    fill_ids(r, d);
    for (int i = 0; rc == 0 && i < d; i += DEPTH_PIECE)
        rc = lside_decode(r->l, r->ids + i, d - i < DEPTH_PIECE ? d - i : DEPTH_PIECE);
    return rc ? err_set(e, WELD_ERR_INTERNAL, "llama_decode of the depth's %d tokens failed (%d)",
                        d, rc) : WELD_OK;
}

/* Seconds of one side's pp of P tokens on a cache holding D. */
static int pp_w(struct run *r, double *dt, struct weld_err *e)
{
    int rc = depth_w(r, e);
    if (rc)
        return rc;
    fill_ids(r, r->o->n_prompt);
    double t0 = now_s();
    rc = w_step(&r->w, r->ids, r->o->n_prompt, r->o->depth, e);
    *dt = now_s() - t0;
    runner_drop_seq(r->w.r, 0);
    runner_park(r->w.r);
    gap();
    return rc;
}

static int pp_l(struct run *r, double *dt, struct weld_err *e)
{
    lside_resume(r->l);
    int rc = depth_l(r, e);
    if (rc) {
        lside_pause(r->l);
        return rc;
    }
    fill_ids(r, r->o->n_prompt);
    double t0 = now_s();
    rc = lside_decode(r->l, r->ids, r->o->n_prompt);
    *dt = now_s() - t0;
    lside_pause(r->l);
    lside_clear(r->l);
    gap();
    return rc ? err_set(e, WELD_ERR_INTERNAL, "llama_decode of %d tokens failed (%d)",
                        r->o->n_prompt, rc) : WELD_OK;
}

/* n decode steps of weld from position pos (seconds in *dt). */
static int tg_w(struct run *r, int pos, int n, double *dt, struct weld_err *e)
{
    int rc = WELD_OK;
    double t0 = now_s();
    for (int i = 0; rc == WELD_OK && i < n; i++) {
        int32_t id = rand_id(r->n_vocab);
        rc = w_step(&r->w, &id, 1, pos + i, e);
    }
    *dt = now_s() - t0;
    runner_park(r->w.r);
    gap();
    return rc;
}

static int tg_l(struct run *r, int n, double *dt, struct weld_err *e)
{
    int rc = 0;
    lside_resume(r->l);
    double t0 = now_s();
    for (int i = 0; rc == 0 && i < n; i++) {
        int32_t id = rand_id(r->n_vocab);
        rc = lside_decode(r->l, &id, 1);
    }
    *dt = now_s() - t0;
    lside_pause(r->l);
    gap();
    return rc ? err_set(e, WELD_ERR_INTERNAL, "llama_decode of one token failed (%d)", rc)
              : WELD_OK;
}

static void push(struct ratios *x, double v)
{
    double *nv = realloc(x->v, (size_t)(x->n + 1) * sizeof *nv);
    if (!nv)
        return;
    x->v = nv;
    x->v[x->n++] = v;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double pct(const struct ratios *x, double p)
{
    if (x->n == 0)
        return 0;
    int i = (int)(p * (x->n - 1) + 0.5);
    return x->v[i];
}

/* One repetition: both pp's, then tg in alternating blocks. */
static int rep(struct run *r, int k, struct ratios *pp, struct ratios *tg, struct weld_err *e)
{
    const struct opts *o = r->o;
    double dw, dl;
    int rc = k % 2 ? pp_l(r, &dl, e) : pp_w(r, &dw, e);
    if (rc == WELD_OK)
        rc = k % 2 ? pp_w(r, &dw, e) : pp_l(r, &dl, e);
    if (rc)
        return rc;
    r->w_pp_s += dw;
    r->l_pp_s += dl;
    r->pp_tok += o->n_prompt;
    push(pp, dl / dw);
    if ((rc = depth_w(r, e)))
        return rc;
    runner_park(r->w.r);
    lside_resume(r->l);
    rc = depth_l(r, e);
    lside_pause(r->l);
    if (rc)
        return rc;
    gap();
    double prev_w = -1, cur_l = -1; /* seconds per step of the last blocks */
    for (int done = 0; rc == WELD_OK && done < o->n_gen; done += o->block) {
        int n = o->n_gen - done < o->block ? o->n_gen - done : o->block;
        if ((rc = tg_w(r, o->depth + done, n, &dw, e)))
            break;
        r->w_tg_s += dw;
        if (cur_l > 0 && prev_w > 0) /* the llama block between two weld blocks */
            push(tg, cur_l / ((prev_w + dw / n) / 2));
        prev_w = dw / n;
        if ((rc = tg_l(r, n, &dl, e)))
            break;
        r->l_tg_s += dl;
        r->tg_tok += n;
        cur_l = dl / n;
    }
    runner_drop_seq(r->w.r, 0);
    lside_clear(r->l);
    return rc;
}

/* Both sides, in creation order ord (0: weld first; llama.cpp first otherwise). */
static int open_sides(struct run *r, int ord, struct weld_err *e)
{
    char msg[256];
    const struct opts *o = r->o;
    const int most = o->n_prompt > o->n_gen ? o->n_prompt : o->n_gen;
    int rc = WELD_OK;
    for (int i = 0; rc == WELD_OK && i < 2; i++) {
        if ((i ^ ord) == 0)
            rc = w_open(&r->w, o, e);
        else if (lside_open(&r->l, o->model, o->threads, o->depth + most, msg, sizeof msg))
            rc = err_set(e, WELD_ERR_INTERNAL, "%s", msg);
    }
    if (rc == WELD_OK) {
        int lv = lside_n_vocab(r->l);
        r->n_vocab = r->w.m->cfg.n_vocab < lv ? r->w.m->cfg.n_vocab : lv;
        r->bos = lside_bos(r->l);
    }
    return rc;
}

static void close_sides(struct run *r)
{
    lside_close(r->l);
    r->l = NULL;
    w_close(&r->w);
    memset(&r->w, 0, sizeof r->w);
}

/* Sorted copy of both orders' ratios, for the pooled percentiles. */
static struct ratios pooled(struct ratios x[2])
{
    struct ratios all = {0};
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < x[k].n; i++)
            push(&all, x[k].v[i]);
    qsort(all.v, (size_t)all.n, sizeof *all.v, cmp_double);
    return all;
}

/* The ratio with the creation-order bias cancelled: sqrt(m0 * m1) of the orders' medians
   m0 (weld made first) and m1; *bias = sqrt(m0 / m1). */
static double combined(struct ratios x[2], double *m0, double *m1, double *bias)
{
    for (int k = 0; k < 2; k++)
        qsort(x[k].v, (size_t)x[k].n, sizeof *x[k].v, cmp_double);
    *m0 = pct(&x[0], 0.5), *m1 = pct(&x[1], 0.5);
    *bias = *m0 > 0 && *m1 > 0 ? sqrt(*m0 / *m1) : 1.0;
    return *m0 > 0 && *m1 > 0 ? sqrt(*m0 * *m1) : *m0 > 0 ? *m0 : *m1;
}

static int measure(const struct opts *oi, struct weld_err *e)
{
    struct opts o = *oi;
    struct run r = {.o = &o};
    struct ratios pp[2] = {{0}}, tg[2] = {{0}};
    rng_seed(&g_rng, 1);
    int rc = WELD_OK;
    if (!(r.ids = wmalloc((size_t)(o.n_prompt > o.depth ? o.n_prompt : o.depth) *
                          sizeof *r.ids)))
        rc = err_set(e, WELD_ERR_NOMEM, "out of memory");
    for (int ord = 0; rc == WELD_OK && ord < 2; ord++) {
        rc = open_sides(&r, ord, e);
        double dw = 0, dl = 0;
        if (rc == WELD_OK) /* warm-up: both pp's and a few decode steps each */
            rc = pp_w(&r, &dw, e);
        if (rc == WELD_OK)
            rc = pp_l(&r, &dl, e);
        if (rc == WELD_OK)
            rc = tg_w(&r, 0, 8, &dw, e);
        if (rc == WELD_OK)
            rc = tg_l(&r, 8, &dl, e);
        if (r.w.r)
            runner_drop_seq(r.w.r, 0);
        if (rc == WELD_OK)
            lside_clear(r.l);
        if (rc == WELD_OK && o.block <= 0) { /* ~200 ms of weld's decode, 4 to n/4 steps */
            int b = dw > 0 ? (int)(0.2 / (dw / 8)) : 8;
            b = b < 4 ? 4 : b;
            o.block = b > o.n_gen / 4 ? (o.n_gen / 4 > 0 ? o.n_gen / 4 : 1) : b;
        }
        for (int k = 0; rc == WELD_OK && k < o.reps; k++)
            rc = rep(&r, k, &pp[ord], &tg[ord], e);
        close_sides(&r);
    }
    if (rc == WELD_OK) {
        double tm0, tm1, tbias, pm0, pm1, pbias;
        double tmed = combined(tg, &tm0, &tm1, &tbias), pmed = combined(pp, &pm0, &pm1, &pbias);
        struct ratios tga = pooled(tg), ppa = pooled(pp);
        double wpp = r.pp_tok / r.w_pp_s, lpp = r.pp_tok / r.l_pp_s;
        double wtg = r.tg_tok / r.w_tg_s, ltg = r.tg_tok / r.l_tg_s;
        if (o.json) {
            json_t *j = json_pack(
                "{s:s, s:i, s:i, s:i, s:{s:f, s:f}, s:{s:f, s:f}, "
                "s:{s:f, s:f, s:f, s:i, s:f, s:f, s:f}, s:{s:f, s:f, s:f, s:i, s:f, s:f, s:f}}",
                "model", o.model, "threads", o.threads, "depth", o.depth, "block_steps",
                o.block, "weld", "pp_tok_s", wpp, "tg_tok_s", wtg, "llama", "pp_tok_s", lpp,
                "tg_tok_s", ltg, "tg_ratio", "median", tmed, "p10", pct(&tga, 0.1), "p90",
                pct(&tga, 0.9), "pairs", tga.n, "weld_first", tm0, "llama_first", tm1,
                "order_bias", tbias, "pp_ratio", "median", pmed, "p10", pct(&ppa, 0.1), "p90",
                pct(&ppa, 0.9), "pairs", ppa.n, "weld_first", pm0, "llama_first", pm1,
                "order_bias", pbias);
            char *txt = j ? json_dumps(j, JSON_COMPACT) : NULL;
            if (txt)
                printf("%s\n", txt);
            else
                rc = err_set(e, WELD_ERR_NOMEM, "out of memory for the JSON");
            free(txt);
            json_decref(j);
        }
        else {
            printf("model %s, %d threads: %d repetitions of pp%d, then tg%d in blocks of %d "
                   "steps, at depth %d, weld and llama.cpp interleaved in one process, in "
                   "each creation order\n", o.model, o.threads, o.reps, o.n_prompt, o.n_gen,
                   o.block, o.depth);
            printf("  weld    pp %10.2f tok/s   tg %10.2f tok/s\n", wpp, wtg);
            printf("  llama   pp %10.2f tok/s   tg %10.2f tok/s\n", lpp, ltg);
            printf("  tg weld / llama: %.3fx median over %d block pairs (p10 %.3fx, p90 %.3fx)"
                   "; weld made first %.3fx, llama.cpp first %.3fx, order bias %.3fx\n", tmed,
                   tga.n, pct(&tga, 0.1), pct(&tga, 0.9), tm0, tm1, tbias);
            printf("  pp weld / llama: %.3fx median over %d repetitions (p10 %.3fx, p90 %.3fx)"
                   "; weld made first %.3fx, llama.cpp first %.3fx, order bias %.3fx\n", pmed,
                   ppa.n, pct(&ppa, 0.1), pct(&ppa, 0.9), pm0, pm1, pbias);
        }
        free(tga.v);
        free(ppa.v);
    }
    for (int k = 0; k < 2; k++) {
        free(pp[k].v);
        free(tg[k].v);
    }
    wfree(r.ids);
    close_sides(&r);
    return rc;
}

static int usage(const char *argv0)
{
    fprintf(stderr, "usage: %s -m MODEL [-t THREADS] [-p 512] [-n 128] [-d 0] [-r 5] "
            "[--block B] [--json]\n", argv0);
    return 2;
}

int main(int argc, char **argv)
{
    struct opts o = {.threads = 2, .n_prompt = 512, .n_gen = 128, .reps = 5};
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(argv[i], "-m") && v) o.model = v, i++;
        else if (!strcmp(argv[i], "-t") && v) o.threads = atoi(v), i++;
        else if (!strcmp(argv[i], "-p") && v) o.n_prompt = atoi(v), i++;
        else if (!strcmp(argv[i], "-n") && v) o.n_gen = atoi(v), i++;
        else if (!strcmp(argv[i], "-d") && v) o.depth = atoi(v), i++;
        else if (!strcmp(argv[i], "-r") && v) o.reps = atoi(v), i++;
        else if (!strcmp(argv[i], "--block") && v) o.block = atoi(v), i++;
        else if (!strcmp(argv[i], "--json")) o.json = true;
        else
            return usage(argv[0]);
    }
    if (!o.model || o.threads < 1 || o.threads > 256 || o.n_prompt < 1 || o.n_prompt > 2048 ||
        o.n_gen < 2 || o.depth < 0 || o.depth > 1 << 20 || o.reps < 1 || o.block < 0)
        return usage(argv[0]);
    lside_init();
    struct weld_err e = {0};
    int rc = measure(&o, &e);
    lside_fini();
    if (rc) {
        fprintf(stderr, "weld_llamacpp_pair: %s\n", e.msg);
        return 1;
    }
    return 0;
}

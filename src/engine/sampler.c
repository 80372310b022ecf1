/*
 * sampler - see sampler.h for the semantics and the order of operations.
 *
 * Data layout.
 *   history: an open-addressing hash table keyed by token id (linear probing, capacity a
 *     power of two, at most half full) holding, per distinct token seen, its generated
 *     count and whether the prompt contains it. Memory and sampler_reset are proportional
 *     to the history, not to the vocabulary, so a sampler per running sequence is cheap.
 *   cand: scratch of n_vocab (value, token) pairs, allocated on the first sample (8 bytes
 *     per vocabulary entry: 1.2 MB at 150K). It starts as the logits copy indexed by token,
 *     the penalties adjust it in place through the history table, and the filters then
 *     shrink a prefix cand[0, nc) of survivors whose values become unnormalized weights
 *     exp(l - max).
 *   cmax / csum / cw: per LOGITS_CHUNK chunk, the temperature path's statistics of the
 *     edited row and chunk weights; mod: the sorted ids edits or penalties change (the
 *     chunks that cannot take the LM head's statistics as they are).
 *
 * Cost per sample at vocabulary V, temperature path: O(V / 256 + edits + history) on the
 * LM head's statistics (chunks holding changed ids recomputed, one chunk's weights for
 * the draw), O(V) vectorized without them. Other paths: O(V) for the copy, temperature and exp; top-k is a
 * quickselect (O(V) expected) plus a sort of the k survivors only when top-p needs order;
 * top-p without top-k selects and sorts a growing head (256, 1024, ... tokens) until its
 * mass reaches p, so a peaked distribution never sorts the whole vocabulary; min-p is a
 * linear filter. No full sort happens unless top-p needs most of the vocabulary.
 *
 * A constraint's token mask (sampler_edits.allow) is one more edit: banned tokens count as
 * changed (so the first pass takes only allowed candidates from top), greedy and top-k
 * without a usable top gather just the allowed tokens (in id order, as the full pass would
 * meet them), and the temperature path copies only chunks holding a banned token, skipping
 * chunks with none allowed.
 *
 * Deliberately not done: bad-word lists and vLLM's keeping of extra tokens tied with the k-th
 * largest under top-k (exactly k survive here).
 */
#include "engine/sampler.h"

#include "core/alloc.h"
#include "core/rng.h"
#include "kernels/cpu/gemm.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define SAMPLER_EPS 1e-5f /* vLLM's _SAMPLING_EPS: temperatures below it are greedy */

struct hist_slot {
    int32_t token;     /* -1: empty */
    int32_t gen_count; /* times generated */
    int32_t in_prompt; /* 1 if the prompt contains it */
};

struct cand {
    float v;
    int32_t i;
};

struct sampler {
    struct sampler_params p;
    int n_vocab;
    struct rng rng;
    struct hist_slot *hist; /* (hist_cap) */
    int hist_cap, hist_used;
    struct cand *cand;      /* (n_vocab), lazily allocated */
    struct cand *tmp;       /* (n_vocab) radix-sort scratch of top-p, lazily allocated */
    long long top_hits;     /* draws made from a logits_top alone */
    /* the temperature path (plain_*): per LOGITS_CHUNK chunk, lazily allocated */
    float *cmax, *csum;     /* (n_chunks) softmax statistics of the edited row */
    double *cw;             /* (n_chunks) chunk weights csum * attn_exp((cmax - m_all) / T) */
    float m_all;            /* the edited row's max */
    int32_t *mod;           /* (cap_mod) ids edits or penalties change, sorted */
    int cap_mod;
    long long stats_hits;   /* temperature draws on the step's statistics */
};

/* ------------------------------------------------------------------------------------- */
/* parameters and lifetime */

struct sampler_params sampler_params_default(void)
{
    struct sampler_params p = {
        .temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f,
        .repetition_penalty = 1.0f, .frequency_penalty = 0.0f, .presence_penalty = 0.0f,
        .seed = 0,
    };
    return p;
}

int sampler_params_check(const struct sampler_params *p, struct weld_err *e)
{
    if (!(p->temperature >= 0.0f) || isinf(p->temperature))
        return err_set(e, WELD_ERR_INVALID_ARG, "sampler: temperature %g must be finite and "
                       ">= 0", (double)p->temperature);
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
        return err_set(e, WELD_ERR_INVALID_ARG, "sampler: top_p %g must be in (0, 1]",
                       (double)p->top_p);
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f))
        return err_set(e, WELD_ERR_INVALID_ARG, "sampler: min_p %g must be in [0, 1]",
                       (double)p->min_p);
    if (!(p->repetition_penalty > 0.0f) || isinf(p->repetition_penalty))
        return err_set(e, WELD_ERR_INVALID_ARG, "sampler: repetition_penalty %g must be "
                       "finite and > 0", (double)p->repetition_penalty);
    if (!isfinite(p->frequency_penalty))
        return err_set(e, WELD_ERR_INVALID_ARG, "sampler: frequency_penalty must be finite");
    if (!isfinite(p->presence_penalty))
        return err_set(e, WELD_ERR_INVALID_ARG, "sampler: presence_penalty must be finite");
    return WELD_OK;
}

static int hist_alloc(struct sampler *s, int cap)
{
    struct hist_slot *h = wmalloc((size_t)cap * sizeof *h);
    if (!h)
        return WELD_ERR_NOMEM;
    for (int i = 0; i < cap; i++)
        h[i] = (struct hist_slot){-1, 0, 0};
    wfree(s->hist);
    s->hist = h;
    s->hist_cap = cap;
    s->hist_used = 0;
    return WELD_OK;
}

int sampler_create(struct sampler **out, const struct sampler_params *p, int n_vocab,
                   struct weld_err *e)
{
    *out = NULL;
    if (n_vocab <= 0)
        return err_set(e, WELD_ERR_INVALID_ARG, "sampler: n_vocab %d must be > 0", n_vocab);
    int rc = sampler_params_check(p, e);
    if (rc != WELD_OK)
        return rc;
    struct sampler *s = wcalloc(1, sizeof *s);
    if (!s || hist_alloc(s, 64) != WELD_OK) {
        sampler_free(s);
        return err_set(e, WELD_ERR_NOMEM, "sampler: out of memory");
    }
    s->p = *p;
    s->n_vocab = n_vocab;
    rng_seed(&s->rng, p->seed);
    *out = s;
    return WELD_OK;
}

void sampler_free(struct sampler *s)
{
    if (!s)
        return;
    wfree(s->hist);
    wfree(s->cand);
    wfree(s->tmp);
    wfree(s->cmax);
    wfree(s->csum);
    wfree(s->cw);
    wfree(s->mod);
    wfree(s);
}

void sampler_reset(struct sampler *s)
{
    for (int i = 0; i < s->hist_cap; i++)
        s->hist[i] = (struct hist_slot){-1, 0, 0};
    s->hist_used = 0;
    rng_seed(&s->rng, s->p.seed);
}

/* ------------------------------------------------------------------------------------- */
/* history */

static struct hist_slot *hist_slot_for(struct hist_slot *h, int cap, int32_t token)
{
    uint32_t i = ((uint32_t)token * 0x9E3779B1u) & (uint32_t)(cap - 1);
    while (h[i].token != -1 && h[i].token != token)
        i = (i + 1) & (uint32_t)(cap - 1);
    return &h[i];
}

static int hist_grow(struct sampler *s)
{
    struct hist_slot *old = s->hist;
    int old_cap = s->hist_cap;
    s->hist = NULL;
    if (hist_alloc(s, old_cap * 2) != WELD_OK) {
        s->hist = old;
        s->hist_cap = old_cap;
        return WELD_ERR_NOMEM;
    }
    for (int i = 0; i < old_cap; i++)
        if (old[i].token != -1) {
            *hist_slot_for(s->hist, s->hist_cap, old[i].token) = old[i];
            s->hist_used++;
        }
    wfree(old);
    return WELD_OK;
}

int sampler_accept(struct sampler *s, int token, bool is_prompt)
{
    if (token < 0 || token >= s->n_vocab)
        return WELD_ERR_INVALID_ARG;
    struct hist_slot *h = hist_slot_for(s->hist, s->hist_cap, token);
    if (h->token == -1) {
        if (2 * (s->hist_used + 1) > s->hist_cap) {
            if (s->hist_cap > (1 << 29) || hist_grow(s) != WELD_OK)
                return WELD_ERR_NOMEM;
            h = hist_slot_for(s->hist, s->hist_cap, token);
        }
        h->token = token;
        s->hist_used++;
    }
    if (is_prompt)
        h->in_prompt = 1;
    else if (h->gen_count < INT32_MAX)
        h->gen_count++;
    return WELD_OK;
}

/* ------------------------------------------------------------------------------------- */
/* selection helpers */

/* a ranks before b: larger value, then lower index. */
static inline int cand_better(const struct cand *a, const struct cand *b)
{
    return a->v > b->v || (a->v == b->v && a->i < b->i);
}

static inline void cand_swap(struct cand *a, size_t x, size_t y)
{
    struct cand t = a[x];
    a[x] = a[y];
    a[y] = t;
}

/* Lomuto partition of [lo, hi) around a median-of-three pivot; returns its final index. */
static size_t cand_partition(struct cand *a, size_t lo, size_t hi)
{
    size_t mid = lo + (hi - lo) / 2, last = hi - 1;
    if (cand_better(&a[mid], &a[lo]))
        cand_swap(a, lo, mid);
    if (cand_better(&a[last], &a[lo]))
        cand_swap(a, lo, last);
    if (cand_better(&a[last], &a[mid]))
        cand_swap(a, mid, last);
    cand_swap(a, mid, last);
    const struct cand piv = a[last];
    size_t st = lo;
    for (size_t i = lo; i < last; i++)
        if (cand_better(&a[i], &piv))
            cand_swap(a, i, st++);
    cand_swap(a, st, last);
    return st;
}

/* Rearrange a[0, n) so that a[0, k) holds the k best (in no particular order). */
static void cand_select(struct cand *a, size_t n, size_t k)
{
    size_t lo = 0, hi = n;
    if (k == 0 || k >= n)
        return;
    while (hi - lo > 1) {
        size_t p = cand_partition(a, lo, hi);
        if (p == k)
            return;
        if (p < k)
            lo = p + 1;
        else
            hi = p;
    }
}

static int cand_cmp(const void *x, const void *y)
{
    const struct cand *a = x, *b = y;
    return cand_better(a, b) ? -1 : cand_better(b, a) ? 1 : 0;
}

/* Sort the k best of a[0, n) to the front, best first. */
static void cand_top_sorted(struct cand *a, size_t n, size_t k)
{
    if (k > n)
        k = n;
    cand_select(a, n, k);
    qsort(a, k, sizeof *a, cand_cmp);
}

/* ------------------------------------------------------------------------------------- */
/* the pipeline */

/* c[0, n) holds every token once (any order): sort it by weight desc, id asc (cand_cmp's
   order) through tmp (n): scatter back to token order, then a stable least-significant-
   digit radix sort on the complemented bits of the weights (weights are >= 0, and
   non-negative floats order as their bit patterns), 4 passes of 8 bits. A 128k vocabulary
   sorts in ~1 ms, where qsort took ~12. */
static void cand_sort_tokens(struct cand *c, struct cand *tmp, size_t n)
{
    for (size_t i = 0; i < n; i++)
        tmp[c[i].i] = c[i];
    struct cand *src = tmp, *dst = c;
    for (int pass = 0; pass < 4; pass++) {
        size_t off[256] = {0};
        const int sh = 8 * pass;
        for (size_t i = 0; i < n; i++) {
            uint32_t b;
            memcpy(&b, &src[i].v, sizeof b);
            off[(~b >> sh) & 255]++;
        }
        for (size_t d = 0, at = 0; d < 256; d++) {
            size_t k = off[d];
            off[d] = at;
            at += k;
        }
        for (size_t i = 0; i < n; i++) {
            uint32_t b;
            memcpy(&b, &src[i].v, sizeof b);
            dst[off[(~b >> sh) & 255]++] = src[i];
        }
        struct cand *t = src;
        src = dst;
        dst = t;
    }
    if (src != c)
        memcpy(c, src, n * sizeof *c);
}

/* Exact cutoff of a sorted prefix: the first j whose running sum reaches target. */
static bool top_p_cut(const struct cand *c, size_t m, double target, size_t *nc, double *z,
                      double *cum_out)
{
    double cum = 0.0;
    for (size_t j = 0; j < m; j++) {
        cum += c[j].v;
        if (cum >= target) {
            *nc = j + 1;
            *z = cum;
            return true;
        }
    }
    *cum_out = cum;
    return false;
}

/* Every token at once (c in token order): a histogram of the weights by their top 12 bits
   (non-negative floats order as their bit patterns: 1/8 of an octave a bucket) gives, with
   a margin far above any rounding of its sums, the bucket down to which the mass reaches
   the target; only the tokens from there up are gathered (token order kept) and sorted.
   The prefix and its running sum are then those of the whole sorted vocabulary. When the
   gathered set is large (a flat distribution) everything is radix-sorted instead.
   Returns false (c untouched) when even that cannot decide: the caller sorts it all. */
static bool top_p_gathered(struct sampler *s, size_t n, double target, size_t *nc, double *z)
{
    enum { BUCKETS = 2048, SMALL = 4096 };
    static const double margin = 1e-4; /* z is the chunk statistics' total, within ~1e-5 */
    struct cand *c = s->cand, *t = s->tmp;
    double mass[BUCKETS] = {0};
    for (size_t i = 0; i < n; i++) {
        uint32_t b;
        memcpy(&b, &c[i].v, sizeof b);
        mass[(b >> 20) & (BUCKETS - 1)] += c[i].v;
    }
    double acc = 0.0;
    int cut = -1;
    for (int k = BUCKETS - 1; k >= 0 && cut < 0; k--)
        if ((acc += mass[k]) >= target * (1.0 + margin))
            cut = k;
    if (cut < 0)
        return false;
    size_t g = 0;
    for (size_t i = 0; i < n && g <= SMALL; i++) {
        uint32_t b;
        memcpy(&b, &c[i].v, sizeof b);
        if ((int)((b >> 20) & (BUCKETS - 1)) >= cut)
            t[g++] = c[i];
    }
    if (g > SMALL)
        return false;
    qsort(t, g, sizeof *t, cand_cmp);
    double cum;
    if (!top_p_cut(t, g, target, nc, z, &cum))
        return false;
    memcpy(c, t, *nc * sizeof *c);
    return true;
}

/* Keep the smallest most-probable prefix of s->cand[0, *nc) (weights, *z their sum) whose
   mass reaches top_p * z, in cand_cmp order. Every token (no top-k): top_p_gathered, else
   a radix sort of them all (flat distributions; growing selections had cost ~20 ms a
   token at 128k). Fewer: the best 256 first, more only if their mass falls short. */
static int apply_top_p(struct sampler *s, size_t *nc, double *z, struct weld_err *e)
{
    struct cand *c = s->cand;
    const double target = (double)s->p.top_p * *z;
    double cum = 0.0;
    if (*nc == (size_t)s->n_vocab && *nc > 256) {
        if (!s->tmp && !(s->tmp = wmalloc((size_t)s->n_vocab * sizeof *s->tmp)))
            return err_set(e, WELD_ERR_NOMEM, "sampler: out of memory for %d candidates",
                           s->n_vocab);
        if (top_p_gathered(s, *nc, target, nc, z))
            return WELD_OK;
        cand_sort_tokens(c, s->tmp, *nc);
        if (!top_p_cut(c, *nc, target, nc, z, &cum))
            *z = cum; /* rounding left the total a hair short: keep everything */
        return WELD_OK;
    }
    for (size_t m = 256;; m *= 4) {
        if (m > *nc)
            m = *nc;
        cand_top_sorted(c, *nc, m);
        if (top_p_cut(c, m, target, nc, z, &cum))
            return WELD_OK;
        if (m == *nc) { /* rounding left the total a hair short: keep everything */
            *z = cum;
            return WELD_OK;
        }
    }
}

static bool penalties_on(const struct sampler_params *p)
{
    return p->repetition_penalty != 1.0f || p->frequency_penalty != 0.0f ||
           p->presence_penalty != 0.0f;
}

/* Logit l of a token with history h, penalized (step 1 and 2 of sampler.h). */
static float penalize(const struct sampler_params *p, const struct hist_slot *h, float l)
{
    if (p->repetition_penalty != 1.0f)
        l = l > 0.0f ? l / p->repetition_penalty : l * p->repetition_penalty;
    if (h->gen_count > 0)
        l -= (float)h->gen_count * p->frequency_penalty + p->presence_penalty;
    return l;
}

static inline bool banned(const struct sampler_edits *ed, int32_t id)
{
    return ed && ed->allow && !(ed->allow[(uint32_t)id >> 5] >> ((uint32_t)id & 31) & 1u);
}

static bool has_edits(const struct sampler_edits *ed)
{
    return ed && (ed->n || ed->allow);
}

/* Copy logits into cand (indexed by token), apply the edits, then the penalties. */
static int load_and_penalize(struct sampler *s, const float *logits,
                             const struct sampler_edits *ed, struct weld_err *e)
{
    struct cand *c = s->cand;
    bool nan = false;
    for (int i = 0; i < s->n_vocab; i++) {
        nan |= isnan(logits[i]);
        c[i].v = logits[i];
        c[i].i = i;
    }
    for (int k = 0; ed && k < ed->n; k++)
        c[ed->ids[k]].v = ed->vals[k];
    for (int w = 0; ed && ed->allow && w < (s->n_vocab + 31) / 32; w++)
        for (uint32_t b = ~ed->allow[w]; b; b &= b - 1) {
            const int i = w * 32 + __builtin_ctz(b);
            if (i < s->n_vocab)
                c[i].v = -INFINITY;
        }
    for (int i = 0; nan && i < s->n_vocab; i++) /* an edit may have replaced it */
        if (isnan(c[i].v))
            return err_set(e, WELD_ERR_INVALID_ARG, "sampler: logits[%d] is NaN", i);
    const struct sampler_params *p = &s->p;
    if (!penalties_on(p))
        return WELD_OK;
    for (int k = 0; k < s->hist_cap; k++) {
        const struct hist_slot *h = &s->hist[k];
        if (h->token != -1)
            c[h->token].v = penalize(p, h, c[h->token].v);
    }
    return WELD_OK;
}

static int edit_find(const struct sampler_edits *ed, int32_t id)
{
    for (int k = 0; ed && k < ed->n; k++)
        if (ed->ids[k] == id)
            return k;
    return -1;
}

/* Token id's logit after edits and penalties (step 2 of load_and_penalize, for one). */
static float final_logit(const struct sampler *s, const float *logits,
                         const struct sampler_edits *ed, int32_t id)
{
    if (banned(ed, id))
        return -INFINITY;
    int k = edit_find(ed, id);
    float v = k >= 0 ? ed->vals[k] : logits[id];
    if (penalties_on(&s->p)) {
        const struct hist_slot *h = hist_slot_for(s->hist, s->hist_cap, id);
        if (h->token == id)
            v = penalize(&s->p, h, v);
    }
    return v;
}

static bool modified(const struct sampler *s, const struct sampler_edits *ed, int32_t id)
{
    if (banned(ed, id) || edit_find(ed, id) >= 0)
        return true;
    return penalties_on(&s->p) && hist_slot_for(s->hist, s->hist_cap, id)->token == id;
}

/* The first pass from the LM head instead of one over the row (exec/logits_top.h): put the
   `need` best tokens after edits and penalties into cand[0, need), best first, and return
   true, when top makes that exact. Tokens the edits or penalties change (the modified
   set) are scored from logits; every other token keeps its raw logit and rank, so if top
   holds at least `need` unmodified tokens, no token outside top and the modified set can
   be among the best `need`. Returns false (nothing to trust) when a NaN was seen, when top
   is short, when the modified set is large enough that a pass over the row is as cheap,
   or when sampling would stop at an infinite logit (the full path reports it). */
static bool load_from_top(struct sampler *s, const float *logits, const struct logits_top *top,
                          const struct sampler_edits *ed, size_t need)
{
    const struct sampler_params *p = &s->p;
    const bool pen = penalties_on(p);
    if (!top || top->n_nan || need > LOGITS_TOP_K || (ed && ed->n > LOGITS_TOP_K) ||
        (pen && (size_t)s->hist_cap > (size_t)s->n_vocab / 8))
        return false;
    struct cand *c = s->cand;
    size_t n = 0;
    for (int j = 0; j < top->n; j++)
        if (!modified(s, ed, top->ids[j]))
            c[n++] = (struct cand){top->vals[j], top->ids[j]};
    if (n < need && top->n < s->n_vocab)
        return false;
    /* every id below is distinct (edits name each token once), so n <= n_vocab */
    for (int k = 0; ed && k < ed->n; k++)
        c[n++] = (struct cand){final_logit(s, logits, ed, ed->ids[k]), ed->ids[k]};
    for (int k = 0; pen && k < s->hist_cap; k++) {
        int32_t id = s->hist[k].token;
        if (id != -1 && edit_find(ed, id) < 0) {
            WELD_ASSERT(n < (size_t)s->n_vocab);
            c[n++] = (struct cand){final_logit(s, logits, ed, id), id};
        }
    }
    cand_top_sorted(c, n, need);
    return p->temperature < SAMPLER_EPS || !isinf(c[0].v);
}

/* ---- chunk statistics (exec/logits_top.h): the weights' normalizer of the temperature
   and top-p paths, the LM head's or computed here with the same kernel ---------------- */

static bool stats_alloc(struct sampler *s)
{
    const int nch = logits_n_chunks(s->n_vocab);
    if (!s->cmax)
        s->cmax = wmalloc((size_t)nch * sizeof *s->cmax);
    if (!s->csum)
        s->csum = wmalloc((size_t)nch * sizeof *s->csum);
    if (!s->cw)
        s->cw = wmalloc((size_t)nch * sizeof *s->cw);
    return s->cmax && s->csum && s->cw;
}

/* From s->cmax / csum (every chunk): the row's max into s->m_all, each chunk's weight
   csum * attn_exp((cmax - m_all) / T) into s->cw, and their sum (in double, chunk order):
   the total weight z. */
static double chunks_total(struct sampler *s, float inv_t)
{
    const int nch = logits_n_chunks(s->n_vocab);
    float m_all = -INFINITY;
    for (int c = 0; c < nch; c++)
        if (s->cmax[c] > m_all)
            m_all = s->cmax[c];
    s->m_all = m_all;
    double sum = 0.0;
    for (int c = 0; c < nch; c++) {
        s->cw[c] = (double)s->csum[c] * (double)attn_exp((s->cmax[c] - m_all) * inv_t);
        sum += s->cw[c];
    }
    return sum;
}

/* Statistics of the raw row at inv_t: top's when it has them at inv_t, else computed. */
static void stats_of_row(struct sampler *s, const float *logits, const struct logits_top *top,
                         float inv_t)
{
    const int nch = logits_n_chunks(s->n_vocab);
    if (top && top->inv_t == inv_t && top->chunk_max && top->n_nan == 0) {
        memcpy(s->cmax, top->chunk_max, (size_t)nch * sizeof *s->cmax);
        memcpy(s->csum, top->chunk_sum, (size_t)nch * sizeof *s->csum);
        s->stats_hits++;
        return;
    }
    logits_stats_chunks(&(struct logits_top){.inv_t = inv_t, .chunk_max = s->cmax,
                                             .chunk_sum = s->csum},
                        logits, s->n_vocab, 0, nch, gemm_ops_get());
}

/* Statistics at inv_t of the values in c[0, n_vocab) (in token order: c[i].i == i). */
static void stats_of_cand(struct sampler *s, const struct cand *c, float inv_t)
{
    const int nch = logits_n_chunks(s->n_vocab);
    const struct gemm_ops *go = gemm_ops_get();
    float buf[LOGITS_CHUNK];
    for (int k = 0; k < nch; k++) {
        const int a = k * LOGITS_CHUNK;
        const int n = logits_chunk_len(s->n_vocab, k);
        for (int j = 0; j < n; j++)
            buf[j] = c[a + j].v;
        go->softmax_stats(buf, n, inv_t, &s->cmax[k], &s->csum[k]);
    }
}

/* Top-p without top-k from the first pass: the total weight z comes from the row's chunk
   statistics (the LM head's when it made them at this temperature: then no pass over the
   row at all; the full path takes z the same way), and the top-p prefix usually lies
   within the LOGITS_TOP_K best tokens. Their weights, ranked as the
   full path ranks (weight, then id), give the same prefix and the same running sum up to
   the first position whose sum reaches top_p * z, provided that position's weight is
   above the smallest of the candidates (every token outside them weighs at most that).
   Then c[0, *nc) and *z are exactly what apply_top_p leaves. No edits or penalties (the
   full path then). Returns false when it cannot be sure. */
static bool top_p_from_top(struct sampler *s, const float *logits, const struct logits_top *top,
                           const struct sampler_edits *ed, size_t *nc, double *z)
{
    if (!top || top->n_nan || top->n < 1 || has_edits(ed) || penalties_on(&s->p) ||
        isinf(top->vals[0]))
        return false;
    const float maxv = top->vals[0], inv_t = 1.0f / s->p.temperature;
    if (!stats_alloc(s))
        return false;
    stats_of_row(s, logits, top, inv_t);
    const double sum = chunks_total(s, inv_t);
    struct cand *c = s->cand;
    for (int j = 0; j < top->n; j++)
        c[j] = (struct cand){expf((top->vals[j] - maxv) * inv_t), top->ids[j]};
    qsort(c, (size_t)top->n, sizeof *c, cand_cmp);
    const float w_min = c[top->n - 1].v;
    const bool whole = top->n == s->n_vocab;
    const double target = (double)s->p.top_p * sum;
    double cum = 0.0;
    for (int j = 0; j < top->n; j++) {
        cum += c[j].v;
        if (cum >= target) {
            if (!whole && !(c[j].v > w_min))
                return false;
            *nc = (size_t)j + 1;
            *z = cum;
            return true;
        }
    }
    if (!whole)
        return false;
    *nc = (size_t)top->n; /* rounding left the total a hair short: keep everything */
    *z = cum;
    return true;
}

/* Min-p alone (no top-k or top-p) from the first pass: the survivors are the tokens whose
   weight expf((l - max) / T) is at least min_p, and when the candidates' last one falls
   below that, every survivor is a candidate (a token outside weighs no more). Kept in token
   order and summed in it, as the full path's filter over the row leaves them: the same
   c[0, *nc) and *z. No edits or penalties (the full path then). */
static bool min_p_from_top(struct sampler *s, const struct logits_top *top,
                           const struct sampler_edits *ed, size_t *nc, double *z)
{
    if (!top || top->n_nan || top->n < 1 || has_edits(ed) || penalties_on(&s->p) ||
        isinf(top->vals[0]))
        return false;
    const float maxv = top->vals[0], inv_t = 1.0f / s->p.temperature;
    const bool whole = top->n == s->n_vocab;
    if (!whole && !(expf((top->vals[top->n - 1] - maxv) * inv_t) < s->p.min_p))
        return false;
    struct cand *c = s->cand;
    size_t k = 0;
    for (int j = 0; j < top->n; j++) {
        const float w = expf((top->vals[j] - maxv) * inv_t);
        if (w >= s->p.min_p)
            c[k++] = (struct cand){w, top->ids[j]};
    }
    for (size_t i = 1; i < k; i++) { /* insertion sort by id: at most LOGITS_TOP_K */
        struct cand x = c[i];
        size_t j = i;
        for (; j > 0 && c[j - 1].i > x.i; j--)
            c[j] = c[j - 1];
        c[j] = x;
    }
    double sum = 0.0;
    for (size_t i = 0; i < k; i++)
        sum += c[i].v;
    *nc = k;
    *z = sum;
    return true;
}

/* Step 6: drop candidates whose weight is below min_p (the largest weight is exp(0) = 1). */
static void apply_min_p(struct cand *c, size_t *nc, double *z, float min_p)
{
    size_t k = 0;
    double sum = 0.0;
    for (size_t i = 0; i < *nc; i++)
        if (c[i].v >= min_p) {
            c[k++] = c[i];
            sum += c[i].v;
        }
    *nc = k;
    *z = sum;
}

/* ------------------------------------------------------------------------------------- */
/* the temperature path: no top-k, top-p or min-p */

/* Sampling draws from every token's weight at a temperature (sampler_stats_inv_t). */
static bool plain_path(const struct sampler_params *p, int n_vocab)
{
    return p->temperature >= SAMPLER_EPS && (p->top_k <= 0 || p->top_k >= n_vocab) &&
           p->top_p >= 1.0f && p->min_p <= 0.0f;
}

float sampler_stats_inv_t(const struct sampler_params *p, int n_vocab)
{
    const bool top_p = p->temperature >= SAMPLER_EPS && (p->top_k <= 0 || p->top_k >= n_vocab) &&
                       p->top_p < 1.0f;
    return plain_path(p, n_vocab) || top_p ? 1.0f / p->temperature : 0.0f;
}

long long sampler_stats_hits(const struct sampler *s) { return s->stats_hits; }

static int cmp_i32(const void *x, const void *y)
{
    int32_t a = *(const int32_t *)x, b = *(const int32_t *)y;
    return (a > b) - (a < b);
}

/* s->mod[0, *n) = the ids edits or penalties change, ascending, each once. */
static int plain_modified(struct sampler *s, const struct sampler_edits *ed, int *n)
{
    const bool pen = penalties_on(&s->p);
    const int need = (ed ? ed->n : 0) + (pen ? s->hist_used : 0);
    if (need > s->cap_mod) {
        int32_t *m = wrealloc(s->mod, (size_t)need * sizeof *m);
        if (!m)
            return WELD_ERR_NOMEM;
        s->mod = m;
        s->cap_mod = need;
    }
    int k = 0;
    for (int i = 0; ed && i < ed->n; i++)
        s->mod[k++] = ed->ids[i];
    for (int i = 0; pen && i < s->hist_cap; i++)
        if (s->hist[i].token != -1)
            s->mod[k++] = s->hist[i].token;
    if (k > 1)
        qsort(s->mod, (size_t)k, sizeof *s->mod, cmp_i32);
    int u = 0;
    for (int i = 0; i < k; i++)
        if (u == 0 || s->mod[i] != s->mod[u - 1])
            s->mod[u++] = s->mod[i];
    *n = u;
    return WELD_OK;
}

_Static_assert(LOGITS_CHUNK % 32 == 0, "a chunk is whole mask words");

enum { CHUNK_ALL, CHUNK_SOME, CHUNK_NONE };

/* Whether the mask allows all, some or none of chunk c's n tokens (all when no mask). */
static int chunk_allowed(const struct sampler_edits *ed, int c, int n)
{
    if (!ed || !ed->allow)
        return CHUNK_ALL;
    const uint32_t *w = ed->allow + c * (LOGITS_CHUNK / 32);
    uint32_t any = 0, all = ~0u;
    for (int i = 0; i < (n + 31) / 32; i++) {
        const uint32_t valid = n - 32 * i < 32 ? (1u << (n - 32 * i)) - 1 : ~0u;
        any |= w[i] & valid;
        all &= w[i] | ~valid;
    }
    return !any ? CHUNK_NONE : all == ~0u ? CHUNK_ALL : CHUNK_SOME;
}

/* Chunk c's values after edits and penalties: the row itself when none of mod[*mi, ...)
   falls in it and the mask allows all of it, else a copy in buf with them applied; *mi
   moves past the chunk's ids. */
static const float *plain_chunk(const struct sampler *s, const float *logits,
                                const struct sampler_edits *ed, int c, int n_mod, int *mi,
                                float *buf)
{
    const int a = c * LOGITS_CHUNK;
    const int n = logits_chunk_len(s->n_vocab, c);
    const bool masked = chunk_allowed(ed, c, n) != CHUNK_ALL;
    if (!masked && (*mi >= n_mod || s->mod[*mi] >= a + n))
        return logits + a;
    memcpy(buf, logits + a, (size_t)n * sizeof *buf);
    for (; *mi < n_mod && s->mod[*mi] < a + n; (*mi)++)
        buf[s->mod[*mi] - a] = final_logit(s, logits, ed, s->mod[*mi]);
    for (int w = 0; masked && w < (n + 31) / 32; w++) /* the banned ones, a word at a time */
        for (uint32_t b = ~ed->allow[c * (LOGITS_CHUNK / 32) + w]; b; b &= b - 1) {
            const int j = 32 * w + __builtin_ctz(b);
            if (j < n)
                buf[j] = -INFINITY;
        }
    return buf;
}

/* The weights of the edited row by chunks: s->cmax / csum per chunk (from top's, made by
   the LM head, when it has them at this temperature and the row no NaN; else computed
   here; chunks holding a changed id recomputed either way: the same kernel on the same
   values, so the same bits), then each chunk's weight s->cw[c] and their sum *z.
   Errors: a NaN left after the edits, a +inf, or nothing but -inf (sampler_sample's). */
static int plain_weights(struct sampler *s, const float *logits, const struct logits_top *top,
                         const struct sampler_edits *ed, int *n_mod, double *z,
                         struct weld_err *e)
{
    const int nch = logits_n_chunks(s->n_vocab);
    const float inv_t = 1.0f / s->p.temperature;
    if (!stats_alloc(s) || plain_modified(s, ed, n_mod) != WELD_OK)
        return err_set(e, WELD_ERR_NOMEM, "sampler: out of memory for %d chunks", nch);
    const bool from_top = top && top->inv_t == inv_t && top->chunk_max && top->n_nan == 0;
    if (!from_top)
        for (int i = 0; i < s->n_vocab; i++)
            if (isnan(logits[i]) && edit_find(ed, i) < 0 && !banned(ed, i))
                return err_set(e, WELD_ERR_INVALID_ARG, "sampler: logits[%d] is NaN", i);
    const struct gemm_ops *go = gemm_ops_get();
    float buf[LOGITS_CHUNK];
    float m_all = -INFINITY;
    for (int c = 0, mi = 0; c < nch; c++) {
        const int a = c * LOGITS_CHUNK, was = mi;
        const int n = logits_chunk_len(s->n_vocab, c);
        if (chunk_allowed(ed, c, n) == CHUNK_NONE) { /* nothing allowed: no weight */
            while (mi < *n_mod && s->mod[mi] < a + n)
                mi++;
            s->cmax[c] = -INFINITY, s->csum[c] = 0.0f;
            continue;
        }
        const float *v = plain_chunk(s, logits, ed, c, *n_mod, &mi, buf);
        if (v == buf) {
            for (int k = was; k < mi; k++)
                if (isnan(buf[s->mod[k] - a]))
                    return err_set(e, WELD_ERR_INVALID_ARG, "sampler: logits[%d] is NaN",
                                   s->mod[k]);
        }
        if (from_top && v != buf) {
            s->cmax[c] = top->chunk_max[c];
            s->csum[c] = top->chunk_sum[c];
        } else {
            go->softmax_stats(v, n, inv_t, &s->cmax[c], &s->csum[c]);
        }
        if (s->cmax[c] > m_all)
            m_all = s->cmax[c];
        if (isinf(s->cmax[c]) && s->cmax[c] > 0) {
            for (int j = 0; j < n; j++)
                if (isinf(v[j]) && v[j] > 0)
                    return err_set(e, WELD_ERR_INVALID_ARG, "sampler: logits[%d] is +inf",
                                   a + j);
        }
    }
    if (isinf(m_all))
        return err_set(e, WELD_ERR_INVALID_ARG, "sampler: logits[0] is -inf, as is every logit");
    *z = chunks_total(s, inv_t);
    if (from_top)
        s->stats_hits++;
    return WELD_OK;
}

/* A token from plain_weights' chunks: u in [0, z) picks the chunk whose running weight
   passes it, then the token within the chunk (its weights attn_exp((l - max_c) / T)
   scaled by the chunk's, summed on from the chunks before). Rounding can leave u past a
   chunk's last token or past the last chunk: then the last token there with weight. */
static int plain_draw(struct sampler *s, const float *logits, const struct sampler_edits *ed,
                      int n_mod, double z)
{
    const int nch = logits_n_chunks(s->n_vocab);
    const float inv_t = 1.0f / s->p.temperature;
    const double u = rng_uniform(&s->rng) * z;
    double acc = 0.0;
    int c = 0;
    while (c < nch - 1 && !(u < acc + s->cw[c]))
        acc += s->cw[c++];
    while (c > 0 && s->cw[c] == 0.0) /* past the end: back to a chunk with weight */
        c--;
    int mi = 0;
    while (mi < n_mod && s->mod[mi] < c * LOGITS_CHUNK)
        mi++;
    float buf[LOGITS_CHUNK];
    const float *v = plain_chunk(s, logits, ed, c, n_mod, &mi, buf);
    const int a = c * LOGITS_CHUNK;
    const int n = logits_chunk_len(s->n_vocab, c);
    const double scale = (double)attn_exp((s->cmax[c] - s->m_all) * inv_t);
    int last = a;
    for (int j = 0; j < n; j++) {
        const float w = attn_exp((v[j] - s->cmax[c]) * inv_t);
        if (w > 0.0f) {
            last = a + j;
            acc += (double)w * scale;
            if (u < acc)
                return a + j;
        }
    }
    return last;
}

/* sampler_probs of the temperature path: each token's weight over z. */
static void plain_probs(struct sampler *s, const float *logits, int n_mod, double z,
                        float *probs)
{
    const int nch = logits_n_chunks(s->n_vocab);
    const float inv_t = 1.0f / s->p.temperature;
    float buf[LOGITS_CHUNK];
    for (int c = 0, mi = 0; c < nch; c++) {
        const int a = c * LOGITS_CHUNK;
        const int n = logits_chunk_len(s->n_vocab, c);
        const float *v = plain_chunk(s, logits, NULL, c, n_mod, &mi, buf);
        const double scale = (double)attn_exp((s->cmax[c] - s->m_all) * inv_t);
        for (int j = 0; j < n; j++)
            probs[a + j] = (float)((double)attn_exp((v[j] - s->cmax[c]) * inv_t) * scale / z);
    }
}

/* Greedy and top-k under a mask without a usable top: only the allowed tokens, in id
   order, after edits and penalties, into cand[0, *n) (the banned ones are -inf and would
   never be drawn). At least one token is allowed. */
static int load_allowed(struct sampler *s, const float *logits, const struct sampler_edits *ed,
                        size_t *n, struct weld_err *e)
{
    struct cand *c = s->cand;
    size_t k = 0;
    for (int w = 0; w < (s->n_vocab + 31) / 32; w++)
        for (uint32_t b = ed->allow[w]; b; b &= b - 1) {
            const int32_t i = w * 32 + __builtin_ctz(b);
            if (i >= s->n_vocab)
                break;
            const float v = final_logit(s, logits, ed, i);
            if (isnan(v))
                return err_set(e, WELD_ERR_INVALID_ARG, "sampler: logits[%d] is NaN", i);
            c[k++] = (struct cand){v, i};
        }
    if (!k)
        return err_set(e, WELD_ERR_INVALID_ARG, "sampler: the mask allows no token");
    *n = k;
    return WELD_OK;
}

/* Run steps 3-6 of sampler.h into s->cand[0, *nc) with weights summing to *z; for greedy
   *nc = 1 and the weight is 1. With top-k the survivors are in rank order (best first),
   so the sums and the draw below do not depend on how they were found. */
static int build_candidates(struct sampler *s, const float *logits,
                            const struct logits_top *top, const struct sampler_edits *ed,
                            size_t *nc, double *z, struct weld_err *e)
{
    if (!s->cand && !(s->cand = wmalloc((size_t)s->n_vocab * sizeof *s->cand)))
        return err_set(e, WELD_ERR_NOMEM, "sampler: out of memory for %d candidates",
                       s->n_vocab);
    struct cand *c = s->cand;
    const bool greedy = s->p.temperature < SAMPLER_EPS;
    const bool topk = s->p.top_k > 0 && s->p.top_k < s->n_vocab;
    size_t n = (size_t)s->n_vocab, best = 0;
    if (!greedy && !topk && s->p.top_p < 1.0f && top_p_from_top(s, logits, top, ed, nc, z)) {
        s->top_hits++;
        if (s->p.min_p > 0.0f)
            apply_min_p(c, nc, z, s->p.min_p);
        return WELD_OK;
    }
    if (!greedy && !topk && s->p.top_p >= 1.0f && s->p.min_p > 0.0f &&
        min_p_from_top(s, top, ed, nc, z)) {
        s->top_hits++;
        return WELD_OK;
    }
    if ((greedy || topk) && load_from_top(s, logits, top, ed, greedy ? 1 : (size_t)s->p.top_k)) {
        n = greedy ? 1 : (size_t)s->p.top_k; /* sorted: the best is c[0] */
        s->top_hits++;
    } else if ((greedy || topk) && ed && ed->allow) {
        int rc = load_allowed(s, logits, ed, &n, e);
        if (rc != WELD_OK)
            return rc;
        for (size_t i = 1; i < n; i++)
            if (c[i].v > c[best].v)
                best = i;
        if (!greedy) {
            if (isinf(c[best].v))
                return err_set(e, WELD_ERR_INVALID_ARG, "sampler: logits[%d] is %s",
                               c[best].v > 0 ? c[best].i : 0, /* the full pass's words */
                               c[best].v > 0 ? "+inf" : "-inf, as is every logit");
            const size_t k = (size_t)s->p.top_k < n ? (size_t)s->p.top_k : n;
            cand_top_sorted(c, n, k);
            n = k;
            best = 0;
        }
    } else {
        int rc = load_and_penalize(s, logits, ed, e);
        if (rc != WELD_OK)
            return rc;
        for (size_t i = 1; i < n; i++)
            if (c[i].v > c[best].v)
                best = i;
        if (!greedy && topk) {
            if (isinf(c[best].v))
                return err_set(e, WELD_ERR_INVALID_ARG, "sampler: logits[%zu] is %s", best,
                               c[best].v > 0 ? "+inf" : "-inf, as is every logit");
            cand_top_sorted(c, n, (size_t)s->p.top_k);
            n = (size_t)s->p.top_k;
            best = 0;
        }
    }
    if (greedy) {
        c[0] = (struct cand){1.0f, c[best].i};
        *nc = 1;
        *z = 1.0;
        return WELD_OK;
    }
    const float maxv = c[best].v;
    if (isinf(maxv))
        return err_set(e, WELD_ERR_INVALID_ARG, "sampler: logits[%zu] is %s", best,
                       maxv > 0 ? "+inf" : "-inf, as is every logit");
    *nc = n;
    const float inv_t = 1.0f / s->p.temperature;
    double sum = 0.0;
    const bool z_stats = !topk && s->p.top_p < 1.0f; /* c in token order: the row */
    if (z_stats && !stats_alloc(s))
        return err_set(e, WELD_ERR_NOMEM, "sampler: out of memory for the chunk statistics");
    if (z_stats) {
        stats_of_cand(s, c, inv_t);
        sum = chunks_total(s, inv_t);
    }
    for (size_t i = 0; i < *nc; i++) {
        c[i].v = expf((c[i].v - maxv) * inv_t);
        if (!z_stats)
            sum += c[i].v;
    }
    *z = sum;
    int rc;
    if (s->p.top_p < 1.0f && (rc = apply_top_p(s, nc, z, e)) != WELD_OK)
        return rc;
    if (s->p.min_p > 0.0f)
        apply_min_p(c, nc, z, s->p.min_p);
    return WELD_OK;
}

long long sampler_top_hits(const struct sampler *s) { return s->top_hits; }

int sampler_sample(struct sampler *s, const float *logits, int *token, struct weld_err *e)
{
    return sampler_sample_ex(s, logits, NULL, NULL, token, e);
}

int sampler_sample_ex(struct sampler *s, const float *logits, const struct logits_top *top,
                      const struct sampler_edits *ed, int *token, struct weld_err *e)
{
    size_t nc;
    double z;
    int rc, n_mod;
    if (plain_path(&s->p, s->n_vocab)) {
        if ((rc = plain_weights(s, logits, top, ed, &n_mod, &z, e)) != WELD_OK)
            return rc;
        *token = plain_draw(s, logits, ed, n_mod, z);
        return WELD_OK;
    }
    rc = build_candidates(s, logits, top, ed, &nc, &z, e);
    if (rc != WELD_OK)
        return rc;
    const struct cand *c = s->cand;
    *token = c[nc - 1].i;
    if (nc == 1)
        return WELD_OK;
    double u = rng_uniform(&s->rng) * z, acc = 0.0;
    for (size_t i = 0; i < nc; i++) {
        acc += c[i].v;
        if (u < acc) {
            *token = c[i].i;
            return WELD_OK;
        }
    }
    for (size_t i = nc; i-- > 0;) /* u rounded up to z: the last token with weight */
        if (c[i].v > 0.0f) {
            *token = c[i].i;
            break;
        }
    return WELD_OK;
}

int sampler_probs(struct sampler *s, const float *logits, float *probs, struct weld_err *e)
{
    size_t nc;
    double z;
    int rc, n_mod;
    if (plain_path(&s->p, s->n_vocab)) {
        if ((rc = plain_weights(s, logits, NULL, NULL, &n_mod, &z, e)) != WELD_OK)
            return rc;
        plain_probs(s, logits, n_mod, z, probs);
        return WELD_OK;
    }
    rc = build_candidates(s, logits, NULL, NULL, &nc, &z, e);
    if (rc != WELD_OK)
        return rc;
    memset(probs, 0, (size_t)s->n_vocab * sizeof *probs);
    for (size_t i = 0; i < nc; i++)
        probs[s->cand[i].i] = (float)(s->cand[i].v / z);
    return WELD_OK;
}

/* ------------------------------------------------------------------------------------- */
/* logprobs */

/* log(sum_i exp(l_i)) of a raw row by LOGITS_CHUNK chunks: each chunk's max m_c and sum
   s_c of attn_exp(l - m_c) (the LM head's statistics at inv_t 1 when top has them, else
   the same kernel here), merged in chunk order online in double: M = max so far, z =
   sum so far relative to M. +-inf when the row's max is. */
double sampler_log_sum_exp(const float *logits, int n_vocab, const struct logits_top *top)
{
    const bool have = top && top->inv_t == 1.0f && top->chunk_max && top->n_nan == 0;
    const struct gemm_ops *go = gemm_ops_get();
    const int nch = logits_n_chunks(n_vocab);
    double M = -INFINITY, z = 0.0;
    for (int c = 0; c < nch; c++) {
        float m, sc;
        if (have) {
            m = top->chunk_max[c];
            sc = top->chunk_sum[c];
        } else {
            go->softmax_stats(logits + (size_t)c * LOGITS_CHUNK, logits_chunk_len(n_vocab, c),
                              1.0f, &m, &sc);
        }
        if (isinf(m)) {
            if (m > 0)
                return m;
            continue;
        }
        if (m > M) {
            z = z * exp(M - (double)m) + sc;
            M = m;
        } else {
            z += sc * exp((double)m - M);
        }
    }
    return isinf(M) ? M : M + log(z);
}

float sampler_logprob(const float *logits, int n_vocab, int token)
{
    if (token < 0 || token >= n_vocab)
        return -INFINITY;
    return (float)((double)logits[token] - sampler_log_sum_exp(logits, n_vocab, NULL));
}

/* Min-heap on "better" over ids/vals: the root is the worst of the kept n. */
static void heap_sift_down(int32_t *ids, float *vals, int n, int i)
{
    for (;;) {
        int w = i, l = 2 * i + 1, r = l + 1;
        struct cand cw = {vals[w], ids[w]};
        if (l < n && cand_better(&cw, &(struct cand){vals[l], ids[l]}))
            w = l, cw = (struct cand){vals[l], ids[l]};
        if (r < n && cand_better(&cw, &(struct cand){vals[r], ids[r]}))
            w = r;
        if (w == i)
            return;
        int32_t ti = ids[i];
        float tv = vals[i];
        ids[i] = ids[w], vals[i] = vals[w];
        ids[w] = ti, vals[w] = tv;
        i = w;
    }
}

int sampler_top_logprobs(const float *logits, int n_vocab, int n, int32_t *ids,
                         float *logprobs)
{
    return sampler_top_logprobs_ex(logits, n_vocab, n, NULL,
                                   sampler_log_sum_exp(logits, n_vocab, NULL), ids, logprobs);
}

int sampler_top_logprobs_ex(const float *logits, int n_vocab, int n,
                            const struct logits_top *top, double lse, int32_t *ids,
                            float *logprobs)
{
    if (n <= 0 || n_vocab <= 0)
        return 0;
    if (n > n_vocab)
        n = n_vocab;
    if (top && top->n_nan == 0 && n <= top->n) { /* the same order: value, then lower id */
        for (int i = 0; i < n; i++) {
            ids[i] = top->ids[i];
            logprobs[i] = (float)((double)top->vals[i] - lse);
        }
        return n;
    }
    for (int i = 0; i < n; i++) {
        ids[i] = i;
        logprobs[i] = logits[i];
    }
    for (int i = n / 2 - 1; i >= 0; i--)
        heap_sift_down(ids, logprobs, n, i);
    for (int t = n; t < n_vocab; t++) {
        struct cand x = {logits[t], t}, root = {logprobs[0], ids[0]};
        if (cand_better(&x, &root)) {
            ids[0] = t;
            logprobs[0] = logits[t];
            heap_sift_down(ids, logprobs, n, 0);
        }
    }
    /* heap sort: repeatedly move the worst to the end, leaving best first */
    for (int end = n - 1; end > 0; end--) {
        int32_t ti = ids[0];
        float tv = logprobs[0];
        ids[0] = ids[end], logprobs[0] = logprobs[end];
        ids[end] = ti, logprobs[end] = tv;
        heap_sift_down(ids, logprobs, end, 0);
    }
    for (int i = 0; i < n; i++)
        logprobs[i] = (float)((double)logprobs[i] - lse);
    return n;
}

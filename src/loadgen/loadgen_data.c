/*
 * loadgen_data - the prompts `weld bench serve` sends, built once before the clock starts.
 *
 * Every prompt is plain text (or chat messages of plain text), never token ids, so any
 * OpenAI-compatible server can take it, and everything comes from one xoshiro stream seeded
 * with params->seed, drawn in a fixed order, so the same seed gives byte-identical prompts
 * on every run and against every server (a weld run and a llama-server run compare like
 * with like).
 *
 * Text of n tokens:
 *   - with a tokenizer: n token ids drawn uniformly from the vocabulary, skipping special
 *     and end-of-generation tokens and ids that do not decode to whole characters on their
 *     own (byte pieces, partial UTF-8) or decode to a NUL byte, then decoded. Decoding and re-encoding is not an
 *     identity, so the text is re-encoded (after whatever it is appended to) and ids are
 *     dropped or added until the count is exact, for at most FIT_ROUNDS rounds (the
 *     closest text is kept; prompt_len records the count really reached).
 *   - without: n words from a fixed list of common English words, which most tokenizers
 *     split into about one token each; prompt_len is then n, an estimate.
 *
 * Datasets:
 *   random         num_prompts prompts of input_len tokens.
 *   shared-prefix  num_groups prefixes of prefix_len tokens; request i belongs to group
 *                  i % num_groups (groups interleaved, as the server sees them) and is its
 *                  group's prefix, a space, and input_len tokens of its own.
 *   chat           conversations: a system prompt of prefix_len tokens shared by the group
 *                  (none when prefix_len is 0), then 1-3 user turns (user, assistant, ...,
 *                  user) whose contents split input_len tokens between them.
 *
 * Mixed lengths (params->mix, --mix I:O[:W],...): any dataset's requests fall into classes
 * of their own input and output lengths (input as input_len above). Class k gets exactly
 * its share W_k / sum(W) of the requests (largest remainders), in an order shuffled by the
 * same seeded stream, so a mix of long prompts with short outputs and short prompts with
 * long outputs loads a server as such a service does, and every run sends the same mix.
 *
 * Not done: real conversation corpora (ShareGPT) or length distributions; within a class
 * every request has exactly the lengths asked for, like vLLM's random dataset with range
 * ratio 0.
 */
#include "loadgen/loadgen.h"

#include "core/alloc.h"
#include "core/rng.h"
#include "tokenizer/tokenizer.h"

#include <stdlib.h>
#include <string.h>

#define FIT_ROUNDS 24
#define MAX_TOKENS_PER_TEXT (1 << 24)

static const char *const words[] = {
    "the", "of", "and", "to", "in", "is", "was", "that", "for", "on", "are", "with", "as",
    "it", "be", "at", "by", "this", "had", "not", "but", "from", "or", "have", "an", "they",
    "which", "one", "you", "were", "all", "we", "her", "she", "there", "would", "their",
    "will", "when", "who", "him", "been", "has", "more", "if", "no", "out", "so", "said",
    "what", "up", "its", "about", "into", "than", "them", "can", "only", "other", "new",
    "some", "could", "time", "these", "two", "may", "then", "do", "first", "any", "my",
    "now", "such", "like", "our", "over", "man", "me", "even", "most", "made", "after",
    "also", "did", "many", "before", "must", "through", "back", "years", "where", "much",
    "your", "way", "well", "down", "should", "because", "each", "just", "those", "people",
    "how", "too", "little", "state", "good", "very", "make", "world", "still", "own", "see",
    "men", "work", "long", "get", "here", "between", "both", "life", "being", "under",
    "never", "day", "same", "another", "know", "while", "last", "might", "us", "great",
    "old", "year", "off", "come", "since", "against", "go", "came", "right", "used", "take",
    "three", "house", "water", "light", "tree", "river", "small", "open", "city", "road",
    "green", "blue", "red", "story", "home", "book", "dog", "cat", "sun", "moon", "happy",
    "play", "friend", "school", "garden", "bird", "fish", "ball", "girl", "boy", "king",
    "queen", "door", "hand", "head", "eyes", "face", "night", "morning", "found", "went",
    "looked", "asked", "smiled", "wanted", "together", "always", "again", "away", "big",
    "best", "every", "fast", "slow", "warm", "cold", "food", "tall", "walk", "run", "sing",
};
#define N_WORDS (sizeof words / sizeof words[0])

struct gen {
    const struct loadgen_dataset_params *p;
    struct rng g;
    const struct tokenizer *tok;
    int32_t *ok_ids;          /* (n_ok) ids that decode to whole characters */
    int n_ok;
};

int loadgen_dataset_kind_parse(const char *name, enum loadgen_dataset_kind *out)
{
    if (!strcmp(name, "random"))
        *out = LOADGEN_DATASET_RANDOM;
    else if (!strcmp(name, "shared-prefix"))
        *out = LOADGEN_DATASET_SHARED_PREFIX;
    else if (!strcmp(name, "chat"))
        *out = LOADGEN_DATASET_CHAT;
    else
        return WELD_ERR_INVALID_ARG;
    return WELD_OK;
}

int loadgen_mix_parse(const char *spec, struct loadgen_mix_class *out, int *n, struct weld_err *e)
{
    *n = 0;
    for (const char *p = spec;;) {
        const char *end = p + strcspn(p, ",");
        long v[3] = {0, 0, 1};
        int k = 0;
        const char *q = p;
        while (k < 3) {
            char *stop;
            if (*q < '0' || *q > '9')
                break;
            v[k++] = strtol(q, &stop, 10);
            q = stop;
            if (q == end || *q != ':')
                break;
            q++;
        }
        if (k < 2 || q != end || q[-1] == ':' || v[0] < 1 || v[0] > MAX_TOKENS_PER_TEXT ||
            v[1] < 1 || v[1] > MAX_TOKENS_PER_TEXT || v[2] < 1 || v[2] > 1000000)
            return err_set(e, WELD_ERR_INVALID_ARG,
                           "--mix: '%.*s' is not INPUT:OUTPUT[:WEIGHT] (token counts >= 1, "
                           "weight 1..1000000; e.g. --mix 1536:16,64:512)",
                           (int)(end - p), p);
        if (*n == LOADGEN_MIX_MAX)
            return err_set(e, WELD_ERR_INVALID_ARG, "--mix: at most %d classes", LOADGEN_MIX_MAX);
        out[(*n)++] = (struct loadgen_mix_class){(int)v[0], (int)v[1], (int)v[2]};
        if (!*end)
            return WELD_OK;
        p = end + 1;
    }
}

const char *loadgen_dataset_kind_name(enum loadgen_dataset_kind k)
{
    switch (k) {
    case LOADGEN_DATASET_RANDOM: return "random";
    case LOADGEN_DATASET_SHARED_PREFIX: return "shared-prefix";
    case LOADGEN_DATASET_CHAT: return "chat";
    }
    return "?";
}

/* Ids that may appear in random text: not special, not end-of-generation, and decoding
   alone to non-empty valid text without U+FFFD. */
static int gen_ok_ids(struct gen *g, struct weld_err *e)
{
    int nv = tokenizer_n_vocab(g->tok);
    if (nv <= 0)
        return err_set(e, WELD_ERR_INVALID_ARG, "tokenizer: empty vocabulary");
    g->ok_ids = wmalloc((size_t)nv * sizeof *g->ok_ids);
    if (!g->ok_ids)
        return err_set(e, WELD_ERR_NOMEM, "dataset: out of memory");
    for (int32_t id = 0; id < nv; id++) {
        if (tokenizer_is_special(g->tok, id) || tokenizer_is_eog(g->tok, id))
            continue;
        char *s = NULL;
        size_t len = 0;
        if (tokenizer_decode(g->tok, &id, 1, true, &s, &len, NULL) != WELD_OK)
            return err_set(e, WELD_ERR_NOMEM, "dataset: out of memory decoding token %d", id);
        bool ok = len > 0 && strlen(s) == len && !strstr(s, "\xEF\xBF\xBD"); /* no NUL */
        wfree(s);
        if (ok)
            g->ok_ids[g->n_ok++] = id;
    }
    if (g->n_ok == 0)
        return err_set(e, WELD_ERR_INVALID_ARG,
                       "tokenizer: no token decodes to text on its own; cannot build prompts");
    return WELD_OK;
}

/* Append `s` (len bytes) to a heap string (*dst, *dlen). */
static int str_append(char **dst, size_t *dlen, const char *s, size_t len)
{
    char *n = wrealloc(*dst, *dlen + len + 1);
    if (!n)
        return WELD_ERR_NOMEM;
    memcpy(n + *dlen, s, len);
    *dlen += len;
    n[*dlen] = 0;
    *dst = n;
    return WELD_OK;
}

static char *words_text(struct gen *g, int n)
{
    char *s = NULL;
    size_t len = 0;
    if (str_append(&s, &len, "", 0))
        return NULL;
    for (int i = 0; i < n; i++) {
        const char *w = words[rng_u64(&g->g) % N_WORDS];
        if ((i && str_append(&s, &len, " ", 1)) || str_append(&s, &len, w, strlen(w))) {
            wfree(s);
            return NULL;
        }
    }
    return s;
}

static int count_tokens(struct gen *g, const char *text, int *n, struct weld_err *e)
{
    int32_t *ids = NULL;
    size_t n_ids = 0;
    int rc = tokenizer_encode(g->tok, text, strlen(text), false, false, &ids, &n_ids, e);
    wfree(ids);
    *n = (int)n_ids;
    return rc;
}

/* head + separator + text as a new heap string. */
static char *join(const char *head, const char *text)
{
    size_t hl = head ? strlen(head) : 0, tl = strlen(text);
    bool sep = hl > 0 && tl > 0 && text[0] != ' ' && text[0] != '\n';
    char *s = wmalloc(hl + sep + tl + 1);
    if (!s)
        return NULL;
    if (hl)
        memcpy(s, head, hl);
    if (sep)
        s[hl] = ' ';
    memcpy(s + hl + sep, text, tl + 1);
    return s;
}

/* Text of `target` tokens when appended to head (which encodes to head_n tokens): the whole
   joined string goes to *out; *got is the token count reached beyond head_n. */
static int fit_text(struct gen *g, const char *head, int head_n, int target, char **out,
                    int *got, struct weld_err *e)
{
    int32_t *ids = wmalloc(((size_t)target * 2 + 16) * sizeof *ids);
    int cap = target * 2 + 16, n_ids = target, best_diff = -1, rc = WELD_OK;
    char *best = NULL;
    if (!ids)
        return err_set(e, WELD_ERR_NOMEM, "dataset: out of memory");
    for (int i = 0; i < n_ids; i++)
        ids[i] = g->ok_ids[rng_u64(&g->g) % (uint64_t)g->n_ok];
    for (int round = 0; round < FIT_ROUNDS && best_diff != 0; round++) {
        char *text = NULL, *full = NULL;
        size_t tl = 0;
        int n = 0;
        if ((rc = tokenizer_decode(g->tok, ids, (size_t)n_ids, true, &text, &tl, e)))
            break;
        full = join(head, text);
        wfree(text);
        if (!full) {
            rc = err_set(e, WELD_ERR_NOMEM, "dataset: out of memory");
            break;
        }
        if ((rc = count_tokens(g, full, &n, e))) {
            wfree(full);
            break;
        }
        n -= head_n;
        int diff = n > target ? n - target : target - n;
        if (best_diff < 0 || diff < best_diff) {
            wfree(best);
            best = full, best_diff = diff, *got = n;
        } else {
            wfree(full);
        }
        if (n > target)
            n_ids = n_ids - (n - target) > 1 ? n_ids - (n - target) : 1;
        if (round >= 2 && n != target) /* oscillating: a fresh last id breaks the cycle */
            ids[n_ids - 1] = g->ok_ids[rng_u64(&g->g) % (uint64_t)g->n_ok];
        for (int k = 0; k < target - n && n_ids < cap; k++)
            ids[n_ids++] = g->ok_ids[rng_u64(&g->g) % (uint64_t)g->n_ok];
    }
    wfree(ids);
    if (rc) {
        wfree(best);
        return rc;
    }
    *out = best;
    return WELD_OK;
}

/* A text of n tokens after head (NULL or "" for none); *out is head + text. */
static int make_text(struct gen *g, const char *head, int head_n, int n, char **out, int *got,
                     struct weld_err *e)
{
    if (n < 0 || n > MAX_TOKENS_PER_TEXT)
        return err_set(e, WELD_ERR_INVALID_ARG, "dataset: %d tokens in one text is out of range", n);
    if (!g->tok) {
        char *w = words_text(g, n);
        *out = w ? join(head, w) : NULL;
        wfree(w);
        *got = n;
        return *out ? WELD_OK : err_set(e, WELD_ERR_NOMEM, "dataset: out of memory");
    }
    if (n == 0) {
        *out = wstrdup(head ? head : "");
        *got = 0;
        return *out ? WELD_OK : err_set(e, WELD_ERR_NOMEM, "dataset: out of memory");
    }
    return fit_text(g, head, head_n, n, out, got, e);
}

static int check_params(const struct loadgen_dataset_params *p, struct weld_err *e)
{
    if (p->n_mix < 0 || p->n_mix > LOADGEN_MIX_MAX || (p->n_mix > 0) != (p->mix != NULL))
        return err_set(e, WELD_ERR_INVALID_ARG, "dataset: %d mix classes (at most %d)", p->n_mix,
                       LOADGEN_MIX_MAX);
    for (int k = 0; k < p->n_mix; k++)
        if (p->mix[k].input_len < 1 || p->mix[k].input_len > MAX_TOKENS_PER_TEXT ||
            p->mix[k].output_len < 1 || p->mix[k].weight < 1)
            return err_set(e, WELD_ERR_INVALID_ARG,
                           "dataset: mix class %d (%d:%d:%d) needs lengths in 1..%d and a "
                           "weight >= 1",
                           k, p->mix[k].input_len, p->mix[k].output_len, p->mix[k].weight,
                           MAX_TOKENS_PER_TEXT);
    if (p->num_prompts < 1 || p->num_prompts > 10000000)
        return err_set(e, WELD_ERR_INVALID_ARG, "dataset: num_prompts %d must be in 1..1e7",
                       p->num_prompts);
    if (p->input_len < 1 || p->input_len > MAX_TOKENS_PER_TEXT)
        return err_set(e, WELD_ERR_INVALID_ARG, "dataset: input_len %d must be in 1..%d",
                       p->input_len, MAX_TOKENS_PER_TEXT);
    if (p->output_len < 1)
        return err_set(e, WELD_ERR_INVALID_ARG, "dataset: output_len %d must be >= 1", p->output_len);
    if (p->kind != LOADGEN_DATASET_RANDOM) {
        if (p->prefix_len < 0 || p->prefix_len > MAX_TOKENS_PER_TEXT)
            return err_set(e, WELD_ERR_INVALID_ARG, "dataset: prefix_len %d must be in 0..%d",
                           p->prefix_len, MAX_TOKENS_PER_TEXT);
        if (p->num_groups < 1 || p->num_groups > p->num_prompts)
            return err_set(e, WELD_ERR_INVALID_ARG,
                           "dataset: num_groups %d must be in 1..num_prompts (%d)",
                           p->num_groups, p->num_prompts);
    }
    return WELD_OK;
}

/* Group prefixes (shared-prefix) or system prompts (chat): (num_groups) texts. */
static int make_prefixes(struct gen *g, char ***pre, int **pre_n, struct weld_err *e)
{
    int ng = g->p->num_groups;
    *pre = wcalloc((size_t)ng, sizeof **pre);
    *pre_n = wcalloc((size_t)ng, sizeof **pre_n);
    if (!*pre || !*pre_n)
        return err_set(e, WELD_ERR_NOMEM, "dataset: out of memory");
    for (int i = 0; i < ng; i++) {
        int rc = make_text(g, NULL, 0, g->p->prefix_len, &(*pre)[i], &(*pre_n)[i], e);
        if (rc)
            return rc;
    }
    return WELD_OK;
}

static int build_chat(struct gen *g, struct loadgen_prompt *pr, int in, const char *sys, int sys_n,
                      struct weld_err *e)
{
    int turns = 1 + (int)(rng_u64(&g->g) % 3);
    while (turns > 1 && in < 2 * turns - 1)
        turns--;
    int n_conv = 2 * turns - 1;
    pr->msgs = wcalloc((size_t)n_conv + 1, sizeof *pr->msgs);
    if (!pr->msgs)
        return err_set(e, WELD_ERR_NOMEM, "dataset: out of memory");
    if (sys) {
        pr->msgs[pr->n_msgs].role = "system";
        if (!(pr->msgs[pr->n_msgs++].content = wstrdup(sys)))
            return err_set(e, WELD_ERR_NOMEM, "dataset: out of memory");
        pr->prompt_len += sys_n;
    }
    for (int k = 0; k < n_conv; k++) {
        int len = in / n_conv + (k == n_conv - 1 ? in % n_conv : 0), got = 0;
        struct loadgen_msg *m = &pr->msgs[pr->n_msgs++];
        m->role = k % 2 ? "assistant" : "user";
        int rc = make_text(g, NULL, 0, len, &m->content, &got, e);
        if (rc)
            return rc;
        pr->prompt_len += got;
    }
    return WELD_OK;
}

/* Each request's mix class: class k gets its weight's share of the n requests (largest
   remainders, ties to the first class), then the order is shuffled (Fisher-Yates). */
static int *mix_classes(struct gen *g, int n, struct weld_err *e)
{
    const struct loadgen_mix_class *mix = g->p->mix;
    int nm = g->p->n_mix, *cls = wmalloc((size_t)n * sizeof *cls), given = 0;
    if (!cls) {
        err_set(e, WELD_ERR_NOMEM, "dataset: out of memory");
        return NULL;
    }
    int64_t wsum = 0, rem[LOADGEN_MIX_MAX];
    int cnt[LOADGEN_MIX_MAX];
    for (int k = 0; k < nm; k++)
        wsum += mix[k].weight;
    for (int k = 0; k < nm; k++) {
        cnt[k] = (int)((int64_t)n * mix[k].weight / wsum);
        rem[k] = (int64_t)n * mix[k].weight % wsum;
        given += cnt[k];
    }
    for (; given < n; given++) {
        int best = 0;
        for (int k = 1; k < nm; k++)
            best = rem[k] > rem[best] ? k : best;
        cnt[best]++, rem[best] = -1;
    }
    for (int k = 0, i = 0; k < nm; k++)
        for (int c = 0; c < cnt[k]; c++)
            cls[i++] = k;
    for (int i = n - 1; i > 0; i--) {
        int j = (int)(rng_u64(&g->g) % (uint64_t)(i + 1)), t = cls[i];
        cls[i] = cls[j], cls[j] = t;
    }
    return cls;
}

static int build_prompts(struct gen *g, struct loadgen_dataset *d, struct weld_err *e)
{
    const struct loadgen_dataset_params *p = g->p;
    char **pre = NULL;
    int *pre_n = NULL, rc = WELD_OK;
    bool grouped = p->kind != LOADGEN_DATASET_RANDOM && p->prefix_len > 0;
    int *cls = NULL;
    if (p->n_mix > 0 && !(cls = mix_classes(g, p->num_prompts, e)))
        return WELD_ERR_NOMEM;
    if (grouped && (rc = make_prefixes(g, &pre, &pre_n, e)))
        goto free_prefixes;
    for (int i = 0; i < p->num_prompts && rc == WELD_OK; i++) {
        struct loadgen_prompt *pr = &d->p[i];
        int grp = p->kind == LOADGEN_DATASET_RANDOM ? -1 : i % p->num_groups, got = 0;
        pr->group = grp;
        pr->output_len = cls ? p->mix[cls[i]].output_len : p->output_len;
        int in = cls ? p->mix[cls[i]].input_len : p->input_len;
        if (p->kind == LOADGEN_DATASET_CHAT) {
            rc = build_chat(g, pr, in, grouped ? pre[grp] : NULL, grouped ? pre_n[grp] : 0, e);
        } else {
            int head_n = grouped ? pre_n[grp] : 0;
            rc = make_text(g, grouped ? pre[grp] : NULL, head_n, in, &pr->text, &got, e);
            pr->prompt_len = head_n + got;
        }
    }
free_prefixes:
    wfree(cls);
    for (int i = 0; pre && i < p->num_groups; i++)
        wfree(pre[i]);
    wfree(pre);
    wfree(pre_n);
    return rc;
}

int loadgen_dataset_build(const struct loadgen_dataset_params *p, struct loadgen_dataset **out,
                          struct weld_err *e)
{
    *out = NULL;
    int rc = check_params(p, e);
    if (rc)
        return rc;
    struct gen g = {.p = p, .tok = p->tok};
    rng_seed(&g.g, p->seed);
    struct loadgen_dataset *d = wcalloc(1, sizeof *d);
    if (!d)
        return err_set(e, WELD_ERR_NOMEM, "dataset: out of memory");
    d->chat = p->kind == LOADGEN_DATASET_CHAT;
    d->p = wcalloc((size_t)p->num_prompts, sizeof *d->p);
    if (!d->p) {
        rc = err_set(e, WELD_ERR_NOMEM, "dataset: out of memory");
        goto fail;
    }
    d->n = p->num_prompts;
    if (g.tok && (rc = gen_ok_ids(&g, e)))
        goto fail;
    if ((rc = build_prompts(&g, d, e)))
        goto fail;
    wfree(g.ok_ids);
    *out = d;
    return WELD_OK;
fail:
    wfree(g.ok_ids);
    loadgen_dataset_free(d);
    return rc;
}

void loadgen_dataset_free(struct loadgen_dataset *d)
{
    if (!d)
        return;
    for (int i = 0; d->p && i < d->n; i++) {
        wfree(d->p[i].text);
        for (int k = 0; k < d->p[i].n_msgs; k++)
            wfree(d->p[i].msgs[k].content);
        wfree(d->p[i].msgs);
    }
    wfree(d->p);
    wfree(d);
}

static json_t *messages_json(const struct loadgen_prompt *p)
{
    json_t *a = json_array();
    if (!a)
        return NULL;
    if (!p->msgs) {
        if (json_array_append_new(a, json_pack("{s:s, s:s}", "role", "user", "content",
                                               p->text ? p->text : ""))) {
            json_decref(a);
            return NULL;
        }
        return a;
    }
    for (int k = 0; k < p->n_msgs; k++)
        if (json_array_append_new(a, json_pack("{s:s, s:s}", "role", p->msgs[k].role,
                                               "content", p->msgs[k].content))) {
            json_decref(a);
            return NULL;
        }
    return a;
}

char *loadgen_request_body(const struct loadgen_prompt *p, const char *model, bool chat,
                           struct weld_err *e)
{
    if (!chat && !p->text) {
        err_set(e, WELD_ERR_INVALID_ARG,
                "a chat prompt (messages) needs the /v1/chat/completions endpoint");
        return NULL;
    }
    json_t *b = json_pack("{s:i, s:f, s:b, s:{s:b}, s:b}", "max_tokens", p->output_len,
                          "temperature", 0.0, "stream", 1, "stream_options", "include_usage",
                          1, "ignore_eos", 1);
    bool ok = b != NULL;
    if (ok && model)
        ok = json_object_set_new(b, "model", json_string(model)) == 0;
    if (ok && chat)
        ok = json_object_set_new(b, "messages", messages_json(p)) == 0;
    else if (ok)
        ok = json_object_set_new(b, "prompt", json_string(p->text)) == 0;
    char *s = ok ? json_dumps(b, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    json_decref(b);
    char *out = s ? wstrdup(s) : NULL;
    free(s);
    if (!out)
        err_set(e, WELD_ERR_NOMEM, "request body: out of memory (or text not UTF-8)");
    return out;
}

/*
 * tokenizer - the encode pipeline, vocabulary maps and accessors (see tokenizer.h).
 *
 * Encoding follows Hugging Face's TokenizerImpl::encode for one sequence:
 *   1. split the raw text on added tokens that are not `normalized` (leftmost-longest, the
 *      aho-corasick MatchKind HF uses), honouring lstrip/rstrip/single_word; with
 *      parse_special false, special tokens are not matched (HF's encode_special_tokens);
 *   2. normalize each remaining piece separately (so Prepend applies per piece);
 *   3. split the normalized piece on `normalized` added tokens;
 *   4. pre-tokenize each remaining part into words and run the model on each word;
 *   5. with add_special, surround the ids with the post-processor's tokens.
 * The GGUF "llama" path is expressed with the same stages (Prepend + Replace normalizers,
 * SentencePiece-by-score model), which reproduces llama.cpp's "space after a special
 * token" rule because every piece gets the prefix.
 *
 * Maps: vmap is open addressing over vocab[] (linear probing, load <= 1/2); merges are
 * open addressing over 64-bit pair keys. Both are built at load time and read-only after.
 */
#include "tokenizer/tok_internal.h"

#include "core/alloc.h"

#include <string.h>
#include <xxhash.h>

uint64_t tok_hash(const void *s, size_t len)
{
    return XXH3_64bits(s, len);
}

struct tokenizer *tok_new(void)
{
    struct tokenizer *t = wcalloc(1, sizeof *t);
    if (!t)
        return NULL;
    t->bos = t->eos = t->eot = t->unk = t->pad = t->unk_id = -1;
    for (int i = 0; i < 256; i++) {
        t->byte_id[i] = -1;
        t->added_head[i] = -1;
    }
    t->cache = tok_cache_create();
    if (!t->cache) {
        wfree(t);
        return NULL;
    }
    return t;
}

int tok_alloc_vocab(struct tokenizer *t, int32_t n)
{
    if (n <= t->n_vocab)
        return WELD_OK;
    struct tok_str *v = wrealloc(t->vocab, (size_t)n * sizeof *v);
    if (!v)
        return WELD_ERR_NOMEM;
    t->vocab = v;
    memset(v + t->n_vocab, 0, (size_t)(n - t->n_vocab) * sizeof *v);
    uint8_t *sp = wrealloc(t->special, (size_t)n);
    if (!sp)
        return WELD_ERR_NOMEM;
    t->special = sp;
    memset(sp + t->n_vocab, 0, (size_t)(n - t->n_vocab));
    uint8_t *eg = wrealloc(t->eog, (size_t)n);
    if (!eg)
        return WELD_ERR_NOMEM;
    t->eog = eg;
    memset(eg + t->n_vocab, 0, (size_t)(n - t->n_vocab));
    t->n_vocab = n;
    return WELD_OK;
}

int tok_set_token(struct tokenizer *t, int32_t id, const char *s, size_t len)
{
    if (id < 0 || len > UINT32_MAX)
        return WELD_ERR_INVALID_ARG;
    if (id >= t->n_vocab && tok_alloc_vocab(t, id + 1))
        return WELD_ERR_NOMEM;
    char *c = wmalloc(len + 1);
    if (!c)
        return WELD_ERR_NOMEM;
    memcpy(c, s, len);
    c[len] = 0;
    wfree(t->vocab[id].s);
    t->vocab[id].s = c;
    t->vocab[id].len = (uint32_t)len;
    return WELD_OK;
}

static int map_grow(struct tokenizer *t)
{
    size_t cap = t->vmap.cap ? t->vmap.cap * 2 : 1024;
    uint32_t *slots = wcalloc(cap, sizeof *slots);
    if (!slots)
        return WELD_ERR_NOMEM;
    for (size_t i = 0; i < t->vmap.cap; i++) {
        uint32_t v = t->vmap.slots[i];
        if (!v)
            continue;
        const struct tok_str *s = &t->vocab[v - 1];
        size_t h = (size_t)tok_hash(s->s, s->len) & (cap - 1);
        while (slots[h])
            h = (h + 1) & (cap - 1);
        slots[h] = v;
    }
    wfree(t->vmap.slots);
    t->vmap.slots = slots;
    t->vmap.cap = cap;
    return WELD_OK;
}

/* Insert vocab[id]; for duplicate texts the later insert wins, like a HashMap built in id
   order. */
int tok_map_put(struct tokenizer *t, int32_t id)
{
    if ((t->vmap.n + 1) * 2 > t->vmap.cap && map_grow(t))
        return WELD_ERR_NOMEM;
    const struct tok_str *s = &t->vocab[id];
    size_t mask = t->vmap.cap - 1, h = (size_t)tok_hash(s->s, s->len) & mask;
    for (;; h = (h + 1) & mask) {
        uint32_t v = t->vmap.slots[h];
        if (!v) {
            t->vmap.slots[h] = (uint32_t)id + 1;
            t->vmap.n++;
            return WELD_OK;
        }
        const struct tok_str *o = &t->vocab[v - 1];
        if (o->len == s->len && memcmp(o->s, s->s, s->len) == 0) {
            t->vmap.slots[h] = (uint32_t)id + 1;
            return WELD_OK;
        }
    }
}

int32_t tok_map_get(const struct tokenizer *t, const char *s, size_t len)
{
    if (!t->vmap.cap)
        return -1;
    size_t mask = t->vmap.cap - 1, h = (size_t)tok_hash(s, len) & mask;
    for (;; h = (h + 1) & mask) {
        uint32_t v = t->vmap.slots[h];
        if (!v)
            return -1;
        const struct tok_str *o = &t->vocab[v - 1];
        if (o->len == len && memcmp(o->s, s, len) == 0)
            return (int32_t)(v - 1);
    }
}

static uint64_t merge_key(int32_t a, int32_t b)
{
    return ((uint64_t)(uint32_t)a << 32 | (uint32_t)b) + 1;
}

static size_t merge_slot(uint64_t key, size_t cap)
{
    return (size_t)XXH3_64bits(&key, sizeof key) & (cap - 1);
}

/* merge_cap must have been sized (power of two, > 2x the merges) before the first put. */
int tok_merge_put(struct tokenizer *t, int32_t a, int32_t b, uint32_t rank, int32_t id)
{
    uint64_t key = merge_key(a, b);
    size_t mask = t->merge_cap - 1;
    for (size_t h = merge_slot(key, t->merge_cap);; h = (h + 1) & mask) {
        struct tok_merge_slot *s = &t->merges[h];
        if (s->key == 0 || s->key == key) {
            s->key = key;
            s->rank = rank;
            s->id = id;
            return WELD_OK;
        }
    }
}

const struct tok_merge_slot *tok_merge_get(const struct tokenizer *t, int32_t a, int32_t b)
{
    if (!t->merge_cap)
        return NULL;
    uint64_t key = merge_key(a, b);
    size_t mask = t->merge_cap - 1;
    for (size_t h = merge_slot(key, t->merge_cap);; h = (h + 1) & mask) {
        const struct tok_merge_slot *s = &t->merges[h];
        if (s->key == key)
            return s;
        if (s->key == 0)
            return NULL;
    }
}

int tok_add_added(struct tokenizer *t, const struct tok_added *a)
{
    if (a->len == 0 || a->id < 0)
        return WELD_ERR_INVALID_ARG;
    struct tok_added *v = wrealloc(t->added, (size_t)(t->n_added + 1) * sizeof *v);
    if (!v)
        return WELD_ERR_NOMEM;
    t->added = v;
    struct tok_added *n = &v[t->n_added];
    *n = *a;
    n->text = tok_memdup(a->text, a->len);
    if (!n->text)
        return WELD_ERR_NOMEM;
    t->n_added++;
    return WELD_OK;
}

/* Link added tokens into per-first-byte lists, longest first; mark special ids. */
int tok_finish(struct tokenizer *t, const char *where, struct weld_err *e)
{
    for (int i = 0; i < 256; i++)
        t->added_head[i] = -1;
    t->any_normalized_added = false;
    for (int i = 0; i < t->n_added; i++) {
        struct tok_added *a = &t->added[i];
        if (a->id >= t->n_vocab || !t->vocab[a->id].s)
            if (tok_set_token(t, a->id, a->text, a->len))
                return err_set(e, WELD_ERR_NOMEM, "%s: out of memory", where);
        if (a->special)
            t->special[a->id] = 1;
        if (a->normalized)
            t->any_normalized_added = true;
        int *link = &t->added_head[(uint8_t)a->text[0]];
        while (*link >= 0 && t->added[*link].len >= a->len)
            link = &t->added[*link].next;
        a->next = *link;
        *link = i;
    }
    return WELD_OK;
}

/* Leftmost-longest added-token match in s[from..n) among tokens with the given normalized
   flag. Returns the index into t->added or -1; ms and me get the match (after lstrip/rstrip
   widening, never before `from`). */
static int find_added(const struct tokenizer *t, const char *s, size_t n, size_t from,
                      bool normalized, bool parse_special, size_t *ms, size_t *me)
{
    for (size_t i = from; i < n; i++) {
        for (int k = t->added_head[(uint8_t)s[i]]; k >= 0; k = t->added[k].next) {
            const struct tok_added *a = &t->added[k];
            if (a->normalized != normalized || (a->special && !parse_special))
                continue;
            if (a->len > n - i || memcmp(s + i, a->text, a->len) != 0)
                continue;
            size_t st = i, en = i + a->len;
            if (a->lstrip)
                while (st > from && (s[st - 1] == ' ' || s[st - 1] == '\t' ||
                                     s[st - 1] == '\n' || s[st - 1] == '\r'))
                    st--;
            if (a->rstrip)
                while (en < n && (s[en] == ' ' || s[en] == '\t' || s[en] == '\n' ||
                                  s[en] == '\r'))
                    en++;
            *ms = st;
            *me = en;
            return k;
        }
    }
    return -1;
}

int tok_ids_push(struct tok_ids *ids, int32_t id)
{
    if (ids->n == ids->cap) {
        size_t cap = ids->cap ? ids->cap * 2 : 64;
        int32_t *v = wrealloc(ids->v, cap * sizeof *v);
        if (!v)
            return WELD_ERR_NOMEM;
        ids->v = v;
        ids->cap = cap;
    }
    ids->v[ids->n++] = id;
    return WELD_OK;
}

int tok_spans_push(struct tok_spans *s, size_t off, size_t len)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 64;
        struct tok_span *v = wrealloc(s->v, cap * sizeof *v);
        if (!v)
            return WELD_ERR_NOMEM;
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n].off = off;
    s->v[s->n].len = len;
    s->n++;
    return WELD_OK;
}

struct enc_scratch {
    struct tok_buf norm, pre;
    struct tok_spans words;
};

/* Pre-tokenize one normalized part and run the model on each word. */
static int encode_part(const struct tokenizer *t, const char *s, size_t n, bool first,
                       struct enc_scratch *sc, struct tok_ids *out)
{
    sc->pre.n = 0;
    sc->words.n = 0;
    int rc = tok_pretokenize(t, s, n, first, &sc->pre, &sc->words);
    for (size_t i = 0; rc == WELD_OK && i < sc->words.n; i++)
        rc = tok_model_encode(t, sc->pre.p + sc->words.v[i].off, sc->words.v[i].len, out);
    return rc;
}

/* A piece of raw text between added tokens: normalize, split on normalized added tokens,
   encode the rest. */
static int encode_piece(const struct tokenizer *t, const char *s, size_t n, bool first,
                        bool parse_special, struct enc_scratch *sc, struct tok_ids *out)
{
    const char *ns = s;
    size_t nn = n;
    if (t->n_norms) {
        sc->norm.n = 0;
        if (tok_buf_put(&sc->norm, "", 0))
            return WELD_ERR_NOMEM;
        int rc = tok_normalize(t, s, n, &sc->norm);
        if (rc)
            return rc;
        ns = sc->norm.p;
        nn = sc->norm.n;
    }
    if (!t->any_normalized_added)
        return encode_part(t, ns, nn, first, sc, out);
    size_t pos = 0, ms, me;
    int k;
    while ((k = find_added(t, ns, nn, pos, true, parse_special, &ms, &me)) >= 0) {
        int rc = ms > pos ? encode_part(t, ns + pos, ms - pos, first && pos == 0, sc, out) : 0;
        if (rc || tok_ids_push(out, t->added[k].id))
            return rc ? rc : WELD_ERR_NOMEM;
        pos = me;
    }
    return pos < nn ? encode_part(t, ns + pos, nn - pos, first && pos == 0, sc, out) : WELD_OK;
}

int tokenizer_encode(const struct tokenizer *t, const char *text, size_t len, bool add_special,
                     bool parse_special, int32_t **ids, size_t *n_ids, struct weld_err *e)
{
    *ids = NULL;
    *n_ids = 0;
    if (!text && len)
        return err_set(e, WELD_ERR_INVALID_ARG, "tokenizer_encode: text is NULL");
    size_t valid = len ? tok_utf8_valid_prefix(text, len) : 0;
    if (valid < len)
        return err_set(e, WELD_ERR_INVALID_ARG,
                       "tokenizer_encode: text is not valid UTF-8 at byte %zu", valid);
    struct tok_ids out = {0};
    struct enc_scratch sc = {0};
    int rc = WELD_OK;
    for (int i = 0; add_special && rc == WELD_OK && i < t->n_post_pre; i++)
        rc = tok_ids_push(&out, t->post_pre[i]);
    size_t pos = 0, ms, me;
    int k;
    while (rc == WELD_OK &&
           (k = find_added(t, text, len, pos, false, parse_special, &ms, &me)) >= 0) {
        if (ms > pos)
            rc = encode_piece(t, text + pos, ms - pos, pos == 0, parse_special, &sc, &out);
        if (rc == WELD_OK)
            rc = tok_ids_push(&out, t->added[k].id);
        pos = me;
    }
    if (rc == WELD_OK && pos < len)
        rc = encode_piece(t, text + pos, len - pos, pos == 0, parse_special, &sc, &out);
    for (int i = 0; add_special && rc == WELD_OK && i < t->n_post_post; i++)
        rc = tok_ids_push(&out, t->post_post[i]);
    wfree(sc.norm.p);
    wfree(sc.pre.p);
    wfree(sc.words.v);
    if (rc) {
        wfree(out.v);
        char why[512];
        if (rc == WELD_ERR_LIMIT || rc == WELD_ERR_INTERNAL)
            tok_regex_error(why, sizeof why); /* only regexes fail these ways */
        else
            snprintf(why, sizeof why, "%s", rc == WELD_ERR_NOMEM ? "out of memory"
                                                                 : "invalid input");
        return err_set(e, rc, "tokenizer_encode: %s", why);
    }
    *ids = out.v;
    *n_ids = out.n;
    return WELD_OK;
}

void tokenizer_free(struct tokenizer *t)
{
    if (!t)
        return;
    for (int32_t i = 0; i < t->n_vocab; i++)
        wfree(t->vocab[i].s);
    wfree(t->vocab);
    wfree(t->special);
    wfree(t->eog);
    wfree(t->scores);
    wfree(t->vmap.slots);
    wfree(t->merges);
    wfree(t->cont_prefix);
    wfree(t->eow_suffix);
    for (int i = 0; i < t->n_norms; i++) {
        wfree(t->norms[i].a);
        wfree(t->norms[i].b);
        pcre2_code_free(t->norms[i].re);
    }
    for (int i = 0; i < t->n_pres; i++)
        pcre2_code_free(t->pres[i].re);
    for (int i = 0; i < t->n_decs; i++) {
        wfree(t->decs[i].a);
        wfree(t->decs[i].b);
    }
    for (int i = 0; i < t->n_added; i++)
        wfree(t->added[i].text);
    wfree(t->added);
    wfree(t->post_pre);
    wfree(t->post_post);
    wfree(t->chat_template);
    tok_cache_free(t->cache);
    wfree(t);
}

int tokenizer_n_vocab(const struct tokenizer *t)
{
    return t->n_vocab;
}

int tokenizer_bos(const struct tokenizer *t)
{
    return t->bos;
}

int tokenizer_eos(const struct tokenizer *t)
{
    return t->eos;
}

bool tokenizer_is_eog(const struct tokenizer *t, int32_t id)
{
    return id >= 0 && id < t->n_vocab && t->eog[id];
}

bool tokenizer_is_special(const struct tokenizer *t, int32_t id)
{
    return id >= 0 && id < t->n_vocab && t->special[id];
}

const char *tokenizer_chat_template(const struct tokenizer *t)
{
    return t->chat_template;
}

const char *tokenizer_token_text(const struct tokenizer *t, int32_t id, size_t *len)
{
    if (id < 0 || id >= t->n_vocab || !t->vocab[id].s)
        return NULL;
    if (len)
        *len = t->vocab[id].len;
    return t->vocab[id].s;
}

const char *tokenizer_bos_text(const struct tokenizer *t)
{
    return tokenizer_token_text(t, t->bos, NULL);
}

const char *tokenizer_eos_text(const struct tokenizer *t)
{
    return tokenizer_token_text(t, t->eos, NULL);
}

int32_t tokenizer_token_id(const struct tokenizer *t, const char *text, size_t len)
{
    for (int i = 0; i < t->n_added; i++)
        if (t->added[i].len == len && memcmp(t->added[i].text, text, len) == 0)
            return t->added[i].id;
    return tok_map_get(t, text, len);
}

void tok_mark_eog(struct tokenizer *t)
{
    static const char *const names[] = {
        "<|eot_id|>", "<|eom_id|>", "<|im_end|>", "<|endoftext|>", "<|end_of_text|>",
        "<｜end▁of▁sentence｜>", "<end_of_turn>", "<|end|>", "</s>", "<|return|>",
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        int32_t id = tokenizer_token_id(t, names[i], strlen(names[i]));
        if (id >= 0 && id < t->n_vocab)
            t->eog[id] = 1;
    }
    if (t->eos >= 0 && t->eos < t->n_vocab)
        t->eog[t->eos] = 1;
    if (t->eot >= 0 && t->eot < t->n_vocab)
        t->eog[t->eot] = 1;
}

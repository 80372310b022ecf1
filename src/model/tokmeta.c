/*
 * tokmeta - tokenizer metadata between tokenizer.json and GGUF keys (see tokmeta.h).
 *
 * Reading tokenizer.json: model.vocab gives text -> id, added_tokens give id -> text plus
 * their special flag; the token list covers 0..max(max id, n_vocab_min - 1). The gpt2
 * pre-tokenizer is recognised by comparing the Split regexes with the ones of the three
 * known families (embedded below verbatim from their tokenizer.json files), then by
 * looser substring tests. Special ids come from tokenizer_config.json (strings or
 * {"content": ...} objects, looked up in added_tokens then the vocab), then the
 * post_processor's TemplateProcessing, then generation_config.json. add_bos/add_eos are
 * always resolved (0/1) to what encoding with these files does, as tokenizer_load_hf and
 * transformers decide it: Llama tokenizer classes follow tokenizer_config's add_bos_token
 * (default true) / add_eos_token; other classes follow the TemplateProcessing (no template:
 * neither). So a GGUF written from them always states tokenizer.ggml.add_bos_token; one
 * without it (read from elsewhere) reads, and is written back, as llama.cpp's default
 * (tokenizer_gguf_default_add_bos).
 *
 * Writing tokenizer.json: the normalizer / pre_tokenizer / decoder objects of each gpt2
 * family are the exact JSON fragments of the reference files; llama gets the Llama 2
 * (SentencePiece-converted) layout. A string -> id hash table (open addressing, xxh3)
 * serves vocabulary lookups on both sides.
 */
#include "model/tokmeta.h"

#include "core/alloc.h"
#include "core/json.h"
#include "core/log.h"
#include "tokenizer/tokenizer.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#define TOKMETA_MAX_TOKENS (16 * 1024 * 1024)

/* ---- known gpt2 pre-tokenizer families (fragments of their tokenizer.json) ---- */

struct pre_family {
    const char *name;
    const char *normalizer, *pre_tokenizer, *decoder; /* JSON text */
};

static const struct pre_family pre_families[] = {
    {"llama-bpe", "null",
     "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}{1,3}| ?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+\"},\"behavior\":\"Isolated\",\"invert\":false},{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":true,\"use_regex\":false}]}",
     "{\"type\":\"ByteLevel\",\"add_prefix_space\":true,\"trim_offsets\":true,\"use_regex\":true}"},
    {"qwen2", "{\"type\":\"NFC\"}",
     "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}| ?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+\"},\"behavior\":\"Isolated\",\"invert\":false},{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":false,\"use_regex\":false}]}",
     "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":false,\"use_regex\":false}"},
    {"deepseek-v3", "{\"type\":\"Sequence\",\"normalizers\":[]}",
     "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":\"\\\\p{N}{1,3}\"},\"behavior\":\"Isolated\",\"invert\":false},{\"type\":\"Split\",\"pattern\":{\"Regex\":\"[\344\270\200-\351\276\245\343\201\200-\343\202\237\343\202\240-\343\203\277]+\"},\"behavior\":\"Isolated\",\"invert\":false},{\"type\":\"Split\",\"pattern\":{\"Regex\":\"[!\\\"#$%&'()*+,\\\\-./:;<=>?@\\\\[\\\\\\\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\\\p{L}\\\\p{P}\\\\p{S}]?[\\\\p{L}\\\\p{M}]+| ?[\\\\p{P}\\\\p{S}]+[\\r\\n]*|\\\\s*[\\r\\n]+|\\\\s+(?!\\\\S)|\\\\s+\"},\"behavior\":\"Isolated\",\"invert\":false},{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":true,\"use_regex\":false}]}",
     "{\"type\":\"ByteLevel\",\"add_prefix_space\":true,\"trim_offsets\":true,\"use_regex\":true}"},
};
#define N_PRE_FAMILIES ((int)(sizeof pre_families / sizeof pre_families[0]))

static const struct pre_family *pre_family_find(const char *name)
{
    for (int i = 0; i < N_PRE_FAMILIES; i++)
        if (!strcmp(pre_families[i].name, name))
            return &pre_families[i];
    return NULL;
}

/* ---- string -> id hash table ---- */

struct strmap {
    uint64_t cap;      /* power of two */
    const char **keys; /* (cap) borrowed; NULL = empty slot */
    int64_t *vals;     /* (cap) */
};

static int strmap_init(struct strmap *m, uint64_t n)
{
    m->cap = 16;
    while (m->cap < n * 2)
        m->cap <<= 1;
    m->keys = wcalloc(m->cap, sizeof *m->keys);
    m->vals = wcalloc(m->cap, sizeof *m->vals);
    return m->keys && m->vals ? 0 : -1;
}

static void strmap_free(struct strmap *m)
{
    wfree(m->keys);
    wfree(m->vals);
    memset(m, 0, sizeof *m);
}

/* Insert if absent (first insertion wins); the map never fills past half. */
static void strmap_put(struct strmap *m, const char *k, int64_t v)
{
    uint64_t i = XXH3_64bits(k, strlen(k)) & (m->cap - 1);
    while (m->keys[i]) {
        if (!strcmp(m->keys[i], k))
            return;
        i = (i + 1) & (m->cap - 1);
    }
    m->keys[i] = k;
    m->vals[i] = v;
}

static int64_t strmap_get_n(const struct strmap *m, const char *k, size_t len)
{
    uint64_t i = XXH3_64bits(k, len) & (m->cap - 1);
    while (m->keys[i]) {
        if (strlen(m->keys[i]) == len && !memcmp(m->keys[i], k, len))
            return m->vals[i];
        i = (i + 1) & (m->cap - 1);
    }
    return -1;
}

static int64_t strmap_get(const struct strmap *m, const char *k)
{
    return strmap_get_n(m, k, strlen(k));
}

/* ---- struct tokmeta basics ---- */

static struct tokmeta *tokmeta_alloc(int64_t n)
{
    struct tokmeta *t = wcalloc(1, sizeof *t);
    if (!t)
        return NULL;
    t->bos = t->eos = t->unk = t->pad = -1;
    t->add_bos = t->add_eos = t->add_space_prefix = -1;
    t->n_tokens = n;
    t->tokens = wcalloc((size_t)n ? (size_t)n : 1, sizeof *t->tokens);
    t->scores = wcalloc((size_t)n ? (size_t)n : 1, sizeof *t->scores);
    t->types = wcalloc((size_t)n ? (size_t)n : 1, sizeof *t->types);
    if (!t->tokens || !t->scores || !t->types) {
        tokmeta_free(t);
        return NULL;
    }
    return t;
}

void tokmeta_free(struct tokmeta *t)
{
    if (!t)
        return;
    if (t->tokens)
        for (int64_t i = 0; i < t->n_tokens; i++)
            wfree(t->tokens[i]);
    wfree(t->tokens);
    wfree(t->scores);
    wfree(t->types);
    if (t->merges)
        for (int64_t i = 0; i < t->n_merges; i++)
            wfree(t->merges[i]);
    wfree(t->merges);
    wfree(t->chat_template);
    wfree(t);
}

int tokmeta_effective_add_bos(const struct tokmeta *t)
{
    return t->add_bos >= 0 ? t->add_bos : tokenizer_gguf_default_add_bos(t->model, t->pre);
}

/* ---- tokenizer.json -> tokmeta ---- */

struct hf_ctx {
    const char *where;       /* tokenizer.json path, for messages */
    json_t *tok, *cfg, *gen; /* tokenizer.json, tokenizer_config.json, generation_config */
    json_t *model_cfg;       /* config.json next to them (last fallback for special ids) */
    json_t *added;           /* tok.added_tokens (array) or NULL */
    struct strmap vocab;     /* text -> id over t->tokens */
};

static int is_byte_token(const char *s)
{
    return strlen(s) == 6 && !strncmp(s, "<0x", 3) && s[5] == '>' &&
           strchr("0123456789ABCDEFabcdef", s[3]) && strchr("0123456789ABCDEFabcdef", s[4]);
}

static int looks_special(const char *s)
{
    size_t n = strlen(s);
    if (!strcmp(s, "<pad>") || !strcmp(s, "<mask>"))
        return 1;
    if (n >= 4 && !strncmp(s, "<|", 2) && !strcmp(s + n - 2, "|>"))
        return 1;
    /* "<｜" ... "｜>" (U+FF5C, DeepSeek) */
    if (n >= 8 && !strncmp(s, "<\xef\xbd\x9c", 4) && !strcmp(s + n - 4, "\xef\xbd\x9c>"))
        return 1;
    return 0;
}

/* Largest id in model.vocab and added_tokens, checking every entry's type and range. */
static int hf_scan_ids(struct hf_ctx *c, json_t *vocab, int64_t *max_id, struct weld_err *e)
{
    const char *key;
    json_t *v;
    *max_id = -1;
    json_object_foreach(vocab, key, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 ||
            json_integer_value(v) >= TOKMETA_MAX_TOKENS)
            return err_set(e, WELD_ERR_FORMAT, "%s: model.vocab['%s']: id is not an integer "
                           "in [0, %d)", c->where, key, TOKMETA_MAX_TOKENS);
        if (json_integer_value(v) > *max_id)
            *max_id = json_integer_value(v);
    }
    size_t i;
    json_array_foreach(c->added, i, v) {
        json_t *id = json_object_get(v, "id");
        if (!json_is_object(v) || !json_is_integer(id) || json_integer_value(id) < 0 ||
            json_integer_value(id) >= TOKMETA_MAX_TOKENS ||
            !json_is_string(json_object_get(v, "content")))
            return err_set(e, WELD_ERR_FORMAT, "%s: added_tokens[%zu]: needs an integer 'id' "
                           "in [0, %d) and a string 'content'", c->where, i,
                           TOKMETA_MAX_TOKENS);
        if (json_integer_value(id) > *max_id)
            *max_id = json_integer_value(id);
    }
    return WELD_OK;
}

static int set_token(struct tokmeta *t, int64_t id, const char *s, size_t len)
{
    wfree(t->tokens[id]);
    t->tokens[id] = wstrndup(s, len);
    return t->tokens[id] ? WELD_OK : WELD_ERR_NOMEM;
}

/* Replace every U+2581 in s with a space (llama.cpp pre-normalizes user-defined tokens). */
static void spaces_from_lower_bar(char *s)
{
    char *w = s;
    for (char *r = s; *r;) {
        if (!strncmp(r, "\xe2\x96\x81", 3)) {
            *w++ = ' ';
            r += 3;
        } else {
            *w++ = *r++;
        }
    }
    *w = 0;
}

static int hf_fill_tokens(struct hf_ctx *c, struct tokmeta *t, json_t *vocab, int llama,
                          struct weld_err *e)
{
    const char *key;
    json_t *v;
    json_object_foreach(vocab, key, v) {
        int64_t id = json_integer_value(v);
        if (!t->tokens[id] && set_token(t, id, key, strlen(key)))
            return err_set(e, WELD_ERR_NOMEM, "%s: out of memory", c->where);
        t->types[id] = TOKMETA_NORMAL;
    }
    size_t i;
    json_array_foreach(c->added, i, v) {
        int64_t id = json_integer_value(json_object_get(v, "id"));
        json_t *content = json_object_get(v, "content");
        if (set_token(t, id, json_string_value(content), json_string_length(content)))
            return err_set(e, WELD_ERR_NOMEM, "%s: out of memory", c->where);
        int special = json_is_true(json_object_get(v, "special"));
        if (special || looks_special(t->tokens[id])) {
            t->types[id] = TOKMETA_CONTROL;
        } else {
            t->types[id] = TOKMETA_USER_DEFINED;
            if (!llama)
                spaces_from_lower_bar(t->tokens[id]);
        }
    }
    for (int64_t id = 0; id < t->n_tokens; id++) {
        if (!t->tokens[id]) {
            char buf[40];
            snprintf(buf, sizeof buf, "[PAD%" PRId64 "]", id);
            if (set_token(t, id, buf, strlen(buf)))
                return err_set(e, WELD_ERR_NOMEM, "%s: out of memory", c->where);
            t->types[id] = TOKMETA_UNUSED;
        } else if (llama && t->types[id] == TOKMETA_NORMAL && is_byte_token(t->tokens[id])) {
            t->types[id] = TOKMETA_BYTE;
        }
    }
    return WELD_OK;
}

/* Scores for a SentencePiece-style vocabulary: walking the merges in order, each merge's
   result token (if normal and not yet scored) gets the next score 0, -1, -2, ...; normal
   tokens no merge produces follow in id order; byte/control/unknown tokens score 0. This
   ranks pieces the way the BPE merges do, and reproduces SentencePiece files whose pieces
   are stored in score order (stories260K: score = -(id - 259)). */
static int hf_llama_scores(struct tokmeta *t, const struct strmap *map)
{
    uint8_t *done = wcalloc((size_t)t->n_tokens + 1, 1);
    if (!done)
        return WELD_ERR_NOMEM;
    float next = 0.0f;
    for (int64_t i = 0; i < t->n_tokens; i++)
        t->scores[i] = 0.0f;
    for (int64_t m = 0; m < t->n_merges; m++) {
        const char *s = t->merges[m], *sp = strchr(s, ' ');
        if (!sp)
            continue;
        size_t la = (size_t)(sp - s), lb = strlen(sp + 1);
        char *cat = wmalloc(la + lb + 1);
        if (!cat) {
            wfree(done);
            return WELD_ERR_NOMEM;
        }
        memcpy(cat, s, la);
        memcpy(cat + la, sp + 1, lb + 1);
        int64_t id = strmap_get(map, cat);
        wfree(cat);
        if (id >= 0 && !done[id] && t->types[id] == TOKMETA_NORMAL) {
            done[id] = 1;
            t->scores[id] = -next;
            next += 1.0f;
        }
    }
    for (int64_t i = 0; i < t->n_tokens; i++) {
        if (!done[i] && t->types[i] == TOKMETA_NORMAL) {
            t->scores[i] = -next;
            next += 1.0f;
        }
    }
    wfree(done);
    return WELD_OK;
}

static int hf_merges(struct hf_ctx *c, struct tokmeta *t, json_t *merges, struct weld_err *e)
{
    if (!merges)
        return WELD_OK;
    if (!json_is_array(merges))
        return err_set(e, WELD_ERR_FORMAT, "%s: model.merges is not an array", c->where);
    size_t n = json_array_size(merges);
    t->merges = wcalloc(n ? n : 1, sizeof *t->merges);
    if (!t->merges)
        return err_set(e, WELD_ERR_NOMEM, "%s: out of memory for %zu merges", c->where, n);
    for (size_t i = 0; i < n; i++) {
        json_t *m = json_array_get(merges, i);
        char *s = NULL;
        if (json_is_string(m)) {
            s = wstrndup(json_string_value(m), json_string_length(m));
        } else if (json_is_array(m) && json_array_size(m) == 2 &&
                   json_is_string(json_array_get(m, 0)) && json_is_string(json_array_get(m, 1))) {
            const char *a = json_string_value(json_array_get(m, 0));
            const char *b = json_string_value(json_array_get(m, 1));
            size_t la = strlen(a), lb = strlen(b);
            s = wmalloc(la + lb + 2);
            if (s) {
                memcpy(s, a, la);
                s[la] = ' ';
                memcpy(s + la + 1, b, lb + 1);
            }
        } else {
            return err_set(e, WELD_ERR_FORMAT, "%s: model.merges[%zu]: expected \"a b\" or "
                           "[\"a\", \"b\"]", c->where, i);
        }
        if (!s)
            return err_set(e, WELD_ERR_NOMEM, "%s: out of memory", c->where);
        t->merges[t->n_merges++] = s;
    }
    return WELD_OK;
}

/* The Split regexes of a pre_tokenizer, newline-joined into buf. */
static void collect_split_regexes(json_t *pre, char *buf, size_t cap)
{
    buf[0] = 0;
    if (!json_is_object(pre))
        return;
    json_t *list = json_object_get(pre, "pretokenizers");
    size_t i, used = 0;
    json_t *p;
    if (!json_is_array(list)) {
        const char *rx = json_string_value(json_object_get(json_object_get(pre, "pattern"),
                                                           "Regex"));
        if (rx)
            snprintf(buf, cap, "%s\n", rx);
        return;
    }
    json_array_foreach(list, i, p) {
        const char *rx = json_string_value(json_object_get(json_object_get(p, "pattern"),
                                                           "Regex"));
        if (rx && used < cap) {
            int k = snprintf(buf + used, cap - used, "%s\n", rx);
            used += k > 0 ? (size_t)k : 0;
        }
    }
}

/* A lone ByteLevel pre-tokenizer with its GPT-2 regex (use_regex, default true) and no
   prefix space: GGUF's "default" pre-tokenizer. */
static bool bytelevel_gpt2(json_t *pre)
{
    const char *type = json_string_value(json_object_get(pre, "type"));
    json_t *ur = json_object_get(pre, "use_regex");
    return type && !strcmp(type, "ByteLevel") && !json_is_false(ur) &&
           !json_is_true(json_object_get(pre, "add_prefix_space"));
}

static int hf_detect_pre(struct hf_ctx *c, struct tokmeta *t, const char *hint,
                         struct weld_err *e)
{
    bool any = hint && !strcmp(hint, TOKMETA_PRE_ANY);
    if (any)
        hint = NULL;
    if (hint) {
        if (!pre_family_find(hint))
            return err_set(e, WELD_ERR_INVALID_ARG, "pre-tokenizer '%s' is not one weld knows "
                           "(llama-bpe, qwen2, deepseek-v3)", hint);
        snprintf(t->pre, sizeof t->pre, "%s", hint);
        return WELD_OK;
    }
    char have[4096], want[4096];
    collect_split_regexes(json_object_get(c->tok, "pre_tokenizer"), have, sizeof have);
    for (int i = 0; i < N_PRE_FAMILIES; i++) {
        json_t *ref = json_loads(pre_families[i].pre_tokenizer, 0, NULL);
        collect_split_regexes(ref, want, sizeof want);
        json_decref(ref);
        if (!strcmp(have, want)) {
            snprintf(t->pre, sizeof t->pre, "%s", pre_families[i].name);
            return WELD_OK;
        }
    }
    json_t *pre = json_object_get(c->tok, "pre_tokenizer");
    if (!have[0] && bytelevel_gpt2(pre)) { /* GPT-2 itself: ByteLevel's own regex split */
        snprintf(t->pre, sizeof t->pre, "default");
        return WELD_OK;
    }
    const char *name = NULL;
    if (strstr(have, "\xe4\xb8\x80-")) /* a CJK range: DeepSeek V3 */
        name = "deepseek-v3";
    else if (strstr(have, "(?i:'s") && strstr(have, "\\p{N}{1,3}"))
        name = "llama-bpe";
    else if (strstr(have, "(?i:'s"))
        name = "qwen2";
    if (!name && any) {
        snprintf(t->pre, sizeof t->pre, "custom");
        return WELD_OK;
    }
    if (!name)
        return err_set(e, WELD_ERR_UNSUPPORTED, "%s: pre_tokenizer: not a known byte-level BPE "
                       "family; pass a pre-tokenizer name (llama-bpe, qwen2, deepseek-v3)",
                       c->where);
    log_warn("%s: pre_tokenizer regexes differ from the reference ones; treating it as '%s'",
             c->where, name);
    snprintf(t->pre, sizeof t->pre, "%s", name);
    return WELD_OK;
}

/* A tokenizer_config token entry ("text" or {"content": "text"}) -> id, or -1. */
static int64_t hf_token_entry_id(struct hf_ctx *c, json_t *entry)
{
    if (json_is_object(entry))
        entry = json_object_get(entry, "content");
    if (!json_is_string(entry))
        return -1;
    size_t i;
    json_t *v;
    json_array_foreach(c->added, i, v) {
        json_t *content = json_object_get(v, "content");
        if (json_is_string(content) && json_equal(content, entry))
            return json_integer_value(json_object_get(v, "id"));
    }
    return strmap_get_n(&c->vocab, json_string_value(entry), json_string_length(entry));
}

static int64_t json_first_id(json_t *v)
{
    if (json_is_array(v))
        v = json_array_get(v, 0);
    double d = json_is_number(v) ? json_number_value(v) : -1;
    return d >= 0 && d < TOKMETA_MAX_TOKENS && d == (double)(int64_t)d ? (int64_t)d : -1;
}

/* tokenizer.json's post_processor: a TemplateProcessing (alone or in a Sequence) whose
   single-sequence template starts with a special token adds BOS, one that ends with a
   special token adds EOS; anything else (ByteLevel, null) adds neither. */
static void hf_post_processor(struct hf_ctx *c, struct tokmeta *t, int *add_bos, int *add_eos)
{
    json_t *pp = json_object_get(c->tok, "post_processor");
    json_t *list = json_object_get(pp, "processors");
    size_t n = json_is_array(list) ? json_array_size(list) : 1;
    *add_bos = *add_eos = 0;
    for (size_t i = 0; i < n; i++) {
        json_t *p = json_is_array(list) ? json_array_get(list, i) : pp;
        const char *type = json_string_value(json_object_get(p, "type"));
        if (!type || strcmp(type, "TemplateProcessing"))
            continue;
        json_t *single = json_object_get(p, "single");
        size_t ns = json_is_array(single) ? json_array_size(single) : 0;
        for (int end = 0; end < 2 && ns; end++) {
            json_t *st = json_object_get(json_array_get(single, end ? ns - 1 : 0), "SpecialToken");
            json_t *id = json_object_get(st, "id");
            int64_t tid = json_is_string(id) ? hf_token_entry_id(c, id) : -1;
            int64_t *slot = end ? &t->eos : &t->bos;
            if (tid < 0)
                continue;
            if (*slot < 0)
                *slot = tid;
            *(end ? add_eos : add_bos) = tid == *slot;
        }
    }
}

/* transformers' Llama tokenizer classes rebuild the post-processor from the config flags. */
static int hf_llama_class(json_t *cfg)
{
    const char *cls = json_string_value(json_object_get(cfg, "tokenizer_class"));
    return cls && (!strcmp(cls, "LlamaTokenizerFast") || !strcmp(cls, "LlamaTokenizer") ||
                   !strcmp(cls, "CodeLlamaTokenizerFast") || !strcmp(cls, "CodeLlamaTokenizer"));
}

static void hf_specials(struct hf_ctx *c, struct tokmeta *t)
{
    json_t *cfg = c->cfg;
    static const char *names[4] = {"bos_token", "eos_token", "unk_token", "pad_token"};
    int64_t *slots[4] = {&t->bos, &t->eos, &t->unk, &t->pad};
    for (int i = 0; i < 4; i++) {
        int64_t id = cfg ? hf_token_entry_id(c, json_object_get(cfg, names[i])) : -1;
        if (id >= 0)
            *slots[i] = id;
    }
    if (!cfg || t->unk < 0) {
        json_t *unk = json_object_get(json_object_get(c->tok, "model"), "unk_token");
        if (json_is_string(unk))
            t->unk = hf_token_entry_id(c, unk);
    }
    /* add_bos/add_eos: what encoding these files does (as tokenizer_load_hf does it), never
       left to a reader's default, so the GGUF states it explicitly. */
    hf_post_processor(c, t, &t->add_bos, &t->add_eos);
    if (cfg) {
        json_t *v;
        if (hf_llama_class(cfg)) {
            v = json_object_get(cfg, "add_bos_token");
            t->add_bos = json_is_boolean(v) ? json_is_true(v) : 1;
            t->add_eos = json_is_true(json_object_get(cfg, "add_eos_token"));
        }
        if (json_is_boolean(v = json_object_get(cfg, "add_prefix_space")))
            t->add_space_prefix = json_is_true(v);
    }
    json_t *fallbacks[2] = {c->gen, c->model_cfg};
    for (int i = 0; i < 2; i++) {
        if (!fallbacks[i])
            continue;
        if (t->bos < 0)
            t->bos = json_first_id(json_object_get(fallbacks[i], "bos_token_id"));
        if (t->eos < 0)
            t->eos = json_first_id(json_object_get(fallbacks[i], "eos_token_id"));
        if (t->pad < 0)
            t->pad = json_first_id(json_object_get(fallbacks[i], "pad_token_id"));
    }
    int64_t *all[4] = {&t->bos, &t->eos, &t->unk, &t->pad};
    for (int i = 0; i < 4; i++)
        if (*all[i] >= t->n_tokens)
            *all[i] = -1;
}

static json_t *load_optional(const char *dir, const char *name, struct weld_err *e, int *rc);

static int hf_chat_template(struct hf_ctx *c, struct tokmeta *t, const char *dir,
                            struct weld_err *e)
{
    json_t *ct = c->cfg ? json_object_get(c->cfg, "chat_template") : NULL;
    const char *s = NULL;
    if (json_is_string(ct)) {
        s = json_string_value(ct);
    } else if (json_is_array(ct)) { /* [{"name": ..., "template": ...}]: take "default" */
        size_t i;
        json_t *v;
        json_array_foreach(ct, i, v) {
            const char *name = json_string_value(json_object_get(v, "name"));
            if (!s || (name && !strcmp(name, "default")))
                s = json_string_value(json_object_get(v, "template"));
        }
    }
    if (s) {
        t->chat_template = wstrdup(s);
        return t->chat_template ? WELD_OK : err_set(e, WELD_ERR_NOMEM, "out of memory");
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
    size_t len;
    if (file_read_all(path, &t->chat_template, &len, NULL) != WELD_OK)
        t->chat_template = NULL;
    if (t->chat_template)
        return WELD_OK;
    int rc;
    json_t *j = load_optional(dir, "chat_template.json", e, &rc);
    s = json_string_value(json_object_get(j, "chat_template"));
    if (s && !(t->chat_template = wstrdup(s)))
        rc = err_set(e, WELD_ERR_NOMEM, "out of memory");
    json_decref(j);
    return rc;
}

static json_t *load_optional(const char *dir, const char *name, struct weld_err *e, int *rc)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    *rc = WELD_OK;
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fclose(f);
    /* tokenizer_config.json files carry model_max_length = 1e30 written as an integer:
       integers are read as reals here (only strings and booleans are used from it) */
    json_error_t je;
    json_t *j = json_load_file(path, JSON_DECODE_INT_AS_REAL | JSON_DECODE_ANY, &je);
    if (!j)
        *rc = err_set(e, WELD_ERR_FORMAT, "%s:%d:%d: bad JSON: %s", path, je.line, je.column,
                      je.text);
    else if (!json_is_object(j))
        *rc = err_set(e, WELD_ERR_FORMAT, "%s: not a JSON object", path);
    return j;
}

static int hf_open(struct hf_ctx *c, const char *path, char *dir, size_t dir_cap,
                   char *file, size_t file_cap, struct weld_err *e)
{
    size_t n = strlen(path);
    if (n >= 5 && !strcmp(path + n - 5, ".json")) {
        snprintf(file, file_cap, "%s", path);
        snprintf(dir, dir_cap, "%s", path);
        char *slash = strrchr(dir, '/');
        if (slash)
            *slash = 0;
        else
            snprintf(dir, dir_cap, ".");
    } else {
        snprintf(dir, dir_cap, "%s", path);
        snprintf(file, file_cap, "%s/tokenizer.json", path);
    }
    c->where = file;
    c->tok = jload_file(file, e);
    if (!c->tok)
        return e ? e->status : WELD_ERR_IO;
    int rc;
    c->cfg = load_optional(dir, "tokenizer_config.json", e, &rc);
    if (rc)
        return rc;
    c->gen = load_optional(dir, "generation_config.json", e, &rc);
    if (rc)
        return rc;
    c->model_cfg = load_optional(dir, "config.json", NULL, &rc); /* a fallback: errors ignored */
    c->added = json_object_get(c->tok, "added_tokens");
    if (c->added && !json_is_array(c->added))
        return err_set(e, WELD_ERR_FORMAT, "%s: added_tokens is not an array", file);
    return WELD_OK;
}

static int hf_kind(struct hf_ctx *c, json_t *model, int *llama, struct weld_err *e)
{
    const char *type = json_string_value(json_object_get(model, "type"));
    if (!json_is_object(model) || !json_is_object(json_object_get(model, "vocab")))
        return err_set(e, WELD_ERR_FORMAT, "%s: 'model' needs an object 'vocab'", c->where);
    if (!type || strcmp(type, "BPE"))
        return err_set(e, WELD_ERR_UNSUPPORTED, "%s: model.type '%s': only BPE tokenizers "
                       "are supported", c->where, type ? type : "(missing)");
    if (json_is_true(json_object_get(model, "byte_fallback"))) {
        *llama = 1;
        return WELD_OK;
    }
    char *pre = json_dumps(json_object_get(c->tok, "pre_tokenizer"), JSON_COMPACT);
    char *dec = json_dumps(json_object_get(c->tok, "decoder"), JSON_COMPACT);
    int byte_level = (pre && strstr(pre, "\"ByteLevel\"")) || (dec && strstr(dec, "\"ByteLevel\""));
    free(pre);
    free(dec);
    if (!byte_level)
        return err_set(e, WELD_ERR_UNSUPPORTED, "%s: BPE without byte_fallback and without a "
                       "ByteLevel pre-tokenizer/decoder is not supported", c->where);
    *llama = 0;
    return WELD_OK;
}

/* SentencePiece-style extras: the unknown token's type, scores, add_space_prefix. */
static int hf_llama_finish(struct hf_ctx *c, struct tokmeta *t, json_t *model,
                           struct weld_err *e)
{
    json_t *unk = json_object_get(model, "unk_token");
    int64_t uid = json_is_string(unk) ? hf_token_entry_id(c, unk) : -1;
    if (uid >= 0) {
        t->types[uid] = TOKMETA_UNKNOWN;
        t->unk = uid;
    }
    if (hf_llama_scores(t, &c->vocab))
        return err_set(e, WELD_ERR_NOMEM, "%s: out of memory", c->where);
    if (t->add_space_prefix < 0) {
        char *norm = json_dumps(json_object_get(c->tok, "normalizer"), JSON_COMPACT);
        t->add_space_prefix = norm && strstr(norm, "\"Prepend\"") ? 1 : 0;
        free(norm);
    }
    return WELD_OK;
}

int tokmeta_from_hf(struct tokmeta **out, const char *path, const char *pre_hint,
                    int64_t n_vocab_min, struct weld_err *e)
{
    struct hf_ctx c = {0};
    struct tokmeta *t = NULL;
    char dir[4096], file[4096];
    int llama = 0, rc;
    *out = NULL;
    if ((rc = hf_open(&c, path, dir, sizeof dir, file, sizeof file, e)))
        goto out_json;
    json_t *model = json_object_get(c.tok, "model");
    if ((rc = hf_kind(&c, model, &llama, e)))
        goto out_json;
    json_t *vocab = json_object_get(model, "vocab");
    int64_t max_id;
    if ((rc = hf_scan_ids(&c, vocab, &max_id, e)))
        goto out_json;
    int64_t n = max_id + 1 > n_vocab_min ? max_id + 1 : n_vocab_min;
    if (n > TOKMETA_MAX_TOKENS) {
        rc = err_set(e, WELD_ERR_LIMIT, "%s: %" PRId64 " tokens is over the limit", file, n);
        goto out_json;
    }
    t = tokmeta_alloc(n);
    if (!t) {
        rc = err_set(e, WELD_ERR_NOMEM, "%s: out of memory for %" PRId64 " tokens", file, n);
        goto out_json;
    }
    snprintf(t->model, sizeof t->model, "%s", llama ? "llama" : "gpt2");
    if ((rc = hf_fill_tokens(&c, t, vocab, llama, e)))
        goto out_t;
    if (strmap_init(&c.vocab, (uint64_t)n)) {
        rc = err_set(e, WELD_ERR_NOMEM, "%s: out of memory", file);
        goto out_t;
    }
    for (int64_t i = 0; i < n; i++)
        strmap_put(&c.vocab, t->tokens[i], i);
    if (llama)
        snprintf(t->pre, sizeof t->pre, "default");
    else if ((rc = hf_detect_pre(&c, t, pre_hint, e)))
        goto out_t;
    if ((rc = hf_merges(&c, t, json_object_get(model, "merges"), e)))
        goto out_t;
    hf_specials(&c, t);
    if ((llama && (rc = hf_llama_finish(&c, t, model, e))) ||
        (rc = hf_chat_template(&c, t, dir, e)))
        goto out_t;
    *out = t;
    t = NULL;
out_t:
    tokmeta_free(t);
out_json:
    strmap_free(&c.vocab);
    json_decref(c.tok);
    json_decref(c.cfg);
    json_decref(c.gen);
    json_decref(c.model_cfg);
    return rc;
}

/* ---- GGUF -> tokmeta ---- */

static int gguf_opt_id(const struct gguf_file *f, const char *key, int64_t n, int64_t *out,
                       struct weld_err *e)
{
    int64_t v;
    int rc = gguf_get_i64(f, key, &v, e);
    if (rc == WELD_ERR_NOT_FOUND)
        return WELD_OK;
    if (rc)
        return rc;
    *out = v >= 0 && v < n ? v : -1;
    return WELD_OK;
}

static int gguf_opt_flag(const struct gguf_file *f, const char *key, int *out,
                         struct weld_err *e)
{
    bool v;
    int rc = gguf_get_bool(f, key, &v, e);
    if (rc == WELD_ERR_NOT_FOUND)
        return WELD_OK;
    if (!rc)
        *out = v;
    return rc;
}

static int gguf_read_strs(const struct gguf_kv *kv, char **dst, struct weld_err *e)
{
    for (uint64_t i = 0; i < kv->arr_n; i++) {
        dst[i] = wstrndup(kv->arr_str[i].ptr, (size_t)kv->arr_str[i].len);
        if (!dst[i])
            return err_set(e, WELD_ERR_NOMEM, "out of memory reading '%s'", kv->key);
    }
    return WELD_OK;
}

static int gguf_read_arrays(const struct gguf_file *f, struct tokmeta *t, struct weld_err *e)
{
    const struct gguf_kv *kv;
    int rc = gguf_get_arr(f, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, &kv, e);
    if (rc == WELD_OK) {
        if ((int64_t)kv->arr_n != t->n_tokens)
            return err_set(e, WELD_ERR_FORMAT, "%s: tokenizer.ggml.scores has %" PRIu64
                           " entries for %" PRId64 " tokens", f->path, kv->arr_n, t->n_tokens);
        for (int64_t i = 0; i < t->n_tokens; i++)
            t->scores[i] = (float)gguf_arr_f64(kv, (uint64_t)i);
    } else if (rc != WELD_ERR_NOT_FOUND) {
        return rc;
    }
    rc = gguf_get_arr(f, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, &kv, e);
    for (int64_t i = 0; i < t->n_tokens; i++)
        t->types[i] = TOKMETA_NORMAL;
    if (rc == WELD_OK) {
        if ((int64_t)kv->arr_n != t->n_tokens)
            return err_set(e, WELD_ERR_FORMAT, "%s: tokenizer.ggml.token_type has %" PRIu64
                           " entries for %" PRId64 " tokens", f->path, kv->arr_n, t->n_tokens);
        for (int64_t i = 0; i < t->n_tokens; i++) {
            int64_t ty = gguf_arr_i64(kv, (uint64_t)i);
            t->types[i] = ty >= 1 && ty <= 6 ? (int32_t)ty : TOKMETA_NORMAL;
        }
    } else if (rc != WELD_ERR_NOT_FOUND) {
        return rc;
    }
    rc = gguf_get_arr(f, "tokenizer.ggml.merges", GGUF_TYPE_STRING, &kv, e);
    if (rc == WELD_OK) {
        t->merges = wcalloc(kv->arr_n ? (size_t)kv->arr_n : 1, sizeof *t->merges);
        if (!t->merges)
            return err_set(e, WELD_ERR_NOMEM, "out of memory for merges");
        t->n_merges = (int64_t)kv->arr_n;
        return gguf_read_strs(kv, t->merges, e);
    }
    return rc == WELD_ERR_NOT_FOUND ? WELD_OK : rc;
}

static int gguf_read_misc(const struct gguf_file *f, struct tokmeta *t, struct weld_err *e)
{
    int rc;
    int64_t n = t->n_tokens;
    if ((rc = gguf_opt_id(f, "tokenizer.ggml.bos_token_id", n, &t->bos, e)) ||
        (rc = gguf_opt_id(f, "tokenizer.ggml.eos_token_id", n, &t->eos, e)) ||
        (rc = gguf_opt_id(f, "tokenizer.ggml.unknown_token_id", n, &t->unk, e)) ||
        (rc = gguf_opt_id(f, "tokenizer.ggml.padding_token_id", n, &t->pad, e)) ||
        (rc = gguf_opt_flag(f, "tokenizer.ggml.add_bos_token", &t->add_bos, e)) ||
        (rc = gguf_opt_flag(f, "tokenizer.ggml.add_eos_token", &t->add_eos, e)) ||
        (rc = gguf_opt_flag(f, "tokenizer.ggml.add_space_prefix", &t->add_space_prefix, e)))
        return rc;
    struct gguf_str s;
    rc = gguf_get_str(f, "tokenizer.ggml.pre", &s, e);
    if (rc == WELD_OK)
        snprintf(t->pre, sizeof t->pre, "%.*s", (int)(s.len < 31 ? s.len : 31), s.ptr);
    else if (rc != WELD_ERR_NOT_FOUND)
        return rc;
    else
        snprintf(t->pre, sizeof t->pre, "%s", strcmp(t->model, "llama") ? "llama-bpe" : "default");
    rc = gguf_get_str(f, "tokenizer.chat_template", &s, e);
    if (rc == WELD_OK) {
        t->chat_template = wstrndup(s.ptr, (size_t)s.len);
        if (!t->chat_template)
            return err_set(e, WELD_ERR_NOMEM, "out of memory");
    } else if (rc != WELD_ERR_NOT_FOUND) {
        return rc;
    }
    return WELD_OK;
}

int tokmeta_from_gguf(struct tokmeta **out, const struct gguf_file *f, struct weld_err *e)
{
    struct gguf_str model;
    const struct gguf_kv *tok;
    *out = NULL;
    int rc = gguf_get_str(f, "tokenizer.ggml.model", &model, e);
    if (rc == WELD_ERR_NOT_FOUND)
        return err_set(e, WELD_ERR_NOT_FOUND, "%s: no tokenizer (key tokenizer.ggml.model)",
                       f->path);
    if (rc)
        return rc;
    int llama = model.len == 5 && !memcmp(model.ptr, "llama", 5);
    if (!llama && !(model.len == 4 && !memcmp(model.ptr, "gpt2", 4)))
        return err_set(e, WELD_ERR_UNSUPPORTED, "%s: tokenizer.ggml.model '%.*s': only 'llama' "
                       "and 'gpt2' are supported", f->path, (int)(model.len > 64 ? 64 : model.len),
                       model.ptr);
    rc = gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_TYPE_STRING, &tok, e);
    if (rc == WELD_ERR_NOT_FOUND)
        return err_set(e, WELD_ERR_FORMAT, "%s: tokenizer.ggml.tokens is missing", f->path);
    if (rc)
        return rc;
    if (tok->arr_n > TOKMETA_MAX_TOKENS)
        return err_set(e, WELD_ERR_LIMIT, "%s: tokenizer.ggml.tokens: %" PRIu64 " tokens is "
                       "over the limit", f->path, tok->arr_n);
    struct tokmeta *t = tokmeta_alloc((int64_t)tok->arr_n);
    if (!t)
        return err_set(e, WELD_ERR_NOMEM, "out of memory for %" PRIu64 " tokens", tok->arr_n);
    snprintf(t->model, sizeof t->model, "%s", llama ? "llama" : "gpt2");
    if ((rc = gguf_read_strs(tok, t->tokens, e)) || (rc = gguf_read_arrays(f, t, e)) ||
        (rc = gguf_read_misc(f, t, e))) {
        tokmeta_free(t);
        return rc;
    }
    *out = t;
    return WELD_OK;
}

/* ---- tokmeta -> GGUF ---- */

int tokmeta_to_gguf(const struct tokmeta *t, struct gguf_writer *w, struct weld_err *e)
{
    int rc = 0;
    int llama = !strcmp(t->model, "llama");
    rc |= gguf_writer_set_str(w, "tokenizer.ggml.model", t->model);
    rc |= gguf_writer_set_str(w, "tokenizer.ggml.pre", t->pre);
    rc |= gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)t->tokens,
                                  NULL, (uint64_t)t->n_tokens);
    if (llama)
        rc |= gguf_writer_set_arr(w, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, t->scores,
                                  (uint64_t)t->n_tokens);
    rc |= gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, t->types,
                              (uint64_t)t->n_tokens);
    if (!llama && t->n_merges)
        rc |= gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", (const char *const *)t->merges,
                                      NULL, (uint64_t)t->n_merges);
    const char *idk[4] = {"tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                          "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.padding_token_id"};
    int64_t ids[4] = {t->bos, t->eos, t->unk, t->pad};
    for (int i = 0; i < 4; i++)
        if (ids[i] >= 0)
            rc |= gguf_writer_set_u32(w, idk[i], (uint32_t)ids[i]);
    if (t->add_bos >= 0)
        rc |= gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", t->add_bos);
    if (t->add_eos >= 0)
        rc |= gguf_writer_set_bool(w, "tokenizer.ggml.add_eos_token", t->add_eos);
    if (llama && t->add_space_prefix >= 0)
        rc |= gguf_writer_set_bool(w, "tokenizer.ggml.add_space_prefix", t->add_space_prefix);
    if (t->chat_template)
        rc |= gguf_writer_set_str(w, "tokenizer.chat_template", t->chat_template);
    return rc ? err_set(e, WELD_ERR_NOMEM, "out of memory writing tokenizer keys") : WELD_OK;
}

/* ---- tokmeta -> tokenizer.json ---- */

struct sp_merge {
    int64_t piece, left, right;
    float score;
};

static int sp_merge_cmp(const void *pa, const void *pb)
{
    const struct sp_merge *a = pa, *b = pb;
    if (a->score != b->score)
        return a->score > b->score ? -1 : 1;
    if (a->piece != b->piece)
        return a->piece < b->piece ? -1 : 1;
    if (a->left != b->left)
        return a->left < b->left ? -1 : 1;
    return (a->right > b->right) - (a->right < b->right);
}

/* Append one merge candidate, growing the array. */
static int sp_push(struct sp_merge **arr, size_t *n, size_t *cap, struct sp_merge m)
{
    if (*n == *cap) {
        size_t nc = *cap ? *cap * 2 : 1024;
        struct sp_merge *p = wrealloc(*arr, nc * sizeof *p);
        if (!p)
            return -1;
        *arr = p;
        *cap = nc;
    }
    (*arr)[(*n)++] = m;
    return 0;
}

/* SentencePieceExtractor: all (left, right) splits of normal pieces, by score. */
static json_t *sp_merges_json(const struct tokmeta *t, const struct strmap *map)
{
    struct sp_merge *arr = NULL;
    size_t n = 0, cap = 0;
    json_t *out = NULL;
    for (int64_t id = 0; id < t->n_tokens; id++) {
        if (t->types[id] != TOKMETA_NORMAL)
            continue;
        const char *s = t->tokens[id];
        size_t len = strlen(s);
        for (size_t k = 1; k < len; k++) {
            if (((unsigned char)s[k] & 0xC0) == 0x80)
                continue; /* split at code point boundaries only */
            int64_t l = strmap_get_n(map, s, k), r = strmap_get(map, s + k);
            if (l < 0 || r < 0)
                continue;
            struct sp_merge m = {id, l, r, t->scores[id]};
            if (sp_push(&arr, &n, &cap, m))
                goto out;
        }
    }
    if (n)
        qsort(arr, n, sizeof *arr, sp_merge_cmp);
    out = json_array();
    for (size_t i = 0; out && i < n; i++) {
        size_t ll = strlen(t->tokens[arr[i].left]), lr = strlen(t->tokens[arr[i].right]);
        char *s = wmalloc(ll + lr + 2);
        if (!s) {
            json_decref(out);
            out = NULL;
            break;
        }
        memcpy(s, t->tokens[arr[i].left], ll);
        s[ll] = ' ';
        memcpy(s + ll + 1, t->tokens[arr[i].right], lr + 1);
        json_array_append_new(out, json_string(s));
        wfree(s);
    }
out:
    wfree(arr);
    return out;
}

static json_t *special_token_json(const struct tokmeta *t, int64_t id, int type_id)
{
    return json_pack("{s:{s:s,s:i}}", "SpecialToken", "id", t->tokens[id], "type_id", type_id);
}

static json_t *sequence_json(const char *id, int type_id)
{
    return json_pack("{s:{s:s,s:i}}", "Sequence", "id", id, "type_id", type_id);
}

/* TemplateProcessing: [BOS] A [EOS] (pair: [BOS] A [EOS] [BOS] B [EOS]), as transformers'
   Llama tokenizers build it from add_bos_token / add_eos_token. */
static json_t *template_json(const struct tokmeta *t, int bos, int eos)
{
    json_t *single = json_array(), *pair = json_array(), *specials = json_object();
    for (int s = 0; s < 2; s++) {
        if (bos)
            json_array_append_new(pair, special_token_json(t, t->bos, s));
        json_array_append_new(pair, sequence_json(s ? "B" : "A", s));
        if (eos)
            json_array_append_new(pair, special_token_json(t, t->eos, s));
    }
    if (bos)
        json_array_append_new(single, special_token_json(t, t->bos, 0));
    json_array_append_new(single, sequence_json("A", 0));
    if (eos)
        json_array_append_new(single, special_token_json(t, t->eos, 0));
    for (int k = 0; k < 2; k++) {
        int64_t id = k ? t->eos : t->bos;
        if (k ? eos : bos)
            json_object_set_new(specials, t->tokens[id],
                                json_pack("{s:s,s:[I],s:[s]}", "id", t->tokens[id], "ids",
                                          (json_int_t)id, "tokens", t->tokens[id]));
    }
    return json_pack("{s:s,s:o,s:o,s:o}", "type", "TemplateProcessing", "single", single,
                     "pair", pair, "special_tokens", specials);
}

static json_t *post_processor_json(const struct tokmeta *t, int llama)
{
    int bos = tokmeta_effective_add_bos(t) && t->bos >= 0;
    int eos = t->add_eos > 0 && t->eos >= 0;
    if (llama)
        return bos || eos ? template_json(t, bos, eos) : json_null();
    json_t *bl = json_pack("{s:s,s:b,s:b,s:b}", "type", "ByteLevel", "add_prefix_space", 0,
                           "trim_offsets", 0, "use_regex", 0);
    if (!bos && !eos)
        return bl;
    return json_pack("{s:s,s:[o,o]}", "type", "Sequence", "processors", bl,
                     template_json(t, bos, eos));
}

static json_t *added_tokens_json(const struct tokmeta *t)
{
    json_t *arr = json_array();
    for (int64_t i = 0; arr && i < t->n_tokens; i++) {
        int ty = t->types[i];
        if (ty != TOKMETA_CONTROL && ty != TOKMETA_USER_DEFINED && ty != TOKMETA_UNKNOWN)
            continue;
        json_array_append_new(arr, json_pack("{s:I,s:s,s:b,s:b,s:b,s:b,s:b}", "id",
                                             (json_int_t)i, "content", t->tokens[i],
                                             "single_word", 0, "lstrip", 0, "rstrip", 0,
                                             "normalized", ty == TOKMETA_USER_DEFINED,
                                             "special", ty != TOKMETA_USER_DEFINED));
    }
    return arr;
}

static const char llama_normalizer[] =
    "{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Prepend\",\"prepend\":\"\xe2\x96\x81\"},"
    "{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},\"content\":\"\xe2\x96\x81\"}]}";
static const char llama_decoder[] =
    "{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Replace\",\"pattern\":{\"String\":"
    "\"\xe2\x96\x81\"},\"content\":\" \"},{\"type\":\"ByteFallback\"},{\"type\":\"Fuse\"},"
    "{\"type\":\"Strip\",\"content\":\" \",\"start\":1,\"stop\":0}]}";

static json_t *model_json(const struct tokmeta *t, const struct strmap *map, int llama)
{
    json_t *vocab = json_object();
    for (int64_t i = 0; vocab && i < t->n_tokens; i++)
        if (strmap_get(map, t->tokens[i]) == i) /* first of duplicate texts */
            json_object_set_new(vocab, t->tokens[i], json_integer(i));
    json_t *merges;
    if (llama && t->n_merges == 0) {
        merges = sp_merges_json(t, map);
    } else {
        merges = json_array();
        for (int64_t i = 0; merges && i < t->n_merges; i++)
            json_array_append_new(merges, json_string(t->merges[i]));
    }
    json_t *unk = llama && t->unk >= 0 ? json_string(t->tokens[t->unk]) : json_null();
    return json_pack("{s:s,s:n,s:o,s:n,s:n,s:b,s:b,s:b,s:o,s:o}", "type", "BPE", "dropout",
                     "unk_token", unk, "continuing_subword_prefix", "end_of_word_suffix",
                     "fuse_unk", llama, "byte_fallback", llama, "ignore_merges",
                     !strcmp(t->pre, "llama-bpe"), "vocab", vocab, "merges", merges);
}

static json_t *tokenizer_json(const struct tokmeta *t, const struct strmap *map)
{
    int llama = !strcmp(t->model, "llama");
    const char *norm = llama_normalizer, *pre = "null", *dec = llama_decoder;
    if (!llama) {
        const struct pre_family *pf = pre_family_find(t->pre);
        if (!pf) {
            log_warn("tokenizer.ggml.pre '%s' is not one weld knows; writing the llama-bpe "
                     "pre-tokenizer", t->pre);
            pf = &pre_families[0];
        }
        norm = pf->normalizer;
        pre = pf->pre_tokenizer;
        dec = pf->decoder;
    }
    json_t *jn = json_loads(norm, JSON_DECODE_ANY, NULL);
    json_t *jp = json_loads(pre, JSON_DECODE_ANY, NULL);
    json_t *jd = json_loads(dec, JSON_DECODE_ANY, NULL);
    return json_pack("{s:s,s:n,s:n,s:o,s:o,s:o,s:o,s:o,s:o}", "version", "1.0", "truncation",
                     "padding", "added_tokens", added_tokens_json(t), "normalizer", jn,
                     "pre_tokenizer", jp, "post_processor", post_processor_json(t, llama),
                     "decoder", jd, "model", model_json(t, map, llama));
}

static json_t *token_or_null(const struct tokmeta *t, int64_t id)
{
    return id >= 0 ? json_string(t->tokens[id]) : json_null();
}

static json_t *tokenizer_config_json(const struct tokmeta *t)
{
    int llama = !strcmp(t->model, "llama");
    json_t *c = json_pack("{s:b,s:b,s:o,s:o,s:o,s:o,s:b,s:I,s:s}", "add_bos_token",
                          tokmeta_effective_add_bos(t), "add_eos_token", t->add_eos > 0,
                          "bos_token", token_or_null(t, t->bos), "eos_token",
                          token_or_null(t, t->eos), "unk_token", token_or_null(t, t->unk),
                          "pad_token", token_or_null(t, t->pad), "clean_up_tokenization_spaces",
                          0, "model_max_length", (json_int_t)1000000000, "tokenizer_class",
                          llama ? "LlamaTokenizerFast" : "PreTrainedTokenizerFast");
    if (c && llama) {
        json_object_set_new(c, "legacy", json_true());
        if (t->add_space_prefix >= 0)
            json_object_set_new(c, "add_prefix_space", json_boolean(t->add_space_prefix));
    }
    if (c && t->chat_template)
        json_object_set_new(c, "chat_template", json_string(t->chat_template));
    return c;
}

int tokmeta_to_hf(const struct tokmeta *t, const char *dir, struct weld_err *e)
{
    struct strmap map = {0};
    json_t *tok = NULL, *cfg = NULL;
    char path[4096];
    int rc;
    if (strmap_init(&map, (uint64_t)t->n_tokens)) {
        rc = err_set(e, WELD_ERR_NOMEM, "out of memory");
        goto out;
    }
    for (int64_t i = 0; i < t->n_tokens; i++)
        strmap_put(&map, t->tokens[i], i);
    tok = tokenizer_json(t, &map);
    cfg = tokenizer_config_json(t);
    if (!tok || !cfg) {
        rc = err_set(e, WELD_ERR_NOMEM, "%s: building tokenizer.json failed (out of memory or "
                     "a token that is not valid UTF-8)", dir);
        goto out;
    }
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    if ((rc = jsave_file(tok, path, e)))
        goto out;
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    rc = jsave_file(cfg, path, e);
out:
    json_decref(tok);
    json_decref(cfg);
    strmap_free(&map);
    return rc;
}

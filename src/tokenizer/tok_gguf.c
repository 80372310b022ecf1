/*
 * tok_gguf - build a struct tokenizer from GGUF tokenizer.* metadata (llama.cpp's keys).
 *
 * tokenizer.ggml.model:
 *   "llama": SentencePiece BPE by score (llama.cpp llm_tokenizer_spm). Pipeline: Prepend
 *            U+2581 (when tokenizer.ggml.add_space_prefix, default true) and Replace ' ' ->
 *            U+2581; no pre-tokenizer; decoders Replace U+2581 -> ' ', ByteFallback, Fuse,
 *            Strip one leading space (the tokenizer.json Llama 2 uses, which llama.cpp's
 *            detokenizer matches).
 *   "gpt2":  byte-level BPE with tokenizer.ggml.merges ("a b"). tokenizer.ggml.pre picks
 *            the pre-tokenizer exactly as the corresponding tokenizer.json spells it, so a
 *            GGUF converted from a tokenizer.json tokenizes identically:
 *              "llama-bpe"/"llama3"  Llama 3 regex split, ByteLevel, ignore_merges
 *              "qwen2"               NFC, Qwen2 regex split, ByteLevel
 *              "deepseek-v3"         three splits (digits, CJK runs, main), ByteLevel
 *              "default"/"gpt2"/none ByteLevel with the GPT-2 regex
 *            Other names are WELD_ERR_UNSUPPORTED (guessing would silently change ids).
 * tokenizer.ggml.add_bos_token / add_eos_token say whether encoding adds BOS / EOS; when
 * absent, llama.cpp's defaults apply: BOS for "llama" and for the Llama 3 pre-tokenizer
 * ("llama-bpe"/"llama3", whose pre-type llama.cpp marks add_bos), no EOS.
 * Token types (tokenizer.ggml.token_type): 2 unknown and 3 control become special added
 * tokens (matched in text only with parse_special); 4 user-defined become non-special added
 * tokens (always matched), as llama.cpp does. Special ids (bos/eos/unk/pad/eot/eom) must be
 * inside the vocabulary.
 */
#include "tokenizer/tok_internal.h"

#include "core/alloc.h"
#include "format/gguf.h"

#include <string.h>

#define TOK_MAX_ID (1 << 24)

struct gg {
    struct tokenizer *t;
    const struct gguf_file *f;
    const char *where;
    struct weld_err *e;
};

static int gg_nomem(struct gg *g)
{
    return err_set(g->e, WELD_ERR_NOMEM, "%s: out of memory", g->where);
}

/* Optional array key of element type elem with exactly n elements; *kv NULL if absent. */
static int opt_arr(struct gg *g, const char *key, enum gguf_type elem, uint64_t n,
                   const struct gguf_kv **kv)
{
    *kv = NULL;
    int rc = gguf_get_arr(g->f, key, elem, kv, g->e);
    if (rc == WELD_ERR_NOT_FOUND) {
        *kv = NULL;
        return WELD_OK;
    }
    if (rc)
        return rc;
    if ((*kv)->arr_n != n)
        return err_set(g->e, WELD_ERR_FORMAT, "%s: key '%s': %llu elements, but there are "
                       "%llu tokens", g->where, key, (unsigned long long)(*kv)->arr_n,
                       (unsigned long long)n);
    return WELD_OK;
}

static int opt_id(struct gg *g, const char *key, int32_t *out)
{
    int64_t v;
    int rc = gguf_get_i64(g->f, key, &v, g->e);
    if (rc == WELD_ERR_NOT_FOUND)
        return WELD_OK;
    if (rc)
        return rc;
    if (v == -1 || v == UINT32_MAX) /* llama.cpp's LLAMA_TOKEN_NULL, as i32 or u32 */
        return WELD_OK;
    if (v < 0 || v >= g->t->n_vocab)
        return err_set(g->e, WELD_ERR_FORMAT, "%s: key '%s': token id %lld is outside the "
                       "vocabulary (%d tokens)", g->where, key, (long long)v, g->t->n_vocab);
    *out = (int32_t)v;
    return WELD_OK;
}

static int opt_flag(struct gg *g, const char *key, bool *out)
{
    int rc = gguf_get_bool(g->f, key, out, g->e);
    return rc == WELD_ERR_NOT_FOUND ? WELD_OK : rc;
}

static int load_tokens(struct gg *g)
{
    struct tokenizer *t = g->t;
    const struct gguf_kv *tok, *types, *scores;
    int rc = gguf_get_arr(g->f, "tokenizer.ggml.tokens", GGUF_TYPE_STRING, &tok, g->e);
    if (rc == WELD_ERR_NOT_FOUND)
        return err_set(g->e, WELD_ERR_FORMAT, "%s: key 'tokenizer.ggml.tokens' is missing",
                       g->where);
    if (rc)
        return rc;
    uint64_t n = tok->arr_n;
    if (n == 0 || n >= TOK_MAX_ID)
        return err_set(g->e, WELD_ERR_FORMAT, "%s: key 'tokenizer.ggml.tokens': %llu tokens "
                       "(must be 1..%d)", g->where, (unsigned long long)n, TOK_MAX_ID - 1);
    if ((rc = opt_arr(g, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, n, &types)) ||
        (rc = opt_arr(g, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, n, &scores)))
        return rc;
    if (tok_alloc_vocab(t, (int32_t)n) || !(t->scores = wcalloc(n, sizeof *t->scores)))
        return gg_nomem(g);
    for (uint64_t i = 0; i < n; i++) {
        const struct gguf_str *s = &tok->arr_str[i];
        int32_t id = (int32_t)i;
        if (tok_set_token(t, id, s->ptr, s->len) || tok_map_put(t, id))
            return gg_nomem(g);
        t->scores[i] = scores ? (float)gguf_arr_f64(scores, i) : 0.0f;
        int64_t ty = types ? gguf_arr_i64(types, i) : 1;
        if ((ty == 2 || ty == 3 || ty == 4) && s->len > 0) {
            struct tok_added a = {.text = (char *)s->ptr, .len = s->len, .id = id,
                                  .special = ty != 4};
            if (tok_add_added(t, &a))
                return gg_nomem(g);
        }
    }
    return WELD_OK;
}

static int load_merges_gguf(struct gg *g)
{
    struct tokenizer *t = g->t;
    const struct gguf_kv *m;
    int rc = gguf_get_arr(g->f, "tokenizer.ggml.merges", GGUF_TYPE_STRING, &m, g->e);
    if (rc == WELD_ERR_NOT_FOUND)
        return err_set(g->e, WELD_ERR_FORMAT, "%s: key 'tokenizer.ggml.merges' is missing "
                       "(needed by model 'gpt2')", g->where);
    if (rc)
        return rc;
    if (m->arr_n > TOK_MAX_ID)
        return err_set(g->e, WELD_ERR_FORMAT, "%s: key 'tokenizer.ggml.merges': too many",
                       g->where);
    t->merge_cap = 16;
    while (t->merge_cap < 2 * m->arr_n + 16)
        t->merge_cap *= 2;
    if (!(t->merges = wcalloc(t->merge_cap, sizeof *t->merges)))
        return gg_nomem(g);
    for (uint64_t i = 0; i < m->arr_n; i++) {
        const char *s = m->arr_str[i].ptr;
        size_t n = m->arr_str[i].len;
        const char *sp = memchr(s, ' ', n);
        int32_t a = sp ? tok_map_get(t, s, (size_t)(sp - s)) : -1;
        int32_t b = sp ? tok_map_get(t, sp + 1, n - (size_t)(sp - s) - 1) : -1;
        char *cat = wmalloc(n + 1);
        if (!cat)
            return gg_nomem(g);
        int32_t c = -1;
        if (sp) {
            memcpy(cat, s, (size_t)(sp - s));
            memcpy(cat + (sp - s), sp + 1, n - (size_t)(sp - s) - 1);
            c = tok_map_get(t, cat, n - 1);
        }
        wfree(cat);
        if (a < 0 || b < 0 || c < 0)
            return err_set(g->e, WELD_ERR_FORMAT, "%s: key 'tokenizer.ggml.merges[%llu]': "
                           "'%.*s' is not two vocabulary tokens whose concatenation is one",
                           g->where, (unsigned long long)i, (int)(n > 200 ? 200 : n), s);
        tok_merge_put(t, a, b, (uint32_t)i, c);
    }
    return WELD_OK;
}

static int add_pre(struct gg *g, enum tok_pre_kind kind, const char *re)
{
    struct tokenizer *t = g->t;
    struct tok_pre *p = &t->pres[t->n_pres];
    memset(p, 0, sizeof *p);
    p->kind = kind;
    p->behavior = TOK_SPLIT_ISOLATED;
    if (re) {
        char msg[300];
        if (!(p->re = tok_regex_compile(re, strlen(re), false, msg, sizeof msg)))
            return err_set(g->e, WELD_ERR_INTERNAL, "%s: built-in regex: %s", g->where, msg);
    }
    t->n_pres++;
    return WELD_OK;
}

static int setup_gpt2(struct gg *g, const char *pre)
{
    struct tokenizer *t = g->t;
    int rc = load_merges_gguf(g);
    if (rc)
        return rc;
    t->model = TOK_MODEL_BPE;
    if (!strcmp(pre, "llama-bpe") || !strcmp(pre, "llama3")) {
        t->ignore_merges = true;
        rc = add_pre(g, TOK_PRE_SPLIT, tok_re_llama3);
    } else if (!strcmp(pre, "qwen2")) {
        t->norms[t->n_norms++].kind = TOK_NORM_NFC;
        rc = add_pre(g, TOK_PRE_SPLIT, tok_re_qwen2);
    } else if (!strcmp(pre, "deepseek-v3")) {
        rc = add_pre(g, TOK_PRE_SPLIT, tok_re_dsv3_digits);
        if (rc == WELD_OK)
            rc = add_pre(g, TOK_PRE_SPLIT, tok_re_dsv3_cjk);
        if (rc == WELD_OK)
            rc = add_pre(g, TOK_PRE_SPLIT, tok_re_dsv3_main);
    } else if (!strcmp(pre, "default") || !strcmp(pre, "gpt2") || !*pre) {
        rc = add_pre(g, TOK_PRE_BYTELEVEL, tok_re_gpt2);
        if (rc == WELD_OK)
            t->decs[t->n_decs++].kind = TOK_DEC_BYTELEVEL;
        return rc;
    } else {
        return err_set(g->e, WELD_ERR_UNSUPPORTED, "%s: key 'tokenizer.ggml.pre': "
                       "pre-tokenizer '%s' is not supported (known: llama-bpe, qwen2, "
                       "deepseek-v3, default)", g->where, pre);
    }
    if (rc == WELD_OK)
        rc = add_pre(g, TOK_PRE_BYTELEVEL, NULL);
    if (rc == WELD_OK)
        t->decs[t->n_decs++].kind = TOK_DEC_BYTELEVEL;
    return rc;
}

static int setup_llama(struct gg *g, bool space_prefix)
{
    struct tokenizer *t = g->t;
    t->model = TOK_MODEL_SPM;
    struct tok_norm *n = &t->norms[0];
    if (space_prefix) {
        n->kind = TOK_NORM_PREPEND;
        n->alen = 3;
        if (!(n->a = wstrdup("\xE2\x96\x81")))
            return gg_nomem(g);
        n++;
    }
    n->kind = TOK_NORM_REPLACE;
    n->alen = 1;
    n->blen = 3;
    if (!(n->a = wstrdup(" ")) || !(n->b = wstrdup("\xE2\x96\x81")))
        return gg_nomem(g);
    t->n_norms = space_prefix ? 2 : 1;
    struct tok_dec *d = t->decs;
    d[0].kind = TOK_DEC_REPLACE;
    d[0].alen = 3;
    d[0].blen = 1;
    if (!(d[0].a = wstrdup("\xE2\x96\x81")) || !(d[0].b = wstrdup(" ")))
        return gg_nomem(g);
    d[1].kind = TOK_DEC_BYTEFALLBACK;
    d[2].kind = TOK_DEC_FUSE;
    d[3].kind = TOK_DEC_STRIP;
    d[3].strip_ch = ' ';
    d[3].start = 1;
    t->n_decs = space_prefix ? 4 : 3;
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        t->byte_id[b] = tok_map_get(t, name, 6);
    }
    t->byte_fallback = true;
    return WELD_OK;
}

static int set_post(struct gg *g, bool add_bos, bool add_eos)
{
    struct tokenizer *t = g->t;
    if (add_bos && t->bos >= 0) {
        if (!(t->post_pre = wmalloc(sizeof *t->post_pre)))
            return gg_nomem(g);
        t->post_pre[0] = t->bos;
        t->n_post_pre = 1;
    }
    if (add_eos && t->eos >= 0) {
        if (!(t->post_post = wmalloc(sizeof *t->post_post)))
            return gg_nomem(g);
        t->post_post[0] = t->eos;
        t->n_post_post = 1;
    }
    return WELD_OK;
}

static int load_all(struct gg *g)
{
    struct tokenizer *t = g->t;
    struct gguf_str model, pre = {"", 0}, tmpl;
    int rc = gguf_get_str(g->f, "tokenizer.ggml.model", &model, g->e);
    if (rc == WELD_ERR_NOT_FOUND)
        return err_set(g->e, WELD_ERR_FORMAT, "%s: key 'tokenizer.ggml.model' is missing",
                       g->where);
    if (rc)
        return rc;
    bool is_llama = model.len == 5 && !memcmp(model.ptr, "llama", 5);
    bool is_gpt2 = model.len == 4 && !memcmp(model.ptr, "gpt2", 4);
    if (!is_llama && !is_gpt2)
        return err_set(g->e, WELD_ERR_UNSUPPORTED, "%s: key 'tokenizer.ggml.model': '%.*s' is "
                       "not supported (only 'llama' and 'gpt2')", g->where,
                       (int)(model.len > 64 ? 64 : model.len), model.ptr);
    rc = gguf_get_str(g->f, "tokenizer.ggml.pre", &pre, g->e);
    if (rc && rc != WELD_ERR_NOT_FOUND)
        return rc;
    char pre_name[64];
    snprintf(pre_name, sizeof pre_name, "%.*s", (int)(pre.len > 63 ? 63 : pre.len), pre.ptr);
    bool add_bos = tokenizer_gguf_default_add_bos(is_llama ? "llama" : "gpt2", pre_name);
    bool add_eos = false, space_prefix = true;
    if ((rc = load_tokens(g)) || (rc = opt_id(g, "tokenizer.ggml.bos_token_id", &t->bos)) ||
        (rc = opt_id(g, "tokenizer.ggml.eos_token_id", &t->eos)) ||
        (rc = opt_id(g, "tokenizer.ggml.unknown_token_id", &t->unk)) ||
        (rc = opt_id(g, "tokenizer.ggml.padding_token_id", &t->pad)) ||
        (rc = opt_id(g, "tokenizer.ggml.eot_token_id", &t->eot)) ||
        (rc = opt_flag(g, "tokenizer.ggml.add_bos_token", &add_bos)) ||
        (rc = opt_flag(g, "tokenizer.ggml.add_eos_token", &add_eos)) ||
        (rc = opt_flag(g, "tokenizer.ggml.add_space_prefix", &space_prefix)))
        return rc;
    int32_t eom = -1;
    if ((rc = opt_id(g, "tokenizer.ggml.eom_token_id", &eom)))
        return rc;
    t->unk_id = t->unk;
    rc = is_llama ? setup_llama(g, space_prefix) : setup_gpt2(g, pre_name);
    if (rc == WELD_OK)
        rc = set_post(g, add_bos, add_eos);
    if (rc == WELD_OK)
        rc = tok_finish(t, g->where, g->e);
    if (rc)
        return rc;
    rc = gguf_get_str(g->f, "tokenizer.chat_template", &tmpl, g->e);
    if (rc == WELD_OK && !(t->chat_template = wstrndup(tmpl.ptr, tmpl.len)))
        return gg_nomem(g);
    if (rc && rc != WELD_ERR_NOT_FOUND)
        return rc;
    tok_mark_eog(t);
    if (eom >= 0)
        t->eog[eom] = 1;
    return WELD_OK;
}

bool tokenizer_gguf_default_add_bos(const char *model, const char *pre)
{
    if (!strcmp(model, "llama"))
        return true;
    return !strcmp(model, "gpt2") && (!strcmp(pre, "llama-bpe") || !strcmp(pre, "llama3"));
}

int tokenizer_load_gguf(struct tokenizer **out, const struct gguf_file *f, struct weld_err *e)
{
    *out = NULL;
    struct tokenizer *t = tok_new();
    if (!t)
        return err_set(e, WELD_ERR_NOMEM, "%s: out of memory", f->path ? f->path : "gguf");
    struct gg g = {t, f, f->path ? f->path : "gguf", e};
    int rc = load_all(&g);
    if (rc) {
        tokenizer_free(t);
        return rc;
    }
    *out = t;
    return WELD_OK;
}

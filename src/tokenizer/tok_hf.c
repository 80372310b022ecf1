/*
 * tok_hf - load a Hugging Face tokenizer.json (+ tokenizer_config.json and
 * generation_config.json beside it) into a struct tokenizer.
 *
 * Supported: model BPE (vocab object, merges as "a b" strings or [a, b] pairs, unk_token,
 * byte_fallback, fuse_unk, ignore_merges, continuing_subword_prefix, end_of_word_suffix);
 * added_tokens with all their flags; normalizers NFC/NFD/NFKC/NFKD, Prepend, Replace,
 * Lowercase, Strip, Sequence; pre-tokenizers Split, ByteLevel, Digits, Metaspace,
 * Whitespace, WhitespaceSplit, Sequence; post-processors TemplateProcessing (single
 * sequence), ByteLevel, Roberta/BertProcessing, Sequence; decoders ByteLevel, Metaspace,
 * Replace, ByteFallback, Fuse, Strip, Sequence. Anything else is WELD_ERR_UNSUPPORTED
 * naming the field and type; malformed input is WELD_ERR_FORMAT naming the file and field.
 * Not supported: WordPiece/Unigram/WordLevel models, pair templates (weld encodes single
 * sequences), BPE dropout (ignored: inference never samples merges).
 *
 * tokenizer_config.json: bos_token / eos_token (string or {content}), chat_template
 * (string, or a list of {name, template}: "default" or else the first), and, for the
 * Llama tokenizer classes whose transformers implementation rebuilds the post-processor,
 * add_bos_token / add_eos_token. generation_config.json: eos_token_id (int or list) marks
 * end-of-generation ids.
 */
#include "tokenizer/tok_internal.h"

#include "core/alloc.h"
#include "core/json.h"
#include "core/mfile.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#define TOK_MAX_ID (1 << 24)

struct hf {
    struct tokenizer *t;
    const char *where;
    struct weld_err *e;
};

static int fmt_err(struct hf *h, const char *field, const char *what)
{
    return err_set(h->e, WELD_ERR_FORMAT, "%s: field '%s': %s", h->where, field, what);
}

static int nomem(struct hf *h)
{
    return err_set(h->e, WELD_ERR_NOMEM, "%s: out of memory", h->where);
}

/* Optional string member: NULL when absent or null; error when of another type. */
static int opt_str(struct hf *h, const json_t *o, const char *key, const char *field,
                   const char **out)
{
    *out = NULL;
    const json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v))
        return WELD_OK;
    if (!json_is_string(v))
        return err_set(h->e, WELD_ERR_FORMAT, "%s: field '%s.%s' must be a string", h->where,
                       field, key);
    *out = json_string_value(v);
    return WELD_OK;
}

static bool opt_bool(const json_t *o, const char *key, bool dflt)
{
    const json_t *v = json_object_get(o, key);
    return json_is_boolean(v) ? json_is_true(v) : dflt;
}

/* ---- model ---- */

static int load_vocab(struct hf *h, const json_t *vocab)
{
    struct tokenizer *t = h->t;
    if (!json_is_object(vocab))
        return fmt_err(h, "model.vocab", "must be an object of token -> id");
    int64_t max_id = -1;
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)vocab, key, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 ||
            json_integer_value(v) >= TOK_MAX_ID)
            return err_set(h->e, WELD_ERR_FORMAT,
                           "%s: field 'model.vocab': token '%s' has id out of range "
                           "(must be an integer in [0, %d))", h->where, key, TOK_MAX_ID);
        if (json_integer_value(v) > max_id)
            max_id = json_integer_value(v);
    }
    if (max_id >= 0 && tok_alloc_vocab(t, (int32_t)max_id + 1))
        return nomem(h);
    json_object_foreach((json_t *)vocab, key, v) {
        int32_t id = (int32_t)json_integer_value(v);
        if (tok_set_token(t, id, key, strlen(key)) || tok_map_put(t, id))
            return nomem(h);
    }
    return WELD_OK;
}

static size_t pow2_at_least(size_t n)
{
    size_t c = 16;
    while (c < n)
        c *= 2;
    return c;
}

/* One merge: parts a and b; id of a, b and of their concatenation. */
static int add_merge(struct hf *h, size_t i, const char *a, size_t al, const char *b, size_t bl,
                     struct tok_buf *tmp)
{
    struct tokenizer *t = h->t;
    int32_t ia = tok_map_get(t, a, al), ib = tok_map_get(t, b, bl);
    size_t skip = 0;
    if (t->cont_prefix && *t->cont_prefix && bl >= strlen(t->cont_prefix) &&
        memcmp(b, t->cont_prefix, strlen(t->cont_prefix)) == 0)
        skip = strlen(t->cont_prefix);
    tmp->n = 0;
    if (tok_buf_put(tmp, a, al) || tok_buf_put(tmp, b + skip, bl - skip))
        return nomem(h);
    int32_t in = tok_map_get(t, tmp->p, tmp->n);
    const char *bad = ia < 0 ? "left part" : ib < 0 ? "right part" : in < 0 ? "merged token" : NULL;
    if (bad)
        return err_set(h->e, WELD_ERR_FORMAT,
                       "%s: field 'model.merges[%zu]': %s '%.*s' is not in model.vocab",
                       h->where, i, bad, (int)(ia < 0 ? al : ib < 0 ? bl : tmp->n),
                       ia < 0 ? a : ib < 0 ? b : tmp->p);
    return tok_merge_put(t, ia, ib, (uint32_t)i, in);
}

static int load_merges(struct hf *h, const json_t *merges)
{
    struct tokenizer *t = h->t;
    if (!merges || json_is_null(merges))
        return WELD_OK;
    if (!json_is_array(merges))
        return fmt_err(h, "model.merges", "must be a list");
    size_t n = json_array_size(merges);
    t->merge_cap = pow2_at_least(2 * n + 16);
    t->merges = wcalloc(t->merge_cap, sizeof *t->merges);
    if (!t->merges)
        return nomem(h);
    struct tok_buf tmp = {0};
    int rc = WELD_OK;
    for (size_t i = 0; rc == WELD_OK && i < n; i++) {
        const json_t *m = json_array_get(merges, i);
        if (json_is_string(m)) {
            const char *s = json_string_value(m), *sp = strchr(s, ' ');
            if (!sp || strchr(sp + 1, ' ')) {
                rc = err_set(h->e, WELD_ERR_FORMAT,
                             "%s: field 'model.merges[%zu]': '%s' is not two tokens separated "
                             "by one space", h->where, i, s);
                break;
            }
            rc = add_merge(h, i, s, (size_t)(sp - s), sp + 1, strlen(sp + 1), &tmp);
        } else if (json_is_array(m) && json_array_size(m) == 2 &&
                   json_is_string(json_array_get(m, 0)) && json_is_string(json_array_get(m, 1))) {
            const json_t *a = json_array_get(m, 0), *b = json_array_get(m, 1);
            rc = add_merge(h, i, json_string_value(a), json_string_length(a),
                           json_string_value(b), json_string_length(b), &tmp);
        } else {
            rc = err_set(h->e, WELD_ERR_FORMAT,
                         "%s: field 'model.merges[%zu]': must be \"a b\" or [\"a\", \"b\"]",
                         h->where, i);
        }
    }
    wfree(tmp.p);
    return rc;
}

static int load_model(struct hf *h, const json_t *model)
{
    struct tokenizer *t = h->t;
    if (!json_is_object(model))
        return fmt_err(h, "model", "missing or not an object");
    const char *type, *unk, *cp, *eow;
    if (opt_str(h, model, "type", "model", &type))
        return h->e ? h->e->status : WELD_ERR_FORMAT;
    if (type && strcmp(type, "BPE") != 0)
        return err_set(h->e, WELD_ERR_UNSUPPORTED,
                       "%s: field 'model.type': model type '%s' is not supported (only BPE)",
                       h->where, type);
    if (!type && !json_object_get(model, "merges"))
        return fmt_err(h, "model.type", "missing (and no merges to infer BPE from)");
    if (opt_str(h, model, "unk_token", "model", &unk) ||
        opt_str(h, model, "continuing_subword_prefix", "model", &cp) ||
        opt_str(h, model, "end_of_word_suffix", "model", &eow))
        return WELD_ERR_FORMAT;
    t->model = TOK_MODEL_BPE;
    t->byte_fallback = opt_bool(model, "byte_fallback", false);
    t->fuse_unk = opt_bool(model, "fuse_unk", false);
    t->ignore_merges = opt_bool(model, "ignore_merges", false);
    if ((cp && *cp && !(t->cont_prefix = wstrdup(cp))) ||
        (eow && *eow && !(t->eow_suffix = wstrdup(eow))))
        return nomem(h);
    int rc = load_vocab(h, json_object_get(model, "vocab"));
    if (rc == WELD_OK)
        rc = load_merges(h, json_object_get(model, "merges"));
    if (rc)
        return rc;
    if (unk)
        t->unk = t->unk_id = tok_map_get(t, unk, strlen(unk));
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        t->byte_id[b] = tok_map_get(t, name, 6);
    }
    return WELD_OK;
}

/* ---- added tokens ---- */

static int load_added(struct hf *h, const json_t *arr)
{
    if (!arr || json_is_null(arr))
        return WELD_OK;
    if (!json_is_array(arr))
        return fmt_err(h, "added_tokens", "must be a list");
    for (size_t i = 0; i < json_array_size(arr); i++) {
        const json_t *o = json_array_get(arr, i);
        const json_t *id = json_object_get(o, "id"), *c = json_object_get(o, "content");
        if (!json_is_integer(id) || json_integer_value(id) < 0 ||
            json_integer_value(id) >= TOK_MAX_ID || !json_is_string(c) ||
            json_string_length(c) == 0)
            return err_set(h->e, WELD_ERR_FORMAT,
                           "%s: field 'added_tokens[%zu]': needs an integer 'id' in [0, %d) "
                           "and a non-empty string 'content'", h->where, i, TOK_MAX_ID);
        struct tok_added a = {
            .text = (char *)json_string_value(c), .len = json_string_length(c),
            .id = (int32_t)json_integer_value(id), .special = opt_bool(o, "special", false),
            .lstrip = opt_bool(o, "lstrip", false), .rstrip = opt_bool(o, "rstrip", false),
            .single_word = opt_bool(o, "single_word", false),
            .normalized = opt_bool(o, "normalized", !opt_bool(o, "special", false)),
        };
        if (tok_add_added(h->t, &a))
            return nomem(h);
    }
    return WELD_OK;
}

/* ---- normalizer, pre-tokenizer, post-processor, decoder ---- */

/* pattern {String: s} or {Regex: r}: *s / *is_regex. */
static int get_pattern(struct hf *h, const json_t *o, const char *field, const char **s,
                       size_t *len, bool *is_regex)
{
    const json_t *p = json_object_get(o, "pattern");
    const json_t *str = json_object_get(p, "String"), *re = json_object_get(p, "Regex");
    if (json_is_string(str) || json_is_string(re)) {
        *is_regex = json_is_string(re);
        *s = json_string_value(*is_regex ? re : str);
        *len = json_string_length(*is_regex ? re : str);
        return WELD_OK;
    }
    return err_set(h->e, WELD_ERR_FORMAT,
                   "%s: field '%s.pattern': must be {\"String\": ...} or {\"Regex\": ...}",
                   h->where, field);
}

static int compile(struct hf *h, const char *field, const char *s, size_t len, bool literal,
                   pcre2_code **out)
{
    char msg[300];
    *out = tok_regex_compile(s, len, literal, msg, sizeof msg);
    if (!*out)
        return err_set(h->e, WELD_ERR_FORMAT, "%s: field '%s.pattern': %s", h->where, field,
                       msg);
    return WELD_OK;
}

static int too_many(struct hf *h, const char *field)
{
    return err_set(h->e, WELD_ERR_LIMIT, "%s: field '%s': more than %d stages", h->where,
                   field, TOK_MAX_STAGES);
}

static int unsupported(struct hf *h, const char *field, const char *type)
{
    return err_set(h->e, WELD_ERR_UNSUPPORTED, "%s: field '%s': type '%s' is not supported",
                   h->where, field, type ? type : "(missing)");
}

static int load_normalizer(struct hf *h, const json_t *n)
{
    struct tokenizer *t = h->t;
    if (!n || json_is_null(n))
        return WELD_OK;
    const char *type = json_string_value(json_object_get(n, "type"));
    if (type && strcmp(type, "Sequence") == 0) {
        const json_t *arr = json_object_get(n, "normalizers");
        if (!json_is_array(arr))
            return fmt_err(h, "normalizer.normalizers", "must be a list");
        for (size_t i = 0; i < json_array_size(arr); i++) {
            int rc = load_normalizer(h, json_array_get(arr, i));
            if (rc)
                return rc;
        }
        return WELD_OK;
    }
    if (t->n_norms == TOK_MAX_STAGES)
        return too_many(h, "normalizer");
    struct tok_norm *nm = &t->norms[t->n_norms];
    memset(nm, 0, sizeof *nm);
    if (!type)
        return unsupported(h, "normalizer.type", type);
    if (!strcmp(type, "NFC") || !strcmp(type, "NFD") || !strcmp(type, "NFKC") ||
        !strcmp(type, "NFKD")) {
        nm->kind = !strcmp(type, "NFC") ? TOK_NORM_NFC : !strcmp(type, "NFD") ? TOK_NORM_NFD
                 : !strcmp(type, "NFKC") ? TOK_NORM_NFKC : TOK_NORM_NFKD;
    } else if (!strcmp(type, "Prepend")) {
        const json_t *p = json_object_get(n, "prepend");
        if (!json_is_string(p))
            return fmt_err(h, "normalizer.prepend", "must be a string");
        nm->kind = TOK_NORM_PREPEND;
        nm->alen = json_string_length(p);
        if (!(nm->a = tok_memdup(json_string_value(p), nm->alen)))
            return nomem(h);
    } else if (!strcmp(type, "Replace")) {
        const char *pat;
        size_t pl;
        bool is_re;
        const json_t *c = json_object_get(n, "content");
        if (get_pattern(h, n, "normalizer", &pat, &pl, &is_re))
            return WELD_ERR_FORMAT;
        if (!json_is_string(c))
            return fmt_err(h, "normalizer.content", "must be a string");
        nm->kind = TOK_NORM_REPLACE;
        nm->blen = json_string_length(c);
        if (!(nm->b = tok_memdup(json_string_value(c), nm->blen)))
            return nomem(h);
        if (is_re && compile(h, "normalizer", pat, pl, false, &nm->re))
            return WELD_ERR_FORMAT;
        nm->alen = pl;
        if (!is_re && !(nm->a = tok_memdup(pat, pl)))
            return nomem(h);
    } else if (!strcmp(type, "Lowercase")) {
        nm->kind = TOK_NORM_LOWERCASE;
    } else if (!strcmp(type, "Strip")) {
        nm->kind = TOK_NORM_STRIP;
        nm->left = opt_bool(n, "strip_left", true);
        nm->right = opt_bool(n, "strip_right", true);
    } else {
        return unsupported(h, "normalizer.type", type);
    }
    t->n_norms++;
    return WELD_OK;
}

static int parse_behavior(struct hf *h, const json_t *o, enum tok_split_behavior *b)
{
    const char *s = json_string_value(json_object_get(o, "behavior"));
    static const char *const names[] = {"Removed", "Isolated", "MergedWithPrevious",
                                        "MergedWithNext", "Contiguous"};
    for (int i = 0; s && i < 5; i++)
        if (!strcmp(s, names[i])) {
            *b = (enum tok_split_behavior)i;
            return WELD_OK;
        }
    return err_set(h->e, WELD_ERR_FORMAT, "%s: field 'pre_tokenizer.behavior': '%s' is not one "
                   "of Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous",
                   h->where, s ? s : "(missing)");
}

static enum tok_prepend parse_prepend(const json_t *o)
{
    const char *s = json_string_value(json_object_get(o, "prepend_scheme"));
    if (s)
        return !strcmp(s, "first") ? TOK_PREPEND_FIRST
             : !strcmp(s, "never") ? TOK_PREPEND_NEVER : TOK_PREPEND_ALWAYS;
    return opt_bool(o, "add_prefix_space", true) ? TOK_PREPEND_ALWAYS : TOK_PREPEND_NEVER;
}

static int parse_replacement(struct hf *h, const json_t *o, const char *field, char *out,
                             size_t *len)
{
    const json_t *r = json_object_get(o, "replacement");
    const char *s = json_is_string(r) ? json_string_value(r) : "\xE2\x96\x81";
    uint32_t cp;
    size_t n = strlen(s);
    if (n == 0 || n > 4 || tok_utf8_next(s, n, 0, &cp) != (int)n)
        return fmt_err(h, field, "replacement must be one character");
    memcpy(out, s, n);
    *len = n;
    return WELD_OK;
}

static int load_pretok(struct hf *h, const json_t *p)
{
    struct tokenizer *t = h->t;
    if (!p || json_is_null(p))
        return WELD_OK;
    const char *type = json_string_value(json_object_get(p, "type"));
    if (type && !strcmp(type, "Sequence")) {
        const json_t *arr = json_object_get(p, "pretokenizers");
        if (!json_is_array(arr))
            return fmt_err(h, "pre_tokenizer.pretokenizers", "must be a list");
        for (size_t i = 0; i < json_array_size(arr); i++) {
            int rc = load_pretok(h, json_array_get(arr, i));
            if (rc)
                return rc;
        }
        return WELD_OK;
    }
    if (t->n_pres == TOK_MAX_STAGES)
        return too_many(h, "pre_tokenizer");
    struct tok_pre *pt = &t->pres[t->n_pres];
    memset(pt, 0, sizeof *pt);
    if (!type)
        return unsupported(h, "pre_tokenizer.type", type);
    if (!strcmp(type, "Split")) {
        const char *pat;
        size_t pl;
        bool is_re;
        if (get_pattern(h, p, "pre_tokenizer", &pat, &pl, &is_re) ||
            parse_behavior(h, p, &pt->behavior) ||
            compile(h, "pre_tokenizer", pat, pl, !is_re, &pt->re))
            return h->e ? h->e->status : WELD_ERR_FORMAT;
        pt->kind = TOK_PRE_SPLIT;
        pt->invert = opt_bool(p, "invert", false);
    } else if (!strcmp(type, "ByteLevel")) {
        pt->kind = TOK_PRE_BYTELEVEL;
        pt->add_prefix_space = opt_bool(p, "add_prefix_space", true);
        if (opt_bool(p, "use_regex", true) &&
            compile(h, "pre_tokenizer", tok_re_gpt2, strlen(tok_re_gpt2), false, &pt->re))
            return WELD_ERR_FORMAT;
    } else if (!strcmp(type, "Digits")) {
        pt->kind = TOK_PRE_DIGITS;
        pt->individual = opt_bool(p, "individual_digits", false);
    } else if (!strcmp(type, "Metaspace")) {
        pt->kind = TOK_PRE_METASPACE;
        pt->prepend = parse_prepend(p);
        pt->split = opt_bool(p, "split", true);
        if (parse_replacement(h, p, "pre_tokenizer.replacement", pt->repl, &pt->repl_len))
            return WELD_ERR_FORMAT;
    } else if (!strcmp(type, "Whitespace") || !strcmp(type, "WhitespaceSplit")) {
        bool ws = !strcmp(type, "Whitespace");
        const char *re = ws ? "\\w+|[^\\w\\s]+" : "\\s+";
        pt->kind = TOK_PRE_SPLIT;
        pt->behavior = TOK_SPLIT_REMOVED;
        pt->invert = ws;
        if (compile(h, "pre_tokenizer", re, strlen(re), false, &pt->re))
            return WELD_ERR_FORMAT;
    } else {
        return unsupported(h, "pre_tokenizer.type", type);
    }
    t->n_pres++;
    return WELD_OK;
}

static int push_ids(struct hf *h, int32_t **arr, int *n, const json_t *ids, const char *field)
{
    for (size_t i = 0; i < json_array_size(ids); i++) {
        const json_t *v = json_array_get(ids, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 ||
            json_integer_value(v) >= TOK_MAX_ID)
            return fmt_err(h, field, "token ids must be integers in range");
        int32_t *a = wrealloc(*arr, (size_t)(*n + 1) * sizeof *a);
        if (!a)
            return nomem(h);
        a[(*n)++] = (int32_t)json_integer_value(v);
        *arr = a;
    }
    return WELD_OK;
}

static int load_template(struct hf *h, const json_t *p)
{
    struct tokenizer *t = h->t;
    const json_t *single = json_object_get(p, "single"), *sp = json_object_get(p, "special_tokens");
    if (!json_is_array(single))
        return fmt_err(h, "post_processor.single", "must be a list");
    bool after = false;
    for (size_t i = 0; i < json_array_size(single); i++) {
        const json_t *it = json_array_get(single, i);
        if (json_object_get(it, "Sequence")) {
            after = true;
            continue;
        }
        const char *name = json_string_value(json_object_get(json_object_get(it, "SpecialToken"), "id"));
        const json_t *ids = json_object_get(json_object_get(sp, name ? name : ""), "ids");
        if (!name || !json_is_array(ids))
            return err_set(h->e, WELD_ERR_FORMAT,
                           "%s: field 'post_processor.single[%zu]': special token '%s' is not "
                           "in post_processor.special_tokens", h->where, i, name ? name : "?");
        int rc = after ? push_ids(h, &t->post_post, &t->n_post_post, ids, "post_processor")
                       : push_ids(h, &t->post_pre, &t->n_post_pre, ids, "post_processor");
        if (rc)
            return rc;
    }
    return WELD_OK;
}

static int load_post(struct hf *h, const json_t *p)
{
    struct tokenizer *t = h->t;
    if (!p || json_is_null(p))
        return WELD_OK;
    const char *type = json_string_value(json_object_get(p, "type"));
    if (!type)
        return unsupported(h, "post_processor.type", type);
    if (!strcmp(type, "Sequence")) {
        const json_t *arr = json_object_get(p, "processors");
        for (size_t i = 0; i < json_array_size(arr); i++) {
            int rc = load_post(h, json_array_get(arr, i));
            if (rc)
                return rc;
        }
        return WELD_OK;
    }
    if (!strcmp(type, "ByteLevel"))
        return WELD_OK;
    if (!strcmp(type, "TemplateProcessing"))
        return load_template(h, p);
    if (!strcmp(type, "RobertaProcessing") || !strcmp(type, "BertProcessing")) {
        const json_t *cls = json_array_get(json_object_get(p, "cls"), 1);
        const json_t *sep = json_array_get(json_object_get(p, "sep"), 1);
        json_t *a = json_array(), *b = json_array();
        int rc = (!a || !b) ? nomem(h) : WELD_OK;
        if (rc == WELD_OK && (!json_is_integer(cls) || !json_is_integer(sep)))
            rc = fmt_err(h, "post_processor.cls", "cls and sep must be [text, id]");
        if (rc == WELD_OK && (json_array_append(a, (json_t *)cls) || json_array_append(b, (json_t *)sep)))
            rc = nomem(h);
        if (rc == WELD_OK)
            rc = push_ids(h, &t->post_pre, &t->n_post_pre, a, "post_processor.cls");
        if (rc == WELD_OK)
            rc = push_ids(h, &t->post_post, &t->n_post_post, b, "post_processor.sep");
        json_decref(a);
        json_decref(b);
        return rc;
    }
    return unsupported(h, "post_processor.type", type);
}

static int load_decoder(struct hf *h, const json_t *d)
{
    struct tokenizer *t = h->t;
    if (!d || json_is_null(d))
        return WELD_OK;
    const char *type = json_string_value(json_object_get(d, "type"));
    if (type && !strcmp(type, "Sequence")) {
        const json_t *arr = json_object_get(d, "decoders");
        if (!json_is_array(arr))
            return fmt_err(h, "decoder.decoders", "must be a list");
        for (size_t i = 0; i < json_array_size(arr); i++) {
            int rc = load_decoder(h, json_array_get(arr, i));
            if (rc)
                return rc;
        }
        return WELD_OK;
    }
    if (t->n_decs == TOK_MAX_STAGES)
        return too_many(h, "decoder");
    struct tok_dec *dc = &t->decs[t->n_decs];
    memset(dc, 0, sizeof *dc);
    if (!type)
        return unsupported(h, "decoder.type", type);
    if (!strcmp(type, "ByteLevel")) {
        dc->kind = TOK_DEC_BYTELEVEL;
    } else if (!strcmp(type, "ByteFallback")) {
        dc->kind = TOK_DEC_BYTEFALLBACK;
    } else if (!strcmp(type, "Fuse")) {
        dc->kind = TOK_DEC_FUSE;
    } else if (!strcmp(type, "Strip")) {
        const json_t *c = json_object_get(d, "content");
        uint32_t cp;
        if (!json_is_string(c) || json_string_length(c) == 0 ||
            tok_utf8_next(json_string_value(c), json_string_length(c), 0, &cp) !=
                (int)json_string_length(c))
            return fmt_err(h, "decoder.content", "must be one character");
        int64_t st = 0, sp = 0;
        if ((jget_int(d, "start", &st, h->where, h->e) == WELD_ERR_FORMAT) ||
            (jget_int(d, "stop", &sp, h->where, h->e) == WELD_ERR_FORMAT))
            return WELD_ERR_FORMAT;
        if (st < 0 || sp < 0 || st > 1000000 || sp > 1000000)
            return fmt_err(h, "decoder.start", "start/stop out of range");
        dc->kind = TOK_DEC_STRIP;
        dc->strip_ch = cp;
        dc->start = (int)st;
        dc->stop = (int)sp;
    } else if (!strcmp(type, "Replace")) {
        const char *pat;
        size_t pl;
        bool is_re;
        const json_t *c = json_object_get(d, "content");
        if (get_pattern(h, d, "decoder", &pat, &pl, &is_re))
            return WELD_ERR_FORMAT;
        if (is_re)
            return unsupported(h, "decoder.pattern", "Regex");
        if (!json_is_string(c))
            return fmt_err(h, "decoder.content", "must be a string");
        dc->kind = TOK_DEC_REPLACE;
        dc->alen = pl;
        dc->blen = json_string_length(c);
        if (!(dc->a = tok_memdup(pat, pl)) || !(dc->b = tok_memdup(json_string_value(c), dc->blen)))
            return nomem(h);
    } else if (!strcmp(type, "Metaspace")) {
        char r[8];
        size_t rl;
        if (parse_replacement(h, d, "decoder.replacement", r, &rl))
            return WELD_ERR_FORMAT;
        dc->kind = TOK_DEC_METASPACE;
        dc->prepend = parse_prepend(d);
        dc->alen = rl;
        if (!(dc->a = tok_memdup(r, rl)))
            return nomem(h);
    } else {
        return unsupported(h, "decoder.type", type);
    }
    t->n_decs++;
    return WELD_OK;
}

/* ---- whole files ---- */

static int check_ids(struct hf *h, const int32_t *ids, int n, const char *field)
{
    for (int i = 0; i < n; i++)
        if (ids[i] >= h->t->n_vocab || !h->t->vocab[ids[i]].s)
            return err_set(h->e, WELD_ERR_FORMAT, "%s: field '%s': token id %d is not in the "
                           "vocabulary (size %d)", h->where, field, ids[i], h->t->n_vocab);
    return WELD_OK;
}

static int load_root(struct hf *h, const json_t *root)
{
    struct tokenizer *t = h->t;
    if (!json_is_object(root))
        return fmt_err(h, "(top level)", "must be an object");
    int rc = load_model(h, json_object_get(root, "model"));
    if (rc == WELD_OK)
        rc = load_added(h, json_object_get(root, "added_tokens"));
    if (rc == WELD_OK)
        rc = load_normalizer(h, json_object_get(root, "normalizer"));
    if (rc == WELD_OK)
        rc = load_pretok(h, json_object_get(root, "pre_tokenizer"));
    if (rc == WELD_OK)
        rc = load_post(h, json_object_get(root, "post_processor"));
    if (rc == WELD_OK)
        rc = load_decoder(h, json_object_get(root, "decoder"));
    if (rc == WELD_OK)
        rc = tok_finish(t, h->where, h->e);
    if (rc == WELD_OK)
        rc = check_ids(h, t->post_pre, t->n_post_pre, "post_processor");
    if (rc == WELD_OK)
        rc = check_ids(h, t->post_post, t->n_post_post, "post_processor");
    if (rc)
        return rc;
    if (t->n_vocab == 0)
        return fmt_err(h, "model.vocab", "is empty");
    if (t->n_post_pre)
        t->bos = t->post_pre[0];
    if (t->n_post_post)
        t->eos = t->post_post[t->n_post_post - 1];
    tok_mark_eog(t);
    return WELD_OK;
}

int tokenizer_load_hf_json_buf(struct tokenizer **out, const char *buf, size_t len,
                               const char *where, struct weld_err *e)
{
    *out = NULL;
    json_t *root = jload_buf(buf, len, where, e);
    if (!root)
        return e ? e->status : WELD_ERR_FORMAT;
    struct tokenizer *t = tok_new();
    if (!t) {
        json_decref(root);
        return err_set(e, WELD_ERR_NOMEM, "%s: out of memory", where);
    }
    struct hf h = {t, where, e};
    int rc = load_root(&h, root);
    json_decref(root);
    if (rc) {
        tokenizer_free(t);
        return rc;
    }
    *out = t;
    return WELD_OK;
}

/* A token named by a config value: "text" or {"content": "text"}; -1 if unknown. */
static int32_t config_token(const struct tokenizer *t, const json_t *v)
{
    if (json_is_object(v))
        v = json_object_get(v, "content");
    if (!json_is_string(v))
        return -1;
    return tokenizer_token_id(t, json_string_value(v), json_string_length(v));
}

static int config_template(struct tokenizer *t, const json_t *ct, const char *where,
                           struct weld_err *e)
{
    const json_t *pick = NULL;
    if (json_is_string(ct)) {
        pick = ct;
    } else if (json_is_array(ct)) {
        for (size_t i = 0; i < json_array_size(ct); i++) {
            const json_t *it = json_array_get(ct, i);
            const char *name = json_string_value(json_object_get(it, "name"));
            if (!pick || (name && !strcmp(name, "default")))
                pick = json_object_get(it, "template");
        }
        if (!json_is_string(pick))
            return err_set(e, WELD_ERR_FORMAT, "%s: field 'chat_template': a list needs "
                           "{\"name\", \"template\"} objects", where);
    } else if (ct && !json_is_null(ct)) {
        return err_set(e, WELD_ERR_FORMAT, "%s: field 'chat_template': must be a string or a "
                       "list", where);
    }
    if (!pick)
        return WELD_OK;
    wfree(t->chat_template);
    t->chat_template = wstrndup(json_string_value(pick), json_string_length(pick));
    return t->chat_template ? WELD_OK : err_set(e, WELD_ERR_NOMEM, "%s: out of memory", where);
}

/* transformers' Llama tokenizers rebuild the post-processor from add_bos/add_eos_token. */
static int config_post(struct tokenizer *t, const json_t *root, const char *where,
                       struct weld_err *e)
{
    const char *cls = json_string_value(json_object_get(root, "tokenizer_class"));
    if (!cls || (strcmp(cls, "LlamaTokenizerFast") && strcmp(cls, "LlamaTokenizer") &&
                 strcmp(cls, "CodeLlamaTokenizerFast") && strcmp(cls, "CodeLlamaTokenizer")))
        return WELD_OK;
    bool add_bos = opt_bool(root, "add_bos_token", true);
    bool add_eos = opt_bool(root, "add_eos_token", false);
    t->n_post_pre = t->n_post_post = 0;
    if (add_bos && t->bos >= 0) {
        int32_t *p = wrealloc(t->post_pre, sizeof *p);
        if (!p)
            return err_set(e, WELD_ERR_NOMEM, "%s: out of memory", where);
        t->post_pre = p;
        p[t->n_post_pre++] = t->bos;
    }
    if (add_eos && t->eos >= 0) {
        int32_t *p = wrealloc(t->post_post, sizeof *p);
        if (!p)
            return err_set(e, WELD_ERR_NOMEM, "%s: out of memory", where);
        t->post_post = p;
        p[t->n_post_post++] = t->eos;
    }
    return WELD_OK;
}

/* Config files may hold integers beyond 64 bits (model_max_length = 1e30), which Jansson
   rejects unless integers are decoded as reals; ids are then read back from doubles. */
static json_t *load_config_json(const char *path, struct weld_err *e)
{
    char *buf = NULL;
    size_t len = 0;
    if (file_read_all(path, &buf, &len, e))
        return NULL;
    json_error_t je;
    json_t *v = json_loadb(buf, len, JSON_DECODE_INT_AS_REAL, &je);
    wfree(buf);
    if (!v)
        err_set(e, WELD_ERR_FORMAT, "%s:%d:%d: bad JSON: %s", path, je.line, je.column, je.text);
    return v;
}

static int load_config(struct tokenizer *t, const char *dir, struct weld_err *e)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    struct stat st;
    if (stat(path, &st) == 0) {
        json_t *root = load_config_json(path, e);
        if (!root)
            return e ? e->status : WELD_ERR_FORMAT;
        int32_t id;
        if ((id = config_token(t, json_object_get(root, "bos_token"))) >= 0)
            t->bos = id;
        if ((id = config_token(t, json_object_get(root, "eos_token"))) >= 0)
            t->eos = id;
        if ((id = config_token(t, json_object_get(root, "pad_token"))) >= 0)
            t->pad = id;
        int rc = config_template(t, json_object_get(root, "chat_template"), path, e);
        if (rc == WELD_OK)
            rc = config_post(t, root, path, e);
        json_decref(root);
        if (rc)
            return rc;
    }
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    if (stat(path, &st) == 0) {
        json_t *root = load_config_json(path, e);
        if (!root)
            return e ? e->status : WELD_ERR_FORMAT;
        const json_t *v = json_object_get(root, "eos_token_id");
        for (size_t i = 0; i < (json_is_array(v) ? json_array_size(v) : 1); i++) {
            const json_t *x = json_is_array(v) ? json_array_get(v, i) : v;
            double d = json_is_number(x) ? json_number_value(x) : -1;
            if (d >= 0 && d < t->n_vocab && d == (double)(int32_t)d)
                t->eog[(int32_t)d] = 1;
        }
        json_decref(root);
    }
    tok_mark_eog(t);
    return WELD_OK;
}

int tokenizer_load_hf(struct tokenizer **out, const char *path, struct weld_err *e)
{
    *out = NULL;
    char dir[4096], file[4200];
    struct stat st;
    if (stat(path, &st) != 0)
        return err_set(e, WELD_ERR_IO, "%s: no such file or directory", path);
    if (S_ISDIR(st.st_mode)) {
        snprintf(dir, sizeof dir, "%s", path);
        snprintf(file, sizeof file, "%s/tokenizer.json", path);
    } else {
        snprintf(file, sizeof file, "%s", path);
        snprintf(dir, sizeof dir, "%s", path);
        char *slash = strrchr(dir, '/');
        if (slash)
            *slash = 0;
        else
            snprintf(dir, sizeof dir, ".");
    }
    char *buf = NULL;
    size_t len = 0;
    int rc = file_read_all(file, &buf, &len, e);
    if (rc)
        return rc;
    struct tokenizer *t = NULL;
    rc = tokenizer_load_hf_json_buf(&t, buf, len, file, e);
    wfree(buf);
    if (rc == WELD_OK)
        rc = load_config(t, dir, e);
    if (rc) {
        tokenizer_free(t);
        return rc;
    }
    *out = t;
    return WELD_OK;
}

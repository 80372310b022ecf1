/*
 * tok_regex - PCRE2 compilation for pre-tokenizer patterns, with Unicode tables brought
 * up to date, and the built-in patterns.
 *
 * Hugging Face runs its patterns on Oniguruma with Unicode 16 tables; Debian's PCRE2
 * (10.42) knows Unicode 14. Characters assigned since then (new emoji such as U+1FAE8,
 * CJK extension I, Kawi, Egyptian hieroglyphs extension A ...) are \p{Cn} to PCRE2, so
 * `\p{S}`, `\p{L}` etc. would not match them and e.g. DeepSeek V3's ` ?[\p{P}\p{S}]+` would
 * split " 🫨" where HF keeps it whole. Before compiling, every `\p{L}`, `\p{M}`, `\p{N}`,
 * `\p{P}`, `\p{S}` in a pattern gets the code points PCRE2 thinks unassigned but newer
 * Unicode puts in that class appended as ranges (inside a character class) or is wrapped as
 * `[\p{X}ranges]` (outside one). The newer classes come from utf8proc (Unicode 15.0 in
 * Debian 12) plus a small table of Unicode 15.1/16.0 additions below. The per-class range
 * lists are computed once per process (under a mutex; retried later if memory ran out) by
 * asking PCRE2 which utf8proc-assigned code points it considers \p{Cn}.
 * Likewise `\s` / `\S`: PCRE2 counts U+180E (MONGOLIAN VOWEL SEPARATOR, a format character
 * since Unicode 6.3) as white space, Oniguruma follows the White_Space property; both are
 * spelled out as that property's explicit list (`\S` inside a class is left alone).
 * Not covered: category changes of already-assigned characters, `\P{..}`, `\pL` forms and
 * long property names (none of the supported tokenizers use them).
 *
 * Matching (tok_regex_match) runs under PCRE2's match limit, or WELD_REGEX_MATCH_LIMIT
 * when set (read once per process; tests lower it). An input that needs more backtracking
 * (millions of spaces under `\s*[\r\n]+`) fails with WELD_ERR_LIMIT and a message naming
 * the limit, which callers report as the client's error, not weld's.
 */
#include "tokenizer/tok_internal.h"

#include "core/alloc.h"
#include "core/utf8.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

const char tok_re_gpt2[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
const char tok_re_llama3[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const char tok_re_qwen2[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const char tok_re_dsv3_digits[] = "\\p{N}{1,3}";
const char tok_re_dsv3_cjk[] = "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+";
const char tok_re_dsv3_main[] =
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}"
    "\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+";

/* Unicode 15.1 / 16.0 additions utf8proc 2.8 does not know: (first, last, class). */
static const struct {
    uint32_t a, b;
    char cls;
} newer[] = {
    {0x2FFC, 0x2FFF, 'S'},   {0x31EF, 0x31EF, 'S'},   {0x2EBF0, 0x2EE5D, 'L'},
    {0x13460, 0x143FA, 'L'}, {0x1FA89, 0x1FA89, 'S'}, {0x1FA8F, 0x1FA8F, 'S'},
    {0x1FABE, 0x1FABE, 'S'}, {0x1FAC6, 0x1FAC6, 'S'}, {0x1FADC, 0x1FADC, 'S'},
    {0x1FADF, 0x1FADF, 'S'}, {0x1FAE9, 0x1FAE9, 'S'},
    /* 16.0: Symbols for Legacy Computing Supplement, Ol Onal, Todhri, Sunuwar, Myanmar
       Extended-C (the blocks whose categories are uniform or simply split) */
    {0x1CC00, 0x1CCEF, 'S'}, {0x1CCF0, 0x1CCF9, 'N'}, {0x1CD00, 0x1CEB3, 'S'},
    {0x1E5D0, 0x1E5ED, 'L'}, {0x1E5EE, 0x1E5EF, 'M'}, {0x1E5F0, 0x1E5F0, 'L'},
    {0x1E5F1, 0x1E5FA, 'N'}, {0x1E5FF, 0x1E5FF, 'P'}, {0x105C0, 0x105F3, 'L'},
    {0x11BC0, 0x11BE0, 'L'}, {0x11BE1, 0x11BE1, 'P'}, {0x11BF0, 0x11BF9, 'N'},
    {0x116D0, 0x116E3, 'N'},
};

static const char classes[] = "LMNPS";
/* White_Space (Unicode PropList), as class members. */
static const char white_space[] =
    "\\t\\n\\x{B}\\f\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}"
    "\\x{202F}\\x{205F}\\x{3000}";
static char *extra[5];         /* per class: "\x{a}-\x{b}..." or NULL; process lifetime */
static bool extra_done;
static pthread_mutex_t extra_lock = PTHREAD_MUTEX_INITIALIZER;

static char major_class(uint32_t cp)
{
    switch (utf8proc_category((utf8proc_int32_t)cp)) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO:
        return 'L';
    case UTF8PROC_CATEGORY_MN: case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME:
        return 'M';
    case UTF8PROC_CATEGORY_ND: case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_NO:
        return 'N';
    case UTF8PROC_CATEGORY_PC: case UTF8PROC_CATEGORY_PD: case UTF8PROC_CATEGORY_PS:
    case UTF8PROC_CATEGORY_PE: case UTF8PROC_CATEGORY_PI: case UTF8PROC_CATEGORY_PF:
    case UTF8PROC_CATEGORY_PO:
        return 'P';
    case UTF8PROC_CATEGORY_SM: case UTF8PROC_CATEGORY_SC: case UTF8PROC_CATEGORY_SK:
    case UTF8PROC_CATEGORY_SO:
        return 'S';
    default:
        return 0;
    }
}

static bool pcre_unassigned(const pcre2_code *cn, pcre2_match_data *md, uint32_t cp)
{
    char u[4];
    size_t n = utf8_put(cp, u);
    return pcre2_match(cn, (PCRE2_SPTR)u, n, 0, PCRE2_NO_UTF_CHECK, md, NULL) >= 0;
}

/* Append code point cp to the class's list, extending the last range when adjacent. */
static int add_cp(struct tok_buf *b, uint32_t *last, uint32_t cp)
{
    char tmp[48];
    if (*last && *last + 1 == cp && b->n) {
        b->n = (size_t)(strrchr(b->p, '-') - b->p); /* rewrite the range's end */
        snprintf(tmp, sizeof tmp, "-\\x{%X}", cp);
    } else {
        snprintf(tmp, sizeof tmp, "\\x{%X}-\\x{%X}", cp, cp);
    }
    *last = cp;
    return tok_buf_put(b, tmp, strlen(tmp));
}

/* Fill extra[]; returns false (and leaves extra[] empty) when memory ran out. */
static bool compute_extra(void)
{
    int ec;
    PCRE2_SIZE eo;
    pcre2_code *cn = pcre2_compile((PCRE2_SPTR) "^\\p{Cn}", PCRE2_ZERO_TERMINATED,
                                   PCRE2_UTF | PCRE2_UCP, &ec, &eo, NULL);
    pcre2_match_data *md = cn ? pcre2_match_data_create_from_pattern(cn, NULL) : NULL;
    if (!md) {
        pcre2_code_free(cn);
        return cn != NULL; /* no match data: out of memory, try again later */
    }
    pcre2_jit_compile(cn, PCRE2_JIT_COMPLETE);
    struct tok_buf b[5] = {{0}};
    uint32_t last[5] = {0};
    int rc = WELD_OK;
    for (uint32_t cp = 0x80; rc == WELD_OK && cp <= 0x10FFFF; cp++) {
        if (cp >= 0xD800 && cp <= 0xDFFF)
            continue;
        char c = major_class(cp);
        for (size_t k = 0; !c && k < sizeof newer / sizeof newer[0]; k++)
            if (cp >= newer[k].a && cp <= newer[k].b)
                c = newer[k].cls;
        if (!c || !pcre_unassigned(cn, md, cp))
            continue;
        int i = (int)(strchr(classes, c) - classes);
        rc = add_cp(&b[i], &last[i], cp);
    }
    for (int i = 0; i < 5; i++) {
        if (rc == WELD_OK)
            extra[i] = b[i].p;
        else
            wfree(b[i].p);
    }
    pcre2_match_data_free(md);
    pcre2_code_free(cn);
    return rc == WELD_OK;
}

/* Rewrite pat with the extra ranges; NULL on out of memory (then the original is used). */
static char *update_pattern(const char *pat, size_t len, size_t *out_len)
{
    pthread_mutex_lock(&extra_lock);
    if (!extra_done)
        extra_done = compute_extra();
    pthread_mutex_unlock(&extra_lock);
    struct tok_buf o = {0};
    bool in_class = false;
    for (size_t i = 0; i < len; i++) {
        char c = pat[i];
        if (c == '\\' && i + 1 < len) {
            const char *cls = i + 4 < len && pat[i + 1] == 'p' && pat[i + 2] == '{' &&
                                      pat[i + 4] == '}' && pat[i + 3]
                                  ? strchr(classes, pat[i + 3]) : NULL;
            const char *ext = cls ? extra[cls - classes] : NULL;
            if (ext) {
                if ((!in_class && tok_buf_putc(&o, '[')) || tok_buf_put(&o, pat + i, 5) ||
                    tok_buf_put(&o, ext, strlen(ext)) || (!in_class && tok_buf_putc(&o, ']')))
                    goto fail;
                i += 4;
                continue;
            }
            bool ws = pat[i + 1] == 's', nws = pat[i + 1] == 'S' && !in_class;
            if (ws || nws) {
                if ((!in_class && tok_buf_put(&o, nws ? "[^" : "[", nws ? 2 : 1)) ||
                    tok_buf_put(&o, white_space, strlen(white_space)) ||
                    (!in_class && tok_buf_putc(&o, ']')))
                    goto fail;
                i++;
                continue;
            }
            if (tok_buf_put(&o, pat + i, 2))
                goto fail;
            i++;
            continue;
        }
        if (c == '[' && !in_class) {
            in_class = true;
            size_t k = i + 1; /* a ']' right after '[' or '[^' is a literal */
            if (k < len && pat[k] == '^')
                k++;
            if (k < len && pat[k] == ']') {
                if (tok_buf_put(&o, pat + i, k + 1 - i))
                    goto fail;
                i = k;
                continue;
            }
        } else if (c == ']' && in_class) {
            in_class = false;
        }
        if (tok_buf_putc(&o, c))
            goto fail;
    }
    *out_len = o.n;
    return o.p ? o.p : wstrdup("");
fail:
    wfree(o.p);
    return NULL;
}

pcre2_code *tok_regex_compile(const char *pat, size_t len, bool literal, char *errbuf,
                              size_t errcap)
{
    int ec;
    PCRE2_SIZE eo;
    uint32_t opt = PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0);
    size_t ulen = 0;
    char *up = literal ? NULL : update_pattern(pat, len, &ulen);
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)(up ? up : pat), up ? ulen : len, opt, &ec, &eo,
                                   NULL);
    wfree(up);
    if (!re && up) /* report errors against the pattern as written */
        re = pcre2_compile((PCRE2_SPTR)pat, len, opt, &ec, &eo, NULL);
    if (!re) {
        char msg[256];
        pcre2_get_error_message(ec, (PCRE2_UCHAR *)msg, sizeof msg);
        snprintf(errbuf, errcap, "bad regex at offset %zu: %s", (size_t)eo, msg);
        return NULL;
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* falls back to the interpreter on error */
    return re;
}

/* ---- matching under a limit ---- */

static pcre2_match_context *match_ctx; /* NULL: PCRE2's defaults; process lifetime */
static uint32_t match_limit;          /* the limit in force */
static pthread_once_t match_once = PTHREAD_ONCE_INIT;
static _Thread_local int last_error;
static _Thread_local size_t last_pos;

static void match_init(void)
{
    pcre2_config(PCRE2_CONFIG_MATCHLIMIT, &match_limit);
    const char *v = getenv("WELD_REGEX_MATCH_LIMIT");
    if (!v || !*v)
        return;
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (*end || errno || x < 1 || x > UINT32_MAX)
        return;
    pcre2_match_context *c = pcre2_match_context_create(NULL);
    if (c && pcre2_set_match_limit(c, (uint32_t)x) == 0) {
        match_ctx = c;
        match_limit = (uint32_t)x;
    } else {
        pcre2_match_context_free(c);
    }
}

int tok_regex_match(const pcre2_code *re, const char *s, size_t n, size_t pos,
                    pcre2_match_data *md)
{
    pthread_once(&match_once, match_init);
    int r = pcre2_match(re, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK, md, match_ctx);
    if (r < 0 && r != PCRE2_ERROR_NOMATCH) {
        last_error = r;
        last_pos = pos;
    }
    return r;
}

int tok_regex_status(int r)
{
    switch (r) {
    case PCRE2_ERROR_MATCHLIMIT: case PCRE2_ERROR_DEPTHLIMIT: case PCRE2_ERROR_HEAPLIMIT:
    case PCRE2_ERROR_JIT_STACKLIMIT:
        return WELD_ERR_LIMIT;
    case PCRE2_ERROR_NOMEMORY:
        return WELD_ERR_NOMEM;
    default:
        return WELD_ERR_INTERNAL;
    }
}

void tok_regex_error(char *buf, size_t cap)
{
    if (!last_error) {
        snprintf(buf, cap, "internal error");
        return;
    }
    char msg[128];
    if (pcre2_get_error_message(last_error, (PCRE2_UCHAR *)msg, sizeof msg) < 0)
        snprintf(msg, sizeof msg, "PCRE2 error %d", last_error);
    if (tok_regex_status(last_error) == WELD_ERR_LIMIT)
        snprintf(buf, cap, "the text exceeds the match limit of the pre-tokenizer's regular "
                 "expression (PCRE2: %s; match limit %u): very long runs of one kind of "
                 "character (spaces, punctuation) cause this; shorten or split them "
                 "(WELD_REGEX_MATCH_LIMIT raises the limit)", msg, match_limit);
    else
        snprintf(buf, cap, "pre-tokenizer regex failed at byte %zu (PCRE2: %s)", last_pos, msg);
    last_error = 0;
}

/*
 * jinja_lex - template source -> token array.
 *
 * The source alternates between text and tags: {{ expr }}, {% stmt %}, {# comment #}.
 * Text runs become JT_TEXT tokens pointing into the source (trimming only moves the
 * ends), already adjusted for whitespace control the way jinja2 does it with transformers'
 * settings:
 *   - "{%-", "{{-", "{#-" strip all whitespace before the tag; "-%}", "-}}", "-#}" strip all
 *     whitespace after it;
 *   - lstrip_blocks: spaces/tabs between the start of a line and "{%" or "{#" are dropped
 *     (not for "{%+" and not for "{{");
 *   - trim_blocks: one newline right after "%}" or "#}" is dropped (not after "+%}");
 *   - a single trailing newline of the whole template is dropped (keep_trailing_newline
 *     is False in jinja2);
 *   - "whitespace" is Python's \s (Unicode), and lstrip_blocks strips it except newlines.
 * The caller has already turned \r\n and \r into \n, as jinja2 does with the source.
 * Comments produce no tokens. {% raw %}...{% endraw %} becomes one text token.
 * Inside tags the lexer emits names, numbers, string literals (unescaped as Python does
 * for \n \t \r \\ \' \" \xHH \uHHHH \UHHHHHHHH) and operators. A "}}" only closes a
 * variable tag when no bracket is open, so dict literals may nest.
 * Every token carries its 1-based line and column for error messages.
 */
#include "template/jinja.h"

#include "core/utf8.h"
#include "template/jinja_strings.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

struct lexer {
    struct jinja_arena *a;
    const char *src;
    size_t len, pos;
    struct jinja_tok *v;
    size_t n, cap;
    bool strip_next_text; /* last tag ended with "-" */
    bool trim_newline;    /* last tag was a block/comment end without "+" */
    size_t cur_pos;       /* line/column cursor, so positions cost O(distance) */
    int cur_line, cur_col;
};

static void lex_pos(struct lexer *L, size_t pos, int *line, int *col)
{
    if (pos < L->cur_pos || L->cur_line == 0) {
        L->cur_pos = 0;
        L->cur_line = L->cur_col = 1;
    }
    int l = L->cur_line, c = L->cur_col;
    for (size_t i = L->cur_pos; i < pos && i < L->len; i++) {
        if (L->src[i] == '\n') {
            l++;
            c = 1;
        } else {
            c++;
        }
    }
    L->cur_pos = pos < L->len ? pos : L->len;
    L->cur_line = l;
    L->cur_col = c;
    *line = l;
    *col = c;
}

_Noreturn static void lex_error(struct lexer *L, size_t pos, const char *what)
{
    int line, col;
    lex_pos(L, pos, &line, &col);
    jinja_raise(L->a->fail, WELD_ERR_FORMAT, "line %d, column %d: %s", line, col, what);
}

static struct jinja_tok *lex_push(struct lexer *L, enum jinja_tok_type t, size_t pos)
{
    if (L->n == L->cap) {
        size_t cap = L->cap ? L->cap * 2 : 256;
        struct jinja_tok *nv = jinja_alloc(L->a, cap * sizeof *nv);
        if (L->n)
            memcpy(nv, L->v, L->n * sizeof *nv);
        L->v = nv;
        L->cap = cap;
    }
    struct jinja_tok *t_ = &L->v[L->n++];
    memset(t_, 0, sizeof *t_);
    t_->type = t;
    lex_pos(L, pos, &t_->line, &t_->col);
    return t_;
}

static bool is_ws(char ch)
{
    return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\v' || ch == '\f';
}

/* Emit the text [start, end), applying the pending trims and the strip before tag_kind. */
/* Start of the whitespace run (Python's \s, or [^\S\n] when !newlines) ending at e. */
static size_t ws_run_start(struct jinja_str t, size_t e, bool newlines)
{
    while (e > 0) {
        size_t p = e - 1;
        while (p > 0 && ((unsigned char)t.s[p] & 0xC0) == 0x80)
            p--;
        int32_t cp;
        if (jstr_next(t, p, &cp) != e || !jstr_is_space(cp) || (!newlines && cp == '\n'))
            break;
        e = p;
    }
    return e;
}

/* Emit the text [start, end), applying the pending trims and the strip before tag_kind. */
static void lex_text(struct lexer *L, size_t start, size_t end, char tag_kind, char tag_mod)
{
    struct jinja_str src = {L->src, L->len};
    size_t s = start, e = end;
    if (L->strip_next_text) {
        s = (size_t)(jstr_strip((struct jinja_str){L->src + s, e - s}, NULL, true, false).s - L->src);
    } else if (L->trim_newline && s < e && L->src[s] == '\n') {
        s++;
    }
    L->strip_next_text = L->trim_newline = false;
    if (tag_mod == '-') {
        e = ws_run_start((struct jinja_str){L->src, e}, e, true);
        if (e < s)
            e = s;
    } else if ((tag_kind == '%' || tag_kind == '#') && tag_mod != '+') {
        size_t p = ws_run_start(src, e, false); /* lstrip_blocks: only from a line start */
        if (p < start)
            p = start;
        if ((p == 0 || L->src[p - 1] == '\n') && p >= s)
            e = p;
    }
    if (e > s) {
        struct jinja_tok *t = lex_push(L, JT_TEXT, s);
        t->s.s = L->src + s;
        t->s.n = e - s;
    }
}

static size_t lex_find_tag(const struct lexer *L, size_t from)
{
    for (size_t i = from; i + 1 < L->len; i++) {
        if (L->src[i] == '{' &&
            (L->src[i + 1] == '{' || L->src[i + 1] == '%' || L->src[i + 1] == '#'))
            return i;
    }
    return L->len;
}

static int hexval(char ch)
{
    if (ch >= '0' && ch <= '9')
        return ch - '0';
    if (ch >= 'a' && ch <= 'f')
        return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F')
        return ch - 'A' + 10;
    return -1;
}

/* A quoted literal at L->pos; the unescaped bytes never exceed the quoted length. */
static void lex_string(struct lexer *L)
{
    size_t start = L->pos;
    char q = L->src[L->pos++];
    size_t end = L->pos; /* find the closing quote first, to size the copy */
    while (end < L->len && L->src[end] != q)
        end += L->src[end] == '\\' ? 2 : 1;
    char *o = jinja_alloc(L->a, (end < L->len ? end : L->len) - start + 1);
    size_t n = 0;
    for (;;) {
        if (L->pos >= L->len)
            lex_error(L, start, "unterminated string literal");
        char ch = L->src[L->pos++];
        if (ch == q)
            break;
        if (ch != '\\') {
            o[n++] = ch;
            continue;
        }
        if (L->pos >= L->len)
            lex_error(L, start, "unterminated string literal");
        char esc = L->src[L->pos++];
        int digits = esc == 'x' ? 2 : esc == 'u' ? 4 : esc == 'U' ? 8 : 0;
        if (digits) {
            uint32_t cp = 0;
            for (int k = 0; k < digits; k++) {
                int h = L->pos < L->len ? hexval(L->src[L->pos]) : -1;
                if (h < 0)
                    lex_error(L, L->pos, "bad \\x/\\u escape in string literal");
                cp = cp * 16 + (uint32_t)h;
                L->pos++;
            }
            if (cp > 0x10FFFF)
                lex_error(L, L->pos, "\\U escape beyond U+10FFFF");
            n += utf8_put(cp, o + n);
            continue;
        }
        switch (esc) {
        case 'n': o[n++] = '\n'; break;
        case 't': o[n++] = '\t'; break;
        case 'r': o[n++] = '\r'; break;
        case 'b': o[n++] = '\b'; break;
        case 'f': o[n++] = '\f'; break;
        case 'v': o[n++] = '\v'; break;
        case 'a': o[n++] = '\a'; break;
        case '0': o[n++] = '\0'; break;
        case '\\': o[n++] = '\\'; break;
        case '\'': o[n++] = '\''; break;
        case '"': o[n++] = '"'; break;
        case '\n': break;
        default:
            o[n++] = '\\';
            o[n++] = esc;
        }
    }
    struct jinja_tok *t = lex_push(L, JT_STRING, start);
    t->s.s = o;
    t->s.n = n;
}

static void lex_number(struct lexer *L)
{
    size_t start = L->pos;
    bool is_float = false;
    while (L->pos < L->len && (isdigit((unsigned char)L->src[L->pos]) || L->src[L->pos] == '_'))
        L->pos++;
    if (L->pos + 1 < L->len && L->src[L->pos] == '.' &&
        isdigit((unsigned char)L->src[L->pos + 1])) {
        is_float = true;
        L->pos++;
        while (L->pos < L->len && isdigit((unsigned char)L->src[L->pos]))
            L->pos++;
    }
    if (L->pos < L->len && (L->src[L->pos] == 'e' || L->src[L->pos] == 'E')) {
        size_t p = L->pos + 1;
        if (p < L->len && (L->src[p] == '+' || L->src[p] == '-'))
            p++;
        if (p < L->len && isdigit((unsigned char)L->src[p])) {
            is_float = true;
            while (p < L->len && isdigit((unsigned char)L->src[p]))
                p++;
            L->pos = p;
        }
    }
    char buf[64];
    size_t k = 0;
    for (size_t i = start; i < L->pos; i++) {
        if (L->src[i] == '_')
            continue;
        if (k + 1 >= sizeof buf)
            lex_error(L, start, "number literal too long");
        buf[k++] = L->src[i];
    }
    buf[k] = '\0';
    struct jinja_tok *t = lex_push(L, is_float ? JT_FLOAT : JT_INT, start);
    if (is_float) {
        t->f = strtod(buf, NULL);
        return;
    }
    int64_t v = 0;
    for (size_t i = 0; i < k; i++) {
        if (v > (INT64_MAX - 9) / 10)
            lex_error(L, start, "integer literal out of range");
        v = v * 10 + (buf[i] - '0');
    }
    t->i = v;
}

static const char *const lex_ops2[] = {"//", "**", "==", "!=", "<=", ">=", NULL};
static const char lex_ops1[] = "+-*/%~<>=()[]{},.:|";

/* Tokens of one tag body; returns after consuming the closing delimiter. */
static void lex_tag(struct lexer *L, char kind, size_t tag_start)
{
    int depth = 0;
    char close = kind == '{' ? '}' : '%';
    for (;;) {
        while (L->pos < L->len && is_ws(L->src[L->pos]))
            L->pos++;
        if (L->pos >= L->len)
            lex_error(L, tag_start, kind == '{' ? "unclosed '{{'" : "unclosed '{%'");
        const char *p = L->src + L->pos;
        size_t left = L->len - L->pos;
        char mod = 0;
        size_t skip = 0;
        if (depth == 0 && left >= 3 && (p[0] == '-' || p[0] == '+') && p[1] == close &&
            p[2] == '}')
            mod = p[0], skip = 3;
        else if (depth == 0 && left >= 2 && p[0] == close && p[1] == '}')
            skip = 2;
        if (skip) {
            lex_push(L, kind == '{' ? JT_VAR_END : JT_BLOCK_END, L->pos);
            L->pos += skip;
            L->strip_next_text = mod == '-';
            L->trim_newline = kind == '%' && mod != '+';
            return;
        }
        unsigned char ch = (unsigned char)p[0];
        if (ch == '"' || ch == '\'') {
            lex_string(L);
        } else if (isdigit(ch)) {
            lex_number(L);
        } else if (isalpha(ch) || ch == '_') {
            size_t s = L->pos;
            while (L->pos < L->len &&
                   (isalnum((unsigned char)L->src[L->pos]) || L->src[L->pos] == '_'))
                L->pos++;
            struct jinja_tok *t = lex_push(L, JT_NAME, s);
            t->s = (struct jinja_str){L->src + s, L->pos - s};
        } else {
            size_t n = 0;
            for (int k = 0; lex_ops2[k]; k++)
                if (left >= 2 && memcmp(p, lex_ops2[k], 2) == 0)
                    n = 2;
            if (!n && ch && strchr(lex_ops1, ch))
                n = 1;
            if (!n)
                lex_error(L, L->pos, "unexpected character in tag");
            if (ch == '(' || ch == '[' || ch == '{')
                depth++;
            else if ((ch == ')' || ch == ']' || ch == '}') && depth > 0)
                depth--;
            struct jinja_tok *t = lex_push(L, JT_OP, L->pos);
            t->s = (struct jinja_str){p, n};
            L->pos += n;
        }
    }
}

/* After "{% raw %}": everything up to "{% endraw %}" is text. */
static void lex_raw(struct lexer *L, size_t tag_start)
{
    size_t from = L->pos;
    for (size_t i = from; i + 1 < L->len; i++) {
        if (L->src[i] != '{' || L->src[i + 1] != '%')
            continue;
        size_t j = i + 2;
        char lmod = 0;
        if (j < L->len && (L->src[j] == '-' || L->src[j] == '+'))
            lmod = L->src[j++];
        while (j < L->len && is_ws(L->src[j]))
            j++;
        if (j + 6 > L->len || memcmp(L->src + j, "endraw", 6) != 0)
            continue;
        j += 6;
        while (j < L->len && is_ws(L->src[j]))
            j++;
        char rmod = 0;
        if (j < L->len && (L->src[j] == '-' || L->src[j] == '+'))
            rmod = L->src[j++];
        if (j + 1 >= L->len || L->src[j] != '%' || L->src[j + 1] != '}')
            continue;
        lex_text(L, from, i, '%', lmod);
        L->pos = j + 2;
        L->strip_next_text = rmod == '-';
        L->trim_newline = rmod != '+';
        return;
    }
    lex_error(L, tag_start, "'{% raw %}' without '{% endraw %}'");
}

static bool lex_is_raw(struct lexer *L, size_t first_tok)
{
    return L->n == first_tok + 3 && L->v[first_tok + 1].type == JT_NAME &&
           jinja_str_eq(L->v[first_tok + 1].s, "raw");
}

void jinja_lex(struct jinja_arena *a, const char *src, size_t len, struct jinja_toks *out)
{
    struct lexer L = {.a = a, .src = src, .len = len};
    if (L.len > 0 && src[L.len - 1] == '\n')
        L.len--;
    while (L.pos < L.len) {
        size_t tag = lex_find_tag(&L, L.pos);
        if (tag >= L.len) {
            lex_text(&L, L.pos, L.len, 0, 0);
            break;
        }
        char kind = src[tag + 1];
        char mod = tag + 2 < L.len ? src[tag + 2] : 0;
        if (mod != '-' && mod != '+')
            mod = 0;
        lex_text(&L, L.pos, tag, kind, mod);
        L.pos = tag + 2 + (mod ? 1 : 0);
        if (kind == '#') {
            size_t i = L.pos;
            while (i + 1 < L.len && !(src[i] == '#' && src[i + 1] == '}'))
                i++;
            if (i + 1 >= L.len)
                lex_error(&L, tag, "unclosed comment '{#'");
            char cmod = i > L.pos && (src[i - 1] == '-' || src[i - 1] == '+') ? src[i - 1] : 0;
            L.pos = i + 2;
            L.strip_next_text = cmod == '-';
            L.trim_newline = cmod != '+';
            continue;
        }
        size_t first = L.n;
        lex_push(&L, kind == '{' ? JT_VAR_BEGIN : JT_BLOCK_BEGIN, tag);
        lex_tag(&L, kind, tag);
        if (kind == '%' && lex_is_raw(&L, first)) {
            L.n = first;
            lex_raw(&L, tag);
        }
    }
    lex_push(&L, JT_EOF, L.len);
    out->v = L.v;
    out->n = L.n;
}

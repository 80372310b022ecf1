/*
 * tok_decode - ids -> text (Hugging Face decoders) and the streaming detokenizer.
 *
 * decode: the token strings of the ids (added tokens included; special ones dropped with
 * skip_special; unknown ids ignored) go through the decoder chain as a list of strings,
 * each decoder mapping a list to a list exactly as HF's decode_chain does, and the result
 * is joined. Without decoders the tokens are joined with single spaces (HF's fallback).
 *   ByteLevel: per token, alphabet chars -> bytes (a token with any other char keeps its
 *              UTF-8 bytes); all tokens become ONE string, invalid UTF-8 -> U+FFFD
 *              (from_utf8_lossy).
 *   ByteFallback: runs of <0xXX> tokens -> their bytes if valid UTF-8, else one U+FFFD per
 *              byte token.
 *   Replace (literal), Fuse (join), Strip (up to start/stop copies of a char per token),
 *   Metaspace (replacement -> ' ', dropped in the first token unless prepend is never).
 *
 * detok (streaming): HF's DecodeStream. State: a window of ids and `prefix`, the decode of
 * the window's first prefix_index ids. Push appends an id and decodes the window; when the
 * result is longer than prefix, starts with it and does not end in U+FFFD, the part after
 * prefix is new text; the window then drops its first prefix_index ids, so it stays a few
 * tokens long and every step costs O(window). Text that did not fit the caller's buffer
 * waits in `pending`.
 * One rule beyond HF: with a ByteFallback decoder, nothing is emitted while the window ends
 * in a <0xXX> token, because ByteFallback decodes a whole run of byte tokens at once and a
 * later invalid byte turns the entire run (even bytes that were valid ASCII) into U+FFFD;
 * HF's DecodeStream errors out there (InvalidPrefix), weld waits for the run to end.
 */
#include "tokenizer/tok_internal.h"

#include "core/alloc.h"
#include "core/utf8.h"

#include <string.h>

struct tlist {
    struct tok_buf buf;
    struct tok_spans sp;
};

static int tl_add(struct tlist *l, const char *s, size_t n)
{
    size_t off = l->buf.n;
    if (tok_buf_put(&l->buf, s, n))
        return WELD_ERR_NOMEM;
    return tok_spans_push(&l->sp, off, n);
}

/* Append to the last string of l (which must exist and be the last bytes of buf). */
static int tl_extend(struct tlist *l, const char *s, size_t n)
{
    if (tok_buf_put(&l->buf, s, n))
        return WELD_ERR_NOMEM;
    l->sp.v[l->sp.n - 1].len += n;
    return WELD_OK;
}

static void tl_reset(struct tlist *l)
{
    l->buf.n = 0;
    l->sp.n = 0;
}

#define TL_STR(l, i) ((l)->buf.p + (l)->sp.v[i].off)
#define TL_LEN(l, i) ((l)->sp.v[i].len)

static int dec_bytelevel(const struct tlist *in, struct tlist *out)
{
    struct tok_buf raw = {0};
    int rc = WELD_OK;
    for (size_t i = 0; rc == WELD_OK && i < in->sp.n; i++) {
        const char *s = TL_STR(in, i);
        size_t n = TL_LEN(in, i), start = raw.n;
        for (size_t k = 0; rc == WELD_OK && k < n;) {
            uint32_t cp;
            int w = tok_utf8_next(s, n, k, &cp);
            int b = w > 0 ? tok_cp_to_byte(cp) : -1;
            if (b < 0) { /* not all alphabet: the token's own bytes */
                raw.n = start;
                rc = tok_buf_put(&raw, s, n);
                break;
            }
            rc = tok_buf_putc(&raw, (char)b);
            k += (size_t)w;
        }
    }
    if (rc == WELD_OK)
        rc = tl_add(out, "", 0);
    if (rc == WELD_OK) {
        struct tok_buf lossy = {0};
        rc = tok_buf_put_lossy(&lossy, raw.p ? raw.p : "", raw.n);
        if (rc == WELD_OK)
            rc = tl_extend(out, lossy.p ? lossy.p : "", lossy.n);
        wfree(lossy.p);
    }
    wfree(raw.p);
    return rc;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

static int flush_bytes(struct tok_buf *bytes, struct tlist *out)
{
    int rc = WELD_OK;
    if (!bytes->n)
        return WELD_OK;
    if (tok_utf8_valid_prefix(bytes->p, bytes->n) == bytes->n)
        rc = tl_add(out, bytes->p, bytes->n);
    else
        for (size_t k = 0; rc == WELD_OK && k < bytes->n; k++)
            rc = tl_add(out, "\xEF\xBF\xBD", 3);
    bytes->n = 0;
    return rc;
}

static int dec_bytefallback(const struct tlist *in, struct tlist *out)
{
    struct tok_buf bytes = {0};
    int rc = WELD_OK;
    for (size_t i = 0; rc == WELD_OK && i < in->sp.n; i++) {
        const char *s = TL_STR(in, i);
        size_t n = TL_LEN(in, i);
        int hi, lo;
        if (n == 6 && memcmp(s, "<0x", 3) == 0 && s[5] == '>' && (hi = hexval(s[3])) >= 0 &&
            (lo = hexval(s[4])) >= 0) {
            rc = tok_buf_putc(&bytes, (char)(hi * 16 + lo));
            continue;
        }
        rc = flush_bytes(&bytes, out);
        if (rc == WELD_OK)
            rc = tl_add(out, s, n);
    }
    if (rc == WELD_OK)
        rc = flush_bytes(&bytes, out);
    wfree(bytes.p);
    return rc;
}

static int dec_replace(const struct tok_dec *d, const struct tlist *in, struct tlist *out)
{
    int rc = WELD_OK;
    for (size_t i = 0; rc == WELD_OK && i < in->sp.n; i++) {
        const char *s = TL_STR(in, i);
        size_t n = TL_LEN(in, i), run = 0;
        rc = tl_add(out, "", 0);
        for (size_t k = 0; rc == WELD_OK && d->alen && k + d->alen <= n;) {
            if (memcmp(s + k, d->a, d->alen) == 0) {
                rc = tl_extend(out, s + run, k - run);
                if (rc == WELD_OK)
                    rc = tl_extend(out, d->b, d->blen);
                k += d->alen;
                run = k;
            } else {
                k++;
            }
        }
        if (rc == WELD_OK)
            rc = tl_extend(out, s + run, n - run);
    }
    return rc;
}

static int dec_strip(const struct tok_dec *d, const struct tlist *in, struct tlist *out)
{
    char u[4];
    size_t ul = utf8_put(d->strip_ch, u);
    int rc = WELD_OK;
    for (size_t i = 0; rc == WELD_OK && i < in->sp.n; i++) {
        const char *s = TL_STR(in, i);
        size_t a = 0, b = TL_LEN(in, i);
        for (int k = 0; k < d->start && b - a >= ul && memcmp(s + a, u, ul) == 0; k++)
            a += ul;
        for (int k = 0; k < d->stop && b - a >= ul && memcmp(s + b - ul, u, ul) == 0; k++)
            b -= ul;
        rc = tl_add(out, s + a, b - a);
    }
    return rc;
}

static int dec_metaspace(const struct tok_dec *d, const struct tlist *in, struct tlist *out)
{
    int rc = WELD_OK;
    for (size_t i = 0; rc == WELD_OK && i < in->sp.n; i++) {
        const char *s = TL_STR(in, i);
        size_t n = TL_LEN(in, i), run = 0;
        bool drop = i == 0 && d->prepend != TOK_PREPEND_NEVER;
        rc = tl_add(out, "", 0);
        for (size_t k = 0; rc == WELD_OK && d->alen && k + d->alen <= n;) {
            if (memcmp(s + k, d->a, d->alen) == 0) {
                rc = tl_extend(out, s + run, k - run);
                if (rc == WELD_OK && !drop)
                    rc = tl_extend(out, " ", 1);
                k += d->alen;
                run = k;
            } else {
                k++;
            }
        }
        if (rc == WELD_OK)
            rc = tl_extend(out, s + run, n - run);
    }
    return rc;
}

static int dec_one(const struct tok_dec *d, const struct tlist *in, struct tlist *out)
{
    switch (d->kind) {
    case TOK_DEC_BYTELEVEL:
        return dec_bytelevel(in, out);
    case TOK_DEC_BYTEFALLBACK:
        return dec_bytefallback(in, out);
    case TOK_DEC_REPLACE:
        return dec_replace(d, in, out);
    case TOK_DEC_STRIP:
        return dec_strip(d, in, out);
    case TOK_DEC_METASPACE:
        return dec_metaspace(d, in, out);
    case TOK_DEC_FUSE: {
        int rc = tl_add(out, "", 0);
        for (size_t i = 0; rc == WELD_OK && i < in->sp.n; i++)
            rc = tl_extend(out, TL_STR(in, i), TL_LEN(in, i));
        return rc;
    }
    }
    return WELD_ERR_INTERNAL;
}

static int decode_into(const struct tokenizer *t, const int32_t *ids, size_t n,
                       bool skip_special, struct tok_buf *res)
{
    struct tlist l[2] = {{{0}, {0}}, {{0}, {0}}};
    int rc = WELD_OK, cur = 0;
    for (size_t i = 0; rc == WELD_OK && i < n; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= t->n_vocab || !t->vocab[id].s || (skip_special && t->special[id]))
            continue;
        rc = tl_add(&l[0], t->vocab[id].s, t->vocab[id].len);
    }
    for (int k = 0; rc == WELD_OK && k < t->n_decs; k++) {
        tl_reset(&l[cur ^ 1]);
        rc = dec_one(&t->decs[k], &l[cur], &l[cur ^ 1]);
        cur ^= 1;
    }
    for (size_t i = 0; rc == WELD_OK && i < l[cur].sp.n; i++) {
        if (i && !t->n_decs)
            rc = tok_buf_putc(res, ' ');
        if (rc == WELD_OK)
            rc = tok_buf_put(res, TL_STR(&l[cur], i), TL_LEN(&l[cur], i));
    }
    if (rc == WELD_OK)
        rc = tok_buf_put(res, "", 0); /* NUL-terminate even when empty */
    for (int k = 0; k < 2; k++) {
        wfree(l[k].buf.p);
        wfree(l[k].sp.v);
    }
    return rc;
}

int tokenizer_decode(const struct tokenizer *t, const int32_t *ids, size_t n, bool skip_special,
                     char **out, size_t *len, struct weld_err *e)
{
    struct tok_buf res = {0};
    *out = NULL;
    if (len)
        *len = 0;
    int rc = decode_into(t, ids, n, skip_special, &res);
    if (rc) {
        wfree(res.p);
        return err_set(e, rc, "tokenizer_decode: out of memory");
    }
    *out = res.p;
    if (len)
        *len = res.n;
    return WELD_OK;
}

/* One token through the decoder chain as it reads in the middle of a text: no
   start-of-text stripping (Strip, Metaspace's first-token rule) and no UTF-8 repair, so a
   byte token or a byte-level piece of a character is its raw bytes. */
int tokenizer_token_bytes(const struct tokenizer *t, int32_t id, char **out, size_t *len)
{
    *out = NULL, *len = 0;
    if (id < 0 || id >= t->n_vocab || !t->vocab[id].s)
        return WELD_ERR_INVALID_ARG;
    struct tok_buf cur = {0}, nxt = {0};
    int rc = tok_buf_put(&cur, t->vocab[id].s, t->vocab[id].len);
    for (int k = 0; rc == WELD_OK && k < t->n_decs; k++) {
        const struct tok_dec *d = &t->decs[k];
        const char *s = cur.p ? cur.p : "";
        const size_t n = cur.n;
        nxt.n = 0;
        int hi, lo;
        switch (d->kind) {
        case TOK_DEC_BYTELEVEL:
            for (size_t i = 0; rc == WELD_OK && i < n;) {
                uint32_t cp;
                int w = tok_utf8_next(s, n, i, &cp), b = w > 0 ? tok_cp_to_byte(cp) : -1;
                if (b < 0) { /* not all alphabet: the token's own bytes */
                    nxt.n = 0;
                    rc = tok_buf_put(&nxt, s, n);
                    break;
                }
                rc = tok_buf_putc(&nxt, (char)b);
                i += (size_t)w;
            }
            break;
        case TOK_DEC_BYTEFALLBACK:
            if (n == 6 && memcmp(s, "<0x", 3) == 0 && s[5] == '>' && (hi = hexval(s[3])) >= 0 &&
                (lo = hexval(s[4])) >= 0)
                rc = tok_buf_putc(&nxt, (char)(hi * 16 + lo));
            else
                rc = tok_buf_put(&nxt, s, n);
            break;
        case TOK_DEC_REPLACE:
        case TOK_DEC_METASPACE: {
            const char *b = d->kind == TOK_DEC_REPLACE ? d->b : " ";
            const size_t bl = d->kind == TOK_DEC_REPLACE ? d->blen : 1;
            size_t run = 0;
            for (size_t i = 0; rc == WELD_OK && d->alen && i + d->alen <= n;) {
                if (memcmp(s + i, d->a, d->alen) == 0) {
                    rc = tok_buf_put(&nxt, s + run, i - run);
                    if (rc == WELD_OK)
                        rc = tok_buf_put(&nxt, b, bl);
                    i += d->alen, run = i;
                } else {
                    i++;
                }
            }
            if (rc == WELD_OK)
                rc = tok_buf_put(&nxt, s + run, n - run);
            break;
        }
        case TOK_DEC_STRIP:
        case TOK_DEC_FUSE: rc = tok_buf_put(&nxt, s, n); break;
        }
        struct tok_buf tmp = cur;
        cur = nxt, nxt = tmp;
    }
    wfree(nxt.p);
    if (rc == WELD_OK)
        rc = tok_buf_put(&cur, "", 0);
    if (rc) {
        wfree(cur.p);
        return rc;
    }
    *out = cur.p, *len = cur.n; /* tok_buf_put NUL-terminates, n excludes it */
    return WELD_OK;
}

/* ---- streaming ---- */

#define DETOK_PRIME_IDS 6 /* context ids detok_prime keeps, as vLLM's prefix offset */

struct detok {
    const struct tokenizer *t;
    bool skip_special;
    struct tok_ids ids;      /* the window */
    size_t prefix_index;     /* ids of the window already reflected in prefix */
    struct tok_buf prefix;   /* decode of the window's first prefix_index ids */
    struct tok_buf pending;  /* new text not yet handed out */
    size_t pending_off;
    bool failed;             /* out of memory: the stream stops producing */
    bool byte_runs;          /* the decoder has ByteFallback */
};

static bool is_byte_token(const struct tokenizer *t, int32_t id)
{
    if (id < 0 || id >= t->n_vocab || !t->vocab[id].s || t->vocab[id].len != 6)
        return false;
    const char *s = t->vocab[id].s;
    return memcmp(s, "<0x", 3) == 0 && s[5] == '>' && hexval(s[3]) >= 0 && hexval(s[4]) >= 0;
}

struct detok *detok_create(const struct tokenizer *t, bool skip_special)
{
    struct detok *d = wcalloc(1, sizeof *d);
    if (!d)
        return NULL;
    d->t = t;
    d->skip_special = skip_special;
    for (int i = 0; i < t->n_decs; i++)
        if (t->decs[i].kind == TOK_DEC_BYTEFALLBACK)
            d->byte_runs = true;
    return d;
}

void detok_free(struct detok *d)
{
    if (!d)
        return;
    wfree(d->ids.v);
    wfree(d->prefix.p);
    wfree(d->pending.p);
    wfree(d);
}

static size_t drain(struct detok *d, char *out, size_t cap)
{
    size_t avail = d->pending.n - d->pending_off;
    size_t k = avail < cap ? avail : cap;
    if (k < avail) /* cut at a character boundary */
        while (k > 0 && ((uint8_t)d->pending.p[d->pending_off + k] & 0xC0) == 0x80)
            k--;
    if (k)
        memcpy(out, d->pending.p + d->pending_off, k);
    d->pending_off += k;
    if (d->pending_off == d->pending.n)
        d->pending.n = d->pending_off = 0;
    return k;
}

/* Decode the window; if it extends prefix (and, unless final, does not end in U+FFFD),
   queue the new part and slide the window. */
static void step(struct detok *d, bool final)
{
    struct tok_buf s = {0};
    if (!final && d->byte_runs && d->ids.n && is_byte_token(d->t, d->ids.v[d->ids.n - 1]))
        return;
    if (decode_into(d->t, d->ids.v, d->ids.n, d->skip_special, &s)) {
        d->failed = true;
        goto out;
    }
    bool partial = s.n >= 3 && memcmp(s.p + s.n - 3, "\xEF\xBF\xBD", 3) == 0;
    if (s.n <= d->prefix.n || (partial && !final) ||
        memcmp(s.p, d->prefix.p ? d->prefix.p : "", d->prefix.n) != 0)
        goto out;
    if (tok_buf_put(&d->pending, s.p + d->prefix.n, s.n - d->prefix.n)) {
        d->failed = true;
        goto out;
    }
    size_t new_index = d->ids.n - d->prefix_index;
    memmove(d->ids.v, d->ids.v + d->prefix_index, new_index * sizeof *d->ids.v);
    d->ids.n = new_index;
    d->prefix.n = 0;
    if (decode_into(d->t, d->ids.v, d->ids.n, d->skip_special, &d->prefix))
        d->failed = true;
    d->prefix_index = new_index;
out:
    wfree(s.p);
}

size_t detok_push(struct detok *d, int32_t id, char *out, size_t cap)
{
    if (id >= 0 && !d->failed) {
        if (tok_ids_push(&d->ids, id))
            d->failed = true;
        else
            step(d, false);
    }
    return drain(d, out, cap);
}

void detok_prime(struct detok *d, const int32_t *ids, size_t n)
{
    if (d->failed || d->ids.n)
        return;
    size_t from = n > DETOK_PRIME_IDS ? n - DETOK_PRIME_IDS : 0, to = n;
    /* The window becomes the context's last ids, already "emitted": prefix = their text.
       A context ending inside a character (a partial byte run) is cut before that run, or
       the prefix would never match a later decode that completes the character. */
    for (; to > from; to--) {
        if (d->byte_runs && is_byte_token(d->t, ids[to - 1]))
            continue;
        d->prefix.n = 0;
        if (decode_into(d->t, ids + from, to - from, d->skip_special, &d->prefix)) {
            d->failed = true;
            return;
        }
        size_t m = d->prefix.n;
        if (m < 3 || memcmp(d->prefix.p + m - 3, "\xEF\xBF\xBD", 3) != 0)
            break;
    }
    if (to == from) {
        d->prefix.n = 0;
        return;
    }
    for (size_t i = from; i < to; i++)
        if (tok_ids_push(&d->ids, ids[i])) {
            d->failed = true;
            return;
        }
    d->prefix_index = to - from;
}

size_t detok_flush(struct detok *d, char *out, size_t cap)
{
    if (!d->failed && d->ids.n > d->prefix_index)
        step(d, true);
    return drain(d, out, cap);
}

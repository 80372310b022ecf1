/*
 * tok_utf8 - UTF-8 scanning, the GPT-2 byte-level alphabet, and growable buffers.
 *
 * utf8_scan() follows the "maximal subpart" rule that Rust's String::from_utf8_lossy (and
 * so Hugging Face's decoders) uses: an invalid sequence is replaced by one U+FFFD per
 * maximal prefix of a would-be valid sequence (E0 needs A0..BF next, ED 80..9F, F0 90..BF,
 * F4 80..8F; C0, C1, F5..FF and stray continuation bytes are one byte each). Overlong forms
 * and surrogates are therefore invalid.
 *
 * The byte-level alphabet maps each byte to a printable code point: the bytes 0x21..0x7E,
 * 0xA1..0xAC and 0xAE..0xFF map to themselves, the other 68 to U+0100.. in byte order.
 */
#include "tokenizer/tok_internal.h"

#include "core/alloc.h"

#include <string.h>

/* > 0: a valid character of that many bytes (*cp set); < 0: an invalid maximal subpart of
   that many bytes. i < len. */
static int utf8_scan(const uint8_t *s, size_t len, size_t i, uint32_t *cp)
{
    uint8_t b = s[i];
    if (b < 0x80) {
        *cp = b;
        return 1;
    }
    int w;
    uint8_t lo = 0x80, hi = 0xBF;
    if (b >= 0xC2 && b <= 0xDF) {
        w = 2;
    } else if (b >= 0xE0 && b <= 0xEF) {
        w = 3;
        if (b == 0xE0)
            lo = 0xA0;
        else if (b == 0xED)
            hi = 0x9F;
    } else if (b >= 0xF0 && b <= 0xF4) {
        w = 4;
        if (b == 0xF0)
            lo = 0x90;
        else if (b == 0xF4)
            hi = 0x8F;
    } else {
        return -1;
    }
    uint32_t c = b & (w == 2 ? 0x1F : w == 3 ? 0x0F : 0x07);
    for (int k = 1; k < w; k++) {
        if (i + k >= len)
            return -k;
        uint8_t x = s[i + k];
        if (k == 1 ? (x < lo || x > hi) : (x < 0x80 || x > 0xBF))
            return -k;
        c = (c << 6) | (x & 0x3F);
    }
    *cp = c;
    return w;
}

int tok_utf8_next(const char *s, size_t len, size_t i, uint32_t *cp)
{
    int r = utf8_scan((const uint8_t *)s, len, i, cp);
    return r > 0 ? r : 0;
}

size_t tok_utf8_valid_prefix(const char *s, size_t len)
{
    size_t i = 0;
    uint32_t cp;
    while (i < len) {
        int r = utf8_scan((const uint8_t *)s, len, i, &cp);
        if (r < 0)
            break;
        i += (size_t)r;
    }
    return i;
}

#define B(x) (x)
const uint16_t tok_byte_to_cp[256] = {
#define R8(a) a, a + 1, a + 2, a + 3, a + 4, a + 5, a + 6, a + 7
    /* 0x00..0x20 -> U+0100..U+0120 */
    R8(0x100), R8(0x108), R8(0x110), R8(0x118), 0x120,
    /* 0x21..0x7E -> themselves */
    0x21, 0x22, 0x23, 0x24, 0x25, 0x26, 0x27, R8(0x28), R8(0x30), R8(0x38), R8(0x40), R8(0x48),
    R8(0x50), R8(0x58), R8(0x60), R8(0x68), R8(0x70), 0x78, 0x79, 0x7A, 0x7B, 0x7C, 0x7D, 0x7E,
    /* 0x7F..0xA0 -> U+0121..U+0142 */
    R8(0x121), R8(0x129), R8(0x131), R8(0x139), 0x141, 0x142,
    /* 0xA1..0xAC -> themselves */
    0xA1, 0xA2, 0xA3, 0xA4, 0xA5, 0xA6, 0xA7, 0xA8, 0xA9, 0xAA, 0xAB, 0xAC,
    /* 0xAD -> U+0143 */
    0x143,
    /* 0xAE..0xFF -> themselves */
    0xAE, 0xAF, R8(0xB0), R8(0xB8), R8(0xC0), R8(0xC8), R8(0xD0), R8(0xD8), R8(0xE0), R8(0xE8),
    R8(0xF0), R8(0xF8),
#undef R8
};
#undef B

int tok_cp_to_byte(uint32_t cp)
{
    if (cp >= 0x21 && cp <= 0x7E)
        return (int)cp;
    if ((cp >= 0xA1 && cp <= 0xAC) || (cp >= 0xAE && cp <= 0xFF))
        return (int)cp;
    if (cp >= 0x100 && cp <= 0x120)
        return (int)(cp - 0x100);
    if (cp >= 0x121 && cp <= 0x142)
        return (int)(cp - 0x121 + 0x7F);
    if (cp == 0x143)
        return 0xAD;
    return -1;
}

int tok_buf_put(struct tok_buf *b, const void *s, size_t n)
{
    if (n > (size_t)-1 / 2 - b->n)
        return WELD_ERR_NOMEM;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *p = wrealloc(b->p, cap);
        if (!p)
            return WELD_ERR_NOMEM;
        b->p = p;
        b->cap = cap;
    }
    if (n)
        memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return WELD_OK;
}

char *tok_memdup(const char *s, size_t n)
{
    char *p = n < (size_t)-1 ? wmalloc(n + 1) : NULL;
    if (!p)
        return NULL;
    if (n)
        memcpy(p, s, n);
    p[n] = 0;
    return p;
}

int tok_buf_putc(struct tok_buf *b, char c)
{
    return tok_buf_put(b, &c, 1);
}

int tok_buf_put_lossy(struct tok_buf *b, const char *s, size_t n)
{
    size_t i = 0, run = 0;
    uint32_t cp;
    while (i < n) {
        int r = utf8_scan((const uint8_t *)s, n, i, &cp);
        if (r > 0) {
            i += (size_t)r;
            continue;
        }
        if (tok_buf_put(b, s + run, i - run) || tok_buf_put(b, "\xEF\xBF\xBD", 3))
            return WELD_ERR_NOMEM;
        i += (size_t)-r;
        run = i;
    }
    return tok_buf_put(b, s + run, n - run);
}

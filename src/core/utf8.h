/*
 * utf8 - encode one code point as UTF-8: the one encoder the tokenizer (byte-level
 * alphabet, normalisation, pre-tokenizer input) and the template lexer (\x, \u and \U
 * escapes) share.
 *
 * The caller passes cp <= 0x10FFFF and room for 4 bytes. Surrogates (U+D800..U+DFFF) are
 * written as their 3-byte form, not rejected: checking is the caller's part.
 */
#ifndef WELD_CORE_UTF8_H
#define WELD_CORE_UTF8_H

#include <stddef.h>
#include <stdint.h>

/* Writes 1 to 4 bytes (no NUL) and returns how many. */
size_t utf8_put(uint32_t cp, char *out);

#endif

/*
 * jinja_strings - Python str operations on UTF-8 for the template interpreter
 * (see jinja_strings.c for the exact semantics and the deliberate gaps).
 */
#ifndef WELD_TEMPLATE_JINJA_STRINGS_H
#define WELD_TEMPLATE_JINJA_STRINGS_H

#include "template/jinja.h"

enum jstr_case { JSTR_UPPER, JSTR_LOWER, JSTR_TITLE, JSTR_CAPITALIZE };

/* Decode the code point at byte i; returns the next byte index. Invalid bytes give a
 * negative *cp and advance by one. */
size_t jstr_next(struct jinja_str s, size_t i, int32_t *cp);
bool jstr_is_space(int32_t cp);
bool jstr_cp_alpha(int32_t cp);
bool jstr_cp_digit(int32_t cp);
bool jstr_cp_alnum(int32_t cp);
/* True when s is non-empty and pred holds for every code point. */
bool jstr_all(struct jinja_str s, bool (*pred)(int32_t));
bool jstr_case_is(struct jinja_str s, bool upper);

struct jinja_str jstr_case(struct jinja_ctx *c, struct jinja_str s, enum jstr_case mode);
/* str.strip/lstrip/rstrip; chars NULL = whitespace. Returns a view into s. */
struct jinja_str jstr_strip(struct jinja_str s, const struct jinja_str *chars, bool left,
                            bool right);
/* str.split(sep, maxsplit); sep NULL = whitespace split; maxsplit < 0 = no limit. */
struct jinja_value *jstr_split(struct jinja_ctx *c, struct jinja_str s,
                               const struct jinja_str *sep, int64_t maxsplit);
/* str.replace(old, rep, count); count < 0 = all. */
struct jinja_str jstr_replace(struct jinja_ctx *c, struct jinja_str s, struct jinja_str old,
                              struct jinja_str rep, int64_t count);
/* Code point index of byte offset byte_off. */
int64_t jstr_cp_index(struct jinja_str s, size_t byte_off);

#endif

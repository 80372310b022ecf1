/*
 * regex - a regular expression to GBNF rules (regex.c has the syntax and what is refused).
 */
#ifndef WELD_GRAMMAR_REGEX_H
#define WELD_GRAMMAR_REGEX_H

#include "core/err.h"

#include <stdbool.h>
#include <stddef.h>

/* GBNF text defining `rule` as the strings re[0, len) matches: the whole string (vLLM's
   guided_regex), or, with search, any string containing a match (JSON Schema's pattern;
   ^ and $ anchor it); with json, as the content of a JSON string is written (", \ and
   controls escaped). *gbnf is allocated (wfree it). Errors give the offset. */
int grammar_gbnf_from_regex(const char *re, size_t len, bool search, bool json, const char *rule,
                            char **gbnf, struct weld_err *e);

#endif

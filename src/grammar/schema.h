/*
 * schema - JSON Schema to a GBNF grammar (schema.c has what is supported and refused).
 */
#ifndef WELD_GRAMMAR_SCHEMA_H
#define WELD_GRAMMAR_SCHEMA_H

#include "core/err.h"

#include <stdbool.h>
#include <stddef.h>

/* vLLM's --structured-outputs-config options. */
struct schema_opts {
    bool no_whitespace;            /* disable_any_whitespace: no blanks between tokens */
    bool no_additional_properties; /* disable_additional_properties: an object without
                                      "additionalProperties" takes none */
};

/* The GBNF text (start rule "root") of the JSON documents schema text[0, len) allows,
   white space included; *gbnf is allocated (wfree it). Errors name the keyword and its
   path in the schema. */
int grammar_gbnf_from_json_schema(const char *text, size_t len, char **gbnf, struct weld_err *e);
/* The same with the start rule named rule, to embed in a larger grammar (tool calls): the
   other rules are `rN` and the primitives' names (ws, string, value, ...), so a grammar
   holds one such schema. */
int grammar_gbnf_json_schema_rule(const char *text, size_t len, const char *rule, char **gbnf,
                                  struct weld_err *e);
/* The same with options (NULL: none). */
int grammar_gbnf_json_schema_ex(const char *text, size_t len, const char *rule,
                                const struct schema_opts *opts, char **gbnf, struct weld_err *e);
/* s[0, n) as a GBNF literal ("..." with quotes, backslashes and control bytes escaped),
   appended to *o. */
struct strbuf;
void grammar_gbnf_literal(struct strbuf *o, const char *s, size_t n);

#endif
